/* cuda_kernels.h - the CUDA launchers: plain C functions over raw device
 * pointers and sizes, implemented in the .cu files of lib/ops/cuda.
 *
 * This header is shared by C and the nvcc-compiled .cu files, so it uses only
 * <stdint.h>/<stddef.h> types (tensor.h's C11 atomics do not compile as C++);
 * cuda_ops.c unpacks a pt_op_call into these calls. Each launcher works on
 * device `dev`, runs on that device's compute stream (asynchronous unless it
 * says otherwise) and returns 0 on success or non-zero with a message naming
 * the CUDA/cuBLAS call in ptc_last_error(). Reductions are deterministic (the
 * same bits run to run on one device); the embedding gradient follows the CPU
 * kernel's summation order, column sums over rows use a fixed two-pass order.
 * Launchers may be called from any thread; one device's calls are ordered by
 * its one stream.
 */
#ifndef PT_CUDA_KERNELS_H
#define PT_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime (cuda_runtime.cu) ---- */

/* ptc_last_error returns the calling thread's last failure message ("" if none). */
const char *ptc_last_error(void);

/* ptc_device_count sets *n to the number of visible devices; fails (with the
 * cudaGetDeviceCount message) when there is no driver or no device; a driver
 * too old for this runtime is named as such (CUDA 13 needs R580 or newer). */
int ptc_device_count(int *n);

/* ptc_device_memory sets *total to dev's global memory in bytes
 * (cudaGetDeviceProperties; does not change the current device). */
int ptc_device_memory(int dev, size_t *total);

/* ptc_device_describe writes "NAME, sm_XY, N SMs, M GiB, driver CUDA a.b". */
int ptc_device_describe(int dev, char *buf, size_t cap);

/* ptc_device_probe asks the runtime whether device dev is usable now:
 * visible (cudaGetDeviceCount, so CUDA_VISIBLE_DEVICES counts) and answering
 * attribute queries, not in the prohibited compute mode. Creates no context;
 * any thread. */
int ptc_device_probe(int dev);

/* ptc_peer_direct: 1 unless granting a's memory pool to b or b's to a
 * failed (pool_peers, when each device was first used). */
int ptc_peer_direct(int a, int b);

/* ptc_alloc allocates n bytes (zeroed) on dev from the device's caching pool
 * (CUDA's stream-ordered allocator; it keeps freed memory cached up to the
 * device's memory less a reserve), ordered on dev's compute stream. */
int ptc_alloc(int dev, size_t n, void **out);

/* ptc_free returns p to dev's pool, ordered after every queued use on the
 * compute stream. NULL is fine. */
int ptc_free(int dev, void *p);

/* ptc_pool_trim waits for dev's compute stream, then gives all cached,
 * unused pool memory of dev back to the driver. Blocking; keeps the calling
 * thread's current device. */
int ptc_pool_trim(int dev);

/* ptc_pool_trim_all is ptc_pool_trim for every device this process has used. */
int ptc_pool_trim_all(void);

enum { PTC_H2D = 0, PTC_D2H = 1, PTC_D2D = 2 };

/* ptc_memcpy copies n bytes in direction kind on dev's compute stream and,
 * for PTC_H2D/PTC_D2H, waits for it (host buffers may be pageable). */
int ptc_memcpy(int dev, void *dst, const void *src, size_t n, int kind);

/* ptc_sync waits until dev's compute stream is idle. */
int ptc_sync(int dev);

/* ptc_stream returns dev's compute stream (a cudaStream_t) or NULL. */
void *ptc_stream(int dev);

/* The calling thread's math for the products it asks for from now on (a
 * job's precision): full FP32, TF32 inputs, or bf16 inputs (each with f32
 * accumulation and f32 results). */
enum { PTC_MATH_FP32 = 0, PTC_MATH_TF32 = 1, PTC_MATH_BF16 = 2 };
void ptc_set_math(int math);
int ptc_get_math(void);

/* ptc_gemm: row-major C (M, N) = alpha op(A) op(B) + beta C through cuBLAS,
 * in the calling thread's math (ptc_set_math): sgemm; TF32 compute type on
 * the fp32 operands; or the operands rounded to bf16 (nearest even, as the
 * CPU's emulation) into pool scratch and cublasGemmEx with CUDA_R_16BF
 * inputs, CUBLAS_COMPUTE_32F. Leading dimensions in elements. */
int ptc_gemm(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
             const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
             int64_t ldc);

/* ptc_gemm_batched is ptc_gemm over `batch` problems whose operands are
 * strideA/strideB/strideC elements apart. */
int ptc_gemm_batched(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, int64_t strideA, const float *B, int64_t ldb,
                     int64_t strideB, float beta, float *C, int64_t ldc, int64_t strideC,
                     int64_t batch);

/* ptc_round_bf16 rounds n floats at s to bf16 (nearest even, as ptc_gemm's
 * bf16 math) into d (2n bytes) on dev's stream. */
int ptc_round_bf16(int dev, void *d, const float *s, int64_t n);

/* ptc_gemm_bf16 is ptc_gemm_batched over operands its caller has already
 * rounded to bf16 (A and B point at bf16 elements; ptc_round_bf16), with f32
 * accumulation into the f32 C, whatever the thread's math: a caller that
 * reads one operand in several products rounds it once. */
int ptc_gemm_bf16(int dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const void *A, int64_t lda, int64_t strideA, const void *B, int64_t ldb,
                  int64_t strideB, float beta, float *C, int64_t ldc, int64_t strideC,
                  int64_t batch);

/* ---- element-wise (cuda_elementwise.cu) ---- */

enum { PTC_F32 = 0, PTC_F64 = 1, PTC_I32 = 2, PTC_I64 = 3 };

/* ptc_fill sets n elements of kind (PTC_F32, ...) at p to v (converted as C does). */
int ptc_fill(int dev, void *p, int64_t n, int kind, double v);

/* ptc_copy_strided copies an ndim-d view element by element (elem_size 1, 2,
 * 4 or 8 bytes); offsets and strides in elements. */
int ptc_copy_strided(int dev, void *dst, const int64_t *dst_strides, const void *src,
                     const int64_t *src_strides, int ndim, const int64_t *shape, size_t elem_size);

int ptc_scale(int dev, float *y, const float *x, int64_t n, float a);
int ptc_add(int dev, float *y, const float *a, const float *b, int64_t n, float al, float be);

/* act: 0 ReLU, 1 GELU (tanh form), 2 Tanh, 3 Sigmoid, as pt_act. */
int ptc_act_forward(int dev, int act, float *y, const float *x, int64_t n);
int ptc_act_backward(int dev, int act, float *dx, const float *dy, const float *x, const float *y,
                     int64_t n, bool accum);

/* ptc_dropout: out = (accum ? out : 0) + in * mask / (1 - p) with the
 * Philox4x32-10 mask of lib/core/rng.c (bitwise the CPU mask). */
int ptc_dropout(int dev, float *out, const float *in, int64_t n, float p, uint64_t seed,
                uint64_t stream, bool accum);

/* ptc_check_index sets *bad to the first i in [0, n) with idx[i] outside
 * [0, limit) (skipping idx[i] == ignore when use_ignore), or -1. Waits for
 * the stream (the answer is read on the host). */
int ptc_check_index(int dev, const int64_t *idx, int64_t n, int64_t limit, bool use_ignore,
                    int64_t ignore, int64_t *bad, int64_t *bad_value);

int ptc_mse_forward(int dev, float *loss, const float *p, const float *t, int64_t n, float scale);
int ptc_mse_backward(int dev, float *d, const float *p, const float *t, int64_t n, float scale);

/* ptc_squared_norm: *out (device f64) = sum x^2 in double. */
int ptc_squared_norm(int dev, double *out, const float *x, int64_t n);

int ptc_adamw(int dev, float *p, float *m, float *v, const float *g, int64_t n, float b1, float b2,
              float eps, float gs, float step_size, float bc2_sqrt, float decay);
int ptc_sgd(int dev, float *p, float *buf, const float *g, int64_t n, float lr, float mu,
            float damp, float wd, float gs, bool nesterov, bool first);

/* ---- rows (cuda_rows.cu) ---- */

/* Row ops over R rows of C contiguous floats. */
int ptc_softmax_forward(int dev, float *y, const float *x, int64_t R, int64_t C);
int ptc_softmax_backward(int dev, float *dx, const float *dy, const float *y, int64_t R, int64_t C,
                         bool accum);
int ptc_layernorm_forward(int dev, float *y, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int64_t R, int64_t C, float eps);
int ptc_layernorm_backward(int dev, float *dx, float *dw, float *db, const float *dy,
                           const float *x, const float *w, const float *mean, const float *rstd,
                           int64_t R, int64_t C, bool accum);

/* ptc_bias_rows: y (N, O) rows = bias (O). ptc_colsum_acc: db (O) += column
 * sums of g (N, O) in a fixed two-pass order (partial sums over chunks of
 * rows, then the chunks in order; scratch from the pool). */
int ptc_bias_rows(int dev, float *y, const float *bias, int64_t N, int64_t O);
int ptc_colsum_acc(int dev, float *db, const float *g, int64_t N, int64_t O);

/* Embeddings: tokens already range-checked (in [0, V)). wpe/dwpe may be
 * NULL. The backward takes scratch from the pool. */
int ptc_embedding_forward(int dev, float *out, const int64_t *tok, const float *wte,
                          const float *wpe, int64_t B, int64_t T, int64_t C);
int ptc_embedding_backward(int dev, float *dwte, float *dwpe, const float *dout, const int64_t *tok,
                           int64_t B, int64_t T, int64_t C, int64_t V);

/* Cross-entropy over R rows of V logits; targets already range-checked. */
int ptc_xent_forward(int dev, float *losses, float *probs, const float *logits, const int64_t *tg,
                     int64_t R, int64_t V, int64_t ignore);
int ptc_xent_backward(int dev, float *d, const float *probs, const int64_t *tg, int64_t R,
                      int64_t V, int64_t ignore, float scale);

/* ---- attention (cuda_attention.cu) ---- */

/* Causal self-attention core, as cpu_attention.c: qkv (B, T, 3C), out (B, T, C),
 * lse (B, NH, T) each row's log-sum-exp of its scaled scores. The forward
 * takes a scratch pool buffer of NH*T*T floats, the backward two (each reused
 * for every batch row); the backward recomputes the probabilities from lse. */
int ptc_attention_forward(int dev, float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                          int64_t C, int64_t NH);
int ptc_attention_backward(int dev, float *dqkv, const float *dout, const float *qkv,
                           const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                           bool accum);

#ifdef __cplusplus
}
#endif

#endif
