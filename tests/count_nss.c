/*
 * tests/count_nss.c - an LD_PRELOAD shim for test_config cases 17 and 19:
 * every getpwnam and getgrnam appends a byte to the file $FM_NSS_COUNT (if
 * set), then asks the real one.  The file's size is the number of name
 * lookups.  While the file $FM_NSS_HOLD exists (if set), a lookup waits,
 * as on an NSS server that does not answer, and says so by creating
 * $FM_NSS_HOLD.in.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Wait while $FM_NSS_HOLD exists, after making $FM_NSS_HOLD.in. */
static void hold(void)
{
	const char *path = getenv("FM_NSS_HOLD");
	char in[512];
	int fd;

	if (!path || access(path, F_OK))
		return;
	snprintf(in, sizeof(in), "%s.in", path);
	fd = open(in, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	while (!access(path, F_OK))
		usleep(10000);
}

static void count(void)
{
	const char *path = getenv("FM_NSS_COUNT");
	int fd;

	hold();
	if (!path)
		return;
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (write(fd, "x", 1) != 1) {
		/* the count comes out short: the test fails, not the daemon */
	}
	close(fd);
}

struct passwd *getpwnam(const char *name)
{
	struct passwd *(*real)(const char *) =
		(struct passwd *(*)(const char *))dlsym(RTLD_NEXT, "getpwnam");

	count();
	return real(name);
}

struct group *getgrnam(const char *name)
{
	struct group *(*real)(const char *) =
		(struct group *(*)(const char *))dlsym(RTLD_NEXT, "getgrnam");

	count();
	return real(name);
}
