/*
 * moverd/control.h - moverd's end of the control socket: accepts clients,
 * reads length-prefixed protobuf requests through the io_uring loop, runs
 * them against the flow table, writes the responses (with the ring fd as
 * SCM_RIGHTS for an attach), and releases a client's attachments when its
 * connection closes.
 */
#ifndef MOVERD_CONTROL_H
#define MOVERD_CONTROL_H

#include "flows.h"
#include "listener.h"
#include "loop.h"
#include "peer.h"

#include <stdint.h>
#include <sys/types.h>

struct ctl_client;
struct declared;
struct declared_reading;
struct reloader;

struct ctl_stats {
	uint64_t requests;
	uint64_t bad_requests;
	uint64_t clients_total;
	uint64_t clients_refused;  /* closed at accept: over a cap */
};

/*
 * Limits on control connections: max_clients in all, of which the last
 * CTL_ROOT_RESERVE (at most half) are kept for root, so that root's
 * moverctl gets through however many connections other users hold; and
 * max_per_uid for each uid but root.
 */
#define CTL_DEFAULT_MAX_CLIENTS 1024u
#define CTL_DEFAULT_PER_UID     64u
#define CTL_ROOT_RESERVE        16u
/* open files a non-root client must leave free (root's reserve) */
#define CTL_FD_RESERVE          32u

struct ctl_server {
	struct loop *loop;
	struct flow_table *flows;
	struct peer_mgr *peers;
	struct loop_op accept_op;
	int listen_fd;
	struct ctl_client *clients;
	unsigned n_clients;
	unsigned max_clients;
	unsigned max_per_uid;
	struct listener_backoff accept_wait; /* after a failed accept */
	const char *socket_path;
	uint64_t started_ns;
	const struct idle *idle;  /* the duty cycle's, for status (main.c) */
	const char *io_uring;     /* the loop's setup, for status (main.c) */
	struct ctl_stats stats;
	struct declared *declared;  /* the config's flows (declared.h) */
	struct reloader *reloader;  /* moverctl reload runs there (reload.h) */
	/* requests waiting for a flow, a drain (issue 15) or a reload, and the tick
	 * that ends them: armed while n_waiting != 0 */
	unsigned n_waiting;
	struct loop_op wait_op;
	struct __kernel_timespec wait_ts;
	const struct counters *counters; /* the daemon's (status), or NULL */
};

/* reload.h's done: answer the requests a reload run (number run)
 * answers, with what it did (rd). */
void ctl_reload_done(void *arg, uint64_t run,
		     const struct declared_reading *rd);

/* Bind the socket (mode applied before listen) and start accepting. */
int ctl_server_start(struct ctl_server *s, struct loop *l,
		     struct flow_table *flows, struct peer_mgr *peers,
		     const char *path, mode_t mode);

/*
 * Create a flow as a create request does (flows_create; a sender flow is
 * handed to its peer), for the config's declared flows too.  0, or a
 * negative errno with a sentence in err.
 */
int ctl_create_flow(struct ctl_server *s, const struct flow_spec *spec,
		    uid_t uid, gid_t gid, struct flow **out, char *err,
		    size_t cap);

/* Close every client and the listening socket; unlink the socket path. */
void ctl_server_stop(struct ctl_server *s);

/* Ops an arm found no SQE for (loop_sqe NULL): the accept (listening,
 * but neither it nor its back-off in flight), the waits' tick.  Armed
 * again; called on every loop pass. */
void ctl_server_rearm(struct ctl_server *s);

/* True while a client still has an operation in flight. */
int ctl_server_busy(const struct ctl_server *s);

/* Forget every attachment to f (it is being destroyed). */
void ctl_server_forget_flow(struct ctl_server *s, struct flow *f);

#endif
