/*
 * Blocking send/recv with timeouts, and wake-ups across processes: a
 * consumer asleep on an empty ring, a producer asleep on a full ring, and a
 * sleeper woken by a shutdown.  Also a cross-process ping-pong that makes
 * both sides go to sleep and wake each other many times.
 */
#include "testutil.h"

#include <sys/wait.h>

static int child_status(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_timeouts(void)
{
	int fd = tu_ring(4096, 2048, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	char buf[2048] = { 0 };
	size_t len;
	uint64_t t0 = tu_now_ns();

	/* a timed-out wait returns -ETIMEDOUT, and not before its time */
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 50000000), -ETIMEDOUT);
	CHECK(tu_now_ns() - t0 >= 50000000);
	CHECK_RC(flowshm_send(p, buf, 2040, 0), 0);
	CHECK_RC(flowshm_send(p, buf, 2040, 0), -EAGAIN);
	t0 = tu_now_ns();
	CHECK_RC(flowshm_send(p, buf, 2040, 50000000), -ETIMEDOUT);
	CHECK(tu_now_ns() - t0 >= 50000000);
	flowshm_close(p);
	flowshm_close(c);
	close(fd);
}

static void test_consumer_woken(void)
{
	int fd = tu_ring(4096, 1024, 0);
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
		char buf[64];
		size_t len;
		int rc = flowshm_recv(c, buf, sizeof(buf), &len, -1);
		_exit(rc == 0 && len == 5 && !memcmp(buf, "wake!", 5) ? 0 : 1);
	}
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	usleep(100000); /* long enough for the child to be in FUTEX_WAIT */
	CHECK_RC(flowshm_send(p, "wake!", 5, 0), 0);
	CHECK(child_status(pid) == 0);
	flowshm_close(p);
	close(fd);
}

static void test_producer_woken(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	char rec[1000] = { 1 };
	pid_t pid;
	int sent = 0;

	while (flowshm_send(p, rec, sizeof(rec), 0) == 0)
		sent++;
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
		char buf[1024];
		size_t len;
		usleep(100000);
		for (int i = 0; i <= sent; i++)
			if (flowshm_recv(c, buf, sizeof(buf), &len, 5000000000ll))
				_exit(1);
		_exit(0);
	}
	/* blocks until the child drains, then goes through */
	CHECK_RC(flowshm_send(p, rec, sizeof(rec), 5000000000ll), 0);
	CHECK(child_status(pid) == 0);
	flowshm_close(p);
	close(fd);
}

static void test_shutdown_wakes_sleepers(void)
{
	int fd = tu_ring(4096, 1024, 0);
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
		char buf[64];
		size_t len;
		_exit(flowshm_recv(c, buf, sizeof(buf), &len, -1) == -EPIPE ? 0 : 1);
	}
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	usleep(100000);
	flowshm_shutdown(p);
	CHECK(child_status(pid) == 0);
	flowshm_close(p);
	close(fd);
}

/* Ping-pong over two rings; the sleeps make both sides park in futexes. */
static void test_pingpong_with_sleeps(void)
{
	int ab = tu_ring(4096, 64, 0), ba = tu_ring(4096, 64, 0);
	const int rounds = 200;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *in = tu_open(ab, FLOWSHM_CONSUMER, 0);
		flowshm_t *out = tu_open(ba, FLOWSHM_PRODUCER, 0);
		for (int i = 0; i < rounds; i++) {
			uint64_t v;
			size_t len;
			if (flowshm_recv(in, &v, sizeof(v), &len, 5000000000ll) ||
			    v != (uint64_t)i)
				_exit(1);
			if (i % 16 == 0)
				usleep(2000);
			v++;
			if (flowshm_send(out, &v, sizeof(v), -1))
				_exit(2);
		}
		_exit(0);
	}
	flowshm_t *out = tu_open(ab, FLOWSHM_PRODUCER, 0);
	flowshm_t *in = tu_open(ba, FLOWSHM_CONSUMER, 0);
	for (int i = 0; i < rounds; i++) {
		uint64_t v = (uint64_t)i;
		size_t len;
		if (i % 16 == 8)
			usleep(2000);
		CHECK_RC(flowshm_send(out, &v, sizeof(v), -1), 0);
		CHECK_RC(flowshm_recv(in, &v, sizeof(v), &len, 5000000000ll), 0);
		CHECK(v == (uint64_t)i + 1);
	}
	CHECK(child_status(pid) == 0);
	flowshm_close(out);
	flowshm_close(in);
	close(ab);
	close(ba);
}

int main(void)
{
	test_timeouts();
	printf("ok 1 - timeouts\n");
	test_consumer_woken();
	printf("ok 2 - consumer woken across processes\n");
	test_producer_woken();
	printf("ok 3 - producer woken across processes\n");
	test_shutdown_wakes_sleepers();
	printf("ok 4 - shutdown wakes sleepers\n");
	test_pingpong_with_sleeps();
	printf("ok 5 - ping-pong with sleeps\n");
	return 0;
}
