/*
 * moverd/ring_guard.h - moverd survives a client that shrinks a ring file.
 *
 * A ring file (a flow between hosts) is handed to its clients as it is: a
 * writable fd, which can ftruncate it.  moverd's next touch of a page past
 * the new end would be SIGBUS.  moverd registers its mapping of every ring
 * file here; the SIGBUS handler replaces a registered mapping that faults
 * with anonymous memory (reads then see zeros: no record, nothing to send)
 * and marks it tripped, and the flow is failed on the next check
 * (flows_ring_tampered).  A SIGBUS anywhere else is fatal as before.
 * The kernel's own copies into or out of such a page (a socket receive
 * or send) fail with EFAULT instead: tcp.c hands those to peer_rx_fault
 * and peer_tx_fault, which fail that flow and keep the link.
 *
 * All of moverd's user-space ring accesses run on the main thread; the
 * handler runs there, synchronously, so the registry needs no lock.
 */
#ifndef MOVERD_RING_GUARD_H
#define MOVERD_RING_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Install the SIGBUS handler; 0 or -errno. */
int ring_guard_init(void);
/* Guard [addr, addr + len): its id, or 0 (out of memory).  An older
 * entry overlapping it (a mapping since unmapped) is forgotten. */
uint64_t ring_guard_add(void *addr, size_t len);
/* Stop guarding, after the last touch of the mapping: flowshm_close
 * writes moverd's slot before it unmaps, so it comes first (an entry
 * whose range was unmapped faults nothing; a later add over the same
 * addresses forgets it).  Unknown ids are fine. */
void ring_guard_remove(uint64_t id);
/* Did that mapping fault (and get replaced) since last asked? */
bool ring_guard_tripped(uint64_t id);
/* Has any guard tripped that was not asked about yet?  One load. */
bool ring_guard_any(void);

#endif
