/*
 * contrib/pipeline/frame.h - the records of the example pipeline.
 *
 * A sensor frame (ingest -> transform): struct frame_hdr, then n float32
 * samples.  A result (transform -> sink): struct result, the frame's
 * statistics as numpy computes them (float64).  Samples are a function of
 * (sensor, seq, i) alone, so the sink can recompute every result and tell
 * a wrong, stale or torn frame from the right one.  Little-endian, packed
 * as transform.py's struct formats say.
 */
#ifndef PIPELINE_FRAME_H
#define PIPELINE_FRAME_H

#include <math.h>
#include <stdint.h>

#define FRAME_MAGIC  0x4d415246u	/* "FRAM" */
#define RESULT_MAGIC 0x544c5352u	/* "RSLT" */

struct frame_hdr {		/* struct "<IIQQII" in transform.py */
	uint32_t magic;
	uint32_t sensor;
	uint64_t seq;
	uint64_t t_ns;		/* CLOCK_REALTIME when ingested */
	uint32_t n;		/* float32 samples after the header */
	uint32_t pad;
};

/*
 * The most samples a frame holds: one record of at most 64 KiB, header
 * included, the max record of run.sh's (and the test's) frames flow.  The
 * ingest sends no more (nor more than its flow's max record takes), and
 * the sink takes a result that says more for a wrong one.
 */
#define FRAME_MAX_RECORD  65536u
#define FRAME_MAX_SAMPLES ((FRAME_MAX_RECORD - 32u) / 4u)	/* 16376 */

struct result {			/* struct "<IIQQII4d" in transform.py */
	uint32_t magic;
	uint32_t sensor;
	uint64_t seq;
	uint64_t t_ns;		/* the frame's */
	uint32_t n;
	uint32_t pad;
	double mean, min, max, rms;
};

static inline uint64_t frame_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Sample i of frame seq of a sensor: a wave per sensor plus noise. */
static inline float frame_sample(uint32_t sensor, uint64_t seq, uint32_t i)
{
	double noise = (double)(frame_mix(seq << 16 ^ i ^
					  (uint64_t)sensor << 48) & 0xffff) /
		       65536.0 - 0.5;

	return (float)(sin((double)(seq % 100000) * 0.37 + i * 0.05 + sensor) *
		       (1.0 + sensor) + noise * 0.1);
}

#endif
