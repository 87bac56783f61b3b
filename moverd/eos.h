/*
 * moverd/eos.h - end of stream (issue 11): moverd writes a flow's END
 * record (ipc/ring.h, fr_write_end) once every producer attached through
 * it has ended its stream, or when the flow's owner ends it.
 *
 * Counting: struct flow's `producers` are the producers attached now,
 * `producers_ended` those of them that said flowshm_end.  A producer whose
 * control connection closes leaves both counts (it is gone, not ended).
 * The END is due when at least one producer ever ended and no attached
 * producer has not.  A full ring delays it: the timer retries, less often
 * the longer the ring stays full (eos.c).
 */
#ifndef MOVERD_EOS_H
#define MOVERD_EOS_H

#include "flows.h"

/* The producer counts of f changed: write the END if it is due now. */
void eos_update(struct flow *f);

/* The owner ends f's stream now, whoever is attached. */
void eos_force(struct flow *f);

/* On the timer: write the END records a full ring delayed, once due. */
void eos_retry(struct flow_table *t, uint64_t now);
/* When eos_retry is next due (UINT64_MAX: no END waits). */
uint64_t eos_due(void);

#endif
