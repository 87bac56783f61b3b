/*
 * moverd/listener.h - what moverd's two listening sockets (the control
 * socket, control.c, and the peer port, tcp.c) share against connection
 * floods: a back-off when accept fails for want of fds or memory, and the
 * open files left before the process limit.
 *
 * Re-arming an accept that failed with EMFILE at once spins the loop (the
 * connection stays in the backlog, the accept fails again at once), so a
 * failed accept waits: 10 ms, doubling up to 1 s, back to 10 ms after the
 * next success.  The wait is a timeout op on the io_uring loop, so the
 * loop never blocks and never spins.
 */
#ifndef MOVERD_LISTENER_H
#define MOVERD_LISTENER_H

#include "loop.h"

#include <stdbool.h>
#include <stdint.h>

struct listener_backoff {
	struct loop_op op;
	struct __kernel_timespec ts;
	unsigned ms;              /* the next wait; 0: the first */
	uint64_t waits;           /* waits taken (moverctl status) */
};

/* accept failed with res (a negative errno): wait before the next one?
 * (Everything but a connection that went before it was accepted.) */
bool listener_must_wait(int res);

/* Start a wait on the loop; `done` runs (with the op) when it ends. */
void listener_wait(struct loop *l, struct listener_backoff *b,
		   loop_done_fn done);

/* Listening on fd, but neither the accept nor a wait in flight: an arm
 * found no SQE (loop_sqe NULL), and the owner must arm the accept again
 * (ctl_server_rearm, peer_rearm: on every loop pass), or it never would. */
static inline bool listener_lost(int fd, const struct loop_op *accept,
				 const struct listener_backoff *b)
{
	return fd >= 0 && !accept->busy && !b->op.busy;
}

/* An accept succeeded: the next wait is short again. */
void listener_ok(struct listener_backoff *b);

/* How many more files the process may open besides fd, the newest one
 * (fds are handed out lowest first: every lower number is in use). */
unsigned listener_fds_left(int fd);

#endif
