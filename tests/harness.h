/*
 * tests/harness.h - what the hostile-input tests share: a real moverd on a
 * private socket (its pid, fd count and CPU time), moverctl against it, and
 * a hostile peer that speaks the peer wire format (moverd/wire.h) from the
 * test itself over a real TCP connection.
 *
 * Header-only, static inline, like testutil.h: each test is one program.
 */
#ifndef FLOWMOVER_HARNESS_H
#define FLOWMOVER_HARNESS_H

#include "testutil.h"
#include "ctl_client.h"
#include "flowmover.pb-c.h"
#include "wire.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ---- a moverd of the test's own ------------------------------------------ */

struct hd {
	char dir[96];          /* private directory, removed by hd_stop */
	char sock[128];
	char log[128];         /* its stderr */
	int port;              /* --listen hd_addr():port, 0 = none */
	pid_t pid;
};

/* FM_HD_ADDR / FM_HD_TRANSPORT: the address a test's daemons listen on and
 * the transport they use (127.0.0.1 and tcp unless set): the soft-RoCE guest
 * runs the same cases on its rxe address over rdma. */
static inline const char *hd_addr(void)
{
	const char *a = getenv("FM_HD_ADDR");

	return a && *a ? a : "127.0.0.1";
}

static inline const char *hd_transport(void)
{
	const char *t = getenv("FM_HD_TRANSPORT");

	return t && *t ? t : "tcp";
}

static inline int hd_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	CHECK(fd >= 0);
	CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* ---- no moverd outlives a test -------------------------------------------
 * Every daemon hd_start or hd_restart starts is tracked until hd_stop or
 * hd_kill.  At exit (a failed CHECK), the main process shows each one's
 * sanitizer report or last log lines and kills it.  A pid that is still
 * our unreaped child cannot have been reused by another process. */

struct hd_live {
	pid_t pid;
	char log[128];
};

static struct hd_live hd_live[256];
static unsigned hd_n_live;
static pid_t hd_main_pid;

/* A daemon's sanitizer report, or the last lines of its log. */
static inline void hd_show_log(const char *log)
{
	char cmd[640];

	fprintf(stderr, "--- the end of %s:\n", log);
	fflush(stderr);
	snprintf(cmd, sizeof(cmd), "{ grep -m1 -A14 -E 'ERROR: "
		 "[A-Za-z]+Sanitizer|runtime error' '%s' || tail -n 25 "
		 "'%s'; } >&2", log, log);
	if (system(cmd) != 0)
		fprintf(stderr, "(no log)\n");
}

static inline void hd_kill_live(void)
{
	if (getpid() != hd_main_pid)
		return; /* a child's CHECK */
	for (unsigned i = 0; i < hd_n_live; i++) {
		struct hd_live *l = &hd_live[i];

		if (waitpid(l->pid, NULL, WNOHANG) != 0)
			continue; /* gone, or reaped by whoever killed it */
		hd_show_log(l->log);
		kill(l->pid, SIGKILL);
		waitpid(l->pid, NULL, 0);
	}
	hd_n_live = 0;
}

static inline void hd_track(const struct hd *d)
{
	if (!hd_main_pid) {
		hd_main_pid = getpid();
		CHECK(atexit(hd_kill_live) == 0);
	}
	CHECK(hd_n_live < sizeof(hd_live) / sizeof(hd_live[0]));
	hd_live[hd_n_live].pid = d->pid;
	snprintf(hd_live[hd_n_live].log, sizeof(hd_live[0].log), "%s", d->log);
	hd_n_live++;
}

static inline void hd_untrack(pid_t pid)
{
	for (unsigned i = 0; i < hd_n_live; i++)
		if (hd_live[i].pid == pid)
			hd_live[i] = hd_live[--hd_n_live];
}

static inline int hd_log_count(const struct hd *d, const char *needle);

/* The control socket answers before the peer port listens (a sanitizer
 * build is slow enough to show it): with --listen, wait for that too. */
static inline void hd_wait_peer_port(const struct hd *d, const char **argv)
{
	bool listen = false;

	for (; *argv; argv++)
		listen |= !strcmp(*argv, "--listen");
	for (int i = 0; listen && i < 1000 &&
			!hd_log_count(d, "listening for peers"); i++)
		usleep(10000);
}

/*
 * Does the moverd at sock answer a status request?  A connect alone is not
 * enough after a kill -9: the killed moverd's socket file is still there
 * (connect refused, or reset), or the new moverd is between its unlink and
 * its bind, or it is re-adopting flows before it listens.
 */
static inline bool hd_status_answered(const char *sock)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__GetStatus st = FLOWMOVER__GET_STATUS__INIT;
	Flowmover__Response *resp = NULL;
	int fd = ctl_connect(sock), rc;

	if (fd < 0)
		return false;
	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &st;
	rc = ctl_call(fd, &req, &resp, NULL, 2000);
	close(fd);
	ctl_response_free(resp);
	return rc == 0;
}

/*
 * Run `moverd --foreground --socket DIR/moverd.sock --socket-mode 0666
 * [--listen hd_addr():PORT --transport hd_transport()] EXTRA...` (EXTRA:
 * NULL-terminated) in d's directory, its stderr appended to d's log; wait
 * until it serves.
 */
static inline void hd_exec(struct hd *d, const char *moverd,
			   const char *const *extra)
{
	const char *argv[64] = { moverd, "--foreground", "--socket", d->sock,
				 "--socket-mode", "0666", "--log-level",
				 "debug" };
	char laddr[64];
	int n = 8, st;

	if (d->port) {
		snprintf(laddr, sizeof(laddr), "%s:%d", hd_addr(), d->port);
		argv[n++] = "--listen";
		argv[n++] = laddr;
		argv[n++] = "--transport";
		argv[n++] = hd_transport();
		/* Off loopback moverd wants a peer key; the guest's rxe
		 * address is private to it (peer keys: test_auth). */
		if (strcmp(hd_addr(), "127.0.0.1"))
			argv[n++] = "--insecure-peers";
	}
	for (; extra && *extra && n < 62; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	fflush(NULL);
	d->pid = fork();
	CHECK(d->pid >= 0);
	if (d->pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (fd >= 0)
			dup2(fd, 2);
		execv(moverd, (char **)argv);
		_exit(127);
	}
	hd_track(d);
	for (int i = 0; i < 1000; i++) {
		if (hd_status_answered(d->sock)) {
			hd_wait_peer_port(d, argv);
			return;
		}
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			fprintf(stderr, "moverd exited at start (status %#x); "
				"log %s\n", st, d->log);
			hd_show_log(d->log);
			exit(1);
		}
		usleep(10000);
	}
	CHECK(!"moverd did not come up");
}

/* A moverd of its own in /tmp/fm-TAG-PID (listen: on a free port too). */
static inline void hd_start(struct hd *d, const char *moverd, const char *tag,
			    bool listen, const char *const *extra)
{
	CHECK(snprintf(d->dir, sizeof(d->dir), "/tmp/fm-%s-%d", tag,
		       (int)getpid()) < (int)sizeof(d->dir));
	CHECK(snprintf(d->sock, sizeof(d->sock), "%s/moverd.sock", d->dir) <
	      (int)sizeof(d->sock));
	CHECK(snprintf(d->log, sizeof(d->log), "%s/moverd.log", d->dir) <
	      (int)sizeof(d->log));
	mkdir(d->dir, 0755);
	d->port = listen ? hd_free_port() : 0;
	hd_exec(d, moverd, extra);
}

/* The ASAN_OPTIONS of the test, while hd_preload is in force. */
static char hd_asan_saved[512];
static bool hd_asan_was_set;

/*
 * The daemons started from here to hd_preload_end run with the shim so in
 * LD_PRELOAD (an ASan build accepts it first in the link order).
 */
static inline void hd_preload(const char *so)
{
	const char *old = getenv("ASAN_OPTIONS");
	char asan[sizeof(hd_asan_saved) + 64];

	hd_asan_was_set = old != NULL;
	snprintf(hd_asan_saved, sizeof(hd_asan_saved), "%s", old ? old : "");
	snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0",
		 hd_asan_saved, old ? ":" : "");
	setenv("ASAN_OPTIONS", asan, 1);
	setenv("LD_PRELOAD", so, 1);
}

static inline void hd_preload_end(void)
{
	unsetenv("LD_PRELOAD");
	if (hd_asan_was_set)
		setenv("ASAN_OPTIONS", hd_asan_saved, 1);
	else
		unsetenv("ASAN_OPTIONS");
}

/* The daemon must still be running (no crash, no sanitizer exit). */
static inline void hd_alive(const struct hd *d)
{
	int st;

	if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
		fprintf(stderr, "moverd died (status %#x); its log: %s\n", st,
			d->log);
		exit(1);
	}
}

/* Remove the private directory (unless FM_KEEP is set, for inspection). */
static inline void hd_cleanup(const struct hd *d)
{
	char cmd[sizeof(d->dir) + 16];

	if (getenv("FM_KEEP"))
		return;
	if (snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir) >=
	    (int)sizeof(cmd))
		return;
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", d->dir);
}

/*
 * SIGTERM (an orderly stop); it must exit 0 within 10 s (sanitizers exit
 * non-zero).  Unlike hd_stop, d's directory stays (its state directory, its
 * rings): for hd_restart.
 */
static inline void hd_term(struct hd *d)
{
	int st = 0;

	hd_alive(d);
	kill(d->pid, SIGTERM);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			hd_untrack(d->pid);
			d->pid = 0;
			if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				fprintf(stderr, "moverd exited with status "
					"%#x; log %s\n", st, d->log);
				hd_show_log(d->log);
				exit(1);
			}
			return;
		}
		usleep(10000);
	}
	kill(d->pid, SIGKILL);
	CHECK(!"moverd did not stop within 10 s");
}

/* SIGTERM, then remove its directory: the end of a daemon's life. */
static inline void hd_stop(struct hd *d)
{
	if (d->pid <= 0)
		return;
	hd_term(d);
	hd_cleanup(d);
}

/* Kill without checks (a failure path, or a test of a crash). */
static inline void hd_kill(struct hd *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
		hd_untrack(d->pid);
	}
	d->pid = 0;
}

/* moverctl --socket d->sock ARGS; exit code, stdout+stderr in out. */
static inline int hd_ctl(const struct hd *d, const char *moverctl, char *out,
			 size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static inline int hd_ctl(const struct hd *d, const char *moverctl, char *out,
			 size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = tu_vmoverctl(moverctl, d->sock, out, cap, fmt, ap);
	va_end(ap);
	return rc;
}

/* hd_ctl as uid (and gid) `uid` with no supplementary groups (setpriv),
 * unless uid is 0: as the test itself (like hx_spawn). */
static inline int hd_ctl_as(const struct hd *d, const char *moverctl,
			    uid_t uid, char *out, size_t cap, const char *fmt,
			    ...) __attribute__((format(printf, 6, 7)));

static inline int hd_ctl_as(const struct hd *d, const char *moverctl,
			    uid_t uid, char *out, size_t cap, const char *fmt,
			    ...)
{
	char bin[512];
	va_list ap;
	int rc;

	if (uid)
		CHECK(snprintf(bin, sizeof(bin), "setpriv --reuid %u --regid "
			       "%u --clear-groups %s", (unsigned)uid,
			       (unsigned)uid, moverctl) < (int)sizeof(bin));
	va_start(ap, fmt);
	rc = tu_vmoverctl(uid ? bin : moverctl, d->sock, out, cap, fmt, ap);
	va_end(ap);
	return rc;
}

/* How many fds process pid holds. */
static inline int hd_fds_pid(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	CHECK(dir);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

static inline int hd_fds(const struct hd *d)
{
	return hd_fds_pid(d->pid);
}

/*
 * fds are released a completion later: wait up to ms for pid to hold at
 * most want (one still on its way out when the baseline was taken may have
 * gone since; a leak is one more).  False, and said why, if it holds more.
 */
static inline bool hd_wait_fds_pid(pid_t pid, int want, int ms)
{
	for (int i = 0; i < ms / 10 && hd_fds_pid(pid) > want; i++)
		usleep(10000);
	if (hd_fds_pid(pid) <= want)
		return true;
	fprintf(stderr, "moverd holds %d fds, want at most %d\n",
		hd_fds_pid(pid), want);
	return false;
}

/* hd_wait_fds_pid for d's moverd, up to 5 s; more fds end the test. */
static inline void hd_wait_fds(const struct hd *d, int want)
{
	if (!hd_wait_fds_pid(d->pid, want, 5000))
		exit(1);
}

/* moverd's CPU time so far (user + system), in clock ticks. */
static inline long hd_cpu_ticks(const struct hd *d)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, stt = 0;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)d->pid);
	f = fopen(path, "re");
	CHECK(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	CHECK(p);
	/* fields after the name: state(3) ... utime(14) stime(15) */
	CHECK(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
		     &ut, &stt) == 2);
	return (long)(ut + stt);
}

/* Share of one cpu moverd used over the next `ms` milliseconds (0..1+). */
static inline double hd_cpu_share(const struct hd *d, int ms)
{
	long t0 = hd_cpu_ticks(d), hz = sysconf(_SC_CLK_TCK);

	usleep((useconds_t)ms * 1000);
	return (double)(hd_cpu_ticks(d) - t0) / hz / (ms / 1000.0);
}

/* How many lines of its log contain `needle`. */
/* Lines of d's log with needle, and with also (if not NULL). */
static inline int hd_log_count_with(const struct hd *d, const char *needle,
				    const char *also)
{
	char line[4096];
	FILE *f = fopen(d->log, "re");
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) && (!also || strstr(line, also));
	fclose(f);
	return n;
}

static inline int hd_log_count(const struct hd *d, const char *needle)
{
	return hd_log_count_with(d, needle, NULL);
}

/* ---- a hostile peer ------------------------------------------------------ */

/* A TCP connection to 127.0.0.1:port (blocking). */
static inline int hp_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	CHECK(fd >= 0);
	CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* Send all of buf; false if the connection is gone. */
static inline bool hp_send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

/* A frame header (and no body: send the body with hp_send_all). */
static inline bool hp_send_hdr(int fd, enum wire_type type, uint32_t flow_id,
			       uint32_t len, uint64_t pos, uint64_t aux)
{
	uint8_t h[WIRE_HDR];

	wire_put(h, type, flow_id, len, pos, aux);
	return hp_send_all(fd, h, sizeof(h));
}

static inline bool hp_send_msg(int fd, Flowmover__PeerMsg *msg)
{
	size_t len = protobuf_c_message_get_packed_size(&msg->base);
	uint8_t *buf = malloc(len ? len : 1);
	bool ok;

	CHECK(buf);
	protobuf_c_message_pack(&msg->base, buf);
	ok = hp_send_hdr(fd, WIRE_CTRL, 0, (uint32_t)len, 0, 0) &&
	     hp_send_all(fd, buf, len);
	free(buf);
	return ok;
}

/* A hello without a key, saying instance (0: none, an older moverd). */
static inline bool hp_hello_as(int fd, const char *node, uint64_t instance)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;

	hello.version = WIRE_VERSION;
	hello.node = (char *)node;
	hello.instance = instance;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
	msg.hello = &hello;
	return hp_send_msg(fd, &msg);
}

static inline bool hp_hello(int fd, const char *node)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;

	hello.version = WIRE_VERSION;
	hello.node = (char *)node;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
	msg.hello = &hello;
	return hp_send_msg(fd, &msg);
}

struct hp_open {
	const char *name;
	uint32_t flow_id;
	uint64_t ring_size;
	uint32_t max_record;
	uint64_t seal_key;
	uint64_t start;
};

/* Open o; after_cut: saying the sender cut this host (a fan-out rejoin). */
static inline bool hp_open_cut(int fd, const struct hp_open *o, bool after_cut)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowOpen op = FLOWMOVER__PEER_FLOW_OPEN__INIT;

	op.name = (char *)o->name;
	op.flow_id = o->flow_id;
	op.ring_size = o->ring_size;
	op.max_record = o->max_record;
	op.seal_key = o->seal_key;
	op.start = o->start;
	op.after_cut = after_cut;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_OPEN;
	msg.open = &op;
	return hp_send_msg(fd, &msg);
}

static inline bool hp_open(int fd, const struct hp_open *o)
{
	return hp_open_cut(fd, o, false);
}

static inline bool hp_close_flow(int fd, const char *name)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowClose cl = FLOWMOVER__PEER_FLOW_CLOSE__INIT;

	cl.name = (char *)name;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_CLOSE;
	msg.close = &cl;
	return hp_send_msg(fd, &msg);
}

/*
 * Read one frame within timeout_ms: its header in *h and up to cap body
 * bytes in body (the rest is dropped).  1 = a frame, 0 = timeout,
 * -1 = the connection closed.
 */
static inline int hp_read_frame(int fd, struct wire_hdr *h, void *body,
				size_t cap, int timeout_ms)
{
	uint8_t hb[WIRE_HDR], sink[4096];
	size_t have = 0, need;

	while (have < WIRE_HDR) {
		struct pollfd pfd = { fd, POLLIN, 0 };
		ssize_t n;

		if (poll(&pfd, 1, timeout_ms) <= 0)
			return have ? -1 : 0;
		n = recv(fd, hb + have, WIRE_HDR - have, 0);
		if (n <= 0)
			return -1;
		have += (size_t)n;
	}
	wire_get(hb, h);
	for (need = h->len, have = 0; have < need;) {
		size_t want = need - have;
		void *dst = have < cap ? (void *)((char *)body + have) :
					 (void *)sink;
		ssize_t n;

		if (have < cap && want > cap - have)
			want = cap - have;
		if (have >= cap && want > sizeof(sink))
			want = sizeof(sink);
		n = recv(fd, dst, want, MSG_WAITALL);
		if (n <= 0)
			return -1;
		have += (size_t)n;
	}
	return 1;
}

static inline bool hp_is_opened(const Flowmover__PeerMsg *m, uint32_t id)
{
	return m->body_case == FLOWMOVER__PEER_MSG__BODY_OPENED &&
	       m->opened->flow_id == id;
}

static inline bool hp_is_hello(const Flowmover__PeerMsg *m, uint32_t unused)
{
	(void)unused;
	return m->body_case == FLOWMOVER__PEER_MSG__BODY_HELLO;
}

/*
 * Wait up to timeout_ms for a control message m with want(m, arg): it
 * (free with flowmover__peer_msg__free_unpacked), or NULL (timeout, or
 * the connection closed).  Other frames are skipped.
 */
static inline Flowmover__PeerMsg *hp_wait_msg(int fd, int timeout_ms,
	bool (*want)(const Flowmover__PeerMsg *, uint32_t), uint32_t arg)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	static uint8_t body[WIRE_MAX_CTRL];
	struct wire_hdr h;

	while (tu_now_ns() < until) {
		Flowmover__PeerMsg *m;
		int rc = hp_read_frame(fd, &h, body, sizeof(body), 100);

		if (rc < 0)
			return NULL;
		if (rc == 0 || h.type != WIRE_CTRL || h.len > sizeof(body))
			continue;
		m = flowmover__peer_msg__unpack(NULL, h.len, body);
		if (m && want(m, arg))
			return m;
		if (m)
			flowmover__peer_msg__free_unpacked(m, NULL);
	}
	return NULL;
}

/*
 * Wait up to timeout_ms for moverd's answer to an open of flow_id: 0 and
 * *opened filled (caller frees with flowmover__peer_flow_opened__free_
 * unpacked), or -1 (timeout or closed).  Other frames are skipped.
 */
static inline int hp_wait_opened(int fd, uint32_t flow_id, int timeout_ms,
				 Flowmover__PeerFlowOpened **opened)
{
	Flowmover__PeerMsg *m = hp_wait_msg(fd, timeout_ms, hp_is_opened,
					    flow_id);

	if (!m)
		return -1;
	*opened = m->opened;
	m->opened = NULL;
	m->body_case = FLOWMOVER__PEER_MSG__BODY__NOT_SET;
	flowmover__peer_msg__free_unpacked(m, NULL);
	return 0;
}

/* Open o on fd and wait (5 s) for the answer: its error (0: opened), its
 * message in msg. */
static inline int hp_open_answer(int fd, const struct hp_open *o, char *msg,
				 size_t cap)
{
	Flowmover__PeerFlowOpened *op = NULL;
	int err;

	CHECK(hp_open(fd, o));
	CHECK(hp_wait_opened(fd, o->flow_id, 5000, &op) == 0);
	err = op->error;
	snprintf(msg, cap, "%s", op->message ? op->message : "");
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	return err;
}

/* ---- moverctl JSON ------------------------------------------------------- */

/* The value of "key" in moverctl's JSON (first occurrence), as text. */
static inline bool hj_get(const char *json, const char *key, char *val,
			  size_t cap)
{
	char pat[80];
	const char *p;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	if (!p)
		return false;
	p += strlen(pat);
	while (*p == ' ')
		p++;
	if (*p == '"')
		p++;
	while (*p && *p != '"' && *p != ',' && *p != '}' && *p != '\n' &&
	       n + 1 < cap)
		val[n++] = *p++;
	val[n] = 0;
	return true;
}

/* ---- raw control requests: one request, its answer ------------------------ */

static inline int hc_call(int sock, Flowmover__Request *req, int *fd)
{
	Flowmover__Response *resp = NULL;
	int rc = ctl_call(sock, req, &resp, fd, 5000);

	ctl_response_free(resp);
	return rc;
}

/* A status request: 0 and the answer in *resp (ctl_response_free it; it
 * may be set on an error too), or a negative errno. */
static inline int hc_status(int sock, Flowmover__Response **resp)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__GetStatus gs = FLOWMOVER__GET_STATUS__INIT;

	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &gs;
	return ctl_call(sock, &req, resp, NULL, 5000);
}

/* Create flow name (ring bytes, max_record 0: the daemon's default). */
static inline int hc_create(int sock, const char *name, uint64_t ring,
			    uint32_t max_record)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec spec = FLOWMOVER__FLOW_SPEC__INIT;

	spec.name = (char *)name;
	spec.ring_size = ring;
	spec.max_record = max_record;
	cr.spec = &spec;
	req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	req.create = &cr;
	return hc_call(sock, &req, NULL);
}

static inline int hc_destroy(int sock, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DestroyFlow de = FLOWMOVER__DESTROY_FLOW__INIT;

	de.name = (char *)name;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESTROY;
	req.destroy = &de;
	return hc_call(sock, &req, NULL);
}

/* Attach to name as role (owner >= 0: only if that uid owns it): 0 and
 * the ring fd in *fd, or a negative errno. */
static inline int hc_attach_owned(int sock, const char *name,
				  Flowmover__Role role, int64_t owner, int *fd)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;

	at.name = (char *)name;
	at.role = role;
	at.check_owner = owner >= 0;
	at.owner_uid = owner >= 0 ? (uint32_t)owner : 0;
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	return hc_call(sock, &req, fd);
}

static inline int hc_attach(int sock, const char *name, Flowmover__Role role,
			    int *fd)
{
	return hc_attach_owned(sock, name, role, -1, fd);
}

/* The ring fd of flow name, the way a client gets it: attached as role on
 * a new control connection (*sock, kept open while attached). */
static inline int hd_attach_fd(const struct hd *d, const char *name,
			       Flowmover__Role role, int *sock)
{
	int fd = -1;

	*sock = ctl_connect(d->sock);
	CHECK(*sock >= 0);
	CHECK_RC(hc_attach(*sock, name, role, &fd), 0);
	CHECK(fd >= 0);
	return fd;
}

/* ---- a flow's state ------------------------------------------------------ */

/* `moverctl flow show NAME --json` on d: true if it answered (in out). */
static inline bool hd_flow_json(const struct hd *d, const char *moverctl,
				const char *name, char *out, size_t cap)
{
	return hd_ctl(d, moverctl, out, cap, "flow show %s --json", name) == 0;
}

/* Wait up to timeout_ms for flow NAME on d to be in state want; either
 * way its state_reason in reason (if not NULL). */
static inline bool hd_wait_state(const struct hd *d, const char *moverctl,
				 const char *name, const char *want,
				 int timeout_ms, char *reason, size_t cap)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	char out[4096], state[32] = "";
	bool ok = false;

	do {
		hd_alive(d);
		ok = hd_flow_json(d, moverctl, name, out, sizeof(out)) &&
		     hj_get(out, "state", state, sizeof(state)) &&
		     !strcmp(state, want);
		if (!ok)
			usleep(50000);
	} while (!ok && tu_now_ns() < until);
	if (!ok)
		fprintf(stderr, "flow %s: state '%s', want '%s'\n", name, state,
			want);
	if (reason && !hj_get(out, "state_reason", reason, cap) && cap)
		reason[0] = 0;
	return ok;
}

static inline uint64_t hj_u64(const char *json, const char *key);

/* The sum of the counts keys ("consumers", "producers+consumers") in json. */
static inline uint64_t hj_sum(const char *json, const char *keys)
{
	uint64_t sum = 0;
	char key[64];

	while (*keys) {
		size_t n = strcspn(keys, "+");

		snprintf(key, sizeof(key), "%.*s", (int)n, keys);
		sum += hj_u64(json, key);
		keys += n + (keys[n] == '+');
	}
	return sum;
}

/* Wait up to timeout_ms for the count keys (as hj_sum, from one answer) of
 * flow NAME on d to be want. */
static inline bool hd_wait_count(const struct hd *d, const char *moverctl,
				 const char *name, const char *keys,
				 uint64_t want, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	char out[4096];
	bool answered;
	uint64_t n = 0;

	do {
		hd_alive(d);
		answered = hd_flow_json(d, moverctl, name, out, sizeof(out));
		if (answered && (n = hj_sum(out, keys)) == want)
			return true;
		usleep(10000);
	} while (tu_now_ns() < until);
	if (!answered)
		fprintf(stderr, "flow %s: no answer to flow show\n", name);
	fprintf(stderr, "flow %s: %s is %llu, want %llu\n", name, keys,
		(unsigned long long)n, (unsigned long long)want);
	return false;
}

/* ---- cases --------------------------------------------------------------- */

struct hcase {
	int n;                 /* the finding's number in the issue */
	void (*fn)(void);
	const char *what;
};

/* Is case n selected by env (a list "1,3,7"; unset or empty: all)? */
static inline bool hc_wanted(const char *env, int n)
{
	const char *s = getenv(env);
	char buf[256], *tok, *save = NULL;

	if (!s || !*s)
		return true;
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (atoi(tok) == n)
			return true;
	return false;
}

/* Run the selected cases in order, each timed; a failed CHECK exits
 * non-zero. */
static inline int hc_run(const struct hcase *cases, size_t n, const char *env)
{
	signal(SIGPIPE, SIG_IGN);
	for (size_t i = 0; i < n; i++) {
		if (!hc_wanted(env, cases[i].n))
			continue;
		uint64_t t0 = tu_now_ns();

		printf("case %d: %s\n", cases[i].n, cases[i].what);
		fflush(stdout);
		cases[i].fn();
		/* how long, so that a suite's time can be planned (CI) */
		printf("case %d: ok (%.1f s)\n", cases[i].n,
		       (double)(tu_now_ns() - t0) / 1e9);
		fflush(stdout);
	}
	return 0;
}

/* ---- more of the same (added for issue 14's cases) ----------------------- */

#include <grp.h>
#include <sys/prctl.h>

/*
 * A killed moverd's io_uring is torn down after the process is gone, and
 * an accept still in flight keeps its listening socket open until then:
 * wait (up to 5 s) until the port can be bound again (as moverd binds it).
 */
static inline void hd_wait_port_free(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1;

	for (int i = 0; i < 500; i++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		bool ok;

		CHECK(fd >= 0);
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
		     listen(fd, 1) == 0;
		close(fd);
		if (ok)
			return;
		usleep(10000);
	}
	CHECK(!"the port of the killed moverd stays in use");
}

/*
 * Start moverd again in d's directory, on d's socket, log and port (after
 * hd_kill: a restart keeps the state directory and with it the rings of
 * flows between hosts).  EXTRA as for hd_start.
 */
static inline void hd_restart(struct hd *d, const char *moverd,
			      const char *const *extra)
{
	if (d->port)
		hd_wait_port_free(d->port);
	hd_exec(d, moverd, extra);
}

/* The number after "key:" in /proc/PID/status of moverd (its main
 * thread's, for the per-thread lines). */
static inline long hd_status_num(const struct hd *d, const char *key)
{
	char path[64], line[256];
	size_t n = strlen(key);
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
	f = fopen(path, "re");
	CHECK(f);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	CHECK(v >= 0);
	return v;
}

/* moverd's resident set (VmRSS), in KiB. */
static inline long hd_rss_kb(const struct hd *d)
{
	return hd_status_num(d, "VmRSS");
}

/*
 * Fork a client of d: in the child (0 returned) FLOWMOVER_SOCKET=d->sock,
 * uid (and gid) `uid` with no supplementary groups unless uid is 0, and
 * it dies with the test; the parent gets the child's pid.
 */
static inline pid_t hx_fork_as(const struct hd *d, uid_t uid)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid)
		return pid;
	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	if (uid && (setgroups(0, NULL) || setresgid(uid, uid, uid) ||
		    setresuid(uid, uid, uid))) {
		perror("drop to the second user");
		_exit(126);
	}
	/* after the uid change, which clears it */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	return 0;
}

/* Run a client program (flowcheck, a hostile client) against d, as
 * hx_fork_as's child.  argv[0] is the program. */
static inline pid_t hx_spawn(const struct hd *d, uid_t uid,
			     const char *const *argv)
{
	pid_t pid = hx_fork_as(d, uid);

	if (pid)
		return pid;
	execv(argv[0], (char **)argv);
	_exit(127);
}

/*
 * Wait up to timeout_ms for pid: its exit code (128 + signal if killed).
 * Still running then: it is killed and -1 returned.
 */
static inline int hx_wait(pid_t pid, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int st;

	do {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) :
					       128 + WTERMSIG(st);
		usleep(10000);
	} while (tu_now_ns() < until);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* hj_get as an unsigned number (0 if the key is missing). */
static inline uint64_t hj_u64(const char *json, const char *key)
{
	char val[32];

	return hj_get(json, key, val, sizeof(val)) ?
		       strtoull(val, NULL, 10) : 0;
}

/*
 * Send an OPEN and wait for its answer, again while moverd answers -EAGAIN
 * (a receive of another connection into the flow is still in flight), for
 * up to timeout_ms.  The last answer's error (0 = opened), or INT32_MIN when
 * no answer came.  message (cap bytes) gets its text.
 */
static inline int hp_open_retry(int fd, const struct hp_open *o,
				int timeout_ms, char *message, size_t cap)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int err = INT32_MIN;

	do {
		Flowmover__PeerFlowOpened *op = NULL;

		if (!hp_open(fd, o) ||
		    hp_wait_opened(fd, o->flow_id, 2000, &op))
			return err;
		err = op->error;
		if (message && cap)
			snprintf(message, cap, "%s",
				 op->message ? op->message : "");
		flowmover__peer_flow_opened__free_unpacked(op, NULL);
		if (err != -EAGAIN)
			return err;
		usleep(100000);
	} while (tu_now_ns() < until);
	return err;
}

/* ---- more of the same (added for issue 9's acl cases) -------------------- */

/*
 * A TCP connection to 127.0.0.1:port from the local address src (e.g.
 * "127.0.0.2"): to moverd, a peer on another host than one that connects
 * from 127.0.0.1.
 */
static inline int hp_connect_from(int port, const char *src)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in s = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	CHECK(fd >= 0);
	CHECK(inet_pton(AF_INET, src, &s.sin_addr) == 1);
	CHECK(bind(fd, (struct sockaddr *)&s, sizeof(s)) == 0);
	CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* ---- the authenticated hello (issue 9, moverd/auth.h) -------------------- */

/* What a peer's hello carried (bytes fields cut to their buffers). */
struct hp_hello_in {
	uint32_t version;
	uint64_t instance;
	char node[128];
	char key_id[64];
	char dialed[64];
	uint8_t nonce[64];
	size_t nonce_len;
	uint8_t proof[64];
	size_t proof_len;
};

/* The address connected socket fd reached, as a hello's `dialed` says it
 * ("IP:PORT"; IPv4 only, as every fake peer here connects). */
static inline const char *hp_dialed(int fd)
{
	static char name[64];
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	char host[INET_ADDRSTRLEN];

	CHECK(getpeername(fd, (struct sockaddr *)&a, &len) == 0);
	CHECK(a.sin_family == AF_INET);
	CHECK(inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host)));
	snprintf(name, sizeof(name), "%s:%u", host, (unsigned)ntohs(a.sin_port));
	return name;
}

/* A hello with a nonce and a key id (either may be empty: NULL / 0); with
 * a key id it says the address it dialed, as moverd's does. */
static inline bool hp_hello_auth(int fd, const char *node, const uint8_t *nonce,
				 size_t nonce_len, const char *key_id)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;

	if (key_id && *key_id)
		hello.dialed = (char *)hp_dialed(fd);
	hello.version = WIRE_VERSION;
	hello.node = (char *)node;
	hello.nonce.data = (uint8_t *)nonce;
	hello.nonce.len = nonce_len;
	hello.key_id = (char *)(key_id ? key_id : "");
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
	msg.hello = &hello;
	return hp_send_msg(fd, &msg);
}

/* The initiator's proof (PeerAuth). */
static inline bool hp_auth(int fd, const uint8_t *proof, size_t len)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerAuth auth = FLOWMOVER__PEER_AUTH__INIT;

	auth.proof.data = (uint8_t *)proof;
	auth.proof.len = len;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_AUTH;
	msg.auth = &auth;
	return hp_send_msg(fd, &msg);
}

static inline void hp_copy_bytes(uint8_t *dst, size_t cap, size_t *len,
				 ProtobufCBinaryData b)
{
	*len = b.len < cap ? b.len : cap;
	if (*len)
		memcpy(dst, b.data, *len);
}

/*
 * Wait up to timeout_ms for the responder's hello: 0 and *in filled, or -1
 * (timeout, or the connection closed first).  Other frames are skipped.
 */
static inline int hp_read_hello(int fd, int timeout_ms, struct hp_hello_in *in)
{
	Flowmover__PeerMsg *m = hp_wait_msg(fd, timeout_ms, hp_is_hello, 0);
	Flowmover__PeerHello *hl;

	if (!m)
		return -1;
	hl = m->hello;
	memset(in, 0, sizeof(*in));
	in->version = hl->version;
	in->instance = hl->instance;
	snprintf(in->node, sizeof(in->node), "%s", hl->node ? hl->node : "");
	snprintf(in->key_id, sizeof(in->key_id), "%s",
		 hl->key_id ? hl->key_id : "");
	snprintf(in->dialed, sizeof(in->dialed), "%s",
		 hl->dialed ? hl->dialed : "");
	hp_copy_bytes(in->nonce, sizeof(in->nonce), &in->nonce_len, hl->nonce);
	hp_copy_bytes(in->proof, sizeof(in->proof), &in->proof_len, hl->proof);
	flowmover__peer_msg__free_unpacked(m, NULL);
	return 0;
}

/* Does the peer close the connection within timeout_ms (frames it sends
 * meanwhile are read and dropped)? */
static inline bool hp_closed_within(int fd, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	static uint8_t body[WIRE_MAX_CTRL];
	struct wire_hdr h;

	while (tu_now_ns() < until)
		if (hp_read_frame(fd, &h, body, sizeof(body), 100) < 0)
			return true;
	return false;
}

/* A responder's hello: nonce, key id and a proof (any of them may be
 * empty or wrong: a hostile responder), echoing dialed (NULL: none). */
static inline bool hp_hello_proof(int fd, const char *node,
				  const uint8_t *nonce, size_t nonce_len,
				  const char *key_id, const uint8_t *proof,
				  size_t proof_len, const char *dialed)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;

	hello.dialed = (char *)dialed;

	hello.version = WIRE_VERSION;
	hello.node = (char *)node;
	hello.nonce.data = (uint8_t *)nonce;
	hello.nonce.len = nonce_len;
	hello.key_id = (char *)(key_id ? key_id : "");
	hello.proof.data = (uint8_t *)proof;
	hello.proof.len = proof_len;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
	msg.hello = &hello;
	return hp_send_msg(fd, &msg);
}

/* A listening socket on 127.0.0.1 (a hostile responder); its port in *port. */
static inline int hp_listen(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(listen(fd, 8) == 0);
	CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* Accept one connection within timeout_ms: its fd, or -1. */
static inline int hp_accept(int lfd, int timeout_ms)
{
	struct pollfd pfd = { lfd, POLLIN, 0 };

	if (poll(&pfd, 1, timeout_ms) <= 0)
		return -1;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* ---- more of the same (added for issue 15's cases) ----------------------- */

/* Is pid (our child) still running?  Not reaped: hx_wait still can. */
static inline bool hx_running(pid_t pid)
{
	siginfo_t si = { 0 };

	CHECK(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0);
	return si.si_pid == 0;
}

/*
 * Wait until d's moverd answers a request (up to 5 s).  After hd_kill and
 * hd_restart, a connect alone can reach the killed moverd's socket, still
 * accepting in its io_uring until that is torn down (reset, nobody
 * answers), or find the path between the new moverd's unlink and bind.
 */
static inline void hd_answers(const struct hd *d)
{
	for (int i = 0; i < 500; i++) {
		if (hd_status_answered(d->sock))
			return;
		usleep(10000);
	}
	CHECK(!"the restarted moverd does not answer");
}

#endif

/*
 * Fork a client of d: in the parent the child's pid, in the child 0, with
 * FLOWMOVER_SOCKET pointing at d and the child killed when the test dies.
 */
static inline pid_t hd_fork_client(const struct hd *d)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid)
		return pid;
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	return 0;
}
