/*
 * tests/test_idle.c - the duty cycle's idle strategy (moverd/idle.c) on a
 * clock the test drives: what it answers after a cycle that found no work
 * (spin, yield, sleep), for beats of work, sparse work, and polls that
 * stall because others hold the cpu.  idle.c takes the time as an
 * argument and reads no clock, so every answer here is exact.
 *
 *   1  adaptive learns a 20 us beat: it sleeps while it has seen none,
 *      then polls through every gap, and never backs off
 *   2  ... also when a client runs on its cpu for 30 us of every gap
 *      (off the cpu for less than a stall): the chain's own processes are
 *      not contention
 *   3  looks stalled (a hog holds the cpu between two of them): adaptive
 *      backs off, sleeps at once for IDLE_BACKOFF_NS, twice as long when
 *      the next judgement fails again, and polls again after a judgement
 *      whose polls kept the cpu
 *   4  the edge of a stall: looks IDLE_STALL_NS apart are not one, a ns
 *      more are
 *   5  sparse work (5 ms gaps): adaptive sleeps at once
 *   6  the explicit modes: spin and yield never sleep, sleep always does,
 *      --poll-us bounds the window; none of them backs off
 */
#include "idle.h"
#include "testutil.h"

#define US 1000ull
#define MS 1000000ull

/* What the idle strategy answered over some gaps. */
struct tally {
	unsigned polls, sleeps;
};

/*
 * One gap of `gap` ns between two cycles that found work, the first at
 * *t.  While the strategy says poll, the daemon looks again `every` ns
 * later, except that its second look of the gap comes `late` ns after the
 * first (a client ran, or a hog held the cpu; 0: no such look).  When it
 * says sleep, the daemon sleeps until the work comes.  Ends with the work
 * found at *t + gap.
 */
static void gap_once(struct idle *s, uint64_t *t, uint64_t gap,
		     uint64_t every, uint64_t late, struct tally *n)
{
	uint64_t work = *t + gap, step = every;

	for (unsigned look = 1; *t + step < work; look++) {
		*t += step;
		step = look == 1 && late ? late : every;
		if (idle_next(s, *t) == IDLE_STEP_SLEEP) {
			n->sleeps++;
			break;
		}
		n->polls++;
	}
	*t = work;
	idle_work(s, *t);
}

static struct tally gaps(struct idle *s, uint64_t *t, unsigned count,
			 uint64_t gap, uint64_t every, uint64_t late)
{
	struct tally n = { 0, 0 };

	for (unsigned i = 0; i < count; i++)
		gap_once(s, t, gap, every, late, &n);
	return n;
}

static void start(struct idle *s, uint64_t *t, enum idle_mode mode,
		  uint64_t poll_ns)
{
	idle_init(s, mode, poll_ns);
	*t = 1 * MS;
	idle_work(s, *t);
}

static void test_beat(void)
{
	struct idle s;
	uint64_t t;
	struct tally n;

	start(&s, &t, IDLE_ADAPTIVE, 0);
	/* a new daemon has seen no beat: it sleeps */
	CHECK(idle_window_ns(&s, t) == 0);
	n = gaps(&s, &t, 1, 20 * US, 1 * US, 0);
	CHECK(n.sleeps == 1 && n.polls == 0);
	/* the average gap comes down from "sparse" within a few dozen */
	gaps(&s, &t, 64, 20 * US, 1 * US, 0);
	CHECK(idle_window_ns(&s, t) >= 20 * US);
	/* 200 ms of the beat: polled through, never a sleep, no back-off
	 * (ten judgements of 20 ms) */
	n = gaps(&s, &t, 10000, 20 * US, 1 * US, 0);
	CHECK(n.sleeps == 0);
	CHECK(n.polls >= 10000 * 18);
	CHECK(s.backoffs == 0);
}

static void test_chain_beside(void)
{
	struct idle s;
	uint64_t t;
	struct tally n;

	start(&s, &t, IDLE_ADAPTIVE, 0);
	gaps(&s, &t, 64, 40 * US, 1 * US, 0);
	/* a consumer runs 30 us on our cpu in every gap */
	n = gaps(&s, &t, 10000, 40 * US, 1 * US, 30 * US);
	CHECK(n.sleeps == 0);
	CHECK(s.backoffs == 0);
}

/* Gaps of `gap` ns with every look `late` ns after the last, until the
 * strategy has backed off `backoffs` times in all (or 10 s passed). */
static void stall_until(struct idle *s, uint64_t *t, uint64_t gap,
			uint64_t late, uint64_t backoffs)
{
	for (uint64_t end = *t + 10000 * MS;
	     s->backoffs < backoffs && *t < end;)
		gaps(s, t, 1, gap, late, late);
}

static void test_stalled(void)
{
	struct idle s;
	uint64_t t, off;
	struct tally n;

	/* a hog from the start: 60 us between two looks, over and over;
	 * the gaps are learnt all the same */
	start(&s, &t, IDLE_ADAPTIVE, 0);
	off = t;
	stall_until(&s, &t, 150 * US, 60 * US, 1);
	CHECK(s.backoffs == 1);
	CHECK(s.gap_ns < 2 * 150 * US);
	/* judged once 20 ms of polling were summed, not at the first stall:
	 * here 90 of every 150 us (first look to work) are polling, and
	 * the first gaps slept */
	CHECK(t - off >= IDLE_JUDGE_NS * 150 / 90);
	CHECK(t - off < 2 * IDLE_JUDGE_NS);
	/* backed off: every answer is sleep, for IDLE_BACKOFF_NS */
	CHECK(idle_window_ns(&s, t) == 0);
	n = gaps(&s, &t, (unsigned)((IDLE_BACKOFF_NS - MS) / (100 * US)),
		 100 * US, 1 * US, 0);
	CHECK(n.polls == 0 && n.sleeps > 0);
	/* then it polls again; still stalled, it backs off for twice as
	 * long */
	gaps(&s, &t, 20, 100 * US, 1 * US, 0);
	CHECK(idle_window_ns(&s, t) > 0);
	stall_until(&s, &t, 150 * US, 60 * US, 2);
	CHECK(s.backoffs == 2);
	CHECK(s.backoff_ns == 2 * IDLE_BACKOFF_NS);
	n = gaps(&s, &t, (unsigned)((2 * IDLE_BACKOFF_NS - MS) / (100 * US)),
		 100 * US, 1 * US, 0);
	CHECK(n.polls == 0);
	/* the cpu is free again: polling resumes and stays */
	n = gaps(&s, &t, 2000, 100 * US, 1 * US, 0);
	CHECK(n.polls > 0);
	CHECK(s.backoffs == 2 && s.backoff_ns == 0);
	n = gaps(&s, &t, 2000, 100 * US, 1 * US, 0);
	CHECK(n.sleeps == 0);
}

static void test_stall_edge(void)
{
	struct idle s;
	uint64_t t;

	start(&s, &t, IDLE_ADAPTIVE, 0);
	gaps(&s, &t, 64, 180 * US, 1 * US, 0);
	CHECK(idle_window_ns(&s, t) > 180 * US);
	/* 200 ms of looks exactly IDLE_STALL_NS apart: none is a stall */
	gaps(&s, &t, 1111, 180 * US, IDLE_STALL_NS, IDLE_STALL_NS);
	CHECK(s.backoffs == 0);
	CHECK(idle_window_ns(&s, t) > 0);
	/* one ns more: the second and third look of each gap are stalls */
	stall_until(&s, &t, 180 * US, IDLE_STALL_NS + 1, 1);
	CHECK(s.backoffs == 1);
}

static void test_sparse(void)
{
	struct idle s;
	uint64_t t;
	struct tally n;

	start(&s, &t, IDLE_ADAPTIVE, 0);
	n = gaps(&s, &t, 1000, 5 * MS, 1 * US, 0);
	CHECK(n.polls == 0 && n.sleeps == 1000);
	CHECK(s.backoffs == 0);
}

static void test_explicit(void)
{
	struct idle s;
	uint64_t t;

	start(&s, &t, IDLE_SPIN, 0);
	CHECK(idle_next(&s, t + 10000 * MS) == IDLE_STEP_SPIN);
	start(&s, &t, IDLE_YIELD, 0);
	CHECK(idle_next(&s, t + 10000 * MS) == IDLE_STEP_YIELD);
	start(&s, &t, IDLE_SLEEP, 0);
	CHECK(idle_next(&s, t + 1) == IDLE_STEP_SLEEP);
	/* stalled polls do not make spin or yield back off */
	start(&s, &t, IDLE_YIELD, 0);
	gaps(&s, &t, 2000, 150 * US, 60 * US, 60 * US);
	CHECK(s.backoffs == 0);
	CHECK(idle_next(&s, t + 1) == IDLE_STEP_YIELD);
	/* --poll-us 50: adaptive polls 50 us after work, whatever the
	 * gaps or stalls */
	start(&s, &t, IDLE_ADAPTIVE, 50 * US);
	CHECK(idle_next(&s, t + 49 * US) == IDLE_STEP_YIELD);
	CHECK(idle_next(&s, t + 50 * US) == IDLE_STEP_SLEEP);
	gaps(&s, &t, 2000, 150 * US, 60 * US, 60 * US);
	CHECK(s.backoffs == 0);
}

int main(void)
{
	static const struct {
		const char *name;
		void (*fn)(void);
	} cases[] = {
		{ "beat", test_beat },       { "chain_beside", test_chain_beside },
		{ "stalled", test_stalled }, { "stall_edge", test_stall_edge },
		{ "sparse", test_sparse },   { "explicit", test_explicit },
	};

	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cases[i].fn();
		printf("test_idle %u %s: ok\n", i + 1, cases[i].name);
	}
	return 0;
}
