/*
 * ipc/ring.c - slow paths and protocol steps of the shared ring.
 * The layout and the protocol are documented in ring.h; this file only
 * implements them.  Every ordering below is annotated with its reason.
 */
#include "ring.h"
#include "barrier.h"
#include "futex.h"
#include "bell.h"
#include "lattrace.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t fr_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

int fr_params_check(const struct fr_params *p)
{
	if (!is_pow2(p->ring_bytes) || p->ring_bytes < FR_MIN_RING ||
	    p->ring_bytes > FR_MAX_RING)
		return -EINVAL;
	if (p->max_record == 0 || p->max_record > p->ring_bytes / 2)
		return -EINVAL;
	if (p->mode != FR_MODE_LOCAL && p->mode != FR_MODE_DEPOSIT)
		return -EINVAL;
	if (p->start % FR_ALIGN || p->start > FR_START_MAX)
		return -EINVAL;
	return 0;
}

static uint64_t random_key(void)
{
	uint64_t k = 0;

	if (getrandom(&k, sizeof(k), 0) != sizeof(k))
		k = fr_now_ns() * 0x9e3779b97f4a7c15ull;
	return k;
}

void fr_format(void *map, const struct fr_params *p)
{
	struct fr_shared *sh = map;
	uint64_t key = p->seal_key ? p->seal_key : random_key();
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	sh->geo.version = FR_VERSION;
	sh->geo.ctrl_bytes = FR_CTRL_BYTES;
	sh->geo.ring_bytes = p->ring_bytes;
	sh->geo.max_record = p->max_record;
	sh->geo.mode = p->mode;
	sh->geo.seal_key = key & ~(FR_ALIGN - 1ull);
	sh->geo.created_ns = (uint64_t)ts.tv_sec * 1000000000ull +
			     (uint64_t)ts.tv_nsec;
	atomic_store_explicit(&sh->tail, p->start, memory_order_relaxed);
	atomic_store_explicit(&sh->floor, p->start, memory_order_relaxed);
	atomic_store_explicit(&sh->published, p->start, memory_order_relaxed);
	/*
	 * The magic goes last, with release: whoever attaches and sees it
	 * also sees a complete geometry (matters for rings in shared files).
	 */
	atomic_store_explicit((_Atomic uint64_t *)&sh->geo.magic, FR_MAGIC,
			      memory_order_release);
}

static uint64_t attach_bound(struct fr_shared *sh, uint32_t mode)
{
	return mode == FR_MODE_DEPOSIT ?
		       atomic_load_explicit(&sh->published, memory_order_acquire) :
		       atomic_load_explicit(&sh->tail, memory_order_acquire);
}

int fr_attach(struct fr_ring *r, void *map, size_t map_bytes)
{
	struct fr_shared *sh = map;
	struct fr_geometry g;
	struct fr_params p;
	uint64_t floor, tail, before;

	/* before this process's first light fence on any ring */
	fm_barrier_register();
	if (map_bytes < FR_CTRL_BYTES + FR_MIN_RING)
		return -EPROTO;
	/* acquire pairs with the release of the magic in fr_format */
	g.magic = atomic_load_explicit((_Atomic uint64_t *)&sh->geo.magic,
				       memory_order_acquire);
	memcpy((char *)&g + sizeof(g.magic), (char *)&sh->geo + sizeof(g.magic),
	       sizeof(g) - sizeof(g.magic));
	if (g.magic != FR_MAGIC || g.version != FR_VERSION ||
	    g.ctrl_bytes != FR_CTRL_BYTES)
		return -EPROTO;
	p = (struct fr_params){ .ring_bytes = g.ring_bytes,
				.max_record = g.max_record,
				.mode = g.mode };
	if (fr_params_check(&p) || map_bytes != fr_map_bytes(g.ring_bytes))
		return -EPROTO;

	/* the bound before and after the floor, as in refresh_min (acquire:
	 * the positions written before them) */
	before = attach_bound(sh, g.mode);
	floor = atomic_load_explicit(&sh->floor, memory_order_acquire);
	tail = attach_bound(sh, g.mode);
	if (floor > tail || (before > floor && before - floor > g.ring_bytes) ||
	    (floor | tail) % FR_ALIGN)
		return -EPROTO;

	*r = (struct fr_ring){
		.sh = sh,
		.data = (unsigned char *)map + FR_CTRL_BYTES,
		.size = g.ring_bytes,
		.mask = g.ring_bytes - 1,
		.key = g.seal_key & ~(FR_ALIGN - 1ull),
		.max_record = g.max_record,
		.mode = g.mode,
		.map_bytes = map_bytes,
		.head = floor,
		.head_pub = floor,
		.pub_every = g.ring_bytes / 8 < FR_PUBLISH_BYTES ?
				     g.ring_bytes / 8 : FR_PUBLISH_BYTES,
		.tail_cache = tail,
		.stuck_pos = UINT64_MAX,
		.sub = FR_MAX_SUBS,
		.prod = FR_MAX_PRODS,
		/* the floor is never above what a producer may rely on
		 * (see refresh_min): a safe first head cache */
		.head_cache = floor,
		.pid = (uint32_t)getpid() & FR_INFO_PID,
		.self_pid = (uint32_t)getpid() & FR_INFO_PID,
	};
	return 0;
}

static void wake_all(_Atomic uint32_t *word)
{
	/* release: a woken sleeper that reads the word sees what we did */
	atomic_fetch_add_explicit(word, 1, memory_order_release);
	fm_futex_wake(word);
}

/*
 * How many times a loop retries a compare-and-swap on a shared word.  A
 * client that keeps changing the word (the tail, the floor) must not hold
 * moverd's event loop, or another client, for ever; honest contenders (at
 * most FR_MAX_PRODS producers) never come near it.
 */
#define CAS_TRIES_MAX (1u << 16)

/*
 * A leave of a slot (ring.h, Sleeping and waking: sleepers that die
 * asleep): take the slot's whole sleep mark and lower the count by it,
 * never below zero nor into the flag bit `high` (a mark a client
 * scribbled).  Then wake that side: a holder that was alive after all
 * wakes and counts itself again.  True if the mark held any.
 */
static bool sleepers_reclaim(_Atomic uint32_t *count, _Atomic uint32_t *mark,
			     uint32_t high, _Atomic uint32_t *word)
{
	/* acquire: pairs with fr_sleeper_in's release add, so each unit's
	 * raise of the count comes before our lowering of it */
	uint32_t m = atomic_exchange_explicit(mark, 0, memory_order_acquire);
	uint32_t c, d;

	if (!m)
		return false;
	/* relaxed: the count only tells wakers whether to wake; the CAS
	 * keeps the clamp exact against raises and lowerings meanwhile */
	c = atomic_load_explicit(count, memory_order_relaxed);
	for (unsigned tries = 0; tries < CAS_TRIES_MAX; tries++) {
		d = (c & ~high) < m ? c & ~high : m;
		if (atomic_compare_exchange_weak_explicit(count, &c, c - d,
							  memory_order_relaxed,
							  memory_order_relaxed))
			break;
	}
	wake_all(word);
	return true;
}

static void close_with(struct fr_ring *r, uint32_t flags)
{
	/* seq_cst RMW: ordered before our reads of the sleeper flags */
	atomic_fetch_or(&r->sh->flags, flags);
	wake_all(&r->sh->data_futex);
	wake_all(&r->sh->space_futex);
}

void fr_close(struct fr_ring *r)
{
	close_with(r, FR_FLAG_CLOSED);
}

void fr_fail(struct fr_ring *r)
{
	close_with(r, FR_FLAG_CLOSED | FR_FLAG_FAILED);
}

/* ---- producer ----------------------------------------------------------- */

void fr_bell_arm(struct fr_ring *r)
{
	atomic_store_explicit(&r->sh->bell_armed, 1, memory_order_relaxed);
	/* full fence: the arm is visible before moverd re-checks the ring;
	 * a producer does the mirror image (seal release, fence, read of
	 * bell_armed in wake_consumer), so one of the two sees the other */
	atomic_thread_fence(memory_order_seq_cst);
}

/*
 * The doorbell: only a handle that got the page from moverd rings it.  The
 * exchange makes one of several producers ring; relaxed is enough, the
 * caller's fence already orders our commit before it and fb_ring fences
 * again before it reads moverd's sleeping flag.
 */
static void ring_bell(struct fr_ring *r)
{
	if (r->bell &&
	    atomic_load_explicit(&r->sh->bell_armed, memory_order_relaxed) &&
	    atomic_exchange_explicit(&r->sh->bell_armed, 0,
				     memory_order_relaxed)) {
		/* moverd was asleep: the count is exact while the flow idles */
		fr_count_flush(r);
		fb_ring(r->bell, r->bell_index);
	}
}

static void wake_consumer(struct fr_ring *r)
{
	/*
	 * Fence between our release store of a seal (or of `published`) and
	 * the read of the sleeper count; the consumer does the mirror image
	 * (count, fence, ring re-check, heavy fence before a long sleep), so
	 * one of us sees the other.  Light: ipc/barrier.h.
	 */
	fm_fence_light();
	if (atomic_load_explicit(&r->sh->consumers_waiting,
				 memory_order_relaxed)) {
		fmlt_mark(LT_CONS_WAKE, 0);
		/* a quiet moment: the count is exact while the flow idles */
		fr_count_flush(r);
		wake_all(&r->sh->data_futex);
	}
	ring_bell(r);
}

/* The max_lag this handle goes by: moverd's pinned one, else the ring's
 * word (relaxed: a setting, read once per decision). */
static uint64_t max_lag_of(const struct fr_ring *r)
{
	if (r->lag_pinned)
		return r->lag_pin;
	return atomic_load_explicit(&r->sh->max_lag, memory_order_relaxed);
}

void fr_pin_max_lag(struct fr_ring *r, uint64_t lag)
{
	r->lag_pinned = true;
	r->lag_pin = lag;
	/* relaxed: producers read it as a setting; one that reads the old
	 * value at a full ring cuts by it once, as if this came later */
	atomic_store_explicit(&r->sh->max_lag, lag, memory_order_relaxed);
}

/* A full ring with max_lag: moverd's HELD slots are cut by moverd alone
 * (ring.h, Subscribers), so ring the doorbell for it to look now.  Relaxed:
 * a look it misses is made by its once-a-second flow check. */
static void full_with_lag(struct fr_ring *r)
{
	if (max_lag_of(r))
		ring_bell(r);
}

static void pad_one(struct fr_ring *r, uint64_t pos, uint64_t bytes)
{
	struct fr_rec *h = fr_rec_at(r, pos);

	atomic_store_explicit(&h->len, (uint32_t)(bytes - FR_REC_HDR),
			      memory_order_relaxed);
	atomic_store_explicit(&h->info, FR_INFO_PAD | r->pid,
			      memory_order_relaxed);
	/* release: a reader that sees the seal sees len and info */
	atomic_store_explicit(&h->seal, fr_seal(r, pos, FR_SEAL_COMMITTED),
			      memory_order_release);
}

/* A pad's length is 32 bits: a refused batch on a ring of 8 GiB or more
 * may span more, which goes as several pads (front to back: a reader
 * that passed one waits at the next until it is sealed). */
#define PAD_MAX (1ull << 31)

static void pad_at(struct fr_ring *r, uint64_t pos, uint64_t bytes)
{
	for (; bytes > PAD_MAX; pos += PAD_MAX, bytes -= PAD_MAX)
		pad_one(r, pos, PAD_MAX);
	pad_one(r, pos, bytes);
}

bool fr_split_pad(struct fr_ring *r, uint64_t pos, uint64_t piece)
{
	struct fr_rec *h = fr_rec_at(r, pos);
	uint64_t bytes, q;
	uint32_t l, info;

	/* acquire: pairs with the seal's release, so the len and info read
	 * after it are the committed ones (or a client's later scribble,
	 * checked below as the scan checks it) */
	if (atomic_load_explicit(&h->seal, memory_order_acquire) !=
	    fr_seal(r, pos, FR_SEAL_COMMITTED))
		return false;
	l = atomic_load_explicit(&h->len, memory_order_relaxed);
	info = atomic_load_explicit(&h->info, memory_order_relaxed);
	bytes = FR_REC_HDR + (uint64_t)l;
	/* not a pad, short enough, or one the scan refuses (the flow's
	 * failure is the scan's to say) */
	if (!(info & FR_INFO_PAD) || bytes <= piece || l % FR_ALIGN ||
	    bytes > fr_lap_rest(r, pos) || bytes > PAD_MAX ||
	    piece % FR_ALIGN || piece < FR_REC_HDR)
		return false;
	/* back to front: each pad is sealed (release) before the length
	 * that leads a reader to it */
	for (q = pos + (bytes - 1) / piece * piece; q > pos; q -= piece)
		pad_one(r, q, pos + bytes - q < piece ? pos + bytes - q : piece);
	pad_one(r, pos, piece);
	return true;
}

/* ---- subscriber positions, as producers see them ------------------------- */

#define SUB_ALL ((1u << FR_MAX_SUBS) - 1u)

static uint32_t sub_mask(const struct fr_ring *r)
{
	/* seq_cst: the mask is the pivot of the join protocol (fr_sub_take
	 * and refresh_min); see refresh_min */
	return atomic_load(&((struct fr_shared *)r->sh)->sub_mask) & SUB_ALL;
}

static bool leave_dead_blockers(struct fr_ring *r);

static uint64_t min_of(const struct fr_ring *r, uint32_t mask)
{
	uint64_t m = UINT64_MAX;

	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		uint64_t p;

		if (!(mask & (1u << i)))
			continue;
		/* acquire: pairs with the subscriber's release of pos, so its
		 * reads of the records below pos happen before we overwrite */
		p = atomic_load_explicit(&r->sh->subs[i].pos,
					 memory_order_acquire);
		if (p < m)
			m = p;
	}
	return m;
}

uint64_t fr_min_pos(const struct fr_ring *r)
{
	uint32_t mask = sub_mask(r);

	if (mask)
		return min_of(r, mask);
	/* acquire: the last leaver's position and its reads */
	return atomic_load_explicit(&r->sh->floor, memory_order_acquire);
}

static void fetch_max(_Atomic uint64_t *w, uint64_t v)
{
	uint64_t cur = atomic_load(w);

	/* seq_cst: see refresh_min (a joiner reads the floor after its mask
	 * bit; one of the two sees the other).  Given up after
	 * CAS_TRIES_MAX: only a client rewriting the floor gets that far */
	for (unsigned tries = 0; cur < v && tries < CAS_TRIES_MAX; tries++)
		if (atomic_compare_exchange_weak(w, &cur, v))
			break;
}

static uint64_t bound_pos(const struct fr_ring *r)
{
	/* acquire: read after the subscriber positions, so an honest
	 * position is never above it */
	return r->mode == FR_MODE_DEPOSIT ?
		       atomic_load_explicit(&r->sh->published,
					    memory_order_acquire) :
		       atomic_load_explicit(&r->sh->tail, memory_order_acquire);
}

/*
 * The producers' view of the minimum position, made safe against a
 * subscriber joining meanwhile.  A joiner stores its pos, sets its mask bit
 * and then reads the floor and moves its pos up to it (fr_sub_take); a
 * producer computes the minimum, raises the floor to it (seq_cst) and
 * re-reads the mask: either it sees the joiner's bit and computes again
 * (with the joiner's pos), or the joiner sees the raised floor and moves up
 * past it.  The value kept in head_cache never decreases: a lower minimum
 * comes only from a joiner that is about to move up past the floor, or
 * from a client lowering its own word, and neither may hold producers back
 * below what they already relied on.
 */
static int refresh_min(struct fr_ring *r)
{
	for (int tries = 0; tries < 8; tries++) {
		/* the bound read before the positions: a position read later
		 * is never more than a ring behind it (positions only grow);
		 * the bound read after: never below an honest position */
		uint64_t before = bound_pos(r);
		uint32_t mask = sub_mask(r);
		uint64_t m = mask ? min_of(r, mask) :
				    atomic_load(&r->sh->floor);
		uint64_t after = bound_pos(r);

		if (m < r->head_cache)
			m = r->head_cache;
		if (m > after || (before > m && before - m > r->size) ||
		    m % FR_ALIGN)
			return -EPROTO;
		fetch_max(&r->sh->floor, m);
		if (sub_mask(r) == mask) {
			r->head_cache = m;
			return 0;
		}
	}
	return 0; /* the mask keeps changing: keep the old cache (safe) */
}

int fr_refresh_head(struct fr_ring *r, uint64_t *free_bytes)
{
	uint64_t tail;
	int rc = refresh_min(r);

	if (rc)
		return rc;
	tail = bound_pos(r);
	if (free_bytes)
		*free_bytes = tail < r->head_cache ||
					      tail - r->head_cache > r->size ?
				      0 :
				      r->size - (tail - r->head_cache);
	return 0;
}

/* max_lag: cut off the subscribers more than max_lag behind tail.  True if
 * one was cut (the minimum may have moved). */
static bool cut_laggards(struct fr_ring *r, uint64_t tail)
{
	uint64_t lag = max_lag_of(r);
	uint32_t mask;
	bool cut = false;

	if (!lag)
		return false;
	mask = sub_mask(r);
	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		struct fr_sub *s = &r->sh->subs[i];
		uint32_t st = FR_SUB_ACTIVE;
		uint64_t p;

		if (!(mask & (1u << i)))
			continue;
		p = atomic_load_explicit(&s->pos, memory_order_relaxed);
		if (p >= tail || tail - p <= lag)
			continue;
		/* CAS: of several producers (or a leave) one decides */
		if (atomic_compare_exchange_strong(&s->state, &st, FR_SUB_CUT)) {
			atomic_fetch_and(&r->sh->sub_mask, ~(1u << i));
			cut = true;
		}
	}
	return cut;
}

/* How many of lens[] fit back to back from start, within its lap and limit. */
static unsigned fit(const struct fr_ring *r, const uint32_t *lens, unsigned n,
		    uint64_t start, uint64_t limit, uint64_t *end)
{
	uint64_t lap_end = start + fr_lap_rest(r, start);
	uint64_t p = start;
	unsigned k = 0;

	if (limit > lap_end)
		limit = lap_end;
	while (k < n && p + fr_record_bytes(lens[k]) <= limit)
		p += fr_record_bytes(lens[k++]);
	*end = p;
	return k;
}

static void write_claims(struct fr_ring *r, const uint32_t *lens,
			 const struct fr_claim *c)
{
	uint64_t p = c->pos;

	for (unsigned i = 0; i < c->n; i++) {
		struct fr_rec *h = fr_rec_at(r, p);

		atomic_store_explicit(&h->len, lens[i], memory_order_relaxed);
		atomic_store_explicit(&h->info, r->pid, memory_order_relaxed);
		/* release: recovery trusts len/info once it sees CLAIMED */
		atomic_store_explicit(&h->seal, fr_seal(r, p, FR_SEAL_CLAIMED),
				      memory_order_release);
		p += fr_record_bytes(lens[i]);
	}
}

void fr_want_space(struct fr_ring *r)
{
	_Atomic uint32_t *w = &r->sh->producers_waiting;

	/* relaxed: a hint that the subscribers read on their next release.
	 * Read first, so a caller polling a full ring does not keep taking
	 * the line from them */
	if (!(atomic_load_explicit(w, memory_order_relaxed) & FR_SPACE_WANTED))
		atomic_fetch_or_explicit(w, FR_SPACE_WANTED,
					 memory_order_relaxed);
	full_with_lag(r);
	leave_dead_blockers(r);
	fr_count_flush(r);
}

static bool ending(const struct fr_ring *r)
{
	/* seq_cst: after our tail CAS, against fr_write_end's fetch_or of
	 * ENDING before its own claim: either we see ENDING, or our claim
	 * comes before the END record's in tail's order */
	return atomic_load(&((struct fr_shared *)r->sh)->flags) &
	       (FR_FLAG_ENDING | FR_FLAG_ENDED);
}

/* A claim won after the stream ended: give the space back as padding. */
static int refuse_claim(struct fr_ring *r, uint64_t t, uint64_t pad,
			uint64_t end)
{
	if (pad)
		pad_at(r, t, pad);
	if (end > t + pad)
		pad_at(r, t + pad, end - t - pad);
	wake_consumer(r);
	return -EPIPE;
}

/* Room from t for the claim, refreshing the minimum (and cutting
 * laggards) when the cache says full. */
static unsigned fit_or_refresh(struct fr_ring *r, const uint32_t *lens,
			       unsigned n, uint64_t t, uint64_t pad,
			       uint64_t *end, int *rc)
{
	unsigned k = fit(r, lens, n, t + pad, r->head_cache + r->size, end);

	*rc = 0;
	if (k)
		return k;
	if ((*rc = refresh_min(r)))
		return 0;
	k = fit(r, lens, n, t + pad, r->head_cache + r->size, end);
	if (k || !cut_laggards(r, t))
		return k;
	if ((*rc = refresh_min(r)))
		return 0;
	return fit(r, lens, n, t + pad, r->head_cache + r->size, end);
}

/*
 * Our slot names the claim we are about to make from t or above (ring.h,
 * Producer slots): stored once, before the first CAS attempt.  Release: a
 * recoverer that reads this value also sees our headers of every earlier
 * claim (stored before it), so it can tell a gap of ours from one of a
 * dead producer.  It is ordered before the tail CAS, which is seq_cst: a
 * recoverer that acquires a tail past our claim reads this value or a
 * later one of ours.
 */
static void claim_busy(struct fr_ring *r, uint64_t t)
{
	if (r->prod < FR_MAX_PRODS)
		atomic_store_explicit(&fr_prod_at(r, r->prod)->claim,
				      t | FR_CLAIM_BUSY, memory_order_release);
}

/* Every header of the claim is written (or it was given up). */
static void claim_done(struct fr_ring *r)
{
	/* release: who reads the slot idle also sees our headers (CLAIMED,
	 * or the pads of a refused claim) */
	if (r->prod < FR_MAX_PRODS)
		atomic_store_explicit(&fr_prod_at(r, r->prod)->claim, 0,
				      memory_order_release);
}

static int claim_records(struct fr_ring *r, const uint32_t *lens, unsigned n,
			 struct fr_claim *c, bool end_record)
{
	/* relaxed: the CAS below validates the value we start from */
	uint64_t t = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);
	bool named = false;

	for (unsigned tries = 0;; tries++) {
		uint64_t rest, pad, end;
		unsigned k;
		int rc;

		/* a client moving the tail under every CAS: "full" for now */
		if (tries == CAS_TRIES_MAX)
			return -EAGAIN;

		if (fr_closed(r))
			return fr_closed_rc(r);
		if (!end_record && ending(r))
			return -EPIPE;
		/* tail is shared: a client may have written anything there,
		 * and our record headers would land where it says */
		if (t % FR_ALIGN)
			return -EPROTO;
		if (t < r->head_cache || t - r->head_cache > r->size) {
			/* our cache is a lap behind, or t is older than it */
			rc = refresh_min(r);
			if (rc)
				return rc;
			if (t < r->head_cache) {
				t = atomic_load_explicit(&r->sh->tail,
							 memory_order_relaxed);
				continue;
			}
			if (t - r->head_cache > r->size)
				return -EPROTO;
		}
		rest = fr_lap_rest(r, t);
		pad = fr_record_bytes(lens[0]) > rest ? rest : 0;
		k = fit_or_refresh(r, lens, n, t, pad, &end, &rc);
		if (rc)
			return rc;
		if (k == 0) {
			/* Not even one record: claim the padding alone if it
			 * fits, so the record can start the next lap. */
			if (!pad || t + pad > r->head_cache + r->size)
				return -EAGAIN;
			end = t + pad;
		}
		if (!named) {
			claim_busy(r, t);
			named = true;
		}
		/*
		 * seq_cst on success: our writes into the claimed space stay
		 * after the claim (acquire), and the claim is ordered before
		 * our read of ENDING (see ending()).  On failure t is
		 * reloaded and we retry.
		 */
		if (!atomic_compare_exchange_weak_explicit(
			    &r->sh->tail, &t, end, memory_order_seq_cst,
			    memory_order_relaxed))
			continue;
		if (!end_record && ending(r))
			return refuse_claim(r, t, pad, end);
		if (!end_record) {
			r->uncounted += k;
			if (r->uncounted >= FR_COUNT_EVERY)
				fr_count_flush(r);
		}
		if (pad) {
			pad_at(r, t, pad);
			/* a consumer asleep at the pad must move past it */
			wake_consumer(r);
		}
		if (k == 0) {
			t = end;
			continue;
		}
		*c = (struct fr_claim){ .pos = t + pad, .end = end, .n = k };
		write_claims(r, lens, c);
		return 0;
	}
}

/* A claim whose headers are written once it returns, busy in our slot
 * while it runs. */
static int claim_named(struct fr_ring *r, const uint32_t *lens, unsigned n,
		       struct fr_claim *c, bool end_record)
{
	int rc = claim_records(r, lens, n, c, end_record);

	claim_done(r);
	return rc;
}

int fr_claim(struct fr_ring *r, const uint32_t *lens, unsigned n,
	     struct fr_claim *c)
{
	return claim_named(r, lens, n, c, false);
}

void fr_commit(struct fr_ring *r, const struct fr_claim *c)
{
	uint64_t p = c->pos;

	for (unsigned i = 0; i < c->n && p < c->end; i++) {
		struct fr_rec *h = fr_rec_at(r, p);
		uint64_t bytes = fr_record_bytes(
			atomic_load_explicit(&h->len, memory_order_relaxed));

		/* the length is in shared memory, where another client may
		 * have rewritten it since we wrote it: never seal past our
		 * claim (the records after stay claimed, and recovery or
		 * the reader's checks deal with this flow's garbage) */
		if (bytes > c->end - p)
			break;
		/* release: header and payload are visible with the seal */
		atomic_store_explicit(&h->seal, fr_seal(r, p, FR_SEAL_COMMITTED),
				      memory_order_release);
		p += bytes;
	}
	wake_consumer(r);
}

void fr_cancel(struct fr_ring *r, const struct fr_claim *c)
{
	pad_at(r, c->pos, c->end - c->pos);
	if (c->n <= r->uncounted) {
		r->uncounted -= c->n;
	} else {
		/* the claim's own count took the handle to FR_COUNT_EVERY
		 * and was added to the shared word: take the rest back from
		 * there (relaxed, as fr_count_flush: a count for operators) */
		atomic_fetch_sub_explicit(&r->sh->records,
					  c->n - r->uncounted,
					  memory_order_relaxed);
		r->uncounted = 0;
	}
	wake_consumer(r);
}

void fr_producer_number(struct fr_ring *r)
{
	/* relaxed: the number only has to differ between attaches */
	uint32_t n = atomic_fetch_add_explicit(&r->sh->producer_seq, 1,
					       memory_order_relaxed);

	r->pid = r->self_pid | ((n & 0xffu) << FR_INFO_ATTACH_SHIFT);
}

/* The inode of one of our namespaces (/proc/self/ns/NAME), 0 if unknown. */
static uint64_t ns_inode(const char *path)
{
	struct stat st;

	return stat(path, &st) ? 0 : (uint64_t)st.st_ino;
}

uint64_t fr_pid_ns(void)
{
	return ns_inode("/proc/self/ns/pid");
}

void fr_pid_view(struct fr_ring *r, uint32_t seen_pid, bool same_ns)
{
	r->self_pid = seen_pid && seen_pid < FR_PID_UNKNOWN ? seen_pid :
							      FR_PID_UNKNOWN;
	r->pid = (r->pid & ~FR_INFO_PID) | r->self_pid;
	r->pids_foreign = !same_ns;
}

/* ---- liveness (ring.h, Liveness) ----------------------------------------- */

/* What /proc says of pid: its state letter and its start time (clock ticks
 * after boot, as our time namespace counts them).  False if unreadable. */
static bool proc_stat(uint32_t pid, char *state, uint64_t *start)
{
	char path[64], buf[512];
	const char *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	/* the command name may hold ')' and ' ': the last ')' ends it */
	p = strrchr(buf, ')');
	if (!p || p[1] != ' ' || !p[2])
		return false;
	*state = p[2];
	/* from the state (field 3), 19 fields on to the start time (22) */
	p += 2;
	for (int i = 0; i < 19; i++) {
		p = strchr(p, ' ');
		if (!p)
			return false;
		p++;
	}
	*start = strtoull(p, NULL, 10);
	return true;
}

/* The low 32 bits of our time namespace's inode (1 without one): start
 * times read in two time namespaces differ by their offsets. */
static uint32_t time_ns_id(void)
{
	uint64_t ino = ns_inode("/proc/self/ns/time");

	return ino ? (uint32_t)ino : 1u;
}

/* The tag of a slot taken in pid: its start time and our time namespace;
 * 0 (judged by the pid alone) where we cannot see it. */
static uint64_t slot_tag(const struct fr_ring *r, uint32_t pid)
{
	uint64_t start;
	char state;

	if (r->pids_foreign || !pid || pid >= FR_PID_UNKNOWN ||
	    !proc_stat(pid, &state, &start))
		return 0;
	return (start & 0xffffffffu) << 32 | time_ns_id();
}

/* Producer slot i's tag.  Relaxed: read after the slot's pid (acquire),
 * which pairs with the take's CAS (ring.h, Liveness). */
static uint64_t prod_tag(const struct fr_ring *r, unsigned i)
{
	return atomic_load_explicit(&r->sh->prod_tags[i], memory_order_relaxed);
}

/* What the process in a pid is now (see_pid): gone (or a zombie), alive
 * as far as we can tell (no /proc to read, or a pid we do not judge),
 * or alive with its start time read. */
enum pid_seen { PID_GONE, PID_ALIVE, PID_STARTED };

struct pid_view {
	enum pid_seen seen;
	uint64_t start;   /* PID_STARTED: its start time */
	uint32_t time_ns; /* PID_STARTED: our time namespace (time_ns_id) */
};

/* One look at pid: a kill(2) and a read of /proc, whatever number of
 * slots hold it. */
static struct pid_view see_pid(const struct fr_ring *r, uint32_t pid)
{
	struct pid_view v = { .seen = PID_ALIVE };
	char state;

	/* a word from shared memory: above the largest pid it is no process
	 * (and as a pid_t it could name a process group) */
	if (pid == 0 || pid > FR_INFO_PID)
		return (struct pid_view){ .seen = PID_GONE };
	if (r->pids_foreign || pid == FR_PID_UNKNOWN)
		return v;
	if (kill((pid_t)pid, 0) && errno == ESRCH)
		return (struct pid_view){ .seen = PID_GONE };
	if (!proc_stat(pid, &state, &v.start))
		return v;
	/* a killed child not yet reaped is a zombie: dead for our purposes */
	if (state == 'Z' || state == 'X')
		return (struct pid_view){ .seen = PID_GONE };
	v.seen = PID_STARTED;
	v.time_ns = time_ns_id();
	return v;
}

/* Is a slot's holder, tagged tag, the process v saw?  Not if the pid's
 * process now started at another time than the holder did: reused. */
static bool holder_is(const struct pid_view *v, uint64_t tag)
{
	if (v->seen != PID_STARTED)
		return v->seen == PID_ALIVE;
	return !tag || (uint32_t)tag != v->time_ns ||
	       (uint32_t)(tag >> 32) == (uint32_t)v->start;
}

/* Is the holder of a slot in pid, tagged tag, a live process?  Only where
 * we can tell (ring.h, Liveness): else alive, so nothing of a live one is
 * taken. */
static bool holder_alive(const struct fr_ring *r, uint32_t pid, uint64_t tag)
{
	struct pid_view v = see_pid(r, pid);

	return holder_is(&v, tag);
}

/* Is the producer that sealed a header CLAIMED in pid alive?  Only if a
 * producer slot of a live holder has its pid: every producer holds one
 * until its claims are committed (ring.h, Liveness).  The pid is looked
 * at once, not once per slot: a client that puts it in every slot would
 * otherwise cost moverd FR_MAX_PRODS reads of /proc per record judged. */
static bool writer_alive(const struct fr_ring *r, uint32_t pid)
{
	struct pid_view v = { .seen = PID_GONE };
	bool seen = false;

	if (pid == 0 || pid > FR_INFO_PID)
		return false;
	if (r->pids_foreign || pid == FR_PID_UNKNOWN)
		return true;
	for (unsigned i = 0; i < FR_MAX_PRODS; i++) {
		/* acquire: the tag we read next is this holder's or 0 */
		if (atomic_load_explicit(&fr_prod_at(r, i)->pid,
					 memory_order_acquire) != pid)
			continue;
		if (!seen) {
			v = see_pid(r, pid);
			seen = true;
		}
		if (v.seen == PID_GONE)
			return false;
		if (holder_is(&v, prod_tag(r, i)))
			return true;
	}
	return false;
}

/* Claim, write and commit the END record. */
static int end_record(struct fr_ring *r)
{
	uint32_t len = sizeof(uint64_t);
	uint64_t kind = FR_CTRL_END;
	struct fr_claim c;
	int rc = claim_named(r, &len, 1, &c, true);

	if (rc)
		return rc;
	memcpy(fr_rec_at(r, c.pos) + 1, &kind, sizeof(kind));
	atomic_store_explicit(&fr_rec_at(r, c.pos)->info, FR_INFO_CTRL | r->pid,
			      memory_order_relaxed);
	fr_commit(r, &c); /* release: the kind and info with the seal */
	return 0;
}

/* The END record is named in a producer slot until it is committed
 * (ring.h, Liveness): ours, or one taken for it (moverd writes END
 * through a ring it only subscribes to).  With none free it is unnamed. */
static int end_record_named(struct fr_ring *r)
{
	unsigned slot;
	uint32_t gen;
	int rc;

	if (r->prod < FR_MAX_PRODS || fr_prod_take(r, r->self_pid, &slot, &gen))
		return end_record(r);
	r->prod = slot;
	r->prod_gen = gen;
	rc = end_record(r);
	fr_prod_leave(r, slot, gen);
	return rc;
}

/*
 * ENDING first (seq_cst), then the END record's claim: a producer whose
 * claim comes after ours in tail's order sees ENDING and pads its claim
 * (claim_records), so no data record follows END.  One caller at a time
 * (moverd, or the lone producer of a ring without moverd).
 */
int fr_write_end(struct fr_ring *r)
{
	uint32_t old;
	int rc;

	old = atomic_fetch_or(&r->sh->flags, FR_FLAG_ENDING);
	if (old & FR_FLAG_ENDED)
		return 0;
	if (old & FR_FLAG_CLOSED)
		return fr_closed_rc(r);
	rc = end_record_named(r);
	if (rc)
		return rc; /* -EAGAIN: ENDING stays, call again */
	/* release: who sees ENDED sees the END record committed */
	atomic_fetch_or_explicit(&r->sh->flags, FR_FLAG_ENDED,
				 memory_order_release);
	/* producers asleep for space must learn the stream is over */
	wake_all(&r->sh->space_futex);
	return 0;
}

/* ---- subscribers -------------------------------------------------------- */

/* The room at which producers asleep for space are woken (ring.h,
 * Sleeping and waking): a quarter of the ring, or the largest record if
 * that is more. */
static uint64_t wake_room(const struct fr_ring *r)
{
	uint64_t quarter = r->size / 4, largest = fr_record_bytes(r->max_record);

	if (largest <= quarter)
		return quarter;
	return largest < r->size ? largest : r->size;
}

/* Is the room above the subscribers' minimum `min` enough to wake? */
static bool room_to_wake(const struct fr_ring *r, uint64_t min)
{
	/* relaxed: tail only grows, and a stale tail makes the room look
	 * larger: a wake-up too early, never one missed */
	uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);

	/* a minimum above tail or a lap behind is a client's scribble:
	 * wake, and let the producers' own checks refuse it */
	if (min > tail || tail - min > r->size)
		return true;
	return r->size - (tail - min) >= wake_room(r);
}

static void wake_producers(struct fr_ring *r)
{
	/* Same Dekker pairing as wake_consumer, for the space side. */
	fm_fence_light();
	if (!(atomic_load_explicit(&r->sh->producers_waiting,
				   memory_order_relaxed) & ~FR_SPACE_WANTED))
		return;
	if (room_to_wake(r, fr_min_pos(r)))
		wake_all(&r->sh->space_futex);
}

/* Where a subscriber joining at slot self may start: the minimum of the
 * other active ones, never below the floor (producers may have relied on
 * everything below the floor, see refresh_min). */
static uint64_t join_pos(const struct fr_ring *r, unsigned self)
{
	uint32_t others = sub_mask(r) & ~(1u << self);
	uint64_t floor = atomic_load(&r->sh->floor); /* seq_cst: refresh_min */
	uint64_t m = others ? min_of(r, others) : floor;

	return m > floor ? m : floor;
}

/* An honest subscriber position: `before` is the bound (tail, or published)
 * read before pos was read, and the bound is read again now (see
 * refresh_min: positions and the bound both move while we read). */
static bool pos_valid(const struct fr_ring *r, uint64_t pos, uint64_t before)
{
	return pos <= bound_pos(r) && (before <= pos || before - pos <= r->size) &&
	       !(pos % FR_ALIGN);
}

/*
 * Give subscriber slot i back if a dead process holds it; true if this call
 * did.  A client judges less than moverd (by_client): neither moverd's
 * HELD slots (its unsent bytes, which only a restarted moverd may let go)
 * nor pid 0 (a slot moverd took for a client whose pid it cannot see, or
 * one being taken this instant: its taker stores the pid after its CAS).
 */
static bool leave_if_dead(struct fr_ring *r, unsigned i, bool by_client)
{
	struct fr_sub *s = &r->sh->subs[i];
	/* the gen first: should the slot change hands while we judge, our
	 * leave (of the old gen) does nothing */
	uint64_t gen = atomic_load_explicit(&s->gen, memory_order_acquire);
	/* acquire: the pid and tag we read next are this holder's or 0
	 * (Liveness) */
	uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
	uint32_t pid = atomic_load_explicit(&s->pid, memory_order_relaxed);

	/* our own slot we give back ourselves, whatever pid a client
	 * wrote into it (fr_sub_leave_other) */
	if (i == r->sub || st == FR_SUB_FREE ||
	    (by_client && (st == FR_SUB_HELD || !pid)))
		return false;
	if (holder_alive(r, pid,
			 atomic_load_explicit(&s->tag, memory_order_relaxed)))
		return false;
	fr_sub_leave(r, i, gen);
	return true;
}

/* leave_if_dead for each slot of `slots`; how many it gave back */
static unsigned leave_dead_slots(struct fr_ring *r, uint32_t slots,
				 bool by_client)
{
	unsigned n = 0;

	for (unsigned i = 0; i < FR_MAX_SUBS; i++)
		n += (slots & (1u << i)) && leave_if_dead(r, i, by_client);
	return n;
}

/*
 * A producer held back: give back the slots of dead subscribers among those
 * at the lowest position, the ones that hold it back (ring.h, Subscribers:
 * dead subscribers).  At most once per FR_ROOM_LOOK_NS per ring and per
 * handle, the pace at which a sleeping producer looks for room.  True if
 * a slot was given back.
 */
static bool leave_dead_blockers(struct fr_ring *r)
{
	_Atomic uint64_t *stamp = &r->sh->judged_ns;
	uint64_t now = fr_now_ns(), last, min;
	uint32_t mask;
	bool left = false;

	if (now - r->judged_ns < FR_ROOM_LOOK_NS)
		return false;
	r->judged_ns = now;
	/* relaxed: a pace, ordering nothing; the CAS picks one producer of
	 * those that wait at once.  A stamp from the future (another time
	 * namespace, a scribbling client) is, unsigned, older than any */
	last = atomic_load_explicit(stamp, memory_order_relaxed);
	if (now - last < FR_ROOM_LOOK_NS ||
	    !atomic_compare_exchange_strong_explicit(stamp, &last, now,
						     memory_order_relaxed,
						     memory_order_relaxed))
		return false;
	mask = sub_mask(r);
	min = min_of(r, mask);
	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		/* relaxed: which slots to judge (a slot that moved meanwhile
		 * is judged anyway, harmlessly); the judgement reads the
		 * slot itself */
		if ((mask & (1u << i)) &&
		    atomic_load_explicit(&r->sh->subs[i].pos,
					 memory_order_relaxed) == min)
			left |= leave_if_dead(r, i, true);
	}
	return left;
}

static int sub_take_free(struct fr_ring *r, uint32_t pid, uint64_t tag,
			 unsigned *slot, uint64_t *gen)
{
	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		struct fr_sub *s = &r->sh->subs[i];
		uint32_t st = FR_SUB_FREE;
		uint64_t g, x, y, before;

		if (atomic_load_explicit(&s->state, memory_order_relaxed) !=
		    FR_SUB_FREE)
			continue;
		/* acquire: after the previous holder's release of FREE;
		 * release: a judge that reads ACTIVE (acquire) reads the
		 * pid and tag 0 of that leave or ours, never older ones */
		if (!atomic_compare_exchange_strong_explicit(
			    &s->state, &st, FR_SUB_ACTIVE,
			    memory_order_acq_rel, memory_order_relaxed))
			continue;
		/* the slot's new holder: a stale leave (old gen) fails */
		g = atomic_fetch_add_explicit(&s->gen, 1,
					      memory_order_relaxed) + 1;
		atomic_store_explicit(&s->pid, pid, memory_order_relaxed);
		atomic_store_explicit(&s->tag, tag, memory_order_relaxed);
		atomic_store_explicit(&s->records, 0, memory_order_relaxed);
		x = join_pos(r, i);
		/* release: our pos is complete before producers see our bit */
		atomic_store_explicit(&s->pos, x, memory_order_release);
		/* seq_cst: the bit before our floor re-read (refresh_min) */
		atomic_fetch_or(&r->sh->sub_mask, 1u << i);
		before = bound_pos(r);
		y = join_pos(r, i);
		if (y > x) {
			atomic_store_explicit(&s->pos, y, memory_order_release);
			x = y;
		}
		if (!pos_valid(r, x, before)) {
			fr_sub_leave(r, i, g);
			return -EPROTO;
		}
		*slot = i;
		*gen = g;
		return 0;
	}
	return -EBUSY;
}

int fr_sub_take(struct fr_ring *r, uint32_t pid, unsigned *slot,
		uint64_t *gen)
{
	uint64_t tag = slot_tag(r, pid);
	int rc = sub_take_free(r, pid, tag, slot, gen);

	if (rc != -EBUSY)
		return rc;
	/* the slots of subscribers that died without a moverd to see it */
	if (!leave_dead_slots(r, SUB_ALL, true))
		return -EBUSY;
	return sub_take_free(r, pid, tag, slot, gen);
}

int fr_sub_adopt(struct fr_ring *r, unsigned slot, uint64_t gen)
{
	struct fr_sub *s;
	uint64_t pos, before;

	if (slot >= FR_MAX_SUBS)
		return -EINVAL;
	s = &r->sh->subs[slot];
	before = bound_pos(r);
	/* acquire: the holder's (moverd's) stores of pos come with them */
	if (atomic_load_explicit(&s->gen, memory_order_acquire) != gen ||
	    atomic_load_explicit(&s->state, memory_order_acquire) !=
		    FR_SUB_ACTIVE)
		return -ESTALE;
	pos = atomic_load_explicit(&s->pos, memory_order_acquire);
	if (!pos_valid(r, pos, before))
		return -EPROTO;
	r->sub = slot;
	r->sub_gen = gen;
	r->head = r->head_pub = pos;
	r->records = atomic_load_explicit(&s->records, memory_order_relaxed);
	r->stuck_pos = UINT64_MAX;
	return 0;
}

/* Store our head in our slot, then wake sleeping producers if any. */
static void publish_pos(struct fr_ring *r)
{
	struct fr_sub *s = &r->sh->subs[r->sub];
	_Atomic uint32_t *w = &r->sh->producers_waiting;

	/* the hint is answered by this publication (relaxed: a hint; set
	 * again after our store, it makes the next release publish too) */
	if (atomic_load_explicit(w, memory_order_relaxed) & FR_SPACE_WANTED)
		atomic_fetch_and_explicit(w, ~FR_SPACE_WANTED,
					  memory_order_relaxed);
	atomic_store_explicit(&s->records, r->records, memory_order_relaxed);
	/* release: our reads of the records before head happen before any
	 * producer that acquires this position overwrites them */
	atomic_store_explicit(&s->pos, r->head, memory_order_release);
	r->head_pub = r->head;
	wake_producers(r);
}

void fr_sub_publish(struct fr_ring *r)
{
	if (r->sub < FR_MAX_SUBS)
		publish_pos(r);
}

unsigned fr_sub_cut_all(struct fr_ring *r)
{
	unsigned n = 0;

	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		struct fr_sub *s = &r->sh->subs[i];
		uint32_t st = FR_SUB_ACTIVE;

		/* CAS (seq_cst, as cut_laggards): a holder leaving at the
		 * same time either frees its slot or finds it CUT, never
		 * both; its reads are over before it looks (fr_sub_lost's
		 * acquire) */
		if (atomic_compare_exchange_strong(&s->state, &st, FR_SUB_CUT)) {
			atomic_fetch_and(&r->sh->sub_mask, ~(1u << i));
			n++;
		}
	}
	return n;
}

unsigned fr_sub_free_slots(const struct fr_ring *r)
{
	unsigned n = 0;

	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		/* relaxed: a count for a limit, not a claim (fr_sub_take's
		 * CAS is); a CUT slot is not free until its holder leaves,
		 * though its mask bit is clear */
		uint32_t st = atomic_load_explicit(
			&((struct fr_sub *)&r->sh->subs[i])->state,
			memory_order_relaxed);

		n += st == FR_SUB_FREE;
	}
	return n;
}

bool fr_sub_lost(const struct fr_ring *r)
{
	const struct fr_sub *s;
	uint32_t st;

	if (r->sub >= FR_MAX_SUBS)
		return false;
	s = &r->sh->subs[r->sub];
	/* acquire: a cut seen here is seen after the records we copied */
	st = atomic_load_explicit(&((struct fr_sub *)s)->state,
				  memory_order_acquire);
	return (st != FR_SUB_ACTIVE && st != FR_SUB_HELD) ||
	       atomic_load_explicit(&((struct fr_sub *)s)->gen,
				    memory_order_relaxed) != r->sub_gen;
}

static int scan_run(const struct fr_ring *r, uint64_t pos, uint64_t limit,
		    unsigned max, uint64_t *end, bool *stuck,
		    uint64_t *records);

/*
 * What one fr_sub_skip_lag walks at most: it runs on moverd's event loop
 * at every attach, and a lap of 16-byte pads that a client wrote would be
 * 64 Mi records on a 1 GiB ring (0.19 s a call, as often as the client
 * attaches).  A subscriber left more than max_lag behind by a bounded walk
 * moves up again at its next attach, if a producer cuts it meanwhile.
 */
#define SKIP_MAX_RECORDS (1u << 18)

void fr_sub_skip_lag(struct fr_ring *r, unsigned slot)
{
	uint64_t lag = max_lag_of(r);
	struct fr_sub *s = &r->sh->subs[slot];
	uint64_t tail = bound_pos(r), pos, end, records = 0;
	bool stuck;

	/* our own slot from our private head (fr_sub_adopt checked it); a
	 * client's as its word is now, read once and checked: its holder
	 * may have rewritten it since fr_sub_take checked what it stored */
	if (r->sub == slot) {
		pos = r->head;
	} else {
		pos = atomic_load_explicit(&s->pos, memory_order_relaxed);
		if (!pos_valid(r, pos, tail))
			return;
	}
	if (!lag || pos >= tail || tail - pos <= lag)
		return;
	/* whole committed records only: nothing below a claim still being
	 * written is given up, so no producer writes where another does */
	if (scan_run(r, pos, tail - lag / 2, SKIP_MAX_RECORDS, &end, &stuck,
		     &records) ||
	    end == pos)
		return;
	/* release: as a consumer's publication (we read nothing below) */
	atomic_store_explicit(&s->pos, end, memory_order_release);
	if (r->sub == slot)
		r->head = r->head_pub = end;
}

/* The HELD slot of a dead holder furthest behind bound; FR_MAX_SUBS none. */
static unsigned dead_held_behind(const struct fr_ring *r, uint64_t bound)
{
	unsigned best = FR_MAX_SUBS;
	uint64_t most = 0;

	for (unsigned i = 0; i < FR_MAX_SUBS; i++) {
		const struct fr_sub *s = &r->sh->subs[i];
		uint64_t pos;

		/* acquire: the pid and tag we read next are this holder's
		 * (Liveness) */
		if (atomic_load_explicit(&s->state, memory_order_acquire) !=
			    FR_SUB_HELD ||
		    holder_alive(r, atomic_load_explicit(&s->pid,
							 memory_order_relaxed),
				 atomic_load_explicit(&s->tag,
						      memory_order_relaxed)))
			continue;
		pos = atomic_load_explicit(&s->pos, memory_order_acquire);
		if (pos_valid(r, pos, bound) &&
		    (best == FR_MAX_SUBS || bound - pos > most)) {
			best = i;
			most = bound - pos;
		}
	}
	return best;
}

int fr_sub_take_over_held(struct fr_ring *r, uint32_t pid)
{
	uint64_t before = bound_pos(r), pos, g;
	unsigned i = dead_held_behind(r, before);
	struct fr_sub *s;

	if (i >= FR_MAX_SUBS)
		return -EBUSY;
	s = &r->sh->subs[i];
	g = atomic_load_explicit(&s->gen, memory_order_acquire);
	/* seq_cst, as a leave's: a leave of the old holder's gen (its
	 * judges') fails from here on; the slot stays HELD and in the mask
	 * throughout, so producers stay behind its position */
	if (!atomic_compare_exchange_strong(&s->gen, &g, g + 1))
		return -EBUSY;
	atomic_store_explicit(&s->pid, pid, memory_order_relaxed);
	atomic_store_explicit(&s->tag, slot_tag(r, pid), memory_order_relaxed);
	pos = atomic_load_explicit(&s->pos, memory_order_acquire);
	if (!pos_valid(r, pos, before))
		return -EPROTO; /* a client scribbled: its flow's checks say */
	r->sub = i;
	r->sub_gen = g + 1;
	r->head = r->head_pub = pos;
	r->records = atomic_load_explicit(&s->records, memory_order_relaxed);
	r->stuck_pos = UINT64_MAX;
	return 0;
}

int fr_sub_take_held(struct fr_ring *r, uint32_t pid)
{
	uint32_t st = FR_SUB_ACTIVE;
	unsigned slot;
	uint64_t gen;
	int rc = fr_sub_take(r, pid, &slot, &gen);

	if (rc)
		return rc;
	/* a producer may cut the slot before we adopt it, as after (the
	 * CAS below): either way it is ours to give back, or nobody would
	 * (its pid is moverd's, alive) */
	rc = fr_sub_adopt(r, slot, gen);
	if (rc) {
		fr_sub_leave(r, slot, gen);
		return rc;
	}
	/* CAS (seq_cst, as cut_laggards): a producer cut it first (it
	 * joined more than max_lag behind a full ring) or it is HELD now */
	if (!atomic_compare_exchange_strong(&r->sh->subs[slot].state, &st,
					    FR_SUB_HELD)) {
		fr_sub_leave(r, slot, gen);
		return -ESTALE;
	}
	fr_sub_skip_lag(r, slot);
	return 0;
}

/* Our HELD slot more than max_lag behind the tail while the ring is full:
 * a producer waits, or a record of max_record bytes would not fit. */
static bool held_over_lag(const struct fr_ring *r)
{
	/* relaxed: numbers for a decision moverd takes again each look */
	uint64_t lag = max_lag_of(r);
	uint64_t tail = bound_pos(r), pos, min;

	if (!lag)
		return false;
	pos = atomic_load_explicit(&r->sh->subs[r->sub].pos,
				   memory_order_relaxed);
	if (pos >= tail || tail - pos <= lag)
		return false;
	if (atomic_load_explicit(&r->sh->producers_waiting,
				 memory_order_relaxed))
		return true;
	min = fr_min_pos(r);
	return min <= tail &&
	       tail - min + fr_record_bytes(r->max_record) > r->size;
}

bool fr_sub_cut_held(struct fr_ring *r)
{
	uint32_t st = FR_SUB_HELD;
	unsigned i = r->sub;

	if (i >= FR_MAX_SUBS || !held_over_lag(r))
		return false;
	/* CAS (seq_cst, as cut_laggards): against a leave of the same slot;
	 * then the mask bit, and the producers see room at their next look
	 * (fr_sub_leave, which follows, wakes them) */
	if (!atomic_compare_exchange_strong(&r->sh->subs[i].state, &st,
					    FR_SUB_CUT))
		return false;
	atomic_fetch_and(&r->sh->sub_mask, ~(1u << i));
	return true;
}

void fr_sub_leave(struct fr_ring *r, unsigned slot, uint64_t gen)
{
	struct fr_sub *s;
	uint64_t g = gen, pos, before;
	uint32_t left;

	if (slot >= FR_MAX_SUBS)
		return;
	s = &r->sh->subs[slot];
	if (r->sub == slot && r->sub_gen == gen) {
		fr_sub_publish(r); /* our last reads count */
		r->sub = FR_MAX_SUBS;
	}
	/* the gen is the key: of the client and moverd leaving the same
	 * slot at once (or a leave after the slot was taken again) one
	 * CAS wins; the losers do nothing */
	if (!atomic_compare_exchange_strong(&s->gen, &g, gen + 1))
		return;
	/* a holder killed asleep: its count goes with its slot */
	sleepers_reclaim(&r->sh->consumers_waiting, &s->asleep,
			 FR_WAITING_MOVERD, &r->sh->data_futex);
	before = bound_pos(r);
	pos = atomic_load_explicit(&s->pos, memory_order_acquire);
	/* seq_cst: against a joiner's bit and the producers' re-read */
	left = atomic_fetch_and(&r->sh->sub_mask, ~(1u << slot)) &
	       ~(1u << slot) & SUB_ALL;
	/* the last one keeps what nobody has read yet (an impossible
	 * position from a scribbling client is not kept) */
	if (!left && pos_valid(r, pos, before))
		fetch_max(&r->sh->floor, pos);
	atomic_store_explicit(&s->tag, 0, memory_order_relaxed);
	atomic_store_explicit(&s->pid, 0, memory_order_relaxed);
	/* release: everything above is done before the slot is free */
	atomic_store_explicit(&s->state, FR_SUB_FREE, memory_order_release);
	wake_producers(r);
}

void fr_sub_leave_other(struct fr_ring *r, unsigned slot, uint64_t gen)
{
	/* the slot and gen are a client's word or read from the ring, and a
	 * client steers the gen (it is a shared counter): a slot we hold is
	 * not given back by them, else our handle would forget it and never
	 * see it lost (fr_sub_lost) */
	if (slot == r->sub)
		return;
	fr_sub_leave(r, slot, gen);
}

unsigned fr_sub_leave_dead(struct fr_ring *r, uint32_t slots)
{
	return leave_dead_slots(r, slots, false);
}

/* ---- producer slots (ring.h, Producer slots) ----------------------------- */

static int prod_take_free(struct fr_ring *r, uint32_t pid, uint64_t tag,
			  unsigned *slot, uint32_t *gen)
{
	for (unsigned i = 0; i < FR_MAX_PRODS; i++) {
		struct fr_prod *p = fr_prod_at(r, i);
		uint32_t free_pid = 0;

		if (atomic_load_explicit(&p->pid, memory_order_relaxed))
			continue;
		/* acquire: after the previous holder's release of the slot;
		 * release: a judge that reads our pid (acquire) reads the
		 * tag 0 of that leave or ours, never an older holder's */
		if (!atomic_compare_exchange_strong_explicit(
			    &p->pid, &free_pid, pid, memory_order_acq_rel,
			    memory_order_relaxed))
			continue;
		/* relaxed: a free slot's claim is 0 (fr_prod_leave), unless
		 * a client scribbled on it; ours from here on */
		atomic_store_explicit(&p->claim, 0, memory_order_relaxed);
		atomic_store_explicit(&r->sh->prod_tags[i], tag,
				      memory_order_relaxed);
		*slot = i;
		*gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
		return 0;
	}
	return -EBUSY;
}

unsigned fr_prod_free_slots(const struct fr_ring *r)
{
	unsigned n = 0;

	for (unsigned i = 0; i < FR_MAX_PRODS; i++)
		/* relaxed: a count for a limit, not a claim (prod_take_free's
		 * CAS is) */
		n += !atomic_load_explicit(
			&fr_prod_at(r, i)->pid,
			memory_order_relaxed);
	return n;
}

int fr_prod_take(struct fr_ring *r, uint32_t pid, unsigned *slot,
		 uint32_t *gen)
{
	uint64_t tag;

	if (!pid)
		return -EINVAL;
	tag = slot_tag(r, pid);
	if (!prod_take_free(r, pid, tag, slot, gen))
		return 0;
	/* the slots of producers that died without a moverd to see it */
	if (!fr_prod_leave_dead(r))
		return -EBUSY;
	return prod_take_free(r, pid, tag, slot, gen);
}

int fr_prod_adopt(struct fr_ring *r, unsigned slot, uint32_t gen)
{
	struct fr_prod *p;

	if (slot >= FR_MAX_PRODS)
		return -EINVAL;
	p = fr_prod_at(r, slot);
	/* relaxed: the slot is only ever written by its holder, and by a
	 * leave (which the gen tells) */
	if (atomic_load_explicit(&p->gen, memory_order_relaxed) != gen ||
	    !atomic_load_explicit(&p->pid, memory_order_relaxed))
		return -ESTALE;
	r->prod = slot;
	r->prod_gen = gen;
	return 0;
}

void fr_prod_leave(struct fr_ring *r, unsigned slot, uint32_t gen)
{
	struct fr_prod *p;
	uint32_t g = gen;

	if (slot >= FR_MAX_PRODS)
		return;
	if (r->prod == slot && r->prod_gen == gen)
		r->prod = FR_MAX_PRODS;
	p = fr_prod_at(r, slot);
	/* the gen is the key: of the client and moverd leaving at once (or
	 * a leave after the slot was taken again) one CAS wins */
	if (!atomic_compare_exchange_strong(&p->gen, &g, gen + 1))
		return;
	/* a holder killed asleep for space: its count goes with its slot */
	sleepers_reclaim(&r->sh->producers_waiting, &r->sh->prod_asleep[slot],
			 FR_SPACE_WANTED, &r->sh->space_futex);
	/* a holder that died mid-claim: its gap is nobody's now */
	atomic_store_explicit(&p->claim, 0, memory_order_relaxed);
	atomic_store_explicit(&r->sh->prod_tags[slot], 0, memory_order_relaxed);
	/* release: the claim word idle and the tag 0 before the slot is free */
	atomic_store_explicit(&p->pid, 0, memory_order_release);
}

unsigned fr_prod_leave_dead(struct fr_ring *r)
{
	unsigned n = 0;

	for (unsigned i = 0; i < FR_MAX_PRODS; i++) {
		struct fr_prod *p = fr_prod_at(r, i);
		/* the gen first: should the slot change hands while we
		 * judge, our leave (of the old gen) does nothing */
		uint32_t gen = atomic_load_explicit(&p->gen,
						    memory_order_acquire);
		uint32_t pid = atomic_load_explicit(&p->pid,
						    memory_order_acquire);

		if (!pid || holder_alive(r, pid, prod_tag(r, i)))
			continue;
		fr_prod_leave(r, i, gen);
		n++;
	}
	return n;
}

/*
 * Might a live producer still write a header in [pos, end)?  Yes if a slot
 * of a live pid is busy with a claim from below end: that claim may cover
 * part of the gap (its headers are written front to back and the slot goes
 * idle only after the last).  Acquire on the claim word: a slot we read
 * idle, or busy with a later claim, had its headers of this gap written
 * before; recover looks for them again after this, and a header at the
 * gap's start makes the recovery CAS on its seal fail.
 */
static bool gap_claimed_by_live(const struct fr_ring *r, uint64_t end)
{
	for (unsigned i = 0; i < FR_MAX_PRODS; i++) {
		struct fr_prod *p = fr_prod_at(r, i);
		uint64_t c = atomic_load_explicit(&p->claim,
						  memory_order_acquire);

		if (!(c & FR_CLAIM_BUSY) || (c & ~FR_CLAIM_BUSY) >= end)
			continue;
		if (holder_alive(r, atomic_load_explicit(&p->pid,
						memory_order_acquire),
				 prod_tag(r, i)))
			return true;
	}
	return false;
}

/* ---- status (moverd writes, clients read) ------------------------------- */

static void status_begin(struct fr_status *st)
{
	uint32_t s = atomic_load_explicit(&st->seq, memory_order_relaxed);

	atomic_store_explicit(&st->seq, (s | 1u), memory_order_relaxed);
	/* release fence: the odd seq is ordered before the field stores, so a
	 * reader that sees a new field sees the odd seq on its re-read */
	atomic_thread_fence(memory_order_release);
}

static void status_end(struct fr_status *st)
{
	uint32_t s = atomic_load_explicit(&st->seq, memory_order_relaxed);

	/* release: the fields before the even seq */
	atomic_store_explicit(&st->seq, (s | 1u) + 1u, memory_order_release);
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fr_status_set(struct fr_ring *r, enum fr_flow_state state,
		   uint32_t reason)
{
	struct fr_status *st = &r->sh->status;

	status_begin(st);
	atomic_store_explicit(&st->state, (uint32_t)state, memory_order_relaxed);
	atomic_store_explicit(&st->reason, reason, memory_order_relaxed);
	atomic_store_explicit(&st->since_ns, realtime_ns(),
			      memory_order_relaxed);
	status_end(st);
}

void fr_status_counts(struct fr_ring *r, uint32_t producers,
		      uint32_t consumers)
{
	struct fr_status *st = &r->sh->status;

	status_begin(st);
	atomic_store_explicit(&st->producers, producers, memory_order_relaxed);
	atomic_store_explicit(&st->consumers, consumers, memory_order_relaxed);
	status_end(st);
}

void fr_status_epoch(struct fr_ring *r, uint64_t epoch)
{
	struct fr_status *st = &r->sh->status;

	status_begin(st);
	atomic_store_explicit(&st->epoch, epoch, memory_order_relaxed);
	status_end(st);
}

int fr_status_read(const struct fr_ring *r, struct fr_status_view *out)
{
	struct fr_status *st = &((struct fr_shared *)r->sh)->status;

	for (int tries = 0; tries < 64; tries++) {
		/* acquire: the fields of the write that made seq even */
		uint32_t s1 = atomic_load_explicit(&st->seq,
						   memory_order_acquire);

		if (s1 & 1u)
			continue;
		out->state = atomic_load_explicit(&st->state,
						  memory_order_relaxed);
		out->reason = atomic_load_explicit(&st->reason,
						   memory_order_relaxed);
		out->producers = atomic_load_explicit(&st->producers,
						      memory_order_relaxed);
		out->consumers = atomic_load_explicit(&st->consumers,
						      memory_order_relaxed);
		out->since_ns = atomic_load_explicit(&st->since_ns,
						     memory_order_relaxed);
		out->epoch = atomic_load_explicit(&st->epoch,
						  memory_order_relaxed);
		/* acquire fence: the field reads before the seq re-read
		 * (pairs with the writer's release fence) */
		atomic_thread_fence(memory_order_acquire);
		if (atomic_load_explicit(&st->seq, memory_order_relaxed) == s1)
			return 0;
	}
	return -EAGAIN; /* moverd mid-write for long, or a scribbling client */
}

/* ---- consumer ----------------------------------------------------------- */

void fr_release(struct fr_ring *r, uint64_t pos)
{
	r->head = pos;
	if (r->sub >= FR_MAX_SUBS)
		return;
	/* lazy head (issue 12): store our slot's pos every pub_every bytes */
	if (pos - r->head_pub >= r->pub_every) {
		publish_pos(r);
		return;
	}
	/*
	 * ... and whenever a producer sleeps or gave up for space: full
	 * fence, then the count (a producer counts itself, fences, then
	 * re-checks the positions before it sleeps: one of us sees the
	 * other, so a sleeping producer is never left waiting for a
	 * publication that only our next release would make).  Full, not
	 * light (ipc/barrier.h): a consumer without it caught up with its
	 * producer and slept and was woken per record, 19 M records/s of
	 * 32 B against 46 M with it (flowbench local, same run).
	 */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&r->sh->producers_waiting,
				 memory_order_relaxed))
		publish_pos(r);
}

/*
 * Nothing to read.  A producer asleep or giving up for space must not wait
 * for our next lazy publication while we wait for data: publish now.  If
 * none is (relaxed: a hint, its line is read-mostly), keep polling without
 * a store and a fence per empty poll: a subscriber that has read all there
 * is holds back at most pub_every bytes of a ring, so producers fill the
 * rest before they could sleep, and we publish before we sleep ourselves
 * (fr_wait_data: fr_sub_publish).
 */
static void publish_idle(struct fr_ring *r)
{
	if (r->sub < FR_MAX_SUBS && r->head != r->head_pub &&
	    atomic_load_explicit(&r->sh->producers_waiting,
				 memory_order_relaxed))
		publish_pos(r);
}

/*
 * Nothing to read, rc says why.  Idle: publish_idle.  At the end of a ring
 * closed for good (-EPIPE) no later record amortises a publication, and
 * moverd waits for it (a drain is done once every consumer has read to the
 * tail): publish now, once.
 */
static void publish_at_rest(struct fr_ring *r, int rc)
{
	if (rc == -EAGAIN)
		publish_idle(r);
	else if (rc == -EPIPE && r->sub < FR_MAX_SUBS && r->head != r->head_pub)
		publish_pos(r);
}

/*
 * The recovery timer needs no precision (recover_ns is seconds by default,
 * a tick of error is nothing) and it is read on the consumer's polling
 * path, so it runs on the coarse clock: a few ns instead of a full clock
 * read per poll.  Only stuck_since_ns is kept on this clock.
 */
static uint64_t stuck_clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* While nothing is known to be claimed at head: how often to look at tail. */
#define TAIL_POLL_NS 100000000ull /* when recovery is off: only for -EPROTO */

/* A bound read from the shared page (tail, or published) against our own
 * position: a client may have written anything there.  It must be ahead of
 * us by at most a ring, on the record alignment (recovery pads up to it). */
static bool bound_sane(const struct fr_ring *r, uint64_t pos, uint64_t bound)
{
	return pos <= bound && bound - pos <= r->size && !(bound % FR_ALIGN);
}

/* First position in (pos, limit) that carries a seal of its own. */
static uint64_t next_sealed(const struct fr_ring *r, uint64_t pos,
			    uint64_t limit)
{
	for (uint64_t q = pos + FR_ALIGN; q < limit; q += FR_ALIGN) {
		/*
		 * relaxed: this races with producers writing payload here; we
		 * only look for a header that is its own position's.
		 */
		uint64_t s = atomic_load_explicit(&fr_rec_at(r, q)->seal,
						  memory_order_relaxed);
		if (s == fr_seal(r, q, FR_SEAL_CLAIMED) ||
		    s == fr_seal(r, q, FR_SEAL_COMMITTED))
			return q;
	}
	return limit;
}

/* The claimed length of the record at pos, if it is sealed CLAIMED by a
 * producer that is dead; 0 otherwise.  dead: a pid this call of recover
 * judged dead already (0: none), not judged again. */
static uint64_t dead_claim_bytes(struct fr_ring *r, uint64_t pos,
				 uint64_t limit, uint32_t dead, uint32_t *pid)
{
	struct fr_rec *h = fr_rec_at(r, pos);
	uint32_t info, len;

	/* acquire: pairs with the CLAIMED release in write_claims */
	if (atomic_load_explicit(&h->seal, memory_order_acquire) !=
	    fr_seal(r, pos, FR_SEAL_CLAIMED))
		return 0;
	info = atomic_load_explicit(&h->info, memory_order_relaxed);
	len = atomic_load_explicit(&h->len, memory_order_relaxed);
	*pid = info & FR_INFO_PID;
	if ((!dead || *pid != dead) && writer_alive(r, *pid))
		return 0;
	if (!len || len > r->max_record || fr_record_bytes(len) > limit - pos)
		return 0;
	return fr_record_bytes(len);
}

static uint64_t lap_limit(const struct fr_ring *r, uint64_t pos, uint64_t tail)
{
	uint64_t rest = fr_lap_rest(r, pos);

	return tail - pos < rest ? tail : pos + rest;
}

/*
 * Pad the record at pos whose seal we read as `old`: CAS the seal to
 * RECOVERING first, so that of several subscribers recovering at once one
 * writes len and info; then COMMITTED.  False if the seal changed.
 */
static bool recover_pad(struct fr_ring *r, uint64_t pos, uint64_t old,
			uint64_t bytes)
{
	struct fr_rec *h = fr_rec_at(r, pos);

	/* acquire on success: our len/info stores stay after the CAS */
	if (!atomic_compare_exchange_strong_explicit(
		    &h->seal, &old, fr_seal(r, pos, FR_SEAL_RECOVERING),
		    memory_order_acquire, memory_order_relaxed))
		return false;
	pad_at(r, pos, bytes);
	return true;
}

/*
 * What one call of recover pads at most, bar one record of a dead producer
 * (which may be larger).  A gap is scanned seal by seal, and a producer
 * that moves tail a ring ahead without writing a header would otherwise
 * make the recoverer read, and on a fresh ring allocate, a whole lap in
 * one call: moverd's event loop for seconds on a 1 GiB ring.  The rest
 * is padded on the next calls, without another recovery timeout.
 */
#define RECOVER_STEP (1ull << 20)

/*
 * The claim at our position is a live producer's, or we cannot tell: look
 * again after another recover_ns.  A subscriber that cannot judge pids
 * (ring.h, Liveness) publishes where it waits now, as one about to sleep
 * does: moverd, which can judge, looks at the slowest published position
 * (a polling consumer would otherwise publish only every pub_every bytes).
 */
static int recover_later(struct fr_ring *r)
{
	r->stuck_since_ns = stuck_clock_ns();
	if (r->pids_foreign && r->head != r->head_pub)
		fr_sub_publish(r);
	return -EAGAIN;
}

/*
 * The record at pos was claimed but not committed for recover_ns.  Turn
 * it into padding if its producer is dead, or if no header was ever
 * written (killed between the claim and the header).  Further records
 * claimed by the same dead producer are padded at once, up to
 * RECOVER_STEP bytes.
 * 0 = padded (caller re-reads), -EAGAIN = producer still alive.
 */
static int recover(struct fr_ring *r, uint64_t pos, uint64_t seal,
		   uint64_t tail)
{
	uint64_t limit = lap_limit(r, pos, tail), start = pos, now, end;
	uint32_t pid = 0, next_pid;
	uint64_t bytes;
	bool more = false; /* stopped by RECOVER_STEP, not by a record */

	if (seal == fr_seal(r, pos, FR_SEAL_CLAIMED)) {
		bytes = dead_claim_bytes(r, pos, limit, 0, &pid);
		if (!bytes)
			return recover_later(r);
	} else {
		uint64_t scan = limit - pos > RECOVER_STEP ?
					pos + RECOVER_STEP : limit;

		bytes = next_sealed(r, pos, scan) - pos;
		more = scan < limit && pos + bytes == scan;
		if (gap_claimed_by_live(r, pos + bytes))
			return recover_later(r);
		/* a producer stalled after its claim may have written its
		 * header in the gap, committed and gone idle after the scan
		 * passed that header and before we read its slot: the slot's
		 * acquire makes the header visible now, so look again and
		 * pad only up to it */
		end = next_sealed(r, pos, pos + bytes);
		if (end < pos + bytes) {
			bytes = end - pos;
			more = false;
		}
	}
	for (;;) {
		if (!recover_pad(r, pos, seal, bytes))
			break; /* another subscriber got there first */
		atomic_fetch_add_explicit(&r->sh->recovered, 1,
					  memory_order_relaxed);
		pos += bytes;
		seal = fr_seal(r, pos, FR_SEAL_CLAIMED);
		if (pos >= tail || !pid)
			break;
		if (pos - start >= RECOVER_STEP) {
			more = true;
			break;
		}
		/* pid is dead: its next records cost no judgement each (a
		 * client's RECOVER_STEP of 16-byte claims would be 64 Ki) */
		bytes = dead_claim_bytes(r, pos, lap_limit(r, pos, tail), pid,
					 &next_pid);
		if (!bytes || next_pid != pid)
			break;
	}
	now = stuck_clock_ns();
	r->stuck_pos = pos;
	/* more of it: the timeout at pos is served already */
	r->stuck_since_ns = more && now > r->recover_ns ? now - r->recover_ns :
							  now;
	return 0;
}

static int not_committed(struct fr_ring *r, uint64_t pos, uint64_t seal)
{
	uint64_t now = stuck_clock_ns();

	if (pos >= r->tail_cache) {
		uint64_t every = r->recover_ns ? r->recover_ns / 4 : TAIL_POLL_NS;

		/*
		 * Nothing is known to be claimed at pos: the ring is empty, or
		 * a producer is between its claim and its commit.  Data shows
		 * up as a COMMITTED seal at pos, which is all we poll; reading
		 * tail on every poll would pull the producers' tail line into
		 * our cache and make their next claim miss on it.  Tail is
		 * needed only to tell "empty" from "claimed" for recovery (and
		 * to see corrupt positions), so while the flow is open we look
		 * at it once every `every` ns spent waiting at pos; recovery
		 * then starts at most recover_ns / 4 later than it would.
		 * Closed: look at once, the drained consumer must get -EPIPE.
		 */
		if (!fr_closed(r)) {
			if (r->stuck_pos != pos) {
				r->stuck_pos = pos;
				r->stuck_since_ns = now;
				return -EAGAIN;
			}
			if (now - r->stuck_since_ns < every)
				return -EAGAIN;
		}
		/* acquire: orders the seal re-read after seeing the claim */
		r->tail_cache = atomic_load_explicit(&r->sh->tail,
						     memory_order_acquire);
		if (!bound_sane(r, pos, r->tail_cache))
			return -EPROTO;
		/* (re)start the timer: from here it times a known claim, or
		 * the next look at tail while the ring stays empty */
		r->stuck_pos = pos;
		r->stuck_since_ns = now;
		if (pos == r->tail_cache)
			return fr_closed(r) ? fr_closed_rc(r) : -EAGAIN;
		return -EAGAIN;
	}
	if (!r->recover_ns)
		return -EAGAIN;
	if (r->stuck_pos != pos) {
		r->stuck_pos = pos;
		r->stuck_since_ns = now;
		return -EAGAIN;
	}
	if (now - r->stuck_since_ns < r->recover_ns)
		return -EAGAIN;
	return recover(r, pos, seal, r->tail_cache);
}

/* Deposit rings: is there published data at pos? */
static int deposit_ready(struct fr_ring *r, uint64_t pos)
{
	if (pos < r->tail_cache)
		return 0;
	/* acquire: pairs with fr_publish, the deposited bytes are visible */
	r->tail_cache = atomic_load_explicit(&r->sh->published,
					     memory_order_acquire);
	if (!bound_sane(r, pos, r->tail_cache))
		return -EPROTO;
	if (pos == r->tail_cache)
		return fr_closed(r) ? fr_closed_rc(r) : -EAGAIN;
	return 0;
}

/* A CTRL record at pos (len l): -ENODATA at END (the consumer stays
 * there), 1 = skip it, -EPROTO if malformed. */
static int ctrl_record(const struct fr_rec *h, uint32_t l)
{
	uint64_t kind;

	if (l != sizeof(kind))
		return -EPROTO;
	/* the payload is covered by the seal's acquire in fr_peek */
	memcpy(&kind, h + 1, sizeof(kind));
	return kind == FR_CTRL_END ? -ENODATA : 1;
}

/*
 * Pads and control records fr_peek steps over in one call at most.  A
 * producer may write committed pads ahead of the consumer as fast as it
 * reads them: without a bound, one call (with a timeout of 0, or in
 * flowshm_poll) would never return.  Honest rings have a few pads in a
 * row (a lap's end, a refused claim, a recovery step).
 */
#define PEEK_SKIP_MAX (1u << 16)

int fr_peek(struct fr_ring *r, const struct fr_rec **rec, uint32_t *len)
{
	unsigned skipped = 0;

	if (fr_sub_lost(r))
		return -ESTALE;
	for (;;) {
		uint64_t pos = r->head, seal, rest;
		struct fr_rec *h = fr_rec_at(r, pos);
		uint32_t l, info;
		int rc;

		if (r->mode == FR_MODE_DEPOSIT && (rc = deposit_ready(r, pos))) {
			publish_at_rest(r, rc);
			return rc;
		}
		/* acquire: pairs with the producer's release of the seal */
		seal = atomic_load_explicit(&h->seal, memory_order_acquire);
		if (seal != fr_seal(r, pos, FR_SEAL_COMMITTED)) {
			if (r->mode == FR_MODE_DEPOSIT)
				return -EPROTO;
			rc = not_committed(r, pos, seal);
			publish_at_rest(r, rc);
			if (rc)
				return rc;
			continue;
		}
		/* read once; everything below uses the local copies */
		l = atomic_load_explicit(&h->len, memory_order_relaxed);
		info = atomic_load_explicit(&h->info, memory_order_relaxed);
		rest = fr_lap_rest(r, pos);
		if (++skipped > PEEK_SKIP_MAX) {
			/* nothing for the caller yet: it waits or tries
			 * again as its timeout says (data_maybe_ready sees
			 * the committed header: no sleep) */
			publish_idle(r);
			return -EAGAIN;
		}
		if (info & FR_INFO_PAD) {
			if (l % FR_ALIGN || (uint64_t)l + FR_REC_HDR > rest)
				return -EPROTO;
			fr_release(r, pos + FR_REC_HDR + l);
			continue;
		}
		if (l == 0 || l > r->max_record || fr_record_bytes(l) > rest)
			return -EPROTO;
		/* a deposit ring publishes whole records only */
		if (r->mode == FR_MODE_DEPOSIT &&
		    fr_record_bytes(l) > r->tail_cache - pos)
			return -EPROTO;
		if (info & FR_INFO_CTRL) {
			rc = ctrl_record(h, l);
			if (rc < 0)
				return rc;
			fr_release(r, pos + fr_record_bytes(l));
			continue;
		}
		*rec = h;
		*len = l;
		return 0;
	}
}

/* Size of the committed record whose header is h at pos, or 0 if invalid. */
static uint64_t committed_bytes(const struct fr_ring *r, const struct fr_rec *h,
				uint64_t pos)
{
	uint32_t l = atomic_load_explicit(&h->len, memory_order_relaxed);
	uint32_t info = atomic_load_explicit(&h->info, memory_order_relaxed);
	uint64_t rest = fr_lap_rest(r, pos);

	/* a pad is at most PAD_MAX (pad_at): a longer one fits no frame */
	if (info & FR_INFO_PAD)
		return l % FR_ALIGN || (uint64_t)l + FR_REC_HDR > rest ||
		       (uint64_t)l + FR_REC_HDR > PAD_MAX ?
			       0 : FR_REC_HDR + (uint64_t)l;
	if (l == 0 || l > r->max_record || fr_record_bytes(l) > rest)
		return 0;
	if ((info & FR_INFO_CTRL) && l != sizeof(uint64_t))
		return 0;
	return fr_record_bytes(l);
}

int fr_scan(const struct fr_ring *r, uint64_t pos, uint64_t limit,
	    uint64_t *end, bool *stuck)
{
	uint64_t records = 0;

	return fr_scan_records(r, pos, limit, end, stuck, &records);
}

/* A data record: neither a pad nor a control record (END). */
static bool data_record(const struct fr_rec *h)
{
	return !(atomic_load_explicit(&h->info, memory_order_relaxed) &
		 (FR_INFO_PAD | FR_INFO_CTRL));
}

/* fr_scan_records, of at most max records. */
static int scan_run(const struct fr_ring *r, uint64_t pos, uint64_t limit,
		    unsigned max, uint64_t *end, bool *stuck,
		    uint64_t *records)
{
	*stuck = false;
	if (pos % FR_ALIGN) {	/* a record header never straddles the end */
		*end = pos;
		return -EPROTO;
	}
	while (pos < limit && max--) {
		const struct fr_rec *h = fr_rec_at(r, pos);
		uint64_t bytes;

		/* acquire: pairs with the producer's release of the seal, so
		 * the bytes we are about to send are the committed ones */
		if (atomic_load_explicit(&h->seal, memory_order_acquire) !=
		    fr_seal(r, pos, FR_SEAL_COMMITTED)) {
			*stuck = true;
			break;
		}
		bytes = committed_bytes(r, h, pos);
		if (!bytes) {
			*end = pos;
			return -EPROTO;
		}
		if (bytes > limit - pos)
			break;
		*records += data_record(h);
		pos += bytes;
	}
	*end = pos;
	return 0;
}

int fr_scan_records(const struct fr_ring *r, uint64_t pos, uint64_t limit,
		    uint64_t *end, bool *stuck, uint64_t *records)
{
	return scan_run(r, pos, limit, UINT_MAX, end, stuck, records);
}

int fr_scan_records_max(const struct fr_ring *r, uint64_t pos,
			uint64_t limit, unsigned max, uint64_t *end,
			bool *stuck, uint64_t *records)
{
	return scan_run(r, pos, limit, max, end, stuck, records);
}

int fr_check_stuck(struct fr_ring *r, uint64_t pos)
{
	uint64_t seal = atomic_load_explicit(&fr_rec_at(r, pos)->seal,
					     memory_order_acquire);

	if (seal == fr_seal(r, pos, FR_SEAL_COMMITTED))
		return 0;
	return not_committed(r, pos, seal);
}

bool fr_rec_begins(const struct fr_ring *r, uint64_t pos)
{
	uint64_t seal;

	if (pos % FR_ALIGN)
		return false;
	/* acquire, as the scans read a seal; any of the three states says
	 * a claim was made at pos, so a record starts there */
	seal = atomic_load_explicit(&fr_rec_at(r, pos)->seal,
				    memory_order_acquire);
	return seal == fr_seal(r, pos, FR_SEAL_CLAIMED) ||
	       seal == fr_seal(r, pos, FR_SEAL_COMMITTED) ||
	       seal == fr_seal(r, pos, FR_SEAL_RECOVERING);
}

int fr_recover_slowest(struct fr_ring *r, uint64_t *pos)
{
	/* acquire, as a producer reads them.  Both are clients' words: a
	 * position off the record grid or out of the window below tail is
	 * left alone (its flow's own checks fail the ring) */
	uint64_t at = fr_min_pos(r);
	uint64_t tail = atomic_load_explicit(&r->sh->tail,
					     memory_order_acquire);

	*pos = at;
	if (at % FR_ALIGN || !bound_sane(r, at, tail) || fr_data_at(r, at))
		return -EAGAIN;
	return fr_check_stuck(r, at);
}

/* ---- waiting ------------------------------------------------------------ */

bool fr_data_at(const struct fr_ring *r, uint64_t pos)
{
	if (r->mode == FR_MODE_DEPOSIT)
		return fr_closed(r) ||
		       atomic_load_explicit(&r->sh->published,
					    memory_order_acquire) != pos;
	if (atomic_load_explicit(&fr_rec_at(r, pos)->seal,
				 memory_order_acquire) ==
	    fr_seal(r, pos, FR_SEAL_COMMITTED))
		return true;
	/* closed and drained: the reader's -EPIPE.  Closed with a claim
	 * still open at pos is not news: the reader sleeps until its commit
	 * or its recovery, as on an open ring (taking "closed" for ready
	 * made every wait spin a core meanwhile).  acquire: as fr_peek's
	 * look at the tail */
	return fr_closed(r) &&
	       atomic_load_explicit(&r->sh->tail, memory_order_acquire) == pos;
}

static bool data_maybe_ready(struct fr_ring *r)
{
	return fr_data_at(r, r->head);
}

/* A consumer stuck behind a claimed record must wake to run recovery. */
static uint64_t recovery_deadline(struct fr_ring *r, uint64_t deadline)
{
	uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);
	uint64_t cap;

	if (r->mode == FR_MODE_DEPOSIT || !r->recover_ns || tail == r->head)
		return deadline;
	cap = fr_now_ns() + r->recover_ns / 4 + 1;
	return cap < deadline ? cap : deadline;
}

struct sleeper {
	struct fr_ring *r;
	_Atomic uint32_t *word;
	uint32_t v;
	bool (*ready)(struct fr_ring *, uint64_t);
	uint64_t arg;
};

static int sleeper_wait(void *ctx, uint64_t until)
{
	struct sleeper *s = ctx;

	return fm_futex_wait(s->word, s->v, until);
}

static bool sleeper_ready(void *ctx)
{
	struct sleeper *s = ctx;

	return s->ready(s->r, s->arg);
}

int fr_sleep_two_phase(struct fr_ring *r, _Atomic uint32_t *word,
		       uint32_t v, uint64_t until,
		       bool (*ready)(struct fr_ring *, uint64_t), uint64_t arg)
{
	struct sleeper s = { r, word, v, ready, arg };

	return fm_sleep_two_phase(sleeper_wait, sleeper_ready, &s, until);
}

static bool data_ready_arg(struct fr_ring *r, uint64_t unused)
{
	(void)unused;
	return data_maybe_ready(r);
}

/* What wakes a producer asleep for space: the end of the ring, or the
 * room wake_producers wakes at (the same test, so that the sleeper's
 * re-check after its fence matches the waker's). */
static bool room_ready(struct fr_ring *r, uint64_t seen)
{
	uint64_t min;

	if (fr_closed(r))
		return true;
	min = fr_min_pos(r);
	return min > seen && room_to_wake(r, min);
}

/* ... or the end of its stream, which turns it away. */
static bool space_ready(struct fr_ring *r, uint64_t seen)
{
	return ending(r) || room_ready(r, seen);
}

_Atomic uint32_t *fr_data_mark(const struct fr_ring *r)
{
	return r->sub < FR_MAX_SUBS ? &r->sh->subs[r->sub].asleep : NULL;
}

/* A producer's mark: its slot's, NULL without one. */
static _Atomic uint32_t *space_mark(const struct fr_ring *r)
{
	return r->prod < FR_MAX_PRODS ? &r->sh->prod_asleep[r->prod] : NULL;
}

void fr_sleeper_in(_Atomic uint32_t *count, _Atomic uint32_t *mark)
{
	/* seq_cst: the raise the Dekker pairing needs, before the caller's
	 * full fence and re-check (pairs with the waker's fence and its
	 * read of the count) */
	atomic_fetch_add_explicit(count, 1, memory_order_seq_cst);
	/* release: a leave that takes this unit (acquire) lowers the count
	 * after our raise.  Killed between the two, the raise leaks (ring.h:
	 * the one window left) */
	if (mark)
		atomic_fetch_add_explicit(mark, 1, memory_order_release);
}

/* Take one unit back from a sleep mark: false if none is left (a leave
 * of the slot took them all). */
static bool mark_take_one(_Atomic uint32_t *mark)
{
	/* relaxed: the unit we take back is one this thread added after its
	 * raise (or the set's helper thread, handed it under the set's
	 * mutex), so it orders nothing more */
	uint32_t m = atomic_load_explicit(mark, memory_order_relaxed);

	do {
		if (!m)
			return false;
	} while (!atomic_compare_exchange_weak_explicit(mark, &m, m - 1,
							memory_order_relaxed,
							memory_order_relaxed));
	return true;
}

void fr_sleeper_out(_Atomic uint32_t *count, _Atomic uint32_t *mark)
{
	if (mark && !mark_take_one(mark))
		return; /* a leave of the slot lowered the count for us */
	/* relaxed: the count only tells wakers whether to wake */
	atomic_fetch_sub_explicit(count, 1, memory_order_relaxed);
}

int fr_wait_data(struct fr_ring *r, uint64_t deadline_ns)
{
	struct fr_shared *sh = r->sh;
	/* acquire: read the word before re-checking, so a wake in between
	 * changes it and FUTEX_WAIT returns at once */
	uint32_t v = atomic_load_explicit(&sh->data_futex, memory_order_acquire);
	uint64_t until = recovery_deadline(r, deadline_ns);
	_Atomic uint32_t *mark = fr_data_mark(r);
	int rc = 0;

	/* producers must not wait for us while we sleep */
	if (r->sub < FR_MAX_SUBS && r->head != r->head_pub)
		publish_pos(r);
	fr_sleeper_in(&sh->consumers_waiting, mark);
	/* full fence: count before the re-check (pairs with wake_consumer) */
	atomic_thread_fence(memory_order_seq_cst);
	if (!data_maybe_ready(r)) {
		fmlt_mark(LT_CONS_SLEEP, 0);
		rc = fr_sleep_two_phase(r, &sh->data_futex, v, until,
				     data_ready_arg, 0);
		fmlt_mark(LT_CONS_WOKE, 0);
	}
	fr_sleeper_out(&sh->consumers_waiting, mark);
	if (rc == -ETIMEDOUT && until != deadline_ns)
		rc = 0;
	return rc;
}

/*
 * Sleep until ready (wake_room is free, or the ring or stream ends) or the
 * deadline.  Room below wake_room wakes nobody, so look for it every
 * FR_ROOM_LOOK_NS: once the subscribers moved at all, return 0 and let the
 * caller try its claim.  A producer whose record fits thus waits at most
 * that long for the rest of the quarter, even when the subscribers stop
 * short of it (a consumer that waits for this producer elsewhere).  At
 * the deadline, too, moved subscribers mean one more try (0): the caller
 * times out only if its record still does not fit.
 */
static int sleep_for_room(struct fr_ring *r, uint32_t v, uint64_t seen,
			  uint64_t deadline_ns,
			  bool (*ready)(struct fr_ring *, uint64_t))
{
	_Atomic uint32_t *word = &r->sh->space_futex;
	uint64_t until = fr_now_ns() + FR_ROOM_LOOK_NS;
	int rc;

	if (until > deadline_ns)
		until = deadline_ns;
	rc = fr_sleep_two_phase(r, word, v, until, ready, seen);
	/* A timeout before the deadline comes only after the heavy fence
	 * (a deadline within the brief phase ends the loop at once): every
	 * waker sees our count now, so plain waits on the same word miss no
	 * wake-up (ipc/barrier.h). */
	for (;;) {
		if (rc != -ETIMEDOUT)
			return rc;
		/* held back by a subscriber that died without a moverd to
		 * see it? */
		leave_dead_blockers(r);
		if (fr_min_pos(r) > seen)
			return 0; /* moved: the caller tries its claim again */
		if (until >= deadline_ns)
			return -ETIMEDOUT;
		until = until > deadline_ns - FR_ROOM_LOOK_NS ?
				deadline_ns : until + FR_ROOM_LOOK_NS;
		rc = fm_futex_wait(word, v, until);
	}
}

static int wait_space(struct fr_ring *r, uint64_t deadline_ns,
		      bool (*ready)(struct fr_ring *, uint64_t))
{
	struct fr_shared *sh = r->sh;
	uint32_t v = atomic_load_explicit(&sh->space_futex, memory_order_acquire);
	uint64_t seen = r->head_cache, t0 = fr_now_ns();
	_Atomic uint32_t *mark = space_mark(r);
	int rc = 0;

	fr_count_flush(r);
	fr_sleeper_in(&sh->producers_waiting, mark);
	/* full fence: count before the re-check (pairs with wake_producers
	 * and with fr_release's read of the count) */
	atomic_thread_fence(memory_order_seq_cst);
	full_with_lag(r);
	leave_dead_blockers(r);
	if (!ready(r, seen))
		rc = sleep_for_room(r, v, seen, deadline_ns, ready);
	fr_sleeper_out(&sh->producers_waiting, mark);
	fr_note_full(r, t0);
	return rc;
}

int fr_wait_space(struct fr_ring *r, uint64_t deadline_ns)
{
	return wait_space(r, deadline_ns, space_ready);
}

int fr_wait_room(struct fr_ring *r, uint64_t deadline_ns)
{
	return wait_space(r, deadline_ns, room_ready);
}

void fr_note_full(struct fr_ring *r, uint64_t t0_ns)
{
	/* back-pressure counters, for operators: written only when full
	 * (relaxed: counts, ordered with nothing) */
	atomic_fetch_add_explicit(&r->sh->full_events, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->sh->full_ns, fr_now_ns() - t0_ns,
				  memory_order_relaxed);
}

/* ---- deposit rings ------------------------------------------------------ */

void fr_publish(struct fr_ring *r, uint64_t pos)
{
	/* release: the deposited bytes are visible before the new limit */
	atomic_store_explicit(&r->sh->published, pos, memory_order_release);
	wake_consumer(r);
}
