/*
 * moverd/resolver.c - getaddrinfo(3) in one helper thread, reported to the
 * io_uring loop through an eventfd (see resolver.h).
 *
 * Why a thread of our own and not glibc's getaddrinfo_a(3): getaddrinfo_a
 * reports through a signal or a thread it creates per notification, runs
 * its own pool of threads, cannot cancel a lookup in progress either, and
 * is glibc only.  One thread that blocks in getaddrinfo is simpler, bounded
 * (RESOLVER_MAX requests, one thread) and reports the way bell_thread.c
 * already does.  Lookups run one after another: a name behind a dead DNS
 * server delays the names queued after it (each getaddrinfo gives up after
 * resolv.conf's timeout x attempts), never the loop.
 *
 * The slots are shared under one mutex; the loop thread and the helper
 * each take it for a few copies only, never across a lookup.  The mutex
 * orders the data: what the helper stores in a slot before it unlocks is
 * seen by the loop once it has locked (unlock releases, lock acquires);
 * the eventfd only wakes the loop, it carries nothing.
 *
 * The shared block (slots, eventfd) has two owners, the loop side and the
 * thread; the last one to let go frees it.  So resolver_stop never waits
 * for a lookup in progress: the thread finishes it, finds `stop`, and
 * frees the block itself.
 */
#include "resolver.h"
#include "helper_thread.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

enum slot_state { SLOT_FREE, SLOT_QUEUED, SLOT_RUNNING, SLOT_DONE };

struct slot {
	enum slot_state state;
	bool cancelled;          /* running, but nobody wants the answer */
	bool for_root;           /* root's: taken before others' */
	char host[80], port[16];
	struct resolver_result res;
};

struct resolver_shared {
	pthread_mutex_t mu;
	pthread_cond_t cv;       /* the thread waits for QUEUED or stop */
	unsigned refs;           /* the loop side and the thread */
	bool stop;
	int efd;
	struct slot slot[RESOLVER_MAX];
};

/* ---- both sides ------------------------------------------------------------ */

/* "HOST:PORT" or "[V6]:PORT" into its two parts; 0 or -EINVAL. */
static int split_addr(const char *addr, char *host, size_t hcap, char *port,
		      size_t pcap)
{
	const char *colon = strrchr(addr, ':'), *h = addr;
	size_t hlen;

	if (!colon || colon == addr || !colon[1] || strlen(colon + 1) >= pcap)
		return -EINVAL;
	hlen = (size_t)(colon - addr);
	if (addr[0] == '[') {
		if (colon[-1] != ']' || hlen < 3)
			return -EINVAL;
		h++;
		hlen -= 2;
	}
	if (hlen >= hcap)
		return -EINVAL;
	memcpy(host, h, hlen);
	host[hlen] = 0;
	strcpy(port, colon + 1);
	return 0;
}

/* getaddrinfo into res; 0, -EAGAIN when flags ask for a numeric address
 * and this is not one, or -EHOSTUNREACH with res->why. */
static int lookup(const char *host, const char *port, int flags,
		  struct resolver_result *res)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = flags }, *ai;
	int rc = getaddrinfo(host, port, &hints, &ai);

	if (rc == EAI_NONAME && (flags & AI_NUMERICHOST))
		return -EAGAIN;
	if (rc) {
		/* gai_strerror returns constant strings: thread-safe */
		snprintf(res->why, sizeof(res->why), "%s", rc == EAI_SYSTEM ?
			 strerror(errno) : gai_strerror(rc));
		return res->err = -EHOSTUNREACH;
	}
	memcpy(&res->sa, ai->ai_addr, ai->ai_addrlen);
	res->len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return res->err = 0;
}

/* Let go of the shared block; the last owner frees it.  Called locked. */
static void release(struct resolver_shared *sh)
{
	bool last = --sh->refs == 0;

	pthread_mutex_unlock(&sh->mu);
	if (!last)
		return;
	close(sh->efd);
	pthread_cond_destroy(&sh->cv);
	pthread_mutex_destroy(&sh->mu);
	free(sh);
}

/* ---- the helper thread ------------------------------------------------------ */

/* Is a queued before b?  Root's first (its reserve of slots would not
 * help it past other users' names queued on a DNS server that does not
 * answer), then the oldest (ids grow). */
static bool runs_before(const struct slot *a, const struct slot *b)
{
	if (a->for_root != b->for_root)
		return a->for_root;
	return a->res.id < b->res.id;
}

/* The next queued request, or NULL.  Called locked. */
static struct slot *next_queued(struct resolver_shared *sh)
{
	struct slot *best = NULL;

	for (unsigned i = 0; i < RESOLVER_MAX; i++) {
		struct slot *s = &sh->slot[i];

		if (s->state == SLOT_QUEUED && (!best || runs_before(s, best)))
			best = s;
	}
	return best;
}

static void *resolver_main(void *arg)
{
	struct resolver_shared *sh = arg;
	struct resolver_result res;
	char host[80], port[16];
	uint64_t one = 1;

	pthread_mutex_lock(&sh->mu);
	for (;;) {
		struct slot *s = sh->stop ? NULL : next_queued(sh);

		if (sh->stop)
			break;
		if (!s) {
			pthread_cond_wait(&sh->cv, &sh->mu);
			continue;
		}
		s->state = SLOT_RUNNING;
		memcpy(host, s->host, sizeof(host));
		memcpy(port, s->port, sizeof(port));
		res = (struct resolver_result){ .id = s->res.id };
		pthread_mutex_unlock(&sh->mu);

		lookup(host, port, 0, &res); /* may block for seconds */

		pthread_mutex_lock(&sh->mu);
		if (s->cancelled || sh->stop) {
			s->state = SLOT_FREE;
			continue;
		}
		s->res = res;
		s->state = SLOT_DONE;
		/* a wake-up only: the loop reads the slot under the mutex */
		if (write(sh->efd, &one, sizeof(one)) != sizeof(one)) {
			/* only EAGAIN at a counter of 2^64-2: cannot happen */
		}
	}
	release(sh);
	return NULL;
}

static int start_thread(struct resolver_shared *sh)
{
	pthread_t th;
	int rc = helper_thread_start(&th, resolver_main, sh);

	if (!rc)
		pthread_detach(th); /* see resolver_stop */
	return rc;
}

/* ---- the loop side ---------------------------------------------------------- */

static void arm_read(struct resolver *r);

/* Take every finished lookup out of the slots, then report them (the
 * owner's function may look up again or stop: no lock held). */
static void results_ready(struct loop_op *op, int res)
{
	struct resolver *r = (struct resolver *)((char *)op -
		offsetof(struct resolver, op));
	struct resolver_shared *sh = r->sh;
	struct resolver_result out[RESOLVER_MAX];
	unsigned n = 0;

	(void)res;
	if (!sh)
		return; /* stopped meanwhile */
	pthread_mutex_lock(&sh->mu);
	for (unsigned i = 0; i < RESOLVER_MAX; i++) {
		if (sh->slot[i].state == SLOT_DONE) {
			out[n++] = sh->slot[i].res;
			sh->slot[i].state = SLOT_FREE;
		}
	}
	pthread_mutex_unlock(&sh->mu);
	arm_read(r);
	for (unsigned i = 0; i < n && r->sh; i++)
		r->done(r, &out[i]);
}

static void arm_read(struct resolver *r)
{
	struct io_uring_sqe *sqe = loop_sqe(r->loop, &r->op, results_ready);

	if (sqe)
		io_uring_prep_read(sqe, r->sh->efd, &r->count, sizeof(r->count),
				   0);
}

int resolver_start(struct resolver *r, struct loop *l, resolver_fn done)
{
	struct resolver_shared *sh = calloc(1, sizeof(*sh));
	int rc;

	if (!sh)
		return -ENOMEM;
	sh->efd = eventfd(0, EFD_CLOEXEC);
	if (sh->efd < 0) {
		rc = -errno;
		free(sh);
		return rc;
	}
	pthread_mutex_init(&sh->mu, NULL);
	pthread_cond_init(&sh->cv, NULL);
	sh->refs = 2;
	rc = start_thread(sh);
	if (rc) {
		sh->refs = 1;
		pthread_mutex_lock(&sh->mu);
		release(sh);
		return -rc;
	}
	*r = (struct resolver){ .loop = l, .done = done, .next_id = 1, .sh = sh };
	arm_read(r);
	return 0;
}

int resolver_lookup(struct resolver *r, const char *addr, bool for_root,
		    struct resolver_result *out, uint64_t *id)
{
	struct resolver_shared *sh = r->sh;
	char host[80], port[16];
	struct slot *s = NULL;
	unsigned used = 0;
	int rc;

	*out = (struct resolver_result){ 0 };
	if (split_addr(addr, host, sizeof(host), port, sizeof(port))) {
		snprintf(out->why, sizeof(out->why), "not HOST:PORT");
		return out->err = -EINVAL;
	}
	/* a numeric address needs no DNS: resolved here, at once */
	rc = lookup(host, port, AI_NUMERICHOST | AI_NUMERICSERV, out);
	if (rc != -EAGAIN)
		return rc;
	if (!sh) {
		snprintf(out->why, sizeof(out->why), "no resolver running");
		return out->err = -ENOTCONN;
	}
	pthread_mutex_lock(&sh->mu);
	for (unsigned i = 0; i < RESOLVER_MAX; i++) {
		used += sh->slot[i].state != SLOT_FREE;
		if (!s && sh->slot[i].state == SLOT_FREE)
			s = &sh->slot[i];
	}
	if (!for_root && used >= RESOLVER_MAX - RESOLVER_ROOT_RESERVE)
		s = NULL;
	if (s) {
		*s = (struct slot){ .state = SLOT_QUEUED,
				    .for_root = for_root };
		s->res.id = *id = r->next_id++;
		strcpy(s->host, host);
		strcpy(s->port, port);
		pthread_cond_signal(&sh->cv);
	}
	pthread_mutex_unlock(&sh->mu);
	if (!s) {
		snprintf(out->why, sizeof(out->why), "%u lookups pending already%s",
			 used, for_root ? "" : " (the rest kept for root)");
		return out->err = -EAGAIN;
	}
	return -EINPROGRESS;
}

void resolver_rearm(struct resolver *r)
{
	if (r->sh && !r->op.busy)
		arm_read(r);
}

void resolver_cancel(struct resolver *r, uint64_t id)
{
	struct resolver_shared *sh = r->sh;

	if (!sh || !id)
		return;
	pthread_mutex_lock(&sh->mu);
	for (unsigned i = 0; i < RESOLVER_MAX; i++) {
		struct slot *s = &sh->slot[i];

		if (s->state == SLOT_FREE || s->res.id != id)
			continue;
		if (s->state == SLOT_RUNNING)
			s->cancelled = true; /* the thread frees it */
		else
			s->state = SLOT_FREE;
	}
	pthread_mutex_unlock(&sh->mu);
}

void resolver_stop(struct resolver *r)
{
	struct resolver_shared *sh = r->sh;

	if (!sh)
		return;
	r->sh = NULL; /* a read still in flight finds nothing to do */
	pthread_mutex_lock(&sh->mu);
	sh->stop = true;
	pthread_cond_signal(&sh->cv);
	release(sh);
}

int resolver_lookup_now(const char *addr, struct resolver_result *out)
{
	char host[80], port[16];

	*out = (struct resolver_result){ 0 };
	if (split_addr(addr, host, sizeof(host), port, sizeof(port))) {
		snprintf(out->why, sizeof(out->why), "not HOST:PORT");
		return out->err = -EINVAL;
	}
	return lookup(host, port, 0, out);
}
