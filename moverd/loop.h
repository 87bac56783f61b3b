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

/*
 * How the ring is set up (moverd --io-uring; figures in moverd/README.md):
 *   auto    defer where the kernel has it (Linux 6.1+), else plain (the
 *           default)
 *   plain   no setup flags: a completion's task work interrupts the task
 *           (TWA_SIGNAL: an IPI when it runs on another cpu)
 *   coop    COOP_TASKRUN + TASKRUN_FLAG: task work waits for our next
 *           entry into the kernel; the ring's flag says when to enter
 *   defer   SINGLE_ISSUER + DEFER_TASKRUN + TASKRUN_FLAG: task work runs
 *           only when we ask for completions, and a sleeping waiter is
 *           woken only when there are completions for it
 *   sqpoll  SQPOLL: a kernel thread submits (it polls for 2 ms after the
 *           last submission, then sleeps)
 */
enum loop_mode { LOOP_AUTO, LOOP_PLAIN, LOOP_COOP, LOOP_DEFER, LOOP_SQPOLL };

struct loop {
	struct io_uring ring;
	enum loop_mode mode;      /* as set up (auto resolved) */
	bool stop;
};

/* "auto", "plain", "coop", "defer" or "sqpoll": 0, or -1 for another
 * word. */
int loop_mode_parse(const char *s, enum loop_mode *mode);
const char *loop_mode_name(enum loop_mode mode);

/* 0, or a negative errno (the kernel refused the mode: said in the log).
 * auto falls back to plain where the kernel refuses defer. */
int loop_init(struct loop *l, unsigned entries, enum loop_mode mode);
void loop_fini(struct loop *l);

/* An SQE bound to op (submitting queued ones first if the SQ is full). */
struct io_uring_sqe *loop_sqe(struct loop *l, struct loop_op *op,
			      loop_done_fn done);

/* Room for n SQEs that must go in one submission (a chain linked with
 * IOSQE_IO_LINK: loop_sqe would submit the first alone when the SQ
 * fills), submitting queued ones first if need be; false if there is
 * none.  Take them with loop_sqe right after. */
bool loop_room(struct loop *l, unsigned n);

/* Ask the kernel to cancel op, if it is in flight: op completes (with
 * -ECANCELED, or as it would have) and its handler runs as usual; the
 * cancel request's own completion is ignored. */
void loop_cancel(struct loop *l, struct loop_op *op);

/* Submit, wait up to timeout_ms for completions, run their handlers.
 * Returns the number handled or a negative errno.  With timeout_ms 0 (a
 * polling duty cycle) it enters the kernel only to submit queued SQEs or
 * to run task work the ring says is pending: a poll that finds nothing
 * costs no system call. */
int loop_run_once(struct loop *l, int timeout_ms);

#endif
