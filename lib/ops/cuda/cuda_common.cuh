/* cuda_common.cuh - helpers shared by the .cu files of the CUDA backend:
 * error recording, per-device state, and device copies of the CPU math
 * (pt_expf's polynomial, Philox4x32-10) so GPU results track the CPU
 * reference closely (dropout masks bitwise). Internal to lib/ops/cuda/.
 */
#ifndef PT_CUDA_COMMON_CUH
#define PT_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_kernels.h"

/* ptc_fail records "what: message" for ptc_last_error and returns 1. */
int ptc_fail(const char *what, const char *msg);
int ptc_cuda_fail(const char *what, cudaError_t e);
int ptc_blas_fail(const char *what, cublasStatus_t s);

/* ptc_stream_of makes dev current on this thread and returns its compute
 * stream (created on first use), or NULL after recording the error. It also
 * clears the thread's CUDA error slot (cudaGetLastError), so that a stale,
 * non-sticky error of an earlier call (cudaErrorNotReady from a stream query,
 * an invalid argument) is not reported by the next launch's PTC_LAUNCHED;
 * sticky errors (a kernel fault) cannot be cleared and still show. */
cudaStream_t ptc_stream_of(int dev);

/* ptc_blas_of returns dev's cuBLAS handle bound to its stream, or NULL; it
 * clears the error slot as ptc_stream_of does (cuBLAS checks launches too). */
cublasHandle_t ptc_blas_of(int dev);

/* Checks the launches since the launcher's PTC_STREAM (or ptc_blas_of),
 * which cleared the thread's error slot: only their errors are reported. */
#define PTC_LAUNCHED(what)                                                                         \
	do {                                                                                       \
		cudaError_t e_ = cudaGetLastError();                                               \
		if (e_ != cudaSuccess)                                                             \
			return ptc_cuda_fail(what, e_);                                            \
	} while (0)

#define PTC_CUDA(call)                                                                             \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess)                                                             \
			return ptc_cuda_fail(#call, e_);                                           \
	} while (0)

#define PTC_STREAM(dev, s)                                                                         \
	cudaStream_t s = ptc_stream_of(dev);                                                       \
	if (s == NULL)                                                                             \
		return 1;

static inline unsigned ptc_blocks(int64_t n, int threads)
{
	int64_t b = (n + threads - 1) / threads;
	return (unsigned)(b < 1 ? 1 : (b > 65535 * 64 ? 65535 * 64 : b));
}

/* Grid-stride loop over [0, n). */
#define PTC_FOR(i, n)                                                                              \
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
	     i += (int64_t)gridDim.x * blockDim.x)

/* pt_expf of lib/ops/cpu/cpu_math.h, same constants and order. */
__device__ static inline float ptd_expf(float x)
{
	x = x > 88.7f ? 88.7f : x;
	x = x < -87.3f ? -87.3f : x;
	float n = rintf(x * 1.44269504088896341f);
	float r = x - n * 0.693145751953125f;
	r = r - n * 1.428606765330187045e-06f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	return p * __int_as_float(((int)n + 127) << 23);
}

__device__ static inline float ptd_tanhf(float x)
{
	return 1.0f - 2.0f / (ptd_expf(2.0f * x) + 1.0f);
}

__device__ static inline float ptd_sigmoidf(float x)
{
	return 1.0f / (1.0f + ptd_expf(-x));
}

#define PTD_GELU_K 0.7978845608028654f

/* pt_philox of lib/core/rng.c. */
__device__ static inline void ptd_philox(uint64_t seed, uint64_t stream, uint64_t counter,
                                         uint32_t out[4])
{
	uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
	uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
	uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
	for (int i = 0; i < 10; i++) {
		uint64_t p0 = (uint64_t)0xD2511F53u * c0;
		uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n1 = (uint32_t)p1;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		uint32_t n3 = (uint32_t)p0;
		c0 = n0;
		c1 = n1;
		c2 = n2;
		c3 = n3;
		k0 += 0x9E3779B9u;
		k1 += 0xBB67AE85u;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

__device__ static inline float ptd_u32_to_unit(uint32_t x)
{
	return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* Block-wide sum/max for blocks of PTC_ROW_THREADS threads (a power of two);
 * every thread gets the result. The reduction tree is fixed, so results are
 * deterministic. */
#define PTC_ROW_THREADS 256

template <typename T, typename Op> __device__ static inline T ptd_block_reduce(T v, Op op)
{
	__shared__ T buf[PTC_ROW_THREADS];
	buf[threadIdx.x] = v;
	__syncthreads();
	for (int s = PTC_ROW_THREADS / 2; s > 0; s >>= 1) {
		if ((int)threadIdx.x < s)
			buf[threadIdx.x] = op(buf[threadIdx.x], buf[threadIdx.x + s]);
		__syncthreads();
	}
	T r = buf[0];
	__syncthreads();
	return r;
}

struct ptd_add {
	template <typename T> __device__ T operator()(T a, T b) const
	{
		return a + b;
	}
};
struct ptd_max {
	__device__ float operator()(float a, float b) const
	{
		return a > b ? a : b;
	}
};

#endif
