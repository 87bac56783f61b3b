/*
 * ipc/barrier.h - asymmetric fences for the wake-up protocol (issue 12).
 *
 * Every wake-up in the ring is a Dekker pair: the busy side stores (a seal,
 * a position), fences and reads a sleeper count; the side going to sleep
 * stores its count, fences and re-checks the ring.  One of the two sees
 * the other.  A full fence on the busy side costs a store-buffer drain per
 * record: with it a producer committed 13 M records/s of 32 B, without it
 * 46 M (flowbench local, same run).  So the fence moves to the sleeper:
 *
 *   light side (per record)   fm_fence_light(): only a compiler barrier in
 *                             a process registered for membarrier(2)
 *                             GLOBAL_EXPEDITED, a full fence otherwise;
 *   heavy side (per sleep)    fm_fence_heavy(): membarrier(GLOBAL_EXPEDITED),
 *                             which runs a full barrier on every cpu running
 *                             a thread of a registered process: wherever
 *                             the busy side was between its store and its
 *                             read, it behaves as if it had fenced there.
 *
 * A membarrier costs ~0.2 us alone and ~17 us when another cpu runs a
 * registered process (an IPI, measured on the 2-vCPU KVM host), so a
 * sleeper first sleeps at most FM_BRIEF_SLEEP_NS after its own full fence
 * alone, and takes the heavy fence only when that brief sleep ran out: a
 * wake-up lost in the brief window (the busy side's store still in its
 * store buffer while it read the count) costs at most that long, and a
 * ping-pong or a paced flow, whose next record comes sooner, never pays the
 * membarrier.  2 ms, not less: with 200 us the ping-pong's clients (RTT
 * 100-240 us) took the heavy fence often enough that its one-way p50 went
 * from 1.5x sockperf's to 2.2x (and 2.3-2.6x with no brief sleep at all);
 * with 2 ms, 1.48x and 1.56x, as without the heavy fence (same runs).
 * Where membarrier is missing, every process fences fully on the light
 * side (its registration failed) and sleepers cap every sleep at
 * FM_BRIEF_SLEEP_NS (fm_fence_heavy returns false).
 */
#ifndef FLOWMOVER_IPC_BARRIER_H
#define FLOWMOVER_IPC_BARRIER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define FM_BRIEF_SLEEP_NS 2000000ull

extern _Atomic bool fm_light_ok;

/* Register this process (once; every fr_attach calls it).  After it, the
 * light fence is a compiler barrier if the kernel took the registration. */
void fm_barrier_register(void);

static inline void fm_fence_light(void)
{
	/* relaxed: set once, before this process's first light fence that
	 * matters (fr_attach registers before the ring is used) */
	if (atomic_load_explicit(&fm_light_ok, memory_order_relaxed))
		atomic_signal_fence(memory_order_seq_cst);
	else
		atomic_thread_fence(memory_order_seq_cst);
}

/* The sleeper's side: a full fence here and on every cpu running a
 * registered process.  false: membarrier is missing, only our own fence
 * was taken; the caller must not sleep past FM_BRIEF_SLEEP_NS. */
bool fm_fence_heavy(void);

/*
 * A sleeper's two phases, once it counted itself, fenced fully and found
 * nothing: wait(ctx, t) until at most FM_BRIEF_SLEEP_NS from now; if that
 * ran out before `until` (absolute CLOCK_MONOTONIC ns), the heavy fence,
 * ready(ctx) once more, and wait(ctx, until).  0: look again (woken,
 * ready, or no membarrier: the caller comes back for another brief wait);
 * otherwise what wait returned (-ETIMEDOUT at `until`).
 */
int fm_sleep_two_phase(int (*wait)(void *ctx, uint64_t until),
		       bool (*ready)(void *ctx), void *ctx, uint64_t until);

#endif
