/*
 * control/top.h - reading moverd's counters file (ipc/counters.h) from
 * the client side, and `moverctl top`, the live view of it (top.c).
 */
#ifndef FLOWMOVER_CONTROL_TOP_H
#define FLOWMOVER_CONTROL_TOP_H

#include "../ipc/counters.h"

#include <stdbool.h>
#include <stddef.h>

/* A read-only mapping of SOCKET.counters. */
struct fmc_map {
	const struct fmc_header *h;
	size_t bytes;
	unsigned long ino;
};

/*
 * Map the counters file of the moverd on socket_path.  0, or a negative
 * errno: -ENOENT (no moverd, or one without counters), -EACCES (not in
 * moverd's group: the file is an operator's, ipc/counters.h), -EPROTO (a
 * layout this moverctl does not know).
 */
int fmc_map_open(const char *socket_path, struct fmc_map *m);
void fmc_map_close(struct fmc_map *m);

/* The flow's record by name; false if it has none. */
bool fmc_find_flow(const struct fmc_map *m, const char *name,
		   struct fmc_snap *out);

/* The daemon's record (0) or peer record i of n_peer. */
bool fmc_daemon(const struct fmc_map *m, struct fmc_snap *out);
bool fmc_peer(const struct fmc_map *m, unsigned i, struct fmc_snap *out);

const char *fmc_flow_state_name(uint64_t s);
const char *fmc_role_name(uint64_t r);

/* moverctl top [--once] [--json]; returns an exit status. */
int top_main(const char *socket_path, bool once, bool json);

#endif
