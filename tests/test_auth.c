/*
 * tests/test_auth.c - peer daemons prove who they are (issue 9): the
 * shared key, the hello's challenge-response, --peer-allow, and the start-up
 * rules, against real moverds.  FM_AUTH_CASES=1,4 runs only those.
 *
 *   usage: test_auth MOVERD MOVERCTL FLOWCHECK
 *
 *   1  two moverds with the same key (moverctl keygen) move a checked flow;
 *      `status` shows each peer's node and key id
 *   2  wrong key: refused, logged on both sides, the sender's flow says
 *      why, nothing allocated on the receiver
 *   3  a key on one side only (either side): refused the same way
 *   4  a hostile initiator replays the hello and proof of an earlier
 *      (honest) handshake: refused, no flow
 *   5  a hostile initiator reflects the responder's own proof, or sends
 *      one of the wrong length; a hostile responder sends a wrong proof:
 *      refused (and the sender's flow says why, its OPEN never sent)
 *   6  an OPEN before the initiator's proof, a second hello, no proof
 *      before the hello deadline: refused, no flow
 *   7  --peer-allow 10.0.0.0/8 and a connection from 127.0.0.1: closed at
 *      accept, logged, nothing allocated; 127.0.0.0/8 lets it in
 *   8  key files that are group/world-readable or a symlink, and a bad
 *      --peer-allow: moverd refuses to start, saying why
 *   9  --listen on a non-loopback address without a key: refuses to start;
 *      starts with --insecure-peers (and says so loudly)
 *  10  the handshake's cost: connect to authenticated, and moverd's cpu per
 *      handshake, over 200 handshakes (reported, never asserted)
 *  11  a moverd outside --peer-allow: refused at accept (TCP) or before
 *      rdma_accept (RDMA), no flow, no registration
 *  12  one key holder, several node names: the per-peer-host quota
 *      (--peer-max-flows) holds across them, also for flows re-adopted
 *      after a restart; the flows still resume under their own name, are
 *      refused to another name, and another address has its own quota
 *  13  A dials a relay that forwards to B (no key of its own): B refuses,
 *      for A dialed another address than the connection reached, and no
 *      flow exists on B; with B's --peer-reachable-at naming the relay
 *      (NAT, port forwarding) a checked flow goes through it
 *
 * Cases 1-3 and 11 run over FM_AUTH_TRANSPORT to FM_AUTH_ADDR: tcp and
 * 127.0.0.1 by default; in the soft-RoCE guest
 *   contrib/softroce/vm-run.sh -- env FM_AUTH_CASES=1,2,3,11 \
 *     FM_AUTH_TRANSPORT=rdma FM_AUTH_ADDR=10.77.0.1 build/tests/test_auth ...
 */
#include "harness.h"
#include "auth.h"

#include <limits.h>
#include <sys/prctl.h>

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin;
static char keydir[96];

/* Daemons are tracked by harness.h (none outlives a failed case); the keys
 * go with the test. */
static pid_t main_pid;

static void remove_keys(void)
{
	char cmd[160];

	if (getpid() != main_pid || getenv("FM_KEEP") || !keydir[0])
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", keydir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", keydir);
}

static void start(struct hd *d, const char *tag, bool listen,
		  const char *const *extra)
{
	hd_start(d, moverd_bin, tag, listen, extra);
}

/* ---- keys ------------------------------------------------------------------ */

/* moverctl ARGS without a daemon (keygen); exit code, output in out. */
static int ctl_local(char *out, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int ctl_local(char *out, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = tu_vmoverctl(moverctl_bin, "/nonexistent", out, cap, fmt, ap);
	va_end(ap);
	return rc;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	CHECK(fd >= 0);
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
}

/* keydir/NAME, a fresh key written by `moverctl keygen`; its id in id. */
static const char *new_key(const char *name, char *id, size_t cap)
{
	static char paths[8][PATH_MAX];
	static unsigned n;
	char *path = paths[n++ % 8], out[512], *p;

	snprintf(path, PATH_MAX, "%s/%s", keydir, name);
	unlink(path);
	CHECK(ctl_local(out, sizeof(out), "keygen %s", path) == 0);
	p = strstr(out, "key id ");
	CHECK(p);
	if (id)
		snprintf(id, cap, "%.*s", (int)AUTH_ID_CHARS, p + 7);
	return path;
}

static void load_key(const char *path, struct auth_key *k)
{
	char err[256];

	if (auth_load_key(path, k, err, sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
}

/* ---- moverctl views ---------------------------------------------------------- */

/* Wait up to timeout_ms until flow NAME's state_reason contains needle. */
static bool wait_reason(const struct hd *d, const char *name,
			const char *needle, int timeout_ms, char *reason,
			size_t cap)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	char out[4096];

	do {
		if (hd_flow_json(d, moverctl_bin, name, out, sizeof(out)) &&
		    hj_get(out, "state_reason", reason, cap) &&
		    strstr(reason, needle))
			return true;
		usleep(50000);
	} while (tu_now_ns() < until);
	fprintf(stderr, "flow %s: reason '%s', want '%s' in it\n", name,
		reason, needle);
	return false;
}

/* d holds no flow at all. */
static void no_flows(const struct hd *d)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	if (hj_u64(out, "flows")) {
		fprintf(stderr, "want no flow, moverd has some:\n%s\n", out);
		exit(1);
	}
}

/* Wait up to timeout_ms for at least n log lines with needle. */
static void wait_log(const struct hd *d, const char *needle, int n,
		     int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	while (hd_log_count(d, needle) < n) {
		if (tu_now_ns() > until) {
			fprintf(stderr, "%s: no line with '%s'\n", d->log,
				needle);
			exit(1);
		}
		usleep(50000);
	}
}

/* The last log line with needle, printed for the record. */
static void show_log(const struct hd *d, const char *side, const char *needle)
{
	char line[1024], last[1024] = "";
	FILE *f = fopen(d->log, "re");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			snprintf(last, sizeof(last), "%s", line);
	fclose(f);
	printf("  %s logged: %s", side, last[0] ? last : "(nothing)\n");
}

/* ---- two daemons ------------------------------------------------------------- */

/*
 * The daemons of the two-daemon cases talk over FM_AUTH_TRANSPORT (tcp by
 * default; rdma in the soft-RoCE guest) to B at FM_AUTH_ADDR (127.0.0.1;
 * 10.77.0.1 in the guest).
 */
static const char *transport(void)
{
	const char *t = getenv("FM_AUTH_TRANSPORT");

	return t && *t ? t : "tcp";
}

static const char *b_addr(void)
{
	const char *a = getenv("FM_AUTH_ADDR");

	return a && *a ? a : "127.0.0.1";
}

/*
 * RDMA: librdmacm opens the device's files with the first connection
 * request (4 in the soft-RoCE guest) and keeps them; what is checked is
 * that refused connections leave nothing behind: the count after the
 * first refusal becomes the baseline.
 */
static void rdma_base(const struct hd *b, int *base)
{
	if (!strcmp(transport(), "tcp"))
		return;
	usleep(500000);
	*base = hd_fds(b);
}

/* A (sender, no listen) with a_key; B (receiver) with b_key and b_more. */
static void pair_with(struct hd *a, struct hd *b, const char *tag,
		      const char *a_key, const char *b_key,
		      const char *const *b_more)
{
	const char *ea[] = { "--transport", transport(),
			     a_key ? "--peer-key" : NULL, a_key, NULL };
	const char *eb[16] = { "--listen", NULL, "--transport", transport() };
	char ta[32], tb[32], laddr[80];
	int n = 4, port = hd_free_port();

	snprintf(laddr, sizeof(laddr), "%s:%d", b_addr(), port);
	eb[1] = laddr;
	if (b_key) {
		eb[n++] = "--peer-key";
		eb[n++] = b_key;
	} else if (strncmp(b_addr(), "127.", 4)) {
		eb[n++] = "--insecure-peers"; /* case 9: else it refuses */
	}
	for (; b_more && *b_more && n < 15; b_more++)
		eb[n++] = *b_more;
	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	start(b, tb, false, eb);
	b->port = port;
	start(a, ta, false, ea);
}

static void pair(struct hd *a, struct hd *b, const char *tag,
		 const char *a_key, const char *b_key)
{
	pair_with(a, b, tag, a_key, b_key, NULL);
}

static void create_flow(const struct hd *a, const struct hd *b,
			const char *name)
{
	char out[4096];

	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create %s "
		     "--peer %s:%d --ring-size 64K --max-record 1024",
		     name, b_addr(), b->port) == 0);
}

/* B registered no ring with an RDMA device (and has no peer up). */
static void no_registrations(const struct hd *b)
{
	char out[8192];

	CHECK(hd_ctl(b, moverctl_bin, out, sizeof(out), "status --json") == 0);
	CHECK(hj_u64(out, "registrations") == 0);
	CHECK(hj_u64(out, "registered_bytes") == 0);
}

static pid_t fc(const struct hd *d, const char *role, const char *flow,
		unsigned long count)
{
	char n[24];

	snprintf(n, sizeof(n), "%lu", count);
	return hx_spawn(d, 0, (const char *const[]){ flowcheck_bin, role, flow,
			!strcmp(role, "produce") ? "--id" : "--producers", "1",
			"--count", n, "--max-size", "1000", NULL });
}

static void fc_done(pid_t pid, const char *what, int timeout_ms)
{
	int rc = hx_wait(pid, timeout_ms);

	if (rc != 0) {
		fprintf(stderr, "%s: %s (%d)\n", what, rc < 0 ?
			"did not finish in time" : "failed", rc);
		exit(1);
	}
}

/* Peer 0 of d's status is authenticated as node with key id. */
static void check_identity(const struct hd *d, const char *side,
			   const char *id)
{
	char out[8192], node[128] = "", kid[64] = "", auth[16] = "", host[64];

	gethostname(host, sizeof(host));
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	hj_get(out, "node", node, sizeof(node));
	hj_get(out, "key_id", kid, sizeof(kid));
	hj_get(out, "authenticated", auth, sizeof(auth));
	printf("  %s's peer: node '%s', key id '%s', authenticated %s\n", side,
	       node, kid, auth);
	CHECK(!strcmp(auth, "true"));
	CHECK(!strcmp(kid, id));
	CHECK(!strcmp(node, host));
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status") == 0);
	CHECK(strstr(out, id));
}

/* ---- 1: the same key on both sides ------------------------------------------ */

static void case_same_key(void)
{
	char id[32], out[512], path2[PATH_MAX];
	const char *key = new_key("k1", id, sizeof(id));
	struct hd a, b;
	struct stat st;
	pid_t cons, prod;

	CHECK(stat(key, &st) == 0 && (st.st_mode & 0777) == 0600 &&
	      st.st_size == AUTH_KEY_BYTES);
	/* never overwritten, never written through a link */
	CHECK(ctl_local(out, sizeof(out), "keygen %s", key) != 0);
	snprintf(path2, sizeof(path2), "%s/link", keydir);
	CHECK(symlink("/nonexistent-target", path2) == 0);
	CHECK(ctl_local(out, sizeof(out), "keygen %s", path2) != 0);
	CHECK(access("/nonexistent-target", F_OK) != 0);
	unlink(path2);

	pair(&a, &b, "auth1", key, key);
	create_flow(&a, &b, "q");
	CHECK(hd_wait_state(&a, moverctl_bin, "q", "open", 10000, NULL, 0));
	cons = fc(&b, "consume", "q", 20000);
	prod = fc(&a, "produce", "q", 20000);
	fc_done(prod, "q's producer", 30000);
	fc_done(cons, "q's consumer", 10000);
	printf("  q: 20000 records, every one once\n");
	check_identity(&a, "A", id);
	check_identity(&b, "B", id);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 2, 3: keys that do not match --------------------------------------------- */

/* A's flow q to B is refused for authentication, B allocates nothing. */
static void refused_pair(const char *tag, const char *a_key, const char *b_key,
			 const char *b_needle)
{
	char reason[256] = "", st[8192];
	struct hd a, b;
	int base_b;

	pair(&a, &b, tag, a_key, b_key);
	base_b = hd_fds(&b);
	create_flow(&a, &b, "q");
	CHECK(wait_reason(&a, "q", "peer authentication failed", 10000, reason,
			  sizeof(reason)));
	printf("  A: flow q: %s\n", reason);
	wait_log(&b, b_needle, 1, 5000);
	show_log(&b, "B", b_needle);
	rdma_base(&b, &base_b);
	wait_log(&a, "peer authentication failed", 1, 5000);
	show_log(&a, "A", "peer authentication failed");
	sleep(1); /* a reconnect or two more */
	CHECK(hd_flow_json(&a, moverctl_bin, "q", reason, sizeof(reason)));
	CHECK(!strstr(reason, "\"open\""));
	/* A's status says it of the peer too */
	CHECK(hd_ctl(&a, moverctl_bin, st, sizeof(st), "--json status") == 0);
	CHECK(hj_get(st, "last_error", reason, sizeof(reason)));
	printf("  A: status: the peer's last error: %s\n", reason);
	CHECK(strstr(reason, "peer authentication failed"));
	no_flows(&b);
	no_registrations(&b);
	hd_alive(&b);
	CHECK(hd_ctl(&a, moverctl_bin, reason, sizeof(reason),
		     "flow destroy q") == 0);
	hd_wait_fds(&b, base_b);
	printf("  B: no flow, no registration, %d fds (as before)\n",
	       hd_fds(&b));
	hd_stop(&a);
	hd_stop(&b);
}

static void case_wrong_key(void)
{
	const char *k1 = new_key("k2a", NULL, 0), *k2 = new_key("k2b", NULL, 0);

	refused_pair("auth2", k1, k2, "authentication failed");
}

static void case_one_key(void)
{
	const char *k = new_key("k3", NULL, 0);

	printf("  (a) a key on the sender only\n");
	refused_pair("auth3a", k, NULL, "authentication failed");
	printf("  (b) a key on the receiver only\n");
	refused_pair("auth3b", NULL, k, "authentication failed");
}

/* ---- 4-6: hostile initiators --------------------------------------------------- */

static const struct hp_open h_open = { "h", 9, 1 << 16, 1024, 0xabcdef00ull,
				       0 };

/*
 * An honest initiator's handshake with key k on fd: hello with nonce_i,
 * the responder's hello (checked), our proof.  proof_i gets what we sent.
 */
static void honest_handshake(int fd, const struct auth_key *k,
			     const uint8_t nonce_i[AUTH_NONCE_BYTES],
			     uint8_t proof_i[AUTH_PROOF_BYTES])
{
	struct hp_hello_in in;

	CHECK(hp_hello_auth(fd, "tester", nonce_i, AUTH_NONCE_BYTES, k->id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(in.nonce_len == AUTH_NONCE_BYTES);
	CHECK(!strcmp(in.key_id, k->id));
	CHECK(!strcmp(in.dialed, hp_dialed(fd)));
	CHECK(auth_check(k, AUTH_RESPONDER, nonce_i, in.nonce, "tester",
			 in.node, in.dialed, in.proof, in.proof_len));
	auth_proof(k, AUTH_INITIATOR, nonce_i, in.nonce, "tester", in.node,
		   in.dialed, proof_i);
	CHECK(hp_auth(fd, proof_i, AUTH_PROOF_BYTES));
}

/* After a refused handshake on fd: closed, no flow h, logged, fds back. */
static void refused_conn(const struct hd *b, int fd, int base_fds,
			 const char *needle, int logged_before)
{
	/* an OPEN too, which must not create anything */
	hp_open(fd, &h_open);
	CHECK(hp_closed_within(fd, 5000));
	close(fd);
	wait_log(b, needle, logged_before + 1, 5000);
	show_log(b, "B", needle);
	no_flows(b);
	hd_wait_fds(b, base_fds);
	hd_alive(b);
}

static void case_replay(void)
{
	uint8_t nonce_i[AUTH_NONCE_BYTES], proof_i[AUTH_PROOF_BYTES];
	const char *key = new_key("k4", NULL, 0);
	const char *eb[] = { "--peer-key", key, NULL };
	Flowmover__PeerFlowOpened *op = NULL;
	struct hp_hello_in in;
	struct auth_key k;
	struct hd b;
	int fd, base, logged;

	load_key(key, &k);
	start(&b, "auth4", true, eb);
	base = hd_fds(&b);
	/* the honest handshake an eavesdropper records; it opens a flow */
	auth_nonce(nonce_i);
	fd = hp_connect(b.port);
	honest_handshake(fd, &k, nonce_i, proof_i);
	CHECK(hp_open(fd, &h_open));
	CHECK(hp_wait_opened(fd, h_open.flow_id, 5000, &op) == 0);
	CHECK(op->error == 0);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	printf("  an honest handshake: flow h opened\n");
	close(fd);
	CHECK(hd_ctl(&b, moverctl_bin, NULL, 0, "flow destroy h") == 0);
	no_flows(&b);
	hd_wait_fds(&b, base);

	/* the same hello and proof again */
	logged = hd_log_count(&b, "authentication failed");
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	printf("  the responder's nonce is fresh: %s\n",
	       in.nonce_len == AUTH_NONCE_BYTES ? "yes" : "no nonce");
	CHECK(hp_auth(fd, proof_i, sizeof(proof_i)));
	refused_conn(&b, fd, base, "authentication failed", logged);
	auth_forget(&k);
	hd_stop(&b);
}

/* Read what the initiator sends until it closes: how many OPENs. */
static unsigned opens_until_closed(int fd, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	static uint8_t body[WIRE_MAX_CTRL];
	unsigned opens = 0;
	struct wire_hdr h;

	while (tu_now_ns() < until) {
		Flowmover__PeerMsg *m;
		int rc = hp_read_frame(fd, &h, body, sizeof(body), 100);

		if (rc < 0)
			return opens;
		if (rc == 0 || h.type != WIRE_CTRL || h.len > sizeof(body))
			continue;
		m = flowmover__peer_msg__unpack(NULL, h.len, body);
		if (m && m->body_case == FLOWMOVER__PEER_MSG__BODY_OPEN)
			opens++;
		if (m)
			flowmover__peer_msg__free_unpacked(m, NULL);
	}
	CHECK(!"the initiator did not close the connection");
	return opens;
}

/*
 * A hostile responder: A (with the key) connects to the test, which
 * answers with the right key id and a proof that is not one (another
 * key's, and A's own nonce reflected as the responder's).  A refuses,
 * sends no OPEN, and its flow says why.
 */
static void hostile_responder(const char *key)
{
	const char *ea[] = { "--transport", "tcp", "--peer-key", key, NULL };
	uint8_t proof[AUTH_PROOF_BYTES];
	struct hp_hello_in in;
	struct auth_key k, other;
	char reason[256] = "", out[512];
	int lfd, port, fd;
	struct hd a;

	printf("  (c) a hostile responder with a wrong proof\n");
	load_key(key, &k);
	load_key(new_key("k5-other", NULL, 0), &other);
	lfd = hp_listen(&port);
	start(&a, "auth5-A", false, ea);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create q "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1024",
		     port) == 0);
	fd = hp_accept(lfd, 5000);
	CHECK(fd >= 0);
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(in.nonce_len == AUTH_NONCE_BYTES && !in.proof_len);
	CHECK(in.dialed[0]); /* the address A dialed, which it must prove */
	auth_proof(&other, AUTH_RESPONDER, in.nonce, in.nonce, in.node,
		   "hostile", in.dialed, proof);
	CHECK(hp_hello_proof(fd, "hostile", in.nonce, in.nonce_len, k.id,
			     proof, sizeof(proof), in.dialed));
	CHECK(opens_until_closed(fd, 5000) == 0);
	close(fd);
	CHECK(wait_reason(&a, "q", "peer authentication failed", 5000, reason,
			  sizeof(reason)));
	printf("  A: flow q: %s\n", reason);
	close(lfd);
	hd_stop(&a);
	auth_forget(&k);
	auth_forget(&other);
}

static void case_reflect(void)
{
	const char *key = new_key("k5", NULL, 0);
	const char *eb[] = { "--peer-key", key, NULL };
	uint8_t nonce_i[AUTH_NONCE_BYTES];
	struct hp_hello_in in;
	struct auth_key k;
	struct hd b;
	int fd, base, logged;

	load_key(key, &k);
	start(&b, "auth5", true, eb);
	base = hd_fds(&b);
	logged = hd_log_count(&b, "authentication failed");
	auth_nonce(nonce_i);
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(in.proof_len == AUTH_PROOF_BYTES);
	CHECK(hp_auth(fd, in.proof, in.proof_len)); /* its own, back */
	refused_conn(&b, fd, base, "authentication failed", logged);

	/* a proof of the wrong length */
	logged = hd_log_count(&b, "authentication failed");
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(hp_auth(fd, in.proof, 16));
	refused_conn(&b, fd, base, "authentication failed", logged);
	auth_forget(&k);
	hd_stop(&b);
	hostile_responder(key);
}

static void case_open_before_auth(void)
{
	const char *key = new_key("k6", NULL, 0);
	const char *eb[] = { "--peer-key", key, "--peer-hello-timeout", "1",
			     NULL };
	uint8_t nonce_i[AUTH_NONCE_BYTES];
	struct hp_hello_in in;
	struct auth_key k;
	struct hd b;
	int fd, base, logged;

	load_key(key, &k);
	start(&b, "auth6", true, eb);
	base = hd_fds(&b);
	auth_nonce(nonce_i);

	printf("  (a) hello, OPEN at once\n");
	logged = hd_log_count(&b, "before authentication");
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	refused_conn(&b, fd, base, "before authentication", logged);

	printf("  (b) hello, the responder's hello read, OPEN without proof\n");
	logged = hd_log_count(&b, "before authentication");
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	refused_conn(&b, fd, base, "before authentication", logged);

	printf("  (c) a second hello instead of the proof\n");
	logged = hd_log_count(&b, "authentication failed");
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	refused_conn(&b, fd, base, "authentication failed", logged);

	printf("  (d) hello, then no proof: the hello deadline (1 s)\n");
	logged = hd_log_count(&b, "no hello within");
	fd = hp_connect(b.port);
	CHECK(hp_hello_auth(fd, "tester", nonce_i, sizeof(nonce_i), k.id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(hp_closed_within(fd, 5000));
	close(fd);
	wait_log(&b, "no hello within", logged + 1, 5000);
	show_log(&b, "B", "no hello within");
	no_flows(&b);
	hd_wait_fds(&b, base);
	auth_forget(&k);
	hd_stop(&b);
}

/* ---- 7: --peer-allow ----------------------------------------------------------- */

/* 11: two daemons over FM_AUTH_TRANSPORT, A outside B's --peer-allow. */
static void case_peer_allow_pair(void)
{
	/* TEST-NET: neither 127.0.0.1 nor the guest's 10.77.0.1 */
	const char *more[] = { "--peer-allow", "192.0.2.0/24,2001:db8::/32",
			       NULL };
	char reason[256] = "";
	struct hd a, b;
	int base_b;

	printf("  over %s\n", transport());
	pair_with(&a, &b, "auth7c", NULL, NULL, more);
	base_b = hd_fds(&b);
	create_flow(&a, &b, "q");
	wait_log(&b, "not in --peer-allow", 1, 10000);
	show_log(&b, "B", "not in --peer-allow");
	rdma_base(&b, &base_b);
	sleep(2); /* A retries meanwhile */
	CHECK(hd_flow_json(&a, moverctl_bin, "q", reason, sizeof(reason)));
	CHECK(!strstr(reason, "\"open\""));
	CHECK(hd_log_count(&b, "connected over") == 0);
	no_flows(&b);
	no_registrations(&b);
	CHECK(hd_ctl(&a, moverctl_bin, reason, sizeof(reason),
		     "flow destroy q") == 0);
	hd_wait_fds(&b, base_b);
	hd_stop(&a);
	hd_stop(&b);
}

static void case_peer_allow(void)
{
	const char *deny[] = { "--peer-allow", "10.0.0.0/8,fd00::/8", NULL };
	const char *allow[] = { "--peer-allow", "10.0.0.0/8,127.0.0.0/8",
				NULL };
	Flowmover__PeerFlowOpened *op = NULL;
	struct hd b;
	int fd, base;

	start(&b, "auth7a", true, deny);
	base = hd_fds(&b);
	for (int i = 0; i < 20; i++) {
		fd = hp_connect(b.port);
		hp_hello(fd, "outsider");
		CHECK(hp_closed_within(fd, 5000));
		close(fd);
	}
	wait_log(&b, "--peer-allow", 1, 5000);
	show_log(&b, "B", "--peer-allow");
	no_flows(&b);
	hd_wait_fds(&b, base);
	CHECK(hd_log_count(&b, "connected over") == 0);
	printf("  20 connections from 127.0.0.1 closed at accept; %d fds\n",
	       hd_fds(&b));
	hd_stop(&b);

	start(&b, "auth7b", true, allow);
	fd = hp_connect(b.port);
	CHECK(hp_hello(fd, "insider"));
	CHECK(hp_open(fd, &h_open));
	CHECK(hp_wait_opened(fd, h_open.flow_id, 5000, &op) == 0);
	CHECK(op->error == 0);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	printf("  with 127.0.0.0/8 allowed: flow h opened\n");
	close(fd);
	hd_stop(&b);
}

/* ---- 8, 9: start-up ----------------------------------------------------------- */

/*
 * moverd ARGS... must exit non-zero within 10 s, and its stderr must
 * contain needle.  ARGS: NULL-terminated, after --foreground --socket.
 */
static void refuses_to_start(const char *tag, const char *const *args,
			     const char *needle)
{
	const char *argv[32] = { moverd_bin, "--foreground", "--socket" };
	char dir[96], sock[128], log[128], line[1024];
	bool found = false;
	int n = 3, rc;
	pid_t pid;
	FILE *f;

	snprintf(dir, sizeof(dir), "/tmp/fm-%s-%d", tag, (int)getpid());
	snprintf(sock, sizeof(sock), "%s/moverd.sock", dir);
	snprintf(log, sizeof(log), "%s/moverd.log", dir);
	mkdir(dir, 0755);
	argv[n++] = sock;
	for (; *args && n < 31; args++)
		argv[n++] = *args;
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0)
			dup2(fd, 2);
		execv(moverd_bin, (char **)argv);
		_exit(127);
	}
	rc = hx_wait(pid, 10000);
	f = fopen(log, "re");
	CHECK(f);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle)) {
			printf("  refused: %s", line);
			found = true;
		}
	fclose(f);
	if (rc <= 0 || !found) {
		fprintf(stderr, "moverd %s (exit %d); want '%s' in %s\n",
			rc == 0 ? "started" : rc < 0 ? "kept running" : "exited",
			rc, needle, log);
		exit(1);
	}
	snprintf(line, sizeof(line), "rm -rf '%s'", dir);
	CHECK(system(line) == 0);
}

static void case_key_files(void)
{
	const char *key = new_key("k8", NULL, 0);
	char link[PATH_MAX], bad[PATH_MAX];

	CHECK(chmod(key, 0644) == 0);
	refuses_to_start("auth8a", (const char *const[]){ "--peer-key", key,
			 NULL }, "mode 0644");
	CHECK(chmod(key, 0640) == 0);
	refuses_to_start("auth8b", (const char *const[]){ "--peer-key", key,
			 NULL }, "mode 0640");
	CHECK(chmod(key, 0600) == 0);
	snprintf(link, sizeof(link), "%s/k8-link", keydir);
	CHECK(symlink(key, link) == 0);
	refuses_to_start("auth8c", (const char *const[]){ "--peer-key", link,
			 NULL }, "symbolic link");
	snprintf(bad, sizeof(bad), "%s/k8-short", keydir);
	write_file(bad, "short", 0600);
	refuses_to_start("auth8d", (const char *const[]){ "--peer-key", bad,
			 NULL }, "holds 5 bytes");
	refuses_to_start("auth8e", (const char *const[]){ "--peer-allow",
			 "10.0.0.0/33", NULL }, "--peer-allow");
	refuses_to_start("auth8f", (const char *const[]){ "--peer-allow",
			 "10.0.0.0/8,nonsense", NULL }, "--peer-allow");
}

static void case_insecure_listen(void)
{
	char laddr[64];
	const char *ok[] = { "--listen", laddr, "--transport", "tcp",
			     "--insecure-peers", NULL };
	struct hd b;

	snprintf(laddr, sizeof(laddr), "0.0.0.0:%d", hd_free_port());
	refuses_to_start("auth9a", (const char *const[]){ "--listen", laddr,
			 NULL }, "--insecure-peers");
	start(&b, "auth9b", false, ok);
	show_log(&b, "moverd --insecure-peers", "insecure");
	CHECK(hd_log_count(&b, "insecure") >= 1);
	hd_stop(&b);
	/* loopback needs no key (the README demo, the tests) */
	start(&b, "auth9c", true, NULL);
	CHECK(hd_log_count(&b, "insecure") == 0);
	hd_stop(&b);
}

/* ---- 10: the cost ------------------------------------------------------------- */

/* moverd's time on a cpu so far, in ns (/proc/PID/schedstat: finer than
 * the clock ticks of /proc/PID/stat). */
static uint64_t cpu_ns(const struct hd *d)
{
	char path[64];
	unsigned long long ns = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)d->pid);
	f = fopen(path, "re");
	CHECK(f);
	CHECK(fscanf(f, "%llu", &ns) == 1);
	fclose(f);
	return ns;
}

/* n handshakes (with key k, or none) each followed by an OPEN; the mean
 * connect->opened time in us, and moverd's cpu ticks in *ticks. */
static double handshakes(const struct hd *b, const struct auth_key *k,
			 unsigned n, uint64_t *cpu)
{
	uint64_t t0 = cpu_ns(b);
	uint64_t total = 0;

	for (unsigned i = 0; i < n; i++) {
		uint8_t nonce_i[AUTH_NONCE_BYTES], proof_i[AUTH_PROOF_BYTES];
		struct hp_open o = h_open;
		Flowmover__PeerFlowOpened *op = NULL;
		uint64_t s = tu_now_ns();
		int fd = hp_connect(b->port);

		auth_nonce(nonce_i);
		if (k) {
			honest_handshake(fd, k, nonce_i, proof_i);
		} else {
			struct hp_hello_in in;

			CHECK(hp_hello(fd, "tester"));
			CHECK(hp_read_hello(fd, 5000, &in) == 0);
		}
		o.name = "cost";
		CHECK(hp_open(fd, &o));
		CHECK(hp_wait_opened(fd, o.flow_id, 5000, &op) == 0);
		total += tu_now_ns() - s;
		CHECK(op->error == 0);
		flowmover__peer_flow_opened__free_unpacked(op, NULL);
		close(fd);
	}
	*cpu = cpu_ns(b) - t0;
	return (double)total / n / 1000.0;
}

static void case_cost(void)
{
	const char *key = new_key("k10", NULL, 0);
	const char *eb[] = { "--peer-key", key, NULL };
	unsigned n = (unsigned)tu_env_long("FM_AUTH_HANDSHAKES", 200);
	uint64_t t_key, t_none;
	double us_key, us_none;
	struct auth_key k;
	struct hd b;

	load_key(key, &k);
	start(&b, "auth10a", true, eb);
	us_key = handshakes(&b, &k, n, &t_key);
	hd_stop(&b);
	start(&b, "auth10b", true, NULL);
	us_none = handshakes(&b, NULL, n, &t_none);
	hd_stop(&b);
	printf("  %u handshakes with a key: connect->opened %.0f us on "
	       "average, moverd cpu %.1f us each\n", n, us_key,
	       (double)t_key / 1e3 / n);
	printf("  %u without a key:          connect->opened %.0f us on "
	       "average, moverd cpu %.1f us each\n", n, us_none,
	       (double)t_none / 1e3 / n);
	printf("  (each includes an OPEN and its ring; the difference is the "
	       "proofs' round trip and MACs)\n");
	auth_forget(&k);
}

/* ---- 12: the quotas count what a peer proved, not the name it says ------- */

/* A key holder's handshake as node on fd (honest: it holds the key). */
static void handshake_as(int fd, const struct auth_key *k, const char *node)
{
	uint8_t nonce_i[AUTH_NONCE_BYTES], proof[AUTH_PROOF_BYTES];
	struct hp_hello_in in;

	auth_nonce(nonce_i);
	CHECK(hp_hello_auth(fd, node, nonce_i, AUTH_NONCE_BYTES, k->id));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(auth_check(k, AUTH_RESPONDER, nonce_i, in.nonce, node, in.node,
			 in.dialed, in.proof, in.proof_len));
	auth_proof(k, AUTH_INITIATOR, nonce_i, in.nonce, node, in.node,
		   in.dialed, proof);
	CHECK(hp_auth(fd, proof, AUTH_PROOF_BYTES));
}

/* Open flow name (id) on fd; the answer's error, its message in msg. */
static int open_as(int fd, const char *name, uint32_t id, char *msg,
		   size_t cap)
{
	const struct hp_open o = { name, id, 1 << 16, 1024, 0x12340000ull, 0 };

	return hp_open_answer(fd, &o, msg, cap);
}

/* As node from src, open name: the error (the connection is closed). */
static int open_from(const struct hd *b, const struct auth_key *k,
		     const char *src, const char *node, const char *name)
{
	char msg[256];
	int fd = hp_connect_from(b->port, src);
	int err;

	handshake_as(fd, k, node);
	err = open_as(fd, name, 1, msg, sizeof(msg));
	printf("  %s as %s opens %s: %d %s\n", src, node, name, err, msg);
	close(fd);
	return err;
}

static void case_quota_names(void)
{
	const char *key = new_key("k12", NULL, 0);
	const char *eb[] = { "--peer-key", key, "--peer-max-flows", "3", NULL };
	unsigned opened = 0, refused = 0;
	char name[32], node[32], msg[256];
	struct auth_key k;
	struct hd b;

	load_key(key, &k);
	start(&b, "auth12", true, eb);
	/* node0..node3, three opens each: three in all, not three a name */
	for (int n = 0; n < 4; n++) {
		int fd = hp_connect(b.port);

		snprintf(node, sizeof(node), "node%d", n);
		handshake_as(fd, &k, node);
		for (int i = 0; i < 3; i++) {
			int err;

			snprintf(name, sizeof(name), "q%d-%d", n, i);
			err = open_as(fd, name, (uint32_t)i + 1, msg,
				      sizeof(msg));
			if (!err) {
				opened++;
				continue;
			}
			refused++;
			CHECK(err == -EDQUOT && strstr(msg, "--peer-max-flows"));
		}
		printf("  after %s: %u opened, %u refused (%s)\n", node,
		       opened, refused, msg);
		close(fd);
	}
	CHECK(opened == 3 && refused == 9);

	/* restarted, the three are re-adopted and still count; node0 still
	 * resumes its own, another name may not take it */
	hd_term(&b);
	hd_restart(&b, moverd_bin, eb);
	CHECK(open_from(&b, &k, "127.0.0.1", "node0", "q0-0") == 0);
	CHECK(open_from(&b, &k, "127.0.0.1", "node1", "q0-1") == -EEXIST);
	CHECK(open_from(&b, &k, "127.0.0.1", "node7", "q7-0") == -EDQUOT);
	/* another host holding the same key: a quota of its own */
	CHECK(open_from(&b, &k, "127.0.0.2", "other", "r0") == 0);
	CHECK(open_from(&b, &k, "127.0.0.2", "other", "r1") == 0);
	hd_alive(&b);
	hd_stop(&b);
	auth_forget(&k);
}

/* ---- 13: a relay between two key holders ------------------------------------ */

/* Copy what comes on either fd to the other until one side closes. */
static void splice_pair(int x, int y)
{
	struct pollfd pf[2] = { { x, POLLIN, 0 }, { y, POLLIN, 0 } };
	char buf[65536];

	for (;;) {
		if (poll(pf, 2, -1) < 0)
			return;
		for (int i = 0; i < 2; i++) {
			ssize_t n;

			if (!pf[i].revents)
				continue;
			n = read(pf[i].fd, buf, sizeof(buf));
			if (n <= 0 || !hp_send_all(pf[1 - i].fd, buf, (size_t)n))
				return;
		}
	}
}

/*
 * A relay (a child process): each connection to lfd is forwarded, both
 * ways, to 127.0.0.1:to_port, one at a time; it holds no key.  It is what
 * any local user on the sender's host could run, having made its moverd
 * dial it (`flow create --peer`).
 */
static pid_t start_relay(int lfd, int to_port)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid) {
		close(lfd);
		return pid;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	for (;;) {
		int in = accept4(lfd, NULL, NULL, SOCK_CLOEXEC), out;

		if (in < 0)
			_exit(1);
		out = hp_connect(to_port);
		splice_pair(in, out);
		close(in);
		close(out);
	}
}

static void stop_relay(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/*
 * A dials a relay instead of B (both hold the key; the relay does not).
 * Before the handshake bound the address A dialed, the relay passed the
 * three messages on, and B took the connection as A's: the relay could
 * then OPEN flows as A.  Now (a) B refuses (A dialed another address than
 * the connection reached), A's flow says why, B has no flow; (b) the same
 * relay named by B's --peer-reachable-at (NAT, port forwarding) is let
 * through, and a checked flow goes through it.
 */
static void case_relay(void)
{
	const char *key = new_key("k13", NULL, 0);
	char reason[256] = "", out[4096], reach[64];
	int lfd, port, base;
	struct hd a, b;
	pid_t relay, cons, prod;

	printf("  (a) a relay B does not know\n");
	lfd = hp_listen(&port);
	snprintf(reach, sizeof(reach), "127.0.0.1:%d", port);
	pair(&a, &b, "auth13a", key, key);
	base = hd_fds(&b);
	relay = start_relay(lfd, b.port);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create q "
		     "--peer %s --ring-size 64K --max-record 1024", reach) == 0);
	CHECK(wait_reason(&a, "q", "a relay", 10000, reason, sizeof(reason)));
	printf("  A: flow q: %s\n", reason);
	CHECK(strstr(reason, reach));
	wait_log(&b, "a relay", 1, 5000);
	show_log(&b, "B", "a relay");
	no_flows(&b);
	stop_relay(relay);
	hd_wait_fds(&b, base);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);

	printf("  (b) the same relay, named by B's --peer-reachable-at\n");
	lfd = hp_listen(&port);
	snprintf(reach, sizeof(reach), "127.0.0.1:%d", port);
	pair_with(&a, &b, "auth13b", key, key,
		  (const char *const[]){ "--peer-reachable-at", reach, NULL });
	relay = start_relay(lfd, b.port);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create q "
		     "--peer %s --ring-size 64K --max-record 1024", reach) == 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "q", "open", 10000, NULL, 0));
	cons = fc(&b, "consume", "q", 5000);
	prod = fc(&a, "produce", "q", 5000);
	fc_done(prod, "q's producer", 30000);
	fc_done(cons, "q's consumer", 10000);
	printf("  q: 5000 records through the forwarder, every one once\n");
	stop_relay(relay);
	hd_stop(&a);
	hd_stop(&b);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_same_key, "the same key on both sides: a checked "
		  "flow, identities in status" },
		{ 2, case_wrong_key, "a wrong key: refused on both sides" },
		{ 3, case_one_key, "a key on one side only: refused" },
		{ 4, case_replay, "a replayed hello and proof: refused" },
		{ 5, case_reflect, "the responder's proof reflected (and one "
		  "of the wrong length): refused" },
		{ 6, case_open_before_auth, "OPEN before the proof, a second "
		  "hello: refused, no flow" },
		{ 7, case_peer_allow, "--peer-allow: closed at accept" },
		{ 8, case_key_files, "key files others can read, links, bad "
		  "--peer-allow: moverd refuses to start" },
		{ 9, case_insecure_listen, "--listen off loopback without a "
		  "key: refused unless --insecure-peers" },
		{ 10, case_cost, "the handshake's cost" },
		{ 11, case_peer_allow_pair, "a moverd outside --peer-allow "
		  "(over FM_AUTH_TRANSPORT): refused before anything is "
		  "allocated" },
		{ 12, case_quota_names, "one key, several node names: one "
		  "peer host's quota" },
		{ 13, case_relay, "a relay between two key holders: refused; "
		  "let through when B names it (--peer-reachable-at)" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	main_pid = getpid();
	atexit(remove_keys);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	CHECK(auth_init() == 0);
	snprintf(keydir, sizeof(keydir), "/tmp/fm-auth-keys-%d", (int)getpid());
	CHECK(mkdir(keydir, 0700) == 0);
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_AUTH_CASES");
}
