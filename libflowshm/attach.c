/*
 * libflowshm/attach.c - flowshm_attach: get a flow's ring from moverd over
 * the control socket (flowmover.proto, see control/) and open an end.
 */
#include "flowshm_internal.h"

#include "ctl_client.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static _Thread_local char attach_err[CTL_ERR_MAX + 128];

/*
 * Handles attached through moverd, for fork.  A child of fork inherits
 * the control connections, and moverd takes a client for attached as long
 * as its connection is open anywhere: a parent's detach (or death) gave
 * its slot back only once every child that never exec'd had exited too,
 * and meanwhile a consumer's slot held the producers back.  In the child
 * every listed handle's connection is closed and the handle marked forked:
 * its detach there frees the child's copy and gives back no slot (the
 * slots are the parent's).  A connection is listed from its connect (an
 * attach under way, as `pending`, its node on the attaching thread's
 * stack) to its close (fsi_attached_close), each change under the lock,
 * which is held across fork (prepare, then parent and child): the child
 * sees a whole list.
 */
struct pending_sock {
	int fd;
	struct pending_sock *next;
};

static pthread_mutex_t attached_lock = PTHREAD_MUTEX_INITIALIZER;
static flowshm_t *attached;
static struct pending_sock *pending;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
	pthread_mutex_lock(&attached_lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&attached_lock);
}

static void fork_child(void)
{
	for (flowshm_t *f = attached; f; f = f->attached_next) {
		close(f->ctl_fd);
		f->ctl_fd = -1;
		f->forked = true;
	}
	/* attaches under way in the parent's other threads: not here */
	for (struct pending_sock *p = pending; p; p = p->next)
		close(p->fd);
	pending = NULL;
	pthread_mutex_unlock(&attached_lock);
}

static void register_atfork(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* A control connection for an attach, listed once connected (not
 * across the connect: it may wait up to CTL_DEFAULT_TIMEOUT_MS for a
 * stalled moverd, and a fork would wait as long; a fork in the few
 * instructions between is the one it misses). */
static int connect_listed(const char *path, struct pending_sock *p)
{
	pthread_once(&atfork_once, register_atfork);
	p->fd = ctl_connect(path);
	if (p->fd < 0)
		return p->fd;
	pthread_mutex_lock(&attached_lock);
	p->next = pending;
	pending = p;
	pthread_mutex_unlock(&attached_lock);
	return p->fd;
}

static void unlist_pending(struct pending_sock *p)
{
	for (struct pending_sock **pp = &pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			return;
		}
	}
}

/* The attach failed: its connection closes, off the list. */
static void close_pending(struct pending_sock *p)
{
	pthread_mutex_lock(&attached_lock);
	unlist_pending(p);
	close(p->fd);
	pthread_mutex_unlock(&attached_lock);
}

/* The attach made f: its connection, pending until now, is f's. */
static void attached_add(flowshm_t *f, struct pending_sock *p)
{
	pthread_mutex_lock(&attached_lock);
	unlist_pending(p);
	f->ctl_fd = p->fd; /* held until detach: our liveness */
	f->attached_prev = NULL;
	f->attached_next = attached;
	if (attached)
		attached->attached_prev = f;
	attached = f;
	f->listed = true;
	pthread_mutex_unlock(&attached_lock);
}

void fsi_attached_close(flowshm_t *f)
{
	if (!f->listed && f->ctl_fd < 0)
		return;
	pthread_mutex_lock(&attached_lock);
	if (f->listed) {
		if (f->attached_prev)
			f->attached_prev->attached_next = f->attached_next;
		else
			attached = f->attached_next;
		if (f->attached_next)
			f->attached_next->attached_prev = f->attached_prev;
		f->listed = false;
	}
	if (f->ctl_fd >= 0)
		close(f->ctl_fd);
	f->ctl_fd = -1;
	pthread_mutex_unlock(&attached_lock);
}

const char *flowshm_attach_error(void)
{
	return attach_err;
}

/* Why the ring moverd handed us does not open, in words: an old or newer
 * format names its version. */
static void open_error(int fd, const char *flow_name,
		       enum flowshm_role role, int rc)
{
	uint32_t version = 0;

	if (rc == -EPROTO &&
	    pread(fd, &version, sizeof(version),
		  offsetof(struct fr_geometry, version)) ==
		    (ssize_t)sizeof(version) &&
	    version != FR_VERSION) {
		snprintf(attach_err, sizeof(attach_err),
			 "ring of flow '%s' from moverd: ring format %u, this "
			 "library speaks %u", flow_name, (unsigned)version,
			 FR_VERSION);
		return;
	}
	snprintf(attach_err, sizeof(attach_err),
		 "ring of flow '%s' from moverd: %s", flow_name,
		 rc == -ESTALE ? "the slot moverd took for us is gone" :
		 rc == -EBUSY ? (role == FLOWSHM_PRODUCER ?
				 "every producer slot of the flow is taken" :
				 "every subscriber slot of the flow is taken") :
				flowshm_strerror(rc));
}

/* The slot moverd took for us (a consumer's subscriber slot, a producer's
 * producer slot), or -1: none (an older moverd), we take one ourselves. */
static int answer_slot(const Flowmover__FlowInfo *fi, enum flowshm_role role)
{
	uint32_t s = role == FLOWSHM_PRODUCER ? fi->prod_slot : fi->sub_slot;

	return s ? (int)s - 1 : -1;
}

/* Is the flow moverd answered with owned by the uid asked for (owner < 0:
 * any)?  moverd checks first; a moverd older than this library does not,
 * and the slot it took is given back when we hang up. */
static bool owner_ok(const Flowmover__FlowInfo *fi, const char *flow_name,
		     int64_t owner)
{
	if (owner < 0 || fi->owner_uid == (uint32_t)owner)
		return true;
	snprintf(attach_err, sizeof(attach_err), "flow '%s' is owned by uid "
		 "%u, not by uid %u as asked: not attached", flow_name,
		 (unsigned)fi->owner_uid, (unsigned)owner);
	return false;
}

/* Attach; wait_ms != 0: moverd waits that long for the flow to appear,
 * and the call for its answer a little longer (call_ms -1: forever);
 * owner >= 0: only to a flow that uid owns. */
static int attach_waiting(const char *flow_name, enum flowshm_role role,
			  const struct flowshm_opts *opts, int64_t owner,
			  uint32_t wait_ms, int call_ms, flowshm_t **out)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	Flowmover__Response *resp = NULL;
	struct fsi_pid_view view;
	const char *path;
	struct pending_sock pend;
	int sock, fds[2] = { -1, -1 }, rc;

	attach_err[0] = '\0';
	if (!out || (role != FLOWSHM_PRODUCER && role != FLOWSHM_CONSUMER)) {
		snprintf(attach_err, sizeof(attach_err),
			 "flowshm_attach: bad argument");
		return -EINVAL;
	}
	*out = NULL;
	if (!ctl_name_valid(flow_name)) {
		snprintf(attach_err, sizeof(attach_err),
			 "invalid flow name: use 1 to 64 of A-Z a-z 0-9 . _ -");
		return -EINVAL;
	}
	path = ctl_socket_path(NULL);
	sock = connect_listed(path, &pend);
	if (sock < 0) {
		snprintf(attach_err, sizeof(attach_err), "%s",
			 ctl_last_error());
		return sock;
	}
	at.name = (char *)flow_name;
	at.wait_ms = wait_ms;
	at.check_owner = owner >= 0;
	at.owner_uid = owner >= 0 ? (uint32_t)owner : 0;
	at.role = role == FLOWSHM_PRODUCER ? FLOWMOVER__ROLE__PRODUCER
					   : FLOWMOVER__ROLE__CONSUMER;
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	/* the ring, and for a producer of a flow to another host moverd's
	 * doorbell page (ipc/bell.h) */
	rc = ctl_call_fds(sock, &req, &resp, fds, 2, call_ms);
	if (rc) {
		snprintf(attach_err, sizeof(attach_err), "%s",
			 ctl_last_error());
		goto out;
	}
	if (resp->body_case != FLOWMOVER__RESPONSE__BODY_FLOW || fds[0] < 0 ||
	    (resp->flow->bell_index != 0) != (fds[1] >= 0)) {
		snprintf(attach_err, sizeof(attach_err),
			 "bad response from moverd: %s",
			 fds[0] < 0 ? "no ring descriptor attached" :
			 resp->body_case != FLOWMOVER__RESPONSE__BODY_FLOW ?
				"not a flow description" :
				"a doorbell index without its page, or a page "
				"without an index");
		rc = -EPROTO;
		goto out;
	}
	if (!owner_ok(resp->flow, flow_name, owner)) {
		rc = -EACCES;
		goto out;
	}
	view = (struct fsi_pid_view){ resp->flow->client_pid,
				     resp->flow->pid_ns };
	rc = flowshm_open_attached(fds[0], role, opts,
				   answer_slot(resp->flow, role),
				   role == FLOWSHM_PRODUCER ?
					   resp->flow->prod_gen :
					   resp->flow->sub_gen, &view, out);
	if (rc) {
		open_error(fds[0], flow_name, role, rc);
		goto out;
	}
	if (fds[1] >= 0 &&
	    (rc = flowshm_use_bell(*out, fds[1], resp->flow->bell_index - 1))) {
		snprintf(attach_err, sizeof(attach_err),
			 "doorbell page of flow '%s' from moverd: %s",
			 flow_name, flowshm_strerror(rc));
		flowshm_close(*out);
		*out = NULL;
		goto out;
	}
	attached_add(*out, &pend);
	snprintf((*out)->name, sizeof((*out)->name), "%s", flow_name);
	/* the moverd start that owns the ring now (flowshm_state) */
	(*out)->epoch = fsi_epoch(*out);
out:
	ctl_response_free(resp);
	for (int i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (rc)
		close_pending(&pend);
	return rc;
}

/* The wait moverd is asked for, and how long the call waits for its
 * answer. */
static int attach_timed(const char *flow_name, enum flowshm_role role,
			const struct flowshm_opts *opts, int64_t owner,
			int64_t timeout_ns, flowshm_t **out)
{
	uint64_t ms = timeout_ns < 0 ? UINT32_MAX :
				       ((uint64_t)timeout_ns + 999999) / 1000000;
	int call_ms;

	if (ms > UINT32_MAX)
		ms = UINT32_MAX; /* 49 days: as good as forever */
	/* moverd answers at the end of the wait: give it time to */
	call_ms = ms + CTL_DEFAULT_TIMEOUT_MS > INT32_MAX ? -1 :
		  (int)(ms + CTL_DEFAULT_TIMEOUT_MS);
	return attach_waiting(flow_name, role, opts, owner, (uint32_t)ms,
			      call_ms, out);
}

int flowshm_attach(const char *flow_name, enum flowshm_role role,
		   const struct flowshm_opts *opts, flowshm_t **out)
{
	return attach_timed(flow_name, role, opts, -1, 0, out);
}

int flowshm_attach_wait(const char *flow_name, enum flowshm_role role,
			const struct flowshm_opts *opts, int64_t timeout_ns,
			flowshm_t **out)
{
	return attach_timed(flow_name, role, opts, -1, timeout_ns, out);
}

int flowshm_attach_owned(const char *flow_name, enum flowshm_role role,
			 uint32_t owner_uid, const struct flowshm_opts *opts,
			 int64_t timeout_ns, flowshm_t **out)
{
	return attach_timed(flow_name, role, opts, owner_uid, timeout_ns, out);
}

void flowshm_detach(flowshm_t *f)
{
	flowshm_close(f);
}
