/*
 * flowshm.h - the flowmover client library.
 *
 * Applications move records by touching only shared memory: a producer
 * sends records into a flow's ring, a consumer receives them.  The library
 * is lock-free and makes no system call on the fast path; it sleeps on a
 * futex only when asked to wait and the ring stays full (or empty).
 *
 * Every function returns 0 on success or a negative errno that tells the
 * caller what to do next:
 *   -EAGAIN     ring full (send) or empty (recv): try again later
 *   -ETIMEDOUT  the wait you asked for ran out
 *   -EMSGSIZE   record larger than the flow's maximum (send), or larger
 *               than your buffer (recv: *len says how large; nothing lost)
 *   -EPIPE      the flow is closed (recv: and fully drained)
 *   -EPROTO     the ring is corrupt or of another version: stop using it
 *   -ENODATA    recv: the end of the stream (every record before it was
 *               received); from then on
 *   -ESTALE     recv: this consumer fell more than the flow's max lag
 *               behind and was cut off; close and attach again
 *   -EINVAL     bad argument (zero length, wrong role, misuse of reserve)
 *
 * Timeouts are in nanoseconds: 0 = try once, negative = wait forever.
 *
 * A handle belongs to one thread at a time and must not be used across
 * fork(); open a new one in the child.
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

/* Options when opening an end; NULL means defaults. */
struct flowshm_opts {
	/*
	 * Consumer: how long a record may stay claimed but uncommitted before
	 * the consumer checks whether its producer died and, if so, turns it
	 * into padding.  0 = default (2 s); UINT64_MAX = never.
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
 *   -EBUSY         all 16 subscriber slots (consumers) of the flow taken
 *   -EINVAL        bad name or role
 * flowshm_attach_error() then says why in words.
 */
int flowshm_attach(const char *flow_name, enum flowshm_role role,
		   const struct flowshm_opts *opts, flowshm_t **out);

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

/* Zero copy: look at the next record in place, then release it. */
int flowshm_peek(flowshm_t *f, const void **buf, size_t *len,
		 int64_t timeout_ns);
int flowshm_release(flowshm_t *f);

/* A short English description of a flowshm return code. */
const char *flowshm_strerror(int rc);

#ifdef __cplusplus
}
#endif

#endif
