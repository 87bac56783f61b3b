/*
 * moverd/helper_thread.h - starting one of moverd's helper threads (the
 * doorbell's futex_waitv, ring registration, name lookups).
 */
#ifndef MOVERD_HELPER_THREAD_H
#define MOVERD_HELPER_THREAD_H

#include <pthread.h>
#include <signal.h>

/*
 * pthread_create with every signal blocked in the new thread: moverd's
 * signals go to the loop's signalfd, and a helper that took one would
 * hide it from the loop.  0, or pthread_create's error.
 */
static inline int helper_thread_start(pthread_t *th, void *(*fn)(void *),
				      void *arg)
{
	sigset_t all, old;
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(th, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

#endif
