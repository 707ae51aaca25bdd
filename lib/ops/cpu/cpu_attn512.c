/* cpu_attn512.c - the fp32 causal attention kernel's strip products in
 * AVX-512 registers (cpu_attention.c), in place of one sgemm call per strip
 * and product.
 *
 * At W2's shapes (context 128, head 64) each strip product is a few hundred
 * thousand flops, and a library call's set-up (dnnl_sgemm packs both
 * operands) cost as much as the product: the blocked kernel ran at about
 * half of sgemm's rate. These loops read the operands where they lie, keep
 * a 4-row tile of the result in registers, and stop at the causal edge of
 * each tile rather than the strip's: a tile of rows [i, i + 4) of a strip
 * starting at row r0 reads keys below r0 + i + 4 only.
 *
 * Every sum runs in order of its index (the key, the feature or the query),
 * with fused multiply-adds, so results do not depend on tiling or threads.
 * cpu_attn512_usable says whether this CPU and head size can take them.
 */
#include <math.h>

#include "cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define MR     4 /* rows of a register tile */
#define TILE   static inline __attribute__((always_inline, target("avx512f")))
#define AVX512 __attribute__((target("avx512f")))

bool cpu_attn512_usable(int64_t hs)
{
	return hs > 0 && hs % 16 == 0 && __builtin_cpu_supports("avx512f");
}

/* nt_tile: C (mr x 16 nv, the last vector cut to mask last) = alpha A Bt,
 * A mr x K (rows lda apart), Bt K x (16 nv) (rows ldbt apart; the whole
 * vectors are readable). */
TILE void nt_tile(const int mr, const int nv, int64_t K, const float *A, int64_t lda,
                  const float *Bt, int64_t ldbt, float alpha, float *C, int64_t ldc, __mmask16 last)
{
	__m512 acc[MR][4];
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			acc[r][v] = _mm512_setzero_ps();
	for (int64_t k = 0; k < K; k++) {
		__m512 b[4];
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			b[v] = _mm512_loadu_ps(Bt + k * ldbt + 16 * v);
#pragma GCC unroll 4
		for (int r = 0; r < mr; r++) {
			__m512 a = _mm512_set1_ps(A[r * lda + k]);
#pragma GCC unroll 4
			for (int v = 0; v < nv; v++)
				acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
		}
	}
	__m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++) {
			__m512 x = _mm512_mul_ps(acc[r][v], al);
			if (v == nv - 1)
				_mm512_mask_storeu_ps(C + r * ldc + 16 * v, last, x);
			else
				_mm512_storeu_ps(C + r * ldc + 16 * v, x);
		}
}

/* nt_cols: mr rows of C, w (1 to 64) columns. */
TILE void nt_cols(const int mr, int64_t w, int64_t K, const float *A, int64_t lda, const float *Bt,
                  int64_t ldbt, float alpha, float *C, int64_t ldc)
{
	int nv = (int)((w + 15) / 16);
	__mmask16 last = (__mmask16)(w % 16 == 0 ? 0xffffu : (1u << (w % 16)) - 1u);
	switch (nv) {
	case 1:
		nt_tile(mr, 1, K, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	case 2:
		nt_tile(mr, 2, K, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	case 3:
		nt_tile(mr, 3, K, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	default:
		nt_tile(mr, 4, K, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	}
}

/* Columns of keys (scores) and keys (products) a pass takes at once: a
 * block of 64 keys of a 64-wide head is 16 KB, kept in L1 while every row
 * tile of the strip uses it (a context of 256 is 64 KB, more than L1). */
#define KB 64

AVX512 void cpu_attn512_scores(int64_t n, int64_t r0, int64_t hs, float alpha, const float *A,
                               int64_t lda, const float *Bt, int64_t ldbt, float *S, int64_t lds)
{
	for (int64_t c0 = 0; c0 < lds; c0 += KB)
		for (int64_t i0 = 0; i0 < n; i0 += MR) {
			int mr = n - i0 < MR ? (int)(n - i0) : MR;
			int64_t ncols = r0 + i0 + mr < lds ? r0 + i0 + mr : lds, w = ncols - c0;
			const float *a = A + i0 * lda;
			float *s = S + i0 * lds + c0;
			if (w <= 0)
				continue; /* the tile's causal edge is left of this block */
			w = w < KB ? w : KB;
			switch (mr) {
			case 1:
				nt_cols(1, w, hs, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			case 2:
				nt_cols(2, w, hs, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			case 3:
				nt_cols(3, w, hs, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			default:
				nt_cols(MR, w, hs, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			}
		}
}

/* nn_tile: C (mr x 16 nv) (+)= sum over k in [k0, k1) of A(r, k) B[k],
 * A(r, k) at A[r ars + k acs], B's rows ldb apart. */
TILE void nn_tile(const int mr, const int nv, int64_t k0, int64_t k1, const float *A, int64_t ars,
                  int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
	__m512 acc[MR][4];
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v)
			                       : _mm512_setzero_ps();
	for (int64_t k = k0; k < k1; k++) {
		__m512 b[4];
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);
#pragma GCC unroll 4
		for (int r = 0; r < mr; r++) {
			__m512 a = _mm512_set1_ps(A[r * ars + k * acs]);
#pragma GCC unroll 4
			for (int v = 0; v < nv; v++)
				acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			_mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

/* nn_rows: mr rows of C, hs columns, in tiles of up to 64. */
TILE void nn_rows(const int mr, int64_t hs, int64_t k0, int64_t k1, const float *A, int64_t ars,
                  int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate)
{
	for (int64_t c0 = 0; c0 < hs; c0 += 64) {
		int nv = hs - c0 < 64 ? (int)((hs - c0) / 16) : 4;
		switch (nv) {
		case 1:
			nn_tile(mr, 1, k0, k1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		case 2:
			nn_tile(mr, 2, k0, k1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		case 3:
			nn_tile(mr, 3, k0, k1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		default:
			nn_tile(mr, 4, k0, k1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		}
	}
}

AVX512 void cpu_attn512_acc(int64_t m, int64_t K, int64_t hs, const float *A, int64_t ars,
                            int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc,
                            bool accumulate, cpu_attn_causal causal, int64_t r0)
{
	/* Blocks of KB k's, each through every row tile: a tile adds each
	 * block's sum to what it holds, k still in order. */
	for (int64_t b0 = 0; b0 < K || b0 == 0; b0 += KB)
		for (int64_t i0 = 0; i0 < m; i0 += MR) {
			int mr = m - i0 < MR ? (int)(m - i0) : MR;
			int64_t k0 = 0, k1 = K, first, lo, hi;
			if (causal == CPU_ATTN_QUERY_ROWS) /* query r0 + i sees keys up to itself */
				k1 = r0 + i0 + mr < K ? r0 + i0 + mr : K;
			else if (causal == CPU_ATTN_KEY_ROWS) /* key j is seen by queries from j */
				k0 = i0 - r0 > 0 ? i0 - r0 : 0;
			/* the tile's first block sets it (zero when k0 >= k1) */
			first = k0 < k1 ? k0 / KB * KB : 0;
			lo = k0 > b0 ? k0 : b0;
			hi = k1 < b0 + KB ? k1 : b0 + KB;
			if (b0 != first && lo >= hi)
				continue;
			bool acc = b0 == first ? accumulate : true;
			const float *a = A + i0 * ars;
			float *c = C + i0 * ldc;
			switch (mr) {
			case 1:
				nn_rows(1, hs, lo, hi, a, ars, acs, B, ldb, c, ldc, acc);
				break;
			case 2:
				nn_rows(2, hs, lo, hi, a, ars, acs, B, ldb, c, ldc, acc);
				break;
			case 3:
				nn_rows(3, hs, lo, hi, a, ars, acs, B, ldb, c, ldc, acc);
				break;
			default:
				nn_rows(MR, hs, lo, hi, a, ars, acs, B, ldb, c, ldc, acc);
				break;
			}
		}
}

bool cpu_attn512_cpu(void)
{
	return __builtin_cpu_supports("avx512f");
}

/* transpose16: dst[c ldd + t] = src[t lds + c] for t, c < 16, in registers
 * (pairs, then 64-bit, then 128-bit lanes, then halves). */
TILE void transpose16(const float *src, int64_t lds, float *dst, int64_t ldd)
{
	__m512 r[16], t[16];
#pragma GCC unroll 16
	for (int i = 0; i < 16; i++)
		r[i] = _mm512_loadu_ps(src + i * lds);
#pragma GCC unroll 8
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
	}
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++) {
		r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
		r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
		r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
		r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
	}
#pragma GCC unroll 2
	for (int i = 0; i < 2; i++)
#pragma GCC unroll 4
		for (int j = 0; j < 4; j++) {
			t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
			t[8 * i + 4 + j] =
			    _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xDD);
		}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++) {
		r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
		r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);
	}
#pragma GCC unroll 16
	for (int i = 0; i < 16; i++)
		_mm512_storeu_ps(dst + i * ldd, r[i]);
}

AVX512 void cpu_attn512_transpose(const float *x, int64_t ld, int64_t T, int64_t hs, float *xt,
                                  int64_t Tp)
{
	int64_t t0 = 0;
	for (; t0 + 16 <= T; t0 += 16)
		for (int64_t c0 = 0; c0 < hs; c0 += 16)
			transpose16(x + t0 * ld + c0, ld, xt + c0 * Tp + t0, Tp);
	for (int64_t c = 0; c < hs && t0 < Tp; c++)
		for (int64_t t = t0; t < Tp; t++)
			xt[c * Tp + t] = t < T ? x[t * ld + c] : 0.0f;
}

/* exp512 is pt_expf (cpu_math.h) on 16 lanes: the same steps, fused. */
TILE __m512 exp512(__m512 x)
{
	/* min/max give their second operand where either is NaN: x's NaN stays */
	x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
	x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
	                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
	__m512 p = _mm512_set1_ps(1.9875691500e-4f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
	p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	/* NaN in x: n converts to INT_MIN, p is NaN and stays so */
	__m512i e =
	    _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* lanes: the mask of the first n (up to 16) lanes. */
TILE __mmask16 lanes(int64_t n)
{
	return (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u);
}

/* zero_tail zeroes row[from, to). */
TILE void zero_tail(float *row, int64_t from, int64_t to)
{
	for (int64_t j = from; j < to; j += 16)
		_mm512_mask_storeu_ps(row + j, lanes(to - j), _mm512_setzero_ps());
}

AVX512 void cpu_attn512_softmax(float *s, float *lse, int64_t r0, int64_t n, int64_t kn)
{
	for (int64_t i = 0; i < n; i++) {
		float *row = s + i * kn;
		int64_t len = r0 + i + 1, j;
		__m512 mx = _mm512_set1_ps(-__builtin_inff()), sum = _mm512_setzero_ps();
		for (j = 0; j < len; j += 16) {
			__mmask16 k = lanes(len - j);
			mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, row + j));
		}
		float m = _mm512_reduce_max_ps(mx);
		__m512 vm = _mm512_set1_ps(m);
		for (j = 0; j < len; j += 16) {
			__mmask16 k = lanes(len - j);
			__m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), vm));
			sum = _mm512_mask_add_ps(sum, k, sum, e);
			_mm512_mask_storeu_ps(row + j, k, e);
		}
		float total = _mm512_reduce_add_ps(sum);
		__m512 inv = _mm512_set1_ps(1.0f / total);
		lse[i] = m + logf(total);
		for (j = 0; j < len; j += 16) {
			__mmask16 k = lanes(len - j);
			_mm512_mask_storeu_ps(
			    row + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), inv));
		}
		zero_tail(row, len, kn);
	}
}

AVX512 void cpu_attn512_grads(float *p, float *dp, const float *lse, int64_t r0, int64_t n,
                              int64_t kn, float scale)
{
	for (int64_t i = 0; i < n; i++) {
		float *pr = p + i * kn, *dr = dp + i * kn;
		int64_t len = r0 + i + 1, j;
		__m512 l = _mm512_set1_ps(lse[i]), dot = _mm512_setzero_ps();
		for (j = 0; j < len; j += 16) {
			__mmask16 k = lanes(len - j);
			__m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, pr + j), l));
			dot = _mm512_mask3_fmadd_ps(e, _mm512_maskz_loadu_ps(k, dr + j), dot, k);
			_mm512_mask_storeu_ps(pr + j, k, e);
		}
		__m512 vd = _mm512_set1_ps(_mm512_reduce_add_ps(dot)), sc = _mm512_set1_ps(scale);
		for (j = 0; j < len; j += 16) {
			__mmask16 k = lanes(len - j);
			__m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dr + j), vd);
			__m512 e = _mm512_mul_ps(sc, _mm512_maskz_loadu_ps(k, pr + j));
			_mm512_mask_storeu_ps(dr + j, k, _mm512_mul_ps(e, g));
		}
		zero_tail(pr, len, kn);
		zero_tail(dr, len, kn);
	}
}

#else /* not x86-64: the sgemm strips only */

bool cpu_attn512_cpu(void)
{
	return false;
}

void cpu_attn512_transpose(const float *x, int64_t ld, int64_t T, int64_t hs, float *xt, int64_t Tp)
{
}

void cpu_attn512_softmax(float *s, float *lse, int64_t r0, int64_t n, int64_t kn)
{
}

void cpu_attn512_grads(float *p, float *dp, const float *lse, int64_t r0, int64_t n, int64_t kn,
                       float scale)
{
}

bool cpu_attn512_usable(int64_t hs)
{
	(void)hs;
	return false;
}

void cpu_attn512_scores(int64_t n, int64_t r0, int64_t hs, float alpha, const float *A, int64_t lda,
                        const float *Bt, int64_t ldbt, float *S, int64_t lds)
{
}

void cpu_attn512_acc(int64_t m, int64_t K, int64_t hs, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate,
                     cpu_attn_causal causal, int64_t r0)
{
}
#endif
