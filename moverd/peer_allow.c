/*
 * moverd/peer_allow.c - --peer-allow networks and the loopback test of a
 * listen address (see peer_allow.h).
 */
#include "peer_allow.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Clear the host bits of a network (10.1.2.3/8 means 10.0.0.0/8). */
static void mask_bits(uint8_t *addr, unsigned len, unsigned prefix)
{
	for (unsigned i = 0; i < len; i++) {
		unsigned keep = prefix >= 8 * (i + 1) ? 8 :
				prefix > 8 * i ? prefix - 8 * i : 0;

		addr[i] &= (uint8_t)(0xff00u >> keep);
	}
}

static int parse_net(const char *s, struct peer_net *n)
{
	char host[64], *slash, *end;
	unsigned max;
	long prefix;

	if (strlen(s) >= sizeof(host))
		return -EINVAL;
	strcpy(host, s);
	slash = strchr(host, '/');
	if (slash)
		*slash = 0;
	memset(n, 0, sizeof(*n));
	if (inet_pton(AF_INET, host, n->addr) == 1) {
		n->family = AF_INET;
		max = 32;
	} else if (inet_pton(AF_INET6, host, n->addr) == 1) {
		n->family = AF_INET6;
		max = 128;
	} else {
		return -EINVAL;
	}
	prefix = max;
	if (slash) {
		errno = 0;
		prefix = strtol(slash + 1, &end, 10);
		if (errno || end == slash + 1 || *end || prefix < 0 ||
		    prefix > (long)max)
			return -EINVAL;
	}
	n->prefix = (unsigned)prefix;
	mask_bits(n->addr, max / 8, n->prefix);
	return 0;
}

/* A comma-separated option value: what it is called, what each item is to
 * be, and how many it may have; one() parses item i into ctx (0 or not). */
struct list_kind {
	const char *opt, *what, *expect;
	unsigned max;
	int (*one)(const char *tok, unsigned i, void *ctx);
};

/* Parse spec's items into ctx, counting them in *n; 0, or -EINVAL with a
 * sentence in err (too long, too many, a bad item, none). */
static int parse_list(const char *spec, const struct list_kind *k, void *ctx,
		      unsigned *n, char *err, size_t cap)
{
	char buf[4096], *tok, *save = NULL;

	*n = 0;
	if (strlen(spec) >= sizeof(buf)) {
		snprintf(err, cap, "%s: too long", k->opt);
		return -EINVAL;
	}
	strcpy(buf, spec);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (*n == k->max) {
			snprintf(err, cap, "%s: at most %u %s", k->opt, k->max,
				 k->what);
			return -EINVAL;
		}
		if (k->one(tok, *n, ctx)) {
			snprintf(err, cap, "%s: '%.64s' is not %s", k->opt, tok,
				 k->expect);
			return -EINVAL;
		}
		(*n)++;
	}
	if (!*n) {
		snprintf(err, cap, "%s: none given", k->opt);
		return -EINVAL;
	}
	return 0;
}

static int net_one(const char *tok, unsigned i, void *ctx)
{
	struct peer_net *nets = ctx;

	return parse_net(tok, &nets[i]);
}

int peer_nets_parse(const char *spec, const char *opt, struct peer_net *nets,
		    unsigned max, unsigned *n, char *err, size_t cap)
{
	const struct list_kind kind = {
		.opt = opt, .what = "networks",
		.expect = "an address or network (e.g. 10.0.0.0/8, fd00::/8, "
			  "192.0.2.7)",
		.max = max, .one = net_one,
	};

	return parse_list(spec, &kind, nets, n, err, cap);
}

int peer_allow_parse(const char *spec, struct peer_allow *a, char *err,
		     size_t cap)
{
	return peer_nets_parse(spec, "--peer-allow", a->nets, PEER_ALLOW_MAX,
			       &a->n, err, cap);
}

/* sa's address bytes and family; a v4-mapped v6 address as v4. */
static int addr_of(const struct sockaddr *sa, uint8_t out[16])
{
	static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
					    0xff, 0xff };

	if (sa->sa_family == AF_INET) {
		memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return AF_INET;
	}
	if (sa->sa_family != AF_INET6)
		return -1;
	memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	if (memcmp(out, mapped, sizeof(mapped)))
		return AF_INET6;
	memmove(out, out + 12, 4);
	return AF_INET;
}

bool peer_allow_match(const struct peer_allow *a, const struct sockaddr *sa)
{
	return !a || !a->n || peer_nets_match(a->nets, a->n, sa);
}

bool peer_nets_match_host(const struct peer_net *nets, unsigned n,
			  const char *host)
{
	struct sockaddr_in6 s6 = { .sin6_family = AF_INET6 };
	struct sockaddr_in s4 = { .sin_family = AF_INET };

	if (inet_pton(AF_INET, host, &s4.sin_addr) == 1)
		return peer_nets_match(nets, n, (struct sockaddr *)&s4);
	if (inet_pton(AF_INET6, host, &s6.sin6_addr) == 1)
		return peer_nets_match(nets, n, (struct sockaddr *)&s6);
	return false;
}

bool peer_nets_match(const struct peer_net *nets, unsigned count,
		     const struct sockaddr *sa)
{
	uint8_t addr[16];
	int family = addr_of(sa, addr);

	for (unsigned i = 0; i < count; i++) {
		const struct peer_net *n = &nets[i];
		uint8_t masked[16];
		unsigned len = n->family == AF_INET ? 4 : 16;

		if (n->family != family)
			continue;
		memcpy(masked, addr, len);
		mask_bits(masked, len, n->prefix);
		if (!memcmp(masked, n->addr, len))
			return true;
	}
	return false;
}

bool peer_listen_is_loopback(const char *hostport)
{
	const char *colon = strrchr(hostport, ':');
	size_t n = colon ? (size_t)(colon - hostport) : strlen(hostport);
	char host[64];
	uint8_t a[16];

	if (n >= 2 && hostport[0] == '[' && hostport[n - 1] == ']') {
		hostport++; /* [::1]:7400 */
		n -= 2;
	}
	if (n >= sizeof(host))
		return false;
	memcpy(host, hostport, n);
	host[n] = 0;
	if (!strcmp(host, "localhost"))
		return true;
	if (inet_pton(AF_INET, host, a) == 1)
		return a[0] == 127;
	return inet_pton(AF_INET6, host, a) == 1 &&
	       IN6_IS_ADDR_LOOPBACK((struct in6_addr *)a);
}

/* ---- the addresses a connection may have been dialed at ---------------- */

bool endpoint_name(const struct sockaddr *sa, char *buf, size_t cap)
{
	const struct sockaddr_in6 *s6 = (const void *)sa;
	const struct sockaddr_in *s4 = (const void *)sa;
	char host[INET6_ADDRSTRLEN];

	if (sa->sa_family == AF_INET &&
	    inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host))) {
		snprintf(buf, cap, "%s:%u", host, (unsigned)ntohs(s4->sin_port));
		return true;
	}
	if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr) &&
	    inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], host, sizeof(host))) {
		snprintf(buf, cap, "%s:%u", host, (unsigned)ntohs(s6->sin6_port));
		return true;
	}
	if (sa->sa_family == AF_INET6 &&
	    inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host))) {
		snprintf(buf, cap, "[%s]:%u", host,
			 (unsigned)ntohs(s6->sin6_port));
		return true;
	}
	snprintf(buf, cap, "?");
	return false;
}

/* One "IP:PORT" or "[IPv6]:PORT", numeric, into its canonical name. */
static int parse_endpoint(const char *s, char *name, size_t cap)
{
	struct sockaddr_storage ss = { 0 };
	struct sockaddr_in6 *s6 = (void *)&ss;
	struct sockaddr_in *s4 = (void *)&ss;
	char host[INET6_ADDRSTRLEN + 2], *colon, *end;
	long port;

	if (strlen(s) >= sizeof(host) + 6)
		return -EINVAL;
	colon = strrchr(s, ':');
	if (!colon || (size_t)(colon - s) >= sizeof(host))
		return -EINVAL;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = 0;
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || port < 1 || port > 65535)
		return -EINVAL;
	if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
	} else if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		host[strlen(host) - 1] = 0;
		if (inet_pton(AF_INET6, host + 1, &s6->sin6_addr) != 1)
			return -EINVAL;
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
	} else {
		return -EINVAL;
	}
	return endpoint_name((struct sockaddr *)&ss, name, cap) ? 0 : -EINVAL;
}

static int reach_one(const char *tok, unsigned i, void *ctx)
{
	struct peer_reach *r = ctx;

	return parse_endpoint(tok, r->name[i], sizeof(r->name[0]));
}

int peer_reach_parse(const char *spec, struct peer_reach *r, char *err,
		     size_t cap)
{
	static const struct list_kind kind = {
		.opt = "--peer-reachable-at", .what = "addresses",
		.expect = "a numeric IP:PORT (e.g. 192.0.2.7:7000, "
			  "[2001:db8::1]:7000)",
		.max = PEER_REACH_MAX, .one = reach_one,
	};

	return parse_list(spec, &kind, r, &r->n, err, cap);
}

bool peer_reach_has(const struct peer_reach *r, const char *name)
{
	for (unsigned i = 0; r && i < r->n; i++)
		if (!strcmp(r->name[i], name))
			return true;
	return false;
}
