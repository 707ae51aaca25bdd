/* cpu_attention.c - causal multi-head self-attention core, blocked by rows.
 *
 * qkv (B, T, 3C) holds q | k | v per position; head h uses columns
 * [h*hs, (h+1)*hs) of each. Each (batch, head) pair is independent: pairs are
 * spread over the OpenMP budget and each runs single-threaded sgemm calls
 * (oneDNN does not nest parallelism), so results do not depend on the thread
 * count.
 *
 * Queries go in strips of PT_ATTN_ROWS rows. A strip's scores reach only the
 * keys up to its last row, so only the causal staircase is computed (about
 * half of T x T), and each strip holds whole causal rows: its softmax is exact,
 * with no running rescale. The forward saves each row's log-sum-exp
 * lse (B, NH, T), never the T x T probabilities; the backward recomputes a
 * strip's probabilities as exp(score - lse) in a per-thread buffer of
 * 2 x PT_ATTN_ROWS x T floats. bf16 and tf32 precision: each (batch, head)
 * rounds its q, k, v (and in the backward its output gradient) once into the
 * thread's workspace, and each strip rounds its probabilities (and score
 * gradients) in place before they enter a product, so the products are plain
 * sgemm calls on rounded operands: the emulation's numerics (what a bf16 GEMM
 * with f32 accumulation computes) at fp32 speed. Where the native bf16
 * kernels run (pt_cpu_bf16_native) and T <= NATIVE_MAX_T, bf16 packs the
 * same operands to bf16 instead and runs the products of each strip (of
 * NATIVE_ROWS rows) on oneDNN's
 * bf16 matmul (cpu_bf16_gemm_packed): the same rounded operands, the sums
 * in another order. Softmax and its backward stay f32.
 *
 * fp32 on a CPU with AVX-512, heads a multiple of 16 wide: the strips'
 * products run in registers (cpu_attn512.c) and stop at each 4-row tile's
 * causal edge; the head's k (and in the backward v) is first transposed
 * into the workspace (hs x Tp, Tp = T rounded up to 16) so scores read
 * whole vectors of keys. bf16 on a CPU with AVX512_BF16, heads a multiple of
 * 32 wide, at any context: the same tiles on bf16 dot products
 * (cpu_attn_bf16.c), in place of the native strips; the head's operands are
 * rounded once into the workspace in the layouts the products read, and each
 * strip's probabilities (and score gradients) once after its softmax.
 */
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_math.h"

#define PT_ATTN_ROWS 32
/* The bf16 tiles index interleaved rows from a strip's start r0 / 2, and
 * only the last strip may end on a half pair. */
_Static_assert(PT_ATTN_ROWS % 2 == 0, "strips of an even number of rows");
/* Native bf16 strips are taller: each oneDNN call costs more than a
 * dnnl_sgemm one, and 64 rows beat 32, 48, 96 and 128 at W2 and W3 (T 128,
 * 256: 13 and 10 % faster than 32). */
#define NATIVE_ROWS 64
/* Native bf16 strips up to this context: 6 products x T / NATIVE_ROWS
 * shapes stay within each thread's primitive cache (cpu_bf16.c). */
#define NATIVE_MAX_T 256

typedef struct {
	int64_t T, C, C3, hs, NH;
	float scale;
	pt_precision prec;
	bool native; /* bf16 on the native kernels (oneDNN's strips) */
	bool tiles;  /* bf16 on the AVX512_BF16 tiles */
	bool fast;   /* fp32 on the AVX-512 tiles */
	bool vec;    /* softmax and its backward on AVX-512 */
} attn_dims;

static atomic_int attn_choice = -1; /* -1: the environment's, 0: sgemm, 1: avx512 */

void pt_cpu_attention_select(bool avx512)
{
	atomic_store(&attn_choice, avx512 ? 1 : 0);
}

/* avx512_on: the AVX-512 tiles are allowed (the environment or the
 * selection); the CPU and head size decide the rest. */
static bool avx512_on(void)
{
	int c = atomic_load(&attn_choice);
	if (c < 0) {
		const char *env = getenv("PIPETRAIN_ATTN_KERNELS");
		c = env != NULL && strcmp(env, "sgemm") == 0 ? 0 : 1;
		atomic_store(&attn_choice, c);
	}
	return c == 1;
}

const char *pt_cpu_attention_kernel(void)
{
	return avx512_on() && cpu_attn512_usable(16) ? "avx512f" : "sgemm";
}

const char *pt_cpu_attention_bf16_kernel(void)
{
	if (!pt_cpu_bf16_native(NULL))
		return "emulated";
	return avx512_on() && cpu_attnbf16_usable(32) ? "avx512_bf16" : "onednn";
}

/* padded: T rounded up to whole vectors of 16 floats. */
static int64_t padded(int64_t T)
{
	return (T + 15) / 16 * 16;
}

static attn_dims dims_of(const pt_op_call *c, const pt_tensor *qkv)
{
	attn_dims d;
	d.T = qkv->shape[1];
	d.C3 = qkv->shape[2];
	d.C = d.C3 / 3;
	d.NH = c->p.attention.n_head;
	d.hs = d.C / d.NH;
	d.scale = 1.0f / sqrtf((float)d.hs);
	d.prec = (pt_precision)c->prec;
	d.tiles = d.prec == PT_PREC_BF16 && pt_cpu_bf16_native(NULL) && avx512_on() &&
	          cpu_attnbf16_usable(d.hs);
	d.native =
	    d.prec == PT_PREC_BF16 && !d.tiles && d.T <= NATIVE_MAX_T && pt_cpu_bf16_native(NULL);
	d.fast = d.prec == PT_PREC_FP32 && avx512_on() && cpu_attn512_usable(d.hs);
	d.vec = avx512_on() && cpu_attn512_cpu();
	return d;
}

/* strip_floats: one strip of scores, min(T, rows) x T. */
static int64_t strip_floats(int64_t T, int64_t rows)
{
	return (T < rows ? T : rows) * T;
}

/* pair_strip: 32-bit words of one strip of bf16 pairs (rows or pairs of
 * rows, either rounded up to whole pairs). */
static int64_t pair_strip(int64_t T)
{
	int64_t rows = T < PT_ATTN_ROWS ? T : PT_ATTN_ROWS;
	return (rows + 1) / 2 * (T + 1);
}

/* thread_floats: one thread's workspace: two strips of PT_ATTN_ROWS, and at
 * a rounding precision the head's rounded q, k, v and output gradient (T x hs
 * floats each); natively two f32 strips of NATIVE_ROWS, two packed ones and
 * the packed operands. At bf16 either fits, so the size does not depend on
 * the kernels picked. */
static int64_t thread_floats(const attn_dims *d)
{
	int64_t emu = 2 * strip_floats(d->T, PT_ATTN_ROWS) + 4 * d->T * d->hs;
	int64_t nat = 3 * strip_floats(d->T, NATIVE_ROWS) + 2 * d->T * d->hs;
	int64_t til = 2 * strip_floats(d->T, PT_ATTN_ROWS) + 3 * pair_strip(d->T) +
	              7 * d->hs * padded(d->T) / 2;
	if (d->prec == PT_PREC_FP32)
		return 2 * strip_floats(d->T, PT_ATTN_ROWS) +
		       (d->fast ? 2 * d->hs * padded(d->T) : 0);
	if (til > nat)
		nat = til;
	return emu > nat ? emu : nat;
}

size_t cpu_attention_workspace(const pt_op_call *c)
{
	const pt_tensor *qkv = c->op == PT_OP_ATTENTION_FWD ? c->in[0] : c->in[1];
	attn_dims d = dims_of(c, qkv);
	return (size_t)omp_get_max_threads() * (size_t)thread_floats(&d) * sizeof(float);
}

/* team sets *per, the floats of one thread's workspace, and *nthreads, the
 * threads a kernel may start: its own budget, but never more than the
 * workspace was planned for (a call planned on a thread with a smaller
 * budget than the one that runs it must not write past ws). */
static pt_err team(const pt_op_call *c, const attn_dims *d, int64_t *per, int *nthreads)
{
	*per = thread_floats(d);
	size_t fit = c->workspace / ((size_t)*per * sizeof(float));
	int n = omp_get_max_threads();
	*nthreads = fit < (size_t)n ? (int)fit : n;
	if (*nthreads < 1)
		return pt_set_error(PT_ERR_STATE,
		                    "attention: workspace of %zu bytes for %" PRId64 " x %" PRId64
		                    " scores",
		                    c->workspace, strip_floats(d->T, PT_ATTN_ROWS) / d->T, d->T);
	return PT_OK;
}

/* head_operands points *q, *k, *v (and *ld) at the head's operands as the
 * products take them: the tensor's columns (stride C3), or at a rounding
 * precision their rounded copies in buf (stride hs). */
static void head_operands(const attn_dims *d, const float *q, float *buf, const float **qo,
                          const float **ko, const float **vo, int64_t *ld)
{
	if (d->prec == PT_PREC_FP32) {
		*qo = q;
		*ko = q + d->C;
		*vo = q + 2 * d->C;
		*ld = d->C3;
		return;
	}
	for (int i = 0; i < 3; i++)
		for (int64_t t = 0; t < d->T; t++)
			cpu_round_row(d->prec, buf + (i * d->T + t) * d->hs,
			              q + i * d->C + t * d->C3, d->hs);
	*qo = buf;
	*ko = buf + d->T * d->hs;
	*vo = buf + 2 * d->T * d->hs;
	*ld = d->hs;
}

/* round_row rounds a strip's row in place at a rounding precision. */
static void round_row(const attn_dims *d, float *row, int64_t n)
{
	if (d->prec != PT_PREC_FP32)
		cpu_round_row(d->prec, row, row, n);
}

/* strip_softmax turns a strip's scores s (n rows of kn) into causal
 * probabilities in place (zeros past each row's last key) and writes each
 * row's log-sum-exp to lse[r0 + i]; rounded at a rounding precision when
 * round. */
static void strip_softmax(const attn_dims *d, float *s, float *lse, int64_t r0, int64_t n,
                          int64_t kn, bool round)
{
	if (d->vec) {
		cpu_attn512_softmax(s, lse + r0, r0, n, kn);
		for (int64_t i = 0; i < n && round; i++)
			round_row(d, s + i * kn, r0 + i + 1);
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		float *row = s + i * kn, mx, sum;
		int64_t len = r0 + i + 1;
		pt_softmax_row(row, row, len, &mx, &sum);
		lse[r0 + i] = mx + logf(sum);
		memset(row + len, 0, sizeof(float) * (size_t)(kn - len));
		if (round)
			round_row(d, row, len);
	}
}

/* strip_grads turns a strip's scale q k^T in p and dout v^T in dp into the
 * probabilities exp(score - lse) and the score gradients (the score scale
 * folded in), zeros past each row's last key; rounded when round. */
static void strip_grads(const attn_dims *d, float *p, float *dp, const float *lse, int64_t r0,
                        int64_t n, int64_t kn, bool round)
{
	if (d->vec) {
		cpu_attn512_grads(p, dp, lse + r0, r0, n, kn, d->scale);
		for (int64_t i = 0; i < n && round; i++) {
			round_row(d, p + i * kn, r0 + i + 1);
			round_row(d, dp + i * kn, r0 + i + 1);
		}
		return;
	}
	for (int64_t i = 0; i < n; i++) {
		float *pr = p + i * kn, *dr = dp + i * kn, l = lse[r0 + i], dot = 0.0f;
		int64_t len = r0 + i + 1;
#pragma omp simd
		for (int64_t j = 0; j < len; j++)
			pr[j] = pt_expf(pr[j] - l);
		memset(pr + len, 0, sizeof(float) * (size_t)(kn - len));
#pragma omp simd reduction(+ : dot)
		for (int64_t j = 0; j < len; j++)
			dot += pr[j] * dr[j];
#pragma omp simd
		for (int64_t j = 0; j < len; j++)
			dr[j] = d->scale * pr[j] * (dr[j] - dot);
		memset(dr + len, 0, sizeof(float) * (size_t)(kn - len));
		if (round) {
			round_row(d, pr, len);
			round_row(d, dr, len);
		}
	}
}

/* zero_dkv zeroes the head's dk and dv columns (dq's at C and 2C): they
 * gather over strips. */
static void zero_dkv(const attn_dims *d, float *dq)
{
	for (int64_t t = 0; t < d->T; t++) {
		memset(dq + d->C + t * d->C3, 0, sizeof(float) * (size_t)d->hs);
		memset(dq + 2 * d->C + t * d->C3, 0, sizeof(float) * (size_t)d->hs);
	}
}

/* pack_head packs the head's q, k, v (stride C3) and, when dout is not NULL,
 * its output gradient (stride C) to bf16 in buf: T x hs each, back to back. */
static void pack_head(const attn_dims *d, const float *q, const float *dout, uint16_t *buf)
{
	for (int i = 0; i < 3; i++)
		cpu_pack_bf16(buf + i * d->T * d->hs, q + i * d->C, d->T, d->hs, d->C3, true);
	if (dout != NULL)
		cpu_pack_bf16(buf + 3 * d->T * d->hs, dout, d->T, d->hs, d->C, true);
}

/* head_forward_native is head_forward on the native bf16 kernels; ws holds
 * the f32 strip, a packed strip and the packed operands. */
static pt_err head_forward_native(const attn_dims *d, const float *qkv, float *o, float *lse,
                                  float *ws)
{
	int64_t sf = strip_floats(d->T, NATIVE_ROWS), th = d->T * d->hs;
	float *s = ws;
	uint16_t *ps = (uint16_t *)(ws + 2 * sf), *q = (uint16_t *)(ws + 3 * sf), *k = q + th,
	         *v = k + th;

	pack_head(d, qkv, NULL, q);
	for (int64_t r0 = 0; r0 < d->T; r0 += NATIVE_ROWS) {
		int64_t n = d->T - r0 < NATIVE_ROWS ? d->T - r0 : NATIVE_ROWS, kn = r0 + n;
		PT_TRY(cpu_bf16_gemm_packed(false, true, n, kn, d->hs, d->scale, q + r0 * d->hs, k,
		                            0.0f, s, kn));
		strip_softmax(d, s, lse, r0, n, kn, false);
		cpu_pack_bf16(ps, s, n, kn, kn, true);
		PT_TRY(cpu_bf16_gemm_packed(false, false, n, d->hs, kn, 1.0f, ps, v, 0.0f,
		                            o + r0 * d->C, d->C));
	}
	return PT_OK;
}

/* transpose_head writes the head's T x hs columns at x (rows C3 apart) to
 * xt as hs x Tp, zeros past T (the fast kernels only: 16 x 16 blocks in
 * registers, each store a whole cache line; a float at a time, rows of xt
 * 1 KB apart at T 256 share 4 of L1's 64 sets and cost 100 k cycles a
 * head). */
static void transpose_head(const attn_dims *d, const float *x, float *xt)
{
	cpu_attn512_transpose(x, d->C3, d->T, d->hs, xt, padded(d->T));
}

/* prefetch_rows asks for rows [r0, r0 + n) of a head's columns at x (hs
 * floats, rows ld apart) ahead of their use, into L2; for writing when
 * write. The next head's rows go while this one's strips compute: rows
 * 3 KB and more apart defeat the hardware's prefetch, and a cold head
 * otherwise waits on each row in turn. */
static void prefetch_rows(const attn_dims *d, const float *x, int64_t ld, int64_t r0, int64_t n,
                          int64_t width, bool write)
{
	if (x == NULL)
		return;
	for (int64_t t = r0; t < r0 + n; t++)
		for (int64_t c = 0; c < width; c += 16) {
			if (write)
				__builtin_prefetch(x + t * ld + c, 1, 2);
			else
				__builtin_prefetch(x + t * ld + c, 0, 2);
		}
}

/* prefetch_qkv: prefetch_rows for a head's q, k and v columns at x. */
static void prefetch_qkv(const attn_dims *d, const float *x, int64_t r0, int64_t n, bool write)
{
	for (int i = 0; x != NULL && i < 3; i++)
		prefetch_rows(d, x + i * d->C, d->C3, r0, n, d->hs, write);
}

/* The next head's operands, for the fast kernels to prefetch. */
typedef struct {
	const float *qkv, *dout;
	float *dqkv;
} head_next;

/* head_forward_fast is head_forward on the AVX-512 tiles; ws holds a strip,
 * another (unused here) and k transposed; next (or NULL) is the next head's
 * q, prefetched. */
static void head_forward_fast(const attn_dims *d, const float *qkv, float *o, float *lse,
                              float *ws, const float *next)
{
	float *s = ws, *kt = ws + 2 * strip_floats(d->T, PT_ATTN_ROWS);
	int64_t Tp = padded(d->T);

	transpose_head(d, qkv + d->C, kt);
	for (int64_t r0 = 0; r0 < d->T; r0 += PT_ATTN_ROWS) {
		int64_t n = d->T - r0 < PT_ATTN_ROWS ? d->T - r0 : PT_ATTN_ROWS, kn = r0 + n;
		prefetch_qkv(d, next, r0, n, false);
		cpu_attn512_scores(n, r0, d->hs, d->scale, qkv + r0 * d->C3, d->C3, kt, Tp, s, kn);
		strip_softmax(d, s, lse, r0, n, kn, false);
		cpu_attn512_acc(n, kn, d->hs, s, kn, 1, qkv + 2 * d->C, d->C3, o + r0 * d->C, d->C,
		                false, CPU_ATTN_QUERY_ROWS, r0);
	}
}

/* head_forward_tiles is head_forward on the AVX512_BF16 tiles; ws holds a
 * strip, its probabilities as pairs, and the head's q (rows of pairs), k
 * (transposed pairs) and v (interleaved pairs). */
static void head_forward_tiles(const attn_dims *d, const float *qkv, float *o, float *lse,
                               float *ws, const float *next)
{
	int64_t sf = strip_floats(d->T, PT_ATTN_ROWS), Tp = padded(d->T), hp = d->hs / 2;
	float *s = ws;
	uint32_t *ps = (uint32_t *)(ws + 2 * sf), *q = ps + pair_strip(d->T), *kt = q + Tp * hp,
	         *vv = kt + Tp * hp;

	cpu_attnbf16_rows(qkv, d->C3, d->T, d->hs, q, hp);
	cpu_attnbf16_transpose(qkv + d->C, d->C3, d->T, d->hs, kt, Tp);
	cpu_attnbf16_interleave(qkv + 2 * d->C, d->C3, d->T, d->hs, vv, d->hs);
	for (int64_t r0 = 0; r0 < d->T; r0 += PT_ATTN_ROWS) {
		int64_t n = d->T - r0 < PT_ATTN_ROWS ? d->T - r0 : PT_ATTN_ROWS, kn = r0 + n;
		int64_t kp = (kn + 1) / 2;
		prefetch_qkv(d, next, r0, n, false);
		cpu_attnbf16_scores(n, r0, d->hs, d->scale, q + r0 * hp, hp, kt, Tp, s, kn);
		strip_softmax(d, s, lse, r0, n, kn, false);
		cpu_attnbf16_rows(s, kn, n, kn, ps, kp);
		cpu_attnbf16_acc(n, kn, d->hs, ps, kp, 1, vv, d->hs, o + r0 * d->C, d->C, false,
		                 CPU_ATTN_QUERY_ROWS, r0);
	}
}

/* One (batch, head): out rows and lse for q, k, v at stride C3; ws holds
 * two strips and the rounded operands; next (or NULL) is the next head's
 * q, for the fast kernel to prefetch. */
static pt_err head_forward(const attn_dims *d, const float *qkv, float *o, float *lse, float *ws,
                           const float *next)
{
	const float *q, *k, *v;
	float *s = ws;
	int64_t ld;
	if (d->tiles) {
		head_forward_tiles(d, qkv, o, lse, ws, next);
		return PT_OK;
	}
	if (d->native)
		return head_forward_native(d, qkv, o, lse, ws);
	if (d->fast) {
		head_forward_fast(d, qkv, o, lse, ws, next);
		return PT_OK;
	}
	head_operands(d, qkv, ws + 2 * strip_floats(d->T, PT_ATTN_ROWS), &q, &k, &v, &ld);
	for (int64_t r0 = 0; r0 < d->T; r0 += PT_ATTN_ROWS) {
		int64_t n = d->T - r0 < PT_ATTN_ROWS ? d->T - r0 : PT_ATTN_ROWS, kn = r0 + n;
		PT_TRY(cpu_gemm(false, true, n, kn, d->hs, d->scale, q + r0 * ld, ld, k, ld, 0.0f,
		                s, kn));
		strip_softmax(d, s, lse, r0, n, kn, true);
		PT_TRY(cpu_gemm(false, false, n, d->hs, kn, 1.0f, s, kn, v, ld, 0.0f, o + r0 * d->C,
		                d->C));
	}
	return PT_OK;
}

pt_err cpu_attention_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *qt = c->in[0];
	attn_dims d = dims_of(c, qt);
	int64_t B = qt->shape[0], T = d.T, per;
	const float *qkv = pt_tensor_f32(qt);
	float *out = pt_tensor_f32(c->out[0]), *lse = pt_tensor_f32(c->out[1]);
	int nthreads;
	pt_err err = PT_OK;

	PT_TRY(team(c, &d, &per, &nthreads));

#pragma omp parallel for schedule(static) num_threads(nthreads)
	for (int64_t bh = 0; bh < B * d.NH; bh++) {
		int64_t b = bh / d.NH, h = bh % d.NH;
		float *s = (float *)ws + (size_t)omp_get_thread_num() * (size_t)per;
		int64_t nb = (bh + 1) / d.NH, nh = (bh + 1) % d.NH;
		pt_err e = head_forward(&d, qkv + b * T * d.C3 + h * d.hs,
		                        out + b * T * d.C + h * d.hs, lse + bh * T, s,
		                        bh + 1 < B * d.NH ? qkv + nb * T * d.C3 + nh * d.hs : NULL);
		if (e != PT_OK) {
#pragma omp critical
			err = e;
		}
	}
	return err;
}

/* head_backward_native is head_backward on the native bf16 kernels; ws
 * holds the two f32 strips, two packed strips and the packed operands. */
static pt_err head_backward_native(const attn_dims *d, const float *qkv, const float *dout,
                                   const float *lse, float *dq, bool accum, float *ws)
{
	int64_t sf = strip_floats(d->T, NATIVE_ROWS), th = d->T * d->hs;
	float *dk = dq + d->C, *dv = dq + 2 * d->C, *p = ws, *dp = ws + sf;
	uint16_t *pp = (uint16_t *)(ws + 2 * sf), *dsp = pp + sf;
	uint16_t *q = (uint16_t *)(ws + 3 * sf), *k = q + th, *v = k + th, *g = v + th;
	float beta = accum ? 1.0f : 0.0f;

	pack_head(d, qkv, dout, q);
	if (!accum)
		zero_dkv(d, dq);
	for (int64_t r0 = 0; r0 < d->T; r0 += NATIVE_ROWS) {
		int64_t n = d->T - r0 < NATIVE_ROWS ? d->T - r0 : NATIVE_ROWS, kn = r0 + n;
		const uint16_t *qs = q + r0 * d->hs, *gs = g + r0 * d->hs;
		PT_TRY(
		    cpu_bf16_gemm_packed(false, true, n, kn, d->hs, d->scale, qs, k, 0.0f, p, kn));
		PT_TRY(cpu_bf16_gemm_packed(false, true, n, kn, d->hs, 1.0f, gs, v, 0.0f, dp, kn));
		strip_grads(d, p, dp, lse, r0, n, kn, false);
		cpu_pack_bf16(pp, p, n, kn, kn, true);
		cpu_pack_bf16(dsp, dp, n, kn, kn, true);
		/* dv += p^T dout ; dq = ds k ; dk += ds^T q */
		PT_TRY(
		    cpu_bf16_gemm_packed(true, false, kn, d->hs, n, 1.0f, pp, gs, 1.0f, dv, d->C3));
		PT_TRY(cpu_bf16_gemm_packed(false, false, n, d->hs, kn, 1.0f, dsp, k, beta,
		                            dq + r0 * d->C3, d->C3));
		PT_TRY(cpu_bf16_gemm_packed(true, false, kn, d->hs, n, 1.0f, dsp, qs, 1.0f, dk,
		                            d->C3));
	}
	return PT_OK;
}

/* head_backward_fast is head_backward on the AVX-512 tiles; ws holds two
 * strips, k and v transposed. */
static void head_backward_fast(const attn_dims *d, const float *qkv, const float *dout,
                               const float *lse, float *dq, bool accum, float *ws,
                               const head_next *next)
{
	int64_t sf = strip_floats(d->T, PT_ATTN_ROWS), Tp = padded(d->T);
	float *p = ws, *dp = ws + sf, *kt = ws + 2 * sf, *vt = kt + d->hs * Tp;
	const float *k = qkv + d->C;
	float *dk = dq + d->C, *dv = dq + 2 * d->C;

	transpose_head(d, k, kt);
	transpose_head(d, qkv + 2 * d->C, vt);
	if (!accum)
		zero_dkv(d, dq);
	for (int64_t r0 = 0; r0 < d->T; r0 += PT_ATTN_ROWS) {
		int64_t n = d->T - r0 < PT_ATTN_ROWS ? d->T - r0 : PT_ATTN_ROWS, kn = r0 + n;
		const float *qs = qkv + r0 * d->C3, *gs = dout + r0 * d->C;
		if (next != NULL) {
			prefetch_qkv(d, next->qkv, r0, n, false);
			prefetch_rows(d, next->dout, d->C, r0, n, d->hs, false);
			prefetch_qkv(d, next->dqkv, r0, n, true);
		}
		/* p = exp(scale q k^T - lse) on the causal part; dp = dout v^T */
		cpu_attn512_scores(n, r0, d->hs, d->scale, qs, d->C3, kt, Tp, p, kn);
		cpu_attn512_scores(n, r0, d->hs, 1.0f, gs, d->C, vt, Tp, dp, kn);
		strip_grads(d, p, dp, lse, r0, n, kn, false);
		/* dv += p^T dout ; dq = ds k ; dk += ds^T q */
		cpu_attn512_acc(kn, n, d->hs, p, 1, kn, gs, d->C, dv, d->C3, true, CPU_ATTN_KEY_ROWS,
		                r0);
		cpu_attn512_acc(n, kn, d->hs, dp, kn, 1, k, d->C3, dq + r0 * d->C3, d->C3, accum,
		                CPU_ATTN_QUERY_ROWS, r0);
		cpu_attn512_acc(kn, n, d->hs, dp, 1, kn, qs, d->C3, dk, d->C3, true,
		                CPU_ATTN_KEY_ROWS, r0);
	}
}

/* head_backward_tiles is head_backward on the AVX512_BF16 tiles; ws holds
 * two strips, three strips of pairs and the head's operands as the
 * products read them. */
static void head_backward_tiles(const attn_dims *d, const float *qkv, const float *dout,
                                const float *lse, float *dq, bool accum, float *ws,
                                const head_next *next)
{
	int64_t sf = strip_floats(d->T, PT_ATTN_ROWS), Tp = padded(d->T), hp = d->hs / 2,
	        hw = Tp * hp; /* words of one head operand */
	float *p = ws, *dp = ws + sf, *dk = dq + d->C, *dv = dq + 2 * d->C;
	uint32_t *dsr = (uint32_t *)(ws + 2 * sf), *pi = dsr + pair_strip(d->T),
	         *dsi = pi + pair_strip(d->T);
	/* q, dout as rows of pairs; k, v transposed; k, dout, q interleaved */
	uint32_t *q = dsi + pair_strip(d->T), *g = q + hw, *kt = g + hw, *vt = kt + hw,
	         *kv = vt + hw, *gv = kv + hw, *qv = gv + hw;
	const float *k = qkv + d->C;

	cpu_attnbf16_rows(qkv, d->C3, d->T, d->hs, q, hp);
	cpu_attnbf16_rows(dout, d->C, d->T, d->hs, g, hp);
	cpu_attnbf16_transpose(k, d->C3, d->T, d->hs, kt, Tp);
	cpu_attnbf16_transpose(qkv + 2 * d->C, d->C3, d->T, d->hs, vt, Tp);
	cpu_attnbf16_interleave(k, d->C3, d->T, d->hs, kv, d->hs);
	cpu_attnbf16_interleave(dout, d->C, d->T, d->hs, gv, d->hs);
	cpu_attnbf16_interleave(qkv, d->C3, d->T, d->hs, qv, d->hs);
	if (!accum)
		zero_dkv(d, dq);
	for (int64_t r0 = 0; r0 < d->T; r0 += PT_ATTN_ROWS) {
		int64_t n = d->T - r0 < PT_ATTN_ROWS ? d->T - r0 : PT_ATTN_ROWS, kn = r0 + n;
		int64_t kp = (kn + 1) / 2;
		const uint32_t *gs = gv + r0 / 2 * d->hs, *qs = qv + r0 / 2 * d->hs;
		if (next != NULL) {
			prefetch_qkv(d, next->qkv, r0, n, false);
			prefetch_rows(d, next->dout, d->C, r0, n, d->hs, false);
			prefetch_qkv(d, next->dqkv, r0, n, true);
		}
		/* p = exp(scale q k^T - lse) on the causal part; dp = dout v^T */
		cpu_attnbf16_scores(n, r0, d->hs, d->scale, q + r0 * hp, hp, kt, Tp, p, kn);
		cpu_attnbf16_scores(n, r0, d->hs, 1.0f, g + r0 * hp, hp, vt, Tp, dp, kn);
		strip_grads(d, p, dp, lse, r0, n, kn, false);
		cpu_attnbf16_rows(dp, kn, n, kn, dsr, kp);
		cpu_attnbf16_interleave(p, kn, n, kn, pi, kn);
		cpu_attnbf16_interleave(dp, kn, n, kn, dsi, kn);
		/* dv += p^T dout ; dq = ds k ; dk += ds^T q */
		cpu_attnbf16_acc(kn, n, d->hs, pi, 1, kn, gs, d->hs, dv, d->C3, true,
		                 CPU_ATTN_KEY_ROWS, r0);
		cpu_attnbf16_acc(n, kn, d->hs, dsr, kp, 1, kv, d->hs, dq + r0 * d->C3, d->C3, accum,
		                 CPU_ATTN_QUERY_ROWS, r0);
		cpu_attnbf16_acc(kn, n, d->hs, dsi, 1, kn, qs, d->hs, dk, d->C3, true,
		                 CPU_ATTN_KEY_ROWS, r0);
	}
}

/* One (batch, head): dq, dk, dv (stride C3) from dout (stride C) and lse;
 * ws holds two strips and the rounded operands. dk and dv gather over
 * strips, so they start from zero unless accumulating. */
static pt_err head_backward(const attn_dims *d, const float *qkv, const float *dout_c,
                            const float *lse, float *dq, bool accum, float *ws,
                            const head_next *next)
{
	const float *q, *k, *v, *dout = dout_c;
	float *dk = dq + d->C, *dv = dq + 2 * d->C, *p = ws,
	      *dp = ws + strip_floats(d->T, PT_ATTN_ROWS);
	float *rounded = ws + 2 * strip_floats(d->T, PT_ATTN_ROWS);
	float beta = accum ? 1.0f : 0.0f;
	int64_t ld, ldo = d->C;

	if (d->tiles) {
		head_backward_tiles(d, qkv, dout_c, lse, dq, accum, ws, next);
		return PT_OK;
	}
	if (d->native)
		return head_backward_native(d, qkv, dout_c, lse, dq, accum, ws);
	if (d->fast) {
		head_backward_fast(d, qkv, dout_c, lse, dq, accum, ws, next);
		return PT_OK;
	}
	head_operands(d, qkv, rounded, &q, &k, &v, &ld);
	if (d->prec != PT_PREC_FP32) {
		float *r = rounded + 3 * d->T * d->hs;
		for (int64_t t = 0; t < d->T; t++)
			cpu_round_row(d->prec, r + t * d->hs, dout_c + t * d->C, d->hs);
		dout = r;
		ldo = d->hs;
	}
	if (!accum)
		zero_dkv(d, dq);
	for (int64_t r0 = 0; r0 < d->T; r0 += PT_ATTN_ROWS) {
		int64_t n = d->T - r0 < PT_ATTN_ROWS ? d->T - r0 : PT_ATTN_ROWS, kn = r0 + n;
		const float *qs = q + r0 * ld, *ds = dout + r0 * ldo;
		/* p = exp(scale q k^T - lse) on the causal part; dp = dout v^T */
		PT_TRY(cpu_gemm(false, true, n, kn, d->hs, d->scale, qs, ld, k, ld, 0.0f, p, kn));
		PT_TRY(cpu_gemm(false, true, n, kn, d->hs, 1.0f, ds, ldo, v, ld, 0.0f, dp, kn));
		strip_grads(d, p, dp, lse, r0, n, kn, true);
		/* dv += p^T dout ; dq = ds k ; dk += ds^T q */
		PT_TRY(cpu_gemm(true, false, kn, d->hs, n, 1.0f, p, kn, ds, ldo, 1.0f, dv, d->C3));
		PT_TRY(cpu_gemm(false, false, n, d->hs, kn, 1.0f, dp, kn, k, ld, beta,
		                dq + r0 * d->C3, d->C3));
		PT_TRY(cpu_gemm(true, false, kn, d->hs, n, 1.0f, dp, kn, qs, ld, 1.0f, dk, d->C3));
	}
	return PT_OK;
}

pt_err cpu_attention_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *qt = c->in[1];
	attn_dims d = dims_of(c, qt);
	int64_t B = qt->shape[0], T = d.T, per;
	const float *dout = pt_tensor_f32(c->in[0]), *qkv = pt_tensor_f32(qt);
	const float *lse = pt_tensor_f32(c->in[2]);
	float *dqkv = pt_tensor_f32(c->out[0]);
	bool accum = c->p.attention.accum_dx;
	int nthreads;
	pt_err err = PT_OK;

	PT_TRY(team(c, &d, &per, &nthreads));

#pragma omp parallel for schedule(static) num_threads(nthreads)
	for (int64_t bh = 0; bh < B * d.NH; bh++) {
		int64_t b = bh / d.NH, h = bh % d.NH;
		float *w = (float *)ws + (size_t)omp_get_thread_num() * (size_t)per;
		int64_t nb = (bh + 1) / d.NH, nh = (bh + 1) % d.NH;
		head_next next = {qkv + nb * T * d.C3 + nh * d.hs, dout + nb * T * d.C + nh * d.hs,
		                  dqkv + nb * T * d.C3 + nh * d.hs};
		pt_err e =
		    head_backward(&d, qkv + b * T * d.C3 + h * d.hs, dout + b * T * d.C + h * d.hs,
		                  lse + bh * T, dqkv + b * T * d.C3 + h * d.hs, accum, w,
		                  bh + 1 < B * d.NH ? &next : NULL);
		if (e != PT_OK) {
#pragma omp critical
			err = e;
		}
	}
	return err;
}
