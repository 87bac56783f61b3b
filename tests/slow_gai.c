/*
 * tests/slow_gai.c - an LD_PRELOAD shim for test_peers cases 8 and 10: a
 * lookup of a host whose name starts with "slow" takes 5 s and then fails,
 * as with a DNS server that does not answer; one that starts with "nohost"
 * fails at once, as a name the DNS does not know; any other name is looked
 * up at once.
 */
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>

int getaddrinfo(const char *node, const char *service,
		const struct addrinfo *hints, struct addrinfo **res)
{
	int (*real)(const char *, const char *, const struct addrinfo *,
		    struct addrinfo **) =
		(int (*)(const char *, const char *, const struct addrinfo *,
			 struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");

	if (!node || (hints && (hints->ai_flags & AI_NUMERICHOST)))
		return real(node, service, hints, res);
	if (!strncmp(node, "slow", 4)) {
		sleep(5);
		return EAI_AGAIN;
	}
	if (!strncmp(node, "nohost", 6))
		return EAI_NONAME;
	return real(node, service, hints, res);
}
