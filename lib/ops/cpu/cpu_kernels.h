/* cpu_kernels.h - the CPU implementations of every op (plain C + oneDNN).
 *
 * Each kernel takes a call that meta has already validated and a workspace of
 * the size its planner asked for. They are the reference every other backend
 * is checked against.
 */
#ifndef PT_CPU_KERNELS_H
#define PT_CPU_KERNELS_H

#include <omp.h>

#include "dispatch.h"

#define PT_CPU_KERNELS(X)                                                                          \
	X(fill)                                                                                    \
	X(copy)                                                                                    \
	X(scale)                                                                                   \
	X(add)                                                                                     \
	X(matmul)                                                                                  \
	X(linear_forward)                                                                          \
	X(linear_backward)                                                                         \
	X(activation_forward)                                                                      \
	X(activation_backward)                                                                     \
	X(dropout_forward)                                                                         \
	X(dropout_backward)                                                                        \
	X(softmax_forward)                                                                         \
	X(softmax_backward)                                                                        \
	X(layernorm_forward)                                                                       \
	X(layernorm_backward)                                                                      \
	X(embedding_forward)                                                                       \
	X(embedding_backward)                                                                      \
	X(attention_forward)                                                                       \
	X(attention_backward)                                                                      \
	X(cross_entropy_forward)                                                                   \
	X(cross_entropy_backward)                                                                  \
	X(mse_forward)                                                                             \
	X(mse_backward)                                                                            \
	X(squared_norm)                                                                            \
	X(adamw)                                                                                   \
	X(sgd)

#define PT_CPU_DECL(name) pt_err cpu_##name(const pt_op_call *c, void *ws);
PT_CPU_KERNELS(PT_CPU_DECL)
#undef PT_CPU_DECL

/* cpu_attention_workspace returns the bytes attention backward needs. */
size_t cpu_attention_workspace(const pt_op_call *c);

/* The fp32 attention kernel's strip products on AVX-512 (cpu_attn512.c).
 * cpu_attn512_usable: this CPU has AVX-512 and hs is a multiple of 16.
 * cpu_attn512_scores: S[i][j] = alpha sum_d A[i][d] Bt[d][j] for the n rows
 * of a strip starting at query r0, j below r0 + i + 1 at least (tiles of 4
 * rows stop at their last row's key, and at lds); Bt's rows are whole
 * vectors of 16 readable floats. cpu_attn512_acc: C (m x hs) (+)= A B over
 * k in [0, K), A(r, k) at A[r ars + k acs], skipping what the causal mask
 * zeroes: CPU_ATTN_QUERY_ROWS, C's rows are queries r0 + i (k, a key, up
 * to the query); CPU_ATTN_KEY_ROWS, C's rows are keys j (k, a strip row,
 * from j - r0). */
/* cpu_attn512_cpu: the CPU has AVX-512 (softmax and its backward on 16
 * lanes). cpu_attn512_softmax is the strip's causal softmax in place (rows
 * of strip_softmax in cpu_attention.c, lse[i] for row i);
 * cpu_attn512_grads its backward (strip_grads, lse[i] for row i). */
bool cpu_attn512_cpu(void);
/* cpu_attn512_transpose: xt (hs x Tp, zeros past T) = x^T, x T x hs with rows
 * ld apart; hs a multiple of 16. */
void cpu_attn512_transpose(const float *x, int64_t ld, int64_t T, int64_t hs, float *xt,
                           int64_t Tp);
void cpu_attn512_softmax(float *s, float *lse, int64_t r0, int64_t n, int64_t kn);
void cpu_attn512_grads(float *p, float *dp, const float *lse, int64_t r0, int64_t n,
                       int64_t kn, float scale);
typedef enum { CPU_ATTN_DENSE, CPU_ATTN_QUERY_ROWS, CPU_ATTN_KEY_ROWS } cpu_attn_causal;
bool cpu_attn512_usable(int64_t hs);
void cpu_attn512_scores(int64_t n, int64_t r0, int64_t hs, float alpha, const float *A,
                        int64_t lda, const float *Bt, int64_t ldbt, float *S, int64_t lds);
void cpu_attn512_acc(int64_t m, int64_t K, int64_t hs, const float *A, int64_t ars, int64_t acs,
                     const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate,
                     cpu_attn_causal causal, int64_t r0);

/* The bf16 attention kernel's strip products on AVX512_BF16 dot products
 * (cpu_attn_bf16.c); a pair is two bf16 in 32 bits, the first in the low
 * half. cpu_attnbf16_usable: this CPU has AVX512_BF16 (and AVX512BW) and hs
 * is a multiple of 32. cpu_attnbf16_rows: each of rows rows of x (cols
 * floats, ld apart) as ceil(cols / 2) pairs of neighbours, rows ldo pairs
 * apart, the last pair's second half zero when cols is odd.
 * cpu_attnbf16_interleave: rows t and t + 1 of x (cols floats) as cols pairs
 * (x[t][c], x[t + 1][c]) at out + t / 2 ldo, a missing last row zero.
 * cpu_attnbf16_transpose: xt ((hs / 2) x Tp pairs, Tp a multiple of 16,
 * zeros past T) = x's rows as pairs of features, transposed.
 * cpu_attnbf16_scores is cpu_attn512_scores with A's rows as pairs (lda
 * pairs apart) and Bt transposed pairs; cpu_attnbf16_acc is
 * cpu_attn512_acc with A(r, p) the pair p of sums at A[r ars + p acs] and B
 * ceil(K / 2) rows of interleaved pairs (ldb apart). */
bool cpu_attnbf16_usable(int64_t hs);
void cpu_attnbf16_rows(const float *x, int64_t ld, int64_t rows, int64_t cols, uint32_t *out,
                       int64_t ldo);
void cpu_attnbf16_interleave(const float *x, int64_t ld, int64_t rows, int64_t cols, uint32_t *out,
                             int64_t ldo);
void cpu_attnbf16_transpose(const float *x, int64_t ld, int64_t T, int64_t hs, uint32_t *xt,
                            int64_t Tp);
void cpu_attnbf16_scores(int64_t n, int64_t r0, int64_t hs, float alpha, const uint32_t *A,
                         int64_t lda, const uint32_t *Bt, int64_t ldbt, float *S, int64_t lds);
void cpu_attnbf16_acc(int64_t m, int64_t K, int64_t hs, const uint32_t *A, int64_t ars, int64_t acs,
                      const uint32_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate,
                      cpu_attn_causal causal, int64_t r0);

/* cpu_gemm: row-major C (M, N) = alpha op(A) op(B) + beta C through oneDNN. */
pt_err cpu_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* cpu_gemm_prec is cpu_gemm at precision prec: PT_PREC_BF16 (PT_PREC_TF32)
 * rounds A and B to bf16 (tf32; nearest even) and multiplies with f32
 * accumulation into f32 C, as a bf16 GEMM (a TF32 tensor-core GEMM) does.
 * bf16 outside a parallel region runs native where pt_cpu_bf16_native says
 * so (cpu_gemm_bf16_native); otherwise it is emulated
 * (cpu_gemm_prec_emulated). */
pt_err cpu_gemm_prec(pt_precision prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc);

/* cpu_gemm_prec_emulated: the rounded operands are packed in a per-thread
 * buffer and the product is oneDNN's sgemm of them (bf16 numerics at fp32
 * speed). At any precision, an operand read down rows 512k floats apart
 * (K >= 256, outside a parallel region) is first copied to rows 16 floats
 * longer in that buffer: same bits, no cache-set conflicts. */
pt_err cpu_gemm_prec_emulated(pt_precision prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                              float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc);

/* cpu_gemm_bf16_native: oneDNN's matmul primitive on A and B rounded to
 * bf16 (packed in a per-thread buffer), f32 accumulation, f32 C
 * (cpu_bf16.c). */
pt_err cpu_gemm_bf16_native(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                            float *C, int64_t ldc);

/* cpu_bf16_gemm_packed: C = alpha op(A) op(B) + beta C on operands already
 * packed to bf16 (cpu_pack_bf16; A M x K, or K x M when ta; B K x N, or
 * N x K when tb; rows back to back), f32 C with rows ldc apart: oneDNN's
 * bf16 matmul primitive, single-threaded inside a parallel region. Only
 * where pt_cpu_bf16_native says the native kernels run. */
pt_err cpu_bf16_gemm_packed(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const uint16_t *A, const uint16_t *B, float beta, float *C,
                            int64_t ldc);

/* cpu_gemm_f32_prim: C = alpha op(A) op(B) (+ bias row, when bias) + beta C
 * through oneDNN's f32 matmul primitive (brgemm; cached per thread and
 * shape, like the bf16 ones). Same bits for any thread count. */
pt_err cpu_gemm_f32_prim(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb,
                         const float *bias, float beta, float *C, int64_t ldc);

/* cpu_bf16_linear_forward: y (N x O) = x (N x I) w^T (w: O x I) + bias
 * (NULL: none), native bf16 products (x and w rounded once), f32 bias. xb,
 * when not NULL, is x already packed to bf16 (a bf16 activation; x unused). */
pt_err cpu_bf16_linear_forward(int64_t N, int64_t I, int64_t O, const float *x, const uint16_t *xb,
                               const float *w, const float *bias, float *y);

/* cpu_bf16_linear_backward: dx (+)= dy w and dw += dy^T x (either output may
 * be NULL), native bf16 products with dy rounded once for both; db (NULL:
 * none) += dy's column sums, taken while dy is packed. xb as in the forward. */
pt_err cpu_bf16_linear_backward(int64_t N, int64_t I, int64_t O, const float *dy, const float *x,
                                const uint16_t *xb, const float *w, float *dx, bool accum_dx,
                                float *dw, float *db);

/* cpu_bf16_row rounds n floats to packed bf16 exactly as the native kernels'
 * operands are packed (cpu_pack_bf16 with hw), so a bf16 activation written
 * with it is the operand a product would have packed from the f32 one. */
void cpu_bf16_row(uint16_t *dst, const float *src, int64_t n);

/* cpu_bias_grad: db[j] += sum over rows r of g[r * O + j], each column summed
 * in row order (the same bits for any thread count); threads take column
 * ranges and stream the rows. */
void cpu_bias_grad(const float *g, float *db, int64_t N, int64_t O);

/* cpu_gemm_operand_floats is the size of the buffer cpu_gemm_prec takes for
 * these operands (0: none). */
size_t cpu_gemm_operand_floats(bool rounded, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                               int64_t lda, int64_t ldb);

/* cpu_round_tf32 is cpu_round_bf16 to tf32 (the top 19 bits of the pattern:
 * sign, 8 exponent bits, 10 mantissa bits). */
void cpu_round_tf32(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld);

/* cpu_round_bf16 writes rows x cols of src (leading dimension ld) to dst
 * (packed), each rounded to the nearest bf16 (ties to even; NaN stays NaN). */
void cpu_round_bf16(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld);

/* cpu_pack_bf16 rounds rows x cols of src (rows ld apart) to packed bf16 in
 * dst (rows cols apart), as the native kernels take their operands: nearest,
 * ties to even, a NaN stays a quiet NaN. hw: with AVX512_BF16's conversion
 * where the CPU has it, which also turns a denormal into a signed zero. */
void cpu_pack_bf16(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld,
                   bool hw);

/* cpu_activation_rows runs n elements of an activation's forward (out =
 * act(x)) or backward (out (+)= act'(.) dy, acc adds) on the calling thread,
 * with the AVX-512F build where wide and the CPU has it, else the baseline's
 * (tests compare the two). */
void cpu_activation_rows(pt_act kind, bool backward, bool wide, float *out, const float *dy,
                         const float *x, const float *y, int64_t n, bool acc);

/* cpu_round_row rounds n floats of s into d (d may be s) as precision
 * prec (bf16 or tf32) rounds a product's operands: nearest, ties to even;
 * a NaN stays a quiet NaN. No OpenMP: for rows inside a parallel region. */
static inline void cpu_round_row(pt_precision prec, float *d, const float *s, int64_t n)
{
	/* bf16 keeps the top 16 bits of the pattern, tf32 the top 19. */
	uint32_t half = prec == PT_PREC_BF16 ? 0x7fffu : 0xfffu;
	uint32_t keep = prec == PT_PREC_BF16 ? 0xffff0000u : 0xffffe000u;
	int shift = prec == PT_PREC_BF16 ? 16 : 13;
	const uint32_t *su = (const uint32_t *)s;
	uint32_t *du = (uint32_t *)d;
#pragma omp simd
	for (int64_t j = 0; j < n; j++) {
		uint32_t u = su[j];
		uint32_t nan = (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0;
		uint32_t rnd = (u + half + ((u >> shift) & 1u)) & keep;
		du[j] = nan ? (u | 0x00400000u) & keep : rnd;
	}
}

/* cpu_thread_cols gives the calling OpenMP thread its share [*c0, *c1) of
 * cols columns, in runs of align (empty when there are more threads than
 * runs): threads that stream rows over their own columns. */
static inline void cpu_thread_cols(int64_t cols, int64_t align, int64_t *c0, int64_t *c1)
{
	int t = omp_get_thread_num(), n = omp_get_num_threads();
	int64_t per = ((cols + n - 1) / n + align - 1) / align * align;
	*c0 = t * per < cols ? t * per : cols;
	*c1 = *c0 + per < cols ? *c0 + per : cols;
}

/* Element-wise work below this many elements runs on one thread: waking a
 * sleeping OpenMP thread costs ~40-80 us here, more than the work saved. */
#define PT_CPU_PAR_MIN (1 << 18)

#endif
