/*
 * tests/test_lib.c - the library's pipeline API (issues 11 and 15): waiting
 * on many flows, the set's descriptor, zero-copy batch reads, producer
 * identity, end of stream (alone, through moverd, across two daemons),
 * the flow's state and why a send timed out, strerror.
 *
 *   usage: test_lib MOVERD MOVERCTL        (FM_LIB_CASES=1,3 for some)
 *
 * Cases 1-7 and 18 use rings from flowshm_open_fd and child processes;
 * 10-17 start real moverd daemons on private sockets.  18: the contract
 * at its edges (a review's findings of 2026-11-30, each failed before):
 * recv after peek is misuse, not a second release; the last producer of
 * a recv_batch is its last record's; a producer closed with a reservation
 * pending leaves padding, not a claim that holds the flow; a closed ring
 * with a claim open is slept on, not spun on; a timed set poll that found
 * nothing leaves the set's descriptor armed.
 */
#include "harness.h"
#include "flowshm_internal.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define MS 1000000ll
#define SEC 1000000000ll

static const char *moverd_bin, *moverctl_bin;

/* ---- helpers ------------------------------------------------------------ */

/* A child process; it dies with the test. */
static pid_t child(void)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	return pid;
}

static void reap(pid_t pid)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* Send count records tu_fill(id, first + i) of 16..max bytes. */
static void send_seq(flowshm_t *p, uint32_t id, uint64_t first,
		     uint64_t count, size_t max)
{
	unsigned char buf[4096];

	for (uint64_t s = first; s < first + count; s++) {
		size_t len = tu_rec_len(id, s, 16, max);

		tu_fill(buf, id, s, len);
		CHECK_RC(flowshm_send(p, buf, len, 10 * SEC), 0);
	}
}

/* Receive one record and check it is tu_fill(id, seq). */
static void recv_one(flowshm_t *c, uint32_t want_id, uint64_t want_seq)
{
	unsigned char buf[4096];
	uint32_t id;
	uint64_t seq;
	size_t len;

	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10 * SEC), 0);
	CHECK(tu_verify(buf, len, &id, &seq));
	if (id != want_id || seq != want_seq)
		fprintf(stderr, "got %u/%llu, want %u/%llu\n", id,
			(unsigned long long)seq, want_id,
			(unsigned long long)want_seq);
	CHECK(id == want_id && seq == want_seq);
}

/* Read records first..first+count-1 of producer id in place, in batches. */
static void peek_seq(flowshm_t *c, uint32_t want_id, uint64_t first,
		     uint64_t count)
{
	struct flowshm_rec recs[32];
	uint64_t s = first;

	while (s < first + count) {
		unsigned got, want = first + count - s < 32 ?
				     (unsigned)(first + count - s) : 32;

		CHECK_RC(flowshm_peek_batch(c, recs, want, &got, 10 * SEC), 0);
		for (unsigned k = 0; k < got; k++, s++) {
			uint32_t id;
			uint64_t seq;

			CHECK(tu_verify(recs[k].data, recs[k].len, &id, &seq));
			CHECK(id == want_id && seq == s);
		}
		CHECK_RC(flowshm_release_batch(c), 0);
	}
}

/* Every read call says end of stream, again and again. */
static void check_at_end(flowshm_t *c)
{
	unsigned char buf[64];
	struct iovec iov[4];
	struct flowshm_rec recs[4];
	const void *p;
	unsigned got;
	size_t len;

	/* across hosts the end may still be on its way */
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10 * SEC), -ENODATA);
	for (int i = 0; i < 2; i++) {
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -ENODATA);
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10 * MS),
			 -ENODATA);
		CHECK_RC(flowshm_peek(c, &p, &len, 0), -ENODATA);
		CHECK_RC(flowshm_recv_batch(c, buf, sizeof(buf), iov, 4, &got,
					    0), -ENODATA);
		CHECK_RC(flowshm_peek_batch(c, recs, 4, &got, 0), -ENODATA);
	}
}

/* Fill a producer's ring until a send finds no room. */
static unsigned fill(flowshm_t *p, size_t len)
{
	unsigned char buf[4096] = { 0 };
	unsigned n = 0;

	while (flowshm_send(p, buf, len, 0) == 0)
		n++;
	return n;
}

/* ---- case 1: strerror --------------------------------------------------- */

static void case_strerror(void)
{
	static const int codes[] = {
		EAGAIN, ETIMEDOUT, ENOTCONN, EHOSTDOWN, EMSGSIZE, EPIPE,
		ENODATA, ESTALE, EPROTO, EINVAL, EBUSY, ENOSPC, EDQUOT,
		ENOMEM, ENOENT, EACCES, ECONNREFUSED, EEXIST, ECONNRESET,
		ENOSYS,
	};
	size_t n = sizeof(codes) / sizeof(codes[0]);

	for (size_t i = 0; i < n; i++) {
		const char *s = flowshm_strerror(-codes[i]);

		printf("  -%-3d %s\n", codes[i], s);
		CHECK(s && *s);
		/* flowmover's own words, not libc's */
		CHECK(strcmp(s, strerror(codes[i])));
		for (size_t j = 0; j < i; j++)
			CHECK(strcmp(s, flowshm_strerror(-codes[j])));
	}
	CHECK(!strcmp(flowshm_strerror(0), "success"));
}

/* ---- case 2: batch reads in place, producer identity -------------------- */

#define NPROD 3
#define PER_PROD 3000u

static void case_batch_identity(void)
{
	int fd = tu_ring(1 << 16, 1024, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	uint32_t ident[NPROD] = { 0 };
	uint64_t next[NPROD] = { 0 }, total = 0, batches = 0, multi = 0;
	struct flowshm_rec recs[64];
	pid_t pids[NPROD];
	unsigned char buf[64];
	size_t len;

	for (uint32_t i = 0; i < NPROD; i++) {
		pids[i] = child();
		if (pids[i] == 0) {
			flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);

			send_seq(p, i, 0, PER_PROD, 1024);
			flowshm_close(p);
			_exit(0);
		}
	}
	CHECK(flowshm_last_producer(c) == 0);
	while (total < NPROD * PER_PROD) {
		unsigned got;

		CHECK_RC(flowshm_peek_batch(c, recs, 64, &got, 10 * SEC), 0);
		CHECK(got >= 1 && got <= 64);
		/* a batch is held: the other reads are refused */
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -EINVAL);
		CHECK_RC(flowshm_peek_batch(c, recs, 64, &got, 0), -EINVAL);
		for (unsigned k = 0; k < got; k++) {
			uint32_t id;
			uint64_t seq;

			CHECK(tu_verify(recs[k].data, recs[k].len, &id, &seq));
			CHECK(id < NPROD && seq == next[id]);
			next[id]++;
			CHECK(recs[k].producer != 0);
			if (!ident[id])
				ident[id] = recs[k].producer;
			/* stable for every record of one producer */
			CHECK(recs[k].producer == ident[id]);
		}
		CHECK(flowshm_last_producer(c) == recs[got - 1].producer);
		total += got;
		batches++;
		multi += got > 1;
		/* every other batch released by flowshm_release */
		if (batches & 1)
			CHECK_RC(flowshm_release_batch(c), 0);
		else
			CHECK_RC(flowshm_release(c), 0);
		CHECK_RC(flowshm_release_batch(c), -EINVAL);
	}
	for (int i = 0; i < NPROD; i++)
		reap(pids[i]);
	/* distinct between producers */
	for (int i = 0; i < NPROD; i++)
		for (int j = 0; j < i; j++)
			CHECK(ident[i] != ident[j]);
	printf("  %llu records in %llu batches (%llu of more than one); "
	       "producers %#x %#x %#x\n", (unsigned long long)total,
	       (unsigned long long)batches, (unsigned long long)multi,
	       ident[0], ident[1], ident[2]);
	CHECK(multi > 0);

	/* recv and peek say who too */
	{
		flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
		const void *d;

		send_seq(p, 7, 0, 2, 64);
		recv_one(c, 7, 0);
		CHECK(flowshm_last_producer(c) != 0);
		CHECK_RC(flowshm_peek(c, &d, &len, 0), 0);
		CHECK(flowshm_last_producer(c) != 0);
		CHECK_RC(flowshm_release(c), 0);
		for (int i = 0; i < NPROD; i++)
			CHECK(flowshm_last_producer(c) != ident[i]);
		flowshm_close(p);
	}
	flowshm_close(c);
	close(fd);
}

/* ---- case 3: end of stream without moverd ------------------------------- */

static void *recv_three(void *arg)
{
	unsigned char buf[256];
	size_t len;

	usleep(100000); /* the producer is asleep by then */
	for (int i = 0; i < 3; i++)
		CHECK_RC(flowshm_recv(arg, buf, sizeof(buf), &len, 0), 0);
	return NULL;
}

static void case_end_alone(void)
{
	int fd = tu_ring(4096, 256, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	flowshm_t *q = tu_open(fd, FLOWSHM_PRODUCER, 0);
	struct flowshm_state st;
	unsigned n = fill(p, 200);
	unsigned char buf[256];
	size_t len;

	CHECK(n > 0);
	/* full: the end waits for room */
	CHECK_RC(flowshm_end(p, 0), -EAGAIN);
	CHECK_RC(flowshm_end(p, 20 * MS), -ETIMEDOUT);
	CHECK_RC(flowshm_end(c, 0), -EINVAL);
	/* the end already turns other producers away */
	CHECK_RC(flowshm_send(q, buf, 10, 0), -EPIPE);
	/* room: a consumer thread reads a few records (published lazily,
	 * and at once when a producer waits) */
	{
		pthread_t t;

		CHECK(pthread_create(&t, NULL, recv_three, c) == 0);
		CHECK_RC(flowshm_end(p, -1), 0);
		CHECK(pthread_join(t, NULL) == 0);
	}
	CHECK_RC(flowshm_end(p, 0), 0);        /* again: no second record */
	CHECK_RC(flowshm_send(q, buf, 10, 0), -EPIPE);
	for (unsigned i = 3; i < n; i++)
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
	check_at_end(c);
	CHECK_RC(flowshm_state(c, &st), 0);
	printf("  %u records then end of stream; state %s\n", n,
	       flowshm_state_name(st.state));
	CHECK(st.state == FLOWSHM_STATE_ENDED);
	CHECK(st.daemon == FLOWSHM_DAEMON_NONE);
	flowshm_close(q);
	flowshm_close(p);
	flowshm_close(c);
	close(fd);
}

/* ---- case 4: flowshm_poll ----------------------------------------------- */

static void case_poll(void)
{
	int fds[3];
	flowshm_t *c[3], *p[3];
	unsigned ready[3], n;
	uint64_t t0;
	pid_t pid;

	for (int i = 0; i < 3; i++) {
		fds[i] = tu_ring(1 << 16, 1024, 0);
		c[i] = tu_open(fds[i], FLOWSHM_CONSUMER, 0);
		p[i] = tu_open(fds[i], FLOWSHM_PRODUCER, 0);
	}
	CHECK_RC(flowshm_poll(c, 3, ready, &n, 0), -EAGAIN);
	CHECK_RC(flowshm_poll(c, 0, ready, &n, 0), -EINVAL);
	CHECK_RC(flowshm_poll(p, 3, ready, &n, 0), -EINVAL);
	t0 = tu_now_ns();
	CHECK_RC(flowshm_poll(c, 3, ready, &n, 50 * MS), -ETIMEDOUT);
	CHECK(tu_now_ns() - t0 >= 50 * MS);

	/* a record from another process wakes the poll (asleep by then) */
	pid = child();
	if (pid == 0) {
		usleep(200000);
		send_seq(p[2], 2, 0, 1, 64);
		_exit(0);
	}
	CHECK_RC(flowshm_poll(c, 3, ready, &n, 10 * SEC), 0);
	reap(pid);
	CHECK(n == 1 && ready[0] == 2);
	recv_one(c[2], 2, 0);
	CHECK_RC(flowshm_poll(c, 3, ready, &n, 0), -EAGAIN);

	/* several ready: all listed; a closed flow is ready (its -EPIPE) */
	send_seq(p[0], 0, 0, 1, 64);
	flowshm_shutdown(c[1]);
	CHECK_RC(flowshm_poll(c, 3, ready, &n, 0), 0);
	CHECK(n == 2);
	CHECK((ready[0] == 0 && ready[1] == 1) ||
	      (ready[0] == 1 && ready[1] == 0));
	for (int i = 0; i < 3; i++) {
		flowshm_close(p[i]);
		flowshm_close(c[i]);
		close(fds[i]);
	}
}

/* ---- case 5: fairness: a flooded flow and a sparse one ------------------ */

#define SPARSE 50u

static void case_fair(void)
{
	int fds[2] = { tu_ring(1 << 16, 1024, 0), tu_ring(1 << 16, 1024, 0) };
	flowshm_t *c[2] = { tu_open(fds[0], FLOWSHM_CONSUMER, 0),
			    tu_open(fds[1], FLOWSHM_CONSUMER, 0) };
	_Atomic int *stop = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint64_t got[2] = { 0, 0 }, until = tu_now_ns() + 60 * SEC;
	unsigned char buf[4096];
	pid_t flood, sparse;

	CHECK(stop != MAP_FAILED);
	flood = child();
	if (flood == 0) {
		flowshm_t *p = tu_open(fds[0], FLOWSHM_PRODUCER, 0);
		unsigned char b[512] = { 0 };

		/* as fast as the ring takes it, until told to stop */
		while (!atomic_load(stop))
			flowshm_send(p, b, sizeof(b), 10 * MS);
		_exit(0);
	}
	sparse = child();
	if (sparse == 0) {
		flowshm_t *p = tu_open(fds[1], FLOWSHM_PRODUCER, 0);

		for (uint64_t s = 0; s < SPARSE; s++) {
			usleep(2000);
			send_seq(p, 1, s, 1, 64);
		}
		_exit(0);
	}
	/*
	 * Serve only the first ready flow, one record each time, and more
	 * slowly than the flooding producer refills its ring (which thus
	 * never runs dry): with a scan that always started at flow 0, the
	 * flooded flow would be served every time and the sparse one never.
	 */
	while (got[1] < SPARSE && tu_now_ns() < until) {
		unsigned ready[2], n;
		size_t len;

		CHECK_RC(flowshm_poll(c, 2, ready, &n, 5 * SEC), 0);
		CHECK_RC(flowshm_recv(c[ready[0]], buf, sizeof(buf), &len, 0),
			 0);
		got[ready[0]]++;
		usleep(50);
	}
	atomic_store(stop, 1);
	reap(flood);
	reap(sparse);
	printf("  flooded flow: %llu records, sparse flow: %llu of %u\n",
	       (unsigned long long)got[0], (unsigned long long)got[1], SPARSE);
	CHECK(got[1] == SPARSE);
	CHECK(got[0] > 0);
	for (int i = 0; i < 2; i++) {
		flowshm_close(c[i]);
		close(fds[i]);
	}
	munmap((void *)stop, 4096);
}

/* ---- case 6: the set's descriptor with epoll ---------------------------- */

#define SET_RECS 200u

static void case_set_epoll(void)
{
	int fds[2] = { tu_ring(1 << 16, 1024, 0), tu_ring(1 << 16, 1024, 0) };
	flowshm_t *c[2] = { tu_open(fds[0], FLOWSHM_CONSUMER, 0),
			    tu_open(fds[1], FLOWSHM_CONSUMER, 0) };
	struct epoll_event ev = { .events = EPOLLIN }, out;
	uint64_t got = 0, wakes = 0, until;
	unsigned char buf[4096];
	flowshm_set_t *s;
	flowshm_t *ready[2];
	int ep, sfd;
	unsigned n;
	pid_t pid;

	CHECK_RC(flowshm_set_create(&s), 0);
	CHECK_RC(flowshm_set_add(s, c[0]), 0);
	CHECK_RC(flowshm_set_add(s, c[0]), -EEXIST);
	CHECK_RC(flowshm_set_add(s, c[1]), 0);
	sfd = flowshm_set_fd(s);
	CHECK(sfd >= 0);
	CHECK(flowshm_set_fd(s) == sfd);
	ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0);
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev) == 0);

	/* readable at first; polling to -EAGAIN arms it; then quiet */
	CHECK(epoll_wait(ep, &out, 1, 1000) == 1);
	CHECK_RC(flowshm_set_poll(s, ready, 2, &n, 0), -EAGAIN);
	CHECK(epoll_wait(ep, &out, 1, 200) == 0);

	pid = child();
	if (pid == 0) {
		flowshm_t *p[2] = { tu_open(fds[0], FLOWSHM_PRODUCER, 0),
				    tu_open(fds[1], FLOWSHM_PRODUCER, 0) };

		for (uint64_t i = 0; i < SET_RECS; i++) {
			/* bursts and gaps: some arrive while it sleeps */
			if (tu_mix(i) % 4 == 0)
				usleep(1000 + tu_mix(i) % 3000);
			send_seq(p[i & 1], (uint32_t)(i & 1), i / 2, 1, 256);
		}
		_exit(0);
	}
	until = tu_now_ns() + 30 * SEC;
	while (got < SET_RECS && tu_now_ns() < until) {
		int rc;

		CHECK(epoll_wait(ep, &out, 1, 5000) == 1);
		wakes++;
		/* edge semantics: serve until -EAGAIN, which re-arms */
		while ((rc = flowshm_set_poll(s, ready, 2, &n, 0)) == 0) {
			for (unsigned k = 0; k < n; k++) {
				size_t len;

				CHECK_RC(flowshm_recv(ready[k], buf,
						      sizeof(buf), &len, 0), 0);
				got++;
			}
		}
		CHECK_RC(rc, -EAGAIN);
	}
	reap(pid);
	printf("  %llu records through %llu epoll wakes\n",
	       (unsigned long long)got, (unsigned long long)wakes);
	CHECK(got == SET_RECS);

	/* remove while armed, and destroy: nothing hangs */
	CHECK_RC(flowshm_set_poll(s, ready, 2, &n, 0), -EAGAIN);
	CHECK_RC(flowshm_set_remove(s, c[1]), 0);
	CHECK_RC(flowshm_set_remove(s, c[1]), -ENOENT);
	CHECK_RC(flowshm_set_poll(s, ready, 2, &n, 0), -EAGAIN);
	/* a blocking poll on the set */
	{
		flowshm_t *p = tu_open(fds[0], FLOWSHM_PRODUCER, 0);

		send_seq(p, 0, 1000, 1, 64);
		CHECK_RC(flowshm_set_poll(s, ready, 2, &n, SEC), 0);
		CHECK(n == 1 && ready[0] == c[0]);
		flowshm_close(p);
	}
	flowshm_set_destroy(s);
	close(ep);
	for (int i = 0; i < 2; i++) {
		flowshm_close(c[i]);
		close(fds[i]);
	}
}

/* ---- case 7: state of a ring without moverd ----------------------------- */

static void case_state_alone(void)
{
	int fd = tu_ring(1 << 16, 1024, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	struct flowshm_state st;
	unsigned char buf[1024] = { 0 };
	size_t len;

	CHECK_RC(flowshm_state(NULL, &st), -EINVAL);
	for (int i = 0; i < 10; i++)
		CHECK_RC(flowshm_send(p, buf, 100, 0), 0);
	CHECK_RC(flowshm_state(c, &st), 0);
	CHECK(st.state == FLOWSHM_STATE_UNKNOWN);
	CHECK(st.daemon == FLOWSHM_DAEMON_NONE);
	CHECK(st.lag_bytes == 10 * fr_record_bytes(100));
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
	CHECK_RC(flowshm_state(c, &st), 0);
	CHECK(st.lag_bytes == 9 * fr_record_bytes(100));
	flowshm_close(p);
	flowshm_close(c);
	close(fd);
}

/* ---- case 8: more flows than one futex_waitv takes: the sleep loop ------ */

#define MANY 130

static void case_poll_many(void)
{
	static flowshm_t *c[MANY];
	static unsigned ready[MANY];
	static int fds[MANY];
	unsigned n;
	pid_t pid;

	for (int i = 0; i < MANY; i++) {
		fds[i] = tu_ring(4096, 64, 0);
		c[i] = tu_open(fds[i], FLOWSHM_CONSUMER, 0);
	}
	CHECK_RC(flowshm_poll(c, MANY, ready, &n, 20 * MS), -ETIMEDOUT);
	pid = child();
	if (pid == 0) {
		flowshm_t *p = tu_open(fds[MANY - 1], FLOWSHM_PRODUCER, 0);

		usleep(100000);
		send_seq(p, 1, 0, 1, 32);
		_exit(0);
	}
	CHECK_RC(flowshm_poll(c, MANY, ready, &n, 10 * SEC), 0);
	reap(pid);
	CHECK(n == 1 && ready[0] == MANY - 1);
	recv_one(c[MANY - 1], 1, 0);
	for (int i = 0; i < MANY; i++) {
		flowshm_close(c[i]);
		close(fds[i]);
	}
}

/* ---- daemons ------------------------------------------------------------ */

static flowshm_t *attach(const struct hd *d, const char *name,
			 enum flowshm_role role)
{
	flowshm_t *f = NULL;
	int rc;

	setenv("FLOWMOVER_SOCKET", d->sock, 1);
	rc = flowshm_attach(name, role, NULL, &f);
	if (rc)
		fprintf(stderr, "attach %s: %s\n", name, flowshm_attach_error());
	CHECK_RC(rc, 0);
	return f;
}

static void create(const struct hd *d, const char *name, const char *flags)
{
	char out[4096];
	int rc = hd_ctl(d, moverctl_bin, out, sizeof(out),
			"flow create %s %s", name, flags);

	if (rc)
		fprintf(stderr, "flow create %s: %s", name, out);
	CHECK(rc == 0);
}

/* ---- case 10: end of stream through moverd, two producers --------------- */

static void case_end_moverd(void)
{
	struct hd d;
	flowshm_t *p1, *p2, *c;
	struct flowshm_state st;
	unsigned char buf[64];
	size_t len;

	hd_start(&d, moverd_bin, "lib10", false, NULL);
	create(&d, "e1", "--ring-size 64K --max-record 1K");
	p1 = attach(&d, "e1", FLOWSHM_PRODUCER);
	p2 = attach(&d, "e1", FLOWSHM_PRODUCER);
	c = attach(&d, "e1", FLOWSHM_CONSUMER);
	CHECK_RC(flowshm_end(c, 0), -EINVAL);
	send_seq(p1, 1, 0, 100, 512);
	CHECK_RC(flowshm_end(p1, 0), 0);
	CHECK_RC(flowshm_end(p1, 0), 0);
	for (uint64_t s = 0; s < 100; s++)
		recv_one(c, 1, s);
	/* p2 has not ended: no end of stream yet */
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 300 * MS),
		 -ETIMEDOUT);
	send_seq(p2, 2, 0, 50, 512);
	CHECK_RC(flowshm_end(p2, 0), 0);
	for (uint64_t s = 0; s < 50; s++)
		recv_one(c, 2, s);
	check_at_end(c);
	CHECK_RC(flowshm_send(p1, buf, 8, 0), -EPIPE);
	CHECK_RC(flowshm_state(c, &st), 0);
	printf("  150 records then end of stream; state %s\n",
	       flowshm_state_name(st.state));
	CHECK(st.state == FLOWSHM_STATE_ENDED);
	flowshm_detach(p1);
	flowshm_detach(p2);
	flowshm_detach(c);
	hd_stop(&d);
}

/* ---- case 11: a producer that dies without ending counts as gone -------- */

static void case_end_gone(void)
{
	struct hd d;
	flowshm_t *p1, *c;
	unsigned char buf[64];
	size_t len;
	pid_t pid;
	int st;

	hd_start(&d, moverd_bin, "lib11", false, NULL);
	create(&d, "e2", "--ring-size 64K --max-record 1K");
	c = attach(&d, "e2", FLOWSHM_CONSUMER);
	p1 = attach(&d, "e2", FLOWSHM_PRODUCER);
	pid = child();
	if (pid == 0) {
		flowshm_t *p2 = attach(&d, "e2", FLOWSHM_PRODUCER);

		send_seq(p2, 2, 0, 20, 512);
		pause(); /* killed with its records committed, not ended */
		_exit(1);
	}
	for (uint64_t s = 0; s < 20; s++)
		recv_one(c, 2, s);
	send_seq(p1, 1, 0, 20, 512);
	CHECK_RC(flowshm_end(p1, 0), 0);
	for (uint64_t s = 0; s < 20; s++)
		recv_one(c, 1, s);
	/* the other producer is still attached and has not ended */
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 300 * MS),
		 -ETIMEDOUT);
	kill(pid, SIGKILL);
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10 * SEC), -ENODATA);
	check_at_end(c);
	flowshm_detach(p1);
	flowshm_detach(c);
	hd_stop(&d);
}

/* ---- case 12: moverctl flow end, also into a full ring ------------------ */

static void case_flow_end(void)
{
	struct hd d;
	flowshm_t *p, *c;
	unsigned char buf[1024];
	char out[4096];
	unsigned n;
	size_t len;

	hd_start(&d, moverd_bin, "lib12", false, NULL);
	create(&d, "e3", "--ring-size 64K --max-record 1K");
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow end nope") == 1);
	printf("  flow end nope: %s", out);
	p = attach(&d, "e3", FLOWSHM_PRODUCER);
	c = attach(&d, "e3", FLOWSHM_CONSUMER);
	n = fill(p, 1000);
	CHECK(n > 0);
	/* full: moverd answers at once and writes the end when there is room */
	CHECK(hd_ctl(&d, moverctl_bin, out, sizeof(out), "flow end e3") == 0);
	printf("  flow end e3 (ring full, %u records): %s", n, out);
	for (unsigned i = 0; i < n; i++)
		CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 10 * SEC), -ENODATA);
	check_at_end(c);
	CHECK_RC(flowshm_send(p, buf, 8, 0), -EPIPE);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_stop(&d);
}

/* ---- case 13: state through moverd; moverd gone: -EHOSTDOWN ------------- */

static void case_state_daemon(void)
{
	struct hd d;
	flowshm_t *p, *c;
	struct flowshm_state st;
	unsigned char buf[1024] = { 0 };
	unsigned n;

	hd_start(&d, moverd_bin, "lib13", false, NULL);
	create(&d, "s1", "--ring-size 64K --max-record 1K");
	p = attach(&d, "s1", FLOWSHM_PRODUCER);
	c = attach(&d, "s1", FLOWSHM_CONSUMER);
	CHECK_RC(flowshm_state(p, &st), 0);
	printf("  state %s, %u producers, %u consumers, daemon %d\n",
	       flowshm_state_name(st.state), st.producers, st.consumers,
	       st.daemon);
	CHECK(st.state == FLOWSHM_STATE_OPEN);
	CHECK(st.producers == 1 && st.consumers == 1);
	CHECK(st.daemon == FLOWSHM_DAEMON_UP);
	CHECK(st.lag_bytes == 0);
	n = fill(p, 1000);
	/* a slow consumer: back-pressure */
	CHECK_RC(flowshm_send(p, buf, 1000, 50 * MS), -ETIMEDOUT);
	CHECK_RC(flowshm_state(p, &st), 0);
	CHECK(st.lag_bytes == n * fr_record_bytes(1000));
	CHECK_RC(flowshm_state(c, &st), 0);
	CHECK(st.lag_bytes == n * fr_record_bytes(1000));

	hd_kill(&d);
	/* its io_uring (which holds our connection) goes a little later */
	for (int i = 0; i < 500; i++) {
		CHECK_RC(flowshm_state(p, &st), 0);
		if (st.daemon != FLOWSHM_DAEMON_UP)
			break;
		usleep(10000);
	}
	printf("  after kill -9: daemon %d\n", st.daemon);
	CHECK(st.daemon == FLOWSHM_DAEMON_DOWN);
	CHECK_RC(flowshm_send(p, buf, 1000, 50 * MS), -EHOSTDOWN);
	/* the end cannot be told to a moverd that is gone */
	CHECK(flowshm_end(p, 0) < 0);
	flowshm_detach(p);
	flowshm_detach(c);
	hd_cleanup(&d);
}

/* ---- case 14: a sender flow whose peer is not there: -ENOTCONN ---------- */

static void case_notconn(void)
{
	struct hd a;
	flowshm_t *p;
	struct flowshm_state st;
	unsigned char buf[1024] = { 0 };
	char flags[96];

	hd_start(&a, moverd_bin, "lib14", false,
		 (const char *const[]){ "--transport", "tcp", NULL });
	snprintf(flags, sizeof(flags), "--peer 127.0.0.1:%d --ring-size 64K "
		 "--max-record 1K", hd_free_port());
	create(&a, "n1", flags);
	p = attach(&a, "n1", FLOWSHM_PRODUCER);
	CHECK_RC(flowshm_state(p, &st), 0);
	printf("  state %s\n", flowshm_state_name(st.state));
	CHECK(st.state == FLOWSHM_STATE_CONNECTING ||
	      st.state == FLOWSHM_STATE_PEER_DOWN);
	CHECK(fill(p, 1000) > 0);
	CHECK_RC(flowshm_send(p, buf, 1000, 50 * MS), -ENOTCONN);
	flowshm_detach(p);
	hd_stop(&a);
}

/* ---- case 15: end of stream across two daemons, and a kill -9 of B ------ */

static void two_daemons(struct hd *a, struct hd *b, const char *tag,
			const char *name)
{
	char ta[32], tb[32], flags[128];

	snprintf(ta, sizeof(ta), "%s-A", tag);
	snprintf(tb, sizeof(tb), "%s-B", tag);
	hd_start(b, moverd_bin, tb, true, NULL);
	hd_start(a, moverd_bin, ta, false,
		 (const char *const[]){ "--transport", "tcp", NULL });
	snprintf(flags, sizeof(flags), "--peer 127.0.0.1:%d --ring-size 256K "
		 "--max-record 1K", b->port);
	create(a, name, flags);
	CHECK(hd_wait_state(a, moverctl_bin, name, "open", 10000, NULL, 0));
	CHECK(hd_wait_state(b, moverctl_bin, name, "open", 10000, NULL, 0));
}

static void case_end_remote(void)
{
	struct hd a, b;
	flowshm_t *p, *c;
	struct flowshm_state st;

	two_daemons(&a, &b, "lib15", "r1");
	p = attach(&a, "r1", FLOWSHM_PRODUCER);
	c = attach(&b, "r1", FLOWSHM_CONSUMER);
	send_seq(p, 1, 0, 500, 1000);
	CHECK_RC(flowshm_end(p, 0), 0);
	/* half one by one, half in place in batches (a deposit ring) */
	for (uint64_t s = 0; s < 250; s++)
		recv_one(c, 1, s);
	peek_seq(c, 1, 250, 250);
	check_at_end(c);
	CHECK_RC(flowshm_state(c, &st), 0);
	printf("  B: 500 records then end of stream; state %s\n",
	       flowshm_state_name(st.state));
	CHECK(st.state == FLOWSHM_STATE_ENDED);
	flowshm_detach(c);
	flowshm_detach(p);
	hd_stop(&a);
	hd_stop(&b);
}

static void case_end_remote_restart(void)
{
	struct hd a, b;
	flowshm_t *p, *c;

	two_daemons(&a, &b, "lib16", "r2");
	p = attach(&a, "r2", FLOWSHM_PRODUCER);
	send_seq(p, 1, 0, 100, 1000);
	hd_kill(&b);
	send_seq(p, 1, 100, 100, 1000);
	CHECK_RC(flowshm_end(p, 0), 0);
	hd_restart(&b, moverd_bin, NULL);
	CHECK(hd_wait_state(&b, moverctl_bin, "r2", "open", 20000, NULL, 0));
	c = attach(&b, "r2", FLOWSHM_CONSUMER);
	for (uint64_t s = 0; s < 200; s++)
		recv_one(c, 1, s);
	check_at_end(c);
	printf("  B killed mid-stream and restarted: 200 records once, then "
	       "end of stream\n");
	flowshm_detach(c);
	flowshm_detach(p);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 17: a consumer learns that moverd restarted -------------------- */

static void case_restarted(void)
{
	struct hd a, b;
	flowshm_t *c;
	struct flowshm_state st;

	two_daemons(&a, &b, "lib17", "r3");
	c = attach(&b, "r3", FLOWSHM_CONSUMER);
	CHECK_RC(flowshm_state(c, &st), 0);
	CHECK(st.daemon == FLOWSHM_DAEMON_UP);
	hd_kill(&b);
	for (int i = 0; i < 500 && st.daemon == FLOWSHM_DAEMON_UP; i++) {
		usleep(10000);
		CHECK_RC(flowshm_state(c, &st), 0);
	}
	printf("  B killed: daemon %d\n", st.daemon);
	CHECK(st.daemon == FLOWSHM_DAEMON_DOWN);
	hd_restart(&b, moverd_bin, NULL);
	/* the new moverd re-adopts the ring and stamps its own start */
	for (int i = 0; i < 1000 && st.daemon != FLOWSHM_DAEMON_RESTARTED;
	     i++) {
		usleep(10000);
		CHECK_RC(flowshm_state(c, &st), 0);
	}
	printf("  B restarted: daemon %d\n", st.daemon);
	CHECK(st.daemon == FLOWSHM_DAEMON_RESTARTED);
	flowshm_detach(c);
	hd_stop(&a);
	hd_stop(&b);
}

/* ---- case 18: the contract at its edges ------------------------------------- */

static void send_str(flowshm_t *p, const char *s)
{
	CHECK_RC(flowshm_send(p, s, strlen(s), SEC), 0);
}

static void recv_str(flowshm_t *c, const char *want, int64_t timeout_ns)
{
	char buf[256];
	size_t len;

	CHECK_RC(flowshm_recv(c, buf, sizeof(buf) - 1, &len, timeout_ns), 0);
	buf[len] = 0;
	if (strcmp(buf, want))
		fprintf(stderr, "got '%s', want '%s'\n", buf, want);
	CHECK(!strcmp(buf, want));
}

/* This thread's cpu time, in ns. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* recv after peek: -EINVAL; the peeked record is released once, the next
 * one comes next (before: released twice, the next one skipped). */
static void peek_then_recv(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[64];
	struct iovec recs[4];
	const void *at;
	unsigned got;
	size_t len;

	send_str(p, "AAAA");
	send_str(p, "BBBB");
	send_str(p, "CCCC");
	CHECK_RC(flowshm_peek(c, &at, &len, 0), 0);
	CHECK(len == 4 && !memcmp(at, "AAAA", 4));
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -EINVAL);
	CHECK_RC(flowshm_recv_batch(c, buf, sizeof(buf), recs, 4, &got, 0),
		 -EINVAL);
	CHECK_RC(flowshm_release(c), 0);
	recv_str(c, "BBBB", 0);
	recv_str(c, "CCCC", 0);
	flowshm_close(c);
	flowshm_close(p);
	close(fd);
}

/* recv_batch stops before a record too big for the buffer: the last
 * producer is the one of the last record it returned. */
static void batch_last_producer(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *pa = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *pb = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[64], big[200] = { 1 }, bigbuf[256];
	struct iovec recs[4];
	uint32_t batch_last;
	unsigned got;
	size_t len;

	send_str(pa, "small");
	CHECK_RC(flowshm_send(pb, big, sizeof(big), SEC), 0);
	send_str(pa, "again");
	CHECK_RC(flowshm_recv_batch(c, buf, sizeof(buf), recs, 4, &got, 0), 0);
	CHECK(got == 1);
	batch_last = flowshm_last_producer(c);
	CHECK_RC(flowshm_recv(c, bigbuf, sizeof(bigbuf), &len, 0), 0);
	CHECK(len == sizeof(big) && flowshm_last_producer(c) != batch_last);
	recv_str(c, "again", 0);
	CHECK(flowshm_last_producer(c) == batch_last);
	flowshm_close(c);
	flowshm_close(pb);
	flowshm_close(pa);
	close(fd);
}

/* A producer closed with a reservation pending, another producer handle
 * of the same process alive: the next record still comes (before: the
 * claim, its pid alive, was never recovered and held the flow), and the
 * ring's count of records leaves the cancelled one out. */
static void closed_reserved(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *pa = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *pb = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 100 * MS);
	void *room;

	/* the reservation is the 64th claim: it adds the handle's 64 to the
	 * shared count, its cancel must take its own back (before: 64) */
	for (unsigned i = 0; i < FR_COUNT_EVERY - 1; i++)
		send_str(pa, "x");
	CHECK_RC(flowshm_reserve(pa, 8, &room, 0), 0);
	flowshm_close(pa);
	CHECK_RC(atomic_load(&pb->ring.sh->records), FR_COUNT_EVERY - 1);
	for (unsigned i = 0; i < FR_COUNT_EVERY - 1; i++)
		recv_str(c, "x", 0);
	send_str(pb, "after");
	recv_str(c, "after", 3 * SEC);
	flowshm_close(c);
	flowshm_close(pb);
	close(fd);
}

/* A closed ring with a claim open at the consumer's position: a recv
 * waits its timeout asleep (before: it spun a cpu for all of it). */
static void closed_claimed(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	unsigned char buf[64];
	uint64_t cpu, wall;
	void *room;
	size_t len;

	CHECK_RC(flowshm_reserve(p, 8, &room, 0), 0);
	flowshm_shutdown(c);
	cpu = thread_cpu_ns();
	wall = tu_now_ns();
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 300 * MS),
		 -ETIMEDOUT);
	cpu = thread_cpu_ns() - cpu;
	wall = tu_now_ns() - wall;
	printf("  a 300 ms recv on a closed ring with a claim open: %.1f ms "
	       "of cpu in %.1f ms\n", cpu / 1e6, wall / 1e6);
	/* asleep, not spinning: a spin takes all of it */
	CHECK(cpu < wall / 3);
	memcpy(room, "late rec", 8);
	CHECK_RC(flowshm_commit(p), 0);
	recv_str(c, "late rec", 0);
	CHECK_RC(flowshm_recv(c, buf, sizeof(buf), &len, 0), -EPIPE);
	flowshm_close(c);
	flowshm_close(p);
	close(fd);
}

/*
 * A lazy ring (pages allocated later: moverd's rings between hosts)
 * created on a filesystem with no room left: -ENOSPC.  Before, its
 * control page was formatted through a mapping, and the store's fault
 * killed the caller with SIGBUS (moverd, outside its ring guard).  In a
 * child with a mount namespace of its own and a 64 KiB tmpfs, filled.
 */
static void case_full_fs(void)
{
	struct flowshm_ring_params rp = { .ring_size = 1 << 16,
					  .max_record = 1024,
					  .flags = FLOWSHM_RING_LAZY };
	char dir[64], path[96];
	pid_t pid;
	int st;

	snprintf(dir, sizeof(dir), "/tmp/fm-lib19-%d", (int)getpid());
	CHECK(mkdir(dir, 0700) == 0);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		static const char page[4096];
		int fd, rc;

		if (unshare(CLONE_NEWNS) ||
		    mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"))
			_exit(2);
		snprintf(path, sizeof(path), "%s/fill", dir);
		fd = open(path, O_WRONLY | O_CREAT, 0600);
		while (fd >= 0 && write(fd, page, sizeof(page)) > 0)
			;
		snprintf(path, sizeof(path), "%s/r.ring", dir);
		rc = flowshm_ring_create(&rp, path, &fd);
		printf("  a lazy ring on a full tmpfs: %s\n",
		       flowshm_strerror(rc));
		fflush(stdout);
		_exit(rc == -ENOSPC ? 0 : 1);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	if (WIFSIGNALED(st))
		fprintf(stderr, "the create died of signal %d\n", WTERMSIG(st));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(rmdir(dir) == 0);
}

/* A set poll with a timeout that finds nothing leaves the descriptor
 * armed: a record sent then makes it readable (before: never again). */
static void timed_set_poll(void)
{
	int fd = tu_ring(4096, 1024, 0);
	flowshm_t *p = tu_open(fd, FLOWSHM_PRODUCER, 0);
	flowshm_t *c = tu_open(fd, FLOWSHM_CONSUMER, 0);
	struct epoll_event ev = { .events = EPOLLIN }, out;
	flowshm_t *ready[1];
	flowshm_set_t *s;
	unsigned n;
	int ep, sfd;

	CHECK_RC(flowshm_set_create(&s), 0);
	CHECK_RC(flowshm_set_add(s, c), 0);
	sfd = flowshm_set_fd(s);
	CHECK(sfd >= 0);
	ep = epoll_create1(EPOLL_CLOEXEC);
	CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev) == 0);
	CHECK_RC(flowshm_set_poll(s, ready, 1, &n, 1 * MS), -ETIMEDOUT);
	CHECK(epoll_wait(ep, &out, 1, 100) == 0);
	send_str(p, "wake");
	CHECK(epoll_wait(ep, &out, 1, 5000) == 1);
	CHECK_RC(flowshm_set_poll(s, ready, 1, &n, 0), 0);
	CHECK(n == 1 && ready[0] == c);
	flowshm_set_destroy(s);
	close(ep);
	flowshm_close(c);
	flowshm_close(p);
	close(fd);
}

static void case_edges(void)
{
	peek_then_recv();
	batch_last_producer();
	closed_reserved();
	closed_claimed();
	timed_set_poll();
	printf("  peek then recv refused; a batch's last producer; a "
	       "closed reservation; a closed ring's open claim; a timed "
	       "set poll: as the header says\n");
}

int main(int argc, char **argv)
{
	static const struct hcase cases[] = {
		{ 1, case_strerror, "strerror: flowmover's words for every code" },
		{ 2, case_batch_identity, "peek_batch in place; producer identity "
		  "of 3 producer processes" },
		{ 3, case_end_alone, "end of stream on a ring without moverd" },
		{ 4, case_poll, "flowshm_poll over 3 flows" },
		{ 5, case_fair, "fan-in fairness: a flooded and a sparse flow" },
		{ 6, case_set_epoll, "a set's descriptor under epoll" },
		{ 7, case_state_alone, "state and lag without moverd" },
		{ 8, case_poll_many, "poll over 130 flows (beyond futex_waitv: "
		  "the sleep loop)" },
		{ 10, case_end_moverd, "end of stream through moverd: two "
		  "producers" },
		{ 11, case_end_gone, "a producer killed without ending is gone" },
		{ 12, case_flow_end, "moverctl flow end, into a full ring" },
		{ 13, case_state_daemon, "state through moverd; -ETIMEDOUT, "
		  "then -EHOSTDOWN after kill -9" },
		{ 14, case_notconn, "-ENOTCONN while the peer is not there" },
		{ 15, case_end_remote, "end of stream from A to B over TCP" },
		{ 16, case_end_remote_restart, "... with B killed and "
		  "restarted mid-stream" },
		{ 17, case_restarted, "state: moverd down, then restarted" },
		{ 18, case_edges, "the contract at its edges: peek then recv, "
		  "a batch's last producer, a closed reservation, a closed "
		  "ring's open claim, a timed set poll" },
		{ 19, case_full_fs, "a lazy ring created on a full "
		  "filesystem: -ENOSPC, not SIGBUS" },
	};

	if (argc < 3) {
		fprintf(stderr, "usage: test_lib MOVERD MOVERCTL\n");
		return 2;
	}
	moverd_bin = argv[1];
	moverctl_bin = argv[2];
	return hc_run(cases, sizeof(cases) / sizeof(cases[0]), "FM_LIB_CASES");
}
