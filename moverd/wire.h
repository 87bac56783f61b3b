/*
 * moverd/wire.h - the frame header of the peer protocol between moverd
 * daemons.  Every frame is this 32-byte header (little endian) followed by
 * `len` payload bytes:
 *
 *   CTRL       a protobuf flowmover.PeerMsg (hello, flow open/opened/close)
 *   DATA       `len` bytes of flow `flow_id`'s producer ring starting at
 *              position `pos`: whole committed records, to be deposited at
 *              the same offsets of the consumer ring
 *   ACK        no payload: the consumer ring of flow_id has published
 *              everything before `pos`, and its consumer stands at `aux`
 *   HEARTBEAT  no payload: the link is alive
 */
#ifndef MOVERD_WIRE_H
#define MOVERD_WIRE_H

#include <stdint.h>
#include <string.h>

#define WIRE_MAGIC    0x464d5057u /* "WPMF" */
#define WIRE_VERSION  1u
#define WIRE_HDR      32u
#define WIRE_MAX_CTRL 65536u
/* The most ring bytes one DATA frame carries: `len` is 32 bits, and over
 * RDMA the span is one WRITE, whose devices take 2^31 bytes at most (rxe,
 * mlx5).  So a flow between hosts has records of at most this much with
 * their header (flows.c). */
#define WIRE_SPAN_MAX (1u << 31)

enum wire_type {
	WIRE_CTRL = 1,
	WIRE_DATA = 2,
	WIRE_ACK = 3,
	WIRE_HEARTBEAT = 4,
};

struct wire_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t flow_id;
	uint32_t len;
	uint64_t pos;
	uint64_t aux;
};

_Static_assert(sizeof(struct wire_hdr) == WIRE_HDR, "wire header");

/* x86-64 and aarch64 are little endian; the header is copied as is. */
static inline void wire_put(uint8_t out[WIRE_HDR], enum wire_type type,
			    uint32_t flow_id, uint32_t len, uint64_t pos,
			    uint64_t aux)
{
	struct wire_hdr h = { WIRE_MAGIC, WIRE_VERSION, (uint16_t)type, flow_id,
			      len, pos, aux };

	memcpy(out, &h, sizeof(h));
}

static inline void wire_get(const uint8_t in[WIRE_HDR], struct wire_hdr *h)
{
	memcpy(h, in, sizeof(*h));
}

#endif
