/*
 * moverd/declared.h - flows declared in moverd's config file.
 *
 *   flow = NAME [ring-size=N] [max-record=N] [peer=HOST:PORT]...
 *               [max-lag=N] [allow-uid=ID[,ID...]] [allow-gid=ID[,ID...]]
 *               [from=NET[,NET...]]
 *
 * (the spellings of `moverctl flow create`; moverd.conf(5)).  Declared
 * flows are created at start, owned by moverd's own user, and kept as
 * declared: a reload (`moverctl reload`, SIGHUP) creates the flows added
 * to the file, destroys the declared flows taken out of it if idle (one in
 * use stays, undeclared: its records are not moverd's to drop), changes
 * the allowed ids in place where only they changed, re-creates a flow
 * whose declaration changed otherwise if it is idle (nothing unread on its
 * peer hosts either) and the new declaration passes a create's checks
 * (refuses, with a log line, if not), and touches nothing else: neither
 * the flows whose declaration did not change nor any flow moverctl
 * created.  Several peer= make a
 * flow to several peer hosts (fan-out): a reload that changes only the
 * peers after the first adds and removes those (as `flow peer add` /
 * `remove`), leaving the flow and its other subscribers alone.
 *
 * A declaration whose peer is this moverd's own --listen address is the
 * receiving end of a flow between hosts (so one file serves a whole
 * fleet): nothing is created here (the sender's moverd opens it), and its
 * allow-uid / allow-gid are granted on the flow once it exists (a changed
 * declaration takes the ids the old one named off it).  Its from= names
 * the addresses (or networks) of the hosts that may send it: an open from
 * any other is refused (declared_admit), the first one's included, which
 * would otherwise bind the name to itself.  Elsewhere from= means nothing
 * (the same line serves the sending hosts).
 */
#ifndef MOVERD_DECLARED_H
#define MOVERD_DECLARED_H

#include "fanout.h"
#include "flows.h"
#include "peer_allow.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct peer_mgr;
struct ctl_server;
struct declared_report;

/* Declarations in one file at most (a reload re-reads them all). */
#define DECLARED_MAX 4096
/* Networks in one from= */
#define DECLARED_FROM_MAX 8u

struct declared_flow {
	char name[FLOW_NAME_MAX + 1];
	uint64_t ring_size;      /* 0: the daemon's default */
	uint32_t max_record;     /* 0: the daemon's default */
	char peer[80];           /* "" = a local flow */
	char more[FANOUT_MAX_PEERS - 1][80]; /* the peers after the first */
	unsigned n_more;
	uint64_t max_lag;        /* 0: lossless */
	struct flow_ids ids;
	bool receiver;           /* peer is our own --listen address */
	struct peer_net from[DECLARED_FROM_MAX]; /* who may send it */
	unsigned n_from;         /* 0: any peer (the first binds it) */
	char from_text[160];     /* from= as written, for messages */
	int line;
};

struct declared_set {
	struct declared_flow *v;
	unsigned n;
	unsigned *by_name; /* v's indexes in name order (NULL: look through
			    * v); `flow list` asks once per flow */
};

struct declared {
	char path[PATH_MAX];     /* the config file ("" = none) */
	char listen[80];         /* moverd's --listen, for receiving ends */
	uid_t uid;               /* owner of the flows it creates */
	gid_t gid;
	struct flow_table *flows;
	struct peer_mgr *peers;
	struct ctl_server *ctl;
	struct declared_set cur; /* as applied */
	/* main.c's check of the file's option lines at a reload (NULL:
	 * none), off the loop (the reload thread: a user or group name
	 * asks NSS): 0, or -1 with why in err, which refuses the reload; it
	 * notes in the report the options changed since the start (they
	 * take effect at a restart) */
	int (*check_options)(void *arg, const char *path,
			     struct declared_report *r, char *err, size_t cap);
	/* main.c's files a reload reads again, with a config or without
	 * (the metrics token; NULL: none), off the loop too: 1 read into
	 * *files, 0 none to read, or -1 with why in err, which refuses the
	 * reload ... */
	int (*reread)(void *arg, void **files, char *err, size_t cap);
	/* ... and, on the loop, what it read put to use (said in r), then
	 * freed; r NULL: only freed (the reload was refused) */
	void (*reread_use)(void *arg, void *files, struct declared_report *r);
	void *check_arg;
};

/* What an apply did (ReloadResult in flowmover.proto), its lines in a
 * buffer of the caller's, one '\n'-separated sentence each. */
struct declared_report {
	unsigned added, removed, changed, unchanged, refused;
	char *text;
	size_t cap, len;
};

/* A size as the config file and moverd's options write it: digits, then
 * K, M or G (powers of 1024); no sign, no wrap past 2^64.  0 or -1. */
int declared_parse_size(const char *s, uint64_t *out);

/*
 * Read the flow lines of a config file into *out (other lines are
 * main.c's).  0, or -1 with "FILE:LINE: what is wrong" in err.  listen
 * marks the receiving ends.  A file that anyone but root and moverd's
 * user may write (its owner, or mode g+w, o+w) is refused: it says what
 * moverd creates and grants.
 */
int declared_read(const char *path, const char *listen,
		  struct declared_set *out, char *err, size_t cap);

void declared_set_free(struct declared_set *s);

/*
 * Apply next over what was applied (d->cur, empty at start); d->cur
 * becomes what is declared now (a refused change keeps the old
 * declaration, with what was done of the new one before the refusal, so
 * that the next reload compares against what the flow has).  Takes
 * next's contents.
 */
void declared_apply(struct declared *d, struct declared_set *next,
		    struct declared_report *r);

/* One line of the report (and the log), for main.c's option lines. */
void declared_note(struct declared_report *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * A reload in two halves (reload.h runs them): what can block (reading
 * the file, NSS for user and group names) off the loop, then the applying
 * on it.  The reading is sized here, its report lines included (a frame
 * of ReloadResult holds 16 KiB of them; the log has every line).
 */
struct declared_reading {
	int rc;                   /* 0, or -EINVAL (nothing changes) / -ENOENT
				   * (started without --config, and no file
				   * an option names to read again) */
	char err[512];            /* why, when rc */
	bool have_flows;          /* next holds the config's flow lines */
	struct declared_set next;
	void *files;              /* reread's (NULL: none read) */
	struct declared_report r; /* its lines in text */
	char text[16384];
};

/* Read the file again (its path as given: a symlink is followed anew)
 * and check its option lines (check_options), or, without a config, the
 * files reread reads; into *rd.  Any thread: it reads only what does not
 * change after the start (d's path and listen, the hooks). */
void declared_reload_read(const struct declared *d,
			  struct declared_reading *rd);

/* On the loop: apply what rd read (its flow lines, reread_use), adding to
 * rd->r; a refused reading only logged.  rd->rc.  Frees what rd holds. */
int declared_reload_apply(struct declared *d, struct declared_reading *rd);

/* Free what rd holds, applying nothing (any thread: a reload the stop
 * overtook). */
void declared_reload_drop(const struct declared *d,
			  struct declared_reading *rd);

/* Is f declared here (flow show)? */
bool declared_has(const struct declared *d, const struct flow *f);

/*
 * How an existing flow differs from a create request: NULL if it does
 * not (same ring size and max record after defaults, same peer, same
 * other peers as a set, same max lag, same allowed ids as sets), else the first parameter that differs, with both
 * values, in why.
 */
const char *declared_differs(const struct flow_table *t, const struct flow *f,
			     const struct flow_spec *s, char *why, size_t cap);

/*
 * peer_mgr's admit hook (arg: the struct declared): may the peer at host
 * (its address) open receiver flow name?  0 unless name is a receiving
 * end whose from= does not name host: -EACCES with why in err.
 */
int declared_admit(void *arg, const char *name, const char *host, char *err,
		   size_t cap);

/* A receiving end's grants, on a receiver flow that has just come (the
 * sender's moverd opened it: flows_create's hook).  Once per flow: ids an
 * operator disallowed afterwards stay disallowed until the declaration
 * changes. */
void declared_grant(struct declared *d, struct flow *f);

#endif
