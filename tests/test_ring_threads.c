/*
 * The lock-free ring under ThreadSanitizer: producer threads and a consumer
 * thread on ONE mapping (TSan tracks addresses, so separate mappings of the
 * same memory would hide races from it), through the ipc/ring.h protocol
 * itself, including the sleep/wake paths.
 */
#include "testutil.h"
#include "flowshm_internal.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define PRODUCERS 3
#define MAX_REC 512

static void *map;
static size_t map_bytes;
static uint64_t per_producer;

static void *producer(void *arg)
{
	uint32_t id = (uint32_t)(uintptr_t)arg;
	struct fr_ring r;

	CHECK_RC(fr_attach(&r, map, map_bytes), 0);
	for (uint64_t seq = 0; seq < per_producer;) {
		uint32_t lens[4];
		struct fr_claim c;
		unsigned k;
		uint64_t p;
		int rc;

		for (k = 0; k < 4; k++)
			lens[k] = (uint32_t)tu_rec_len(id, seq + k, 16, MAX_REC);
		rc = fr_claim(&r, lens, seq + 4 <= per_producer ? 4 : 1, &c);
		if (rc == -EAGAIN) {
			fr_wait_space(&r, fr_now_ns() + 1000000);
			continue;
		}
		CHECK_RC(rc, 0);
		p = c.pos;
		for (k = 0; k < c.n; k++) {
			tu_fill(fr_rec_at(&r, p) + 1, id, seq + k, lens[k]);
			p += fr_record_bytes(lens[k]);
		}
		fr_commit(&r, &c);
		seq += c.n;
	}
	return NULL;
}

/* ---- moverd's HELD slot taken while producers cut laggards -------------- */

static atomic_int cut_stop;

/* A producer that claims forever: with max_lag set and no reader, it cuts
 * every slot that joins more than max_lag behind the full ring. */
static void *cutting_producer(void *arg)
{
	struct fr_ring p;

	(void)arg;
	CHECK_RC(fr_attach(&p, map, map_bytes), 0);
	while (!atomic_load(&cut_stop)) {
		uint32_t len = 200;
		struct fr_claim c;

		if (!fr_claim(&p, &len, 1, &c))
			fr_commit(&p, &c);
	}
	return NULL;
}

/*
 * fr_sub_take_held (moverd rejoining a fan-out peer) races a producer's
 * cut: cut before the adopt, the slot was left CUT in moverd's pid, which
 * nobody frees (16 such and every attach is -EBUSY).  2000 takes: every
 * slot must be free at the end, whoever won each race (before the fix, 2
 * and 5 were left in two runs of 400 of three).
 */
static void held_takes_under_cuts(void)
{
	int fd = tu_ring(1 << 16, 1024, 0), ok = 0, cut = 0, left = 0;
	struct fr_shared *sh;
	struct fr_ring m;
	pthread_t th;
	struct stat st;

	CHECK(fstat(fd, &st) == 0);
	map_bytes = (size_t)st.st_size;
	map = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(map != MAP_FAILED);
	sh = map;
	atomic_store(&sh->max_lag, 16384);
	CHECK_RC(fr_attach(&m, map, map_bytes), 0);
	CHECK(pthread_create(&th, NULL, cutting_producer, NULL) == 0);
	usleep(20000); /* the ring full at its floor */
	for (int i = 0; i < 2000; i++) {
		int rc = fr_sub_take_held(&m, (uint32_t)getpid());

		if (rc == 0) {
			ok++;
			fr_sub_leave(&m, m.sub, m.sub_gen);
		} else {
			CHECK(rc == -ESTALE);
			cut++;
		}
	}
	atomic_store(&cut_stop, 1);
	CHECK(pthread_join(th, NULL) == 0);
	for (unsigned i = 0; i < FR_MAX_SUBS; i++)
		left += atomic_load(&sh->subs[i].state) != FR_SUB_FREE;
	printf("held takes under cuts: %d taken, %d cut first; slots not "
	       "free at the end: %d, mask %#x\n", ok, cut, left,
	       (unsigned)atomic_load(&sh->sub_mask));
	CHECK(left == 0 && atomic_load(&sh->sub_mask) == 0);
	munmap(map, map_bytes);
	close(fd);
}

int main(void)
{
	int fd = tu_ring(1 << 14, MAX_REC, 0);
	struct fr_ring r;
	pthread_t th[PRODUCERS];
	uint64_t next[PRODUCERS] = { 0 }, total = 0;
	struct stat st;

	per_producer = (uint64_t)tu_env_long("FM_THREAD_RECORDS", 200000);
	CHECK(fstat(fd, &st) == 0);
	map_bytes = (size_t)st.st_size;
	map = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(map != MAP_FAILED);
	CHECK_RC(fr_attach(&r, map, map_bytes), 0);
	{
		/* ring format 2: a consumer is a subscriber with a slot */
		unsigned slot;
		uint64_t gen;

		CHECK_RC(fr_sub_take(&r, (uint32_t)getpid(), &slot, &gen), 0);
		CHECK_RC(fr_sub_adopt(&r, slot, gen), 0);
	}
	for (uintptr_t i = 0; i < PRODUCERS; i++)
		CHECK(pthread_create(&th[i], NULL, producer, (void *)i) == 0);
	while (total < per_producer * PRODUCERS) {
		const struct fr_rec *rec;
		uint32_t len, id;
		uint64_t seq;
		int rc = fr_peek(&r, &rec, &len);

		if (rc == -EAGAIN) {
			fr_wait_data(&r, fr_now_ns() + 1000000);
			continue;
		}
		CHECK_RC(rc, 0);
		CHECK(tu_verify(rec + 1, len, &id, &seq));
		CHECK(id < PRODUCERS && seq == next[id]);
		next[id]++;
		total++;
		fr_release(&r, r.head + fr_record_bytes(len));
	}
	for (int i = 0; i < PRODUCERS; i++)
		CHECK(pthread_join(th[i], NULL) == 0);
	printf("%d producer threads x %llu records verified\n", PRODUCERS,
	       (unsigned long long)per_producer);
	munmap(map, map_bytes);
	close(fd);
	held_takes_under_cuts();
	return 0;
}
