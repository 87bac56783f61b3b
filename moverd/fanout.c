/*
 * moverd/fanout.c - one sender flow, several peer hosts (see fanout.h).
 */
#include "backoff.h"
#include "fanout.h"
#include "mover.h"
#include "log.h"
#include "peer_impl.h"
#include "ring_guard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void rejoin_twins(struct peer_mgr *m, struct flow *first, uint64_t now);

static unsigned peer_count(const struct flow *f)
{
	unsigned n = 1;

	for (const struct flow *s = f->fanout; s; s = s->fanout_next)
		n++;
	return n;
}

static struct flow *find_sibling(const struct flow *f, const char *addr)
{
	for (struct flow *s = f->fanout; s; s = s->fanout_next)
		if (!strcmp(s->peer_addr, addr))
			return s;
	return NULL;
}

/* HOST:PORT, printable, and nothing the state file's list uses. */
static bool addr_ok(const char *a)
{
	size_t n = strlen(a);

	if (!n || n >= FLOW_ORIGIN_MAX || n >= sizeof(((struct flow *)0)->peer_addr) ||
	    !strchr(a, ':'))
		return false;
	for (; *a; a++)
		if (*a <= 0x20 || *a > 0x7e || *a == '=' || *a == ',')
			return false;
	return true;
}

static int check_add(const struct flow *f, const char *addr, char *err,
		     size_t cap)
{
	if (f->role != FLOW_SENDER || f->dead || !f->view || f->ring_fd < 0) {
		snprintf(err, cap, "flow '%s' is not a flow to another host: "
			 "create it with --peer first", f->name);
		return -EINVAL;
	}
	if (!addr_ok(addr)) {
		snprintf(err, cap, "peer '%.100s' is not HOST:PORT", addr);
		return -EINVAL;
	}
	if (!strcmp(f->peer_addr, addr) || find_sibling(f, addr)) {
		snprintf(err, cap, "flow '%s' goes to %s already", f->name,
			 addr);
		return -EEXIST;
	}
	if (peer_count(f) >= FANOUT_MAX_PEERS) {
		snprintf(err, cap, "flow '%s' goes to %u peer hosts, the most "
			 "one flow may", f->name, FANOUT_MAX_PEERS);
		return -ENOSPC;
	}
	return 0;
}

/* The sibling's own mapping of f's ring and its own subscriber slot,
 * taken at the slowest subscriber's position. */
static int map_sibling(struct flow *f, struct flow *s)
{
	struct fr_ring *r;
	/* a ring file: a client may shrink it, also before our first read */
	int rc = flows_open_view(f->ring_fd, f->path[0], &s->view, &s->guard);

	if (rc)
		return rc;
	s->max_lag = f->max_lag;
	flows_pin_lag(s); /* before the take reads it */
	r = &s->view->ring;
	rc = fr_sub_take_held(r, (uint32_t)getpid() & FR_INFO_PID);
	if (rc) {
		flowshm_close(s->view);
		ring_guard_remove(s->guard);
		s->view = NULL;
	}
	return rc;
}

static struct flow *new_sibling(struct flow *f, const char *addr)
{
	struct flow *s = flows_alloc();

	if (!s)
		return NULL;
	memcpy(s->name, f->name, sizeof(s->name));
	s->refs = 1; /* f's list: dropped by drop_sibling */
	s->table = f->table;
	s->ring_fd = -1; /* f's: the sibling only maps it */
	s->owner_uid = f->owner_uid;
	s->owner_gid = f->owner_gid;
	s->created_unix_ms = f->created_unix_ms;
	s->role = FLOW_SENDER;
	s->state = FLOW_CONNECTING;
	s->id = flows_new_id(f->table);
	s->ring_bytes = f->ring_bytes;
	s->transport = "tcp";
	snprintf(s->peer_addr, sizeof(s->peer_addr), "%s", addr);
	return s;
}

static void link_sibling(struct flow *f, struct flow *s)
{
	struct flow **pp = &f->fanout;

	while (*pp) /* at the end: the state file keeps the order given */
		pp = &(*pp)->fanout_next;
	*pp = s;
	s->sibling_of = flow_get(f);
}

static void unlink_sibling(struct flow *s)
{
	for (struct flow **pp = &s->sibling_of->fanout; *pp;
	     pp = &(*pp)->fanout_next) {
		if (*pp == s) {
			*pp = s->fanout_next;
			break;
		}
	}
	s->fanout_next = NULL;
}

/* Off f's list and its connection; the slot and mapping go with the
 * last reference (flows.c).  The peer is told to close the flow, unless
 * moverd stops (kept): the flow lives on in the next moverd, which
 * subscribes every peer of the state file again, and the slot stays
 * held until then (release_sibling). */
static void drop_sibling(struct peer_mgr *m, struct flow *s, bool kept)
{
	mover_forget_flow(m, s); /* off the mover's lists before it goes */
	unlink_sibling(s);
	if (kept)
		peer_detach_sender(s);
	else
		peer_close_sender(s, NULL, false);
	s->dead = true; /* a send completing later publishes nothing */
	s->kept = kept;
	flow_put(s);
}

int fanout_add(struct peer_mgr *m, struct flow *f, const char *addr,
	       bool save, char *err, size_t cap)
{
	struct flow *s;
	int rc = check_add(f, addr, err, cap);

	if (rc)
		return rc;
	s = new_sibling(f, addr);
	if (!s) {
		snprintf(err, cap, "out of memory");
		return -ENOMEM;
	}
	rc = map_sibling(f, s);
	if (rc) {
		snprintf(err, cap, "no subscriber slot for peer %s in flow "
			 "'%s': %s", addr, f->name, rc == -EBUSY ?
			 "all in use (local consumers and peer hosts)" :
			 flowshm_strerror(rc));
		free(s);
		return rc;
	}
	/* it joined at the slowest subscriber's position: the peer gets
	 * everything from there (the receiver's resume says where it is) */
	s->sent = s->acked = s->remote_head = s->view->ring.head;
	/* what it was sent before is not known (restored after our restart,
	 * or added again): its peer may hold more, from a run or an add
	 * before; the peer's resume says, as for a re-adopted flow */
	s->wire_max = UINT64_MAX;
	link_sibling(f, s);
	rc = peer_add_sender(m, s);
	if (!rc && save && (rc = flows_save(f)))
		snprintf(err, cap, "cannot write the flow's state file: %s",
			 strerror(-rc));
	else if (rc)
		snprintf(err, cap, "cannot reach peer %s", addr);
	if (rc) {
		drop_sibling(m, s, false);
		return rc;
	}
	log_info("flow %s: peer %s added (at position %llu)", f->name, addr,
		 (unsigned long long)s->acked);
	return 0;
}

int fanout_remove(struct peer_mgr *m, struct flow *f, const char *addr,
		  char *err, size_t cap)
{
	struct flow *s = find_sibling(f, addr);
	int rc;

	if (!s) {
		if (!strcmp(f->peer_addr, addr))
			snprintf(err, cap, "%s is the first peer of flow '%s', "
				 "which owns its ring: destroy the flow to stop "
				 "it", addr, f->name);
		else
			snprintf(err, cap, "flow '%s' does not go to %.100s",
				 f->name, addr);
		return !strcmp(f->peer_addr, addr) ? -EINVAL : -ENOENT;
	}
	drop_sibling(m, s, false);
	log_info("flow %s: peer %s removed", f->name, addr);
	rejoin_twins(m, f, fr_now_ns()); /* a peer refused as its twin */
	rc = flows_save_owed(f, "a peer's removal");
	if (rc)
		snprintf(err, cap, "removed, but the flow's state file was not "
			 "written (%s): moverd tries again each second, and a "
			 "restart before then brings the peer back",
			 strerror(-rc));
	return rc;
}

void fanout_destroy(struct peer_mgr *m, struct flow *f)
{
	while (f->fanout)
		drop_sibling(m, f->fanout, false);
}

void fanout_let_go(struct peer_mgr *m, struct flow *f)
{
	while (f->fanout)
		drop_sibling(m, f->fanout, true);
}

/* Is addr one of the comma-separated list's? */
static bool listed(const char *list, const char *addr)
{
	size_t n = strlen(addr);

	for (const char *a = list;; a++) {
		if (!strncmp(a, addr, n) && (a[n] == ',' || !a[n]))
			return true;
		a = strchr(a, ',');
		if (!a)
			return false;
	}
}

/* The subscriptions the state file says were cut and not answered since:
 * their opens say after_cut (the peer may have missed the cut while we
 * were down, and would refuse a resume from the new slot as data lost). */
static void restore_cuts(struct flow *f)
{
	char *list = f->cut_saved;

	if (!list)
		return;
	f->cut_saved = NULL;
	for (struct flow *s = f; s; s = flow_next_sub(f, s))
		if (listed(list, s->peer_addr))
			s->rejoining = true;
	free(list);
}

void fanout_restore(struct peer_mgr *m, struct flow *f)
{
	char *list = f->fanout_saved, *save = NULL, err[200];

	f->fanout_saved = NULL;
	for (char *a = list ? strtok_r(list, ",", &save) : NULL; a;
	     a = strtok_r(NULL, ",", &save))
		if (fanout_add(m, f, a, false, err, sizeof(err)))
			log_warn("flow %s: peer %s not restored: %s", f->name,
				 a, err);
	free(list);
	restore_cuts(f);
}

/* Does subscription s go to the same run of moverd as p (the instance
 * their hellos said)? */
static bool same_daemon(const struct flow *s, const struct peer *p)
{
	const struct peer *q = s->peer;

	return q && q->state == PEER_UP && q->auth_ok &&
	       q->instance == p->instance && s->state != FLOW_FAILED;
}

const struct flow *fanout_twin(const struct flow *f, const struct peer *p)
{
	const struct flow *first = flow_first(f);

	if (!p->instance || !fanout_member(f))
		return NULL;
	for (const struct flow *s = first; s; s = flow_next_sub(first, s))
		if (s != f && same_daemon(s, p))
			return s;
	return NULL;
}

/* f's slot back, producers no longer held by it; with sends in flight
 * that read the ring, once the last completes (what a send reads stays
 * as it was until its completion, as for a cut: cut_if_over_lag). */
static void leave_slot(struct flow *f)
{
	struct fr_ring *r = ring_of(f);

	if (r->sub >= FR_MAX_SUBS)
		return;
	if (f->tx_inflight) {
		f->sub_leave_owed = true;
		return;
	}
	fr_sub_leave(r, r->sub, r->sub_gen);
}

void fanout_sends_done(struct flow *f)
{
	if (!f->sub_leave_owed || f->tx_inflight || !f->view)
		return;
	f->sub_leave_owed = false;
	leave_slot(f);
}

void fanout_lost(struct flow *f, const char *why, bool cut)
{
	log_warn("flow %s: the subscription of peer %s is over (the flow "
		 "goes on for the others): %s", f->name, f->peer_addr, why);
	leave_slot(f);
	f->sub_dropped = true;
	flows_set_state(f, FLOW_FAILED, why);
	peer_close_sender(f, why, cut);
}

void fanout_lost_twin(struct flow *f, const struct flow *twin)
{
	char why[sizeof(twin->peer_addr) + 80];

	snprintf(why, sizeof(why), "another of its peers, %s, leads to the "
		 "same moverd: it gets the flow there", twin->peer_addr);
	fanout_lost(f, why, false);
	f->twin_id = twin->id;
}

/* The first rejoin comes REJOIN_MIN_NS after a cut; each cut within
 * REJOIN_CALM_NS of the last doubles the wait, up to REJOIN_MAX_NS, so a
 * peer that stays stuck is not cut and rejoined in a tight loop (each
 * rejoin sends it a ring's worth again). */
#define REJOIN_MIN_NS 1000000000ull
#define REJOIN_MAX_NS 64000000000ull
#define REJOIN_CALM_NS 300000000000ull

/* f was cut: when to take its subscription again. */
static void schedule_rejoin(struct flow *f, uint64_t now)
{
	/* a cut after a calm spell starts over */
	uint64_t last = now - f->cut_ns > REJOIN_CALM_NS ?
				0 : f->rejoin_backoff_ns;

	f->rejoin_backoff_ns = backoff_next(last, REJOIN_MIN_NS, REJOIN_MAX_NS);
	f->cut_ns = now;
	f->cut_unix_ms = flows_unix_ms();
	f->cuts++;
	f->rejoin_at_ns = now + f->rejoin_backoff_ns;
}

/* f's peer fell more than max_lag behind a full ring: its slot is HELD,
 * which producers never cut (ring.h, Subscribers), so we cut it as they
 * would a client's, but only with none of f's sends in flight (what a send
 * reads stays as it was until its completion: a cut lets producers write
 * over it). */
static void cut_if_over_lag(struct flow *f)
{
	if (!f->tx_inflight)
		fr_sub_cut_held(ring_of(f));
}

void fanout_save_cuts(struct flow *f)
{
	flows_save_owed(flow_first(f), "which of its peers were cut");
}

/* f was cut: its next opens say so (after_cut) until one is answered,
 * also after a restart of ours (the state file's cut=).  Already so
 * (max_lag cut it, and now it rejoins): nothing to write. */
static void mark_cut(struct flow *f)
{
	if (f->rejoining)
		return;
	f->rejoining = true;
	fanout_save_cuts(f);
}

/* f's slot was cut (max_lag): f's peer fell too far behind.  True if it
 * was (its subscription is over now). */
static bool police_one(struct flow *f, uint64_t now)
{
	char why[160];
	uint64_t lag;

	if (!f->peer || f->sub_dropped || !f->view)
		return false;
	cut_if_over_lag(f);
	if (!fr_sub_lost(ring_of(f)))
		return false;
	lag = f->max_lag;
	schedule_rejoin(f, now);
	mark_cut(f);
	snprintf(why, sizeof(why), "cut off: more than max_lag %llu bytes "
		 "behind the producers (cut %u times; rejoins in %llu s)",
		 (unsigned long long)lag, f->cuts,
		 (unsigned long long)(f->rejoin_backoff_ns / 1000000000ull));
	fanout_lost(f, why, true);
	return true;
}

bool fanout_cut_seen(struct flow *f)
{
	return police_one(f, fr_now_ns());
}

/*
 * A new slot of f joined at the slowest subscriber's position, which may
 * lie behind what f had sent its peer before the cut (another subscriber
 * lags further, or the peer's consumers read what was in flight at the
 * cut): those records its consumers may have read already.  Start after
 * them, where that position is a record of the ring still.
 */
static void skip_sent(struct fr_ring *r, uint64_t sent)
{
	/* acquire: the records below the tail are committed */
	uint64_t tail = atomic_load_explicit(&r->sh->tail,
					     memory_order_acquire);

	if (sent <= r->head || sent > tail ||
	    (sent < tail && !fr_rec_begins(r, sent)))
		return;
	fr_release(r, sent);
	fr_sub_publish(r);
}

/*
 * f's subscription was cut and its backoff is over: take a new slot of
 * the ring at the slowest subscriber's position (as fanout_add's join)
 * and open the flow on its peer again from there.  The peer takes that
 * open as a new incarnation of its flow (peer_open.c, handle_open): told of
 * the cut before (same connection, in order), or by the open's after_cut
 * when it was not (its link or its moverd was down at the cut).
 */
static void rejoin_one(struct peer_mgr *m, struct flow *f, uint64_t now)
{
	char why[sizeof(f->reason)];
	struct fr_ring *r;
	int rc;

	if (!f->rejoin_at_ns || now < f->rejoin_at_ns || f->dead ||
	    !f->view || !f->sub_dropped || f->sub_leave_owed)
		return;
	if (flows_verdict(f, why, sizeof(why))) { /* failed meanwhile */
		flows_fail(f, why);
		return;
	}
	r = ring_of(f);
	rc = fr_sub_take_held(r, (uint32_t)getpid() & FR_INFO_PID);
	if (rc) { /* e.g. local consumers took every slot: later */
		f->rejoin_at_ns = now + f->rejoin_backoff_ns;
		flows_set_state(f, FLOW_FAILED, "cut off; no subscriber slot "
				"to rejoin yet");
		return;
	}
	f->rejoin_at_ns = 0;
	f->sub_dropped = false;
	mark_cut(f); /* its peer may never have heard of the cut, or twin */
	skip_sent(r, f->sent);
	f->sent = f->acked = f->remote_head = r->head;
	f->wire_max = f->sent; /* a new incarnation on the peer */
	flows_set_state(f, FLOW_CONNECTING, "rejoining");
	if (peer_add_sender(m, f)) {
		fanout_lost(f, "cannot rejoin after a cut: out of memory",
			    false);
		return;
	}
	log_info("flow %s: peer %s rejoins at position %llu", f->name,
		 f->peer_addr, (unsigned long long)f->acked);
}

/* Is s subscribed, or cut off with its rejoin due (its backoff, not a
 * twin's rejoin, says when that daemon gets the flow again)? */
static bool holds_subscription(const struct flow *s)
{
	return !s->sub_dropped || s->rejoin_at_ns;
}

/* Does member id of first's flow hold its subscription? */
static bool member_subscribed(const struct flow *first, uint32_t id)
{
	for (const struct flow *s = first; s; s = flow_next_sub(first, s))
		if (s->id == id)
			return holds_subscription(s);
	return false;
}

/* f ended as a twin (fanout_lost_twin) and its twin is gone: rejoin now. */
static void rejoin_if_twin_gone(struct peer_mgr *m, const struct flow *first,
				struct flow *f, uint64_t now)
{
	if (!f->twin_id || !f->sub_dropped ||
	    member_subscribed(first, f->twin_id))
		return;
	f->twin_id = 0;
	f->rejoin_at_ns = now;
	rejoin_one(m, f, now);
}

/* Members of first's flow that ended as twins of one now gone rejoin. */
static void rejoin_twins(struct peer_mgr *m, struct flow *first, uint64_t now)
{
	for (struct flow *s = first; s; s = flow_next_sub(first, s))
		rejoin_if_twin_gone(m, first, s, now);
}

void fanout_police(struct peer_mgr *m, struct flow *f)
{
	uint64_t now = fr_now_ns();

	/* a flow failed as a whole stays failed; the first peer's
	 * subscription cut (sub_dropped) rejoins like the others */
	if (f->role != FLOW_SENDER ||
	    (f->state == FLOW_FAILED && !f->sub_dropped))
		return;
	rejoin_twins(m, f, now);
	for (struct flow *s = f; s; s = flow_next_sub(f, s))
		rejoin_one(m, s, now);
	for (struct flow *s = f; s; s = flow_next_sub(f, s))
		police_one(s, now);
}
