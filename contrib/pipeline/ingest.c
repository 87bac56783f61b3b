/*
 * contrib/pipeline/ingest.c - stage 1 (C, host A): synthetic sensor frames
 * into a flow, as fast as asked.
 *
 *   pipeline_ingest FLOW [--count N] [--rate FRAMES/S] [--samples N]
 *                        [--sensors S]
 *
 * Frames 0..N-1 (N = 0: until SIGINT/SIGTERM), round robin over S sensors,
 * paced to --rate (0: unpaced), of --samples float32 each (default 256;
 * at most what the flow's max record holds after the 32-byte header, and
 * FRAME_MAX_SAMPLES).  Prints how many it sent when it stops.
 */
#include "flowshm.h"
#include "frame.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
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

static uint64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleep until frame `sent` is due at `rate` frames/s after t0. */
static void pace(uint64_t t0, uint64_t sent, uint64_t rate)
{
	uint64_t due = t0 + sent * 1000000000ull / rate, now;
	struct timespec ts;

	now = clock_ns(CLOCK_MONOTONIC);
	if (due <= now)
		return;
	ts.tv_sec = (time_t)((due - now) / 1000000000ull);
	ts.tv_nsec = (long)((due - now) % 1000000000ull);
	nanosleep(&ts, NULL);
}

static void write_frame(void *buf, uint32_t sensor, uint64_t seq,
			uint32_t n)
{
	struct frame_hdr h = { FRAME_MAGIC, sensor, seq,
			       clock_ns(CLOCK_REALTIME), n, 0 };
	float *x = (float *)((char *)buf + sizeof(h));

	memcpy(buf, &h, sizeof(h));
	for (uint32_t i = 0; i < n; i++)
		x[i] = frame_sample(sensor, seq, i);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "count", required_argument, NULL, 'c' },
		{ "rate", required_argument, NULL, 'r' },
		{ "samples", required_argument, NULL, 'n' },
		{ "sensors", required_argument, NULL, 's' },
		{ 0 }
	};
	uint64_t count = 0, rate = 0, seq = 0, t0;
	uint32_t n = 256, sensors = 4, max_n;
	struct flowshm_info info;
	unsigned long v;
	flowshm_t *f;
	int c, rc;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'c')
			count = strtoull(optarg, NULL, 0);
		else if (c == 'r')
			rate = strtoull(optarg, NULL, 0);
		else if (c == 'n')
			n = (v = strtoul(optarg, NULL, 0)) > FRAME_MAX_SAMPLES ?
			    FRAME_MAX_SAMPLES + 1 : (uint32_t)v;
		else if (c == 's')
			sensors = (uint32_t)strtoul(optarg, NULL, 0);
		else
			goto usage;
	}
	if (argc - optind != 1 || n == 0 || sensors == 0)
		goto usage;
	if (n > FRAME_MAX_SAMPLES) {
		fprintf(stderr, "ingest: --samples: at most %u (a frame is one "
			"record of at most %u bytes with its %zu-byte header)\n",
			FRAME_MAX_SAMPLES, FRAME_MAX_RECORD,
			sizeof(struct frame_hdr));
		return 2;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	rc = flowshm_attach(argv[optind], FLOWSHM_PRODUCER, NULL, &f);
	if (rc) {
		fprintf(stderr, "ingest: %s\n", flowshm_attach_error());
		return 1;
	}
	/* a frame is one record: what the flow's max record holds */
	rc = flowshm_info(f, &info);
	max_n = rc || info.max_record < sizeof(struct frame_hdr) ? 0 :
		(uint32_t)((info.max_record - sizeof(struct frame_hdr)) /
			   sizeof(float));
	if (n > max_n) {
		fprintf(stderr, "ingest: --samples %u: a frame of %zu bytes does "
			"not fit flow %s's max record of %u bytes (at most %u "
			"samples)\n", n, sizeof(struct frame_hdr) + n *
			sizeof(float), argv[optind], rc ? 0 : info.max_record,
			max_n);
		flowshm_detach(f);
		return 2;
	}
	t0 = clock_ns(CLOCK_MONOTONIC);
	while (!stop && (!count || seq < count)) {
		size_t len = sizeof(struct frame_hdr) + n * sizeof(float);
		void *buf;

		if (rate)
			pace(t0, seq, rate);
		/* a bounded wait, to notice a stop while the flow is full */
		rc = flowshm_reserve(f, len, &buf, 200000000);
		if (rc == -ETIMEDOUT)
			continue;
		if (rc) {
			fprintf(stderr, "ingest: reserve: %s\n",
				flowshm_strerror(rc));
			break;
		}
		write_frame(buf, (uint32_t)(seq % sensors), seq, n);
		flowshm_commit(f);
		seq++;
	}
	printf("ingest: sent %" PRIu64 " frames\n", seq);
	fflush(stdout);
	flowshm_detach(f);
	return rc && rc != -ETIMEDOUT ? 1 : 0;
usage:
	fprintf(stderr, "usage: pipeline_ingest FLOW [--count N] "
		"[--rate FRAMES/S] [--samples N] [--sensors S]\n");
	return 2;
}
