/*
 * moverd/flows.h - the daemon's flow table.  moverd creates and owns every
 * ring: a flow is a sealed memfd ring plus who owns it, who may attach, and
 * who is attached now.
 */
#ifndef MOVERD_FLOWS_H
#define MOVERD_FLOWS_H

#include "flowshm_internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define FLOW_NAME_MAX  64
#define FLOW_ALLOW_MAX 16

struct flow_spec {
	const char *name;
	uint64_t ring_size;      /* 0 = default */
	uint32_t max_record;     /* 0 = default */
	const uint32_t *allow_uids;
	size_t n_allow_uids;
	const uint32_t *allow_gids;
	size_t n_allow_gids;
};

struct flow {
	char name[FLOW_NAME_MAX + 1];
	int ring_fd;
	flowshm_t *view;         /* moverd's own mapping: positions, shutdown */
	uid_t owner_uid;
	gid_t owner_gid;
	uint32_t allow_uids[FLOW_ALLOW_MAX];
	uint32_t allow_gids[FLOW_ALLOW_MAX];
	unsigned n_allow_uids, n_allow_gids;
	unsigned producers, consumers;
	uint64_t created_unix_ms;
	struct flow *next;
};

struct flow_limits {
	uint64_t default_ring_size;
	uint32_t default_max_record;
	uint64_t max_ring_size;  /* per flow */
	unsigned max_flows;
};

struct flow_table {
	struct flow *head;
	unsigned count;
	struct flow_limits limits;
};

void flows_init(struct flow_table *t, const struct flow_limits *limits);

/* Create a flow owned by uid/gid.  0, or a negative errno with a sentence
 * for the client in err: -EEXIST, -EINVAL, -ENOSPC, -ENOMEM... */
int flows_create(struct flow_table *t, const struct flow_spec *spec,
		 uid_t uid, gid_t gid, struct flow **out, char *err,
		 size_t errlen);

struct flow *flows_find(struct flow_table *t, const char *name);

/* Close the ring for every attached client (they see -EPIPE), drop
 * moverd's mapping and fd, unlink and free the flow. */
void flows_destroy(struct flow_table *t, struct flow *f);
void flows_destroy_all(struct flow_table *t);

/* May this client attach?  Root, the owner, and the allowed ids may. */
bool flows_may_attach(const struct flow *f, uid_t uid, gid_t gid);
/* May this client destroy it?  Root and the owner may. */
bool flows_may_manage(const struct flow *f, uid_t uid);

bool flows_valid_name(const char *name);

#endif
