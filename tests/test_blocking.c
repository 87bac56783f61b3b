/*
 * Blocking send/recv with timeouts, and wake-ups across processes: a
 * consumer asleep on an empty ring, a producer asleep on a full ring, and a
 * sleeper woken by a shutdown.  Also a cross-process ping-pong that makes
 * both sides go to sleep and wake each other many times.  Then the polling
 * waits (flowshm_set_wait): their timeouts, that they are never counted
 * among the sleepers (the other end makes no wake-up system call for them),
 * that a polling producer still gets the lazily published position of a
 * polling consumer, and flowshm_poll over polling handles.
 */
#include "testutil.h"
#include "flowshm_internal.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>

static int child_status(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *wait_name(enum flowshm_wait w)
{
	return w == FLOWSHM_WAIT_YIELD ? "yield" :
	       w == FLOWSHM_WAIT_SPIN ? "spin" : "sleep";
}

static uint32_t consumers_waiting(const flowshm_t *f)
{
	return atomic_load(&f->ring.sh->consumers_waiting);
}

/* Sleepers among the producers, without the FR_SPACE_WANTED hint bit. */
static uint32_t producers_sleeping(const flowshm_t *f)
{
	return atomic_load(&f->ring.sh->producers_waiting) & ~FR_SPACE_WANTED;
}

/* The most of count(f) seen over ms milliseconds. */
static uint32_t max_over(const flowshm_t *f,
			 uint32_t (*count)(const flowshm_t *), unsigned ms)
{
	uint32_t most = 0;

	for (uint64_t end = tu_now_ns() + ms * 1000000ull; tu_now_ns() < end;) {
		uint32_t n = count(f);

		if (n > most)
			most = n;
		usleep(100);
	}
	return most;
}

/* What the sleepers count shows of a child that is to block: with a
 * sleeper expected, 1 as soon as it shows (5 s at most, so a child that
 * starts late still gets there); with none, the most over 200 ms. */
static uint32_t sleepers_seen(const flowshm_t *f,
			      uint32_t (*count)(const flowshm_t *), bool one)
{
	if (!one)
		return max_over(f, count, 200);
	for (uint64_t end = tu_now_ns() + 5000000000ull; tu_now_ns() < end;
	     usleep(100))
		if (count(f) == 1)
			return 1;
	return count(f);
}

/* A byte through a pipe: "go on" from one process to another. */
static void go_send(int fd)
{
	CHECK(write(fd, "g", 1) == 1);
}

static bool go_wait(int fd)
{
	char b;

	return read(fd, &b, 1) == 1;
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

/* w = sleep: the consumer is counted among the sleepers (the producer's
 * commit then wakes it); polling, it never is, and gets the record all
 * the same. */
static void test_consumer_woken(enum flowshm_wait w)
{
	int fd = tu_ring(4096, 1024, 0);
	uint32_t most;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
		char buf[64];
		size_t len;

		flowshm_set_wait(c, w);
		int rc = flowshm_recv(c, buf, sizeof(buf), &len, -1);
		_exit(rc == 0 && len == 5 && !memcmp(buf, "wake!", 5) ? 0 : 1);
	}
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	most = sleepers_seen(p, consumers_waiting, w == FLOWSHM_WAIT_SLEEP);
	CHECK(w == FLOWSHM_WAIT_SLEEP ? most == 1 : most == 0);
	CHECK_RC(flowshm_send(p, "wake!", 5, 0), 0);
	CHECK(child_status(pid) == 0);
	flowshm_close(p);
	close(fd);
}

/* The same for a producer on a full ring. */
static void test_producer_woken(enum flowshm_wait w)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	char rec[1000] = { 1 };
	uint32_t most;
	pid_t pid;
	int sent = 0, go[2];

	while (flowshm_send(p, rec, sizeof(rec), 0) == 0)
		sent++;
	CHECK(pipe(go) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
		char buf[1024];
		size_t len;

		if (!go_wait(go[0])) /* after the parent's look */
			_exit(1);
		for (int i = 0; i <= sent; i++)
			if (flowshm_recv(c, buf, sizeof(buf), &len, 5000000000ll))
				_exit(1);
		_exit(0);
	}
	pid_t q = fork();

	CHECK(q >= 0);
	if (q == 0) {
		flowshm_t *o = tu_open(fd, FLOWSHM_PRODUCER, 0);

		flowshm_set_wait(o, w);
		/* blocks until the consumer drains, then goes through */
		_exit(flowshm_send(o, rec, sizeof(rec), 5000000000ll) != 0);
	}
	most = sleepers_seen(p, producers_sleeping, w == FLOWSHM_WAIT_SLEEP);
	go_send(go[1]);
	CHECK(w == FLOWSHM_WAIT_SLEEP ? most == 1 : most == 0);
	close(go[0]);
	close(go[1]);
	CHECK(child_status(q) == 0);
	CHECK(child_status(pid) == 0);
	flowshm_close(p);
	close(fd);
}

/* A full 64 KiB ring of 64 records of 1 KiB (1000 payload bytes). */
static int full_ring(flowshm_t **p_out)
{
	int fd = tu_ring(65536, 1024, 0), sent = 0;
	char rec[1000] = { 1 };

	*p_out = tu_open(fd, FLOWSHM_PRODUCER, 0);
	while (flowshm_send(*p_out, rec, sizeof(rec), 0) == 0)
		sent++;
	CHECK(sent == 64);
	return fd;
}

static uint32_t space_word(const flowshm_t *f)
{
	return atomic_load(&f->ring.sh->space_futex);
}

/* Producers asleep for space are woken once a quarter of the ring is free,
 * not at every record read (ring.h, Sleeping and waking).  The sleeper is
 * a count we add ourselves, so that the wake-ups are the consumer's alone:
 * each bumps the futex word. */
static void test_woken_at_quarter(void)
{
	flowshm_t *p, *c;
	int fd = full_ring(&p);
	char buf[1024];
	size_t len;

	c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	atomic_fetch_add(&c->ring.sh->producers_waiting, 1);
	for (int i = 1; i <= 20; i++) {
		uint32_t before = space_word(c);

		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
		/* 1 KiB free per record read: the quarter at the 16th */
		CHECK(i < 16 ? space_word(c) == before : space_word(c) != before);
	}
	atomic_fetch_sub(&c->ring.sh->producers_waiting, 1);
	flowshm_close(c);
	flowshm_close(p);
	close(fd);
}

/* Room below the quarter wakes nobody; a producer asleep whose record fits
 * comes on its own (FR_ROOM_LOOK_NS), also when the consumer stops there. */
static void test_room_below_quarter(void)
{
	flowshm_t *p, *c;
	int fd = full_ring(&p), st = 0;
	bool done = false;
	char buf[1024];
	size_t len;
	uint32_t word;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *o = tu_open(fd, FLOWSHM_PRODUCER, 0);
		char rec[1000] = { 2 };

		_exit(flowshm_send(o, rec, sizeof(rec), -1) != 0);
	}
	CHECK(sleepers_seen(p, producers_sleeping, true) == 1);
	c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	word = space_word(c);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
	for (int i = 0; i < 5000 && !done; i++) {
		done = waitpid(pid, &st, WNOHANG) == pid;
		usleep(1000);
	}
	if (!done) { /* asleep 5 s although its record fits */
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
	}
	CHECK(done && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(space_word(c) == word); /* it came by itself: nobody woke it */
	flowshm_close(c);
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

static void test_set_wait_args(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);

	CHECK_RC(flowshm_set_wait(NULL, FLOWSHM_WAIT_YIELD), -EINVAL);
	CHECK_RC(flowshm_set_wait(c, (enum flowshm_wait)3), -EINVAL);
	CHECK_RC(flowshm_set_wait(c, (enum flowshm_wait)-1), -EINVAL);
	CHECK_RC(flowshm_set_wait(c, FLOWSHM_WAIT_SPIN), 0);
	CHECK_RC(flowshm_set_wait(c, FLOWSHM_WAIT_SLEEP), 0);
	flowshm_close(c);
	close(fd);
}

/* Timeouts of a polling wait, and its back-pressure counted as a sleep's. */
static void test_polling_timeouts(enum flowshm_wait w)
{
	int fd = tu_ring(4096, 2048, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	char buf[2048] = { 0 };
	size_t len;
	uint64_t t0 = tu_now_ns(), full0, full_ns0;

	CHECK_RC(flowshm_set_wait(p, w), 0);
	CHECK_RC(flowshm_set_wait(c, w), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 50000000), -ETIMEDOUT);
	CHECK(tu_now_ns() - t0 >= 50000000);
	CHECK_RC(flowshm_send(p, buf, 2040, 0), 0);
	full0 = atomic_load(&p->ring.sh->full_events);
	full_ns0 = atomic_load(&p->ring.sh->full_ns);
	t0 = tu_now_ns();
	CHECK_RC(flowshm_send(p, buf, 2040, 50000000), -ETIMEDOUT);
	CHECK(tu_now_ns() - t0 >= 50000000);
	CHECK(atomic_load(&p->ring.sh->full_events) == full0 + 1);
	/* from the end of the first spin on: most of the 50 ms */
	CHECK(atomic_load(&p->ring.sh->full_ns) - full_ns0 >= 40000000);
	/* it asked the consumer to publish its position at once */
	CHECK(atomic_load(&p->ring.sh->producers_waiting) & FR_SPACE_WANTED);
	flowshm_close(p);
	flowshm_close(c);
	close(fd);
}

/*
 * 200 000 records of 1-200 B through a 4 KiB ring, both ends polling in
 * two processes: the producer is held back on a full ring over and over,
 * by a consumer that publishes its position lazily.  Every record arrives
 * in order; a lost publication would stall both ends until a 5 s timeout.
 */
static void test_polling_stream(enum flowshm_wait w)
{
	int fd = tu_ring(4096, 256, 0);
	const uint32_t n = 200000;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
		unsigned char rec[200];

		flowshm_set_wait(p, w);
		for (uint32_t i = 0; i < n; i++) {
			size_t len = 1 + (tu_mix(i) % sizeof(rec));

			memset(rec, (int)(i & 0xff), len);
			memcpy(rec, &i, len < 4 ? len : 4);
			if (flowshm_send(p, rec, len, 5000000000ll))
				_exit(1);
		}
		_exit(0);
	}
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[256], want[200];
	size_t len;

	CHECK_RC(flowshm_set_wait(c, w), 0);
	for (uint32_t i = 0; i < n; i++) {
		size_t l = 1 + (tu_mix(i) % sizeof(want));

		memset(want, (int)(i & 0xff), l);
		memcpy(want, &i, l < 4 ? l : 4);
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 5000000000ll),
			 0);
		CHECK(len == l && !memcmp(buf, want, l));
	}
	CHECK(child_status(pid) == 0);
	flowshm_close(c);
	close(fd);
}

/* flowshm_poll over two handles: it sleeps (is counted) unless both poll;
 * polling, it still sees the record that comes, and times out on time. */
static void test_poll_polling(void)
{
	for (int polling = 0; polling < 2; polling++) {
		int fd[2] = { tu_ring(4096, 64, 0), tu_ring(4096, 64, 0) };
		flowshm_t *p = tu_open(fd[1], FLOWSHM_PRODUCER, 0);
		int go[2];
		pid_t pid;
		uint32_t most;

		CHECK(pipe(go) == 0);
		pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			flowshm_t *c[2] = {
				tu_open(fd[0], FLOWSHM_CONSUMER, 0),
				tu_open(fd[1], FLOWSHM_CONSUMER, 0),
			};
			unsigned ready[2], nready = 0;
			uint64_t t0 = tu_now_ns();

			flowshm_set_wait(c[0], FLOWSHM_WAIT_YIELD);
			if (polling)
				flowshm_set_wait(c[1], FLOWSHM_WAIT_SPIN);
			if (flowshm_poll(c, 2, ready, &nready, 50000000) !=
				    -ETIMEDOUT ||
			    tu_now_ns() - t0 < 50000000)
				_exit(2);
			go_send(go[1]); /* the first poll is over */
			_exit(flowshm_poll(c, 2, ready, &nready, 5000000000ll) ||
			      nready != 1 || ready[0] != 1);
		}
		CHECK(go_wait(go[0]));
		close(go[0]);
		close(go[1]);
		most = sleepers_seen(p, consumers_waiting, !polling);
		CHECK(polling ? most == 0 : most == 1);
		CHECK_RC(flowshm_send(p, "x", 1, 0), 0);
		CHECK(child_status(pid) == 0);
		flowshm_close(p);
		close(fd[0]);
		close(fd[1]);
	}
}

int main(void)
{
	test_timeouts();
	printf("ok 1 - timeouts\n");
	for (enum flowshm_wait w = FLOWSHM_WAIT_SLEEP; w <= FLOWSHM_WAIT_SPIN;
	     w++) {
		test_consumer_woken(w);
		test_producer_woken(w);
		printf("ok - %s: consumer and producer get what they wait for "
		       "from another process; counted among the sleepers: %s\n",
		       wait_name(w), w == FLOWSHM_WAIT_SLEEP ? "yes" : "never");
	}
	test_woken_at_quarter();
	printf("ok - producers asleep for space are woken at a quarter of the "
	       "ring free, not per record read\n");
	test_room_below_quarter();
	printf("ok - a producer whose record fits below the quarter goes "
	       "through by itself\n");
	test_shutdown_wakes_sleepers();
	printf("ok - shutdown wakes sleepers\n");
	test_pingpong_with_sleeps();
	printf("ok - ping-pong with sleeps\n");
	test_set_wait_args();
	printf("ok - flowshm_set_wait refuses what it does not know\n");
	for (enum flowshm_wait w = FLOWSHM_WAIT_YIELD; w <= FLOWSHM_WAIT_SPIN;
	     w++) {
		test_polling_timeouts(w);
		printf("ok - %s: timeouts, back-pressure counted\n",
		       wait_name(w));
		test_polling_stream(w);
		printf("ok - %s: 200 000 records through a 4 KiB ring\n",
		       wait_name(w));
	}
	test_poll_polling();
	printf("ok - flowshm_poll sleeps unless every handle polls\n");
	return 0;
}
