/*
 * moverd - the flowmover daemon.  Owns every ring and (later) every network
 * resource; applications and moverctl talk to it over the control socket.
 *
 * Start-up order: options (config file, then command line), daemonize
 * unless --foreground, take the daemon locks (one moverd per socket and per
 * state directory), open the control socket, run the io_uring loop until
 * SIGTERM/SIGINT, then close every flow (clients see -EPIPE), every client
 * and the socket.
 */
#include "auth.h"
#include "control.h"
#include "declared.h"
#include "reload.h"
#include "counters.h"
#include "cpus.h"
#include "fanout.h"
#include "flows.h"
#include "idle.h"
#include "lattrace.h"
#include "log.h"
#include "metrics_http.h"
#include "loop.h"
#include "mover.h"
#include "notify.h"
#include "peer.h"
#include "peer_allow.h"
#include "private_dir.h"
#include "ring_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/flowmover/moverd.sock"

struct options {
	char socket[PATH_MAX];
	char state_dir[256];
	char listen[80];
	char transport[8];
	char doorbell[8];
	uint64_t poll_ns;         /* keep polling this long after work */
	enum idle_mode idle;      /* --idle */
	enum loop_mode uring;     /* --io-uring */
	mode_t socket_mode;
	bool foreground;
	bool use_syslog;
	enum log_level level;
	struct flow_limits limits;
	char peer_key[PATH_MAX];  /* --peer-key FILE, "" = none */
	struct peer_allow allow;  /* --peer-allow, n = 0: anyone */
	struct peer_reach reach;  /* --peer-reachable-at, n = 0: none */
	bool insecure_peers;      /* --insecure-peers */
	/* connection floods (docs/security-edges.md) */
	unsigned peer_per_addr, peer_pending, peer_inbound, peer_hello_s;
	/* outbound peers (docs/security-quota.md) */
	unsigned peer_hosts, peer_hosts_per_uid;
	unsigned peer_connect_s;  /* --peer-connect-timeout */
	unsigned window_delay_us; /* --window-delay-us */
	unsigned max_clients, max_per_uid;
	char config[PATH_MAX];    /* --config, made absolute, not resolved
				   * ("" = none) */
	char metrics[80];         /* --metrics HOST:PORT, "" = none */
	char metrics_token[PATH_MAX]; /* --metrics-token FILE, "" = none */
	char cpus_list[64];       /* --cpus as given, "" = any cpu */
	cpu_set_t cpus;           /* --cpus parsed */
};

/* long options without a short letter */
enum {
	OPT_PEER_PER_ADDR = 256,
	OPT_PEER_PENDING,
	OPT_PEER_INBOUND,
	OPT_PEER_HELLO,
	OPT_WINDOW_DELAY,
	OPT_MAX_CLIENTS,
	OPT_MAX_PER_UID,
	OPT_UID_FLOWS,
	OPT_UID_BYTES,
	OPT_UID_RATE,
	OPT_PEER_FLOWS,
	OPT_PEER_BYTES,
	OPT_PEER_RATE,
	OPT_RESERVE,
	OPT_ORPHAN,
	OPT_PEER_OWNER,
	OPT_METRICS,
	OPT_METRICS_TOKEN,
	OPT_PEER_REACH,
	OPT_IDLE,
	OPT_IO_URING,
	OPT_CPUS,
	OPT_PEER_HOSTS,
	OPT_PEER_HOSTS_UID,
	OPT_PEER_CONNECT,
};

/* The option lines of the config, as written (read_config), the last of
 * each name. */
#define CONF_OPTS_MAX 128
struct conf_opts {
	unsigned n;
	char name[CONF_OPTS_MAX][40];
	char val[CONF_OPTS_MAX][1024];
};

struct daemon {
	struct options opt;
	struct loop loop;
	struct flow_table flows;
	struct ctl_server ctl;
	struct peer_mgr peers;
	struct idle idle;         /* the duty cycle's idle strategy */
	struct loop_op sig_op;
	int sig_fd;
	struct signalfd_siginfo si;
	int lock_fd;              /* SOCKET.lock */
	int state_lock_fd;        /* STATE_DIR/moverd.lock */
	int run_fd;               /* the socket's directory */
	int state_fd;             /* --state-dir */
	struct auth_key key;      /* loaded from opt.peer_key */
	bool have_key;
	struct declared declared; /* the config's flows */
	struct reloader reload;   /* a reload's reading, off the loop */
	struct declared_set declared_at_start;
	struct conf_opts conf_at_start; /* the config's option lines */
	struct counters ctr;      /* SOCKET.counters (counters.h) */
	struct metrics_http *metrics; /* --metrics */
	struct auth_token metrics_token; /* opt.metrics_token at the start
					  * (a reload's goes to the server) */
};

static void usage(FILE *out)
{
	fprintf(out,
"usage: moverd [options]\n"
"  --socket PATH            control socket (env FLOWMOVER_SOCKET; default\n"
"                           " DEFAULT_SOCKET "); its directory (made 0755\n"
"                           if missing) and every one above it must be\n"
"                           root's or moverd's, not a symlink, and writable\n"
"                           by no one else (above it: or root's and sticky,\n"
"                           like /tmp), else moverd refuses to start\n"
"  --socket-mode OCTAL      permissions of the socket (default 0660), set\n"
"                           before it accepts connections\n"
"  --config FILE            read 'option = value' lines (same names as flags)\n"
"                           and flow declarations: 'flow = NAME\n"
"                           [ring-size=N] [max-record=N] [peer=HOST:PORT]...\n"
"                           [max-lag=N]\n"
"                           [allow-uid=ID,...] [allow-gid=ID,...]\n"
"                           [from=NET,...]' (a receiving end: who may send),\n"
"                           created at start; SIGHUP or moverctl reload\n"
"                           applies the flow lines again (moverd.conf(5))\n"
"  --listen HOST:PORT       accept peer daemons (flows from other hosts), over\n"
"                           TCP and, where a device exists, RDMA (rdma_cm)\n"
"  --peer-key FILE          the key peer daemons must prove (both ways) before\n"
"                           any flow: 32 random bytes, a regular file of\n"
"                           root or moverd's user, mode 0600 or stricter,\n"
"                           not a symlink (moverctl keygen FILE, or\n"
"                           head -c32 /dev/urandom > FILE; chmod 600 FILE).\n"
"                           The same file on every host of a cluster (or\n"
"                           one per pair).  Default: none\n"
"  --peer-allow CIDR[,...]  addresses that may connect as peers at all,\n"
"                           e.g. 10.0.0.0/8,fd00::/8 (at most 64; checked\n"
"                           at accept, over TCP and RDMA).  Default: any\n"
"                           (the key decides)\n"
"  --peer-reachable-at IP:PORT[,...]\n"
"                           with --peer-key: addresses peers dial to reach\n"
"                           this daemon besides the one a connection arrives\n"
"                           at (NAT, port forwarding; at most 8, numeric).\n"
"                           The handshake binds the address the initiator\n"
"                           dialed, so a relay elsewhere fails.  Default:\n"
"                           none\n"
"  --insecure-peers         allow --listen on a non-loopback address without\n"
"                           --peer-key: any host that reaches the port can\n"
"                           open flows here.  Default: refused\n"
"  --transport T            to peers: auto (RDMA where a device exists, the\n"
"                           default), rdma or tcp\n"
"  --doorbell D             how an idle mover learns of new records: auto\n"
"                           (io_uring FUTEX_WAITV on Linux 6.7+, else a\n"
"                           futex_waitv thread; the default), thread or poll\n"
"                           (every millisecond)\n"
"  --idle MODE              what the mover does when a cycle finds no work:\n"
"                           adaptive (the default: keep polling, yielding\n"
"                           the cpu, across the gaps it has been seeing\n"
"                           between records, up to 200 us; sleep at once\n"
"                           when records are sparser or the host is idle),\n"
"                           sleep (always sleep at once: the least cpu),\n"
"                           yield (poll with sched_yield, never sleep: low\n"
"                           latency for most of a cpu per daemon) or spin\n"
"                           (the same without yielding: for a host with\n"
"                           cores to spare)\n"
"  --poll-us N              keep polling for N us after the last work before\n"
"                           sleeping, whatever the gaps (fixes adaptive's\n"
"                           window; bounds yield and spin)\n"
"  --io-uring MODE          setup of moverd's io_uring: auto (the default:\n"
"                           defer on Linux 6.1+, else plain), defer\n"
"                           (SINGLE_ISSUER + DEFER_TASKRUN), coop\n"
"                           (COOP_TASKRUN), plain (no flags) or sqpoll (a\n"
"                           kernel thread submits); figures in\n"
"                           moverd/README.md\n"
"  --window-delay-us N      queueing delay, above a peer link's least round\n"
"                           trip, at which its connection window is cut\n"
"                           (10 us to 10 s; default 1000): smaller keeps a\n"
"                           sparse flow's records from waiting behind busy\n"
"                           flows' for bulk throughput (moverd/README.md)\n"
"  --cpus LIST              run every thread of moverd on these cpus only\n"
"                           (as taskset: 0,2-3).  With --idle yield, two\n"
"                           daemons on one host with yielding clients do\n"
"                           best with the daemons on one cpu, the clients\n"
"                           on another; a spinning daemon needs a cpu of\n"
"                           its own (docs/performance.md).  Default: any\n"
"                           cpu\n"
"  --state-dir DIR          the ring file of every flow, re-adopted after a\n"
"                           crash or an orderly stop; on a tmpfs (the\n"
"                           default) flows do not survive a reboot\n"
"                           (default: SOCKET's dir/rings;\n"
"                           made 0700 if missing; the same rule as the\n"
"                           socket's directory).  Files there that are\n"
"                           links, not moverd's or writable by others, or\n"
"                           do not parse, are not re-adopted\n"
"  --foreground, -f         do not daemonize; log to stderr\n"
"  --syslog                 log to syslog (the default when daemonized)\n"
"  --log-level LEVEL        error, warn, info (default) or debug\n"
"  --default-ring-size N    ring size of flows that do not say (default 4M)\n"
"  --default-max-record N   max record of flows that do not say (default 64K)\n"
"  --max-ring-size N        largest ring a client may ask for (default 1G)\n"
"  --max-flows N            flows in all, destroyed ones I/O still holds\n"
"                           included (default 16384; each holds a ring fd)\n"
"  --peer-flow-owner USER[:GROUP]\n"
"                           who owns, on this host, a flow a peer opens here\n"
"                           (names or numbers; default root: only root may\n"
"                           attach until `moverctl flow allow` grants more).\n"
"                           With GROUP, its members may attach too.  The\n"
"                           owner and allowed ids the sending host names are\n"
"                           never used: uids are host-local numbers\n"
"  --max-flows-per-uid N    flows a non-root user may own (default 64)\n"
"  --max-ring-bytes-per-uid N\n"
"                           ring bytes a non-root user may own (default 4G)\n"
"  --max-ring-rate-per-uid N\n"
"                           ring bytes a non-root user may create a second\n"
"                           (default 64M; 0 = no limit): creating and\n"
"                           destroying a ring stalls every flow meanwhile.\n"
"                           --max-ring-size (at least 1G) may be created at\n"
"                           once; beyond, flow create fails with EAGAIN and\n"
"                           says when to try again\n"
"  --peer-max-flows N       flows one peer host may open here (default 64)\n"
"  --peer-max-ring-bytes N  ring bytes one peer host may make this host\n"
"                           allocate (default 4G)\n"
"  --peer-max-ring-rate N   ring bytes one peer host may make this host create\n"
"                           a second (default 64M; 0 = no limit); its opens\n"
"                           beyond are answered busy, and retried\n"
"  --state-dir-reserve PCT  refuse a ring file that would leave the state\n"
"                           dir's filesystem less than PCT%% free (default 10)\n"
"  --orphan-timeout S       destroy a receiver flow whose sender has not come\n"
"                           back for S seconds (default 21600 = 6 h; 0 = never)\n"
"  --max-clients N          control connections in all (default 1024); the\n"
"                           last 16 are kept for root\n"
"  --max-clients-per-uid N  control connections of one uid other than root\n"
"                           (default 64)\n"
"  --peer-max-conns-per-addr N\n"
"                           inbound peer connections from one address\n"
"                           (default 8); more are closed at accept\n"
"  --peer-max-pending N     inbound peer connections that have not said\n"
"                           hello yet (default 64); more are closed at accept\n"
"  --peer-max-inbound N     inbound peer connections in all (default 512);\n"
"                           more are closed at accept\n"
"  --peer-hello-timeout S   seconds an inbound peer has to say hello\n"
"                           (default 10); heartbeats do not count\n"
"  --peer-max-hosts N       peer daemons this one connects to, for its flows\n"
"                           (default 256); the last 16 are kept for root.\n"
"                           A connection closes 5 s after its last flow\n"
"  --peer-max-hosts-per-uid N\n"
"                           peer daemons the flows of one uid other than\n"
"                           root may make this one connect to (default 32)\n"
"  --peer-connect-timeout S seconds a connect to a peer (TCP or RDMA) may take\n"
"                           (default 10); then it fails, the flows say so\n"
"                           and it is retried\n"
"  --metrics HOST:PORT      serve the counters (SOCKET.counters, readable by\n"
"                           moverd's group) as Prometheus text at\n"
"                           http://HOST:PORT/metrics, from a thread of its\n"
"                           own; anyone who reaches it sees every flow's\n"
"                           name (on loopback: every local user): keep it\n"
"                           on a management network, or ask a token.\n"
"                           Default: off\n"
"  --metrics-token FILE     serve /metrics only to requests that show the\n"
"                           token in FILE (one line, 16-512 printable\n"
"                           characters; mode 0600, owned by root or\n"
"                           moverd's user) as `Authorization: Bearer ...`;\n"
"                           others get 401; a reload reads FILE again.\n"
"                           Prometheus: authorization: credentials_file:\n"
"                           a copy of FILE\n"
"  --version, --help\n"
"Sizes take K, M or G suffixes (powers of 1024).\n");
}

static const struct option long_opts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "socket-mode", required_argument, NULL, 'm' },
	{ "config", required_argument, NULL, 'c' },
	{ "listen", required_argument, NULL, 'L' },
	{ "transport", required_argument, NULL, 'T' },
	{ "doorbell", required_argument, NULL, 'B' },
	{ "poll-us", required_argument, NULL, 'P' },
	{ "idle", required_argument, NULL, OPT_IDLE },
	{ "io-uring", required_argument, NULL, OPT_IO_URING },
	{ "cpus", required_argument, NULL, OPT_CPUS },
	{ "state-dir", required_argument, NULL, 'D' },
	{ "foreground", no_argument, NULL, 'f' },
	{ "syslog", no_argument, NULL, 'S' },
	{ "log-level", required_argument, NULL, 'l' },
	{ "default-ring-size", required_argument, NULL, 'r' },
	{ "default-max-record", required_argument, NULL, 'x' },
	{ "max-ring-size", required_argument, NULL, 'R' },
	{ "max-flows", required_argument, NULL, 'F' },
	{ "peer-flow-owner", required_argument, NULL, OPT_PEER_OWNER },
	{ "max-flows-per-uid", required_argument, NULL, OPT_UID_FLOWS },
	{ "max-ring-bytes-per-uid", required_argument, NULL, OPT_UID_BYTES },
	{ "max-ring-rate-per-uid", required_argument, NULL, OPT_UID_RATE },
	{ "peer-max-flows", required_argument, NULL, OPT_PEER_FLOWS },
	{ "peer-max-ring-bytes", required_argument, NULL, OPT_PEER_BYTES },
	{ "peer-max-ring-rate", required_argument, NULL, OPT_PEER_RATE },
	{ "state-dir-reserve", required_argument, NULL, OPT_RESERVE },
	{ "orphan-timeout", required_argument, NULL, OPT_ORPHAN },
	{ "max-clients", required_argument, NULL, OPT_MAX_CLIENTS },
	{ "max-clients-per-uid", required_argument, NULL, OPT_MAX_PER_UID },
	{ "peer-max-conns-per-addr", required_argument, NULL, OPT_PEER_PER_ADDR },
	{ "peer-max-pending", required_argument, NULL, OPT_PEER_PENDING },
	{ "peer-max-inbound", required_argument, NULL, OPT_PEER_INBOUND },
	{ "peer-hello-timeout", required_argument, NULL, OPT_PEER_HELLO },
	{ "peer-max-hosts", required_argument, NULL, OPT_PEER_HOSTS },
	{ "peer-max-hosts-per-uid", required_argument, NULL, OPT_PEER_HOSTS_UID },
	{ "peer-connect-timeout", required_argument, NULL, OPT_PEER_CONNECT },
	{ "window-delay-us", required_argument, NULL, OPT_WINDOW_DELAY },
	{ "peer-key", required_argument, NULL, 'K' },
	{ "peer-allow", required_argument, NULL, 'A' },
	{ "insecure-peers", no_argument, NULL, 'I' },
	{ "metrics", required_argument, NULL, OPT_METRICS },
	{ "metrics-token", required_argument, NULL, OPT_METRICS_TOKEN },
	{ "peer-reachable-at", required_argument, NULL, OPT_PEER_REACH },
	{ "version", no_argument, NULL, 'V' },
	{ "help", no_argument, NULL, 'h' },
	{ 0 }
};

static const char *option_name(int key)
{
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == key)
			return o->name;
	return "?";
}

/* A user or group id: a number, else a name (at start-up only: it may ask
 * NSS); false if there is no such user or group. */
static bool parse_id(const char *s, bool group, uint32_t *id, gid_t *pw_gid)
{
	unsigned long v;
	char *end;

	if (*s >= '0' && *s <= '9') {
		errno = 0;
		v = strtoul(s, &end, 10);
		*id = (uint32_t)v;
		return !*end && !errno && v < UINT32_MAX;
	}
	if (group) {
		struct group *g = getgrnam(s);

		*id = g ? (uint32_t)g->gr_gid : 0;
		return g != NULL;
	} else {
		struct passwd *pw = getpwnam(s);

		*id = pw ? (uint32_t)pw->pw_uid : 0;
		*pw_gid = pw ? pw->pw_gid : 0;
		return pw != NULL;
	}
}

/* --peer-flow-owner USER[:GROUP].  USER alone: the user's login group
 * (root's for a number without a passwd entry) is the flow's group, for
 * `flow show`; with GROUP, its members may attach too. */
static int parse_owner(struct flow_limits *l, const char *val)
{
	char user[256];
	const char *colon = strchr(val, ':');
	uint32_t uid, gid;
	gid_t pw_gid = 0;

	snprintf(user, sizeof(user), "%.*s", colon ? (int)(colon - val) : 255,
		 val);
	if (!*user || !parse_id(user, false, &uid, &pw_gid) ||
	    (colon && !parse_id(colon + 1, true, &gid, NULL)))
		return -1;
	l->peer_flow_uid = uid;
	l->peer_flow_gid = colon ? gid : pw_gid;
	l->peer_flow_group = colon != NULL;
	return 0;
}

/* The option helpers below say what is wrong on msg: stderr at start, a
 * reload's buffer (check_config). */
static int peer_reach_option(struct options *o, const char *val, FILE *msg)
{
	char err[160];

	if (!peer_reach_parse(val, &o->reach, err, sizeof(err)))
		return 0;
	fprintf(msg, "moverd: %s\n", err);
	return -1;
}

static int peer_allow_option(struct options *o, const char *val, FILE *msg)
{
	char err[160];

	if (!peer_allow_parse(val, &o->allow, err, sizeof(err)))
		return 0;
	fprintf(msg, "moverd: %s\n", err);
	return -1;
}

static int bad(FILE *msg, int key, const char *val)
{
	fprintf(msg, "moverd: bad value '%s' for --%s\n", val,
		option_name(key));
	return -1;
}

/* A plain number in [min, max]. */
static int parse_count(const char *s, unsigned min, unsigned max,
		       unsigned *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = (unsigned)v;
	return 0;
}

/* Apply one option; 0, or -1 after printing why. */
static int set_option(struct options *o, int key, const char *val, FILE *msg)
{
	uint64_t v;
	char *end;

	switch (key) {
	case 's':
		if (strlen(val) >= sizeof(o->socket))
			goto bad;
		strcpy(o->socket, val);
		return 0;
	case 'm':
		o->socket_mode = (mode_t)strtoul(val, &end, 8);
		if (*end || end == val || o->socket_mode > 0777)
			goto bad;
		return 0;
	case 'L':
		if (strlen(val) >= sizeof(o->listen) || !strchr(val, ':'))
			goto bad;
		strcpy(o->listen, val);
		return 0;
	case 'T':
		if (strcmp(val, "auto") && strcmp(val, "rdma") && strcmp(val, "tcp"))
			goto bad;
		strcpy(o->transport, val);
		return 0;
	case 'B':
		if (strcmp(val, "auto") && strcmp(val, "thread") &&
		    strcmp(val, "poll"))
			goto bad;
		strcpy(o->doorbell, val);
		return 0;
	case 'P':
		if (declared_parse_size(val, &v) || v > 10000000)
			goto bad;
		o->poll_ns = v * 1000;
		return 0;
	case OPT_IDLE:
		if (idle_parse(val, &o->idle))
			goto bad;
		return 0;
	case OPT_IO_URING:
		if (loop_mode_parse(val, &o->uring))
			goto bad;
		return 0;
	case OPT_CPUS:
		if (strlen(val) >= sizeof(o->cpus_list) ||
		    cpus_parse(val, &o->cpus))
			goto bad;
		strcpy(o->cpus_list, val);
		return 0;
	case 'D':
		if (strlen(val) >= sizeof(o->state_dir))
			goto bad;
		strcpy(o->state_dir, val);
		return 0;
	case 'K':
		if (strlen(val) >= sizeof(o->peer_key))
			goto bad;
		strcpy(o->peer_key, val);
		return 0;
	case 'A':
		return peer_allow_option(o, val, msg);
	case OPT_PEER_REACH:
		return peer_reach_option(o, val, msg);
	case OPT_METRICS:
		if (strlen(val) >= sizeof(o->metrics) || !strchr(val, ':'))
			goto bad;
		strcpy(o->metrics, val);
		return 0;
	case OPT_METRICS_TOKEN:
		if (strlen(val) >= sizeof(o->metrics_token))
			goto bad;
		strcpy(o->metrics_token, val);
		return 0;
	case 'I': o->insecure_peers = true; return 0;
	case 'f': o->foreground = true; return 0;
	case 'S': o->use_syslog = true; return 0;
	case 'l':
		if (log_parse_level(val, &o->level))
			goto bad;
		return 0;
	case 'r':
		if (declared_parse_size(val, &v)) goto bad;
		o->limits.default_ring_size = v;
		return 0;
	case 'x':
		if (declared_parse_size(val, &v) || v > UINT32_MAX) goto bad;
		o->limits.default_max_record = (uint32_t)v;
		return 0;
	case 'R':
		if (declared_parse_size(val, &v)) goto bad;
		o->limits.max_ring_size = v;
		return 0;
	case 'F':
		if (declared_parse_size(val, &v) || v > 1u << 20) goto bad;
		o->limits.max_flows = (unsigned)v;
		return 0;
	case OPT_PEER_OWNER:
		if (parse_owner(&o->limits, val))
			goto bad;
		return 0;
	case OPT_UID_FLOWS:
		if (declared_parse_size(val, &v) || v > 1u << 20) goto bad;
		o->limits.uid_max_flows = (unsigned)v;
		return 0;
	case OPT_UID_BYTES:
		if (declared_parse_size(val, &v)) goto bad;
		o->limits.uid_max_ring_bytes = v;
		return 0;
	case OPT_UID_RATE:
		if (declared_parse_size(val, &v)) goto bad;
		o->limits.uid_ring_rate = v;
		return 0;
	case OPT_PEER_RATE:
		if (declared_parse_size(val, &v)) goto bad;
		o->limits.peer_ring_rate = v;
		return 0;
	case OPT_PEER_FLOWS:
		if (declared_parse_size(val, &v) || v > 1u << 20) goto bad;
		o->limits.peer_max_flows = (unsigned)v;
		return 0;
	case OPT_PEER_BYTES:
		if (declared_parse_size(val, &v)) goto bad;
		o->limits.peer_max_ring_bytes = v;
		return 0;
	case OPT_RESERVE:
		if (declared_parse_size(val, &v) || v > 99) goto bad;
		o->limits.state_dir_reserve = (unsigned)v;
		return 0;
	case OPT_ORPHAN:
		if (declared_parse_size(val, &v) || v > UINT32_MAX) goto bad;
		o->limits.orphan_timeout_s = (unsigned)v;
		return 0;
	case OPT_MAX_CLIENTS:
		return parse_count(val, 2, 1u << 20, &o->max_clients) ? bad(msg, key, val) : 0;
	case OPT_MAX_PER_UID:
		return parse_count(val, 1, 1u << 20, &o->max_per_uid) ? bad(msg, key, val) : 0;
	case OPT_PEER_PER_ADDR:
		return parse_count(val, 1, 1u << 20, &o->peer_per_addr) ? bad(msg, key, val) : 0;
	case OPT_PEER_PENDING:
		return parse_count(val, 1, 1u << 20, &o->peer_pending) ? bad(msg, key, val) : 0;
	case OPT_PEER_INBOUND:
		return parse_count(val, 1, 1u << 20, &o->peer_inbound) ? bad(msg, key, val) : 0;
	case OPT_PEER_HOSTS:
		return parse_count(val, 2, 1u << 20, &o->peer_hosts) ? bad(msg, key, val) : 0;
	case OPT_PEER_HOSTS_UID:
		return parse_count(val, 1, 1u << 20, &o->peer_hosts_per_uid) ? bad(msg, key, val) : 0;
	case OPT_PEER_HELLO:
		return parse_count(val, 1, 3600, &o->peer_hello_s) ? bad(msg, key, val) : 0;
	case OPT_PEER_CONNECT:
		return parse_count(val, 1, 3600, &o->peer_connect_s) ? bad(msg, key, val) : 0;
	case OPT_WINDOW_DELAY:
		return parse_count(val, 10, 10000000, &o->window_delay_us) ?
		       bad(msg, key, val) : 0;
	}
bad:
	return bad(msg, key, val);
}

static int option_key(const char *name)
{
	for (const struct option *o = long_opts; o->name; o++)
		if (strcmp(o->name, name) == 0)
			return o->val;
	return 0;
}

/* A config's option line, the last of its name: seen (if not NULL)
 * keeps them as written, for a reload to say which changed. */
static void conf_seen(struct conf_opts *seen, const char *name,
		      const char *val)
{
	unsigned i = 0;

	if (!seen)
		return;
	while (i < seen->n && strcmp(seen->name[i], name))
		i++;
	if (i == CONF_OPTS_MAX)
		return; /* more lines than options: repeated names */
	if (i == seen->n)
		seen->n++;
	snprintf(seen->name[i], sizeof(seen->name[i]), "%s", name);
	snprintf(seen->val[i], sizeof(seen->val[i]), "%s", val ? val : "");
}

/* Config file: "name = value" or "name value" lines, '#' comments.  What
 * is wrong goes to msg. */
static int read_config(struct options *o, const char *path, FILE *msg,
		       struct conf_opts *seen)
{
	char line[1024];
	FILE *f = fopen(path, "re");
	int lineno = 0, rc = 0;

	if (!f) {
		fprintf(msg, "moverd: config %s: %s\n", path, strerror(errno));
		return -1;
	}
	while (!rc && fgets(line, sizeof(line), f)) {
		char *name, *val, *save = NULL;
		int key;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			/* its tail would be read as a line of its own */
			fprintf(msg, "moverd: %s:%d: line longer than %zu "
				"bytes\n", path, lineno, sizeof(line) - 2);
			rc = -1;
			break;
		}
		line[strcspn(line, "#\n")] = 0;
		name = strtok_r(line, " \t=", &save);
		if (!name || !strcmp(name, "flow"))
			continue; /* flow lines: declared.c */
		val = strtok_r(NULL, " \t=", &save);
		key = option_key(name);
		if (!key || key == 'c' || key == 'h' || key == 'V') {
			fprintf(msg, "moverd: %s:%d: unknown option '%s'\n",
				path, lineno, name);
			rc = -1;
		} else if (key == 'f' || key == 'S' || key == 'I') {
			rc = set_option(o, key, NULL, msg);
		} else if (!val) {
			fprintf(msg, "moverd: %s:%d: '%s' needs a value\n",
				path, lineno, name);
			rc = -1;
		} else {
			rc = set_option(o, key, val, msg);
		}
		if (!rc)
			conf_seen(seen, name, val);
	}
	fclose(f);
	return rc;
}

static void default_options(struct options *o)
{
	const char *env = getenv("FLOWMOVER_SOCKET");

	*o = (struct options){
		.transport = "auto",
		.doorbell = "auto",
		.socket_mode = 0660,
		.level = LOG_LVL_INFO,
		.limits = { .default_ring_size = 4u << 20,
			    .default_max_record = 64u << 10,
			    .max_ring_size = 1u << 30,
			    .max_flows = 16384,
			    /* a shared host: no one user or peer host holds
			     * more than a sixteenth of the table, 4 GiB of
			     * rings, or the state dir's last 10 % */
			    .uid_max_flows = 64,
			    .uid_max_ring_bytes = 4ull << 30,
			    .peer_max_flows = 64,
			    .peer_max_ring_bytes = 4ull << 30,
			    /* ... nor stalls the event loop creating
			     * rings for more than a few % of its time
			     * (about 0.45 s a GiB created and destroyed,
			     * on tmpfs: docs/security-quota.md) */
			    .uid_ring_rate = 64u << 20,
			    .peer_ring_rate = 64u << 20,
			    .state_dir_reserve = 10,
			    .orphan_timeout_s = 6 * 3600 },
		.peer_per_addr = PEER_DEFAULT_PER_ADDR,
		.peer_pending = PEER_DEFAULT_PENDING,
		.peer_inbound = PEER_DEFAULT_INBOUND,
		.peer_hello_s = PEER_DEFAULT_HELLO_S,
		.peer_connect_s = PEER_DEFAULT_CONNECT_S,
		.peer_hosts = PEER_DEFAULT_HOSTS,
		.peer_hosts_per_uid = PEER_DEFAULT_HOSTS_PER_UID,
		.window_delay_us = PEER_DEFAULT_WINDOW_DELAY_US,
		.max_clients = CTL_DEFAULT_MAX_CLIENTS,
		.max_per_uid = CTL_DEFAULT_PER_UID,

	};
	snprintf(o->socket, sizeof(o->socket), "%s",
		 env && *env ? env : DEFAULT_SOCKET);
}

/*
 * path (of cap bytes) made absolute against the working directory, as
 * given otherwise (not resolved): a daemon's working directory is /, and
 * the paths moverd uses after it daemonized (the socket it binds, the
 * state directory's statvfs, the config a reload reads) must name what
 * was checked before.  0, or -1 with why on stderr.
 */
static int absolute(char *path, size_t cap, const char *what)
{
	char cwd[PATH_MAX], rel[PATH_MAX];
	int n;

	if (!path[0] || path[0] == '/')
		return 0;
	snprintf(rel, sizeof(rel), "%s", path);
	n = getcwd(cwd, sizeof(cwd)) ? snprintf(path, cap, "%s/%s", cwd, rel)
				     : -1;
	if (n >= 0 && (size_t)n < cap)
		return 0;
	fprintf(stderr, "moverd: %s %s: %s\n", what, rel,
		n < 0 ? strerror(errno) : "path too long");
	return -1;
}

/*
 * The config's path for reloads: absolute but not resolved, so that each
 * reload opens the path as given again (a config managed by moving a
 * symlink is read where it points then).
 */
static int config_path(struct options *o, const char *path)
{
	if (strlen(path) >= sizeof(o->config)) {
		fprintf(stderr, "moverd: config %s: path too long\n", path);
		return -1;
	}
	snprintf(o->config, sizeof(o->config), "%s", path);
	return absolute(o->config, sizeof(o->config), "config");
}

/* seen: the config's option lines as written (conf_seen). */
static int parse_options(struct options *o, struct conf_opts *seen, int argc,
			 char **argv)
{
	int c;

	default_options(o);
	/* the config file first, so that flags override it */
	for (int i = 1; i < argc - 1; i++) {
		if (strcmp(argv[i], "--config"))
			continue;
		if (read_config(o, argv[i + 1], stderr, seen) ||
		    config_path(o, argv[i + 1]))
			return 2;
	}
	while ((c = getopt_long(argc, argv, "fh", long_opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("moverd %s\n", FLOWSHM_VERSION);
			exit(0);
		case 'c':
			break;
		case '?':
			usage(stderr);
			return 2;
		default:
			if (set_option(o, c, optarg, stderr))
				return 2;
		}
	}
	if (absolute(o->socket, sizeof(o->socket), "socket") ||
	    absolute(o->state_dir, sizeof(o->state_dir), "state directory") ||
	    absolute(o->peer_key, sizeof(o->peer_key), "peer key") ||
	    absolute(o->metrics_token, sizeof(o->metrics_token),
		     "metrics token"))
		return 2;
	if (o->metrics_token[0] && !o->metrics[0]) {
		fprintf(stderr, "moverd: --metrics-token without --metrics: "
			"there is no endpoint to guard\n");
		return 2;
	}
	if (!o->state_dir[0]) {
		const char *slash = strrchr(o->socket, '/');
		int dir = slash ? (int)(slash - o->socket) : 0;

		if (dir > (int)sizeof(o->state_dir) - 8) {
			fprintf(stderr, "moverd: socket path too long for the "
				"default --state-dir\n");
			return 2;
		}
		snprintf(o->state_dir, sizeof(o->state_dir), "%.*s%srings", dir,
			 o->socket, slash ? "/" : "");
	}
	if (optind < argc) {
		fprintf(stderr, "moverd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	return 0;
}

/* The socket's file name, after its directory. */
static const char *socket_name(const char *socket)
{
	const char *slash = strrchr(socket, '/');

	return slash ? slash + 1 : socket;
}

/*
 * The socket's directory (0755, clients reach the socket through it) and
 * the state directory (0700), created or checked: a directory another
 * user made or can write could point moverd's writes, as root, anywhere
 * (a symlinked lock file, ring or state file), or feed it the state it
 * re-adopts.  Before daemonizing, so that a refusal reaches the terminal.
 */
static int open_dirs(struct daemon *d)
{
	const char *sock = d->opt.socket, *name = socket_name(sock);
	char dir[PATH_MAX], err[768];

	if (name == sock)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", name - sock > 1 ?
			 (int)(name - sock - 1) : 1, sock);
	d->run_fd = private_dir_open(dir, 0755, err, sizeof(err));
	if (d->run_fd < 0) {
		fprintf(stderr, "moverd: socket directory: %s\n", err);
		return -1;
	}
	d->state_fd = private_dir_open(d->opt.state_dir, 0700, err, sizeof(err));
	if (d->state_fd < 0) {
		fprintf(stderr, "moverd: --state-dir: %s\n", err);
		return -1;
	}
	return 0;
}

/* A state directory others can read (made by hand, or by a service
 * manager's default 0755): its files are moverd's alone (0600), but they
 * can list the flows' names.  Said, not refused: an existing
 * installation keeps working. */
static void warn_open_state_dir(const struct daemon *d)
{
	struct stat st;

	if (fstat(d->state_fd, &st) || !(st.st_mode & 044))
		return; /* (search alone, 0711: no one lists it) */
	log_warn("state directory %s has mode %04o: %s can list the names of "
		 "its flows (their files are moverd's alone); chmod 0700 it "
		 "(under systemd: StateDirectoryMode=0700)", d->opt.state_dir,
		 (unsigned)(st.st_mode & 07777),
		 st.st_mode & 004 ? "every user" : "its group's members");
}

/*
 * An exclusive flock on NAME in the directory DIR_FD (PATH for messages),
 * holding our pid and socket for the next one that tries: the lock fd, or
 * -1 (logged).  WHAT the lock guards and WHY_ONE, for the refusal.
 */
static int lock_file(const struct daemon *d, int dir_fd, const char *name,
		     const char *path, const char *what, const char *why_one)
{
	char owner[PATH_MAX + 32], why[200];
	int fd, n;

	/* in our own directory, and never through a link; O_NONBLOCK: a
	 * FIFO planted there must not hang us (no effect on a file) */
	fd = openat(dir_fd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
		    O_CLOEXEC, 0644);
	if (fd < 0) {
		log_error("cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	if (private_file_check(fd, why, sizeof(why))) {
		log_error("refusing the lock file %s: %s", path, why);
		close(fd);
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		char *sock;

		n = (int)pread(fd, owner, sizeof(owner) - 1, 0);
		owner[n > 0 ? n : 0] = 0;
		sock = owner + strcspn(owner, "\n");
		if (*sock)
			*sock++ = 0;
		sock[strcspn(sock, "\n")] = 0;
		log_error("another moverd (pid %s%s%s) is already running "
			  "on %s (%s): %s", owner[0] ? owner : "?",
			  *sock ? ", socket " : "", sock, what, path, why_one);
		close(fd);
		return -1;
	}
	n = snprintf(owner, sizeof(owner), "%d\n%s\n", (int)getpid(),
		     d->opt.socket);
	if (n >= (int)sizeof(owner) || ftruncate(fd, 0) ||
	    pwrite(fd, owner, (size_t)n, 0) != n)
		log_warn("cannot write pid to %s", path);
	return fd;
}

/*
 * One moverd per socket (SOCKET.lock) and one per state directory
 * (STATE_DIR/moverd.lock; no flow's file ends in .lock): two daemons
 * sharing rings would unlink and write over each other's files.  Both
 * default to the socket's directory, so two sockets side by side need a
 * --state-dir each.  Held until exit, by the daemonized child.
 */
static int take_locks(struct daemon *d)
{
	char path[PATH_MAX + 16], name[PATH_MAX + 8];

	snprintf(path, sizeof(path), "%s.lock", d->opt.socket);
	snprintf(name, sizeof(name), "%s.lock", socket_name(d->opt.socket));
	d->lock_fd = lock_file(d, d->run_fd, name, path, d->opt.socket,
			       "one moverd per socket");
	if (d->lock_fd < 0)
		return -1;
	snprintf(path, sizeof(path), "%s/moverd.lock", d->opt.state_dir);
	d->state_lock_fd = lock_file(d, d->state_fd, "moverd.lock", path,
				     d->opt.state_dir, "one moverd per state "
				     "directory; give each a --state-dir of "
				     "its own");
	return d->state_lock_fd < 0 ? -1 : 0;
}

/*
 * The soft open-file limit up to the hard one: systemd gives services a
 * soft 1024, less than --max-clients and the peers and flows together;
 * moverd never uses select(2), so nothing needs fds below 1024.
 */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;

		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			rl.rlim_cur = was;
	}
	log_info("open files: up to %llu", (unsigned long long)rl.rlim_cur);
}

static void signal_done(struct loop_op *op, int res);

/* reload.h's notice: systemd hears of a reload (SIGHUP, moverctl). */
static void reload_notice(void *arg, bool begin)
{
	(void)arg;
	notify_reloading(begin);
}

/* SIGHUP: the config's flow lines again (other options need a restart;
 * they are checked: check_config), and the metrics token file; read off
 * the loop (reload.h), which logs what it did. */
static void reload_config(struct daemon *d)
{
	char err[160];

	log_info("SIGHUP: reloading %s", d->opt.config[0] ?
		 "the config's flows" : "the metrics token (no --config)");
	if (!reload_ask(&d->reload, err, sizeof(err)))
		log_warn("SIGHUP: %s", err);
}

static void arm_signal(struct daemon *d)
{
	struct io_uring_sqe *sqe = loop_sqe(&d->loop, &d->sig_op, signal_done);

	if (sqe)
		io_uring_prep_read(sqe, d->sig_fd, &d->si, sizeof(d->si), 0);
}

static void signal_done(struct loop_op *op, int res)
{
	struct daemon *d = (struct daemon *)((char *)op -
		offsetof(struct daemon, sig_op));

	if (res == (int)sizeof(d->si) &&
	    (d->si.ssi_signo == SIGTERM || d->si.ssi_signo == SIGINT)) {
		log_info("signal %u: shutting down", d->si.ssi_signo);
		d->loop.stop = true;
		return;
	}
	if (res == (int)sizeof(d->si) && d->si.ssi_signo == SIGHUP)
		reload_config(d);
	arm_signal(d);
}

/*
 * Ops that re-arm themselves from their completion lose their turn if no
 * SQE is free then (loop_sqe NULL: the SQ full after a submit, which with
 * --io-uring sqpoll needs more than its 1024 entries re-armed in one pass):
 * a listener would never accept again, signals never be read.  Each pass
 * arms again those that should be in flight and are not.
 */
static void rearm_lost(struct daemon *d)
{
	if (!d->loop.stop && !d->sig_op.busy)
		arm_signal(d);
	ctl_server_rearm(&d->ctl);
	peer_rearm(&d->peers);
	reload_rearm(&d->reload);
}

static int setup_signals(struct daemon *d)
{
	sigset_t set;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL))
		return -1;
	d->sig_fd = signalfd(-1, &set, SFD_CLOEXEC);
	if (d->sig_fd < 0)
		return -1;
	arm_signal(d);
	return 0;
}

/*
 * The duty cycle: go on while the mover finds work; when it finds none,
 * the idle strategy (idle.h) says spin, yield or sleep.  Sleeping is in
 * io_uring, with the doorbell and RDMA CQ notification armed
 * (peer_prepare_sleep re-checks the rings behind a fence first).
 * Polling's cost on 2 cores (before issue 12): a fixed 500 us busy-poll
 * window cost ~0.5 ms per daemon hop (the woken daemon waited behind the
 * other's polling) and a 20 us one with sched_yield gave 50-90 ms tails at
 * 20k records/s; hence adaptive polls only across gaps it has seen, and
 * yields.  Figures of each mode: moverd/README.md.
 */
static int idle_timeout_ms(struct daemon *d)
{
	uint64_t now;

	d->peers.cycles++;
	if (peer_do_work(&d->peers)) {
		d->ctr.d.work_cycles++;
		idle_work(&d->idle, fr_now_ns());
		return 0;
	}
	now = fr_now_ns();
	switch (idle_next(&d->idle, now)) {
	case IDLE_STEP_SPIN:
		return 0;
	case IDLE_STEP_YIELD:
		sched_yield();
		return 0;
	case IDLE_STEP_SLEEP:
		break;
	}
	return peer_prepare_sleep(&d->peers);
}

/* Fork into the background; the parent exits once the child is ready. */
static int daemonize(int *ready_fd)
{
	int p[2];
	pid_t pid;
	char b;

	if (pipe(p))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid > 0) {
		close(p[1]);
		_exit(read(p[0], &b, 1) == 1 ? 0 : 1);
	}
	close(p[0]);
	setsid();
	if (fork() > 0)
		_exit(0);
	if (chdir("/")) {
		/* nothing depends on the working directory */
	}
	int null = open("/dev/null", O_RDWR);
	if (null >= 0) {
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		if (null > 2)
			close(null);
	}
	*ready_fd = p[1];
	return 0;
}

/*
 * Who may be a peer (and read /metrics): the key and the metrics token are
 * loaded (and their files checked) before anything else; without a key, a
 * listen address others can reach is refused unless the operator says
 * --insecure-peers.  0, or 1 after printing why.
 */
static int peer_security(struct daemon *d)
{
	char err[512];

	if (auth_init()) {
		fprintf(stderr, "moverd: libsodium did not initialise\n");
		return 1;
	}
	if (d->opt.metrics_token[0] &&
	    auth_load_token(d->opt.metrics_token, &d->metrics_token, err,
			    sizeof(err))) {
		fprintf(stderr, "moverd: --metrics-token: %s\n", err);
		return 1;
	}
	if (d->opt.peer_key[0]) {
		if (auth_load_key(d->opt.peer_key, &d->key, err, sizeof(err))) {
			fprintf(stderr, "moverd: --peer-key: %s\n", err);
			return 1;
		}
		d->have_key = true;
		return 0;
	}
	if (!d->opt.listen[0] || peer_listen_is_loopback(d->opt.listen) ||
	    d->opt.insecure_peers)
		return 0;
	fprintf(stderr, "moverd: --listen %s without --peer-key: any host that "
		"reaches it could open flows here.  Give every moverd of the "
		"cluster the same key (moverctl keygen FILE; --peer-key FILE), "
		"or pass --insecure-peers to accept this\n", d->opt.listen);
	return 1;
}

/* Said at every start, where an operator looks. */
static void log_peer_security(const struct daemon *d)
{
	if (d->have_key)
		log_info("peers must prove key %s (--peer-key)", d->key.id);
	else if (d->opt.listen[0] && !peer_listen_is_loopback(d->opt.listen))
		log_warn("INSECURE: --insecure-peers: peers on %s are not "
			 "authenticated; any host that reaches it can open "
			 "flows here and write into this host's shared memory",
			 d->opt.listen);
}

static void shutdown_daemon(struct daemon *d)
{
	uint64_t until = fr_now_ns() + 1000000000ull;

	reload_stop(&d->reload); /* a reading still under way is its thread's */
	loop_run_once(&d->loop, 0); /* its askers' answers go before the
				     * control socket closes */
	notify_stopping();
	metrics_http_stop(d->metrics); /* it reads the counters mapping */
	counters_close(&d->ctr, &d->flows, &d->peers, &d->ctl);
	peer_mgr_stop(&d->peers);
	/* not destroyed: their clients go on, the next start re-adopts
	 * them (issue 15); only moverctl flow destroy removes a flow */
	while (d->flows.head)
		peer_let_go_flow(&d->peers, d->flows.head);
	ctl_server_stop(&d->ctl);
	while ((ctl_server_busy(&d->ctl) || peer_mgr_busy(&d->peers) ||
		flows_busy(&d->flows)) && fr_now_ns() < until)
		loop_run_once(&d->loop, 100);
	/* the last I/O is done: what is left of the rings goes on the spot,
	 * also a ring whose last reference goes with a registration that
	 * peer_mgr_fini takes back (with the loop still set, its punch was
	 * queued on a loop that never ran again) */
	flows_use_loop(&d->flows, NULL);
	peer_mgr_fini(&d->peers); /* a ring registration still under way */
	flows_reap_remains(&d->flows, UINT64_MAX);
	loop_fini(&d->loop);
	close(d->sig_fd);
	declared_set_free(&d->declared.cur);
	log_info("stopped");
}

/* Re-adopt the flows of the state directory, saying how long it took
 * (issue 15: the start cost with many flows). */
static unsigned flows_adopt_timed(struct flow_table *t)
{
	uint64_t t0 = fr_now_ns();
	unsigned n = flows_adopt(t);

	log_info("start %llu: %u flows re-adopted in %.3f ms",
		 (unsigned long long)t->epoch, n,
		 (double)(fr_now_ns() - t0) / 1e6);
	return n;
}

/* SOCKET.counters beside the socket (ipc/counters.h); moverd runs on
 * without it if it cannot be made (logged), unless --metrics would serve
 * it (the start fails then) */
static void open_counters(struct daemon *d)
{
	char name[PATH_MAX + 16];

	snprintf(name, sizeof(name), "%s.counters", socket_name(d->opt.socket));
	counters_open(&d->ctr, d->run_fd, name, d->opt.limits.max_flows);
}

/* The shorter of two loop timeouts in ms (-1: none). */
static int sooner_ms(int a, int b)
{
	if (a < 0)
		return b;
	return b >= 0 && b < a ? b : a;
}

/*
 * How long the loop may sleep: the idle strategy's timeout (doorbell armed:
 * a second), cut to the counters' next pass, the watchdog's next ping and
 * the peer timer's next deadline.  The loop has no period of its own.
 */
static int sleep_ms(struct daemon *d, int timeout)
{
	uint64_t now = fr_now_ns();

	timeout = sooner_ms(timeout, counters_due_ms(&d->ctr, now));
	timeout = sooner_ms(timeout, notify_due_ms(now));
	return peer_timer_ms(&d->peers, timeout);
}

/* Who ended a sleep: the doorbell, else I/O (peers, clients, RDMA), else
 * the loop's own timeout (sleep_ms); handled: completions loop_run_once
 * ran (the peer timer is not one any more: ticks no longer moves here). */
static void count_wake(struct daemon *d, uint64_t rings, uint64_t ticks,
		       int handled)
{
	struct daemon_stats *s = &d->ctr.d;

	if (d->peers.rings != rings)
		s->wake_doorbell++;
	else if (handled > (int)(d->peers.ticks - ticks))
		s->wake_network++;
	else
		s->wake_timer++;
}

/* peer_destroy_flow's first step: the control socket forgets the flow's
 * attachments (a callback: peer.c does not depend on control.c) */
static void forget_attachments(void *ctl, struct flow *f)
{
	ctl_server_forget_flow(ctl, f);
}

/*
 * The config's flow lines, read before daemonizing (a bad one stops the
 * start where the operator sees it), applied once the flows of the state
 * directory are back: a declared flow that was re-adopted is kept.
 */
static int read_declared(struct daemon *d)
{
	char err[512];

	if (!d->opt.config[0])
		return 0;
	if (declared_read(d->opt.config, d->opt.listen, &d->declared_at_start,
			  err, sizeof(err))) {
		fprintf(stderr, "moverd: %s\n", err);
		return -1;
	}
	return 0;
}

static const char *conf_val(const struct conf_opts *c, const char *name)
{
	for (unsigned i = 0; i < c->n; i++)
		if (!strcmp(c->name[i], name))
			return c->val[i];
	return NULL;
}

/* An option line as the report shows it: its value, "set" (a flag), or
 * "not set". */
static const char *conf_shown(const char *v, char *buf, size_t cap)
{
	if (!v)
		return "not set";
	if (!*v)
		return "set";
	snprintf(buf, cap, "'%s'", v);
	return buf;
}

/* The report's line for option name if its line changed since the start. */
static void note_option(struct declared_report *r, const char *name,
			const char *was, const char *is)
{
	char a[1040], b[1040];

	if (was && is && !strcmp(was, is))
		return;
	declared_note(r, "option %s: %s in the file, %s at start: takes "
		      "effect at restart", name, conf_shown(is, b, sizeof(b)),
		      conf_shown(was, a, sizeof(a)));
}

/* The first line moverd wrote to msg, without "moverd: ", into err. */
static void config_error(const char *text, char *err, size_t cap)
{
	const char *t = text ? text : "";

	if (!strncmp(t, "moverd: ", 8))
		t += 8;
	snprintf(err, cap, "%.*s", (int)strcspn(t, "\n"), t);
	if (!err[0])
		snprintf(err, cap, "cannot read the options: out of memory");
}

/*
 * A reload's check of the config's option lines (struct declared's
 * check_options): read into scratch options as a start reads them, so a
 * line the next start would refuse (an unknown option, a bad value) is
 * refused now; the lines changed since the start are said, for options
 * take effect at a restart (a reload applies the flow lines only).
 */
/*
 * A reload reads the metrics token file again (moverd's path, as at the
 * start), with --config or without: a rotated token is served from now on;
 * one the next start would refuse refuses the reload, and the old token
 * stays.  1 read, 0 no token, -1 refused (declared.h, reread: the reload
 * thread, so it reads only options, which never change after the start;
 * d->metrics is the loop's).
 */
static int reread_token(void *arg, void **files, char *err, size_t cap)
{
	struct daemon *d = arg;
	struct auth_token *t;
	char why[512];

	if (!d->opt.metrics[0] || !d->opt.metrics_token[0])
		return 0;
	if (!(t = malloc(sizeof(*t)))) {
		snprintf(err, cap, "metrics-token: out of memory (the token in "
			 "use stays)");
		return -1;
	}
	if (auth_load_token(d->opt.metrics_token, t, why, sizeof(why))) {
		snprintf(err, cap, "metrics-token: %s (the token in use stays)",
			 why);
		free(t);
		return -1;
	}
	*files = t;
	return 1;
}

/* The token reread_token read, served from now on (declared.h,
 * reread_use: on the loop), and its copy wiped. */
static void use_token(void *arg, void *files, struct declared_report *r)
{
	struct daemon *d = arg;
	struct auth_token *t = files;

	if (r && d->metrics && metrics_http_set_token(d->metrics, t))
		declared_note(r, "metrics-token: the token in %s changed: "
			      "served from now on", d->opt.metrics_token);
	else if (r)
		declared_note(r, "metrics-token: %s read again: unchanged",
			      d->opt.metrics_token);
	auth_wipe(t, sizeof(*t));
	free(t);
}

static int check_config(void *arg, const char *path,
			struct declared_report *r, char *err, size_t cap)
{
	struct daemon *d = arg;
	const struct conf_opts *was = &d->conf_at_start;
	struct conf_opts *is = calloc(1, sizeof(*is));
	struct options scratch;
	char *text = NULL;
	size_t len = 0;
	FILE *msg = open_memstream(&text, &len);
	int rc = -1;

	if (is && msg) {
		default_options(&scratch);
		rc = read_config(&scratch, path, msg, is);
	}
	if (msg)
		fclose(msg);
	if (rc)
		config_error(text, err, cap);
	for (unsigned i = 0; !rc && i < was->n; i++)
		note_option(r, was->name[i], was->val[i],
			    conf_val(is, was->name[i]));
	for (unsigned i = 0; !rc && i < is->n; i++)
		if (!conf_val(was, is->name[i]))
			note_option(r, is->name[i], NULL, is->val[i]);
	free(text);
	free(is);
	return rc ? -1 : 0;
}

static void apply_declared(struct daemon *d)
{
	struct declared_report r = { 0 };

	d->declared = (struct declared){ .uid = getuid(), .gid = getgid(),
					 .flows = &d->flows, .peers = &d->peers,
					 .ctl = &d->ctl,
					 .check_options = check_config,
					 .reread = reread_token,
					 .reread_use = use_token,
					 .check_arg = d };
	snprintf(d->declared.path, sizeof(d->declared.path), "%s",
		 d->opt.config);
	snprintf(d->declared.listen, sizeof(d->declared.listen), "%s",
		 d->opt.listen);
	d->ctl.declared = &d->declared;
	reload_init(&d->reload, &d->loop, &d->declared);
	d->reload.done = ctl_reload_done; /* answers moverctl reload */
	d->reload.done_arg = &d->ctl;
	d->reload.notice = reload_notice;
	d->ctl.reloader = &d->reload;
	d->peers.admit = declared_admit; /* before the loop runs: no open yet */
	d->peers.admit_arg = &d->declared;
	declared_apply(&d->declared, &d->declared_at_start, &r);
	if (d->declared.cur.n || r.refused)
		log_info("config: %u flows declared (%u refused)",
			 d->declared.cur.n, r.refused);
}

/*
 * --cpus: before the first thread or fork, so that every thread moverd
 * starts (the doorbell's, the resolver's, the metrics server's) and the
 * daemonized child inherit it.
 */
static int pin_cpus(const struct options *o)
{
	if (!o->cpus_list[0])
		return 0;
	if (sched_setaffinity(0, sizeof(o->cpus), &o->cpus) == 0)
		return 0;
	fprintf(stderr, "moverd: --cpus %s: %s\n", o->cpus_list,
		errno == EINVAL ? "none of these cpus is online and allowed"
				: strerror(errno));
	return -1;
}

/* Re-adopted sender flows back on their peers' connections (and their
 * fan-out subscriptions); one that cannot be (no memory for its
 * connection) is said and stays failed rather than silently unattached. */
static void adopt_senders(struct daemon *d)
{
	for (struct flow *f = d->flows.head; f; f = f->next) {
		if (f->role != FLOW_SENDER)
			continue;
		if (!peer_add_sender(&d->peers, f)) {
			fanout_restore(&d->peers, f);
			continue;
		}
		log_error("flow %s: no memory for a connection to its peer %s",
			  f->name, f->peer_addr);
		flows_fail(f, "no memory for a connection to its peer at "
			   "start: restart moverd");
	}
}

int main(int argc, char **argv)
{
	static struct daemon d;
	struct peer_opts popt;
	int rc, ready_fd = -1;

	fmlt_init("moverd");
	rc = parse_options(&d.opt, &d.conf_at_start, argc, argv);
	if (rc)
		return rc;
	if (pin_cpus(&d.opt))
		return 1;
	if (read_declared(&d))
		return 2;
	if (peer_security(&d))
		return 1;
	if (open_dirs(&d))
		return 1;
	popt = (struct peer_opts){
		.listen_addr = d.opt.listen,
		.transport = d.opt.transport,
		.doorbell = d.opt.doorbell,
		.max_conns_per_addr = d.opt.peer_per_addr,
		.max_pending = d.opt.peer_pending,
		.max_inbound = d.opt.peer_inbound,
		.hello_timeout_s = d.opt.peer_hello_s,
		.connect_timeout_s = d.opt.peer_connect_s,
		.max_hosts = d.opt.peer_hosts,
		.max_hosts_per_uid = d.opt.peer_hosts_per_uid,
		.window_delay_us = d.opt.window_delay_us,
		.allow = &d.opt.allow,
		.key = d.have_key ? &d.key : NULL,
		.reach = &d.opt.reach,
		.flow_gone = forget_attachments, .flow_gone_arg = &d.ctl,
	};
	if (!d.opt.foreground && daemonize(&ready_fd)) {
		perror("moverd: daemonize");
		return 1;
	}
	log_setup(d.opt.level, d.opt.use_syslog || !d.opt.foreground);
	log_peer_security(&d);
	if (take_locks(&d))
		return 1;
	warn_open_state_dir(&d);
	open_counters(&d);
	close(d.run_fd); /* the lock and the counters were its only files;
			  * the socket's path is safe to use: no one else
			  * can write on the way */
	raise_fd_limit();
	flows_init(&d.flows, &d.opt.limits, d.opt.state_dir, d.state_fd);
	if (ring_guard_init() || loop_init(&d.loop, 1024, d.opt.uring) ||
	    setup_signals(&d) ||
	    ctl_server_start(&d.ctl, &d.loop, &d.flows, &d.peers, d.opt.socket,
			     d.opt.socket_mode))
		return 1;
	/* before the loop runs: no client can have been accepted yet */
	d.ctl.max_clients = d.opt.max_clients;
	d.ctl.max_per_uid = d.opt.max_per_uid;
	d.ctl.counters = &d.ctr;
	d.ctl.idle = &d.idle;
	d.ctl.io_uring = loop_mode_name(d.loop.mode);
	flows_use_loop(&d.flows, &d.loop); /* rings' pages off the loop */
	if (peer_mgr_start(&d.peers, &d.loop, &d.flows, &popt))
		return 1;
	idle_init(&d.idle, d.opt.idle, d.opt.poll_ns);
	log_info("idle strategy: %s%s, io_uring: %s, cpus: %s, window "
		 "delay target %u us", idle_name(d.opt.idle),
		 d.opt.poll_ns ? " (--poll-us)" : "",
		 loop_mode_name(d.loop.mode),
		 d.opt.cpus_list[0] ? d.opt.cpus_list : "any",
		 d.opt.window_delay_us);
	/* after setup_signals: its thread inherits the blocked signals */
	if (d.opt.metrics[0] &&
	    !(d.metrics = metrics_http_start(d.opt.metrics, d.ctr.h,
					     d.opt.metrics_token[0] ?
					     &d.metrics_token : NULL)))
		return 1;
	flows_count_start(&d.flows);
	if (flows_adopt_timed(&d.flows))
		adopt_senders(&d);
	apply_declared(&d);
	notify_init();
	log_info("moverd %s ready (pid %d)", FLOWSHM_VERSION, (int)getpid());
	notify_ready();
	if (ready_fd >= 0) {
		if (write(ready_fd, "r", 1) != 1)
			log_warn("could not signal readiness");
		close(ready_fd);
	}
	while (!d.loop.stop) {
		int timeout = idle_timeout_ms(&d);

		if (timeout)
			timeout = sleep_ms(&d, timeout);
		uint64_t rings = d.peers.rings, ticks = d.peers.ticks;

		if (timeout)
			fmlt_mark(LT_SLEEP, (uint64_t)timeout);
		rc = loop_run_once(&d.loop, timeout);
		if (timeout) {
			fmlt_mark(LT_WAKE, (uint64_t)rc);
			count_wake(&d, rings, ticks, rc);
			peer_woke(&d.peers);
		}
		notify_tick(fr_now_ns());
		counters_tick(&d.ctr, &d.flows, &d.peers, &d.ctl, fr_now_ns());
		rearm_lost(&d);
		/* after the counters' pass: the flow checks, due no sooner,
		 * ride on its wake-up (peer_timer) */
		peer_timer(&d.peers, fr_now_ns());
		if (rc < 0) {
			log_error("event loop: %s", strerror(-rc));
			break;
		}
	}
	shutdown_daemon(&d);
	fmlt_dump();
	auth_forget(&d.key);
	return rc < 0 ? 1 : 0;
}
