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
#include "loop.h"
#include "peer.h"

#include <stdint.h>
#include <sys/types.h>

struct ctl_client;

struct ctl_stats {
	uint64_t requests;
	uint64_t bad_requests;
	uint64_t clients_total;
};

struct ctl_server {
	struct loop *loop;
	struct flow_table *flows;
	struct peer_mgr *peers;
	struct loop_op accept_op;
	int listen_fd;
	struct ctl_client *clients;
	unsigned n_clients;
	unsigned max_clients;
	const char *socket_path;
	uint64_t started_ns;
	struct ctl_stats stats;
};

/* Bind the socket (mode applied before listen) and start accepting. */
int ctl_server_start(struct ctl_server *s, struct loop *l,
		     struct flow_table *flows, struct peer_mgr *peers,
		     const char *path, mode_t mode);

/* Close every client and the listening socket; unlink the socket path. */
void ctl_server_stop(struct ctl_server *s);

/* True while a client still has an operation in flight. */
int ctl_server_busy(const struct ctl_server *s);

/* Forget every attachment to f (it is being destroyed). */
void ctl_server_forget_flow(struct ctl_server *s, struct flow *f);

#endif
