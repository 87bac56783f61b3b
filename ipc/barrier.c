/*
 * ipc/barrier.c - membarrier(2) behind the asymmetric fences (barrier.h).
 */
#include "barrier.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

_Atomic bool fm_light_ok;
static _Atomic int registered; /* 0 not yet, 1 tried */

static long membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

void fm_barrier_register(void)
{
	/* relaxed: a second caller registering again is harmless */
	if (atomic_exchange_explicit(&registered, 1, memory_order_relaxed))
		return;
	if (membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0)
		atomic_store_explicit(&fm_light_ok, true, memory_order_relaxed);
}

bool fm_fence_heavy(void)
{
	/* our own accesses around the call are ordered by the system call
	 * (membarrier fences before and after); the fence covers the
	 * fallback, and costs nothing beside an IPI */
	atomic_thread_fence(memory_order_seq_cst);
	if (membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0)
		return true;
	return false;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int fm_sleep_two_phase(int (*wait)(void *ctx, uint64_t until),
		       bool (*ready)(void *ctx), void *ctx, uint64_t until)
{
	uint64_t brief = now_ns() + FM_BRIEF_SLEEP_NS;
	int rc;

	if (brief >= until)
		return wait(ctx, until);
	rc = wait(ctx, brief);
	if (rc != -ETIMEDOUT)
		return rc;
	if (!fm_fence_heavy() || ready(ctx))
		return 0;
	return wait(ctx, until);
}
