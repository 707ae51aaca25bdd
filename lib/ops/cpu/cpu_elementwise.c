/* cpu_elementwise.c - fill, copy, scale, add, activations, dropout, softmax.
 *
 * Loops are written for `#pragma omp simd`; large tensors split across the
 * calling thread's OpenMP budget in contiguous chunks, so results do not
 * depend on the thread count (no cross-element reductions here).
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_math.h"
#include "rng.h"

/* Bytes from which a contiguous copy is split between threads. */
#define COPY_PAR_MIN ((size_t)16 << 20)

#define PAR_FOR _Pragma("omp parallel for simd schedule(static) if (n >= PT_CPU_PAR_MIN)")

pt_err cpu_fill(const pt_op_call *c, void *ws)
{
	pt_tensor *o = c->out[0];
	int64_t n = pt_tensor_numel(o);
	double v = c->p.fill.value;
	switch (o->dtype) {
	case PT_F32: {
		float *p = pt_tensor_f32(o), f = (float)v;
		if (f == 0.0f && !signbit(f)) {
			memset(p, 0, sizeof(float) * (size_t)n);
			break;
		}
		for (int64_t i = 0; i < n; i++)
			p[i] = f;
		break;
	}
	case PT_F64: {
		double *p = pt_tensor_data(o);
		for (int64_t i = 0; i < n; i++)
			p[i] = v;
		break;
	}
	case PT_I64: {
		int64_t *p = pt_tensor_data(o);
		for (int64_t i = 0; i < n; i++)
			p[i] = (int64_t)v;
		break;
	}
	case PT_I32: {
		int32_t *p = pt_tensor_data(o);
		for (int64_t i = 0; i < n; i++)
			p[i] = (int32_t)v;
		break;
	}
	default:
		return pt_set_error(PT_ERR_DTYPE, "fill: %s", pt_dtype_name(o->dtype));
	}
	return PT_OK;
}

pt_err cpu_copy(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[0];
	pt_tensor *o = c->out[0];
	size_t es = pt_dtype_size(x->dtype);
	int64_t n = pt_tensor_numel(x);
	int64_t idx[PT_MAX_DIMS] = {0};

	if (pt_tensor_is_contiguous(x) && pt_tensor_is_contiguous(o)) {
		char *dst = pt_tensor_data(o);
		const char *src = pt_tensor_data(x);
		size_t len = (size_t)n * es;
		/* A large copy between separate ranges (a checkpoint's gather of
		 * a stage's state: 1.96 GB at W3) in page-aligned pieces, one per
		 * thread: one core copies about 16-20 GB/s here, two 25-34. */
		if (len >= COPY_PAR_MIN && !omp_in_parallel() &&
		    (dst + len <= src || src + len <= dst)) {
#pragma omp parallel
			{
				int k = omp_get_thread_num(), t = omp_get_num_threads();
				size_t piece = (len / (size_t)t + 4095) & ~(size_t)4095,
				       at = piece * (size_t)k;
				if (at < len)
					memcpy(dst + at, src + at,
					       at + piece > len ? len - at : piece);
			}
			return PT_OK;
		}
		memmove(dst, src, len);
		return PT_OK;
	}
	for (int64_t k = 0; k < n; k++) {
		int64_t xo = x->offset, oo = o->offset;
		for (int d = 0; d < x->ndim; d++) {
			xo += idx[d] * x->strides[d];
			oo += idx[d] * o->strides[d];
		}
		memcpy((char *)o->storage->data + oo * (int64_t)es,
		       (char *)x->storage->data + xo * (int64_t)es, es);
		for (int d = x->ndim - 1; d >= 0; d--) {
			if (++idx[d] < x->shape[d])
				break;
			idx[d] = 0;
		}
	}
	return PT_OK;
}

pt_err cpu_scale(const pt_op_call *c, void *ws)
{
	const float *x = pt_tensor_f32(c->in[0]);
	float *y = pt_tensor_f32(c->out[0]), a = c->p.scale.alpha;
	int64_t n = pt_tensor_numel(c->in[0]);
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] = a * x[i];
	return PT_OK;
}

pt_err cpu_add(const pt_op_call *c, void *ws)
{
	const float *a = pt_tensor_f32(c->in[0]), *b = pt_tensor_f32(c->in[1]);
	float *y = pt_tensor_f32(c->out[0]);
	float al = c->p.add.alpha, be = c->p.add.beta;
	int64_t n = pt_tensor_numel(c->in[0]);
	if (al == 1.0f && be == 1.0f) {
		PAR_FOR
		for (int64_t i = 0; i < n; i++)
			y[i] = a[i] + b[i];
	} else {
		PAR_FOR
		for (int64_t i = 0; i < n; i++)
			y[i] = al * a[i] + be * b[i];
	}
	return PT_OK;
}

/* Activations run over chunks. The costly part (exp, tanh) is a loop over
 * restrict pointers into a local buffer, so it always vectorises; outputs may
 * then alias inputs (in-place backward) without forcing a scalar fallback.
 * The chunk bodies are built twice: for the baseline (x86-64-v3, AVX2) and,
 * picked at run time where the CPU has it, for AVX-512F. Same source, each
 * element's own arithmetic, so the same bits (test_elementwise checks). */
#define ACT_CHUNK  2048
#define ACT_INLINE static inline __attribute__((always_inline))

/* g[i] = act(x[i]) (forward) */
ACT_INLINE void act_values(pt_act kind, float *restrict g, const float *restrict x, int64_t n)
{
	switch (kind) {
	case PT_ACT_RELU:
		for (int64_t i = 0; i < n; i++)
			g[i] = x[i] > 0.0f ? x[i] : 0.0f;
		break;
	case PT_ACT_GELU:
		for (int64_t i = 0; i < n; i++) {
			float v = x[i];
			float u = PT_GELU_K * (v + 0.044715f * v * v * v);
			g[i] = 0.5f * v * (1.0f + pt_tanhf(u));
		}
		break;
	case PT_ACT_TANH:
		for (int64_t i = 0; i < n; i++)
			g[i] = pt_tanhf(x[i]);
		break;
	case PT_ACT_SIGMOID:
		for (int64_t i = 0; i < n; i++)
			g[i] = pt_sigmoidf(x[i]);
		break;
	}
}

/* g[i] = act'(.) from x (ReLU, GELU) or y (Tanh, Sigmoid) */
ACT_INLINE void act_slopes(pt_act kind, float *restrict g, const float *restrict x,
                           const float *restrict y, int64_t n)
{
	switch (kind) {
	case PT_ACT_RELU:
		for (int64_t i = 0; i < n; i++)
			g[i] = x[i] > 0.0f ? 1.0f : 0.0f;
		break;
	case PT_ACT_GELU:
		for (int64_t i = 0; i < n; i++) {
			float v = x[i];
			float u = PT_GELU_K * (v + 0.044715f * v * v * v);
			float t = pt_tanhf(u);
			float du = PT_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
			g[i] = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
		}
		break;
	case PT_ACT_TANH:
		for (int64_t i = 0; i < n; i++)
			g[i] = 1.0f - y[i] * y[i];
		break;
	case PT_ACT_SIGMOID:
		for (int64_t i = 0; i < n; i++)
			g[i] = y[i] * (1.0f - y[i]);
		break;
	}
}

/* One chunk (n <= ACT_CHUNK) forward: y = act(x). */
ACT_INLINE void act_fwd_body(pt_act kind, float *y, const float *x, int64_t n)
{
	float g[ACT_CHUNK];
	act_values(kind, g, x, n);
	memcpy(y, g, sizeof(float) * (size_t)n);
}

/* One chunk backward: dx (+)= act'(.) dy. */
ACT_INLINE void act_bwd_body(pt_act kind, float *d, const float *e, const float *x, const float *y,
                             int64_t n, bool acc)
{
	float g[ACT_CHUNK];
	act_slopes(kind, g, x, y, n);
	if (acc)
		for (int64_t i = 0; i < n; i++)
			d[i] += g[i] * e[i];
	else
		for (int64_t i = 0; i < n; i++)
			d[i] = g[i] * e[i];
}

static void act_fwd_base(pt_act kind, float *y, const float *x, int64_t n)
{
	act_fwd_body(kind, y, x, n);
}

static void act_bwd_base(pt_act kind, float *d, const float *e, const float *x, const float *y,
                         int64_t n, bool acc)
{
	act_bwd_body(kind, d, e, x, y, n, acc);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void act_fwd_512(pt_act kind, float *y, const float *x,
                                                           int64_t n)
{
	act_fwd_body(kind, y, x, n);
}

__attribute__((target("avx512f"))) static void act_bwd_512(pt_act kind, float *d, const float *e,
                                                           const float *x, const float *y,
                                                           int64_t n, bool acc)
{
	act_bwd_body(kind, d, e, x, y, n, acc);
}

static bool act_wide(void)
{
	return __builtin_cpu_supports("avx512f");
}
#else
#define act_fwd_512 act_fwd_base
#define act_bwd_512 act_bwd_base
static bool act_wide(void)
{
	return false;
}
#endif

typedef void (*act_fwd_fn)(pt_act, float *, const float *, int64_t);
typedef void (*act_bwd_fn)(pt_act, float *, const float *, const float *, const float *, int64_t,
                           bool);

const char *pt_cpu_activation_isa(void)
{
	return act_wide() ? "avx512f" : "x86-64-v3 (AVX2)";
}

void cpu_activation_rows(pt_act kind, bool backward, bool wide, float *out, const float *dy,
                         const float *x, const float *y, int64_t n, bool acc)
{
	bool w = wide && act_wide();
	for (int64_t lo = 0; lo < n; lo += ACT_CHUNK) {
		int64_t len = n - lo < ACT_CHUNK ? n - lo : ACT_CHUNK;
		if (backward)
			(w ? act_bwd_512 : act_bwd_base)(kind, out + lo, dy + lo, x ? x + lo : NULL,
			                                 y ? y + lo : NULL, len, acc);
		else
			(w ? act_fwd_512 : act_fwd_base)(kind, out + lo, x + lo, len);
	}
}

pt_err cpu_activation_forward(const pt_op_call *c, void *ws)
{
	const float *x = pt_tensor_f32(c->in[0]);
	bool half = c->out[0]->dtype == PT_BF16; /* y in bf16 (a product's input) */
	float *y = half ? NULL : pt_tensor_f32(c->out[0]);
	uint16_t *yh = half ? pt_tensor_data(c->out[0]) : NULL;
	int64_t n = pt_tensor_numel(c->in[0]), nchunks = (n + ACT_CHUNK - 1) / ACT_CHUNK;
	pt_act kind = c->p.act.kind;
	act_fwd_fn f = act_wide() ? act_fwd_512 : act_fwd_base;

#pragma omp parallel for schedule(static) if (n >= PT_CPU_PAR_MIN)
	for (int64_t k = 0; k < nchunks; k++) {
		int64_t lo = k * ACT_CHUNK, len = n - lo < ACT_CHUNK ? n - lo : ACT_CHUNK;
		if (!half) {
			f(kind, y + lo, x + lo, len);
		} else { /* the f32 chunk, rounded as a product packs it */
			float chunk[ACT_CHUNK];
			f(kind, chunk, x + lo, len);
			cpu_bf16_row(yh + lo, chunk, len);
		}
	}
	return PT_OK;
}

pt_err cpu_activation_backward(const pt_op_call *c, void *ws)
{
	const float *dy = pt_tensor_f32(c->in[0]);
	const float *x = c->in[1] ? pt_tensor_f32(c->in[1]) : NULL;
	const float *y = c->in[2] ? pt_tensor_f32(c->in[2]) : NULL;
	float *dx = pt_tensor_f32(c->out[0]);
	bool acc = c->p.act.accum_dx;
	int64_t n = pt_tensor_numel(c->in[0]), nchunks = (n + ACT_CHUNK - 1) / ACT_CHUNK;
	pt_act kind = c->p.act.kind;
	act_bwd_fn f = act_wide() ? act_bwd_512 : act_bwd_base;

#pragma omp parallel for schedule(static) if (n >= PT_CPU_PAR_MIN)
	for (int64_t k = 0; k < nchunks; k++) {
		int64_t lo = k * ACT_CHUNK, len = n - lo < ACT_CHUNK ? n - lo : ACT_CHUNK;
		f(kind, dx + lo, dy + lo, x ? x + lo : NULL, y ? y + lo : NULL, len, acc);
	}
	return PT_OK;
}

/* Dropout keeps element i when its Philox draw is >= p. Block i/4 of
 * (seed, stream) gives the draws of elements 4k..4k+3. */
static void dropout_apply(float *out, const float *in, int64_t n, float p, uint64_t seed,
                          uint64_t stream, float acc)
{
	float keep_scale = 1.0f / (1.0f - p);
	if (p == 0.0f) {
		for (int64_t i = 0; i < n; i++)
			out[i] = (acc != 0.0f ? out[i] : 0.0f) + in[i];
		return;
	}
#pragma omp parallel for schedule(static) if (n >= PT_CPU_PAR_MIN)
	for (int64_t k = 0; k < (n + 3) / 4; k++) {
		uint32_t w[4];
		pt_philox(seed, stream, (uint64_t)k, w);
		for (int j = 0; j < 4 && 4 * k + j < n; j++) {
			int64_t i = 4 * k + j;
			float m = pt_u32_to_unit(w[j]) >= p ? keep_scale : 0.0f;
			out[i] = (acc != 0.0f ? out[i] : 0.0f) + in[i] * m;
		}
	}
}

pt_err cpu_dropout_forward(const pt_op_call *c, void *ws)
{
	dropout_apply(pt_tensor_f32(c->out[0]), pt_tensor_f32(c->in[0]), pt_tensor_numel(c->in[0]),
	              c->p.dropout.p, c->p.dropout.seed, c->p.dropout.stream, 0.0f);
	return PT_OK;
}

pt_err cpu_dropout_backward(const pt_op_call *c, void *ws)
{
	dropout_apply(pt_tensor_f32(c->out[0]), pt_tensor_f32(c->in[0]), pt_tensor_numel(c->in[0]),
	              c->p.dropout.p, c->p.dropout.seed, c->p.dropout.stream,
	              c->p.dropout.accum_dx ? 1.0f : 0.0f);
	return PT_OK;
}

pt_err cpu_softmax_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *xt = c->in[0];
	int64_t C = xt->shape[xt->ndim - 1], R = pt_tensor_numel(xt) / (C ? C : 1);
	const float *x = pt_tensor_f32(xt);
	float *y = pt_tensor_f32(c->out[0]);
	int64_t n = R * C;

	PAR_FOR
	for (int64_t r = 0; r < R; r++) {
		pt_softmax_row(y + r * C, x + r * C, C, NULL, NULL);
	}
	return PT_OK;
}

pt_err cpu_softmax_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *yt = c->in[1];
	int64_t C = yt->shape[yt->ndim - 1], R = pt_tensor_numel(yt) / (C ? C : 1);
	const float *dy = pt_tensor_f32(c->in[0]), *y = pt_tensor_f32(yt);
	float *dx = pt_tensor_f32(c->out[0]);
	float acc = c->p.act.accum_dx ? 1.0f : 0.0f;
	int64_t n = R * C;

	PAR_FOR
	for (int64_t r = 0; r < R; r++) {
		const float *dyr = dy + r * C, *yr = y + r * C;
		float *dxr = dx + r * C;
		float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
		for (int64_t j = 0; j < C; j++)
			dot += dyr[j] * yr[j];
#pragma omp simd
		for (int64_t j = 0; j < C; j++)
			dxr[j] = (acc != 0.0f ? dxr[j] : 0.0f) + yr[j] * (dyr[j] - dot);
	}
	return PT_OK;
}
