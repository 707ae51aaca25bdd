/* test_train.c - end-to-end training on the shipped data sets (acceptance of
 * the training core): the digits MLP reaches >= 96 % held-out accuracy, a
 * byte-level transformer lowers its loss by >= 40 %, and the same seed gives
 * bitwise-identical weights. Seeded; the whole program runs in well under 60 s. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "pt_test.h"
#include "runtime.h"
#include "tokens.h"
#include "train.h"

#define MLP_BATCH 64

typedef struct digits_run {
	double accuracy, first_loss, last_loss;
	float *weights; /* copy of the final parameters */
	size_t nbytes;
} digits_run;

/* Trains 64 -> 256 -> 256 -> 10 (ReLU, AdamW) on 4/5 of the digits for `epochs`
 * (or `max_steps` steps when > 0) and evaluates on the held-out fifth. */
static void train_digits(uint64_t seed, int epochs, int max_steps, digits_run *out)
{
	pt_dataset all, train, held;
	pt_batch_iter it;
	pt_layer_spec layers[] = {pt_linear(64, 256), pt_activation(PT_LAYER_RELU),
	                          pt_linear(256, 256), pt_activation(PT_LAYER_RELU),
	                          pt_linear(256, 10)};
	pt_model_config cfg = {
	    .batch = MLP_BATCH / 2, .input = {PT_F32, 0, 64}, .n_slots = 1, .seed = seed};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 2e-3f);
	pt_model *m;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor xb, yb, xe = {0}, ye = {0};
	int steps = 0;

	memset(out, 0, sizeof(*out));
	PT_CHECK_OK(pt_dataset_load_npy(&all, pt_test_path("examples/data/digits_x.npy"),
	                                pt_test_path("examples/data/digits_y.npy"), true));
	CU_ASSERT_EQUAL_FATAL(all.n, 1797);
	PT_CHECK_OK(pt_dataset_split(&train, &held, &all, 0.2, seed));
	PT_CHECK_OK(pt_model_create(&m, layers, 5, 0, 5, &cfg));
	PT_CHECK_OK(pt_optimizer_create(&o, &oc, pt_model_params(m), pt_model_grads(m)));
	PT_CHECK_OK(pt_trainer_create(&t, m, o, PT_LOSS_CROSS_ENTROPY, -1));
	PT_CHECK_OK(pt_tensor_init(&xb, PT_F32, 2, (int64_t[]){MLP_BATCH, 64}));
	PT_CHECK_OK(pt_tensor_init(&yb, PT_I64, 1, (int64_t[]){MLP_BATCH}));
	PT_CHECK_OK(pt_batch_iter_init(&it, &train, MLP_BATCH, true, true, seed));
	for (int e = 0; e < epochs && (max_steps <= 0 || steps < max_steps); e++) {
		int64_t rows;
		pt_batch_iter_set_epoch(&it, (uint64_t)e);
		while (max_steps <= 0 || steps < max_steps) {
			pt_step_result r;
			PT_CHECK_OK(pt_batch_iter_next(&it, &xb, &yb, &rows));
			if (rows == 0)
				break;
			PT_CHECK_OK(pt_trainer_step(t, &xb, &yb, 2, (uint64_t)steps, &r));
			CU_ASSERT_FATAL(isfinite(r.loss));
			if (steps == 0)
				out->first_loss = r.loss;
			out->last_loss = r.loss;
			steps++;
		}
	}
	/* Evaluate on the held-out rows, in whole batches of the model's size. */
	int64_t n_eval = held.n / cfg.batch * cfg.batch;
	double loss;
	PT_CHECK_OK(pt_tensor_narrow(&xe, &held.x, 0, 0, n_eval));
	PT_CHECK_OK(pt_tensor_narrow(&ye, &held.y, 0, 0, n_eval));
	PT_CHECK_OK(pt_trainer_evaluate(t, &xe, &ye, &loss, &out->accuracy));
	out->nbytes = pt_tensor_nbytes(pt_model_params(m));
	out->weights = malloc(out->nbytes);
	memcpy(out->weights, pt_tensor_data(pt_model_params(m)), out->nbytes);
	pt_tensor_fini(&xe);
	pt_tensor_fini(&ye);
	pt_tensor_fini(&xb);
	pt_tensor_fini(&yb);
	pt_batch_iter_fini(&it);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(m);
	pt_dataset_fini(&train);
	pt_dataset_fini(&held);
	pt_dataset_fini(&all);
}

static void test_train_digits_mlp_accuracy(void)
{
	digits_run r;
	double t0 = pt_now();
	train_digits(42, 20, 0, &r);
	printf("\n    digits MLP: loss %.4f -> %.4f, held-out accuracy %.2f %% (%.1f s)\n",
	       r.first_loss, r.last_loss, 100.0 * r.accuracy, pt_now() - t0);
	CU_ASSERT(r.accuracy >= 0.96);
	free(r.weights);
}

static void test_train_same_seed_bitwise_weights(void)
{
	digits_run a, b, c;
	train_digits(7, 100, 30, &a);
	train_digits(7, 100, 30, &b);
	train_digits(8, 100, 30, &c);
	CU_ASSERT_EQUAL_FATAL(a.nbytes, b.nbytes);
	CU_ASSERT_EQUAL(memcmp(a.weights, b.weights, a.nbytes), 0);
	CU_ASSERT_EQUAL(memcmp(&a.last_loss, &b.last_loss, sizeof(double)), 0);
	/* A different seed really changes the weights. */
	CU_ASSERT_NOT_EQUAL(memcmp(a.weights, c.weights, a.nbytes), 0);
	free(a.weights);
	free(b.weights);
	free(c.weights);
}

/* A byte-level transformer (embedding, 2 blocks of C features and 4 heads,
 * layernorm, head) on the shipped text, its AdamW trainer and a batch of
 * B x T tokens. */
typedef struct gpt_run {
	pt_tokens tk;
	pt_model *m;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor x, y;
} gpt_run;

static void gpt_open(gpt_run *g, int64_t C, const pt_model_config *cfg, const pt_optim_config *oc,
                     int64_t B)
{
	int64_t T = cfg->input.seq;
	pt_layer_spec layers[] = {pt_embedding(256, C, T), pt_block(C, 4), pt_block(C, 4),
	                          pt_layernorm(C), pt_linear(C, 256)};
	PT_CHECK_OK(pt_tokens_load(&g->tk, pt_test_path("examples/data/text.u16"), PT_U16, 256));
	PT_CHECK_OK(pt_model_create(&g->m, layers, 5, 0, 5, cfg));
	PT_CHECK_OK(pt_optimizer_create(&g->o, oc, pt_model_params(g->m), pt_model_grads(g->m)));
	PT_CHECK_OK(pt_trainer_create(&g->t, g->m, g->o, PT_LOSS_CROSS_ENTROPY, -1));
	PT_CHECK_OK(pt_tensor_init(&g->x, PT_I64, 2, (int64_t[]){B, T}));
	PT_CHECK_OK(pt_tensor_init(&g->y, PT_I64, 2, (int64_t[]){B, T}));
}

static void gpt_close(gpt_run *g)
{
	pt_tensor_fini(&g->x);
	pt_tensor_fini(&g->y);
	pt_trainer_destroy(g->t);
	pt_optimizer_destroy(g->o);
	pt_model_destroy(g->m);
	pt_tokens_fini(&g->tk);
}

static void test_train_byte_transformer_loss_drops(void)
{
	enum { B = 16, T = 64, C = 64, STEPS = 300 };
	pt_model_config cfg = {.batch = B, .input = {PT_I64, T, 0}, .n_slots = 1, .seed = 1};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 3e-3f);
	gpt_run g;
	double first = 0.0, last = 0.0, t0 = pt_now();

	oc.clip_norm = 1.0f;
	oc.schedule = (pt_schedule){PT_SCHED_WARMUP_COSINE, 20, STEPS, 3e-4f};
	gpt_open(&g, C, &cfg, &oc, B);
	/* Average the first and last 10 steps: single batches are noisy. */
	for (int s = 0; s < STEPS; s++) {
		pt_step_result r;
		PT_CHECK_OK(pt_tokens_sample(&g.tk, 99, (uint64_t)s, &g.x, &g.y));
		PT_CHECK_OK(pt_trainer_step(g.t, &g.x, &g.y, 1, (uint64_t)s, &r));
		CU_ASSERT_FATAL(isfinite(r.loss));
		if (s < 10)
			first += r.loss / 10;
		if (s >= STEPS - 10)
			last += r.loss / 10;
	}
	printf("\n    byte transformer: loss %.4f -> %.4f (%.1f %% lower, %.1f s)\n", first, last,
	       100.0 * (1.0 - last / first), pt_now() - t0);
	CU_ASSERT(last <= 0.6 * first);
	gpt_close(&g);
}

/* Trains the byte transformer (2 blocks) for 4 AdamW steps at bf16 with the
 * native kernels, on a model made for `made_for` (bf16: the blocks keep their
 * product inputs saved in bf16), 2 microbatches a step (accumulated
 * gradients); out gets the final parameters (caller frees), *slot the bytes
 * of an activation slot. */
static void train_bf16_gpt(pt_precision made_for, float **out, size_t *nbytes, size_t *slot)
{
	enum { B = 8, T = 32, C = 64 };
	pt_model_config cfg = {.batch = B / 2,
	                       .input = {PT_I64, T, 0},
	                       .n_slots = 1,
	                       .seed = 3,
	                       .precision = made_for};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 3e-3f);
	gpt_run g;

	gpt_open(&g, C, &cfg, &oc, B);
	pt_set_precision(PT_PREC_BF16);
	for (int s = 0; s < 4; s++) {
		pt_step_result r;
		PT_CHECK_OK(pt_tokens_sample(&g.tk, 5, (uint64_t)s, &g.x, &g.y));
		PT_CHECK_OK(pt_trainer_step(g.t, &g.x, &g.y, 2, (uint64_t)s, &r));
		CU_ASSERT(isfinite(r.loss));
	}
	pt_set_precision(PT_PREC_FP32);
	*nbytes = pt_tensor_nbytes(pt_model_params(g.m));
	*out = malloc(*nbytes);
	CU_ASSERT_FATAL(*out != NULL);
	memcpy(*out, pt_tensor_data(pt_model_params(g.m)), *nbytes);
	*slot = pt_model_slot_bytes(g.m);
	gpt_close(&g);
}

/* split_grads runs one forward and a split backward (input part, then weight
 * part: zb-h1's B and W) of a 2-block transformer made for `made_for`, at
 * bf16 on the native kernels, with a fixed output gradient; returns a copy
 * of the parameter gradients (caller frees). */
static float *split_grads(pt_precision made_for, size_t *nbytes)
{
	enum { B = 4, T = 32, C = 64 };
	pt_layer_spec layers[] = {pt_embedding(256, C, T), pt_block(C, 4), pt_block(C, 4),
	                          pt_layernorm(C), pt_linear(C, 256)};
	pt_model_config cfg = {.batch = B,
	                       .input = {PT_I64, T, 0},
	                       .n_slots = 1,
	                       .seed = 9,
	                       .split_backward = true,
	                       .precision = made_for};
	pt_model *m;
	pt_tensor x, dy;
	const pt_tensor *y, *dx;
	float *out;

	PT_CHECK_OK(pt_model_create(&m, layers, 5, 0, 5, &cfg));
	PT_CHECK_OK(pt_tensor_init(&x, PT_I64, 2, (int64_t[]){B, T}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 3, (int64_t[]){B, T, 256}));
	for (int64_t i = 0; i < B * T; i++)
		((int64_t *)pt_tensor_data(&x))[i] = (i * 37 + 5) % 256;
	for (int64_t i = 0; i < B * T * 256; i++)
		pt_tensor_f32(&dy)[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
	pt_set_precision(PT_PREC_BF16);
	PT_CHECK_OK(pt_model_zero_grad(m));
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, 0, 0));
	PT_CHECK_OK(pt_model_backward_input(m, 0, &dy, &dx));
	PT_CHECK_OK(pt_model_backward_weight(m, 0));
	pt_set_precision(PT_PREC_FP32);
	*nbytes = pt_tensor_nbytes(pt_model_grads(m));
	out = malloc(*nbytes);
	CU_ASSERT_FATAL(out != NULL);
	memcpy(out, pt_tensor_data(pt_model_grads(m)), *nbytes);
	pt_tensor_fini(&x);
	pt_tensor_fini(&dy);
	pt_model_destroy(m);
	return out;
}

/* A bf16 model on the native kernels keeps each block's product inputs (ln_1
 * and ln_2 outputs, GELU output) in bf16: its training is bitwise that of a
 * model keeping them in f32 (the products rounded them to the same bf16
 * values), and an activation slot is smaller by exactly their halves:
 * 2 blocks x (2 x B T C + B T 4C) values x 2 bytes. A split backward's
 * gradients are bitwise the same too. */
static void test_train_bf16_saved_inputs_bitwise(void)
{
	float *a, *b;
	size_t na, nb, sa, sb;

	pt_cpu_bf16_select(PT_BF16_NATIVE);
	train_bf16_gpt(PT_PREC_BF16, &a, &na, &sa);
	train_bf16_gpt(PT_PREC_FP32, &b, &nb, &sb);
	pt_cpu_bf16_select(PT_BF16_AUTO);
	CU_ASSERT_EQUAL_FATAL(na, nb);
	CU_ASSERT_EQUAL(memcmp(a, b, na), 0);
	CU_ASSERT_EQUAL(sb - sa, (size_t)2 * (2 * 4 * 32 * 64 + 4 * 32 * 256) * 2);
	printf("\n    bf16 saved product inputs: slot %zu -> %zu bytes, weights bitwise equal", sb,
	       sa);
	free(a);
	free(b);
	/* and zb-h1's split backward (the weight part reads the saved inputs) */
	pt_cpu_bf16_select(PT_BF16_NATIVE);
	a = split_grads(PT_PREC_BF16, &na);
	b = split_grads(PT_PREC_FP32, &nb);
	pt_cpu_bf16_select(PT_BF16_AUTO);
	CU_ASSERT_EQUAL_FATAL(na, nb);
	CU_ASSERT_EQUAL(memcmp(a, b, na), 0);
	free(a);
	free(b);
}

static const pt_test_case tests[] = {
    {"test_train_digits_mlp_accuracy", test_train_digits_mlp_accuracy},
    {"test_train_same_seed_bitwise_weights", test_train_same_seed_bitwise_weights},
    {"test_train_byte_transformer_loss_drops", test_train_byte_transformer_loss_drops},
    {"test_train_bf16_saved_inputs_bitwise", test_train_bf16_saved_inputs_bitwise},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	const pt_test_suite suites[] = {{"train", tests}, {NULL, NULL}};
	pt_runtime_ensure_passive_wait(argv);
	return pt_test_main(suites);
}
