/* cuda_runtime.cu - per-device state of the CUDA backend: one compute stream
 * and one cuBLAS handle per device, the caching allocator, copies, and the
 * cuBLAS matrix products (row-major through the transposition identity
 * C^T = op(B)^T op(A)^T, so no data is ever transposed).
 *
 * The pool is CUDA's stream-ordered allocator (cudaMallocAsync) on the
 * device's default memory pool with the release threshold raised to the
 * maximum, so freed blocks stay cached for the next allocation instead of
 * going back to the driver at every stream synchronisation; ptc_pool_trim
 * returns them. Frees are ordered on the compute stream, so a block is reused
 * only after every queued kernel that reads it. Limit: at most PTC_MAX_DEVICES.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

#define PTC_MAX_DEVICES 64

static thread_local char last_error[512];

typedef struct ptc_device_state {
	bool ready;
	cudaStream_t stream;
	cublasHandle_t blas;
} ptc_device_state;

static ptc_device_state devices[PTC_MAX_DEVICES];
static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;

extern "C" const char *ptc_last_error(void)
{
	return last_error;
}

int ptc_fail(const char *what, const char *msg)
{
	snprintf(last_error, sizeof(last_error), "%s: %s", what, msg);
	return 1;
}

int ptc_cuda_fail(const char *what, cudaError_t e)
{
	char msg[256];
	snprintf(msg, sizeof(msg), "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
	return ptc_fail(what, msg);
}

int ptc_blas_fail(const char *what, cublasStatus_t s)
{
	char msg[128];
	snprintf(msg, sizeof(msg), "cuBLAS status %d (%s)", (int)s, cublasGetStatusString(s));
	return ptc_fail(what, msg);
}

static int init_device(int dev, ptc_device_state *d)
{
	cudaMemPool_t pool;
	uint64_t keep = UINT64_MAX;
	cublasStatus_t bs;
	cudaError_t e;
	PTC_CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
	if ((e = cudaDeviceGetDefaultMemPool(&pool, dev)) != cudaSuccess ||
	    (e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep)) !=
	        cudaSuccess) {
		cudaStreamDestroy(d->stream);
		return ptc_cuda_fail("default memory pool", e);
	}
	if ((bs = cublasCreate(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
		cudaStreamDestroy(d->stream);
		return ptc_blas_fail("cublasCreate", bs);
	}
	/* FP32 everywhere (no TF32): results are compared with the CPU reference. */
	if ((bs = cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
	    (bs = cublasSetStream(d->blas, d->stream)) != CUBLAS_STATUS_SUCCESS) {
		cublasDestroy(d->blas);
		cudaStreamDestroy(d->stream);
		return ptc_blas_fail("cuBLAS set-up", bs);
	}
	/* Published last, with release order: state_of reads it without the lock. */
	__atomic_store_n(&d->ready, true, __ATOMIC_RELEASE);
	return 0;
}

static ptc_device_state *state_of(int dev)
{
	ptc_device_state *d;
	cudaError_t e;
	if (dev < 0 || dev >= PTC_MAX_DEVICES) {
		ptc_fail("cuda device", "index out of range");
		return NULL;
	}
	if ((e = cudaSetDevice(dev)) != cudaSuccess) {
		ptc_cuda_fail("cudaSetDevice", e);
		return NULL;
	}
	d = &devices[dev];
	if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE))
		return d;
	pthread_mutex_lock(&devices_mu);
	int rc = d->ready ? 0 : init_device(dev, d);
	pthread_mutex_unlock(&devices_mu);
	return rc == 0 ? d : NULL;
}

cudaStream_t ptc_stream_of(int dev)
{
	ptc_device_state *d = state_of(dev);
	return d ? d->stream : NULL;
}

cublasHandle_t ptc_blas_of(int dev)
{
	ptc_device_state *d = state_of(dev);
	return d ? d->blas : NULL;
}

extern "C" void *ptc_stream(int dev)
{
	return (void *)ptc_stream_of(dev);
}

extern "C" int ptc_device_count(int *n)
{
	cudaError_t e = cudaGetDeviceCount(n);
	if (e != cudaSuccess) {
		*n = 0;
		return ptc_cuda_fail("cudaGetDeviceCount", e);
	}
	if (*n == 0)
		return ptc_fail("cudaGetDeviceCount", "0 devices");
	return 0;
}

extern "C" int ptc_device_memory(int dev, size_t *total)
{
	cudaDeviceProp p;
	PTC_CUDA(cudaGetDeviceProperties(&p, dev));
	*total = p.totalGlobalMem;
	return 0;
}

extern "C" int ptc_alloc(int dev, size_t n, void **out)
{
	PTC_STREAM(dev, s);
	*out = NULL;
	PTC_CUDA(cudaMallocAsync(out, n ? n : 1, s));
	if (n)
		PTC_CUDA(cudaMemsetAsync(*out, 0, n, s));
	return 0;
}

extern "C" int ptc_free(int dev, void *p)
{
	if (p == NULL)
		return 0;
	PTC_STREAM(dev, s);
	PTC_CUDA(cudaFreeAsync(p, s));
	return 0;
}

extern "C" int ptc_pool_trim(int dev)
{
	cudaMemPool_t pool;
	PTC_STREAM(dev, s);
	PTC_CUDA(cudaStreamSynchronize(s));
	PTC_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
	PTC_CUDA(cudaMemPoolTrimTo(pool, 0));
	return 0;
}

extern "C" int ptc_memcpy(int dev, void *dst, const void *src, size_t n, int kind)
{
	static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
	                                       cudaMemcpyDeviceToDevice};
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	PTC_CUDA(cudaMemcpyAsync(dst, src, n, kinds[kind], s));
	if (kind != PTC_D2D)
		PTC_CUDA(cudaStreamSynchronize(s));
	return 0;
}

extern "C" int ptc_sync(int dev)
{
	PTC_STREAM(dev, s);
	PTC_CUDA(cudaStreamSynchronize(s));
	return 0;
}

extern "C" int ptc_gemm_batched(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                float alpha, const float *A, int64_t lda, int64_t strideA,
                                const float *B, int64_t ldb, int64_t strideB, float beta, float *C,
                                int64_t ldc, int64_t strideC, int64_t batch)
{
	cublasHandle_t h = ptc_blas_of(dev);
	cublasStatus_t st;
	if (h == NULL)
		return 1;
	if (M == 0 || N == 0 || batch == 0)
		return 0;
	if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
	    ldc > INT32_MAX || batch > INT32_MAX)
		return ptc_fail("cublasSgemm", "dimension beyond 32 bits");
	/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
	cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	if (batch == 1)
		st = cublasSgemm(h, opb, opa, (int)N, (int)M, (int)K, &alpha, B, (int)ldb, A,
		                 (int)lda, &beta, C, (int)ldc);
	else
		st = cublasSgemmStridedBatched(h, opb, opa, (int)N, (int)M, (int)K, &alpha, B,
		                               (int)ldb, strideB, A, (int)lda, strideA, &beta, C,
		                               (int)ldc, strideC, (int)batch);
	if (st != CUBLAS_STATUS_SUCCESS)
		return ptc_blas_fail("cublasSgemm", st);
	return 0;
}

extern "C" int ptc_gemm(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc)
{
	return ptc_gemm_batched(dev, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
	                        1);
}
