/*
 * tests/fuzz/fuzz_ctl_frame.c - libFuzzer target for what moverd and the
 * clients do with bytes from the control socket: the frame length check,
 * ctl_request_decode (with its validation) and ctl_response_decode.
 *
 * Input: a frame (4-byte little-endian length, then body).  When the
 * length is invalid or larger than the input, the rest of the input is
 * decoded anyway, so every input exercises the decoders.
 *
 * Properties checked (a violation traps): error strings are always
 * terminated sentences; *out is NULL on failure; a request that decodes
 * re-encodes and decodes again to the same kind, id and name.
 */
#include "ctl_frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static const char *req_name(const Flowmover__Request *r)
{
	switch (r->body_case) {
	case FLOWMOVER__REQUEST__BODY_CREATE:   return r->create->spec->name;
	case FLOWMOVER__REQUEST__BODY_DESTROY:  return r->destroy->name;
	case FLOWMOVER__REQUEST__BODY_DESCRIBE: return r->describe->name;
	case FLOWMOVER__REQUEST__BODY_ATTACH:   return r->attach->name;
	default:                                return "";
	}
}

static void check_err(int rc, const char *err, size_t cap)
{
	if (rc) {
		REQUIRE(rc < 0);
		REQUIRE(memchr(err, '\0', cap) != NULL);
		REQUIRE(err[0] != '\0');
	}
}

static void fuzz_request(const uint8_t *body, size_t n)
{
	char err[CTL_ERR_MAX];
	Flowmover__Request *r = (Flowmover__Request *)1, *r2 = NULL;
	uint8_t *buf;
	size_t flen;
	uint32_t blen;
	int rc;

	memset(err, 'x', sizeof(err));
	rc = ctl_request_decode(body, n, &r, err, sizeof(err));
	check_err(rc, err, sizeof(err));
	if (rc) {
		REQUIRE(r == NULL);
		return;
	}
	REQUIRE(ctl_name_valid(req_name(r)) || req_name(r)[0] == '\0');
	buf = malloc(CTL_FRAME_BUF);
	REQUIRE(buf);
	rc = ctl_frame_pack(&r->base, buf, CTL_FRAME_BUF, &flen);
	REQUIRE(rc == 0 || rc == -EMSGSIZE);
	if (rc == 0) {
		REQUIRE(ctl_frame_len(buf, &blen) == 0);
		REQUIRE(blen + CTL_HDR_BYTES == flen);
		rc = ctl_request_decode(buf + CTL_HDR_BYTES, blen, &r2, err,
					sizeof(err));
		REQUIRE(rc == 0);
		REQUIRE(r2->id == r->id && r2->body_case == r->body_case);
		REQUIRE(!strcmp(req_name(r), req_name(r2)));
		ctl_request_free(r2);
	}
	free(buf);
	ctl_request_free(r);
}

static void fuzz_response(const uint8_t *body, size_t n)
{
	char err[CTL_ERR_MAX];
	Flowmover__Response *r = (Flowmover__Response *)1;
	int rc;

	rc = ctl_response_decode(body, n, &r, err, sizeof(err));
	check_err(rc, err, sizeof(err));
	if (rc) {
		REQUIRE(r == NULL);
		return;
	}
	if (r->body_case == FLOWMOVER__RESPONSE__BODY_ERROR)
		REQUIRE(r->error->code < 0 && r->error->message);
	ctl_response_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *body;
	uint32_t len = 0;
	size_t n;
	int rc;

	if (size < CTL_HDR_BYTES)
		return 0;
	rc = ctl_frame_len(data, &len);
	REQUIRE(rc == 0 || rc == -EPROTO || rc == -EMSGSIZE);
	REQUIRE(rc != 0 || (len >= 1 && len <= CTL_MAX_FRAME));
	body = data + CTL_HDR_BYTES;
	n = size - CTL_HDR_BYTES;
	if (rc == 0 && len <= n)
		n = len;
	fuzz_request(body, n);
	fuzz_response(body, n);
	return 0;
}
