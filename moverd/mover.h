/*
 * moverd/mover.h - the mover (mover.c): the duty cycle that chooses and
 * batches records into each peer's next send, and the doorbell that lets
 * an idle mover sleep until a producer commits.  The state lives in
 * struct peer_mgr (peer.h); what peers say to each other is peer.h.
 */
#ifndef MOVERD_MOVER_H
#define MOVERD_MOVER_H

#include <stdint.h>
#include <sys/types.h>

struct peer_mgr;

/*
 * The mover's duty cycle: move committed records of sender flows, return
 * acknowledgements and credits of receiver flows.  Returns the amount of
 * work done (0 = idle), so the loop can decide between polling and sleep.
 */
int peer_do_work(struct peer_mgr *m);

/*
 * The mover found no work: send the consumer credit it deferred, set
 * the doorbell page's `sleeping` flag, look for rung bits once more behind
 * a fence, and arm the wait on the page's futex word.  Returns the loop
 * timeout in ms: 0 if it sent credit, or a bit or a ready record
 * was there meanwhile, 1000 with the doorbell armed, 1 where it cannot be
 * (BELL_POLL: no page, or no futex wait on this kernel).
 */
int peer_prepare_sleep(struct peer_mgr *m);
/* "io_uring", "thread" or "poll" */
const char *peer_doorbell_name(const struct peer_mgr *m);
/* Awake again: clear `sleeping` so producers stop making wake calls. */
void peer_woke(struct peer_mgr *m);

/*
 * The doorbell pages (ipc/bell.h), one per uid of producers (peer.h,
 * struct bell_page): root's made at start, another uid's at its first
 * producer's attach, freed when its last one leaves.  Producers ring their
 * flow's bit in their uid's page, and an idle mover sleeps on the futex
 * words of all pages at once.  mover_bell_index gives a sender flow its
 * bit (plus one; 0: none), the same in every page, for the attach answer
 * with mover_bell_take; mover_forget_flow gives it back
 * (peer_destroy_flow).  mover_sweep (the timer, a slice at a time) re-arms
 * idle flows and visits those with records, whatever a client did to the
 * bits.
 */
struct flow;
int mover_bell_start(struct peer_mgr *m);
/*
 * The page for one more producer of uid: a new fd of it (the caller
 * closes it once the answer that carries it is sent: the page may be gone
 * by then) and, in *page, what to give mover_bell_put when that producer
 * leaves.  A negative errno: no doorbell for it (its records are found by
 * the sweep).
 */
int mover_bell_take(struct peer_mgr *m, uid_t uid, uint64_t *page);
void mover_bell_put(struct peer_mgr *m, uint64_t page);
unsigned mover_bell_index(struct peer_mgr *m, struct flow *f);
/* Doorbell pages in use (0: none, an idle mover polls). */
unsigned mover_bell_pages(const struct peer_mgr *m);
/* Producers on the page the uids past BELL_PAGES - 1 share. */
unsigned mover_bell_shared(const struct peer_mgr *m);
void mover_forget_flow(struct peer_mgr *m, struct flow *f);
/* f off its peer's list: it leaves the peer (peer.c, unlink_flow), or
 * the peer's connection closed (reset_flows); the sweep, or an OPEN, an
 * ACK or a deposit on the next connection, lists it again. */
void mover_unlist(struct peer_mgr *m, struct flow *f);
/* An ACK moved f's window (peer_rx.c, handle_ack): a flow that waited for
 * room there has work again. */
void mover_window_moved(struct peer_mgr *m, struct flow *f);
/* f has work: a sender flow opened (again), a receiver flow owes an
 * acknowledgement: visit it in the next cycle. */
void mover_wake_flow(struct peer_mgr *m, struct flow *f);
/* Flows of the table (and their fan-out siblings): re-arm the idle ones,
 * visit those whose producers wrote (peer.c's flow checks, a slice). */
void mover_sweep(struct peer_mgr *m, struct flow *const *fs, unsigned n);

#endif
