/*
 * moverd/bell_thread.h - the producers' doorbell on kernels whose io_uring
 * has no FUTEX_WAITV (before Linux 6.7, e.g. Debian 12's 6.1).
 *
 * One helper thread blocks in the futex_waitv(2) system call (Linux 5.16)
 * on the words moverd hands it, and writes an eventfd when the wait ends,
 * so the io_uring loop, reading that eventfd, wakes as promptly as with
 * the native operation, one thread switch later.
 *
 * The thread only waits; it never touches a ring or a flow.  The caller
 * arms it with a set of words, then keeps a read of bell_thread_fd() in
 * flight; a readable eventfd means "the wait ended, re-check the rings".
 * While a wait is armed the set cannot change: kick it, and arm the new
 * set once the eventfd has fired.
 */
#ifndef MOVERD_BELL_THREAD_H
#define MOVERD_BELL_THREAD_H

#include <linux/futex.h>
#include <stdbool.h>

/* futex_waitv takes at most 128 words; one of them is the kick word */
#define BELL_THREAD_MAX 127u

struct bell_thread;

/* Probe for futex_waitv(2) and start the thread: NULL with errno set
 * (ENOSYS: the kernel has no futex_waitv). */
struct bell_thread *bell_thread_start(void);

/* The eventfd that becomes readable when an armed wait ends. */
int bell_thread_fd(const struct bell_thread *bt);

/*
 * Wait on w[0..n) (each .val the value seen before the caller's re-check).
 * 0: armed.  -EBUSY: the previous wait has not ended yet (the eventfd will
 * fire when it does).  -E2BIG: more than BELL_THREAD_MAX words.
 */
int bell_thread_arm(struct bell_thread *bt, const struct futex_waitv *w,
		    unsigned n);

/* Is a wait armed (the words in use by the helper)? */
bool bell_thread_waiting(const struct bell_thread *bt);

/* End the armed wait now (its set of words is stale); the eventfd fires. */
void bell_thread_kick(struct bell_thread *bt);

/* Stop and join the thread, close the eventfd. */
void bell_thread_stop(struct bell_thread *bt);

#endif
