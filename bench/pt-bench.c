/* pt-bench - training-core throughput next to the machine's sgemm ceiling.
 *
 * Prints `bench <name> <value>` lines:
 *   sgemm_gflops      dnnl_sgemm on 1024^3 with the same thread count
 *   w1_samples_per_s  MLP 64-256-256-256-10, batch 256, AdamW
 *   w2_tokens_per_s   byte-level GPT: d 256, 4 heads, 8 blocks, ctx 128, batch 16, AdamW
 *   w2_sgemm_ratio    W2's achieved GFLOP/s over sgemm_gflops
 *   w2_bf16_tokens_per_s, w2_bf16_vs_fp32  W2 with bf16 matrix products
 *   sha256_gbps       SHA-256 of 256 MiB as checkpoints are hashed (OpenSSL's
 *                     compression); sha256_pair_gbps, two messages hashed
 *                     together (pt_sha256_update2, SHA extensions' pairs);
 *                     sha256_portable_gbps, the portable one
 * and informational w1_gflops / w2_gflops. Threads: PIPETRAIN_THREADS or all cores.
 * PT_BENCH_PROFILE set: W2's per-op profile of one more step, as `#` lines.
 */
#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "profile.h"
#include "runtime.h"
#include "sha256.h"
#include "train.h"

static void die(const char *what)
{
	fprintf(stderr, "pt-bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

static double bench_sgemm(void)
{
	const int n = 1024, reps = 10;
	float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n);
	float *c = malloc(sizeof(float) * n * n);
	double best = 0.0;
	for (int i = 0; i < n * n; i++) {
		a[i] = (float)(i % 7) * 0.1f;
		b[i] = (float)(i % 5) * 0.1f;
	}
	for (int trial = 0; trial < 4; trial++) {
		double t0 = pt_now();
		for (int r = 0; r < reps; r++)
			dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
		double g = 2.0 * n * n * (double)n * reps / (pt_now() - t0) / 1e9;
		best = g > best ? g : best;
	}
	free(a);
	free(b);
	free(c);
	return best;
}

/* GB/s of pt_sha256 over 256 MiB, best of 3, with the installed block function. */
/* bench_sha256 hashes 256 MiB: one message, or (pair) two messages of
 * 128 MiB together with pt_sha256_update2, as a checkpoint hashes its two
 * files. GB/s of message bytes, best of 3. */
static double bench_sha256(bool pair)
{
	size_t n = (size_t)256 << 20;
	uint8_t *p = malloc(n), d[PT_SHA256_BYTES];
	double best = 0.0;
	if (p == NULL)
		die("sha256 buffer");
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131 + (i >> 12));
	for (int trial = 0; trial < 3; trial++) {
		pt_sha256_ctx a, b;
		double t0 = pt_now();
		if (pair) {
			pt_sha256_init(&a), pt_sha256_init(&b);
			pt_sha256_update2(&a, p, &b, p + n / 2, n / 2);
			pt_sha256_final(&a, d), pt_sha256_final(&b, d);
		} else {
			pt_sha256(p, n, d);
		}
		double g = (double)n / (pt_now() - t0) / 1e9;
		best = g > best ? g : best;
	}
	free(p);
	return best;
}

typedef struct workload {
	const char *name;
	const pt_layer_spec *layers;
	int n_layers;
	pt_model_config cfg;
	int warmup, steps;
	double tokens_per_sample;
	bool profile; /* after the timed steps, print one more step's per-op profile */
} workload;

/* Trains `steps` steps after `warmup` and returns samples/s; *gflops gets the
 * achieved rate from the model's FLOP estimate. */
static double run(const workload *w, double *gflops)
{
	pt_model *m;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor x, y;
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-3f);
	int64_t B = w->cfg.batch, T = w->cfg.input.seq;
	double t0 = 0.0, sps;
	pt_model_config mc = w->cfg;

	mc.precision = pt_get_precision(); /* a bf16 model keeps bf16 product inputs */
	if (pt_model_create(&m, w->layers, w->n_layers, 0, w->n_layers, &mc) != PT_OK)
		die("model");
	if (pt_optimizer_create(&o, &oc, pt_model_params(m), pt_model_grads(m)) != PT_OK ||
	    pt_trainer_create(&t, m, o, PT_LOSS_CROSS_ENTROPY, -1) != PT_OK)
		die("optimizer");
	if (T) {
		pt_tensor_init(&x, PT_I64, 2, (int64_t[]){B, T});
		pt_tensor_init(&y, PT_I64, 2, (int64_t[]){B, T});
		for (int64_t i = 0; i < B * T; i++) {
			((int64_t *)pt_tensor_data(&x))[i] = (i * 31) % 256;
			((int64_t *)pt_tensor_data(&y))[i] = (i * 17) % 256;
		}
	} else {
		int64_t F = w->cfg.input.features;
		pt_rng r;
		pt_tensor_init(&x, PT_F32, 2, (int64_t[]){B, F});
		pt_tensor_init(&y, PT_I64, 1, (int64_t[]){B});
		pt_rng_init(&r, 1, 0);
		pt_rng_normal(&r, pt_tensor_f32(&x), B * F, 0.0f, 1.0f);
		for (int64_t i = 0; i < B; i++)
			((int64_t *)pt_tensor_data(&y))[i] = i % 10;
	}
	for (int s = 0; s < w->warmup + w->steps; s++) {
		pt_step_result r;
		if (s == w->warmup)
			t0 = pt_now();
		if (pt_trainer_step(t, &x, &y, 1, (uint64_t)s, &r) != PT_OK)
			die(w->name);
	}
	sps = (double)B * w->steps / (pt_now() - t0);
	*gflops = sps * pt_model_flops_per_sample(m) / 1e9;
	if (w->profile) {
		pt_kernel_timer *kt = calloc(1, sizeof(*kt));
		pt_step_result r;
		pt_dispatch_time_kernels(kt);
		t0 = pt_now();
		if (pt_trainer_step(t, &x, &y, 1, (uint64_t)(w->warmup + w->steps), &r) != PT_OK)
			die(w->name);
		pt_dispatch_time_kernels(NULL);
		printf("# %s (%s):\n", w->name,
		       pt_get_precision() == PT_PREC_BF16 ? "bf16" : "fp32");
		print_profile(kt, pt_now() - t0);
		free(kt);
	}
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(m);
	return sps;
}

int main(int argc, char **argv)
{
	const char *th = getenv("PIPETRAIN_THREADS");
	int threads = th ? atoi(th) : pt_num_cores();
	double sgemm, g1, g2, s1, s2;

	pt_runtime_ensure_passive_wait(argv);
	pt_set_num_threads(threads);
	printf("# pt-bench: %d threads, OMP_WAIT_POLICY=%s\n", threads,
	       getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "(unset)");

	pt_layer_spec w1[] = {pt_linear(64, 256),  pt_activation(PT_LAYER_RELU),
	                      pt_linear(256, 256), pt_activation(PT_LAYER_RELU),
	                      pt_linear(256, 256), pt_activation(PT_LAYER_RELU),
	                      pt_linear(256, 10)};
	pt_layer_spec w2[12];
	int n2 = 0;
	w2[n2++] = pt_embedding(256, 256, 128);
	for (int i = 0; i < 8; i++)
		w2[n2++] = pt_block(256, 4);
	w2[n2++] = pt_layernorm(256);
	w2[n2++] = pt_linear(256, 256);

	workload wl1 = {
	    "w1", w1,
	    7,    {256, {PT_F32, 0, 64}, 1, 1, {PT_DEV_CPU, 0}, false, false, PT_PREC_FP32, 0},
	    30,   300,
	    0,    false};
	workload wl2 = {
	    "w2", w2,
	    n2,   {16, {PT_I64, 128, 0}, 1, 1, {PT_DEV_CPU, 0}, false, false, PT_PREC_FP32, 0},
	    2,    8,
	    128,  getenv("PT_BENCH_PROFILE") != NULL};

	sgemm = bench_sgemm();
	printf("bench sgemm_gflops %.1f\n", sgemm);
	s1 = run(&wl1, &g1);
	printf("bench w1_samples_per_s %.0f\n", s1);
	printf("bench w1_gflops %.1f\n", g1);
	s2 = run(&wl2, &g2);
	printf("bench w2_tokens_per_s %.0f\n", s2 * 128);
	printf("bench w2_gflops %.1f\n", g2);
	printf("bench w2_sgemm_ratio %.3f\n", g2 / sgemm);
	/* The same in bf16 (precision "bf16": bf16 operands, f32 accumulation). */
	{
		double g2b, s2b;
		pt_set_precision(PT_PREC_BF16);
		s2b = run(&wl2, &g2b);
		pt_set_precision(PT_PREC_FP32);
		printf("bench w2_bf16_tokens_per_s %.0f\n", s2b * 128);
		printf("bench w2_bf16_vs_fp32 %.3f\n", s2b / s2);
		printf("# bf16: %s\n", pt_backend_bf16());
	}
	pt_sha256_use_openssl(); /* as the server has it (this program links no safetensors code) */
	printf("bench sha256_gbps %.2f\n", bench_sha256(false));
	printf("bench sha256_pair_gbps %.2f\n", bench_sha256(true));
	printf("# sha256 pairs: %s\n", pt_sha256_pair_backend());
	pt_sha256_set_blocks(NULL, NULL);
	printf("bench sha256_portable_gbps %.2f\n", bench_sha256(false));
	pt_sha256_use_openssl();
	return 0;
}
