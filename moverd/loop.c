/*
 * moverd/loop.c - a thin layer over liburing: hand out SQEs tagged with
 * their op, reap CQEs and dispatch.
 */
#include "loop.h"
#include "log.h"

#include <errno.h>
#include <string.h>

int loop_init(struct loop *l, unsigned entries)
{
	int rc = io_uring_queue_init(entries, &l->ring, 0);

	l->stop = false;
	if (rc < 0)
		log_error("io_uring_queue_init: %s", strerror(-rc));
	return rc;
}

void loop_fini(struct loop *l)
{
	io_uring_queue_exit(&l->ring);
}

struct io_uring_sqe *loop_sqe(struct loop *l, struct loop_op *op,
			      loop_done_fn done)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);

	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	if (!sqe)
		return NULL;
	op->done = done;
	op->busy = true;
	io_uring_sqe_set_data(sqe, op);
	return sqe;
}

int loop_run_once(struct loop *l, int timeout_ms)
{
	struct __kernel_timespec ts = {
		.tv_sec = timeout_ms / 1000,
		.tv_nsec = (long long)(timeout_ms % 1000) * 1000000,
	};
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	int rc;

	rc = io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1,
					      timeout_ms >= 0 ? &ts : NULL,
					      NULL);
	if (rc < 0 && rc != -ETIME && rc != -EINTR)
		return rc;
	io_uring_for_each_cqe(&l->ring, head, cqe) {
		struct loop_op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		n++;
		if (!op)
			continue;
		op->busy = false;
		op->done(op, res);
	}
	io_uring_cq_advance(&l->ring, n);
	return (int)n;
}
