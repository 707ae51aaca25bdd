/* nh.h - NH, the universal hash that compresses a frame before its MAC.
 *
 * NH (Black, Halevi, Krawczyk, Krovetz, Rogaway: "UMAC: Fast and Secure
 * Message Authentication", CRYPTO '99) with 32-bit words and the Toeplitz
 * extension to two passes. The message is cut into 1024-byte chunks, the last
 * one zero-padded; each chunk of little-endian u32 words w[0..256) gives
 *
 *   a = sum over even i of (w[i] + k[i]) * (w[i+1] + k[i+1])
 *   b = sum over even i of (w[i] + k[i+2]) * (w[i+1] + k[i+3])
 *
 * (additions mod 2^32, products and sums mod 2^64), written as le64(a),
 * le64(b): 16 bytes per chunk. For a secret uniformly random key, two
 * different messages of the same padded length collide with probability at
 * most 2^-64, so a MAC over the chunks' outputs and the message length is a
 * MAC over the message (the UMAC construction). AVX-512F or AVX2 runs it
 * near memory speed; the portable code gives the same bytes; the best the
 * CPU has is chosen at run time.
 */
#ifndef PT_NH_H
#define PT_NH_H

#include <stddef.h>
#include <stdint.h>

#define PT_NH_CHUNK     1024                  /* message bytes per output */
#define PT_NH_OUT       16                    /* output bytes per chunk */
#define PT_NH_KEY_WORDS (PT_NH_CHUNK / 4 + 2) /* u32 key words */
#define PT_NH_KEY_BYTES (PT_NH_KEY_WORDS * 4)

/* pt_nh_outputs returns how many output bytes n message bytes give. */
static inline size_t pt_nh_outputs(size_t n)
{
	return (n + PT_NH_CHUNK - 1) / PT_NH_CHUNK * PT_NH_OUT;
}

/* pt_nh hashes msg[0..n) under key (PT_NH_KEY_WORDS words, host order) into
 * out[0..pt_nh_outputs(n)). */
void pt_nh(const uint32_t *key, const uint8_t *msg, size_t n, uint8_t *out);

/* pt_nh_copy copies `chunks` whole chunks from src to dst and hashes them on
 * the way (one read of src), writing 16 bytes per chunk to out: the same
 * bytes pt_nh gives for them. */
void pt_nh_copy(const uint32_t *key, uint8_t *dst, const uint8_t *src, size_t chunks, uint8_t *out);

/* pt_nh_backend names the code pt_nh runs ("avx512", "avx2", "portable");
 * pt_nh_set_backend picks one ("avx512" and "avx2" only where the CPU has
 * them; NULL: the best), for tests and benchmarks. Returns 0, or -1 if
 * unavailable. */
const char *pt_nh_backend(void);
int pt_nh_set_backend(const char *name);

#endif
