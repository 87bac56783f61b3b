/*
 * tests/testutil.h - the few helpers every test program shares: checks that
 * stop the test with file and line, deterministic record contents, and
 * ring creation shortcuts.
 */
#ifndef FLOWMOVER_TESTUTIL_H
#define FLOWMOVER_TESTUTIL_H

#include "flowshm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A macro: it must report the caller's file and line. */
#define CHECK(cond)                                                        \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n",       \
				__FILE__, __LINE__, #cond);                \
			exit(1);                                           \
		}                                                          \
	} while (0)

#define CHECK_RC(expr, want)                                               \
	do {                                                               \
		int rc_ = (expr);                                          \
		if (rc_ != (want)) {                                       \
			fprintf(stderr, "%s:%d: %s = %d (%s), want %d\n",  \
				__FILE__, __LINE__, #expr, rc_,            \
				flowshm_strerror(rc_), (want));            \
			exit(1);                                           \
		}                                                          \
	} while (0)

static inline uint64_t tu_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* splitmix64: a reproducible stream from any seed. */
static inline uint64_t tu_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/*
 * Record contents used by the stress tests: a 16-byte header (producer id,
 * sequence number) then bytes derived from both, so the consumer can check
 * every byte without being told what was sent.
 */
struct tu_rec_hdr {
	uint32_t producer;
	uint32_t len;
	uint64_t seq;
};

static inline size_t tu_rec_len(uint32_t producer, uint64_t seq,
				size_t min, size_t max)
{
	return min + tu_mix(((uint64_t)producer << 40) ^ seq) % (max - min + 1);
}

static inline void tu_fill(void *buf, uint32_t producer, uint64_t seq,
			   size_t len)
{
	struct tu_rec_hdr h = { producer, (uint32_t)len, seq };
	unsigned char *p = buf;
	uint64_t x = ((uint64_t)producer << 48) ^ seq;

	memcpy(p, &h, sizeof(h) < len ? sizeof(h) : len);
	for (size_t i = sizeof(h); i < len; i++) {
		if ((i & 7) == 0)
			x = tu_mix(x);
		p[i] = (unsigned char)(x >> ((i & 7) * 8));
	}
}

/* 1 when buf holds exactly what tu_fill(producer, seq, len) writes. */
static inline int tu_verify(const void *buf, size_t len, uint32_t *producer,
			    uint64_t *seq)
{
	struct tu_rec_hdr h;
	unsigned char want[1 << 16];

	if (len < sizeof(h) || len > sizeof(want))
		return 0;
	memcpy(&h, buf, sizeof(h));
	if (h.len != len)
		return 0;
	tu_fill(want, h.producer, h.seq, len);
	if (memcmp(want, buf, len))
		return 0;
	*producer = h.producer;
	*seq = h.seq;
	return 1;
}

static inline int tu_ring(uint64_t size, uint32_t max_record, uint32_t flags)
{
	struct flowshm_ring_params p = { size, max_record, flags };
	int fd = -1;

	CHECK_RC(flowshm_ring_create(&p, NULL, &fd), 0);
	return fd;
}

static inline flowshm_t *tu_open(int fd, enum flowshm_role role,
				 uint64_t recover_ns)
{
	struct flowshm_opts o = { .recover_ns = recover_ns };
	flowshm_t *f = NULL;

	CHECK_RC(flowshm_open_fd(fd, role, &o, &f), 0);
	return f;
}

static inline long tu_env_long(const char *name, long dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtol(v, NULL, 0) : dflt;
}

/*
 * Run `BIN --socket SOCK ARGS` (ARGS from fmt and ap), killed after 20 s.
 * Returns its exit code (128 if it did not exit); its stdout and stderr go
 * to out (NUL-terminated; out may be NULL), the rest is read and dropped.
 */
static inline int tu_vmoverctl(const char *bin, const char *sock, char *out,
			       size_t cap, const char *fmt, va_list ap)
{
	char cmd[1024], args[768], sink[4096];
	size_t n;
	FILE *p;
	int s;

	vsnprintf(args, sizeof(args), fmt, ap);
	snprintf(cmd, sizeof(cmd), "timeout -k 2 20 %s --socket %s %s 2>&1",
		 bin, sock, args);
	fflush(NULL);
	p = popen(cmd, "r");
	CHECK(p);
	if (!out || !cap) {
		out = sink;
		cap = sizeof(sink);
	}
	n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	while (fread(sink, 1, sizeof(sink), p) > 0)
		;
	s = pclose(p);
	return WIFEXITED(s) ? WEXITSTATUS(s) : 128;
}

#endif
