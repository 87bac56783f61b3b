/*
 * tests/bench/createbench.c - what creating and destroying large rings
 * costs everyone else on moverd's loop.  A child loops `flow create` and
 * `flow destroy` of RING-byte rings (as root: no rate budget) for SECONDS;
 * meanwhile the parent times a `status` request every 20 ms on its own
 * control connection.  The reference, measured in the same run, is the
 * same status loop with nothing else going on.  PAUSE_MS between pairs
 * (default 0: flat out) shows what one create costs the others apart from
 * the churn's own requests.  The state directory is a
 * directory of /dev/shm (tmpfs), where allocating and punching out a
 * ring's pages costs what it costs a real host's.  A program that prints
 * figures, not a test.
 *
 *   usage: createbench MOVERD [SECONDS [RING_MIB [PAUSE_MS]]]
 *          (defaults: 10 s, 1024 MiB, 0 ms)
 *
 * Give it two builds of moverd, one after the other, to compare them.
 */
#include "harness.h"

#include <signal.h>

static double ms_since(uint64_t t0)
{
	return (double)(tu_now_ns() - t0) / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static bool status_call(int sock)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__GetStatus st = FLOWMOVER__GET_STATUS__INIT;

	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &st;
	return hc_call(sock, &req, NULL) == 0;
}

/* Time status calls every 20 ms for seconds; print their percentiles. */
static void time_status(const struct hd *d, const char *what, int seconds)
{
	unsigned cap = (unsigned)seconds * 50 + 16, n = 0, slow = 0;
	double *ms = calloc(cap, sizeof(*ms));
	uint64_t end = tu_now_ns() + (uint64_t)seconds * 1000000000ull;
	int sock = ctl_connect(d->sock);

	CHECK(ms && sock >= 0);
	while (tu_now_ns() < end && n < cap) {
		uint64_t t0 = tu_now_ns();

		CHECK(status_call(sock));
		ms[n] = ms_since(t0);
		slow += ms[n] > 100;
		n++;
		usleep(20000);
	}
	close(sock);
	qsort(ms, n, sizeof(*ms), cmp_double);
	printf("  %-30s status ms: p50 %6.2f  p90 %6.2f  p99 %6.2f  max "
	       "%7.2f  (%u calls, %u over 100 ms)\n", what, ms[n / 2],
	       ms[n * 9 / 10], ms[n * 99 / 100], ms[n - 1], n, slow);
	free(ms);
}

/* The churn: create and destroy until killed; the count goes to out_fd
 * after each pair. */
static void churn(const struct hd *d, uint64_t ring, int pause_ms,
		  int out_fd)
{
	int sock = ctl_connect(d->sock);
	uint64_t pairs = 0;
	double create_ms = 0;

	CHECK(sock >= 0);
	for (;;) {
		uint64_t t0 = tu_now_ns();

		CHECK_RC(hc_create(sock, "churn", ring, 0), 0);
		create_ms += ms_since(t0);
		CHECK_RC(hc_destroy(sock, "churn"), 0);
		pairs++;
		CHECK(pwrite(out_fd, &pairs, sizeof(pairs), 0) == sizeof(pairs));
		CHECK(pwrite(out_fd, &create_ms, sizeof(create_ms), 8) == 8);
		if (pause_ms)
			usleep((useconds_t)pause_ms * 1000);
	}
}

/* The state directory, removed at any exit of the bench's own process
 * (a failed CHECK too), after harness.h has killed its moverd. */
static char state_dir[128];
static pid_t bench_pid;

static void remove_state_dir(void)
{
	char cmd[192];

	if (getpid() != bench_pid) /* the churn's child exits too */
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", state_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "createbench: could not remove %s\n", state_dir);
}

int main(int argc, char **argv)
{
	int seconds = argc > 2 ? atoi(argv[2]) : 10;
	uint64_t ring = (argc > 3 ? strtoull(argv[3], NULL, 10) : 1024) << 20;
	int pause_ms = argc > 4 ? atoi(argv[4]) : 0;
	char *dir = state_dir, tmp[] = "/tmp/createbench-XXXXXX";
	const char *extra[] = { "--state-dir", dir, "--log-level", "info",
				NULL };
	uint64_t pairs = 0;
	double create_ms = 0;
	int out_fd, st;
	struct hd d;
	pid_t child;

	if (argc < 2 || seconds < 1) {
		fprintf(stderr, "usage: %s MOVERD [SECONDS [RING_MIB "
			"[PAUSE_MS]]]\n", argv[0]);
		return 2;
	}
	snprintf(state_dir, sizeof(state_dir), "/dev/shm/fm-createbench-%d",
		 (int)getpid());
	bench_pid = getpid();
	/* before hd_start's own atexit: handlers run last first, so moverd
	 * is gone before its directory is */
	CHECK(atexit(remove_state_dir) == 0);
	out_fd = mkstemp(tmp);
	CHECK(out_fd >= 0);
	unlink(tmp);
	hd_start(&d, argv[1], "createbench", false, extra);
	printf("createbench: %s, rings of %llu MiB, %d ms between pairs, "
	       "state dir %s\n", argv[1], (unsigned long long)(ring >> 20),
	       pause_ms, dir);
	time_status(&d, "at rest (reference)", seconds);
	fflush(NULL);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		churn(&d, ring, pause_ms, out_fd);
		_exit(0);
	}
	time_status(&d, "beside create+destroy", seconds);
	kill(child, SIGKILL);
	waitpid(child, &st, 0);
	CHECK(pread(out_fd, &pairs, sizeof(pairs), 0) == sizeof(pairs));
	CHECK(pread(out_fd, &create_ms, sizeof(create_ms), 8) == 8);
	printf("  churn: %llu rings created and destroyed in %d s; a create "
	       "answered in %.2f ms on average\n", (unsigned long long)pairs,
	       seconds, pairs ? create_ms / (double)pairs : 0);
	hd_stop(&d);
	/* remove_state_dir takes the directory, and a ring the churn may
	 * have left (killed between a create and its destroy) */
	return 0;
}
