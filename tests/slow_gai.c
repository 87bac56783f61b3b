/*
 * tests/slow_gai.c - an LD_PRELOAD shim for test_peers case 8: a lookup of
 * a host whose name starts with "slow" takes 5 s and then fails, as with a
 * DNS server that does not answer; any other name is looked up at once.
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

	if (node && !strncmp(node, "slow", 4) &&
	    !(hints && (hints->ai_flags & AI_NUMERICHOST))) {
		sleep(5);
		return EAI_AGAIN;
	}
	return real(node, service, hints, res);
}
