/* cuda_attention.cu - causal multi-head self-attention core, mirroring
 * cpu_attention.c's interface: per batch row b, one strided-batched cuBLAS
 * product over the NH heads (head h's q/k/v are columns [h*hs, (h+1)*hs) of
 * qkv rows, so heads are hs floats apart), then a causal softmax kernel over
 * the score rows, which also saves each row's log-sum-exp. Scores live in a
 * pool buffer of NH*T*T floats reused per b; the backward recomputes the
 * probabilities as exp(score - lse) into one such buffer and keeps dscores in
 * another. (The full T x T products per head; the CPU computes only the
 * causal staircase.) In bf16 math, q, k, v and dout are rounded to bf16
 * once per call and the row kernels write the probabilities and dscores
 * rounded beside their f32 values, so each operand is rounded once rather
 * than once per product (the same roundings: results equal ptc_gemm's).
 */
#include <cuda_bf16.h>
#include <string.h>

#include "cuda_common.cuh"

/* Row i of each (T, T) matrix: softmax over [0, i], zeros above; lse[row]
 * = max + log(sum of exp). With att16 the probabilities go there, rounded
 * to bf16, instead. */
__global__ void k_causal_softmax(float *att, float *lse, int64_t T, __nv_bfloat16 *att16)
{
	int64_t row = blockIdx.x, i = row % T;
	float *a = att + row * T;
	float mx = -INFINITY, sum = 0.0f;
	for (int64_t j = threadIdx.x; j <= i; j += PTC_ROW_THREADS)
		mx = a[j] > mx ? a[j] : mx;
	mx = ptd_block_reduce(mx, ptd_max());
	for (int64_t j = threadIdx.x; j <= i; j += PTC_ROW_THREADS) {
		float e = ptd_expf(a[j] - mx);
		a[j] = e;
		sum += e;
	}
	sum = ptd_block_reduce(sum, ptd_add());
	float inv = 1.0f / sum;
	for (int64_t j = threadIdx.x; j < T; j += PTC_ROW_THREADS) {
		float p = j <= i ? a[j] * inv : 0.0f;
		if (att16 != NULL) /* only the rounded ones are read again */
			att16[row * T + j] = __float2bfloat16_rn(p);
		else
			a[j] = p;
	}
	if (threadIdx.x == 0)
		lse[row] = mx + logf(sum);
}

/* Row i of each (T, T) matrix of scores: exp(score - lse[row]) over [0, i],
 * zeros above; with att16 also rounded to bf16 there. */
__global__ void k_causal_probs(float *att, const float *lse, int64_t T, __nv_bfloat16 *att16)
{
	int64_t row = blockIdx.x, i = row % T;
	float *a = att + row * T, l = lse[row];
	for (int64_t j = threadIdx.x; j < T; j += PTC_ROW_THREADS) {
		float p = j <= i ? ptd_expf(a[j] - l) : 0.0f;
		a[j] = p;
		if (att16 != NULL)
			att16[row * T + j] = __float2bfloat16_rn(p);
	}
}

/* da = scale * a * (da - sum_j<=i a*da) on causal rows, zero above; with
 * da16 the result goes there, rounded to bf16, instead. */
__global__ void k_causal_softmax_bwd(float *da, const float *att, int64_t T, float scale,
                                     __nv_bfloat16 *da16)
{
	int64_t row = blockIdx.x, i = row % T;
	const float *a = att + row * T;
	float *d = da + row * T;
	float dot = 0.0f;
	for (int64_t j = threadIdx.x; j <= i; j += PTC_ROW_THREADS)
		dot += a[j] * d[j];
	dot = ptd_block_reduce(dot, ptd_add());
	for (int64_t j = threadIdx.x; j < T; j += PTC_ROW_THREADS) {
		float g = j <= i ? scale * a[j] * (d[j] - dot) : 0.0f;
		if (da16 != NULL)
			da16[row * T + j] = __float2bfloat16_rn(g);
		else
			d[j] = g;
	}
}

/* prods: the products of one call, in the thread's math. In bf16 math,
 * qkv16 and d16 hold qkv and dout rounded once (bf16, the same layouts) and
 * att16 one (NH, T, T) matrix set. */
typedef struct prods {
	int dev;
	bool bf16;
	__nv_bfloat16 *qkv16, *d16, *att16, *da16;
} prods;

static void prods_free(prods *p)
{
	ptc_free(p->dev, p->qkv16);
	ptc_free(p->dev, p->d16);
	ptc_free(p->dev, p->att16);
	ptc_free(p->dev, p->da16);
}

/* prods_init rounds qkv (n_qkv floats) and dout (n_d, may be 0) and makes
 * n_att-element bf16 matrices (two with two_att) when the thread's math is
 * bf16; nothing otherwise. */
static int prods_init(prods *p, int dev, const float *qkv, int64_t n_qkv, const float *dout,
                      int64_t n_d, int64_t n_att, bool two_att)
{
	memset(p, 0, sizeof(*p));
	p->dev = dev;
	p->bf16 = ptc_get_math() == PTC_MATH_BF16;
	if (!p->bf16)
		return 0;
	if (ptc_alloc(dev, 2 * (size_t)n_qkv, (void **)&p->qkv16) != 0 ||
	    (n_d > 0 && ptc_alloc(dev, 2 * (size_t)n_d, (void **)&p->d16) != 0) ||
	    ptc_alloc(dev, 2 * (size_t)n_att, (void **)&p->att16) != 0 ||
	    (two_att && ptc_alloc(dev, 2 * (size_t)n_att, (void **)&p->da16) != 0) ||
	    ptc_round_bf16(dev, p->qkv16, qkv, n_qkv) != 0 ||
	    (n_d > 0 && ptc_round_bf16(dev, p->d16, dout, n_d) != 0)) {
		prods_free(p);
		return 1;
	}
	return 0;
}

/* gemm: one strided-batched product whose operands are a (f32, or its bf16
 * copy a16 in bf16 math) and b likewise; offsets in elements. */
static int gemm(const prods *p, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                const float *a, const __nv_bfloat16 *a16, int64_t lda, int64_t sa, const float *b,
                const __nv_bfloat16 *b16, int64_t ldb, int64_t sb, float beta, float *c,
                int64_t ldc, int64_t sc, int64_t batch)
{
	if (p->bf16)
		return ptc_gemm_bf16(p->dev, ta, tb, M, N, K, alpha, a16, lda, sa, b16, ldb, sb,
		                     beta, c, ldc, sc, batch);
	return ptc_gemm_batched(p->dev, ta, tb, M, N, K, alpha, a, lda, sa, b, ldb, sb, beta, c,
	                        ldc, sc, batch);
}

extern "C" int ptc_attention_forward(int dev, float *out, float *lse, const float *qkv, int64_t B,
                                     int64_t T, int64_t C, int64_t NH)
{
	PTC_STREAM(dev, s);
	int64_t hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);
	float *a = NULL;
	prods p;
	int rc = 0;
	if (B * T == 0)
		return 0;
	if (NH * T > 0x7fffffff)
		return ptc_fail("attention", "too many rows");
	if (ptc_alloc(dev, sizeof(float) * (size_t)(NH * T * T), (void **)&a) != 0)
		return 1;
	if (prods_init(&p, dev, qkv, B * T * C3, NULL, 0, NH * T * T, false) != 0) {
		ptc_free(dev, a);
		return 1;
	}
	for (int64_t b = 0; b < B && rc == 0; b++) {
		const float *q = qkv + b * T * C3, *k = q + C, *v = q + 2 * C;
		const __nv_bfloat16 *q16 = p.bf16 ? p.qkv16 + b * T * C3 : NULL;
		const __nv_bfloat16 *k16 = q16 ? q16 + C : NULL, *v16 = q16 ? q16 + 2 * C : NULL;
		float *o = out + b * T * C;
		rc = gemm(&p, false, true, T, T, hs, scale, q, q16, C3, hs, k, k16, C3, hs, 0.0f, a,
		          T, T * T, NH);
		if (rc == 0) {
			k_causal_softmax<<<(unsigned)(NH * T), PTC_ROW_THREADS, 0, s>>>(
			    a, lse + b * NH * T, T, p.att16);
			cudaError_t e = cudaGetLastError();
			if (e != cudaSuccess)
				rc = ptc_cuda_fail("causal softmax kernel", e);
		}
		if (rc == 0)
			rc = gemm(&p, false, false, T, hs, T, 1.0f, a, p.att16, T, T * T, v, v16,
			          C3, hs, 0.0f, o, C, hs, NH);
	}
	prods_free(&p);
	ptc_free(dev, a);
	return rc;
}

extern "C" int ptc_attention_backward(int dev, float *dqkv, const float *dout, const float *qkv,
                                      const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                                      bool accum)
{
	PTC_STREAM(dev, s);
	int64_t hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs), beta = accum ? 1.0f : 0.0f;
	float *a = NULL, *da = NULL;
	prods p;
	int rc = 0;
	if (B * T == 0)
		return 0;
	if (NH * T > 0x7fffffff)
		return ptc_fail("attention", "too many rows");
	if (ptc_alloc(dev, sizeof(float) * (size_t)(NH * T * T), (void **)&a) != 0)
		return 1;
	if (ptc_alloc(dev, sizeof(float) * (size_t)(NH * T * T), (void **)&da) != 0) {
		ptc_free(dev, a);
		return 1;
	}
	if (prods_init(&p, dev, qkv, B * T * C3, dout, B * T * C, NH * T * T, true) != 0) {
		ptc_free(dev, da);
		ptc_free(dev, a);
		return 1;
	}
	for (int64_t b = 0; b < B && rc == 0; b++) {
		const float *q = qkv + b * T * C3, *k = q + C, *v = q + 2 * C;
		const float *d = dout + b * T * C;
		const __nv_bfloat16 *q16 = p.bf16 ? p.qkv16 + b * T * C3 : NULL;
		const __nv_bfloat16 *k16 = q16 ? q16 + C : NULL, *v16 = q16 ? q16 + 2 * C : NULL;
		const __nv_bfloat16 *d16 = p.bf16 ? p.d16 + b * T * C : NULL;
		float *dq = dqkv + b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
		cudaError_t e;
		/* att = exp(scale q k^T - lse) on the causal rows */
		rc = gemm(&p, false, true, T, T, hs, scale, q, q16, C3, hs, k, k16, C3, hs, 0.0f, a,
		          T, T * T, NH);
		if (rc == 0) {
			k_causal_probs<<<(unsigned)(NH * T), PTC_ROW_THREADS, 0, s>>>(
			    a, lse + b * NH * T, T, p.att16);
			if ((e = cudaGetLastError()) != cudaSuccess)
				rc = ptc_cuda_fail("causal probabilities kernel", e);
		}
		/* dv = att^T d ; datt = d v^T */
		if (rc == 0)
			rc = gemm(&p, true, false, T, hs, T, 1.0f, a, p.att16, T, T * T, d, d16, C,
			          hs, beta, dv, C3, hs, NH);
		if (rc == 0)
			rc = gemm(&p, false, true, T, T, hs, 1.0f, d, d16, C, hs, v, v16, C3, hs,
			          0.0f, da, T, T * T, NH);
		if (rc == 0) {
			k_causal_softmax_bwd<<<(unsigned)(NH * T), PTC_ROW_THREADS, 0, s>>>(
			    da, a, T, scale, p.da16);
			if ((e = cudaGetLastError()) != cudaSuccess)
				rc = ptc_cuda_fail("causal softmax backward kernel", e);
		}
		/* dq = dscores k ; dk = dscores^T q */
		if (rc == 0)
			rc = gemm(&p, false, false, T, hs, T, 1.0f, da, p.da16, T, T * T, k, k16,
			          C3, hs, beta, dq, C3, hs, NH);
		if (rc == 0)
			rc = gemm(&p, true, false, T, hs, T, 1.0f, da, p.da16, T, T * T, q, q16, C3,
			          hs, beta, dk, C3, hs, NH);
	}
	prods_free(&p);
	ptc_free(dev, da);
	ptc_free(dev, a);
	return rc;
}
