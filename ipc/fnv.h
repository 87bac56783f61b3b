/*
 * ipc/fnv.h - FNV-1a (Fowler/Noll/Vo): a short, fast hash of bytes for table buckets,
 * tags and test salts.  It is not keyed: where a remote or local party
 * chooses the bytes and could aim them at one bucket, mix a per-start seed
 * into the start (the `seed` argument; moverd/flows.c).  Its values are
 * part of the wire in one place (a subscription's tag, moverd/peer.c
 * sub_tag) and of the tests' record sizes (tests/flowcheck.c): they must
 * not change.
 */
#ifndef FM_FNV_H
#define FM_FNV_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The n bytes at p, on from a hash h so far (chaining fields). */
static inline uint32_t fnv1a32_more(uint32_t h, const void *p, size_t n)
{
	const unsigned char *c = p;

	while (n--)
		h = (h ^ *c++) * 16777619u;
	return h;
}

/* The n bytes at p, from the offset basis xor seed (0: plain FNV-1a). */
static inline uint32_t fnv1a32(uint32_t seed, const void *p, size_t n)
{
	return fnv1a32_more(2166136261u ^ seed, p, n);
}

static inline uint32_t fnv1a32_str(uint32_t seed, const char *s)
{
	return fnv1a32(seed, s, strlen(s));
}

static inline uint64_t fnv1a64(uint64_t seed, const void *p, size_t n)
{
	const unsigned char *c = p;
	uint64_t h = 0xcbf29ce484222325ull ^ seed;

	while (n--)
		h = (h ^ *c++) * 0x100000001b3ull;
	return h;
}

static inline uint64_t fnv1a64_str(uint64_t seed, const char *s)
{
	return fnv1a64(seed, s, strlen(s));
}

#endif
