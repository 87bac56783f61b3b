/*
 * tests/test_config.c - flows declared in moverd's config file (issue 10):
 * real moverd daemons started with --config, moverctl against them, real
 * producers and consumers (flowcheck).  FM_CONFIG_CASES=1,3 runs only
 * those cases.
 *
 *   usage: test_config MOVERD MOVERCTL FLOWCHECK
 *
 *   1  declared at start: the flows exist with the declared sizes and
 *      allowed ids, owned by moverd's user, shown as declared; a moverd
 *      killed and started again has them again, as declared
 *   2  flow create of a declared flow (and of a moverctl-created one) with
 *      the same parameters: exit 0, "exists"; with a different ring size,
 *      max record, peer or allowed uid: exit 1 and the parameter named
 *   3  moverctl reload: an added flow is created, a removed one destroyed,
 *      an unchanged one untouched while a producer and a consumer move
 *      records through it across the reload (every record exactly once,
 *      same creation time), a moverctl-created flow untouched; a changed
 *      declaration of a flow in use is refused (exit 1, "in use"), of an
 *      idle flow applied (re-created); a change of allowed ids only is
 *      applied in place, in use or not, keeping ids granted by hand
 *   4  SIGHUP applies the file the same way
 *   5  a malformed flow line: moverd refuses to start naming FILE:LINE;
 *      at a reload it is refused with FILE:LINE and nothing changes
 *   6  two hosts declare the same line `flow = NAME peer=B:PORT
 *      allow-uid=65534`: A (sender) creates it, B (its --listen is the
 *      peer) grants uid 65534, whose consumer gets every record of A's
 *      producer exactly once; B's root disallows the uid: its attaches
 *      stay refused, also after a reload of the unchanged file
 *   7  a declared flow to two peer hosts (peer= twice) with max-lag=:
 *      flow create with the same peers and max-lag exists, with another
 *      peer set or max-lag fails naming it; a reload that drops a peer
 *      or adds one does it in place (the attached producer stays), so
 *      does one that changes max-lag (alone, or with the peer set); one
 *      that changes the ring size of a flow in use is refused; a state
 *      file from before moverd kept max_lag (its max_lag= line taken out,
 *      the ring's word 32768): the start says they differ and takes the
 *      config's 32K in place
 *   8  cpus: `cpus = 0` in the config puts every thread of moverd (with a
 *      doorbell thread, so there are two at least) on cpu 0, and --cpus
 *      on the command line overrides it (on a host with two cpus); a list
 *      that does not parse is refused (exit 2), one with no usable cpu
 *      too (exit 1), each with a message naming it
 *   9  a flow a user created under a name declared later: the reload
 *      refuses it naming the uid, it is not shown as declared, root's
 *      flow create of it fails naming the owner; after the user destroys
 *      it the reload creates the declared one
 *  10  a receiving end's allow-uid changed (1001 to 1002): the reload takes
 *      1001 off the flow from the peer, grants 1002, keeps an id granted
 *      by hand, and says so
 *  11  a declaration changed to one that cannot be created (ring-size
 *      above --max-ring-size): refused before anything is destroyed; the
 *      flow stays as it was
 *  12  a flow between hosts whose receiver holds records its consumer has
 *      not read: a changed ring size is refused ("in use"), the
 *      receiver's flow and records stay; once read, the change applies
 *  13  a declaration taken out of the file while its flow is in use: the
 *      flow is not destroyed, the reload says so (exit 1), the flow stays
 *      undeclared; once idle, an operator destroys it by hand
 *  14  a change refused half way (max-lag changed in place, the ids
 *      refused: the allow list is full): the next reload compares with
 *      what the flow has, so restoring the old file puts max-lag back
 *  15  option lines at a reload: an unknown option or a bad value is
 *      refused (exit 1, FILE:LINE, nothing applied), as the next start
 *      would; a changed one is said to take effect at restart
 *  16  a config given as a symlink is read where the link points at each
 *      reload; a config others may write is refused at reload and start
 *  17  a name in allow-uid / allow-gid is looked up once per read of the
 *      file, whatever the number of flows naming it (an LD_PRELOAD shim
 *      counts getpwnam and getgrnam): 40 flows allowed to user nobody and
 *      group nogroup, two lookups per reload (80 before), the ids right
 *  18  a receiving end's from= (the same line on both hosts): B takes the
 *      flow from the networks it names only.  Not named, A's open is
 *      refused (A's flow fails saying why; B has no such flow, where
 *      before the first opener bound the name); named after a reload, A's
 *      flow opens and moves every record once; taken out of from= again,
 *      the reload says the sender is no longer named, and A's resume
 *      after a restart is refused; a bad from= is refused at a reload
 *  19  a reload whose name lookup hangs (the shim holds getpwnam, as an
 *      NSS server that does not answer): `moverctl status` is answered and
 *      a producer and a consumer move records meanwhile (before, the loop
 *      waited in getpwnam and status timed out); a second reload and a
 *      SIGHUP asked meanwhile share the next run, which reads the file as
 *      changed meanwhile; both answers come once the lookup returns; a
 *      stop while a lookup hangs exits at once and cleanly, and a
 *      `moverctl reload` waiting then is told the reload was not applied
 */
#include "harness.h"

#include <dirent.h>

#define NOBODY 65534u

static const char *moverd_bin, *moverctl_bin, *flowcheck_bin, *count_nss_so;

/* ---- a moverd with a config file of the test's own ------------------------ */

static void conf_path(const struct hd *d, char *out, size_t cap)
{
	snprintf(out, cap, "%s/moverd.conf", d->dir);
}

static void write_conf(const struct hd *d, const char *text)
{
	char path[160], tmp[170];
	FILE *f;

	conf_path(d, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.new", path);
	f = fopen(tmp, "we");
	CHECK(f);
	CHECK(fputs(text, f) >= 0);
	CHECK(fclose(f) == 0);
	CHECK(chmod(tmp, 0644) == 0); /* moverd refuses others' writes */
	CHECK(rename(tmp, path) == 0); /* a reload never sees half a file */
}

/* d's directory and config (port: its --listen, 0 = none), then moverd. */
static void start_conf(struct hd *d, const char *tag, int port,
		       const char *text)
{
	static char path[160];
	const char *extra[] = { "--config", path, NULL };

	snprintf(d->dir, sizeof(d->dir), "/tmp/fm-%s-%d", tag, (int)getpid());
	snprintf(d->sock, sizeof(d->sock), "%s/moverd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/moverd.log", d->dir);
	CHECK(mkdir(d->dir, 0755) == 0 || errno == EEXIST);
	d->port = port;
	write_conf(d, text);
	conf_path(d, path, sizeof(path));
	hd_exec(d, moverd_bin, extra);
}

/*
 * After a kill -9: the killed moverd's listening socket can accept for a
 * moment after it is gone (its io_uring goes after the process), so
 * hd_exec's connect may have reached the old one: wait until the new
 * moverd answers.
 */
static void restart_conf(struct hd *d)
{
	static char path[160];
	const char *extra[] = { "--config", path, NULL };
	char out[4096];

	conf_path(d, path, sizeof(path));
	hd_restart(d, moverd_bin, extra);
	for (int i = 0; i < 500; i++) {
		if (!hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") &&
		    hj_u64(out, "pid") == (uint64_t)d->pid)
			return;
		usleep(10000);
	}
	CHECK(!"the restarted moverd does not answer");
}

static int ctl(const struct hd *d, char *out, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int ctl(const struct hd *d, char *out, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = tu_vmoverctl(moverctl_bin, d->sock, out, cap, fmt, ap);
	va_end(ap);
	return rc;
}

static bool flow_exists(const struct hd *d, const char *name)
{
	char out[4096];

	return hd_flow_json(d, moverctl_bin, name, out, sizeof(out));
}

/* A field of `flow show NAME --json`; the flow must exist. */
static uint64_t flow_u64(const struct hd *d, const char *name, const char *key)
{
	char out[4096];

	CHECK(hd_flow_json(d, moverctl_bin, name, out, sizeof(out)));
	return hj_u64(out, key);
}

static void expect_out(const char *out, const char *want)
{
	if (!strstr(out, want)) {
		fprintf(stderr, "expected '%s' in:\n%s\n", want, out);
		exit(1);
	}
}

/* ---- producers and consumers ---------------------------------------------- */

static pid_t fc(const struct hd *d, uid_t uid, const char *what,
		const char *flow, unsigned long count)
{
	char n[24];

	snprintf(n, sizeof(n), "%lu", count);
	if (!strcmp(what, "produce"))
		return hx_spawn(d, uid, (const char *const[]){ flowcheck_bin,
				"produce", flow, "--id", "1", "--count", n,
				"--max-size", "500", NULL });
	return hx_spawn(d, uid, (const char *const[]){ flowcheck_bin,
			"consume", flow, "--producers", "1", "--count", n,
			"--max-size", "500", NULL });
}

static void fc_done(pid_t pid, const char *what)
{
	int rc = hx_wait(pid, 120000);

	if (rc != 0) {
		fprintf(stderr, "%s: %s (exit %d)\n", what, rc < 0 ?
			"did not finish in time (killed)" : "failed", rc);
		exit(1);
	}
}

/* n records of flow from a producer on a to a consumer on b, both as uid;
 * every one exactly once, or the test fails naming the consumer's why. */
static void move_a_to_b(const struct hd *a, const struct hd *b, uid_t uid,
			const char *flow, unsigned long n, const char *why)
{
	pid_t cons = fc(b, uid, "consume", flow, n);
	pid_t prod = fc(a, uid, "produce", flow, n);
	char what[160];

	fc_done(prod, "producer on A");
	snprintf(what, sizeof(what), "consumer on B (%s)", why);
	fc_done(cons, what);
}

/* ---- cases ------------------------------------------------------------------ */

static const char conf1[] =
	"# declared flows\n"
	"log-level = debug\n"
	"flow = orders ring-size=64K max-record=1K allow-uid=65534,4000 "
	"allow-gid=4242\n"
	"flow events\n";

static void case_declared_at_start(void)
{
	struct hd d;
	char out[4096], val[64];

	start_conf(&d, "cfg1", 0, conf1);
	CHECK(hd_flow_json(&d, moverctl_bin, "orders", out, sizeof(out)));
	CHECK(hj_u64(out, "ring_size") == 64 << 10);
	CHECK(hj_u64(out, "max_record") == 1 << 10);
	CHECK(hj_u64(out, "owner_uid") == getuid());
	expect_out(out, "\"allow_uids\": [65534, 4000]");
	expect_out(out, "\"allow_gids\": [4242]");
	CHECK(hj_get(out, "declared", val, sizeof(val)) && !strcmp(val, "true"));
	CHECK(hd_flow_json(&d, moverctl_bin, "events", out, sizeof(out)));
	CHECK(hj_u64(out, "ring_size") == 4 << 20); /* the default */
	/* moverctl's own flows are not declared */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create mine"), 0);
	CHECK(hd_flow_json(&d, moverctl_bin, "mine", out, sizeof(out)));
	CHECK(hj_get(out, "declared", val, sizeof(val)) && !strcmp(val, "false"));
	/* kill -9 and start again: declared again, as declared */
	hd_kill(&d);
	restart_conf(&d);
	CHECK(flow_u64(&d, "orders", "ring_size") == 64 << 10);
	CHECK(flow_exists(&d, "events"));
	hd_stop(&d);
}

static void case_idempotent_create(void)
{
	struct hd d;
	char out[4096];

	start_conf(&d, "cfg2", 0, conf1);
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create orders --ring-size 64K "
		     "--max-record 1K --allow-uid 4000 --allow-uid 65534 "
		     "--allow-gid 4242"), 0);
	expect_out(out, "exists");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create events"), 0);
	expect_out(out, "exists");
	/* the defaults count as asked: 4M is the default ring */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create events --ring-size 4M"), 0);
	expect_out(out, "exists");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create orders --ring-size 128K "
		     "--max-record 1K --allow-uid 4000 --allow-uid 65534 "
		     "--allow-gid 4242"), 1);
	expect_out(out, "different ring-size (the flow has 65536, asked 131072)");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create orders --ring-size 64K "
		     "--max-record 2K --allow-uid 4000 --allow-uid 65534 "
		     "--allow-gid 4242"), 1);
	expect_out(out, "different max-record");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create orders --ring-size 64K "
		     "--max-record 1K --allow-uid 65534 --allow-gid 4242"), 1);
	expect_out(out, "different allow-uid (the flow has 65534,4000, asked "
		   "65534)");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create events "
		     "--peer 127.0.0.1:9"), 1);
	expect_out(out, "different peer");
	/* a moverctl-created flow, the same way */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create mine --ring-size 8K"), 0);
	expect_out(out, "created");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create mine --ring-size 8K"), 0);
	expect_out(out, "exists");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create mine --ring-size 16K"), 1);
	expect_out(out, "ring-size");
	/* JSON says which */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create mine --ring-size 8K "
		     "--json"), 0);
	expect_out(out, "\"existed\": true");
	hd_stop(&d);
}

static const char conf3[] =
	"log-level = debug\n"
	"flow = steady ring-size=64K max-record=1K\n"
	"flow = going ring-size=8K\n"
	"flow = busy ring-size=64K\n"
	"flow = quiet ring-size=8K\n"
	"flow = grant ring-size=8K allow-uid=4000\n";

static const char conf3b[] =
	"log-level = debug\n"
	"flow = steady ring-size=64K max-record=1K\n"
	"flow = coming ring-size=16K\n"
	"flow = busy ring-size=128K\n"
	"flow = quiet ring-size=16K\n"
	"flow = grant ring-size=8K allow-uid=65534\n";

static void case_reload(void)
{
	struct hd d;
	char out[8192];
	uint64_t created, busy_created;
	unsigned long n = 300000;
	pid_t prod, cons, busy_cons, grant_cons;

	start_conf(&d, "cfg3", 0, conf3);
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create mine --ring-size 8K"), 0);
	created = flow_u64(&d, "steady", "created_unix_ms");
	busy_created = flow_u64(&d, "busy", "created_unix_ms");
	/* records through steady across the reload: its producer fills the
	 * ring and waits in it, its consumer comes after the reload (the two
	 * at once moved all 300000 records before it, under ASan too); busy
	 * and grant have a consumer */
	prod = fc(&d, 0, "produce", "steady", n);
	busy_cons = fc(&d, 0, "consume", "busy", 1);
	grant_cons = fc(&d, 0, "consume", "grant", 1);
	CHECK(hd_wait_count(&d, moverctl_bin, "steady", "producers+consumers",
			    1, 90000));
	CHECK(hd_wait_count(&d, moverctl_bin, "busy", "producers+consumers",
			    1, 90000));
	CHECK(hd_wait_count(&d, moverctl_bin, "grant", "producers+consumers",
			    1, 90000));
	/* granted by hand: a reload keeps it */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow allow grant --uid 4001"), 0);
	write_conf(&d, conf3b);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1); /* busy: refused */
	printf("%s", out);
	expect_out(out, "flow coming (line 3): created");
	expect_out(out, "flow going: no longer declared: destroyed");
	expect_out(out, "flow busy (line 4): declaration changed, ring-size "
		   "(the flow has 65536, asked 131072), but the flow is in use");
	expect_out(out, "flow quiet (line 5): re-created: its declaration "
		   "changed");
	expect_out(out, "flow grant (line 6): allowed ids changed in place");
	expect_out(out, "reloaded: 1 added, 1 removed, 2 changed, 1 unchanged, "
		   "1 refused");
	/* grant, in use, kept its ring; 4000 went, 65534 came, 4001 stayed */
	CHECK(hd_flow_json(&d, moverctl_bin, "grant", out, sizeof(out)));
	expect_out(out, "\"allow_uids\": [4001, 65534]");
	CHECK(hj_u64(out, "consumers") == 1);
	CHECK(flow_exists(&d, "coming"));
	CHECK(!flow_exists(&d, "going"));
	CHECK(flow_exists(&d, "mine"));          /* never touched */
	CHECK(flow_u64(&d, "quiet", "ring_size") == 16 << 10);
	CHECK(flow_u64(&d, "busy", "ring_size") == 64 << 10);
	CHECK(flow_u64(&d, "busy", "created_unix_ms") == busy_created);
	CHECK(flow_u64(&d, "steady", "created_unix_ms") == created);
	/* the producer waiting in the full ring is still attached, and what
	 * it wrote before the reload reaches a consumer that came after it */
	CHECK(flow_u64(&d, "steady", "producers") == 1);
	cons = fc(&d, 0, "consume", "steady", n);
	/* a second reload of the same file: only busy is still refused */
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	expect_out(out, "0 added, 0 removed, 0 changed, 4 unchanged, 1 refused");
	fc_done(prod, "producer of steady");
	fc_done(cons, "consumer of steady (every record exactly once)");
	/* busy's consumer goes: the change applies now */
	kill(busy_cons, SIGKILL);
	hx_wait(busy_cons, 5000);
	kill(grant_cons, SIGKILL);
	hx_wait(grant_cons, 5000);
	CHECK(hd_wait_count(&d, moverctl_bin, "busy", "producers+consumers",
			    0, 90000));
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	expect_out(out, "flow busy (line 4): re-created");
	CHECK(flow_u64(&d, "busy", "ring_size") == 128 << 10);
	CHECK(flow_u64(&d, "steady", "created_unix_ms") == created);
	/* only root (or moverd's user) reloads */
	CHECK_RC(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			   "reload"), 4);
	expect_out(out, "only root");
	hd_stop(&d);
}

static void case_sighup(void)
{
	struct hd d;

	start_conf(&d, "cfg4", 0, "flow = one\nflow = two\n");
	CHECK(flow_exists(&d, "one") && flow_exists(&d, "two"));
	write_conf(&d, "flow = two\nflow = three ring-size=8K\n");
	kill(d.pid, SIGHUP);
	for (int i = 0; i < 500 && !flow_exists(&d, "three"); i++)
		usleep(10000);
	CHECK(flow_exists(&d, "three"));
	CHECK(!flow_exists(&d, "one"));
	CHECK(flow_exists(&d, "two"));
	CHECK(hd_log_count(&d, "SIGHUP: reloading") == 1);
	hd_stop(&d);
}

/* moverd --foreground --socket DIR/moverd.sock ARGS must exit with
 * status `want`, saying `says`. */
static void moverd_refuses(const char *dir, const char *args, int want,
			   const char *says)
{
	char cmd[768], out[4096];
	FILE *p;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd), "%s --foreground --socket %s/moverd.sock "
		 "%s 2>&1", moverd_bin, dir, args);
	p = popen(cmd, "r");
	CHECK(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	st = pclose(p);
	printf("    %s", out);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == want);
	expect_out(out, says);
}

static void case_malformed(void)
{
	struct hd d = { 0 };
	char cmd[512], out[4096], path[160];

	snprintf(d.dir, sizeof(d.dir), "/tmp/fm-cfg5-%d", (int)getpid());
	CHECK(mkdir(d.dir, 0755) == 0 || errno == EEXIST);
	write_conf(&d, "flow = fine\n# a comment\nflow = bad ring=1M\n");
	conf_path(&d, path, sizeof(path));
	snprintf(cmd, sizeof(cmd), "--config %s", path);
	snprintf(out, sizeof(out), "%s:3: flow bad: unknown parameter 'ring'",
		 path);
	moverd_refuses(d.dir, cmd, 2, out);

	/* a line too long for the reader is refused, not split: its tail
	 * would have been read as a line of its own */
	{
		char conf[1200];

		memset(conf, 'x', sizeof(conf));
		conf[0] = '#';
		memcpy(conf + 1100, "max-flows 3\n", 13);
		write_conf(&d, conf);
	}
	snprintf(out, sizeof(out), "%s:1: line longer than 1022 bytes", path);
	moverd_refuses(d.dir, cmd, 2, out);
	/* sizes: no sign, no wrap past 2^64 */
	moverd_refuses(d.dir, "--max-ring-size -1", 2,
		       "bad value '-1' for --max-ring-size");
	moverd_refuses(d.dir, "--max-ring-size 20000000000G", 2,
		       "bad value '20000000000G' for --max-ring-size");

	/* at a reload: refused, nothing changes */
	start_conf(&d, "cfg5", 0, "flow = fine\nflow = other\n");
	write_conf(&d, "flow = fine\n\nflow = x ring-size=3000\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	snprintf(cmd, sizeof(cmd), "%s:3: flow x: ring-size '3000'", path);
	expect_out(out, cmd);
	CHECK(flow_exists(&d, "other")); /* not removed: nothing applied */
	CHECK(!flow_exists(&d, "x"));
	write_conf(&d, "flow = a\nflow = a\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	expect_out(out, ":2: flow a is declared twice (first on line 1)");
	/* the first repeat down the file is named, with its first line
	 * (names are checked in name order since 2026-11-30) */
	write_conf(&d, "flow = b1\nflow = a\nflow = b1\nflow = a\n"
		   "flow = b1\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	expect_out(out, ":3: flow b1 is declared twice (first on line 1)");
	hd_stop(&d);
}

/* An attach of flow name as a consumer by uid, on a control connection of
 * its own: 0, or the negative errno moverd answered. */
static int attach_as(const struct hd *d, uid_t uid, const char *name)
{
	int s, fd = -1, rc;

	CHECK(setegid(uid) == 0 && seteuid(uid) == 0);
	s = ctl_connect(d->sock);
	CHECK(seteuid(0) == 0 && setegid(0) == 0);
	CHECK(s >= 0);
	rc = hc_attach(s, name, FLOWMOVER__ROLE__CONSUMER, &fd);
	if (fd >= 0)
		close(fd);
	close(s); /* detached */
	return rc;
}

static void case_two_hosts(void)
{
	struct hd a, b;
	char line[256], out[4096];
	int port = hd_free_port();

	/* the same line on both hosts */
	snprintf(line, sizeof(line), "log-level = debug\n"
		 "flow = fleet ring-size=256K max-record=4K peer=127.0.0.1:%d "
		 "allow-uid=%u\n", port, NOBODY);
	start_conf(&b, "cfg6b", port, line);
	start_conf(&a, "cfg6a", 0, line);
	CHECK(hd_wait_state(&a, moverctl_bin, "fleet", "open", 10000, NULL, 0));
	CHECK(hd_wait_state(&b, moverctl_bin, "fleet", "open", 10000, NULL, 0));
	CHECK(hd_flow_json(&b, moverctl_bin, "fleet", out, sizeof(out)));
	expect_out(out, "\"role\": \"receiver\"");
	move_a_to_b(&a, &b, NOBODY, "fleet", 200000,
		    "uid 65534, granted by B's declaration");
	CHECK(hd_log_count(&b, "declared ids granted") == 1);
	/* A's reload with the same file touches nothing */
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 0);
	expect_out(out, "0 added, 0 removed, 0 changed, 1 unchanged, 0 refused");
	/* B's root takes the declared uid back: its attaches are refused,
	 * and neither they (before: each attach granted the declared ids
	 * again) nor a reload of the unchanged file give it back */
	CHECK(attach_as(&b, NOBODY, "fleet") == 0);
	CHECK_RC(ctl(&b, out, sizeof(out), "flow disallow fleet --uid %u",
		     NOBODY), 0);
	CHECK(attach_as(&b, NOBODY, "fleet") == -EACCES);
	CHECK(attach_as(&b, NOBODY, "fleet") == -EACCES);
	CHECK_RC(ctl(&b, out, sizeof(out), "reload"), 0);
	expect_out(out, "1 unchanged");
	CHECK(attach_as(&b, NOBODY, "fleet") == -EACCES);
	CHECK(hd_log_count(&b, "declared ids granted") == 1);
	printf("  B: uid %u disallowed on the declared receiving end stays "
	       "refused (two attaches, a reload)\n", NOBODY);
	hd_stop(&a);
	hd_stop(&b);
}

/* A declares a flow to B and C (several peer=, max-lag= unless lag is
 * NULL: lossless). */
static void conf_fan(char *out, size_t cap, int bport, int cport, bool with_c,
		     const char *lag)
{
	char c[64] = "";

	if (with_c)
		snprintf(c, sizeof(c), " peer=127.0.0.1:%d", cport);
	snprintf(out, cap, "log-level = debug\n"
		 "flow = fan ring-size=64K max-record=1K peer=127.0.0.1:%d%s"
		 "%s%s\n", bport, c, lag ? " max-lag=" : "", lag ? lag : "");
}

/*
 * 7, last: a state file from before moverd kept max_lag names none (as a
 * lossless flow's): the start goes by the file, not by the ring's word
 * (any client's to write), says they differ, and a declared flow takes
 * the config's max-lag in place.
 */
static void lag_from_old_file(struct hd *a, int bport, int cport)
{
	char text[512], out[8192], cmd[512];
	int changed;

	conf_fan(text, sizeof(text), bport, cport, true, "32K");
	write_conf(a, text);
	CHECK_RC(ctl(a, out, sizeof(out), "reload"), 0);
	CHECK(flow_u64(a, "fan", "max_lag") == 32768);
	changed = hd_log_count(a, "max-lag changed in place (0 to 32768");
	hd_kill(a);
	snprintf(cmd, sizeof(cmd), "f=$(find %s -name fan.flow) && grep -q "
		 "'^max_lag=32768$' $f && sed -i '/^max_lag=/d' $f", a->dir);
	CHECK(system(cmd) == 0);
	restart_conf(a);
	printf("  an old state file (no max_lag=) and a ring saying 32768: "
	       "max_lag %llu after the start\n",
	       (unsigned long long)flow_u64(a, "fan", "max_lag"));
	CHECK(hd_log_count(a, "its ring says max_lag 32768, its state file "
			   "0") == 1);
	CHECK(hd_log_count(a, "max-lag changed in place (0 to 32768") ==
	      changed + 1);
	CHECK(flow_u64(a, "fan", "max_lag") == 32768);
}

static void case_fanout(void)
{
	struct hd a, b, c;
	char text[512], out[8192], baddr[32], caddr[32];
	int bport = hd_free_port(), cport;
	flowshm_t *p = NULL;

	start_conf(&b, "cfg7b", bport, "log-level = debug\n");
	cport = hd_free_port();
	start_conf(&c, "cfg7c", cport, "log-level = debug\n");
	snprintf(baddr, sizeof(baddr), "127.0.0.1:%d", bport);
	snprintf(caddr, sizeof(caddr), "127.0.0.1:%d", cport);
	conf_fan(text, sizeof(text), bport, cport, true, "16K");
	start_conf(&a, "cfg7a", 0, text);
	CHECK(hd_wait_state(&b, moverctl_bin, "fan", "open", 10000, NULL, 0));
	CHECK(hd_wait_state(&c, moverctl_bin, "fan", "open", 10000, NULL, 0));
	CHECK(hd_flow_json(&a, moverctl_bin, "fan", out, sizeof(out)));
	expect_out(out, baddr);
	expect_out(out, caddr);
	CHECK(hj_u64(out, "max_lag") == 16384);
	/* flow create of it: the same peers (in any order after the first)
	 * and max-lag exist; another set or max-lag is named */
	CHECK_RC(ctl(&a, out, sizeof(out), "flow create fan --ring-size 64K "
		     "--max-record 1K --peer %s --peer %s --max-lag 16K", baddr,
		     caddr), 0);
	expect_out(out, "exists");
	CHECK_RC(ctl(&a, out, sizeof(out), "flow create fan --ring-size 64K "
		     "--max-record 1K --peer %s --max-lag 16K", baddr), 1);
	expect_out(out, "different set of peers after the first");
	CHECK_RC(ctl(&a, out, sizeof(out), "flow create fan --ring-size 64K "
		     "--max-record 1K --peer %s --peer %s --peer 127.0.0.1:9 "
		     "--max-lag 16K", baddr, caddr), 1);
	expect_out(out, "different set of peers after the first");
	CHECK_RC(ctl(&a, out, sizeof(out), "flow create fan --ring-size 64K "
		     "--max-record 1K --peer %s --peer %s --max-lag 32K", baddr,
		     caddr), 1);
	expect_out(out, "different max-lag (the flow has 16384, asked 32768)");
	CHECK_RC(ctl(&a, out, sizeof(out), "flow create fan --ring-size 64K "
		     "--max-record 1K --peer %s --peer %s", baddr, caddr), 1);
	expect_out(out, "different max-lag");
	/* a reload that drops C, with a producer attached: C goes (as flow
	 * peer remove), the flow and its producer stay */
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("fan", FLOWSHM_PRODUCER, NULL, &p), 0);
	conf_fan(text, sizeof(text), bport, cport, false, "16K");
	write_conf(&a, text);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 0);
	expect_out(out, "0 added, 0 removed, 1 changed, 0 unchanged, 0 refused");
	CHECK(hd_flow_json(&a, moverctl_bin, "fan", out, sizeof(out)));
	CHECK(!strstr(out, caddr));
	CHECK(hj_u64(out, "producers") == 1);
	for (int i = 0; i < 200 && flow_exists(&c, "fan"); i++)
		usleep(50000);
	CHECK(!flow_exists(&c, "fan"));
	/* and one that adds it back */
	conf_fan(text, sizeof(text), bport, cport, true, "16K");
	write_conf(&a, text);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 0);
	expect_out(out, "0 added, 0 removed, 1 changed, 0 unchanged, 0 refused");
	CHECK(hd_wait_state(&c, moverctl_bin, "fan", "open", 10000, NULL, 0));
	CHECK(hd_flow_json(&a, moverctl_bin, "fan", out, sizeof(out)));
	expect_out(out, caddr);
	CHECK(hj_u64(out, "producers") == 1);
	/* a changed max-lag, with the producer attached: in place (the
	 * ring's lag word), the flow and both peers go on */
	conf_fan(text, sizeof(text), bport, cport, true, "32K");
	write_conf(&a, text);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 0);
	expect_out(out, "0 added, 0 removed, 1 changed, 0 unchanged, 0 refused");
	expect_out(out, "max-lag changed in place (16384 to 32768");
	CHECK(hd_flow_json(&a, moverctl_bin, "fan", out, sizeof(out)));
	CHECK(hj_u64(out, "max_lag") == 32768);
	CHECK(hj_u64(out, "producers") == 1);
	expect_out(out, caddr);
	/* max-lag (back to lossless) and the peer set at once: in place */
	conf_fan(text, sizeof(text), bport, cport, false, NULL);
	write_conf(&a, text);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 0);
	expect_out(out, "0 added, 0 removed, 1 changed, 0 unchanged, 0 refused");
	CHECK(hd_flow_json(&a, moverctl_bin, "fan", out, sizeof(out)));
	CHECK(hj_u64(out, "max_lag") == 0);
	CHECK(!strstr(out, caddr));
	CHECK(hj_u64(out, "producers") == 1);
	/* a changed ring size of a flow in use is still refused, clearly */
	snprintf(text, sizeof(text), "flow = fan ring-size=128K max-record=1K "
		 "peer=127.0.0.1:%d\n", bport);
	write_conf(&a, text);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 1);
	expect_out(out, "ring-size");
	expect_out(out, "in use");
	/* a malformed peer list is refused at reload, naming the line */
	snprintf(text, sizeof(text), "flow = fan peer=127.0.0.1:%d "
		 "peer=127.0.0.1:%d\n", bport, bport);
	write_conf(&a, text);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 1);
	expect_out(out, ":1: flow fan: peer 127.0.0.1:");
	flowshm_detach(p);
	lag_from_old_file(&a, bport, cport);
	hd_stop(&a);
	hd_stop(&b);
	hd_stop(&c);
}

/* Every thread of pid runs on exactly the cpus `list` (/proc's form);
 * returns how many threads there are. */
static int threads_on(pid_t pid, const char *list)
{
	char path[64], line[256], want[96];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	snprintf(want, sizeof(want), "Cpus_allowed_list:\t%s\n", list);
	dir = opendir(path);
	CHECK(dir);
	while ((e = readdir(dir))) {
		char status[sizeof(path) + sizeof(e->d_name) + 8];
		bool seen = false;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(status, sizeof(status), "%s/%s/status", path,
			 e->d_name);
		f = fopen(status, "re");
		if (!f)
			continue; /* a thread that just ended */
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "Cpus_allowed_list:", 18)) {
				if (strcmp(line, want))
					printf("    thread %s: %s", e->d_name,
					       line);
				CHECK(!strcmp(line, want));
				seen = true;
			}
		fclose(f);
		CHECK(seen);
		n++;
	}
	closedir(dir);
	return n;
}

static void case_cpus(void)
{
	const char *over[] = { "--doorbell", "thread", "--cpus", "1", NULL };
	char dir[64];
	struct hd d = { 0 };

	start_conf(&d, "cfg8", 0, "cpus = 0\ndoorbell = thread\n");
	CHECK(threads_on(d.pid, "0") >= 2);
	hd_stop(&d);
	if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) {
		hd_start(&d, moverd_bin, "cfg8b", false, over);
		CHECK(threads_on(d.pid, "1") >= 2);
		hd_stop(&d);
	} else {
		printf("    one cpu online: the override is not tried\n");
	}
	snprintf(dir, sizeof(dir), "/tmp/fm-cfg8c-%d", (int)getpid());
	CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST);
	moverd_refuses(dir, "--cpus 0-x", 2, "bad value '0-x' for --cpus");
	moverd_refuses(dir, "--cpus 1,", 2, "bad value '1,' for --cpus");
	moverd_refuses(dir, "--cpus 1000", 1,
		       "--cpus 1000: none of these cpus is online and allowed");
	CHECK(rmdir(dir) == 0);
}

/*
 * A flow a user made under a name the operator declares later stays the
 * user's (audit of 2026-11-28: it was taken for the declared flow, and the
 * user kept reading what producers of the declared flow wrote).  The
 * reload refuses the declaration naming the uid, and `flow show` says the
 * flow is not declared; root's `flow create` of it fails naming the owner
 * instead of answering "exists" (a script would hand the user its
 * records); the owner's own create of it still exists.  Once the user
 * destroys it, the next reload creates the declared one, moverd's.  And
 * when root destroyed the declared one and the user took the name, taking
 * the declaration out of the file does not destroy the user's flow.
 */
static void case_squatted(void)
{
	static const char decl[] = "log-level = debug\n"
				   "flow = metrics ring-size=64K "
				   "allow-uid=4000\n";
	char out[4096];
	struct hd d;

	start_conf(&d, "cfg9", 0, "log-level = debug\n");
	CHECK_RC(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			   "flow create metrics --ring-size 64K "
			   "--allow-uid 4000"), 0);
	expect_out(out, "created");
	write_conf(&d, decl);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	expect_out(out, "created by uid 65534, not by moverd");
	CHECK(flow_u64(&d, "metrics", "owner_uid") == NOBODY);
	CHECK_RC(ctl(&d, out, sizeof(out), "flow show metrics --json"), 0);
	expect_out(out, "\"declared\": false");
	CHECK_RC(ctl(&d, out, sizeof(out), "flow create metrics --ring-size 64K "
		     "--allow-uid 4000"), 1);
	expect_out(out, "already exists, created by uid 65534");
	CHECK_RC(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			   "flow create metrics --ring-size 64K "
			   "--allow-uid 4000"), 0);
	expect_out(out, "exists");
	CHECK_RC(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			   "flow destroy metrics"), 0);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	CHECK(flow_u64(&d, "metrics", "owner_uid") == getuid());
	CHECK_RC(ctl(&d, out, sizeof(out), "flow show metrics --json"), 0);
	expect_out(out, "\"declared\": true");

	/* the declared one destroyed by hand, the name taken by the user:
	 * taking the declaration out of the file leaves the user's flow */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow destroy metrics"), 0);
	CHECK_RC(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			   "flow create metrics --ring-size 64K"), 0);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	write_conf(&d, "log-level = debug\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	printf("  reload without the declaration: %s", out);
	expect_out(out, "uid 65534's, and stays");
	CHECK(flow_u64(&d, "metrics", "owner_uid") == NOBODY);
	hd_stop(&d);
}

/* Is id in the flow's allow_uids (the `flow show --json` text)? */
static bool allows_uid(const char *json, unsigned id)
{
	char list[256], want[16];
	const char *a = strstr(json, "\"allow_uids\": [");
	size_t n;

	CHECK(a);
	a += strlen("\"allow_uids\": [");
	n = strcspn(a, "]");
	CHECK(n + 3 < sizeof(list));
	snprintf(list, sizeof(list), " %.*s,", (int)n, a);
	snprintf(want, sizeof(want), " %u,", id);
	return strstr(list, want) != NULL;
}

/* A (sender) and B (receiver) declare a flow; B's allow-uid changes. */
static void case_receiver_ids(void)
{
	struct hd a, b;
	char line[256], out[8192], json[8192];
	int port = hd_free_port();

	snprintf(line, sizeof(line), "log-level = debug\nflow = rx ring-size=64K "
		 "peer=127.0.0.1:%d allow-uid=1001\n", port);
	start_conf(&b, "cfg10b", port, line);
	start_conf(&a, "cfg10a", 0, line);
	CHECK(hd_wait_state(&b, moverctl_bin, "rx", "open", 10000, NULL, 0));
	CHECK(hd_flow_json(&b, moverctl_bin, "rx", out, sizeof(out)));
	CHECK(allows_uid(out, 1001));
	CHECK_RC(ctl(&b, out, sizeof(out), "flow allow rx --uid 4001"), 0);
	snprintf(line, sizeof(line), "log-level = debug\nflow = rx ring-size=64K "
		 "peer=127.0.0.1:%d allow-uid=1002\n", port);
	write_conf(&b, line);
	CHECK_RC(ctl(&b, out, sizeof(out), "reload"), 0);
	printf("%s", out);
	CHECK(hd_flow_json(&b, moverctl_bin, "rx", json, sizeof(json)));
	CHECK(!allows_uid(json, 1001));
	CHECK(allows_uid(json, 1002));
	CHECK(allows_uid(json, 4001)); /* granted by hand: stays */
	expect_out(out, "0 added, 0 removed, 1 changed, 0 unchanged, 0 refused");
	expect_out(out, "flow rx (line 2): declared ids granted on the flow "
		   "from peer");
	expect_out(out, "taken off: uids 1001");
	/* taken off by hand, then B stops and starts: the declaration did
	 * not change, so the id stays off (before: granted again at the
	 * start, which applies every declaration as new) */
	CHECK_RC(ctl(&b, out, sizeof(out), "flow disallow rx --uid 1002"), 0);
	hd_term(&b);
	restart_conf(&b);
	CHECK(hd_flow_json(&b, moverctl_bin, "rx", json, sizeof(json)));
	CHECK(!allows_uid(json, 1002));
	CHECK(allows_uid(json, 4001));
	/* changed while B was down: applied at the start, as at a reload */
	hd_term(&b);
	snprintf(line, sizeof(line), "log-level = debug\nflow = rx ring-size=64K "
		 "peer=127.0.0.1:%d allow-uid=1003\n", port);
	write_conf(&b, line);
	restart_conf(&b);
	CHECK(hd_flow_json(&b, moverctl_bin, "rx", json, sizeof(json)));
	CHECK(allows_uid(json, 1003));
	CHECK(allows_uid(json, 4001));
	printf("# a declared id taken off by hand stays off across a restart; "
	       "a declaration changed while down is applied at the start\n");
	hd_stop(&a);
	hd_stop(&b);
}

static void case_recreate_checked(void)
{
	struct hd d;
	char out[4096];
	uint64_t created;

	start_conf(&d, "cfg11", 0, "flow = big ring-size=64K\n");
	created = flow_u64(&d, "big", "created_unix_ms");
	write_conf(&d, "flow = big ring-size=2G\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	printf("%s", out);
	CHECK(flow_exists(&d, "big"));
	CHECK(flow_u64(&d, "big", "ring_size") == 64 << 10);
	CHECK(flow_u64(&d, "big", "created_unix_ms") == created);
	expect_out(out, "flow big (line 1): declaration changed, ring-size");
	expect_out(out, "cannot be created as declared: ring size 2147483648 "
		   "exceeds this daemon's limit");
	/* still declared, as before */
	CHECK_RC(ctl(&d, out, sizeof(out), "flow show big --json"), 0);
	expect_out(out, "\"declared\": true");
	write_conf(&d, "flow = big ring-size=128K\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	expect_out(out, "flow big (line 1): re-created");
	CHECK(flow_u64(&d, "big", "ring_size") == 128 << 10);
	hd_stop(&d);
}

static void case_remote_unread(void)
{
	struct hd a, b;
	char line[256], out[8192];
	int port = hd_free_port(), rc = 1;
	uint64_t created;
	pid_t prod, cons;

	start_conf(&b, "cfg12b", port, "log-level = debug\n");
	snprintf(line, sizeof(line), "log-level = debug\nflow = far "
		 "ring-size=64K peer=127.0.0.1:%d\n", port);
	start_conf(&a, "cfg12a", 0, line);
	CHECK(hd_wait_state(&b, moverctl_bin, "far", "open", 10000, NULL, 0));
	created = flow_u64(&b, "far", "created_unix_ms");
	/* 50 records reach B; no consumer there reads them yet */
	prod = fc(&a, 0, "produce", "far", 50);
	fc_done(prod, "producer on A");
	for (int i = 0; i < 1000 && flow_u64(&b, "far", "tail") == 0; i++)
		usleep(10000);
	CHECK(flow_u64(&b, "far", "tail") > 0);
	CHECK(hd_wait_count(&a, moverctl_bin, "far", "producers+consumers", 0,
			    90000));
	snprintf(line, sizeof(line), "log-level = debug\nflow = far "
		 "ring-size=128K peer=127.0.0.1:%d\n", port);
	write_conf(&a, line);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 1);
	printf("%s", out);
	expect_out(out, "but the flow is in use");
	expect_out(out, "not yet read on the peer host");
	CHECK(flow_u64(&a, "far", "ring_size") == 64 << 10);
	CHECK(flow_u64(&b, "far", "created_unix_ms") == created);
	/* B's consumer reads them all; then the change applies (the acks
	 * carry its position back to A) */
	cons = fc(&b, 0, "consume", "far", 50);
	fc_done(cons, "consumer on B (every record)");
	for (int i = 0; i < 1000 && rc; i++) {
		rc = ctl(&a, out, sizeof(out), "reload");
		if (rc)
			usleep(10000);
	}
	CHECK_RC(rc, 0);
	expect_out(out, "flow far (line 2): re-created");
	CHECK(flow_u64(&a, "far", "ring_size") == 128 << 10);
	hd_stop(&a);
	hd_stop(&b);
}

static void case_removed_in_use(void)
{
	struct hd d;
	char out[4096];
	flowshm_t *p = NULL;

	start_conf(&d, "cfg13", 0, "flow = held ring-size=64K\nflow = gone\n");
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("held", FLOWSHM_PRODUCER, NULL, &p), 0);
	write_conf(&d, "# none\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	printf("%s", out);
	expect_out(out, "flow held: no longer declared, but in use (1 "
		   "producer(s)");
	expect_out(out, "not destroyed; it stays, undeclared");
	expect_out(out, "flow gone: no longer declared: destroyed");
	expect_out(out, "0 added, 2 removed, 0 changed, 0 unchanged, 1 refused");
	CHECK(!flow_exists(&d, "gone"));
	CHECK(flow_u64(&d, "held", "producers") == 1);
	CHECK_RC(ctl(&d, out, sizeof(out), "flow show held --json"), 0);
	expect_out(out, "\"declared\": false");
	/* its own business now: a reload leaves it, its operator destroys */
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	CHECK(flow_exists(&d, "held"));
	flowshm_detach(p);
	CHECK_RC(ctl(&d, out, sizeof(out), "flow destroy held"), 0);
	hd_stop(&d);
}

static void case_partial_change(void)
{
	static const char before[] =
		"flow = lag ring-size=64K max-lag=16K allow-uid=4000\n";
	struct hd d;
	char out[4096], cmd[512];
	size_t n;

	start_conf(&d, "cfg14", 0, before);
	/* 15 more ids by hand: the allow list is full */
	n = (size_t)snprintf(cmd, sizeof(cmd), "flow allow lag");
	for (unsigned u = 5001; u <= 5015; u++)
		n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, " --uid %u", u);
	CHECK_RC(ctl(&d, out, sizeof(out), "%s", cmd), 0);
	write_conf(&d, "flow = lag ring-size=64K max-lag=32K "
		   "allow-uid=4000,4001\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	printf("%s", out);
	expect_out(out, "max-lag changed in place (16384 to 32768");
	expect_out(out, "cannot change its allowed ids");
	CHECK(flow_u64(&d, "lag", "max_lag") == 32768);
	/* the old file again: max-lag goes back */
	write_conf(&d, before);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	printf("%s", out);
	CHECK(flow_u64(&d, "lag", "max_lag") == 16384);
	hd_stop(&d);
}

static void case_option_lines(void)
{
	struct hd d;
	char out[4096];

	start_conf(&d, "cfg15", 0, "log-level = debug\nflow = one\n");
	write_conf(&d, "log-level = debug\nmax-flow = 10\nflow = one\n"
		   "flow = two\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	printf("    %s", out);
	expect_out(out, "moverd.conf:2: unknown option 'max-flow'");
	CHECK(!flow_exists(&d, "two")); /* nothing applied */
	write_conf(&d, "log-level = debug\nmax-flows = ten\nflow = one\n"
		   "flow = two\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	expect_out(out, "bad value 'ten' for --max-flows");
	CHECK(!flow_exists(&d, "two"));
	write_conf(&d, "log-level = info\nmax-flows = 100\nflow = one\n"
		   "flow = two\n");
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	printf("%s", out);
	expect_out(out, "option log-level: 'info' in the file, 'debug' at "
		   "start: takes effect at restart");
	expect_out(out, "option max-flows: '100' in the file, not set at "
		   "start: takes effect at restart");
	expect_out(out, "1 added, 0 removed, 0 changed, 1 unchanged");
	CHECK(flow_exists(&d, "two"));
	hd_stop(&d);
}

/* A file of text at path, mode 0644. */
static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");

	CHECK(f);
	CHECK(fputs(text, f) >= 0);
	CHECK(fclose(f) == 0);
	CHECK(chmod(path, 0644) == 0);
}

static void case_config_file(void)
{
	static char link[160];
	const char *extra[] = { "--config", link, NULL };
	char a[160], b[170], tmp[170], out[4096], args[300];
	struct hd d = { 0 };

	snprintf(d.dir, sizeof(d.dir), "/tmp/fm-cfg16-%d", (int)getpid());
	snprintf(d.sock, sizeof(d.sock), "%s/moverd.sock", d.dir);
	snprintf(d.log, sizeof(d.log), "%s/moverd.log", d.dir);
	CHECK(mkdir(d.dir, 0755) == 0 || errno == EEXIST);
	snprintf(a, sizeof(a), "%s/a.conf", d.dir);
	snprintf(b, sizeof(b), "%s/b.conf", d.dir);
	snprintf(tmp, sizeof(tmp), "%s/link.new", d.dir);
	snprintf(link, sizeof(link), "%s/moverd.conf", d.dir);
	put_file(a, "flow = one\n");
	put_file(b, "flow = two\n");
	CHECK(symlink("a.conf", link) == 0);
	hd_exec(&d, moverd_bin, extra);
	CHECK(flow_exists(&d, "one"));
	/* the link moves to b.conf: the reload reads b.conf */
	CHECK(symlink("b.conf", tmp) == 0);
	CHECK(rename(tmp, link) == 0);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	printf("%s", out);
	CHECK(flow_exists(&d, "two"));
	CHECK(!flow_exists(&d, "one"));
	/* writable by others: refused, nothing changes */
	put_file(b, "flow = three\n");
	CHECK(chmod(b, 0666) == 0);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	printf("    %s", out);
	expect_out(out, "may be written by others than root and moverd's user");
	CHECK(!flow_exists(&d, "three"));
	CHECK(flow_exists(&d, "two"));
	CHECK(chmod(b, 0620) == 0); /* group-writable too */
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 1);
	expect_out(out, "mode 0620");
	hd_stop(&d);
	/* and at start (hd_stop took the directory away) */
	CHECK(mkdir(d.dir, 0755) == 0 || errno == EEXIST);
	put_file(b, "flow = three\n");
	CHECK(chmod(b, 0666) == 0);
	snprintf(args, sizeof(args), "--config %s", b);
	moverd_refuses(d.dir, args, 2, "may be written by others");
	CHECK(unlink(b) == 0 && rmdir(d.dir) == 0);
}

/* ---- 17: name lookups ------------------------------------------------------- */

/* The lookups the shim counted in path so far. */
static long lookups(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (long)st.st_size;
}

static void case_name_lookups(void)
{
	char text[4096] = "", out[4096], counted[160];
	size_t used = 0;
	long before;
	struct hd d;

	for (int i = 0; i < 40; i++)
		used += (size_t)snprintf(text + used, sizeof(text) - used,
					 "flow = n%d allow-uid=nobody,0 "
					 "allow-gid=nogroup\n", i);
	CHECK(used < sizeof(text));
	snprintf(counted, sizeof(counted), "/tmp/fm-nss-%d", (int)getpid());
	unlink(counted);
	setenv("FM_NSS_COUNT", counted, 1);
	hd_preload(count_nss_so);
	start_conf(&d, "cfg17", 0, text);
	hd_preload_end();
	unsetenv("FM_NSS_COUNT");
	CHECK(flow_exists(&d, "n39"));
	before = lookups(counted);
	CHECK_RC(ctl(&d, out, sizeof(out), "reload"), 0);
	printf("  %ld name lookups at start, %ld at a reload, for 40 flows\n",
	       before, lookups(counted) - before);
	CHECK(before == 2);
	CHECK(lookups(counted) - before == 2);
	/* the ids are the names' */
	CHECK(hd_flow_json(&d, moverctl_bin, "n17", out, sizeof(out)));
	CHECK(strstr(out, "65534"));
	hd_stop(&d);
	unlink(counted);
}

/* The receiving end's line of case 18, from= nets (the same on A). */
static void from_line(char *buf, size_t cap, int port, const char *nets)
{
	snprintf(buf, cap, "log-level = debug\nflow = rx ring-size=64K "
		 "peer=127.0.0.1:%d from=%s\n", port, nets);
}

/* A's flow rx failed, refused by B for its address. */
static void refused_by_from(struct hd *a)
{
	char why[512];

	CHECK(hd_wait_state(a, moverctl_bin, "rx", "failed", 10000, why,
			    sizeof(why)));
	printf("  A: rx %s\n", why);
	expect_out(why, "flow 'rx' may not be sent from 127.0.0.1: this "
		   "host's config takes it from");
}

static void case_receiver_from(void)
{
	struct hd a, b;
	char line[256], out[8192];
	int port = hd_free_port();

	from_line(line, sizeof(line), port, "192.0.2.0/24");
	start_conf(&b, "cfg18b", port, line);
	start_conf(&a, "cfg18a", 0, line); /* from= means nothing on A */
	refused_by_from(&a);
	CHECK(!flow_exists(&b, "rx")); /* not bound to the first opener */
	CHECK(hd_log_count(&b, "may not be sent from 127.0.0.1") >= 1);
	/* named: B's reload, then A makes its flow again */
	from_line(line, sizeof(line), port, "192.0.2.7,127.0.0.0/8");
	write_conf(&b, line);
	CHECK_RC(ctl(&b, out, sizeof(out), "reload"), 0);
	expect_out(out, "0 added, 0 removed, 1 changed, 0 unchanged, 0 refused");
	CHECK_RC(ctl(&a, out, sizeof(out), "flow destroy rx"), 0);
	CHECK_RC(ctl(&a, out, sizeof(out), "reload"), 0);
	expect_out(out, "flow rx (line 2): created again (it was gone)");
	CHECK(hd_wait_state(&a, moverctl_bin, "rx", "open", 10000, NULL, 0));
	CHECK(hd_wait_state(&b, moverctl_bin, "rx", "open", 10000, NULL, 0));
	move_a_to_b(&a, &b, 0, "rx", 3000, "from= names A's address");
	/* no longer named: said at the reload, refused at the next open */
	from_line(line, sizeof(line), port, "192.0.2.7");
	write_conf(&b, line);
	CHECK_RC(ctl(&b, out, sizeof(out), "reload"), 0);
	printf("%s", out);
	expect_out(out, "flow rx (line 2): its sender is at 127.0.0.1, which "
		   "from=192.0.2.7 does not name: its next open from there is "
		   "refused");
	hd_term(&a);
	restart_conf(&a);
	refused_by_from(&a);
	/* a from= that does not parse refuses the reload */
	from_line(line, sizeof(line), port, "127.0.0.0/33");
	write_conf(&b, line);
	CHECK_RC(ctl(&b, out, sizeof(out), "reload"), 1);
	expect_out(out, "moverd.conf:2: flow rx: from: '127.0.0.0/33' is not "
		   "an address or network");
	hd_stop(&a);
	hd_stop(&b);
}

/* The shim's hold: made (lookups wait) or taken away (they go on). */
static void nss_hold(const char *path, bool on)
{
	char in[192];
	int fd;

	snprintf(in, sizeof(in), "%s.in", path);
	if (!on) {
		CHECK(unlink(path) == 0);
		return;
	}
	unlink(in);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	close(fd);
}

/* Wait for a lookup to be held (the shim made PATH.in). */
static void nss_wait_held(const char *path)
{
	char in[192];

	snprintf(in, sizeof(in), "%s.in", path);
	for (int i = 0; i < 1000 && access(in, F_OK); i++)
		usleep(10000);
	CHECK(access(in, F_OK) == 0);
}

/* moverctl reload on d in the background: its pid, its output in out. */
static pid_t reload_bg(const struct hd *d, const char *out)
{
	pid_t pid = hx_fork_as(d, 0);

	if (!pid) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			      0600);

		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		execl(moverctl_bin, moverctl_bin, "--socket", d->sock,
		      "--timeout", "60000", "reload", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void expect_file(const char *path, const char *want)
{
	char text[8192] = "";
	FILE *f = fopen(path, "re");
	size_t n;

	CHECK(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = 0;
	fclose(f);
	printf("%s", text);
	expect_out(text, want);
}

static void case_reload_off_loop(void)
{
	char held[160], out1[176], out2[176], text[256], out[4096];
	pid_t r1, r2, prod, cons;
	struct hd d;

	snprintf(held, sizeof(held), "/tmp/fm-nss-hold-%d", (int)getpid());
	snprintf(out1, sizeof(out1), "%s.r1", held);
	snprintf(out2, sizeof(out2), "%s.r2", held);
	unlink(held);
	setenv("FM_NSS_HOLD", held, 1);
	hd_preload(count_nss_so);
	start_conf(&d, "cfg19", 0, "log-level = debug\n"
		   "flow = steady ring-size=64K\n");
	hd_preload_end();
	unsetenv("FM_NSS_HOLD");
	write_conf(&d, "log-level = debug\nflow = steady ring-size=64K\n"
		   "flow = named ring-size=64K allow-uid=nobody\n");
	nss_hold(held, true);
	r1 = reload_bg(&d, out1);
	nss_wait_held(held);
	/* the loop goes on while the reload's lookup hangs */
	CHECK_RC(ctl(&d, out, sizeof(out), "status"), 0);
	cons = fc(&d, 0, "consume", "steady", 2000);
	prod = fc(&d, 0, "produce", "steady", 2000);
	fc_done(prod, "producer of steady");
	fc_done(cons, "consumer of steady, while a reload's lookup hangs");
	/* asked meanwhile: the next run, which reads the file as it is then */
	snprintf(text, sizeof(text), "log-level = debug\n"
		 "flow = steady ring-size=64K\n"
		 "flow = named ring-size=64K allow-uid=nobody\n"
		 "flow = later ring-size=64K\n");
	write_conf(&d, text);
	r2 = reload_bg(&d, out2);
	CHECK(kill(d.pid, SIGHUP) == 0);
	CHECK(!flow_exists(&d, "named")); /* nothing applied yet */
	printf("  status answered and 2000 records moved while the reload's "
	       "getpwnam was held\n");
	nss_hold(held, false);
	CHECK(hx_wait(r1, 60000) == 0);
	CHECK(hx_wait(r2, 60000) == 0);
	expect_file(out1, "reloaded: 1 added, 0 removed, 0 changed, "
		    "1 unchanged, 0 refused");
	expect_file(out2, "reloaded: 1 added, 0 removed, 0 changed, "
		    "2 unchanged, 0 refused");
	CHECK(flow_exists(&d, "named") && flow_exists(&d, "later"));
	/* two runs: the first request's, then the second's and SIGHUP's */
	CHECK(hd_log_count(&d, " unchanged, ") == 2);
	CHECK(hd_log_count(&d, "another follows it") == 1);
	/* a stop while a lookup hangs: at once, and cleanly (no leak under
	 * ASan) */
	write_conf(&d, "log-level = debug\nflow = steady ring-size=64K\n"
		   "flow = named ring-size=64K allow-uid=nobody,daemon\n");
	nss_hold(held, true);
	CHECK(kill(d.pid, SIGHUP) == 0);
	nss_wait_held(held);
	r1 = reload_bg(&d, out1); /* the next run's: told why at the stop */
	for (int i = 0; i < 500 && hd_log_count(&d, "another follows it") < 2;
	     i++)
		usleep(10000);
	CHECK(hd_log_count(&d, "another follows it") == 2);
	hd_stop(&d);
	nss_hold(held, false);
	CHECK(hx_wait(r1, 60000) != 0);
	expect_file(out1, "moverd is stopping: the reload was not applied");
	unlink(out1);
	unlink(out2);
	snprintf(text, sizeof(text), "%s.in", held);
	unlink(text);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_declared_at_start, "declared at start, again after "
		  "kill -9" },
		{ 2, case_idempotent_create, "flow create of an existing flow: "
		  "same parameters exist, different ones named" },
		{ 3, case_reload, "moverctl reload: added, removed, unchanged "
		  "(records through it exactly once), changed busy/idle" },
		{ 4, case_sighup, "SIGHUP reloads" },
		{ 5, case_malformed, "a malformed flow line, at start and at "
		  "reload" },
		{ 6, case_two_hosts, "two hosts declare the same flow; records "
		  "move" },
		{ 7, case_fanout, "a declared flow to two peers with max-lag: "
		  "create compares the peer set and max-lag; a reload "
		  "removes and adds a peer and changes max-lag in place" },
		{ 8, case_cpus, "cpus: every thread on the listed cpus; bad "
		  "lists refused" },
		{ 9, case_squatted, "a user's flow of a name declared later "
		  "stays the user's: not declared, not 'exists' to root" },
		{ 10, case_receiver_ids, "a receiving end's changed allow-uid "
		  "takes the old id off" },
		{ 11, case_recreate_checked, "a re-create that cannot succeed "
		  "is refused before the destroy" },
		{ 12, case_remote_unread, "records unread on the receiving "
		  "host make a flow between hosts busy" },
		{ 13, case_removed_in_use, "a removed declaration of a flow in "
		  "use: not destroyed, said" },
		{ 14, case_partial_change, "a change refused half way is "
		  "recorded as applied" },
		{ 15, case_option_lines, "option lines checked at a reload, "
		  "changes said" },
		{ 16, case_config_file, "the config's symlink followed at each "
		  "reload; others' writable config refused" },
		{ 17, case_name_lookups, "a user or group name is looked up "
		  "once per read of the file" },
		{ 18, case_receiver_from, "a receiving end's from= refuses "
		  "opens from hosts it does not name" },
		{ 19, case_reload_off_loop, "a reload's hung name lookup "
		  "holds neither the loop nor the stop" },
	};

	if (argc != 5) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL FLOWCHECK "
			"COUNT_NSS_SO\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	flowcheck_bin = argv[3];
	count_nss_so = argv[4];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_CONFIG_CASES");
}
