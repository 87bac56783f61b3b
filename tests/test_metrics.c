/*
 * tests/test_metrics.c - moverd's counters (issue 10): the counters file
 * (ipc/counters.h) read the way any outside reader reads it, moverctl top
 * in a real terminal (tmux), and moverd --metrics scraped by a real
 * Prometheus.
 *
 *   usage: test_metrics MOVERD MOVERCTL FLOWCHECK
 *
 * Cases (FM_METRICS_CASES=1,3 runs some):
 *   1  the file: beside the socket, mode 0640, a valid header naming the
 *      daemon; a local flow's committed and consumed bytes equal what a
 *      producer sent and a consumer took, lag 0, its attachments; its
 *      record is freed when it is destroyed and a new flow in the slot has
 *      another incarnation; at a stop the file goes and a reader holding
 *      it sees `closed`
 *   2  the sequence lock: a writer thread rewriting a record as fast as it
 *      can, readers never get a torn copy
 *   3  between hosts: sender sent = acked = every byte, batches, the
 *      receiver's received bytes, frames both ways, acknowledgement times
 *      in the histogram (its buckets add up to its count), the daemon's
 *      cycles; moverctl top --once --json shows the flow
 *   4  a peer that stops answering (SIGSTOP for 2.5 s): heartbeats missed
 *      on the other side, no reconnect; then killed and restarted:
 *      reconnects and resumes counted on the flow and the peer
 *   5  moverctl top in an 80x24 tmux during a transfer: the flow with
 *      non-zero rates (records/s, bytes in and out), the sort keys, q
 *      quits; a top stopped by SIGTERM exits 0 with the terminal back in
 *      line mode with echo
 *   6  a real Prometheus scraping both daemons every second during a
 *      paced transfer: rate(flowmover_flow_bytes_received_total) matches
 *      what the consumer measured over the same window within 10%
 *   7  who may read: another user cannot open the counters file; moverctl
 *      top then shows that user's flows (and no one else's) from the
 *      control socket, and says so; without the file, top and flow show
 *      answer from the control socket
 *   8  flow show and status carry the counters: from the file for root,
 *      from the control answer for a user allowed on the flow who may not
 *      read the file; the same figures either way
 *   9  the text itself (metrics_text.c on a counters file made here): label
 *      values with a quote, a backslash and a newline come out escaped,
 *      promtool check metrics accepts it, OpenMetrics ends with # EOF
 *  10  record counters between hosts: N records of known, varied sizes
 *      (sent one by one and in batches) over a 256 KiB ring: on the sender
 *      records committed = sent = N, bytes committed = sent = the ring
 *      bytes of those records and their lap-end pads; on the receiver
 *      records deposited = committed = consumed = N, bytes deposited the
 *      same; each counter 0 on the side it does not belong to; the same
 *      figures in flow show --json, top --once --json and /metrics' text
 *  11  records consumed by a consumer that leaves right after its last
 *      record: the sampler saw it attached, then it takes every record
 *      (publishing lazily) and detaches between two passes: the count it
 *      published as it left is not lost
 *  12  a consumer on B takes 8 KiB of 40 KiB (less than the quarter ring
 *      a receiver credits at once) and stops, attached: A's view of what
 *      it consumed (flow show --json) comes up to B's
 *  13  a flow no client holds: its record follows what moverd does to it
 *  14  the connection window: B stopped 300 ms while 1 MiB records flow,
 *      the window is cut (counted) below 16 MiB; B stopped
 *      again: no more than the window and a record unacknowledged; every
 *      record still arrives, nothing stays unacknowledged; the same
 *      figures in top --json and status, and WIN on top's screen (from
 *      the counters file and from the control socket)
 *  15  moverd --window-delay-us: A with a 5 s target and B stopped 300 ms
 *      as in 14: no cut, the window whole; status shows each daemon's
 *      target; a target below 10 us is refused
 *  16  a 10 us target and B stopped 30 ms now and then while 1 MiB records
 *      flow: the window is seen below a record's size, and every record
 *      still arrives (a record larger than the window goes alone)
 *  17  moverctl against a moverd that lies (a process of the test's own on
 *      a socket): ESC, raw CSI and UTF-8 CSI in versions, transports, peer
 *      addresses and errors, reload lines, create's peer, error messages
 *      and top's screen come out as '?' (JSON: escaped, and valid); a flow
 *      list whose pages do not move forward is an error in flow list,
 *      destroy --all and top (not a loop); top's first frame refused:
 *      said, exit 4
 *  18  flow destroy --all as a user who may see root's flow but not
 *      destroy it: the user's own flows go, root's is skipped (stderr),
 *      exit 4, one valid JSON document (also with no flows); --drain and
 *      --all with another command: exit 2; stdout on /dev/full: exit 1;
 *      --timeout 2147483647 (a sanitizer build catches an overflow)
 *  19  top on a counters file made here: flows and peers without a record
 *      counted (text and JSON), rows that do not fit an 80x24 tmux on
 *      "(+N more)", names with escapes; the header rewritten under a
 *      running top (bigger counts, another record offset): it keeps what
 *      it checked; a killed moverd: top --once exits 3, daemon_gone and
 *      sample_age_ms in its JSON
 *  20  the endpoint (metrics_http.c in this process, on a counters file
 *      made here): GET answers exactly metrics_render's text, label values
 *      with quotes, backslashes and newlines first, last and doubled come
 *      out escaped; a counter moved without a sampler pass: the next GET
 *      is the same body (shared, not rendered again); HEAD: the length,
 *      no body; OpenMetrics to a scraper that asks; after a pass the new
 *      value comes; 404, 405; no counters file: no endpoint
 *  21  --metrics-token: a token file of mode 0644 is refused at start;
 *      /metrics answers 401 (WWW-Authenticate: Bearer) without the token,
 *      with another, a prefix of it or another scheme, the text with it;
 *      a real Prometheus job with `authorization: credentials_file` is up,
 *      one without is down
 */
#include "harness.h"
#include "../ipc/counters.h"
#include "../ipc/ring.h"
#include "metrics_http.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <sys/un.h>
#include <sys/mman.h>

#define MS 1000000ull
#define SEC 1000000000ull

static const char *moverd, *moverctl, *flowcheck;

/* ---- reading the counters file, as an outside reader ------------------ */

struct cmap {
	const struct fmc_header *h;
	size_t bytes;
};

static struct cmap cmap_open(const struct hd *d)
{
	char path[192];
	struct stat st;
	struct cmap m;
	int fd;

	snprintf(path, sizeof(path), "%s.counters", d->sock);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(fstat(fd, &st) == 0);
	m.bytes = (size_t)st.st_size;
	m.h = mmap(NULL, m.bytes, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	CHECK(m.h != MAP_FAILED);
	CHECK(fmc_valid(m.h, m.bytes));
	return m;
}

static void cmap_close(struct cmap *m)
{
	munmap((void *)m->h, m->bytes);
}

/* Flow (type FMC_FLOW) or peer record whose name is name (peers: whose
 * name starts with it); its index in *idx. */
static bool find_rec(const struct cmap *m, enum fmc_type type,
		     const char *name, struct fmc_snap *s, uint32_t *idx)
{
	uint32_t first = type == FMC_FLOW ? fmc_first_flow(m->h) :
					    fmc_first_peer(m->h);
	uint32_t n = type == FMC_FLOW ? m->h->n_flow : m->h->n_peer;

	for (uint32_t i = first; i < first + n; i++)
		if (fmc_read(fmc_record(m->h, i), s) && s->type == type &&
		    !strncmp(s->text[FMC_NAME], name, strlen(name))) {
			if (idx)
				*idx = i;
			return true;
		}
	return false;
}

/* Wait up to ms for a flow record with value v >= want. */
static bool wait_flow_value(const struct cmap *m, const char *name,
			    unsigned v, uint64_t want, int ms,
			    struct fmc_snap *s)
{
	uint64_t until = tu_now_ns() + (uint64_t)ms * MS;

	do {
		if (find_rec(m, FMC_FLOW, name, s, NULL) && s->v[v] >= want)
			return true;
		usleep(20000);
	} while (tu_now_ns() < until);
	return false;
}

/* One sampler pass later than now (the period is 100 ms). */
static void next_pass(const struct cmap *m)
{
	uint64_t seq = atomic_load_explicit(
		&((struct fmc_header *)m->h)->sample_seq, memory_order_acquire);

	for (int i = 0; i < 200; i++) {
		usleep(10000);
		if (atomic_load_explicit(&((struct fmc_header *)m->h)->sample_seq,
					 memory_order_acquire) > seq + 1)
			return;
	}
	CHECK(!"the sampler stopped");
}

/* ---- producers and consumers in child processes --------------------------- */

/* Send n records of len (<= 2 MiB) bytes (paced at rate bytes/s if
 * rate), exit 0. */
static pid_t produce(const struct hd *d, const char *flow, uint64_t n,
		     size_t len, uint64_t rate)
{
	pid_t pid = hd_fork_client(d);

	if (pid)
		return pid;
	flowshm_t *f;
	static char buf[2 << 20];
	uint64_t t0 = tu_now_ns();

	if (flowshm_attach(flow, FLOWSHM_PRODUCER, NULL, &f)) {
		fprintf(stderr, "producer: %s\n", flowshm_attach_error());
		_exit(2);
	}
	for (uint64_t i = 0; i < n; i++) {
		if (rate) {
			uint64_t due = t0 + (uint64_t)((double)i * (double)len *
						       1e9 / (double)rate);
			uint64_t now = tu_now_ns();

			if (due > now + 1000000)
				usleep((useconds_t)((due - now) / 1000));
		}
		if (flowshm_send(f, buf, len, 30 * (int64_t)SEC)) {
			fprintf(stderr, "producer: send %llu failed\n",
				(unsigned long long)i);
			_exit(3);
		}
	}
	flowshm_detach(f);
	_exit(0);
}

/* Send 1 KiB records until the ring is full and a send has waited ms:
 * exit 0 when it timed out so. */
static pid_t fill(const struct hd *d, const char *flow, int ms)
{
	pid_t pid = hd_fork_client(d);

	if (pid)
		return pid;
	flowshm_t *f;
	char buf[1024] = { 0 };
	int rc;

	if (flowshm_attach(flow, FLOWSHM_PRODUCER, NULL, &f))
		_exit(2);
	for (int i = 0; i < 1000; i++)
		if ((rc = flowshm_send(f, buf, sizeof(buf), ms * (int64_t)MS)))
			_exit(rc == -ETIMEDOUT ? 0 : 3);
	_exit(4); /* never full */
}

/* What a consumer saw: (time, bytes so far) every 100 ms. */
struct seen {
	uint64_t n;
	uint64_t t_unix_ns[4096], bytes[4096];
	uint64_t total, records;
	bool linger;            /* stay attached after the last record ... */
	_Atomic bool release;   /* ... until this is set */
};

static uint64_t unix_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* Take n records (bytes of each: their length), noting progress in *s
 * (shared memory); exit 0 when all came. */
static pid_t consume(const struct hd *d, const char *flow, uint64_t n,
		     struct seen *s)
{
	pid_t pid = hd_fork_client(d);

	if (pid)
		return pid;
	flowshm_t *f;
	static char buf[2 << 20];
	uint64_t next = 0;
	size_t len;

	if (flowshm_attach(flow, FLOWSHM_CONSUMER, NULL, &f)) {
		fprintf(stderr, "consumer: %s\n", flowshm_attach_error());
		_exit(2);
	}
	while (s->records < n) {
		int rc = flowshm_recv(f, buf, sizeof(buf), &len, 100 * (int64_t)MS);
		uint64_t now = unix_ns();

		if (rc == 0) {
			s->records++;
			s->total += len;
		} else if (rc != -ETIMEDOUT && rc != -EAGAIN) {
			fprintf(stderr, "consumer: recv %d\n", rc);
			_exit(3);
		}
		if (now >= next && s->n < 4096) {
			s->t_unix_ns[s->n] = now;
			s->bytes[s->n] = s->total;
			s->n++;
			next = now + 100 * MS;
		}
	}
	/* linger attached if asked, waiting in recv: a subscriber publishes
	 * its position and count before it sleeps (ring format 2) */
	while (s->linger && !atomic_load(&s->release))
		if (flowshm_recv(f, buf, sizeof(buf), &len, 50 * (int64_t)MS) !=
		    -ETIMEDOUT)
			_exit(4); /* a record more than were sent */
	flowshm_detach(f);
	_exit(0);
}

static struct seen *seen_new(void)
{
	struct seen *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE,
			      MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	CHECK(s != MAP_FAILED);
	memset(s, 0, sizeof(*s));
	return s;
}

static void wait_ok(pid_t pid, int ms, const char *who)
{
	int rc = hx_wait(pid, ms);

	if (rc)
		fprintf(stderr, "%s exited %d\n", who, rc);
	CHECK(rc == 0);
}

static char out[1 << 16];

static void create_remote(const struct hd *a, const struct hd *b,
			  const char *name, const char *ring)
{
	CHECK_RC(hd_ctl(a, moverctl, out, sizeof(out),
			"flow create %s --ring-size %s --peer 127.0.0.1:%d",
			name, ring, b->port), 0);
	CHECK(hd_wait_state(a, moverctl, name, "open", 10000, NULL, 0));
}

/* ---- 1: the file and a local flow ------------------------------------------ */

static void case_file(void)
{
	struct hd d;
	struct cmap m;
	struct fmc_snap s, s2;
	struct stat st;
	char path[192];
	uint32_t idx, idx2;
	uint64_t inc;
	struct seen *seen = seen_new();
	pid_t c, p;

	hd_start(&d, moverd, "metrics1", false, NULL);
	snprintf(path, sizeof(path), "%s.counters", d.sock);
	CHECK(stat(path, &st) == 0);
	CHECK((st.st_mode & 07777) == 0640);
	m = cmap_open(&d);
	CHECK(m.h->pid == (uint32_t)d.pid);
	/* min(--max-flows, FMC_MAX_FLOW_RECS): the default 16384 is more */
	CHECK(m.h->n_flow == FMC_MAX_FLOW_RECS && m.h->n_peer == FMC_PEER_RECS);
	next_pass(&m);
	CHECK(fmc_read(fmc_record(m.h, 0), &s) && s.type == FMC_DAEMON);
	CHECK(s.v[FMC_D_CYCLES] > 0);

	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out),
			"flow create loc --ring-size 256K"), 0);
	seen->linger = true;
	c = consume(&d, "loc", 20000, seen);
	p = produce(&d, "loc", 20000, 1000, 0);
	wait_ok(p, 60000, "producer");
	for (int i = 0; i < 3000 && seen->records < 20000; i++)
		usleep(10000);
	CHECK(seen->total == 20000ull * 1000);
	/* the consumer sleeps, still attached: its slot is published */
	CHECK(wait_flow_value(&m, "loc", FMC_F_RECORDS_CONSUMED, 20000, 5000,
			      &s));
	next_pass(&m);
	CHECK(find_rec(&m, FMC_FLOW, "loc", &s, &idx));
	printf("  subscribers %#llx: slot 0 lag %llu, records %llu, pid %llu; "
	       "flow: records consumed %llu, full %llu times, %.3f s\n",
	       (unsigned long long)s.v[FMC_F_SUB_MASK],
	       (unsigned long long)s.v[FMC_F_SUB0 + FMC_SUB_LAG],
	       (unsigned long long)s.v[FMC_F_SUB0 + FMC_SUB_RECORDS],
	       (unsigned long long)s.v[FMC_F_SUB0 + FMC_SUB_PID],
	       (unsigned long long)s.v[FMC_F_RECORDS_CONSUMED],
	       (unsigned long long)s.v[FMC_F_BACKPRESSURE],
	       (double)s.v[FMC_F_FULL_NS] / 1e9);
	CHECK(__builtin_popcountll(s.v[FMC_F_SUB_MASK]) == 1);
	for (unsigned k = 0; k < FMC_SUBS; k++) {
		const uint64_t *v = &s.v[FMC_F_SUB0 + FMC_SUB_VALUES * k];

		if (!(s.v[FMC_F_SUB_MASK] & (1ull << k)))
			continue;
		CHECK(v[FMC_SUB_LAG] == 0 && v[FMC_SUB_RECORDS] == 20000);
		CHECK(v[FMC_SUB_PID] == (uint64_t)c);
	}
	CHECK(s.v[FMC_F_RECORDS_CONSUMED] == 20000);
	CHECK(s.v[FMC_F_RECORDS_COMMITTED] == 20000);
	atomic_store(&seen->release, true);
	wait_ok(c, 60000, "consumer");
	next_pass(&m);
	CHECK(find_rec(&m, FMC_FLOW, "loc", &s, &idx));
	CHECK(s.v[FMC_F_SUB_MASK] == 0);
	CHECK(s.v[FMC_F_RECORDS_CONSUMED] == 20000); /* a counter stays */
	/* 1000-byte records take 1008 + 16 bytes of the ring */
	CHECK(s.v[FMC_F_BYTES_COMMITTED] >= 20000ull * 1000);
	CHECK(s.v[FMC_F_BYTES_COMMITTED] == s.v[FMC_F_BYTES_CONSUMED]);
	CHECK(s.v[FMC_F_LAG_BYTES] == 0);
	CHECK(s.v[FMC_F_ROLE] == 0 && s.v[FMC_F_STATE] == FMC_S_OPEN);
	CHECK(s.v[FMC_F_RING_BYTES] == 256 << 10);
	CHECK(s.v[FMC_F_PRODUCERS] == 0 && s.v[FMC_F_CONSUMERS] == 0);
	inc = s.incarnation;

	/* a ring nobody reads: the producer waits for room, and it shows */
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out),
			"flow create full --ring-size 64K"), 0);
	p = fill(&d, "full", 300);
	wait_ok(p, 30000, "filling producer");
	next_pass(&m);
	CHECK(find_rec(&m, FMC_FLOW, "full", &s2, NULL));
	printf("  a full ring: %llu waits, %.3f s waiting, lag %llu\n",
	       (unsigned long long)s2.v[FMC_F_BACKPRESSURE],
	       (double)s2.v[FMC_F_FULL_NS] / 1e9,
	       (unsigned long long)s2.v[FMC_F_LAG_BYTES]);
	CHECK(s2.v[FMC_F_BACKPRESSURE] >= 1);
	CHECK(s2.v[FMC_F_FULL_NS] >= 200 * MS); /* of the 300 ms send */
	CHECK(s2.v[FMC_F_LAG_BYTES] > 60 << 10);

	/* destroyed: the record goes; a new flow gets a new incarnation */
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow destroy loc"), 0);
	next_pass(&m);
	CHECK(!fmc_read(fmc_record(m.h, idx), &s2));
	CHECK(!find_rec(&m, FMC_FLOW, "loc", &s2, NULL));
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow create loc2"), 0);
	next_pass(&m);
	CHECK(find_rec(&m, FMC_FLOW, "loc2", &s2, &idx2));
	CHECK(s2.incarnation != inc);
	CHECK(s2.v[FMC_F_BYTES_COMMITTED] == 0);

	/* a stop: the file goes, the reader's mapping says closed */
	hd_stop(&d);
	CHECK(atomic_load_explicit(&((struct fmc_header *)m.h)->closed,
				   memory_order_acquire) == 1);
	CHECK(stat(path, &st) != 0 && errno == ENOENT);
	cmap_close(&m);
}

/* ---- 2: the sequence lock ------------------------------------------------------ */

static _Atomic bool torture_stop;

static void *torture_writer(void *arg)
{
	struct fmc_record *r = arg;
	uint64_t k = 0;
	char name[32];

	while (!atomic_load_explicit(&torture_stop, memory_order_relaxed)) {
		k++;
		snprintf(name, sizeof(name), "flow-%llu", (unsigned long long)k);
		fmc_begin(r);
		for (unsigned i = 0; i < FMC_VALUES; i++)
			fmc_set(r, i, k);
		fmc_set_text(r, FMC_NAME, name);
		fmc_end(r);
	}
	return NULL;
}

static void case_seqlock(void)
{
	static _Alignas(64) unsigned char mem[FMC_REC_BYTES];
	struct fmc_record *r = (struct fmc_record *)mem;
	struct fmc_snap s;
	pthread_t t;
	uint64_t reads = 0, last = 0, now;
	uint64_t until = tu_now_ns() + 2 * SEC, cap = until + 28 * SEC;
	char want[32];

	atomic_store(&r->state, FMC_ACTIVE);
	atomic_store(&r->type, FMC_FLOW);
	CHECK(pthread_create(&t, NULL, torture_writer, r) == 0);
	/* 2 s, and on until 100 reads got through (a writer that never
	 * pauses starves seqlock readers: under TSan, in a CI run on 2 cpus,
	 * 2 s gave only 41), within 30 s (the ctest timeout is 60) */
	while ((now = tu_now_ns()) < until || (reads <= 100 && now < cap)) {
		if (!fmc_read(r, &s))
			continue;
		for (unsigned i = 1; i < FMC_VALUES; i++)
			CHECK(s.v[i] == s.v[0]);
		snprintf(want, sizeof(want), "flow-%llu",
			 (unsigned long long)s.v[0]);
		CHECK(s.v[0] == 0 || !strcmp(s.text[FMC_NAME], want));
		CHECK(s.v[0] >= last);
		last = s.v[0];
		reads++;
	}
	atomic_store(&torture_stop, true);
	pthread_join(t, NULL);
	printf("  %llu consistent reads, writer at %llu\n",
	       (unsigned long long)reads, (unsigned long long)last);
	CHECK(reads > 100);
}

/* ---- 3: between hosts -------------------------------------------------------------- */

static void case_remote(void)
{
	struct hd a, b;
	struct cmap ma, mb;
	struct fmc_snap s, r, pa, pb, dd;
	struct seen *seen = seen_new();
	uint64_t total = 0, sum = 0;
	pid_t c, p;

	hd_start(&b, moverd, "metrics3b", true, NULL);
	hd_start(&a, moverd, "metrics3a", false,
		 (const char *[]){ "--transport", "tcp", NULL });
	ma = cmap_open(&a);
	mb = cmap_open(&b);
	create_remote(&a, &b, "rem", "1M");
	c = consume(&b, "rem", 50000, seen);
	p = produce(&a, "rem", 50000, 2000, 0);
	wait_ok(p, 60000, "producer");
	wait_ok(c, 60000, "consumer");
	total = seen->total;
	CHECK(total == 50000ull * 2000);
	CHECK(wait_flow_value(&ma, "rem", FMC_F_BYTES_ACKED,
			      50000ull * (2000 + 16), 5000, &s));
	next_pass(&ma);
	next_pass(&mb);
	CHECK(find_rec(&ma, FMC_FLOW, "rem", &s, NULL));
	CHECK(find_rec(&mb, FMC_FLOW, "rem", &r, NULL));
	printf("  sender: committed %llu sent %llu acked %llu batches %llu; "
	       "receiver: received %llu consumed %llu\n",
	       (unsigned long long)s.v[FMC_F_BYTES_COMMITTED],
	       (unsigned long long)s.v[FMC_F_BYTES_SENT],
	       (unsigned long long)s.v[FMC_F_BYTES_ACKED],
	       (unsigned long long)s.v[FMC_F_BATCHES],
	       (unsigned long long)r.v[FMC_F_BYTES_DEPOSITED],
	       (unsigned long long)r.v[FMC_F_BYTES_CONSUMED]);
	CHECK(s.v[FMC_F_ROLE] == 1 && r.v[FMC_F_ROLE] == 2);
	/* 2000-byte records: 2016 bytes of ring each, and a pad of less
	 * than a record at the end of each lap of the 1 MiB ring */
	CHECK(s.v[FMC_F_BYTES_COMMITTED] >= 50000ull * 2016);
	CHECK(s.v[FMC_F_BYTES_COMMITTED] <= 50000ull * 2016 +
	      (50000ull * 2016 / (1 << 20) + 1) * 2016);
	CHECK(s.v[FMC_F_BYTES_SENT] == s.v[FMC_F_BYTES_COMMITTED]);
	CHECK(s.v[FMC_F_BYTES_ACKED] == s.v[FMC_F_BYTES_COMMITTED]);
	CHECK(r.v[FMC_F_BYTES_DEPOSITED] == s.v[FMC_F_BYTES_COMMITTED]);
	CHECK(r.v[FMC_F_BYTES_CONSUMED] == s.v[FMC_F_BYTES_COMMITTED]);
	CHECK(r.v[FMC_F_LAG_BYTES] == 0 && s.v[FMC_F_LAG_BYTES] == 0);
	CHECK(s.v[FMC_F_BATCHES] > 0 &&
	      s.v[FMC_F_BATCHES] <= s.v[FMC_F_BYTES_SENT] / 2016);
	CHECK(!strcmp(s.text[FMC_WHERE], "") ||
	      strstr(s.text[FMC_WHERE], "127.0.0.1"));

	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	CHECK(find_rec(&mb, FMC_PEER, "127.0.0.1", &pb, NULL));
	CHECK(pa.v[FMC_P_STATE] == 2 && pa.v[FMC_P_TRANSPORT] == 0);
	CHECK(pa.v[FMC_P_BYTES_TX] >= 50000ull * 2016);
	CHECK(pb.v[FMC_P_BYTES_RX] >= 50000ull * 2016);
	CHECK(pa.v[FMC_P_FRAMES_TX] > 0 && pa.v[FMC_P_FRAMES_RX] > 0);
	CHECK(pb.v[FMC_P_FRAMES_RX] >= pa.v[FMC_P_FRAMES_TX] - 64);
	CHECK(pa.v[FMC_P_SENDS] > 0);
	CHECK(pa.v[FMC_P_RTT_COUNT] > 0);
	for (unsigned i = 0; i < FMC_RTT_BUCKETS; i++)
		sum += pa.v[FMC_P_RTT_BUCKET0 + i];
	CHECK(sum == pa.v[FMC_P_RTT_COUNT]);
	CHECK(pa.v[FMC_P_RTT_MAX_NS] > 0 &&
	      pa.v[FMC_P_RTT_SUM_NS] <= pa.v[FMC_P_RTT_MAX_NS] * sum);
	printf("  %llu acknowledgements timed: p50 <= %llu us, p99 <= %llu us,"
	       " max %llu us\n", (unsigned long long)sum,
	       (unsigned long long)fmc_rtt_quantile(&pa.v[FMC_P_RTT_BUCKET0],
						    NULL, 0.5) / 1000,
	       (unsigned long long)fmc_rtt_quantile(&pa.v[FMC_P_RTT_BUCKET0],
						    NULL, 0.99) / 1000,
	       (unsigned long long)pa.v[FMC_P_RTT_MAX_NS] / 1000);
	CHECK(fmc_read(fmc_record(ma.h, 0), &dd));
	CHECK(dd.v[FMC_D_CYCLES] > 0 && dd.v[FMC_D_WORK_CYCLES] > 0 &&
	      dd.v[FMC_D_FLOWS] == 1 && dd.v[FMC_D_PEERS] == 1 &&
	      dd.v[FMC_D_FDS] > 3);

	/* the same through moverctl top */
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "top --once --json"), 0);
	CHECK(strstr(out, "\"name\":\"rem\""));
	CHECK(strstr(out, "\"role_name\":\"sender\""));
	/* every value has its name (the last daemon ones too) */
	CHECK(strstr(out, "\"ring_to_free\":") && !strstr(out, "(null)"));
	CHECK_RC(hd_ctl(&b, moverctl, out, sizeof(out), "top --once"), 0);
	CHECK(strstr(out, "rem") && strstr(out, "recv"));
	hd_stop(&a);
	hd_stop(&b);
	cmap_close(&ma);
	cmap_close(&mb);
}

/* ---- 4: a silent peer, a lost one ---------------------------------------------------- */

static void case_peer_lost(void)
{
	struct hd a, b;
	struct cmap ma;
	struct fmc_snap pa, s;
	const char *const extra[] = { "--transport", "tcp", NULL };

	hd_start(&b, moverd, "metrics4b", true, NULL);
	hd_start(&a, moverd, "metrics4a", false, extra);
	ma = cmap_open(&a);
	create_remote(&a, &b, "lost", "256K");
	next_pass(&ma);
	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	CHECK(pa.v[FMC_P_HEARTBEATS_MISSED] == 0);

	/* 2.5 s of silence: periods missed, within the 5 s dead timeout
	 * (B's last heartbeat may be 1 s old when it stops, and it needs a
	 * moment to run again: 1.5 s to spare) */
	kill(b.pid, SIGSTOP);
	usleep(2500000);
	kill(b.pid, SIGCONT);
	next_pass(&ma);
	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	printf("  heartbeats missed: %llu, reconnects %llu\n",
	       (unsigned long long)pa.v[FMC_P_HEARTBEATS_MISSED],
	       (unsigned long long)pa.v[FMC_P_RECONNECTS]);
	CHECK(pa.v[FMC_P_HEARTBEATS_MISSED] >= 1 &&
	      pa.v[FMC_P_HEARTBEATS_MISSED] <= 3);
	CHECK(pa.v[FMC_P_RECONNECTS] == 0);

	/* the receiver killed and restarted: the link is lost, the flow
	 * resumes */
	hd_kill(&b);
	CHECK(hd_wait_state(&a, moverctl, "lost", "reconnecting", 10000, NULL,
			    0));
	hd_wait_port_free(b.port);
	hd_restart(&b, moverd, NULL);
	CHECK(hd_wait_state(&a, moverctl, "lost", "open", 20000, NULL, 0));
	next_pass(&ma);
	CHECK(find_rec(&ma, FMC_FLOW, "lost", &s, NULL));
	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	printf("  flow: reconnects %llu resumes %llu; peer reconnects %llu; "
	       "last error '%s'\n",
	       (unsigned long long)s.v[FMC_F_RECONNECTS],
	       (unsigned long long)s.v[FMC_F_RESUMES],
	       (unsigned long long)pa.v[FMC_P_RECONNECTS], s.text[FMC_ERROR]);
	CHECK(s.v[FMC_F_RECONNECTS] >= 1 && s.v[FMC_F_RESUMES] >= 1);
	CHECK(pa.v[FMC_P_RECONNECTS] >= 1);
	CHECK(s.v[FMC_F_STATE] == FMC_S_OPEN);
	CHECK(s.text[FMC_ERROR][0] && s.v[FMC_F_ERROR_NS] > 0);
	hd_stop(&a);
	hd_stop(&b);
	cmap_close(&ma);
}

/* ---- 5: moverctl top in tmux ---------------------------------------------------------- */

static int sh(char *buf, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Run a shell command; its stdout in buf (if buf); its exit status. */
static int sh(char *buf, size_t cap, const char *fmt, ...)
{
	char cmd[1024];
	va_list ap;
	FILE *f;
	size_t n = 0;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	fflush(NULL);
	f = popen(cmd, "r");
	CHECK(f != NULL);
	if (buf) {
		n = fread(buf, 1, cap - 1, f);
		buf[n] = 0;
	} else {
		while (fgetc(f) != EOF)
			;
	}
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The line of the screen that starts with prefix, or NULL. */
static const char *screen_line(const char *screen, const char *prefix,
			       char *line, size_t cap)
{
	for (const char *p = screen; p && *p; ) {
		const char *e = strchr(p, '\n');
		size_t n = e ? (size_t)(e - p) : strlen(p);

		if (!strncmp(p, prefix, strlen(prefix))) {
			snprintf(line, cap, "%.*s", (int)n, p);
			return line;
		}
		p = e ? e + 1 : NULL;
	}
	return NULL;
}

/* The tmux session's screen, once it shows `want` (ms at most: top
 * redraws after a key, and exits after q, in its own time). */
static void screen_with(const char *sess, char *screen, size_t cap,
			const char *want, int ms)
{
	for (int i = 0; i < ms / 100; i++) {
		sh(screen, cap, "tmux -L %s capture-pane -p -t %s", sess, sess);
		if (strstr(screen, want))
			return;
		usleep(100000);
	}
}

/* 5: top stopped by a signal (SIGTERM, the handler ^C runs too) gives
 * the terminal back: line mode and echo on, exit 0. */
static void top_interrupted(const char *first, const char *moverctl,
			    const char *sock)
{
	char screen[8192], sess[80];

	/* a server of its own: the first one may still be going away */
	snprintf(sess, sizeof(sess), "%s-sig", first);

	CHECK(sh(NULL, 0, "tmux -L %s new-session -d -s %s -x 80 -y 24 "
		 "'%s --socket %s top; echo TOP-EXITED $?; "
		 "stty -a | grep -q -- -icanon && echo RAW || echo LINE-MODE; "
		 "stty -a | grep -qE -- \"(^| )-echo( |$)\" && echo NO-ECHO || "
		 "echo ECHO-ON; sleep 30'", sess, sess, moverctl, sock) == 0);
	screen_with(sess, screen, sizeof(screen), "sort: rate", 5000);
	CHECK(strstr(screen, "sort: rate"));
	/* top is the child of the pane's shell */
	CHECK(sh(NULL, 0, "pkill -TERM -x -P \"$(tmux -L %s list-panes -t %s "
		 "-F '#{pane_pid}')\" moverctl", sess, sess) == 0);
	screen_with(sess, screen, sizeof(screen), "ECHO", 5000);
	printf("--- after SIGTERM to moverctl top ---\n%s------\n", screen);
	CHECK(strstr(screen, "TOP-EXITED 0"));
	CHECK(strstr(screen, "LINE-MODE") && strstr(screen, "ECHO-ON"));
	sh(NULL, 0, "tmux -L %s kill-server", sess);
}

static void case_tmux(void)
{
	struct hd d;
	struct seen *seen = seen_new();
	char screen[8192], line[256], sess[64], in[16] = "", outr[16] = "";
	char recs[16] = "";
	pid_t c, p;
	bool moving = false;

	if (sh(NULL, 0, "command -v tmux >/dev/null") != 0) {
		fprintf(stderr, "tmux is not installed "
			"(contrib/install-deps.sh installs it)\n");
		CHECK(!"tmux");
	}
	hd_start(&d, moverd, "metrics5", false, NULL);
	snprintf(sess, sizeof(sess), "fmtop%d", (int)getpid());
	/* by name the idle flow comes first, by rate the busy one */
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out),
			"flow create zbusy --ring-size 1M"), 0);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out),
			"flow create aidle --ring-size 64K"), 0);
	/* 16 MB/s for ~10 s */
	c = consume(&d, "zbusy", 160000, seen);
	p = produce(&d, "zbusy", 160000, 1000, 16000000);
	CHECK(sh(NULL, 0, "tmux -L %s new-session -d -s %s -x 80 -y 24 "
		 "'%s --socket %s top; echo TOP-EXITED $?; sleep 30'",
		 sess, sess, moverctl, d.sock) == 0);
	for (int i = 0; i < 40 && !moving; i++) {
		usleep(250000);
		sh(screen, sizeof(screen), "tmux -L %s capture-pane -p -t %s",
		   sess, sess);
		if (screen_line(screen, "zbusy ", line, sizeof(line)) &&
		    sscanf(line, "zbusy %*s %*s %15s %15s %15s", recs, in,
			   outr) == 3)
			moving = strcmp(recs, "0") && strcmp(in, "0B") &&
				 strcmp(outr, "0B");
	}
	printf("--- moverctl top in tmux (80x24) ---\n%s------\n", screen);
	CHECK(moving);
	CHECK(strstr(screen, "sort: rate"));
	CHECK(strstr(screen, "zbusy ") < strstr(screen, "aidle "));
	sh(NULL, 0, "tmux -L %s send-keys -t %s n", sess, sess);
	screen_with(sess, screen, sizeof(screen), "sort: name", 5000);
	CHECK(strstr(screen, "sort: name"));
	CHECK(strstr(screen, "aidle ") < strstr(screen, "zbusy "));
	sh(NULL, 0, "tmux -L %s send-keys -t %s l", sess, sess);
	screen_with(sess, screen, sizeof(screen), "sort: lag", 5000);
	CHECK(strstr(screen, "sort: lag"));
	CHECK(strstr(screen, "aidle ") && strstr(screen, "zbusy "));
	sh(NULL, 0, "tmux -L %s send-keys -t %s q", sess, sess);
	screen_with(sess, screen, sizeof(screen), "TOP-EXITED 0", 5000);
	CHECK(strstr(screen, "TOP-EXITED 0"));
	sh(NULL, 0, "tmux -L %s kill-server", sess);
	top_interrupted(sess, moverctl, d.sock);
	wait_ok(p, 60000, "producer");
	wait_ok(c, 60000, "consumer");
	hd_stop(&d);
}

/* ---- 6: a real Prometheus ------------------------------------------------------------ */

/* A real Prometheus with config cfg, its data in data and its output in
 * log, serving its API at 127.0.0.1:port; dies with us. */
static pid_t start_prometheus(const char *cfg, const char *data,
			      const char *log, int port)
{
	pid_t prom;

	if (sh(NULL, 0, "command -v prometheus >/dev/null && "
	       "command -v curl >/dev/null") != 0) {
		fprintf(stderr, "prometheus or curl is not installed "
			"(contrib/install-deps.sh installs them)\n");
		CHECK(!"prometheus");
	}
	fflush(NULL);
	prom = fork();
	CHECK(prom >= 0);
	if (prom == 0) {
		char web[64], cf[300], st[300];
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		snprintf(web, sizeof(web), "--web.listen-address=127.0.0.1:%d",
			 port);
		snprintf(cf, sizeof(cf), "--config.file=%s", cfg);
		snprintf(st, sizeof(st), "--storage.tsdb.path=%s", data);
		execlp("prometheus", "prometheus", cf, st, web, (char *)NULL);
		_exit(127);
	}
	return prom;
}

/* Ask Prometheus at port: the first sample's value of query at time t. */
static bool prom_query(int port, const char *query, double t, double *v)
{
	char buf[8192], *p;

	sh(buf, sizeof(buf), "curl -s -G 'http://127.0.0.1:%d/api/v1/query' "
	   "--data-urlencode 'query=%s' --data-urlencode 'time=%.3f'", port,
	   query, t);
	/* {"status":"success","data":{"resultType":"vector","result":
	 *  [{"metric":{...},"value":[T,"V"]}]}} */
	p = strstr(buf, "\"value\":[");
	if (!p || !(p = strchr(p, ',')) || p[1] != '"')
		return false;
	*v = strtod(p + 2, NULL);
	return true;
}

static void case_prometheus(void)
{
	struct hd a, b;
	struct seen *seen = seen_new();
	char ma[64], mb[64], cfg[256], data[256], log[256], cmd[2048];
	int pa = hd_free_port(), pb = hd_free_port(), pp = hd_free_port(), i;
	double t0, t1, v = 0, measured;
	uint64_t b0 = 0, b1 = 0;
	pid_t prom, c, p;
	FILE *f;

	snprintf(ma, sizeof(ma), "127.0.0.1:%d", pa);
	snprintf(mb, sizeof(mb), "127.0.0.1:%d", pb);
	hd_start(&b, moverd, "metrics6b", true,
		 (const char *[]){ "--metrics", mb, NULL });
	hd_start(&a, moverd, "metrics6a", false,
		 (const char *[]){ "--transport", "tcp", "--metrics", ma, NULL });
	snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", b.dir);
	snprintf(data, sizeof(data), "%s/prometheus-data", b.dir);
	snprintf(log, sizeof(log), "%s/prometheus.log", b.dir);
	f = fopen(cfg, "w");
	CHECK(f != NULL);
	fprintf(f, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
		"scrape_configs:\n  - job_name: moverd\n    static_configs:\n"
		"      - targets: ['%s', '%s']\n", ma, mb);
	fclose(f);
	prom = start_prometheus(cfg, data, log, pp);
	/* both targets up */
	for (i = 0; i < 150; i++) {
		if (prom_query(pp, "sum(up{job=\"moverd\"})", (double)unix_ns() / 1e9,
			       &v) && v == 2)
			break;
		usleep(200000);
	}
	if (v != 2) {
		snprintf(cmd, sizeof(cmd), "tail -20 %s", log);
		(void)!system(cmd);
	}
	CHECK(v == 2);

	/* 12 s at 12 MB/s (4 KiB records) */
	create_remote(&a, &b, "prom", "4M");
	c = consume(&b, "prom", 12 * 12000000 / 4096, seen);
	p = produce(&a, "prom", 12 * 12000000 / 4096, 4096, 12000000);
	wait_ok(p, 60000, "producer");
	wait_ok(c, 60000, "consumer");
	/* the consumer's own figure over 6 s in the middle of the transfer */
	t0 = (double)seen->t_unix_ns[0] / 1e9 + 3;
	t1 = t0 + 6;
	for (uint64_t k = 0; k < seen->n; k++) {
		double t = (double)seen->t_unix_ns[k] / 1e9;

		if (t <= t0)
			b0 = seen->bytes[k];
		if (t <= t1)
			b1 = seen->bytes[k];
	}
	measured = (double)(b1 - b0) / 6;
	usleep(2500000); /* the last scrapes */
	CHECK(prom_query(pp, "rate(flowmover_flow_bytes_received_total"
			 "{flow=\"prom\"}[6s])", t1, &v));
	printf("  consumer measured %.0f B/s over [%.1f, %.1f]; "
	       "Prometheus rate(flowmover_flow_bytes_received_total[6s]) "
	       "%.0f B/s (%.1f%%)\n", measured, t0, t1, v,
	       100.0 * (v - measured) / measured);
	/* the ring carries a 16-byte header per 4096-byte record */
	CHECK(v > measured * 0.9 && v < measured * 1.1 * 4112 / 4096);
	CHECK(prom_query(pp, "rate(flowmover_flow_bytes_sent_total"
			 "{flow=\"prom\"}[6s])", t1, &v));
	printf("  sender: rate(flowmover_flow_bytes_sent_total[6s]) %.0f B/s\n",
	       v);
	CHECK(v > measured * 0.9 && v < measured * 1.1 * 4112 / 4096);
	/* the sender's acknowledgement times (the receiver times none) */
	snprintf(cmd, sizeof(cmd), "histogram_quantile(0.99, sum by (le) "
		 "(rate(flowmover_peer_ack_rtt_seconds_bucket{instance=\"%s\"}"
		 "[6s])))", ma);
	CHECK(prom_query(pp, cmd, t1, &v));
	printf("  p99 acknowledgement time %.6f s\n", v);
	CHECK(v > 0 && v < 5);
	kill(prom, SIGTERM);
	CHECK(hx_wait(prom, 20000) >= 0);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 7: who may read ----------------------------------------------------------------- */

static void case_access(void)
{
	struct hd d;
	char path[192], moved[200];
	pid_t pid;
	int rc;

	hd_start(&d, moverd, "metrics7", false, NULL);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow create acc"), 0);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out),
			"flow create theirs --allow-uid 65534"), 0);
	/* nobody: not moverd's user or group */
	snprintf(path, sizeof(path), "%s.counters", d.sock);
	pid = hx_spawn(&d, 65534, (const char *[]){ "/bin/cat", path, NULL });
	rc = hx_wait(pid, 10000);
	CHECK(rc == 1);
	CHECK(hd_ctl_as(&d, moverctl, 65534, out, sizeof(out),
			"top --once") == 0);
	printf("%s", out);
	CHECK(strstr(out, "your flows, from the control socket"));
	CHECK(strstr(out, "\ntheirs ") && !strstr(out, "\nacc "));
	/* without the file: top and flow show answer from the socket */
	snprintf(moved, sizeof(moved), "%s.moved", path);
	CHECK(rename(path, moved) == 0);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow show acc"), 0);
	CHECK(strstr(out, "acc") && strstr(out, "from the control socket"));
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "top --once"), 0);
	CHECK(strstr(out, "no counters file") && strstr(out, "\nacc "));
	CHECK(rename(moved, path) == 0);
	hd_stop(&d);
	/* no moverd at all */
	CHECK(hd_ctl(&d, moverctl, out, sizeof(out), "top --once") == 3);
}

/* ---- 8: flow show and status ---------------------------------------------------- */

static void case_show(void)
{
	struct hd a, b;
	struct seen *seen = seen_new();
	char other[sizeof(out)], src[64];
	uint64_t batches;
	pid_t c, p;

	hd_start(&b, moverd, "metrics8b", true, NULL);
	hd_start(&a, moverd, "metrics8a", false,
		 (const char *[]){ "--transport", "tcp", NULL });
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out),
			"flow create shown --ring-size 256K --allow-uid 65534 "
			"--peer 127.0.0.1:%d", b.port), 0);
	CHECK(hd_wait_state(&a, moverctl, "shown", "open", 10000, NULL, 0));
	c = consume(&b, "shown", 5000, seen);
	p = produce(&a, "shown", 5000, 3000, 0);
	wait_ok(p, 60000, "producer");
	wait_ok(c, 60000, "consumer");
	/* the last acknowledgement, and a sampler pass after it: until the
	 * counters file shows the flow settled (10 s at most).  The file,
	 * not the socket's answer: moverctl falls back to the socket while
	 * the sampler has not written the flow yet, and the flow can settle
	 * before its first pass */
	for (int i = 0; i < 100; i++) {
		CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out),
				"flow show shown --json"), 0);
		if (hj_get(out, "source", src, sizeof(src)) &&
		    !strcmp(src, "counters file") &&
		    hj_u64(out, "lag_bytes") == 0 &&
		    hj_u64(out, "bytes_consumed") >= 5000ull * 3016)
			break;
		usleep(100000);
	}
	CHECK(hj_get(out, "source", src, sizeof(src)));
	CHECK(!strcmp(src, "counters file"));
	batches = hj_u64(out, "batches");
	CHECK(batches > 0);
	CHECK(hj_u64(out, "lag_bytes") == 0);
	CHECK(hj_u64(out, "bytes_consumed") >= 5000ull * 3016);
	/* nobody may see the flow (allowed) but not read the file */
	CHECK(hd_ctl_as(&a, moverctl, 65534, other, sizeof(other),
			"flow show shown --json") == 0);
	CHECK(hj_get(other, "source", src, sizeof(src)));
	CHECK(!strcmp(src, "control socket"));
	CHECK(hj_u64(other, "batches") == batches);
	CHECK(hj_u64(other, "bytes_consumed") == hj_u64(out, "bytes_consumed"));
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "flow show shown"), 0);
	CHECK(strstr(out, "batches:") && strstr(out, "from the counters file"));

	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "status --json"), 0);
	CHECK(hj_u64(out, "work_cycles") > 0);
	/* the sender's mover slept and something woke it, and it saw why */
	CHECK(hj_u64(out, "sleeps") > 0);
	CHECK(hj_u64(out, "wakes_doorbell") + hj_u64(out, "wakes_network") > 0);
	CHECK(hj_u64(out, "wakes_doorbell") + hj_u64(out, "wakes_network") +
	      hj_u64(out, "wakes_timer") <= hj_u64(out, "cycles"));
	CHECK(hj_u64(out, "frames_sent") > 0);
	CHECK(hj_u64(out, "ack_rtt_count") > 0);
	CHECK(strstr(out, "\"ack_rtt_p99_ns\""));
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "status"), 0);
	printf("%s", out);
	CHECK(strstr(out, "woken by:") && strstr(out, "ACKS TIMED"));
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 9: the text -------------------------------------------------------------- */

static void case_text(void)
{
	size_t bytes = fmc_file_bytes(2, 2), len;
	struct fmc_header *h = calloc(1, bytes);
	struct fmc_record *r;
	char *text, path[128], cmd[300];
	FILE *f;

	CHECK(h != NULL);
	*h = (struct fmc_header){ .magic = FMC_MAGIC, .version = FMC_VERSION,
		.hdr_bytes = FMC_HDR_BYTES, .rec_bytes = FMC_REC_BYTES,
		.n_flow = 2, .n_peer = 2, .pid = 1, .values = FMC_VALUES,
		.start_unix_ns = 1700000000ull * SEC };
	CHECK(fmc_valid(h, bytes));
	r = fmc_record(h, fmc_first_flow(h));
	fmc_begin(r);
	atomic_store(&r->state, FMC_ACTIVE);
	atomic_store(&r->type, FMC_FLOW);
	fmc_set_text(r, FMC_NAME, "we\"ird\\na\nme");
	fmc_set_text(r, FMC_WHERE, "[fe80::1]:7400");
	fmc_set(r, FMC_F_ROLE, 1);
	fmc_set(r, FMC_F_BYTES_SENT, 12345);
	fmc_set(r, FMC_F_FULL_NS, 1500000000);
	fmc_set(r, FMC_F_SUB_MASK, 1u << 3);
	fmc_set(r, FMC_F_SUB0 + 3 * FMC_SUB_VALUES + FMC_SUB_LAG, 777);
	fmc_set(r, FMC_F_SUB0 + 3 * FMC_SUB_VALUES + FMC_SUB_PID, 4242);
	fmc_end(r);
	r = fmc_record(h, fmc_first_peer(h));
	fmc_begin(r);
	atomic_store(&r->state, FMC_ACTIVE);
	atomic_store(&r->type, FMC_PEER);
	fmc_set_text(r, FMC_NAME, "[fe80::1]:7400");
	fmc_set(r, FMC_P_STATE, 2);
	fmc_set(r, FMC_P_RTT_COUNT, 3);
	fmc_set(r, FMC_P_RTT_SUM_NS, 3000000);
	fmc_set(r, FMC_P_RTT_BUCKET0 + fmc_rtt_bucket(900000), 3);
	fmc_end(r);

	text = metrics_render(h, false, &len);
	CHECK(text && len == strlen(text));
	CHECK(strstr(text, "flowmover_flow_bytes_sent_total{flow=\"we\\\"ird"
		      "\\\\na\\nme\",role=\"sender\",peer=\"[fe80::1]:7400\"}"
		      " 12345\n"));
	CHECK(strstr(text, "# TYPE flowmover_flow_bytes_sent_total counter\n"));
	CHECK(strstr(text, "flowmover_flow_full_seconds_total{flow=\"we"));
	CHECK(strstr(text, " 1.500000000\n"));
	CHECK(strstr(text, "flowmover_flow_subscriber_lag_bytes{flow=\"we\\\""
		      "ird\\\\na\\nme\",slot=\"3\",pid=\"4242\",cut=\"0\"}"
		      " 777\n"));
	/* 900 us falls below the 1.024 ms boundary, and in every one after */
	CHECK(strstr(text, "flowmover_peer_ack_rtt_seconds_bucket{peer=\"[fe80"
		      "::1]:7400\",transport=\"tcp\",le=\"0.000512\"} 0\n"));
	CHECK(strstr(text, "le=\"0.001024\"} 3\n"));
	CHECK(strstr(text, "le=\"+Inf\"} 3\n"));
	CHECK(strstr(text, "flowmover_peer_ack_rtt_seconds_count{peer=\"[fe80"
		      "::1]:7400\",transport=\"tcp\"} 3\n"));
	snprintf(path, sizeof(path), "/tmp/fm-metrics9-%d.txt", (int)getpid());
	f = fopen(path, "w");
	CHECK(f && fwrite(text, 1, len, f) == len);
	fclose(f);
	free(text);
	if (sh(NULL, 0, "command -v promtool >/dev/null") == 0) {
		snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
		CHECK(sh(NULL, 0, "%s", cmd) == 0);
	}
	unlink(path);
	text = metrics_render(h, true, &len);
	CHECK(text && len > 6 && !strcmp(text + len - 6, "# EOF\n"));
	CHECK(strstr(text, "# TYPE flowmover_flow_bytes_sent counter\n"));
	CHECK(strstr(text, "\nflowmover_flow_bytes_sent_total{"));
	free(text);
	free(h);
}

/* ---- 10: record counters between hosts ------------------------------------------ */

#define REC_N    30000u
#define REC_RING (256u << 10)

/* Record i's length: 1 .. 3001 bytes, every alignment. */
static size_t rec_len(uint64_t i)
{
	return 1 + (size_t)(i * 7919 % 3001);
}

/* Send REC_N records of rec_len(i) bytes: the first half one by one, the
 * rest in batches of up to 7 (a claim of several records); exit 0. */
static pid_t produce_sizes(const struct hd *d, const char *flow)
{
	pid_t pid = hd_fork_client(d);

	if (pid)
		return pid;
	static char buf[4096];
	struct iovec iov[7];
	flowshm_t *f;
	uint64_t i = 0;

	if (flowshm_attach(flow, FLOWSHM_PRODUCER, NULL, &f)) {
		fprintf(stderr, "producer: %s\n", flowshm_attach_error());
		_exit(2);
	}
	for (; i < REC_N / 2; i++)
		if (flowshm_send(f, buf, rec_len(i), 30 * (int64_t)SEC))
			_exit(3);
	while (i < REC_N) {
		unsigned n = 0, sent = 0;

		for (; n < 7 && i + n < REC_N; n++)
			iov[n] = (struct iovec){ buf, rec_len(i + n) };
		if (flowshm_send_batch(f, iov, n, &sent, 30 * (int64_t)SEC) ||
		    !sent)
			_exit(4);
		i += sent;
	}
	flowshm_detach(f);
	_exit(0);
}

/* The value of the first sample of `name` whose labels hold `label`. */
static uint64_t metric_value(const char *text, const char *name,
			     const char *label)
{
	char want[160];
	const char *p = text;

	snprintf(want, sizeof(want), "\n%s{", name);
	while ((p = strstr(p, want))) {
		const char *end = strchr(p + 1, '\n');

		p += strlen(want);
		if (end && strstr(p, label) && strstr(p, label) < end)
			return strtoull(strstr(p, "} ") + 2, NULL, 10);
	}
	return UINT64_MAX;
}

/* A JSON number "key":N in text after `after` (UINT64_MAX: none). */
static uint64_t json_value(const char *text, const char *after,
			   const char *key)
{
	char want[96];
	const char *p = strstr(text, after);

	snprintf(want, sizeof(want), "\"%s\":", key);
	p = p ? strstr(p, want) : NULL;
	return p ? strtoull(p + strlen(want), NULL, 10) : UINT64_MAX;
}

static void case_records(void)
{
	struct hd a, b;
	struct cmap ma, mb;
	struct fmc_snap s, r;
	struct seen *seen = seen_new();
	uint64_t payload = 0, ring_pos = 0;
	size_t len;
	char *text;
	pid_t c, p;

	/* where REC_N records from position 0 end, pads included: a record
	 * that does not fit the rest of a lap starts the next one */
	for (uint64_t i = 0; i < REC_N; i++) {
		uint64_t bytes = fr_record_bytes(rec_len(i));
		uint64_t rest = REC_RING - ring_pos % REC_RING;

		if (bytes > rest)
			ring_pos += rest;
		ring_pos += bytes;
		payload += rec_len(i);
	}
	hd_start(&b, moverd, "metrics10b", true, NULL);
	hd_start(&a, moverd, "metrics10a", false,
		 (const char *[]){ "--transport", "tcp", NULL });
	ma = cmap_open(&a);
	mb = cmap_open(&b);
	create_remote(&a, &b, "recs", "256K");
	seen->linger = true;
	c = consume(&b, "recs", REC_N, seen);
	p = produce_sizes(&a, "recs");
	wait_ok(p, 60000, "producer");
	CHECK(wait_flow_value(&ma, "recs", FMC_F_BYTES_ACKED, ring_pos, 10000,
			      &s));
	for (int i = 0; i < 3000 && seen->records < REC_N; i++)
		usleep(10000);
	CHECK(seen->records == REC_N && seen->total == payload);
	/* the consumer sleeps: its slot is published */
	CHECK(wait_flow_value(&mb, "recs", FMC_F_RECORDS_CONSUMED, REC_N, 5000,
			      &r));
	next_pass(&ma);
	next_pass(&mb);
	CHECK(find_rec(&ma, FMC_FLOW, "recs", &s, NULL));
	CHECK(find_rec(&mb, FMC_FLOW, "recs", &r, NULL));
	printf("  %u records, %llu payload bytes, %llu ring bytes\n"
	       "  sender: records committed %llu sent %llu, bytes committed "
	       "%llu sent %llu, %llu batches (mean %llu records)\n"
	       "  receiver: records deposited %llu committed %llu consumed "
	       "%llu, bytes deposited %llu\n", REC_N,
	       (unsigned long long)payload, (unsigned long long)ring_pos,
	       (unsigned long long)s.v[FMC_F_RECORDS_COMMITTED],
	       (unsigned long long)s.v[FMC_F_RECORDS_SENT],
	       (unsigned long long)s.v[FMC_F_BYTES_COMMITTED],
	       (unsigned long long)s.v[FMC_F_BYTES_SENT],
	       (unsigned long long)s.v[FMC_F_BATCHES],
	       (unsigned long long)(s.v[FMC_F_BATCHES] ?
			s.v[FMC_F_RECORDS_SENT] / s.v[FMC_F_BATCHES] : 0),
	       (unsigned long long)r.v[FMC_F_RECORDS_DEPOSITED],
	       (unsigned long long)r.v[FMC_F_RECORDS_COMMITTED],
	       (unsigned long long)r.v[FMC_F_RECORDS_CONSUMED],
	       (unsigned long long)r.v[FMC_F_BYTES_DEPOSITED]);
	/* the sender's side */
	CHECK(s.v[FMC_F_RECORDS_COMMITTED] == REC_N);
	CHECK(s.v[FMC_F_RECORDS_SENT] == REC_N);
	CHECK(s.v[FMC_F_RECORDS_DEPOSITED] == 0);
	CHECK(s.v[FMC_F_BYTES_COMMITTED] == ring_pos);
	CHECK(s.v[FMC_F_BYTES_SENT] == ring_pos);
	CHECK(s.v[FMC_F_BATCHES] > 0 && s.v[FMC_F_BATCHES] <= REC_N);
	/* the receiver's */
	CHECK(r.v[FMC_F_RECORDS_DEPOSITED] == REC_N);
	CHECK(r.v[FMC_F_RECORDS_COMMITTED] == REC_N);
	CHECK(r.v[FMC_F_RECORDS_CONSUMED] == REC_N);
	CHECK(r.v[FMC_F_RECORDS_SENT] == 0);
	CHECK(r.v[FMC_F_BYTES_DEPOSITED] == ring_pos);

	/* the same in every view: flow show --json (the file, as root) */
	CHECK(hd_flow_json(&a, moverctl, "recs", out, sizeof(out)));
	CHECK(json_value(out, "\"counters\"", "records_committed") == REC_N);
	CHECK(json_value(out, "\"counters\"", "records_sent") == REC_N);
	CHECK(json_value(out, "\"counters\"", "mean_batch_records") ==
	      REC_N / s.v[FMC_F_BATCHES]);
	CHECK(hd_flow_json(&b, moverctl, "recs", out, sizeof(out)));
	CHECK(json_value(out, "\"counters\"", "records_deposited") == REC_N);
	CHECK(json_value(out, "\"counters\"", "records_consumed") == REC_N);
	/* top --once --json */
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "top --once --json"), 0);
	CHECK(json_value(out, "\"name\":\"recs\"", "records_sent") == REC_N);
	CHECK_RC(hd_ctl(&b, moverctl, out, sizeof(out), "top --once --json"), 0);
	CHECK(json_value(out, "\"name\":\"recs\"", "records_deposited") ==
	      REC_N);
	/* /metrics' text, rendered from each daemon's file */
	text = metrics_render(ma.h, false, &len);
	CHECK(text);
	CHECK(strstr(text, "# HELP flowmover_flow_records_sent_total "));
	CHECK(strstr(text, "# TYPE flowmover_flow_records_sent_total counter"));
	CHECK(metric_value(text, "flowmover_flow_records_sent_total",
			   "flow=\"recs\"") == REC_N);
	CHECK(metric_value(text, "flowmover_flow_records_committed_total",
			   "flow=\"recs\"") == REC_N);
	free(text);
	text = metrics_render(mb.h, false, &len);
	CHECK(text);
	CHECK(metric_value(text, "flowmover_flow_records_deposited_total",
			   "flow=\"recs\"") == REC_N);
	CHECK(metric_value(text, "flowmover_flow_records_consumed_total",
			   "flow=\"recs\"") == REC_N);
	free(text);
	atomic_store(&seen->release, true);
	wait_ok(c, 60000, "consumer");
	hd_stop(&a);
	hd_stop(&b);
	cmap_close(&ma);
	cmap_close(&mb);
}

/* ---- 11: a consumer that leaves right after its last record ------------------- */

/* Attach, wait ms (the sampler sees the slot), take n records without
 * sleeping, detach at once; exit 0. */
static pid_t consume_late(const struct hd *d, const char *flow, uint64_t n,
			  int ms)
{
	pid_t pid = hd_fork_client(d);

	if (pid)
		return pid;
	static char buf[65536];
	flowshm_t *f;
	size_t len;

	if (flowshm_attach(flow, FLOWSHM_CONSUMER, NULL, &f))
		_exit(2);
	usleep((useconds_t)ms * 1000);
	for (uint64_t i = 0; i < n; i++)
		if (flowshm_recv(f, buf, sizeof(buf), &len, SEC))
			_exit(3);
	flowshm_detach(f);
	_exit(0);
}

/* Flow NAME: 500 records, then a consumer that attaches, waits delay_ms,
 * reads them all and leaves; the flow's counters record after that. */
static void leave_after(const struct hd *d, const struct cmap *m,
			const char *name, unsigned delay_ms, struct fmc_snap *s)
{
	pid_t p, c;

	CHECK_RC(hd_ctl(d, moverctl, out, sizeof(out),
			"flow create %s --ring-size 1M", name), 0);
	/* the records wait in the ring (kept: no subscriber yet) */
	p = produce(d, name, 500, 1000, 0);
	wait_ok(p, 30000, "producer");
	c = consume_late(d, name, 500, delay_ms);
	wait_ok(c, 30000, "consumer");
	next_pass(m);
	next_pass(m);
	CHECK(find_rec(m, FMC_FLOW, name, s, NULL));
}

static void case_leaver(void)
{
	struct hd d;
	struct cmap m;
	struct fmc_snap s;

	hd_start(&d, moverd, "metrics11", false, NULL);
	m = cmap_open(&d);
	leave_after(&d, &m, "leave", 400, &s);
	printf("  records committed %llu, consumed %llu, subscribers %#llx\n",
	       (unsigned long long)s.v[FMC_F_RECORDS_COMMITTED],
	       (unsigned long long)s.v[FMC_F_RECORDS_CONSUMED],
	       (unsigned long long)s.v[FMC_F_SUB_MASK]);
	CHECK(s.v[FMC_F_SUB_MASK] == 0);
	CHECK(s.v[FMC_F_RECORDS_COMMITTED] == 500);
	CHECK(s.v[FMC_F_RECORDS_CONSUMED] == 500);
	/* a consumer that attaches, reads and leaves at once, most likely
	 * between two passes: never seen holding its slot, still counted
	 * (the rdma_moverd_vm counters once read 0 of 20000) */
	leave_after(&d, &m, "leave2", 0, &s);
	printf("  unseen consumer: records consumed %llu\n",
	       (unsigned long long)s.v[FMC_F_RECORDS_CONSUMED]);
	CHECK(s.v[FMC_F_RECORDS_CONSUMED] == 500);
	hd_stop(&d);
	cmap_close(&m);
}

/* ---- 12: credit of a consumer that stops short of a quarter ring -------------- */

/* flow NAME's bytes_consumed on d (flow show --json). */
static uint64_t consumed_on(const struct hd *d, const char *name)
{
	CHECK(hd_flow_json(d, moverctl, name, out, sizeof(out)));
	return hj_u64(out, "bytes_consumed");
}

static void case_quiet_credit(void)
{
	struct hd a, b;
	struct seen *s = seen_new();
	uint64_t on_a = 0, on_b = 0;
	pid_t p, c;

	hd_start(&b, moverd, "metrics12b", true, NULL);
	hd_start(&a, moverd, "metrics12a", false, NULL);
	create_remote(&a, &b, "part", "64K");
	CHECK(hd_wait_state(&b, moverctl, "part", "open", 10000, NULL, 0));
	/* 40 KiB wait in B's ring; its consumer takes 8 KiB (less than the
	 * quarter ring a receiver credits back at once) and stays */
	p = produce(&a, "part", 40, 1000, 0);
	wait_ok(p, 30000, "producer");
	s->linger = true;
	c = consume(&b, "part", 8, s);
	for (int i = 0; i < 300; i++) {
		on_b = consumed_on(&b, "part");
		on_a = consumed_on(&a, "part");
		if (on_b && on_a == on_b)
			break;
		usleep(10000);
	}
	printf("  consumed on B %llu bytes, A's view of it %llu\n",
	       (unsigned long long)on_b, (unsigned long long)on_a);
	CHECK(s->records == 8 && on_b > 0);
	/* the sender's window must not stay short of what B freed */
	CHECK(on_a == on_b);
	/* it would take the 32 records left: stop it here */
	kill(c, SIGKILL);
	CHECK(waitpid(c, NULL, 0) == c);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- 13: a flow no client holds ---------------------------------------------- */

/*
 * Until a client attaches, only moverd writes a flow's ring: the checks of
 * what clients write skip it, and a counters pass writes its record only
 * when moverd did something (counters.c, flows_to_write; record_current).
 * Its record must still follow what moverd does to it: the records it
 * deposits, the state it gives it when the sender goes.  Then a consumer
 * attaches and takes them.
 */
static void case_unheld(void)
{
	struct hd a, b;
	struct cmap mb;
	struct fmc_snap s;
	struct seen *seen = seen_new();
	uint64_t deposited;
	pid_t p, c;
	int i;

	hd_start(&b, moverd, "metrics13b", true, NULL);
	hd_start(&a, moverd, "metrics13a", false, NULL);
	mb = cmap_open(&b);
	create_remote(&a, &b, "unheld", "1M");
	CHECK(hd_wait_state(&b, moverctl, "unheld", "open", 10000, NULL, 0));
	p = produce(&a, "unheld", 300, 100, 0);
	wait_ok(p, 30000, "producer");
	CHECK(wait_flow_value(&mb, "unheld", FMC_F_RECORDS_DEPOSITED, 300,
			      5000, &s));
	deposited = s.v[FMC_F_BYTES_DEPOSITED];
	printf("  nobody attached: %llu records, %llu bytes deposited, lag "
	       "%llu, state %llu\n",
	       (unsigned long long)s.v[FMC_F_RECORDS_DEPOSITED],
	       (unsigned long long)deposited,
	       (unsigned long long)s.v[FMC_F_LAG_BYTES],
	       (unsigned long long)s.v[FMC_F_STATE]);
	CHECK(s.v[FMC_F_RECORDS_DEPOSITED] == 300);
	CHECK(deposited >= 300 * 100 && s.v[FMC_F_LAG_BYTES] == deposited);
	CHECK(s.v[FMC_F_STATE] == FMC_S_OPEN && s.v[FMC_F_CONSUMERS] == 0);
	/* the sender goes: a state moverd gives it, no frame */
	hd_stop(&a);
	for (i = 0; i < 250; i++) {
		CHECK(find_rec(&mb, FMC_FLOW, "unheld", &s, NULL));
		if (s.v[FMC_F_STATE] == FMC_S_RECONNECTING)
			break;
		usleep(20000);
	}
	printf("  its record says reconnecting after %.2f s\n", i * 0.02);
	CHECK(s.v[FMC_F_STATE] == FMC_S_RECONNECTING);
	c = consume(&b, "unheld", 300, seen);
	wait_ok(c, 30000, "consumer");
	CHECK(seen->records == 300);
	CHECK(wait_flow_value(&mb, "unheld", FMC_F_BYTES_CONSUMED, deposited,
			      5000, &s));
	CHECK(s.v[FMC_F_LAG_BYTES] == 0);
	hd_stop(&b);
	cmap_close(&mb);
}

/* ---- 14: the connection window ------------------------------------------------ */

/*
 * A peer that stops reading for 300 ms (SIGSTOP) while a flow sends
 * 1 MiB records: the acknowledgements of what was in flight come 300 ms
 * late, and the connection window (moverd/mover.c) is cut to its floor,
 * 256 KiB, smaller than one record.  Stopped again right after, the peer
 * has at most the window and one record unacknowledged.  A record larger
 * than the window still goes, alone: every record arrives; the cuts are
 * counted; nothing stays unacknowledged once the consumer has everything.
 */
/*
 * Cases 14-16: daemons A (TCP, with `extra` options) -> B, A's counters
 * mapped, and flow "win" open between them (16 MiB ring, 1 MiB records).
 */
static void window_pair(struct hd *a, struct hd *b, struct cmap *ma,
			const char *tag, const char *const *extra)
{
	char name[32];

	snprintf(name, sizeof(name), "metrics%sb", tag);
	hd_start(b, moverd, name, true, NULL);
	snprintf(name, sizeof(name), "metrics%sa", tag);
	hd_start(a, moverd, name, false, extra);
	*ma = cmap_open(a);
	CHECK_RC(hd_ctl(a, moverctl, out, sizeof(out), "flow create win "
			"--ring-size 16M --max-record 1M --peer 127.0.0.1:%d",
			b->port), 0);
	CHECK(hd_wait_state(a, moverctl, "win", "open", 10000, NULL, 0));
	CHECK(hd_wait_state(b, moverctl, "win", "open", 10000, NULL, 0));
}

/*
 * top's peer row shows the link and the window: "127.0.0.1:PORT tcp ..."
 * with WIN, the ninth column, the window in bytes (K/M, as top prints it).
 */
static void check_top_window(const char *screen, uint64_t window)
{
	char line[256], link[16], win[16], unit = 'B';
	double v = 0;

	printf("%s", screen);
	CHECK(strstr(screen, " LINK ") && strstr(screen, " WIN "));
	CHECK(screen_line(screen, "127.0.0.1:", line, sizeof(line)));
	CHECK(sscanf(line, "%*s %15s %*s %*s %*s %*s %*s %*s %15s", link,
		     win) == 2);
	CHECK(!strcmp(link, "tcp"));
	CHECK(sscanf(win, "%lf%c", &v, &unit) == 2);
	v *= unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0;
	printf("  top shows a window of %s, the counters %llu bytes\n", win,
	       (unsigned long long)window);
	CHECK(v > 0.9 * (double)window && v < 1.1 * (double)window);
}

static void case_window(void)
{
	struct hd a, b;
	struct cmap ma;
	struct fmc_snap pa;
	struct seen *s = seen_new();
	const char *const extra[] = { "--transport", "tcp", NULL };
	const uint64_t n = 2000, len = 1 << 20;
	char path[192], moved[200];
	uint64_t stopped_at;
	pid_t p, c;
	int i;

	window_pair(&a, &b, &ma, "14", extra);
	next_pass(&ma);
	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	printf("  window at the start %llu bytes, cuts %llu\n",
	       (unsigned long long)pa.v[FMC_P_WINDOW],
	       (unsigned long long)pa.v[FMC_P_WINDOW_CUTS]);
	CHECK(pa.v[FMC_P_WINDOW] >= 16u << 20 && pa.v[FMC_P_WINDOW_CUTS] == 0);

	c = consume(&b, "win", n, s);
	p = produce(&a, "win", n, len, 0);
	for (i = 0; i < 3000 && s->records < 10; i++)
		usleep(1000);
	CHECK(s->records >= 10 && s->records < n);
	CHECK(kill(b.pid, SIGSTOP) == 0);
	usleep(300000);
	CHECK(kill(b.pid, SIGCONT) == 0);
	/* stopped again soon after: the cut window holds what A sends while
	 * no acknowledgement comes (one record more at most: the one that
	 * went alone), where the socket buffers alone would take megabytes */
	usleep(20000);
	CHECK(kill(b.pid, SIGSTOP) == 0);
	next_pass(&ma);
	next_pass(&ma);
	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	stopped_at = s->records;
	CHECK(kill(b.pid, SIGCONT) == 0);
	printf("  stopped again at record %llu: window %llu bytes, %llu "
	       "unacknowledged\n", (unsigned long long)stopped_at,
	       (unsigned long long)pa.v[FMC_P_WINDOW],
	       (unsigned long long)pa.v[FMC_P_UNACKED]);
	CHECK(stopped_at < n);
	CHECK(pa.v[FMC_P_WINDOW] < 16u << 20);
	CHECK(pa.v[FMC_P_UNACKED] <= pa.v[FMC_P_WINDOW] + len + FR_REC_HDR);
	wait_ok(p, 120000, "producer");
	wait_ok(c, 120000, "consumer");
	CHECK(s->records == n && s->total == n * len);
	for (i = 0; i < 100; i++) {
		next_pass(&ma);
		CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
		if (pa.v[FMC_P_UNACKED] == 0)
			break;
	}
	printf("  after a 300 ms stop: %llu window cuts, window %llu bytes, "
	       "%llu unacknowledged; %llu records of 1 MiB delivered\n",
	       (unsigned long long)pa.v[FMC_P_WINDOW_CUTS],
	       (unsigned long long)pa.v[FMC_P_WINDOW],
	       (unsigned long long)pa.v[FMC_P_UNACKED],
	       (unsigned long long)s->records);
	CHECK(pa.v[FMC_P_WINDOW_CUTS] >= 1);
	CHECK(pa.v[FMC_P_UNACKED] == 0);
	/* what an operator reads: moverctl top --json */
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "top --once --json"), 0);
	CHECK(strstr(out, "\"peers\":["));
	CHECK(hj_u64(strstr(out, "\"peers\":["), "window_cuts") >= 1);
	CHECK(hj_u64(strstr(out, "\"peers\":["), "window") >= 256u << 10);
	/* ... and moverctl status */
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "status --json"), 0);
	CHECK(hj_u64(out, "window_cuts") == pa.v[FMC_P_WINDOW_CUTS]);
	CHECK(hj_u64(out, "window_bytes") >= 256u << 10);
	CHECK(strstr(out, "\"unacked_bytes\"") &&
	      hj_u64(out, "unacked_bytes") == 0);
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "status"), 0);
	CHECK(strstr(out, "WINDOW (CUTS)"));
	/* ... and top's screen (a plain frame, as in its full-screen view) */
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "top --once"), 0);
	check_top_window(out, pa.v[FMC_P_WINDOW]);
	/* ... and the same from the control socket, without the file */
	snprintf(path, sizeof(path), "%s.counters", a.sock);
	snprintf(moved, sizeof(moved), "%s.moved", path);
	CHECK(rename(path, moved) == 0);
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "top --once"), 0);
	CHECK(strstr(out, "no counters file"));
	check_top_window(out, pa.v[FMC_P_WINDOW]);
	CHECK(rename(moved, path) == 0);
	hd_stop(&a);
	hd_stop(&b);
	cmap_close(&ma);
}

/*
 * The delay target is the operator's (moverd --window-delay-us): with 5 s,
 * a peer stopped 300 ms delays no acknowledgement past it, so the window
 * that case 14 sees cut stays whole.  An impossible target is refused.
 */
static void case_window_delay(void)
{
	struct hd a, b;
	struct cmap ma;
	struct fmc_snap pa;
	struct seen *s = seen_new();
	const char *const extra[] = { "--transport", "tcp",
				      "--window-delay-us", "5000000", NULL };
	const uint64_t n = 600, len = 1 << 20;
	pid_t p, c;
	int i;

	CHECK(sh(out, sizeof(out), "%s --foreground --socket /nonexistent/s "
		 "--window-delay-us 5 2>&1", moverd) == 2);
	CHECK(strstr(out, "bad value '5' for --window-delay-us"));
	window_pair(&a, &b, &ma, "15", extra);
	CHECK_RC(hd_ctl(&a, moverctl, out, sizeof(out), "status --json"), 0);
	CHECK(hj_u64(out, "window_delay_us") == 5000000);
	CHECK_RC(hd_ctl(&b, moverctl, out, sizeof(out), "status"), 0);
	CHECK(strstr(out, "window delay:  1000 us above"));
	c = consume(&b, "win", n, s);
	p = produce(&a, "win", n, len, 0);
	for (i = 0; i < 3000 && s->records < 10; i++)
		usleep(1000);
	CHECK(s->records >= 10 && s->records < n);
	CHECK(kill(b.pid, SIGSTOP) == 0);
	usleep(300000);
	CHECK(kill(b.pid, SIGCONT) == 0);
	wait_ok(p, 120000, "producer");
	wait_ok(c, 120000, "consumer");
	CHECK(s->records == n && s->total == n * len);
	next_pass(&ma);
	CHECK(find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL));
	printf("  a 5 s target, B stopped 300 ms: %llu window cuts, window "
	       "%llu bytes\n", (unsigned long long)pa.v[FMC_P_WINDOW_CUTS],
	       (unsigned long long)pa.v[FMC_P_WINDOW]);
	CHECK(pa.v[FMC_P_WINDOW_CUTS] == 0);
	CHECK(pa.v[FMC_P_WINDOW] == 64u << 20);
	hd_stop(&a);
	hd_stop(&b);
	cmap_close(&ma);
}

/*
 * Records larger than the window still go (alone, first): a 10 us target
 * keeps the window near its 256 KiB floor while 1 MiB records flow; every
 * record arrives, and the window was seen below a record's size.
 */
static void case_window_floor(void)
{
	struct hd a, b;
	struct cmap ma;
	struct fmc_snap pa;
	struct seen *s = seen_new();
	const char *const extra[] = { "--transport", "tcp",
				      "--window-delay-us", "10", NULL };
	const uint64_t n = 1500, len = 1 << 20;
	uint64_t least = UINT64_MAX;
	pid_t p, c;

	window_pair(&a, &b, &ma, "16", extra);
	c = consume(&b, "win", n, s);
	p = produce(&a, "win", n, len, 0);
	/* the window while they flow, as the sampler publishes it; B is
	 * stopped now and then so that acknowledgements come late however
	 * fast this host is */
	for (int i = 0; i < 600 && s->records < n; i++) {
		if (i % 10 == 5) {
			CHECK(kill(b.pid, SIGSTOP) == 0);
			usleep(30000);
			CHECK(kill(b.pid, SIGCONT) == 0);
		}
		next_pass(&ma);
		if (find_rec(&ma, FMC_PEER, "127.0.0.1", &pa, NULL) &&
		    pa.v[FMC_P_WINDOW] < least)
			least = pa.v[FMC_P_WINDOW];
	}
	wait_ok(p, 120000, "producer");
	wait_ok(c, 120000, "consumer");
	printf("  a 10 us target: the least window seen %llu bytes; %llu "
	       "records of 1 MiB delivered\n", (unsigned long long)least,
	       (unsigned long long)s->records);
	CHECK(s->records == n && s->total == n * len);
	CHECK(least < len);
	hd_stop(&a);
	hd_stop(&b);
	cmap_close(&ma);
}

/* ---- 17-19: moverctl's own output ---------------------------------------------- */

/* A moverd's words a terminal would take as escape sequences: ESC (C0),
 * CSI raw (0x9b, not UTF-8) and CSI as UTF-8 (U+009B). */
#define EVIL "\x1b[2J\x9b" "5m\xc2\x9b" "7m"

/* No control byte of EVIL made it into s. */
static bool no_escapes(const char *s)
{
	return !strchr(s, '\x1b') && !strchr(s, '\x9b') && !strchr(s, '\x07');
}

enum fake { FAKE_EVIL, FAKE_STUCK, FAKE_DENY };

static Flowmover__FlowInfo *fake_flow(const char *name, const char *peer)
{
	static Flowmover__FlowInfo f;

	flowmover__flow_info__init(&f);
	f.name = (char *)name;
	f.peer = (char *)peer;
	f.state = "open";
	f.role = "sender";
	f.transport = "tcp";
	f.ring_size = 65536;
	f.max_record = 1024;
	return &f;
}

/* The answer of a moverd that lies (fake) to req. */
static void fake_answer(int c, enum fake fake, const Flowmover__Request *req)
{
	Flowmover__Response r = FLOWMOVER__RESPONSE__INIT;
	Flowmover__Error e = FLOWMOVER__ERROR__INIT;
	Flowmover__StatusInfo st = FLOWMOVER__STATUS_INFO__INIT;
	Flowmover__PeerInfo pi = FLOWMOVER__PEER_INFO__INIT, *pis[1] = { &pi };
	Flowmover__FlowList l = FLOWMOVER__FLOW_LIST__INIT;
	Flowmover__ReloadResult rl = FLOWMOVER__RELOAD_RESULT__INIT;
	Flowmover__FlowInfo *fl[1];
	Flowmover__Ok ok = FLOWMOVER__OK__INIT;
	char *tr[2] = { "tcp" EVIL, "rdma" }, *lines[1] = { "added f" EVIL };

	r.id = req->id;
	switch (req->body_case) {
	case FLOWMOVER__REQUEST__BODY_STATUS:
		if (fake == FAKE_DENY) {
			e.code = -EACCES;
			e.message = "denied by the test" EVIL;
			r.body_case = FLOWMOVER__RESPONSE__BODY_ERROR;
			r.error = &e;
			break;
		}
		st.version = "9" EVIL;
		st.pid = 1;
		st.transports = tr;
		st.n_transports = 2;
		pi.address = "10.0.0.9:7400" EVIL;
		pi.state = "up";
		pi.transport = "tcp";
		pi.node = "node" EVIL;
		pi.last_error = "lost" EVIL;
		pi.last_error_unix_ms = 1700000000000ull;
		st.peers = pis;
		st.n_peers = 1;
		r.body_case = FLOWMOVER__RESPONSE__BODY_STATUS;
		r.status = &st;
		break;
	case FLOWMOVER__REQUEST__BODY_LIST:
		/* stuck: the same page, "more" after it, whatever `after` */
		fl[0] = fake_flow("a", "");
		l.flows = fl;
		l.n_flows = 1;
		l.more = fake == FAKE_STUCK;
		r.body_case = FLOWMOVER__RESPONSE__BODY_LIST;
		r.list = &l;
		break;
	case FLOWMOVER__REQUEST__BODY_CREATE:
		r.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
		r.flow = fake_flow(req->create->spec->name, "p:1" EVIL);
		break;
	case FLOWMOVER__REQUEST__BODY_RELOAD:
		rl.lines = lines;
		rl.n_lines = 1;
		r.body_case = FLOWMOVER__RESPONSE__BODY_RELOAD;
		r.reload = &rl;
		break;
	case FLOWMOVER__REQUEST__BODY_DESCRIBE:
		r.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
		r.flow = fake_flow(req->describe->name, "");
		break;
	case FLOWMOVER__REQUEST__BODY_DESTROY:
		if (fake == FAKE_STUCK) {
			r.body_case = FLOWMOVER__RESPONSE__BODY_OK;
			r.ok = &ok;
			break;
		}
		__attribute__((fallthrough)); /* refused */
	default:
		e.code = -EINVAL;
		e.message = "no" EVIL;
		r.body_case = FLOWMOVER__RESPONSE__BODY_ERROR;
		r.error = &e;
	}
	ctl_send_msg(c, &r.base, -1);
}

/* A process that answers on sock as fake says, one client at a time. */
static pid_t fake_start(const char *sock, enum fake fake)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int l = socket(AF_UNIX, SOCK_STREAM, 0);
	pid_t pid;

	CHECK(l >= 0 && strlen(sock) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, sock);
	unlink(sock);
	CHECK(bind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(l, 16) == 0);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid) {
		close(l);
		return pid;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed CHECK leaves none */
	for (;;) {
		static uint8_t buf[CTL_FRAME_BUF];
		int c = accept(l, NULL, NULL);
		Flowmover__Request *req;
		size_t len;

		while (c >= 0 &&
		       !ctl_recv_frame(c, buf, sizeof(buf), &len, NULL, -1) &&
		       !ctl_request_decode(buf, len, &req, NULL, 0)) {
			fake_answer(c, fake, req);
			ctl_request_free(req);
		}
		if (c >= 0)
			close(c);
	}
}

static void fake_stop(pid_t pid, const char *sock)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	unlink(sock);
}

/* Run a shell command; stdout and stderr apart (either may be NULL);
 * its exit status. */
static int sh2(char *o, size_t ocap, char *e, size_t ecap, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int sh2(char *o, size_t ocap, char *e, size_t ecap, const char *fmt, ...)
{
	char cmd[1024], ef[64];
	va_list ap;
	int rc;
	FILE *f;

	snprintf(ef, sizeof(ef), "/tmp/fm-sh2-%d.err", (int)getpid());
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	rc = sh(o, ocap, "timeout -k 2 30 sh -c '%s' 2>%s", cmd, ef);
	if (e) {
		size_t n = 0;

		f = fopen(ef, "r");
		if (f) {
			n = fread(e, 1, ecap - 1, f);
			fclose(f);
		}
		e[n] = 0;
	}
	unlink(ef);
	return rc;
}

/* Is s one valid JSON document?  (python3: contrib/install-deps.sh) */
static bool json_valid(const char *s)
{
	char path[64];
	FILE *f;
	int rc;

	snprintf(path, sizeof(path), "/tmp/fm-json-%d", (int)getpid());
	f = fopen(path, "w");
	CHECK(f && fputs(s, f) >= 0);
	fclose(f);
	rc = sh(NULL, 0, "python3 -c 'import json,sys; json.load(open(sys.argv[1]))'"
		" %s 2>&1", path);
	unlink(path);
	return rc == 0;
}

/* 17: a moverd that lies: escape sequences in every text, a list that
 * does not move forward, a status refused. */
static void case_lying_moverd(void)
{
	char sock[64], o[16384], e[4096];
	pid_t fake;

	snprintf(sock, sizeof(sock), "/tmp/fm-fake17-%d.sock", (int)getpid());
	fake = fake_start(sock, FAKE_EVIL);
	/* status: version, transports, peer address, node, last error */
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s status",
		     moverctl, sock), 0);
	printf("--- status of a lying moverd ---\n%s", o);
	CHECK(strstr(o, "lost") && strstr(o, "rdma"));
	CHECK(no_escapes(o) && no_escapes(e));
	CHECK(!strstr(o, "\xc2\x9b"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s --json status",
		     moverctl, sock), 0);
	CHECK(no_escapes(o) && !strstr(o, "\xc2\x9b"));
	CHECK(strstr(o, "lost\\u001b[2J\\ufffd5m\\u009b7m"));
	CHECK(json_valid(o));
	/* reload's lines, create's peer, an error on stderr */
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s reload",
		     moverctl, sock), 0);
	CHECK(strstr(o, "added f") && no_escapes(o) && !strstr(o, "\xc2\x9b"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s flow create "
		     "q", moverctl, sock), 0);
	CHECK(strstr(o, "peer p:1") && no_escapes(o) && !strstr(o, "\xc2\x9b"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s flow destroy "
		     "q", moverctl, sock), 1);
	CHECK(strstr(e, "moverctl: no") && no_escapes(e) &&
	      !strstr(e, "\xc2\x9b"));
	/* top from the control socket (no counters file): the same */
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once",
		     moverctl, sock), 0);
	CHECK(strstr(o, "10.0.0.9:7400") && no_escapes(o) &&
	      !strstr(o, "\xc2\x9b"));
	fake_stop(fake, sock);
	printf("  texts with ESC, raw and UTF-8 CSI: '?' on the terminal, "
	       "escaped in JSON\n");

	/* more=true on a page that does not move past `after` */
	fake = fake_start(sock, FAKE_STUCK);
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s flow list",
		     moverctl, sock), 1);
	CHECK(strstr(e, "does not move forward"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s flow destroy "
		     "--all", moverctl, sock), 1);
	CHECK(strstr(e, "does not move forward"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once",
		     moverctl, sock), 1);
	CHECK(strstr(e, "does not move forward"));
	fake_stop(fake, sock);
	printf("  a flow list that does not move forward: an error, not a "
	       "loop\n");

	/* top's first frame refused: why, and exit 4 as for any command */
	fake = fake_start(sock, FAKE_DENY);
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once",
		     moverctl, sock), 4);
	CHECK(strstr(e, "denied by the test") && no_escapes(e));
	fake_stop(fake, sock);
	printf("  top's first frame refused: said, exit 4\n");
}

#define NOBODY 65534u

/* 18: destroy --all past flows the caller may not destroy, one JSON
 * document; options with the wrong command; output that cannot be
 * written; the largest --timeout. */
static void case_cli(void)
{
	char o[16384], e[4096];
	struct hd d;

	hd_start(&d, moverd, "metrics18", false, NULL);
	/* nothing to destroy: still one document */
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s --json flow "
		     "destroy --all", moverctl, d.sock), 0);
	CHECK(json_valid(o) && strstr(o, "\"destroyed\": []"));
	/* root's a0, which nobody may attach to (so see) but not destroy,
	 * comes first; nobody's own z1 and z2 after it */
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow create a0 "
			"--allow-uid %u", NOBODY), 0);
	CHECK_RC(hd_ctl_as(&d, moverctl, NOBODY, out, sizeof(out),
			   "flow create z1"), 0);
	CHECK_RC(hd_ctl_as(&d, moverctl, NOBODY, out, sizeof(out),
			   "flow create z2"), 0);
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "setpriv --reuid %u --regid "
		     "%u --clear-groups %s --socket %s --json flow destroy "
		     "--all", NOBODY, NOBODY, moverctl, d.sock), 4);
	printf("--- destroy --all as nobody ---\n%s%s", o, e);
	CHECK(json_valid(o));
	CHECK(strstr(o, "\"skipped\": [\n    \"a0\"\n  ]"));
	CHECK(strstr(o, "\"z1\"") && strstr(o, "\"z2\""));
	CHECK(strstr(e, "'a0' skipped"));
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow list"), 0);
	CHECK(strstr(out, "a0") && !strstr(out, "z1") && !strstr(out, "z2"));
	/* the same in text: what was destroyed on stdout, the rest on
	 * stderr, exit 4 */
	CHECK_RC(hd_ctl_as(&d, moverctl, NOBODY, out, sizeof(out),
			   "flow create z3"), 0);
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "setpriv --reuid %u --regid "
		     "%u --clear-groups %s --socket %s flow destroy --all",
		     NOBODY, NOBODY, moverctl, d.sock), 4);
	CHECK(strstr(o, "destroyed flow 'z3'") && strstr(e, "'a0' skipped"));
	printf("  destroy --all: past a flow it may not destroy, exit 4, one "
	       "JSON document\n");

	/* options that do not go with the command */
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow create q "
			"--drain"), 2);
	CHECK(strstr(out, "--drain and --all go with 'flow destroy'"));
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow list --all"), 2);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "status --drain"), 2);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow list"), 0);
	CHECK(!strstr(out, " q "));
	printf("  --drain, --all with another command: usage, exit 2\n");

	/* output that cannot be written */
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s flow list "
		     ">/dev/full", moverctl, d.sock), 1);
	CHECK(strstr(e, "cannot write the output"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s --json "
		     "status >/dev/full", moverctl, d.sock), 1);
	printf("  stdout on a full device: exit 1, said\n");

	/* the largest --timeout: the wait's own bound computed without
	 * overflow (a sanitizer build reports one) */
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s --timeout "
		     "2147483647 flow wait a0", moverctl, d.sock), 0);
	CHECK(strstr(o, "exists") && !strstr(e, "runtime error"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s --timeout "
		     "2147483647 flow destroy --drain a0", moverctl, d.sock), 0);
	CHECK(!strstr(e, "runtime error"));
	hd_stop(&d);
}

/* Active record i of h: type, name and where. */
static struct fmc_record *put_rec(struct fmc_header *h, uint32_t i,
				  enum fmc_type type, const char *name,
				  const char *where)
{
	struct fmc_record *r = fmc_record(h, i);

	fmc_begin(r);
	atomic_store(&r->state, FMC_ACTIVE);
	atomic_store(&r->type, type);
	atomic_store(&r->incarnation, i + 1);
	fmc_set_text(r, FMC_NAME, name);
	fmc_set_text(r, FMC_WHERE, where);
	fmc_end(r);
	return r;
}

/* A counters file of 30 flows and 2 peers at sock.counters, made here,
 * as a live moverd (this process) would have it; mapped writable. */
static struct fmc_header *fake_counters(const char *sock, size_t *bytes)
{
	char path[128], name[16];
	struct fmc_header *h;
	struct timespec ts;
	int fd;

	*bytes = fmc_file_bytes(30, 2);
	snprintf(path, sizeof(path), "%s.counters", sock);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0 && ftruncate(fd, (off_t)*bytes) == 0);
	h = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	CHECK(h != MAP_FAILED);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	*h = (struct fmc_header){ .magic = FMC_MAGIC, .version = FMC_VERSION,
		.hdr_bytes = FMC_HDR_BYTES, .rec_bytes = FMC_REC_BYTES,
		.n_flow = 30, .n_peer = 2, .pid = (uint32_t)getpid(),
		.values = FMC_VALUES, .start_unix_ns = 1700000000ull * SEC };
	atomic_store(&h->sample_mono_ns,
		     (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec);
	atomic_store(&h->flows_unrecorded, 7);
	atomic_store(&h->peers_unrecorded, 2);
	put_rec(h, 0, FMC_DAEMON, "moverd", "9.9");
	put_rec(h, 1, FMC_FLOW, "evil" EVIL, "p" EVIL);
	for (uint32_t i = 1; i < 30; i++) {
		snprintf(name, sizeof(name), "f%02u", i);
		put_rec(h, 1 + i, FMC_FLOW, name, "");
	}
	put_rec(h, 31, FMC_PEER, "10.0.0.9:7400" EVIL, "node" EVIL);
	CHECK(fmc_valid(h, *bytes));
	return h;
}

/* 19: top on a counters file made here: flows and peers it has no record
 * for, rows that do not fit, names with escapes, a header rewritten
 * under top; then on a killed moverd. */
static void case_top_file(void)
{
	char sock[64], o[65536], e[4096], sess[64], screen[8192], cmd[512];
	char line1[65536], line2[65536];
	struct fmc_header *h;
	struct hd d;
	size_t bytes;
	unsigned pid;
	FILE *p;

	snprintf(sock, sizeof(sock), "/tmp/fm-top19-%d.sock", (int)getpid());
	h = fake_counters(sock, &bytes);
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once",
		     moverctl, sock), 0);
	printf("--- top --once on the file made here ---\n%s", o);
	CHECK(strstr(o, "(7 flows not in the counters file: see moverctl "
		     "flow list)"));
	CHECK(strstr(o, "(2 peers not in the counters file"));
	CHECK(strstr(o, "evil?[2J?5m? ") && strstr(o, "p?[2J?5m?7m"));
	CHECK(strstr(o, "f29"));
	CHECK(no_escapes(o) && !strstr(o, "\xc2\x9b"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once "
		     "--json", moverctl, sock), 0);
	CHECK(json_valid(o));
	CHECK(strstr(o, "\"flows_unrecorded\":7,\"peers_unrecorded\":2"));
	CHECK(strstr(o, "\"daemon_gone\":false"));
	CHECK(strstr(o, "\"name\":\"evil\\u001b[2J\\ufffd5m\\u009b7m\""));
	CHECK(no_escapes(o) && !strstr(o, "\xc2\x9b"));
	printf("  flows and peers without a record counted; escapes '?' on "
	       "the terminal, escaped in JSON\n");

	/* 80x24: the flows that do not fit are counted on a line */
	snprintf(sess, sizeof(sess), "fmtop19%d", (int)getpid());
	CHECK(sh(NULL, 0, "tmux -L %s new-session -d -s %s -x 80 -y 24 "
		 "'%s --socket %s top; sleep 30'", sess, sess, moverctl,
		 sock) == 0);
	screen_with(sess, screen, sizeof(screen), " more)", 10000);
	printf("--- moverctl top in tmux (80x24) ---\n%s------\n", screen);
	CHECK(strstr(screen, " more)") && strstr(screen, "(7 flows not in"));
	CHECK(strstr(screen, "PEER "));
	sh(NULL, 0, "tmux -L %s kill-server", sess);
	printf("  rows that do not fit: (+N more)\n");

	/* the header rewritten once top checked it: top keeps the shape
	 * it checked (it read past its mapping before) */
	snprintf(cmd, sizeof(cmd), "echo $$; exec %s --socket %s top --json",
		 moverctl, sock);
	p = popen(cmd, "r");
	CHECK(p && fscanf(p, "%u\n", &pid) == 1);
	CHECK(fgets(line1, sizeof(line1), p) && json_valid(line1));
	h->n_flow = FMC_MAX_FLOW_RECS;
	h->n_peer = FMC_PEER_RECS;
	h->hdr_bytes = 1u << 30;
	CHECK(fgets(line2, sizeof(line2), p) && json_valid(line2));
	CHECK(strstr(line2, "\"name\":\"f29\""));
	kill((pid_t)pid, SIGTERM);
	pclose(p);
	printf("  header rewritten under top: the shape it checked kept\n");
	munmap(h, bytes);
	snprintf(cmd, sizeof(cmd), "%s.counters", sock);
	unlink(cmd);

	/* a killed moverd leaves its file: top --once says so, exit 3 */
	hd_start(&d, moverd, "metrics19", false, NULL);
	CHECK_RC(hd_ctl(&d, moverctl, out, sizeof(out), "flow create k"), 0);
	hd_kill(&d);
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once",
		     moverctl, d.sock), 3);
	CHECK(strstr(o, "is gone: its last figures"));
	CHECK_RC(sh2(o, sizeof(o), e, sizeof(e), "%s --socket %s top --once "
		     "--json", moverctl, d.sock), 3);
	CHECK(json_valid(o) && strstr(o, "\"daemon_gone\":true") &&
	      strstr(o, "\"sample_age_ms\":"));
	hd_cleanup(&d);
	printf("  a killed moverd: top --once exits 3, daemon_gone in JSON\n");
}

/* ---- 20: the endpoint ------------------------------------------------------- */

struct http_answer {
	int status;
	char head[2048];
	char *body;             /* malloc'd, NUL-terminated */
	size_t len;
};

/* One request on a connection of its own (HTTP/1.0: read to the end),
 * with extra header lines (each ending in \\r\\n; "" none). */
static struct http_answer http_ask_with(int port, const char *method,
					const char *path, const char *headers)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct http_answer ans = { 0 };
	char req[512], *all = NULL, *end;
	size_t len = 0, cap = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0), n;
	ssize_t got;

	CHECK(fd >= 0);
	CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\n%s\r\n", method,
		     path, headers);
	CHECK(write(fd, req, (size_t)n) == n);
	do {
		if (len + 65536 > cap) {
			cap = cap * 2 + 65536;
			all = realloc(all, cap + 1);
			CHECK(all);
		}
		got = read(fd, all + len, cap - len);
		CHECK(got >= 0);
		len += (size_t)got;
	} while (got > 0);
	close(fd);
	all[len] = 0;
	end = strstr(all, "\r\n\r\n");
	CHECK(end && (size_t)(end - all) < sizeof(ans.head));
	memcpy(ans.head, all, (size_t)(end - all));
	CHECK(sscanf(all, "HTTP/1.%*d %d", &ans.status) == 1);
	ans.len = len - (size_t)(end + 4 - all);
	ans.body = malloc(ans.len + 1);
	CHECK(ans.body);
	memcpy(ans.body, end + 4, ans.len + 1);
	free(all);
	return ans;
}

static struct http_answer http_ask(int port, const char *method,
				   const char *path, const char *accept)
{
	char h[256] = "";

	if (accept)
		snprintf(h, sizeof(h), "Accept: %s\r\n", accept);
	return http_ask_with(port, method, path, h);
}

/* The header line line is in head, whole. */
static bool has_header(const char *head, const char *line)
{
	const char *p = strstr(head, line);

	return p && (p[strlen(line)] == '\r' || !p[strlen(line)]);
}

/* The answer is exactly text (the whole body, byte for byte). */
static bool same_body(const struct http_answer *ans, const char *text,
		      size_t len)
{
	return ans->len == len && !memcmp(ans->body, text, len);
}

static void case_endpoint(void)
{
	size_t bytes = fmc_file_bytes(4, 2), len, olen;
	struct fmc_header *h = calloc(1, bytes);
	struct http_answer ans, again;
	struct metrics_http *m;
	struct fmc_record *r;
	char addr[32], *text, *old;
	int port = hd_free_port();

	CHECK(h != NULL);
	*h = (struct fmc_header){ .magic = FMC_MAGIC, .version = FMC_VERSION,
		.hdr_bytes = FMC_HDR_BYTES, .rec_bytes = FMC_REC_BYTES,
		.n_flow = 4, .n_peer = 2, .pid = 1, .values = FMC_VALUES,
		.period_ms = FMC_DEFAULT_PERIOD_MS,
		.start_unix_ns = 1700000000ull * SEC };
	atomic_store(&h->sample_seq, 1);
	CHECK(fmc_valid(h, bytes));
	/* peer addresses carry what flow names may not: every escaped byte
	 * first, last, doubled, and bytes that need none */
	put_rec(h, fmc_first_flow(h), FMC_FLOW, "plain", "\"[::1]:7400\\");
	put_rec(h, fmc_first_flow(h) + 1, FMC_FLOW, "x", "\\\\a\"\"b\n\n");
	put_rec(h, fmc_first_flow(h) + 2, FMC_FLOW, "y", "\n={},'`\n");
	put_rec(h, fmc_first_peer(h), FMC_PEER, "p\\\"q\nr", "");

	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	CHECK(metrics_http_start(addr, NULL, NULL) == NULL);
	m = metrics_http_start(addr, h, NULL);
	CHECK(m != NULL);

	/* GET: metrics_render's text, its label values escaped */
	old = metrics_render(h, false, &olen);
	CHECK(old);
	ans = http_ask(port, "GET", "/metrics", NULL);
	CHECK(ans.status == 200);
	CHECK(has_header(ans.head, "Content-Type: text/plain; version=0.0.4; "
			 "charset=utf-8"));
	CHECK(same_body(&ans, old, olen));
	CHECK(strstr(ans.body, "flowmover_flow_bytes_committed_total{flow=\"plain\","
		     "role=\"local\",peer=\"\\\"[::1]:7400\\\\\"} 0\n"));
	CHECK(strstr(ans.body, "{flow=\"x\",role=\"local\",peer=\"\\\\\\\\a"
		     "\\\"\\\"b\\n\\n\"}"));
	CHECK(strstr(ans.body, "{flow=\"y\",role=\"local\",peer=\"\\n={},'`"
		     "\\n\"}"));
	CHECK(strstr(ans.body, "flowmover_peer_up{peer=\"p\\\\\\\"q\\nr\","
		     "transport=\"tcp\"} 0\n"));

	/* a counter moved, no sampler pass: the body already rendered */
	r = fmc_record(h, fmc_first_flow(h));
	fmc_begin(r);
	fmc_set(r, FMC_F_BYTES_COMMITTED, 4242);
	fmc_end(r);
	again = http_ask(port, "GET", "/metrics", NULL);
	CHECK(again.status == 200 && same_body(&again, old, olen));
	free(again.body);

	/* HEAD: the length of that body, none of its bytes */
	again = http_ask(port, "HEAD", "/metrics", NULL);
	CHECK(again.status == 200 && again.len == 0);
	snprintf(addr, sizeof(addr), "Content-Length: %zu", olen);
	CHECK(has_header(again.head, addr));
	free(again.body);

	/* OpenMetrics, rendered for its first asker */
	text = metrics_render(h, true, &len);
	CHECK(text && strstr(text, " 4242\n"));
	again = http_ask(port, "GET", "/metrics",
			 "application/openmetrics-text;version=1.0.0,"
			 "text/plain;version=0.0.4;q=0.5");
	CHECK(again.status == 200);
	CHECK(has_header(again.head, "Content-Type: application/openmetrics-"
			 "text; version=1.0.0; charset=utf-8"));
	CHECK(same_body(&again, text, len));
	CHECK(!strcmp(again.body + again.len - 6, "# EOF\n"));
	free(again.body);
	free(text);

	/* a sampler pass: the new value comes (within a period or a few) */
	atomic_store(&h->sample_seq, 2);
	text = metrics_render(h, false, &len);
	CHECK(text);
	for (int i = 0; i < 100; i++) {
		again = http_ask(port, "GET", "/metrics", NULL);
		CHECK(again.status == 200);
		if (!same_body(&again, old, olen))
			break;
		free(again.body);
		again.body = NULL;
		usleep(50000);
	}
	CHECK(again.body && same_body(&again, text, len));
	free(again.body);
	free(text);

	/* what is not /metrics */
	again = http_ask(port, "GET", "/other", NULL);
	CHECK(again.status == 404 && !strcmp(again.body, "GET /metrics\n"));
	CHECK(has_header(again.head, "Content-Type: text/plain"));
	free(again.body);
	again = http_ask(port, "POST", "/metrics", NULL);
	CHECK(again.status == 405 && !strcmp(again.body, "GET /metrics\n"));
	free(again.body);

	metrics_http_stop(m);
	free(ans.body);
	free(old);
	free(h);
}

/* ---- 21: a token for /metrics -------------------------------------------- */

#define TOKEN21 "f10w-m0ver-t0ken-21-0123456789abcdef"

/* 21: the answer to GET /metrics at port with an Authorization value
 * (NULL: none); its status, and the body is the metrics' if 200. */
static int get_authorized(int port, const char *auth)
{
	char h[256] = "";
	struct http_answer ans;

	if (auth)
		snprintf(h, sizeof(h), "Authorization: %s\r\n", auth);
	ans = http_ask_with(port, "GET", "/metrics", h);
	if (ans.status == 200)
		CHECK(strstr(ans.body, "flowmover_"));
	else
		CHECK(!strstr(ans.body, "flowmover_") &&
		      has_header(ans.head, "WWW-Authenticate: Bearer "
				 "realm=\"moverd metrics\""));
	free(ans.body);
	return ans.status;
}

/* 21: how many times pid's memory holds text (root reads any pid's). */
static int mem_has(pid_t pid, const char *text)
{
	char path[64], line[512];
	size_t n = strlen(text);
	int mem, hits = 0;
	FILE *maps;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	CHECK((maps = fopen(path, "re")));
	snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
	CHECK((mem = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
	while (fgets(line, sizeof(line), maps)) {
		unsigned long a, b;
		char perm[8];
		char *buf;
		ssize_t got;

		if (sscanf(line, "%lx-%lx %7s", &a, &b, perm) != 3 ||
		    perm[0] != 'r' || b - a > (256ul << 20))
			continue;
		CHECK((buf = malloc(b - a)));
		got = pread(mem, buf, b - a, (off_t)a);
		for (ssize_t i = 0; got > 0 && i + (ssize_t)n <= got; i++)
			hits += !memcmp(buf + i, text, n);
		free(buf);
	}
	fclose(maps);
	close(mem);
	return hits;
}

/* 21: Prometheus's `sum(up{job=...})` once both jobs were scraped
 * (count 2), or -1. */
static double job_up(int pp, const char *job)
{
	char q[128];
	double v = 0;

	for (int i = 0; i < 150; i++) {
		if (prom_query(pp, "count(up)", (double)unix_ns() / 1e9, &v) &&
		    v == 2)
			break;
		usleep(200000);
	}
	if (v != 2)
		return -1;
	snprintf(q, sizeof(q), "sum(up{job=\"%s\"})", job);
	return prom_query(pp, q, (double)unix_ns() / 1e9, &v) ? v : -1;
}

/* 21: the token file tok of moverd b (/metrics on port pb) rotated: served
 * from the reload on, the old one refused; a file the next start would
 * refuse (mode 0644) refuses the reload, the token in use stays.  how:
 * which moverd, for the log. */
static void rotate_token(const struct hd *b, int pb, const char *tok,
			 const char *how)
{
	char out[4096];
	FILE *f = fopen(tok, "w");

	CHECK(f && fputs(TOKEN21 "-rotated\n", f) >= 0 && fclose(f) == 0);
	CHECK(hd_ctl(b, moverctl, out, sizeof(out), "reload") == 0);
	printf("  %s, reload after the token file changed: %s", how, out);
	CHECK(strstr(out, "served from now on"));
	CHECK(get_authorized(pb, "Bearer " TOKEN21) == 401);
	CHECK(get_authorized(pb, "Bearer " TOKEN21 "-rotated") == 200);
	CHECK(chmod(tok, 0644) == 0);
	CHECK(hd_ctl(b, moverctl, out, sizeof(out), "reload") != 0);
	printf("  %s, reload with the token file 0644: %s", how, out);
	CHECK(strstr(out, "readable by its owner only") &&
	      strstr(out, "the token in use stays"));
	CHECK(get_authorized(pb, "Bearer " TOKEN21 "-rotated") == 200);
}

/*
 * --metrics-token FILE: a token file others may read is refused at start;
 * /metrics answers 401 (with WWW-Authenticate: Bearer) without the token
 * or with another, the text with it; a real Prometheus scrapes with
 * `authorization: credentials_file` (up 1) and not without (up 0).
 */
static void case_token(void)
{
	char dir[] = "/tmp/fm-metrics21-XXXXXX", tok[128], tok2[128];
	char cfg[256], data[256], log[256], mb[64], out[4096], conf[160];
	int pb = hd_free_port(), pp = hd_free_port();
	double with, without;
	struct hd b;
	pid_t prom;
	FILE *f;

	CHECK(mkdtemp(dir));
	snprintf(tok, sizeof(tok), "%s/token", dir);
	snprintf(tok2, sizeof(tok2), "%s/prometheus-token", dir);
	f = fopen(tok, "w");
	/* a line ending as an editor on another system writes it */
	CHECK(f && fputs(TOKEN21 "\r\n", f) >= 0 && fclose(f) == 0);
	CHECK(chmod(tok, 0644) == 0);
	snprintf(mb, sizeof(mb), "127.0.0.1:%d", pb);
	CHECK(sh(out, sizeof(out), "timeout 10 %s --foreground --socket "
		 "%s/m.sock --metrics %s --metrics-token %s 2>&1", moverd, dir,
		 mb, tok) == 1);
	printf("  a token file of mode 0644: %s", out);
	CHECK(strstr(out, "readable by its owner only"));
	/* a FIFO there is refused, not waited on (open would block) */
	snprintf(tok2, sizeof(tok2), "%s/fifo", dir);
	CHECK(mkfifo(tok2, 0600) == 0);
	CHECK(sh(out, sizeof(out), "timeout 10 %s --foreground --socket "
		 "%s/m.sock --metrics %s --metrics-token %s 2>&1", moverd, dir,
		 mb, tok2) == 1);
	CHECK(strstr(out, "is not a regular file"));
	snprintf(tok2, sizeof(tok2), "%s/prometheus-token", dir);
	CHECK(chmod(tok, 0600) == 0);
	CHECK(sh(NULL, 0, "cp %s %s", tok, tok2) == 0);

	/* from a config file, which a reload reads again */
	snprintf(conf, sizeof(conf), "%s/moverd.conf", dir);
	f = fopen(conf, "w");
	CHECK(f && fprintf(f, "metrics = %s\nmetrics-token = %s\n", mb,
			   tok) > 0 && fclose(f) == 0);
	hd_start(&b, moverd, "metrics21", false, (const char *[]){
		 "--config", conf, NULL });
	CHECK(get_authorized(pb, NULL) == 401);
	CHECK(get_authorized(pb, "Bearer " TOKEN21 "x") == 401);
	CHECK(get_authorized(pb, "Bearer f10w") == 401);
	CHECK(get_authorized(pb, "Basic " TOKEN21) == 401);
	CHECK(get_authorized(pb, "Bearer" TOKEN21) == 401);
	{
		struct http_answer h = http_ask(pb, "HEAD", "/metrics", NULL);

		CHECK(h.status == 401);
		free(h.body);
	}
	CHECK(get_authorized(pb, "bearer " TOKEN21) == 200);
	CHECK(get_authorized(pb, "Bearer\t " TOKEN21 " \t") == 200);
	CHECK(get_authorized(pb, "Bearer " TOKEN21) == 200);
	/* (right after a request that showed it: a later one may overwrite
	 * what it left) moverd keeps the token's hash, not the token: neither what a
	 * request showed nor the hash's copies of its words (which start
	 * a few bytes in: a part of the token is looked for) */
	CHECK(mem_has(b.pid, "m0ver-t0ken-21") == 0);

	rotate_token(&b, pb, tok, "--config");
	CHECK(chmod(tok, 0600) == 0);
	f = fopen(tok, "w");
	CHECK(f && fputs(TOKEN21 "\n", f) >= 0 && fclose(f) == 0);
	CHECK(hd_ctl(&b, moverctl, out, sizeof(out), "reload") == 0);
	printf("  GET /metrics: 401 without the token, with another or "
	       "another scheme; 200 with it\n");

	snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", dir);
	snprintf(data, sizeof(data), "%s/prometheus-data", dir);
	snprintf(log, sizeof(log), "%s/prometheus.log", dir);
	f = fopen(cfg, "w");
	CHECK(f != NULL);
	fprintf(f, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
		"scrape_configs:\n"
		"  - job_name: token\n    authorization:\n"
		"      credentials_file: %s\n"
		"    static_configs:\n      - targets: ['%s']\n"
		"  - job_name: none\n"
		"    static_configs:\n      - targets: ['%s']\n",
		tok2, mb, mb);
	fclose(f);
	prom = start_prometheus(cfg, data, log, pp);
	with = job_up(pp, "token");
	without = job_up(pp, "none");
	printf("  Prometheus: up{job=\"token\"} %.0f, up{job=\"none\"} "
	       "%.0f\n", with, without);
	if (with != 1) {
		snprintf(out, sizeof(out), "tail -20 %s", log);
		(void)!system(out);
	}
	CHECK(with == 1 && without == 0);
	kill(prom, SIGTERM);
	CHECK(hx_wait(prom, 20000) >= 0);
	hd_stop(&b);

	/* without --config a reload reads the token file again too */
	hd_start(&b, moverd, "metrics21b", false, (const char *[]){
		 "--metrics", mb, "--metrics-token", tok, NULL });
	CHECK(get_authorized(pb, "Bearer " TOKEN21) == 200);
	CHECK(hd_ctl(&b, moverctl, out, sizeof(out), "reload") == 0);
	CHECK(strstr(out, "read again: unchanged"));
	rotate_token(&b, pb, tok, "no --config");
	hd_stop(&b);
	CHECK(sh(NULL, 0, "rm -rf %s", dir) == 0);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_file, "the counters file and a local flow" },
		{ 2, case_seqlock, "readers never get a torn record" },
		{ 3, case_remote, "counters of a flow between hosts" },
		{ 4, case_peer_lost, "a silent peer, a lost peer" },
		{ 5, case_tmux, "moverctl top in an 80x24 tmux" },
		{ 6, case_prometheus, "a real Prometheus scraping --metrics" },
		{ 7, case_access, "who may read the counters" },
		{ 8, case_show, "flow show and status with the counters" },
		{ 9, case_text, "the Prometheus text: names, types, escaping" },
		{ 10, case_records, "record counters between hosts" },
		{ 11, case_leaver, "records of a consumer that just left" },
		{ 12, case_quiet_credit, "a receiver credits back what its "
		  "consumer freed before it stopped (less than a quarter "
		  "ring)" },
		{ 13, case_unheld, "the record of a flow no client holds" },
		{ 14, case_window, "the connection window: cut by a stopped "
		  "peer, records larger than it still go" },
		{ 15, case_window_delay, "the window's delay target is "
		  "moverd --window-delay-us" },
		{ 16, case_window_floor, "records larger than the window go "
		  "alone" },
		{ 17, case_lying_moverd, "moverctl and a moverd that lies: "
		  "escapes, endless lists, a refused first frame" },
		{ 18, case_cli, "moverctl: destroy --all, options, output "
		  "errors, the largest timeout" },
		{ 19, case_top_file, "moverctl top: unrecorded flows, rows "
		  "that do not fit, a header rewritten, a killed moverd" },
		{ 20, case_endpoint, "the endpoint: one shared body, HEAD, "
		  "OpenMetrics, 404, 405" },
		{ 21, case_token, "--metrics-token: 401 without the token, a "
		  "real Prometheus scrapes with it" },
	};

	if (argc != 4) {
		fprintf(stderr, "usage: test_metrics MOVERD MOVERCTL FLOWCHECK\n");
		return 2;
	}
	moverd = argv[1];
	moverctl = argv[2];
	flowcheck = argv[3];
	(void)flowcheck;
	return hc_run(cases, sizeof(cases) / sizeof(*cases), "FM_METRICS_CASES");
}
