/* sha256_openssl.c - OpenSSL's SHA-256 compression (SHA extensions, AVX2 or
 * SSSE3 as the CPU has them, chosen by libcrypto at run time) installed as
 * pt_sha256's block function (safetensors.c does so at load, so every
 * program that writes or checks checkpoints has it). libpipeclient keeps the
 * portable one and so needs no libcrypto.
 *
 * The EVP interface hashes whole messages only; pt_sha256_ctx is a plain
 * value that callers copy, so the state is handed to SHA256_Update (whole
 * blocks, nothing buffered) and taken back. SHA256_Update is deprecated in
 * OpenSSL 3 but kept; no other public entry compresses blocks.
 */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <string.h>

#include "sha256.h"

_Static_assert(sizeof(SHA_LONG) == 4, "SHA_LONG is 32 bits");

static void openssl_blocks(uint32_t h[8], const uint8_t *p, size_t n)
{
	SHA256_CTX c;
	memset(&c, 0, sizeof(c));
	memcpy(c.h, h, 32);
	c.md_len = SHA256_DIGEST_LENGTH;
	SHA256_Update(&c, p, n * 64);
	memcpy(h, c.h, 32);
}

void pt_sha256_use_openssl(void)
{
	pt_sha256_set_blocks(openssl_blocks, "openssl");
	pt_sha256_set_pair(pt_sha256_ni_pair(), "sha-ni");
}
