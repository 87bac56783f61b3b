/*
 * moverd/idle.c - the duty cycle's idle strategy (idle.h).
 *
 * The adaptive mode learns, per daemon, the gaps between bursts of work:
 * the time from the last cycle that found work to the next one that does,
 * taken only when cycles in between found none.  Its EWMA (1/8 weight, so
 * one outlier moves it by an eighth) decides how long an idle daemon keeps
 * polling: twice the average gap, so that a record arriving on the usual
 * beat finds the mover awake; nothing when the average gap is longer than
 * IDLE_GAP_MAX_NS, where a wake-up (5-20 us here) is small against the gap.
 *
 * Polling pays only on a cpu nobody else wants.  On a busy host a polling
 * daemon is descheduled for whole time slices (a yielding one even more:
 * the scheduler pushes a yielder's deadline back a slice) and a record that
 * comes meanwhile waits for them, where a sleeping daemon would have been
 * woken and run at once: measured on the 2-vCPU host with other load,
 * polling turned a p50 of 140 us into 0.7-1.3 s at 20 k records/s.  So each
 * polling span measures the cpu time it got (CLOCK_THREAD_CPUTIME_ID at its
 * start and end): less than IDLE_FAIR_SHARE of the wall time means the cpu
 * is contended, and adaptive then sleeps at once for IDLE_BACKOFF_NS before
 * it tries polling again, twice as long after each judgement that failed
 * again (up to IDLE_BACKOFF_MAX_NS).
 *
 * The share is judged over IDLE_JUDGE_NS of polling spans summed, not span
 * by span.  A span of a chain that is doing well also loses the cpu now and
 * then, for the few us a producer or consumer of the records runs on it; at
 * one span, one such moment meant 100 ms without polling, and in a ping-pong
 * through two daemons on 2 vCPUs adaptive spent most of its time backed off
 * (one-way p50 1.31-1.50x sockperf's blocking TCP in 5 runs; judged over
 * 20 ms of spans, 0.74-0.76x in 3).  Contention by others (two cpu hogs)
 * shows just as well in the sum.  Figures: moverd/README.md, "The io_uring
 * setup and the polling cycle".
 */
#include "idle.h"

#include <string.h>
#include <time.h>

static const char *const names[] = {
	[IDLE_ADAPTIVE] = "adaptive", [IDLE_SLEEP] = "sleep",
	[IDLE_YIELD] = "yield", [IDLE_SPIN] = "spin",
};

int idle_parse(const char *s, enum idle_mode *mode)
{
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!strcmp(s, names[i])) {
			*mode = (enum idle_mode)i;
			return 0;
		}
	}
	return -1;
}

const char *idle_name(enum idle_mode mode)
{
	return names[mode];
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void idle_init(struct idle *s, enum idle_mode mode, uint64_t poll_ns)
{
	*s = (struct idle){
		.mode = mode, .poll_ns = poll_ns,
		/* a new daemon has seen no beat: it sleeps until it has */
		.gap_ns = 4 * IDLE_GAP_MAX_NS,
	};
}

/* A polling span ends (work came, or the window closed): did it get the
 * cpu?  Only adaptive backs off; the explicit modes poll as told. */
static void span_end(struct idle *s, uint64_t now)
{
	uint64_t wall, cpu;

	if (!s->span_wall_ns)
		return;
	wall = now - s->span_wall_ns;
	cpu = thread_cpu_ns() - s->span_cpu_ns;
	s->span_wall_ns = 0;
	if (s->mode != IDLE_ADAPTIVE || s->poll_ns || wall < IDLE_SPAN_MIN_NS)
		return;
	/* judged over IDLE_JUDGE_NS of spans, not each span: see above */
	s->judge_wall_ns += wall;
	s->judge_cpu_ns += cpu;
	if (s->judge_wall_ns < IDLE_JUDGE_NS)
		return;
	wall = s->judge_wall_ns;
	cpu = s->judge_cpu_ns;
	s->judge_wall_ns = s->judge_cpu_ns = 0;
	if (cpu * IDLE_FAIR_SHARE_DEN >= wall * IDLE_FAIR_SHARE_NUM) {
		s->backoff_ns = 0; /* it got the cpu: polling may go on */
		return;
	}
	/* doubling, so a host that stays busy costs a failed span only
	 * every IDLE_BACKOFF_MAX_NS, not every IDLE_BACKOFF_NS */
	s->backoff_ns = s->backoff_ns ? s->backoff_ns * 2 : IDLE_BACKOFF_NS;
	if (s->backoff_ns > IDLE_BACKOFF_MAX_NS)
		s->backoff_ns = IDLE_BACKOFF_MAX_NS;
	s->backoff_until_ns = now + s->backoff_ns;
	s->backoffs++;
}

void idle_work(struct idle *s, uint64_t now)
{
	span_end(s, now);
	if (s->idle && s->last_work_ns) {
		uint64_t gap = now - s->last_work_ns;

		/* clamp: a gap of an hour must not take an hour of beats to
		 * forget; anything past 4x the limit means "sparse" alike */
		if (gap > 4 * IDLE_GAP_MAX_NS)
			gap = 4 * IDLE_GAP_MAX_NS;
		s->gap_ns = s->gap_ns - s->gap_ns / 8 + gap / 8;
	}
	s->idle = false;
	s->last_work_ns = now;
}

uint64_t idle_window_ns(const struct idle *s, uint64_t now)
{
	if (s->poll_ns)
		return s->poll_ns;
	switch (s->mode) {
	case IDLE_SLEEP:
		return 0;
	case IDLE_YIELD:
	case IDLE_SPIN:
		return UINT64_MAX;
	case IDLE_ADAPTIVE:
		break;
	}
	if (now < s->backoff_until_ns || s->gap_ns > IDLE_GAP_MAX_NS)
		return 0;
	return 2 * s->gap_ns;
}

enum idle_step idle_next(struct idle *s, uint64_t now)
{
	uint64_t since = now - s->last_work_ns;

	s->idle = true;
	if (since >= idle_window_ns(s, now)) {
		span_end(s, now);
		s->sleeps++;
		return IDLE_STEP_SLEEP;
	}
	if (!s->span_wall_ns) {
		s->span_wall_ns = now;
		s->span_cpu_ns = thread_cpu_ns();
	}
	if (s->mode == IDLE_SPIN) {
		s->spins++;
		return IDLE_STEP_SPIN;
	}
	s->yields++;
	return IDLE_STEP_YIELD;
}
