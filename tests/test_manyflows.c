/*
 * test_manyflows - many flows between two real daemons over TCP (issue 12).
 *
 *   1. FM_MANYFLOWS_N flows (default 1000) from A to B; records on the
 *      first, the 500th, the last and a few picked at random, each
 *      delivered exactly once with the right content, nothing on the others
 *   2. flows created and destroyed in a loop (FM_MANYFLOWS_CHURN, default
 *      1000) while records move on two other flows: those get every record
 *      exactly once; moverd's fds and RSS come back near their baseline
 *   3. FM_MANYFLOWS_IDLE idle flows (default 300) for 7 s: no reconnect
 *      (heartbeats on the timer's deadlines, a dead peer's 5 s passed),
 *      each daemon under 25 wake-ups a second (the 20 ms tick was 50),
 *      and a record still crosses
 *
 * No timing is asserted.  The defaults take ~5-15 s here, ~11 s under
 * ASan+UBSan; FM_MANYFLOWS_N=10000 ~10 s and FM_MANYFLOWS_CHURN=10000 ~15 s
 * (release; case 1 took over 10 minutes before counters.c stopped looking
 * through every record for each flow the counters file has no room for).
 * Both daemons get --max-flows and --peer-max-flows above the counts: the
 * defaults (16384 flows, 64 per peer host) are limits, not targets.
 * FM_MANYFLOWS_CASES=1,2 selects cases.
 *
 * usage: test_manyflows MOVERD MOVERCTL
 */
#include "harness.h"

#include <inttypes.h>
#include <sys/random.h>
#include <sys/resource.h>

#define RING 65536
#define MAX_RECORD 256

static const char *moverd_bin, *moverctl_bin;
static bool skipped; /* a case could not run here: exit 77 */

/* ---- two daemons ------------------------------------------------------------ */

/* B listens; A sends; both may hold n flows (more than the defaults). */
static void two_daemons(struct hd *a, struct hd *b, const char *tag,
			unsigned n)
{
	char flows[16], ta[32], tb[32];
	const char *const b_extra[] = { "--max-flows", flows,
					"--peer-max-flows", flows, NULL };
	const char *const a_extra[] = { "--transport", "tcp", "--max-flows",
					flows, "--log-level", "info", NULL };

	snprintf(flows, sizeof(flows), "%u", n + 64);
	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	hd_start(b, moverd_bin, tb, true, b_extra);
	hd_start(a, moverd_bin, ta, false, a_extra);
}

/* Create flow name on A with --peer B over A's control connection sock
 * (a raw request: a thousand moverctl processes would take longer). */
static int create_remote(int sock, const struct hd *b, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec spec = FLOWMOVER__FLOW_SPEC__INIT;
	char peer[64];

	snprintf(peer, sizeof(peer), "127.0.0.1:%d", b->port);
	spec.name = (char *)name;
	spec.ring_size = RING;
	spec.max_record = MAX_RECORD;
	spec.peer = peer;
	cr.spec = &spec;
	req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	req.create = &cr;
	return hc_call(sock, &req, NULL);
}

/* flows the daemon holds (moverctl --json status). */
static uint64_t flow_count(const struct hd *d)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	return hj_u64(out, "flows");
}

/* Wait up to timeout_ms until d holds exactly want flows. */
static void wait_flow_count(const struct hd *d, uint64_t want, int timeout_ms)
{
	uint64_t until = tu_now_ns() + (uint64_t)timeout_ms * 1000000ull, n;

	while ((n = flow_count(d)) != want && tu_now_ns() < until) {
		hd_alive(d);
		usleep(50000);
	}
	if (n != want)
		fprintf(stderr, "%s holds %" PRIu64 " flows, want %" PRIu64 "\n",
			d->dir, n, want);
	CHECK(n == want);
}

/* ---- clients ---------------------------------------------------------------- */

static flowshm_t *attach_retry(const struct hd *d, const char *name,
			       enum flowshm_role role)
{
	uint64_t until = tu_now_ns() + 15000000000ull;
	flowshm_t *f = NULL;
	int rc;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	while ((rc = flowshm_attach(name, role, NULL, &f)) == -ENOENT &&
	       tu_now_ns() < until)
		usleep(20000);
	if (rc)
		fprintf(stderr, "attach %s: %s: %s\n", name,
			flowshm_strerror(rc), flowshm_attach_error());
	CHECK_RC(rc, 0);
	return f;
}

/* A child sending `count` records of flow number id (tu_fill contents). */
static pid_t produce(const struct hd *a, const char *name, uint32_t id,
		     uint64_t count)
{
	pid_t pid = hd_fork_client(a);

	if (pid)
		return pid;
	{
		flowshm_t *p = attach_retry(a, name, FLOWSHM_PRODUCER);
		unsigned char buf[MAX_RECORD];

		for (uint64_t seq = 0; seq < count; seq++) {
			size_t len = tu_rec_len(id, seq, 16, MAX_RECORD);

			tu_fill(buf, id, seq, len);
			CHECK_RC(flowshm_send(p, buf, len, 30000000000ll), 0);
		}
		flowshm_detach(p);
	}
	_exit(0);
}

/*
 * A child receiving flow number id on B: exactly `count` records, seq 0..
 * count-1 in order, each with the contents tu_fill gives them, then no
 * further record for 500 ms (none twice).
 */
static pid_t consume(const struct hd *b, const char *name, uint32_t id,
		     uint64_t count)
{
	pid_t pid = hd_fork_client(b);

	if (pid)
		return pid;
	{
		flowshm_t *c = attach_retry(b, name, FLOWSHM_CONSUMER);
		unsigned char buf[MAX_RECORD];
		uint64_t seq;
		uint32_t who;
		size_t len;

		for (uint64_t n = 0; n < count; n++) {
			int rc = flowshm_recv(c, buf, sizeof(buf), &len,
					      30000000000ll);

			if (rc)
				fprintf(stderr, "%s: record %" PRIu64 ": %s\n",
					name, n, flowshm_strerror(rc));
			CHECK_RC(rc, 0);
			if (!tu_verify(buf, len, &who, &seq) || who != id ||
			    seq != n) {
				fprintf(stderr, "%s: record %" PRIu64 " is not "
					"flow %u's record %" PRIu64 " (%zu bytes, "
					"flow %u seq %" PRIu64 ")\n", name, n,
					id, n, len, who, seq);
				exit(1);
			}
		}
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 500000000ll),
			 -ETIMEDOUT);
		flowshm_detach(c);
	}
	_exit(0);
}

static void wait_ok(pid_t pid, const char *what, int timeout_ms)
{
	int rc = hx_wait(pid, timeout_ms);

	if (rc)
		fprintf(stderr, "%s: exit %d\n", what, rc);
	CHECK(rc == 0);
}

/* ---- 1: N flows, records on the first, the 500th, the last, random ones ---- */

#define PICKS 8

/* Can each daemon hold n ring fds (and its sockets)?  moverd raises its
 * soft RLIMIT_NOFILE to the hard one it inherits from us; under that
 * (a container's 4096, say) n flows cannot be asked of it, and the case
 * says so instead of failing. */
static bool fds_for(unsigned n)
{
	struct rlimit rl;

	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= (rlim_t)n + 256)
		return true;
	printf("  SKIPPED: the hard RLIMIT_NOFILE here, %llu, is below the "
	       "%u fds %u flows need\n", (unsigned long long)rl.rlim_max,
	       n + 256, n);
	skipped = true;
	return false;
}

static void case_many(void)
{
	unsigned n = (unsigned)tu_env_long("FM_MANYFLOWS_N", 1000);
	unsigned pick[PICKS] = { 0, n >= 500 ? 499 : n / 2, n - 1 };
	uint64_t count = 500;
	pid_t cons[PICKS], prod[PICKS];
	char name[32];
	struct hd a, b;
	int sock;

	CHECK(n >= PICKS); /* PICKS distinct flows */
	if (!fds_for(n))
		return;
	two_daemons(&a, &b, "many1", n);
	sock = ctl_connect(a.sock);
	CHECK(sock >= 0);
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "m%u", i);
		CHECK_RC(create_remote(sock, &b, name), 0);
	}
	close(sock);
	wait_flow_count(&a, n, 10000);
	wait_flow_count(&b, n, 60000);
	printf("  %u flows on A and on B\n", n);
	/* five more, distinct, picked at random */
	for (unsigned k = 3; k < PICKS; k++) {
		bool dup;

		do {
			uint32_t r = 0;

			CHECK(getrandom(&r, sizeof(r), 0) == sizeof(r));
			pick[k] = r % n;
			dup = false;
			for (unsigned j = 0; j < k; j++)
				dup |= pick[j] == pick[k];
		} while (dup);
	}
	printf("  records on flows");
	for (unsigned k = 0; k < PICKS; k++)
		printf(" m%u", pick[k]);
	printf(" (%" PRIu64 " each)\n", count);
	fflush(stdout);
	for (unsigned k = 0; k < PICKS; k++) {
		snprintf(name, sizeof(name), "m%u", pick[k]);
		CHECK(hd_wait_state(&a, moverctl_bin, name, "open", 15000,
				    NULL, 0));
		cons[k] = consume(&b, name, pick[k], count);
		prod[k] = produce(&a, name, pick[k], count);
	}
	for (unsigned k = 0; k < PICKS; k++) {
		wait_ok(prod[k], "a producer", 60000);
		wait_ok(cons[k], "a consumer", 60000);
	}
	/* a flow that was given nothing has nothing */
	for (unsigned i = 0; i < n; i++) {
		bool picked = false;
		flowshm_t *c;
		unsigned char buf[MAX_RECORD];
		size_t len;

		for (unsigned k = 0; k < PICKS; k++)
			picked |= pick[k] == i;
		if (picked)
			continue;
		snprintf(name, sizeof(name), "m%u", i);
		c = attach_retry(&b, name, FLOWSHM_CONSUMER);
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -EAGAIN);
		flowshm_detach(c);
		printf("  m%u (not picked): empty on B\n", i);
		break;
	}
	printf("  every record once, in order, with its contents\n");
	hd_alive(&a);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 2: create and destroy in a loop while two flows move records --------- */

static void churn_one(int sock, const struct hd *b, const char *prefix,
		      unsigned i)
{
	char name[32];

	snprintf(name, sizeof(name), "%s%u", prefix, i);
	CHECK_RC(create_remote(sock, b, name), 0);
	CHECK_RC(hc_destroy(sock, name), 0);
}

static void churn(int sock, const struct hd *b, const char *prefix,
		  unsigned k)
{
	for (unsigned i = 0; i < k; i++)
		churn_one(sock, b, prefix, i);
}

/* Is the child still running?  Its exit status (0) is checked once here. */
static bool running(pid_t *pid, const char *what)
{
	int st;

	if (!*pid || waitpid(*pid, &st, WNOHANG) != *pid)
		return *pid != 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "%s: status %#x\n", what, st);
	CHECK(WIFEXITED(st) && !WEXITSTATUS(st));
	*pid = 0;
	return false;
}

static void case_churn(void)
{
	unsigned k = (unsigned)tu_env_long("FM_MANYFLOWS_CHURN", 1000);
	uint64_t count = (uint64_t)tu_env_long("FM_MANYFLOWS_RECORDS", 200000);
	/* malloc's arenas and a sanitizer's quarantine keep some memory */
#if defined(__SANITIZE_ADDRESS__)
	long rss_margin_kb = 256 * 1024;
#else
	long rss_margin_kb = 16 * 1024;
#endif
	int fds0[2], fds1[2], sock;
	unsigned done = 0;
	long rss0[2], rss1[2];
	pid_t cons[2], prod[2];
	struct hd a, b, *d[2] = { &a, &b };

	two_daemons(&a, &b, "many2", 64);
	sock = ctl_connect(a.sock);
	CHECK(sock >= 0);
	CHECK_RC(create_remote(sock, &b, "busy0"), 0);
	CHECK_RC(create_remote(sock, &b, "busy1"), 0);
	CHECK(hd_wait_state(&b, moverctl_bin, "busy1", "open", 15000, NULL, 0));
	/* a first round so that the baseline holds what any round keeps */
	churn(sock, &b, "warm", 20);
	wait_flow_count(&b, 2, 30000);
	for (int i = 0; i < 2; i++) {
		fds0[i] = hd_fds(d[i]);
		rss0[i] = hd_rss_kb(d[i]);
	}
	printf("  baseline: A %d fds %ld KiB, B %d fds %ld KiB\n", fds0[0],
	       rss0[0], fds0[1], rss0[1]);
	for (uint32_t i = 0; i < 2; i++) {
		char name[16];

		snprintf(name, sizeof(name), "busy%u", i);
		cons[i] = consume(&b, name, i, count);
		prod[i] = produce(&a, name, i, count);
	}
	/* at least k, and on until both producers are done: the loop runs
	 * while records move */
	for (unsigned i = 0; i < k || running(&prod[0], "busy0's producer") ||
			     running(&prod[1], "busy1's producer"); i++) {
		churn_one(sock, &b, "c", i);
		done = i + 1;
	}
	printf("  %u flows created and destroyed while busy0 and busy1 moved "
	       "%" PRIu64 " records each\n", done, count);
	fflush(stdout);
	for (int i = 0; i < 2; i++)
		wait_ok(cons[i], "a busy consumer", 120000);
	printf("  busy0, busy1: every record once, in order\n");
	close(sock);
	wait_flow_count(&a, 2, 30000);
	wait_flow_count(&b, 2, 30000);
	for (int i = 0; i < 2; i++) {
		hd_wait_fds(d[i], fds0[i] + 4);
		fds1[i] = hd_fds(d[i]);
		rss1[i] = hd_rss_kb(d[i]);
	}
	printf("  after: A %d fds %ld KiB, B %d fds %ld KiB (RSS margin %ld "
	       "KiB)\n", fds1[0], rss1[0], fds1[1], rss1[1], rss_margin_kb);
	for (int i = 0; i < 2; i++)
		CHECK(rss1[i] <= rss0[i] + rss_margin_kb);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 3: idle flows wake moverd only when something is due ----------------- */

/* The sleeps moverd has ended so far, whatever ended them (status),
 * and the timer's among them in *timer. */
static uint64_t wakes(const struct hd *d, uint64_t *timer)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	*timer = hj_u64(out, "wakes_timer");
	return hj_u64(out, "wakes_doorbell") + hj_u64(out, "wakes_network") +
	       *timer;
}

static uint64_t reconnects(const struct hd *d)
{
	char out[8192];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	return hj_u64(out, "reconnects");
}

/*
 * Idle flows between two daemons for longer than a dead peer's silence
 * (DEAD_NS, 5 s): the link stays up on heartbeats the timer's deadlines
 * send, and each daemon wakes far less often than the 20 ms tick it had
 * (50 wake-ups a second whatever was due; now the counters' 100 ms pass,
 * the flow checks riding on it, and a heartbeat each way a second).  A
 * count of wake-ups, not a time.  Then a record still crosses.
 */
static void case_idle(void)
{
	unsigned n = (unsigned)tu_env_long("FM_MANYFLOWS_IDLE", 300);
	const double secs = 7;
	uint64_t w0[2], w1[2], tm0[2], tm1[2], t0, t1;
	struct hd d[2];
	char name[32];
	pid_t cons, prod;
	int sock;

	two_daemons(&d[0], &d[1], "many3", n);
	sock = ctl_connect(d[0].sock);
	CHECK(sock >= 0);
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "m%u", i);
		CHECK_RC(create_remote(sock, &d[1], name), 0);
	}
	close(sock);
	wait_flow_count(&d[0], n, 10000);
	wait_flow_count(&d[1], n, 60000);
	snprintf(name, sizeof(name), "m%u", n - 1);
	CHECK(hd_wait_state(&d[0], moverctl_bin, name, "open", 15000, NULL, 0));
	usleep(500000); /* the opens' aftermath */
	t0 = tu_now_ns();
	for (int i = 0; i < 2; i++)
		w0[i] = wakes(&d[i], &tm0[i]);
	usleep((useconds_t)(secs * 1e6));
	for (int i = 0; i < 2; i++)
		w1[i] = wakes(&d[i], &tm1[i]);
	t1 = tu_now_ns();
	for (int i = 0; i < 2; i++) {
		double rate = (double)(w1[i] - w0[i]) /
			      ((double)(t1 - t0) / 1e9);

		printf("  %u idle flows, moverd %c: %.1f wake-ups/s (%.1f/s "
		       "the timer's) over %.1f s\n", n, 'A' + i, rate,
		       (double)(tm1[i] - tm0[i]) / ((double)(t1 - t0) / 1e9),
		       (double)(t1 - t0) / 1e9);
		CHECK(rate < 25);
	}
	CHECK(reconnects(&d[0]) == 0);
	CHECK(hd_wait_state(&d[0], moverctl_bin, name, "open", 1000, NULL, 0));
	cons = consume(&d[1], name, n - 1, 20);
	prod = produce(&d[0], name, n - 1, 20);
	wait_ok(prod, "a producer", 30000);
	wait_ok(cons, "a consumer", 30000);
	printf("  the link stayed up; a record still crosses\n");
	hd_stop(&d[0]);
	hd_stop(&d[1]);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_many, "many flows between two daemons: records on "
				"the first, the 500th, the last, random ones" },
		{ 2, case_churn, "flows created and destroyed while two others "
				 "move records; fds and RSS back after" },
		{ 3, case_idle, "idle flows: the link outlives DEAD_NS on "
				"heartbeats; wake-ups only when due" },
	};

	if (argc != 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL\n", argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	if (hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		   "FM_MANYFLOWS_CASES"))
		return 1;
	return skipped ? 77 : 0;
}
