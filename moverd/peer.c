/*
 * moverd/peer.c - what peers say to each other: connections between
 * daemons, the hello and its authentication, flow open/opened/close, the
 * control queue, receiving, failure and reconnection, the peer timer.
 *
 * A peer is one connection to another moverd, shared by every flow
 * between the two, in both directions where both proved the key
 * (inbound_from).  Each peer has at most one send and one receive in
 * flight on the io_uring loop:
 *
 *   send: built by the mover (mover.c: control frames, acknowledgements,
 *         data), posted by the transport, completed in peer_sent.
 *   recv: a 32-byte header, then its payload: into a control buffer, or
 *         for DATA straight into the consumer ring at the same offsets.
 *
 * Everything a peer sends is validated: unknown flows, positions outside
 * the window, sizes that do not fit, bad magic or version close that
 * connection with a logged reason; other peers and flows go on.
 */
#include "backoff.h"
#include "peer_impl.h"
#include "ring_guard.h"
#include "lattrace.h"
#include "bell_thread.h"
#include "eos.h"
#include "fanout.h"
#include "mover.h"
#include "log.h"
#include "peer_allow.h"

#include "ctl_frame.h"
#include "flowmover.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- peers and their flows ---------------------------------------------- */

struct peer *peer_new(struct peer_mgr *m, const char *addr, bool outbound,
		      const struct transport *tp)
{
	struct peer *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->m = m;
	p->tp = tp;
	p->fd = -1;
	p->outbound = outbound;
	p->backoff_ms = 100;
	p->ctrlq_tail = &p->ctrlq;
	p->idle_since_ns = fr_now_ns(); /* until its first flow links */
	snprintf(p->addr, sizeof(p->addr), "%s", addr);
	p->next = m->peers;
	m->peers = p;
	return p;
}

/* Is addr ("HOST:PORT") from host? */
static bool same_host(const char *addr, const char *host)
{
	const char *colon = strrchr(addr, ':');
	size_t n = colon ? (size_t)(colon - addr) : strlen(addr);

	return n == strlen(host) && !memcmp(addr, host, n);
}

const char *peer_admit(const struct peer_mgr *m, const char *host)
{
	unsigned same = 0, pending = 0, inbound = 0;

	/* closing ones count too: they hold their fd until reaped */
	for (const struct peer *p = m->peers; p; p = p->next) {
		if (p->outbound)
			continue;
		inbound++;
		same += same_host(p->addr, host);
		pending += !p->hello_ok;
	}
	if (same >= m->max_conns_per_addr)
		return "too many connections from this address";
	if (pending >= m->max_pending)
		return "too many connections waiting for their hello";
	if (inbound >= m->max_inbound)
		return "too many inbound peer connections "
		       "(--peer-max-inbound)";
	return NULL;
}

/* ---- p->flows by id ------------------------------------------------------ */

/* Sender ids count up; a receiver's come from the peer, which has at most
 * --peer-max-flows here, so no chain can be made long. */
static struct flow **id_bucket(const struct peer *p, uint32_t id)
{
	return &p->by_id[(id ^ (id >> 16)) & p->by_id_mask];
}

static void ids_add(struct peer *p, struct flow *f)
{
	struct flow **b = id_bucket(p, f->id);

	f->id_next = *b;
	*b = f;
}

/* Twice the buckets (16 at first), every flow of p in them again; false
 * if they cannot be had (the table keeps its size, or there is none). */
static bool ids_grow(struct peer *p)
{
	unsigned n = p->by_id ? (p->by_id_mask + 1) * 2 : 16;
	struct flow **b = calloc(n, sizeof(*b));

	if (!b)
		return false;
	free(p->by_id);
	p->by_id = b;
	p->by_id_mask = n - 1;
	for (struct flow *f = p->flows; f; f = f->peer_next)
		ids_add(p, f);
	return true;
}

static void ids_remove(struct peer *p, struct flow *f)
{
	for (struct flow **pp = id_bucket(p, f->id); *pp;
	     pp = &(*pp)->id_next) {
		if (*pp == f) {
			*pp = f->id_next;
			break;
		}
	}
	f->id_next = NULL;
}

static void link_flow(struct peer *p, struct flow *f)
{
	p->n_flows++;
	p->idle_since_ns = 0;
	f->peer = p;
	f->transport = p->tp->name;
	f->peer_next = p->flows;
	p->flows = f;
	if (p->by_id && p->n_flows <= p->by_id_mask + 1)
		ids_add(p, f);
	else if (!ids_grow(p) && p->by_id)
		ids_add(p, f); /* a table that cannot grow takes it anyway */
	/* (grown: f is in it; no table at all: peer_flow_by_id walks) */
}

static void unlink_flow(struct flow *f)
{
	struct peer *p = f->peer;

	if (!p)
		return;
	for (struct flow **pp = &p->flows; *pp; pp = &(*pp)->peer_next) {
		if (*pp == f) {
			*pp = f->peer_next;
			p->n_flows--;
			if (p->by_id)
				ids_remove(p, f);
			break;
		}
	}
	mover_unlist(p->m, f);
	if (!p->n_flows)
		p->idle_since_ns = fr_now_ns(); /* PEER_LINGER_NS from now */
	else if (p->outbound && f->owner_uid == p->uid)
		p->uid = p->flows->owner_uid; /* a user who has gone from the
					       * link is not charged for it */
	f->peer = NULL;
	f->peer_next = NULL;
	if (f->role == FLOW_RECEIVER) /* off its sender's connection */
		f->orphaned_ns = fr_now_ns(); /* for --orphan-timeout */
}

/* Take f off its peer's connection: no longer reachable from it, and
 * (RDMA) its ring no longer registered there. */
static void detach_flow(struct flow *f)
{
	struct peer *p = f->peer;

	if (!p)
		return;
	if (p->tp->forget_flow)
		p->tp->forget_flow(p, f);
	unlink_flow(f);
}

struct flow *peer_flow_by_id(struct peer *p, uint32_t id, enum flow_role r)
{
	if (p->by_id) {
		for (struct flow *f = *id_bucket(p, id); f; f = f->id_next)
			if (f->id == id && f->role == r)
				return f;
		return NULL;
	}
	for (struct flow *f = p->flows; f; f = f->peer_next)
		if (f->id == id && f->role == r)
			return f;
	return NULL;
}

unsigned flow_count(const struct peer *p)
{
	return p->n_flows; /* the counters read it every pass: not a walk */
}

static bool peer_io_busy(const struct peer *p)
{
	return p->rd_op.busy || p->wr_op.busy || p->conn_op.busy ||
	       p->conn_tmo_op.busy;
}

/* The send completed (or the connection ended): let go of its rings. */
static void tx_release(struct peer *p)
{
	while (p->n_tx_flows) {
		struct flow *f = p->tx_flows[--p->n_tx_flows];

		if (!--f->tx_inflight)
			fanout_sends_done(f);
		flow_put(f);
	}
}

/* The receive into rx_flow completed (or the connection ended). */
static void rx_release(struct peer *p)
{
	struct flow *f = p->rx_flow;

	p->rx_flow = NULL;
	p->rx_discard = false;
	if (!f)
		return;
	if (f->rx_peer == p)
		f->rx_peer = NULL;
	flow_put(f);
}

/* ---- control frames ------------------------------------------------------ */

static void free_frames(struct ctrl_frame *fr)
{
	while (fr) {
		struct ctrl_frame *n = fr->next;
		free(fr);
		fr = n;
	}
}

/*
 * Append a control frame (O(1)).  The queue is bounded: a peer that keeps
 * asking without reading the answers is dropped (at the top of its next
 * send, see tx_build: never from inside a handler that still uses p).
 */
static int queue_ctrl(struct peer *p, Flowmover__PeerMsg *msg)
{
	size_t body = protobuf_c_message_get_packed_size(&msg->base);
	struct ctrl_frame *fr;

	if (p->ctrlq_frames >= CTRLQ_MAX_FRAMES ||
	    p->ctrlq_bytes + WIRE_HDR + body > CTRLQ_MAX_BYTES) {
		p->ctrlq_overflow = true;
		return -ENOBUFS;
	}
	fr = malloc(sizeof(*fr) + WIRE_HDR + body);
	if (!fr) { /* callers go on: the link is dropped at the next send */
		p->ctrlq_nomem = true;
		return -ENOMEM;
	}
	fr->next = NULL;
	fr->len = WIRE_HDR + body;
	wire_put(fr->buf, WIRE_CTRL, 0, (uint32_t)body, 0, 0);
	protobuf_c_message_pack(&msg->base, fr->buf + WIRE_HDR);
	*p->ctrlq_tail = fr;
	p->ctrlq_tail = &fr->next;
	p->ctrlq_bytes += fr->len;
	p->ctrlq_frames++;
	return 0;
}

static void ctrlq_clear(struct peer *p)
{
	free_frames(p->ctrlq);
	p->ctrlq = NULL;
	p->ctrlq_tail = &p->ctrlq;
	p->ctrlq_bytes = 0;
	p->ctrlq_frames = 0;
}

static const char *node_name(void)
{
	static char host[65];

	if (!host[0] && gethostname(host, sizeof(host) - 1))
		strcpy(host, "?");
	return host;
}

/*
 * Our hello: with a key, our nonce and key id, and (responder) our proof
 * over the initiator's nonce, ours and both names.  The responder's
 * answer goes even when it already knows it will refuse (a key on one
 * side only, another key): the initiator learns why from it.
 */
static void queue_hello(struct peer *p)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;
	const struct auth_key *k = p->m->key;
	uint8_t proof[AUTH_PROOF_BYTES];

	hello.version = WIRE_VERSION;
	hello.node = (char *)node_name();
	if (k) {
		hello.key_id = (char *)k->id;
		hello.nonce = (ProtobufCBinaryData){ sizeof(p->nonce_mine),
						     p->nonce_mine };
	}
	if (k && p->dialed[0])
		hello.dialed = p->dialed;
	if (k && !p->outbound && !p->auth_fail[0]) {
		auth_proof(k, AUTH_RESPONDER, p->nonce_theirs, p->nonce_mine,
			   p->node, node_name(), p->dialed, proof);
		hello.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	}
	if (p->outbound)
		hello.listen_port = p->m->listen_port;
	hello.instance = p->m->instance;
	hello.twin_tags = true;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
	msg.hello = &hello;
	queue_ctrl(p, &msg);
}

/*
 * Subscription f's tag in its opens (PeerFlowOpen sub_tag): the same
 * across reconnections and restarts, another for each peer address of a
 * fan-out flow.  The receiver tells by it the same subscription coming
 * back on a new connection (it takes the flow) from another subscription
 * of the same flow that leads there too, two names of one host (it
 * refuses it, twin_of).  The receiver decides, for only it knows where
 * the flow is: a sender that judged by the instances its peers say was
 * told another's instance by a hostile peer, and ended that other peer's
 * subscription.  FNV-1a of the address; never 0.
 */
static uint64_t sub_tag(const struct flow *f)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (const char *c = f->peer_addr; *c; c++)
		h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
	return h ? h : 1;
}

/*
 * Open sender flow f on p.  False if f's subscription ended instead: p is
 * an older moverd, which cannot tell a twin subscription (twin_of) and
 * would let it take the flow from the other, whose frames then went
 * nowhere; for it the sender judges, by the instance p's hello said
 * (fanout_twin).  That ends only the subscription on p, p's own word.
 * f may be off p's list on return.
 */
static bool queue_open(struct peer *p, struct flow *f)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowOpen op = FLOWMOVER__PEER_FLOW_OPEN__INIT;
	const struct flow *twin = p->twin_tags ? NULL : fanout_twin(f, p);
	struct fr_ring *r = ring_of(f);

	f->reopen_at_ns = 0; /* this open supersedes a scheduled one */
	if (twin) {
		fanout_lost_twin(f, twin);
		return false;
	}
	op.sub_tag = sub_tag(f);
	op.name = f->name;
	op.flow_id = f->id;
	op.ring_size = r->size;
	op.max_record = r->max_record;
	op.seal_key = r->key;
	op.start = f->acked;
	op.after_cut = f->rejoining;
	/* owner and allowed ids stay unset: uids are this host's numbers,
	 * and the receiving host decides who reads there (handle_open) */
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_OPEN;
	msg.open = &op;
	queue_ctrl(p, &msg);
	flows_set_state(f, f->state == FLOW_OPEN ? FLOW_CONNECTING : f->state,
			"waiting for the peer to open the flow");
	return true;
}

/* Sender flow f goes on p, and opens now if p is up and authenticated
 * (else once it is: queue_opens).  Returns whether it opens now. */
static bool link_sender(struct peer *p, struct flow *f)
{
	link_flow(p, f);
	if (p->state != PEER_UP || !p->auth_ok || f->state == FLOW_FAILED)
		return false;
	return queue_open(p, f);
}

static void queue_answer(struct peer *p, Flowmover__PeerFlowOpened *op)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;

	msg.body_case = FLOWMOVER__PEER_MSG__BODY_OPENED;
	msg.opened = op;
	queue_ctrl(p, &msg);
}

/* The flow is open: send from resume, the consumer is at head. */
static void queue_opened(struct peer *p, uint32_t id, uint64_t resume,
			 uint64_t head, uint64_t raddr, uint32_t rkey)
{
	Flowmover__PeerFlowOpened op = FLOWMOVER__PEER_FLOW_OPENED__INIT;

	op.flow_id = id;
	op.resume = resume;
	op.head = head;
	op.raddr = raddr;
	op.rkey = rkey;
	queue_answer(p, &op);
}

/* An open refused, or the flow failed or gone here (error < 0, why);
 * with -EAGAIN, retry_ms says when asking again may pass (0: soon); with
 * -EALREADY, twin_tag which subscription has the flow here. */
static void queue_refused_twin(struct peer *p, uint32_t id, int error,
			       const char *message, uint32_t retry_ms,
			       uint64_t twin_tag)
{
	Flowmover__PeerFlowOpened op = FLOWMOVER__PEER_FLOW_OPENED__INIT;

	op.flow_id = id;
	op.error = error;
	op.message = (char *)message;
	op.retry_ms = retry_ms;
	op.twin_tag = twin_tag;
	queue_answer(p, &op);
}

static void queue_refused(struct peer *p, uint32_t id, int error,
			  const char *message, uint32_t retry_ms)
{
	queue_refused_twin(p, id, error, message, retry_ms, 0);
}

/* ---- failure and reconnection ------------------------------------------- */

/* The connection failed over a frame of flow `over` ("" none): the other
 * flows on it, whose reason their own users read (`flow show`), are not
 * told that flow's name (peer_fail_flow). */
static const char *reason_for(const struct flow *f, const char *over,
			      const char *why)
{
	if (!over[0] || !strcmp(f->name, over))
		return why;
	return "the connection failed over another flow on it (moverctl "
	       "status, to an operator, says which and why)";
}

static void reset_flows(struct peer *p, const char *over, const char *why)
{
	for (struct flow *f = p->flows, *n; f; f = n) {
		n = f->peer_next;
		/* a closed connection's lists are visited no more; the tick
		 * would look at them for nothing until it is up again */
		mover_unlist(p->m, f);
		f->st.reconnects++;
		if (f->role == FLOW_SENDER) {
			/* unacknowledged data goes again after the resume */
			f->sent = f->acked;
			f->st.rtt_t0 = 0; /* that send is not timed */
			if (f->state != FLOW_FAILED)
				flows_set_state(f, FLOW_RECONNECTING,
						reason_for(f, over, why));
		} else {
			/* one failed here (fail_receiver) whose sender's
			 * CLOSE never came stays failed: back, the sender is
			 * refused with the reason (handle_open), where a
			 * reopen put it back to open on a failed ring */
			if (f->state != FLOW_FAILED)
				flows_set_state(f, FLOW_RECONNECTING, "waiting "
						"for the sender to reconnect");
			unlink_flow(f);
			p->carried_theirs = true;
		}
	}
	p->unacked = 0; /* nothing is in flight on a connection gone */
}

static struct peer *sender_peer(struct peer_mgr *m, struct flow *f);

/*
 * An inbound connection is gone with our sender flows that rode it
 * (inbound_from): each goes to another connection from the same daemon,
 * or back to one of its own, where it resumes from what was acknowledged
 * (reset_flows).  If the connection carried flows of the daemon that
 * opened it, that daemon dials again, and its connection takes ours too
 * (adopt_waiting): a connection of our own then waits REHOME_GRACE_NS
 * before it dials, where dialing at once would race that daemon's and
 * leave two (a daemon killed and restarted by systemd, say, is back
 * within that).  Otherwise ours dials at once.  Not while moverd stops:
 * they stay off any connection.
 */
#define REHOME_GRACE_NS 5000000000ull

static void rehome_senders(struct peer *p)
{
	struct peer_mgr *m = p->m;
	uint64_t at = fr_now_ns() + (p->carried_theirs ? REHOME_GRACE_NS : 0);

	while (p->flows) {
		struct flow *f = p->flows;
		struct peer *to;
		bool fresh;

		unlink_flow(f);
		if (m->stopping || f->role != FLOW_SENDER ||
		    f->state == FLOW_FAILED)
			continue;
		if (!(to = sender_peer(m, f))) {
			flows_set_state(f, FLOW_RECONNECTING, "out of memory "
					"for a peer connection");
			continue;
		}
		fresh = to->outbound && to->state == PEER_DOWN && !to->flows;
		if (!link_sender(to, f) && fresh)
			to->retry_at_ns = at; /* the peer timer dials then */
	}
	if (at < m->timer_due)
		m->timer_due = at;
}

static void peer_host(const struct peer *p, char *out, size_t cap);
static bool parse_ip(const char *host, size_t n, struct in6_addr *out);

/* v4 as an IPv4-mapped IPv6 address, the one form addresses compare in. */
static void v4_mapped(struct in6_addr *out, const struct in_addr *v4)
{
	memset(out, 0, sizeof(*out));
	out->s6_addr[10] = out->s6_addr[11] = 0xff;
	memcpy(&out->s6_addr[12], v4, sizeof(*v4));
}

/* Where p's daemon listens: for a connection we dialed, the address we
 * connected to (resolved); for one it opened, the address it came from
 * and the port its hello says.  IPv4 as IPv4-mapped.  false: unknown. */
static bool peer_endpoint(const struct peer *p, struct in6_addr *ip,
			  unsigned *port)
{
	const struct sockaddr_in6 *s6 = (const void *)&p->sa;
	const struct sockaddr_in *s4 = (const void *)&p->sa;
	char host[sizeof(p->addr)];

	if (!p->outbound) {
		peer_host(p, host, sizeof(host));
		*port = p->listen_port;
		return *port && parse_ip(host, strlen(host), ip);
	}
	if (p->sa.ss_family == AF_INET6) {
		*ip = s6->sin6_addr;
		*port = ntohs(s6->sin6_port);
		return true;
	}
	if (p->sa.ss_family != AF_INET)
		return false;
	v4_mapped(ip, &s4->sin_addr);
	*port = ntohs(s4->sin_port);
	return true;
}

/*
 * Is q an authenticated connection that stays, on p's transport, to the
 * same run of moverd as p: the same instance (the hellos), and the same
 * address and port where that daemon listens (peer_endpoint)?  The
 * address too, so that a key holder who says another daemon's instance
 * gains no more than by claiming a port on its own host (security.md).
 */
static bool same_run(const struct peer *q, const struct peer *p)
{
	struct in6_addr ip_p, ip_q;
	unsigned port_p, port_q;

	if (q == p || !p->instance || q->instance != p->instance ||
	    q->state != PEER_UP || !q->auth_ok || q->retiring ||
	    q->tp != p->tp)
		return false;
	return peer_endpoint(p, &ip_p, &port_p) &&
	       peer_endpoint(q, &ip_q, &port_q) && port_p == port_q &&
	       !memcmp(&ip_p, &ip_q, sizeof(ip_p));
}

/* Our sender flows on from go to to, and open there (it is up and
 * authenticated): each resumes from what was acknowledged. */
static void move_senders(struct peer *from, struct peer *to)
{
	while (from->flows) {
		struct flow *f = from->flows;

		detach_flow(f); /* RDMA: its registration goes with from */
		link_sender(to, f);
	}
}

/* ---- opens that wait for their ring's registration ---------------------- */

/*
 * An OPEN whose consumer ring the transport registers off the loop
 * (open_flow: -EINPROGRESS, RDMA) has done everything else when it is
 * held: its checks passed, and the flow is made, or taken from any other
 * connection, as at the moment it came (so that a CLOSE of the old
 * connection that follows it no longer finds the flow there).  Only the
 * answer waits, on no connection, until the registration ends
 * (peer_flow_prepared).  The entry holds its flow, so that the
 * registration's end finds it.
 */
struct held_open {
	struct held_open *next;
	struct flow *flow;       /* referenced */
	uint32_t flow_id;        /* the sender's */
};

static void held_free(struct held_open *h)
{
	flow_put(h->flow);
	free(h);
}

/* Take p's held open of flow f, or (id not NULL) of that flow id. */
static struct held_open *held_take(struct peer *p, const struct flow *f,
				   const uint32_t *id)
{
	for (struct held_open **pp = &p->held; *pp; pp = &(*pp)->next) {
		struct held_open *h = *pp;

		if (h->flow == f || (id && h->flow_id == *id)) {
			*pp = h->next;
			return h;
		}
	}
	return NULL;
}

/* p's held open of flow f, left on the list (NULL: none). */
static struct held_open *held_find(const struct peer *p, const struct flow *f)
{
	struct held_open *h = p->held;

	while (h && h->flow != f)
		h = h->next;
	return h;
}

/* The connection closed: no answer will go.  The flows that waited stay
 * on no connection, and wait for their sender (--orphan-timeout). */
static void held_drop_all(struct peer *p)
{
	while (p->held) {
		struct held_open *h = p->held;

		p->held = h->next;
		held_free(h);
	}
}

/* p leaves the list of peers; nothing refers to it any more. */
static void peer_free(struct peer *p)
{
	for (struct peer **pp = &p->m->peers; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	held_drop_all(p);
	/* its lookup, still queued, would hold a slot for nobody */
	resolver_cancel(&p->m->resolver, p->lookup_id);
	free(p->ctrl_buf);
	free(p->by_id);
	free(p);
}

/*
 * A connection we retired (merge_duplicate): its sender flows go to the
 * connection to the same moverd that stays, if it is still there;
 * otherwise they wait on p and dial again, as after a cut.
 */
static void retired(struct peer *p)
{
	p->retiring = false;
	for (struct peer *q = p->m->peers; q; q = q->next) {
		if (same_run(q, p)) {
			log_info("peer %s: its flows move to the connection %s",
				 p->addr, q->addr);
			move_senders(p, q);
			snprintf(q->alias, sizeof(q->alias), "%s", p->addr);
			return;
		}
	}
}

/*
 * The connection is finished and no op is in flight: clean up.  A peer
 * of ours with flows waits to dial again; one without flows goes, as an
 * inbound one does, so that `moverctl status` lists no connection that
 * nothing will use.
 */
static void peer_closed(struct peer *p)
{
	p->tp->close(p);
	held_drop_all(p); /* after close: no registration reports to p now */
	ctrlq_clear(p);
	free_frames(p->tx_ctrl);
	p->tx_ctrl = NULL;
	p->ctrlq_overflow = p->ctrlq_nomem = false;
	p->tx_niov = p->tx_first = p->tx_nhdr = 0;
	p->hdr_have = p->body_have = 0;
	p->in_body = false;
	p->auth_ok = false; /* the next connection proves itself again */
	/* no op is in flight any more: what they referred to may go */
	rx_release(p);
	tx_release(p);
	if (p->outbound && p->retiring)
		retired(p);
	if (p->outbound && p->flows) {
		p->state = PEER_DOWN;
		p->retry_at_ns = fr_now_ns() + p->backoff_ms * 1000000ull;
		if (p->backoff_ms < 2000)
			p->backoff_ms *= 2;
		return;
	}
	if (!p->outbound)
		rehome_senders(p);
	peer_free(p);
}

/*
 * Free (inbound, or ours without flows) or reset (ours) every closing
 * peer with nothing in flight, and free a peer of ours that is down and
 * lost its last flow meanwhile (destroyed, or moved by adopt_waiting).
 * Only here, at the top of the duty cycle: never inside a completion
 * handler, which may still hold the peer.
 */
void reap_peers(struct peer_mgr *m)
{
	for (struct peer *p = m->peers, *n; p; p = n) {
		n = p->next;
		if (p->state == PEER_CLOSING && !peer_io_busy(p)) {
			peer_closed(p);
		} else if (p->outbound && p->state == PEER_DOWN && !p->flows) {
			p->tp->close(p); /* what a failed attempt left */
			ctrlq_clear(p);
			peer_free(p);
		}
	}
}

/* Close p's connection, failed over a frame of flow `over` ("" none);
 * its flows wait (reset_flows), it goes or is reset once no op is in
 * flight (reap_peers). */
static void close_over(struct peer *p, const char *over, const char *why)
{
	reset_flows(p, over, why);
	if (p->state == PEER_UP)
		p->reconnects++;
	p->state = PEER_CLOSING;
	p->tp->shutdown(p);
}

static void peer_close(struct peer *p, const char *why)
{
	close_over(p, "", why);
}

void peer_note_error(struct peer *p, const char *why)
{
	snprintf(p->last_error, sizeof(p->last_error), "%s", why);
	p->last_error_unix_ms = flows_unix_ms();
	p->last_error_flow[0] = '\0';
}

static void vfail(struct peer *p, const struct flow *f, const char *fmt,
		  va_list ap)
{
	static struct log_limit lim; /* a peer can fail at will */
	char why[200];

	if (p->state == PEER_CLOSING || p->state == PEER_DOWN)
		return;
	vsnprintf(why, sizeof(why), fmt, ap);
	log_limited(&lim, LOG_LVL_WARN, "peer %s: %s: disconnecting", p->addr,
		    why);
	peer_note_error(p, why);
	if (f)
		snprintf(p->last_error_flow, sizeof(p->last_error_flow), "%s",
			 f->name);
	close_over(p, p->last_error_flow, why);
}

void peer_fail(struct peer *p, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(p, NULL, fmt, ap);
	va_end(ap);
}

void peer_fail_flow(struct peer *p, const struct flow *f, const char *fmt,
		    ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(p, f, fmt, ap);
	va_end(ap);
}

/*
 * The other end closed the connection.  With flows on it that is a
 * failure (peer_fail: a warning, the flows wait).  Without, it is that
 * moverd stopping or closing a link it no longer uses: said at info, and
 * not kept as the peer's last error.
 */
void peer_hung_up(struct peer *p, const char *why)
{
	char hint[200];

	if (p->state == PEER_CLOSING || p->state == PEER_DOWN)
		return;
	/* a responder answers every hello with its own, even one it will
	 * refuse (wrong key): a hang-up before it is a turn-away at the
	 * door (peer_admit) or a peer that stopped */
	if (p->outbound && !p->hello_seen) {
		snprintf(hint, sizeof(hint), "%s before the peer's hello: it "
			 "turned the connection away (its log says why) or "
			 "stopped", why);
		why = hint;
	}
	if (p->flows) {
		peer_fail(p, "%s", why);
		return;
	}
	log_info("peer %s: %s (no flows on it): disconnecting", p->addr, why);
	peer_close(p, why);
}

/* ---- sending ------------------------------------------------------------- */

void peer_sent(struct peer *p)
{
	free_frames(p->tx_ctrl);
	p->tx_ctrl = NULL;
	p->tx_niov = p->tx_first = p->tx_nhdr = 0;
	p->tx_faults = 0;
	tx_release(p);
}

/*
 * A receiver flow's consumer ring holds an impossible word: fail that flow
 * only (its consumer gets -EPROTO) and tell its sender why; the link and
 * every other flow on it go on.
 */
static void fail_receiver(struct peer *p, struct flow *f, const char *why)
{
	flows_fail(f, why);
	if (p && p->state == PEER_UP)
		queue_refused(p, f->id, -EPROTO, f->reason, 0);
}

/*
 * A sender flow's producer ring holds an impossible word (or a client
 * resized its file): fail that flow only (its producers get -EPROTO) and
 * tell the receiver, which fails its flow too, so that its consumer gets
 * -EPROTO instead of waiting for records that will never come.  A peer
 * that is down hears nothing: its flow expires (--orphan-timeout).
 */
void fail_sender(struct flow *f, const char *why)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowClose cl = FLOWMOVER__PEER_FLOW_CLOSE__INIT;

	flows_fail(f, why);
	if (!f->peer || f->peer->state != PEER_UP)
		return;
	cl.name = f->name;
	cl.flow_id = f->id;
	cl.failed = f->reason;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_CLOSE;
	msg.close = &cl;
	queue_ctrl(f->peer, &msg);
}

/* A client resized the flow's ring file: fail it, tell its peer. */
static void fail_tampered(struct flow *f, const char *why)
{
	if (f->role == FLOW_SENDER) {
		fail_sender(f, why);
		return;
	}
	flows_fail(f, why);
	if (f->role != FLOW_RECEIVER || !f->peer)
		return;
	queue_refused(f->peer, f->id, -EIO, why, 0);
	f->rx_refused = true;
	detach_flow(f); /* its DATA in flight is read and dropped */
}

/* The ring of first (a flow, not a fan-out sibling) was changed by a
 * client: it fails, and so does every sibling, which reads the same ring
 * (each peer host's receiver is told). */
static void fail_ring(struct flow *first, const char *why)
{
	fail_tampered(first, why);
	for (struct flow *s = first->fanout; s; s = s->fanout_next)
		if (s->state != FLOW_FAILED)
			fail_tampered(s, why);
}

/* How often one send may fault before its peer is failed: a client that
 * keeps shrinking the file could otherwise hold the link in a loop. */
#define TX_FAULTS_MAX 4u
#define PAGE_BYTES    4096u

/* Read a byte of every page of [base, base + len): one past the end of a
 * shrunk file trips the guard of its mapping (ring_guard.h), which puts
 * anonymous memory there, so a send posted again cannot fault on it
 * however often the client shrinks the file again. */
static void touch_pages(const uint8_t *base, size_t len)
{
	uintptr_t a = (uintptr_t)base, end = a + len;

	/* relaxed: a probe, nothing is ordered by it */
	for (; a < end; a = (a | (PAGE_BYTES - 1)) + 1)
		(void)atomic_load_explicit((const _Atomic uint8_t *)a,
					   memory_order_relaxed);
}

/* Zeros to send in place of a failed flow's bytes: read-only anonymous
 * memory, never written, so it costs address space only.  Made at the
 * first fault and kept: any peer's send may refer to it.  NULL if it
 * cannot be made. */
static const uint8_t *zero_bytes(void)
{
	static void *z;

	if (!z) {
		z = mmap(NULL, WIRE_SPAN_MAX, PROT_READ, MAP_PRIVATE |
			 MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (z == MAP_FAILED) {
			z = NULL;
			return NULL;
		}
	}
	return z;
}

/* Does a part of the send at b come from f's ring (its own mapping)? */
static bool from_ring(struct flow *f, const void *b)
{
	const uint8_t *lo;

	if (!f->view)
		return false;
	lo = ring_of(f)->data;
	return (const uint8_t *)b >= lo &&
	       (const uint8_t *)b < lo + ring_of(f)->size;
}

/* The send in flight takes zeros where it took f's ring (its flow failed:
 * its receiver is told, and finds no record in them): a client that
 * shrinks the file again after the repair cannot make it fault again. */
static void zero_sent(struct peer *p, struct flow *f)
{
	const uint8_t *z = zero_bytes();

	for (unsigned k = p->tx_first; z && k < p->tx_niov; k++)
		if (from_ring(f, p->tx_iov[k].iov_base))
			p->tx_iov[k].iov_base = (void *)z;
}

/* Touch what the send in flight takes from f's ring. */
static void touch_sent(struct peer *p, struct flow *f)
{
	for (unsigned k = p->tx_first; k < p->tx_niov; k++)
		if (from_ring(f, p->tx_iov[k].iov_base))
			touch_pages(p->tx_iov[k].iov_base,
				    p->tx_iov[k].iov_len);
}

/*
 * The kernel's copy out of a producer ring faulted: a client shrank the
 * ring file under a record whose header moverd had read (ring_guard.h:
 * moverd's own touch would be SIGBUS, the kernel's is EFAULT).  Nothing of
 * that call went, but the frames before it may have, so the stream can
 * only go on with the bytes it promised: each flow of the send whose file
 * changed size is repaired (the shrunk part reads as zeros again) and
 * failed, its receiver told after this send, and the send posted again.
 * Only that flow's records can carry zeros (its consumer finds no valid
 * seal in them); the link and every other flow go on.  A client that
 * puts the size back first leaves nothing to repair; the send is posted
 * again all the same, up to TX_FAULTS_MAX times.  Each flow's part of the
 * send is touched first (touch_sent): a page still past the file's end
 * trips its guard, so the check sees it even if the client puts the size
 * back meanwhile.  A failed flow's part is then sent as zeros (zero_sent):
 * the repair maps the file again, and a client that shrank it again after
 * each repair got the link failed at the fifth fault, every flow on it
 * reconnecting (a review).
 */
bool peer_tx_fault(struct peer *p)
{
	char why[200];

	if (++p->tx_faults > TX_FAULTS_MAX)
		return false;
	for (unsigned i = 0; i < p->n_tx_flows; i++) {
		struct flow *f = p->tx_flows[i];
		/* a sibling reads its first flow's ring file */
		struct flow *first = flow_first(f);

		if (f->state != FLOW_OPEN)
			continue;
		touch_sent(p, f);
		if (flows_ring_tampered(first, why, sizeof(why)))
			fail_ring(first, why);
	}
	for (unsigned i = 0; i < p->n_tx_flows; i++)
		if (p->tx_flows[i]->state == FLOW_FAILED)
			zero_sent(p, p->tx_flows[i]);
	return true;
}

/*
 * Did a client mark the ring of a flow between hosts failed?  Only
 * moverd's verdict (flows_fail) may set FR_FLAG_FAILED: a client that sets
 * it has made every end of the ring see -EPROTO, so the flow is over on
 * both hosts, not only for the clients of this one.  why: the sentence.
 */
bool ring_marked_failed(struct flow *f, char *why, size_t cap)
{
	uint32_t flags;

	if (f->role == FLOW_LOCAL || f->state == FLOW_FAILED || !f->view)
		return false;
	/* relaxed: one word, read once; nothing else is read after it */
	flags = atomic_load_explicit(&ring_of(f)->sh->flags,
				     memory_order_relaxed);
	if (!(flags & FR_FLAG_FAILED))
		return false;
	if (!flows_verdict(f, why, cap)) /* else a client's doing */
		snprintf(why, cap, "a client marked the ring failed (flags "
			 "%#x)", (unsigned)flags);
	return true;
}

/*
 * The consumer's position in a receiver flow's ring, checked against what
 * moverd recorded before it is used or sent to the peer: a consumer moves
 * forward only, and never past what moverd published.  Anything else is
 * the consumer's own ring corrupting: its flow fails, nothing else.
 */
bool consumer_head(struct peer *p, struct flow *f, uint64_t *head)
{
	char why[160];

	/* the slowest consumer's position (ring format 2: the minimum of
	 * the subscribers' slots), never below what we relied on before */
	if (!fr_refresh_head(ring_of(f), NULL)) {
		*head = ring_of(f)->head_cache;
		if (*head >= f->reported_head && *head <= f->sent)
			return true;
	} else {
		*head = fr_min_pos(ring_of(f));
	}
	snprintf(why, sizeof(why), "the consumer's position %llu is outside "
		 "[%llu, %llu] (moved back, or past what was delivered)",
		 (unsigned long long)*head, (unsigned long long)f->reported_head,
		 (unsigned long long)f->sent);
	fail_receiver(p, f, why);
	return false;
}

/* ---- receiving ----------------------------------------------------------- */

/*
 * Do committed records run from head exactly up to pub?  Asked at a
 * re-adopted receiver's first open, where `published` is the ring's word
 * alone (what this run published is known only after): a consumer that
 * moved it while moverd was down (past what was deposited, or off the
 * record grid) would have the sender skip records it never sent.  Records
 * forged along with it pass: the trust a ring's consumers have in each
 * other (docs/security.md).  One walk of the unread part of the ring, once
 * per restart, on the loop: of at most REACH_WALK_MAX records (a ring of
 * small records unread would otherwise hold every flow's data for the
 * walk of tens of millions of headers); past them `published` is taken
 * unchecked if the records go on.
 */
#define REACH_WALK_MAX (1u << 20)

static bool records_reach(const struct fr_ring *r, uint64_t head,
			  uint64_t pub)
{
	uint64_t end, more, n = 0;
	bool stuck;

	if (fr_scan_records_max(r, head, pub, REACH_WALK_MAX, &end, &stuck,
				&n) || stuck)
		return false;
	if (end == pub)
		return true;
	/* short of pub without an error: the walk's bound, if a record
	 * goes on from there within pub; else one that crosses pub */
	return !fr_scan_records_max(r, end, pub, 1, &more, &stuck, &n) &&
	       more > end;
}

/*
 * records_reach once per restart for published pub: a walk of up to
 * REACH_WALK_MAX headers on the loop is not the price of an OPEN (a peer
 * may send one refused open after another).  Walked again only if pub
 * moved since (moverd has not published since the restart: a client
 * moved it).
 */
static bool walked_to(struct flow *f, const struct fr_ring *r, uint64_t head,
		      uint64_t pub)
{
	if (f->rx_walked && f->rx_walked_pub == pub)
		return true;
	if (!records_reach(r, head, pub))
		return false;
	log_debug("flow %s: its records from %llu end at published %llu "
		  "(checked once after the restart)", f->name,
		  (unsigned long long)head, (unsigned long long)pub);
	f->rx_walked = true;
	f->rx_walked_pub = pub;
	return true;
}

/*
 * A peer opens a receiver flow that exists here (the sender reconnected,
 * or moverd restarted and re-adopted it).  The flow moves to connection p.
 * A receive of another connection may still be in flight into its ring:
 * that connection is dropped and the open answered -EAGAIN until its
 * receive is reaped (the sender retries), so two connections never write
 * the same ring.  0, or a negative errno with a sentence in err.
 */
static int reopen_receiver(struct peer *p, struct flow *f,
			   const Flowmover__PeerFlowOpen *op, char *err,
			   size_t cap)
{
	struct fr_ring *r = ring_of(f);
	uint64_t pub, head;

	if (r->size != op->ring_size || r->key != op->seal_key ||
	    r->max_record != op->max_record) {
		snprintf(err, cap, "flow '%s' exists here with another ring",
			 f->name);
		return -EEXIST;
	}
	if (f->rx_peer && f->rx_peer != p) {
		peer_fail_flow(f->rx_peer, f, "flow %s: opened again by %s "
			       "while a receive into it was in flight",
			       f->name, p->addr);
		snprintf(err, cap, "flow '%s' is busy on an older connection; "
			 "retry", f->name);
		return -EAGAIN;
	}
	/* acquire: what moverd published (and the consumer's position) */
	pub = atomic_load_explicit(&r->sh->published, memory_order_acquire);
	head = fr_min_pos(r);
	if (head < r->head_cache) /* a joining subscriber, see ring.h */
		head = r->head_cache;
	if (head > pub || pub - head > r->size || pub % FR_ALIGN) {
		snprintf(err, cap, "the consumer ring of '%s' is corrupt "
			 "(published %llu, consumer %llu)", f->name,
			 (unsigned long long)pub, (unsigned long long)head);
		fail_receiver(NULL, f, err);
		return -EPROTO;
	}
	if (f->rx_pos_known && pub != f->sent) {
		/* moverd alone publishes; a consumer moved it (forward, the
		 * sender would skip records it never sent; back, it would
		 * send them again) */
		snprintf(err, cap, "the consumer ring of '%s' is corrupt "
			 "(published %llu, moverd published %llu)", f->name,
			 (unsigned long long)pub, (unsigned long long)f->sent);
		fail_receiver(NULL, f, err);
		return -EPROTO;
	}
	/* the ring's own check first (a corrupt ring fails here, whatever
	 * the sender says); once per restart, however often opens come */
	if (!f->rx_pos_known && !walked_to(f, r, head, pub)) {
		snprintf(err, cap, "the consumer ring of '%s' is corrupt (its "
			 "records from %llu do not end at published %llu)",
			 f->name, (unsigned long long)head,
			 (unsigned long long)pub);
		fail_receiver(NULL, f, err);
		return -EPROTO;
	}
	if (pub < op->start) {
		snprintf(err, cap, "the consumer ring of '%s' lost data the "
			 "sender had acknowledged", f->name);
		return -EPROTO;
	}
	if (pub - op->start > r->size) {
		/* a sender sends at most a ring beyond what it has had
		 * acknowledged (start): a consumer moved published, its own
		 * position with it, while moverd was down (an empty walk
		 * above) */
		snprintf(err, cap, "the consumer ring of '%s' is corrupt "
			 "(published %llu, more than a ring beyond the %llu "
			 "its sender had acknowledged)", f->name,
			 (unsigned long long)pub,
			 (unsigned long long)op->start);
		fail_receiver(NULL, f, err);
		return -EPROTO;
	}
	detach_flow(f);
	f->rx_refused = false; /* on p now: told nothing there yet */
	f->rx_pos_known = true;
	f->sent = pub;
	f->reported_head = head;
	f->st.resumes++;
	return 0;
}

/*
 * A receiver flow is bound to the identity of the peer that created it:
 * another peer may not open or resume it (it would write into the
 * consumer's ring, or take the flow from its sender).  0, or -EEXIST
 * with a sentence in err and a logged reason.  A flow re-adopted from a
 * state file written before flows had an origin is bound to the first
 * peer that opens it.
 */
/* A peer's host: its address without the port (which changes with every
 * connection) and without an IPv6 address's brackets. */
static void peer_host(const struct peer *p, char *out, size_t cap)
{
	const char *colon = strrchr(p->addr, ':');
	int n = colon ? (int)(colon - p->addr) : (int)strlen(p->addr);

	if (n > 2 && p->addr[0] == '[' && p->addr[n - 1] == ']')
		snprintf(out, cap, "%.*s", n - 2, p->addr + 1);
	else
		snprintf(out, cap, "%.*s", n, p->addr);
}

/*
 * A flow made before this host had a key is bound to its sender's
 * address.  A peer that proved the key, from that same address, takes it
 * over under its key identity (keys are being introduced); no one else
 * can: without the key no peer is authenticated while one is set.
 */
static bool upgrades_origin(const struct peer *p, const struct flow *f)
{
	char addr[sizeof(f->origin)];

	if (!p->key_id[0] || strstr(f->origin, " key "))
		return false;
	peer_host(p, addr, sizeof(addr));
	if (strcmp(f->origin, addr))
		return false;
	log_info("flow %s: bound to peer '%s' (was its address %s)", f->name,
		 p->identity, addr);
	return true;
}

/* f's peer resumes it, maybe from another address (a flow re-adopted
 * from an older state file is charged to its identity until now): it is
 * charged to where its peer is now. */
static void charge_host(struct peer *p, struct flow *f)
{
	if (!strcmp(f->origin_host, p->host))
		return;
	snprintf(f->origin_host, sizeof(f->origin_host), "%s", p->host);
	flows_save_owed(f, "its peer's address");
}

static int check_origin(struct peer *p, struct flow *f, char *err, size_t cap)
{
	static struct log_limit lim; /* a peer can ask at will */
	char so[LOG_SAFE_BUF], si[LOG_SAFE_BUF];

	if (!f->origin[0] || upgrades_origin(p, f)) {
		snprintf(f->origin, sizeof(f->origin), "%s", p->identity);
		snprintf(f->origin_host, sizeof(f->origin_host), "%s",
			 p->host);
		flows_save_owed(f, "its peer's identity");
		return 0;
	}
	if (!strcmp(f->origin, p->identity)) {
		charge_host(p, f);
		return 0;
	}
	snprintf(err, cap, "flow '%s' exists on this host and belongs to "
		 "another peer", f->name);
	/* identities hold the node name a peer sent in its hello */
	log_limited(&lim, LOG_LVL_WARN, "peer %s: refused to open flow '%s': "
		    "it belongs to peer '%s', not to '%s'", p->addr, f->name,
		    log_safe(f->origin, so, sizeof(so)),
		    log_safe(p->identity, si, sizeof(si)));
	return -EEXIST;
}

/* A new receiver flow: its owner is this host's choice, never the peer's
 * (--peer-flow-owner; the ids in op mean nothing here and are ignored).
 * kept: the allowed ids of the incarnation it replaces (NULL: none). */
static int create_receiver(struct peer *p, const Flowmover__PeerFlowOpen *op,
			   const struct flow_ids *kept, struct flow **out,
			   uint32_t *retry_ms, char *err, size_t cap)
{
	const struct flow_limits *l = &p->m->flows->limits;
	const uint32_t group = l->peer_flow_gid;
	struct flow_spec spec = {
		.name = op->name, .role = FLOW_RECEIVER,
		.ring_size = op->ring_size, .max_record = op->max_record,
		.seal_key = op->seal_key, .start = op->start,
		.origin = p->identity,
		.origin_host = p->host, /* the quotas: never the node name */
		.allow_gids = &group, .n_allow_gids = l->peer_flow_group,
		.retry_ms = retry_ms,
	};

	if (kept) {
		spec.allow_uids = kept->uids;
		spec.n_allow_uids = kept->n_uids;
		spec.allow_gids = kept->gids;
		spec.n_allow_gids = kept->n_gids;
		spec.grants_kept = true;
	}
	return flows_create(p->m->flows, &spec, l->peer_flow_uid,
			    l->peer_flow_gid, out, err, cap);
}

/*
 * The sender cut this host's subscription (cut_receiver) and now opens
 * the flow again at its current position (fanout.c, rejoin): a new
 * incarnation.  The old ring is dropped with what it still held (its
 * consumers got -ESTALE and re-attach to the new one by name), and the
 * flow made again from op, starting at the sender's new position, with
 * the ids allowed on the old one: those granted by hand stay, those taken
 * off by hand stay off (a review: a consumer that was disallowed but
 * still attached could stall the ring into a cut and be let in again).
 */
static int recreate_cut(struct peer *p, struct flow **f,
			const Flowmover__PeerFlowOpen *op, char *err,
			size_t cap)
{
	/* what the new incarnation takes of the old: its allowed ids, and
	 * the declared ids last granted on it (flows.h, decl_known) */
	const struct flow_ids allowed = (*f)->allowed;
	const struct flow_ids declared = (*f)->declared;
	const bool decl_known = (*f)->decl_known;
	int rc;

	log_info("flow %s: opened again by its sender after a cut, at "
		 "position %llu (what its ring still held is dropped)",
		 (*f)->name, (unsigned long long)op->start);
	peer_destroy_flow(p->m, *f, NULL);
	*f = NULL;
	rc = create_receiver(p, op, &allowed, f, NULL, err, cap);
	if (rc || !decl_known)
		return rc;
	(*f)->decl_known = true;
	(*f)->declared = declared;
	flows_save_owed(*f, "its declared ids");
	return 0;
}

/* Answer op's flow id on p once f's ring is registered there.  A later
 * OPEN of the same flow or flow id replaces an earlier one: one answer,
 * to the last. */
static int hold_open(struct peer *p, struct flow *f, uint32_t flow_id)
{
	struct held_open *h = malloc(sizeof(*h)), *old;
	char why[160];

	if (!h)
		return -ENOMEM;
	while ((old = held_take(p, f, &flow_id)))
		held_free(old);
	h->flow = flow_get(f);
	h->flow_id = flow_id;
	h->next = p->held;
	p->held = h;
	snprintf(why, sizeof(why), "its ring is being registered for peer %s",
		 p->addr);
	flows_set_state(f, FLOW_RECONNECTING, why);
	return 0;
}

/* f's ring may be registered on p for an open that p will not have:
 * undone, unless f is p's or another held open waits for it. */
static void unprepare(struct peer *p, struct flow *f)
{
	if (f->peer != p && !held_find(p, f) && p->tp->forget_flow)
		p->tp->forget_flow(p, f);
}

/*
 * f was just opened (or is held) by p: an open of it that another
 * connection holds lost it, as that connection's flow would have been
 * taken if its open had been answered.  Its sender is told (busy: it
 * asks again if it still wants the flow, and takes it back).
 */
static void supersede_held(struct peer *p, struct flow *f)
{
	char why[256];

	for (struct peer *q = p->m->peers; q; q = q->next) {
		struct held_open *h;

		if (q == p || !(h = held_take(q, f, NULL)))
			continue;
		snprintf(why, sizeof(why), "flow '%s' was opened again on "
			 "another connection (%s)", f->name, p->addr);
		if (q->state == PEER_UP)
			queue_refused(q, h->flow_id, -EAGAIN, why, 0);
		held_free(h);
		unprepare(q, f);
	}
}

/* Why the open of f is refused when its ring cannot be registered. */
static void unregistered_why(const struct flow *f, int err, char *why,
			     size_t cap)
{
	snprintf(why, cap, "cannot register the consumer ring of '%s' for "
		 "RDMA: %s", f->name, strerror(err));
}

/* Let p write f's ring: 0 (raddr, rkey), a negative errno (err says
 * why), or -EINPROGRESS: the answer waits for the registration. */
static int prepare_ring(struct peer *p, struct flow *f, uint32_t flow_id,
			uint64_t *raddr, uint32_t *rkey, char *err, size_t cap)
{
	int rc;

	if (!p->tp->open_flow)
		return 0;
	rc = p->tp->open_flow(p, f, raddr, rkey);
	if (rc == -EINPROGRESS && !(rc = hold_open(p, f, flow_id)))
		return -EINPROGRESS;
	if (rc)
		unregistered_why(f, -rc, err, cap);
	return rc;
}

/* Receiver flow f opens on p as the sender's flow_id: the answer. */
static void open_linked(struct peer *p, struct flow *f, uint32_t flow_id,
			uint64_t raddr, uint32_t rkey)
{
	f->id = flow_id;
	f->ack_due = false;
	f->ack_owed_ns = 0;
	link_flow(p, f);
	flows_set_state(f, FLOW_OPEN, "");
	queue_opened(p, f->id, f->sent, f->reported_head, raddr, rkey);
	/*
	 * A resumed flow whose consumer has not read everything owes credit
	 * for what it reads next.  Only a deposit would put it on the owing
	 * list, and when the sender's window was full at the cut no deposit
	 * ever comes: the sender waits for our ACK, we for its DATA (issue
	 * 11, test_fanout cases 8 and 9).
	 */
	if (f->reported_head != f->sent)
		mover_wake_flow(p->m, f);
}

/* The connection f is on, or the one holding an open of it while its ring
 * is registered (RDMA: f is on none meanwhile), with the sender's flow id
 * there in *id; NULL: none (f waits for its sender). */
static const struct peer *holder_of(const struct peer_mgr *m,
				    const struct flow *f, uint32_t *id)
{
	const struct held_open *h;

	if (f->peer)
		return f->peer;
	for (const struct peer *q = m->peers; q; q = q->next)
		if ((h = held_find(q, f))) {
			*id = h->flow_id;
			return q;
		}
	return NULL;
}

/*
 * Is op (on p) another subscription of the sender flow that has receiver
 * flow f here already: the same flow under another flow id on this
 * connection (two names of this host, their connections merged), or the
 * same sender's other subscription (another sub_tag) while f is open on
 * another live connection?  The connection that has f (holder_of) if so,
 * else NULL.  The same subscription coming back on a new connection (its
 * tag) takes the flow, as does an older sender (no tag), and another peer
 * meets check_origin.
 */
static const struct peer *twin_of(const struct peer *p, const struct flow *f,
				  const Flowmover__PeerFlowOpen *op)
{
	uint32_t id = f->id;
	const struct peer *q = holder_of(p->m, f, &id);

	if (q == p)
		return id != op->flow_id ? q : NULL;
	if (q && q->state == PEER_UP && op->sub_tag && f->rx_tag &&
	    op->sub_tag != f->rx_tag && !strcmp(f->origin, p->identity))
		return q;
	return NULL;
}

static void handle_open(struct peer *p, const Flowmover__PeerFlowOpen *op)
{
	struct peer_mgr *m = p->m;
	struct flow *f = flows_find(m->flows, op->name ? op->name : "");
	struct flow *same_id;
	const struct peer *holder;
	char err[200] = "";
	uint64_t raddr = 0, twin_tag = 0;
	uint32_t rkey = 0, retry_ms = 0;
	bool claimed = false;
	int rc = 0;

	if (!p->auth_ok) { /* handle_ctrl's gate: never a flow, ring or rkey */
		peer_fail(p, "peer authentication failed: an open before "
			  "authentication");
		return;
	}
	/* a sender numbers its flows once each: an id in use by another flow
	 * on this connection would make its frames go to either */
	same_id = peer_flow_by_id(p, op->flow_id, FLOW_RECEIVER);
	if (p->outbound && !m->key) {
		/* without keys a peer is only its address, and this one is
		 * an address a local user named (flow create --peer): it
		 * would make flows here, under quotas counted for that
		 * address, with no --listen, --peer-allow or accept limit
		 * ever asked.  A sender's flows ride the connections it
		 * dials; one we dialed only carries them when both proved
		 * the key (inbound_from) */
		snprintf(err, sizeof(err), "this moverd dialed the connection "
			 "and has no --peer-key: open flows to it over a "
			 "connection of your own");
		rc = -EPERM;
	} else if (same_id && same_id != f) {
		snprintf(err, sizeof(err), "flow id %u is taken by flow '%s' on "
			 "this connection", (unsigned)op->flow_id, same_id->name);
		rc = -EEXIST;
	} else if (f && f->role != FLOW_RECEIVER) {
		snprintf(err, sizeof(err), "a flow named '%s' already exists "
			 "on this host", f->name);
		rc = -EEXIST;
	} else if (m->admit && (rc = m->admit(m->admit_arg, op->name ?
					       op->name : "", p->host, err,
					       sizeof(err)))) {
		/* the receiving end's config names the hosts that may send
		 * it (from=): checked on every open, a new flow's and a
		 * resume's, for an identity (a node name under a cluster
		 * key) can move between addresses and an address cannot */
	} else if (f && (holder = twin_of(p, f, op))) {
		/* two peers of one fan-out flow that lead to this daemon (two
		 * names of this host): the second must not take the flow
		 * from the first, whose frames would then go nowhere; the
		 * sender ends it as the twin of twin_tag's */
		snprintf(err, sizeof(err), "flow '%s' comes to this host "
			 "through another of its sender's peers already (%.60s)",
			 f->name, holder == p ? "on this connection" :
			 holder->addr);
		twin_tag = f->rx_tag;
		rc = -EALREADY;
	} else if (f && (flow_cut_off(f) || op->after_cut)) {
		/* after_cut: the CLOSE that said so never came (the link or
		 * this moverd was down at the cut) */
		rc = check_origin(p, f, err, sizeof(err));
		if (!rc)
			rc = recreate_cut(p, &f, op, err, sizeof(err));
	} else if (f && f->state == FLOW_FAILED) {
		/* e.g. a client resized its ring file: it stays failed.
		 * Why is its own peer's to hear, no other's (a flow whose
		 * file names none, from before origins, is bound to none:
		 * it takes no new peer now) */
		rc = f->origin[0] ? check_origin(p, f, err, sizeof(err)) : 0;
		if (!rc) {
			snprintf(err, sizeof(err), "flow '%s' failed on this "
				 "host: %.100s", f->name, f->reason);
			rc = -EIO;
		}
	} else if (f) {
		rc = check_origin(p, f, err, sizeof(err));
		if (!rc)
			rc = reopen_receiver(p, f, op, err, sizeof(err));
	} else {
		rc = create_receiver(p, op, NULL, &f, &retry_ms, err,
				     sizeof(err));
	}
	if (!rc) { /* made, or taken from any other connection: p's now */
		claimed = true;
		f->rx_tag = op->sub_tag;
		supersede_held(p, f);
		rc = prepare_ring(p, f, op->flow_id, &raddr, &rkey, err,
				  sizeof(err));
	}
	if (rc == -EINPROGRESS)
		return; /* answered once registered (peer_flow_prepared) */
	if (rc) {
		static struct log_limit lim; /* a peer can ask at will */
		char sn[LOG_SAFE_BUF], se[LOG_SAFE_BUF];

		log_limited(&lim, LOG_LVL_WARN, "peer %s: cannot open flow "
			    "'%s': %s", p->addr, log_safe(op->name, sn, sizeof(sn)),
			    log_safe(err, se, sizeof(se)));
		queue_refused_twin(p, op->flow_id, rc, err, retry_ms,
				   twin_tag);
		/* on no connection now: it waits for its sender (and expires
		 * with --orphan-timeout if none comes) */
		if (claimed)
			flows_set_state(f, FLOW_RECONNECTING, err);
		return;
	}
	open_linked(p, f, op->flow_id, raddr, rkey);
}

/*
 * Why held open h of f cannot be answered with the flow now: its
 * registration failed (err), the flow was destroyed or failed meanwhile,
 * another connection took it, or its flow id is in use on p by now.  A
 * negative errno and why, or 0: it can.
 */
static int held_refusal(struct peer *p, const struct held_open *h, int err,
			char *why, size_t cap)
{
	const struct flow *f = h->flow;

	if (f->dead) {
		snprintf(why, cap, "flow '%s' was destroyed on this host while "
			 "its ring was being registered", f->name);
		return -ENOENT;
	}
	if (err) {
		unregistered_why(f, err, why, cap);
		return -err;
	}
	if (f->state == FLOW_FAILED) {
		snprintf(why, cap, "flow '%s' failed on this host: %.100s",
			 f->name, f->reason);
		return -EIO;
	}
	if (f->peer) {
		snprintf(why, cap, "flow '%s' was opened on another connection "
			 "while its ring was being registered", f->name);
		return -EEXIST;
	}
	if (peer_flow_by_id(p, h->flow_id, FLOW_RECEIVER)) {
		snprintf(why, cap, "flow id %u is taken on this connection",
			 (unsigned)h->flow_id);
		return -EEXIST;
	}
	return 0;
}

void peer_flow_prepared(struct peer *p, struct flow *f, int err)
{
	struct held_open *h = held_take(p, f, NULL);
	uint64_t raddr = 0;
	uint32_t rkey = 0;
	char why[200];
	int rc;

	if (!h) { /* replaced, or taken by another connection meanwhile */
		unprepare(p, f);
		return;
	}
	if (p->state != PEER_UP) {
		held_free(h); /* closing: no answer goes */
		return;
	}
	rc = held_refusal(p, h, err, why, sizeof(why));
	if (!rc && (rc = p->tp->open_flow(p, f, &raddr, &rkey)))
		unregistered_why(f, -rc, why, sizeof(why));
	if (rc) {
		log_warn("peer %s: %s", p->addr, why);
		queue_refused(p, h->flow_id, rc, why, 0);
		unprepare(p, f);
		/* registered for nobody: it waits for its sender */
		if (!f->dead && !f->peer && f->state != FLOW_FAILED)
			flows_set_state(f, FLOW_RECONNECTING, why);
	} else {
		open_linked(p, f, h->flow_id, raddr, rkey);
	}
	held_free(h);
}

/* How long to wait before asking again after a "busy, retry": what the
 * receiver said, at least REOPEN_NS and at most REOPEN_MAX_NS (its word
 * is a peer's: it cannot park the flow for longer). */
static uint64_t reopen_wait_ns(const Flowmover__PeerFlowOpened *op)
{
	uint64_t ns = (uint64_t)op->retry_ms * 1000000ull;

	if (ns < REOPEN_NS)
		return REOPEN_NS;
	return ns < REOPEN_MAX_NS ? ns : REOPEN_MAX_NS;
}

/*
 * Does sender flow f take op?  An answer to its open (opened, or busy:
 * retry) only while that open is outstanding (queue_open: CONNECTING, or
 * RECONNECTING across a cut or a reopen); an error also while it is open,
 * for a receiver says so when it fails or destroys its flow (fail_receiver,
 * forget_flow).  One that failed (fail_sender, a refused open) takes
 * nothing: its producers were told -EPROTO, and an OPENED, unsolicited or
 * crossing our CLOSE, must not set it open again or start it reconnecting.
 * Ignored, not a protocol violation: a late answer is a race.
 */
static bool takes_opened(const struct flow *f,
			 const Flowmover__PeerFlowOpened *op)
{
	if (f->state == FLOW_CONNECTING || f->state == FLOW_RECONNECTING)
		return true;
	return f->state == FLOW_OPEN && op->error && op->error != -EAGAIN;
}

/*
 * The peer named pos, on the grid and inside the window, for f's next
 * send or release, but no record begins there: from it moverd would send
 * or release part of a record, and take the rest for a dead producer's
 * gap (and pad over it).  The peer's word, or a seal a client overwrote:
 * either way f only.  One peer of several: only its subscription ends.
 */
static void cuts_record(struct peer *p, struct flow *f, const char *what,
			uint64_t pos)
{
	char why[200];

	snprintf(why, sizeof(why), "the peer's %s %llu is inside a record "
		 "(the peer's error, or a client wrote over a record's seal)",
		 what, (unsigned long long)pos);
	log_warn("peer %s: flow %s: %s", p->addr, f->name, why);
	if (fanout_member(f)) {
		fanout_lost(f, why, false);
		return;
	}
	fail_sender(f, why);
}

/* A refusal of the receiver's that says it is short of something that
 * comes back (a full state directory, memory, fds, a quota of flows as
 * others go): not the flow's fault, so not for good; asked again with a
 * backoff (short_wait_ns).  What can never fit there (a ring above its
 * limits or its filesystem alone) it says as -EFBIG: for good. */
static bool short_of(int error)
{
	return error == -ENOSPC || error == -EDQUOT || error == -ENOMEM ||
	       error == -EMFILE || error == -ENFILE;
}

/* The wait before asking a receiver short of room again: what it said,
 * and at least a backoff that doubles with each such refusal in a row
 * (a shortage can last: a quota held by others' flows, a disk full). */
static uint64_t short_wait_ns(struct flow *f,
			      const Flowmover__PeerFlowOpened *op)
{
	uint64_t said = reopen_wait_ns(op);

	f->short_backoff_ns = backoff_next(f->short_backoff_ns, REOPEN_NS,
					   SHORT_MAX_NS);
	return said > f->short_backoff_ns ? said : f->short_backoff_ns;
}

void peer_sender_wait(struct flow *f, const char *why)
{
	char msg[sizeof(f->reason)];

	if (!f->peer)
		return;
	f->wait_backoff_ns = backoff_next(f->wait_backoff_ns, REOPEN_NS,
					  SHORT_MAX_NS);
	snprintf(msg, sizeof(msg), "%s; again in %.1f s", why,
		 (double)f->wait_backoff_ns / 1e9);
	/* off the mover (it sends only open flows), nothing in flight: the
	 * open that follows resumes from what was acknowledged */
	flows_set_state(f, FLOW_RECONNECTING, msg);
	peer_reopen_at(f->peer->m, f, fr_now_ns() + f->wait_backoff_ns);
}

/*
 * The peer refused f's open for good (its words made safe in msg), or its
 * answer cannot be taken.  One peer of several: only its subscription
 * ends (its receiving ring's trouble is not the producer ring's).  Else
 * the flow is over here too, and its producers are told (-EPROTO) rather
 * than left waiting for space that never comes (before, only a corrupt
 * receiving ring, -EPROTO or -EIO, told them).  An open flow (the peer
 * destroyed or failed it mid-stream) fails with a CLOSE to the peer, as a
 * subscription that ends does: a receiver keeps its ring registered for
 * the WRITEs sent before the refusal was heard until then (rdma.c,
 * rdma_flow_closed).
 */
static void open_refused(struct flow *f, const char *msg)
{
	if (fanout_member(f)) {
		fanout_lost(f, msg, false);
		return;
	}
	if (f->state == FLOW_OPEN)
		fail_sender(f, msg);
	else
		flows_fail(f, msg);
}

/*
 * The peer has f's flow through another subscription (twin_of): a fan-out
 * subscription ends as the twin of the one the peer names by its tag (it
 * takes the flow there again once that one is gone: fanout.c,
 * rejoin_twins).  Only f's own subscription ever ends: a peer can refuse
 * what is sent to it, never what goes elsewhere.  One the peer names that
 * is no longer ours (removed, its CLOSE not yet read there: it comes on
 * another connection), or none, or a flow to one peer (its address
 * changed across a restart of ours while the peer still holds the old
 * connection) asks again after a backoff, until the peer lets go.
 */
static void twin_refused(struct flow *f, const Flowmover__PeerFlowOpened *op,
			 const char *msg)
{
	const struct flow *first = flow_first(f);

	for (const struct flow *s = first; fanout_member(f) && s;
	     s = flow_next_sub(first, s))
		if (s != f && op->twin_tag && sub_tag(s) == op->twin_tag) {
			fanout_lost_twin(f, s);
			return;
		}
	peer_sender_wait(f, msg);
}

/* The peer answered "opened" with a resume position we cannot take: it
 * holds the flow open on its side, so it is told (a CLOSE that says why;
 * open_refused, for a refusal, tells nothing: nothing is open there).  A
 * fan-out subscription ends alone, a flow to one peer fails. */
static void resume_refused(struct flow *f, const char *why)
{
	if (fanout_member(f))
		fanout_lost(f, why, false);
	else
		fail_sender(f, why);
}

/*
 * The furthest position this run put on the wire for f's peers: f's, or
 * any subscription's of its fan-out flow (one ring: two addresses of the
 * same daemon are two subscriptions whose peer holds one flow, fed by
 * either in turn).  UINT64_MAX: one of them does not know.
 */
static uint64_t sent_max(const struct flow *f)
{
	const struct flow *first = flow_first(f);
	uint64_t max = 0;

	for (const struct flow *s = first; s; s = flow_next_sub(first, s))
		if (s->wire_max > max)
			max = s->wire_max;
	return max;
}

static void handle_opened(struct peer *p, const Flowmover__PeerFlowOpened *op)
{
	struct flow *f = peer_flow_by_id(p, op->flow_id, FLOW_SENDER);
	bool wanting = short_of(op->error);
	struct fr_ring *r;
	uint64_t tail;

	if (!f)
		return; /* destroyed meanwhile */
	if (!takes_opened(f, op)) {
		static struct log_limit lim; /* a peer can say it at will */

		log_limited(&lim, LOG_LVL_DEBUG, "peer %s: flow %s: an answer "
			    "to no open ignored (the flow is %s)", p->addr,
			    f->name, flows_state_name(f->state));
		return;
	}
	if (op->error == -EAGAIN || wanting) {
		char msg[LOG_SAFE_BUF];

		/* the receiver is still reaping an older connection's I/O
		 * into the flow, its ring-rate budget is spent, it has files
		 * of the flow it did not re-adopt, or it is short of room,
		 * memory or fds: ask again when it said (peer_timer).  Its
		 * words, made safe: `flow show` prints them on an operator's
		 * terminal */
		log_safe(op->message, msg, sizeof(msg));
		flows_set_state(f, FLOW_RECONNECTING, msg);
		peer_reopen_at(p->m, f, fr_now_ns() + (wanting ?
						       short_wait_ns(f, op) :
						       reopen_wait_ns(op)));
		return;
	}
	if (op->error) {
		char msg[LOG_SAFE_BUF];

		/* the peer's words: logged and shown in `flow show` */
		log_safe(op->message, msg, sizeof(msg));
		if (op->error == -EALREADY)
			twin_refused(f, op, msg);
		else
			open_refused(f, msg);
		return;
	}
	r = ring_of(f);
	/* the peer's word, checked against what we recorded: it cannot have
	 * published more than one ring beyond what it acknowledged.  Its
	 * word comes from its consumer ring, which its clients can write:
	 * this flow's failure, not the connection's (which every reopen
	 * would fail again, the other flows on it with it) */
	if (op->resume < f->acked || op->resume - f->acked > r->size ||
	    op->head > op->resume || op->resume - op->head > r->size ||
	    op->resume % FR_ALIGN) {
		char why[200];

		snprintf(why, sizeof(why), "the peer's resume position "
			 "%llu/%llu is outside the window from %llu: its "
			 "consumer ring is corrupt",
			 (unsigned long long)op->resume,
			 (unsigned long long)op->head,
			 (unsigned long long)f->acked);
		resume_refused(f, why);
		return;
	}
	if (op->resume > sent_max(f)) {
		char why[200];

		/* the peer's ring says it holds records we never sent: its
		 * consumers wrote its `published` (docs/security.md) */
		snprintf(why, sizeof(why), "the peer's resume position %llu "
			 "is beyond what was sent to it (%llu): its consumer "
			 "ring is corrupt", (unsigned long long)op->resume,
			 (unsigned long long)sent_max(f));
		resume_refused(f, why);
		return;
	}
	/* then the producers' word.  With what went on the wire known, a
	 * tail behind what the peer holds moved back: this ring's own
	 * corruption, which fails this flow only.  Not known (this start's
	 * first open, a peer just added) it is the peer's word against the
	 * producers', and a peer's word ends its own subscription only: one
	 * fan-out peer must not fail the ring under the others */
	tail = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
	if (op->resume > tail) {
		char why[160];

		snprintf(why, sizeof(why), "the producer ring's tail %llu is "
			 "behind what the peer received (%llu)",
			 (unsigned long long)tail,
			 (unsigned long long)op->resume);
		if (sent_max(f) == UINT64_MAX)
			resume_refused(f, why);
		else
			fail_sender(f, why);
		return;
	}
	if (op->resume != f->acked && op->resume != tail &&
	    !fr_rec_begins(r, op->resume)) {
		cuts_record(p, f, "resume position", op->resume);
		return;
	}
	f->sent = f->acked = op->resume;
	if (f->wire_max == UINT64_MAX) /* known from now on */
		f->wire_max = op->resume;
	f->remote_head = op->head;
	f->raddr = op->raddr;
	f->rkey = op->rkey;
	fr_release(r, f->acked); /* delivered before the link broke */
	fr_sub_publish(r);
	f->st.resumes += f->state == FLOW_RECONNECTING;
	f->short_backoff_ns = 0;
	if (f->rejoining) { /* a later open resumes this incarnation */
		f->rejoining = false;
		fanout_save_cuts(f);
	}
	flows_set_state(f, FLOW_OPEN, "");
	mover_wake_flow(p->m, f);
}

/*
 * The sender cut this host's subscription (fan-out --max-lag): the same
 * "you were cut, re-attach" as a local consumer's, so the consumers here
 * get -ESTALE (their slots cut before the ring closes: a read checks its
 * slot first), not the -EPROTO of a corrupt flow.  The flow stays failed
 * for `flow show`, its state's errno ESTALE (flowshm_state), until the
 * sender rejoins (recreate_cut) or it is destroyed here.
 */
static void cut_receiver(struct flow *f, const char *what)
{
	char why[LOG_SAFE_BUF + 80];

	if (!strncmp(what, "cut off: ", 9)) /* fanout.c's words */
		what += 9;
	snprintf(why, sizeof(why), "cut off by the sender: %s (it opens the "
		 "flow again at its current position: attach again)", what);
	fr_sub_cut_all(ring_of(f));
	f->cut_off = true; /* flows_status: ESTALE */
	flows_set_state(f, FLOW_FAILED, why); /* logged as a warning */
	/* closed, not FR_FLAG_FAILED (which means -EPROTO): wakes the
	 * consumers sleeping for data, who then find their slot cut */
	fr_close(ring_of(f));
	detach_flow(f);
}

/*
 * Does a CLOSE of flow id (0: any) on p concern receiver flow f?  Yes if
 * f is open on p as id, or its open by p is held (then the close answers
 * it: the entry goes).  Another sender flow's id: no (handle_open refused
 * that one).
 */
static bool closes_on(struct peer *p, struct flow *f, uint32_t id)
{
	struct held_open *h;

	if (f->peer == p)
		return !id || id == f->id;
	h = held_find(p, f);
	if (!h || (id && id != h->flow_id))
		return false;
	held_free(held_take(p, f, NULL));
	return true;
}

static void handle_close(struct peer *p, const Flowmover__PeerFlowClose *cl)
{
	struct flow *f = flows_find(p->m->flows, cl->name ? cl->name : "");
	char why[LOG_SAFE_BUF], msg[LOG_SAFE_BUF];

	/* also for a flow gone here (its sender's answer to the refusal) */
	if (p->tp->flow_closed)
		p->tp->flow_closed(p, cl->flow_id);
	if (!f || f->role != FLOW_RECEIVER || !closes_on(p, f, cl->flow_id))
		return;
	if (!cl->failed || !cl->failed[0]) {
		log_info("flow %s: closed by the sender", f->name);
		peer_destroy_flow(p->m, f, NULL);
		return;
	}
	/* the sender failed it: so does this host (its consumer gets
	 * -EPROTO once it read what arrived), and it stays for `flow show`
	 * until destroyed here (it counts against its peer's quota: a peer
	 * failing flows only spends its own); DATA in flight is dropped */
	if (cl->cut) {
		cut_receiver(f, log_safe(cl->failed, msg, sizeof(msg)));
		return;
	}
	if (f->state == FLOW_FAILED) {
		/* failed here first (the sender's answer to fail_receiver):
		 * it keeps its own reason */
		detach_flow(f);
		return;
	}
	snprintf(why, sizeof(why), "the sender failed the flow: %s",
		 log_safe(cl->failed, msg, sizeof(msg)));
	flows_fail(f, why);
	detach_flow(f);
}

/* ---- authentication (auth.h) ---------------------------------------------- */

static void queue_opens(struct peer *p)
{
	struct flow *next;

	for (struct flow *f = p->flows; f; f = next) {
		next = f->peer_next; /* queue_open may take f off the list */
		if (f->state != FLOW_FAILED)
			queue_open(p, f);
	}
}

/* A fresh connection: nothing of an earlier one's handshake is kept. */
static void auth_reset(struct peer *p)
{
	p->auth_ok = p->hello_ok = p->hello_seen = false;
	p->auth_fail[0] = p->node[0] = p->node_safe[0] = p->key_id[0] = 0;
	memset(p->nonce_theirs, 0, sizeof(p->nonce_theirs));
	auth_nonce(p->nonce_mine);
	p->listen_port = 0;
	p->instance = 0;
	p->twin_tags = false;
	p->retiring = false;
	p->alias[0] = 0;
}

static struct peer *inbound_from(struct peer_mgr *m, const char *addr);

/*
 * A daemon connected to us that our sender flows wait for, on a
 * connection of their own that is down between retries (say that daemon
 * restarted): they ride this one instead (inbound_from), and open now.
 */
static void adopt_waiting(struct peer *in)
{
	for (struct peer *p = in->m->peers; p; p = p->next) {
		if (!p->outbound || p->state != PEER_DOWN || !p->flows ||
		    inbound_from(p->m, p->addr) != in)
			continue;
		log_info("peer %s: its flows move to the connection %s opened "
			 "to us", p->addr, in->addr);
		move_senders(p, in);
	}
}

/* Close p, a connection we dialed, for keep (merge_duplicate). */
static void retire(struct peer *p, const struct peer *keep)
{
	if (p->state != PEER_UP)
		return;
	log_info("peer %s: a second connection to the moverd that %s leads "
		 "to: closing ours, its flows move there", p->addr, keep->addr);
	p->retiring = true;
	peer_close(p, "moving to another connection to the same moverd");
}

/*
 * p has just authenticated, and another authenticated connection leads to
 * the same run of moverd (its hello's instance): both daemons dialed at
 * once, or a flow names that daemon by host name, which inbound_from does
 * not match.  One connection per pair of daemons stays.  Each daemon
 * closes only connections it dialed, and both decide alike without a
 * word: of one it dialed and one it accepted, the connection dialed by
 * the daemon of the smaller instance stays; of two it dialed, the older.
 * The closed connection's sender flows move to the one that stays once
 * its ops are reaped (retired) and resume from what was acknowledged, as
 * after a cut.  Only with --peer-key: without it, as for inbound_from, a
 * daemon is known by its address.  Returns whether p itself goes.
 */
static bool merge_duplicate(struct peer *p)
{
	struct peer_mgr *m = p->m;
	bool ours_larger = m->instance > p->instance;

	if (!m->key || m->stopping || !p->instance ||
	    p->instance == m->instance)
		return false;
	for (struct peer *q = m->peers; q; q = q->next) {
		if (!same_run(q, p))
			continue;
		if (p->outbound && (q->outbound || ours_larger)) {
			retire(p, q);
			return true;
		}
		if (!p->outbound && q->outbound && ours_larger)
			retire(q, p);
	}
	return false;
}

static void authenticated(struct peer *p)
{
	static struct log_limit lim; /* without a key anyone can get here */

	/* edges' hello_ok (the caps of pending peers, the hello deadline)
	 * now means the same: the whole handshake is done */
	p->auth_ok = p->hello_ok = true;
	if (p->m->key) {
		snprintf(p->key_id, sizeof(p->key_id), "%s", p->m->key->id);
		/* a node name proven by the key (see branch acl): without a
		 * key a name proves nothing and identity stays the address */
		snprintf(p->identity, sizeof(p->identity), "%s key %s",
			 p->node_safe, p->key_id);
	}
	log_limited(&lim, LOG_LVL_INFO, "peer %s: authenticated: node %s, %s%s",
		    p->addr, p->node_safe, p->key_id[0] ? "key " :
		    "no key (--peer-key not set)", p->key_id);
	if (p->outbound)
		p->backoff_ms = 100; /* only now: a refused handshake
				      * reconnects ever more slowly */
	if (p->tp->authenticated) {
		/* may fail p, or close one that hung up meanwhile (RDMA:
		 * its frames are taken before the hang-up is acted on) */
		p->tp->authenticated(p);
		if (p->state != PEER_UP)
			return;
	}
	if (merge_duplicate(p))
		return; /* its flows go to the other connection */
	if (p->outbound)
		queue_opens(p);
	else
		adopt_waiting(p);
}

/* Printable ASCII only, for logs and status (the raw name is proven). */
static void filter_node(char *out, const char *in, size_t cap)
{
	size_t i = 0;

	for (; in[i] && i + 1 < cap; i++)
		out[i] = in[i] > ' ' && in[i] < 0x7f ? in[i] : '?';
	out[i] = 0;
}

/*
 * The two sides must agree on having a key and on which: the first side
 * that sees a mismatch says so.  NULL, or why not.
 */
static const char *key_mismatch(const struct peer *p,
				const Flowmover__PeerHello *h, char *buf,
				size_t cap)
{
	const struct auth_key *k = p->m->key;
	bool theirs = h->key_id && *h->key_id;
	char id[AUTH_ID_CHARS + 1];

	if (!k && !theirs)
		return NULL;
	/* its words, shown in logs and flow show: printable only */
	filter_node(id, theirs ? h->key_id : "", sizeof(id));
	if (!k) {
		snprintf(buf, cap, "the peer holds a key (id %s), this "
			 "moverd has none (--peer-key)", id);
		return buf;
	}
	if (!theirs) {
		snprintf(buf, cap, "the peer has no key, this moverd requires "
			 "one (key id %s)", k->id);
		return buf;
	}
	if (strcmp(h->key_id, k->id)) {
		snprintf(buf, cap, "the peer holds another key (id %s, ours "
			 "%s)", id, k->id);
		return buf;
	}
	if (h->nonce.len != AUTH_NONCE_BYTES) {
		snprintf(buf, cap, "a nonce of %zu bytes", h->nonce.len);
		return buf;
	}
	return NULL;
}

/*
 * Responder: the address the initiator says it dialed must be ours: this
 * connection's local address, or one --peer-reachable-at names.  Both
 * proofs cover it, so a relay (a party at another address that forwards
 * the hellos both ways and then owns the connection) gets proofs over its
 * own address, and fails here.  p->dialed: the checked address, or where
 * the connection really reached (our hello tells the initiator).
 */
static const char *dialed_mismatch(struct peer *p,
				   const Flowmover__PeerHello *h, char *buf,
				   size_t cap)
{
	struct sockaddr_storage sa;
	char said[ENDPOINT_CHARS];

	if (!p->tp->local_addr(p, &sa) ||
	    !endpoint_name((struct sockaddr *)&sa, p->dialed, sizeof(p->dialed)))
		snprintf(p->dialed, sizeof(p->dialed), "?");
	if (!h->dialed || !*h->dialed) {
		snprintf(buf, cap, "its hello does not say the address it "
			 "dialed (a moverd from before the handshake bound "
			 "it): upgrade it");
		return buf;
	}
	if (!strcmp(h->dialed, p->dialed) || peer_reach_has(p->m->reach,
							    h->dialed)) {
		snprintf(p->dialed, sizeof(p->dialed), "%s", h->dialed);
		return NULL;
	}
	filter_node(said, h->dialed, sizeof(said));
	snprintf(buf, cap, "it dialed %s but the connection reached %s: a "
		 "relay (NAT: --peer-reachable-at)", said, p->dialed);
	return buf;
}

/* Initiator: the responder's echo of the address we dialed (its hello).
 * Informative only: the proof decides, but this says why it fails. */
static bool dialed_echo_ok(struct peer *p, const Flowmover__PeerHello *h)
{
	char said[ENDPOINT_CHARS];

	if (!h->dialed || !*h->dialed) {
		peer_fail(p, "peer authentication failed: its hello does not "
			  "echo the address we dialed (a moverd from before "
			  "the handshake bound it): upgrade it");
		return false;
	}
	if (!strcmp(h->dialed, p->dialed))
		return true;
	filter_node(said, h->dialed, sizeof(said));
	peer_fail(p, "peer authentication failed: we dialed %s but the "
		  "connection reached %s: a relay (NAT: --peer-reachable-at "
		  "on the peer)", p->dialed, said);
	return false;
}

/* Responder: answer the initiator's hello (and refuse once it is sent,
 * if it must: the initiator then hears why from our hello). */
static void responder_hello(struct peer *p, const char *mismatch)
{
	if (mismatch) {
		static struct log_limit lim; /* anyone may say hello */

		snprintf(p->auth_fail, sizeof(p->auth_fail), "peer "
			 "authentication failed: %s", mismatch);
		log_limited(&lim, LOG_LVL_WARN, "peer %s: %s", p->addr,
			    p->auth_fail);
	}
	queue_hello(p);
	if (!mismatch && !p->m->key)
		authenticated(p); /* insecure: the hellos are all */
}

/* Initiator: the responder's hello, its proof checked, ours sent. */
static void initiator_hello(struct peer *p, const Flowmover__PeerHello *h,
			    const char *mismatch)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerAuth auth = FLOWMOVER__PEER_AUTH__INIT;
	const struct auth_key *k = p->m->key;
	uint8_t proof[AUTH_PROOF_BYTES];

	if (mismatch) {
		peer_fail(p, "peer authentication failed: %s", mismatch);
		return;
	}
	if (!k) {
		authenticated(p);
		return;
	}
	if (!dialed_echo_ok(p, h))
		return;
	if (!auth_check(k, AUTH_RESPONDER, p->nonce_mine, p->nonce_theirs,
			node_name(), p->node, p->dialed, h->proof.data,
			h->proof.len)) {
		peer_fail(p, "peer authentication failed: its proof (%zu "
			  "bytes) is wrong for key %s: a replayed or forged "
			  "hello", h->proof.len, k->id);
		return;
	}
	auth_proof(k, AUTH_INITIATOR, p->nonce_mine, p->nonce_theirs,
		   node_name(), p->node, p->dialed, proof);
	auth.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_AUTH;
	msg.auth = &auth;
	queue_ctrl(p, &msg);
	authenticated(p);
}

static void handle_hello(struct peer *p, const Flowmover__PeerHello *h)
{
	static struct log_limit lim; /* anyone may connect and say hello */
	char buf[256], node[LOG_SAFE_BUF];
	const char *mismatch;

	if (p->hello_seen) {
		peer_fail(p, "peer authentication failed: a second hello");
		return;
	}
	p->hello_seen = true;
	if (h->version != WIRE_VERSION) {
		peer_fail(p, "peer protocol version %u, we speak %u",
			  h->version, WIRE_VERSION);
		return;
	}
	/* the proofs cover the whole name: with a key it must fit; without
	 * one it is only shown, cut */
	if (!h->node) {
		peer_fail(p, "a hello without a node name");
		return;
	}
	if (p->m->key && strlen(h->node) >= sizeof(p->node)) {
		peer_fail(p, "peer authentication failed: a node name of more "
			  "than %zu bytes", sizeof(p->node) - 1);
		return;
	}
	snprintf(p->node, sizeof(p->node), "%s", h->node);
	filter_node(p->node_safe, h->node, sizeof(p->node_safe));
	log_limited(&lim, LOG_LVL_INFO, "peer %s: hello from %s", p->addr,
		    log_safe(h->node, node, sizeof(node)));
	if (!p->outbound && h->listen_port <= UINT16_MAX)
		p->listen_port = (uint16_t)h->listen_port;
	p->instance = h->instance;
	p->twin_tags = h->twin_tags;
	mismatch = key_mismatch(p, h, buf, sizeof(buf));
	if (!mismatch && p->m->key && !p->outbound)
		mismatch = dialed_mismatch(p, h, buf, sizeof(buf));
	if (!mismatch && p->m->key)
		memcpy(p->nonce_theirs, h->nonce.data, AUTH_NONCE_BYTES);
	if (p->outbound)
		initiator_hello(p, h, mismatch);
	else
		responder_hello(p, mismatch);
}

/* Responder: the initiator's proof, over our fresh nonce. */
static void handle_auth(struct peer *p, const Flowmover__PeerAuth *a)
{
	const struct auth_key *k = p->m->key;

	if (p->outbound || !k || !p->hello_seen || p->auth_ok) {
		peer_fail(p, "peer authentication failed: an unexpected proof");
		return;
	}
	if (!auth_check(k, AUTH_INITIATOR, p->nonce_theirs, p->nonce_mine,
			p->node, node_name(), p->dialed, a->proof.data,
			a->proof.len)) {
		peer_fail(p, "peer authentication failed: its proof (%zu "
			  "bytes) is wrong for key %s: a replayed or reflected "
			  "hello, or another key", a->proof.len, k->id);
		return;
	}
	authenticated(p);
}

/* Before auth_ok a peer may only say HELLO and AUTH. */
static bool ctrl_allowed(struct peer *p, const Flowmover__PeerMsg *msg)
{
	if (p->auth_ok || msg->body_case == FLOWMOVER__PEER_MSG__BODY_HELLO ||
	    msg->body_case == FLOWMOVER__PEER_MSG__BODY_AUTH)
		return !p->auth_fail[0];
	peer_fail(p, "peer authentication failed: control message %d before "
		  "authentication", (int)msg->body_case);
	return false;
}

static void handle_ctrl(struct peer *p)
{
	bool oom;
	Flowmover__PeerMsg *msg = (Flowmover__PeerMsg *)ctl_unpack(
		&flowmover__peer_msg__descriptor, p->hdr.len, p->ctrl_buf, &oom);

	if (!msg) {
		/* the message is consumed either way: the connection fails,
		 * and its flows resume on the next one */
		if (oom)
			peer_fail(p, "out of memory decoding a control "
				  "message of %u bytes", p->hdr.len);
		else
			peer_fail(p, "undecodable control message");
		return;
	}
	if (!ctrl_allowed(p, msg)) {
		flowmover__peer_msg__free_unpacked(msg, NULL);
		return;
	}
	switch (msg->body_case) {
	case FLOWMOVER__PEER_MSG__BODY_HELLO:
		handle_hello(p, msg->hello);
		break;
	case FLOWMOVER__PEER_MSG__BODY_AUTH:
		handle_auth(p, msg->auth);
		break;
	case FLOWMOVER__PEER_MSG__BODY_OPEN:
		handle_open(p, msg->open);
		break;
	case FLOWMOVER__PEER_MSG__BODY_OPENED:
		handle_opened(p, msg->opened);
		break;
	case FLOWMOVER__PEER_MSG__BODY_CLOSE:
		handle_close(p, msg->close);
		break;
	default:
		peer_fail(p, "unknown control message");
	}
	flowmover__peer_msg__free_unpacked(msg, NULL);
}

static void handle_ack(struct peer *p, const struct wire_hdr *h)
{
	struct flow *f = peer_flow_by_id(p, h->flow_id, FLOW_SENDER);

	if (!f)
		return; /* destroyed meanwhile */
	/* cut (or failed) and not opened again yet: an acknowledgement of
	 * what the peer had before (it answers our open first, and only then
	 * acknowledges what we send from the new position) */
	if (f->state != FLOW_OPEN)
		return;
	if (h->pos < f->acked || h->pos > f->sent ||
	    h->aux < f->remote_head || h->aux > h->pos ||
	    h->pos % FR_ALIGN || h->aux % FR_ALIGN) {
		peer_fail_flow(p, f, "flow %s: acknowledgement %llu/%llu "
			       "outside the window", f->name,
			       (unsigned long long)h->pos,
			       (unsigned long long)h->aux);
		return;
	}
	/* everything below sent went as whole records */
	if (h->pos != f->sent && !fr_rec_begins(ring_of(f), h->pos)) {
		cuts_record(p, f, "acknowledgement", h->pos);
		return;
	}
	mover_acked(p, h->pos - f->acked,
		    stats_acked(&f->st, &p->st, h->pos, fr_now_ns()));
	f->bytes_acked += h->pos - f->acked;
	f->acked = h->pos;
	f->remote_head = h->aux;
	mover_window_moved(p->m, f);
	/* the consumer ring has it: producers may reuse the space */
	fr_release(ring_of(f), f->acked);
	/* per acknowledgement, not per record: publish our slot now */
	fr_sub_publish(ring_of(f));
}

/*
 * A DATA body for a flow that is not (or no longer) open on this
 * connection: destroyed here, failed, or moved.  Its sender learns why
 * from a control message; the body is read and dropped, the link goes on.
 */
static int discard_data(struct peer *p, const struct wire_hdr *h)
{
	if (h->len == 0 || h->len % FR_ALIGN ||
	    h->len > p->m->flows->limits.max_ring_size) {
		peer_fail(p, "data frame of %u bytes for flow %u", h->len,
			  h->flow_id);
		return -1;
	}
	if (!p->ctrl_buf && !(p->ctrl_buf = malloc(WIRE_MAX_CTRL))) {
		peer_fail(p, "out of memory");
		return -1;
	}
	log_debug("peer %s: dropping %u bytes for flow %u (not open here)",
		  p->addr, h->len, h->flow_id);
	p->rx_discard = true;
	return 0;
}

/* Validate a DATA header and point the receive at the consumer ring. */
static int start_data(struct peer *p, const struct wire_hdr *h)
{
	struct flow *f = peer_flow_by_id(p, h->flow_id, FLOW_RECEIVER);
	struct fr_ring *r;
	uint64_t head, off, first;

	if (f && f->state == FLOW_FAILED) {
		/* failed here, perhaps without its sender told (its ring's
		 * pages could not be allocated: flows.c, fill_done), which
		 * would wait for ever for an acknowledgement: told now,
		 * once (off the connection, what follows is dropped) */
		queue_refused(p, f->id, -EIO, f->reason, 0);
		f->rx_refused = true;
		detach_flow(f);
		return discard_data(p, h);
	}
	if (!f || f->state != FLOW_OPEN || !consumer_head(p, f, &head))
		return discard_data(p, h);
	r = ring_of(f);
	if (h->pos != f->sent || h->len == 0 || h->len % FR_ALIGN ||
	    h->len > r->size || h->pos + h->len - head > r->size) {
		peer_fail_flow(p, f, "flow %s: data [%llu, +%u) outside the "
			       "window (published %llu, consumer %llu)",
			       f->name, (unsigned long long)h->pos, h->len,
			       (unsigned long long)f->sent,
			       (unsigned long long)head);
		return -1;
	}
	off = h->pos & r->mask;
	first = r->size - off;
	p->rx_iov[0] = (struct iovec){ r->data + off,
				       first < h->len ? first : h->len };
	p->rx_iov[1] = (struct iovec){ r->data, first < h->len ?
							h->len - first : 0 };
	/* the receive writes f's ring until it is reaped (rx_release) */
	p->rx_flow = flow_get(f);
	f->rx_peer = p;
	return 0;
}

/*
 * Count the data records of a deposit [from, to): the receiver's records
 * deposited.  After the publish, so the consumer does not wait for it.
 * The bytes are the peer's: walked with the producers' own checks
 * (bounded by the span, and by SPAN_MAX_RECORDS as the sender's walk: a
 * gigabyte of 16-byte pads, 32 bytes of header over RDMA, would hold the
 * loop for a quarter of a second), a run that stops early is counted up
 * to where it stops, and nothing else is judged here (the consumer's
 * library checks every record it reads).  A statistic: what is past the
 * cap goes uncounted.
 */
static void count_deposited(struct flow *f, uint64_t from, uint64_t to)
{
	uint64_t end, records = 0;
	bool stuck;

	fr_scan_records_max(ring_of(f), from, to, SPAN_MAX_RECORDS, &end,
			    &stuck, &records);
	f->st.records_deposited += records;
}

static void finish_data(struct peer *p)
{
	struct flow *f = p->rx_flow;
	char why[200];

	/* a deposit that faulted went into the ring guard's zero pages, not
	 * the ring (a page its filesystem could not allocate, or a client
	 * cut the file): neither published nor acknowledged, the flow fails
	 * and its sender hears why.  One load while no guard tripped */
	if (f && !f->dead && f->peer == p && f->state == FLOW_OPEN &&
	    ring_guard_any() && flows_ring_tampered(f, why, sizeof(why)))
		fail_tampered(f, why);
	/* destroyed, failed or moved meanwhile: the bytes landed in a ring
	 * nobody will read from this position; publish nothing */
	if (f && !f->dead && f->peer == p && f->state == FLOW_OPEN) {
		f->sent = p->hdr.pos + p->hdr.len;
		f->bytes_sent += p->hdr.len;
		/* release store of `published`, then wake the consumer */
		fmlt_mark(LT_PUBLISH, f->sent);
		fr_publish(ring_of(f), f->sent);
		f->ack_due = true;
		mover_wake_flow(p->m, f); /* owes an acknowledgement */
		p->m->rx_deposits++; /* work for the duty cycle (idle.h) */
		count_deposited(f, p->hdr.pos, f->sent);
	}
	rx_release(p);
}

void peer_rx_header(struct peer *p)
{
	struct wire_hdr *h = &p->hdr;

	wire_get(p->hdr_buf, h);
	p->hdr_have = 0;
	p->st.frames_rx++;
	if (h->magic != WIRE_MAGIC || h->version != WIRE_VERSION) {
		peer_fail(p, "bad frame header (magic %#x, version %u)",
			  h->magic, h->version);
		return;
	}
	/* heartbeats are let through but do not move the hello deadline */
	if (!p->auth_ok && h->type != WIRE_CTRL && h->type != WIRE_HEARTBEAT) {
		peer_fail(p, "peer authentication failed: a frame of type %u "
			  "before authentication", h->type);
		return;
	}
	switch (h->type) {
	case WIRE_CTRL:
		if (h->len == 0 || h->len > WIRE_MAX_CTRL) {
			peer_fail(p, "control frame of %u bytes", h->len);
			return;
		}
		if (!p->ctrl_buf && !(p->ctrl_buf = malloc(WIRE_MAX_CTRL))) {
			peer_fail(p, "out of memory");
			return;
		}
		break;
	case WIRE_DATA:
		if (start_data(p, h))
			return;
		break;
	case WIRE_ACK:
		/* before the lookup: an ACK for a flow gone here still has
		 * a body, which would be read as the next frames */
		if (h->len)
			peer_fail(p, "acknowledgement with a payload");
		else
			handle_ack(p, h);
		return;
	case WIRE_HEARTBEAT:
		if (h->len)
			peer_fail(p, "heartbeat with a payload");
		p->st.heartbeats++;
		return;
	default:
		peer_fail(p, "unknown frame type %u", h->type);
		return;
	}
	p->in_body = true;
	p->body_have = 0;
}

/*
 * The receive of a DATA body straight into a consumer ring faulted: a
 * client shrank the ring file under it (ring_guard.h: where moverd's own
 * touch of such a page is SIGBUS, the kernel's copy into it is EFAULT).
 * A receive that faults takes nothing from the socket, so the stream is
 * whole: fail that flow alone and tell its sender, as the timer's check
 * of the file would (fail_tampered), and read the rest of the body into
 * nowhere.  False if the receive was not into a ring (the caller fails
 * the peer).
 */
bool peer_rx_fault(struct peer *p)
{
	struct flow *f = p->rx_flow;
	char why[200];

	if (!p->in_body || p->hdr.type != WIRE_DATA || !f || p->rx_discard)
		return false;
	if (!p->ctrl_buf && !(p->ctrl_buf = malloc(WIRE_MAX_CTRL)))
		return false;
	p->rx_discard = true; /* finish_data publishes nothing: f failed */
	/* the file's check repairs it and says how it was changed; at its
	 * size, the filesystem may have had no page for it (full) */
	if (!flows_ring_tampered(f, why, sizeof(why)))
		flows_fault_why(f, "a deposit into its ring faulted", why,
				sizeof(why));
	fail_tampered(f, why);
	return true;
}

void peer_rx_body(struct peer *p)
{
	p->in_body = false;
	if (p->hdr.type == WIRE_CTRL)
		handle_ctrl(p);
	else
		finish_data(p);
}

unsigned peer_body_rest(const struct peer *p, struct iovec rest[2])
{
	size_t skip = p->body_have;
	const struct iovec *v = p->rx_iov;

	if (skip < v[0].iov_len) {
		rest[0] = (struct iovec){ (uint8_t *)v[0].iov_base + skip,
					  v[0].iov_len - skip };
		rest[1] = v[1];
	} else {
		skip -= v[0].iov_len;
		rest[0] = (struct iovec){ (uint8_t *)v[1].iov_base + skip,
					  v[1].iov_len - skip };
		rest[1] = (struct iovec){ NULL, 0 };
	}
	return rest[1].iov_len ? 2 : 1;
}

/* n bytes of the current body where peer_rx_header pointed it: a control
 * body into ctrl_buf, DATA into the consumer ring (one or two pieces), a
 * discarded body nowhere.  The caller bounds n by what the body lacks. */
static void rx_body_copy(struct peer *p, const uint8_t *b, size_t n)
{
	struct iovec rest[2];
	size_t k;

	if (p->hdr.type == WIRE_CTRL) {
		memcpy(p->ctrl_buf + p->body_have, b, n);
		return;
	}
	if (p->rx_discard)
		return;
	peer_body_rest(p, rest);
	k = rest[0].iov_len < n ? rest[0].iov_len : n;
	memcpy(rest[0].iov_base, b, k);
	if (n > k)
		memcpy(rest[1].iov_base, b + k, n - k);
}

/*
 * Bytes as a byte stream delivered them, from wherever the last call
 * stopped: header bytes gather in hdr_buf, body bytes go where the header
 * said (rx_body_copy), and each completed header or body is handed on as
 * one would be by a receive of exactly its size.  Everything is the
 * peer's: peer_rx_header judges each header before a byte of its body is
 * placed, and no copy goes past the body's length.  Stops when the peer
 * fails; the rest is dropped with the connection.
 */
void peer_rx_stream(struct peer *p, const uint8_t *b, size_t n)
{
	size_t k;

	while (n && p->state == PEER_UP) {
		if (!p->in_body) {
			k = WIRE_HDR - p->hdr_have;
			k = k < n ? k : n;
			memcpy(p->hdr_buf + p->hdr_have, b, k);
			p->hdr_have += k;
			if (p->hdr_have == WIRE_HDR)
				peer_rx_header(p);
		} else {
			k = p->hdr.len - p->body_have;
			k = k < n ? k : n;
			rx_body_copy(p, b, k);
			p->body_have += k;
			if (p->body_have == p->hdr.len)
				peer_rx_body(p);
		}
		b += k;
		n -= k;
	}
}

/*
 * p->host, for the quotas: what the connection itself says, never the
 * hello.  Inbound, the address it came from; outbound, the address we
 * connected to (resolved, so a host name we dialed is charged as the
 * address it names).  One numeric form, so that "::ffff:10.0.0.1" and
 * "10.0.0.1" are one host.
 */
static void set_host(struct peer *p)
{
	const struct sockaddr_in6 *s6 = (const void *)&p->sa;
	const struct sockaddr_in *s4 = (const void *)&p->sa;
	char host[sizeof(p->addr)];
	struct in6_addr ip;
	bool ok;

	peer_host(p, host, sizeof(host));
	if (p->outbound && p->sa.ss_family == AF_INET6) {
		ip = s6->sin6_addr;
		ok = true;
	} else if (p->outbound && p->sa.ss_family == AF_INET) {
		v4_mapped(&ip, &s4->sin_addr);
		ok = true;
	} else {
		ok = parse_ip(host, strlen(host), &ip);
	}
	if (ok && IN6_IS_ADDR_V4MAPPED(&ip))
		ok = inet_ntop(AF_INET, &ip.s6_addr[12], host, sizeof(host));
	else if (ok)
		ok = inet_ntop(AF_INET6, &ip, host, sizeof(host));
	if (!ok) /* not numeric: as it is (it was never a claim either) */
		peer_host(p, host, sizeof(host));
	snprintf(p->host, sizeof(p->host), "%s", host);
}

/* Until the hello authenticates it, a peer is its address, without the
 * port (which changes with every connection). */
static void set_identity(struct peer *p)
{
	peer_host(p, p->identity, sizeof(p->identity));
	set_host(p);
}

static void log_inbound(const struct peer *p)
{
	static struct log_limit lim; /* anyone may connect at will */

	log_limited(&lim, LOG_LVL_INFO, "peer %s: connected over %s (inbound)",
		    p->addr, p->tp->name);
}

void peer_up(struct peer *p)
{
	/* receive state is fresh: calloc'd, or reset by peer_closed */
	p->state = PEER_UP;
	set_identity(p);
	p->last_rx_ns = p->last_tx_ns = p->connected_ns = fr_now_ns();
	mover_window_reset(p);
	auth_reset(p); /* the hello deadline runs until authenticated */
	p->dialed[0] = 0;
	if (p->outbound && !endpoint_name((struct sockaddr *)&p->sa, p->dialed,
					  sizeof(p->dialed)))
		p->dialed[0] = 0;
	if (p->outbound)
		queue_hello(p); /* opens go once the responder proved its key */
	p->tp->recv(p);
	if (p->outbound)
		log_info("peer %s: connected over %s (outbound)", p->addr,
			 p->tp->name);
	else
		log_inbound(p);
}

/* ---- connections ---------------------------------------------------------- */

/* ---- timer ------------------------------------------------------------------ */

/*
 * The peer timer runs on the loop (peer_timer, after each loop_run_once)
 * when its next deadline is due, and the loop sleeps no longer than that
 * deadline (peer_timer_ms): nothing wakes an idle daemon that nothing is
 * due for.  The deadlines: each peer's (dead, hello, send, its heartbeat,
 * its reconnection), a flow's reopen (m->reopen_due), the flow checks'
 * next slice, and every TICK_MS while the mover has flows in the middle of
 * something (credit owed, active senders), an END record waits for room,
 * or RDMA is in use.  Measured
 * before (a 20 ms tick that walked every flow of every peer): moverd/README.
 */

/* A receiver flow whose sender has not come back for --orphan-timeout. */
static bool orphan_expired(const struct peer_mgr *m, const struct flow *f,
			   uint64_t now)
{
	unsigned s = m->flows->limits.orphan_timeout_s;

	/* now was read at the top of the timer: a flow orphaned by a peer
	 * failed later in the same run has orphaned_ns > now.  A failed one
	 * off its connection waits for nothing (a sender is refused), yet
	 * holds its ring and table slot: it goes the same way. */
	return s && f->role == FLOW_RECEIVER &&
	       (f->state == FLOW_RECONNECTING || f->state == FLOW_FAILED) &&
	       !f->peer && now >= f->orphaned_ns &&
	       now - f->orphaned_ns >= s * 1000000000ull;
}

/* One flow's checks: expiry, a ring file resized or marked failed, its
 * fan-out laggards, its status words, inherited subscriber slots. */
static void police_flow(struct peer_mgr *m, struct flow *f, uint64_t now)
{
	char why[200];

	if (orphan_expired(m, f, now)) {
		log_warn("flow %s: %s its sender (%s) for %u s "
			 "(--orphan-timeout): destroying it", f->name,
			 f->state == FLOW_FAILED ? "failed, and off the "
			 "connection of" : "has not seen",
			 f->origin[0] ? f->origin : "?",
			 m->flows->limits.orphan_timeout_s);
		peer_destroy_flow(m, f, NULL);
	} else if (!flow_exposed(f)) {
		return; /* only moverd has written its ring and file */
	} else if (flows_ring_tampered(f, why, sizeof(why)) ||
		   ring_marked_failed(f, why, sizeof(why))) {
		fail_ring(f, why);
	} else {
		/* after the ring's own checks: a slot a client scribbled
		 * on is tampering, reported as such above */
		fanout_police(m, f);
		flows_status(f);
		flows_watch_inherited(f);
		flows_recover_local(f);
	}
}

/*
 * Every SLICE_NS, the next slice of a round: ceil(n / SLICES_PER_ROUND)
 * flows, so that a round takes POLICE_NS whatever the number n of flows,
 * and their cost is spread evenly instead of paid in one burst.  Two
 * rounds run side by side, each with its own cursor (which unlisting moves
 * on):
 *   - the exposed flows (t->exposed: a client was handed the ring, so it
 *     may have written it or resized its file, flow_exposed): a ring file
 *     resized, a ring marked failed, a cleared doorbell arm are noticed
 *     within two rounds, 2 s (docs/security.md);
 *   - the whole table, once in all_rounds() rounds: what is left to
 *     check of a flow no client was handed is its --orphan-timeout
 *     (police_flow skips the rest), so this round takes a quarter of
 *     that timeout, at most POLICE_ALL_ROUNDS (a minute at the default
 *     6 h) and at least one.  Visiting 1000 such flows every second was
 *     most of what two idle daemons cost (issue 12): on these hosts a
 *     page not touched for a second costs ~30 us to touch again.
 * Each slice of the exposed round sweeps its sender flows first
 * (mover_sweep: re-armed, visited if their producers wrote), then polices
 * every flow; the whole table's round polices only the flows that are not
 * exposed, which have nothing to sweep.  A flow is visited within two
 * rounds of being created or exposed, and once a round after that.
 * References are held across the slice: policing one flow may destroy it.
 */
#define SLICE_NS          (POLICE_NS / SLICES_PER_ROUND)
#define SLICES_PER_ROUND  10u
#define POLICE_ALL_ROUNDS 60u
#define SLICE_CHUNK       64u

/* The flow after f in the table, or in the table's exposed flows. */
static struct flow *next_in(const struct flow *f, bool exposed)
{
	return exposed ? f->exp_next : f->next;
}

/* The next chunk of up to max flows of a round from *cursor (NULL: the
 * list's first); *cursor is NULL again once the round is over. */
static unsigned police_chunk(struct flow_table *t, bool exposed,
			     struct flow **cursor, struct flow **fs,
			     unsigned max)
{
	struct flow *f = *cursor ? *cursor : exposed ? t->exposed : t->head;
	unsigned n = 0;

	for (; f && n < max; f = next_in(f, exposed))
		fs[n++] = flow_get(f);
	*cursor = f;
	return n;
}

/*
 * While the mover works, every exposed sender flow is swept every SWEEP_NS
 * as before, not a slice: a ring the doorbell misses while the mover is
 * busy (flowbench scale: sparse records on an idle flow beside busy ones
 * took ~0.5 s, the slices' round, instead of ~20 ms) is found within
 * 100 ms.  The cost of that is paid only while there is work.  (Only a
 * producer's ring has anything to sweep: flow_exposed.)
 */
#define SWEEP_NS 100000000ull

static void sweep_all(struct peer_mgr *m, uint64_t now)
{
	struct flow *fs[SLICE_CHUNK], *f = m->flows->exposed;

	if (m->last_work_ns < m->swept_ns || now - m->swept_ns < SWEEP_NS)
		return;
	m->swept_ns = now;
	while (f) {
		unsigned n = 0;

		/* no reference: sweeping destroys nothing */
		for (; f && n < SLICE_CHUNK; f = f->exp_next)
			fs[n++] = f;
		mover_sweep(m, fs, n);
	}
}

/* Up to want flows of one round, in chunks. */
static void police_round(struct peer_mgr *m, bool exposed,
			 struct flow **cursor, unsigned want, uint64_t now)
{
	struct flow *fs[SLICE_CHUNK];

	while (want) {
		unsigned n = police_chunk(m->flows, exposed, cursor, fs,
					  want < SLICE_CHUNK ? want :
							       SLICE_CHUNK);

		if (!n)
			return; /* an empty list */
		/* the whole table's round is for the flows the exposed round
		 * does not visit; only those can have anything to sweep */
		if (exposed)
			mover_sweep(m, fs, n);
		for (unsigned i = 0; i < n; i++) {
			if (!fs[i]->dead && (exposed || !flow_exposed(fs[i])))
				police_flow(m, fs[i], now);
			flow_put(fs[i]);
		}
		want = n < want && *cursor ? want - n : 0;
	}
}

static unsigned per_slice(unsigned n, unsigned slices)
{
	return (n + slices - 1) / slices;
}

static unsigned all_rounds(const struct flow_table *t)
{
	unsigned s = t->limits.orphan_timeout_s / 4;

	if (!t->limits.orphan_timeout_s || s > POLICE_ALL_ROUNDS)
		return POLICE_ALL_ROUNDS; /* 0: orphans never expire */
	return s ? s : 1;
}

static void police_slice(struct peer_mgr *m, uint64_t now)
{
	struct flow_table *t = m->flows;

	police_round(m, true, &t->exp_cursor,
		     per_slice(t->n_exposed, SLICES_PER_ROUND), now);
	police_round(m, false, &t->cursor,
		     per_slice(t->count, SLICES_PER_ROUND * all_rounds(t)),
		     now);
	flows_reap_remains(t, now);
	flows_retry_saves(t, now);
}

/* Sender flows whose open the peer answered "busy, retry": ask again.
 * The next such deadline of p's flows is kept in m->reopen_due. */
static void reopen_due(struct peer *p, uint64_t now)
{
	struct peer_mgr *m = p->m;
	struct flow *next;

	for (struct flow *f = p->flows; f; f = next) {
		next = f->peer_next; /* queue_open may take f off the list */
		if (!f->reopen_at_ns)
			continue;
		if (now < f->reopen_at_ns || p->state != PEER_UP ||
		    !p->auth_ok) {
			/* not yet, or not on this connection: look again */
			uint64_t at = now < f->reopen_at_ns ? f->reopen_at_ns :
							      now + REOPEN_NS;

			if (at < m->reopen_due)
				m->reopen_due = at;
			continue;
		}
		f->reopen_at_ns = 0;
		queue_open(p, f);
	}
}

void peer_reopen_at(struct peer_mgr *m, struct flow *f, uint64_t at)
{
	f->reopen_at_ns = at;
	if (at < m->reopen_due)
		m->reopen_due = at;
}

static uint64_t earlier(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/*
 * A connection we dialed, up, that no flow has ridden since idle_since_ns:
 * closed once PEER_LINGER_NS is over (linger_over).  One down or failing
 * without flows goes already (peer_closed, reap_peers); inbound ones are
 * the other daemon's to close.
 */
static bool lingering(const struct peer *p)
{
	return p->outbound && p->state == PEER_UP && !p->n_flows &&
	       p->idle_since_ns && !p->m->stopping;
}

/* ... and its linger runs.  Not with a send in flight: what it sends (the
 * last flow's CLOSE) goes first, or the send deadline fails it. */
static bool linger_running(const struct peer *p)
{
	return lingering(p) && !p->wr_op.busy;
}

/* ... and its linger is over. */
static bool linger_over(const struct peer *p, uint64_t now)
{
	/* (idle_since_ns may be later than the timer's now) */
	return linger_running(p) && now >= p->idle_since_ns + PEER_LINGER_NS;
}

/* Close an idle link in order: it is freed once its ops are reaped
 * (peer_closed: ours without flows goes). */
static void close_idle(struct peer *p)
{
	static struct log_limit lim; /* users make these at will */

	log_limited(&lim, LOG_LVL_INFO, "peer %s: no flows for %llu s: "
		    "closing the connection", p->addr,
		    (unsigned long long)(PEER_LINGER_NS / 1000000000ull));
	peer_close(p, "no flows");
}

/* When p needs the timer (or the loop awake) next. */
static uint64_t peer_due(const struct peer_mgr *m, const struct peer *p)
{
	uint64_t due;

	if (p->state == PEER_DOWN)
		return p->flows ? p->retry_at_ns : UINT64_MAX;
	if (p->state != PEER_UP)
		return UINT64_MAX; /* connecting or closing: I/O ends it */
	due = p->last_rx_ns + DEAD_NS + 1;
	if (linger_running(p))
		due = earlier(due, p->idle_since_ns + PEER_LINGER_NS + 1);
	if (!p->hello_ok)
		due = earlier(due, p->connected_ns + m->hello_timeout_ns + 1);
	/* a heartbeat is due (tx_build sends it when the loop runs) unless
	 * a send is in flight, which has its own deadline */
	if (p->wr_op.busy)
		due = earlier(due, p->last_tx_ns + SEND_DEADLINE_NS + 1);
	else
		due = earlier(due, p->last_tx_ns + HEARTBEAT_NS + 1);
	return due;
}

/* The timer's next deadline, from now. */
static uint64_t timer_due(const struct peer_mgr *m, uint64_t now)
{
	uint64_t due = m->reopen_due;

	for (const struct peer *p = m->peers; p; p = p->next)
		due = earlier(due, peer_due(m, p));
	/* device checks (rdma_tick): the old period, not the common idle
	 * state; an END waiting for room: its own backed-off retry */
	if (m->rdma)
		due = earlier(due, now + TICK_MS * 1000000ull);
	due = earlier(due, eos_due());
	/* flows in the middle of something: a consumer's progress rings no
	 * bell, so receiver flows that owe credit are looked at every
	 * TICK_MS, and so are sender flows still on the active list (a
	 * producer stuck mid-record); at idle both lists are empty */
	if (m->n_listed)
		due = earlier(due, now + TICK_MS * 1000000ull);
	if (m->flows->count || m->flows->remains)
		due = earlier(due, m->police_ns + SLICE_NS);
	return due;
}

/* A body still arriving: bytes that came keep the link alive (and move
 * its deadline, so the timer does not fire on every pass meanwhile). */
static void still_receiving(struct peer *p, uint64_t now)
{
	uint64_t last = p->tp->last_bytes_ns ? p->tp->last_bytes_ns(p, now) : 0;

	if (last > p->last_rx_ns)
		p->last_rx_ns = last;
}

void peer_timer(struct peer_mgr *m, uint64_t now)
{
	/* the flow checks' slice also rides on a wake-up for something else
	 * once half its period is over: at idle it falls in step with the
	 * counters' pass, one wake-up for both instead of two */
	bool slice = now - m->police_ns >= SLICE_NS / 2;

	if (m->loop->stop || (now < m->timer_due && !slice))
		return;
	m->ticks++;
	for (struct peer *p = m->peers, *n; p; p = n) {
		n = p->next;
		if (p->state == PEER_UP && now - p->last_rx_ns > DEAD_NS)
			still_receiving(p, now);
		if (p->state == PEER_UP && now - p->last_rx_ns > DEAD_NS)
			peer_fail(p, "no frame for %llu s",
				  (unsigned long long)(DEAD_NS / 1000000000ull));
		else if (p->state == PEER_UP && !p->hello_ok &&
			 now - p->connected_ns > m->hello_timeout_ns)
			peer_fail(p, "no hello within %llu s",
				  (unsigned long long)(m->hello_timeout_ns /
						       1000000000ull));
		else if (p->state == PEER_UP && p->wr_op.busy &&
			 now - p->last_tx_ns > SEND_DEADLINE_NS)
			peer_fail(p, "a send made no progress for %llu s: the "
				  "peer does not read",
				  (unsigned long long)(SEND_DEADLINE_NS /
						       1000000000ull));
		else if (p->state == PEER_DOWN && p->flows && now >= p->retry_at_ns)
			p->tp->connect(p);
		else if (linger_over(p, now))
			close_idle(p);
	}
	if (now >= m->reopen_due) {
		m->reopen_due = UINT64_MAX; /* reopen_due sets the next */
		for (struct peer *p = m->peers; p; p = p->next)
			reopen_due(p, now);
	}
	if (m->rdma)
		rdma_tick(m, now);
	eos_retry(m->flows, now);
	if (slice) {
		m->police_ns = now;
		sweep_all(m, now);
		police_slice(m, now);
	}
	m->timer_due = timer_due(m, fr_now_ns());
}

void peer_rearm(struct peer_mgr *m)
{
	tcp_rearm(m);
}

int peer_timer_ms(struct peer_mgr *m, int max_ms)
{
	uint64_t now = fr_now_ns(), due;

	/* deadlines set since the last run (a peer down, its retry): the
	 * peers' own fields, read again */
	m->timer_due = due = timer_due(m, now);
	if (max_ms < 0 && due == UINT64_MAX)
		return max_ms;
	if (due <= now)
		return 1; /* due: never 0, which would spin on a late one */
	due = (due - now + 999999) / 1000000; /* ms, rounded up */
	if (max_ms >= 0 && (uint64_t)max_ms < due)
		return max_ms;
	return due < INT32_MAX ? (int)due : INT32_MAX;
}

/* ---- public ---------------------------------------------------------------- */

int peer_mgr_start(struct peer_mgr *m, struct loop *l, struct flow_table *t,
		   const struct peer_opts *o)
{
	*m = (struct peer_mgr){
		.loop = l, .flows = t, .listen_fd = -1,
		.flow_gone = o->flow_gone, .flow_gone_arg = o->flow_gone_arg,
		.tp = &tcp_transport,
		.max_conns_per_addr = o->max_conns_per_addr ?
				      o->max_conns_per_addr : PEER_DEFAULT_PER_ADDR,
		.max_pending = o->max_pending ? o->max_pending :
						PEER_DEFAULT_PENDING,
		.max_inbound = o->max_inbound ? o->max_inbound :
						PEER_DEFAULT_INBOUND,
		.hello_timeout_ns = (o->hello_timeout_s ? o->hello_timeout_s :
				     PEER_DEFAULT_HELLO_S) * 1000000000ull,
		.connect_timeout_s = o->connect_timeout_s ?
				     o->connect_timeout_s :
				     PEER_DEFAULT_CONNECT_S,
		.max_hosts = o->max_hosts ? o->max_hosts : PEER_DEFAULT_HOSTS,
		.max_hosts_per_uid = o->max_hosts_per_uid ?
				     o->max_hosts_per_uid :
				     PEER_DEFAULT_HOSTS_PER_UID,
		.win_delay_ns = (o->window_delay_us ? o->window_delay_us :
				 PEER_DEFAULT_WINDOW_DELAY_US) * 1000ull,
		.allow = o->allow, .key = o->key, .reach = o->reach,
		.reopen_due = UINT64_MAX,
	};
	while (!m->instance) {
		uint8_t r[AUTH_NONCE_BYTES];

		auth_nonce(r); /* libsodium's randombytes (auth.c) */
		memcpy(&m->instance, r, sizeof(m->instance));
	}
	if (mover_bell_start(m)) {
		log_warn("no doorbell page (%s): an idle mover polls every "
			 "millisecond", strerror(errno));
		m->bell_mode = BELL_POLL;
	}
	if (peer_resolver_start(m))
		log_warn("no resolver thread: peers must be numeric addresses");
	if (!strcmp(o->doorbell, "thread"))
		bell_use_thread(m);
	else if (!strcmp(o->doorbell, "poll"))
		m->bell_mode = BELL_POLL;
	m->rdma_only = !strcmp(o->transport, "rdma");
	if (strcmp(o->transport, "tcp") && rdma_available(m))
		m->tp = &rdma_transport;
	else if (!strcmp(o->transport, "rdma")) {
		log_error("--transport rdma: no usable RDMA device");
		return -ENODEV;
	}
	log_info("transport for new peers: %s", m->tp->name);
	if (!o->listen_addr || !*o->listen_addr)
		return 0;
	if (m->rdma && rdma_transport.listen(m, o->listen_addr))
		log_warn("not accepting RDMA peers on %s", o->listen_addr);
	return tcp_transport.listen(m, o->listen_addr);
}

void peer_mgr_stop(struct peer_mgr *m)
{
	resolver_stop(&m->resolver); /* a lookup in progress is not waited for */
	bell_thread_stop(m->bell_thread);
	/* the doorbell page stays: a response in flight may carry its fd */
	m->bell_thread = NULL;
	m->bell_mode = BELL_POLL;
	tcp_transport.stop_listening(m);
	if (m->rdma)
		rdma_transport.stop_listening(m);
	m->stopping = true;
	for (struct peer *p = m->peers, *n; p; p = n) {
		n = p->next;
		p->outbound = false; /* no reconnecting: free when closed */
		if (p->state == PEER_DOWN) {
			p->state = PEER_CLOSING;
		} else if (p->state != PEER_CLOSING) {
			/* ours to close, not a failure: no warning */
			log_info("peer %s: disconnecting: moverd is stopping",
				 p->addr);
			peer_close(p, "moverd is stopping");
		}
	}
	reap_peers(m);
}

bool peer_mgr_busy(struct peer_mgr *m)
{
	reap_peers(m);
	return m->peers != NULL || rdma_busy(m);
}

void peer_mgr_fini(struct peer_mgr *m)
{
	rdma_stop(m);
}

bool peer_allowed(const struct peer_mgr *m, const struct sockaddr *sa)
{
	return peer_allow_match(m->allow, sa);
}

/* A numeric host ("10.0.0.1", "::1", "[::1]") as an IPv6 address, IPv4 as
 * IPv4-mapped, so that both forms of one address compare equal. */
static bool parse_ip(const char *host, size_t n, struct in6_addr *out)
{
	char buf[INET6_ADDRSTRLEN];
	struct in_addr v4;

	if (n > 2 && host[0] == '[' && host[n - 1] == ']')
		host++, n -= 2;
	if (n >= sizeof(buf))
		return false;
	memcpy(buf, host, n);
	buf[n] = 0;
	if (inet_pton(AF_INET6, buf, out) == 1)
		return true;
	if (inet_pton(AF_INET, buf, &v4) != 1)
		return false;
	v4_mapped(out, &v4);
	return true;
}

/* "HOST:PORT" with a numeric host: its address and port. */
static bool parse_endpoint(const char *addr, struct in6_addr *ip,
			   unsigned *port)
{
	const char *colon = strrchr(addr, ':');
	char *end;
	unsigned long v;

	if (!colon)
		return false;
	v = strtoul(colon + 1, &end, 10);
	if (end == colon + 1 || *end || !v || v > UINT16_MAX)
		return false;
	*port = (unsigned)v;
	return parse_ip(addr, (size_t)(colon - addr), ip);
}

/*
 * One connection per pair of daemons: a sender flow to addr rides a
 * connection that the daemon listening at addr opened to us, when one is
 * up, instead of a connection of its own: one connection (one RDMA queue
 * pair) per pair of daemons, whatever way their flows go (measured:
 * docs/performance.md).  The daemon is the one whose hello said it listens
 * on addr's port, from addr's IP.
 *
 * Only between daemons that proved the key (--peer-key).  Without a key
 * a daemon is known by its address (flows.h: origin), and the address a
 * host connects from need not be the one the other dials: a flow opened
 * over one connection could then not be resumed over the other.  With a
 * key both ends know each other by node name and key.
 *
 * Only numeric addresses are matched; a host name gets its own
 * connection, as does a flow whose transport would differ.
 */
static struct peer *inbound_from(struct peer_mgr *m, const char *addr)
{
	struct in6_addr want, ip;
	unsigned port;
	char host[sizeof(((struct peer *)0)->addr)];

	if (!m->key || m->stopping || !parse_endpoint(addr, &want, &port))
		return NULL;
	for (struct peer *p = m->peers; p; p = p->next) {
		if (p->outbound || p->state != PEER_UP || !p->auth_ok ||
		    p->listen_port != port || p->tp != m->tp)
			continue;
		peer_host(p, host, sizeof(host));
		if (parse_ip(host, strlen(host), &ip) &&
		    !memcmp(&ip, &want, sizeof(ip)))
			return p;
	}
	return NULL;
}

/* The connection a sender flow to addr rides, if there is one: ours to
 * that address, the one that took the flows of ours to it (alias, set by
 * retired), or one that daemon opened to us (inbound_from: *theirs). */
static struct peer *existing_peer(struct peer_mgr *m, const char *addr,
				  bool *theirs)
{
	struct peer *p;

	*theirs = false;
	for (p = m->peers; p; p = p->next)
		if (p->outbound && strcmp(p->addr, addr) == 0)
			return p;
	for (p = m->peers; p; p = p->next)
		if (p->state == PEER_UP && p->auth_ok && !p->retiring &&
		    strcmp(p->alias, addr) == 0)
			return p;
	*theirs = true;
	return inbound_from(m, addr);
}

/* The connection sender flow f goes on: an existing one, or a new one of
 * ours (not yet connecting), charged to f's owner (peer_may_dial); NULL
 * without memory. */
static struct peer *sender_peer(struct peer_mgr *m, struct flow *f)
{
	bool theirs;
	struct peer *p = existing_peer(m, f->peer_addr, &theirs);

	if (p && theirs)
		log_info("flow %s: on the connection %s opened to us", f->name,
			 p->addr);
	if (p)
		return p;
	p = peer_new(m, f->peer_addr, true, m->tp);
	if (p)
		p->uid = f->owner_uid;
	return p;
}

/* Outbound connections root does not get: the reserve, at most half. */
static unsigned hosts_reserve(const struct peer_mgr *m)
{
	return m->max_hosts / 2 < PEER_ROOT_RESERVE ? m->max_hosts / 2 :
						      PEER_ROOT_RESERVE;
}

int peer_may_dial(struct peer_mgr *m, const char *addr, uid_t uid, char *err,
		  size_t cap)
{
	unsigned all = 0, mine = 0;
	bool theirs;

	if (existing_peer(m, addr, &theirs))
		return 0; /* no new connection */
	/* closing and down ones count: they hold (or will) an fd */
	for (const struct peer *p = m->peers; p; p = p->next) {
		if (!p->outbound)
			continue;
		all++;
		mine += p->uid == uid;
	}
	if (all >= m->max_hosts) {
		snprintf(err, cap, "too many peer hosts (%u): moverd connects "
			 "to at most %u other daemons (--peer-max-hosts); a "
			 "connection closes %llu s after its last flow", all,
			 m->max_hosts,
			 (unsigned long long)(PEER_LINGER_NS / 1000000000ull));
		return -ENOSPC;
	}
	if (!flows_is_operator(uid) && all >= m->max_hosts - hosts_reserve(m)) {
		snprintf(err, cap, "too many peer hosts (%u): of the %u other "
			 "daemons moverd connects to (--peer-max-hosts), the "
			 "last %u are kept for root; a connection closes %llu s "
			 "after its last flow", all, m->max_hosts,
			 hosts_reserve(m),
			 (unsigned long long)(PEER_LINGER_NS / 1000000000ull));
		return -ENOSPC;
	}
	if (!flows_is_operator(uid) && mine >= m->max_hosts_per_uid) {
		snprintf(err, cap, "too many peer hosts (%u) for uid %u: flows "
			 "of one user may connect to at most %u other daemons "
			 "(--peer-max-hosts-per-uid); a connection closes %llu "
			 "s after its last flow", mine, (unsigned)uid,
			 m->max_hosts_per_uid,
			 (unsigned long long)(PEER_LINGER_NS / 1000000000ull));
		return -EDQUOT; /* as the other per-uid quotas */
	}
	return 0;
}

int peer_add_sender(struct peer_mgr *m, struct flow *f)
{
	struct peer *p = sender_peer(m, f);

	if (!p)
		return -ENOMEM;
	if (!link_sender(p, f) && p->state == PEER_DOWN)
		p->tp->connect(p);
	return 0;
}

/*
 * f is being destroyed: tell its peer (a sender's CLOSE; for a receiver,
 * why, if the sender did not ask for it) and take it off the connection.
 * Ops in flight on its ring hold their own references (struct flow).
 */
static void forget_flow(struct flow *f, const char *why)
{
	struct peer *p = f->peer;

	if (!p)
		return;
	if (f->role == FLOW_SENDER && p->state == PEER_UP && p->auth_ok) {
		Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
		Flowmover__PeerFlowClose cl = FLOWMOVER__PEER_FLOW_CLOSE__INIT;

		cl.name = f->name;
		cl.flow_id = f->id;
		msg.body_case = FLOWMOVER__PEER_MSG__BODY_CLOSE;
		msg.close = &cl;
		queue_ctrl(p, &msg);
	} else if (f->role == FLOW_RECEIVER && why && p->state == PEER_UP) {
		queue_refused(p, f->id, -ENOENT, why, 0);
		f->rx_refused = true;
	}
	detach_flow(f);
}

void peer_close_sender(struct flow *f, const char *failed, bool cut)
{
	struct peer *p = f->peer;

	if (!p)
		return;
	if (p->state == PEER_UP && p->auth_ok) {
		Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
		Flowmover__PeerFlowClose cl = FLOWMOVER__PEER_FLOW_CLOSE__INIT;

		cl.name = f->name;
		cl.flow_id = f->id;
		cl.failed = (char *)(failed ? failed : "");
		cl.cut = failed && cut;
		msg.body_case = FLOWMOVER__PEER_MSG__BODY_CLOSE;
		msg.close = &cl;
		queue_ctrl(p, &msg);
	}
	detach_flow(f);
}

void peer_detach_sender(struct flow *f)
{
	detach_flow(f);
}

void peer_destroy_flow(struct peer_mgr *m, struct flow *f, const char *why)
{
	if (m->flow_gone)
		m->flow_gone(m->flow_gone_arg, f);
	fanout_destroy(m, f); /* its other peer hosts first */
	mover_forget_flow(m, f);
	forget_flow(f, why);
	flows_destroy(m->flows, f);
}

void peer_let_go_flow(struct peer_mgr *m, struct flow *f)
{
	if (m->flow_gone)
		m->flow_gone(m->flow_gone_arg, f);
	flows_last_save(f); /* before fanout_let_go empties its peer list */
	fanout_let_go(m, f);
	detach_flow(f); /* no CLOSE: the flow lives on, in the next moverd */
	mover_forget_flow(m, f); /* off the mover's lists before it goes */
	flows_let_go(m->flows, f);
}

static void status_of(const struct peer *p, struct peer_status *out)
{
	static const char *const names[] = { "down", "connecting", "up",
					     "closing" };

	*out = (struct peer_status){
		.address = p->addr, .state = names[p->state],
		.transport = p->tp->name,
		.flows = flow_count(p), .bytes_sent = p->bytes_tx,
		.bytes_received = p->bytes_rx,
		.reconnects = p->reconnects,
		.node = p->node_safe, .key_id = p->key_id,
		.authenticated = p->auth_ok, .window = p->window,
		.unacked = p->unacked, .st = &p->st,
		.last_error = p->last_error,
		.last_error_unix_ms = p->last_error_unix_ms,
		.last_error_flow = p->last_error_flow,
		.peer = p,
	};
	if (p->tp->registered)
		p->tp->registered(p, &out->registrations,
				  &out->registered_bytes);
}

unsigned peer_status(const struct peer_mgr *m, struct peer_status *out,
		     unsigned max, unsigned *total)
{
	unsigned n = 0;

	*total = 0;
	/* the connections that carry flows first: many without (say
	 * silent ones from a flood) must not push them out of the list */
	for (int pass = 0; pass < 2; pass++)
		for (const struct peer *p = m->peers; p; p = p->next) {
			if ((flow_count(p) > 0) != !pass)
				continue;
			++*total;
			if (n < max)
				status_of(p, &out[n++]);
		}
	return n;
}
