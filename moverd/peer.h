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
#include "listener.h"
#include "loop.h"
#include "resolver.h"

#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct auth_key;
struct peer;
struct peer_allow;
struct peer_reach;
struct transport;

/*
 * How an idle mover learns of new records: io_uring FUTEX_WAITV (Linux
 * 6.7), futex_waitv(2) in a helper thread that writes an eventfd (5.16),
 * or a 1 ms poll.  "auto" takes the first the kernel offers.
 */
enum bell_mode { BELL_URING, BELL_THREAD, BELL_POLL };

struct bell_thread;
struct fr_bell;

/*
 * A doorbell page of one uid (mover.c): a client maps the page of its own
 * uid only, so the bits and the `sleeping` flag it may set or clear are
 * those its own producers ring; no other user's flow waits for the sweep
 * because of it.  A page lives while producers of its uid are attached
 * (root's for good).  BELL_PAGES at most (futex_waitv takes 128 words;
 * the doorbell thread keeps one for itself): with BELL_PAGES - 1 uids'
 * pages in use, the uids past them share one more page, never another
 * uid's own.
 */
#define BELL_PAGES 64u
struct bell_page {
	struct fr_bell *map;
	int fd;
	uid_t uid;          /* whose (none for the shared page) */
	bool shared;        /* the page of the uids past BELL_PAGES - 1 */
	unsigned producers; /* attached producers that were handed it */
	uint64_t id;        /* never reused: how an attachment names it */
};

struct flow_list {
	struct flow *head, *tail;
	unsigned n;
};

#define MOVER_ARMED_MAX 64

struct peer_mgr {
	struct loop *loop;
	struct flow_table *flows;
	/* called by peer_destroy_flow before anything else (peer_opts) */
	void (*flow_gone)(void *arg, struct flow *f);
	void *flow_gone_arg;
	/* may the peer at host (its address, p->host) open receiver flow
	 * name?  0, or a negative errno with why in err (NULL: every peer
	 * may; declared.c, a receiving end's from=) */
	int (*admit)(void *arg, const char *name, const char *host, char *err,
		     size_t cap);
	void *admit_arg;
	const struct transport *tp;   /* for new outbound peers */
	void *rdma;                   /* rdma.c's shared state, or NULL */
	bool rdma_only;               /* --transport rdma: never fall back */
	struct peer *peers;
	int listen_fd;
	char listen_addr[80];
	uint16_t listen_port;     /* ours, said in our hellos (0: none) */
	bool stopping;            /* peer_mgr_stop: no flow moves any more */
	uint64_t instance;        /* this run's, in our hellos (never 0) */
	struct loop_op accept_op;
	struct listener_backoff accept_wait; /* after a failed accept */
	uint64_t timer_due;       /* when peer_timer runs next (peer.c) */
	uint64_t reopen_due;      /* the earliest flow reopen, UINT64_MAX */
	uint64_t police_ns;       /* the last slice of the flow checks */
	uint64_t swept_ns;        /* the last sweep of every flow (busy) */
	uint64_t last_work_ns;
	unsigned rx_deposits;     /* DATA deposited since the last duty cycle:
				   * received records are work, too */
	unsigned rr;              /* round-robin start among flows */

	/* doorbell: the pages producers of sender flows ring, one per uid
	 * (ipc/bell.h, mover.c), and one wait on all their futex words while
	 * the mover sleeps */
	enum bell_mode bell_mode;
	struct loop_op bell_op;   /* the FUTEX_WAITV, or the eventfd read */
	struct bell_page bells[BELL_PAGES];
	unsigned n_bells;
	unsigned bells_unused;    /* pages whose producers all left, to free
				   * once no wait refers to them */
	uint64_t bell_serial;     /* the last page's id */
	struct flow **bell_flows; /* bit -> flow (NULL: free), ours only: one
				   * index a flow, the same in every page */
	uint32_t *bell_free;      /* bits given back, to hand out again */
	unsigned n_bell_free, bell_next;
	struct futex_waitv bell_wait[BELL_PAGES]; /* what the armed wait is on */
	unsigned n_bell_wait;
	struct bell_thread *bell_thread;
	uint64_t bell_count;      /* eventfd read buffer */
	/* flows on the peers' lists, all peers (mover.c, "the active
	 * lists") */
	unsigned n_listed;

	/* who may connect (NULL: anyone) and the key peers must prove
	 * (NULL: insecure, hellos carry no proof); see auth.h */
	const struct peer_allow *allow;
	const struct auth_key *key;
	const struct peer_reach *reach; /* --peer-reachable-at, or NULL */

	/* peers' host names, looked up off the loop (tcp.c, peer_address) */
	struct resolver resolver;
	/* inbound connections (see peer_opts) */
	unsigned max_conns_per_addr, max_pending, max_inbound;
	uint64_t hello_timeout_ns;
	/* a TCP connect of ours that has not completed by then is given up
	 * (tcp.c, tcp_connect) */
	unsigned connect_timeout_s;
	/* outbound connections, in all and counted against one non-root uid
	 * (peer_may_dial) */
	unsigned max_hosts, max_hosts_per_uid;
	/* the connection window's queueing delay target (mover.c) */
	uint64_t win_delay_ns;
	uint64_t refused;         /* closed at accept: over a cap */

	/* sender flows armed and gone idle that no producer rang since:
	 * re-checked behind the heavy fence before a long sleep (mover.c,
	 * "Arming and the heavy fence"); past MOVER_ARMED_MAX, every flow */
	struct flow *armed[MOVER_ARMED_MAX];
	unsigned n_armed;
	bool armed_all;
	uint64_t armed_since_ns;  /* the list became non-empty */

	/* counters for `moverctl status` */
	uint64_t cycles;          /* duty cycles run */
	uint64_t sleeps;          /* idle periods begun with the bell armed */
	uint64_t rings;           /* ... and ended by the doorbell */
	uint64_t ticks;           /* peer timer runs (counters.c) */
};

struct peer_opts {
	const char *listen_addr;  /* "HOST:PORT", NULL or "": not listening */
	const char *transport;    /* "tcp", "rdma" or "auto" (RDMA where a
				   * device exists) */
	const char *doorbell;     /* "auto", "thread" or "poll" */
	/* inbound peers: simultaneous connections from one address, and
	 * connections that have not said hello yet (over either: closed at
	 * accept); seconds a connection has to say hello */
	unsigned max_conns_per_addr;  /* 0: PEER_DEFAULT_PER_ADDR */
	unsigned max_pending;         /* 0: PEER_DEFAULT_PENDING */
	/* inbound peers in all, said hello or not (over it: closed at
	 * accept): each is a struct, buffers, an fd, and a place in every
	 * walk of the peers; one without flows is never closed by us */
	unsigned max_inbound;         /* 0: PEER_DEFAULT_INBOUND */
	unsigned hello_timeout_s;     /* 0: PEER_DEFAULT_HELLO_S */
	/* outbound peers: seconds a TCP connect may take (a host that drops
	 * our SYNs would hold it for the kernel's ~2 min) */
	unsigned connect_timeout_s;   /* 0: PEER_DEFAULT_CONNECT_S */
	/* outbound peers: connections we dial, in all (the last few kept
	 * for root), and those one non-root uid's flows may make */
	unsigned max_hosts;           /* 0: PEER_DEFAULT_HOSTS */
	unsigned max_hosts_per_uid;   /* 0: PEER_DEFAULT_HOSTS_PER_UID */
	/* the queueing delay, above a link's least round trip, that cuts
	 * its connection window (mover.c) */
	unsigned window_delay_us;     /* 0: PEER_DEFAULT_WINDOW_DELAY_US */
	const struct peer_allow *allow; /* --peer-allow, NULL: anyone */
	const struct auth_key *key;     /* --peer-key, NULL: none */
	/* --peer-reachable-at: addresses besides a connection's own that
	 * an initiator may have dialed (NAT, forwarding); NULL: none */
	const struct peer_reach *reach;
	/* a flow is being destroyed (peer_destroy_flow): the control plane
	 * forgets its attachments.  A callback, so that the peer side does
	 * not depend on the control socket (control.c calls peer.c). */
	void (*flow_gone)(void *arg, struct flow *f);
	void *flow_gone_arg;
};

#define PEER_DEFAULT_PER_ADDR 8u
#define PEER_DEFAULT_PENDING  64u
/* twice the hosts we dial: a peer host needs one connection, two while
 * a reconnect overlaps a dying link */
#define PEER_DEFAULT_INBOUND  512u
#define PEER_DEFAULT_HELLO_S  10u
#define PEER_DEFAULT_CONNECT_S 10u
/* 256: the counters file's peer records (FMC_PEER_RECS), and far more
 * hosts than one daemon's flows go to in a real cluster; 32 per user:
 * more than FANOUT_MAX_PEERS, so one user's flow may always fan out */
#define PEER_DEFAULT_HOSTS    256u
#define PEER_DEFAULT_HOSTS_PER_UID 32u
/* of --peer-max-hosts, kept for root (at most half) */
#define PEER_ROOT_RESERVE     16u
#define PEER_DEFAULT_WINDOW_DELAY_US 1000u

/* Pick the transport and doorbell, listen, start the timer. */
int peer_mgr_start(struct peer_mgr *m, struct loop *l, struct flow_table *t,
		   const struct peer_opts *o);
void peer_mgr_stop(struct peer_mgr *m);
/* After the loop's last turn: join the helper threads that hold flow
 * references (the RDMA registration thread), undo what they still had. */
void peer_mgr_fini(struct peer_mgr *m);

/*
 * The peer timer: heartbeats' and hellos' deadlines, reconnections,
 * reopens, and a slice of the flow checks (ring files, orphans, the
 * doorbell sweep).  The loop calls peer_timer after every loop_run_once
 * (it runs only when due) and sleeps at most peer_timer_ms(max_ms): the
 * ms until the next deadline, at most max_ms (-1: no cap), at least 1.
 */
void peer_timer(struct peer_mgr *m, uint64_t now);

/* Ops an arm found no SQE for (loop_sqe NULL): the peer port's accept,
 * the resolver's read.  Armed again; called on every loop pass (RDMA's
 * event channels: rdma_tick). */
void peer_rearm(struct peer_mgr *m);
int peer_timer_ms(struct peer_mgr *m, int max_ms);
bool peer_mgr_busy(struct peer_mgr *m);

/*
 * May a flow of uid's go to addr ("HOST:PORT")?  0 if a connection it
 * would ride exists (sender_peer), or one more may be dialed; else
 * a negative errno with a sentence in err: -ENOSPC over
 * --peer-max-hosts (root has the last PEER_ROOT_RESERVE), -EDQUOT over
 * --peer-max-hosts-per-uid (a uid other than root).  Asked by the control plane before a flow
 * create or peer add names an address; flows that exist already
 * (re-adopted, declared, rejoining) are not refused.
 */
int peer_may_dial(struct peer_mgr *m, const char *addr, uid_t uid, char *err,
		  size_t cap);

/* A sender flow was created or re-adopted: connect and open it. */
int peer_add_sender(struct peer_mgr *m, struct flow *f);

/*
 * Destroy a flow, the one way every path does it (moverctl, the sender's
 * CLOSE, shutdown, expiry): forget its attachments (peer_opts.flow_gone),
 * tell its peer (a sender's CLOSE; for a receiver flow, `why` if not
 * NULL), take it off its connection, and drop the table's reference
 * (flows_destroy).
 */
void peer_destroy_flow(struct peer_mgr *m, struct flow *f, const char *why);

/*
 * An orderly stop (issue 15): not a destroy.  Forget f's attachments,
 * take it off its connection without telling the peer anything (the link
 * simply goes down, as at a crash), and let the table's reference go with
 * the ring and its files intact (flows_let_go): the next start re-adopts.
 */
void peer_let_go_flow(struct peer_mgr *m, struct flow *f);

/* For `moverctl status`: fills up to max entries, returns the count. */
struct peer_status {
	const char *address;
	const char *state;
	const char *transport;
	unsigned flows;
	uint64_t bytes_sent, bytes_received;
	uint32_t reconnects;
	uint32_t registrations;      /* flow rings registered (RDMA) */
	uint64_t registered_bytes;
	const char *node;            /* as the peer named itself (filtered) */
	const char *key_id;          /* the key it proved, "" without */
	bool authenticated;
	uint64_t window, unacked;    /* the connection window (mover.c) */
	const char *last_error;      /* why it last failed ("" never) */
	uint64_t last_error_unix_ms;
	const char *last_error_flow; /* the flow it names ("" none) */
	const struct peer_stats *st; /* frames, ack times (stats.h) */
	const struct peer *peer;     /* which (flows' f->peer), opaque */
};
/* Up to max connections' status into out, those that carry flows first;
 * *total: how many there are. */
unsigned peer_status(const struct peer_mgr *m, struct peer_status *out,
		     unsigned max, unsigned *total);

/* May a connection from sa come in at all (--peer-allow)?  Asked at
 * accept, before anything is allocated for it; the caller logs (rate-
 * limited), counts and closes or rejects. */
bool peer_allowed(const struct peer_mgr *m, const struct sockaddr *sa);

#endif
