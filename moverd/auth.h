/*
 * moverd/auth.h - peer daemons prove they hold the cluster's key.
 *
 * A challenge-response in the hello (HMAC-SHA-512-256, libsodium's
 * crypto_auth): the connecting daemon (initiator) sends a fresh nonce and
 * its node name; the accepting one (responder) answers with its own nonce,
 * its name and a proof; the initiator checks it and sends its own proof.
 * A proof is the MAC, under the shared key, of the role, both nonces, both
 * node names and the address the initiator dialed (each length-prefixed).
 * The role label makes a proof useless in the other direction, fresh
 * nonces on both sides make an old one useless (a replayed hello fails),
 * and the address makes a relay fail: a party at another address that
 * forwards the hellos (so that it owns the connection once both sides
 * have proved themselves to each other through it) gets proofs over its
 * own address, which the daemon it forwards to refuses (peer.c,
 * dialed_mismatch).  This does not protect the frames after the
 * handshake from an attacker on the path to the real address: see
 * docs/security-auth.md.
 *
 * Also the bearer token of `--metrics-token` (metrics_http.c): its file
 * checked as the key's is, only its hash kept, compared in constant time.
 */
#ifndef MOVERD_AUTH_H
#define MOVERD_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_KEY_BYTES   32u
#define AUTH_NONCE_BYTES 32u
#define AUTH_PROOF_BYTES 32u
#define AUTH_ID_CHARS    16u  /* the key's id: hex of a keyed hash */

enum auth_role { AUTH_INITIATOR, AUTH_RESPONDER };

struct auth_key {
	uint8_t key[AUTH_KEY_BYTES];
	char id[AUTH_ID_CHARS + 1];
};

/* A bearer token that HTTP clients must show (moverd --metrics-token):
 * only its hash is kept. */
#define AUTH_TOKEN_MIN 16u
#define AUTH_TOKEN_MAX 512u
struct auth_token {
	uint8_t hash[32];
};

/* libsodium's initialisation; 0 or -1. */
int auth_init(void);

/*
 * Read a key file: exactly 32 bytes, a regular file (not a link) owned by
 * root or by us, with no permission for group or others.  0, or a negative
 * errno with a sentence in err.
 */
int auth_load_key(const char *path, struct auth_key *k, char *err,
		  size_t cap);

/* A fresh random nonce. */
void auth_nonce(uint8_t out[AUTH_NONCE_BYTES]);

/* The proof of `role` for one handshake. */
void auth_proof(const struct auth_key *k, enum auth_role role,
		const uint8_t init_nonce[AUTH_NONCE_BYTES],
		const uint8_t resp_nonce[AUTH_NONCE_BYTES],
		const char *init_node, const char *resp_node,
		const char *dialed, uint8_t out[AUTH_PROOF_BYTES]);

/* Does `proof` (len bytes) prove `role`?  Compared in constant time. */
bool auth_check(const struct auth_key *k, enum auth_role role,
		const uint8_t init_nonce[AUTH_NONCE_BYTES],
		const uint8_t resp_nonce[AUTH_NONCE_BYTES],
		const char *init_node, const char *resp_node,
		const char *dialed, const uint8_t *proof, size_t len);

/*
 * Read a token file: a regular file (not a link) owned by root or by us,
 * with no permission for group or others, holding one line of
 * AUTH_TOKEN_MIN to AUTH_TOKEN_MAX printable characters without spaces.
 * 0, or a negative errno with a sentence in err.
 */
int auth_load_token(const char *path, struct auth_token *t, char *err,
		    size_t cap);

/* Is given (len bytes) the token?  Compared in constant time. */
bool auth_token_ok(const struct auth_token *t, const char *given,
		   size_t len);

/* Zero len bytes at p in a way the compiler keeps (a secret's copy). */
void auth_wipe(void *p, size_t len);

/* Forget the key (zeroed in a way the compiler keeps). */
void auth_forget(struct auth_key *k);

#endif
