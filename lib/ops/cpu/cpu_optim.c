/* cpu_optim.c - squared norm, AdamW and SGD on flat parameter buffers.
 *
 * Updates are element-wise, so splitting them across threads cannot change
 * a bit. The squared norm sums fixed-size chunks in order, so it too is
 * independent of the thread count.
 */
#include <math.h>

#include "cpu_kernels.h"

#define NORM_CHUNK 4096

/* Sum of squares of one chunk in 8 fixed lanes (vectorises; the lane order
 * is fixed, so the result does not depend on threads or alignment). */
static double chunk_sqnorm(const float *restrict x, int64_t n)
{
	double lane[8] = {0};
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int k = 0; k < 8; k++)
			lane[k] += (double)x[i + k] * (double)x[i + k];
	for (; i < n; i++)
		lane[i & 7] += (double)x[i] * (double)x[i];
	return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
	       ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

pt_err cpu_squared_norm(const pt_op_call *c, void *ws)
{
	const float *x = pt_tensor_f32(c->in[0]);
	int64_t n = pt_tensor_numel(c->in[0]);
	int64_t nchunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
	double total = 0.0;

	/* Chunk sums in parallel, added to the shared total in chunk order. */
#pragma omp parallel for schedule(static) ordered if (n >= 1 << 20)
	for (int64_t k = 0; k < nchunks; k++) {
		int64_t lo = k * NORM_CHUNK, hi = lo + NORM_CHUNK < n ? lo + NORM_CHUNK : n;
		double s = chunk_sqnorm(x + lo, hi - lo);
#pragma omp ordered
		total += s;
	}
	*(double *)pt_tensor_data(c->out[0]) = total;
	return PT_OK;
}

/* One AdamW update over [0, n): restrict pointers so the loop vectorises. */
static void adamw_range(float *restrict p, float *restrict m, float *restrict v,
                        const float *restrict g, int64_t n, float b1, float b2, float eps, float gs,
                        float step_size, float bc2_sqrt, float decay)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		float gi = g[i] * gs;
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
		m[i] = mi;
		v[i] = vi;
		/* PyTorch's AdamW: decay first, then p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
		 */
		p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
	}
}

pt_err cpu_adamw(const pt_op_call *c, void *ws)
{
	const float *g = pt_tensor_f32(c->in[0]);
	float *p = pt_tensor_f32(c->out[0]), *m = pt_tensor_f32(c->out[1]);
	float *v = pt_tensor_f32(c->out[2]);
	int64_t n = pt_tensor_numel(c->in[0]);
	const double *rt = c->in[1] ? (const double *)pt_tensor_data(c->in[1]) : NULL;
	float lr = rt ? (float)rt[PT_OPTIM_S_LR] : c->p.adamw.lr;
	float gs = rt ? (float)rt[PT_OPTIM_S_GRAD_SCALE] : c->p.adamw.grad_scale;
	double t = rt ? rt[PT_OPTIM_S_STEP] : (double)c->p.adamw.step;
	float b1 = c->p.adamw.beta1, b2 = c->p.adamw.beta2;
	float eps = c->p.adamw.eps, wd = c->p.adamw.weight_decay;
	float bc1 = (float)(1.0 - pow((double)b1, t));
	float bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, t));
	float step_size = lr / bc1;
	float decay = 1.0f - lr * wd;
	int64_t chunk = 1 << 16, nchunks = (n + chunk - 1) / chunk;

#pragma omp parallel for schedule(static) if (n >= PT_CPU_PAR_MIN)
	for (int64_t k = 0; k < nchunks; k++) {
		int64_t lo = k * chunk, len = lo + chunk < n ? chunk : n - lo;
		adamw_range(p + lo, m + lo, v + lo, g + lo, len, b1, b2, eps, gs, step_size,
		            bc2_sqrt, decay);
	}
	return PT_OK;
}

pt_err cpu_sgd(const pt_op_call *c, void *ws)
{
	const float *g = pt_tensor_f32(c->in[0]);
	float *p = pt_tensor_f32(c->out[0]);
	float *buf = c->out[1] ? pt_tensor_f32(c->out[1]) : NULL;
	int64_t n = pt_tensor_numel(c->in[0]);
	const double *rt = c->in[1] ? (const double *)pt_tensor_data(c->in[1]) : NULL;
	float lr = rt ? (float)rt[PT_OPTIM_S_LR] : c->p.sgd.lr;
	float gs = rt ? (float)rt[PT_OPTIM_S_GRAD_SCALE] : c->p.sgd.grad_scale;
	bool first = rt ? rt[PT_OPTIM_S_FIRST] != 0.0 : c->p.sgd.first_step;
	float mu = c->p.sgd.momentum, damp = c->p.sgd.dampening;
	float wd = c->p.sgd.weight_decay;
	bool nesterov = c->p.sgd.nesterov;

#pragma omp parallel for simd schedule(static) if (n >= PT_CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++) {
		float d = g[i] * gs + wd * p[i];
		if (mu != 0.0f) {
			float b = first ? d : mu * buf[i] + (1.0f - damp) * d;
			buf[i] = b;
			d = nesterov ? d + mu * b : b;
		}
		p[i] -= lr * d;
	}
	return PT_OK;
}
