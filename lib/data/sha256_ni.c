/* sha256_ni.c - two SHA-256 chains at once with the x86 SHA extensions.
 *
 * One chain is bound by sha256rnds2's latency: each pair of rounds waits for
 * the last. Two independent messages interleaved keep the unit busy, about
 * 1.45 times one chain's bytes per second on Zen 5 (3.0 against 2.07 GB/s).
 * A checkpoint has such pairs: the state file's data beside the weights
 * file's. The rounds follow the Intel SHA extensions white paper's layout
 * (state as ABEF and CDGH, the schedule in four registers). Built with
 * target attributes and chosen at run time, so the library still runs on
 * an x86-64 without them.
 */
#include "sha256.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdbool.h>

#define NI __attribute__((target("sha,sse4.1,ssse3")))

/* h[0..7] = a..h to the registers' ABEF and CDGH order, and back. */
NI static inline void load_state(const uint32_t h[8], __m128i *abef, __m128i *cdgh)
{
	__m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0xB1);
	__m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(h + 4)), 0x1B);
	*abef = _mm_alignr_epi8(dcba, efgh, 8);
	*cdgh = _mm_blend_epi16(efgh, dcba, 0xF0);
}

NI static inline void store_state(uint32_t h[8], __m128i abef, __m128i cdgh)
{
	__m128i feba = _mm_shuffle_epi32(abef, 0x1B);
	__m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
	_mm_storeu_si128((__m128i *)h, _mm_blend_epi16(feba, dchg, 0xF0));
	_mm_storeu_si128((__m128i *)(h + 4), _mm_alignr_epi8(dchg, feba, 8));
}

/* ROUNDS4 runs rounds 4g..4g+3 on one chain (state s0 = ABEF, s1 = CDGH,
 * schedule words in m[0..3], m[g % 4] holding W[4g..4g+3]) and extends the
 * schedule: msg1 starts W[4g+12..] (g = 1..12), msg2 finishes W[4g+4..]
 * (g = 3..14). g is a constant, so the branches fold away. */
#define ROUNDS4(g, s0, s1, m)                                                                      \
	do {                                                                                       \
		__m128i w_ = _mm_add_epi32(                                                        \
		    m[(g)&3], _mm_load_si128((const __m128i *)(pt_sha256_K + 4 * (g))));           \
		s1 = _mm_sha256rnds2_epu32(s1, s0, w_);                                            \
		if ((g) >= 3 && (g) <= 14) {                                                       \
			__m128i t_ = _mm_alignr_epi8(m[(g)&3], m[((g) + 3) & 3], 4);               \
			m[((g) + 1) & 3] = _mm_add_epi32(m[((g) + 1) & 3], t_);                    \
			m[((g) + 1) & 3] = _mm_sha256msg2_epu32(m[((g) + 1) & 3], m[(g)&3]);       \
		}                                                                                  \
		w_ = _mm_shuffle_epi32(w_, 0x0E);                                                  \
		s0 = _mm_sha256rnds2_epu32(s0, s1, w_);                                            \
		if ((g) >= 1 && (g) <= 12)                                                         \
			m[((g) + 3) & 3] = _mm_sha256msg1_epu32(m[((g) + 3) & 3], m[(g)&3]);       \
	} while (0)

#define PAIR(g)                                                                                    \
	do {                                                                                       \
		ROUNDS4(g, a0, a1, ma);                                                            \
		ROUNDS4(g, b0, b1, mb);                                                            \
	} while (0)

NI static void ni_pair(uint32_t h[8], const uint8_t *p, uint32_t k[8], const uint8_t *q, size_t n)
{
	const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
	__m128i a0, a1, b0, b1, ma[4], mb[4];

	load_state(h, &a0, &a1);
	load_state(k, &b0, &b1);
	for (; n > 0; n--, p += 64, q += 64) {
		__m128i sa0 = a0, sa1 = a1, sb0 = b0, sb1 = b1;
		for (int i = 0; i < 4; i++) {
			ma[i] =
			    _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), swap);
			mb[i] =
			    _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(q + 16 * i)), swap);
		}
		PAIR(0);
		PAIR(1);
		PAIR(2);
		PAIR(3);
		PAIR(4);
		PAIR(5);
		PAIR(6);
		PAIR(7);
		PAIR(8);
		PAIR(9);
		PAIR(10);
		PAIR(11);
		PAIR(12);
		PAIR(13);
		PAIR(14);
		PAIR(15);
		a0 = _mm_add_epi32(a0, sa0);
		a1 = _mm_add_epi32(a1, sa1);
		b0 = _mm_add_epi32(b0, sb0);
		b1 = _mm_add_epi32(b1, sb1);
	}
	store_state(h, a0, a1);
	store_state(k, b0, b1);
}

pt_sha256_blocks2_fn pt_sha256_ni_pair(void)
{
	/* cpuid, not __builtin_cpu_supports: clang 14 does not know "sha". */
	unsigned a, b, c, d;
	bool ssse3_sse41, sha;
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return NULL;
	ssse3_sse41 = (c & (1u << 9)) && (c & (1u << 19));
	sha = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
	return ssse3_sse41 && sha ? ni_pair : NULL;
}
#else
pt_sha256_blocks2_fn pt_sha256_ni_pair(void)
{
	return NULL;
}
#endif
