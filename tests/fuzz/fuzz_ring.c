/*
 * fuzz_ring: the ring reader against arbitrary shared memory.  Everything a
 * client writes into a ring is untrusted input to moverd and to consumers:
 * the input becomes the positions and the data area of a ring, and the
 * consumer (fr_peek/fr_release) and moverd's scanner (fr_scan) must return
 * records that lie inside the ring, or -EPROTO, never read out of bounds;
 * a producer (fr_claim/fr_commit, local rings) must claim records on the
 * record grid inside the ring, or refuse, never write off it.
 *
 * Recovery runs too, with no timeout, on whatever the consumer stops at: it
 * reads record headers, the producer slots and their tags (ipc/ring.h,
 * Producer slots, Liveness) a client wrote, and may pad only inside the
 * claimed space.
 *
 * Input: 1 byte mode (bit 0: deposit ring), 3 x 8 bytes head/tail/published
 * offsets (taken modulo a few laps), up to 4 KiB of data area, then up to
 * 1 KiB of producer slots and 512 bytes of their tags (ipc/ring.h,
 * Liveness).
 */
#include "flowshm_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RING 4096u
#define KEY  0x5eed000000001000ull

static uint64_t take64(const uint8_t **p, size_t *n)
{
	uint64_t v = 0;
	size_t k = *n < 8 ? *n : 8;

	memcpy(&v, *p, k);
	*p += k;
	*n -= k;
	return v;
}

/* A producer on the same (scribbled) ring: lengths from the input's first
 * bytes.  Every claim must lie on the record grid inside one lap. */
static void produce(uint8_t *map, size_t map_bytes, const uint8_t *data,
		    size_t size)
{
	struct fr_ring p;

	if (fr_attach(&p, map, map_bytes) || size < 2)
		return;
	fr_producer_number(&p);
	/* what attach checked may change after it: a client moves tail and
	 * the floor by a signed byte each (off the grid, too) */
	atomic_fetch_add(&((struct fr_shared *)map)->tail,
			 (uint64_t)(int64_t)(int8_t)data[0]);
	atomic_fetch_add(&((struct fr_shared *)map)->floor,
			 (uint64_t)(int64_t)(int8_t)data[1]);
	data += 2;
	size -= 2;
	for (size_t i = 0; i < 8 && i < size; i++) {
		uint32_t len = 1 + (uint32_t)data[i] * 4;
		struct fr_claim c;
		uint64_t off;

		if (fr_claim(&p, &len, 1, &c))
			return;
		off = c.pos & (RING - 1);
		if (c.pos % FR_ALIGN || c.n != 1 ||
		    off + fr_record_bytes(len) > RING)
			abort();
		memset(fr_rec_at(&p, c.pos) + 1, 0xa5, len);
		fr_commit(&p, &c);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static _Alignas(4096) uint8_t map[FR_CTRL_BYTES + RING];
	struct fr_params prm = { RING, 1024, FR_MODE_LOCAL, KEY, 0 };
	struct fr_shared *sh = (struct fr_shared *)map;
	struct fr_ring r;
	uint64_t base = 3 * RING, sum = 0, end;
	bool stuck;

	if (size < 1)
		return 0;
	prm.mode = data[0] & 1 ? FR_MODE_DEPOSIT : FR_MODE_LOCAL;
	data++;
	size--;
	memset(map, 0, sizeof(map));
	fr_format(map, &prm);
	/* positions near a few laps in, possibly inconsistent */
	atomic_store(&sh->floor, base + (take64(&data, &size) % (2 * RING)));
	atomic_store(&sh->tail, base + (take64(&data, &size) % (2 * RING)));
	atomic_store(&sh->published, base + (take64(&data, &size) % (2 * RING)));
	memcpy(map + FR_CTRL_BYTES, data, size < RING ? size : RING);
	if (size > RING) {
		size_t rest = size - RING;
		size_t k = rest < sizeof(sh->prods) ? rest : sizeof(sh->prods);

		memcpy(sh->prods, data + RING, k);
		rest -= k;
		memcpy(sh->prod_tags, data + RING + k,
		       rest < sizeof(sh->prod_tags) ? rest :
						      sizeof(sh->prod_tags));
	}
	if (fr_attach(&r, map, sizeof(map)))
		return 0;
	/* a subscriber, as a consumer is in ring format 2 */
	{
		unsigned slot;
		uint64_t gen;

		if (fr_sub_take(&r, 1, &slot, &gen) ||
		    fr_sub_adopt(&r, slot, gen))
			return 0;
	}
	r.recover_ns = 1; /* every record not committed is looked at */
	for (int i = 0; i < 512; i++) {
		const struct fr_rec *rec;
		uint32_t len;
		int rc;

		/* as if stuck here for ever: recovery runs at once */
		r.stuck_pos = r.head;
		r.stuck_since_ns = 0;
		r.tail_cache = 0;
		rc = fr_peek(&r, &rec, &len);
		if (rc == -EAGAIN && r.head < atomic_load(&sh->tail)) {
			r.stuck_since_ns = 0;
			rc = fr_peek(&r, &rec, &len);
		}
		if (rc)
			break;
		/* the record must lie inside the data area */
		if ((const uint8_t *)(rec + 1) + len > map + sizeof(map))
			abort();
		for (uint32_t k = 0; k < len; k++)
			sum += ((const uint8_t *)(rec + 1))[k];
		fr_release(&r, r.head + fr_record_bytes(len));
	}
	fr_scan(&r, r.head, r.head + RING, &end, &stuck);
	if (end < r.head || end > r.head + RING)
		abort();
	if (prm.mode == FR_MODE_LOCAL)
		produce(map, sizeof(map), data, size);
	return (int)(sum & 0);
}
