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

static int check_key_file(int fd, const char *path, char *err, size_t cap)
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
		snprintf(err, cap, "%s has mode %04o: a key must be readable "
			 "by its owner only (chmod 600 %s)", path,
			 (unsigned)(st.st_mode & 07777), path);
		return -EPERM;
	}
	if (st.st_size != AUTH_KEY_BYTES) {
		snprintf(err, cap, "%s holds %lld bytes, a key is %u random "
			 "bytes (moverctl keygen FILE)", path,
			 (long long)st.st_size, AUTH_KEY_BYTES);
		return -EINVAL;
	}
	return 0;
}

int auth_load_key(const char *path, struct auth_key *k, char *err,
		  size_t cap)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc;
	ssize_t n;

	if (fd < 0) {
		rc = -errno;
		if (rc == -ELOOP) /* O_NOFOLLOW */
			snprintf(err, cap, "%s is a symbolic link: give the "
				 "key file itself", path);
		else
			snprintf(err, cap, "%s: %s", path, strerror(errno));
		return rc;
	}
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
