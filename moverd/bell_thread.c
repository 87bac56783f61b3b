/*
 * moverd/bell_thread.c - futex_waitv(2) in a helper thread, reported to the
 * io_uring loop through an eventfd (see bell_thread.h).
 *
 * Hand-over protocol, one word `state`:
 *   IDLE  -> ARMED  by the loop thread, after filling `words` (release);
 *   ARMED -> IDLE   by the helper once its wait has ended (release), then
 *                   it writes the eventfd;
 *   any   -> STOP   by the loop thread at shutdown.
 * `words` belongs to whoever moved `state` last, so the loop thread writes
 * it only in IDLE and the helper reads it only in ARMED: no lock.
 */
#include "bell_thread.h"

#include "futex.h"
#include "helper_thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { BELL_IDLE, BELL_ARMED, BELL_STOP };

struct bell_thread {
	pthread_t thread;
	int efd;
	_Atomic uint32_t state;
	_Atomic uint32_t kick;    /* bumped to end an armed wait early */
	unsigned n;               /* words in use, the kick word included */
	struct futex_waitv words[BELL_THREAD_MAX + 1];
};

static long futex_waitv(struct futex_waitv *w, unsigned n)
{
	return syscall(SYS_futex_waitv, w, n, 0, NULL, CLOCK_MONOTONIC);
}

static void *bell_main(void *arg)
{
	struct bell_thread *bt = arg;
	uint64_t one = 1;
	uint32_t armed;

	for (;;) {
		/* acquire: pairs with bell_thread_arm's release, so `words`
		 * is complete when we see ARMED */
		uint32_t s = atomic_load_explicit(&bt->state,
						  memory_order_acquire);

		if (s == BELL_STOP)
			return NULL;
		if (s == BELL_IDLE) {
			fm_futex_wait(&bt->state, BELL_IDLE, UINT64_MAX);
			continue;
		}
		/* Ends on a wake, at once if a word already differs from
		 * the value moverd saw (EAGAIN), or on a signal: in every
		 * case moverd re-checks the rings, so the reason is moot. */
		futex_waitv(bt->words, bt->n);
		/* release: we are done reading `words`; the loop thread may
		 * refill them once it sees IDLE.  A CAS, not a store: a STOP
		 * that came meanwhile must not be overwritten. */
		armed = BELL_ARMED;
		if (!atomic_compare_exchange_strong_explicit(
			    &bt->state, &armed, BELL_IDLE, memory_order_release,
			    memory_order_relaxed))
			return NULL;
		if (write(bt->efd, &one, sizeof(one)) != sizeof(one)) {
			/* only EAGAIN at a counter of 2^64-2: cannot happen */
		}
	}
}

struct bell_thread *bell_thread_start(void)
{
	struct bell_thread *bt;
	int rc;

	/* no words: EINVAL where the call exists, ENOSYS before Linux 5.16 */
	if (futex_waitv(NULL, 0) == -1 && errno == ENOSYS)
		return NULL;
	bt = calloc(1, sizeof(*bt));
	if (!bt)
		return NULL;
	bt->efd = eventfd(0, EFD_CLOEXEC);
	if (bt->efd < 0) {
		free(bt);
		return NULL;
	}
	rc = helper_thread_start(&bt->thread, bell_main, bt);
	if (rc) {
		close(bt->efd);
		free(bt);
		errno = rc;
		return NULL;
	}
	return bt;
}

int bell_thread_fd(const struct bell_thread *bt)
{
	return bt->efd;
}

int bell_thread_arm(struct bell_thread *bt, const struct futex_waitv *w,
		    unsigned n)
{
	struct futex_waitv *kick;

	if (n > BELL_THREAD_MAX)
		return -E2BIG;
	/* acquire: pairs with the helper's release of IDLE, so it has
	 * finished with `words` before we overwrite them */
	if (atomic_load_explicit(&bt->state, memory_order_acquire) !=
	    BELL_IDLE)
		return -EBUSY;
	memcpy(bt->words, w, n * sizeof(*w));
	kick = &bt->words[n];
	*kick = (struct futex_waitv){
		.val = atomic_load_explicit(&bt->kick, memory_order_relaxed),
		.uaddr = (uintptr_t)&bt->kick,
		.flags = FUTEX_32,
	};
	bt->n = n + 1;
	/* release: publishes `words` and `n` to the helper */
	atomic_store_explicit(&bt->state, BELL_ARMED, memory_order_release);
	fm_futex_wake(&bt->state);
	return 0;
}

bool bell_thread_waiting(const struct bell_thread *bt)
{
	/* acquire: pairs with the helper's release of IDLE, so its system
	 * call on the words has returned when we see IDLE */
	return bt && atomic_load_explicit(&bt->state, memory_order_acquire) ==
			     BELL_ARMED;
}

void bell_thread_kick(struct bell_thread *bt)
{
	/* The kernel compares the word under its futex lock: an increment
	 * before the helper enters futex_waitv makes it return EAGAIN, one
	 * after finds it queued and the wake below ends it.  Relaxed is
	 * enough, the word carries no data. */
	atomic_fetch_add_explicit(&bt->kick, 1, memory_order_relaxed);
	fm_futex_wake(&bt->kick);
}

void bell_thread_stop(struct bell_thread *bt)
{
	if (!bt)
		return;
	atomic_store_explicit(&bt->state, BELL_STOP, memory_order_release);
	fm_futex_wake(&bt->state);
	bell_thread_kick(bt);
	pthread_join(bt->thread, NULL);
	close(bt->efd);
	free(bt);
}
