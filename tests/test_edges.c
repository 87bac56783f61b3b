/*
 * tests/test_edges.c - connection floods and outside text in the log
 * (issue 14, findings 4 and 12) against real moverd processes.  Every case
 * also moves a checked flow (flowcheck: every record exactly once) for a
 * well-behaved party while the hostile one does its worst, and checks
 * that moverd's CPU and fd count come back to where they were.
 * FM_EDGES_CASES=4 or 12 runs only those.
 *
 *   usage: test_edges MOVERD MOVERCTL FLOWCHECK
 */
#include "harness.h"

#include <grp.h>
#include <sys/un.h>

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin;

/* ---- helpers ------------------------------------------------------------- */


/* A script that starts moverd with at most `nofile` open files (soft and
 * hard, so that moverd cannot raise it); hd_start runs it as moverd. */
static char limited_moverd_path[96];

static const char *limited_moverd(int nofile)
{
	char *path = limited_moverd_path;
	FILE *f;

	snprintf(path, sizeof(limited_moverd_path), "/tmp/fm-edges-moverd-%d.sh",
		 (int)getpid());
	f = fopen(path, "we");
	CHECK(f);
	fprintf(f, "#!/bin/sh\nulimit -n %d || exit 1\nexec '%s' \"$@\"\n",
		nofile, moverd_bin);
	fclose(f);
	CHECK(chmod(path, 0755) == 0);
	return path;
}

static int log_lines(const struct hd *d)
{
	return hd_log_count(d, "");
}

/* A TCP connection to 127.0.0.1:port from source address `src`
 * (127.0.0.x), non-blocking connect: -1 if it could not even start. */
static int connect_from(const char *src, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in s = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

	CHECK(fd >= 0);
	CHECK(inet_pton(AF_INET, src, &s.sin_addr) == 1);
	CHECK(bind(fd, (struct sockaddr *)&s, sizeof(s)) == 0);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) && errno != EINPROGRESS) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Wait for the connect to complete, then make the socket blocking again
 * (hp_send_* want that). */
static void blocking(int fd)
{
	struct pollfd p = { fd, POLLOUT, 0 };
	socklen_t len = sizeof(int);
	int err = 0;

	CHECK(poll(&p, 1, 2000) == 1);
	CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && !err);
	CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0);
}

/* Has every non-blocking connect completed (or failed) within ms? */
static bool all_answered(const int *fds, int n, int ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)ms * 1000000ull;

	for (int i = 0; i < n; i++) {
		struct pollfd p = { fds[i], POLLOUT, 0 };

		while (poll(&p, 1, 100) == 0)
			if (tu_now_ns() > until)
				return false;
	}
	return true;
}

/* Did moverd close this connection within timeout_ms?  (Frames it sends
 * before closing are read and dropped.) */
static bool closed_within(int fd, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	char buf[4096];

	while (tu_now_ns() < until) {
		struct pollfd p = { fd, POLLIN, 0 };
		ssize_t n;

		if (poll(&p, 1, 50) <= 0)
			continue;
		n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return true;
	}
	return false;
}

/* A connection from src that moverd keeps (not closed within 1 s), tried
 * for 10 s: a slot freed by a close or a hello is free only once moverd
 * has seen it. */
static int connect_kept(const char *src, int port)
{
	for (int i = 0; i < 10; i++) {
		int fd = connect_from(src, port);

		if (fd < 0)
			return -1;
		if (!closed_within(fd, 1000))
			return fd;
		close(fd);
	}
	return -1;
}

/* A control connection that answers a status request (5 s). */
static bool ctl_status_ok(int fd)
{
	Flowmover__Response *resp = NULL;
	int rc = hc_status(fd, &resp);

	if (resp)
		ctl_response_free(resp);
	return rc == 0;
}

/*
 * A client of uid `uid` that opens up to `max` control connections, each
 * answering a status request before the next is opened, and holds them
 * until *release is closed.  *held: how many moverd kept.
 */
struct holder {
	pid_t pid;
	int release;   /* close to make it let go */
	int held;
};

static void hold_clients(struct holder *h, const struct hd *d, uid_t uid,
			 int max)
{
	int res[2], rel[2];

	CHECK(pipe(res) == 0 && pipe(rel) == 0);
	fflush(NULL);
	h->pid = fork();
	CHECK(h->pid >= 0);
	if (h->pid == 0) {
		int n = 0;
		char c;

		close(res[0]);
		close(rel[1]);
		if (uid && (setgroups(0, NULL) || setresgid(uid, uid, uid) ||
			    setresuid(uid, uid, uid)))
			_exit(3);
		for (int i = 0; i < max; i++) {
			int fd = ctl_connect(d->sock);

			if (fd < 0)
				break;
			if (!ctl_status_ok(fd)) {
				close(fd); /* refused: try the rest too */
				continue;
			}
			n++; /* held: keep fd open */
		}
		if (write(res[1], &n, sizeof(n)) != sizeof(n))
			_exit(4);
		while (read(rel[0], &c, 1) > 0)
			;
		_exit(0);
	}
	close(res[1]);
	close(rel[0]);
	CHECK(read(res[0], &h->held, sizeof(h->held)) == sizeof(h->held));
	close(res[0]);
	h->release = rel[1];
}

static void release_clients(struct holder *h)
{
	int st;

	close(h->release);
	CHECK(waitpid(h->pid, &st, 0) == h->pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- a well-behaved party: one flow, every record checked ---------------- */

struct checked {
	pid_t prod, cons;
	char name[32];
};

static pid_t run_flowcheck(const char *sock, const char *const *args)
{
	const char *argv[16] = { flowcheck_bin };
	pid_t pid;
	int n = 1;

	while (*args && n < 15)
		argv[n++] = *args++;
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		setenv("FLOWMOVER_SOCKET", sock, 1);
		execv(flowcheck_bin, (char **)argv);
		_exit(127);
	}
	return pid;
}

/*
 * Start a flow `name` from `snd` to `rcv` (the same daemon: a local flow;
 * else a flow between the two over rcv's --listen port) and a checking
 * producer and consumer of `count` records on it.
 */
static void checked_start(struct checked *c, const struct hd *snd,
			  const struct hd *rcv, const char *name, long count)
{
	char out[4096], cnt[32];
	const char *cons[] = { "consume", name, "--producers", "1", "--count",
			       cnt, NULL };
	const char *prod[] = { "produce", name, "--id", "1", "--count", cnt,
			       NULL };

	snprintf(c->name, sizeof(c->name), "%s", name);
	snprintf(cnt, sizeof(cnt), "%ld", count);
	if (snd == rcv) {
		CHECK(hd_ctl(snd, moverctl_bin, out, sizeof(out),
			     "flow create %s", name) == 0);
	} else {
		int i;

		CHECK(hd_ctl(snd, moverctl_bin, out, sizeof(out),
			     "flow create %s --peer 127.0.0.1:%d", name,
			     rcv->port) == 0);
		for (i = 0; i < 500; i++) {
			if (hd_ctl(rcv, moverctl_bin, out, sizeof(out),
				   "flow show %s", name) == 0)
				break;
			usleep(20000);
		}
		CHECK(i < 500);
	}
	c->cons = run_flowcheck(rcv->sock, cons);
	c->prod = run_flowcheck(snd->sock, prod);
}

/* Both ends exit 0 (every record exactly once) within 60 s. */
static void checked_finish(struct checked *c)
{
	pid_t pids[2] = { c->prod, c->cons };

	for (int i = 0; i < 2; i++) {
		int st = 0, k;

		for (k = 0; k < 6000; k++) {
			if (waitpid(pids[i], &st, WNOHANG) == pids[i])
				break;
			usleep(10000);
		}
		if (k == 6000) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], NULL, 0);
			fprintf(stderr, "flowcheck %s did not finish\n", c->name);
			exit(1);
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "flowcheck %s failed (status %#x)\n",
				c->name, st);
			exit(1);
		}
	}
}

/* Destroy the flow at its sender (a flow between hosts goes at both). */
static void checked_destroy(const struct hd *snd, const char *name)
{
	char out[4096];

	CHECK(hd_ctl(snd, moverctl_bin, out, sizeof(out), "flow destroy %s",
		     name) == 0);
}

static void checked_flow(const struct hd *snd, const struct hd *rcv,
			 const char *name, long count)
{
	struct checked c;

	checked_start(&c, snd, rcv, name, count);
	checked_finish(&c);
	checked_destroy(snd, name);
}

/* At most `max` log lines since `since`. */
static void few_lines(const struct hd *d, int since, int max, const char *when)
{
	int n = log_lines(d) - since;

	printf("  %s: %d log lines\n", when, n);
	CHECK(n < max);
}

/* CPU share over 2 s must be low (moverd waits, it does not spin), and
 * so must the number of log lines in those 2 s. */
static void quiet_cpu(const struct hd *d, const char *when)
{
	int lines = log_lines(d);
	double cpu = hd_cpu_share(d, 2000);

	printf("  %s: moverd cpu %.2f of a core\n", when, cpu);
	CHECK(cpu < 0.3);
	few_lines(d, lines, 50, when);
}

/* A counter of `moverctl --json status`. */
static unsigned long long status_counter(const struct hd *d, const char *key)
{
	char out[16384], val[32];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	CHECK(hj_get(out, key, val, sizeof(val)));
	return strtoull(val, NULL, 10);
}

/* ---- case 4: connection floods ------------------------------------------- */

/* 4a: more idle peer connections than moverd has fds, then root's control
 * connections until accept fails with EMFILE. */
static void case_flood_peers(void)
{
	const char *const opts[] = { "--peer-max-conns-per-addr", "1000",
				     "--peer-max-pending", "1000",
				     "--peer-hello-timeout", "120", NULL };
	struct hd d, d2;
	static int fds[300];
	char out[8192];
	int base, lines, n = 0;

	hd_start(&d, limited_moverd(256), "edges4a", true, opts);
	unlink(limited_moverd_path); /* it has exec'd moverd by now */
	hd_start(&d2, moverd_bin, "edges4a2", false, NULL);
	/* the well-behaved peer connects before the flood */
	checked_flow(&d2, &d, "before", 2000);
	base = hd_fds(&d);
	lines = log_lines(&d);

	for (int i = 0; i < 300; i++)
		if ((fds[n] = connect_from("127.0.0.1", d.port)) >= 0)
			n++;
	printf("  %d peer connections started\n", n);
	/* SYNs beyond the listen backlog are dropped and sent again 1, 3,
	 * 7 s later: wait until every connect has an answer.  With SYN
	 * cookies a connection can look open here and not exist in moverd
	 * until its first bytes: one heartbeat each, then they are idle. */
	CHECK(n == 300 && all_answered(fds, n, 20000));
	for (int i = 0; i < n; i++)
		hp_send_hdr(fds[i], WIRE_HEARTBEAT, 0, 0, 0, 0);
	/* past 256 - 64 fds moverd refuses them at accept */
	for (int i = 0; i < 200 && !status_counter(&d, "peers_refused"); i++)
		usleep(100000);
	quiet_cpu(&d, "300 idle peer connections");
	few_lines(&d, lines, 200, "the whole peer flood");
	CHECK(status_counter(&d, "peers_refused") >= 1);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create x") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy x") == 0);
	checked_flow(&d2, &d, "during", 20000);
	checked_flow(&d, &d, "local", 20000);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	hd_wait_fds(&d, base);

	/* root's own control connections until moverd's fds run out */
	lines = log_lines(&d);
	n = 0;
	for (uint64_t until = tu_now_ns() + 3000000000ull;
	     n < 300 && tu_now_ns() < until;) {
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC |
					 SOCK_NONBLOCK, 0);

		CHECK(strlen(d.sock) < sizeof(a.sun_path));
		memcpy(a.sun_path, d.sock, strlen(d.sock));
		if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
			close(fd); /* the backlog is full: moverd is behind */
			usleep(1000);
			continue;
		}
		fds[n++] = fd;
	}
	/* moverd's fds ran out: the rest wait in the backlog */
	CHECK(n > 256 - base);
	printf("  %d control connections started\n", n);
	usleep(500000);
	quiet_cpu(&d, "control socket out of fds");
	few_lines(&d, lines, 200, "the whole control flood");
	hd_alive(&d);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	hd_wait_fds(&d, base);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status") == 0);
	CHECK(status_counter(&d, "accept_waits") >= 1);
	checked_flow(&d2, &d, "after", 2000);
	quiet_cpu(&d, "after");
	hd_stop(&d2);
	hd_stop(&d);
}

/* 4b: an unprivileged uid takes every control connection it can. */
static void case_flood_clients(void)
{
	const char *const small[] = { "--max-clients", "48",
				      "--max-clients-per-uid", "1000", NULL };
	struct holder h, hr;
	struct checked c;
	struct hd d;
	char out[8192];
	int base;

	/* the per-uid cap (default 64) */
	hd_start(&d, moverd_bin, "edges4b", false, NULL);
	base = hd_fds(&d);
	hold_clients(&h, &d, 65534, 200);
	printf("  uid 65534 holds %d control connections\n", h.held);
	CHECK(h.held == 64);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status") == 0);
	CHECK(hd_log_count(&d, "uid 65534") >= 1);
	CHECK(status_counter(&d, "clients_refused") == 200 - 64);
	checked_start(&c, &d, &d, "busy", 20000);
	checked_finish(&c);
	checked_destroy(&d, "busy");
	quiet_cpu(&d, "uid 65534 at its cap");
	release_clients(&h);
	hd_wait_fds(&d, base);
	hd_stop(&d);

	/* the total cap keeps 16 connections for root */
	hd_start(&d, moverd_bin, "edges4b2", false, small);
	base = hd_fds(&d);
	hold_clients(&h, &d, 65534, 100);
	printf("  uid 65534 holds %d of --max-clients 48\n", h.held);
	CHECK(h.held == 32);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create y") == 0);
	hold_clients(&hr, &d, 0, 15);
	printf("  root holds %d more\n", hr.held);
	CHECK(hr.held == 15);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status") == 0);
	release_clients(&hr);
	release_clients(&h);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy y") == 0);
	hd_wait_fds(&d, base);
	hd_stop(&d);
}

/* 4c: the hello deadline, and nothing before the hello. */
static void case_hello(void)
{
	const char *const opts[] = { "--peer-hello-timeout", "2", NULL };
	struct hp_open o = { "early", 9, 1 << 16, 1024, 0x5eed00ull, 0 };
	struct hd d, d2;
	struct checked c;
	char out[4096];
	uint64_t t0;
	bool gone = false;
	int fd, good, base;

	hd_start(&d, moverd_bin, "edges4c", true, opts);
	hd_start(&d2, moverd_bin, "edges4c2", false, NULL);
	base = hd_fds(&d);
	checked_start(&c, &d2, &d, "good", 20000);

	/* heartbeats every 500 ms, never a hello: dropped after ~2 s */
	fd = hp_connect(d.port);
	t0 = tu_now_ns();
	while (!gone && tu_now_ns() - t0 < 6000000000ull) {
		hp_send_hdr(fd, WIRE_HEARTBEAT, 0, 0, 0, 0);
		gone = closed_within(fd, 500);
	}
	printf("  heartbeats without a hello: %s after %.1f s\n",
	       gone ? "dropped" : "still connected",
	       (double)(tu_now_ns() - t0) / 1e9);
	CHECK(gone);
	close(fd);

	/* an OPEN before the hello: the connection fails, no flow */
	fd = hp_connect(d.port);
	CHECK(hp_open(fd, &o));
	CHECK(closed_within(fd, 3000));
	close(fd);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow show early") != 0);

	/* DATA and ACK before the hello fail it too */
	fd = hp_connect(d.port);
	CHECK(hp_send_hdr(fd, WIRE_ACK, 1, 0, 0, 0));
	CHECK(closed_within(fd, 3000));
	close(fd);

	/* a peer that said hello stays past the deadline */
	good = hp_connect(d.port);
	CHECK(hp_hello(good, "good-peer"));
	for (int i = 0; i < 8; i++) {
		CHECK(hp_send_hdr(good, WIRE_HEARTBEAT, 0, 0, 0, 0));
		CHECK(!closed_within(good, 500));
	}
	close(good);

	checked_finish(&c);
	checked_destroy(&d2, "good");
	CHECK(hd_log_count(&d, "hello") >= 1);
	quiet_cpu(&d, "after");
	hd_stop(&d2);
	hd_wait_fds(&d, base);
	hd_stop(&d);
}

/*
 * n connections (in fds) to d from 127.0.0.first, or from first, first + 1
 * ... (spread), each saying hello unless hello is NULL: the last must be
 * closed by moverd, the others held.
 */
static void crowd(const struct hd *d, int first, bool spread, int n,
		  const char *hello, int *fds)
{
	for (int i = 0; i < n; i++) {
		char src[16];

		snprintf(src, sizeof(src), "127.0.0.%d", first + (spread ? i : 0));
		fds[i] = connect_from(src, d->port);
		CHECK(fds[i] >= 0);
		blocking(fds[i]);
		/* (the last may be closed before its hello goes) */
		CHECK(!hello || hp_hello(fds[i], hello) || i == n - 1);
		if (spread)
			usleep(50000);
	}
	CHECK(closed_within(fds[n - 1], 2000));
	for (int i = 0; i < n - 1; i++)
		CHECK(!closed_within(fds[i], 100));
}

/* 4d: at most 8 connections per source address, 64 (here 4) pending,
 * 512 (here 5) in all. */
static void case_per_addr(void)
{
	const char *const opts[] = { "--peer-max-pending", "4", NULL };
	const char *const total[] = { "--peer-max-inbound", "5", NULL };
	struct hd d, d2;
	struct checked c;
	int fds[9], base, extra;

	hd_start(&d, moverd_bin, "edges4d", true, NULL);
	hd_start(&d2, moverd_bin, "edges4d2", false, NULL);
	base = hd_fds(&d);
	checked_start(&c, &d2, &d, "good", 20000);
	crowd(&d, 2, false, 9, "crowd", fds);
	printf("  8 connections from 127.0.0.2 held, the 9th closed\n");
	CHECK(status_counter(&d, "peers_refused") == 1);
	/* one goes: room for one more */
	close(fds[0]);
	close(fds[8]);
	fds[0] = connect_kept("127.0.0.2", d.port);
	CHECK(fds[0] >= 0);
	checked_finish(&c);
	checked_destroy(&d2, "good");
	quiet_cpu(&d, "8 from one address");
	for (int i = 0; i < 8; i++)
		close(fds[i]);
	hd_stop(&d2);
	hd_wait_fds(&d, base);
	hd_stop(&d);

	/* connections that have not said hello: at most --peer-max-pending */
	hd_start(&d, moverd_bin, "edges4d3", true, opts);
	base = hd_fds(&d);
	crowd(&d, 10, true, 5, NULL, fds);
	/* one says hello: no longer pending, room for another */
	CHECK(hp_hello(fds[0], "late"));
	extra = connect_kept("127.0.0.20", d.port);
	CHECK(extra >= 0);
	printf("  4 pending held, the 5th closed, room after a hello\n");
	close(extra);
	for (int i = 0; i < 5; i++)
		close(fds[i]);
	hd_wait_fds(&d, base);
	hd_stop(&d);

	/* in all, said hello or not: at most --peer-max-inbound (a
	 * connection without flows is never closed by moverd) */
	hd_start(&d, moverd_bin, "edges4d4", true, total);
	base = hd_fds(&d);
	crowd(&d, 30, true, 6, "many", fds);
	CHECK(status_counter(&d, "peers_refused") == 1);
	close(fds[0]);
	close(fds[5]);
	extra = connect_kept("127.0.0.40", d.port);
	CHECK(extra >= 0);
	printf("  5 from 5 addresses held, the 6th closed, room after one "
	       "went\n");
	close(extra);
	for (int i = 1; i < 5; i++)
		close(fds[i]);
	hd_wait_fds(&d, base);
	hd_stop(&d);
}

/* ---- case 12: outside text in the log ------------------------------------ */

/* A fake peer daemon that moverd connects to for flow `name`: it answers
 * the open with an error whose message is hostile. */
static void hostile_answer(const struct hd *d, const char *msg)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	static uint8_t body[WIRE_MAX_CTRL];
	socklen_t len = sizeof(a);
	uint64_t until = tu_now_ns() + 10000000000ull;
	char out[4096];
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), fd, one = 1;
	struct wire_hdr h;

	CHECK(lfd >= 0);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(listen(lfd, 4) == 0);
	CHECK(getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out),
		     "flow create out --peer 127.0.0.1:%d",
		     ntohs(a.sin_port)) == 0);
	fd = accept(lfd, NULL, NULL);
	CHECK(fd >= 0);
	/* a responder answers the hello first: the opens wait for it */
	CHECK(hp_hello(fd, "fake-responder"));
	while (tu_now_ns() < until) {
		Flowmover__PeerMsg *m;
		int rc = hp_read_frame(fd, &h, body, sizeof(body), 100);

		CHECK(rc >= 0);
		if (rc == 0 || h.type != WIRE_CTRL)
			continue;
		m = flowmover__peer_msg__unpack(NULL, h.len, body);
		CHECK(m);
		if (m->body_case == FLOWMOVER__PEER_MSG__BODY_OPEN) {
			Flowmover__PeerMsg r = FLOWMOVER__PEER_MSG__INIT;
			Flowmover__PeerFlowOpened op =
				FLOWMOVER__PEER_FLOW_OPENED__INIT;

			op.flow_id = m->open->flow_id;
			op.error = -EPROTO;
			op.message = (char *)msg;
			r.body_case = FLOWMOVER__PEER_MSG__BODY_OPENED;
			r.opened = &op;
			CHECK(hp_send_msg(fd, &r));
			flowmover__peer_msg__free_unpacked(m, NULL);
			break;
		}
		flowmover__peer_msg__free_unpacked(m, NULL);
	}
	for (int i = 0; i < 100; i++) {
		if (hd_ctl(d, moverctl_bin, out, sizeof(out), "flow show out") == 0 &&
		    strstr(out, "failed"))
			break;
		usleep(20000);
	}
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "flow destroy out") == 0);
	close(fd);
	close(lfd);
}

/* A control request naming a flow with hostile bytes. */
static void hostile_describe(const struct hd *d, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DescribeFlow de = FLOWMOVER__DESCRIBE_FLOW__INIT;
	Flowmover__Response *resp = NULL;
	int fd = ctl_connect(d->sock);

	CHECK(fd >= 0);
	de.name = (char *)name;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
	req.describe = &de;
	CHECK(ctl_call(fd, &req, &resp, NULL, 5000) < 0);
	close(fd);
}

/* Every line starts with moverd's own stamp, none has an ESC or is long. */
static void log_is_clean(const struct hd *d)
{
	static char line[1 << 17];
	FILE *f = fopen(d->log, "re");
	int n = 0, bad = 0;

	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);
		unsigned h, m, s, ms;
		char who[16];

		n++;
		if (len > 1100 || strchr(line, 0x1b) || strchr(line, 0x07) ||
		    sscanf(line, "%2u:%2u:%2u.%3u %15s", &h, &m, &s, &ms, who) != 5 ||
		    strcmp(who, "moverd") || !strncmp(line, "12:00:00.000", 12)) {
			if (bad++ < 5)
				printf("  bad log line (%zu bytes): %.120s\n", len,
				       line);
		}
	}
	fclose(f);
	printf("  %d log lines, %d bad\n", n, bad);
	CHECK(n > 0);
	CHECK(bad == 0);
}

static void case_log_text(void)
{
	static const char forged[] = "\n12:00:00.000 moverd error  FORGED\x1b[2J";
	static char node[60000], name[200];
	struct hp_open o = { name, 3, 1 << 16, 1024, 0xbad00ull, 0 };
	Flowmover__PeerFlowOpened *op = NULL;
	struct hd d, d2;
	struct checked c;
	int fd;

	hd_start(&d, moverd_bin, "edges12", true, NULL);
	hd_start(&d2, moverd_bin, "edges12b", false, NULL);
	checked_start(&c, &d2, &d, "good", 20000);

	snprintf(node, sizeof(node), "evil%s", forged);
	memset(node + strlen(node), 'A', sizeof(node) - 1 - strlen(node));
	snprintf(name, sizeof(name), "bad\x1b]0;pwned\x07%s\x7f\\x41", forged);
	/* the hello and open lines are rate-limited per call site: let the
	 * good peer's lines be a second old, so that these get printed */
	usleep(1100000);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, node));
	CHECK(hp_open(fd, &o));
	CHECK(hp_wait_opened(fd, 3, 5000, &op) == 0);
	CHECK(op->error != 0);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(hp_close_flow(fd, name));
	usleep(200000);
	close(fd);

	/* a peer we connect to answers with a hostile error message */
	hostile_answer(&d, "\x1b[2Jno" "\n12:00:00.000 moverd error  FORGED3");
	/* a control client names a flow with hostile bytes */
	hostile_describe(&d, "ctl\n12:00:00.000 moverd error  FORGED4\x1b[2J");

	checked_finish(&c);
	hd_alive(&d);
	log_is_clean(&d);
	/* they were logged, escaped and cut */
	CHECK(hd_log_count(&d, "hello from evil\\x0a12:00:00.000 moverd "
			   "error  FORGED\\x1b[2JAAAA") == 1);
	CHECK(hd_log_count(&d, "AAA...") >= 1);
	CHECK(hd_log_count(&d, "cannot open flow 'bad\\x1b]0;pwned\\x07") == 1);
	CHECK(hd_log_count(&d, "failed: \\x1b[2Jno\\x0a12:00") == 1);
	hd_stop(&d2);
	hd_stop(&d);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 4, case_flood_peers, "4a: more idle peer connections than fds" },
		{ 4, case_flood_clients, "4b: one uid takes every control slot" },
		{ 4, case_hello, "4c: hello deadline, nothing before hello" },
		{ 4, case_per_addr, "4d: connections per address, pending and in all" },
		{ 12, case_log_text, "12: outside text in log lines" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK\n", argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_EDGES_CASES");
}
