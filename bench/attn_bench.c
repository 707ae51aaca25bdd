/* attn_bench - the blocked causal attention kernel against the dense one it
 * replaced, forward and backward at W2's shapes (batch 16, context 128, d 256,
 * 4 heads) and W3's (batch 8, context 256, d 768, 12 heads), fp32, all cores.
 *
 * The dense kernel (lib/ops/cpu/cpu_attention.c before the blocked one) is
 * kept below as the reference: full T x T score products per head, the
 * probabilities saved for the backward. Each figure is the best of 5 rounds
 * of 10 forward+backward passes, both kernels timed in turn in every round.
 * Prints:
 *   bench attn_causal_speedup      dense time over blocked time, W2 shapes
 *   bench attn_causal_speedup_w3   the same at W3 shapes
 *   bench attn_blocked_ms / attn_dense_ms  one W2 forward+backward
 *   bench attn_blocked_bf16_ms  the blocked kernel in bf16 precision, W2
 *   bench attn_bf16_over_fp32   its time over fp32's, measured beside it
 *   bench attn_blocked_bf16_w3_ms, attn_bf16_over_fp32_w3  the same at W3
 *   bench attn_tiles_vs_sgemm(_w3)  the fp32 kernel's strips on its AVX-512
 *         register tiles over the same on sgemm calls (PIPETRAIN_ATTN_KERNELS),
 *         W2 and W3, only where the CPU has AVX-512
 *   bench attn_bf16_tiles_vs_onednn(_w3)  bf16's strips on AVX512_BF16 register
 *         tiles over the same on oneDNN's bf16 matmul, only where the tiles run
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_math.h"
#include "ops.h"
#include "runtime.h"

typedef struct {
	int64_t B, T, C;
	int NH;
} shape;

/* The dense reference: forward writes att (B, NH, T, T). */
static void dense_forward(const shape *s, const float *qkv, float *out, float *att)
{
	int64_t T = s->T, C = s->C, C3 = 3 * C, hs = C / s->NH;
	float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
	for (int64_t bh = 0; bh < s->B * s->NH; bh++) {
		int64_t b = bh / s->NH, h = bh % s->NH;
		const float *q = qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
		float *a = att + bh * T * T, *o = out + b * T * C + h * hs;
		cpu_gemm(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
		for (int64_t i = 0; i < T; i++) {
			pt_softmax_row(a + i * T, a + i * T, i + 1, NULL, NULL);
			memset(a + i * T + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
		}
		cpu_gemm(false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f, o, C);
	}
}

static void dense_backward(const shape *s, const float *dout, const float *qkv, const float *att,
                           float *dqkv, float *ws)
{
	int64_t T = s->T, C = s->C, C3 = 3 * C, hs = C / s->NH;
	float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
	for (int64_t bh = 0; bh < s->B * s->NH; bh++) {
		int64_t b = bh / s->NH, h = bh % s->NH;
		const float *q = qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
		const float *a = att + bh * T * T, *d = dout + b * T * C + h * hs;
		float *dq = dqkv + b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
		float *da = ws + (size_t)omp_get_thread_num() * (size_t)(T * T);
		cpu_gemm(true, false, T, hs, T, 1.0f, a, T, d, C, 0.0f, dv, C3);
		cpu_gemm(false, true, T, T, hs, 1.0f, d, C, v, C3, 0.0f, da, T);
		for (int64_t i = 0; i < T; i++) {
			const float *ar = a + i * T;
			float *dr = da + i * T, dot = 0.0f;
			for (int64_t j = 0; j <= i; j++)
				dot += ar[j] * dr[j];
			for (int64_t j = 0; j <= i; j++)
				dr[j] = scale * ar[j] * (dr[j] - dot);
			memset(dr + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
		}
		cpu_gemm(false, false, T, hs, T, 1.0f, da, T, k, C3, 0.0f, dq, C3);
		cpu_gemm(true, false, T, hs, T, 1.0f, da, T, q, C3, 0.0f, dk, C3);
	}
}

static void fill(float *p, int64_t n, uint32_t seed)
{
	for (int64_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
	}
}

/* The blocked kernel's tensors at shape s: qkv and dout filled, the rest
 * outputs. */
typedef struct io {
	pt_tensor qkv, dout, out, lse, dq;
} io;

static void io_init(io *t, const shape *s)
{
	int64_t B = s->B, T = s->T, C = s->C, NH = s->NH;
	pt_tensor_init(&t->qkv, PT_F32, 3, (int64_t[]){B, T, 3 * C});
	pt_tensor_init(&t->dout, PT_F32, 3, (int64_t[]){B, T, C});
	pt_tensor_init(&t->out, PT_F32, 3, (int64_t[]){B, T, C});
	pt_tensor_init(&t->lse, PT_F32, 3, (int64_t[]){B, NH, T});
	pt_tensor_init(&t->dq, PT_F32, 3, (int64_t[]){B, T, 3 * C});
	fill(pt_tensor_f32(&t->qkv), 3 * B * T * C, 1);
	fill(pt_tensor_f32(&t->dout), B * T * C, 2);
}

static void io_fini(io *t)
{
	pt_tensor_fini(&t->qkv);
	pt_tensor_fini(&t->dout);
	pt_tensor_fini(&t->out);
	pt_tensor_fini(&t->lse);
	pt_tensor_fini(&t->dq);
}

/* blocked runs the blocked kernel's forward and backward once. */
static void blocked(const shape *s, io *t)
{
	if (pt_attention_forward(&t->out, &t->lse, &t->qkv, s->NH) != PT_OK ||
	    pt_attention_backward(&t->dq, &t->dout, &t->qkv, &t->lse, s->NH, false) != PT_OK) {
		fprintf(stderr, "attn_bench: %s\n", pt_last_error());
		exit(1);
	}
}

/* Seconds per forward+backward of each kernel (best round); the largest
 * difference between their dqkv, relative to its largest value, in *diff. */
static void measure(const shape *s, double *blk, double *dense, double *diff)
{
	int64_t B = s->B, T = s->T, C = s->C, NH = s->NH;
	io t;
	float *att = malloc(sizeof(float) * (size_t)(B * NH * T * T));
	float *ws = malloc(sizeof(float) * (size_t)(omp_get_max_threads() * T * T));
	float *dense_out = malloc(sizeof(float) * (size_t)(B * T * C));
	float *dense_dq = malloc(sizeof(float) * (size_t)(B * T * 3 * C));
	double mx = 0, md = 0;

	io_init(&t, s);
	*blk = *dense = 1e30;
	for (int round = 0; round < 6; round++) { /* round 0 warms up */
		double t0 = pt_now(), t1, t2;
		for (int r = 0; r < 10; r++)
			blocked(s, &t);
		t1 = pt_now();
		for (int r = 0; r < 10; r++) {
			dense_forward(s, pt_tensor_f32(&t.qkv), dense_out, att);
			dense_backward(s, pt_tensor_f32(&t.dout), pt_tensor_f32(&t.qkv), att,
			               dense_dq, ws);
		}
		t2 = pt_now();
		if (round > 0) {
			*blk = (t1 - t0) / 10 < *blk ? (t1 - t0) / 10 : *blk;
			*dense = (t2 - t1) / 10 < *dense ? (t2 - t1) / 10 : *dense;
		}
	}
	for (int64_t i = 0; i < 3 * B * T * C; i++) {
		double d = fabs((double)pt_tensor_f32(&t.dq)[i] - dense_dq[i]);
		md = d > md ? d : md;
		mx = fabs(dense_dq[i]) > mx ? fabs(dense_dq[i]) : mx;
	}
	*diff = md / mx;
	io_fini(&t);
	free(att);
	free(ws);
	free(dense_out);
	free(dense_dq);
}

/* Seconds per forward+backward of the blocked kernel alone at precision
 * prec (best of 5 rounds of 10 after one to warm up). */
static double blocked_at(const shape *s, pt_precision prec)
{
	io t;
	double best = 1e30;

	io_init(&t, s);
	pt_set_precision(prec);
	for (int round = 0; round < 6; round++) {
		double t0 = pt_now();
		for (int r = 0; r < 10; r++)
			blocked(s, &t);
		if (round > 0 && (pt_now() - t0) / 10 < best)
			best = (pt_now() - t0) / 10;
	}
	pt_set_precision(PT_PREC_FP32);
	io_fini(&t);
	return best;
}

int main(int argc, char **argv)
{
	shape w2 = {16, 128, 256, 4}, w3 = {8, 256, 768, 12};
	double b2, d2, e2, b3, d3, e3;

	pt_runtime_ensure_passive_wait(argv);
	measure(&w2, &b2, &d2, &e2);
	measure(&w3, &b3, &d3, &e3);
	printf("# attn_bench: %d threads; dqkv blocked vs dense, max difference over max: "
	       "W2 %.1e, W3 %.1e\n",
	       omp_get_max_threads(), e2, e3);
	printf("bench attn_blocked_ms %.2f\n", b2 * 1e3);
	printf("bench attn_dense_ms %.2f\n", d2 * 1e3);
	printf("bench attn_causal_speedup %.2f\n", d2 / b2);
	printf("bench attn_causal_speedup_w3 %.2f\n", d3 / b3);
	if (strcmp(pt_cpu_attention_kernel(), "avx512f") == 0) {
		/* fp32's AVX-512 register tiles over its sgemm strips */
		double t2 = blocked_at(&w2, PT_PREC_FP32), t3 = blocked_at(&w3, PT_PREC_FP32), s2, s3;
		pt_cpu_attention_select(false);
		s2 = blocked_at(&w2, PT_PREC_FP32);
		s3 = blocked_at(&w3, PT_PREC_FP32);
		pt_cpu_attention_select(true);
		printf("bench attn_tiles_vs_sgemm %.2f\n", s2 / t2);
		printf("bench attn_tiles_vs_sgemm_w3 %.2f\n", s3 / t3);
	}
	{ /* bf16 precision: the same products on operands rounded to bf16 */
		double f = blocked_at(&w2, PT_PREC_FP32), h = blocked_at(&w2, PT_PREC_BF16);
		printf("bench attn_blocked_bf16_ms %.2f\n", h * 1e3);
		printf("bench attn_bf16_over_fp32 %.3f\n", h / f);
		f = blocked_at(&w3, PT_PREC_FP32);
		h = blocked_at(&w3, PT_PREC_BF16);
		printf("bench attn_blocked_bf16_w3_ms %.2f\n", h * 1e3);
		printf("bench attn_bf16_over_fp32_w3 %.3f\n", h / f);
	}
	if (strcmp(pt_cpu_attention_bf16_kernel(), "avx512_bf16") == 0) {
		double t2 = blocked_at(&w2, PT_PREC_BF16), t3 = blocked_at(&w3, PT_PREC_BF16), s2,
		       s3;
		pt_cpu_attention_select(false);
		s2 = blocked_at(&w2, PT_PREC_BF16);
		s3 = blocked_at(&w3, PT_PREC_BF16);
		pt_cpu_attention_select(true);
		printf("bench attn_bf16_tiles_vs_onednn %.2f\n", s2 / t2);
		printf("bench attn_bf16_tiles_vs_onednn_w3 %.2f\n", s3 / t3);
	}
	return 0;
}
