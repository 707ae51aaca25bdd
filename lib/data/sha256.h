/* sha256.h - SHA-256 (FIPS 180-4), streaming and one-shot.
 *
 * Used for checkpoint checksums; not constant-time and not meant for secrets.
 * A context is a plain value: copy it to hash a common prefix twice.
 */
#ifndef PT_SHA256_H
#define PT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define PT_SHA256_BYTES 32
#define PT_SHA256_HEX   65 /* 64 hex digits and a NUL */

typedef struct pt_sha256_ctx {
	uint32_t h[8];
	uint64_t nbytes; /* message length so far */
	uint8_t buf[64]; /* partial block */
	size_t nbuf;
} pt_sha256_ctx;

/* pt_sha256_init starts a new message. */
void pt_sha256_init(pt_sha256_ctx *s);

/* pt_sha256_update appends n bytes of data (n may be 0). */
void pt_sha256_update(pt_sha256_ctx *s, const void *data, size_t n);

/* pt_sha256_final writes the 32-byte digest; s must be re-initialised before reuse. */
void pt_sha256_final(pt_sha256_ctx *s, uint8_t out[PT_SHA256_BYTES]);

/* pt_sha256 hashes one buffer. */
void pt_sha256(const void *data, size_t n, uint8_t out[PT_SHA256_BYTES]);

/* pt_sha256_blocks_fn compresses n 64-byte blocks at p into the state h.
 * The portable one is the default; pt_sha256_set_blocks installs another
 * (a program linking libpipetrain's safetensors code has OpenSSL's, which
 * uses the CPU's SHA extensions where it has them, from its start); pt_sha256_backend names the one
 * in use ("portable", "openssl"). Digests are the same whichever runs. */
typedef void (*pt_sha256_blocks_fn)(uint32_t h[8], const uint8_t *p, size_t n);
void pt_sha256_set_blocks(pt_sha256_blocks_fn fn, const char *name);
const char *pt_sha256_backend(void);

/* pt_sha256_update2 appends n bytes at a to s and n bytes at b to t: the
 * same as two pt_sha256_update calls, with the whole blocks of the two
 * messages compressed together by the pair function (two chains
 * interleaved: about 1.45 times the bytes per second with the SHA
 * extensions). s and t must be different contexts. */
void pt_sha256_update2(pt_sha256_ctx *s, const void *a, pt_sha256_ctx *t, const void *b, size_t n);

/* pt_sha256_blocks2_fn compresses n blocks at p into h and n at q into k.
 * pt_sha256_set_pair installs one (NULL: the block function twice, the
 * default); pt_sha256_pair_backend names it ("serial", "sha-ni").
 * pt_sha256_ni_pair is the SHA extensions' pair where the CPU has them,
 * else NULL; pt_sha256_use_openssl installs it. */
typedef void (*pt_sha256_blocks2_fn)(uint32_t h[8], const uint8_t *p, uint32_t k[8],
                                     const uint8_t *q, size_t n);
void pt_sha256_set_pair(pt_sha256_blocks2_fn fn, const char *name);
const char *pt_sha256_pair_backend(void);
pt_sha256_blocks2_fn pt_sha256_ni_pair(void);

/* pt_sha256_use_openssl installs OpenSSL's compression and, where the CPU
 * has the SHA extensions, pt_sha256_ni_pair (libpipetrain only). */
void pt_sha256_use_openssl(void);

/* pt_sha256_portable_blocks is the portable compression (for tests). */
void pt_sha256_portable_blocks(uint32_t h[8], const uint8_t *p, size_t n);

/* The 64 round constants (FIPS 180-4 4.2.2), 16-byte aligned. */
extern const uint32_t pt_sha256_K[64];

/* pt_sha256_hex formats a digest as 64 lowercase hex digits and a NUL. */
void pt_sha256_hex(const uint8_t digest[PT_SHA256_BYTES], char out[PT_SHA256_HEX]);

#endif
