/* cuda_attention.cu - causal multi-head self-attention core, mirroring
 * cpu_attention.c's interface: per batch row b, one strided-batched cuBLAS
 * product over the NH heads (head h's q/k/v are columns [h*hs, (h+1)*hs) of
 * qkv rows, so heads are hs floats apart), then a causal softmax kernel over
 * the score rows, which also saves each row's log-sum-exp. Scores live in a
 * pool buffer of NH*T*T floats reused per b; the backward recomputes the
 * probabilities as exp(score - lse) into one such buffer and keeps dscores in
 * another. (The full T x T products per head; the CPU computes only the
 * causal staircase.)
 */
#include "cuda_common.cuh"

/* Row i of each (T, T) matrix: softmax over [0, i], zeros above; lse[row]
 * = max + log(sum of exp). */
__global__ void k_causal_softmax(float *att, float *lse, int64_t T)
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
	for (int64_t j = threadIdx.x; j < T; j += PTC_ROW_THREADS)
		a[j] = j <= i ? a[j] * inv : 0.0f;
	if (threadIdx.x == 0)
		lse[row] = mx + logf(sum);
}

/* Row i of each (T, T) matrix of scores: exp(score - lse[row]) over [0, i],
 * zeros above. */
__global__ void k_causal_probs(float *att, const float *lse, int64_t T)
{
	int64_t row = blockIdx.x, i = row % T;
	float *a = att + row * T, l = lse[row];
	for (int64_t j = threadIdx.x; j < T; j += PTC_ROW_THREADS)
		a[j] = j <= i ? ptd_expf(a[j] - l) : 0.0f;
}

/* da = scale * a * (da - sum_j<=i a*da) on causal rows, zero above. */
__global__ void k_causal_softmax_bwd(float *da, const float *att, int64_t T, float scale)
{
	int64_t row = blockIdx.x, i = row % T;
	const float *a = att + row * T;
	float *d = da + row * T;
	float dot = 0.0f;
	for (int64_t j = threadIdx.x; j <= i; j += PTC_ROW_THREADS)
		dot += a[j] * d[j];
	dot = ptd_block_reduce(dot, ptd_add());
	for (int64_t j = threadIdx.x; j < T; j += PTC_ROW_THREADS)
		d[j] = j <= i ? scale * a[j] * (d[j] - dot) : 0.0f;
}

extern "C" int ptc_attention_forward(int dev, float *out, float *lse, const float *qkv, int64_t B,
                                     int64_t T, int64_t C, int64_t NH)
{
	PTC_STREAM(dev, s);
	int64_t hs = C / NH, C3 = 3 * C;
	float scale = 1.0f / sqrtf((float)hs);
	float *a = NULL;
	int rc = 0;
	if (B * T == 0)
		return 0;
	if (NH * T > 0x7fffffff)
		return ptc_fail("attention", "too many rows");
	if (ptc_alloc(dev, sizeof(float) * (size_t)(NH * T * T), (void **)&a) != 0)
		return 1;
	for (int64_t b = 0; b < B && rc == 0; b++) {
		const float *q = qkv + b * T * C3, *k = q + C, *v = q + 2 * C;
		float *o = out + b * T * C;
		rc = ptc_gemm_batched(dev, false, true, T, T, hs, scale, q, C3, hs, k, C3, hs, 0.0f,
		                      a, T, T * T, NH);
		if (rc == 0) {
			k_causal_softmax<<<(unsigned)(NH * T), PTC_ROW_THREADS, 0, s>>>(
			    a, lse + b * NH * T, T);
			cudaError_t e = cudaGetLastError();
			if (e != cudaSuccess)
				rc = ptc_cuda_fail("causal softmax kernel", e);
		}
		if (rc == 0)
			rc = ptc_gemm_batched(dev, false, false, T, hs, T, 1.0f, a, T, T * T, v, C3,
			                      hs, 0.0f, o, C, hs, NH);
	}
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
	for (int64_t b = 0; b < B && rc == 0; b++) {
		const float *q = qkv + b * T * C3, *k = q + C, *v = q + 2 * C;
		const float *d = dout + b * T * C;
		float *dq = dqkv + b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
		cudaError_t e;
		/* att = exp(scale q k^T - lse) on the causal rows */
		rc = ptc_gemm_batched(dev, false, true, T, T, hs, scale, q, C3, hs, k, C3, hs, 0.0f,
		                      a, T, T * T, NH);
		if (rc == 0) {
			k_causal_probs<<<(unsigned)(NH * T), PTC_ROW_THREADS, 0, s>>>(
			    a, lse + b * NH * T, T);
			if ((e = cudaGetLastError()) != cudaSuccess)
				rc = ptc_cuda_fail("causal probabilities kernel", e);
		}
		/* dv = att^T d ; datt = d v^T */
		if (rc == 0)
			rc = ptc_gemm_batched(dev, true, false, T, hs, T, 1.0f, a, T, T * T, d, C,
			                      hs, beta, dv, C3, hs, NH);
		if (rc == 0)
			rc = ptc_gemm_batched(dev, false, true, T, T, hs, 1.0f, d, C, hs, v, C3, hs,
			                      0.0f, da, T, T * T, NH);
		if (rc == 0) {
			k_causal_softmax_bwd<<<(unsigned)(NH * T), PTC_ROW_THREADS, 0, s>>>(
			    da, a, T, scale);
			if ((e = cudaGetLastError()) != cudaSuccess)
				rc = ptc_cuda_fail("causal softmax backward kernel", e);
		}
		/* dq = dscores k ; dk = dscores^T q */
		if (rc == 0)
			rc = ptc_gemm_batched(dev, false, false, T, hs, T, 1.0f, da, T, T * T, k,
			                      C3, hs, beta, dq, C3, hs, NH);
		if (rc == 0)
			rc = ptc_gemm_batched(dev, true, false, T, hs, T, 1.0f, da, T, T * T, q, C3,
			                      hs, beta, dk, C3, hs, NH);
	}
	ptc_free(dev, da);
	ptc_free(dev, a);
	return rc;
}
