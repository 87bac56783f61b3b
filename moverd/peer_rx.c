/*
 * moverd/peer_rx.c - frames a peer sends, as the transport hands them in:
 * a header (peer_rx_header), a body in place (peer_rx_body) or a stream
 * of bytes cut into both (peer_rx_stream).  Control messages are unpacked
 * and dispatched (hello and auth: peer_hello.c; opens and closes:
 * peer_open.c); acknowledgements credit the sender's flow (mover.c);
 * DATA lands straight in the consumer ring at its position.
 *
 * Every header is checked before its body is placed: magic, version, a
 * flow this peer holds, a position inside the window, a size that fits.
 * A bad one closes that connection with a logged reason, never the
 * daemon; other peers and flows go on.
 */
#include "peer_parts.h"
#include "ring_guard.h"
#include "lattrace.h"
#include "mover.h"
#include "log.h"
#include "ctl_frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
