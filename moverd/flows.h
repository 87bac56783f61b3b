/*
 * moverd/flows.h - the daemon's flow table.  moverd creates and owns every
 * ring: a flow is a ring file in the state directory (re-adopted after a
 * crash or an orderly stop) plus who owns it, who may attach, and who is
 * attached now.
 */
#ifndef MOVERD_FLOWS_H
#define MOVERD_FLOWS_H

#include "flowshm_internal.h"
#include "loop.h"
#include "stats.h"

#include <limits.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define FLOW_NAME_MAX  64
#define FLOW_ALLOW_MAX 16

/* Ids a flow lets attach besides its owner: a flow's allowed ids, or the
 * ids a receiving end's declaration grants (declared.h).  Whole arrays,
 * so that a copy is one assignment and a compare one memcmp of a zeroed
 * struct. */
struct flow_ids {
	uint32_t uids[FLOW_ALLOW_MAX], gids[FLOW_ALLOW_MAX];
	unsigned n_uids, n_gids;
};
#define FLOW_ORIGIN_MAX 127  /* a peer's identity (struct peer, identity) */
#define FLOW_HOST_MAX 63     /* a peer's address (struct peer, host) */

enum flow_role {
	FLOW_LOCAL,    /* producers and consumer on this host: one ring */
	FLOW_SENDER,   /* producer end here, consumer end on a peer */
	FLOW_RECEIVER, /* consumer end here (a deposit ring), fed by a peer */
};

enum flow_state {
	FLOW_OPEN,
	FLOW_CONNECTING,   /* sender: waiting for the peer to open it */
	FLOW_RECONNECTING, /* link lost: producers back-pressured */
	FLOW_FAILED,
	FLOW_CLOSING,
};

struct ibv_mr;
struct peer;

struct flow_spec {
	const char *name;
	enum flow_role role;
	const char *peer;        /* sender: "HOST:PORT" */
	uint64_t seal_key;       /* receiver: the producer ring's */
	uint64_t start;          /* receiver: first position */
	uint64_t ring_size;      /* 0 = default */
	uint32_t max_record;     /* 0 = default */
	const char *origin;      /* receiver: the identity of the peer asking */
	const char *origin_host; /* receiver: its address, which the quotas
				  * charge (NULL: a local call, no quota) */
	uint64_t max_lag;        /* producer ring: cut laggards (0 = lossless) */
	/* sender: the peer hosts after the first (fan-out), for comparing a
	 * create with an existing flow (fanout_add adds them) */
	const char *const *more_peers;
	size_t n_more_peers;
	const uint32_t *allow_uids;
	size_t n_allow_uids;
	const uint32_t *allow_gids;
	size_t n_allow_gids;
	/* declared in moverd's config (declared.c): the operator's, so not
	 * held to a uid's ring rate (check_rate) */
	bool unmetered;
	/* a receiver made again after a cut (peer_open.c, recreate_cut): its
	 * allowed ids are the old incarnation's, granted and taken off by
	 * hand included; the config's are not granted again */
	bool grants_kept;
	/* out, if not NULL: refused for the ring rate (-EAGAIN), the wait
	 * after which the same create passes, in ms */
	uint32_t *retry_ms;
};

/*
 * Ownership: a flow (this struct, its ring mapping `view`, `ring_fd`, and
 * any RDMA registration of its ring) lives while anyone holds a reference.
 * The flow table holds one while the flow is listed; every asynchronous
 * operation that refers to the flow holds one from the moment it is
 * submitted until its completion is reaped:
 *   - a peer receive into its ring (peer_rx.c: start_data .. finish_data,
 *     or peer_closed when the connection ends),
 *   - a peer send that reads its ring (mover.c: build_data .. peer_sent),
 *   - a control response carrying ring_fd by SCM_RIGHTS (control.c:
 *     respond .. write_done: the kernel resolves the fd number only when
 *     the send runs, so the number must stay ours until then),
 *   - an RDMA memory registration of its ring (rdma.c: flow_mr .. drop_mr),
 *   - a destroy --drain waiting for the consumer (control.c: start_drain
 *     .. end_wait), so that a flow destroyed and created again meanwhile
 *     is seen `dead`, never taken for the new one,
 *   - the allocation of its ring's pages, waiting its turn or a chunk in
 *     flight (flows.c: fill_start .. fill_end),
 *   - the punch of the blocks a client allocated beyond its ring file's
 *     size (flows.c: trim_start .. trim_finish), which also keeps the
 *     ring's fd open for it (the last flow_put closes it).
 * A destroyed ring's punch needs no reference: the flow is gone by then,
 * and its remains (mapping, fd) are kept until the punch completes.
 * flows_destroy() unlists the flow and closes its ring for clients; the
 * last flow_put() unmaps, closes and frees.  A destroyed flow is `dead`:
 * a completion that finds its flow dead publishes nothing.  At an orderly
 * stop flows are not destroyed but let go (peer_let_go_flow ->
 * flows_let_go): `kept`, the last put only unmaps; ring and files stay
 * for the next start (issue 15).
 */
struct flow {
	/*
	 * First, on a cache line of its own (flows_alloc), what the police
	 * round and the doorbell sweep read of every flow once a second: for
	 * a flow no client was handed (flow_exposed) it is all they touch.
	 * With these fields spread over the flow, each such visit missed on
	 * several lines and pages: 1000 idle flows cost two daemons 1-2% of
	 * a cpu (perf, issue 12).
	 */
	struct flow *next;
	unsigned refs;
	bool dead;               /* destroyed: no longer in the table */
	/* a client was handed its ring fd, or the ring file predates this
	 * start (re-adopted): see flow_exposed */
	bool exposed;
	enum flow_role role;
	enum flow_state state;
	struct peer *peer;
	uint64_t orphaned_ns;    /* receiver: when it began to wait for its
				  * sender (fr_now_ns), for --orphan-timeout */
	struct flow *fanout;      /* fan-out (below): a first flow's siblings */
	struct flow *sibling_of;  /* a sibling's first flow (referenced) */

	struct flow *exp_next;    /* listed and exposed: flow_table.exposed */
	char name[FLOW_NAME_MAX + 1];
	struct flow *prev;        /* listed: the one before it (head: NULL) */
	struct flow *name_next;   /* listed: the next in its name's bucket */
	bool listed;              /* in the table (link_flow .. unlist) */
	/* unlisted, with references left (I/O in flight): in
	 * flow_table.dying, still charged to its party, till its last put */
	bool dying;
	struct flow *dying_prev, *dying_next;
	bool kept;               /* let go at an orderly stop: the last put
				  * unmaps, the ring and its files stay */
	/* re-adopted with subscriber slots of clients of an earlier start
	 * (ring format 2): no control connection tells when they die, so
	 * their pids are looked at once a second (flows_watch_inherited) */
	uint32_t inherited_slots;
	bool draining;           /* destroy --drain: its ring is closed to
				  * producers; its state goes on (a sender
				  * still sends what is committed) */
	struct flow_table *table;
	int ring_fd;
	flowshm_t *view;         /* moverd's own mapping: positions, shutdown */
	uid_t owner_uid;
	gid_t owner_gid;
	struct flow_ids allowed;
	bool grants_kept;        /* flow_spec.grants_kept */
	/* max_lag, moverd's own (fr_pin_max_lag on each of its views): the
	 * ring's word is any client's to write; kept in the state file
	 * (max_lag=) when not 0 */
	uint64_t max_lag;
	bool lag_known;          /* its state file named it (adopt) */
	/* a receiving end declared in the config (declared.c): the declared
	 * ids last granted on it, kept in its state file (declared_uids=,
	 * declared_gids=), so that a start takes a declaration that did not
	 * change as unchanged: an id taken off by hand stays off */
	bool decl_known;
	struct flow_ids declared;
	unsigned producers, consumers;
	unsigned tx_inflight;    /* sends in flight that read its ring */
	/* consumer slots taken since the counters last looked, and the
	 * generation each was taken at (control.c): a consumer that attaches
	 * and leaves between two counters passes is counted too */
	uint32_t subs_taken;
	uint64_t sub_taken_gen[FR_MAX_SUBS];
	uint64_t created_unix_ms;

	char reason[160];        /* why it is not open */
	char peer_addr[80];
	char path[384];          /* ring file ("" for a memfd ring) */
	struct flow *peer_next;  /* in the peer's list */
	struct flow *id_next;    /* in its bucket of the peer's by_id */
	uint32_t id;             /* the sender's id for the flow */
	/* receiver: the identity of the peer that created it (its address,
	 * or "NODE key KEYID" once peers authenticate).  Only that peer may
	 * open or resume the flow again; kept in the state file. */
	char origin[FLOW_ORIGIN_MAX + 1];
	/* receiver: the peer host its quotas are charged to: the address of
	 * the peer that created or last resumed it, never the node name in
	 * origin (any key holder may say any name).  Kept in the state file
	 * when it differs from origin. */
	char origin_host[FLOW_HOST_MAX + 1];
	uint64_t ring_bytes;     /* its ring size, for the quotas */
	/* the entry of the party it is charged to (a peer host for a
	 * receiver, else its owner): held from its create or adopt until
	 * it is freed or its remains take it (flows.c, struct holder);
	 * NULL for a fan-out subscription, or with no index of holders */
	struct holder *holder;
	uint64_t guard;          /* ring file: moverd's mapping, guarded
				  * against SIGBUS (ring_guard.h) */
	bool view_tripped;       /* ... and it faulted (flows_ring_tampered) */
	/* the ring's pages allocated off the loop, a chunk at a time
	 * (flows.c, fill_kick); the fill holds a reference */
	struct loop_op fill_op;
	struct flow *fill_qprev, *fill_qnext; /* waiting for its turn */
	bool fill_queued;
	uint64_t filled;         /* bytes of the ring file allocated so far */
	uint64_t fill_held;      /* ... its part of the table's fill_pending */
	unsigned fill_eintr;     /* EINTRs of the chunk in flight */
	/* blocks a client allocated beyond the ring's size, punched out off
	 * the loop a chunk at a time (flows.c, trim_start); the punch holds
	 * a reference */
	struct loop_op trim_op;
	bool trimming;
	uint64_t trimmed;        /* punched up to here ... */
	uint64_t trim_end;       /* ... of this far */
	unsigned trim_passes;    /* passes through so far */

	/* sender: positions in the producer ring */
	uint64_t sent;           /* everything before it is on the wire */
	uint64_t acked;          /* ... and published in the peer's ring */
	/* the furthest position this run put on the wire for the peer's
	 * incarnation of the flow (UINT64_MAX: not known, re-adopted and
	 * not yet answered): a resume beyond it is the peer's consumers'
	 * doing (they can write `published`), never records it received */
	uint64_t wire_max;
	uint64_t remote_head;    /* the peer consumer's position (window) */
	uint64_t deficit;        /* deficit round robin: bytes it may send */
	unsigned bell_index;     /* its bit in the doorbell page + 1, 0: none */
	bool active;             /* on one of the mover's lists (mover.c) */
	bool arm_listed;         /* in the mover's armed list (mover.c) */
	struct flow *act_prev, *act_next;
	struct flow_list *act_list; /* the one it is on: its peer's */
	bool win_wait;           /* off it until an ACK opens its window */
	uint64_t stuck_checked_ns;

	/* receiver */
	uint64_t reported_head;  /* the consumer position last sent back */
	/* `sent` is what moverd published in this run (created, or opened
	 * once since re-adoption): the ring's `published` must still say
	 * so at a re-open, or a client moved it */
	bool rx_pos_known;
	/* until then: the records from the consumers' position were found
	 * to end at published rx_walked_pub (records_reach: one walk per
	 * restart, whatever the opens refused after it) */
	bool rx_walked;
	uint64_t rx_walked_pub;
	/* the sender's subscription it came through last (PeerFlowOpen
	 * sub_tag; 0: an older sender): another of the same sender's, on
	 * another live connection, is its twin (peer_open.c, twin_of) */
	uint64_t rx_tag;
	/* it leaves its connection after its sender was told it is gone or
	 * failed here (a REFUSED): WRITEs the sender posted before it heard
	 * may still land, so RDMA keeps the ring registered until the
	 * sender's CLOSE (rdma.c, rdma_forget_flow) */
	bool rx_refused;
	uint64_t quiet_head;     /* the consumer position seen last ... */
	uint64_t quiet_since_ns; /* ... and since when (mover.c build_acks) */
	uint64_t ack_owed_ns;    /* credit waits since (0: none; mover.c
				  * ack_wanted) */
	bool ack_due;            /* a deposit is not yet acknowledged */
	bool cut_off;            /* failed: the sender cut it (max_lag) */
	struct peer *rx_peer;    /* a receive into the ring is in flight */

	/* sender: the peer answered "busy, retry" (-EAGAIN) to an open */
	uint64_t reopen_at_ns;

	uint64_t bytes_sent, bytes_acked;
	struct flow_stats st;     /* for the counters file (stats.h) */

	const char *transport;   /* of its peer connection: "tcp", "rdma" */

	/* RDMA sender: where the peer's consumer ring is */
	uint64_t raddr;
	uint32_t rkey;
	/* RDMA: this ring's registration (rdma.c, flow_mr) on the connection
	 * mr_conn, NULL: none; cleared when it is dropped or orphaned */
	struct ibv_mr *mr;
	const void *mr_conn;

	/* end of stream (eos.h): attached producers that ended theirs */
	unsigned producers_ended;
	bool producers_ended_ever; /* one did, attached or gone since */
	bool end_pending;        /* the END waits for room in the ring */
	bool end_written;

	/*
	 * Fan-out (fanout.h): a sender flow to several peer hosts.  The first
	 * peer's flow is in the table and owns the ring; each further peer
	 * is a sibling flow, off the table, on its own peer connection, with
	 * its own mapping of the same ring (so its own subscriber slot), its
	 * own id, positions and resume.  A sibling holds a reference on its
	 * first flow; the first flow's list holds the sibling's "table"
	 * reference.  peer_destroy_flow of the first destroys every sibling.
	 * (fanout and sibling_of are at the top.)
	 */
	struct flow *fanout_next; /* sibling: the next in that list */
	bool sub_dropped;         /* its subscription is over (cut by
				   * max_lag, or its peer failed it): its
				   * slot is given back, others go on */
	bool rejoining;           /* cut, and not yet answered since: its
				   * OPENs say after_cut until one is (its
				   * peer may never have heard of the cut);
				   * kept in the state file (cut=), so a
				   * restart of ours does not lose it */
	bool sub_leave_owed;      /* ... once its sends in flight complete
				   * (fanout_sends_done): until then
				   * producers may not write over what they
				   * read */
	char *fanout_saved;       /* re-adopted: the state file's peers */
	char *cut_saved;          /* ... and those whose cut it kept (cut=) */
	/* moverd's own verdict (flows_fail): why its ring failed, the first
	 * time (a first flow's: its fan-out subscriptions read its ring).
	 * Kept in the state file (failed=) and said again whenever
	 * the ring's failed flag is found on a flow not failed (peer.c,
	 * ring_marked_failed: after a restart, or after a receiver's
	 * connection reset), instead of "a client marked the ring failed".
	 * Only flows_fail sets it: a state FLOW_FAILED that passes (a
	 * fan-out subscription cut and rejoined) is not kept. */
	char *failure;
	bool failure_restored;    /* ... read from the state file this start */
	bool save_owed;           /* a change made (flows_save_owed) is
				   * not in the state file yet: a save
				   * failed (a full filesystem), tried again
				   * each second (flows_retry_saves) */
	const char *owed_what;    /* ... the last such change, as logged */
	/* cut by max_lag: the subscription is taken again at the current
	 * position by itself at rejoin_at_ns (fanout_police), after a
	 * backoff that doubles with each cut soon after the last */
	unsigned cuts;            /* for `flow show` */
	uint64_t cut_unix_ms;     /* the last cut, for `flow show` */
	uint64_t cut_ns;          /* the last cut (fr_now_ns) */
	uint64_t rejoin_at_ns;    /* 0: no rejoin due */
	uint64_t rejoin_backoff_ns;
	/* sender: the wait before asking again a receiver short of room
	 * (peer_open.c, short_of): REOPEN_NS doubling to SHORT_MAX_NS, from 0
	 * again once the flow is open */
	uint64_t short_backoff_ns;
	/* sender: the wait before opening again a flow whose ring could not
	 * be registered on its connection (peer_sender_wait): REOPEN_NS
	 * doubling to SHORT_MAX_NS, from 0 again once one is registered */
	uint64_t wait_backoff_ns;
	/* its subscription ended because member twin_id of the same flow
	 * leads to the same daemon (its peer said so: peer_open.c, twin_of and
	 * twin_refused): it rejoins once that one is gone (fanout.c,
	 * rejoin_twins); 0: none */
	uint32_t twin_id;
};
_Static_assert(offsetof(struct flow, name) <= 64, "struct flow: first line");

struct flow_limits {
	uint64_t default_ring_size;
	uint32_t default_max_record;
	uint64_t max_ring_size;  /* per flow */
	unsigned max_flows;
	/* what one peer host may make this host allocate (receiver flows) */
	unsigned peer_max_flows;
	uint64_t peer_max_ring_bytes;
	/* what one non-root uid may own (local and sender flows) */
	unsigned uid_max_flows;
	uint64_t uid_max_ring_bytes;
	/* ring bytes one non-root uid, and one peer host, may have created a
	 * second (0: no limit): creating and destroying rings runs on the
	 * event loop (flows.c, check_rate) */
	uint64_t uid_ring_rate;
	uint64_t peer_ring_rate;
	unsigned state_dir_reserve;   /* percent of the state dir kept free */
	unsigned orphan_timeout_s;    /* 0 = receiver flows wait forever */
	/* who owns a flow a peer opens here (--peer-flow-owner): never the
	 * ids the peer names, which mean nothing on this host */
	uid_t peer_flow_uid;
	gid_t peer_flow_gid;
	bool peer_flow_group;     /* ... and members of peer_flow_gid attach */
};

struct flow_remains;
struct rate_party;
struct holder;

struct flow_table {
	struct flow *head;
	unsigned count;
	/* the listed flows by name (flows_find): buckets of name_next
	 * chains, a power of two at least --max-flows (NULL if it could not
	 * be had: flows_find walks the list), hashed with a seed of this
	 * start's so that no client can aim its names at one bucket (nor
	 * its parties at one of holders') */
	struct flow **names;
	uint32_t names_mask, hash_seed;
	/* what each party holds, for the quotas (flows.c, struct holder):
	 * its entry by party, in buckets as many as names' (NULL if they
	 * could not be had: check_quota walks the flows and remains) */
	struct holder **holders;
	uint32_t holders_mask;
	/* the next flow of the flow checks' round (peer_timer.c, police_slice);
	 * unlisting its flow moves it on */
	struct flow *cursor;
	/* the listed flows a client could have written (flow_exposed), in
	 * their own list (exp_next) with their own round's cursor: the checks
	 * of what clients write visit these alone; the whole table's round is
	 * for the orphan timeout (peer_timer.c, police_slice) */
	struct flow *exposed, *exp_cursor;
	unsigned n_exposed;
	/* flows_set_state calls: a counters pass writes every flow's record
	 * when this moved (counters.c, flows_to_write) */
	uint64_t state_changes;
	/* sender ids: the next one's sequence, past 2^32 once ids wrapped
	 * (flows_new_id) */
	uint64_t next_id;
	struct flow_limits limits;
	char state_dir[256];      /* ring files of flows between hosts */
	int state_fd;             /* ... that directory, checked (private_dir) */
	/* rings of destroyed flows whose consumer may still drain them
	 * (their pages go after DRAIN_GRACE_NS), or whose pages are being
	 * punched out (flows.c: release_pages) */
	struct flow_remains *remains;
	/* flows unlisted (destroyed, or let go at a stop) that something
	 * still refers to: their rings are held, and charged (flows.c,
	 * dying_link) */
	struct flow *dying;
	unsigned n_dying;         /* ... how many: each holds its ring's fd,
				   * as a listed flow does (--max-flows) */
	/* the rings of the dying flows and the remains: how many, their
	 * bytes (status: destroyed_rings) */
	unsigned n_gone;
	uint64_t gone_bytes;
	/* the loop that allocates and punches rings' pages (flows_use_loop);
	 * NULL: on the spot, as at a stop */
	struct loop *loop;
	unsigned n_async;         /* fills and punches in flight */
	/* rings waiting to be filled, and the one whose chunk is in flight */
	struct flow *fill_head, *fill_tail, *fill_busy;
	uint64_t fill_pending;    /* ring bytes fills have yet to allocate:
				   * room in the state directory they hold */
	uint64_t punch_pending;   /* ring bytes punches have yet to free:
				   * room that is as good as free */
	/* the parties whose ring rate budget is spent in part (check_rate);
	 * one whose bucket is full again is forgotten */
	struct rate_party *rates;
	/* this moverd's start count, kept in the state directory (`epoch`):
	 * clients that see it change know the daemon restarted */
	uint64_t epoch;
	/* flows whose state file is owed a change (save_owed), and when the
	 * next try is (flows_retry_saves) */
	unsigned n_owed;
	uint64_t save_retry_ns;
	/* called when a flow is created (the control socket answers the
	 * requests that waited for it): a hook, flows.c knows no clients */
	void (*added)(void *arg, struct flow *f);
	void *added_arg;
};

/* How long a consumer may drain a destroyed flow before its pages go. */
#define DRAIN_GRACE_NS 5000000000ull

/* state_fd: the state directory, opened by private_dir_open. */
void flows_init(struct flow_table *t, const struct flow_limits *limits,
		const char *state_dir, int state_fd);

/*
 * Allocate new rings' pages and punch destroyed ones' through l, off the
 * event loop (IORING_OP_FALLOCATE and IORING_OP_MADVISE), a chunk at a
 * time; NULL (the default, and from the stop on): on the spot.
 */
void flows_use_loop(struct flow_table *t, struct loop *l);

/* Are fills or punches in flight (a stop waits for them)? */
static inline bool flows_busy(const struct flow_table *t)
{
	return t->n_async > 0;
}

/* Count this start: the state directory's `epoch` + 1, kept there (a
 * warning if it cannot be written).  Before flows_adopt. */
uint64_t flows_count_start(struct flow_table *t);

/* Re-adopt every flow (local, sender, receiver) whose ring is in the
 * state directory (after a crash or an orderly stop); returns how many. */
unsigned flows_adopt(struct flow_table *t);

const char *flows_state_name(enum flow_state s);

/*
 * The flow's state, attach counts and this start's epoch into its ring's
 * status (struct fr_status, read by clients through flowshm_state), each
 * word only when it changed.  Called at every transition: create, adopt,
 * flows_set_state (connecting, open, peer down, failed), drain, destroy,
 * attach and detach; and once a second (police_flows) to be sure.
 */
void flows_status(struct flow *f);

/* moverd's own mapping of a ring (a flow's view): it takes no producer slot,
 * as a client's producer would (ipc/ring.h, Producer slots), so a ring
 * whose slots are all held still opens; it subscribes with a HELD slot of
 * its own where it sends.
 * A ring file (guarded: a client may shrink it) is guarded (ring_guard.h,
 * its id in *guard) from before moverd's first read of the mapping; else,
 * and if the open fails, *guard is 0. */
int flows_open_view(int ring_fd, bool guarded, flowshm_t **view,
		    uint64_t *guard);

/*
 * Once a second (police_flows): give back the subscriber slots, inherited
 * from an earlier start, whose holders died since (a consumer that kept
 * running across a restart has no control connection to this moverd), so
 * that they do not hold producers back for good.  Stops looking once the
 * inherited slots are all gone.
 */
void flows_watch_inherited(struct flow *f);

/*
 * Once a second (police_flows), for a local flow: run the ring's recovery
 * of a producer that died in a claim where its slowest consumer waits.
 * A consumer in another pid namespace than moverd's cannot judge the
 * ring's pids and leaves that to moverd (ipc/ring.h, Liveness); one that
 * can runs it too, and the ring's CAS lets only one of them pad.
 */
void flows_recover_local(struct flow *f);

const char *flows_role_name(enum flow_role r);
void flows_set_state(struct flow *f, enum flow_state s, const char *reason);

/* A user's `flow peer add` or `remove` of flow name: charged to uid's
 * budget as a create of the smallest ring (--max-ring-rate-per-uid), for
 * each queues an OPEN or CLOSE on a shared peer connection.  0, or
 * -EAGAIN with err saying when to try again. */
int flows_charge_edit(struct flow_table *t, const char *name, uid_t uid,
		      char *err, size_t errlen);

/* Create a flow owned by uid/gid.  0, or a negative errno with a sentence
 * for the client in err: -EEXIST, -EINVAL, -ENOSPC, -ENOMEM, -EDQUOT,
 * -EAGAIN (its owner, or peer host, creates rings too fast: retry after
 * the time err names)... */
int flows_create(struct flow_table *t, const struct flow_spec *spec,
		 uid_t uid, gid_t gid, struct flow **out, char *err,
		 size_t errlen);

/*
 * The checks of a create that look at the spec alone (name, sizes with
 * their defaults filled in p, this daemon's --max-ring-size, what a state
 * file can keep, the allowed ids), not at what the table holds now (the
 * name free, --max-flows, the uid's quota, the room on disk).  0, or a
 * negative errno with why in err.  flows_create makes them first; a
 * reload asks them before it destroys a flow to re-create it.
 */
int flows_check_spec(const struct flow_table *t, const struct flow_spec *s,
		     struct flowshm_ring_params *p, char *err, size_t errlen);

struct flow *flows_find(struct flow_table *t, const char *name);

/* A zeroed flow, its first line on a cache line (struct flow); free()d. */
struct flow *flows_alloc(void);

/* An id for a new sender flow (or fan-out sibling): never 0, never one a
 * flow of t has (what DATA, ACKs and the state files name it by). */
uint32_t flows_new_id(struct flow_table *t);

/* A receiving flow its sender cut (fan-out --max-lag): failed until the
 * sender rejoins, which makes it again as a new flow of the same name
 * (peer_open.c, recreate_cut). */
static inline bool flow_cut_off(const struct flow *f)
{
	return f->state == FLOW_FAILED && f->cut_off;
}

/* f is about to be handed to a client (control.c, respond): f exposed,
 * and in t->exposed while listed. */
void flows_expose(struct flow *f);

/* The flow that owns f's ring and state file: f's first flow if f is a
 * fan-out sibling, else f.  (Not const: as strchr, for either caller.) */
static inline struct flow *flow_first(const struct flow *f)
{
	return (struct flow *)(f->sibling_of ? f->sibling_of : f);
}

/* The subscriptions of a flow in turn, first then its siblings:
 * for (s = first; s; s = flow_next_sub(first, s)).  NULL after the last. */
static inline struct flow *flow_next_sub(const struct flow *first,
					 const struct flow *s)
{
	return s == first ? first->fanout : s->fanout_next;
}

/*
 * Could anyone but moverd have written f's ring or changed its file?  Only
 * once a client was handed the ring's fd (control.c, respond) or if the
 * file was there before this start (re-adopted: clients of the last one
 * may hold it).  The file is moverd's, mode 0600, in its private state
 * directory (a memfd ring has no name at all).  Until then the checks of
 * what clients write (police_flow, the doorbell sweep) skip the flow: a
 * flow nobody attached costs no visit to its ring.  A fan-out sibling
 * maps its first flow's ring.
 */
static inline bool flow_exposed(const struct flow *f)
{
	return flow_first(f)->exposed;
}

/* Take a reference for an asynchronous operation (see struct flow). */
static inline struct flow *flow_get(struct flow *f)
{
	f->refs++;
	return f;
}

/* Drop one; the last unmaps the ring, closes its fd and frees the flow. */
void flow_put(struct flow *f);

/* Unlist the flow, close the ring for every attached client (they see
 * -EPIPE), unlink its files, and drop the table's reference. */
void flows_destroy(struct flow_table *t, struct flow *f);

/*
 * An orderly stop: unlist the flow and drop the table's reference without
 * closing the ring, punching its pages or removing its files, so that the
 * next moverd re-adopts it and its clients go on meanwhile (issue 15).
 * The caller has taken it off its peer first (peer_let_go_flow).
 */
void flows_let_go(struct flow_table *t, struct flow *f);

/*
 * Something read from the flow's own ring was impossible (a position
 * moved backwards or beyond what moverd recorded): this flow, and only
 * it, fails.  Its clients get -EPROTO; `reason` is shown by flow show.
 * Its state file says so too (failed=REASON), so that the next start
 * says why it failed; a save that fails is tried again each second
 * (flows_retry_saves) until it is written or the flow is gone.
 */
void flows_fail(struct flow *f, const char *reason);

/* moverd's kept verdict on f's ring (flows_fail), in the words a flow
 * failed by it shows: "failed before moverd restarted: REASON" when it was
 * read from the state file this start.  False (why untouched) if moverd
 * never failed the ring. */
bool flows_verdict(const struct flow *f, char *why, size_t cap);

/* moverd stops: the next start reads f's state file, so a save owed gets
 * its last try, while the file's every part (its fan-out peers) is
 * there still. */
void flows_last_save(struct flow *f);

/* Try again to write the state files owed a change (flows_save_owed), at
 * most once a second (a walk of the table, only while any is owed). */
void flows_retry_saves(struct flow_table *t, uint64_t now);

/* Release the remains that are drained or past their grace, and forget
 * the ring rate budgets that are whole again (all: now = UINT64_MAX, at
 * shutdown). */
void flows_reap_remains(struct flow_table *t, uint64_t now);

/*
 * Has a reader of view's ring not read to its tail?  The slowest
 * subscriber slot, not moverd's own: on a sender ring moverd's slot
 * follows what its peers acknowledged, ahead of a local consumer.  Every
 * "drained?" question (a destroy's grace, a drain, a released ring's
 * remains) asks this one.  False if there is no ring to read.
 */
bool flows_unread(flowshm_t *view);

/*
 * Ring files (flows between hosts) are handed to clients as they are, so a
 * client can resize them.  True if one did: the file is repaired (its size
 * restored, blocks beyond it punched) and why says what happened.
 */
bool flows_ring_tampered(struct flow *f, char *why, size_t cap);

/* Why a touch of f's ring faulted with its file at its size, `what`
 * faulted first: "WHAT, file at its size: a page could not be allocated
 * (N bytes free in DIR), or a client cut it". */
void flows_fault_why(const struct flow *f, const char *what, char *why,
		     size_t cap);

/* May this client attach?  Root, the owner, and the allowed ids may. */
bool flows_may_attach(const struct flow *f, uid_t uid, gid_t gid);
/* Is one of the client's supplementary groups among the allowed gids? */
bool flows_group_allowed(const struct flow *f, const gid_t *groups,
			 unsigned n);
/* Is uid the operator's: root, or moverd's own user (the packaged unit
 * runs moverd as an unprivileged one, and its config's flows are owned by
 * it)?  The operator's flows have no quota and may be managed by it.
 * Valid after flows_init. */
bool flows_is_operator(uid_t uid);
/* May this client destroy it?  The operator and the owner may. */
bool flows_may_manage(const struct flow *f, uid_t uid);

bool flows_valid_name(const char *name);

/* The wall clock in ms since the epoch (CLOCK_REALTIME): the times shown
 * to operators (created_unix_ms, cut_unix_ms, a peer's last error). */
uint64_t flows_unix_ms(void);

/*
 * Add ids to the flow's allowed uids and gids (remove: take them off),
 * all or nothing, and keep the lists in its state file (flows between
 * hosts).  Ids already there (remove: not there) are no error.  0, or a
 * negative errno with a sentence in err: -EINVAL (no ids, an id of -1),
 * -ENOSPC (more than FLOW_ALLOW_MAX), or the state file's write error.
 */
int flows_allow(struct flow_table *t, struct flow *f, const uint32_t *uids,
		size_t n_uids, const uint32_t *gids, size_t n_gids, bool remove,
		char *err, size_t errlen);

/* The flow's state file again (after a change of what it keeps), for a
 * change a request asked for: 0, or the write's negative errno, which
 * the caller reports (and undoes the change if it may).  A file owed a
 * change before (flows_save_owed) is no longer owed once this succeeds. */
int flows_save(struct flow *f);

/*
 * The same for a change already made (by moverd itself: a fan-out peer
 * cut, a failure, a peer's identity; or one a request may not undo): a
 * write that fails is logged once for each `what` (a string constant:
 * "its failure"), and tried again each second (flows_retry_saves), and
 * once more at an orderly stop (flows_last_save), until it succeeds or
 * the flow is gone.
 * 0, or the write's negative errno.
 */
int flows_save_owed(struct flow *f, const char *what);

/* f's peer resumes it from another address (peer_open.c, check_origin):
 * from now on f is charged to that peer host (origin_host).  0, or
 * -ENOMEM with nothing changed: no memory for that host's entry (struct
 * holder). */
int flows_charge_host(struct flow *f, const char *host);

/* moverd's view of f's ring goes by f->max_lag (fr_pin_max_lag). */
static inline void flows_pin_lag(struct flow *f)
{
	fr_pin_max_lag(&f->view->ring, f->max_lag);
}

#endif
