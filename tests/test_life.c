/*
 * tests/test_life.c - a flow's life applications can rely on (issue 15):
 * real moverd daemons, real clients (tests/flowcheck.c checks every record
 * exactly once, in order per producer).  FM_LIFE_CASES=1,3 runs only those.
 *
 *   usage: test_life MOVERD MOVERCTL FLOWCHECK
 *
 *   1  kill -9 of moverd with a local flow mid-stream: the producer and
 *      consumer go on, the restarted moverd re-adopts the flow (owner,
 *      allowed uids, role), a producer attaching after the restart finds
 *      it; every record arrives once
 *   2  the same with an orderly stop (SIGTERM): nothing is destroyed;
 *      then `flow destroy --all` removes every flow and its files
 *   3  a flow between hosts mid-stream: orderly stop and restart of the
 *      sending moverd, then of the receiving one, then kill -9 of both;
 *      every record once
 *   4  attach checks the role: a producer on the receiving host is refused
 *      with where to attach; a consumer on the sending host is a subscriber
 *      of its own: it and the receiving host's consumer get every record
 *   5  attach waits: a consumer on the receiving host attaches before the
 *      sender created the flow and gets every record; a wait that ends
 *      gets -ETIMEDOUT
 *   6  moverctl flow wait: exit 1 at its timeout, 0 once the flow exists
 *   7  destroy --drain with no consumer attached yet: producers get
 *      -EPIPE, moverctl waits, a consumer that attaches later gets every
 *      record, then the flow is gone; a drain that times out leaves the
 *      flow closed (exit 1)
 *   8  destroy --drain of a flow between hosts, begun while the receiving
 *      moverd is down, with no consumer yet on the receiving host: done
 *      once the receiving consumer has every record
 *   9  a consumer killed (-9) with a record peeked and not released: the
 *      next consumer gets that record first; a record it released before
 *      it was killed does not come again (a release is published at once);
 *      the same across a kill -9 of moverd meanwhile
 *  10  a local flow's ring is a file now: a client that truncates or grows
 *      it fails that flow only (repaired, state failed with the reason);
 *      moverd stays up and another local flow moves on
 *  11  the status clients read (flowshm_state): open with its counts, peer
 *      down (since) while the receiving moverd is stopped, open again,
 *      "moverd restarted" after a kill -9 of the sending one, draining,
 *      closed
 *  12  a consumer that outlived a kill -9 of moverd dies later (no control
 *      connection tells the new moverd): its subscriber slot is given back
 *      and does not hold producers back; a slot the new moverd took in pid
 *      0 (a consumer it cannot see) is left alone
 *  13  flow ids wrap: a sending moverd restarted with a flow whose state
 *      file says id 2^32-1 gives new flows ids no flow has (not 0, not a
 *      living flow's), and each flow's records reach its own consumer once
 *  14  a child of fork (no exec) holds copies of a consumer's and a
 *      producer's handles: its detach leaves the parent's slot alone (the
 *      parent reads on), and while a child lives on the parent's detach
 *      is seen by moverd at once (before, the child's copy of the control
 *      connection kept the consumer attached until the child exited, its
 *      slot holding the producers back); the same for a child forked
 *      while another thread's attach waits for its flow
 *  15  a flow between hosts whose receiving end is not re-adopted (its
 *      state file writable by others): neither its sender's reopen nor a
 *      local create of the name makes it anew (which unlinked the ring
 *      and lost its records); both are told why, the sender keeps asking;
 *      once the file is mended and B restarted, every record arrives
 *  16  the receiving host is short of room (--max-flows 1, taken): the
 *      sender's open is refused for now, not for good (the flow stayed
 *      failed, its producers held for ever); once the room is there the
 *      flow opens and every record arrives; refused for good (a name
 *      taken there), the sender's producers get -EPROTO; a ring above
 *      the receiver's --peer-max-ring-bytes alone fails for good
 *  17  destroy --drain waits for every reader: a consumer on the sending
 *      host gets every record (it lost them once the first peer had all),
 *      and a fan-out peer that is down makes the drain time out; a plain
 *      destroy keeps what that consumer has not read for the grace
 */
#include "harness.h"
#include "flowshm.h"
#include "flowshm_internal.h"
#include "ring.h"

#include <limits.h>
#include <pthread.h>

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin;

/* Start d's moverd again; it serves when this returns. */
static void restart(struct hd *d, const char *const *extra)
{
	hd_restart(d, moverd_bin, extra);
	hd_answers(d);
}

/* ---- checked producers and consumers (tests/flowcheck.c) ----------------- */

static pid_t fc_produce(const struct hd *d, const char *flow, unsigned id,
			unsigned long count, unsigned max_size)
{
	char ids[16], n[24], max[16];

	snprintf(ids, sizeof(ids), "%u", id);
	snprintf(n, sizeof(n), "%lu", count);
	snprintf(max, sizeof(max), "%u", max_size);
	return hx_spawn(d, 0, (const char *const[]){ flowcheck_bin,
			"produce", flow, "--id", ids, "--count", n,
			"--max-size", max, NULL });
}

static pid_t fc_consume(const struct hd *d, const char *flow,
			unsigned producers, unsigned long count,
			unsigned max_size, unsigned wait_ms)
{
	char ps[16], n[24], max[16], w[16];

	snprintf(ps, sizeof(ps), "%u", producers);
	snprintf(n, sizeof(n), "%lu", count);
	snprintf(max, sizeof(max), "%u", max_size);
	snprintf(w, sizeof(w), "%u", wait_ms);
	return hx_spawn(d, 0, (const char *const[]){ flowcheck_bin,
			"consume", flow, "--producers", ps, "--count", n,
			"--max-size", max, "--attach-wait", w, NULL });
}

static void fc_done(pid_t pid, const char *what, int timeout_ms)
{
	int rc = hx_wait(pid, timeout_ms);

	if (rc != 0) {
		fprintf(stderr, "%s: %s (exit %d)\n", what, rc < 0 ?
			"did not finish in time (killed)" : "failed", rc);
		exit(1);
	}
}

/* moverctl on d, run as a child (for commands that wait). */
static pid_t ctl_spawn(const struct hd *d, const char *a1, const char *a2,
		       const char *a3, const char *a4, const char *a5)
{
	return hx_spawn(d, 0, (const char *const[]){ moverctl_bin, "--socket",
			d->sock, a1, a2, a3, a4, a5, NULL });
}

static uint64_t flow_u64(const struct hd *d, const char *name,
			 const char *key)
{
	char out[4096];

	CHECK(hd_flow_json(d, moverctl_bin, name, out, sizeof(out)));
	return hj_u64(out, key);
}

/* Wait until flow name's tail on d has passed `bytes`. */
static void wait_tail(const struct hd *d, const char *name, uint64_t bytes)
{
	for (int i = 0; i < 2000; i++) {
		if (flow_u64(d, name, "tail") > bytes)
			return;
		usleep(5000);
	}
	CHECK(!"the flow did not move");
}

/* Let a stopped consumer read until the tail on d has moved 64 KiB more,
 * then stop it again: with its 64 KiB rings full behind it, the producer
 * waits, so it is still sending whatever the speed of the build. */
static void consume_some(const struct hd *d, const char *name, pid_t cons)
{
	CHECK(kill(cons, SIGCONT) == 0);
	wait_tail(d, name, flow_u64(d, name, "tail") + 64 * 1024);
	CHECK(kill(cons, SIGSTOP) == 0);
}

static bool file_exists(const struct hd *d, const char *name)
{
	char path[256];
	struct stat st;

	snprintf(path, sizeof(path), "%s/rings/%s", d->dir, name);
	return stat(path, &st) == 0;
}

/* ---- cases 1, 2: a local flow survives moverd ------------------------------ */

static void local_restart(bool orderly)
{
	struct hd d;
	char out[4096], val[64];
	pid_t cons, p1, p2;

	hd_start(&d, moverd_bin, orderly ? "life2" : "life1", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create loc "
		     "--ring-size 64K --max-record 1K --allow-uid 65534") == 0);
	cons = fc_consume(&d, "loc", 2, 200000, 200, 0);
	p1 = fc_produce(&d, "loc", 1, 200000, 200);
	wait_tail(&d, "loc", 256 * 1024);
	if (orderly)
		hd_term(&d);
	else
		hd_kill(&d);
	printf("  moverd %s; producer 1 %s\n", orderly ? "stopped (SIGTERM)" :
	       "killed (-9)", hx_running(p1) ? "still sending" : "done");
	CHECK(file_exists(&d, "loc.ring") && file_exists(&d, "loc.flow"));
	usleep(200000); /* the clients go on without moverd */
	restart(&d, NULL);
	CHECK(hd_flow_json(&d, moverctl_bin, "loc", out, sizeof(out)));
	CHECK(hj_get(out, "role", val, sizeof(val)) && !strcmp(val, "local"));
	CHECK(hj_get(out, "state", val, sizeof(val)) && !strcmp(val, "open"));
	CHECK(hj_u64(out, "owner_uid") == 0);
	CHECK(hj_u64(out, "created_unix_ms") != 0);
	CHECK(strstr(out, "65534"));
	printf("  re-adopted: %s\n", out);
	/* a producer that attaches now finds the flow */
	p2 = fc_produce(&d, "loc", 2, 200000, 200);
	fc_done(p1, "producer 1", 60000);
	fc_done(p2, "producer 2", 60000);
	fc_done(cons, "consumer", 60000);
	CHECK(hd_log_count(&d, "flow loc: re-adopted") == 1);
	/* the start count, kept in the state directory */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	CHECK(hj_u64(out, "starts") == 2);
	if (orderly) {
		/* the purge: only destroy removes flows, --all every one */
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create "
			     "other") == 0);
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy "
			     "--all") == 0);
		printf("  %s", out);
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list "
			     "--json") == 0);
		CHECK(!strstr(out, "\"loc\"") && !strstr(out, "\"other\""));
		CHECK(!file_exists(&d, "loc.ring") && !file_exists(&d, "loc.flow"));
		CHECK(!file_exists(&d, "other.ring"));
	}
	hd_stop(&d);
}

static void case_local_kill(void)
{
	local_restart(false);
}

static void case_local_term(void)
{
	local_restart(true);
}

/* ---- case 3: a flow between hosts, both daemons stopped and killed ---------- */

static void two_daemons(struct hd *a, struct hd *b, const char *tag,
			const char *name, const char *flags)
{
	char ta[32], tb[32], out[4096];

	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	hd_start(b, moverd_bin, tb, true, NULL);
	hd_start(a, moverd_bin, ta, false,
		 (const char *const[]){ "--transport", "tcp", NULL });
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create %s --peer "
		     "127.0.0.1:%d %s", name, b->port, flags) == 0);
}

static const char *const tcp_only[] = { "--transport", "tcp", NULL };

static void case_remote_restarts(void)
{
	struct hd a, b;
	pid_t prod, cons;

	two_daemons(&a, &b, "life3", "x", "--ring-size 64K --max-record 1K");
	CHECK(hd_wait_state(&b, moverctl_bin, "x", "open", 10000, NULL, 0));
	cons = fc_consume(&b, "x", 1, 300000, 200, 0);
	prod = fc_produce(&a, "x", 1, 300000, 200);
	wait_tail(&b, "x", 256 * 1024);
	/* the consumer reads only in consume_some: records stay in flight
	 * through every restart below, however fast they could move */
	CHECK(kill(cons, SIGSTOP) == 0);

	hd_term(&a);
	printf("  A stopped (SIGTERM) at B's tail %llu\n",
	       (unsigned long long)flow_u64(&b, "x", "tail"));
	restart(&a, tcp_only);
	CHECK(hd_wait_state(&a, moverctl_bin, "x", "open", 20000, NULL, 0));
	consume_some(&b, "x", cons);

	hd_term(&b);
	printf("  B stopped (SIGTERM)\n");
	restart(&b, NULL);
	CHECK(hd_wait_state(&a, moverctl_bin, "x", "open", 20000, NULL, 0));
	consume_some(&b, "x", cons);

	hd_kill(&a);
	hd_kill(&b);
	printf("  A and B killed (-9); producer %s\n",
	       hx_running(prod) ? "still sending" : "done");
	CHECK(hx_running(prod));
	CHECK(kill(cons, SIGCONT) == 0);
	restart(&b, NULL);
	restart(&a, tcp_only);
	fc_done(prod, "producer", 120000);
	fc_done(cons, "consumer", 120000);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 4: attach checks the role ----------------------------------------- */

static int attach_on(const struct hd *d, const char *name,
		     enum flowshm_role role, char *err, size_t cap)
{
	flowshm_t *f = NULL;
	int rc;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	rc = flowshm_attach(name, role, NULL, &f);
	snprintf(err, cap, "%s", flowshm_attach_error());
	if (!rc)
		flowshm_detach(f);
	return rc;
}

static void case_wrong_role(void)
{
	struct hd a, b;
	char err[512];
	pid_t prod, local, remote;
	int rc;

	two_daemons(&a, &b, "life4", "w", "--ring-size 64K --max-record 1K");
	CHECK(hd_wait_state(&b, moverctl_bin, "w", "open", 10000, NULL, 0));
	rc = attach_on(&b, "w", FLOWSHM_PRODUCER, err, sizeof(err));
	printf("  producer on the receiving host: %d: %s\n", rc, err);
	CHECK_RC(rc, -EINVAL);
	CHECK(strstr(err, "attach producers there"));
	/*
	 * A consumer on the sending host is a subscriber of its own (ring
	 * format 2): it gets every record, and so does the receiving host's
	 * consumer (moverd sends from its own slot: nothing is taken away).
	 */
	local = fc_consume(&a, "w", 1, 50000, 200, 0);
	remote = fc_consume(&b, "w", 1, 50000, 200, 0);
	/* both subscribed before the first record */
	CHECK(hd_wait_count(&a, moverctl_bin, "w", "consumers", 1, 90000));
	CHECK(hd_wait_count(&b, moverctl_bin, "w", "consumers", 1, 90000));
	prod = fc_produce(&a, "w", 1, 50000, 200);
	fc_done(prod, "producer", 60000);
	fc_done(local, "consumer on the sending host", 60000);
	fc_done(remote, "consumer on the receiving host", 60000);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 5: attach waits for the flow --------------------------------------- */

static void case_attach_wait(void)
{
	struct hd a, b;
	char out[4096];
	flowshm_t *f = NULL;
	uint64_t t0;
	pid_t prod, cons;
	int rc;

	hd_start(&b, moverd_bin, "life5-B", true, NULL);
	/* the consumer first: the flow does not exist anywhere yet */
	cons = fc_consume(&b, "late", 1, 50000, 200, 30000);
	usleep(300000);
	CHECK(hx_running(cons));
	hd_start(&a, moverd_bin, "life5-A", false, tcp_only);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create late "
		     "--peer 127.0.0.1:%d --ring-size 64K", b.port) == 0);
	prod = fc_produce(&a, "late", 1, 50000, 200);
	fc_done(prod, "producer", 60000);
	fc_done(cons, "consumer (attached before the flow existed)", 60000);

	setenv("FLOWMOVER_SOCKET", b.sock, 1);
	t0 = tu_now_ns();
	rc = flowshm_attach_wait("never", FLOWSHM_CONSUMER, NULL, 300000000,
				 &f);
	printf("  waiting for a flow that never comes: %d (%s) after %llu ms\n",
	       rc, flowshm_attach_error(),
	       (unsigned long long)(tu_now_ns() - t0) / 1000000);
	CHECK_RC(rc, -ETIMEDOUT);
	CHECK(tu_now_ns() - t0 >= 300000000ull);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 6: moverctl flow wait ------------------------------------------------ */

static void case_ctl_wait(void)
{
	struct hd d;
	char out[4096];
	pid_t w;
	int rc;

	hd_start(&d, moverd_bin, "life6", false, NULL);
	rc = hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow wait nf "
		    "--timeout 300");
	printf("  flow wait for a flow that never comes: exit %d: %s", rc, out);
	CHECK_RC(rc, 1);
	w = ctl_spawn(&d, "flow", "wait", "nf2", "--timeout", "20000");
	usleep(300000);
	CHECK(hx_running(w));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create nf2") == 0);
	CHECK_RC(hx_wait(w, 10000), 0);
	/* an existing flow: at once */
	CHECK_RC(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow wait nf2"), 0);
	hd_stop(&d);
}

/* ---- case 7: destroy --drain, local ------------------------------------------- */

static void case_drain_local(void)
{
	struct hd d;
	char out[4096], err[512], val[64];
	flowshm_t *f = NULL;
	pid_t prod, cons, drain;
	int rc;

	hd_start(&d, moverd_bin, "life7", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create dr "
		     "--ring-size 1M --max-record 1K") == 0);
	/* fits the ring: the producer is done before anyone reads */
	prod = fc_produce(&d, "dr", 1, 3000, 200);
	fc_done(prod, "producer", 30000);
	drain = ctl_spawn(&d, "flow", "destroy", "--drain", "dr", NULL);
	CHECK(hd_wait_state(&d, moverctl_bin, "dr", "closing", 10000, NULL, 0));
	CHECK(hx_running(drain));
	/* no new sends */
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	rc = flowshm_attach("dr", FLOWSHM_PRODUCER, NULL, &f);
	if (!rc) {
		char rec[16] = "late";

		rc = flowshm_send(f, rec, sizeof(rec), 0);
		flowshm_detach(f);
	}
	printf("  a send while draining: %d (%s)\n", rc, flowshm_strerror(rc));
	CHECK_RC(rc, -EPIPE);
	cons = fc_consume(&d, "dr", 1, 3000, 200, 0);
	fc_done(cons, "consumer (attached after the drain began)", 30000);
	CHECK_RC(hx_wait(drain, 10000), 0);
	CHECK(!hd_flow_json(&d, moverctl_bin, "dr", out, sizeof(out)));
	CHECK(!file_exists(&d, "dr.ring"));

	/* a drain that times out: exit 1, the flow stays, closed */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create dt "
		     "--ring-size 64K") == 0);
	prod = fc_produce(&d, "dt", 1, 10, 200);
	fc_done(prod, "producer", 30000);
	rc = hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy --drain "
		    "dt --timeout 300");
	printf("  a drain that times out: exit %d: %s", rc, out);
	CHECK_RC(rc, 1);
	CHECK(strstr(out, "not drained"));
	CHECK(hd_flow_json(&d, moverctl_bin, "dt", out, sizeof(out)));
	CHECK(hj_get(out, "state", val, sizeof(val)) && !strcmp(val, "closing"));
	(void)err;
	hd_stop(&d);
}

/* ---- case 8: destroy --drain between hosts -------------------------------------- */

static void case_drain_remote(void)
{
	struct hd a, b;
	char out[4096];
	pid_t prod, cons, drain;

	two_daemons(&a, &b, "life8", "rd", "--ring-size 1M --max-record 1K");
	CHECK(hd_wait_state(&b, moverctl_bin, "rd", "open", 10000, NULL, 0));
	/* B is down while the records are sent and the drain begins: what
	 * A has not sent yet must still go once B is back */
	hd_term(&b);
	prod = fc_produce(&a, "rd", 1, 3000, 200);
	fc_done(prod, "producer", 30000);
	drain = ctl_spawn(&a, "flow", "destroy", "--drain", "rd", NULL);
	usleep(300000);
	CHECK(hx_running(drain));
	restart(&b, NULL);
	CHECK(hd_wait_state(&a, moverctl_bin, "rd", "closing", 20000, NULL, 0));
	usleep(500000);
	CHECK(hx_running(drain)); /* nobody has read on B */
	cons = fc_consume(&b, "rd", 1, 3000, 200, 0);
	fc_done(cons, "consumer on B (attached after the drain began)", 30000);
	CHECK_RC(hx_wait(drain, 10000), 0);
	CHECK(!hd_flow_json(&a, moverctl_bin, "rd", out, sizeof(out)));
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 17: a drain waits for every reader ----------------------------------- */

/*
 * A drain answered once the first peer had acknowledged and read every
 * record (a review): (a) a consumer on the sending host that had not read
 * them lost them (its ring shut, then punched out: 0 of 10, then -EPIPE);
 * (b) a second peer of a fan-out flow, down, never had them.  The drain
 * waits for both now: (a) is done once the local consumer has read all,
 * (b) times out (exit 1) and leaves the flow.
 */
static void case_drain_every_reader(void)
{
	const unsigned long n = 3000;
	char out[4096], buf[1024];
	unsigned long got = 0;
	flowshm_t *local = NULL;
	pid_t prod, cons, drain;
	struct hd a, b;
	size_t len;
	int rc;

	two_daemons(&a, &b, "life17", "rw", "--ring-size 1M --max-record 1K");
	CHECK(hd_wait_state(&b, moverctl_bin, "rw", "open", 10000, NULL, 0));
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("rw", FLOWSHM_CONSUMER, NULL, &local), 0);
	cons = fc_consume(&b, "rw", 1, n, 200, 0);
	prod = fc_produce(&a, "rw", 1, n, 200);
	fc_done(prod, "producer", 30000);
	fc_done(cons, "consumer on B", 30000);
	drain = ctl_spawn(&a, "flow", "destroy", "--drain", "rw", NULL);
	CHECK(hd_wait_state(&a, moverctl_bin, "rw", "closing", 10000, NULL, 0));
	usleep(500000);
	CHECK(hx_running(drain)); /* A's own consumer has read nothing */
	while ((rc = flowshm_recv(local, buf, sizeof(buf), &len,
				  5000000000ll)) == 0)
		got++;
	printf("  (a) A's own consumer, read after the drain began: %lu "
	       "records, then %s\n", got, flowshm_strerror(rc));
	CHECK(got == n);
	CHECK_RC(rc, -EPIPE);
	CHECK_RC(hx_wait(drain, 10000), 0);
	flowshm_detach(local);

	/* (b) a second peer where nothing listens */
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create rf "
		     "--peer 127.0.0.1:%d --peer 127.0.0.1:%d --ring-size 64K",
		     b.port, hd_free_port()) == 0);
	CHECK(hd_wait_state(&b, moverctl_bin, "rf", "open", 10000, NULL, 0));
	cons = fc_consume(&b, "rf", 1, 10, 200, 0);
	prod = fc_produce(&a, "rf", 1, 10, 200);
	fc_done(prod, "producer", 30000);
	fc_done(cons, "consumer on B", 30000);
	rc = hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow destroy --drain "
		    "rf --timeout 1000");
	printf("  (b) B has all, the second peer none: exit %d: %s", rc, out);
	CHECK_RC(rc, 1);
	CHECK(strstr(out, "not drained"));
	CHECK(hd_flow_json(&a, moverctl_bin, "rf", out, sizeof(out)));

	/* (c) a plain destroy: what the local consumer has not read stays
	 * for the grace (DRAIN_GRACE_NS), so it still reads all of it */
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create rc "
		     "--peer 127.0.0.1:%d --ring-size 1M --max-record 1K",
		     b.port) == 0);
	CHECK(hd_wait_state(&b, moverctl_bin, "rc", "open", 10000, NULL, 0));
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("rc", FLOWSHM_CONSUMER, NULL, &local), 0);
	cons = fc_consume(&b, "rc", 1, n, 200, 0);
	prod = fc_produce(&a, "rc", 1, n, 200);
	fc_done(prod, "producer", 30000);
	fc_done(cons, "consumer on B", 30000);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow destroy rc")
	      == 0);
	usleep(500000); /* the reaper looks every 100 ms */
	for (got = 0; (rc = flowshm_recv(local, buf, sizeof(buf), &len,
					 2000000000ll)) == 0;)
		got++;
	printf("  (c) destroyed, A's own consumer reads: %lu records, then "
	       "%s\n", got, flowshm_strerror(rc));
	CHECK(got == n);
	CHECK_RC(rc, -EPIPE);
	flowshm_detach(local);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 9: a peeked, unreleased record goes to the next consumer ---------- */

/* Attach as consumer on d, retried while the last one is still known
 * (-EBUSY) and while a killed moverd's socket lingers (-ECONNRESET: its
 * io_uring, torn down after it, may still accept; -ECONNREFUSED: the new
 * one is binding its own). */
static flowshm_t *consumer_on(const struct hd *d, const char *name)
{
	flowshm_t *f = NULL;
	int rc = -EBUSY;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	for (int i = 0; i < 500 && (rc == -EBUSY || rc == -ECONNRESET ||
				     rc == -ECONNREFUSED); i++) {
		rc = flowshm_attach(name, FLOWSHM_CONSUMER, NULL, &f);
		if (rc)
			usleep(10000);
	}
	CHECK_RC(rc, 0);
	return f;
}

/* The next record must be "rec N". */
static void expect_peek(flowshm_t *f, int n)
{
	const void *buf;
	size_t len;
	char want[16];

	snprintf(want, sizeof(want), "rec %d", n);
	CHECK_RC(flowshm_peek(f, &buf, &len, 2000000000), 0);
	CHECK(len == strlen(want) + 1 && !memcmp(buf, want, len));
}

/* A child consumer: releases records first..first+released-1, peeks the
 * next, tells the parent (one byte on *ready), and waits to be killed. */
static pid_t peeking_child(const struct hd *d, const char *name, int first,
			   int released, int *ready)
{
	int p[2];
	pid_t pid;
	char b;

	CHECK(pipe(p) == 0);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *f = consumer_on(d, name);

		for (int i = first; i < first + released; i++) {
			expect_peek(f, i);
			CHECK_RC(flowshm_release(f), 0);
		}
		expect_peek(f, first + released);
		if (write(p[1], "p", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(p[1]);
	CHECK(read(p[0], &b, 1) == 1);
	*ready = p[0];
	return pid;
}

/* Read "rec first" .. "rec last" in order, releasing each. */
static void read_run(flowshm_t *f, int first, int last)
{
	for (int i = first; i <= last; i++) {
		expect_peek(f, i);
		CHECK_RC(flowshm_release(f), 0);
	}
}

/* The number of the next record (peeked, not released). */
static int next_rec(flowshm_t *f)
{
	const void *buf;
	size_t len;

	CHECK_RC(flowshm_peek(f, &buf, &len, 2000000000), 0);
	CHECK(len > 4 && !memcmp(buf, "rec ", 4));
	return atoi((const char *)buf + 4);
}

static void kill_child(pid_t child, int ready)
{
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	close(ready);
}

static void case_peeked(void)
{
	struct hd d;
	char out[4096];
	flowshm_t *f = NULL;
	pid_t child;
	int ready, n;

	hd_start(&d, moverd_bin, "life9", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create pk "
		     "--ring-size 64K") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("pk", FLOWSHM_PRODUCER, NULL, &f), 0);
	for (int i = 0; i < 10; i++) {
		char rec[16];

		snprintf(rec, sizeof(rec), "rec %d", i);
		CHECK_RC(flowshm_send(f, rec, strlen(rec) + 1, 0), 0);
	}
	flowshm_detach(f);

	/* peeked 0, killed: the next consumer gets 0 */
	child = peeking_child(&d, "pk", 0, 0, &ready);
	kill_child(child, ready);
	f = consumer_on(&d, "pk");
	read_run(f, 0, 0);
	flowshm_detach(f); /* a clean detach publishes its position */
	printf("  peeked by a killed consumer: the next one got it\n");

	/* released 1, peeked 2, killed: the next consumer starts at 2 (an
	 * explicit release is published at once, not lazily) */
	child = peeking_child(&d, "pk", 1, 1, &ready);
	kill_child(child, ready);
	f = consumer_on(&d, "pk");
	n = next_rec(f);
	printf("  released 1, peeked 2, killed: the next consumer starts at "
	       "%d\n", n);
	CHECK(n == 2);
	read_run(f, n, 4);
	flowshm_detach(f);

	/* the same with moverd killed and restarted meanwhile */
	child = peeking_child(&d, "pk", 5, 0, &ready); /* peeks 5 */
	hd_kill(&d);
	kill_child(child, ready);
	restart(&d, NULL);
	f = consumer_on(&d, "pk");
	read_run(f, 5, 9);
	flowshm_detach(f);
	printf("  ... and across a kill -9 of moverd\n");
	hd_stop(&d);
}

/* ---- case 10: clients resize a local flow's ring file ------------------------ */

static void case_resize_local(void)
{
	struct hd d;
	char out[4096], reason[256];
	struct stat st;
	pid_t prod, cons;
	int sock, fd;

	hd_start(&d, moverd_bin, "life10", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create ok "
		     "--ring-size 64K") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create shr "
		     "--ring-size 64K") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create gro "
		     "--ring-size 64K") == 0);
	cons = fc_consume(&d, "ok", 1, 100000, 200, 0);
	prod = fc_produce(&d, "ok", 1, 100000, 200);

	fd = hd_attach_fd(&d, "shr", FLOWMOVER__ROLE__PRODUCER, &sock);
	CHECK(ftruncate(fd, 0) == 0);
	CHECK(hd_wait_state(&d, moverctl_bin, "shr", "failed", 5000, reason,
			    sizeof(reason)));
	printf("  shrunk: %s\n", reason);
	CHECK(strstr(reason, "size"));
	CHECK(fstat(fd, &st) == 0 && st.st_size == FR_CTRL_BYTES + 65536);
	close(fd);
	close(sock);

	fd = hd_attach_fd(&d, "gro", FLOWMOVER__ROLE__CONSUMER, &sock);
	CHECK(ftruncate(fd, 64 << 20) == 0);
	CHECK(hd_wait_state(&d, moverctl_bin, "gro", "failed", 5000, reason,
			    sizeof(reason)));
	printf("  grown: %s\n", reason);
	CHECK(fstat(fd, &st) == 0 && st.st_size == FR_CTRL_BYTES + 65536);
	close(fd);
	close(sock);

	fc_done(prod, "producer of another flow", 60000);
	fc_done(cons, "consumer of another flow", 60000);
	hd_stop(&d);
}

/* ---- case 11: the flow's status, as its clients read it ----------------- */

/* Wait up to 20 s for f's state (flowshm_state) to be `want`. */
static struct flowshm_state wait_state(flowshm_t *f,
				       enum flowshm_flow_state want,
				       const char *what)
{
	struct flowshm_state st = { 0 };

	for (int i = 0; i < 2000; i++) {
		CHECK_RC(flowshm_state(f, &st), 0);
		if (st.state == want)
			break;
		usleep(10000);
	}
	printf("  %s: %s, producers %u, consumers %u, since %llu, moverd "
	       "%d\n", what, flowshm_state_name(st.state), st.producers,
	       st.consumers, (unsigned long long)st.since_ns, (int)st.daemon);
	CHECK(st.state == want);
	return st;
}

static void case_status(void)
{
	struct hd a, b;
	char out[4096];
	struct flowshm_state st;
	flowshm_t *p = NULL, *c = NULL;
	char buf[64];
	size_t len;
	uint64_t since;
	pid_t drain;

	two_daemons(&a, &b, "life11", "st", "--ring-size 64K");
	CHECK(hd_wait_state(&a, moverctl_bin, "st", "open", 10000, NULL, 0));
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("st", FLOWSHM_PRODUCER, NULL, &p), 0);
	st = wait_state(p, FLOWSHM_STATE_OPEN, "a producer on A, peer up");
	CHECK(st.producers == 1 && st.daemon == FLOWSHM_DAEMON_UP);
	setenv("FLOWMOVER_SOCKET", b.sock, 1);
	CHECK_RC(flowshm_attach("st", FLOWSHM_CONSUMER, NULL, &c), 0);
	st = wait_state(c, FLOWSHM_STATE_OPEN, "a consumer on B");
	CHECK(st.consumers == 1);

	hd_term(&b);
	st = wait_state(p, FLOWSHM_STATE_PEER_DOWN, "B stopped: A's producer");
	since = st.since_ns;
	CHECK(since != 0);
	restart(&b, NULL);
	wait_state(p, FLOWSHM_STATE_OPEN, "B back");
	wait_state(c, FLOWSHM_STATE_OPEN, "B's consumer, attached before");

	hd_kill(&a);
	restart(&a, tcp_only);
	st = wait_state(p, FLOWSHM_STATE_OPEN, "A killed and restarted");
	/* the producer, attached to the moverd before, learns of the new
	 * start from the ring's epoch (the state dir's start count) */
	CHECK(st.daemon == FLOWSHM_DAEMON_RESTARTED);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "status --json") == 0);
	CHECK(hj_u64(out, "starts") == 2);

	CHECK_RC(flowshm_send(p, "one", 4, 0), 0);
	drain = ctl_spawn(&a, "flow", "destroy", "--drain", "st", NULL);
	wait_state(p, FLOWSHM_STATE_DRAINING, "destroy --drain, B's consumer "
		   "has not read");
	CHECK_RC(flowshm_send(p, "two", 4, 0), -EPIPE);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 5000000000), 0);
	CHECK(len == 4 && !strcmp(buf, "one"));
	flowshm_detach(c); /* its position published */
	CHECK_RC(hx_wait(drain, 20000), 0);
	wait_state(p, FLOWSHM_STATE_CLOSED, "drained and destroyed");
	flowshm_detach(p);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 12: a consumer that outlived moverd dies later --------------------- */

static void case_inherited_slot(void)
{
	static const char gone[] = "died since the restart given back";
	struct hd d;
	char out[4096];
	flowshm_t *p = NULL;
	pid_t child, prod, cons;
	uint64_t unseen_gen;
	unsigned unseen;
	int ready;

	hd_start(&d, moverd_bin, "life12", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create ih "
		     "--ring-size 64K --max-record 1K") == 0);
	/* a consumer subscribed through moverd (nothing to read: it waits) */
	child = hx_spawn(&d, 0, (const char *const[]){ flowcheck_bin,
			 "consume", "ih", "--producers", "1", "--count", "1",
			 NULL });
	ready = 0;
	for (int i = 0; i < 500 && !ready; i++) {
		CHECK(hd_flow_json(&d, moverctl_bin, "ih", out, sizeof(out)));
		ready = hj_u64(out, "consumers") == 1;
		if (!ready)
			usleep(10000);
	}
	CHECK(ready);
	hd_kill(&d);
	restart(&d, NULL);
	/* a slot the new moverd takes in pid 0 (a consumer in a pid namespace
	 * it cannot see) is a live client's, not the last start's to judge;
	 * the test takes it as moverd would (test_subscribers case 3) */
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("ih", FLOWSHM_PRODUCER, NULL, &p), 0);
	CHECK_RC(fr_sub_take(&p->ring, 0, &unseen, &unseen_gen), 0);
	/* it outlived moverd; now it dies, with no connection to tell */
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	/* moverd gives its slot back (before any producer waits, which
	 * would judge it too: ipc/ring.h, dead subscribers) ... */
	for (int i = 0; i < 1000 && !hd_log_count(&d, gone); i++)
		usleep(10000);
	CHECK(hd_log_count(&d, gone) == 1);
	/* ... and only that one */
	CHECK(atomic_load(&p->ring.sh->subs[unseen].state) == FR_SUB_ACTIVE &&
	      atomic_load(&p->ring.sh->subs[unseen].gen) == unseen_gen);
	fr_sub_leave(&p->ring, unseen, unseen_gen); /* as at its detach */
	flowshm_detach(p);
	/* a new consumer and a producer of far more than the ring holds: the
	 * dead one's slot must not hold the producer back */
	cons = fc_consume(&d, "ih", 1, 20000, 200, 0);
	usleep(200000);
	prod = fc_produce(&d, "ih", 1, 20000, 200);
	fc_done(prod, "producer", 60000);
	fc_done(cons, "consumer", 60000);
	CHECK(hd_log_count(&d, gone) == 1);
	hd_stop(&d);
}

/* ---- case 13: flow ids wrap ------------------------------------------------ */

static void state_path(const struct hd *d, const char *name, char *out,
		       size_t cap)
{
	snprintf(out, cap, "%s/rings/%s.flow", d->dir, name);
}

/* The id= of flow name's state file on d. */
static uint32_t state_id(const struct hd *d, const char *name)
{
	char path[256], line[256];
	unsigned long id = 0;
	FILE *f;

	state_path(d, name, path, sizeof(path));
	CHECK((f = fopen(path, "r")) != NULL);
	while (fgets(line, sizeof(line), f) && sscanf(line, "id=%lu", &id) != 1)
		;
	fclose(f);
	CHECK(id > 0 && id <= UINT32_MAX);
	return (uint32_t)id;
}

/* Write id into flow name's state file on d (moverd stopped). */
static void set_state_id(const struct hd *d, const char *name, uint32_t id)
{
	char path[256], line[256], text[4096] = "";
	size_t used = 0;
	FILE *f;

	state_path(d, name, path, sizeof(path));
	CHECK((f = fopen(path, "r")) != NULL);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "id=", 3))
			snprintf(line, sizeof(line), "id=%u\n", id);
		CHECK(used + strlen(line) < sizeof(text));
		used += (size_t)snprintf(text + used, sizeof(text) - used, "%s",
					 line);
	}
	fclose(f);
	CHECK((f = fopen(path, "w")) != NULL);
	CHECK(fputs(text, f) >= 0 && fclose(f) == 0);
}

static void case_id_wrap(void)
{
	static const char *const names[] = { "old", "n0", "n1" };
	uint32_t ids[3];
	pid_t prod[3], cons[3];
	char out[4096];
	struct hd a, b;

	two_daemons(&a, &b, "life13", "old", "--ring-size 64K --max-record 1K");
	CHECK(hd_wait_state(&b, moverctl_bin, "old", "open", 10000, NULL, 0));
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create top "
		     "--peer 127.0.0.1:1") == 0);
	hd_term(&a);
	/* as if 2^32 flows had been made since "old" */
	set_state_id(&a, "top", UINT32_MAX);
	restart(&a, tcp_only);
	CHECK(hd_wait_state(&a, moverctl_bin, "old", "open", 20000, NULL, 0));
	for (int i = 1; i < 3; i++)
		CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create "
			     "%s --peer 127.0.0.1:%d --ring-size 64K "
			     "--max-record 1K", names[i], b.port) == 0);
	for (int i = 0; i < 3; i++)
		ids[i] = state_id(&a, names[i]);
	printf("  ids after the wrap: old %u, n0 %u, n1 %u (top %u)\n", ids[0],
	       ids[1], ids[2], state_id(&a, "top"));
	CHECK(ids[1] != ids[0] && ids[2] != ids[0] && ids[1] != ids[2]);
	CHECK(ids[1] != UINT32_MAX && ids[2] != UINT32_MAX);
	for (int i = 0; i < 3; i++) {
		CHECK(hd_wait_state(&b, moverctl_bin, names[i], "open", 10000,
				    NULL, 0));
		cons[i] = fc_consume(&b, names[i], 1, 3000, 200, 10000);
		prod[i] = fc_produce(&a, names[i], 1, 3000, 200);
	}
	for (int i = 0; i < 3; i++) {
		fc_done(prod[i], names[i], 60000);
		fc_done(cons[i], names[i], 60000);
	}
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 14: a child of fork ----------------------------------------------- */

/* 14: a consumer attach of flow "fw" that waits for the flow. */
static void *attach_waiting(void *arg)
{
	flowshm_t **c = arg;

	CHECK_RC(flowshm_attach_wait("fw", FLOWSHM_CONSUMER, NULL,
				     20 * 1000000000ll, c), 0);
	return NULL;
}

/* 14: a child forked while another thread's attach waits for its flow:
 * the connection it copied is closed there too, so the parent's detach
 * is seen while the child lives. */
static void fork_during_attach(const struct hd *d)
{
	char out[4096];
	flowshm_t *c = NULL;
	pthread_t th;
	pid_t child;
	int go[2];

	CHECK(pthread_create(&th, NULL, attach_waiting, &c) == 0);
	usleep(200000); /* its connection made, its wait under way */
	CHECK(pipe(go) == 0);
	fflush(NULL);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		char b;

		close(go[1]);
		_exit(read(go[0], &b, 1) == 0 ? 0 : 1);
	}
	close(go[0]);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "flow create fw "
		     "--ring-size 64K --max-record 1K") == 0);
	CHECK(pthread_join(th, NULL) == 0 && c);
	CHECK(hd_wait_count(d, moverctl_bin, "fw", "consumers", 1, 5000));
	flowshm_detach(c);
	CHECK(hd_wait_count(d, moverctl_bin, "fw", "consumers", 0, 5000));
	close(go[1]);
	CHECK(hx_wait(child, 10000) == 0);
}

/* Is consumer c's subscriber slot still its own (active, same gen)? */
static bool slot_held(const flowshm_t *c)
{
	const struct fr_sub *s = &c->ring.sh->subs[c->ring.sub];

	return atomic_load(&s->state) == FR_SUB_ACTIVE &&
	       atomic_load(&s->gen) == c->ring.sub_gen;
}

static void case_fork_child(void)
{
	struct hd d;
	char out[4096], rec[64] = "after the child";
	size_t len;
	flowshm_t *c, *p;
	pid_t child;
	int go[2];

	hd_start(&d, moverd_bin, "life14", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create fk "
		     "--ring-size 64K --max-record 1K") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("fk", FLOWSHM_CONSUMER, NULL, &c), 0);
	CHECK_RC(flowshm_attach("fk", FLOWSHM_PRODUCER, NULL, &p), 0);
	CHECK(hd_wait_count(&d, moverctl_bin, "fk", "consumers", 1, 5000));
	/* a child detaches its copies and exits */
	fflush(NULL);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		flowshm_detach(c);
		flowshm_detach(p);
		_exit(0);
	}
	CHECK(hx_wait(child, 10000) == 0);
	CHECK(slot_held(c));
	CHECK_RC(flowshm_send(p, rec, sizeof(rec), 1000000000), 0);
	CHECK_RC(flowshm_recv(c, rec, sizeof(rec), &len, 1000000000), 0);
	CHECK(len == sizeof(rec) && !strcmp(rec, "after the child"));
	/* a child that lives on while the parent detaches */
	CHECK(pipe(go) == 0);
	child = fork();
	CHECK(child >= 0);
	if (child == 0) {
		char b;

		close(go[1]);
		_exit(read(go[0], &b, 1) == 0 ? 0 : 1); /* the parent's close */
	}
	close(go[0]);
	flowshm_detach(c);
	CHECK(hd_wait_count(&d, moverctl_bin, "fk", "consumers", 0, 5000));
	close(go[1]);
	CHECK(hx_wait(child, 10000) == 0);
	flowshm_detach(p);
	fork_during_attach(&d);
	printf("  a child's detach left the parent's slot alone; the parent's "
	       "detach was seen while a child lived, also one forked while "
	       "the attach waited\n");
	hd_stop(&d);
}

/* ---- case 15: a receiving end not re-adopted keeps its records ------------ */

/* 15, 16: flow name on d reconnecting, its reason saying why (the
 * receiver's refusal, once its answer came). */
static void wait_reconnecting(const struct hd *d, const char *name,
			      const char *why)
{
	char reason[512] = "";

	CHECK(hd_wait_state(d, moverctl_bin, name, "reconnecting", 10000,
			    reason, sizeof(reason)));
	for (int i = 0; i < 500 && !strstr(reason, why); i++) {
		usleep(10000);
		hd_wait_state(d, moverctl_bin, name, "reconnecting", 1000,
			      reason, sizeof(reason));
	}
	printf("  %s: reconnecting: %s\n", name, reason);
	CHECK(strstr(reason, why));
}

static void case_not_adopted(void)
{
	char out[4096], path[256];
	struct hd a, b;
	pid_t prod, cons;

	two_daemons(&a, &b, "life15", "na", "--ring-size 64K --max-record 1K");
	CHECK(hd_wait_state(&b, moverctl_bin, "na", "open", 10000, NULL, 0));
	prod = fc_produce(&a, "na", 1, 100, 200);
	fc_done(prod, "producer", 60000);
	wait_tail(&b, "na", flow_u64(&a, "na", "tail") - 1); /* all of it */
	hd_term(&b);
	/* a state file others may write is not re-adopted (private_dir) */
	snprintf(path, sizeof(path), "%s/rings/na.flow", b.dir);
	CHECK(chmod(path, 0666) == 0);
	restart(&b, NULL);
	CHECK(hd_log_count(&b, "refusing to re-adopt") == 1);
	wait_reconnecting(&a, "na", "did not re-adopt");
	CHECK(hd_ctl(&b, moverctl_bin, out, sizeof(out), "flow create na "
		     "--ring-size 64K") != 0);
	CHECK(strstr(out, "did not re-adopt"));
	hd_term(&b);
	CHECK(chmod(path, 0600) == 0);
	restart(&b, NULL);
	CHECK(hd_wait_state(&a, moverctl_bin, "na", "open", 30000, NULL, 0));
	cons = fc_consume(&b, "na", 1, 100, 200, 0);
	fc_done(cons, "consumer", 60000);
	printf("  B not re-adopting the flow kept its records; restarted, "
	       "it gave all 100\n");
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 16: the receiving host short of room ------------------------------ */

/* 16: an open B refuses for good (a local flow of the name there): A's
 * flow fails, and its producers are told so (before: the flow failed with
 * its ring open, and a producer filled it and waited for ever). */
static void refused_for_good(struct hd *a, struct hd *b)
{
	unsigned char rec[64] = { 0 };
	char out[4096];
	flowshm_t *p = NULL;
	int rc = 0;

	CHECK(hd_ctl(b, moverctl_bin, out, sizeof(out), "flow destroy sr") ==
	      0);
	CHECK(hd_ctl(b, moverctl_bin, out, sizeof(out), "flow create clash "
		     "--ring-size 64K") == 0);
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create clash "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1K",
		     b->port) == 0);
	CHECK(hd_wait_state(a, moverctl_bin, "clash", "failed", 10000, NULL,
			    0));
	setenv("FLOWMOVER_SOCKET", a->sock, 1);
	rc = flowshm_attach("clash", FLOWSHM_PRODUCER, NULL, &p);
	for (int i = 0; !rc && i < 2000; i++)
		rc = flowshm_send(p, rec, sizeof(rec), 200 * 1000000ll);
	printf("  refused for good: a producer of the failed flow got %s\n",
	       flowshm_strerror(rc));
	CHECK(rc == -EPROTO);
	flowshm_detach(p);
	/* a ring above B's --peer-max-ring-bytes alone: never, so for good
	 * (not asked again for ever as a quota that may free up) */
	CHECK(hd_ctl(b, moverctl_bin, out, sizeof(out), "flow destroy clash") ==
	      0);
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create huge "
		     "--peer 127.0.0.1:%d --ring-size 256K --max-record 1K",
		     b->port) == 0);
	CHECK(hd_wait_state(a, moverctl_bin, "huge", "failed", 10000, out,
			    sizeof(out)));
	printf("  a ring above the receiver's limit: failed: %s\n", out);
	CHECK(strstr(out, "--peer-max-ring-bytes"));
}

static void case_short_of_room(void)
{
	char out[4096];
	struct hd a, b;
	pid_t prod, cons;

	hd_start(&b, moverd_bin, "life16-B", true,
		 (const char *const[]){ "--max-flows", "1",
					"--peer-max-ring-bytes", "128K",
					NULL });
	hd_start(&a, moverd_bin, "life16-A", false, tcp_only);
	CHECK(hd_ctl(&b, moverctl_bin, out, sizeof(out), "flow create filler "
		     "--ring-size 64K") == 0);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create sr "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1K",
		     b.port) == 0);
	wait_reconnecting(&a, "sr", "too many flows");
	prod = fc_produce(&a, "sr", 1, 100, 200);
	usleep(300000); /* a few of A's reopens, all refused */
	CHECK(hd_ctl(&b, moverctl_bin, out, sizeof(out), "flow destroy "
		     "filler") == 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "sr", "open", 30000, NULL, 0));
	cons = fc_consume(&b, "sr", 1, 100, 200, 5000);
	fc_done(prod, "producer", 60000);
	fc_done(cons, "consumer", 60000);
	printf("  B short of room refused the open for now; with room, all "
	       "100 records came\n");
	refused_for_good(&a, &b);
	hd_stop(&a);
	hd_stop(&b);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_local_kill, "kill -9 of moverd with a local flow "
		  "mid-stream" },
		{ 2, case_local_term, "orderly stop of moverd with a local "
		  "flow mid-stream" },
		{ 3, case_remote_restarts, "a flow between hosts: orderly "
		  "stops, then kill -9, of both daemons" },
		{ 4, case_wrong_role, "attach refuses a role the flow does not "
		  "have here" },
		{ 5, case_attach_wait, "a consumer attaches before the flow "
		  "exists" },
		{ 6, case_ctl_wait, "moverctl flow wait" },
		{ 7, case_drain_local, "destroy --drain with no consumer yet" },
		{ 8, case_drain_remote, "destroy --drain between hosts" },
		{ 9, case_peeked, "a peeked, unreleased record goes to the "
		  "next consumer" },
		{ 10, case_resize_local, "clients resize a local flow's ring "
		  "file" },
		{ 11, case_status, "the flow's status as its clients read it" },
		{ 12, case_inherited_slot, "a consumer that outlived moverd dies "
		  "later" },
		{ 13, case_id_wrap, "flow ids wrap" },
		{ 14, case_fork_child, "a child of fork holds copies of "
		  "attached handles" },
		{ 15, case_not_adopted, "a receiving end not re-adopted keeps "
		  "its records" },
		{ 16, case_short_of_room, "the receiving host short of room: "
		  "refused for now, not for good" },
		{ 17, case_drain_every_reader, "destroy --drain waits for a "
		  "local consumer and for every fan-out peer" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]), "FM_LIFE_CASES");
}
