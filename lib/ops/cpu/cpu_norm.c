/* cpu_norm.c - layer normalisation and token/position embeddings. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

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

#pragma omp parallel for schedule(static) if (R * C >= PT_CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++) {
		const float *xr = x + r * C;
		float m = 0.0f, v = 0.0f;
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

	/* dx rows are independent: parallel. dw/db sum over rows: serial, in
	 * row order, so the result does not depend on the thread count. */
#pragma omp parallel for schedule(static) if (dx != NULL && R * C >= PT_CPU_PAR_MIN)
	for (int64_t r = 0; r < (dx != NULL ? R : 0); r++) {
		const float *dyr = dy + r * C, *xr = x + r * C;
		float *dxr = dx + r * C;
		float m = mean[r], s = rstd[r];
		float dnorm_mean = 0.0f, dnorm_norm = 0.0f;
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
