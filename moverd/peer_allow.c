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

int peer_allow_parse(const char *spec, struct peer_allow *a, char *err,
		     size_t cap)
{
	char buf[4096], *tok, *save = NULL;

	a->n = 0;
	if (strlen(spec) >= sizeof(buf)) {
		snprintf(err, cap, "--peer-allow: too long");
		return -EINVAL;
	}
	strcpy(buf, spec);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (a->n == PEER_ALLOW_MAX) {
			snprintf(err, cap, "--peer-allow: at most %u networks",
				 PEER_ALLOW_MAX);
			return -EINVAL;
		}
		if (parse_net(tok, &a->nets[a->n])) {
			snprintf(err, cap, "--peer-allow: '%.64s' is not an "
				 "address or network (e.g. 10.0.0.0/8, "
				 "fd00::/8, 192.0.2.7)", tok);
			return -EINVAL;
		}
		a->n++;
	}
	if (!a->n) {
		snprintf(err, cap, "--peer-allow: no network given");
		return -EINVAL;
	}
	return 0;
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
	uint8_t addr[16];
	int family;

	if (!a || !a->n)
		return true;
	family = addr_of(sa, addr);
	for (unsigned i = 0; i < a->n; i++) {
		const struct peer_net *n = &a->nets[i];
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
