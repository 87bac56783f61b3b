/*
 * tests/test_quota.c - limits on what other parties make moverd allocate
 * (issue 14, findings 5, 9, 10 and 13), against a real moverd: a hostile
 * peer speaking the wire format, and clients running as uid 65534.
 * FM_QUOTA_CASES=5,10 runs only those.
 *
 * Every case keeps a bystander: a local flow of root's whose producer and
 * consumer (this process) must get every record exactly once, and checks
 * that moverd's fd count and cpu use come back to their baseline.
 *
 *   usage: test_quota MOVERD MOVERCTL
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

static const char *moverd_bin, *moverctl_bin;

#define NOBODY 65534

/* ---- the bystander: a flow of root's that must deliver exactly once ------ */

struct bystander {
	flowshm_t *p, *c;
	uint64_t sent;
};

static void by_start(const struct hd *d, struct bystander *b)
{
	char out[4096];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out),
		     "flow create bystander --ring-size 1M") == 0);
	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	CHECK_RC(flowshm_attach("bystander", FLOWSHM_PRODUCER, NULL, &b->p), 0);
	CHECK_RC(flowshm_attach("bystander", FLOWSHM_CONSUMER, NULL, &b->c), 0);
	b->sent = 0;
}

static void by_send(struct bystander *b, unsigned n)
{
	char buf[256];

	for (unsigned i = 0; i < n; i++, b->sent++) {
		size_t len = tu_rec_len(1, b->sent, 16, sizeof(buf));

		tu_fill(buf, 1, b->sent, len);
		CHECK_RC(flowshm_send(b->p, buf, len, 2000000000ll), 0);
	}
}

/* Every record sent arrives, in order, once; then the flow is empty. */
static void by_check(struct bystander *b)
{
	char buf[256];

	for (uint64_t want = 0; want < b->sent; want++) {
		uint32_t prod;
		uint64_t seq;
		size_t len;

		CHECK_RC(flowshm_recv(b->c, buf, sizeof(buf), &len,
				      2000000000ll), 0);
		CHECK(tu_verify(buf, len, &prod, &seq));
		CHECK(prod == 1 && seq == want);
	}
	{
		size_t len;
		CHECK_RC(flowshm_recv(b->c, buf, sizeof(buf), &len, 0), -EAGAIN);
	}
	flowshm_detach(b->p);
	flowshm_detach(b->c);
}

/* moverd idles again (generous: two shared, noisy cores). */
static void check_idle(const struct hd *d)
{
	double share = hd_cpu_share(d, 1000);

	printf("# moverd cpu share at rest: %.3f\n", share);
	CHECK(share < 0.3);
}

/* ---- helpers ------------------------------------------------------------- */

/* The retry_ms of the last answer peer_open read. */
static uint32_t peer_retry_ms;

/* A hostile peer's open of flow_id; returns the error (0 = opened). */
static int peer_open(int fd, const char *name, uint32_t id, uint64_t ring,
		     char *msg, size_t cap)
{
	struct hp_open o = { name, id, ring, 256, 0xabcdef00ull + id * 4096, 0 };
	Flowmover__PeerFlowOpened *op = NULL;
	int err;

	CHECK(hp_open(fd, &o));
	CHECK(hp_wait_opened(fd, id, 10000, &op) == 0);
	err = op->error;
	peer_retry_ms = op->retry_ms;
	if (msg)
		snprintf(msg, cap, "%s", op->message ? op->message : "");
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	return err;
}

static bool flow_exists(const struct hd *d, const char *name)
{
	char out[8192];

	return hd_ctl(d, moverctl_bin, out, sizeof(out), "flow show %s",
		      name) == 0;
}

static double free_share(const char *dir)
{
	struct statvfs s;

	CHECK(statvfs(dir, &s) == 0);
	return (double)s.f_bavail / (double)s.f_blocks;
}

/*
 * A private mount namespace with a tmpfs of size (say "64M") at dir: a
 * state directory of a known size for moverd (a child of ours, so it
 * shares the namespace).
 */
static void small_tmpfs(const char *dir, const char *size)
{
	char opts[64];

	static bool done;

	mkdir(dir, 0755);
	if (!done) {
		CHECK(unshare(CLONE_NEWNS) == 0);
		CHECK(mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0);
		done = true;
	}
	umount2(dir, MNT_DETACH);
	snprintf(opts, sizeof(opts), "size=%s,mode=0755", size);
	CHECK(mount("tmpfs", dir, "tmpfs", 0, opts) == 0);
}

static void become(uid_t uid)
{
	CHECK(setgroups(0, NULL) == 0);
	CHECK(setresgid(uid, uid, uid) == 0);
	CHECK(setresuid(uid, uid, uid) == 0);
}

static void become_nobody(void)
{
	become(NOBODY);
}

/* ---- 5: remote opens: per-peer quotas, a state-dir reserve, orphans ----- */

static void case_remote_opens(void)
{
	static const char *const opts_a[] = { "--max-flows", "200", NULL };
	static const char *const opts_b[] = { "--state-dir", "/tmp/fm-quota5-tmpfs",
					      NULL };
	static const char *const opts_c[] = { "--peer-max-ring-bytes", "1M",
					      "--orphan-timeout", "2",
					      "--max-flows", "65", NULL };
	struct bystander b;
	char name[64], msg[256], out[8192];
	int fd, base, err, i, j;
	struct hd d;

	/* (a) the default per-peer flow quota: 64 */
	hd_start(&d, moverd_bin, "quota5a", true, opts_a);
	by_start(&d, &b);
	by_send(&b, 200);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "greedy"));
	for (i = 0; i < 65; i++) {
		snprintf(name, sizeof(name), "p5a-%d", i);
		err = peer_open(fd, name, (uint32_t)i + 1, 4096, msg, sizeof(msg));
		if (i < 64 && err)
			printf("# open %d refused: %d %s\n", i, err, msg);
		CHECK(i == 64 || err == 0);
	}
	printf("# open 65 of one peer: error %d: %s\n", err, msg);
	CHECK(err == -EDQUOT);
	CHECK(strstr(msg, "--peer-max-flows"));
	CHECK(!flow_exists(&d, "p5a-64"));
	CHECK(hd_log_count(&d, "--peer-max-flows") >= 1);
	close(fd);
	by_send(&b, 200);
	by_check(&b);
	hd_alive(&d);
	hd_stop(&d);

	/* (b) the state directory keeps 10 % free (default reserve) */
	small_tmpfs("/tmp/fm-quota5-tmpfs", "64M");
	hd_start(&d, moverd_bin, "quota5b", true, opts_b);
	by_start(&d, &b);
	by_send(&b, 100);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "filler"));
	for (i = 0, err = 0; i < 20 && !err; i++) {
		snprintf(name, sizeof(name), "p5b-%d", i);
		err = peer_open(fd, name, (uint32_t)i + 1, 4 << 20, msg,
				sizeof(msg));
	}
	printf("# open %d of 4M rings on a 64M state dir: error %d: %s; "
	       "%.1f%% free\n", i, err, msg,
	       100 * free_share("/tmp/fm-quota5-tmpfs"));
	CHECK(err == -ENOSPC);
	CHECK(free_share("/tmp/fm-quota5-tmpfs") >= 0.10);
	/* the refusal holds while nothing is freed, whether the accepted
	 * rings' pages are allocated yet or still being allocated */
	for (j = 0; j < 40; j++) {
		snprintf(name, sizeof(name), "p5b-again-%d", j);
		err = peer_open(fd, name, (uint32_t)(100 + j), 4 << 20, msg,
				sizeof(msg));
		if (err != -ENOSPC)
			printf("# open again %d: error %d: %s\n", j, err, msg);
		CHECK(err == -ENOSPC);
	}
	/* and a local sender flow (ring file) meets the same reserve */
	err = hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create s5b --ring-size 4M --peer 127.0.0.1:9");
	printf("# sender flow create: exit %d: %s", err, out);
	CHECK(err != 0 && strstr(out, "--state-dir-reserve"));
	CHECK(free_share("/tmp/fm-quota5-tmpfs") >= 0.10);
	close(fd);
	by_send(&b, 100);
	by_check(&b);
	hd_stop(&d);
	umount2("/tmp/fm-quota5-tmpfs", MNT_DETACH);
	rmdir("/tmp/fm-quota5-tmpfs");

	/* (c) per-peer ring bytes, and orphans expire */
	hd_start(&d, moverd_bin, "quota5c", true, opts_c);
	by_start(&d, &b);
	by_send(&b, 100);
	base = hd_fds(&d);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "big"));
	CHECK(peer_open(fd, "big1", 1, 512 << 10, msg, sizeof(msg)) == 0);
	CHECK(peer_open(fd, "big2", 2, 512 << 10, msg, sizeof(msg)) == 0);
	/* an id another flow holds on this connection: its frames would go
	 * to either flow */
	err = peer_open(fd, "dupid", 1, 4096, msg, sizeof(msg));
	printf("# an open with big1's id: error %d: %s\n", err, msg);
	CHECK(err == -EEXIST && strstr(msg, "flow id 1 is taken by flow 'big1'"));
	CHECK(!flow_exists(&d, "dupid"));
	err = peer_open(fd, "big3", 3, 4096, msg, sizeof(msg));
	printf("# third open past 1M: error %d: %s\n", err, msg);
	CHECK(err == -EDQUOT && strstr(msg, "--peer-max-ring-bytes"));
	CHECK(hp_close_flow(fd, "big1") && hp_close_flow(fd, "big2"));
	for (i = 0; i < 50 && (flow_exists(&d, "big1") || flow_exists(&d, "big2"));
	     i++)
		usleep(50000);
	/* fill the table: 65 with the bystander */
	for (i = 0; i < 64; i++) {
		snprintf(name, sizeof(name), "p5c-%d", i);
		CHECK(peer_open(fd, name, (uint32_t)i + 10, 4096, NULL, 0) == 0);
	}
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create root5 --ring-size 64K") != 0);
	close(fd); /* the sender goes and never comes back */
	CHECK(hd_wait_state(&d, moverctl_bin, "p5c-0", "reconnecting", 5000,
			    out, sizeof(out)));
	/* the flow checks visit a slice of the table at a time: the first
	 * and the last orphan may expire a second apart */
	for (i = 0; i < 200 && (flow_exists(&d, "p5c-63") ||
				flow_exists(&d, "p5c-0")); i++)
		usleep(50000);
	printf("# orphaned receiver flows gone after %.1f s\n", i * 0.05);
	CHECK(!flow_exists(&d, "p5c-63") && !flow_exists(&d, "p5c-0"));
	CHECK(hd_log_count(&d, "--orphan-timeout") >= 1);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create root5 --ring-size 64K") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow destroy root5") == 0);
	by_send(&b, 100);
	by_check(&b);
	hd_wait_fds(&d, base);
	check_idle(&d);
	hd_stop(&d);
}

/* ---- 9: memory beyond the limits ------------------------------------------ */

/*
 * Create m9, at --max-flows 2 with the bystander's flow listed: I/O in
 * flight (such as the fill: a 16 MiB ring is allocated off the loop) may
 * still hold the last m9 and its ring's fd for a moment, and that counts,
 * so -ENOSPC is asked again, 10 s at most.  The rings waiting for their
 * consumer to drain hold no fd: they never count.  Returns how many
 * times it was refused.
 */
static int create_m9(int sock)
{
	int rc, refused = 0;

	while ((rc = hc_create(sock, "m9", 16 << 20, 0)) == -ENOSPC &&
	       refused < 10000) {
		refused++;
		usleep(1000);
	}
	CHECK_RC(rc, 0);
	return refused;
}

/*
 * uid 65534: create/attach/destroy in a loop, keeping every ring's fd and
 * mapping.  Reports the bytes still allocated in those rings.
 */
static void memory_loop(const struct hd *d, int out_fd)
{
	enum { LOOPS = 24 };
	static flowshm_t *prod[LOOPS], *cons[LOOPS];
	static int fds[LOOPS], socks[LOOPS];
	uint64_t bytes = 0;
	int sock, refused = 0;

	become_nobody();
	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	sock = ctl_connect(d->sock);
	CHECK(sock >= 0);
	for (int i = 0; i < LOOPS; i++) {
		refused += create_m9(sock);
		fds[i] = hd_attach_fd(d, "m9", FLOWMOVER__ROLE__PRODUCER,
				      &socks[i]);
		CHECK_RC(flowshm_open_fd(fds[i], FLOWSHM_PRODUCER, NULL,
					 &prod[i]), 0);
		CHECK_RC(flowshm_attach("m9", FLOWSHM_CONSUMER, NULL, &cons[i]), 0);
		if (i % 2) /* a record its consumer has not read yet */
			CHECK_RC(flowshm_send(prod[i], "x", 1, 0), 0);
		CHECK_RC(hc_destroy(sock, "m9"), 0);
	}
	printf("# creates refused while I/O held the last m9: %d\n", refused);
	fflush(stdout);
	/* past the 5 s grace a consumer has to drain a destroyed flow, the
	 * pages go at the flow's next check: look until they are gone, 30 s
	 * at most (the caller judges what is left) */
	for (int t = 0; t < 300; t++) {
		bytes = 0;
		for (int i = 0; i < LOOPS; i++) {
			struct stat s;

			CHECK(fstat(fds[i], &s) == 0);
			bytes += (uint64_t)s.st_blocks * 512;
		}
		if (bytes <= 1u << 20)
			break;
		usleep(100000);
	}
	CHECK(write(out_fd, &bytes, sizeof(bytes)) == sizeof(bytes));
	_exit(0);
}

/* Is the ring file fd back to the ring's size (want), with no blocks
 * beyond it (64 KiB of slack: a disk filesystem's extent metadata)?  Its
 * stat in *s. */
static bool repaired(int fd, uint64_t want, struct stat *s)
{
	CHECK(fstat(fd, s) == 0);
	return (uint64_t)s->st_size == want &&
	       (uint64_t)s->st_blocks * 512 <= want + 65536;
}

/* Wait (ms at most) until the ring file fd is repaired. */
static bool wait_repaired(int fd, uint64_t want, int ms, struct stat *s)
{
	uint64_t until = tu_now_ns() + (uint64_t)ms * 1000000ull;

	while (!repaired(fd, want, s)) {
		if (tu_now_ns() >= until)
			return false;
		usleep(5000);
	}
	return true;
}

static void case_memory(void)
{
	static const char *const opts[] = { "--max-flows", "2",
					    "--max-ring-size", "16M", NULL };
	struct bystander b;
	char out[8192];
	int pfd[2], st, base = 0, sock, rfd;
	uint64_t bytes = 0;
	struct stat s;
	struct hd d;
	pid_t pid;

	/* (a) destroyed rings give their memory back, mapped or not */
	hd_start(&d, moverd_bin, "quota9a", false, opts);
	by_start(&d, &b);
	by_send(&b, 100);
	base = hd_fds(&d);
	CHECK(pipe(pfd) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		memory_loop(&d, pfd[1]);
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	      WEXITSTATUS(st) == 0);
	CHECK(read(pfd[0], &bytes, sizeof(bytes)) == sizeof(bytes));
	close(pfd[0]);
	close(pfd[1]);
	printf("# 24 destroyed 16M rings still mapped by uid 65534: %.1f MiB "
	       "allocated\n", bytes / 1048576.0);
	CHECK(bytes <= 1u << 20);
	by_send(&b, 100);
	by_check(&b);
	hd_wait_fds(&d, base);
	hd_stop(&d);

	/* (b) a client cannot resize a ring file (flows between hosts) */
	hd_start(&d, moverd_bin, "quota9b", false, NULL);
	by_start(&d, &b);
	by_send(&b, 100);
	base = hd_fds(&d);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create grow9 --ring-size 1M --peer 127.0.0.1:9") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create shrink9 --ring-size 1M --peer 127.0.0.1:9") == 0);
	rfd = hd_attach_fd(&d, "grow9", FLOWMOVER__ROLE__PRODUCER, &sock);
	CHECK(fallocate(rfd, 0, 0, (1 << 20) + FR_CTRL_BYTES + (256 << 20)) == 0);
	CHECK(hd_wait_state(&d, moverctl_bin, "grow9", "failed", 5000, out,
			    sizeof(out)));
	printf("# grown ring file: %s\n", out);
	CHECK(strstr(out, "size"));
	/* the 256 MiB grown are given back (off the loop: case 19); the
	 * file system may keep a block or two of extent metadata beyond
	 * the ring's own bytes */
	CHECK(wait_repaired(rfd, (1 << 20) + FR_CTRL_BYTES, 10000, &s));
	printf("# its size now %lld, %lld bytes allocated\n",
	       (long long)s.st_size, (long long)s.st_blocks * 512);
	close(rfd);
	close(sock);

	rfd = hd_attach_fd(&d, "shrink9", FLOWMOVER__ROLE__PRODUCER, &sock);
	CHECK(ftruncate(rfd, 0) == 0);
	/* moverd reads the ring's control page for this */
	hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow show shrink9");
	hd_alive(&d);
	CHECK(hd_wait_state(&d, moverctl_bin, "shrink9", "failed", 5000, out,
			    sizeof(out)));
	printf("# shrunk ring file: %s\n", out);
	printf("# moverd's own view faulted and was replaced: %s\n",
	       strstr(out, "faulted") ? "yes" : "no (checked first)");
	CHECK(strstr(out, "size"));
	CHECK(fstat(rfd, &s) == 0 && s.st_size == (1 << 20) + FR_CTRL_BYTES);
	close(rfd);
	close(sock);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy grow9") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy shrink9") == 0);
	by_send(&b, 100);
	by_check(&b);
	hd_wait_fds(&d, base);
	check_idle(&d);
	hd_stop(&d);
}

/* ---- 10: one uid takes every slot; flow list of any length ---------------- */

static void case_per_uid(void)
{
	static const char *const opts_b[] = { "--max-ring-bytes-per-uid", "8M",
					      NULL };
	static char out[1 << 20];
	char allow[1024] = "", name[80];
	struct bystander b;
	int rc, base, i;
	struct hd d;

	hd_start(&d, moverd_bin, "quota10", false, NULL);
	by_start(&d, &b);
	by_send(&b, 100);
	for (i = 0; i < 65; i++) {
		rc = hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			       "flow create u10-%d --ring-size 4K", i);
		if (rc)
			break;
	}
	printf("# uid 65534 created %d flows; then: exit %d: %s", i, rc, out);
	CHECK(i == 64 && rc != 0 && strstr(out, "--max-flows-per-uid"));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create root10 --ring-size 4K") == 0);
	/* 300 flows with long names and allow lists: more than one frame
	 * (about 250 bytes each; moverctl's arguments fit 768 bytes) */
	for (i = 0; i < 14; i++)
		snprintf(allow + strlen(allow), sizeof(allow) - strlen(allow),
			 " --allow-uid %u --allow-gid %u", 4000000000u + i,
			 4000000000u + i);
	for (i = 0; i < 300; i++)
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
			     "flow create %060d-%03d --ring-size 4K%s", 0, i,
			     allow) == 0);
	base = hd_fds(&d);
	rc = hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list");
	printf("# flow list of 366 flows: exit %d, %zu bytes%s%.200s\n", rc,
	       strlen(out), rc ? ": " : "", rc ? out : "");
	CHECK(rc == 0);
	for (i = 0; i < 300; i++) {
		snprintf(name, sizeof(name), "%060d-%03d ", 0, i);
		CHECK(strstr(out, name));
	}
	CHECK(strstr(out, "u10-63 ") && strstr(out, "bystander "));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list --json") == 0);
	for (i = 0; i < 300; i++) {
		snprintf(name, sizeof(name), "\"%060d-%03d\"", 0, i);
		CHECK(strstr(out, name));
	}
	by_send(&b, 100);
	by_check(&b);
	hd_wait_fds(&d, base);
	check_idle(&d);
	hd_stop(&d);

	/* ring bytes per uid */
	hd_start(&d, moverd_bin, "quota10b", false, opts_b);
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow create b10-1 --ring-size 4M") == 0);
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow create b10-2 --ring-size 4M") == 0);
	rc = hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow create b10-3 --ring-size 4K");
	printf("# past 8M of rings: exit %d: %s", rc, out);
	CHECK(rc != 0 && strstr(out, "--max-ring-bytes-per-uid"));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create root10b --ring-size 4M") == 0);
	hd_stop(&d);
}

/* ---- 14: how fast a party creates rings ----------------------------------- */

/* "try again in N ms" of a refusal; -1 if it says no time. */
static long retry_ms(const char *msg)
{
	const char *at = strstr(msg, "try again in ");

	return at ? strtol(at + strlen("try again in "), NULL, 10) : -1;
}

/* One turn i of a loop a child runs as another uid on its control
 * socket: 0 to go on, or the negative errno of a refusal (its words in
 * why) that ends the loop. */
typedef int (*uid_turn)(int sock, int i, void *arg, char *why, size_t cap);

/* As uid (a child of ours), turn() for i = 0 .. max-1 until the first
 * refusal: its errno (0 if none); *done: how many turns passed; msg (if
 * not NULL): the refusal's words. */
static int uid_loop(const struct hd *d, uid_t uid, int max, uid_turn turn,
		    void *arg, int *done, char *msg, size_t cap)
{
	int st, sock, rc = 0, i = 0, pipefd[2];
	char why[256] = "";
	pid_t pid;

	CHECK(pipe(pipefd) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		become(uid);
		sock = ctl_connect(d->sock);
		CHECK(sock >= 0);
		for (; i < max && !rc; i++)
			rc = turn(sock, i, arg, why, sizeof(why));
		i -= rc != 0;
		CHECK(write(pipefd[1], &i, sizeof(i)) == sizeof(i));
		CHECK(write(pipefd[1], why, sizeof(why)) == sizeof(why));
		_exit(-rc);
	}
	close(pipefd[1]);
	CHECK(read(pipefd[0], &i, sizeof(i)) == sizeof(i));
	CHECK(read(pipefd[0], why, sizeof(why)) == sizeof(why));
	close(pipefd[0]);
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
	if (done)
		*done = i;
	if (msg)
		snprintf(msg, cap, "%s", why);
	return -WEXITSTATUS(st);
}

/* A raw create and destroy of *(uint64_t *)ring bytes. */
static int churn_turn(int sock, int i, void *ring, char *why, size_t cap)
{
	int rc = hc_create(sock, "raw14", *(uint64_t *)ring, 0);

	(void)i;
	(void)why;
	(void)cap;
	if (!rc)
		CHECK_RC(hc_destroy(sock, "raw14"), 0);
	return rc;
}

/* uid's raw creates and destroys of ring bytes `ring`, at most max: the
 * errno of the first create refused, 0 if none; *done: how many passed. */
static int uid_churn(const struct hd *d, uid_t uid, uint64_t ring, int max,
		     int *done)
{
	return uid_loop(d, uid, max, churn_turn, &ring, done, NULL, 0);
}

/* One `flow peer add` (or remove) of peer to flow name on sock: 0, or the
 * negative errno, its words in msg. */
static int peer_edit(int sock, const char *name, const char *peer,
		     bool remove, char *msg, size_t cap)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__FanoutPeerEdit e = FLOWMOVER__FANOUT_PEER_EDIT__INIT;
	Flowmover__Response *resp = NULL;
	int rc;

	e.name = (char *)name;
	e.peer = (char *)peer;
	e.remove = remove;
	req.body_case = FLOWMOVER__REQUEST__BODY_FANOUT_PEER;
	req.fanout_peer = &e;
	rc = ctl_call(sock, &req, &resp, NULL, 5000);
	snprintf(msg, cap, "%s", rc ? ctl_last_error() : "");
	ctl_response_free(resp);
	return rc;
}

/* First flow fan14 to a peer nobody listens at, then each turn a `flow
 * peer add` and `remove` of a second peer. */
static int edit_turn(int sock, int i, void *arg, char *why, size_t cap)
{
	int rc;

	(void)arg;
	if (i == 0) {
		Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
		Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
		Flowmover__FlowSpec spec = FLOWMOVER__FLOW_SPEC__INIT;

		spec.name = "fan14";
		spec.ring_size = 65536;
		spec.peer = "127.0.0.1:1";
		cr.spec = &spec;
		req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
		req.create = &cr;
		CHECK_RC(hc_call(sock, &req, NULL), 0);
	}
	rc = peer_edit(sock, "fan14", "127.0.0.2:1", false, why, cap);
	return rc ? rc : peer_edit(sock, "fan14", "127.0.0.2:1", true, why, cap);
}

/* As uid, at most max edit_turns: how many passed before the first
 * refusal (*done; its words in msg), and its errno. */
static int uid_edits(const struct hd *d, uid_t uid, int max, int *done,
		     char *msg, size_t cap)
{
	return uid_loop(d, uid, max, edit_turn, NULL, done, msg, cap);
}

static int nobody_churn(const struct hd *d, uint64_t ring, int max)
{
	return uid_churn(d, NOBODY, ring, max, NULL);
}

/* `flow create NAME` and destroy by moverctl as uid (hd_ctl_as), at most
 * max times: how many passed before the first refusal (its words in out). */
static int ctl_churn(const struct hd *d, uid_t uid, const char *name,
		     int max, char *out, size_t cap)
{
	int i;

	for (i = 0; i < max; i++) {
		if (hd_ctl_as(d, moverctl_bin, uid, out, cap,
			      "flow create %s --ring-size 64M", name))
			return i;
		CHECK(hd_ctl_as(d, moverctl_bin, uid, out, cap,
				"flow destroy %s", name) == 0);
	}
	snprintf(out, cap, "(never refused)\n");
	return i;
}

/*
 * Creating a ring allocates all of it and destroying it punches it out,
 * both on moverd's event loop: quotas bound what a party holds, not how
 * often it creates, so a loop of create/destroy stalled every flow (1 GiB
 * rings: `status` 2 ms -> 150-300 ms).  Each non-root uid and each peer
 * host may create so many ring bytes a second (16M here), after a bucket
 * of 1 GiB (at least --max-ring-size).  No timing is asserted: the bucket
 * starts full, so the first 16 rings of 64 MiB always pass, a churn
 * without pause always empties it, and the wait moverd names is enough by
 * construction.  A `flow peer add` or `remove` is charged as a create of
 * 1 MiB (f): each queues a frame on a connection other users share.
 */
static void case_create_rate(void)
{
	static const char *const opts[] = { "--max-ring-size", "64M",
					    "--max-ring-rate-per-uid", "16M",
					    "--peer-max-ring-rate", "16M",
					    NULL };
	struct bystander b;
	char out[4096], msg[256], name[64];
	int rc, fd, err = 0, i;
	long wait_ms;
	struct hd d;

	hd_start(&d, moverd_bin, "quota14", true, opts);
	by_start(&d, &b);
	by_send(&b, 100);
	/* (a) uid 65534 loops create/destroy: refused after its bucket */
	i = ctl_churn(&d, NOBODY, "r14", 64, out, sizeof(out));
	printf("# uid 65534 created %d rings of 64M; then: %s", i, out);
	CHECK(i >= 16 && i < 64);
	CHECK(strstr(out, "creating rings too fast") &&
	      strstr(out, "--max-ring-rate-per-uid"));
	CHECK(!flow_exists(&d, "r14"));
	CHECK(hd_log_count(&d, "creating rings too fast") >= 1);
	/* retryable, and so named to the caller */
	CHECK_RC(nobody_churn(&d, 64 << 20, 64), -EAGAIN);
	/* (b) after the wait it was told, uid 65534 creates again */
	CHECK(ctl_churn(&d, NOBODY, "r14", 64, out, sizeof(out)) < 64);
	wait_ms = retry_ms(out);
	printf("# refused again: told to wait %ld ms\n", wait_ms);
	CHECK(wait_ms > 0 && wait_ms <= 4000);
	usleep((useconds_t)(wait_ms + 50) * 1000);
	rc = hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow create r14 --ring-size 64M");
	printf("# after the wait: exit %d: %s", rc, rc ? out : "created\n");
	CHECK(rc == 0);
	/* (c) root is not held to it, nor is another uid to 65534's */
	CHECK(ctl_churn(&d, 0, "root14", 24, out, sizeof(out)) == 24);
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY - 1, out, sizeof(out),
			"flow create other14 --ring-size 64M") == 0);
	/* (e) small rings cost the loop too (files, state file): a create
	 * is charged 1 MiB at least, so 4 KiB rings are no way around it */
	rc = uid_churn(&d, NOBODY - 2, 4096, 5000, &i);
	printf("# uid %u created %d rings of 4K; then: %d\n", NOBODY - 2, i,
	       rc);
	CHECK(rc == -EAGAIN && i >= 1024 && i < 5000);
	/* (f) `flow peer add`/`remove` each queue a frame on a connection
	 * other users' flows share: charged as a create of 1 MiB */
	rc = uid_edits(&d, NOBODY - 3, 5000, &i, msg, sizeof(msg));
	printf("# uid %u added and removed a peer %d times; then: %d: %s\n",
	       NOBODY - 3, i, rc, msg);
	CHECK(rc == -EAGAIN && i >= 256 && i < 5000);
	CHECK(strstr(msg, "a peer add or remove counts"));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy fan14")
	      == 0);
	/* (d) a peer opening 64M rings: "busy, retry" after its bucket */
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "hasty"));
	for (i = 0; i < 60; i++) {
		snprintf(name, sizeof(name), "p14-%d", i);
		err = peer_open(fd, name, (uint32_t)i + 1, 64 << 20, msg,
				sizeof(msg));
		if (err)
			break;
	}
	printf("# peer opened %d rings of 64M; then: error %d: %s\n", i, err,
	       msg);
	CHECK(i >= 16 && i < 60);
	CHECK(err == -EAGAIN && strstr(msg, "creating rings too fast") &&
	      strstr(msg, "--peer-max-ring-rate"));
	/* and is told when to ask again, in a field of its own */
	printf("# retry_ms %u, the message's %ld\n", peer_retry_ms,
	       retry_ms(msg));
	CHECK(peer_retry_ms > 0 && peer_retry_ms == retry_ms(msg));
	CHECK(!flow_exists(&d, name));
	close(fd);
	by_send(&b, 100);
	by_check(&b);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy r14") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow destroy other14") == 0);
	check_idle(&d);
	hd_stop(&d);
}

/* ---- 13: other users' flows are not shown --------------------------------- */

static void case_visibility(void)
{
	char out[65536], missing[4096];
	struct bystander b;
	int rc, rc_missing, base;
	struct hd d;

	hd_start(&d, moverd_bin, "quota13", false, NULL);
	by_start(&d, &b);
	by_send(&b, 100);
	base = hd_fds(&d);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create secret13 --ring-size 4K") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create shared13 --ring-size 4K --allow-uid 65534") == 0);
	rc = hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow show secret13");
	rc_missing = hd_ctl_as(&d, moverctl_bin, NOBODY, missing,
			       sizeof(missing), "flow show nosuch13");
	printf("# uid 65534: flow show secret13: exit %d: %.300s", rc, out);
	CHECK(rc != 0 && rc == rc_missing);
	CHECK(strstr(out, "no such flow") && strstr(missing, "no such flow"));
	CHECK(!strstr(out, "owner"));
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow show shared13") == 0);
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow list") == 0);
	printf("# uid 65534: flow list:\n%s", out);
	CHECK(!strstr(out, "secret13") && strstr(out, "shared13"));
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"flow list --json") == 0);
	CHECK(!strstr(out, "secret13") && strstr(out, "shared13"));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list") == 0);
	CHECK(strstr(out, "secret13") && strstr(out, "shared13"));
	/* the peers of root's flows: in root's status, not in another
	 * user's (who talks to which host is theirs), unless a flow it may
	 * see goes there too */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create peer13 "
		     "--ring-size 4K --peer 127.0.0.13:1") == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	CHECK(strstr(out, "127.0.0.13:1"));
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"status --json") == 0);
	CHECK(!strstr(out, "127.0.0.13:1"));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create speer13 "
		     "--ring-size 4K --peer 127.0.0.13:1 --allow-uid 65534") == 0);
	CHECK(hd_ctl_as(&d, moverctl_bin, NOBODY, out, sizeof(out),
			"status --json") == 0);
	CHECK(strstr(out, "127.0.0.13:1"));
	printf("# uid 65534's status lists root's peer 127.0.0.13:1 only once a "
	       "flow it may see goes there\n");
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy peer13")
	      == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy "
		     "speer13") == 0);
	by_send(&b, 100);
	by_check(&b);
	hd_wait_fds(&d, base);
	check_idle(&d);
	hd_stop(&d);
}

/* ---- 15: rings' pages allocated and punched off the loop --------------- */

#define DIR15 "/tmp/fm-quota15-tmpfs"

/* The status answer's ring_to_allocate_bytes (or, free, ring_to_free_
 * bytes), asked on an open control connection: a round trip well under
 * a millisecond, where moverctl's start may take longer than a punch. */
static uint64_t raw_status_bytes(int sock, bool free)
{
	Flowmover__Response *resp = NULL;
	uint64_t v;

	CHECK(hc_status(sock, &resp) == 0);
	CHECK(resp->body_case == FLOWMOVER__RESPONSE__BODY_STATUS);
	v = free ? resp->status->ring_to_free_bytes :
		   resp->status->ring_to_allocate_bytes;
	ctl_response_free(resp);
	printf("# status: ring bytes to %s: %llu\n", free ? "free" : "allocate",
	       (unsigned long long)v);
	return v;
}

/* `status`'s ring_to_allocate_bytes or ring_to_free_bytes (key) on d,
 * from moverctl --json. */
static uint64_t status_bytes(const struct hd *d, const char *key)
{
	char out[16384];
	uint64_t v;

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	v = hj_u64(out, key);
	printf("# status: %s %llu\n", key, (unsigned long long)v);
	return v;
}

/* Bytes allocated in dir's filesystem. */
static uint64_t used_bytes(const char *dir)
{
	struct statvfs s;

	CHECK(statvfs(dir, &s) == 0);
	return (uint64_t)(s.f_blocks - s.f_bfree) * s.f_frsize;
}

/* Bytes allocated to the ring file of flow name in DIR15. */
static uint64_t ring_allocated(const char *name)
{
	char path[256];
	struct stat st;

	snprintf(path, sizeof(path), DIR15 "/%s.ring", name);
	if (stat(path, &st))
		return 0;
	return (uint64_t)st.st_blocks * 512;
}

/* Wait (10 s at most) until the ring file of name has all its pages. */
static uint64_t wait_allocated(const char *name, uint64_t ring)
{
	uint64_t got = 0;

	for (int i = 0; i < 1000 && got < FR_CTRL_BYTES + ring; i++) {
		got = ring_allocated(name);
		usleep(10000);
	}
	printf("# %s: %llu of %llu bytes allocated\n", name,
	       (unsigned long long)got,
	       (unsigned long long)(FR_CTRL_BYTES + ring));
	return got;
}

/* Wait (10 s at most) until dir's filesystem is back to base bytes used
 * (and a page or two for the flows' files). */
static uint64_t wait_used(const char *dir, uint64_t base)
{
	uint64_t used = used_bytes(dir);

	for (int i = 0; i < 1000 && used > base + (64 << 10); i++) {
		usleep(10000);
		used = used_bytes(dir);
	}
	printf("# %s: %llu bytes used, %llu at the start\n", dir,
	       (unsigned long long)used, (unsigned long long)base);
	return used;
}

static void case_fill(void)
{
	static const char *const opts[] = { "--state-dir", DIR15, NULL };
	struct hp_open o = { .ring_size = 16 << 20, .max_record = 256 };
	Flowmover__PeerFlowOpened *op = NULL;
	char name[64], msg[512] = "";
	int fd, sock, err[4];
	uint64_t base;
	struct hd d;

	/* (a) four 16M rings opened back to back on a 64M state directory
	 * (10 % kept free): the ones filling hold their room, so the fourth
	 * is refused there and then, rather than accepted and failed when
	 * its fill runs out of room */
	small_tmpfs(DIR15, "64M");
	hd_start(&d, moverd_bin, "quota15a", true, opts);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "eager"));
	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "p15-%d", i);
		o.name = name;
		o.flow_id = (uint32_t)i + 1;
		o.seal_key = 0x15150000ull + (uint64_t)i * 4096;
		CHECK(hp_open(fd, &o));
	}
	for (int i = 0; i < 4; i++) {
		CHECK(hp_wait_opened(fd, (uint32_t)i + 1, 10000, &op) == 0);
		err[i] = op->error;
		snprintf(msg, sizeof(msg), "%s", op->message ? op->message : "");
		printf("# open %d: error %d %s\n", i, err[i], msg);
		flowmover__peer_flow_opened__free_unpacked(op, NULL);
	}
	CHECK(!err[0] && !err[1] && !err[2] && err[3] == -ENOSPC);
	CHECK(strstr(msg, "--state-dir-reserve"));
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "p15-%d", i);
		CHECK(wait_allocated(name, 16 << 20) >= FR_CTRL_BYTES + (16 << 20));
	}
	CHECK(hd_log_count(&d, "cannot allocate its ring's memory") == 0);
	CHECK(free_share(DIR15) >= 0.10);
	close(fd);
	hd_stop(&d);

	/* (b) rings destroyed while their fill runs: it holds the flow
	 * until its chunk completes, then the pages go */
	small_tmpfs(DIR15, "2G");
	base = used_bytes(DIR15);
	hd_start(&d, moverd_bin, "quota15b", false, opts);
	sock = ctl_connect(d.sock);
	CHECK(sock >= 0);
	for (int i = 0; i < 4; i++) {
		CHECK_RC(hc_create(sock, "f15", 1 << 30, 0), 0);
		CHECK_RC(hc_destroy(sock, "f15"), 0);
	}
	CHECK(wait_used(DIR15, base) <= base + (64 << 10));
	/* a ring left alone is allocated all through */
	CHECK_RC(hc_create(sock, "f15", 256 << 20, 0), 0);
	CHECK(wait_allocated("f15", 256 << 20) >= FR_CTRL_BYTES + (256 << 20));
	CHECK_RC(hc_destroy(sock, "f15"), 0);
	CHECK(wait_used(DIR15, base) <= base + (64 << 10));
	/* (c) a stop while a ring fills: moverd waits for the chunk in
	 * flight (an orderly exit, nothing leaked), keeps the ring, and the
	 * next start fills the rest */
	CHECK_RC(hc_create(sock, "k15", 1 << 30, 0), 0);
	{
		/* status tells what is yet to allocate: a GiB takes 0.25 s
		 * at least, so it is asked well before the fill ends */
		uint64_t left = raw_status_bytes(sock, false);

		CHECK(left > 0 && left <= FR_CTRL_BYTES + (1u << 30));
	}
	close(sock);
	hd_term(&d);
	printf("# k15 at the stop: %llu bytes allocated\n",
	       (unsigned long long)ring_allocated("k15"));
	hd_restart(&d, moverd_bin, opts);
	CHECK(hd_log_count(&d, "flow k15: re-adopted") >= 1);
	CHECK(wait_allocated("k15", 1 << 30) >= FR_CTRL_BYTES + (1u << 30));
	CHECK(status_bytes(&d, "ring_to_allocate_bytes") == 0);
	sock = ctl_connect(d.sock);
	CHECK(sock >= 0);
	CHECK_RC(hc_destroy(sock, "k15"), 0);
	/* the punch of a GiB takes 0.1 s at least: still under way */
	CHECK(raw_status_bytes(sock, true) > 0);
	close(sock);
	CHECK(wait_used(DIR15, base) <= base + (64 << 10));
	/* every byte given back is counted out again */
	CHECK(status_bytes(&d, "ring_to_free_bytes") == 0);
	CHECK(status_bytes(&d, "ring_to_allocate_bytes") == 0);
	hd_alive(&d);
	hd_stop(&d);
	umount2(DIR15, MNT_DETACH);
	rmdir(DIR15);
}

/* ---- 18: a deposit into a page the filesystem cannot allocate -------- */

/*
 * The failure outlives a crash of moverd: before, the next start found
 * the ring marked failed and blamed a client ("a client marked the ring
 * failed").  The state file says why (failed=); on the full filesystem
 * its save failed and is tried again each second, so it is written once
 * the filler goes.  A second restart says the same.
 */
static void failure_survives(struct hd *d, const char *const *opts,
			     const char *was)
{
	static const char before[] = "failed before moverd restarted: ";
	char reason[256] = "", again[256] = "", line[512];
	int i;

	CHECK(hd_log_count(d, "its failure is not written to its state file") == 1);
	CHECK(unlink(DIR15 "/filler") == 0);
	for (i = 0; i < 500 && !hd_log_count(d, "flow d18: its state file "
					     "is written now"); i++)
		usleep(10000);
	CHECK(i < 500);
	hd_kill(d);
	hd_restart(d, moverd_bin, opts);
	CHECK(hd_wait_state(d, moverctl_bin, "d18", "failed", 10000, reason,
			    sizeof(reason)));
	printf("# after a restart: %s\n", reason);
	/* (hj_get's value ends at a comma: the log has it whole) */
	CHECK(!strncmp(reason, before, strlen(before)));
	CHECK(!strcmp(reason + strlen(before), was));
	snprintf(line, sizeof(line), "flow d18: failed: %s%s, file at its "
		 "size: a page could not be allocated", before, was);
	CHECK(hd_log_count(d, line) == 1);
	/* and again: the file keeps the first verdict, not the one found
	 * after a restart (each start prefixed it once more) */
	hd_kill(d);
	hd_restart(d, moverd_bin, opts);
	CHECK(hd_wait_state(d, moverctl_bin, "d18", "failed", 10000, again,
			    sizeof(again)));
	CHECK(!strcmp(again, reason));
	CHECK(hd_log_count(d, line) == 2);
}

/*
 * The sender went (above: the connection closed) before it closed the
 * flow failed here: back, its open is refused with the reason.  Before,
 * the connection's end put the flow back to "reconnecting", and as no
 * client was ever handed its ring (nothing polices it), the reopen was
 * answered "opened" on a failed ring.
 */
static void reopen_refused(const struct hd *d, const struct hp_open *o,
			   const char *reason)
{
	char msg[512], now[256] = "";
	int fd = hp_connect(d->port);

	CHECK(hp_hello(fd, "depositor"));
	CHECK_RC(hp_open_answer(fd, o, msg, sizeof(msg)), -EIO);
	printf("# the sender, back, hears: %s\n", msg);
	CHECK(strstr(msg, "failed on this host"));
	CHECK(strstr(msg, "could not be allocated"));
	CHECK(hd_wait_state(d, moverctl_bin, o->name, "failed", 1000, now,
			    sizeof(now)));
	CHECK(!strcmp(now, reason));
	close(fd);
}

/*
 * A receiver flow whose ring lacks pages (its fill behind, here punched
 * out again) on a full tmpfs, no consumer attached: a peer's DATA faults,
 * into the ring guard's zero pages when moverd copies the body from its
 * staging buffer (header and body came in one read), or in the kernel's
 * copy (EFAULT) when the body is received straight into the ring.  Before,
 * moverd acknowledged the bytes of the first (lost) and the flow stayed
 * open (the checks skip a ring no client was handed); the first consumer
 * then found it failed, blaming a client for resizing the file.  Now the
 * deposit is neither published nor acknowledged: the flow fails there and
 * then, and the sender hears why, either way (the second said only "a
 * deposit into its ring faulted").  Both are run: header and body in one
 * write, then apart (the body 200 ms later: moverd has read the header
 * alone and receives the body into the ring); which path each took is
 * not visible, only that its sender hears the same why.
 */
static void deposit_fault(bool apart)
{
	static const char *const opts[] = { "--state-dir", DIR15,
					    "--state-dir-reserve", "0", NULL };
	static const char page[4096];
	struct hp_open o = { "d18", 18, 16 << 20, 256, 0x18180000ull, 0 };
	Flowmover__PeerFlowOpened *op = NULL;
	char out[4096], reason[256] = "";
	uint8_t data[WIRE_HDR + 256] = { 0 };
	int fd, ring, fill;
	struct hd d;

	small_tmpfs(DIR15, "24M");
	hd_start(&d, moverd_bin, "quota18", true, opts);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "depositor"));
	CHECK(hp_open(fd, &o));
	CHECK(hp_wait_opened(fd, o.flow_id, 10000, &op) == 0);
	CHECK_RC(op->error, 0);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(wait_allocated("d18", 16 << 20) >= FR_CTRL_BYTES + (16 << 20));
	/* the data pages out again (a fill not there yet), then no room */
	ring = open(DIR15 "/d18.ring", O_RDWR | O_CLOEXEC);
	CHECK(ring >= 0);
	CHECK(fallocate(ring, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			FR_CTRL_BYTES, 16 << 20) == 0);
	close(ring);
	fill = open(DIR15 "/filler", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	CHECK(fill >= 0);
	while (write(fill, page, sizeof(page)) > 0)
		;
	close(fill);
	wire_put(data, WIRE_DATA, o.flow_id, 256, 0, 0);
	if (apart) {
		CHECK(hp_send_all(fd, data, WIRE_HDR));
		usleep(200000);
		CHECK(hp_send_all(fd, data + WIRE_HDR, 256));
	} else {
		CHECK(hp_send_all(fd, data, sizeof(data)));
	}
	/* the answer: refused, why; no acknowledgement of the bytes */
	CHECK(hp_wait_opened(fd, o.flow_id, 5000, &op) == 0);
	printf("# the sender hears: %d %s\n", op->error, op->message);
	CHECK(op->error == -EIO);
	CHECK(strstr(op->message, "could not be allocated"));
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(hd_wait_state(&d, moverctl_bin, "d18", "failed", 5000, reason,
			    sizeof(reason)));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "--json flow show d18") == 0);
	/* nothing published: "tail" is the ring's published word */
	CHECK(strstr(out, "\"bytes_sent\": 0,") && strstr(out, "\"tail\": 0,"));
	hd_alive(&d);
	close(fd);
	reopen_refused(&d, &o, reason);
	if (apart)
		failure_survives(&d, opts, reason);
	hd_stop(&d);
	umount2(DIR15, MNT_DETACH);
	rmdir(DIR15);
}

static void case_deposit_fault(void)
{
	deposit_fault(false);
	deposit_fault(true);
}

/* ---- 16: a sender told when to retry an open waits that long ---------- */

static void case_retry_after(void)
{
	static const char *const opts_b[] = { "--peer-max-ring-rate", "1M",
					      NULL };
	char out[4096], first[256] = "", later[256] = "";
	struct hd a, b;
	long wait_ms;

	hd_start(&b, moverd_bin, "quota16b", true, opts_b);
	hd_start(&a, moverd_bin, "quota16a", false, NULL);
	/* B's bucket holds 1 GiB: two rings of 512M open, the third is
	 * refused for 512 s (1M a second) */
	for (int i = 1; i <= 3; i++)
		CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create "
			     "s16-%d --ring-size 512M --peer 127.0.0.1:%d", i,
			     b.port) == 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "s16-1", "open", 10000, NULL, 0));
	CHECK(hd_wait_state(&a, moverctl_bin, "s16-2", "open", 10000, NULL, 0));
	for (int i = 0; i < 200 && retry_ms(first) < 0; i++) {
		CHECK(hd_flow_json(&a, moverctl_bin, "s16-3", out, sizeof(out)));
		if (!hj_get(out, "state_reason", first, sizeof(first)))
			first[0] = 0;
		usleep(50000);
	}
	wait_ms = retry_ms(first);
	printf("# s16-3: %s\n", first);
	CHECK(wait_ms > 400000 && strstr(first, "--peer-max-ring-rate"));
	/* A asks again in 60 s (what B said, capped), not every 100 ms:
	 * each answer would name a wait a little shorter */
	usleep(1500000);
	CHECK(hd_flow_json(&a, moverctl_bin, "s16-3", out, sizeof(out)));
	CHECK(hj_get(out, "state_reason", later, sizeof(later)));
	printf("# s16-3 1.5 s later: %s\n", later);
	CHECK(!strcmp(first, later));
	CHECK(!strstr(out, "\"state\":\"open\""));
	hd_stop(&a);
	hd_stop(&b);
}

/*
 * Case 17: a flow between hosts whose records would not fit one DATA
 * frame (2^31 bytes: its 32-bit length, one RDMA write) is refused at
 * create, with the limit named, before any ring is made.
 */
static void case_span_max(void)
{
	static const char *const opts[] = { "--max-ring-size", "8G", NULL };
	struct bystander b;
	char out[4096];
	struct hd d;
	int rc;

	hd_start(&d, moverd_bin, "quota17", false, opts);
	by_start(&d, &b);
	by_send(&b, 100);
	rc = hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create big17 "
		    "--peer 127.0.0.1:9 --ring-size 8G --max-record 3G");
	printf("  8 GiB ring, 3 GiB records, to a peer: exit %d: %s", rc, out);
	CHECK(rc != 0);
	CHECK(strstr(out, "too large for a flow between hosts"));
	CHECK(strstr(out, "2147483632"));
	CHECK(!hd_flow_json(&d, moverctl_bin, "big17", out, sizeof(out)));
	by_check(&b);
	hd_stop(&d);
}

/* ---- 19: a ring file a client grew by GiBs is freed off the loop ------- */

#define DIR19 "/tmp/fm-quota19-tmpfs"
#define GROW19 (2ull << 30)

/* How long a status request took on sock, in ms. */
static double status_ms(int sock)
{
	Flowmover__Response *r = NULL;
	uint64_t t0 = tu_now_ns();

	CHECK_RC(hc_status(sock, &r), 0);
	ctl_response_free(r);
	return (double)(tu_now_ns() - t0) / 1e6;
}

/* The worst of 20 status requests to d, 5 ms apart, in ms. */
static double status_ms_rest(const struct hd *d)
{
	int sock = ctl_connect(d->sock);
	double worst = 0, ms;

	CHECK(sock >= 0);
	for (int i = 0; i < 20; i++, usleep(5000))
		worst = (ms = status_ms(sock)) > worst ? ms : worst;
	close(sock);
	return worst;
}

/*
 * (a) A client grows its ring file by GROW19.  Before, moverd's check
 * freed it on the loop (ftruncate, then a punch), and every flow and
 * client waited that long: status did not answer for 0.3 s at 2 GiB, and
 * the client could do it again each second.  Now io_uring's workers punch
 * it out a chunk at a time and the ftruncate comes after, with nothing
 * left to free.  Status is asked all through (150 ms: a liveness bound,
 * a hundred times a status's worst at rest here, half the stall it had),
 * the bystander sends, and the file comes back to its size with nothing
 * beyond.
 */
static void grown_watched(const struct hd *d, struct bystander *b,
			  uint64_t want)
{
	double worst = 0, ms;
	char out[4096], reason[256] = "";
	int rfd, st, sock = ctl_connect(d->sock);
	unsigned asked = 0;
	uint64_t t0, t1;
	struct stat s;
	bool done;

	CHECK(sock >= 0);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out),
		     "flow create grow19 --ring-size 1M") == 0);
	rfd = hd_attach_fd(d, "grow19", FLOWMOVER__ROLE__PRODUCER, &st);
	t0 = tu_now_ns();
	CHECK(fallocate(rfd, 0, 0, (off_t)(want + GROW19)) == 0);
	t1 = tu_now_ns();
	printf("# ring file grown by %llu bytes in %.3f s\n",
	       (unsigned long long)GROW19, (double)(t1 - t0) / 1e9);
	do { /* status and the bystander go on while moverd repairs it */
		ms = status_ms(sock);
		worst = ms > worst ? ms : worst;
		if (++asked <= 1000) /* the bystander's ring holds them */
			by_send(b, 1);
		if (!(done = repaired(rfd, want, &s)))
			usleep(2000);
	} while (!done && tu_now_ns() - t1 < 30000000000ull);
	printf("# repaired %.3f s after the growth (%s); %u status asked "
	       "meanwhile, %.2f ms at worst\n",
	       (double)(tu_now_ns() - t1) / 1e9, done ? "yes" : "NO", asked,
	       worst);
	printf("# its size now %lld, %lld bytes allocated\n",
	       (long long)s.st_size, (long long)s.st_blocks * 512);
	CHECK(done);
	CHECK(hd_wait_state(d, moverctl_bin, "grow19", "failed", 5000, reason,
			    sizeof(reason)));
	printf("# grown ring file: %s\n", reason);
	CHECK(strstr(reason, "a client changed the ring file's size"));
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status") == 0);
	/* at 0.14 s a GiB, freeing it on the loop stalled status 0.28 s */
	CHECK(worst < 150);
	close(rfd);
	close(st);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out),
		     "flow destroy grow19") == 0);
	close(sock);
}

/* (b) The flow is destroyed while its file is punched: the punch holds
 * it (and its fd) until it is through, then the flow and its pages go,
 * and nothing of it stays open or allocated. */
static void grown_destroyed(const struct hd *d, uint64_t want,
			    uint64_t base_used)
{
	int rfd, st, sock = ctl_connect(d->sock), base = hd_fds(d);
	char out[4096];
	struct stat s;

	CHECK(sock >= 0);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out),
		     "flow create gone19 --ring-size 1M") == 0);
	rfd = hd_attach_fd(d, "gone19", FLOWMOVER__ROLE__PRODUCER, &st);
	CHECK(fallocate(rfd, 0, 0, (off_t)(want + GROW19)) == 0);
	CHECK(hd_wait_state(d, moverctl_bin, "gone19", "failed", 5000, NULL,
			    0));
	CHECK_RC(hc_destroy(sock, "gone19"), 0);
	printf("# gone19 destroyed %s\n", repaired(rfd, want, &s) ?
	       "once repaired already" : "while its punch is under way");
	/* the punch went on: the unlinked file is cut back too */
	CHECK(wait_repaired(rfd, want, 10000, &s));
	close(rfd);
	close(st);
	close(sock);
	hd_wait_fds(d, base);
	CHECK(wait_used(DIR19, base_used) <= base_used + (64 << 10));
}

/*
 * 19: a ring file a client grew by GiBs is freed off the loop.  The
 * state directory is a tmpfs of the test's own, where the freeing costs
 * what it costs (about 0.14 s a GiB); on a disk filesystem it may be fast
 * anyway, and (a) would not tell the two apart.
 */
static void case_grown_off_loop(void)
{
	static const char *const opts[] = { "--state-dir", DIR19, NULL };
	const uint64_t want = FR_CTRL_BYTES + (1 << 20);
	struct bystander b;
	struct statvfs v;
	uint64_t base;
	struct hd d;

	small_tmpfs(DIR19, "3G");
	CHECK(statvfs(DIR19, &v) == 0);
	if ((uint64_t)v.f_bavail * v.f_frsize < GROW19 + (64 << 20) ||
	    (uint64_t)sysconf(_SC_AVPHYS_PAGES) * 4096 < GROW19 + (1ull << 30)) {
		printf("# skipped: no room for %llu bytes on %s (a tmpfs: "
		       "memory)\n", (unsigned long long)GROW19, DIR19);
		umount2(DIR19, MNT_DETACH);
		rmdir(DIR19);
		return;
	}
	hd_start(&d, moverd_bin, "quota19", false, opts);
	by_start(&d, &b);
	base = used_bytes(DIR19);
	printf("# status at rest: %.2f ms at worst\n", status_ms_rest(&d));
	grown_watched(&d, &b, want);
	grown_destroyed(&d, want, base);
	CHECK(hd_log_count(&d, "cannot repair the ring file") == 0);
	by_check(&b);
	hd_alive(&d);
	hd_stop(&d);
	umount2(DIR19, MNT_DETACH);
	rmdir(DIR19);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 5, case_remote_opens, "remote opens: per-peer quotas, "
		  "state-dir reserve, orphan expiry" },
		{ 9, case_memory, "destroyed rings release their pages; ring "
		  "files cannot be resized" },
		{ 10, case_per_uid, "per-uid limits; flow list of any length" },
		{ 13, case_visibility, "other users' flows are not shown" },
		{ 14, case_create_rate, "ring bytes created a second, per uid "
		  "and per peer host" },
		{ 15, case_fill, "rings' pages allocated and punched off the "
		  "loop" },
		{ 16, case_retry_after, "a sender told when to retry an open "
		  "waits that long" },
		{ 17, case_span_max, "a record larger than one frame is "
		  "refused for a flow between hosts" },
		{ 18, case_deposit_fault, "a deposit into a page its "
		  "filesystem cannot allocate: not acknowledged, the flow "
		  "fails, the sender hears why (and again when it comes back)" },
		{ 19, case_grown_off_loop, "a ring file a client grew by GiBs "
		  "is freed off the loop" },
	};

	if (argc != 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL\n", argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_QUOTA_CASES");
}
