/*
 * control/ctl_frame.c - framing, decoding and validation of control
 * messages, and blocking frame IO on a UNIX stream socket.
 */
#include "ctl_frame.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The first oneof field number of Request's body (CreateFlow = 10). */
#define REQ_BODY_FIRST_FIELD 10u

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/*
 * Copy an untrusted name for an error message: printable ASCII as is,
 * anything else as \xHH, cut after CTL_NAME_MAX source bytes with "...".
 */
static const char *quote(char *dst, size_t cap, const char *s)
{
	size_t o = 0, i;

	for (i = 0; s[i] && i < CTL_NAME_MAX && o + 5 < cap; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
			dst[o++] = (char)c;
		else
			o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
	}
	if (s[i] && o + 4 < cap) {
		memcpy(dst + o, "...", 3);
		o += 3;
	}
	dst[o] = '\0';
	return dst;
}

/* ---- pure helpers ------------------------------------------------------ */

/* malloc and free for protobuf-c, noting an allocation that failed */
static void *note_alloc(void *oom, size_t size)
{
	void *p = malloc(size);

	if (!p)
		*(bool *)oom = true;
	return p;
}

static void plain_free(void *unused, void *p)
{
	(void)unused;
	free(p);
}

ProtobufCMessage *ctl_unpack(const ProtobufCMessageDescriptor *d, size_t len,
			     const uint8_t *buf, bool *oom)
{
	ProtobufCAllocator a = { note_alloc, plain_free, oom };

	*oom = false;
	return protobuf_c_message_unpack(d, &a, len, buf);
}

/*
 * 1 if m or a message inside it carries an unknown field numbered 0.
 * protobuf-c accepts such a field when its tag is encoded in more than one
 * byte ("80 00"), yet refuses what it packs from it: we refuse it up front
 * so that whatever decodes also re-encodes (found by fuzz_ctl_frame).
 */
static int has_field_zero(const ProtobufCMessage *m, int depth)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;
	unsigned i;

	if (depth > 8)
		return 0;  /* deeper than flowmover.proto nests */
	for (i = 0; i < m->n_unknown_fields; i++)
		if (m->unknown_fields[i].tag == 0)
			return 1;
	for (i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const ProtobufCMessage *const *v;
		size_t n = 1, k;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			n = *(const size_t *)(base + f->quantifier_offset);
			v = *(const ProtobufCMessage *const *const *)
				(base + f->offset);
		} else {
			if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
			    *(const uint32_t *)(base + f->quantifier_offset) !=
			    f->id)
				continue;
			v = (const ProtobufCMessage *const *)(base + f->offset);
		}
		for (k = 0; k < n; k++)
			if (v[k] && has_field_zero(v[k], depth + 1))
				return 1;
	}
	return 0;
}

int ctl_frame_len(const uint8_t hdr[CTL_HDR_BYTES], uint32_t *len)
{
	uint32_t n = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 |
		     (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;

	*len = n;
	if (n == 0)
		return -EPROTO;
	if (n > CTL_MAX_FRAME)
		return -EMSGSIZE;
	return 0;
}

void ctl_frame_hdr(uint8_t hdr[CTL_HDR_BYTES], uint32_t len)
{
	hdr[0] = (uint8_t)len;
	hdr[1] = (uint8_t)(len >> 8);
	hdr[2] = (uint8_t)(len >> 16);
	hdr[3] = (uint8_t)(len >> 24);
}

int ctl_frame_pack(const ProtobufCMessage *msg, uint8_t *buf, size_t cap,
		   size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(msg);

	if (n == 0)
		return -EINVAL;
	if (n > CTL_MAX_FRAME || cap < CTL_HDR_BYTES ||
	    n > cap - CTL_HDR_BYTES)
		return -EMSGSIZE;
	if (protobuf_c_message_pack(msg, buf + CTL_HDR_BYTES) != n)
		return -EPROTO;
	ctl_frame_hdr(buf, (uint32_t)n);
	*len = CTL_HDR_BYTES + n;
	return 0;
}

int ctl_name_valid(const char *name)
{
	size_t i;

	if (!name)
		return 0;
	for (i = 0; name[i]; i++) {
		char c = name[i];

		if (i >= CTL_NAME_MAX)
			return 0;
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		      c == '-'))
			return 0;
	}
	return i > 0;
}

static int check_name(const char *what, const char *name, char *err,
		      size_t errlen)
{
	char q[CTL_NAME_MAX * 4 + 8];

	if (!name || !*name) {
		seterr(err, errlen, "%s: missing flow name", what);
		return -EINVAL;
	}
	if (!ctl_name_valid(name)) {
		seterr(err, errlen,
		       "%s: invalid flow name '%s': use 1 to 64 of "
		       "A-Z a-z 0-9 . _ -", what, quote(q, sizeof(q), name));
		return -EINVAL;
	}
	return 0;
}

static int check_request(const Flowmover__Request *r, char *err,
			 size_t errlen)
{
	const ProtobufCMessage *b = &r->base;
	unsigned i;

	switch (r->body_case) {
	case FLOWMOVER__REQUEST__BODY_CREATE:
		if (!r->create->spec) {
			seterr(err, errlen, "create: missing flow spec");
			return -EINVAL;
		}
		return check_name("create", r->create->spec->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_DESTROY:
		return check_name("destroy", r->destroy->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_DESCRIBE:
		return check_name("describe", r->describe->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_ATTACH:
		if (r->attach->role != FLOWMOVER__ROLE__PRODUCER &&
		    r->attach->role != FLOWMOVER__ROLE__CONSUMER) {
			seterr(err, errlen,
			       "attach: role must be producer or consumer "
			       "(got %d)", (int)r->attach->role);
			return -EINVAL;
		}
		return check_name("attach", r->attach->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_ALLOW:
		return check_name("allow", r->allow->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_END_STREAM:
		return check_name("end stream", r->end_stream->name, err,
				  errlen);
	case FLOWMOVER__REQUEST__BODY_END_FLOW:
		return check_name("end", r->end_flow->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_FANOUT_PEER:
		if (!r->fanout_peer->peer || !*r->fanout_peer->peer) {
			seterr(err, errlen, "peer: missing HOST:PORT");
			return -EINVAL;
		}
		return check_name("peer", r->fanout_peer->name, err, errlen);
	case FLOWMOVER__REQUEST__BODY_LIST:
	case FLOWMOVER__REQUEST__BODY_STATUS:
	case FLOWMOVER__REQUEST__BODY_RELOAD:
		return 0;
	default:
		break;
	}
	/* No known body.  A newer client's request type shows up as an
	 * unknown field in the body range. */
	for (i = 0; i < b->n_unknown_fields; i++) {
		if (b->unknown_fields[i].tag >= REQ_BODY_FIRST_FIELD) {
			seterr(err, errlen,
			       "unknown request type (field %u): moverd may be "
			       "older than this client",
			       (unsigned)b->unknown_fields[i].tag);
			return -EPROTO;
		}
	}
	seterr(err, errlen, "request has no body (no request type set)");
	return -EPROTO;
}

/*
 * The checks both decodes share: a body of 1..CTL_MAX_FRAME bytes that
 * unpacks as d (what: "request" or "response", for the messages) with no
 * field number 0 anywhere.  0 and *out, or -errno and err.
 */
static int unpack_checked(const ProtobufCMessageDescriptor *d,
			  const char *what, const uint8_t *buf, size_t len,
			  ProtobufCMessage **out, char *err, size_t errlen)
{
	ProtobufCMessage *m;
	bool oom;

	*out = NULL;
	if (len == 0) {
		seterr(err, errlen, "empty %s", what);
		return -EPROTO;
	}
	if (len > CTL_MAX_FRAME) {
		seterr(err, errlen, "%s of %zu bytes exceeds %u", what, len,
		       CTL_MAX_FRAME);
		return -EMSGSIZE;
	}
	m = ctl_unpack(d, len, buf, &oom);
	if (!m && oom) {
		seterr(err, errlen, "out of memory decoding a %s of %zu bytes",
		       what, len);
		return -ENOMEM;
	}
	if (m && has_field_zero(m, 0)) {
		protobuf_c_message_free_unpacked(m, NULL);
		m = NULL;
	}
	if (!m) {
		seterr(err, errlen, "malformed %s: %zu bytes that are not a "
		       "valid %s", what, len, d->name);
		return -EPROTO;
	}
	*out = m;
	return 0;
}

int ctl_request_decode(const uint8_t *buf, size_t len,
		       Flowmover__Request **out, char *err, size_t errlen)
{
	ProtobufCMessage *m;
	Flowmover__Request *r;
	int rc;

	*out = NULL;
	rc = unpack_checked(&flowmover__request__descriptor, "request", buf,
			    len, &m, err, errlen);
	if (rc)
		return rc;
	r = (Flowmover__Request *)m;
	rc = check_request(r, err, errlen);
	if (rc) {
		flowmover__request__free_unpacked(r, NULL);
		return rc;
	}
	*out = r;
	return 0;
}

void ctl_request_free(Flowmover__Request *req)
{
	if (req)
		flowmover__request__free_unpacked(req, NULL);
}

int ctl_response_decode(const uint8_t *buf, size_t len,
			Flowmover__Response **out, char *err, size_t errlen)
{
	ProtobufCMessage *m;
	Flowmover__Response *r;
	int rc;

	*out = NULL;
	rc = unpack_checked(&flowmover__response__descriptor, "response", buf,
			    len, &m, err, errlen);
	if (rc)
		return rc;
	r = (Flowmover__Response *)m;
	switch (r->body_case) {
	case FLOWMOVER__RESPONSE__BODY_ERROR:
		if (r->error->code >= 0 || r->error->code < -4095) {
			seterr(err, errlen,
			       "error response with invalid code %d",
			       (int)r->error->code);
			goto bad;
		}
		break;
	case FLOWMOVER__RESPONSE__BODY_OK:
	case FLOWMOVER__RESPONSE__BODY_FLOW:
	case FLOWMOVER__RESPONSE__BODY_LIST:
	case FLOWMOVER__RESPONSE__BODY_STATUS:
	case FLOWMOVER__RESPONSE__BODY_RELOAD:
		break;
	default:
		seterr(err, errlen,
		       "response has no known body: moverd may be newer than "
		       "this client");
		goto bad;
	}
	*out = r;
	return 0;
bad:
	flowmover__response__free_unpacked(r, NULL);
	return -EPROTO;
}

void ctl_response_free(Flowmover__Response *resp)
{
	if (resp)
		flowmover__response__free_unpacked(resp, NULL);
}

int ctl_error_frame(uint64_t id, int code, const char *message, uint8_t *buf,
		    size_t cap, size_t *len)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__Error e = FLOWMOVER__ERROR__INIT;
	char msg[CTL_ERR_MAX];

	if (code >= 0)
		return -EINVAL;
	snprintf(msg, sizeof(msg), "%s", message ? message : "");
	e.code = code;
	e.message = msg;
	resp.id = id;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_ERROR;
	resp.error = &e;
	return ctl_frame_pack(&resp.base, buf, cap, len);
}

const char *ctl_request_kind(const Flowmover__Request *req)
{
	switch (req->body_case) {
	case FLOWMOVER__REQUEST__BODY_CREATE:   return "create";
	case FLOWMOVER__REQUEST__BODY_DESTROY:  return "destroy";
	case FLOWMOVER__REQUEST__BODY_LIST:     return "list";
	case FLOWMOVER__REQUEST__BODY_DESCRIBE: return "describe";
	case FLOWMOVER__REQUEST__BODY_ATTACH:   return "attach";
	case FLOWMOVER__REQUEST__BODY_STATUS:   return "status";
	case FLOWMOVER__REQUEST__BODY_ALLOW:    return "allow";
	case FLOWMOVER__REQUEST__BODY_RELOAD:   return "reload";
	case FLOWMOVER__REQUEST__BODY_END_STREAM: return "end stream";
	case FLOWMOVER__REQUEST__BODY_END_FLOW: return "end";
	case FLOWMOVER__REQUEST__BODY_FANOUT_PEER: return "peer";
	default:                                return "none";
	}
}

/* ---- blocking socket IO ------------------------------------------------ */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for events on sock until deadline (< 0: forever). */
static int wait_sock(int sock, short events, int64_t deadline)
{
	struct pollfd p = { .fd = sock, .events = events };

	for (;;) {
		int t = -1, r;

		if (deadline >= 0) {
			int64_t left = deadline - now_ms();

			t = left > 0 ? (left > 1 << 30 ? 1 << 30 : (int)left)
				     : 0;
		}
		r = poll(&p, 1, t);
		if (r > 0)
			return 0;
		if (r == 0) {
			if (deadline >= 0 && now_ms() >= deadline)
				return -ETIMEDOUT;
			continue;
		}
		if (errno != EINTR)
			return -errno;
	}
}

int ctl_send_frame(int sock, const uint8_t *frame, size_t len, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	size_t off = 0;
	int with_fd = fd >= 0;

	while (off < len) {
		struct iovec iov = { (void *)(frame + off), len - off };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (with_fd) {
			struct cmsghdr *c;

			memset(&u, 0, sizeof(u));
			m.msg_control = u.buf;
			m.msg_controllen = sizeof(u.buf);
			c = CMSG_FIRSTHDR(&m);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &fd, sizeof(int));
		}
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				int rc = wait_sock(sock, POLLOUT, -1);

				if (rc)
					return rc;
				continue;
			}
			return -errno;
		}
		with_fd = 0;
		off += (size_t)n;
	}
	return 0;
}

int ctl_send_msg(int sock, const ProtobufCMessage *msg, int fd)
{
	size_t cap = CTL_HDR_BYTES + protobuf_c_message_get_packed_size(msg);
	size_t len;
	uint8_t *buf;
	int rc;

	if (cap > CTL_FRAME_BUF)
		return -EMSGSIZE;
	buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	rc = ctl_frame_pack(msg, buf, cap, &len);
	if (!rc)
		rc = ctl_send_frame(sock, buf, len, fd);
	free(buf);
	return rc;
}

/*
 * Read exactly n bytes, collecting passed fds: the first max go to
 * fds[0..max) (each -1 until filled), any further one (or truncated
 * ancillary data) sets *bad and is closed.
 */
static int read_full(int sock, uint8_t *p, size_t n, int *fds, unsigned max,
		     int *bad, int64_t deadline)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;

	while (n > 0) {
		struct iovec iov = { p, n };
		struct msghdr m = {
			.msg_iov = &iov, .msg_iovlen = 1,
			.msg_control = u.buf, .msg_controllen = sizeof(u.buf),
		};
		struct cmsghdr *c;
		ssize_t r;
		int rc = wait_sock(sock, POLLIN, deadline);

		if (rc)
			return rc;
		r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN ||
			    errno == EWOULDBLOCK)
				continue;
			return -errno;
		}
		for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			size_t k, nfd;

			if (c->cmsg_level != SOL_SOCKET ||
			    c->cmsg_type != SCM_RIGHTS)
				continue;
			nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (k = 0; k < nfd; k++) {
				int f;

				unsigned j = 0;

				memcpy(&f, CMSG_DATA(c) + k * sizeof(int),
				       sizeof(int));
				while (j < max && fds[j] >= 0)
					j++;
				if (j < max) {
					fds[j] = f;
				} else {
					close(f);
					*bad = 1;
				}
			}
		}
		if (m.msg_flags & MSG_CTRUNC)
			*bad = 1;
		if (r == 0)
			return -ECONNRESET;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

int ctl_recv_frame_fds(int sock, uint8_t *buf, size_t cap, size_t *len,
		       int *fds, unsigned max, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	uint8_t hdr[CTL_HDR_BYTES];
	uint32_t n = 0;
	int bad = 0, rc;

	for (unsigned i = 0; i < max; i++)
		fds[i] = -1;
	rc = read_full(sock, hdr, sizeof(hdr), fds, max, &bad, deadline);
	if (!rc)
		rc = ctl_frame_len(hdr, &n);
	if (!rc && n > cap)
		rc = -EMSGSIZE;
	if (!rc)
		rc = read_full(sock, buf, n, fds, max, &bad, deadline);
	if (!rc && bad)
		rc = -EPROTO;
	if (rc) {
		for (unsigned i = 0; i < max; i++) {
			if (fds[i] >= 0)
				close(fds[i]);
			fds[i] = -1;
		}
		return rc;
	}
	*len = n;
	return 0;
}

int ctl_recv_frame(int sock, uint8_t *buf, size_t cap, size_t *len,
		   int *fd_out, int timeout_ms)
{
	int fd;
	int rc = ctl_recv_frame_fds(sock, buf, cap, len, &fd, 1, timeout_ms);

	if (fd_out)
		*fd_out = fd;
	else if (fd >= 0)
		close(fd);
	return rc;
}
