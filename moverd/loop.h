/*
 * moverd/loop.h - the io_uring event loop that drives everything in moverd
 * that is not the data fast path: the control socket, signals, timers and
 * (later) peer connections.
 *
 * Each asynchronous operation is a struct loop_op embedded in its owner;
 * its address is the SQE's user_data, and `done` runs with the CQE's
 * result.  An owner may not be freed while one of its ops is in flight.
 */
#ifndef MOVERD_LOOP_H
#define MOVERD_LOOP_H

#include <liburing.h>
#include <stdbool.h>

struct loop_op;
typedef void (*loop_done_fn)(struct loop_op *op, int res);

struct loop_op {
	loop_done_fn done;
	bool busy;
};

struct loop {
	struct io_uring ring;
	bool stop;
};

int loop_init(struct loop *l, unsigned entries);
void loop_fini(struct loop *l);

/* An SQE bound to op (submitting queued ones first if the SQ is full). */
struct io_uring_sqe *loop_sqe(struct loop *l, struct loop_op *op,
			      loop_done_fn done);

/* Submit, wait up to timeout_ms for completions, run their handlers.
 * Returns the number handled or a negative errno. */
int loop_run_once(struct loop *l, int timeout_ms);

#endif
