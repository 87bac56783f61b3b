/*
 * flowdemo - a producer or a consumer of a flow attached by name, printing
 * its rate.  The README's demo runs one of each.
 *
 *   flowdemo produce FLOW [--count N] [--size BYTES] [--batch K]
 *   flowdemo consume FLOW [--count N]
 *
 * The producer numbers its records; the consumer checks the numbers (and
 * the sizes) and fails on any gap, duplicate or reorder.
 */
#include "flowshm.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct args {
	const char *mode, *flow;
	unsigned long long count;
	size_t size;
	unsigned batch;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void report(const char *what, unsigned long long n, size_t bytes,
		   double secs)
{
	printf("flowdemo %s: %llu records, %.1f MB in %.3f s: %.2f M records/s, "
	       "%.3f GB/s\n", what, n, bytes / 1e6, secs, n / secs / 1e6,
	       bytes / secs / 1e9);
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "flowdemo: %s: %s\n", what, flowshm_strerror(rc));
	return 1;
}

static int produce(flowshm_t *f, const struct args *a)
{
	unsigned char *buf = calloc(a->batch, a->size);
	struct iovec *iov = calloc(a->batch, sizeof(*iov));
	unsigned long long seq = 0;
	double t0 = now_s();
	int rc = 0;

	if (!buf || !iov)
		return 1;
	while (seq < a->count) {
		unsigned k = 0, sent;

		for (; k < a->batch && seq + k < a->count; k++) {
			unsigned long long s = seq + k;
			memcpy(buf + (size_t)k * a->size, &s, sizeof(s));
			iov[k] = (struct iovec){ buf + (size_t)k * a->size, a->size };
		}
		rc = flowshm_send_batch(f, iov, k, &sent, -1);
		if (rc)
			break;
		seq += sent;
	}
	free(buf);
	free(iov);
	if (seq < a->count)
		return fail("send", rc);
	report("producer", seq, seq * a->size, now_s() - t0);
	return 0;
}

static int consume(flowshm_t *f, const struct args *a)
{
	static unsigned char buf[1 << 20];
	struct iovec recs[256];
	unsigned long long seq = 0;
	size_t bytes = 0;
	double t0 = 0;

	while (seq < a->count) {
		unsigned got;
		int rc = flowshm_recv_batch(f, buf, sizeof(buf), recs, 256, &got,
					    -1);

		if (rc == -EPIPE)
			break;
		if (rc)
			return fail("recv", rc);
		if (!t0)
			t0 = now_s();
		for (unsigned i = 0; i < got; i++, seq++) {
			unsigned long long s;

			memcpy(&s, recs[i].iov_base, sizeof(s));
			if (s != seq || recs[i].iov_len < sizeof(s)) {
				fprintf(stderr, "flowdemo: record %llu carries "
					"number %llu\n", seq, s);
				return 1;
			}
			bytes += recs[i].iov_len;
		}
	}
	report("consumer", seq, bytes, now_s() - t0);
	return seq == a->count ? 0 : 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "count", required_argument, NULL, 'n' },
		{ "size", required_argument, NULL, 's' },
		{ "batch", required_argument, NULL, 'b' },
		{ 0 }
	};
	struct args a = { .count = 10000000, .size = 64, .batch = 64 };
	flowshm_t *f;
	int c, rc;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'n')
			a.count = strtoull(optarg, NULL, 0);
		else if (c == 's')
			a.size = strtoull(optarg, NULL, 0);
		else if (c == 'b')
			a.batch = (unsigned)strtoul(optarg, NULL, 0);
		else
			return 2;
	}
	if (argc - optind != 2 || a.size < 8 || !a.batch ||
	    (strcmp(argv[optind], "produce") && strcmp(argv[optind], "consume"))) {
		fprintf(stderr, "usage: flowdemo produce|consume FLOW [--count N] "
			"[--size BYTES>=8] [--batch K]\n");
		return 2;
	}
	a.mode = argv[optind];
	a.flow = argv[optind + 1];
	rc = flowshm_attach(a.flow, a.mode[0] == 'p' ? FLOWSHM_PRODUCER :
						       FLOWSHM_CONSUMER, NULL, &f);
	if (rc)
		return fail(a.flow, rc);
	rc = a.mode[0] == 'p' ? produce(f, &a) : consume(f, &a);
	flowshm_detach(f);
	return rc;
}
