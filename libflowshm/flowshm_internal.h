/*
 * libflowshm/flowshm_internal.h - what moverd and the tests may use beyond
 * the public header: the handle's layout and a keyed ring constructor.
 */
#ifndef FLOWSHM_INTERNAL_H
#define FLOWSHM_INTERNAL_H

#include "flowshm.h"
#include "../ipc/ring.h"

#include <stdbool.h>

struct flowshm {
	struct fr_ring ring;
	enum flowshm_role role;
	bool reserved;          /* a reserve awaits its commit */
	struct fr_claim claim;  /* the reserved record */
	uint32_t peeked;        /* length of the peeked record, 0 if none */
	int ctl_fd;             /* attached via moverd: the control connection,
	                           open while attached so moverd sees us die */
	char name[72];          /* the flow's name (attached via moverd) */
	uint64_t epoch;         /* status epoch at attach: moverd's start */
	uint32_t last_producer; /* of the last record read */
	unsigned batch_n;       /* records of a held peek_batch, 0 if none */
	uint64_t batch_end;     /* ... the position after them */
	enum flowshm_wait wait; /* flowshm_set_wait: sleep, yield or spin */
	/* attached via moverd: on the list fork's child handler walks */
	bool listed;
	flowshm_t *attached_prev, *attached_next;
	bool forked;            /* a copy in a child of fork (fsi_forget) */
};

/* For the library's own modules (not exported: the map exports flowshm_*
 * only). */

/* One round of a spinning wait: tell the cpu we spin. */
static inline void fsi_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* f's control connection to moverd (attach.c) closes, off the list that
 * fork's child handler walks (nothing if it has none). */
void fsi_attached_close(flowshm_t *f);

/* Does the consumer f have something for a read call (a record, or an
 * end or error)?  Runs fr_peek: the caller owns f (its thread). */
bool fsi_ready(flowshm_t *f);

/* A producer's timed-out wait: -ETIMEDOUT, -ENOTCONN or -EHOSTDOWN
 * (state.c; see flowshm.h). */
int fsi_why_timeout(flowshm_t *f);

/* Read the status epoch the ring has now (0 if none): kept at attach. */
uint64_t fsi_epoch(const flowshm_t *f);

/*
 * Like flowshm_ring_create, with a given seal key (0 = random) and first
 * position.  A deposit ring takes the key and position of the producer ring
 * it mirrors, so that spans copied byte for byte carry valid seals.
 */
int flowshm_ring_create_keyed(const struct flowshm_ring_params *params,
			      const char *path, uint64_t seal_key,
			      uint64_t start, int *fd);

/*
 * The same, as a new file `name` in directory dirfd: created with O_EXCL
 * and O_NOFOLLOW (a link or any file already there fails with -EEXIST,
 * nothing is written through it), mode 0600; removed again on failure.
 */
int flowshm_ring_create_at(const struct flowshm_ring_params *params,
			   int dirfd, const char *name, uint64_t seal_key,
			   uint64_t start, int *fd);

/* What moverd said at attach of the client's pid (ipc/ring.h, Liveness):
 * its pid as moverd sees it and moverd's pid namespace.  pid 0: nothing
 * said (no moverd, or an older one): the client's own pids, as before. */
struct fsi_pid_view {
	uint32_t pid;
	uint64_t pid_ns;
};

/*
 * flowshm_open_fd for an attach through moverd: a consumer adopts the
 * subscriber slot moverd took for it, a producer the producer slot (slot
 * >= 0, with its gen), or takes one itself (slot < 0).  -ESTALE if the
 * slot is no longer ours.  moverd's own view of a ring takes no slot here:
 * see flowshm_open_view.
 */
int flowshm_open_attached(int fd, enum flowshm_role role,
			  const struct flowshm_opts *opts, int slot,
			  uint64_t gen, const struct fsi_pid_view *view,
			  flowshm_t **out);

/*
 * moverd's own view of a ring, with no slot (it subscribes with a slot of
 * its own, fr_sub_take_held, and names its END claims in a slot taken for
 * each, fr_write_end).  mapped() runs between the mmap and the first read
 * of the mapping, so that moverd guards it before a client that shrank
 * the file can fault it (moverd/ring_guard.h).  If the open then fails,
 * the mapping is gone: the caller drops its guard.
 */
int flowshm_open_view(int fd, void (*mapped)(void *map, size_t bytes,
					     void *arg),
		      void *arg, flowshm_t **out);

/*
 * moverd's orderly stop: flowshm_close, but the subscriber slot its view
 * holds (fr_sub_take_held) is not given back, as at a crash.  It keeps
 * the producers behind what the peer has not acknowledged until the next
 * start, which takes a slot of its own at the slowest position first and
 * then gives this one back (its holder is dead by then).  Given back
 * here, the slot of a peer that was behind (down, or slower than another
 * subscriber) let producers write over records that peer never got.
 */
void flowshm_close_held(flowshm_t *f);

/* Map moverd's doorbell page (ipc/bell.h) from bell_fd and ring bit index
 * after commits when moverd armed the ring; 0 or -EPROTO / -errno. */
int flowshm_use_bell(flowshm_t *f, int bell_fd, uint32_t index);

#endif
