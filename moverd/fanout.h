/*
 * moverd/fanout.h - one sender flow, several peer hosts (issue 11).
 *
 * Each peer host is a subscriber of the producer ring with its own slot:
 * the first peer's flow (in the table) owns the ring; each further peer
 * is a sibling struct flow (flows.h, "Fan-out") with its own mapping,
 * slot, peer connection, id, acknowledgements and resume.  One copy goes
 * to each peer host.  The slowest subscriber holds producers back unless
 * the ring has a max_lag: then a producer cuts a subscriber too far
 * behind, and moverd ends that peer's subscription (fanout_police).
 */
#ifndef MOVERD_FANOUT_H
#define MOVERD_FANOUT_H

#include "flows.h"
#include "peer.h"

#include <stdbool.h>
#include <stddef.h>

/* Peer hosts of one flow, the first included.  Subscriber slots are
 * shared with local consumers (FR_MAX_SUBS); the list must also fit one
 * line of the state file. */
#define FANOUT_MAX_PEERS 8u

/*
 * Add peer host addr ("HOST:PORT") to sender flow f: a sibling joins at
 * the slowest subscriber's position (everything the ring still holds),
 * connects and opens the flow there.  save: write f's state file.  0, or
 * a negative errno with a sentence in err (-EINVAL, -EEXIST, -ENOSPC,
 * -EBUSY: no subscriber slot left).
 */
int fanout_add(struct peer_mgr *m, struct flow *f, const char *addr,
	       bool save, char *err, size_t cap);

/* Take peer host addr off f (not its first peer): the peer is told
 * (PeerFlowClose) and its slot given back once no send reads through it. */
int fanout_remove(struct peer_mgr *m, struct flow *f, const char *addr,
		  char *err, size_t cap);

/* f is being destroyed (peer_destroy_flow): every sibling goes too. */
void fanout_destroy(struct peer_mgr *m, struct flow *f);

/* moverd stops with f kept for the next start: every subscription goes
 * from f's list and its connection, no peer told; a slot still held stays
 * held (as at a crash: producers wait for what a peer has not
 * acknowledged), and the next start subscribes every peer of the state
 * file again (fanout_restore).  One left on its connection (a peer still
 * closing at the stop) held the flow: both leaked. */
void fanout_let_go(struct peer_mgr *m, struct flow *f);

/* f was re-adopted after a restart: add the peers its state file kept. */
void fanout_restore(struct peer_mgr *m, struct flow *f);

/* Is f one subscription among several (first or sibling)? */
static inline bool fanout_member(const struct flow *f)
{
	return f->fanout || f->sibling_of;
}

/* For a peer p that cannot tell twins itself (an older moverd: no
 * twin_tags in its hello): another subscription of f's flow on a
 * connection to the run of moverd p's hello names (the instance; p itself
 * after merge_duplicate).  That daemon has one receiver flow of the name,
 * which can follow only one sender flow, so p's would take it from the
 * other's.  NULL if none, if f is not a fan-out member, or if p sent no
 * instance.  Only f's subscription (the one on p) ends for it: a peer that
 * says another's instance denies the flow to itself alone. */
const struct flow *fanout_twin(const struct flow *f, const struct peer *p);

/* f's subscription ends, as twin's twin (fanout_lost with the reason): its
 * peer has the flow through twin's subscription already (two names of one
 * host: the peer said so, peer_open.c twin_refused);
 * it rejoins once twin is gone (removed, or its own subscription over),
 * at the current position, as after a cut. */
void fanout_lost_twin(struct flow *f, const struct flow *twin);

/* One peer subscription is over (why): its slot goes back (once f's sends
 * in flight complete), its peer is told the flow failed there (cut: by max_lag, its consumers get -ESTALE),
 * the others go on. */
void fanout_lost(struct flow *f, const char *why, bool cut);

/* f's last send in flight completed: a slot fanout_lost owed goes back. */
void fanout_sends_done(struct flow *f);

/* The mover's look before it reads f's ring: cut f's HELD slot if it is
 * more than max_lag behind a full ring and none of f's sends is in flight;
 * if f's slot is cut, end the subscription now (as fanout_police would) and
 * say so: the bytes at f's send position may be written over already,
 * which is the cut, not a corrupt ring. */
bool fanout_cut_seen(struct flow *f);

/* f's `rejoining` changed: write its flow's state file (its cut= line);
 * a save that fails is owed (flows_save_owed: a restart of ours before it
 * is written would read the old cut=). */
void fanout_save_cuts(struct flow *f);

/* On the once-a-second check of a flow, after the ring's own checks: end
 * the subscriptions of f (and its siblings) that max_lag cut off, and take
 * again, at the current position, those whose backoff after a cut is over
 * (1 s, doubling with each cut within 5 min of the last, up to 64 s). */
void fanout_police(struct peer_mgr *m, struct flow *f);

#endif
