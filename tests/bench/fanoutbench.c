/*
 * fanoutbench - what fan-out costs (issue 11): one producer process on
 * host A, its flow sent to 1, 2 and 4 peer hosts (moverd daemons on
 * loopback over TCP, one consumer process on each), and a local flow with
 * 1, 2 and 4 consumer processes; records/s of 32-byte records and GB/s of
 * 64 KiB records, every configuration in the same run, with the ratio to
 * the one-subscriber configuration of the same kind.  A program that
 * prints figures, not a test.  Every daemon and process shares this
 * machine's cores: with 4 peer hosts, 6 daemons and consumers compete
 * for them, so those figures say what one machine does, not a network.
 *
 * usage: fanoutbench MOVERD MOVERCTL [SCALE]   (SCALE: 1 = default sizes)
 */
#include "harness.h"

#include <sys/wait.h>

#define BIG (64u << 10)

static const char *moverd_bin, *moverctl_bin;

struct size_case {
	uint32_t len;
	uint64_t count;
};

/* A consumer process: attach on sock, say ready, read count records. */
static pid_t consumer(const char *sock, const char *name, uint64_t count,
		      int ready)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid)
		return pid;
	{
		static unsigned char buf[BIG];
		flowshm_t *c = NULL;
		size_t len;

		setenv("FLOWMOVER_SOCKET", sock, 1);
		CHECK_RC(flowshm_attach(name, FLOWSHM_CONSUMER, NULL, &c), 0);
		CHECK(write(ready, "x", 1) == 1);
		for (uint64_t i = 0; i < count; i++)
			CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len,
					      60000000000ll), 0);
		flowshm_detach(c);
		_exit(0);
	}
}

/* Produce count records of len bytes on sock's flow; seconds until every
 * consumer (pids) has read them all. */
static double run(const char *sock, const char *name, const struct size_case *s,
		  const pid_t *pids, unsigned n)
{
	static unsigned char buf[BIG];
	flowshm_t *p = NULL;
	uint64_t t0;
	int st;

	setenv("FLOWMOVER_SOCKET", sock, 1);
	CHECK_RC(flowshm_attach(name, FLOWSHM_PRODUCER, NULL, &p), 0);
	memset(buf, 0x5a, sizeof(buf));
	t0 = tu_now_ns();
	for (uint64_t i = 0; i < s->count; i++)
		CHECK_RC(flowshm_send(p, buf, s->len, 60000000000ll), 0);
	for (unsigned i = 0; i < n; i++) {
		CHECK(waitpid(pids[i], &st, 0) == pids[i]);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	flowshm_detach(p);
	return (double)(tu_now_ns() - t0) / 1e9;
}

static void print(const char *what, unsigned subs, const struct size_case *s,
		  double rate, double ref)
{
	if (s->len == BIG)
		printf("%-28s %u  %8.3f GB/s      x%.2f\n", what, subs,
		       rate * s->len / 1e9, ref ? rate / ref : 1.0);
	else
		printf("%-28s %u  %8.0f krec/s    x%.2f\n", what, subs,
		       rate / 1e3, ref ? rate / ref : 1.0);
}

/* A's flow to n peer hosts, one consumer on each. */
static double remote(unsigned n, const struct size_case *s)
{
	static const char *const tcp[] = { "--transport", "tcp", NULL };
	struct hd a, peers[4];
	char cmd[512], out[4096], tag[32];
	pid_t pids[4] = { 0 };
	int ready[2];
	size_t k;
	double secs;

	CHECK(pipe(ready) == 0);
	k = (size_t)snprintf(cmd, sizeof(cmd), "flow create f --ring-size 16M "
			     "--max-record 64K");
	for (unsigned i = 0; i < n; i++) {
		snprintf(tag, sizeof(tag), "fob-%u", i);
		hd_start(&peers[i], moverd_bin, tag, true, NULL);
		k += (size_t)snprintf(cmd + k, sizeof(cmd) - k,
				      " --peer 127.0.0.1:%d", peers[i].port);
	}
	hd_start(&a, moverd_bin, "fob-A", false, tcp);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "%s", cmd) == 0);
	for (unsigned i = 0; i < n; i++) {
		CHECK(hd_wait_state(&peers[i], moverctl_bin, "f", "open", 20000,
				    NULL, 0));
		pids[i] = consumer(peers[i].sock, "f", s->count, ready[1]);
	}
	for (unsigned i = 0; i < n; i++) {
		char x;

		CHECK(read(ready[0], &x, 1) == 1);
	}
	secs = run(a.sock, "f", s, pids, n);
	hd_stop(&a);
	for (unsigned i = 0; i < n; i++)
		hd_stop(&peers[i]);
	close(ready[0]);
	close(ready[1]);
	return (double)s->count / secs;
}

/* A local flow with n consumer processes. */
static double local(struct hd *a, unsigned n, const struct size_case *s)
{
	char out[4096];
	pid_t pids[4] = { 0 };
	int ready[2];
	double secs;

	CHECK(pipe(ready) == 0);
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create l "
		     "--ring-size 16M --max-record 64K") == 0);
	for (unsigned i = 0; i < n; i++)
		pids[i] = consumer(a->sock, "l", s->count, ready[1]);
	for (unsigned i = 0; i < n; i++) {
		char x;

		CHECK(read(ready[0], &x, 1) == 1);
	}
	secs = run(a->sock, "l", s, pids, n);
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow destroy l") == 0);
	close(ready[0]);
	close(ready[1]);
	return (double)s->count / secs;
}

#define ROUNDS_MAX 9

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2];
}

int main(int argc, char **argv)
{
	static const unsigned subs[] = { 1, 2, 4 };
	static const char *const names[4] = {
		"local subscribers, 32B", "local subscribers, 64K",
		"fan-out to peer hosts, 32B", "fan-out to peer hosts, 64K",
	};
	long scale = argc > 3 ? atol(argv[3]) : 1;
	long rounds = argc > 4 ? atol(argv[4]) : 3;
	struct size_case small = { 32, 2000000 }, big = { BIG, 8192 };
	double rate[4][3][ROUNDS_MAX];

	if (argc < 3 || scale < 1 || rounds < 1 || rounds > ROUNDS_MAX) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL [SCALE [ROUNDS]]\n",
			argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	small.count *= (uint64_t)scale;
	big.count *= (uint64_t)scale;
	signal(SIGPIPE, SIG_IGN);
	/* rounds interleaved, medians printed: the machine's other load
	 * spreads over every configuration alike */
	for (long r = 0; r < rounds; r++) {
		struct hd a;

		hd_start(&a, moverd_bin, "fob-L", false, NULL);
		for (unsigned i = 0; i < 3; i++) {
			rate[0][i][r] = local(&a, subs[i], &small);
			rate[1][i][r] = local(&a, subs[i], &big);
		}
		hd_stop(&a);
		for (unsigned i = 0; i < 3; i++) {
			rate[2][i][r] = remote(subs[i], &small);
			rate[3][i][r] = remote(subs[i], &big);
		}
	}
	printf("%-28s subs  median of %ld   vs 1 subscriber\n", "", rounds);
	for (unsigned k = 0; k < 4; k++) {
		double ref = median(rate[k][0], (unsigned)rounds);

		for (unsigned i = 0; i < 3; i++)
			print(names[k], subs[i], k & 1 ? &big : &small,
			      median(rate[k][i], (unsigned)rounds), ref);
	}
	return 0;
}
