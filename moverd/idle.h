/*
 * moverd/idle.h - the duty cycle's idle strategy: what the loop does after
 * a cycle that found no work (idle.c).
 *
 * Three answers, cheapest latency first: spin (run the next cycle at once),
 * yield (sched_yield, then the next cycle: a producer, consumer or the other
 * daemon on the same cpu runs first) or sleep (arm the doorbell and block in
 * io_uring until an event).  Which one depends on the mode:
 *
 *   sleep     sleep at once (the behaviour before issue 12)
 *   adaptive  keep polling across the gaps the daemon has been seeing
 *             between bursts of work (an EWMA of them): work every 20 us
 *             keeps it awake through each gap, an idle daemon sleeps at
 *             once and costs nothing.  Polling yields; a daemon whose
 *             polls stall (others hold the cpu for long between two
 *             of them) sleeps at once for a while (idle.c).  The
 *             default.
 *   yield     poll with sched_yield until --poll-us after the last work
 *             (without --poll-us: never sleep)
 *   spin      the same without yielding: for a host with a core to spare
 *
 * --poll-us N fixes the window of adaptive (and bounds spin and yield).
 */
#ifndef MOVERD_IDLE_H
#define MOVERD_IDLE_H

#include <stdbool.h>
#include <stdint.h>

enum idle_mode { IDLE_ADAPTIVE, IDLE_SLEEP, IDLE_YIELD, IDLE_SPIN };

enum idle_step { IDLE_STEP_SPIN, IDLE_STEP_YIELD, IDLE_STEP_SLEEP };

/* Adaptive: gaps longer than this are not bridged by polling (a sparse
 * flow sleeps at once); the window is twice the average gap, within it. */
#define IDLE_GAP_MAX_NS   200000ull
/* Adaptive: polling spans whose polls were more than IDLE_STALL_NS apart
 * (the daemon was off the cpu between two looks) for at least
 * 1/IDLE_STALL_SHARE_DEN of their wall time, over IDLE_JUDGE_NS of spans,
 * mean the cpu is contended: sleep at once for IDLE_BACKOFF_NS (idle.c). */
#define IDLE_STALL_NS        50000ull
#define IDLE_STALL_SHARE_DEN 2u
#define IDLE_JUDGE_NS     20000000ull
#define IDLE_BACKOFF_NS      100000000ull
#define IDLE_BACKOFF_MAX_NS  5000000000ull

struct idle {
	enum idle_mode mode;
	uint64_t poll_ns;       /* --poll-us: fixed window, 0 = none given */
	uint64_t last_work_ns;  /* end of the last cycle that found work */
	bool idle;              /* cycles since last_work_ns found none */
	uint64_t gap_ns;        /* adaptive: EWMA of gaps before work */
	uint64_t span_wall_ns;  /* the polling span in progress began (0:
				 * none) */
	uint64_t last_poll_ns;  /* ... and its latest poll */
	uint64_t backoff_until_ns; /* adaptive: cpu contended, sleep till */
	uint64_t backoff_ns;    /* ... the last back-off, doubling */
	uint64_t judge_wall_ns; /* spans summed since the last judgement */
	uint64_t judge_stall_ns; /* ... and their stalls (IDLE_STALL_NS) */

	/* counters for `moverctl status` and benchmarks */
	uint64_t spins, yields, sleeps, backoffs;
};

/* "adaptive", "sleep", "yield" or "spin": 0, or -1 for another word. */
int idle_parse(const char *s, enum idle_mode *mode);
const char *idle_name(enum idle_mode mode);

void idle_init(struct idle *s, enum idle_mode mode, uint64_t poll_ns);

/* A cycle found work at now: learn the gap that ended. */
void idle_work(struct idle *s, uint64_t now);

/* A cycle found none at now: spin, yield, or sleep. */
enum idle_step idle_next(struct idle *s, uint64_t now);

/* How long after the last work the daemon keeps polling now (0: it
 * sleeps at once; UINT64_MAX: it never sleeps). */
uint64_t idle_window_ns(const struct idle *s, uint64_t now);

#endif
