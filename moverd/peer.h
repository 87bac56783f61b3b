/*
 * moverd/peer.h - flows between hosts over TCP: one connection per pair of
 * daemons, shared by every flow between them, driven by the io_uring loop.
 *
 * The sender scans its producer rings for committed records and writes
 * them straight from shared memory (sendmsg of ring segments: no copy in
 * moverd); the receiver reads each DATA payload straight into the consumer
 * ring at the same offsets, publishes it and acknowledges.  Producer-ring
 * space is released only by that acknowledgement.  On a lost link the
 * sender's flows reconnect and resume from what the consumer ring has
 * published: nothing lost, nothing duplicated.
 */
#ifndef MOVERD_PEER_H
#define MOVERD_PEER_H

#include "flows.h"
#include "loop.h"

#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>

struct ctl_server;
struct peer;
struct transport;

struct peer_mgr {
	struct loop *loop;
	struct flow_table *flows;
	struct ctl_server *ctl;
	const struct transport *tp;   /* for new outbound peers */
	void *rdma;                   /* rdma.c's shared state, or NULL */
	struct peer *peers;
	int listen_fd;
	char listen_addr[80];
	struct loop_op accept_op, tick_op;
	struct __kernel_timespec tick_ts;
	uint64_t last_work_ns;
	unsigned rr;              /* round-robin start among flows */

	/* doorbell: one FUTEX_WAITV on the data futex of every open sender
	 * flow's producer ring, so that an idle moverd sleeps and a producer's
	 * commit wakes it (see peer_prepare_sleep) */
	struct loop_op bell_op;
	struct futex_waitv bell[128];
	unsigned n_bell;
	uint64_t bell_sig;        /* which rings the armed doorbell watches */
	bool bell_unsupported;
};

/* Listen on addr ("HOST:PORT", NULL = no listening) and start the timer. */
/* transport: "tcp", "rdma" or "auto" (RDMA where a device exists) */
int peer_mgr_start(struct peer_mgr *m, struct loop *l, struct flow_table *t,
		   struct ctl_server *ctl, const char *listen_addr,
		   const char *transport);
void peer_mgr_stop(struct peer_mgr *m);
bool peer_mgr_busy(struct peer_mgr *m);

/* A sender flow was created or re-adopted: connect and open it. */
int peer_add_sender(struct peer_mgr *m, struct flow *f);

/* The flow is about to be destroyed: tell the peer (sender) and unlink. */
void peer_forget_flow(struct peer_mgr *m, struct flow *f);

/*
 * The mover's duty cycle: move committed records of sender flows, return
 * acknowledgements and credits of receiver flows.  Returns the amount of
 * work done (0 = idle), so the loop can decide between polling and sleep.
 */
int peer_do_work(struct peer_mgr *m);

/*
 * The mover found no work for a while: set the "consumer sleeps" flag of
 * every open sender flow's producer ring and arm the doorbell.  Returns
 * the loop timeout in ms: 0 if data arrived meanwhile, 1000 with the
 * doorbell armed, 1 where the kernel has no FUTEX_WAITV for io_uring.
 */
int peer_prepare_sleep(struct peer_mgr *m);
/* Awake again: clear those flags so producers stop making wake calls. */
void peer_woke(struct peer_mgr *m);

/* For `moverctl status`: fills up to max entries, returns the count. */
struct peer_status {
	const char *address;
	const char *state;
	const char *transport;
	unsigned flows;
	uint64_t bytes_sent, bytes_received;
	uint32_t reconnects;
};
unsigned peer_status(const struct peer_mgr *m, struct peer_status *out,
		     unsigned max);

#endif
