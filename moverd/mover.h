/*
 * moverd/mover.h - the mover (mover.c): the duty cycle that chooses and
 * batches records into each peer's next send, and the doorbell that lets
 * an idle mover sleep until a producer commits.  The state lives in
 * struct peer_mgr (peer.h); what peers say to each other is peer.h.
 */
#ifndef MOVERD_MOVER_H
#define MOVERD_MOVER_H

struct peer_mgr;

/*
 * The mover's duty cycle: move committed records of sender flows, return
 * acknowledgements and credits of receiver flows.  Returns the amount of
 * work done (0 = idle), so the loop can decide between polling and sleep.
 */
int peer_do_work(struct peer_mgr *m);

/*
 * The mover found no work for a while: set the "consumer sleeps" flag of
 * every open sender flow's producer ring and arm the doorbell.  Returns
 * the loop timeout in ms: 0 if data arrived meanwhile, 1000 with the
 * doorbell armed, 1 where it cannot be (BELL_POLL, too many flows).
 */
int peer_prepare_sleep(struct peer_mgr *m);
/* "io_uring", "thread" or "poll" */
const char *peer_doorbell_name(const struct peer_mgr *m);
/* Awake again: clear those flags so producers stop making wake calls. */
void peer_woke(struct peer_mgr *m);

#endif
