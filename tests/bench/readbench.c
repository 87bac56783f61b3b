/*
 * tests/bench/readbench.c - the consumer's cost per record alone: a ring
 * filled by a producer (not timed), then drained (timed) one record at a
 * time with peek/release, or N at a time with peek_batch/release_batch.
 * The two are interleaved round by round in one process, so that both see
 * the same machine; the figure is their ratio.  A program, not a test.
 *
 *   readbench [SIZE [SECONDS [BATCH]]]     default 32 B, 2 s, batch 64
 */
#include "flowshm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RING (2u << 20)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "readbench: %s: %s\n", what, flowshm_strerror(rc));
	exit(1);
}

/* Fill the ring until a send finds no room; returns the records sent. */
static uint64_t fill(flowshm_t *p, size_t size)
{
	static unsigned char buf[64][65536];
	struct iovec iov[64];
	uint64_t n = 0;
	unsigned sent;

	for (unsigned i = 0; i < 64; i++)
		iov[i] = (struct iovec){ buf[i], size };
	while (flowshm_send_batch(p, iov, 64, &sent, 0) == 0)
		n += sent;
	return n;
}

/* Drain n records; a checksum of the first byte keeps the reads real. */
static unsigned drain_peek(flowshm_t *c, uint64_t n)
{
	unsigned sum = 0;

	for (uint64_t i = 0; i < n; i++) {
		const void *d;
		size_t len;
		int rc = flowshm_peek(c, &d, &len, 0);

		if (rc)
			die("peek", rc);
		sum += *(const unsigned char *)d;
		flowshm_release(c);
	}
	return sum;
}

static unsigned drain_batch(flowshm_t *c, uint64_t n, unsigned batch)
{
	struct flowshm_rec recs[1024];
	unsigned sum = 0;

	while (n) {
		unsigned got;
		int rc = flowshm_peek_batch(c, recs, batch, &got, 0);

		if (rc)
			die("peek_batch", rc);
		for (unsigned k = 0; k < got; k++)
			sum += *(const unsigned char *)recs[k].data;
		flowshm_release_batch(c);
		n -= got;
	}
	return sum;
}

int main(int argc, char **argv)
{
	size_t size = argc > 1 ? strtoul(argv[1], NULL, 0) : 32;
	double secs = argc > 2 ? atof(argv[2]) : 2.0;
	unsigned batch = argc > 3 ? (unsigned)atoi(argv[3]) : 64;
	struct flowshm_ring_params rp = { RING, 65536, 0 };
	uint64_t t[2] = { 0, 0 }, recs[2] = { 0, 0 }, end;
	flowshm_t *p, *c;
	unsigned sum = 0;
	int fd, rc;

	if (size < 1 || size > 65536 || batch < 1 || batch > 1024 || secs <= 0)
		return fprintf(stderr, "usage: readbench [SIZE [SECONDS "
			       "[BATCH]]]\n"), 2;
	if ((rc = flowshm_ring_create(&rp, NULL, &fd)) ||
	    (rc = flowshm_open_fd(fd, FLOWSHM_CONSUMER, NULL, &c)) ||
	    (rc = flowshm_open_fd(fd, FLOWSHM_PRODUCER, NULL, &p)))
		die("ring", rc);
	end = now_ns() + (uint64_t)(secs * 1e9);
	for (unsigned round = 0; now_ns() < end || round < 4; round++) {
		unsigned m = round & 1;
		uint64_t n = fill(p, size), t0 = now_ns();

		sum += m ? drain_batch(c, n, batch) : drain_peek(c, n);
		t[m] += now_ns() - t0;
		recs[m] += n;
	}
	printf("readbench: %zu B records, ring %u KiB, full ring drained in "
	       "place, rounds interleaved (checksum %u)\n", size, RING >> 10,
	       sum & 0xff);
	/* one byte of each record is read: records/s is the overhead per
	 * record, not a bandwidth */
	printf("  peek + release       %12.0f records/s\n",
	       recs[0] / (t[0] / 1e9));
	printf("  peek_batch(%4u)     %12.0f records/s\n", batch,
	       recs[1] / (t[1] / 1e9));
	printf("  batch / one at a time: %.2fx\n",
	       (recs[1] / (double)t[1]) / (recs[0] / (double)t[0]));
	flowshm_close(p);
	flowshm_close(c);
	close(fd);
	return 0;
}
