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
 * polling turned a p50 of 140 us into 0.7-1.3 s at 20 k records/s.  So a
 * polling span watches the time between its polls: two looks more than
 * IDLE_STALL_NS apart (longer than a wake-up costs) are a stall, time the
 * daemon spent off the cpu while it meant to watch.  Stalls that add up to
 * 1/IDLE_STALL_SHARE_DEN of the spans' wall time, over IDLE_JUDGE_NS of
 * spans summed, mean the cpu is contended, and adaptive then sleeps at
 * once for IDLE_BACKOFF_NS before it tries polling again, twice as long
 * after each judgement that failed again (up to IDLE_BACKOFF_MAX_NS).
 *
 * Why stalls and not the cpu share a span got: the share also counts the
 * few us each time the chain's own producer or consumer runs on the cpu,
 * which a yield hands over at once and which a record never waits for.
 * In a ping-pong through two daemons on 2 vCPUs (four processes) that
 * kept polling spans at 62-68% of their wall time on the cpu, below the 3/4
 * the share rule asked, and one or both daemons sat backed off: one-way
 * p50 58-76 us in 10 of 36 runs, where `--idle yield` took 14-20 us.  The
 * same ping-pong polling without back-off stalled in 0.4% of its wall
 * time (gaps over 100 us); with two cpu hogs beside it, in most of it:
 * 99-100% of each judgement, where the worst of the quiet ping-pong's was
 * 47%, hence the line at half.
 * Summing over 20 ms, not judging span by span: one stall in a short span
 * would mean 100 ms without polling.  Figures: moverd/README.md, "The
 * adaptive judgement".
 */
#include "idle.h"
#include "backoff.h"

#include <string.h>

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

void idle_init(struct idle *s, enum idle_mode mode, uint64_t poll_ns)
{
	*s = (struct idle){
		.mode = mode, .poll_ns = poll_ns,
		/* a new daemon has seen no beat: it sleeps until it has */
		.gap_ns = 4 * IDLE_GAP_MAX_NS,
	};
}

/* Only adaptive without --poll-us judges its polling; the explicit modes
 * poll as told. */
static bool judged(const struct idle *s)
{
	return s->mode == IDLE_ADAPTIVE && !s->poll_ns;
}

/* The time between two looks of a polling span: over IDLE_STALL_NS it
 * was a stall, counted for the judgement. */
static void poll_gap(struct idle *s, uint64_t now)
{
	uint64_t gap = now - s->last_poll_ns;

	if (gap > IDLE_STALL_NS)
		s->judge_stall_ns += gap;
	s->last_poll_ns = now;
}

/* A look of a polling span: the first opens the span. */
static void span_poll(struct idle *s, uint64_t now)
{
	if (!s->span_wall_ns) {
		s->span_wall_ns = now;
		s->last_poll_ns = now;
		return;
	}
	poll_gap(s, now);
}

/* A polling span ends (work came, or the window closed): were its polls
 * stalled? */
static void span_end(struct idle *s, uint64_t now)
{
	uint64_t wall, stall;

	if (!s->span_wall_ns)
		return;
	wall = now - s->span_wall_ns;
	s->span_wall_ns = 0;
	/* the last look to now: work that came during a stall waited for it */
	poll_gap(s, now);
	/* judged over IDLE_JUDGE_NS of spans, not each span: see above */
	s->judge_wall_ns += wall;
	if (s->judge_wall_ns < IDLE_JUDGE_NS)
		return;
	wall = s->judge_wall_ns;
	stall = s->judge_stall_ns;
	s->judge_wall_ns = s->judge_stall_ns = 0;
	if (stall * IDLE_STALL_SHARE_DEN < wall) {
		s->backoff_ns = 0; /* its polls kept the cpu: polling goes on */
		return;
	}
	/* doubling, so a host that stays busy costs a failed span only
	 * every IDLE_BACKOFF_MAX_NS, not every IDLE_BACKOFF_NS */
	s->backoff_ns = backoff_next(s->backoff_ns, IDLE_BACKOFF_NS,
				     IDLE_BACKOFF_MAX_NS);
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
	if (judged(s))
		span_poll(s, now);
	if (s->mode == IDLE_SPIN) {
		s->spins++;
		return IDLE_STEP_SPIN;
	}
	s->yields++;
	return IDLE_STEP_YIELD;
}
