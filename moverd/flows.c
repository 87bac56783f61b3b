/*
 * moverd/flows.c - create, find and destroy flows; attach permissions.
 */
#include "flows.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void flows_init(struct flow_table *t, const struct flow_limits *limits,
		const char *state_dir)
{
	*t = (struct flow_table){ .limits = *limits, .next_id = 1 };
	snprintf(t->state_dir, sizeof(t->state_dir), "%s", state_dir);
}

const char *flows_state_name(enum flow_state s)
{
	static const char *const names[] = { "open", "connecting",
					     "reconnecting", "failed",
					     "closing" };
	return names[s];
}

const char *flows_role_name(enum flow_role r)
{
	static const char *const names[] = { "local", "sender", "receiver" };
	return names[r];
}

void flows_set_state(struct flow *f, enum flow_state s, const char *reason)
{
	if (f->state != s)
		log_info("flow %s: %s%s%s", f->name, flows_state_name(s),
			 reason && *reason ? ": " : "", reason ? reason : "");
	f->state = s;
	snprintf(f->reason, sizeof(f->reason), "%s", reason ? reason : "");
}

/* ---- ring files of flows between hosts ---------------------------------- */

static void flow_file(const struct flow_table *t, const char *name,
		      const char *ext, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s.%s", t->state_dir, name, ext);
}

static void write_list(FILE *f, const char *key, const uint32_t *v, unsigned n)
{
	fprintf(f, "%s=", key);
	for (unsigned i = 0; i < n; i++)
		fprintf(f, "%s%u", i ? "," : "", v[i]);
	fputc('\n', f);
}

/* name.flow: what a restarted moverd needs besides the ring itself. */
static int write_meta(const struct flow_table *t, const struct flow *fl)
{
	char path[400], tmp[420];
	FILE *f;

	flow_file(t, fl->name, "flow", path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "we");
	if (!f)
		return -errno;
	fprintf(f, "role=%s\npeer=%s\nid=%u\nowner_uid=%u\nowner_gid=%u\n",
		flows_role_name(fl->role), fl->peer_addr, fl->id,
		(unsigned)fl->owner_uid, (unsigned)fl->owner_gid);
	write_list(f, "allow_uids", fl->allow_uids, fl->n_allow_uids);
	write_list(f, "allow_gids", fl->allow_gids, fl->n_allow_gids);
	if (fclose(f) || rename(tmp, path))
		return -errno;
	return 0;
}

static unsigned read_list(const char *s, uint32_t *v)
{
	unsigned n = 0;
	char *end;

	while (*s && n < FLOW_ALLOW_MAX) {
		v[n++] = (uint32_t)strtoul(s, &end, 10);
		if (*end != ',')
			break;
		s = end + 1;
	}
	return n;
}

static void apply_meta_line(struct flow *fl, char *line)
{
	char *eq = strchr(line, '=');
	const char *k = line, *v;

	if (!eq)
		return;
	*eq = 0;
	v = eq + 1;
	if (!strcmp(k, "role"))
		fl->role = !strcmp(v, "sender") ? FLOW_SENDER : FLOW_RECEIVER;
	else if (!strcmp(k, "peer"))
		snprintf(fl->peer_addr, sizeof(fl->peer_addr), "%s", v);
	else if (!strcmp(k, "id"))
		fl->id = (uint32_t)strtoul(v, NULL, 10);
	else if (!strcmp(k, "owner_uid"))
		fl->owner_uid = (uid_t)strtoul(v, NULL, 10);
	else if (!strcmp(k, "owner_gid"))
		fl->owner_gid = (gid_t)strtoul(v, NULL, 10);
	else if (!strcmp(k, "allow_uids"))
		fl->n_allow_uids = read_list(v, fl->allow_uids);
	else if (!strcmp(k, "allow_gids"))
		fl->n_allow_gids = read_list(v, fl->allow_gids);
}

static void link_flow(struct flow_table *t, struct flow *f)
{
	f->next = t->head;
	t->head = f;
	t->count++;
	if (f->id >= t->next_id)
		t->next_id = f->id + 1;
}

/* Open the ring file of one flow named in the state directory. */
static struct flow *adopt_one(struct flow_table *t, const char *name)
{
	char path[400], line[512];
	struct flowshm_info in;
	struct flow *fl = calloc(1, sizeof(*fl));
	FILE *f;
	int rc;

	if (!fl)
		return NULL;
	snprintf(fl->name, sizeof(fl->name), "%s", name);
	fl->refs = 1; /* the table's */
	fl->transport = "tcp";
	flow_file(t, name, "flow", path, sizeof(path));
	f = fopen(path, "re");
	if (!f)
		goto fail;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		apply_meta_line(fl, line);
	}
	fclose(f);
	flow_file(t, name, "ring", fl->path, sizeof(fl->path));
	fl->ring_fd = open(fl->path, O_RDWR | O_CLOEXEC);
	if (fl->ring_fd < 0)
		goto fail;
	rc = flowshm_open_fd(fl->ring_fd, FLOWSHM_PRODUCER, NULL, &fl->view);
	if (rc) {
		log_error("flow %s: cannot re-adopt %s: %s", name, fl->path,
			  flowshm_strerror(rc));
		close(fl->ring_fd);
		goto fail;
	}
	flowshm_info(fl->view, &in);
	/* sender: everything before head was acknowledged by the peer */
	fl->sent = fl->acked = fl->remote_head = in.head;
	fl->reported_head = in.head;
	fl->state = fl->role == FLOW_SENDER ? FLOW_CONNECTING : FLOW_RECONNECTING;
	snprintf(fl->reason, sizeof(fl->reason), "re-adopted after a restart");
	log_info("flow %s: re-adopted (%s, head %llu, tail %llu)", name,
		 flows_role_name(fl->role), (unsigned long long)in.head,
		 (unsigned long long)in.tail);
	return fl;
fail:
	log_error("flow %s: cannot re-adopt: %s", name, strerror(errno));
	free(fl);
	return NULL;
}

unsigned flows_adopt(struct flow_table *t)
{
	DIR *d = opendir(t->state_dir);
	struct dirent *e;
	unsigned n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		char name[FLOW_NAME_MAX + 1];
		size_t len = strlen(e->d_name);
		struct flow *fl;

		if (len < 6 || len - 5 > FLOW_NAME_MAX ||
		    strcmp(e->d_name + len - 5, ".flow"))
			continue;
		memcpy(name, e->d_name, len - 5);
		name[len - 5] = 0;
		if (!flows_valid_name(name) || flows_find(t, name))
			continue;
		fl = adopt_one(t, name);
		if (fl) {
			link_flow(t, fl);
			n++;
		}
	}
	closedir(d);
	return n;
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
	f->refs = 1; /* the table's */
	f->role = spec->role;
	f->transport = spec->role == FLOW_LOCAL ? "local" : "tcp";
	f->id = spec->role == FLOW_SENDER ? t->next_id++ : 0;
	snprintf(f->peer_addr, sizeof(f->peer_addr), "%s",
		 spec->peer ? spec->peer : "");
	if (spec->role == FLOW_RECEIVER)
		p.flags |= FLOWSHM_RING_DEPOSIT;
	if (spec->role != FLOW_LOCAL) {
		/* a file, so that a restarted moverd can re-adopt it */
		mkdir(t->state_dir, 0700);
		flow_file(t, spec->name, "ring", f->path, sizeof(f->path));
		unlink(f->path);
	}
	rc = flowshm_ring_create_keyed(&p, f->path[0] ? f->path : NULL,
				       spec->seal_key, spec->start, &f->ring_fd);
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
	f->sent = f->acked = f->remote_head = f->reported_head = spec->start;
	f->state = spec->role == FLOW_SENDER ? FLOW_CONNECTING : FLOW_OPEN;
	if (f->path[0] && (rc = write_meta(t, f))) {
		snprintf(err, errlen, "cannot write the flow's state file in "
			 "%s: %s", t->state_dir, strerror(-rc));
		flowshm_close(f->view);
		close(f->ring_fd);
		unlink(f->path);
		free(f);
		return rc;
	}
	f->next = t->head;
	t->head = f;
	t->count++;
	log_info("flow %s created by uid %u: ring %llu bytes, max record %u",
		 f->name, (unsigned)uid, (unsigned long long)p.ring_size,
		 p.max_record);
	*out = f;
	return 0;
}

void flow_put(struct flow *f)
{
	if (--f->refs)
		return;
	flowshm_close(f->view);
	close(f->ring_fd);
	free(f);
}

void flows_fail(struct flow *f, const char *reason)
{
	if (f->state == FLOW_FAILED)
		return;
	log_warn("flow %s: failed: %s", f->name, reason);
	flows_set_state(f, FLOW_FAILED, reason);
	fr_fail(&f->view->ring); /* its clients get -EPROTO */
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
	f->dead = true;
	flowshm_shutdown(f->view);
	if (f->path[0]) {
		char meta[400];

		unlink(f->path);
		flow_file(t, f->name, "flow", meta, sizeof(meta));
		unlink(meta);
	}
	log_info("flow %s destroyed%s", f->name,
		 f->refs > 1 ? " (its ring is released once the I/O in flight "
			       "on it completes)" : "");
	flow_put(f);
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
