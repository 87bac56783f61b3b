/*
 * moverd/mover.c - the mover: how records are chosen and batched into each
 * send, and the doorbell that wakes an idle mover.
 *
 * Each peer has at most one send in flight (peer.c, the transport):
 *
 *   send: control frames first, then acknowledgements of receiver flows
 *         (credit deferred a little: ack_wanted), then data of sender
 *         flows, round robin with a per-flow quantum (a bulk flow cannot
 *         starve a small one), up to BATCH_MAX bytes; a flow that ran dry
 *         and has records again goes first (activate_first).
 *         Data goes from the producer ring's mapping straight to sendmsg.
 *         Nothing waits for more data: when the link is idle, whatever is
 *         committed goes at once; while a send is in flight, records pile
 *         up and leave together in the next one.
 *
 * Only flows with work are visited (each peer's active lists: a peer's
 * cycle visits its own), and an idle mover sleeps on one futex word of the
 * doorbell page producers ring (ipc/bell.h), whatever the number of flows.
 *
 * A producer ring's words are checked where they are read (next_span):
 * a corrupt record or tail fails its own flow only (fail_sender, peer.c).
 * What peers say to each other is peer.c and the files it names.
 */
#include "mover.h"
#include "fanout.h"
#include "peer_impl.h"
#include "bell_thread.h"
#include "log.h"

#include "barrier.h"
#include "bell.h"
#include "lattrace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- sending ------------------------------------------------------------- */

static bool tx_room(const struct peer *p, unsigned iovs)
{
	return p->tx_niov + iovs <= TX_MAX_IOV;
}

/* A header slot for the send being built (never more than its iovs). */
static uint8_t *tx_header(struct peer *p)
{
	p->st.frames_tx++;
	return p->tx_hdr[p->tx_nhdr++];
}

static void tx_add(struct peer *p, void *base, size_t len)
{
	p->tx_iov[p->tx_niov++] = (struct iovec){ base, len };
}

static void build_ctrl(struct peer *p)
{
	struct ctrl_frame **tail = &p->tx_ctrl;

	size_t bytes = 0;

	/* at most CTRL_BATCH_MAX control bytes per send (RDMA stages them) */
	while (p->ctrlq && tx_room(p, 1) && bytes < CTRL_BATCH_MAX) {
		struct ctrl_frame *fr = p->ctrlq;

		bytes += fr->len;
		p->ctrlq = fr->next;
		if (!p->ctrlq)
			p->ctrlq_tail = &p->ctrlq;
		p->ctrlq_bytes -= fr->len;
		p->ctrlq_frames--;
		fr->next = NULL;
		*tail = fr;
		tail = &fr->next;
		tx_add(p, fr->buf, fr->len);
		p->st.frames_tx++;
	}
}

static void deactivate(struct peer_mgr *m, struct flow *f);

/*
 * Credit is returned lazily (a quarter ring at a time) while the consumer
 * reads; a consumer that stops short of that, with records left unread,
 * would leave its sender a smaller window than it has for as long as it
 * stays stopped.  Its position still for ACK_QUIET_NS: credit it now.
 */
#define ACK_QUIET_NS 10000000ull

static bool consumer_quiet(struct flow *f, uint64_t head)
{
	uint64_t now;

	if (head == f->reported_head)
		return false;
	now = fr_now_ns();
	if (head != f->quiet_head) {
		f->quiet_head = head;
		f->quiet_since_ns = now;
		return false;
	}
	return now - f->quiet_since_ns >= ACK_QUIET_NS;
}

/*
 * A deposit is acknowledged in the next cycle: producers' space and the
 * sender's window wait on it (deferring it as well cost 64 KiB records
 * over 8 flows 2-5% of their rate, docs/performance.md).  The credit of a
 * consumer that caught up, which went in an acknowledgement of its own
 * right after the deposit's, waits up to ACK_DEFER_NS for the next
 * deposit's, or until the daemon is about to sleep (flush_acks): in a
 * request/response exchange one acknowledgement per deposit instead of
 * two.  Credit also goes every quarter ring read, and for a consumer
 * stopped short (consumer_quiet).
 */
#define ACK_DEFER_NS 50000ull

/* Is an acknowledgement of f to go in this send?  flush: the credit owed
 * goes too (the daemon is to sleep). */
static bool ack_wanted(struct flow *f, uint64_t head, bool flush)
{
	uint64_t now;

	if (f->ack_due || head - f->reported_head >= ring_of(f)->size / 4)
		return true;
	if (head != f->sent || head == f->reported_head)
		return consumer_quiet(f, head);
	/* the consumer caught up: its credit may wait, but not a sleep */
	if (flush)
		return true;
	now = fr_now_ns();
	if (!f->ack_owed_ns)
		f->ack_owed_ns = now;
	return now - f->ack_owed_ns >= ACK_DEFER_NS;
}

/* Receiver flows: acknowledge deposits, return consumer credit lazily
 * (ack_wanted).  Only p's flows owing credit (p->owing) are visited. */
static int build_acks(struct peer *p, bool flush)
{
	struct peer_mgr *m = p->m;
	struct flow *f, *next;
	int n = 0;

	for (f = p->owing.head; f && tx_room(p, 2); f = next) {
		uint64_t head;
		uint8_t *h;

		next = f->act_next;
		if (f->state != FLOW_OPEN) {
			deactivate(m, f); /* a deposit brings it back */
			continue;
		}
		if (!consumer_head(p, f, &head) || !ack_wanted(f, head, flush))
			continue;
		h = tx_header(p);
		wire_put(h, WIRE_ACK, f->id, 0, f->sent, head);
		tx_add(p, h, WIRE_HDR);
		f->reported_head = head;
		f->ack_due = false;
		f->ack_owed_ns = 0;
		if (head == f->sent)
			deactivate(m, f); /* all credited: nothing to tell */
		n++;
	}
	return n;
}

/*
 * The next committed span of a sender flow (whole records) within the
 * peer consumer's window and `budget` bytes.  *idle: nothing committed.
 * *records: its data records (the scan walks them anyway: counting them
 * costs no extra read).
 */
static uint64_t next_span(struct flow *f, uint64_t budget, bool *idle,
			  uint64_t *records)
{
	struct fr_ring *r = ring_of(f);
	uint64_t limit = f->remote_head + r->size, end;
	bool stuck;
	int rc;

	*idle = false;
	*records = 0;
	/* more than max_lag behind a full ring, with no send in flight: our
	 * HELD slot is cut here (fanout.c); or a client wrote "cut" into it.
	 * Producers may then write over what we would read: that ends this
	 * subscription, never the flow */
	if (fanout_cut_seen(f))
		return 0;
	if (limit > f->sent + budget)
		limit = f->sent + budget;
	rc = fr_scan_records_max(r, f->sent, limit, SPAN_MAX_RECORDS, &end,
				 &stuck, records);
	if (rc == -EPROTO && fanout_cut_seen(f)) /* cut while we read */
		return 0;
	if (rc == -EPROTO && end == f->sent) {
		char why[120];

		snprintf(why, sizeof(why), "a producer wrote a corrupt record "
			 "at position %llu", (unsigned long long)end);
		fail_sender(f, why);
		return 0;
	}
	if (stuck && end == f->sent &&
	    fr_now_ns() - f->stuck_checked_ns > STUCK_CHECK_NS) {
		/* a producer may have died mid-record: the ring's recovery */
		f->stuck_checked_ns = fr_now_ns();
		rc = fr_check_stuck(r, f->sent);
		if (rc == 0)
			return next_span(f, budget, idle, records);
		if (rc == -EPROTO && fanout_cut_seen(f))
			return 0;
		if (rc == -EPROTO) {
			char why[120] = "the producer ring's tail is outside "
					"the ring around the send position";

			/* the producers' tail is not where a record at the
			 * send position can be, or a client marked the ring
			 * failed: the ring's own corruption */
			ring_marked_failed(f, why, sizeof(why));
			fail_sender(f, why);
			return 0;
		}
	}
	*idle = stuck && end == f->sent;
	return end - f->sent;
}

/* ---- the connection window ----------------------------------------------- */

/*
 * One connection carries every flow to a peer, and what it holds is a
 * queue no round robin reorders: a sparse flow's record waits behind what
 * busy flows put in before it, unsent in our socket or unread in the
 * peer's.  When the peer reads slower than we send (its cpu taken by
 * other processes), that queue fills the socket buffers: up to 8 MB,
 * 10-25 ms of 32 B records beside 10 busy flows (docs/performance.md,
 * "The connection window").  So the bytes the connection holds are
 * bounded by the queueing delay their acknowledgements show: a round
 * trip more than m->win_delay_ns (moverd --window-delay-us, 1 ms by
 * default) above the least one of the last WIN_BASE_NS (the link's own:
 * a WAN's 10 ms is no queue) cuts the window to what was in flight,
 * scaled down to that target but by half at most (once a round trip);
 * one within the target grows it by WIN_STEP while the window is in use.
 * The backlog stays in the producers' rings, where the round robin
 * orders it.  A peer that keeps up never meets the window; it never goes
 * below WIN_MIN.  A smaller target halves a sparse record's wait beside
 * busy flows at 300 us, for 10-16% of bulk throughput (moverd/README.md,
 * "The connection window").
 *
 * Only a transport with a byte queue has a window (struct transport):
 * RDMA WRITEs land in the consumer's ring, so nothing waits at the peer,
 * and a round trip there is mostly the two daemons' own time, which a
 * busy sender would read as queue (in the TCG guest, a window cut by it
 * moved 32 B records over 8 flows at a third of the rate).
 */
#define WIN_MIN        (256ull << 10)
#define WIN_MAX        (64ull << 20)
#define WIN_STEP       (64ull << 10)
#define WIN_BASE_NS    10000000000ull
/* the count of unacknowledged bytes is kept as sends and
 * acknowledgements go; a flow cut, failed or moved with bytes in flight
 * leaves it high, so a closed window counts them again, this often */
#define WIN_RECOUNT_NS 100000000ull

void mover_window_reset(struct peer *p)
{
	p->unacked = 0;
	p->window = WIN_MAX;
	p->win_cut_ns = 0;
	p->win_counted_ns = 0;
	p->rtt_base_ns = 0;
}

/* The least round trip of the last WIN_BASE_NS or so: what the link
 * takes with nothing queued.  Learnt again from the next sample after
 * that long, so a route that got longer is not taken for a queue. */
static void learn_base(struct peer *p, uint64_t rtt_ns, uint64_t now)
{
	if (!p->rtt_base_ns || rtt_ns <= p->rtt_base_ns ||
	    now - p->rtt_base_at_ns > WIN_BASE_NS) {
		p->rtt_base_ns = rtt_ns;
		p->rtt_base_at_ns = now;
	}
}

void mover_acked(struct peer *p, uint64_t bytes, uint64_t rtt_ns)
{
	uint64_t flight = p->unacked, now, target, in_use, w;

	p->unacked -= bytes < p->unacked ? bytes : p->unacked;
	if (!rtt_ns || !p->tp->byte_queue)
		return;
	now = fr_now_ns();
	learn_base(p, rtt_ns, now);
	target = p->rtt_base_ns + p->m->win_delay_ns;
	if (rtt_ns <= target) {
		/* grow only a window in use, not one nothing tests */
		if (flight >= p->window / 2 && p->window < WIN_MAX)
			p->window += WIN_STEP;
		return;
	}
	if (now - p->win_cut_ns < rtt_ns)
		return; /* this round trip's delay has cut it already */
	p->win_cut_ns = now;
	in_use = flight < p->window ? flight : p->window;
	w = (uint64_t)((double)in_use * (double)target / (double)rtt_ns);
	/* at most halved a round trip, as TCP's multiplicative decrease: a
	 * peer descheduled for a few ms is no reason to drain the link (a
	 * deeper cut lost 6% of one 32 B flow's rate); a queue that stays
	 * is cut again the next round trip */
	if (w < in_use / 2)
		w = in_use / 2;
	p->window = w > WIN_MIN ? w : WIN_MIN;
	p->st.win_cuts++;
}

static uint64_t count_unacked(const struct peer *p)
{
	uint64_t n = 0;

	for (const struct flow *f = p->flows; f; f = f->peer_next)
		if (f->role == FLOW_SENDER && f->state == FLOW_OPEN)
			n += f->sent - f->acked;
	return n;
}

/* Data bytes the connection window lets into this send. */
static uint64_t win_room(struct peer *p)
{
	uint64_t now;

	if (!p->tp->byte_queue)
		return UINT64_MAX; /* no queue to bound (struct transport) */
	if (p->unacked < p->window)
		return p->window - p->unacked;
	now = fr_now_ns();
	if (now - p->win_counted_ns < WIN_RECOUNT_NS)
		return 0;
	p->win_counted_ns = now;
	p->unacked = count_unacked(p);
	return p->unacked < p->window ? p->window - p->unacked : 0;
}

static void add_data(struct peer *p, struct flow *f, uint64_t len,
		     uint64_t records)
{
	struct fr_ring *r = ring_of(f);
	uint64_t off = f->sent & r->mask, first = r->size - off;
	uint8_t *h = tx_header(p);

	wire_put(h, WIRE_DATA, f->id, (uint32_t)len, f->sent, 0);
	tx_add(p, h, WIRE_HDR);
	/* the send reads f's ring until it completes (peer_sent) */
	p->tx_flows[p->n_tx_flows++] = flow_get(f);
	f->tx_inflight++; /* no cut of its slot meanwhile (fanout.c) */
	if (first >= len) {
		tx_add(p, r->data + off, len);
	} else {
		tx_add(p, r->data + off, first); /* two pieces at the wrap */
		tx_add(p, r->data, len - first);
	}
	f->sent += len;
	if (f->sent > f->wire_max) /* (UINT64_MAX, not known, stays) */
		f->wire_max = f->sent;
	p->unacked += len;
	f->bytes_sent += len;
	f->st.records_sent += records;
	stats_sent(&f->st, f->sent, fr_now_ns());
}

/*
 * Every flow earns FLOW_QUANTUM a round, whatever record size it declared
 * (before, its quantum was one record of its largest size: a user who
 * declared 256 MiB records and sent 4 KiB ones took most of a shared link).
 * What it earned may grow to one record of that size, so such a record
 * goes once earned over several rounds, as in plain deficit round robin.
 */
static uint64_t deficit_cap(const struct flow *f)
{
	uint64_t rec = fr_record_bytes(f->view->ring.max_record);

	return rec > 2 * FLOW_QUANTUM ? rec : 2 * FLOW_QUANTUM;
}

static int build_data(struct peer *p);

/* Build and post the next send if none is in flight; returns work done.
 * flush: the credit owed goes too (the daemon is to sleep). */
static int tx_build(struct peer *p, bool flush)
{
	int work;

	if (p->state != PEER_UP || p->wr_op.busy || p->tx_niov)
		return 0;
	if (p->auth_fail[0] && !p->ctrlq) {
		peer_fail(p, "%s", p->auth_fail); /* our hello went */
		return 1;
	}
	if (p->ctrlq_overflow) {
		peer_fail(p, "does not read its replies (%u control frames, "
			  "%zu bytes queued)", p->ctrlq_frames, p->ctrlq_bytes);
		return 1;
	}
	if (p->ctrlq_nomem) { /* a frame lost would leave a flow waiting */
		peer_fail(p, "out of memory for a control frame: the link "
			  "starts over");
		return 1;
	}
	build_ctrl(p);
	work = (int)p->tx_niov + build_acks(p, flush) + build_data(p);
	if (!p->tx_niov && fr_now_ns() - p->last_tx_ns > HEARTBEAT_NS) {
		uint8_t *h = tx_header(p);

		wire_put(h, WIRE_HEARTBEAT, 0, 0, 0, 0);
		tx_add(p, h, WIRE_HDR);
		p->st.heartbeats++;
	}
	if (p->tx_niov) {
		p->st.sends++;
		p->tp->send(p);
	}
	return work;
}

/* ---- the active lists -------------------------------------------------------- */

/*
 * The flows a duty cycle visits, each peer's own, so that a peer's cycle
 * costs what its flows with work cost, whatever the number of open flows
 * and of peers:
 *   p->active  sender flows a producer rang for, those the tick's sweep
 *              found with records, and those that still have work (a
 *              window to wait for, more records); a flow leaves when it
 *              has nothing committed, after arming its ring (go_idle);
 *   p->owing   receiver flows with deposits not yet fully credited back
 *              (reported_head < sent); a flow leaves when the consumer
 *              has everything and the peer has been told.
 * A flow has one role and one peer, so it is on at most one list
 * (f->act_list); a flow off every peer is on none (the sweep, or the
 * deposit that comes once it has one, lists it), and one leaves its list
 * before it leaves its peer (mover_unlist).  m->n_listed counts them
 * all: the timer looks at them every TICK_MS while there are any.
 */
static struct flow_list *list_of(const struct flow *f)
{
	if (!f->peer)
		return NULL;
	return f->role == FLOW_SENDER ? &f->peer->active : &f->peer->owing;
}

static void armed_drop(struct peer_mgr *m, struct flow *f);

static void activate(struct peer_mgr *m, struct flow *f)
{
	struct flow_list *l = list_of(f);

	armed_drop(m, f); /* a ring or a look found it: no re-check owed */
	f->win_wait = false;
	if (f->active || !l)
		return;
	f->active = true;
	f->act_list = l;
	m->n_listed++;
	f->act_next = NULL;
	f->act_prev = l->tail;
	if (l->tail)
		l->tail->act_next = f;
	else
		l->head = f;
	l->tail = f;
	l->n++;
}

/*
 * A sender flow that had nothing to send and now has (its producers rang,
 * or the sweep found records): first in the next batch, ahead of the flows
 * that never ran dry.  It has used nothing of the link since it went idle,
 * and what it sends before its turn ends is at most what was committed
 * since (an idle flow keeps no deficit), so a sparse record does not wait
 * behind a batch of every busy flow (fair queueing's "new flow").  A flow
 * with more left after its turn goes to the tail like any other.  What it
 * gives up (fair queueing's known gaming): flows whose bursts run dry
 * between batches go ahead, a quantum each, of flows that never run dry.
 * Measured with `flowbench remote --bursty` (docs/performance.md): bursty
 * flows got at most 1.01 of a flat-out flow; two guards tried there were
 * not kept.
 */
static void activate_first(struct peer_mgr *m, struct flow *f)
{
	struct flow_list *l = list_of(f);

	if (f->active || !l || !l->head) {
		activate(m, f);
		return;
	}
	armed_drop(m, f);
	f->win_wait = false;
	f->active = true;
	f->act_list = l;
	m->n_listed++;
	f->act_prev = NULL;
	f->act_next = l->head;
	l->head->act_prev = f;
	l->head = f;
	l->n++;
}

static void deactivate(struct peer_mgr *m, struct flow *f)
{
	struct flow_list *l = f->act_list;

	if (!f->active)
		return;
	if (f->act_prev)
		f->act_prev->act_next = f->act_next;
	else
		l->head = f->act_next;
	if (f->act_next)
		f->act_next->act_prev = f->act_prev;
	else
		l->tail = f->act_prev;
	f->act_prev = f->act_next = NULL;
	f->active = false;
	f->act_list = NULL;
	l->n--;
	m->n_listed--;
}

void mover_unlist(struct peer_mgr *m, struct flow *f)
{
	deactivate(m, f);
}

/* Round robin between batches: the next one starts one flow later. */
static void rotate_active(struct peer *p)
{
	struct flow *f = p->active.head;

	if (!f || f == p->active.tail)
		return;
	deactivate(p->m, f);
	activate(p->m, f);
}

/*
 * Ring bytes of the record committed at f's send position (0: none yet).
 * The length is the producer's and may be garbage: next_span's scan is
 * what judges the record, before anything is sent.  A bad length here
 * only makes record_ready answer "no", or gives build_data's record that
 * goes alone more room than the window has, which the scan then refuses.
 */
static uint64_t committed_bytes(struct flow *f)
{
	struct fr_ring *r = ring_of(f);
	struct fr_rec *rec = fr_rec_at(r, f->sent);

	/* acquire: pairs with the producer's release of the seal, so the
	 * length read after it is the committed one */
	if (atomic_load_explicit(&rec->seal, memory_order_acquire) !=
	    fr_seal(r, f->sent, FR_SEAL_COMMITTED))
		return 0;
	return fr_record_bytes(atomic_load_explicit(&rec->len,
						    memory_order_relaxed));
}

/*
 * Could the mover send the record at f's send position now?  Committed,
 * and inside the peer consumer's window: a closed window opens only with
 * an ACK, which arrives as a network event and wakes us; polling for it
 * would spin.
 */
static bool record_ready(struct flow *f)
{
	uint64_t bytes = committed_bytes(f);

	return bytes && f->sent + bytes <= f->remote_head + ring_of(f)->size;
}

/*
 * Arming and the heavy fence.  A producer commits, fences lightly and
 * reads the arm (ipc/barrier.h); so a flow moverd armed and found empty is
 * listed, and before moverd sleeps longer than FM_BRIEF_SLEEP_NS with
 * flows listed it takes the heavy fence and looks at them again.  A flow
 * leaves the list when it is activated (its producer rang, or a look found
 * records): in a ping-pong or a paced flow each arm ends with a ring well
 * within the brief window, and the heavy fence is never taken.
 */
/* Something is armed from now on: the brief window starts with the first. */
static void armed_start(struct peer_mgr *m)
{
	if (!m->n_armed && !m->armed_all)
		m->armed_since_ns = fr_now_ns();
}

static void armed_drop(struct peer_mgr *m, struct flow *f)
{
	if (!f->arm_listed)
		return;
	f->arm_listed = false;
	for (unsigned i = 0; i < m->n_armed; i++) {
		if (m->armed[i] == f) {
			m->armed[i] = m->armed[--m->n_armed];
			break;
		}
	}
	if (!m->n_armed && !m->armed_all)
		m->armed_since_ns = 0;
}

static void armed_add(struct peer_mgr *m, struct flow *f)
{
	if (f->arm_listed)
		return;
	armed_start(m);
	if (m->n_armed == MOVER_ARMED_MAX) {
		m->armed_all = true; /* the re-check looks at every flow */
		return;
	}
	m->armed[m->n_armed++] = f;
	f->arm_listed = true;
}

/*
 * f had nothing committed: ask its producers to ring the doorbell on their
 * next commit, then look again (fr_bell_arm stores and fences; a producer
 * commits, fences lightly and reads the arm: one of the two sees the
 * other once moverd took the heavy fence, see armed_drop).
 */
static void go_idle(struct peer_mgr *m, struct flow *f)
{
	fr_bell_arm(ring_of(f));
	if (!record_ready(f)) {
		deactivate(m, f);
		armed_add(m, f);
	}
}

/*
 * f has a record its peer's consumer has no room for: it leaves the list
 * until the ACK that makes room (mover_window_moved), instead of being
 * looked at, and found waiting, in every cycle of its peer (a consumer
 * that stopped reading kept its flow costing every batch of the link).
 */
static bool window_closed(struct flow *f)
{
	uint64_t bytes = committed_bytes(f);

	return bytes && f->sent + bytes > f->remote_head + ring_of(f)->size;
}

static void wait_window(struct peer_mgr *m, struct flow *f)
{
	deactivate(m, f);
	f->win_wait = true;
}

void mover_window_moved(struct peer_mgr *m, struct flow *f)
{
	if (f->win_wait)
		activate(m, f);
}

/* ---- sending (data) -------------------------------------------------------- */

static int build_data(struct peer *p)
{
	struct peer_mgr *m = p->m;
	struct flow *f, *next, *last = p->active.tail;
	uint64_t total = 0, win = win_room(p);
	int spans = 0;

	/* each flow active at the start once; flows activated meanwhile
	 * (none are, in this loop) would wait for the next batch */
	for (f = p->active.head; f && total < BATCH_MAX && total < win &&
	     tx_room(p, 4); f = next) {
		uint64_t budget, room, first = 0, len, records, cap;
		bool idle;

		next = f == last ? NULL : f->act_next;
		if (f->state != FLOW_OPEN || !f->view) {
			deactivate(m, f); /* the sweep brings it back */
			continue;
		}
		if (p->tp->flow_ready && !p->tp->flow_ready(p, f)) {
			deactivate(m, f); /* woken when it is ready */
			continue;
		}
		/*
		 * Deficit round robin: each round a flow earns a quantum and
		 * sends whole records up to what it has earned; what it could
		 * not use carries over (a record larger than the rest of this
		 * batch waits for the next), an idle flow keeps nothing.
		 */
		if (f->deficit < deficit_cap(f))
			f->deficit += FLOW_QUANTUM;
		budget = f->deficit;
		/* a pad longer than a quantum (a client commits one of up to
		 * a lap) becomes pads of a quantum: whole, it went as one
		 * frame ahead of every other flow on the connection.  Not in
		 * fan-out, where another subscription's send in flight may
		 * be reading those bytes */
		if (!fanout_member(f))
			fr_split_pad(ring_of(f), f->sent, FLOW_QUANTUM);
		if (!total)
			first = committed_bytes(f);
		/* a record larger than any deficit it earns (a pad of a
		 * fan-out flow: of a refused batch, a recovery step, or a
		 * client's own, up to the lap's rest) goes whole when its
		 * flow comes first in a batch: else it waited for ever, the
		 * flow active and the mover spinning on it (a review: a cpu
		 * at 99%) */
		if (first > deficit_cap(f) && budget < first)
			budget = first;
		/* at most BATCH_MAX bytes a send, the first flow's too (it
		 * may have earned more); a record larger than that, or than
		 * what the window lets in, goes alone */
		cap = BATCH_MAX - total > first ? BATCH_MAX - total : first;
		if (budget > cap)
			budget = cap;
		room = win - total > first ? win - total : first;
		if (budget > room)
			budget = room;
		if (budget > WIRE_SPAN_MAX)
			budget = WIRE_SPAN_MAX; /* one frame's len, one WRITE */
		len = next_span(f, budget, &idle, &records);
		if (f->state != FLOW_OPEN) {
			deactivate(m, f); /* failed by what it read */
			continue;
		}
		f->deficit = idle || len > f->deficit ? 0 : f->deficit - len;
		if (len) {
			add_data(p, f, len, records);
			total += len;
			spans++;
		} else if (idle) {
			go_idle(m, f);
		} else if (window_closed(f)) {
			wait_window(m, f);
		}
	}
	rotate_active(p);
	return spans;
}

/* ---- doorbell ---------------------------------------------------------------- */

#ifndef IORING_OP_FUTEX_WAITV
#define IORING_OP_FUTEX_WAITV 53 /* Linux 6.7; Debian 12's headers predate it */
#endif

/*
 * A doorbell page (ipc/bell.h): a sealed memfd the clients of one uid map
 * from their attach answers.  moverd keeps privately which flow each bit
 * means; a bit a client sets or clears only makes a flow visited early or
 * late (the sweep), never an index moverd trusts.  Index of the new page,
 * or a negative errno.
 */
static int bell_page_new(struct peer_mgr *m, uid_t uid, bool shared)
{
	int fd = memfd_create("flowmover-bell", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *map;

	if (fd < 0)
		return -errno;
	/* sealed: a client cannot shrink it under moverd's mapping */
	if (ftruncate(fd, FB_BYTES) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	map = mmap(NULL, FB_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		close(fd);
		return -ENOMEM;
	}
	fb_format(map, (uint64_t)time(NULL));
	m->bells[m->n_bells] = (struct bell_page){
		.map = map, .fd = fd, .uid = uid, .id = ++m->bell_serial,
		.shared = shared,
	};
	return (int)m->n_bells++;
}

int mover_bell_start(struct peer_mgr *m)
{
	int rc;

	m->bell_flows = calloc(FB_BITS, sizeof(*m->bell_flows));
	m->bell_free = calloc(FB_BITS, sizeof(*m->bell_free));
	rc = m->bell_flows && m->bell_free ? bell_page_new(m, 0, false) :
					     -ENOMEM;
	if (rc >= 0)
		return 0;
	free(m->bell_flows);
	free(m->bell_free);
	m->bell_flows = NULL;
	m->bell_free = NULL;
	return rc;
}

/* Does a wait (the io_uring operation, or the thread's system call) still
 * refer to the pages' futex words? */
static bool bell_wait_busy(const struct peer_mgr *m)
{
	if (m->bell_mode == BELL_THREAD)
		return bell_thread_waiting(m->bell_thread);
	return m->bell_op.busy;
}

/* The mover sleeps on the old set of pages: end that wait, so that the
 * next sleep waits on the new set (a new page's producers may ring as
 * soon as they have the attach answer; a bit rung meanwhile is collected
 * when the wait ends; a page nobody uses any more is freed once no wait
 * refers to it). */
static void bell_wait_renew(struct peer_mgr *m)
{
	/* the wait itself, not bell_op: with the thread, bell_op is the
	 * read of its eventfd, which can be reaped while it is armed */
	if (!bell_wait_busy(m))
		return;
	if (m->bell_mode == BELL_THREAD)
		bell_thread_kick(m->bell_thread);
	else if (m->bell_mode == BELL_URING)
		loop_cancel(m->loop, &m->bell_op);
}

static int bell_page_find(const struct peer_mgr *m, uid_t uid, bool shared)
{
	for (unsigned k = 0; k < m->n_bells; k++)
		if (m->bells[k].shared == shared &&
		    (shared || m->bells[k].uid == uid))
			return (int)k;
	return -1;
}

/*
 * The page for a producer of uid: its own (made at its first producer's
 * attach), or, with BELL_PAGES - 1 pages of single uids in use, the one
 * page the uids past them share.  A uid never shares a page with the
 * uids that have one of their own.  Index, or a negative errno.
 */
static int bell_page_for(struct peer_mgr *m, uid_t uid)
{
	static struct log_limit lim;
	unsigned own = m->n_bells - (bell_page_find(m, 0, true) >= 0);
	int k = bell_page_find(m, uid, false);

	if (k >= 0)
		return k;
	if (own < BELL_PAGES - 1) {
		k = bell_page_new(m, uid, false);
		if (k >= 0) {
			log_debug("doorbell: page %d for uid %u", k,
				  (unsigned)uid);
			bell_wait_renew(m);
			return k;
		}
		log_limited(&lim, LOG_LVL_WARN, "doorbell: no page of its own "
			    "for uid %u (%s): it takes the shared page",
			    (unsigned)uid, strerror(-k));
	} else {
		log_limited(&lim, LOG_LVL_WARN, "doorbell: producers of more "
			    "than %u uids at once: uid %u takes the page the "
			    "uids past them share", BELL_PAGES - 1,
			    (unsigned)uid);
	}
	k = bell_page_find(m, 0, true);
	if (k >= 0)
		return k;
	k = bell_page_new(m, (uid_t)-1, true);
	if (k >= 0)
		bell_wait_renew(m);
	return k;
}

int mover_bell_take(struct peer_mgr *m, uid_t uid, uint64_t *page)
{
	int k, fd;

	*page = 0;
	if (!m->n_bells)
		return -ENOENT;
	k = bell_page_for(m, uid);
	if (k < 0)
		return k;
	/* a copy: the page may be freed before the answer is sent */
	fd = fcntl(m->bells[k].fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		int rc = -errno;

		if (k > 0 && !m->bells[k].producers)
			m->bells_unused++; /* a page just made, for nobody */
		return rc;
	}
	m->bells[k].producers++;
	*page = m->bells[k].id;
	return fd;
}

void mover_bell_put(struct peer_mgr *m, uint64_t page)
{
	for (unsigned k = 0; k < m->n_bells; k++) {
		if (m->bells[k].id != page)
			continue;
		/* root's page (0) stays */
		if (--m->bells[k].producers == 0 && k > 0) {
			m->bells_unused++;
			bell_wait_renew(m);
		}
		return;
	}
}

unsigned mover_bell_pages(const struct peer_mgr *m)
{
	return m->n_bells;
}

unsigned mover_bell_shared(const struct peer_mgr *m)
{
	int k = bell_page_find(m, 0, true);

	return k >= 0 ? m->bells[k].producers : 0;
}

unsigned mover_bell_index(struct peer_mgr *m, struct flow *f)
{
	uint32_t idx;

	if (f->role != FLOW_SENDER || !m->n_bells)
		return 0;
	if (f->bell_index)
		return f->bell_index;
	if (m->n_bell_free)
		idx = m->bell_free[--m->n_bell_free];
	else if (m->bell_next < FB_BITS)
		idx = m->bell_next++;
	else
		return 0; /* no bit left: its records are found by the sweep */
	m->bell_flows[idx] = f;
	f->bell_index = idx + 1;
	/* a new flow's producers ring from their first commit */
	activate(m, f);
	return f->bell_index;
}

void mover_forget_flow(struct peer_mgr *m, struct flow *f)
{
	armed_drop(m, f);
	deactivate(m, f);
	if (!f->bell_index)
		return;
	/* a ring of the old flow still mapped somewhere may ring this bit
	 * for the next flow that gets it: one visit for nothing */
	m->bell_flows[f->bell_index - 1] = NULL;
	m->bell_free[m->n_bell_free++] = f->bell_index - 1;
	f->bell_index = 0;
}

void mover_wake_flow(struct peer_mgr *m, struct flow *f)
{
	if (f->role != FLOW_LOCAL)
		activate(m, f);
}

/* The flows producers rang for in page b since the last call join the
 * active list.  Bounded: a client that keeps setting every bit of its
 * page costs one look at each bit handed out (bell_next). */
static void collect_page(struct peer_mgr *m, struct fr_bell *b)
{
	uint32_t ids[256];
	unsigned n, rounds = FB_BITS / 256;

	do {
		n = fb_collect(b, ids, 256);
		if (n)
			fmlt_mark(LT_BELL, n);
		for (unsigned i = 0; i < n; i++) {
			struct flow *f = ids[i] < m->bell_next ?
						 m->bell_flows[ids[i]] : NULL;

			if (!f)
				continue;
			/* the ring's producers ring the first flow's bit:
			 * its other peer hosts (fan-out) read the same ring */
			activate_first(m, f);
			for (struct flow *s = f->fanout; s; s = s->fanout_next)
				activate_first(m, s);
		}
	} while (n == 256 && --rounds);
}

static void collect_bell(struct peer_mgr *m)
{
	for (unsigned k = 0; k < m->n_bells; k++)
		collect_page(m, m->bells[k].map);
}

/* Pages whose producers all left are unmapped once no wait refers to
 * them; a client that keeps its mapping rings a page nobody reads (its
 * own uid's: its flows are gone from it).  Root's page (0) stays. */
static void bells_free_unused(struct peer_mgr *m)
{
	if (!m->bells_unused || bell_wait_busy(m))
		return;
	for (unsigned k = 1; k < m->n_bells;) {
		struct bell_page *p = &m->bells[k];

		if (p->producers) {
			k++;
			continue;
		}
		collect_page(m, p->map); /* what its last producers rang */
		log_debug("doorbell: page of uid %u freed", (unsigned)p->uid);
		munmap(p->map, FB_BYTES);
		close(p->fd);
		*p = m->bells[--m->n_bells];
	}
	m->bells_unused = 0;
}

/*
 * The doorbell sweep, a slice of the flow table at a time (peer.c,
 * police_slice: every flow once a round, POLICE_NS): each open sender flow
 * off the active list, and its fan-out siblings, is armed again and joins
 * the list if its producers have written past the send position.  A client
 * can clear its ring's arm word or the page's bits; this bounds what that
 * costs its own flow to one round, and it is how a producer that has no
 * page (a ring opened without moverd) or a producer that died mid-record
 * (fr_check_stuck, in next_span) is noticed.  It touches each idle flow's
 * control page: a sweep of every flow every 20 ms cost moverd ~1% of a cpu
 * at 1000 idle flows, every 100 ms still ~0.1% (moverd/README.md).
 */
static bool sweepable(const struct flow *f)
{
	/* the fields of struct flow's first line first */
	return f->role == FLOW_SENDER && flow_exposed(f) &&
	       f->state == FLOW_OPEN && f->peer && f->view && !f->active;
}

/* relaxed: fr_bell_arm's store without its fence, which the caller takes
 * once for the slice; the line is written only where a producer (or a
 * client) took the arm.  True if it was. */
static bool sweep_arm(struct flow *f)
{
	struct fr_shared *sh = ring_of(f)->sh;

	if (!sweepable(f) ||
	    atomic_load_explicit(&sh->bell_armed, memory_order_relaxed))
		return false;
	atomic_store_explicit(&sh->bell_armed, 1, memory_order_relaxed);
	return true;
}

static void sweep_look(struct peer_mgr *m, struct flow *f)
{
	/* relaxed: only a hint to visit; next_span checks */
	if (sweepable(f) && atomic_load_explicit(&ring_of(f)->sh->tail,
						 memory_order_relaxed) != f->sent)
		activate_first(m, f);
}

void mover_sweep(struct peer_mgr *m, struct flow *const *fs, unsigned n)
{
	bool armed = false;

	for (unsigned i = 0; i < n; i++) {
		armed |= sweep_arm(fs[i]);
		for (struct flow *s = fs[i]->fanout; s; s = s->fanout_next)
			armed |= sweep_arm(s);
	}
	/* the arms before the re-reads of the tails (fr_bell_arm's fence);
	 * the producers' fence is light: look at every flow again behind
	 * the heavy one before a long sleep */
	if (armed) {
		atomic_thread_fence(memory_order_seq_cst);
		armed_start(m);
		m->armed_all = true;
	}
	for (unsigned i = 0; i < n; i++) {
		sweep_look(m, fs[i]);
		for (struct flow *s = fs[i]->fanout; s; s = s->fanout_next)
			sweep_look(m, s);
	}
}

void bell_use_thread(struct peer_mgr *m)
{
	m->bell_thread = bell_thread_start();
	if (m->bell_thread) {
		m->bell_mode = BELL_THREAD;
		log_info("doorbell: futex_wait in a helper thread");
		return;
	}
	m->bell_mode = BELL_POLL;
	log_warn("doorbell thread: %s: an idle mover polls every millisecond",
		 strerror(errno));
}

static void bell_uring_done(struct loop_op *op, int res)
{
	struct peer_mgr *m = CONTAINER(op, struct peer_mgr, bell_op);

	if (res >= 0)
		m->rings++;
	if (res != -EINVAL && res != -EOPNOTSUPP)
		return; /* the loop collects the bits */
	log_info("no io_uring FUTEX_WAITV on this kernel (before Linux 6.7)");
	bell_use_thread(m);
}

static void bell_thread_done(struct loop_op *op, int res)
{
	struct peer_mgr *m = CONTAINER(op, struct peer_mgr, bell_op);

	/* the eventfd fired: waking the loop was the whole point */
	if (res > 0)
		m->rings++;
}

/* An active flow with a record it could send now (no send in flight:
 * its completion wakes us, do not spin on it). */
static bool active_ready(struct peer_mgr *m)
{
	for (struct peer *p = m->peers; p; p = p->next) {
		if (p->wr_op.busy || !p->active.n || !win_room(p))
			continue;
		for (struct flow *f = p->active.head; f; f = f->act_next)
			if (f->state == FLOW_OPEN && f->view && record_ready(f))
				return true;
	}
	return false;
}

/* Native: one IORING_OP_FUTEX_WAITV on every page's word.  A wait armed
 * in an earlier idle period is still queued on the same words (a new page
 * ends it: bell_wait_renew), with the values of then: a ring since bumped
 * a word, and the wait ended. */
static int arm_bell_uring(struct peer_mgr *m)
{
	struct io_uring_sqe *sqe;

	if (m->bell_op.busy)
		return 1000;
	sqe = loop_sqe(m->loop, &m->bell_op, bell_uring_done);
	if (!sqe)
		return 1;
	io_uring_prep_rw(IORING_OP_FUTEX_WAITV, sqe, 0, m->bell_wait,
			 m->n_bell_wait, 0);
	return 1000;
}

/* Doorbell thread: keep a read of its eventfd in flight and arm it. */
static int arm_bell_thread(struct peer_mgr *m)
{
	struct io_uring_sqe *sqe;

	if (!m->bell_op.busy) {
		sqe = loop_sqe(m->loop, &m->bell_op, bell_thread_done);
		if (!sqe)
			return 1;
		io_uring_prep_read(sqe, bell_thread_fd(m->bell_thread),
				   &m->bell_count, sizeof(m->bell_count), 0);
	}
	/* a page to free, which bells_free_unused could not because the
	 * helper was still in the wait the last put kicked: it may have
	 * left it since, and arming now would put it back on that page
	 * with nothing to end the wait (the page never freed: test_hostile
	 * 8d, 1 run in 12 under ASan).  Its eventfd write wakes us (or the
	 * timeout does); we free then, and arm on the next sleep */
	if (m->bells_unused)
		return 1000;
	/* -EBUSY: the last wait, on the same words, has not ended yet (a
	 * new page kicked it: bell_wait_renew) */
	bell_thread_arm(m->bell_thread, m->bell_wait, m->n_bell_wait);
	return 1000;
}

/*
 * Behind the heavy fence: has f a record committed at its send position?
 * The producer's half of the pairing is its seal (commit, light fence,
 * read the arm), so that is what to look at, not the tail: a claim still
 * open moves the tail past a seal not yet committed, and taking that for
 * records made moverd wake every brief window, a heavy fence each (an IPI
 * to every cpu running a flowshm client, any user's), for as long as the
 * claim stayed open.  A claim whose producer died is the sweep's to notice
 * (sweep_look, once a round).
 */
static void recheck_look(struct peer_mgr *m, struct flow *f)
{
	if (sweepable(f) && committed_bytes(f))
		activate_first(m, f);
}

/* The heavy fence, then every listed flow (or every flow) looked at
 * again; true if one has records (it is active again). */
static bool armed_recheck(struct peer_mgr *m)
{
	unsigned before = m->n_listed;

	for (unsigned i = 0; i < m->n_armed; i++) {
		m->armed[i]->arm_listed = false;
		recheck_look(m, m->armed[i]);
	}
	m->n_armed = 0;
	if (m->armed_all) {
		for (struct flow *f = m->flows->head; f; f = f->next) {
			recheck_look(m, f);
			for (struct flow *s = f->fanout; s; s = s->fanout_next)
				recheck_look(m, s);
		}
	}
	m->armed_all = false;
	m->armed_since_ns = 0;
	return m->n_listed != before;
}

/* Before a sleep: -1 no limit, 0 do not sleep (records found), else
 * the most ms to sleep (flows armed within the brief window, or no
 * membarrier on this host: every flow looked at after each brief sleep). */
static int armed_before_sleep(struct peer_mgr *m)
{
	uint64_t now, left;

	if (!m->n_armed && !m->armed_all)
		return -1;
	now = fr_now_ns();
	if (now - m->armed_since_ns < FM_BRIEF_SLEEP_NS) {
		left = m->armed_since_ns + FM_BRIEF_SLEEP_NS - now;
		return (int)((left + 999999) / 1000000);
	}
	if (!fm_fence_heavy()) {
		bool found = armed_recheck(m);

		m->armed_all = true;
		m->armed_since_ns = now;
		return found ? 0 : (int)(FM_BRIEF_SLEEP_NS / 1000000);
	}
	return armed_recheck(m) ? 0 : -1;
}

static int sleep_cap(int armed, int ms)
{
	return armed > 0 && ms > armed ? armed : ms;
}

/* The daemon is to sleep: the credit still owed goes now (ack_wanted).
 * True if a send was built: look again before sleeping. */
static bool flush_acks(struct peer_mgr *m)
{
	int work = 0;

	for (struct peer *p = m->peers; p; p = p->next)
		work += tx_build(p, true);
	return work > 0;
}

/*
 * fb_prepare_sleep, for every page: it reads the word, sets `sleeping`,
 * fences and looks for rung bits; a producer rings (bits), fences and
 * reads `sleeping` of its own page: either we see its bit or it bumps the
 * word we wait on.  True if a bit was there (do not sleep).  The words and
 * the values seen go to bell_wait.
 */
static bool bells_prepare_sleep(struct peer_mgr *m)
{
	for (unsigned k = 0; k < m->n_bells; k++) {
		struct fr_bell *b = m->bells[k].map;
		uint32_t v;

		if (fb_prepare_sleep(b, &v))
			return true;
		m->bell_wait[k] = (struct futex_waitv){
			.val = v, .uaddr = (uintptr_t)&b->futex,
			.flags = FUTEX_32,
		};
	}
	m->n_bell_wait = m->n_bells;
	return false;
}

int peer_prepare_sleep(struct peer_mgr *m)
{
	int armed;

	if (flush_acks(m))
		return 0;
	armed = armed_before_sleep(m);
	if (armed == 0)
		return 0;
	if (m->rdma && !rdma_transport.arm(m))
		return 0; /* completions arrived meanwhile */
	if (!m->n_bells || m->bell_mode == BELL_POLL)
		return sleep_cap(armed, m->bell_next ? 1 : 1000);
	/* before the next wait is armed: once armed on an unused page, the
	 * doorbell thread would keep it until a producer rings */
	bells_free_unused(m);
	if (bells_prepare_sleep(m) || active_ready(m)) {
		peer_woke(m);
		return 0;
	}
	m->sleeps++;
	return sleep_cap(armed, m->bell_mode == BELL_THREAD ?
					arm_bell_thread(m) :
					arm_bell_uring(m));
}

const char *peer_doorbell_name(const struct peer_mgr *m)
{
	static const char *const names[] = {
		[BELL_URING] = "io_uring", [BELL_THREAD] = "thread",
		[BELL_POLL] = "poll",
	};

	return names[m->bell_mode];
}

void peer_woke(struct peer_mgr *m)
{
	for (unsigned k = 0; k < m->n_bells; k++)
		fb_woke(m->bells[k].map);
}

/* ---- the duty cycle -------------------------------------------------------- */

int peer_do_work(struct peer_mgr *m)
{
	int work;

	reap_peers(m);
	collect_bell(m);
	bells_free_unused(m);
	work = m->rdma ? rdma_transport.poll(m) : 0;
	work += (int)m->rx_deposits;
	m->rx_deposits = 0;
	for (struct peer *p = m->peers; p; p = p->next)
		work += tx_build(p, false);
	if (work) {
		fmlt_mark(LT_WORK, (uint64_t)work);
		m->last_work_ns = fr_now_ns();
	}
	return work;
}
