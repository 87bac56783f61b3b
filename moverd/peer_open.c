/*
 * moverd/peer_open.c - a flow's open between two daemons: the receiver's
 * side of PeerFlowOpen (a new receiver flow, a re-adopted one resumed, an
 * open held while RDMA registers the ring, a twin refused), the sender's
 * side of PeerFlowOpened (started, resumed, refused, asked again later),
 * and PeerFlowClose.
 *
 * Every field of an open comes from the peer and is checked before
 * anything is created or bound: the name and the declared receiving end
 * (the peer_mgr's admit hook), the quotas, the sender's start against
 * what the ring holds.  A refusal is answered to the sender and touches
 * no other flow.
 */
#include "peer_parts.h"
#include "backoff.h"
#include "fanout.h"
#include "mover.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
void held_drop_all(struct peer *p)
{
	while (p->held) {
		struct held_open *h = p->held;

		p->held = h->next;
		held_free(h);
	}
}

/* ---- answers ------------------------------------------------------------ */

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

void queue_refused(struct peer *p, uint32_t id, int error,
		   const char *message, uint32_t retry_ms)
{
	queue_refused_twin(p, id, error, message, retry_ms, 0);
}

/* ---- receiver: the open ------------------------------------------------- */

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

/* f is charged to p's address from now on (the quotas); -ENOMEM: it
 * cannot be, for memory (the open is refused, f stays as it was). */
static int charge_host(struct peer *p, struct flow *f, char *err,
		       size_t cap)
{
	if (!flows_charge_host(f, p->host))
		return 0;
	snprintf(err, cap, "out of memory");
	return -ENOMEM;
}

/* f's peer resumes it, maybe from another address (a flow re-adopted
 * from an older state file is charged to its identity until now): it is
 * charged to where its peer is now. */
static int follow_host(struct peer *p, struct flow *f, char *err,
		       size_t cap)
{
	int rc;

	if (!strcmp(f->origin_host, p->host))
		return 0;
	rc = charge_host(p, f, err, cap);
	if (!rc)
		flows_save_owed(f, "its peer's address");
	return rc;
}

static int check_origin(struct peer *p, struct flow *f, char *err, size_t cap)
{
	static struct log_limit lim; /* a peer can ask at will */
	char so[LOG_SAFE_BUF], si[LOG_SAFE_BUF];
	int rc;

	if (!f->origin[0] || upgrades_origin(p, f)) {
		if ((rc = charge_host(p, f, err, cap)))
			return rc;
		snprintf(f->origin, sizeof(f->origin), "%s", p->identity);
		flows_save_owed(f, "its peer's identity");
		return 0;
	}
	if (!strcmp(f->origin, p->identity))
		return follow_host(p, f, err, cap);
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

void handle_open(struct peer *p, const Flowmover__PeerFlowOpen *op)
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
	} else if (f && (flow_cut_off(f) ||
			 (op->after_cut && f->state != FLOW_FAILED))) {
		/* after_cut: the CLOSE that said so never came (the link or
		 * this moverd was down at the cut).  A flow that failed here
		 * for a reason of its own stays failed (below), whatever
		 * the open says: it is the operator's to remove */
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

/* ---- sender: the answer ------------------------------------------------- */

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
void cuts_record(struct peer *p, struct flow *f, const char *what,
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

void handle_opened(struct peer *p, const Flowmover__PeerFlowOpened *op)
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

/* ---- close -------------------------------------------------------------- */

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

void handle_close(struct peer *p, const Flowmover__PeerFlowClose *cl)
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
