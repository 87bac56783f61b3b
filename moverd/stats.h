/*
 * moverd/stats.h - what moverd counts on its data path, beyond what its
 * structures already hold: plain increments in moverd's own memory (no
 * syscall, no atomic, no line shared with a reader).  counters.c copies
 * them into the counters file (ipc/counters.h) on its sampler.
 */
#ifndef MOVERD_STATS_H
#define MOVERD_STATS_H

#include "../ipc/counters.h"

#include <stdint.h>

/* In struct flow. */
struct flow_stats {
	uint64_t batches;       /* sender: sends that carried its data */
	uint64_t records_sent;  /* sender: data records put on the wire */
	uint64_t records_deposited; /* receiver: valid data records
				     * published in its ring */
	uint64_t reconnects;    /* links lost under it */
	uint64_t resumes;       /* opened again after a lost link / restart */
	/* one acknowledgement timed at a time: the send that ends at
	 * rtt_pos left at rtt_t0 (0: none in flight) */
	uint64_t rtt_pos, rtt_t0;
	/* counters.c: the flow's record (slot + 1, 0: none yet) and the
	 * record's incarnation when it was taken */
	uint32_t slot;
	uint64_t incarnation;
};

/* In struct peer. */
struct peer_stats {
	uint64_t frames_tx, frames_rx, sends;
	uint64_t heartbeats;             /* of those frames, both ways */
	uint64_t wr_posted, wc_polled;   /* RDMA */
	uint64_t rtt_count, rtt_sum_ns, rtt_max_ns;
	uint64_t rtt[FMC_RTT_BUCKETS];
	uint64_t hb_missed;
	uint64_t win_cuts;               /* the connection window cut */
	uint64_t hb_checked_ns;          /* counters.c: last period counted */
	uint32_t slot;                   /* counters.c, as flow_stats */
};

static inline void stats_rtt(struct peer_stats *s, uint64_t ns)
{
	s->rtt[fmc_rtt_bucket(ns)]++;
	s->rtt_count++;
	s->rtt_sum_ns += ns;
	if (ns > s->rtt_max_ns)
		s->rtt_max_ns = ns;
}

/* A send of a flow's data that ends at `end` left now: time its ack. */
static inline void stats_sent(struct flow_stats *s, uint64_t end,
			      uint64_t now)
{
	s->batches++;
	if (!s->rtt_t0) {
		s->rtt_pos = end;
		s->rtt_t0 = now;
	}
}

/* An acknowledgement up to pos came now: the round trip it ends, in ns
 * (0: it ends none). */
static inline uint64_t stats_acked(struct flow_stats *fs,
				   struct peer_stats *ps, uint64_t pos,
				   uint64_t now)
{
	uint64_t ns;

	if (!fs->rtt_t0 || pos < fs->rtt_pos)
		return 0;
	ns = now - fs->rtt_t0;
	stats_rtt(ps, ns);
	fs->rtt_t0 = 0;
	return ns ? ns : 1;
}

#endif
