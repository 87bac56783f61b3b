/*
 * moverd/mover.c - the mover: how records are chosen and batched into each
 * send, and the doorbell that wakes an idle mover.
 *
 * Each peer has at most one send in flight (peer.c, the transport):
 *
 *   send: control frames first, then acknowledgements of receiver flows,
 *         then data of sender flows, round robin with a per-flow quantum
 *         (a bulk flow cannot starve a small one), up to BATCH_MAX bytes.
 *         Data goes from the producer ring's mapping straight to sendmsg.
 *         Nothing waits for more data: when the link is idle, whatever is
 *         committed goes at once; while a send is in flight, records pile
 *         up and leave together in the next one.
 *
 * A producer ring's words are checked where they are read (next_span):
 * a corrupt record or tail fails its own flow only (fail_sender, peer.c).
 * What peers say to each other (hello, open, close, receiving) is peer.c.
 */
#include "mover.h"
#include "peer_impl.h"
#include "bell_thread.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- sending ------------------------------------------------------------- */

static bool tx_room(const struct peer *p, unsigned iovs)
{
	return p->tx_niov + iovs <= TX_MAX_IOV;
}

/* A header slot for the send being built (never more than its iovs). */
static uint8_t *tx_header(struct peer *p)
{
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
	}
}

/* Receiver flows: acknowledge deposits, return consumer credit lazily. */
static int build_acks(struct peer *p)
{
	int n = 0;

	for (struct flow *f = p->flows; f && tx_room(p, 2); f = f->peer_next) {
		struct fr_ring *r;
		uint64_t head;
		uint8_t *h;

		if (f->role != FLOW_RECEIVER || f->state != FLOW_OPEN ||
		    !consumer_head(p, f, &head))
			continue;
		r = ring_of(f);
		if (!f->ack_due && head - f->reported_head < r->size / 4 &&
		    !(head == f->sent && head != f->reported_head))
			continue;
		h = tx_header(p);
		wire_put(h, WIRE_ACK, f->id, 0, f->sent, head);
		tx_add(p, h, WIRE_HDR);
		f->reported_head = head;
		f->ack_due = false;
		n++;
	}
	return n;
}

/* The next committed span of a sender flow, within window and quantum. */
/*
 * The next committed span of a sender flow (whole records) within the
 * peer consumer's window and `budget` bytes.  *idle: nothing committed.
 */
static uint64_t next_span(struct flow *f, uint64_t budget, bool *idle)
{
	struct fr_ring *r = ring_of(f);
	uint64_t limit = f->remote_head + r->size, end;
	bool stuck;
	int rc;

	*idle = false;
	if (limit > f->sent + budget)
		limit = f->sent + budget;
	rc = fr_scan(r, f->sent, limit, &end, &stuck);
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
			return next_span(f, budget, idle);
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

static void add_data(struct peer *p, struct flow *f, uint64_t len)
{
	struct fr_ring *r = ring_of(f);
	uint64_t off = f->sent & r->mask, first = r->size - off;
	uint8_t *h = tx_header(p);

	wire_put(h, WIRE_DATA, f->id, (uint32_t)len, f->sent, 0);
	tx_add(p, h, WIRE_HDR);
	/* the send reads f's ring until it completes (peer_sent) */
	p->tx_flows[p->n_tx_flows++] = flow_get(f);
	if (first >= len) {
		tx_add(p, r->data + off, len);
	} else {
		tx_add(p, r->data + off, first); /* two pieces at the wrap */
		tx_add(p, r->data, len - first);
	}
	f->sent += len;
	f->bytes_sent += len;
}

/* A flow's quantum: FLOW_QUANTUM, or one record of its largest size. */
static uint64_t flow_quantum(const struct flow *f)
{
	uint64_t rec = fr_record_bytes(f->view->ring.max_record);

	return rec > FLOW_QUANTUM ? rec : FLOW_QUANTUM;
}

static int build_data(struct peer *p)
{
	unsigned n = flow_count(p), start;
	uint64_t total = 0;
	struct flow *f = p->flows;
	int spans = 0;

	if (!n)
		return 0;
	start = p->m->rr++ % n;
	for (unsigned i = 0; i < start; i++)
		f = f->peer_next;
	for (unsigned i = 0; i < n && total < BATCH_MAX && tx_room(p, 4); i++) {
		uint64_t len;

		if (f->role == FLOW_SENDER && f->state == FLOW_OPEN) {
			uint64_t quantum = flow_quantum(f), budget;
			bool idle;

			/*
			 * Deficit round robin: each round a flow earns a
			 * quantum and sends whole records up to what it has
			 * earned; what it could not use carries over (a
			 * record larger than the rest of this batch waits
			 * for the next), an idle flow keeps nothing.
			 */
			if (f->deficit < 2 * quantum)
				f->deficit += quantum;
			budget = f->deficit;
			if (total && budget > BATCH_MAX - total)
				budget = BATCH_MAX - total;
			len = next_span(f, budget, &idle);
			f->deficit = idle ? 0 : f->deficit - len;
			if (len) {
				add_data(p, f, len);
				total += len;
				spans++;
			}
		}
		f = f->peer_next ? f->peer_next : p->flows;
	}
	return spans;
}

/* Build and post the next send if none is in flight; returns work done. */
static int tx_build(struct peer *p)
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
	build_ctrl(p);
	work = (int)p->tx_niov + build_acks(p) + build_data(p);
	if (!p->tx_niov && fr_now_ns() - p->last_tx_ns > HEARTBEAT_NS) {
		uint8_t *h = tx_header(p);

		wire_put(h, WIRE_HEARTBEAT, 0, 0, 0, 0);
		tx_add(p, h, WIRE_HDR);
	}
	if (p->tx_niov)
		p->tp->send(p);
	return work;
}

/* ---- doorbell -------------------------------------------------------------- */

#ifndef IORING_OP_FUTEX_WAITV
#define IORING_OP_FUTEX_WAITV 53 /* Linux 6.7; Debian 12's headers predate it */
#endif

void bell_use_thread(struct peer_mgr *m)
{
	m->bell_thread = bell_thread_start();
	if (m->bell_thread) {
		m->bell_mode = BELL_THREAD;
		log_info("doorbell: futex_waitv in a helper thread");
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
		m->rings++; /* res: which word was woken */
	if (res != -EINVAL && res != -EOPNOTSUPP)
		return; /* the loop re-checks the rings */
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

/* Open sender flows: the ones whose producers ring the doorbell. */
static struct flow *bell_flow(struct peer_mgr *m, struct peer **pp,
			      struct flow *f)
{
	struct peer *p = *pp;

	f = f ? f->peer_next : (p ? p->flows : NULL);
	for (;;) {
		for (; f; f = f->peer_next) {
			if (f->role == FLOW_SENDER && f->state == FLOW_OPEN &&
			    f->view) {
				*pp = p;
				return f;
			}
		}
		if (!p || !(p = p->next))
			break;
		f = p->flows;
	}
	*pp = NULL;
	(void)m;
	return NULL;
}

/* Set every flag and collect the futex words; false if more than max. */
static bool ring_bell_flags(struct peer_mgr *m, uint64_t *sig, unsigned max)
{
	struct peer *p = m->peers;

	m->n_bell = 0;
	*sig = 0;
	for (struct flow *f = bell_flow(m, &p, NULL); f; f = bell_flow(m, &p, f)) {
		struct fr_shared *sh = ring_of(f)->sh;

		if (m->n_bell == max)
			return false;
		/* acquire: read the word before re-checking the ring (as a
		 * consumer does in fr_wait_data) */
		m->bell[m->n_bell++] = (struct futex_waitv){
			.val = atomic_load_explicit(&sh->data_futex,
						    memory_order_acquire),
			.uaddr = (uintptr_t)&sh->data_futex,
			.flags = FUTEX_32,
		};
		/* our own mark, apart from the clients' count of sleepers:
		 * idempotent, and peer_woke clears it whatever we armed */
		atomic_fetch_or_explicit(&sh->consumers_waiting,
					 FR_WAITING_MOVERD,
					 memory_order_relaxed);
		*sig = *sig * 31 + (uintptr_t)sh;
	}
	return true;
}

/*
 * Could the mover send the record at f's send position now?  Committed,
 * and inside the peer consumer's window: a closed window opens only with
 * an ACK, which arrives as a network event and wakes us; polling for it
 * would spin.  (A garbage length only makes this answer "no": the scan in
 * next_span is what judges the record.)
 */
static bool record_ready(struct flow *f)
{
	struct fr_ring *r = ring_of(f);
	struct fr_rec *rec = fr_rec_at(r, f->sent);
	uint32_t len;

	/* acquire: pairs with the producer's release of the seal, so the
	 * length read after it is the committed one */
	if (atomic_load_explicit(&rec->seal, memory_order_acquire) !=
	    fr_seal(r, f->sent, FR_SEAL_COMMITTED))
		return false;
	len = atomic_load_explicit(&rec->len, memory_order_relaxed);
	return f->sent + fr_record_bytes(len) <= f->remote_head + r->size;
}

/* Did a producer commit at some flow's send position meanwhile? */
static bool bell_data_ready(struct peer_mgr *m)
{
	struct peer *p = m->peers;

	for (struct flow *f = bell_flow(m, &p, NULL); f; f = bell_flow(m, &p, f)) {
		/* a send in flight: its completion wakes us, do not spin */
		if (f->peer->wr_op.busy)
			continue;
		if (record_ready(f))
			return true;
	}
	return false;
}

/* Native doorbell: one IORING_OP_FUTEX_WAITV.  Loop timeout in ms. */
static int arm_bell_uring(struct peer_mgr *m, uint64_t sig)
{
	struct io_uring_sqe *sqe;

	if (m->bell_op.busy) { /* armed in an earlier idle period */
		if (m->bell_sig == sig)
			return 1000;
		/* the set of rings changed: cancel, re-arm when it ends */
		sqe = io_uring_get_sqe(&m->loop->ring);
		if (!sqe)
			return 1;
		io_uring_prep_cancel(sqe, &m->bell_op, 0);
		io_uring_sqe_set_data(sqe, NULL);
		m->bell_sig = 0;
		return 1000;
	}
	sqe = loop_sqe(m->loop, &m->bell_op, bell_uring_done);
	if (!sqe)
		return 1;
	io_uring_prep_rw(IORING_OP_FUTEX_WAITV, sqe, 0, m->bell, m->n_bell, 0);
	m->bell_sig = sig;
	return 1000;
}

/* Doorbell thread: keep a read of its eventfd in flight and arm it. */
static int arm_bell_thread(struct peer_mgr *m, uint64_t sig)
{
	struct io_uring_sqe *sqe;
	int rc;

	if (!m->bell_op.busy) {
		sqe = loop_sqe(m->loop, &m->bell_op, bell_thread_done);
		if (!sqe)
			return 1;
		io_uring_prep_read(sqe, bell_thread_fd(m->bell_thread),
				   &m->bell_count, sizeof(m->bell_count), 0);
	}
	rc = bell_thread_arm(m->bell_thread, m->bell, m->n_bell);
	if (rc == 0)
		m->bell_sig = sig;
	else if (rc == -EBUSY && m->bell_sig != sig)
		bell_thread_kick(m->bell_thread); /* stale set: re-arm after */
	return 1000;
}

int peer_prepare_sleep(struct peer_mgr *m)
{
	struct peer *p = m->peers;
	unsigned max = m->bell_mode == BELL_THREAD ? BELL_THREAD_MAX : BELL_MAX;
	uint64_t sig;

	if (m->rdma && !rdma_transport.arm(m))
		return 0; /* completions arrived meanwhile */
	if (!bell_flow(m, &p, NULL))
		return 1000; /* no sender flow: sleep until an event */
	if (m->bell_mode == BELL_POLL)
		return 1;
	if (!ring_bell_flags(m, &sig, max)) {
		peer_woke(m);
		return 1;
	}
	/*
	 * Full fence between setting the flags and re-checking the rings;
	 * a producer's commit does the mirror image (seal, fence, flag), so
	 * either we see its record or it sees our flag and wakes the futex.
	 */
	atomic_thread_fence(memory_order_seq_cst);
	if (bell_data_ready(m)) {
		peer_woke(m);
		return 0;
	}
	m->sleeps++;
	return m->bell_mode == BELL_THREAD ? arm_bell_thread(m, sig) :
					     arm_bell_uring(m, sig);
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
	struct peer *p = m->peers;

	for (struct flow *f = bell_flow(m, &p, NULL); f; f = bell_flow(m, &p, f))
		atomic_fetch_and_explicit(&ring_of(f)->sh->consumers_waiting,
					  ~FR_WAITING_MOVERD,
					  memory_order_relaxed);
}

/* ---- the duty cycle -------------------------------------------------------- */

int peer_do_work(struct peer_mgr *m)
{
	int work;

	reap_peers(m);
	work = m->rdma ? rdma_transport.poll(m) : 0;
	work += (int)m->rx_deposits;
	m->rx_deposits = 0;
	for (struct peer *p = m->peers; p; p = p->next)
		work += tx_build(p);
	if (work)
		m->last_work_ns = fr_now_ns();
	return work;
}
