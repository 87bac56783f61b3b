/*
 * A producer that is stopped (SIGSTOP, a frozen vCPU), not dead, must never
 * lose a record or overwrite one, however long it stays stopped and
 * wherever in its send it was stopped.
 *
 * Recovery pads a record whose producer died between its claim and its
 * commit.  A claim whose header was not written yet names no producer in
 * the ring itself; without the producer slots (ipc/ring.h, "Producer
 * slots") such a gap was padded after the recovery timeout even when its
 * producer was only stopped, and the producer, once continued, wrote its
 * record into space the consumer had passed (lost, though its send
 * returned 0) or, a lap later, over another record.
 *
 * Two producers send numbered records flat out into a small ring; a thread
 * stops each of them in turn, at whatever instruction it is on, for several
 * recovery timeouts, and continues it.  The consumer checks every byte of
 * every record, in order per producer, with no gap and no duplicate, and
 * that nothing was recovered: nobody died.  The stops land anywhere in the
 * producers' sends; the window between the claim and the header is a few
 * instructions, so it takes a few hundred stops to land in it several
 * times (FM_STOPS, default 600).
 */
#include "testutil.h"
#include "flowshm_internal.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#define PRODUCERS 2
#define MAX_REC 256
#define RECOVER_NS 2000000ull /* 2 ms: a stop lasts 3-8 of them */

struct shared {
	_Atomic int stop_sending;
	_Atomic uint64_t sent[PRODUCERS];
	_Atomic int exited[PRODUCERS];
};

struct stopper {
	pid_t pids[PRODUCERS];
	long stops;
	struct shared *sh;
	_Atomic int done;
};

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull),
			       (long)(ns % 1000000000ull) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static pid_t spawn(int fd, uint32_t id, struct shared *sh)
{
	unsigned char buf[MAX_REC];
	pid_t pid = fork();
	uint64_t seq = 0;

	CHECK(pid >= 0);
	if (pid)
		return pid;
	/* a failed check ends the test: its producers go with it */
	CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL) == 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	while (!atomic_load(&sh->stop_sending)) {
		size_t len = tu_rec_len(id, seq, 16, MAX_REC);

		tu_fill(buf, id, seq, len);
		CHECK_RC(flowshm_send(p, buf, len, -1), 0);
		seq++;
	}
	atomic_store(&sh->sent[id], seq);
	flowshm_close(p);
	_exit(0);
}

/* Stop each producer in turn for 3-8 recovery timeouts. */
static void *stop_loop(void *arg)
{
	struct stopper *s = arg;
	uint64_t x = (uint64_t)getpid();

	for (long i = 0; i < s->stops; i++) {
		pid_t pid = s->pids[i % PRODUCERS];

		x = tu_mix(x);
		sleep_ns(200000 + x % 800000); /* let it run 0.2-1 ms */
		CHECK(kill(pid, SIGSTOP) == 0);
		sleep_ns(RECOVER_NS * (3 + (x >> 32) % 6));
		CHECK(kill(pid, SIGCONT) == 0);
	}
	atomic_store(&s->sh->stop_sending, 1);
	atomic_store(&s->done, 1);
	return NULL;
}

int main(void)
{
	struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int fd = tu_ring(1 << 16, MAX_REC, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, RECOVER_NS);
	struct stopper s = { .stops = tu_env_long("FM_STOPS", 600), .sh = sh };
	uint64_t next[PRODUCERS] = { 0 }, last_rx = tu_now_ns();
	unsigned char buf[MAX_REC];
	struct flowshm_info info;
	pthread_t th;
	int st;

	CHECK(sh != MAP_FAILED);
	for (uint32_t i = 0; i < PRODUCERS; i++)
		s.pids[i] = spawn(fd, i, sh);
	CHECK(pthread_create(&th, NULL, stop_loop, &s) == 0);
	for (;;) {
		size_t len;
		uint32_t id;
		uint64_t seq;
		int rc = flowshm_recv(c, buf, sizeof(buf), &len, 50000000);

		if (rc == -ETIMEDOUT) {
			bool all = atomic_load(&s.done);

			for (int i = 0; all && i < PRODUCERS; i++) {
				if (!atomic_load(&sh->exited[i]) &&
				    waitpid(s.pids[i], &st, WNOHANG) ==
					    s.pids[i]) {
					CHECK(WIFEXITED(st) &&
					      WEXITSTATUS(st) == 0);
					atomic_store(&sh->exited[i], 1);
				}
				all = atomic_load(&sh->exited[i]) &&
				      next[i] == atomic_load(&sh->sent[i]);
			}
			if (all)
				break;
			/* a stop lasts 50 ms at most: 20 s without a record
			 * is a record lost at the head of the ring */
			if (tu_now_ns() - last_rx > 20000000000ull) {
				flowshm_info(c, &info);
				fprintf(stderr, "no record for 20 s: head %llu "
					"tail %llu recovered %u\n",
					(unsigned long long)info.head,
					(unsigned long long)info.tail,
					info.recovered);
				CHECK(0);
			}
			continue;
		}
		CHECK_RC(rc, 0);
		last_rx = tu_now_ns();
		if (!tu_verify(buf, len, &id, &seq)) {
			fprintf(stderr, "record %u/%llu bytes do not verify\n",
				id < PRODUCERS ? id : 99,
				(unsigned long long)seq);
			CHECK(0);
		}
		CHECK(id < PRODUCERS);
		if (seq != next[id]) {
			flowshm_info(c, &info);
			fprintf(stderr, "producer %u: record %llu where %llu "
				"was due (%u recovered)\n", id,
				(unsigned long long)seq,
				(unsigned long long)next[id], info.recovered);
			CHECK(0);
		}
		next[id]++;
	}
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_RC(flowshm_info(c, &info), 0);
	CHECK(info.head == info.tail);
	/* nobody died: nothing may have been taken for dead */
	CHECK(info.recovered == 0);
	printf("%ld stops; records %llu and %llu, all delivered once, "
	       "nothing recovered\n", s.stops, (unsigned long long)next[0],
	       (unsigned long long)next[1]);
	flowshm_close(c);
	close(fd);
	return 0;
}
