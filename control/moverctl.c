/*
 * control/moverctl.c - the operator's command line for moverd.
 *
 *   moverctl [--socket PATH] [--json] [--timeout MS] COMMAND
 *
 * Exit codes: 0 ok, 1 error reported by moverd (or the conversation with
 * it failed), 2 usage error, 3 moverd not running, 4 permission denied.
 */
#include "ctl_client.h"
#include "auth.h"
#include "top.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define EX_OK      0
#define EX_DAEMON  1
#define EX_USAGE   2
#define EX_NOTRUN  3
#define EX_PERM    4

#define MAX_IDS 64

#ifndef FLOWMOVER_VERSION
#define FLOWMOVER_VERSION "0.1.0"
#endif

static const char usage_text[] =
"usage: moverctl [--socket PATH] [--json] [--timeout MS] COMMAND\n"
"\n"
"commands:\n"
"  flow create NAME [--ring-size BYTES] [--max-record BYTES]\n"
"                   [--peer HOST:PORT]... [--max-lag BYTES]\n"
"                   [--allow-uid UID]... [--allow-gid GID]...\n"
"  flow peer add NAME HOST:PORT     send the flow to one more peer host too\n"
"  flow peer remove NAME HOST:PORT  stop sending it there\n"
"  flow destroy NAME [--drain]   --drain: stop new sends, wait until every\n"
"                    consumer (between hosts: each receiving one's too)\n"
"                    has every record, then destroy (up to --timeout MS)\n"
"  flow destroy --all  destroy every flow you may see (the purge: only\n"
"                    destroy removes flows; restarts keep them); those you\n"
"                    may see but not destroy are skipped: exit 4\n"
"  flow wait NAME    wait until the flow exists (up to --timeout MS if\n"
"                    given): exit 0 when it does, 1 if it did not appear\n"
"  flow end NAME     end the flow's stream now: its consumers get every\n"
"                    record, then end of stream (on the producers' host)\n"
"  flow allow NAME [--uid USER]... [--gid GROUP]...\n"
"  flow disallow NAME [--uid USER]... [--gid GROUP]...\n"
"  flow list\n"
"  flow show NAME\n"
"  status\n"
"  reload            read moverd's config file again and apply its flow\n"
"                    declarations, and its metrics token file (the same as\n"
"                    SIGHUP to moverd); root only\n"
"  top [--once] [--json]\n"
"                    live flows and peers with rates from moverd's counters\n"
"                    file (SOCKET.counters); keys: r rate, l lag, n name,\n"
"                    q quit.  --once: one frame (rates over 1 s); --json:\n"
"                    one JSON object per second (with --once: one).\n"
"                    --once on a dead moverd's file: exit 3\n"
"                    Without read access to the counters file (moverd's\n"
"                    group): your flows, from the control socket\n"
"  keygen FILE       write a new peer key (32 random bytes, mode 0600) for\n"
"                    moverd --peer-key; prints its id.  The same by hand:\n"
"                    head -c32 /dev/urandom > FILE; chmod 600 FILE\n"
"  help\n"
"\n"
"options (anywhere on the line):\n"
"  -s, --socket PATH   moverd's control socket (default: $FLOWMOVER_SOCKET,\n"
"                      else " CTL_DEFAULT_SOCKET ")\n"
"  -j, --json          print JSON instead of tables\n"
"  -t, --timeout MS    how long to wait for moverd (default 5000; 0 = forever)\n"
"  --ring-size BYTES   ring bytes, a power of two; suffixes K, M, G (64K, 16M)\n"
"  --max-record BYTES  largest record; suffixes K, M, G\n"
"  --peer HOST:PORT    the consumer's moverd, for a flow to another host;\n"
"                      again for several hosts (each gets every record)\n"
"  --max-lag BYTES     cut off a consumer or peer host this far behind the\n"
"                      producers (it gets -ESTALE, the others go on);\n"
"                      default 0: the slowest holds producers back\n"
"  --allow-uid UID     also let this user (number or name) attach; repeatable\n"
"  --allow-gid GID     also let this group (number or name) attach; repeatable\n"
"  --uid USER          flow allow/disallow: this user (name or number) may\n"
"                      (no longer) attach on this host; repeatable\n"
"  --gid GROUP         the same for a group (its members, supplementary\n"
"                      groups included); repeatable\n"
"  --help, --version\n"
"\n"
"A flow from another host belongs on this host to moverd's --peer-flow-owner\n"
"(default root); its owner or root grants others with 'flow allow'.\n"
"\n"
"exit status: 0 ok, 1 error from moverd (or output not written), 2 usage\n"
"error, 3 moverd not running, 4 permission denied\n";

struct opts {
	const char *socket;
	bool json;
	int timeout_ms;
	bool timeout_set;       /* --timeout given: flow wait, --drain */
	bool drain, all;        /* flow destroy --drain, --all */
	/* flow create */
	bool create_opts;       /* any of the below was given */
	uint64_t ring_size;
	uint64_t max_record;
	const char *peer;
	const char *more_peers[8];  /* --peer again: fan-out (issue 11) */
	size_t n_more_peers;
	uint64_t max_lag;
	uint32_t uids[MAX_IDS], gids[MAX_IDS];
	size_t n_uids, n_gids;
	/* flow allow / disallow */
	bool acl_opts;
	uint32_t acl_uids[MAX_IDS], acl_gids[MAX_IDS];
	size_t n_acl_uids, n_acl_gids;
	bool once;              /* top */
};

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("moverctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'moverctl help'.\n", stderr);
	return EX_USAGE;
}

/* ---- parsing of option values -------------------------------------------- */

/* "4096", "64K", "16M", "1G" (also "64k", "64KB", "64KiB"). */
static int parse_size(const char *opt, const char *s, uint64_t *out)
{
	unsigned long long v;
	uint64_t mult = 1;
	char *end;

	if (*s < '0' || *s > '9')
		goto bad;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		goto big;
	switch (*end) {
	case 'k': case 'K': mult = 1ull << 10; end++; break;
	case 'm': case 'M': mult = 1ull << 20; end++; break;
	case 'g': case 'G': mult = 1ull << 30; end++; break;
	default: break;
	}
	if (mult > 1 && (end[0] == 'i' || end[0] == 'I') &&
	    (end[1] == 'B' || end[1] == 'b'))
		end += 2;
	else if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		goto bad;
	if (v > UINT64_MAX / mult)
		goto big;
	if (v == 0)
		return usage_error("%s %s: must be greater than 0", opt, s);
	*out = v * mult;
	return 0;
bad:
	return usage_error("%s '%s': not a size; use a number of bytes with an "
			   "optional K, M or G suffix (e.g. 64K, 16M)", opt, s);
big:
	return usage_error("%s %s: too large", opt, s);
}

/* A number, or a user (group) name. */
static int parse_id(const char *opt, const char *s, bool group, uint32_t *out)
{
	unsigned long v;
	char *end;

	if (*s >= '0' && *s <= '9') {
		errno = 0;
		v = strtoul(s, &end, 10);
		if (*end || errno || v >= UINT32_MAX)
			return usage_error("%s '%s': not a valid %s id", opt, s,
					   group ? "group" : "user");
		*out = (uint32_t)v;
		return 0;
	}
	if (group) {
		struct group *g = getgrnam(s);

		if (!g)
			return usage_error("%s '%s': no such group", opt, s);
		*out = (uint32_t)g->gr_gid;
	} else {
		struct passwd *p = getpwnam(s);

		if (!p)
			return usage_error("%s '%s': no such user", opt, s);
		*out = (uint32_t)p->pw_uid;
	}
	return 0;
}

/* HOST:PORT or [V6ADDR]:PORT. */
static int check_peer(const char *s)
{
	const char *colon = strrchr(s, ':');
	unsigned long port;
	char *end;

	if (!colon || colon == s || !colon[1])
		goto bad;
	if (s[0] == '[' ? colon[-1] != ']' || colon - s < 3
			: memchr(s, ':', (size_t)(colon - s)) != NULL)
		goto bad;
	if (colon[1] < '0' || colon[1] > '9')
		goto bad;
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (*end || errno || port == 0 || port > 65535)
		goto bad;
	return 0;
bad:
	return usage_error("--peer '%s': use HOST:PORT (e.g. 10.0.0.2:7400 or "
			   "[fe80::1]:7400)", s);
}

/* ---- formatting ------------------------------------------------------------ */

/* 512B, 64K, 1.5M, 16G */
static const char *fmt_size(char *buf, size_t cap, uint64_t v)
{
	static const char units[] = "KMGTPE";
	double d = (double)v;
	int u = -1;

	if (v < 1024) {
		snprintf(buf, cap, "%" PRIu64 "B", v);
		return buf;
	}
	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	if (v % (1ull << (10 * (u + 1))) == 0)
		snprintf(buf, cap, "%.0f%c", d, units[u]);
	else
		snprintf(buf, cap, "%.1f%c", d, units[u]);
	return buf;
}

static uint64_t used_bytes(const Flowmover__FlowInfo *f)
{
	return f->tail > f->head ? f->tail - f->head : 0;
}

static const char *fmt_used(char *buf, size_t cap, const Flowmover__FlowInfo *f)
{
	char s[32];
	uint64_t u = used_bytes(f);
	unsigned pct = f->ring_size ? (unsigned)(u * 100.0 / (double)f->ring_size)
				    : 0;

	snprintf(buf, cap, "%s (%u%%)", fmt_size(s, sizeof(s), u), pct);
	return buf;
}

static const char *dash(const char *s)
{
	return s && *s ? s : "-";
}

static const char *fmt_ids(char *buf, size_t cap, const uint32_t *ids,
			   size_t n)
{
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%" PRIu32,
				      i ? ", " : "", ids[i]);
	return n ? buf : "-";
}

static const char *fmt_time_ms(char *buf, size_t cap, uint64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	if (!ms || !localtime_r(&t, &tm) ||
	    !strftime(buf, cap, "%Y-%m-%d %H:%M:%S %z", &tm))
		return "-";
	return buf;
}

static const char *fmt_duration(char *buf, size_t cap, uint64_t ms)
{
	uint64_t s = ms / 1000;
	unsigned d = (unsigned)(s / 86400), h = (unsigned)(s / 3600 % 24),
		 m = (unsigned)(s / 60 % 60), sec = (unsigned)(s % 60);

	if (d)
		snprintf(buf, cap, "%ud %uh %um %us", d, h, m, sec);
	else if (h)
		snprintf(buf, cap, "%uh %um %us", h, m, sec);
	else if (m)
		snprintf(buf, cap, "%um %us", m, sec);
	else
		snprintf(buf, cap, "%us", sec);
	return buf;
}

/* key: value lines with the values aligned. */
static void kv(const char *key, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Text from moverd (some of it a peer's words) on a terminal: see
 * out_text (top.h). */
static void put_text(const char *s)
{
	out_text(stdout, s);
}

/* "moverctl: WHY" on stderr; why is often moverd's words. */
static void say_error(const char *why)
{
	fputs("moverctl: ", stderr);
	out_text(stderr, why);
	fputc('\n', stderr);
}

/* fmt's text through put_text. */
static void put_textv(const char *fmt, va_list ap)
{
	char *val = NULL;

	if (vasprintf(&val, fmt, ap) < 0)
		return;
	put_text(val);
	free(val);
}

/* A line of text some of which is moverd's: all of it through put_text. */
static void text_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void text_line(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	put_textv(fmt, ap);
	va_end(ap);
	putchar('\n');
}

static void kv(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%s:%*s", key, (int)(14 - strlen(key)), "");
	va_start(ap, fmt);
	put_textv(fmt, ap);
	va_end(ap);
	putchar('\n');
}

/* An aligned table: cells are copied; right-aligned columns by flag. */
#define TBL_MAXCOL 10
struct table {
	size_t ncol, nrow, cap;
	size_t width[TBL_MAXCOL];
	bool right[TBL_MAXCOL];
	char **cells;
};

static void tbl_row(struct table *t, const char *const *row)
{
	if (t->nrow == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 16;
		t->cells = realloc(t->cells, t->cap * t->ncol * sizeof(char *));
		if (!t->cells) {
			perror("moverctl");
			exit(EX_DAEMON);
		}
	}
	for (size_t c = 0; c < t->ncol; c++) {
		char *s = strdup(row[c]);
		size_t w = strlen(row[c]);

		if (!s) {
			perror("moverctl");
			exit(EX_DAEMON);
		}
		t->cells[t->nrow * t->ncol + c] = s;
		if (w > t->width[c])
			t->width[c] = w;
	}
	t->nrow++;
}

static void tbl_print(struct table *t)
{
	for (size_t r = 0; r < t->nrow; r++) {
		for (size_t c = 0; c < t->ncol; c++) {
			const char *s = t->cells[r * t->ncol + c];
			int w = (int)t->width[c];
			bool last = c + 1 == t->ncol;

			int pad = w - (int)strlen(s);

			if (t->right[c])
				printf("%*s", pad > 0 ? pad : 0, "");
			put_text(s);
			if (!t->right[c] && !last)
				printf("%*s", pad > 0 ? pad : 0, "");
			fputs(last ? "\n" : "  ", stdout);
			free(t->cells[r * t->ncol + c]);
		}
	}
	free(t->cells);
	t->cells = NULL;
}

/* ---- JSON ------------------------------------------------------------------- */

struct json {
	int depth;
	bool first[16];
	bool after_key;
};

static void j_indent(int depth)
{
	putchar('\n');
	for (int i = 0; i < depth; i++)
		fputs("  ", stdout);
}

/* Before a value or a key. */
static void j_sep(struct json *j)
{
	if (j->after_key) {
		j->after_key = false;
		return;
	}
	if (j->depth == 0)
		return;
	if (!j->first[j->depth])
		putchar(',');
	j->first[j->depth] = false;
	j_indent(j->depth);
}

/* A JSON string (out_json_str, top.h). */
static void j_putstr(const char *str)
{
	out_json_str(stdout, str);
}

static void j_open(struct json *j, char c)
{
	j_sep(j);
	putchar(c);
	j->depth++;
	j->first[j->depth] = true;
}

static void j_close(struct json *j, char c)
{
	bool empty = j->first[j->depth];

	j->depth--;
	if (!empty)
		j_indent(j->depth);
	putchar(c);
	if (j->depth == 0)
		putchar('\n');
}

static void j_key(struct json *j, const char *k)
{
	j_sep(j);
	j_putstr(k);
	fputs(": ", stdout);
	j->after_key = true;
}

static void j_str(struct json *j, const char *k, const char *v)
{
	j_key(j, k);
	j_sep(j);
	j_putstr(v);
}

static void j_u64(struct json *j, const char *k, uint64_t v)
{
	j_key(j, k);
	j_sep(j);
	printf("%" PRIu64, v);
}

static void j_bool(struct json *j, const char *k, bool v)
{
	j_key(j, k);
	j_sep(j);
	fputs(v ? "true" : "false", stdout);
}

static void j_ids(struct json *j, const char *k, const uint32_t *ids, size_t n)
{
	j_key(j, k);
	j_sep(j);
	putchar('[');
	for (size_t i = 0; i < n; i++)
		printf("%s%" PRIu32, i ? ", " : "", ids[i]);
	putchar(']');
}

/* "peers": every peer host of a flow to several (fan-out) */
static void j_fanout(struct json *j, const Flowmover__FlowInfo *f)
{
	j_key(j, "peers");
	j_open(j, '[');
	for (size_t i = 0; i < f->n_fanout; i++) {
		const Flowmover__FanoutPeer *p = f->fanout[i];

		j_open(j, '{');
		j_str(j, "address", p->address);
		j_str(j, "state", p->state);
		j_str(j, "reason", p->reason);
		j_str(j, "transport", p->transport);
		j_u64(j, "acked", p->acked);
		j_u64(j, "bytes_sent", p->bytes_sent);
		j_u64(j, "bytes_acked", p->bytes_acked);
		j_u64(j, "cuts", p->cuts);
		j_u64(j, "cut_unix_ms", p->cut_unix_ms);
		j_close(j, '}');
	}
	j_close(j, ']');
}


/*
 * The counters of `flow show` (issue 10): the counters file's record when
 * this user may read SOCKET.counters (moverd's group), else what the
 * control answer carries.
 */
struct flow_counters {
	const char *source;      /* "counters file" or "control socket" */
	uint64_t batches, bytes_sent, reconnects, resumes, lag, consumed;
	uint64_t records_committed, records_sent, records_deposited;
	uint64_t records_consumed;         /* file only */
	uint64_t bp_events, full_ns;
	uint64_t state_since_ns, error_ns; /* file only */
	const char *last_error;            /* file only */
};

static void counters_of(const char *socket, const Flowmover__FlowInfo *f,
			struct flow_counters *k)
{
	static struct fmc_snap s;
	struct fmc_map m;

	*k = (struct flow_counters){
		.source = "control socket", .batches = f->batches,
		.records_committed = f->records_committed,
		.records_sent = f->records_sent,
		.records_deposited = f->records_deposited,
		.bytes_sent = f->bytes_sent, .reconnects = f->reconnects,
		.resumes = f->resumes, .lag = f->lag_bytes,
		.consumed = f->bytes_consumed,
		.bp_events = f->backpressure_events, .full_ns = f->full_ns,
		.last_error = "",
	};
	if (fmc_map_open(socket, &m))
		return;
	if (fmc_find_flow(&m, f->name, &s)) {
		*k = (struct flow_counters){
			.source = "counters file",
			.batches = s.v[FMC_F_BATCHES],
			.records_committed = s.v[FMC_F_RECORDS_COMMITTED],
			.records_sent = s.v[FMC_F_RECORDS_SENT],
			.records_deposited = s.v[FMC_F_RECORDS_DEPOSITED],
			.records_consumed = s.v[FMC_F_RECORDS_CONSUMED],
			.bytes_sent = s.v[FMC_F_BYTES_SENT],
			.reconnects = s.v[FMC_F_RECONNECTS],
			.resumes = s.v[FMC_F_RESUMES],
			.lag = s.v[FMC_F_LAG_BYTES],
			.consumed = s.v[FMC_F_BYTES_CONSUMED],
			.bp_events = s.v[FMC_F_BACKPRESSURE],
			.full_ns = s.v[FMC_F_FULL_NS],
			.state_since_ns = s.v[FMC_F_STATE_SINCE_NS],
			.error_ns = s.v[FMC_F_ERROR_NS],
			.last_error = s.text[FMC_ERROR],
		};
	}
	fmc_map_close(&m);
}

static void j_counters(struct json *j, const struct flow_counters *k)
{
	j_key(j, "counters");
	j_open(j, '{');
	j_str(j, "source", k->source);
	j_u64(j, "batches", k->batches);
	j_u64(j, "mean_batch_bytes", k->batches ? k->bytes_sent / k->batches : 0);
	j_u64(j, "mean_batch_records",
	      k->batches ? k->records_sent / k->batches : 0);
	j_u64(j, "records_committed", k->records_committed);
	j_u64(j, "records_sent", k->records_sent);
	j_u64(j, "records_deposited", k->records_deposited);
	j_u64(j, "records_consumed", k->records_consumed);
	j_u64(j, "lag_bytes", k->lag);
	j_u64(j, "bytes_consumed", k->consumed);
	j_u64(j, "backpressure_events", k->bp_events);
	j_u64(j, "full_ns", k->full_ns);
	j_u64(j, "reconnects", k->reconnects);
	j_u64(j, "resumes", k->resumes);
	j_u64(j, "state_since_unix_ns", k->state_since_ns);
	j_str(j, "last_error", k->last_error);
	j_u64(j, "last_error_unix_ns", k->error_ns);
	j_close(j, '}');
}

static void j_flow(struct json *j, const Flowmover__FlowInfo *f,
		   const struct flow_counters *k)
{
	j_open(j, '{');
	j_str(j, "name", f->name);
	j_str(j, "state", f->state);
	j_str(j, "state_reason", f->state_reason);
	j_str(j, "role", f->role);
	j_str(j, "transport", f->transport);
	j_str(j, "peer", f->peer);
	j_str(j, "origin", f->origin);
	j_u64(j, "ring_size", f->ring_size);
	j_u64(j, "max_record", f->max_record);
	j_u64(j, "head", f->head);
	j_u64(j, "tail", f->tail);
	j_u64(j, "used", used_bytes(f));
	j_u64(j, "producers", f->producers);
	j_u64(j, "consumers", f->consumers);
	j_u64(j, "owner_uid", f->owner_uid);
	j_u64(j, "owner_gid", f->owner_gid);
	j_ids(j, "allow_uids", f->allow_uids, f->n_allow_uids);
	j_ids(j, "allow_gids", f->allow_gids, f->n_allow_gids);
	j_u64(j, "recovered", f->recovered);
	j_u64(j, "created_unix_ms", f->created_unix_ms);
	j_u64(j, "bytes_sent", f->bytes_sent);
	j_u64(j, "bytes_acked", f->bytes_acked);
	j_bool(j, "declared", f->declared);
	j_bool(j, "existed", f->existed);
	j_u64(j, "max_lag", f->max_lag);
	j_fanout(j, f);
	if (k)
		j_counters(j, k);
	j_close(j, '}');
}

/* ---- the commands' output ------------------------------------------------- */

static void print_list(const Flowmover__FlowList *l, bool json)
{
	struct table t = { .ncol = 9 };
	char ring[32], used[48], prod[16], cons[16], peer[120];

	if (json) {
		struct json j = { 0 };

		j_open(&j, '[');
		for (size_t i = 0; i < l->n_flows; i++)
			j_flow(&j, l->flows[i], NULL);
		j_close(&j, ']');
		return;
	}
	t.right[4] = t.right[5] = t.right[6] = t.right[7] = true;
	tbl_row(&t, (const char *const[]){ "NAME", "STATE", "ROLE",
		"TRANSPORT", "RING", "USED", "PRODUCERS", "CONSUMERS",
		"PEER" });
	for (size_t i = 0; i < l->n_flows; i++) {
		const Flowmover__FlowInfo *f = l->flows[i];

		snprintf(prod, sizeof(prod), "%" PRIu32, f->producers);
		snprintf(cons, sizeof(cons), "%" PRIu32, f->consumers);
		/* several peer hosts: the first, and how many more */
		if (f->n_fanout > 1)
			snprintf(peer, sizeof(peer), "%s +%zu", f->peer,
				 f->n_fanout - 1);
		else
			snprintf(peer, sizeof(peer), "%s", dash(f->peer));
		tbl_row(&t, (const char *const[]){ dash(f->name),
			dash(f->state), dash(f->role), dash(f->transport),
			fmt_size(ring, sizeof(ring), f->ring_size),
			fmt_used(used, sizeof(used), f), prod, cons, peer });
	}
	tbl_print(&t);
}

static void print_counters(const struct flow_counters *k)
{
	char a[64], b[64];

	kv("lag", "%s (%" PRIu64 " bytes)", fmt_size(a, sizeof(a), k->lag),
	   k->lag);
	kv("consumed", "%" PRIu64, k->consumed);
	kv("records", "%" PRIu64 " committed, %" PRIu64 " sent, %" PRIu64
	   " deposited, %" PRIu64 " consumed", k->records_committed,
	   k->records_sent, k->records_deposited, k->records_consumed);
	if (k->batches)
		kv("batches", "%" PRIu64 " (mean %s, %" PRIu64 " records)",
		   k->batches,
		   fmt_size(b, sizeof(b), k->bytes_sent / k->batches),
		   k->records_sent / k->batches);
	kv("back-pressure", "%" PRIu64 " times full, %.3f s waiting",
	   k->bp_events, (double)k->full_ns / 1e9);
	kv("reconnects", "%" PRIu64 " (resumed %" PRIu64 ")", k->reconnects,
	   k->resumes);
	if (k->error_ns)
		kv("last error", "%s (%s)", k->last_error,
		   fmt_time_ms(a, sizeof(a), k->error_ns / 1000000));
	kv("counters", "from the %s", k->source);
}

/* One peer host of a fan-out flow: its state, why, where it is, and how
 * often --max-lag cut it (a cut lasts until the rejoin, a second or so:
 * the count says one happened after it is over). */
static void print_fanout_peer(size_t i, const Flowmover__FanoutPeer *p)
{
	char cut[80] = "", a[40];

	if (p->cuts)
		snprintf(cut, sizeof(cut), "; cut %" PRIu32 " time%s, last at %s",
			 p->cuts, p->cuts == 1 ? "" : "s",
			 fmt_time_ms(a, sizeof(a), p->cut_unix_ms));
	kv(i ? "" : "peers", "%s %s%s%s (at %" PRIu64 "%s)", p->address,
	   p->state, p->reason[0] ? ": " : "", p->reason, p->acked, cut);
}

static void print_flow(const Flowmover__FlowInfo *f, bool json,
		       const struct flow_counters *k)
{
	char a[64], b[64], ids[MAX_IDS * 12];

	if (json) {
		struct json j = { 0 };

		j_flow(&j, f, k);
		return;
	}
	kv("name", "%s", f->name);
	kv("state", "%s", dash(f->state));
	if (f->state_reason[0])
		kv("reason", "%s", f->state_reason);
	kv("role", "%s", dash(f->role));
	kv("transport", "%s", dash(f->transport));
	kv("peer", "%s", dash(f->peer));
	if (f->origin[0])
		kv("bound to", "peer %s", f->origin);
	kv("ring size", "%s (%" PRIu64 " bytes)",
	   fmt_size(a, sizeof(a), f->ring_size), f->ring_size);
	kv("max record", "%s (%" PRIu32 " bytes)",
	   fmt_size(b, sizeof(b), f->max_record), f->max_record);
	kv("used", "%s", fmt_used(a, sizeof(a), f));
	kv("head", "%" PRIu64, f->head);
	kv("tail", "%" PRIu64, f->tail);
	kv("producers", "%" PRIu32, f->producers);
	kv("consumers", "%" PRIu32, f->consumers);
	kv("owner", "uid %" PRIu32 ", gid %" PRIu32, f->owner_uid,
	   f->owner_gid);
	kv("allowed uids", "%s",
	   fmt_ids(ids, sizeof(ids), f->allow_uids, f->n_allow_uids));
	kv("allowed gids", "%s",
	   fmt_ids(ids, sizeof(ids), f->allow_gids, f->n_allow_gids));
	kv("recovered", "%" PRIu32, f->recovered);
	kv("created", "%s", fmt_time_ms(a, sizeof(a), f->created_unix_ms));
	kv("bytes sent", "%" PRIu64, f->bytes_sent);
	kv("bytes acked", "%" PRIu64, f->bytes_acked);
	kv("declared", "%s", f->declared ? "yes (moverd's config)" : "no");
	if (f->max_lag)
		kv("max lag", "%" PRIu64 " bytes", f->max_lag);
	for (size_t i = 0; i < f->n_fanout; i++)
		print_fanout_peer(i, f->fanout[i]);
	if (k)
		print_counters(k);
}

/* "NODE key KEYID", "NODE (no key)", or "not authenticated". */
static void peer_identity(const Flowmover__PeerInfo *p, char *out, size_t cap)
{
	if (!p->authenticated)
		snprintf(out, cap, "not authenticated");
	else if (p->key_id && *p->key_id)
		snprintf(out, cap, "%s key %s", dash(p->node), p->key_id);
	else
		snprintf(out, cap, "%s (no key)", dash(p->node));
}

/* A peer's acknowledgement times over moverd's life from the counters
 * file's histogram (p50, p99 in ns); false if this user may not read it. */
static bool peer_rtt(const struct fmc_map *m, const char *address,
		     uint64_t *p50, uint64_t *p99)
{
	static struct fmc_snap s;

	if (!m->h)
		return false;
	for (unsigned i = 0; i < m->n_peer; i++)
		if (fmc_peer(m, i, &s) && !strcmp(s.text[FMC_NAME], address)) {
			*p50 = fmc_rtt_quantile(&s.v[FMC_P_RTT_BUCKET0], NULL, 0.5);
			*p99 = fmc_rtt_quantile(&s.v[FMC_P_RTT_BUCKET0], NULL, 0.99);
			return true;
		}
	return false;
}

/* The connection window and its cuts. */
static void window_text(char *out, size_t cap, uint64_t window,
			uint64_t cuts)
{
	snprintf(out, cap, "%.2f MiB (%" PRIu64 ")",
		 (double)window / (1024.0 * 1024.0), cuts);
}

static void print_peer_counters(const Flowmover__StatusInfo *s,
				const struct fmc_map *m)
{
	struct table t = { .ncol = 9 };
	char a[16], b[16], c[24], d[24], e[24], g[24], h[16], w[48];

	for (size_t i = 1; i < 9; i++)
		t.right[i] = true;
	tbl_row(&t, (const char *const[]){ "PEER", "FRAMES OUT", "FRAMES IN",
		"ACKS TIMED", "RTT MEAN", "RTT p50/p99", "RTT MAX",
		"HB MISSED", "WINDOW (CUTS)" });
	for (size_t i = 0; i < s->n_peers; i++) {
		const Flowmover__PeerInfo *p = s->peers[i];
		uint64_t p50, p99;

		snprintf(a, sizeof(a), "%" PRIu64, p->frames_sent);
		snprintf(b, sizeof(b), "%" PRIu64, p->frames_received);
		snprintf(c, sizeof(c), "%" PRIu64, p->ack_rtt_count);
		snprintf(d, sizeof(d), "%.0f us", p->ack_rtt_count ?
			 (double)p->ack_rtt_sum_ns / 1e3 /
			 (double)p->ack_rtt_count : 0.0);
		if (peer_rtt(m, p->address, &p50, &p99))
			snprintf(e, sizeof(e), "%.0f/%.0f us", (double)p50 / 1e3,
				 (double)p99 / 1e3);
		else
			snprintf(e, sizeof(e), "-");
		snprintf(g, sizeof(g), "%.0f us", (double)p->ack_rtt_max_ns / 1e3);
		snprintf(h, sizeof(h), "%" PRIu64, p->heartbeats_missed);
		window_text(w, sizeof(w), p->window_bytes, p->window_cuts);
		tbl_row(&t, (const char *const[]){ dash(p->address), a, b, c, d,
			e, g, h, w });
	}
	putchar('\n');
	tbl_print(&t);
}

/* Why each peer last failed, and when (none that never did). */
static void print_peer_errors(const Flowmover__StatusInfo *s)
{
	char when[64];

	for (size_t i = 0; i < s->n_peers; i++) {
		const Flowmover__PeerInfo *p = s->peers[i];

		if (!p->last_error || !p->last_error[0])
			continue;
		put_text(dash(p->address));
		printf(": last error at %s: ",
		       fmt_time_ms(when, sizeof(when), p->last_error_unix_ms));
		put_text(p->last_error);
		putchar('\n');
	}
}

static void print_status(const Flowmover__StatusInfo *s, bool json,
			 const struct fmc_map *m)
{
	char a[64], b[32], c[32], d[16], e[16], g[40], h[32], id[160];
	char shared[64];
	struct table t = { .ncol = 9 };

	if (json) {
		struct json j = { 0 };

		j_open(&j, '{');
		j_str(&j, "version", s->version);
		j_u64(&j, "pid", s->pid);
		j_u64(&j, "uptime_ms", s->uptime_ms);
		j_u64(&j, "starts", s->starts);
		j_str(&j, "socket_path", s->socket_path);
		j_str(&j, "listen", s->listen);
		j_key(&j, "transports");
		j_open(&j, '[');
		for (size_t i = 0; i < s->n_transports; i++) {
			j_sep(&j);
			j_putstr(s->transports[i]);
		}
		j_close(&j, ']');
		j_u64(&j, "flows", s->flows);
		j_u64(&j, "clients", s->clients);
		j_str(&j, "doorbell", s->doorbell);
		j_u64(&j, "cycles", s->cycles);
		j_u64(&j, "sleeps", s->sleeps);
		j_u64(&j, "doorbell_rings", s->doorbell_rings);
		j_str(&j, "idle", s->idle);
		j_str(&j, "io_uring", s->io_uring);
		j_u64(&j, "window_delay_us", s->window_delay_us);
		j_u64(&j, "ring_to_allocate_bytes", s->ring_to_allocate_bytes);
		j_u64(&j, "ring_to_free_bytes", s->ring_to_free_bytes);
		j_u64(&j, "destroyed_rings", s->destroyed_rings);
		j_u64(&j, "destroyed_ring_bytes", s->destroyed_ring_bytes);
		j_key(&j, "bell_page");
		j_sep(&j);
		fputs(s->bell_page ? "true" : "false", stdout);
		j_u64(&j, "bell_flows", s->bell_flows);
		j_u64(&j, "bell_pages", s->bell_pages);
		j_u64(&j, "bell_shared_producers", s->bell_shared_producers);
		j_u64(&j, "idle_polls", s->idle_polls);
		j_u64(&j, "idle_backoffs", s->idle_backoffs);
		j_u64(&j, "clients_refused", s->clients_refused);
		j_u64(&j, "peers_refused", s->peers_refused);
		j_u64(&j, "accept_waits", s->accept_waits);
		j_u64(&j, "work_cycles", s->work_cycles);
		j_u64(&j, "wakes_doorbell", s->wakes_doorbell);
		j_u64(&j, "wakes_network", s->wakes_network);
		j_u64(&j, "wakes_timer", s->wakes_timer);
		j_u64(&j, "cpu_user_ns", s->cpu_user_ns);
		j_u64(&j, "cpu_sys_ns", s->cpu_sys_ns);
		j_u64(&j, "open_fds", s->open_fds);
		j_u64(&j, "peers_not_listed", s->peers_not_listed);
		j_key(&j, "peers");
		j_open(&j, '[');
		for (size_t i = 0; i < s->n_peers; i++) {
			const Flowmover__PeerInfo *p = s->peers[i];
			uint64_t p50, p99;

			j_open(&j, '{');
			j_str(&j, "address", p->address);
			j_str(&j, "state", p->state);
			j_str(&j, "transport", p->transport);
			j_u64(&j, "flows", p->flows);
			j_u64(&j, "bytes_sent", p->bytes_sent);
			j_u64(&j, "bytes_received", p->bytes_received);
			j_u64(&j, "reconnects", p->reconnects);
			j_u64(&j, "registrations", p->registrations);
			j_u64(&j, "registered_bytes", p->registered_bytes);
			j_str(&j, "node", p->node);
			j_str(&j, "key_id", p->key_id);
			j_key(&j, "authenticated");
			j_sep(&j);
			fputs(p->authenticated ? "true" : "false", stdout);
			j_u64(&j, "frames_sent", p->frames_sent);
			j_u64(&j, "frames_received", p->frames_received);
			j_u64(&j, "ack_rtt_count", p->ack_rtt_count);
			j_u64(&j, "ack_rtt_sum_ns", p->ack_rtt_sum_ns);
			j_u64(&j, "ack_rtt_max_ns", p->ack_rtt_max_ns);
			if (peer_rtt(m, p->address, &p50, &p99)) {
				j_u64(&j, "ack_rtt_p50_ns", p50);
				j_u64(&j, "ack_rtt_p99_ns", p99);
			}
			j_u64(&j, "heartbeats_missed", p->heartbeats_missed);
			j_u64(&j, "rdma_wr_posted", p->rdma_wr_posted);
			j_u64(&j, "rdma_wc_polled", p->rdma_wc_polled);
			j_u64(&j, "window_bytes", p->window_bytes);
			j_u64(&j, "unacked_bytes", p->unacked_bytes);
			j_u64(&j, "window_cuts", p->window_cuts);
			j_str(&j, "last_error", p->last_error);
			j_u64(&j, "last_error_unix_ms", p->last_error_unix_ms);
			j_close(&j, '}');
		}
		j_close(&j, ']');
		j_close(&j, '}');
		return;
	}
	kv("version", "%s", dash(s->version));
	kv("pid", "%" PRIu32, s->pid);
	kv("uptime", "%s", fmt_duration(a, sizeof(a), s->uptime_ms));
	kv("starts", "%" PRIu64, s->starts);
	kv("socket", "%s", dash(s->socket_path));
	kv("listen", "%s", dash(s->listen));
	printf("transports:%*s", 14 - (int)strlen("transports"), "");
	for (size_t i = 0; i < s->n_transports; i++) {
		fputs(i ? ", " : "", stdout);
		put_text(s->transports[i]);
	}
	puts(s->n_transports ? "" : "-");
	kv("flows", "%" PRIu32, s->flows);
	kv("clients", "%" PRIu32, s->clients);
	kv("doorbell", "%s", dash(s->doorbell));
	kv("mover", "%" PRIu64 " cycles (%" PRIu64 " with work), %" PRIu64
	   " sleeps, %" PRIu64 " ended by the doorbell", s->cycles,
	   s->work_cycles, s->sleeps, s->doorbell_rings);
	kv("woken by", "doorbell %" PRIu64 ", network %" PRIu64 ", timer %"
	   PRIu64, s->wakes_doorbell, s->wakes_network, s->wakes_timer);
	kv("cpu", "%.2f s user, %.2f s system", (double)s->cpu_user_ns / 1e9,
	   (double)s->cpu_sys_ns / 1e9);
	kv("open fds", "%" PRIu64, s->open_fds);
	snprintf(shared, sizeof(shared), "; %" PRIu32 " producers of uids "
		 "past 63 share the last", s->bell_shared_producers);
	kv("doorbell page", "%s, %" PRIu32 " sender flows hold a bit, %"
	   PRIu32 " pages (one per uid of producers%s)",
	   s->bell_page ? "yes" : "no (polls)", s->bell_flows, s->bell_pages,
	   s->bell_shared_producers ? shared : "");
	kv("idle", "%s: %" PRIu64 " empty cycles polled, %" PRIu64
	   " back-offs (cpu contended)", dash(s->idle), s->idle_polls,
	   s->idle_backoffs);
	kv("io_uring", "%s", dash(s->io_uring));
	kv("window delay", "%" PRIu64 " us above a link's least round trip "
	   "cuts its window", s->window_delay_us);
	kv("ring pages", "%s to allocate, %s of destroyed rings to free",
	   fmt_size(a, sizeof(a), s->ring_to_allocate_bytes),
	   fmt_size(b, sizeof(b), s->ring_to_free_bytes));
	kv("rings held", "%u of destroyed flows (%s): I/O in flight, "
	   "consumers draining, pages being freed", s->destroyed_rings,
	   fmt_size(a, sizeof(a), s->destroyed_ring_bytes));
	kv("refused", "%" PRIu64 " clients, %" PRIu64 " peer connections "
	   "(over a limit); %" PRIu64 " accept waits (out of fds)",
	   s->clients_refused, s->peers_refused, s->accept_waits);
	if (!s->n_peers) {
		kv("peers", "none");
		return;
	}
	putchar('\n');
	t.right[3] = t.right[4] = t.right[5] = t.right[6] = t.right[7] = true;
	tbl_row(&t, (const char *const[]){ "PEER", "STATE", "TRANSPORT",
		"FLOWS", "SENT", "RECEIVED", "RECONNECTS", "REGISTERED",
		"IDENTITY" });
	for (size_t i = 0; i < s->n_peers; i++) {
		const Flowmover__PeerInfo *p = s->peers[i];

		snprintf(d, sizeof(d), "%" PRIu32, p->flows);
		snprintf(e, sizeof(e), "%" PRIu32, p->reconnects);
		snprintf(g, sizeof(g), "%" PRIu32 " rings, %s", p->registrations,
			 fmt_size(h, sizeof(h), p->registered_bytes));
		peer_identity(p, id, sizeof(id));
		tbl_row(&t, (const char *const[]){ dash(p->address),
			dash(p->state), dash(p->transport), d,
			fmt_size(b, sizeof(b), p->bytes_sent),
			fmt_size(c, sizeof(c), p->bytes_received), e,
			strcmp(p->transport, "rdma") ? "-" : g, id });
	}
	tbl_print(&t);
	if (s->peers_not_listed)
		printf("(%" PRIu32 " more peer connections not listed; those "
		       "carrying flows are listed first)\n",
		       s->peers_not_listed);
	print_peer_errors(s);
	print_peer_counters(s, m);
}

/* ---- talking to moverd ------------------------------------------------------ */

static int exit_code(int rc)
{
	return rc == -EACCES || rc == -EPERM ? EX_PERM : EX_DAEMON;
}

/* Why ask() failed when it was not moverd's answer or the socket. */
static char ask_why[160];

static const char *ask_error(void)
{
	return ask_why[0] ? ask_why : ctl_last_error();
}

/* A connection to moverd, or an exit code after saying why not. */
static int connect_to(const struct opts *o, int *s)
{
	*s = ctl_connect(ctl_socket_path(o->socket));
	if (*s >= 0)
		return EX_OK;
	say_error(ctl_last_error());
	return *s == -ECONNREFUSED ? EX_NOTRUN : exit_code(*s);
}

/* One round trip on s: 0, or a negative errno (ask_error() says why). */
static int ask(const struct opts *o, int s, Flowmover__Request *req,
	       Flowmover__Response **resp, Flowmover__Response__BodyCase want)
{
	int rc = ctl_call(s, req, resp, NULL, o->timeout_ms);

	ask_why[0] = '\0';
	if (rc)
		return rc;
	if ((*resp)->body_case != want &&
	    !(want == FLOWMOVER__RESPONSE__BODY_OK &&
	      (*resp)->body_case == FLOWMOVER__RESPONSE__BODY_FLOW)) {
		snprintf(ask_why, sizeof(ask_why), "unexpected response from "
			 "moverd (body %d, expected %d)",
			 (int)(*resp)->body_case, (int)want);
		ctl_response_free(*resp);
		*resp = NULL;
		return -EPROTO;
	}
	return 0;
}

/* One round trip; prints the error and returns an exit code on failure. */
static int call(const struct opts *o, Flowmover__Request *req,
		Flowmover__Response **resp,
		Flowmover__Response__BodyCase want)
{
	int s, rc, ex = connect_to(o, &s);

	if (ex)
		return ex;
	rc = ask(o, s, req, resp, want);
	close(s);
	if (!rc)
		return EX_OK;
	say_error(ask_error());
	return exit_code(rc);
}

/*
 * The next page of a flow list starts after this page's last name.  Names
 * come in order: one that does not move past `after` (or does not fit a
 * name) would have moverd asked for the same page forever: -EPROTO.
 */
static int page_after(const Flowmover__FlowList *page, char *after,
		      size_t cap)
{
	const char *last = page->flows[page->n_flows - 1]->name;

	if (strcmp(last, after) <= 0 || strlen(last) >= cap) {
		snprintf(ask_why, sizeof(ask_why), "moverd's flow list does "
			 "not move forward (a page ends at or before the one "
			 "before)");
		return -EPROTO;
	}
	snprintf(after, cap, "%s", last);
	return 0;
}

static int cmd_create(const struct opts *o, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec sp = FLOWMOVER__FLOW_SPEC__INIT;
	Flowmover__Response *resp;
	char a[32], b[32];
	int ex;

	sp.name = (char *)name;
	sp.ring_size = o->ring_size;
	sp.max_record = (uint32_t)o->max_record;
	sp.peer = (char *)(o->peer ? o->peer : "");
	sp.more_peers = (char **)o->more_peers;
	sp.n_more_peers = o->n_more_peers;
	sp.max_lag = o->max_lag;
	sp.allow_uids = (uint32_t *)o->uids;
	sp.n_allow_uids = o->n_uids;
	sp.allow_gids = (uint32_t *)o->gids;
	sp.n_allow_gids = o->n_gids;
	cr.spec = &sp;
	req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	req.create = &cr;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_FLOW);
	if (ex)
		return ex;
	if (o->json)
		print_flow(resp->flow, true, NULL);
	else
		text_line("%s flow '%s' (ring %s, max record %s%s%s)",
			resp->flow->existed ? "exists:" : "created", name,
			fmt_size(a, sizeof(a), resp->flow->ring_size),
			fmt_size(b, sizeof(b), resp->flow->max_record),
			resp->flow->peer[0] ? ", peer " : "",
			resp->flow->peer);
	ctl_response_free(resp);
	return EX_OK;
}

/* An Ok answer about flow `name`: {"KEY": "name"} or "TEXT 'name'". */
static void print_done(const struct opts *o, const char *key,
		       const char *text, const char *name)
{
	struct json j = { 0 };

	if (!o->json) {
		text_line("%s '%s'", text, name);
		return;
	}
	j_open(&j, '{');
	j_str(&j, key, name);
	j_close(&j, '}');
}

static int cmd_end(const struct opts *o, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__EndFlow e = FLOWMOVER__END_FLOW__INIT;
	Flowmover__Response *resp;
	int ex;

	e.name = (char *)name;
	req.body_case = FLOWMOVER__REQUEST__BODY_END_FLOW;
	req.end_flow = &e;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_OK);
	if (ex)
		return ex;
	print_done(o, "ended", "ended the stream of flow", name);
	ctl_response_free(resp);
	return EX_OK;
}

/*
 * A request that waits in moverd (flow wait, destroy --drain): moverd
 * ends the wait at --timeout (if given), so the call itself waits a little
 * longer for the answer, or forever.
 */
static struct opts waiting_opts(const struct opts *o, uint32_t *wait_ms)
{
	struct opts w = *o;
	int64_t call_ms;

	*wait_ms = o->timeout_set && o->timeout_ms > 0 ?
			   (uint32_t)o->timeout_ms : 0;
	/* in 64 bits: --timeout may be INT32_MAX; past INT_MAX, as good
	 * as forever (24 days) */
	call_ms = (int64_t)*wait_ms + 5000;
	w.timeout_ms = !*wait_ms ? -1 : call_ms > INT_MAX ? INT_MAX :
					 (int)call_ms;
	return w;
}

static int cmd_destroy(const struct opts *o, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DestroyFlow d = FLOWMOVER__DESTROY_FLOW__INIT;
	Flowmover__Response *resp;
	struct opts w = *o;
	int ex;

	d.name = (char *)name;
	if (o->drain) {
		d.drain = true;
		w = waiting_opts(o, &d.drain_timeout_ms);
	}
	req.body_case = FLOWMOVER__REQUEST__BODY_DESTROY;
	req.destroy = &d;
	ex = call(&w, &req, &resp, FLOWMOVER__RESPONSE__BODY_OK);
	if (ex)
		return ex;
	print_done(o, "destroyed", "destroyed flow", name);
	ctl_response_free(resp);
	return EX_OK;
}

static int cmd_allow(const struct opts *o, const char *name, bool remove)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__FlowAllow a = FLOWMOVER__FLOW_ALLOW__INIT;
	Flowmover__Response *resp;
	const Flowmover__FlowInfo *f;
	char u[MAX_IDS * 12], g[MAX_IDS * 12];
	int ex;

	if (!o->n_acl_uids && !o->n_acl_gids)
		return usage_error("flow %s: name at least one --uid or --gid",
				   remove ? "disallow" : "allow");
	a.name = (char *)name;
	a.uids = (uint32_t *)o->acl_uids;
	a.n_uids = o->n_acl_uids;
	a.gids = (uint32_t *)o->acl_gids;
	a.n_gids = o->n_acl_gids;
	a.remove = remove;
	req.body_case = FLOWMOVER__REQUEST__BODY_ALLOW;
	req.allow = &a;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_FLOW);
	if (ex)
		return ex;
	f = resp->flow;
	if (o->json)
		print_flow(f, true, NULL);
	else
		printf("flow '%s': allowed uids %s; allowed gids %s\n", name,
		       fmt_ids(u, sizeof(u), f->allow_uids, f->n_allow_uids),
		       fmt_ids(g, sizeof(g), f->allow_gids, f->n_allow_gids));
	ctl_response_free(resp);
	return EX_OK;
}

/* flow peer add|remove NAME HOST:PORT (fan-out) */
static int cmd_peer(const struct opts *o, const char *name, const char *addr,
		    bool remove)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__FanoutPeerEdit e = FLOWMOVER__FANOUT_PEER_EDIT__INIT;
	Flowmover__Response *resp;
	int ex;

	e.name = (char *)name;
	e.peer = (char *)addr;
	e.remove = remove;
	req.body_case = FLOWMOVER__REQUEST__BODY_FANOUT_PEER;
	req.fanout_peer = &e;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_FLOW);
	if (ex)
		return ex;
	if (o->json)
		print_flow(resp->flow, true, NULL);
	else
		printf("flow '%s': %s peer %s\n", name,
		       remove ? "removed" : "added", addr);
	ctl_response_free(resp);
	return EX_OK;
}

/* Keep a page's response; false when out of memory. */
static bool keep_page(Flowmover__Response ***pages, size_t *n,
		      Flowmover__Response *resp)
{
	Flowmover__Response **p = realloc(*pages, (*n + 1) * sizeof(*p));

	if (!p)
		return false;
	p[(*n)++] = resp;
	*pages = p;
	return true;
}

/* The list comes in pages (one frame each): fetch them all, then print
 * them as one list. */
static int cmd_list(const struct opts *o)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__ListFlows l = FLOWMOVER__LIST_FLOWS__INIT;
	Flowmover__FlowList all = FLOWMOVER__FLOW_LIST__INIT;
	Flowmover__Response **pages = NULL, *resp;
	char after[CTL_NAME_MAX + 1] = "";
	size_t n_pages = 0, n = 0;
	int ex = EX_OK;

	req.body_case = FLOWMOVER__REQUEST__BODY_LIST;
	req.list = &l;
	l.after = after;
	for (;;) {
		const Flowmover__FlowList *page;

		ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_LIST);
		if (ex)
			goto out;
		if (!keep_page(&pages, &n_pages, resp)) {
			ctl_response_free(resp);
			perror("moverctl");
			ex = EX_DAEMON;
			goto out;
		}
		page = resp->list;
		n += page->n_flows;
		/* an empty page that says "more" would never end */
		if (!page->more || !page->n_flows)
			break;
		if (page_after(page, after, sizeof(after))) {
			say_error(ask_error());
			ex = EX_DAEMON;
			goto out;
		}
	}
	all.flows = calloc(n ? n : 1, sizeof(*all.flows));
	if (!all.flows) {
		perror("moverctl");
		ex = EX_DAEMON;
		goto out;
	}
	for (size_t i = 0; i < n_pages; i++)
		for (size_t j = 0; j < pages[i]->list->n_flows; j++)
			all.flows[all.n_flows++] = pages[i]->list->flows[j];
	print_list(&all, o->json);
	free(all.flows);
out:
	for (size_t i = 0; i < n_pages; i++)
		ctl_response_free(pages[i]);
	free(pages);
	return ex;
}

static int cmd_show(const struct opts *o, const char *name)
{
	struct flow_counters k;
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DescribeFlow d = FLOWMOVER__DESCRIBE_FLOW__INIT;
	Flowmover__Response *resp;
	int ex;

	d.name = (char *)name;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
	req.describe = &d;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_FLOW);
	if (ex)
		return ex;
	counters_of(ctl_socket_path(o->socket), resp->flow, &k);
	print_flow(resp->flow, o->json, &k);
	ctl_response_free(resp);
	return EX_OK;
}

static int cmd_reload(const struct opts *o)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Reload rl = FLOWMOVER__RELOAD__INIT;
	Flowmover__Response *resp;
	const Flowmover__ReloadResult *r;
	int ex;

	req.body_case = FLOWMOVER__REQUEST__BODY_RELOAD;
	req.reload = &rl;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_RELOAD);
	if (ex)
		return ex;
	r = resp->reload;
	if (o->json) {
		struct json j = { 0 };

		j_open(&j, '{');
		j_u64(&j, "added", r->added);
		j_u64(&j, "removed", r->removed);
		j_u64(&j, "changed", r->changed);
		j_u64(&j, "unchanged", r->unchanged);
		j_u64(&j, "refused", r->refused);
		j_key(&j, "lines");
		j_open(&j, '[');
		for (size_t i = 0; i < r->n_lines; i++) {
			j_sep(&j);
			j_putstr(r->lines[i]);
		}
		j_close(&j, ']');
		j_close(&j, '}');
	} else {
		for (size_t i = 0; i < r->n_lines; i++) {
			put_text(r->lines[i]);
			putchar('\n');
		}
		printf("reloaded: %u added, %u removed, %u changed, %u "
		       "unchanged, %u refused\n", r->added, r->removed,
		       r->changed, r->unchanged, r->refused);
	}
	/* a refused change is not what the file says: the caller must know */
	ex = r->refused ? EX_DAEMON : EX_OK;
	ctl_response_free(resp);
	return ex;
}

/* flow wait NAME: 0 once it exists, 1 if it did not appear in time. */
static int cmd_wait(const struct opts *o, const char *name)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DescribeFlow d = FLOWMOVER__DESCRIBE_FLOW__INIT;
	Flowmover__Response *resp;
	struct opts w = waiting_opts(o, &d.wait_ms);
	int ex;

	if (!d.wait_ms)
		d.wait_ms = UINT32_MAX; /* no --timeout: 49 days, "forever" */
	d.name = (char *)name;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
	req.describe = &d;
	ex = call(&w, &req, &resp, FLOWMOVER__RESPONSE__BODY_FLOW);
	if (ex)
		return ex;
	if (o->json)
		print_flow(resp->flow, true, NULL);
	else
		printf("flow '%s' exists\n", name);
	ctl_response_free(resp);
	return EX_OK;
}

/* Names of flows, for destroy --all's one JSON document. */
struct names {
	char **v;
	size_t n;
};

static int names_add(struct names *l, const char *name)
{
	char **v = realloc(l->v, (l->n + 1) * sizeof(*v));

	if (!v)
		return -ENOMEM;
	l->v = v;
	if (!(v[l->n] = strdup(name)))
		return -ENOMEM;
	l->n++;
	return 0;
}

static void names_free(struct names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

static void j_names(struct json *j, const char *key, const struct names *l)
{
	j_key(j, key);
	j_open(j, '[');
	for (size_t i = 0; i < l->n; i++) {
		j_sep(j);
		j_putstr(l->v[i]);
	}
	j_close(j, ']');
}

/*
 * One flow of destroy --all on connection s: 0 destroyed, or gone already;
 * 1 skipped, this user may see it but not destroy it (said on stderr);
 * else a negative errno.
 */
static int destroy_one(const struct opts *o, int s, const char *name,
		       struct names *done, struct names *skipped)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__DestroyFlow d = FLOWMOVER__DESTROY_FLOW__INIT;
	Flowmover__Response *resp;
	int rc;

	d.name = (char *)name;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESTROY;
	req.destroy = &d;
	rc = ask(o, s, &req, &resp, FLOWMOVER__RESPONSE__BODY_OK);
	if (rc == -ENOENT)
		return 0; /* destroyed by someone else meanwhile */
	if (rc == -EPERM || rc == -EACCES) {
		fputs("moverctl: flow '", stderr);
		out_text(stderr, name);
		fputs("' skipped: ", stderr);
		out_text(stderr, ask_error());
		fputc('\n', stderr);
		return names_add(skipped, name) ? -ENOMEM : 1;
	}
	if (rc)
		return rc;
	ctl_response_free(resp);
	if (!o->json)
		print_done(o, "destroyed", "destroyed flow", name);
	return names_add(done, name);
}

/* Every flow of one page of the list: 0, or destroy_one's errno. */
static int destroy_page(const struct opts *o, int s,
			const Flowmover__FlowList *page, struct names *done,
			struct names *skipped)
{
	for (size_t i = 0; i < page->n_flows; i++) {
		int rc = destroy_one(o, s, page->flows[i]->name, done, skipped);

		if (rc < 0)
			return rc;
	}
	return 0;
}

/*
 * flow destroy --all: every flow this user may see, page by page.  Flows
 * this user may see but not destroy (another's flow it may attach to) are
 * skipped, said on stderr, and make the exit 4; the others go on.
 */
static int cmd_destroy_all(const struct opts *o)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__ListFlows l = FLOWMOVER__LIST_FLOWS__INIT;
	struct names done = { 0 }, skipped = { 0 };
	char after[CTL_NAME_MAX + 1] = "";
	int s, rc, ex = connect_to(o, &s);

	if (ex)
		return ex;
	req.body_case = FLOWMOVER__REQUEST__BODY_LIST;
	req.list = &l;
	/* the skipped stay listed: each page starts after the last one */
	l.after = after;
	for (;;) {
		Flowmover__Response *resp;
		bool more;

		if ((rc = ask(o, s, &req, &resp, FLOWMOVER__RESPONSE__BODY_LIST)))
			break;
		rc = destroy_page(o, s, resp->list, &done, &skipped);
		more = resp->list->more && resp->list->n_flows;
		if (!rc && more)
			rc = page_after(resp->list, after, sizeof(after));
		ctl_response_free(resp);
		if (rc || !more)
			break;
	}
	close(s);
	if (o->json) {
		struct json j = { 0 };

		j_open(&j, '{');
		j_names(&j, "destroyed", &done);
		j_names(&j, "skipped", &skipped);
		j_close(&j, '}');
	}
	if (rc)
		say_error(rc == -ENOMEM ? "out of memory" : ask_error());
	ex = rc ? exit_code(rc) : skipped.n ? EX_PERM : EX_OK;
	names_free(&done);
	names_free(&skipped);
	return ex;
}

static int cmd_status(const struct opts *o)
{
	struct fmc_map m;
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__GetStatus g = FLOWMOVER__GET_STATUS__INIT;
	Flowmover__Response *resp;
	int ex;

	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &g;
	ex = call(o, &req, &resp, FLOWMOVER__RESPONSE__BODY_STATUS);
	if (ex)
		return ex;
	fmc_map_open(ctl_socket_path(o->socket), &m); /* else m.h == NULL */
	print_status(resp->status, o->json, &m);
	fmc_map_close(&m);
	ctl_response_free(resp);
	return EX_OK;
}

/*
 * A new peer key: 32 bytes from getrandom(2), in a file that must not
 * exist yet (O_EXCL: never overwrite a key in use; O_NOFOLLOW: never
 * write through a planted link), readable by its owner only.  Read back
 * with moverd's own checks, which also give its id.
 */
static int cmd_keygen(const char *path)
{
	uint8_t key[AUTH_KEY_BYTES];
	struct auth_key k;
	char err[512];
	int fd;

	if (auth_init()) {
		fprintf(stderr, "moverctl: keygen: libsodium did not "
			"initialise\n");
		return EX_DAEMON;
	}
	if (getrandom(key, sizeof(key), 0) != (ssize_t)sizeof(key)) {
		fprintf(stderr, "moverctl: keygen: getrandom: %s\n",
			strerror(errno));
		return EX_DAEMON;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		  0600);
	if (fd < 0) {
		fprintf(stderr, "moverctl: keygen: %s: %s%s\n", path,
			strerror(errno), errno == EEXIST ?
			" (a key is never overwritten; remove it first)" : "");
		return errno == EACCES ? EX_PERM : EX_DAEMON;
	}
	if (write(fd, key, sizeof(key)) != (ssize_t)sizeof(key) || fsync(fd)) {
		fprintf(stderr, "moverctl: keygen: %s: %s\n", path,
			strerror(errno));
		close(fd);
		unlink(path);
		return EX_DAEMON;
	}
	close(fd);
	explicit_bzero(key, sizeof(key));
	if (auth_load_key(path, &k, err, sizeof(err))) {
		fprintf(stderr, "moverctl: keygen: %s\n", err);
		return EX_DAEMON;
	}
	printf("%s: key id %s\n", path, k.id);
	auth_forget(&k);
	return EX_OK;
}

/* ---- main ------------------------------------------------------------------- */

enum {
	OPT_RING_SIZE = 256,
	OPT_MAX_RECORD,
	OPT_PEER,
	OPT_ALLOW_UID,
	OPT_ALLOW_GID,
	OPT_MAX_LAG,
	OPT_UID,
	OPT_GID,
	OPT_DRAIN,
	OPT_ALL,
	OPT_ONCE,
};

static const struct option long_opts[] = {
	{ "socket",     required_argument, NULL, 's' },
	{ "json",       no_argument,       NULL, 'j' },
	{ "timeout",    required_argument, NULL, 't' },
	{ "help",       no_argument,       NULL, 'h' },
	{ "version",    no_argument,       NULL, 'V' },
	{ "ring-size",  required_argument, NULL, OPT_RING_SIZE },
	{ "max-record", required_argument, NULL, OPT_MAX_RECORD },
	{ "peer",       required_argument, NULL, OPT_PEER },
	{ "max-lag",    required_argument, NULL, OPT_MAX_LAG },
	{ "allow-uid",  required_argument, NULL, OPT_ALLOW_UID },
	{ "allow-gid",  required_argument, NULL, OPT_ALLOW_GID },
	{ "uid",        required_argument, NULL, OPT_UID },
	{ "gid",        required_argument, NULL, OPT_GID },
	{ "drain",      no_argument,       NULL, OPT_DRAIN },
	{ "all",        no_argument,       NULL, OPT_ALL },
	{ "once",       no_argument,       NULL, OPT_ONCE },
	{ NULL, 0, NULL, 0 },
};

/* Output that never reached stdout (a full disk, a closed pipe) is a
 * failure: the caller would read a list that is not all there. */
static int finish(int ex)
{
	int err = fflush(stdout) ? errno : 0;

	if (!err && !ferror(stdout))
		return ex;
	fprintf(stderr, "moverctl: cannot write the output%s%s\n",
		err ? ": " : "", err ? strerror(err) : "");
	return ex ? ex : EX_DAEMON;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	int c, rc;

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":s:jt:hV", long_opts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!*optarg)
				return usage_error("--socket: empty path");
			o->socket = optarg;
			break;
		case 'j':
			o->json = true;
			break;
		case 't': {
			char *end;
			long v;

			errno = 0;
			v = strtol(optarg, &end, 10);
			if (*optarg < '0' || *optarg > '9' || *end || errno ||
			    v > INT32_MAX)
				return usage_error("--timeout '%s': use a number "
						   "of milliseconds", optarg);
			o->timeout_ms = v ? (int)v : -1;
			o->timeout_set = true;
			break;
		}
		case OPT_DRAIN:
			o->drain = true;
			break;
		case OPT_ALL:
			o->all = true;
			break;
		case 'h':
			fputs(usage_text, stdout);
			exit(finish(EX_OK));
		case 'V':
			printf("moverctl %s\n", FLOWMOVER_VERSION);
			exit(finish(EX_OK));
		case OPT_RING_SIZE:
			o->create_opts = true;
			if ((rc = parse_size("--ring-size", optarg,
					     &o->ring_size)))
				return rc;
			break;
		case OPT_MAX_RECORD:
			o->create_opts = true;
			if ((rc = parse_size("--max-record", optarg,
					     &o->max_record)))
				return rc;
			if (o->max_record > UINT32_MAX)
				return usage_error("--max-record %s: at most "
						   "%" PRIu32 " bytes", optarg,
						   UINT32_MAX);
			break;
		case OPT_PEER:
			o->create_opts = true;
			if ((rc = check_peer(optarg)))
				return rc;
			if (!o->peer) {
				o->peer = optarg;
				break;
			}
			if (o->n_more_peers == 7)
				return usage_error("at most 8 --peer options");
			o->more_peers[o->n_more_peers++] = optarg;
			break;
		case OPT_MAX_LAG:
			o->create_opts = true;
			if ((rc = parse_size("--max-lag", optarg, &o->max_lag)))
				return rc;
			break;
		case OPT_ALLOW_UID:
		case OPT_ALLOW_GID: {
			bool g = c == OPT_ALLOW_GID;
			size_t *n = g ? &o->n_gids : &o->n_uids;

			o->create_opts = true;
			if (*n == MAX_IDS)
				return usage_error("at most %d --allow-%cid "
						   "options", MAX_IDS,
						   g ? 'g' : 'u');
			if ((rc = parse_id(g ? "--allow-gid" : "--allow-uid",
					   optarg, g,
					   g ? &o->gids[*n] : &o->uids[*n])))
				return rc;
			(*n)++;
			break;
		}
		case OPT_UID:
		case OPT_GID: {
			bool g = c == OPT_GID;
			size_t *n = g ? &o->n_acl_gids : &o->n_acl_uids;

			o->acl_opts = true;
			if (*n == MAX_IDS)
				return usage_error("at most %d --%cid options",
						   MAX_IDS, g ? 'g' : 'u');
			if ((rc = parse_id(g ? "--gid" : "--uid", optarg, g,
					   g ? &o->acl_gids[*n] :
					       &o->acl_uids[*n])))
				return rc;
			(*n)++;
			break;
		}
		case OPT_ONCE:
			o->once = true;
			break;
		case ':':
			return usage_error("option '%s' needs a value",
					   argv[optind - 1]);
		default:
			if (optopt)
				return usage_error("unknown option '-%c'",
						   optopt);
			return usage_error("unknown option '%s'",
					   argv[optind - 1]);
		}
	}
	return 0;
}

static int need_args(int n, int want, const char *what)
{
	if (n < want)
		return usage_error("%s: missing flow NAME", what);
	if (n > want)
		return usage_error("%s: unexpected argument(s)", what);
	return 0;
}

static int check_name_arg(const char *name)
{
	if (!ctl_name_valid(name))
		return usage_error("invalid flow name '%s': use 1 to 64 of "
				   "A-Z a-z 0-9 . _ -", name);
	return 0;
}

static int run(int argc, char **argv)
{
	struct opts o = { .timeout_ms = CTL_DEFAULT_TIMEOUT_MS };
	char **args;
	int n, rc;

	if ((rc = parse_opts(argc, argv, &o)))
		return rc;
	args = argv + optind;
	n = argc - optind;
	if (n == 0) {
		fputs(usage_text, stderr);
		return EX_USAGE;
	}
	if (!strcmp(args[0], "help")) {
		fputs(usage_text, stdout);
		return EX_OK;
	}
	if (o.create_opts && !(n >= 2 && !strcmp(args[0], "flow") &&
			       !strcmp(args[1], "create")))
		return usage_error("--ring-size, --max-record, --peer, --max-lag "
				   "and --allow-uid/gid go with 'flow create'");
	if (o.acl_opts && !(n >= 2 && !strcmp(args[0], "flow") &&
			    (!strcmp(args[1], "allow") ||
			     !strcmp(args[1], "disallow"))))
		return usage_error("--uid and --gid go with 'flow allow' and "
				   "'flow disallow'");
	if (o.once && strcmp(args[0], "top"))
		return usage_error("--once goes with 'top'");
	if ((o.drain || o.all) && !(n >= 2 && !strcmp(args[0], "flow") &&
				    !strcmp(args[1], "destroy")))
		return usage_error("--drain and --all go with 'flow destroy'");
	if (!strcmp(args[0], "keygen")) {
		if (n != 2)
			return usage_error("keygen: use keygen FILE");
		return cmd_keygen(args[1]);
	}
	if (!strcmp(args[0], "status")) {
		if (n > 1)
			return usage_error("status: unexpected argument '%s'",
					   args[1]);
		return cmd_status(&o);
	}
	if (!strcmp(args[0], "reload")) {
		if (n > 1)
			return usage_error("reload: unexpected argument '%s'",
					   args[1]);
		return cmd_reload(&o);
	}
	if (!strcmp(args[0], "top")) {
		if (n > 1)
			return usage_error("top: unexpected argument '%s'",
					   args[1]);
		return top_main(ctl_socket_path(o.socket), o.once, o.json);
	}
	if (strcmp(args[0], "flow"))
		return usage_error("unknown command '%s'", args[0]);
	if (n < 2)
		return usage_error("flow: missing subcommand (create, destroy, "
				   "end, list, show, allow, disallow)");
	if (!strcmp(args[1], "list")) {
		if (n > 2)
			return usage_error("flow list: unexpected argument "
					   "'%s'", args[2]);
		return cmd_list(&o);
	}
	if (!strcmp(args[1], "create")) {
		if ((rc = need_args(n, 3, "flow create")) ||
		    (rc = check_name_arg(args[2])))
			return rc;
		return cmd_create(&o, args[2]);
	}
	if (!strcmp(args[1], "destroy") && o.all) {
		if (n > 2 || o.drain)
			return usage_error("flow destroy --all: no NAME, no "
					   "--drain");
		return cmd_destroy_all(&o);
	}
	if (!strcmp(args[1], "wait")) {
		if ((rc = need_args(n, 3, "flow wait")) ||
		    (rc = check_name_arg(args[2])))
			return rc;
		return cmd_wait(&o, args[2]);
	}
	if (!strcmp(args[1], "peer")) {
		bool add = n >= 3 && !strcmp(args[2], "add");

		if (n != 5 || (!add && strcmp(args[2], "remove")))
			return usage_error("flow peer: use flow peer add|remove "
					   "NAME HOST:PORT");
		if ((rc = check_name_arg(args[3])) || (rc = check_peer(args[4])))
			return rc;
		return cmd_peer(&o, args[3], args[4], !add);
	}
	if (!strcmp(args[1], "destroy")) {
		if ((rc = need_args(n, 3, "flow destroy")) ||
		    (rc = check_name_arg(args[2])))
			return rc;
		return cmd_destroy(&o, args[2]);
	}
	if (!strcmp(args[1], "end")) {
		if ((rc = need_args(n, 3, "flow end")) ||
		    (rc = check_name_arg(args[2])))
			return rc;
		return cmd_end(&o, args[2]);
	}
	if (!strcmp(args[1], "show")) {
		if ((rc = need_args(n, 3, "flow show")) ||
		    (rc = check_name_arg(args[2])))
			return rc;
		return cmd_show(&o, args[2]);
	}
	if (!strcmp(args[1], "allow") || !strcmp(args[1], "disallow")) {
		bool remove = args[1][0] == 'd';

		if ((rc = need_args(n, 3, remove ? "flow disallow" :
						   "flow allow")) ||
		    (rc = check_name_arg(args[2])))
			return rc;
		return cmd_allow(&o, args[2], remove);
	}
	return usage_error("flow: unknown subcommand '%s'", args[1]);
}

int main(int argc, char **argv)
{
	return finish(run(argc, argv));
}
