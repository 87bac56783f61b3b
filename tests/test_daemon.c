/*
 * moverd end to end: a real daemon on a private socket, driven by moverctl
 * and by libflowshm clients in other processes.
 *
 *   usage: test_daemon MOVERD MOVERCTL
 *
 * Covers: status; refusing a second daemon on the same socket or state
 * directory; flow create/list/show/destroy with moverctl (human and
 * --json); producers and a consumer attached by name moving records;
 * attach counts following client death; -ENOENT, -EBUSY (a 17th
 * consumer), -ECONNREFUSED, -EACCES (another uid); bad frames
 * (zero, oversized, garbage, unknown fields, wrong wire types, truncated,
 * disconnect mid-request) and many clients at once, after which the daemon
 * still serves and holds no extra file descriptors; destroy while attached;
 * SIGTERM shutting down cleanly; its flows stay (issue 15: an attached
 * producer still sends, the next start re-adopts them, see test_life);
 * a daemonized moverd given a relative --socket binds it where it said.
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <stdarg.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

static const char *moverd_bin, *moverctl_bin;
static char sock_path[108];
static pid_t daemon_pid;

/* ---- helpers ------------------------------------------------------------ */

static pid_t start_daemon(const char *const *extra, int *status_out)
{
	const char *argv[32] = { moverd_bin, "--foreground", "--socket",
				 sock_path, "--socket-mode", "0666",
				 "--log-level", "debug" };
	int n = 8;
	pid_t pid;

	for (; extra && *extra; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		execv(moverd_bin, (char **)argv);
		_exit(127);
	}
	/* ready when the socket accepts, or it exited (status_out) */
	for (int i = 0; i < 500; i++) {
		int fd = ctl_connect(sock_path), st;

		if (fd >= 0) {
			close(fd);
			return pid;
		}
		if (waitpid(pid, &st, WNOHANG) == pid) {
			CHECK(status_out);
			*status_out = st;
			return 0;
		}
		usleep(10000);
	}
	CHECK(!"moverd did not come up");
	return 0;
}

/* Run moverctl with the test socket; returns its exit code, output in out. */
static int ctl(char *out, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int ctl(char *out, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = tu_vmoverctl(moverctl_bin, sock_path, out, cap, fmt, ap);
	va_end(ap);
	return rc;
}

/* The fd count once it stops changing: a destroyed flow's ring fd may still
 * be on its way out (released when its last reference's completion is
 * reaped), and must not be counted in a baseline. */
static int settled_fds(pid_t pid)
{
	int last = hd_fds_pid(pid), same = 0;

	for (int i = 0; i < 200 && same < 5; i++) {
		int n;

		usleep(10000);
		n = hd_fds_pid(pid);
		same = n == last ? same + 1 : 0;
		last = n;
	}
	return last;
}

static flowshm_t *attach(const char *name, enum flowshm_role role, int want)
{
	flowshm_t *f = NULL;

	CHECK_RC(flowshm_attach(name, role, NULL, &f), want);
	return f;
}

static int raw_connect(void)
{
	int fd = ctl_connect(sock_path);

	CHECK(fd >= 0);
	return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
	CHECK(send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
}

static void send_frame(int fd, const void *body, uint32_t len)
{
	uint8_t hdr[4] = { (uint8_t)len, (uint8_t)(len >> 8),
			   (uint8_t)(len >> 16), (uint8_t)(len >> 24) };

	send_all(fd, hdr, 4);
	if (len)
		send_all(fd, body, len);
}

/* Receive one response; returns its error code (0 if not an error). */
static int recv_response(int fd, Flowmover__Response **out)
{
	static uint8_t buf[CTL_FRAME_BUF];
	Flowmover__Response *resp = NULL;
	size_t len;
	int rc = ctl_recv_frame(fd, buf, sizeof(buf), &len, NULL, 5000);

	CHECK_RC(rc, 0);
	CHECK_RC(ctl_response_decode(buf, len, &resp, NULL, 0), 0);
	rc = resp->body_case == FLOWMOVER__RESPONSE__BODY_ERROR ?
		     resp->error->code : 0;
	if (out)
		*out = resp;
	else
		ctl_response_free(resp);
	return rc;
}

static bool peer_closed(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char b;

	return poll(&p, 1, 5000) == 1 && recv(fd, &b, 1, 0) == 0;
}

static void status_request(int fd)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__GetStatus gs = FLOWMOVER__GET_STATUS__INIT;

	req.id = 42;
	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &gs;
	CHECK_RC(ctl_send_msg(fd, &req.base, -1), 0);
}

/* ---- tests -------------------------------------------------------------- */

/* The pid in moverd's lock file SOCK.lock (0: none yet). */
static pid_t lock_pid(const char *sock)
{
	char path[300], buf[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), "%s.lock", sock);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return (pid_t)atoi(buf);
}

static void test_status_and_single_instance(void)
{
	char out[8192];
	int st = 0;

	CHECK(ctl(out, sizeof(out), "status") == 0);
	CHECK(strstr(out, "version"));
	CHECK(ctl(out, sizeof(out), "--json status") == 0);
	CHECK(strstr(out, "\"pid\""));
	/* a second daemon on the same socket refuses to start */
	{
		char cmd[512];
		snprintf(cmd, sizeof(cmd), "timeout 10 %s --foreground --socket "
			 "%s 2>&1 | grep -q 'already running'", moverd_bin,
			 sock_path);
		CHECK(system(cmd) == 0);
	}
	CHECK(ctl(out, sizeof(out), "status") == 0); /* first one unharmed */
	/* a second socket beside ours defaults to the same state directory:
	 * refused (it would re-adopt our flows and unlink our rings), and
	 * started with a --state-dir of its own */
	{
		char cmd[1024], sock2[128], dir[128];
		pid_t pid2;

		CHECK(ctl(out, sizeof(out), "flow create sd") == 0);
		snprintf(sock2, sizeof(sock2), "%s.2", sock_path);
		snprintf(cmd, sizeof(cmd), "timeout 10 %s --foreground --socket "
			 "%s >%s.log 2>&1; test $? = 1 && grep 'already running' "
			 "%s.log | grep -q 'rings/moverd.lock): one moverd per "
			 "state directory'", moverd_bin, sock2, sock2, sock2);
		CHECK(system(cmd) == 0);
		CHECK(ctl(out, sizeof(out), "flow show sd") == 0);
		snprintf(dir, sizeof(dir), "%s.2-rings", sock_path);
		snprintf(cmd, sizeof(cmd), "%s --socket %s --state-dir %s "
			 "--socket-mode 0600", moverd_bin, sock2, dir);
		CHECK(system(cmd) == 0); /* daemonized: 0 once ready */
		pid2 = lock_pid(sock2);
		CHECK(pid2 > 0);
		snprintf(cmd, sizeof(cmd), "%s --socket %s flow list | "
			 "grep -q sd", moverctl_bin, sock2);
		st = system(cmd);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1); /* not ours */
		CHECK(kill(pid2, SIGTERM) == 0);
		for (int i = 0; i < 500 && kill(pid2, 0) == 0; i++)
			usleep(10000);
		CHECK(kill(pid2, 0) == -1);
		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0);
		CHECK(ctl(out, sizeof(out), "flow destroy sd") == 0);
	}
	/* a state directory others can list is said so at the start; one
	 * moverd made itself (0700), or one others can only search (0711),
	 * is not */
	{
		static const struct { mode_t mode; const char *who; } dirs[] = {
			{ 0, NULL }, /* moverd makes it */
			{ 0755, "every user" },
			{ 0750, "its group" }, /* (members: no quote in sh) */
			{ 0711, NULL },
		};

		for (unsigned i = 0; i < 4; i++) {
			char cmd[1024], sock3[128], dir[128], said[256];
			int n;

			snprintf(sock3, sizeof(sock3), "%s.3", sock_path);
			snprintf(dir, sizeof(dir), "%s.3-rings", sock_path);
			if (dirs[i].mode) {
				CHECK(mkdir(dir, 0700) == 0);
				CHECK(chmod(dir, dirs[i].mode) == 0);
			}
			/* the warning, or (none wanted) any such warning */
			n = snprintf(said, sizeof(said), "state directory %s "
				     "has mode", dir);
			if (dirs[i].who)
				snprintf(said + n, sizeof(said) - (size_t)n,
					 " %04o: %s", (unsigned)dirs[i].mode,
					 dirs[i].who);
			snprintf(cmd, sizeof(cmd), "timeout 2 %s --foreground "
				 "--socket %s --state-dir %s >%s.log 2>&1; "
				 "test $? = 124 && grep -c '%s' %s.log | grep "
				 "-qx %d", moverd_bin, sock3, dir, sock3, said,
				 sock3, dirs[i].who != NULL);
			CHECK(system(cmd) == 0);
			snprintf(cmd, sizeof(cmd), "rm -rf %s %s.log", dir,
				 sock3);
			CHECK(system(cmd) == 0);
		}
	}
	/* no daemon there */
	{
		char cmd[512];
		snprintf(cmd, sizeof(cmd), "%s --socket %s.none status "
			 ">/dev/null 2>&1", moverctl_bin, sock_path);
		st = system(cmd);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 3);
	}
}

static void test_moverctl_flows(void)
{
	char out[16384];

	CHECK(ctl(out, sizeof(out), "flow create f1 --ring-size 1M "
		  "--max-record 4K") == 0);
	CHECK(ctl(out, sizeof(out), "flow create f1") == 1);
	CHECK(strstr(out, "already exists"));
	CHECK(ctl(out, sizeof(out), "flow create 'bad name'") != 0);
	CHECK(ctl(out, sizeof(out), "flow create f9 --ring-size 3000") != 0);
	CHECK(ctl(out, sizeof(out), "flow create f9 --ring-size 12Q") == 2);
	CHECK(ctl(out, sizeof(out), "flow list") == 0);
	CHECK(strstr(out, "f1"));
	CHECK(ctl(out, sizeof(out), "flow show f1 --json") == 0);
	CHECK(strstr(out, "1048576") && strstr(out, "4096"));
	CHECK(ctl(out, sizeof(out), "flow show nope") == 1);
	CHECK(strstr(out, "no such flow"));
	CHECK(ctl(out, sizeof(out), "--json flow list") == 0);
	CHECK(out[0] == '[' && strstr(out, "\"f1\""));
}

static void produce(const char *flow, uint32_t id, uint64_t n)
{
	flowshm_t *p = attach(flow, FLOWSHM_PRODUCER, 0);
	unsigned char buf[4096];

	for (uint64_t s = 0; s < n; s++) {
		size_t len = tu_rec_len(id, s, 16, 256);
		tu_fill(buf, id, s, len);
		CHECK_RC(flowshm_send(p, buf, len, 10000000000ll), 0);
	}
	flowshm_detach(p);
}

static void test_attach_and_move(void)
{
	const uint32_t producers = 3;
	uint64_t n = (uint64_t)tu_env_long("FM_DAEMON_RECORDS", 400000);
	uint64_t next[3] = { 0 }, total = 0, t0 = tu_now_ns();
	flowshm_t *c = attach("f1", FLOWSHM_CONSUMER, 0);
	unsigned char buf[4096];
	pid_t pids[3];
	char out[8192];

	{
		/* ring format 2: up to FR_MAX_SUBS consumers (subscribers),
		 * then -EBUSY; detached, they hold nothing back */
		flowshm_t *more[FR_MAX_SUBS];

		for (unsigned i = 1; i < FR_MAX_SUBS; i++)
			more[i] = attach("f1", FLOWSHM_CONSUMER, 0);
		attach("f1", FLOWSHM_CONSUMER, -EBUSY);
		CHECK(strstr(flowshm_attach_error(), "all 16 subscriber slots"));
		for (unsigned i = 1; i < FR_MAX_SUBS; i++)
			flowshm_detach(more[i]);
	}
	attach("nope", FLOWSHM_PRODUCER, -ENOENT);
	for (uint32_t i = 0; i < producers; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0) {
			produce("f1", i, n);
			_exit(0);
		}
	}
	while (total < n * producers) {
		size_t len;
		uint32_t id;
		uint64_t seq;

		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10000000000ll), 0);
		CHECK(tu_verify(buf, len, &id, &seq));
		CHECK(id < producers && seq == next[id]);
		next[id]++;
		total++;
	}
	for (uint32_t i = 0; i < producers; i++) {
		int st;
		CHECK(waitpid(pids[i], &st, 0) == pids[i]);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	printf("# %llu records from %u attached producers in %.2f s\n",
	       (unsigned long long)total, producers, (tu_now_ns() - t0) / 1e9);
	/* the producers are gone: moverd noticed (their sockets closed) */
	for (int i = 0; i < 100; i++) {
		ctl(out, sizeof(out), "flow show f1 --json");
		if (strstr(out, "\"producers\": 0"))
			break;
		usleep(10000);
	}
	CHECK(strstr(out, "\"producers\": 0") && strstr(out, "\"consumers\": 1"));
	flowshm_detach(c);
	/* a killed consumer is noticed too */
	{
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			attach("f1", FLOWSHM_CONSUMER, 0);
			pause();
		}
		for (int i = 0; i < 200; i++) {
			ctl(out, sizeof(out), "flow show f1 --json");
			if (strstr(out, "\"consumers\": 1"))
				break;
			usleep(10000);
		}
		CHECK(strstr(out, "\"consumers\": 1"));
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		c = NULL;
		for (int i = 0; i < 200 && !c; i++) {
			if (flowshm_attach("f1", FLOWSHM_CONSUMER, NULL, &c))
				usleep(10000);
		}
		CHECK(c);
		flowshm_detach(c);
	}
}

static void test_permissions(void)
{
	char out[4096];
	pid_t pid;
	int st;

	if (geteuid() != 0) {
		printf("# permission test needs root: skipped\n");
		return;
	}
	CHECK(ctl(out, sizeof(out), "flow create shared --allow-uid 65534") == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *f = NULL;
		if (setgid(65534) || setuid(65534))
			_exit(10);
		if (flowshm_attach("f1", FLOWSHM_PRODUCER, NULL, &f) != -EACCES)
			_exit(11);
		if (flowshm_attach("shared", FLOWSHM_PRODUCER, NULL, &f) != 0)
			_exit(12);
		flowshm_detach(f);
		/* and only the owner (or root) may destroy it */
		if (ctl(out, sizeof(out), "flow destroy shared") != 4)
			_exit(13);
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "permission child: status %d\n", st);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(ctl(out, sizeof(out), "flow destroy shared") == 0);
}

static void test_bad_frames(void)
{
	int base = settled_fds(daemon_pid);
	/* field 99 (varint) only: an unknown field and no body */
	const uint8_t unknown[] = { 0x98, 0x06, 0x01 };
	/* field 10 (create) sent as a varint: wrong wire type */
	const uint8_t wrong_type[] = { 0x08, 0x07, 0x50, 0x01 };
	const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x22 };
	int fds[200], fd;

	/* zero length and oversized: an error response, then hang-up */
	fd = raw_connect();
	send_frame(fd, NULL, 0);
	CHECK_RC(recv_response(fd, NULL), -EPROTO);
	CHECK(peer_closed(fd));
	close(fd);
	fd = raw_connect();
	/* the header alone: the daemon answers before reading any body */
	send_all(fd, "\x70\x11\x01\x00", 4); /* 70000 */
	CHECK_RC(recv_response(fd, NULL), -EMSGSIZE);
	CHECK(peer_closed(fd));
	close(fd);

	/* garbage bodies: an error each, and the connection goes on */
	fd = raw_connect();
	send_frame(fd, garbage, sizeof(garbage));
	CHECK_RC(recv_response(fd, NULL), -EPROTO);
	send_frame(fd, unknown, sizeof(unknown));
	CHECK(recv_response(fd, NULL) < 0);
	send_frame(fd, wrong_type, sizeof(wrong_type));
	CHECK(recv_response(fd, NULL) < 0);
	status_request(fd);
	CHECK_RC(recv_response(fd, NULL), 0);
	/* two requests in one write are both answered, in order */
	status_request(fd);
	status_request(fd);
	CHECK_RC(recv_response(fd, NULL), 0);
	CHECK_RC(recv_response(fd, NULL), 0);
	close(fd);

	/* truncated frame, then gone: disconnect mid-request */
	fd = raw_connect();
	send_all(fd, "\x10\x00\x00\x00\x08", 5);
	close(fd);
	fd = raw_connect();
	send_all(fd, "\x10\x00", 2);
	close(fd);

	/* many clients at once */
	for (int i = 0; i < 200; i++) {
		fds[i] = raw_connect();
		status_request(fds[i]);
	}
	for (int i = 0; i < 200; i++) {
		CHECK_RC(recv_response(fds[i], NULL), 0);
		close(fds[i]);
	}
	{
		char out[4096];
		CHECK(ctl(out, sizeof(out), "status") == 0);
	}
	CHECK(hd_wait_fds_pid(daemon_pid, base, 2000));
}

static void test_destroy_while_attached(void)
{
	int base = settled_fds(daemon_pid);
	char out[4096], buf[64];
	flowshm_t *p, *c;
	size_t len;

	CHECK(ctl(out, sizeof(out), "flow create busy --ring-size 64K") == 0);
	p = attach("busy", FLOWSHM_PRODUCER, 0);
	c = attach("busy", FLOWSHM_CONSUMER, 0);
	CHECK_RC(flowshm_send(p, "last", 4, 0), 0);
	CHECK(ctl(out, sizeof(out), "flow destroy busy") == 0);
	CHECK_RC(flowshm_send(p, "more", 4, 0), -EPIPE);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, -1), 0); /* drains */
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, -1), -EPIPE);
	CHECK(ctl(out, sizeof(out), "flow show busy") == 1);
	flowshm_detach(p);
	flowshm_detach(c);
	CHECK(hd_wait_fds_pid(daemon_pid, base, 2000));
}

static void test_sigterm(void)
{
	flowshm_t *p = attach("f1", FLOWSHM_PRODUCER, 0);
	int st;

	CHECK(kill(daemon_pid, SIGTERM) == 0);
	CHECK(waitpid(daemon_pid, &st, 0) == daemon_pid);
	daemon_pid = 0; /* reaped: nothing for kill_daemon */
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "moverd exit status %d\n", st);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* an orderly stop destroys nothing: the flow goes on (issue 15) */
	CHECK_RC(flowshm_send(p, "x", 1, 0), 0);
	CHECK(access(sock_path, F_OK) == -1);
	flowshm_detach(p);
	attach("f1", FLOWSHM_PRODUCER, -ECONNREFUSED);
}

/*
 * Daemonized (no --foreground) from a working directory, with a relative
 * --socket: the daemon's working directory becomes /, so the socket was
 * bound at /rel-sock/m.sock (outside the directory moverd had checked,
 * where it made its lock file and rings; that bind failed here), and the
 * parent exited 1.  Now the socket is where the path said when moverd
 * started, beside its lock file.
 */
static void test_daemonized_relative(void)
{
	char dir[] = "/tmp/fm-rel-XXXXXX", sock[128], cmd[160], bin[PATH_MAX];
	pid_t pid;
	int st;

	CHECK(mkdtemp(dir));
	CHECK(realpath(moverd_bin, bin)); /* it may be relative to here */
	snprintf(sock, sizeof(sock), "%s/rel-sock/m.sock", dir);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		if (chdir(dir))
			_exit(126);
		execl(bin, bin, "--socket", "rel-sock/m.sock",
		      "--socket-mode", "0666", (char *)NULL);
		_exit(127);
	}
	/* its parent exits 0 once the daemon is ready, 1 if it failed */
	CHECK(waitpid(pid, &st, 0) == pid);
	daemon_pid = lock_pid(sock);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(daemon_pid > 0);
	st = ctl_connect(sock);
	CHECK(st >= 0);
	close(st);
	CHECK(access("/rel-sock/m.sock", F_OK) == -1);
	CHECK(kill(daemon_pid, SIGTERM) == 0);
	for (int i = 0; i < 500 && kill(daemon_pid, 0) == 0; i++)
		usleep(10000);
	CHECK(kill(daemon_pid, 0) == -1);
	daemon_pid = 0;
	CHECK(access(sock, F_OK) == -1); /* it cleaned up where it bound */
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
}

/* A failed CHECK exits: take the daemon with us, or it keeps ctest's
 * output pipe open and the run hangs until ctest's timeout. */
static void kill_daemon(void)
{
	if (daemon_pid > 0)
		kill(daemon_pid, SIGKILL);
}

int main(int argc, char **argv)
{
	CHECK(argc == 3);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	snprintf(sock_path, sizeof(sock_path), "/tmp/fm-test-%d/moverd.sock",
		 (int)getpid());
	setenv("FLOWMOVER_SOCKET", sock_path, 1);
	daemon_pid = start_daemon(NULL, NULL);
	atexit(kill_daemon);

	test_status_and_single_instance();
	printf("ok 1 - status, single instance\n");
	test_moverctl_flows();
	printf("ok 2 - moverctl flow commands\n");
	test_attach_and_move();
	printf("ok 3 - attach by name and move records\n");
	test_permissions();
	printf("ok 4 - permissions\n");
	test_bad_frames();
	printf("ok 5 - bad frames, many clients\n");
	test_destroy_while_attached();
	printf("ok 6 - destroy while attached\n");
	test_sigterm();
	printf("ok 7 - SIGTERM\n");
	test_daemonized_relative();
	printf("ok 8 - daemonized with a relative --socket\n");
	return 0;
}
