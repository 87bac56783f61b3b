/*
 * moverd/peer_allow.h - which addresses may connect as peers at all
 * (--peer-allow CIDR[,CIDR...]), whether a listen address is loopback, and
 * the addresses a connection may have been dialed at (the handshake binds
 * its proofs to one: auth.h; --peer-reachable-at IP:PORT[,...]).
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
#define PEER_REACH_MAX 8u   /* addresses in --peer-reachable-at */
#define ENDPOINT_CHARS 64u  /* "[IPv6]:PORT" and its NUL fit */

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

/* The same for any list of at most max networks; opt names it in err. */
int peer_nets_parse(const char *spec, const char *opt, struct peer_net *nets,
		    unsigned max, unsigned *n, char *err, size_t cap);

/* May sa connect?  An IPv4-mapped IPv6 address counts as IPv4. */
bool peer_allow_match(const struct peer_allow *a, const struct sockaddr *sa);

/* Is sa in one of the n networks (none: false)?  IPv4-mapped as IPv4. */
bool peer_nets_match(const struct peer_net *nets, unsigned n,
		     const struct sockaddr *sa);

/* The same for a numeric address ("10.0.0.1", "2001:db8::1"); false for
 * anything else. */
bool peer_nets_match_host(const struct peer_net *nets, unsigned n,
			  const char *host);

/* Addresses, besides a connection's own local one, that peers may have
 * dialed to reach this daemon (NAT, port forwarding): canonical names. */
struct peer_reach {
	unsigned n;
	char name[PEER_REACH_MAX][ENDPOINT_CHARS];
};

/* The canonical name of sa: "IP:PORT", "[IPv6]:PORT"; an IPv4-mapped
 * address as IPv4, no scope id (the two ends name their interfaces
 * differently).  False (and "?") for other families. */
bool endpoint_name(const struct sockaddr *sa, char *buf, size_t cap);

/* Parse "192.0.2.7:7000,[2001:db8::1]:7000" (numeric only) into r; 0, or
 * -EINVAL with a sentence in err. */
int peer_reach_parse(const char *spec, struct peer_reach *r, char *err,
		     size_t cap);

/* Is name one of r's? */
bool peer_reach_has(const struct peer_reach *r, const char *name);

/* Is the host of "HOST:PORT" a loopback address (127.0.0.0/8, ::1,
 * "localhost")? */
bool peer_listen_is_loopback(const char *hostport);

#endif
