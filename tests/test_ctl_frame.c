/*
 * tests/test_ctl_frame.c - the control protocol's framing, decoding,
 * validation, fd passing and client round trip (control/, library fmctl).
 * Exits non-zero on the first failed check.
 */
#include "testutil.h"
#include "ctl_client.h"
#include "ctl_frame.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>


/* err must contain want. */
#define CHECK_MSG(err, want)                                               \
	do {                                                               \
		if (!strstr((err), (want))) {                              \
			fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", \
				__FILE__, __LINE__, (err), (want));        \
			exit(1);                                           \
		}                                                          \
	} while (0)

static uint8_t frame[CTL_FRAME_BUF];
static char err[CTL_ERR_MAX];

/* Pack req as a frame, check the header, decode the body. */
static int roundtrip(Flowmover__Request *req, Flowmover__Request **out)
{
	size_t len;
	uint32_t body;

	CHECK_RC(ctl_frame_pack(&req->base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_frame_len(frame, &body), 0);
	CHECK(body + CTL_HDR_BYTES == len);
	err[0] = '\0';
	return ctl_request_decode(frame + CTL_HDR_BYTES, body, out, err,
				  sizeof(err));
}

/* Decode raw body bytes as a request; *out must be NULL on failure. */
static int decode_raw(const void *buf, size_t len)
{
	Flowmover__Request *r = (Flowmover__Request *)1;
	int rc;

	err[0] = '\0';
	rc = ctl_request_decode(buf, len, &r, err, sizeof(err));
	if (rc)
		CHECK(r == NULL);
	ctl_request_free(r);
	return rc;
}

static void test_header(void)
{
	uint8_t h[4];
	uint32_t n = 1234;

	ctl_frame_hdr(h, 0x01020304);
	CHECK(h[0] == 4 && h[1] == 3 && h[2] == 2 && h[3] == 1);
	ctl_frame_hdr(h, 0);
	CHECK_RC(ctl_frame_len(h, &n), -EPROTO);
	ctl_frame_hdr(h, 1);
	CHECK_RC(ctl_frame_len(h, &n), 0);
	CHECK(n == 1);
	ctl_frame_hdr(h, CTL_MAX_FRAME);
	CHECK_RC(ctl_frame_len(h, &n), 0);
	CHECK(n == CTL_MAX_FRAME);
	ctl_frame_hdr(h, CTL_MAX_FRAME + 1);
	CHECK_RC(ctl_frame_len(h, &n), -EMSGSIZE);
	CHECK(n == CTL_MAX_FRAME + 1);
	memset(h, 0xff, 4);
	CHECK_RC(ctl_frame_len(h, &n), -EMSGSIZE);
}

static void test_request_roundtrip(void)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT, *r;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec sp = FLOWMOVER__FLOW_SPEC__INIT;
	Flowmover__DestroyFlow de = FLOWMOVER__DESTROY_FLOW__INIT;
	Flowmover__ListFlows li = FLOWMOVER__LIST_FLOWS__INIT;
	Flowmover__DescribeFlow ds = FLOWMOVER__DESCRIBE_FLOW__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	Flowmover__GetStatus st = FLOWMOVER__GET_STATUS__INIT;
	uint32_t uids[] = { 1000, 1001 }, gids[] = { 27 };

	sp.name = "orders.v2_eu-1";
	sp.ring_size = 1ull << 24;
	sp.max_record = 65536;
	sp.peer = "10.0.0.2:7400";
	sp.allow_uids = uids;
	sp.n_allow_uids = 2;
	sp.allow_gids = gids;
	sp.n_allow_gids = 1;
	cr.spec = &sp;
	req.id = 42;
	req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	req.create = &cr;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->id == 42 && r->body_case == FLOWMOVER__REQUEST__BODY_CREATE);
	CHECK(!strcmp(r->create->spec->name, "orders.v2_eu-1"));
	CHECK(r->create->spec->ring_size == 1ull << 24);
	CHECK(r->create->spec->max_record == 65536);
	CHECK(!strcmp(r->create->spec->peer, "10.0.0.2:7400"));
	CHECK(r->create->spec->n_allow_uids == 2 &&
	      r->create->spec->allow_uids[1] == 1001);
	CHECK(r->create->spec->n_allow_gids == 1 &&
	      r->create->spec->allow_gids[0] == 27);
	CHECK(!strcmp(ctl_request_kind(r), "create"));
	ctl_request_free(r);

	de.name = "a";
	req.id = 1;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESTROY;
	req.destroy = &de;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->body_case == FLOWMOVER__REQUEST__BODY_DESTROY &&
	      !strcmp(r->destroy->name, "a"));
	ctl_request_free(r);

	req.id = UINT64_MAX;
	req.body_case = FLOWMOVER__REQUEST__BODY_LIST;
	req.list = &li;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->id == UINT64_MAX &&
	      r->body_case == FLOWMOVER__REQUEST__BODY_LIST);
	ctl_request_free(r);

	/* id 0 and an empty body still make a non-empty frame */
	req.id = 0;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->id == 0 && r->body_case == FLOWMOVER__REQUEST__BODY_LIST);
	ctl_request_free(r);

	ds.name = "x-1";
	req.id = 7;
	req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
	req.describe = &ds;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->body_case == FLOWMOVER__REQUEST__BODY_DESCRIBE &&
	      !strcmp(r->describe->name, "x-1"));
	ctl_request_free(r);

	at.name = "x-1";
	at.role = FLOWMOVER__ROLE__CONSUMER;
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->body_case == FLOWMOVER__REQUEST__BODY_ATTACH &&
	      r->attach->role == FLOWMOVER__ROLE__CONSUMER &&
	      !strcmp(r->attach->name, "x-1"));
	ctl_request_free(r);
	at.role = FLOWMOVER__ROLE__PRODUCER;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->attach->role == FLOWMOVER__ROLE__PRODUCER);
	ctl_request_free(r);

	req.body_case = FLOWMOVER__REQUEST__BODY_STATUS;
	req.status = &st;
	CHECK_RC(roundtrip(&req, &r), 0);
	CHECK(r->body_case == FLOWMOVER__REQUEST__BODY_STATUS);
	CHECK(!strcmp(ctl_request_kind(r), "status"));
	ctl_request_free(r);
}

static void test_request_errors(void)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT, *r;
	Flowmover__CreateFlow cr = FLOWMOVER__CREATE_FLOW__INIT;
	Flowmover__FlowSpec sp = FLOWMOVER__FLOW_SPEC__INIT;
	Flowmover__DestroyFlow de = FLOWMOVER__DESTROY_FLOW__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	static const char *bad_names[] = {
		"", "a b", "a/b", "../x", "naïve", "x\n", "x'y", "*",
		/* 65 characters */
		"12345678901234567890123456789012345678901234567890123456789012345",
	};
	char name64[65];
	size_t len;
	uint32_t body;

	/* empty body */
	CHECK_RC(decode_raw("", 0), -EPROTO);
	CHECK_MSG(err, "empty request");

	/* no body: only an id */
	req.id = 9;
	CHECK_RC(roundtrip(&req, &r), -EPROTO);
	CHECK(r == NULL);
	CHECK_MSG(err, "no body");

	/* garbage */
	CHECK_RC(decode_raw("\xff\xff\xff\xff\xff", 5), -EPROTO);
	CHECK_MSG(err, "malformed request");
	CHECK_RC(decode_raw("hello, world", 12), -EPROTO);
	CHECK_MSG(err, "malformed request");

	/* wrong wire type: create (field 10) as a varint; id as bytes */
	CHECK_RC(decode_raw("\x50\x01", 2), -EPROTO);
	CHECK_MSG(err, "malformed request");
	CHECK_RC(decode_raw("\x0a\x00\x62\x00", 4), -EPROTO);
	CHECK_MSG(err, "malformed request");

	/* unknown fields: ignored next to a known body ... */
	CHECK_RC(decode_raw("\x08\x05\x62\x00\xa0\x06\x07", 7), 0); /* f100 */
	/* ... but a body we do not know is reported as such */
	CHECK_RC(decode_raw("\x08\x05\x82\x01\x00", 5), -EPROTO);   /* f16 */
	CHECK_MSG(err, "unknown request type (field 16)");
	CHECK_RC(decode_raw("\x08\x05\x10\x01", 4), -EPROTO);       /* f2 */
	CHECK_MSG(err, "no body");

	/* field number 0 (tag "80 00": protobuf-c would accept it but not
	 * re-read what it packs from it), at the top and nested */
	CHECK_RC(decode_raw("\x08\x05\x62\x00\x80\x00\x06", 7), -EPROTO);
	CHECK_MSG(err, "malformed request");
	CHECK_RC(decode_raw("\x52\x08\x0a\x06\x0a\x01x\x80\x00\x06", 10),
		 -EPROTO);
	CHECK_RC(decode_raw("\x52\x05\x0a\x03\x0a\x01x", 7), 0);

	/* truncated: every proper prefix of a valid request fails */
	sp.name = "truncated";
	sp.ring_size = 65536;
	sp.peer = "h:1";
	cr.spec = &sp;
	req.id = 300;
	req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
	req.create = &cr;
	CHECK_RC(ctl_frame_pack(&req.base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_frame_len(frame, &body), 0);
	for (uint32_t n = 1; n < body; n++) {
		uint8_t copy[256];

		CHECK(body <= sizeof(copy));
		memcpy(copy, frame + CTL_HDR_BYTES, n);
		CHECK_RC(decode_raw(copy, n), -EPROTO);
	}

	/* create without spec */
	cr.spec = NULL;
	CHECK_RC(roundtrip(&req, &r), -EINVAL);
	CHECK(r == NULL);
	CHECK_MSG(err, "missing flow spec");
	cr.spec = &sp;

	/* flow names */
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(*bad_names); i++) {
		sp.name = (char *)bad_names[i];
		CHECK(!ctl_name_valid(bad_names[i]));
		CHECK_RC(roundtrip(&req, &r), -EINVAL);
		CHECK_MSG(err, i == 0 ? "create: missing flow name"
				      : "create: invalid flow name");
	}
	sp.name = "a\x01'b";
	CHECK_RC(roundtrip(&req, &r), -EINVAL);
	CHECK_MSG(err, "'a\\x01\\x27b'");
	memset(name64, 'n', 64);
	name64[64] = '\0';
	sp.name = name64;
	CHECK(ctl_name_valid(name64));
	CHECK_RC(roundtrip(&req, &r), 0);
	ctl_request_free(r);
	CHECK(!ctl_name_valid(NULL));

	de.name = "no space";
	req.body_case = FLOWMOVER__REQUEST__BODY_DESTROY;
	req.destroy = &de;
	CHECK_RC(roundtrip(&req, &r), -EINVAL);
	CHECK_MSG(err, "destroy: invalid flow name 'no space'");

	/* attach: role */
	at.name = "ok";
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	at.role = FLOWMOVER__ROLE__ROLE_UNSPECIFIED;
	CHECK_RC(roundtrip(&req, &r), -EINVAL);
	CHECK_MSG(err, "role must be producer or consumer");
	at.role = (Flowmover__Role)7;
	CHECK_RC(roundtrip(&req, &r), -EINVAL);
	CHECK_MSG(err, "(got 7)");
	at.role = FLOWMOVER__ROLE__PRODUCER;
	at.name = "";
	CHECK_RC(roundtrip(&req, &r), -EINVAL);
	CHECK_MSG(err, "attach: missing flow name");

	/* oversized */
	{
		static char big[CTL_MAX_FRAME + 1];

		memset(big, 'p', sizeof(big) - 1);
		sp.name = "big";
		sp.peer = big;
		req.body_case = FLOWMOVER__REQUEST__BODY_CREATE;
		req.create = &cr;
		CHECK_RC(ctl_frame_pack(&req.base, frame, sizeof(frame), &len),
			 -EMSGSIZE);
		CHECK_RC(decode_raw(big, sizeof(big)), -EMSGSIZE);
		CHECK_MSG(err, "exceeds");
		sp.peer = "";
		/* buffer too small */
		CHECK_RC(ctl_frame_pack(&req.base, frame, 8, &len), -EMSGSIZE);
		CHECK_RC(ctl_frame_pack(&req.base, frame, 2, &len), -EMSGSIZE);
	}

	/* a message that packs to nothing cannot be framed */
	{
		Flowmover__Request empty = FLOWMOVER__REQUEST__INIT;

		CHECK_RC(ctl_frame_pack(&empty.base, frame, sizeof(frame),
					&len), -EINVAL);
	}
	/* err may be NULL */
	CHECK_RC(ctl_request_decode((const uint8_t *)"\xff", 1, &r, NULL, 0),
		 -EPROTO);
}

/*
 * A request that cannot be decoded for want of memory is -ENOMEM, not
 * "malformed" (-EPROTO): the same bytes decode once there is memory.  The
 * child exhausts its heap under an address-space limit first.  Skipped
 * under a sanitizer, whose allocator dies rather than return NULL.
 */
/* gcc says a sanitizer with __SANITIZE_*__, clang (14) with __has_feature */
#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
	__has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#else
#define UNDER_SANITIZER 0
#endif

static void test_request_oom(void)
{
#if UNDER_SANITIZER
	printf("  decode without memory: skipped under a sanitizer\n");
#else
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT, *r = NULL;
	Flowmover__DescribeFlow ds = FLOWMOVER__DESCRIBE_FLOW__INIT;
	static uint8_t body[CTL_MAX_FRAME];
	size_t len, n;
	int st;
	pid_t pid;

	req.body_case = FLOWMOVER__REQUEST__BODY_DESCRIBE;
	req.describe = &ds;
	ds.name = "oom";
	CHECK_RC(ctl_frame_pack(&req.base, frame, sizeof(frame), &len), 0);
	n = len - CTL_HDR_BYTES;
	memcpy(body, frame + CTL_HDR_BYTES, n);
	/* an unknown field 99 of 60000 bytes: kept by the decoder */
	body[n++] = 0x9a; /* field 99, length-delimited */
	body[n++] = 0x06;
	body[n++] = 0xe0; /* 60000 */
	body[n++] = 0xd4;
	body[n++] = 0x03;
	n += 60000;
	CHECK_RC(ctl_request_decode(body, n, &r, err, sizeof(err)), 0);
	ctl_request_free(r);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct rlimit lim = { 1ul << 30, 1ul << 30 };
		int rc;

		/* room for what is mapped now, then the heap filled */
		CHECK(setrlimit(RLIMIT_AS, &lim) == 0);
		for (size_t sz = 1 << 20; sz >= 16; sz /= 2)
			while (malloc(sz))
				;
		rc = ctl_request_decode(body, n, &r, err, sizeof(err));
		_exit(rc == -ENOMEM && strstr(err, "out of memory") ? 0 : 1);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	printf("  decode without memory: -ENOMEM, out of memory\n");
#endif
}

static void test_response(void)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT, *r;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT, *fis[2];
	Flowmover__FlowList fl = FLOWMOVER__FLOW_LIST__INIT;
	Flowmover__StatusInfo st = FLOWMOVER__STATUS_INFO__INIT;
	Flowmover__Error e = FLOWMOVER__ERROR__INIT;
	Flowmover__Ok ok = FLOWMOVER__OK__INIT;
	size_t len;

	fi.name = "f";
	fi.state = "open";
	fi.ring_size = 4096;
	resp.id = 5;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
	resp.flow = &fi;
	CHECK_RC(ctl_frame_pack(&resp.base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_response_decode(frame + 4, len - 4, &r, err,
				     sizeof(err)), 0);
	CHECK(r->id == 5 && r->body_case == FLOWMOVER__RESPONSE__BODY_FLOW &&
	      r->flow->ring_size == 4096 && !strcmp(r->flow->state, "open"));
	ctl_response_free(r);

	fis[0] = fis[1] = &fi;
	fl.flows = fis;
	fl.n_flows = 2;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_LIST;
	resp.list = &fl;
	CHECK_RC(ctl_frame_pack(&resp.base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_response_decode(frame + 4, len - 4, &r, err,
				     sizeof(err)), 0);
	CHECK(r->list->n_flows == 2 && !strcmp(r->list->flows[1]->name, "f"));
	ctl_response_free(r);

	st.version = "0.1.0";
	st.pid = 77;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_STATUS;
	resp.status = &st;
	CHECK_RC(ctl_frame_pack(&resp.base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_response_decode(frame + 4, len - 4, &r, err,
				     sizeof(err)), 0);
	CHECK(r->status->pid == 77);
	ctl_response_free(r);

	resp.body_case = FLOWMOVER__RESPONSE__BODY_OK;
	resp.ok = &ok;
	CHECK_RC(ctl_frame_pack(&resp.base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_response_decode(frame + 4, len - 4, &r, err,
				     sizeof(err)), 0);
	CHECK(r->body_case == FLOWMOVER__RESPONSE__BODY_OK);
	ctl_response_free(r);

	/* Error with a non-negative code is a protocol error */
	e.code = 2;
	e.message = "x";
	resp.body_case = FLOWMOVER__RESPONSE__BODY_ERROR;
	resp.error = &e;
	CHECK_RC(ctl_frame_pack(&resp.base, frame, sizeof(frame), &len), 0);
	CHECK_RC(ctl_response_decode(frame + 4, len - 4, &r, err,
				     sizeof(err)), -EPROTO);
	CHECK(r == NULL);
	CHECK_MSG(err, "invalid code 2");

	/* ctl_error_frame */
	CHECK_RC(ctl_error_frame(11, -ENOENT, "no such flow 'q'", frame,
				 sizeof(frame), &len), 0);
	CHECK_RC(ctl_response_decode(frame + 4, len - 4, &r, err,
				     sizeof(err)), 0);
	CHECK(r->id == 11 && r->body_case == FLOWMOVER__RESPONSE__BODY_ERROR &&
	      r->error->code == -ENOENT &&
	      !strcmp(r->error->message, "no such flow 'q'"));
	ctl_response_free(r);
	CHECK_RC(ctl_error_frame(1, 0, "x", frame, sizeof(frame), &len),
		 -EINVAL);

	/* no body, garbage, empty, unknown body */
	CHECK_RC(ctl_response_decode((const uint8_t *)"\x08\x01", 2, &r, err,
				     sizeof(err)), -EPROTO);
	CHECK_MSG(err, "no known body");
	/* field 99, length-delimited: a body no version of moverd sends */
	CHECK_RC(ctl_response_decode((const uint8_t *)"\x08\x01\x9a\x06\x00",
				     5, &r, err, sizeof(err)), -EPROTO);
	CHECK_MSG(err, "no known body");
	CHECK_RC(ctl_response_decode((const uint8_t *)"\x12\x05\x08", 3, &r,
				     err, sizeof(err)), -EPROTO);
	CHECK_MSG(err, "malformed response");
	CHECK_RC(ctl_response_decode((const uint8_t *)"", 0, &r, err,
				     sizeof(err)), -EPROTO);
	CHECK(r == NULL);
}

/* ---- sockets ----------------------------------------------------------- */

static int waitpid_ok(pid_t pid)
{
	int st;

	return waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	       WEXITSTATUS(st) == 0;
}

static void test_fd_passing(void)
{
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT, *r;
	Flowmover__Ok ok = FLOWMOVER__OK__INIT;
	static uint8_t big[CTL_FRAME_BUF], in[CTL_MAX_FRAME];
	struct stat a, b;
	size_t len, got;
	int sv[2], mfd, fd;
	uint8_t h[4];

	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	mfd = memfd_create("ctl-test", MFD_CLOEXEC);
	CHECK(mfd >= 0);
	CHECK(ftruncate(mfd, 4096) == 0);

	/* a frame with an fd */
	resp.id = 3;
	resp.body_case = FLOWMOVER__RESPONSE__BODY_OK;
	resp.ok = &ok;
	CHECK_RC(ctl_send_msg(sv[0], &resp.base, mfd), 0);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 1000), 0);
	CHECK(fd >= 0 && fd != mfd);
	CHECK(fstat(fd, &a) == 0 && fstat(mfd, &b) == 0);
	CHECK(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	CHECK_RC(ctl_response_decode(in, got, &r, err, sizeof(err)), 0);
	CHECK(r->id == 3);
	ctl_response_free(r);
	close(fd);

	/* an fd nobody asked for is closed; one without an fd gives -1 */
	CHECK_RC(ctl_send_msg(sv[0], &resp.base, mfd), 0);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, NULL, 1000), 0);
	CHECK_RC(ctl_send_msg(sv[0], &resp.base, -1), 0);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 1000), 0);
	CHECK(fd == -1);

	/* the largest frame, in pieces of any size */
	memset(big + 4, 'z', CTL_MAX_FRAME);
	ctl_frame_hdr(big, CTL_MAX_FRAME);
	len = CTL_FRAME_BUF;
	{
		pid_t pid = fork();

		CHECK(pid >= 0);
		if (pid == 0) {
			_exit(ctl_send_frame(sv[0], big, len, mfd) ? 1 : 0);
		}
		CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd,
					5000), 0);
		CHECK(got == CTL_MAX_FRAME && in[0] == 'z' &&
		      in[CTL_MAX_FRAME - 1] == 'z');
		CHECK(fd >= 0);
		close(fd);
		CHECK(waitpid_ok(pid));
	}

	/* timeout with nothing to read */
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 50),
		 -ETIMEDOUT);
	/* ... and with half a frame */
	CHECK(write(sv[0], "\x10\x00", 2) == 2);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 50),
		 -ETIMEDOUT);
	close(sv[0]);
	close(sv[1]);

	/* zero length, oversized, bigger than the buffer */
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	ctl_frame_hdr(h, 0);
	CHECK(write(sv[0], h, 4) == 4);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 1000),
		 -EPROTO);
	close(sv[0]);
	close(sv[1]);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	ctl_frame_hdr(h, CTL_MAX_FRAME + 1);
	CHECK(write(sv[0], h, 4) == 4);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 1000),
		 -EMSGSIZE);
	close(sv[0]);
	close(sv[1]);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	ctl_frame_hdr(h, 100);
	CHECK(write(sv[0], h, 4) == 4);
	CHECK_RC(ctl_recv_frame(sv[1], in, 99, &got, &fd, 1000), -EMSGSIZE);
	close(sv[1]);

	/* peer closes: sending gets -EPIPE (no SIGPIPE), receiving -ECONNRESET */
	CHECK_RC(ctl_send_msg(sv[0], &resp.base, -1), -EPIPE);
	close(sv[0]);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	CHECK(write(sv[0], "\x10\x00\x00\x00\x01", 5) == 5);
	close(sv[0]);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 1000),
		 -ECONNRESET);
	CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd, 1000),
		 -ECONNRESET);
	close(sv[1]);

	/* two fds on one frame: refused, both closed */
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	{
		union {
			char buf[CMSG_SPACE(2 * sizeof(int))];
			struct cmsghdr align;
		} u;
		int fds[2] = { mfd, mfd };
		uint8_t f[6] = { 2, 0, 0, 0, 0x18, 0x00 };
		struct iovec iov = { f, sizeof(f) };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
				    .msg_control = u.buf,
				    .msg_controllen = sizeof(u.buf) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);

		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(fds));
		memcpy(CMSG_DATA(c), fds, sizeof(fds));
		CHECK(sendmsg(sv[0], &m, 0) == (ssize_t)sizeof(f));
		CHECK_RC(ctl_recv_frame(sv[1], in, sizeof(in), &got, &fd,
					1000), -EPROTO);
		CHECK(fd == -1);
	}
	close(sv[0]);
	close(sv[1]);
	close(mfd);
}

/* ---- client ------------------------------------------------------------ */

/* A one-connection fake daemon: answers each request per `mode`. */
struct fake {
	int sock;
	int mode;
};

enum { ECHO_OK, ERROR_ID0, WRONG_ID, ERROR_ENOENT, GARBAGE, HANG_UP };

static void *fake_daemon(void *arg)
{
	struct fake *fk = arg;
	static uint8_t in[CTL_MAX_FRAME];
	uint8_t out[CTL_FRAME_BUF];
	Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
	Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT;
	Flowmover__Request *req;
	size_t got, len;
	int mfd = memfd_create("fake", MFD_CLOEXEC);

	if (ctl_recv_frame(fk->sock, in, sizeof(in), &got, NULL, 5000) ||
	    ctl_request_decode(in, got, &req, err, sizeof(err)))
		return NULL;
	switch (fk->mode) {
	case ECHO_OK:
		fi.name = req->attach->name;
		resp.id = req->id;
		resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
		resp.flow = &fi;
		ctl_send_msg(fk->sock, &resp.base, mfd);
		break;
	case ERROR_ID0:
		ctl_error_frame(0, -EINVAL, "bad request: whatever", out,
				sizeof(out), &len);
		ctl_send_frame(fk->sock, out, len, mfd);
		break;
	case WRONG_ID:
		ctl_error_frame(req->id + 1, -EINVAL, "x", out, sizeof(out),
				&len);
		ctl_send_frame(fk->sock, out, len, -1);
		break;
	case ERROR_ENOENT:
		ctl_error_frame(req->id, -ENOENT, "no such flow 'nope'", out,
				sizeof(out), &len);
		ctl_send_frame(fk->sock, out, len, -1);
		break;
	case GARBAGE:
		ctl_send_frame(fk->sock, (const uint8_t *)"\x03\0\0\0\xff\xff\xff",
			       7, -1);
		break;
	case HANG_UP:
		shutdown(fk->sock, SHUT_WR);
		break;
	}
	ctl_request_free(req);
	close(mfd);
	return NULL;
}

static int call_fake(int mode, Flowmover__Response **resp, int *fd)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	struct fake fk = { .mode = mode };
	pthread_t t;
	int sv[2], rc;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	fk.sock = sv[1];
	CHECK(pthread_create(&t, NULL, fake_daemon, &fk) == 0);
	at.name = "flow1";
	at.role = FLOWMOVER__ROLE__PRODUCER;
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	rc = ctl_call(sv[0], &req, resp, fd, 2000);
	CHECK(req.id != 0);
	CHECK(pthread_join(t, NULL) == 0);
	close(sv[0]);
	close(sv[1]);
	return rc;
}

static void test_client(void)
{
	Flowmover__Response *r;
	int fd;

	CHECK_RC(call_fake(ECHO_OK, &r, &fd), 0);
	CHECK(r && r->body_case == FLOWMOVER__RESPONSE__BODY_FLOW &&
	      !strcmp(r->flow->name, "flow1"));
	CHECK(fd >= 0);
	close(fd);
	ctl_response_free(r);

	CHECK_RC(call_fake(ERROR_ID0, &r, &fd), -EINVAL);
	CHECK(r == NULL && fd == -1);
	CHECK_MSG(ctl_last_error(), "bad request: whatever");

	CHECK_RC(call_fake(WRONG_ID, &r, &fd), -EPROTO);
	CHECK_MSG(ctl_last_error(), "answers request");

	CHECK_RC(call_fake(ERROR_ENOENT, &r, NULL), -ENOENT);
	CHECK(!strcmp(ctl_last_error(), "no such flow 'nope'"));

	CHECK_RC(call_fake(GARBAGE, &r, &fd), -EPROTO);
	CHECK_MSG(ctl_last_error(), "malformed response");

	CHECK_RC(call_fake(HANG_UP, &r, &fd), -ECONNRESET);
	CHECK_MSG(ctl_last_error(), "closed the connection");
}

/* Answers a request only once the next one came: the first call times
 * out, and its answer (with an fd) arrives ahead of the second's. */
static void *late_daemon(void *arg)
{
	struct fake *fk = arg;
	static uint8_t in[CTL_MAX_FRAME];
	Flowmover__Request *req[2];
	size_t got;
	int mfd = memfd_create("late", MFD_CLOEXEC);

	for (int i = 0; i < 2; i++)
		if (ctl_recv_frame(fk->sock, in, sizeof(in), &got, NULL, 5000) ||
		    ctl_request_decode(in, got, &req[i], err, sizeof(err)))
			return NULL;
	for (int i = 0; i < 2; i++) {
		Flowmover__Response resp = FLOWMOVER__RESPONSE__INIT;
		Flowmover__FlowInfo fi = FLOWMOVER__FLOW_INFO__INIT;

		fi.name = req[i]->attach->name;
		resp.id = req[i]->id;
		resp.body_case = FLOWMOVER__RESPONSE__BODY_FLOW;
		resp.flow = &fi;
		ctl_send_msg(fk->sock, &resp.base, mfd);
		ctl_request_free(req[i]);
	}
	close(mfd);
	return NULL;
}

static unsigned open_fds(void)
{
	unsigned n = 0;

	for (int fd = 0; fd < 1024; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

/* A call that timed out leaves its answer on the socket: the next call
 * on it skips that (and closes its fd) and gets its own. */
static void test_late_answer(void)
{
	Flowmover__Request req = FLOWMOVER__REQUEST__INIT;
	Flowmover__Attach at = FLOWMOVER__ATTACH__INIT;
	Flowmover__Response *r;
	struct fake fk = { 0 };
	unsigned before = open_fds();
	pthread_t t;
	int sv[2], fd;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	fk.sock = sv[1];
	CHECK(pthread_create(&t, NULL, late_daemon, &fk) == 0);
	at.role = FLOWMOVER__ROLE__PRODUCER;
	req.body_case = FLOWMOVER__REQUEST__BODY_ATTACH;
	req.attach = &at;
	at.name = "first";
	CHECK_RC(ctl_call(sv[0], &req, &r, &fd, 100), -ETIMEDOUT);
	at.name = "second";
	CHECK_RC(ctl_call(sv[0], &req, &r, &fd, 5000), 0);
	CHECK(r && r->body_case == FLOWMOVER__RESPONSE__BODY_FLOW &&
	      !strcmp(r->flow->name, "second"));
	CHECK(fd >= 0);
	close(fd);
	ctl_response_free(r);
	CHECK(pthread_join(t, NULL) == 0);
	close(sv[0]);
	close(sv[1]);
	CHECK(open_fds() == before); /* the first answer's fd was closed */
}

static void test_connect(void)
{
	char dir[] = "/tmp/ctl-test-XXXXXX", path[256], longp[200];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int s;

	CHECK(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/missing.sock", dir);
	CHECK_RC(ctl_connect(path), -ECONNREFUSED);
	CHECK_MSG(ctl_last_error(), "moverd is not running (no socket at ");
	snprintf(path, sizeof(path), "%s/nodir/x.sock", dir);
	CHECK_RC(ctl_connect(path), -ECONNREFUSED);

	/* a socket file nobody listens on */
	snprintf(path, sizeof(path), "%s/dead.sock", dir);
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	strcpy(sa.sun_path, path);
	CHECK(bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	close(s);
	CHECK_RC(ctl_connect(path), -ECONNREFUSED);

	/* a listening one */
	unlink(path);
	s = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	CHECK(listen(s, 1) == 0);
	{
		int c = ctl_connect(path);

		CHECK(c >= 0);
		CHECK(fcntl(c, F_GETFD) & FD_CLOEXEC);
		close(c);
	}
	close(s);
	unlink(path);

	memset(longp, 'l', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	CHECK_RC(ctl_connect(longp), -ENAMETOOLONG);
	rmdir(dir);

	/* the socket path */
	unsetenv(CTL_SOCKET_ENV);
	CHECK(!strcmp(ctl_socket_path(NULL), CTL_DEFAULT_SOCKET));
	CHECK(!strcmp(ctl_socket_path(""), CTL_DEFAULT_SOCKET));
	setenv(CTL_SOCKET_ENV, "/x/env.sock", 1);
	CHECK(!strcmp(ctl_socket_path(NULL), "/x/env.sock"));
	CHECK(!strcmp(ctl_socket_path("/x/flag.sock"), "/x/flag.sock"));
	setenv(CTL_SOCKET_ENV, "", 1);
	CHECK(!strcmp(ctl_socket_path(NULL), CTL_DEFAULT_SOCKET));
	unsetenv(CTL_SOCKET_ENV);
}

int main(void)
{
	test_header();
	test_request_roundtrip();
	test_request_errors();
	test_request_oom();
	test_response();
	test_fd_passing();
	test_client();
	test_late_answer();
	test_connect();
	printf("test_ctl_frame: ok\n");
	return 0;
}
