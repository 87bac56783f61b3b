/*
 * control/ctl_client.h - the client end of the control socket, used by
 * moverctl and by libflowshm's flowshm_attach.
 *
 * One connection carries one request at a time: ctl_call sends a request
 * and waits for its response.  Functions return 0 (or an fd) on success
 * and a negative errno on failure; ctl_last_error() then says why in words.
 */
#ifndef FLOWMOVER_CTL_CLIENT_H
#define FLOWMOVER_CTL_CLIENT_H

#include "ctl_frame.h"

#define CTL_DEFAULT_SOCKET     "/run/flowmover/moverd.sock"
#define CTL_SOCKET_ENV         "FLOWMOVER_SOCKET"
#define CTL_DEFAULT_TIMEOUT_MS 5000

/*
 * The socket path to use: flag_value if given (not NULL, not empty), else
 * $FLOWMOVER_SOCKET if set and not empty, else CTL_DEFAULT_SOCKET.
 */
const char *ctl_socket_path(const char *flag_value);

/*
 * Connect to moverd's socket (blocking, close-on-exec).  Returns the fd, or
 * -ECONNREFUSED when no daemon is there (no socket file, or nobody
 * listening), -ENAMETOOLONG for a path that does not fit sockaddr_un,
 * -EACCES when the socket may not be opened, -ETIMEDOUT when moverd did not
 * accept within CTL_DEFAULT_TIMEOUT_MS (its backlog full: stopped, or its
 * loop stalled), other negative errnos.
 */
int ctl_connect(const char *path);

/*
 * One round trip on sock: sets req->id (a fresh per-process number), sends
 * req, waits up to timeout_ms (< 0 = forever) for the response and checks
 * its id.  On 0, *resp is the response (free with ctl_response_free); its
 * body is never an Error.  If fd_out is not NULL it receives a passed fd
 * (close-on-exec) or -1; an fd nobody asked for is closed.
 * On failure *resp is NULL, *fd_out is -1 and the return is:
 *   - the daemon's code (negative errno) for an Error response; its message
 *     is in ctl_last_error()
 *   - -ETIMEDOUT, -ECONNRESET, -EPIPE ... for transport failures
 *   - -EPROTO for a response that does not decode or has another id
 * An Error response with id 0 is accepted as the answer to any request
 * (moverd could not read the request's id).
 */
int ctl_call(int sock, Flowmover__Request *req, Flowmover__Response **resp,
	     int *fd_out, int timeout_ms);

/* The same with up to max passed fds into fds[0..max) (-1 where none
 * came): the attach answer's ring and doorbell page. */
int ctl_call_fds(int sock, Flowmover__Request *req,
		 Flowmover__Response **resp, int *fds, unsigned max,
		 int timeout_ms);

/* Why the last failing ctl_* call of this thread failed (never NULL). */
const char *ctl_last_error(void);

#endif
