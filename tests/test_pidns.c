/*
 * tests/test_pidns.c - clients in another pid namespace than moverd's, as
 * in a container: pids are judged only where they mean something
 * (ipc/ring.h, "Liveness").  A real moverd, local flows, clients attached
 * by name, the namespaced ones made with unshare(CLONE_NEWPID).
 *
 * 1. A producer in a child pid namespace dies in a claim: the consumer on
 *    the host recovers its record and gets the next one.  Before, the
 *    header named the producer by its pid in its own namespace (1: it was
 *    that namespace's init), which the host's consumer took for its own
 *    init, alive: the flow stalled for good.
 * 2. A consumer in a child pid namespace; a producer on the host holds a
 *    claim open for many recovery timeouts, alive: its record arrives
 *    whole, nothing recovered.  Before, the consumer found no such pid in
 *    its namespace, took the producer for dead and padded its record over.
 * 3. The same consumer; the producer on the host is killed in its claim:
 *    moverd, which can judge, recovers the record (flows_recover_local)
 *    and the consumer goes on with the next.
 * 4. The same with a polling consumer (FLOWSHM_WAIT_SPIN), which never
 *    publishes its position before a sleep: it does when it finds it
 *    cannot judge the claim it waits at (ring.c, recover_later).
 *
 * Exit 77 (skipped) where pid namespaces cannot be made (no privilege).
 */
#include "testutil.h"
#include "ctl_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define RECOVER_NS 100000000ull /* 100 ms: a consumer's recovery timeout */
#define SEC 1000000000ll

static const char *moverd_bin, *moverctl_bin;
static char dir[] = "/tmp/pidns-test-XXXXXX";
static char sock_path[108], log_path[128];
static pid_t daemon_pid;

static pid_t start_daemon(void)
{
	const char *argv[] = { moverd_bin, "--foreground", "--socket",
			       sock_path, "--log-level", "info", NULL };
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		/* a failed check ends the test: its moverd goes with it */
		CHECK(prctl(PR_SET_PDEATHSIG, SIGTERM) == 0);
		CHECK(fd >= 0 && dup2(fd, 1) == 1 && dup2(fd, 2) == 2);
		execv(moverd_bin, (char **)argv);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		int fd = ctl_connect(sock_path);

		if (fd >= 0) {
			close(fd);
			return pid;
		}
		CHECK(waitpid(pid, NULL, WNOHANG) == 0);
		usleep(10000);
	}
	CHECK(!"moverd did not come up");
	return 0;
}

static void ctl(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void ctl(const char *fmt, ...)
{
	char out[4096];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = tu_vmoverctl(moverctl_bin, sock_path, out, sizeof(out), fmt, ap);
	va_end(ap);
	if (rc)
		fprintf(stderr, "moverctl: exit %d: %s\n", rc, out);
	CHECK(rc == 0);
}

static flowshm_t *attach(const char *flow, enum flowshm_role role)
{
	struct flowshm_opts o = { .recover_ns = RECOVER_NS };
	flowshm_t *f = NULL;
	int rc = flowshm_attach(flow, role, &o, &f);

	if (rc)
		fprintf(stderr, "attach %s: %s\n", flow, flowshm_attach_error());
	CHECK_RC(rc, 0);
	return f;
}

/* The next record is want (a string), within timeout_s. */
static int expect(flowshm_t *c, const char *want, int timeout_s)
{
	char buf[256];
	size_t len = 0;
	int rc = flowshm_recv(c, buf, sizeof(buf) - 1, &len,
			      timeout_s * SEC);

	if (rc) {
		fprintf(stderr, "  waited %d s for '%s': %s\n", timeout_s, want,
			strerror(-rc));
		return rc;
	}
	buf[len] = 0;
	if (strcmp(buf, want)) {
		fprintf(stderr, "  got '%s' where '%s' was due\n", buf, want);
		return -EBADMSG;
	}
	return 0;
}

static void send_str(flowshm_t *p, const char *s)
{
	CHECK_RC(flowshm_send(p, s, strlen(s), SEC), 0);
}

/*
 * Run fn(arg) as the init of a new pid namespace (pid 1 there), and return
 * its pid as we see it.  A child of ours makes the namespace and forks fn
 * into it, so that our own later children stay in ours.  *reaper: that
 * child, which exits with fn's exit status.
 */
static pid_t in_new_pidns(int (*fn)(const void *), const void *arg,
			  pid_t *reaper)
{
	int pfd[2];
	pid_t inner = 0, mid;

	CHECK(pipe(pfd) == 0);
	mid = fork();
	CHECK(mid >= 0);
	if (mid == 0) {
		int st;

		close(pfd[0]);
		CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL) == 0);
		if (unshare(CLONE_NEWPID)) {
			fprintf(stderr, "unshare(CLONE_NEWPID): %s\n",
				strerror(errno));
			_exit(77);
		}
		inner = fork();
		CHECK(inner >= 0);
		if (inner == 0) {
			CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL) == 0);
			CHECK(getpid() == 1); /* its namespace's init */
			_exit(fn(arg));
		}
		CHECK(write(pfd[1], &inner, sizeof(inner)) == sizeof(inner));
		CHECK(waitpid(inner, &st, 0) == inner);
		_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	}
	close(pfd[1]);
	if (read(pfd[0], &inner, sizeof(inner)) != sizeof(inner)) {
		int st;

		CHECK(waitpid(mid, &st, 0) == mid);
		if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
			printf("# SKIP: no pid namespace can be made here\n");
			char cmd[200];

			kill(daemon_pid, SIGTERM);
			waitpid(daemon_pid, NULL, 0);
			snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
			CHECK(system(cmd) == 0);
			exit(77);
		}
		CHECK(!"the pid namespace's init did not start");
	}
	close(pfd[0]);
	*reaper = mid;
	return inner;
}

static int reaped_status(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A pipe a child writes one byte to when it got somewhere. */
static int sig[2];

static void signal_parent(void)
{
	CHECK(write(sig[1], "x", 1) == 1);
}

static void wait_child(const char *what)
{
	struct pollfd pf = { .fd = sig[0], .events = POLLIN };
	char x;

	if (poll(&pf, 1, 20000) != 1 || read(sig[0], &x, 1) != 1) {
		fprintf(stderr, "no sign from the child: %s\n", what);
		CHECK(0);
	}
}

/* A producer that sends "one", claims a record and stays in the claim
 * until killed. */
static int producer_dies_in_claim(const void *arg)
{
	flowshm_t *p = attach(arg, FLOWSHM_PRODUCER);
	void *buf;

	send_str(p, "one");
	CHECK_RC(flowshm_reserve(p, 32, &buf, SEC), 0);
	memcpy(buf, "never committed", 16);
	signal_parent();
	pause();
	return 0;
}

/* ---- 1 ------------------------------------------------------------------ */

static void producer_in_pidns(void)
{
	flowshm_t *c, *p;
	struct flowshm_info in;
	pid_t prod, reaper;

	ctl("flow create pn1 --ring-size 64K --max-record 1K");
	c = attach("pn1", FLOWSHM_CONSUMER);
	prod = in_new_pidns(producer_dies_in_claim, "pn1", &reaper);
	wait_child("the producer in the pid namespace claimed");
	CHECK_RC(expect(c, "one", 10), 0);
	CHECK(kill(prod, SIGKILL) == 0);
	CHECK(reaped_status(reaper) == 128 + SIGKILL);
	p = attach("pn1", FLOWSHM_PRODUCER);
	send_str(p, "two");
	if (expect(c, "two", 20)) {
		fprintf(stderr, "case 1: the record after a dead namespaced "
			"producer's claim never came: its pid was not "
			"judged dead\n");
		CHECK(0);
	}
	CHECK_RC(flowshm_info(c, &in), 0);
	CHECK(in.recovered == 1);
	flowshm_close(p);
	flowshm_close(c);
	printf("ok 1 - a producer in a child pid namespace dies in a claim: "
	       "recovered by the host's consumer\n");
}

/* ---- 2 and 3 ------------------------------------------------------------ */

struct consumer_job {
	const char *flow;
	const char *want[3];
	uint32_t recovered; /* records of the ring padded over, at the end */
	bool spin;          /* FLOWSHM_WAIT_SPIN: never asleep, so it never
			     * publishes its position before a sleep */
};

/* A consumer in the pid namespace: attaches, says so, reads want[]. */
static int consumer_expects(const void *arg)
{
	const struct consumer_job *j = arg;
	flowshm_t *c = attach(j->flow, FLOWSHM_CONSUMER);
	struct flowshm_info in;

	if (j->spin)
		CHECK_RC(flowshm_set_wait(c, FLOWSHM_WAIT_SPIN), 0);
	signal_parent();
	for (int i = 0; i < 3 && j->want[i]; i++)
		if (expect(c, j->want[i], 30))
			return 10 + i;
	CHECK_RC(flowshm_info(c, &in), 0);
	if (in.recovered != j->recovered) {
		fprintf(stderr, "  %u records recovered, want %u\n",
			in.recovered, j->recovered);
		return 20;
	}
	flowshm_close(c);
	return 0;
}

/* The consumer in the pid namespace got what it wanted (its reaper's
 * exit status), or the case fails with why. */
static void consumer_done(pid_t reaper, int n, const char *why)
{
	int rc = reaped_status(reaper);

	if (rc) {
		fprintf(stderr, "case %d: the consumer in the pid namespace "
			"failed (exit %d): %s\n", n, rc, why);
		CHECK(0);
	}
}

/* A producer on the host: "A", then "B" in a claim it holds until the
 * test writes to go, then "C". */
static int go[2];

static void producer_slow_in_claim(const char *flow)
{
	flowshm_t *p = attach(flow, FLOWSHM_PRODUCER);
	void *buf;
	char x;

	send_str(p, "A");
	CHECK_RC(flowshm_reserve(p, 1, &buf, SEC), 0);
	memcpy(buf, "B", 1);
	signal_parent();
	CHECK(read(go[0], &x, 1) == 1);
	CHECK_RC(flowshm_commit(p), 0);
	send_str(p, "C");
	flowshm_close(p);
}

static void consumer_in_pidns_slow_producer(void)
{
	static const struct consumer_job job = { "pn2", { "A", "B", "C" }, 0, false };
	pid_t prod, reaper;

	ctl("flow create pn2 --ring-size 64K --max-record 1K");
	CHECK(pipe(go) == 0);
	in_new_pidns(consumer_expects, &job, &reaper);
	wait_child("the consumer in the pid namespace attached");
	prod = fork();
	CHECK(prod >= 0);
	if (prod == 0) {
		CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL) == 0);
		producer_slow_in_claim("pn2");
		_exit(0);
	}
	wait_child("the producer claimed B");
	/* 15 of the consumer's recovery timeouts, with the producer alive */
	usleep(1500000);
	CHECK(write(go[1], "g", 1) == 1);
	CHECK(reaped_status(prod) == 0);
	consumer_done(reaper, 2, "a live producer's record was taken for a "
		      "dead one's");
	close(go[0]);
	close(go[1]);
	printf("ok 2 - a consumer in a child pid namespace leaves a live "
	       "producer's long claim alone\n");
}

static void consumer_in_pidns_dead_producer(const char *flow, bool spin)
{
	const struct consumer_job job = { flow, { "one", "two" }, 1, spin };
	static const char said[] = "a record whose producer died before it "
				   "committed was skipped";
	char cmd[300];
	flowshm_t *p;
	pid_t prod, reaper;

	ctl("flow create %s --ring-size 64K --max-record 1K", flow);
	in_new_pidns(consumer_expects, &job, &reaper);
	wait_child("the consumer in the pid namespace attached");
	prod = fork();
	CHECK(prod >= 0);
	if (prod == 0)
		_exit(producer_dies_in_claim(flow));
	wait_child("the producer on the host claimed");
	CHECK(kill(prod, SIGKILL) == 0);
	CHECK(reaped_status(prod) == 128 + SIGKILL);
	p = attach(flow, FLOWSHM_PRODUCER);
	send_str(p, "two");
	consumer_done(reaper, spin ? 4 : 3, "nobody recovered the dead "
		      "producer's record");
	snprintf(cmd, sizeof(cmd), "grep -q 'flow %s: %s' %s", flow, said,
		 log_path);
	CHECK(system(cmd) == 0);
	flowshm_close(p);
	printf("ok %d - a consumer in a child pid namespace%s: moverd "
	       "recovers a dead producer's record for it\n", spin ? 4 : 3,
	       spin ? ", polling" : "");
}

int main(int argc, char **argv)
{
	char cmd[200];
	pid_t d;
	int st;

	CHECK(argc == 3);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	CHECK(mkdtemp(dir));
	snprintf(sock_path, sizeof(sock_path), "%s/moverd.sock", dir);
	snprintf(log_path, sizeof(log_path), "%s/moverd.log", dir);
	setenv("FLOWMOVER_SOCKET", sock_path, 1);
	CHECK(pipe(sig) == 0);
	d = daemon_pid = start_daemon();
	producer_in_pidns();
	consumer_in_pidns_slow_producer();
	consumer_in_pidns_dead_producer("pn3", false);
	consumer_in_pidns_dead_producer("pn4", true);
	CHECK(kill(d, SIGTERM) == 0);
	CHECK(waitpid(d, &st, 0) == d);
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		snprintf(cmd, sizeof(cmd), "cat %s >&2", log_path);
		CHECK(system(cmd) >= 0);
		CHECK(!"moverd did not exit cleanly");
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return 0;
}
