/*
 * moverd/peer_timer.c - the peer manager's clock: dead peers, hellos and
 * sends that took too long, heartbeats, reconnections and reopens due,
 * idle outbound connections closed, and the flow checks (police_flow) a
 * slice at a time.
 *
 * The timer runs on the loop (peer_timer, after each loop_run_once) when
 * its next deadline is due, and the loop sleeps no longer than that
 * deadline (peer_timer_ms): nothing wakes an idle daemon that nothing is
 * due for.  The deadlines: each peer's (dead, hello, send, its heartbeat,
 * its reconnection), a flow's reopen (m->reopen_due), the flow checks'
 * next slice, and every TICK_MS while the mover has flows in the middle of
 * something (credit owed, active senders), an END record waits for room,
 * or RDMA is in use.  Measured before (a 20 ms tick that walked every
 * flow of every peer): moverd/README.
 */
#include "peer_parts.h"
#include "eos.h"
#include "fanout.h"
#include "mover.h"
#include "log.h"

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
