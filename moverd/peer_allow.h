/*
 * moverd/peer_allow.h - which addresses may connect as peers at all
 * (--peer-allow CIDR[,CIDR...]), and whether a listen address is loopback.
 *
 * The list is checked at accept, before anything but the socket exists
 * for the connection (TCP), or before the rdma_cm connect request is
 * accepted (RDMA).  It narrows who may try; the key (auth.h) decides who
 * gets in.
 */
#ifndef MOVERD_PEER_ALLOW_H
#define MOVERD_PEER_ALLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define PEER_ALLOW_MAX 64u  /* networks in one --peer-allow */

struct peer_net {
	int family;           /* AF_INET or AF_INET6 */
	uint8_t addr[16];     /* network bytes, host bits cleared */
	unsigned prefix;      /* 0..32 or 0..128 */
};

struct peer_allow {
	unsigned n;           /* 0: everyone may connect */
	struct peer_net nets[PEER_ALLOW_MAX];
};

/* Parse "10.0.0.0/8,::1/128,192.0.2.7" (no prefix: one address) into a;
 * 0, or -EINVAL with a sentence in err. */
int peer_allow_parse(const char *spec, struct peer_allow *a, char *err,
		     size_t cap);

/* May sa connect?  An IPv4-mapped IPv6 address counts as IPv4. */
bool peer_allow_match(const struct peer_allow *a, const struct sockaddr *sa);

/* Is the host of "HOST:PORT" a loopback address (127.0.0.0/8, ::1,
 * "localhost")? */
bool peer_listen_is_loopback(const char *hostport);

#endif
