/*
 * moverd/peer_parts.h - what the files of the peer protocol call of each
 * other, and nothing outside them includes:
 *
 *   peer.c        peers and their flows, control frames, failure and
 *                 reconnection, sending, the peer manager's public calls
 *   peer_hello.c  a connection's hello and key proof
 *   peer_open.c   a flow's open, its answer and its close
 *   peer_rx.c     frames received: control dispatch, acknowledgements, DATA
 *   peer_timer.c  deadlines, heartbeats, reopens and the flow checks
 *
 * What the mover and the transports share with them is in peer_impl.h.
 */
#ifndef MOVERD_PEER_PARTS_H
#define MOVERD_PEER_PARTS_H

#include "peer_impl.h"
#include "flowmover.pb-c.h"

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

/* peer.c: a peer's flows */
void link_flow(struct peer *p, struct flow *f);
void detach_flow(struct flow *f);
void rx_release(struct peer *p);
void move_senders(struct peer *from, struct peer *to);
bool same_run(const struct peer *q, const struct peer *p);
struct peer *inbound_from(struct peer_mgr *m, const char *addr);

/* peer.c: addresses */
void peer_host(const struct peer *p, char *out, size_t cap);
bool parse_ip(const char *host, size_t n, struct in6_addr *out);
void v4_mapped(struct in6_addr *out, const struct in_addr *v4);

/* peer.c: control frames */
int queue_ctrl(struct peer *p, Flowmover__PeerMsg *msg);
const char *node_name(void);
void queue_hello(struct peer *p);
uint64_t sub_tag(const struct flow *f);
bool queue_open(struct peer *p, struct flow *f);

/* peer.c: failure */
void peer_close(struct peer *p, const char *why);
void fail_receiver(struct peer *p, struct flow *f, const char *why);
void fail_tampered(struct flow *f, const char *why);
void fail_ring(struct flow *first, const char *why);

/* peer_hello.c */
void handle_hello(struct peer *p, const Flowmover__PeerHello *h);
void handle_auth(struct peer *p, const Flowmover__PeerAuth *a);

/* peer_open.c */
void held_drop_all(struct peer *p);
void handle_open(struct peer *p, const Flowmover__PeerFlowOpen *op);
void handle_opened(struct peer *p, const Flowmover__PeerFlowOpened *op);
void handle_close(struct peer *p, const Flowmover__PeerFlowClose *cl);
void queue_refused(struct peer *p, uint32_t id, int error,
		   const char *message, uint32_t retry_ms);
void cuts_record(struct peer *p, struct flow *f, const char *what,
		 uint64_t pos);

#endif
