/*
 * moverd/reg_thread.c - ibv_reg_mr and ibv_dereg_mr in a helper thread
 * (see reg_thread.h).
 *
 * A mutex and a condition variable, not a lock-free hand-over: requests
 * come a few per flow opened or closed, the lock is held for a list
 * operation only (never across ibv_reg_mr or ibv_dereg_mr, never across
 * the eventfd write), and it gives the loop thread one plain rule: what
 * is on `todo` or in progress is the helper's, what is on `done` is the
 * loop's once taken.  The lock's acquire and release order the request's
 * fields between the threads.
 */
#include "reg_thread.h"
#include "ring.h"
#include "helper_thread.h"

#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct reg_thread {
	pthread_t thread;
	int efd;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* under lock: */
	struct reg_req *todo, **todo_tail, *done;
	bool stop;
};

/* The test hook: wait while the file named exists (reg_thread.h). */
static void test_hold(void)
{
	const char *path = getenv("FLOWMOVER_TEST_REG_HOLD");

	while (path && *path && access(path, F_OK) == 0)
		usleep(10000);
}

/* ibv_reg_mr or ibv_dereg_mr, timed into r->ns, results into r->mr and
 * r->err */
static void reg_run(struct reg_req *r)
{
	uint64_t t0;

	test_hold();
	t0 = fr_now_ns(); /* the call's own time, without a test's hold */
	if (r->op == REG_OP_DEREGISTER) {
		r->err = ibv_dereg_mr(r->mr);
		if (!r->err)
			r->mr = NULL;
	} else {
		r->mr = ibv_reg_mr(r->pd, r->addr, r->len, r->access);
		r->err = r->mr ? 0 : (errno ? errno : ENOMEM);
	}
	r->ns = fr_now_ns() - t0;
}

/* The next request, or NULL once stopped. */
static struct reg_req *next_req(struct reg_thread *rt)
{
	struct reg_req *r;

	pthread_mutex_lock(&rt->lock);
	while (!rt->stop && !rt->todo)
		pthread_cond_wait(&rt->cond, &rt->lock);
	r = rt->stop ? NULL : rt->todo;
	if (r && !(rt->todo = r->next))
		rt->todo_tail = &rt->todo;
	pthread_mutex_unlock(&rt->lock);
	return r;
}

static void *reg_main(void *arg)
{
	struct reg_thread *rt = arg;
	struct reg_req *r;
	uint64_t one = 1;

	while ((r = next_req(rt))) {
		reg_run(r);
		pthread_mutex_lock(&rt->lock);
		r->next = rt->done;
		rt->done = r;
		pthread_mutex_unlock(&rt->lock);
		if (write(rt->efd, &one, sizeof(one)) != sizeof(one)) {
			/* only EAGAIN at a counter of 2^64-2: cannot happen */
		}
	}
	return NULL;
}

struct reg_thread *reg_thread_start(void)
{
	struct reg_thread *rt = calloc(1, sizeof(*rt));
	int rc;

	if (!rt)
		return NULL;
	rt->todo_tail = &rt->todo;
	pthread_mutex_init(&rt->lock, NULL);
	pthread_cond_init(&rt->cond, NULL);
	rt->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (rt->efd < 0) {
		free(rt);
		return NULL;
	}
	/* pinning a shrunk ring file's pages fails with EFAULT in the
	 * kernel, it raises no SIGBUS here */
	rc = helper_thread_start(&rt->thread, reg_main, rt);
	if (rc) {
		close(rt->efd);
		free(rt);
		errno = rc;
		return NULL;
	}
	return rt;
}

int reg_thread_fd(const struct reg_thread *rt)
{
	return rt->efd;
}

void reg_thread_submit(struct reg_thread *rt, struct reg_req *r)
{
	r->next = NULL;
	if (r->op == REG_OP_REGISTER)
		r->mr = NULL;
	r->err = 0;
	pthread_mutex_lock(&rt->lock);
	*rt->todo_tail = r;
	rt->todo_tail = &r->next;
	pthread_cond_signal(&rt->cond);
	pthread_mutex_unlock(&rt->lock);
}

bool reg_thread_cancel(struct reg_thread *rt, struct reg_req *r)
{
	bool found = false;

	pthread_mutex_lock(&rt->lock);
	for (struct reg_req **pp = &rt->todo; *pp; pp = &(*pp)->next) {
		if (*pp != r)
			continue;
		*pp = r->next;
		if (rt->todo_tail == &r->next)
			rt->todo_tail = pp;
		found = true;
		break;
	}
	pthread_mutex_unlock(&rt->lock);
	return found;
}

struct reg_req *reg_thread_take(struct reg_thread *rt)
{
	struct reg_req *r;
	uint64_t n;

	/* the count is moot: the list says what ended (non-blocking) */
	if (read(rt->efd, &n, sizeof(n)) != sizeof(n)) {
		/* EAGAIN: nothing since the last read */
	}
	pthread_mutex_lock(&rt->lock);
	r = rt->done;
	rt->done = NULL;
	pthread_mutex_unlock(&rt->lock);
	return r;
}

struct reg_req *reg_thread_stop(struct reg_thread *rt)
{
	struct reg_req *left, *r;

	if (!rt)
		return NULL;
	pthread_mutex_lock(&rt->lock);
	rt->stop = true;
	pthread_cond_signal(&rt->cond);
	pthread_mutex_unlock(&rt->lock);
	pthread_join(rt->thread, NULL); /* after the request under way */
	left = rt->done;
	while ((r = rt->todo)) {
		rt->todo = r->next;
		r->err = ECANCELED;
		r->next = left;
		left = r;
	}
	close(rt->efd);
	pthread_mutex_destroy(&rt->lock);
	pthread_cond_destroy(&rt->cond);
	free(rt);
	return left;
}
