/* gpu_bench - the CUDA backend beside cuBLAS and PyTorch on the same GPU.
 *
 * Prints `bench <name> <value>` lines:
 *   gpu_matmul_tflops     our matmul op (dispatcher, cuda:0), 8192^3 fp32
 *   gpu_cublas_tflops     cublasSgemm on the same buffers (full FP32, as ours)
 *   gpu_matmul_vs_cublas  the ratio of the two
 *   gpu_w2_tokens_per_s   GPT-2-small shape (vocab 50304, d 768, 12 blocks,
 *                         12 heads, context 1024, batch 8, AdamW), one stage
 *                         on cuda:0, full FP32 (no TF32)
 *   gpu_w2_vs_torch       over PyTorch eager on the same GPU, same model and
 *                         batch, FP32 with TF32 off (bench/torch_gpu_ref.py,
 *                         run by this program after ours, so the GPU is free)
 *   gpu_w2_tf32_tokens_per_s, gpu_w2_bf16_tokens_per_s  the same job with
 *                         precision tf32 and bf16; gpu_w2_bf16_vs_fp32
 *   gpu_w2_bf16_vs_torch_bf16  over PyTorch with torch.autocast(bfloat16)
 * and `#` lines: PyTorch with TF32 and with fused attention (information),
 * our first and last loss, and a per-op profile of one step (each kernel
 * timed between two device synchronisations: where the time goes).
 * Without a CUDA device it prints "skip: ..." and exits 0, so `make bench`
 * runs everywhere. `--torch PATH` names the reference script.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dispatch.h"
#include "ops.h"
#include "rng.h"
#include "profile.h"
#include "runtime.h"
#include "train.h"

#ifdef PT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif

#define GPU ((pt_device){PT_DEV_CUDA, 0})

#ifdef PT_HAVE_CUDA
static void die(const char *what)
{
	fprintf(stderr, "gpu_bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

/* A device tensor of n x n normal values. */
static void random_square(pt_tensor *t, int64_t n, uint64_t seed)
{
	float *h = malloc(sizeof(float) * (size_t)(n * n));
	pt_rng r;
	if (h == NULL)
		die("host memory");
	pt_rng_init(&r, seed, 0);
	pt_rng_normal(&r, h, n * n, 0.0f, 1.0f);
	if (pt_tensor_init_dev(t, GPU, PT_F32, 2, (int64_t[]){n, n}) != PT_OK ||
	    pt_backend_copy(pt_tensor_data(t), GPU, h, PT_CPU, sizeof(float) * (size_t)(n * n)) !=
	        PT_OK)
		die("device tensor");
	free(h);
}

/* Best of 3 trials of `reps` products: ours through the dispatcher, then
 * cublasSgemm directly on the same buffers. */
static void bench_matmul(void)
{
	const int64_t n = 8192;
	const int reps = 10;
	const double flop = 2.0 * (double)n * n * n * reps;
	pt_tensor a, b, c;
	cublasHandle_t h;
	float one = 1.0f, zero = 0.0f;
	double ours = 0.0, theirs = 0.0;

	random_square(&a, n, 1);
	random_square(&b, n, 2);
	if (pt_tensor_init_dev(&c, GPU, PT_F32, 2, (int64_t[]){n, n}) != PT_OK)
		die("device tensor");
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS ||
	    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)
		die("cublasCreate");
	for (int trial = 0; trial < 4; trial++) { /* trial 0 warms up */
		double t0 = pt_now();
		for (int r = 0; r < reps; r++)
			if (pt_matmul(&c, &a, &b, false, false, 1.0f, 0.0f) != PT_OK)
				die("pt_matmul");
		if (pt_backend_sync(GPU) != PT_OK)
			die("sync");
		if (trial > 0 && flop / (pt_now() - t0) > ours)
			ours = flop / (pt_now() - t0);
		t0 = pt_now();
		for (int r = 0; r < reps; r++)
			if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one,
			                pt_tensor_f32(&b), (int)n, pt_tensor_f32(&a), (int)n, &zero,
			                pt_tensor_f32(&c), (int)n) != CUBLAS_STATUS_SUCCESS)
				die("cublasSgemm");
		if (cudaDeviceSynchronize() != cudaSuccess)
			die("cudaDeviceSynchronize");
		if (trial > 0 && flop / (pt_now() - t0) > theirs)
			theirs = flop / (pt_now() - t0);
	}
	cublasDestroy(h);
	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
	pt_tensor_fini(&c);
	printf("bench gpu_matmul_tflops %.2f\n", ours / 1e12);
	printf("bench gpu_cublas_tflops %.2f\n", theirs / 1e12);
	printf("bench gpu_matmul_vs_cublas %.3f\n", ours / theirs);
}

enum { VOCAB = 50304, DIM = 768, BLOCKS = 12, HEADS = 12, CTX = 1024, BATCH = 8 };

/* Trains the GPT-2-small shape on cuda:0 with its products at precision
 * prec (named tag in the `#` lines); returns tokens/s. */
static double bench_w2(pt_precision prec, const char *tag)
{
	pt_layer_spec layers[BLOCKS + 3];
	int nl = 0, warmup = 2, steps = 6;
	layers[nl++] = pt_embedding(VOCAB, DIM, CTX);
	for (int i = 0; i < BLOCKS; i++)
		layers[nl++] = pt_block(DIM, HEADS);
	layers[nl++] = pt_layernorm(DIM);
	layers[nl++] = pt_linear(DIM, VOCAB);
	pt_model_config cfg = {BATCH, {PT_I64, CTX, 0}, 1, 1, GPU, false, false, PT_PREC_FP32, 0};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 3e-4f);
	pt_model *m;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor x, y;
	pt_step_result r = {0};
	double t0 = 0.0, tps, first = 0.0;
	pt_kernel_timer *kt = calloc(1, sizeof(*kt));

	double c0 = pt_now();
	pt_set_precision(prec);
	if (kt == NULL || pt_model_create(&m, layers, nl, 0, nl, &cfg) != PT_OK)
		die("model on cuda:0");
	if (pt_optimizer_create(&o, &oc, pt_model_params(m), pt_model_grads(m)) != PT_OK ||
	    pt_trainer_create(&t, m, o, PT_LOSS_CROSS_ENTROPY, -1) != PT_OK)
		die("optimizer");
	printf("# gpu w2 %s: model created in %.1f s\n", tag, pt_now() - c0);
	pt_tensor_init(&x, PT_I64, 2, (int64_t[]){BATCH, CTX});
	pt_tensor_init(&y, PT_I64, 2, (int64_t[]){BATCH, CTX});
	for (int64_t i = 0; i < BATCH * CTX; i++) {
		((int64_t *)pt_tensor_data(&x))[i] = (i * 31) % VOCAB;
		((int64_t *)pt_tensor_data(&y))[i] = (i * 17) % VOCAB;
	}
	for (int s = 0; s < warmup + steps; s++) {
		if (s == warmup) {
			if (pt_backend_sync(GPU) != PT_OK)
				die("sync");
			t0 = pt_now();
		}
		if (pt_trainer_step(t, &x, &y, 1, (uint64_t)s, &r) != PT_OK) {
			printf("# gpu w2 %s failed at step %d: %s\n", tag, s + 1, pt_last_error());
			pt_set_precision(PT_PREC_FP32);
			return 0.0;
		}
		if (s == 0)
			first = r.loss;
	}
	if (pt_backend_sync(GPU) != PT_OK)
		die("sync");
	tps = (double)BATCH * CTX * steps / (pt_now() - t0);
	printf("# gpu w2 %s: loss %.4f at step 1, %.4f at step %d; %.1f ms a step\n", tag, first,
	       r.loss, warmup + steps, 1e3 * (double)BATCH * CTX / tps);

	kt->sync_device = true;
	pt_dispatch_time_kernels(kt);
	t0 = pt_now();
	if (pt_trainer_step(t, &x, &y, 1, (uint64_t)(warmup + steps), &r) != PT_OK)
		die("gpu w2 profiled step");
	pt_dispatch_time_kernels(NULL);
	print_profile(kt, pt_now() - t0);
	free(kt);

	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(m);
	(void)pt_backend_trim(GPU);
	pt_set_precision(PT_PREC_FP32);
	return tps;
}

/* Runs the PyTorch reference; returns its FP32 tokens/s (0 when it failed)
 * and its bf16 autocast tokens/s in *bf16, echoing its lines as `#` lines. */
static double run_torch(const char *script, double *bf16)
{
	char cmd[4200], line[512];
	double fp32 = 0.0, v;
	*bf16 = 0.0;
	FILE *p;
	snprintf(cmd, sizeof(cmd), "python3 '%s' 2>&1", script);
	if ((p = popen(cmd, "r")) == NULL)
		return 0.0;
	while (fgets(line, sizeof(line), p) != NULL) {
		printf("# %s", line);
		if (sscanf(line, "torch gpu_w2_tokens_per_s_fp32 %lf", &v) == 1)
			fp32 = v;
		if (sscanf(line, "torch gpu_w2_tokens_per_s_bf16 %lf", &v) == 1)
			*bf16 = v;
	}
	if (pclose(p) != 0)
		printf("# the PyTorch reference failed\n");
	return fp32;
}
#endif

int main(int argc, char **argv)
{
	const char *script = PT_SOURCE_ROOT "/bench/torch_gpu_ref.py";
	int n = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--torch") == 0 && i + 1 < argc)
			script = argv[++i];
		else {
			fprintf(stderr, "usage: gpu_bench [--torch bench/torch_gpu_ref.py]\n");
			return 2;
		}
	}
	if (pt_backend_device_count(PT_DEV_CUDA, &n) != PT_OK || n < 1) {
		printf("skip: gpu_bench: %s\n",
		       n < 1 && pt_last_error()[0] ? pt_last_error() : "none found");
		return 0;
	}
#ifdef PT_HAVE_CUDA
	{
		struct cudaDeviceProp prop;
		if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
			printf("# gpu_bench on %s, %d SMs, %.0f GiB\n", prop.name,
			       prop.multiProcessorCount, (double)prop.totalGlobalMem / (1 << 30));
	}
	bench_matmul();
	double ours = bench_w2(PT_PREC_FP32, "fp32");
	if (ours > 0.0)
		printf("bench gpu_w2_tokens_per_s %.0f\n", ours);
	fflush(stdout);
	double tf32 = bench_w2(PT_PREC_TF32, "tf32");
	if (tf32 > 0.0)
		printf("bench gpu_w2_tf32_tokens_per_s %.0f\n", tf32);
	fflush(stdout);
	double bf16 = bench_w2(PT_PREC_BF16, "bf16");
	if (bf16 > 0.0)
		printf("bench gpu_w2_bf16_tokens_per_s %.0f\n", bf16);
	if (bf16 > 0.0 && ours > 0.0)
		printf("bench gpu_w2_bf16_vs_fp32 %.3f\n", bf16 / ours);
	fflush(stdout);
	double torch_bf16;
	double torch = run_torch(script, &torch_bf16);
	if (torch > 0.0 && ours > 0.0)
		printf("bench gpu_w2_vs_torch %.3f\n", ours / torch);
	if (torch_bf16 > 0.0 && bf16 > 0.0)
		printf("bench gpu_w2_bf16_vs_torch_bf16 %.3f\n", bf16 / torch_bf16);
#else
	(void)script; /* a build without CUDA never gets here: no device */
#endif
	return 0;
}
