/*
 * moverd/declared.c - flows declared in the config file: the flow lines
 * read, compared with what was applied before, and applied through the
 * same create path as `moverctl flow create` (ctl_create_flow) and the
 * single destroy path (peer_destroy_flow).  See declared.h.
 */
#include "declared.h"
#include "control.h"
#include "log.h"
#include "peer.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading ------------------------------------------------------------ */

static bool has_more(const struct declared_flow *df, const char *addr)
{
	for (unsigned i = 0; i < df->n_more; i++)
		if (!strcmp(df->more[i], addr))
			return true;
	return false;
}

/* A name looked up once per read of the file (parse_id). */
struct id_memo {
	char name[64];
	bool group;
	int rc;
	uint32_t id;
};

#define ID_MEMO_MAX 64

struct parse {
	const char *path;
	int line;
	char *err;
	size_t cap;
	struct id_memo memo[ID_MEMO_MAX];
	unsigned n_memo;
};

static int fail(struct parse *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int fail(struct parse *p, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(p->err, p->cap, "%s:%d: ", p->path, p->line);

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < p->cap)
		vsnprintf(p->err + n, p->cap - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

/* "4096", "64K", "16M", "1G": the sizes moverctl takes. */
int declared_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	/* strtoull takes "-1" as 2^64 - 1: digits only */
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	default: break;
	}
	if (errno || *end || v > (UINT64_MAX >> shift)) /* no wrap past 2^64 */
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

/* A flow parameter's size: declared_parse_size, and not 0. */
static int parse_size(const char *s, uint64_t *out)
{
	return declared_parse_size(s, out) || !*out ? -1 : 0;
}

/*
 * A user or group: a number, or a name looked up in the passwd / group
 * database.  At start and at a reload, on moverd's loop: a slow name
 * service holds the loop as long, once per name and read of the file
 * (lookup_id: 4096 flows allowed to one user make one lookup, not 4096).
 */
static int parse_id(const char *s, bool group, uint32_t *out)
{
	struct passwd *pw;
	struct group *g;
	unsigned long v;
	char *end;

	if (*s >= '0' && *s <= '9') {
		errno = 0;
		v = strtoul(s, &end, 10);
		*out = (uint32_t)v;
		return *end || errno || v >= UINT32_MAX ? -1 : 0;
	}
	if (group) {
		g = getgrnam(s);
		*out = g ? (uint32_t)g->gr_gid : 0;
		return g ? 0 : -1;
	}
	pw = getpwnam(s);
	*out = pw ? (uint32_t)pw->pw_uid : 0;
	return pw ? 0 : -1;
}

/* parse_id, a name answered from this read's memo if it was asked. */
static int lookup_id(struct parse *p, const char *s, bool group,
		     uint32_t *out)
{
	struct id_memo *m;

	for (unsigned i = 0; i < p->n_memo; i++) {
		m = &p->memo[i];
		if (m->group == group && !strcmp(m->name, s)) {
			*out = m->id;
			return m->rc;
		}
	}
	if (p->n_memo == ID_MEMO_MAX || strlen(s) >= sizeof(m->name))
		return parse_id(s, group, out);
	m = &p->memo[p->n_memo++];
	snprintf(m->name, sizeof(m->name), "%s", s);
	m->group = group;
	m->rc = parse_id(s, group, &m->id);
	*out = m->id;
	return m->rc;
}

static int parse_ids(struct parse *p, const char *key, char *val, bool group,
		     uint32_t *ids, unsigned *n)
{
	char *save = NULL;

	for (char *t = strtok_r(val, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*n >= FLOW_ALLOW_MAX)
			return fail(p, "%s: at most %d ids", key, FLOW_ALLOW_MAX);
		if (lookup_id(p, t, group, &ids[*n]))
			return fail(p, "%s '%s': no such %s", key, t,
				    group ? "group" : "user");
		(*n)++;
	}
	return 0;
}

/* peer=HOST:PORT: the first, or one more (fan-out), each once. */
static int parse_peer(struct parse *p, struct declared_flow *df,
		      const char *val)
{
	if (!strchr(val, ':') || strlen(val) >= sizeof(df->peer))
		return fail(p, "flow %s: peer '%s': use HOST:PORT", df->name,
			    val);
	if (!strcmp(df->peer, val) || has_more(df, val))
		return fail(p, "flow %s: peer %s given twice", df->name, val);
	if (!df->peer[0]) {
		strcpy(df->peer, val);
		return 0;
	}
	if (df->n_more >= FANOUT_MAX_PEERS - 1)
		return fail(p, "flow %s: at most %u peer hosts per flow",
			    df->name, FANOUT_MAX_PEERS);
	strcpy(df->more[df->n_more++], val);
	return 0;
}

/* from=NET[,NET...]: the hosts that may send a receiving end, once. */
static int parse_from(struct parse *p, struct declared_flow *df,
		      const char *val)
{
	char why[160];

	if (df->n_from)
		return fail(p, "flow %s: from= given twice (one list: "
			    "from=NET,NET...)", df->name);
	if (strlen(val) >= sizeof(df->from_text))
		return fail(p, "flow %s: from= is too long", df->name);
	if (peer_nets_parse(val, "from", df->from, DECLARED_FROM_MAX,
			    &df->n_from, why, sizeof(why)))
		return fail(p, "flow %s: %s", df->name, why);
	strcpy(df->from_text, val);
	return 0;
}

static int parse_param(struct parse *p, struct declared_flow *df, char *tok)
{
	char *val = strchr(tok, '=');
	uint64_t v;

	if (!val || !val[1])
		return fail(p, "flow %s: '%s' is not KEY=VALUE", df->name, tok);
	*val++ = 0;
	if (!strcmp(tok, "ring-size")) {
		if (parse_size(val, &v) || v < 4096 || (v & (v - 1)))
			return fail(p, "flow %s: ring-size '%s': use a power of "
				    "two of at least 4096 bytes (K, M, G)",
				    df->name, val);
		df->ring_size = v;
	} else if (!strcmp(tok, "max-record")) {
		if (parse_size(val, &v) || v > UINT32_MAX)
			return fail(p, "flow %s: max-record '%s': use a size "
				    "(K, M, G)", df->name, val);
		df->max_record = (uint32_t)v;
	} else if (!strcmp(tok, "peer")) {
		return parse_peer(p, df, val);
	} else if (!strcmp(tok, "max-lag")) {
		if (parse_size(val, &v))
			return fail(p, "flow %s: max-lag '%s': use a size (K, M, "
				    "G)", df->name, val);
		df->max_lag = v;
	} else if (!strcmp(tok, "allow-uid")) {
		return parse_ids(p, tok, val, false, df->ids.uids,
				 &df->ids.n_uids);
	} else if (!strcmp(tok, "allow-gid")) {
		return parse_ids(p, tok, val, true, df->ids.gids,
				 &df->ids.n_gids);
	} else if (!strcmp(tok, "from")) {
		return parse_from(p, df, val);
	} else {
		return fail(p, "flow %s: unknown parameter '%s' (use ring-size, "
			    "max-record, peer, max-lag, allow-uid, allow-gid, "
			    "from)", df->name, tok);
	}
	return 0;
}

static const struct declared_flow *find(const struct declared_set *s,
					const char *name)
{
	unsigned lo = 0, hi = s->n;

	if (!s->by_name) { /* the index could not be made */
		for (unsigned i = 0; i < s->n; i++)
			if (!strcmp(s->v[i].name, name))
				return &s->v[i];
		return NULL;
	}
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		const struct declared_flow *df = &s->v[s->by_name[mid]];
		int c = strcmp(df->name, name);

		if (!c)
			return df;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Names, then the order in the file (a name declared twice). */
static int by_name(const void *a, const void *b, void *v)
{
	const struct declared_flow *df = v;
	unsigned i = *(const unsigned *)a, j = *(const unsigned *)b;
	int c = strcmp(df[i].name, df[j].name);

	return c ? c : (i > j) - (i < j);
}

/* (Re)make s's index by name (a set of DECLARED_MAX flows was looked up
 * by a walk per flow, in each reload and `flow list`: O(n^2)).  Without
 * memory, find walks v. */
static void index_set(struct declared_set *s)
{
	free(s->by_name);
	s->by_name = s->n ? malloc(s->n * sizeof(*s->by_name)) : NULL;
	if (!s->by_name)
		return;
	for (unsigned i = 0; i < s->n; i++)
		s->by_name[i] = i;
	qsort_r(s->by_name, s->n, sizeof(*s->by_name), by_name, s->v);
}

/* A name declared twice in the set just read (indexed): the first such
 * line of the file, as a reader going down it would find. */
static int check_twice(struct parse *p, const struct declared_set *s)
{
	const struct declared_flow *first = NULL, *again = NULL;

	for (unsigned i = 1; s->by_name && i < s->n; i++) {
		const struct declared_flow *a = &s->v[s->by_name[i - 1]];
		const struct declared_flow *b = &s->v[s->by_name[i]];

		if (!strcmp(a->name, b->name) &&
		    (!again || b->line < again->line)) {
			first = a; /* equal names are in file order */
			again = b;
		}
	}
	if (!again)
		return 0;
	p->line = again->line;
	return fail(p, "flow %s is declared twice (first on line %d)",
		    again->name, first->line);
}

static int add(struct parse *p, struct declared_set *s,
	       const struct declared_flow *df)
{
	struct declared_flow *v;

	if (s->n >= DECLARED_MAX)
		return fail(p, "more than %d flows declared", DECLARED_MAX);
	v = realloc(s->v, (s->n + 1) * sizeof(*v));
	if (!v)
		return fail(p, "out of memory");
	s->v = v;
	s->v[s->n++] = *df;
	return 0;
}

/* "flow = NAME KEY=VALUE..." (or "flow NAME ...", "flow=NAME ..."). */
static int parse_flow(struct parse *p, char *rest, const char *listen,
		      struct declared_set *s)
{
	struct declared_flow df = { .line = p->line };
	char *save = NULL, *name = strtok_r(rest, " \t=", &save);

	if (!name)
		return fail(p, "flow: missing NAME (flow = NAME [ring-size=N] "
			    "[max-record=N] [peer=HOST:PORT]... [max-lag=N] "
			    "[allow-uid=ID,...] [allow-gid=ID,...] "
			    "[from=NET,...])");
	if (!flows_valid_name(name))
		return fail(p, "invalid flow name '%.80s': use 1-64 of "
			    "[A-Za-z0-9._-]", name);
	strcpy(df.name, name);
	for (char *t = strtok_r(NULL, " \t", &save); t;
	     t = strtok_r(NULL, " \t", &save))
		if (parse_param(p, &df, t))
			return -1;
	if (df.ring_size && df.max_record > df.ring_size / 2)
		return fail(p, "flow %s: max-record %u is more than half the "
			    "ring (%llu)", df.name, df.max_record,
			    (unsigned long long)df.ring_size);
	df.receiver = listen[0] && df.peer[0] && !strcmp(df.peer, listen);
	return add(p, s, &df);
}

/* The first word of a config line, "flow" (or "flow=..."): ours. */
static char *flow_line(char *line)
{
	line += strspn(line, " \t");
	if (strncmp(line, "flow", 4) ||
	    (line[4] != ' ' && line[4] != '\t' && line[4] != '='))
		return NULL;
	return line + 4;
}

/* The config says what moverd, often root, creates and whom it grants:
 * only root and moverd's user may write it (as the key file, auth.c). */
static int check_file(FILE *f, const char *path, char *err, size_t cap)
{
	struct stat st;

	if (fstat(fileno(f), &st)) {
		snprintf(err, cap, "config %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, cap, "config %s is not a regular file", path);
		return -1;
	}
	if ((st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & 022)) {
		snprintf(err, cap, "config %s (uid %u, mode %04o) may be "
			 "written by others than root and moverd's user (uid "
			 "%u): chown it to one of them and chmod go-w it",
			 path, (unsigned)st.st_uid,
			 (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
		return -1;
	}
	return 0;
}

int declared_read(const char *path, const char *listen,
		  struct declared_set *out, char *err, size_t cap)
{
	struct parse p = { .path = path, .err = err, .cap = cap };
	char line[1024];
	FILE *f = fopen(path, "re");
	int rc = 0;

	*out = (struct declared_set){ 0 };
	if (!f) {
		snprintf(err, cap, "config %s: %s", path, strerror(errno));
		return -1;
	}
	if (check_file(f, path, err, cap)) {
		fclose(f);
		return -1;
	}
	while (!rc && fgets(line, sizeof(line), f)) {
		char *rest;

		p.line++;
		if (!strchr(line, '\n') && !feof(f)) {
			rc = fail(&p, "line longer than %zu bytes",
				  sizeof(line) - 2);
			break;
		}
		line[strcspn(line, "#\n")] = 0;
		rest = flow_line(line);
		if (rest)
			rc = parse_flow(&p, rest, listen, out);
	}
	fclose(f);
	if (!rc) {
		index_set(out);
		rc = check_twice(&p, out);
	}
	if (rc)
		declared_set_free(out);
	return rc;
}

void declared_set_free(struct declared_set *s)
{
	free(s->v);
	free(s->by_name);
	*s = (struct declared_set){ 0 };
}

/* ---- comparing ------------------------------------------------------------ */

static bool has_id(const uint32_t *ids, unsigned n, uint32_t id)
{
	for (unsigned i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/* Keep in ids (n) those the flow's list (have, n_have) holds; how many. */
static unsigned kept_ids(const uint32_t *have, unsigned n_have, uint32_t *ids,
			 unsigned n)
{
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++)
		if (has_id(have, n_have, ids[i]))
			ids[k++] = ids[i];
	return k;
}

static bool same_ids(const uint32_t *a, unsigned na, const uint32_t *b,
		     unsigned nb)
{
	for (unsigned i = 0; i < na; i++)
		if (!has_id(b, nb, a[i]))
			return false;
	for (unsigned i = 0; i < nb; i++)
		if (!has_id(a, na, b[i]))
			return false;
	return true;
}

/* The same uids and the same gids, in any order. */
static bool same_flow_ids(const struct flow_ids *a, const struct flow_ids *b)
{
	return same_ids(a->uids, a->n_uids, b->uids, b->n_uids) &&
	       same_ids(a->gids, a->n_gids, b->gids, b->n_gids);
}

static bool same_more(const struct declared_flow *a,
		      const struct declared_flow *b)
{
	if (a->n_more != b->n_more)
		return false;
	for (unsigned i = 0; i < a->n_more; i++)
		if (!has_more(b, a->more[i]))
			return false;
	return true;
}

/* The same from= (as written: a reordered list counts as a change,
 * which only re-says what is granted). */
static bool same_from(const struct declared_flow *a,
		      const struct declared_flow *b)
{
	return !strcmp(a->from_text, b->from_text);
}

/* All but from=, which only the open of a receiving end reads. */
static bool same_flow_part(const struct declared_flow *a,
			   const struct declared_flow *b)
{
	return a->ring_size == b->ring_size && a->max_record == b->max_record &&
	       !strcmp(a->peer, b->peer) && a->receiver == b->receiver &&
	       same_more(a, b) && a->max_lag == b->max_lag &&
	       same_flow_ids(&a->ids, &b->ids);
}

/* from= means something only on a receiving end: elsewhere a change of it
 * changes nothing (no sending flow is made again for it). */
static bool same_decl(const struct declared_flow *a,
		      const struct declared_flow *b)
{
	return same_flow_part(a, b) && (!a->receiver || same_from(a, b));
}

static void ids_text(char *buf, size_t cap, const uint32_t *ids, size_t n)
{
	size_t len = 0;

	buf[0] = 0;
	if (!n)
		snprintf(buf, cap, "none");
	for (size_t i = 0; i < n && len < cap; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%u",
					i ? "," : "", ids[i]);
}

/* f's peer hosts after the first, as a set: those of s? */
static bool same_peers(const struct flow *f, const struct flow_spec *s)
{
	size_t n = 0;

	for (const struct flow *p = f->fanout; p; p = p->fanout_next, n++) {
		size_t i = 0;

		while (i < s->n_more_peers && strcmp(s->more_peers[i],
						     p->peer_addr))
			i++;
		if (i == s->n_more_peers)
			return false;
	}
	return n == s->n_more_peers;
}

static void peers_text(char *buf, size_t cap, const struct flow *f,
		       const struct flow_spec *s)
{
	size_t len = 0;

	buf[0] = 0;
	if (f) {
		for (const struct flow *p = f->fanout; p && len < cap;
		     p = p->fanout_next)
			len += (size_t)snprintf(buf + len, cap - len, "%s%s",
						len ? "," : "", p->peer_addr);
	} else {
		for (size_t i = 0; i < s->n_more_peers && len < cap; i++)
			len += (size_t)snprintf(buf + len, cap - len, "%s%s",
						len ? "," : "",
						s->more_peers[i]);
	}
	if (!buf[0])
		snprintf(buf, cap, "none");
}

static uint64_t max_lag_of(const struct flow *f)
{
	return f->view ? f->max_lag : 0;
}

const char *declared_differs(const struct flow_table *t, const struct flow *f,
			     const struct flow_spec *s, char *why, size_t cap)
{
	struct flowshm_info in = { .ring_size = f->ring_bytes };
	uint64_t ring = s->ring_size ? s->ring_size : t->limits.default_ring_size;
	uint32_t max = s->max_record ? s->max_record :
				       t->limits.default_max_record;
	const char *peer = s->peer ? s->peer : "";
	char a[200], b[200];

	if (!s->max_record && max > ring / 2)
		max = (uint32_t)(ring / 2); /* as flows_create defaults it */
	if (f->view)
		flowshm_info(f->view, &in);
	if (f->role == FLOW_RECEIVER)
		snprintf(why, cap, "role (it is a flow from peer %s, not one "
			 "created on this host)", f->origin);
	else if (in.ring_size != ring)
		snprintf(why, cap, "ring-size (the flow has %llu, asked %llu)",
			 (unsigned long long)in.ring_size,
			 (unsigned long long)ring);
	else if (in.max_record != max)
		snprintf(why, cap, "max-record (the flow has %u, asked %u)",
			 in.max_record, max);
	else if (strcmp(f->peer_addr, peer))
		snprintf(why, cap, "peer (the flow has '%s', asked '%s')",
			 f->peer_addr, peer);
	else if (!same_peers(f, s)) {
		peers_text(a, sizeof(a), f, NULL);
		peers_text(b, sizeof(b), NULL, s);
		snprintf(why, cap, "set of peers after the first (the flow "
			 "has %s, asked %s)", a, b);
	} else if (max_lag_of(f) != s->max_lag)
		snprintf(why, cap, "max-lag (the flow has %llu, asked %llu)",
			 (unsigned long long)max_lag_of(f),
			 (unsigned long long)s->max_lag);
	else if (!same_ids(f->allowed.uids, f->allowed.n_uids, s->allow_uids,
			   (unsigned)s->n_allow_uids)) {
		ids_text(a, sizeof(a), f->allowed.uids, f->allowed.n_uids);
		ids_text(b, sizeof(b), s->allow_uids, s->n_allow_uids);
		snprintf(why, cap, "allow-uid (the flow has %s, asked %s)", a, b);
	} else if (!same_ids(f->allowed.gids, f->allowed.n_gids, s->allow_gids,
			     (unsigned)s->n_allow_gids)) {
		ids_text(a, sizeof(a), f->allowed.gids, f->allowed.n_gids);
		ids_text(b, sizeof(b), s->allow_gids, s->n_allow_gids);
		snprintf(why, cap, "allow-gid (the flow has %s, asked %s)", a, b);
	} else {
		return NULL;
	}
	return why;
}

/* ---- applying ------------------------------------------------------------- */

static void say(struct declared_report *r, enum log_level lvl,
		const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One line of the report, logged too. */
static void say(struct declared_report *r, enum log_level lvl,
		const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (lvl == LOG_LVL_WARN)
		log_warn("config: %s", line);
	else
		log_info("config: %s", line);
	if (!r->text || r->len >= r->cap)
		return;
	n = snprintf(r->text + r->len, r->cap - r->len, "%s\n", line);
	if (n > 0)
		r->len += (size_t)n < r->cap - r->len ? (size_t)n :
							r->cap - r->len - 1;
}

void declared_note(struct declared_report *r, const char *fmt, ...)
{
	char line[1100];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	say(r, LOG_LVL_INFO, "%s", line);
}

/* more: room for df's peers after the first, which the spec points at */
static struct flow_spec spec_of(const struct declared_flow *df,
				const char *more[FANOUT_MAX_PEERS])
{
	for (unsigned i = 0; i < df->n_more; i++)
		more[i] = df->more[i];
	return (struct flow_spec){
		.name = df->name,
		.role = df->peer[0] ? FLOW_SENDER : FLOW_LOCAL,
		.peer = df->peer[0] ? df->peer : NULL,
		.ring_size = df->ring_size,
		.max_record = df->max_record,
		.max_lag = df->max_lag,
		.more_peers = more, .n_more_peers = df->n_more,
		.allow_uids = df->ids.uids, .n_allow_uids = df->ids.n_uids,
		.allow_gids = df->ids.gids, .n_allow_gids = df->ids.n_gids,
		.unmetered = true, /* the operator's: no ring rate */
	};
}

/* what: the report's word on success, failed: on failure. */
static bool create(struct declared *d, const struct declared_flow *df,
		   struct declared_report *r, const char *what,
		   const char *failed)
{
	const char *more[FANOUT_MAX_PEERS];
	struct flow_spec spec = spec_of(df, more);
	struct flow *f = NULL;
	char err[256];
	int rc = ctl_create_flow(d->ctl, &spec, d->uid, d->gid, &f, err,
				 sizeof(err));

	/* the other peer hosts: all or nothing, as `flow create` */
	for (unsigned i = 0; !rc && i < df->n_more; i++) {
		rc = fanout_add(d->peers, f, df->more[i], i + 1 == df->n_more,
				err, sizeof(err));
		if (rc)
			peer_destroy_flow(d->peers, f, NULL);
	}

	if (rc) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): %s: %s", df->name,
		    df->line, failed, err);
		return false;
	}
	say(r, LOG_LVL_INFO, "flow %s (line %d): %s", df->name, df->line, what);
	return true;
}

/* The ids of old (n_old) that new (n_new) does not name, into out. */
static unsigned dropped_ids(const uint32_t *old, unsigned n_old,
			    const uint32_t *new, unsigned n_new, uint32_t *out)
{
	unsigned n = 0;

	for (unsigned i = 0; i < n_old; i++)
		if (!has_id(new, n_new, old[i]))
			out[n++] = old[i];
	return n;
}

/* The uids and gids of old that new does not name. */
static struct flow_ids dropped(const struct flow_ids *old,
			       const struct flow_ids *new)
{
	struct flow_ids off = { 0 };

	off.n_uids = dropped_ids(old->uids, old->n_uids, new->uids,
				 new->n_uids, off.uids);
	off.n_gids = dropped_ids(old->gids, old->n_gids, new->gids,
				 new->n_gids, off.gids);
	return off;
}

static bool any_ids(const struct flow_ids *ids)
{
	return ids->n_uids || ids->n_gids;
}

/* flows_allow with ids (remove: disallow them). */
static int allow_ids(struct declared *d, struct flow *f,
		     const struct flow_ids *ids, bool remove, char *err,
		     size_t cap)
{
	return flows_allow(d->flows, f, ids->uids, ids->n_uids, ids->gids,
			   ids->n_gids, remove, err, cap);
}

/* Were df's ids the last declared ids granted on f (its state file says,
 * across restarts)? */
static bool granted_already(const struct flow *f,
			    const struct declared_flow *df)
{
	return f->decl_known && same_flow_ids(&f->declared, &df->ids);
}

/* df's ids are granted on f now: kept in its state file. */
static void record_granted(struct flow *f, const struct declared_flow *df)
{
	if (granted_already(f, df))
		return;
	f->declared = df->ids;
	f->decl_known = true;
	flows_save_owed(f, "its declared ids");
}

/* Give a receiving end's ids to its flow, if it has come and lacks one. */
static void grant(struct declared *d, const struct declared_flow *df,
		  struct flow *f, struct declared_report *r)
{
	char err[200];
	bool all = true;

	const struct flow_ids *want = &df->ids, *has = &f->allowed;

	for (unsigned i = 0; i < want->n_uids; i++)
		all &= has_id(has->uids, has->n_uids, want->uids[i]);
	for (unsigned i = 0; i < want->n_gids; i++)
		all &= has_id(has->gids, has->n_gids, want->gids[i]);
	if (!all && allow_ids(d, f, want, false, err, sizeof(err))) {
		if (r)
			r->refused++;
		log_warn("config: flow %s (line %d): cannot grant its declared "
			 "ids: %s", df->name, df->line, err);
		return;
	}
	record_granted(f, df);
	if (!all)
		log_info("config: flow %s: declared ids granted on the flow "
			 "from peer %s", f->name, f->origin);
}

/*
 * The declared ids of f go from o's (NULL: none) to n's: those o named and
 * n does not are taken off, n's are added; ids granted with `moverctl flow
 * allow` stay.  All or nothing: a refused addition puts back what was
 * taken off.  0, or -1 with why in err.
 */
static int swap_ids(struct declared *d, const struct declared_flow *o,
		    const struct declared_flow *n, struct flow *f, char *err,
		    size_t cap)
{
	struct flow_ids off = { 0 };
	char ignored[200];

	if (o)
		off = dropped(&o->ids, &n->ids);
	/* only the ids the flow has go, so that putting them back cannot
	 * give it one moverctl took away */
	off.n_uids = kept_ids(f->allowed.uids, f->allowed.n_uids, off.uids,
			      off.n_uids);
	off.n_gids = kept_ids(f->allowed.gids, f->allowed.n_gids, off.gids,
			      off.n_gids);
	if (any_ids(&off) && allow_ids(d, f, &off, true, err, cap))
		return -1;
	if (!any_ids(&n->ids) || !allow_ids(d, f, &n->ids, false, err, cap))
		return 0;
	if (any_ids(&off) &&
	    allow_ids(d, f, &off, false, ignored, sizeof(ignored)))
		log_warn("config: flow %s: cannot put back the ids taken off: "
			 "%s", f->name, ignored);
	return -1;
}

/* A receiving end whose declaration is new or changed, on its flow f (o:
 * the declaration before, if any): its ids as swap_ids, said. */
static void regrant_receiver(struct declared *d,
			     const struct declared_flow *o,
			     const struct declared_flow *n, struct flow *f,
			     struct declared_report *r)
{
	struct flow_ids off = { 0 }; /* taken off */
	char err[200], a[200], b[200];

	if (o && !o->receiver)
		o = NULL; /* its ids were another flow's */
	if (swap_ids(d, o, n, f, err, sizeof(err))) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): cannot change the "
		    "allowed ids of the flow from peer %s: %s", n->name,
		    n->line, f->origin, err);
		return;
	}
	record_granted(f, n);
	if (o)
		off = dropped(&o->ids, &n->ids);
	ids_text(a, sizeof(a), off.uids, off.n_uids);
	ids_text(b, sizeof(b), off.gids, off.n_gids);
	say(r, LOG_LVL_INFO, "flow %s (line %d): declared ids granted on the "
	    "flow from peer %s (taken off: uids %s, gids %s)", n->name,
	    n->line, f->origin, a, b);
}

/* A receiving end's from= new or changed (o: the declaration before, if
 * any), on its flow f: say whether the sender it is bound to may still
 * open it. */
static void refrom_receiver(const struct declared_flow *o,
			    const struct declared_flow *n,
			    const struct flow *f, struct declared_report *r)
{
	if (!n->n_from) {
		if (o && o->n_from)
			say(r, LOG_LVL_INFO, "flow %s (line %d): from= taken "
			    "out: it stays bound to its sender (%s), from any "
			    "address", n->name, n->line, f->origin);
		return;
	}
	if (!f->origin_host[0] ||
	    peer_nets_match_host(n->from, n->n_from, f->origin_host)) {
		say(r, LOG_LVL_INFO, "flow %s (line %d): sent from %s only; "
		    "its sender%s%s is named", n->name, n->line, n->from_text,
		    f->origin_host[0] ? " at " : "", f->origin_host);
		return;
	}
	say(r, LOG_LVL_WARN, "flow %s (line %d): its sender is at %s, which "
	    "from=%s does not name: its next open from there is refused "
	    "(`moverctl flow destroy %s` ends it now)", n->name, n->line,
	    f->origin_host, n->from_text, n->name);
}

static bool apply_receiver(struct declared *d, const struct declared_flow *o,
			   const struct declared_flow *n,
			   struct declared_report *r)
{
	struct flow *f = flows_find(d->flows, n->name);

	if (f && f->role != FLOW_RECEIVER) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): declared as received "
		    "from a peer (peer= is this moverd's --listen), but a %s "
		    "flow of that name exists here", n->name, n->line,
		    flows_role_name(f->role));
		return false;
	}
	if (o && same_decl(o, n))
		r->unchanged++;
	else
		o ? r->changed++ : r->added++;
	/* an unchanged declaration leaves the flow as moverctl made it
	 * (`flow disallow` included); at a start nothing is applied yet,
	 * and the flow's state file says what was (granted_already) */
	if (f && !o && granted_already(f, n))
		;
	else if (f && (!o || !same_flow_part(o, n)))
		regrant_receiver(d, o, n, f, r);
	else if (!f && (!o || !same_decl(o, n)))
		say(r, LOG_LVL_INFO, "flow %s (line %d): received from a peer; "
		    "its ids are granted when the sender opens it", n->name,
		    n->line);
	if (f && (!o || !same_from(o, n)))
		refrom_receiver(o, n, f, r);
	return true;
}

/* In s, the allowed ids the flow has now (for "does more than they
 * differ?"). */
static void spec_flow_ids(struct flow_spec *s, const struct flow *f)
{
	s->allow_uids = f->allowed.uids;
	s->n_allow_uids = f->allowed.n_uids;
	s->allow_gids = f->allowed.gids;
	s->n_allow_gids = f->allowed.n_gids;
}

/* In s, the peer hosts after the first that the flow has now (in more). */
static void spec_flow_peers(struct flow_spec *s, const struct flow *f,
			    const char *more[FANOUT_MAX_PEERS])
{
	s->n_more_peers = 0;
	for (const struct flow *x = f->fanout; x; x = x->fanout_next)
		more[s->n_more_peers++] = x->peer_addr;
	s->more_peers = more;
}

/*
 * Only the allowed ids of o's flow changed (n: the new declaration): they
 * change in place, in use or not: the ids o named and n does not are
 * taken off, n's are added; ids granted with `moverctl flow allow` stay.
 * 1 if done (now has n's ids), 0 if more than the ids differ, -1 if the
 * change failed (refused; none changed).
 */
static int regrant(struct declared *d, const struct declared_flow *o,
		   const struct declared_flow *n, struct flow *f,
		   struct declared_flow *now, struct declared_report *r)
{
	const char *more[FANOUT_MAX_PEERS];
	struct flow_spec same = spec_of(n, more);
	char why[256], err[200];

	spec_flow_ids(&same, f);
	if (declared_differs(d->flows, f, &same, why, sizeof(why)))
		return 0;
	if (swap_ids(d, o, n, f, err, sizeof(err))) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): cannot change its "
		    "allowed ids: %s", n->name, n->line, err);
		return -1;
	}
	now->ids = n->ids; /* what is in force, for the next reload */
	r->changed++;
	say(r, LOG_LVL_INFO, "flow %s (line %d): allowed ids changed in place",
	    n->name, n->line);
	return 1;
}

/* Peer host addr off f; now follows (gone already counts as done). */
static int peer_off(struct declared *d, struct flow *f, const char *addr,
		    struct declared_flow *now, char *err, size_t cap)
{
	int rc = fanout_remove(d->peers, f, addr, err, cap);
	unsigned k = 0;

	if (rc && rc != -ENOENT)
		return rc;
	for (unsigned i = 0; i < now->n_more; i++)
		if (strcmp(now->more[i], addr))
			memmove(now->more[k++], now->more[i],
				sizeof(now->more[i]));
	now->n_more = k;
	return 0;
}

/* Peer host addr on f; now follows (there already counts as done). */
static int peer_on(struct declared *d, struct flow *f, const char *addr,
		   struct declared_flow *now, char *err, size_t cap)
{
	int rc = fanout_add(d->peers, f, addr, true, err, cap);

	if (rc && rc != -EEXIST)
		return rc;
	if (!has_more(now, addr) && now->n_more < FANOUT_MAX_PEERS - 1)
		snprintf(now->more[now->n_more++], sizeof(now->more[0]), "%s",
			 addr);
	return 0;
}

/*
 * Only the peers after the first of o's flow changed (and maybe its
 * allowed ids, which regrant does next): the peers n drops are removed,
 * those it adds are added, as `flow peer remove` / `add`; the flow, its
 * first peer and its other subscribers go on.  1 if done (and nothing but
 * the ids may still differ: regrant's work), 0 if more differs, -1 if a
 * change failed (refused; what was done stays, in now, and says so).
 */
static int repeer(struct declared *d, const struct declared_flow *o,
		  const struct declared_flow *n, struct flow *f,
		  struct declared_flow *now, struct declared_report *r)
{
	const char *more[FANOUT_MAX_PEERS];
	struct flow_spec spec;
	char why[256], err[256];
	int rc = 0;

	if (same_more(o, n) || f->role != FLOW_SENDER)
		return 0;
	/* everything but the other peers and the ids (regrant's) as the
	 * flow has them now: ids granted by hand are no reason to re-create */
	spec = spec_of(n, more);
	spec_flow_peers(&spec, f, more);
	spec_flow_ids(&spec, f);
	if (declared_differs(d->flows, f, &spec, why, sizeof(why)))
		return 0;
	for (unsigned i = 0; !rc && i < o->n_more; i++)
		if (!has_more(n, o->more[i]))
			rc = peer_off(d, f, o->more[i], now, err, sizeof(err));
	for (unsigned i = 0; !rc && i < n->n_more; i++)
		if (!has_more(o, n->more[i]))
			rc = peer_on(d, f, n->more[i], now, err, sizeof(err));
	if (rc) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): cannot change its peer "
		    "hosts: %s (the changes before this one are in force)",
		    n->name, n->line, err);
		return -1;
	}
	if (same_flow_ids(&o->ids, &n->ids))
		r->changed++;
	say(r, LOG_LVL_INFO, "flow %s (line %d): peer hosts after the first "
	    "changed in place", n->name, n->line);
	/* the ids may differ too: regrant does them (and counts the change) */
	return same_flow_ids(&o->ids, &n->ids) ? 1 : 0;
}

/*
 * o's flow differs from n in its max-lag, perhaps with its peer hosts after
 * the first and its ids (repeer and regrant do those next).  The lag limit
 * is moverd's (each of its views of the ring, pinned) and one word of the
 * ring that producers read when the ring is full, so it changes in place,
 * in use or not, and goes with the flow's state file across a restart
 * (now has it too).  1 if that was all (done), 0 to go on.
 */
static int relag(struct declared *d, const struct declared_flow *n,
		 struct flow *f, struct declared_flow *now,
		 struct declared_report *r)
{
	const char *more[FANOUT_MAX_PEERS], *have[FANOUT_MAX_PEERS];
	struct flow_spec spec = spec_of(n, more);
	uint64_t old = max_lag_of(f);
	char why[256];

	if (!f->view || old == n->max_lag)
		return 0;
	/* the rest must be the ring as it is, or the peers and ids */
	spec.max_lag = old;
	spec_flow_peers(&spec, f, have);
	spec_flow_ids(&spec, f);
	if (declared_differs(d->flows, f, &spec, why, sizeof(why)))
		return 0;
	/* every view of the ring, each sibling's (fan-out) too */
	for (struct flow *s = f; s; s = flow_next_sub(f, s)) {
		s->max_lag = n->max_lag;
		if (s->view)
			flows_pin_lag(s);
	}
	flows_save_owed(f, "its max-lag");
	now->max_lag = n->max_lag;
	say(r, LOG_LVL_INFO, "flow %s (line %d): max-lag changed in place "
	    "(%llu to %llu bytes; 0: lossless)", n->name, n->line,
	    (unsigned long long)old, (unsigned long long)n->max_lag);
	spec = spec_of(n, more);
	if (declared_differs(d->flows, f, &spec, why, sizeof(why)))
		return 0;
	r->changed++;
	return 1;
}

/* A flow of a declared name that a user created, not moverd: it stays
 * the user's (who may read what producers write into it, grant it,
 * destroy it), so it is never taken for the declared one. */
static bool squatted(const struct declared *d, const struct flow *f)
{
	return f->role != FLOW_RECEIVER && f->owner_uid != d->uid;
}

/*
 * Would n's flow be created once the old one is gone?  flows_create's
 * checks of the spec alone (flows_check_spec): sizes and this daemon's
 * limits, peer addresses, ids; not the room in the state directory, nor
 * what a peer host answers.  (No quota: the config's flows are moverd's
 * own user's, the operator's, flows_is_operator.)  0, or -1 with why in
 * err.
 */
static int would_create(const struct declared *d,
			const struct declared_flow *n, char *err, size_t cap)
{
	const char *more[FANOUT_MAX_PEERS];
	struct flow_spec spec = spec_of(n, more);
	struct flowshm_ring_params p;

	return flows_check_spec(d->flows, &spec, &p, err, cap) ? -1 : 0;
}

/* Is any record of sender flow f (ring tail `tail`) not yet read by the
 * consumer of a peer host (remote_head, carried by the acks: below acked,
 * the peer's flow holds records; below tail, some are not even there)?
 * The bytes of the furthest behind; a subscription cut or failed has
 * nothing more to lose. */
static uint64_t unread_away(const struct flow *f, uint64_t tail)
{
	uint64_t most = f->sub_dropped ? 0 : tail - f->remote_head;

	for (const struct flow *x = f->fanout; x; x = x->fanout_next)
		if (!x->sub_dropped && tail - x->remote_head > most)
			most = tail - x->remote_head;
	return most;
}

/* No client attached, nothing in the ring, nothing unread on a peer host:
 * re-creating (or destroying) loses nothing. */
static bool idle(const struct flow *f, char *why, size_t cap)
{
	struct flowshm_info in = { 0 };
	uint64_t away = 0;
	int n;

	if (f->view)
		flowshm_info(f->view, &in);
	if (f->role == FLOW_SENDER)
		away = unread_away(f, in.tail);
	n = snprintf(why, cap, "%u producer(s), %u consumer(s), %llu bytes "
		     "queued", f->producers, f->consumers,
		     (unsigned long long)(in.tail - in.head));
	if (f->role == FLOW_SENDER && n > 0 && (size_t)n < cap)
		snprintf(why + n, cap - (size_t)n, ", %llu bytes not yet read "
			 "on the peer host", (unsigned long long)away);
	return !f->producers && !f->consumers && in.tail == in.head && !away;
}

/*
 * More than max-lag, the peers and the ids changed: f is destroyed and
 * created as n says, if it loses nothing (idle) and the new one passes
 * the checks of a create (would_create), so that a declaration that
 * cannot be applied leaves the flow, and its name, as they were.
 */
static bool recreate(struct declared *d, const struct declared_flow *n,
		     struct flow *f, const char *why, struct declared_report *r)
{
	char use[192], err[256];

	if (!idle(f, use, sizeof(use))) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): declaration changed, "
		    "%s, but the flow is in use (%s): not applied; detach its "
		    "clients or destroy it, then reload", n->name, n->line,
		    why, use);
		return false;
	}
	if (would_create(d, n, err, sizeof(err))) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): declaration changed, "
		    "%s, but it cannot be created as declared: %s; not "
		    "applied, the flow stays as it was", n->name, n->line, why,
		    err);
		return false;
	}
	peer_destroy_flow(d->peers, f, "its declaration in moverd's config "
			  "changed");
	if (!create(d, n, r, "re-created: its declaration changed",
		    "destroyed; re-create failed"))
		return false; /* gone; the next reload creates it */
	r->changed++;
	return true;
}

/*
 * One declaration now in the file, o what was applied for it (or NULL).
 * Returns the declaration in force now: n; or, refused, o (NULL: none)
 * with what this reload did change of it (in now), so that the next
 * reload compares against what the flow has.
 */
static const struct declared_flow *apply_one(struct declared *d,
					     const struct declared_flow *o,
					     const struct declared_flow *n,
					     struct declared_flow *now,
					     struct declared_report *r)
{
	const char *more[FANOUT_MAX_PEERS];
	struct flow_spec spec = spec_of(n, more);
	struct flow *f = flows_find(d->flows, n->name);
	char why[256];
	int rc;

	if (n->receiver)
		return apply_receiver(d, o, n, r) ? n : o;
	if (!f) {
		if (!create(d, n, r, o ? "created again (it was gone)" :
					 "created", "cannot create it"))
			return o;
		if (!o)
			r->added++;
		else if (same_decl(o, n))
			r->unchanged++;
		else
			r->changed++;
		return n;
	}
	if (squatted(d, f)) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): not declared: a flow of "
		    "that name exists, created by uid %u, not by moverd; "
		    "destroy it and reload", n->name, n->line,
		    (unsigned)f->owner_uid);
		return o;
	}
	if (o && same_decl(o, n)) {
		r->unchanged++; /* never touched, whatever moverctl did to it */
		return n;
	}
	if (!declared_differs(d->flows, f, &spec, why, sizeof(why))) {
		r->unchanged++;
		say(r, LOG_LVL_INFO, "flow %s (line %d): exists as declared",
		    n->name, n->line);
		return n;
	}
	/* its state file named no max_lag (lossless, or written before
	 * moverd kept it there, the ring's word being any client's): the
	 * config's, in place, as a reload's change would */
	if (!o && !f->lag_known && f->role != FLOW_RECEIVER) {
		*now = *n;
		if (relag(d, n, f, now, r) > 0)
			return n;
	}
	if (!o || f->role == FLOW_RECEIVER) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s (line %d): not declared: a flow of "
		    "that name exists with a different %s; destroy it and "
		    "reload", n->name, n->line, why);
		return o;
	}
	*now = *o;
	rc = relag(d, n, f, now, r);
	if (!rc)
		rc = repeer(d, o, n, f, now, r);
	if (!rc)
		rc = regrant(d, o, n, f, now, r);
	if (!rc)
		rc = recreate(d, n, f, why, r) ? 1 : -1;
	return rc > 0 ? n : now;
}

/*
 * A declaration taken out of the file: its flow is destroyed if that
 * loses nothing (idle); one in use stays, no longer declared, for its
 * operator to drain and destroy (the reload cannot wait for a drain).
 */
static void remove_one(struct declared *d, const struct declared_flow *o,
		       struct declared_report *r)
{
	struct flow *f = flows_find(d->flows, o->name);
	char use[192];

	r->removed++;
	if (o->receiver) {
		say(r, LOG_LVL_INFO, "flow %s: no longer declared; the flow "
		    "from the peer stays, and so do its grants", o->name);
		return;
	}
	if (!f || f->role == FLOW_RECEIVER) {
		say(r, LOG_LVL_INFO, "flow %s: no longer declared (it was gone)",
		    o->name);
		return;
	}
	if (squatted(d, f)) {
		/* the declared one went (destroyed, or not made again), and
		 * a user created the name: theirs, not ours to destroy */
		say(r, LOG_LVL_INFO, "flow %s: no longer declared; the flow of "
		    "that name is uid %u's, and stays", o->name,
		    (unsigned)f->owner_uid);
		return;
	}
	if (!idle(f, use, sizeof(use))) {
		r->refused++;
		say(r, LOG_LVL_WARN, "flow %s: no longer declared, but in use "
		    "(%s): not destroyed; it stays, undeclared (moverctl flow "
		    "destroy --drain %s)", o->name, use, o->name);
		return;
	}
	say(r, LOG_LVL_INFO, "flow %s: no longer declared: destroyed", o->name);
	peer_destroy_flow(d->peers, f, "no longer declared in moverd's config");
}

void declared_apply(struct declared *d, struct declared_set *next,
		    struct declared_report *r)
{
	unsigned kept = 0;

	for (unsigned i = 0; i < d->cur.n; i++)
		if (!find(next, d->cur.v[i].name))
			remove_one(d, &d->cur.v[i], r);
	for (unsigned i = 0; i < next->n; i++) {
		const struct declared_flow *o = find(&d->cur, next->v[i].name);
		const struct declared_flow *in_force;
		struct declared_flow now;

		in_force = apply_one(d, o, &next->v[i], &now, r);
		if (in_force) /* kept <= i: v[i] is read first */
			next->v[kept++] = *in_force;
	}
	next->n = kept;
	index_set(next); /* its names moved */
	declared_set_free(&d->cur);
	d->cur = *next;
	*next = (struct declared_set){ 0 };
}

/* The files reread reads (the metrics token): 0, or -EINVAL with why;
 * none read and no config: -ENOENT, nothing to reload. */
static int reread_files(const struct declared *d, struct declared_reading *rd)
{
	int rc = d->reread ? d->reread(d->check_arg, &rd->files, rd->err,
				       sizeof(rd->err)) : 0;

	if (rc < 0)
		return -EINVAL;
	if (rc == 0 && !rd->have_flows) {
		snprintf(rd->err, sizeof(rd->err), "moverd was started without "
			 "--config: nothing to reload");
		return -ENOENT;
	}
	return 0;
}

void declared_reload_read(const struct declared *d,
			  struct declared_reading *rd)
{
	rd->r = (struct declared_report){ .text = rd->text,
					  .cap = sizeof(rd->text) };
	rd->text[0] = 0;
	if (d->path[0]) {
		if (declared_read(d->path, d->listen, &rd->next, rd->err,
				  sizeof(rd->err))) {
			rd->rc = -EINVAL;
			return;
		}
		rd->have_flows = true;
		/* the option lines too: one the next start would refuse is
		 * refused now, while the operator is there to see it */
		if (d->check_options &&
		    d->check_options(d->check_arg, d->path, &rd->r, rd->err,
				     sizeof(rd->err))) {
			rd->rc = -EINVAL;
			return;
		}
	}
	rd->rc = reread_files(d, rd);
}

void declared_reload_drop(const struct declared *d,
			  struct declared_reading *rd)
{
	if (d->reread_use && rd->files)
		d->reread_use(d->check_arg, rd->files, NULL);
	if (rd->have_flows)
		declared_set_free(&rd->next);
	rd->files = NULL;
	rd->have_flows = false;
}

int declared_reload_apply(struct declared *d, struct declared_reading *rd)
{
	if (rd->rc) {
		if (rd->rc != -ENOENT)
			log_warn("reload refused, nothing changed: %s", rd->err);
		declared_reload_drop(d, rd);
		return rd->rc;
	}
	if (d->reread_use && rd->files)
		d->reread_use(d->check_arg, rd->files, &rd->r);
	rd->files = NULL;
	if (rd->have_flows) {
		log_info("reloading %s: %u flows declared", d->path,
			 rd->next.n);
		declared_apply(d, &rd->next, &rd->r); /* takes next */
		rd->have_flows = false;
	}
	return 0;
}

bool declared_has(const struct declared *d, const struct flow *f)
{
	return d && find(&d->cur, f->name) && !squatted(d, f);
}

int declared_admit(void *arg, const char *name, const char *host, char *err,
		   size_t cap)
{
	const struct declared *d = arg;
	const struct declared_flow *df = find(&d->cur, name);

	if (!df || !df->receiver || !df->n_from ||
	    peer_nets_match_host(df->from, df->n_from, host))
		return 0;
	snprintf(err, cap, "flow '%s' may not be sent from %s: this host's "
		 "config takes it from %s only", name, host, df->from_text);
	return -EACCES;
}

void declared_grant(struct declared *d, struct flow *f)
{
	const struct declared_flow *df = d ? find(&d->cur, f->name) : NULL;

	/* a flow made again after a cut keeps its old ids (grants_kept) */
	if (df && df->receiver && f->role == FLOW_RECEIVER && !f->grants_kept)
		grant(d, df, f, NULL);
}
