/*
 * tests/bench/flowbench.c - flowmover benchmark (not a test: it checks
 * records for integrity but sets no performance thresholds).
 *
 *   flowbench local [options]   shared-memory rings on this machine
 *   flowbench remote [options]  two moverd daemons on this machine, flows
 *                               between them over TCP or RDMA (see
 *                               cmd_remote; loopback and TCP by default):
 *                               throughput, paced and sparse latency, a
 *                               ping-pong A -> B -> A against sockperf's
 *                               TCP ping-pong, CPU per record (and, in a
 *                               ping-pong, sleeps per exchange)
 *   flowbench scale [options]   remote --only scale: idle CPU with many
 *                               idle flows, busy flows beside them,
 *                               create/destroy, moverd's fds and RSS
 *
 * Subcommands live in one table (see `subcmds` at the bottom).
 *
 * `local` measures, with separate processes (fork) for every producer and
 * the consumer, each opening its end with flowshm_open_fd after the fork:
 *   - throughput (records/s, GB/s of payload) per record size, for
 *     per-record send/recv, the batch APIs, and several producers;
 *   - ping-pong round trip over two rings (32 B by default), percentiles;
 *   - memcpy bandwidth in the same run, as the reference for large records,
 *     and right before each single-producer case of 4 KiB records or more
 *     the same copies through a bare shared buffer (pipe_gbps).
 * Every record carries (producer id, sequence number) in its first 8 bytes
 * and a check word in its last 8 bytes; the consumer verifies both and the
 * length, so the benchmark cannot silently measure garbage.
 */
#include "flowshm.h"
#include "cpus.h"
#include "counters.h"   /* ipc/: --counter-reader */
#include "lattrace.h"   /* ipc/: FM_LATTRACE */

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
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#define MAX_PRODUCERS 64
#define MAX_SIZES     32
#define MAX_MP        8
#define CHECK_XOR     0xa5a5c3c35a5a3c3cull
#define PIPE_MIN_SIZE 4096 /* records this large get the pipe reference */

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

static _Noreturn void die(const char *what, int rc)
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

/* API_PEEK, API_PEEK_BATCH (--peek-batch): a batch producer, and a
 * consumer reading in place one record at a time or a batch at a time */
enum api { API_RECORD, API_BATCH, API_PEEK, API_PEEK_BATCH };

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
	bool do_peek;          /* --peek-batch: peek vs peek_batch cases */
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

/*
 * A consumer's measurement window: on entering PH_MEASURE note the count
 * and time; on leaving it for PH_STOP, store records and ns in the window.
 */
static void track_window(enum phase ph, enum phase *seen, uint64_t n,
			 uint64_t *n0, uint64_t *t0, uint64_t *recs,
			 uint64_t *ns)
{
	uint64_t t;

	if (ph == *seen)
		return;
	t = now_ns();
	if (ph == PH_MEASURE) {
		*n0 = n;
		*t0 = t;
	} else if (ph == PH_STOP && *seen == PH_MEASURE) {
		*recs = n - *n0;
		*ns = t - *t0;
	}
	*seen = ph;
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
	double pipe_gbps;  /* bare copy pipeline just before it (0: none) */
};

/* Records per batch call: batch_bytes of them, at least 1, at most batch. */
static unsigned batch_records(uint64_t batch_bytes, uint64_t batch,
			      uint64_t size)
{
	uint64_t b = batch_bytes / size;

	if (b < 1)
		b = 1;
	if (b > batch)
		b = batch;
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
	unsigned nb = api != API_RECORD ?
		      batch_records(o->batch_bytes, o->batch, size) : 1;
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
	unsigned nb = api != API_RECORD && api != API_PEEK ?
		      batch_records(o->batch_bytes, o->batch, size) : 1;
	size_t cap = nb * ((size + 7) & ~(uint64_t)7);
	struct flowshm_rec *recs = calloc(nb, sizeof(*recs));
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

		track_window(ph, &seen, n, &n0, &t0, &c->recs, &c->ns);
		if (api == API_RECORD) {
			size_t len;

			rc = flowshm_recv(cons, buf, cap, &len, -1);
			if (rc)
				break;
			if (rec_check(c, buf, len, size, nprod, next))
				_exit(1);
			n++;
		} else if (api == API_PEEK) {
			const void *d;
			size_t len;

			rc = flowshm_peek(cons, &d, &len, -1);
			if (rc)
				break;
			if (rec_check(c, d, len, size, nprod, next))
				_exit(1);
			flowshm_release(cons);
			n++;
		} else if (api == API_PEEK_BATCH) {
			unsigned got;

			rc = flowshm_peek_batch(cons, recs, nb, &got, -1);
			if (rc)
				break;
			for (unsigned i = 0; i < got; i++)
				if (rec_check(c, recs[i].data, recs[i].len,
					      size, nprod, next))
					_exit(1);
			flowshm_release_batch(cons);
			n += got;
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

/*
 * The copies a record of `size` bytes costs, without the ring: a child
 * copies size-byte blocks into a shared buffer of ring_size bytes and we
 * copy them out, one index each way (release/acquire), for secs after a
 * quarter of that to warm up.  GB/s of payload.  On a KVM host the rate of
 * two processes copying through shared memory can swing several-fold with
 * where the host puts the two vCPUs, while a memcpy on one cpu does not
 * (docs/performance.md): measured right before a case, it tells which
 * mode the host was in then (it can change within a second).
 */
static double pipe_gbps(const struct opts *o, uint64_t size, double secs)
{
	struct pipe_idx {
		_Alignas(64) _Atomic uint64_t head;
		_Alignas(64) _Atomic uint64_t tail;
		_Alignas(64) _Atomic int stop;
	} *x = shared_alloc(sizeof(*x));
	uint64_t slots = o->ring_size / size, h = 0, n0 = 0, t0 = 0, t1;
	unsigned char *buf = shared_alloc(slots * size), *dst = xalloc(size);
	uint64_t warm_end = now_ns() + (uint64_t)(secs / 4 * 1e9);
	pid_t child;

	memset(buf, 0, slots * size);
	fflush(NULL);
	child = fork();
	if (child < 0)
		die("fork", 0);
	if (child == 0) {
		unsigned char *src = xalloc(size);

		if (o->pin)
			pin_to(1);
		/* acquire of head: our copy into a slot comes after the
		 * reader's copy out of it; release of tail: our copy is
		 * visible before the reader acquires the index */
		for (uint64_t t = 0; !atomic_load(&x->stop); t++) {
			while (t - atomic_load_explicit(&x->head,
					memory_order_acquire) >= slots)
				if (atomic_load(&x->stop))
					_exit(0);
			memcpy(buf + (t % slots) * size, src, size);
			atomic_store_explicit(&x->tail, t + 1,
					      memory_order_release);
		}
		_exit(0);
	}
	if (o->pin)
		pin_to(0);
	for (;;) {
		while (atomic_load_explicit(&x->tail, memory_order_acquire) == h)
			;
		memcpy(dst, buf + (h % slots) * size, size);
		__asm__ __volatile__("" : : "r"(dst) : "memory");
		atomic_store_explicit(&x->head, ++h, memory_order_release);
		t1 = now_ns();
		if (!t0 && t1 >= warm_end) {
			t0 = t1;
			n0 = h;
		} else if (t0 && t1 - t0 >= (uint64_t)(secs * 1e9)) {
			break;
		}
	}
	atomic_store(&x->stop, 1);
	waitpid(child, NULL, 0);
	if (o->pin)
		unpin();
	free(dst);
	munmap(buf, slots * size);
	munmap(x, sizeof(*x));
	return (double)((h - n0) * size) / (double)(t1 - t0);
}

static int run_tput(const struct opts *o, struct tput_case *tc)
{
	struct ctl *c = shared_alloc(sizeof(*c));
	pid_t prod[MAX_PRODUCERS], cons;
	flowshm_t *closer;
	int fd, rc, failed = 0;

	/* where the host has put our two vCPUs right now (it moves them) */
	tc->line_ns = line_rtt_ns(o, 0.02);
	if (tc->producers == 1 && tc->size >= PIPE_MIN_SIZE)
		tc->pipe_gbps = pipe_gbps(o, tc->size,
					  o->seconds / 4 < 0.1 ? 0.1 :
								o->seconds / 4);
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

/* This process's voluntary context switches so far (every thread). */
static uint64_t self_sleeps(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_nvcsw;
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
	static const char *const names[] = { "record", "batch", "peek",
					     "peekb" };

	return names[a];
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
"  --peek-batch     also read in place: peek one record at a time (peek)\n"
"                   against peek_batch (peekb), batch producer, same run\n"
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
		{ "peek-batch", no_argument, NULL, 'K' },
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
	struct tput_case cases[MAX_SIZES * (4 + 2 * MAX_MP)];
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
		case 'K': o.do_peek = true; break;
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

	if (o.do_tput || o.do_mp || o.do_peek) {
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
			if (o.do_peek) {
				cases[ncases++] = (struct tput_case){
					.size = o.sizes[i], .producers = 1,
					.api = API_PEEK };
				cases[ncases++] = (struct tput_case){
					.size = o.sizes[i], .producers = 1,
					.api = API_PEEK_BATCH };
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
				if (tc->pipe_gbps > 0)
					printf("  pipe %6.2f GB/s: %5.1f%%",
					       tc->pipe_gbps,
					       100 * tc->gb_per_s / tc->pipe_gbps);
				printf("\n");
				fflush(stdout);
			}
		}
		if (!o.json && o.do_tput)
			printf("(pipe: the same copies through a bare shared "
			       "buffer of the ring's size between two processes, "
			       "measured right before the case; records of %u B "
			       "and up)\n", PIPE_MIN_SIZE);
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
			if (tc->pipe_gbps > 0)
				printf(", \"pipe_gb_per_s\": %.4f, "
				       "\"vs_pipe\": %.4f", tc->pipe_gbps,
				       tc->gb_per_s / tc->pipe_gbps);
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

/* ---- `remote`: two moverd daemons, TCP on loopback by default ----------- */

/*
 * flowbench starts two moverd daemons itself: A (the producers' host) and B
 * (the consumers' host, listening on a free port of --addr, 127.0.0.1 by
 * default), both with --transport (tcp by default; rdma where the address
 * has an RDMA device, e.g. soft-RoCE in tests/rdma/bench-in-vm.sh), each with a
 * private control socket and state directory under a temporary directory
 * on tmpfs.  For every case it creates flows A -> B with moverctl, forks one
 * producer (attached on A) and one consumer (attached on B) per flow, and
 * destroys the flows afterwards.  Every record carries (flow id << 56 | seq)
 * in its first 8 bytes, a CLOCK_MONOTONIC send time (or 0) in the next 8,
 * and a check word in its last 8; consumers verify the length, the sequence
 * and the check word of every record.  iperf3 over loopback, in the same
 * run, is the reference for large records; sockperf's TCP ping-pong the
 * floor of the latency runs.  Both daemons listen: a ping-pong's echoes
 * travel on a flow B -> A.
 */

#define R_MAX_FLOWS 16
#define R_MAX_KIDS  (2 * R_MAX_FLOWS + 4)
#define R_LAT_MAX   (1u << 18)   /* latency samples kept per flow */
#define R_WAIT_NS   20000000ll   /* library waits: 20 ms, then look at phase */

struct ropts {
	double seconds, warmup, lat_seconds, iperf_seconds;
	uint64_t sizes[MAX_SIZES];
	unsigned nsizes;
	unsigned flows[MAX_MP];
	unsigned nflows;
	uint64_t ring_size;     /* at least; a case's ring is >= 64 records */
	unsigned batch;
	uint64_t batch_bytes;
	double pace, sparse;    /* records/s of the two latency runs */
	double pace_share;      /* paced rate <= this share of the 1-flow rate */
	bool json, do_tput, do_lat, do_iperf;
	bool do_pp;             /* ping-pong A -> B -> A (two flows) */
	bool do_scale;          /* idle flows, busy flows, create/destroy */
	uint64_t pp_size;       /* ping-pong record size */
	unsigned idle_flows, busy_flows, churn;
	double idle_seconds;    /* window of the idle CPU figure */
	double busy_rate;       /* records/s of each busy flow, 0: flat out */
	unsigned bursty;        /* of a throughput case's flows, the first
				   this many send in bursts (r_burst_wait) */
	uint64_t burst_bytes;   /* payload bytes of one burst */
	double burst_gap_us;    /* pause after a burst, 0: until drained */
	bool both_ways;         /* odd flows of a throughput case go B -> A */
	bool spin;              /* consumers poll (timeout 0) and yield */
	char poll_us[16];       /* moverd --poll-us of both daemons */
	char idle[16];          /* moverd --idle of both daemons */
	char moverd[PATH_MAX], moverctl[PATH_MAX];
	char addr[64];          /* B listens here, A's flows peer here */
	char transport[16];     /* moverd --transport: tcp, rdma or auto */
	char doorbell[16];      /* moverd --doorbell: auto, thread or poll */
	char daemon_cpus[64];   /* moverd --cpus of both daemons, "" = any */
	char client_cpus[64];   /* where producers and consumers run, "" = any */
	const char *dir_base;   /* parent of the temporary dir, or NULL */
	double counter_hz;      /* --counter-reader: reads per second, 0 = no */
};

struct latstat {
	double rate;            /* records/s offered (paced runs) */
	uint64_t n;
	double p50, p90, p99, p999, max, mean; /* ns */
};

struct rcase {
	uint64_t size, ring;
	unsigned flows;
	bool ok;
	double cpu_a, cpu_b;    /* each daemon's CPU, share of one cpu */
	double recs_per_s, gb_per_s, secs, min_flow, max_flow;
	double bursty_flow, steady_flow; /* records/s, the mean flow of each
					    kind (--bursty) */
	uint64_t recs;
	struct latstat loaded;
	char transport[16];     /* what moverctl flow show said, or "?" */
};

/* CPU time per record (per round trip in a ping-pong), us: each daemon
 * and each client process; `echo` only in a ping-pong. */
struct rcpu {
	double a, b, prod, cons, echo;
};

/* Times each process of a ping-pong went to sleep per exchange (voluntary
 * context switches: a blocking wait that slept, or a yield): moverd A, B,
 * the pinger (sockperf's client), the echo (its server). */
struct rsleeps {
	double a, b, ping, echo;
};

struct rlat {
	uint64_t size, ring;
	const char *kind;       /* "paced", "sparse", "pingpong", "sockperf" */
	bool ok;
	double cpu_a, cpu_b;
	struct latstat l;       /* one-way (paced, sparse) or round trip */
	struct rcpu per_rec;
	struct rsleeps sleeps;  /* ping-pong rows only */
	uint64_t records;       /* records (round trips) the CPU is shared by */
	char transport[16];
};

/* Per flow results, written by that flow's consumer. */
struct rflow {
	_Alignas(128) uint64_t recs, ns, total, nlat;
	double cpu_prod, cpu_cons; /* each process's CPU s once it was ready */
	uint64_t sleeps_prod, sleeps_cons; /* and its voluntary switches */
};

struct rshared {
	struct ctl c;
	struct rflow f[R_MAX_FLOWS];
	uint64_t lat[]; /* R_LAT_MAX per flow */
};

/* Everything the parent started, so that any exit can stop it. */
static struct {
	pid_t parent;
	char dir[PATH_MAX - 64];
	char sock[2][PATH_MAX];
	int port;               /* B's peer port */
	int port_a;             /* A's: flows B -> A (ping-pong replies) */
	pid_t daemon[2];
	pid_t kids[R_MAX_KIDS];
	unsigned nkids;
	bool keep_logs;
	const struct ropts *o;
	struct ctl *side;       /* set to PH_MEASURE with a throughput case's
				   window (the scale run's sparse records) */
	double busy_rate;       /* the batch producers' records/s (the scale
				   run's --busy-rate), 0: flat out */
	enum flowshm_wait client_wait; /* --client-wait of every attached end */
	cpu_set_t client_set;   /* --client-cpus parsed */
} R;

/* In a producer, consumer or echo just forked: die with the parent, and
 * run on --client-cpus. */
static void r_client_child(void)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (R.o && R.o->client_cpus[0] &&
	    sched_setaffinity(0, sizeof(R.client_set), &R.client_set))
		die("--client-cpus", -errno);
}

static int rm_entry(const char *path, const struct stat *st, int flag,
		    struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	remove(path);
	return 0;
}

static void r_print_logs(void)
{
	for (int i = 0; i < 2; i++) {
		char path[PATH_MAX + 16], line[512];
		FILE *f;

		snprintf(path, sizeof(path), "%s/moverd-%c.log", R.dir, 'a' + i);
		if (!(f = fopen(path, "re")))
			continue;
		fprintf(stderr, "---- moverd %c log ----\n", 'A' + i);
		while (fgets(line, sizeof(line), f))
			fputs(line, stderr);
		fclose(f);
	}
}

/* Reap pid, waiting at most ns; 1 if it exited (status in *st), else 0. */
static int r_wait_pid(pid_t pid, uint64_t ns, int *st)
{
	uint64_t until = now_ns() + ns;
	int s;

	for (;;) {
		pid_t r = waitpid(pid, &s, WNOHANG);

		if (r == pid || (r < 0 && errno == ECHILD)) {
			/* reaped: never signal that pid again */
			for (unsigned i = 0; i < R.nkids; i++)
				if (R.kids[i] == pid)
					R.kids[i] = 0;
			if (st)
				*st = r == pid ? s : 0;
			return 1;
		}
		if (now_ns() >= until)
			return 0;
		sleep_ns(1000000);
	}
}

static void r_kill_kids(void)
{
	for (unsigned i = 0; i < R.nkids; i++)
		if (R.kids[i] > 0) {
			kill(R.kids[i], SIGKILL);
			waitpid(R.kids[i], NULL, 0);
		}
	R.nkids = 0;
}

/* Stop everything we started: children, both daemons; remove the dir. */
static void r_cleanup(void)
{
	if (R.parent != getpid())
		return; /* a child: the parent cleans up */
	R.parent = 0;
	r_kill_kids();
	for (int i = 0; i < 2; i++)
		if (R.daemon[i] > 0)
			kill(R.daemon[i], SIGTERM);
	for (int i = 0; i < 2; i++) {
		if (R.daemon[i] <= 0)
			continue;
		if (!r_wait_pid(R.daemon[i], 3000000000ull, NULL)) {
			fprintf(stderr, "flowbench: moverd %d ignored SIGTERM, "
				"killing it\n", (int)R.daemon[i]);
			kill(R.daemon[i], SIGKILL);
			waitpid(R.daemon[i], NULL, 0);
		}
		R.daemon[i] = 0;
	}
	if (R.dir[0]) {
		if (R.keep_logs)
			r_print_logs();
		nftw(R.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
		R.dir[0] = 0;
	}
}

static void r_on_signal(int sig)
{
	r_cleanup();
	signal(sig, SIG_DFL);
	raise(sig);
}

/*
 * fork + exec argv; stdout (and stderr if err_too) to out_fd, or to
 * /dev/null if out_fd < 0.  The child dies with us (PDEATHSIG).
 */
static pid_t r_spawn(char *const argv[], int out_fd, bool err_too, int deathsig)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("fork", 0);
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		prctl(PR_SET_PDEATHSIG, deathsig);
		if (getppid() != R.parent)
			_exit(127);
		dup2(null, 0);
		dup2(out_fd >= 0 ? out_fd : null, 1);
		if (err_too)
			dup2(out_fd >= 0 ? out_fd : null, 2);
		execv(argv[0], argv);
		execvp(argv[0], argv);
		fprintf(stderr, "flowbench: cannot run %s: %s\n", argv[0],
			strerror(errno));
		_exit(127);
	}
	return pid;
}

/* Run argv to completion, its output into out (NUL-terminated); exit code
 * or -1.  Gives up (kills it) after timeout_ns. */
static int r_run(char *const argv[], char *out, size_t cap, uint64_t timeout_ns)
{
	int pfd[2], st = 0;
	size_t have = 0;
	uint64_t until = now_ns() + timeout_ns;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC))
		die("pipe", 0);
	pid = r_spawn(argv, pfd[1], true, SIGKILL);
	close(pfd[1]);
	fcntl(pfd[0], F_SETFL, O_NONBLOCK);
	for (;;) {
		char junk[4096];
		char *dst = have + 1 < cap ? out + have : junk;
		size_t room = have + 1 < cap ? cap - 1 - have : sizeof(junk);
		ssize_t n = read(pfd[0], dst, room);

		if (n > 0) {
			if (dst != junk)
				have += (size_t)n;
			continue;
		}
		if (n == 0)
			break;
		if (errno != EAGAIN && errno != EINTR)
			break;
		if (now_ns() > until) {
			kill(pid, SIGKILL);
			break;
		}
		sleep_ns(1000000);
	}
	close(pfd[0]);
	if (cap)
		out[have < cap ? have : cap - 1] = 0;
	if (!r_wait_pid(pid, until > now_ns() ? until - now_ns() : 0, &st)) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		return -1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* moverctl --socket SOCK args... (NULL-terminated); exit code. */
static int r_ctl(int daemon, char *out, size_t cap, ...)
{
	char *argv[32];
	int n = 0;
	va_list ap;

	argv[n++] = (char *)R.o->moverctl;
	argv[n++] = "--socket";
	argv[n++] = R.sock[daemon];
	va_start(ap, cap);
	while (n < 31 && (argv[n] = va_arg(ap, char *)))
		n++;
	va_end(ap);
	argv[n] = NULL;
	return r_run(argv, out, cap, 10000000000ull);
}

/* A free TCP port on addr (an IPv4 address). */
static int free_port(const char *addr)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;

	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
		errno = EINVAL;
		die(addr, 0);
	}
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    getsockname(fd, (struct sockaddr *)&sa, &len))
		die("bind to a free port", 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

/* A temporary directory, on tmpfs if there is one: moverd keeps the rings of
 * flows between hosts as files there (--state-dir), and a disk-backed file
 * system would write them back to disk during the run.  --dir BASE puts it
 * under BASE (e.g. /tmp in the soft-RoCE guest, where /tmp is tmpfs). */
static void r_make_dir(const char *base)
{
	static const char *const bases[] = { "/dev/shm", "/run", NULL };
	const char *tmp = getenv("TMPDIR");

	if (base) {
		snprintf(R.dir, sizeof(R.dir), "%s/flowbench-remote.XXXXXX",
			 base);
		if (mkdtemp(R.dir))
			return;
		R.dir[0] = 0;
		die(base, 0);
	}
	for (int i = 0; i < 3; i++) {
		const char *b = bases[i] ? bases[i] : tmp ? tmp : "/tmp";

		snprintf(R.dir, sizeof(R.dir), "%s/flowbench-remote.XXXXXX", b);
		if (mkdtemp(R.dir))
			return;
	}
	R.dir[0] = 0;
	die("mkdtemp", 0);
}

/* Both daemons prove one key (moverd --peer-key): the configuration of a
 * real cluster, and a non-loopback --addr needs one. */
static void r_write_key(char *path, size_t cap)
{
	uint8_t key[32];
	int fd;

	snprintf(path, cap, "%s/peer.key", R.dir);
	if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key))
		die("getrandom", 0);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, key, sizeof(key)) != (ssize_t)sizeof(key))
		die(path, 0);
	close(fd);
}

/*
 * --counter-reader HZ: a process that maps both daemons' counters files
 * (ipc/counters.h) and copies every record out HZ times a second, as
 * moverctl top or a Prometheus scrape would.  It dies with flowbench.
 */
static void r_counter_reader(double hz, bool json)
{
	static struct fmc_snap snap;
	const struct fmc_header *h[2];
	pid_t pid;

	for (int i = 0; i < 2; i++) {
		char path[PATH_MAX + 16];
		struct stat st;
		int fd;

		snprintf(path, sizeof(path), "%s.counters", R.sock[i]);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &st))
			die(path, 0);
		h[i] = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED,
			    fd, 0);
		close(fd);
		if (h[i] == MAP_FAILED || !fmc_valid(h[i], (size_t)st.st_size))
			die("counters file", 0);
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("fork", 0);
	if (pid) {
		if (!json)
			printf("a counter reader (pid %d) reads every record of "
			       "both counters files %.0f times a second\n",
			       (int)pid, hz);
		return;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	for (;;) {
		for (int i = 0; i < 2; i++) {
			if (atomic_load_explicit(&((struct fmc_header *)h[i])->closed,
						 memory_order_acquire))
				_exit(0);
			for (uint32_t r = 0; r < 1 + h[i]->n_flow + h[i]->n_peer; r++)
				(void)fmc_read(fmc_record(h[i], r), &snap);
		}
		sleep_ns((uint64_t)(1e9 / hz));
	}
}

static int r_start_daemons(const struct ropts *o)
{
	char listen[2][96], out[1024], key[PATH_MAX], nflows[24];

	r_write_key(key, sizeof(key));
	R.port = free_port(o->addr);
	R.port_a = free_port(o->addr);
	/* both listen: ping-pong replies are a flow B -> A */
	snprintf(listen[0], sizeof(listen[0]), "%s:%d", o->addr, R.port_a);
	snprintf(listen[1], sizeof(listen[1]), "%s:%d", o->addr, R.port);
	/* the scale run opens more flows than the defaults allow (1024 per
	 * daemon, 64 per peer host): raised here, not in moverd's defaults */
	snprintf(nflows, sizeof(nflows), "%u",
		 o->idle_flows + o->busy_flows + 64);
	for (int i = 0; i < 2; i++) {
		char state[PATH_MAX], logp[PATH_MAX];
		char *argv[32];
		int n = 0, fd;

		snprintf(R.sock[i], sizeof(R.sock[i]), "%s/%c/moverd.sock",
			 R.dir, 'a' + i);
		snprintf(state, sizeof(state), "%s/%c/rings", R.dir, 'a' + i);
		snprintf(logp, sizeof(logp), "%s/moverd-%c.log", R.dir, 'a' + i);
		fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0)
			die(logp, 0);
		argv[n++] = (char *)o->moverd;
		argv[n++] = "--foreground";
		argv[n++] = "--log-level";
		argv[n++] = getenv("FLOWBENCH_MOVERD_LOG") ?
			    getenv("FLOWBENCH_MOVERD_LOG") : "warn";
		argv[n++] = "--socket";
		argv[n++] = R.sock[i];
		argv[n++] = "--state-dir";
		argv[n++] = state;
		argv[n++] = "--transport";
		argv[n++] = (char *)o->transport;
		argv[n++] = "--doorbell";
		argv[n++] = (char *)o->doorbell;
		argv[n++] = "--poll-us";
		argv[n++] = (char *)o->poll_us;
		argv[n++] = "--idle";
		argv[n++] = (char *)o->idle;
		argv[n++] = "--peer-key";
		argv[n++] = key;
		argv[n++] = "--listen";
		argv[n++] = listen[i];
		if (o->daemon_cpus[0]) {
			argv[n++] = "--cpus";
			argv[n++] = (char *)o->daemon_cpus;
		}
		if (o->do_scale) {
			argv[n++] = "--max-flows";
			argv[n++] = nflows;
			argv[n++] = "--peer-max-flows";
			argv[n++] = nflows;
		}
		argv[n] = NULL;
		R.daemon[i] = r_spawn(argv, fd, true, SIGTERM);
		close(fd);
	}
	for (uint64_t until = now_ns() + 10000000000ull;;) {
		int ok = 0;

		for (int i = 0; i < 2; i++) {
			if (r_wait_pid(R.daemon[i], 0, NULL)) {
				R.daemon[i] = 0;
				fprintf(stderr, "flowbench: moverd %c exited at "
					"start\n", 'A' + i);
				R.keep_logs = true;
				return -1;
			}
			ok += r_ctl(i, out, sizeof(out), "status", NULL) == 0;
		}
		if (ok == 2)
			return 0;
		if (now_ns() > until) {
			fprintf(stderr, "flowbench: the daemons did not answer "
				"in 10 s: %s\n", out);
			R.keep_logs = true;
			return -1;
		}
		sleep_ns(20000000);
	}
}

/* The daemon whose host flow `id` of a case starts on: A (0), or B (1)
 * for the odd flows with --both-ways. */
static int r_src(const struct ropts *o, uint32_t id)
{
	return o->both_ways && (id & 1);
}

static int r_attach(const char *name, int daemon, enum flowshm_role role,
		    flowshm_t **out)
{
	uint64_t until = now_ns() + 10000000000ull;
	int rc;

	setenv("FLOWMOVER_SOCKET", R.sock[daemon], 1);
	/* the consumer's end exists once B has opened the flow: wait for it */
	while ((rc = flowshm_attach(name, role, NULL, out)) == -ENOENT &&
	       now_ns() < until)
		sleep_ns(2000000);
	return rc ? rc : flowshm_set_wait(*out, R.client_wait);
}

static void r_child_fail(struct ctl *c, const char *who, const char *name,
			 int rc)
{
	snprintf(c->err, sizeof(c->err), "%s of %s: %s%s%s", who, name,
		 flowshm_strerror(rc), rc == -ENOENT || rc == -ECONNREFUSED ?
		 " " : "", rc == -ENOENT || rc == -ECONNREFUSED ?
		 flowshm_attach_error() : "");
	fprintf(stderr, "flowbench: %s\n", c->err);
	_exit(1);
}

static inline void rec_time(unsigned char *p, uint64_t t)
{
	memcpy(p + 8, &t, 8);
}

/* This process's CPU time (user + system) so far, in seconds. */
static double self_cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* A paced producer: sleep until record `done` is due at `rate`/s from t0. */
static void pace_until(uint64_t t0, uint64_t done, double rate)
{
	uint64_t due = t0 + (uint64_t)((double)done * 1e9 / rate);
	struct timespec ts = { (time_t)(due / 1000000000ull),
			       (long)(due % 1000000000ull) };

	while (now_ns() < due &&
	       clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
	       EINTR)
		;
}

/* Records of one batch call of a paced batch producer: a millisecond's
 * worth at `rate`/s, at least one, at most n (rate 0: n). */
static unsigned pace_step(double rate, unsigned n)
{
	double step = rate / 1000;

	if (rate <= 0 || step >= n)
		return n;
	return step < 1 ? 1 : (unsigned)step;
}

/*
 * A bursty producer (--bursty) has sent a whole burst: pause before the
 * next one, so that its flow runs dry in between, as a flow that games
 * moverd's new-flow rule would (mover.c, activate_first).  A gap of 0
 * waits until moverd has everything it sent acknowledged (the flow is
 * certainly dry), polling the lag every 20 us.  false: the run is over.
 */
static bool r_burst_wait(const struct ropts *o, struct ctl *c, flowshm_t *p)
{
	struct flowshm_state st;

	if (o->burst_gap_us > 0) {
		sleep_ns((uint64_t)(o->burst_gap_us * 1e3));
		return phase_of(c) != PH_STOP;
	}
	while (phase_of(c) != PH_STOP) {
		if (flowshm_state(p, &st) || !st.lag_bytes)
			return true;
		sleep_ns(20000);
	}
	return false;
}

/*
 * A producer on A.  rate == 0: with flowshm_send_batch until STOP, the
 * first unsent record of each call carrying the time of the call; as fast
 * as it can, or at R.busy_rate records/s (a millisecond's worth a call).
 * rate > 0: `count` records with flowshm_send, one every 1/rate s
 * (absolute schedule), each carrying the time just before its send.
 */
static void r_producer(const struct ropts *o, struct rshared *s,
		       const char *name, uint64_t size, uint32_t id,
		       double rate, uint64_t count)
{
	struct ctl *c = &s->c;
	unsigned nb = rate > 0 ? 1 :
		      batch_records(o->batch_bytes, o->batch, size);
	unsigned char *buf = xalloc(nb * size);
	struct iovec *iov = calloc(nb, sizeof(*iov));
	uint64_t seq = 0;
	double cpu0;
	flowshm_t *p;
	int rc;

	if (rate > 0)
		fmlt_init("prod");
	if ((rc = r_attach(name, r_src(o, id), FLOWSHM_PRODUCER, &p)))
		r_child_fail(c, "producer attach", name, rc);
	for (unsigned i = 0; i < nb; i++)
		iov[i] = (struct iovec){ buf + i * size, size };
	announce_ready(c);
	while (phase_of(c) == PH_START)
		sched_yield(); /* the scale run's sparse producer waits long */
	cpu0 = self_cpu_s();
	if (rate > 0) {
		uint64_t t0 = now_ns();

		prctl(PR_SET_TIMERSLACK, 1000ul); /* 1 µs, not the 50 µs default */
		for (seq = 0; seq < count && phase_of(c) != PH_STOP;) {
			pace_until(t0, seq, rate);
			rec_stamp(buf, size, id, seq);
			rec_time(buf, now_ns());
			fmlt_mark(LT_SEND, seq);
			rc = flowshm_send(p, buf, size, R_WAIT_NS);
			if (rc == -ETIMEDOUT)
				continue; /* same seq again, new time */
			if (rc)
				break;
			seq++;
		}
	} else {
		unsigned off = nb;
		double pace = R.busy_rate; /* 0: flat out */
		uint64_t t0 = now_ns();
		bool bursty = id < o->bursty;
		uint64_t burst = bursty ? o->burst_bytes / size : 0, in_burst = 0;
		unsigned n;

		if (bursty && !burst)
			burst = 1;
		rc = 0;
		while (phase_of(c) != PH_STOP) {
			unsigned sent = 0;

			if (bursty && in_burst == burst) {
				if (!r_burst_wait(o, c, p))
					break;
				in_burst = 0;
			}

			if (off == nb) {
				for (unsigned i = 0; i < nb; i++) {
					rec_stamp(buf + i * size, size, id,
						  seq + i);
					rec_time(buf + i * size, 0);
				}
				off = 0;
			}
			if (pace > 0)
				pace_until(t0, seq + off, pace);
			rec_time(buf + off * size, now_ns());
			n = pace_step(pace, nb - off);
			if (bursty && n > burst - in_burst)
				n = (unsigned)(burst - in_burst);
			rc = flowshm_send_batch(p, iov + off, n, &sent,
						R_WAIT_NS);
			in_burst += sent;
			if (rc == -ETIMEDOUT)
				continue;
			if (rc)
				break;
			off += sent;
			if (off == nb)
				seq += nb;
		}
	}
	s->f[id].cpu_prod = self_cpu_s() - cpu0;
	fmlt_dump();
	flowshm_detach(p);
	if (rc && rc != -ETIMEDOUT && !(rc == -EPIPE &&
					phase_of(c) == PH_STOP)) {
		snprintf(c->err, sizeof(c->err), "producer of %s: %s", name,
			 flowshm_strerror(rc));
		fprintf(stderr, "flowbench: %s\n", c->err);
		_exit(1);
	}
	_exit(0);
}

/*
 * A consumer on B.  Verifies every record.  count == 0: counts records
 * between MEASURE and STOP as it sees them, and samples the latency of the
 * timestamped ones in that window.  count > 0 (paced): receives exactly
 * `count` records and keeps the latency of those after the first `skip`.
 */
static void r_consumer(const struct ropts *o, struct rshared *s,
		       const char *name, uint64_t size, uint32_t id,
		       uint64_t count, uint64_t skip)
{
	struct ctl *c = &s->c;
	struct rflow *rf = &s->f[id];
	uint64_t *lat = s->lat + (size_t)id * R_LAT_MAX;
	unsigned nb = count ? 1 :
		      batch_records(o->batch_bytes, o->batch, size);
	size_t cap = nb * ((size + 7) & ~(uint64_t)7);
	unsigned char *buf = xalloc(cap);
	struct iovec *iov = calloc(nb, sizeof(*iov));
	uint64_t next[MAX_PRODUCERS] = { 0 };
	uint64_t n = 0, n0 = 0, t0 = 0, nlat = 0;
	enum phase seen = PH_START;
	double cpu0;
	flowshm_t *cons;
	int rc;

	if (count)
		fmlt_init("cons");
	if ((rc = r_attach(name, !r_src(o, id), FLOWSHM_CONSUMER, &cons)))
		r_child_fail(c, "consumer attach", name, rc);
	/* rec_check: ids below nprod are valid, our producer's id is `id` */
	announce_ready(c);
	cpu0 = self_cpu_s();
	for (;;) {
		enum phase ph = phase_of(c);
		unsigned got = 0;

		track_window(ph, &seen, n, &n0, &t0, &rf->recs, &rf->ns);
		if (ph == PH_STOP || (count && n == count))
			break;
		rc = flowshm_recv_batch(cons, buf, cap, iov, nb, &got,
					o->spin ? 0 : R_WAIT_NS);
		if (rc == -EAGAIN && o->spin) {
			sched_yield();
			continue;
		}
		if (rc == -ETIMEDOUT)
			continue;
		if (rc)
			break;
		for (unsigned i = 0; i < got; i++) {
			const unsigned char *p = iov[i].iov_base;
			uint64_t ts;

			if (rec_check(c, p, iov[i].iov_len, size, id + 1,
				      next)) {
				fprintf(stderr, "flowbench: consumer of %s: "
					"%s\n", name, c->err);
				_exit(1);
			}
			memcpy(&ts, p + 8, 8);
			fmlt_mark(LT_GOT, ts);
			if (ts && nlat < R_LAT_MAX &&
			    (count ? n + i >= skip : seen == PH_MEASURE))
				lat[nlat++] = now_ns() - ts;
		}
		n += got;
	}
	rf->total = n;
	rf->nlat = nlat;
	rf->cpu_cons = self_cpu_s() - cpu0;
	fmlt_dump();
	flowshm_detach(cons);
	if (rc && rc != -ETIMEDOUT) {
		snprintf(c->err, sizeof(c->err), "consumer of %s: %s after "
			 "%" PRIu64 " records", name, flowshm_strerror(rc), n);
		fprintf(stderr, "flowbench: %s\n", c->err);
		_exit(1);
	}
	if (!count && !rf->ns) {
		snprintf(c->err, sizeof(c->err), "consumer of %s missed the "
			 "window (%" PRIu64 " records)", name, n);
		_exit(1);
	}
	_exit(0);
}

static void lat_stats(uint64_t *v, uint64_t n, struct latstat *l)
{
	double sum = 0;

	l->n = n;
	if (!n)
		return;
	qsort(v, n, sizeof(*v), cmp_u64);
	for (uint64_t i = 0; i < n; i++)
		sum += (double)v[i];
	l->mean = sum / (double)n;
	l->p50 = (double)v[n / 2];
	l->p90 = (double)v[n * 9 / 10];
	l->p99 = (double)v[n * 99 / 100];
	l->p999 = (double)v[n * 999 / 1000];
	l->max = (double)v[n - 1];
}

/* CPU seconds a running child has used so far (/proc/PID/stat). */
static double proc_cpu_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "re")))
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* fields after "(comm)": state is 3rd, utime 14th, stime 15th */
	if (!(p = strrchr(buf, ')')) ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
		   &ut, &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A running child's voluntary context switches so far, summed over its
 * threads (/proc/PID/status counts only the thread it names). */
static uint64_t proc_sleeps(pid_t pid)
{
	char path[32], line[128];
	uint64_t sum = 0, v;
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return 0;
	while ((e = readdir(d))) {
		char st[sizeof(path) + sizeof(e->d_name) + 8];
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(st, sizeof(st), "%s/%s/status", path, e->d_name);
		if (!(f = fopen(st, "re")))
			continue;
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "voluntary_ctxt_switches: %" SCNu64,
				   &v) == 1)
				sum += v;
		fclose(f);
	}
	closedir(d);
	return sum;
}

static uint64_t pow2_at_least(uint64_t v)
{
	uint64_t p = 4096;

	while (p < v)
		p <<= 1;
	return p;
}

static unsigned r_case_no;

/*
 * One case: `flows` flows of `size`-byte records.  rate == 0: throughput
 * (results into tc); rate > 0: one paced latency run (results into lr).
 */
static int r_run_case(const struct ropts *o, uint64_t size, unsigned flows,
		      double rate, struct rcase *tc, struct rlat *lr)
{
	size_t bytes = sizeof(struct rshared) +
		       (size_t)flows * R_LAT_MAX * sizeof(uint64_t);
	struct rshared *s = shared_alloc(bytes);
	uint64_t ring = pow2_at_least(o->ring_size > 64 * size ?
				      o->ring_size : 64 * size);
	uint64_t count = 0, skip = 0, all = 0, nlat = 0;
	char names[R_MAX_FLOWS][32], rs[32], mr[32], peer[2][96], out[2048];
	char transport[16] = "?";
	pid_t cons[R_MAX_FLOWS], prod[R_MAX_FLOWS];
	unsigned created = 0, i;
	int failed = 0;
	double cpu0[2] = { 0, 0 }, cpu1[2] = { 0, 0 };
	uint64_t w0 = now_ns(), w1 = w0;

	r_case_no++;
	snprintf(rs, sizeof(rs), "%" PRIu64, ring);
	snprintf(mr, sizeof(mr), "%" PRIu64, size);
	snprintf(peer[0], sizeof(peer[0]), "%s:%d", o->addr, R.port);
	snprintf(peer[1], sizeof(peer[1]), "%s:%d", o->addr, R.port_a);
	if (rate > 0) {
		skip = (uint64_t)(rate * o->warmup);
		count = skip + (uint64_t)(rate * o->lat_seconds);
		if (count - skip > R_LAT_MAX)
			count = skip + R_LAT_MAX;
	}
	for (i = 0; i < flows; i++) {
		snprintf(names[i], sizeof(names[i]), "fb%u-%u", r_case_no, i);
		if (r_ctl(r_src(o, i), out, sizeof(out), "flow", "create",
			  names[i], "--peer", peer[r_src(o, i)], "--ring-size",
			  rs, "--max-record", mr, NULL)) {
			fprintf(stderr, "flowbench: moverctl flow create %s: "
				"%s", names[i], out);
			failed = 1;
			goto out;
		}
		created++;
	}
	for (i = 0; i < flows; i++) {
		fflush(NULL);
		if ((cons[i] = fork()) < 0)
			die("fork", 0);
		if (cons[i] == 0) {
			r_client_child();
			r_consumer(o, s, names[i], size, i, count, skip);
		}
		R.kids[R.nkids++] = cons[i];
		if ((prod[i] = fork()) < 0)
			die("fork", 0);
		if (prod[i] == 0) {
			r_client_child();
			r_producer(o, s, names[i], size, i, rate, count);
		}
		R.kids[R.nkids++] = prod[i];
	}
	for (uint64_t until = now_ns() + 15000000000ull;
	     atomic_load_explicit(&s->c.ready, memory_order_acquire) <
	     (int)(2 * flows);) {
		if (now_ns() > until || s->c.err[0]) {
			fprintf(stderr, "flowbench: producers and consumers "
				"did not attach in 15 s%s%s\n",
				s->c.err[0] ? ": " : "", s->c.err);
			failed = 1;
			goto out;
		}
		sleep_ns(1000000);
	}
	w0 = now_ns();
	for (int d = 0; d < 2; d++)
		cpu0[d] = proc_cpu_s(R.daemon[d]);
	if (rate > 0) {
		/* go; the consumers exit once they have every record */
		uint64_t expect = (uint64_t)((double)count / rate * 1e9);

		set_phase(&s->c, PH_MEASURE);
		for (i = 0; i < flows; i++) {
			int st;

			if (!r_wait_pid(cons[i], expect + 5000000000ull, &st) ||
			    !WIFEXITED(st) || WEXITSTATUS(st)) {
				fprintf(stderr, "flowbench: latency run, %s: "
					"consumer %s%s\n", names[i],
					s->c.err[0] ? "failed: " : "hung",
					s->c.err);
				failed = 1;
			}
			cons[i] = 0;
		}
		set_phase(&s->c, PH_STOP);
	} else {
		set_phase(&s->c, PH_WARM);
		sleep_ns((uint64_t)(o->warmup * 1e9));
		set_phase(&s->c, PH_MEASURE);
		if (R.side)
			set_phase(R.side, PH_MEASURE);
		w0 = now_ns();
		for (int d = 0; d < 2; d++)
			cpu0[d] = proc_cpu_s(R.daemon[d]);
		sleep_ns((uint64_t)(o->seconds * 1e9));
		set_phase(&s->c, PH_STOP);
	}
	w1 = now_ns();
	for (int d = 0; d < 2; d++)
		cpu1[d] = (proc_cpu_s(R.daemon[d]) - cpu0[d]) /
			  ((double)(w1 - w0) / 1e9);
	for (i = 0; i < flows; i++) {
		pid_t who[2] = { prod[i], cons[i] };

		for (int k = 0; k < 2; k++) {
			int st;

			if (!who[k])
				continue;
			if (!r_wait_pid(who[k], 10000000000ull, &st)) {
				fprintf(stderr, "flowbench: %s of %s hung\n",
					k ? "consumer" : "producer", names[i]);
				failed = 1;
			} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				fprintf(stderr, "flowbench: %s of %s failed "
					"(%s %d)%s%s\n",
					k ? "consumer" : "producer", names[i],
					WIFSIGNALED(st) ? "signal" : "status",
					WIFSIGNALED(st) ? WTERMSIG(st) :
							  WEXITSTATUS(st),
					s->c.err[0] ? ": " : "", s->c.err);
				failed = 1;
			}
		}
	}
out:
	r_kill_kids(); /* whatever is left (only after a failure) */
	/* the transport the first flow actually ran on (A's view) */
	if (created && r_ctl(0, out, sizeof(out), "flow", "show", names[0],
			     NULL) == 0) {
		const char *t = strstr(out, "\ntransport:");

		if (t && sscanf(t + 11, " %15s", transport) != 1)
			snprintf(transport, sizeof(transport), "?");
	}
	for (i = 0; i < created; i++)
		if (r_ctl(r_src(o, i), out, sizeof(out), "flow", "destroy",
			  names[i], NULL)) {
			fprintf(stderr, "flowbench: moverctl flow destroy %s: "
				"%s", names[i], out);
			failed = 1;
		}
	/* pack every flow's samples together */
	for (i = 0; i < flows && !failed; i++) {
		uint64_t k = s->f[i].nlat;

		memmove(s->lat + nlat, s->lat + (size_t)i * R_LAT_MAX,
			k * sizeof(uint64_t));
		nlat += k;
		all += s->f[i].total;
	}
	if (rate > 0) {
		*lr = (struct rlat){ .size = size, .ring = ring, .ok = !failed,
				     .cpu_a = cpu1[0], .cpu_b = cpu1[1] };
		memcpy(lr->transport, transport, sizeof(transport));
		lr->l.rate = rate;
		if (!failed)
			lat_stats(s->lat, nlat, &lr->l);
		if (!failed && count) {
			double win = (double)(w1 - w0) / 1e9;
			double recs = (double)(count * flows) / 1e6; /* -> us */

			lr->records = count * flows;
			lr->per_rec.a = cpu1[0] * win / recs;
			lr->per_rec.b = cpu1[1] * win / recs;
			for (i = 0; i < flows; i++) {
				lr->per_rec.prod += s->f[i].cpu_prod / recs;
				lr->per_rec.cons += s->f[i].cpu_cons / recs;
			}
		}
		if (!failed && all != count * flows) {
			fprintf(stderr, "flowbench: latency run got %" PRIu64
				" records of %" PRIu64 "\n", all, count * flows);
			lr->ok = false;
			failed = 1;
		}
	} else {
		*tc = (struct rcase){ .size = size, .ring = ring,
				      .flows = flows, .ok = !failed,
				      .cpu_a = cpu1[0], .cpu_b = cpu1[1] };
		memcpy(tc->transport, transport, sizeof(transport));
		for (i = 0; i < flows && !failed; i++) {
			double r = s->f[i].ns ? (double)s->f[i].recs * 1e9 /
						(double)s->f[i].ns : 0;

			tc->recs += s->f[i].recs;
			tc->secs += s->f[i].ns / 1e9 / flows;
			tc->recs_per_s += r;
			if (i < o->bursty)
				tc->bursty_flow += r / (o->bursty < flows ?
							o->bursty : flows);
			else if (o->bursty < flows)
				tc->steady_flow += r / (flows - o->bursty);
			if (!i || r < tc->min_flow)
				tc->min_flow = r;
			if (r > tc->max_flow)
				tc->max_flow = r;
		}
		tc->gb_per_s = tc->recs_per_s * (double)size / 1e9;
		for (i = 0; i < flows && !failed; i++)
			if (!s->f[i].recs) {
				fprintf(stderr, "flowbench: %" PRIu64 " B, %u "
					"flow%s: flow %s delivered no record in "
					"%.1f s (moverd did not move it)\n",
					size, flows, flows > 1 ? "s" : "",
					names[i], o->seconds);
				tc->ok = false;
				failed = 1;
			}
		if (!failed)
			lat_stats(s->lat, nlat, &tc->loaded);
	}
	munmap(s, bytes);
	return failed ? -1 : 0;
}

/* iperf3 to --addr (loopback by default), one TCP stream: bits/s, or < 0. */
static double r_iperf(const struct ropts *o, char *why, size_t whylen)
{
	char port[16], secs[16], *out = malloc(1 << 20);
	char *srv_argv[] = { "iperf3", "-s", "-1", "-p", port, NULL };
	char *cli_argv[] = { "iperf3", "-c", (char *)o->addr, "-p", port,
			     "-t", secs, "-J", NULL };
	double bps = -1;
	pid_t srv;
	int rc = -1;

	snprintf(port, sizeof(port), "%d", free_port(o->addr));
	snprintf(secs, sizeof(secs), "%g", o->iperf_seconds);
	srv = r_spawn(srv_argv, -1, true, SIGKILL);
	R.kids[R.nkids++] = srv;
	for (int tries = 0; tries < 50; tries++) {
		sleep_ns(100000000);
		if (r_wait_pid(srv, 0, NULL)) {
			snprintf(why, whylen, "the iperf3 server exited");
			free(out);
			return -1;
		}
		rc = r_run(cli_argv, out, 1 << 20,
			   (uint64_t)((o->iperf_seconds + 20) * 1e9));
		if (rc == 0 || !strstr(out, "connect"))
			break;
	}
	if (rc == 0) {
		/* "end": { ... "sum_received": { ... "bits_per_second": X */
		char *e = strstr(out, "\"end\"");
		char *r = e ? strstr(e, "\"sum_received\"") : NULL;
		char *b = r ? strstr(r, "\"bits_per_second\"") : NULL;

		if (b && (b = strchr(b, ':')))
			bps = strtod(b + 1, NULL);
		if (bps <= 0)
			snprintf(why, whylen, "no end.sum_received."
				 "bits_per_second in iperf3's JSON");
	} else {
		snprintf(why, whylen, "iperf3 -c failed (%d): %.200s", rc, out);
	}
	r_kill_kids();
	free(out);
	return bps;
}

static void json_lat(const struct latstat *l);

/* ---- `remote`: ping-pong A -> B -> A ------------------------------------- */

/*
 * Receive one record, waiting up to timeout_ns: in the library's wait, or
 * (spin) polling with timeout 0 and sched_yield between empty polls.
 */
static int r_recv_wait(flowshm_t *f, void *buf, size_t cap, size_t *len,
		       bool spin, int64_t timeout_ns)
{
	uint64_t until;
	int rc;

	if (!spin)
		return flowshm_recv(f, buf, cap, len, timeout_ns);
	until = now_ns() + (uint64_t)timeout_ns;
	while ((rc = flowshm_recv(f, buf, cap, len, 0)) == -EAGAIN) {
		if (now_ns() >= until)
			return -ETIMEDOUT;
		sched_yield();
	}
	return rc;
}

/*
 * The pinger, on A: sends a record on `ping` (A -> B), waits for the echo
 * on `pong` (B -> A), checks it is the same record, and keeps the round
 * trip of every exchange after the warm-up, for --warmup + --lat-seconds.
 * Results in s->f[0]: total round trips, nlat samples, cpu_prod.
 */
static void r_pinger(const struct ropts *o, struct rshared *s,
		     const char *ping, const char *pong, uint64_t size)
{
	struct ctl *c = &s->c;
	struct rflow *rf = &s->f[0];
	unsigned char *sbuf = xalloc(size), *rbuf = xalloc(size);
	uint64_t next = 0, seq = 0, nlat = 0, t_warm, t_end, sleeps0;
	flowshm_t *out, *in;
	double cpu0;
	int rc = 0;

	fmlt_init("pinger");
	if ((rc = r_attach(ping, 0, FLOWSHM_PRODUCER, &out)))
		r_child_fail(c, "pinger attach", ping, rc);
	if ((rc = r_attach(pong, 0, FLOWSHM_CONSUMER, &in)))
		r_child_fail(c, "pinger attach", pong, rc);
	announce_ready(c);
	while (phase_of(c) == PH_START)
		sleep_ns(100000);
	cpu0 = self_cpu_s();
	sleeps0 = self_sleeps();
	t_warm = now_ns() + (uint64_t)(o->warmup * 1e9);
	t_end = t_warm + (uint64_t)(o->lat_seconds * 1e9);
	for (;;) {
		uint64_t t0 = now_ns(), t1;
		size_t len = 0;

		if (t0 >= t_end || phase_of(c) == PH_STOP)
			break;
		rec_stamp(sbuf, size, 0, seq++);
		rec_time(sbuf, t0);
		fmlt_mark(LT_PING_SEND, seq);
		/* 5 s: a mover that lost the record fails the run, not hangs */
		if ((rc = flowshm_send(out, sbuf, size, 5000000000ll)))
			break;
		fmlt_mark(LT_PING_SENT, seq);
		if ((rc = r_recv_wait(in, rbuf, size, &len, o->spin,
				      5000000000ll)))
			break;
		t1 = now_ns();
		fmlt_mark(LT_PING_GOT, seq);
		if (rec_check(c, rbuf, len, size, 1, &next)) {
			fprintf(stderr, "flowbench: pinger: echo of %s: %s\n",
				ping, c->err);
			_exit(1);
		}
		if (t0 >= t_warm && nlat < R_LAT_MAX)
			s->lat[nlat++] = t1 - t0;
	}
	rf->cpu_prod = self_cpu_s() - cpu0;
	rf->sleeps_prod = self_sleeps() - sleeps0;
	fmlt_dump();
	rf->total = next;
	rf->nlat = nlat;
	flowshm_detach(out);
	flowshm_detach(in);
	if (rc) {
		snprintf(c->err, sizeof(c->err), "pinger, round trip %" PRIu64
			 ": %s", seq, flowshm_strerror(rc));
		fprintf(stderr, "flowbench: %s\n", c->err);
		_exit(1);
	}
	_exit(0);
}

/* The echo, on B: every record of `ping` back on `pong`, unchanged, until
 * STOP.  Its CPU time in s->f[0].cpu_cons. */
static void r_echo(const struct ropts *o, struct rshared *s, const char *ping,
		   const char *pong, uint64_t size)
{
	struct ctl *c = &s->c;
	unsigned char *buf = xalloc(size);
	flowshm_t *in, *out;
	uint64_t sleeps0;
	double cpu0;
	int rc;

	fmlt_init("echo");
	if ((rc = r_attach(ping, 1, FLOWSHM_CONSUMER, &in)))
		r_child_fail(c, "echo attach", ping, rc);
	if ((rc = r_attach(pong, 1, FLOWSHM_PRODUCER, &out)))
		r_child_fail(c, "echo attach", pong, rc);
	announce_ready(c);
	cpu0 = self_cpu_s();
	sleeps0 = self_sleeps();
	for (;;) {
		size_t len = 0;

		rc = r_recv_wait(in, buf, size, &len, o->spin, R_WAIT_NS);
		if (rc == -ETIMEDOUT) {
			if (phase_of(c) == PH_STOP)
				break;
			continue;
		}
		fmlt_mark(LT_ECHO_GOT, 0);
		if (rc || (rc = flowshm_send(out, buf, len, 5000000000ll)))
			break;
		fmlt_mark(LT_ECHO_SENT, 0);
	}
	s->f[0].cpu_cons = self_cpu_s() - cpu0;
	s->f[0].sleeps_cons = self_sleeps() - sleeps0;
	fmlt_dump();
	flowshm_detach(in);
	flowshm_detach(out);
	if (rc && rc != -ETIMEDOUT && !(rc == -EPIPE &&
					phase_of(c) == PH_STOP)) {
		fprintf(stderr, "flowbench: echo of %s: %s\n", ping,
			flowshm_strerror(rc));
		_exit(1);
	}
	_exit(0);
}

static pid_t r_fork_kid(void)
{
	pid_t pid;

	fflush(NULL);
	if ((pid = fork()) < 0)
		die("fork", 0);
	if (pid == 0)
		r_client_child();
	else
		R.kids[R.nkids++] = pid;
	return pid;
}

/* Wait up to 15 s until n children announced they are ready. */
static int r_wait_ready(struct ctl *c, int n)
{
	for (uint64_t until = now_ns() + 15000000000ull;
	     atomic_load_explicit(&c->ready, memory_order_acquire) < n;) {
		if (now_ns() > until || c->err[0]) {
			fprintf(stderr, "flowbench: clients did not attach in "
				"15 s%s%s\n", c->err[0] ? ": " : "", c->err);
			return -1;
		}
		sleep_ns(1000000);
	}
	return 0;
}

/*
 * One ping-pong run: flow ppN-ab (A -> B) carries the pings, flow ppN-ba
 * (B -> A, created on B) the echoes.  Round trips in lr->l; CPU per round
 * trip of A, B, the pinger (prod) and the echo process.
 */
static int r_run_pingpong(const struct ropts *o, uint64_t size,
			  struct rlat *lr)
{
	size_t bytes = sizeof(struct rshared) + R_LAT_MAX * sizeof(uint64_t);
	struct rshared *s = shared_alloc(bytes);
	uint64_t ring = pow2_at_least(o->ring_size > 64 * size ?
				      o->ring_size : 64 * size);
	char ping[32], pong[32], rs[32], mr[32], peer[2][96], out[2048];
	double cpu0[2] = { 0, 0 }, cpu1[2] = { 0, 0 };
	uint64_t w0 = 0, w1 = 0, total, sl0[2] = { 0, 0 }, sl1[2] = { 0, 0 };
	pid_t pinger, echo;
	int failed = 0, st;
	bool made[2] = { false, false };

	r_case_no++;
	*lr = (struct rlat){ .size = size, .ring = ring, .kind = "pingpong" };
	snprintf(lr->transport, sizeof(lr->transport), "?");
	snprintf(ping, sizeof(ping), "pp%u-ab", r_case_no);
	snprintf(pong, sizeof(pong), "pp%u-ba", r_case_no);
	snprintf(rs, sizeof(rs), "%" PRIu64, ring);
	snprintf(mr, sizeof(mr), "%" PRIu64, size);
	snprintf(peer[0], sizeof(peer[0]), "%s:%d", o->addr, R.port);
	snprintf(peer[1], sizeof(peer[1]), "%s:%d", o->addr, R.port_a);
	for (int d = 0; d < 2; d++) {
		const char *name = d ? pong : ping;

		if (r_ctl(d, out, sizeof(out), "flow", "create", name, "--peer",
			  peer[d], "--ring-size", rs, "--max-record", mr,
			  NULL)) {
			fprintf(stderr, "flowbench: moverctl flow create %s: "
				"%s", name, out);
			failed = 1;
			goto out;
		}
		made[d] = true;
	}
	if ((echo = r_fork_kid()) == 0)
		r_echo(o, s, ping, pong, size);
	if ((pinger = r_fork_kid()) == 0)
		r_pinger(o, s, ping, pong, size);
	if (r_wait_ready(&s->c, 2)) {
		failed = 1;
		goto out;
	}
	w0 = now_ns();
	for (int d = 0; d < 2; d++) {
		cpu0[d] = proc_cpu_s(R.daemon[d]);
		sl0[d] = proc_sleeps(R.daemon[d]);
	}
	set_phase(&s->c, PH_MEASURE);
	if (!r_wait_pid(pinger, (uint64_t)((o->warmup + o->lat_seconds + 10)
					   * 1e9), &st) ||
	    !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "flowbench: ping-pong: the pinger %s%s\n",
			s->c.err[0] ? "failed: " : "hung", s->c.err);
		failed = 1;
	}
	w1 = now_ns();
	for (int d = 0; d < 2; d++) {
		cpu1[d] = proc_cpu_s(R.daemon[d]) - cpu0[d];
		sl1[d] = proc_sleeps(R.daemon[d]) - sl0[d];
	}
	set_phase(&s->c, PH_STOP);
	if (!r_wait_pid(echo, 10000000000ull, &st) || !WIFEXITED(st) ||
	    WEXITSTATUS(st)) {
		fprintf(stderr, "flowbench: ping-pong: the echo process "
			"failed\n");
		failed = 1;
	}
out:
	r_kill_kids();
	if (made[0] && r_ctl(0, out, sizeof(out), "flow", "show", ping,
			     NULL) == 0) {
		const char *t = strstr(out, "\ntransport:");

		if (t && sscanf(t + 11, " %15s", lr->transport) != 1)
			snprintf(lr->transport, sizeof(lr->transport), "?");
	}
	for (int d = 0; d < 2; d++)
		if (made[d] && r_ctl(d, out, sizeof(out), "flow", "destroy",
				     d ? pong : ping, NULL)) {
			fprintf(stderr, "flowbench: moverctl flow destroy: %s",
				out);
			failed = 1;
		}
	total = s->f[0].total;
	lr->ok = !failed && total && s->f[0].nlat;
	if (lr->ok) {
		double win = (double)(w1 - w0) / 1e9, n = (double)total / 1e6;

		lat_stats(s->lat, s->f[0].nlat, &lr->l);
		lr->l.rate = (double)total / win;
		lr->records = total;
		lr->cpu_a = cpu1[0] / win;
		lr->cpu_b = cpu1[1] / win;
		lr->per_rec = (struct rcpu){ .a = cpu1[0] / n,
					     .b = cpu1[1] / n,
					     .prod = s->f[0].cpu_prod / n,
					     .echo = s->f[0].cpu_cons / n };
		lr->sleeps = (struct rsleeps){
			.a = (double)sl1[0] / (double)total,
			.b = (double)sl1[1] / (double)total,
			.ping = (double)s->f[0].sleeps_prod / (double)total,
			.echo = (double)s->f[0].sleeps_cons / (double)total };
	}
	munmap(s, bytes);
	return lr->ok ? 0 : -1;
}

/* ---- sockperf: one bare TCP hop, the floor ------------------------------- */

static bool in_path(const char *prog)
{
	const char *path = getenv("PATH");
	char dir[PATH_MAX + 64];

	for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
		size_t n = strcspn(p, ":");

		snprintf(dir, sizeof(dir), "%.*s/%s", (int)n, p, prog);
		if (!access(dir, X_OK))
			return true;
		p += n + (p[n] == ':');
	}
	return false;
}

/* The number after `key` in sockperf's output (us -> ns), or -1. */
static double sp_value(const char *out, const char *key, double scale)
{
	const char *p = strstr(out, key);

	return p ? strtod(p + strlen(key), NULL) * scale : -1;
}

/* "Total N observations" (the line starts with a colour escape). */
static uint64_t sp_observations(const char *out)
{
	const char *p = strstr(out, " observations");

	if (!p)
		return 0;
	while (p > out && p[-1] >= '0' && p[-1] <= '9')
		p--;
	return strtoull(p, NULL, 10);
}

/*
 * sockperf's TCP ping-pong over --addr with size-byte messages (blocking
 * sockets, or --nonblocked: both ends poll), flat out or, with mps > 0,
 * that many exchanges a second (--mps: the gaps of the sparse run):
 * round-trip percentiles in lr->l (ns), CPU per round trip of its client
 * (prod) and server (echo).  0, or -1 and why.
 */
static int r_sockperf(const struct ropts *o, uint64_t size, bool nonblocked,
		      double mps, struct rlat *lr, char *why, size_t whylen)
{
	char port[16], secs[16], msz[24], rate[24], *out = malloc(1 << 20);
	char *nb = nonblocked ? "--nonblocked" : NULL;
	char *srv_argv[] = { "sockperf", "sr", "--tcp", "-i", (char *)o->addr,
			     "-p", port, nb, NULL };
	char *cli_argv[] = { "sockperf", "pp", "--tcp", "-i", (char *)o->addr,
			     "-p", port, "-t", secs, "-m", msz, "--full-rtt",
			     nb ? nb : mps > 0 ? "--mps" : NULL,
			     nb ? NULL : rate, NULL }; /* not both */
	struct rusage ru0, ru1;
	double srv_cpu, sent;
	uint64_t srv_sleeps;
	pid_t srv;
	int rc = -1;

	*lr = (struct rlat){ .size = size, .kind = nonblocked ?
			     "sockperf-nonblocked" : mps > 0 ?
			     "sockperf-sparse" : "sockperf" };
	snprintf(rate, sizeof(rate), "%.0f", mps);
	snprintf(lr->transport, sizeof(lr->transport), "tcp");
	if (!in_path("sockperf")) {
		snprintf(why, whylen, "sockperf is not installed (Debian: "
			 "apt-get install sockperf): no floor, no ratios");
		free(out);
		return -1;
	}
	snprintf(port, sizeof(port), "%d", free_port(o->addr));
	snprintf(secs, sizeof(secs), "%d",
		 (int)(o->warmup + o->lat_seconds + 0.999));
	snprintf(msz, sizeof(msz), "%" PRIu64, size < 14 ? 14 : size);
	srv = r_spawn(srv_argv, -1, true, SIGKILL);
	R.kids[R.nkids++] = srv;
	getrusage(RUSAGE_CHILDREN, &ru0);
	/* until its server listens: a client that cannot connect may still
	 * exit 0 (sockperf 3.7 with --mps, in the soft-RoCE guest) */
	for (int tries = 0;
	     tries < 20 && (rc || !strstr(out, "percentile 50.000 ="));
	     tries++) {
		sleep_ns(200000000);
		if (r_wait_pid(srv, 0, NULL)) {
			snprintf(why, whylen, "the sockperf server exited");
			break;
		}
		rc = r_run(cli_argv, out, 1 << 20,
			   (uint64_t)((o->lat_seconds + 30) * 1e9));
	}
	getrusage(RUSAGE_CHILDREN, &ru1);
	srv_cpu = proc_cpu_s(srv);
	srv_sleeps = proc_sleeps(srv);
	r_kill_kids();
	sent = sp_value(out, "SentMessages=", 1);
	lr->l.p50 = sp_value(out, "percentile 50.000 =", 1e3);
	lr->l.p90 = sp_value(out, "percentile 90.000 =", 1e3);
	lr->l.p99 = sp_value(out, "percentile 99.000 =", 1e3);
	lr->l.p999 = sp_value(out, "percentile 99.900 =", 1e3);
	lr->l.max = sp_value(out, "<MAX> observation =", 1e3);
	lr->l.mean = sp_value(out, "avg-rtt=", 1e3);
	lr->l.n = sp_observations(out);
	if (rc || lr->l.p50 <= 0 || lr->l.p99 <= 0 || sent <= 0) {
		if (!why[0])
			snprintf(why, whylen, "sockperf pp failed (%d) or its "
				 "output had no percentiles: %.300s", rc, out);
		free(out);
		return -1;
	}
	lr->ok = true;
	lr->records = (uint64_t)sent;
	lr->l.rate = sent / atof(secs);
	lr->per_rec.prod = ((double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
			    (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
			    (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec +
			     ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6) /
			   sent * 1e6;
	lr->per_rec.echo = srv_cpu / sent * 1e6;
	lr->sleeps = (struct rsleeps){
		.ping = (double)(ru1.ru_nvcsw - ru0.ru_nvcsw) / sent,
		.echo = (double)srv_sleeps / sent };
	free(out);
	return 0;
}

/* ---- `remote --only scale`: many idle flows, a few busy ones ------------- */

/* What moverd holds: open fds and resident set (KiB). */
struct rmem {
	int fds;
	long rss_kb;
};

static struct rmem proc_mem(pid_t pid)
{
	struct rmem m = { -1, -1 };
	char path[64], line[256];
	struct dirent *e;
	DIR *dir;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if ((dir = opendir(path))) {
		for (m.fds = 0; (e = readdir(dir));)
			m.fds += e->d_name[0] != '.';
		closedir(dir);
	}
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "re"))) {
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "VmRSS: %ld", &m.rss_kb) == 1)
				break;
		fclose(f);
	}
	return m;
}

enum { MEM_START, MEM_IDLE_OPEN, MEM_BEFORE_CHURN, MEM_AFTER_CHURN, MEM_N };

#define SCALE_BELL 120u /* idle flows that still fit moverd's doorbell */

struct rscale {
	bool ok;
	double create_s, churn_s;       /* idle flows created; churn loop */
	double idle0[2], idle[2];       /* CPU share: no flows; idle flows */
	struct rcase alone, with;       /* busy flows alone; with idle open */
	/* with SCALE_BELL idle flows, below the doorbell's limit (moverd
	 * polls every 1 ms past 127 sender flows): the same figures */
	bool bell_step;
	double idle_bell[2];
	struct rcase with_bell;
	struct rlat sparse_bell;
	struct rlat sparse_alone;       /* on one more flow, busy ones running */
	/* sparse records with nothing busy: on the only flow, on an idle flow
	 * of SCALE_BELL, on an idle flow of N (past the doorbell: 1 ms polls) */
	struct rlat quiet0, quiet_bell, quiet;
	struct rlat sparse;             /* on an idle flow, busy ones running */
	char sparse_flow[32];
	struct rmem mem[MEM_N][2];
};

/* Each daemon's CPU share over the next `secs`. */
static void r_idle_cpu(double secs, double share[2])
{
	double c0[2];
	uint64_t t0 = now_ns(), t1;

	for (int d = 0; d < 2; d++)
		c0[d] = proc_cpu_s(R.daemon[d]);
	sleep_ns((uint64_t)(secs * 1e9));
	t1 = now_ns();
	for (int d = 0; d < 2; d++)
		share[d] = (proc_cpu_s(R.daemon[d]) - c0[d]) /
			   ((double)(t1 - t0) / 1e9);
}

static void r_mem(struct rmem m[2])
{
	for (int d = 0; d < 2; d++)
		m[d] = proc_mem(R.daemon[d]);
}

/* moverctl flow create NAME --peer B on A (small ring: idle flows). */
static int r_create_remote(const struct ropts *o, const char *name)
{
	char peer[96], out[1024];

	snprintf(peer, sizeof(peer), "%s:%d", o->addr, R.port);
	if (!r_ctl(0, out, sizeof(out), "flow", "create", name, "--peer", peer,
		   "--ring-size", "65536", "--max-record", "256", NULL))
		return 0;
	fprintf(stderr, "flowbench: moverctl flow create %s: %s", name, out);
	return -1;
}

static int r_destroy(int daemon, const char *name)
{
	char out[1024];

	if (!r_ctl(daemon, out, sizeof(out), "flow", "destroy", name, NULL))
		return 0;
	fprintf(stderr, "flowbench: moverctl flow destroy %s: %s", name, out);
	return -1;
}

/* Wait up to ms until flow name exists on daemon (B: the peer opened it). */
static int r_wait_flow(int daemon, const char *name, int ms)
{
	char out[2048];

	for (int i = 0; i < ms / 20; i++) {
		if (!r_ctl(daemon, out, sizeof(out), "flow", "show", name, NULL))
			return 0;
		sleep_ns(20000000);
	}
	fprintf(stderr, "flowbench: flow %s did not appear on moverd %c\n",
		name, 'A' + daemon);
	return -1;
}

/*
 * The busy flows, and sparse records on flow `name` (a producer and
 * consumer of their own, started when the busy flows' window opens:
 * R.side): throughput in *tc, the sparse records' latency in *lat.
 * tc NULL: the sparse records alone, nothing busy.
 */
static int r_scale_busy(const struct ropts *o, const char *name,
			struct rcase *tc, struct rlat *lat)
{
	size_t bytes = sizeof(struct rshared) + R_LAT_MAX * sizeof(uint64_t);
	struct rshared *s = shared_alloc(bytes);
	double secs = o->lat_seconds < 0.8 * o->seconds ? o->lat_seconds :
		      0.8 * o->seconds;
	uint64_t count = (uint64_t)(o->sparse * secs), skip = count / 10;
	pid_t prod, cons;
	int st, failed = 0;

	/* not in R.kids: r_run_case kills its own kids when it ends */
	fflush(NULL);
	if ((cons = fork()) < 0)
		die("fork", 0);
	if (cons == 0) {
		r_client_child();
		r_consumer(o, s, name, 32, 0, count, skip);
	}
	if ((prod = fork()) < 0)
		die("fork", 0);
	if (prod == 0) {
		r_client_child();
		r_producer(o, s, name, 32, 0, o->sparse, count);
	}
	if (r_wait_ready(&s->c, 2))
		failed = 1;
	R.side = &s->c;
	R.busy_rate = o->busy_rate;
	if (!failed && tc && r_run_case(o, 32, o->busy_flows, 0, tc, NULL))
		failed = 1;
	R.side = NULL;
	R.busy_rate = 0;
	set_phase(&s->c, failed ? PH_STOP : PH_MEASURE);
	if (!r_wait_pid(cons, (uint64_t)(secs * 1e9) + 10000000000ull, &st) ||
	    !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "flowbench: sparse records on %s: consumer %s "
			"%s\n", name, failed ? "stopped" : "failed", s->c.err);
		failed = 1;
	}
	set_phase(&s->c, PH_STOP);
	if (!r_wait_pid(prod, 10000000000ull, &st) || !WIFEXITED(st) ||
	    WEXITSTATUS(st))
		failed = 1;
	kill(cons, SIGKILL);
	kill(prod, SIGKILL);
	waitpid(cons, NULL, WNOHANG);
	waitpid(prod, NULL, WNOHANG);
	*lat = (struct rlat){ .size = 32, .kind = "sparse-beside-busy",
			      .ok = !failed && s->f[0].total == count };
	lat->l.rate = o->sparse;
	if (lat->ok)
		lat_stats(s->lat, s->f[0].nlat, &lat->l);
	munmap(s, bytes);
	return failed ? -1 : 0;
}

/*
 * The scale run: CPU of both daemons idle, without flows and with
 * --flows-idle N open; --flows-busy M flows of 32 B records alone, then
 * with the N idle flows open (and sparse records on a random idle one);
 * fds and RSS; --churn K flows created and destroyed one after another.
 */
static int r_scale(const struct ropts *o, struct rscale *sc)
{
	char name[32];
	uint64_t t0, t_step;
	unsigned made = 0;
	uint32_t pick = 0;
	int failed = 0, bad = 0;

	memset(sc, 0, sizeof(*sc));
	r_mem(sc->mem[MEM_START]);
	r_idle_cpu(o->idle_seconds, sc->idle0);
	/* the reference: the busy flows and one sparse flow, nothing else */
	if (r_create_remote(o, "side-0") || r_wait_flow(1, "side-0", 10000))
		return -1;
	failed = r_scale_busy(o, "side-0", NULL, &sc->quiet0) ||
		 r_scale_busy(o, "side-0", &sc->alone, &sc->sparse_alone);
	if (r_destroy(0, "side-0") || failed)
		return -1;
	if (getrandom(&pick, sizeof(pick), 0) != (ssize_t)sizeof(pick))
		die("getrandom", 0);
	snprintf(sc->sparse_flow, sizeof(sc->sparse_flow), "idle-%u",
		 pick % o->idle_flows);
	t0 = now_ns();
	for (; made < o->idle_flows && !failed; made++) {
		snprintf(name, sizeof(name), "idle-%u", made);
		if (r_create_remote(o, name)) {
			failed = 1;
			break;
		}
		if (made + 1 != SCALE_BELL || o->idle_flows <= SCALE_BELL)
			continue;
		/* a step below the doorbell's limit, for comparison (its
		 * time is not creation time) */
		t_step = now_ns();
		if (r_wait_flow(1, name, 60000))
			failed = 1;
		sleep_ns(1000000000);
		sc->bell_step = true;
		r_idle_cpu(o->idle_seconds, sc->idle_bell);
		snprintf(name, sizeof(name), "idle-%u", pick % SCALE_BELL);
		bad |= r_scale_busy(o, name, NULL, &sc->quiet_bell) != 0;
		/* a run that fails (a flow that moved nothing) is a
		 * figure too: report it and go on */
		bad |= r_scale_busy(o, name, &sc->with_bell,
				    &sc->sparse_bell) != 0;
		t0 += now_ns() - t_step;
	}
	if (!failed && made) {
		snprintf(name, sizeof(name), "idle-%u", made - 1);
		failed = r_wait_flow(1, name, 60000) || r_wait_flow(1, "idle-0",
								    1000);
	}
	sc->create_s = (double)(now_ns() - t0) / 1e9;
	if (!failed) {
		sleep_ns(1000000000); /* let the opens' aftermath settle */
		r_mem(sc->mem[MEM_IDLE_OPEN]);
		r_idle_cpu(o->idle_seconds, sc->idle);
		bad |= r_scale_busy(o, sc->sparse_flow, NULL, &sc->quiet) != 0;
		bad |= r_scale_busy(o, sc->sparse_flow, &sc->with,
				    &sc->sparse) != 0;
	}
	for (unsigned i = 0; i < made; i++) {
		snprintf(name, sizeof(name), "idle-%u", i);
		failed |= r_destroy(0, name) != 0;
	}
	sleep_ns(2000000000); /* B closes its ends after A's close */
	r_mem(sc->mem[MEM_BEFORE_CHURN]);
	t0 = now_ns();
	for (unsigned i = 0; i < o->churn && !failed; i++) {
		snprintf(name, sizeof(name), "churn-%u", i);
		failed = r_create_remote(o, name) || r_destroy(0, name);
	}
	sc->churn_s = (double)(now_ns() - t0) / 1e9;
	sleep_ns(2000000000);
	r_mem(sc->mem[MEM_AFTER_CHURN]);
	sc->ok = !failed && !bad;
	return sc->ok ? 0 : -1;
}

static void print_scale(const struct ropts *o, const struct rscale *sc)
{
	static const char *const when[MEM_N] = {
		"daemons started", "idle flows open", "idle flows destroyed",
		"after the create/destroy loop" };
	const struct latstat *l = &sc->sparse.l, *l0 = &sc->sparse_alone.l;

	printf("scale: %u idle flows (64K rings), %u busy flows of 32 B "
	       "records", o->idle_flows, o->busy_flows);
	if (o->busy_rate > 0)
		printf(" (each paced at %g records/s)", o->busy_rate);
	printf(", A -> B over %s\n", o->transport);
	printf("  %u idle flows created in %.1f s (moverctl, one by one)\n",
	       o->idle_flows, sc->create_s);
	printf("  idle CPU over %g s, share of one cpu: no flows A %.2f%% B "
	       "%.2f%%; %u idle flows A %.2f%% B %.2f%% (together %.2f%%)\n",
	       o->idle_seconds, 100 * sc->idle0[0], 100 * sc->idle0[1],
	       o->idle_flows, 100 * sc->idle[0], 100 * sc->idle[1],
	       100 * (sc->idle[0] + sc->idle[1]));
	if (sc->bell_step) {
		printf("  with %u idle flows (the doorbell's futex words still "
		       "cover them): idle CPU A %.2f%% B %.2f%%", SCALE_BELL,
		       100 * sc->idle_bell[0], 100 * sc->idle_bell[1]);
		if (sc->alone.ok && sc->with_bell.recs_per_s > 0)
			printf("; busy flows %.0f records/s = %.1f%% of alone%s",
			       sc->with_bell.recs_per_s, 100 *
			       sc->with_bell.recs_per_s / sc->alone.recs_per_s,
			       sc->with_bell.ok ? "" : " (A FLOW MOVED NOTHING)");
		if (sc->sparse_bell.ok)
			printf("; sparse on an idle flow p50 %.1f us",
			       sc->sparse_bell.l.p50 / 1e3);
		printf("\n");
	}
	if (sc->alone.ok && sc->with.recs_per_s > 0)
		printf("  %u busy flows: alone %.0f records/s (cpu A/B %.0f/%.0f%%);"
		       " with %u idle flows open %.0f records/s (cpu A/B "
		       "%.0f/%.0f%%): %.1f%% of alone%s\n", o->busy_flows,
		       sc->alone.recs_per_s, 100 * sc->alone.cpu_a,
		       100 * sc->alone.cpu_b, o->idle_flows,
		       sc->with.recs_per_s, 100 * sc->with.cpu_a,
		       100 * sc->with.cpu_b,
		       100 * sc->with.recs_per_s / sc->alone.recs_per_s,
		       sc->with.ok ? "" : " (A FLOW MOVED NOTHING)");
	if (sc->alone.ok)
		printf("  slowest / fastest busy flow, records/s: alone %.0f / "
		       "%.0f; with the idle flows %.0f / %.0f\n",
		       sc->alone.min_flow, sc->alone.max_flow,
		       sc->with.min_flow, sc->with.max_flow);
	printf("  sparse %g/s, nothing busy, one-way p50 / p99 us: the only "
	       "flow %.1f / %.1f", o->sparse, sc->quiet0.l.p50 / 1e3,
	       sc->quiet0.l.p99 / 1e3);
	if (sc->bell_step)
		printf("; an idle flow of %u %.1f / %.1f", SCALE_BELL,
		       sc->quiet_bell.l.p50 / 1e3, sc->quiet_bell.l.p99 / 1e3);
	printf("; an idle flow of %u %.1f / %.1f\n", o->idle_flows,
	       sc->quiet.l.p50 / 1e3, sc->quiet.l.p99 / 1e3);
	if (sc->sparse_alone.ok)
		printf("  sparse %g/s on one more flow beside the busy ones, no "
		       "idle flows: one-way p50 %.1f p90 %.1f p99 %.1f max %.1f "
		       "us (%" PRIu64 " samples)\n", o->sparse, l0->p50 / 1e3,
		       l0->p90 / 1e3, l0->p99 / 1e3, l0->max / 1e3, l0->n);
	if (sc->sparse.ok)
		printf("  sparse %g/s on idle flow %s while the busy ones run: "
		       "one-way p50 %.1f p90 %.1f p99 %.1f max %.1f us (%"
		       PRIu64 " samples)\n", o->sparse, sc->sparse_flow,
		       l->p50 / 1e3, l->p90 / 1e3, l->p99 / 1e3, l->max / 1e3,
		       l->n);
	printf("  %u flows created and destroyed one after another in %.1f s"
	       "\n  %-30s %8s %10s %8s %10s\n", o->churn, sc->churn_s,
	       "moverd", "A fds", "A RSS KiB", "B fds", "B RSS KiB");
	for (int i = 0; i < MEM_N; i++)
		printf("  %-30s %8d %10ld %8d %10ld\n", when[i],
		       sc->mem[i][0].fds, sc->mem[i][0].rss_kb,
		       sc->mem[i][1].fds, sc->mem[i][1].rss_kb);
	printf("\n");
}

static void json_scale(const struct ropts *o, const struct rscale *sc)
{
	printf("  \"scale\": {\"ok\": %s, \"idle_flows\": %u, \"busy_flows\": "
	       "%u, \"busy_rate\": %g, \"churn\": %u, \"idle_seconds\": %g, "
	       "\"create_s\": %.2f, \"churn_s\": %.2f,\n"
	       "    \"idle_cpu_no_flows\": {\"a\": %.5f, \"b\": %.5f}, "
	       "\"idle_cpu\": {\"a\": %.5f, \"b\": %.5f},\n"
	       "    \"busy_alone_records_per_s\": %.0f, "
	       "\"busy_with_idle_records_per_s\": %.0f,\n    "
	       "\"sparse_idle_flow_ns\": ", sc->ok ? "true" : "false",
	       o->idle_flows, o->busy_flows, o->busy_rate, o->churn,
	       o->idle_seconds, sc->create_s, sc->churn_s, sc->idle0[0],
	       sc->idle0[1], sc->idle[0], sc->idle[1], sc->alone.recs_per_s,
	       sc->with.recs_per_s);
	json_lat(&sc->sparse.l);
	printf(",\n    \"sparse_beside_busy_no_idle_ns\": ");
	json_lat(&sc->sparse_alone.l);
	printf(",\n    \"sparse_nothing_busy_ns\": {\"one_flow\": ");
	json_lat(&sc->quiet0.l);
	printf(", \"idle_flows\": ");
	json_lat(&sc->quiet.l);
	if (sc->bell_step) {
		printf(", \"below_doorbell_limit\": ");
		json_lat(&sc->quiet_bell.l);
	}
	printf("}");
	if (sc->bell_step) {
		printf(",\n    \"below_doorbell_limit\": {\"idle_flows\": %u, "
		       "\"idle_cpu\": {\"a\": %.5f, \"b\": %.5f}, "
		       "\"busy_records_per_s\": %.0f, \"sparse_ns\": ",
		       SCALE_BELL, sc->idle_bell[0], sc->idle_bell[1],
		       sc->with_bell.recs_per_s);
		json_lat(&sc->sparse_bell.l);
		printf("}");
	}
	printf(",\n    \"moverd\": [");
	for (int i = 0; i < MEM_N; i++)
		printf("%s{\"a_fds\": %d, \"a_rss_kb\": %ld, \"b_fds\": %d, "
		       "\"b_rss_kb\": %ld}", i ? ", " : "", sc->mem[i][0].fds,
		       sc->mem[i][0].rss_kb, sc->mem[i][1].fds,
		       sc->mem[i][1].rss_kb);
	printf("]},\n");
}

static void usage_remote(FILE *f)
{
	fprintf(f,
"usage: flowbench remote [options]\n"
"  Starts two moverd daemons (A, B) on this machine, creates flows A -> B\n"
"  (B listens on --addr); one producer process on A and one consumer\n"
"  process on B per flow.\n"
"  --addr IP           B's listen address and A's peer address (default\n"
"                      127.0.0.1; e.g. 10.77.0.1 for rxe0 in the guest)\n"
"  --transport T       moverd --transport of both daemons: tcp (default),\n"
"                      rdma or auto\n"
"  --doorbell D        moverd --doorbell of both daemons: auto (default),\n"
"                      thread or poll\n"
"  --poll-us N         moverd --poll-us of both daemons (default 0)\n"
"  --idle MODE         moverd --idle of both daemons: adaptive (default),\n"
"                      sleep, yield or spin\n"
"  --spin              consumers poll with timeout 0 and sched_yield()\n"
"                      instead of sleeping (as ib_write_lat polls)\n"
"  --client-wait W     flowshm_set_wait of every producer and consumer:\n"
"                      sleep (default), yield or spin\n"
"  --daemon-cpus LIST  moverd --cpus of both daemons (default: any cpu)\n"
"  --client-cpus LIST  run producers, consumers and the echo on these cpus\n"
"                      (as taskset: 0,2-3; default: any cpu; sockperf and\n"
"                      iperf3 are not pinned)\n"
"  --dir DIR           create the temporary dir (sockets, --state-dir, logs)\n"
"                      under DIR (default: /dev/shm, /run or $TMPDIR)\n"
"  --moverd PATH       moverd binary (default: ../../moverd/moverd next to\n"
"                      this flowbench in the build tree)\n"
"  --moverctl PATH     moverctl binary (default: ../../control/moverctl)\n"
"  --seconds S         measured time per throughput case (default 2)\n"
"  --warmup S          untimed warm-up per case (default 0.5)\n"
"  --sizes LIST        record sizes >= 24 (default 32,256,4K,64K,1M)\n"
"  --flows LIST        flows per throughput case (default 1,8; at most %d)\n"
"  --ring-size N       ring bytes, at least (default 16M; a case uses at\n"
"                      least 64 records' worth: 64M for 1M records)\n"
"  --batch N           records per batch call, at most (default 256)\n"
"  --batch-bytes N     payload bytes per batch call, at most (default 256K)\n"
"  --pace R            records/s of the paced latency run (default 20000,\n"
"                      capped at --pace-share of the size's 1-flow rate)\n"
"  --pace-share F      (default 0.2)\n"
"  --sparse R          records/s of the sparse latency run (default 200:\n"
"                      gaps longer than moverd's 2 ms busy-poll window)\n"
"  --lat-seconds S     length of each latency run (default 2)\n"
"  --iperf-seconds S   iperf3 -t (default 3)\n"
"  --only LIST         tput,latency,iperf,pingpong,scale (default all but\n"
"                      scale)\n"
"  --pp-size N         ping-pong record size (default 32); sockperf's TCP\n"
"                      ping-pong over --addr (blocking, then --nonblocked)\n"
"                      runs with it too: the floor of the ping-pong and\n"
"                      the latency runs (skipped if sockperf is absent);\n"
"                      with the latency runs also blocking at --sparse/s\n"
"                      (--mps): a hop whose receiver sleeps in between\n"
"  scale (--only scale, or `flowbench scale`): both daemons idle without\n"
"  flows, then with --flows-idle N flows open (CPU over --idle-seconds);\n"
"  --flows-busy M flows of 32 B records alone, then with the N idle flows\n"
"  open while sparse records (--sparse/s) cross one idle flow picked at\n"
"  random; then --churn K flows created and destroyed one after another;\n"
"  moverd's fds and RSS at each step\n"
"  --flows-idle N      (default 1000; both daemons get --max-flows and\n"
"                      --peer-max-flows N + M + 64)\n"
"  --flows-busy M      (default 10, at most %d)\n"
"  --idle-seconds S    (default 30)\n"
"  --churn K           (default 1000)\n"
"  --busy-rate R       records/s of each busy flow, sent a millisecond's\n"
"                      worth per batch call (default 0: flat out, which\n"
"                      on a small host leaves no cpu for the sparse\n"
"                      records' processes)\n"
"  env FLOWBENCH_MOVERD_LOG=LEVEL  moverd --log-level (default warn); logs\n"
"                      are printed to stderr when a case fails\n"
"  --bursty N          in every throughput case (and the scale run's busy\n"
"                      flows), the first N flows' producers send in\n"
"                      bursts of --burst bytes and pause between them, so\n"
"                      that their flows run dry (the others stay flat\n"
"                      out); each row then also prints the mean flow of\n"
"                      either kind (default 0)\n"
"  --burst N           bytes of a burst (default 512K, moverd's quantum)\n"
"  --burst-gap-us G    pause after a burst (default 0: until moverd had\n"
"                      all of it acknowledged)\n"
"  --both-ways         in every throughput case the odd flows go B -> A\n"
"                      (producer on B, consumer on A): data both ways\n"
"                      over the daemons' one connection\n"
"  --counter-reader HZ a process reads every record of both daemons'\n"
"                      counters files HZ times a second (as moverctl top\n"
"                      or a Prometheus scrape does), to show reading them\n"
"                      costs the data path nothing (default 0: none)\n"
"  --json              machine-readable output on stdout\n"
"  -h, --help          this text\n", R_MAX_FLOWS, R_MAX_FLOWS);
}

/* Default binaries: relative to this executable in the build tree. */
static void r_default_bins(struct ropts *o)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash;

	if (n <= 0)
		return;
	exe[n] = 0;
	slash = strrchr(exe, '/');
	if (!slash)
		return;
	*slash = 0;
	if (!o->moverd[0])
		snprintf(o->moverd, sizeof(o->moverd), "%.*s/../../moverd/moverd",
			 PATH_MAX - 32, exe);
	if (!o->moverctl[0])
		snprintf(o->moverctl, sizeof(o->moverctl),
			 "%.*s/../../control/moverctl", PATH_MAX - 32, exe);
}

static void print_lat_row(const struct rlat *r)
{
	const struct latstat *l = &r->l;
	char sz[32];

	printf("%-7s %-6s %8.0f %8" PRIu64 "  %8.1f %8.1f %8.1f %9.1f %9.1f"
	       " %8.1f  %3.0f/%3.0f%%  %5.1f %5.1f %5.1f %5.1f  %s\n", r->kind,
	       fmt_size(r->size, sz, sizeof(sz)), l->rate, l->n, l->p50 / 1e3,
	       l->p90 / 1e3, l->p99 / 1e3, l->p999 / 1e3, l->max / 1e3,
	       l->mean / 1e3, 100 * r->cpu_a, 100 * r->cpu_b, r->per_rec.a,
	       r->per_rec.b, r->per_rec.prod, r->per_rec.cons, r->transport);
}

static void json_lat(const struct latstat *l)
{
	printf("{\"samples\": %" PRIu64 ", \"p50\": %.0f, \"p90\": %.0f, "
	       "\"p99\": %.0f, \"p99.9\": %.0f, \"max\": %.0f, \"mean\": %.0f}",
	       l->n, l->p50, l->p90, l->p99, l->p999, l->max, l->mean);
}

static void json_cpu(const struct rcpu *c)
{
	printf("{\"moverd_a\": %.3f, \"moverd_b\": %.3f, \"producer\": %.3f, "
	       "\"consumer\": %.3f, \"echo\": %.3f}", c->a, c->b, c->prod,
	       c->cons, c->echo);
}

/* A ping-pong row: round trip and one-way (RTT/2) percentiles, us, the
 * CPU per exchange and the sleeps per exchange (A, B, pinger or client,
 * echo or server). */
static void print_pp_row(const struct rlat *r)
{
	const struct latstat *l = &r->l;
	const struct rsleeps *w = &r->sleeps;

	printf("%-19s %8.0f %8" PRIu64 "  %7.1f %7.1f %7.1f %8.1f %8.1f  %7.1f"
	       " %7.1f  %5.1f %5.1f %6.1f %5.1f  %4.2f %4.2f %4.2f %4.2f\n",
	       r->kind, l->rate, l->n, l->p50 / 1e3, l->p90 / 1e3,
	       l->p99 / 1e3, l->p999 / 1e3, l->max / 1e3, l->p50 / 2e3,
	       l->p99 / 2e3, r->per_rec.a, r->per_rec.b, r->per_rec.prod,
	       r->per_rec.echo, w->a, w->b, w->ping, w->echo);
}

static void json_pp(const struct rlat *r)
{
	printf("{\"run\": \"%s\", \"size\": %" PRIu64 ", \"ok\": %s",
	       r->kind, r->size, r->ok ? "true" : "false");
	if (r->ok) {
		printf(", \"exchanges_per_s\": %.0f, \"rtt_ns\": ", r->l.rate);
		json_lat(&r->l);
		printf(", \"one_way_p50_ns\": %.0f, \"one_way_p99_ns\": %.0f, "
		       "\"cpu_us_per_exchange\": ", r->l.p50 / 2, r->l.p99 / 2);
		json_cpu(&r->per_rec);
		printf(", \"sleeps_per_exchange\": {\"moverd_a\": %.3f, "
		       "\"moverd_b\": %.3f, \"pinger\": %.3f, \"echo\": %.3f}",
		       r->sleeps.a, r->sleeps.b, r->sleeps.ping, r->sleeps.echo);
	}
	printf("}");
}

/* The sparse runs against sockperf's blocking ping-pong at their rate:
 * one bare hop to a receiver that sleeps between messages. */
static void print_sparse_floor(const struct ropts *o, const struct rlat *lats,
			       int nlats, const struct rlat *sp)
{
	char sz[32];

	printf("sockperf blocking at %g/s (%s): one-way p50 %.1f us, p99 "
	       "%.1f us\n", o->sparse, fmt_size(sp->size, sz, sizeof(sz)),
	       sp->l.p50 / 2e3, sp->l.p99 / 2e3);
	for (int i = 0; i < nlats; i++)
		if (lats[i].ok && !strcmp(lats[i].kind, "sparse"))
			printf("sparse %s p50 / sockperf blocking at %g/s "
			       "one-way p50 = %.2f\n", fmt_size(lats[i].size,
			       sz, sizeof(sz)), o->sparse,
			       lats[i].l.p50 / (sp->l.p50 / 2));
}

/* `flowbench scale`: `remote` with the scale run alone (--only scale). */
/* --bursty: the mean flow of each kind, and how the bursty ones fared
 * against the flows that never ran dry (above 1: ahead of them). */
static void print_bursty(const struct ropts *o, const struct rcase *tc)
{
	unsigned nb = o->bursty < tc->flows ? o->bursty : tc->flows;

	printf("       %u bursty (%" PRIu64 " B bursts, ", nb, o->burst_bytes);
	if (o->burst_gap_us > 0)
		printf("%g us apart", o->burst_gap_us);
	else
		printf("each once the last was acknowledged");
	printf("): %.0f records/s a flow", tc->bursty_flow);
	if (nb < tc->flows)
		printf("; %u flat out: %.0f a flow; bursty / flat out %.2f",
		       tc->flows - nb, tc->steady_flow, tc->steady_flow > 0 ?
		       tc->bursty_flow / tc->steady_flow : 0);
	printf("\n");
}

static void json_bursty(const struct ropts *o, const struct rcase *tc)
{
	printf(", \"bursty\": {\"flows\": %u, \"burst_bytes\": %" PRIu64
	       ", \"gap_us\": %g, \"bursty_flow_records_per_s\": %.0f, "
	       "\"steady_flow_records_per_s\": %.0f}",
	       o->bursty < tc->flows ? o->bursty : tc->flows, o->burst_bytes,
	       o->burst_gap_us, tc->bursty_flow, tc->steady_flow);
}

static bool scale_only;

static int cmd_remote(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "moverd", required_argument, NULL, 'm' },
		{ "moverctl", required_argument, NULL, 'c' },
		{ "seconds", required_argument, NULL, 's' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "flows", required_argument, NULL, 'f' },
		{ "ring-size", required_argument, NULL, 'r' },
		{ "batch", required_argument, NULL, 'b' },
		{ "batch-bytes", required_argument, NULL, 'B' },
		{ "pace", required_argument, NULL, 'p' },
		{ "pace-share", required_argument, NULL, 'P' },
		{ "sparse", required_argument, NULL, 'S' },
		{ "lat-seconds", required_argument, NULL, 'l' },
		{ "iperf-seconds", required_argument, NULL, 'i' },
		{ "only", required_argument, NULL, 'o' },
		{ "addr", required_argument, NULL, 'A' },
		{ "transport", required_argument, NULL, 'T' },
		{ "doorbell", required_argument, NULL, 'E' },
		{ "poll-us", required_argument, NULL, 'U' },
		{ "idle", required_argument, NULL, 'Y' },
		{ "spin", no_argument, NULL, 'N' },
		{ "client-wait", required_argument, NULL, 'G' },
		{ "daemon-cpus", required_argument, NULL, 'X' },
		{ "client-cpus", required_argument, NULL, 'Z' },
		{ "pp-size", required_argument, NULL, 'Q' },
		{ "flows-idle", required_argument, NULL, 'I' },
		{ "flows-busy", required_argument, NULL, 'M' },
		{ "idle-seconds", required_argument, NULL, 'W' },
		{ "churn", required_argument, NULL, 'K' },
		{ "busy-rate", required_argument, NULL, 'V' },
		{ "bursty", required_argument, NULL, 'u' },
		{ "burst", required_argument, NULL, 'k' },
		{ "burst-gap-us", required_argument, NULL, 'g' },
		{ "both-ways", no_argument, NULL, 'O' },
		{ "dir", required_argument, NULL, 'D' },
		{ "json", no_argument, NULL, 'j' },
		{ "counter-reader", required_argument, NULL, 'C' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const uint64_t def_sizes[] = { 32, 256, 4096, 65536, 1 << 20 };
	static struct ropts o = {
		.seconds = 2, .warmup = 0.5, .lat_seconds = 2,
		.iperf_seconds = 3, .ring_size = 16u << 20, .batch = 256,
		.batch_bytes = 256 * 1024, .pace = 20000, .sparse = 200,
		.pace_share = 0.2, .flows = { 1, 8 }, .nflows = 2,
		.do_tput = true, .do_lat = true, .do_iperf = true,
		.do_pp = true, .pp_size = 32, .idle_flows = 1000,
		.busy_flows = 10, .idle_seconds = 30, .churn = 1000,
		.addr = "127.0.0.1", .transport = "tcp", .doorbell = "auto",
		.poll_us = "0", .idle = "adaptive",
		.burst_bytes = 512u << 10,
	};
	static struct rcase cases[MAX_SIZES * MAX_MP];
	static struct rlat lats[MAX_SIZES * 2];
	static struct rscale sc;
	/* sockperf: blocking, --nonblocked, blocking at the sparse rate */
	struct rlat sp[3] = { { .kind = "sockperf" },
			      { .kind = "sockperf-nonblocked" },
			      { .kind = "sockperf-sparse" } },
		    pp = { .kind = "pingpong" };
	char sp_why[400] = "";
	unsigned ncases = 0, nlats = 0, i;
	uint64_t tmp[MAX_MP];
	double iperf_bps = -1, others, steal;
	char model[256], sz[32], why[300] = "";
	struct cpu_snap snap0, snap1;
	struct utsname un;
	cpu_set_t cpus;
	int opt, failed = 0;

	memcpy(o.sizes, def_sizes, sizeof(def_sizes));
	o.nsizes = sizeof(def_sizes) / sizeof(def_sizes[0]);
	if (scale_only) {
		o.do_tput = o.do_lat = o.do_iperf = o.do_pp = false;
		o.do_scale = true;
	}
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (opt) {
		case 'm': snprintf(o.moverd, sizeof(o.moverd), "%s", optarg); break;
		case 'c': snprintf(o.moverctl, sizeof(o.moverctl), "%s", optarg); break;
		case 's': o.seconds = atof(optarg); break;
		case 'w': o.warmup = atof(optarg); break;
		case 'z':
			if (parse_list(optarg, o.sizes, MAX_SIZES, &o.nsizes))
				goto bad;
			break;
		case 'f':
			if (parse_list(optarg, tmp, MAX_MP, &o.nflows))
				goto bad;
			for (i = 0; i < o.nflows; i++) {
				if (!tmp[i] || tmp[i] > R_MAX_FLOWS)
					goto bad;
				o.flows[i] = (unsigned)tmp[i];
			}
			break;
		case 'r': o.ring_size = parse_bytes(optarg); break;
		case 'b': o.batch = (unsigned)atoi(optarg); break;
		case 'B': o.batch_bytes = parse_bytes(optarg); break;
		case 'p': o.pace = atof(optarg); break;
		case 'P': o.pace_share = atof(optarg); break;
		case 'S': o.sparse = atof(optarg); break;
		case 'l': o.lat_seconds = atof(optarg); break;
		case 'i': o.iperf_seconds = atof(optarg); break;
		case 'o':
			o.do_tput = strstr(optarg, "tput") != NULL;
			o.do_lat = strstr(optarg, "lat") != NULL;
			o.do_iperf = strstr(optarg, "iperf") != NULL;
			o.do_pp = strstr(optarg, "pingpong") != NULL;
			o.do_scale = strstr(optarg, "scale") != NULL;
			break;
		case 'Q': o.pp_size = parse_bytes(optarg); break;
		case 'I': o.idle_flows = (unsigned)atoi(optarg); break;
		case 'M': o.busy_flows = (unsigned)atoi(optarg); break;
		case 'W': o.idle_seconds = atof(optarg); break;
		case 'K': o.churn = (unsigned)atoi(optarg); break;
		case 'V': o.busy_rate = atof(optarg); break;
		case 'u': o.bursty = (unsigned)atoi(optarg); break;
		case 'k': o.burst_bytes = parse_bytes(optarg); break;
		case 'g': o.burst_gap_us = atof(optarg); break;
		case 'O': o.both_ways = true; break;
		case 'A':
			if (snprintf(o.addr, sizeof(o.addr), "%s", optarg) >=
			    (int)sizeof(o.addr))
				goto bad;
			break;
		case 'T':
			if (strcmp(optarg, "tcp") && strcmp(optarg, "rdma") &&
			    strcmp(optarg, "auto"))
				goto bad;
			snprintf(o.transport, sizeof(o.transport), "%s", optarg);
			break;
		case 'E':
			if (strcmp(optarg, "auto") && strcmp(optarg, "thread") &&
			    strcmp(optarg, "poll"))
				goto bad;
			snprintf(o.doorbell, sizeof(o.doorbell), "%s", optarg);
			break;
		case 'U':
			if (strspn(optarg, "0123456789") != strlen(optarg) ||
			    !*optarg || strlen(optarg) >= sizeof(o.poll_us))
				goto bad;
			snprintf(o.poll_us, sizeof(o.poll_us), "%s", optarg);
			break;
		case 'Y':
			if (strcmp(optarg, "adaptive") && strcmp(optarg, "sleep") &&
			    strcmp(optarg, "yield") && strcmp(optarg, "spin"))
				goto bad;
			snprintf(o.idle, sizeof(o.idle), "%s", optarg);
			break;
		case 'N': o.spin = true; break;
		case 'G':
			if (!strcmp(optarg, "sleep"))
				R.client_wait = FLOWSHM_WAIT_SLEEP;
			else if (!strcmp(optarg, "yield"))
				R.client_wait = FLOWSHM_WAIT_YIELD;
			else if (!strcmp(optarg, "spin"))
				R.client_wait = FLOWSHM_WAIT_SPIN;
			else
				goto bad;
			break;
		case 'X': /* checked here, parsed again by moverd */
			if (cpus_parse(optarg, &cpus) ||
			    snprintf(o.daemon_cpus, sizeof(o.daemon_cpus), "%s",
				     optarg) >= (int)sizeof(o.daemon_cpus))
				goto bad;
			break;
		case 'Z':
			if (cpus_parse(optarg, &R.client_set) ||
			    snprintf(o.client_cpus, sizeof(o.client_cpus), "%s",
				     optarg) >= (int)sizeof(o.client_cpus))
				goto bad;
			break;
		case 'D': o.dir_base = optarg; break;
		case 'C': o.counter_hz = atof(optarg); break;
		case 'j': o.json = true; break;
		case 'h': usage_remote(stdout); return 0;
		default: goto bad;
		}
	}
	if (optind != argc || o.seconds <= 0 || o.warmup < 0 || !o.batch ||
	    !o.batch_bytes || o.pace <= 0 || o.sparse < 0 ||
	    o.lat_seconds <= 0 || o.iperf_seconds <= 0 || o.pace_share <= 0 ||
	    !o.ring_size || o.ring_size > (1ull << 30) || o.pp_size < 24 ||
	    o.pp_size > (1u << 20) || !o.idle_flows || o.idle_flows > 100000 ||
	    !o.busy_flows || o.busy_flows > R_MAX_FLOWS || o.idle_seconds <= 0 ||
	    !o.burst_bytes || o.burst_gap_us < 0)
		goto bad;
	{
		struct in_addr ia;

		if (inet_pton(AF_INET, o.addr, &ia) != 1) {
			fprintf(stderr, "flowbench: --addr %s is not an IPv4 "
				"address\n", o.addr);
			goto bad;
		}
	}
	for (i = 0; i < o.nsizes; i++)
		if (o.sizes[i] < 24 || o.sizes[i] > (256u << 20))
			goto bad; /* seq, send time and check word: 24 bytes */
	r_default_bins(&o);
	if (access(o.moverd, X_OK) || access(o.moverctl, X_OK)) {
		fprintf(stderr, "flowbench: cannot run %s or %s (use --moverd "
			"and --moverctl)\n", o.moverd, o.moverctl);
		return 2;
	}

	R.parent = getpid();
	R.o = &o;
	on_die = r_cleanup;
	atexit(r_cleanup);
	signal(SIGINT, r_on_signal);
	signal(SIGTERM, r_on_signal);
	signal(SIGHUP, r_on_signal);
	cpu_model(model, sizeof(model));
	uname(&un);
	cpu_snap(&snap0);
	r_make_dir(o.dir_base);
	if (!o.json) {
		printf("flowbench remote: %ld cpus (%s), kernel %s\n",
		       sysconf(_SC_NPROCESSORS_ONLN), model, un.release);
		printf("two moverd daemons (%s), --transport %s, --doorbell "
		       "%s, --poll-us %s, --idle %s, B on %s, state and "
		       "sockets in %s\n",
		       o.moverd, o.transport, o.doorbell, o.poll_us, o.idle, o.addr,
		       R.dir);
		if (o.spin)
			printf("consumers spin (timeout 0, sched_yield)\n");
		if (o.daemon_cpus[0] || o.client_cpus[0])
			printf("daemons on cpus %s, producers and consumers on "
			       "cpus %s (sockperf, iperf3: any)\n",
			       o.daemon_cpus[0] ? o.daemon_cpus : "any",
			       o.client_cpus[0] ? o.client_cpus : "any");
		if (R.client_wait != FLOWSHM_WAIT_SLEEP)
			printf("producers and consumers wait by %s "
			       "(flowshm_set_wait)\n",
			       R.client_wait == FLOWSHM_WAIT_YIELD ? "yielding" :
								     "spinning");
		printf("%.2f s per throughput case after %.2f s warm-up; batch "
		       "APIs; every record verified (seq, check word)\n\n",
		       o.seconds, o.warmup);
		fflush(stdout);
	}

	/* the reference first, before our daemons exist */
	if (o.do_iperf) {
		iperf_bps = r_iperf(&o, why, sizeof(why));
		if (iperf_bps < 0) {
			fprintf(stderr, "flowbench: iperf3 reference: %s\n",
				why);
		} else if (!o.json) {
			printf("iperf3 -c %s -t %g (1 TCP stream): "
			       "%.2f Gbit/s = %.3f GB/s\n\n", o.addr,
			       o.iperf_seconds,
			       iperf_bps / 1e9, iperf_bps / 8e9);
			fflush(stdout);
		}
	}

	/* the floor of a latency run: one bare TCP hop, blocking and
	 * polling, also before our daemons exist */
	for (int nb = 0; nb < 2 && (o.do_pp || o.do_lat); nb++) {
		if (!r_sockperf(&o, o.pp_size, nb, 0, &sp[nb], sp_why,
				sizeof(sp_why)))
			continue;
		fprintf(stderr, "flowbench: sockperf%s: %s\n",
			nb ? " --nonblocked" : "", sp_why);
		if (!nb)
			break;
	}
	/* and one at the sparse run's rate: a bare hop that, like a sparse
	 * record, finds its receiver asleep (flat out it never does) */
	if (o.do_lat && o.sparse > 0 && sp[0].ok &&
	    r_sockperf(&o, o.pp_size, false, o.sparse, &sp[2], sp_why,
		       sizeof(sp_why)))
		fprintf(stderr, "flowbench: sockperf --mps %g: %s\n",
			o.sparse, sp_why);

	if (r_start_daemons(&o)) {
		r_cleanup();
		return 1;
	}
	if (o.counter_hz > 0)
		r_counter_reader(o.counter_hz, o.json);
	if (!o.json)
		printf("moverd A (producers) and B (consumers, listening on "
		       "%s:%d) are up\n\n", o.addr, R.port);

	if (o.do_tput) {
		if (!o.json)
			printf("%-6s %5s %5s %12s %8s %9s  %-7s %s  %s\n",
			       "size", "flows", "ring", "records/s", "GB/s",
			       "vs iperf3", "cpu A/B",
			       "loaded latency p50 / p99 (us)", "transport");
		for (i = 0; i < o.nsizes; i++)
			for (unsigned k = 0; k < o.nflows; k++) {
				struct rcase *tc = &cases[ncases++];
				char rsz[32];

				if (r_run_case(&o, o.sizes[i], o.flows[k], 0,
					       tc, NULL)) {
					failed = 1;
					R.keep_logs = true;
					continue;
				}
				if (o.json)
					continue;
				printf("%-6s %5u %5s %12.0f %8.3f",
				       fmt_size(tc->size, sz, sizeof(sz)),
				       tc->flows,
				       fmt_size(tc->ring, rsz, sizeof(rsz)),
				       tc->recs_per_s, tc->gb_per_s);
				if (iperf_bps > 0)
					printf(" %8.1f%%", 100 * tc->gb_per_s /
					       (iperf_bps / 8e9));
				else
					printf(" %9s", "-");
				printf("  %3.0f/%3.0f%% %8.1f / %8.1f  %s\n",
				       100 * tc->cpu_a, 100 * tc->cpu_b,
				       tc->loaded.p50 / 1e3, tc->loaded.p99 / 1e3,
				       tc->transport);
				if (o.bursty)
					print_bursty(&o, tc);
				fflush(stdout);
			}
		if (!o.json)
			printf("(flows > 1: one producer and one consumer "
			       "process per flow, all on %ld cpus with both "
			       "daemons: a contention figure, not scaling; every "
			       "flow shares the one connection between A "
			       "and B)\n(cpu A/B: CPU time of moverd A and B, as a "
			       "share of one cpu)\n(loaded latency: send call to receipt "
			       "while the flow runs flat out, so it is mostly "
			       "queueing in the rings)\n\n",
			       sysconf(_SC_NPROCESSORS_ONLN));
	}

	if (o.do_lat) {
		for (i = 0; i < o.nsizes; i++) {
			double rate = o.pace, one = 0;
			bool broken = false;

			for (unsigned k = 0; k < ncases; k++) {
				if (cases[k].ok && cases[k].flows == 1 &&
				    cases[k].size == o.sizes[i])
					one = cases[k].recs_per_s;
				if (!cases[k].ok && cases[k].size == o.sizes[i])
					broken = true;
			}
			if (broken) {
				fprintf(stderr, "flowbench: no latency runs for "
					"%" PRIu64 " B records: their throughput "
					"case failed\n", o.sizes[i]);
				continue;
			}
			if (one > 0 && rate > o.pace_share * one)
				rate = o.pace_share * one;
			if (!one && rate > 500e6 / (double)o.sizes[i])
				rate = 500e6 / (double)o.sizes[i];
			lats[nlats].kind = "paced";
			if (r_run_case(&o, o.sizes[i], 1, rate, NULL,
				       &lats[nlats]))
				failed = 1, R.keep_logs = true;
			lats[nlats].kind = "paced";
			nlats++;
			if (o.sparse > 0) {
				if (r_run_case(&o, o.sizes[i], 1, o.sparse, NULL,
					       &lats[nlats]))
					failed = 1, R.keep_logs = true;
				lats[nlats].kind = "sparse";
				nlats++;
			}
		}
		if (!o.json) {
			printf("one-way latency, 1 flow, producer's send call to "
			       "consumer's receipt (CLOCK_MONOTONIC in the "
			       "record), us:\n");
			printf("%-7s %-6s %8s %8s  %8s %8s %8s %9s %9s %8s  %s\n",
			       "run", "size", "rec/s", "samples", "p50", "p90",
			       "p99", "p99.9", "max", "mean", "cpu A/B   cpu us/rec:"
			       " A  B  prod cons  transport");
			for (i = 0; i < nlats; i++)
				if (lats[i].ok)
					print_lat_row(&lats[i]);
			printf("(paced: min(%g/s, %g x the size's 1-flow rate); "
			       "sparse: %g/s, so moverd A has gone idle before "
			       "each record)\n(cpu us/rec: CPU time per record of "
			       "moverd A, moverd B, the producer and the "
			       "consumer)\n", o.pace, o.pace_share, o.sparse);
			for (i = 0; i < nlats && sp[0].ok; i++)
				if (lats[i].ok)
					printf("%s %s p50 / sockperf blocking "
					       "one-way p50 = %.2f\n",
					       lats[i].kind, fmt_size(lats[i].size,
					       sz, sizeof(sz)), lats[i].l.p50 /
					       (sp[0].l.p50 / 2));
			if (sp[2].ok)
				print_sparse_floor(&o, lats, nlats, &sp[2]);
			printf("\n");
		}
	}

	if (o.do_pp && r_run_pingpong(&o, o.pp_size, &pp))
		failed = 1, R.keep_logs = true;
	if (o.do_pp && !o.json) {
		printf("ping-pong, %s records, A -> B -> A (pinger on A, echo "
		       "process on B%s), us:\n", fmt_size(o.pp_size, sz,
		       sizeof(sz)), o.spin ? ", both polling" : "");
		printf("%-19s %8s %8s  %7s %7s %7s %8s %8s  %7s %7s  %s  %s\n",
		       "run", "exch/s", "samples", "RTT p50", "p90", "p99",
		       "p99.9", "max", "1-way50", "1-way99",
		       "cpu us/exchange: A B pinger echo",
		       "sleeps/exchange: A B pinger echo");
		if (pp.ok)
			print_pp_row(&pp);
		for (int nb = 0; nb < 2; nb++)
			if (sp[nb].ok)
				print_pp_row(&sp[nb]);
		printf("(one-way = RTT / 2; sockperf rows: TCP ping-pong over "
		       "%s, its client and server in the pinger and echo "
		       "columns; sleeps: voluntary context switches, every "
		       "thread)\n", o.addr);
		if (pp.ok && sp[0].ok)
			printf("flowmover / sockperf one-way: p50 %.2f, p99 %.2f "
			       "(blocking)", pp.l.p50 / sp[0].l.p50,
			       pp.l.p99 / sp[0].l.p99);
		if (pp.ok && sp[1].ok)
			printf("; p50 %.2f, p99 %.2f (--nonblocked)",
			       pp.l.p50 / sp[1].l.p50, pp.l.p99 / sp[1].l.p99);
		if (pp.ok && sp[0].ok)
			printf("\n");
		else if (sp_why[0])
			printf("no ratio: %s\n", sp_why);
		printf("\n");
	}
	fflush(stdout);

	if (o.do_scale) {
		if (r_scale(&o, &sc))
			failed = 1, R.keep_logs = true;
		if (!o.json)
			print_scale(&o, &sc);
	}

	r_cleanup(); /* daemons reaped: their CPU time counts as ours */
	cpu_snap(&snap1);
	cpu_foreign(&snap0, &snap1, &others, &steal);
	if (!o.json) {
		printf("\nduring the run, other tasks used %.1f%% and the host "
		       "stole %.1f%% of the cpus%s\n", 100 * others,
		       100 * steal, others + steal > 0.05 ?
		       ": NOT QUIET, figures are low" : "");
		if (iperf_bps > 0) {
			for (i = 0; i < ncases; i++)
				if (cases[i].ok && cases[i].size >= 65536)
					printf("%s records, %u flow%s: %.1f%% of "
					       "iperf3\n", fmt_size(cases[i].size,
					       sz, sizeof(sz)), cases[i].flows,
					       cases[i].flows > 1 ? "s" : "",
					       100 * cases[i].gb_per_s /
					       (iperf_bps / 8e9));
		}
	} else {
		printf("{\n  \"mode\": \"remote\",\n  \"machine\": {\"cpus\": "
		       "%ld, \"model\": ", sysconf(_SC_NPROCESSORS_ONLN));
		json_str(model);
		printf(", \"kernel\": ");
		json_str(un.release);
		printf("},\n  \"addr\": ");
		json_str(o.addr);
		printf(", \"transport\": ");
		json_str(o.transport);
		printf(",\n  \"params\": {\"seconds\": %g, \"warmup\": %g, "
		       "\"ring_size_min\": %" PRIu64 ", \"batch\": %u, "
		       "\"batch_bytes\": %" PRIu64 ", \"pace\": %g, "
		       "\"pace_share\": %g, \"sparse\": %g, \"lat_seconds\": %g},\n",
		       o.seconds, o.warmup, o.ring_size, o.batch, o.batch_bytes,
		       o.pace, o.pace_share, o.sparse, o.lat_seconds);
		printf("  \"others_cpu\": %.4f, \"steal_cpu\": %.4f,\n", others,
		       steal);
		if (iperf_bps > 0)
			printf("  \"iperf3\": {\"streams\": 1, \"seconds\": %g, "
			       "\"bits_per_second\": %.0f, \"gb_per_s\": %.4f},\n",
			       o.iperf_seconds, iperf_bps, iperf_bps / 8e9);
		printf("  \"throughput\": [");
		for (i = 0; i < ncases; i++) {
			struct rcase *tc = &cases[i];

			printf("%s\n    {\"size\": %" PRIu64 ", \"flows\": %u, "
			       "\"ring\": %" PRIu64 ", \"ok\": %s", i ? "," : "",
			       tc->size, tc->flows, tc->ring,
			       tc->ok ? "true" : "false");
			printf(", \"flow_transport\": ");
			json_str(tc->transport);
			if (tc->ok) {
				printf(", \"moverd_cpu\": {\"a\": %.3f, \"b\": %.3f}",
				       tc->cpu_a, tc->cpu_b);
				printf(", \"records\": %" PRIu64 ", \"seconds\": "
				       "%.4f, \"records_per_s\": %.0f, "
				       "\"gb_per_s\": %.4f, \"min_flow_records_per_s\": "
				       "%.0f, \"max_flow_records_per_s\": %.0f",
				       tc->recs, tc->secs, tc->recs_per_s,
				       tc->gb_per_s, tc->min_flow, tc->max_flow);
				if (iperf_bps > 0)
					printf(", \"vs_iperf3\": %.4f",
					       tc->gb_per_s / (iperf_bps / 8e9));
				if (o.bursty)
					json_bursty(&o, tc);
				printf(", \"loaded_latency_ns\": ");
				json_lat(&tc->loaded);
			}
			printf("}");
		}
		printf("%s],\n  \"latency\": [", ncases ? "\n  " : "");
		for (i = 0; i < nlats; i++) {
			printf("%s\n    {\"run\": \"%s\", \"size\": %" PRIu64
			       ", \"flows\": 1, \"records_per_s\": %.0f, \"ok\": %s",
			       i ? "," : "", lats[i].kind, lats[i].size,
			       lats[i].l.rate, lats[i].ok ? "true" : "false");
			printf(", \"flow_transport\": ");
			json_str(lats[i].transport);
			if (lats[i].ok) {
				printf(", \"moverd_cpu\": {\"a\": %.3f, \"b\": "
				       "%.3f}", lats[i].cpu_a, lats[i].cpu_b);
				printf(", \"one_way_ns\": ");
				json_lat(&lats[i].l);
				printf(", \"cpu_us_per_record\": ");
				json_cpu(&lats[i].per_rec);
			}
			printf("}");
		}
		printf("%s],\n", nlats ? "\n  " : "");
		if (o.do_pp) {
			printf("  \"pingpong\": ");
			json_pp(&pp);
			printf(",\n");
		}
		if (o.do_pp || o.do_lat) {
			printf("  \"sockperf\": [");
			json_pp(&sp[0]);
			printf(", ");
			json_pp(&sp[1]);
			printf(", ");
			json_pp(&sp[2]);
			printf("],\n");
		}
		if (o.do_scale)
			json_scale(&o, &sc);
		printf("  \"ok\": %s\n}\n", failed ? "false" : "true");
	}
	return failed ? 1 : 0;
bad:
	usage_remote(stderr);
	return 2;
}

static int cmd_scale(int argc, char **argv)
{
	scale_only = true;
	return cmd_remote(argc, argv);
}

/* ---- subcommands ---------------------------------------------------------- */

struct subcmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static const struct subcmd subcmds[] = {
	{ "local", cmd_local,
	  "shared-memory rings between processes on this machine" },
	{ "remote", cmd_remote,
	  "two moverd daemons, flows between them (TCP on loopback, or RDMA)" },
	{ "scale", cmd_scale,
	  "remote --only scale: many idle flows, a few busy ones" },
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
