/*
 * moverd/flows.c - create, find and destroy flows; attach permissions.
 */
#include "flows.h"
#include "fanout.h"
#include "fnv.h"
#include "log.h"
#include "private_dir.h"
#include "ring_guard.h"
#include "wire.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Builds with FM_CROSS_CHECK (the sanitizers': CMakeLists.txt) check what
 * moverd keeps up to date as it goes against a count from scratch, which
 * would cost a daemon in production what keeping it saves. */
#ifndef FM_CROSS_CHECK
#define FM_CROSS_CHECK 0
#endif

/* Buckets for an index of the table (names, holders): a power of two, at
 * least --max-flows. */
static uint32_t index_size(const struct flow_table *t)
{
	uint32_t n = 64;

	while (n < t->limits.max_flows && n < (1u << 20))
		n <<= 1;
	return n;
}

/* The table's index by name. */
static void names_init(struct flow_table *t)
{
	uint32_t n = index_size(t);

	t->names = calloc(n, sizeof(*t->names));
	if (!t->names) {
		log_warn("no memory for the index of flow names: each lookup "
			 "walks every flow");
		return;
	}
	t->names_mask = n - 1;
}

/* What each party holds, for the quotas (struct holder): there are never
 * more parties than flows and remains, so as many buckets as names. */
static void holders_init(struct flow_table *t)
{
	uint32_t n = index_size(t);

	t->holders = calloc(n, sizeof(*t->holders));
	if (!t->holders) {
		log_warn("no memory for the index of what each user and peer "
			 "host holds: each create's quota check walks every "
			 "flow");
		return;
	}
	t->holders_mask = n - 1;
}

/* moverd's own uid (flows_is_operator), which it never changes: read
 * once, not on every create, attach and peer open (a system call, about
 * 1 us of a refused create on the test host). */
static uid_t own_uid;

void flows_init(struct flow_table *t, const struct flow_limits *limits,
		const char *state_dir, int state_fd)
{
	own_uid = geteuid();
	*t = (struct flow_table){ .limits = *limits, .next_id = 1,
				  .state_fd = state_fd };
	snprintf(t->state_dir, sizeof(t->state_dir), "%s", state_dir);
	if (getrandom(&t->hash_seed, sizeof(t->hash_seed), 0) !=
	    sizeof(t->hash_seed))
		t->hash_seed = (uint32_t)fr_now_ns();
	names_init(t);
	holders_init(t);
}

/* name's bucket, hashed from the table's seed. */
static struct flow **name_bucket(const struct flow_table *t, const char *name)
{
	uint32_t h = fnv1a32_str(t->hash_seed, name);

	return &t->names[h & t->names_mask];
}

void flows_use_loop(struct flow_table *t, struct loop *l)
{
	t->loop = l;
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
	if (s == FLOW_RECONNECTING && f->state != s)
		f->orphaned_ns = fr_now_ns(); /* for --orphan-timeout */
	if (f->state != s)
		log_msg(s == FLOW_FAILED ? LOG_LVL_WARN : LOG_LVL_INFO,
			"flow %s: %s%s%s", f->name, flows_state_name(s),
			reason && *reason ? ": " : "", reason ? reason : "");
	f->state = s;
	snprintf(f->reason, sizeof(f->reason), "%s", reason ? reason : "");
	if (f->table)
		f->table->state_changes++;
	flows_status(f); /* what its clients read (flowshm_state) */
}

/* ---- the status its clients read (ring format 2: struct fr_status) ------ */

static enum fr_flow_state status_of(const struct flow *f)
{
	if (f->dead)
		return FR_STATE_CLOSED;
	if (f->sub_dropped) /* one peer's subscription of several (fan-out)
			       is over: the flow goes on for the others */
		return FR_STATE_OPEN;
	if (f->state == FLOW_FAILED)
		return FR_STATE_FAILED;
	if (f->draining)
		return FR_STATE_DRAINING;
	if (f->end_written)
		return FR_STATE_ENDED;
	switch (f->state) {
	case FLOW_OPEN: return FR_STATE_OPEN;
	case FLOW_CONNECTING: return FR_STATE_CONNECTING;
	case FLOW_RECONNECTING: return FR_STATE_PEER_DOWN;
	case FLOW_FAILED: return FR_STATE_FAILED;
	case FLOW_CLOSING: return FR_STATE_CLOSED;
	}
	return FR_STATE_UNKNOWN;
}

/*
 * Each word only when it differs from what is there: since_ns stays the
 * time of the last real change, and a ring's status line is not written
 * (and its cache line not taken from the clients) for nothing.
 */
void flows_status(struct flow *f)
{
	enum fr_flow_state st = status_of(f);
	struct fr_status_view v;
	struct fr_ring *r;

	if (!f->view)
		return;
	r = &f->view->ring;
	if (st != FR_STATE_UNKNOWN &&
	    (fr_status_read(r, &v) || v.state != (uint32_t)st))
		fr_status_set(r, st, st != FR_STATE_FAILED ? 0 :
				     f->cut_off ? ESTALE : EIO);
	if (fr_status_read(r, &v) || v.producers != f->producers ||
	    v.consumers != f->consumers)
		fr_status_counts(r, f->producers, f->consumers);
	if (fr_status_read(r, &v) || v.epoch != f->table->epoch)
		fr_status_epoch(r, f->table->epoch);
}

/* ---- ring files of flows between hosts ---------------------------------- */

/*
 * Everything here is relative to t->state_fd, the state directory checked
 * at start-up (private_dir.c), and never follows a link: a file planted
 * there is not written through, and one a restarted moverd reads back must
 * be a regular file of ours that no one else can write.
 */

/* The full path, for messages and `flow show`. */
static void flow_file(const struct flow_table *t, const char *name,
		      const char *ext, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s.%s", t->state_dir, name, ext);
}

/* The file's name in the state directory. */
static void file_name(const char *name, const char *ext, char *out, size_t cap)
{
	snprintf(out, cap, "%s.%s", name, ext);
}

#define FILE_NAME_MAX (FLOW_NAME_MAX + 16)
#define NOT_ADOPTED_RETRY_MS 10000u

/* The state file first: a ring left without one (moverd killed between
 * the two) is no flow, and a create unlinks it; a state file left alone
 * would make every create of the name refused (not_adopted). */
static void remove_files(const struct flow_table *t, const char *name)
{
	char file[FILE_NAME_MAX];

	file_name(name, "flow", file, sizeof(file));
	unlinkat(t->state_fd, file, 0);
	file_name(name, "ring", file, sizeof(file));
	unlinkat(t->state_fd, file, 0);
}

/* May s be a value in a state file?  Printable ASCII without '=': a
 * newline would add a line of its own, read back at re-adoption. */
static bool meta_value_ok(const char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e || *s == '=')
			return false;
	return true;
}

static void write_list(FILE *f, const char *key, const uint32_t *v, unsigned n)
{
	fprintf(f, "%s=", key);
	for (unsigned i = 0; i < n; i++)
		fprintf(f, "%s%u", i ? "," : "", v[i]);
	fputc('\n', f);
}

/* fanout=B:PORT,C:PORT: the peers besides peer= (fanout.h) */
static void write_fanout(FILE *f, const struct flow *fl)
{
	if (!fl->fanout)
		return;
	fputs("fanout=", f);
	for (const struct flow *s = fl->fanout; s; s = s->fanout_next)
		fprintf(f, "%s%s", s == fl->fanout ? "" : ",", s->peer_addr);
	fputc('\n', f);
}

/* cut=B:PORT,...: the subscriptions cut and not answered since (struct
 * flow's `rejoining`); no line when there are none, as an older moverd
 * reads the file */
static void write_cuts(FILE *f, const struct flow *fl)
{
	bool any = false;

	for (const struct flow *s = fl; s; s = flow_next_sub(fl, s)) {
		if (!s->rejoining)
			continue;
		fprintf(f, "%s%s", any ? "," : "cut=", s->peer_addr);
		any = true;
	}
	if (any)
		fputc('\n', f);
}

/* failed=REASON: why moverd failed the flow (flows_fail), read back at
 * the next start; a character a value may not hold is written as '?'.
 * No line while it has not failed, as an older moverd reads the file. */
static void write_failed(FILE *f, const struct flow *fl)
{
	if (!fl->failure)
		return;
	fputs("failed=", f);
	for (const char *c = fl->failure; *c; c++)
		fputc(*c < 0x20 || *c > 0x7e || *c == '=' ? '?' : *c, f);
	fputc('\n', f);
}

/* A new file name.flow.tmp, never through a link; -errno. */
static int open_tmp(const struct flow_table *t, const char *tmp, FILE **out)
{
	int fd, rc;

	/* whatever is there (a stale file, a planted link) goes first */
	if (unlinkat(t->state_fd, tmp, 0) && errno != ENOENT)
		return -errno;
	fd = openat(t->state_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
		    O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	*out = fdopen(fd, "w");
	if (*out)
		return 0;
	rc = -errno;
	close(fd);
	unlinkat(t->state_fd, tmp, 0);
	return rc;
}

/* name.flow: what a restarted moverd needs besides the ring itself. */
static int write_meta(const struct flow_table *t, const struct flow *fl)
{
	char name[FILE_NAME_MAX], tmp[FILE_NAME_MAX];
	FILE *f;
	int rc;

	if (!meta_value_ok(fl->peer_addr) || !meta_value_ok(fl->origin) ||
	    !meta_value_ok(fl->origin_host))
		return -EINVAL; /* flows_create refused it already */
	file_name(fl->name, "flow", name, sizeof(name));
	file_name(fl->name, "flow.tmp", tmp, sizeof(tmp));
	rc = open_tmp(t, tmp, &f);
	if (rc)
		return rc;
	fprintf(f, "role=%s\npeer=%s\nid=%u\nowner_uid=%u\nowner_gid=%u\n"
		"origin=%s\n", flows_role_name(fl->role), fl->peer_addr, fl->id,
		(unsigned)fl->owner_uid, (unsigned)fl->owner_gid, fl->origin);
	/* only a keyed identity differs from the address: a keyless flow's
	 * file stays as an older moverd reads it */
	if (strcmp(fl->origin_host, fl->origin))
		fprintf(f, "origin_host=%s\n", fl->origin_host);
	write_list(f, "allow_uids", fl->allowed.uids, fl->allowed.n_uids);
	write_list(f, "allow_gids", fl->allowed.gids, fl->allowed.n_gids);
	if (fl->decl_known) {
		const struct flow_ids *d = &fl->declared;

		write_list(f, "declared_uids", d->uids, d->n_uids);
		write_list(f, "declared_gids", d->gids, d->n_gids);
	}
	fprintf(f, "created_ms=%llu\n", (unsigned long long)fl->created_unix_ms);
	if (fl->max_lag) /* a lossless flow's file stays as an older moverd
			  * reads it */
		fprintf(f, "max_lag=%llu\n", (unsigned long long)fl->max_lag);
	write_fanout(f, fl);
	write_cuts(f, fl);
	write_failed(f, fl);
	if (fclose(f) || renameat(t->state_fd, tmp, t->state_fd, name)) {
		rc = -errno;
		unlinkat(t->state_fd, tmp, 0);
		return rc;
	}
	return 0;
}

/* A whole decimal number, no sign, no spaces, within 32 bits. */
static bool parse_u32(const char *s, uint32_t *out)
{
	unsigned long v;
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return false;
	*out = (uint32_t)v;
	return true;
}

/* A whole decimal number, no sign, no spaces, within 64 bits. */
static bool parse_u64(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return false;
	*out = v;
	return true;
}

/* "1,2,3" (or nothing): at most FLOW_ALLOW_MAX numbers. */
static bool parse_list(const char *s, uint32_t *v, unsigned *n)
{
	char buf[512], *save = NULL;

	*n = 0;
	if (!*s)
		return true;
	if (strlen(s) >= sizeof(buf) || s[strlen(s) - 1] == ',')
		return false;
	strcpy(buf, s);
	for (char *tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save))
		if (*n == FLOW_ALLOW_MAX || !parse_u32(tok, &v[(*n)++]))
			return false;
	return true;
}

enum meta_key { K_ROLE, K_PEER, K_ID, K_UID, K_GID, K_UIDS, K_GIDS, K_ORIGIN,
		K_CREATED, K_FANOUT, K_HOST, K_CUT, K_FAILED, K_DUIDS, K_DGIDS,
		K_LAG, K_COUNT };

static const char *const meta_keys[K_COUNT] = {
	"role", "peer", "id", "owner_uid", "owner_gid", "allow_uids",
	"allow_gids", "origin", "created_ms", "fanout", "origin_host", "cut",
	"failed", "declared_uids", "declared_gids", "max_lag",
};
/* keys a file written before they existed may lack (fanout: only a
 * flow to several peers has it; failed: only a failed one; declared_*:
 * only a receiving end the config declared; max_lag: only a lossy flow
 * since moverd kept its own) */
#define META_OPTIONAL ((1u << K_ORIGIN) | (1u << K_CREATED) | (1u << K_FANOUT) | \
		       (1u << K_HOST) | (1u << K_CUT) | (1u << K_FAILED) | \
		       (1u << K_DUIDS) | (1u << K_DGIDS) | (1u << K_LAG))

/* The value v of key k; false if it does not parse. */
static bool apply_meta(struct flow *fl, enum meta_key k, const char *v)
{
	uint32_t n;

	switch (k) {
	case K_ROLE:
		for (unsigned r = FLOW_LOCAL; r <= FLOW_RECEIVER; r++) {
			if (!strcmp(v, flows_role_name((enum flow_role)r))) {
				fl->role = (enum flow_role)r;
				return true;
			}
		}
		return false;
	case K_PEER:
		if (!meta_value_ok(v) || strlen(v) >= sizeof(fl->peer_addr))
			return false;
		strcpy(fl->peer_addr, v);
		return true;
	case K_ID:
		return parse_u32(v, &fl->id);
	case K_UID:
		if (!parse_u32(v, &n) || n == UINT32_MAX)
			return false;
		fl->owner_uid = (uid_t)n;
		return true;
	case K_GID:
		if (!parse_u32(v, &n) || n == UINT32_MAX)
			return false;
		fl->owner_gid = (gid_t)n;
		return true;
	case K_UIDS:
		return parse_list(v, fl->allowed.uids, &fl->allowed.n_uids);
	case K_GIDS:
		return parse_list(v, fl->allowed.gids, &fl->allowed.n_gids);
	case K_DUIDS:
		fl->decl_known = true;
		return parse_list(v, fl->declared.uids, &fl->declared.n_uids);
	case K_DGIDS:
		fl->decl_known = true;
		return parse_list(v, fl->declared.gids, &fl->declared.n_gids);
	case K_ORIGIN:
		if (!meta_value_ok(v) || strlen(v) >= sizeof(fl->origin))
			return false;
		strcpy(fl->origin, v);
		return true;
	case K_HOST:
		if (!meta_value_ok(v) || strlen(v) >= sizeof(fl->origin_host))
			return false;
		strcpy(fl->origin_host, v);
		return true;
	case K_CREATED:
		return parse_u64(v, &fl->created_unix_ms);
	case K_LAG:
		fl->lag_known = true;
		return parse_u64(v, &fl->max_lag);
	case K_FANOUT: /* each address is checked again when it is added */
		if (!meta_value_ok(v) || fl->fanout_saved)
			return false;
		fl->fanout_saved = strdup(v);
		return fl->fanout_saved != NULL;
	case K_CUT: /* only compared with the peers' addresses */
		if (!meta_value_ok(v) || fl->cut_saved)
			return false;
		fl->cut_saved = strdup(v);
		return fl->cut_saved != NULL;
	case K_FAILED: /* only said (ring_marked_failed) */
		if (!meta_value_ok(v) || fl->failure)
			return false;
		fl->failure = strdup(v);
		fl->failure_restored = true;
		return fl->failure != NULL;
	default:
		return false;
	}
}

/* The longest line write_meta writes is cut= (or fanout=) naming every
 * peer of a flow: up to FANOUT_MAX_PEERS addresses of up to 79 bytes and
 * their commas (643 bytes with "cut=": a buffer of 600 refused the file,
 * and the flow was not re-adopted).  Room for twice that. */
#define META_LINE_MAX 1400

_Static_assert(META_LINE_MAX > 2 * (8 + FANOUT_MAX_PEERS *
				      sizeof(((struct flow *)0)->peer_addr)),
	       "a state file line holds every peer's address");

/* Every key once, each value whole and in range; 0 or -1 with why. */
static int read_meta(FILE *f, struct flow *fl, char *why, size_t cap)
{
	char line[META_LINE_MAX];
	unsigned seen = 0, lineno = 0;

	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);
		char *eq = strchr(line, '=');
		unsigned k = 0;

		lineno++;
		if (!len || line[len - 1] != '\n') {
			snprintf(why, cap, "line %u: too long or unterminated",
				 lineno);
			return -1;
		}
		line[len - 1] = 0;
		if (eq)
			*eq = 0;
		while (k < K_COUNT && (!eq || strcmp(line, meta_keys[k])))
			k++;
		if (k == K_COUNT || (seen & (1u << k))) {
			snprintf(why, cap, "line %u: %s key '%.40s'", lineno,
				 k == K_COUNT ? "unknown" : "duplicate", line);
			return -1;
		}
		seen |= 1u << k;
		if (!apply_meta(fl, (enum meta_key)k, eq + 1)) {
			snprintf(why, cap, "line %u: bad value for %s", lineno,
				 meta_keys[k]);
			return -1;
		}
	}
	if ((seen | META_OPTIONAL) != (1u << K_COUNT) - 1) {
		snprintf(why, cap, "a key is missing");
		return -1;
	}
	return 0;
}

/* Open a file of the state directory to read back: no link, no FIFO
 * (O_NONBLOCK; cleared after), ours and no one else's to write. */
static int open_state_file(const struct flow_table *t, const char *file,
			   int flags, char *why, size_t cap)
{
	int fd = openat(t->state_fd, file, flags | O_NOFOLLOW | O_NONBLOCK |
			O_CLOEXEC);

	if (fd < 0) {
		snprintf(why, cap, "%s", errno == ELOOP ? "a symbolic link "
			 "(not followed)" : strerror(errno));
		return -1;
	}
	if (private_file_check(fd, why, cap) ||
	    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)) {
		close(fd);
		return -1;
	}
	return fd;
}

static void link_exposed(struct flow_table *t, struct flow *f)
{
	f->exp_next = t->exposed;
	t->exposed = f;
	t->n_exposed++;
}

void flows_expose(struct flow *f)
{
	if (f->exposed)
		return;
	f->exposed = true;
	if (!f->dead && !f->sibling_of)
		link_exposed(f->table, f);
}

static bool id_in_use(const struct flow_table *t, uint32_t id)
{
	for (const struct flow *f = t->head; f; f = f->next) {
		if (f->id == id)
			return true;
		for (const struct flow *s = f->fanout; s; s = s->fanout_next)
			if (s->id == id)
				return true;
	}
	return false;
}

/*
 * Ids only grow, from 1 past the largest a state file names, so until
 * 2^32 of them were handed out each is new.  Then they wrap (12 days of
 * one uid's creates of 4 KiB rings at the default --max-ring-rate-per-uid):
 * from there on each is checked against the table (one walk a create), so
 * that a long-lived flow's id is never a new flow's too.  0 stays no id.
 */
uint32_t flows_new_id(struct flow_table *t)
{
	for (;;) {
		uint64_t seq = t->next_id++;
		uint32_t id = (uint32_t)seq;

		if (id && (seq <= UINT32_MAX || !id_in_use(t, id)))
			return id;
	}
}

/* ---- what each party holds, for the quotas ----------------------------- */

struct usage {
	unsigned flows;
	uint64_t bytes;
	unsigned gone;           /* of those flows, the destroyed ones whose
				  * rings are not yet released */
};

/* A party the quotas charge: a peer host, by its address, for receiver
 * flows; a uid for the others (check_quota). */
struct party {
	bool peer;
	uid_t uid;               /* not a peer's */
	const char *host;        /* a peer's ("" for a uid) */
};

/*
 * What one party holds: its listed flows, its destroyed flows that I/O in
 * flight still refers to (t->dying) and its remains (destroyed rings
 * still draining or being punched out), kept as they come and go (charge,
 * uncharge), so that a
 * create's quota check is a lookup: it walked every flow and remains, 0.1
 * ms with 10 000 flows, each time a peer repeated an open refused.
 * An entry lives while a flow or remains points to it (refs): so there
 * are never more entries than those, whatever a remote party asks.  A
 * flow takes its entry, the only step that allocates, before it is listed
 * (hold: a create or adopt fails cleanly for memory), keeps it while it
 * is listed and after, and its remains inherit it (release_pages), so
 * that no later step can fail to charge or uncharge.
 */
struct holder {
	struct holder *next;     /* in its bucket */
	bool peer;
	uid_t uid;
	char host[FLOW_HOST_MAX + 1];
	unsigned refs;           /* the flows and remains that point here */
	struct usage held;       /* ... of those the listed and dying flows,
				  * and the remains (what usage_of counts) */
};

/* Whom a flow or remains of this role, owner and origin_host is charged
 * to; a spec's party, with the uid asking and its origin_host (as
 * charged() matches them). */
static struct party charged_to(enum flow_role role, uid_t owner,
			       const char *host)
{
	if (role == FLOW_RECEIVER)
		return (struct party){ .peer = true, .host = host };
	return (struct party){ .uid = owner, .host = "" };
}

static bool holder_is(const struct holder *h, struct party p)
{
	if (h->peer != p.peer)
		return false;
	return p.peer ? !strcmp(h->host, p.host) : h->uid == p.uid;
}

/* Where p's entry is in its bucket's chain (*slot NULL: p has none).
 * Hashed from the table's seed: a peer cannot aim its addresses at one
 * bucket. */
static struct holder **holder_slot(const struct flow_table *t, struct party p)
{
	uint32_t h = fnv1a32(t->hash_seed, &p.peer, sizeof(p.peer));
	struct holder **pp;

	h = p.peer ? fnv1a32_more(h, p.host, strlen(p.host)) :
		     fnv1a32_more(h, &p.uid, sizeof(p.uid));
	for (pp = &t->holders[h & t->holders_mask]; *pp; pp = &(*pp)->next)
		if (holder_is(*pp, p))
			break;
	return pp;
}

/* p's entry, made if it has none, with one more ref; NULL: no memory. */
static struct holder *holder_get(struct flow_table *t, struct party p)
{
	struct holder **pp = holder_slot(t, p), *h = *pp;

	if (!h) {
		h = calloc(1, sizeof(*h));
		if (!h)
			return NULL;
		h->peer = p.peer;
		h->uid = p.uid;
		snprintf(h->host, sizeof(h->host), "%s", p.host);
		*pp = h;
	}
	h->refs++;
	return h;
}

/* One ref less on h (NULL: none); the last frees it. */
static void holder_put(struct flow_table *t, struct holder *h)
{
	struct holder **pp;

	if (!h || --h->refs)
		return;
	if (FM_CROSS_CHECK && (h->held.flows || h->held.bytes ||
			       h->held.gone)) {
		log_error("quota figures: a party's entry goes still holding "
			  "%u flows, %llu bytes, %u gone", h->held.flows,
			  (unsigned long long)h->held.bytes, h->held.gone);
		abort();
	}
	pp = holder_slot(t, (struct party){ h->peer, h->uid, h->host });
	*pp = h->next;
	free(h);
}

/* f takes the entry of the party it is charged to; -ENOMEM: none taken.
 * Before f is listed, where its create or adopt can still give up. */
static int hold(struct flow_table *t, struct flow *f)
{
	if (!t->holders)
		return 0; /* none: check_quota walks */
	f->holder = holder_get(t, charged_to(f->role, f->owner_uid,
						f->origin_host));
	return f->holder ? 0 : -ENOMEM;
}

/* A flow is listed (gone: false), or destroyed (unlisted, still
 * referenced), or a remains made (gone: true): its party holds more. */
static void charge(struct holder *h, uint64_t ring_bytes, bool gone)
{
	if (!h)
		return;
	h->held.flows++;
	h->held.bytes += ring_bytes;
	h->held.gone += gone;
}

/* The reverse: a flow unlisted, its last reference put, a remains freed. */
static void uncharge(struct holder *h, uint64_t ring_bytes, bool gone)
{
	if (!h)
		return;
	h->held.flows--;
	h->held.bytes -= ring_bytes;
	h->held.gone -= gone;
}

/* A destroyed flow's ring is held (in: a dying flow, a remains), or no
 * longer: the table's figures for the operator (flows_destroyed_rings). */
static void gone_count(struct flow_table *t, uint64_t ring_bytes, bool in)
{
	if (in) {
		t->n_gone++;
		t->gone_bytes += ring_bytes;
	} else {
		t->n_gone--;
		t->gone_bytes -= ring_bytes;
	}
}

int flows_charge_host(struct flow *f, const char *host)
{
	struct flow_table *t = f->table;
	char to[sizeof(f->origin_host)];
	struct holder *h = NULL;

	snprintf(to, sizeof(to), "%s", host); /* as kept: it is the key */
	if (f->holder &&
	    !(h = holder_get(t, charged_to(f->role, f->owner_uid, to))))
		return -ENOMEM;
	if (f->listed || f->dying) {
		uncharge(f->holder, f->ring_bytes, f->dying);
		charge(h, f->ring_bytes, f->dying);
	}
	holder_put(t, f->holder); /* after the get: h may be the same */
	f->holder = h;
	memcpy(f->origin_host, to, sizeof(to));
	return 0;
}

static void link_flow(struct flow_table *t, struct flow *f)
{
	f->prev = NULL;
	f->next = t->head;
	if (t->head)
		t->head->prev = f;
	t->head = f;
	if (t->names) {
		struct flow **b = name_bucket(t, f->name);

		f->name_next = *b;
		*b = f;
	}
	f->listed = true;
	t->count++;
	charge(f->holder, f->ring_bytes, false);
	if (f->id >= t->next_id)
		t->next_id = (uint64_t)f->id + 1;
	if (f->exposed)
		link_exposed(t, f);
}

/* ---- a ring's pages, allocated off the loop ---------------------------------- */

/*
 * A ring's pages are allocated when it is created (libflowshm's
 * preallocate says why), which on tmpfs costs about 0.3 s a GiB: on the
 * loop that stalled every flow and client for as long, once a create
 * (docs/security-quota.md).  With a loop, the ring is created lazy and
 * io_uring's workers allocate it (IORING_OP_FALLOCATE), FILL_CHUNK at a
 * time, one chunk of one ring at a time: rings waiting for their turn
 * queue in the table (fill_head), round robin by chunk.  So the fills use
 * one cpu's worth of a worker at most, and a ring destroyed before its
 * turn allocates nothing.  A chunk holds its file's inode lock, which the
 * loop's unlink at a destroy (and ftruncate of a tampered file) waits
 * for: at 4 MiB that is about 1 ms (64 MiB made `status` wait 18-20 ms
 * beside a create/destroy loop; createbench), and a stop waits as long.
 * The flow is usable at once: a page a client touches before the fill
 * gets there faults in on its own, and fallocate leaves a page already
 * there as it is.  What is not allocated yet still holds its room in the
 * state directory (fill_pending, check_state_dir), so that rings created
 * back to back cannot overcommit it; a shortage the fill meets anyway
 * (another writer of the filesystem, a memory cgroup) fails the flow,
 * with why.  A ring of FILL_NOW_MAX or less is allocated on the spot
 * (0.3 ms at most): a fill's round trip would cost more than that.  A
 * re-adopted ring that is not all allocated (its moverd stopped during
 * the fill) is filled too.  The blocks a client allocates beyond its ring
 * file are punched out the same way, a chunk at a time (trim_start).
 */
#define FILL_CHUNK (4ull << 20)
#define FILL_NOW_MAX (1ull << 20)
#define FILL_EINTR_MAX 64 /* tmpfs: a pending signal interrupts it */

static void fill_done(struct loop_op *op, int res);

/* The bytes of f's ring file that are allocated, as its blocks tell (0
 * if it cannot be told), at most its size. */
static uint64_t allocated_bytes(const struct flow *f)
{
	uint64_t size = fr_map_bytes(f->ring_bytes), got;
	struct stat st;

	if (f->ring_fd < 0 || fstat(f->ring_fd, &st))
		return 0;
	got = (uint64_t)st.st_blocks * 512;
	return got < size ? got : size;
}

/* What f's ring file has not allocated yet: the room its fill holds. */
static uint64_t fill_unallocated(const struct flow *f)
{
	return fr_map_bytes(f->ring_bytes) - allocated_bytes(f);
}

static uint64_t fill_left(const struct flow *f)
{
	return fr_map_bytes(f->ring_bytes) - f->filled;
}

static uint64_t fill_chunk(const struct flow *f)
{
	uint64_t left = fill_left(f);

	return left < FILL_CHUNK ? left : FILL_CHUNK;
}

static bool fill_stopped(const struct flow *f)
{
	return !fill_left(f) || f->dead || f->kept || f->state == FLOW_FAILED;
}

static void fill_enqueue(struct flow_table *t, struct flow *f)
{
	f->fill_queued = true;
	f->fill_qnext = NULL;
	f->fill_qprev = t->fill_tail;
	if (t->fill_tail)
		t->fill_tail->fill_qnext = f;
	else
		t->fill_head = f;
	t->fill_tail = f;
}

static void fill_dequeue(struct flow_table *t, struct flow *f)
{
	if (f->fill_qprev)
		f->fill_qprev->fill_qnext = f->fill_qnext;
	else
		t->fill_head = f->fill_qnext;
	if (f->fill_qnext)
		f->fill_qnext->fill_qprev = f->fill_qprev;
	else
		t->fill_tail = f->fill_qprev;
	f->fill_qprev = f->fill_qnext = NULL;
	f->fill_queued = false;
}

/* The fill is over: what it did not allocate holds no room any more, and
 * its reference goes (the last one releases the flow: flow_put). */
static void fill_end(struct flow *f)
{
	struct flow_table *t = f->table;

	t->fill_pending -= f->fill_held;
	f->fill_held = 0;
	t->n_async--;
	log_debug("flow %s: %llu of %llu ring bytes allocated", f->name,
		  (unsigned long long)f->filled,
		  (unsigned long long)fr_map_bytes(f->ring_bytes));
	flow_put(f);
}

/* Of the room f's fill holds, what its ring file has allocated since
 * (a chunk, done or in flight, or pages a client touched first). */
static uint64_t fill_held_allocated(const struct flow *f)
{
	uint64_t unallocated = fill_unallocated(f);

	return f->fill_held > unallocated ? f->fill_held - unallocated : 0;
}

/* The room of what f's ring file has allocated goes back. */
static void fill_release_allocated(struct flow *f)
{
	uint64_t done = fill_held_allocated(f);

	f->table->fill_pending -= done;
	f->fill_held -= done;
}

/* Submit f's next chunk; false: no SQE (the rest faults in on first
 * use). */
static bool fill_submit(struct flow *f)
{
	struct io_uring_sqe *sqe = loop_sqe(f->table->loop, &f->fill_op,
					    fill_done);

	if (!sqe)
		return false;
	io_uring_prep_fallocate(sqe, f->ring_fd, 0, (off_t)f->filled,
				(off_t)fill_chunk(f));
	return true;
}

/* No chunk in flight: start the next ring's, if any waits. */
static void fill_kick(struct flow_table *t)
{
	struct flow *f;

	while (!t->fill_busy && (f = t->fill_head)) {
		fill_dequeue(t, f);
		if (!fill_stopped(f) && fill_submit(f)) {
			t->fill_busy = f;
			return;
		}
		fill_end(f);
	}
}

static void fill_done(struct loop_op *op, int res)
{
	struct flow *f = (struct flow *)((char *)op -
					 offsetof(struct flow, fill_op));
	struct flow_table *t = f->table;

	if (res == -EINTR && ++f->fill_eintr < FILL_EINTR_MAX &&
	    !fill_stopped(f) && fill_submit(f))
		return;
	f->fill_eintr = 0;
	t->fill_busy = NULL;
	if (!res) {
		uint64_t len = fill_chunk(f);

		f->filled += len;
		fill_release_allocated(f);
		if (!fill_stopped(f))
			fill_enqueue(t, f); /* its next chunk, in turn */
		else
			fill_end(f);
	} else {
		if ((res == -ENOSPC || res == -ENOMEM) && !f->dead &&
		    !f->kept) {
			char why[160];

			snprintf(why, sizeof(why), "cannot allocate its ring's "
				 "memory (%llu of %llu bytes): %s",
				 (unsigned long long)f->filled,
				 (unsigned long long)fr_map_bytes(f->ring_bytes),
				 strerror(-res));
			flows_fail(f, why); /* fill_stop: not queued */
		}
		fill_end(f);
	}
	fill_kick(t);
}

/*
 * f is destroyed, let go or failed: a fill waiting for its turn ends now;
 * one in flight stops after its chunk, and holds that chunk's room only.
 */
static void fill_stop(struct flow *f)
{
	struct flow_table *t = f->table;
	uint64_t keep;

	if (f->fill_queued) {
		fill_dequeue(t, f);
		fill_end(f); /* the caller holds a reference of its own */
		return;
	}
	keep = t->fill_busy == f ? fill_chunk(f) : 0;
	if (f->fill_held <= keep)
		return;
	t->fill_pending -= f->fill_held - keep;
	f->fill_held = keep;
}

/*
 * Of the room the fill holds, the part the chunk in flight has allocated
 * already.  fallocate runs beside the loop (io-wq), so the filesystem's
 * free space shrinks page by page while fill_pending drops only when the
 * chunk is done: without this, up to a chunk (4 MiB) counted twice made
 * free space look to rise once the chunk ended, and a ring refused one
 * moment fit the next.  Pages a client touches in a ring whose fill
 * waits its turn count twice until that fill's next chunk: that errs
 * towards refusing.
 */
static uint64_t fill_allocating(const struct flow_table *t)
{
	return t->fill_busy ? fill_held_allocated(t->fill_busy) : 0;
}

/* Is a ring of this size allocated off the loop? */
static bool fill_later(const struct flow_table *t, uint64_t ring_bytes)
{
	return t->loop && fr_map_bytes(ring_bytes) > FILL_NOW_MAX;
}

/* Allocate f's ring off the loop, in turn, holding a reference. */
static void fill_start(struct flow_table *t, struct flow *f)
{
	f->filled = 0;
	/* not what the format (or, re-adopted, an earlier fill) allocated */
	f->fill_held = fill_unallocated(f);
	t->fill_pending += f->fill_held;
	t->n_async++;
	flow_get(f); /* the fill reads f until fill_end */
	fill_enqueue(t, f);
	fill_kick(t);
}

/* moverd's mapping of a ring file survives the file shrinking. */
static void guard_mapped(void *map, size_t bytes, void *arg)
{
	*(uint64_t *)arg = ring_guard_add(map, bytes);
}

int flows_open_view(int ring_fd, bool guarded, flowshm_t **view,
		    uint64_t *guard)
{
	int rc;

	*guard = 0;
	rc = flowshm_open_view(ring_fd, guarded ? guard_mapped : NULL, guard,
			       view);
	if (rc) { /* unmapped already */
		ring_guard_remove(*guard);
		*guard = 0;
		return rc;
	}
	if (guarded && !*guard) {
		/* no memory for the guard: unguarded, a client shrinking the
		 * file would kill moverd (SIGBUS) with every flow in it */
		flowshm_close(*view);
		*view = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* Every subscriber slot of f's ring but moverd's own. */
static uint32_t others_slots(const struct flow *f)
{
	const struct fr_ring *r = &f->view->ring;
	uint32_t all = (1u << FR_MAX_SUBS) - 1u;

	return r->sub < FR_MAX_SUBS ? all & ~(1u << r->sub) : all;
}

/* The ACTIVE subscriber slots of f's ring but moverd's own. */
static uint32_t active_slots(const struct flow *f)
{
	/* relaxed: a hint of which slots to look at; fr_sub_leave_dead
	 * reads each slot's state itself (acquire) */
	return atomic_load_explicit(&f->view->ring.sh->sub_mask,
				    memory_order_relaxed) & others_slots(f);
}

void flows_recover_local(struct flow *f)
{
	static struct log_limit lim; /* the counter is a client's to write */
	uint64_t pos;

	if (f->role != FLOW_LOCAL || !f->view)
		return;
	/* where the slowest consumer stands (it publishes before it sleeps
	 * there, or once it finds it cannot judge the claim there) */
	if (!fr_recover_slowest(&f->view->ring, &pos))
		log_limited(&lim, LOG_LVL_INFO, "flow %s: a record whose "
			    "producer died before it committed was skipped at "
			    "position %llu", f->name, (unsigned long long)pos);
}

void flows_watch_inherited(struct flow *f)
{
	unsigned n;

	if (!f->inherited_slots || !f->view)
		return;
	n = fr_sub_leave_dead(&f->view->ring, f->inherited_slots);
	if (n)
		log_info("flow %s: %u subscriber slot(s) of processes that "
			 "died since the restart given back", f->name, n);
	/* a slot freed and taken again by a client itself (flowshm_open_fd)
	 * keeps its bit a while longer: it is judged by the pid that client
	 * wrote, its own (moverd's takes clear the bit: take_slot) */
	f->inherited_slots &= active_slots(f);
}

/* A local flow needs no one to come back: it is open at once. */
static enum flow_state adopted_state(enum flow_role role)
{
	if (role == FLOW_LOCAL)
		return FLOW_OPEN;
	return role == FLOW_SENDER ? FLOW_CONNECTING : FLOW_RECONNECTING;
}

/* A flow whose state file says it failed (failed=): its ring is failed
 * again (the flag is in the ring file's page, which a crash of the host
 * rather than of moverd may have lost).  One
 * between hosts fails at its first check, which says the saved reason
 * (ring_marked_failed) and tells its peer as before the restart; a local
 * one, with no peer to tell, is failed here. */
static void adopt_failed(struct flow *fl)
{
	fr_fail(&fl->view->ring);
	if (fl->role != FLOW_LOCAL)
		return;
	fl->state = FLOW_FAILED;
	flows_verdict(fl, fl->reason, sizeof(fl->reason));
}

/* Open the ring file of one flow named in the state directory. */
/* Why a ring file does not open, in words: a ring of another format (a
 * file written by an older moverd) names its version. */
static void ring_open_error(int fd, int rc, char *why, size_t cap)
{
	uint32_t version = 0;

	if (rc == -EPROTO &&
	    pread(fd, &version, sizeof(version),
		  offsetof(struct fr_geometry, version)) ==
		    (ssize_t)sizeof(version) && version != FR_VERSION)
		snprintf(why, cap, "ring format %u, this moverd speaks %u",
			 (unsigned)version, FR_VERSION);
	else
		snprintf(why, cap, "%s", flowshm_strerror(rc));
}

/*
 * moverd is a subscriber of a sender flow's ring (ring format 2): one slot,
 * through which it publishes what the peer acknowledged.  Taken at the
 * slowest subscriber's position, so nothing unsent is skipped.
 */
static int take_sender_slot(struct flow *f)
{
	uint32_t pid = (uint32_t)getpid() & FR_INFO_PID;
	/* HELD: producers never cut it, moverd does (max_lag) */
	int rc = fr_sub_take_held(&f->view->ring, pid);

	/* at a re-adoption, every slot taken: the last moverd's HELD ones
	 * (only we may give them back) and its clients'.  The one furthest
	 * behind becomes ours where it stands (after a kill -9 or an
	 * orderly stop alike) */
	if (rc == -EBUSY)
		rc = fr_sub_take_over_held(&f->view->ring, pid);
	return rc;
}

/*
 * A state file names max_lag only when it is not 0: none is lossless.  The
 * ring's word is not taken instead (any client may have written it; a
 * lossless flow's file names none either): a file from a moverd that kept
 * max_lag nowhere else, whose ring says otherwise, is said once.
 */
static void warn_lag_word(const struct flow *fl)
{
	/* relaxed: a setting, read once */
	uint64_t word = atomic_load_explicit(&fl->view->ring.sh->max_lag,
					     memory_order_relaxed);

	if (word == fl->max_lag)
		return;
	log_warn("flow %s: its ring says max_lag %llu, its state file %llu: "
		 "moverd goes by the file (%s); a declared flow takes its "
		 "max-lag from the config", fl->name,
		 (unsigned long long)word, (unsigned long long)fl->max_lag,
		 fl->lag_known ? "the ring's word was rewritten" :
		 "no max_lag= line: lossless, or written by a moverd that "
		 "kept it in the ring only");
}

/* Does a record of max_record go to a peer in one DATA frame (wire.h)? */
static bool fits_one_frame(uint32_t max_record)
{
	return fr_record_bytes(max_record) <= WIRE_SPAN_MAX;
}

/*
 * A ring file from the last start, as its geometry says now: a client
 * holding the file may have grown it and rewritten the geometry to match
 * (ring files cannot be sealed), which would pass every quota at adoption
 * and have moverd allocate it whole.  True (why said) if it is larger than
 * this start allows, its mode is not its role's, or its records do not
 * fit a frame to a peer.  The files stay: raise the limit and restart to
 * adopt a ring made when it was higher.
 */
static bool ring_unfit(const struct flow_table *t, const struct flow *fl,
		       const struct flowshm_info *in, char *why, size_t cap)
{
	bool deposit = in->flags & FLOWSHM_RING_DEPOSIT;

	if (in->ring_size > t->limits.max_ring_size)
		snprintf(why, cap, "its ring is %llu bytes, above --max-ring-size "
			 "(%llu): raise it to adopt the flow, or a client grew "
			 "the file", (unsigned long long)in->ring_size,
			 (unsigned long long)t->limits.max_ring_size);
	else if (deposit != (fl->role == FLOW_RECEIVER))
		snprintf(why, cap, "its ring is a %s ring, not a %s flow's "
			 "(a client rewrote it)", deposit ? "deposit" : "producer",
			 flows_role_name(fl->role));
	else if (fl->role != FLOW_LOCAL && !fits_one_frame(in->max_record))
		snprintf(why, cap, "its records of up to %u bytes do not fit one "
			 "frame to a peer (a client rewrote it)", in->max_record);
	else
		return false;
	return true;
}

static struct flow *adopt_one(struct flow_table *t, const char *name)
{
	char file[FILE_NAME_MAX], why[200] = "";
	unsigned n_dead;
	struct flowshm_info in;
	struct flow *fl = flows_alloc();
	FILE *f;
	int fd, rc;

	if (!fl) {
		log_error("flow %s: cannot re-adopt it: out of memory (its "
			  "files stay for the next start)", name);
		return NULL;
	}
	snprintf(fl->name, sizeof(fl->name), "%s", name);
	fl->refs = 1; /* the table's */
	fl->table = t;
	fl->transport = "tcp";
	file_name(name, "flow", file, sizeof(file));
	fd = open_state_file(t, file, O_RDONLY, why, sizeof(why));
	if (fd < 0)
		goto refuse;
	f = fdopen(fd, "r");
	if (!f) {
		snprintf(why, sizeof(why), "%s", strerror(errno));
		close(fd);
		goto refuse;
	}
	rc = read_meta(f, fl, why, sizeof(why));
	fclose(f);
	if (rc)
		goto refuse;
	/* no origin_host: origin is the address (a keyless peer's), or the
	 * file is older than origin_host and the flow is charged to its
	 * identity until its peer resumes it (peer_open.c, check_origin) */
	if (!fl->origin_host[0])
		snprintf(fl->origin_host, sizeof(fl->origin_host), "%.*s",
			 FLOW_HOST_MAX, fl->origin);
	if (hold(t, fl)) { /* whom it is charged to is known from here */
		snprintf(why, sizeof(why), "out of memory");
		goto refuse;
	}
	file_name(name, "ring", file, sizeof(file));
	flow_file(t, name, "ring", fl->path, sizeof(fl->path));
	fl->ring_fd = open_state_file(t, file, O_RDWR, why, sizeof(why));
	if (fl->ring_fd < 0)
		goto refuse;
	/* guarded from before moverd's first touch of the file */
	rc = flows_open_view(fl->ring_fd, fl->path[0], &fl->view, &fl->guard);
	if (rc) {
		ring_open_error(fl->ring_fd, rc, why, sizeof(why));
		close(fl->ring_fd);
		goto refuse;
	}
	flowshm_info(fl->view, &in);
	if (ring_unfit(t, fl, &in, why, sizeof(why))) {
		flowshm_close(fl->view);
		ring_guard_remove(fl->guard);
		close(fl->ring_fd);
		goto refuse;
	}
	warn_lag_word(fl);
	flows_pin_lag(fl); /* before our slot's take reads it */
	if (fl->role == FLOW_SENDER && (rc = take_sender_slot(fl))) {
		snprintf(why, sizeof(why), "no subscriber slot for moverd: %s",
			 strerror(-rc));
		flowshm_close(fl->view);
		ring_guard_remove(fl->guard);
		close(fl->ring_fd);
		goto refuse;
	}
	/* the slots of clients (and of the moverd) that died while no
	 * moverd watched them: theirs were the connections that closed */
	n_dead = fr_sub_leave_dead(&fl->view->ring, others_slots(fl));
	/* (a dead producer's slot would be taken back when needed anyway;
	 * its gap, if any, is recovered either way) */
	n_dead += fr_prod_leave_dead(&fl->view->ring);
	/* again: our slot and the dead ones given back moved the head */
	flowshm_info(fl->view, &in);
	fl->ring_bytes = in.ring_size;
	/* sender: everything before our slot's position (joined at the
	 * slowest subscriber's, the dead moverd's among them) was
	 * acknowledged by the peer */
	fl->sent = fl->acked = fl->remote_head = in.head;
	fl->reported_head = in.head;
	fl->wire_max = UINT64_MAX; /* what the last run sent is not known */
	if (n_dead)
		log_info("flow %s: %u subscriber or producer slot(s) of dead "
			 "processes given back", name, n_dead);
	fl->inherited_slots = active_slots(fl);
	fl->exposed = true; /* the last start's clients may hold the file */
	fl->state = adopted_state(fl->role);
	fl->transport = fl->role == FLOW_LOCAL ? "local" : "tcp";
	fl->orphaned_ns = fr_now_ns(); /* a receiver's wait counts from now */
	snprintf(fl->reason, sizeof(fl->reason), "re-adopted after a restart");
	if (fl->failure)
		adopt_failed(fl);
	flows_status(fl); /* this start's epoch: its clients learn of it */
	log_info("flow %s: re-adopted (%s, head %llu, tail %llu)", name,
		 flows_role_name(fl->role), (unsigned long long)in.head,
		 (unsigned long long)in.tail);
	return fl;
refuse:
	log_error("flow %s: refusing to re-adopt %s/%s: %s", name,
		  t->state_dir, file, why);
	holder_put(t, fl->holder);
	free(fl->fanout_saved);
	free(fl->cut_saved);
	free(fl->failure);
	free(fl);
	return NULL;
}

/* The number in the state directory's file `epoch`, 0 if none or bad. */
static uint64_t read_epoch(const struct flow_table *t)
{
	char buf[32], why[200];
	int fd = open_state_file(t, "epoch", O_RDONLY, why, sizeof(why));
	ssize_t n;
	uint64_t v = 0;

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return parse_u64(buf, &v) ? v : 0;
}

uint64_t flows_count_start(struct flow_table *t)
{
	char tmp[] = "epoch.tmp", line[32];
	FILE *f;
	int rc;

	t->epoch = read_epoch(t) + 1;
	snprintf(line, sizeof(line), "%llu\n", (unsigned long long)t->epoch);
	rc = t->state_fd >= 0 ? open_tmp(t, tmp, &f) : -EBADF;
	if (!rc) {
		fputs(line, f);
		if (fclose(f) || renameat(t->state_fd, tmp, t->state_fd,
					  "epoch"))
			rc = -errno;
	}
	if (rc) {
		/* still a number no other start had: the wall clock */
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		t->epoch = (uint64_t)ts.tv_sec * 1000000000ull +
			   (uint64_t)ts.tv_nsec;
		log_warn("cannot keep the start count in %s/epoch (%s): the "
			 "rings' status epoch is the start's time instead",
			 t->state_dir, strerror(-rc));
	}
	return t->epoch;
}

unsigned flows_adopt(struct flow_table *t)
{
	int fd = t->state_fd >= 0 ? dup(t->state_fd) : -1;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;
	unsigned n = 0;

	if (!d) {
		if (t->state_fd >= 0)
			log_error("cannot read the state directory %s to "
				  "re-adopt its flows: %s (their files stay "
				  "for the next start)", t->state_dir,
				  strerror(errno));
		if (fd >= 0)
			close(fd);
		return 0;
	}
	rewinddir(d); /* the dup shares its position with state_fd */
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
			/* (a failed ring is not worth its pages) */
			if (fill_later(t, fl->ring_bytes) && !fl->failure &&
			    allocated_bytes(fl) < fr_map_bytes(fl->ring_bytes))
				fill_start(t, fl);
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

struct flow *flows_alloc(void)
{
	size_t bytes = (sizeof(struct flow) + 63) & ~(size_t)63;
	struct flow *f = aligned_alloc(64, bytes);

	if (f)
		memset(f, 0, bytes);
	return f;
}

struct flow *flows_find(struct flow_table *t, const char *name)
{
	if (t->names) {
		for (struct flow *f = *name_bucket(t, name); f;
		     f = f->name_next)
			if (!strcmp(f->name, name))
				return f;
		return NULL;
	}
	for (struct flow *f = t->head; f; f = f->next)
		if (strcmp(f->name, name) == 0)
			return f;
	return NULL;
}

uint64_t flows_unix_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- quotas -------------------------------------------------------------- */

struct flow_remains {
	struct flow_remains *next;
	struct flow_table *table;
	flowshm_t *view;         /* moverd's mapping: punched through it ... */
	int fd;                  /* ... or through the ring's fd (-1: gone) */
	struct loop_op op;       /* the punch of a chunk in flight */
	uint64_t punched;        /* data bytes punched out so far */
	uint64_t frees;          /* allocated bytes the punch is yet to free
				  * (its part of the table's punch_pending) */
	bool releasing;          /* its pages are being punched out */
	uint64_t guard;
	enum flow_role role;
	uid_t owner_uid;
	char origin_host[FLOW_HOST_MAX + 1];
	uint64_t ring_bytes;
	uint64_t until_ns;       /* the consumer's grace ends */
	char name[FLOW_NAME_MAX + 1];
	struct holder *holder;   /* its flow's: charged here till freed */
};

/* Is this flow (or remains) charged to the peer host or uid asked about?
 * A peer host is its address, not its identity: that holds the node name
 * the peer said, and a key holder saying another name each time would get
 * a fresh quota each time. */
static bool charged(enum flow_role role, uid_t owner, const char *host,
		    const struct flow_spec *s, uid_t uid)
{
	if (s->role == FLOW_RECEIVER)
		return role == FLOW_RECEIVER && !strcmp(host, s->origin_host);
	return role != FLOW_RECEIVER && owner == uid;
}

/* What a peer host (receiver specs) or a uid (others) holds now,
 * destroyed flows whose rings are not yet released included (dying
 * flows and remains), counted from scratch: where
 * there is no index of holders, and as a cross-check of it. */
static struct usage usage_of(const struct flow_table *t,
			     const struct flow_spec *s, uid_t uid)
{
	struct usage u = { 0 };

	for (const struct flow *f = t->head; f; f = f->next) {
		if (charged(f->role, f->owner_uid, f->origin_host, s, uid)) {
			u.flows++;
			u.bytes += f->ring_bytes;
		}
	}
	for (const struct flow *f = t->dying; f; f = f->dying_next) {
		if (charged(f->role, f->owner_uid, f->origin_host, s, uid)) {
			u.flows++;
			u.bytes += f->ring_bytes;
			u.gone++;
		}
	}
	for (const struct flow_remains *r = t->remains; r; r = r->next) {
		if (charged(r->role, r->owner_uid, r->origin_host, s, uid)) {
			u.flows++;
			u.bytes += r->ring_bytes;
			u.gone++;
		}
	}
	return u;
}

/* What the party asked about holds now: its holder's figures (O(1)), or
 * usage_of's walk without an index.  With FM_CROSS_CHECK the walk too,
 * which must agree: else some step listed or unlisted a flow, made or
 * freed a remains, or changed whom a flow is charged to, without
 * charge() or uncharge(). */
static struct usage usage_now(const struct flow_table *t,
			      const struct flow_spec *s, uid_t uid)
{
	const struct holder *h;
	struct usage u = { 0 }, w;

	if (!t->holders)
		return usage_of(t, s, uid);
	h = *holder_slot(t, charged_to(s->role, uid, s->origin_host));
	if (h)
		u = h->held;
	if (FM_CROSS_CHECK) {
		w = usage_of(t, s, uid);
		if (w.flows != u.flows || w.bytes != u.bytes ||
		    w.gone != u.gone) {
			log_error("quota figures kept (%u flows, %llu bytes, "
				  "%u gone) are not the walk's (%u, %llu, %u)",
				  u.flows, (unsigned long long)u.bytes, u.gone,
				  w.flows, (unsigned long long)w.bytes, w.gone);
			abort();
		}
	}
	return u;
}

/*
 * Per peer host (receiver flows: --peer-max-flows, --peer-max-ring-bytes)
 * or per non-root uid (--max-flows-per-uid, --max-ring-bytes-per-uid).
 */
static int check_quota(const struct flow_table *t, const struct flow_spec *s,
		       uid_t uid, uint64_t ring, char *err, size_t errlen)
{
	bool peer = s->role == FLOW_RECEIVER;
	unsigned max_flows = peer ? t->limits.peer_max_flows :
				    t->limits.uid_max_flows;
	uint64_t max_bytes = peer ? t->limits.peer_max_ring_bytes :
				    t->limits.uid_max_ring_bytes;
	char who[96], gone[64] = "";
	struct usage u;

	if (peer ? !s->origin_host : flows_is_operator(uid))
		return 0; /* a local call, or the operator: no quota */
	u = usage_now(t, s, uid);
	if (peer)
		snprintf(who, sizeof(who), "peer host %s", s->origin_host);
	else
		snprintf(who, sizeof(who), "uid %u", (unsigned)uid);
	if (u.gone) /* not in its list: say why it is charged for them */
		snprintf(gone, sizeof(gone), " (%u destroyed, their rings "
			 "not yet released)", u.gone);
	if (u.flows >= max_flows) {
		snprintf(err, errlen, "quota exceeded: %s has %u flows here%s, "
			 "the limit (%s) is %u", who, u.flows, gone,
			 peer ? "--peer-max-flows" : "--max-flows-per-uid",
			 max_flows);
		return -EDQUOT;
	}
	if (ring > max_bytes) { /* not now, not ever: for good */
		snprintf(err, errlen, "quota exceeded: a ring of %llu bytes "
			 "is above the limit (%s) of %llu for %s",
			 (unsigned long long)ring,
			 peer ? "--peer-max-ring-bytes" :
				"--max-ring-bytes-per-uid",
			 (unsigned long long)max_bytes, who);
		return -EFBIG;
	}
	if (u.bytes + ring > max_bytes || u.bytes + ring < ring) {
		snprintf(err, errlen, "quota exceeded: %s has rings of %llu "
			 "bytes here%s; %llu more would pass the limit (%s) of "
			 "%llu", who, (unsigned long long)u.bytes, gone,
			 (unsigned long long)ring,
			 peer ? "--peer-max-ring-bytes" :
				"--max-ring-bytes-per-uid",
			 (unsigned long long)max_bytes);
		return -EDQUOT;
	}
	return 0;
}

/* ---- how fast a party creates rings ------------------------------------- */

/*
 * Creating a ring allocates all of it (fallocate) and destroying it punches
 * it out again, both on the event loop: on tmpfs about 0.3 s and 0.14 s a
 * GiB, while no other flow moves and no client is answered.  The quotas
 * bound what a party holds, not how often it creates, so a user or a peer
 * looping create/destroy of 1 GiB rings stalled every flow of the host.
 * Each party (a non-root uid; a peer host, by its address) therefore has a
 * budget of ring bytes created a second: a token bucket, kept as the time
 * its debt is paid off (GCRA), so a party with a full bucket needs no
 * entry.  A ring's destroy is paid for by its create.
 */
struct rate_party {
	struct rate_party *next;
	bool peer;
	uid_t uid;
	char host[FLOW_HOST_MAX + 1]; /* a peer's: its address (origin_host) */
	uint64_t free_at_ns;     /* fr_now_ns: its bucket is full again */
};

/* The bucket: one ring of --max-ring-size always passes when it is full.
 * Never less than 1 GiB: a host with small rings stalls its loop for one
 * small ring at a time, and scripts that create many at once still pass. */
#define RATE_BURST_MIN (1ull << 30)

/*
 * What a create is charged at least: a ring's create and destroy cost the
 * loop a fixed part besides its pages (files, the state file, the log):
 * measured on the 2-vCPU test host, 0.45 ms of moverd's cpu for a 4 KiB
 * ring, 3.6 ms for 64 MiB.  Charged by its bytes alone, a user churning
 * 4 KiB rings would have had 16384 creates a second at the default rate,
 * 7 s of loop each second; at 1 MiB a create, 64 a second, 3 %.  The
 * bucket holds at least the party's flow quota at that charge, so that
 * filling the quota once (a peer allowed 10 000 flows opening them) is
 * never held back: only churning is.
 */
#define RATE_MIN_CHARGE (1ull << 20)

/* The time `bytes` take at `rate` a second; capped at ~30 years, so that
 * a rate of a few bytes and a huge --max-ring-size do not overflow. */
static uint64_t rate_ns(uint64_t bytes, uint64_t rate)
{
	double ns = (double)bytes / (double)rate * 1e9;

	return ns < 1e18 ? (uint64_t)ns : 1000000000000000000ull;
}

/* Forget the parties whose bucket is full again (all: now = UINT64_MAX). */
static void prune_rates(struct flow_table *t, uint64_t now)
{
	for (struct rate_party **pp = &t->rates, *r; (r = *pp);) {
		if (r->free_at_ns > now) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		free(r);
	}
}

/* The party that creates (a new entry, its bucket full); NULL: no memory. */
static struct rate_party *party_of(struct flow_table *t,
				   const struct flow_spec *s, uid_t uid)
{
	bool peer = s->role == FLOW_RECEIVER;
	struct rate_party *r;

	for (r = t->rates; r; r = r->next)
		if (r->peer == peer && (peer ? !strcmp(r->host, s->origin_host) :
					       r->uid == uid))
			return r;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->peer = peer;
	r->uid = uid;
	snprintf(r->host, sizeof(r->host), "%s", peer ? s->origin_host : "");
	r->next = t->rates;
	t->rates = r;
	return r;
}

/* Root, moverd's own user and the config's flows are the operator's; a
 * receiver without an origin is a local call (as check_quota). */
static bool rate_exempt(const struct flow_spec *s, uid_t uid)
{
	if (s->unmetered)
		return true;
	if (s->role == FLOW_RECEIVER)
		return !s->origin_host;
	return flows_is_operator(uid);
}

/* "64 MiB", "512 KiB", "1000 bytes": a rate as the operator wrote it. */
static void size_text(uint64_t v, char *out, size_t cap)
{
	if (v >= 1u << 20 && !(v & ((1u << 20) - 1)))
		snprintf(out, cap, "%llu MiB", (unsigned long long)(v >> 20));
	else if (v >= 1u << 10 && !(v & ((1u << 10) - 1)))
		snprintf(out, cap, "%llu KiB", (unsigned long long)(v >> 10));
	else
		snprintf(out, cap, "%llu bytes", (unsigned long long)v);
}

/*
 * --max-ring-rate-per-uid, --peer-max-ring-rate: may this party create a
 * ring of `ring` bytes now?  If so it is charged; else -EAGAIN, and err
 * says when the same create will pass (a peer's sender retries on its
 * own: "busy, retry", peer_open.c handle_opened).
 */
static int check_rate(struct flow_table *t, const struct flow_spec *s,
		      uid_t uid, uint64_t ring, char *err, size_t errlen)
{
	bool peer = s->role == FLOW_RECEIVER;
	uint64_t rate = peer ? t->limits.peer_ring_rate :
			       t->limits.uid_ring_rate;
	static struct log_limit lim; /* a user can ask at will */
	uint64_t burst = t->limits.max_ring_size, now, due, burst_ns, wait_ms;
	/* the flows it may hold, each at the least a create is charged:
	 * a party may always fill its quota once (10 000 flows of a peer
	 * --peer-max-flows allows), and is held to the rate when it churns */
	uint64_t quota_flows = peer ? t->limits.peer_max_flows :
				      t->limits.uid_max_flows;
	struct rate_party *r;
	char who[160], per[32];

	if (!rate || rate_exempt(s, uid))
		return 0;
	now = fr_now_ns();
	prune_rates(t, now);
	r = party_of(t, s, uid);
	if (!r) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (burst < RATE_BURST_MIN)
		burst = RATE_BURST_MIN;
	if (burst < quota_flows * RATE_MIN_CHARGE)
		burst = quota_flows * RATE_MIN_CHARGE;
	burst_ns = rate_ns(burst, rate);
	if (ring < RATE_MIN_CHARGE)
		ring = RATE_MIN_CHARGE;
	due = (r->free_at_ns > now ? r->free_at_ns : now) + rate_ns(ring, rate);
	if (due - now <= burst_ns) {
		r->free_at_ns = due;
		return 0;
	}
	if (peer)
		snprintf(who, sizeof(who), "peer host %s", s->origin_host);
	else
		snprintf(who, sizeof(who), "uid %u", (unsigned)uid);
	wait_ms = (due - now - burst_ns + 999999) / 1000000;
	if (s->retry_ms)
		*s->retry_ms = wait_ms < UINT32_MAX ? (uint32_t)wait_ms :
						      UINT32_MAX;
	size_text(rate, per, sizeof(per));
	snprintf(err, errlen, "creating rings too fast: %s may create %s of "
		 "rings a second here (%s); try again in %llu ms", who, per,
		 peer ? "--peer-max-ring-rate" : "--max-ring-rate-per-uid",
		 (unsigned long long)wait_ms);
	if (!peer) /* (a peer's refusals are logged by handle_open) */
		log_limited(&lim, LOG_LVL_WARN, "flow %s: %s", s->name, err);
	return -EAGAIN;
}

int flows_charge_edit(struct flow_table *t, const char *name, uid_t uid,
		      char *err, size_t errlen)
{
	const struct flow_spec s = { .name = name, .role = FLOW_SENDER };
	char why[384]; /* check_rate's sentence whole (at most 309 bytes) */
	int rc = check_rate(t, &s, uid, 0, why, sizeof(why));

	if (rc)
		snprintf(err, errlen, "%s (a peer add or remove counts as a "
			 "ring of 1 MiB)", why);
	return rc;
}

static bool ids_valid(const uint32_t *ids, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == UINT32_MAX) /* (uid_t)-1: "no change" to the kernel */
			return false;
	return true;
}

/*
 * A ring file may not leave the state directory's filesystem (tmpfs by
 * default: memory) with less than --state-dir-reserve percent free.
 */
static int check_state_dir(const struct flow_table *t, uint64_t ring,
			   char *err, size_t errlen)
{
	uint64_t need = fr_map_bytes(ring), total, avail, keep, pending;
	struct statvfs sv;

	if (statvfs(t->state_dir, &sv)) {
		snprintf(err, errlen, "state directory %s: %s", t->state_dir,
			 strerror(errno));
		return -errno;
	}
	total = (uint64_t)sv.f_blocks * sv.f_frsize;
	avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	/* rings being filled take the rest of their room yet, and rings
	 * being punched out give theirs back (release_remains) */
	avail += t->punch_pending;
	pending = t->fill_pending - fill_allocating(t);
	avail = avail > pending ? avail - pending : 0;
	keep = total / 100 * t->limits.state_dir_reserve;
	if (avail >= need && avail - need >= keep)
		return 0;
	if (need > total - keep) { /* not now, not ever: for good */
		snprintf(err, errlen, "a ring of %llu bytes is larger than "
			 "the state directory %s can ever hold (%llu bytes, "
			 "%u%% kept free: --state-dir-reserve)",
			 (unsigned long long)need, t->state_dir,
			 (unsigned long long)total,
			 t->limits.state_dir_reserve);
		return -EFBIG;
	}
	snprintf(err, errlen, "no room: a ring of %llu bytes would leave the "
		 "state directory %s with less than %u%% free "
		 "(--state-dir-reserve; %llu of %llu bytes free)",
		 (unsigned long long)need, t->state_dir,
		 t->limits.state_dir_reserve, (unsigned long long)avail,
		 (unsigned long long)total);
	return -ENOSPC;
}

int flows_check_spec(const struct flow_table *t, const struct flow_spec *s,
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
	if (s->name[0] == '-') {
		/* a peer could name one "--all": an operator's script that
		 * runs `moverctl flow destroy $name` would take it for an
		 * option.  Flows made before this rule are still adopted. */
		snprintf(err, errlen, "invalid flow name '%.80s': it may not "
			 "start with '-'", s->name);
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
	if (s->start % FR_ALIGN || s->start > FR_START_MAX) {
		/* a peer's word: past 2^63 its positions could reach 2^64,
		 * where they wrap and every comparison of them lies */
		snprintf(err, errlen, "invalid start position %llu: a "
			 "multiple of %u, at most 2^63",
			 (unsigned long long)s->start, FR_ALIGN);
		return -EINVAL;
	}
	if ((s->peer || s->origin) && !fits_one_frame(p->max_record)) {
		snprintf(err, errlen, "max record %u is too large for a flow "
			 "between hosts: at most %u bytes (one DATA frame, one "
			 "RDMA write)", p->max_record,
			 WIRE_SPAN_MAX - FR_REC_HDR);
		return -EINVAL;
	}
	if (s->peer && !meta_value_ok(s->peer)) {
		/* kept in the state file, one "key=value" a line */
		snprintf(err, errlen, "peer address has a control character, "
			 "a byte outside ASCII or an '=': use HOST:PORT");
		return -EINVAL;
	}
	if (s->origin && (!meta_value_ok(s->origin) ||
			  strlen(s->origin) > FLOW_ORIGIN_MAX)) {
		/* kept in the state file too */
		snprintf(err, errlen, "the peer's identity cannot be kept "
			 "(a control character, a byte outside ASCII or an "
			 "'=', or longer than %d)", FLOW_ORIGIN_MAX);
		return -EINVAL;
	}
	if (s->origin_host && (!meta_value_ok(s->origin_host) ||
			       strlen(s->origin_host) > FLOW_HOST_MAX)) {
		snprintf(err, errlen, "the peer's address cannot be kept");
		return -EINVAL;
	}
	for (size_t i = 0; i < s->n_more_peers; i++) {
		if (meta_value_ok(s->more_peers[i]))
			continue;
		snprintf(err, errlen, "peer address '%.80s' has a control "
			 "character, a byte outside ASCII or an '=': use "
			 "HOST:PORT", s->more_peers[i]);
		return -EINVAL;
	}
	if (s->n_allow_uids > FLOW_ALLOW_MAX || s->n_allow_gids > FLOW_ALLOW_MAX) {
		snprintf(err, errlen, "at most %d allowed uids and gids",
			 FLOW_ALLOW_MAX);
		return -EINVAL;
	}
	if (!ids_valid(s->allow_uids, s->n_allow_uids) ||
	    !ids_valid(s->allow_gids, s->n_allow_gids)) {
		snprintf(err, errlen, "uid and gid 4294967295 (-1) are not ids");
		return -EINVAL;
	}
	return 0;
}

/* flows_check_spec, then what depends on the table now: the name free,
 * room for one more flow (destroyed ones I/O still holds included), the
 * uid's quota. */
static int check_spec(const struct flow_table *t, const struct flow_spec *s,
		      uid_t uid, struct flowshm_ring_params *p, char *err,
		      size_t errlen)
{
	int rc = flows_check_spec(t, s, p, err, errlen);

	if (rc)
		return rc;
	if (flows_find((struct flow_table *)t, s->name)) {
		snprintf(err, errlen, "flow '%s' already exists", s->name);
		return -EEXIST;
	}
	/* a destroyed flow that I/O in flight still refers to counts: it
	 * holds its ring's fd as a listed flow does.  (Remains do not: a
	 * ring waiting for its consumer to drain holds no fd, and one being
	 * punched out holds it only till the punch is done.) */
	if (t->count + t->n_dying >= t->limits.max_flows) {
		if (t->n_dying)
			snprintf(err, errlen, "too many flows (limit %u: "
				 "--max-flows; %u destroyed, held by I/O in "
				 "flight)", t->limits.max_flows, t->n_dying);
		else
			snprintf(err, errlen, "too many flows (limit %u: "
				 "--max-flows)", t->limits.max_flows);
		return -ENOSPC;
	}
	return check_quota(t, s, uid, p->ring_size, err, errlen);
}

/*
 * A flow of this name has a state file that this start did not re-adopt
 * (adopt_one logged why: a ring above --max-ring-size, no memory or fds at
 * the time...): its ring still holds what was accepted into it.  A create
 * of the name would unlink that ring: refused, -EAGAIN (a sender asks
 * again, retry_ms), until a restart adopts it or an operator removes it.
 */
static int not_adopted(const struct flow_table *t,
		       const struct flow_spec *spec, char *err, size_t errlen)
{
	char file[FILE_NAME_MAX];

	file_name(spec->name, "flow", file, sizeof(file));
	if (faccessat(t->state_fd, file, F_OK, AT_SYMLINK_NOFOLLOW))
		return 0;
	snprintf(err, errlen, "flow '%s' has files in %s that this start of "
		 "moverd did not re-adopt (its log says why, unless another "
		 "moverd uses that directory too): restart moverd once that "
		 "is mended, or remove %s/%s.* to start the flow anew",
		 spec->name, t->state_dir, t->state_dir, spec->name);
	if (spec->retry_ms)
		*spec->retry_ms = NOT_ADOPTED_RETRY_MS;
	return -EAGAIN;
}

int flows_create(struct flow_table *t, const struct flow_spec *spec,
		 uid_t uid, gid_t gid, struct flow **out, char *err,
		 size_t errlen)
{
	struct flowshm_ring_params p;
	char file[FILE_NAME_MAX];
	struct flow *f;
	int rc = check_spec(t, spec, uid, &p, err, errlen);

	if (rc)
		return rc;
	f = flows_alloc();
	if (!f) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	f->refs = 1; /* the table's */
	f->table = t;
	f->role = spec->role;
	f->transport = spec->role == FLOW_LOCAL ? "local" : "tcp";
	f->id = spec->role == FLOW_SENDER ? flows_new_id(t) : 0;
	snprintf(f->peer_addr, sizeof(f->peer_addr), "%s",
		 spec->peer ? spec->peer : "");
	if (spec->role == FLOW_RECEIVER)
		p.flags |= FLOWSHM_RING_DEPOSIT;
	if (fill_later(t, p.ring_size))
		p.flags |= FLOWSHM_RING_LAZY; /* fill_start allocates it */
	/* every flow is a file (local ones too, issue 15), so that a
	 * restarted moverd re-adopts it; a stale one goes first, anything
	 * else there fails O_EXCL */
	rc = t->state_fd >= 0 ? not_adopted(t, spec, err, errlen) : 0;
	if (!rc)
		rc = check_state_dir(t, p.ring_size, err, errlen);
	if (!rc) /* last: a create refused for another reason costs nothing */
		rc = check_rate(t, spec, uid, p.ring_size, err, errlen);
	if (rc) {
		free(f);
		return rc;
	}
	flow_file(t, spec->name, "ring", f->path, sizeof(f->path));
	file_name(spec->name, "ring", file, sizeof(file));
	unlinkat(t->state_fd, file, 0); /* no state file: never a flow */
	rc = flowshm_ring_create_at(&p, t->state_fd, file, spec->seal_key,
				    spec->start, &f->ring_fd);
	if (!rc)
		rc = flows_open_view(f->ring_fd, f->path[0], &f->view,
				     &f->guard);
	if (!rc) {
		/* the ring is not handed to anyone yet; before our slot's
		 * take reads it */
		f->max_lag = spec->max_lag;
		flows_pin_lag(f);
	}
	if (!rc && spec->role == FLOW_SENDER && (rc = take_sender_slot(f))) {
		flowshm_close(f->view);
		ring_guard_remove(f->guard);
		f->view = NULL;
	}
	if (rc) {
		snprintf(err, errlen, "cannot create the ring: %s",
			 flowshm_strerror(rc));
		if (f->ring_fd > 0) {
			close(f->ring_fd);
			/* ours: made above (no state file names it) */
			unlinkat(t->state_fd, file, 0);
		}
		free(f);
		return rc;
	}
	snprintf(f->name, sizeof(f->name), "%s", spec->name);
	snprintf(f->origin, sizeof(f->origin), "%s",
		 spec->origin ? spec->origin : "");
	snprintf(f->origin_host, sizeof(f->origin_host), "%s",
		 spec->origin_host ? spec->origin_host : "");
	f->ring_bytes = p.ring_size;
	f->owner_uid = uid;
	f->owner_gid = gid;
	f->allowed.n_uids = (unsigned)spec->n_allow_uids;
	f->allowed.n_gids = (unsigned)spec->n_allow_gids;
	for (unsigned i = 0; i < f->allowed.n_uids; i++)
		f->allowed.uids[i] = spec->allow_uids[i];
	for (unsigned i = 0; i < f->allowed.n_gids; i++)
		f->allowed.gids[i] = spec->allow_gids[i];
	f->grants_kept = spec->grants_kept;
	f->created_unix_ms = flows_unix_ms();
	f->sent = f->acked = f->remote_head = f->reported_head = spec->start;
	f->wire_max = spec->start;
	f->rx_pos_known = true;
	f->state = spec->role == FLOW_SENDER ? FLOW_CONNECTING : FLOW_OPEN;
	if ((rc = hold(t, f)))
		snprintf(err, errlen, "out of memory");
	else if (f->path[0] && (rc = write_meta(t, f)))
		snprintf(err, errlen, "cannot write the flow's state file in "
			 "%s: %s", t->state_dir, strerror(-rc));
	if (rc) {
		holder_put(t, f->holder);
		flowshm_close(f->view);
		ring_guard_remove(f->guard);
		close(f->ring_fd);
		remove_files(t, spec->name);
		free(f);
		return rc;
	}
	link_flow(t, f);
	log_info("flow %s created by uid %u: ring %llu bytes, max record %u",
		 f->name, (unsigned)uid, (unsigned long long)p.ring_size,
		 p.max_record);
	if (p.flags & FLOWSHM_RING_LAZY)
		fill_start(t, f);
	*out = f;
	flows_status(f);
	if (t->added)
		t->added(t->added_arg, f);
	return 0;
}

static void release_pages(struct flow_table *t, struct flow *f);
static void dying_unlink(struct flow_table *t, struct flow *f);

/* A flow let go at an orderly stop: its ring and files stay as they are
 * for the next moverd, and for the clients that keep it mapped; so does
 * our subscriber slot of a sender's ring, as at a crash (the next start
 * gives it back: flowshm_close_held). */
static void unmap_kept(struct flow *f)
{
	flowshm_close_held(f->view); /* writes our slot: still guarded */
	ring_guard_remove(f->guard); /* after the last touch of the mapping */
	if (f->ring_fd >= 0)
		close(f->ring_fd);
	f->view = NULL;
	f->ring_fd = -1;
}

/*
 * A sibling (fan-out) goes: its mapping of the shared ring, and with it
 * its subscriber slot (flowshm_close gives it back: producers waiting on
 * it are released; one let go at an orderly stop keeps it, as unmap_kept
 * does), then its reference on the first flow, which owns the ring.  Only
 * now, after the sends that read the ring through it.
 */
static void release_sibling(struct flow *s)
{
	struct flow *first = s->sibling_of;

	if (s->kept)
		flowshm_close_held(s->view);
	else
		flowshm_close(s->view);
	ring_guard_remove(s->guard); /* after the last touch of the mapping */
	free(s);
	flow_put(first);
}

void flow_put(struct flow *f)
{
	if (--f->refs)
		return;
	if (f->sibling_of) {
		release_sibling(f);
		return;
	}
	free(f->fanout_saved);
	free(f->cut_saved);
	free(f->failure);
	if (f->save_owed)
		f->table->n_owed--;
	dying_unlink(f->table, f); /* before its remains take the charge */
	/* no I/O refers to the ring any more: its pages go (now, or once
	 * its consumer drained it: release_pages), unless it is kept */
	if (f->kept)
		unmap_kept(f);
	else
		release_pages(f->table, f);
	holder_put(f->table, f->holder); /* unless its remains took it */
	free(f);
}

/* f's state file written whole: whatever change it was owed is in it now */
int flows_save(struct flow *f)
{
	int rc;

	/* a destroyed flow's files are gone: none is made again; a fan-out
	 * subscription has no file of its own */
	if (f->dead || !f->path[0])
		return 0;
	rc = write_meta(f->table, f);
	if (!rc && f->save_owed) {
		f->save_owed = false;
		f->owed_what = NULL;
		f->table->n_owed--;
		log_info("flow %s: its state file is written now", f->name);
	}
	return rc;
}

int flows_save_owed(struct flow *f, const char *what)
{
	int rc = flows_save(f);

	if (!rc || f->owed_what == what)
		return rc; /* written, or owed for this and logged already */
	if (!f->save_owed) {
		f->save_owed = true;
		f->table->n_owed++;
	}
	f->owed_what = what; /* each change a save missed is said once */
	log_warn("flow %s: %s is not written to its state file (%s); trying "
		 "again each second: a restart before then reads the file as "
		 "it was", f->name, what, strerror(-rc));
	return rc;
}

/* f failed: its clients get -EPROTO, nothing more is filled */
static void fail_one(struct flow *f, const char *reason)
{
	f->sub_dropped = false;
	flows_set_state(f, FLOW_FAILED, reason); /* logged as a warning */
	fr_fail(&f->view->ring);
	fill_stop(f);
}

void flows_fail(struct flow *f, const char *reason)
{
	/* the ring's owner: a fan-out subscription reads its first flow's */
	struct flow *first = flow_first(f);

	/* failed already, unless only its subscription was cut: the ring
	 * fails now, and the flow is failed as a whole (no rejoin) */
	if (f->state == FLOW_FAILED && !f->sub_dropped)
		return;
	fail_one(f, reason);
	/* the first verdict on the ring, kept by the flow that has the
	 * state file: a failure found again (ring_marked_failed) keeps it,
	 * so a reason is never prefixed twice */
	if (!first->failure) {
		if (!(first->failure = strdup(reason)))
			log_warn("flow %s: no memory to keep why it failed: a "
				 "restart says a client marked its ring failed",
				 first->name);
		/* the ring's subscriptions cut meanwhile fail with it: else
		 * a cut first flow showed the flow open until its rejoin, or
		 * for good if it was not to rejoin */
		for (struct flow *s = first; s; s = flow_next_sub(first, s))
			if (s != f && s->sub_dropped && s->view && !s->dead)
				fail_one(s, reason);
	}
	flows_save_owed(first, "its failure");
}

bool flows_verdict(const struct flow *f, char *why, size_t cap)
{
	const struct flow *first = flow_first(f); /* holds the verdict */

	if (!first->failure)
		return false;
	snprintf(why, cap, "%s%s", first->failure_restored ?
		 "failed before moverd restarted: " : "", first->failure);
	return true;
}

void flows_retry_saves(struct flow_table *t, uint64_t now)
{
	if (!t->n_owed || now < t->save_retry_ns)
		return;
	t->save_retry_ns = now + 1000000000ull;
	for (struct flow *f = t->head; f; f = f->next)
		if (f->save_owed)
			flows_save(f);
}

static void unlist(struct flow_table *t, struct flow *f);

void flows_destroy(struct flow_table *t, struct flow *f)
{
	unlist(t, f);
	f->dead = true;
	fill_stop(f);
	flows_status(f); /* closed */
	flowshm_shutdown(f->view);
	if (f->path[0])
		remove_files(t, f->name);
	log_info("flow %s destroyed%s", f->name,
		 f->refs > 1 ? " (its ring is released once the I/O in flight "
			       "on it completes)" : "");
	flow_put(f);
}

static void unlist_exposed(struct flow_table *t, struct flow *f)
{
	for (struct flow **pp = &t->exposed; *pp; pp = &(*pp)->exp_next) {
		if (*pp == f) {
			*pp = f->exp_next;
			t->n_exposed--;
			if (t->exp_cursor == f)
				t->exp_cursor = f->exp_next;
			return;
		}
	}
}

/*
 * An unlisted flow stays in t->dying, and charged to its party, until its
 * last reference is put: until then its ring is held (a send in flight to
 * a peer that stopped reading can hold it for as long as the link takes
 * to fail), and a party that destroyed and created again in that time
 * would hold more than its quota.
 */
static void dying_link(struct flow_table *t, struct flow *f)
{
	f->dying_prev = NULL;
	f->dying_next = t->dying;
	if (t->dying)
		t->dying->dying_prev = f;
	t->dying = f;
	t->n_dying++;
	f->dying = true;
	uncharge(f->holder, f->ring_bytes, false);
	charge(f->holder, f->ring_bytes, true);
	gone_count(t, f->ring_bytes, true);
}

static void dying_unlink(struct flow_table *t, struct flow *f)
{
	if (!f->dying)
		return;
	if (f->dying_prev)
		f->dying_prev->dying_next = f->dying_next;
	else
		t->dying = f->dying_next;
	if (f->dying_next)
		f->dying_next->dying_prev = f->dying_prev;
	t->n_dying--;
	f->dying = false;
	uncharge(f->holder, f->ring_bytes, true);
	gone_count(t, f->ring_bytes, false);
}

static void unlist(struct flow_table *t, struct flow *f)
{
	if (!f->listed)
		return;
	if (f->exposed)
		unlist_exposed(t, f);
	if (f->prev)
		f->prev->next = f->next;
	else
		t->head = f->next;
	if (f->next)
		f->next->prev = f->prev;
	for (struct flow **pp = t->names ? name_bucket(t, f->name) : NULL;
	     pp && *pp; pp = &(*pp)->name_next) {
		if (*pp == f) {
			*pp = f->name_next;
			break;
		}
	}
	f->listed = false;
	t->count--;
	if (t->cursor == f)
		t->cursor = f->next;
	dying_link(t, f);
}

void flows_last_save(struct flow *f)
{
	if (f->save_owed && flows_save(f))
		log_warn("flow %s: its state file is still not written: the "
			 "next start reads it as it was", f->name);
}

void flows_let_go(struct flow_table *t, struct flow *f)
{
	unlist(t, f);
	f->dead = true; /* completions still in flight publish nothing */
	f->kept = true;
	fill_stop(f);
	log_debug("flow %s: kept for the next start", f->name);
	flow_put(f);
}

/* ---- the memory of destroyed flows ----------------------------------------- */

/*
 * Free the data area's pages, mapped or not (the control page stays, so
 * that clients still see the ring closed).  Memfd rings are sealed against
 * growing and shrinking only, which allows this; a client that writes its
 * stale mapping afterwards faults in pages charged to its own cgroup.
 * On tmpfs this costs about 0.14 s a GiB: with a loop it runs in
 * io_uring's workers, PUNCH_CHUNK at a time (release_remains), and the
 * remains (mapping, fd, and what the quotas charge) stay until it is done.
 */
#define PUNCH_CHUNK (64ull << 20) /* a stop waits for one */

/* Punch [off, off + len) of the data area out, on the spot; 0 or -errno. */
static int punch_range(int fd, flowshm_t *view, uint64_t off, uint64_t len)
{
	int rc = 0;

	if (fd >= 0)
		rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
			       (off_t)(FR_CTRL_BYTES + off), (off_t)len);
	else if (view) /* the same, through moverd's shared mapping */
		rc = madvise((char *)view->ring.sh + FR_CTRL_BYTES + off, len,
			     MADV_REMOVE);
	return rc ? -errno : 0;
}

static void punch_warn(const char *name, int rc)
{
	log_warn("flow %s: cannot release the ring's pages: %s", name,
		 strerror(-rc));
}

static void release_now(int fd, flowshm_t *view, uint64_t guard,
			uint64_t ring_bytes, const char *name)
{
	int rc = punch_range(fd, view, 0, ring_bytes);

	if (rc)
		punch_warn(name, rc);
	flowshm_close(view); /* writes our slot: still guarded */
	ring_guard_remove(guard); /* after the last touch of the mapping */
	if (fd >= 0)
		close(fd);
}

/* r's pages are out, or cannot be: its mapping and fd go, then r. */
static void remains_free(struct flow_table *t, struct flow_remains *r)
{
	for (struct flow_remains **pp = &t->remains; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			break;
		}
	}
	flowshm_close(r->view); /* writes our slot: still guarded */
	ring_guard_remove(r->guard); /* after the last touch of the mapping */
	if (r->fd >= 0)
		close(r->fd);
	uncharge(r->holder, r->ring_bytes, true);
	gone_count(t, r->ring_bytes, false);
	holder_put(t, r->holder);
	free(r);
}

static uint64_t punch_chunk(const struct flow_remains *r)
{
	uint64_t left = r->ring_bytes - r->punched;

	return left < PUNCH_CHUNK ? left : PUNCH_CHUNK;
}

static void punch_done(struct loop_op *op, int res);

/* The punch got n bytes further: as much less of r's is pending (where
 * in the ring its pages are, the punch does not know: a guess that errs
 * as little as one chunk, for as long as one chunk takes). */
static void punch_freed(struct flow_table *t, struct flow_remains *r,
			uint64_t n)
{
	n = n < r->frees ? n : r->frees;
	r->frees -= n;
	t->punch_pending -= n;
}

/* Submit r's next chunk; false: nothing (more) to punch, or no loop or
 * SQE. */
static bool punch_next(struct flow_table *t, struct flow_remains *r)
{
	uint64_t off = FR_CTRL_BYTES + r->punched, len = punch_chunk(r);
	struct io_uring_sqe *sqe;

	if (!len || !t->loop || !(sqe = loop_sqe(t->loop, &r->op, punch_done)))
		return false;
	if (r->fd >= 0)
		io_uring_prep_fallocate(sqe, r->fd, FALLOC_FL_PUNCH_HOLE |
					FALLOC_FL_KEEP_SIZE, (off_t)off,
					(off_t)len);
	else
		io_uring_prep_madvise(sqe, (char *)r->view->ring.sh + off,
				      (off_t)len, MADV_REMOVE);
	return true;
}

/* Punch what is left of r on the spot, and free it. */
static void punch_rest_now(struct flow_table *t, struct flow_remains *r)
{
	int rc = 0;

	if (r->punched < r->ring_bytes)
		rc = punch_range(r->fd, r->view, r->punched,
				 r->ring_bytes - r->punched);
	if (rc)
		punch_warn(r->name, rc);
	remains_free(t, r);
}

static void punch_done(struct loop_op *op, int res)
{
	struct flow_remains *r = (struct flow_remains *)
		((char *)op - offsetof(struct flow_remains, op));
	struct flow_table *t = r->table;
	uint64_t before = r->punched;

	if (res < 0) {
		punch_warn(r->name, res);
		r->punched = r->ring_bytes; /* what is left stays till the
					     * last mapping goes */
	} else {
		r->punched += punch_chunk(r);
	}
	punch_freed(t, r, r->punched - before);
	if (punch_next(t, r))
		return;
	punch_freed(t, r, r->frees);
	t->n_async--;
	punch_rest_now(t, r);
}

/* Give r's pages back: off the loop where there is one (what they hold
 * counts as free meanwhile: punch_pending), but a ring of FILL_NOW_MAX or
 * less on the spot, as its fill was: its punch's round trip through
 * io_uring's workers costs more than the punch, and until it came back
 * the ring counted against its owner's quotas (a user that created and
 * destroyed 4 KiB rings in a loop met --max-flows-per-uid after 491 of
 * them on a loaded host, 64 destroyed rings waiting for their punches) */
static void release_remains(struct flow_table *t, struct flow_remains *r)
{
	r->releasing = true;
	if (fr_map_bytes(r->ring_bytes) > FILL_NOW_MAX && punch_next(t, r)) {
		t->punch_pending += r->frees;
		t->n_async++;
		return;
	}
	punch_rest_now(t, r);
}

bool flows_unread(flowshm_t *view)
{
	struct flowshm_info in;

	if (!view || flowshm_info(view, &in))
		return false;
	return fr_min_pos(&view->ring) < in.tail;
}

/* Has a consumer records left to read?  (Its position is its own word: a
 * lying consumer gains a grace period, charged to the flow's owner.) */
static bool undrained(const struct flow *f)
{
	return f->consumers && flows_unread(f->view);
}

/*
 * Give back the memory of a flow no I/O refers to any more, even where
 * clients keep it mapped: shut the ring (clients see -EPIPE) and punch out
 * its data area, now if its consumer has nothing left to read, else once
 * it has drained or after DRAIN_GRACE_NS (flows_reap_remains).  Takes
 * moverd's mapping and fd from f (f->view = NULL, f->ring_fd = -1) into
 * its remains, which hold them until the punch is done.
 */
static void release_pages(struct flow_table *t, struct flow *f)
{
	struct flow_remains *r = NULL;
	bool wait;

	if (f->view)
		flowshm_shutdown(f->view); /* clients see -EPIPE */
	wait = undrained(f);
	if (!f->view || !(r = calloc(1, sizeof(*r)))) {
		release_now(f->ring_fd, f->view, f->guard, f->ring_bytes,
			    f->name);
		goto taken;
	}
	*r = (struct flow_remains){
		.next = t->remains, .table = t, .view = f->view,
		.fd = f->ring_fd, .guard = f->guard, .role = f->role,
		.owner_uid = f->owner_uid, .ring_bytes = f->ring_bytes,
		.until_ns = wait ? fr_now_ns() + DRAIN_GRACE_NS : 0,
		.frees = allocated_bytes(f),
		.holder = f->holder, /* the flow's: no allocation can fail */
	};
	f->holder = NULL;
	charge(r->holder, r->ring_bytes, true);
	gone_count(t, r->ring_bytes, true);
	if (wait) { /* only the mapping waits: the fd goes now (madvise) */
		close(f->ring_fd);
		r->fd = -1;
	}
	snprintf(r->origin_host, sizeof(r->origin_host), "%s",
		 f->origin_host);
	snprintf(r->name, sizeof(r->name), "%s", f->name);
	t->remains = r;
	if (!wait)
		release_remains(t, r);
taken:
	f->view = NULL;
	f->ring_fd = -1;
	f->guard = 0;
}

/* With FM_CROSS_CHECK: do the table's figures of destroyed rings still
 * held agree with its lists? */
static void check_gone(const struct flow_table *t)
{
	unsigned n = 0, dying;
	uint64_t bytes = 0;

	for (const struct flow *f = t->dying; f; f = f->dying_next, n++)
		bytes += f->ring_bytes;
	dying = n;
	for (const struct flow_remains *r = t->remains; r; r = r->next, n++)
		bytes += r->ring_bytes;
	if (n != t->n_gone || bytes != t->gone_bytes ||
	    dying != t->n_dying) {
		log_error("destroyed rings counted (%u, %llu bytes; %u dying "
			  "flows) are not the lists' (%u, %llu; %u)",
			  t->n_gone, (unsigned long long)t->gone_bytes,
			  t->n_dying, n, (unsigned long long)bytes, dying);
		abort();
	}
}

void flows_reap_remains(struct flow_table *t, uint64_t now)
{
	if (FM_CROSS_CHECK)
		check_gone(t);
	for (struct flow_remains *r = t->remains, *next; r; r = next) {
		next = r->next; /* release_remains may free r, not next */
		if (r->releasing)
			continue;
		if (now < r->until_ns && flows_unread(r->view))
			continue;
		log_debug("flow %s: ring released (%s)", r->name,
			  now < r->until_ns ? "drained" : "grace over");
		release_remains(t, r);
	}
	prune_rates(t, now);
}

/* ---- ring files that a client resized -------------------------------------- */

/*
 * moverd's view of a ring file faulted and ring_guard put zero pages in
 * its place: once the file has its size again, map the file back there,
 * so that the verdict that follows (fr_fail: FAILED in the control page,
 * the futex wakes) reaches the clients, which map the file, instead of
 * moverd's private zeros.  The range stays guarded: a client that shrinks
 * the file again only trips the guard again.
 */
static void remap_view(struct flow *f, flowshm_t *view, int fd)
{
	struct fr_ring *r = &view->ring;

	if (mmap(r->sh, r->map_bytes, PROT_READ | PROT_WRITE,
		 MAP_FIXED | MAP_SHARED, fd, 0) == MAP_FAILED)
		log_warn("flow %s: cannot map the repaired ring file again "
			 "(its clients will not see it failed): %s", f->name,
			 strerror(errno));
}

/* Did moverd's view of f's ring fault, or the view a fan-out sibling has
 * of it (map_sibling: its own mapping, its own guard)?  Each is asked,
 * and those that faulted are marked for remap_view. */
static bool views_tripped(struct flow *f)
{
	bool tripped = ring_guard_tripped(f->guard);

	f->view_tripped = tripped;
	for (struct flow *s = f->fanout; s; s = s->fanout_next) {
		s->view_tripped = ring_guard_tripped(s->guard);
		tripped |= s->view_tripped;
	}
	return tripped;
}

static void remap_tripped(struct flow *f)
{
	if (f->view_tripped && f->view)
		remap_view(f, f->view, f->ring_fd);
	for (struct flow *s = f->fanout; s; s = s->fanout_next)
		if (s->view_tripped && s->view)
			remap_view(f, s->view, f->ring_fd);
}

/* moverd's view of f's ring faulted, its file at its size: a page the
 * filesystem could not allocate (a lazy ring's fill behind a deposit, on
 * a full tmpfs), or a client that cut the file and grew it back.  Before,
 * the first was blamed on a client too. */
void flows_fault_why(const struct flow *f, const char *what, char *why,
		     size_t cap)
{
	struct statvfs sv;

	/* short: a flow's reason holds 160 bytes, the directory's name
	 * among them */
	if (!f->table || statvfs(f->table->state_dir, &sv)) {
		snprintf(why, cap, "%s, file at its size: a page could not be "
			 "allocated, or a client cut it", what);
		return;
	}
	snprintf(why, cap, "%s, file at its size: a page could not be "
		 "allocated (%llu bytes free in %s), or a client cut it", what,
		 (unsigned long long)sv.f_bavail * sv.f_frsize,
		 f->table->state_dir);
}

/*
 * A client that grew its ring file (fallocate, by as much as the
 * filesystem has free) has the blocks beyond the ring freed off the loop:
 * on tmpfs that costs about 0.14 s a GiB, for which the ftruncate that
 * repaired the file stalled the loop (every flow, every client), and the
 * client could grow it again each second.  io_uring's workers punch them
 * out (IORING_OP_FALLOCATE, PUNCH_HOLE), TRIM_CHUNK at a time from the
 * ring's end: a chunk holds the file's inode lock, which the loop's
 * unlink at a destroy waits for, as a fill's chunk does.  One chunk of a
 * file is in flight at a time, and the punch holds a reference to the
 * flow (so its fd stays open) until the last is reaped; then the file is
 * cut back to its size on the loop, with nothing left to free.  Blocks
 * the client allocated meanwhile behind the punch are punched in another
 * pass (TRIM_PASSES at most).  A flow destroyed meanwhile is punched on:
 * else its unlinked file's blocks went at its last close, which may be
 * moverd's, on the loop.  A flow let go at a stop, or a punch that cannot
 * go on (no loop, no SQE, an error), is repaired on the spot, as before.
 * So is a shrunk file, and one grown sparse (repair): growing it back, or
 * cutting off what holds no blocks, is cheap.
 */
#define TRIM_CHUNK FILL_CHUNK
#define TRIM_SPAN_MAX (1ull << 40) /* punched beyond the ring at most */
#define TRIM_PASSES 4

static void trim_done(struct loop_op *op, int res);

/* What a disk filesystem's own metadata may add to a file of n bytes. */
static uint64_t blocks_slack(uint64_t n)
{
	return n / 64 + 65536;
}

/* Has the file more blocks than a ring of want bytes holds? */
static bool blocks_beyond(const struct stat *st, uint64_t want)
{
	return (uint64_t)st->st_blocks * 512 > want + blocks_slack(want);
}

/*
 * How far beyond the ring's want bytes a file as st tells has blocks to
 * punch, rounded up to a chunk (0: none): up to its size, and as many
 * bytes further as it has blocks if they do not all fit in its size (a
 * fallocate with KEEP_SIZE, which puts them past it).  TRIM_SPAN_MAX at
 * most: the size is the client's word.
 */
static uint64_t trim_span(const struct stat *st, uint64_t want)
{
	uint64_t size = (uint64_t)st->st_size;
	uint64_t got = (uint64_t)st->st_blocks * 512;
	uint64_t span = size > want ? size - want : 0;

	if (got > size + blocks_slack(size))
		span += got;
	if (span > TRIM_SPAN_MAX)
		span = TRIM_SPAN_MAX;
	return (span + TRIM_CHUNK - 1) / TRIM_CHUNK * TRIM_CHUNK;
}

static void repair_warn(const struct flow *f, int err)
{
	log_warn("flow %s: cannot repair the ring file: %s", f->name,
		 strerror(err));
}

/* The whole repair on the spot: back to its size (a shrunk file regains
 * zero pages), nothing allocated beyond it.  0 or -errno. */
static int repair_now(struct flow *f)
{
	off_t want = (off_t)fr_map_bytes(f->ring_bytes);

	if (ftruncate(f->ring_fd, want) ||
	    fallocate(f->ring_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      want, (off_t)TRIM_SPAN_MAX))
		return -errno;
	return 0;
}

/* Submit f's next chunk; false: no loop (a stop) or SQE, or f let go. */
static bool trim_submit(struct flow *f)
{
	uint64_t left = f->trim_end - f->trimmed;
	struct io_uring_sqe *sqe;

	if (!f->table->loop || f->kept ||
	    !(sqe = loop_sqe(f->table->loop, &f->trim_op, trim_done)))
		return false;
	io_uring_prep_fallocate(sqe, f->ring_fd, FALLOC_FL_PUNCH_HOLE |
				FALLOC_FL_KEEP_SIZE, (off_t)f->trimmed,
				(off_t)(left < TRIM_CHUNK ? left : TRIM_CHUNK));
	return true;
}

/* A pass over span bytes from the ring's end; false: not started. */
static bool trim_pass(struct flow *f, uint64_t span)
{
	f->trimmed = fr_map_bytes(f->ring_bytes);
	f->trim_end = f->trimmed + span;
	return trim_submit(f);
}

/* The punch is over: the file is cut back to its size, which frees what
 * is left beyond it on the spot (nothing, once the punch is through),
 * and the punch's reference goes (the last releases the flow: flow_put). */
static void trim_finish(struct flow *f, bool through)
{
	int rc = 0;

	if (!through)
		rc = repair_now(f);
	else if (ftruncate(f->ring_fd, (off_t)fr_map_bytes(f->ring_bytes)))
		rc = -errno;
	if (rc)
		repair_warn(f, -rc);
	log_debug("flow %s: ring file cut back to its size (%u punch "
		  "passes%s)", f->name, f->trim_passes + 1,
		  through ? "" : ", the rest on the spot");
	f->trimming = false;
	f->table->n_async--;
	flow_put(f);
}

/* A pass is through: blocks the client allocated behind it (or that it
 * did not reach) get another, TRIM_PASSES in all; false: none is due, or
 * it could not start. */
static bool trim_again(struct flow *f)
{
	uint64_t want = fr_map_bytes(f->ring_bytes);
	struct stat st;

	if (fstat(f->ring_fd, &st) || !blocks_beyond(&st, want) ||
	    ++f->trim_passes >= TRIM_PASSES)
		return false;
	return trim_pass(f, trim_span(&st, want));
}

static void trim_done(struct loop_op *op, int res)
{
	struct flow *f = (struct flow *)((char *)op -
					 offsetof(struct flow, trim_op));
	uint64_t left = f->trim_end - f->trimmed;

	if (res < 0) {
		repair_warn(f, -res);
		trim_finish(f, false);
		return;
	}
	f->trimmed += left < TRIM_CHUNK ? left : TRIM_CHUNK;
	if (f->trimmed < f->trim_end ? trim_submit(f) : trim_again(f))
		return;
	/* through, unless a chunk or pass could not be submitted */
	trim_finish(f, f->trimmed >= f->trim_end);
}

/* Punch f's file beyond the ring off the loop, holding a reference;
 * false: not started (the caller repairs it on the spot). */
static bool trim_start(struct flow *f, uint64_t span)
{
	f->trim_passes = 0;
	if (!trim_pass(f, span))
		return false;
	f->trimming = true;
	f->table->n_async++;
	flow_get(f); /* the punch reads f and its fd until trim_finish */
	return true;
}

/* Repair f's ring file as st found it: a shrunk one grows back at once,
 * and so is one grown without blocks beyond the ring cut back (sparse:
 * nothing to free, while a punch would walk up to TRIM_SPAN_MAX of holes
 * a chunk at a time); blocks beyond it are punched off the loop (one
 * punch at a time: one under way goes on).  0 or -errno. */
static int repair(struct flow *f, const struct stat *st)
{
	uint64_t want = fr_map_bytes(f->ring_bytes);
	uint64_t size = (uint64_t)st->st_size;

	if ((size < want ||
	     (size > want && !blocks_beyond(st, want) && !f->trimming)) &&
	    ftruncate(f->ring_fd, (off_t)want))
		return -errno;
	if (!blocks_beyond(st, want) || f->trimming ||
	    trim_start(f, trim_span(st, want)))
		return 0;
	return repair_now(f);
}

bool flows_ring_tampered(struct flow *f, char *why, size_t cap)
{
	uint64_t want = fr_map_bytes(f->ring_bytes);
	struct stat st;
	bool tripped;
	int rc;

	if (!f->path[0] || f->ring_fd < 0 || fstat(f->ring_fd, &st))
		return false;
	tripped = views_tripped(f);
	/* blocks: a little slack for a disk filesystem's own metadata */
	if (!tripped && (uint64_t)st.st_size == want &&
	    !blocks_beyond(&st, want))
		return false;
	if (tripped && (uint64_t)st.st_size == want)
		flows_fault_why(f, "moverd's view of the ring faulted", why,
				cap);
	else
		snprintf(why, cap, "a client changed the ring file's size "
			 "(%lld bytes, %lld allocated; the ring has %llu)%s",
			 (long long)st.st_size, (long long)st.st_blocks * 512,
			 (unsigned long long)want,
			 tripped ? "; moverd's view of it faulted" : "");
	rc = repair(f, &st);
	if (rc)
		repair_warn(f, -rc);
	else if (tripped) /* the file has its size again (or more) */
		remap_tripped(f);
	return true;
}

bool flows_is_operator(uid_t uid)
{
	return uid == 0 || uid == own_uid;
}

bool flows_may_manage(const struct flow *f, uid_t uid)
{
	return flows_is_operator(uid) || uid == f->owner_uid;
}

bool flows_group_allowed(const struct flow *f, const gid_t *groups,
			 unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; k < f->allowed.n_gids; k++)
			if (f->allowed.gids[k] == groups[i])
				return true;
	return false;
}

bool flows_may_attach(const struct flow *f, uid_t uid, gid_t gid)
{
	if (flows_may_manage(f, uid))
		return true;
	for (unsigned i = 0; i < f->allowed.n_uids; i++)
		if (f->allowed.uids[i] == uid)
			return true;
	for (unsigned i = 0; i < f->allowed.n_gids; i++)
		if (f->allowed.gids[i] == gid)
			return true;
	return false;
}

static bool has_id(const uint32_t *v, unsigned n, uint32_t id)
{
	for (unsigned i = 0; i < n; i++)
		if (v[i] == id)
			return true;
	return false;
}

/* Add (remove) ids to (from) the list v of *n; false if it overflows. */
static bool edit_ids(uint32_t *v, unsigned *n, const uint32_t *ids, size_t k,
		     bool remove)
{
	for (size_t i = 0; i < k; i++) {
		bool there = has_id(v, *n, ids[i]);

		if (remove && there) {
			unsigned j = 0;

			while (v[j] != ids[i])
				j++;
			memmove(&v[j], &v[j + 1], (*n - j - 1) * sizeof(*v));
			(*n)--;
		} else if (!remove && !there) {
			if (*n == FLOW_ALLOW_MAX)
				return false;
			v[(*n)++] = ids[i];
		}
	}
	return true;
}

int flows_allow(struct flow_table *t, struct flow *f, const uint32_t *uids,
		size_t n_uids, const uint32_t *gids, size_t n_gids, bool remove,
		char *err, size_t errlen)
{
	struct flow_ids old, new;
	int rc;

	if (!n_uids && !n_gids) {
		snprintf(err, errlen, "name at least one uid or gid");
		return -EINVAL;
	}
	if (!ids_valid(uids, n_uids) || !ids_valid(gids, n_gids)) {
		snprintf(err, errlen, "uid and gid 4294967295 (-1) are not ids");
		return -EINVAL;
	}
	/* all or nothing: edit a copy, then take it */
	old = f->allowed;
	new = old;
	if (!edit_ids(new.uids, &new.n_uids, uids, n_uids, remove) ||
	    !edit_ids(new.gids, &new.n_gids, gids, n_gids, remove)) {
		snprintf(err, errlen, "flow '%s' may allow at most %d uids and "
			 "%d gids; disallow some first", f->name,
			 FLOW_ALLOW_MAX, FLOW_ALLOW_MAX);
		return -ENOSPC;
	}
	if (!memcmp(&new, &old, sizeof(new)))
		return 0; /* nothing to change: no state file to rewrite */
	f->allowed = new;
	rc = flows_save(f);
	if (rc) {
		/* not kept, so not granted: it would vanish at a restart,
		 * and the operator must learn that now, not then */
		f->allowed = old;
		snprintf(err, errlen, "cannot write the flow's state file in "
			 "%s: %s", t->state_dir, strerror(-rc));
	}
	return rc;
}
