/*
 * ipc/ring.h - the flowmover shared-memory ring: layout and operations.
 *
 * This one header is the contract between every party that touches a ring:
 * libflowshm (producers and consumers in applications), moverd (which creates
 * rings, scans producer rings and deposits into consumer rings) and the
 * network transports (which copy spans of committed records byte for byte
 * into a peer ring of the same size, at the same offsets).
 *
 * ---------------------------------------------------------------------------
 * Memory layout of one ring object (a memfd or a file, mapped shared)
 * ---------------------------------------------------------------------------
 *
 *   offset 0       struct fr_shared   control page, FR_CTRL_BYTES (4 KiB)
 *   offset 4096    data area          ring_bytes, a power of two >= 4 KiB
 *
 * The control page is split into 128-byte lines so that the words written
 * by one side never share a cache line (or an adjacent-line prefetch pair)
 * with the words written by the other side:
 *
 *   line 0  geometry       written once at creation, read-only afterwards
 *   line 1  state          flags (CLOSED), recovery counter: rarely written
 *   line 2  producer side  tail: the claim position (all producers CAS it)
 *   line 3  consumer side  head: everything before it may be overwritten
 *   line 4  deposit side   published: deposit rings only (see below)
 *   line 5  data wake      futex word + "consumer is sleeping" flag
 *   line 6  space wake     futex word + "producers sleeping" count
 *
 * Positions are 64-bit byte counts that only grow ("free running"); the
 * offset of a position in the data area is pos & (ring_bytes - 1).  A
 * position never wraps in practice (2^64 bytes), so no ABA on positions.
 *
 * ---------------------------------------------------------------------------
 * Records
 * ---------------------------------------------------------------------------
 *
 * Every record starts with a 16-byte struct fr_rec and is followed by its
 * payload; the total size is rounded up to FR_ALIGN (16) bytes, so every
 * record header and payload is 8-byte (in fact 16-byte) aligned.  A record is
 * always contiguous in the data area: when it would cross the end of the
 * data area, a PAD record fills the rest of the lap and the record starts at
 * offset 0 of the next lap.  A reader may therefore use a payload in place.
 *
 *   seal   (pos ^ seal_key) | state     state = CLAIMED (1) or COMMITTED (2)
 *   len    payload bytes (DATA) or bytes after the header (PAD)
 *   info   bit 31 = PAD; bits 0..30 = pid of the producer that claimed it
 *
 * The seal binds a header to its absolute position: a header left over from
 * an earlier lap at the same offset carries another position and never
 * matches, and stale payload bytes match only if they happen to equal a
 * 64-bit value mixed with the ring's random seal_key.  So a reader never
 * needs the data area to be zeroed.
 *
 * Producer protocol (any number of producer processes):
 *   1. claim:  CAS tail from t to t + need (need includes a PAD if the record
 *              must wrap).  Space is free when t + need - head <= ring_bytes.
 *   2. header: store len and info, then seal = CLAIMED (release), so that a
 *              recovering reader that sees CLAIMED can trust len and info.
 *   3. write the payload.
 *   4. commit: seal = COMMITTED (release): publishes header and payload.
 *   5. fence, then wake the consumer only if its sleeping flag is set.
 *
 * Consumer protocol (one consumer: an application or moverd):
 *   read the seal at head (acquire).  COMMITTED for this position: validate
 *   len against the geometry the consumer copied at attach time (never the
 *   shared copy), use the payload, then store head (release) to hand the
 *   space back, fence, and wake producers only if any is sleeping.
 *
 * Recovery of a producer killed between claim and commit: the consumer finds
 * head < tail and the seal at head not COMMITTED for longer than the
 * recovery timeout.  If the seal is CLAIMED and the pid in info is dead, the
 * record becomes a PAD of the claimed length.  If no header was written yet
 * (killed between the CAS and step 2), the consumer scans forward for the
 * next position that carries a CLAIMED or COMMITTED seal of its own (or up
 * to tail) and pads the gap.  Records of other producers are never touched.
 *
 * Deposit rings (the consumer end of a flow between hosts): moverd copies
 * spans into the data area in any byte order (RDMA gives no placement
 * order inside one WRITE) and then stores `published` (release).  The
 * consumer reads only below `published`, and a record there whose seal does
 * not match is corruption (-EPROTO), not "not yet written".
 *
 * ---------------------------------------------------------------------------
 * Sleeping and waking
 * ---------------------------------------------------------------------------
 * A side that wants to sleep reads the futex word, sets its flag, issues a
 * full fence, re-checks the ring and only then calls FUTEX_WAIT on the word.
 * The other side publishes (release store), issues a full fence, and reads
 * the flag; only when it is set does it bump the futex word and FUTEX_WAKE.
 * The two fences make it impossible for both to miss each other (Dekker);
 * the futex word closes the window between the re-check and the wait.  No
 * system call is made while nobody sleeps.
 */
#ifndef FLOWMOVER_IPC_RING_H
#define FLOWMOVER_IPC_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>

#define FR_MAGIC         0x474e49524d574c46ULL /* "FLWMRING" in memory */
#define FR_VERSION       1u
#define FR_CTRL_BYTES    4096u
#define FR_LINE          128u
#define FR_ALIGN         16u
#define FR_REC_HDR       16u
#define FR_MIN_RING      4096ull
#define FR_MAX_RING      (1ull << 34) /* 16 GiB */

#define FR_SEAL_CLAIMED   1ull
#define FR_SEAL_COMMITTED 2ull
#define FR_SEAL_STATE     7ull /* positions are 16-aligned: low bits are free */

#define FR_INFO_PAD      0x80000000u
#define FR_INFO_PID      0x7fffffffu

#define FR_FLAG_CLOSED   1u
#define FR_FLAG_FAILED   2u  /* with CLOSED: moverd failed the flow because
				of what it read in this ring: -EPROTO */

enum fr_mode {
	FR_MODE_LOCAL = 0,   /* producers commit by sealing each record */
	FR_MODE_DEPOSIT = 1, /* moverd deposits spans and stores `published` */
};

struct fr_rec {
	_Atomic uint64_t seal;
	_Atomic uint32_t len;
	_Atomic uint32_t info;
};

struct fr_geometry {
	uint64_t magic;
	uint32_t version;
	uint32_t ctrl_bytes;
	uint64_t ring_bytes;
	uint32_t max_record;
	uint32_t mode;
	uint64_t seal_key;
	uint64_t created_ns; /* CLOCK_REALTIME, for operators */
};

struct fr_shared {
	_Alignas(FR_LINE) struct fr_geometry geo;
	_Alignas(FR_LINE) _Atomic uint32_t flags;
	_Atomic uint32_t recovered; /* records turned into padding */
	_Alignas(FR_LINE) _Atomic uint64_t tail;
	_Alignas(FR_LINE) _Atomic uint64_t head;
	_Alignas(FR_LINE) _Atomic uint64_t published;
	_Alignas(FR_LINE) _Atomic uint32_t data_futex;
	_Atomic uint32_t consumer_waiting;
	_Alignas(FR_LINE) _Atomic uint32_t space_futex;
	_Atomic uint32_t producers_waiting;
};

_Static_assert(sizeof(struct fr_shared) <= FR_CTRL_BYTES, "control page");
_Static_assert(sizeof(struct fr_rec) == FR_REC_HDR, "record header");

/* Parameters of a new ring. */
struct fr_params {
	uint64_t ring_bytes; /* power of two, FR_MIN_RING..FR_MAX_RING */
	uint32_t max_record; /* 1..ring_bytes/2 payload bytes */
	uint32_t mode;       /* enum fr_mode */
	uint64_t seal_key;   /* 0 = pick a random key */
	uint64_t start;      /* first position (FR_ALIGN-aligned): a deposit
				ring resumes where its producer ring stands */
};

/*
 * A process's private view of a mapped ring.  Geometry is copied here once,
 * after validation, and never re-read from shared memory: a client that
 * scribbles on the control page cannot make us index out of bounds.
 */
struct fr_ring {
	struct fr_shared *sh;
	unsigned char *data;
	uint64_t size;       /* ring_bytes */
	uint64_t mask;       /* size - 1 */
	uint64_t key;        /* seal_key with the low state bits cleared */
	uint32_t max_record;
	uint32_t mode;
	size_t map_bytes;

	/* consumer side */
	uint64_t head;       /* private copy; the consumer is head's only writer */
	uint64_t tail_cache; /* last tail seen (deposit: last published seen) */
	uint64_t stuck_pos;  /* recovery: position we found not committed */
	uint64_t stuck_since_ns;
	uint64_t recover_ns; /* recovery timeout, 0 = never */

	/* producer side */
	uint64_t head_cache; /* last head seen; refreshed only when full */
	uint32_t pid;
};

/* Sizes. */
static inline uint64_t fr_align(uint64_t n)
{
	return (n + FR_ALIGN - 1) & ~(uint64_t)(FR_ALIGN - 1);
}

/* Bytes a record of `len` payload bytes occupies in the data area. */
static inline uint64_t fr_record_bytes(uint64_t len)
{
	return fr_align(FR_REC_HDR + len);
}

static inline size_t fr_map_bytes(uint64_t ring_bytes)
{
	return (size_t)(FR_CTRL_BYTES + ring_bytes);
}

static inline uint64_t fr_seal(const struct fr_ring *r, uint64_t pos,
			       uint64_t state)
{
	return (pos ^ r->key) | state;
}

static inline struct fr_rec *fr_rec_at(const struct fr_ring *r, uint64_t pos)
{
	return (struct fr_rec *)(r->data + (pos & r->mask));
}

/* Bytes from pos to the end of its lap. */
static inline uint64_t fr_lap_rest(const struct fr_ring *r, uint64_t pos)
{
	return r->size - (pos & r->mask);
}

static inline bool fr_closed(const struct fr_ring *r)
{
	/* acquire: a reader that sees CLOSED also sees the final positions */
	return atomic_load_explicit(&r->sh->flags, memory_order_acquire) &
	       FR_FLAG_CLOSED;
}

/* What a closed ring's ends get: -EPROTO if moverd failed the flow for
 * what it found in the ring, else -EPIPE. */
static inline int fr_closed_rc(const struct fr_ring *r)
{
	return atomic_load_explicit(&r->sh->flags, memory_order_acquire) &
	       FR_FLAG_FAILED ? -EPROTO : -EPIPE;
}

/* --- set-up (ring.c) ---------------------------------------------------- */

/* Validate params; 0 or -EINVAL. */
int fr_params_check(const struct fr_params *p);

/* Initialise a zeroed mapping of fr_map_bytes(p->ring_bytes) bytes. */
void fr_format(void *map, const struct fr_params *p);

/*
 * Validate the control page of a mapping of map_bytes bytes and fill *r.
 * -EPROTO for a bad magic, version, geometry or size mismatch.
 */
int fr_attach(struct fr_ring *r, void *map, size_t map_bytes);

/* Mark the ring closed and wake every sleeper on both sides. */
void fr_close(struct fr_ring *r);
/* The same, and its ends get -EPROTO (FR_FLAG_FAILED): moverd's verdict
 * on a ring whose words its own client corrupted. */
void fr_fail(struct fr_ring *r);

/* --- producer (ring.c) --------------------------------------------------- */

/*
 * A claim: `n` records placed back to back from `pos`; their headers are
 * written (CLAIMED) and their payload pointers are fr_rec_at(pos)+1, etc.
 */
struct fr_claim {
	uint64_t pos;   /* position of the first record */
	uint64_t end;   /* position after the last record */
	unsigned n;
};

/*
 * Claim space for up to `n` records whose payload lengths are lens[i]
 * (each already checked to be 1..max_record).  Claims as many as fit,
 * contiguously, within one lap; at least one, or none and returns -EAGAIN
 * (full), -EPIPE (closed) or -EPROTO (positions corrupt).  A PAD at the end
 * of a lap is written and committed here when needed.
 */
int fr_claim(struct fr_ring *r, const uint32_t *lens, unsigned n,
	     struct fr_claim *c);

/* Commit every record of a claim, then wake the consumer if it sleeps. */
void fr_commit(struct fr_ring *r, const struct fr_claim *c);

/* Free bytes right now as seen by a producer (refreshes the head cache). */
int fr_refresh_head(struct fr_ring *r, uint64_t *free_bytes);

/* --- consumer (ring.c) --------------------------------------------------- */

/*
 * Find the record at the consumer's head, skipping (and releasing) padding.
 * On 0, *rec is the validated record at r->head with *len payload bytes.
 * -EAGAIN: none committed yet; -EPIPE: closed and drained; -EPROTO: corrupt.
 * May run producer-crash recovery (see above) when stuck long enough.
 */
int fr_peek(struct fr_ring *r, const struct fr_rec **rec, uint32_t *len);

/* Release everything before `pos` (a position returned by fr_peek + size). */
void fr_release(struct fr_ring *r, uint64_t pos);

/*
 * For moverd, the consumer of a producer ring that sends spans to a peer:
 * the end of the run of committed records from `pos`, stopping before
 * `limit` (records are never split).  Pads count as records.  *stuck is set
 * when the run stops at a record claimed but not committed (a caller may
 * then run fr_check_stuck).  -EPROTO if a committed header is invalid.
 */
int fr_scan(const struct fr_ring *r, uint64_t pos, uint64_t limit,
	    uint64_t *end, bool *stuck);

/* Producer-crash recovery at pos (see above), for scanners.  0 = the
 * record at pos was turned into padding; -EAGAIN = keep waiting. */
int fr_check_stuck(struct fr_ring *r, uint64_t pos);

/* --- waiting (ring.c) ---------------------------------------------------- */

/* Sleep until data may be there, closed, or deadline (CLOCK_MONOTONIC ns;
 * UINT64_MAX = forever).  Returns 0 or -ETIMEDOUT; callers re-check. */
int fr_wait_data(struct fr_ring *r, uint64_t deadline_ns);
int fr_wait_space(struct fr_ring *r, uint64_t deadline_ns);

/* --- deposit rings (ring.c) ---------------------------------------------- */

/* Publish deposited bytes up to `pos` and wake the consumer if it sleeps. */
void fr_publish(struct fr_ring *r, uint64_t pos);

uint64_t fr_now_ns(void);

#endif
