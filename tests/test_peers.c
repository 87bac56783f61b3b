/*
 * tests/test_peers.c - the connections moverd dials for its flows
 * (docs/security-tests.md), against real daemons: a local user who
 * creates and destroys flows to ever new peer addresses must not make
 * moverd hold a connection for each (its open files ran out: EMFILE for
 * everyone), a peer must not set a failed flow open again, and a connect
 * toward a host that drops SYNs gives up after --peer-connect-timeout,
 * and a body that comes slowly is not taken for a silent link.  Names
 * that never resolve (case 8, the slow_gai shim) hold the lookup thread's
 * slots only while their flows exist, and never root's last 8; one that
 * the DNS does not know is said once in the log, not at every retry
 * (case 10).
 * FM_PEERS_CASES=1 runs only that case.
 *
 *   usage: test_peers MOVERD MOVERCTL SLOW_GAI_SO
 */
#include "harness.h"

static const char *moverd_bin, *moverctl_bin, *slow_gai_so;

#define NOBODY 65534

/* A second moverd on 0.0.0.0:port: every 127.x.y.z:port reaches it, so
 * each address is a peer host of its own to the daemon under test. */
static void start_far(struct hd *b, int port)
{
	static char laddr[64];
	const char *const opts[] = { "--listen", laddr, "--insecure-peers",
				     "--peer-max-conns-per-addr", "1000",
				     NULL };

	snprintf(laddr, sizeof(laddr), "0.0.0.0:%d", port);
	hd_start(b, moverd_bin, "peersfar", false, opts);
}

/* Does d's `status --json` list a peer whose address has prefix? */
static bool lists_peer(const struct hd *d, const char *prefix)
{
	char out[65536];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status --json") == 0);
	return strstr(out, prefix) != NULL;
}

/* Wait (generously: shared, noisy cores) until d lists no such peer. */
static void wait_unlisted(const struct hd *d, const char *prefix)
{
	for (int i = 0; i < 600 && lists_peer(d, prefix); i++)
		usleep(50000);
	if (lists_peer(d, prefix)) {
		char out[65536];

		hd_ctl(d, moverctl_bin, out, sizeof(out), "status");
		fprintf(stderr, "peers %s* still listed:\n%s", prefix, out);
		CHECK(!"idle outbound peers were not closed");
	}
}

/* Flow NAME to addr, by moverctl as uid (0: root; hd_ctl_as): open on the
 * far daemon, then destroyed.  The link it made is up and authenticated. */
static void create_open_destroy(const struct hd *a, uid_t uid,
				const char *name, const char *addr)
{
	char out[4096];

	if (hd_ctl_as(a, moverctl_bin, uid, out, sizeof(out), "flow create %s "
		      "--peer %s --ring-size 64K", name, addr)) {
		fprintf(stderr, "flow create %s --peer %s: %s", name, addr, out);
		CHECK(!"flow create failed");
	}
	CHECK(hd_wait_state(a, moverctl_bin, name, "open", 20000, NULL, 0));
	CHECK(hd_ctl_as(a, moverctl_bin, uid, out, sizeof(out),
			"flow destroy %s", name) == 0);
}

/* A create that must be refused for too many peer hosts, saying which
 * option; the sentence printed. */
static void refused(const struct hd *a, uid_t uid, const char *name,
		    const char *addr, const char *option)
{
	char out[4096];
	int rc = hd_ctl_as(a, moverctl_bin, uid, out, sizeof(out),
			   "flow create %s --peer %s --ring-size 64K", name,
			   addr);

	printf("# flow create %s --peer %s: exit %d: %s", name, addr, rc, out);
	CHECK(rc != 0 && strstr(out, "too many peer hosts") &&
	      strstr(out, option));
	CHECK(hd_ctl(a, moverctl_bin, out, sizeof(out), "flow show %s",
		     name) != 0);
}

/* ---- 1: idle links close, and outbound connections are capped ------------ */

static void case_idle_links(void)
{
	const char *const opts_a[] = { "--peer-max-hosts", "40",
				       "--peer-max-hosts-per-uid", "4", NULL };
	const char *const opts_t[] = { "--peer-max-hosts", "6",
				       "--peer-max-hosts-per-uid", "100", NULL };
	char addr[64], prefix[32], name[128], out[4096];
	struct hd a, b;
	int port = hd_free_port(), base, n;

	start_far(&b, port);
	hd_start(&a, moverd_bin, "peers1", false, opts_a);
	/* the baseline after a flow's files were first made */
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create warm "
		     "--ring-size 64K") == 0);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow destroy "
		     "warm") == 0);
	base = hd_fds(&a);
	printf("# moverd's fds at start: %d\n", base);

	/* uid 65534 churns through three times its cap of distinct peer
	 * hosts: each round fills the cap, is refused one more, and waits
	 * for the idle links to go; root is not held to the per-uid cap */
	for (int r = 0; r < 3; r++) {
		snprintf(prefix, sizeof(prefix), "127.0.%d.", 3 + r);
		for (int i = 1; i <= 4; i++) {
			snprintf(addr, sizeof(addr), "%s%d:%d", prefix, i, port);
			snprintf(name, sizeof(name), "churn%d-%d", r, i);
			create_open_destroy(&a, NOBODY, name, addr);
		}
		snprintf(addr, sizeof(addr), "%s5:%d", prefix, port);
		refused(&a, NOBODY, "over", addr,
			"--peer-max-hosts-per-uid");
		create_open_destroy(&a, 0, "rootflow", addr);
		wait_unlisted(&a, prefix);
		CHECK(hd_wait_fds_pid(a.pid, base, 30000));
		printf("# round %d: 5 links closed, fds back to %d\n", r,
		       hd_fds(&a));
	}

	/* destroyed and made again at once: the link that lingers is used
	 * (printed, not checked: it is a matter of time) */
	snprintf(addr, sizeof(addr), "127.0.9.1:%d", port);
	create_open_destroy(&a, NOBODY, "again", addr);
	create_open_destroy(&a, NOBODY, "again", addr);
	snprintf(name, sizeof(name), "peer %s: connected", addr);
	printf("# a flow destroyed and created again: %d connection(s)\n",
	       hd_log_count(&a, name));
	wait_unlisted(&a, "127.0.9.");
	CHECK(hd_wait_fds_pid(a.pid, base, 30000));
	hd_alive(&b);
	hd_stop(&a);

	/* the cap in all: 6, the last 3 kept for root; fan-out too */
	hd_start(&a, moverd_bin, "peers1t", false, opts_t);
	for (int i = 1; i <= 3; i++) {
		snprintf(addr, sizeof(addr), "127.0.10.%d:%d", i, port);
		CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
				"flow create t%d --peer %s --ring-size 64K", i,
				addr) == 0);
	}
	snprintf(addr, sizeof(addr), "127.0.10.4:%d", port);
	refused(&a, NOBODY, "t4", addr, "kept for root");
	for (int i = 4; i <= 6; i++) {
		snprintf(addr, sizeof(addr), "127.0.10.%d:%d", i, port);
		CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create "
			     "r%d --peer %s --ring-size 64K", i, addr) == 0);
	}
	snprintf(addr, sizeof(addr), "127.0.10.7:%d", port);
	refused(&a, 0, "r7", addr, "--peer-max-hosts");
	n = hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow peer add r4 %s",
		   addr);
	printf("# flow peer add r4 %s: exit %d: %s", addr, n, out);
	CHECK(n != 0 && strstr(out, "too many peer hosts (6)"));
	/* a host already connected to costs no connection */
	snprintf(addr, sizeof(addr), "127.0.10.1:%d", port);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow peer add r4 %s",
		     addr) == 0);
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			"flow create t5 --peer %s --ring-size 64K", addr) == 0);
	/* flows that exist keep their links past the linger */
	CHECK(hd_wait_state(&a, moverctl_bin, "t1", "open", 20000, NULL, 0));
	usleep(7000000);
	for (int i = 1; i <= 6; i++) {
		snprintf(prefix, sizeof(prefix), "127.0.10.%d:", i);
		CHECK(lists_peer(&a, prefix));
	}
	CHECK(hd_log_count(&a, "no flows for") == 0);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 2: an answer to no open leaves a failed flow failed ------------------ */

static bool is_open_msg(const Flowmover__PeerMsg *m, uint32_t unused)
{
	(void)unused;
	return m->body_case == FLOWMOVER__PEER_MSG__BODY_OPEN;
}

/* The answer to flow id's OPEN: error (and why; -EAGAIN: ask again in
 * retry_ms), or opened, resuming at resume (head 0). */
static bool send_opened(int fd, uint32_t id, int error, const char *why,
			uint64_t resume, uint32_t retry_ms)
{
	Flowmover__PeerMsg msg = FLOWMOVER__PEER_MSG__INIT;
	Flowmover__PeerFlowOpened op = FLOWMOVER__PEER_FLOW_OPENED__INIT;

	op.flow_id = id;
	op.error = error;
	op.message = (char *)why;
	op.resume = resume;
	op.retry_ms = retry_ms;
	msg.body_case = FLOWMOVER__PEER_MSG__BODY_OPENED;
	msg.opened = &op;
	return hp_send_msg(fd, &msg);
}

/* A receiver the test plays for a new flow of d's (name): moverd's
 * connection accepted, hellos said, its OPEN read (the flow's id in
 * *id).  The connection; the listening socket in *lfd. */
/* The next connection moverd makes to lfd, past the hellos and its OPEN
 * (the flow's id in *id). */
static int fake_accept(int lfd, uint32_t *id)
{
	struct hp_hello_in hello;
	Flowmover__PeerMsg *m;
	int fd;

	CHECK((fd = hp_accept(lfd, 20000)) >= 0);
	CHECK(hp_read_hello(fd, 10000, &hello) == 0);
	CHECK(hp_hello(fd, "fake-receiver"));
	CHECK((m = hp_wait_msg(fd, 10000, is_open_msg, 0)));
	*id = m->open->flow_id;
	flowmover__peer_msg__free_unpacked(m, NULL);
	return fd;
}

static int fake_receiver(const struct hd *d, const char *name, int *lfd,
			 uint32_t *id)
{
	char out[4096];
	int lport;

	*lfd = hp_listen(&lport);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "flow create %s "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1024",
		     name, lport) == 0);
	return fake_accept(*lfd, id);
}

static void case_opened_failed(void)
{
	struct hp_open sync = { "sync2", 77, 65536, 256, 0x1234, 0 };
	Flowmover__PeerFlowOpened *op = NULL;
	char reason[256];
	int lfd, fd;
	uint32_t id;
	struct hd a;

	hd_start(&a, moverd_bin, "peers2", false, NULL);
	fd = fake_receiver(&a, "f2", &lfd, &id);

	/* refused: the flow fails */
	CHECK(send_opened(fd, id, -EEXIST, "refused by the test", 0, 0));
	CHECK(hd_wait_state(&a, moverctl_bin, "f2", "failed", 10000, reason,
			    sizeof(reason)));
	/* then "busy, retry" and "opened", which nothing asked for; our own
	 * open's answer after them says moverd has read them (a refusal:
	 * without keys no flow is opened over a connection moverd dialed) */
	CHECK(send_opened(fd, id, -EAGAIN, "busy, says the test", 0, 0));
	CHECK(send_opened(fd, id, 0, "", 0, 0));
	CHECK(hp_open(fd, &sync));
	CHECK(hp_wait_opened(fd, sync.flow_id, 10000, &op) == 0);
	CHECK(op->error == -EPERM);
	flowmover__peer_flow_opened__free_unpacked(op, NULL);
	CHECK(hd_wait_state(&a, moverctl_bin, "f2", "failed", 1000, reason,
			    sizeof(reason)));
	printf("# f2 after unsolicited answers: failed: %s\n", reason);
	CHECK(strstr(reason, "refused by the test"));
	close(fd);
	close(lfd);
	hd_stop(&a);
}

/* ---- 3: a connect nobody answers times out, and the flow says so -------- */

/*
 * A listener on 127.0.0.1 that never accepts, with backlog 0 and one
 * connection (*filler) in its accept queue: Linux drops the SYNs of any
 * further connect, which waits as toward a host behind a firewall that
 * drops them.  A probe of the test's own checks that (not connected
 * within 1 s).  Its port in *port.
 */
static int syn_sink(int *port, int *filler)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), probe, rc;
	struct pollfd pfd;

	CHECK(lfd >= 0);
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(listen(lfd, 0) == 0);
	CHECK(getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
	*port = ntohs(a.sin_port);
	CHECK((*filler = hp_connect(*port)) >= 0);
	probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	CHECK(probe >= 0);
	rc = connect(probe, (struct sockaddr *)&a, sizeof(a));
	CHECK(rc < 0 && errno == EINPROGRESS);
	pfd = (struct pollfd){ probe, POLLOUT, 0 };
	rc = poll(&pfd, 1, 1000);
	printf("# a probe's connect to the full accept queue after 1 s: %s\n",
	       rc ? "answered" : "unanswered");
	CHECK(rc == 0);
	close(probe);
	return lfd;
}

/* The state_reason of flow name on d ("" if none), in why. */
static void flow_reason(const struct hd *d, const char *name, char *why,
			size_t cap)
{
	char out[4096];

	if (!hd_flow_json(d, moverctl_bin, name, out, sizeof(out)) ||
	    !hj_get(out, "state_reason", why, cap))
		why[0] = 0;
}

/* Wait up to ms for flow name's reason to contain needle; it is printed. */
static bool wait_reason(const struct hd *d, const char *name,
			const char *needle, int ms)
{
	char why[256] = "";

	for (int i = 0; i <= ms / 100; i++) {
		hd_alive(d);
		flow_reason(d, name, why, sizeof(why));
		if (strstr(why, needle))
			break;
		usleep(100000);
	}
	printf("# flow %s: reason '%s' (waited for '%s')\n", name, why, needle);
	return strstr(why, needle) != NULL;
}

/* Does `status` give the (only) peer of d a last error holding needle,
 * in --json and in its plain text? */
static bool peer_error_says(const struct hd *d, const char *needle)
{
	char out[8192], why[256] = "";
	uint64_t when;

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	if (!hj_get(out, "last_error", why, sizeof(why)))
		why[0] = 0;
	when = hj_u64(out, "last_error_unix_ms");
	printf("# status: the peer's last error '%s' at %llu ms\n", why,
	       (unsigned long long)when);
	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "status") == 0);
	return strstr(why, needle) && when > 0 &&
	       strstr(out, ": last error at ") && strstr(out, needle);
}

/* Wait up to ms for needle to be in at least n lines of d's log. */
static bool wait_log(const struct hd *d, const char *needle, int n, int ms)
{
	for (int i = 0; i <= ms / 100 && hd_log_count(d, needle) < n; i++)
		usleep(100000);
	return hd_log_count(d, needle) >= n;
}

static void case_connect_timeout(void)
{
	const char *const opts[] = { "--peer-connect-timeout", "1", NULL };
	char laddr[64], needle[128], out[4096];
	const char *const far_opts[] = { "--listen", laddr, NULL };
	int port, filler, lfd = syn_sink(&port, &filler);
	struct hd a, b;

	hd_start(&a, moverd_bin, "peers3", false, opts);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create c3 "
		     "--peer 127.0.0.1:%d --ring-size 64K", port) == 0);
	/* the connect gives up after 1 s, not the kernel's ~2 min, and the
	 * flow, still connecting, says why (generous waits: shared cores) */
	snprintf(needle, sizeof(needle), "connect to 127.0.0.1:%d: timed out "
		 "after 1 s", port);
	CHECK(wait_reason(&a, "c3", needle, 20000));
	CHECK(hd_wait_state(&a, moverctl_bin, "c3", "connecting", 1000, NULL,
			    0));
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow show c3") == 0);
	printf("# flow show c3:\n%s", out);
	CHECK(strstr(out, "timed out after 1 s"));
	/* and status says it of the peer (an operator's first look) */
	CHECK(peer_error_says(&a, needle));
	/* it is retried (each attempt times out again), warned of once */
	CHECK(wait_log(&a, "connect: timed out after 1 s", 3, 30000));
	CHECK(hd_log_count(&a, "warn  peer 127.0.0.1") == 1);
	CHECK(hd_log_count(&a, "connect: timed out after 1 s; retrying") == 1);

	/* the host answers again, refusing: the reason changes, warned of */
	close(filler);
	close(lfd);
	CHECK(wait_reason(&a, "c3", "Connection refused", 20000));
	CHECK(peer_error_says(&a, "Connection refused"));
	CHECK(wait_log(&a, "connect: Connection refused; retrying", 1, 5000));

	/* a moverd listens on the port: the flow opens */
	snprintf(laddr, sizeof(laddr), "127.0.0.1:%d", port);
	hd_start(&b, moverd_bin, "peers3far", false, far_opts);
	CHECK(hd_wait_state(&a, moverctl_bin, "c3", "open", 30000, NULL, 0));
	printf("# c3 open once a moverd listens on its port, after %d failed "
	       "connects, %d of them warned of\n",
	       hd_log_count(&a, ": connect: "),
	       hd_log_count(&a, "warn  peer 127.0.0.1"));
	CHECK(hd_log_count(&a, "warn  peer 127.0.0.1") == 2);
	hd_stop(&a);
	hd_stop(&b);
}

/*
 * A peer that hangs up before its hello turned us away (or stopped): the
 * error says so.  One that said its hello first, then hung up, is not
 * blamed on the door.
 */
static void case_hangup_before_hello(void)
{
	struct hp_hello_in hello;
	Flowmover__PeerMsg *m;
	int lport, lfd, fd;
	char out[4096];
	struct hd a;

	lfd = hp_listen(&lport);
	hd_start(&a, moverd_bin, "peers4", false, NULL);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create h4 "
		     "--peer 127.0.0.1:%d --ring-size 64K", lport) == 0);
	/* (a) read its hello, say nothing, close */
	CHECK((fd = hp_accept(lfd, 10000)) >= 0);
	CHECK(hp_read_hello(fd, 10000, &hello) == 0);
	close(fd);
	CHECK(wait_reason(&a, "h4", "before the peer's hello", 20000));
	CHECK(peer_error_says(&a, "receive: closed before the peer's hello: "
			      "it turned the connection away"));
	/* (b) the next connection: our hello, its open read, then the end
	 * of our stream (all it sent is read: no reset) */
	CHECK((fd = hp_accept(lfd, 20000)) >= 0);
	CHECK(hp_read_hello(fd, 10000, &hello) == 0);
	CHECK(hp_hello(fd, "says-hello"));
	CHECK((m = hp_wait_msg(fd, 10000, is_open_msg, 0)));
	flowmover__peer_msg__free_unpacked(m, NULL);
	CHECK(shutdown(fd, SHUT_WR) == 0);
	CHECK(wait_reason(&a, "h4", "receive: closed", 20000));
	flow_reason(&a, "h4", out, sizeof(out));
	CHECK(!strstr(out, "before the peer's hello"));
	close(fd);
	close(lfd);
	hd_stop(&a);
}

/* n records of 64 B into flow name of d, from this process. */
static flowshm_t *produce(const struct hd *d, const char *name, int n)
{
	char rec[64] = { 0 };
	flowshm_t *f = NULL;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	CHECK(flowshm_attach(name, FLOWSHM_PRODUCER, NULL, &f) == 0);
	for (int i = 0; i < n; i++)
		CHECK(flowshm_send(f, rec, sizeof(rec), -1) == 0);
	return f;
}

/* Read moverd's DATA frames until bytes of them came. */
static void read_data(int fd, uint64_t bytes)
{
	struct wire_hdr h;
	uint64_t got = 0;

	while (got < bytes) {
		CHECK(hp_read_frame(fd, &h, NULL, 0, 10000) == 1);
		if (h.type == WIRE_DATA)
			got += h.len;
	}
}

/* fake_receiver for flow name, opened at 0, with the DATA of 3 records
 * of 64 B (80 bytes each in the ring) that this process produced read. */
static int received_three(const struct hd *d, const char *name, int *lfd,
			  uint32_t *id, flowshm_t **prod)
{
	int fd = fake_receiver(d, name, lfd, id);

	CHECK(send_opened(fd, *id, 0, "", 0, 0));
	CHECK(hd_wait_state(d, moverctl_bin, name, "open", 10000, NULL, 0));
	*prod = produce(d, name, 3);
	read_data(fd, 3 * 80);
	return fd;
}

/* Does flow name fail, saying why, within 10 s? */
static bool fails_for(const struct hd *d, const char *name, const char *why)
{
	return wait_reason(d, name, why, 10000) &&
	       hd_wait_state(d, moverctl_bin, name, "failed", 1000, NULL, 0);
}

static void fake_end(flowshm_t *prod, int fd, int lfd)
{
	flowshm_detach(prod);
	close(fd);
	close(lfd);
}

/*
 * A receiver (holding the key, or none is set) that names a position
 * inside a record, where moverd would send or release from: for its
 * next send (a resume), or as acknowledged.  moverd would take the rest
 * of the record for a dead producer's gap and pad over it in the
 * producer ring, under every other reader.  The flow fails, nothing
 * else; a position off the record grid is the peer's fault alone: its
 * connection goes.
 */
static void case_inside_record(void)
{
	int lfd, fd;
	flowshm_t *prod;
	uint32_t id;
	struct hd a;

	hd_start(&a, moverd_bin, "peers5", false, NULL);

	/* (a) an acknowledgement inside the first of 3 records it has */
	fd = received_three(&a, "k5a", &lfd, &id, &prod);
	CHECK(hp_send_hdr(fd, WIRE_ACK, id, 0, 16, 0));
	CHECK(fails_for(&a, "k5a", "acknowledgement 16 is inside a record"));
	fake_end(prod, fd, lfd);

	/* (b) one off the record grid: the connection goes */
	fd = received_three(&a, "k5b", &lfd, &id, &prod);
	CHECK(hp_send_hdr(fd, WIRE_ACK, id, 0, 8, 0));
	CHECK(hp_closed_within(fd, 10000));
	CHECK(wait_reason(&a, "k5b", "acknowledgement 8/0 outside the window",
			  10000));
	fake_end(prod, fd, lfd);

	/* (c) a resume inside a record it was sent before the link went */
	fd = received_three(&a, "k5c", &lfd, &id, &prod);
	close(fd);
	fd = fake_accept(lfd, &id);
	CHECK(send_opened(fd, id, 0, "", 16, 0));
	CHECK(fails_for(&a, "k5c", "resume position 16 is inside a record"));
	fake_end(prod, fd, lfd);

	/* (d) a resume past what it was ever sent (its consumers can write
	 * the `published` it answers from): nothing of it is taken */
	fd = fake_receiver(&a, "k5d", &lfd, &id);
	prod = produce(&a, "k5d", 3);
	CHECK(send_opened(fd, id, 0, "", 80, 0));
	CHECK(fails_for(&a, "k5d", "beyond what was sent to it"));
	fake_end(prod, fd, lfd);
	hd_alive(&a);
	hd_stop(&a);
}

/*
 * Case 6: a DATA body that comes slowly.  moverd receives a body whole
 * (one completion), so a large record on a slow link was failed as a
 * silent link ("no frame for 5 s") while its bytes were still coming, and
 * sent again, and failed again.  A fake sender trickles an 8 KiB body over
 * 8 s, longer than that limit: the connection stays, moverd does not spin
 * on the passed deadline meanwhile, and the body lands.
 */
static void case_slow_body(void)
{
	static const char *const opts[] = { "--insecure-peers", NULL };
	static const struct hp_open o = { "slow", 6, 1 << 16, 8192,
					  0x510b0d7ull, 0 };
	static const struct hp_open dash = { "--all", 7, 1 << 16, 8192,
					     0x510b0d8ull, 0 };
	static uint8_t body[8192];
	char msg[256] = "";
	struct hd d;
	double cpu;
	int fd;

	hd_start(&d, moverd_bin, "peers6", true, opts);
	fd = hp_connect(d.port);
	CHECK(hp_hello(fd, "slow-sender"));
	/* (a name a script would take for an option is refused first) */
	CHECK_RC(hp_open_retry(fd, &dash, 5000, msg, sizeof(msg)), -EINVAL);
	printf("  open of '--all': %s\n", msg);
	CHECK(strstr(msg, "may not start with '-'"));
	CHECK_RC(hp_open_retry(fd, &o, 5000, msg, sizeof(msg)), 0);
	memset(body, 0x5a, sizeof(body));
	CHECK(hp_send_hdr(fd, WIRE_DATA, o.flow_id, sizeof(body), 0, 0));
	for (size_t done = 0; done < sizeof(body); done += 512) {
		CHECK(hp_send_all(fd, body + done, 512));
		usleep(500000);
		if (done == 11 * 512) {
			/* past the 5 s since the last frame: moverd waits
			 * for the rest, its timer not firing on every pass
			 * for the deadline gone by (1 ms sleeps before) */
			long sw = hd_status_num(&d, "voluntary_ctxt_switches");

			cpu = hd_cpu_share(&d, 1500);
			sw = hd_status_num(&d, "voluntary_ctxt_switches") - sw;
			printf("  6-7.5 s into the body: moverd's cpu %.2f, "
			       "%ld sleeps\n", cpu, sw);
			CHECK(cpu < 0.5 && sw < 150);
		}
	}
	CHECK(hd_wait_count(&d, moverctl_bin, "slow", "tail", sizeof(body),
			    5000));
	printf("  8 KiB body over 8 s: deposited; \"no frame\" logged %d "
	       "times\n", hd_log_count(&d, "no frame for"));
	CHECK(hd_log_count(&d, "no frame for") == 0);
	close(fd);
	hd_stop(&d);
}

/*
 * Case 7: a receiver's "busy, retry" words reach `flow show` on an
 * operator's terminal: an escape sequence in them must arrive as text,
 * not as a command to the terminal.
 */
static void case_busy_words(void)
{
	char out[4096];
	int lfd, fd;
	uint32_t id;
	struct hd a;

	hd_start(&a, moverd_bin, "peers7", false, NULL);
	fd = fake_receiver(&a, "f7", &lfd, &id);
	/* retry in 30 s: the reason stays while we look (it becomes
	 * "waiting for the peer" at the next open) */
	CHECK(send_opened(fd, id, -EAGAIN, "busy \x1b]0;owned\x07\x1b[2J "
			  "says the test", 0, 30000));
	CHECK(wait_reason(&a, "f7", "says the test", 10000));
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow show f7") == 0);
	printf("%s", out);
	CHECK(!strchr(out, 0x1b) && !strchr(out, 0x07));
	CHECK(strstr(out, "says the test"));
	close(fd);
	close(lfd);
	hd_stop(&a);
}

/* ---- 8: host-name lookups are a shared, bounded resource ------------------ */

/* moverd with the slow_gai shim: names "slow*" take 5 s and fail. */
static void start_slow_dns(struct hd *a, const char *tag,
			   const char *const *extra)
{
	hd_preload(slow_gai_so);
	hd_start(a, moverd_bin, tag, false, extra);
	hd_preload_end();
}

/*
 * The lookups of a daemon's peer names run on one thread, RESOLVER_MAX
 * (64) at once.  (a) A user creates and destroys 70 flows to names that
 * never answer: each destroyed flow's lookup went with its peer, so each
 * new one is looked up (before, they piled up: "64 lookups pending
 * already" for minutes, for everyone), and so is root's.  (b) A user keeps 64 such flows: the last 8 slots are
 * root's, and root's flow is still looked up, next: its answer comes after
 * at most the lookup running (before, after the user's 56 queued).
 */
static void case_lookups(void)
{
	const char *const opts[] = { "--peer-max-hosts-per-uid", "64", NULL };
	char out[4096], name[32], addr[32];
	unsigned refused_user = 0;
	struct hd a;

	start_slow_dns(&a, "peers8", opts);
	for (unsigned i = 0; i < 70; i++) {
		snprintf(name, sizeof(name), "s%u", i);
		snprintf(addr, sizeof(addr), "slow%u:1", i);
		CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
				"flow create %s --peer %s --ring-size 64K",
				name, addr) == 0);
		/* its lookup is queued: the destroyed flows' went with them
		 * (before, the 57th on was refused: 56 pending) */
		CHECK(wait_reason(&a, name, "resolv", 10000));
		flow_reason(&a, name, out, sizeof(out));
		CHECK(strstr(out, "resolving"));
		CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
				"flow destroy %s", name) == 0);
	}
	wait_unlisted(&a, "slow");
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create r "
		     "--peer slowroot:1 --ring-size 64K") == 0);
	CHECK(wait_reason(&a, "r", "resolving slowroot:1", 10000));
	printf("# (a) after 70 flows created and destroyed: root's flow r is "
	       "being resolved\n");
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow destroy r") == 0);

	for (unsigned i = 0; i < 64; i++) {
		char reason[256] = "";

		snprintf(name, sizeof(name), "k%u", i);
		snprintf(addr, sizeof(addr), "slowk%u:1", i);
		CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
				"flow create %s --peer %s --ring-size 64K",
				name, addr) == 0);
		if (hd_flow_json(&a, moverctl_bin, name, out, sizeof(out)) &&
		    hj_get(out, "state_reason", reason, sizeof(reason)) &&
		    strstr(reason, "kept for root"))
			refused_user++;
	}
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create r2 "
		     "--peer slowroot2:1 --ring-size 64K") == 0);
	CHECK(wait_reason(&a, "r2", "resolving slowroot2:1", 10000));
	printf("# (b) a user's 64 flows to such names: %u refused a lookup "
	       "(the rest kept for root); root's flow r2 is being resolved\n",
	       refused_user);
	/* 8 when the 64 creates take less than one lookup (5 s); on a slow
	 * host (7 under ASan in one CI run) a lookup ended meanwhile and its
	 * slot was the user's again: some refused, and root's r2 queued, is
	 * what the reserve guarantees */
	CHECK(refused_user >= 1);
	/* and its turn comes next: root's lookups run before the others
	 * queued, so after at most the one running (5 s), not after the
	 * user's 56 (before: minutes) */
	CHECK(wait_reason(&a, "r2", "cannot resolve slowroot2:1", 15000));
	hd_alive(&a);
	hd_stop(&a);
}

/* ---- 9: a destroyed flow's ring is charged until it is released ---------- */

/* `status --json`'s destroyed_rings and destroyed_ring_bytes on d. */
static void destroyed_rings(const struct hd *d, uint64_t *n, uint64_t *bytes)
{
	char out[16384];

	CHECK(hd_ctl(d, moverctl_bin, out, sizeof(out), "--json status") == 0);
	*n = hj_u64(out, "destroyed_rings");
	*bytes = hj_u64(out, "destroyed_ring_bytes");
	printf("# status: destroyed_rings %llu, destroyed_ring_bytes %llu\n",
	       (unsigned long long)*n, (unsigned long long)*bytes);
}

/*
 * A user's sender flow whose receiver (the test) stops reading: moverd's
 * send waits in flight, and holds the ring, after the user destroyed the
 * flow.  The user's ring quota counts that ring until the send ends:
 * before, a create straight after the destroy passed, and a user could
 * hold rings past its quota for as long as such sends last.
 */
static void case_destroyed_charged(void)
{
	static const char *const opts[] = { "--max-ring-bytes-per-uid", "24M",
					    "--max-flows", "2", NULL };
	/* 14.4 MB: past what the sockets take in while nobody reads (the
	 * test's receive buffer 64 KiB, moverd's unsent bytes ~1 MiB) */
	enum { REC = 60000, RECS = 240 };
	static char rec[REC];
	char out[4096];
	flowshm_t *prod = NULL;
	int lfd, lport, fd, rc, i, rcvbuf = 64 << 10;
	uint64_t n, bytes;
	uint32_t id;
	struct hd a;

	hd_start(&a, moverd_bin, "peers9", false, opts);
	lfd = hp_listen(&lport);
	/* before moverd connects: the accepted socket inherits it */
	CHECK(setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &rcvbuf,
			 sizeof(rcvbuf)) == 0);
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			"flow create q9a --peer 127.0.0.1:%d --ring-size 16M "
			"--max-record 65536", lport) == 0);
	fd = fake_accept(lfd, &id);
	CHECK(send_opened(fd, id, 0, "", 0, 0));
	CHECK(hd_wait_state(&a, moverctl_bin, "q9a", "open", 10000, NULL, 0));
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK(flowshm_attach("q9a", FLOWSHM_PRODUCER, NULL, &prod) == 0);
	for (i = 0; i < RECS; i++)
		CHECK(flowshm_send(prod, rec, sizeof(rec), 10000) == 0);
	/* what moverd sent till its send had to wait: the test reads none,
	 * and says it is alive (a link silent for 5 s fails, which would
	 * end the send) */
	CHECK(hp_send_hdr(fd, WIRE_HEARTBEAT, 0, 0, 0, 0));
	usleep(500000);
	CHECK(hp_send_hdr(fd, WIRE_HEARTBEAT, 0, 0, 0, 0));
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			"flow destroy q9a") == 0);
	CHECK(hd_log_count(&a, "flow q9a destroyed (its ring is released "
			   "once the I/O in flight") == 1);
	flowshm_detach(prod);

	/* 16M held + 16M > 24M: refused, saying why */
	rc = hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
		       "flow create q9b --ring-size 16M");
	printf("# a create while the destroyed ring is held: exit %d: %s", rc,
	       out);
	CHECK(rc != 0 && strstr(out, "--max-ring-bytes-per-uid") &&
	      strstr(out, "1 destroyed, their rings not yet released"));
	/* and the operator sees it held */
	destroyed_rings(&a, &n, &bytes);
	CHECK(n == 1 && bytes == 16 << 20);
	/* the operator has no quota, but --max-flows 2 counts the destroyed
	 * flow too (it holds its ring's fd as a listed flow does): one more
	 * flow */
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out),
		     "flow create q9op") == 0);
	rc = hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create q9op2");
	printf("# the operator's second create: exit %d: %s", rc, out);
	CHECK(rc != 0 && strstr(out, "too many flows (limit 2: --max-flows; "
				"1 destroyed, held by I/O in flight)"));

	/* the receiver goes: the send ends, the ring is released */
	close(fd);
	for (i = 0; i < 100; i++) {
		rc = hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			       "flow create q9b --ring-size 16M");
		if (!rc)
			break;
		usleep(100000);
	}
	printf("# the same create after the link went: exit %d after %.1f "
	       "s%s%s\n", rc, i * 0.1, rc ? ": " : "", rc ? out : "");
	CHECK(rc == 0);
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			"flow destroy q9b") == 0);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out),
		     "flow destroy q9op") == 0);
	/* q9b and q9op had no consumer: their pages go at once; q9a's went
	 * before */
	for (i = 0; i < 100; i++) {
		destroyed_rings(&a, &n, &bytes);
		if (!n && !bytes)
			break;
		usleep(100000);
	}
	CHECK(n == 0 && bytes == 0);
	close(lfd);
	hd_alive(&a);
	hd_stop(&a);
}

/* ---- 10: a name that never resolves is said once ------------------------- */

/*
 * A flow to a name the DNS does not know waits, and its peer's lookup is
 * tried again every 2 s.  Each try put a warning in the log: a user with
 * 32 such flows (--peer-max-hosts-per-uid) wrote 16 lines a second of
 * names of its choosing, for as long as it liked (a review).  Now the
 * first failure is a warning and the retries are debug lines; the flow's
 * reason still says why.
 */
static void case_unresolved_said_once(void)
{
	char out[4096];
	int warned = 0, retries = 0;
	struct hd a;

	start_slow_dns(&a, "peers10", NULL);
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			"flow create n10 --peer nohost10:1 --ring-size 64K") ==
	      0);
	CHECK(wait_reason(&a, "n10", "cannot resolve nohost10:1", 10000));
	/* three tries at least (2 s apart) */
	for (int i = 0; i < 300 && retries < 3; i++) {
		usleep(100000);
		retries = hd_log_count_with(&a, "debug", "cannot resolve");
		warned = hd_log_count_with(&a, "warn", "cannot resolve");
	}
	printf("# nohost10:1: %d warning(s), %d debug lines of retries\n",
	       warned, retries);
	CHECK(retries >= 3);
	CHECK(warned == 1);
	flow_reason(&a, "n10", out, sizeof(out));
	CHECK(strstr(out, "cannot resolve nohost10:1"));
	CHECK(hd_ctl_as(&a, moverctl_bin, NOBODY, out, sizeof(out),
			"flow destroy n10") == 0);
	hd_alive(&a);
	hd_stop(&a);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_idle_links, "outbound links without flows close; "
		  "outbound peer hosts are capped" },
		{ 2, case_opened_failed, "an OPENED nobody asked for leaves a "
		  "failed flow failed" },
		{ 3, case_connect_timeout, "a connect nobody answers times out "
		  "after --peer-connect-timeout; the flow says why" },
		{ 4, case_hangup_before_hello, "a peer that hangs up before "
		  "its hello is said to have turned us away" },
		{ 5, case_inside_record, "a receiver that names a position "
		  "inside a record fails that flow only" },
		{ 6, case_slow_body, "a DATA body that takes longer than the "
		  "link's silence limit is received" },
		{ 7, case_busy_words, "a receiver's 'busy' words reach flow "
		  "show without their control bytes" },
		{ 8, case_lookups, "host-name lookups: a destroyed flow's goes "
		  "with it; the last slots are root's" },
		{ 9, case_destroyed_charged, "a destroyed flow's ring held by "
		  "a send in flight still counts against its user's quota "
		  "and --max-flows" },
		{ 10, case_unresolved_said_once, "a peer name that never "
		  "resolves is a warning once, not at every retry" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL SLOW_GAI_SO\n",
			argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	slow_gai_so = argv[3];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]),
		      "FM_PEERS_CASES");
}
