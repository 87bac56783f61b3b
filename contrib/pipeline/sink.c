/*
 * contrib/pipeline/sink.c - stage 3 (C): write every result once.
 *
 *   pipeline_sink FLOW --out FILE [--count N]
 *
 * Results must come in frame order.  A result of a frame already written is
 * a duplicate (the transform was killed after it sent the result and before
 * its input flow recorded the frame as released, and sent it again after
 * its restart): dropped and counted.  A frame that skips ahead means a frame was lost: the sink fails.
 * Every result is checked against the frame recomputed from (sensor, seq),
 * so a result of a wrong or torn frame fails too.  FILE gets one line per
 * frame: seq sensor mean min max rms.  Stops after frame N-1 (--count N),
 * or at SIGINT/SIGTERM; prints what it did, FAILED (exit 1) if FILE could
 * not be written.
 */
#include "flowshm.h"
#include "frame.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stop;	/* a signal flag, not a fence */

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int close_enough(double got, double want)
{
	return fabs(got - want) <= 1e-9 * (1.0 + fabs(want));
}

/* 1 when r holds the statistics of the frame it names. */
static int result_ok(const struct result *r)
{
	double sum = 0, sq = 0, min = INFINITY, max = -INFINITY;

	if (r->magic != RESULT_MAGIC || r->n == 0 || r->n > FRAME_MAX_SAMPLES)
		return 0;
	for (uint32_t i = 0; i < r->n; i++) {
		double x = frame_sample(r->sensor, r->seq, i);

		sum += x;
		sq += x * x;
		min = x < min ? x : min;
		max = x > max ? x : max;
	}
	return close_enough(r->mean, sum / r->n) && r->min == min &&
	       r->max == max && close_enough(r->rms, sqrt(sq / r->n));
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "out", required_argument, NULL, 'o' },
		{ "count", required_argument, NULL, 'c' },
		{ 0 }
	};
	uint64_t count = 0, next = 0, dups = 0, lat_sum = 0;
	const char *out_path = NULL;
	struct result r;
	flowshm_t *f;
	FILE *out;
	int c, rc, failed = 0;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'o')
			out_path = optarg;
		else if (c == 'c')
			count = strtoull(optarg, NULL, 0);
		else
			goto usage;
	}
	if (argc - optind != 1 || !out_path)
		goto usage;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	out = fopen(out_path, "w");
	if (!out) {
		perror(out_path);
		return 1;
	}
	rc = flowshm_attach(argv[optind], FLOWSHM_CONSUMER, NULL, &f);
	if (rc) {
		fprintf(stderr, "sink: %s\n", flowshm_attach_error());
		return 1;
	}
	while (!stop && (!count || next < count)) {
		size_t len;

		/* a bounded wait: notice a stop, flush the file when idle */
		rc = flowshm_recv(f, &r, sizeof(r), &len, 200000000);
		if (rc == -ETIMEDOUT) {
			if (fflush(out)) {
				fprintf(stderr, "sink: %s: %s\n", out_path,
					strerror(errno));
				failed = 1;
				break;
			}
			continue;
		}
		if (rc) {
			fprintf(stderr, "sink: recv: %s\n", flowshm_strerror(rc));
			failed = 1;
			break;
		}
		if (len < offsetof(struct result, seq) + sizeof(r.seq)) {
			fprintf(stderr, "sink: bad result of %zu bytes (too "
				"short to name its frame)\n", len);
			failed = 1;
			break;
		}
		if (len != sizeof(r) || !result_ok(&r)) {
			fprintf(stderr, "sink: bad result of %zu bytes (frame "
				"%" PRIu64 ")\n", len, r.seq);
			failed = 1;
			break;
		}
		if (r.seq < next) {
			dups++;
			continue;
		}
		if (r.seq > next) {
			fprintf(stderr, "sink: frame %" PRIu64 " lost (next is "
				"%" PRIu64 ")\n", next, r.seq);
			failed = 1;
			break;
		}
		if (fprintf(out, "%" PRIu64 " %" PRIu32 " %.9g %.9g %.9g %.9g\n",
			    r.seq, r.sensor, r.mean, r.min, r.max, r.rms) < 0) {
			fprintf(stderr, "sink: %s: %s\n", out_path,
				strerror(errno));
			failed = 1;
			break;
		}
		lat_sum += realtime_ns() - r.t_ns;
		next++;
	}
	/* what stdio still holds is written now: a full disk shows here */
	if (fclose(out)) {
		fprintf(stderr, "sink: %s: %s\n", out_path, strerror(errno));
		failed = 1;
	}
	flowshm_detach(f);
	printf("sink: %" PRIu64 " frames written once each, %" PRIu64
	       " duplicates dropped, mean latency %.3f ms%s\n", next, dups,
	       next ? (double)lat_sum / (double)next / 1e6 : 0.0,
	       failed ? ", FAILED" : "");
	return failed;
usage:
	fprintf(stderr, "usage: pipeline_sink FLOW --out FILE [--count N]\n");
	return 2;
}
