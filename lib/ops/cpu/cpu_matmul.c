/* cpu_matmul.c - matrix products through oneDNN's sgemm (AVX-512 picked at
 * run time), and the Linear layer's forward and backward built on them;
 * bf16 and tf32 precision round the operands first (cpu_gemm_prec). */
#include <oneapi/dnnl/dnnl.h>
#include <inttypes.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "runtime.h"

/* Products below this many flops run on the calling thread alone: waking
 * a team (passive waits) costs more than it saves (examples/gpt.json's
 * 128 x 64 x 256 products ran twice as fast on one thread as on two). */
#define GEMM_SERIAL_FLOPS ((double)(1 << 24))

/* use_prim: this product runs on oneDNN's f32 matmul primitive (brgemm)
 * rather than dnnl_sgemm - at the top level (the attention kernel's
 * per-strip products, inside a parallel region, vary in shape strip by
 * strip), from GEMM_SERIAL_FLOPS, where the two dimensions other than the
 * rows of a batch (N and K, or M and N for a weight gradient, ta) are at
 * most PRIM_MAX_DIM. Measured on 2 Zen 5 cores: every W2 Linear product
 * (widths 256 to 1024) ran at 490-510 GFLOP/s on the primitive against
 * 340-490 on sgemm; W3's wider ones (768 to 50304) ran at 290-465 on the
 * primitive against 457-495 on sgemm. A shape-only choice: the same
 * product always takes the same kernel, and either gives the same bits on
 * any thread count. */
#define PRIM_MAX_DIM 1024

static bool use_prim(bool ta, int64_t M, int64_t N, int64_t K)
{
	int64_t d1 = ta ? M : N, d2 = ta ? N : K;
	return K > 0 && d1 <= PRIM_MAX_DIM && d2 <= PRIM_MAX_DIM &&
	       2.0 * (double)M * (double)N * (double)K >= GEMM_SERIAL_FLOPS && !omp_in_parallel();
}

pt_err cpu_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
	dnnl_status_t st;
	int team = 0;
	if (M == 0 || N == 0)
		return PT_OK;
	if (use_prim(ta, M, N, K)) {
		if (cpu_gemm_f32_prim(ta, tb, M, N, K, alpha, A, lda, B, ldb, NULL, beta, C, ldc) ==
		    PT_OK)
			return PT_OK;
		pt_clear_error(); /* no primitive for it: sgemm below */
	}
	if (2.0 * (double)M * (double)N * (double)K < GEMM_SERIAL_FLOPS && !omp_in_parallel() &&
	    (team = omp_get_max_threads()) > 1)
		omp_set_num_threads(1);
	st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
	                ldc);
	if (team > 1)
		omp_set_num_threads(team);
	if (st != dnnl_success)
		return pt_set_error(PT_ERR_BACKEND, "dnnl_sgemm(%ld x %ld x %ld) failed: status %d",
		                    (long)M, (long)N, (long)K, (int)st);
	return PT_OK;
}

/* Rows of src (leading dimension sld) to dst (leading dimension dld), each
 * element rounded to bf16 or tf32 (nearest, ties to even; NaN stays a quiet
 * NaN) or copied as it is (PT_PREC_FP32). */
static void copy_rows(float *dst, int64_t dld, const float *src, int64_t sld, int64_t rows,
                      int64_t cols, pt_precision prec)
{
#pragma omp parallel for schedule(static) if (rows * cols >= PT_CPU_PAR_MIN && !omp_in_parallel())
	for (int64_t r = 0; r < rows; r++) {
		if (prec != PT_PREC_FP32)
			cpu_round_row(prec, dst + r * dld, src + r * sld, cols);
		else if (dst != src)
			memcpy(dst + r * dld, src + r * sld, sizeof(float) * (size_t)cols);
	}
}

void cpu_round_bf16(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
	copy_rows(dst, cols, src, ld, rows, cols, PT_PREC_BF16);
}

void cpu_round_tf32(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
	copy_rows(dst, cols, src, ld, rows, cols, PT_PREC_TF32);
}

/* The per-thread buffer of rounded operands (freed when the thread ends). */
static float *scratch_floats(size_t n)
{
	return n > SIZE_MAX / sizeof(float)
	           ? NULL
	           : pt_thread_buffer(PT_SLOT_GEMM_OPERANDS, n * sizeof(float));
}

/* An operand read down its rows (k) with a stride that is a multiple of 512
 * floats (2 KiB) maps a panel's rows to a few cache sets; oneDNN's sgemm then
 * runs at half speed (dW = dy^T x of a 1024-wide layer: 70 against 140
 * GFLOP/s on 2 Zen 4 cores). Such an operand is copied with its rows 16
 * floats longer first: the product is the same bits, and the copy costs less
 * than the conflicts. Only for dnnl_sgemm's products (use_prim: the matmul
 * primitive does not need it), at the top level. A transposed B (a weight
 * read across) is left alone: padding it changed the bits of a 16-row
 * product. */
#define PT_GEMM_PAD 16

static bool conflicting(int64_t ld, int64_t K)
{
	return K >= 256 && ld % 512 == 0 && !omp_in_parallel();
}

/* copies says which operands cpu_gemm_prec copies first: rounded ones
 * always, fp32 ones read with conflicting rows where dnnl_sgemm takes the
 * product (the matmul primitive needs no padding). */
static void copies(bool rounded, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda,
                   int64_t ldb, bool *copy_a, bool *copy_b)
{
	bool sgemm = !use_prim(ta, M, N, K);
	*copy_a = rounded || (sgemm && ta && conflicting(lda, K));
	*copy_b = rounded || (sgemm && !tb && conflicting(ldb, K));
}

static int64_t padded_ld(int64_t cols)
{
	return cols > 0 && cols % 512 == 0 ? cols + PT_GEMM_PAD : (cols > 0 ? cols : 1);
}

size_t cpu_gemm_operand_floats(bool rounded, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                               int64_t lda, int64_t ldb)
{
	int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
	size_t n = 0;
	bool copy_a, copy_b;
	copies(rounded, ta, tb, M, N, K, lda, ldb, &copy_a, &copy_b);
	if (copy_a)
		n += (size_t)(ra * padded_ld(ca));
	if (copy_b)
		n += (size_t)(rb * padded_ld(cb));
	return n;
}

pt_err cpu_gemm_prec(pt_precision prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                     float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc)
{
	if (prec == PT_PREC_BF16 && M > 0 && N > 0 && K > 0 && !omp_in_parallel() &&
	    pt_cpu_bf16_native(NULL))
		return cpu_gemm_bf16_native(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	return cpu_gemm_prec_emulated(prec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

pt_err cpu_gemm_prec_emulated(pt_precision prec, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                              float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                              float beta, float *C, int64_t ldc)
{
	int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
	bool rounded = prec != PT_PREC_FP32, copy_a, copy_b;
	size_t n = cpu_gemm_operand_floats(rounded, ta, tb, M, N, K, lda, ldb);
	float *a;

	copies(rounded, ta, tb, M, N, K, lda, ldb, &copy_a, &copy_b);
	if (n == 0 || M == 0 || N == 0)
		return cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
	if ((a = scratch_floats(n)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "gemm operands (%ld x %ld x %ld)", (long)M,
		                    (long)N, (long)K);
	if (copy_a) {
		copy_rows(a, padded_ld(ca), A, lda, ra, ca, prec);
		A = a;
		lda = padded_ld(ca);
		a += ra * lda;
	}
	if (copy_b) {
		copy_rows(a, padded_ld(cb), B, ldb, rb, cb, prec);
		B = a;
		ldb = padded_ld(cb);
	}
	return cpu_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

pt_err cpu_matmul(const pt_op_call *c, void *ws)
{
	const pt_tensor *a = c->in[0], *b = c->in[1];
	pt_tensor *o = c->out[0];
	bool ta = c->p.matmul.trans_a, tb = c->p.matmul.trans_b;
	int64_t M = o->shape[0], N = o->shape[1];
	int64_t K = ta ? a->shape[0] : a->shape[1];
	return cpu_gemm_prec(c->prec, ta, tb, M, N, K, c->p.matmul.alpha, pt_tensor_f32(a),
	                     a->strides[0], pt_tensor_f32(b), b->strides[0], c->p.matmul.beta,
	                     pt_tensor_f32(o), o->strides[0]);
}

/* native_bf16: this call's products run on the native bf16 kernels. */
static bool native_bf16(const pt_op_call *c)
{
	return c->prec == PT_PREC_BF16 && !omp_in_parallel() && pt_cpu_bf16_native(NULL);
}

static int64_t rows_of(const pt_tensor *t)
{
	return pt_tensor_numel(t) / t->shape[t->ndim - 1];
}

/* input_f32 gives a Linear's input as f32 rows: x's own data, or at bf16 a
 * bf16 x widened (exactly) into the thread's buffer for the emulation, which
 * rounds it back to the same values. A bf16 x at another precision is refused:
 * its model was made for bf16 (pt_layer_mm_input) and must run at bf16. */
static pt_err input_f32(const pt_op_call *c, const pt_tensor *x, const float **out)
{
	int64_t n = pt_tensor_numel(x);
	const uint16_t *src;
	uint32_t *dst;

	if (x->dtype != PT_BF16) {
		*out = pt_tensor_f32(x);
		return PT_OK;
	}
	if (c->prec != PT_PREC_BF16)
		return pt_set_error(
		    PT_ERR_DTYPE, "%s: a bf16 input at %s precision (its model was made for bf16)",
		    pt_op_name(c->op), c->prec == PT_PREC_TF32 ? "tf32" : "fp32");
	if ((size_t)n > SIZE_MAX / sizeof(float) ||
	    (dst = pt_thread_buffer(PT_SLOT_WIDE_INPUT, (size_t)n * sizeof(float))) == NULL)
		return pt_set_error(PT_ERR_NOMEM,
		                    "linear: widening a bf16 input of %" PRId64 " values", n);
	src = pt_tensor_data(x);
#pragma omp parallel for schedule(static) if (n >= PT_CPU_PAR_MIN && !omp_in_parallel())
	for (int64_t i = 0; i < n; i++)
		dst[i] = (uint32_t)src[i] << 16;
	*out = (const float *)dst;
	return PT_OK;
}

/* packed_input: x's bf16 values when x is a bf16 tensor, else NULL. */
static const uint16_t *packed_input(const pt_tensor *x)
{
	return x->dtype == PT_BF16 ? pt_tensor_data(x) : NULL;
}

pt_err cpu_linear_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
	float *y = pt_tensor_f32(c->out[0]);
	int64_t N = rows_of(x), I = w->shape[1], O = w->shape[0];
	float beta = 0.0f;
	const float *xf;

	if (native_bf16(c) && N > 0 && I > 0 && O > 0)
		return cpu_bf16_linear_forward(N, I, O, packed_input(x) ? NULL : pt_tensor_f32(x),
		                               packed_input(x), pt_tensor_f32(w),
		                               b != NULL ? pt_tensor_f32(b) : NULL, y);
	PT_TRY(input_f32(c, x, &xf));
	if (c->prec == PT_PREC_FP32 && N > 0 && O > 0 && use_prim(false, N, O, I)) {
		if (cpu_gemm_f32_prim(false, true, N, O, I, 1.0f, xf, I, pt_tensor_f32(w), I,
		                      b != NULL ? pt_tensor_f32(b) : NULL, 0.0f, y, O) == PT_OK)
			return PT_OK;
		pt_clear_error(); /* no primitive for it: seeded sgemm below */
	}
	if (b != NULL) {
		/* Seed each output row with the bias, then accumulate the product
		 * (sgemm's products; rows in parallel for large ones). */
		const float *bias = pt_tensor_f32(b);
#pragma omp parallel for schedule(static) if (N * O >= PT_CPU_PAR_MIN && !omp_in_parallel())
		for (int64_t r = 0; r < N; r++)
			memcpy(y + r * O, bias, sizeof(float) * (size_t)O);
		beta = 1.0f;
	}
	return cpu_gemm_prec(c->prec, false, true, N, O, I, 1.0f, xf, I, pt_tensor_f32(w), I, beta,
	                     y, O);
}

/* Columns a thread sums at once in registers (8 AVX2 vectors). */
#define BIAS_BLOCK 64

void cpu_bias_grad(const float *g, float *db, int64_t N, int64_t O)
{
	int nt = N * O >= PT_CPU_PAR_MIN && !omp_in_parallel() ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
	{
		int64_t c0, c1, j0;
		cpu_thread_cols(O, 16, &c0, &c1);
		/* Blocks of columns down all the rows, the sums held in
		 * registers rather than loaded and stored per row (2x on W2's
		 * widths from memory); then the rest of the range row by row.
		 * Either way each column is summed in row order. */
		for (j0 = c0; j0 + BIAS_BLOCK <= c1; j0 += BIAS_BLOCK) {
			float acc[BIAS_BLOCK];
			memcpy(acc, db + j0, sizeof(acc));
			for (int64_t r = 0; r < N; r++) {
				const float *row = g + r * O + j0;
#pragma omp simd
				for (int j = 0; j < BIAS_BLOCK; j++)
					acc[j] += row[j];
			}
			memcpy(db + j0, acc, sizeof(acc));
		}
		for (int64_t r = 0; r < N && j0 < c1; r++) {
			const float *row = g + r * O;
#pragma omp simd
			for (int64_t j = j0; j < c1; j++)
				db[j] += row[j];
		}
	}
}

pt_err cpu_linear_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
	int64_t N = rows_of(x), I = w->shape[1], O = w->shape[0];
	const float *g = pt_tensor_f32(dy);
	bool packed_db = false; /* the bias gradient came with dy's packing */

	if (native_bf16(c) && N > 0 && I > 0 && O > 0) {
		PT_TRY(cpu_bf16_linear_backward(
		    N, I, O, g, packed_input(x) ? NULL : pt_tensor_f32(x), packed_input(x),
		    pt_tensor_f32(w), c->out[0] != NULL ? pt_tensor_f32(c->out[0]) : NULL,
		    c->p.linear.accum_dx, c->out[1] != NULL ? pt_tensor_f32(c->out[1]) : NULL,
		    c->out[2] != NULL ? pt_tensor_f32(c->out[2]) : NULL));
		packed_db = true;
	} else {
		if (c->out[0] != NULL)
			PT_TRY(cpu_gemm_prec(
			    c->prec, false, false, N, I, O, 1.0f, g, O, pt_tensor_f32(w), I,
			    c->p.linear.accum_dx ? 1.0f : 0.0f, pt_tensor_f32(c->out[0]), I));
		if (c->out[1] != NULL) { /* NULL: the input gradient only (split backward) */
			const float *xf;
			PT_TRY(input_f32(c, x, &xf));
			PT_TRY(cpu_gemm_prec(c->prec, true, false, O, I, N, 1.0f, g, O, xf, I, 1.0f,
			                     pt_tensor_f32(c->out[1]), I));
		}
	}
	if (c->out[2] != NULL && !packed_db)
		cpu_bias_grad(g, pt_tensor_f32(c->out[2]), N, O);
	return PT_OK;
}
