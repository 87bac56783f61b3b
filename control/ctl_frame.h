/*
 * control/ctl_frame.h - framing and decoding of the flowmover control
 * protocol (flowmover.proto) on a UNIX stream socket.
 *
 * A frame is a 4-byte little-endian body length followed by the body: one
 * packed flowmover.Request (client -> moverd) or flowmover.Response
 * (moverd -> client).  A length of 0 is a protocol error; a length above
 * CTL_MAX_FRAME is refused.  The ring fd of an Attach response travels as
 * SCM_RIGHTS ancillary data with the first bytes of its frame.
 *
 * Two halves:
 *   - pure helpers (no system calls, no global state): length check, pack,
 *     request/response decode with validation.  moverd, which does its own
 *     socket IO, uses only these.
 *   - blocking socket IO for clients: send/receive one frame with an
 *     optional fd.  EINTR-safe; sends never raise SIGPIPE.
 *
 * Every function returns 0 (or a length, where said) on success and a
 * negative errno on failure.
 */
#ifndef FLOWMOVER_CTL_FRAME_H
#define FLOWMOVER_CTL_FRAME_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flowmover.pb-c.h"

#define CTL_HDR_BYTES 4u
#define CTL_MAX_FRAME 65536u                    /* largest body, bytes */
#define CTL_FRAME_BUF (CTL_HDR_BYTES + CTL_MAX_FRAME) /* header + body */
#define CTL_NAME_MAX  64u                       /* flow name length */
#define CTL_ERR_MAX   256u                      /* room for an error text */

/* ---- pure helpers ------------------------------------------------------ */

/*
 * Read and check a frame header.  *len = the length it carries (also on
 * error, for the message).  -EPROTO: length 0.  -EMSGSIZE: length >
 * CTL_MAX_FRAME.  In both cases the stream cannot be resynchronised: close
 * the connection.
 */
int ctl_frame_len(const uint8_t hdr[CTL_HDR_BYTES], uint32_t *len);

/* Write the header for a body of len bytes (len must be 1..CTL_MAX_FRAME). */
void ctl_frame_hdr(uint8_t hdr[CTL_HDR_BYTES], uint32_t len);

/*
 * Pack msg as a whole frame (header + body) into buf.  *len = frame bytes.
 * -EMSGSIZE: the body would exceed CTL_MAX_FRAME or cap.  A message that
 * packs to zero bytes (every field default) cannot be framed: -EINVAL.
 * A buffer of CTL_FRAME_BUF bytes always suffices.
 */
int ctl_frame_pack(const ProtobufCMessage *msg, uint8_t *buf, size_t cap,
		   size_t *len);

/*
 * protobuf-c's unpack of len bytes of buf as a d: NULL both for bytes that
 * are not one and when an allocation failed, which *oom tells apart (a
 * request is then not "malformed": the same bytes may decode later).  Its
 * allocations are malloc's: free the message with its free_unpacked and
 * a NULL allocator.
 */
ProtobufCMessage *ctl_unpack(const ProtobufCMessageDescriptor *d, size_t len,
			     const uint8_t *buf, bool *oom);

/* 1 if name matches [A-Za-z0-9._-]{1,64}, else 0.  NULL gives 0. */
int ctl_name_valid(const char *name);

/*
 * Decode a request body (the bytes after the header) and check it:
 *   -EPROTO  not a valid Request, or no (known) body: message says which
 *   -ENOMEM  no memory to decode it (the bytes may be a valid Request)
 *   -EINVAL  body present but wrong: bad or missing flow name, create
 *            without spec, attach with a role other than producer/consumer
 * On 0, *out is the request (free with flowmover__request__free_unpacked
 * or ctl_request_free); on error *out is NULL and err (if not NULL) holds a
 * sentence for the Error response.  Unknown fields next to a known body are
 * ignored (forward compatibility).
 */
int ctl_request_decode(const uint8_t *buf, size_t len,
		       Flowmover__Request **out, char *err, size_t errlen);
void ctl_request_free(Flowmover__Request *req);

/*
 * Decode a response body.  -EPROTO: not a valid Response, no known body,
 * or a body that lacks what it must carry (Error with a code >= 0).
 * -ENOMEM: no memory to decode it.
 */
int ctl_response_decode(const uint8_t *buf, size_t len,
			Flowmover__Response **out, char *err, size_t errlen);
void ctl_response_free(Flowmover__Response *resp);

/*
 * Pack an Error response {id, code, message} as a frame into buf (cap >=
 * CTL_FRAME_BUF is always enough; the message is cut to fit CTL_ERR_MAX).
 * code must be a negative errno.  For moverd.
 */
int ctl_error_frame(uint64_t id, int code, const char *message, uint8_t *buf,
		    size_t cap, size_t *len);

/* The name of a request body ("create", "attach", ...), for logs. */
const char *ctl_request_kind(const Flowmover__Request *req);

/* ---- blocking socket IO (clients and tests) ---------------------------- */

/*
 * Send the len bytes of a whole frame on sock; fd >= 0 is passed along as
 * SCM_RIGHTS with the first bytes (the caller keeps its copy).  Retries on
 * EINTR and short writes.  -EPIPE/-ECONNRESET: peer gone.
 */
int ctl_send_frame(int sock, const uint8_t *frame, size_t len, int fd);

/* ctl_frame_pack + ctl_send_frame. */
int ctl_send_msg(int sock, const ProtobufCMessage *msg, int fd);

/*
 * Receive one frame's body into buf (cap bytes, at most CTL_MAX_FRAME are
 * ever needed); *len = body bytes.  timeout_ms bounds the whole frame
 * (< 0 = wait forever).  If fd_out is not NULL it receives a passed fd
 * (close-on-exec) or -1; a passed fd nobody asked for is closed.
 *   -ETIMEDOUT    nothing (or not all) arrived in time
 *   -ECONNRESET   peer closed the connection (before or inside a frame)
 *   -EPROTO       zero length, or more than one fd, or truncated ancillary
 *   -EMSGSIZE     length > CTL_MAX_FRAME or > cap
 * After any error the stream is out of step: close the socket.
 */
int ctl_recv_frame(int sock, uint8_t *buf, size_t cap, size_t *len,
		   int *fd_out, int timeout_ms);

/* The same taking up to max passed fds into fds[0..max) (-1 where none
 * came; more than max is -EPROTO): an attach answer carries the ring and,
 * for a producer of a flow to another host, moverd's doorbell page. */
int ctl_recv_frame_fds(int sock, uint8_t *buf, size_t cap, size_t *len,
		       int *fds, unsigned max, int timeout_ms);

#endif
