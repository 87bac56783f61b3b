/*
 * moverd/peer_impl.h - what the peer protocol (peer.c), the mover
 * (mover.c) and a transport (tcp.c, rdma.c) share: the peer's state and
 * the calls between them.
 *
 * The protocol builds each send as a list of frames in p->tx_iov: a
 * 32-byte header (wire.h) followed, for DATA, by one or two spans of the
 * producer ring (two at the wrap).  A byte-stream transport sends them as
 * they are; a memory transport (RDMA) would write each DATA span at
 * hdr.pos of the peer's registered ring and send only the headers.  On the
 * receiving side the transport delivers headers to peer_rx_header(), which
 * says where a body goes (p->ctrl_buf or p->rx_iov: the consumer ring),
 * and completed bodies to peer_rx_body(); or it hands whatever bytes it
 * received to peer_rx_stream(), which does both as the bytes allow.
 */
#ifndef MOVERD_PEER_IMPL_H
#define MOVERD_PEER_IMPL_H

#include "auth.h"
#include "peer.h"
#include "peer_allow.h"
#include "wire.h"

#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define TX_MAX_IOV     192
#define BATCH_MAX      (2u << 20)   /* high watermark of one send */
#define FLOW_QUANTUM   (512u << 10) /* per flow per send */

/*
 * Records one span walks at most.  Its bytes are bounded by the budget,
 * but the first flow of a batch may take a record larger than the window,
 * and a client may fill that with 16-byte pads (a peer, a deposit:
 * count_deposited): 64 Mi of them on a 1 GiB ring, 0.2 s of the event loop
 * per send.  2^17 records pass a 2 MiB batch of the smallest data records
 * (32 bytes) whole; a run cut here goes on in the next duty cycle.
 */
#define SPAN_MAX_RECORDS (1u << 17)
#define TICK_MS        20            /* the timer's period for RDMA
				      * device checks and a delayed END */
#define POLICE_NS      1000000000ull /* a round of the flow checks */
#define HEARTBEAT_NS   1000000000ull
#define DEAD_NS        5000000000ull
#define STUCK_CHECK_NS 100000000ull
#define CTRL_BATCH_MAX (512u << 10)
/* A peer that does not read its replies is dropped, not buffered for: */
#define CTRLQ_MAX_BYTES  (1u << 20)  /* control frames queued for it */
#define CTRLQ_MAX_FRAMES 4096u
#define SEND_DEADLINE_NS 10000000000ull /* a send in flight this long */
#define REOPEN_NS      100000000ull /* retry an open answered -EAGAIN */
#define REOPEN_MAX_NS  60000000000ull /* ... at most this long after */
#define SHORT_MAX_NS   5000000000ull /* ... a receiver short of room:
					 * backoff from REOPEN_NS up to this */
/* A byte-stream receive between bodies reads up to this much: a header
 * with a small record's body and the acknowledgements behind it come in
 * one system call; of a large body at most this much is copied, and the
 * rest is received straight into the consumer ring (tcp.c). */
#define RX_STAGE       2048u
/* open files a new inbound peer must leave free (for control clients,
 * flows and outbound peers): past that it is refused at accept */
#define PEER_FD_RESERVE 64u
/*
 * A connection we dialed that has had no flow for this long is closed and
 * freed (peer_timer): every distinct "HOST:PORT" a flow names gets a
 * connection of its own (sender_peer), and one kept for ever after its
 * last flow went would let a user who creates and destroys flows to ever
 * new addresses hold moverd's open files until it has none (security.md,
 * --peer-max-hosts).  A few seconds: a flow destroyed and created again to
 * the same peer (a script, a unit restarting its producer) finds the link
 * up and authenticated, and an idle link costs one fd and a struct peer,
 * which the caps bound, so lingering longer buys little.  As long as
 * DEAD_NS: a link that silent would be given up on anyway.
 */
#define PEER_LINGER_NS 5000000000ull

struct ctrl_frame {
	struct ctrl_frame *next;
	size_t len;
	uint8_t buf[];
};

enum peer_state { PEER_DOWN, PEER_CONNECTING, PEER_UP, PEER_CLOSING };

struct held_open; /* peer.c */

struct peer {
	struct peer_mgr *m;
	struct peer *next;
	char addr[80];
	/* who the peer is, for the receiver flows it opens (each is bound to
	 * its creator's identity, flows.h: origin): its address without the
	 * port, set by peer_up; the hello's authentication replaces it with
	 * "NODE key KEYID" (auth_done) */
	char identity[128];
	/* the peer host its receiver flows are charged to (the quotas,
	 * flows.h: origin_host): the address it came from, or the one we
	 * reached it at, numeric, IPv4 as IPv4.  Not identity: the node name
	 * there is only what the peer says, proven or not.  Set by peer_up. */
	char host[FLOW_HOST_MAX + 1];
	bool outbound;
	enum peer_state state;
	/* outbound: when its last flow went (unlink_flow; 0 while it has
	 * flows), for PEER_LINGER_NS; and the uid it counts against for
	 * --peer-max-hosts-per-uid: the owner of the flow that made it, then
	 * of one that still rides it (peer_may_dial) */
	uint64_t idle_since_ns;
	uid_t uid;
	/* it said a valid hello (outbound: we did; the acceptor never
	 * does).  Until then only a hello or heartbeats are accepted, and
	 * only until the hello deadline. */
	bool hello_ok;
	uint64_t connected_ns;
	/*
	 * The authenticated hello (auth.h): until auth_ok only HELLO, AUTH
	 * and heartbeats are taken; no flow, ring or registration exists for
	 * the connection.  Initiator: hello (nonce_mine), the responder's
	 * hello checked, our proof sent: auth_ok.  Responder: the hello
	 * answered with ours and our proof, the initiator's proof checked:
	 * auth_ok.  Without keys the hellos alone do it.
	 */
	bool auth_ok;
	bool hello_seen;          /* its hello came (a second one fails) */
	char auth_fail[300];      /* refuse once our answer is sent */
	/* why its last connection failed or closed, or the last connect or
	 * lookup failed (peer_note_error), and when (unix ms; 0: never),
	 * kept once it is up again: `moverctl status` shows it */
	char last_error[200];
	uint64_t last_error_unix_ms;
	/* the flow last_error names ("" none; peer_fail_flow): a user who
	 * may not see that flow is not shown the text */
	char last_error_flow[FLOW_NAME_MAX + 1];
	uint8_t nonce_mine[AUTH_NONCE_BYTES], nonce_theirs[AUTH_NONCE_BYTES];
	char node[256];           /* its node name as sent (the proofs') */
	char node_safe[65];       /* the same, printable only */
	char key_id[AUTH_ID_CHARS + 1]; /* the key it proved, "" without */
	/* the address the initiator dialed, which both proofs cover:
	 * outbound, ours (p->sa); inbound, its word once checked against
	 * ours (dialed_mismatch), or where it really reached when not */
	char dialed[ENDPOINT_CHARS];
	/* inbound: the initiator listens on this port at the address it
	 * came from and takes our sender flows on this connection (its
	 * hello; 0: it does not).  See inbound_from in peer.c. */
	uint16_t listen_port;
	/* the run of moverd at the other end (its hello; 0: an older one),
	 * and whether we close this connection for another to that run
	 * (merge_duplicate in peer.c) */
	uint64_t instance;
	bool twin_tags;          /* its hello: it refuses twins itself */
	bool retiring;
	/* the address of a connection of ours that was closed for this one
	 * (retired): sender flows to that address come here ("" none) */
	char alias[80];
	/* inbound: it carried that daemon's own flows when it failed
	 * (reset_flows), so that daemon dials again (rehome_senders) */
	bool carried_theirs;
	const struct transport *tp;
	void *tp_data;            /* the transport's per-connection state */
	int fd;
	/* conn_tmo_op: the linked timeout of a TCP connect (tcp.c), an op
	 * of its own with a completion of its own */
	struct loop_op conn_op, conn_tmo_op, rd_op, wr_op;
	struct __kernel_timespec conn_ts;
	/* the last TCP connect's failure, as said (0: none since the last
	 * connection): logged again only when it changes (tcp.c) */
	int conn_err;
	/* its name failed to resolve, and has not resolved since: said
	 * once, not at every retry (tcp.c, resolve_failed) */
	bool unresolved;
	struct flow *flows;
	unsigned n_flows;         /* in p->flows (link_flow, unlink_flow) */
	/* those of its flows the duty cycle visits (mover.c, "the active
	 * lists") */
	struct flow_list active, owing;
	/* p->flows by id for the frames that name one (peer_flow_by_id):
	 * chains of id_next, at least as many as flows (NULL: none could be
	 * had, the list is walked).  The walk of 10 000 flows for every
	 * DATA frame and ACK held 10 busy flows to ~75% (issue 12). */
	struct flow **by_id;
	unsigned by_id_mask;      /* buckets - 1 */
	/* OPENs that wait for their ring's registration (open_flow said
	 * -EINPROGRESS), one per flow at most: at most as many as the flows
	 * this peer may open; dropped when the connection closes */
	struct held_open *held;

	/* receive: a header, then its body (see peer_rx_header) */
	uint8_t hdr_buf[WIRE_HDR];
	size_t hdr_have, body_have;
	struct wire_hdr hdr;
	bool in_body;
	uint8_t *ctrl_buf;
	struct flow *rx_flow;     /* referenced (flow_get) while receiving */
	bool rx_discard;          /* a DATA body nobody takes: read, drop */
	struct iovec rx_iov[2];   /* where a DATA body goes in the ring */
	struct iovec rx_cur[2];   /* what the receive in flight still fills */
	struct msghdr rx_msg;
	/* a byte-stream transport's receive between bodies (tcp.c): the next
	 * header, and the small body and further frames already behind it */
	uint8_t rx_stage[RX_STAGE];
	bool rx_staged;           /* the receive in flight is into rx_stage */

	/* send */
	struct ctrl_frame *ctrlq, **ctrlq_tail, *tx_ctrl;
	size_t ctrlq_bytes;
	unsigned ctrlq_frames;
	bool ctrlq_overflow;      /* a reply was refused: drop the peer */
	bool ctrlq_nomem;         /* a control frame could not be had: the
				   * link starts over (its flows reopen and
				   * resume) rather than lose the frame */
	uint8_t tx_hdr[TX_MAX_IOV][WIRE_HDR];
	struct iovec tx_iov[TX_MAX_IOV];
	unsigned tx_niov, tx_first, tx_nhdr;
	struct msghdr tx_msg;
	struct sockaddr_storage sa; /* connect: the peer's resolved address */
	socklen_t sa_len;

	/* the flows whose rings the send in flight reads (referenced) */
	struct flow *tx_flows[TX_MAX_IOV];
	unsigned n_tx_flows;
	unsigned tx_faults;       /* EFAULTs of the send in flight (peer_tx_fault) */

	/* the connection window (mover.c): DATA bytes of sender flows sent
	 * on this connection and not yet acknowledged, and how many may be;
	 * the window shrinks when acknowledgements show a queue and grows
	 * back when they do not */
	uint64_t unacked, window;
	uint64_t win_cut_ns;      /* the last cut (one per round trip) */
	uint64_t win_counted_ns;  /* the last exact count (win_room) */
	uint64_t rtt_base_ns, rtt_base_at_ns; /* the least recent round trip */

	uint64_t last_rx_ns, last_tx_ns, retry_at_ns;
	unsigned backoff_ms;
	uint64_t bytes_tx, bytes_rx;
	uint32_t reconnects;
	struct peer_stats st;     /* for the counters file (stats.h) */

	/* outbound: the lookup of addr in flight (0: none), and whether sa
	 * holds the answer of one that has just ended (see peer_address) */
	uint64_t lookup_id;
	bool sa_fresh;
};

#define CONTAINER(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

static inline struct fr_ring *ring_of(struct flow *f)
{
	return &f->view->ring;
}

/* A transport moves the frames of one peer connection. */
struct transport {
	const char *name;
	/* the connection holds bytes the peer has not read yet (TCP's socket
	 * buffers), a queue the connection window bounds (mover.c); RDMA
	 * WRITEs land in the consumer's ring, and nothing queues there */
	bool byte_queue;
	int (*listen)(struct peer_mgr *m, const char *addr);
	void (*stop_listening)(struct peer_mgr *m);
	/* start connecting p (outbound): later peer_up() or peer_closed */
	void (*connect)(struct peer *p);
	/* post p->tx_iov[tx_first..tx_niov): later peer_sent() or peer_fail() */
	void (*send)(struct peer *p);
	/* arm the next receive per p's receive state */
	void (*recv)(struct peer *p);
	/* make every op in flight complete (the connection is going) */
	void (*shutdown)(struct peer *p);
	void (*close)(struct peer *p);
	/* optional, for transports that poll completions (RDMA): */
	int (*poll)(struct peer_mgr *m);          /* work done */
	bool (*arm)(struct peer_mgr *m);          /* false: work pending */
	/* a receiver flow opens on p: let the peer write its ring.  0
	 * (raddr, rkey: for the OPENED answer), a negative errno, or
	 * -EINPROGRESS: the ring is being registered (RDMA, off the loop),
	 * and peer_flow_prepared() follows */
	int (*open_flow)(struct peer *p, struct flow *f, uint64_t *raddr,
			 uint32_t *rkey);
	/* optional: may the mover send sender flow f's records on p now?
	 * false: not yet (RDMA: its ring is being registered; the mover is
	 * woken for f once it is, mover_wake_flow) */
	bool (*flow_ready)(struct peer *p, struct flow *f);
	/* f leaves p (destroyed, failed, or moved to another connection);
	 * a receiver's f->rx_refused: its sender was told so on p and may
	 * still write what it sent before it heard */
	void (*forget_flow)(struct peer *p, struct flow *f);
	/* optional: the sender closed its flow flow_id on p (a CLOSE): what
	 * it wrote for it before has landed */
	void (*flow_closed)(struct peer *p, uint32_t flow_id);
	/* ring memory registered with the device (count, bytes) */
	void (*registered)(const struct peer *p, uint32_t *n, uint64_t *bytes);
	/* optional: p's hello authenticated it (what a stranger may not have
	 * before: RDMA's buffers); may fail p */
	void (*authenticated)(struct peer *p);
	/* the connection's local address (the responder's end): false if
	 * it cannot be had */
	bool (*local_addr)(struct peer *p, struct sockaddr_storage *sa);
	/* optional: when bytes last came from p (fr_now_ns clock), though
	 * no receive completed (TCP: a large body received whole); 0: not
	 * known */
	uint64_t (*last_bytes_ns)(struct peer *p, uint64_t now);
};

/* The connection window (mover.c): fresh when a connection comes up; an
 * acknowledgement of `bytes` that ends a timed round trip of rtt_ns (0:
 * none). */
void mover_window_reset(struct peer *p);
void mover_acked(struct peer *p, uint64_t bytes, uint64_t rtt_ns);

extern const struct transport tcp_transport;
extern const struct transport rdma_transport;

/* The RDMA transport can run here (a device exists and it initialised). */
bool rdma_available(struct peer_mgr *m);
/* On the peer timer (every TICK_MS while RDMA is in use): the device's
 * removal, seen and handled. */
void rdma_tick(struct peer_mgr *m, uint64_t now);
/* Ring registrations are in flight on the registration thread. */
bool rdma_busy(const struct peer_mgr *m);
/* At shutdown, after the loop: join the registration thread, undo what
 * it still had. */
void rdma_stop(struct peer_mgr *m);

/* "HOST:PORT" to an address (getaddrinfo); 0 or a negative errno.  May
 * block on DNS: for start-up (the listen address) only, never the loop. */
int peer_resolve(const char *addr, struct sockaddr_storage *sa,
		 socklen_t *len);

/* Start the resolver thread that peer_address hands host names to. */
int peer_resolver_start(struct peer_mgr *m);

/* The peer port's accept, the resolver's read: armed again if an arm
 * found no SQE (peer_rearm). */
void tcp_rearm(struct peer_mgr *m);

/*
 * Outbound p's address in p->sa without blocking the loop: 0 (a numeric
 * address, or the answer of a lookup that has just ended); -EINPROGRESS
 * while the resolver thread looks the name up (its answer calls
 * p->tp->connect again); or another negative errno (p's flows say why, a
 * retry is set).
 */
int peer_address(struct peer *p);

/* protocol side, called by transports */
/* May one more inbound connection from host (numeric) come in?  NULL,
 * or why not (a cap of peer_opts).  Ask before allocating anything. */
const char *peer_admit(const struct peer_mgr *m, const char *host);
struct peer *peer_new(struct peer_mgr *m, const char *addr, bool outbound,
		      const struct transport *tp);
struct flow *peer_flow_by_id(struct peer *p, uint32_t id, enum flow_role r);
void peer_up(struct peer *p);
void peer_fail(struct peer *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* peer_fail for a reason that names f (status shows it only to those who
 * may see f). */
void peer_fail_flow(struct peer *p, const struct flow *f, const char *fmt,
		    ...) __attribute__((format(printf, 3, 4)));
/* Keep why as p's last error (status, the counters file). */
void peer_note_error(struct peer *p, const char *why);
/* The other end closed the connection (a failure if flows use it). */
void peer_hung_up(struct peer *p, const char *why);
void peer_sent(struct peer *p);     /* the whole send went */
/* The send failed with EFAULT (a client shrank a ring file it reads):
 * true to post the rest again (the flows whose files shrank are repaired
 * and failed), false to fail the peer. */
bool peer_tx_fault(struct peer *p);
void peer_rx_header(struct peer *p); /* may fail the peer */
void peer_rx_body(struct peer *p);
/* The registration open_flow left in progress for receiver flow f on p
 * ended: 0 (f's ring is registered on p), or an errno (ECANCELED: the
 * flow went meanwhile).  The OPEN that waited for it is answered: opened,
 * or refused.  Called while p's connection is open, never after. */
void peer_flow_prepared(struct peer *p, struct flow *f, int err);
/* Sender flow f cannot send on its connection for now (RDMA: its ring
 * could not be registered there): f alone waits, then opens again (why:
 * for `flow show`); the connection and its other flows go on. */
void peer_sender_wait(struct flow *f, const char *why);
/* A receive of a DATA body into its ring failed with EFAULT (a client
 * shrank the ring file): fail that flow only and read the rest of the
 * body into nowhere; false if the receive was not into a ring. */
bool peer_rx_fault(struct peer *p);
/* received bytes of a byte stream: headers and bodies as they come */
void peer_rx_stream(struct peer *p, const uint8_t *b, size_t n);
/* where the rest of the current DATA body goes in the consumer ring (from
 * body_have on): one or two pieces of p->rx_iov; returns how many */
unsigned peer_body_rest(const struct peer *p, struct iovec rest[2]);

/* protocol side, called by the mover (mover.c) */
unsigned flow_count(const struct peer *p);
void reap_peers(struct peer_mgr *m);
/* a sender flow's producer ring is corrupt: fail it, tell the receiver */
void fail_sender(struct flow *f, const char *why);
/* take sender flow f off its connection, telling the peer to close it
 * (failed: why it failed there, or NULL: a plain close; cut: f's
 * subscription was cut by max_lag) - fanout.c */
void peer_close_sender(struct flow *f, const char *failed, bool cut);
/* take sender flow f off its connection without a word to the peer (moverd
 * stops: the flow lives on in the next moverd) - fanout.c */
void peer_detach_sender(struct flow *f);
/* ask the peer to open sender flow f again at `at` (it answered busy) */
void peer_reopen_at(struct peer_mgr *m, struct flow *f, uint64_t at);
/* a client set FR_FLAG_FAILED on a flow between hosts; why: the sentence */
bool ring_marked_failed(struct flow *f, char *why, size_t cap);
/* a receiver flow's consumer position, checked (false: the flow failed) */
bool consumer_head(struct peer *p, struct flow *f, uint64_t *head);

/* mover side, called by the protocol (peer_mgr_start) */
void bell_use_thread(struct peer_mgr *m);

#endif
