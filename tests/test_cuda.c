/* test_cuda.c - the CUDA backend checked against the CPU reference.
 *
 * Every op of PT_OPS runs on random inputs twice, once on CPU tensors and once
 * on copies in CUDA memory, and every output (including outputs that
 * accumulate, which start from the same random values) must agree within the
 * case's stated tolerance: |gpu - cpu| <= tol * (1 + |cpu|). Tolerances:
 * exact for fill/copy/dropout masks and integer data, 1e-6 for plain
 * element-wise arithmetic, 1e-5 for ops using exp/tanh and row reductions
 * (the GPU reduces in a different order), 1e-4 for cuBLAS-based ops.
 * Two long reductions get more, from what an H200 gave (2026-11-26): float32
 * sums of R terms in two orders differ by about sqrt(R) * 2^-24 times the
 * terms' size, so layer norm dw/db over 8192 rows (worst seen 2.0e-4) have
 * 6e-4, as has Linear db over 8192 rows (1.4e-4 seen), and a Linear
 * backward whose dx sums over a 50304-wide vocabulary
 * (worst seen 5.3e-4) has 1.5e-3: about three times the worst seen.
 *
 * Suite cuda_ops also checks: column reductions (layer norm dw/db, Linear db,
 * embedding gradients) at C = 768 over 8192 rows against the CPU and bitwise
 * equal across two GPU runs; that a stale CUDA error (invalid device,
 * NotReady from a stream query) does not fail the next launch; that a pool
 * trim gives freed memory back to the driver; device readiness.
 *
 * Without a CUDA device (or in a build without CUDA) the program prints
 * "skip: no CUDA device (...)" and exits 77, which meson reports as SKIP;
 * before that it checks that asking for cuda:0 (storage, readiness as
 * pipeserver's /readyz asks it) fails with a clear message,
 * also from the real `pipeserver --device cuda:0` (exit code and stderr;
 * with a GPU: that it starts). A failed check fails the program.
 * The NCCL communicator contract runs when NCCL is built and >= 2 devices
 * are present; otherwise that suite says why it skipped.
 *
 * Models and stages on the device (suite cuda_pipeline): a model on cuda:0
 * starts from the CPU model's weights bitwise (they are drawn on the host and
 * copied); the 2-stage digits pipeline (AdamW, clipping) with both stages on
 * cuda:0 gives the CPU pipeline's losses within 1e-4 relative at each of 20
 * steps (kernels reduce in another order, so not bitwise), over local
 * communicators (CPU tensors only: activations and gradients cross as host
 * copies) and, when NCCL is built, over NCCL communicators placed as the
 * job runner places them (device tensors); its training state comes back as host data
 * that loads into a fresh GPU pipeline and into a CPU one. Without a device
 * the program checks that a model on cuda:0 is refused with a clear error.
 */
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "job/job.h"
#include "nccl_comm.h"
#include "ops.h"
#include "pipe_fixture.h"
#include "pt_test.h"
#include "rng.h"

#define GPU ((pt_device){PT_DEV_CUDA, 0})

static int n_devices; /* CUDA devices here (set by main before the suites) */

typedef struct tspec {
	int ndim; /* -1: absent (NULL operand) */
	pt_dtype dt;
	int64_t shape[4];
	int init;    /* INIT_* */
	int64_t lim; /* tokens: values in [0, lim) */
} tspec;

enum { INIT_NORMAL, INIT_POSITIVE, INIT_TOKENS, INIT_ZERO };

typedef struct op_case {
	const char *name;
	pt_op op;
	tspec in[PT_OP_MAX_IN], out[PT_OP_MAX_OUT];
	pt_op_params p;
	double tol;
} op_case;

static uint64_t case_seed = 1;

static void fill_host(pt_tensor *t, const tspec *s)
{
	int64_t n = pt_tensor_numel(t);
	pt_rng r;
	pt_rng_init(&r, 1234, case_seed++);
	if (s->dt == PT_I64) {
		int64_t *p = pt_tensor_data(t);
		for (int64_t i = 0; i < n; i++)
			p[i] = s->init == INIT_TOKENS ? (int64_t)(pt_rng_u32(&r) % (uint32_t)s->lim)
			                              : 0;
		return;
	}
	if (s->dt == PT_F64) {
		double *p = pt_tensor_data(t);
		for (int64_t i = 0; i < n; i++)
			p[i] = 0.5;
		return;
	}
	float *p = pt_tensor_f32(t);
	if (s->init == INIT_ZERO)
		memset(p, 0, sizeof(float) * (size_t)n);
	else if (s->init == INIT_POSITIVE)
		pt_rng_uniform(&r, p, n, 0.5f, 1.5f);
	else
		pt_rng_normal(&r, p, n, 0.0f, 1.0f);
}

/* A CPU tensor per spec and its copy on the GPU. */
static void make_pair(const tspec *s, pt_tensor *h, pt_tensor *d)
{
	pt_storage *st;
	PT_CHECK_OK(pt_tensor_init(h, s->dt, s->ndim, s->shape));
	fill_host(h, s);
	PT_CHECK_OK(pt_storage_create(&st, pt_tensor_nbytes(h), GPU));
	PT_CHECK_OK(pt_tensor_init_on(d, st, 0, s->dt, s->ndim, s->shape));
	pt_storage_release(st);
	PT_CHECK_OK(pt_tensor_write(d, pt_tensor_data(h), pt_tensor_nbytes(h)));
}

static int compare(const char *name, int which, const pt_tensor *h, const pt_tensor *d, double tol)
{
	size_t nb = pt_tensor_nbytes(h);
	int64_t n = pt_tensor_numel(h), bad = 0;
	void *g = malloc(nb ? nb : 1);
	double worst = 0.0;
	CU_ASSERT_PTR_NOT_NULL_FATAL(g);
	PT_CHECK_OK(pt_tensor_read(d, g, nb));
	for (int64_t i = 0; i < n; i++) {
		double a, b;
		switch (h->dtype) {
		case PT_F32:
			a = ((float *)pt_tensor_data(h))[i], b = ((float *)g)[i];
			break;
		case PT_F64:
			a = ((double *)pt_tensor_data(h))[i], b = ((double *)g)[i];
			break;
		default:
			a = (double)((int64_t *)pt_tensor_data(h))[i],
			b = (double)((int64_t *)g)[i];
			break;
		}
		double err = fabs(a - b) / (1.0 + fabs(a));
		if (!(err <= tol)) {
			if (bad++ < 3)
				fprintf(stderr, "%s: output %d [%ld]: cpu %.9g gpu %.9g\n", name,
				        which, (long)i, a, b);
		}
		if (err > worst)
			worst = err;
	}
	free(g);
	if (bad)
		fprintf(stderr, "%s: output %d: %ld of %ld beyond tolerance %g (worst %g)\n", name,
		        which, (long)bad, (long)n, tol, worst);
	return bad == 0;
}

/* run_case runs cs on the CPU and the GPU and compares; twice: also a second
 * GPU run from equal data, whose outputs must match the first bitwise;
 * true_stats (the attention backward): its log-sum-exp input comes from
 * the CPU's fp32 forward over the same qkv rather than random draws, so the
 * probabilities it recomputes are normalised, as in training. */
static void run_case_full(const op_case *cs, bool twice, bool true_stats)
{
	pt_tensor hi[PT_OP_MAX_IN], di[PT_OP_MAX_IN], ho[PT_OP_MAX_OUT], dout[PT_OP_MAX_OUT];
	pt_op_call hc = {.op = cs->op, .p = cs->p}, dc = {.op = cs->op, .p = cs->p};
	memset(hi, 0, sizeof(hi));
	memset(di, 0, sizeof(di));
	memset(ho, 0, sizeof(ho));
	memset(dout, 0, sizeof(dout));
	for (int i = 0; i < PT_OP_MAX_IN; i++)
		if (cs->in[i].ndim > 0) {
			make_pair(&cs->in[i], &hi[i], &di[i]);
			hc.in[i] = &hi[i];
			dc.in[i] = &di[i];
		}
	if (true_stats && cs->op == PT_OP_ATTENTION_BWD) {
		pt_tensor o;
		pt_precision prec = pt_get_precision();
		PT_CHECK_OK(pt_tensor_init(&o, PT_F32, 3, hi[0].shape));
		pt_set_precision(PT_PREC_FP32);
		PT_CHECK_OK(pt_attention_forward(&o, &hi[2], &hi[1], cs->p.attention.n_head));
		pt_set_precision(prec);
		PT_CHECK_OK(
		    pt_tensor_write(&di[2], pt_tensor_data(&hi[2]), pt_tensor_nbytes(&hi[2])));
		pt_tensor_fini(&o);
	}
	for (int i = 0; i < PT_OP_MAX_OUT; i++)
		if (cs->out[i].ndim > 0) {
			make_pair(&cs->out[i], &ho[i], &dout[i]);
			hc.out[i] = &ho[i];
			dc.out[i] = &dout[i];
		}
	pt_tensor again[PT_OP_MAX_OUT];
	memset(again, 0, sizeof(again));
	if (twice) {
		pt_op_call ac = dc;
		for (int i = 0; i < PT_OP_MAX_OUT; i++)
			if (cs->out[i].ndim > 0) {
				PT_CHECK_OK(pt_tensor_init_dev(&again[i], GPU, cs->out[i].dt,
				                               cs->out[i].ndim, cs->out[i].shape));
				PT_CHECK_OK(pt_copy(&again[i], &dout[i]));
				ac.out[i] = &again[i];
			}
		PT_CHECK_OK(pt_dispatch(&ac));
	}
	PT_CHECK_OK(pt_dispatch(&hc));
	PT_CHECK_OK(pt_dispatch(&dc));
	for (int i = 0; i < PT_OP_MAX_OUT; i++)
		if (cs->out[i].ndim > 0)
			CU_ASSERT_TRUE(compare(cs->name, i, &ho[i], &dout[i], cs->tol));
	for (int i = 0; twice && i < PT_OP_MAX_OUT; i++)
		if (cs->out[i].ndim > 0) {
			size_t nb = pt_tensor_nbytes(&dout[i]);
			char *a = malloc(nb), *b = malloc(nb);
			CU_ASSERT_FATAL(a != NULL && b != NULL);
			PT_CHECK_OK(pt_tensor_read(&dout[i], a, nb));
			PT_CHECK_OK(pt_tensor_read(&again[i], b, nb));
			if (memcmp(a, b, nb) != 0)
				fprintf(stderr, "%s: output %d differs between two GPU runs\n",
				        cs->name, i);
			CU_ASSERT_EQUAL(memcmp(a, b, nb), 0);
			free(a);
			free(b);
			pt_tensor_fini(&again[i]);
		}
	for (int i = 0; i < PT_OP_MAX_IN; i++) {
		pt_tensor_fini(&hi[i]);
		pt_tensor_fini(&di[i]);
	}
	for (int i = 0; i < PT_OP_MAX_OUT; i++) {
		pt_tensor_fini(&ho[i]);
		pt_tensor_fini(&dout[i]);
	}
}

static void run_case_twice(const op_case *cs, bool twice)
{
	run_case_full(cs, twice, false);
}

static void run_case(const op_case *cs)
{
	run_case_full(cs, false, false);
}

#define F32(...)                                                                                   \
	{                                                                                          \
		.ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), .dt = PT_F32, .shape = {      \
			__VA_ARGS__                                                                \
		}                                                                                  \
	}
#define POS(...)                                                                                   \
	{                                                                                          \
		.ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), .dt = PT_F32,                 \
		.shape = {__VA_ARGS__}, .init = INIT_POSITIVE                                      \
	}
#define TOK(l, ...)                                                                                \
	{                                                                                          \
		.ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), .dt = PT_I64,                 \
		.shape = {__VA_ARGS__}, .init = INIT_TOKENS, .lim = (l)                            \
	}
#define NONE                                                                                       \
	{                                                                                          \
		.ndim = -1                                                                         \
	}

/* Sizes chosen off powers of two so partial blocks and tails are exercised. */
enum { R = 37, C = 130, V = 51, B = 3, T = 17, NH = 4, CA = 48 };

static const op_case cases[] = {
    {"fill_f32", PT_OP_FILL, {NONE}, {F32(R, C)}, {.fill = {1.25}}, 0},
    {"fill_f64",
     PT_OP_FILL,
     {NONE},
     {{.ndim = 1, .dt = PT_F64, .shape = {9}}},
     {.fill = {-3.5}},
     0},
    {"fill_i64", PT_OP_FILL, {NONE}, {TOK(5, 3, 7)}, {.fill = {42}}, 0},
    {"copy", PT_OP_COPY, {F32(R, C)}, {F32(R, C)}, {{0}}, 0},
    {"scale", PT_OP_SCALE, {F32(R, C)}, {F32(R, C)}, {.scale = {-0.75f}}, 1e-6},
    {"add", PT_OP_ADD, {F32(R, C), F32(R, C)}, {F32(R, C)}, {.add = {0.5f, -2.0f}}, 1e-6},
    {"add_plain", PT_OP_ADD, {F32(R, C), F32(R, C)}, {F32(R, C)}, {.add = {1.0f, 1.0f}}, 1e-6},
    {"matmul_nn",
     PT_OP_MATMUL,
     {F32(R, 29), F32(29, 41)},
     {F32(R, 41)},
     {.matmul = {false, false, 1.0f, 0.5f}},
     1e-4},
    {"matmul_tn",
     PT_OP_MATMUL,
     {F32(29, R), F32(29, 41)},
     {F32(R, 41)},
     {.matmul = {true, false, 0.7f, 0.0f}},
     1e-4},
    {"matmul_nt",
     PT_OP_MATMUL,
     {F32(R, 29), F32(41, 29)},
     {F32(R, 41)},
     {.matmul = {false, true, 1.0f, 1.0f}},
     1e-4},
    {"matmul_tt",
     PT_OP_MATMUL,
     {F32(29, R), F32(41, 29)},
     {F32(R, 41)},
     {.matmul = {true, true, -1.0f, 0.0f}},
     1e-4},
    {"linear_fwd_bias",
     PT_OP_LINEAR_FWD,
     {F32(B, T, 33), F32(21, 33), F32(21)},
     {F32(B, T, 21)},
     {.linear = {.has_bias = true}},
     1e-4},
    {"linear_fwd",
     PT_OP_LINEAR_FWD,
     {F32(B, T, 33), F32(21, 33), NONE},
     {F32(B, T, 21)},
     {{0}},
     1e-4},
    {"linear_bwd",
     PT_OP_LINEAR_BWD,
     {F32(B, T, 21), F32(B, T, 33), F32(21, 33)},
     {F32(B, T, 33), F32(21, 33), F32(21)},
     {.linear = {true, false, true}},
     1e-4},
    {"linear_bwd_acc",
     PT_OP_LINEAR_BWD,
     {F32(B, T, 21), F32(B, T, 33), F32(21, 33)},
     {F32(B, T, 33), F32(21, 33), NONE},
     {.linear = {false, true, true}},
     1e-4},
    {"relu_fwd", PT_OP_ACT_FWD, {F32(R, C)}, {F32(R, C)}, {.act = {PT_ACT_RELU}}, 1e-6},
    {"gelu_fwd", PT_OP_ACT_FWD, {F32(R, C)}, {F32(R, C)}, {.act = {PT_ACT_GELU}}, 1e-5},
    {"tanh_fwd", PT_OP_ACT_FWD, {F32(R, C)}, {F32(R, C)}, {.act = {PT_ACT_TANH}}, 1e-5},
    {"sigmoid_fwd", PT_OP_ACT_FWD, {F32(R, C)}, {F32(R, C)}, {.act = {PT_ACT_SIGMOID}}, 1e-5},
    {"relu_bwd",
     PT_OP_ACT_BWD,
     {F32(R, C), F32(R, C), F32(R, C)},
     {F32(R, C)},
     {.act = {PT_ACT_RELU, true}},
     1e-6},
    {"gelu_bwd",
     PT_OP_ACT_BWD,
     {F32(R, C), F32(R, C), F32(R, C)},
     {F32(R, C)},
     {.act = {PT_ACT_GELU, false}},
     1e-5},
    {"tanh_bwd",
     PT_OP_ACT_BWD,
     {F32(R, C), F32(R, C), F32(R, C)},
     {F32(R, C)},
     {.act = {PT_ACT_TANH, false}},
     1e-6},
    {"sigmoid_bwd",
     PT_OP_ACT_BWD,
     {F32(R, C), F32(R, C), F32(R, C)},
     {F32(R, C)},
     {.act = {PT_ACT_SIGMOID, true}},
     1e-6},
    /* Masks must match bitwise; kept values are x * (1/(1-p)) on both sides. */
    {"dropout_fwd",
     PT_OP_DROPOUT_FWD,
     {F32(R, C)},
     {F32(R, C)},
     {.dropout = {0.3f, 99, 7, false}},
     0},
    {"dropout_bwd",
     PT_OP_DROPOUT_BWD,
     {F32(R, C)},
     {F32(R, C)},
     {.dropout = {0.3f, 99, 7, true}},
     1e-6},
    {"dropout_p0",
     PT_OP_DROPOUT_FWD,
     {F32(R, C)},
     {F32(R, C)},
     {.dropout = {0.0f, 1, 2, false}},
     0},
    {"softmax_fwd", PT_OP_SOFTMAX_FWD, {F32(R, C)}, {F32(R, C)}, {{0}}, 1e-5},
    {"softmax_bwd",
     PT_OP_SOFTMAX_BWD,
     {F32(R, C), F32(R, C)},
     {F32(R, C)},
     {.act = {.accum_dx = true}},
     1e-5},
    {"layernorm_fwd",
     PT_OP_LAYERNORM_FWD,
     {F32(R, C), F32(C), F32(C)},
     {F32(R, C), F32(R), F32(R)},
     {.layernorm = {1e-5f, false}},
     1e-4},
    {"layernorm_bwd",
     PT_OP_LAYERNORM_BWD,
     {F32(R, C), F32(R, C), F32(C), F32(R), POS(R)},
     {F32(R, C), F32(C), F32(C)},
     {.layernorm = {1e-5f, true}},
     1e-4},
    {"embedding_fwd",
     PT_OP_EMBEDDING_FWD,
     {TOK(V, B, T), F32(V, C), F32(T + 3, C)},
     {F32(B, T, C)},
     {{0}},
     1e-6},
    {"embedding_fwd_nopos",
     PT_OP_EMBEDDING_FWD,
     {TOK(V, B, T), F32(V, C), NONE},
     {F32(B, T, C)},
     {{0}},
     0},
    {"embedding_bwd",
     PT_OP_EMBEDDING_BWD,
     {F32(B, T, C), TOK(V, B, T)},
     {F32(V, C), F32(T, C)},
     {{0}},
     1e-6},
    {"attention_fwd",
     PT_OP_ATTENTION_FWD,
     {F32(B, T, 3 * CA)},
     {F32(B, T, CA), F32(B, NH, T)},
     {.attention = {NH, false}},
     1e-4},
    {"attention_bwd",
     PT_OP_ATTENTION_BWD,
     {F32(B, T, CA), F32(B, T, 3 * CA), POS(B, NH, T)},
     {F32(B, T, 3 * CA)},
     {.attention = {NH, true}},
     1e-4},
    {"xent_fwd",
     PT_OP_XENT_FWD,
     {F32(R, V), TOK(V, R)},
     {F32(R), F32(R, V)},
     {.xent = {.ignore_index = 3}},
     1e-5},
    {"xent_bwd", PT_OP_XENT_BWD, {POS(R, V), TOK(V, R)}, {F32(R, V)}, {.xent = {3, 0.25f}}, 1e-6},
    {"mse_fwd", PT_OP_MSE_FWD, {F32(R, C), F32(R, C)}, {F32(1)}, {.mse = {0.01f}}, 1e-6},
    {"mse_bwd", PT_OP_MSE_BWD, {F32(R, C), F32(R, C)}, {F32(R, C)}, {.mse = {0.01f}}, 1e-6},
    {"squared_norm",
     PT_OP_SQNORM,
     {F32(1000, 77)},
     {{.ndim = 1, .dt = PT_F64, .shape = {1}}},
     {{0}},
     1e-12},
    {"adamw",
     PT_OP_ADAMW,
     {F32(R, C)},
     {F32(R, C), F32(R, C), POS(R, C)},
     {.adamw = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.5f, 3}},
     1e-5},
    {"sgd_nesterov",
     PT_OP_SGD,
     {F32(R, C)},
     {F32(R, C), F32(R, C)},
     {.sgd = {0.1f, 0.9f, 0.0f, 0.01f, 1.0f, true, false}},
     1e-6},
    {"sgd_plain",
     PT_OP_SGD,
     {F32(R, C)},
     {F32(R, C), NONE},
     {.sgd = {0.1f, 0.0f, 0.0f, 0.0f, 2.0f, false, false}},
     1e-6},
};

/* Rows wider than a block (256 threads: the strided loops and the block
 * reduction with every thread busy), more rows than a 16-bit grid, causal
 * rows longer than a block, and a reduction that fills the 1024 partial
 * blocks and loops. */
enum { WIDE = 1000, LONG_T = 300, MANY = 70000 };
static const op_case big_cases[] = {
    {"softmax_fwd_wide", PT_OP_SOFTMAX_FWD, {F32(5, WIDE)}, {F32(5, WIDE)}, {{0}}, 1e-5},
    /* y and dy are normal draws, not probabilities: the row's sum of y dy
     * (1000 terms, up to ~100) in another order moves dx by y times its
     * rounding (1.1e-5 on the H200 run of 2026-11-27 against a CPU that
     * picked AVX-512 kernels). */
    {"softmax_bwd_wide",
     PT_OP_SOFTMAX_BWD,
     {F32(5, WIDE), F32(5, WIDE)},
     {F32(5, WIDE)},
     {{0}},
     5e-5},
    {"softmax_fwd_many_rows", PT_OP_SOFTMAX_FWD, {F32(MANY, 3)}, {F32(MANY, 3)}, {{0}}, 1e-5},
    {"layernorm_fwd_wide",
     PT_OP_LAYERNORM_FWD,
     {F32(5, WIDE), F32(WIDE), F32(WIDE)},
     {F32(5, WIDE), F32(5), F32(5)},
     {.layernorm = {1e-5f, false}},
     1e-4},
    {"layernorm_bwd_wide",
     PT_OP_LAYERNORM_BWD,
     {F32(5, WIDE), F32(5, WIDE), F32(WIDE), F32(5), POS(5)},
     {F32(5, WIDE), F32(WIDE), F32(WIDE)},
     {.layernorm = {1e-5f, false}},
     1e-4},
    {"xent_fwd_wide",
     PT_OP_XENT_FWD,
     {F32(7, WIDE), TOK(WIDE, 7)},
     {F32(7), F32(7, WIDE)},
     {.xent = {.ignore_index = -100}},
     1e-5},
    {"attention_fwd_long",
     PT_OP_ATTENTION_FWD,
     {F32(1, LONG_T, 3 * 32)},
     {F32(1, LONG_T, 32), F32(1, 2, LONG_T)},
     {.attention = {2, false}},
     1e-4},
    /* Random log-sum-exp statistics leave the probabilities unnormalised:
     * sums over 300 keys of large terms (1.05e-4 on the H200 run of
     * 2026-11-27). */
    {"attention_bwd_long",
     PT_OP_ATTENTION_BWD,
     {F32(1, LONG_T, 32), F32(1, LONG_T, 3 * 32), POS(1, 2, LONG_T)},
     {F32(1, LONG_T, 3 * 32)},
     {.attention = {2, false}},
     3e-4},
    {"squared_norm_3m",
     PT_OP_SQNORM,
     {F32(3000, 1000)},
     {{.ndim = 1, .dt = PT_F64, .shape = {1}}},
     {{0}},
     1e-10},
    {"scale_many_blocks", PT_OP_SCALE, {F32(MANY, 64)}, {F32(MANY, 64)}, {.scale = {3.0f}}, 1e-6},
};

/* Column reductions over many rows (layer norm dw/db, Linear db, embedding
 * dwte/dwpe) at GPT-2-small's width: two-pass over row chunks (or a stable
 * token sort), so every run gives the same bits. Layer norm and Linear db sum
 * in another order than the CPU (1e-4); the embedding gradient keeps the
 * CPU's order per element, so it is bitwise the CPU's (0), with a small
 * vocabulary too (runs of ~1,200 equal tokens). */
enum { CR = 8192, CC = 768, CB = 8, CT = 1024, CV = 50304 };
static const op_case column_cases[] = {
    {"layernorm_bwd_c768_rows8192",
     PT_OP_LAYERNORM_BWD,
     {F32(CR, CC), F32(CR, CC), F32(CC), F32(CR), POS(CR)},
     {F32(CR, CC), F32(CC), F32(CC)},
     {.layernorm = {1e-5f, false}},
     6e-4},
    {"layernorm_bwd_c768_rows37",
     PT_OP_LAYERNORM_BWD,
     {F32(37, CC), F32(37, CC), F32(CC), F32(37), POS(37)},
     {F32(37, CC), F32(CC), F32(CC)},
     {.layernorm = {1e-5f, true}},
     1e-4},
    {"linear_bwd_bias_c768_rows8192",
     PT_OP_LINEAR_BWD,
     {F32(CB, CT, CC), F32(CB, CT, 64), F32(CC, 64)},
     {F32(CB, CT, 64), F32(CC, 64), F32(CC)},
     {.linear = {true, false, true}},
     6e-4},
    {"linear_bwd_bias_vocab_rows2048",
     PT_OP_LINEAR_BWD,
     {F32(2, CT, CV), F32(2, CT, 16), F32(CV, 16)},
     {F32(2, CT, 16), F32(CV, 16), F32(CV)},
     {.linear = {true, false, true}},
     1.5e-3},
    {"embedding_bwd_gpt2_shape",
     PT_OP_EMBEDDING_BWD,
     {F32(CB, CT, CC), TOK(CV, CB, CT)},
     {F32(CV, CC), F32(CT, CC)},
     {{0}},
     0},
    {"embedding_bwd_long_runs",
     PT_OP_EMBEDDING_BWD,
     {F32(CB, CT, CC), TOK(7, CB, CT)},
     {F32(7, CC), F32(CT, CC)},
     {{0}},
     0},
};

static void test_cuda_column_reductions_deterministic(void)
{
	for (size_t i = 0; i < sizeof(column_cases) / sizeof(column_cases[0]); i++)
		run_case_twice(&column_cases[i], true);
}

/* The CUDA runtime's own entry points, looked up in the process (cudart is
 * linked in CUDA builds; these tests run only there). */
static void *cudart(const char *name)
{
	void *f = dlsym(RTLD_DEFAULT, name);
	if (f == NULL)
		fprintf(stderr, "%s not found in the process\n", name);
	return f;
}

/* A stale, non-sticky CUDA error in the thread's error slot (an invalid
 * device from an unrelated call; cudaErrorNotReady from querying a busy
 * stream) must not fail the next launch: launchers clear the slot first. */
static void test_cuda_stale_error_not_reported(void)
{
	int (*set_device)(int);
	int (*stream_query)(void *);
	int (*peek)(void);
	pt_tensor x, y, big;
	int64_t n = 1 << 20, nb = (int64_t)1 << 28; /* 1 GiB of floats */
	double v = 0;
	bool busy = false;

	*(void **)&set_device = cudart("cudaSetDevice");
	*(void **)&stream_query = cudart("cudaStreamQuery");
	*(void **)&peek = cudart("cudaPeekAtLastError");
	CU_ASSERT_FATAL(set_device && stream_query && peek);
	PT_CHECK_OK(pt_tensor_init_dev(&x, GPU, PT_F32, 1, &n));
	PT_CHECK_OK(pt_tensor_init_dev(&y, GPU, PT_F32, 1, &n));
	CU_ASSERT_NOT_EQUAL(set_device(1 << 20), 0); /* cudaErrorInvalidDevice */
	CU_ASSERT_NOT_EQUAL(peek(), 0);              /* it is in the slot */
	PT_CHECK_OK(pt_fill(&x, 2.0));
	PT_CHECK_OK(pt_scale(&y, &x, 3.0f));
	PT_CHECK_OK(pt_tensor_item(&y, n - 1, &v));
	CU_ASSERT_EQUAL(v, 6.0);

	if (pt_tensor_init_dev(&big, GPU, PT_F32, 1, &nb) == PT_OK) {
		PT_CHECK_OK(pt_fill(&big, 1.0));
		PT_CHECK_OK(pt_scale(&big, &big, 2.0f));
		busy = stream_query(pt_backend_stream(GPU)) != 0; /* cudaErrorNotReady */
		PT_CHECK_OK(pt_scale(&y, &x, 5.0f));
		PT_CHECK_OK(pt_tensor_item(&y, 0, &v));
		CU_ASSERT_EQUAL(v, 10.0);
		pt_tensor_fini(&big);
	}
	if (!busy)
		printf("(the stream was idle before the query: NotReady case not exercised) ");
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

/* Freed device memory stays cached in the pool (below its release
 * threshold) until a trim, which the job runner does when a job ends: then
 * the driver has it back. */
static void test_cuda_pool_trim_gives_memory_back(void)
{
	int (*mem_info)(size_t *, size_t *);
	size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
	const size_t gib = (size_t)1 << 30;
	pt_storage *st = NULL;

	*(void **)&mem_info = cudart("cudaMemGetInfo");
	CU_ASSERT_FATAL(mem_info != NULL);
	PT_CHECK_OK(pt_backend_trim(GPU));
	CU_ASSERT_EQUAL(mem_info(&free0, &total), 0);
	if (free0 < 3 * gib) {
		printf("(skipped: %zu MiB free on cuda:0) ", free0 >> 20);
		return;
	}
	PT_CHECK_OK(pt_storage_create(&st, gib, GPU));
	pt_storage_release(st);
	PT_CHECK_OK(pt_backend_sync(GPU));
	CU_ASSERT_EQUAL(mem_info(&free1, &total), 0);
	CU_ASSERT(free1 + gib / 2 < free0); /* cached, not given back */
	PT_CHECK_OK(pt_backend_trim_all());
	CU_ASSERT_EQUAL(mem_info(&free2, &total), 0);
	CU_ASSERT(free2 > free1 + gib / 2); /* given back */
	printf("(free MiB: %zu, after a freed 1 GiB %zu, after trim %zu) ", free0 >> 20,
	       free1 >> 20, free2 >> 20);
}

/* Readiness asks the runtime: cuda:0 is ready, a device past the count is
 * not, with the count in the message. */
static void test_cuda_device_ready(void)
{
	pt_device past = {PT_DEV_CUDA, n_devices};
	char want[64];
	PT_CHECK_OK(pt_backend_device_ready(GPU));
	PT_CHECK_OK(pt_backend_device_ready(PT_CPU));
	snprintf(want, sizeof(want), "cuda:%d: only %d CUDA device", n_devices, n_devices);
	PT_CHECK_ERR_MSG(pt_backend_device_ready(past), PT_ERR_RANGE, want);
}

static void test_cuda_large_shapes_match_cpu(void)
{
	for (size_t i = 0; i < sizeof(big_cases) / sizeof(big_cases[0]); i++)
		run_case(&big_cases[i]);
}

/* More elements than an int holds: fill and scale 2^31 + 300 floats (two
 * 8 GiB tensors) and check both ends and the middle; int indexing would
 * wrap and write below the buffer. Skipped (saying so) when the device has
 * no room. */
static void test_cuda_beyond_2g_elements(void)
{
	const int64_t n = ((int64_t)1 << 31) + 300;
	const int64_t at[] = {0, ((int64_t)1 << 31) - 1, (int64_t)1 << 31, n - 1};
	pt_storage *s1 = NULL, *s2 = NULL;
	pt_tensor x, y;
	if (pt_storage_create(&s1, (size_t)n * 4, GPU) != PT_OK ||
	    pt_storage_create(&s2, (size_t)n * 4, GPU) != PT_OK) {
		printf("(skipped: no room for 2 x 8 GiB on cuda:0: %s) ", pt_last_error());
		pt_storage_release(s1);
		return;
	}
	PT_CHECK_OK(pt_tensor_init_on(&x, s1, 0, PT_F32, 1, &n));
	PT_CHECK_OK(pt_tensor_init_on(&y, s2, 0, PT_F32, 1, &n));
	pt_storage_release(s1);
	pt_storage_release(s2);
	PT_CHECK_OK(pt_fill(&x, 1.5));
	PT_CHECK_OK(pt_scale(&y, &x, -2.0f));
	for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
		double vx = 0, vy = 0;
		PT_CHECK_OK(pt_tensor_item(&x, at[k], &vx));
		PT_CHECK_OK(pt_tensor_item(&y, at[k], &vy));
		CU_ASSERT(vx == 1.5 && vy == -3.0);
	}
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

static void test_cuda_every_op_matches_cpu(void)
{
	bool seen[PT_OP_COUNT] = {false};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		run_case(&cases[i]);
		seen[cases[i].op] = true;
	}
	for (int op = 0; op < PT_OP_COUNT; op++) {
		if (!seen[op])
			fprintf(stderr, "op %s has no CUDA test case\n", pt_op_name((pt_op)op));
		CU_ASSERT_TRUE(seen[op]);
	}
}

/* The matrix-product ops (matmul, linear, attention forward and backward) at
 * precision prec on the GPU against the CPU's emulation of it, within tol
 * (|a - b| / (1 + |a|)); the attention backward from true statistics
 * (run_case_full). */
static void products_match_cpu(pt_precision prec, double tol)
{
	int n = 0;
	pt_set_precision(prec);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		op_case cs = cases[i];
		if (cs.op != PT_OP_MATMUL && cs.op != PT_OP_LINEAR_FWD &&
		    cs.op != PT_OP_LINEAR_BWD && cs.op != PT_OP_ATTENTION_FWD &&
		    cs.op != PT_OP_ATTENTION_BWD)
			continue;
		cs.tol = tol;
		run_case_full(&cs, false, true);
		n++;
	}
	pt_set_precision(PT_PREC_FP32);
	CU_ASSERT(n >= 5);
}

/* precision tf32: cuBLAS's TF32 compute type against operands rounded to
 * TF32 (nearest even); the GPU converts its own way, so within 1e-2 rather
 * than bitwise. (TF32 itself moves these cases by at most 2.6e-3 on the CPU
 * with true statistics; with random ones the attention backward's
 * unnormalised probabilities, gradients up to 1e4, let it move by 0.08.) */
static void test_cuda_tf32_matches_cpu_emulation(void)
{
	products_match_cpu(PT_PREC_TF32, 1e-2);
}

/* precision bf16: both sides round the operands to bf16 the same way
 * (nearest even) and their products are exact in f32, so only the order of
 * the f32 sums differs - except where the GPU's and the CPU's softmax
 * (attention) differ in the last f32 bit and round to neighbouring bf16
 * values (2^-8 apart): 1e-2. */
static void test_cuda_bf16_matches_cpu_emulation(void)
{
	products_match_cpu(PT_PREC_BF16, 1e-2);
}

/* bf16 products are really bf16: a product whose operands need more than
 * bf16's 8 significant bits comes out of the GPU as the CPU's rounded
 * operands give it (1 + 2^-10 rounds to 1), not as fp32 would. */
static void test_cuda_bf16_rounds_operands(void)
{
	tspec s = F32(1, 1);
	pt_tensor ha, da, hb, db, ho, dout;
	float one_plus = 1.0f + 1.0f / 1024, got = 0;
	make_pair(&s, &ha, &da);
	make_pair(&s, &hb, &db);
	make_pair(&s, &ho, &dout);
	PT_CHECK_OK(pt_tensor_write(&da, &one_plus, sizeof(one_plus)));
	PT_CHECK_OK(pt_tensor_write(&db, &one_plus, sizeof(one_plus)));
	pt_set_precision(PT_PREC_BF16);
	PT_CHECK_OK(pt_matmul(&dout, &da, &db, false, false, 1.0f, 0.0f));
	pt_set_precision(PT_PREC_FP32);
	PT_CHECK_OK(pt_tensor_read(&dout, &got, sizeof(got)));
	CU_ASSERT_EQUAL(got, 1.0f);
	PT_CHECK_OK(pt_matmul(&dout, &da, &db, false, false, 1.0f, 0.0f));
	PT_CHECK_OK(pt_tensor_read(&dout, &got, sizeof(got)));
	CU_ASSERT_EQUAL(got, one_plus * one_plus);
	pt_tensor_fini(&ha), pt_tensor_fini(&da), pt_tensor_fini(&hb), pt_tensor_fini(&db);
	pt_tensor_fini(&ho), pt_tensor_fini(&dout);
}

static void test_cuda_strided_copy_matches_cpu(void)
{
	op_case cs = {"copy_t", PT_OP_COPY, {F32(T, C)}, {F32(C, T)}, {{0}}, 0};
	pt_tensor h, d, ht, dt, ho, dout;
	pt_op_call hc = {.op = PT_OP_COPY}, dc = {.op = PT_OP_COPY};
	make_pair(&cs.in[0], &h, &d);
	make_pair(&cs.out[0], &ho, &dout);
	PT_CHECK_OK(pt_tensor_transpose(&ht, &h, 0, 1));
	PT_CHECK_OK(pt_tensor_transpose(&dt, &d, 0, 1));
	hc.in[0] = &ht, hc.out[0] = &ho;
	dc.in[0] = &dt, dc.out[0] = &dout;
	PT_CHECK_OK(pt_dispatch(&hc));
	PT_CHECK_OK(pt_dispatch(&dc));
	CU_ASSERT_TRUE(compare("copy_transposed", 0, &ho, &dout, 0));
	pt_tensor_fini(&h), pt_tensor_fini(&d), pt_tensor_fini(&ht), pt_tensor_fini(&dt);
	pt_tensor_fini(&ho), pt_tensor_fini(&dout);
}

static void test_cuda_bad_token_is_range_error(void)
{
	tspec ts = TOK(V, 1, 4), ws = F32(V, 8), os = F32(1, 4, 8);
	pt_tensor ht, dt, hw, dw, ho, dout;
	int64_t bad[4] = {1, 2, V + 5, 0};
	make_pair(&ts, &ht, &dt);
	make_pair(&ws, &hw, &dw);
	make_pair(&os, &ho, &dout);
	PT_CHECK_OK(pt_tensor_write(&dt, bad, sizeof(bad)));
	PT_CHECK_ERR_MSG(pt_embedding_forward(&dout, &dt, &dw, NULL), PT_ERR_RANGE, "position 2");
	pt_tensor_fini(&ht), pt_tensor_fini(&dt), pt_tensor_fini(&hw), pt_tensor_fini(&dw);
	pt_tensor_fini(&ho), pt_tensor_fini(&dout);
}

static void test_cuda_mixed_devices_refused(void)
{
	tspec s = F32(4, 4);
	pt_tensor h, d, ho, dout;
	make_pair(&s, &h, &d);
	make_pair(&s, &ho, &dout);
	PT_CHECK_ERR(pt_add(&dout, &d, &h, 1.0f, 1.0f), PT_ERR_INVALID);
	pt_tensor_fini(&h), pt_tensor_fini(&d), pt_tensor_fini(&ho), pt_tensor_fini(&dout);
}

static const pt_test_case cuda_tests[] = {
    {"test_cuda_every_op_matches_cpu", test_cuda_every_op_matches_cpu},
    {"test_cuda_tf32_matches_cpu_emulation", test_cuda_tf32_matches_cpu_emulation},
    {"test_cuda_bf16_matches_cpu_emulation", test_cuda_bf16_matches_cpu_emulation},
    {"test_cuda_bf16_rounds_operands", test_cuda_bf16_rounds_operands},
    {"test_cuda_large_shapes_match_cpu", test_cuda_large_shapes_match_cpu},
    {"test_cuda_beyond_2g_elements", test_cuda_beyond_2g_elements},
    {"test_cuda_strided_copy_matches_cpu", test_cuda_strided_copy_matches_cpu},
    {"test_cuda_bad_token_is_range_error", test_cuda_bad_token_is_range_error},
    {"test_cuda_mixed_devices_refused", test_cuda_mixed_devices_refused},
    {"test_cuda_column_reductions_deterministic", test_cuda_column_reductions_deterministic},
    {"test_cuda_stale_error_not_reported", test_cuda_stale_error_not_reported},
    {"test_cuda_pool_trim_gives_memory_back", test_cuda_pool_trim_gives_memory_back},
    {"test_cuda_device_ready", test_cuda_device_ready},
    {NULL, NULL},
};

/* ---- NCCL communicator contract (2 devices, one thread per rank) ---- */

static void nccl_contract(void)
{
	/* Without NCCL in the build, creation must say so; with it, see below. */
	pt_local_group *g;
	pt_comm *ctl;
	pt_comm *nc = NULL;
	PT_CHECK_OK(pt_local_group_create(&g, 1));
	PT_CHECK_OK(pt_local_comm_create(&ctl, g, 0));
	pt_err rv = pt_nccl_comm_create(&nc, ctl, GPU, 1000);
	if (rv == PT_ERR_UNSUPPORTED) {
		printf("skip: %s\n", pt_last_error());
		pt_comm_destroy(ctl);
	} else {
		PT_CHECK_OK(rv);
		pt_comm_destroy(nc);
	}
	pt_local_group_destroy(g);
}

static void test_cuda_nccl_contract(void)
{
	if (n_devices < 2) {
		printf("skip: NCCL contract needs 2 CUDA devices, found %d\n", n_devices);
		return;
	}
	nccl_contract();
}

static const pt_test_case nccl_tests[] = {
    {"test_cuda_nccl_contract", test_cuda_nccl_contract},
    {NULL, NULL},
};

/* ---- models and pipeline stages on the device ---- */

/* The whole model built on the CPU and on cuda:0 from one seed: the device
 * parameters read back equal the CPU ones bitwise, the gradients are zero. */
static void check_initial_weights(const pt_layer_spec *layers, int n, pt_act_shape in)
{
	pt_model_config cfg = {.batch = 2, .input = in, .n_slots = 2, .seed = 42};
	pt_model *cpu = NULL, *gpu = NULL;
	PT_CHECK_OK(pt_model_create(&cpu, layers, n, 0, n, &cfg));
	cfg.device = GPU;
	PT_CHECK_OK(pt_model_create(&gpu, layers, n, 0, n, &cfg));
	if (cpu == NULL || gpu == NULL)
		goto out;
	const pt_tensor *hp = pt_model_params(cpu), *dp = pt_model_params(gpu);
	size_t nb = pt_tensor_nbytes(hp);
	float *back = malloc(nb), *grads = malloc(nb);
	CU_ASSERT_FATAL(back != NULL && grads != NULL);
	CU_ASSERT(pt_tensor_device(dp).kind == PT_DEV_CUDA &&
	          pt_tensor_device(pt_model_grads(gpu)).kind == PT_DEV_CUDA);
	CU_ASSERT_EQUAL(pt_tensor_nbytes(dp), nb);
	PT_CHECK_OK(pt_tensor_read(dp, back, nb));
	PT_CHECK_OK(pt_tensor_read(pt_model_grads(gpu), grads, nb));
	CU_ASSERT_EQUAL(memcmp(back, pt_tensor_data(hp), nb), 0);
	for (size_t i = 0; i < nb / sizeof(float); i++)
		if (grads[i] != 0.0f) {
			CU_FAIL("a device gradient does not start at zero");
			break;
		}
	free(back);
	free(grads);
out:
	pt_model_destroy(cpu);
	pt_model_destroy(gpu);
}

static void test_cuda_model_initial_weights_equal_cpu(void)
{
	const pt_layer_spec lm[] = {pt_embedding(50, 32, 8), pt_block(32, 4), pt_layernorm(32),
	                            pt_linear(32, 50)};
	check_initial_weights(fx_digits_mlp, FX_N_LAYERS, fx_digits_in);
	check_initial_weights(lm, 4, (pt_act_shape){PT_I64, 8, 0});
}

#define DEV_STEPS    20
#define DEV_MB       4    /* microbatches per step */
#define DEV_LOSS_TOL 1e-4 /* relative, per step */

/* A 2-stage sync digits pipeline: the coordinator on the CPU, the stages on
 * devs[1], devs[2] (PT_CPU: the reference). nccl: the stages' local
 * communicators become NCCL communicators on those devices, as the job
 * runner makes them. */
typedef struct dev_rig {
	pt_local_group *g;
	pt_comm *comms[3];
	pt_stage *stages[3];
	pt_coordinator *coord;
} dev_rig;

static void dev_rig_down(dev_rig *r)
{
	if (r->coord != NULL)
		PT_CHECK_OK(pt_coordinator_stop(r->coord));
	for (int s = 1; s <= 2; s++) {
		if (r->stages[s] != NULL)
			PT_CHECK_OK(pt_stage_join(r->stages[s]));
		pt_stage_destroy(r->stages[s]);
	}
	pt_coordinator_destroy(r->coord);
	for (int i = 0; i <= 2; i++)
		pt_comm_destroy(r->comms[i]);
	pt_local_group_destroy(r->g);
	memset(r, 0, sizeof(*r));
}

/* Returns the NCCL creation's error (the rig is then down), else PT_OK. */
static pt_err dev_rig_up(dev_rig *r, const pt_device *devs, bool nccl)
{
	pt_stage_config sc[2];
	pt_pipeline_config pc = fx_pipeline_config(2, DEV_MB, PT_MODE_SYNC);
	memset(r, 0, sizeof(*r));
	fx_stage_configs(sc, 2, DEV_MB, PT_MODE_SYNC, false, NULL);
	PT_CHECK_OK(pt_local_group_create(&r->g, 3));
	for (int i = 0; i <= 2; i++)
		PT_CHECK_OK(pt_local_comm_create(&r->comms[i], r->g, i));
	if (nccl) {
		pt_err rv = pt_nccl_comm_create_group(r->comms, devs, 3, 10000);
		if (rv != PT_OK) {
			dev_rig_down(r);
			return rv;
		}
	}
	for (int s = 1; s <= 2; s++) {
		sc[s - 1].device = devs[s];
		PT_CHECK_OK(pt_stage_create(&r->stages[s], &sc[s - 1], r->comms[s]));
		PT_CHECK_OK(pt_stage_start(r->stages[s]));
	}
	PT_CHECK_OK(pt_coordinator_create(&r->coord, &pc, r->comms[0]));
	return PT_OK;
}

/* Trains DEV_STEPS steps from the same data; loss[i] per step. */
static void dev_rig_train(dev_rig *r, double *loss)
{
	fx_data d;
	fx_data_up(&d, DEV_MB);
	for (int st = 0; st < DEV_STEPS; st++) {
		pt_pipe_step_result res;
		fx_data_next(&d, st);
		PT_CHECK_OK(pt_coordinator_step(r->coord, &d.x, &d.y, st, &res));
		loss[st] = res.loss;
	}
	fx_data_down(&d);
}

static bool losses_close(const char *what, const double *cpu, const double *gpu)
{
	bool ok = true;
	for (int i = 0; i < DEV_STEPS; i++) {
		double rel = fabs(gpu[i] - cpu[i]) / fmax(fabs(cpu[i]), 1e-12);
		if (!(rel <= DEV_LOSS_TOL)) {
			printf("\n    %s step %d: cpu loss %.9g, gpu %.9g (rel %.3g)", what, i,
			       cpu[i], gpu[i], rel);
			ok = false;
		}
	}
	return ok;
}

static void cpu_reference(double *loss)
{
	const pt_device cpu[3] = {PT_CPU, PT_CPU, PT_CPU};
	dev_rig r;
	PT_CHECK_OK(dev_rig_up(&r, cpu, false));
	dev_rig_train(&r, loss);
	dev_rig_down(&r);
}

/* state[s - 1] must be host data of params + 2 AdamW moments, with the
 * parameters (pt_coordinator_params) as its first slice. */
static void check_host_state(dev_rig *r, int s, const pt_tensor *state, int64_t steps)
{
	pt_tensor params;
	CU_ASSERT_EQUAL(steps, DEV_STEPS);
	CU_ASSERT_EQUAL(pt_tensor_device(state).kind, PT_DEV_CPU);
	PT_CHECK_OK(pt_coordinator_params(r->coord, s, &params));
	CU_ASSERT_EQUAL(pt_tensor_device(&params).kind, PT_DEV_CPU);
	CU_ASSERT_EQUAL(pt_tensor_numel(state), 3 * pt_tensor_numel(&params));
	CU_ASSERT_EQUAL(
	    memcmp(pt_tensor_data(state), pt_tensor_data(&params), pt_tensor_nbytes(&params)), 0);
	for (int64_t i = 0; i < pt_tensor_numel(state); i++)
		if (!isfinite(pt_tensor_f32(state)[i])) {
			CU_FAIL("non-finite training state");
			break;
		}
	pt_tensor_fini(&params);
}

/* Loads state[] into a fresh rig on devs and reads it back: the same bytes. */
static void check_state_loads(const pt_device *devs, pt_tensor *state)
{
	dev_rig r;
	PT_CHECK_OK(dev_rig_up(&r, devs, false));
	for (int s = 1; s <= 2; s++) {
		pt_tensor back;
		int64_t steps = 0;
		PT_CHECK_OK(pt_coordinator_set_state(r.coord, s, &state[s - 1], DEV_STEPS));
		PT_CHECK_OK(pt_coordinator_get_state(r.coord, s, &back, &steps));
		CU_ASSERT_EQUAL(steps, DEV_STEPS);
		CU_ASSERT(pt_tensor_nbytes(&back) == pt_tensor_nbytes(&state[s - 1]) &&
		          memcmp(pt_tensor_data(&back), pt_tensor_data(&state[s - 1]),
		                 pt_tensor_nbytes(&back)) == 0);
		pt_tensor_fini(&back);
	}
	dev_rig_down(&r);
}

static void test_cuda_pipeline_digits_matches_cpu(void)
{
	const pt_device gpu[3] = {PT_CPU, GPU, GPU}, cpu[3] = {PT_CPU, PT_CPU, PT_CPU};
	double ref[DEV_STEPS], got[DEV_STEPS];
	pt_tensor state[2];
	dev_rig r;

	cpu_reference(ref);
	PT_CHECK_OK(dev_rig_up(&r, gpu, false));
	dev_rig_train(&r, got);
	CU_ASSERT_TRUE(losses_close("local", ref, got));
	/* The checkpoint's state is host data, and it loads back. */
	for (int s = 1; s <= 2; s++) {
		int64_t steps = 0;
		PT_CHECK_OK(pt_coordinator_get_state(r.coord, s, &state[s - 1], &steps));
		check_host_state(&r, s, &state[s - 1], steps);
	}
	dev_rig_down(&r);
	check_state_loads(gpu, state);
	check_state_loads(cpu, state);
	pt_tensor_fini(&state[0]);
	pt_tensor_fini(&state[1]);
}

/* The same over NCCL communicators placed as the job runner places them:
 * stage s on cuda:((s - 1) mod devices); with one GPU both share cuda:0 and
 * their tensors take the control path. */
static void test_cuda_pipeline_digits_over_nccl(void)
{
	const pt_device gpu[3] = {PT_CPU, GPU, {PT_DEV_CUDA, 1 % n_devices}};
	double ref[DEV_STEPS], got[DEV_STEPS];
	dev_rig r;
	pt_err rv = dev_rig_up(&r, gpu, true);
	if (rv == PT_ERR_UNSUPPORTED) {
		printf("skip: %s\n", pt_last_error());
		return;
	}
	PT_CHECK_OK(rv);
	if (rv != PT_OK)
		return;
	dev_rig_train(&r, got);
	dev_rig_down(&r);
	cpu_reference(ref);
	CU_ASSERT_TRUE(losses_close("nccl", ref, got));
}

static void on_job_loss(void *ctx, const pt_job_metric *m)
{
	double *v = ctx;
	if (m->step >= 1 && m->step <= DEV_STEPS)
		v[m->step - 1] = m->loss;
}

/* pt_job_run with its stages on the GPUs a server placed them on
 * (pt_job_run_options.stage_gpus; pipeserver --devices): stage 1 on the
 * second GPU when there is one, stage 2 on cuda:0, against the same job on
 * the CPU. */
static void test_cuda_job_on_placed_gpus(void)
{
	const int gpus[2] = {n_devices > 1 ? 1 : 0, 0};
	double ref[DEV_STEPS] = {0}, got[DEV_STEPS] = {0};
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = ref, .on_metric = on_job_loss};
	pt_job_spec s;
	int64_t last = 0;

	pt_test_digits_spec(&s);
	s.steps = DEV_STEPS;
	s.stages = 2;
	free(s.boundaries);
	s.boundaries = NULL;
	s.eval_every = 0;
	PT_CHECK_OK(pt_job_run(&s, &o, &h, &last));
	o.stage_gpus = gpus;
	o.n_stage_gpus = 2;
	h.ctx = got;
	PT_CHECK_OK(pt_job_run(&s, &o, &h, &last));
	CU_ASSERT_EQUAL(last, DEV_STEPS);
	CU_ASSERT_TRUE(losses_close("placed", ref, got));
	pt_job_spec_fini(&s);
}

/* precision bf16 on the GPU: a 2-stage digits job, stages on cuda:0, against
 * the same job on the CPU's bf16 emulation (the same operand rounding; the
 * f32 sums differ in order, and a last-bit difference can round an operand
 * to the neighbouring bf16 value: 1e-2 relative on each loss), and not equal
 * to the GPU's fp32 losses (the rounding really happened). */
static void test_cuda_job_bf16(void)
{
	const int gpus[2] = {0, 0};
	double ref[DEV_STEPS] = {0}, got[DEV_STEPS] = {0}, fp32[DEV_STEPS] = {0};
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = ref, .on_metric = on_job_loss};
	pt_job_spec s;
	int64_t last = 0;
	bool differs = false;

	pt_test_digits_spec(&s);
	s.steps = DEV_STEPS;
	s.stages = 2;
	free(s.boundaries);
	s.boundaries = NULL;
	s.eval_every = 0;
	s.precision = strdup("bf16");
	PT_CHECK_OK(pt_job_run(&s, &o, &h, &last));
	o.stage_gpus = gpus;
	o.n_stage_gpus = 2;
	h.ctx = got;
	PT_CHECK_OK(pt_job_run(&s, &o, &h, &last));
	CU_ASSERT_EQUAL(last, DEV_STEPS);
	for (int i = 0; i < DEV_STEPS; i++) {
		double rel = fabs(got[i] - ref[i]) / fmax(fabs(ref[i]), 1e-12);
		if (!(rel <= 1e-2)) {
			printf("\n    bf16 step %d: cpu loss %.9g, gpu %.9g (rel %.3g)", i, ref[i],
			       got[i], rel);
			CU_FAIL("bf16 loss on the GPU far from the CPU's emulation");
		}
	}
	free(s.precision);
	s.precision = strdup("fp32");
	h.ctx = fp32;
	PT_CHECK_OK(pt_job_run(&s, &o, &h, &last));
	for (int i = 1; i < DEV_STEPS; i++)
		differs = differs || fp32[i] != got[i];
	CU_ASSERT_TRUE(differs);
	pt_job_spec_fini(&s);
}

static const pt_test_case pipeline_tests[] = {
    {"test_cuda_model_initial_weights_equal_cpu", test_cuda_model_initial_weights_equal_cpu},
    {"test_cuda_pipeline_digits_matches_cpu", test_cuda_pipeline_digits_matches_cpu},
    {"test_cuda_pipeline_digits_over_nccl", test_cuda_pipeline_digits_over_nccl},
    {"test_cuda_job_on_placed_gpus", test_cuda_job_on_placed_gpus},
    {"test_cuda_job_bf16", test_cuda_job_bf16},
    {NULL, NULL},
};

/* bf16_products_plan: where CUDA is built, the products of a bf16 job
 * (matmul, Linear, attention) on CUDA tensors plan to their CUDA kernels at
 * precision bf16 (which round their operands to bf16, test_cuda_bf16_*)
 * rather than being refused. Planning reads the operands' device only: the
 * tensors describe device memory that is never touched (no device needed). */
static bool bf16_products_plan(void)
{
	static const pt_op ops[] = {PT_OP_MATMUL, PT_OP_LINEAR_FWD, PT_OP_LINEAR_BWD,
	                            PT_OP_ATTENTION_FWD, PT_OP_ATTENTION_BWD};
	pt_storage *s;
	pt_tensor t;
	bool ok = true;

	if (!pt_backend_compiled(PT_DEV_CUDA))
		return true;
	if (pt_storage_wrap(&s, (void *)(uintptr_t)4096, 4096, GPU) != PT_OK ||
	    pt_tensor_init_on(&t, s, 0, PT_F32, 2, (int64_t[]){16, 16}) != PT_OK) {
		fprintf(stderr, "bf16 plan: %s\n", pt_last_error());
		return false;
	}
	pt_storage_release(s);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		pt_op_call c = {.op = ops[i], .n_in = 1, .n_out = 1, .prec = PT_PREC_BF16};
		c.in[0] = &t;
		c.out[0] = &t;
		if (pt_backend_plan(&c) != PT_OK || c.kernel == NULL) {
			fprintf(stderr, "%s at bf16 on cuda:0 does not plan: %s\n",
			        pt_op_name(ops[i]), pt_last_error());
			ok = false;
		}
	}
	pt_tensor_fini(&t);
	return ok;
}

/* Without a device, a model on cuda:0 is refused at creation, saying why. */
static bool device_model_refused(void)
{
	pt_model_config cfg = {.batch = 2, .input = fx_digits_in, .n_slots = 1, .device = GPU};
	pt_model *m = NULL;
	pt_err rv = pt_model_create(&m, fx_digits_mlp, FX_N_LAYERS, 0, FX_N_LAYERS, &cfg);
	pt_model_destroy(m);
	if (rv == PT_OK || strstr(pt_last_error(), "cuda:0") == NULL) {
		fprintf(stderr, "a model on cuda:0 without a device: %s\n",
		        rv == PT_OK ? "accepted" : pt_last_error());
		return false;
	}
	return true;
}

/* pipeserver_device runs the real `pipeserver --device cuda:0`. Without a
 * device (or CUDA in the build) it must exit non-zero at start-up with
 * "--device cuda:0: <reason>" on stderr; with one it must start (print its
 * listening line, after any log lines) and stop on SIGTERM. Returns 0 when it behaved, 1 if not,
 * 77 when the binary is not built. */
static int pipeserver_device(bool have_gpu)
{
	char bin[4096], dir[256], out[4096] = {0}, *line;
	int fds[2], st = 0;
	size_t len = 0;
	ssize_t k;
	pid_t pid;
	bool ok;

	if (!pt_test_binary("../server/pipeserver", bin, sizeof(bin))) {
		printf("pipeserver not built: --device check skipped\n");
		return 77;
	}
	if (!pt_test_tmpdir("pt-cuda-server", dir, sizeof(dir)) || pipe(fds) != 0)
		return 1;
	if ((pid = fork()) == 0) {
		dup2(fds[1], 1);
		dup2(fds[1], 2);
		close(fds[0]);
		close(fds[1]);
		execl(bin, bin, "--device", "cuda:0", "--listen", "tcp://127.0.0.1:0", "--data-dir",
		      dir, (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	/* Without a GPU it exits and the pipe ends; with one, stop after its first line. */
	while (len < sizeof(out) - 1 && (k = read(fds[0], out + len, sizeof(out) - 1 - len)) > 0) {
		len += (size_t)k;
		out[len] = 0;
		if (have_gpu && (line = strstr(out, "pipeserver listening on")) != NULL &&
		    strchr(line, '\n') != NULL)
			break;
	}
	if (have_gpu)
		kill(pid, SIGTERM);
	close(fds[0]);
	waitpid(pid, &st, 0);
	if (have_gpu) {
		ok = strstr(out, "pipeserver listening on") != NULL;
		printf("pipeserver --device cuda:0 %s: %s", ok ? "started" : "did not start", out);
	} else {
		ok = WIFEXITED(st) && WEXITSTATUS(st) != 0 &&
		     strstr(out, "--device cuda:0: ") != NULL &&
		     (strstr(out, "no CUDA device") != NULL ||
		      strstr(out, "no CUDA support") != NULL);
		printf("pipeserver --device cuda:0 without a GPU: exit %d, said: %s",
		       WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
	}
	return pt_test_tmpdir_done(dir, ok ? 0 : 1);
}

int main(void)
{
	int n = 0;
	pt_err rv = pt_backend_device_count(PT_DEV_CUDA, &n);
	int server_rc = pipeserver_device(rv == PT_OK && n >= 1);
	if (server_rc == 1 || !bf16_products_plan())
		return 1;
	if (rv != PT_OK || n < 1) {
		char why[512];
		snprintf(why, sizeof(why), "%s", pt_last_error());
		/* Without a device, asking for one must fail cleanly and say why. */
		pt_storage *s = NULL;
		if (pt_backend_check_device(GPU) == PT_OK ||
		    pt_storage_create(&s, 64, GPU) == PT_OK) {
			fprintf(stderr, "cuda:0 accepted without a CUDA device\n");
			pt_storage_release(s);
			return 1;
		}
		if (!device_model_refused())
			return 1;
		/* Readiness (pipeserver's /readyz) asks the runtime the same. */
		if (pt_backend_device_ready(PT_CPU) != PT_OK ||
		    pt_backend_device_ready(GPU) != PT_ERR_UNSUPPORTED ||
		    strncmp(pt_last_error(), "cuda:0: ", 8) != 0 ||
		    (strstr(pt_last_error(), "no CUDA device (cudaGetDeviceCount: ") == NULL &&
		     strstr(pt_last_error(), "no CUDA support") == NULL) ||
		    (strstr(pt_last_error(), "cudaErrorInsufficientDriver") != NULL &&
		     strstr(pt_last_error(), "R580 or newer") == NULL)) {
			fprintf(stderr, "cuda:0 readiness without a device: %s\n", pt_last_error());
			return 1;
		}
		printf("cuda:0 readiness without a device: %s\n", pt_last_error());
		if (strstr(why, "cudaGetDeviceCount") != NULL)
			printf("skip: %s\n", why);
		else
			printf("skip: no CUDA device (%s)\n", why);
		return 77;
	}
	const pt_test_suite suites[] = {
	    {"cuda_ops", cuda_tests},
	    {"cuda_nccl", nccl_tests},
	    {"cuda_pipeline", pipeline_tests},
	    {NULL, NULL},
	};
	n_devices = n;
	printf("%d CUDA device(s)\n", n);
	return pt_test_main(suites);
}
