/*
 * moverd/counters.h - moverd's side of the counters file (the layout is
 * ipc/counters.h): created at start beside the socket, written by a
 * sampler on moverd's loop every FMC_DEFAULT_PERIOD_MS from what the flow
 * table, the peers (stats.h) and the control socket count, marked closed
 * at shutdown.  Readers map it read-only and never reach moverd.
 */
#ifndef MOVERD_COUNTERS_H
#define MOVERD_COUNTERS_H

#include "../ipc/counters.h"

#include <stdbool.h>
#include <stdint.h>

struct flow_table;
struct peer_mgr;
struct ctl_server;

/* What the loop in main.c counts about its own sleeps. */
struct daemon_stats {
	uint64_t work_cycles;
	uint64_t wake_doorbell, wake_network, wake_timer;
};

struct counters {
	struct fmc_header *h;     /* NULL: no counters file (start failed) */
	size_t bytes;
	int dirfd;                /* the socket's directory (unlink at close) */
	char name[256];
	uint64_t pass;            /* sampler passes */
	uint64_t incarnation;     /* the last one handed out */
	uint64_t last_ns, slow_ns;
	uint64_t cpu_user_ns, cpu_sys_ns, fds; /* sampled once a second */
	uint64_t sampler_ns;      /* time spent in sample() so far */
	/* what decides which flows a pass writes (counters.c, flows_to_write) */
	uint64_t full_ns, every_ns, seen_work_ns, seen_requests, seen_frames;
	uint64_t seen_states;
	unsigned seen_flows, seen_clients;
	bool every_due;           /* moverd did something since the last
				   * pass that wrote every flow */
	/* per record: the pass that last claimed it, 0 while it is free.
	 * The shared page's state words are never read back: looking at every
	 * peer record's there (128 pages) every pass was 3/4 of an idle
	 * moverd's cpu */
	uint64_t *slot_pass;
	/* the pass that found no free flow (peer) record (take_slot) */
	uint64_t flows_full_pass, peers_full_pass;
	struct flow_shadow *shadow; /* per flow record: its state, seen */
	struct daemon_stats d;
};

/*
 * Create dir/name (an earlier file is replaced: readers holding it see it
 * closed) for up to max_flows flow records.  0, or -1 after logging why;
 * moverd runs on without counters then, unless --metrics asks to serve
 * them (metrics_http_start refuses: the start fails, saying so).
 */
int counters_open(struct counters *c, int dirfd, const char *name,
		  unsigned max_flows);

/* Sample if a period has passed since the last time (now: fr_now_ns). */
void counters_tick(struct counters *c, const struct flow_table *t,
		   const struct peer_mgr *m, const struct ctl_server *s,
		   uint64_t now);

/* ms until the next sample is due (the loop sleeps no longer). */
int counters_due_ms(const struct counters *c, uint64_t now);

/* A last sample, then mark the file closed and unmap it. */
void counters_close(struct counters *c, const struct flow_table *t,
		    const struct peer_mgr *m, const struct ctl_server *s);

#endif
