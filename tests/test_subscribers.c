/*
 * Ring format 2 (ipc/ring.h "Subscribers", "End of stream"): several
 * consumers of one ring, each seeing every record in order; the slowest
 * holds the producers back; a dead subscriber's slot given back (by the
 * test acting as moverd, and by a real moverd when a consumer process is
 * killed -9); max_lag cuts a laggard off (-ESTALE) and it may attach again;
 * the END record (-ENODATA after the last record), locally and between two
 * daemons over TCP; a ring file of format 1 refused at start with its
 * version named; a live producer's headerless claim never padded, and a
 * killed producer's slot given back by moverd; without moverd, a killed
 * consumer's slot given back by the producer it holds back, and by a new
 * consumer that finds no free slot; an END that waits for room in a full
 * ring, moverd at rest meanwhile; moverd's own slot never given back on a
 * client's behalf.
 *
 * usage: test_subscribers MOVERD MOVERCTL   (FM_SUB_CASES=1,3 picks cases)
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>

#define REC_MAX 1024
#define WAIT_NS 10000000000ll /* generous: a failure, never a figure */

static const char *moverd_bin, *moverctl_bin;

static void produce_fd(int fd, uint32_t id, uint64_t n)
{
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	unsigned char buf[REC_MAX];

	for (uint64_t s = 0; s < n; s++) {
		size_t len = tu_rec_len(id, s, 16, REC_MAX);

		tu_fill(buf, id, s, len);
		CHECK_RC(flowshm_send(p, buf, len, WAIT_NS), 0);
	}
	flowshm_close(p);
}

/* Receive total records of `producers` producers, each in its order. */
static void consume_all(flowshm_t *c, uint32_t producers, uint64_t total)
{
	uint64_t next[8] = { 0 };
	unsigned char buf[REC_MAX];

	for (uint64_t got = 0; got < total; got++) {
		uint32_t id;
		uint64_t seq;
		size_t len;

		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS), 0);
		CHECK(tu_verify(buf, len, &id, &seq));
		CHECK(id < producers && seq == next[id]);
		next[id]++;
	}
}

static int wait_child(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* n subscriber processes and 2 producer processes on one ring. */
static void fan_out(unsigned subs)
{
	const uint32_t producers = 2;
	const uint64_t n = 20000;
	int fd = tu_ring(1 << 16, REC_MAX, 0), ready[2];
	pid_t pids[8];
	char x;

	CHECK(pipe(ready) == 0);
	for (unsigned i = 0; i < subs; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0) {
			flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);

			/* subscribed: the producers may start */
			CHECK(write(ready[1], "x", 1) == 1);
			consume_all(c, producers, n * producers);
			flowshm_close(c);
			_exit(0);
		}
		CHECK(read(ready[0], &x, 1) == 1);
	}
	for (unsigned i = 0; i < producers; i++) {
		pids[subs + i] = fork();
		CHECK(pids[subs + i] >= 0);
		if (pids[subs + i] == 0) {
			produce_fd(fd, i, n);
			_exit(0);
		}
	}
	for (unsigned i = 0; i < subs + producers; i++)
		CHECK(wait_child(pids[i]) == 0);
	printf("  %u subscribers x %llu records, each every record in order\n",
	       subs, (unsigned long long)(n * producers));
	close(fd);
	close(ready[0]);
	close(ready[1]);
}

static void case_fan_out(void)
{
	fan_out(2);
	fan_out(4);
}

/* Send 1000-byte records with seq from *seq until the ring is full. */
static unsigned fill(flowshm_t *p, uint64_t *seq)
{
	unsigned char buf[1000];
	unsigned sent = 0;

	for (;;) {
		tu_fill(buf, 0, *seq, sizeof(buf));
		if (flowshm_send(p, buf, sizeof(buf), 0))
			return sent;
		(*seq)++;
		sent++;
	}
}

static unsigned drain(flowshm_t *c)
{
	unsigned char buf[REC_MAX];
	unsigned got = 0;
	size_t len;

	while (flowshm_recv(c, buf, sizeof(buf), &len, 0) == 0)
		got++;
	return got;
}

static void case_slowest_holds(void)
{
	int fd = tu_ring(1 << 16, REC_MAX, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *fast = tu_open(fd, FLOWSHM_CONSUMER, 0);
	flowshm_t *slow = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[REC_MAX];
	uint64_t seq = 0;
	unsigned sent = fill(p, &seq);
	size_t len;

	CHECK(sent > 0);
	CHECK(drain(fast) == sent);
	/* the fast one has read everything; the slow one holds the ring */
	CHECK_RC(flowshm_send(p, buf, 1000, 0), -EAGAIN);
	CHECK_RC(flowshm_send(p, buf, 1000, 20000000), -ETIMEDOUT);
	CHECK_RC(flowshm_recv(slow, buf, sizeof(buf), &len, 0), 0);
	/* one record read: a producer that found the ring full gets it */
	tu_fill(buf, 0, seq++, 1000);
	CHECK_RC(flowshm_send(p, buf, 1000, WAIT_NS), 0);
	CHECK(drain(slow) == sent);
	CHECK(drain(fast) == 1);
	printf("  %u records held back by the slowest of two\n", sent);
	flowshm_close(slow);
	flowshm_close(fast);
	flowshm_close(p);
	close(fd);
}

/* A subscriber process dies; the test, as moverd, gives its slot back. */
static void case_dead_slot_left(void)
{
	int fd = tu_ring(1 << 16, REC_MAX, 0), ready[2];
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *live = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[1000];
	uint64_t gen, seq = 0;
	unsigned slot;
	pid_t pid;
	char x;

	CHECK(pipe(ready) == 0);
	/* moverd's part at attach: a slot for the client */
	CHECK_RC(fr_sub_take(&p->ring, 0, &slot, &gen), 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = NULL;

		CHECK_RC(flowshm_open_attached(fd, FLOWSHM_CONSUMER, NULL,
					       (int)slot, gen, NULL, &c), 0);
		CHECK(write(ready[1], "x", 1) == 1);
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &x, 1) == 1);
	fill(p, &seq);
	drain(live);
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 0), -EAGAIN);
	kill(pid, SIGKILL);
	CHECK(wait_child(pid) == 128 + SIGKILL);
	/* dead, but nobody gave its slot back: still held.  The producer
	 * waits longer than it takes to judge (FR_ROOM_LOOK_NS), but the
	 * slot is in pid 0, a client moverd cannot see: moverd's to judge */
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 50000000), -ETIMEDOUT);
	fr_sub_leave(&p->ring, slot, gen);
	tu_fill(buf, 0, seq, sizeof(buf));
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 0), 0);
	/* a second leave of the same slot and gen changes nothing */
	fr_sub_leave(&p->ring, slot, gen);
	CHECK(drain(live) == 1);
	flowshm_close(live);
	flowshm_close(p);
	close(fd);
	close(ready[0]);
	close(ready[1]);
}

/*
 * Without moverd: a consumer process killed -9 holds the producer back
 * only until the producer, waiting, finds its holder dead and gives its
 * slot back (ipc/ring.h, Subscribers: dead subscribers).  Nothing the dead
 * one had not read is lost: a new consumer reads on from its position.
 * And a new consumer finds a slot when dead ones hold all the others.
 */
static void case_killed_consumer_no_moverd(void)
{
	int fd = tu_ring(1 << 16, REC_MAX, 0), ready[2];
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0), *c = NULL, *c2;
	pid_t pids[FR_MAX_SUBS];
	unsigned char buf[REC_MAX];
	uint64_t seq = 0, first = 0, first_new;
	uint32_t id;
	size_t len;
	char x;

	CHECK(pipe(ready) == 0);
	pids[0] = fork();
	CHECK(pids[0] >= 0);
	if (pids[0] == 0) {
		c = tu_open(fd, FLOWSHM_CONSUMER, 0);
		CHECK(write(ready[1], "x", 1) == 1);
		consume_all(c, 1, 3);
		CHECK(write(ready[1], "x", 1) == 1);
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &x, 1) == 1);
	fill(p, &seq);
	CHECK(read(ready[0], &x, 1) == 1);
	kill(pids[0], SIGKILL);
	CHECK(wait_child(pids[0]) == 128 + SIGKILL);
	/* a new one joins where the dead one stands (the 3 it read, but
	 * had not yet published, it may see again) and reads on */
	c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	for (uint64_t want = UINT64_MAX; want != seq; want++) {
		uint64_t got;

		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
		CHECK(tu_verify(buf, len, &id, &got) && id == 0);
		if (want == UINT64_MAX)
			want = first = got;
		CHECK(got == want);
	}
	CHECK(first <= 3);
	/* the dead one's slot holds the producer back until it looks */
	tu_fill(buf, 0, seq, 1000);
	CHECK_RC(flowshm_send(p, buf, 1000, WAIT_NS), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
	CHECK(tu_verify(buf, len, &id, &first_new) && first_new == seq++);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -EAGAIN);

	/* every other slot held by a dead consumer: a new one gets one */
	for (unsigned i = 1; i < FR_MAX_SUBS; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0) {
			tu_open(fd, FLOWSHM_CONSUMER, 0);
			CHECK(write(ready[1], "x", 1) == 1);
			pause();
			_exit(0);
		}
		CHECK(read(ready[0], &x, 1) == 1);
	}
	for (unsigned i = 1; i < FR_MAX_SUBS; i++) {
		kill(pids[i], SIGKILL);
		CHECK(wait_child(pids[i]) == 128 + SIGKILL);
	}
	c2 = tu_open(fd, FLOWSHM_CONSUMER, 0);
	printf("  a killed consumer held the producer until it looked; a new "
	       "one read on from record %llu of %llu\n",
	       (unsigned long long)first, (unsigned long long)seq);
	flowshm_close(c2);
	flowshm_close(c);
	flowshm_close(p);
	close(fd);
	close(ready[0]);
	close(ready[1]);
}

static void case_max_lag(void)
{
	int fd = tu_ring(1 << 16, REC_MAX, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *fast = tu_open(fd, FLOWSHM_CONSUMER, 0);
	flowshm_t *slow = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[REC_MAX];
	uint32_t id;
	uint64_t seq;
	size_t len;

	/* no API sets it yet: the word, as moverd would */
	atomic_store(&p->ring.sh->max_lag, 16u << 10);
	for (uint64_t s = 0; s < 300; s++) { /* ~300 KB through a 64 KiB ring */
		tu_fill(buf, 0, s, 1000);
		CHECK_RC(flowshm_send(p, buf, 1000, WAIT_NS), 0);
		CHECK_RC(flowshm_recv(fast, buf, sizeof(buf), &len, 0), 0);
	}
	CHECK_RC(flowshm_recv(slow, buf, sizeof(buf), &len, 0), -ESTALE);
	CHECK_RC(flowshm_recv(slow, buf, sizeof(buf), &len, 0), -ESTALE);
	flowshm_close(slow);
	/* attached again: it joins at the others' published position (at
	 * most one lazy publication behind what they read), and reads on
	 * in order up to the newest record */
	slow = tu_open(fd, FLOWSHM_CONSUMER, 0);
	tu_fill(buf, 0, 300, 1000);
	CHECK_RC(flowshm_send(p, buf, 1000, 0), 0);
	{
		uint64_t first = UINT64_MAX, last = 0;

		while (flowshm_recv(slow, buf, sizeof(buf), &len, 0) == 0) {
			CHECK(tu_verify(buf, len, &id, &seq));
			CHECK(first == UINT64_MAX || seq == last + 1);
			if (first == UINT64_MAX)
				first = seq;
			last = seq;
		}
		CHECK(last == 300);
		printf("  cut off, attached again: records %llu..300\n",
		       (unsigned long long)first);
	}
	CHECK_RC(flowshm_recv(fast, buf, sizeof(buf), &len, 0), 0);
	CHECK(tu_verify(buf, len, &id, &seq) && seq == 300);
	flowshm_close(slow);
	flowshm_close(fast);
	flowshm_close(p);
	close(fd);
}

static void case_end_local(void)
{
	int fd = tu_ring(1 << 16, REC_MAX, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	flowshm_t *c2 = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[REC_MAX];
	size_t len;

	for (uint64_t s = 0; s < 30; s++) {
		size_t l = tu_rec_len(0, s, 16, REC_MAX);

		tu_fill(buf, 0, s, l);
		CHECK_RC(flowshm_send(p, buf, l, 0), 0);
	}
	CHECK_RC(fr_write_end(&p->ring), 0);
	CHECK_RC(fr_write_end(&p->ring), 0); /* already ended */
	CHECK_RC(flowshm_send(p, buf, 10, 0), -EPIPE);
	consume_all(c, 1, 30);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -ENODATA);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS), -ENODATA);
	consume_all(c2, 1, 30);
	CHECK_RC(flowshm_recv(c2, buf, sizeof(buf), &len, 0), -ENODATA);
	flowshm_close(c2);
	flowshm_close(c);
	flowshm_close(p);
	close(fd);
}

/* Through a real moverd: a consumer process killed -9 gives its slot back
 * when its control connection closes; the producers go on at once. */
static void case_killed_consumer_moverd(void)
{
	struct hd d;
	char out[4096];
	flowshm_t *p = NULL, *live = NULL;
	unsigned char buf[1000];
	uint64_t seq = 0;
	int ready[2];
	pid_t pid;
	char x;

	hd_start(&d, moverd_bin, "subs6", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create s "
		     "--ring-size 64K --max-record 1024") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK(pipe(ready) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = NULL;

		CHECK_RC(flowshm_attach("s", FLOWSHM_CONSUMER, NULL, &c), 0);
		CHECK(write(ready[1], "x", 1) == 1);
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &x, 1) == 1);
	CHECK_RC(flowshm_attach("s", FLOWSHM_CONSUMER, NULL, &live), 0);
	CHECK_RC(flowshm_attach("s", FLOWSHM_PRODUCER, NULL, &p), 0);
	fill(p, &seq);
	drain(live);
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 0), -EAGAIN);
	kill(pid, SIGKILL);
	CHECK(wait_child(pid) == 128 + SIGKILL);
	/* moverd gives it back: no send (whose wait would judge it) first */
	for (int i = 0; i < 1000 && atomic_load(&p->ring.sh->sub_mask) !=
				    1u << live->ring.sub; i++)
		usleep(10000);
	CHECK(atomic_load(&p->ring.sh->sub_mask) == 1u << live->ring.sub);
	tu_fill(buf, 0, seq, sizeof(buf));
	CHECK_RC(flowshm_send(p, buf, sizeof(buf), 0), 0);
	CHECK(drain(live) == 1);
	CHECK(hd_flow_json(&d, moverctl_bin, "s", out, sizeof(out)));
	CHECK(strstr(out, "\"consumers\": 1"));
	flowshm_detach(p);
	flowshm_detach(live);
	hd_alive(&d);
	hd_stop(&d);
	close(ready[0]);
	close(ready[1]);
}

/*
 * Through a real moverd: a producer's claims are named in the producer slot
 * moverd took for it at attach (ipc/ring.h, "Producer slots").  A producer
 * that claimed space and is still alive, stopped before its header, holds
 * recovery back however long; killed -9, its slot is given back when its
 * control connection closes and the gap is padded; the next record comes.
 */
static void case_producer_slot_moverd(void)
{
	struct flowshm_opts fast = { .recover_ns = 20000000 }; /* 20 ms */
	struct hd d;
	char out[4096];
	flowshm_t *p = NULL, *c = NULL;
	unsigned char buf[REC_MAX];
	struct flowshm_info in;
	uint32_t slot;
	size_t len;
	int ready[2];
	pid_t pid;

	hd_start(&d, moverd_bin, "subs9", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create ps "
		     "--ring-size 64K --max-record 1024") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("ps", FLOWSHM_CONSUMER, &fast, &c), 0);
	CHECK(pipe(ready) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *v = NULL;
		uint64_t t;

		CHECK_RC(flowshm_attach("ps", FLOWSHM_PRODUCER, NULL, &v), 0);
		/* as a producer stands right after its tail CAS */
		slot = v->ring.prod;
		t = atomic_load(&v->ring.sh->tail);
		atomic_store(&fr_prod_at(&v->ring, slot)->claim,
			     t | FR_CLAIM_BUSY);
		atomic_store(&v->ring.sh->tail, t + 64);
		CHECK(write(ready[1], &slot, sizeof(slot)) == sizeof(slot));
		pause();
		_exit(0);
	}
	CHECK(read(ready[0], &slot, sizeof(slot)) == sizeof(slot));
	CHECK(slot < FR_MAX_PRODS);
	/* moverd took the slot in the client's pid */
	CHECK(atomic_load(&fr_prod_at(&c->ring, slot)->pid) == (uint32_t)pid);
	CHECK_RC(flowshm_attach("ps", FLOWSHM_PRODUCER, NULL, &p), 0);
	CHECK(p->ring.prod < FR_MAX_PRODS && p->ring.prod != slot);
	tu_fill(buf, 0, 0, 100);
	CHECK_RC(flowshm_send(p, buf, 100, 0), 0);
	/* 25 recovery timeouts: the gap's producer lives, nothing moves */
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 500000000), -ETIMEDOUT);
	CHECK_RC(flowshm_info(c, &in), 0);
	CHECK(in.recovered == 0);
	kill(pid, SIGKILL);
	CHECK(wait_child(pid) == 128 + SIGKILL);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS), 0);
	CHECK(len == 100);
	CHECK_RC(flowshm_info(c, &in), 0);
	CHECK(in.recovered == 1);
	/* and moverd gave its slot back at the disconnect */
	for (int i = 0; i < 500 &&
	     atomic_load(&fr_prod_at(&c->ring, slot)->pid); i++)
		usleep(10000);
	CHECK(atomic_load(&fr_prod_at(&c->ring, slot)->pid) == 0);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&d);
	hd_stop(&d);
	close(ready[0]);
	close(ready[1]);
}

/* END between two daemons over TCP: it travels like data. */
static void case_end_remote(void)
{
	static const char *const tcp[] = { "--transport", "tcp", NULL };
	const uint64_t n = 5000;
	struct hd a, b;
	char out[4096];
	flowshm_t *p = NULL;
	unsigned char buf[REC_MAX];
	int ready[2];
	pid_t pid;
	char x;

	hd_start(&b, moverd_bin, "subs7-B", true, NULL);
	hd_start(&a, moverd_bin, "subs7-A", false, tcp);
	CHECK(hd_ctl(&a, moverctl_bin, out, sizeof(out), "flow create e "
		     "--peer 127.0.0.1:%d --ring-size 64K --max-record 1024",
		     b.port) == 0);
	CHECK(hd_wait_state(&a, moverctl_bin, "e", "open", 10000, NULL, 0));
	CHECK(pipe(ready) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		flowshm_t *c = NULL;
		size_t len;

		setenv("FLOWMOVER_SOCKET", b.sock, 1);
		CHECK_RC(flowshm_attach("e", FLOWSHM_CONSUMER, NULL, &c), 0);
		CHECK(write(ready[1], "x", 1) == 1);
		consume_all(c, 1, n);
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS),
			 -ENODATA);
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -ENODATA);
		flowshm_detach(c);
		_exit(0);
	}
	CHECK(read(ready[0], &x, 1) == 1);
	setenv("FLOWMOVER_SOCKET", a.sock, 1);
	CHECK_RC(flowshm_attach("e", FLOWSHM_PRODUCER, NULL, &p), 0);
	for (uint64_t s = 0; s < n; s++) {
		size_t l = tu_rec_len(0, s, 16, REC_MAX);

		tu_fill(buf, 0, s, l);
		CHECK_RC(flowshm_send(p, buf, l, WAIT_NS), 0);
	}
	/* the END record, on A's ring after everything (no flowshm_end yet:
	 * the ring call, as the producer's library will make it) */
	while (fr_write_end(&p->ring) == -EAGAIN)
		usleep(1000);
	CHECK_RC(flowshm_send(p, buf, 10, 0), -EPIPE);
	CHECK(wait_child(pid) == 0);
	printf("  %llu records from A to B, then -ENODATA on B\n",
	       (unsigned long long)n);
	flowshm_detach(p);
	hd_alive(&a);
	hd_alive(&b);
	hd_stop(&a);
	hd_stop(&b);
	close(ready[0]);
	close(ready[1]);
}

/* A ring file of format 1 in the state directory (an older moverd's) is
 * refused at start with its version named; the daemon goes on. */
static void case_v1_ring_file(void)
{
	char state[160], ring[200], out[4096];
	const char *extra[] = { "--state-dir", state, NULL };
	uint32_t v1 = 1;
	struct hd d;
	char speaks[64];
	int fd;

	snprintf(speaks, sizeof(speaks), "ring format 1, this moverd speaks %u",
		 FR_VERSION);

	snprintf(state, sizeof(state), "/tmp/fm-subs8-%d/state", (int)getpid());
	hd_start(&d, moverd_bin, "subs8", false, extra);
	/* a sender flow (its peer need not exist): a ring file */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create old "
		     "--peer 127.0.0.1:%d --ring-size 64K", hd_free_port()) == 0);
	hd_kill(&d);
	snprintf(ring, sizeof(ring), "%s/old.ring", state);
	fd = open(ring, O_RDWR);
	CHECK(fd >= 0);
	CHECK(pwrite(fd, &v1, sizeof(v1), offsetof(struct fr_geometry,
						   version)) == sizeof(v1));
	close(fd);
	hd_restart(&d, moverd_bin, extra);
	for (int i = 0; i < 500 && !hd_log_count(&d, speaks); i++)
		usleep(10000);
	CHECK(hd_log_count(&d, speaks) == 1);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow show old") != 0);
	hd_alive(&d);
	hd_stop(&d);
}

/*
 * Through a real moverd: a producer ends its stream on a full ring (its
 * consumer attached, not reading).  The END waits for room, retried on a
 * timer: moverd woke 50 times a second for it, walking every flow, for as
 * long as the consumer did not read; the retries now back off.  The
 * consumer then reads every record, and the END.
 */
static void case_end_full_ring(void)
{
	unsigned char buf[REC_MAX];
	flowshm_t *p = NULL, *c = NULL;
	uint64_t n = 0;
	char out[4096];
	struct hd d;
	size_t len;
	long sw;
	int rc;

	hd_start(&d, moverd_bin, "subs11", false, NULL);
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow create f "
		     "--ring-size 64K --max-record 1024") == 0);
	setenv("FLOWMOVER_SOCKET", d.sock, 1);
	CHECK_RC(flowshm_attach("f", FLOWSHM_CONSUMER, NULL, &c), 0);
	CHECK_RC(flowshm_attach("f", FLOWSHM_PRODUCER, NULL, &p), 0);
	for (;;) {
		size_t l = tu_rec_len(0, n, 16, REC_MAX);

		tu_fill(buf, 0, n, l);
		rc = flowshm_send(p, buf, l, 0);
		if (rc == -EAGAIN)
			break;
		CHECK_RC(rc, 0);
		n++;
	}
	CHECK_RC(flowshm_end(p, WAIT_NS), 0);
	usleep(300000);
	sw = hd_status_num(&d, "voluntary_ctxt_switches");
	usleep(3000000);
	sw = hd_status_num(&d, "voluntary_ctxt_switches") - sw;
	printf("  %llu records fill the ring, the END waits: moverd slept "
	       "%ld times in 3 s\n", (unsigned long long)n, sw);
	/* 50 a second for the retries alone before */
	CHECK(sw < 100);
	consume_all(c, 1, n);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, WAIT_NS), -ENODATA);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_alive(&d);
	hd_stop(&d);
}

/*
 * moverd's own slot is given back by moverd alone (ipc/ring.h,
 * Subscribers).  A client steers a slot's gen (a shared counter): it left
 * its slot i at gen g and stored g - 1 there, so moverd's next take of a
 * HELD slot got slot i at gen g, the very slot and gen moverd had noted
 * for that client.  Its detach then freed moverd's slot, and moverd's
 * handle forgot it held one: it sent on, unheld, and never saw the slot
 * lost (a review).  A dead pid written into moverd's slot had its judge
 * of dead holders do the same.  Here the test is moverd, on its own
 * handle of the ring.
 */
static void case_own_slot_kept(void)
{
	int fd = tu_ring(1 << 16, REC_MAX, 0);
	flowshm_t *m = tu_open(fd, FLOWSHM_PRODUCER, 0);
	struct fr_ring *r = &m->ring;
	uint64_t gen;
	unsigned slot;
	pid_t dead;

	/* the client's slot, taken for it at its attach; it leaves it and
	 * steers the gen back */
	CHECK_RC(fr_sub_take(r, 0, &slot, &gen), 0);
	fr_sub_leave(r, slot, gen);
	atomic_store(&r->sh->subs[slot].gen, gen - 1);
	/* moverd takes its HELD slot: the same slot, at the client's gen */
	CHECK_RC(fr_sub_take_held(r, (uint32_t)getpid()), 0);
	printf("  the client's slot %u gen %llu; moverd's slot %u gen %llu\n",
	       slot, (unsigned long long)gen, r->sub,
	       (unsigned long long)r->sub_gen);
	CHECK(r->sub == slot && r->sub_gen == gen);
	/* the client's control connection closes */
	fr_sub_leave_other(r, slot, gen);
	CHECK(r->sub == slot && !fr_sub_lost(r));
	CHECK(atomic_load(&r->sh->subs[slot].state) == FR_SUB_HELD);
	/* a dead process's pid written into moverd's slot */
	dead = fork();
	CHECK(dead >= 0);
	if (dead == 0)
		_exit(0);
	CHECK(wait_child(dead) == 0);
	atomic_store(&r->sh->subs[slot].pid, (uint32_t)dead);
	CHECK(fr_sub_leave_dead(r, 1u << slot) == 0);
	CHECK(r->sub == slot && !fr_sub_lost(r));
	CHECK(atomic_load(&r->sh->subs[slot].state) == FR_SUB_HELD);
	/* moverd's own leave still gives it back */
	fr_sub_leave(r, slot, gen);
	CHECK(r->sub == FR_MAX_SUBS);
	CHECK(atomic_load(&r->sh->subs[slot].state) == FR_SUB_FREE);
	flowshm_close(m);
	close(fd);
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_fan_out, "2 and 4 subscriber processes each see "
		  "every record of 2 producers in order" },
		{ 2, case_slowest_holds, "the slowest subscriber holds the "
		  "producers back" },
		{ 3, case_dead_slot_left, "a killed subscriber's slot, given "
		  "back, releases the producers" },
		{ 4, case_max_lag, "max_lag cuts a laggard off (-ESTALE); it "
		  "attaches again" },
		{ 5, case_end_local, "END: every record, then -ENODATA; "
		  "producers -EPIPE" },
		{ 6, case_killed_consumer_moverd, "moverd: a consumer killed "
		  "-9 releases the producers" },
		{ 7, case_end_remote, "END between two daemons over TCP" },
		{ 8, case_v1_ring_file, "a format 1 ring file is refused at "
		  "start, its version named" },
		{ 9, case_producer_slot_moverd, "moverd: a live producer's "
		  "claim is never padded; killed -9, its slot goes back" },
		{ 10, case_killed_consumer_no_moverd, "no moverd: a consumer "
		  "killed -9 releases the producer; nothing unread is lost" },
		{ 11, case_end_full_ring, "moverd: an END on a full ring waits, "
		  "moverd at rest; then every record and the END" },
		{ 12, case_own_slot_kept, "moverd's own slot survives a "
		  "client's detach that names it and a dead pid written in it" },
	};

	if (argc != 3) {
		fprintf(stderr, "usage: %s MOVERD MOVERCTL\n", argv[0]);
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]), "FM_SUB_CASES");
}

