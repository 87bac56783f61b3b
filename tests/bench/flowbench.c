/*
 * tests/bench/flowbench.c - flowmover benchmark (not a test: it checks
 * records for integrity but sets no performance thresholds).
 *
 *   flowbench local [options]   shared-memory rings on this machine
 *
 * Subcommands live in one table (see `subcmds` at the bottom), so a later
 * mode such as `flowbench remote` (two daemons) is one more entry.
 *
 * `local` measures, with separate processes (fork) for every producer and
 * the consumer, each opening its end with flowshm_open_fd after the fork:
 *   - throughput (records/s, GB/s of payload) per record size, for
 *     per-record send/recv, the batch APIs, and several producers;
 *   - ping-pong round trip over two rings (32 B by default), percentiles;
 *   - memcpy bandwidth in the same run, as the reference for large records.
 * Every record carries (producer id, sequence number) in its first 8 bytes
 * and a check word in its last 8 bytes; the consumer verifies both and the
 * length, so the benchmark cannot silently measure garbage.
 */
#include "flowshm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PRODUCERS 64
#define MAX_SIZES     32
#define MAX_MP        8
#define CHECK_XOR     0xa5a5c3c35a5a3c3cull

/* ---- small helpers ------------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull),
			       (long)(ns % 1000000000ull) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* `remote` sets this: stop the daemons and children it started. */
static void (*on_die)(void);

static void die(const char *what, int rc)
{
	fprintf(stderr, "flowbench: %s: %s\n", what,
		rc < 0 ? flowshm_strerror(rc) : strerror(errno));
	if (on_die)
		on_die();
	exit(2);
}

static void *shared_alloc(size_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap", 0);
	return p;
}

static void *xalloc(size_t bytes)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, bytes ? bytes : 1))
		die("posix_memalign", -ENOMEM);
	memset(p, 0x5c, bytes); /* fault every page in before timing */
	return p;
}

static void pin_to(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		fprintf(stderr, "flowbench: cannot pin to cpu %d: %s\n", cpu,
			strerror(errno));
}

static void unpin(void)
{
	cpu_set_t all;

	CPU_ZERO(&all);
	for (int i = 0; i < CPU_SETSIZE; i++)
		CPU_SET(i, &all);
	sched_setaffinity(0, sizeof(all), &all);
}

/* "64", "4K", "2M", "1G" -> bytes; 0 on error. */
static uint64_t parse_bytes(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (end == s)
		return 0;
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	return *end ? 0 : (uint64_t)v;
}

static const char *fmt_size(uint64_t b, char *buf, size_t n)
{
	if (b >= (1u << 20) && b % (1u << 20) == 0)
		snprintf(buf, n, "%" PRIu64 "M", b >> 20);
	else if (b >= 1024 && b % 1024 == 0)
		snprintf(buf, n, "%" PRIu64 "K", b >> 10);
	else
		snprintf(buf, n, "%" PRIu64, b);
	return buf;
}

/* ---- options ------------------------------------------------------------- */

enum api { API_RECORD, API_BATCH };

struct opts {
	double seconds;
	double warmup;
	uint64_t sizes[MAX_SIZES];
	unsigned nsizes;
	unsigned mp[MAX_MP];   /* producer counts of the multi-producer cases */
	unsigned nmp;
	uint64_t ring_size;
	unsigned batch;        /* records per batch call, at most */
	uint64_t batch_bytes;  /* and at most this many payload bytes */
	uint64_t pp_size;      /* ping-pong record size */
	bool json;
	bool pin;
	bool do_tput, do_mp, do_pp, do_memcpy;
};

/* ---- shared control block between the parent and its children ------------ */

enum phase { PH_START = 0, PH_WARM, PH_MEASURE, PH_STOP };

struct ctl {
	_Alignas(128) _Atomic int phase;
	_Alignas(128) _Atomic int ready;
	_Alignas(128) uint64_t t_stop; /* parent: when it set PH_STOP */
	_Alignas(128) uint64_t recs;   /* consumer: records in the window */
	uint64_t bytes;
	uint64_t ns;
	uint64_t total;                /* consumer: records verified overall */
	char err[256];
};

static enum phase phase_of(struct ctl *c)
{
	/* relaxed: only a hint to start or stop; results travel via exit() */
	return atomic_load_explicit(&c->phase, memory_order_relaxed);
}

static void set_phase(struct ctl *c, enum phase p)
{
	atomic_store_explicit(&c->phase, p, memory_order_release);
}

static void announce_ready(struct ctl *c)
{
	atomic_fetch_add_explicit(&c->ready, 1, memory_order_acq_rel);
}

static void wait_ready(struct ctl *c, int n)
{
	while (atomic_load_explicit(&c->ready, memory_order_acquire) < n)
		sleep_ns(100000);
}

/* ---- record contents ------------------------------------------------------ */

/* Sizes are >= 8: the first 8 bytes hold (producer id << 56 | seq). */
static inline void rec_stamp(unsigned char *p, uint64_t size, uint32_t id,
			     uint64_t seq)
{
	uint64_t w = ((uint64_t)id << 56) | seq;

	memcpy(p, &w, 8);
	if (size >= 16) {
		uint64_t c = w ^ CHECK_XOR;

		memcpy(p + size - 8, &c, 8);
	}
}

/* Verify a record; 0 or -1 with c->err filled. */
static inline int rec_check(struct ctl *c, const unsigned char *p,
			    size_t len, uint64_t size, unsigned nprod,
			    uint64_t *next)
{
	uint64_t w, id, seq;

	if (len != size) {
		snprintf(c->err, sizeof(c->err),
			 "record of %zu bytes, want %" PRIu64, len, size);
		return -1;
	}
	memcpy(&w, p, 8);
	id = w >> 56;
	seq = w & ((1ull << 56) - 1);
	if (id >= nprod || seq != next[id]) {
		snprintf(c->err, sizeof(c->err),
			 "producer %" PRIu64 " seq %" PRIu64 ", want %" PRIu64,
			 id, seq, id < nprod ? next[id] : 0);
		return -1;
	}
	if (size >= 16) {
		uint64_t chk;

		memcpy(&chk, p + size - 8, 8);
		if (chk != (w ^ CHECK_XOR)) {
			snprintf(c->err, sizeof(c->err),
				 "check word of producer %" PRIu64 " seq %" PRIu64
				 " corrupt", id, seq);
			return -1;
		}
	}
	next[id]++;
	return 0;
}

/* ---- throughput case ------------------------------------------------------ */

struct tput_case {
	uint64_t size;
	unsigned producers;
	enum api api;
	/* results */
	double recs_per_s;
	double gb_per_s;   /* payload bytes, 1e9 */
	uint64_t recs;
	double secs;
	double line_ns;    /* bare line round trip just before the case */
};

static unsigned batch_records(const struct opts *o, uint64_t size)
{
	uint64_t b = o->batch_bytes / size;

	if (b < 1)
		b = 1;
	if (b > o->batch)
		b = o->batch;
	return (unsigned)b;
}

static void open_end(int fd, enum flowshm_role role, flowshm_t **out)
{
	int rc = flowshm_open_fd(fd, role, NULL, out);

	if (rc)
		die("flowshm_open_fd", rc);
}

static void producer_main(const struct opts *o, struct ctl *c, int fd,
			  uint64_t size, uint32_t id, enum api api)
{
	unsigned nb = api == API_BATCH ? batch_records(o, size) : 1;
	unsigned char *buf = xalloc(nb * size);
	struct iovec *iov = calloc(nb, sizeof(*iov));
	flowshm_t *p;
	uint64_t seq = 0;
	int rc = 0;

	if (o->pin)
		pin_to(1);
	open_end(fd, FLOWSHM_PRODUCER, &p);
	for (unsigned i = 0; i < nb; i++)
		iov[i] = (struct iovec){ buf + i * size, size };
	announce_ready(c);
	while (phase_of(c) == PH_START)
		;
	if (api == API_RECORD) {
		while (phase_of(c) != PH_STOP) {
			rec_stamp(buf, size, id, seq);
			rc = flowshm_send(p, buf, size, -1);
			if (rc)
				break;
			seq++;
		}
	} else {
		unsigned off = nb;

		while (phase_of(c) != PH_STOP) {
			unsigned sent;

			if (off == nb) {
				for (unsigned i = 0; i < nb; i++)
					rec_stamp(buf + i * size, size, id,
						  seq + i);
				off = 0;
			}
			rc = flowshm_send_batch(p, iov + off, nb - off, &sent,
						-1);
			if (rc)
				break;
			off += sent;
			if (off == nb)
				seq += nb;
		}
	}
	flowshm_close(p);
	/* -EPIPE: the parent closed the flow after STOP; that is the end */
	if (rc && rc != -EPIPE) {
		fprintf(stderr, "flowbench: producer %u: %s\n", id,
			flowshm_strerror(rc));
		_exit(1);
	}
	_exit(0);
}

static void consumer_main(const struct opts *o, struct ctl *c, int fd,
			  uint64_t size, unsigned nprod, enum api api)
{
	unsigned nb = api == API_BATCH ? batch_records(o, size) : 1;
	size_t cap = nb * ((size + 7) & ~(uint64_t)7);
	unsigned char *buf = xalloc(cap);
	struct iovec *iov = calloc(nb, sizeof(*iov));
	uint64_t next[MAX_PRODUCERS] = { 0 };
	uint64_t n = 0, n0 = 0, t0 = 0;
	enum phase seen = PH_START;
	flowshm_t *cons;
	int rc;

	if (o->pin)
		pin_to(0);
	open_end(fd, FLOWSHM_CONSUMER, &cons);
	announce_ready(c);
	for (;;) {
		enum phase ph = phase_of(c);

		if (ph != seen) {
			uint64_t t = now_ns();

			if (ph == PH_MEASURE) {
				n0 = n;
				t0 = t;
			} else if (ph == PH_STOP && seen == PH_MEASURE) {
				c->recs = n - n0;
				c->ns = t - t0;
			}
			seen = ph;
		}
		if (api == API_RECORD) {
			size_t len;

			rc = flowshm_recv(cons, buf, cap, &len, -1);
			if (rc)
				break;
			if (rec_check(c, buf, len, size, nprod, next))
				_exit(1);
			n++;
		} else {
			unsigned got;

			rc = flowshm_recv_batch(cons, buf, cap, iov, nb, &got,
						-1);
			if (rc)
				break;
			for (unsigned i = 0; i < got; i++)
				if (rec_check(c, iov[i].iov_base,
					      iov[i].iov_len, size, nprod,
					      next))
					_exit(1);
			n += got;
		}
	}
	c->total = n;
	flowshm_close(cons);
	/*
	 * -EPIPE while still in the window: the consumer was waiting for data
	 * when STOP came (the producers stopped, the parent closed the flow),
	 * so it had every record sent in the window; the window ends at STOP.
	 */
	if (rc == -EPIPE && seen == PH_MEASURE &&
	    /* acquire: pairs with set_phase, so t_stop is visible */
	    atomic_load_explicit(&c->phase, memory_order_acquire) == PH_STOP) {
		c->recs = n - n0;
		c->ns = c->t_stop - t0;
		seen = PH_STOP;
	}
	if (rc != -EPIPE) {
		snprintf(c->err, sizeof(c->err), "consumer: %s",
			 flowshm_strerror(rc));
		_exit(1);
	}
	if (seen != PH_STOP || !c->ns) {
		snprintf(c->err, sizeof(c->err),
			 "consumer missed the window (last phase seen %d, "
			 "%" PRIu64 " records, %" PRIu64 " in window)",
			 (int)seen, n, n - n0);
		_exit(1);
	}
	_exit(0);
}

static int reap(pid_t pid, const char *who, struct ctl *c)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			die("waitpid", 0);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	fprintf(stderr, "flowbench: %s failed (%s%d)%s%s\n", who,
		WIFSIGNALED(st) ? "signal " : "status ",
		WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st),
		c->err[0] ? ": " : "", c->err);
	return -1;
}

static int make_ring(const struct opts *o, uint32_t max_record, int *fd)
{
	struct flowshm_ring_params p = { .ring_size = o->ring_size,
					 .max_record = max_record };

	return flowshm_ring_create(&p, NULL, fd);
}

static double line_rtt_ns(const struct opts *o, double secs);

static int run_tput(const struct opts *o, struct tput_case *tc)
{
	struct ctl *c = shared_alloc(sizeof(*c));
	pid_t prod[MAX_PRODUCERS], cons;
	flowshm_t *closer;
	int fd, rc, failed = 0;

	/* where the host has put our two vCPUs right now (it moves them) */
	tc->line_ns = line_rtt_ns(o, 0.02);
	rc = make_ring(o, (uint32_t)tc->size, &fd);
	if (rc)
		die("flowshm_ring_create", rc);
	fflush(NULL);
	cons = fork();
	if (cons < 0)
		die("fork", 0);
	if (cons == 0)
		consumer_main(o, c, fd, tc->size, tc->producers, tc->api);
	for (unsigned i = 0; i < tc->producers; i++) {
		prod[i] = fork();
		if (prod[i] < 0)
			die("fork", 0);
		if (prod[i] == 0)
			producer_main(o, c, fd, tc->size, i, tc->api);
	}
	open_end(fd, FLOWSHM_PRODUCER, &closer);
	close(fd);
	wait_ready(c, (int)tc->producers + 1);
	set_phase(c, PH_WARM);
	sleep_ns((uint64_t)(o->warmup * 1e9));
	set_phase(c, PH_MEASURE);
	sleep_ns((uint64_t)(o->seconds * 1e9));
	c->t_stop = now_ns(); /* published by the release store below */
	set_phase(c, PH_STOP);
	for (unsigned i = 0; i < tc->producers; i++)
		failed |= reap(prod[i], "producer", c);
	flowshm_shutdown(closer); /* the consumer drains, then sees -EPIPE */
	failed |= reap(cons, "consumer", c);
	flowshm_close(closer);
	if (!failed) {
		tc->recs = c->recs;
		tc->secs = c->ns / 1e9;
		tc->recs_per_s = c->recs / tc->secs;
		tc->gb_per_s = tc->recs_per_s * (double)tc->size / 1e9;
	}
	munmap(c, sizeof(*c));
	return failed ? -1 : 0;
}

/* ---- ping-pong ------------------------------------------------------------ */

struct pp_result {
	uint64_t size;
	uint64_t samples;
	double mean_ns;
	double p50, p90, p99, p999, min, max; /* round trip, ns */
	double clock_ns; /* cost of one timestamp pair, subtracted: no */
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void pp_child(const struct opts *o, struct ctl *c, int fd_req,
		     int fd_rsp)
{
	unsigned char *buf = xalloc(o->pp_size);
	flowshm_t *in, *out;
	size_t len;
	int rc;

	if (o->pin)
		pin_to(1);
	open_end(fd_req, FLOWSHM_CONSUMER, &in);
	open_end(fd_rsp, FLOWSHM_PRODUCER, &out);
	announce_ready(c);
	/* echo every request back, unchanged */
	while (!(rc = flowshm_recv(in, buf, o->pp_size, &len, -1)))
		if ((rc = flowshm_send(out, buf, len, -1)))
			break;
	flowshm_close(in);
	flowshm_close(out);
	_exit(rc == -EPIPE ? 0 : 1);
}

static int run_pingpong(const struct opts *o, struct pp_result *r)
{
	struct ctl *c = shared_alloc(sizeof(*c));
	uint64_t size = o->pp_size, max_samples = 1u << 23, n = 0;
	uint64_t *lat = xalloc(max_samples * sizeof(*lat));
	unsigned char *sbuf = xalloc(size), *rbuf = xalloc(size);
	uint64_t next = 0, seq = 0, t_end, t_start, clk = UINT64_MAX;
	flowshm_t *req, *rsp;
	int fd_req, fd_rsp, rc;
	pid_t child;

	if ((rc = make_ring(o, (uint32_t)size, &fd_req)) ||
	    (rc = make_ring(o, (uint32_t)size, &fd_rsp)))
		die("flowshm_ring_create", rc);
	fflush(NULL);
	child = fork();
	if (child < 0)
		die("fork", 0);
	if (child == 0)
		pp_child(o, c, fd_req, fd_rsp);
	if (o->pin)
		pin_to(0);
	open_end(fd_req, FLOWSHM_PRODUCER, &req);
	open_end(fd_rsp, FLOWSHM_CONSUMER, &rsp);
	close(fd_req);
	close(fd_rsp);
	wait_ready(c, 1);

	/* cost of the two timestamps around each round trip (not removed) */
	for (int i = 0; i < 1000; i++) {
		uint64_t a = now_ns(), b = now_ns();

		if (b - a < clk)
			clk = b - a;
	}
	for (int measuring = 0; measuring < 2; measuring++) {
		double secs = measuring ? o->seconds : o->warmup;

		n = 0;
		t_start = now_ns();
		t_end = t_start + (uint64_t)(secs * 1e9);
		for (;;) {
			uint64_t t0 = now_ns(), t1;
			size_t len;

			rec_stamp(sbuf, size, 0, seq++);
			if ((rc = flowshm_send(req, sbuf, size, -1)) ||
			    (rc = flowshm_recv(rsp, rbuf, size, &len, -1)))
				die("ping-pong", rc);
			t1 = now_ns();
			if (rec_check(c, rbuf, len, size, 1, &next)) {
				fprintf(stderr, "flowbench: ping-pong: %s\n",
					c->err);
				exit(1);
			}
			if (measuring && n < max_samples)
				lat[n++] = t1 - t0;
			if (t1 >= t_end || (measuring && n == max_samples))
				break;
		}
		if (measuring)
			r->mean_ns = (double)(now_ns() - t_start) / (double)n;
	}
	flowshm_shutdown(req);
	flowshm_close(req);
	flowshm_close(rsp);
	rc = reap(child, "ping-pong echo", c);
	if (o->pin)
		unpin();
	qsort(lat, n, sizeof(*lat), cmp_u64);
	r->size = size;
	r->samples = n;
	r->min = (double)lat[0];
	r->p50 = (double)lat[n / 2];
	r->p90 = (double)lat[n * 9 / 10];
	r->p99 = (double)lat[n * 99 / 100];
	r->p999 = (double)lat[n * 999 / 1000];
	r->max = (double)lat[n - 1];
	r->clock_ns = (double)clk;
	free(lat);
	free(sbuf);
	free(rbuf);
	munmap(c, sizeof(*c));
	return rc;
}

/* ---- memcpy reference ----------------------------------------------------- */

struct mc_result {
	const char *name;
	uint64_t set_bytes; /* size of the source (and of the destination) set */
	double gb_per_s;
};

/* 64 KiB copies rotating through src and dst sets of set bytes each. */
static double memcpy_bw(uint64_t set, double secs)
{
	const uint64_t chunk = 64 * 1024;
	unsigned char *src = xalloc(set), *dst = xalloc(set);
	uint64_t n = 0, off = 0, t0, t1, deadline;

	for (int warm = 0; warm < 2; warm++) {
		t0 = now_ns();
		deadline = t0 + (uint64_t)((warm ? secs : secs / 4) * 1e9);
		n = 0;
		do {
			for (int i = 0; i < 16; i++) {
				memcpy(dst + off, src + off, chunk);
				off = (off + chunk) % set;
			}
			/* keep the compiler from proving the copies dead */
			__asm__ __volatile__("" : : "r"(dst) : "memory");
			n += 16;
			t1 = now_ns();
		} while (t1 < deadline);
	}
	free(src);
	free(dst);
	return (double)(n * chunk) / (double)(t1 - t0);
}

/* ---- hardware floor: one cache line bounced between two processes ------- */

/*
 * Round trip of a bare shared counter between two processes: each side
 * waits for the other's increment.  This is the floor under the ring's
 * ping-pong (two line transfers per round trip) and it shows where the
 * two vCPUs happen to sit (same core complex or not) during this run.
 */
static double line_rtt_ns(const struct opts *o, double secs)
{
	_Atomic uint64_t *w = shared_alloc(4096);
	uint64_t n = 0, t0, t1;
	pid_t child;

	fflush(NULL);
	child = fork();
	if (child < 0)
		die("fork", 0);
	if (child == 0) {
		if (o->pin)
			pin_to(1);
		/* odd values are ours to answer; UINT64_MAX ends it */
		for (uint64_t v;;) {
			/* acquire/release: a plain hand-off, ordering nothing
			 * else; relaxed would do, these cost nothing on x86 */
			while (!((v = atomic_load_explicit(w,
				memory_order_acquire)) & 1))
				;
			if (v == UINT64_MAX)
				_exit(0);
			atomic_store_explicit(w, v + 1, memory_order_release);
		}
	}
	if (o->pin)
		pin_to(0);
	t0 = now_ns();
	do {
		for (int i = 0; i < 1000; i++) {
			atomic_store_explicit(w, 2 * n + 1, memory_order_release);
			while (atomic_load_explicit(w, memory_order_acquire) !=
			       2 * n + 2)
				;
			n++;
		}
		t1 = now_ns();
	} while (t1 - t0 < (uint64_t)(secs * 1e9));
	atomic_store_explicit(w, UINT64_MAX, memory_order_release);
	waitpid(child, NULL, 0);
	if (o->pin)
		unpin();
	munmap((void *)w, 4096);
	return (double)(t1 - t0) / (double)n;
}

/*
 * CPU time of the whole machine (from /proc/stat) and of this benchmark
 * (itself and its reaped children), in seconds: the difference over a run
 * is what other tasks took from our 2 cores; steal is what the host took.
 */
struct cpu_snap {
	double busy, steal, ours, wall;
};

static void cpu_snap(struct cpu_snap *s)
{
	unsigned long long v[8] = { 0 };
	long hz = sysconf(_SC_CLK_TCK);
	struct rusage a, b;
	FILE *f = fopen("/proc/stat", "re");

	if (f) {
		if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
			   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
			   &v[7]) != 8)
			memset(v, 0, sizeof(v));
		fclose(f);
	}
	/* user nice system [idle iowait] irq softirq; steal apart */
	s->busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / (double)hz;
	s->steal = (double)v[7] / (double)hz;
	getrusage(RUSAGE_SELF, &a);
	getrusage(RUSAGE_CHILDREN, &b);
	s->ours = a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec +
		  b.ru_stime.tv_sec +
		  (a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec +
		   b.ru_stime.tv_usec) / 1e6;
	s->wall = now_ns() / 1e9;
}

/* Share of the machine's CPU time taken by others (and by the host). */
static void cpu_foreign(const struct cpu_snap *a, const struct cpu_snap *b,
			double *others, double *steal)
{
	double cap = (b->wall - a->wall) * (double)sysconf(_SC_NPROCESSORS_ONLN);
	double o = (b->busy - a->busy) - (b->ours - a->ours);

	*others = cap > 0 && o > 0 ? o / cap : 0;
	*steal = cap > 0 ? (b->steal - a->steal) / cap : 0;
}

/* ---- output --------------------------------------------------------------- */

static const char *api_name(enum api a)
{
	return a == API_BATCH ? "batch" : "record";
}

static void cpu_model(char *buf, size_t n)
{
	FILE *f = fopen("/proc/cpuinfo", "re");
	char line[512];

	snprintf(buf, n, "unknown");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');

		if (!strncmp(line, "model name", 10) && colon) {
			colon += 2;
			colon[strcspn(colon, "\n")] = 0;
			snprintf(buf, n, "%s", colon);
			break;
		}
	}
	fclose(f);
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

/* ---- `local` -------------------------------------------------------------- */

static void usage_local(FILE *f)
{
	fprintf(f,
"usage: flowbench local [options]\n"
"  Producer(s) and consumer are separate processes sharing a memfd ring.\n"
"  --seconds S      measured time per case (default 1)\n"
"  --warmup S       untimed warm-up per case (default 0.2)\n"
"  --sizes LIST     record sizes, e.g. 8,32,64,256,1K,4K,16K,64K (default)\n"
"  --ring-size N    ring bytes, power of two (default 2M)\n"
"  --batch N        records per batch call, at most (default 256)\n"
"  --batch-bytes N  payload bytes per batch call, at most (default 256K)\n"
"  --producers LIST producer counts of the multi-producer cases (default 2,4;\n"
"                   \"0\" for none)\n"
"  --pp-size N      ping-pong record size (default 32)\n"
"  (sizes are bytes, >= 8, with optional K/M/G suffix)\n"
"  --only LIST      run only some parts: tput,mp,pingpong,memcpy\n"
"  --pin            pin consumer/ping side to cpu 0, producers/echo to cpu 1\n"
"  --json           machine-readable output on stdout\n"
"  -h, --help       this text\n");
}

static int parse_list(const char *s, uint64_t *out, unsigned max,
		      unsigned *n)
{
	char *dup = strdup(s), *save = NULL, *tok;

	*n = 0;
	for (tok = strtok_r(dup, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		uint64_t v = parse_bytes(tok);

		if (*n == max || (!v && strcmp(tok, "0"))) {
			free(dup);
			return -1;
		}
		out[(*n)++] = v;
	}
	free(dup);
	return *n ? 0 : -1;
}

static int cmd_local(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "seconds", required_argument, NULL, 's' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "ring-size", required_argument, NULL, 'r' },
		{ "batch", required_argument, NULL, 'b' },
		{ "batch-bytes", required_argument, NULL, 'B' },
		{ "producers", required_argument, NULL, 'p' },
		{ "pp-size", required_argument, NULL, 'P' },
		{ "only", required_argument, NULL, 'o' },
		{ "pin", no_argument, NULL, 'x' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const uint64_t def_sizes[] = { 8, 32, 64, 256, 1024, 4096,
					      16384, 65536 };
	struct opts o = { .seconds = 1.0, .warmup = 0.2, .ring_size = 2u << 20,
			  .batch = 256, .batch_bytes = 256 * 1024,
			  .pp_size = 32, .mp = { 2, 4 }, .nmp = 2,
			  .do_tput = true, .do_mp = true, .do_pp = true,
			  .do_memcpy = true };
	struct tput_case cases[MAX_SIZES * (2 + 2 * MAX_MP)];
	struct mc_result mc[3];
	struct pp_result pp = { 0 };
	unsigned ncases = 0, nmc = 0, i;
	uint64_t max_size = 0, tmp[MAX_MP];
	char model[256], sz[32];
	struct utsname un;
	int opt, failed = 0;
	double ratio_base = 0, line_rtt, others, steal;
	struct cpu_snap snap0, snap1;

	memcpy(o.sizes, def_sizes, sizeof(def_sizes));
	o.nsizes = sizeof(def_sizes) / sizeof(def_sizes[0]);
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (opt) {
		case 's': o.seconds = atof(optarg); break;
		case 'w': o.warmup = atof(optarg); break;
		case 'z':
			if (parse_list(optarg, o.sizes, MAX_SIZES, &o.nsizes))
				goto bad;
			break;
		case 'r': o.ring_size = parse_bytes(optarg); break;
		case 'b': o.batch = (unsigned)atoi(optarg); break;
		case 'B': o.batch_bytes = parse_bytes(optarg); break;
		case 'p':
			if (parse_list(optarg, tmp, MAX_MP, &o.nmp))
				goto bad;
			for (i = 0; i < o.nmp; i++) {
				if (tmp[i] > MAX_PRODUCERS)
					goto bad;
				o.mp[i] = (unsigned)tmp[i];
			}
			if (o.nmp == 1 && o.mp[0] == 0)
				o.nmp = 0;
			break;
		case 'P': o.pp_size = parse_bytes(optarg); break;
		case 'o':
			o.do_tput = strstr(optarg, "tput") != NULL;
			o.do_mp = strstr(optarg, "mp") != NULL;
			o.do_pp = strstr(optarg, "pingpong") != NULL;
			o.do_memcpy = strstr(optarg, "memcpy") != NULL;
			break;
		case 'x': o.pin = true; break;
		case 'j': o.json = true; break;
		case 'h': usage_local(stdout); return 0;
		default: goto bad;
		}
	}
	if (optind != argc || o.seconds <= 0 || o.warmup < 0 || !o.batch ||
	    !o.batch_bytes || !o.pp_size)
		goto bad;
	for (i = 0; i < o.nsizes; i++)
		if (o.sizes[i] > max_size)
			max_size = o.sizes[i];
	if (o.pp_size > max_size)
		max_size = o.pp_size;
	if (!o.ring_size || (o.ring_size & (o.ring_size - 1)) ||
	    o.ring_size < 4096 || max_size > o.ring_size / 2 ||
	    max_size > UINT32_MAX) {
		fprintf(stderr, "flowbench: ring size must be a power of two "
				">= 4096 and >= twice the largest record\n");
		return 2;
	}
	for (i = 0; i < o.nsizes; i++)
		if (o.sizes[i] < 8)
			goto bad; /* the sequence number needs 8 bytes */

	cpu_model(model, sizeof(model));
	uname(&un);
	cpu_snap(&snap0);
	line_rtt = line_rtt_ns(&o, 0.2);
	if (!o.json) {
		printf("flowbench local: %ld cpus (%s), kernel %s\n",
		       sysconf(_SC_NPROCESSORS_ONLN), model, un.release);
		printf("ring %s, %.2f s per case after %.2f s warm-up, %s; "
		       "every record verified (producer, seq, check word)\n",
		       fmt_size(o.ring_size, sz, sizeof(sz)), o.seconds,
		       o.warmup, o.pin ? "pinned" : "not pinned");
		printf("bare cache-line round trip between two processes: "
		       "%.0f ns (the floor under ping-pong)\n", line_rtt);
		printf("\n");
	}

	/* memcpy first, on a quiet machine */
	if (o.do_memcpy) {
		double t = o.seconds / 2 < 0.2 ? 0.2 : o.seconds / 2;

		mc[nmc++] = (struct mc_result){ "cache-resident", 64 * 1024,
						memcpy_bw(64 * 1024, t) };
		mc[nmc++] = (struct mc_result){ "ring-sized set", o.ring_size,
						memcpy_bw(o.ring_size, t) };
		mc[nmc++] = (struct mc_result){ "64M set (> L2, > L3)",
						64u << 20,
						memcpy_bw(64u << 20, t) };
		ratio_base = mc[2].gb_per_s;
		if (!o.json) {
			printf("memcpy reference, 64 KiB copies (src and dst "
			       "sets each of the given size):\n");
			for (i = 0; i < nmc; i++)
				printf("  %-22s %6s  %7.2f GB/s\n", mc[i].name,
				       fmt_size(mc[i].set_bytes, sz,
						sizeof(sz)),
				       mc[i].gb_per_s);
			printf("\n");
		}
	}

	if (o.do_tput || o.do_mp) {
		if (!o.json)
			printf("%-8s %-6s %4s  %12s  %8s  %6s  %s\n", "size",
			       "api", "prod", "records/s", "GB/s", "line",
			       o.do_memcpy ? "vs memcpy (cache / ring / 64M)" : "");
		for (i = 0; i < o.nsizes; i++) {
			unsigned first = ncases;

			if (o.do_tput) {
				cases[ncases++] = (struct tput_case){
					.size = o.sizes[i], .producers = 1,
					.api = API_RECORD };
				cases[ncases++] = (struct tput_case){
					.size = o.sizes[i], .producers = 1,
					.api = API_BATCH };
			}
			for (unsigned m = 0; o.do_mp && m < o.nmp; m++) {
				cases[ncases++] = (struct tput_case){
					.size = o.sizes[i],
					.producers = o.mp[m],
					.api = API_RECORD };
				cases[ncases++] = (struct tput_case){
					.size = o.sizes[i],
					.producers = o.mp[m],
					.api = API_BATCH };
			}
			for (unsigned k = first; k < ncases; k++) {
				struct tput_case *tc = &cases[k];

				if (run_tput(&o, tc)) {
					failed = 1;
					continue;
				}
				if (o.json)
					continue;
				printf("%-8s %-6s %4u  %12.0f  %8.3f  %4.0fns",
				       fmt_size(tc->size, sz, sizeof(sz)),
				       api_name(tc->api), tc->producers,
				       tc->recs_per_s, tc->gb_per_s,
				       tc->line_ns);
				if (o.do_memcpy)
					printf("  %5.1f%% / %5.1f%% / %5.1f%%",
					       100 * tc->gb_per_s / mc[0].gb_per_s,
					       100 * tc->gb_per_s / mc[1].gb_per_s,
					       100 * tc->gb_per_s / mc[2].gb_per_s);
				printf("\n");
				fflush(stdout);
			}
		}
		if (!o.json && o.do_mp && o.nmp)
			printf("(prod > 1: %ld cpus are shared by all producers "
			       "and the consumer, so these are contention "
			       "figures, not scaling)\n",
			       sysconf(_SC_NPROCESSORS_ONLN));
		if (!o.json)
			printf("\n");
	}

	if (o.do_pp) {
		if (run_pingpong(&o, &pp))
			failed = 1;
		else if (!o.json)
			printf("ping-pong %s B over two rings, %" PRIu64
			       " round trips (timestamp pair costs %.0f ns, "
			       "included):\n"
			       "  RTT     p50 %6.0f  p90 %6.0f  p99 %6.0f  "
			       "p99.9 %7.0f  min %5.0f  mean %6.0f ns\n"
			       "  one-way p50 %6.0f  p90 %6.0f  p99 %6.0f  "
			       "p99.9 %7.0f  (RTT/2)\n",
			       fmt_size(pp.size, sz, sizeof(sz)), pp.samples,
			       pp.clock_ns, pp.p50, pp.p90, pp.p99, pp.p999,
			       pp.min, pp.mean_ns, pp.p50 / 2, pp.p90 / 2,
			       pp.p99 / 2, pp.p999 / 2);
	}

	cpu_snap(&snap1);
	cpu_foreign(&snap0, &snap1, &others, &steal);
	if (!o.json)
		printf("\nduring the run, other tasks used %.1f%% and the "
		       "host stole %.1f%% of the cpus%s\n", 100 * others,
		       100 * steal,
		       others + steal > 0.05 ? ": NOT QUIET, figures are low" :
					       "");
	if (o.json) {
		printf("{\n  \"mode\": \"local\",\n  \"machine\": {\"cpus\": %ld, "
		       "\"model\": ",
		       sysconf(_SC_NPROCESSORS_ONLN));
		json_str(model);
		printf(", \"kernel\": ");
		json_str(un.release);
		printf("},\n  \"params\": {\"ring_size\": %" PRIu64
		       ", \"seconds\": %g, \"warmup\": %g, \"batch\": %u, "
		       "\"batch_bytes\": %" PRIu64 ", \"pinned\": %s},\n",
		       o.ring_size, o.seconds, o.warmup, o.batch,
		       o.batch_bytes, o.pin ? "true" : "false");
		printf("  \"line_rtt_ns\": %.1f, \"others_cpu\": %.4f, "
		       "\"steal_cpu\": %.4f,\n", line_rtt, others, steal);
		printf("  \"memcpy\": [");
		for (i = 0; i < nmc; i++) {
			printf("%s\n    {\"name\": ", i ? "," : "");
			json_str(mc[i].name);
			printf(", \"chunk\": 65536, \"set_bytes\": %" PRIu64
			       ", \"gb_per_s\": %.3f}",
			       mc[i].set_bytes, mc[i].gb_per_s);
		}
		printf("%s],\n  \"throughput\": [", nmc ? "\n  " : "");
		for (i = 0; i < ncases; i++) {
			struct tput_case *tc = &cases[i];

			printf("%s\n    {\"size\": %" PRIu64 ", \"api\": \"%s\", "
			       "\"producers\": %u, \"records\": %" PRIu64
			       ", \"seconds\": %.4f, \"records_per_s\": %.0f, "
			       "\"gb_per_s\": %.4f, \"line_rtt_ns\": %.1f",
			       i ? "," : "", tc->size, api_name(tc->api),
			       tc->producers, tc->recs, tc->secs,
			       tc->recs_per_s, tc->gb_per_s, tc->line_ns);
			if (ratio_base > 0)
				printf(", \"vs_memcpy_cache\": %.4f, "
				       "\"vs_memcpy_ring_set\": %.4f, "
				       "\"vs_memcpy_64m_set\": %.4f",
				       tc->gb_per_s / mc[0].gb_per_s,
				       tc->gb_per_s / mc[1].gb_per_s,
				       tc->gb_per_s / mc[2].gb_per_s);
			printf("}");
		}
		printf("%s]", ncases ? "\n  " : "");
		if (o.do_pp && pp.samples)
			printf(",\n  \"pingpong\": {\"size\": %" PRIu64
			       ", \"samples\": %" PRIu64
			       ", \"rtt_ns\": {\"p50\": %.0f, \"p90\": %.0f, "
			       "\"p99\": %.0f, \"p99.9\": %.0f, \"min\": %.0f, "
			       "\"max\": %.0f, \"mean\": %.1f}, "
			       "\"one_way_ns\": {\"p50\": %.1f, \"p90\": %.1f, "
			       "\"p99\": %.1f, \"p99.9\": %.1f}, "
			       "\"timestamp_pair_ns\": %.0f}",
			       pp.size, pp.samples, pp.p50, pp.p90, pp.p99,
			       pp.p999, pp.min, pp.max, pp.mean_ns, pp.p50 / 2,
			       pp.p90 / 2, pp.p99 / 2, pp.p999 / 2,
			       pp.clock_ns);
		printf(",\n  \"ok\": %s\n}\n", failed ? "false" : "true");
	}
	return failed ? 1 : 0;
bad:
	usage_local(stderr);
	return 2;
}

/* ---- subcommands ---------------------------------------------------------- */

struct subcmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

/* Add `remote` (two daemons) here when it exists. */
static const struct subcmd subcmds[] = {
	{ "local", cmd_local,
	  "shared-memory rings between processes on this machine" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: flowbench <mode> [options]   "
		   "(flowbench <mode> --help for its options)\n\nmodes:\n");
	for (size_t i = 0; i < sizeof(subcmds) / sizeof(subcmds[0]); i++)
		fprintf(f, "  %-8s %s\n", subcmds[i].name, subcmds[i].summary);
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return argc < 2 ? 2 : 0;
	}
	signal(SIGPIPE, SIG_IGN);
	for (size_t i = 0; i < sizeof(subcmds) / sizeof(subcmds[0]); i++)
		if (!strcmp(argv[1], subcmds[i].name))
			return subcmds[i].run(argc - 1, argv + 1);
	fprintf(stderr, "flowbench: unknown mode '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}
