/*
 * tests/flowcheck.c - a checking producer or consumer of a flow attached by
 * name, for test scripts whose producers and consumers run on different
 * hosts (tests/rdma/moverd-pair.sh).
 *
 *   flowcheck produce FLOW --id ID --count N [--max-size B] [--skip SEQ]
 *   flowcheck consume FLOW --producers P --count N [--max-size B]
 *             [--attach-wait MS]
 *
 * Producer ID (1..P) sends records 0..N-1 of random sizes (16..B bytes,
 * one in 64 up to 4 times larger, never above the flow's maximum) and
 * contents (testutil.h: tu_fill), both derived from the flow's name, ID and
 * the sequence number.  The consumer expects N records from each producer
 * 1..P, in order per producer, and checks every record's size and every
 * byte; it fails at the first wrong, missing, duplicated, reordered or
 * misdirected (another flow's) record, and if anything is left in the flow
 * after the last expected record.
 *
 * --attach-wait MS attaches with flowshm_attach_wait: the flow may appear
 * up to MS later (issue 15).
 *
 * --skip SEQ makes the producer leave out record SEQ: a dropped record, to
 * show by hand that the consumer (and the test using it) notices.
 */
#include "flowshm.h"
#include "testutil.h"
#include "../ipc/fnv.h"

#include <getopt.h>
#include <inttypes.h>

#define MAX_PRODUCERS 64
#define MIN_SIZE sizeof(struct tu_rec_hdr)

struct args {
	const char *flow;
	int produce;
	uint32_t id, producers;
	uint32_t salt;	/* the flow name's hash, high 24 bits */
	uint64_t count, skip;
	size_t max_size;
	int64_t attach_wait_ns;	/* 0: flowshm_attach */
};

/* Records carry producer number salt | ID: records of another flow fail. */
static uint32_t flow_salt(const char *flow)
{
	return fnv1a32_str(0, flow) & ~0xffu;
}

/* The size of record SEQ of producer WIRE_ID (salt | ID). */
static size_t rec_size(const struct args *a, uint32_t max_record,
		       uint32_t wire_id, uint64_t seq)
{
	size_t max = a->max_size;

	if ((tu_mix(((uint64_t)wire_id << 32) ^ seq ^ 0xb16) & 63) == 0)
		max *= 4;
	if (max > max_record)
		max = max_record;
	return tu_rec_len(wire_id, seq, MIN_SIZE, max);
}

static int fail_rc(const char *what, int rc)
{
	fprintf(stderr, "flowcheck: %s: %s\n", what, flowshm_strerror(rc));
	return 1;
}

static uint32_t max_record_of(flowshm_t *f)
{
	struct flowshm_info info;

	CHECK_RC(flowshm_info(f, &info), 0);
	return info.max_record;
}

static int produce(flowshm_t *f, const struct args *a)
{
	uint32_t max_record = max_record_of(f), wire_id = a->salt | a->id;
	unsigned char *buf = malloc(max_record);
	uint64_t sent = 0, bytes = 0;

	CHECK(buf);
	for (uint64_t seq = 0; seq < a->count; seq++) {
		size_t len = rec_size(a, max_record, wire_id, seq);
		int rc;

		if (seq == a->skip)
			continue;
		tu_fill(buf, wire_id, seq, len);
		rc = flowshm_send(f, buf, len, -1);
		if (rc) {
			free(buf);
			return fail_rc("send", rc);
		}
		sent++;
		bytes += len;
	}
	free(buf);
	printf("flowcheck producer %s/%" PRIu32 ": %" PRIu64 " records, %"
	       PRIu64 " bytes\n", a->flow, a->id, sent, bytes);
	return 0;
}

/* Check one received record against what producer ID sends as its next. */
static int check_record(const struct args *a, uint32_t max_record,
			const struct iovec *rec, uint64_t *next)
{
	uint32_t wire_id = 0, id;
	uint64_t seq = 0;
	struct tu_rec_hdr h = { 0 };

	if (!tu_verify(rec->iov_base, rec->iov_len, &wire_id, &seq)) {
		memcpy(&h, rec->iov_base,
		       rec->iov_len < sizeof(h) ? rec->iov_len : sizeof(h));
		fprintf(stderr, "flowcheck: %s: corrupt record of %zu bytes "
			"(header: producer %" PRIu32 ", seq %" PRIu64
			", len %" PRIu32 ")\n", a->flow, rec->iov_len,
			h.producer, h.seq, h.len);
		return 1;
	}
	id = wire_id & 0xff;
	if ((wire_id & ~0xffu) != a->salt || id < 1 || id > a->producers) {
		fprintf(stderr, "flowcheck: %s: record from unknown producer "
			"%#" PRIx32 " (another flow's?)\n", a->flow, wire_id);
		return 1;
	}
	if (seq != next[id] || seq >= a->count) {
		fprintf(stderr, "flowcheck: %s: producer %" PRIu32 ": got "
			"record %" PRIu64 ", expected %" PRIu64 " (of %" PRIu64
			")\n", a->flow, id, seq, next[id], a->count);
		return 1;
	}
	if (rec->iov_len != rec_size(a, max_record, wire_id, seq)) {
		fprintf(stderr, "flowcheck: %s: producer %" PRIu32 " record %"
			PRIu64 ": %zu bytes, expected %zu\n", a->flow, id, seq,
			rec->iov_len, rec_size(a, max_record, wire_id, seq));
		return 1;
	}
	next[id]++;
	return 0;
}

static int consume(flowshm_t *f, const struct args *a)
{
	static unsigned char buf[1 << 20];
	uint32_t max_record = max_record_of(f);
	uint64_t next[MAX_PRODUCERS + 1] = { 0 };
	uint64_t got_total = 0, want = a->count * a->producers, bytes = 0;
	struct iovec recs[256];
	unsigned got;
	int rc;

	while (got_total < want) {
		rc = flowshm_recv_batch(f, buf, sizeof(buf), recs, 256, &got,
					-1);
		if (rc)
			return fail_rc("recv", rc);
		for (unsigned i = 0; i < got; i++) {
			if (check_record(a, max_record, &recs[i], next))
				return 1;
			bytes += recs[i].iov_len;
		}
		got_total += got;
	}
	/* Everything expected has arrived: nothing more may be waiting
	 * (-EPIPE: a drained flow, closed by destroy --drain, is empty). */
	rc = flowshm_recv_batch(f, buf, sizeof(buf), recs, 256, &got, 0);
	if (rc != -EAGAIN && rc != -EPIPE) {
		fprintf(stderr, "flowcheck: %s: after the last expected record "
			"recv returned %d (%s), want nothing\n", a->flow, rc,
			flowshm_strerror(rc));
		return 1;
	}
	printf("flowcheck consumer %s: %" PRIu64 " records from %" PRIu32
	       " producers, %" PRIu64 " bytes, all checked\n", a->flow,
	       got_total, a->producers, bytes);
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: flowcheck produce FLOW --id ID --count N "
		"[--max-size B] [--skip SEQ]\n"
		"       flowcheck consume FLOW --producers P --count N "
		"[--max-size B] [--attach-wait MS]\n");
	return 2;
}

static int parse_args(int argc, char **argv, struct args *a)
{
	static const struct option opts[] = {
		{ "id", required_argument, NULL, 'i' },
		{ "producers", required_argument, NULL, 'p' },
		{ "count", required_argument, NULL, 'n' },
		{ "max-size", required_argument, NULL, 's' },
		{ "skip", required_argument, NULL, 'k' },
		{ "attach-wait", required_argument, NULL, 'w' },
		{ 0 }
	};
	int c;

	*a = (struct args){ .count = 1000, .max_size = 4096,
			    .skip = UINT64_MAX };
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c == 'i')
			a->id = (uint32_t)strtoul(optarg, NULL, 0);
		else if (c == 'p')
			a->producers = (uint32_t)strtoul(optarg, NULL, 0);
		else if (c == 'n')
			a->count = strtoull(optarg, NULL, 0);
		else if (c == 's')
			a->max_size = strtoull(optarg, NULL, 0);
		else if (c == 'k')
			a->skip = strtoull(optarg, NULL, 0);
		else if (c == 'w')
			a->attach_wait_ns = (int64_t)strtoll(optarg, NULL, 0) *
					    1000000;
		else
			return -1;
	}
	if (argc - optind != 2 || a->max_size < MIN_SIZE)
		return -1;
	a->produce = !strcmp(argv[optind], "produce");
	a->flow = argv[optind + 1];
	a->salt = flow_salt(a->flow);
	if (a->produce)
		return a->id >= 1 && a->id <= MAX_PRODUCERS ? 0 : -1;
	if (strcmp(argv[optind], "consume"))
		return -1;
	return a->producers >= 1 && a->producers <= MAX_PRODUCERS ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct args a;
	flowshm_t *f;
	int rc;

	if (parse_args(argc, argv, &a))
		return usage();
	rc = flowshm_attach_wait(a.flow, a.produce ? FLOWSHM_PRODUCER :
					 FLOWSHM_CONSUMER, NULL, a.attach_wait_ns,
				 &f);
	if (rc) {
		fprintf(stderr, "flowcheck: attach %s: %s\n", a.flow,
			flowshm_attach_error());
		return 1;
	}
	rc = a.produce ? produce(f, &a) : consume(f, &a);
	flowshm_detach(f);
	return rc;
}
