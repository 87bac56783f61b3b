/*
 * moverd/auth.c - the peer key and the hello's proofs (see auth.h).
 * libsodium: a small, well-kept library whose primitives have one call
 * each, constant-time comparison and zeroing included, and a Debian package.
 */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char label_init[] = "flowmover peer hello v1: initiator";
static const char label_resp[] = "flowmover peer hello v1: responder";
static const char label_id[] = "flowmover peer key id v1";

int auth_init(void)
{
	return sodium_init() < 0 ? -1 : 0;
}

static void key_id(struct auth_key *k)
{
	uint8_t h[AUTH_ID_CHARS / 2];

	crypto_generichash(h, sizeof(h), (const uint8_t *)label_id,
			   sizeof(label_id) - 1, k->key, sizeof(k->key));
	sodium_bin2hex(k->id, sizeof(k->id), h, sizeof(h));
}

/* A secret's file: regular, owned by root or by us, private to its owner;
 * its size in *size. */
static int check_secret_file(int fd, const char *path, const char *what,
			     off_t *size, char *err, size_t cap)
{
	struct stat st;

	if (fstat(fd, &st)) {
		snprintf(err, cap, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, cap, "%s is not a regular file", path);
		return -EINVAL;
	}
	if (st.st_uid != 0 && st.st_uid != geteuid()) {
		snprintf(err, cap, "%s belongs to uid %u, not to root or to "
			 "moverd's user", path, (unsigned)st.st_uid);
		return -EPERM;
	}
	if (st.st_mode & 077) {
		snprintf(err, cap, "%s has mode %04o: a %s must be readable "
			 "by its owner only (chmod 600 %s)", path,
			 (unsigned)(st.st_mode & 07777), what, path);
		return -EPERM;
	}
	*size = st.st_size;
	return 0;
}

static int check_key_file(int fd, const char *path, char *err, size_t cap)
{
	off_t size;
	int rc = check_secret_file(fd, path, "key", &size, err, cap);

	if (rc)
		return rc;
	if (size != AUTH_KEY_BYTES) {
		snprintf(err, cap, "%s holds %lld bytes, a key is %u random "
			 "bytes (moverctl keygen FILE)", path,
			 (long long)size, AUTH_KEY_BYTES);
		return -EINVAL;
	}
	return 0;
}

/* Open a secret's file, not through a link; the fd, or a negative errno
 * with a sentence in err. */
static int open_secret(const char *path, const char *what, char *err,
		       size_t cap)
{
	/* O_NONBLOCK: a FIFO there would hang the open; fstat refuses it */
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK),
	    rc;

	if (fd >= 0)
		return fd;
	rc = -errno;
	if (rc == -ELOOP) /* O_NOFOLLOW */
		snprintf(err, cap, "%s is a symbolic link: give the %s file "
			 "itself", path, what);
	else
		snprintf(err, cap, "%s: %s", path, strerror(errno));
	return rc;
}

int auth_load_key(const char *path, struct auth_key *k, char *err,
		  size_t cap)
{
	int fd = open_secret(path, "key", err, cap), rc;
	ssize_t n;

	if (fd < 0)
		return fd;
	rc = check_key_file(fd, path, err, cap);
	if (!rc) {
		n = read(fd, k->key, sizeof(k->key));
		if (n != (ssize_t)sizeof(k->key)) {
			snprintf(err, cap, "%s: short read", path);
			rc = -EIO;
		}
	}
	close(fd);
	if (rc) {
		auth_forget(k);
		return rc;
	}
	key_id(k);
	return 0;
}

/* 16 to AUTH_TOKEN_MAX printable characters, no space. */
static bool token_valid(const char *tok, size_t len)
{
	if (len < AUTH_TOKEN_MIN || len > AUTH_TOKEN_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if (tok[i] <= ' ' || tok[i] > '~')
			return false;
	return true;
}

/* The hash keeps copies of its input's words on the stack below us:
 * cleared too, so that only the hash stays (STACK_WIPE covers BLAKE2b's
 * frames many times over). */
#define STACK_WIPE 8192u

static void token_hash(const char *tok, size_t len, uint8_t out[32])
{
	crypto_generichash(out, 32, (const uint8_t *)tok, len, NULL, 0);
	sodium_stackzero(STACK_WIPE);
}

int auth_load_token(const char *path, struct auth_token *t, char *err,
		    size_t cap)
{
	char buf[AUTH_TOKEN_MAX + 2];
	int fd = open_secret(path, "token", err, cap), rc;
	off_t size;
	ssize_t n = -1;
	size_t len;

	if (fd < 0)
		return fd;
	rc = check_secret_file(fd, path, "token", &size, err, cap);
	if (!rc && size >= 1 && size <= (off_t)sizeof(buf))
		n = read(fd, buf, sizeof(buf));
	close(fd);
	if (rc)
		return rc;
	len = n == size ? (size_t)n : 0; /* all of it, or nothing */
	if (len && buf[len - 1] == '\n')
		len--; /* one line: its end is not the token's */
	if (len && buf[len - 1] == '\r')
		len--;
	if (token_valid(buf, len))
		token_hash(buf, len, t->hash);
	else
		rc = -EINVAL;
	sodium_memzero(buf, sizeof(buf));
	if (rc)
		snprintf(err, cap, "%s: a token is one line of %u to %u "
			 "printable characters without spaces (say, "
			 "openssl rand -hex 32)", path, AUTH_TOKEN_MIN,
			 AUTH_TOKEN_MAX);
	return rc;
}

bool auth_token_ok(const struct auth_token *t, const char *given,
		   size_t len)
{
	uint8_t h[32];
	bool ok;

	/* hashes of equal length compared in constant time: neither the
	 * token's bytes nor its length show in the time a refusal takes */
	token_hash(given, len, h);
	ok = crypto_verify_32(h, t->hash) == 0;
	sodium_memzero(h, sizeof(h));
	return ok;
}

void auth_wipe(void *p, size_t len)
{
	sodium_memzero(p, len);
}

void auth_nonce(uint8_t out[AUTH_NONCE_BYTES])
{
	randombytes_buf(out, AUTH_NONCE_BYTES);
}

static void mac_field(crypto_auth_hmacsha512256_state *st, const void *p,
		      size_t len)
{
	uint8_t n[8];

	for (int i = 0; i < 8; i++) /* length first: fields cannot slide */
		n[i] = (uint8_t)((uint64_t)len >> (8 * i));
	crypto_auth_hmacsha512256_update(st, n, sizeof(n));
	crypto_auth_hmacsha512256_update(st, p, len);
}

void auth_proof(const struct auth_key *k, enum auth_role role,
		const uint8_t init_nonce[AUTH_NONCE_BYTES],
		const uint8_t resp_nonce[AUTH_NONCE_BYTES],
		const char *init_node, const char *resp_node,
		const char *dialed, uint8_t out[AUTH_PROOF_BYTES])
{
	const char *label = role == AUTH_INITIATOR ? label_init : label_resp;
	crypto_auth_hmacsha512256_state st;

	crypto_auth_hmacsha512256_init(&st, k->key, sizeof(k->key));
	mac_field(&st, label, strlen(label));
	mac_field(&st, init_nonce, AUTH_NONCE_BYTES);
	mac_field(&st, resp_nonce, AUTH_NONCE_BYTES);
	mac_field(&st, init_node, strlen(init_node));
	mac_field(&st, resp_node, strlen(resp_node));
	mac_field(&st, dialed, strlen(dialed));
	crypto_auth_hmacsha512256_final(&st, out);
	sodium_memzero(&st, sizeof(st));
}

bool auth_check(const struct auth_key *k, enum auth_role role,
		const uint8_t init_nonce[AUTH_NONCE_BYTES],
		const uint8_t resp_nonce[AUTH_NONCE_BYTES],
		const char *init_node, const char *resp_node,
		const char *dialed, const uint8_t *proof, size_t len)
{
	uint8_t want[AUTH_PROOF_BYTES];
	bool ok;

	if (len != AUTH_PROOF_BYTES)
		return false;
	auth_proof(k, role, init_nonce, resp_nonce, init_node, resp_node,
		   dialed, want);
	ok = crypto_verify_32(want, proof) == 0;
	sodium_memzero(want, sizeof(want));
	return ok;
}

void auth_forget(struct auth_key *k)
{
	sodium_memzero(k, sizeof(*k));
}
