/*
 * tests/test_pid_reuse.c - a producer killed in a claim whose pid a new
 * process takes at once (ipc/ring.h, Liveness: reused pids).  The new
 * process is made in exactly the dead one's pid with clone3's set_tid, so
 * the consumer's judge finds that pid alive, as it would after a lap of
 * every pid on a busy host.
 *
 * 1. A ring without moverd: the victim took its own producer slot, which
 *    it still holds when it dies.  The slot's tag (its start time) is not
 *    the new process's: its record is padded, the flow goes on.
 * 2. Through a real moverd: moverd gives the victim's slot back when its
 *    control connection closes, so no slot has the pid in the header any
 *    more: the record is padded, the flow goes on.
 *
 * Before format 4, the pid alone decided: both flows stalled for as long
 * as the new process lived.  Exit 77 (skipped) where set_tid is refused
 * (it needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE).
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <linux/sched.h>
#include <sys/syscall.h>

#define RECOVER_NS 20000000ull /* 20 ms: the consumer's recovery timeout */
#define WAIT_NS 10000000000ll  /* generous: a failure, never a figure */
#define RECORDS 10

static const char *moverd_bin, *moverctl_bin;

/* A process in exactly pid `want`, which waits to be killed: its pid in
 * the parent, -errno if the kernel refused. */
static pid_t spawn_in_pid(pid_t want)
{
	struct clone_args a = { .exit_signal = SIGCHLD,
				.set_tid = (uint64_t)(uintptr_t)&want,
				.set_tid_size = 1 };
	long rc;

	fflush(NULL);
	rc = syscall(SYS_clone3, &a, sizeof(a));
	if (rc < 0)
		return -errno;
	if (rc == 0) { /* a raw clone: only system calls from here */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (;;)
			pause();
	}
	return (pid_t)rc;
}

static void reap(pid_t pid, int sig)
{
	int st;

	kill(pid, sig);
	CHECK(waitpid(pid, &st, 0) == pid);
}

/* Can we make a process in a pid of our choosing?  A child's, once it is
 * reaped, is free for a moment (another process may take it first: try
 * again). */
static bool set_tid_works(void)
{
	pid_t again = -EEXIST;

	for (int i = 0; i < 10 && again == -EEXIST; i++) {
		pid_t pid = fork();

		CHECK(pid >= 0);
		if (!pid)
			_exit(0);
		reap(pid, 0);
		again = spawn_in_pid(pid);
	}
	if (again < 0) {
		printf("clone3 set_tid: %s\n", strerror(-again));
		return false;
	}
	reap(again, SIGKILL);
	return true;
}

/* The victim: RECORDS records, then a claim it never commits; it tells
 * the parent and waits to be killed. */
static void victim(flowshm_t *p, int ready)
{
	unsigned char buf[100];
	void *w;

	for (uint64_t s = 0; s < RECORDS; s++) {
		tu_fill(buf, 1, s, sizeof(buf));
		CHECK_RC(flowshm_send(p, buf, sizeof(buf), WAIT_NS), 0);
	}
	CHECK_RC(flowshm_reserve(p, 100, &w, WAIT_NS), 0);
	memset(w, 0xab, 50);
	CHECK(write(ready, "r", 1) == 1);
	for (;;)
		pause();
}

/*
 * Kill the victim once it stands in its claim, and start a process in its
 * pid.  The pause first puts the new process's start a few clock ticks
 * after the victim's.  Returns the new process.
 */
static pid_t kill_and_reuse(pid_t pid, int ready)
{
	pid_t again;
	char x;

	CHECK(read(ready, &x, 1) == 1);
	usleep(50000);
	reap(pid, SIGKILL);
	again = spawn_in_pid(pid);
	/* EEXIST: another process took the pid first, reused all the same */
	CHECK(again == pid || again == -EEXIST);
	CHECK(kill(pid, 0) == 0 || again == -EEXIST);
	return again;
}

/* The victim's records, then ours: the claim between them padded. */
static void consume(flowshm_t *c, flowshm_t *p)
{
	unsigned char buf[200];
	struct flowshm_info in;
	uint32_t id;
	uint64_t seq;
	size_t len;

	for (uint64_t s = 0; s < RECORDS; s++) {
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS), 0);
		CHECK(tu_verify(buf, len, &id, &seq) && id == 1 && seq == s);
	}
	tu_fill(buf, 2, 0, 150);
	CHECK_RC(flowshm_send(p, buf, 150, WAIT_NS), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS), 0);
	CHECK(tu_verify(buf, len, &id, &seq) && id == 2 && seq == 0);
	CHECK_RC(flowshm_info(c, &in), 0);
	CHECK(in.recovered == 1);
	CHECK(in.head == in.tail);
}

static void case_own_slot(void)
{
	int fd = tu_ring(64 << 10, 1024, 0), ready[2];
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, RECOVER_NS), *p;
	pid_t pid, again;

	CHECK(pipe(ready) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (!pid)
		victim(tu_open(fd, FLOWSHM_PRODUCER, 0), ready[1]);
	again = kill_and_reuse(pid, ready[0]);
	p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	consume(c, p);
	if (again > 0)
		reap(again, SIGKILL);
	flowshm_close(p);
	flowshm_close(c);
	close(fd);
	close(ready[0]);
	close(ready[1]);
}

static void case_moverd(void)
{
	struct flowshm_opts fast = { .recover_ns = RECOVER_NS };
	flowshm_t *c = NULL, *p = NULL;
	char out[4096];
	int ready[2];
	pid_t pid, again;
	struct hd d;

	hd_start(&d, moverd_bin, "pidreuse", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create r "
		     "--ring-size 64K --max-record 1024") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("r", FLOWSHM_CONSUMER, &fast, &c), 0);
	CHECK(pipe(ready) == 0);
	pid = hd_fork_client(&d);
	if (!pid) {
		CHECK_RC(flowshm_attach("r", FLOWSHM_PRODUCER, NULL, &p), 0);
		victim(p, ready[1]);
	}
	again = kill_and_reuse(pid, ready[0]);
	CHECK_RC(flowshm_attach("r", FLOWSHM_PRODUCER, NULL, &p), 0);
	consume(c, p);
	if (again > 0)
		reap(again, SIGKILL);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&d);
	hd_stop(&d);
	close(ready[0]);
	close(ready[1]);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_own_slot, "no moverd: a producer killed in a claim, "
		  "its pid reused at once; the flow goes on" },
		{ 2, case_moverd, "moverd: the same, its slot given back at "
		  "the disconnect" },
	};

	if (argc != 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL\n", argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	if (!set_tid_works()) {
		printf("skipped: cannot make a process in a chosen pid\n");
		return 77;
	}
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]), "FM_REUSE_CASES");
}
