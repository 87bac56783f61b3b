/*
 * ipc/futex.h - the futex calls behind the ring's wake-up protocol.
 * Shared (not PRIVATE) futexes: the word lives in memory mapped by several
 * processes.  Deadlines are absolute CLOCK_MONOTONIC nanoseconds.
 */
#ifndef FLOWMOVER_IPC_FUTEX_H
#define FLOWMOVER_IPC_FUTEX_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleep while *word == expected, until deadline (UINT64_MAX: forever).
 * 0 when woken (or the word differed), -ETIMEDOUT at the deadline. */
static inline int fm_futex_wait(_Atomic uint32_t *word, uint32_t expected,
				uint64_t deadline_ns)
{
	struct timespec ts, *tsp = NULL;
	long rc;

	if (deadline_ns != UINT64_MAX) {
		ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
		ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
		tsp = &ts;
	}
	/* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline */
	rc = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, expected, tsp, NULL,
		     FUTEX_BITSET_MATCH_ANY);
	if (rc == -1 && errno == ETIMEDOUT)
		return -ETIMEDOUT;
	return 0; /* woken, EAGAIN (word changed) or EINTR: caller re-checks */
}

static inline void fm_futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#endif
