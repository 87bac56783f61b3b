/*
 * moverd/loop.c - a thin layer over liburing: hand out SQEs tagged with
 * their op, reap CQEs and dispatch.
 */
#include "loop.h"
#include "log.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static const char *const mode_names[] = {
	[LOOP_AUTO] = "auto", [LOOP_PLAIN] = "plain", [LOOP_COOP] = "coop",
	[LOOP_DEFER] = "defer", [LOOP_SQPOLL] = "sqpoll",
};

int loop_mode_parse(const char *s, enum loop_mode *mode)
{
	for (unsigned i = 0; i < sizeof(mode_names) / sizeof(mode_names[0]);
	     i++) {
		if (!strcmp(s, mode_names[i])) {
			*mode = (enum loop_mode)i;
			return 0;
		}
	}
	return -1;
}

const char *loop_mode_name(enum loop_mode mode)
{
	return mode_names[mode];
}

static void mode_params(enum loop_mode mode, struct io_uring_params *p)
{
	switch (mode) {
	case LOOP_AUTO:
	case LOOP_PLAIN:
		break;
	case LOOP_COOP:
		p->flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
		break;
	case LOOP_DEFER:
		p->flags = IORING_SETUP_SINGLE_ISSUER |
			   IORING_SETUP_DEFER_TASKRUN |
			   IORING_SETUP_TASKRUN_FLAG;
		break;
	case LOOP_SQPOLL:
		p->flags = IORING_SETUP_SQPOLL;
		p->sq_thread_idle = 2; /* ms */
		break;
	}
}

static int setup(struct loop *l, unsigned entries, enum loop_mode mode)
{
	struct io_uring_params p;

	memset(&p, 0, sizeof(p));
	mode_params(mode, &p);
	l->mode = mode;
	return io_uring_queue_init_params(entries, &l->ring, &p);
}

int loop_init(struct loop *l, unsigned entries, enum loop_mode mode)
{
	int rc;

	l->stop = false;
	if (mode == LOOP_AUTO) {
		rc = setup(l, entries, LOOP_DEFER);
		if (rc != -EINVAL)
			goto out;
		log_info("io_uring: no DEFER_TASKRUN here (Linux < 6.1): plain");
		mode = LOOP_PLAIN;
	}
	rc = setup(l, entries, mode);
out:
	if (rc < 0)
		log_error("io_uring_queue_init (--io-uring %s): %s",
			  loop_mode_name(l->mode), strerror(-rc));
	return rc;
}

void loop_fini(struct loop *l)
{
	io_uring_queue_exit(&l->ring);
}

/*
 * An SQE, submitting queued ones first if the SQ is full; NULL if none.
 * With SQPOLL a submit only wakes the kernel's thread, which may not have
 * taken the queued entries yet: wait for it to make room (it drains the
 * SQ in microseconds; more than 1024 ops re-armed in one batch of
 * completions is what fills it).
 */
static struct io_uring_sqe *get_sqe(struct loop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);

	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	if (!sqe && l->mode == LOOP_SQPOLL && io_uring_sqring_wait(&l->ring) >= 0)
		sqe = io_uring_get_sqe(&l->ring);
	return sqe;
}

struct io_uring_sqe *loop_sqe(struct loop *l, struct loop_op *op,
			      loop_done_fn done)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return NULL;
	op->done = done;
	op->busy = true;
	io_uring_sqe_set_data(sqe, op);
	return sqe;
}

void loop_cancel(struct loop *l, struct loop_op *op)
{
	struct io_uring_sqe *sqe;

	if (!op->busy || !(sqe = get_sqe(l)))
		return;
	io_uring_prep_cancel(sqe, op, 0);
	io_uring_sqe_set_data(sqe, NULL); /* loop_run_once skips it */
}

bool loop_room(struct loop *l, unsigned n)
{
	if (io_uring_sq_space_left(&l->ring) < n)
		io_uring_submit(&l->ring);
	return io_uring_sq_space_left(&l->ring) >= n;
}

/* Errors of a submission or of a look at completions that only mean
 * "try again on the next cycle". */
static bool transient(int rc)
{
	return rc == -EINTR || rc == -EBUSY || rc == -EAGAIN;
}

/*
 * A polling cycle: submit what is queued, and look at the CQ in memory.
 * Completions need no system call to show up there: with no setup flags
 * their task work interrupts us (TWA_SIGNAL) and runs on our way back to
 * user space; with coop or defer the kernel sets IORING_SQ_TASKRUN, and
 * io_uring_peek_cqe enters to run it only then (it reads the flag, as for
 * a CQ overflow).  The system call per empty poll this replaces was most
 * of a spinning daemon's system time (strace -c: 89%), and a record that
 * came meanwhile waited for it to return.
 */
static int poll_once(struct loop *l)
{
	struct io_uring_cqe *cqe;
	int rc;

	if (io_uring_sq_ready(&l->ring)) {
		rc = io_uring_submit(&l->ring);
		if (rc < 0 && !transient(rc))
			return rc;
	}
	rc = io_uring_peek_cqe(&l->ring, &cqe);
	return rc < 0 && !transient(rc) ? rc : 0;
}

static int wait_once(struct loop *l, int timeout_ms)
{
	struct __kernel_timespec ts = {
		.tv_sec = timeout_ms / 1000,
		.tv_nsec = (long long)(timeout_ms % 1000) * 1000000,
	};
	struct io_uring_cqe *cqe;
	int rc;

	rc = io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1,
					      timeout_ms >= 0 ? &ts : NULL,
					      NULL);
	/* -EBUSY: completions to reap first (a full CQ), which we do now */
	return rc < 0 && rc != -ETIME && !transient(rc) ? rc : 0;
}

int loop_run_once(struct loop *l, int timeout_ms)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	int rc = timeout_ms ? wait_once(l, timeout_ms) : poll_once(l);

	if (rc < 0)
		return rc;
	io_uring_for_each_cqe(&l->ring, head, cqe) {
		struct loop_op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		n++;
		/* a cancel's, or the timeout liburing queues itself where
		 * the kernel cannot take one with the wait (before 5.11) */
		if (!op || cqe->user_data == LIBURING_UDATA_TIMEOUT)
			continue;
		op->busy = false;
		op->done(op, res);
	}
	io_uring_cq_advance(&l->ring, n);
	return (int)n;
}
