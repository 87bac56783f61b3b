/*
 * moverd/backoff.h - the one doubling backoff moverd's retries use: a
 * sender asking a receiver short of room again, a flow waiting alone for
 * its ring's registration, a fan-out subscription rejoining after a cut,
 * the idle strategy after a failed spin.  Header only; no dependencies.
 */
#ifndef MOVERD_BACKOFF_H
#define MOVERD_BACKOFF_H

#include <stdint.h>

/* The wait after `last` (0: none yet): first, then twice the last, never
 * above max. */
static inline uint64_t backoff_next(uint64_t last, uint64_t first,
				    uint64_t max)
{
	uint64_t next = last ? 2 * last : first;

	return next > max ? max : next;
}

#endif
