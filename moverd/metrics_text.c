/*
 * moverd/metrics_text.c - the counters file (ipc/counters.h) as Prometheus
 * text (0.0.4) or OpenMetrics 1.0.0: conventional names, HELP and TYPE
 * lines, label values escaped.  Reads the mapping with fmc_read only, so
 * any thread or process may call it (metrics_http.c's thread, the tests).
 */
#include "metrics_http.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- text --------------------------------------------------------------------- */

struct buf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void put(struct buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Room for need more bytes and the NUL after them (false: out of
 * memory, noted in b). */
static bool grow(struct buf *b, size_t need)
{
	size_t cap;
	char *p;

	if (need < b->cap - b->len)
		return true;
	cap = b->cap * 2 + need;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

static void put(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		if (!grow(b, (size_t)n))
			return;
	}
}

/* n bytes as they are: no format to parse (label values are most of a
 * scrape's bytes).  The text stays NUL-terminated, as put leaves it. */
static void put_bytes(struct buf *b, const char *s, size_t n)
{
	if (b->oom || !grow(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

/* A label value: backslash, double quote and newline escaped (the text
 * format's rule); texts in the file are printable already.  The runs
 * between those bytes are copied whole: one call per run, not per byte. */
static void put_label(struct buf *b, const char *name, const char *v,
		      bool last)
{
	put_bytes(b, name, strlen(name));
	put_bytes(b, "=\"", 2);
	for (;;) {
		size_t run = strcspn(v, "\\\"\n");

		put_bytes(b, v, run);
		v += run;
		if (!*v)
			break;
		put_bytes(b, *v == '\n' ? "\\n" : *v == '"' ? "\\\"" : "\\\\",
			  2);
		v++;
	}
	put_bytes(b, "\",", last ? 1 : 2);
}

struct family {
	const char *name;       /* without _total */
	const char *type;       /* counter, gauge, histogram */
	const char *help;
};

static void put_family(struct buf *b, const struct family *f, bool om)
{
	put(b, "# HELP %s%s %s\n", f->name,
	    !om && !strcmp(f->type, "counter") ? "_total" : "", f->help);
	put(b, "# TYPE %s%s %s\n", f->name,
	    !om && !strcmp(f->type, "counter") ? "_total" : "", f->type);
}

static const char *suffix(const struct family *f)
{
	return strcmp(f->type, "counter") ? "" : "_total";
}

/* ---- flows -------------------------------------------------------------------- */

enum { FV_SCALE_NS = 1 };

struct flow_metric {
	struct family f;
	unsigned v;             /* enum fmc_flow */
	unsigned flags;
	int role;               /* only this role (-1: every flow) */
};

static const struct flow_metric flow_metrics[] = {
	{ { "flowmover_flow_bytes_committed", "counter",
	    "Bytes producers committed to the flow's ring (a receiver: "
	    "deposited)." }, FMC_F_BYTES_COMMITTED, 0, -1 },
	{ { "flowmover_flow_records_committed", "counter",
	    "Data records producers committed to the flow's ring, as the "
	    "client library counts them (a receiver: deposited)." },
	  FMC_F_RECORDS_COMMITTED, 0, -1 },
	{ { "flowmover_flow_records_sent", "counter",
	    "Data records moverd put on the wire to the peer (sender "
	    "flows)." }, FMC_F_RECORDS_SENT, 0, 1 },
	{ { "flowmover_flow_records_deposited", "counter",
	    "Data records received from the peer and published to the "
	    "consumer (receiver flows)." }, FMC_F_RECORDS_DEPOSITED, 0, 2 },
	{ { "flowmover_flow_bytes_sent", "counter",
	    "Bytes moverd put on the wire to the peer (sender flows)." },
	  FMC_F_BYTES_SENT, 0, 1 },
	{ { "flowmover_flow_bytes_acked", "counter",
	    "Bytes the peer acknowledged as published in its ring (sender "
	    "flows)." }, FMC_F_BYTES_ACKED, 0, 1 },
	{ { "flowmover_flow_bytes_received", "counter",
	    "Bytes received from the peer and published to the consumer "
	    "(receiver flows)." }, FMC_F_BYTES_DEPOSITED, 0, 2 },
	{ { "flowmover_flow_bytes_consumed", "counter",
	    "The consumer's position: bytes it has taken (a sender: the "
	    "remote consumer's, as last acknowledged)." },
	  FMC_F_BYTES_CONSUMED, 0, -1 },
	{ { "flowmover_flow_batches", "counter",
	    "Sends that carried this flow's data (sender flows)." },
	  FMC_F_BATCHES, 0, 1 },
	{ { "flowmover_flow_records_consumed", "counter",
	    "Records its subscribers took (summed over them)." },
	  FMC_F_RECORDS_CONSUMED, 0, -1 },
	{ { "flowmover_flow_backpressure_events", "counter",
	    "Times producers found the ring full." }, FMC_F_BACKPRESSURE, 0,
	  -1 },
	{ { "flowmover_flow_full_seconds", "counter",
	    "Time producers waited on a full ring." }, FMC_F_FULL_NS,
	  FV_SCALE_NS, -1 },
	{ { "flowmover_flow_reconnects", "counter",
	    "Links lost under the flow." }, FMC_F_RECONNECTS, 0, -1 },
	{ { "flowmover_flow_resumes", "counter",
	    "Times the flow was opened again after a lost link or a "
	    "restart." }, FMC_F_RESUMES, 0, -1 },
	{ { "flowmover_flow_recovered_records", "counter",
	    "Records of dead producers turned into padding." },
	  FMC_F_RECOVERED, 0, -1 },
	{ { "flowmover_flow_lag_bytes", "gauge",
	    "Bytes committed (a receiver: received) that the consumer has "
	    "not taken yet." }, FMC_F_LAG_BYTES, 0, -1 },
	{ { "flowmover_flow_ring_bytes", "gauge", "The ring's size." },
	  FMC_F_RING_BYTES, 0, -1 },
	{ { "flowmover_flow_producers", "gauge", "Producers attached." },
	  FMC_F_PRODUCERS, 0, -1 },
	{ { "flowmover_flow_consumers", "gauge", "Consumers attached." },
	  FMC_F_CONSUMERS, 0, -1 },
	{ { "flowmover_flow_last_error_timestamp_seconds", "gauge",
	    "When the flow last gave a reason for not being open (0: "
	    "never)." }, FMC_F_ERROR_NS, FV_SCALE_NS, -1 },
};

static const char *role_name(uint64_t r)
{
	return r == 0 ? "local" : r == 1 ? "sender" : "receiver";
}

static void put_value(struct buf *b, uint64_t v, unsigned flags)
{
	if (flags & FV_SCALE_NS)
		put(b, " %.9f\n", (double)v / 1e9);
	else
		put(b, " %" PRIu64 "\n", v);
}

static void flow_labels(struct buf *b, const struct fmc_snap *s)
{
	put(b, "{");
	put_label(b, "flow", s->text[FMC_NAME], false);
	put_label(b, "role", role_name(s->v[FMC_F_ROLE]), false);
	put_label(b, "peer", s->text[FMC_WHERE], true);
	put(b, "}");
}

/* Each subscriber's lag (ring format 2: several consumers per flow). */
static void render_subs(struct buf *b, const struct fmc_snap *snaps,
			unsigned n, bool om)
{
	static const struct family lag = { "flowmover_flow_subscriber_lag_bytes",
		"gauge", "Bytes between the tail and one subscriber's published "
		"position (cut: dropped by max_lag)." };
	char slot[16], pid[24];

	put_family(b, &lag, om);
	for (unsigned i = 0; i < n; i++) {
		uint64_t mask = snaps[i].v[FMC_F_SUB_MASK];

		for (unsigned k = 0; k < FMC_SUBS; k++) {
			const uint64_t *v = &snaps[i].v[FMC_F_SUB0 +
							FMC_SUB_VALUES * k];

			if (!(mask & (1ull << k | 1ull << (16 + k))))
				continue;
			snprintf(slot, sizeof(slot), "%u", k);
			snprintf(pid, sizeof(pid), "%" PRIu64, v[FMC_SUB_PID]);
			put(b, "flowmover_flow_subscriber_lag_bytes{");
			put_label(b, "flow", snaps[i].text[FMC_NAME], false);
			put_label(b, "slot", slot, false);
			put_label(b, "pid", pid, false);
			put_label(b, "cut", mask & (1ull << (16 + k)) ? "1" : "0",
				  true);
			put(b, "} %" PRIu64 "\n", v[FMC_SUB_LAG]);
		}
	}
}

static void render_flows(struct buf *b, const struct fmc_header *h,
			 struct fmc_snap *snaps, unsigned n, bool om)
{
	static const char *const states[] = { "open", "connecting",
		"reconnecting", "failed", "closing" };
	static const struct family state = { "flowmover_flow_state", "gauge",
		"1 for the flow's current state." };

	(void)h;
	for (size_t m = 0; m < sizeof(flow_metrics) / sizeof(*flow_metrics);
	     m++) {
		const struct flow_metric *fm = &flow_metrics[m];

		put_family(b, &fm->f, om);
		for (unsigned i = 0; i < n; i++) {
			if (fm->role >= 0 &&
			    snaps[i].v[FMC_F_ROLE] != (uint64_t)fm->role)
				continue;
			put(b, "%s%s", fm->f.name, suffix(&fm->f));
			flow_labels(b, &snaps[i]);
			put_value(b, snaps[i].v[fm->v], fm->flags);
		}
	}
	render_subs(b, snaps, n, om);
	put_family(b, &state, om);
	for (unsigned i = 0; i < n; i++)
		for (unsigned s = 0; s < 5; s++) {
			put(b, "flowmover_flow_state{");
			put_label(b, "flow", snaps[i].text[FMC_NAME], false);
			put_label(b, "state", states[s], true);
			put(b, "} %d\n", snaps[i].v[FMC_F_STATE] == s);
		}
}

/* ---- peers -------------------------------------------------------------------- */

struct peer_metric {
	struct family f;
	unsigned v;             /* enum fmc_peer */
};

static const struct peer_metric peer_metrics[] = {
	{ { "flowmover_peer_bytes_sent", "counter", "Bytes sent to the peer." },
	  FMC_P_BYTES_TX },
	{ { "flowmover_peer_bytes_received", "counter",
	    "Bytes received from the peer." }, FMC_P_BYTES_RX },
	{ { "flowmover_peer_frames_sent", "counter",
	    "Frames (data, control, acknowledgement, heartbeat) sent." },
	  FMC_P_FRAMES_TX },
	{ { "flowmover_peer_frames_received", "counter", "Frames received." },
	  FMC_P_FRAMES_RX },
	{ { "flowmover_peer_sends", "counter",
	    "Sends posted (a TCP sendmsg or a chain of RDMA work requests)." },
	  FMC_P_SENDS },
	{ { "flowmover_peer_reconnects", "counter",
	    "Times the connection to the peer was lost." }, FMC_P_RECONNECTS },
	{ { "flowmover_peer_heartbeats_missed", "counter",
	    "Heartbeat periods (1 s) beyond the first in which nothing came "
	    "from the peer." }, FMC_P_HEARTBEATS_MISSED },
	{ { "flowmover_peer_rdma_work_requests_posted", "counter",
	    "RDMA work requests posted." }, FMC_P_WR_POSTED },
	{ { "flowmover_peer_rdma_completions_polled", "counter",
	    "RDMA completions polled." }, FMC_P_WC_POLLED },
	{ { "flowmover_peer_rdma_registrations", "gauge",
	    "Flow rings registered with the RDMA device (or whose "
	    "deregistration has not ended)." },
	  FMC_P_REGISTRATIONS },
	{ { "flowmover_peer_rdma_pinned_bytes", "gauge",
	    "Bytes of flow rings registered (pinned until their "
	    "deregistration ends)." }, FMC_P_PINNED_BYTES },
	{ { "flowmover_peer_flows", "gauge", "Flows on the connection." },
	  FMC_P_FLOWS },
	{ { "flowmover_peer_window_bytes", "gauge",
	    "Data bytes the connection window lets be unacknowledged." },
	  FMC_P_WINDOW },
	{ { "flowmover_peer_unacknowledged_bytes", "gauge",
	    "Data bytes sent and not yet acknowledged." }, FMC_P_UNACKED },
	{ { "flowmover_peer_window_cuts", "counter",
	    "Times late acknowledgements cut the connection window." },
	  FMC_P_WINDOW_CUTS },
};

static void peer_labels(struct buf *b, const struct fmc_snap *s,
			const char *extra, const char *extra_v)
{
	put(b, "{");
	put_label(b, "peer", s->text[FMC_NAME], false);
	put_label(b, "transport", s->v[FMC_P_TRANSPORT] ? "rdma" : "tcp",
		  !extra);
	if (extra)
		put_label(b, extra, extra_v, true);
	put(b, "}");
}

static void render_rtt(struct buf *b, const struct fmc_snap *snaps,
		       unsigned n, bool om)
{
	static const struct family rtt = { "flowmover_peer_ack_rtt_seconds",
		"histogram", "Time from a send of a flow's data to the "
		"acknowledgement that covers it (one timed per flow at a "
		"time)." };

	put_family(b, &rtt, om);
	for (unsigned i = 0; i < n; i++) {
		const uint64_t *bk = &snaps[i].v[FMC_P_RTT_BUCKET0];
		uint64_t cum = 0;
		char le[32];

		/* every fourth bucket boundary: powers of two of us */
		for (unsigned k = 0; k < FMC_RTT_BUCKETS; k++) {
			cum += bk[k];
			if (k < 3 || (k + 1) % 4 || k + 1 == FMC_RTT_BUCKETS)
				continue;
			snprintf(le, sizeof(le), "%g",
				 (double)fmc_rtt_bucket_low_ns(k + 1) / 1e9);
			put(b, "flowmover_peer_ack_rtt_seconds_bucket");
			peer_labels(b, &snaps[i], "le", le);
			put(b, " %" PRIu64 "\n", cum);
		}
		put(b, "flowmover_peer_ack_rtt_seconds_bucket");
		peer_labels(b, &snaps[i], "le", "+Inf");
		put(b, " %" PRIu64 "\n", snaps[i].v[FMC_P_RTT_COUNT]);
		put(b, "flowmover_peer_ack_rtt_seconds_sum");
		peer_labels(b, &snaps[i], NULL, NULL);
		put(b, " %.9f\n", (double)snaps[i].v[FMC_P_RTT_SUM_NS] / 1e9);
		put(b, "flowmover_peer_ack_rtt_seconds_count");
		peer_labels(b, &snaps[i], NULL, NULL);
		put(b, " %" PRIu64 "\n", snaps[i].v[FMC_P_RTT_COUNT]);
	}
}

static void render_peers(struct buf *b, struct fmc_snap *snaps, unsigned n,
			 bool om)
{
	static const struct family up = { "flowmover_peer_up", "gauge",
		"1 while the connection to the peer is up." };

	for (size_t m = 0; m < sizeof(peer_metrics) / sizeof(*peer_metrics);
	     m++) {
		const struct peer_metric *pm = &peer_metrics[m];

		put_family(b, &pm->f, om);
		for (unsigned i = 0; i < n; i++) {
			put(b, "%s%s", pm->f.name, suffix(&pm->f));
			peer_labels(b, &snaps[i], NULL, NULL);
			put(b, " %" PRIu64 "\n", snaps[i].v[pm->v]);
		}
	}
	put_family(b, &up, om);
	for (unsigned i = 0; i < n; i++) {
		put(b, "flowmover_peer_up");
		peer_labels(b, &snaps[i], NULL, NULL);
		put(b, " %d\n", snaps[i].v[FMC_P_STATE] == 2);
	}
	render_rtt(b, snaps, n, om);
}

/* ---- the daemon -------------------------------------------------------------- */

static void daemon_one(struct buf *b, bool om, const char *name,
		       const char *type, const char *help, uint64_t v,
		       unsigned flags)
{
	struct family f = { name, type, help };

	put_family(b, &f, om);
	put(b, "%s%s", name, suffix(&f));
	put_value(b, v, flags);
}

/* d NULL: its record could not be read whole (the sampler was writing
 * it): its counters are left out of this scrape, never given as 0, which
 * Prometheus would take for a reset (rate() spikes). */
static void render_daemon(struct buf *b, const struct fmc_header *h,
			  const struct fmc_snap *d, bool om)
{
	static const struct family wakes = { "flowmover_wakes", "counter",
		"Sleeps of the mover ended, by what ended them." };
	static const struct family cpu = { "flowmover_cpu_seconds", "counter",
		"CPU time of moverd (getrusage, sampled once a second)." };

	daemon_one(b, om, "flowmover_start_time_seconds", "gauge",
		   "When moverd started (Unix time).", h->start_unix_ns,
		   FV_SCALE_NS);
	if (!d)
		return;
	daemon_one(b, om, "flowmover_duty_cycles", "counter",
		   "Duty cycles of the mover.", d->v[FMC_D_CYCLES], 0);
	daemon_one(b, om, "flowmover_work_cycles", "counter",
		   "Duty cycles that found work.", d->v[FMC_D_WORK_CYCLES], 0);
	daemon_one(b, om, "flowmover_sleeps", "counter",
		   "Idle periods begun with the doorbell armed.",
		   d->v[FMC_D_SLEEPS], 0);
	put_family(b, &wakes, om);
	put(b, "flowmover_wakes_total{by=\"doorbell\"} %" PRIu64 "\n",
	    d->v[FMC_D_WAKE_DOORBELL]);
	put(b, "flowmover_wakes_total{by=\"network\"} %" PRIu64 "\n",
	    d->v[FMC_D_WAKE_NETWORK]);
	put(b, "flowmover_wakes_total{by=\"timer\"} %" PRIu64 "\n",
	    d->v[FMC_D_WAKE_TIMER]);
	put_family(b, &cpu, om);
	put(b, "flowmover_cpu_seconds_total{mode=\"user\"} %.6f\n",
	    (double)d->v[FMC_D_CPU_USER_NS] / 1e9);
	put(b, "flowmover_cpu_seconds_total{mode=\"system\"} %.6f\n",
	    (double)d->v[FMC_D_CPU_SYS_NS] / 1e9);
	daemon_one(b, om, "flowmover_counters_sampler_seconds", "counter",
		   "Time moverd spent writing the counters file.",
		   d->v[FMC_D_SAMPLER_NS], FV_SCALE_NS);
	daemon_one(b, om, "flowmover_control_requests", "counter",
		   "Control requests served.", d->v[FMC_D_REQUESTS], 0);
	daemon_one(b, om, "flowmover_clients", "gauge",
		   "Open control connections.", d->v[FMC_D_CLIENTS], 0);
	daemon_one(b, om, "flowmover_open_fds", "gauge",
		   "Open file descriptors of moverd.", d->v[FMC_D_FDS], 0);
	daemon_one(b, om, "flowmover_flows", "gauge", "Flows.",
		   d->v[FMC_D_FLOWS], 0);
	daemon_one(b, om, "flowmover_ring_to_allocate_bytes", "gauge",
		   "Ring bytes whose pages moverd has yet to allocate.",
		   d->v[FMC_D_RING_TO_ALLOCATE], 0);
	daemon_one(b, om, "flowmover_ring_to_free_bytes", "gauge",
		   "Allocated bytes of destroyed rings moverd has yet to free.",
		   d->v[FMC_D_RING_TO_FREE], 0);
	daemon_one(b, om, "flowmover_destroyed_rings", "gauge",
		   "Destroyed flows whose rings moverd still holds (I/O in "
		   "flight, a consumer draining, pages being freed).",
		   d->v[FMC_D_DESTROYED_RINGS], 0);
	daemon_one(b, om, "flowmover_destroyed_ring_bytes", "gauge",
		   "Ring bytes of the destroyed flows moverd still holds; "
		   "the quotas count them.",
		   d->v[FMC_D_DESTROYED_RING_BYTES], 0);
	daemon_one(b, om, "flowmover_doorbell_pages", "gauge",
		   "Doorbell pages in use: root's and one per uid with "
		   "producers attached (64 at most).",
		   d->v[FMC_D_BELL_PAGES], 0);
	daemon_one(b, om, "flowmover_doorbell_shared_producers", "gauge",
		   "Producers on the one page the uids past 63 share.",
		   d->v[FMC_D_BELL_SHARED], 0);
	daemon_one(b, om, "flowmover_flows_unrecorded", "gauge",
		   "Flows beyond the counters file's records (not shown here).",
		   atomic_load_explicit(&((struct fmc_header *)h)->flows_unrecorded,
					memory_order_relaxed), 0);
}

char *metrics_render(const struct fmc_header *h, bool om, size_t *len)
{
	struct buf b = { .cap = 65536 };
	struct fmc_snap *flows = calloc(h->n_flow + 1, sizeof(*flows));
	struct fmc_snap *peers = calloc(h->n_peer + 1, sizeof(*peers));
	struct fmc_snap d;
	unsigned nf = 0, np = 0;

	b.p = malloc(b.cap);
	if (!flows || !peers || !b.p)
		goto oom;
	for (uint32_t i = 0; i < h->n_flow; i++)
		if (fmc_read(fmc_record(h, fmc_first_flow(h) + i), &flows[nf]) &&
		    flows[nf].type == FMC_FLOW)
			nf++;
	for (uint32_t i = 0; i < h->n_peer; i++)
		if (fmc_read(fmc_record(h, fmc_first_peer(h) + i), &peers[np]) &&
		    peers[np].type == FMC_PEER)
			np++;
	render_daemon(&b, h, fmc_read(fmc_record(h, 0), &d) ? &d : NULL, om);
	render_flows(&b, h, flows, nf, om);
	render_peers(&b, peers, np, om);
	if (om)
		put(&b, "# EOF\n");
	if (b.oom)
		goto oom;
	free(flows);
	free(peers);
	*len = b.len;
	return b.p;
oom:
	free(flows);
	free(peers);
	free(b.p);
	return NULL;
}

