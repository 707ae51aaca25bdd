/* cuda_runtime.cu - per-device state of the CUDA backend: one compute stream
 * and one cuBLAS handle per device, the caching allocator, copies, and the
 * cuBLAS matrix products (row-major through the transposition identity
 * C^T = op(B)^T op(A)^T, so no data is ever transposed).
 *
 * The pool is CUDA's stream-ordered allocator (cudaMallocAsync) on the
 * device's default memory pool. Its release threshold is the device's memory
 * less a reserve (PTC_POOL_RESERVE_DIV, at least PTC_POOL_RESERVE_MIN bytes):
 * freed blocks stay cached for the next allocation instead of going back to
 * the driver at every synchronisation, but the pool never sits on the memory
 * that NCCL and cuBLAS workspaces (allocated outside it) need. ptc_pool_trim
 * returns all cached memory; the job runner calls it (through
 * pt_backend_trim_all) when a job ends, and the NCCL communicator before it
 * retries a failed set-up. Frees are ordered on the compute stream, so a block
 * is reused only after every queued kernel that reads it. Limit: at most
 * PTC_MAX_DEVICES.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_bf16.h>

#include "cuda_common.cuh"

#define PTC_MAX_DEVICES      64
#define PTC_POOL_RESERVE_DIV 8                   /* keep 1/8 of memory free */
#define PTC_POOL_RESERVE_MIN ((uint64_t)2 << 30) /* and at least 2 GiB */

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

/* capable: whether a GPU of compute capability major.x runs this build (it
 * carries sm_80 and sm_90 code and compute_90 PTX: an older GPU would fail
 * every launch with "no kernel image"; bf16 needs 8.0); 0 or a failure. */
static int capable(int major)
{
	char msg[96];
	if (major >= 8)
		return 0;
	snprintf(msg, sizeof(msg),
	         "compute capability %d.x: this build needs 8.0 or newer (sm_80, sm_90)", major);
	return ptc_fail("cuda device", msg);
}

/* grant_failed[a][b]: granting device b access to a's pool failed. */
static bool grant_failed[PTC_MAX_DEVICES][PTC_MAX_DEVICES];

/* pool_peers makes dev's pool (where every tensor of dev comes from)
 * readable and writable by each GPU that can reach dev peer to peer. NCCL
 * between two GPUs of one process reads and writes the other GPU's buffers
 * directly, and stream-ordered pool memory, unlike cudaMalloc's, is mapped
 * only for its own GPU until it is granted. A grant that fails is recorded:
 * the NCCL communicator then sends that pair's tensors on its control path
 * (host copies, ptc_peer_direct), so no transfer faults. */
static void pool_peers(int dev, cudaMemPool_t pool)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess)
		n = 0;
	for (int d = 0; d < n && d < PTC_MAX_DEVICES; d++) {
		int can = 0;
		cudaMemAccessDesc a = {};
		if (d == dev || cudaDeviceCanAccessPeer(&can, d, dev) != cudaSuccess || !can)
			continue;
		a.location.type = cudaMemLocationTypeDevice;
		a.location.id = d;
		a.flags = cudaMemAccessFlagsProtReadWrite;
		if (cudaMemPoolSetAccess(pool, &a, 1) != cudaSuccess)
			__atomic_store_n(&grant_failed[dev][d], true, __ATOMIC_RELEASE);
	}
	(void)cudaGetLastError(); /* what failed above is handled: not the next call's */
}

extern "C" int ptc_peer_direct(int a, int b)
{
	if (a < 0 || b < 0 || a >= PTC_MAX_DEVICES || b >= PTC_MAX_DEVICES)
		return 0;
	return !__atomic_load_n(&grant_failed[a][b], __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&grant_failed[b][a], __ATOMIC_ACQUIRE);
}

/* pool_threshold is the release threshold for a device of total bytes. */
static uint64_t pool_threshold(size_t total)
{
	uint64_t reserve = total / PTC_POOL_RESERVE_DIV;
	if (reserve < PTC_POOL_RESERVE_MIN)
		reserve = PTC_POOL_RESERVE_MIN;
	return total > reserve ? total - reserve : 0;
}

static int init_device(int dev, ptc_device_state *d)
{
	cudaMemPool_t pool;
	size_t free_b = 0, total_b = 0;
	uint64_t keep;
	int major = 0;
	cublasStatus_t bs;
	cudaError_t e;
	/* A device too old for this build is refused at its first use. */
	PTC_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
	if (capable(major) != 0)
		return 1;
	PTC_CUDA(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
	if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
		cudaStreamDestroy(d->stream);
		return ptc_cuda_fail("cudaMemGetInfo", e);
	}
	keep = pool_threshold(total_b);
	if ((e = cudaDeviceGetDefaultMemPool(&pool, dev)) != cudaSuccess ||
	    (e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep)) !=
	        cudaSuccess) {
		cudaStreamDestroy(d->stream);
		return ptc_cuda_fail("default memory pool", e);
	}
	pool_peers(dev, pool);
	if ((bs = cublasCreate(&d->blas)) != CUBLAS_STATUS_SUCCESS) {
		cudaStreamDestroy(d->stream);
		return ptc_blas_fail("cublasCreate", bs);
	}
	/* FP32 unless a call asks for TF32 or bf16 (ptc_set_math, per call):
	 * results are compared with the CPU reference. */
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
	if (!__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE)) {
		pthread_mutex_lock(&devices_mu);
		int rc = d->ready ? 0 : init_device(dev, d);
		pthread_mutex_unlock(&devices_mu);
		if (rc != 0)
			return NULL;
	}
	/* A stale non-sticky error must not fail the caller's next launch. */
	(void)cudaGetLastError();
	return d;
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
	if (e == cudaErrorInsufficientDriver) {
		char msg[256];
		*n = 0;
		snprintf(msg, sizeof(msg),
		         "%s (%s): no NVIDIA driver, or one older than this CUDA %d.%d runtime "
		         "needs (CUDA 13 needs driver R580 or newer)",
		         cudaGetErrorString(e), cudaGetErrorName(e), CUDART_VERSION / 1000,
		         CUDART_VERSION % 1000 / 10);
		return ptc_fail("cudaGetDeviceCount", msg);
	}
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

extern "C" int ptc_device_describe(int dev, char *buf, size_t cap)
{
	cudaDeviceProp p;
	int driver = 0;
	PTC_CUDA(cudaGetDeviceProperties(&p, dev));
	cudaDriverGetVersion(&driver);
	snprintf(buf, cap, "%s, sm_%d%d, %d SMs, %.0f GiB, driver CUDA %d.%d", p.name, p.major,
	         p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30),
	         driver / 1000, driver % 1000 / 10);
	return 0;
}

extern "C" int ptc_device_probe(int dev)
{
	int n = 0, major = 0, mode = 0;
	cudaError_t e;
	if (ptc_device_count(&n) != 0)
		return 1;
	if (dev < 0 || dev >= n) {
		char msg[64];
		snprintf(msg, sizeof(msg), "device %d of %d", dev, n);
		return ptc_fail("cuda device", msg);
	}
	/* Attribute queries need no context: cheap, and safe on any thread. */
	if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) !=
	        cudaSuccess ||
	    (e = cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, dev)) != cudaSuccess)
		return ptc_cuda_fail("cudaDeviceGetAttribute", e);
	if (mode == cudaComputeModeProhibited)
		return ptc_fail("cudaDeviceGetAttribute", "compute mode is prohibited");
	return capable(major);
}

extern "C" int ptc_alloc(int dev, size_t n, void **out)
{
	PTC_STREAM(dev, s);
	*out = NULL;
	PTC_CUDA(cudaMallocAsync(out, n ? n : 1, s));
	if (n) {
		cudaError_t e = cudaMemsetAsync(*out, 0, n, s);
		if (e != cudaSuccess) { /* the caller sees no block: free it here */
			cudaFreeAsync(*out, s);
			*out = NULL;
			return ptc_cuda_fail("cudaMemsetAsync", e);
		}
	}
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
	int prev = -1;
	cudaError_t e;
	/* The caller's current device is put back (this runs on job threads). */
	if (cudaGetDevice(&prev) != cudaSuccess)
		prev = -1;
	cudaStream_t s = ptc_stream_of(dev);
	if (s == NULL)
		return 1;
	/* Frees still queued on the stream return their blocks to the pool first. */
	e = cudaStreamSynchronize(s);
	if (e == cudaSuccess)
		e = cudaDeviceGetDefaultMemPool(&pool, dev);
	if (e == cudaSuccess)
		e = cudaMemPoolTrimTo(pool, 0);
	if (prev >= 0 && prev != dev)
		cudaSetDevice(prev);
	return e == cudaSuccess ? 0 : ptc_cuda_fail("trimming the memory pool", e);
}

extern "C" int ptc_pool_trim_all(void)
{
	int rc = 0;
	for (int dev = 0; dev < PTC_MAX_DEVICES; dev++)
		if (__atomic_load_n(&devices[dev].ready, __ATOMIC_ACQUIRE) &&
		    ptc_pool_trim(dev) != 0)
			rc = 1; /* last_error names the last failure */
	return rc;
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

/* The calling thread's math for its products (a job's precision): a
 * per-call choice, so threads sharing a device's handle do not change each
 * other's math. */
static thread_local int gemm_math = PTC_MATH_FP32;

extern "C" void ptc_set_math(int math)
{
	gemm_math = math;
}

extern "C" int ptc_get_math(void)
{
	return gemm_math;
}

/* to_bf16 rounds n floats to bf16, nearest even (the CPU emulation's rule). */
__global__ static void to_bf16(__nv_bfloat16 *d, const float *s, int64_t n)
{
	PTC_FOR(i, n)
	d[i] = __float2bfloat16_rn(s[i]);
}

static int round_bf16_on(cudaStream_t s, __nv_bfloat16 *d, const float *src, int64_t n)
{
	cudaError_t e;
	if (n <= 0)
		return 0;
	to_bf16<<<ptc_blocks(n, 256), 256, 0, s>>>(d, src, n);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return ptc_cuda_fail("rounding operands to bf16", e);
	return 0;
}

extern "C" int ptc_round_bf16(int dev, void *d, const float *s, int64_t n)
{
	PTC_STREAM(dev, st);
	return round_bf16_on(st, (__nv_bfloat16 *)d, s, n);
}

/* operand_span counts the elements from the first to the last one a
 * row-major operand of rows x cols (leading dimension ld) reads, batch of
 * them stride apart: converting that span keeps ld and stride valid. */
static int64_t operand_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch)
{
	return (batch - 1) * stride + (rows - 1) * ld + cols;
}

/* gemm_dims_ok: cuBLAS takes 32-bit sizes and non-negative strides. */
static int gemm_dims_ok(const char *what, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                        int64_t ldc, int64_t strideA, int64_t strideB, int64_t batch)
{
	if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX ||
	    ldc > INT32_MAX || batch > INT32_MAX)
		return ptc_fail(what, "dimension beyond 32 bits");
	if (strideA < 0 || strideB < 0)
		return ptc_fail(what, "negative batch stride");
	return 0;
}

/* gemm16 multiplies bf16 operands into the f32 C (f32 accumulation).
 * Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
static int gemm16(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                  const __nv_bfloat16 *A, int lda, int64_t strideA, const __nv_bfloat16 *B, int ldb,
                  int64_t strideB, float beta, float *C, int ldc, int64_t strideC, int batch)
{
	cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasStatus_t st;
	if (batch == 1)
		st = cublasGemmEx(h, opb, opa, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF,
		                  lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
		                  CUBLAS_GEMM_DEFAULT);
	else
		st = cublasGemmStridedBatchedEx(h, opb, opa, N, M, K, &alpha, B, CUDA_R_16BF, ldb,
		                                strideB, A, CUDA_R_16BF, lda, strideA, &beta, C,
		                                CUDA_R_32F, ldc, strideC, batch, CUBLAS_COMPUTE_32F,
		                                CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		return ptc_blas_fail("cublasGemmEx (bf16)", st);
	return 0;
}

/* gemm_bf16 is ptc_gemm_batched's bf16 path: A and B rounded to bf16 into
 * scratch from the device's pool (stream-ordered, so freed after the GEMM
 * reads them), C stays f32, accumulation f32. */
static int gemm_bf16(int dev, cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, int lda, int64_t strideA, const float *B, int ldb,
                     int64_t strideB, float beta, float *C, int ldc, int64_t strideC, int batch)
{
	int64_t na = operand_span(ta ? K : M, ta ? M : K, lda, strideA, batch);
	int64_t nb = operand_span(tb ? N : K, tb ? K : N, ldb, strideB, batch);
	__nv_bfloat16 *a16 = NULL, *b16 = NULL;
	cudaError_t e;
	int rc;
	PTC_STREAM(dev, s);

	if ((e = cudaMallocAsync((void **)&a16, (size_t)na * sizeof(*a16), s)) != cudaSuccess)
		return ptc_cuda_fail("bf16 operand scratch", e);
	if ((e = cudaMallocAsync((void **)&b16, (size_t)nb * sizeof(*b16), s)) != cudaSuccess) {
		cudaFreeAsync(a16, s);
		return ptc_cuda_fail("bf16 operand scratch", e);
	}
	rc = round_bf16_on(s, a16, A, na);
	if (rc == 0)
		rc = round_bf16_on(s, b16, B, nb);
	if (rc == 0)
		rc = gemm16(h, ta, tb, M, N, K, alpha, a16, lda, strideA, b16, ldb, strideB, beta,
		            C, ldc, strideC, batch);
	/* Queued after the GEMM on the same stream: the blocks are reused only
	 * once it has read them. */
	cudaFreeAsync(a16, s);
	cudaFreeAsync(b16, s);
	return rc;
}

extern "C" int ptc_gemm_bf16(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                             float alpha, const void *A, int64_t lda, int64_t strideA,
                             const void *B, int64_t ldb, int64_t strideB, float beta, float *C,
                             int64_t ldc, int64_t strideC, int64_t batch)
{
	cublasHandle_t h = ptc_blas_of(dev);
	if (h == NULL)
		return 1;
	if (M == 0 || N == 0 || batch == 0)
		return 0;
	if (gemm_dims_ok("cublasGemmEx (bf16)", M, N, K, lda, ldb, ldc, strideA, strideB, batch) !=
	    0)
		return 1;
	return gemm16(h, ta, tb, (int)M, (int)N, (int)K, alpha, (const __nv_bfloat16 *)A, (int)lda,
	              strideA, (const __nv_bfloat16 *)B, (int)ldb, strideB, beta, C, (int)ldc,
	              strideC, (int)batch);
}

extern "C" int ptc_gemm_batched(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                float alpha, const float *A, int64_t lda, int64_t strideA,
                                const float *B, int64_t ldb, int64_t strideB, float beta, float *C,
                                int64_t ldc, int64_t strideC, int64_t batch)
{
	cublasHandle_t h = ptc_blas_of(dev);
	cublasStatus_t st;
	bool tf32 = gemm_math == PTC_MATH_TF32;
	if (h == NULL)
		return 1;
	if (M == 0 || N == 0 || batch == 0)
		return 0;
	if (gemm_dims_ok("cublasSgemm", M, N, K, lda, ldb, ldc, strideA, strideB, batch) != 0)
		return 1;
	/* K == 0 multiplies nothing: C = beta C in any math. */
	if (gemm_math == PTC_MATH_BF16 && K > 0)
		return gemm_bf16(dev, h, ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda,
		                 strideA, B, (int)ldb, strideB, beta, C, (int)ldc, strideC,
		                 (int)batch);
	/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
	cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	if (tf32 && batch == 1)
		st = cublasGemmEx(h, opb, opa, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F,
		                  (int)ldb, A, CUDA_R_32F, (int)lda, &beta, C, CUDA_R_32F, (int)ldc,
		                  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
	else if (tf32)
		st = cublasGemmStridedBatchedEx(
		    h, opb, opa, (int)N, (int)M, (int)K, &alpha, B, CUDA_R_32F, (int)ldb, strideB,
		    A, CUDA_R_32F, (int)lda, strideA, &beta, C, CUDA_R_32F, (int)ldc, strideC,
		    (int)batch, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
	else if (batch == 1)
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
