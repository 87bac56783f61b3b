/*
 * moverd/resolver.h - "HOST:PORT" to an address without blocking the
 * io_uring loop.
 *
 * A numeric address resolves at once, in the caller.  A name goes to one
 * helper thread that calls getaddrinfo(3) (which may wait on a DNS server
 * for many seconds) and reports through an eventfd that the loop reads;
 * the loop then calls the owner's function with the result.
 *
 * Requests are known by an id, never by a pointer to their owner: an
 * owner that goes away first simply never claims its id (or cancels it),
 * and a result nobody claims is dropped.
 */
#ifndef MOVERD_RESOLVER_H
#define MOVERD_RESOLVER_H

#include "loop.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Lookups queued or running at once; beyond it, -EAGAIN (retry later).
 * The last RESOLVER_ROOT_RESERVE are root's: names other users' flows
 * give, each waiting on a DNS server that does not answer, cannot hold
 * every slot; and root's queued lookups run before theirs, so that at
 * most the one lookup running is ahead of root's. */
#define RESOLVER_MAX 64u
#define RESOLVER_ROOT_RESERVE 8u

struct resolver;
struct resolver_shared;

struct resolver_result {
	uint64_t id;
	int err;                 /* 0, or a negative errno */
	char why[96];            /* when err: what getaddrinfo said */
	struct sockaddr_storage sa;
	socklen_t len;
};

typedef void (*resolver_fn)(struct resolver *r,
			    const struct resolver_result *res);

/* The loop's side; embed it in its owner (zeroed: not started). */
struct resolver {
	struct loop *loop;
	resolver_fn done;
	struct loop_op op;       /* the read of the eventfd */
	uint64_t count;          /* its buffer */
	uint64_t next_id;
	struct resolver_shared *sh; /* NULL: not started, or stopped */
};

/* Start the thread and keep a read of its eventfd in flight on l.
 * 0 or a negative errno. */
int resolver_start(struct resolver *r, struct loop *l, resolver_fn done);

/*
 * Resolve "HOST:PORT" ("[V6]:PORT" too).  A numeric address: 0 with *out
 * filled now (out->id 0).  A name: -EINPROGRESS with *id set; done() gets
 * the result later on the loop.  Otherwise a negative errno with out->why
 * set: -EINVAL (not HOST:PORT), -EAGAIN (RESOLVER_MAX lookups pending,
 * or all but root's reserve for a lookup not for root), -ENOTCONN (not
 * started).
 */
int resolver_lookup(struct resolver *r, const char *addr, bool for_root,
		    struct resolver_result *out, uint64_t *id);

/* The read of the thread's eventfd, if an arm found no SQE: armed again
 * (called on every loop pass). */
void resolver_rearm(struct resolver *r);

/* Forget lookup id: it is dropped if still queued, ignored if running. */
void resolver_cancel(struct resolver *r, uint64_t id);

/*
 * Stop: done() is never called again.  Does not wait for a getaddrinfo
 * that is still running (it may take seconds): that thread finishes it,
 * then frees what it shares with the loop and exits.
 */
void resolver_stop(struct resolver *r);

/* The synchronous lookup, for start-up (the listen address): may block. */
int resolver_lookup_now(const char *addr, struct resolver_result *out);

#endif
