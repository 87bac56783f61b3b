/*
 * moverd/counters.c - the counters file (ipc/counters.h): created beside
 * the socket, filled by a sampler that runs on moverd's loop.
 *
 * Why a sampler rather than counting into the file: the duty cycle counts
 * in moverd's own structures (struct flow, struct peer, stats.h) with
 * plain increments on lines no other process reads; copying them ten
 * times a second costs a few microseconds per hundred flows and keeps
 * every reader's cache misses off the mover's lines.  The sampler is the
 * file's only writer, so a record needs no atomic read-modify-write: a
 * sequence lock per record (fmc_begin/fmc_end) is all a reader needs.
 */
#include "counters.h"
#include "control.h"
#include "flows.h"
#include "log.h"
#include "mover.h"
#include "peer.h"
#include "peer_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SLOW_NS 1000000000ull   /* getrusage and the fd count: 1/s */

/* What moverd's own hand changes in a flow's record (record_current). */
struct flow_own {
	uint64_t bytes_sent, bytes_acked, remote_head, batches, records_sent,
		 records_deposited, reconnects, resumes;
	uint32_t producers, consumers;
};

/* What the sampler remembers of each flow record between passes. */
struct flow_shadow {
	uint32_t state;
	char reason[160];         /* as last seen */
	char last_error[160];     /* the last reason that was not "" */
	uint64_t since_ns, error_ns;
	/* subscriber slots: the holder (gen) and records last seen, and
	 * every record they took, summed (a counter that never goes back
	 * when a subscriber leaves and another takes its slot) */
	uint64_t sub_gen[FMC_SUBS], sub_records[FMC_SUBS];
	uint64_t records_consumed;
	uint32_t sub_written;     /* slots whose values are not all 0 */
	struct flow_own own;      /* as last written (record_current) */
};

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int counters_open(struct counters *c, int dirfd, const char *name,
		  unsigned max_flows)
{
	uint32_t n_flow = max_flows < FMC_MAX_FLOW_RECS ? max_flows :
							  FMC_MAX_FLOW_RECS;
	size_t bytes = fmc_file_bytes(n_flow, FMC_PEER_RECS);
	struct fmc_header *h;
	int fd;

	*c = (struct counters){ .dirfd = -1 };
	snprintf(c->name, sizeof(c->name), "%s", name);
	/* a new inode: readers of the last moverd's file keep theirs */
	if (unlinkat(dirfd, name, 0) && errno != ENOENT)
		log_warn("counters: cannot remove the old %s: %s", name,
			 strerror(errno));
	fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW |
		    O_CLOEXEC, 0640);
	if (fd < 0) {
		log_warn("counters: cannot create %s: %s", name,
			 strerror(errno));
		return -1;
	}
	/* 0640 whatever the umask: an operator's file (ipc/counters.h) */
	if (fchmod(fd, 0640) || ftruncate(fd, (off_t)bytes)) {
		log_warn("counters: %s: %s", name, strerror(errno));
		goto fail;
	}
	/* every page now: the file shares its filesystem with the rings
	 * (tmpfs under /run), which a client can fill by growing its ring
	 * file, and a first write to a page of a full tmpfs is SIGBUS */
	if ((errno = posix_fallocate(fd, 0, (off_t)bytes))) {
		log_warn("counters: %s: cannot allocate %zu bytes: %s", name,
			 bytes, strerror(errno));
		goto fail;
	}
	h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (h == MAP_FAILED) {
		log_warn("counters: mmap %s: %s", name, strerror(errno));
		goto fail;
	}
	c->slot_pass = calloc(1 + n_flow + FMC_PEER_RECS,
			      sizeof(*c->slot_pass));
	c->shadow = calloc(n_flow + 1, sizeof(*c->shadow));
	if (!c->slot_pass || !c->shadow) {
		munmap(h, bytes);
		goto fail;
	}
	c->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
	close(fd);
	*h = (struct fmc_header){
		.version = FMC_VERSION, .hdr_bytes = FMC_HDR_BYTES,
		.rec_bytes = FMC_REC_BYTES, .n_flow = n_flow,
		.n_peer = FMC_PEER_RECS, .pid = (uint32_t)getpid(),
		.start_unix_ns = realtime_ns(),
		.period_ms = FMC_DEFAULT_PERIOD_MS, .values = FMC_VALUES,
	};
	/* the magic last: a reader that sees it sees the geometry (the file
	 * is new, so no reader can hold it yet, but a reader opening the path
	 * now may map it before this store) */
	atomic_thread_fence(memory_order_release);
	h->magic = FMC_MAGIC;
	c->h = h;
	c->bytes = bytes;
	return 0;
fail:
	free(c->slot_pass);
	free(c->shadow);
	c->slot_pass = NULL;
	c->shadow = NULL;
	close(fd);
	unlinkat(dirfd, name, 0);
	return -1;
}

/* ---- records -------------------------------------------------------------- */

/* A record of [first, first + n) that is free (slot_pass 0: the shared
 * page is not read back; see struct counters). */
static uint32_t find_free(const struct counters *c, uint32_t first,
			  uint32_t n)
{
	for (uint32_t i = first; i < first + n; i++)
		if (!c->slot_pass[i])
			return i + 1;
	return 0;
}

/*
 * A free record among [first, first + n), made active for a new user; 0
 * if there is none.  *none_pass: the pass that last found none.  Records
 * are freed only at the end of a pass (free_unseen), so it stays true for
 * the rest of that pass: the flows the file has no room for (more than
 * FMC_MAX_FLOW_RECS) cost one look over the records a pass, not one each
 * (10 000 flows kept moverd's CPU at 100% on these looks).
 */
static uint32_t take_slot(struct counters *c, uint32_t first, uint32_t n,
			  enum fmc_type type, uint64_t *none_pass)
{
	uint32_t i;
	struct fmc_record *r;

	if (*none_pass == c->pass)
		return 0;
	i = find_free(c, first, n);
	if (!i) {
		*none_pass = c->pass;
		return 0;
	}
	r = fmc_record(c->h, i - 1);
	fmc_begin(r);
	for (unsigned v = 0; v < FMC_VALUES; v++)
		fmc_set(r, v, 0);
	for (unsigned t = 0; t < FMC_TEXTS; t++)
		fmc_set_text(r, t, "");
	atomic_store_explicit(&r->type, type, memory_order_relaxed);
	atomic_store_explicit(&r->incarnation, ++c->incarnation,
			      memory_order_relaxed);
	atomic_store_explicit(&r->state, FMC_ACTIVE, memory_order_relaxed);
	fmc_end(r);
	c->slot_pass[i - 1] = c->pass;
	return i;
}

/*
 * The record an owner (a flow or a peer: *slot, 1-based, 0 for none)
 * writes this pass: the one it holds, unless that was freed or already
 * claimed this pass (freed and taken by another), else a free one taken
 * now; seen by this pass either way.  0 if the file has no room.
 */
static uint32_t claim_slot(struct counters *c, uint32_t *slot, uint32_t first,
			   uint32_t n, enum fmc_type type, uint64_t *none_pass)
{
	uint32_t i = *slot;

	if (!i || !c->slot_pass[i - 1] || c->slot_pass[i - 1] == c->pass)
		i = *slot = take_slot(c, first, n, type, none_pass);
	if (i)
		c->slot_pass[i - 1] = c->pass;
	return i;
}

static void free_slot(struct counters *c, uint32_t i)
{
	struct fmc_record *r = fmc_record(c->h, i);

	fmc_begin(r);
	atomic_store_explicit(&r->state, FMC_FREE, memory_order_relaxed);
	fmc_end(r);
	c->slot_pass[i] = 0;
}

/* Records of [first, first + n) no flow or peer claimed this pass. */
static void free_unseen(struct counters *c, uint32_t first, uint32_t n)
{
	for (uint32_t i = first; i < first + n; i++)
		if (c->slot_pass[i] && c->slot_pass[i] != c->pass)
			free_slot(c, i);
}

/* ---- flows ---------------------------------------------------------------- */

static uint64_t minus(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0; /* the consumer's word may be anything */
}

/* The state and last error, with the time each changed; true if the
 * last error changed. */
static bool flow_state(struct counters *c, const struct flow *f,
		       uint32_t slot, uint64_t now)
{
	struct flow_shadow *sh = &c->shadow[slot];
	uint64_t error_ns = sh->error_ns;

	if (sh->since_ns && sh->state == (uint32_t)f->state &&
	    !strcmp(sh->reason, f->reason))
		return false;
	sh->state = (uint32_t)f->state;
	sh->since_ns = now;
	if (f->reason[0] && strcmp(sh->reason, f->reason)) {
		sh->error_ns = now;
		snprintf(sh->last_error, sizeof(sh->last_error), "%s",
			 f->reason);
	}
	snprintf(sh->reason, sizeof(sh->reason), "%s", f->reason);
	return sh->error_ns != error_ns;
}

/*
 * A slot shown last pass is free now: its holder left since (a leave
 * publishes the holder's count, then bumps gen once, then frees the
 * slot).  The records it took since the last pass count, or a consumer
 * that takes its last records and detaches between two passes would
 * lose them (up to FR_PUBLISH_BYTES, or everything it took since the
 * last pass).  Taken again since (another gen): its count is gone.
 */
static void count_leaver(struct flow_shadow *sh, struct fr_sub *s,
			 unsigned i)
{
	uint64_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
	uint64_t recs = atomic_load_explicit(&s->records,
					     memory_order_relaxed);

	if (gen == sh->sub_gen[i] + 1 && recs > sh->sub_records[i])
		sh->records_consumed += recs - sh->sub_records[i];
	sh->sub_records[i] = recs;
}

/*
 * The ring's subscriber slots (ring format 2) into r, and the records
 * they consumed, summed, into sh.  Every word is a client's: only
 * reported, never trusted (a position beyond the tail reads as no lag).
 */
static void write_subs(struct fmc_record *r, struct flow_shadow *sh,
		       struct flow *f, struct fr_shared *ring, uint64_t tail)
{
	uint64_t mask = 0;
	uint32_t visit;

	/* holders taken since the last pass, seen or not: one that has
	 * left already is a leaver of this pass (count_leaver), from 0 */
	for (unsigned i = 0; i < FMC_SUBS && i < FR_MAX_SUBS; i++) {
		if (!(f->subs_taken & (1u << i)) ||
		    sh->sub_gen[i] == f->sub_taken_gen[i])
			continue;
		sh->sub_gen[i] = f->sub_taken_gen[i];
		sh->sub_records[i] = 0;
		sh->sub_written |= 1u << i;
	}
	f->subs_taken = 0;
	/* the slots in use, and those shown last time (one may have been
	 * cut or freed since): not all 16 lines of every ring each pass */
	visit = (atomic_load_explicit(&ring->sub_mask, memory_order_relaxed) |
		 sh->sub_written) & ((1u << FMC_SUBS) - 1);

	for (unsigned i = 0; i < FMC_SUBS && i < FR_MAX_SUBS; i++) {
		struct fr_sub *s = &ring->subs[i];
		unsigned base = FMC_F_SUB0 + FMC_SUB_VALUES * i;
		uint64_t gen, recs;
		uint32_t st;

		if (!(visit & (1u << i)))
			continue;
		/* acquire: pairs with a leave's release of FREE, so a slot
		 * seen free shows the count its holder published leaving */
		st = atomic_load_explicit(&s->state, memory_order_acquire);
		if (st != FR_SUB_ACTIVE && st != FR_SUB_HELD &&
		    st != FR_SUB_CUT) {
			/* a free slot's zeros once, not every pass */
			if (sh->sub_written & (1u << i)) {
				count_leaver(sh, s, i);
				fmc_set(r, base + FMC_SUB_LAG, 0);
				fmc_set(r, base + FMC_SUB_RECORDS, 0);
				fmc_set(r, base + FMC_SUB_PID, 0);
				sh->sub_written &= ~(1u << i);
			}
			continue;
		}
		sh->sub_written |= 1u << i;
		mask |= st != FR_SUB_CUT ? 1ull << i : 1ull << (16 + i);
		gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
		recs = atomic_load_explicit(&s->records, memory_order_relaxed);
		/* a new holder counts from 0; a count that went back too */
		if (gen != sh->sub_gen[i] || recs < sh->sub_records[i])
			sh->sub_records[i] = 0;
		sh->records_consumed += recs - sh->sub_records[i];
		sh->sub_gen[i] = gen;
		sh->sub_records[i] = recs;
		fmc_set(r, base + FMC_SUB_LAG,
			minus(tail, atomic_load_explicit(&s->pos,
							 memory_order_relaxed)));
		fmc_set(r, base + FMC_SUB_RECORDS, recs);
		fmc_set(r, base + FMC_SUB_PID,
			atomic_load_explicit(&s->pid, memory_order_relaxed));
	}
	fmc_set(r, FMC_F_SUB_MASK, mask);
	fmc_set(r, FMC_F_RECORDS_CONSUMED, sh->records_consumed);
}

/*
 * Is the record of f as it was last written?  Only answerable for a flow
 * no client could have written (flow_exposed): its ring then changes by
 * moverd's hand alone, and what moverd changed shows in the flow's own
 * counts, state and reason.  Such a record is claimed for the pass and
 * left as it is: reading the ring and subscriber slots of every idle flow
 * once a second was a third of an idle moverd's cpu at 1000 flows (perf,
 * issue 12).  sh->own is brought up to date either way while the flow is
 * not exposed (once it is, it stays so).
 */
static bool record_current(struct flow_shadow *sh, const struct flow *f)
{
	struct flow_own own;
	bool same;

	if (flow_exposed(f))
		return false; /* for good: its sh->own is never needed */
	own = (struct flow_own){
		.bytes_sent = f->bytes_sent, .bytes_acked = f->bytes_acked,
		.remote_head = f->remote_head, .batches = f->st.batches,
		.records_sent = f->st.records_sent,
		.records_deposited = f->st.records_deposited,
		.reconnects = f->st.reconnects, .resumes = f->st.resumes,
		.producers = f->producers, .consumers = f->consumers,
	};
	same = sh->since_ns && sh->state == (uint32_t)f->state &&
	       !strcmp(sh->reason, f->reason) &&
	       !memcmp(&own, &sh->own, sizeof(own));
	sh->own = own;
	return same;
}

/* Write f's record; false if there is no room for it in the file. */
static bool write_flow(struct counters *c, struct flow *f, uint64_t now)
{
	struct fmc_record *r;
	struct flowshm_info in = { 0 };
	struct flow_shadow *sh;
	uint32_t i;
	uint64_t consumed, lag;
	bool fresh = false, new_error;

	i = claim_slot(c, &f->st.slot, fmc_first_flow(c->h), c->h->n_flow,
		       FMC_FLOW, &c->flows_full_pass);
	if (!i)
		return false;
	i--;
	r = fmc_record(c->h, i);
	sh = &c->shadow[i - fmc_first_flow(c->h)];
	if (atomic_load_explicit(&r->incarnation, memory_order_relaxed) !=
	    f->st.incarnation) {
		*sh = (struct flow_shadow){ 0 }; /* a new flow in this slot */
		f->st.incarnation = atomic_load_explicit(&r->incarnation,
							 memory_order_relaxed);
		fresh = true;
	}
	if (!fresh && record_current(sh, f))
		return true;
	new_error = flow_state(c, f, i - fmc_first_flow(c->h), now);
	if (f->view)
		flowshm_info(f->view, &in);
	consumed = f->role == FLOW_SENDER ? f->remote_head : in.head;
	lag = minus(in.tail, consumed);
	fmc_begin(r);
	/* texts only when they change: a name and peer never do */
	if (fresh) {
		fmc_set_text(r, FMC_NAME, f->name);
		fmc_set_text(r, FMC_WHERE, f->peer_addr);
	}
	if (fresh || new_error)
		fmc_set_text(r, FMC_ERROR, sh->last_error);
	fmc_set(r, FMC_F_ROLE, f->role);
	fmc_set(r, FMC_F_STATE, f->state);
	fmc_set(r, FMC_F_STATE_SINCE_NS, sh->since_ns);
	fmc_set(r, FMC_F_ERROR_NS, sh->error_ns);
	fmc_set(r, FMC_F_RING_BYTES, in.ring_size);
	fmc_set(r, FMC_F_PRODUCERS, f->producers);
	fmc_set(r, FMC_F_CONSUMERS, f->consumers);
	fmc_set(r, FMC_F_BYTES_COMMITTED, in.tail);
	fmc_set(r, FMC_F_BYTES_SENT, f->role == FLOW_SENDER ? f->bytes_sent : 0);
	fmc_set(r, FMC_F_RECORDS_SENT,
		f->role == FLOW_SENDER ? f->st.records_sent : 0);
	fmc_set(r, FMC_F_RECORDS_DEPOSITED,
		f->role == FLOW_RECEIVER ? f->st.records_deposited : 0);
	fmc_set(r, FMC_F_BYTES_ACKED, f->role == FLOW_SENDER ? f->bytes_acked : 0);
	fmc_set(r, FMC_F_BYTES_DEPOSITED,
		f->role == FLOW_RECEIVER ? f->bytes_sent : 0);
	fmc_set(r, FMC_F_BYTES_CONSUMED, consumed);
	fmc_set(r, FMC_F_BATCHES, f->st.batches);
	fmc_set(r, FMC_F_LAG_BYTES, lag);
	fmc_set(r, FMC_F_RECONNECTS, f->st.reconnects);
	fmc_set(r, FMC_F_RESUMES, f->st.resumes);
	fmc_set(r, FMC_F_RECOVERED, in.recovered);
	if (f->view) {
		struct fr_shared *ring = ring_of(f)->sh;

		/* the producers' own count of records they claimed; a
		 * receiver's ring has moverd as its only writer */
		fmc_set(r, FMC_F_RECORDS_COMMITTED,
			f->role == FLOW_RECEIVER ? f->st.records_deposited :
			atomic_load_explicit(&ring->records,
					     memory_order_relaxed));
		/* the producers' own counts, written only when full */
		fmc_set(r, FMC_F_BACKPRESSURE, atomic_load_explicit(
				&ring->full_events, memory_order_relaxed));
		fmc_set(r, FMC_F_FULL_NS, atomic_load_explicit(
				&ring->full_ns, memory_order_relaxed));
		write_subs(r, sh, f, ring, in.tail);
	}
	fmc_end(r);
	return true;
}

/* ---- peers ---------------------------------------------------------------- */

/* Whole heartbeat periods an up peer has been silent, counted once. */
static void count_missed(struct peer *p, uint64_t now)
{
	struct peer_stats *s = &p->st;
	uint64_t from;

	if (p->state != PEER_UP) {
		s->hb_checked_ns = 0;
		return;
	}
	from = s->hb_checked_ns > p->last_rx_ns ? s->hb_checked_ns :
						  p->last_rx_ns;
	/* silence beyond the first period (a heartbeat due) is missed */
	if (from == p->last_rx_ns)
		from += HEARTBEAT_NS;
	while (now >= from + HEARTBEAT_NS) {
		s->hb_missed++;
		from += HEARTBEAT_NS;
	}
	s->hb_checked_ns = from;
}

static void write_peer(struct counters *c, struct peer *p, uint64_t now)
{
	uint32_t i, nreg = 0;
	uint64_t reg_bytes = 0;
	struct fmc_record *r;

	i = claim_slot(c, &p->st.slot, fmc_first_peer(c->h), c->h->n_peer,
		       FMC_PEER, &c->peers_full_pass);
	if (!i) {
		atomic_fetch_add_explicit(&c->h->peers_unrecorded, 1,
					  memory_order_relaxed);
		return;
	}
	i--;
	r = fmc_record(c->h, i);
	count_missed(p, now);
	if (p->tp->registered)
		p->tp->registered(p, &nreg, &reg_bytes);
	fmc_begin(r);
	fmc_set_text(r, FMC_NAME, p->addr);
	fmc_set_text(r, FMC_WHERE, p->node_safe);
	fmc_set_text(r, FMC_ERROR, p->last_error);
	fmc_set(r, FMC_P_STATE, p->state);
	fmc_set(r, FMC_P_TRANSPORT, strcmp(p->tp->name, "rdma") == 0);
	fmc_set(r, FMC_P_OUTBOUND, p->outbound);
	fmc_set(r, FMC_P_FLOWS, flow_count(p));
	fmc_set(r, FMC_P_BYTES_TX, p->bytes_tx);
	fmc_set(r, FMC_P_BYTES_RX, p->bytes_rx);
	fmc_set(r, FMC_P_FRAMES_TX, p->st.frames_tx);
	fmc_set(r, FMC_P_FRAMES_RX, p->st.frames_rx);
	fmc_set(r, FMC_P_SENDS, p->st.sends);
	fmc_set(r, FMC_P_RECONNECTS, p->reconnects);
	fmc_set(r, FMC_P_HEARTBEATS_MISSED, p->st.hb_missed);
	fmc_set(r, FMC_P_REGISTRATIONS, nreg);
	fmc_set(r, FMC_P_PINNED_BYTES, reg_bytes);
	fmc_set(r, FMC_P_WR_POSTED, p->st.wr_posted);
	fmc_set(r, FMC_P_WC_POLLED, p->st.wc_polled);
	fmc_set(r, FMC_P_RTT_COUNT, p->st.rtt_count);
	fmc_set(r, FMC_P_RTT_SUM_NS, p->st.rtt_sum_ns);
	fmc_set(r, FMC_P_RTT_MAX_NS, p->st.rtt_max_ns);
	fmc_set(r, FMC_P_WINDOW, p->window);
	fmc_set(r, FMC_P_UNACKED, p->unacked);
	fmc_set(r, FMC_P_WINDOW_CUTS, p->st.win_cuts);
	for (unsigned b = 0; b < FMC_RTT_BUCKETS; b++)
		fmc_set(r, FMC_P_RTT_BUCKET0 + b, p->st.rtt[b]);
	fmc_end(r);
}

/* ---- the daemon ----------------------------------------------------------- */

static uint64_t tv_ns(struct timeval tv)
{
	return (uint64_t)tv.tv_sec * 1000000000ull + (uint64_t)tv.tv_usec * 1000;
}

/* Linux 6.2 and later give the count as the directory's size, one stat
 * whatever the number; before, a look at each entry (at 10 000 flows, a
 * tenth of an idle moverd's CPU). */
static uint64_t count_fds(void)
{
	DIR *d;
	uint64_t n = 0;
	struct stat st;

	if (!stat("/proc/self/fd", &st) && st.st_size > 0)
		return (uint64_t)st.st_size;
	d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n > 3 ? n - 3 : 0; /* ".", ".." and the directory's own */
}

/* getrusage and /proc/self/fd: syscalls, so once a second only */
static void sample_slow(struct counters *c, uint64_t now)
{
	struct rusage ru;

	if (c->slow_ns && now - c->slow_ns < SLOW_NS)
		return;
	c->slow_ns = now;
	if (!getrusage(RUSAGE_SELF, &ru)) {
		c->cpu_user_ns = tv_ns(ru.ru_utime);
		c->cpu_sys_ns = tv_ns(ru.ru_stime);
	}
	c->fds = count_fds();
}

static void write_daemon(struct counters *c, const struct flow_table *t,
			 const struct peer_mgr *m, const struct ctl_server *s,
			 unsigned peers)
{
	struct fmc_record *r = fmc_record(c->h, 0);
	uint64_t none_pass = 0;

	if (!c->slot_pass[0])
		take_slot(c, 0, 1, FMC_DAEMON, &none_pass);
	c->slot_pass[0] = c->pass;
	fmc_begin(r);
	fmc_set_text(r, FMC_NAME, "moverd");
	fmc_set_text(r, FMC_WHERE, FLOWSHM_VERSION);
	fmc_set_text(r, FMC_ERROR, peer_doorbell_name(m));
	fmc_set(r, FMC_D_CYCLES, m->cycles);
	fmc_set(r, FMC_D_WORK_CYCLES, c->d.work_cycles);
	fmc_set(r, FMC_D_SLEEPS, m->sleeps);
	fmc_set(r, FMC_D_WAKE_DOORBELL, c->d.wake_doorbell);
	fmc_set(r, FMC_D_WAKE_NETWORK, c->d.wake_network);
	fmc_set(r, FMC_D_WAKE_TIMER, c->d.wake_timer);
	fmc_set(r, FMC_D_CPU_USER_NS, c->cpu_user_ns);
	fmc_set(r, FMC_D_CPU_SYS_NS, c->cpu_sys_ns);
	fmc_set(r, FMC_D_CLIENTS, s->n_clients);
	fmc_set(r, FMC_D_FDS, c->fds);
	fmc_set(r, FMC_D_FLOWS, t->count);
	fmc_set(r, FMC_D_PEERS, peers);
	fmc_set(r, FMC_D_REQUESTS, s->stats.requests);
	fmc_set(r, FMC_D_BAD_REQUESTS, s->stats.bad_requests);
	fmc_set(r, FMC_D_CLIENTS_REFUSED, s->stats.clients_refused);
	fmc_set(r, FMC_D_PEERS_REFUSED, m->refused);
	fmc_set(r, FMC_D_DOORBELL_RINGS, m->rings);
	fmc_set(r, FMC_D_SAMPLER_NS, c->sampler_ns);
	fmc_set(r, FMC_D_RING_TO_ALLOCATE, t->fill_pending);
	fmc_set(r, FMC_D_RING_TO_FREE, t->punch_pending);
	fmc_set(r, FMC_D_DESTROYED_RINGS, t->n_gone);
	fmc_set(r, FMC_D_DESTROYED_RING_BYTES, t->gone_bytes);
	fmc_set(r, FMC_D_BELL_PAGES, mover_bell_pages(m));
	fmc_set(r, FMC_D_BELL_SHARED, mover_bell_shared(m));
	fmc_end(r);
}

/* Which flows' records a pass writes (flows_to_write). */
enum flow_pass { WRITE_NO_FLOW, WRITE_EXPOSED, WRITE_EVERY_FLOW };

/* Write the records of every flow, whatever happens, this often. */
#define EVERY_FLOW_NS 60000000000ull

/*
 * Which flows' records does this pass write?
 *   - every flow's after a control request, a flow's state changed, a
 *     flow made or gone (an operator sees it at the next pass); at most
 *     once a second (SLOW_NS) if the data path moved since the last such
 *     pass (a duty cycle's work, a peer's frame other than a heartbeat:
 *     c->every_due); and every EVERY_FLOW_NS whatever happens;
 *   - else the exposed flows' (flow_exposed: their clients move the
 *     positions and counts in the ring without moverd) while moverd works
 *     or clients are connected, when one left, and once a second;
 *   - else none (an idle daemon): only the daemon's and peers' records.
 * So a record is at most SLOW_NS old, or EVERY_FLOW_NS for a flow no
 * client was handed and nothing happened to.  Writing 1000 idle flows'
 * records ten times a second was a quarter of idle moverd's cpu, and
 * looking at them once a second was still most of it; with 10 000 flows
 * open, looking at every one ten times a second while 10 flows were busy
 * took B from 40% to 59% of a cpu (perf, flowbench scale; issue 12).
 */
static enum flow_pass flows_to_write(struct counters *c,
				     const struct flow_table *t,
				     const struct peer_mgr *m,
				     const struct ctl_server *s, uint64_t now)
{
	uint64_t frames = 0;
	enum flow_pass pass = WRITE_NO_FLOW;
	bool told, moved;

	for (const struct peer *p = m->peers; p; p = p->next)
		frames += p->st.frames_rx + p->st.frames_tx - p->st.heartbeats;
	told = s->stats.requests != c->seen_requests ||
	       t->count != c->seen_flows || t->state_changes != c->seen_states;
	moved = m->last_work_ns != c->seen_work_ns || frames != c->seen_frames;
	c->every_due |= moved;
	if (!c->every_ns || now - c->every_ns >= EVERY_FLOW_NS || told ||
	    (c->every_due && now - c->every_ns >= SLOW_NS))
		pass = WRITE_EVERY_FLOW;
	else if (moved || now - c->full_ns >= SLOW_NS || s->n_clients ||
		 s->n_clients != c->seen_clients)
		pass = WRITE_EXPOSED;
	c->seen_work_ns = m->last_work_ns;
	c->seen_requests = s->stats.requests;
	c->seen_frames = frames;
	c->seen_flows = t->count;
	c->seen_clients = s->n_clients;
	c->seen_states = t->state_changes;
	if (pass == WRITE_EVERY_FLOW) {
		c->every_ns = now;
		c->every_due = false;
	}
	if (pass != WRITE_NO_FLOW)
		c->full_ns = now;
	return pass;
}

static void write_flows(struct counters *c, const struct flow_table *t,
			enum flow_pass pass, uint64_t wall)
{
	uint64_t unrecorded = 0;

	if (pass == WRITE_EXPOSED) {
		for (struct flow *f = t->exposed; f; f = f->exp_next)
			write_flow(c, f, wall);
		return;
	}
	for (struct flow *f = t->head; f; f = f->next)
		unrecorded += !write_flow(c, f, wall);
	atomic_store_explicit(&c->h->flows_unrecorded, unrecorded,
			      memory_order_relaxed);
	/* a record not claimed in a pass that wrote every flow is gone */
	free_unseen(c, fmc_first_flow(c->h), c->h->n_flow);
}

static void sample(struct counters *c, const struct flow_table *t,
		   const struct peer_mgr *m, const struct ctl_server *s,
		   uint64_t now)
{
	uint64_t wall = realtime_ns();
	unsigned peers = 0;
	enum flow_pass pass = flows_to_write(c, t, m, s, now);

	c->pass++;
	c->last_ns = now;
	sample_slow(c, now);
	if (pass != WRITE_NO_FLOW)
		write_flows(c, t, pass, wall);
	atomic_store_explicit(&c->h->peers_unrecorded, 0, memory_order_relaxed);
	for (struct peer *p = m->peers; p; p = p->next, peers++)
		write_peer(c, p, now);
	write_daemon(c, t, m, s, peers);
	/* a record not claimed in a pass that wrote its kind is gone */
	free_unseen(c, fmc_first_peer(c->h), c->h->n_peer);
	atomic_store_explicit(&c->h->sample_unix_ns, wall, memory_order_relaxed);
	atomic_store_explicit(&c->h->sample_mono_ns, now, memory_order_relaxed);
	/* release: a reader that sees this pass's number sees its records */
	atomic_store_explicit(&c->h->sample_seq, c->pass, memory_order_release);
	c->sampler_ns += fr_now_ns() - now; /* shown at the next pass */
}

void counters_tick(struct counters *c, const struct flow_table *t,
		   const struct peer_mgr *m, const struct ctl_server *s,
		   uint64_t now)
{
	if (!c->h || now - c->last_ns < FMC_DEFAULT_PERIOD_MS * 1000000ull)
		return;
	sample(c, t, m, s, now);
}

int counters_due_ms(const struct counters *c, uint64_t now)
{
	uint64_t due = c->last_ns + FMC_DEFAULT_PERIOD_MS * 1000000ull;

	if (!c->h)
		return -1;
	return due <= now ? 1 : (int)((due - now + 999999) / 1000000);
}

void counters_close(struct counters *c, const struct flow_table *t,
		    const struct peer_mgr *m, const struct ctl_server *s)
{
	if (!c->h)
		return;
	sample(c, t, m, s, fr_now_ns());
	atomic_store_explicit(&c->h->closed, 1, memory_order_release);
	munmap(c->h, c->bytes);
	c->h = NULL;
	if (c->dirfd >= 0) {
		unlinkat(c->dirfd, c->name, 0);
		close(c->dirfd);
	}
	free(c->slot_pass);
	free(c->shadow);
}
