/*
 * moverd/peer.c - peers and the flows on them: one connection to another
 * moverd, shared by every flow between the two, in both directions where
 * both proved the key (inbound_from).  Here: a peer's flows (by id), the
 * control frames it is sent, its failure and reconnection, what a send's
 * completion and fault mean for the flows in it, and the peer manager's
 * public calls (peer.h).  The rest of the protocol is in the files
 * peer_parts.h lists: the hello (peer_hello.c), a flow's open and close
 * (peer_open.c), what is received (peer_rx.c), the timer (peer_timer.c).
 *
 * Each peer has at most one send and one receive in flight on the
 * io_uring loop:
 *
 *   send: built by the mover (mover.c: control frames, acknowledgements,
 *         data), posted by the transport, completed in peer_sent.
 *   recv: a 32-byte header, then its payload: into a control buffer, or
 *         for DATA straight into the consumer ring at the same offsets
 *         (peer_rx.c).
 *
 * Everything a peer sends is validated: unknown flows, positions outside
 * the window, sizes that do not fit, bad magic or version close that
 * connection with a logged reason; other peers and flows go on.
 */
#include "peer_parts.h"
#include "bell_thread.h"
#include "fanout.h"
#include "fnv.h"
#include "mover.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
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

/* A peer's host: its address without the port (which changes with every
 * connection) and without an IPv6 address's brackets. */
void peer_host(const struct peer *p, char *out, size_t cap)
{
	const char *colon = strrchr(p->addr, ':');
	int n = colon ? (int)(colon - p->addr) : (int)strlen(p->addr);

	if (n > 2 && p->addr[0] == '[' && p->addr[n - 1] == ']')
		snprintf(out, cap, "%.*s", n - 2, p->addr + 1);
	else
		snprintf(out, cap, "%.*s", n, p->addr);
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

void link_flow(struct peer *p, struct flow *f)
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
void detach_flow(struct flow *f)
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
void rx_release(struct peer *p)
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
int queue_ctrl(struct peer *p, Flowmover__PeerMsg *msg)
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

const char *node_name(void)
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
void queue_hello(struct peer *p)
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
uint64_t sub_tag(const struct flow *f)
{
	uint64_t h = fnv1a64_str(0, f->peer_addr);

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
bool queue_open(struct peer *p, struct flow *f)
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

/* v4 as an IPv4-mapped IPv6 address, the one form addresses compare in. */
void v4_mapped(struct in6_addr *out, const struct in_addr *v4)
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
bool same_run(const struct peer *q, const struct peer *p)
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
void move_senders(struct peer *from, struct peer *to)
{
	while (from->flows) {
		struct flow *f = from->flows;

		detach_flow(f); /* RDMA: its registration goes with from */
		link_sender(to, f);
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

void peer_close(struct peer *p, const char *why)
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
	static struct log_limit lim; /* a stranger can connect and hang up
				      * at will, before any hello */
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
	log_limited(&lim, LOG_LVL_INFO, "peer %s: %s (no flows on it): "
		    "disconnecting", p->addr, why);
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
void fail_receiver(struct peer *p, struct flow *f, const char *why)
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
void fail_tampered(struct flow *f, const char *why)
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
void fail_ring(struct flow *first, const char *why)
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
bool parse_ip(const char *host, size_t n, struct in6_addr *out)
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
struct peer *inbound_from(struct peer_mgr *m, const char *addr)
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
