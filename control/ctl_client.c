/*
 * control/ctl_client.c - connect to moverd and make one request at a time.
 */
#include "ctl_client.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static _Thread_local char last_err[CTL_ERR_MAX + 128];
static _Atomic uint64_t next_id;

static void seterr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void seterr(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_err, sizeof(last_err), fmt, ap);
	va_end(ap);
}

const char *ctl_last_error(void)
{
	return last_err;
}

const char *ctl_socket_path(const char *flag_value)
{
	const char *env;

	if (flag_value && *flag_value)
		return flag_value;
	env = getenv(CTL_SOCKET_ENV);
	if (env && *env)
		return env;
	return CTL_DEFAULT_SOCKET;
}

static const struct timeval connect_tmo = {
	.tv_sec = CTL_DEFAULT_TIMEOUT_MS / 1000,
	.tv_usec = CTL_DEFAULT_TIMEOUT_MS % 1000 * 1000,
};

int ctl_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(path);
	int s, rc;

	if (n == 0 || n >= sizeof(sa.sun_path)) {
		seterr("socket path '%s' is %s", path,
		       n ? "too long for a UNIX socket" : "empty");
		return n ? -ENAMETOOLONG : -EINVAL;
	}
	memcpy(sa.sun_path, path, n + 1);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0) {
		rc = -errno;
		seterr("socket: %s", strerror(-rc));
		return rc;
	}
	/* a moverd that does not accept (stopped, its loop stalled) with a
	 * full backlog: a connect would block until it does, whatever the
	 * caller's timeout; give up after CTL_DEFAULT_TIMEOUT_MS (EAGAIN) */
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &connect_tmo, sizeof(connect_tmo));
	while (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		if (errno == EISCONN)
			break;
		rc = -errno;
		close(s);
		switch (rc) {
		case -ENOENT:
		case -ENOTDIR:
			seterr("moverd is not running (no socket at %s)", path);
			return -ECONNREFUSED;
		case -ECONNREFUSED:
			seterr("moverd is not running (nobody listening on "
			       "%s)", path);
			return -ECONNREFUSED;
		case -EACCES:
		case -EPERM:
			seterr("permission denied connecting to %s", path);
			return -EACCES;
		case -EAGAIN:
			seterr("moverd did not accept a connection on %s within "
			       "%d ms (stopped, or busy)", path,
			       CTL_DEFAULT_TIMEOUT_MS);
			return -ETIMEDOUT;
		default:
			seterr("cannot connect to %s: %s", path, strerror(-rc));
			return rc;
		}
	}
	/* sends block as before: the calls bound their own waits */
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &(struct timeval){ 0 },
		   sizeof(struct timeval));
	return s;
}

static void close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

int ctl_call(int sock, Flowmover__Request *req, Flowmover__Response **resp,
	     int *fd_out, int timeout_ms)
{
	int fds[2];
	int rc = ctl_call_fds(sock, req, resp, fds, 2, timeout_ms);

	/* a second fd (the doorbell page) nobody asked for is closed */
	close_fds(fds + 1, 1);
	if (fd_out)
		*fd_out = fds[0];
	else
		close_fds(fds, 1);
	return rc;
}

/*
 * One answer off sock into buf, decoded, and the fds that came with it;
 * 0, or a negative errno with the reason said.
 */
static int recv_answer(int sock, uint8_t *buf, Flowmover__Response **r,
		       int *fds, unsigned max, int timeout_ms)
{
	char err[CTL_ERR_MAX];
	size_t len = 0;
	int rc = ctl_recv_frame_fds(sock, buf, CTL_MAX_FRAME, &len, fds, max,
				    timeout_ms);

	if (rc == -ETIMEDOUT)
		seterr("no response from moverd within %d ms", timeout_ms);
	else if (rc == -ECONNRESET)
		seterr("moverd closed the connection");
	else if (rc)
		seterr("cannot receive response from moverd: %s",
		       strerror(-rc));
	if (rc)
		return rc;
	rc = ctl_response_decode(buf, len, r, err, sizeof(err));
	if (rc == -ENOMEM)
		seterr("%s", err); /* ours, not moverd's */
	else if (rc)
		seterr("bad response from moverd: %s", err);
	return rc;
}

/*
 * Answers to earlier requests on the same socket that gave up waiting
 * (timed out) still come, ahead of ours: a request's id is larger than
 * every earlier one's (next_id), so those are skipped, with their fds.
 * At most this many: a moverd that sends more is broken.
 */
#define CTL_STALE_MAX 64

int ctl_call_fds(int sock, Flowmover__Request *req,
		 Flowmover__Response **resp, int *fds, unsigned max,
		 int timeout_ms)
{
	Flowmover__Response *r = NULL;
	uint8_t *buf;
	int rc;

	*resp = NULL;
	for (unsigned i = 0; i < max; i++)
		fds[i] = -1;
	do
		req->id = atomic_fetch_add(&next_id, 1) + 1;
	while (req->id == 0);

	rc = ctl_send_msg(sock, &req->base, -1);
	if (rc) {
		seterr("cannot send %s request to moverd: %s",
		       ctl_request_kind(req), strerror(-rc));
		return rc;
	}
	buf = malloc(CTL_MAX_FRAME);
	if (!buf) {
		seterr("out of memory");
		return -ENOMEM;
	}
	for (unsigned stale = 0;; stale++) {
		rc = recv_answer(sock, buf, &r, fds, max, timeout_ms);
		if (rc || !r->id || r->id >= req->id || stale == CTL_STALE_MAX)
			break;
		ctl_response_free(r); /* an earlier request's */
		r = NULL;
		close_fds(fds, max);
	}
	free(buf);
	if (rc)
		goto fail;
	if (r->body_case == FLOWMOVER__RESPONSE__BODY_ERROR &&
	    (r->id == req->id || r->id == 0)) {
		rc = r->error->code;
		if (r->error->message[0])
			seterr("%s", r->error->message);
		else
			seterr("%s", strerror(-rc));
		goto fail;
	}
	if (r->id != req->id) {
		seterr("bad response from moverd: id %llu answers request "
		       "%llu", (unsigned long long)r->id,
		       (unsigned long long)req->id);
		rc = -EPROTO;
		goto fail;
	}
	*resp = r;
	return 0;
fail:
	ctl_response_free(r);
	close_fds(fds, max);
	return rc;
}
