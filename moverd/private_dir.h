/*
 * moverd/private_dir.h - the directories moverd writes as root (the
 * socket's, the state directory), opened so that no other user can make
 * it write elsewhere, and the checks of the files it reads back.
 *
 * A directory is moverd's when it is a real directory (not a symlink),
 * owned by moverd's euid or by root, and writable by no one else; every
 * directory above it must be owned likewise and writable by no one else,
 * unless it is root's and sticky (like /tmp: others may add entries, but
 * not move or remove ours).  Files are then opened relative to the
 * directory's fd, with O_NOFOLLOW.
 */
#ifndef MOVERD_PRIVATE_DIR_H
#define MOVERD_PRIVATE_DIR_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Open (creating, with exactly `mode`, what is missing; parents 0755) the
 * directory `path` after checking it and every directory above it.  A
 * directory fd (O_RDONLY, close-on-exec), or -1 with a sentence in err
 * naming the path, what was found and what to do.
 */
int private_dir_open(const char *path, mode_t mode, char *err, size_t errlen);

/*
 * Is fd (just opened with O_NOFOLLOW) a regular file owned by moverd's
 * euid and writable by no one else?  0, or -1 with the reason in err.
 */
int private_file_check(int fd, char *err, size_t errlen);

#endif
