/*
 * A producer killed with SIGKILL in the middle of a record must not wedge
 * the ring: the consumer turns its claimed record into padding after the
 * recovery timeout and every committed record of the others still arrives.
 *
 *   victim A: sends 100 records, reserves one, writes half, is killed.
 *   victim B: sends as fast as it can and is killed at a random moment.
 *   victim C: claims space without ever writing a header (simulated by
 *             moving tail directly: a producer killed between its CAS and
 *             its header store).
 *   honest producers: send everything; all of it must arrive, in order.
 */
#include "testutil.h"
#include "flowshm_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#define HONEST 2
#define VICTIM_A HONEST
#define VICTIM_B (HONEST + 1)
#define IDS (HONEST + 2)
#define MAX_REC 2048

static void send_seq(flowshm_t *p, uint32_t id, uint64_t seq)
{
	unsigned char buf[MAX_REC];
	size_t len = tu_rec_len(id, seq, 16, MAX_REC);

	tu_fill(buf, id, seq, len);
	CHECK_RC(flowshm_send(p, buf, len, -1), 0);
}

static pid_t spawn(int fd, uint32_t id, uint64_t n, int ready_fd)
{
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid)
		return pid;
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	for (uint64_t s = 0; s < n; s++)
		send_seq(p, id, s);
	if (id == VICTIM_A) {
		void *w;
		CHECK_RC(flowshm_reserve(p, 1000, &w, -1), 0);
		memset(w, 0xab, 500);
		CHECK(write(ready_fd, "r", 1) == 1);
		pause(); /* killed here, between claim and commit */
	}
	_exit(0);
}

int main(void)
{
	uint64_t n_honest = (uint64_t)tu_env_long("FM_KILL_RECORDS", 100000);
	int fd = tu_ring(1 << 18, MAX_REC, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 200000000ull); /* 200 ms */
	uint64_t next[IDS] = { 0 };
	unsigned char buf[MAX_REC];
	struct flowshm_info info;
	pid_t honest[HONEST], a, b;
	int pipefd[2], st;
	uint64_t kill_b_at, last_rx = tu_now_ns();
	char r;

	CHECK(pipe(pipefd) == 0);
	/* Victim C: a claim of 256 bytes with no header, ever, made while the
	 * ring is empty so that it is a valid claim. */
	{
		flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
		atomic_fetch_add(&p->ring.sh->tail, 256);
		flowshm_close(p);
	}
	a = spawn(fd, VICTIM_A, 100, pipefd[1]);
	b = spawn(fd, VICTIM_B, UINT64_MAX, -1);
	for (int i = 0; i < HONEST; i++)
		honest[i] = spawn(fd, (uint32_t)i, n_honest, -1);

	/* Consume while killing: the victims need the consumer to move. */
	CHECK(fcntl(pipefd[0], F_SETFL, O_NONBLOCK) == 0);
	kill_b_at = tu_now_ns() + 300000000 + tu_mix(getpid()) % 200000000;
	for (;;) {
		size_t len;
		uint32_t id;
		uint64_t seq;
		int rc = flowshm_recv(c, buf, sizeof(buf), &len, 50000000);

		if (a && read(pipefd[0], &r, 1) == 1) {
			CHECK(kill(a, SIGKILL) == 0 && waitpid(a, &st, 0) == a);
			a = 0;
		}
		if (b && tu_now_ns() >= kill_b_at) {
			CHECK(kill(b, SIGKILL) == 0 && waitpid(b, &st, 0) == b);
			b = 0;
		}
		if (rc == -ETIMEDOUT) {
			if (!a && !b && tu_now_ns() - last_rx > 3000000000ull)
				break;
			continue;
		}
		CHECK_RC(rc, 0);
		last_rx = tu_now_ns();
		CHECK(tu_verify(buf, len, &id, &seq));
		CHECK(id < IDS);
		CHECK(seq == next[id]); /* in order, no gap, no duplicate */
		next[id]++;
	}
	for (int i = 0; i < HONEST; i++) {
		CHECK(waitpid(honest[i], &st, 0) == honest[i]);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		CHECK(next[i] == n_honest);
	}
	CHECK(next[VICTIM_A] == 100);
	CHECK_RC(flowshm_info(c, &info), 0);
	CHECK(info.head == info.tail);
	/* at least A's record and C's claim; B's only if killed mid-record */
	CHECK(info.recovered >= 2);
	printf("honest: %llu each; victim B delivered %llu before its death; "
	       "%u records recovered\n", (unsigned long long)n_honest,
	       (unsigned long long)next[VICTIM_B], info.recovered);
	flowshm_close(c);
	close(fd);
	return 0;
}
