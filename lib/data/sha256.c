/* sha256.c - SHA-256 after FIPS 180-4: streaming over a block function,
 * portable by default (pt_sha256_set_blocks installs a faster one). */
#include "sha256.h"

#include <string.h>

const uint32_t pt_sha256_K[64] __attribute__((aligned(16))) = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static void compress(uint32_t h[8], const uint8_t block[64])
{
	uint32_t w[64], a, b, c, d, e, f, g, k;

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
		       (uint32_t)block[4 * i + 2] << 8 | (uint32_t)block[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
		              pt_sha256_K[i] + w[i];
		uint32_t t2 =
		    (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
		k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
	}
	h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void pt_sha256_portable_blocks(uint32_t h[8], const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		compress(h, p + 64 * i);
}

static pt_sha256_blocks_fn blocks = pt_sha256_portable_blocks;
static const char *blocks_name = "portable";

void pt_sha256_set_blocks(pt_sha256_blocks_fn fn, const char *name)
{
	blocks = fn ? fn : pt_sha256_portable_blocks;
	blocks_name = fn ? name : "portable";
}

const char *pt_sha256_backend(void)
{
	return blocks_name;
}

static pt_sha256_blocks2_fn pair;
static const char *pair_name = "serial";

void pt_sha256_set_pair(pt_sha256_blocks2_fn fn, const char *name)
{
	pair = fn;
	pair_name = fn ? name : "serial";
}

const char *pt_sha256_pair_backend(void)
{
	return pair_name;
}

void pt_sha256_init(pt_sha256_ctx *s)
{
	static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	memcpy(s->h, iv, sizeof(iv));
	s->nbytes = 0;
	s->nbuf = 0;
}

void pt_sha256_update(pt_sha256_ctx *s, const void *data, size_t n)
{
	const uint8_t *p = data;

	s->nbytes += n;
	if (s->nbuf > 0) {
		size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
		memcpy(s->buf + s->nbuf, p, take);
		s->nbuf += take, p += take, n -= take;
		if (s->nbuf < 64)
			return;
		blocks(s->h, s->buf, 1);
		s->nbuf = 0;
	}
	if (n >= 64) {
		blocks(s->h, p, n / 64);
		p += n / 64 * 64;
		n %= 64;
	}
	memcpy(s->buf, p, n);
	s->nbuf = n;
}

void pt_sha256_update2(pt_sha256_ctx *s, const void *a, pt_sha256_ctx *t, const void *b, size_t n)
{
	const uint8_t *p = a, *q = b;
	size_t ks = (64 - s->nbuf) % 64, kt = (64 - t->nbuf) % 64, nb;

	/* Fill each partial block alone; then the two streams are at block
	 * boundaries, at different offsets into their data. */
	ks = ks < n ? ks : n;
	kt = kt < n ? kt : n;
	pt_sha256_update(s, p, ks);
	pt_sha256_update(t, q, kt);
	nb = (n - (ks > kt ? ks : kt)) / 64;
	if (nb > 0 && s->nbuf == 0 && t->nbuf == 0) {
		if (pair != NULL) {
			pair(s->h, p + ks, t->h, q + kt, nb);
		} else {
			blocks(s->h, p + ks, nb);
			blocks(t->h, q + kt, nb);
		}
		s->nbytes += 64 * nb, t->nbytes += 64 * nb;
		ks += 64 * nb, kt += 64 * nb;
	}
	pt_sha256_update(s, p + ks, n - ks);
	pt_sha256_update(t, q + kt, n - kt);
}

void pt_sha256_final(pt_sha256_ctx *s, uint8_t out[PT_SHA256_BYTES])
{
	uint64_t bits = s->nbytes * 8;

	s->buf[s->nbuf++] = 0x80;
	if (s->nbuf > 56) {
		memset(s->buf + s->nbuf, 0, 64 - s->nbuf);
		blocks(s->h, s->buf, 1);
		s->nbuf = 0;
	}
	memset(s->buf + s->nbuf, 0, 56 - s->nbuf);
	for (int i = 0; i < 8; i++)
		s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
	blocks(s->h, s->buf, 1);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(s->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)s->h[i];
	}
}

void pt_sha256(const void *data, size_t n, uint8_t out[PT_SHA256_BYTES])
{
	pt_sha256_ctx s;
	pt_sha256_init(&s);
	pt_sha256_update(&s, data, n);
	pt_sha256_final(&s, out);
}

void pt_sha256_hex(const uint8_t digest[PT_SHA256_BYTES], char out[PT_SHA256_HEX])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < PT_SHA256_BYTES; i++) {
		out[2 * i] = hex[digest[i] >> 4];
		out[2 * i + 1] = hex[digest[i] & 15];
	}
	out[64] = '\0';
}
