/*
 * moverd/peer_hello.c - a connection's first words: the hello, the key
 * proof (auth.h) and what is decided on it: a connection to a daemon
 * already connected merged or retired, sender flows waiting for that
 * daemon adopted, and the flows' opens queued once the peer proved it
 * holds the key.  peer_up starts it all on a fresh connection.
 *
 * Until the proof a peer is its address alone (set_identity): it may say
 * nothing but HELLO and AUTH (peer_rx.c), and no flow is opened for it.
 */
#include "peer_parts.h"
#include "log.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static void queue_opens(struct peer *p)
{
	struct flow *next;

	for (struct flow *f = p->flows; f; f = next) {
		next = f->peer_next; /* queue_open may take f off the list */
		if (f->state != FLOW_FAILED)
			queue_open(p, f);
	}
}

/* A fresh connection: nothing of an earlier one's handshake is kept. */
static void auth_reset(struct peer *p)
{
	p->auth_ok = p->hello_ok = p->hello_seen = false;
	p->auth_fail[0] = p->node[0] = p->node_safe[0] = p->key_id[0] = 0;
	memset(p->nonce_theirs, 0, sizeof(p->nonce_theirs));
	auth_nonce(p->nonce_mine);
	p->listen_port = 0;
	p->instance = 0;
	p->twin_tags = false;
	p->retiring = false;
	p->alias[0] = 0;
}

/*
 * A daemon connected to us that our sender flows wait for, on a
 * connection of their own that is down between retries (say that daemon
 * restarted): they ride this one instead (inbound_from), and open now.
 */
static void adopt_waiting(struct peer *in)
{
	for (struct peer *p = in->m->peers; p; p = p->next) {
		if (!p->outbound || p->state != PEER_DOWN || !p->flows ||
		    inbound_from(p->m, p->addr) != in)
			continue;
		log_info("peer %s: its flows move to the connection %s opened "
			 "to us", p->addr, in->addr);
		move_senders(p, in);
	}
}

/* Close p, a connection we dialed, for keep (merge_duplicate). */
static void retire(struct peer *p, const struct peer *keep)
{
	if (p->state != PEER_UP)
		return;
	log_info("peer %s: a second connection to the moverd that %s leads "
		 "to: closing ours, its flows move there", p->addr, keep->addr);
	p->retiring = true;
	peer_close(p, "moving to another connection to the same moverd");
}

/*
 * p has just authenticated, and another authenticated connection leads to
 * the same run of moverd (its hello's instance): both daemons dialed at
 * once, or a flow names that daemon by host name, which inbound_from does
 * not match.  One connection per pair of daemons stays.  Each daemon
 * closes only connections it dialed, and both decide alike without a
 * word: of one it dialed and one it accepted, the connection dialed by
 * the daemon of the smaller instance stays; of two it dialed, the older.
 * The closed connection's sender flows move to the one that stays once
 * its ops are reaped (retired) and resume from what was acknowledged, as
 * after a cut.  Only with --peer-key: without it, as for inbound_from, a
 * daemon is known by its address.  Returns whether p itself goes.
 */
static bool merge_duplicate(struct peer *p)
{
	struct peer_mgr *m = p->m;
	bool ours_larger = m->instance > p->instance;

	if (!m->key || m->stopping || !p->instance ||
	    p->instance == m->instance)
		return false;
	for (struct peer *q = m->peers; q; q = q->next) {
		if (!same_run(q, p))
			continue;
		if (p->outbound && (q->outbound || ours_larger)) {
			retire(p, q);
			return true;
		}
		if (!p->outbound && q->outbound && ours_larger)
			retire(q, p);
	}
	return false;
}

static void authenticated(struct peer *p)
{
	static struct log_limit lim; /* without a key anyone can get here */

	/* edges' hello_ok (the caps of pending peers, the hello deadline)
	 * now means the same: the whole handshake is done */
	p->auth_ok = p->hello_ok = true;
	if (p->m->key) {
		snprintf(p->key_id, sizeof(p->key_id), "%s", p->m->key->id);
		/* a node name proven by the key (see branch acl): without a
		 * key a name proves nothing and identity stays the address */
		snprintf(p->identity, sizeof(p->identity), "%s key %s",
			 p->node_safe, p->key_id);
	}
	log_limited(&lim, LOG_LVL_INFO, "peer %s: authenticated: node %s, %s%s",
		    p->addr, p->node_safe, p->key_id[0] ? "key " :
		    "no key (--peer-key not set)", p->key_id);
	if (p->outbound)
		p->backoff_ms = 100; /* only now: a refused handshake
				      * reconnects ever more slowly */
	if (p->tp->authenticated) {
		/* may fail p, or close one that hung up meanwhile (RDMA:
		 * its frames are taken before the hang-up is acted on) */
		p->tp->authenticated(p);
		if (p->state != PEER_UP)
			return;
	}
	if (merge_duplicate(p))
		return; /* its flows go to the other connection */
	if (p->outbound)
		queue_opens(p);
	else
		adopt_waiting(p);
}

/* Printable ASCII only, for logs and status (the raw name is proven). */
static void filter_node(char *out, const char *in, size_t cap)
{
	size_t i = 0;

	for (; in[i] && i + 1 < cap; i++)
		out[i] = in[i] > ' ' && in[i] < 0x7f ? in[i] : '?';
	out[i] = 0;
}

/*
 * The two sides must agree on having a key and on which: the first side
 * that sees a mismatch says so.  NULL, or why not.
 */
static const char *key_mismatch(const struct peer *p,
				const Flowmover__PeerHello *h, char *buf,
				size_t cap)
{
	const struct auth_key *k = p->m->key;
	bool theirs = h->key_id && *h->key_id;
	char id[AUTH_ID_CHARS + 1];

	if (!k && !theirs)
		return NULL;
	/* its words, shown in logs and flow show: printable only */
	filter_node(id, theirs ? h->key_id : "", sizeof(id));
	if (!k) {
		snprintf(buf, cap, "the peer holds a key (id %s), this "
			 "moverd has none (--peer-key)", id);
		return buf;
	}
	if (!theirs) {
		snprintf(buf, cap, "the peer has no key, this moverd requires "
			 "one (key id %s)", k->id);
		return buf;
	}
	if (strcmp(h->key_id, k->id)) {
		snprintf(buf, cap, "the peer holds another key (id %s, ours "
			 "%s)", id, k->id);
		return buf;
	}
	if (h->nonce.len != AUTH_NONCE_BYTES) {
		snprintf(buf, cap, "a nonce of %zu bytes", h->nonce.len);
		return buf;
	}
	return NULL;
}

/*
 * Responder: the address the initiator says it dialed must be ours: this
 * connection's local address, or one --peer-reachable-at names.  Both
 * proofs cover it, so a relay (a party at another address that forwards
 * the hellos both ways and then owns the connection) gets proofs over its
 * own address, and fails here.  p->dialed: the checked address, or where
 * the connection really reached (our hello tells the initiator).
 */
static const char *dialed_mismatch(struct peer *p,
				   const Flowmover__PeerHello *h, char *buf,
				   size_t cap)
{
	struct sockaddr_storage sa;
	char said[ENDPOINT_CHARS];

	if (!p->tp->local_addr(p, &sa) ||
	    !endpoint_name((struct sockaddr *)&sa, p->dialed, sizeof(p->dialed)))
		snprintf(p->dialed, sizeof(p->dialed), "?");
	if (!h->dialed || !*h->dialed) {
		snprintf(buf, cap, "its hello does not say the address it "
			 "dialed (a moverd from before the handshake bound "
			 "it): upgrade it");
		return buf;
	}
	if (!strcmp(h->dialed, p->dialed) || peer_reach_has(p->m->reach,
							    h->dialed)) {
		snprintf(p->dialed, sizeof(p->dialed), "%s", h->dialed);
		return NULL;
	}
	filter_node(said, h->dialed, sizeof(said));
	snprintf(buf, cap, "it dialed %s but the connection reached %s: a "
		 "relay (NAT: --peer-reachable-at)", said, p->dialed);
	return buf;
}

/* Initiator: the responder's echo of the address we dialed (its hello).
 * Informative only: the proof decides, but this says why it fails. */
static bool dialed_echo_ok(struct peer *p, const Flowmover__PeerHello *h)
{
	char said[ENDPOINT_CHARS];

	if (!h->dialed || !*h->dialed) {
		peer_fail(p, "peer authentication failed: its hello does not "
			  "echo the address we dialed (a moverd from before "
			  "the handshake bound it): upgrade it");
		return false;
	}
	if (!strcmp(h->dialed, p->dialed))
		return true;
	filter_node(said, h->dialed, sizeof(said));
	peer_fail(p, "peer authentication failed: we dialed %s but the "
		  "connection reached %s: a relay (NAT: --peer-reachable-at "
		  "on the peer)", p->dialed, said);
	return false;
}

/* Responder: answer the initiator's hello (and refuse once it is sent,
 * if it must: the initiator then hears why from our hello). */
static void responder_hello(struct peer *p, const char *mismatch)
{
	if (mismatch) {
		static struct log_limit lim; /* anyone may say hello */

		snprintf(p->auth_fail, sizeof(p->auth_fail), "peer "
			 "authentication failed: %s", mismatch);
		log_limited(&lim, LOG_LVL_WARN, "peer %s: %s", p->addr,
			    p->auth_fail);
	}
	queue_hello(p);
	if (!mismatch && !p->m->key)
		authenticated(p); /* insecure: the hellos are all */
}

/* Initiator: the responder's hello, its proof checked, ours sent. */
static void initiator_hello(struct peer *p, const Flowmover__PeerHello *h,
			    const char *mismatch)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerAuth auth = FLOWMOVER__PEER_AUTH__INIT;
	const struct auth_key *k = p->m->key;
	uint8_t proof[AUTH_PROOF_BYTES];

	if (mismatch) {
		peer_fail(p, "peer authentication failed: %s", mismatch);
		return;
	}
	if (!k) {
		authenticated(p);
		return;
	}
	if (!dialed_echo_ok(p, h))
		return;
	if (!auth_check(k, AUTH_RESPONDER, p->nonce_mine, p->nonce_theirs,
			node_name(), p->node, p->dialed, h->proof.data,
			h->proof.len)) {
		peer_fail(p, "peer authentication failed: its proof (%zu "
			  "bytes) is wrong for key %s: a replayed or forged "
			  "hello", h->proof.len, k->id);
		return;
	}
	auth_proof(k, AUTH_INITIATOR, p->nonce_mine, p->nonce_theirs,
		   node_name(), p->node, p->dialed, proof);
	auth.proof = (ProtobufCBinaryData){ sizeof(proof), proof };
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_AUTH;
	msg.auth = &auth;
	queue_ctrl(p, &msg);
	authenticated(p);
}

void handle_hello(struct peer *p, const Flowmover__PeerHello *h)
{
	static struct log_limit lim; /* anyone may connect and say hello */
	char buf[256], node[LOG_SAFE_BUF];
	const char *mismatch;

	if (p->hello_seen) {
		peer_fail(p, "peer authentication failed: a second hello");
		return;
	}
	p->hello_seen = true;
	if (h->version != WIRE_VERSION) {
		peer_fail(p, "peer protocol version %u, we speak %u",
			  h->version, WIRE_VERSION);
		return;
	}
	/* the proofs cover the whole name: with a key it must fit; without
	 * one it is only shown, cut */
	if (!h->node) {
		peer_fail(p, "a hello without a node name");
		return;
	}
	if (p->m->key && strlen(h->node) >= sizeof(p->node)) {
		peer_fail(p, "peer authentication failed: a node name of more "
			  "than %zu bytes", sizeof(p->node) - 1);
		return;
	}
	snprintf(p->node, sizeof(p->node), "%s", h->node);
	filter_node(p->node_safe, h->node, sizeof(p->node_safe));
	log_limited(&lim, LOG_LVL_INFO, "peer %s: hello from %s", p->addr,
		    log_safe(h->node, node, sizeof(node)));
	if (!p->outbound && h->listen_port <= UINT16_MAX)
		p->listen_port = (uint16_t)h->listen_port;
	p->instance = h->instance;
	p->twin_tags = h->twin_tags;
	mismatch = key_mismatch(p, h, buf, sizeof(buf));
	if (!mismatch && p->m->key && !p->outbound)
		mismatch = dialed_mismatch(p, h, buf, sizeof(buf));
	if (!mismatch && p->m->key)
		memcpy(p->nonce_theirs, h->nonce.data, AUTH_NONCE_BYTES);
	if (p->outbound)
		initiator_hello(p, h, mismatch);
	else
		responder_hello(p, mismatch);
}

/* Responder: the initiator's proof, over our fresh nonce. */
void handle_auth(struct peer *p, const Flowmover__PeerAuth *a)
{
	const struct auth_key *k = p->m->key;

	if (p->outbound || !k || !p->hello_seen || p->auth_ok) {
		peer_fail(p, "peer authentication failed: an unexpected proof");
		return;
	}
	if (!auth_check(k, AUTH_INITIATOR, p->nonce_theirs, p->nonce_mine,
			p->node, node_name(), p->dialed, a->proof.data,
			a->proof.len)) {
		peer_fail(p, "peer authentication failed: its proof (%zu "
			  "bytes) is wrong for key %s: a replayed or reflected "
			  "hello, or another key", a->proof.len, k->id);
		return;
	}
	authenticated(p);
}

/*
 * p->host, for the quotas: what the connection itself says, never the
 * hello.  Inbound, the address it came from; outbound, the address we
 * connected to (resolved, so a host name we dialed is charged as the
 * address it names).  One numeric form, so that "::ffff:10.0.0.1" and
 * "10.0.0.1" are one host.
 */
static void set_host(struct peer *p)
{
	const struct sockaddr_in6 *s6 = (const void *)&p->sa;
	const struct sockaddr_in *s4 = (const void *)&p->sa;
	char host[sizeof(p->addr)];
	struct in6_addr ip;
	bool ok;

	peer_host(p, host, sizeof(host));
	if (p->outbound && p->sa.ss_family == AF_INET6) {
		ip = s6->sin6_addr;
		ok = true;
	} else if (p->outbound && p->sa.ss_family == AF_INET) {
		v4_mapped(&ip, &s4->sin_addr);
		ok = true;
	} else {
		ok = parse_ip(host, strlen(host), &ip);
	}
	if (ok && IN6_IS_ADDR_V4MAPPED(&ip))
		ok = inet_ntop(AF_INET, &ip.s6_addr[12], host, sizeof(host));
	else if (ok)
		ok = inet_ntop(AF_INET6, &ip, host, sizeof(host));
	if (!ok) /* not numeric: as it is (it was never a claim either) */
		peer_host(p, host, sizeof(host));
	/* A name longer than p->host is cut: it only keys the quotas. */
	size_t n = strnlen(host, sizeof(p->host) - 1);
	memcpy(p->host, host, n);
	p->host[n] = '\0';
}

/* Until the hello authenticates it, a peer is its address, without the
 * port (which changes with every connection). */
static void set_identity(struct peer *p)
{
	peer_host(p, p->identity, sizeof(p->identity));
	set_host(p);
}

static void log_inbound(const struct peer *p)
{
	static struct log_limit lim; /* anyone may connect at will */

	log_limited(&lim, LOG_LVL_INFO, "peer %s: connected over %s (inbound)",
		    p->addr, p->tp->name);
}

void peer_up(struct peer *p)
{
	/* receive state is fresh: calloc'd, or reset by peer_closed */
	p->state = PEER_UP;
	set_identity(p);
	p->last_rx_ns = p->last_tx_ns = p->connected_ns = fr_now_ns();
	mover_window_reset(p);
	auth_reset(p); /* the hello deadline runs until authenticated */
	p->dialed[0] = 0;
	if (p->outbound && !endpoint_name((struct sockaddr *)&p->sa, p->dialed,
					  sizeof(p->dialed)))
		p->dialed[0] = 0;
	if (p->outbound)
		queue_hello(p); /* opens go once the responder proved its key */
	p->tp->recv(p);
	if (p->outbound)
		log_info("peer %s: connected over %s (outbound)", p->addr,
			 p->tp->name);
	else
		log_inbound(p);
}
