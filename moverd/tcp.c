/*
 * moverd/tcp.c - the TCP transport: one socket per peer, driven by the
 * io_uring loop.  Sends are one sendmsg of the frames the protocol built
 * (headers and producer-ring spans, no copy); a short send goes on from
 * where it stopped.  Between bodies a receive takes whatever has come, up
 * to RX_STAGE bytes, into a staging buffer: the next header, a small
 * record's body and the frames behind it, handed to the protocol as a
 * byte stream (peer_rx_stream).  What such a receive leaves of a body
 * (a large one, or one not all in yet) is read straight where it goes:
 * control bodies into a buffer, DATA into the consumer ring (readv of the
 * one or two pieces the protocol pointed at), first at once without
 * waiting (read_body_now), then by an io_uring receive of the rest.
 */
#include "peer_impl.h"
#include "listener.h"
#include "log.h"
#include "lattrace.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void tcp_recv(struct peer *p);
static void read_body_now(struct peer *p);

/* ---- sending -------------------------------------------------------------- */

static void write_done(struct loop_op *op, int res);

static void tcp_send(struct peer *p)
{
	struct io_uring_sqe *sqe = loop_sqe(p->m->loop, &p->wr_op, write_done);

	if (!sqe) {
		peer_fail(p, "no submission slot");
		return;
	}
	p->tx_msg = (struct msghdr){ .msg_iov = p->tx_iov + p->tx_first,
				     .msg_iovlen = p->tx_niov - p->tx_first };
	io_uring_prep_sendmsg(sqe, p->fd, &p->tx_msg, MSG_NOSIGNAL);
	fmlt_mark(LT_TX_SUBMIT, p->tx_niov);
	p->last_tx_ns = fr_now_ns();
}

static void write_done(struct loop_op *op, int res)
{
	struct peer *p = CONTAINER(op, struct peer, wr_op);
	size_t done;

	fmlt_mark(LT_TX_DONE, (uint64_t)res);
	if (p->state == PEER_CLOSING)
		return; /* reap_peers takes it from here */
	/* a send out of a ring a client shrank: that flow only */
	if (res == -EFAULT && peer_tx_fault(p)) {
		tcp_send(p);
		return;
	}
	if (res <= 0) {
		peer_fail(p, "send: %s", res ? strerror(-res) : "closed");
		return;
	}
	p->bytes_tx += (uint64_t)res;
	done = (size_t)res;
	while (p->tx_first < p->tx_niov && done >= p->tx_iov[p->tx_first].iov_len)
		done -= p->tx_iov[p->tx_first++].iov_len;
	if (p->tx_first < p->tx_niov) {
		/* partial send: go on from where the socket stopped */
		p->tx_iov[p->tx_first].iov_base =
			(char *)p->tx_iov[p->tx_first].iov_base + done;
		p->tx_iov[p->tx_first].iov_len -= done;
		tcp_send(p);
		return;
	}
	peer_sent(p);
}

/* ---- receiving ------------------------------------------------------------ */

static void read_done(struct loop_op *op, int res)
{
	struct peer *p = CONTAINER(op, struct peer, rd_op);

	if (p->state == PEER_CLOSING)
		return; /* reap_peers takes it from here */
	/* a receive straight into a ring a client shrank: that flow only */
	if (res == -EFAULT && !p->rx_staged && peer_rx_fault(p)) {
		tcp_recv(p);
		return;
	}
	if (res == 0) {
		peer_hung_up(p, "receive: closed");
		return;
	}
	if (res < 0) {
		peer_fail(p, "receive: %s", strerror(-res));
		return;
	}
	fmlt_mark(p->rx_staged ? LT_RX_HDR : LT_RX_BODY, (uint64_t)res);
	p->last_rx_ns = fr_now_ns();
	p->bytes_rx += (uint64_t)res;
	if (p->rx_staged) {
		peer_rx_stream(p, p->rx_stage, (size_t)res);
		if (p->state == PEER_UP && p->in_body)
			read_body_now(p);
	} else {
		p->body_have += (size_t)res;
		if (p->body_have == p->hdr.len)
			peer_rx_body(p);
	}
	if (p->state == PEER_UP)
		tcp_recv(p);
}

/*
 * The rest of the current body as p->rx_msg over p->rx_cur: a control body
 * into ctrl_buf, a discarded one into ctrl_buf in pieces, DATA straight
 * into the consumer ring (one or two pieces).  Returns the recv flags:
 * MSG_WAITALL for DATA (one completion per body, not one per segment).
 */
static int body_msg(struct peer *p)
{
	struct iovec *iov = p->rx_cur;
	size_t rest = p->hdr.len - p->body_have;

	if (p->hdr.type == WIRE_CTRL || p->rx_discard) {
		/* a body nobody takes is read in pieces */
		iov[0] = p->hdr.type == WIRE_CTRL ?
			 (struct iovec){ p->ctrl_buf + p->body_have, rest } :
			 (struct iovec){ p->ctrl_buf, rest < WIRE_MAX_CTRL ?
						     rest : WIRE_MAX_CTRL };
		p->rx_msg = (struct msghdr){ .msg_iov = iov, .msg_iovlen = 1 };
		return 0;
	}
	p->rx_msg = (struct msghdr){ .msg_iov = iov,
				     .msg_iovlen = peer_body_rest(p, iov) };
	return MSG_WAITALL;
}

static void tcp_recv(struct peer *p)
{
	struct io_uring_sqe *sqe = loop_sqe(p->m->loop, &p->rd_op, read_done);
	int flags;

	if (!sqe) {
		peer_fail(p, "no submission slot");
		return;
	}
	p->rx_staged = !p->in_body;
	if (p->rx_staged) {
		io_uring_prep_recv(sqe, p->fd, p->rx_stage, RX_STAGE, 0);
		return;
	}
	flags = body_msg(p);
	io_uring_prep_recvmsg(sqe, p->fd, &p->rx_msg, flags);
}

/*
 * The staged receive ended inside a body: a large one, or one whose end
 * was not in yet.  The rest is almost always in the socket already, so
 * read it now, straight where it goes, without waiting for a duty cycle
 * to submit the receive and the next to reap it (measured when headers
 * were received alone: ~3 us of a record's one-way latency, and the
 * deposit and the consumer's wake-up a loop pass later).  Whatever does
 * not come now (EAGAIN, a short read, an error or EOF) is left to the
 * io_uring receive armed after us, which reports errors.
 */
static void read_body_now(struct peer *p)
{
	ssize_t n;

	body_msg(p);
	n = recvmsg(p->fd, &p->rx_msg, MSG_DONTWAIT);
	if (n <= 0)
		return;
	p->bytes_rx += (uint64_t)n;
	p->body_have += (size_t)n;
	if (p->body_have == p->hdr.len)
		peer_rx_body(p);
}

/*
 * A DATA body is received whole (MSG_WAITALL): one completion however
 * long it takes, so a large record on a slow link (64 MiB below 13 MB/s)
 * would leave last_rx_ns older than DEAD_NS while its bytes still come,
 * and the link be failed, and the same frame sent again, for ever.  The
 * kernel knows when data last came (TCP_INFO, ms).
 */
static uint64_t tcp_last_bytes_ns(struct peer *p, uint64_t now)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	uint64_t ago;

	if (!p->in_body || p->rx_staged || !p->rd_op.busy || p->fd < 0)
		return 0;
	if (getsockopt(p->fd, IPPROTO_TCP, TCP_INFO, &ti, &len))
		return 0;
	ago = ti.tcpi_last_data_recv * 1000000ull;
	return ago < now ? now - ago : 0;
}

/* ---- connections ---------------------------------------------------------- */

/*
 * One connection carries every flow to a peer, so whatever sits unsent in
 * the kernel is queued ahead of the next flow's record, whatever the
 * mover's round robin chose.  TCP_NOTSENT_LOWAT keeps that queue short:
 * a send waits until less than NOTSENT_LOWAT bytes are unsent, and the
 * rest of the backlog stays in the rings, where the round robin orders it.
 * Beside two busy flows a sparse record's p50 went from 5-11 ms to about
 * 2 ms; 256 KiB gained little more and cost 64 KiB / 1 MiB throughput
 * in some runs, 1 MiB did not (moverd/README.md, "One connection, many
 * flows").  The buffers stay at 4 MiB so that bulk is not window-bound;
 * what the peer has not read yet (up to its receive buffer) is bounded by
 * the mover's connection window instead (mover.c), by the delay it adds.
 */
#define NOTSENT_LOWAT (1 << 20)

static void tune_socket(int fd)
{
	int one = 1, buf = 4 << 20, lowat = NOTSENT_LOWAT;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

int peer_resolve(const char *addr, struct sockaddr_storage *sa,
		 socklen_t *len)
{
	struct resolver_result res;
	int rc = resolver_lookup_now(addr, &res);

	if (rc)
		return rc;
	memcpy(sa, &res.sa, res.len);
	*len = res.len;
	return 0;
}

/* ---- the address of an outbound peer ------------------------------------ */

#define RESOLVE_RETRY_NS 2000000000ull

/* Say why p's flows are not open yet (their state stays); a failure is
 * also p's last error (status). */
static void flows_reason(struct peer *p, bool failed, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void flows_reason(struct peer *p, bool failed, const char *fmt, ...)
{
	char why[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (failed)
		peer_note_error(p, why);
	for (struct flow *f = p->flows; f; f = f->peer_next)
		if (f->state == FLOW_CONNECTING || f->state == FLOW_RECONNECTING)
			flows_set_state(f, f->state, why);
}

/*
 * A name that does not resolve: each waiting flow's reason, and a warning
 * the first time in a row.  The lookup is tried again every
 * RESOLVE_RETRY_NS for as long as a flow wants the peer, and a user's
 * flows pick the names: a line at every retry was a stream a user could
 * open at will (a review: 32 names, 16 lines a second).
 */
static void resolve_failed(struct peer *p, const char *why)
{
	static struct log_limit lim;

	flows_reason(p, true, "cannot resolve %s: %s", p->addr, why);
	if (!p->unresolved)
		log_limited(&lim, LOG_LVL_WARN, "peer %s: cannot resolve: %s; "
			    "retrying (said again once it has resolved)",
			    p->addr, why);
	else
		log_debug("peer %s: cannot resolve: %s", p->addr, why);
	p->unresolved = true;
}

/* A lookup ended, on the loop.  Its peer is found by the lookup's id: a
 * peer that went away meanwhile is not there to find. */
static void address_resolved(struct resolver *r,
			     const struct resolver_result *res)
{
	struct peer_mgr *m = CONTAINER(r, struct peer_mgr, resolver);
	struct peer *p = m->peers;

	while (p && p->lookup_id != res->id)
		p = p->next;
	if (!p)
		return;
	p->lookup_id = 0;
	p->retry_at_ns = fr_now_ns() + RESOLVE_RETRY_NS;
	if (!p->outbound || p->state != PEER_DOWN || !p->flows)
		return; /* nothing waits for it any more */
	if (res->err) {
		resolve_failed(p, res->why);
		return;
	}
	p->unresolved = false;
	memcpy(&p->sa, &res->sa, res->len);
	p->sa_len = res->len;
	p->sa_fresh = true;
	p->tp->connect(p);
}

int peer_resolver_start(struct peer_mgr *m)
{
	return resolver_start(&m->resolver, m->loop, address_resolved);
}

int peer_address(struct peer *p)
{
	struct resolver_result res;
	int rc;

	if (p->sa_fresh) { /* each attempt looks the name up anew */
		p->sa_fresh = false;
		return 0;
	}
	if (p->lookup_id) { /* one lookup at a time per peer */
		flows_reason(p, false, "resolving %s", p->addr); /* a new flow too */
		return -EINPROGRESS;
	}
	rc = resolver_lookup(&p->m->resolver, p->addr,
			     flows_is_operator(p->uid), &res, &p->lookup_id);
	if (rc == 0) {
		p->unresolved = false;
		memcpy(&p->sa, &res.sa, res.len);
		p->sa_len = res.len;
		return 0;
	}
	if (rc == -EINPROGRESS) {
		/* no retry from the timer: the answer connects */
		p->retry_at_ns = UINT64_MAX;
		flows_reason(p, false, "resolving %s", p->addr);
		return rc;
	}
	resolve_failed(p, res.why);
	p->retry_at_ns = fr_now_ns() + RESOLVE_RETRY_NS;
	return rc;
}

/* ---- connections, continued ---------------------------------------------- */

/*
 * A connect has a deadline of its own, --peer-connect-timeout: toward a
 * host that drops our SYNs it would otherwise wait for the kernel to give
 * up (tcp_syn_retries: about 2 minutes), the socket held and the flows
 * saying nothing.  The deadline is an io_uring timeout linked to the
 * connect (IOSQE_IO_LINK): the kernel cancels the connect when it fires
 * (the connect completes -ECANCELED, nothing else cancels it) and the
 * timeout when the connect ends first.  The timeout is an op of its own
 * (conn_tmo_op, in peer_io_busy): the peer stays until both completed.
 *
 * A failure is each waiting flow's reason ("connect to HOST:PORT: ..."),
 * and a warning when it differs from the last attempt's: a peer that
 * stays unreachable is said once, not at every retry (peer_closed paces
 * those: 100 ms doubling to 3.2 s, reset once a connection authenticated).
 */
static void connect_failed(struct peer *p, int res)
{
	static struct log_limit lim; /* a user's flows pick the addresses */
	char why[64];

	if (res == -ECANCELED)
		snprintf(why, sizeof(why), "timed out after %u s",
			 p->m->connect_timeout_s);
	else
		snprintf(why, sizeof(why), "%s", strerror(-res));
	flows_reason(p, true, "connect to %s: %s", p->addr, why);
	if (p->conn_err != res)
		log_limited(&lim, LOG_LVL_WARN, "peer %s: connect: %s; retrying "
			    "(said again if that changes)", p->addr, why);
	else
		log_debug("peer %s: connect: %s", p->addr, why);
	p->conn_err = res;
}

static void connect_done(struct loop_op *op, int res)
{
	struct peer *p = CONTAINER(op, struct peer, conn_op);

	if (p->state == PEER_CLOSING)
		return; /* reap_peers takes it from here */
	if (res < 0) {
		connect_failed(p, res);
		p->state = PEER_CLOSING; /* reap_peers schedules a retry */
		return;
	}
	p->conn_err = 0; /* the next failure is said again */
	peer_up(p);
}

/* The connect's linked timeout: -ETIME when it fired (the connect is
 * cancelled, connect_done says so), -ECANCELED when the connect ended
 * first.  Nothing to do but be done (peer_io_busy). */
static void connect_timeout_done(struct loop_op *op, int res)
{
	(void)op;
	(void)res;
}

static void tcp_connect(struct peer *p)
{
	struct io_uring_sqe *sqe;
	struct loop *l = p->m->loop;

	if (peer_address(p))
		return;
	p->fd = socket(p->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p->fd < 0) { /* no fd (EMFILE): said as a failed connect */
		connect_failed(p, -errno);
		p->retry_at_ns = fr_now_ns() + 1000000000ull;
		return;
	}
	tune_socket(p->fd);
	/* the connect and its timeout in one submission: a link cut at a
	 * submission's end would leave the timeout alone (-EINVAL) */
	if (!loop_room(l, 2)) {
		close(p->fd);
		p->fd = -1;
		return;
	}
	sqe = loop_sqe(l, &p->conn_op, connect_done);
	io_uring_prep_connect(sqe, p->fd, (struct sockaddr *)&p->sa, p->sa_len);
	io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK);
	p->conn_ts = (struct __kernel_timespec){
		.tv_sec = p->m->connect_timeout_s };
	sqe = loop_sqe(l, &p->conn_tmo_op, connect_timeout_done);
	io_uring_prep_link_timeout(sqe, &p->conn_ts, 0);
	p->state = PEER_CONNECTING;
}

static void arm_accept(struct peer_mgr *m);

/* The back-off after a failed accept ended: accept again. */
static void accept_wait_done(struct loop_op *op, int res)
{
	struct peer_mgr *m = CONTAINER(op, struct peer_mgr, accept_wait.op);

	(void)res;
	if (m->listen_fd >= 0)
		arm_accept(m);
}

static void accept_failed(struct peer_mgr *m, int res)
{
	static struct log_limit lim;

	log_limited(&lim, LOG_LVL_WARN, "peer accept: %s%s", strerror(-res),
		    listener_must_wait(res) ? ": waiting before the next" : "");
	if (listener_must_wait(res))
		listener_wait(m->loop, &m->accept_wait, accept_wait_done);
	else
		arm_accept(m);
}

static void accept_done(struct loop_op *op, int res)
{
	struct peer_mgr *m = CONTAINER(op, struct peer_mgr, accept_op);
	struct sockaddr_storage sa;
	socklen_t len = sizeof(sa);
	char host[64] = "?", serv[16] = "?", addr[80];
	static struct log_limit refused_lim;
	const char *refused;
	struct peer *p;

	if (m->listen_fd < 0) {
		if (res >= 0)
			close(res);
		return;
	}
	if (res < 0) {
		accept_failed(m, res);
		return;
	}
	listener_ok(&m->accept_wait);
	arm_accept(m);
	sa.ss_family = AF_UNSPEC; /* no address: no --peer-allow matches */
	if (!getpeername(res, (struct sockaddr *)&sa, &len))
		getnameinfo((struct sockaddr *)&sa, len, host, sizeof(host),
			    serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
	/* before anything is allocated for it: --peer-allow, then the caps */
	refused = !peer_allowed(m, (struct sockaddr *)&sa) ?
		  "not in --peer-allow" :
		  listener_fds_left(res) < PEER_FD_RESERVE ?
		  "near the open-file limit" : peer_admit(m, host);
	if (refused) {
		m->refused++;
		log_limited(&refused_lim, LOG_LVL_WARN, "refusing a peer "
			    "connection from %s: %s", host, refused);
		close(res);
		return;
	}
	snprintf(addr, sizeof(addr), "%s:%s", host, serv);
	p = peer_new(m, addr, false, &tcp_transport);
	if (!p) {
		log_limited(&refused_lim, LOG_LVL_WARN, "refusing a peer "
			    "connection from %s: out of memory", host);
		close(res);
		return;
	}
	p->fd = res;
	tune_socket(res);
	peer_up(p);
}

static bool tcp_local_addr(struct peer *p, struct sockaddr_storage *sa)
{
	socklen_t len = sizeof(*sa);

	return p->fd >= 0 && !getsockname(p->fd, (struct sockaddr *)sa, &len);
}

/* The port fd is bound to (our hellos say it: peer.c, inbound_from). */
static uint16_t bound_port(int fd)
{
	struct sockaddr_storage sa;
	socklen_t len = sizeof(sa);

	if (getsockname(fd, (struct sockaddr *)&sa, &len))
		return 0;
	if (sa.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)&sa)->sin_port);
	if (sa.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
	return 0;
}

static void arm_accept(struct peer_mgr *m)
{
	struct io_uring_sqe *sqe = loop_sqe(m->loop, &m->accept_op, accept_done);

	if (sqe) /* else tcp_rearm tries again */
		io_uring_prep_accept(sqe, m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
}

void tcp_rearm(struct peer_mgr *m)
{
	if (listener_lost(m->listen_fd, &m->accept_op, &m->accept_wait))
		arm_accept(m);
	resolver_rearm(&m->resolver);
}

static int tcp_listen(struct peer_mgr *m, const char *addr)
{
	struct sockaddr_storage sa;
	socklen_t len;
	int one = 1, fd, rc = peer_resolve(addr, &sa, &len);

	if (rc) {
		log_error("cannot resolve listen address %s", addr);
		return rc;
	}
	fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, len) || listen(fd, 64)) {
		rc = -errno;
		log_error("listen on %s: %s", addr, strerror(-rc));
		close(fd);
		return rc;
	}
	m->listen_fd = fd;
	snprintf(m->listen_addr, sizeof(m->listen_addr), "%s", addr);
	m->listen_port = bound_port(fd);
	arm_accept(m);
	log_info("listening for peers on %s", addr);
	return 0;
}

static void tcp_stop_listening(struct peer_mgr *m)
{
	if (m->listen_fd < 0)
		return;
	shutdown(m->listen_fd, SHUT_RDWR);
	close(m->listen_fd);
	m->listen_fd = -1;
}

static void tcp_shutdown(struct peer *p)
{
	if (p->fd >= 0)
		shutdown(p->fd, SHUT_RDWR); /* completes any op in flight */
}

static void tcp_close(struct peer *p)
{
	if (p->fd >= 0)
		close(p->fd);
	p->fd = -1;
}

const struct transport tcp_transport = {
	.name = "tcp",
	.byte_queue = true,
	.listen = tcp_listen,
	.stop_listening = tcp_stop_listening,
	.local_addr = tcp_local_addr,
	.connect = tcp_connect,
	.send = tcp_send,
	.recv = tcp_recv,
	.shutdown = tcp_shutdown,
	.close = tcp_close,
	.last_bytes_ns = tcp_last_bytes_ns,
};
