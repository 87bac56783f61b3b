/*
 * tests/test_hostile.c - hostile peers and hostile clients against a real
 * moverd (issue 14).  Each case is one finding of the adversarial review;
 * FM_HOSTILE_CASES=1,3 runs only those, FM_HOSTILE_VARIANTS=a,c only those
 * variants of a case that has several (1a-1c, 3a-3b).
 *
 *   usage: test_hostile MOVERD MOVERCTL FLOWCHECK
 *
 * Every case passes only if the other party's flow delivers every record
 * exactly once (flowcheck), moverd survives and exits 0 on SIGTERM (no
 * sanitizer report) and its fd count is back where it was.
 *
 *   1  a flow freed under a receive in flight: a peer stuck mid-body in a
 *      receiver flow while (a) a second connection re-opens and closes it,
 *      (b) root destroys it, (c) a second connection re-opens it and goes
 *      away, then root destroys it; the next ring of that size is another
 *      user's local flow, and the rest of the body must not land there;
 *      (d) a bounded, seeded fuzzer of the same receive path: OPEN,
 *      re-OPEN, CLOSE, whole and half-sent DATA, disconnects and destroys
 *      interleaved on two connections (FM_HOSTILE_FUZZ_ITERS, _SEED)
 *   2  an attach response parked in io_uring (its client reads nothing)
 *      while the client destroys its flow and root creates another: the fd
 *      the client finally gets must be its own ring, never root's
 *   3  bad ring words: (a) a consumer on the receiving host stores head
 *      beyond what was published, or moves it backwards; (b) a producer on
 *      the sending host pins tail at 0 while the peer is down.  Only that
 *      flow fails; the link stays up and another flow on it completes
 *   6  a sender flow whose remote window is closed: moverd sleeps
 *   7  a peer that floods OPENs and reads nothing: dropped, moverd's cpu
 *      and memory bounded meanwhile, a local flow unaffected
 *   8  a producer of uid 65534 clears the rung bits, summaries and
 *      `sleeping` flag of its doorbell page as fast as it can: that page
 *      is its uid's own (another inode than root's), and root's sparse
 *      records, 20 ms apart, still end moverd's sleeps by the doorbell;
 *      (a) the kernel's doorbell, (b) --doorbell thread; (c, d) the
 *      same two: 70 uids' producers attach one after another, each gets
 *      a page that is freed when it leaves; then all at once: 62 pages of
 *      their own, the last 8 share one more (never another uid's own;
 *      status and the counters file say so); pages freed by the leavers
 *      are taken again; at the end moverd's fds are back where they were
 *   9  a client pipelines a status behind an attach that waits for its
 *      flow, then a describe once both are answered: each answer carries
 *      its own request's id (moverd served the status while a read was in
 *      flight into the bytes after it; the describe read into the moved
 *      buffer was parsed as a stale copy before the fix)
 *  10  a producer holds a claim (reserve, no commit) on a flow to a peer:
 *      moverd sleeps meanwhile (it woke every 2 ms with a membarrier
 *      each before), and the record goes once committed
 *  11  a consumer on the receiving host moves its ring's `published` ten
 *      records forward while (a) its moverd or (b) the sender's is down,
 *      or (c) both are: the resume is refused (a: by A, which knows what
 *      it sent; b: by B, which knows what it published; c: by B, whose
 *      records from the consumers' position do not end there) and the flow
 *      fails with the reason; before, A skipped ten records it had never
 *      sent
 *  12  a peer opens a flow at a start near 2^64: refused past 2^63
 *  13  a receiver flow failed here (its consumer lied) whose sender's
 *      connection goes before the sender closes it, and comes back at
 *      once: the flow stays failed, the sender is refused with the reason
 *      (also when its open says it cut this host: such an open made the
 *      failed flow anew), another peer only hears that the flow is not
 *      its own, and the flow goes after --orphan-timeout
 *  14  a peer moverd dialed (no --peer-key) opens flows over that
 *      connection: refused; moverd's own flow on it goes on
 *  15  an ACK with a body, for a flow not on the connection: the link
 *      fails (its body was read as the next frames)
 *  16  a fan-out peer just added answers a resume beyond the producers'
 *      tail: its subscription ends, the flow goes on to the first peer
 *  17  (a) a consumer on B moves published, the floor and its slot four
 *      rings ahead while B is down: B fails that flow, the link and q go
 *      on (A failed the link at every reopen); (b) a peer answers such a
 *      resume: A fails the flow, not the connection
 *  18  a committed pad of 2 MiB (more than a flow's deficit earns): the
 *      record behind it goes (moverd spun on it, and it never came), and
 *      the pad crosses as pads of a quantum (it went as one frame)
 *  19  a co-client shrinks the ring file again and again under a send
 *      waiting for the window: that flow fails, the link goes on (the
 *      fifth fault failed it)
 *  20  a client's attach waits; it pipelines more than moverd's buffer
 *      behind it and hangs up: moverd sees it go (no read was armed)
 *  21  64 silent peer connections to B: B's status still lists A's (it
 *      carries a flow; it was pushed out) and counts those not listed
 *  22  a peer fails the link with an acknowledgement outside the window
 *      of uid 4000's flow: uid 65534, whose flow shares the link, sees
 *      the connection in `status` but not the reason that names the
 *      other's flow, nor in its own flow's reason; uid 4000 and root
 *      see it
 *  23  B restarted with 100 records unread in a receiver flow; its peer
 *      (A's address) opens it again and again at a start beyond what B
 *      published: each is refused "lost data", and B walks the records
 *      once in all, at the open that resumes (it walked them at every
 *      open, up to 2^20 headers on the loop each)
 *  24  a fan-out peer H (the test) says in its hello the instance of
 *      another peer, G (it asked G's own hello for it); then A adds G to
 *      the flow: G's subscription opens and G's consumer gets every
 *      record (A took G for H's twin and ended G's subscription: H
 *      decided whether G got the flow).  Then H2, which like H says no
 *      twin_tags (an older moverd) and G's instance, is added: A judges
 *      by the instance for such a peer, and ends H2's subscription alone
 *      as a twin (of G's or H's); G's goes on
 *  25  500 strangers connect and hang up before any hello: B's log holds
 *      a few lines of them a second (it held one each), and B serves on
 */
#include "harness.h"
#include "flowshm_internal.h"
#include "../ipc/bell.h"
#include "../ipc/fnv.h"

#include <sys/ioctl.h>

#define NOBODY 65534u
#define BELL_PAGES_TEST 64u /* moverd/peer.h, BELL_PAGES */
#define KIB 1024ull

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin;

/* Is variant v ("a", "b"...) of a case selected (FM_HOSTILE_VARIANTS)? */
static bool variant(const char *v)
{
	const char *s = getenv("FM_HOSTILE_VARIANTS");
	char buf[128], *tok, *save = NULL;

	if (!s || !*s)
		return true;
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (!strcmp(tok, v))
			return true;
	printf("  (variant %s skipped)\n", v);
	return false;
}

/* ---- checked producers and consumers (tests/flowcheck.c) ----------------- */

static pid_t fc_produce(const struct hd *d, uid_t uid, const char *flow,
			unsigned id, unsigned long count, unsigned max_size)
{
	char ids[16], n[24], max[16];

	snprintf(ids, sizeof(ids), "%u", id);
	snprintf(n, sizeof(n), "%lu", count);
	snprintf(max, sizeof(max), "%u", max_size);
	return hx_spawn(d, uid, (const char *const[]){ flowcheck_bin,
			"produce", flow, "--id", ids, "--count", n,
			"--max-size", max, NULL });
}

static pid_t fc_consume(const struct hd *d, uid_t uid, const char *flow,
			unsigned producers, unsigned long count,
			unsigned max_size)
{
	char ps[16], n[24], max[16];

	snprintf(ps, sizeof(ps), "%u", producers);
	snprintf(n, sizeof(n), "%lu", count);
	snprintf(max, sizeof(max), "%u", max_size);
	return hx_spawn(d, uid, (const char *const[]){ flowcheck_bin,
			"consume", flow, "--producers", ps, "--count", n,
			"--max-size", max, NULL });
}

/* The flowcheck process must exit 0 within timeout_ms. */
static void fc_done(pid_t pid, const char *what, int timeout_ms)
{
	int rc = hx_wait(pid, timeout_ms);

	if (rc != 0) {
		fprintf(stderr, "%s: %s\n", what, rc < 0 ?
			"did not finish in time (killed)" : "failed");
		if (rc > 0)
			fprintf(stderr, "%s: exit code %d\n", what, rc);
		exit(1);
	}
}

/* ---- moverctl views -------------------------------------------------------- */

static uint64_t flow_u64(const struct hd *d, const char *name,
			 const char *key)
{
	char out[4096];

	return hd_flow_json(d, moverctl_bin, name, out,
			    sizeof(out)) ? hj_u64(out, key) : 0;
}

/* Wait until flow NAME's `key` is at least min. */
static void wait_u64(const struct hd *d, const char *name, const char *key,
		     uint64_t min, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull, v;

	while ((v = flow_u64(d, name, key)) < min) {
		hd_alive(d);
		if (tu_now_ns() > until) {
			fprintf(stderr, "flow %s: %s = %llu, want >= %llu\n",
				name, key, (unsigned long long)v,
				(unsigned long long)min);
			exit(1);
		}
		usleep(50000);
	}
}

/* The reconnects of d's first peer (0 without peers). */
static uint64_t reconnects(const struct hd *d)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	return hj_u64(out, "reconnects");
}

/* Flow NAME must be failed on d, with a reason. */
static void expect_failed(const struct hd *d, const char *side,
			  const char *name)
{
	char reason[256] = "";

	if (!hd_wait_state(d, moverctl_bin, name, "failed", 5000, reason,
			   sizeof(reason))) {
		fprintf(stderr, "%s: flow %s is not failed (reason '%s')\n",
			side, name, reason);
		exit(1);
	}
	printf("  %s: %s failed: %s\n", side, name, reason);
	CHECK(reason[0]);
}

static void expect_not_failed(const struct hd *d, const char *side,
			      const char *name)
{
	char reason[256] = "";

	if (hd_wait_state(d, moverctl_bin, name, "failed", 1000, reason,
			  sizeof(reason))) {
		fprintf(stderr, "%s: flow %s failed ('%s')\n", side, name,
			reason);
		exit(1);
	}
	printf("  %s: %s not failed\n", side, name);
}

/* ---- case 1: a flow freed under a receive in flight ------------------------ */

#define X_RING (64u << 10)
#define Y_RECORDS 400
#define Y_MAX 1000

static const struct hp_open x_open = { "x", 1, X_RING, 1024, 0x5eedface00ull,
				       0 };
static uint8_t junk[8192];

/* Open x on a new connection (again while moverd answers -EAGAIN). */
static int peer_opens_x(const struct hd *d, const char *node)
{
	char msg[256] = "";
	int fd = hp_connect(d->port), err;

	CHECK(hp_hello(fd, node));
	err = hp_open_retry(fd, &x_open, 5000, msg, sizeof(msg));
	if (err) {
		fprintf(stderr, "%s: open x: error %d: %s\n", node, err, msg);
		exit(1);
	}
	return fd;
}

/*
 * Connection A opens x and sends a DATA header for [0, +8192) with only
 * the first 4096 bytes of its body: moverd's receive of the rest, into x's
 * ring, is now in flight.
 */
static int peer_stuck_mid_body(const struct hd *d)
{
	int a = peer_opens_x(d, "peer-a");

	memset(junk, 0xa5, sizeof(junk));
	CHECK(hp_send_hdr(a, WIRE_DATA, x_open.flow_id, 8192, 0, 0));
	CHECK(hp_send_all(a, junk, 4096));
	usleep(300000);
	hd_alive(d);
	return a;
}

/*
 * A local flow y of the second user with the ring size of x (so its ring
 * may be mapped where x's was), filled by a checked producer that now
 * waits for space: every record in it is one the consumer will check.
 */
static pid_t victim_fills_y(const struct hd *d)
{
	char out[4096];
	pid_t prod;

	CHECK(hd_ctl_as(d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow create y --ring-size 64K --max-record 1024") == 0);
	prod = fc_produce(d, NOBODY, "y", 1, Y_RECORDS, Y_MAX);
	wait_u64(d, "y", "tail", 48 * KIB, 10000);
	return prod;
}

/* A sends the rest of its body and one more DATA frame (if it still can). */
static void peer_sends_rest(const struct hd *d, int a)
{
	if (hp_send_all(a, junk + 4096, 4096) &&
	    hp_send_hdr(a, WIRE_DATA, x_open.flow_id, 4096, 8192, 0))
		hp_send_all(a, junk, 4096);
	usleep(500000);
	hd_alive(d);
}

/* y's consumer gets every record once and intact; then y goes. */
static void victim_checks_y(const struct hd *d, pid_t prod)
{
	char out[4096];
	pid_t cons = fc_consume(d, NOBODY, "y", 1, Y_RECORDS, Y_MAX);

	fc_done(cons, "y's consumer (uid 65534)", 20000);
	fc_done(prod, "y's producer (uid 65534)", 5000);
	hd_alive(d);
	CHECK(hd_ctl_as(d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow destroy y") == 0);
}

/* x must be gone (the close or destroy took it) within 5 s. */
static void wait_x_gone(const struct hd *d)
{
	char out[4096];

	for (int i = 0; i < 100 && hd_flow_json(d, moverctl_bin, "x", out,
						sizeof(out)); i++)
		usleep(50000);
	CHECK(!hd_flow_json(d, moverctl_bin, "x", out, sizeof(out)));
}

static void case1_end(struct hd *d, int a, int b, int base_fds)
{
	close(a);
	if (b >= 0)
		close(b);
	hd_alive(d);
	hd_wait_fds(d, base_fds);
	hd_stop(d);
}

/* 1a: connection B re-opens x (moving it off A), then closes it. */
static void case_moved_flow(void)
{
	struct hd d;
	int a, b, base;
	pid_t prod;

	if (!variant("a"))
		return;
	hd_start(&d, moverd_bin, "hostile1a", true, NULL);
	base = hd_fds(&d);
	a = peer_stuck_mid_body(&d);
	b = peer_opens_x(&d, "peer-b");
	CHECK(hp_close_flow(b, "x"));
	wait_x_gone(&d);
	prod = victim_fills_y(&d);
	peer_sends_rest(&d, a);
	victim_checks_y(&d, prod);
	case1_end(&d, a, b, base);
}

/* 1b: root destroys x while A's receive into it is in flight. */
static void case_destroyed_flow(void)
{
	char out[4096];
	struct hd d;
	int a, base;
	pid_t prod;

	if (!variant("b"))
		return;
	hd_start(&d, moverd_bin, "hostile1b", true, NULL);
	base = hd_fds(&d);
	a = peer_stuck_mid_body(&d);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy x") == 0);
	wait_x_gone(&d);
	prod = victim_fills_y(&d);
	peer_sends_rest(&d, a);
	victim_checks_y(&d, prod);
	case1_end(&d, a, -1, base);
}

/* 1c: B re-opens x and disconnects; then root destroys x. */
static void case_moved_then_destroyed(void)
{
	char out[4096];
	struct hd d;
	int a, b, base;
	pid_t prod;

	if (!variant("c"))
		return;
	hd_start(&d, moverd_bin, "hostile1c", true, NULL);
	base = hd_fds(&d);
	a = peer_stuck_mid_body(&d);
	b = peer_opens_x(&d, "peer-b");
	close(b);
	usleep(300000);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy x") == 0);
	wait_x_gone(&d);
	prod = victim_fills_y(&d);
	peer_sends_rest(&d, a);
	victim_checks_y(&d, prod);
	case1_end(&d, a, -1, base);
}

/*
 * 1d: a bounded fuzzer of the peer receive path: two connections, three
 * receiver flows with rings of y's size, and a seeded random interleaving
 * of OPEN, re-OPEN, CLOSE, whole and half-sent DATA bodies, the rest of a
 * body, disconnects and local destroys.  moverd may drop a connection for
 * anything it sends (it reconnects); it may not crash, leak an fd, or let
 * a body land in another flow's ring: y, created half way, is checked.
 */
#define FZ_CONNS 2
#define FZ_FLOWS 2

struct fz_conn {
	int fd;                     /* -1: not connected */
	uint32_t pending;           /* body bytes of a half-sent DATA */
	bool open[FZ_FLOWS];
	uint64_t pos[FZ_FLOWS];     /* where our next DATA of the flow goes */
};

static struct hp_open fz_flow(unsigned k)
{
	static char names[FZ_FLOWS][8];

	snprintf(names[k], sizeof(names[k]), "x%u", k);
	return (struct hp_open){ names[k], 10 + k, X_RING, 1024,
				 0x5eedface00ull + ((uint64_t)k << 12), 0 };
}

static void fz_drop(struct fz_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	*c = (struct fz_conn){ .fd = -1 };
}

/* Connected, and no half-sent body in the way (else send its rest). */
static bool fz_ready(const struct hd *d, struct fz_conn *c)
{
	if (c->fd < 0) {
		c->fd = hp_connect(d->port);
		if (!hp_hello(c->fd, "fuzz"))
			fz_drop(c);
		return c->fd >= 0;
	}
	if (c->pending) {
		if (!hp_send_all(c->fd, junk, c->pending)) {
			fz_drop(c);
			return false;
		}
		c->pending = 0;
	}
	return true;
}

static void fz_open(const struct hd *d, struct fz_conn *c, unsigned k)
{
	struct hp_open o = fz_flow(k);
	Flowmover__PeerFlowOpened *op = NULL;

	if (!fz_ready(d, c))
		return;
	if (!hp_open(c->fd, &o) || hp_wait_opened(c->fd, o.flow_id, 2000, &op)) {
		fz_drop(c);
		return;
	}
	c->open[k] = op->error == 0;
	c->pos[k] = op->resume;
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
}

/* A DATA frame of len bytes for flow k; only `part` of its body now. */
static void fz_data(const struct hd *d, struct fz_conn *c, unsigned k,
		    uint32_t len, uint32_t part)
{
	if (!fz_ready(d, c) || !c->open[k] || c->pos[k] + len > X_RING)
		return; /* (beyond the window moverd would drop us: boring) */
	if (!hp_send_hdr(c->fd, WIRE_DATA, fz_flow(k).flow_id, len, c->pos[k],
			 0) || !hp_send_all(c->fd, junk, part)) {
		fz_drop(c);
		return;
	}
	c->pos[k] += len;
	c->pending = len - part;
}

static void case_fuzz_receive(void)
{
	unsigned iters = (unsigned)tu_env_long("FM_HOSTILE_FUZZ_ITERS", 1500);
	uint64_t seed = (uint64_t)tu_env_long("FM_HOSTILE_FUZZ_SEED", 14), x;
	struct fz_conn conn[FZ_CONNS];
	char out[4096];
	struct hd d;
	unsigned n[12] = { 0 };
	pid_t prod = -1;
	int base;

	if (!variant("d"))
		return;
	printf("  %u steps, seed %llu (FM_HOSTILE_FUZZ_ITERS, _SEED)\n", iters,
	       (unsigned long long)seed);
	memset(junk, 0xa5, sizeof(junk));
	for (unsigned i = 0; i < FZ_CONNS; i++)
		conn[i] = (struct fz_conn){ .fd = -1 };
	hd_start(&d, moverd_bin, "hostile1d", true, NULL);
	base = hd_fds(&d);
	x = seed;
	for (unsigned step = 0; step < iters; step++) {
		struct fz_conn *c = &conn[(x = tu_mix(x)) % FZ_CONNS];
		unsigned k = (unsigned)((x >> 8) % FZ_FLOWS);
		uint32_t len = (uint32_t)(((x >> 16) % 512) + 1) * FR_ALIGN;

		unsigned act = (unsigned)((x >> 32) % 12);

		if (step == iters / 2)
			prod = victim_fills_y(&d);
		/* a half-sent body stays so until its rest is sent or the
		 * connection goes: meanwhile the other connection acts */
		if (c->pending && act < 7)
			continue;
		n[act]++;
		switch (act) {
		case 0: case 1: case 2:
			fz_open(&d, c, k);
			break;
		case 3:
			fz_data(&d, c, k, len, len);
			break;
		case 4: case 5:
			fz_data(&d, c, k, len, (uint32_t)((x >> 40) % len));
			break;
		case 6:
			if (fz_ready(&d, c) && !hp_close_flow(c->fd, fz_flow(k).name))
				fz_drop(c);
			c->open[k] = false;
			break;
		case 7:
			fz_drop(c);
			break;
		case 8: case 9:
			hd_ctl(&d, moverctl_bin, out, sizeof(out),
			       "flow destroy %s", fz_flow(k).name);
			break;
		default:
			fz_ready(&d, c); /* the rest of a half-sent body */
			usleep(2000);
		}
		hd_alive(&d);
	}
	printf("  opens %u, data %u, half bodies %u, closes %u, drops %u, "
	       "destroys %u, rests %u\n", n[0] + n[1] + n[2], n[3],
	       n[4] + n[5], n[6], n[7], n[8] + n[9], n[10] + n[11]);
	for (unsigned i = 0; i < FZ_CONNS; i++)
		fz_ready(&d, &conn[i]); /* every body's rest: late writes */
	usleep(300000);
	for (unsigned i = 0; i < FZ_CONNS; i++)
		fz_drop(&conn[i]);
	hd_alive(&d);
	if (prod > 0)
		victim_checks_y(&d, prod);
	for (unsigned k = 0; k < FZ_FLOWS; k++)
		hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy %s",
		       fz_flow(k).name);
	hd_wait_fds(&d, base);
	hd_stop(&d);
}

/* ---- case 2: a ring fd number handed out after it was closed --------------- */

#define A_RING (64u << 10)
#define V_RING (256u << 10)

/* A control connection whose SO_PEERCRED says uid (root: 0). */
static int connect_as(const struct hd *d, uid_t uid)
{
	int fd;

	CHECK(setegid(uid) == 0 && seteuid(uid) == 0);
	fd = ctl_connect(d->sock);
	CHECK(seteuid(0) == 0 && setegid(0) == 0);
	CHECK(fd >= 0);
	return fd;
}

/* Frames: n describes of `name` (ids 1..n), then an attach (id n + 1). */
static size_t pipeline(uint8_t *buf, size_t cap, const char *name, unsigned n)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DescribeFlow ds = FLOWMOVER__DESCRIBE_FLOW__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	size_t off = 0, len;

	ds.name = (char *)name;
	at.name = (char *)name;
	at.role = FLOWMOVER__ROLE__PRODUCER;
	for (unsigned i = 1; i <= n + 1; i++) {
		req.id = i;
		if (i <= n) {
			req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
			req.describe = &ds;
		} else {
			req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
			req.attach = &at;
		}
		CHECK(ctl_frame_pack(&req.base, buf + off, cap - off, &len) == 0);
		off += len;
	}
	return off;
}

/* Bytes waiting in sock once they stop growing (at least min of them). */
static int inq_settled(int sock, int min, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int n = 0, last = -1, same = 0;

	while (tu_now_ns() < until) {
		CHECK(ioctl(sock, FIONREAD, &n) == 0);
		same = n == last && n >= min ? same + 1 : 0;
		if (same == 6)
			break;
		last = n;
		usleep(50000);
	}
	return n;
}

/* The ring size in the geometry of the ring behind fd (0: not a ring). */
static uint64_t ring_size_of(int fd)
{
	struct fr_geometry g;

	if (pread(fd, &g, sizeof(g), 0) != (ssize_t)sizeof(g) ||
	    g.magic != FR_MAGIC)
		return 0;
	return g.ring_bytes;
}

/*
 * How many describe responses moverd writes before the socket's send
 * buffer is full (its client reading nothing), and their frame size.
 */
static unsigned responses_that_fit(const struct hd *d, int *frame)
{
	static uint8_t buf[CTL_FRAME_BUF * 2];
	size_t len;
	int c = connect_as(d, NOBODY), avail, fd;
	unsigned k;

	CHECK(hc_create(c, "a9999", A_RING, 1024) == 0);
	len = pipeline(buf, sizeof(buf), "a9999", 3000);
	CHECK(send(c, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
	avail = inq_settled(c, 1, 5000);
	CHECK(ctl_recv_frame(c, buf, sizeof(buf), &len, &fd, 2000) == 0);
	CHECK(fd < 0);
	*frame = (int)(CTL_HDR_BYTES + len);
	k = (unsigned)(avail / *frame);
	close(c);
	c = connect_as(d, 0);
	CHECK(hc_destroy(c, "a9999") == 0);
	close(c);
	return k;
}

struct depth_result {
	bool parked;      /* the attach response went out after the destroy */
	bool got_fd;
	bool wrong;       /* ... and its fd was not the client's own ring */
	uint64_t ring;    /* the ring size behind the fd it got */
};

/*
 * The attack at one pipeline depth: NOBODY creates flow a, pipelines n
 * describes and an attach of it and reads nothing; root destroys a and
 * creates v (its ring may take a's fd number); then NOBODY reads.
 */
static struct depth_result try_depth(const struct hd *d, unsigned n,
				     unsigned fit, int frame, int base_fds)
{
	static uint8_t buf[CTL_FRAME_BUF * 2];
	struct depth_result res = { 0 };
	char a[16], v[16];
	size_t len, off = 0;
	struct stat vst, st;
	int c, r, vfd = -1, avail;

	snprintf(a, sizeof(a), "a%04u", n);
	snprintf(v, sizeof(v), "v%04u", n);
	hd_wait_fds(d, base_fds); /* no hole below a's fd number */
	c = connect_as(d, NOBODY);
	CHECK(hc_create(c, a, A_RING, 1024) == 0);
	r = connect_as(d, 0);
	len = pipeline(buf, sizeof(buf), a, n);
	CHECK(send(c, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
	avail = inq_settled(c, (int)(n < fit ? n : fit) * frame, 5000);

	CHECK(hc_destroy(r, a) == 0);
	CHECK(hc_create(r, v, V_RING, 1024) == 0);
	CHECK(hc_attach(r, v, FLOWMOVER__ROLE__PRODUCER, &vfd) == 0);
	CHECK(vfd >= 0);
	CHECK(fstat(vfd, &vst) == 0);

	for (;;) {
		Flowmover__Response *resp = NULL;
		char err[256];
		int fd = -1;

		CHECK(ctl_recv_frame(c, buf, sizeof(buf), &len, &fd, 5000) == 0);
		off += CTL_HDR_BYTES + len;
		CHECK(ctl_response_decode(buf, len, &resp, err, sizeof(err)) == 0);
		if (fd >= 0) {
			res.got_fd = true;
			res.parked = off > (size_t)avail;
			res.ring = ring_size_of(fd);
			CHECK(fstat(fd, &st) == 0);
			res.wrong = st.st_ino == vst.st_ino || res.ring != A_RING;
			if (res.wrong)
				fprintf(stderr, "depth %u: the attach of %s got "
					"fd of inode %lu (ring %llu bytes); "
					"root's flow %s has inode %lu\n", n, a,
					(unsigned long)st.st_ino,
					(unsigned long long)res.ring, v,
					(unsigned long)vst.st_ino);
			close(fd);
		}
		if (resp->id == n + 1) {
			/* the attach ran before the destroy: it must carry
			 * the ring; after it, it fails (no such flow) */
			CHECK(res.got_fd ||
			      resp->body_case == FLOWMOVER__RESPONSE__BODY_ERROR);
			ctl_response_free(resp);
			break;
		}
		ctl_response_free(resp);
	}
	close(vfd);
	close(c);
	CHECK(hc_destroy(r, v) == 0);
	close(r);
	return res;
}

static void case_parked_fd(void)
{
	struct hd d;
	int base, frame, wrong = 0, parked = 0;
	unsigned fit;

	hd_start(&d, moverd_bin, "hostile2", false, NULL);
	base = hd_fds(&d);
	fit = responses_that_fit(&d, &frame);
	printf("  %u responses of %d bytes fill the socket\n", fit, frame);
	CHECK(fit > 8);
	for (unsigned n = fit - 6; n <= fit + 6; n++) {
		struct depth_result r = try_depth(&d, n, fit, frame, base);

		hd_alive(&d);
		if (r.parked && r.got_fd)
			printf("  depth %u: attach response parked; its fd: "
			       "ring of %llu bytes%s\n", n,
			       (unsigned long long)r.ring,
			       r.wrong ? " (NOT the client's own)" : "");
		parked += r.parked && r.got_fd;
		wrong += r.wrong;
	}
	CHECK(wrong == 0);
	CHECK(parked > 0); /* the attack happened at some depth */
	hd_wait_fds(&d, base);
	hd_stop(&d);
}

/* ---- case 3: bad ring words fail only their own flow ----------------------- */

#define P_RING "64K"
#define Q_RECORDS 20000
#define REC_MAX 1000

/* A (sender, no listen) and B (receiver); flows NAMES from A to B. */
/* Daemons A and B, and flows `names` from A to B; A with --doorbell
 * doorbell unless it is NULL. */
static void two_daemons_bell(struct hd *a, struct hd *b, const char *tag,
			     const char *const *names, const char *doorbell)
{
	const char *const opts[] = { "--transport", "tcp", doorbell ?
				     "--doorbell" : NULL, doorbell, NULL };
	char ta[32], tb[32], out[4096];

	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	hd_start(b, moverd_bin, tb, true, NULL);
	hd_start(a, moverd_bin, ta, false, opts);
	for (; *names; names++) {
		CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create "
			     "%s --peer 127.0.0.1:%d --ring-size " P_RING
			     " --max-record 1024", *names, b->port) == 0);
		CHECK(hd_wait_state(a, moverctl_bin, *names, "open", 10000,
				    NULL, 0));
	}
}

static void two_daemons(struct hd *a, struct hd *b, const char *tag,
			const char *const *names)
{
	two_daemons_bell(a, b, tag, names, NULL);
}

/* Attach to flow on d as the test process itself (a hostile client). */
static flowshm_t *attach_raw(const struct hd *d, const char *flow,
			     enum flowshm_role role)
{
	flowshm_t *f = NULL;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	if (flowshm_attach(flow, role, NULL, &f)) {
		fprintf(stderr, "attach %s: %s\n", flow, flowshm_attach_error());
		exit(1);
	}
	return f;
}

/* The deposit ring's `published` once it stops moving (at least min). */
static uint64_t published_settled(flowshm_t *f, uint64_t min)
{
	uint64_t last = UINT64_MAX, pub = 0;
	int same = 0;

	for (int i = 0; i < 200 && same < 6; i++) {
		/* acquire: moverd's release store of `published` */
		pub = atomic_load_explicit(&f->ring.sh->published,
					   memory_order_acquire);
		same = pub == last && pub >= min ? same + 1 : 0;
		last = pub;
		usleep(50000);
	}
	CHECK(pub >= min);
	return pub;
}

/* q: a checked producer on A and consumer on B, every record once. */
static void q_completes(const struct hd *a, const struct hd *b)
{
	pid_t cons = fc_consume(b, 0, "q", 1, Q_RECORDS, REC_MAX);
	pid_t prod = fc_produce(a, 0, "q", 1, Q_RECORDS, REC_MAX);

	fc_done(prod, "q's producer", 25000);
	fc_done(cons, "q's consumer", 5000);
}

/* A consumer of flow on b stores head beyond what moverd published. */
static flowshm_t *head_beyond(const struct hd *b, const char *flow)
{
	flowshm_t *f = attach_raw(b, flow, FLOWSHM_CONSUMER);
	uint64_t pub = published_settled(f, 32 * KIB);

	/* release: what a consumer does when it hands space back (its
	 * subscriber slot's position, ring format 2) */
	atomic_store_explicit(&f->ring.sh->subs[f->ring.sub].pos, pub + 4096,
			      memory_order_release);
	printf("  %s: published %llu, consumer head stored %llu\n", flow,
	       (unsigned long long)pub, (unsigned long long)pub + 4096);
	return f;
}

/*
 * A consumer of flow on b consumes a quarter ring honestly (moverd reports
 * it to the sender, which sends more), then moves head backwards.
 */
static flowshm_t *head_backwards(const struct hd *b, const char *flow)
{
	flowshm_t *f = attach_raw(b, flow, FLOWSHM_CONSUMER);
	uint64_t pub = published_settled(f, 32 * KIB), head;

	do {
		static uint8_t rec[4096];
		size_t len;

		CHECK_RC(flowshm_recv(f, rec, sizeof(rec), &len, 1000000000), 0);
		head = f->ring.head;
	} while (head < 20 * KIB);
	fr_sub_publish(&f->ring); /* as the lazy head would, sooner */
	published_settled(f, pub + 4096); /* the sender got the credit */
	atomic_store_explicit(&f->ring.sh->subs[f->ring.sub].pos, head - 4096,
			      memory_order_release);
	printf("  %s: consumer head %llu stored back to %llu\n", flow,
	       (unsigned long long)head, (unsigned long long)head - 4096);
	return f;
}

/* 3a: consumers on B lie about head: beyond `published`, and backwards. */
static void case_lying_consumer(void)
{
	static const char *const names[] = { "p", "r", "q", NULL };
	struct hd a, b;
	flowshm_t *fp, *fr;
	pid_t pp, pr;
	int base_a, base_b;

	if (!variant("a"))
		return;
	two_daemons(&a, &b, "hostile3a", names);
	base_a = hd_fds(&a);
	base_b = hd_fds(&b);
	pp = fc_produce(&a, 0, "p", 1, 100000, REC_MAX);
	pr = fc_produce(&a, 0, "r", 1, 100000, REC_MAX);

	fp = head_beyond(&b, "p");
	fr = head_backwards(&b, "r");

	sleep(1);
	hd_alive(&a);
	hd_alive(&b);
	printf("  A's peer: %llu reconnects\n",
	       (unsigned long long)reconnects(&a));
	expect_failed(&b, "B", "p");
	expect_failed(&a, "A", "p");
	/* ring format 2: a subscriber position below what producers relied
	 * on is also what a joining subscriber shows for an instant, so
	 * moverd ignores it (never goes below what it reported) rather than
	 * failing the flow: r stays open and is unharmed */
	expect_not_failed(&b, "B", "r");
	expect_not_failed(&a, "A", "r");
	CHECK(reconnects(&a) == 0);
	q_completes(&a, &b);
	printf("  q: every record once\n");
	CHECK(reconnects(&a) == 0);

	flowshm_detach(fp);
	flowshm_detach(fr);
	kill(pp, SIGKILL);
	kill(pr, SIGKILL);
	hx_wait(pp, 5000);
	hx_wait(pr, 5000);
	hd_wait_fds(&a, base_a);
	hd_wait_fds(&b, base_b);
	hd_stop(&a);
	hd_stop(&b);
}

/* 3b: while B is down, a producer on A pins p's tail at 0. */
static void case_lying_producer(void)
{
	static const char *const names[] = { "p", "q", NULL };
	struct hd a, b;
	flowshm_t *fp;
	uint64_t r0, r1;
	pid_t prod, qp, qc;
	int base_a;

	if (!variant("b"))
		return;
	two_daemons(&a, &b, "hostile3b", names);
	base_a = hd_fds(&a);
	prod = fc_produce(&a, 0, "p", 1, 30, REC_MAX);
	fc_done(prod, "p's producer", 10000);
	/* q's producer fills both rings and waits for a consumer */
	qp = fc_produce(&a, 0, "q", 1, Q_RECORDS, REC_MAX);
	wait_u64(&a, "p", "head", flow_u64(&a, "p", "tail"), 10000);
	wait_u64(&b, "q", "tail", 48 * KIB, 10000);

	hd_kill(&b);
	fp = attach_raw(&a, "p", FLOWSHM_PRODUCER);
	/* release: as a producer's claim would publish it */
	atomic_store_explicit(&fp->ring.sh->tail, 0, memory_order_release);
	printf("  p: tail stored 0 (acknowledged %llu) while B is down\n",
	       (unsigned long long)flow_u64(&a, "p", "head"));
	hd_restart(&b, moverd_bin, NULL);

	qc = fc_consume(&b, 0, "q", 1, Q_RECORDS, REC_MAX);
	fc_done(qp, "q's producer", 25000);
	fc_done(qc, "q's consumer", 5000);
	printf("  q: every record once\n");
	expect_failed(&a, "A", "p");
	r0 = reconnects(&a);
	sleep(5);
	r1 = reconnects(&a);
	printf("  A's peer: %llu reconnects, %llu five seconds later\n",
	       (unsigned long long)r0, (unsigned long long)r1);
	CHECK(r1 == r0);

	flowshm_detach(fp);
	hd_wait_fds(&a, base_a);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 6: a closed remote window must not spin the mover ---------------- */

/* flowcheck's record sizes (tests/flowcheck.c: flow_salt, rec_size). */
static size_t fc_rec_size(const char *flow, uint32_t id, uint64_t seq,
			  size_t max, uint32_t max_record)
{
	uint32_t wire_id = (fnv1a32_str(0, flow) & ~0xffu) | id;

	if ((tu_mix(((uint64_t)wire_id << 32) ^ seq ^ 0xb16) & 63) == 0)
		max *= 4;
	if (max > max_record)
		max = max_record;
	return tu_rec_len(wire_id, seq, sizeof(struct tu_rec_hdr), max);
}

/* How many records of producer 1 take about `bytes` of ring. */
static unsigned records_for(const char *flow, uint64_t bytes)
{
	uint64_t used = 0;
	unsigned n = 0;

	while (used < bytes)
		used += fr_record_bytes(fc_rec_size(flow, 1, n++, REC_MAX, 1024));
	return n;
}

static void case_closed_window(void)
{
	static const char *const names[] = { "p", NULL };
	struct hd a, b;
	unsigned n = records_for("p", 96 * KIB); /* B's 64K ring and more */
	pid_t p1, p2, cons;
	double idle, blocked;
	int base_a, base_b;

	two_daemons(&a, &b, "hostile6", names);
	base_a = hd_fds(&a);
	base_b = hd_fds(&b);
	/* producer 1 fills B's ring (no consumer) and part of A's, exits */
	p1 = fc_produce(&a, 0, "p", 1, n, REC_MAX);
	fc_done(p1, "p's producer 1", 10000);
	wait_u64(&b, "p", "tail", 56 * KIB, 10000);
	sleep(1);
	idle = hd_cpu_share(&a, 3000);
	printf("  A's cpu with p's window closed, producer gone: %.2f\n", idle);
	/* producer 2 waits for space in A's full ring */
	p2 = fc_produce(&a, 0, "p", 2, n, REC_MAX);
	sleep(1);
	blocked = hd_cpu_share(&a, 3000);
	printf("  ... with a producer waiting for space: %.2f\n", blocked);
	CHECK(idle < 0.2);
	CHECK(blocked < 0.2);

	cons = fc_consume(&b, 0, "p", 2, n, REC_MAX);
	fc_done(p2, "p's producer 2", 20000);
	fc_done(cons, "p's consumer", 5000);
	hd_wait_fds(&a, base_a);
	hd_wait_fds(&b, base_b);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 7: a peer that does not read --------------------------------------- */

#define FLOOD_OPENS 200000
#define L_RECORDS 200000

/* The child: OPENs of an existing local flow as fast as it can, then
 * heartbeats (a live peer), never reading; ends when moverd drops it. */
static void flood(int fd, const char *name)
{
	enum { BATCH = 1000 };
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowOpen op = FLOWMOVER__PEER_FLOW_OPEN__INIT;
	static uint8_t buf[BATCH * 128];
	size_t body, off = 0;

	op.name = (char *)name;
	op.ring_size = 64 * KIB;
	op.max_record = 1024;
	op.seal_key = 0x77770000ull;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_OPEN;
	msg.open = &op;
	for (unsigned i = 0; i < BATCH; i++) {
		op.flow_id = 1000 + i;
		body = protobuf_c_message_get_packed_size(&msg.base);
		CHECK(off + WIRE_HDR + body <= sizeof(buf));
		wire_put(buf + off, WIRE_CTRL, 0, (uint32_t)body, 0, 0);
		protobuf_c_message_pack(&msg.base, buf + off + WIRE_HDR);
		off += WIRE_HDR + body;
	}
	for (unsigned i = 0; i < FLOOD_OPENS / BATCH; i++)
		if (!hp_send_all(fd, buf, off))
			_exit(0);
	while (hp_send_hdr(fd, WIRE_HEARTBEAT, 0, 0, 0, 0))
		usleep(500000);
	_exit(0);
}

/* Is there a peer at addr in d's status? */
static bool has_peer(const struct hd *d, const char *addr)
{
	static char out[1 << 16];
	char pat[96];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	snprintf(pat, sizeof(pat), "\"%s\"", addr);
	return strstr(out, pat) != NULL;
}

/* Connect a flooder to b (a 4 KiB receive buffer: moverd's replies back
 * up at once), say hello, fork it; its address ("127.0.0.1:PORT"). */
static pid_t flooder_start(const struct hd *b, char *addr, size_t cap)
{
	struct sockaddr_in to = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)b->port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct sockaddr_in me;
	socklen_t len = sizeof(me);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), small = 4096;
	pid_t child;

	CHECK(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	CHECK(connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0);
	CHECK(getsockname(fd, (struct sockaddr *)&me, &len) == 0);
	snprintf(addr, cap, "127.0.0.1:%d", ntohs(me.sin_port));
	CHECK(hp_hello(fd, "flooder"));
	fflush(NULL);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		flood(fd, "l7");
	}
	close(fd);
	return child;
}

/* Under AddressSanitizer freed memory waits in a quarantine (256 MiB by
 * default) that would count as growth: keep it small. */
static void small_asan_quarantine(void)
{
	const char *asan = getenv("ASAN_OPTIONS");
	char opts[512];

	if (asan && strstr(asan, "quarantine_size_mb"))
		return;
	snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=16",
		 asan ? asan : "", asan && *asan ? ":" : "");
	setenv("ASAN_OPTIONS", opts, 1);
}

static void case_non_reading_peer(void)
{
	char out[4096], addr[64];
	struct hd b;
	int base, dropped_ms = -1;
	long rss0, rss_max = 0;
	pid_t child, lp, lc;
	uint64_t t0;
	double cpu;

	small_asan_quarantine();
	hd_start(&b, moverd_bin, "hostile7", true, NULL);
	CHECK(hd_ctl(&b, moverctl_bin, out, sizeof(out), "flow create l7 "
		     "--ring-size 256K --max-record 1024") == 0);
	base = hd_fds(&b);
	rss0 = hd_rss_kb(&b);
	lc = fc_consume(&b, 0, "l7", 1, L_RECORDS, 256);
	lp = fc_produce(&b, 0, "l7", 1, L_RECORDS, 256);
	child = flooder_start(&b, addr, sizeof(addr));
	t0 = tu_now_ns();

	sleep(3);
	hd_alive(&b);
	cpu = hd_cpu_share(&b, 5000);
	printf("  B's cpu during the flood: %.2f\n", cpu);
	while (tu_now_ns() - t0 < 30000000000ull) {
		long rss = hd_rss_kb(&b);

		hd_alive(&b);
		rss_max = rss > rss_max ? rss : rss_max;
		if (!has_peer(&b, addr)) {
			dropped_ms = (int)((tu_now_ns() - t0) / 1000000);
			break;
		}
		usleep(500000);
	}
	printf("  B's rss grew by %ld KiB; the peer %s\n", rss_max - rss0,
	       dropped_ms < 0 ? "was never dropped" : "was dropped");
	if (dropped_ms >= 0)
		printf("  dropped after %d ms\n", dropped_ms);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	CHECK(dropped_ms >= 0);
	CHECK(hd_log_count(&b, "does not read") >= 1);
	CHECK(cpu < 0.5);
	CHECK(rss_max - rss0 < 64 * 1024);

	fc_done(lp, "l7's producer", 20000);
	fc_done(lc, "l7's consumer", 5000);
	hd_wait_fds(&b, base);
	hd_stop(&b);
}

/* ---- case 0: the harness itself -------------------------------------------- */

/* a hostile peer opens a flow and gets it */
/* ---- case 8: a client's doorbell page is its uid's own ----------------- */

#define BELL_RECORDS 40

/* The inode of this process's mapping of a doorbell page (0: none). */
static unsigned long bell_inode(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long ino = 0;
	char line[512];

	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, "flowmover-bell") &&
		    sscanf(line, "%*s %*s %*s %*s %lu", &ino) == 1)
			break;
	if (f)
		fclose(f);
	return ino;
}

/* BELL_RECORDS records of 64 bytes, 20 ms apart, numbered from 0. */
static void send_sparse(flowshm_t *f)
{
	uint64_t rec[8] = { 0 };

	for (uint64_t i = 0; i < BELL_RECORDS; i++) {
		rec[0] = i;
		CHECK(flowshm_send(f, rec, sizeof(rec), 1000000000) == 0);
		usleep(20000);
	}
}

/* ... received by f, in order. */
static void recv_sparse(flowshm_t *f)
{
	uint64_t rec[8];

	for (uint64_t i = 0; i < BELL_RECORDS; i++) {
		size_t len = 0;

		CHECK(flowshm_recv(f, rec, sizeof(rec), &len,
				   5000000000ll) == 0);
		CHECK(len == sizeof(rec) && rec[0] == i);
	}
}

/*
 * A producer of flow on d as uid NOBODY: it writes its page's inode to
 * fd, then sends BELL_RECORDS sparse records (ms 0), or for ms clears
 * every summary word, the first bits words and `sleeping` of its page as
 * fast as it can, which with one page for all would lose other users'
 * producers' wake-ups to the sweep (1 s).
 */
static pid_t bell_child(const struct hd *d, const char *flow, int fd, int ms)
{
	struct fr_bell *b;
	unsigned long ino;
	uint64_t end;
	flowshm_t *f;
	pid_t pid = hx_fork_as(d, NOBODY);

	if (pid)
		return pid;
	if (flowshm_attach(flow, FLOWSHM_PRODUCER, NULL, &f) || !f->ring.bell)
		_exit(3);
	b = f->ring.bell;
	ino = bell_inode();
	if (write(fd, &ino, sizeof(ino)) != sizeof(ino))
		_exit(4);
	if (!ms) {
		send_sparse(f);
		_exit(0);
	}
	end = tu_now_ns() + (uint64_t)ms * 1000000;
	while (tu_now_ns() < end) {
		for (unsigned w = 0; w < FB_SUMMARY; w++)
			atomic_store_explicit(&b->summary[w], 0,
					      memory_order_relaxed);
		for (unsigned w = 0; w < 64; w++)
			atomic_store_explicit(&b->bits[w], 0,
					      memory_order_relaxed);
		atomic_store_explicit(&b->sleeping, 0, memory_order_relaxed);
	}
	_exit(0);
}

/* Start bell_child; its page's inode. */
static unsigned long bell_child_ino(const struct hd *d, const char *flow,
				    int ms, pid_t *kid)
{
	unsigned long ino = 0;
	int pfd[2];

	CHECK(pipe(pfd) == 0);
	*kid = bell_child(d, flow, pfd[1], ms);
	close(pfd[1]);
	CHECK(read(pfd[0], &ino, sizeof(ino)) == sizeof(ino));
	close(pfd[0]);
	return ino;
}

static void bell_child_done(pid_t kid)
{
	int st;

	CHECK(waitpid(kid, &st, 0) == kid && WIFEXITED(st) &&
	      WEXITSTATUS(st) == 0);
}

static uint64_t status_u64(const struct hd *d, const char *key)
{
	char out[16384];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	return hj_u64(out, key);
}

/*
 * Wait (ms at most) until d counts pages doorbell pages and shared
 * producers on the shared one: in `status` (counters false), or in the
 * counters file (`moverctl top`, /metrics; a pass every 100 ms writes it).
 */
static bool bells_are(const struct hd *d, bool counters, uint64_t pages,
		      uint64_t shared, uint64_t ms)
{
	uint64_t end = tu_now_ns() + ms * 1000000, p = 0, s = 0;

	while (tu_now_ns() < end) {
		char out[65536];

		CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), counters ?
			     "top --once --json" : "--json status") == 0);
		p = hj_u64(out, "bell_pages");
		s = hj_u64(out, counters ? "bell_shared" :
					   "bell_shared_producers");
		if (p == pages && s == shared)
			return true;
		usleep(20000);
	}
	printf("  doorbell pages (%s): %llu (%llu producers shared), want "
	       "%llu (%llu)\n", counters ? "counters file" : "status",
	       (unsigned long long)p, (unsigned long long)s,
	       (unsigned long long)pages, (unsigned long long)shared);
	return false;
}

static bool pages_are(const struct hd *d, uint64_t pages, uint64_t shared)
{
	return bells_are(d, false, pages, shared, 10000);
}

static void bell_pages(const char *doorbell)
{
	static const char *const names[] = { "p", NULL };
	unsigned long root_ino, other_ino, scribbler_ino;
	flowshm_t *prod, *prod2, *cons, *cons8;
	uint64_t rings0, rings1;
	char out[4096];
	struct hd a, b;
	pid_t kid;

	two_daemons_bell(&a, &b, doorbell ? "hostile8b" : "hostile8a", names,
			 doorbell);
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out), "flow "
			"create n8 --peer 127.0.0.1:%d --ring-size 64K "
			"--max-record 1024", b.port) == 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "n8", "open", 10000, NULL, 0));
	prod = attach_raw(&a, "p", FLOWSHM_PRODUCER);
	CHECK(prod->ring.bell);
	root_ino = bell_inode();
	/* a second producer of root's: the same page */
	prod2 = attach_raw(&a, "p", FLOWSHM_PRODUCER);
	CHECK(prod2->ring.bell && bell_inode() == root_ino);
	cons = attach_raw(&b, "p", FLOWSHM_CONSUMER);
	cons8 = attach_raw(&b, "n8", FLOWSHM_CONSUMER);
	sleep(1); /* moverd A asleep, its wait armed on root's page only */

	/* uid 65534's first producer: a page of its own, made while the
	 * mover sleeps; its sparse records end the mover's sleeps (the wait
	 * was renewed to take its word). As test_remote case 10: a few may
	 * be picked up by a cycle awake for another reason, hence half. */
	rings0 = status_u64(&a, "doorbell_rings");
	other_ino = bell_child_ino(&a, "n8", 0, &kid);
	recv_sparse(cons8);
	bell_child_done(kid);
	rings1 = status_u64(&a, "doorbell_rings");
	printf("  doorbell pages: root's inode %lu, uid %u's %lu\n",
	       root_ino, NOBODY, other_ino);
	printf("  n8 (uid %u): %d records 20 ms apart, in order; %llu sleeps "
	       "ended by the doorbell\n", NOBODY, BELL_RECORDS,
	       (unsigned long long)(rings1 - rings0));
	CHECK(root_ino && other_ino && other_ino != root_ino);
	CHECK(rings1 - rings0 >= BELL_RECORDS / 2);
	/* its producer gone, its page is freed (case 8c) */
	CHECK(pages_are(&a, 1, 0));

	/* root's sparse records while uid 65534 scribbles its own page */
	scribbler_ino = bell_child_ino(&a, "n8", 4000, &kid);
	CHECK(scribbler_ino != root_ino);
	rings0 = status_u64(&a, "doorbell_rings");
	send_sparse(prod);
	recv_sparse(cons);
	rings1 = status_u64(&a, "doorbell_rings");
	printf("  p (root), uid %u scribbling: %d records 20 ms apart, in "
	       "order; %llu sleeps ended by the doorbell\n", NOBODY,
	       BELL_RECORDS, (unsigned long long)(rings1 - rings0));
	CHECK(rings1 - rings0 >= BELL_RECORDS / 2);
	bell_child_done(kid);

	flowshm_detach(prod);
	flowshm_detach(prod2);
	flowshm_detach(cons);
	flowshm_detach(cons8);
	hd_alive(&a);
	hd_stop(&a);
	hd_stop(&b);
}

/* 8a: the doorbell the kernel offers (io_uring's FUTEX_WAITV on 6.7+) */
static void case_bell_pages(void)
{
	if (variant("a"))
		bell_pages(NULL);
}

/* 8b: the helper thread's futex_waitv (kernels before 6.7) */
static void case_bell_pages_thread(void)
{
	if (variant("b"))
		bell_pages("thread");
}

/* ---- case 8c/8d: a page lives while its uid has producers --------------- */

#define LIFE_UIDS 70u     /* more uids than pages (BELL_PAGES, 64) */
#define LIFE_UID0 20000u
#define LIFE_FLOWS 5u     /* 16 uids may attach to each (FLOW_ALLOW_MAX) */

/* A producer of flow as uid, attached until killed: its page's inode. */
static pid_t bell_holder(const struct hd *d, uid_t uid, const char *flow,
			 unsigned long *ino)
{
	int up[2];
	flowshm_t *f;
	pid_t pid;

	CHECK(pipe(up) == 0);
	pid = hx_fork_as(d, uid);
	if (!pid) {
		unsigned long i;

		close(up[0]);
		if (flowshm_attach(flow, FLOWSHM_PRODUCER, NULL, &f) ||
		    !f->ring.bell)
			_exit(3);
		i = bell_inode();
		if (write(up[1], &i, sizeof(i)) != sizeof(i))
			_exit(4);
		pause();
		_exit(0);
	}
	close(up[1]);
	*ino = 0;
	CHECK(read(up[0], ino, sizeof(*ino)) == sizeof(*ino) && *ino);
	close(up[0]);
	return pid;
}

static void holder_end(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &st, 0) == pid);
}

static void life_flows(struct hd *a, const struct hd *b)
{
	for (unsigned k = 0; k < LIFE_FLOWS; k++) {
		char cmd[1024], out[4096], name[16];
		int n;

		snprintf(name, sizeof(name), "u%u", k);
		n = snprintf(cmd, sizeof(cmd), "flow create %s --peer "
			     "127.0.0.1:%d --ring-size 64K --max-record 1024",
			     name, b->port);
		for (unsigned i = 0; i < 16; i++)
			n += snprintf(cmd + n, sizeof(cmd) - (size_t)n,
				      " --allow-uid %u", LIFE_UID0 + k * 16 + i);
		CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "%s", cmd) == 0);
		CHECK(hd_wait_state(a, moverctl_bin, name, "open", 10000, NULL,
				    0));
	}
}

static const char *life_flow(unsigned i)
{
	static char name[16];

	snprintf(name, sizeof(name), "u%u", i / 16);
	return name;
}

static void bell_life(const char *doorbell)
{
	static const char *const names[] = { NULL };
	unsigned long ino[LIFE_UIDS];
	pid_t kid[LIFE_UIDS];
	unsigned own = BELL_PAGES_TEST - 2; /* root's and the shared one */
	struct hd a, b;
	int fds;

	two_daemons_bell(&a, &b, doorbell ? "hostile8d" : "hostile8c", names,
			 doorbell);
	life_flows(&a, &b);
	CHECK(pages_are(&a, 1, 0));
	fds = hd_fds(&a);

	/* one uid after another: each its own page, freed when it leaves,
	 * however many uids came before */
	for (unsigned i = 0; i < LIFE_UIDS; i++) {
		kid[i] = bell_holder(&a, LIFE_UID0 + i, life_flow(i), &ino[i]);
		CHECK(pages_are(&a, 2, 0));
		holder_end(kid[i]);
		CHECK(pages_are(&a, 1, 0));
	}
	printf("  %u uids one after another: a page each, freed as it left\n",
	       LIFE_UIDS);

	/* all at once: 62 own pages, and the last 8 share one more */
	for (unsigned i = 0; i < LIFE_UIDS; i++)
		kid[i] = bell_holder(&a, LIFE_UID0 + i, life_flow(i), &ino[i]);
	CHECK(pages_are(&a, BELL_PAGES_TEST, LIFE_UIDS - own));
	CHECK(bells_are(&a, true, BELL_PAGES_TEST, LIFE_UIDS - own, 5000));
	for (unsigned i = 0; i < LIFE_UIDS; i++)
		for (unsigned j = 0; j < i; j++)
			CHECK((ino[i] == ino[j]) == (i >= own && j >= own));
	printf("  %u uids at once: %u pages of their own, %u producers on "
	       "the shared page (inode %lu)\n", LIFE_UIDS, own,
	       LIFE_UIDS - own, ino[LIFE_UIDS - 1]);

	/* one of the sharers leaves: the page stays for the others; then
	 * an owner leaves, and a new uid gets the page it freed */
	holder_end(kid[LIFE_UIDS - 1]);
	CHECK(pages_are(&a, BELL_PAGES_TEST, LIFE_UIDS - own - 1));
	holder_end(kid[0]);
	CHECK(pages_are(&a, BELL_PAGES_TEST - 1, LIFE_UIDS - own - 1));
	kid[0] = bell_holder(&a, LIFE_UID0 + LIFE_UIDS - 1,
			     life_flow(LIFE_UIDS - 1), &ino[0]);
	CHECK(pages_are(&a, BELL_PAGES_TEST, LIFE_UIDS - own - 1));
	for (unsigned j = 1; j < LIFE_UIDS - 1; j++)
		CHECK(ino[0] != ino[j]);
	for (unsigned i = 0; i < LIFE_UIDS - 1; i++)
		holder_end(kid[i]);
	CHECK(pages_are(&a, 1, 0));

	/* a flow destroyed under its producer: the producer's page goes
	 * with the attachment, while the producer's process lives on */
	kid[0] = bell_holder(&a, LIFE_UID0, life_flow(0), &ino[0]);
	CHECK(pages_are(&a, 2, 0));
	CHECK(hd_ctl(&a, moverctl_bin, NULL, 0, "flow destroy %s",
		     life_flow(0)) == 0);
	CHECK(pages_are(&a, 1, 0));
	holder_end(kid[0]);
	printf("  flow %s destroyed under uid %u's producer: its page freed\n",
	       life_flow(0), LIFE_UID0);
	/* every page's fd and every copy handed out is closed */
	CHECK(hd_wait_fds_pid(a.pid, fds, 5000));
	printf("  all gone: root's page alone, moverd's fds at %d as before\n",
	       fds);
	hd_alive(&a);
	hd_stop(&a);
	hd_stop(&b);
}

/* 8c: the doorbell the kernel offers */
static void case_bell_life(void)
{
	if (variant("c"))
		bell_life(NULL);
}

/* 8d: the doorbell thread */
static void case_bell_life_thread(void)
{
	if (variant("d"))
		bell_life("thread");
}

static void case_smoke(void)
{
	struct hd d;
	struct hp_open o = { "smoke", 7, 1 << 16, 1024, 0x1234567800ull, 0 };
	Flowmover__PeerFlowOpened *op = NULL;
	char out[4096];
	int fd;

	hd_start(&d, moverd_bin, "hostile0", true, NULL);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "smoke-peer"));
	CHECK(hp_open(fd, &o));
	CHECK(hp_wait_opened(fd, 7, 5000, &op) == 0);
	CHECK(op->error == 0);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow show smoke --json") == 0);
	CHECK(strstr(out, "receiver"));
	close(fd);
	hd_stop(&d);
}

/* ---- case 12: a start position near 2^64 -------------------------------- */

/* Open flow name at start: the receiver's answer (error), its message in
 * msg. */
static int open_at(int fd, const char *name, uint32_t id, uint64_t start,
		   char *msg, size_t cap)
{
	const struct hp_open o = { name, id, 1 << 16, 1024, 0x1234567800ull,
				   start };

	return hp_open_answer(fd, &o, msg, cap);
}

/*
 * A peer names a receiver flow's first position.  Near 2^64 its positions
 * wrap within the ring's first lap, and every comparison of them (head
 * against published, a DATA's position against the window) lies: refused
 * past 2^63, with the why; 2^63 itself is taken.
 */
static void case_start_near_wrap(void)
{
	char msg[512], out[4096];
	struct hd d;
	int fd;

	hd_start(&d, moverd_bin, "hostile12", true, NULL);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "wrap-peer"));
	CHECK_RC(open_at(fd, "w1", 1, UINT64_MAX - 4095, msg, sizeof(msg)),
		 -EINVAL);
	printf("  start 2^64 - 4096: %s\n", msg);
	CHECK(strstr(msg, "invalid start position"));
	CHECK_RC(open_at(fd, "w2", 2, (1ull << 63) + 16, msg, sizeof(msg)),
		 -EINVAL);
	CHECK_RC(open_at(fd, "w3", 3, 8, msg, sizeof(msg)), -EINVAL);
	CHECK(strstr(msg, "invalid start position"));
	CHECK_RC(open_at(fd, "w4", 4, 1ull << 63, msg, sizeof(msg)), 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list") == 0);
	CHECK(strstr(out, "w4") && !strstr(out, "w1") && !strstr(out, "w2"));
	close(fd);
	hd_stop(&d);
}

/* ---- case 13: a receiver failed here, its connection gone before the CLOSE */

/*
 * B fails a receiver flow (its consumer stored a position beyond what was
 * delivered) and tells its sender; the sender's connection goes before it
 * closes the flow, and it comes back at once.  The flow stays failed: the
 * sender is refused with B's reason.  Before, the connection's end put it
 * back to "reconnecting" and the reopen was answered "opened" on a failed
 * ring (the checks of exposed rings found it failed again up to 2 s
 * later; one no client was handed was never checked).
 */
static void case_failed_then_cut(void)
{
	static const struct hp_open o = { "f13", 1, 1 << 16, 1024,
					  0x1313131300ull, 0 };
	static const char *const opts[] = { "--orphan-timeout", "5", NULL };
	Flowmover__PeerFlowOpened *op = NULL;
	char msg[512] = "", reason[256] = "", out[4096];
	_Atomic uint64_t *pos;
	flowshm_t *c;
	struct hd d;
	int fd, i;

	hd_start(&d, moverd_bin, "hostile13", true, opts);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "peer13"));
	CHECK_RC(hp_open_answer(fd, &o, msg, sizeof(msg)), 0);
	c = attach_raw(&d, "f13", FLOWSHM_CONSUMER);
	pos = &c->ring.sh->subs[c->ring.sub].pos;
	/* release: as a consumer hands space back; past all that arrives */
	atomic_store_explicit(pos, 8192, memory_order_release);
	memset(junk, 0x5a, 4096);
	CHECK(hp_send_hdr(fd, WIRE_DATA, o.flow_id, 4096, 0, 0));
	CHECK(hp_send_all(fd, junk, 4096));
	CHECK(hp_wait_opened(fd, o.flow_id, 5000, &op) == 0);
	printf("  B refused f13 at the deposit: %d %s\n", op->error,
	       op->message ? op->message : "");
	CHECK_RC(op->error, -EPROTO);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	expect_failed(&d, "B", "f13");
	/* the consumer takes its lie back: the ring's words are honest
	 * again, only moverd's verdict remains */
	atomic_store_explicit(pos, 0, memory_order_release);
	close(fd); /* gone before the sender closed f13 */
	/* back as soon as B saw the connection end (its checks of exposed
	 * rings, once a second, would find the ring failed again) */
	for (int i = 0; i < 500 && !hd_log_count(&d, "receive: closed"); i++)
		usleep(2000);

	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "peer13"));
	CHECK_RC(hp_open_answer(fd, &o, msg, sizeof(msg)), -EIO);
	printf("  the sender, back, hears: %s\n", msg);
	CHECK(strstr(msg, "failed on this host"));
	CHECK(strstr(msg, "consumer's position 8192"));
	/* nor does an open that says the sender cut this host (a fan-out
	 * rejoin) make it anew: that is for a cut flow, not a failed one
	 * (it was recreated, its reason gone) */
	CHECK(hp_open_cut(fd, &o, true));
	CHECK(hp_wait_opened(fd, o.flow_id, 5000, &op) == 0);
	printf("  ... and, opening after a cut: %d %s\n", op->error,
	       op->message ? op->message : "");
	CHECK_RC(op->error, -EIO);
	CHECK(op->message && strstr(op->message, "consumer's position 8192"));
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(hd_wait_state(&d, moverctl_bin, "f13", "failed", 1000, reason,
			    sizeof(reason)));
	CHECK(strstr(reason, "consumer's position 8192"));
	close(fd);
	/* another peer (another host: without keys a peer is its address)
	 * naming it hears whose it is, not why it failed */
	fd = hp_connect_from(d.port, "127.0.0.2");
	CHECK(hp_hello(fd, "stranger13"));
	CHECK_RC(hp_open_answer(fd, &o, msg, sizeof(msg)), -EEXIST);
	printf("  a stranger hears: %s\n", msg);
	CHECK(strstr(msg, "belongs to another peer") &&
	      !strstr(msg, "position"));
	close(fd);
	/* failed and off its sender's connection, it goes after
	 * --orphan-timeout as a flow waiting for its sender does (it held
	 * its ring and table slot for good) */
	for (i = 0; i < 300 && hd_flow_json(&d, moverctl_bin, "f13", out,
					    sizeof(out)); i++)
		usleep(50000);
	CHECK(!hd_flow_json(&d, moverctl_bin, "f13", out, sizeof(out)));
	CHECK(hd_log_count(&d, "flow f13: failed, and off the connection of "
			   "its sender (127.0.0.1) for 5 s (--orphan-timeout)") == 1);
	printf("  f13 gone by --orphan-timeout (5 s) after %.1f s more\n",
	       i * 0.05);
	flowshm_detach(c);
	hd_alive(&d);
	hd_stop(&d);
}

/* ---- case 9: requests pipelined behind an attach that waits ---------------- */

/* Send one request frame of body `which` (id): 'a' attach of name waiting
 * up to 10 s, 's' status, 'd' describe of name. */
static void send_req(int c, char which, uint64_t id, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	Flowmover__GetStatus gs = FLOWMOVER__GET_STATUS__INIT;
	Flowmover__DescribeFlow ds = FLOWMOVER__DESCRIBE_FLOW__INIT;
	uint8_t buf[1024];
	size_t len;

	req.id = id;
	if (which == 'a') {
		at.name = (char *)name;
		at.role = FLOWMOVER__ROLE__PRODUCER;
		at.wait_ms = 10000;
		req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
		req.attach = &at;
	} else if (which == 's') {
		req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
		req.status = &gs;
	} else {
		ds.name = (char *)name;
		req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
		req.describe = &ds;
	}
	CHECK(ctl_frame_pack(&req.base, buf, sizeof(buf), &len) == 0);
	CHECK(send(c, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
}

/* The next response on c: its id and body (closing any fds it carried). */
static uint64_t recv_resp(int c, Flowmover__Response__BodyCase *body)
{
	static uint8_t buf[CTL_FRAME_BUF];
	Flowmover__Response *resp = NULL;
	char err[256];
	int fds[2] = { -1, -1 };
	size_t len;
	uint64_t id;

	CHECK_RC(ctl_recv_frame_fds(c, buf, sizeof(buf), &len, fds, 2, 5000), 0);
	CHECK(ctl_response_decode(buf, len, &resp, err, sizeof(err)) == 0);
	id = resp->id;
	*body = resp->body_case;
	ctl_response_free(resp);
	for (unsigned i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return id;
}

/*
 * A client pipelines a status request behind an attach that waits for its
 * flow; the flow appears, both are answered; then it sends a describe and
 * a status.  moverd's read was armed (at the end of the status's bytes)
 * while the attach waited, and serving the status moved the buffer under
 * it: the describe must still be read as itself, not as stale bytes.
 */
static void case_pipelined_wait(void)
{
	Flowmover__Response__BodyCase body;
	struct hd d;
	int c, r;

	hd_start(&d, moverd_bin, "hostile9", false, NULL);
	c = ctl_connect(d.sock);
	r = ctl_connect(d.sock);
	CHECK(c >= 0 && r >= 0);
	send_req(c, 'a', 1, "late");
	usleep(200000); /* the attach waits, a read is armed */
	send_req(c, 's', 2, NULL);
	usleep(200000); /* the status waits its turn, read again */
	CHECK(hc_create(r, "late", 1 << 16, 1024) == 0);
	CHECK(recv_resp(c, &body) == 1);
	CHECK(body != FLOWMOVER__RESPONSE__BODY_ERROR);
	CHECK(recv_resp(c, &body) == 2);
	CHECK(body == FLOWMOVER__RESPONSE__BODY_STATUS);
	send_req(c, 'd', 3, "late");
	CHECK(recv_resp(c, &body) == 3);
	CHECK(body == FLOWMOVER__RESPONSE__BODY_FLOW);
	send_req(c, 's', 4, NULL);
	CHECK(recv_resp(c, &body) == 4);
	CHECK(body == FLOWMOVER__RESPONSE__BODY_STATUS);
	printf("  attach, status, describe, status: answered in order\n");
	close(c);
	close(r);
	hd_alive(&d);
	hd_stop(&d);
}

/*
 * A producer holds a claim (flowshm_reserve, not yet committed): the tail
 * is past the send position, the seal there not committed.  moverd's look
 * behind its heavy fence took the tail for records, so it woke every 2 ms
 * with a membarrier each, as long as the claim stayed open (~480 wakes a
 * second, against ~14 at rest).  It must sleep, and the record must still
 * go once committed.
 */
static void case_open_claim(void)
{
	static const char *const names[] = { "q", NULL };
	char rec[64];
	struct hd a, b;
	flowshm_t *p, *c;
	void *buf;
	size_t len;
	double cpu;
	long sw;

	two_daemons(&a, &b, "hostile10", names);
	p = attach_raw(&a, "q", FLOWSHM_PRODUCER);
	c = attach_raw(&b, "q", FLOWSHM_CONSUMER);
	CHECK_RC(flowshm_send(p, "first", 5, 1000000000), 0);
	CHECK_RC(flowshm_recv(c, rec, sizeof(rec), &len, 5000000000), 0);
	CHECK(len == 5 && memcmp(rec, "first", 5) == 0);
	CHECK_RC(flowshm_reserve(p, 32, &buf, 1000000000), 0);
	memset(buf, 'c', 32);
	/* a sweep round (1 s) finds the tail moved, then 2 s more */
	sw = hd_status_num(&a, "voluntary_ctxt_switches");
	cpu = hd_cpu_share(&a, 3000);
	sw = hd_status_num(&a, "voluntary_ctxt_switches") - sw;
	printf("  A with a claim open for 3 s: cpu %.3f, %ld sleeps\n", cpu,
	       sw);
	/* 64-95 here; 1374-1409 before the fix */
	CHECK(sw < 400);
	CHECK_RC(flowshm_commit(p), 0);
	CHECK_RC(flowshm_recv(c, rec, sizeof(rec), &len, 5000000000), 0);
	CHECK(len == 32 && rec[0] == 'c' && rec[31] == 'c');
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&a);
	hd_stop(&a);
	hd_stop(&b);
}

/* 11: n committed records of len bytes from pos in consumer c's deposit
 * ring, sealed as moverd's would be (any consumer holds the key). */
static void forge_records(flowshm_t *c, uint64_t pos, unsigned n,
			  uint32_t len)
{
	struct fr_ring *r = &c->ring;

	for (unsigned i = 0; i < n; i++, pos += fr_record_bytes(len)) {
		struct fr_rec *h = fr_rec_at(r, pos);

		memset(h + 1, 0x66, len);
		atomic_store_explicit(&h->len, len, memory_order_relaxed);
		atomic_store_explicit(&h->info, 0, memory_order_relaxed);
		/* release: header and payload before the seal, as a
		 * producer commits */
		atomic_store_explicit(&h->seal, fr_seal(r, pos,
							FR_SEAL_COMMITTED),
				      memory_order_release);
	}
}

/* 11: who is down while B's `published` is moved. */
enum down { DOWN_B, DOWN_A, DOWN_BOTH };

/* 11, 17a: A and B with flows names (two_daemons: r first), a producer on
 * A and a consumer on B that read 100 records of 64 bytes through r. */
static void hundred_through_r(struct hd *a, struct hd *b, const char *tag,
			      const char *const *names, flowshm_t **p,
			      flowshm_t **c)
{
	unsigned char buf[64];
	size_t len;

	two_daemons(a, b, tag, names);
	*p = attach_raw(a, "r", FLOWSHM_PRODUCER);
	*c = attach_raw(b, "r", FLOWSHM_CONSUMER);
	memset(buf, 0x11, sizeof(buf));
	for (int i = 0; i < 100; i++)
		CHECK_RC(flowshm_send(*p, buf, sizeof(buf), 1000000000), 0);
	for (int i = 0; i < 100; i++)
		CHECK_RC(flowshm_recv(*c, buf, sizeof(buf), &len, 5000000000),
			 0);
}

/*
 * 11: a consumer on B moves its ring's `published` ten records forward
 * while (a) B, (b) A or (c) both are down.  The resume answered from it
 * made A skip ten records it never sent, released from its ring for good,
 * and B's other consumers read garbage there.  Now (a) A refuses a resume
 * beyond what it sent, (b) B, which knows what it published, refuses the
 * open, (c) B, whose records from its consumers' position end short of
 * `published`, refuses it: the flow fails on A (and B) with the reason, no
 * record skipped.
 */
static void bumped_published(enum down down)
{
	static const char *const tags[] = { "hostile11a", "hostile11b",
					    "hostile11c" };
	static const char *const downs[] = { "B is", "A is", "A and B are" };
	bool receiver_down = down == DOWN_B;
	static const char *const names[] = { "r", NULL };
	static const char *const tcp[] = { "--transport", "tcp", NULL };
	const uint64_t rec = fr_record_bytes(64);
	unsigned char buf[64];
	struct hd a, b;
	flowshm_t *p, *c;
	uint64_t pub;

	hundred_through_r(&a, &b, tags[down], names, &p, &c);
	memset(buf, 0x11, sizeof(buf));
	if (down != DOWN_A)
		hd_kill(&b);
	if (down != DOWN_B)
		hd_kill(&a);
	/* A knows the link is gone before the records below: none of them
	 * is put on the wire (what A sent into a dying connection is what
	 * it cannot tell from what B got; only B can, see security.md) */
	if (receiver_down)
		CHECK(hd_wait_state(&a, moverctl_bin, "r", "reconnecting",
				    10000, NULL, 0));
	/* acquire/release: as moverd's own publish */
	pub = atomic_load_explicit(&c->ring.sh->published,
				   memory_order_acquire);
	atomic_store_explicit(&c->ring.sh->published, pub + 10 * rec,
			      memory_order_release);
	/* (a) and (b) with the ten records forged too, as a consumer can
	 * (it holds the seal key): B's walk of its records at its first
	 * open passes, A's or B's own check must refuse */
	if (down != DOWN_BOTH)
		forge_records(c, pub, 10, 64);
	printf("  B's published moved %llu -> %llu while %s down\n",
	       (unsigned long long)pub, (unsigned long long)(pub + 10 * rec),
	       downs[down]);
	/* more records: A's tail past the forged position (a producer
	 * writes its ring with A down too) */
	for (int i = 0; i < 50; i++)
		CHECK_RC(flowshm_send(p, buf, sizeof(buf), 1000000000), 0);
	if (down != DOWN_A)
		hd_restart(&b, moverd_bin, NULL);
	if (down != DOWN_B)
		hd_restart(&a, moverd_bin, tcp);
	expect_failed(&a, "A", "r");
	if (!receiver_down)
		expect_failed(&b, "B", "r");
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&a);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);
}

static void case_published_receiver_down(void)
{
	if (variant("a"))
		bumped_published(DOWN_B);
}

static void case_published_sender_down(void)
{
	if (variant("b"))
		bumped_published(DOWN_A);
}

static void case_published_both_down(void)
{
	if (variant("c"))
		bumped_published(DOWN_BOTH);
}

/* ---- case 14: a peer moverd dialed opens flows back --------------------- */

/* 14, 17b: moverd d (no --listen) with flow `flow` to a peer the test
 * plays: the connection d dialed, accepted (*lfd: the listener). */
static int dialing_daemon(struct hd *d, const char *tag, const char *flow,
			  int *lfd)
{
	char out[4096];
	int port, fd;

	*lfd = hp_listen(&port);
	hd_start(d, moverd_bin, tag, false, NULL);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "flow create %s "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1024",
		     flow, port) == 0);
	CHECK((fd = hp_accept(*lfd, 5000)) >= 0);
	return fd;
}

/*
 * A local user's flow names a host (127.0.0.1:PORT here, any address it
 * likes); what answers there says its hello (no key: a peer is only its
 * address) and opens flows back over the connection A dialed.  A has no
 * --listen: it made receiver flows and ring files anyway, counted for
 * that address, so that a user rotating addresses filled the flow table
 * (a review: 20 rings of 1 MiB for a uid allowed 2 flows).  Refused now,
 * and A's own flow on that connection goes on.
 */
static void case_dialed_opens(void)
{
	static const struct hp_open o = { "h14", 14, 1 << 20, 1024,
					  0x1414141400ull, 0 };
	char msg[512] = "", out[4096];
	struct hp_hello_in in;
	int lfd, fd;
	struct hd d;

	fd = dialing_daemon(&d, "hostile14", "q14", &lfd);
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(hp_hello(fd, "dialed"));
	CHECK_RC(hp_open_answer(fd, &o, msg, sizeof(msg)), -EPERM);
	printf("  an open over the connection A dialed: %s\n", msg);
	CHECK(strstr(msg, "no --peer-key"));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list") == 0);
	CHECK(strstr(out, "q14") && !strstr(out, "h14"));
	/* refused, not dropped: A's own flow stays on the connection */
	CHECK(!hp_closed_within(fd, 300));
	close(fd);
	close(lfd);
	hd_stop(&d);
}

/* ---- case 15: an acknowledgement with a body ----------------------------- */

/*
 * An ACK frame has no body; one for a flow that is not on the connection
 * returned before its length was looked at, and the bytes behind it were
 * read as the next frames (a review smuggled a whole OPEN in; here a
 * heartbeat).  The link fails now, with the reason.
 */
static void case_ack_body(void)
{
	uint8_t hb[WIRE_HDR];
	struct hd d;
	int fd;

	hd_start(&d, moverd_bin, "hostile15", true, NULL);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "ack-body"));
	wire_put(hb, WIRE_HEARTBEAT, 0, 0, 0, 0);
	CHECK(hp_send_hdr(fd, WIRE_ACK, 999, sizeof(hb), 0, 0));
	CHECK(hp_send_all(fd, hb, sizeof(hb)));
	CHECK(hp_closed_within(fd, 5000));
	CHECK(hd_log_count(&d, "acknowledgement with a payload") == 1);
	printf("  an ACK of flow 999 with a %zu-byte body: the link failed\n",
	       sizeof(hb));
	close(fd);
	hd_stop(&d);
}

/* ---- case 16: a fan-out peer answers a resume beyond the tail ----------- */

static bool is_open_msg(const Flowmover__PeerMsg *m, uint32_t unused)
{
	(void)unused;
	return m->body_case == FLOWMOVER__PEER_MSG__BODY_OPEN;
}

/* A fake peer on fd, a connection moverd dialed: it reads moverd's hello,
 * says its own, takes the OPEN and answers "opened" with a resume position
 * resume_off past the open's start and its consumer head_off past it. */
static void answer_opened_as(int fd, const char *node, uint64_t instance,
			     uint64_t resume_off, uint64_t head_off)
{
	Flowmover__PeerFlowOpened op = FLOWMOVER__PEER_FLOW_OPENED__INIT;
	Flowmover__PeerMsg r = FLOWMOVER__PEER_MSG__INIT, *m;
	struct hp_hello_in in;

	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(hp_hello_as(fd, node, instance));
	CHECK((m = hp_wait_msg(fd, 5000, is_open_msg, 0)));
	op.flow_id = m->open->flow_id;
	op.resume = m->open->start + resume_off;
	op.head = m->open->start + head_off;
	flowmover__peer_msg__free_unpacked(m, NULL);
	r.body_case = FLOWMOVER__PEER_MSG__BODY_OPENED;
	r.opened = &op;
	CHECK(hp_send_msg(fd, &r));
}

static void answer_opened(int fd, const char *node, uint64_t resume_off,
			  uint64_t head_off)
{
	answer_opened_as(fd, node, 0, resume_off, head_off);
}

/*
 * x goes from A to B; a peer added to it (a fake moverd C) answers A's
 * open with a resume position beyond the producers' tail.  A knows
 * nothing it sent C (a new peer; also the first open after a restart),
 * so this is C's word against the ring's: it failed the ring, and B's
 * flow and A's producers with it (a review).  It ends C's subscription
 * only now; records still go to B.
 */
static void case_fanout_resume_beyond(void)
{
	char out[8192], why[256] = "", addr[64];
	flowshm_t *prod, *cons;
	uint8_t buf[64];
	size_t len;
	int lfd, port, fd;
	struct hd a, b;

	hd_start(&b, moverd_bin, "hostile16-B", true, NULL);
	hd_start(&a, moverd_bin, "hostile16-A", false, NULL);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create x16 "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1024",
		     b.port) == 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "x16", "open", 5000, NULL, 0));
	lfd = hp_listen(&port);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow peer add x16 "
		     "127.0.0.1:%d", port) == 0);
	CHECK((fd = hp_accept(lfd, 5000)) >= 0);
	answer_opened(fd, "c16", 16, 0); /* in the window, beyond the tail */
	snprintf(addr, sizeof(addr), "\"address\": \"127.0.0.1:%d\"", port);
	for (int i = 0; i < 100 && !strstr(why, "behind what the peer"); i++) {
		const char *c;

		CHECK(hd_flow_json(&a, moverctl_bin, "x16", out, sizeof(out)));
		if ((c = strstr(out, addr)))
			hj_get(c, "reason", why, sizeof(why));
		usleep(50000);
	}
	printf("  A's subscription of C: %s\n", why);
	CHECK(strstr(why, "behind what the peer received"));
	CHECK(hd_wait_state(&a, moverctl_bin, "x16", "open", 1000, NULL, 0));
	setenv("FLOWMOVER_SOCKET", b.sock, 1);
	CHECK_RC(flowshm_attach("x16", FLOWSHM_CONSUMER, NULL, &cons), 0);
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("x16", FLOWSHM_PRODUCER, NULL, &prod), 0);
	CHECK_RC(flowshm_send(prod, "after", 5, 1000000000), 0);
	CHECK_RC(flowshm_recv(cons, buf, sizeof(buf), &len, 5000000000ll), 0);
	CHECK(len == 5 && !memcmp(buf, "after", 5));
	printf("  x16 still open on A; a record after it reached B\n");
	flowshm_detach(prod);
	flowshm_detach(cons);
	close(fd);
	close(lfd);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 17: a resume more than a ring ahead ---------------------------- */

/*
 * (a) A consumer of r on B moves published, the floor and its own slot four
 * rings ahead while B is down: the walk of its records is empty, and B
 * resumed r there; A found the resume outside its window and failed the
 * connection, and every reopen failed it again (a review: 80 reconnects
 * in 8 s, q never done).  B refuses the ring now, and r alone fails.
 */
static void far_published(void)
{
	static const char *const names[] = { "r", "q", NULL };
	struct hd a, b;
	flowshm_t *p, *c;
	uint64_t pub, far, r0, r1;

	hundred_through_r(&a, &b, "hostile17a", names, &p, &c);
	fr_sub_publish(&c->ring);
	hd_kill(&b);
	/* acquire/release: as moverd's own publish and a consumer's */
	pub = atomic_load_explicit(&c->ring.sh->published,
				   memory_order_acquire);
	far = pub + 4 * c->ring.size;
	atomic_store_explicit(&c->ring.sh->subs[c->ring.sub].pos, far,
			      memory_order_release);
	atomic_store_explicit(&c->ring.sh->floor, far, memory_order_release);
	atomic_store_explicit(&c->ring.sh->published, far,
			      memory_order_release);
	printf("  B down: its consumer moved published and head %llu -> "
	       "%llu\n", (unsigned long long)pub, (unsigned long long)far);
	hd_restart(&b, moverd_bin, NULL);
	expect_failed(&b, "B", "r");
	CHECK(hd_log_count(&b, "more than a ring beyond") >= 1);
	r0 = reconnects(&a);
	q_completes(&a, &b);
	r1 = reconnects(&a);
	printf("  q: every record once; A's reconnects %llu, then %llu\n",
	       (unsigned long long)r0, (unsigned long long)r1);
	CHECK(r1 == r0);
	CHECK(hd_log_count(&a, "outside the window") == 0);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&a);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);
}

static bool is_close_msg(const Flowmover__PeerMsg *m, uint32_t unused)
{
	(void)unused;
	return m->body_case == FLOWMOVER__PEER_MSG__BODY_CLOSE;
}

/*
 * (b) What (a)'s B said, from a peer that does not check its ring (an
 * older moverd, or a hostile one): A fails the flow, not the connection,
 * and tells the peer, which had answered "opened" (its receiver would
 * stay open for good otherwise: a review).
 */
static void far_resume(void)
{
	Flowmover__PeerMsg *m;
	char reason[256] = "";
	int lfd, fd;
	struct hd a;

	fd = dialing_daemon(&a, "hostile17b", "r17", &lfd);
	answer_opened(fd, "far", 4 * 65536, 4 * 65536); /* four rings on */
	CHECK(hd_wait_state(&a, moverctl_bin, "r17", "failed", 5000, reason,
			    sizeof(reason)));
	printf("  A: r17 failed: %s\n", reason);
	CHECK(strstr(reason, "outside the window"));
	CHECK((m = hp_wait_msg(fd, 5000, is_close_msg, 0)));
	printf("  the peer is told: CLOSE '%s'\n", m->close->failed);
	CHECK(strstr(m->close->failed, "outside the window"));
	flowmover__peer_msg__free_unpacked(m, NULL);
	CHECK(!hp_closed_within(fd, 300)); /* the connection goes on */
	close(fd);
	close(lfd);
	hd_stop(&a);
}

static void case_far_resume(void)
{
	if (variant("a"))
		far_published();
	if (variant("b"))
		far_resume();
}

/* ---- case 18: a pad larger than the mover's deficit ---------------------- */

/* A producer claims `bytes` and commits one pad over them (as a refused
 * batch does, in one pad); where it begins. */
static uint64_t commit_pad(flowshm_t *f, uint64_t bytes)
{
	struct fr_ring *r = &f->ring;
	/* acquire: the producers' claim position */
	uint64_t t = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
	struct fr_rec *h;

	CHECK(fr_lap_rest(r, t) >= bytes);
	CHECK(atomic_compare_exchange_strong(&r->sh->tail, &t, t + bytes));
	h = fr_rec_at(r, t);
	atomic_store_explicit(&h->len, (uint32_t)(bytes - FR_REC_HDR),
			      memory_order_relaxed);
	atomic_store_explicit(&h->info, FR_INFO_PAD, memory_order_relaxed);
	/* release: a reader that sees the seal sees len and info */
	atomic_store_explicit(&h->seal, fr_seal(r, t, FR_SEAL_COMMITTED),
			      memory_order_release);
	return t;
}

/* 18, 19: A and B with q (two_daemons), and flow `name` from A to B with
 * a 4 MiB ring of records up to max_record, open, a producer on A and a
 * consumer on B attached. */
static void big_flow(struct hd *a, struct hd *b, const char *tag,
		     const char *name, const char *max_record, flowshm_t **p,
		     flowshm_t **c)
{
	static const char *const names[] = { "q", NULL };
	char out[4096];

	two_daemons(a, b, tag, names);
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create %s "
		     "--peer 127.0.0.1:%d --ring-size 4M --max-record %s",
		     name, b->port, max_record) == 0);
	CHECK(hd_wait_state(a, moverctl_bin, name, "open", 10000, NULL, 0));
	*p = attach_raw(a, name, FLOWSHM_PRODUCER);
	*c = attach_raw(b, name, FLOWSHM_CONSUMER);
}

/*
 * A committed pad of 2 MiB on a 4 MiB ring of 1 KiB records: more than the
 * deficit a flow earns (1 MiB), so the mover's span stopped before it at
 * every cycle, the flow stayed active and moverd spun at 99% of a cpu; the
 * record after the pad never came (a review).  It goes now; q too.  And
 * it goes as pads of a quantum (512 KiB, moverd/peer_impl.h FLOW_QUANTUM),
 * as B's ring shows where it landed: whole, it went as one frame of up
 * to a lap ahead of every other flow on the connection (a review; B's
 * ring held one pad of 2 MiB).
 */
static void case_big_pad(void)
{
	const uint64_t piece = 512 * KIB;
	unsigned char buf[64];
	flowshm_t *p, *c;
	struct hd a, b;
	uint64_t at;
	size_t len;

	big_flow(&a, &b, "hostile18", "p18", "1024", &p, &c);
	memset(buf, 0x11, sizeof(buf));
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 1000000000), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 5000000000), 0);
	at = commit_pad(p, 2048 * KIB);
	memset(buf, 0x22, sizeof(buf));
	/* after the pad: its commit rings the doorbell */
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 1000000000), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10000000000), 0);
	CHECK(len == sizeof(buf) && buf[0] == 0x22);
	printf("  a 2 MiB pad, then a record: it reached B (A's cpu share "
	       "after: %.2f)\n", hd_cpu_share(&a, 1000));
	for (uint64_t q = at; q < at + 2048 * KIB; q += piece) {
		const struct fr_rec *h = fr_rec_at(&c->ring, q);
		/* relaxed: B published past them (the record after came) */
		uint32_t l = atomic_load_explicit(&h->len, memory_order_relaxed);
		uint32_t info = atomic_load_explicit(&h->info,
						     memory_order_relaxed);

		printf("  B's ring at +%llu KiB: %s of %u bytes\n",
		       (unsigned long long)((q - at) / KIB),
		       info & FR_INFO_PAD ? "a pad" : "a record",
		       (unsigned)(l + FR_REC_HDR));
		CHECK((info & FR_INFO_PAD) && l + FR_REC_HDR == piece);
	}
	q_completes(&a, &b);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&a);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 19: a client keeps its ring file short under a send ------------ */

/* A child: a producer of flow on d shrinks the ring file to `small` as
 * fast as it can for 3 s from the byte on go, then puts its size back. */
static pid_t shrinker(const struct hd *d, const char *flow, off_t small,
		      off_t full, int go)
{
	uint64_t until, n = 0;
	int sock, fd;
	pid_t kid;
	char x;

	CHECK((kid = fork()) >= 0);
	if (kid)
		return kid;
	fd = hd_attach_fd(d, flow, FLOWMOVER__ROLE__PRODUCER, &sock);
	CHECK(read(go, &x, 1) == 1);
	until = tu_now_ns() + 3000000000ull;
	while (tu_now_ns() < until)
		n += ftruncate(fd, small) == 0;
	CHECK(ftruncate(fd, full) == 0);
	printf("  the shrinker: %llu truncations\n", (unsigned long long)n);
	_exit(0);
}

/*
 * Flow p (4 MiB ring, records of 1 MiB) has four records waiting for B's
 * window, the last at the end of the lap; a co-client shrinks the file
 * to cut that record's payload, again and again, while B's consumer opens
 * the window.  The send faults (EFAULT); moverd repaired the file, failed
 * p and posted the send again, the client shrank it again, and the fifth
 * fault failed the link: q reconnected (a review: 1 run in 3 to 7).  The
 * send's pages are touched now, which trips the mapping's guard: p fails,
 * the link and q go on.
 */
static void case_send_shrunk(void)
{
	const uint64_t mib = 1024 * KIB, len = mib - FR_REC_HDR;
	static unsigned char rec[1 << 20];
	char why[256] = "";
	struct hd a, b;
	flowshm_t *p, *c;
	uint64_t r0;
	size_t got;
	int go[2], rc = 0;
	pid_t kid;

	big_flow(&a, &b, "hostile19", "p", "1M", &p, &c);
	memset(rec, 0x22, sizeof(rec));
	for (int i = 0; i < 4; i++)
		CHECK_RC(flowshm_send(p, rec, len, 5000000000), 0);
	wait_u64(&b, "p", "tail", 4 * mib, 10000);
	/* four more: A holds them (B's window is closed), the last one
	 * ends at the end of the lap */
	for (int i = 0; i < 4; i++)
		CHECK_RC(flowshm_send(p, rec, len, 5000000000), 0);
	r0 = reconnects(&a);
	CHECK(pipe(go) == 0);
	kid = shrinker(&a, "p", (off_t)(FR_CTRL_BYTES + 3 * mib + 4096),
		       (off_t)(FR_CTRL_BYTES + 4 * mib), go[0]);
	for (int i = 0; i < 8 && !rc; i++) {
		if (i == 3)
			CHECK(write(go[1], "g", 1) == 1);
		rc = flowshm_recv(c, rec, sizeof(rec), &got, 2000000000);
	}
	printf("  B's consumer: %s\n", rc ? flowshm_strerror(rc) :
	       "all 8 records");
	CHECK_RC(hx_wait(kid, 15000), 0);
	close(go[0]);
	close(go[1]);
	CHECK(hd_log_count(&a, "send: Bad address") == 0);
	CHECK(reconnects(&a) == r0);
	if (hd_wait_state(&a, moverctl_bin, "p", "failed", 3000, why,
			  sizeof(why)))
		printf("  A: p failed: %s\n", why);
	q_completes(&a, &b);
	printf("  the link stayed (reconnects %llu); q: every record once\n",
	       (unsigned long long)r0);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&a);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 20: a waiting client that fills its buffer, then hangs up ------- */

/* moverd's count of control clients. */
static uint64_t ctl_clients(const struct hd *d)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	return hj_u64(out, "clients");
}

/*
 * A client's attach waits for a flow that never comes (an hour); behind it
 * the client pipelines more than moverd's buffer holds, then hangs up.  With
 * the buffer full no read was armed, so the hang-up went unseen: the
 * client's slot (and a drain's flow reference, had it waited for one) was
 * kept until moverd stopped (a review).  moverd looks for it now.
 */
static void case_full_then_gone(void)
{
	static uint8_t buf[CTL_FRAME_BUF + (32u << 10)];
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	Flowmover__GetStatus st = FLOWMOVER__GET_STATUS__INIT;
	uint64_t base, n = 0;
	size_t off = 0, len;
	struct hd d;
	int c;

	hd_start(&d, moverd_bin, "hostile20", false, NULL);
	base = ctl_clients(&d); /* moverctl's own connection */
	c = connect_as(&d, 0);
	at.name = "h20-never";
	at.role = FLOWMOVER__ROLE__CONSUMER;
	at.wait_ms = 3600000;
	req.id = 1;
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	CHECK(ctl_frame_pack(&req.base, buf, sizeof(buf), &len) == 0);
	off = len;
	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &st;
	while (off + 64 < sizeof(buf)) {
		req.id++;
		CHECK(ctl_frame_pack(&req.base, buf + off, sizeof(buf) - off,
				     &len) == 0);
		off += len;
	}
	CHECK(send(c, buf, off, MSG_NOSIGNAL) == (ssize_t)off);
	for (int i = 0; i < 100 && (n = ctl_clients(&d)) != base + 1; i++)
		usleep(20000);
	CHECK(n == base + 1);
	usleep(200000); /* moverd has read its buffer full */
	close(c);
	for (int i = 0; i < 250 && (n = ctl_clients(&d)) != base; i++)
		usleep(20000);
	printf("  %zu bytes behind a waiting attach, then a hang-up: control "
	       "clients %llu -> %llu\n", off, (unsigned long long)(base + 1),
	       (unsigned long long)n);
	CHECK(n == base);
	hd_stop(&d);
}

/* ---- case 21: silent connections push the real peer out of status --------- */

/*
 * `status` lists 64 peer connections, and listed the newest first: 64
 * silent connections (8 addresses, 8 each: within the per-address limit)
 * pushed A's connection, which carries flow q21, out of B's status, and
 * nothing said the list was cut (a review).  Those carrying flows come
 * first now, and the rest are counted.
 */
static void case_status_crowded(void)
{
	char out[65536], addr[64];
	int fds[64], n = 0;
	struct hd a, b;

	hd_start(&b, moverd_bin, "hostile21-B", true, NULL);
	hd_start(&a, moverd_bin, "hostile21-A", false, NULL);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create q21 "
		     "--peer 127.0.0.1:%d --ring-size 64K", b.port) == 0);
	CHECK(hd_wait_state(&b, moverctl_bin, "q21", "open", 10000, NULL, 0));
	for (int i = 0; i < 64; i++) {
		snprintf(addr, sizeof(addr), "127.0.0.%d", 2 + i / 8);
		if ((fds[n] = hp_connect_from(b.port, addr)) >= 0)
			n++;
	}
	usleep(300000); /* accepted */
	CHECK(hd_ctl(&b, moverctl_bin, out, sizeof(out), "status --json") ==
	      0);
	/* the silent ones come from 127.0.0.2-9, A's from 127.0.0.1 */
	printf("  %d silent connections to B; B's status lists A's "
	       "connection: %s; not listed: %llu\n", n,
	       strstr(out, "\"address\": \"127.0.0.1:") ? "yes" : "no",
	       (unsigned long long)hj_u64(out, "peers_not_listed"));
	CHECK(n == 64);
	CHECK(strstr(out, "\"address\": \"127.0.0.1:"));
	CHECK(hj_u64(out, "peers_not_listed") >= 1);
	while (n--)
		close(fds[n]);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 23: refused opens after a restart walk the records once ------- */

/* Wait for d's flow r (c: a consumer of it on d) to have published pub. */
static void wait_published(const flowshm_t *c, uint64_t pub)
{
	for (int i = 0; i < 500; i++) {
		/* acquire: as a consumer reads moverd's publish */
		if (atomic_load_explicit(&c->ring.sh->published,
					 memory_order_acquire) >= pub)
			return;
		usleep(10000);
	}
	CHECK(!"records published on the receiving host");
}

static void case_refused_walks(void)
{
	static const char *const names[] = { "r", NULL };
	const uint64_t rec = fr_record_bytes(64);
	unsigned char buf[64];
	char msg[512];
	struct hd a, b;
	flowshm_t *p, *c;
	struct hp_open o;
	int fd;

	two_daemons(&a, &b, "hostile23", names);
	p = attach_raw(&a, "r", FLOWSHM_PRODUCER);
	c = attach_raw(&b, "r", FLOWSHM_CONSUMER); /* reads nothing */
	memset(buf, 0x23, sizeof(buf));
	for (int i = 0; i < 100; i++)
		CHECK_RC(flowshm_send(p, buf, sizeof(buf), 1000000000), 0);
	wait_published(c, 100 * rec);
	flowshm_detach(p);
	hd_kill(&a);
	hd_term(&b);
	hd_restart(&b, moverd_bin, NULL);
	/* from 127.0.0.1, without a key: A's identity */
	fd = hp_connect(b.port);
	CHECK(hp_hello(fd, "peer23"));
	o = (struct hp_open){ "r", 1, c->ring.size, c->ring.max_record,
			      c->ring.key, 100 * rec + rec };
	for (int i = 0; i < 3; i++) {
		CHECK_RC(hp_open_answer(fd, &o, msg, sizeof(msg)), -EPROTO);
		CHECK(strstr(msg, "lost data the sender had acknowledged"));
	}
	o.start = 100 * rec;
	CHECK_RC(hp_open_answer(fd, &o, msg, sizeof(msg)), 0);
	printf("  3 opens beyond published refused, the 4th resumed; B "
	       "walked the records %d time(s)\n",
	       hd_log_count(&b, "checked once after the restart"));
	CHECK(hd_log_count(&b, "checked once after the restart") == 1);
	close(fd);
	flowshm_detach(c);
	hd_alive(&b);
	hd_cleanup(&a); /* killed above */
	hd_stop(&b);
}

/* ---- case 24: a fan-out peer says another peer's instance --------------- */

/* The instance d says in its hello (asked as a peer would). */
static uint64_t instance_of(const struct hd *d)
{
	struct hp_hello_in in;
	int fd = hp_connect(d->port);

	CHECK(hp_hello(fd, "asks"));
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	close(fd);
	CHECK(in.instance != 0);
	return in.instance;
}

static void case_instance_claimed(void)
{
	char out[8192], want[160], g_open[64];
	unsigned char buf[64];
	flowshm_t *prod, *cons;
	struct hp_hello_in in;
	int lfd, port, fd, fd2;
	struct hd a, g;
	size_t len;

	hd_start(&g, moverd_bin, "hostile24-G", true, NULL);
	hd_start(&a, moverd_bin, "hostile24-A", false, NULL);
	lfd = hp_listen(&port);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create x24 "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1024",
		     port) == 0);
	CHECK((fd = hp_accept(lfd, 5000)) >= 0);
	answer_opened_as(fd, "h24", instance_of(&g), 0, 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "x24", "open", 5000, NULL, 0));
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow peer add x24 "
		     "127.0.0.1:%d", g.port) == 0);
	CHECK(hd_wait_state(&g, moverctl_bin, "x24", "open", 10000, NULL, 0));
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow show x24") ==
	      0);
	CHECK(!strstr(out, "another of its peers"));
	setenv("FLOWMOVER_SOCKET", g.sock, 1);
	CHECK_RC(flowshm_attach("x24", FLOWSHM_CONSUMER, NULL, &cons), 0);
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("x24", FLOWSHM_PRODUCER, NULL, &prod), 0);
	for (int i = 0; i < 5; i++) {
		memset(buf, 'a' + i, sizeof(buf));
		CHECK_RC(flowshm_send(prod, buf, sizeof(buf), 1000000000), 0);
	}
	for (int i = 0; i < 5; i++) {
		CHECK_RC(flowshm_recv(cons, buf, sizeof(buf), &len,
				      5000000000ll), 0);
		CHECK(len == sizeof(buf) && buf[0] == 'a' + i);
	}
	printf("  H said G's instance; G's subscription opened and G's "
	       "consumer read all 5\n");
	/* an older peer's way: the sender judges by the instance, and ends
	 * the subscription of the peer that said it, only */
	close(lfd);
	lfd = hp_listen(&port);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow peer add x24 "
		     "127.0.0.1:%d", port) == 0);
	CHECK((fd2 = hp_accept(lfd, 5000)) >= 0);
	CHECK(hp_read_hello(fd2, 5000, &in) == 0);
	CHECK(hp_hello_as(fd2, "h24b", instance_of(&g)));
	snprintf(want, sizeof(want), "127.0.0.1:%d failed: another of its "
		 "peers, ", port);
	snprintf(g_open, sizeof(g_open), "127.0.0.1:%d open", g.port);
	for (int i = 0; i < 100 && !strstr(out, want); i++) {
		usleep(50000);
		CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out),
			     "flow show x24") == 0);
	}
	printf("%s", out);
	CHECK(strstr(out, want) && strstr(out, g_open));
	CHECK_RC(flowshm_send(prod, "after", 5, 1000000000), 0);
	CHECK_RC(flowshm_recv(cons, buf, sizeof(buf), &len, 5000000000ll), 0);
	CHECK(len == 5 && !memcmp(buf, "after", 5));
	flowshm_detach(prod);
	flowshm_detach(cons);
	close(fd);
	close(fd2);
	close(lfd);
	hd_stop(&a);
	hd_stop(&g);
}

/* ---- case 22: a link's last error names another user's flow ------------ */

#define OTHER 4000u

/* The fake peer on fd answers the next OPEN "opened" where it starts;
 * the flow id moverd asked under. */
static uint32_t answer_next_open(int fd, const char *name, uint64_t *start)
{
	Flowmover__PeerFlowOpened op = FLOWMOVER__PEER_FLOW_OPENED__INIT;
	Flowmover__PeerMsg r = FLOWMOVER__PEER_MSG__INIT, *m;

	CHECK((m = hp_wait_msg(fd, 5000, is_open_msg, 0)));
	CHECK(!strcmp(m->open->name, name));
	op.flow_id = m->open->flow_id;
	op.resume = op.head = *start = m->open->start;
	flowmover__peer_msg__free_unpacked(m, NULL);
	r.body_case = FLOWMOVER__PEER_MSG__BODY_OPENED;
	r.opened = &op;
	CHECK(hp_send_msg(fd, &r));
	return op.flow_id;
}

/* `status --json` on d as uid into out (cap bytes). */
static void status_as(const struct hd *d, uid_t uid, char *out, size_t cap)
{
	CHECK(hd_ctl_as(d, moverctl_bin, uid, out, cap, "status --json") == 0);
}

/*
 * A connection's last error can name the flow whose frame failed it; a
 * user whose own flow shares the connection sees the connection in
 * `status` (visible_peers) and was shown that reason too: another user's
 * flow name (a review).  It reads that the connection failed over a flow
 * it may not see; the flow's owner and root read the reason.
 */
static void case_error_other_flow(void)
{
	char out[16384];
	struct hp_hello_in in;
	uint64_t start;
	uint32_t id;
	int port, lfd, fd;
	struct hd d;

	lfd = hp_listen(&port);
	hd_start(&d, moverd_bin, "hostile22", false, NULL);
	CHECK(hd_ctl_as(&d, moverctl_bin, OTHER, out, sizeof(out), "flow "
			"create payroll --peer 127.0.0.1:%d --ring-size 64K",
			port) == 0);
	CHECK((fd = hp_accept(lfd, 5000)) >= 0);
	CHECK(hp_read_hello(fd, 5000, &in) == 0);
	CHECK(hp_hello(fd, "fake22"));
	id = answer_next_open(fd, "payroll", &start);
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out), "flow "
			"create mine22 --peer 127.0.0.1:%d --ring-size 64K",
			port) == 0);
	answer_next_open(fd, "mine22", &(uint64_t){ 0 });
	CHECK(hd_wait_state(&d, moverctl_bin, "payroll", "open", 5000, NULL,
			    0));
	/* an acknowledgement of bytes never sent */
	CHECK(hp_send_hdr(fd, WIRE_ACK, id, 0, start + 65536, start));
	CHECK(hp_closed_within(fd, 5000));
	status_as(&d, 0, out, sizeof(out));
	printf("  root reads: %s\n", strstr(out, "payroll: acknowledgement")
	       ? "flow payroll: acknowledgement ... outside the window" :
	       "(no reason)");
	CHECK(strstr(out, "flow payroll: acknowledgement"));
	status_as(&d, OTHER, out, sizeof(out));
	CHECK(strstr(out, "flow payroll: acknowledgement"));
	status_as(&d, NOBODY, out, sizeof(out));
	printf("  uid %u (flow mine22 on the same link) reads: %s\n", NOBODY,
	       strstr(out, "a flow you may not see") ? "\"the connection "
	       "failed over a flow you may not see ...\"" : out);
	CHECK(strstr(out, "127.0.0.1:") && !strstr(out, "payroll"));
	CHECK(strstr(out, "a flow you may not see"));
	/* nor in the reason of its own flow, which the failure reset */
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out), "flow "
			"show mine22 --json") == 0);
	printf("  uid %u's flow mine22 says: %s\n", NOBODY,
	       strstr(out, "over another flow") ? "\"the connection failed "
	       "over another flow on it ...\"" : out);
	CHECK(!strstr(out, "payroll") && strstr(out, "over another flow"));
	CHECK(hd_ctl_as(&d, moverctl_bin, OTHER, out, sizeof(out), "flow "
			"show payroll --json") == 0);
	CHECK(strstr(out, "flow payroll: acknowledgement"));
	close(fd);
	close(lfd);
	hd_stop(&d);
}

/* ---- case 25: strangers that hang up cost a few log lines ---------------- */

/*
 * Anyone the peer port admits can connect and hang up before any hello, as
 * fast as it likes, and moverd logged a line for each ("... (no flows on
 * it): disconnecting"): a stream into its log at the stranger's pace (a
 * review).  Now that line is limited as every line a party can cause at
 * will is (log_limited: a few a second).  500 such connections, then one
 * that stays until B lists it (accepted in order: every one before it
 * was accepted too) and goes; once B lists none of them, its log holds
 * far fewer lines of them than there were connections, and B serves on.
 */
static void case_hangup_flood(void)
{
	enum { N = 500 };
	char out[65536];
	int fd, lines, i;
	struct hd d;

	hd_start(&d, moverd_bin, "hostile25", true, NULL);
	for (i = 0; i < N; i++) {
		CHECK((fd = hp_connect(d.port)) >= 0);
		close(fd);
	}
	CHECK((fd = hp_connect(d.port)) >= 0);
	for (i = 0; i < 400; i++) {
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
			     "status --json") == 0);
		if (strstr(out, "\"address\": \"127.0.0.1:"))
			break;
		usleep(50000);
	}
	CHECK(i < 400);
	close(fd);
	for (i = 0; i < 400; i++) {
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
			     "status --json") == 0);
		if (!strstr(out, "\"address\": \"127.0.0.1:") &&
		    hj_u64(out, "peers_not_listed") == 0)
			break;
		usleep(50000);
	}
	CHECK(i < 400);
	lines = hd_log_count(&d, "(no flows on it): disconnecting");
	printf("  %d connections hung up before their hello: %d lines of "
	       "them in B's log\n", N + 1, lines);
	CHECK(lines >= 1 && lines < N / 4);
	hd_alive(&d);
	hd_stop(&d);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 0, case_smoke, "harness: a peer opens a flow" },
		{ 1, case_moved_flow, "1a: a receiver flow re-opened by "
		  "another connection and closed under a receive in flight" },
		{ 1, case_destroyed_flow, "1b: a receiver flow destroyed "
		  "under a receive in flight" },
		{ 1, case_moved_then_destroyed, "1c: re-opened, its new "
		  "connection gone, then destroyed under a receive in flight" },
		{ 1, case_fuzz_receive, "1d: a bounded fuzzer of the receive "
		  "path across two connections" },
		{ 2, case_parked_fd, "an attach response parked while its "
		  "flow is destroyed and another user's ring created" },
		{ 3, case_lying_consumer, "3a: a consumer stores head beyond "
		  "published, another moves it backwards" },
		{ 3, case_lying_producer, "3b: a producer pins tail at 0 "
		  "while the peer is down" },
		{ 6, case_closed_window, "a sender flow with a closed remote "
		  "window" },
		{ 7, case_non_reading_peer, "a peer floods OPENs and reads "
		  "nothing" },
		{ 8, case_bell_pages, "8a: a client clears its doorbell page: "
		  "its uid's own; root's records still wake moverd" },
		{ 8, case_bell_pages_thread, "8b: the same with the doorbell "
		  "thread" },
		{ 8, case_bell_life, "8c: a doorbell page lives while its uid "
		  "has producers; the uids past 63 share one" },
		{ 8, case_bell_life_thread, "8d: the same with the doorbell "
		  "thread" },
		{ 9, case_pipelined_wait, "requests pipelined behind an "
		  "attach that waits keep their framing" },
		{ 10, case_open_claim, "a producer holds a claim open: moverd "
		  "sleeps" },
		{ 11, case_published_receiver_down, "11a: a consumer moves "
		  "published forward while B is down: A refuses the resume" },
		{ 11, case_published_sender_down, "11b: ... while A is down: B "
		  "refuses the open" },
		{ 11, case_published_both_down, "11c: ... while both are down: "
		  "B refuses the open (its records end short of published)" },
		{ 12, case_start_near_wrap, "a peer opens a flow at a start "
		  "near 2^64" },
		{ 13, case_failed_then_cut, "a receiver failed here, its "
		  "sender's connection gone before the CLOSE: it stays failed" },
		{ 14, case_dialed_opens, "a peer moverd dialed opens flows "
		  "back without keys: refused, moverd's own flow goes on" },
		{ 15, case_ack_body, "an acknowledgement with a body fails the "
		  "link" },
		{ 16, case_fanout_resume_beyond, "a fan-out peer resumes beyond "
		  "the producers' tail: only its subscription ends" },
		{ 17, case_far_resume, "a consumer moves published four rings "
		  "ahead while its moverd is down: that flow fails, the link "
		  "goes on" },
		{ 18, case_big_pad, "a pad larger than the deficit a flow "
		  "earns: the record after it goes" },
		{ 19, case_send_shrunk, "a client keeps its ring file short "
		  "under a send: that flow fails, the link goes on" },
		{ 20, case_full_then_gone, "a waiting client fills its buffer "
		  "and hangs up: moverd sees it go" },
		{ 21, case_status_crowded, "64 silent peer connections: status "
		  "still lists the one carrying a flow, and counts the rest" },
		{ 22, case_error_other_flow, "a link failed over another "
		  "user's flow: status does not name it to others" },
		{ 23, case_refused_walks, "opens refused after a restart walk "
		  "the unread records once" },
		{ 24, case_instance_claimed, "a fan-out peer that says another "
		  "peer's instance cannot end that peer's subscription" },
		{ 25, case_hangup_flood, "500 strangers hang up before their "
		  "hello: a few log lines, not one each" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_HOSTILE_CASES");
}
