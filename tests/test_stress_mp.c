/*
 * Multi-process stress: several producer processes (per-record, batch and
 * zero-copy APIs) and one consumer (per-record, batch and zero-copy), random
 * record sizes; every record checked for per-producer order, content, no
 * loss and no duplicate.
 *
 * usage: test_stress_mp [producers] [records-per-producer]
 *        (FM_STRESS_RECORDS overrides the default record count)
 */
#include "testutil.h"

#include <sys/uio.h>
#include <sys/wait.h>

#define MAX_REC 4096
#define MIN_REC 16

static void produce(int fd, uint32_t id, uint64_t n)
{
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	static unsigned char bufs[32][MAX_REC];
	struct iovec iov[32];
	uint64_t seq = 0;

	while (seq < n) {
		size_t len = tu_rec_len(id, seq, MIN_REC, MAX_REC);
		void *w;

		switch (id % 3) {
		case 0:
			tu_fill(bufs[0], id, seq, len);
			CHECK_RC(flowshm_send(p, bufs[0], len, -1), 0);
			seq++;
			break;
		case 1: {
			unsigned k = 0, sent;
			for (; k < 32 && seq + k < n; k++) {
				size_t l = tu_rec_len(id, seq + k, MIN_REC, MAX_REC);
				tu_fill(bufs[k], id, seq + k, l);
				iov[k] = (struct iovec){ bufs[k], l };
			}
			CHECK_RC(flowshm_send_batch(p, iov, k, &sent, -1), 0);
			seq += sent;
			break;
		}
		default:
			CHECK_RC(flowshm_reserve(p, len, &w, -1), 0);
			tu_fill(w, id, seq, len);
			CHECK_RC(flowshm_commit(p), 0);
			seq++;
		}
	}
	flowshm_close(p);
}

static void check_record(const void *buf, size_t len, uint64_t *next,
			 uint32_t producers)
{
	uint32_t id;
	uint64_t seq;

	CHECK(tu_verify(buf, len, &id, &seq));
	CHECK(id < producers);
	if (seq != next[id])
		fprintf(stderr, "producer %u: got seq %llu, want %llu\n", id,
			(unsigned long long)seq, (unsigned long long)next[id]);
	CHECK(seq == next[id]);
	next[id]++;
}

int main(int argc, char **argv)
{
	uint32_t producers = argc > 1 ? (uint32_t)atoi(argv[1]) : 4;
	uint64_t n = argc > 2 ? strtoull(argv[2], NULL, 0) :
				(uint64_t)tu_env_long("FM_STRESS_RECORDS", 500000);
	int fd = tu_ring(1 << 20, MAX_REC, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	static unsigned char buf[1 << 18];
	struct iovec recs[64];
	uint64_t next[64] = { 0 }, total = 0, t0 = tu_now_ns();
	pid_t pids[64];

	CHECK(producers >= 1 && producers <= 64);
	for (uint32_t i = 0; i < producers; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0) {
			produce(fd, i, n);
			_exit(0);
		}
	}
	while (total < n * producers) {
		const void *rec;
		size_t len;
		unsigned got;

		switch (total % 3) {
		case 0:
			CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len,
					      10000000000ll), 0);
			check_record(buf, len, next, producers);
			total++;
			break;
		case 1:
			CHECK_RC(flowshm_recv_batch(c, buf, sizeof(buf), recs, 64,
						    &got, 10000000000ll), 0);
			for (unsigned i = 0; i < got; i++)
				check_record(recs[i].iov_base, recs[i].iov_len,
					     next, producers);
			total += got;
			break;
		default:
			CHECK_RC(flowshm_peek(c, &rec, &len, 10000000000ll), 0);
			check_record(rec, len, next, producers);
			CHECK_RC(flowshm_release(c), 0);
			total++;
		}
	}
	for (uint32_t i = 0; i < producers; i++) {
		int st;
		CHECK(waitpid(pids[i], &st, 0) == pids[i]);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		CHECK(next[i] == n);
	}
	{
		size_t len;
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -EAGAIN);
	}
	printf("%u producers x %llu records verified in %.2f s\n", producers,
	       (unsigned long long)n, (tu_now_ns() - t0) / 1e9);
	flowshm_close(c);
	close(fd);
	return 0;
}
