/*
 * control/top.c - `moverctl top`: flows and peers of one moverd with
 * rates per second, from its counters file (ipc/counters.h).  Reading the
 * file never reaches moverd: no request, no lock, no syscall on its side.
 *
 * The screen is plain ANSI (home, clear to end of line and of screen), so
 * it works over ssh on any terminal without curses; it fits 80x24 and
 * uses more rows where the terminal has them.  Keys: r sort by rate, l by
 * consumer lag, n by name, q quit.  --once prints one frame (rates over
 * one second) and exits; --json prints each frame as one JSON object per
 * line instead (with --once: one object).  A user who may not read the
 * counters file gets the same view of their own flows from the control
 * socket (flow list and status once a second).
 */
#include "top.h"
#include "ctl_client.h"
#include "../ipc/fnv.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

/* ---- the mapping ------------------------------------------------------------ */

int fmc_map_open(const char *socket_path, struct fmc_map *m)
{
	char path[4200];
	struct stat st;
	void *p;
	int fd;

	*m = (struct fmc_map){ 0 };
	snprintf(path, sizeof(path), "%s.counters", socket_path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) || st.st_size < (off_t)FMC_HDR_BYTES) {
		close(fd);
		return -EPROTO;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -errno;
	if (!fmc_valid(p, (size_t)st.st_size)) {
		munmap(p, (size_t)st.st_size);
		return -EPROTO;
	}
	m->h = p;
	m->bytes = (size_t)st.st_size;
	m->ino = (unsigned long)st.st_ino;
	/* the counts kept, and checked again as kept: the header is
	 * moverd's to rewrite, and a bigger count read later would reach
	 * past the mapping */
	m->n_flow = m->h->n_flow;
	m->n_peer = m->h->n_peer;
	if (m->n_flow > FMC_MAX_FLOW_RECS || m->n_peer > FMC_PEER_RECS ||
	    m->bytes < fmc_file_bytes(m->n_flow, m->n_peer)) {
		fmc_map_close(m);
		return -EPROTO;
	}
	return 0;
}

/* Record i, by the layout checked at open (fmc_valid: these sizes). */
static const struct fmc_record *record(const struct fmc_map *m, uint32_t i)
{
	return (const struct fmc_record *)((const char *)m->h + FMC_HDR_BYTES +
					   (size_t)i * FMC_REC_BYTES);
}

void fmc_map_close(struct fmc_map *m)
{
	if (m->h)
		munmap((void *)m->h, m->bytes);
	m->h = NULL;
}

/* moverd stopped, or another one replaced the file: map it again. */
static bool map_stale(const struct fmc_map *m, const char *socket_path)
{
	char path[4200];
	struct stat st;

	if (atomic_load_explicit(&((struct fmc_header *)m->h)->closed,
				 memory_order_acquire))
		return true;
	snprintf(path, sizeof(path), "%s.counters", socket_path);
	return stat(path, &st) || (unsigned long)st.st_ino != m->ino;
}

bool fmc_daemon(const struct fmc_map *m, struct fmc_snap *out)
{
	return fmc_read(record(m, 0), out) && out->type == FMC_DAEMON;
}

bool fmc_peer(const struct fmc_map *m, unsigned i, struct fmc_snap *out)
{
	return i < m->n_peer && fmc_read(record(m, 1 + m->n_flow + i), out) &&
	       out->type == FMC_PEER;
}

static bool fmc_flow(const struct fmc_map *m, unsigned i, struct fmc_snap *out)
{
	return i < m->n_flow && fmc_read(record(m, 1 + i), out) &&
	       out->type == FMC_FLOW;
}

bool fmc_find_flow(const struct fmc_map *m, const char *name,
		   struct fmc_snap *out)
{
	for (unsigned i = 0; i < m->n_flow; i++)
		if (fmc_flow(m, i, out) && !strcmp(out->text[FMC_NAME], name))
			return true;
	return false;
}

const char *fmc_flow_state_name(uint64_t s)
{
	static const char *const names[] = { "open", "connecting",
		"reconnecting", "failed", "closing" };

	return s < 5 ? names[s] : "?";
}

const char *fmc_role_name(uint64_t r)
{
	static const char *const names[] = { "local", "sender", "receiver" };

	return r < 3 ? names[r] : "?";
}

/* ---- text that came from moverd ------------------------------------------------ */

/* Length of the valid UTF-8 sequence at p (n bytes left), 0 if invalid;
 * *cp its code point. */
static size_t utf8_len(const unsigned char *p, size_t n, uint32_t *cp)
{
	size_t len;

	*cp = p[0];
	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		len = 2, *cp = p[0] & 0x1f;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		len = 3, *cp = p[0] & 0x0f;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		len = 4, *cp = p[0] & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		*cp = *cp << 6 | (p[i] & 0x3f);
	}
	if ((len == 3 && (*cp < 0x800 || (*cp >= 0xd800 && *cp <= 0xdfff))) ||
	    (len == 4 && (*cp < 0x10000 || *cp > 0x10ffff)))
		return 0;
	return len;
}

/* C0, DEL and C1: what a terminal takes as a control, not a character. */
static bool is_control(uint32_t cp)
{
	return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

void out_text(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n = strlen((const char *)p);

	while (n) {
		uint32_t cp;
		size_t l = utf8_len(p, n, &cp);

		if (!l || is_control(cp)) {
			/* an invalid byte is one '?', a C1 in UTF-8 too */
			fputc('?', f);
			l = l ? l : 1;
		} else {
			fwrite(p, 1, l, f);
		}
		p += l;
		n -= l;
	}
}

/* JSON's short escape of a control character (\\n...), or 0. */
static char json_short(uint32_t cp)
{
	switch (cp) {
	case '\b': return 'b';
	case '\f': return 'f';
	case '\n': return 'n';
	case '\r': return 'r';
	case '\t': return 't';
	default: return 0;
	}
}

void out_json_str(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n = strlen((const char *)p);

	fputc('"', f);
	while (n) {
		uint32_t cp;
		size_t l = utf8_len(p, n, &cp);

		if (!l) {
			fputs("\\ufffd", f);
			l = 1;
		} else if (cp == '"' || cp == '\\') {
			fprintf(f, "\\%c", (char)cp);
		} else if (json_short(cp)) {
			fprintf(f, "\\%c", json_short(cp));
		} else if (is_control(cp)) {
			/* JSON wants C0 escaped; DEL and C1 too, so that
			 * JSON shown on a terminal is no escape sequence */
			fprintf(f, "\\u%04x", (unsigned)cp);
		} else {
			fwrite(p, 1, l, f);
		}
		p += l;
		n -= l;
	}
	fputc('"', f);
}

/* ---- one frame: the records and their rates ------------------------------------ */

struct row {
	unsigned slot;
	struct fmc_snap s;
	double in, out;          /* bytes/s: committed (deposited), consumed
				  * (sender: sent) */
	double recs;             /* flows: records/s committed (deposited) */
	double frames, rx;       /* peers: frames/s, bytes/s received */
	uint64_t p50, p99, max;  /* peers: RTT over the frame, ns */
};

struct frame {
	uint64_t mono_ns;
	struct fmc_snap daemon;
	bool have_daemon;
	struct row *flows, *peers;
	unsigned n_flows, n_peers;
	/* flows and peers beyond the file's records (none from the socket) */
	uint32_t flows_unrecorded, peers_unrecorded;
	bool gone;               /* moverd is dead: these are its last figures */
	uint64_t age_ms;         /* since moverd's sampler wrote them */
};

static void frame_free(struct frame *f)
{
	free(f->flows);
	free(f->peers);
	*f = (struct frame){ 0 };
}

/* What a flow brings in and takes out, by role. */
static uint64_t flow_in(const struct fmc_snap *s)
{
	return s->v[FMC_F_ROLE] == 2 ? s->v[FMC_F_BYTES_DEPOSITED] :
				       s->v[FMC_F_BYTES_COMMITTED];
}

static uint64_t flow_out(const struct fmc_snap *s)
{
	return s->v[FMC_F_ROLE] == 1 ? s->v[FMC_F_BYTES_SENT] :
				       s->v[FMC_F_BYTES_CONSUMED];
}

static const struct row *find_prev(const struct row *rows, unsigned n,
				   const struct row *r)
{
	for (unsigned i = 0; i < n; i++)
		if (rows[i].slot == r->slot &&
		    rows[i].s.incarnation == r->s.incarnation)
			return &rows[i];
	return NULL;
}

static double per_s(uint64_t now, uint64_t before, double dt)
{
	return dt > 0 && now >= before ? (double)(now - before) / dt : 0;
}

static int read_frame(const struct fmc_map *m, const struct frame *prev,
		      struct frame *f)
{
	const struct fmc_header *h = m->h;
	double dt;

	*f = (struct frame){ 0 };
	f->mono_ns = atomic_load_explicit(&((struct fmc_header *)h)->sample_mono_ns,
					  memory_order_acquire);
	f->have_daemon = fmc_daemon(m, &f->daemon);
	f->flows_unrecorded = atomic_load_explicit(
		&((struct fmc_header *)h)->flows_unrecorded, memory_order_relaxed);
	f->peers_unrecorded = atomic_load_explicit(
		&((struct fmc_header *)h)->peers_unrecorded, memory_order_relaxed);
	f->flows = calloc(m->n_flow + 1, sizeof(*f->flows));
	f->peers = calloc(m->n_peer + 1, sizeof(*f->peers));
	if (!f->flows || !f->peers)
		return -ENOMEM;
	dt = prev && prev->mono_ns && f->mono_ns > prev->mono_ns ?
		(double)(f->mono_ns - prev->mono_ns) / 1e9 : 0;
	for (unsigned i = 0; i < m->n_flow; i++) {
		struct row *r = &f->flows[f->n_flows];
		const struct row *p;

		if (!fmc_flow(m, i, &r->s))
			continue;
		r->slot = i;
		f->n_flows++;
		if (!prev || !(p = find_prev(prev->flows, prev->n_flows, r)))
			continue;
		r->in = per_s(flow_in(&r->s), flow_in(&p->s), dt);
		r->out = per_s(flow_out(&r->s), flow_out(&p->s), dt);
		r->recs = per_s(r->s.v[FMC_F_RECORDS_COMMITTED],
				p->s.v[FMC_F_RECORDS_COMMITTED], dt);
	}
	for (unsigned i = 0; i < m->n_peer; i++) {
		struct row *r = &f->peers[f->n_peers];
		const struct row *p;
		const uint64_t *b;

		if (!fmc_peer(m, i, &r->s))
			continue;
		r->slot = i;
		f->n_peers++;
		b = &r->s.v[FMC_P_RTT_BUCKET0];
		p = prev ? find_prev(prev->peers, prev->n_peers, r) : NULL;
		/* RTT over this frame's window; the whole life without one */
		r->p50 = fmc_rtt_quantile(b, p ? &p->s.v[FMC_P_RTT_BUCKET0] :
					  NULL, 0.5);
		r->p99 = fmc_rtt_quantile(b, p ? &p->s.v[FMC_P_RTT_BUCKET0] :
					  NULL, 0.99);
		r->max = fmc_rtt_quantile(b, p ? &p->s.v[FMC_P_RTT_BUCKET0] :
					  NULL, 1.0);
		if (!p)
			continue;
		r->out = per_s(r->s.v[FMC_P_BYTES_TX], p->s.v[FMC_P_BYTES_TX], dt);
		r->rx = per_s(r->s.v[FMC_P_BYTES_RX], p->s.v[FMC_P_BYTES_RX], dt);
		r->frames = per_s(r->s.v[FMC_P_FRAMES_TX] + r->s.v[FMC_P_FRAMES_RX],
				  p->s.v[FMC_P_FRAMES_TX] + p->s.v[FMC_P_FRAMES_RX],
				  dt);
	}
	return 0;
}

/* ---- the same frame from the control socket ----------------------------------------
 * For a user who may not read the counters file: `flow list` and `status`
 * once a second, the flows that user may see, the same columns (no
 * acknowledgement-time histogram: the mean instead). */

struct ctl_src {
	int sock;
	struct fmc_header fake;  /* pid and start time, for the header line */
};

/* Why a frame from the control socket failed, when not ctl_last_error(). */
static const char *top_why;

static uint64_t name_hash(const char *s, uint64_t salt)
{
	return fnv1a64_str(salt, s) | 1; /* never 0 */
}

static void text(char *dst, const char *src)
{
	snprintf(dst, FMC_TEXT_BYTES, "%s", src ? src : "");
}

static uint64_t state_of(const char *s)
{
	static const char *const names[] = { "open", "connecting",
		"reconnecting", "failed", "closing" };

	for (unsigned i = 0; i < 5; i++)
		if (s && !strcmp(s, names[i]))
			return i;
	return 4;
}

static void flow_row(struct row *r, const Flowmover__FlowInfo *f)
{
	uint64_t *v = r->s.v;

	r->s.type = FMC_FLOW;
	r->s.state = FMC_ACTIVE;
	r->s.incarnation = name_hash(f->name, f->created_unix_ms);
	text(r->s.text[FMC_NAME], f->name);
	text(r->s.text[FMC_WHERE], f->peer);
	text(r->s.text[FMC_ERROR], f->state_reason);
	v[FMC_F_ROLE] = !strcmp(f->role, "sender") ? 1 :
			!strcmp(f->role, "receiver") ? 2 : 0;
	v[FMC_F_STATE] = state_of(f->state);
	v[FMC_F_RING_BYTES] = f->ring_size;
	v[FMC_F_PRODUCERS] = f->producers;
	v[FMC_F_CONSUMERS] = f->consumers;
	v[FMC_F_BYTES_COMMITTED] = f->tail;
	v[FMC_F_BYTES_SENT] = v[FMC_F_ROLE] == 1 ? f->bytes_sent : 0;
	v[FMC_F_BYTES_ACKED] = v[FMC_F_ROLE] == 1 ? f->bytes_acked : 0;
	v[FMC_F_BYTES_DEPOSITED] = v[FMC_F_ROLE] == 2 ? f->bytes_sent : 0;
	v[FMC_F_BYTES_CONSUMED] = f->bytes_consumed;
	v[FMC_F_BATCHES] = f->batches;
	v[FMC_F_RECORDS_COMMITTED] = f->records_committed;
	v[FMC_F_RECORDS_SENT] = f->records_sent;
	v[FMC_F_RECORDS_DEPOSITED] = f->records_deposited;
	v[FMC_F_LAG_BYTES] = f->lag_bytes;
	v[FMC_F_BACKPRESSURE] = f->backpressure_events;
	v[FMC_F_FULL_NS] = f->full_ns;
	v[FMC_F_RECONNECTS] = f->reconnects;
	v[FMC_F_RESUMES] = f->resumes;
	v[FMC_F_RECOVERED] = f->recovered;
}

static void peer_row(struct row *r, const Flowmover__PeerInfo *p)
{
	uint64_t *v = r->s.v;

	r->s.type = FMC_PEER;
	r->s.state = FMC_ACTIVE;
	r->s.incarnation = name_hash(p->address, 0);
	text(r->s.text[FMC_NAME], p->address);
	text(r->s.text[FMC_WHERE], p->node);
	v[FMC_P_STATE] = !strcmp(p->state, "up") ? 2 : 0;
	v[FMC_P_TRANSPORT] = !strcmp(p->transport, "rdma");
	v[FMC_P_FLOWS] = p->flows;
	v[FMC_P_BYTES_TX] = p->bytes_sent;
	v[FMC_P_BYTES_RX] = p->bytes_received;
	v[FMC_P_FRAMES_TX] = p->frames_sent;
	v[FMC_P_FRAMES_RX] = p->frames_received;
	v[FMC_P_RECONNECTS] = p->reconnects;
	v[FMC_P_HEARTBEATS_MISSED] = p->heartbeats_missed;
	v[FMC_P_REGISTRATIONS] = p->registrations;
	v[FMC_P_PINNED_BYTES] = p->registered_bytes;
	v[FMC_P_WR_POSTED] = p->rdma_wr_posted;
	v[FMC_P_WC_POLLED] = p->rdma_wc_polled;
	v[FMC_P_RTT_COUNT] = p->ack_rtt_count;
	v[FMC_P_RTT_SUM_NS] = p->ack_rtt_sum_ns;
	v[FMC_P_RTT_MAX_NS] = p->ack_rtt_max_ns;
	v[FMC_P_WINDOW] = p->window_bytes;
	v[FMC_P_UNACKED] = p->unacked_bytes;
	v[FMC_P_WINDOW_CUTS] = p->window_cuts;
}

static void daemon_row(struct frame *f, struct ctl_src *c,
		       const Flowmover__StatusInfo *s)
{
	uint64_t *v = f->daemon.v;
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	c->fake.pid = s->pid;
	c->fake.start_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull -
				s->uptime_ms * 1000000ull;
	f->have_daemon = true;
	f->daemon.type = FMC_DAEMON;
	text(f->daemon.text[FMC_NAME], "moverd");
	text(f->daemon.text[FMC_WHERE], s->version);
	text(f->daemon.text[FMC_ERROR], s->doorbell);
	v[FMC_D_CYCLES] = s->cycles;
	v[FMC_D_WORK_CYCLES] = s->work_cycles;
	v[FMC_D_SLEEPS] = s->sleeps;
	v[FMC_D_WAKE_DOORBELL] = s->wakes_doorbell;
	v[FMC_D_WAKE_NETWORK] = s->wakes_network;
	v[FMC_D_WAKE_TIMER] = s->wakes_timer;
	v[FMC_D_CPU_USER_NS] = s->cpu_user_ns;
	v[FMC_D_CPU_SYS_NS] = s->cpu_sys_ns;
	v[FMC_D_CLIENTS] = s->clients;
	v[FMC_D_FDS] = s->open_fds;
	v[FMC_D_FLOWS] = s->flows;
	v[FMC_D_PEERS] = s->n_peers;
	v[FMC_D_CLIENTS_REFUSED] = s->clients_refused;
	v[FMC_D_PEERS_REFUSED] = s->peers_refused;
	v[FMC_D_DOORBELL_RINGS] = s->doorbell_rings;
	v[FMC_D_RING_TO_ALLOCATE] = s->ring_to_allocate_bytes;
	v[FMC_D_RING_TO_FREE] = s->ring_to_free_bytes;
	v[FMC_D_DESTROYED_RINGS] = s->destroyed_rings;
	v[FMC_D_DESTROYED_RING_BYTES] = s->destroyed_ring_bytes;
	v[FMC_D_BELL_PAGES] = s->bell_pages;
	v[FMC_D_BELL_SHARED] = s->bell_shared_producers;
}

static int ctl_status(struct ctl_src *c, struct frame *f)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__GetStatus g = FLOWMOVER__GET_STATUS__INIT;
	Flowmover__Response *resp;
	int rc;

	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &g;
	rc = ctl_call(c->sock, &req, &resp, NULL, CTL_DEFAULT_TIMEOUT_MS);
	if (rc)
		return rc;
	if (resp->body_case != FLOWMOVER__RESPONSE__BODY_STATUS) {
		ctl_response_free(resp);
		top_why = "moverd answered status with something else";
		return -EPROTO;
	}
	daemon_row(f, c, resp->status);
	f->peers = calloc(resp->status->n_peers + 1, sizeof(*f->peers));
	if (!f->peers) {
		ctl_response_free(resp);
		return -ENOMEM;
	}
	for (size_t i = 0; i < resp->status->n_peers; i++)
		peer_row(&f->peers[f->n_peers++], resp->status->peers[i]);
	ctl_response_free(resp);
	return 0;
}

/* Every page of `flow list` (the flows this user may see). */
static int ctl_flows(struct ctl_src *c, struct frame *f)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__ListFlows l = FLOWMOVER__LIST_FLOWS__INIT;
	char after[FMC_TEXT_BYTES] = "";
	unsigned cap = 0;

	req.body_case = FLOWMOVER__REQUEST__BODY_LIST;
	req.list = &l;
	for (;;) {
		Flowmover__Response *resp;
		const Flowmover__FlowList *page;
		int rc;

		l.after = after;
		rc = ctl_call(c->sock, &req, &resp, NULL, CTL_DEFAULT_TIMEOUT_MS);
		if (rc)
			return rc;
		if (resp->body_case != FLOWMOVER__RESPONSE__BODY_LIST) {
			ctl_response_free(resp);
			top_why = "moverd answered flow list with something else";
			return -EPROTO;
		}
		page = resp->list;
		/* names come in order: a page that does not move past
		 * `after` would be asked for again, forever */
		if (page->more && page->n_flows &&
		    (strcmp(page->flows[page->n_flows - 1]->name, after) <= 0 ||
		     strlen(page->flows[page->n_flows - 1]->name) >=
			     sizeof(after))) {
			ctl_response_free(resp);
			top_why = "moverd's flow list does not move forward "
				  "(a page ends at or before the one before)";
			return -EPROTO;
		}
		if (f->n_flows + page->n_flows + 1 > cap) {
			struct row *rows;

			cap = (f->n_flows + (unsigned)page->n_flows + 1) * 2;
			rows = realloc(f->flows, cap * sizeof(*rows));
			if (!rows) {
				ctl_response_free(resp);
				return -ENOMEM;
			}
			f->flows = rows;
		}
		for (size_t i = 0; i < page->n_flows; i++) {
			memset(&f->flows[f->n_flows], 0, sizeof(*f->flows));
			flow_row(&f->flows[f->n_flows++], page->flows[i]);
		}
		if (page->n_flows)
			text(after, page->flows[page->n_flows - 1]->name);
		/* an empty page that says "more" would never end */
		if (!page->more || !page->n_flows) {
			ctl_response_free(resp);
			return 0;
		}
		ctl_response_free(resp);
	}
}

/* The rates of a frame against the one before (both sources). */
static void frame_rates(struct frame *f, const struct frame *prev)
{
	double dt = prev && prev->mono_ns && f->mono_ns > prev->mono_ns ?
		(double)(f->mono_ns - prev->mono_ns) / 1e9 : 0;
	const struct row *p;

	for (unsigned i = 0; prev && i < f->n_flows; i++) {
		struct row *r = &f->flows[i];

		if (!(p = find_prev(prev->flows, prev->n_flows, r)))
			continue;
		r->in = per_s(flow_in(&r->s), flow_in(&p->s), dt);
		r->out = per_s(flow_out(&r->s), flow_out(&p->s), dt);
		r->recs = per_s(r->s.v[FMC_F_RECORDS_COMMITTED],
				p->s.v[FMC_F_RECORDS_COMMITTED], dt);
	}
	for (unsigned i = 0; prev && i < f->n_peers; i++) {
		struct row *r = &f->peers[i];

		if (!(p = find_prev(prev->peers, prev->n_peers, r)))
			continue;
		r->out = per_s(r->s.v[FMC_P_BYTES_TX], p->s.v[FMC_P_BYTES_TX], dt);
		r->rx = per_s(r->s.v[FMC_P_BYTES_RX], p->s.v[FMC_P_BYTES_RX], dt);
		r->frames = per_s(r->s.v[FMC_P_FRAMES_TX] + r->s.v[FMC_P_FRAMES_RX],
				  p->s.v[FMC_P_FRAMES_TX] + p->s.v[FMC_P_FRAMES_RX],
				  dt);
		/* no histogram here: the mean over the frame, and the max */
		if (r->s.v[FMC_P_RTT_COUNT] > p->s.v[FMC_P_RTT_COUNT])
			r->p50 = (r->s.v[FMC_P_RTT_SUM_NS] - p->s.v[FMC_P_RTT_SUM_NS]) /
				 (r->s.v[FMC_P_RTT_COUNT] - p->s.v[FMC_P_RTT_COUNT]);
		r->max = r->s.v[FMC_P_RTT_MAX_NS];
	}
}

static int read_frame_ctl(struct ctl_src *c, const struct frame *prev,
			  struct frame *f)
{
	struct timespec ts;
	int rc;

	*f = (struct frame){ 0 };
	clock_gettime(CLOCK_MONOTONIC, &ts);
	f->mono_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if ((rc = ctl_status(c, f)) || (rc = ctl_flows(c, f)))
		return rc;
	if (!f->flows && !(f->flows = calloc(1, sizeof(*f->flows))))
		return -ENOMEM;
	frame_rates(f, prev);
	return 0;
}

/* ---- sorting --------------------------------------------------------------------- */

static char sort_key = 'r';
static const char *from_ctl;  /* not from the counters file: why */

static int by_key(const void *a, const void *b)
{
	const struct row *x = a, *y = b;
	double dx, dy;

	if (sort_key == 'n')
		return strcmp(x->s.text[FMC_NAME], y->s.text[FMC_NAME]);
	if (sort_key == 'l') {
		dx = (double)x->s.v[FMC_F_LAG_BYTES];
		dy = (double)y->s.v[FMC_F_LAG_BYTES];
	} else {
		dx = x->in + x->out;
		dy = y->in + y->out;
	}
	if (dx != dy)
		return dx < dy ? 1 : -1;
	return strcmp(x->s.text[FMC_NAME], y->s.text[FMC_NAME]);
}

/* ---- text ---------------------------------------------------------------------- */

/* 999B 1.5K 12M 3.4G: at most 5 characters */
static const char *human(char *buf, size_t cap, double v)
{
	static const char units[] = "BKMGTPE";
	int u = 0;

	while (v >= 999.5 && u < 6) {
		v /= 1024;
		u++;
	}
	if (u == 0 || v >= 9.95)
		snprintf(buf, cap, "%.0f%c", v, units[u]);
	else
		snprintf(buf, cap, "%.1f%c", v, units[u]);
	return buf;
}

/* A rate of things (records), not bytes: 950, 12k, 3.4M */
static const char *count(char *buf, size_t cap, double v)
{
	static const char units[] = " kMGTPE";
	int u = 0;

	while (v >= 999.5 && u < 6) {
		v /= 1000;
		u++;
	}
	if (u == 0)
		snprintf(buf, cap, "%.0f", v);
	else if (v >= 9.95)
		snprintf(buf, cap, "%.0f%c", v, units[u]);
	else
		snprintf(buf, cap, "%.1f%c", v, units[u]);
	return buf;
}

/* A duration in 6 characters at most (below 1000 s): 850us, 12.3ms, 376ms */
static const char *dur(char *buf, size_t cap, uint64_t ns)
{
	if (!ns)
		return "-";
	if (ns < 999500)
		snprintf(buf, cap, "%.0fus", (double)ns / 1e3);
	else if (ns < 99950000)
		snprintf(buf, cap, "%.1fms", (double)ns / 1e6);
	else if (ns < 999500000)
		snprintf(buf, cap, "%.0fms", (double)ns / 1e6); /* 6 wide */
	else
		snprintf(buf, cap, "%.1fs", (double)ns / 1e9);
	return buf;
}

struct screen {
	int rows, cols, used;
	bool plain;              /* --once: no escape codes */
};

/* One line, cut at the screen's width, cleared to its end. */
static void line(struct screen *sc, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void line(struct screen *sc, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	if (sc->used >= sc->rows)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if ((int)strlen(buf) > sc->cols)
		buf[sc->cols] = 0;
	sc->used++;
	/* names and errors are moverd's (some a peer's) */
	out_text(stdout, buf);
	/* no newline after the last row: the screen must not scroll */
	if (sc->plain)
		putchar('\n');
	else
		printf("\x1b[K%s", sc->used < sc->rows ? "\r\n" : "");
}

static void draw_header(struct screen *sc, const struct fmc_map *m,
			const struct frame *f, const struct frame *prev)
{
	const struct fmc_snap *d = &f->daemon;
	double dt = prev && f->mono_ns > prev->mono_ns ?
		(double)(f->mono_ns - prev->mono_ns) / 1e9 : 0;
	const uint64_t *pv = prev && prev->have_daemon ? prev->daemon.v : d->v;
	time_t up = (time_t)((uint64_t)time(NULL) -
			     m->h->start_unix_ns / 1000000000ull);
	line(sc, "moverd %s pid %u  up %lldh%02lldm  doorbell %s  sort: %s",
	     d->text[FMC_WHERE], m->h->pid, (long long)up / 3600,
	     (long long)up / 60 % 60, d->text[FMC_ERROR],
	     sort_key == 'r' ? "rate" : sort_key == 'l' ? "lag" : "name");
	line(sc, "cpu %4.1f%% usr %4.1f%% sys  cycles/s %.0f (work %.0f)  "
	     "clients %" PRIu64 "  fds %" PRIu64,
	     per_s(d->v[FMC_D_CPU_USER_NS], pv[FMC_D_CPU_USER_NS], dt) / 1e7,
	     per_s(d->v[FMC_D_CPU_SYS_NS], pv[FMC_D_CPU_SYS_NS], dt) / 1e7,
	     per_s(d->v[FMC_D_CYCLES], pv[FMC_D_CYCLES], dt),
	     per_s(d->v[FMC_D_WORK_CYCLES], pv[FMC_D_WORK_CYCLES], dt),
	     d->v[FMC_D_CLIENTS], d->v[FMC_D_FDS]);
	if (from_ctl)
		line(sc, "(%s)", from_ctl);
	else if (f->gone)
		line(sc, "(moverd pid %u is gone: its last figures, %" PRIu64
		     " ms old)", m->h->pid, f->age_ms);
	line(sc, "wakes/s: doorbell %.0f  network %.0f  timer %.0f   "
	     "flows %" PRIu64 "  peers %" PRIu64,
	     per_s(d->v[FMC_D_WAKE_DOORBELL], pv[FMC_D_WAKE_DOORBELL], dt),
	     per_s(d->v[FMC_D_WAKE_NETWORK], pv[FMC_D_WAKE_NETWORK], dt),
	     per_s(d->v[FMC_D_WAKE_TIMER], pv[FMC_D_WAKE_TIMER], dt),
	     d->v[FMC_D_FLOWS], d->v[FMC_D_PEERS]);
}

static const char *role_short(uint64_t r)
{
	return r == 0 ? "loc" : r == 1 ? "send" : "recv";
}

/* A peer's connection: its transport while up, else "down" */
static const char *link_state(const struct fmc_snap *s)
{
	if (s->v[FMC_P_STATE] != 2)
		return "down";
	return s->v[FMC_P_TRANSPORT] ? "rdma" : "tcp";
}

/* How many of n rows to draw in room lines: all, or room - 1 and a line
 * that says how many more there are. */
static unsigned fit(unsigned n, int room)
{
	if ((int)n <= room)
		return n;
	return room > 1 ? (unsigned)room - 1 : 0;
}

static void flow_line(struct screen *sc, const struct row *r)
{
	char a[16], b[16], c[16], e[16], k[16];
	const struct fmc_snap *s = &r->s;
	uint64_t batches = s->v[FMC_F_BATCHES];

	line(sc, "%-12.12s %-4.4s %-6.6s %5s %6s %6s %6s %5s %4" PRIu64
	     " %-16.16s", s->text[FMC_NAME], role_short(s->v[FMC_F_ROLE]),
	     fmc_flow_state_name(s->v[FMC_F_STATE]),
	     count(k, sizeof(k), r->recs), human(a, sizeof(a), r->in),
	     human(b, sizeof(b), r->out),
	     human(c, sizeof(c), (double)s->v[FMC_F_LAG_BYTES]),
	     batches ? human(e, sizeof(e), (double)s->v[FMC_F_BYTES_SENT] /
			     (double)batches) : "-",
	     s->v[FMC_F_RECONNECTS], s->text[FMC_WHERE]);
}

static void peer_line(struct screen *sc, const struct row *r)
{
	char a[16], b[16], c[16], e[16], g[16], h[16];

	line(sc, "%-21.21s %-4s %6s %6s %6.0f %6s %6s %6s %5s %4" PRIu64,
	     r->s.text[FMC_NAME], link_state(&r->s),
	     human(a, sizeof(a), r->out), human(b, sizeof(b), r->rx),
	     r->frames, dur(c, sizeof(c), r->p50), dur(g, sizeof(g), r->p99),
	     dur(h, sizeof(h), r->max),
	     human(e, sizeof(e), (double)r->s.v[FMC_P_WINDOW]),
	     r->s.v[FMC_P_RECONNECTS]);
}

static void draw(const struct fmc_map *m, const struct frame *f,
		 const struct frame *prev, struct screen *sc)
{
	unsigned peer_rows = f->n_peers || f->peers_unrecorded ?
			     f->n_peers + 2 + !!f->peers_unrecorded : 0;
	unsigned shown;

	if (!sc->plain)
		printf("\x1b[H");
	draw_header(sc, m, f, prev);
	line(sc, "%s", "");
	/* flows get what the peers (at most a third of the screen) leave */
	if (peer_rows > (unsigned)sc->rows / 3)
		peer_rows = (unsigned)sc->rows / 3;
	/* 79 columns: the flow's name and RECN give up what REC/s takes;
	 * the peer keeps room for an IPv4 address and port, and one LINK
	 * column (transport, or down) leaves room for the window */
	line(sc, "%-12s %-4s %-6s %5s %6s %6s %6s %5s %4s %-16s", "FLOW",
	     "ROLE", "STATE", "REC/s", "IN/s", "OUT/s", "LAG", "BATCH",
	     "RECN", "PEER");
	/* rows that do not fit are counted on a line of their own, and so
	 * are flows the counters file has no record for */
	shown = fit(f->n_flows, sc->rows - (int)peer_rows - sc->used -
			       !!f->flows_unrecorded);
	for (unsigned i = 0; i < shown; i++)
		flow_line(sc, &f->flows[i]);
	if (shown < f->n_flows)
		line(sc, "(+%u more)", f->n_flows - shown);
	if (f->flows_unrecorded)
		line(sc, "(%" PRIu32 " flows not in the counters file: see "
		     "moverctl flow list)", f->flows_unrecorded);
	if (f->n_peers || f->peers_unrecorded) {
		line(sc, "%s", "");
		line(sc, "%-21s %-4s %6s %6s %6s %6s %6s %6s %5s %4s",
		     "PEER", "LINK", "TX/s", "RX/s", "FRM/s",
		     from_ctl ? "mean" : "p50", "p99", "max", "WIN", "RECN");
	}
	shown = fit(f->n_peers, sc->rows - sc->used - !!f->peers_unrecorded);
	for (unsigned i = 0; i < shown; i++)
		peer_line(sc, &f->peers[i]);
	if (shown < f->n_peers)
		line(sc, "(+%u more)", f->n_peers - shown);
	if (f->peers_unrecorded)
		line(sc, "(%" PRIu32 " peers not in the counters file: see "
		     "moverctl status)", f->peers_unrecorded);
	if (!sc->plain)
		printf("\x1b[J");
	fflush(stdout);
}

/* ---- JSON ------------------------------------------------------------------------ */

static void jstr(const char *k, const char *s)
{
	printf("\"%s\":", k);
	out_json_str(stdout, s);
}

/* "subscribers":[{"slot":0,"cut":false,"lag_bytes":...},...] */
static void print_json_subs(const struct fmc_snap *s)
{
	uint64_t mask = s->v[FMC_F_SUB_MASK];
	bool first = true;

	printf(",\"subscribers\":[");
	for (unsigned i = 0; i < FMC_SUBS; i++) {
		const uint64_t *v = &s->v[FMC_F_SUB0 + FMC_SUB_VALUES * i];

		if (!(mask & (1ull << i | 1ull << (16 + i))))
			continue;
		printf("%s{\"slot\":%u,\"cut\":%s,\"lag_bytes\":%" PRIu64
		       ",\"records\":%" PRIu64 ",\"pid\":%" PRIu64 "}",
		       first ? "" : ",", i,
		       mask & (1ull << (16 + i)) ? "true" : "false",
		       v[FMC_SUB_LAG], v[FMC_SUB_RECORDS], v[FMC_SUB_PID]);
		first = false;
	}
	putchar(']');
}

static void print_json(const struct fmc_map *m, const struct frame *f)
{
	static const char *const fnames[] = {
		"role", "state", "state_since_ns", "error_ns", "ring_bytes",
		"producers", "consumers", "bytes_committed",
		"records_committed", "bytes_sent", "records_sent",
		"bytes_acked", "bytes_deposited", "bytes_consumed",
		"records_consumed", "batches", "lag_bytes",
		"backpressure_events", "full_ns", "reconnects", "resumes",
		"recovered", "subscriber_mask",
	};
	static const char *const pnames[] = {
		"state", "rdma", "outbound", "flows", "bytes_tx", "bytes_rx",
		"frames_tx", "frames_rx", "sends", "reconnects",
		"heartbeats_missed", "registrations", "pinned_bytes",
		"wr_posted", "wc_polled", "rtt_count", "rtt_sum_ns",
		"rtt_max_ns",
	};
	static const char *const dnames[] = {
		"cycles", "work_cycles", "sleeps", "wake_doorbell",
		"wake_network", "wake_timer", "cpu_user_ns", "cpu_sys_ns",
		"clients", "fds", "flows", "peers", "requests",
		"bad_requests", "clients_refused", "peers_refused",
		"doorbell_rings", "sampler_ns", "ring_to_allocate",
		"ring_to_free", "bell_pages", "bell_shared",
		"destroyed_rings", "destroyed_ring_bytes",
	};
	/* a name for every value (a new one without would print "(null)") */
	_Static_assert(sizeof(fnames) / sizeof(fnames[0]) == FMC_F_SUB0,
		       "flow value names");
	_Static_assert(sizeof(pnames) / sizeof(pnames[0]) == FMC_P_RTT_BUCKET0,
		       "peer value names");
	_Static_assert(sizeof(dnames) / sizeof(dnames[0]) == FMC_D_COUNT,
		       "daemon value names");

	printf("{\"pid\":%u,\"sample_unix_ns\":%" PRIu64 ",\"sample_age_ms\":%"
	       PRIu64 ",\"daemon_gone\":%s,\"flows_unrecorded\":%" PRIu32
	       ",\"peers_unrecorded\":%" PRIu32 ",\"daemon\":{",
	       m->h->pid, atomic_load_explicit(
		       &((struct fmc_header *)m->h)->sample_unix_ns,
		       memory_order_relaxed), f->age_ms,
	       f->gone ? "true" : "false", f->flows_unrecorded,
	       f->peers_unrecorded);
	for (unsigned i = 0; i < FMC_D_COUNT; i++)
		printf("%s\"%s\":%" PRIu64, i ? "," : "", dnames[i],
		       f->daemon.v[i]);
	printf("},\"flows\":[");
	for (unsigned i = 0; i < f->n_flows; i++) {
		const struct row *r = &f->flows[i];

		printf("%s{", i ? "," : "");
		jstr("name", r->s.text[FMC_NAME]);
		putchar(',');
		jstr("peer", r->s.text[FMC_WHERE]);
		putchar(',');
		jstr("last_error", r->s.text[FMC_ERROR]);
		printf(",\"state_name\":\"%s\",\"role_name\":\"%s\","
		       "\"in_bytes_per_s\":%.0f,\"out_bytes_per_s\":%.0f,"
		       "\"records_per_s\":%.0f,\"records_deposited\":%" PRIu64,
		       fmc_flow_state_name(r->s.v[FMC_F_STATE]),
		       fmc_role_name(r->s.v[FMC_F_ROLE]), r->in, r->out,
		       r->recs, r->s.v[FMC_F_RECORDS_DEPOSITED]);
		for (unsigned k = 0; k < FMC_F_SUB0; k++)
			printf(",\"%s\":%" PRIu64, fnames[k], r->s.v[k]);
		print_json_subs(&r->s);
		putchar('}');
	}
	printf("],\"peers\":[");
	for (unsigned i = 0; i < f->n_peers; i++) {
		const struct row *r = &f->peers[i];

		printf("%s{", i ? "," : "");
		jstr("address", r->s.text[FMC_NAME]);
		putchar(',');
		jstr("node", r->s.text[FMC_WHERE]);
		printf(",\"tx_bytes_per_s\":%.0f,\"rx_bytes_per_s\":%.0f,"
		       "\"frames_per_s\":%.0f,\"rtt_p50_ns\":%" PRIu64
		       ",\"rtt_p99_ns\":%" PRIu64 ",\"rtt_max_ns_window\":%"
		       PRIu64, r->out, r->rx, r->frames, r->p50, r->p99, r->max);
		for (unsigned k = 0; k < FMC_P_RTT_BUCKET0; k++)
			printf(",\"%s\":%" PRIu64, pnames[k], r->s.v[k]);
		printf(",\"window\":%" PRIu64 ",\"unacked\":%" PRIu64
		       ",\"window_cuts\":%" PRIu64, r->s.v[FMC_P_WINDOW],
		       r->s.v[FMC_P_UNACKED], r->s.v[FMC_P_WINDOW_CUTS]);
		putchar('}');
	}
	printf("]}\n");
	fflush(stdout);
}

/* ---- the terminal ------------------------------------------------------------------ */

static struct termios saved_tio;
static bool tio_saved;

/* The terminal's modes and cursor back.  Only calls that are
 * async-signal-safe (tcsetattr, write): on_signal calls it too. */
static void tty_back(void)
{
	static const char cursor_back[] = "\x1b[?25h\r\n";
	ssize_t ignored; /* a failed write: nothing else to do here */

	tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
	ignored = write(STDOUT_FILENO, cursor_back, sizeof(cursor_back) - 1);
	(void)ignored;
}

static void restore_terminal(void)
{
	if (!tio_saved)
		return;
	fflush(stdout); /* what printf buffered goes before the cursor */
	tty_back();
	tio_saved = false;
}

/* SIGINT, SIGTERM: the terminal back as it was, and out.  The signal may
 * come in the middle of a printf, whose buffer is then dropped with the
 * process. */
static void on_signal(int sig)
{
	(void)sig;
	if (tio_saved)
		tty_back();
	_exit(0);
}

static void catch_signals(void)
{
	struct sigaction sa = { .sa_handler = on_signal };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* Keys come one at a time, unechoed; the screen is cleared once. */
static void raw_terminal(void)
{
	struct termios t;

	if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_tio))
		return;
	t = saved_tio;
	t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
	t.c_cc[VMIN] = 0;
	t.c_cc[VTIME] = 0;
	if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t))
		return;
	tio_saved = true;
	atexit(restore_terminal);
	catch_signals();
	printf("\x1b[?25l\x1b[H\x1b[2J");
}

static void screen_size(struct screen *sc)
{
	struct winsize ws;

	sc->rows = 24;
	sc->cols = 80;
	if (!ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) && ws.ws_row && ws.ws_col) {
		sc->rows = ws.ws_row;
		sc->cols = ws.ws_col;
	}
	sc->used = 0;
}

/* Wait up to ms for a key; returns it, or 0. */
static int wait_key(int ms)
{
	struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
	char ch;

	if (poll(&pfd, 1, ms) <= 0)
		return 0;
	if (read(STDIN_FILENO, &ch, 1) != 1) {
		/* stdin closed (not a terminal): just keep the pace */
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

		nanosleep(&ts, NULL);
		return 0;
	}
	return ch;
}

/*
 * Where the frames come from: the counters file, or, for a user who may
 * not read it (or a moverd without one), the control socket.  0, or an
 * exit status after saying why.
 */
static int open_source(const char *socket_path, struct fmc_map *m,
		       struct ctl_src *c)
{
	int rc = fmc_map_open(socket_path, m);

	c->sock = -1;
	if (!rc)
		return 0;
	if (rc == -EPROTO) {
		fprintf(stderr, "moverctl top: %s.counters: not a counters file "
			"this moverctl knows\n", socket_path);
		return 3;
	}
	c->sock = ctl_connect(socket_path);
	if (c->sock < 0) {
		fputs("moverctl top: ", stderr);
		out_text(stderr, c->sock == -ECONNREFUSED ?
			 "moverd is not running" : ctl_last_error());
		fputc('\n', stderr);
		return c->sock == -EACCES ? 4 : 3;
	}
	from_ctl = rc == -EACCES ? "not in moverd's group: your flows, from "
		   "the control socket" :
		   "no counters file: your flows, from the control socket";
	c->fake = (struct fmc_header){ .magic = FMC_MAGIC };
	m->h = &c->fake;
	return 0;
}

static void close_source(struct fmc_map *m, struct ctl_src *c)
{
	if (c->sock >= 0) {
		close(c->sock);
		c->sock = -1;
		m->h = NULL;
		return;
	}
	fmc_map_close(m);
}

static int next_frame(const struct fmc_map *m, struct ctl_src *c,
		      const struct frame *prev, struct frame *f)
{
	if (c->sock >= 0)
		return read_frame_ctl(c, prev, f);
	return read_frame(m, prev, f);
}

/*
 * moverd's pid is gone and nobody answers on its socket: the file is what
 * a killed moverd left.  (The pid alone would not do: a reader in another
 * pid namespace sees every pid gone.)
 */
static bool daemon_gone(const struct fmc_map *m, const char *socket_path)
{
	int s;

	if (!kill((pid_t)m->h->pid, 0) || errno != ESRCH)
		return false;
	s = ctl_connect(socket_path);
	if (s >= 0)
		close(s);
	return s == -ECONNREFUSED;
}

/* How old a frame from the counters file is, and whether its moverd is
 * dead (a frame from the control socket is new, and its moverd alive). */
static void frame_age(const struct fmc_map *m, const struct ctl_src *c,
		      const char *socket_path, struct frame *f)
{
	struct timespec ts;
	uint64_t now, at;

	if (c->sock >= 0)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	at = f->mono_ns;
	f->age_ms = at && now > at ? (now - at) / 1000000 : 0;
	f->gone = daemon_gone(m, socket_path);
}

/*
 * Say why there is no frame; the exit status moverctl's other commands
 * give for the same: 4 permission denied, 3 moverd not running (or gone
 * during the call), else 1.
 */
static int frame_failed(int rc)
{
	fputs("moverctl top: ", stderr);
	out_text(stderr, rc == -ENOMEM ? "out of memory" :
		 top_why ? top_why : ctl_last_error());
	fputc('\n', stderr);
	if (rc == -EACCES || rc == -EPERM)
		return 4;
	if (rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -EPIPE)
		return 3;
	return 1;
}

static void show(const struct fmc_map *m, struct frame *f,
		 const struct frame *before, bool once, bool json)
{
	struct screen sc = { 0 };

	qsort(f->flows, f->n_flows, sizeof(*f->flows), by_key);
	if (json) {
		print_json(m, f);
		return;
	}
	screen_size(&sc);
	if (once) {
		sc.rows = 100000; /* all of it, for scripts */
		sc.plain = true;
	}
	draw(m, f, before, &sc);
}

int top_main(const char *socket_path, bool once, bool json)
{
	struct fmc_map m;
	struct ctl_src c;
	struct frame older = { 0 }, prev = { 0 }, cur;
	int rc = open_source(socket_path, &m, &c), key;

	if (rc)
		return rc;
	if ((rc = next_frame(&m, &c, NULL, &prev))) {
		rc = frame_failed(rc);
		frame_free(&prev);
		close_source(&m, &c);
		return rc;
	}
	if (!once && !json)
		raw_terminal();
	for (;;) {
		key = once || json ? (sleep(1), 0) : wait_key(1000);
		if (key == 'q' || key == 'Q')
			break;
		if (key == 'r' || key == 'l' || key == 'n') {
			/* the same frame in the new order, at once */
			sort_key = (char)key;
			show(&m, &prev, older.mono_ns ? &older : NULL, false,
			     false);
			continue;
		}
		if (c.sock < 0 && map_stale(&m, socket_path)) {
			fmc_map_close(&m);
			frame_free(&older);
			frame_free(&prev);
			if ((rc = open_source(socket_path, &m, &c)))
				break;
			next_frame(&m, &c, NULL, &prev);
			continue;
		}
		if ((rc = next_frame(&m, &c, &prev, &cur))) {
			rc = frame_failed(rc);
			frame_free(&cur);
			break;
		}
		frame_age(&m, &c, socket_path, &cur);
		show(&m, &cur, &prev, once, json);
		/* --once is a check: a dead moverd's last figures are not
		 * a running one's (exit 3, as `status` gives) */
		if (once && cur.gone)
			rc = 3;
		frame_free(&older);
		older = prev;
		prev = cur;
		if (once)
			break;
	}
	restore_terminal();
	frame_free(&older);
	frame_free(&prev);
	close_source(&m, &c);
	return rc;
}
