/*
 * moverd/eos.c - writing a flow's end-of-stream record (see eos.h).
 */
#include "eos.h"
#include "log.h"

#include <errno.h>

/* Flows whose END waits for room (a hint: eos_retry recounts). */
static unsigned ends_pending;

/*
 * When the next retry is due, and the gap after it.  A consumer's progress
 * rings no bell, so a full ring is tried again on a timer: every 20 ms at
 * first, the gap doubling to RETRY_MAX_NS while the ring stays full (an
 * END on a ring whose consumer stopped, which any producer can leave,
 * kept an idle moverd waking 50 times a second and walking every flow).
 * A consumer that frees room gets the END within RETRY_MAX_NS.
 */
#define RETRY_MIN_NS 20000000ull
#define RETRY_MAX_NS 320000000ull
static uint64_t retry_at_ns, retry_gap_ns;

static void write_end(struct flow *f)
{
	int rc;

	if (f->end_written || f->dead || !f->view)
		return;
	rc = fr_write_end(&f->view->ring);
	if (rc == -EAGAIN) {
		if (!ends_pending) {
			retry_gap_ns = RETRY_MIN_NS;
			retry_at_ns = fr_now_ns() + retry_gap_ns;
		}
		if (!f->end_pending)
			ends_pending++;
		f->end_pending = true;
		return;
	}
	f->end_pending = false;
	if (rc == -EPIPE) { /* closed (drained, destroyed): nothing to end */
		log_debug("flow %s: no end of stream: %s", f->name,
			  flowshm_strerror(rc));
		return;
	}
	if (rc) {
		/* a client broke the ring's tail: its consumers get the same
		 * error from their next read; the operator should know why
		 * no END came */
		static struct log_limit lim; /* `flow end` at will */

		log_limited(&lim, LOG_LVL_WARN, "flow %s: cannot write its end "
			    "of stream: %s", f->name, flowshm_strerror(rc));
		return;
	}
	f->end_written = true;
	/* clients read why their reads end (flowshm_state) */
	fr_status_set(&f->view->ring, FR_STATE_ENDED, 0);
	log_info("flow %s: end of stream written", f->name);
}

void eos_update(struct flow *f)
{
	/* the receiving host's ring gets the END from the peer, as data */
	if (f->role == FLOW_RECEIVER || !f->producers_ended_ever)
		return;
	if (f->producers_ended < f->producers)
		return;
	write_end(f);
}

void eos_force(struct flow *f)
{
	if (f->role != FLOW_RECEIVER)
		write_end(f);
}

void eos_retry(struct flow_table *t, uint64_t now)
{
	unsigned still = 0;

	if (!ends_pending || now < retry_at_ns)
		return;
	for (struct flow *f = t->head; f; f = f->next) {
		if (!f->end_pending)
			continue;
		write_end(f);
		still += f->end_pending;
	}
	ends_pending = still;
	if (retry_gap_ns < RETRY_MAX_NS)
		retry_gap_ns *= 2;
	retry_at_ns = now + retry_gap_ns;
}

uint64_t eos_due(void)
{
	return ends_pending ? retry_at_ns : UINT64_MAX;
}
