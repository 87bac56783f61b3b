/*
 * libflowshm/flowshm.c - the client library over the shared ring (ipc/ring.h).
 * Fast paths are one claim + copy + commit, or one peek + copy + release;
 * waiting spins briefly, yields, then sleeps on the ring's futex.
 */
#include "flowshm.h"
#include "flowshm_internal.h"
#include "../ipc/bell.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_RECOVER_NS 2000000000ull
#define SPIN_ROUNDS  2048u
#define YIELD_ROUNDS 16u
/*
 * A consumer of a deposit ring (records from another host, written by
 * moverd) spins ~2 us and sleeps: its records come at network latency, so
 * the ~65 us of spinning and the 16 yields above never paid there, and on
 * a small host they took the cpu the daemons needed to deliver (issue 12,
 * 2-vCPU host: ping-pong one-way p50 -40-50%, 55-70 us less cpu per
 * exchange in each client; 64 rounds against 256: ping-pong one-way p50
 * 37.8 against 48.6 us, median of 5 interleaved runs, paced and sparse
 * alike).  Local rings keep the long spin: a consumer there is woken by a
 * producer's futex wake per record once it sleeps.
 */
#define DEPOSIT_SPIN_ROUNDS  64u
#define DEPOSIT_YIELD_ROUNDS 0u
#define BATCH_CHUNK  64u

/* ---- waiting ------------------------------------------------------------ */

struct waiter {
	int64_t timeout_ns;
	uint64_t deadline_ns;
	unsigned round;
	uint64_t full_since_ns; /* a polling wait for room began (0: none) */
};

enum wait_for { WAIT_SPACE, WAIT_DATA };

static bool past_deadline(const struct waiter *w)
{
	return w->deadline_ns != UINT64_MAX && fr_now_ns() >= w->deadline_ns;
}

/*
 * FLOWSHM_WAIT_YIELD and _SPIN, past the first spin: poll again, never
 * sleep.  A polling end is not counted among the sleepers (consumers_ or
 * producers_waiting): the other end would then make a futex wake, a
 * system call, for every record or release.  What a sleeper's count gets
 * it still gets: a consumer's position, published on each empty poll while
 * producers wait (fr_peek), and for a producer the hint that makes the
 * subscribers publish at their next release (fr_want_space).
 */
static int keep_polling(flowshm_t *f, struct waiter *w, enum wait_for what)
{
	if (what == WAIT_SPACE) {
		if (!w->full_since_ns)
			w->full_since_ns = fr_now_ns();
		fr_want_space(&f->ring);
	}
	if (f->wait == FLOWSHM_WAIT_YIELD)
		sched_yield();
	else
		fsi_cpu_relax();
	return 0;
}

/* One step of back-off: 0 = try again, else -EAGAIN or -ETIMEDOUT. */
static int backoff(flowshm_t *f, struct waiter *w, enum wait_for what)
{
	bool deposit = what == WAIT_DATA && f->ring.mode == FR_MODE_DEPOSIT;
	unsigned spin = deposit ? DEPOSIT_SPIN_ROUNDS : SPIN_ROUNDS;
	unsigned yield = deposit ? DEPOSIT_YIELD_ROUNDS : YIELD_ROUNDS;

	if (w->timeout_ns == 0) {
		/* full, and we give up: the subscribers publish at once */
		if (what == WAIT_SPACE)
			fr_want_space(&f->ring);
		return -EAGAIN;
	}
	if (w->round++ == 0)
		w->deadline_ns = w->timeout_ns < 0 ?
					 UINT64_MAX :
					 fr_now_ns() + (uint64_t)w->timeout_ns;
	if (w->round % 256 == 0 && past_deadline(w))
		return -ETIMEDOUT;
	if (w->round < spin) {
		fsi_cpu_relax();
		return 0;
	}
	if (past_deadline(w))
		return -ETIMEDOUT;
	if (f->wait != FLOWSHM_WAIT_SLEEP)
		return keep_polling(f, w, what);
	if (w->round < spin + yield) {
		sched_yield();
		return 0;
	}
	return what == WAIT_SPACE ? fr_wait_space(&f->ring, w->deadline_ns) :
				    fr_wait_data(&f->ring, w->deadline_ns);
}

/* ---- rings as file descriptors ------------------------------------------- */

static int params_to_fr(const struct flowshm_ring_params *p,
			uint64_t seal_key, uint64_t start, struct fr_params *out)
{
	if (!p || (p->flags & ~(FLOWSHM_RING_DEPOSIT | FLOWSHM_RING_LAZY)))
		return -EINVAL;
	*out = (struct fr_params){
		.ring_bytes = p->ring_size,
		.max_record = p->max_record,
		.mode = (p->flags & FLOWSHM_RING_DEPOSIT) ? FR_MODE_DEPOSIT :
							    FR_MODE_LOCAL,
		.seal_key = seal_key,
		.start = start,
	};
	return fr_params_check(out);
}

/* len bytes of buf at the start of fd: 0 or -errno. */
static int write_at_start(int fd, const void *buf, size_t len)
{
	for (size_t done = 0; done < len;) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done,
				   (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		done += (size_t)n;
	}
	return 0;
}

/*
 * fallocate the whole ring.  On tmpfs it is interruptible, and pending
 * io_uring task work (moverd) counts as a signal: retry, and if it keeps
 * being interrupted, let the pages fault in lazily.  Only a real shortage
 * (ENOSPC, ENOMEM) is an error.
 */
static int preallocate(int fd, size_t bytes)
{
	for (int i = 0; i < 64; i++) {
		if (!fallocate(fd, 0, 0, (off_t)bytes))
			return 0;
		if (errno != EINTR)
			return errno == ENOSPC || errno == ENOMEM ? -1 : 0;
	}
	return 0;
}

/* Size, allocate (unless FLOWSHM_RING_LAZY) and format the new ring file
 * or memfd fd; 0 or -errno (the caller closes fd and removes the file). */
static int ring_init(int fd, const struct fr_params *pp, uint32_t flags,
		     bool sealed)
{
	struct fr_params p = *pp;
	size_t bytes = fr_map_bytes(p.ring_bytes);
	void *map;
	int rc;

	if (ftruncate(fd, (off_t)bytes))
		return -errno;
	/*
	 * Allocate every page now: a ring's first lap would otherwise pay a
	 * page allocation and zeroing per 4 KiB inside the data path (on
	 * 2 cores, 8 fresh 64 MiB flows ran at 0.2 GB/s for their first
	 * seconds).  Memory a ring may use is committed up front, where a
	 * shortage is a clear error at creation rather than SIGBUS later.
	 */
	if (!(flags & FLOWSHM_RING_LAZY) && preallocate(fd, bytes))
		return -errno;
	/* the control pages alone (fr_format writes nothing else), built
	 * in memory and written: a store through a mapping of a lazy ring
	 * whose filesystem filled meanwhile was SIGBUS in the caller (in
	 * moverd, outside its ring guard); a write is -ENOSPC.  Not mapped
	 * either: a fault with readahead on a file on disk read (zeroed)
	 * the whole ring's pages in the caller's time (75% of moverd's time
	 * creating 4 MiB rings in an ext4 state directory) */
	map = calloc(1, FR_CTRL_BYTES);
	if (!map)
		return -ENOMEM;
	fr_format(map, &p);
	rc = write_at_start(fd, map, FR_CTRL_BYTES);
	free(map);
	if (rc)
		return rc;
	/* A sealed size: no holder of the fd can truncate it under another
	 * process's mapping (which would turn its next access into SIGBUS). */
	if (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW |
						     F_SEAL_SEAL))
		return -errno;
	return 0;
}

int flowshm_ring_create_keyed(const struct flowshm_ring_params *params,
			      const char *path, uint64_t seal_key,
			      uint64_t start, int *fd_out)
{
	struct fr_params p;
	int fd, rc = params_to_fr(params, seal_key, start, &p);

	if (rc || !fd_out)
		return rc ? rc : -EINVAL;
	fd = path ? open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600) :
		    memfd_create("flowmover-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	rc = ring_init(fd, &p, params->flags, !path);
	if (rc) {
		close(fd);
		if (path)
			unlink(path);
		return rc;
	}
	*fd_out = fd;
	return 0;
}

int flowshm_ring_create_at(const struct flowshm_ring_params *params,
			   int dirfd, const char *name, uint64_t seal_key,
			   uint64_t start, int *fd_out)
{
	struct fr_params p;
	int fd, rc = params_to_fr(params, seal_key, start, &p);

	if (rc || !fd_out || !name)
		return rc ? rc : -EINVAL;
	fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW |
		    O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	rc = ring_init(fd, &p, params->flags, false);
	if (rc) {
		close(fd);
		unlinkat(dirfd, name, 0);
		return rc;
	}
	*fd_out = fd;
	return 0;
}

int flowshm_ring_create(const struct flowshm_ring_params *params,
			const char *path, int *fd)
{
	return flowshm_ring_create_keyed(params, path, 0, 0, fd);
}

/* Map the ring behind fd and open an end of it, without a subscriber slot. */
static int open_map(int fd, enum flowshm_role role,
		    const struct flowshm_opts *opts,
		    void (*mapped)(void *map, size_t bytes, void *arg),
		    void *arg, flowshm_t **out)
{
	struct stat st;
	flowshm_t *f;
	void *map;
	int rc;

	if (!out || (role != FLOWSHM_PRODUCER && role != FLOWSHM_CONSUMER))
		return -EINVAL;
	if (fstat(fd, &st))
		return -errno;
	if (st.st_size < (off_t)(FR_CTRL_BYTES + FR_MIN_RING) ||
	    (uint64_t)st.st_size > fr_map_bytes(FR_MAX_RING))
		return -EPROTO;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
		   fd, 0);
	if (map == MAP_FAILED) {
		rc = -errno;
		free(f);
		return rc;
	}
	if (mapped)
		mapped(map, (size_t)st.st_size, arg);
	rc = fr_attach(&f->ring, map, (size_t)st.st_size);
	if (rc) {
		munmap(map, (size_t)st.st_size);
		free(f);
		return rc;
	}
	f->role = role;
	f->ctl_fd = -1;
	f->ring.recover_ns = DEFAULT_RECOVER_NS;
	if (opts && opts->recover_ns)
		f->ring.recover_ns = opts->recover_ns == UINT64_MAX ?
					     0 : opts->recover_ns;
	/* a producer's records carry its identity: pid and attach number */
	if (role == FLOWSHM_PRODUCER)
		fr_producer_number(&f->ring);
	*out = f;
	return 0;
}

static void unmap(flowshm_t *f)
{
	munmap(f->ring.sh, f->ring.map_bytes);
	if (f->ring.bell)
		munmap(f->ring.bell, FB_BYTES);
	free(f);
}

/* A producer names its claims in a slot (ipc/ring.h, Producer slots):
 * the one moverd took for us, or one of our own without moverd (the ring
 * takes it back once we are dead, if it runs out). */
static int producer_slot(struct fr_ring *r, int slot, uint64_t gen)
{
	unsigned mine;
	uint32_t g;
	int rc;

	if (slot >= 0)
		return gen > UINT32_MAX ? -EPROTO :
					  fr_prod_adopt(r, (unsigned)slot,
							(uint32_t)gen);
	rc = fr_prod_take(r, r->self_pid, &mine, &g);
	return rc ? rc : fr_prod_adopt(r, mine, g);
}

/* Does moverd judge pids in our pid namespace?  Unsure is no. */
static bool same_pid_ns(const struct fsi_pid_view *view)
{
	return view->pid == (uint32_t)getpid() &&
	       (!view->pid_ns || view->pid_ns == fr_pid_ns());
}

int flowshm_open_attached(int fd, enum flowshm_role role,
			  const struct flowshm_opts *opts, int slot,
			  uint64_t gen, const struct fsi_pid_view *view,
			  flowshm_t **out)
{
	unsigned mine;
	int rc = open_map(fd, role, opts, NULL, NULL, out);

	if (rc)
		return rc;
	/* before any slot: the pid we write, and whether we may judge */
	if (view && view->pid)
		fr_pid_view(&(*out)->ring, view->pid, same_pid_ns(view));
	if (role == FLOWSHM_PRODUCER) {
		rc = producer_slot(&(*out)->ring, slot, gen);
	} else if (slot >= 0) {
		/* moverd took the slot for us (and gives it back when our
		 * control connection closes) */
		rc = fr_sub_adopt(&(*out)->ring, (unsigned)slot, gen);
	} else {
		/* no moverd: this handle is the subscriber's only owner */
		rc = fr_sub_take(&(*out)->ring, (*out)->ring.self_pid, &mine,
				 &gen);
		if (!rc)
			rc = fr_sub_adopt(&(*out)->ring, mine, gen);
	}
	if (rc) {
		unmap(*out);
		*out = NULL;
	}
	return rc;
}

int flowshm_open_view(int fd, void (*mapped)(void *map, size_t bytes,
					     void *arg),
		      void *arg, flowshm_t **out)
{
	return open_map(fd, FLOWSHM_PRODUCER, NULL, mapped, arg, out);
}

int flowshm_open_fd(int fd, enum flowshm_role role,
		    const struct flowshm_opts *opts, flowshm_t **out)
{
	return flowshm_open_attached(fd, role, opts, -1, 0, NULL, out);
}

int flowshm_use_bell(flowshm_t *f, int bell_fd, uint32_t index)
{
	struct fr_bell *b;

	if (index >= FB_BITS)
		return -EPROTO;
	b = mmap(NULL, FB_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, bell_fd, 0);
	if (b == MAP_FAILED)
		return -errno;
	if (fb_check(b, FB_BYTES)) {
		munmap(b, FB_BYTES);
		return -EPROTO;
	}
	if (f->ring.bell)
		munmap(f->ring.bell, FB_BYTES);
	f->ring.bell = b;
	f->ring.bell_index = index;
	return 0;
}

void flowshm_close(flowshm_t *f)
{
	if (!f)
		return;
	if (f->forked) { /* a child's copy: the slots are the parent's */
		fsi_attached_close(f);
		unmap(f);
		return;
	}
	if (f->reserved) /* never committed: nothing, not a stuck claim */
		fr_cancel(&f->ring, &f->claim);
	/* our slot goes back (the last reads published first); moverd's
	 * own leave at our disconnect is then a no-op (same gen) */
	if (f->ring.sub < FR_MAX_SUBS)
		fr_sub_leave(&f->ring, f->ring.sub, f->ring.sub_gen);
	if (f->ring.prod < FR_MAX_PRODS)
		fr_prod_leave(&f->ring, f->ring.prod, f->ring.prod_gen);
	fr_count_flush(&f->ring); /* our claims, before moverd sees us go */
	fsi_attached_close(f);
	unmap(f);
}

void flowshm_close_held(flowshm_t *f)
{
	if (f && f->ring.sub < FR_MAX_SUBS) {
		fr_sub_publish(&f->ring); /* the last acknowledgements count */
		f->ring.sub = FR_MAX_SUBS; /* so flowshm_close leaves it be */
	}
	flowshm_close(f);
}

void flowshm_shutdown(flowshm_t *f)
{
	if (f)
		fr_close(&f->ring);
}

int flowshm_info(flowshm_t *f, struct flowshm_info *out)
{
	struct fr_shared *sh;

	if (!f || !out)
		return -EINVAL;
	sh = f->ring.sh;
	*out = (struct flowshm_info){
		.ring_size = f->ring.size,
		.max_record = f->ring.max_record,
		.flags = f->ring.mode == FR_MODE_DEPOSIT ? FLOWSHM_RING_DEPOSIT : 0,
		.head = f->ring.sub < FR_MAX_SUBS ? f->ring.head :
						    fr_min_pos(&f->ring),
		.tail = atomic_load_explicit(&sh->tail, memory_order_acquire),
		.closed = fr_closed(&f->ring),
		.recovered = atomic_load_explicit(&sh->recovered,
						  memory_order_relaxed),
	};
	if (f->ring.mode == FR_MODE_DEPOSIT)
		out->tail = atomic_load_explicit(&sh->published,
						 memory_order_acquire);
	return 0;
}

int flowshm_set_wait(flowshm_t *f, enum flowshm_wait wait)
{
	if (!f || (wait != FLOWSHM_WAIT_SLEEP && wait != FLOWSHM_WAIT_YIELD &&
		   wait != FLOWSHM_WAIT_SPIN))
		return -EINVAL;
	f->wait = wait;
	return 0;
}

/* ---- producer ------------------------------------------------------------ */

static int check_producer(flowshm_t *f)
{
	if (!f || f->role != FLOWSHM_PRODUCER || f->reserved)
		return -EINVAL;
	/* deposit rings are written by moverd only */
	return f->ring.mode == FR_MODE_DEPOSIT ? -EINVAL : 0;
}

static int check_len(const flowshm_t *f, size_t len)
{
	if (len == 0)
		return -EINVAL;
	return len > f->ring.max_record ? -EMSGSIZE : 0;
}

/* Claim room for lens[0..n), waiting per the waiter when none fits. */
static int claim_wait(flowshm_t *f, const uint32_t *lens, unsigned n,
		      struct fr_claim *c, struct waiter *w)
{
	for (;;) {
		int rc = fr_claim(&f->ring, lens, n, c);

		if (rc != -EAGAIN)
			return rc;
		rc = backoff(f, w, WAIT_SPACE);
		/* a timed-out producer is told why it was held back */
		if (rc == -ETIMEDOUT)
			return fsi_why_timeout(f);
		if (rc)
			return rc;
	}
}

static int claim(flowshm_t *f, const uint32_t *lens, unsigned n,
		 struct fr_claim *c, struct waiter *w)
{
	int rc = claim_wait(f, lens, n, c, w);

	/* a polling wait is back-pressure as much as a sleep is; noted
	 * once (a batch's next chunk claims with the same waiter) */
	if (w->full_since_ns)
		fr_note_full(&f->ring, w->full_since_ns);
	w->full_since_ns = 0;
	return rc;
}

static void *payload(const struct fr_ring *r, uint64_t pos)
{
	return fr_rec_at(r, pos) + 1;
}

int flowshm_send(flowshm_t *f, const void *data, size_t len,
		 int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	struct fr_claim c;
	uint32_t l;
	int rc = check_producer(f);

	if (rc || (rc = check_len(f, len)))
		return rc;
	if (!data)
		return -EINVAL;
	l = (uint32_t)len;
	rc = claim(f, &l, 1, &c, &w);
	if (rc)
		return rc;
	memcpy(payload(&f->ring, c.pos), data, len);
	fr_commit(&f->ring, &c);
	return 0;
}

int flowshm_send_batch(flowshm_t *f, const struct iovec *recs, unsigned n,
		       unsigned *sent, int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	uint32_t lens[BATCH_CHUNK];
	unsigned done = 0;
	int rc = check_producer(f);

	if (rc || !recs || !sent || n == 0)
		return rc ? rc : -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		if (!recs[i].iov_base || (rc = check_len(f, recs[i].iov_len)))
			return rc ? rc : -EINVAL;
	}
	while (done < n) {
		unsigned chunk = n - done < BATCH_CHUNK ? n - done : BATCH_CHUNK;
		struct fr_claim c;
		uint64_t p;

		for (unsigned i = 0; i < chunk; i++)
			lens[i] = (uint32_t)recs[done + i].iov_len;
		rc = claim(f, lens, chunk, &c, &w);
		if (rc)
			break;
		p = c.pos;
		for (unsigned i = 0; i < c.n; i++) {
			memcpy(payload(&f->ring, p), recs[done + i].iov_base,
			       lens[i]);
			p += fr_record_bytes(lens[i]);
		}
		fr_commit(&f->ring, &c);
		done += c.n;
		w.timeout_ns = 0; /* wait only for the first record */
	}
	*sent = done;
	return done ? 0 : rc;
}

int flowshm_reserve(flowshm_t *f, size_t len, void **buf, int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	uint32_t l;
	int rc = check_producer(f);

	if (rc || (rc = check_len(f, len)))
		return rc;
	if (!buf)
		return -EINVAL;
	l = (uint32_t)len;
	rc = claim(f, &l, 1, &f->claim, &w);
	if (rc)
		return rc;
	f->reserved = true;
	*buf = payload(&f->ring, f->claim.pos);
	return 0;
}

int flowshm_commit(flowshm_t *f)
{
	if (!f || f->role != FLOWSHM_PRODUCER || !f->reserved)
		return -EINVAL;
	fr_commit(&f->ring, &f->claim);
	f->reserved = false;
	return 0;
}

/* ---- consumer ------------------------------------------------------------ */

/* Wait (per w) for the next record; on 0 *rec and *len describe it.
 * -EINVAL while a peek_batch is held: its records are not released. */
static int next_record(flowshm_t *f, const struct fr_rec **rec, uint32_t *len,
		       struct waiter *w)
{
	if (!f || f->role != FLOWSHM_CONSUMER || f->batch_n)
		return -EINVAL;
	for (;;) {
		int rc = fr_peek(&f->ring, rec, len);

		if (rc != -EAGAIN)
			return rc;
		rc = backoff(f, w, WAIT_DATA);
		if (rc)
			return rc;
	}
}

int flowshm_recv(flowshm_t *f, void *buf, size_t cap, size_t *len,
		 int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	const struct fr_rec *rec;
	uint32_t l;
	int rc;

	/* a peeked record is the caller's until its release: copying it
	 * out here too released it twice (the next record skipped) */
	if (!len || (!buf && cap) || (f && f->peeked))
		return -EINVAL;
	rc = next_record(f, &rec, &l, &w);
	if (rc)
		return rc;
	*len = l;
	if (l > cap)
		return -EMSGSIZE;
	memcpy(buf, rec + 1, l);
	/* cut off (max_lag) while copying: what we copied may be torn */
	if (fr_sub_lost(&f->ring))
		return -ESTALE;
	f->last_producer = fr_rec_producer(rec);
	f->ring.records++;
	fr_release(&f->ring, f->ring.head + fr_record_bytes(l));
	return 0;
}

int flowshm_recv_batch(flowshm_t *f, void *buf, size_t cap,
		       struct iovec *recs, unsigned max, unsigned *got,
		       int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	unsigned char *out = buf;
	size_t used = 0;
	unsigned n = 0;
	int rc = 0;

	if (!buf || !recs || !got || max == 0 || (f && f->peeked))
		return -EINVAL;
	while (n < max) {
		const struct fr_rec *rec;
		uint32_t l;

		rc = next_record(f, &rec, &l, &w);
		if (rc)
			break;
		if (l > cap - used) {
			if (n == 0) {
				recs[0].iov_len = l;
				rc = -EMSGSIZE;
			}
			break;
		}
		memcpy(out + used, rec + 1, l);
		f->last_producer = fr_rec_producer(rec);
		recs[n++] = (struct iovec){ .iov_base = out + used, .iov_len = l };
		used += (l + 7u) & ~(size_t)7u;
		if (used > cap)
			used = cap;
		/* consume privately; released once below */
		f->ring.head += fr_record_bytes(l);
		f->ring.records++;
		w.timeout_ns = 0;
	}
	if (n && fr_sub_lost(&f->ring))
		return -ESTALE; /* cut off while copying */
	if (n)
		fr_release(&f->ring, f->ring.head);
	*got = n;
	return n ? 0 : rc;
}

int flowshm_peek(flowshm_t *f, const void **buf, size_t *len,
		 int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	const struct fr_rec *rec;
	uint32_t l;
	int rc;

	if (!buf || !len)
		return -EINVAL;
	rc = next_record(f, &rec, &l, &w);
	if (rc)
		return rc;
	f->last_producer = fr_rec_producer(rec);
	f->peeked = l;
	*buf = rec + 1;
	*len = l;
	return 0;
}

/*
 * An explicit release (peek/release, peek_batch/release_batch: the
 * zero-copy reads a stage uses to be exactly once) is published at once,
 * not lazily: a consumer killed after it released a record must not see
 * that record handed to the next consumer.  One store (and the wake
 * protocol's fence) per release call; recv and recv_batch, which copy out
 * and so cannot be exactly once across their caller's crash anyway, keep
 * the lazy publication (ring.h, "Subscribers").
 */
static void publish_released(flowshm_t *f)
{
	if (f->ring.head != f->ring.head_pub)
		fr_sub_publish(&f->ring);
}

int flowshm_release(flowshm_t *f)
{
	uint32_t l;

	if (f && f->batch_n)
		return flowshm_release_batch(f);
	if (!f || f->role != FLOWSHM_CONSUMER || !f->peeked)
		return -EINVAL;
	l = f->peeked;
	f->peeked = 0;
	/* cut off (max_lag) while the caller read in place: what it read
	 * may have been overwritten; nothing of ours is left to release */
	if (fr_sub_lost(&f->ring))
		return -ESTALE;
	f->ring.records++;
	fr_release(&f->ring, f->ring.head + fr_record_bytes(l));
	publish_released(f);
	return 0;
}

/*
 * The next record of a held batch at pos, without waiting and without
 * releasing anything: only a committed data record lying wholly below
 * what is published (avail, deposit rings).  Anything else (the pad at
 * the end of a lap, the end record, a record not committed yet, a header
 * that makes no sense) ends the batch here; the next read call meets it
 * through fr_peek, which skips, recovers or reports it.  fr_peek itself
 * is not used past the first record: skipping a pad releases it, and
 * that could publish our position past records the caller still reads.
 */
static bool batch_next(const struct fr_ring *r, uint64_t pos, uint64_t avail,
		       const struct fr_rec **rec, uint32_t *len)
{
	struct fr_rec *h = fr_rec_at(r, pos);
	uint32_t l, info;

	if (r->mode == FR_MODE_DEPOSIT && (pos >= avail ||
					   avail - pos < FR_REC_HDR))
		return false;
	/* acquire: pairs with the producer's release of COMMITTED, so the
	 * len, info and payload read after it are the committed ones */
	if (atomic_load_explicit(&h->seal, memory_order_acquire) !=
	    fr_seal(r, pos, FR_SEAL_COMMITTED))
		return false;
	l = atomic_load_explicit(&h->len, memory_order_relaxed);
	info = atomic_load_explicit(&h->info, memory_order_relaxed);
	if (info & (FR_INFO_PAD | FR_INFO_CTRL))
		return false;
	if (l == 0 || l > r->max_record ||
	    fr_record_bytes(l) > fr_lap_rest(r, pos))
		return false;
	if (r->mode == FR_MODE_DEPOSIT && fr_record_bytes(l) > avail - pos)
		return false;
	*rec = h;
	*len = l;
	return true;
}

int flowshm_peek_batch(flowshm_t *f, struct flowshm_rec *recs, unsigned max,
		       unsigned *got, int64_t timeout_ns)
{
	struct waiter w = { .timeout_ns = timeout_ns };
	const struct fr_rec *rec;
	uint64_t pos, avail = 0;
	unsigned n = 0;
	uint32_t l;
	int rc;

	if (!recs || !got || max == 0 || (f && f->peeked))
		return -EINVAL;
	rc = next_record(f, &rec, &l, &w);
	if (rc)
		return rc;
	/* the one synchronisation of the batch: what moverd has published
	 * (acquire: the deposited bytes below it are visible); local rings
	 * need none beyond each record's seal */
	if (f->ring.mode == FR_MODE_DEPOSIT)
		avail = atomic_load_explicit(&f->ring.sh->published,
					     memory_order_acquire);
	pos = f->ring.head;
	do {
		recs[n++] = (struct flowshm_rec){ .data = rec + 1, .len = l,
						  .producer = fr_rec_producer(rec) };
		pos += fr_record_bytes(l);
	} while (n < max && batch_next(&f->ring, pos, avail, &rec, &l));
	/* the private head stays at the first record until the release:
	 * nothing publishes a position past records still in use */
	f->last_producer = recs[n - 1].producer;
	f->batch_n = n;
	f->batch_end = pos;
	*got = n;
	return 0;
}

int flowshm_release_batch(flowshm_t *f)
{
	unsigned n;

	if (!f || f->role != FLOWSHM_CONSUMER || !f->batch_n)
		return -EINVAL;
	n = f->batch_n;
	f->batch_n = 0;
	/* cut off (max_lag) while the caller read in place: what it read
	 * may have been overwritten; nothing of ours is left to release */
	if (fr_sub_lost(&f->ring))
		return -ESTALE;
	f->ring.records += n;
	fr_release(&f->ring, f->batch_end);
	publish_released(f);
	return 0;
}

uint32_t flowshm_last_producer(const flowshm_t *f)
{
	return f ? f->last_producer : 0;
}

bool fsi_ready(flowshm_t *f)
{
	const struct fr_rec *rec;
	uint32_t len;

	if (f->batch_n || f->peeked)
		return true;
	return fr_peek(&f->ring, &rec, &len) != -EAGAIN;
}

const char *flowshm_strerror(int rc)
{
	switch (rc) {
	case 0: return "success";
	case -EAGAIN: return "ring full or empty, try again";
	case -ETIMEDOUT: return "timed out: back-pressured by a slow consumer "
				"(producer), or nothing arrived (consumer)";
	case -ENOTCONN: return "the flow's link to its peer host is down or "
			       "not connected yet";
	case -EHOSTDOWN: return "moverd is gone (its control connection hung "
				"up) and the ring is full";
	case -EMSGSIZE: return "record too large";
	case -EPIPE: return "flow closed (or its stream ended: no more sends)";
	case -ENODATA: return "end of stream: every record was delivered";
	case -ESTALE: return "this consumer fell further behind than the "
			     "flow's max lag and was cut off: attach again";
	case -EPROTO: return "ring corrupt or incompatible version";
	case -EINVAL: return "invalid argument";
	case -ENOENT: return "no such flow";
	case -EACCES: return "permission denied";
	case -ECONNREFUSED: return "moverd is not running";
	case -EBUSY: return "every subscriber slot of the flow is taken";
	case -ENOSPC: return "a limit of moverd's is reached (flows, "
			     "attachments or memory for rings), or no space "
			     "is left for the ring's file";
	case -EDQUOT: return "over your quota of flows or ring bytes";
	case -ENOMEM: return "out of memory";
	case -EEXIST: return "a flow of that name exists (or the handle is "
			     "already in the set)";
	case -ECONNRESET: return "moverd closed the control connection";
	case -ENOSYS: return "the kernel lacks futex_waitv (Linux 5.16)";
	default: return strerror(-rc);
	}
}
