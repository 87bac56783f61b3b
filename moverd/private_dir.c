/*
 * moverd/private_dir.c - directories only moverd may write (see
 * private_dir.h).
 *
 * The path is walked one component at a time with openat, from "/" (or
 * the working directory), so what is checked is what is used: a
 * component is looked at with AT_SYMLINK_NOFOLLOW, then opened and its
 * fd checked with fstat.  A symlink is followed only above the last
 * component, and only when root or we own it (/var/run -> /run); its
 * target is checked like any directory.
 */
#include "private_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool ours(uid_t uid)
{
	return uid == 0 || uid == geteuid();
}

/* The checks of one directory fd; 0 or -1 with err. */
static int check_dir(int fd, const char *shown, bool last, char *err,
		     size_t errlen)
{
	struct stat st;
	bool shared;

	if (fstat(fd, &st)) {
		snprintf(err, errlen, "cannot stat %s: %s", shown,
			 strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s is not a directory", shown);
		return -1;
	}
	/* /tmp-like: others add entries, but cannot move or remove ours */
	shared = !last && (st.st_mode & S_ISVTX) && st.st_uid == 0;
	if (ours(st.st_uid) && (!(st.st_mode & 022) || shared))
		return 0;
	if (last && (st.st_mode & S_ISVTX) && (st.st_mode & 002)) {
		snprintf(err, errlen, "refusing %s: a directory everyone can "
			 "write (mode %04o); give moverd one of its own below it "
			 "(e.g. %s/flowmover/)", shown,
			 (unsigned)(st.st_mode & 07777), shown);
		return -1;
	}
	snprintf(err, errlen, "refusing %s: owned by uid %u with mode %04o; "
		 "moverd writes there, so it must be a directory owned by root "
		 "or by moverd's uid %u that no one else can write%s: remove "
		 "it (moverd creates it), or fix its owner and mode", shown,
		 (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
		 (unsigned)geteuid(),
		 last ? "" : " (or root's and sticky, like /tmp)");
	return -1;
}

/* Create name in dirfd with exactly mode (not the umask's idea of it). */
static int make_dir(int dirfd, const char *name, mode_t mode)
{
	if (mkdirat(dirfd, name, mode))
		return errno == EEXIST ? 0 : -1;
	/* just created by us, in a directory others cannot write (or a
	 * sticky one, where they cannot swap it): the name is ours */
	return fchmodat(dirfd, name, mode, 0);
}

/* One step down: from *dirfd into name.  0 or -1 with err. */
static int step(int *dirfd, const char *name, const char *shown, bool last,
		mode_t mode, char *err, size_t errlen)
{
	int flags = O_DIRECTORY | O_CLOEXEC | (last ? O_RDONLY : O_PATH);
	struct stat st;
	int fd;

	if (fstatat(*dirfd, name, &st, AT_SYMLINK_NOFOLLOW) &&
	    (errno != ENOENT || make_dir(*dirfd, name, last ? mode : 0755) ||
	     fstatat(*dirfd, name, &st, AT_SYMLINK_NOFOLLOW))) {
		snprintf(err, errlen, "cannot create %s: %s", shown,
			 strerror(errno));
		return -1;
	}
	if (S_ISLNK(st.st_mode) && (last || !ours(st.st_uid))) {
		snprintf(err, errlen, "refusing %s: it is a symbolic link "
			 "(owned by uid %u); moverd needs a real directory there, "
			 "owned by root or by moverd's uid %u: remove the link "
			 "(moverd creates the directory), or name the directory "
			 "itself", shown, (unsigned)st.st_uid, (unsigned)geteuid());
		return -1;
	}
	if (!S_ISLNK(st.st_mode))
		flags |= O_NOFOLLOW;
	fd = openat(*dirfd, name, flags);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", shown,
			 strerror(errno));
		return -1;
	}
	if (check_dir(fd, shown, last, err, errlen)) {
		close(fd);
		return -1;
	}
	close(*dirfd);
	*dirfd = fd;
	return 0;
}

int private_dir_open(const char *path, mode_t mode, char *err, size_t errlen)
{
	char buf[PATH_MAX], shown[PATH_MAX], *save = NULL, *name[PATH_MAX / 2];
	unsigned n = 0;
	int fd;

	if (strlen(path) >= sizeof(buf) || !path[0]) {
		snprintf(err, errlen, "bad directory name '%.200s'", path);
		return -1;
	}
	strcpy(buf, path);
	for (char *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		if (!strcmp(c, ".."))  {
			snprintf(err, errlen, "refusing %s: name moverd's "
				 "directories without '..'", path);
			return -1;
		}
		if (strcmp(c, "."))
			name[n++] = c;
	}
	fd = open(path[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	if (n == 0) { /* "/" or the working directory itself */
		if (check_dir(fd, path, true, err, errlen)) {
			close(fd);
			return -1;
		}
		return fd;
	}
	strcpy(shown, path[0] == '/' ? "/" : "");
	for (unsigned i = 0; i < n; i++) {
		snprintf(shown + strlen(shown), sizeof(shown) - strlen(shown),
			 "%s%s", i ? "/" : "", name[i]);
		if (step(&fd, name[i], shown, i == n - 1, mode, err, errlen)) {
			close(fd);
			return -1;
		}
	}
	return fd;
}

int private_file_check(int fd, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st)) {
		snprintf(err, errlen, "cannot stat: %s", strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 022)) {
		snprintf(err, errlen, "not a regular file of uid %u that no one "
			 "else can write (%s, uid %u, mode %04o)",
			 (unsigned)geteuid(), S_ISREG(st.st_mode) ? "regular" :
			 "not regular", (unsigned)st.st_uid,
			 (unsigned)(st.st_mode & 07777));
		return -1;
	}
	return 0;
}
