/* cpu_norm.c - layer normalisation and token/position embeddings.
 *
 * Where the CPU has AVX-512, a row's f32 LayerNorm forward and its input
 * gradient sum on 16 lanes, in place of GCC's `omp simd` reductions (about
 * a cycle an element on W2's rows of 256): other bits than the baseline's,
 * the same on every thread count. A bf16 y (a product's input) is the same
 * f32 values, rounded.
 */
#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_kernels.h"

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f")))

static inline __attribute__((always_inline, target("avx512f"))) __mmask16 first_lanes(int64_t n)
{
	return (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u);
}

/* hsum adds two 16-lane accumulators into one float. */
static inline __attribute__((always_inline, target("avx512f"))) float hsum(__m512 a, __m512 b)
{
	return _mm512_reduce_add_ps(_mm512_add_ps(a, b));
}

/* ln_stats_512: a row's mean and 1 / sqrt(variance + eps). */
AVX512 static void ln_stats_512(const float *xr, int64_t C, float eps, float *mean, float *rstd)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), vm;
	int64_t j;
	float m, v, r;

	/* the mean, then the variance about it: 32 floats a turn in two sums */
	for (j = 0; j + 32 <= C; j += 32) {
		s0 = _mm512_add_ps(s0, _mm512_loadu_ps(xr + j));
		s1 = _mm512_add_ps(s1, _mm512_loadu_ps(xr + j + 16));
	}
	for (; j < C; j += 16)
		s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(first_lanes(C - j), xr + j));
	m = hsum(s0, s1) / (float)C;
	vm = _mm512_set1_ps(m);
	s0 = s1 = _mm512_setzero_ps();
	for (j = 0; j + 32 <= C; j += 32) {
		__m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(xr + j), vm);
		__m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(xr + j + 16), vm);
		s0 = _mm512_fmadd_ps(d0, d0, s0);
		s1 = _mm512_fmadd_ps(d1, d1, s1);
	}
	for (; j < C; j += 16) {
		__mmask16 k = first_lanes(C - j);
		__m512 d0 = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, xr + j), vm);
		s0 = _mm512_fmadd_ps(d0, d0, s0);
	}
	v = hsum(s0, s1) / (float)C;
	r = 1.0f / sqrtf(v + eps);
	*mean = m;
	*rstd = r;
}

/* ln_y_512: y[0..n) = (x - m) r w + b. */
AVX512 static void ln_y_512(const float *x, const float *w, const float *b, float m, float r,
                            float *y, int64_t n)
{
	__m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r);
	for (int64_t j = 0; j < n; j += 16) {
		__mmask16 k = first_lanes(n - j);
		__m512 t = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), vm), vr);
		_mm512_mask_storeu_ps(y + j, k,
		                      _mm512_fmadd_ps(t, _mm512_maskz_loadu_ps(k, w + j),
		                                      _mm512_maskz_loadu_ps(k, b + j)));
	}
}

/* ln_dx_row_512: a row's input gradient: with dn = w dy and n = (x - m) r,
 * dx (+)= (dn - mean(dn) - n mean(dn n)) r; both means in one pass. */
AVX512 static void ln_dx_row_512(const float *dyr, const float *xr, const float *w, float m,
                                 float r, float *dxr, int64_t C, bool acc)
{
	__m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r), sd = _mm512_setzero_ps(),
	       sn = _mm512_setzero_ps(), vdm, vdn;
	int64_t j;

	for (j = 0; j < C; j += 16) {
		__mmask16 k = first_lanes(C - j);
		__m512 n = _mm512_mul_ps(_mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, xr + j), vm),
		                         vr);
		__m512 dn =
		    _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j), _mm512_maskz_loadu_ps(k, dyr + j));
		sd = _mm512_add_ps(sd, dn);
		sn = _mm512_fmadd_ps(dn, n, sn);
	}
	vdm = _mm512_set1_ps(_mm512_reduce_add_ps(sd) / (float)C);
	vdn = _mm512_set1_ps(_mm512_reduce_add_ps(sn) / (float)C);
	for (j = 0; j < C; j += 16) {
		__mmask16 k = first_lanes(C - j);
		__m512 n = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + j), vm), vr);
		__m512 dn =
		    _mm512_mul_ps(_mm512_maskz_loadu_ps(k, w + j), _mm512_maskz_loadu_ps(k, dyr + j));
		__m512 g = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(dn, vdm), _mm512_mul_ps(n, vdn)),
		                         vr);
		if (acc)
			g = _mm512_add_ps(_mm512_maskz_loadu_ps(k, dxr + j), g);
		_mm512_mask_storeu_ps(dxr + j, k, g);
	}
}

static bool wide(void)
{
	return __builtin_cpu_supports("avx512f");
}
#else
static bool wide(void)
{
	return false;
}
static void ln_stats_512(const float *xr, int64_t C, float eps, float *mean, float *rstd)
{
}
static void ln_y_512(const float *x, const float *w, const float *b, float m, float r, float *y,
                     int64_t n)
{
}
static void ln_dx_row_512(const float *dyr, const float *xr, const float *w, float m, float r,
                          float *dxr, int64_t C, bool acc)
{
}
#endif

/* LN_PIECE: a bf16 y's row is computed in f32 pieces of this many values and
 * rounded from there (cpu_bf16_row: as a product packs it). */
#define LN_PIECE 512

pt_err cpu_layernorm_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *xt = c->in[0];
	int64_t C = xt->shape[xt->ndim - 1], R = pt_tensor_numel(xt) / C;
	const float *x = pt_tensor_f32(xt), *w = pt_tensor_f32(c->in[1]),
	            *b = pt_tensor_f32(c->in[2]);
	bool half = c->out[0]->dtype == PT_BF16; /* y in bf16 (a product's input) */
	float *y = half ? NULL : pt_tensor_f32(c->out[0]), *mean = pt_tensor_f32(c->out[1]);
	uint16_t *yh = half ? pt_tensor_data(c->out[0]) : NULL;
	float *rstd = pt_tensor_f32(c->out[2]);
	float eps = c->p.layernorm.eps;
	bool w512 = wide();

#pragma omp parallel for schedule(static) if (R * C >= PT_CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++) {
		const float *xr = x + r * C;
		float m = 0.0f, v = 0.0f;
		if (w512) {
			ln_stats_512(xr, C, eps, &mean[r], &rstd[r]);
			if (!half) {
				ln_y_512(xr, w, b, mean[r], rstd[r], y + r * C, C);
				continue;
			}
			/* bf16 y: the f32 values above, rounded as a product packs them */
			float piece[LN_PIECE];
			for (int64_t j0 = 0; j0 < C; j0 += LN_PIECE) {
				int64_t n = C - j0 < LN_PIECE ? C - j0 : LN_PIECE;
				ln_y_512(xr + j0, w + j0, b + j0, mean[r], rstd[r], piece, n);
				cpu_bf16_row(yh + r * C + j0, piece, n);
			}
			continue;
		}
#pragma omp simd reduction(+ : m)
		for (int64_t j = 0; j < C; j++)
			m += xr[j];
		m /= (float)C;
#pragma omp simd reduction(+ : v)
		for (int64_t j = 0; j < C; j++)
			v += (xr[j] - m) * (xr[j] - m);
		v /= (float)C;
		float s = 1.0f / sqrtf(v + eps);
		if (!half) {
			float *yr = y + r * C;
#pragma omp simd
			for (int64_t j = 0; j < C; j++)
				yr[j] = (xr[j] - m) * s * w[j] + b[j];
		} else {
			float piece[LN_PIECE];
			for (int64_t j0 = 0; j0 < C; j0 += LN_PIECE) {
				int64_t n = C - j0 < LN_PIECE ? C - j0 : LN_PIECE;
#pragma omp simd
				for (int64_t j = 0; j < n; j++)
					piece[j] = (xr[j0 + j] - m) * s * w[j0 + j] + b[j0 + j];
				cpu_bf16_row(yh + r * C + j0, piece, n);
			}
		}
		mean[r] = m;
		rstd[r] = s;
	}
	return PT_OK;
}

pt_err cpu_layernorm_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *xt = c->in[1];
	int64_t C = xt->shape[xt->ndim - 1], R = pt_tensor_numel(xt) / C;
	const float *dy = pt_tensor_f32(c->in[0]), *x = pt_tensor_f32(xt);
	const float *w = pt_tensor_f32(c->in[2]), *mean = pt_tensor_f32(c->in[3]);
	const float *rstd = pt_tensor_f32(c->in[4]);
	/* dx, or dw and db, may be NULL (split backward). */
	float *dx = c->out[0] ? pt_tensor_f32(c->out[0]) : NULL;
	float *dw = c->out[1] ? pt_tensor_f32(c->out[1]) : NULL;
	float *db = c->out[2] ? pt_tensor_f32(c->out[2]) : NULL;
	float acc = c->p.layernorm.accum_dx ? 1.0f : 0.0f;
	bool w512 = wide();

	/* dx rows are independent: parallel. dw/db sum over rows: serial, in
	 * row order, so the result does not depend on the thread count. */
#pragma omp parallel for schedule(static) if (dx != NULL && R * C >= PT_CPU_PAR_MIN)
	for (int64_t r = 0; r < (dx != NULL ? R : 0); r++) {
		const float *dyr = dy + r * C, *xr = x + r * C;
		float *dxr = dx + r * C;
		float m = mean[r], s = rstd[r];
		float dnorm_mean = 0.0f, dnorm_norm = 0.0f;
		if (w512) {
			ln_dx_row_512(dyr, xr, w, m, s, dxr, C, acc != 0.0f);
			continue;
		}
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm)
		for (int64_t j = 0; j < C; j++) {
			float nj = (xr[j] - m) * s;
			float dn = w[j] * dyr[j];
			dnorm_mean += dn;
			dnorm_norm += dn * nj;
		}
		dnorm_mean /= (float)C;
		dnorm_norm /= (float)C;
#pragma omp simd
		for (int64_t j = 0; j < C; j++) {
			float nj = (xr[j] - m) * s;
			float dn = w[j] * dyr[j];
			dxr[j] =
			    (acc != 0.0f ? dxr[j] : 0.0f) + (dn - dnorm_mean - nj * dnorm_norm) * s;
		}
	}
	for (int64_t r = 0; r < (dw != NULL ? R : 0); r++) {
		const float *dyr = dy + r * C, *xr = x + r * C;
		float m = mean[r], s = rstd[r];
#pragma omp simd
		for (int64_t j = 0; j < C; j++) {
			dw[j] += (xr[j] - m) * s * dyr[j];
			db[j] += dyr[j];
		}
	}
	return PT_OK;
}

pt_err cpu_embedding_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *tt = c->in[0], *wte_t = c->in[1], *wpe_t = c->in[2];
	int64_t B = tt->shape[0], T = tt->shape[1], V = wte_t->shape[0], C = wte_t->shape[1];
	const int64_t *tok = pt_tensor_data(tt);
	const float *wte = pt_tensor_f32(wte_t), *wpe = wpe_t ? pt_tensor_f32(wpe_t) : NULL;
	float *out = pt_tensor_f32(c->out[0]);

	for (int64_t i = 0; i < B * T; i++)
		if (tok[i] < 0 || tok[i] >= V)
			return pt_set_error(
			    PT_ERR_RANGE,
			    "embedding_forward: token %ld at position %ld is outside "
			    "the vocabulary of %ld",
			    (long)tok[i], (long)i, (long)V);
	for (int64_t i = 0; i < B * T; i++) {
		const float *e = wte + tok[i] * C;
		float *o = out + i * C;
		if (wpe) {
			const float *p = wpe + (i % T) * C;
#pragma omp simd
			for (int64_t j = 0; j < C; j++)
				o[j] = e[j] + p[j];
		} else {
			memcpy(o, e, sizeof(float) * (size_t)C);
		}
	}
	return PT_OK;
}

pt_err cpu_embedding_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *dt = c->in[0], *tt = c->in[1];
	int64_t B = tt->shape[0], T = tt->shape[1], V = c->out[0]->shape[0];
	int64_t C = c->out[0]->shape[1];
	const int64_t *tok = pt_tensor_data(tt);
	const float *dout = pt_tensor_f32(dt);
	float *dwte = pt_tensor_f32(c->out[0]), *dwpe = c->out[1] ? pt_tensor_f32(c->out[1]) : NULL;

	for (int64_t i = 0; i < B * T; i++)
		if (tok[i] < 0 || tok[i] >= V)
			return pt_set_error(PT_ERR_RANGE,
			                    "embedding_backward: token %ld out of range",
			                    (long)tok[i]);
	for (int64_t i = 0; i < B * T; i++) {
		const float *d = dout + i * C;
		float *e = dwte + tok[i] * C;
#pragma omp simd
		for (int64_t j = 0; j < C; j++)
			e[j] += d[j];
		if (dwpe) {
			float *p = dwpe + (i % T) * C;
#pragma omp simd
			for (int64_t j = 0; j < C; j++)
				p[j] += d[j];
		}
	}
	return PT_OK;
}
