/*
 * tests/test_acl.c - the receiving host decides who reads (issue 9): real
 * moverd daemons over loopback TCP, real attaches as other users.
 * FM_ACL_CASES=1,3 runs only those cases.
 *
 *   usage: test_acl MOVERD MOVERCTL FLOWCHECK
 *
 *   1  remote uids ignored: a flow created on A with --allow-uid 65534 is
 *      not attachable by uid 65534 on B (-EACCES) until B's operator runs
 *      `flow allow` (which uid 65534 itself may not, and is not told the
 *      owner of a flow it may not see); the grant survives a
 *      kill -9 and restart of B, a consumer of that uid then gets every
 *      record once, and `flow disallow` takes it back
 *   2  --peer-flow-owner 65534:4242: flows from peers are attachable at
 *      once by uid 65534 and by members of group 4242, not by others; the
 *      owner may grant more
 *   3  name hijack: while A is down, a peer from another address (C,
 *      127.0.0.2) opens A's flow with its exact ring: refused -EEXIST and
 *      logged, the consumer's ring untouched; A restarts and resumes with
 *      every record exactly once; after B restarts, C is refused again
 *   4  supplementary groups: a uid whose supplementary group is in a
 *      flow's allowed gids may attach; without it, it may not; a create
 *      that allows uid 4294967295 ((uid_t)-1) is refused, as flow allow
 *      refuses it
 *   5  a name taken first: uid 4000 creates the flow uid 65534 will attach
 *      to and allows it.  flowshm_attach_owned(owner 65534) is refused
 *      (-EACCES) as producer and consumer, before any slot is taken; with
 *      the real owner it attaches; a wait for one's own flow is refused
 *      when the other user's appears; one's own and root's flows attach
 *   6  guests' subscriber slots: on a flow uid 4000 owns, allowing uid
 *      65534 and group 4242, 65534's consumers get 8 of the 16 slots (the
 *      9th: -EBUSY, "the most a uid other than its owner may hold"), uid
 *      4001 of group 4242 gets 6 (the 7th: "kept for its owner"), the
 *      owner's 2 consumers still attach; once 65534's go, 4001 gets 2
 *      more (its 8)
 *   7  65534's 8 consumers read nothing and max_lag cuts them (their
 *      slots stay taken, their mask bits clear): 4001 still gets 6, the
 *      owner 2; on a receiving end (--peer-flow-owner 0:4242) two uids
 *      of the group get 8 each (nothing is kept for the owner there)
 *   8  guests' producer slots, on such a flow: 65534's producers get 32
 *      of the 64 ("the most a uid other than its owner may hold"), 4001's
 *      24 ("kept for its owner's producers"), the owner's the last 8;
 *      once 65534's go, 4001 gets 8 more (its 32)
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <sys/mman.h>
#include <sys/prctl.h>

#define NOBODY 65534u
#define GROUP 4242u
#define OTHER 4000u        /* a uid with no entry in /etc/passwd */

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin;

/* ---- daemons (harness.h tracks them: none outlives a failed case) ------ */

static void start(struct hd *d, const char *tag, bool listen,
		  const char *const *extra)
{
	hd_start(d, moverd_bin, tag, listen, extra);
}

/* ---- clients -------------------------------------------------------------- */

/* An attaching child's result: 0 or the negative errno of its attach. */
static int attach_reap(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 126);
	return -WEXITSTATUS(st);
}

/* How a child attaches: flowshm_attach_owned with that owner and wait. */
struct ask {
	uid_t owner;
	int64_t wait_ns;
};

/*
 * Attach to flow on d in a child running as uid/gid with the supplementary
 * groups given (none if n is 0), as ask says (NULL: flowshm_attach), and
 * detach: 0 or the negative errno of the attach.  The child's pid, if
 * pid is not NULL: then the caller reaps it (attach_reap).
 */
static int attach_child(const struct hd *d, uid_t uid, gid_t gid,
			const gid_t *groups, size_t n, const char *flow,
			enum flowshm_role role, const struct ask *ask,
			pid_t *child)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *f;
		int rc;

		setenv("FLOWMOVER_SOCKET", d->sock, 1);
		if (setgroups(n, groups) || setresgid(gid, gid, gid) ||
		    setresuid(uid, uid, uid)) {
			perror("drop privileges");
			_exit(126);
		}
		rc = ask ? flowshm_attach_owned(flow, role, ask->owner, NULL,
						ask->wait_ns, &f) :
			   flowshm_attach(flow, role, NULL, &f);
		if (rc) {
			printf("    uid %u gid %u (+%zu groups): attach %s: %s\n",
			       (unsigned)uid, (unsigned)gid, n, flow,
			       flowshm_attach_error());
			fflush(stdout);
			_exit(-rc);
		}
		flowshm_detach(f);
		_exit(0);
	}
	if (child) {
		*child = pid;
		return 0;
	}
	return attach_reap(pid);
}

static int attach_as(const struct hd *d, uid_t uid, gid_t gid,
		     const gid_t *groups, size_t n, const char *flow,
		     enum flowshm_role role)
{
	return attach_child(d, uid, gid, groups, n, flow, role, NULL, NULL);
}

/* As uid (its own group), only to a flow owner owns. */
static int owned_as(const struct hd *d, uid_t uid, const char *flow,
		    enum flowshm_role role, uid_t owner, int64_t wait_ns,
		    pid_t *child)
{
	const struct ask ask = { owner, wait_ns };

	return attach_child(d, uid, uid, NULL, 0, flow, role, &ask, child);
}

/* The same, as a consumer with the user's own group and no other. */
static int consume_as(const struct hd *d, uid_t uid, const char *flow)
{
	return attach_as(d, uid, uid, NULL, 0, flow, FLOWSHM_CONSUMER);
}

static pid_t fc_produce(const struct hd *d, uid_t uid, const char *flow,
			unsigned long count)
{
	char n[24];

	snprintf(n, sizeof(n), "%lu", count);
	return hx_spawn(d, uid, (const char *const[]){ flowcheck_bin,
			"produce", flow, "--id", "1", "--count", n,
			"--max-size", "1000", NULL });
}

static pid_t fc_consume(const struct hd *d, uid_t uid, const char *flow,
			unsigned long count)
{
	char n[24];

	snprintf(n, sizeof(n), "%lu", count);
	return hx_spawn(d, uid, (const char *const[]){ flowcheck_bin,
			"consume", flow, "--producers", "1", "--count", n,
			"--max-size", "1000", NULL });
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

/* ---- moverctl views -------------------------------------------------------- */

/* The "allow_uids"/"allow_gids" list of `flow show --json`, as text. */
static void allow_list(const struct hd *d, const char *name, const char *key,
		       char *out, size_t cap)
{
	char json[4096], pat[40];
	const char *p, *e;

	CHECK(hd_flow_json(d, moverctl_bin, name, json, sizeof(json)));
	snprintf(pat, sizeof(pat), "\"%s\": [", key);
	p = strstr(json, pat);
	CHECK(p);
	p += strlen(pat);
	e = strchr(p, ']');
	CHECK(e);
	snprintf(out, cap, "%.*s", (int)(e - p), p);
}

/* A (sender, no listen) and B (receiver, EXTRA); flow NAME from A to B. */
static void two_daemons(struct hd *a, struct hd *b, const char *tag,
			const char *const *b_extra, const char *name,
			const char *a_flags)
{
	static const char *const tcp[] = { "--transport", "tcp", NULL };
	char ta[32], tb[32], out[4096];

	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	start(b, tb, true, b_extra);
	start(a, ta, false, tcp);
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow create %s --peer "
		     "127.0.0.1:%d --ring-size 64K --max-record 1024 %s", name,
		     b->port, a_flags) == 0);
	CHECK(hd_wait_state(a, moverctl_bin, name, "open", 10000, NULL, 0));
	CHECK(hd_wait_state(b, moverctl_bin, name, "open", 10000, NULL, 0));
}

/* ---- case 1: remote uids ignored; flow allow, kept across a restart ------- */

static void case_remote_uids(void)
{
	struct hd a, b;
	char out[4096], list[256];
	pid_t cons, prod;
	int rc, fd;

	two_daemons(&a, &b, "acl1", NULL, "r1", "--allow-uid 65534");
	rc = consume_as(&b, NOBODY, "r1");
	printf("  B: uid %u attaches to r1 (allowed on A only): %d\n", NOBODY,
	       rc);
	CHECK_RC(rc, -EACCES);
	allow_list(&b, "r1", "allow_uids", list, sizeof(list));
	printf("  B: r1's allowed uids: [%s]\n", list);
	CHECK(!strcmp(list, ""));

	/* not the flow's owner: may not grant itself */
	rc = hd_ctl_as(&b, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow allow r1 --uid %u", NOBODY);
	printf("  B: uid %u runs flow allow: exit %d: %s", NOBODY, rc, out);
	CHECK(rc == 4);
	/* it may not see r1: it learns the name is taken, not whose it is */
	CHECK(strstr(out, "is not yours") && !strstr(out, "uid 0"));
	CHECK_RC(consume_as(&b, NOBODY, "r1"), -EACCES);

	rc = hd_ctl(&b, moverctl_bin, out, sizeof(out),
		    "flow allow r1 --uid nobody");
	printf("  B: root runs flow allow r1 --uid nobody: exit %d: %s", rc, out);
	CHECK(rc == 0);
	CHECK_RC(consume_as(&b, NOBODY, "r1"), 0);
	/* now it may see r1 (show, list), and so whose it is */
	rc = hd_ctl_as(&b, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow disallow r1 --uid %u", NOBODY);
	printf("  B: uid %u runs flow disallow: exit %d: %s", NOBODY, rc, out);
	CHECK(rc == 4 && strstr(out, "belongs to uid 0"));

	/* kill -9 and start again: the grant is in r1's state file */
	hd_kill(&b);
	hd_restart(&b, moverd_bin, NULL);
	CHECK(hd_wait_state(&b, moverctl_bin, "r1", "open", 15000, NULL, 0));
	allow_list(&b, "r1", "allow_uids", list, sizeof(list));
	printf("  B restarted: r1's allowed uids: [%s]\n", list);
	CHECK(!strcmp(list, "65534"));
	CHECK_RC(consume_as(&b, NOBODY, "r1"), 0);

	/* ... and the flow is still bound to A: another address is refused */
	fd = hp_connect_from(b.port, "127.0.0.2");
	CHECK(hp_hello(fd, "peer-c"));
	{
		struct hp_open o = { "r1", 99, 64 << 10, 1024, 1, 0 };
		char msg[256] = "";

		rc = hp_open_retry(fd, &o, 5000, msg, sizeof(msg));
		printf("  B restarted: C (127.0.0.2) opens r1: %d: %s\n", rc,
		       msg);
		CHECK_RC(rc, -EEXIST);
	}
	close(fd);

	cons = fc_consume(&b, NOBODY, "r1", 5000);
	prod = fc_produce(&a, 0, "r1", 5000);
	fc_done(prod, "r1's producer on A", 30000);
	fc_done(cons, "r1's consumer on B (uid 65534)", 10000);
	printf("  r1: uid %u consumed every record once\n", NOBODY);

	CHECK(hd_ctl(&b, moverctl_bin, out, sizeof(out),
		     "flow disallow r1 --uid 65534") == 0);
	CHECK_RC(consume_as(&b, NOBODY, "r1"), -EACCES);
	/* wrong input gets a clear error */
	rc = hd_ctl(&b, moverctl_bin, out, sizeof(out), "flow allow r1");
	printf("  flow allow without ids: exit %d: %s", rc, out);
	CHECK(rc == 2);
	rc = hd_ctl(&b, moverctl_bin, out, sizeof(out),
		    "flow allow nosuch --uid 1");
	printf("  flow allow of a missing flow: exit %d: %s", rc, out);
	CHECK(rc == 1 && strstr(out, "nosuch"));
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 2: --peer-flow-owner ------------------------------------------- */

static void case_peer_flow_owner(void)
{
	static const char *const owner[] = { "--peer-flow-owner", "65534:4242",
					     NULL };
	const gid_t g[] = { GROUP };
	struct hd a, b;
	char out[4096], list[256];
	int rc;

	two_daemons(&a, &b, "acl2", owner, "o1", "");
	CHECK(hd_flow_json(&b, moverctl_bin, "o1", out, sizeof(out)));
	printf("  B: o1's owner %llu:%llu\n",
	       (unsigned long long)hj_u64(out, "owner_uid"),
	       (unsigned long long)hj_u64(out, "owner_gid"));
	CHECK(hj_u64(out, "owner_uid") == NOBODY);
	CHECK(hj_u64(out, "owner_gid") == GROUP);
	CHECK_RC(consume_as(&b, NOBODY, "o1"), 0);
	rc = attach_as(&b, OTHER, OTHER, g, 1, "o1", FLOWSHM_CONSUMER);
	printf("  B: uid %u in group %u attaches: %d\n", OTHER, GROUP, rc);
	CHECK_RC(rc, 0);
	CHECK_RC(consume_as(&b, OTHER, "o1"), -EACCES);

	/* the owner may grant more */
	rc = hd_ctl_as(&b, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow allow o1 --uid %u", OTHER);
	printf("  B: the owner (uid %u) allows uid %u: exit %d: %s", NOBODY,
	       OTHER, rc, out);
	CHECK(rc == 0);
	CHECK_RC(consume_as(&b, OTHER, "o1"), 0);
	allow_list(&b, "o1", "allow_uids", list, sizeof(list));
	CHECK(!strcmp(list, "4000"));
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 3: another peer opens a flow of A's while A is down ------------- */

#define H_RECORDS 20000

/* The geometry and `published` of B's ring file of flow name. */
static void ring_file(const struct hd *b, const char *name,
		      struct fr_geometry *geo, uint64_t *published)
{
	char path[256];
	struct fr_shared *sh;
	int fd;

	snprintf(path, sizeof(path), "%s/rings/%s.ring", b->dir, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	sh = mmap(NULL, FR_CTRL_BYTES, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(sh != MAP_FAILED);
	*geo = sh->geo;
	/* acquire: moverd's release store of what it deposited */
	*published = atomic_load_explicit(&sh->published, memory_order_acquire);
	munmap(sh, FR_CTRL_BYTES);
	close(fd);
}

/* C opens flow h with h's own ring, from 127.0.0.2: its answer's error. */
static int hijack(const struct hd *b, const char *when)
{
	struct fr_geometry geo;
	uint64_t pub;
	struct hp_open o = { "h", 7, 0, 0, 0, 0 };
	char msg[256] = "";
	int fd, rc;

	ring_file(b, "h", &geo, &pub);
	o.ring_size = geo.ring_bytes;
	o.max_record = geo.max_record;
	o.seal_key = geo.seal_key;
	o.start = pub;
	fd = hp_connect_from(b->port, "127.0.0.2");
	CHECK(hp_hello(fd, "peer-c"));
	rc = hp_open_retry(fd, &o, 5000, msg, sizeof(msg));
	printf("  %s: C (127.0.0.2) opens h at %llu with its ring: %d: %s\n",
	       when, (unsigned long long)pub, rc, msg);
	if (rc == 0) {
		/* what a hijacker does next: its own bytes into the ring */
		static uint8_t junk[4096];

		memset(junk, 0x5a, sizeof(junk));
		hp_send_hdr(fd, WIRE_DATA, o.flow_id, sizeof(junk), pub, 0);
		hp_send_all(fd, junk, sizeof(junk));
		usleep(300000);
	}
	close(fd);
	return rc;
}

static void case_hijack(void)
{
	struct hd a, b;
	struct fr_geometry geo;
	uint64_t pub_before, pub_after;
	pid_t cons, prod;
	char out[4096], origin[64] = "";
	int base;

	two_daemons(&a, &b, "acl3", NULL, "h", "");
	cons = fc_consume(&b, 0, "h", H_RECORDS);
	prod = fc_produce(&a, 0, "h", H_RECORDS);
	/* some records through, then A dies; its producer fills h's ring */
	for (int i = 0; i < 200; i++) {
		ring_file(&b, "h", &geo, &pub_before);
		if (pub_before > 256 << 10)
			break;
		usleep(20000);
	}
	hd_kill(&a);
	CHECK(hd_wait_state(&b, moverctl_bin, "h", "reconnecting", 10000, NULL,
			    0));
	ring_file(&b, "h", &geo, &pub_before);
	base = hd_log_count(&b, "refused");

	CHECK_RC(hijack(&b, "A down"), -EEXIST);
	ring_file(&b, "h", &geo, &pub_after);
	CHECK(pub_after == pub_before);
	CHECK(hd_log_count(&b, "refused") > base);
	CHECK(hd_flow_json(&b, moverctl_bin, "h", out, sizeof(out)));
	CHECK(hj_u64(out, "consumers") == 1);
	CHECK(hj_get(out, "origin", origin, sizeof(origin)));
	printf("  B: h's published %llu before and after, consumer attached, "
	       "bound to %s\n", (unsigned long long)pub_after, origin);
	CHECK(!strcmp(origin, "127.0.0.1"));

	hd_restart(&a, moverd_bin, (const char *const[]){ "--transport", "tcp",
							 NULL });
	fc_done(prod, "h's producer on A", 60000);
	fc_done(cons, "h's consumer on B", 20000);
	printf("  h: A resumed, every record exactly once\n");

	/* B restarted: h, re-adopted, is still A's */
	hd_kill(&b);
	hd_restart(&b, moverd_bin, NULL);
	CHECK(hd_wait_state(&b, moverctl_bin, "h", "open", 15000, NULL, 0));
	CHECK_RC(hijack(&b, "B restarted"), -EEXIST);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 4: supplementary groups --------------------------------------- */

/* A raw create of name (64 KiB) that allows uid: what moverd answers. */
static int create_allowing(const struct hd *d, const char *name, uint32_t uid)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec spec = FLOWMOVER__FLOW_SPEC__INIT;
	Flowmover__Response *resp = NULL;
	int s = ctl_connect(d->sock), rc;

	CHECK(s >= 0);
	spec.name = (char *)name;
	spec.ring_size = 65536;
	spec.allow_uids = &uid;
	spec.n_allow_uids = 1;
	cr.spec = &spec;
	req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	req.create = &cr;
	rc = ctl_call(s, &req, &resp, NULL, 5000);
	ctl_response_free(resp);
	close(s);
	return rc;
}

static void case_groups(void)
{
	const gid_t g[] = { 100, GROUP };
	struct hd d;
	char out[4096];
	int rc;

	start(&d, "acl4", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create g "
		     "--ring-size 64K --allow-gid %u", GROUP) == 0);
	rc = attach_as(&d, OTHER, OTHER, g, 2, "g", FLOWSHM_PRODUCER);
	printf("  uid %u gid %u, supplementary 100,%u: attach: %d\n", OTHER,
	       OTHER, GROUP, rc);
	CHECK_RC(rc, 0);
	rc = attach_as(&d, OTHER, OTHER, g, 1, "g", FLOWSHM_PRODUCER);
	printf("  uid %u gid %u, supplementary 100: attach: %d\n", OTHER,
	       OTHER, rc);
	CHECK_RC(rc, -EACCES);
	/* the primary group still counts */
	CHECK_RC(attach_as(&d, OTHER, GROUP, NULL, 0, "g", FLOWSHM_PRODUCER), 0);
	/* (uid_t)-1 is no id: moverd refuses it at create, as at flow
	 * allow (moverctl refuses it before asking) */
	CHECK_RC(create_allowing(&d, "g2", UINT32_MAX), -EINVAL);
	printf("  a raw create allowing uid 4294967295: %s\n",
	       ctl_last_error());
	CHECK(strstr(ctl_last_error(), "are not ids"));
	CHECK(!hd_flow_json(&d, moverctl_bin, "g2", out, sizeof(out)));
	hd_stop(&d);
}

/* ---- case 5: a name taken first by another user ------------------------- */

/* The producers and consumers moverd counts on flow name. */
static uint64_t attached(const struct hd *d, const char *name)
{
	char json[4096];

	CHECK(hd_flow_json(d, moverctl_bin, name, json, sizeof(json)));
	return hj_sum(json, "producers+consumers");
}

static void case_owner(void)
{
	struct hd d;
	char out[4096];
	pid_t waiter;
	int rc, sock, fd = -1;

	start(&d, "acl5", false, NULL);
	/* uid OTHER takes the name NOBODY's program will attach to, and lets
	 * NOBODY in */
	CHECK(hd_ctl_as(&d, moverctl_bin, OTHER, out, sizeof(out), "flow "
			"create payroll --ring-size 64K --allow-uid %u",
			NOBODY) == 0);
	/* a plain attach trusts the name (docs/security.md) */
	CHECK_RC(attach_as(&d, NOBODY, NOBODY, NULL, 0, "payroll",
			   FLOWSHM_PRODUCER), 0);
	rc = owned_as(&d, NOBODY, "payroll", FLOWSHM_PRODUCER, NOBODY, 0, NULL);
	printf("  uid %u attaches to payroll as its own: %d\n", NOBODY, rc);
	CHECK_RC(rc, -EACCES);
	CHECK_RC(owned_as(&d, NOBODY, "payroll", FLOWSHM_CONSUMER, NOBODY, 0,
			  NULL), -EACCES);
	/* refused by moverd itself (the library checks again), before a
	 * slot was taken: root, who may attach to any flow, asks */
	sock = ctl_connect(d.sock);
	CHECK(sock >= 0);
	CHECK_RC(hc_attach_owned(sock, "payroll", FLOWMOVER__ROLE__CONSUMER,
				 NOBODY, &fd), -EACCES);
	CHECK(fd < 0);
	CHECK(attached(&d, "payroll") == 0);
	CHECK_RC(hc_attach_owned(sock, "payroll", FLOWMOVER__ROLE__CONSUMER,
				 OTHER, &fd), 0);
	CHECK(fd >= 0 && attached(&d, "payroll") == 1);
	close(fd);
	close(sock);
	/* asking for the real owner works */
	CHECK_RC(owned_as(&d, NOBODY, "payroll", FLOWSHM_CONSUMER, OTHER, 0,
			  NULL), 0);

	/* waiting for a flow of one's own: the other user's is refused when
	 * it appears, not taken and not waited past */
	owned_as(&d, NOBODY, "later", FLOWSHM_PRODUCER, NOBODY,
		 30000000000ll, &waiter);
	usleep(300000); /* parked in moverd (an early create is fine too) */
	CHECK(hd_ctl_as(&d, moverctl_bin, OTHER, out, sizeof(out), "flow "
			"create later --ring-size 64K --allow-uid %u",
			NOBODY) == 0);
	rc = attach_reap(waiter);
	printf("  uid %u waiting for its own 'later'; uid %u creates it: %d\n",
	       NOBODY, OTHER, rc);
	CHECK_RC(rc, -EACCES);
	CHECK(attached(&d, "later") == 0);

	/* a flow of one's own, and root's */
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out), "flow "
			"create mine --ring-size 64K") == 0);
	CHECK_RC(owned_as(&d, NOBODY, "mine", FLOWSHM_PRODUCER, NOBODY, 0,
			  NULL), 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create rootf "
		     "--ring-size 64K --allow-uid %u", NOBODY) == 0);
	CHECK_RC(owned_as(&d, NOBODY, "rootf", FLOWSHM_CONSUMER, 0, 0, NULL),
		 0);
	CHECK_RC(owned_as(&d, NOBODY, "rootf", FLOWSHM_CONSUMER, NOBODY, 0,
			  NULL), -EACCES);
	hd_stop(&d);
}

/* ---- case 6: guests' subscriber slots ---------------------------------- */

struct holder {
	pid_t pid;
	unsigned took;
};

/* A child as uid:gid attaches up to `max` clients of `role` to flow, a
 * control connection for each 16 (moverd holds each one's slot while it
 * is open), and keeps them until it is killed (let_go); took says how
 * many it got. */
static void hold_role(const struct hd *d, uid_t uid, gid_t gid,
		      const char *flow, Flowmover__Role role, unsigned max,
		      struct holder *h)
{
	int told[2];

	CHECK(pipe(told) == 0);
	fflush(NULL);
	h->pid = fork();
	CHECK(h->pid >= 0);
	if (h->pid == 0) {
		unsigned took = 0;
		int s = -1, fd, rc = 0;

		close(told[0]);
		if (setgroups(0, NULL) || setresgid(gid, gid, gid) ||
		    setresuid(uid, uid, uid))
			_exit(126);
		/* a failed check ends us; after the uid change, which
		 * clears it (and the parent may be gone already) */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(1);
		while (took < max) {
			if (took % 16 == 0 && (s = ctl_connect(d->sock)) < 0)
				break;
			if ((rc = hc_attach(s, flow, role, &fd)))
				break;
			close(fd);
			took++;
		}
		printf("    uid %u: %u %s attached; then %d: %s\n",
		       (unsigned)uid, took,
		       role == FLOWMOVER__ROLE__CONSUMER ? "consumers" :
							   "producers",
		       rc, rc ? ctl_last_error() : "");
		fflush(stdout);
		if (write(told[1], &took, sizeof(took)) != sizeof(took))
			_exit(1);
		pause();
		_exit(0);
	}
	close(told[1]);
	CHECK(read(told[0], &h->took, sizeof(h->took)) == sizeof(h->took));
	close(told[0]);
}

/* hold_role of up to 16 consumers: one connection's worth. */
static void hold_slots(const struct hd *d, uid_t uid, gid_t gid,
		       const char *flow, struct holder *h)
{
	hold_role(d, uid, gid, flow, FLOWMOVER__ROLE__CONSUMER, 16, h);
}

/* The holder goes, and with its connections its slots. */
static void let_go(struct holder *h)
{
	int st;

	CHECK(kill(h->pid, SIGKILL) == 0);
	CHECK(waitpid(h->pid, &st, 0) == h->pid);
	CHECK(WIFSIGNALED(st));
}

/* 6, 7: d, flow `name` (64 KiB, opts) that OTHER owns, allowing NOBODY
 * and GROUP; NOBODY holds its 8 consumer slots (*nobody). */
static void guests_flow(struct hd *d, const char *tag, const char *name,
			const char *opts, struct holder *nobody)
{
	char out[4096];

	start(d, tag, false, NULL);
	CHECK(hd_ctl_as(d, moverctl_bin, OTHER, out, sizeof(out), "flow "
			"create %s --ring-size 64K %s --allow-uid %u "
			"--allow-gid %u", name, opts, NOBODY, GROUP) == 0);
	hold_slots(d, NOBODY, NOBODY, name, nobody);
	CHECK(nobody->took == 8);
}

static void case_guest_slots(void)
{
	struct holder nobody, member, owner, more;
	struct hd d;

	guests_flow(&d, "acl6", "shared", "", &nobody);
	hold_slots(&d, OTHER + 1, GROUP, "shared", &member);
	CHECK(member.took == 6);
	hold_slots(&d, OTHER, OTHER, "shared", &owner);
	CHECK(owner.took == 2);
	CHECK(attached(&d, "shared") == 16);
	let_go(&nobody);
	/* moverd gives nobody's slots back when it sees the connection end */
	for (int i = 0; i < 500 && attached(&d, "shared") != 8; i++)
		usleep(10000);
	CHECK(attached(&d, "shared") == 8);
	hold_slots(&d, OTHER + 1, GROUP, "shared", &more);
	printf("  uid %u's consumers gone: uid %u takes %u more\n", NOBODY,
	       OTHER + 1, more.took);
	CHECK(more.took == 2);
	let_go(&more);
	let_go(&member);
	let_go(&owner);
	hd_stop(&d);
}

/*
 * Slots that max_lag cut are still taken (until their holders leave) but
 * clear in the subscriber mask: counted from the mask, two guests took the
 * owner's two past 8 cut ones (a review).  On a receiving end nothing is
 * kept for the owner (the host's --peer-flow-owner; moverd holds no slot
 * there): two guest uids get 8 each.
 */
static void case_guest_cut(void)
{
	static const char *const owner[] = { "--peer-flow-owner", "0:4242",
					     NULL };
	struct holder nobody, member, owner_h, g1, g2;
	char rec[512] = { 0 };
	flowshm_t *prod;
	struct hd d, a, b;
	int sent = 0;

	guests_flow(&d, "acl7", "lagged", "--max-lag 8K", &nobody);
	/* root's producer writes past max_lag: the 8 consumers, which read
	 * nothing, are cut and keep their slots */
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("lagged", FLOWSHM_PRODUCER, NULL, &prod), 0);
	for (int i = 0; i < 200; i++) /* until the ring is full */
		sent += !flowshm_send(prod, rec, sizeof(rec), 10000000);
	CHECK(sent > 8 * 1024 / 512);
	hold_slots(&d, OTHER + 1, GROUP, "lagged", &member);
	hold_slots(&d, OTHER, OTHER, "lagged", &owner_h);
	printf("  8 guest consumers cut by max_lag, %d records sent: uid %u "
	       "takes %u, the owner %u\n", sent, OTHER + 1, member.took,
	       owner_h.took);
	CHECK(member.took == 6 && owner_h.took == 2);
	flowshm_detach(prod);
	let_go(&owner_h);
	let_go(&member);
	let_go(&nobody);
	hd_stop(&d);

	two_daemons(&a, &b, "acl7r", owner, "r7", "");
	hold_slots(&b, OTHER, GROUP, "r7", &g1);
	hold_slots(&b, OTHER + 1, GROUP, "r7", &g2);
	printf("  a receiving end (owner root, group %u): uid %u takes %u, "
	       "uid %u %u\n", GROUP, OTHER, g1.took, OTHER + 1, g2.took);
	CHECK(g1.took == 8 && g2.took == 8);
	let_go(&g1);
	let_go(&g2);
	hd_stop(&a);
	hd_stop(&b);
}

/*
 * Producer slots are shared the same way (a review: 64 producer attaches
 * of one allowed uid took all 64, and the owner's producer got -EBUSY):
 * a guest uid gets 32, another of the allowed group 24 (the last 8 free
 * are kept for the owner), the owner the last 8; once the first guest's
 * go, the second gets 8 more (its 32).
 */
static void case_guest_producers(void)
{
	struct holder nobody, member, owner, more;
	char out[4096];
	struct hd d;

	start(&d, "acl8", false, NULL);
	CHECK(hd_ctl_as(&d, moverctl_bin, OTHER, out, sizeof(out), "flow "
			"create pshared --ring-size 64K --allow-uid %u "
			"--allow-gid %u", NOBODY, GROUP) == 0);
	hold_role(&d, NOBODY, NOBODY, "pshared", FLOWMOVER__ROLE__PRODUCER,
		  64, &nobody);
	CHECK(nobody.took == 32);
	hold_role(&d, OTHER + 1, GROUP, "pshared", FLOWMOVER__ROLE__PRODUCER,
		  64, &member);
	CHECK(member.took == 24);
	hold_role(&d, OTHER, OTHER, "pshared", FLOWMOVER__ROLE__PRODUCER, 64,
		  &owner);
	CHECK(owner.took == 8);
	CHECK(attached(&d, "pshared") == 64);
	let_go(&nobody);
	for (int i = 0; i < 500 && attached(&d, "pshared") != 32; i++)
		usleep(10000);
	CHECK(attached(&d, "pshared") == 32);
	hold_role(&d, OTHER + 1, GROUP, "pshared", FLOWMOVER__ROLE__PRODUCER,
		  64, &more);
	printf("  uid %u's producers gone: uid %u takes %u more\n", NOBODY,
	       OTHER + 1, more.took);
	CHECK(more.took == 8);
	let_go(&more);
	let_go(&member);
	let_go(&owner);
	hd_stop(&d);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_remote_uids, "remote uids ignored; flow allow, kept "
		  "across a restart" },
		{ 2, case_peer_flow_owner, "--peer-flow-owner" },
		{ 3, case_hijack, "another peer opens A's flow while A is "
		  "down" },
		{ 4, case_groups, "supplementary groups in the gid check" },
		{ 5, case_owner, "a name taken first by another user" },
		{ 6, case_guest_slots, "guests' subscriber slots: a share "
		  "per uid, two kept for the owner" },
		{ 7, case_guest_cut, "guests' slots cut by max_lag still "
		  "count; a receiving end keeps none for its owner" },
		{ 8, case_guest_producers, "guests' producer slots: 32 per "
		  "uid, the last 8 kept for the owner" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]), "FM_ACL_CASES");
}
