/* cpu_loss.c - softmax cross-entropy and mean squared error. */
#include <math.h>

#include "cpu_kernels.h"
#include "cpu_math.h"

pt_err cpu_cross_entropy_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *lt = c->in[0];
	int64_t V = lt->shape[lt->ndim - 1], R = pt_tensor_numel(lt) / V;
	const float *logits = pt_tensor_f32(lt);
	const int64_t *tg = pt_tensor_data(c->in[1]);
	float *losses = pt_tensor_f32(c->out[0]), *probs = pt_tensor_f32(c->out[1]);
	int64_t ign = c->p.xent.ignore_index;

	for (int64_t r = 0; r < R; r++)
		if (tg[r] != ign && (tg[r] < 0 || tg[r] >= V))
			return pt_set_error(PT_ERR_RANGE,
			                    "cross_entropy_forward: target %ld of row %ld is not a "
			                    "class in [0, %ld)",
			                    (long)tg[r], (long)r, (long)V);
#pragma omp parallel for schedule(static) if (R * V >= PT_CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++) {
		const float *x = logits + r * V;
		float *p = probs + r * V;
		/* Read before the softmax: probs may be the logits themselves. */
		float xt = tg[r] == ign ? 0.0f : x[tg[r]], mx, sum;
		pt_softmax_row(p, x, V, &mx, &sum);
		/* -log softmax = logsumexp - x[target], accurate for tiny probabilities. */
		losses[r] = tg[r] == ign ? 0.0f : logf(sum) + mx - xt;
	}
	return PT_OK;
}

pt_err cpu_cross_entropy_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *pt = c->in[0];
	int64_t V = pt->shape[pt->ndim - 1], R = pt_tensor_numel(pt) / V;
	const float *probs = pt_tensor_f32(pt);
	const int64_t *tg = pt_tensor_data(c->in[1]);
	float *d = pt_tensor_f32(c->out[0]);
	float s = c->p.xent.scale;
	int64_t ign = c->p.xent.ignore_index;

	for (int64_t r = 0; r < R; r++)
		if (tg[r] != ign && (tg[r] < 0 || tg[r] >= V))
			return pt_set_error(PT_ERR_RANGE, "cross_entropy_backward: target %ld",
			                    (long)tg[r]);
#pragma omp parallel for schedule(static) if (R * V >= PT_CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++) {
		const float *p = probs + r * V;
		float *dr = d + r * V;
		if (tg[r] == ign) {
			for (int64_t j = 0; j < V; j++)
				dr[j] = 0.0f;
			continue;
		}
#pragma omp simd
		for (int64_t j = 0; j < V; j++)
			dr[j] = s * p[j];
		dr[tg[r]] -= s;
	}
	return PT_OK;
}

pt_err cpu_mse_forward(const pt_op_call *c, void *ws)
{
	const float *p = pt_tensor_f32(c->in[0]), *t = pt_tensor_f32(c->in[1]);
	int64_t n = pt_tensor_numel(c->in[0]);
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++) {
		double e = (double)p[i] - (double)t[i];
		sum += e * e;
	}
	pt_tensor_f32(c->out[0])[0] = (float)(sum * c->p.mse.scale);
	return PT_OK;
}

pt_err cpu_mse_backward(const pt_op_call *c, void *ws)
{
	const float *p = pt_tensor_f32(c->in[0]), *t = pt_tensor_f32(c->in[1]);
	float *d = pt_tensor_f32(c->out[0]);
	float s2 = 2.0f * c->p.mse.scale;
	int64_t n = pt_tensor_numel(c->in[0]);
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		d[i] = s2 * (p[i] - t[i]);
	return PT_OK;
}
