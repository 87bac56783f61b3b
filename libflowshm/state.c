/*
 * libflowshm/state.c - what a client can learn about its flow beyond its
 * records: the state moverd writes into the ring (struct fr_status), the
 * lag, whether moverd is still there, why a producer timed out; and the
 * end of a producer's stream (flowshm_end), told to moverd on the
 * handle's control connection.
 */
#include "flowshm_internal.h"

#include "ctl_client.h"
#include "../ipc/futex.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define END_TIMEOUT_MS CTL_DEFAULT_TIMEOUT_MS

uint64_t fsi_epoch(const flowshm_t *f)
{
	struct fr_status_view v;

	return fr_status_read(&f->ring, &v) ? 0 : v.epoch;
}

/* Has moverd hung up our control connection?  moverd never writes to it
 * unasked, so anything readable outside a call is its end. */
static bool daemon_gone(const flowshm_t *f)
{
	struct pollfd p = { .fd = f->ctl_fd, .events = POLLIN | POLLRDHUP };
	char c;

	if (poll(&p, 1, 0) <= 0)
		return false;
	if (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL))
		return true;
	return recv(f->ctl_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static enum flowshm_daemon daemon_state(const flowshm_t *f,
					const struct fr_status_view *v)
{
	if (f->ctl_fd < 0)
		return FLOWSHM_DAEMON_NONE;
	/* another start of moverd re-adopted the ring: it is there again,
	 * but not on our connection */
	if (v && f->epoch && v->epoch && v->epoch != f->epoch)
		return FLOWSHM_DAEMON_RESTARTED;
	return daemon_gone(f) ? FLOWSHM_DAEMON_DOWN : FLOWSHM_DAEMON_UP;
}

/* Bytes between the end of what is committed (or deposited) and pos. */
static uint64_t lag_from(const flowshm_t *f, uint64_t pos)
{
	const struct fr_shared *sh = f->ring.sh;
	uint64_t end = atomic_load_explicit(
		f->ring.mode == FR_MODE_DEPOSIT ? &sh->published : &sh->tail,
		memory_order_acquire);

	/* the words are another party's: never report a negative lag */
	return end > pos ? end - pos : 0;
}

static uint64_t lag_of(const flowshm_t *f)
{
	if (f->role == FLOWSHM_CONSUMER)
		return lag_from(f, f->ring.head);
	return lag_from(f, fr_min_pos(&f->ring));
}

/*
 * Is the consumer's next record the END?  On the receiving host the END
 * arrived as data and no flag says so; the read calls say -ENODATA there.
 * Only looks: a committed CTRL header at our position (acquire on the
 * seal, as fr_peek), below what is published in a deposit ring.
 */
static bool consumer_at_end(const flowshm_t *f)
{
	const struct fr_ring *r = &f->ring;
	struct fr_rec *h = fr_rec_at(r, r->head);
	uint64_t kind;

	if (f->role != FLOWSHM_CONSUMER || f->batch_n || f->peeked)
		return false;
	if (r->mode == FR_MODE_DEPOSIT &&
	    atomic_load_explicit(&r->sh->published, memory_order_acquire) <=
		    r->head)
		return false;
	if (atomic_load_explicit(&h->seal, memory_order_acquire) !=
	    fr_seal(r, r->head, FR_SEAL_COMMITTED))
		return false;
	if (!(atomic_load_explicit(&h->info, memory_order_relaxed) &
	      FR_INFO_CTRL) ||
	    atomic_load_explicit(&h->len, memory_order_relaxed) != sizeof(kind))
		return false;
	/* the header and its payload within the lap: the header is on the
	 * grid (head is ours), but the payload may not fit before the end,
	 * and any client can write such a header (fr_peek refuses it) */
	if (fr_lap_rest(r, r->head) < fr_record_bytes(sizeof(kind)))
		return false;
	memcpy(&kind, h + 1, sizeof(kind));
	return kind == FR_CTRL_END;
}

/* The ring's own flags override moverd's word: they are the truth the
 * read and send calls act on. */
static void ring_override(const flowshm_t *f, struct flowshm_state *out)
{
	uint32_t flags = atomic_load_explicit(&f->ring.sh->flags,
					      memory_order_acquire);

	if (flags & FR_FLAG_FAILED) {
		out->state = FLOWSHM_STATE_FAILED;
		out->reason = -EPROTO;
	} else if (flags & FR_FLAG_CLOSED) {
		/* destroy --drain closes the ring to producers first: it is
		 * closed once moverd says so (issue 15); a flow moverd failed
		 * without FR_FLAG_FAILED (a receiving host cut off by its
		 * sender's --max-lag: reason -ESTALE) stays failed */
		if (out->state != FLOWSHM_STATE_DRAINING &&
		    out->state != FLOWSHM_STATE_FAILED)
			out->state = FLOWSHM_STATE_CLOSED;
	} else if ((flags & FR_FLAG_ENDED) || consumer_at_end(f)) {
		out->state = FLOWSHM_STATE_ENDED;
	}
}

int flowshm_state(flowshm_t *f, struct flowshm_state *out)
{
	struct fr_status_view v;
	bool have;

	if (!f || !out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	have = fr_status_read(&f->ring, &v) == 0;
	if (have) {
		out->state = v.state <= FR_STATE_CLOSED ?
				     (enum flowshm_flow_state)v.state :
				     FLOWSHM_STATE_UNKNOWN;
		/* reason is an errno moverd wrote: positive in the ring */
		out->reason = v.reason && v.reason < 4096 ? -(int)v.reason : 0;
		out->since_ns = v.since_ns;
		out->producers = v.producers;
		out->consumers = v.consumers;
	}
	ring_override(f, out);
	out->lag_bytes = lag_of(f);
	out->daemon = daemon_state(f, have ? &v : NULL);
	return 0;
}

const char *flowshm_state_name(enum flowshm_flow_state s)
{
	switch (s) {
	case FLOWSHM_STATE_OPEN: return "open";
	case FLOWSHM_STATE_CONNECTING: return "connecting";
	case FLOWSHM_STATE_PEER_DOWN: return "peer down";
	case FLOWSHM_STATE_DRAINING: return "draining";
	case FLOWSHM_STATE_ENDED: return "ended";
	case FLOWSHM_STATE_FAILED: return "failed";
	case FLOWSHM_STATE_CLOSED: return "closed";
	default: return "unknown";
	}
}

int fsi_why_timeout(flowshm_t *f)
{
	struct flowshm_state st;

	flowshm_state(f, &st);
	if (st.daemon == FLOWSHM_DAEMON_DOWN)
		return -EHOSTDOWN;
	if (st.state == FLOWSHM_STATE_PEER_DOWN ||
	    st.state == FLOWSHM_STATE_CONNECTING)
		return -ENOTCONN;
	return -ETIMEDOUT;
}

/* ---- end of stream ------------------------------------------------------ */

/* No moverd: write the end record ourselves, waiting for room. */
static int end_alone(flowshm_t *f, int64_t timeout_ns)
{
	uint64_t deadline = timeout_ns < 0 ? UINT64_MAX :
					     fr_now_ns() + (uint64_t)timeout_ns;

	for (;;) {
		int rc = fr_write_end(&f->ring);

		if (rc != -EAGAIN)
			return rc;
		if (timeout_ns == 0)
			return -EAGAIN;
		if (fr_now_ns() >= deadline ||
		    fr_wait_room(&f->ring, deadline) == -ETIMEDOUT)
			return fsi_why_timeout(f);
	}
}

/* Through moverd: it writes the record once every producer has ended. */
static int end_via_moverd(flowshm_t *f)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__EndStream es = FLOWMOVER__END_STREAM__INIT;
	Flowmover__Response *resp = NULL;
	int rc;

	es.name = f->name;
	req.body_case = FLOWMOVER__REQUEST__BODY_END_STREAM;
	req.end_stream = &es;
	rc = ctl_call(f->ctl_fd, &req, &resp, NULL, END_TIMEOUT_MS);
	ctl_response_free(resp);
	return rc;
}

int flowshm_end(flowshm_t *f, int64_t timeout_ns)
{
	/* forked: a copy in a child of fork, whose connection is closed
	 * (attach.c): ending alone would write END past moverd */
	if (!f || f->role != FLOWSHM_PRODUCER || f->reserved ||
	    f->ring.mode == FR_MODE_DEPOSIT || f->forked)
		return -EINVAL;
	fr_count_flush(&f->ring); /* the count is exact once a stream ends */
	if (f->ctl_fd >= 0)
		return end_via_moverd(f);
	return end_alone(f, timeout_ns);
}
