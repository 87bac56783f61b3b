/*
 * moverd/listener.c - accept back-off and open-file headroom for the
 * listening sockets (see listener.h).
 */
#include "listener.h"

#include <errno.h>
#include <sys/resource.h>

#define WAIT_FIRST_MS 10u
#define WAIT_MAX_MS   1000u

bool listener_must_wait(int res)
{
	/* the peer gave up before we accepted it: nothing wrong here */
	return res != -ECONNABORTED && res != -EINTR && res != -EAGAIN;
}

void listener_wait(struct loop *l, struct listener_backoff *b,
		   loop_done_fn done)
{
	struct io_uring_sqe *sqe;

	if (b->op.busy)
		return;
	b->ms = b->ms ? b->ms * 2 : WAIT_FIRST_MS;
	if (b->ms > WAIT_MAX_MS)
		b->ms = WAIT_MAX_MS;
	b->ts = (struct __kernel_timespec){
		.tv_sec = b->ms / 1000,
		.tv_nsec = (long long)(b->ms % 1000) * 1000000,
	};
	sqe = loop_sqe(l, &b->op, done);
	if (!sqe)
		return; /* no SQE: the owner arms the accept on a later pass
			 * (listener_lost) */
	io_uring_prep_timeout(sqe, &b->ts, 0, 0);
	b->waits++;
}

void listener_ok(struct listener_backoff *b)
{
	b->ms = 0;
}

unsigned listener_fds_left(int fd)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY)
		return ~0u;
	if ((rlim_t)fd + 1 >= rl.rlim_cur)
		return 0;
	return rl.rlim_cur - (rlim_t)fd - 1 > ~0u ? ~0u :
						      (unsigned)(rl.rlim_cur - (rlim_t)fd - 1);
}
