/*
 * moverd/rdma.c - the RDMA transport: one RC queue pair per peer daemon,
 * shared by every flow between the two, set up with librdmacm.
 *
 * Sending a batch the protocol built (see peer_impl.h) is one chain of
 * work requests posted at once, only the last one signalled:
 *   DATA      one RDMA WRITE per producer-ring span (two at the wrap),
 *             straight from the registered producer ring into the peer's
 *             registered consumer ring at the same offsets, then a SEND of
 *             the 32-byte header.  On an RC queue pair the header's receive
 *             completes only after the WRITEs before it are placed, so the
 *             receiver may publish what the header describes.  No reliance
 *             on byte placement order inside a WRITE.
 *   others    a SEND of the frame (control messages, acknowledgements,
 *             heartbeats) from a registered staging buffer.
 * WRITEs and SENDs up to the device's inline limit (we ask for 64 bytes)
 * are posted inline.
 * Receives are pre-posted buffers, re-posted as soon as a frame is
 * handled, so the peer never meets receiver-not-ready in steady state
 * (and rnr_retry is infinite should it happen).
 *
 * Completions are polled in user space on every turn of the duty cycle;
 * before moverd sleeps it arms CQ notification, and the completion
 * channel's fd wakes the io_uring loop.  rdma_cm events arrive the same
 * way, through the event channel's fd.
 *
 * Consumer rings are registered for remote write only on the connection
 * of the peer that feeds them; producer rings for local access only.
 * Registration (ibv_reg_mr pins, and so faults in, every page of a ring:
 * a second or more for a big ring under emulation) runs on the
 * registration thread (reg_thread.h), never on the loop.  The answer to
 * a receiver's OPEN waits for its consumer ring's (open_flow says
 * -EINPROGRESS; peer.c holds the answer and sends it when reg_reaped
 * calls peer_flow_prepared).  The mover skips a sender flow until its producer
 * ring is registered (rdma_flow_ready, asked first when the peer's OPENED
 * wakes the flow).  A request in flight holds its flow and its
 * connection's PD: a connection closed meanwhile is freed, PD last, when
 * its last request is taken back.
 */
#include "peer_impl.h"
#include "log.h"
#include "mover.h"
#include "reg_thread.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RECV_BUFS   64
#define RECV_BYTES  (WIRE_HDR + WIRE_MAX_CTRL)
#define STAGE_BYTES (1u << 20)
/*
 * Until its hello authenticates it, a connection gets PREAUTH_RECVS of
 * its receive buffers and PREAUTH_STAGE of its staging buffer registered
 * (pinned): the handshake's frames fit (a hello, an auth, each well below
 * either), and a stranger pins ~320 KiB instead of 5.2 MiB, times
 * --peer-max-pending.  The rest is registered and posted once it is
 * authenticated (rdma_authenticated); a peer that sends more meanwhile
 * meets receiver-not-ready and retries (rnr_retry is infinite).
 */
#define PREAUTH_RECVS 4
#define PREAUTH_STAGE (64u << 10)
#define SQ_DEPTH    512
#define CQ_DEPTH    (SQ_DEPTH + RECV_BUFS)
#define INLINE_WANT 64

/*
 * The device's life: OK; GOING once its removal is seen (every RDMA peer
 * is failed and closes at the top of a later cycle); RELEASED once nothing
 * of ours holds it but the device context; GONE once that is closed too.
 * The kernel waits for all of that before it can finish the removal.
 */
enum dev_state { DEV_OK, DEV_GOING, DEV_RELEASED, DEV_GONE };

struct rdma_shared {
	struct peer_mgr *m;
	struct rdma_event_channel *ec;
	struct ibv_comp_channel *cc; /* one per device context: rxe0 here */
	struct ibv_context *verbs;
	char dev_name[IBV_SYSFS_NAME_MAX];
	struct rdma_cm_id *listen_id;
	struct loop_op ec_op, cc_op;
	struct loop_op async_op;     /* the device's asynchronous events */
	short ec_events, cc_events;
	bool cq_armed;
	enum dev_state dev;
	uint64_t dev_check_ns;       /* next look at the device list */
	/* ring registrations run here, off the loop (reg_thread.h) */
	struct reg_thread *reg;
	struct loop_op reg_op;
	unsigned n_inflight;         /* requests the thread has */
};

/* A registration holds a reference to its flow (struct flow), so the
 * pages it pins are the ring's until it is deregistered.  flow is NULL
 * once the flow is forgotten (orphan): a producer ring's until the batch
 * in flight ends; a consumer ring's whose sender was refused (kept) until
 * that sender's CLOSE of sender_id, or the connection's end. */
struct flow_mr {
	struct flow *flow;
	struct flow *ref;
	struct ibv_mr *mr;
	bool kept;
	uint32_t sender_id;
};

/* Consumer rings kept registered for their refused senders, at most, per
 * connection: past them another kept one goes (a WRITE of its sender
 * still on the way once it is deregistered then fails the connection, as
 * before they were kept). */
#define KEPT_MAX 16u

/*
 * A registration in flight on the registration thread.  Until the loop
 * takes it back it owns what it refers to: a reference to its flow (the
 * pages) and its connection (whose protection domain it registers in: a
 * connection closed meanwhile keeps its PD until the last of its
 * registrations is taken back, see rdma_close).  flow is NULL once the
 * flow is forgotten on the connection: the result is deregistered.
 */
struct pending_reg {
	struct reg_req req;
	struct pending_reg *next;    /* the connection's */
	struct rdma_conn *c;
	struct flow *flow;
	struct flow *ref;
};

/*
 * A deregistration in flight on the same thread (dereg_later): the loop
 * no longer waits for ibv_dereg_mr (~18 ms per GiB in the guest, for
 * every ring of a connection that closes).  It owns the flow reference
 * that keeps the pages until the device lets go of them, and holds its
 * connection's PD as a registration does (n_deregs).
 */
struct pending_dereg {
	struct reg_req req;
	struct rdma_conn *c;
	struct flow *ref;
};

struct rdma_conn {
	struct rdma_shared *s;
	struct peer *p;              /* NULL once closed */
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *recv_mr, *stage_mr;   /* what receives and sends use */
	struct ibv_mr *early_recv, *early_stage; /* the handshake's, kept
						   * until close (WRs used them) */
	uint8_t *recv_bufs, *stage;
	size_t stage_len;                    /* registered: what may be staged */
	unsigned max_inline;
	bool qp_ready;
	bool hung_up;   /* the peer disconnected: take what came, post nothing */
	bool shut;      /* rdma_shutdown: its QP may hold WRs until close */
	uint64_t begun_ns; /* the connect request came, or ours began: the
			    * deadline of its coming up (connect_deadlines) */
	/* every ring registered on this connection, grown as flows come:
	 * bounded by the flows a peer may have here (--peer-max-flows, and
	 * ours), and those orphaned until the batch in flight completes */
	struct flow_mr *mrs;
	unsigned n_mrs, cap_mrs;
	/* its registrations and deregistrations in flight: a closed
	 * connection is freed when the last one is taken back */
	struct pending_reg *pending;
	unsigned n_deregs;
	uint64_t dereg_bytes; /* ... of those: still pinned until they end */
	struct ibv_send_wr wr[SQ_DEPTH];
	struct ibv_sge sge[SQ_DEPTH];
	/* the wr_id of the signalled last WR of the batch in flight (valid
	 * while p->wr_op.busy): the one completion that means "sent" */
	uint64_t sent_wr_id;
};

static struct rdma_shared *shared(struct peer_mgr *m)
{
	return m->rdma;
}

static struct rdma_conn *conn(struct peer *p)
{
	return p->tp_data;
}

/* ---- memory registration -------------------------------------------------- */

/* Room for one more registration (twice the table, 16 at first). */
static bool mrs_room(struct rdma_conn *c)
{
	unsigned cap = c->cap_mrs ? c->cap_mrs * 2 : 16;
	struct flow_mr *m;

	if (c->n_mrs < c->cap_mrs)
		return true;
	if (!(m = realloc(c->mrs, cap * sizeof(*m))))
		return false;
	c->mrs = m;
	c->cap_mrs = cap;
	return true;
}

static struct ibv_mr *find_mr(struct rdma_conn *c, struct flow *f)
{
	if (f->mr && f->mr_conn == c)
		return f->mr; /* the common case: no walk of every flow's */
	for (unsigned i = 0; i < c->n_mrs; i++)
		if (c->mrs[i].flow == f)
			return c->mrs[i].mr;
	return NULL;
}

static const char *reg_hint(int err)
{
	return err == ENOMEM || err == EPERM ?
		       " (raise RLIMIT_MEMLOCK: ulimit -l)" : "";
}

static void log_reg_error(struct flow *f, int err)
{
	log_error("flow %s: ibv_reg_mr of %llu bytes: %s%s", f->name,
		  (unsigned long long)ring_of(f)->size, strerror(err),
		  reg_hint(err));
}

static struct pending_reg *pending_for(struct rdma_conn *c,
				       const struct flow *f)
{
	for (struct pending_reg *r = c->pending; r; r = r->next)
		if (r->flow == f)
			return r;
	return NULL;
}

/*
 * Register f's ring on p's connection, on the registration thread:
 * -EINPROGRESS (the answer comes to reg_reaped), also when one is in
 * flight already; -ENOMEM.
 */
static int start_reg(struct peer *p, struct flow *f, int access)
{
	struct rdma_shared *s = shared(p->m);
	struct rdma_conn *c = conn(p);
	struct fr_ring *r = ring_of(f);
	struct pending_reg *pr;

	/* never twice: one in flight answers this open too, also one that
	 * was forgotten meanwhile (unprepare: its open was superseded), or
	 * a peer opening a flow on two connections by turns would queue a
	 * registration per OPEN, each thrown away */
	for (pr = c->pending; pr; pr = pr->next) {
		if (pr->ref == f) {
			pr->flow = f;
			return -EINPROGRESS;
		}
	}
	if (!(pr = calloc(1, sizeof(*pr))))
		return -ENOMEM;
	pr->req = (struct reg_req){ .pd = c->pd, .addr = r->data,
				    .len = r->size, .access = access };
	pr->c = c;
	pr->flow = f;
	pr->ref = flow_get(f); /* the pages stay until it is taken back */
	pr->next = c->pending;
	c->pending = pr;
	s->n_inflight++;
	log_debug("flow %s: registering its ring (%llu bytes) off the loop",
		  f->name, (unsigned long long)r->size);
	reg_thread_submit(s->reg, &pr->req);
	return -EINPROGRESS;
}

/* f no longer has its registration on c (dropped, or orphaned). */
static void forget_cached(struct rdma_conn *c, struct flow *f)
{
	if (f && f->mr_conn == c) {
		f->mr = NULL;
		f->mr_conn = NULL;
	}
}

/* ibv_dereg_mr failed: the device may still use the pages, so ref (the
 * flow reference that keeps them) is never put. */
static void dereg_failed(struct flow *ref, int err)
{
	log_error("flow %s: ibv_dereg_mr: %s (its ring's pages are kept)",
		  ref->name, strerror(err));
}

/* Deregister mr now, on the loop; then ref goes. */
static void dereg_now(struct ibv_mr *mr, struct flow *ref)
{
	int err = ibv_dereg_mr(mr);

	if (err) {
		dereg_failed(ref, err);
		return;
	}
	flow_put(ref); /* after the deregistration: no DMA to its pages */
}

/* Deregister mr (in c's PD) on the registration thread; ref, the flow
 * reference that keeps its pages, goes when it has ended (dereg_reaped).
 * Stopped, or no memory for the request: now, on the loop. */
static void dereg_later(struct rdma_conn *c, struct ibv_mr *mr,
			struct flow *ref)
{
	struct rdma_shared *s = c->s;
	struct pending_dereg *pd = s->reg ? calloc(1, sizeof(*pd)) : NULL;

	if (!pd) {
		dereg_now(mr, ref);
		return;
	}
	pd->req = (struct reg_req){ .op = REG_OP_DEREGISTER, .mr = mr,
				    .len = mr->length };
	pd->c = c;
	pd->ref = ref;
	c->n_deregs++;
	c->dereg_bytes += mr->length;
	s->n_inflight++;
	reg_thread_submit(s->reg, &pd->req);
}

/* Take registration i out of c's table. */
static struct flow_mr take_mr(struct rdma_conn *c, unsigned i)
{
	struct flow_mr m = c->mrs[i];

	forget_cached(c, m.flow);
	c->mrs[i] = c->mrs[--c->n_mrs];
	return m;
}

/* Drop registration i, deregistered off the loop: for a ring no remote
 * WRITE may reach any more, or one whose WRITEs may land (kept). */
static void drop_mr(struct rdma_conn *c, unsigned i)
{
	struct flow_mr m = take_mr(c, i);

	dereg_later(c, m.mr, m.ref);
}

/* Drop registration i now: its rkey is invalid on return. */
static void drop_mr_now(struct rdma_conn *c, unsigned i)
{
	struct flow_mr m = take_mr(c, i);

	dereg_now(m.mr, m.ref);
}

static int rdma_open_flow(struct peer *p, struct flow *f, uint64_t *raddr,
			  uint32_t *rkey)
{
	struct rdma_conn *c = conn(p);
	struct ibv_mr *mr;

	/* an rkey only for a peer that proved its key (peer.c gates OPEN;
	 * this holds even if that gate were ever bypassed) */
	if (!p->auth_ok) {
		peer_fail(p, "peer authentication failed: a ring registration "
			  "asked before authentication");
		return -EPERM;
	}
	if (!(mr = find_mr(c, f))) /* -EINPROGRESS: peer_flow_prepared */
		return start_reg(p, f, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	*raddr = (uintptr_t)f->view->ring.data;
	*rkey = mr->rkey;
	return 0;
}

/*
 * May the mover send sender flow f's records on p now?  Only once its
 * producer ring is registered there: the first time, the registration
 * starts, and the mover is woken for f when it ends (reg_reaped).  Out
 * of memory for the request: not now either (the sweep brings f back).
 */
static bool rdma_flow_ready(struct peer *p, struct flow *f)
{
	struct rdma_conn *c = conn(p);

	if (c && find_mr(c, f))
		return true;
	if (c)
		start_reg(p, f, IBV_ACCESS_LOCAL_WRITE);
	return false;
}

/* Keep consumer ring registration i for its refused sender (f's peer
 * flow id); past KEPT_MAX kept, another kept one goes (any: the table is
 * unordered). */
static void keep_mr(struct rdma_conn *c, unsigned i, struct flow *f)
{
	unsigned kept = 0, other = c->n_mrs;

	forget_cached(c, f);
	c->mrs[i] = (struct flow_mr){ .ref = c->mrs[i].ref,
				      .mr = c->mrs[i].mr, .kept = true,
				      .sender_id = f->id };
	for (unsigned j = 0; j < c->n_mrs; j++) {
		if (c->mrs[j].kept && j != i) {
			kept++;
			other = j;
		}
	}
	if (kept >= KEPT_MAX)
		drop_mr(c, other); /* may move entry i: not used after */
}

/*
 * The flow leaves this connection (destroyed, failed, or moved to another
 * one).  A producer ring's registration may still be read by the batch in
 * flight, or by WRs a shut queue pair holds until it is destroyed, so it
 * is orphaned (no flow: it never matches again) and dropped when that
 * batch completes, or at close; its reference keeps the pages until then.
 * A consumer ring's whose sender was told the flow is gone or failed here
 * (f->rx_refused) is kept until that sender's CLOSE (rdma_flow_closed):
 * its WRITEs sent before it heard land in pages nobody reads, where
 * dropping the registration failed them, and with them the connection and
 * every flow on it (and the refusal, lost with it: the sender opened the
 * flow again and this host made it anew).  Any other consumer ring's goes
 * at once, on the loop: a flow moved to another connection, whose WRITEs
 * from this one must fail rather than land in a ring this one no longer
 * feeds (a deregistration on the thread may wait behind a registration).
 */
static void rdma_forget_flow(struct peer *p, struct flow *f)
{
	struct rdma_conn *c = conn(p);
	struct pending_reg *pr;

	if (!c)
		return;
	if ((pr = pending_for(c, f)))
		pr->flow = NULL; /* deregistered when taken back */
	for (unsigned i = 0; i < c->n_mrs; i++) {
		if (c->mrs[i].flow != f)
			continue;
		if (f->role == FLOW_SENDER && (p->wr_op.busy || c->shut)) {
			forget_cached(c, f);
			c->mrs[i].flow = NULL;
		} else if (f->role == FLOW_SENDER) {
			drop_mr(c, i);
		} else if (f->rx_refused) {
			keep_mr(c, i, f);
		} else {
			drop_mr_now(c, i);
		}
		return;
	}
}

/* The sender closed its flow sender_id: what it wrote has landed. */
static void rdma_flow_closed(struct peer *p, uint32_t sender_id)
{
	struct rdma_conn *c = conn(p);

	if (!c)
		return;
	for (unsigned i = 0; i < c->n_mrs; i++) {
		if (c->mrs[i].kept && c->mrs[i].sender_id == sender_id) {
			drop_mr(c, i);
			return;
		}
	}
}

/* What is pinned on p's connection: its rings registered, and those whose
 * deregistration has not ended yet (the thread may be busy with another
 * ring's registration, or a slow one of its own). */
static void rdma_registered(const struct peer *p, uint32_t *n,
			    uint64_t *bytes)
{
	const struct rdma_conn *c = p->tp_data;

	*n = 0;
	*bytes = 0;
	if (!c)
		return;
	*n = c->n_mrs + c->n_deregs;
	*bytes = c->dereg_bytes;
	for (unsigned i = 0; i < c->n_mrs; i++)
		*bytes += c->mrs[i].mr->length;
}

/* The batch in flight completed: drop the producer rings rdma_forget_flow
 * orphaned. */
static void drop_orphans(struct rdma_conn *c)
{
	for (unsigned i = 0; i < c->n_mrs;)
		if (!c->mrs[i].flow && !c->mrs[i].kept)
			drop_mr(c, i);
		else
			i++;
}

/* ---- registrations taken back ------------------------------------------------ */

static void conn_free(struct rdma_conn *c)
{
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	free(c);
}

/* Free c once closed and nothing in flight holds its PD any more. */
static void conn_free_unused(struct rdma_conn *c)
{
	if (!c->p && !c->pending && !c->n_deregs)
		conn_free(c);
}

static void pending_remove(struct rdma_conn *c, struct pending_reg *pr)
{
	for (struct pending_reg **pp = &c->pending; *pp; pp = &(*pp)->next) {
		if (*pp == pr) {
			*pp = pr->next;
			return;
		}
	}
}

/* The registration is nobody's (its flow or connection went): undone
 * (its flow reference goes with the deregistration). */
static void reg_discard(struct pending_reg *pr)
{
	struct rdma_conn *c = pr->c;

	if (pr->req.mr)
		dereg_later(c, pr->req.mr, pr->ref);
	else
		flow_put(pr->ref); /* never registered: no DMA to its pages */
	free(pr);
	conn_free_unused(c); /* closed, and this was its last */
}

/* A sender's producer ring could not be registered: that flow waits and
 * opens again (peer_sender_wait; before, the connection failed, and with
 * it every flow on it, again at every reconnect).  A receiver's OPEN is
 * refused instead (peer_flow_prepared), which its sender also waits out
 * (peer_open.c, short_of). */
static void reg_failed(struct rdma_conn *c, struct flow *f, int err)
{
	char why[sizeof(f->reason)];

	log_reg_error(f, err);
	if (f->role == FLOW_RECEIVER) {
		peer_flow_prepared(c->p, f, err);
		return;
	}
	snprintf(why, sizeof(why), "cannot register its ring: %s%s",
		 strerror(err), reg_hint(err));
	peer_sender_wait(f, why);
}

/* Nobody's registration (its flow or connection went) is undone; a
 * receiver's open that waited for it is told (while it is connected).
 * One that was forgotten (pr->flow NULL) has no open waiting: whoever
 * forgot it dealt with that open, and a later open of the flow on this
 * connection would have taken it back (start_reg). */
static void reg_dropped(struct pending_reg *pr)
{
	struct peer *p = pr->c->p;
	struct flow *told = p && pr->flow && pr->ref->role == FLOW_RECEIVER ?
				    flow_get(pr->ref) : NULL;

	reg_discard(pr); /* frees pr, and pr->c if closed (then no p) */
	if (told) {
		peer_flow_prepared(p, told, ECANCELED);
		flow_put(told);
	}
}

static void reg_reaped(struct rdma_shared *s, struct pending_reg *pr)
{
	struct rdma_conn *c = pr->c;
	struct flow *f = pr->flow;
	struct ibv_mr *mr = pr->req.mr;

	pending_remove(c, pr);
	s->n_inflight--;
	log_debug("flow %s: ring registration of %llu bytes ended in %.3f ms "
		  "(%s)", pr->ref->name, (unsigned long long)pr->req.len,
		  (double)pr->req.ns / 1e6, mr ? "registered" : "failed");
	if (!f || !c->p || f->dead) {
		reg_dropped(pr);
		return;
	}
	if (mr && !mrs_room(c)) {
		mr = NULL; /* pr->req.mr is undone by reg_discard */
		pr->req.err = ENOMEM;
	}
	if (!mr) {
		reg_failed(c, f, pr->req.err); /* pr still holds f */
		reg_discard(pr);
		return;
	}
	/* the request's flow reference goes to the table */
	c->mrs[c->n_mrs++] = (struct flow_mr){ .flow = f, .ref = pr->ref,
					       .mr = mr };
	f->mr = mr;
	f->mr_conn = c;
	free(pr);
	if (f->role == FLOW_RECEIVER) {
		peer_flow_prepared(c->p, f, 0); /* its OPEN is answered */
	} else {
		f->wait_backoff_ns = 0;
		mover_wake_flow(c->p->m, f); /* skipped until now */
	}
}

/* A deregistration ended (or, at shutdown, was never started: done
 * now).  Its flow reference goes: the device no longer uses the pages. */
static void dereg_reaped(struct rdma_shared *s, struct pending_dereg *pd)
{
	struct rdma_conn *c = pd->c;

	s->n_inflight--;
	c->n_deregs--;
	c->dereg_bytes -= pd->req.len;
	log_debug("flow %s: ring deregistration of %llu bytes ended in "
		  "%.3f ms%s", pd->ref->name, (unsigned long long)pd->req.len,
		  (double)pd->req.ns / 1e6,
		  pd->req.err == ECANCELED ? " (at shutdown, on the loop)" : "");
	if (pd->req.err == ECANCELED)
		dereg_now(pd->req.mr, pd->ref);
	else if (pd->req.err)
		dereg_failed(pd->ref, pd->req.err);
	else
		flow_put(pd->ref);
	free(pd);
	conn_free_unused(c);
}

/* A request the thread gave back, of either kind. */
static void req_reaped(struct rdma_shared *s, struct reg_req *r)
{
	if (r->op == REG_OP_DEREGISTER)
		dereg_reaped(s, CONTAINER(r, struct pending_dereg, req));
	else
		reg_reaped(s, CONTAINER(r, struct pending_reg, req));
}

static void arm_fd(struct peer_mgr *m, struct loop_op *op, int fd,
		   loop_done_fn done);

static void reg_done(struct loop_op *op, int res)
{
	struct rdma_shared *s = CONTAINER(op, struct rdma_shared, reg_op);
	struct reg_req *r, *next;

	(void)res;
	if (!s->reg)
		return; /* cancelled: stopped */
	for (r = reg_thread_take(s->reg); r; r = next) {
		next = r->next;
		req_reaped(s, r);
	}
	arm_fd(s->m, &s->reg_op, reg_thread_fd(s->reg), reg_done);
}

/* ---- queue pair ------------------------------------------------------------ */

/* Send WRs carry this bit in wr_id, receives their buffer's index (below
 * RECV_BUFS): a completion names whose it is, whatever its opcode says. */
#define WR_SEND (1ull << 32)

static int post_recv(struct rdma_conn *c, unsigned i)
{
	struct ibv_sge sge = { (uintptr_t)(c->recv_bufs + (size_t)i * RECV_BYTES),
			       RECV_BYTES, c->recv_mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 },
			   *bad;

	return ibv_post_recv(c->id->qp, &wr, &bad);
}

/* Register the first `recvs` receive buffers and `stage` bytes of the
 * staging buffer (the handshake's part, or all of them); 0 or -errno
 * (logged, at most once a second: a peer may connect at will). */
static int register_bufs(struct peer *p, unsigned recvs, size_t stage)
{
	static struct log_limit lim;
	struct rdma_conn *c = conn(p);
	int err;

	c->recv_mr = ibv_reg_mr(c->pd, c->recv_bufs,
				(size_t)recvs * RECV_BYTES,
				IBV_ACCESS_LOCAL_WRITE);
	c->stage_mr = c->recv_mr ? ibv_reg_mr(c->pd, c->stage, stage, 0) : NULL;
	if (!c->recv_mr || !c->stage_mr) {
		err = errno ? errno : ENOMEM;
		log_limited(&lim, LOG_LVL_ERROR, "peer %s: registering "
			    "buffers: %s%s", p->addr, strerror(err),
			    reg_hint(err));
		return -err;
	}
	c->stage_len = stage;
	return 0;
}

/* PD, CQ, QP and buffers for a connection whose id has its device. */
/* Page-aligned memory for buffers to register: aligned_alloc wants a
 * size that is a multiple of the alignment (C11; ASan refuses others). */
static void *page_alloc(size_t bytes)
{
	return aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
}

static int setup_qp(struct peer *p, struct rdma_cm_id *id)
{
	struct rdma_shared *s = shared(p->m);
	struct rdma_conn *c = conn(p);
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = RECV_BUFS,
			 .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = INLINE_WANT },
	};
	int rc;

	if (id->verbs != s->verbs) {
		static struct log_limit lim; /* before any hello: anyone's */

		log_limited(&lim, LOG_LVL_ERROR, "peer %s: RDMA device "
			    "differs from the first one", p->addr);
		return -ENODEV;
	}
	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	c->cq = c->pd ? ibv_create_cq(id->verbs, CQ_DEPTH, p, s->cc, 0) : NULL;
	if (!c->cq)
		return -errno ? -errno : -ENOMEM;
	qa.send_cq = qa.recv_cq = c->cq;
	if (rdma_create_qp(id, c->pd, &qa)) {
		qa.cap.max_inline_data = 0; /* the device may allow none */
		if (rdma_create_qp(id, c->pd, &qa))
			return -errno;
	}
	c->max_inline = qa.cap.max_inline_data;
	c->recv_bufs = page_alloc((size_t)RECV_BUFS * RECV_BYTES);
	c->stage = page_alloc(STAGE_BYTES);
	if (!c->recv_bufs || !c->stage)
		return -ENOMEM;
	rc = register_bufs(p, PREAUTH_RECVS, PREAUTH_STAGE);
	if (rc)
		return rc;
	for (unsigned i = 0; i < PREAUTH_RECVS; i++)
		if ((rc = post_recv(c, i)))
			return -rc; /* ibv_post_recv: a positive errno */
	c->qp_ready = true;
	return 0;
}

/* The peer is authenticated: all of its buffers, and every receive. */
static void rdma_authenticated(struct peer *p)
{
	struct rdma_conn *c = conn(p);

	if (!c || !c->qp_ready || c->early_recv)
		return;
	/* these are frames it sent before it hung up (DISCONNECTED polls
	 * them): it closes now, before peer.c acts on the authentication
	 * (merge_duplicate would retire a healthy connection for this one,
	 * adopt_waiting move flows onto it).  Its queue pair is in error;
	 * the close frees all. */
	if (c->hung_up) {
		peer_hung_up(p, rdma_event_str(RDMA_CM_EVENT_DISCONNECTED));
		return;
	}
	c->early_recv = c->recv_mr;
	c->early_stage = c->stage_mr;
	c->recv_mr = c->stage_mr = NULL;
	if (register_bufs(p, RECV_BUFS, STAGE_BYTES)) {
		peer_fail(p, "cannot register its buffers");
		return;
	}
	for (unsigned i = PREAUTH_RECVS; i < RECV_BUFS; i++) {
		if (post_recv(c, i)) {
			peer_fail(p, "cannot post its receives");
			return;
		}
	}
}

/*
 * c closes: its registrations not started yet are not wanted any more.
 * Before, each was pinned and then undone on the loop, and a peer that
 * reconnected while they queued (slow registrations of a large ring)
 * queued one more per connection.
 */
static void cancel_queued(struct peer *p, struct rdma_conn *c)
{
	struct rdma_shared *s = shared(p->m);
	struct pending_reg **pp = &c->pending;

	if (!s->reg) /* stopped: rdma_stop took every request back */
		return;
	while (*pp) {
		struct pending_reg *pr = *pp;

		if (!reg_thread_cancel(s->reg, &pr->req)) {
			pp = &pr->next; /* under way: taken back later */
			continue;
		}
		*pp = pr->next;
		s->n_inflight--;
		log_debug("flow %s: ring registration of %llu bytes dropped "
			  "before it began (its connection closed)",
			  pr->ref->name, (unsigned long long)pr->req.len);
		flow_put(pr->ref); /* never registered: no DMA to its pages */
		free(pr);
	}
}

/*
 * In the order of rdma-core's examples (rping, rdma_server): the queue
 * pair first, then the memory its work requests use, the CQ, the id, the
 * PD last.  Until the QP is destroyed the device may still DMA: a WRITE
 * of the batch in flight reads a producer ring (rdma_shutdown does not
 * wait for it), the peer's WRITEs land in a consumer ring.  So no
 * registration goes before, nor the flow reference that keeps its pages.
 */
static void rdma_close(struct peer *p)
{
	struct rdma_conn *c = conn(p);

	if (!c)
		return;
	cancel_queued(p, c);
	if (c->id && c->id->qp)
		rdma_destroy_qp(c->id);
	while (c->n_mrs)
		drop_mr(c, 0);
	free(c->mrs);
	if (c->recv_mr)
		ibv_dereg_mr(c->recv_mr);
	if (c->stage_mr)
		ibv_dereg_mr(c->stage_mr);
	if (c->early_recv)
		ibv_dereg_mr(c->early_recv);
	if (c->early_stage)
		ibv_dereg_mr(c->early_stage);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->id)
		rdma_destroy_id(c->id);
	free(c->recv_bufs);
	free(c->stage);
	p->tp_data = NULL;
	c->p = NULL;
	/* a registration or deregistration in flight in its PD: freed when
	 * the last is taken back (conn_free_unused) */
	conn_free_unused(c);
}

/*
 * The queue pair to error (what is posted flushes) and the peer told.  A
 * failure is only said: the peer then learns it from its own deadlines,
 * and nothing of ours is at risk, since rdma_close destroys the QP before
 * any memory a work request may use goes.  Without a QP (a connect that
 * failed before its route) there is nobody to tell; with the device
 * going, rdma_cm may refuse, and the removal says why already.
 */
static void rdma_shutdown(struct peer *p)
{
	static struct log_limit lim; /* peers come and go at will */
	struct rdma_conn *c = conn(p);

	if (c && c->id && c->id->qp && rdma_disconnect(c->id) &&
	    shared(p->m)->dev == DEV_OK)
		log_limited(&lim, LOG_LVL_WARN, "peer %s: rdma_disconnect: %s",
			    p->addr, strerror(errno));
	/* the queue pair is destroyed at close: nothing completes after;
	 * what it holds until then may still use a producer ring's
	 * registration (rdma_forget_flow keeps it until close) */
	p->wr_op.busy = false;
	if (c)
		c->shut = true;
}

/* ---- sending ---------------------------------------------------------------- */

static void add_wr(struct rdma_conn *c, unsigned *n, enum ibv_wr_opcode op,
		   uint64_t addr, uint32_t len, uint32_t lkey, uint64_t raddr,
		   uint32_t rkey)
{
	struct ibv_send_wr *wr = &c->wr[*n];

	c->sge[*n] = (struct ibv_sge){ addr, len, lkey };
	*wr = (struct ibv_send_wr){ .wr_id = WR_SEND | *n,
				    .sg_list = &c->sge[*n],
				    .num_sge = 1, .opcode = op };
	if (op == IBV_WR_RDMA_WRITE) {
		wr->wr.rdma.remote_addr = raddr;
		wr->wr.rdma.rkey = rkey;
	}
	/* small spans and frames go inline: the device copies them at post
	 * time instead of reading them by DMA later */
	if (len <= c->max_inline)
		wr->send_flags = IBV_SEND_INLINE;
	if (*n)
		c->wr[*n - 1].next = wr;
	(*n)++;
}

/* One DATA frame: WRITE its spans into the peer's ring, SEND its header. */
static int add_data(struct peer *p, unsigned *n, unsigned i, size_t *staged,
		    const struct wire_hdr *h)
{
	struct rdma_conn *c = conn(p);
	struct flow *f = peer_flow_by_id(p, h->flow_id, FLOW_SENDER);
	/* registered before the mover took its records (rdma_flow_ready) */
	struct ibv_mr *mr = f ? find_mr(c, f) : NULL;
	uint64_t off = h->pos & (f ? f->view->ring.mask : 0);
	unsigned k = i + 1;

	if (!mr)
		return -ENOMEM;
	for (uint64_t done = 0; done < h->len && k < p->tx_niov; k++) {
		const struct iovec *v = &p->tx_iov[k];

		add_wr(c, n, IBV_WR_RDMA_WRITE, (uintptr_t)v->iov_base,
		       (uint32_t)v->iov_len, mr->lkey,
		       f->raddr + ((off + done) & f->view->ring.mask), f->rkey);
		done += v->iov_len;
	}
	memcpy(c->stage + *staged, p->tx_iov[i].iov_base, WIRE_HDR);
	add_wr(c, n, IBV_WR_SEND, (uintptr_t)(c->stage + *staged), WIRE_HDR,
	       c->stage_mr->lkey, 0, 0);
	*staged += WIRE_HDR;
	return (int)(k - i);
}

static void rdma_send(struct peer *p)
{
	struct rdma_conn *c = conn(p);
	struct ibv_send_wr *bad;
	size_t staged = 0;
	unsigned n = 0;

	for (unsigned i = p->tx_first; i < p->tx_niov;) {
		const struct iovec *v = &p->tx_iov[i];
		struct wire_hdr h;
		int used = 1;

		wire_get(v->iov_base, &h);
		if (h.type == WIRE_DATA) {
			used = add_data(p, &n, i, &staged, &h);
			if (used < 0) {
				peer_fail(p, "flow %u: cannot register its ring",
					  h.flow_id);
				return;
			}
		} else {
			if (staged + v->iov_len > c->stage_len) {
				/* build_ctrl bounds control bytes per batch */
				peer_fail(p, "batch exceeds the staging buffer");
				return;
			}
			memcpy(c->stage + staged, v->iov_base, v->iov_len);
			add_wr(c, &n, IBV_WR_SEND, (uintptr_t)(c->stage + staged),
			       (uint32_t)v->iov_len, c->stage_mr->lkey, 0, 0);
			staged += v->iov_len;
		}
		i += (unsigned)used;
	}
	if (!n) {
		peer_sent(p);
		return;
	}
	c->wr[n - 1].send_flags |= IBV_SEND_SIGNALED; /* selective signalling */
	c->wr[n - 1].next = NULL;
	c->sent_wr_id = c->wr[n - 1].wr_id;
	if (ibv_post_send(c->id->qp, c->wr, &bad)) {
		peer_fail(p, "ibv_post_send: %s", strerror(errno));
		return;
	}
	for (unsigned i = p->tx_first; i < p->tx_niov; i++)
		p->bytes_tx += p->tx_iov[i].iov_len;
	p->st.wr_posted += n;
	p->wr_op.busy = true;
	p->last_tx_ns = fr_now_ns();
}

static void rdma_recv(struct peer *p)
{
	(void)p; /* receive buffers are posted work requests */
}

/* ---- completions -------------------------------------------------------------- */

static void got_frame(struct peer *p, const struct ibv_wc *wc)
{
	struct rdma_conn *c = conn(p);
	uint8_t *buf = c->recv_bufs + (size_t)wc->wr_id * RECV_BYTES;

	p->last_rx_ns = fr_now_ns();
	p->bytes_rx += wc->byte_len;
	if (wc->byte_len < WIRE_HDR) {
		peer_fail(p, "short frame of %u bytes", wc->byte_len);
		return;
	}
	memcpy(p->hdr_buf, buf, WIRE_HDR);
	peer_rx_header(p);
	if (p->state != PEER_UP || !p->in_body)
		return;
	if (p->hdr.type == WIRE_CTRL) {
		if (wc->byte_len != WIRE_HDR + p->hdr.len) {
			peer_fail(p, "control frame of %u bytes, header says %u",
				  wc->byte_len, p->hdr.len);
			return;
		}
		memcpy(p->ctrl_buf, buf + WIRE_HDR, p->hdr.len);
	} else if (wc->byte_len != WIRE_HDR) {
		peer_fail(p, "data header with a payload");
		return;
	}
	/* DATA: the WRITEs before this header have been placed */
	p->body_have = p->hdr.len;
	peer_rx_body(p);
}

/* A receive buffer has a frame of the peer: take it, post it again. */
static void completed_recv(struct peer *p, const struct ibv_wc *wc)
{
	struct rdma_conn *c = conn(p);

	if (wc->wr_id >= RECV_BUFS) { /* it indexes recv_bufs */
		peer_fail(p, "a receive completion for work request %llu, "
			  "which is not one of ours",
			  (unsigned long long)wc->wr_id);
		return;
	}
	got_frame(p, wc);
	if (p->state == PEER_UP && !c->hung_up &&
	    post_recv(c, (unsigned)wc->wr_id))
		peer_fail(p, "cannot re-post a receive");
}

/*
 * Only the signalled last WR of our batch in flight is "sent": then every
 * WRITE before it has been read out of the rings, and the flows and
 * registrations it used may go.  A completion taken for it too early
 * would release them under a WRITE still running.
 */
static void completed_send(struct peer *p, const struct ibv_wc *wc)
{
	struct rdma_conn *c = conn(p);

	if (!p->wr_op.busy || wc->wr_id != c->sent_wr_id) {
		peer_fail(p, "a send completion for work request %#llx, which "
			  "is not our batch in flight",
			  (unsigned long long)wc->wr_id);
		return;
	}
	p->wr_op.busy = false;
	drop_orphans(c);
	peer_sent(p);
}

/*
 * Dispatch on what completed.  The protocol uses SENDs into posted
 * receives and plain WRITEs into the rings (which complete nothing here);
 * anything else comes from a peer breaking it: a WRITE with immediate
 * data, even of 0 bytes (no rkey needed, no authentication either), takes
 * a receive buffer and completes as RECV_RDMA_WITH_IMM.  The connection
 * goes (its buffer is not posted again, the queue pair goes with it).
 */
static void completed(struct peer *p, const struct ibv_wc *wc)
{
	switch (wc->opcode) {
	case IBV_WC_RECV:
		completed_recv(p, wc);
		return;
	case IBV_WC_SEND:
		completed_send(p, wc);
		return;
	case IBV_WC_RECV_RDMA_WITH_IMM:
		peer_fail(p, "the peer sent an RDMA write with immediate data, "
			  "which the protocol never uses");
		return;
	default:
		peer_fail(p, "an unexpected completion (opcode %d, work "
			  "request %#llx)", (int)wc->opcode,
			  (unsigned long long)wc->wr_id);
		return;
	}
}

/*
 * Take p's completions, at most `batches` polls of POLL_BATCH: a peer whose
 * SENDs keep its receive queue busy (each completion re-posts a buffer)
 * would otherwise hold the duty cycle here, and every other peer, flow and
 * client with it.  What is left is taken on the next cycle, which runs
 * without a sleep since this one did work.  After the peer disconnected
 * (c->hung_up), the first flushed one ends the poll without failing p:
 * the hang-up says why.  Another error (say a SEND too long for our
 * buffers) still says its own.
 */
#define POLL_BATCH       32
#define POLL_BATCHES_MAX 8u

static int poll_peer(struct peer *p, unsigned batches)
{
	struct rdma_conn *c = conn(p);
	struct ibv_wc wc[POLL_BATCH];
	int n, work = 0;

	if (!c || !c->qp_ready || p->state != PEER_UP)
		return 0;
	while (batches-- && (n = ibv_poll_cq(c->cq, POLL_BATCH, wc)) > 0) {
		p->st.wc_polled += (uint64_t)n;
		for (int i = 0; i < n && p->state == PEER_UP; i++) {
			if (wc[i].status == IBV_WC_WR_FLUSH_ERR && c->hung_up)
				return work;
			if (wc[i].status != IBV_WC_SUCCESS) {
				peer_fail(p, "work request: %s",
					  ibv_wc_status_str(wc[i].status));
				return work + 1;
			}
			completed(p, &wc[i]);
			work++;
		}
		if (p->state != PEER_UP)
			break;
	}
	return work;
}

static int rdma_poll(struct peer_mgr *m)
{
	int work = 0;

	for (struct peer *p = m->peers, *n; p; p = n) {
		n = p->next;
		if (p->tp == &rdma_transport)
			work += poll_peer(p, POLL_BATCHES_MAX);
	}
	return work;
}

static void arm_fd(struct peer_mgr *m, struct loop_op *op, int fd,
		   loop_done_fn done)
{
	struct io_uring_sqe *sqe;

	if (op->busy)
		return;
	sqe = loop_sqe(m->loop, op, done);
	if (sqe)
		io_uring_prep_poll_add(sqe, fd, POLLIN);
}

static void cc_done(struct loop_op *op, int res)
{
	struct rdma_shared *s = CONTAINER(op, struct rdma_shared, cc_op);
	struct ibv_cq *cq;
	void *ctx;

	(void)res;
	if (!s->cc)
		return; /* cancelled: the device is gone */
	/* drain the channel (non-blocking fd); the duty cycle polls CQs */
	while (ibv_get_cq_event(s->cc, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
	s->cq_armed = false;
}

/*
 * The device's asynchronous events (a port down or up, a QP or CQ in
 * error, the device fatal): logged, at most once a second, and
 * acknowledged; what they mean for a connection its completions or
 * rdma_cm say too.  Not read, they would queue in the kernel for as long
 * as moverd runs (a port flapping adds two each time).
 */
static void async_done(struct loop_op *op, int res)
{
	static struct log_limit lim; /* a flapping port: at will */
	struct rdma_shared *s = CONTAINER(op, struct rdma_shared, async_op);
	struct ibv_async_event ev;

	/* cancelled (the device goes: release_device), or the poll failed:
	 * rdma_tick arms it again, once a second, while the device is ok */
	if (res < 0 || s->dev != DEV_OK)
		return;
	while (ibv_get_async_event(s->verbs, &ev) == 0) {
		bool port = ev.event_type == IBV_EVENT_PORT_ACTIVE ||
			    ev.event_type == IBV_EVENT_PORT_ERR ||
			    ev.event_type == IBV_EVENT_LID_CHANGE ||
			    ev.event_type == IBV_EVENT_GID_CHANGE ||
			    ev.event_type == IBV_EVENT_PKEY_CHANGE ||
			    ev.event_type == IBV_EVENT_SM_CHANGE ||
			    ev.event_type == IBV_EVENT_CLIENT_REREGISTER;

		if (port)
			log_limited(&lim, LOG_LVL_WARN, "RDMA device %s port "
				    "%d: %s", s->dev_name, ev.element.port_num,
				    ibv_event_type_str(ev.event_type));
		else
			log_limited(&lim, LOG_LVL_WARN, "RDMA device %s: %s",
				    s->dev_name,
				    ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
	arm_fd(s->m, &s->async_op, s->verbs->async_fd, async_done);
}

/* Before sleeping: request notification, then look once more. */
static bool rdma_arm(struct peer_mgr *m)
{
	struct rdma_shared *s = shared(m);

	if (s->dev != DEV_OK)
		return rdma_poll(m) == 0;

	for (struct peer *p = m->peers; p; p = p->next) {
		struct rdma_conn *c = conn(p);

		if (p->tp == &rdma_transport && c && c->qp_ready &&
		    p->state == PEER_UP)
			ibv_req_notify_cq(c->cq, 0);
	}
	s->cq_armed = true;
	if (s->cc)
		arm_fd(m, &s->cc_op, s->cc->fd, cc_done);
	return rdma_poll(m) == 0;
}

/* ---- connection management ------------------------------------------------------ */

static void ec_done(struct loop_op *op, int res);

static int new_conn(struct peer *p)
{
	struct rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->s = shared(p->m);
	c->p = p;
	p->tp_data = c;
	return 0;
}

static void accept_request(struct peer_mgr *m, struct rdma_cm_id *id)
{
	struct rdma_conn_param cp = { .rnr_retry_count = 7, .retry_count = 7 };
	char addr[80], host[64] = "?";
	struct sockaddr *sa = rdma_get_peer_addr(id);
	struct peer *p;
	int rc;

	getnameinfo(sa, sizeof(struct sockaddr_storage), host, sizeof(host),
		    NULL, 0, NI_NUMERICHOST);
	snprintf(addr, sizeof(addr), "%s:%u", host, ntohs(rdma_get_dst_port(id)));
	/* --peer-allow: rejected before rdma_accept, nothing allocated */
	if (!peer_allowed(m, sa)) {
		static struct log_limit lim; /* anyone may try at will */

		m->refused++;
		log_limited(&lim, LOG_LVL_WARN, "refusing an RDMA peer "
			    "connection from %s: not in --peer-allow", host);
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return;
	}
	/* the caps of inbound peers, as over TCP */
	p = shared(m)->dev != DEV_OK || peer_admit(m, host) ? NULL :
	    peer_new(m, addr, false, &rdma_transport);
	if (!p || new_conn(p)) {
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		if (p) /* listed already: reap_peers frees it (no conn) */
			p->state = PEER_CLOSING;
		return;
	}
	id->context = p;
	p->state = PEER_CONNECTING;
	conn(p)->begun_ns = fr_now_ns();
	if ((rc = setup_qp(p, id)) || (rc = rdma_accept(id, &cp) ? -errno : 0)) {
		static struct log_limit lim; /* a peer may connect at will */

		log_limited(&lim, LOG_LVL_WARN, "peer %s: cannot accept an "
			    "RDMA connection: %s%s", addr, strerror(-rc),
			    reg_hint(-rc));
		conn(p)->id = id;
		p->state = PEER_CLOSING; /* reap_peers frees it */
	}
}

/* Up.  An inbound peer's hello deadline runs from its connect request,
 * as a TCP peer's from its accept: peer_up starts it now. */
static void established(struct peer *p)
{
	peer_up(p);
	if (!p->outbound)
		p->connected_ns = conn(p)->begun_ns;
}

static void device_removed(struct peer_mgr *m);

static void cm_event(struct peer_mgr *m, struct rdma_cm_event *ev)
{
	struct peer *p = ev->id->context;
	struct rdma_conn_param cp = { .rnr_retry_count = 7, .retry_count = 7 };
	int rc;

	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		accept_request(m, ev->id);
		return;
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(ev->id, 2000))
			peer_fail(p, "rdma_resolve_route: %s", strerror(errno));
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		rc = setup_qp(p, ev->id);
		if (rc || (rc = rdma_connect(ev->id, &cp) ? -errno : 0))
			peer_fail(p, "cannot set up the queue pair: %s%s",
				  strerror(-rc), reg_hint(-rc));
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		/* not a peer failed meanwhile (its device went): it closes */
		if (p && p != (void *)m && p->state == PEER_CONNECTING)
			established(p);
		return;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		device_removed(m);
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
		if (!p || p == (void *)m)
			return;
		/* what the peer sent before it hung up comes first, as TCP
		 * gives the bytes before the end of the stream: a hello that
		 * fails our check ("peer authentication failed") says why the
		 * peer went better than the hang-up does */
		if (conn(p))
			conn(p)->hung_up = true;
		poll_peer(p, UINT_MAX); /* it sends no more: all of it */
		peer_hung_up(p, rdma_event_str(ev->event));
		return;
	default:
		if (p && p != (void *)m)
			peer_fail(p, "%s", rdma_event_str(ev->event));
	}
}

static void ec_done(struct loop_op *op, int res)
{
	struct rdma_shared *s = CONTAINER(op, struct rdma_shared, ec_op);
	struct peer_mgr *m = s->m;
	struct rdma_cm_event *ev;

	(void)res;
	while (rdma_get_cm_event(s->ec, &ev) == 0) {
		struct rdma_cm_event copy = *ev;

		rdma_ack_cm_event(ev); /* before anything may destroy the id */
		cm_event(m, &copy);
	}
	arm_fd(m, &s->ec_op, s->ec->fd, ec_done);
}

/* ---- device removal ------------------------------------------------------------ */

/*
 * `rdma link delete`, a driver unload or a hot unplug.  rdma_cm tells ids
 * bound to the device (DEVICE_REMOVAL); a daemon with none (no listener,
 * no peer yet) learns it from the device list, looked at once a second.
 * Drivers without "disassociate" (rxe among them) make the kernel wait
 * until every user has let go, so moverd lets go of everything: a daemon
 * that held on would hang the removal.  Flows to RDMA peers go to
 * reconnecting; with --transport auto they reconnect over TCP.
 */
static void device_removed(struct peer_mgr *m)
{
	struct rdma_shared *s = shared(m);

	if (s->dev != DEV_OK)
		return;
	s->dev = DEV_GOING;
	if (m->tp == &rdma_transport && !m->rdma_only)
		m->tp = &tcp_transport;
	log_error("RDMA device %s is being removed: closing its connections; "
		  "%s", s->dev_name, m->rdma_only ?
		  "flows wait for a device (--transport rdma)" :
		  "peers reconnect over TCP");
	for (struct peer *p = m->peers; p; p = p->next)
		if (p->tp == &rdma_transport)
			peer_fail(p, "RDMA device %s removed", s->dev_name);
}

static bool device_listed(const char *name)
{
	struct ibv_device **list;
	bool found = false;
	int n = 0;

	list = ibv_get_device_list(&n);
	if (!list)
		return true; /* cannot tell: assume it is there */
	for (int i = 0; i < n; i++)
		found |= strcmp(ibv_get_device_name(list[i]), name) == 0;
	ibv_free_device_list(list);
	return found;
}

/* GOING -> RELEASED: once no connection holds device resources. */
static void release_device(struct peer_mgr *m)
{
	struct rdma_shared *s = shared(m);

	for (struct peer *p = m->peers; p; p = p->next) {
		struct rdma_conn *c = conn(p);

		if (p->tp == &rdma_transport && c && (c->id || c->pd))
			return; /* still closing */
	}
	if (s->n_inflight)
		return; /* a registration holds a closed connection's PD */
	/* a pending poll holds the channel's file open: cancel it (and the
	 * context's, closed by forget_device) */
	loop_cancel(m->loop, &s->cc_op);
	loop_cancel(m->loop, &s->async_op);
	if (s->listen_id) {
		rdma_destroy_id(s->listen_id);
		s->listen_id = NULL;
	}
	ibv_destroy_comp_channel(s->cc);
	s->cc = NULL;
	s->dev = DEV_RELEASED;
}

/*
 * RELEASED -> GONE, once the device has left the device list (the kernel
 * drops it before it waits for users).  The context is librdmacm's, but
 * librdmacm (v44 and later alike) never closes the context of the last
 * device: its list refresh gives up on an empty list.  So we close it, and
 * from then on never call librdmacm for devices again (no new ids, no
 * device list), which is what would touch its stale pointer: a device
 * that comes back is used after a moverd restart.
 */
static void forget_device(struct rdma_shared *s)
{
	if (device_listed(s->dev_name))
		return;
	ibv_close_device(s->verbs);
	s->verbs = NULL;
	s->dev = DEV_GONE;
	log_info("RDMA device %s released; new connections use TCP%s",
		 s->dev_name, s->m->rdma_only ? " (none: --transport rdma)" : "");
}

/*
 * A connection rdma_cm has not brought up.  rdma_cm's own timeouts are
 * long (a REQ or REP sent again 15 times, ~4 s apart, longer once the
 * other end acknowledged it with an MRA), and meanwhile an inbound one
 * holds its queue pair, its pinned buffers and a place among
 * --peer-max-pending, which TCP peers are admitted by too.  An inbound
 * one has its hello deadline from its connect request, as a TCP one from
 * its accept (an initiator that never sends its RTU never says hello
 * either); one of ours has --peer-connect-timeout, as over TCP.
 */
static void connect_deadlines(struct peer_mgr *m, uint64_t now)
{
	uint64_t dial_ns = m->connect_timeout_s * 1000000000ull;

	for (struct peer *p = m->peers; p; p = p->next) {
		struct rdma_conn *c = conn(p);

		if (p->tp != &rdma_transport || p->state != PEER_CONNECTING ||
		    !c)
			continue;
		/* (begun_ns may be later than the timer's now) */
		if (!p->outbound && now > c->begun_ns + m->hello_timeout_ns)
			peer_fail(p, "no hello within %llu s: its connection "
				  "never came up",
				  (unsigned long long)(m->hello_timeout_ns /
						       1000000000ull));
		else if (p->outbound && now > c->begun_ns + dial_ns)
			peer_fail(p, "connect to %s: timed out after %u s",
				  p->addr, m->connect_timeout_s);
	}
}

void rdma_tick(struct peer_mgr *m, uint64_t now)
{
	struct rdma_shared *s = shared(m);

	connect_deadlines(m, now);
	if (s->dev == DEV_GOING)
		release_device(m);
	if (s->dev == DEV_RELEASED)
		forget_device(s); /* every tick, until the device leaves the list */
	if (now < s->dev_check_ns)
		return;
	s->dev_check_ns = now + 1000000000ull;
	/* a re-arm that found no SQE (loop_sqe NULL) is made here, once a
	 * second: CM events and finished registrations would wait for ever.
	 * Also while the device goes: release_device waits for every
	 * registration in flight to be taken back. */
	if (s->ec)
		arm_fd(m, &s->ec_op, s->ec->fd, ec_done);
	if (s->reg)
		arm_fd(m, &s->reg_op, reg_thread_fd(s->reg), reg_done);
	if (s->dev == DEV_OK)
		arm_fd(m, &s->async_op, s->verbs->async_fd, async_done);
	if (s->dev == DEV_OK && !device_listed(s->dev_name))
		device_removed(m);
}

/* An outbound peer whose RDMA device went away: TCP, or wait. */
static void connect_without_device(struct peer *p)
{
	static const char why[] = "no RDMA device (removed) and --transport rdma";

	if (p->m->rdma_only) {
		for (struct flow *f = p->flows; f; f = f->peer_next)
			flows_set_state(f, FLOW_RECONNECTING, why);
		return;
	}
	rdma_close(p); /* whatever a failed attempt left: tcp.c has no use */
	p->tp = &tcp_transport;
	for (struct flow *f = p->flows; f; f = f->peer_next)
		f->transport = tcp_transport.name;
	tcp_transport.connect(p);
}

static void rdma_connect_peer(struct peer *p)
{
	struct rdma_shared *s = shared(p->m);
	struct rdma_cm_id *id;

	p->retry_at_ns = fr_now_ns() + 2000000000ull;
	if (s->dev != DEV_OK) {
		connect_without_device(p);
		return;
	}
	/* a host name is looked up off the loop: its answer calls us again */
	if (peer_address(p))
		return;
	if (!p->tp_data && new_conn(p)) {
		log_warn("peer %s: no memory to connect", p->addr);
		return;
	}
	if (rdma_create_id(s->ec, &id, p, RDMA_PS_TCP)) {
		log_warn("peer %s: rdma_create_id: %s", p->addr, strerror(errno));
		return;
	}
	conn(p)->id = id;
	conn(p)->begun_ns = fr_now_ns();
	p->state = PEER_CONNECTING;
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&p->sa, 2000))
		peer_fail(p, "rdma_resolve_addr: %s", strerror(errno));
}

static int rdma_listen_on(struct peer_mgr *m, const char *addr)
{
	struct rdma_shared *s = shared(m);
	struct sockaddr_storage sa;
	socklen_t len;

	if (peer_resolve(addr, &sa, &len) || rdma_bind_addr(s->listen_id,
						 (struct sockaddr *)&sa) ||
	    rdma_listen(s->listen_id, 64)) {
		log_warn("rdma listen on %s: %s", addr, strerror(errno));
		return -1;
	}
	log_info("listening for RDMA peers on %s", addr);
	return 0;
}

static void rdma_stop_listening(struct peer_mgr *m)
{
	(void)m; /* the listening id lives as long as the daemon */
}

static void set_nonblocking(int fd)
{
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/*
 * What rdma_available made, undone in reverse order when it cannot go on.
 * The device context too: librdmacm keeps it open for good, and a driver
 * without "disassociate" (rxe) makes `rdma link delete` wait for every
 * open context, so a daemon that gave up on RDMA would hang the removal
 * until it exits.  As after forget_device, librdmacm is never called for
 * devices again (m->rdma stays NULL), which would touch the stale context.
 */
static void shared_free(struct rdma_shared *s)
{
	if (s->listen_id)
		rdma_destroy_id(s->listen_id);
	if (s->cc)
		ibv_destroy_comp_channel(s->cc);
	if (s->ec)
		rdma_destroy_event_channel(s->ec);
	if (s->verbs)
		ibv_close_device(s->verbs);
	free(s);
}

bool rdma_available(struct peer_mgr *m)
{
	struct rdma_shared *s = calloc(1, sizeof(*s));
	struct ibv_context **devs;
	int n = 0;

	if (!s)
		return false;
	devs = rdma_get_devices(&n);
	if (!devs || n == 0) {
		if (devs)
			rdma_free_devices(devs);
		free(s);
		return false;
	}
	s->m = m;
	s->verbs = devs[0];
	snprintf(s->dev_name, sizeof(s->dev_name), "%s",
		 ibv_get_device_name(s->verbs->device));
	rdma_free_devices(devs);
	s->ec = rdma_create_event_channel();
	s->cc = s->ec ? ibv_create_comp_channel(s->verbs) : NULL;
	if (!s->cc || rdma_create_id(s->ec, &s->listen_id, m, RDMA_PS_TCP)) {
		log_warn("RDMA device present but unusable: %s", strerror(errno));
		shared_free(s);
		return false;
	}
	if (!(s->reg = reg_thread_start())) {
		log_warn("RDMA device present but no registration thread: %s",
			 strerror(errno));
		shared_free(s);
		return false;
	}
	set_nonblocking(s->ec->fd);
	set_nonblocking(s->cc->fd);
	set_nonblocking(s->verbs->async_fd);
	m->rdma = s;
	arm_fd(m, &s->ec_op, s->ec->fd, ec_done);
	arm_fd(m, &s->async_op, s->verbs->async_fd, async_done);
	arm_fd(m, &s->reg_op, reg_thread_fd(s->reg), reg_done);
	log_info("RDMA device %s", s->dev_name);
	return true;
}

bool rdma_busy(const struct peer_mgr *m)
{
	const struct rdma_shared *s = m->rdma;

	return s && s->n_inflight;
}

/*
 * At shutdown, once the loop has stopped: the thread is joined (after
 * the request under way) and whatever it still had is undone or done, on
 * this thread, each closed connection's PD with its last request.
 */
void rdma_stop(struct peer_mgr *m)
{
	struct rdma_shared *s = m->rdma;
	struct reg_thread *rt = s ? s->reg : NULL;
	struct reg_req *r, *next;

	if (!rt)
		return;
	s->reg = NULL; /* a completion of the poll on its fd does nothing */
	for (r = reg_thread_stop(rt); r; r = next) {
		struct pending_reg *pr = CONTAINER(r, struct pending_reg, req);

		next = r->next;
		if (r->op == REG_OP_DEREGISTER) {
			req_reaped(s, r);
			continue;
		}
		log_debug("flow %s: ring registration of %llu bytes taken back "
			  "at shutdown (%s)", pr->ref->name,
			  (unsigned long long)r->len,
			  r->mr ? "deregistered" : strerror(r->err));
		pending_remove(pr->c, pr);
		s->n_inflight--;
		reg_discard(pr);
	}
}

static bool rdma_local_addr(struct peer *p, struct sockaddr_storage *sa)
{
	struct rdma_conn *c = conn(p);
	struct sockaddr *a = c && c->id ? rdma_get_local_addr(c->id) : NULL;
	size_t len = !a ? 0 : a->sa_family == AF_INET ?
		     sizeof(struct sockaddr_in) :
		     a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : 0;

	if (!len)
		return false;
	memcpy(sa, a, len);
	return true;
}

const struct transport rdma_transport = {
	.name = "rdma",
	.listen = rdma_listen_on,
	.stop_listening = rdma_stop_listening,
	.connect = rdma_connect_peer,
	.send = rdma_send,
	.recv = rdma_recv,
	.shutdown = rdma_shutdown,
	.close = rdma_close,
	.poll = rdma_poll,
	.arm = rdma_arm,
	.open_flow = rdma_open_flow,
	.flow_ready = rdma_flow_ready,
	.forget_flow = rdma_forget_flow,
	.flow_closed = rdma_flow_closed,
	.registered = rdma_registered,
	.authenticated = rdma_authenticated,
	.local_addr = rdma_local_addr,
};
