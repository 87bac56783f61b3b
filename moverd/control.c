/*
 * moverd/control.c - the control socket of moverd.
 *
 * Each client is a small state machine driven by the io_uring loop:
 *   READ  -> (a whole frame is buffered) -> run the request -> WRITE -> READ
 * One request is served at a time per client; frames that arrive early stay
 * buffered.  A bad frame gets an error response: if its length prefix was
 * sane the connection goes on, otherwise it is closed after the response.
 */
#include "control.h"
#include "counters.h"
#include "ctl_frame.h"
#include "declared.h"
#include "eos.h"
#include "fanout.h"
#include "idle.h"
#include "log.h"
#include "mover.h"
#include "reload.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ATTACH_MAX 16
#define CLIENT_GROUPS_MAX 64  /* supplementary groups kept per client */

struct attachment {
	struct flow *flow;
	enum flowshm_role role;
	unsigned slot;  /* the subscriber slot (consumer) or producer slot
			   (producer) taken for it */
	uint64_t gen;   /* ... and its generation (fr_sub_take, fr_prod_take) */
	bool ended;  /* a producer that ended its stream (flowshm_end) */
	uint64_t bell_page; /* a producer's doorbell page (mover_bell_take;
			     * 0: none) */
};

/*
 * A request that waits (issue 15): an attach or describe for a flow that
 * does not exist yet, a destroy --drain until the flow is drained, or a
 * reload until its run has read the config (off the loop) and applied it.
 * One per connection (a client is served one request at a time), so the
 * waits are bounded by the connection limits (--max-clients,
 * --max-clients-per-uid).
 */
enum wait_kind { WAIT_NONE, WAIT_ATTACH, WAIT_DESCRIBE, WAIT_DRAIN,
		 WAIT_RELOAD };

struct ctl_wait {
	enum wait_kind kind;
	enum flowshm_role role;
	uint64_t id;
	uint64_t until_ns;       /* UINT64_MAX: no limit */
	int64_t owner;           /* attach: the owner asked for, -1: any */
	uint64_t run;            /* reload: the run that answers it */
	char name[FLOW_NAME_MAX + 1];
	/* a drain's flow, referenced (struct flow): one destroyed meanwhile
	 * is `dead`, never a new flow of the same name */
	struct flow *flow;
};

struct ctl_client {
	struct ctl_server *srv;
	struct loop_op rd, wr;
	int fd;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	gid_t groups[CLIENT_GROUPS_MAX]; /* supplementary, at connect time */
	unsigned n_groups;
	size_t have;
	size_t rd_off; /* where the read in flight puts its bytes: serve()
			* may consume frames (have shrinks) meanwhile */
	uint8_t *out;
	size_t out_len, out_done;
	struct flow *out_flow;  /* its ring_fd rides in the response */
	struct msghdr msg;
	struct iovec iov;
	_Alignas(struct cmsghdr) char cmsg[CMSG_SPACE(2 * sizeof(int))];
	int out_bell_fd;        /* the doorbell page rides too (-1: not);
				 * ours to close once the answer is sent */
	bool closing; /* close once the pending response is written */
	bool gone;    /* connection finished; free when no op is in flight */
	struct attachment att[ATTACH_MAX];
	unsigned n_att;
	struct ctl_wait wait;
	struct ctl_client *next;
	uint8_t in[CTL_FRAME_BUF];
};

static void arm_accept(struct ctl_server *s);
static void serve(struct ctl_client *c);
static void arm_read(struct ctl_client *c);
static void arm_wait_tick(struct ctl_server *s);
static void end_wait(struct ctl_client *c);

/* ---- client lifetime ---------------------------------------------------- */

static void detach_all(struct ctl_client *c)
{
	for (unsigned i = 0; i < c->n_att; i++) {
		struct flow *f = c->att[i].flow;

		if (c->att[i].role == FLOWSHM_CONSUMER) {
			f->consumers--;
			/* its slot goes back: producers held by it are free at
			 * once (a no-op if the client already left cleanly,
			 * or if the slot is moverd's own now) */
			if (f->view)
				fr_sub_leave_other(&f->view->ring,
						   c->att[i].slot,
						   c->att[i].gen);
		} else {
			f->producers--;
			/* a producer that died mid-claim: its gap is free
			 * to be recovered (ipc/ring.h, Producer slots) */
			if (f->view)
				fr_prod_leave(&f->view->ring, c->att[i].slot,
					      (uint32_t)c->att[i].gen);
			if (c->att[i].bell_page)
				mover_bell_put(c->srv->peers,
					       c->att[i].bell_page);
		}
		if (c->att[i].ended)
			f->producers_ended--;
		log_debug("flow %s: pid %d detached", f->name, (int)c->pid);
		/* a producer gone without ending may leave only ended ones */
		if (c->att[i].role == FLOWSHM_PRODUCER)
			eos_update(f);
		flows_status(f);
	}
	c->n_att = 0;
}

/* The response is written (or never will be): drop what it held. */
static void response_done(struct ctl_client *c)
{
	free(c->out);
	c->out = NULL;
	if (c->out_flow)
		flow_put(c->out_flow);
	c->out_flow = NULL;
	if (c->out_bell_fd >= 0)
		close(c->out_bell_fd);
	c->out_bell_fd = -1;
}

static void maybe_free(struct ctl_client *c)
{
	struct ctl_server *s = c->srv;

	if (!c->gone || c->rd.busy || c->wr.busy)
		return;
	response_done(c);
	for (struct ctl_client **pp = &s->clients; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	s->n_clients--;
	close(c->fd);
	free(c);
}

static void client_gone(struct ctl_client *c)
{
	if (!c->gone) {
		c->gone = true;
		end_wait(c); /* a drain it asked for leaves the flow closed */
		detach_all(c);
		/* completes any recv still in flight, so we can free */
		shutdown(c->fd, SHUT_RDWR);
	}
	maybe_free(c);
}

/* ---- writing responses -------------------------------------------------- */

static void write_done(struct loop_op *op, int res)
{
	struct ctl_client *c = (struct ctl_client *)((char *)op -
		offsetof(struct ctl_client, wr));

	if (c->gone || res <= 0) {
		client_gone(c);
		return;
	}
	c->out_done += (size_t)res;
	if (c->out_done < c->out_len) {
		/* the fd went with the first bytes; send the rest plainly */
		struct io_uring_sqe *sqe = loop_sqe(c->srv->loop, &c->wr,
						    write_done);
		if (!sqe) {
			client_gone(c);
			return;
		}
		io_uring_prep_send(sqe, c->fd, c->out + c->out_done,
				   c->out_len - c->out_done, MSG_NOSIGNAL);
		return;
	}
	response_done(c);
	if (c->closing) {
		client_gone(c);
		return;
	}
	serve(c);
}

/*
 * Send resp; with pass set, its ring fd goes along (SCM_RIGHTS).  The
 * kernel turns the fd number into a file only when the send runs, which
 * may be long after this call if the client does not read: the response
 * holds a reference to the flow until it is written, so the number stays
 * that ring's even if the flow is destroyed meanwhile.
 */
static void respond(struct ctl_client *c, Flowmover__Response *resp,
		    uint64_t id, struct flow *pass)
{
	struct io_uring_sqe *sqe;
	size_t cap;

	resp->id = id;
	cap = CTL_HDR_BYTES + protobuf_c_message_get_packed_size(&resp->base);
	c->out = malloc(cap);
	if (!c->out || ctl_frame_pack(&resp->base, c->out, cap, &c->out_len)) {
		log_error("cannot pack a response for pid %d", (int)c->pid);
		client_gone(c);
		return;
	}
	c->out_done = 0;
	c->iov = (struct iovec){ c->out, c->out_len };
	c->msg = (struct msghdr){ .msg_iov = &c->iov, .msg_iovlen = 1 };
	if (pass) {
		struct cmsghdr *cm;
		int fds[2] = { pass->ring_fd, c->out_bell_fd };
		unsigned n = c->out_bell_fd >= 0 ? 2 : 1;

		/* the bell page's fd is a copy of our own, closed when the
		 * send is done (response_done) */
		c->msg.msg_control = c->cmsg;
		c->msg.msg_controllen = CMSG_SPACE(n * sizeof(int));
		cm = CMSG_FIRSTHDR(&c->msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(n * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
		c->out_flow = flow_get(pass);
		flows_expose(pass);
	}
	sqe = loop_sqe(c->srv->loop, &c->wr, write_done);
	if (!sqe) {
		client_gone(c);
		return;
	}
	io_uring_prep_sendmsg(sqe, c->fd, &c->msg, MSG_NOSIGNAL);
}

static void respond_error(struct ctl_client *c, uint64_t id, int code,
			  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void respond_error(struct ctl_client *c, uint64_t id, int code,
			  const char *fmt, ...)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__Error err = FLOWMOVER__ERROR__INIT;
	char msg[512], safe[LOG_SAFE_BUF];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	err.code = code;
	err.message = msg;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_ERROR;
	resp.error = &err;
	c->srv->stats.bad_requests += code == -EPROTO || code == -EMSGSIZE;
	/* msg may quote the client's own strings */
	log_debug("client pid %d: error %d: %s", (int)c->pid, code,
		  log_safe(msg, safe, sizeof(safe)));
	respond(c, &resp, id, NULL);
}

static void respond_ok(struct ctl_client *c, uint64_t id)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__Ok ok = FLOWMOVER__OK__INIT;

	resp.body_case = FLOWMOVER__RESPONSE__BODY_OK;
	resp.ok = &ok;
	respond(c, &resp, id, NULL);
}

/* ---- requests ----------------------------------------------------------- */

/* The flow's counters, as the counters file has them (counters.c). */
static void fill_counters(const struct flow *f, const struct flowshm_info *in,
			  Flowmover__FlowInfo *fi)
{
	uint64_t consumed = f->role == FLOW_SENDER ? f->remote_head : in->head;

	fi->batches = f->st.batches;
	fi->records_sent = f->role == FLOW_SENDER ? f->st.records_sent : 0;
	fi->records_deposited =
		f->role == FLOW_RECEIVER ? f->st.records_deposited : 0;
	fi->records_committed = fi->records_deposited;
	fi->reconnects = f->st.reconnects;
	fi->resumes = f->st.resumes;
	fi->bytes_consumed = consumed;
	fi->lag_bytes = in->tail > consumed ? in->tail - consumed : 0;
	if (f->view) { /* the producers' own counts (ring format 2) */
		fi->backpressure_events = atomic_load_explicit(
			&f->view->ring.sh->full_events, memory_order_relaxed);
		fi->full_ns = atomic_load_explicit(&f->view->ring.sh->full_ns,
						   memory_order_relaxed);
		if (f->role != FLOW_RECEIVER)
			fi->records_committed = atomic_load_explicit(
				&f->view->ring.sh->records,
				memory_order_relaxed);
	}
}

static void fill_info(const struct flow *f, Flowmover__FlowInfo *fi)
{
	struct flowshm_info in = { 0 };

	if (f->view)
		flowshm_info(f->view, &in);
	fi->name = (char *)f->name;
	/* a failed flow's ring is closed too: failed says more */
	fi->state = (char *)flows_state_name(in.closed && f->state != FLOW_FAILED ?
					     FLOW_CLOSING : f->state);
	fi->state_reason = f->draining && !f->reason[0] ?
		"draining (flow destroy --drain): no new sends" :
		(char *)f->reason;
	fi->ring_size = in.ring_size;
	fi->max_record = in.max_record;
	fi->head = in.head;
	fi->tail = in.tail;
	fi->producers = f->producers;
	fi->consumers = f->consumers;
	fi->owner_uid = f->owner_uid;
	fi->owner_gid = f->owner_gid;
	fi->n_allow_uids = f->allowed.n_uids;
	fi->allow_uids = (uint32_t *)f->allowed.uids;
	fi->n_allow_gids = f->allowed.n_gids;
	fi->allow_gids = (uint32_t *)f->allowed.gids;
	fi->peer = (char *)f->peer_addr;
	fi->transport = f->role == FLOW_LOCAL ? "local" : (char *)f->transport;
	fi->role = (char *)flows_role_name(f->role);
	fi->origin = (char *)f->origin;
	fi->bytes_sent = f->bytes_sent;
	fi->bytes_acked = f->role == FLOW_SENDER ? f->bytes_acked : f->bytes_sent;
	fi->recovered = in.recovered;
	fi->created_unix_ms = f->created_unix_ms;
	fill_counters(f, &in, fi);
}

/* A sender flow's peer hosts, the first included (fanout.h). */
struct fanout_info {
	Flowmover__FanoutPeer peers[FANOUT_MAX_PEERS];
	Flowmover__FanoutPeer *ptrs[FANOUT_MAX_PEERS];
};

static void fill_fanout(const struct flow *f, Flowmover__FlowInfo *fi,
			struct fanout_info *fo)
{
	unsigned n = 0;

	fi->max_lag = f->max_lag;
	if (f->role != FLOW_SENDER || !f->fanout || !fo)
		return;
	for (const struct flow *s = f; s && n < FANOUT_MAX_PEERS;
	     s = flow_next_sub(f, s), n++) {
		Flowmover__FanoutPeer *p = &fo->peers[n];

		flowmover__fanout_peer__init(p);
		p->address = (char *)s->peer_addr;
		p->state = (char *)flows_state_name(s->state);
		p->reason = (char *)s->reason;
		p->transport = (char *)s->transport;
		p->acked = s->acked;
		p->bytes_sent = s->bytes_sent;
		p->bytes_acked = s->bytes_acked;
		p->cuts = s->cuts;
		p->cut_unix_ms = s->cut_unix_ms;
		fo->ptrs[n] = p;
	}
	fi->n_fanout = n;
	fi->fanout = fo->ptrs;
	/* the first peer's subscription is over (cut off, or failed by its
	 * host) but the flow goes on for the others: their states say how */
	for (const struct flow *s = f->fanout; s && f->sub_dropped;
	     s = s->fanout_next) {
		if (!s->sub_dropped) {
			fi->state = (char *)flows_state_name(FLOW_OPEN);
			break;
		}
	}
}

static void respond_flow(struct ctl_client *c, uint64_t id,
			 const struct flow *f, struct flow *pass)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT;
	struct fanout_info fo;

	fill_info(f, &fi);
	fill_fanout(f, &fi, &fo);
	fi.declared = declared_has(c->srv->declared, f);
	resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
	resp.flow = &fi;
	respond(c, &resp, id, pass);
}

int ctl_create_flow(struct ctl_server *s, const struct flow_spec *spec,
		    uid_t uid, gid_t gid, struct flow **out, char *err,
		    size_t cap)
{
	int rc = flows_create(s->flows, spec, uid, gid, out, err, cap);

	if (rc)
		return rc;
	if ((*out)->role == FLOW_SENDER && (rc = peer_add_sender(s->peers, *out))) {
		/* the whole destroy: a client waiting for the name may have
		 * attached already (flows_create's `added`), the mover too */
		peer_destroy_flow(s->peers, *out, NULL);
		*out = NULL;
		snprintf(err, cap, "cannot reach peer %s", spec->peer);
	}
	return rc;
}

/* create --peer B --peer C...: the peers after the first (fanout.h); all
 * or nothing.  Each may need a connection uid may not make (asked after
 * the ones before it are made, so that they count). */
static int add_more_peers(struct ctl_server *s, struct flow *f, uid_t uid,
			  const Flowmover__FlowSpec *sp, char *err, size_t cap)
{
	int rc = 0;

	for (size_t i = 0; i < sp->n_more_peers && !rc; i++) {
		rc = peer_may_dial(s->peers, sp->more_peers[i], uid, err, cap);
		if (!rc)
			rc = fanout_add(s->peers, f, sp->more_peers[i],
					i + 1 == sp->n_more_peers, err, cap);
	}
	if (rc)
		peer_destroy_flow(s->peers, f, NULL);
	return rc;
}

static bool may_see(const struct ctl_client *c, const struct flow *f);

/*
 * Creating a flow that exists: done already if it has the same
 * parameters (a script or a unit may create at every start; a declared
 * flow is there before them), else an error naming the first parameter
 * that differs.  Someone who may not see the flow learns only that the
 * name is taken.  A flow another user created is never "done already":
 * it is theirs (they may read what is written into it), and a script that
 * took it for its own would hand them its records.
 */
static void create_exists(struct ctl_client *c, uint64_t id,
			  const struct flow_spec *spec, const char *err)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT;
	struct flow *f = flows_find(c->srv->flows, spec->name);
	char why[256];

	if (!f || !may_see(c, f)) {
		respond_error(c, id, -EEXIST, "%s", err);
		return;
	}
	if (f->role != FLOW_RECEIVER && f->owner_uid != c->uid &&
	    !declared_has(c->srv->declared, f)) {
		respond_error(c, id, -EEXIST, "flow '%s' already exists, created "
			      "by uid %u", f->name, (unsigned)f->owner_uid);
		return;
	}
	if (declared_differs(c->srv->flows, f, spec, why, sizeof(why))) {
		respond_error(c, id, -EEXIST, "flow '%s' already exists with a "
			      "different %s", f->name, why);
		return;
	}
	fill_info(f, &fi);
	fi.existed = true;
	fi.declared = declared_has(c->srv->declared, f);
	resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
	resp.flow = &fi;
	respond(c, &resp, id, NULL);
}

static void do_create(struct ctl_client *c, uint64_t id,
		      const Flowmover__FlowSpec *sp)
{
	struct flow_spec spec = {
		.name = sp->name,
		.ring_size = sp->ring_size,
		.max_record = sp->max_record,
		.allow_uids = sp->allow_uids,
		.n_allow_uids = sp->n_allow_uids,
		.allow_gids = sp->allow_gids,
		.n_allow_gids = sp->n_allow_gids,
		.max_lag = sp->max_lag,
		.more_peers = (const char *const *)sp->more_peers,
		.n_more_peers = sp->n_more_peers,
	};
	struct flow *f = NULL;
	char err[256];
	int rc;

	if (sp->peer && sp->peer[0]) {
		if (!strchr(sp->peer, ':') || strlen(sp->peer) >= 80) {
			respond_error(c, id, -EINVAL, "peer '%.100s' is not "
				      "HOST:PORT", sp->peer);
			return;
		}
		spec.role = FLOW_SENDER;
		spec.peer = sp->peer;
	} else if (sp->n_more_peers) {
		respond_error(c, id, -EINVAL, "more peers without a first one");
		return;
	}
	if (sp->n_more_peers >= FANOUT_MAX_PEERS) {
		respond_error(c, id, -EINVAL, "at most %u peer hosts per flow",
			      FANOUT_MAX_PEERS);
		return;
	}
	/* a new peer address is a new connection: capped (peer_may_dial);
	 * a flow that exists already rides one, and is not refused here */
	rc = spec.peer ? peer_may_dial(c->srv->peers, spec.peer, c->uid, err,
				       sizeof(err)) : 0;
	if (rc) {
		respond_error(c, id, rc, "%s", err);
		return;
	}
	rc = ctl_create_flow(c->srv, &spec, c->uid, c->gid, &f, err,
			     sizeof(err));
	if (!rc && sp->n_more_peers)
		rc = add_more_peers(c->srv, f, c->uid, sp, err, sizeof(err));
	if (rc == -EEXIST && !f)
		create_exists(c, id, &spec, err);
	else if (rc)
		respond_error(c, id, rc, "%s", err);
	else
		respond_flow(c, id, f, NULL);
}

static void start_wait(struct ctl_client *c, enum wait_kind kind, uint64_t id,
		       const char *name, enum flowshm_role role, int64_t owner,
		       uint32_t wait_ms, struct flow *held, uint64_t run);

/* moverctl reload: root or moverd's own user (the file is theirs).  The
 * config is read off the loop (reload.h): the request waits for its run,
 * and ctl_reload_done answers it. */
static void do_reload(struct ctl_client *c, uint64_t id)
{
	char err[160];
	uint64_t run;

	if (!flows_is_operator(c->uid)) {
		respond_error(c, id, -EACCES, "permission denied: only root "
			      "may reload moverd's config");
		return;
	}
	run = reload_ask(c->srv->reloader, err, sizeof(err));
	if (!run) {
		respond_error(c, id, -EAGAIN, "%s", err);
		return;
	}
	start_wait(c, WAIT_RELOAD, id, "", FLOWSHM_PRODUCER, -1, 0, NULL, run);
}

/* A reload's answer: its report's lines (16 KiB of text, 256 lines at
 * most: a frame holds them; the log has every line). */
static void respond_reload(struct ctl_client *c, uint64_t id,
			   const struct declared_reading *rd)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__ReloadResult rr = FLOWMOVER__RELOAD_RESULT__INIT;
	char text[sizeof(rd->text)], *lines[256], *save = NULL;
	size_t n = 0;

	if (rd->rc) {
		respond_error(c, id, rd->rc, "%s", rd->err);
		return;
	}
	memcpy(text, rd->text, sizeof(text));
	for (char *l = strtok_r(text, "\n", &save); l && n < 256;
	     l = strtok_r(NULL, "\n", &save))
		lines[n++] = l;
	rr.added = rd->r.added;
	rr.removed = rd->r.removed;
	rr.changed = rd->r.changed;
	rr.unchanged = rd->r.unchanged;
	rr.refused = rd->r.refused;
	rr.n_lines = n;
	rr.lines = lines;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_RELOAD;
	resp.reload = &rr;
	respond(c, &resp, id, NULL);
}

void ctl_reload_done(void *arg, uint64_t run,
		     const struct declared_reading *rd)
{
	struct ctl_server *s = arg;

	for (struct ctl_client *c = s->clients, *n; c; c = n) {
		uint64_t id = c->wait.id;

		n = c->next;
		if (c->gone || c->wait.kind != WAIT_RELOAD ||
		    c->wait.run > run)
			continue;
		end_wait(c);
		respond_reload(c, id, rd);
	}
}

static struct flow *find_or_fail(struct ctl_client *c, uint64_t id,
				 const char *name)
{
	struct flow *f = flows_find(c->srv->flows, name);

	if (!f)
		respond_error(c, id, -ENOENT, "no such flow '%.80s'", name);
	return f;
}

/*
 * The flow, if it exists and this client may change it (root and the
 * flow's owner); else the error is answered and NULL returned.  Who may
 * see the flow (may_see) learns whose it is; anyone else only that the
 * name is taken, as create_exists tells them: its owner is nobody else's
 * business.
 */
static struct flow *manageable_or_fail(struct ctl_client *c, uint64_t id,
				       const char *name)
{
	struct flow *f = find_or_fail(c, id, name);

	if (!f || flows_may_manage(f, c->uid))
		return f;
	if (may_see(c, f))
		respond_error(c, id, -EACCES, "permission denied: flow '%s' "
			      "belongs to uid %u (only root and its owner may "
			      "change it)", f->name, (unsigned)f->owner_uid);
	else
		respond_error(c, id, -EACCES, "permission denied: flow '%s' "
			      "is not yours (only root and its owner may "
			      "change it)", f->name);
	return NULL;
}

/*
 * Has every committed record reached the consumer?  Local and receiver
 * flows: the consumer's head is at the tail.  Sender flows: the peer has
 * every byte (acked) and its consumer released them (remote_head, carried
 * by the acks).
 */
/*
 * Has every reader of f's records had all of them?  The ring's slowest
 * subscriber slot is at the tail (a receiver's consumers; a sender's local
 * consumers and moverd's own slots, which follow what their peers
 * acknowledged), and on a sender each subscription that keeps its place
 * (a fan-out flow's every peer but a cut one) was acknowledged and read
 * to the tail.  The first peer's alone answered a drain while another
 * peer, or a local consumer, had not had them (a review).
 */
static bool flow_drained(const struct flow *f)
{
	struct flowshm_info in;

	if (!f->view || flowshm_info(f->view, &in))
		return true;
	if (flows_unread(f->view))
		return false;
	if (f->role != FLOW_SENDER)
		return true;
	for (const struct flow *s = f; s; s = flow_next_sub(f, s))
		if (!s->sub_dropped && s->state != FLOW_FAILED &&
		    (s->acked != in.tail || s->remote_head != in.tail))
			return false;
	return true;
}

static void destroy_now(struct ctl_client *c, uint64_t id, struct flow *f)
{
	peer_destroy_flow(c->srv->peers, f, "destroyed on the receiving host "
			  "by its operator");
	respond_ok(c, id);
}

/* Park c's request until name's flow comes (or, drain, held goes; reload,
 * reload run number run ends), or wait_ms pass.  c may be gone when it
 * returns (no SQE for its read). */
static void start_wait(struct ctl_client *c, enum wait_kind kind, uint64_t id,
		       const char *name, enum flowshm_role role, int64_t owner,
		       uint32_t wait_ms, struct flow *held, uint64_t run)
{
	struct ctl_server *s = c->srv;

	c->wait = (struct ctl_wait){
		.kind = kind, .role = role, .id = id, .owner = owner, .run = run,
		.until_ns = wait_ms ? fr_now_ns() + wait_ms * 1000000ull :
				      UINT64_MAX,
		.flow = held ? flow_get(held) : NULL,
	};
	snprintf(c->wait.name, sizeof(c->wait.name), "%s", name);
	s->n_waiting++;
	arm_wait_tick(s);
	/* last: without an SQE it ends the client (end_wait puts held) */
	if (!c->rd.busy && c->have < sizeof(c->in))
		arm_read(c); /* to see the client hang up meanwhile */
}

static void end_wait(struct ctl_client *c)
{
	if (c->wait.kind != WAIT_NONE)
		c->srv->n_waiting--;
	if (c->wait.flow)
		flow_put(c->wait.flow);
	c->wait.flow = NULL;
	c->wait.kind = WAIT_NONE;
}

/*
 * destroy --drain: close the ring for producers (they get -EPIPE; the
 * consumer still reads what is in it, then gets -EPIPE), then destroy once
 * the consumer has every record (flow_drained); answered then.
 */
static void start_drain(struct ctl_client *c, uint64_t id, struct flow *f,
			uint32_t timeout_ms)
{
	if (!f->draining) {
		/* the state stays: a sender goes on sending (the mover
		 * sends for open flows only) and reconnecting */
		f->draining = true;
		flows_status(f);
		flowshm_shutdown(f->view);
		log_info("flow %s: draining (flow destroy --drain): no new "
			 "sends", f->name);
	}
	if (flow_drained(f)) {
		destroy_now(c, id, f);
		return;
	}
	start_wait(c, WAIT_DRAIN, id, f->name, FLOWSHM_PRODUCER, -1, timeout_ms,
		   f, 0);
}

static void do_destroy(struct ctl_client *c, uint64_t id,
		       const Flowmover__DestroyFlow *d)
{
	struct flow *f = manageable_or_fail(c, id, d->name);

	if (!f)
		return;
	if (d->drain) {
		start_drain(c, id, f, d->drain_timeout_ms);
		return;
	}
	destroy_now(c, id, f);
}

/* flow peer add / remove: root and the flow's owner may. */
static void do_fanout_peer(struct ctl_client *c, uint64_t id,
			   const Flowmover__FanoutPeerEdit *e)
{
	struct flow *f = manageable_or_fail(c, id, e->name);
	char err[320];
	int rc;

	if (!f)
		return;
	/* each edit queues an OPEN or a CLOSE on a connection other users'
	 * flows share: one user looping add and remove would fill its queue
	 * (and fail it) */
	rc = flows_charge_edit(c->srv->flows, f->name, c->uid, err,
			       sizeof(err));
	if (!rc && e->remove)
		rc = fanout_remove(c->srv->peers, f, e->peer, err, sizeof(err));
	else if (!rc && !(rc = peer_may_dial(c->srv->peers,
					     e->peer ? e->peer : "", c->uid,
					     err, sizeof(err))))
		rc = fanout_add(c->srv->peers, f, e->peer, true, err,
				sizeof(err));
	if (rc)
		respond_error(c, id, rc, "%s", err);
	else
		respond_flow(c, id, f, NULL);
}

/* flow allow / disallow: root and the flow's owner may. */
static void do_allow(struct ctl_client *c, uint64_t id,
		     const Flowmover__FlowAllow *a)
{
	static struct log_limit lim; /* an owner may ask at will */
	struct flow *f = manageable_or_fail(c, id, a->name);
	char err[256];
	int rc;

	if (!f)
		return;
	rc = flows_allow(c->srv->flows, f, a->uids, a->n_uids, a->gids,
			 a->n_gids, a->remove, err, sizeof(err));
	if (rc) {
		respond_error(c, id, rc, "%s", err);
		return;
	}
	log_limited(&lim, LOG_LVL_INFO, "flow %s: uid %u %s %zu uids and %zu "
		    "gids", f->name, (unsigned)c->uid,
		    a->remove ? "disallowed" : "allowed", a->n_uids, a->n_gids);
	respond_flow(c, id, f, NULL);
}

/*
 * Who may see a flow (show, list): root, its owner and the ids allowed to
 * attach, the same as may attach.  To anyone else it does not exist: its
 * owner, allow lists and peer are nobody else's business.
 */
static bool may_see(const struct ctl_client *c, const struct flow *f)
{
	return flows_may_attach(f, c->uid, c->gid) ||
	       flows_group_allowed(f, c->groups, c->n_groups);
}

static void do_describe(struct ctl_client *c, uint64_t id,
			const Flowmover__DescribeFlow *d)
{
	struct flow *f = flows_find(c->srv->flows, d->name);

	if (!f && d->wait_ms && flows_valid_name(d->name)) {
		start_wait(c, WAIT_DESCRIBE, id, d->name, FLOWSHM_PRODUCER, -1,
			   d->wait_ms, NULL, 0);
		return;
	}
	if (!f || !may_see(c, f)) {
		respond_error(c, id, -ENOENT, "no such flow '%.80s'", d->name);
		return;
	}
	respond_flow(c, id, f, NULL);
}

static int by_name(const void *a, const void *b)
{
	return strcmp((*(struct flow *const *)a)->name,
		      (*(struct flow *const *)b)->name);
}

/* The flows this client may see, named after `after`, in name order. */
static unsigned visible_after(struct ctl_client *c, const char *after,
			      struct flow **out)
{
	unsigned n = 0;

	for (struct flow *f = c->srv->flows->head; f; f = f->next)
		if (may_see(c, f) && strcmp(f->name, after) > 0)
			out[n++] = f;
	qsort(out, n, sizeof(*out), by_name);
	return n;
}

/* Room for the flows of one page: a frame, less the envelope. */
#define LIST_PAGE_BYTES (CTL_MAX_FRAME - 256)

/*
 * One page of the list: as many flows as fit a frame (or `limit`), and
 * `more` if others follow; the client asks again after the last name.
 */
static void do_list(struct ctl_client *c, uint64_t id,
		    const Flowmover__ListFlows *req)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowList list = FLOWMOVER__FLOW_LIST__INIT;
	unsigned count = c->srv->flows->count, n, i;
	struct flow **flows = calloc(count ? count : 1, sizeof(*flows));
	Flowmover__FlowInfo *infos = calloc(count ? count : 1, sizeof(*infos));
	Flowmover__FlowInfo **ptrs = calloc(count ? count : 1, sizeof(*ptrs));
	/* the peer hosts of the flows that have several (fanout.h) */
	struct fanout_info **fos = calloc(count ? count : 1, sizeof(*fos));
	size_t bytes = 0;

	if (!flows || !infos || !ptrs || !fos) {
		respond_error(c, id, -ENOMEM, "out of memory");
		goto out;
	}
	n = visible_after(c, req && req->after ? req->after : "", flows);
	for (i = 0; i < n && (!req || !req->limit || i < req->limit); i++) {
		size_t one;

		flowmover__flow_info__init(&infos[i]);
		fill_info(flows[i], &infos[i]);
		if (flows[i]->fanout)
			fos[i] = malloc(sizeof(*fos[i]));
		fill_fanout(flows[i], &infos[i], fos[i]);
		infos[i].declared = declared_has(c->srv->declared, flows[i]);
		/* the message, its tag and its length prefix */
		one = protobuf_c_message_get_packed_size(&infos[i].base) + 4;
		if (i && bytes + one > LIST_PAGE_BYTES)
			break;
		bytes += one;
		ptrs[i] = &infos[i];
	}
	list.n_flows = i;
	list.flows = ptrs;
	list.more = i < n;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_LIST;
	resp.list = &list;
	respond(c, &resp, id, NULL);
out:
	for (i = 0; fos && i < count; i++)
		free(fos[i]);
	free(fos);
	free(flows);
	free(infos);
	free(ptrs);
}

/* A slot was taken for the client (rc 0), or answer why not. */
static bool slot_taken(struct ctl_client *c, uint64_t id, const struct flow *f,
		       int rc, const char *kind, unsigned all)
{
	if (rc == -EBUSY)
		respond_error(c, id, -EBUSY, "flow '%s': all %u %s slots taken",
			      f->name, all, kind);
	else if (rc)
		respond_error(c, id, rc, "flow '%s': no %s slot: %s", f->name,
			      kind, strerror(-rc));
	return rc == 0;
}

/*
 * A consumer allowed on a flow it may not manage (by uid or group, not
 * its owner or an operator) is a guest there.  Guests share what the
 * owner leaves them: they never take the last GUEST_SPARE_SUBS free
 * subscriber slots (the owner's consumers need them, and so do moverd's
 * own subscriptions on a sending host: a fan-out peer added, a cut peer's
 * rejoin), and one uid holds at most GUEST_SUBS_PER_UID (another allowed
 * user still finds slots).  A review: a uid allowed on another user's flow
 * took all 16 and the owner's consumer got -EBUSY.  On a receiving end
 * moverd holds no slot and the owner is the host's --peer-flow-owner, so
 * nothing is kept there; the per-uid share holds.  Only moverd's way in
 * is counted: a client writing the slot words itself is within the trust
 * of the flow, whose ring it may write anyway (docs/security.md).
 */
enum { GUEST_SPARE_SUBS = 2, GUEST_SUBS_PER_UID = FR_MAX_SUBS / 2 };

/* Producer slots the same way: a guest uid holds at most
 * GUEST_PRODS_PER_UID of them and never takes the last GUEST_SPARE_PRODS
 * free (a review: 64 producer attaches of one allowed uid took them all,
 * and the owner's producers got -EBUSY). */
enum { GUEST_SPARE_PRODS = 8, GUEST_PRODS_PER_UID = FR_MAX_PRODS / 2 };

/* The slots moverd holds for uid's clients of `role` on f: every
 * consumer's subscriber slot, the producer slots taken for producers. */
static unsigned slots_held_by(const struct ctl_server *s,
			      const struct flow *f, uid_t uid,
			      enum flowshm_role role)
{
	unsigned n = 0;

	for (const struct ctl_client *c = s->clients; c; c = c->next) {
		if (c->uid != uid)
			continue;
		for (unsigned i = 0; i < c->n_att; i++)
			n += c->att[i].flow == f && c->att[i].role == role &&
			     (role == FLOWSHM_CONSUMER ||
			      c->att[i].slot < FR_MAX_PRODS);
	}
	return n;
}

/* May c's consumer take a slot of f (ring mapped)?  False: answered. */
static bool guest_may_take(struct ctl_client *c, uint64_t id,
			   const struct flow *f)
{
	/* slots FREE, not mask bits: a slot max_lag cut is clear in the
	 * mask and still taken until its holder leaves (a review: two
	 * guests took the owner's two past 8 cut ones) */
	unsigned spare = fr_sub_free_slots(&f->view->ring);
	unsigned kept = f->role == FLOW_RECEIVER ? 0 : GUEST_SPARE_SUBS;
	unsigned held;

	if (flows_may_manage(f, c->uid))
		return true;
	held = slots_held_by(c->srv, f, c->uid, FLOWSHM_CONSUMER);
	if (held >= GUEST_SUBS_PER_UID) {
		respond_error(c, id, -EBUSY, "flow '%s': uid %u holds %u of its "
			      "%u subscriber slots, the most a uid other than "
			      "its owner may hold", f->name, (unsigned)c->uid,
			      held, FR_MAX_SUBS);
		return false;
	}
	if (kept && spare <= kept) {
		respond_error(c, id, -EBUSY, "flow '%s': %u of its %u "
			      "subscriber slots are free, and the last %u are "
			      "kept for its owner's consumers and moverd",
			      f->name, spare, FR_MAX_SUBS, kept);
		return false;
	}
	return true;
}

/* A consumer is a subscriber of the ring (ring format 2): take a slot for
 * it in the client's pid; false (answered) if none is free. */
static bool take_slot(struct ctl_client *c, uint64_t id, struct flow *f,
		      struct attachment *att)
{
	int rc;

	if (f->view && !guest_may_take(c, id, f))
		return false;
	rc = f->view ? fr_sub_take(&f->view->ring, (uint32_t)c->pid &
				   FR_INFO_PID, &att->slot, &att->gen) :
		       -EPIPE;
	if (!rc) {
		/* re-attaching after every subscriber was cut: near the tail */
		fr_sub_skip_lag(&f->view->ring, att->slot);
		/* for the counters' records consumed (counters.c) */
		f->subs_taken |= 1u << att->slot;
		f->sub_taken_gen[att->slot] = att->gen;
		/* ours now, in a pid we may not see (0): not the last
		 * start's to judge (flows_watch_inherited) */
		f->inherited_slots &= ~(1u << att->slot);
	}
	return slot_taken(c, id, f, rc, "subscriber", FR_MAX_SUBS);
}

/* May c's producer take a producer slot of f (ring mapped)?  False:
 * answered. */
static bool guest_may_produce(struct ctl_client *c, uint64_t id,
			      const struct flow *f)
{
	struct fr_ring *r = &f->view->ring;
	unsigned held, spare;

	if (flows_may_manage(f, c->uid))
		return true;
	held = slots_held_by(c->srv, f, c->uid, FLOWSHM_PRODUCER);
	if (held >= GUEST_PRODS_PER_UID) {
		respond_error(c, id, -EBUSY, "flow '%s': uid %u holds %u of its "
			      "%u producer slots, the most a uid other than its "
			      "owner may hold", f->name, (unsigned)c->uid, held,
			      FR_MAX_PRODS);
		return false;
	}
	spare = fr_prod_free_slots(r);
	/* dead producers' slots count as free once given back (a take
	 * with none free does the same) */
	if (spare <= GUEST_SPARE_PRODS && fr_prod_leave_dead(r))
		spare = fr_prod_free_slots(r);
	if (spare <= GUEST_SPARE_PRODS) {
		respond_error(c, id, -EBUSY, "flow '%s': %u of its %u producer "
			      "slots are free, and the last %u are kept for its "
			      "owner's producers", f->name, spare, FR_MAX_PRODS,
			      GUEST_SPARE_PRODS);
		return false;
	}
	return true;
}

/* A producer names its claims in a producer slot (ipc/ring.h, Producer
 * slots): take one for it in the client's pid; false (answered) if none.
 * A client whose pid we cannot see (0: another pid namespace) takes one
 * itself, in the pid it sees. */
static bool take_prod_slot(struct ctl_client *c, uint64_t id, struct flow *f,
			   struct attachment *att)
{
	uint32_t gen = 0;
	int rc;

	att->slot = FR_MAX_PRODS;
	if (c->pid <= 0)
		return true;
	if (f->view && !guest_may_produce(c, id, f))
		return false;
	rc = f->view ? fr_prod_take(&f->view->ring, (uint32_t)c->pid &
				    FR_INFO_PID, &att->slot, &gen) :
		       -EPIPE;

	att->gen = gen;
	return slot_taken(c, id, f, rc, "producer", FR_MAX_PRODS);
}

/* The attach answer: the flow, its ring fd, and the slot taken for the
 * client (a consumer's subscriber slot, a producer's producer slot); for
 * a producer of a flow to another host, its bit in the doorbell pages and
 * the fd of its own uid's page (peer.h, struct bell_page). */
static void respond_attach(struct ctl_client *c, uint64_t id, struct flow *f,
			   struct attachment *att)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT;

	fill_info(f, &fi);
	if (att->role == FLOWSHM_CONSUMER) {
		fi.sub_slot = att->slot + 1;
		fi.sub_gen = att->gen;
	} else if (att->slot < FR_MAX_PRODS) {
		fi.prod_slot = att->slot + 1;
		fi.prod_gen = (uint32_t)att->gen;
	}
	/* whose pids the ring holds (ipc/ring.h, Liveness) */
	fi.client_pid = c->pid > 0 && (uint32_t)c->pid < FR_PID_UNKNOWN ?
				(uint32_t)c->pid : FR_PID_UNKNOWN;
	fi.pid_ns = fr_pid_ns();
	if (att->role == FLOWSHM_PRODUCER) {
		fi.bell_index = mover_bell_index(c->srv->peers, f);
		if (fi.bell_index)
			c->out_bell_fd = mover_bell_take(c->srv->peers, c->uid,
							 &att->bell_page);
		if (c->out_bell_fd < 0) {
			c->out_bell_fd = -1;
			fi.bell_index = 0;
		}
	}
	resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
	resp.flow = &fi;
	respond(c, &resp, id, f);
}

/*
 * Does the flow have this role on this host?  A producer attaches where
 * the flow is fed, a consumer where it is read: NULL, or the sentence
 * that says where to attach instead (issue 15).  A consumer on the
 * sending host is a subscriber of its own (ring format 2): moverd sends
 * from its own slot, so it takes nothing from the peer.
 */
static const char *wrong_role(const struct flow *f, enum flowshm_role role,
			      char *buf, size_t cap)
{
	if (f->role == FLOW_RECEIVER && role == FLOWSHM_PRODUCER) {
		snprintf(buf, cap, "flow '%s' is fed from another host (peer "
			 "%s): attach producers there; here it has consumers "
			 "only", f->name, f->origin[0] ? f->origin : "?");
		return buf;
	}
	return NULL;
}

/* owner >= 0: the client attaches only to a flow that uid owns (the name
 * may have been taken by someone else first: docs/security.md). */
static void attach_found(struct ctl_client *c, uint64_t id, struct flow *f,
			 enum flowshm_role role, int64_t owner)
{
	struct attachment att;
	char why[320];

	if (!flows_may_attach(f, c->uid, c->gid) &&
	    !flows_group_allowed(f, c->groups, c->n_groups)) {
		respond_error(c, id, -EACCES, "permission denied: uid %u may not "
			      "attach to flow '%s'", (unsigned)c->uid, f->name);
		return;
	}
	if (owner >= 0 && f->owner_uid != (uid_t)owner) {
		respond_error(c, id, -EACCES, "flow '%s' is owned by uid %u, not "
			      "by uid %u as asked: not attached", f->name,
			      (unsigned)f->owner_uid, (unsigned)owner);
		return;
	}
	if (wrong_role(f, role, why, sizeof(why))) {
		respond_error(c, id, -EINVAL, "%s", why);
		return;
	}
	if (flow_cut_off(f)) {
		/* its ring is closed and gone at the sender's rejoin: a
		 * consumer let in now would read nothing and then -EPIPE,
		 * "closed", which it is not */
		respond_error(c, id, -ESTALE, "flow '%s' here was cut off by "
			      "its sender (more than its max_lag behind); the "
			      "sender opens it again at its current position: "
			      "attach again then", f->name);
		return;
	}
	if (c->n_att == ATTACH_MAX) {
		respond_error(c, id, -ENOSPC, "too many attachments on one "
			      "connection (limit %d)", ATTACH_MAX);
		return;
	}
	att = (struct attachment){ .flow = f, .role = role };
	if (role == FLOWSHM_CONSUMER ? !take_slot(c, id, f, &att) :
				       !take_prod_slot(c, id, f, &att))
		return;
	c->att[c->n_att++] = att;
	if (role == FLOWSHM_CONSUMER)
		f->consumers++;
	else
		f->producers++;
	log_debug("flow %s: pid %d attached as %s", f->name, (int)c->pid,
		  role == FLOWSHM_CONSUMER ? "consumer" : "producer");
	flows_status(f);
	respond_attach(c, id, f, &c->att[c->n_att - 1]);
}

/* A producer attached on this connection ends its stream. */
static void do_end_stream(struct ctl_client *c, uint64_t id,
			  const Flowmover__EndStream *e)
{
	struct attachment *a = NULL;

	for (unsigned i = 0; i < c->n_att && !a; i++) {
		if (c->att[i].role == FLOWSHM_PRODUCER &&
		    !strcmp(c->att[i].flow->name, e->name))
			a = &c->att[i];
	}
	if (!a) {
		respond_error(c, id, -EINVAL, "no producer of flow '%.80s' is "
			      "attached on this connection", e->name);
		return;
	}
	if (!a->ended) {
		a->ended = true;
		a->flow->producers_ended++;
		a->flow->producers_ended_ever = true;
		log_debug("flow %s: pid %d ended its stream", a->flow->name,
			  (int)c->pid);
		eos_update(a->flow);
	}
	respond_ok(c, id);
}

/* moverctl flow end: the owner (or root) ends the stream now. */
static void do_end_flow(struct ctl_client *c, uint64_t id,
			const Flowmover__EndFlow *e)
{
	struct flow *f = manageable_or_fail(c, id, e->name);

	if (!f)
		return;
	if (f->role == FLOW_RECEIVER) {
		respond_error(c, id, -EINVAL, "flow '%s' is fed from %s: end "
			      "it on that host", f->name,
			      f->origin[0] ? f->origin : "its sending host");
		return;
	}
	eos_force(f);
	respond_ok(c, id);
}

static void do_attach(struct ctl_client *c, uint64_t id,
		      const Flowmover__Attach *a)
{
	enum flowshm_role role = a->role == FLOWMOVER__ROLE__CONSUMER ?
					 FLOWSHM_CONSUMER : FLOWSHM_PRODUCER;
	struct flow *f = flows_find(c->srv->flows, a->name);
	int64_t owner = a->check_owner ? (int64_t)a->owner_uid : -1;

	/* a flow cut off here is waited for as one not there yet: its
	 * sender's rejoin creates it again (flow_added answers then) */
	if ((!f || flow_cut_off(f)) && a->wait_ms &&
	    flows_valid_name(a->name)) {
		start_wait(c, WAIT_ATTACH, id, a->name, role, owner,
			   a->wait_ms, NULL, 0);
		return;
	}
	if (!f) {
		respond_error(c, id, -ENOENT, "no such flow '%.80s'", a->name);
		return;
	}
	attach_found(c, id, f, role, owner);
}

/* ---- requests that wait ---------------------------------------------------- */

/* The flow a waiting client asked for appeared: answer as if it had been
 * there when the request came. */
static void wait_found(struct ctl_client *c, struct flow *f)
{
	struct ctl_wait w = c->wait;

	end_wait(c);
	if (w.kind == WAIT_ATTACH)
		attach_found(c, w.id, f, w.role, w.owner);
	else
		respond_flow(c, w.id, f, NULL);
}

static void wait_timed_out(struct ctl_client *c)
{
	struct ctl_wait w = c->wait;

	end_wait(c);
	if (w.kind == WAIT_DRAIN)
		respond_error(c, w.id, -ETIMEDOUT, "flow '%s' not drained in "
			      "time: a consumer (here, or on a peer host) "
			      "still has records to read; "
			      "it stays closed to producers (destroy it, or "
			      "drain again)", w.name);
	else if (w.kind == WAIT_ATTACH)
		respond_error(c, w.id, -ETIMEDOUT, "flow '%s' did not appear "
			      "in time", w.name);
	else
		respond_error(c, w.id, -ENOENT, "no such flow '%s' (waited "
			      "for it)", w.name);
}

/* A waiting client whose buffer is full has no read armed (read_done), so
 * no read ends with its hang-up: its slot, and a drain's flow reference,
 * were kept until moverd stopped.  Looked for at each tick instead (a
 * system call per such client, within its uid's --max-clients-per-uid). */
static bool hung_up(const struct ctl_client *c)
{
	struct pollfd pfd = { .fd = c->fd, .events = POLLRDHUP };

	return !c->rd.busy && poll(&pfd, 1, 0) > 0 &&
	       (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* One waiting client, at a tick: gone, drained, or out of time.  (A flow
 * that appears answers its waiters at once: flow_added.) */
static void check_wait(struct ctl_client *c, uint64_t now)
{
	struct flow *f = c->wait.flow;
	uint64_t id = c->wait.id;

	if (hung_up(c)) {
		client_gone(c);
		return;
	}
	if (c->wait.kind != WAIT_DRAIN) {
		if (now >= c->wait.until_ns)
			wait_timed_out(c);
		return;
	}
	if (f->dead) {
		end_wait(c);
		respond_ok(c, id); /* destroyed meanwhile */
	} else if (flow_drained(f)) {
		flow_get(f); /* end_wait drops the wait's reference */
		end_wait(c);
		destroy_now(c, id, f);
		flow_put(f);
	} else if (now >= c->wait.until_ns) {
		wait_timed_out(c);
	}
}

#define WAIT_TICK_NS 20000000ll  /* 20 ms: drains and time-outs */

static void wait_tick_done(struct loop_op *op, int res)
{
	struct ctl_server *s = (struct ctl_server *)((char *)op -
		offsetof(struct ctl_server, wait_op));
	uint64_t now = fr_now_ns();

	(void)res;
	for (struct ctl_client *c = s->clients, *n; c; c = n) {
		n = c->next;
		if (!c->gone && c->wait.kind != WAIT_NONE)
			check_wait(c, now);
	}
	arm_wait_tick(s);
}

/* Armed while a request waits (and the server runs). */
static void arm_wait_tick(struct ctl_server *s)
{
	struct io_uring_sqe *sqe;

	if (!s->n_waiting || s->wait_op.busy || s->listen_fd < 0)
		return;
	sqe = loop_sqe(s->loop, &s->wait_op, wait_tick_done);
	s->wait_ts = (struct __kernel_timespec){ .tv_nsec = WAIT_TICK_NS };
	if (sqe)
		io_uring_prep_timeout(sqe, &s->wait_ts, 0, 0);
}

/* flows_create's hook: a flow appeared; a declared receiving end gets its
 * ids (once: a later `flow disallow` stays), then who waited for it is
 * answered. */
static void flow_added(void *arg, struct flow *f)
{
	struct ctl_server *s = arg;

	declared_grant(s->declared, f);
	for (struct ctl_client *c = s->clients, *n; c; c = n) {
		n = c->next;
		if (c->gone || strcmp(c->wait.name, f->name))
			continue;
		/* a flow this client may not see stays unseen: its wait
		 * ends at its timeout, as if the flow had not come */
		if (c->wait.kind == WAIT_ATTACH ||
		    (c->wait.kind == WAIT_DESCRIBE && may_see(c, f)))
			wait_found(c, f);
	}
}

static void fill_peer_counters(const struct peer_stats *s,
			       Flowmover__PeerInfo *pi)
{
	pi->frames_sent = s->frames_tx;
	pi->frames_received = s->frames_rx;
	pi->ack_rtt_count = s->rtt_count;
	pi->ack_rtt_sum_ns = s->rtt_sum_ns;
	pi->ack_rtt_max_ns = s->rtt_max_ns;
	pi->heartbeats_missed = s->hb_missed;
	pi->rdma_wr_posted = s->wr_posted;
	pi->rdma_wc_polled = s->wc_polled;
	pi->window_cuts = s->win_cuts;
}

/* What the loop and the sampler count about moverd itself (counters.h). */
static void fill_daemon_counters(const struct counters *k,
				 Flowmover__StatusInfo *st)
{
	if (!k)
		return;
	st->work_cycles = k->d.work_cycles;
	st->wakes_doorbell = k->d.wake_doorbell;
	st->wakes_network = k->d.wake_network;
	st->wakes_timer = k->d.wake_timer;
	st->cpu_user_ns = k->cpu_user_ns;
	st->cpu_sys_ns = k->cpu_sys_ns;
	st->open_fds = k->fds;
}

/*
 * Of the n peers in ps, keep those a client may know of: root and moverd's
 * own user see every one; another user sees the peers that carry a flow it
 * may see (who else talks to which host, how much and why it failed is
 * nobody else's business: may_see).  Returns how many are kept.
 */
static unsigned visible_peers(const struct ctl_client *c,
			      struct peer_status *ps, unsigned n)
{
	bool seen[64] = { false };
	unsigned kept = 0;

	if (flows_is_operator(c->uid))
		return n;
	for (const struct flow *f = c->srv->flows->head; f; f = f->next) {
		if (!may_see(c, f))
			continue;
		/* its own peer, and its fan-out peers' (siblings) */
		for (const struct flow *s = f; s; s = flow_next_sub(f, s))
			for (unsigned i = 0; s->peer && i < n; i++)
				seen[i] |= ps[i].peer == s->peer;
	}
	for (unsigned i = 0; i < n; i++)
		if (seen[i])
			ps[kept++] = ps[i];
	return kept;
}

/*
 * Why a connection last failed, as c may read it: a reason that names a
 * flow c may not see (peer_fail_flow) is not shown to c, whom the flows
 * it may see brought here (visible_peers).
 */
static const char *peer_error_for(const struct ctl_client *c,
				  const struct peer_status *ps)
{
	const struct flow *f;

	if (!ps->last_error_flow[0] || flows_is_operator(c->uid))
		return ps->last_error;
	f = flows_find(c->srv->flows, ps->last_error_flow);
	if (f && may_see(c, f))
		return ps->last_error;
	return "the connection failed over a flow you may not see (an "
	       "operator's status says which and why)";
}

static void do_status(struct ctl_client *c, uint64_t id)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__StatusInfo st = FLOWMOVER__STATUS_INFO__INIT;
	static char *transports[] = { "local", "tcp", "rdma" };
	struct peer_status ps[64];
	Flowmover__PeerInfo pi[64], *pip[64];
	unsigned total, np = peer_status(c->srv->peers, ps, 64, &total);

	/* an operator sees them all, so is told of those not listed */
	if (flows_is_operator(c->uid))
		st.peers_not_listed = total - np;
	np = visible_peers(c, ps, np);

	st.version = FLOWSHM_VERSION;
	st.uptime_ms = (fr_now_ns() - c->srv->started_ns) / 1000000;
	st.starts = c->srv->flows->epoch;
	st.n_transports = c->srv->peers->rdma ? 3 : 2;
	st.doorbell = (char *)peer_doorbell_name(c->srv->peers);
	st.cycles = c->srv->peers->cycles;
	st.sleeps = c->srv->peers->sleeps;
	st.doorbell_rings = c->srv->peers->rings;
	st.bell_page = mover_bell_pages(c->srv->peers) > 0 &&
		       c->srv->peers->bell_mode != BELL_POLL;
	st.bell_pages = mover_bell_pages(c->srv->peers);
	st.bell_shared_producers = mover_bell_shared(c->srv->peers);
	st.bell_flows = c->srv->peers->bell_next -
			c->srv->peers->n_bell_free;
	if (c->srv->idle) {
		st.idle = (char *)idle_name(c->srv->idle->mode);
		st.idle_polls = c->srv->idle->spins + c->srv->idle->yields;
		st.idle_backoffs = c->srv->idle->backoffs;
	}
	if (c->srv->io_uring)
		st.io_uring = (char *)c->srv->io_uring;
	st.window_delay_us = c->srv->peers->win_delay_ns / 1000;
	st.ring_to_allocate_bytes = c->srv->flows->fill_pending;
	st.ring_to_free_bytes = c->srv->flows->punch_pending;
	st.destroyed_rings = c->srv->flows->n_gone;
	st.destroyed_ring_bytes = c->srv->flows->gone_bytes;
	st.clients_refused = c->srv->stats.clients_refused;
	st.peers_refused = c->srv->peers->refused;
	st.accept_waits = c->srv->accept_wait.waits +
			  c->srv->peers->accept_wait.waits;
	st.transports = transports;
	for (unsigned i = 0; i < np; i++) {
		flowmover__peer_info__init(&pi[i]);
		pi[i].address = (char *)ps[i].address;
		pi[i].state = (char *)ps[i].state;
		pi[i].transport = (char *)ps[i].transport;
		pi[i].last_error = (char *)peer_error_for(c, &ps[i]);
		pi[i].last_error_unix_ms = ps[i].last_error_unix_ms;
		pi[i].flows = ps[i].flows;
		pi[i].bytes_sent = ps[i].bytes_sent;
		pi[i].bytes_received = ps[i].bytes_received;
		pi[i].reconnects = ps[i].reconnects;
		pi[i].registrations = ps[i].registrations;
		pi[i].registered_bytes = ps[i].registered_bytes;
		pi[i].node = (char *)ps[i].node;
		pi[i].key_id = (char *)ps[i].key_id;
		pi[i].authenticated = ps[i].authenticated;
		fill_peer_counters(ps[i].st, &pi[i]);
		pi[i].window_bytes = ps[i].window;
		pi[i].unacked_bytes = ps[i].unacked;
		pip[i] = &pi[i];
	}
	st.n_peers = np;
	st.peers = pip;
	st.flows = c->srv->flows->count;
	st.clients = c->srv->n_clients;
	st.socket_path = (char *)c->srv->socket_path;
	st.listen = c->srv->peers->listen_addr;
	st.pid = (uint32_t)getpid();
	fill_daemon_counters(c->srv->counters, &st);
	resp.body_case = FLOWMOVER__RESPONSE__BODY_STATUS;
	resp.status = &st;
	respond(c, &resp, id, NULL);
}

static void run_request(struct ctl_client *c, const Flowmover__Request *req)
{
	uint64_t id = req->id;

	c->srv->stats.requests++;
	switch (req->body_case) {
	case FLOWMOVER__REQUEST__BODY_CREATE:
		do_create(c, id, req->create->spec);
		break;
	case FLOWMOVER__REQUEST__BODY_DESTROY:
		do_destroy(c, id, req->destroy);
		break;
	case FLOWMOVER__REQUEST__BODY_LIST:
		do_list(c, id, req->list);
		break;
	case FLOWMOVER__REQUEST__BODY_DESCRIBE:
		do_describe(c, id, req->describe);
		break;
	case FLOWMOVER__REQUEST__BODY_ATTACH:
		do_attach(c, id, req->attach);
		break;
	case FLOWMOVER__REQUEST__BODY_STATUS:
		do_status(c, id);
		break;
	case FLOWMOVER__REQUEST__BODY_ALLOW:
		do_allow(c, id, req->allow);
		break;
	case FLOWMOVER__REQUEST__BODY_RELOAD:
		do_reload(c, id);
		break;
	case FLOWMOVER__REQUEST__BODY_END_STREAM:
		do_end_stream(c, id, req->end_stream);
		break;
	case FLOWMOVER__REQUEST__BODY_END_FLOW:
		do_end_flow(c, id, req->end_flow);
		break;
	case FLOWMOVER__REQUEST__BODY_FANOUT_PEER:
		do_fanout_peer(c, id, req->fanout_peer);
		break;
	default:
		respond_error(c, id, -EPROTO, "request has no known body");
	}
}

/* ---- reading requests --------------------------------------------------- */

static void read_done(struct loop_op *op, int res)
{
	struct ctl_client *c = (struct ctl_client *)((char *)op -
		offsetof(struct ctl_client, rd));

	if (c->gone || res <= 0) {
		client_gone(c);
		return;
	}
	/* frames served while the read was in flight moved the buffer
	 * down: its bytes landed at rd_off, they belong at have */
	if (c->rd_off != c->have)
		memmove(c->in + c->have, c->in + c->rd_off, (size_t)res);
	c->have += (size_t)res;
	if (c->wait.kind != WAIT_NONE || c->wr.busy) {
		/* frames sent meanwhile wait their turn (write_done serves
		 * them); a full buffer stops the reading until then */
		if (c->have < sizeof(c->in))
			arm_read(c);
		return;
	}
	serve(c);
}

static void arm_read(struct ctl_client *c)
{
	struct io_uring_sqe *sqe = loop_sqe(c->srv->loop, &c->rd, read_done);

	if (!sqe) {
		client_gone(c);
		return;
	}
	c->rd_off = c->have;
	io_uring_prep_recv(sqe, c->fd, c->in + c->have, sizeof(c->in) - c->have,
			   0);
}

/* Serve the next buffered frame, or read more. */
static void serve(struct ctl_client *c)
{
	Flowmover__Request *req = NULL;
	char err[256];
	uint32_t len;
	int rc;

	if (c->have < 4) {
		if (!c->rd.busy) /* armed while a request waited */
			arm_read(c);
		return;
	}
	rc = ctl_frame_len(c->in, &len);
	if (rc) {
		c->closing = true; /* cannot find the next frame: hang up */
		respond_error(c, 0, rc, "bad frame length %u (1..%u bytes allowed)",
			      len, CTL_MAX_FRAME);
		return;
	}
	if (c->have < 4 + (size_t)len) {
		if (!c->rd.busy)
			arm_read(c);
		return;
	}
	rc = ctl_request_decode(c->in + 4, len, &req, err, sizeof(err));
	c->have -= 4 + (size_t)len;
	memmove(c->in, c->in + 4 + len, c->have);
	if (rc) {
		/* out of memory: not the client's fault, nor its request's */
		respond_error(c, 0, rc, "%s%s", rc == -ENOMEM ? "" :
			      "bad request: ", err);
		return;
	}
	run_request(c, req);
	flowmover__request__free_unpacked(req, NULL);
}

/* ---- accepting ---------------------------------------------------------- */

/*
 * The client's supplementary groups, for the allowed gids of a flow.
 * SO_PEERGROUPS (Linux 4.13) gives the groups the client had when it
 * connected, from the kernel, like SO_PEERCRED: no lookup, nothing that
 * blocks the loop, and no race with a pid that exits and is reused (as
 * reading /proc/PID/status would have).  Older kernels: getgrouplist of
 * the uid's passwd entry, the groups the user is configured to have (it
 * may ask NSS, and so block, which only such kernels pay for).  At most
 * CLIENT_GROUPS_MAX are kept; a group beyond them does not count (the
 * client is refused, never let in by mistake).
 */
static void read_groups(struct ctl_client *c)
{
	socklen_t len = sizeof(c->groups);
	gid_t *all;

	if (!getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, c->groups, &len)) {
		c->n_groups = len / sizeof(gid_t);
		return;
	}
	if (errno == ERANGE && (all = malloc(len))) {
		/* more than we keep: read all, keep the first */
		if (!getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, all, &len)) {
			memcpy(c->groups, all, sizeof(c->groups));
			c->n_groups = CLIENT_GROUPS_MAX;
			static struct log_limit lim; /* every connect */

			log_limited(&lim, LOG_LVL_INFO, "client pid %d: %u "
				    "supplementary groups, only the first %d "
				    "count for flows' allowed gids", (int)c->pid,
				    (unsigned)(len / sizeof(gid_t)),
				    CLIENT_GROUPS_MAX);
		}
		free(all);
		return;
	}
	if (errno == ENOPROTOOPT) {
		struct passwd pw, *pp = NULL;
		char buf[1024];
		int n = CLIENT_GROUPS_MAX;

		if (!getpwuid_r(c->uid, &pw, buf, sizeof(buf), &pp) && pp &&
		    getgrouplist(pp->pw_name, c->gid, c->groups, &n) >= 0)
			c->n_groups = (unsigned)n;
	}
}

/* The back-off after a failed accept ended: accept again. */
static void accept_wait_done(struct loop_op *op, int res)
{
	struct ctl_server *s = (struct ctl_server *)((char *)op -
		offsetof(struct ctl_server, accept_wait.op));

	(void)res;
	if (s->listen_fd >= 0)
		arm_accept(s);
}

static void accept_failed(struct ctl_server *s, int res)
{
	static struct log_limit lim;

	log_limited(&lim, LOG_LVL_WARN, "accept: %s%s", strerror(-res),
		    listener_must_wait(res) ? ": waiting before the next" : "");
	if (listener_must_wait(res))
		listener_wait(s->loop, &s->accept_wait, accept_wait_done);
	else
		arm_accept(s);
}

/* Connections root does not get: the reserve, at most half of them. */
static unsigned root_reserve(const struct ctl_server *s)
{
	return s->max_clients / 2 < CTL_ROOT_RESERVE ? s->max_clients / 2 :
						       CTL_ROOT_RESERVE;
}

/* May a client of uid come in on fd?  NULL, or why not. */
static const char *refuse_client(const struct ctl_server *s, int fd,
				 uid_t uid)
{
	unsigned same = 0;

	if (uid == 0)
		return s->n_clients >= s->max_clients ? "too many clients" : NULL;
	if (listener_fds_left(fd) < CTL_FD_RESERVE)
		return "near the open-file limit (the rest is kept for root)";
	if (s->n_clients >= s->max_clients - root_reserve(s))
		return "too many clients (the rest is kept for root)";
	/* clients that are gone count until freed: they hold their fd */
	for (const struct ctl_client *c = s->clients; c; c = c->next)
		same += c->uid == uid;
	if (same >= s->max_per_uid)
		return "too many connections of this uid";
	return NULL;
}

static void accept_done(struct loop_op *op, int res)
{
	struct ctl_server *s = (struct ctl_server *)((char *)op -
		offsetof(struct ctl_server, accept_op));
	static struct log_limit refused_lim;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	struct ctl_client *c;
	const char *refused;

	if (s->listen_fd < 0) {
		if (res >= 0)
			close(res);
		return;
	}
	if (res < 0) {
		accept_failed(s, res);
		return;
	}
	listener_ok(&s->accept_wait);
	arm_accept(s);
	if (getsockopt(res, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
		log_limited(&refused_lim, LOG_LVL_WARN, "refusing a control "
			    "client: SO_PEERCRED: %s", strerror(errno));
		close(res);
		return;
	}
	refused = refuse_client(s, res, cred.uid);
	if (refused) {
		s->stats.clients_refused++;
		log_limited(&refused_lim, LOG_LVL_WARN, "refusing a control "
			    "client (uid %u, pid %d): %s", (unsigned)cred.uid,
			    (int)cred.pid, refused);
		close(res);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		log_limited(&refused_lim, LOG_LVL_WARN, "refusing a control "
			    "client (uid %u, pid %d): out of memory",
			    (unsigned)cred.uid, (int)cred.pid);
		close(res);
		return;
	}
	c->srv = s;
	c->fd = res;
	c->out_bell_fd = -1;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->pid = cred.pid;
	read_groups(c);
	c->next = s->clients;
	s->clients = c;
	s->n_clients++;
	s->stats.clients_total++;
	arm_read(c);
}

static void arm_accept(struct ctl_server *s)
{
	struct io_uring_sqe *sqe = loop_sqe(s->loop, &s->accept_op, accept_done);

	if (!sqe) {
		/* ctl_server_rearm tries again */
		log_error("no submission slot for accept");
		return;
	}
	io_uring_prep_accept(sqe, s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
}

void ctl_server_rearm(struct ctl_server *s)
{
	if (listener_lost(s->listen_fd, &s->accept_op, &s->accept_wait))
		arm_accept(s);
	arm_wait_tick(s); /* nothing if no request waits, or it is armed */
}

/*
 * bind() makes the socket's path with 0777 & ~umask: set the umask so that
 * the path is born with `mode` at most, never wider, not even for the
 * moment before the chmod (which is still needed: a default ACL on the
 * directory takes the umask's place).  fchmod on the socket's fd would not
 * do: on Linux it changes the socket's inode, not the path's.  The umask
 * is the process's; at start-up the loop is the only thread that creates
 * files (the resolver and doorbell threads create none).
 */
static int bind_with_mode(int fd, const struct sockaddr_un *addr, mode_t mode)
{
	mode_t old = umask(0777 & ~mode);
	int rc = bind(fd, (const struct sockaddr *)addr, sizeof(*addr));

	umask(old);
	return rc;
}

int ctl_server_start(struct ctl_server *s, struct loop *l,
		     struct flow_table *flows, struct peer_mgr *peers,
		     const char *path, mode_t mode)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd, rc;

	*s = (struct ctl_server){ .loop = l, .flows = flows, .peers = peers,
				  .listen_fd = -1,
				  .max_clients = CTL_DEFAULT_MAX_CLIENTS,
				  .max_per_uid = CTL_DEFAULT_PER_UID,
				  .socket_path = path,
				  .started_ns = fr_now_ns() };
	if (strlen(path) >= sizeof(addr.sun_path)) {
		log_error("socket path too long: %s", path);
		return -ENAMETOOLONG;
	}
	strcpy(addr.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	unlink(path); /* stale: the caller holds the daemon lock */
	if (bind_with_mode(fd, &addr, mode) || chmod(path, mode) ||
	    listen(fd, 128)) {
		rc = -errno;
		log_error("control socket %s: %s", path, strerror(-rc));
		close(fd);
		return rc;
	}
	s->listen_fd = fd;
	flows->added = flow_added;
	flows->added_arg = s;
	arm_accept(s);
	log_info("control socket %s (mode %04o)", path, (unsigned)mode);
	return 0;
}

void ctl_server_stop(struct ctl_server *s)
{
	s->flows->added = NULL;
	if (s->listen_fd >= 0) {
		shutdown(s->listen_fd, SHUT_RDWR);
		close(s->listen_fd);
		s->listen_fd = -1;
		unlink(s->socket_path);
	}
	for (struct ctl_client *c = s->clients, *n; c; c = n) {
		n = c->next;
		client_gone(c);
	}
}

int ctl_server_busy(const struct ctl_server *s)
{
	return s->clients != NULL || s->accept_op.busy || s->wait_op.busy;
}

void ctl_server_forget_flow(struct ctl_server *s, struct flow *f)
{
	for (struct ctl_client *c = s->clients; c; c = c->next) {
		for (unsigned i = 0; i < c->n_att;) {
			if (c->att[i].flow != f) {
				i++;
				continue;
			}
			/* its doorbell page is counted until the attachment
			 * goes, and this is where it goes (not detach_all) */
			if (c->att[i].bell_page)
				mover_bell_put(s->peers, c->att[i].bell_page);
			c->att[i] = c->att[--c->n_att];
		}
	}
}
