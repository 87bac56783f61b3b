/*
 * flowshm.h - the flowmover client library.
 *
 * Applications move records by touching only shared memory: a producer
 * sends records into a flow's ring, a consumer receives them.  The library
 * is lock-free and makes no system call on the fast path; it sleeps on a
 * futex only when asked to wait and the ring stays full (or empty).
 *
 * Every function returns 0 on success or a negative errno that tells the
 * caller what to do next (flowshm_strerror gives each one in words):
 *   -EAGAIN     ring full (send) or empty (recv): try again later
 *   -ETIMEDOUT  the wait you asked for ran out.  For a producer (send,
 *               send_batch, reserve, end): back-pressured by a slow
 *               consumer; the two codes below say when it was something
 *               else
 *   -ENOTCONN   (timed-out producer) the flow's link to its peer host is
 *               down or was never up (flowshm_state: PEER_DOWN or
 *               CONNECTING): nothing drains the ring until it is back
 *   -EHOSTDOWN  (timed-out producer) moverd is gone (our control
 *               connection hung up) and the ring is full
 *   -EMSGSIZE   record larger than the flow's maximum (send), or larger
 *               than your buffer (recv: *len says how large; nothing lost)
 *   -EPIPE      the flow is closed (recv: and fully drained); for a
 *               producer also: the flow's stream has ended (flowshm_end)
 *   -ENODATA    end of stream (consumer): every record of the flow was
 *               delivered and its producers ended it; every read call
 *               returns it from then on.  Not an error of the flow.
 *   -ESTALE     this consumer fell more than the flow's max lag behind and
 *               was cut off; detach and attach again (at the current
 *               position).  On a receiving host: the sending host cut
 *               this host's subscription (fan-out --max-lag); the flow
 *               here is failed (flowshm_state: FAILED, reason -ESTALE)
 *               until destroyed here and this peer added again there
 *   -EPROTO     the ring is corrupt or of another version: stop using it
 *   -EINVAL     bad argument (zero length, wrong role, misuse of reserve
 *               or peek)
 *   -EBUSY      (attach, open_fd) every subscriber slot (consumers) or
 *               producer slot (producers) of the flow is taken
 *   -ENOSPC, -EDQUOT, -ENOMEM  (attach, end) a limit of moverd's
 *   -ENOENT, -EACCES, -ECONNREFUSED  (attach) see flowshm_attach
 * Which calls return which is said at each call.
 *
 * Timeouts are in nanoseconds: 0 = try once, negative = wait forever.
 *
 * A handle belongs to one thread at a time and must not be used across
 * fork(); open a new one in the child.  In the child, a handle attached
 * through moverd has its control connection closed at the fork (moverd
 * sees the parent alone: its detach gives its slot back while children
 * live on), and flowshm_detach only frees the child's copy (the slots are
 * the parent's).  The same for a set: in the child, flowshm_set_destroy
 * only frees it (its helper thread stayed in the parent).
 */
#ifndef FLOWSHM_H
#define FLOWSHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOWSHM_VERSION "0.1.0"

typedef struct flowshm flowshm_t;

enum flowshm_role {
	FLOWSHM_PRODUCER = 1,
	FLOWSHM_CONSUMER = 2,
};

/* Parameters of a new ring. */
struct flowshm_ring_params {
	uint64_t ring_size;   /* bytes, a power of two >= 4096 */
	uint32_t max_record;  /* largest payload, 1..ring_size/2 */
	uint32_t flags;       /* FLOWSHM_RING_* */
};

/* The ring is the consumer end of a flow fed by moverd from a peer host. */
#define FLOWSHM_RING_DEPOSIT 1u
/* Create only: the ring's pages are not allocated at creation; they fault
 * in on first use unless the caller allocates them (moverd does, off its
 * event loop).  Never reported by flowshm_info. */
#define FLOWSHM_RING_LAZY 2u

/* Options when opening an end; NULL means defaults. */
struct flowshm_opts {
	/*
	 * Consumer: how long a record may stay claimed but uncommitted before
	 * the consumer checks whether its producer died and, if so, turns it
	 * into padding.  0 = default (2 s); UINT64_MAX = never.  moverd
	 * does the same for the flows it serves, on its own 2 s, and alone
	 * for a consumer in another pid namespace (ipc/ring.h, Liveness).
	 */
	uint64_t recover_ns;
};

/* Counters and positions of an open end, for tools and tests. */
struct flowshm_info {
	uint64_t ring_size;
	uint32_t max_record;
	uint32_t flags;       /* FLOWSHM_RING_* */
	uint64_t head;        /* consumer position (bytes) */
	uint64_t tail;        /* producers' claim position (bytes) */
	uint32_t closed;
	uint32_t recovered;   /* records of dead producers turned to padding */
};

/* ---- attaching to a flow by name (through moverd) ---------------------- */

/*
 * Ask moverd (socket: $FLOWMOVER_SOCKET, else /run/flowmover/moverd.sock)
 * for the ring of flow_name and open the given end of it.  Returns 0 and
 * *out, or:
 *   -ENOENT        no such flow
 *   -EACCES        you may not attach to it (or to moverd's socket)
 *   -ECONNREFUSED  moverd is not running
 *   -ETIMEDOUT     moverd did not answer in time
 *   -EPROTO        moverd's answer made no sense
 *   -EBUSY         all 16 subscriber slots (consumers), or all 64
 *                  producer slots (producers), of the flow taken
 *   -ESTALE        a consumer on a receiving host whose sender cut the
 *                  flow (fan-out --max-lag): attach again once the sender
 *                  opens it again (flowshm_attach_wait waits for that)
 *   -EINVAL        bad name or role
 * flowshm_attach_error() then says why in words.
 */
int flowshm_attach(const char *flow_name, enum flowshm_role role,
		   const struct flowshm_opts *opts, flowshm_t **out);

/*
 * flowshm_attach, but if the flow does not exist yet (a consumer on the
 * receiving host before the sender connected, issue 15), moverd waits up
 * to timeout_ns (< 0: forever) for it to appear and answers then; the same
 * for a flow its sender cut off here (-ESTALE above), which appears again
 * at the sender's rejoin.  The same codes as flowshm_attach, and
 * -ETIMEDOUT if it did not appear in time.  timeout_ns 0 is
 * flowshm_attach.
 */
int flowshm_attach_wait(const char *flow_name, enum flowshm_role role,
			const struct flowshm_opts *opts, int64_t timeout_ns,
			flowshm_t **out);

/*
 * flowshm_attach_wait, but only to a flow that uid owner_uid owns (its
 * creator; for a flow fed from another host, moverd --peer-flow-owner or
 * the declaring user).  Flow names are one namespace per host: a program
 * that attaches to a flow another user may have created first under the
 * same name (and allowed it) would otherwise hand that user its records,
 * or read theirs.  -EACCES, with the owner in flowshm_attach_error(), if
 * someone else owns it; the rest as flowshm_attach_wait (timeout_ns 0:
 * no wait).  getuid() for "a flow of my own".
 */
#define FLOWSHM_HAVE_ATTACH_OWNED 1 /* for bindings built against older headers */
int flowshm_attach_owned(const char *flow_name, enum flowshm_role role,
			 uint32_t owner_uid, const struct flowshm_opts *opts,
			 int64_t timeout_ns, flowshm_t **out);

/* Close a handle from flowshm_attach (the flow stays open). */
void flowshm_detach(flowshm_t *f);

/* Why this thread's last flowshm_attach failed, in words ("" if it did
 * not fail).  Valid until the thread's next flowshm_attach. */
const char *flowshm_attach_error(void);

/* ---- low level: rings as file descriptors ------------------------------ */

/*
 * Create and format a ring.  path NULL: an anonymous sealed memfd (it can
 * be neither shrunk nor grown, so no holder can make another's mapping
 * fault).  Otherwise a new file at path (O_EXCL).  *fd is close-on-exec.
 */
int flowshm_ring_create(const struct flowshm_ring_params *params,
			const char *path, int *fd);

/* Open an end of the ring behind fd (the fd may be closed afterwards). */
int flowshm_open_fd(int fd, enum flowshm_role role,
		    const struct flowshm_opts *opts, flowshm_t **out);

/* Unmap and free the handle (from open_fd or attach); the flow stays open. */
void flowshm_close(flowshm_t *f);

/* Close the flow for everyone: producers get -EPIPE, consumers drain then
 * get -EPIPE, and every sleeper is woken. */
void flowshm_shutdown(flowshm_t *f);

int flowshm_info(flowshm_t *f, struct flowshm_info *out);

/*
 * How this handle's calls wait when they are allowed to (timeout_ns not
 * 0): for room in send, send_batch and reserve, for a record in recv,
 * recv_batch, peek and peek_batch, and in flowshm_poll and
 * flowshm_set_poll when every handle they wait on polls (one that sleeps
 * makes them sleep).  All of them spin briefly first; then
 *   FLOWSHM_WAIT_SLEEP  sleep on the ring's futex (on a local ring after
 *                       a few yields): no cpu while nothing comes (the
 *                       default).  A producer asleep on a full ring is
 *                       woken once a quarter of it is free (or the
 *                       largest record); a record that fits in less goes
 *                       within 10 ms, or at the timeout, whichever is
 *                       first
 *   FLOWSHM_WAIT_YIELD  poll with sched_yield(2) until the timeout, never
 *                       asleep: the lowest latency where a few processes
 *                       share each cpu (with `moverd --idle yield`), for
 *                       a whole cpu's time while it waits
 *   FLOWSHM_WAIT_SPIN   poll without yielding: for a thread with a cpu of
 *                       its own
 * A polling end needs no wake-up: moverd and the other end make no
 * system call for it.  flowshm_end waits for its END record as before.
 * Returns 0, or -EINVAL (no handle, or another value).
 */
#define FLOWSHM_HAVE_SET_WAIT 1 /* for bindings built against older headers */
enum flowshm_wait {
	FLOWSHM_WAIT_SLEEP = 0,
	FLOWSHM_WAIT_YIELD = 1,
	FLOWSHM_WAIT_SPIN = 2,
};
int flowshm_set_wait(flowshm_t *f, enum flowshm_wait wait);

/* ---- producer ------------------------------------------------------------ */

int flowshm_send(flowshm_t *f, const void *data, size_t len,
		 int64_t timeout_ns);

/*
 * Send up to n records; *sent says how many went (at least one on 0).
 * Waits (per timeout_ns) only while not even one record fits.
 */
int flowshm_send_batch(flowshm_t *f, const struct iovec *recs, unsigned n,
		       unsigned *sent, int64_t timeout_ns);

/* Zero copy: reserve len bytes, write them at *buf, then commit. */
int flowshm_reserve(flowshm_t *f, size_t len, void **buf, int64_t timeout_ns);
int flowshm_commit(flowshm_t *f);

/* ---- consumer ------------------------------------------------------------ */

int flowshm_recv(flowshm_t *f, void *buf, size_t cap, size_t *len,
		 int64_t timeout_ns);

/*
 * Receive up to max records into buf, back to back (each starts 8-byte
 * aligned); recs[i] points into buf.  *got >= 1 on 0.  A first record
 * larger than cap gives -EMSGSIZE with recs[0].iov_len = its size.
 */
int flowshm_recv_batch(flowshm_t *f, void *buf, size_t cap,
		       struct iovec *recs, unsigned max, unsigned *got,
		       int64_t timeout_ns);

/*
 * Zero copy: look at the next record in place, then release it.
 * flowshm_release: 0, or -ESTALE if this consumer was cut off meanwhile
 * (max lag; as flowshm_recv when cut off while it copies): what was read
 * in place may have been overwritten, and nothing is released (the next
 * read call says -ESTALE too).  -EINVAL when nothing is peeked.
 */
int flowshm_peek(flowshm_t *f, const void **buf, size_t *len,
		 int64_t timeout_ns);
int flowshm_release(flowshm_t *f);

/*
 * Zero copy, many records: look at up to max records in place with one
 * synchronisation with the producers, then release them together.
 * recs[i].data points into the ring and stays valid until the release;
 * recs[i].producer is the identity of the producer that wrote it (see
 * flowshm_last_producer).  Waits (per timeout_ns) only for the first
 * record; *got >= 1 on 0.  A batch stops early at the end of a lap of the
 * ring, at the end of the stream, or at a record not yet committed.
 * While a batch is held, the other read calls return -EINVAL;
 * flowshm_release_batch (or flowshm_release) releases all of it: 0, or
 * -ESTALE if this consumer was cut off meanwhile (max lag): what was
 * read in place may have been overwritten.  Held records hold producers
 * back: release promptly.
 */
struct flowshm_rec {
	const void *data;
	size_t len;
	uint32_t producer;
};

int flowshm_peek_batch(flowshm_t *f, struct flowshm_rec *recs, unsigned max,
		       unsigned *got, int64_t timeout_ns);
int flowshm_release_batch(flowshm_t *f);

/*
 * The producer of the record the last recv, peek, recv_batch (its last
 * record) or peek_batch (its last record) returned: a number that is the
 * same for every record one producer handle wrote and differs between
 * producer handles attached at the same time (its attach number and pid,
 * 30 bits).  0 before any record.
 */
uint32_t flowshm_last_producer(const flowshm_t *f);

/* ---- end of stream ------------------------------------------------------- */

/*
 * Producer: this producer's stream is complete (call it after its last
 * send).  Attached through moverd: moverd is told on our control
 * connection; once every producer attached to the flow through it has
 * ended (at least one; a producer whose connection closes without ending
 * counts as gone, not as ended), or the owner runs `moverctl flow end
 * NAME`, moverd writes the end-of-stream record after every committed
 * record.  Attach every producer before the first one ends.  Consumers
 * (on this host or, across hosts, on the peer's) get every record, then
 * -ENODATA from every read call.  Later sends of any producer get -EPIPE.
 * timeout_ns matters only for a ring opened with flowshm_open_fd (no
 * moverd): the end record is written at once, waiting for room in a full
 * ring like a send; from the first try on, other producers' sends get
 * -EPIPE (no record may follow the end).  Returns 0 (also when already
 * ended), -EINVAL (not a producer, a reserve pending), -EPIPE (flow
 * closed), -EAGAIN/-ETIMEDOUT (open_fd: no room), or moverd's error
 * (-ECONNRESET, -EPIPE: moverd is gone).
 */
int flowshm_end(flowshm_t *f, int64_t timeout_ns);

/* ---- why you wait: the flow's state ------------------------------------- */

enum flowshm_flow_state {
	FLOWSHM_STATE_UNKNOWN = 0,    /* no moverd status (open_fd ring) */
	FLOWSHM_STATE_OPEN = 1,       /* moving; its peer (if any) connected */
	FLOWSHM_STATE_CONNECTING = 2, /* its peer host was never reached yet */
	FLOWSHM_STATE_PEER_DOWN = 3,  /* the link to its peer is down (since) */
	FLOWSHM_STATE_DRAINING = 4,   /* being destroyed after delivery */
	FLOWSHM_STATE_ENDED = 5,      /* end of stream written (or reached) */
	FLOWSHM_STATE_FAILED = 6,     /* failed: reason */
	FLOWSHM_STATE_CLOSED = 7,     /* destroyed */
};

enum flowshm_daemon {
	FLOWSHM_DAEMON_NONE = 0,      /* no moverd: a ring from open_fd */
	FLOWSHM_DAEMON_UP = 1,        /* our control connection is open */
	FLOWSHM_DAEMON_DOWN = 2,      /* it hung up: moverd exited or died */
	FLOWSHM_DAEMON_RESTARTED = 3, /* the ring is owned by another moverd
	                                 start than at attach: re-attach */
};

struct flowshm_state {
	enum flowshm_flow_state state;
	int reason;           /* FAILED: a negative errno, else 0 */
	uint64_t since_ns;    /* CLOCK_REALTIME ns of the last change, 0 if
	                         unknown */
	uint32_t producers;   /* attached through moverd */
	uint32_t consumers;
	uint64_t lag_bytes;   /* consumer: bytes committed it has not read;
	                         producer: bytes the slowest consumer has not
	                         read (what holds us back) */
	enum flowshm_daemon daemon;
};

/*
 * The flow's state as moverd last wrote it into the ring, corrected by
 * what the ring itself says (closed, failed, ended), the lag, and whether
 * moverd is still there.  Shared memory only, plus one poll(2) of the
 * control connection.  0 or -EINVAL.
 */
int flowshm_state(flowshm_t *f, struct flowshm_state *out);

/* A word for a state ("open", "connecting", "peer down", ...). */
const char *flowshm_state_name(enum flowshm_flow_state s);

/* ---- waiting on many flows (fan-in) -------------------------------------- */

/*
 * Wait until at least one of the consumer handles flows[0..n) has
 * something for a read call (a record, or an end: -ENODATA, -EPIPE,
 * -ESTALE, -EPROTO), and put the indexes of every such flow into
 * ready[0..*nready) (ready has room for n).  The list starts at a flow
 * that moves on by one each call, so a caller that serves only ready[0]
 * still serves every busy flow in turn: a flooded flow cannot starve the
 * others.  Sleeps in ONE system call however many flows: futex_waitv(2)
 * over the rings' wake words (Linux >= 5.16, n <= 128); on older kernels
 * or for more flows, it checks every 200 us instead (a short sleep loop).
 * Remove a flow that returned -ENODATA or -EPIPE: it stays ready.
 * Returns 0 (*nready >= 1), -EAGAIN (timeout 0, none ready), -ETIMEDOUT,
 * -EINVAL (a producer handle, n == 0 or > FLOWSHM_POLL_MAX).
 */
#define FLOWSHM_POLL_MAX 1024u
int flowshm_poll(flowshm_t *const *flows, unsigned n, unsigned *ready,
		 unsigned *nready, int64_t timeout_ns);

/*
 * A set of consumer handles with a file descriptor for event loops
 * (epoll, io_uring, asyncio's add_reader).  At most FLOWSHM_SET_MAX
 * flows (futex_waitv's 128 words, one of them the set's own).  The set
 * does not own the handles; remove a handle before closing it.  All calls
 * on one set from one thread at a time.
 */
#define FLOWSHM_SET_MAX 127u
typedef struct flowshm_set flowshm_set_t;

int flowshm_set_create(flowshm_set_t **out);
/* 0, -EINVAL (not a consumer), -EEXIST (already in), -ENOSPC (full). */
int flowshm_set_add(flowshm_set_t *s, flowshm_t *f);
/* 0 or -ENOENT. */
int flowshm_set_remove(flowshm_set_t *s, flowshm_t *f);
void flowshm_set_destroy(flowshm_set_t *s);

/*
 * flowshm_poll over the set: ready[0..*nready) are the ready handles
 * (ready has room for max), in turn as flowshm_poll.  -EINVAL for an
 * empty set.
 */
int flowshm_set_poll(flowshm_set_t *s, flowshm_t **ready, unsigned max,
		     unsigned *nready, int64_t timeout_ns);

/*
 * The set's descriptor (an eventfd; the set owns it: do not close it).
 * Edge semantics, as EPOLLET: it becomes readable when data may have
 * arrived since a flowshm_set_poll found NO flow ready.  So: when it is
 * readable, call flowshm_set_poll(s, ..., 0) and serve, again and again
 * until it returns -EAGAIN; that -EAGAIN arms the descriptor again (a
 * helper thread sleeps in futex_waitv for the set, and writes the
 * eventfd when a producer wakes it).  flowshm_set_poll reads (clears)
 * the descriptor itself.  It is readable at first, and may be readable
 * with nothing ready (a record was taken meanwhile, a flow was added or
 * removed): poll, get -EAGAIN, wait again.
 * Returns the fd, or a negative errno (-ENOSYS: the kernel has no
 * futex_waitv; -EMFILE...).
 */
int flowshm_set_fd(flowshm_set_t *s);

/* A short English description of a flowshm return code (flowmover's own
 * words for every code the API returns, else libc's). */
const char *flowshm_strerror(int rc);

#ifdef __cplusplus
}
#endif

#endif
