/*
 * The doorbell page (ipc/bell.h) under ThreadSanitizer: the lost-wake-up
 * race.  A "moverd" thread goes to sleep on the page's futex word
 * (fb_prepare_sleep, FUTEX_WAIT) while a "producer" thread rings at every
 * moment of that window, many times.  A sleep that is not ended by the
 * ring within a bounded wait (2 s, where a ring takes microseconds) is a
 * lost wake-up: the test fails, it does not hang.  The sleeper takes the
 * heavy fence after each brief sleep, as moverd does (ring format 3).
 *
 * Phase 1 rings bits directly (fb_ring); phase 2 goes through a ring: the
 * sleeper arms it (fr_bell_arm) and re-checks it, the producer commits a
 * record (fr_commit rings the page when the ring is armed).
 *
 * One thread each, on ONE mapping (TSan tracks addresses).
 */
#include "testutil.h"
#include "flowshm_internal.h"
#include "../ipc/bell.h"
#include "../ipc/futex.h"
#include "../ipc/barrier.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define LOST_NS 2000000000ull

static struct fr_bell *bell;
static uint64_t iters;
static _Atomic uint64_t done;   /* iterations the sleeper finished */
static _Atomic int failed;
static uint64_t sleeps, rechecks, heavies; /* the sleeper's: how often
					   * each path ran */

/* Let the other thread reach any point of its window. */
static void jitter(uint64_t i)
{
	static _Atomic unsigned sink; /* only this thread: a delay loop */
	unsigned spins = (unsigned)(tu_mix(i) % 1024);

	if (spins > 1000)
		sched_yield();
	else
		for (unsigned k = 0; k < spins; k++)
			atomic_fetch_add_explicit(&sink, 1,
						  memory_order_relaxed);
}

static void wait_turn(uint64_t i)
{
	/* spin first: the window is the sleeper's next microsecond */
	for (unsigned k = 0; atomic_load(&done) < i && !atomic_load(&failed);
	     k++)
		if (k > 20000)
			sched_yield();
}

/* Sleep on the page until `have` says the awaited event is there; false
 * on a lost wake-up.  As moverd does (mover.c, "Arming and the heavy
 * fence"): a sleep lasts FM_BRIEF_SLEEP_NS, then the heavy fence and a look
 * again, for the producer's fence after a commit is light (ipc/barrier.h);
 * a ring's wake-up that neither the futex nor that look delivers within
 * LOST_NS is lost. */
static bool sleep_until(bool (*have)(void *), void *arg)
{
	uint64_t give_up = fr_now_ns() + LOST_NS;

	for (;;) {
		uint32_t v;
		int rc;

		if (have(arg))
			return true;
		if (fb_prepare_sleep(bell, &v)) {
			fb_woke(bell);
			rechecks++;
			continue;
		}
		if (have(arg)) { /* the re-check after the flag (ring path) */
			fb_woke(bell);
			rechecks++;
			return true;
		}
		sleeps++;
		rc = fm_futex_wait(&bell->futex, v,
				   fr_now_ns() + FM_BRIEF_SLEEP_NS);
		fb_woke(bell);
		if (rc != -ETIMEDOUT)
			continue;
		if (fr_now_ns() > give_up)
			return false;
		fm_fence_heavy();
		heavies++;
	}
}

/* ---- phase 1: bits ------------------------------------------------------- */

static uint32_t want_idx;

static bool bit_collected(void *arg)
{
	uint32_t ids[64];
	unsigned n = fb_collect(bell, ids, 64);

	(void)arg;
	for (unsigned k = 0; k < n; k++)
		if (ids[k] == want_idx)
			return true;
	return false;
}

static void *bit_sleeper(void *arg)
{
	(void)arg;
	for (uint64_t i = 0; i < iters; i++) {
		want_idx = (uint32_t)(tu_mix(i) % FB_BITS);
		atomic_store(&done, i); /* the ringer may ring want_idx now */
		if (!sleep_until(bit_collected, NULL)) {
			fprintf(stderr, "bits: iteration %llu: lost wake-up\n",
				(unsigned long long)i);
			atomic_store(&failed, 1);
			return NULL;
		}
	}
	atomic_store(&done, iters);
	return NULL;
}

static void *bit_ringer(void *arg)
{
	(void)arg;
	for (uint64_t i = 0; i < iters && !atomic_load(&failed); i++) {
		wait_turn(i);
		jitter(i);
		fb_ring(bell, (uint32_t)(tu_mix(i) % FB_BITS));
	}
	return NULL;
}

/* ---- phase 2: a ring armed for the doorbell ------------------------------ */

static void *map;
static size_t map_bytes;
static unsigned bell_idx = 4242;

static bool record_there(void *arg)
{
	struct fr_ring *r = arg;
	const struct fr_rec *rec;
	uint32_t len;
	int rc;

	fb_collect(bell, (uint32_t[64]){ 0 }, 64);
	rc = fr_peek(r, &rec, &len);
	if (rc == -EAGAIN) {
		/* arm, then the caller's re-check (ring.h "Doorbell") */
		fr_bell_arm(r);
		rc = fr_peek(r, &rec, &len);
	}
	if (rc)
		return false;
	fr_release(r, r->head + fr_record_bytes(len));
	return true;
}

static void *ring_sleeper(void *arg)
{
	struct fr_ring r;
	unsigned slot;
	uint64_t gen;

	(void)arg;
	CHECK_RC(fr_attach(&r, map, map_bytes), 0);
	CHECK_RC(fr_sub_take(&r, 1, &slot, &gen), 0);
	CHECK_RC(fr_sub_adopt(&r, slot, gen), 0);
	for (uint64_t i = 0; i < iters; i++) {
		atomic_store(&done, i);
		if (!sleep_until(record_there, &r)) {
			fprintf(stderr, "ring: record %llu: lost wake-up\n",
				(unsigned long long)i);
			atomic_store(&failed, 1);
			return NULL;
		}
	}
	atomic_store(&done, iters);
	return NULL;
}

static void *ring_producer(void *arg)
{
	struct fr_ring r;

	(void)arg;
	CHECK_RC(fr_attach(&r, map, map_bytes), 0);
	r.bell = bell;
	r.bell_index = bell_idx;
	for (uint64_t i = 0; i < iters && !atomic_load(&failed); i++) {
		uint32_t len = 8;
		struct fr_claim c;

		wait_turn(i);
		jitter(i);
		CHECK_RC(fr_claim(&r, &len, 1, &c), 0);
		memcpy(fr_rec_at(&r, c.pos) + 1, &i, sizeof(i));
		fr_commit(&r, &c);
	}
	return NULL;
}

static void run(void *(*a)(void *), void *(*b)(void *), const char *what)
{
	pthread_t ta, tb;

	atomic_store(&done, 0);
	sleeps = rechecks = heavies = 0;
	CHECK(pthread_create(&ta, NULL, a, NULL) == 0);
	CHECK(pthread_create(&tb, NULL, b, NULL) == 0);
	CHECK(pthread_join(ta, NULL) == 0);
	CHECK(pthread_join(tb, NULL) == 0);
	CHECK(!atomic_load(&failed));
	printf("ok - %s: %llu rounds (%llu futex sleeps, %llu caught by the "
	       "re-check, %llu brief sleeps ran out), no wake-up lost\n", what,
	       (unsigned long long)iters, (unsigned long long)sleeps,
	       (unsigned long long)rechecks, (unsigned long long)heavies);
}

int main(void)
{
	int fd = tu_ring(1 << 16, 64, 0);
	struct stat st;

	iters = (uint64_t)tu_env_long("FM_BELL_ITERS", 20000);
	bell = mmap(NULL, FB_BYTES, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(bell != MAP_FAILED);
	fb_format(bell, 1);
	CHECK_RC(fb_check(bell, FB_BYTES), 0);
	run(bit_sleeper, bit_ringer, "doorbell bits");

	CHECK(fstat(fd, &st) == 0);
	map_bytes = (size_t)st.st_size;
	map = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(map != MAP_FAILED);
	run(ring_sleeper, ring_producer, "armed ring");
	munmap(map, map_bytes);
	munmap(bell, FB_BYTES);
	close(fd);
	return 0;
}
