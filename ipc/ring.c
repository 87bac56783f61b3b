/*
 * ipc/ring.c - slow paths and protocol steps of the shared ring.
 * The layout and the protocol are documented in ring.h; this file only
 * implements them.  Every ordering below is annotated with its reason.
 */
#include "ring.h"
#include "futex.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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
	if (p->start % FR_ALIGN)
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
	atomic_store_explicit(&sh->head, p->start, memory_order_relaxed);
	atomic_store_explicit(&sh->published, p->start, memory_order_relaxed);
	/*
	 * The magic goes last, with release: whoever attaches and sees it
	 * also sees a complete geometry (matters for rings in shared files).
	 */
	atomic_store_explicit((_Atomic uint64_t *)&sh->geo.magic, FR_MAGIC,
			      memory_order_release);
}

static int check_positions(uint64_t head, uint64_t tail, uint64_t size)
{
	if (head > tail || tail - head > size || (head | tail) % FR_ALIGN)
		return -EPROTO;
	return 0;
}

int fr_attach(struct fr_ring *r, void *map, size_t map_bytes)
{
	struct fr_shared *sh = map;
	struct fr_geometry g;
	struct fr_params p;
	uint64_t head, tail;

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

	head = atomic_load_explicit(&sh->head, memory_order_acquire);
	tail = g.mode == FR_MODE_DEPOSIT ?
		       atomic_load_explicit(&sh->published, memory_order_acquire) :
		       atomic_load_explicit(&sh->tail, memory_order_acquire);
	if (check_positions(head, tail, g.ring_bytes))
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
		.head = head,
		.tail_cache = tail,
		.stuck_pos = UINT64_MAX,
		.head_cache = head,
		.pid = (uint32_t)getpid() & FR_INFO_PID,
	};
	return 0;
}

static void wake_all(_Atomic uint32_t *word)
{
	/* release: a woken sleeper that reads the word sees what we did */
	atomic_fetch_add_explicit(word, 1, memory_order_release);
	fm_futex_wake(word);
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

static void wake_consumer(struct fr_ring *r)
{
	/*
	 * Full fence between our release store of a seal (or of `published`)
	 * and the read of the sleeper flag; the consumer does the mirror
	 * image (flag store, fence, ring re-check), so one of us sees the
	 * other.
	 */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&r->sh->consumer_waiting, memory_order_relaxed))
		wake_all(&r->sh->data_futex);
}

static void write_pad(struct fr_ring *r, uint64_t pos, uint64_t bytes)
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

int fr_refresh_head(struct fr_ring *r, uint64_t *free_bytes)
{
	/*
	 * acquire: pairs with the consumer's release of head, so its reads of
	 * the records before head happen before we overwrite that space.
	 * head is read before tail, so an honest head is <= the tail we read;
	 * it never moves backwards.
	 */
	uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
	uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);

	if (head > tail || head < r->head_cache || head % FR_ALIGN)
		return -EPROTO;
	r->head_cache = head;
	if (free_bytes)
		*free_bytes = tail - head > r->size ? 0 : r->size - (tail - head);
	return 0;
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

int fr_claim(struct fr_ring *r, const uint32_t *lens, unsigned n,
	     struct fr_claim *c)
{
	/* relaxed: the CAS below validates the value we start from */
	uint64_t t = atomic_load_explicit(&r->sh->tail, memory_order_relaxed);

	for (;;) {
		uint64_t rest, pad, end;
		unsigned k;
		int rc;

		if (fr_closed(r))
			return fr_closed_rc(r);
		if (t < r->head_cache || t - r->head_cache > r->size) {
			/* our head is a lap behind, or t is older than it */
			rc = fr_refresh_head(r, NULL);
			if (rc)
				return rc;
			if (t < r->head_cache) {
				t = atomic_load_explicit(&r->sh->tail,
							 memory_order_relaxed);
				continue;
			}
			/* t was read before head: more than a lap apart
			 * means a corrupt head or tail */
			if (t - r->head_cache > r->size)
				return -EPROTO;
		}
		rest = fr_lap_rest(r, t);
		pad = fr_record_bytes(lens[0]) > rest ? rest : 0;
		k = fit(r, lens, n, t + pad, r->head_cache + r->size, &end);
		if (k == 0) {
			rc = fr_refresh_head(r, NULL);
			if (rc)
				return rc;
			k = fit(r, lens, n, t + pad, r->head_cache + r->size,
				&end);
		}
		if (k == 0) {
			/* Not even one record: claim the padding alone if it
			 * fits, so the record can start the next lap. */
			if (!pad || t + pad > r->head_cache + r->size)
				return -EAGAIN;
			end = t + pad;
		}
		/*
		 * acquire on success: our writes into the claimed space stay
		 * after the claim.  On failure t is reloaded and we retry.
		 */
		if (!atomic_compare_exchange_weak_explicit(
			    &r->sh->tail, &t, end, memory_order_acquire,
			    memory_order_relaxed))
			continue;
		if (pad) {
			write_pad(r, t, pad);
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

void fr_commit(struct fr_ring *r, const struct fr_claim *c)
{
	uint64_t p = c->pos;

	for (unsigned i = 0; i < c->n && p < c->end; i++) {
		struct fr_rec *h = fr_rec_at(r, p);
		uint64_t bytes = fr_record_bytes(
			atomic_load_explicit(&h->len, memory_order_relaxed));

		/* release: header and payload are visible with the seal */
		atomic_store_explicit(&h->seal, fr_seal(r, p, FR_SEAL_COMMITTED),
				      memory_order_release);
		p += bytes;
	}
	wake_consumer(r);
}

/* ---- consumer ----------------------------------------------------------- */

static void wake_producers(struct fr_ring *r)
{
	/* Same Dekker pairing as wake_consumer, for the space side. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&r->sh->producers_waiting,
				 memory_order_relaxed))
		wake_all(&r->sh->space_futex);
}

void fr_release(struct fr_ring *r, uint64_t pos)
{
	r->head = pos;
	/* release: our reads of the released records happen before any
	 * producer that acquires this head overwrites them */
	atomic_store_explicit(&r->sh->head, pos, memory_order_release);
	wake_producers(r);
}

static bool pid_alive(uint32_t pid)
{
	char path[64], buf[256];
	FILE *f;
	char *rp;
	bool alive = true;

	if (pid == 0)
		return false;
	if (kill((pid_t)pid, 0) && errno == ESRCH)
		return false;
	/* A killed child not yet reaped is a zombie: dead for our purposes. */
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return true;
	if (fgets(buf, sizeof(buf), f) && (rp = strrchr(buf, ')')) &&
	    (rp[1] == ' ') && (rp[2] == 'Z' || rp[2] == 'X'))
		alive = false;
	fclose(f);
	return alive;
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
 * producer that is dead; 0 otherwise. */
static uint64_t dead_claim_bytes(struct fr_ring *r, uint64_t pos,
				 uint64_t limit, uint32_t *pid)
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
	if (pid_alive(*pid))
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
 * The record at pos was claimed but not committed for recover_ns.  Turn
 * it into padding if its producer is dead, or if no header was ever
 * written (killed between the claim and the header).  Further records
 * claimed by the same dead producer are padded at once.
 * 0 = padded (caller re-reads), -EAGAIN = producer still alive.
 */
static int recover(struct fr_ring *r, uint64_t pos, uint64_t seal,
		   uint64_t tail)
{
	uint64_t limit = lap_limit(r, pos, tail);
	uint32_t pid = 0, next_pid;
	uint64_t bytes;

	if (seal == fr_seal(r, pos, FR_SEAL_CLAIMED)) {
		bytes = dead_claim_bytes(r, pos, limit, &pid);
		if (!bytes) {
			r->stuck_since_ns = stuck_clock_ns(); /* look later */
			return -EAGAIN;
		}
	} else {
		bytes = next_sealed(r, pos, limit) - pos;
	}
	for (;;) {
		write_pad(r, pos, bytes);
		atomic_fetch_add_explicit(&r->sh->recovered, 1,
					  memory_order_relaxed);
		pos += bytes;
		if (pos >= tail || !pid)
			break;
		bytes = dead_claim_bytes(r, pos, lap_limit(r, pos, tail),
					 &next_pid);
		if (!bytes || next_pid != pid)
			break;
	}
	r->stuck_pos = pos;
	r->stuck_since_ns = stuck_clock_ns();
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
		if (pos > r->tail_cache || r->tail_cache - pos > r->size)
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
	if (pos > r->tail_cache || r->tail_cache - pos > r->size)
		return -EPROTO;
	if (pos == r->tail_cache)
		return fr_closed(r) ? fr_closed_rc(r) : -EAGAIN;
	return 0;
}

int fr_peek(struct fr_ring *r, const struct fr_rec **rec, uint32_t *len)
{
	for (;;) {
		uint64_t pos = r->head, seal, rest;
		struct fr_rec *h = fr_rec_at(r, pos);
		uint32_t l, info;
		int rc;

		if (r->mode == FR_MODE_DEPOSIT && (rc = deposit_ready(r, pos)))
			return rc;
		/* acquire: pairs with the producer's release of the seal */
		seal = atomic_load_explicit(&h->seal, memory_order_acquire);
		if (seal != fr_seal(r, pos, FR_SEAL_COMMITTED)) {
			if (r->mode == FR_MODE_DEPOSIT)
				return -EPROTO;
			rc = not_committed(r, pos, seal);
			if (rc)
				return rc;
			continue;
		}
		/* read once; everything below uses the local copies */
		l = atomic_load_explicit(&h->len, memory_order_relaxed);
		info = atomic_load_explicit(&h->info, memory_order_relaxed);
		rest = fr_lap_rest(r, pos);
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

	if (info & FR_INFO_PAD)
		return l % FR_ALIGN || (uint64_t)l + FR_REC_HDR > rest ?
			       0 : FR_REC_HDR + (uint64_t)l;
	if (l == 0 || l > r->max_record || fr_record_bytes(l) > rest)
		return 0;
	return fr_record_bytes(l);
}

int fr_scan(const struct fr_ring *r, uint64_t pos, uint64_t limit,
	    uint64_t *end, bool *stuck)
{
	*stuck = false;
	while (pos < limit) {
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
		pos += bytes;
	}
	*end = pos;
	return 0;
}

int fr_check_stuck(struct fr_ring *r, uint64_t pos)
{
	uint64_t seal = atomic_load_explicit(&fr_rec_at(r, pos)->seal,
					     memory_order_acquire);

	if (seal == fr_seal(r, pos, FR_SEAL_COMMITTED))
		return 0;
	return not_committed(r, pos, seal);
}

/* ---- waiting ------------------------------------------------------------ */

static bool data_maybe_ready(struct fr_ring *r)
{
	uint64_t pos = r->head;

	if (fr_closed(r))
		return true;
	if (r->mode == FR_MODE_DEPOSIT)
		return atomic_load_explicit(&r->sh->published,
					    memory_order_acquire) != pos;
	return atomic_load_explicit(&fr_rec_at(r, pos)->seal,
				    memory_order_acquire) ==
	       fr_seal(r, pos, FR_SEAL_COMMITTED);
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

int fr_wait_data(struct fr_ring *r, uint64_t deadline_ns)
{
	struct fr_shared *sh = r->sh;
	/* acquire: read the word before re-checking, so a wake in between
	 * changes it and FUTEX_WAIT returns at once */
	uint32_t v = atomic_load_explicit(&sh->data_futex, memory_order_acquire);
	uint64_t until = recovery_deadline(r, deadline_ns);
	int rc = 0;

	atomic_store_explicit(&sh->consumer_waiting, 1, memory_order_relaxed);
	/* full fence: flag store before the re-check (pairs with wake_consumer) */
	atomic_thread_fence(memory_order_seq_cst);
	if (!data_maybe_ready(r))
		rc = fm_futex_wait(&sh->data_futex, v, until);
	atomic_store_explicit(&sh->consumer_waiting, 0, memory_order_relaxed);
	if (rc == -ETIMEDOUT && until != deadline_ns)
		rc = 0;
	return rc;
}

int fr_wait_space(struct fr_ring *r, uint64_t deadline_ns)
{
	struct fr_shared *sh = r->sh;
	uint32_t v = atomic_load_explicit(&sh->space_futex, memory_order_acquire);
	uint64_t seen = r->head_cache;
	int rc = 0;

	atomic_fetch_add_explicit(&sh->producers_waiting, 1, memory_order_relaxed);
	/* full fence: count before the re-check (pairs with wake_producers) */
	atomic_thread_fence(memory_order_seq_cst);
	if (!fr_closed(r) &&
	    atomic_load_explicit(&sh->head, memory_order_acquire) == seen)
		rc = fm_futex_wait(&sh->space_futex, v, deadline_ns);
	atomic_fetch_sub_explicit(&sh->producers_waiting, 1,
				  memory_order_relaxed);
	return rc;
}

/* ---- deposit rings ------------------------------------------------------ */

void fr_publish(struct fr_ring *r, uint64_t pos)
{
	/* release: the deposited bytes are visible before the new limit */
	atomic_store_explicit(&r->sh->published, pos, memory_order_release);
	wake_consumer(r);
}
