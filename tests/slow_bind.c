/*
 * tests/slow_bind.c - an LD_PRELOAD shim for test_files case 11g: every
 * successful bind() of an AF_UNIX socket returns 300 ms late, so that a
 * window between bind() and the chmod() of the socket's path is wide
 * enough for the test to see the mode the socket had in it.
 */
#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	int (*real)(int, const struct sockaddr *, socklen_t) =
		(int (*)(int, const struct sockaddr *, socklen_t))
			dlsym(RTLD_NEXT, "bind");
	int rc = real(fd, addr, len);

	if (rc == 0 && addr->sa_family == AF_UNIX)
		usleep(300000);
	return rc;
}
