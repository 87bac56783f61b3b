/*
 * tests/test_files.c - issue 14, findings 8 and 11 against a real moverd:
 *
 *   8    a sender flow whose peer is a host name, with a DNS server that
 *        never answers (moverd in its own mount namespace, a resolv.conf
 *        of the test's bind-mounted over /etc/resolv.conf): moverctl and
 *        a local flow go on without a stall; the flow says why it waits.
 *   111  (11a) the socket's directory is a symlink: refused, nothing is
 *        written through it.
 *   112  (11b) the state directory is a symlink: refused, likewise.
 *   113  (11c) the socket's directory was made first by another user
 *        (uid 65534, world-writable, a lock-file symlink planted): refused.
 *   114  (11d) NAME.flow.tmp and NAME.ring symlinks planted in the state
 *        directory: not followed.
 *   115  (11e) a peer string with a newline (a metadata line injected):
 *        the create is refused, no state file has the line.
 *   116  (11f) re-adoption refuses a state file with a duplicate key, with
 *        a number that does not parse, a world-writable ring and a
 *        symlinked state file, a ring a client grew past --max-ring-size
 *        and one whose mode it flipped, and adopts the good one.
 *   117  (11g) the control socket is never seen with a mode wider than
 *        --socket-mode (bind() slowed down by a preloaded shim, so that a
 *        window between bind and chmod would be seen).
 *
 * FM_FILES_CASES=8,111 runs only those.
 *
 *   usage: test_files MOVERD MOVERCTL SLOW_BIND_SO
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <pthread.h>

static const char *moverd_bin, *moverctl_bin, *slow_bind_so;
static char top[64];          /* /tmp/fm-files-PID: this test's files */

/* ---- small helpers -------------------------------------------------------- */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int sh(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	fflush(NULL);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");

	CHECK(f);
	CHECK(fputs(text, f) >= 0);
	CHECK(fclose(f) == 0);
}

/* The file's content ("" if it cannot be read). */
static void get_file(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "re");
	size_t n = 0;

	if (f) {
		n = fread(out, 1, cap - 1, f);
		fclose(f);
	}
	out[n] = 0;
}

static bool victim_intact(const char *path, const char *want)
{
	char have[4096];

	get_file(path, have, sizeof(have));
	if (strcmp(have, want)) {
		fprintf(stderr, "victim %s was written through a link: it now "
			"holds '%s' (was '%s')\n", path, have, want);
		return false;
	}
	return true;
}

static void want_victim(const char *path, const char *want)
{
	if (!victim_intact(path, want))
		exit(1);
}

/* moverctl --socket sock ARGS; its exit code, its output in out. */
static int ctl_at(const char *sock, char *out, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int ctl_at(const char *sock, char *out, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = tu_vmoverctl(moverctl_bin, sock, out, cap, fmt, ap);
	va_end(ap);
	return rc;
}

/* A fresh directory of the test's own under top. */
static void fresh_dir(char *out, size_t cap, const char *name, mode_t mode)
{
	snprintf(out, cap, "%s/%s", top, name);
	CHECK(sh("rm -rf '%s'", out) == 0);
	CHECK(mkdir(out, mode) == 0);
	CHECK(chmod(out, mode) == 0);
}

/*
 * Start `moverd --foreground --socket SOCK EXTRA...`, which must refuse to
 * start: exit non-zero within 10 s with `want` on stderr (the log).  If it
 * comes up instead, `exploit` runs against it (showing what the refusal
 * prevents) and the case fails.
 */
static void want_refusal(const char *sock, const char *const *extra,
			 const char *want, void (*exploit)(const char *sock))
{
	const char *argv[32] = { moverd_bin, "--foreground", "--socket", sock };
	char log[160], text[4096];
	int n = 4, st = 0;
	pid_t pid;

	snprintf(log, sizeof(log), "%s/refused.log", top);
	for (; extra && *extra; extra++)
		argv[n++] = *extra;
	argv[n] = NULL;
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(moverd_bin, (char **)argv);
		_exit(127);
	}
	for (int i = 0; i < 1000; i++) {
		int fd;

		if (waitpid(pid, &st, WNOHANG) == pid) {
			get_file(log, text, sizeof(text));
			printf("  moverd refused (status %d): %s", WEXITSTATUS(st),
			       text);
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
			if (!strstr(text, want)) {
				fprintf(stderr, "want '%s' in its message\n", want);
				exit(1);
			}
			return;
		}
		fd = ctl_connect(sock);
		if (fd >= 0) {
			close(fd);
			break;
		}
		usleep(10000);
	}
	fprintf(stderr, "moverd started on %s instead of refusing\n", sock);
	if (exploit)
		exploit(sock);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	exit(1);
}

/* ---- case 8: a host name and a DNS server that never answers ------------- */

#define DNS_SEC 10 /* timeout:5 attempts:2 */

/* The dead server's address: one of our own, so that two runs of this
 * test at once (or anything else on 127.0.0.x:53) never meet. */
static const char *dns_ip(void)
{
	static char ip[32];

	if (!ip[0])
		snprintf(ip, sizeof(ip), "127.77.%d.%d", (int)getpid() / 250 % 250,
			 (int)getpid() % 250 + 2);
	return ip;
}

/* moverd in its own mount namespace, with our resolv.conf */
static void ns_wrapper(const char *dir, char *wrapper, size_t cap)
{
	char conf[160], text[1024];

	snprintf(conf, sizeof(conf), "%s/resolv.conf", dir);
	snprintf(text, sizeof(text), "nameserver %s\noptions timeout:5 "
		 "attempts:2\n", dns_ip());
	put_file(conf, text);
	snprintf(wrapper, cap, "%s/moverd-ns", dir);
	/* no --fork: each exec keeps the pid, so the harness sees moverd */
	snprintf(text, sizeof(text), "#!/bin/sh\nexec unshare -m sh -c "
		 "'mount --bind %s /etc/resolv.conf && exec \"$0\" \"$@\"' "
		 "%s \"$@\"\n", conf, moverd_bin);
	put_file(wrapper, text);
	CHECK(chmod(wrapper, 0755) == 0);
}

/* A UDP socket on dns_ip():53 that never answers. */
static int dead_dns(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(53),
				 .sin_addr.s_addr = inet_addr(dns_ip()) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	CHECK(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	return fd;
}

static unsigned status_failures;

/* One control round trip (a status request); its latency in ms. */
static double status_ms(const struct hd *d)
{
	uint64_t t0 = tu_now_ns();
	char out[8192];

	if (hd_ctl(d, moverctl_bin, out, sizeof(out), "status") != 0) {
		if (!status_failures++)
			printf("  moverctl status failed: %s", out);
	}
	return (double)(tu_now_ns() - t0) / 1e6;
}

/*
 * The local flow "loc": a producer attaches (through moverd), sends record
 * seq and detaches; the consumer (attached once) must get exactly it.
 * Returns the latency of the whole round in ms.
 */
static unsigned local_failures;

static double local_round(flowshm_t *cons, uint64_t seq, bool *ok)
{
	unsigned char buf[512], got[512];
	uint64_t t0 = tu_now_ns(), s;
	flowshm_t *prod = NULL;
	size_t len = tu_rec_len(1, seq, 16, 256), n = 0;
	uint32_t id;
	int rc;

	rc = flowshm_attach("loc", FLOWSHM_PRODUCER, NULL, &prod);
	if (rc) {
		if (!local_failures++)
			printf("  attach failed: %s\n", flowshm_attach_error());
		*ok = false;
		return (double)(tu_now_ns() - t0) / 1e6;
	}
	*ok = true;
	tu_fill(buf, 1, seq, len);
	CHECK_RC(flowshm_send(prod, buf, len, 5000000000ll), 0);
	flowshm_detach(prod);
	CHECK_RC(flowshm_recv(cons, got, sizeof(got), &n, 5000000000ll), 0);
	CHECK(tu_verify(got, n, &id, &s) && id == 1 && s == seq);
	return (double)(tu_now_ns() - t0) / 1e6;
}

struct liveness {
	double worst_status, worst_local;
	uint64_t rounds;
};

/* Keep moverctl and the local flow busy for ms; note the worst latency. */
static void exercise(const struct hd *d, flowshm_t *cons, int ms,
		     struct liveness *lv)
{
	uint64_t until = tu_now_ns() + (uint64_t)ms * 1000000ull;

	while (tu_now_ns() < until) {
		bool ok;
		double a = status_ms(d), b = local_round(cons, lv->rounds, &ok);

		lv->rounds += ok;
		hd_alive(d);
		if (a > lv->worst_status)
			lv->worst_status = a;
		if (b > lv->worst_local)
			lv->worst_local = b;
		usleep(50000);
	}
}

static void case_dns(void)
{
	char dir[128], wrapper[192], out[8192], reason[200] = "";
	struct liveness lv = { 0 };
	flowshm_t *cons = NULL;
	uint64_t t0;
	int dns = dead_dns(), base;
	pid_t creator;
	struct hd d;

	fresh_dir(dir, sizeof(dir), "dns", 0755);
	ns_wrapper(dir, wrapper, sizeof(wrapper));
	hd_start(&d, wrapper, "files8", false, NULL);
	/* the daemon sees the dead server, the rest of the host does not */
	snprintf(dir, sizeof(dir), "/proc/%d/root/etc/resolv.conf", (int)d.pid);
	get_file(dir, out, sizeof(out));
	CHECK(strstr(out, dns_ip()));

	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create loc --ring-size 64K --max-record 1K") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("loc", FLOWSHM_CONSUMER, NULL, &cons), 0);
	exercise(&d, cons, 500, &lv);
	base = hd_fds(&d);
	printf("  before: status %.0f ms, local round %.0f ms (worst), %d fds\n",
	       lv.worst_status, lv.worst_local, base);

	/* the create may itself be what stalls: from another process */
	fflush(NULL);
	creator = fork();
	CHECK(creator >= 0);
	if (creator == 0)
		_exit(hd_ctl(&d, moverctl_bin, NULL, 0, "flow create far "
			     "--peer some.name.invalid:7000"));
	lv = (struct liveness){ .rounds = lv.rounds };
	exercise(&d, cons, (DNS_SEC + 3) * 1000, &lv);
	printf("  while resolving: status %.0f ms, local round %.0f ms "
	       "(worst; %llu records; %u status and %u attach failures)\n",
	       lv.worst_status, lv.worst_local, (unsigned long long)lv.rounds,
	       status_failures, local_failures);
	/* a liveness bound, not a performance one: a blocked loop is ~10 s */
	CHECK(status_failures == 0 && local_failures == 0);
	CHECK(lv.worst_status < 2000 && lv.worst_local < 2000);
	{
		int st;

		CHECK(waitpid(creator, &st, 0) == creator);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}

	/* the flow says why it waits, once the lookup has failed */
	t0 = tu_now_ns();
	while (tu_now_ns() - t0 < 3ull * DNS_SEC * 1000000000ull) {
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
			     "flow show far --json") == 0);
		hj_get(out, "state_reason", reason, sizeof(reason));
		if (strstr(reason, "cannot resolve"))
			break;
		usleep(200000);
	}
	printf("  flow far: %s\n", reason);
	CHECK(strstr(reason, "cannot resolve") &&
	      strstr(reason, "some.name.invalid"));

	/* destroyed while a retry's lookup may be in flight */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow destroy far") == 0);
	exercise(&d, cons, 300, &lv);
	CHECK(hd_cpu_share(&d, 1000) < 0.5);
	hd_wait_fds(&d, base);
	CHECK(status_failures == 0 && local_failures == 0);
	CHECK(lv.worst_status < 2000 && lv.worst_local < 2000);
	flowshm_detach(cons);

	/* stopping with a lookup in flight: no wait for the resolver */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create far2 "
		     "--peer other.name.invalid:7000") == 0);
	usleep(300000);
	t0 = tu_now_ns();
	hd_stop(&d);
	printf("  stopped in %.0f ms with a lookup in flight\n",
	       (double)(tu_now_ns() - t0) / 1e6);
	CHECK(tu_now_ns() - t0 < 5000000000ull);
	close(dns);
	unsetenv("FLOWMOVER_SOCKET");
}

/* ---- 11a, 11b, 11c: directories that are not moverd's ------------------------ */

/* What the old daemon did through the link: create a flow to another
 * host (its ring and state file go to the state directory). */
static void exploit_flow(const char *sock)
{
	char out[4096];

	ctl_at(sock, out, sizeof(out), "flow create v --peer 127.0.0.1:1");
	printf("  exploit: flow create v: %s", out);
}

static char lock_victim[192];

/* What the old daemon did through the link: its lock file is the victim */
static void exploit_lock(const char *sock)
{
	(void)sock;
	victim_intact(lock_victim, "VICTIM\n");
}

static void case_socket_dir_link(void)
{
	char real[128], link[160], sock[192], victim[192];

	fresh_dir(real, sizeof(real), "a-real", 0755);
	snprintf(victim, sizeof(victim), "%s/moverd.sock.lock", real);
	put_file(victim, "VICTIM\n");
	snprintf(link, sizeof(link), "%s/a-link", top);
	unlink(link);
	CHECK(symlink(real, link) == 0);
	snprintf(sock, sizeof(sock), "%s/moverd.sock", link);
	snprintf(lock_victim, sizeof(lock_victim), "%s", victim);
	want_refusal(sock, NULL, "symbolic link", exploit_lock);
	want_victim(victim, "VICTIM\n");
}

static void exploit_state(const char *sock)
{
	char victim[192];

	exploit_flow(sock);
	snprintf(victim, sizeof(victim), "%s/b-victim/v.flow", top);
	victim_intact(victim, "VICTIM\n");
}

static void case_state_dir_link(void)
{
	char run[128], victims[128], link[192], sock[192], victim[192];
	const char *extra[] = { "--state-dir", link, NULL };

	fresh_dir(run, sizeof(run), "b-run", 0755);
	fresh_dir(victims, sizeof(victims), "b-victim", 0700);
	snprintf(victim, sizeof(victim), "%s/v.flow", victims);
	put_file(victim, "VICTIM\n");
	snprintf(link, sizeof(link), "%s/rings", run);
	CHECK(symlink(victims, link) == 0);
	snprintf(sock, sizeof(sock), "%s/moverd.sock", run);
	want_refusal(sock, extra, "symbolic link", exploit_state);
	want_victim(victim, "VICTIM\n");
}

static void case_foreign_dir(void)
{
	char pub[128], victim[160], sock[192];

	/* a /tmp of our own: root's, world-writable, sticky */
	fresh_dir(pub, sizeof(pub), "c-tmp", 01777);
	snprintf(victim, sizeof(victim), "%s/c-victim", top);
	put_file(victim, "VICTIM\n");
	/* uid 65534 makes the socket's directory first, with a trap in it */
	CHECK(sh("setpriv --reuid 65534 --regid 65534 --clear-groups sh -c "
		 "'mkdir -m 0777 %s/run && ln -s %s %s/run/moverd.sock.lock'",
		 pub, victim, pub) == 0);
	snprintf(sock, sizeof(sock), "%s/run/moverd.sock", pub);
	snprintf(lock_victim, sizeof(lock_victim), "%s", victim);
	want_refusal(sock, NULL, "uid 65534", exploit_lock);
	want_victim(victim, "VICTIM\n");
}

/* ---- 11d: links planted in the state directory ------------------------------ */

static void case_planted_links(void)
{
	char out[4096], state[160], path[224], v1[160], v2[160];
	struct stat st;
	struct hd d;

	hd_start(&d, moverd_bin, "files11d", false, NULL);
	snprintf(state, sizeof(state), "%s/rings", d.dir);
	mkdir(state, 0700); /* moverd may have made it already */
	snprintf(v1, sizeof(v1), "%s/victim1", d.dir);
	snprintf(v2, sizeof(v2), "%s/victim2", d.dir);
	put_file(v1, "VICTIM1\n");
	put_file(v2, "VICTIM2\n");
	snprintf(path, sizeof(path), "%s/x.flow.tmp", state);
	CHECK(symlink(v1, path) == 0);
	snprintf(path, sizeof(path), "%s/x.ring", state);
	CHECK(symlink(v2, path) == 0);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out),
		     "flow create x --ring-size 64K --peer 127.0.0.1:1") == 0);
	want_victim(v1, "VICTIM1\n");
	want_victim(v2, "VICTIM2\n");
	snprintf(path, sizeof(path), "%s/x.flow", state);
	CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
	snprintf(path, sizeof(path), "%s/x.ring", state);
	CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow destroy x") == 0);
	hd_stop(&d);
}

/* ---- 11e: a metadata line injected through the peer string ----------------- */

static void case_meta_injection(void)
{
	char out[4096], path[224], meta[4096];
	int rc;
	struct hd d;

	hd_start(&d, moverd_bin, "files11e", false, NULL);
	/* moverctl checks only the port: the host part carries the line */
	rc = hd_ctl(&d, moverctl_bin, out, sizeof(out),
		    "flow create inj --peer 'h\nrole=receiver:7000'");
	printf("  create: exit %d: %s", rc, out);
	snprintf(path, sizeof(path), "%s/rings/inj.flow", d.dir);
	get_file(path, meta, sizeof(meta));
	if (meta[0])
		printf("  inj.flow:\n%s", meta);
	CHECK(!strstr(meta, "\nrole=receiver"));
	CHECK(rc != 0 && strstr(out, "peer"));
	hd_stop(&d);
}

/* ---- 11f: tampered state files at re-adoption -------------------------------- */

static void tamper(const char *state, const char *cmd)
{
	CHECK(sh("cd '%s' && %s", state, cmd) == 0);
}

/* A client that holds a ring file rewrites its geometry (ring files
 * cannot be sealed): a larger ring (the file grown to match) and a mode. */
static void regeometry(const char *state, const char *file,
		       uint64_t ring_bytes, uint32_t mode)
{
	char path[256];
	struct fr_geometry g;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", state, file);
	CHECK((fd = open(path, O_RDWR | O_CLOEXEC)) >= 0);
	CHECK(pread(fd, &g, sizeof(g), 0) == (ssize_t)sizeof(g));
	if (ring_bytes != g.ring_bytes) {
		CHECK(ftruncate(fd, (off_t)fr_map_bytes(ring_bytes)) == 0);
		g.ring_bytes = ring_bytes;
	}
	g.mode = mode;
	CHECK(pwrite(fd, &g, sizeof(g), 0) == (ssize_t)sizeof(g));
	close(fd);
}

static void case_adoption(void)
{
	static const char *const names[] = { "good", "dup", "num", "wring",
					     "slink", "grown", "mode" };
	char out[4096], state[160];
	struct hd d;

	hd_start(&d, moverd_bin, "files11f", false, NULL);
	snprintf(state, sizeof(state), "%s/rings", d.dir);
	for (unsigned i = 0; i < 7; i++)
		CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create %s "
			     "--ring-size 64K --peer 127.0.0.1:1", names[i]) == 0);
	hd_kill(&d); /* a crash: the files stay */
	regeometry(state, "grown.ring", 2ull << 30, FR_MODE_LOCAL);
	regeometry(state, "mode.ring", 64u << 10, FR_MODE_DEPOSIT);
	tamper(state, "echo owner_uid=65534 >> dup.flow");
	tamper(state, "sed -i 's/^id=.*/id=5x/' num.flow");
	tamper(state, "chmod 0666 wring.ring");
	tamper(state, "mv slink.flow ../slink.real && "
			       "ln -s ../slink.real slink.flow");
	hd_start(&d, moverd_bin, "files11f", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow list") == 0);
	printf("  adopted:\n%s", out);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow show good") == 0);
	for (unsigned i = 1; i < 7; i++) {
		int rc = hd_ctl(&d, moverctl_bin, out, sizeof(out),
				"flow show %s --json", names[i]);

		if (rc == 0) {
			fprintf(stderr, "tampered flow %s was adopted: %s\n",
				names[i], out);
			exit(1);
		}
	}
	CHECK(hd_log_count(&d, "refusing to re-adopt") >= 6);
	CHECK(hd_log_count(&d, "above --max-ring-size") == 1);
	CHECK(hd_log_count(&d, "not a sender flow's") == 1);
	hd_stop(&d);
}

/* ---- 11g: the socket's mode from the start ------------------------------------ */

struct mode_watch {
	const char *path;
	volatile int stop;
	mode_t widest;        /* bits seen beyond the mode asked for */
	unsigned seen;
};

static void *watch_mode(void *arg)
{
	struct mode_watch *w = arg;
	struct stat st;

	while (!w->stop) {
		if (lstat(w->path, &st) == 0 && S_ISSOCK(st.st_mode)) {
			w->widest |= st.st_mode & 0777 & ~(mode_t)0600;
			w->seen++;
		}
	}
	return NULL;
}

static void case_socket_mode(void)
{
	const char *extra[] = { "--socket-mode", "0600", NULL };
	char sock[160];
	struct mode_watch w = { .path = sock };
	pthread_t th;
	struct stat st;
	struct hd d;

	snprintf(sock, sizeof(sock), "/tmp/fm-files11g-%d/moverd.sock",
		 (int)getpid());
	CHECK(pthread_create(&th, NULL, watch_mode, &w) == 0);
	/* the shim holds every AF_UNIX bind() 300 ms before it returns */
	hd_preload(slow_bind_so);
	hd_start(&d, moverd_bin, "files11g", false, extra);
	hd_preload_end();
	w.stop = 1;
	pthread_join(th, NULL);
	CHECK(lstat(sock, &st) == 0);
	printf("  socket mode %04o now; seen %u times, bits beyond 0600 seen: "
	       "%04o\n", (unsigned)(st.st_mode & 07777), w.seen,
	       (unsigned)w.widest);
	CHECK(w.seen > 0);
	CHECK((st.st_mode & 0777) == 0600);
	CHECK(w.widest == 0);
	hd_stop(&d);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 8, case_dns, "8: a host name with a dead DNS server: no stall" },
		{ 111, case_socket_dir_link, "11a: socket directory is a symlink" },
		{ 112, case_state_dir_link, "11b: state directory is a symlink" },
		{ 113, case_foreign_dir, "11c: socket directory made by uid "
					 "65534, world-writable" },
		{ 114, case_planted_links, "11d: symlinks planted in the state "
					   "directory" },
		{ 115, case_meta_injection, "11e: a metadata line in a peer "
					    "string" },
		{ 116, case_adoption, "11f: tampered state files at re-adoption" },
		{ 117, case_socket_mode, "11g: socket mode before listen" },
	};
	int rc;

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL SLOW_BIND_SO\n",
			argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	slow_bind_so = argv[3];
	snprintf(top, sizeof(top), "/tmp/fm-files-%d", (int)getpid());
	CHECK(mkdir(top, 0755) == 0 || errno == EEXIST);
	CHECK(chmod(top, 0755) == 0);
	rc = hc_run(cases, sizeof(cases) / sizeof(cases[0]), "FM_FILES_CASES");
	if (!getenv("FM_KEEP"))
		sh("rm -rf '%s'", top);
	return rc;
}
