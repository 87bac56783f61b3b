/*
 * libflowshm/poll.c - waiting on many flows at once (fan-in): flowshm_poll
 * over an array of consumer handles, and flowshm_set with an eventfd for
 * event loops.
 *
 * Sleeping uses the ring's own wake protocol (ring.h, "Sleeping and
 * waking") on every ring at once: read each ring's data_futex, count
 * ourselves in its consumers_waiting, one full fence, re-check every ring,
 * and only then futex_waitv(2) over all the words.  A producer that
 * commits after our re-check sees our count (the Dekker pair of fences)
 * and bumps the word, so the wait returns.  One system call for n flows.
 * As fr_wait_data, we count ourselves in our subscriber slot's sleep mark
 * too, so that a leave of the slot lowers the count of a consumer killed
 * here asleep (ring.h, Sleeping and waking: sleepers that die asleep).
 */
#include "flowshm_internal.h"
#include "barrier.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

#define FALLBACK_SLEEP_NS 200000ull /* older kernels, or > 128 flows */
#define YIELD_SCANS 4u              /* scans with a yield before sleeping */

/* -ENOSYS seen once: use the sleep loop from then on. */
static _Atomic bool no_waitv;
/* Where the next flowshm_poll of this thread starts its scan. */
static _Thread_local unsigned poll_turn;

/* ---- the wake protocol over many rings ---------------------------------- */

/*
 * Count ourselves as a sleeping consumer on each ring and take each wake
 * word's value into w (read BEFORE the re-check, so a wake in between
 * changes the word and the wait returns at once), and the sleep mark we
 * counted ourselves in too into marks (the disarm's, whatever happens to
 * the handles meanwhile).
 */
static void arm(flowshm_t *const *flows, unsigned n, struct futex_waitv *w,
		_Atomic uint32_t **marks)
{
	for (unsigned i = 0; i < n; i++) {
		struct fr_ring *r = &flows[i]->ring;

		/* producers held back by our lazily published position must
		 * see it before we sleep (ring.h, Subscribers) */
		fr_sub_publish(r);
		/* acquire: the value is read before the re-check below */
		w[i] = (struct futex_waitv){
			.val = atomic_load_explicit(&r->sh->data_futex,
						    memory_order_acquire),
			.uaddr = (uintptr_t)&r->sh->data_futex,
			.flags = FUTEX_32,
		};
		/* seq_cst (fr_sleeper_in): our count must be visible before
		 * we re-check the ring; pairs with the producer's fence after
		 * its commit.  Then our slot's mark. */
		marks[i] = fr_data_mark(r);
		fr_sleeper_in(&r->sh->consumers_waiting, marks[i]);
	}
	/* the Dekker fence: count stores before re-check loads */
	atomic_thread_fence(memory_order_seq_cst);
}

/* The helper thread's disarm: the shared words the caller armed, never
 * the handles (marks[i] is NULL for a ring read without a slot). */
static void disarm_shared(struct fr_shared *const *sh,
			  _Atomic uint32_t *const *marks, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		fr_sleeper_out(&sh[i]->consumers_waiting, marks[i]);
}

static void disarm(flowshm_t *const *flows, unsigned n,
		   _Atomic uint32_t *const *marks)
{
	for (unsigned i = 0; i < n; i++)
		fr_sleeper_out(&flows[i]->ring.sh->consumers_waiting, marks[i]);
}

/* futex_waitv until deadline (CLOCK_MONOTONIC ns, UINT64_MAX forever):
 * 0 (woken, a word differed, or a signal), -ETIMEDOUT, or -ENOSYS: no
 * futex_waitv here, or one we may not call (a seccomp filter's EPERM);
 * either way the caller falls back to sleeping in slices, where taking
 * any error for "woken" spun a core for as long as the wait lasted. */
static int waitv(struct futex_waitv *w, unsigned n, uint64_t deadline_ns)
{
	struct timespec ts, *tsp = NULL;

	if (deadline_ns != UINT64_MAX) {
		ts.tv_sec = (time_t)(deadline_ns / 1000000000ull);
		ts.tv_nsec = (long)(deadline_ns % 1000000000ull);
		tsp = &ts;
	}
	if (syscall(SYS_futex_waitv, w, n, 0, tsp, CLOCK_MONOTONIC) >= 0)
		return 0;
	if (errno == EAGAIN || errno == EINTR)
		return 0;
	return errno == ETIMEDOUT ? -ETIMEDOUT : -ENOSYS;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };

	nanosleep(&ts, NULL);
}

/* ---- polling ------------------------------------------------------------ */

/*
 * Ready, or worth a look again before any sleep: a committed record at the
 * position (fr_data_at).  A read steps over at most 2^16 pads or control
 * records a call (fr_peek), so one behind more of them is ready though the
 * read said -EAGAIN; its producer rang before, and nothing rings again.
 */
static bool any_ready(flowshm_t *const *flows, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		if (fsi_ready(flows[i]) ||
		    fr_data_at(&flows[i]->ring, flows[i]->ring.head))
			return true;
	}
	return false;
}

/* Indexes of the ready flows into ready[], starting at flow `start`. */
static unsigned scan(flowshm_t *const *flows, unsigned n, unsigned start,
		     unsigned *ready)
{
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++) {
		unsigned j = (start + i) % n;

		if (fsi_ready(flows[j]))
			ready[k++] = j;
	}
	return k;
}

/*
 * A consumer stuck behind a claimed record must wake up to run recovery
 * (fr_peek pads a dead producer's claim once it stayed claimed for
 * recover_ns), so, as fr_wait_data, sleep at most a quarter of that
 * while a local ring has claims beyond our position.
 */
static uint64_t recovery_cap(flowshm_t *const *flows, unsigned n,
			     uint64_t deadline)
{
	uint64_t now = 0;

	for (unsigned i = 0; i < n; i++) {
		const struct fr_ring *r = &flows[i]->ring;
		uint64_t cap;

		/* relaxed: only a hint of whether anything is claimed */
		if (r->mode == FR_MODE_DEPOSIT || !r->recover_ns ||
		    atomic_load_explicit(&r->sh->tail, memory_order_relaxed) ==
			    r->head)
			continue;
		if (!now)
			now = fr_now_ns();
		cap = now + r->recover_ns / 4 + 1;
		if (cap < deadline)
			deadline = cap;
	}
	return deadline;
}

/* fm_sleep_two_phase over the n rings (ipc/barrier.h): futex_waitv on
 * their words, and a re-check of the flows after the heavy fence. */
struct sleeper {
	flowshm_t *const *flows;
	unsigned n;
	struct futex_waitv *w;
};

static int sleeper_wait(void *ctx, uint64_t until)
{
	struct sleeper *s = ctx;

	return waitv(s->w, s->n, until);
}

static bool sleeper_ready(void *ctx)
{
	struct sleeper *s = ctx;

	return any_ready(s->flows, s->n);
}

static int wait_two_phase(flowshm_t *const *flows, unsigned n,
			  struct futex_waitv *w, uint64_t until)
{
	struct sleeper s = { flows, n, w };

	return fm_sleep_two_phase(sleeper_wait, sleeper_ready, &s, until);
}

/* Sleep until a ring may have data or the deadline: returns when the
 * caller should scan again. */
static void sleep_on(flowshm_t *const *flows, unsigned n, uint64_t deadline)
{
	struct futex_waitv w[FUTEX_WAITV_MAX];
	_Atomic uint32_t *marks[FUTEX_WAITV_MAX];
	uint64_t now;
	int rc;

	if (n <= FUTEX_WAITV_MAX &&
	    !atomic_load_explicit(&no_waitv, memory_order_relaxed)) {
		arm(flows, n, w, marks);
		rc = any_ready(flows, n) ? 0 :
			wait_two_phase(flows, n, w,
				       recovery_cap(flows, n, deadline));
		disarm(flows, n, marks);
		if (rc != -ENOSYS)
			return;
		atomic_store_explicit(&no_waitv, true, memory_order_relaxed);
	}
	now = fr_now_ns();
	if (now < deadline)
		sleep_ns(deadline - now < FALLBACK_SLEEP_NS ? deadline - now :
							      FALLBACK_SLEEP_NS);
}

/* How a flowshm_poll over these handles waits: it sleeps unless every
 * one of them polls (flowshm_set_wait); then it yields if any yields. */
static enum flowshm_wait poll_wait(flowshm_t *const *flows, unsigned n)
{
	enum flowshm_wait w = FLOWSHM_WAIT_SPIN;

	for (unsigned i = 0; i < n; i++) {
		if (flows[i]->wait == FLOWSHM_WAIT_SLEEP)
			return FLOWSHM_WAIT_SLEEP;
		if (flows[i]->wait == FLOWSHM_WAIT_YIELD)
			w = FLOWSHM_WAIT_YIELD;
	}
	return w;
}

static int poll_flows(flowshm_t *const *flows, unsigned n, unsigned start,
		      unsigned *ready, unsigned *nready, int64_t timeout_ns)
{
	uint64_t deadline = UINT64_MAX;
	enum flowshm_wait wait = poll_wait(flows, n);

	for (unsigned round = 0;; round++) {
		unsigned k = scan(flows, n, start, ready);

		if (k) {
			*nready = k;
			return 0;
		}
		if (timeout_ns == 0)
			return -EAGAIN;
		if (round == 0 && timeout_ns > 0)
			deadline = fr_now_ns() + (uint64_t)timeout_ns;
		else if (deadline != UINT64_MAX && fr_now_ns() >= deadline)
			return -ETIMEDOUT;
		if (wait == FLOWSHM_WAIT_SPIN)
			fsi_cpu_relax();
		else if (wait == FLOWSHM_WAIT_YIELD || round < YIELD_SCANS)
			sched_yield();
		else
			sleep_on(flows, n, deadline);
	}
}

static bool consumer(const flowshm_t *f)
{
	return f && f->role == FLOWSHM_CONSUMER;
}

int flowshm_poll(flowshm_t *const *flows, unsigned n, unsigned *ready,
		 unsigned *nready, int64_t timeout_ns)
{
	if (!flows || !ready || !nready || n == 0 || n > FLOWSHM_POLL_MAX)
		return -EINVAL;
	for (unsigned i = 0; i < n; i++) {
		if (!consumer(flows[i]))
			return -EINVAL;
	}
	*nready = 0;
	return poll_flows(flows, n, poll_turn++ % n, ready, nready,
			  timeout_ns);
}

/* ---- sets with a descriptor --------------------------------------------- */

/*
 * The helper thread holds the wait the application armed: the app, in
 * flowshm_set_poll, counted itself on every ring and found none ready;
 * the helper sleeps in futex_waitv over those words plus the set's own
 * `call` word (to be called back), then drops the counts and writes the
 * eventfd.  The helper never touches a handle's private state (not
 * thread-safe): only the rings' shared words, through armed_sh, and a
 * flow is removed only once the helper has let go of it.
 */
struct flowshm_set {
	flowshm_t *flows[FLOWSHM_SET_MAX];
	unsigned n;
	unsigned turn;
	int efd;                  /* -1 until flowshm_set_fd */
	bool thread_on;
	pid_t pid;                /* the process the helper thread is in */
	pthread_t thread;
	pthread_mutex_t mu;       /* guards everything below */
	pthread_cond_t cv;
	bool armed;               /* the helper holds counts on armed_sh */
	bool quit;
	unsigned armed_n;
	uint64_t armed_until;     /* wake then even if no word moved */
	struct fr_shared *armed_sh[FLOWSHM_SET_MAX];
	/* each ring's sleep mark we counted ourselves in (our slot's) */
	_Atomic uint32_t *armed_mark[FLOWSHM_SET_MAX];
	/* what the helper re-checks after its heavy fence: each ring (its
	 * shared page and geometry only) and the consumer's position then */
	const struct fr_ring *armed_ring[FLOWSHM_SET_MAX];
	uint64_t armed_head[FLOWSHM_SET_MAX];
	struct futex_waitv w[FLOWSHM_SET_MAX + 1];
	_Atomic uint32_t call;    /* bumped to call the helper back */
};

_Static_assert(FLOWSHM_SET_MAX + 1 <= FUTEX_WAITV_MAX, "one waitv call");

int flowshm_set_create(flowshm_set_t **out)
{
	flowshm_set_t *s;

	if (!out)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->efd = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	*out = s;
	return 0;
}

static void signal_fd(int efd)
{
	uint64_t one = 1;

	/* EAGAIN (counter full) still leaves it readable */
	if (write(efd, &one, sizeof(one)) < 0)
		return;
}

/* The helper's wait: two-phase (ipc/barrier.h), its re-check reads the
 * rings at the positions the caller armed them (with mu not held: the
 * caller does not touch them while armed, and removal calls the helper
 * back first); its words are the rings' and the call word. */
struct helper_sleeper {
	flowshm_set_t *s;
	struct futex_waitv *w;
	unsigned n;
};

static int helper_sleeper_wait(void *ctx, uint64_t until)
{
	struct helper_sleeper *h = ctx;

	return waitv(h->w, h->n + 1, until);
}

static bool helper_sleeper_ready(void *ctx)
{
	struct helper_sleeper *h = ctx;

	for (unsigned i = 0; i < h->n; i++)
		if (fr_data_at(h->s->armed_ring[i], h->s->armed_head[i]))
			return true;
	return false;
}

static void helper_wait(flowshm_set_t *s, struct futex_waitv *w, unsigned n,
			uint64_t until)
{
	struct helper_sleeper h = { s, w, n };

	fm_sleep_two_phase(helper_sleeper_wait, helper_sleeper_ready, &h,
			   until);
}

static void *helper(void *arg)
{
	flowshm_set_t *s = arg;

	pthread_mutex_lock(&s->mu);
	while (!s->quit) {
		struct futex_waitv w[FLOWSHM_SET_MAX + 1];
		uint64_t until;
		unsigned n;

		if (!s->armed) {
			pthread_cond_wait(&s->cv, &s->mu);
			continue;
		}
		n = s->armed_n;
		until = s->armed_until;
		memcpy(w, s->w, (n + 1) * sizeof(w[0]));
		pthread_mutex_unlock(&s->mu);
		/* a timeout (recovery) also makes the caller poll again */
		helper_wait(s, w, n, until);
		pthread_mutex_lock(&s->mu);
		disarm_shared(s->armed_sh, s->armed_mark, n);
		s->armed = false;
		/* also when called back (add, remove): the caller's arming
		 * is gone, so it must poll again to arm anew */
		if (!s->quit)
			signal_fd(s->efd);
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* With mu held: make the helper let go of its counts and wait for it. */
static void call_back(flowshm_set_t *s)
{
	while (s->armed) {
		/* release: the bump is the call; the helper's waitv compares
		 * the word with the value taken when it was armed */
		atomic_fetch_add_explicit(&s->call, 1, memory_order_release);
		syscall(SYS_futex, &s->call, FUTEX_WAKE, 1, NULL, NULL, 0);
		pthread_cond_wait(&s->cv, &s->mu);
	}
}

static int find(const flowshm_set_t *s, const flowshm_t *f)
{
	for (unsigned i = 0; i < s->n; i++) {
		if (s->flows[i] == f)
			return (int)i;
	}
	return -1;
}

int flowshm_set_add(flowshm_set_t *s, flowshm_t *f)
{
	int rc = 0;

	if (!s || !consumer(f))
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	if (find(s, f) >= 0) {
		rc = -EEXIST;
	} else if (s->n == FLOWSHM_SET_MAX) {
		rc = -ENOSPC;
	} else {
		call_back(s);
		s->flows[s->n++] = f;
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int flowshm_set_remove(flowshm_set_t *s, flowshm_t *f)
{
	int i, rc = 0;

	if (!s || !f)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	i = find(s, f);
	if (i < 0) {
		rc = -ENOENT;
	} else {
		/* the helper may hold a count on f's ring: let it go first,
		 * the caller may unmap the ring right after */
		call_back(s);
		s->flows[i] = s->flows[--s->n];
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void flowshm_set_destroy(flowshm_set_t *s)
{
	if (!s)
		return;
	if (s->thread_on && s->pid != getpid()) {
		/* a child of fork: the helper thread (and whoever held the
		 * mutex then) stayed in the parent; calling it back or
		 * joining it would wait for ever.  Free what is ours. */
		close(s->efd);
		free(s);
		return;
	}
	pthread_mutex_lock(&s->mu);
	call_back(s);
	s->quit = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->thread_on)
		pthread_join(s->thread, NULL);
	if (s->efd >= 0)
		close(s->efd);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* Does this kernel have futex_waitv, and may we call it?  An empty call is
 * -EINVAL if so (ENOSYS: none; EPERM: a seccomp filter). */
static bool have_waitv(void)
{
	return syscall(SYS_futex_waitv, NULL, 0, 0, NULL, CLOCK_MONOTONIC) < 0 &&
	       errno == EINVAL;
}

/* The helper takes no signals: the application's handlers run in its
 * own threads, as they would without the library. */
static int start_helper(flowshm_set_t *s)
{
	sigset_t all, old;
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&s->thread, NULL, helper, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -rc;
}

int flowshm_set_fd(flowshm_set_t *s)
{
	int rc = 0;

	if (!s)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	if (s->efd >= 0)
		goto out;
	if (!have_waitv()) {
		rc = -ENOSYS;
		goto out;
	}
	s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->efd < 0) {
		rc = -errno;
		goto out;
	}
	rc = start_helper(s);
	if (rc) {
		close(s->efd);
		s->efd = -1;
		goto out;
	}
	s->thread_on = true;
	s->pid = getpid();
	/* readable at once: the caller polls, and its -EAGAIN arms it */
	signal_fd(s->efd);
out:
	pthread_mutex_unlock(&s->mu);
	return rc ? rc : s->efd;
}

static void drain_fd(int efd)
{
	uint64_t v;

	if (read(efd, &v, sizeof(v)) < 0)
		return; /* EAGAIN: it was not readable */
}

/*
 * With mu held, the helper idle, nothing ready at the caller's last look:
 * count ourselves on every ring, re-check, and hand the wait to the
 * helper if still nothing is there.  Returns how many are ready (then
 * nothing is armed).
 */
static unsigned arm_helper(flowshm_set_t *s, unsigned start, unsigned *idx)
{
	unsigned k;

	arm(s->flows, s->n, s->w, s->armed_mark);
	k = scan(s->flows, s->n, start, idx);
	if (k) {
		disarm(s->flows, s->n, s->armed_mark);
		return k;
	}
	for (unsigned i = 0; i < s->n; i++) {
		s->armed_sh[i] = s->flows[i]->ring.sh;
		s->armed_ring[i] = &s->flows[i]->ring;
		s->armed_head[i] = s->flows[i]->ring.head;
	}
	s->w[s->n] = (struct futex_waitv){
		/* acquire: pairs with call_back's release bump */
		.val = atomic_load_explicit(&s->call, memory_order_acquire),
		.uaddr = (uintptr_t)&s->call,
		.flags = FUTEX_32,
	};
	s->armed_n = s->n;
	s->armed_until = recovery_cap(s->flows, s->n, UINT64_MAX);
	s->armed = true;
	pthread_cond_broadcast(&s->cv);
	return 0;
}

int flowshm_set_poll(flowshm_set_t *s, flowshm_t **ready, unsigned max,
		     unsigned *nready, int64_t timeout_ns)
{
	unsigned idx[FLOWSHM_SET_MAX], k = 0, start;
	int rc = 0;

	if (!s || !ready || !nready || max == 0)
		return -EINVAL;
	*nready = 0;
	pthread_mutex_lock(&s->mu);
	if (s->n == 0) {
		pthread_mutex_unlock(&s->mu);
		return -EINVAL;
	}
	start = s->turn++ % s->n;
	if (s->efd >= 0)
		drain_fd(s->efd);
	if (timeout_ns != 0) {
		/* our own wait; the helper's counts (if armed) do no harm */
		rc = poll_flows(s->flows, s->n, start, idx, &k, timeout_ns);
		/* none came: the descriptor, drained above, is armed as a
		 * try-once poll arms it (else it never became readable
		 * again after a timed poll) */
		if (!k && s->efd >= 0 && !s->armed && (k = arm_helper(s, start,
								      idx)))
			rc = 0;
	} else if (s->efd >= 0 && !s->armed) {
		k = arm_helper(s, start, idx);
		rc = k ? 0 : -EAGAIN;
	} else {
		k = scan(s->flows, s->n, start, idx);
		rc = k ? 0 : -EAGAIN;
	}
	for (unsigned i = 0; i < k && i < max; i++)
		ready[i] = s->flows[idx[i]];
	*nready = k < max ? k : max;
	pthread_mutex_unlock(&s->mu);
	return rc;
}
