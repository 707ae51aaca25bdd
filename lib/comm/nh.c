/* nh.c - NH with 32-bit words, two Toeplitz passes (see nh.h). */
#include "nh.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NH_X86 1
#endif

/* Hash the chunk at p; with d, also copy it there (one pass over p). */
typedef void (*nh_chunk_fn)(const uint32_t *key, const uint8_t *p, uint8_t *d, uint64_t out[2]);

static uint32_t load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void chunk_portable(const uint32_t *k, const uint8_t *p, uint8_t *d, uint64_t out[2])
{
	uint64_t a = 0, b = 0;

	if (d != NULL)
		memcpy(d, p, PT_NH_CHUNK);
	for (int i = 0; i < PT_NH_CHUNK / 4; i += 2) {
		uint32_t w0 = load_le32(p + 4 * i), w1 = load_le32(p + 4 * i + 4);
		a += (uint64_t)(uint32_t)(w0 + k[i]) * (uint32_t)(w1 + k[i + 1]);
		b += (uint64_t)(uint32_t)(w0 + k[i + 2]) * (uint32_t)(w1 + k[i + 3]);
	}
	out[0] = a;
	out[1] = b;
}

#ifdef NH_X86
/* Eight words a step per pass: vpmuludq multiplies the even words of
 * (w + k) by the odd ones (shifted down), four 64-bit products per lane set.
 * x86 is little-endian, so loads give the words as the portable code reads
 * them. */
__attribute__((target("avx2"))) static inline void
chunk_avx2_body(const uint32_t *k, const uint8_t *p, uint8_t *d, uint64_t out[2], const bool copy)
{
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
	uint64_t sa[4], sb[4];

	for (int i = 0; i < PT_NH_CHUNK / 4; i += 16) {
		__m256i x = _mm256_loadu_si256((const __m256i *)(p + 4 * i));
		__m256i y = _mm256_loadu_si256((const __m256i *)(p + 4 * i + 32));
		if (copy) {
			_mm256_storeu_si256((__m256i *)(d + 4 * i), x);
			_mm256_storeu_si256((__m256i *)(d + 4 * i + 32), y);
		}
		__m256i t = _mm256_add_epi32(x, _mm256_loadu_si256((const __m256i *)(k + i)));
		__m256i u = _mm256_add_epi32(y, _mm256_loadu_si256((const __m256i *)(k + i + 8)));
		a0 = _mm256_add_epi64(a0, _mm256_mul_epu32(t, _mm256_srli_epi64(t, 32)));
		a1 = _mm256_add_epi64(a1, _mm256_mul_epu32(u, _mm256_srli_epi64(u, 32)));
		t = _mm256_add_epi32(x, _mm256_loadu_si256((const __m256i *)(k + i + 2)));
		u = _mm256_add_epi32(y, _mm256_loadu_si256((const __m256i *)(k + i + 10)));
		b0 = _mm256_add_epi64(b0, _mm256_mul_epu32(t, _mm256_srli_epi64(t, 32)));
		b1 = _mm256_add_epi64(b1, _mm256_mul_epu32(u, _mm256_srli_epi64(u, 32)));
	}
	_mm256_storeu_si256((__m256i *)sa, _mm256_add_epi64(a0, a1));
	_mm256_storeu_si256((__m256i *)sb, _mm256_add_epi64(b0, b1));
	out[0] = sa[0] + sa[1] + sa[2] + sa[3];
	out[1] = sb[0] + sb[1] + sb[2] + sb[3];
}

/* Two instances, so that the copy test is not in the loop. */
__attribute__((target("avx2"))) static void chunk_avx2(const uint32_t *k, const uint8_t *p,
                                                       uint8_t *d, uint64_t out[2])
{
	if (d != NULL)
		chunk_avx2_body(k, p, d, out, true);
	else
		chunk_avx2_body(k, p, NULL, out, false);
}

/* The same with sixteen words a step per register (AVX-512F): sums mod 2^64
 * in another order, so the same bytes. */
__attribute__((target("avx512f"))) static inline void
chunk_avx512_body(const uint32_t *k, const uint8_t *p, uint8_t *d, uint64_t out[2], const bool copy)
{
	__m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
	uint64_t sa[8], sb[8];

	for (int i = 0; i < PT_NH_CHUNK / 4; i += 32) {
		__m512i x = _mm512_loadu_si512((const void *)(p + 4 * i));
		__m512i y = _mm512_loadu_si512((const void *)(p + 4 * i + 64));
		if (copy) {
			_mm512_storeu_si512((void *)(d + 4 * i), x);
			_mm512_storeu_si512((void *)(d + 4 * i + 64), y);
		}
		__m512i t = _mm512_add_epi32(x, _mm512_loadu_si512((const void *)(k + i)));
		__m512i u = _mm512_add_epi32(y, _mm512_loadu_si512((const void *)(k + i + 16)));
		a0 = _mm512_add_epi64(a0, _mm512_mul_epu32(t, _mm512_srli_epi64(t, 32)));
		a1 = _mm512_add_epi64(a1, _mm512_mul_epu32(u, _mm512_srli_epi64(u, 32)));
		t = _mm512_add_epi32(x, _mm512_loadu_si512((const void *)(k + i + 2)));
		u = _mm512_add_epi32(y, _mm512_loadu_si512((const void *)(k + i + 18)));
		b0 = _mm512_add_epi64(b0, _mm512_mul_epu32(t, _mm512_srli_epi64(t, 32)));
		b1 = _mm512_add_epi64(b1, _mm512_mul_epu32(u, _mm512_srli_epi64(u, 32)));
	}
	/* Not _mm512_reduce_add_epi64: GCC 12 sums its lanes as signed long long
	 * in C, which wraps (undefined; UBSan stops there). */
	_mm512_storeu_si512((void *)sa, _mm512_add_epi64(a0, a1));
	_mm512_storeu_si512((void *)sb, _mm512_add_epi64(b0, b1));
	out[0] = out[1] = 0;
	for (int j = 0; j < 8; j++) {
		out[0] += sa[j];
		out[1] += sb[j];
	}
}

__attribute__((target("avx512f"))) static void chunk_avx512(const uint32_t *k, const uint8_t *p,
                                                            uint8_t *d, uint64_t out[2])
{
	if (d != NULL)
		chunk_avx512_body(k, p, d, out, true);
	else
		chunk_avx512_body(k, p, NULL, out, false);
}
#endif

static bool have_avx512(void)
{
#ifdef NH_X86
	return __builtin_cpu_supports("avx512f");
#else
	return false;
#endif
}

static bool have_avx2(void)
{
#ifdef NH_X86
	return __builtin_cpu_supports("avx2");
#else
	return false;
#endif
}

static _Atomic(nh_chunk_fn) chosen;

static nh_chunk_fn impl(void)
{
	nh_chunk_fn f = atomic_load_explicit(&chosen, memory_order_relaxed);

	if (f == NULL) {
		f = chunk_portable;
#ifdef NH_X86
		if (have_avx512())
			f = chunk_avx512;
		else if (have_avx2())
			f = chunk_avx2;
#endif
		atomic_store_explicit(&chosen, f, memory_order_relaxed);
	}
	return f;
}

void pt_nh(const uint32_t *key, const uint8_t *msg, size_t n, uint8_t *out)
{
	nh_chunk_fn f = impl();
	uint64_t r[2];
	size_t off = 0;

	for (; n - off >= PT_NH_CHUNK; off += PT_NH_CHUNK, out += PT_NH_OUT) {
		f(key, msg + off, NULL, r);
		store_le64(out, r[0]);
		store_le64(out + 8, r[1]);
	}
	if (off < n) {
		uint8_t last[PT_NH_CHUNK] = {0};
		memcpy(last, msg + off, n - off);
		f(key, last, NULL, r);
		store_le64(out, r[0]);
		store_le64(out + 8, r[1]);
	}
}

void pt_nh_copy(const uint32_t *key, uint8_t *dst, const uint8_t *src, size_t chunks, uint8_t *out)
{
	nh_chunk_fn f = impl();
	uint64_t r[2];

	for (size_t i = 0; i < chunks; i++, out += PT_NH_OUT) {
		f(key, src + i * PT_NH_CHUNK, dst + i * PT_NH_CHUNK, r);
		store_le64(out, r[0]);
		store_le64(out + 8, r[1]);
	}
}

const char *pt_nh_backend(void)
{
	nh_chunk_fn f = impl();
#ifdef NH_X86
	if (f == chunk_avx512)
		return "avx512";
	if (f == chunk_avx2)
		return "avx2";
#endif
	(void)f;
	return "portable";
}

int pt_nh_set_backend(const char *name)
{
	nh_chunk_fn f;

	if (name == NULL) {
		atomic_store(&chosen, NULL);
		impl();
		return 0;
	}
	if (strcmp(name, "portable") == 0) {
		f = chunk_portable;
#ifdef NH_X86
	} else if (strcmp(name, "avx2") == 0 && have_avx2()) {
		f = chunk_avx2;
	} else if (strcmp(name, "avx512") == 0 && have_avx512()) {
		f = chunk_avx512;
#endif
	} else {
		return -1;
	}
	atomic_store(&chosen, f);
	return 0;
}
