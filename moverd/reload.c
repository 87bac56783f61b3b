/*
 * moverd/reload.c - a reload's reading on a thread of its own, its
 * applying on the loop.  See reload.h.
 */
#include "reload.h"
#include "helper_thread.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* One run: shared by the loop and the run's thread, freed by the last of
 * the two to let go (the thread may outlive the loop's interest: stop). */
struct reload_run {
	pthread_mutex_t mu;
	int refs;
	bool read;               /* the thread is done: rd is the loop's */
	int efd;                 /* the thread's word to the loop */
	const struct declared *d;
	struct declared_reading rd;
};

/* Let go of r (its mutex held); the last one frees it, and what it read
 * if that was never applied (the stop came first). */
static void release(struct reload_run *r)
{
	bool last = --r->refs == 0;

	pthread_mutex_unlock(&r->mu);
	if (!last)
		return;
	if (r->read)
		declared_reload_drop(r->d, &r->rd);
	close(r->efd);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

static void *read_config(void *arg)
{
	struct reload_run *r = arg;
	uint64_t one = 1;

	declared_reload_read(r->d, &r->rd); /* may wait on NSS for seconds */
	pthread_mutex_lock(&r->mu);
	r->read = true;
	/* a wake-up only: the loop looks at r->read under the mutex */
	if (write(r->efd, &one, sizeof(one)) != sizeof(one)) {
		/* only EAGAIN at a counter of 2^64-2: cannot happen */
	}
	release(r);
	return NULL;
}

static void run_read(struct loop_op *op, int res);

static void arm_read(struct reloader *rl)
{
	struct io_uring_sqe *sqe = loop_sqe(rl->loop, &rl->op, run_read);

	/* none: reload_rearm arms it on a later pass */
	if (sqe)
		io_uring_prep_read(sqe, rl->run->efd, &rl->count,
				   sizeof(rl->count), 0);
}

/* A run that could not start (or the stop overtook) answers its requests
 * at once: only rc and err are read from a refused reading. */
static void refuse_run(struct reloader *rl, uint64_t number, int rc,
		       const char *why)
{
	struct declared_reading rd = { .rc = rc };

	log_warn("reload: %s", why);
	snprintf(rd.err, sizeof(rd.err), "%s", why);
	rl->done(rl->done_arg, number, &rd);
}

/* Start run number n: 0, or a negative errno with why in err. */
static int start_run(struct reloader *rl, uint64_t n, char *err, size_t cap)
{
	struct reload_run *r = calloc(1, sizeof(*r));
	pthread_t th;
	int rc;

	if (!r) {
		snprintf(err, cap, "cannot reload: out of memory");
		return -ENOMEM;
	}
	r->efd = eventfd(0, EFD_CLOEXEC);
	if (r->efd < 0) {
		rc = -errno;
		snprintf(err, cap, "cannot reload: eventfd: %s", strerror(-rc));
		free(r);
		return rc;
	}
	pthread_mutex_init(&r->mu, NULL);
	r->refs = 2;
	r->d = rl->declared;
	rc = helper_thread_start(&th, read_config, r);
	if (rc) {
		snprintf(err, cap, "cannot reload: no thread to read the "
			 "config on: %s", strerror(rc));
		r->refs = 1;
		pthread_mutex_lock(&r->mu);
		release(r);
		return -rc;
	}
	pthread_detach(th); /* see reload_stop */
	rl->run = r;
	rl->started = n;
	if (rl->notice)
		rl->notice(rl->notice_arg, true);
	arm_read(rl);
	return 0;
}

/* The next run for those who asked during the last one. */
static void start_again(struct reloader *rl)
{
	char err[160];
	int rc;

	if (!rl->again || rl->stopped)
		return;
	rl->again = false;
	rc = start_run(rl, rl->started + 1, err, sizeof(err));
	if (rc)
		refuse_run(rl, rl->started + 1, rc, err);
}

/* The run's thread is done: apply what it read, say so, let it go. */
static void run_read(struct loop_op *op, int res)
{
	struct reloader *rl = (struct reloader *)((char *)op -
		offsetof(struct reloader, op));
	struct reload_run *r = rl->run;
	struct declared_reading *rd;
	bool read;
	int rc;

	(void)res;
	if (!r || rl->stopped)
		return;
	pthread_mutex_lock(&r->mu);
	read = r->read;
	pthread_mutex_unlock(&r->mu);
	if (!read) {
		arm_read(rl);
		return;
	}
	rd = &r->rd;
	rc = declared_reload_apply(rl->declared, rd);
	if (!rc && rl->declared->path[0])
		log_info("reload: %u added, %u removed, %u changed, %u "
			 "unchanged, %u refused", rd->r.added, rd->r.removed,
			 rd->r.changed, rd->r.unchanged, rd->r.refused);
	rl->run = NULL;
	rl->done(rl->done_arg, rl->started, rd); /* r's number */
	if (rl->notice)
		rl->notice(rl->notice_arg, false);
	pthread_mutex_lock(&r->mu);
	release(r);
	start_again(rl);
}

void reload_init(struct reloader *rl, struct loop *l, struct declared *d)
{
	*rl = (struct reloader){ .loop = l, .declared = d };
}

uint64_t reload_ask(struct reloader *rl, char *err, size_t cap)
{
	if (rl->stopped) {
		snprintf(err, cap, "moverd is stopping");
		return 0;
	}
	if (rl->run) {
		if (!rl->again)
			log_info("reload: asked while one reads the config: "
				 "another follows it");
		rl->again = true;
		return rl->started + 1;
	}
	return start_run(rl, rl->started + 1, err, cap) ? 0 : rl->started;
}

void reload_rearm(struct reloader *rl)
{
	if (rl->run && !rl->stopped && !rl->op.busy)
		arm_read(rl);
}

bool reload_busy(const struct reloader *rl)
{
	return rl->run != NULL;
}

void reload_stop(struct reloader *rl)
{
	struct reload_run *r = rl->run;
	uint64_t last = rl->again ? rl->started + 1 : rl->started;

	rl->stopped = true;
	rl->again = false;
	if (!r)
		return;
	/* who waits for this run or the next hears why before the control
	 * socket closes */
	refuse_run(rl, last, -ECANCELED, "moverd is stopping: the reload was "
		   "not applied");
	rl->run = NULL; /* a read still in flight finds nothing to do */
	if (rl->notice)
		rl->notice(rl->notice_arg, false);
	/* nothing of it is applied: the last to let go drops what it read */
	pthread_mutex_lock(&r->mu);
	release(r);
}
