/*
 * moverd/reg_thread.h - ring memory registered with the RDMA device
 * (ibv_reg_mr) and deregistered (ibv_dereg_mr) in a helper thread, the
 * results reported to the io_uring loop through an eventfd.
 *
 * ibv_reg_mr pins every page of what it registers, faulting in those
 * never touched: tens of milliseconds to seconds for a 64 MiB or 1 GiB
 * ring, during which the loop would move no flow and answer no client.
 * ibv_dereg_mr unpins them again: ~18 ms per GiB in the soft-RoCE guest,
 * times every ring of a connection that closes.  Used for every ring
 * rdma.c registers: producer and consumer rings.  Requests run in the
 * order submitted: a deregistration may wait behind a registration.
 * FLOWMOVER_TEST_REG_HOLD=PATH in the environment makes every request
 * first wait while PATH exists: the tests' stand-in for one that takes
 * long (tests/rdma/reg-offloop.sh).
 * The loop hands a request over (reg_thread_submit) and keeps a read of
 * reg_thread_fd() in flight; once it is readable, reg_thread_take()
 * gives the requests that ended.
 *
 * The thread only calls ibv_reg_mr or ibv_dereg_mr on what a request
 * names: the caller keeps the pages (a flow reference) and the
 * protection domain alive until it has taken the request back.  One lock guards the two lists;
 * neither side holds it while registering or across anything that
 * blocks, so the loop waits at most for a list operation.
 */
#ifndef MOVERD_REG_THREAD_H
#define MOVERD_REG_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ibv_pd;
struct ibv_mr;

enum reg_op {
	REG_OP_REGISTER,    /* pd, addr, len, access in; mr out */
	REG_OP_DEREGISTER,  /* mr in; NULL out once deregistered */
};

struct reg_req {
	struct reg_req *next;     /* the thread's lists' */
	enum reg_op op;
	/* in: what to register (len also what a deregistration frees) */
	struct ibv_pd *pd;
	void *addr;
	size_t len;
	int access;
	/* REGISTER out: the registration, or NULL and an errno.
	 * DEREGISTER in: the registration; out: NULL, or still it and an
	 * errno (ibv_dereg_mr failed: the device may still use its pages).
	 * ECANCELED: the thread stopped before it came to the request (a
	 * registration to undo is still mr).  ns: how long it took. */
	struct ibv_mr *mr;
	int err;
	uint64_t ns;
};

struct reg_thread;

/* Start the thread: NULL with errno set. */
struct reg_thread *reg_thread_start(void);

/* Readable (an eventfd) when a request has ended since the last take. */
int reg_thread_fd(const struct reg_thread *rt);

/* Queue r (op and its `in` part filled); it is the thread's until taken
 * back. */
void reg_thread_submit(struct reg_thread *rt, struct reg_req *r);

/* Take r back if the thread has not started it (true: it is the
 * caller's again, unregistered, and never comes back from
 * reg_thread_take); false: it is under way or ended, and comes back. */
bool reg_thread_cancel(struct reg_thread *rt, struct reg_req *r);

/* The requests that ended, in no particular order (NULL: none). */
struct reg_req *reg_thread_take(struct reg_thread *rt);

/*
 * Stop the thread: the request under way ends first (it cannot be
 * interrupted), those still queued end with ECANCELED.  Returns every
 * request not taken yet; rt is freed.  NULL rt: nothing.
 */
struct reg_req *reg_thread_stop(struct reg_thread *rt);

#endif
