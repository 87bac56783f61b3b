/*
 * tests/test_notify.c - moverd's sd_notify messages to systemd, for real
 * but without systemd: the test owns a unix datagram socket, names it in
 * NOTIFY_SOCKET (and sets WATCHDOG_USEC), starts moverd, and reads what
 * arrives.  FM_NOTIFY_CASES=1,2 runs only those cases.
 *
 *   usage: test_notify MOVERD MOVERCTL
 *
 *   1  READY=1 (with MAINPID) once the control socket answers and the
 *      declared flows exist; WATCHDOG=1 pings, every WATCHDOG_USEC / 2;
 *      none while moverd is stopped (SIGSTOP: a stuck loop); again after
 *      SIGCONT; RELOADING=1 then READY=1 at SIGHUP and at moverctl reload;
 *      STOPPING=1 at SIGTERM
 *   2  without WATCHDOG_USEC: READY=1, and no pings
 */
#include "harness.h"

#include <sys/un.h>

static const char *moverd_bin, *moverctl_bin;

struct nsock {
	char dir[64], path[100];
	int fd;
};

static void nsock_open(struct nsock *n)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	snprintf(n->dir, sizeof(n->dir), "/tmp/fm-notify-%d", (int)getpid());
	snprintf(n->path, sizeof(n->path), "%s/notify.sock", n->dir);
	CHECK(mkdir(n->dir, 0755) == 0 || errno == EEXIST);
	unlink(n->path);
	n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CHECK(n->fd >= 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", n->path);
	CHECK(bind(n->fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(setenv("NOTIFY_SOCKET", n->path, 1) == 0);
}

static void nsock_close(struct nsock *n)
{
	char cmd[160];

	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	close(n->fd);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", n->dir);
	CHECK(system(cmd) == 0);
}

/* The next message within timeout_ms into buf ("" if none came). */
static const char *next_msg(struct nsock *n, char *buf, size_t cap,
			    int timeout_ms)
{
	struct pollfd p = { .fd = n->fd, .events = POLLIN };
	ssize_t len;

	buf[0] = 0;
	if (poll(&p, 1, timeout_ms) != 1)
		return buf;
	len = recv(n->fd, buf, cap - 1, 0);
	CHECK(len >= 0);
	buf[len] = 0;
	return buf;
}

/* Wait up to timeout_ms for a message starting with want; pings
 * (WATCHDOG=1) between are skipped unless want is the ping. */
static void expect_msg(struct nsock *n, const char *want, int timeout_ms,
		       char *buf, size_t cap)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	while (tu_now_ns() < until) {
		next_msg(n, buf, cap, 100);
		if (!strncmp(buf, want, strlen(want)))
			return;
		if (buf[0] && strcmp(buf, "WATCHDOG=1")) {
			fprintf(stderr, "expected %s, got '%s'\n", want, buf);
			exit(1);
		}
	}
	fprintf(stderr, "no %s within %d ms\n", want, timeout_ms);
	exit(1);
}

/* How many pings arrive in ms milliseconds (anything else fails). */
static int count_pings(struct nsock *n, int ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)ms * 1000000ull;
	char buf[256];
	int pings = 0;

	while (tu_now_ns() < until) {
		next_msg(n, buf, sizeof(buf), 50);
		if (!buf[0])
			continue;
		if (strcmp(buf, "WATCHDOG=1")) {
			fprintf(stderr, "unexpected message '%s'\n", buf);
			exit(1);
		}
		pings++;
	}
	return pings;
}

static void start(struct hd *d, const char *tag)
{
	static char conf[160];
	const char *extra[] = { "--config", conf, NULL };
	FILE *f;

	snprintf(d->dir, sizeof(d->dir), "/tmp/fm-%s-%d", tag, (int)getpid());
	snprintf(d->sock, sizeof(d->sock), "%s/moverd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/moverd.log", d->dir);
	snprintf(conf, sizeof(conf), "%s/moverd.conf", d->dir);
	CHECK(mkdir(d->dir, 0755) == 0 || errno == EEXIST);
	f = fopen(conf, "we");
	CHECK(f);
	fputs("flow = declared ring-size=8K\n", f);
	CHECK(fclose(f) == 0);
	d->port = 0;
	hd_exec(d, moverd_bin, extra);
}

static void case_notify(void)
{
	struct nsock n;
	struct hd d;
	char buf[256], want[64], out[4096];
	int pings;

	nsock_open(&n);
	CHECK(setenv("WATCHDOG_USEC", "1000000", 1) == 0); /* ping per 0.5 s */
	start(&d, "notify1");
	snprintf(want, sizeof(want), "READY=1\nMAINPID=%d", (int)d.pid);
	expect_msg(&n, "READY=1", 5000, buf, sizeof(buf));
	CHECK(!strcmp(buf, want));
	/* READY came after the declared flow was made */
	CHECK(hd_flow_json(&d, moverctl_bin, "declared", out, sizeof(out)));
	/* pings sent while moverctl ran are queued: not part of the window */
	count_pings(&n, 60);
	pings = count_pings(&n, 3000);
	printf("    %d pings in 3 s (WATCHDOG_USEC 1 s)\n", pings);
	/* about 6 (7 at the window's edges); a loaded machine may wake it
	 * late, never one per cycle */
	CHECK(pings >= 2 && pings <= 8);
	/* a stuck moverd sends none; back, it does again */
	CHECK(kill(d.pid, SIGSTOP) == 0);
	count_pings(&n, 200); /* one may have been on its way */
	pings = count_pings(&n, 2000);
	CHECK(kill(d.pid, SIGCONT) == 0);
	printf("    %d pings while stopped for 2 s\n", pings);
	CHECK(pings == 0);
	CHECK(count_pings(&n, 1500) >= 1);
	/* reloads */
	CHECK(kill(d.pid, SIGHUP) == 0);
	expect_msg(&n, "RELOADING=1", 5000, buf, sizeof(buf));
	expect_msg(&n, "READY=1", 5000, buf, sizeof(buf));
	CHECK_RC(hd_ctl(&d, moverctl_bin, out, sizeof(out), "reload"), 0);
	expect_msg(&n, "RELOADING=1", 5000, buf, sizeof(buf));
	expect_msg(&n, "READY=1", 5000, buf, sizeof(buf));
	/* stop: SIGTERM, exit 0; the message waits in our socket */
	hd_stop(&d);
	expect_msg(&n, "STOPPING=1", 1000, buf, sizeof(buf));
	nsock_close(&n);
}

static void case_no_watchdog(void)
{
	struct nsock n;
	struct hd d;
	char buf[256];

	nsock_open(&n);
	unsetenv("WATCHDOG_USEC");
	start(&d, "notify2");
	expect_msg(&n, "READY=1", 5000, buf, sizeof(buf));
	CHECK(count_pings(&n, 1500) == 0);
	hd_stop(&d);
	expect_msg(&n, "STOPPING=1", 1000, buf, sizeof(buf));
	nsock_close(&n);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_notify, "READY, WATCHDOG (not while stopped), "
		  "RELOADING/READY, STOPPING" },
		{ 2, case_no_watchdog, "no WATCHDOG_USEC: no pings" },
	};

	if (argc != 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_NOTIFY_CASES");
}
