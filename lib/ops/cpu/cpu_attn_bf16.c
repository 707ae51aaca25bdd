/* cpu_attn_bf16.c - the bf16 causal attention kernel's strip products on
 * AVX512_BF16's dot products (cpu_attention.c), in place of one oneDNN bf16
 * matmul call per strip and product.
 *
 * vdpbf16ps adds to each of 16 f32 lanes the products of a pair of bf16
 * values: a product's operands go in pairs along its sum. The row operand
 * (a query, a probability row) is read as 32-bit pairs where it lies and
 * broadcast; the other is laid out so that one vector holds the pairs of 16
 * output columns: keys transposed to (hs / 2) x Tp pairs of features for the
 * scores, and values, keys, queries or output gradients interleaved two rows
 * at a time (pairs of rows, hs columns) for the sums over keys or queries.
 * Rows past the end are zeros, so a pair that reaches one adds nothing.
 *
 * Tiles of 4 rows stop at their causal edge (rounded up to a whole pair),
 * as the fp32 tiles do (cpu_attn512.c). Each sum runs in order of its pairs,
 * so results do not depend on threads. Operands are rounded with the CPU's
 * conversion (nearest, ties to even, denormals to zero), as cpu_pack_bf16
 * with hw rounds them.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define MR    4  /* rows of a register tile */
#define KBP   32 /* pairs of a block of the sums (64 keys) */
#define FLAGS "avx512f,avx512bw,avx512bf16"
#define TILE  static inline __attribute__((always_inline, target(FLAGS)))
#define BF16  __attribute__((target(FLAGS)))

/* KEY_ROWS' first pair, (i0 - r0) / 2, is exact only for even tile rows
 * (and strip starts, cpu_attention.c). */
_Static_assert(MR % 2 == 0, "tiles of an even number of rows");

bool cpu_attnbf16_usable(int64_t hs)
{
	return hs > 0 && hs % 32 == 0 && __builtin_cpu_supports("avx512f") &&
	       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
}

/* lanes: the mask of the first n (none below 1, all 16 from 16) lanes. */
TILE __mmask16 lanes(int64_t n)
{
	return (__mmask16)(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1u);
}

/* pairs16: 32 floats at lo and hi (16 each, masked by klo and khi) as 16
 * pairs of bf16, lo's element in each pair's low half. */
TILE __m512i pairs16(const float *lo, __mmask16 klo, const float *hi, __mmask16 khi)
{
	const __m512i idx =
	    _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
	                     22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
	__m512bh b =
	    _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(khi, hi), _mm512_maskz_loadu_ps(klo, lo));
	return _mm512_permutexvar_epi16(idx, (__m512i)b);
}

/* row_pairs16: 32 consecutive floats of a row (n of them readable) as 16
 * pairs of neighbours, the first of each in the low half. */
TILE __m512i row_pairs16(const float *x, int64_t n)
{
	/* (a short row's second half is not read: its base stays inside) */
	__m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(lanes(n - 16), n > 16 ? x + 16 : x),
	                                 _mm512_maskz_loadu_ps(lanes(n), x));
	return (__m512i)b;
}

BF16 void cpu_attnbf16_rows(const float *x, int64_t ld, int64_t rows, int64_t cols, uint32_t *out,
                            int64_t ldo)
{
	for (int64_t i = 0; i < rows; i++)
		for (int64_t c = 0; c < cols; c += 32) {
			int64_t np = (cols - c + 1) / 2;
			_mm512_mask_storeu_epi32(out + i * ldo + c / 2, lanes(np),
			                         row_pairs16(x + i * ld + c, cols - c));
		}
}

BF16 void cpu_attnbf16_interleave(const float *x, int64_t ld, int64_t rows, int64_t cols,
                                  uint32_t *out, int64_t ldo)
{
	for (int64_t t = 0; t < rows; t += 2)
		for (int64_t c = 0; c < cols; c += 16) {
			__mmask16 k = lanes(cols - c);
			const float *a = x + t * ld + c;
			bool two = t + 1 < rows; /* a missing last row is not read */
			_mm512_mask_storeu_epi32(out + t / 2 * ldo + c, k,
			                         pairs16(a, k, two ? a + ld : a, two ? k : 0));
		}
}

/* transpose16: dst[c ldd + t] = src[t] 32-bit element c, t, c < 16, in
 * registers (pairs, then 64-bit, then 128-bit lanes, then halves). */
TILE void transpose16(__m512i *r, uint32_t *dst, int64_t ldd)
{
	__m512i t[16];
#pragma GCC unroll 8
	for (int i = 0; i < 8; i++) {
		t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
		t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
	}
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++) {
		r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
		r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
		r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
		r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
	}
#pragma GCC unroll 2
	for (int i = 0; i < 2; i++)
#pragma GCC unroll 4
		for (int j = 0; j < 4; j++) {
			t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
			t[8 * i + 4 + j] =
			    _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xDD);
		}
#pragma GCC unroll 8
	for (int j = 0; j < 8; j++) {
		r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
		r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xDD);
	}
#pragma GCC unroll 16
	for (int i = 0; i < 16; i++)
		_mm512_storeu_si512(dst + i * ldd, r[i]);
}

BF16 void cpu_attnbf16_transpose(const float *x, int64_t ld, int64_t T, int64_t hs, uint32_t *xt,
                                 int64_t Tp)
{
	for (int64_t t0 = 0; t0 < Tp; t0 += 16)
		for (int64_t c0 = 0; c0 < hs; c0 += 32) {
			__m512i r[16];
#pragma GCC unroll 16
			for (int i = 0; i < 16; i++)
				r[i] = t0 + i < T ? row_pairs16(x + (t0 + i) * ld + c0, 32)
				                  : _mm512_setzero_si512();
			transpose16(r, xt + c0 / 2 * Tp + t0, Tp);
		}
}

/* nt_tile: C (mr x 16 nv, the last vector cut to mask last) = alpha A Bt,
 * A mr rows of Kp pairs (lda apart), Bt Kp rows of pairs (ldbt apart; whole
 * vectors readable). */
TILE void nt_tile(const int mr, const int nv, int64_t Kp, const uint32_t *A, int64_t lda,
                  const uint32_t *Bt, int64_t ldbt, float alpha, float *C, int64_t ldc,
                  __mmask16 last)
{
	__m512 acc[MR][4];
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			acc[r][v] = _mm512_setzero_ps();
	for (int64_t p = 0; p < Kp; p++) {
		__m512i b[4];
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			b[v] = _mm512_loadu_si512(Bt + p * ldbt + 16 * v);
#pragma GCC unroll 4
		for (int r = 0; r < mr; r++) {
			__m512i a = _mm512_set1_epi32((int)A[r * lda + p]);
#pragma GCC unroll 4
			for (int v = 0; v < nv; v++)
				acc[r][v] =
				    _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)b[v]);
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

TILE void nt_cols(const int mr, int64_t w, int64_t Kp, const uint32_t *A, int64_t lda,
                  const uint32_t *Bt, int64_t ldbt, float alpha, float *C, int64_t ldc)
{
	int nv = (int)((w + 15) / 16);
	__mmask16 last = lanes(w - 16 * (nv - 1));
	switch (nv) {
	case 1:
		nt_tile(mr, 1, Kp, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	case 2:
		nt_tile(mr, 2, Kp, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	case 3:
		nt_tile(mr, 3, Kp, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	default:
		nt_tile(mr, 4, Kp, A, lda, Bt, ldbt, alpha, C, ldc, last);
		break;
	}
}

BF16 void cpu_attnbf16_scores(int64_t n, int64_t r0, int64_t hs, float alpha, const uint32_t *A,
                              int64_t lda, const uint32_t *Bt, int64_t ldbt, float *S, int64_t lds)
{
	for (int64_t c0 = 0; c0 < lds; c0 += 2 * KBP)
		for (int64_t i0 = 0; i0 < n; i0 += MR) {
			int mr = n - i0 < MR ? (int)(n - i0) : MR;
			int64_t ncols = r0 + i0 + mr < lds ? r0 + i0 + mr : lds, w = ncols - c0;
			const uint32_t *a = A + i0 * lda;
			float *s = S + i0 * lds + c0;
			if (w <= 0)
				continue; /* the tile's causal edge is left of this block */
			w = w < 2 * KBP ? w : 2 * KBP;
			switch (mr) {
			case 1:
				nt_cols(1, w, hs / 2, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			case 2:
				nt_cols(2, w, hs / 2, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			case 3:
				nt_cols(3, w, hs / 2, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			default:
				nt_cols(MR, w, hs / 2, a, lda, Bt + c0, ldbt, alpha, s, lds);
				break;
			}
		}
}

/* nn_tile: C (mr x 16 nv) (+)= sum over pairs p in [p0, p1) of A(r, p) B[p],
 * A(r, p) at A[r ars + p acs], B's pair rows ldb apart. */
TILE void nn_tile(const int mr, const int nv, int64_t p0, int64_t p1, const uint32_t *A,
                  int64_t ars, int64_t acs, const uint32_t *B, int64_t ldb, float *C, int64_t ldc,
                  bool accumulate)
{
	__m512 acc[MR][4];
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			acc[r][v] = accumulate ? _mm512_loadu_ps(C + r * ldc + 16 * v)
			                       : _mm512_setzero_ps();
	for (int64_t p = p0; p < p1; p++) {
		__m512i b[4];
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			b[v] = _mm512_loadu_si512(B + p * ldb + 16 * v);
#pragma GCC unroll 4
		for (int r = 0; r < mr; r++) {
			__m512i a = _mm512_set1_epi32((int)A[r * ars + p * acs]);
#pragma GCC unroll 4
			for (int v = 0; v < nv; v++)
				acc[r][v] =
				    _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)b[v]);
		}
	}
#pragma GCC unroll 4
	for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
		for (int v = 0; v < nv; v++)
			_mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
}

TILE void nn_rows(const int mr, int64_t hs, int64_t p0, int64_t p1, const uint32_t *A, int64_t ars,
                  int64_t acs, const uint32_t *B, int64_t ldb, float *C, int64_t ldc,
                  bool accumulate)
{
	for (int64_t c0 = 0; c0 < hs; c0 += 64) {
		int nv = hs - c0 < 64 ? (int)((hs - c0) / 16) : 4;
		switch (nv) {
		case 1:
			nn_tile(mr, 1, p0, p1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		case 2:
			nn_tile(mr, 2, p0, p1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		case 3:
			nn_tile(mr, 3, p0, p1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		default:
			nn_tile(mr, 4, p0, p1, A, ars, acs, B + c0, ldb, C + c0, ldc, accumulate);
			break;
		}
	}
}

BF16 void cpu_attnbf16_acc(int64_t m, int64_t K, int64_t hs, const uint32_t *A, int64_t ars,
                           int64_t acs, const uint32_t *B, int64_t ldb, float *C, int64_t ldc,
                           bool accumulate, cpu_attn_causal causal, int64_t r0)
{
	int64_t Kp = (K + 1) / 2;
	/* Blocks of KBP pairs, each through every row tile: a tile adds each
	 * block's sum to what it holds, pairs still in order. */
	for (int64_t b0 = 0; b0 < Kp || b0 == 0; b0 += KBP)
		for (int64_t i0 = 0; i0 < m; i0 += MR) {
			int mr = m - i0 < MR ? (int)(m - i0) : MR;
			int64_t p0 = 0, p1 = Kp, first, lo, hi;
			if (causal == CPU_ATTN_QUERY_ROWS) /* query r0 + i sees keys up to itself */
				p1 = r0 + i0 + mr < K ? (r0 + i0 + mr + 1) / 2 : Kp;
			else if (causal == CPU_ATTN_KEY_ROWS) /* key j is seen by queries from j */
				p0 = i0 - r0 > 0 ? (i0 - r0) / 2 : 0;
			/* the tile's first block sets it (zero when p0 >= p1) */
			first = p0 < p1 ? p0 / KBP * KBP : 0;
			lo = p0 > b0 ? p0 : b0;
			hi = p1 < b0 + KBP ? p1 : b0 + KBP;
			if (b0 != first && lo >= hi)
				continue;
			bool acc = b0 == first ? accumulate : true;
			const uint32_t *a = A + i0 * ars;
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

#else /* not x86-64: oneDNN's bf16 strips only */

bool cpu_attnbf16_usable(int64_t hs)
{
	(void)hs;
	return false;
}

void cpu_attnbf16_rows(const float *x, int64_t ld, int64_t rows, int64_t cols, uint32_t *out,
                       int64_t ldo)
{
}

void cpu_attnbf16_interleave(const float *x, int64_t ld, int64_t rows, int64_t cols, uint32_t *out,
                             int64_t ldo)
{
}

void cpu_attnbf16_transpose(const float *x, int64_t ld, int64_t T, int64_t hs, uint32_t *xt,
                            int64_t Tp)
{
}

void cpu_attnbf16_scores(int64_t n, int64_t r0, int64_t hs, float alpha, const uint32_t *A,
                         int64_t lda, const uint32_t *Bt, int64_t ldbt, float *S, int64_t lds)
{
}

void cpu_attnbf16_acc(int64_t m, int64_t K, int64_t hs, const uint32_t *A, int64_t ars, int64_t acs,
                      const uint32_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate,
                      cpu_attn_causal causal, int64_t r0)
{
}
#endif
