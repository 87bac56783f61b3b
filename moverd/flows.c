/*
 * moverd/flows.c - create, find and destroy flows; attach permissions.
 */
#include "flows.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void flows_init(struct flow_table *t, const struct flow_limits *limits)
{
	*t = (struct flow_table){ .limits = *limits };
}

bool flows_valid_name(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > FLOW_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

struct flow *flows_find(struct flow_table *t, const char *name)
{
	for (struct flow *f = t->head; f; f = f->next)
		if (strcmp(f->name, name) == 0)
			return f;
	return NULL;
}

static uint64_t unix_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int check_spec(const struct flow_table *t, const struct flow_spec *s,
		      struct flowshm_ring_params *p, char *err, size_t errlen)
{
	*p = (struct flowshm_ring_params){
		.ring_size = s->ring_size ? s->ring_size :
					    t->limits.default_ring_size,
		.max_record = s->max_record ? s->max_record :
					      t->limits.default_max_record,
	};
	if (!flows_valid_name(s->name)) {
		snprintf(err, errlen, "invalid flow name '%.80s': use 1-64 of "
			 "[A-Za-z0-9._-]", s->name);
		return -EINVAL;
	}
	if (p->ring_size > t->limits.max_ring_size) {
		snprintf(err, errlen, "ring size %llu exceeds this daemon's "
			 "limit of %llu bytes", (unsigned long long)p->ring_size,
			 (unsigned long long)t->limits.max_ring_size);
		return -EINVAL;
	}
	if (!s->max_record && p->max_record > p->ring_size / 2)
		p->max_record = (uint32_t)(p->ring_size / 2);
	if (p->ring_size < 4096 || (p->ring_size & (p->ring_size - 1)) ||
	    p->max_record == 0 || p->max_record > p->ring_size / 2) {
		snprintf(err, errlen, "invalid sizes: the ring must be a power "
			 "of two >= 4096 bytes and the maximum record 1 byte to "
			 "half the ring (got ring %llu, max record %u)",
			 (unsigned long long)p->ring_size, p->max_record);
		return -EINVAL;
	}
	if (s->n_allow_uids > FLOW_ALLOW_MAX || s->n_allow_gids > FLOW_ALLOW_MAX) {
		snprintf(err, errlen, "at most %d allowed uids and gids",
			 FLOW_ALLOW_MAX);
		return -EINVAL;
	}
	if (flows_find((struct flow_table *)t, s->name)) {
		snprintf(err, errlen, "flow '%s' already exists", s->name);
		return -EEXIST;
	}
	if (t->count >= t->limits.max_flows) {
		snprintf(err, errlen, "too many flows (limit %u)",
			 t->limits.max_flows);
		return -ENOSPC;
	}
	return 0;
}

int flows_create(struct flow_table *t, const struct flow_spec *spec,
		 uid_t uid, gid_t gid, struct flow **out, char *err,
		 size_t errlen)
{
	struct flowshm_ring_params p;
	struct flow *f;
	int rc = check_spec(t, spec, &p, err, errlen);

	if (rc)
		return rc;
	f = calloc(1, sizeof(*f));
	if (!f) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rc = flowshm_ring_create(&p, NULL, &f->ring_fd);
	if (!rc)
		rc = flowshm_open_fd(f->ring_fd, FLOWSHM_PRODUCER, NULL, &f->view);
	if (rc) {
		snprintf(err, errlen, "cannot create the ring: %s",
			 flowshm_strerror(rc));
		if (f->ring_fd > 0)
			close(f->ring_fd);
		free(f);
		return rc;
	}
	snprintf(f->name, sizeof(f->name), "%s", spec->name);
	f->owner_uid = uid;
	f->owner_gid = gid;
	f->n_allow_uids = (unsigned)spec->n_allow_uids;
	f->n_allow_gids = (unsigned)spec->n_allow_gids;
	for (unsigned i = 0; i < f->n_allow_uids; i++)
		f->allow_uids[i] = spec->allow_uids[i];
	for (unsigned i = 0; i < f->n_allow_gids; i++)
		f->allow_gids[i] = spec->allow_gids[i];
	f->created_unix_ms = unix_ms();
	f->next = t->head;
	t->head = f;
	t->count++;
	log_info("flow %s created by uid %u: ring %llu bytes, max record %u",
		 f->name, (unsigned)uid, (unsigned long long)p.ring_size,
		 p.max_record);
	*out = f;
	return 0;
}

void flows_destroy(struct flow_table *t, struct flow *f)
{
	for (struct flow **pp = &t->head; *pp; pp = &(*pp)->next) {
		if (*pp == f) {
			*pp = f->next;
			t->count--;
			break;
		}
	}
	flowshm_shutdown(f->view);
	flowshm_close(f->view);
	close(f->ring_fd);
	log_info("flow %s destroyed", f->name);
	free(f);
}

void flows_destroy_all(struct flow_table *t)
{
	while (t->head)
		flows_destroy(t, t->head);
}

bool flows_may_manage(const struct flow *f, uid_t uid)
{
	return uid == 0 || uid == f->owner_uid;
}

bool flows_may_attach(const struct flow *f, uid_t uid, gid_t gid)
{
	if (flows_may_manage(f, uid))
		return true;
	for (unsigned i = 0; i < f->n_allow_uids; i++)
		if (f->allow_uids[i] == uid)
			return true;
	for (unsigned i = 0; i < f->n_allow_gids; i++)
		if (f->allow_gids[i] == gid)
			return true;
	return false;
}
