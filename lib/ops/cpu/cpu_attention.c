/* cpu_attention.c - causal multi-head self-attention core.
 *
 * qkv (B, T, 3C) holds q | k | v per position; head h uses columns
 * [h*hs, (h+1)*hs) of each. Each (batch, head) pair is independent: pairs are
 * spread over the OpenMP budget and each runs single-threaded sgemm calls
 * (oneDNN does not nest parallelism), so results do not depend on the thread
 * count. att (B, NH, T, T) keeps the softmax probabilities, zero above the
 * diagonal. bf16 precision: the four products round their operands to
 * bf16 (cpu_gemm_prec); softmax and its backward stay f32.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_math.h"

pt_err cpu_attention_forward(const pt_op_call *c, void *ws)
{
	const pt_tensor *qt = c->in[0];
	int64_t B = qt->shape[0], T = qt->shape[1], C3 = qt->shape[2], C = C3 / 3;
	int NH = c->p.attention.n_head;
	int64_t hs = C / NH;
	const float *qkv = pt_tensor_f32(qt);
	float *out = pt_tensor_f32(c->out[0]), *att = pt_tensor_f32(c->out[1]);
	float scale = 1.0f / sqrtf((float)hs);
	pt_precision prec = (pt_precision)c->prec;
	pt_err err = PT_OK;

#pragma omp parallel for schedule(static)
	for (int64_t bh = 0; bh < B * NH; bh++) {
		int64_t b = bh / NH, h = bh % NH;
		const float *q = qkv + b * T * C3 + h * hs;
		const float *k = q + C, *v = q + 2 * C;
		float *a = att + bh * T * T;
		float *o = out + b * T * C + h * hs;
		/* scores = scale * q k^T; only the causal lower triangle is used. */
		pt_err e =
		    cpu_gemm_prec(prec, false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
		if (e != PT_OK) {
#pragma omp critical
			err = e;
			continue;
		}
		for (int64_t i = 0; i < T; i++) {
			float *row = a + i * T;
			pt_softmax_row(row, row, i + 1, NULL, NULL);
			memset(row + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
		}
		e = cpu_gemm_prec(prec, false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
		if (e != PT_OK) {
#pragma omp critical
			err = e;
		}
	}
	return err;
}

size_t cpu_attention_workspace(const pt_op_call *c)
{
	const pt_tensor *qt = c->in[1];
	int64_t T = qt->shape[1];
	return (size_t)omp_get_max_threads() * (size_t)(T * T) * sizeof(float);
}

pt_err cpu_attention_backward(const pt_op_call *c, void *ws)
{
	const pt_tensor *qt = c->in[1];
	int64_t B = qt->shape[0], T = qt->shape[1], C3 = qt->shape[2], C = C3 / 3;
	int NH = c->p.attention.n_head;
	int64_t hs = C / NH;
	const float *dout = pt_tensor_f32(c->in[0]), *qkv = pt_tensor_f32(qt);
	const float *att = pt_tensor_f32(c->in[2]);
	float *dqkv = pt_tensor_f32(c->out[0]);
	float beta = c->p.attention.accum_dx ? 1.0f : 0.0f;
	float scale = 1.0f / sqrtf((float)hs);
	int nthreads = omp_get_max_threads();
	pt_precision prec = (pt_precision)c->prec;
	pt_err err = PT_OK;

#pragma omp parallel for schedule(static) num_threads(nthreads)
	for (int64_t bh = 0; bh < B * NH; bh++) {
		int64_t b = bh / NH, h = bh % NH;
		const float *q = qkv + b * T * C3 + h * hs;
		const float *k = q + C, *v = q + 2 * C;
		const float *a = att + bh * T * T;
		const float *d = dout + b * T * C + h * hs;
		float *dq = dqkv + b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
		float *da = (float *)ws + (size_t)omp_get_thread_num() * (size_t)(T * T);
		pt_err e;

		/* dv = att^T d ; datt = d v^T */
		if ((e = cpu_gemm_prec(prec, true, false, T, hs, T, 1.0f, a, T, d, C, beta, dv,
		                       C3)) != PT_OK ||
		    (e = cpu_gemm_prec(prec, false, true, T, T, hs, 1.0f, d, C, v, C3, 0.0f, da,
		                       T)) != PT_OK) {
#pragma omp critical
			err = e;
			continue;
		}
		/* softmax backward on the causal rows, folding in the score scale. */
		for (int64_t i = 0; i < T; i++) {
			const float *ar = a + i * T;
			float *dr = da + i * T;
			float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
			for (int64_t j = 0; j <= i; j++)
				dot += ar[j] * dr[j];
#pragma omp simd
			for (int64_t j = 0; j <= i; j++)
				dr[j] = scale * ar[j] * (dr[j] - dot);
			memset(dr + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
		}
		/* dq = dscores k ; dk = dscores^T q */
		if ((e = cpu_gemm_prec(prec, false, false, T, hs, T, 1.0f, da, T, k, C3, beta, dq,
		                       C3)) != PT_OK ||
		    (e = cpu_gemm_prec(prec, true, false, T, hs, T, 1.0f, da, T, q, C3, beta, dk,
		                       C3)) != PT_OK) {
#pragma omp critical
			err = e;
		}
	}
	return err;
}
