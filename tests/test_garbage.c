/*
 * tests/test_garbage.c - hostile local clients that write garbage into the
 * rings they map, clients that truncate ring files, and connection floods
 * (issue 9, "Trust at every edge"), against real moverd processes.
 * FM_GARBAGE_CASES=1,3 runs only those cases.
 *
 *   usage: test_garbage MOVERD MOVERCTL FLOWCHECK
 *
 *   1  a local flow (a ring file since issue 15): a hostile producer of
 *      g1 and a hostile consumer of g2 write seeded garbage into every
 *      word class of the ring (control page: geometry copy, flags, tail,
 *      head, published, futex words and sleep flags; record headers:
 *      seal, len, info; payloads) while an honest client of each keeps
 *      using it and a checked flow l moves on the same daemon
 *   2  the same against flows between two daemons over TCP (file rings):
 *      a hostile producer of p1 on A (moverd scans that ring), a hostile
 *      consumer of p2 on B (moverd deposits into that ring); q moves on
 *      the same peer link
 *   3  a client truncates the ring file of a flow between hosts: the
 *      producer's on A, the consumer's on B; q moves meanwhile
 *   4  peer connection floods: 1000 connect/close cycles and 200 half-open
 *      handshakes (a partial frame header, a partial hello) with moverd's
 *      defaults and with generous caps; a flow from A moves meanwhile
 *   5  1000 connect/close cycles on the control socket (some with half a
 *      request); a local flow moves meanwhile
 *   6  single impossible words, written once (what case 2 finds only by
 *      chance): a producer on A stores tail two rings beyond moverd's send
 *      position; a producer on A, and a consumer on B, store FAILED in
 *      flags.  Each flow fails on both hosts and the honest client on the
 *      other host gets -EPROTO
 *   7  a ring file shrunk under a 1 MiB record in flight: received
 *      straight into B's consumer ring, sent from A's producer ring (the
 *      kernel's copy faults): that flow fails on both hosts, the link
 *      never drops, q moves on
 *   8  a sender ring's file truncated just before moverd's last touch of
 *      it (giving its slot back): before an orderly stop, and while a
 *      destroyed 256 MiB ring is punched out; moverd lives, exits 0
 *
 * Every case passes only if the checked flows deliver every record exactly
 * once (flowcheck), moverd stays alive and exits 0 on SIGTERM (no sanitizer
 * report), its cpu share is back under 0.3 once the attack ends and its fd
 * count back at its baseline.  The garbage is seeded (FM_GARBAGE_SEED,
 * default 9) and bounded (FM_GARBAGE_WRITES per attacker, default 200000).
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <stddef.h>
#include <sys/mman.h>

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin;

/* ---- daemons: none may outlive the test ---------------------------------- */

/* (harness.h tracks every daemon: none outlives a failed case) */

static void start(struct hd *d, const char *tag, bool listen,
		  const char *const *extra)
{
	hd_start(d, moverd_bin, tag, listen, extra);
}

/* ---- checked producers and consumers (tests/flowcheck.c) ----------------- */

#define REC_MAX 1000

static pid_t fc_produce(const struct hd *d, const char *flow,
			unsigned long count)
{
	char n[24];

	snprintf(n, sizeof(n), "%lu", count);
	return hx_spawn(d, 0, (const char *const[]){ flowcheck_bin, "produce",
			flow, "--id", "1", "--count", n, "--max-size", "1000",
			NULL });
}

static pid_t fc_consume(const struct hd *d, const char *flow,
			unsigned long count)
{
	char n[24];

	snprintf(n, sizeof(n), "%lu", count);
	return hx_spawn(d, 0, (const char *const[]){ flowcheck_bin, "consume",
			flow, "--producers", "1", "--count", n, "--max-size",
			"1000", NULL });
}

/* The flowcheck process must exit 0 within timeout_ms. */
static void fc_done(pid_t pid, const char *what, int timeout_ms)
{
	int rc = hx_wait(pid, timeout_ms);

	if (rc != 0) {
		fprintf(stderr, "%s: %s (exit %d)\n", what, rc < 0 ?
			"did not finish in time (killed)" : "failed", rc);
		exit(1);
	}
}

struct checked {
	pid_t prod, cons;
	const char *flow;
};

/* Checked records on flow: producer on dp, consumer on dc. */
static struct checked checked_start(const struct hd *dp, const struct hd *dc,
				    const char *flow, unsigned long count)
{
	struct checked c = { .flow = flow };

	c.cons = fc_consume(dc, flow, count);
	c.prod = fc_produce(dp, flow, count);
	return c;
}

static void checked_done(const struct checked *c)
{
	char what[64];

	snprintf(what, sizeof(what), "%s's producer", c->flow);
	fc_done(c->prod, what, 120000);
	snprintf(what, sizeof(what), "%s's consumer", c->flow);
	fc_done(c->cons, what, 10000);
	printf("  %s: every record exactly once\n", c->flow);
}

/* ---- moverctl views ------------------------------------------------------ */

/* A string value of moverctl's JSON in full (hj_get stops at a comma). */
static void json_string(const char *json, const char *key, char *val,
			size_t cap)
{
	char pat[80];
	const char *p;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "\"%s\": \"", key);
	p = strstr(json, pat);
	if (!p) {
		snprintf(pat, sizeof(pat), "\"%s\":\"", key);
		p = strstr(json, pat);
	}
	if (p)
		for (p += strlen(pat); *p && *p != '"' && n + 1 < cap; p++)
			val[n++] = *p == '\\' && p[1] ? *++p : *p;
	val[n] = 0;
}

static bool flow_state(const struct hd *d, const char *name, char *state,
		       size_t scap, char *reason, size_t rcap)
{
	char out[4096];

	if (hd_ctl(d, moverctl_bin, out, sizeof(out), "flow show %s --json",
		   name) != 0)
		return false;
	state[0] = reason[0] = 0;
	hj_get(out, "state", state, scap);
	json_string(out, "state_reason", reason, rcap);
	return true;
}

static void show_state(const struct hd *d, const char *side, const char *name)
{
	char state[32] = "", reason[256] = "";

	if (!flow_state(d, name, state, sizeof(state), reason, sizeof(reason)))
		snprintf(state, sizeof(state), "(gone)");
	printf("  %s: %s is %s%s%s\n", side, name, state, reason[0] ? ": " : "",
	       reason);
}

/* The cpu share over 2 s must be back near 0 (< 0.3: 2 noisy cores). */
static void cpu_settled(const struct hd *d, const char *side)
{
	double cpu = 1;

	/* a few tries: a neighbour's burst on a shared core is not ours */
	for (int i = 0; i < 3 && cpu >= 0.3; i++)
		cpu = hd_cpu_share(d, 2000);
	printf("  %s: cpu share over 2 s after the attack: %.3f\n", side, cpu);
	CHECK(cpu < 0.3);
}

static void fds_settled(const struct hd *d, const char *side, int base)
{
	hd_wait_fds(d, base);
	printf("  %s: %d fds (baseline %d)\n", side, hd_fds(d), base);
}

/* ---- garbage ------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	rng_state += 0x9e3779b97f4a7c15ull;
	return tu_mix(rng_state);
}

/*
 * A value for a word that held `cur`: random bits, a small or extreme
 * number, or something plausible (near cur), which is what gets past
 * checks that only catch the absurd.
 */
static uint64_t garbage_near(uint64_t cur)
{
	switch (rnd() % 8) {
	case 0: return rnd();
	case 1: return 0;
	case 2: return UINT64_MAX - rnd() % 64;
	case 3: return rnd() % 4096;
	case 4: return cur + rnd() % 256;
	case 5: return cur - rnd() % 256;
	case 6: return cur + (rnd() % 16) * 16;
	default: return cur ^ (1ull << (rnd() % 64));
	}
}

/* A seal that moverd or a client would take for real: a valid seal for
 * a position near pos, or for pos itself with another state. */
static uint64_t plausible_seal(const struct fr_ring *r, uint64_t pos)
{
	uint64_t p = pos + ((rnd() % 9) - 4) * 16;

	return fr_seal(r, rnd() % 4 ? pos : p, rnd() % 3 ? FR_SEAL_COMMITTED :
		       rnd() % 2 ? FR_SEAL_CLAIMED : rnd() % 8);
}

static void put64(_Atomic uint64_t *w, uint64_t v)
{
	/* relaxed: garbage has no order to keep */
	atomic_store_explicit(w, v, memory_order_relaxed);
}

static void put32(_Atomic uint32_t *w, uint32_t v)
{
	atomic_store_explicit(w, v, memory_order_relaxed);
}

static uint64_t get64(_Atomic uint64_t *w)
{
	return atomic_load_explicit(w, memory_order_relaxed);
}

/* A record-aligned position where someone is about to read: around head,
 * tail or published (whichever is plausible), or anywhere in the ring. */
static uint64_t hot_pos(const struct fr_ring *r)
{
	uint64_t base;

	switch (rnd() % 4) {
	case 0: base = fr_min_pos(r); break;
	case 1: base = get64(&r->sh->tail); break;
	case 2: base = get64(&r->sh->published); break;
	default: return rnd() & r->mask & ~(uint64_t)(FR_ALIGN - 1);
	}
	return (base + (rnd() % 32) * 16) & ~(uint64_t)(FR_ALIGN - 1);
}

/* One garbage write into word class `cls` (0..13) of ring r. */
static void garbage_write(const struct fr_ring *r, unsigned cls)
{
	struct fr_shared *sh = r->sh;
	uint64_t pos = hot_pos(r);
	struct fr_rec *h = fr_rec_at(r, pos);

	switch (cls) {
	case 0: { /* the geometry copy: any 8-byte word of line 0 */
		_Atomic uint64_t *g = (_Atomic uint64_t *)(void *)&sh->geo;

		put64(g + rnd() % (sizeof(sh->geo) / 8), rnd() % 2 ? rnd() :
		      rnd() % 65536);
		break;
	}
	case 1: put32(&sh->flags, (uint32_t)(rnd() % 2 ? rnd() : rnd() % 4));
		break;
	case 2: put32(&sh->recovered, (uint32_t)rnd()); break;
	case 3: put64(&sh->tail, garbage_near(get64(&sh->tail))); break;
	case 4: /* format 2: a subscriber's position, the floor, the mask */
		if (rnd() % 4 == 0)
			put32(&sh->sub_mask, (uint32_t)rnd());
		else
			put64(rnd() % 2 ? &sh->floor :
					  &sh->subs[rnd() % FR_MAX_SUBS].pos,
			      garbage_near(fr_min_pos(r)));
		break;
	case 5: put64(&sh->published, garbage_near(get64(&sh->published)));
		break;
	case 6: put32(&sh->data_futex, (uint32_t)rnd()); break;
	case 7: put32(&sh->consumers_waiting, (uint32_t)(rnd() % 3)); break;
	case 8: put32(&sh->space_futex, (uint32_t)rnd()); break;
	case 9: put32(&sh->producers_waiting, (uint32_t)rnd()); break;
	case 10: put64(&h->seal, rnd() % 2 ? plausible_seal(r, pos) : rnd());
		break;
	case 11: put32(&h->len, (uint32_t)garbage_near(r->max_record)); break;
	case 12: put32(&h->info, (uint32_t)(rnd() % 2 ? FR_INFO_PAD |
					   (uint32_t)rnd() : rnd()));
		break;
	default: /* payload bytes (or anything in the data area) */
		r->data[(pos + 16 + rnd() % 256) & r->mask] = (uint8_t)rnd();
		break;
	}
}

/* How much garbage one attacker writes (a bound, not a duration). */
static long garbage_writes(void)
{
	return tu_env_long("FM_GARBAGE_WRITES", 200000);
}

/*
 * A hostile client: attach to flow on d in role, write garbage (seed) into
 * every word class, in runs on one class at a time so that each can do its
 * damage, pausing now and then so that moverd reads between the writes.
 * Runs in a child; exits 0 when done.
 */
static pid_t attacker_start(const struct hd *d, const char *flow,
			    enum flowshm_role role, uint64_t seed)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid)
		return pid;
	flowshm_t *f = NULL;
	long n = garbage_writes();

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	if (flowshm_attach(flow, role, NULL, &f)) {
		fprintf(stderr, "attacker: attach %s: %s\n", flow,
			flowshm_attach_error());
		_exit(2);
	}
	rng_state = seed;
	for (long i = 0; i < n;) {
		unsigned cls = (unsigned)(rnd() % 14);

		/* CLOSED in flags ends every honest party's use of the ring
		 * at once: keep it for the last twentieth of the attack */
		if (cls == 1 && i < n - n / 20)
			cls = 0;
		long run = 1 + (long)(rnd() % 64);

		for (; run-- && i < n; i++)
			garbage_write(&f->ring, cls);
		usleep(rnd() % 4 ? 20 : 1000);
	}
	/* leave the ring as the garbage left it: no detach, no close */
	_exit(0);
}

/*
 * An honest client of the attacked flow: sends or receives small records
 * with short timeouts until the flow says -EPROTO or -EPIPE, or for at
 * most limit_ms.  Exit 0 = it saw -EPROTO, 3 = -EPIPE, 4 = neither in
 * time, 5 = an error no client should see; it must never crash or hang.
 * Returns once the client has attached (or failed to), so that an attack
 * that follows finds it there however slowly it started.
 */
static pid_t honest_start(const struct hd *d, const char *flow,
			  enum flowshm_role role, int limit_ms)
{
	int attached[2];
	char b;
	pid_t pid;

	fflush(NULL);
	CHECK(pipe(attached) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid) {
		struct pollfd pf = { attached[0], POLLIN, 0 };

		close(attached[1]);
		/* a byte once attached; none (EOF) if it exited first; 10 s
		 * at most (honest_done judges a client that never got there) */
		if (poll(&pf, 1, 10000) == 1)
			(void)!read(attached[0], &b, 1);
		close(attached[0]);
		return pid;
	}
	close(attached[0]);
	uint64_t until = tu_now_ns() + (uint64_t)limit_ms * 1000000ull;
	static uint8_t buf[1 << 16];
	unsigned long ok = 0, again = 0;
	flowshm_t *f = NULL;
	int rc = 0;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	if (flowshm_attach(flow, role, NULL, &f)) {
		fprintf(stderr, "honest: attach %s: %s\n", flow,
			flowshm_attach_error());
		_exit(2);
	}
	(void)!write(attached[1], "a", 1);
	close(attached[1]);
	memset(buf, 0x5a, sizeof(buf));
	while (tu_now_ns() < until) {
		size_t len = 0;

		if (role == FLOWSHM_PRODUCER)
			rc = flowshm_send(f, buf, 100, 20000000);
		else
			rc = flowshm_recv(f, buf, sizeof(buf), &len, 20000000);
		if (rc == 0)
			ok++;
		else if (rc == -EAGAIN || rc == -ETIMEDOUT || rc == -ENOTCONN ||
			 rc == -EHOSTDOWN || rc == -EMSGSIZE)
			again++; /* a timed-out send says why it waited */
		else
			break;
	}
	printf("  honest %s of %s: %lu records, %lu waits, then %s\n",
	       role == FLOWSHM_PRODUCER ? "producer" : "consumer", flow, ok,
	       again, rc == -EPROTO ? "-EPROTO" : rc == -EPIPE ? "-EPIPE" :
	       rc ? strerror(-rc) : "time");
	fflush(stdout);
	flowshm_detach(f);
	_exit(rc == -EPROTO ? 0 : rc == -EPIPE ? 3 :
	      (rc == 0 || rc == -EAGAIN || rc == -ETIMEDOUT ||
	       rc == -ENOTCONN || rc == -EHOSTDOWN || rc == -EMSGSIZE) ? 4 : 5);
}

/* The attacker must finish within 60 s (it is bounded: a hang is a bug). */
static void attacker_done(pid_t pid, const char *what)
{
	int rc = hx_wait(pid, 60000);

	printf("  %s: attacker done (exit %d)\n", what, rc);
	CHECK(rc == 0);
}

/*
 * The honest client's verdict: it must not crash; and what it got.  Exit 2
 * (attach refused: the ring's control page is corrupt) counts as a clear
 * error for a client that joins after the attack.
 */
static int honest_done(pid_t pid, const char *what, bool late)
{
	int rc = hx_wait(pid, 60000);

	if (rc == 2 && late)
		return 0;
	if (rc < 0 || rc >= 128 || rc == 5 || rc == 2) {
		fprintf(stderr, "%s: honest client failed (exit %d)\n", what,
			rc);
		exit(1);
	}
	return rc;
}

/* ---- case 1: garbage in a local flow's ring ------------------------------ */

#define L_RECORDS 30000

static void case_local(void)
{
	struct hd d;
	struct checked l;
	char out[4096];
	pid_t a1, a2, h1, h2;
	int base, r1, r2;

	start(&d, "garbage1", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create l "
		     "--ring-size 256K --max-record 1024") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create g1 "
		     "--ring-size 64K --max-record 1024") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create g2 "
		     "--ring-size 64K --max-record 1024") == 0);
	base = hd_fds(&d);
	l = checked_start(&d, &d, "l", L_RECORDS);
	h1 = honest_start(&d, "g1", FLOWSHM_CONSUMER, 15000);
	h2 = honest_start(&d, "g2", FLOWSHM_PRODUCER, 15000);
	usleep(200000);
	a1 = attacker_start(&d, "g1", FLOWSHM_PRODUCER,
			    (uint64_t)tu_env_long("FM_GARBAGE_SEED", 9));
	a2 = attacker_start(&d, "g2", FLOWSHM_CONSUMER,
			    (uint64_t)tu_env_long("FM_GARBAGE_SEED", 9) + 1);
	attacker_done(a1, "g1 (hostile producer)");
	attacker_done(a2, "g2 (hostile consumer)");
	hd_alive(&d);
	r1 = honest_done(h1, "g1", false);
	r2 = honest_done(h2, "g2", false);
	show_state(&d, "moverd", "g1");
	show_state(&d, "moverd", "g2");
	/* a local flow's words are read only by its clients: the honest one
	 * must see the corruption as -EPROTO (or a closed flow) */
	CHECK(r1 == 0 || r1 == 3);
	CHECK(r2 == 0 || r2 == 3);
	checked_done(&l);
	cpu_settled(&d, "moverd");
	fds_settled(&d, "moverd", base);
	hd_stop(&d);
}

/* ---- case 2: garbage in the file rings of flows between hosts ------------ */

#define Q_RECORDS 30000

/* A (sender, no listen) and B (receiver); flows NAMES from A to B. */
static void two_daemons(struct hd *a, struct hd *b, const char *tag,
			const char *const *names, const char *const *b_extra)
{
	static const char *const tcp[] = { "--transport", "tcp", NULL };
	char ta[32], tb[32], out[4096];

	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	start(b, tb, true, b_extra);
	start(a, ta, false, tcp);
	for (; *names; names++) {
		CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create "
			     "%s --peer 127.0.0.1:%d --ring-size 64K "
			     "--max-record 1024", *names, b->port) == 0);
		CHECK(hd_wait_state(a, moverctl_bin, *names, "open", 10000,
				    NULL, 0));
		CHECK(hd_wait_state(b, moverctl_bin, *names, "open", 10000,
				    NULL, 0));
	}
}

/*
 * The attacked flow of a pair of daemons ends one of two ways.  Failed on
 * both, with a reason (the daemon whose ring was attacked found it, the
 * other was told), and its honest client on the other host got -EPROTO,
 * not a wait without end.  Or failed on neither: nothing moverd reads was
 * impossible (the garbage became records or padding of that flow).  Never
 * failed on one host while the other waits for it.
 */
static void attacked_verdict(const struct hd *a, const struct hd *b,
			     const char *flow, int other_rc)
{
	char sa[32] = "", sb[32] = "", ra[256], rb[256];

	CHECK(flow_state(a, flow, sa, sizeof(sa), ra, sizeof(ra)));
	CHECK(flow_state(b, flow, sb, sizeof(sb), rb, sizeof(rb)));
	printf("  %s: A: %s%s%s; B: %s%s%s; its honest client on the other "
	       "host: %s\n", flow, sa, ra[0] ? ": " : "", ra, sb,
	       rb[0] ? ": " : "", rb, other_rc == 0 ? "-EPROTO" :
	       other_rc == 3 ? "-EPIPE" : "nothing (its time ran out)");
	if (strcmp(sa, "failed") && strcmp(sb, "failed")) {
		printf("  %s: the garbage was absorbed (failed nowhere)\n",
		       flow);
		return;
	}
	CHECK(!strcmp(sa, "failed") && ra[0]);
	CHECK(!strcmp(sb, "failed") && rb[0]);
	CHECK(other_rc == 0);
}

/* A pair of daemons after an attack: idle again, fds at their baselines,
 * then stopped (exit 0: no sanitizer report). */
static void settled_and_stopped(struct hd *a, struct hd *b, int base_a,
				int base_b)
{
	cpu_settled(a, "A");
	cpu_settled(b, "B");
	fds_settled(a, "A", base_a);
	fds_settled(b, "B", base_b);
	hd_stop(a);
	hd_stop(b);
}

static void case_remote(void)
{
	static const char *const names[] = { "p1", "p2", "q", NULL };
	uint64_t seed = (uint64_t)tu_env_long("FM_GARBAGE_SEED", 9);
	struct hd a, b;
	struct checked q;
	pid_t a1, a2, h1, h1p, h2, h2c;
	int base_a, base_b, r1, r2;

	two_daemons(&a, &b, "garbage2", names, NULL);
	base_a = hd_fds(&a);
	base_b = hd_fds(&b);
	q = checked_start(&a, &b, "q", Q_RECORDS);
	/* p1: an honest producer and consumer, and a hostile producer on A */
	h1 = honest_start(&b, "p1", FLOWSHM_CONSUMER, 20000);
	h1p = honest_start(&a, "p1", FLOWSHM_PRODUCER, 20000);
	/* p2: an honest producer on A, a hostile consumer on B, and an
	 * honest consumer on B that joins when the attack is over */
	h2 = honest_start(&a, "p2", FLOWSHM_PRODUCER, 20000);
	usleep(300000);
	a1 = attacker_start(&a, "p1", FLOWSHM_PRODUCER, seed + 2);
	a2 = attacker_start(&b, "p2", FLOWSHM_CONSUMER, seed + 3);
	attacker_done(a1, "p1 (hostile producer on A)");
	attacker_done(a2, "p2 (hostile consumer on B)");
	hd_alive(&a);
	hd_alive(&b);
	h2c = honest_start(&b, "p2", FLOWSHM_CONSUMER, 5000);
	r1 = honest_done(h1, "p1's consumer on B", false);
	honest_done(h1p, "p1's producer on A", false);
	r2 = honest_done(h2, "p2's producer on A", false);
	honest_done(h2c, "p2's late consumer on B", true);
	attacked_verdict(&a, &b, "p1", r1);
	attacked_verdict(&a, &b, "p2", r2);
	checked_done(&q);
	settled_and_stopped(&a, &b, base_a, base_b);
}

/* ---- case 3: clients truncate the ring files ----------------------------- */

static void truncate_ring(const struct hd *d, const char *side,
			  const char *flow, Flowmover__Role role, int *sock,
			  int *fd)
{
	struct stat s;
	int rc;

	*fd = hd_attach_fd(d, flow, role, sock);
	rc = ftruncate(*fd, 4096);
	CHECK(fstat(*fd, &s) == 0);
	printf("  %s: ftruncate of %s's ring: %s, its size now %lld\n", side,
	       flow, rc ? strerror(errno) : "done", (long long)s.st_size);
}

/*
 * A client of the truncated ring that comes after the repair must hear of
 * the failure: -EPROTO at its first use, or its attach refused.
 */
static void late_client_told(const struct hd *d, const char *flow,
			     enum flowshm_role role)
{
	int rc = honest_done(honest_start(d, flow, role, 3000), flow, true);

	CHECK(rc == 0);
}

static void case_truncate(void)
{
	static const char *const names[] = { "p1", "p2", "q", NULL };
	struct hd a, b;
	struct checked q;
	pid_t h1, h2;
	int base_a, base_b, s1, f1, s2, f2, r1, r2;

	two_daemons(&a, &b, "garbage3", names, NULL);
	base_a = hd_fds(&a);
	base_b = hd_fds(&b);
	q = checked_start(&a, &b, "q", Q_RECORDS);
	/* the honest clients on the other host of each truncated ring (a
	 * client of the truncated mapping itself may die of SIGBUS: that is
	 * between it and whoever truncated its ring) */
	h1 = honest_start(&b, "p1", FLOWSHM_CONSUMER, 15000);
	h2 = honest_start(&a, "p2", FLOWSHM_PRODUCER, 15000);
	usleep(300000);
	truncate_ring(&a, "A", "p1", FLOWMOVER__ROLE__PRODUCER, &s1, &f1);
	truncate_ring(&b, "B", "p2", FLOWMOVER__ROLE__CONSUMER, &s2, &f2);
	hd_alive(&a);
	hd_alive(&b);
	r1 = honest_done(h1, "p1's consumer on B", false);
	r2 = honest_done(h2, "p2's producer on A", false);
	attacked_verdict(&a, &b, "p1", r1);
	attacked_verdict(&a, &b, "p2", r2);
	/* a truncated ring is always found (once a second) */
	CHECK(r1 == 0 && r2 == 0);
	close(f1);
	close(s1);
	close(f2);
	close(s2); /* p2 takes one consumer at a time */
	usleep(200000);
	late_client_told(&a, "p1", FLOWSHM_PRODUCER);
	late_client_told(&b, "p2", FLOWSHM_CONSUMER);
	checked_done(&q);
	settled_and_stopped(&a, &b, base_a, base_b);
}

/* ---- case 6: one impossible word each, written once ----------------------- */

/* A raw client of flow on d (the test process itself). */
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

/*
 * A producer of flow on A leaves a garbage seal where moverd sends next and
 * stores tail two rings beyond it: moverd's recovery check finds the tail
 * impossible (-EPROTO), which must fail the flow, not be ignored.
 */
static flowshm_t *tail_beyond(const struct hd *a, const char *flow)
{
	flowshm_t *f = attach_raw(a, flow, FLOWSHM_PRODUCER);
	uint64_t tail;

	CHECK_RC(flowshm_send(f, "x", 1, 1000000000), 0);
	usleep(300000); /* moverd sent it: its send position is tail */
	/* acquire: the producers' claim position */
	tail = atomic_load_explicit(&f->ring.sh->tail, memory_order_acquire);
	put64(&fr_rec_at(&f->ring, tail)->seal, 0x0123456789abcdefull);
	/* release: what a producer's claim does */
	atomic_store_explicit(&f->ring.sh->tail, tail + 2 * f->ring.size,
			      memory_order_release);
	printf("  %s: producer tail %llu stored as %llu\n", flow,
	       (unsigned long long)tail,
	       (unsigned long long)(tail + 2 * f->ring.size));
	return f;
}

/* A client of flow on d marks the ring failed (as only moverd may). */
static flowshm_t *mark_failed(const struct hd *d, const char *flow,
			      enum flowshm_role role)
{
	flowshm_t *f = attach_raw(d, flow, role);

	/* release: as fr_fail does, without the wakes */
	atomic_fetch_or_explicit(&f->ring.sh->flags, FR_FLAG_CLOSED |
				 FR_FLAG_FAILED, memory_order_release);
	printf("  %s: a %s stored CLOSED|FAILED in flags\n", flow,
	       role == FLOWSHM_PRODUCER ? "producer" : "consumer");
	return f;
}

static void case_words(void)
{
	static const char *const names[] = { "p1", "p2", "p3", "q", NULL };
	struct hd a, b;
	struct checked q;
	flowshm_t *f1, *f2, *f3;
	pid_t h1, h2, h3;
	int base_a, base_b, r1, r2, r3;

	two_daemons(&a, &b, "garbage6", names, NULL);
	base_a = hd_fds(&a);
	base_b = hd_fds(&b);
	q = checked_start(&a, &b, "q", Q_RECORDS);
	h1 = honest_start(&b, "p1", FLOWSHM_CONSUMER, 10000);
	h2 = honest_start(&b, "p2", FLOWSHM_CONSUMER, 10000);
	h3 = honest_start(&a, "p3", FLOWSHM_PRODUCER, 10000);
	usleep(300000);
	f1 = tail_beyond(&a, "p1");
	f2 = mark_failed(&a, "p2", FLOWSHM_PRODUCER);
	f3 = mark_failed(&b, "p3", FLOWSHM_CONSUMER);
	r1 = honest_done(h1, "p1's consumer on B", false);
	r2 = honest_done(h2, "p2's consumer on B", false);
	r3 = honest_done(h3, "p3's producer on A", false);
	attacked_verdict(&a, &b, "p1", r1);
	attacked_verdict(&a, &b, "p2", r2);
	attacked_verdict(&a, &b, "p3", r3);
	/* these words are always found */
	CHECK(r1 == 0 && r2 == 0 && r3 == 0);
	flowshm_detach(f1);
	flowshm_detach(f2);
	flowshm_detach(f3);
	checked_done(&q);
	settled_and_stopped(&a, &b, base_a, base_b);
}

/* ---- case 4: peer connection floods -------------------------------------- */

#define HALF_OPEN 200
#define CYCLES 1000

/* Under AddressSanitizer freed memory waits in a quarantine that would
 * count as growth: keep it small. */
static void small_asan_quarantine(void)
{
	const char *asan = getenv("ASAN_OPTIONS");
	char opts[512];

	if (asan && strstr(asan, "quarantine_size_mb"))
		return;
	snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4",
		 asan ? asan : "", asan && *asan ? ":" : "");
	setenv("ASAN_OPTIONS", opts, 1);
}

/* A connection to port, or -1 if refused or reset at once. */
static int try_connect(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Half a frame header, a header with half its body, or half a hello. */
static void half_handshake(int fd, unsigned k)
{
	uint8_t h[WIRE_HDR], body[64];
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerHello hello = FLOWMOVER__PEER_HELLO__INIT;
	size_t len;

	hello.version = WIRE_VERSION;
	hello.node = "half-open";
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_HELLO;
	msg.hello = &hello;
	len = protobuf_c_message_get_packed_size(&msg.base);
	CHECK(len <= sizeof(body));
	protobuf_c_message_pack(&msg.base, body);
	wire_put(h, WIRE_CTRL, 0, (uint32_t)len, 0, 0);
	switch (k % 3) {
	case 0: hp_send_all(fd, h, WIRE_HDR / 2); break;
	case 1: hp_send_all(fd, h, WIRE_HDR); break;
	default:
		hp_send_all(fd, h, WIRE_HDR);
		hp_send_all(fd, body, len / 2);
		break;
	}
}

/* Has moverd closed fd (EOF or reset) within timeout_ms?  What it sends
 * meanwhile (a heartbeat) is read and dropped. */
static bool closed_by_peer(int fd, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	char buf[256];

	do {
		struct pollfd p = { fd, POLLIN, 0 };
		uint64_t now = tu_now_ns();
		int left = now < until ? (int)((until - now) / 1000000) : 0;

		if (poll(&p, 1, left) <= 0)
			return false;
		if (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0)
			return true;
	} while (tu_now_ns() < until);
	return false;
}

static void peer_flood(struct hd *b, const char *what)
{
	int fds[HALF_OPEN], held = 0, dropped = 0, refused = 0, base;
	long rss0, rss_peak = 0, rss1;
	uint64_t t0 = tu_now_ns();
	double cpu;

	base = hd_fds(b);
	/*
	 * A warm-up round first (HALF_OPEN connections, closed by us): the
	 * allocator's pools and, under ASan, its quarantine grow to their
	 * working size once; what must not grow is what each flood adds.
	 */
	for (int i = 0; i < HALF_OPEN; i++) {
		fds[i] = try_connect(b->port);
		if (fds[i] >= 0)
			half_handshake(fds[i], (unsigned)i);
	}
	usleep(300000);
	for (int i = 0; i < HALF_OPEN; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	hd_wait_fds(b, base);
	rss0 = hd_rss_kb(b);
	for (int i = 0; i < CYCLES; i++) {
		int fd = try_connect(b->port);

		if (fd < 0) {
			refused++;
			continue;
		}
		if (i % 4 == 1)
			half_handshake(fd, (unsigned)i);
		close(fd);
	}
	printf("  %s: %d connect/close cycles in %.2f s (%d refused at "
	       "connect)\n", what, CYCLES, (tu_now_ns() - t0) / 1e9, refused);
	t0 = tu_now_ns();
	for (int i = 0; i < HALF_OPEN; i++) {
		fds[i] = try_connect(b->port);
		if (fds[i] >= 0)
			half_handshake(fds[i], (unsigned)i);
	}
	usleep(500000);
	for (int i = 0; i < HALF_OPEN; i++)
		held += fds[i] >= 0 && !closed_by_peer(fds[i], 0);
	rss_peak = hd_rss_kb(b);
	printf("  %s: %d half-open handshakes, %d still open after 0.5 s; "
	       "moverd holds %d fds (baseline %d), rss +%ld KiB\n", what,
	       HALF_OPEN, held, hd_fds(b), base, rss_peak - rss0);
	/* the hello deadline (2 s) closes every one of them */
	for (int i = 0; i < HALF_OPEN; i++)
		if (fds[i] >= 0 && closed_by_peer(fds[i], 8000))
			dropped++;
		else if (fds[i] < 0)
			dropped++;
	printf("  %s: %d of %d closed by moverd within %.1f s\n", what,
	       dropped, HALF_OPEN, (tu_now_ns() - t0) / 1e9);
	for (int i = 0; i < HALF_OPEN; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	CHECK(dropped == HALF_OPEN);
	hd_alive(b);
	cpu = hd_cpu_share(b, 2000);
	for (int i = 0; i < 2 && cpu >= 0.3; i++)
		cpu = hd_cpu_share(b, 2000);
	hd_wait_fds(b, base);
	rss1 = hd_rss_kb(b);
	printf("  %s: after: cpu %.3f, %d fds (baseline %d), rss %ld KiB "
	       "(baseline %ld, +%ld)\n", what, cpu, hd_fds(b), base, rss1,
	       rss0, rss1 - rss0);
	CHECK(cpu < 0.3);
	CHECK(rss1 - rss0 < 8 * 1024);
}

static void case_peer_flood(void)
{
	static const char *const names[] = { "q", NULL };
	static const char *const dflt[] = { "--peer-hello-timeout", "2",
					    NULL };
	static const char *const generous[] = { "--peer-hello-timeout", "2",
		"--peer-max-conns-per-addr", "1000", "--peer-max-pending",
		"1000", NULL };
	const char *const *opts[] = { dflt, generous };
	const char *what[] = { "defaults", "generous caps" };

	small_asan_quarantine();
	for (int i = 0; i < 2; i++) {
		struct hd a, b;
		struct checked q;

		printf("  -- %s\n", what[i]);
		two_daemons(&a, &b, i ? "garbage4g" : "garbage4d", names,
			    opts[i]);
		q = checked_start(&a, &b, "q", Q_RECORDS);
		peer_flood(&b, what[i]);
		checked_done(&q);
		CHECK(hd_log_count(&a, "disconnect") == 0);
		hd_stop(&a);
		hd_stop(&b);
	}
}

/* ---- case 5: control socket flood ---------------------------------------- */

static void case_ctl_flood(void)
{
	struct hd d;
	struct checked l;
	char out[4096];
	long rss0, rss1;
	int base, refused = 0;
	uint64_t t0;

	small_asan_quarantine();
	start(&d, "garbage5", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create l "
		     "--ring-size 256K --max-record 1024") == 0);
	base = hd_fds(&d);
	rss0 = hd_rss_kb(&d);
	l = checked_start(&d, &d, "l", L_RECORDS);
	t0 = tu_now_ns();
	for (int i = 0; i < CYCLES; i++) {
		int fd = ctl_connect(d.sock);
		uint8_t half[3] = { 0x40, 0, 0 }; /* a length, then nothing */

		if (fd < 0) {
			refused++;
			continue;
		}
		if (i % 3 == 1 && write(fd, half, sizeof(half)) < 0)
			refused++;
		close(fd);
	}
	printf("  %d control connect/close cycles in %.2f s (%d failed)\n",
	       CYCLES, (tu_now_ns() - t0) / 1e9, refused);
	CHECK(refused == 0);
	hd_alive(&d);
	checked_done(&l);
	cpu_settled(&d, "moverd");
	fds_settled(&d, "moverd", base);
	rss1 = hd_rss_kb(&d);
	printf("  rss %ld KiB (baseline %ld, +%ld)\n", rss1, rss0, rss1 - rss0);
	CHECK(rss1 - rss0 < 8 * 1024);
	hd_stop(&d);
}

/* ---- case 7: a ring file shrunk under a record in flight ------------------- */

#define BIG_RECORD (1u << 20)

static void big_flow(const struct hd *a, const struct hd *b, const char *name)
{
	char out[4096];

	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create %s --peer "
		     "127.0.0.1:%d --ring-size 4M --max-record 1M", name,
		     b->port) == 0);
	CHECK(hd_wait_state(a, moverctl_bin, name, "open", 10000, NULL, 0));
	CHECK(hd_wait_state(b, moverctl_bin, name, "open", 10000, NULL, 0));
}

/* Failed on both hosts, with a reason. */
static void failed_on_both(const struct hd *a, const struct hd *b,
			   const char *flow)
{
	char why[256];

	CHECK(hd_wait_state(a, moverctl_bin, flow, "failed", 10000, why,
			    sizeof(why)));
	printf("  %s on A: failed: %s\n", flow, why);
	CHECK(hd_wait_state(b, moverctl_bin, flow, "failed", 10000, why,
			    sizeof(why)));
	printf("  %s on B: failed: %s\n", flow, why);
}

static uint64_t reconnects(const struct hd *d)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	return hj_u64(out, "reconnects");
}

/*
 * The kernel's copy into or out of a ring whose file a client shrank
 * faults (EFAULT) where moverd's own touch would be SIGBUS (the audit of
 * 2026-11-28: B dropped the whole link, "receive: Bad address", and every
 * flow on it went to reconnecting).  On B, with moverd stopped, a consumer
 * of t2 shrinks its ring to the control page and 8 KiB before a 1 MiB
 * record arrives (the body is received straight into the ring); on A, with
 * moverd stopped, a
 * producer of t1 commits a 1 MiB record and shrinks the file to the page
 * of its header, which moverd reads before it sends the body from the
 * pages that are gone.  Each flow fails on both hosts; the link never
 * drops; q delivers every record once.
 */
static void case_shrunk_in_flight(void)
{
	static const char *const names[] = { "q", NULL };
	static uint8_t rec[BIG_RECORD];
	struct hd a, b;
	struct checked q;
	flowshm_t *p1, *p2;
	int base_a, base_b, s1, f1, s2, f2, rc;

	two_daemons(&a, &b, "garbage7", names, NULL);
	big_flow(&a, &b, "t1");
	big_flow(&a, &b, "t2");
	base_a = hd_fds(&a);
	base_b = hd_fds(&b);
	q = checked_start(&a, &b, "q", Q_RECORDS);
	memset(rec, 0x5a, sizeof(rec));

	/* B stopped while the file shrinks and the record goes: the once-a-
	 * second file check cannot fail t2 first (it did, under ASan) */
	f2 = hd_attach_fd(&b, "t2", FLOWMOVER__ROLE__CONSUMER, &s2);
	p2 = attach_raw(&a, "t2", FLOWSHM_PRODUCER);
	CHECK(kill(b.pid, SIGSTOP) == 0);
	CHECK(ftruncate(f2, FR_CTRL_BYTES + 8192) == 0);
	rc = flowshm_send(p2, rec, sizeof(rec), 5000000000ll);
	CHECK(kill(b.pid, SIGCONT) == 0);
	CHECK_RC(rc, 0);
	failed_on_both(&a, &b, "t2");

	f1 = hd_attach_fd(&a, "t1", FLOWMOVER__ROLE__PRODUCER, &s1);
	p1 = attach_raw(&a, "t1", FLOWSHM_PRODUCER);
	CHECK(kill(a.pid, SIGSTOP) == 0);
	CHECK_RC(flowshm_send(p1, rec, sizeof(rec), 0), 0);
	CHECK(ftruncate(f1, FR_CTRL_BYTES + 4096) == 0);
	CHECK(kill(a.pid, SIGCONT) == 0);
	failed_on_both(&a, &b, "t1");

	hd_alive(&a);
	hd_alive(&b);
	printf("  'Bad address' in the logs: A %d, B %d; reconnects A %llu, "
	       "B %llu\n", hd_log_count(&a, "Bad address"),
	       hd_log_count(&b, "Bad address"),
	       (unsigned long long)reconnects(&a),
	       (unsigned long long)reconnects(&b));
	CHECK(hd_log_count(&a, "Bad address") == 0);
	CHECK(hd_log_count(&b, "Bad address") == 0);
	CHECK(reconnects(&a) == 0 && reconnects(&b) == 0);
	checked_done(&q);
	flowshm_detach(p1);
	flowshm_detach(p2);
	close(f1);
	close(s1);
	close(f2);
	close(s2);
	settled_and_stopped(&a, &b, base_a, base_b);
}

/* ---- case 8: a ring file truncated before moverd's last touch ----------- */

/*
 * moverd holds a slot in every sender ring and gives it back when it lets
 * the ring go, writing the ring's control page: at an orderly stop
 * (unmap_kept) and once a destroyed ring's pages are punched out
 * (remains_free).  Both dropped the SIGBUS guard first, so a client that
 * truncated the file just before killed moverd.  (a) truncate, then
 * SIGTERM: moverd exits 0 (it did before the fix too: this order let the
 * flow checks see the truncation first); (b) destroy, then truncate while
 * the 256 MiB ring is punched: moverd lives and exits 0 (SIGBUS, status
 * 7, before the fix).
 */
static void case_last_touch(void)
{
	char out[4096];
	int sock, fd;
	struct hd a;

	hd_start(&a, moverd_bin, "garbage8a", false, NULL);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create s8 "
		     "--peer 127.0.0.1:1 --ring-size 64K") == 0);
	fd = hd_attach_fd(&a, "s8", FLOWMOVER__ROLE__PRODUCER, &sock);
	CHECK(ftruncate(fd, 0) == 0);
	hd_stop(&a); /* exits 0, or the test fails here */
	printf("  (a) s8's ring truncated, then SIGTERM: moverd exited 0\n");
	close(fd);
	close(sock);

	hd_start(&a, moverd_bin, "garbage8b", false, NULL);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create s8 "
		     "--peer 127.0.0.1:1 --ring-size 256M") == 0);
	fd = hd_attach_fd(&a, "s8", FLOWMOVER__ROLE__PRODUCER, &sock);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow destroy s8")
	      == 0);
	CHECK(ftruncate(fd, 0) == 0);
	usleep(500000); /* the punch, then its last touch */
	hd_alive(&a);
	close(fd);
	close(sock);
	hd_stop(&a);
	printf("  (b) s8 destroyed, its ring truncated while punched: moverd "
	       "lived and exited 0\n");
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_local, "garbage in a local flow's memfd ring (a "
		  "hostile producer, a hostile consumer)" },
		{ 2, case_remote, "garbage in the file rings of flows between "
		  "hosts (producer on A, consumer on B)" },
		{ 3, case_truncate, "clients truncate ring files (producer on "
		  "A, consumer on B)" },
		{ 4, case_peer_flood, "peer connection floods: connect/close "
		  "and half-open handshakes" },
		{ 5, case_ctl_flood, "control socket connect/close flood" },
		{ 6, case_words, "one impossible word each: a producer's tail "
		  "beyond the ring, FAILED stored by a producer and by a "
		  "consumer" },
		{ 7, case_shrunk_in_flight, "ring files shrunk under a record "
		  "in flight (received into B's, sent from A's): that flow "
		  "fails, the link stays up" },
		{ 8, case_last_touch, "a sender ring's file truncated before "
		  "moverd lets it go (an orderly stop, a destroy): moverd "
		  "lives" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK\n",
			argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_GARBAGE_CASES");
}
