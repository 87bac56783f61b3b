/*
 * control/top.h - reading moverd's counters file (ipc/counters.h) from
 * the client side, and `moverctl top`, the live view of it (top.c).
 */
#ifndef FLOWMOVER_CONTROL_TOP_H
#define FLOWMOVER_CONTROL_TOP_H

#include "../ipc/counters.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A read-only mapping of SOCKET.counters.  moverd may rewrite the header
 * under it, so its shape is copied once checked (fmc_map_open) and only
 * the copies are used to find records. */
struct fmc_map {
	const struct fmc_header *h;
	size_t bytes;
	unsigned long ino;
	uint32_t n_flow, n_peer;
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

/*
 * Text that came from moverd (its answers, its counters file, a peer's
 * words through either), written where a person reads it: control
 * characters would be terminal escape sequences, so C0, DEL and C1 (raw
 * bytes 0x80-0x9f, and U+0080-U+009F encoded in UTF-8) and any byte that
 * is not part of valid UTF-8 print as '?'.  Every such string on stdout
 * and stderr goes through here; JSON output through out_json_str.
 */
void out_text(FILE *f, const char *s);

/* The same string as a JSON string (quoted): controls, DEL and C1 escaped
 * as \uXXXX, bytes that are not UTF-8 as \ufffd. */
void out_json_str(FILE *f, const char *s);

/* moverctl top [--once] [--json]; returns an exit status. */
int top_main(const char *socket_path, bool once, bool json);

#endif
