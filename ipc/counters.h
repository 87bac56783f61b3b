/*
 * ipc/counters.h - moverd's counters file: layout and access.
 *
 * moverd publishes what it counts in one file next to its control socket,
 * SOCKET.counters (e.g. /run/flowmover/moverd.sock.counters), mapped shared
 * by moverd and read-only by anyone who may read the file (moverctl top,
 * flow show, status; moverd's own /metrics thread).  Like Aeron's CnC file:
 * readers never talk to moverd and never block it.
 *
 * ---------------------------------------------------------------------------
 * Layout (version 1; all integers native-endian, the host's own)
 * ---------------------------------------------------------------------------
 *
 *   offset 0                  struct fmc_header, FMC_HDR_BYTES (4 KiB)
 *   offset 4096               record 0: the daemon (FMC_DAEMON)
 *   offset 4096 + 2048        records 1 .. n_flow: flows  (FMC_FLOW)
 *   then                      n_peer records: peers      (FMC_PEER)
 *
 * Every record is FMC_REC_BYTES (2 KiB): a header (seq, state, type,
 * incarnation), three texts of FMC_TEXT_BYTES, then FMC_VALUES 64-bit
 * values whose meaning depends on the type (enum fmc_daemon, fmc_flow,
 * fmc_peer below).  New values are only ever appended, within the record;
 * a reader checks `version` and `rec_bytes` and ignores values it does not
 * know.  Readers must use n_flow/n_peer from the header, never constants.
 *
 * ---------------------------------------------------------------------------
 * Writing and reading
 * ---------------------------------------------------------------------------
 *
 * moverd is the only writer.  It does not count into this file on its data
 * path: its duty cycle counts in its own structures (plain increments, no
 * syscall, no shared cache line with any reader), and every
 * FMC_DEFAULT_PERIOD_MS a sampler on moverd's loop copies them here.  So a
 * reader polling the file as fast as it likes touches only lines moverd
 * writes ten times a second, never a line of a ring or of the mover.  A
 * pass writes only the records that may have changed: a flow's record is
 * at most a second old while clients hold its ring, and a flow nobody
 * attached is written when moverd changed it (and once a minute), so an
 * idle flow costs nothing (moverd/counters.c, flows_to_write).
 *
 * A record is written under a sequence lock (`seq`, odd while moverd
 * writes it):
 *   writer: seq = s + 1 (relaxed), release fence, values (relaxed stores),
 *           seq = s + 2 (release).
 *   reader: s1 = seq (acquire); odd: retry; copy everything (relaxed
 *           loads); acquire fence; s2 = seq (relaxed); s1 != s2: retry.
 * The release fence orders the odd seq before the values, the final
 * release store orders the values before the even seq; the reader's
 * acquire load and fence mirror them (the C11 seqlock).  Texts are stored
 * as 64-bit atomic words too, so no copy is a data race.  fmc_read() does
 * all this; a reader that gives up after FMC_READ_TRIES (moverd rewrote
 * the record every time) simply reads it at its next poll.
 *
 * state: FMC_FREE (never used, or its flow/peer is gone) or FMC_ACTIVE.
 * A slot is reused for another flow after its flow is destroyed:
 * `incarnation` is unique per use of a slot (never reused while moverd
 * runs), so a reader computing rates keeps (slot, incarnation) and starts
 * over when the incarnation changed.
 *
 * The file is replaced, not rewritten, when moverd starts (a new inode,
 * new pid and start time); moverd sets `closed` when it stops.  A reader
 * holding the old mapping sees `closed` (or a dead pid) and opens the path
 * again.
 *
 * ---------------------------------------------------------------------------
 * Limits
 * ---------------------------------------------------------------------------
 *
 * n_flow = min(--max-flows, FMC_MAX_FLOW_RECS), n_peer = FMC_PEER_RECS.  A
 * flow or peer beyond them gets no record: it is counted in the header's
 * flows_unrecorded/peers_unrecorded, and `moverctl flow show` answers for
 * it from the control socket instead.  The file is at most
 * 4 KiB + (1 + 4096 + 256) * 2 KiB = 8.5 MiB, allocated whole when moverd
 * makes it (it shares a tmpfs with the rings, which a client can fill: a
 * first write to a page of a full tmpfs would be SIGBUS).
 *
 * Who may read it: mode 0640, moverd's user and group (the group the
 * operator gives the socket).  It names every flow and peer of the host,
 * which the control socket shows a user only for flows that user may
 * attach to; so it is an operator's file, not every user's
 * (docs/security.md).
 */
#ifndef FLOWMOVER_IPC_COUNTERS_H
#define FLOWMOVER_IPC_COUNTERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FMC_MAGIC      0x31535443434d4c46ULL /* "FLMCCTS1" in memory */
#define FMC_VERSION    1u
#define FMC_HDR_BYTES  4096u
#define FMC_REC_BYTES  2048u
#define FMC_TEXT_BYTES 128u
#define FMC_TEXT_WORDS (FMC_TEXT_BYTES / 8)
#define FMC_VALUES     200u
#define FMC_MAX_FLOW_RECS 4096u
#define FMC_PEER_RECS  256u
#define FMC_DEFAULT_PERIOD_MS 100u
#define FMC_READ_TRIES 64

struct fmc_header {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_bytes;          /* FMC_HDR_BYTES: where record 0 is */
	uint32_t rec_bytes;          /* FMC_REC_BYTES */
	uint32_t n_flow;             /* flow records, after the daemon's */
	uint32_t n_peer;             /* peer records, after the flows */
	uint32_t pid;                /* moverd's */
	uint64_t start_unix_ns;      /* when moverd started (CLOCK_REALTIME) */
	uint32_t period_ms;          /* how often the sampler writes */
	uint32_t values;             /* FMC_VALUES */
	_Atomic uint64_t sample_seq;      /* passes of the sampler so far */
	_Atomic uint64_t sample_unix_ns;  /* the last pass (CLOCK_REALTIME) */
	_Atomic uint64_t sample_mono_ns;  /* ... CLOCK_MONOTONIC */
	_Atomic uint32_t closed;          /* moverd stopped: open again */
	_Atomic uint32_t flows_unrecorded; /* flows without a record now */
	_Atomic uint32_t peers_unrecorded;
};
_Static_assert(sizeof(struct fmc_header) <= FMC_HDR_BYTES, "header");

enum fmc_type { FMC_NONE = 0, FMC_DAEMON = 1, FMC_FLOW = 2, FMC_PEER = 3 };
enum fmc_state { FMC_FREE = 0, FMC_ACTIVE = 1 };

/* The three texts: flow: name, peer address ("" local), last error.
 * peer: address, node name (as the peer said it, filtered), last error.
 * daemon: "moverd", version, doorbell mode. */
enum fmc_text { FMC_NAME, FMC_WHERE, FMC_ERROR, FMC_TEXTS };

struct fmc_record {
	_Atomic uint64_t seq;
	_Atomic uint32_t state;      /* enum fmc_state */
	_Atomic uint32_t type;       /* enum fmc_type */
	_Atomic uint64_t incarnation;
	uint64_t reserved;
	_Atomic uint64_t text[FMC_TEXTS][FMC_TEXT_WORDS];
	_Atomic uint64_t v[FMC_VALUES];
};
_Static_assert(sizeof(struct fmc_record) <= FMC_REC_BYTES, "record");

/* Daemon values (record 0). */
enum fmc_daemon {
	FMC_D_CYCLES,          /* duty cycles run */
	FMC_D_WORK_CYCLES,     /* ... that found work */
	FMC_D_SLEEPS,          /* idle periods begun with the doorbell armed */
	FMC_D_WAKE_DOORBELL,   /* sleeps ended by a producer's doorbell */
	FMC_D_WAKE_NETWORK,    /* ... by I/O: peers, clients, RDMA completions */
	FMC_D_WAKE_TIMER,      /* ... by the peer timer alone (TICK_MS) */
	FMC_D_CPU_USER_NS,     /* getrusage(RUSAGE_SELF), at most 1/s */
	FMC_D_CPU_SYS_NS,
	FMC_D_CLIENTS,         /* open control connections (gauge) */
	FMC_D_FDS,             /* open file descriptors (gauge, 1/s) */
	FMC_D_FLOWS,           /* flows (gauge) */
	FMC_D_PEERS,           /* peer connections known (gauge) */
	FMC_D_REQUESTS,        /* control requests served */
	FMC_D_BAD_REQUESTS,
	FMC_D_CLIENTS_REFUSED,
	FMC_D_PEERS_REFUSED,
	FMC_D_DOORBELL_RINGS,  /* the doorbell's own count (= WAKE_DOORBELL
				* plus rings that came while awake) */
	FMC_D_SAMPLER_NS,      /* time moverd spent writing this file */
	FMC_D_RING_TO_ALLOCATE, /* ring bytes fills have yet to allocate (gauge) */
	FMC_D_RING_TO_FREE,    /* allocated bytes of destroyed rings that
				* punches have yet to free (gauge) */
	FMC_D_BELL_PAGES,      /* doorbell pages in use (gauge) */
	FMC_D_BELL_SHARED,     /* producers on the page the uids past 63
				* share (gauge; 0: no uid shares) */
	FMC_D_DESTROYED_RINGS, /* destroyed flows whose rings moverd still
				* holds: I/O in flight, a consumer draining,
				* pages being freed (gauge) */
	FMC_D_DESTROYED_RING_BYTES, /* ... their ring bytes (gauge) */
	FMC_D_COUNT
};

/* Flow values. */
enum fmc_flow {
	FMC_F_ROLE,            /* 0 local, 1 sender, 2 receiver */
	FMC_F_STATE,           /* enum fmc_flow_state */
	FMC_F_STATE_SINCE_NS,  /* CLOCK_REALTIME of the last state change */
	FMC_F_ERROR_NS,        /* ... of the last error (text FMC_ERROR) */
	FMC_F_RING_BYTES,
	FMC_F_PRODUCERS,       /* attached now (gauges) */
	FMC_F_CONSUMERS,
	FMC_F_BYTES_COMMITTED, /* producers' tail since the ring began
				* (sender, local; receiver: = deposited) */
	FMC_F_RECORDS_COMMITTED, /* data records producers claimed, counted
				  * by the client library in the ring's
				  * control page (ipc/ring.h `records`, in
				  * batches: trails a busy producer by
				  * < FR_COUNT_EVERY; a producer killed
				  * before its commit: also in
				  * FMC_F_RECOVERED); receiver: = records
				  * deposited */
	FMC_F_BYTES_SENT,      /* sender: put on the wire */
	FMC_F_RECORDS_SENT,    /* sender: data records put on the wire (its
				* scan counts them; END and pads are not) */
	FMC_F_BYTES_ACKED,     /* sender: published in the peer's ring */
	FMC_F_BYTES_DEPOSITED, /* receiver: published in this ring */
	FMC_F_BYTES_CONSUMED,  /* the consumer's position since the ring
				* began (local, receiver; sender: the peer
				* consumer's, as last acknowledged) */
	FMC_F_RECORDS_CONSUMED, /* summed over the subscribers (ring format
				 * 2's slot counts, published lazily; two
				 * subscribers reading N records give 2N) */
	FMC_F_BATCHES,         /* sender: sends that carried its data; a
				* mean batch is BYTES_SENT / BATCHES bytes,
				* RECORDS_SENT / BATCHES records */
	FMC_F_LAG_BYTES,       /* committed (receiver: deposited) but not
				* consumed yet (gauge) */
	FMC_F_BACKPRESSURE,    /* producers found the ring full and waited
				* (the ring's full_events) */
	FMC_F_FULL_NS,         /* ... and waited this long (full_ns) */
	FMC_F_RECONNECTS,      /* links lost under it */
	FMC_F_RESUMES,         /* opened again after a lost link or restart */
	FMC_F_RECOVERED,       /* records of dead producers padded over */
	FMC_F_SUB_MASK,        /* the ring's subscriber slots in use: bit i
				* ACTIVE; bit 16 + i CUT (by max_lag) */
	FMC_F_SUB0,            /* then per slot i < FMC_SUBS, FMC_SUB_VALUES
				* each: enum fmc_sub */
	/* appended after the subscriber slots (layout version 1 still:
	 * nothing before moved; a moverd older than this writes 0) */
	FMC_F_RECORDS_DEPOSITED = FMC_F_SUB0 + 16 * 3, /* receiver: data
				* records published in its ring, as moverd's
				* walk of each deposit finds them */
	FMC_F_COUNT
};

/* A flow's subscriber slots (ring format 2, ipc/ring.h "Subscribers"):
 * value FMC_F_SUB0 + FMC_SUB_VALUES * slot + one of these.  Positions
 * and counts are what each subscriber published (lazily: up to 64 KiB or
 * ring/8 behind its private position). */
#define FMC_SUBS       16u
#define FMC_SUB_VALUES 3u
enum fmc_sub {
	FMC_SUB_LAG,           /* bytes between the tail and its position */
	FMC_SUB_RECORDS,       /* records it consumed */
	FMC_SUB_PID,           /* the holder's pid (0: moverd's own) */
};
_Static_assert(FMC_F_RECORDS_DEPOSITED == FMC_F_SUB0 +
	       FMC_SUBS * FMC_SUB_VALUES, "subscriber values");
_Static_assert(FMC_F_COUNT <= FMC_VALUES, "flow values");

enum fmc_flow_state {
	FMC_S_OPEN, FMC_S_CONNECTING, FMC_S_RECONNECTING, FMC_S_FAILED,
	FMC_S_CLOSING,
};

/*
 * Acknowledgement round-trip times: HdrHistogram-style log buckets with
 * four linear sub-buckets per power of two of microseconds (so a value's
 * bucket is at most 25% wide): buckets 0..3 are 0,1,2,3 us; bucket
 * 4(e-1)+s, e >= 2, s < 4, holds [(4+s) << (e-2), (5+s) << (e-2)) us.  The
 * last bucket takes everything from ~33 s on.  Counts are cumulative:
 * a reader diffs two reads for a window's p50/p99/max.
 */
#define FMC_RTT_BUCKETS 96u

static inline unsigned fmc_rtt_bucket(uint64_t ns)
{
	uint64_t us = ns / 1000;
	unsigned e, idx;

	if (us < 4)
		return (unsigned)us;
	e = 63u - (unsigned)__builtin_clzll(us);
	idx = 4 * (e - 1) + (unsigned)((us >> (e - 2)) & 3);
	return idx < FMC_RTT_BUCKETS ? idx : FMC_RTT_BUCKETS - 1;
}

/* The lowest value (ns) of bucket idx; idx = FMC_RTT_BUCKETS: infinity. */
static inline uint64_t fmc_rtt_bucket_low_ns(unsigned idx)
{
	if (idx >= FMC_RTT_BUCKETS)
		return UINT64_MAX;
	if (idx < 4)
		return idx * 1000ull;
	return ((4ull + idx % 4) << (idx / 4 - 1)) * 1000ull;
}

/* Peer values. */
enum fmc_peer {
	FMC_P_STATE,           /* 0 down, 1 connecting, 2 up, 3 closing */
	FMC_P_TRANSPORT,       /* 0 tcp, 1 rdma */
	FMC_P_OUTBOUND,        /* 1: we connect to it */
	FMC_P_FLOWS,           /* flows on it (gauge) */
	FMC_P_BYTES_TX,
	FMC_P_BYTES_RX,
	FMC_P_FRAMES_TX,       /* frame headers sent (data, control, ack,
				* heartbeat) */
	FMC_P_FRAMES_RX,
	FMC_P_SENDS,           /* sends posted (TCP sendmsg / RDMA chains) */
	FMC_P_RECONNECTS,
	FMC_P_HEARTBEATS_MISSED, /* whole heartbeat periods (1 s) in which
				  * nothing came from an up peer */
	FMC_P_REGISTRATIONS,   /* RDMA: flow rings registered (gauge) */
	FMC_P_PINNED_BYTES,    /* ... their bytes (gauge) */
	FMC_P_WR_POSTED,       /* RDMA work requests posted */
	FMC_P_WC_POLLED,       /* RDMA completions polled */
	FMC_P_RTT_COUNT,       /* acknowledgements timed */
	FMC_P_RTT_SUM_NS,
	FMC_P_RTT_MAX_NS,      /* the largest since moverd started */
	FMC_P_RTT_BUCKET0,     /* FMC_RTT_BUCKETS cumulative counts */
	/* the connection window (moverd/mover.c): bytes of data it lets be
	 * unacknowledged (gauge), those that are (gauge), and its cuts */
	FMC_P_WINDOW = FMC_P_RTT_BUCKET0 + FMC_RTT_BUCKETS,
	FMC_P_UNACKED,
	FMC_P_WINDOW_CUTS,
	FMC_P_COUNT
};
_Static_assert(FMC_P_COUNT <= FMC_VALUES, "peer values");

static inline size_t fmc_file_bytes(uint32_t n_flow, uint32_t n_peer)
{
	return FMC_HDR_BYTES + (size_t)(1 + n_flow + n_peer) * FMC_REC_BYTES;
}

static inline struct fmc_record *fmc_record(const struct fmc_header *h,
					    uint32_t i)
{
	return (struct fmc_record *)((char *)h + h->hdr_bytes +
				     (size_t)i * h->rec_bytes);
}

/* Index of the first flow record and the first peer record. */
static inline uint32_t fmc_first_flow(const struct fmc_header *h)
{
	(void)h;
	return 1;
}

static inline uint32_t fmc_first_peer(const struct fmc_header *h)
{
	return 1 + h->n_flow;
}

/* Does a mapping of `bytes` hold a counters file this reader knows? */
static inline bool fmc_valid(const struct fmc_header *h, size_t bytes)
{
	return bytes >= FMC_HDR_BYTES && h->magic == FMC_MAGIC &&
	       h->version == FMC_VERSION && h->hdr_bytes == FMC_HDR_BYTES &&
	       h->rec_bytes == FMC_REC_BYTES && h->values == FMC_VALUES &&
	       h->n_flow <= FMC_MAX_FLOW_RECS && h->n_peer <= FMC_PEER_RECS &&
	       bytes >= fmc_file_bytes(h->n_flow, h->n_peer);
}

/* ---- writer (moverd only) ------------------------------------------------ */

static inline void fmc_begin(struct fmc_record *r)
{
	uint64_t s = atomic_load_explicit(&r->seq, memory_order_relaxed);

	atomic_store_explicit(&r->seq, s + 1, memory_order_relaxed);
	/* the odd seq must be visible before any value changes: a reader
	 * that sees a new value then sees seq moved on */
	atomic_thread_fence(memory_order_release);
}

static inline void fmc_end(struct fmc_record *r)
{
	uint64_t s = atomic_load_explicit(&r->seq, memory_order_relaxed);

	/* release: every value stored above happens before the even seq */
	atomic_store_explicit(&r->seq, s + 1, memory_order_release);
}

static inline void fmc_set(struct fmc_record *r, unsigned i, uint64_t v)
{
	atomic_store_explicit(&r->v[i], v, memory_order_relaxed);
}

static inline void fmc_set_text(struct fmc_record *r, enum fmc_text t,
				const char *s)
{
	char buf[FMC_TEXT_BYTES] = { 0 };
	uint64_t w;

	for (size_t i = 0; s && s[i] && i < sizeof(buf) - 1; i++)
		buf[i] = s[i];
	for (unsigned i = 0; i < FMC_TEXT_WORDS; i++) {
		memcpy(&w, buf + 8 * i, 8);
		atomic_store_explicit(&r->text[t][i], w, memory_order_relaxed);
	}
}

/* ---- reader ------------------------------------------------------------- */

/* One record as read: a consistent copy. */
struct fmc_snap {
	uint32_t state, type;
	uint64_t incarnation;
	char text[FMC_TEXTS][FMC_TEXT_BYTES];
	uint64_t v[FMC_VALUES];
};

/* A consistent copy of r; false if it is free or moverd kept rewriting it. */
static inline bool fmc_read(const struct fmc_record *r, struct fmc_snap *out)
{
	struct fmc_record *w = (struct fmc_record *)r;

	for (int tries = 0; tries < FMC_READ_TRIES; tries++) {
		uint64_t s1 = atomic_load_explicit(&w->seq,
						   memory_order_acquire), s2, x;

		if (s1 & 1)
			continue;
		out->state = atomic_load_explicit(&w->state,
						  memory_order_relaxed);
		/* a free record is not copied: a reader's cost follows the
		 * flows and peers that exist, not the file's size */
		if (out->state != FMC_ACTIVE)
			return false;
		out->type = atomic_load_explicit(&w->type, memory_order_relaxed);
		out->incarnation = atomic_load_explicit(&w->incarnation,
							memory_order_relaxed);
		for (unsigned t = 0; t < FMC_TEXTS; t++)
			for (unsigned i = 0; i < FMC_TEXT_WORDS; i++) {
				x = atomic_load_explicit(&w->text[t][i],
							 memory_order_relaxed);
				memcpy(out->text[t] + 8 * i, &x, 8);
			}
		for (unsigned i = 0; i < FMC_VALUES; i++)
			out->v[i] = atomic_load_explicit(&w->v[i],
							 memory_order_relaxed);
		/* every load above happens before the second look at seq */
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit(&w->seq, memory_order_relaxed);
		if (s1 != s2)
			continue;
		for (unsigned t = 0; t < FMC_TEXTS; t++)
			out->text[t][FMC_TEXT_BYTES - 1] = 0;
		return out->state == FMC_ACTIVE;
	}
	return false;
}

/* Value at quantile q (0..1) of the window between two cumulative
 * histograms (now minus before; before may be NULL): the bucket's upper
 * bound, in ns; 0 if the window is empty. */
static inline uint64_t fmc_rtt_quantile(const uint64_t *now,
					const uint64_t *before, double q)
{
	uint64_t total = 0, seen = 0, want;

	for (unsigned i = 0; i < FMC_RTT_BUCKETS; i++)
		total += now[i] - (before ? before[i] : 0);
	if (!total)
		return 0;
	want = (uint64_t)(q * (double)total);
	if (want >= total)
		want = total - 1;
	for (unsigned i = 0; i < FMC_RTT_BUCKETS; i++) {
		seen += now[i] - (before ? before[i] : 0);
		if (seen > want)
			return i + 1 < FMC_RTT_BUCKETS ?
				fmc_rtt_bucket_low_ns(i + 1) :
				fmc_rtt_bucket_low_ns(i);
	}
	return 0;
}

#endif
