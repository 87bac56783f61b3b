/*
 * ipc/bell.h - moverd's doorbell page: how producers of every flow of a
 * daemon (of one uid: one page per uid) wake it through ONE futex word
 * (ring format 2, see ring.h).
 *
 * ---------------------------------------------------------------------------
 * Layout (a memfd moverd creates at start and hands to every client with
 * the ring fd at attach; clients map it shared, read-write)
 * ---------------------------------------------------------------------------
 *
 *   line 0   identity   magic, version, nbits, moverd's pid and start epoch:
 *                       written once by moverd
 *   line 1   wake       futex word + "moverd is sleeping" flag
 *   line 2.. summary    bit w of summary[w / 64] set: bits[w] may be non-zero
 *   4096..   bits       one bit per flow (moverd's bell index of the flow)
 *
 * Ringing (a producer, after committing records and finding the ring's
 * bell_armed set, see ring.h "Doorbell"): fetch_or the flow's bit, then its
 * summary bit, then a full fence, then read `sleeping`; only if it is set,
 * bump the futex word and FUTEX_WAKE.  No system call while moverd is awake.
 *
 * Collecting (moverd, each duty cycle): exchange each non-zero summary word
 * with 0, then each bits word it names with 0 (acquire), and visit those
 * flows only.  Sleeping: read the futex word, set `sleeping`, full fence,
 * collect once more, and FUTEX_WAIT only if nothing was there (the Dekker
 * pairing of the ring's wake protocol, with the same two fences).
 *
 * moverd makes one page per uid of producers (moverd/peer.h, struct
 * bell_page; past 63 uids at once, one page the rest share): a flow's
 * bit has the same index in every page, and the attach answer carries
 * the page of the attaching client's uid.  A page is
 * shared by the clients of that uid, so a hostile client can set bits of
 * its page (moverd visits flows with nothing to do: bounded, wasted work)
 * or clear them and `sleeping` (its own uid's rings are lost), never
 * another user's own page; on the page the uids past the 63rd share, the
 * other sharing uids' rings too.  moverd therefore never relies on the
 * bits alone: a
 * sweep on its timer re-checks every armed flow, so a cleared bit delays
 * that flow by at most the sweep period and corrupts nothing.  Bits a
 * client reads or writes are never trusted as indexes by moverd beyond
 * the ones it handed out, which moverd keeps privately.
 *
 * A sleeping moverd waits on the futex words of all its pages at once
 * (FUTEX_WAITV); each page pairs its producers with moverd as below.
 */
#ifndef FLOWMOVER_IPC_BELL_H
#define FLOWMOVER_IPC_BELL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FB_MAGIC    0x4c4c45424d574c46ULL /* "FLWMBELL" in memory */
#define FB_VERSION  1u
#define FB_LINE     128u
#define FB_BITS     65536u                /* flows a daemon can ring for */
#define FB_WORDS    (FB_BITS / 64u)
#define FB_SUMMARY  (FB_WORDS / 64u)
#define FB_BITS_OFF 4096u
#define FB_BYTES    (FB_BITS_OFF + FB_WORDS * 8u)

struct fr_bell {
	_Alignas(FB_LINE) uint64_t magic;
	uint32_t version;
	uint32_t nbits;
	uint32_t daemon_pid;
	uint32_t pad_;
	uint64_t epoch;              /* moverd start count */
	_Alignas(FB_LINE) _Atomic uint32_t futex;
	_Atomic uint32_t sleeping;
	_Alignas(FB_LINE) _Atomic uint64_t summary[FB_SUMMARY];
	_Alignas(4096) _Atomic uint64_t bits[FB_WORDS];
};

_Static_assert(sizeof(struct fr_bell) == FB_BYTES, "bell page layout");

/* Client: check a mapping of `bytes` bytes; 0 or -EPROTO. */
int fb_check(const struct fr_bell *b, size_t bytes);

/* Client: ring bit idx (idx < FB_BITS, checked by the caller at attach). */
void fb_ring(struct fr_bell *b, uint32_t idx);

/* moverd: format a zeroed mapping of FB_BYTES. */
void fb_format(struct fr_bell *b, uint64_t epoch);

/* moverd: take up to max rung indexes into ids (clears them); returns how
 * many.  More may remain when it returns max: call again. */
unsigned fb_collect(struct fr_bell *b, uint32_t *ids, unsigned max);

/* moverd: before sleeping on the futex word (value *v): set `sleeping`,
 * fence; returns 1 if a bit is set (do not sleep: collect), else 0. */
int fb_prepare_sleep(struct fr_bell *b, uint32_t *v);
void fb_woke(struct fr_bell *b);

#endif
