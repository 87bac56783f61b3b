/*
 * ipc/bell.c - moverd's doorbell page (ipc/bell.h): producers ring one bit
 * per flow and, only when moverd sleeps, its one futex word.
 */
#include "bell.h"
#include "lattrace.h"
#include "futex.h"

#include <errno.h>

int fb_check(const struct fr_bell *b, size_t bytes)
{
	if (bytes < FB_BYTES)
		return -EPROTO;
	/* acquire: pairs with the release of the magic in fb_format */
	if (atomic_load_explicit((_Atomic uint64_t *)&b->magic,
				 memory_order_acquire) != FB_MAGIC ||
	    b->version != FB_VERSION || b->nbits != FB_BITS)
		return -EPROTO;
	return 0;
}

void fb_ring(struct fr_bell *b, uint32_t idx)
{
	uint32_t w = idx / 64u;

	if (idx >= FB_BITS)
		return;
	/* release: our committed records before the bit moverd acquires */
	atomic_fetch_or_explicit(&b->bits[w], 1ull << (idx % 64u),
				 memory_order_release);
	atomic_fetch_or_explicit(&b->summary[w / 64u], 1ull << (w % 64u),
				 memory_order_release);
	/* full fence: the bits before the read of `sleeping`; moverd sets
	 * `sleeping`, fences and collects again (fb_prepare_sleep): one of
	 * the two sees the other */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&b->sleeping, memory_order_relaxed))
		return;
	/* release: a woken moverd that reads the word sees our bits */
	atomic_fetch_add_explicit(&b->futex, 1, memory_order_release);
	fmlt_mark(LT_BELL_WAKE, 0);
	fm_futex_wake(&b->futex);
}

void fb_format(struct fr_bell *b, uint64_t epoch)
{
	b->version = FB_VERSION;
	b->nbits = FB_BITS;
	b->daemon_pid = (uint32_t)getpid();
	b->epoch = epoch;
	/* the magic last, with release: a client that sees it sees the rest */
	atomic_store_explicit((_Atomic uint64_t *)&b->magic, FB_MAGIC,
			      memory_order_release);
}

unsigned fb_collect(struct fr_bell *b, uint32_t *ids, unsigned max)
{
	unsigned n = 0;

	for (uint32_t s = 0; s < FB_SUMMARY && n < max; s++) {
		uint64_t sum;

		if (!atomic_load_explicit(&b->summary[s], memory_order_relaxed))
			continue;
		/* acquire: pairs with the producers' release of the bits */
		sum = atomic_exchange_explicit(&b->summary[s], 0,
					       memory_order_acquire);
		while (sum) {
			uint32_t w = s * 64u + (uint32_t)__builtin_ctzll(sum);
			uint64_t bits;

			sum &= sum - 1;
			if (n == max) {
				/* no room: leave the word marked for next time */
				atomic_fetch_or_explicit(
					&b->summary[s], 1ull << (w % 64u),
					memory_order_relaxed);
				continue;
			}
			bits = atomic_exchange_explicit(&b->bits[w], 0,
							memory_order_acquire);
			while (bits && n < max) {
				ids[n++] = w * 64u +
					   (uint32_t)__builtin_ctzll(bits);
				bits &= bits - 1;
			}
			if (bits) {
				/* ids is full: put the rest back */
				atomic_fetch_or_explicit(&b->bits[w], bits,
							 memory_order_relaxed);
				atomic_fetch_or_explicit(
					&b->summary[s], 1ull << (w % 64u),
					memory_order_relaxed);
			}
		}
	}
	return n;
}

static int any_rung(struct fr_bell *b)
{
	for (uint32_t s = 0; s < FB_SUMMARY; s++)
		if (atomic_load_explicit(&b->summary[s], memory_order_relaxed))
			return 1;
	return 0;
}

int fb_prepare_sleep(struct fr_bell *b, uint32_t *v)
{
	/* acquire: read the word before the re-check, so a ring in between
	 * changes it and FUTEX_WAIT returns at once */
	*v = atomic_load_explicit(&b->futex, memory_order_acquire);
	atomic_store_explicit(&b->sleeping, 1, memory_order_relaxed);
	/* full fence: `sleeping` before the re-check (pairs with fb_ring) */
	atomic_thread_fence(memory_order_seq_cst);
	return any_rung(b);
}

void fb_woke(struct fr_bell *b)
{
	atomic_store_explicit(&b->sleeping, 0, memory_order_relaxed);
}
