/* pt-train - train a shipped example in-process and report what happened.
 *
 *   pt-train --example digits [--epochs N] [--seed S] [--microbatches M]
 *            [--lr LR] [--deferred] [--save PATH]
 *   pt-train --example text   [--steps N] ...
 *
 * digits: MLP 64-256-256-10 (ReLU, AdamW) on 4/5 of the 8x8 digits, accuracy
 * on the held-out fifth. text: byte-level transformer on examples/data/text.u16.
 * Run from the repository root (or set PIPETRAIN_EXAMPLES to examples/data).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "checkpoint.h"
#include "runtime.h"
#include "tokens.h"
#include "train.h"

typedef struct options {
	const char *example, *save;
	int epochs, steps, microbatches;
	uint64_t seed;
	float lr;
	bool deferred;
} options;

static int fail(const char *what)
{
	fprintf(stderr, "pt-train: %s: %s\n", what, pt_last_error());
	return 1;
}

static const char *data_path(const char *file)
{
	static char buf[2][4096];
	static int k;
	const char *dir = getenv("PIPETRAIN_EXAMPLES");
	k ^= 1;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir ? dir : "examples/data", file);
	return buf[k];
}

static int train_digits(const options *o)
{
	enum { BATCH = 64 };
	pt_layer_spec layers[] = {pt_linear(64, 256), pt_activation(PT_LAYER_RELU),
	                          pt_linear(256, 256), pt_activation(PT_LAYER_RELU),
	                          pt_linear(256, 10)};
	pt_dataset all, train, held;
	pt_batch_iter it;
	pt_model_config cfg = {.batch = BATCH / o->microbatches,
	                       .input = {PT_F32, 0, 64},
	                       .n_slots = 1,
	                       .seed = o->seed};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, o->lr);
	pt_model *m;
	pt_optimizer *opt;
	pt_trainer *t;
	pt_tensor xb, yb, xe, ye;
	int64_t step = 0;
	double acc, loss;

	if (BATCH % o->microbatches != 0) {
		fprintf(stderr, "pt-train: --microbatches %d does not divide the batch of %d\n",
		        o->microbatches, BATCH);
		return 2;
	}
	if (pt_dataset_load_npy(&all, data_path("digits_x.npy"), data_path("digits_y.npy"), true) !=
	        PT_OK ||
	    pt_dataset_split(&train, &held, &all, 0.2, o->seed) != PT_OK)
		return fail("loading the digits");
	if (pt_model_create(&m, layers, 5, 0, 5, &cfg) != PT_OK ||
	    pt_optimizer_create(&opt, &oc, pt_model_params(m), pt_model_grads(m)) != PT_OK ||
	    pt_trainer_create(&t, m, opt, PT_LOSS_CROSS_ENTROPY, -1) != PT_OK)
		return fail("building the model");
	pt_trainer_set_deferred(t, o->deferred);
	pt_tensor_init(&xb, PT_F32, 2, (int64_t[]){BATCH, 64});
	pt_tensor_init(&yb, PT_I64, 1, (int64_t[]){BATCH});
	if (pt_batch_iter_init(&it, &train, BATCH, true, true, o->seed) != PT_OK)
		return fail("batching");
	printf("digits MLP 64-256-256-10: %ld parameters, %ld training / %ld held-out images\n",
	       (long)pt_model_num_params(m), (long)train.n, (long)held.n);
	for (int e = 0; e < o->epochs; e++) {
		double sum = 0.0;
		int n = 0;
		int64_t rows;
		pt_batch_iter_set_epoch(&it, (uint64_t)e);
		for (;;) {
			pt_step_result r;
			if (pt_batch_iter_next(&it, &xb, &yb, &rows) != PT_OK)
				return fail("batch");
			if (rows == 0)
				break;
			if (pt_trainer_step(t, &xb, &yb, o->microbatches, (uint64_t)step++, &r) !=
			    PT_OK)
				return fail("training step");
			sum += r.loss;
			n++;
		}
		printf("epoch %2d  step %5ld  loss %.4f\n", e + 1, (long)step, sum / n);
	}
	int64_t n_eval = held.n / cfg.batch * cfg.batch;
	pt_tensor_narrow(&xe, &held.x, 0, 0, n_eval);
	pt_tensor_narrow(&ye, &held.y, 0, 0, n_eval);
	if (pt_trainer_evaluate(t, &xe, &ye, &loss, &acc) != PT_OK)
		return fail("evaluation");
	printf("held-out: loss %.4f, accuracy %.2f %% (%ld images)\n", loss, 100.0 * acc,
	       (long)n_eval);
	if (o->save) {
		pt_checkpoint_info info = {.step = step};
		snprintf(info.job, sizeof(info.job), "digits");
		if (pt_checkpoint_save(o->save, m, opt, &info) != PT_OK)
			return fail("saving the checkpoint");
		printf("checkpoint: %s (+ %s.state)\n", o->save, o->save);
	}
	pt_tensor_fini(&xe);
	pt_tensor_fini(&ye);
	pt_tensor_fini(&xb);
	pt_tensor_fini(&yb);
	pt_batch_iter_fini(&it);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(opt);
	pt_model_destroy(m);
	pt_dataset_fini(&train);
	pt_dataset_fini(&held);
	pt_dataset_fini(&all);
	return 0;
}

static int train_text(const options *o)
{
	enum { B = 16, T = 64, C = 64 };
	pt_layer_spec layers[] = {pt_embedding(256, C, T), pt_block(C, 4), pt_block(C, 4),
	                          pt_layernorm(C), pt_linear(C, 256)};
	pt_model_config cfg = {
	    .batch = B / o->microbatches, .input = {PT_I64, T, 0}, .n_slots = 1, .seed = o->seed};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, o->lr);
	pt_tokens tk;
	pt_model *m;
	pt_optimizer *opt;
	pt_trainer *t;
	pt_tensor x, y;

	oc.clip_norm = 1.0f;
	if (B % o->microbatches != 0) {
		fprintf(stderr, "pt-train: --microbatches must divide %d\n", B);
		return 2;
	}
	if (pt_tokens_load(&tk, data_path("text.u16"), PT_U16, 256) != PT_OK)
		return fail("loading text.u16");
	if (pt_model_create(&m, layers, 5, 0, 5, &cfg) != PT_OK ||
	    pt_optimizer_create(&opt, &oc, pt_model_params(m), pt_model_grads(m)) != PT_OK ||
	    pt_trainer_create(&t, m, opt, PT_LOSS_CROSS_ENTROPY, -1) != PT_OK)
		return fail("building the model");
	pt_trainer_set_deferred(t, o->deferred);
	pt_tensor_init(&x, PT_I64, 2, (int64_t[]){B, T});
	pt_tensor_init(&y, PT_I64, 2, (int64_t[]){B, T});
	printf("byte-level transformer: %ld parameters, %ld tokens of text\n",
	       (long)pt_model_num_params(m), (long)tk.count);
	for (int s = 0; s < o->steps; s++) {
		pt_step_result r;
		if (pt_tokens_sample(&tk, o->seed, (uint64_t)s, &x, &y) != PT_OK ||
		    pt_trainer_step(t, &x, &y, o->microbatches, (uint64_t)s, &r) != PT_OK)
			return fail("training step");
		if (s % 25 == 0 || s == o->steps - 1)
			printf("step %4d  loss %.4f  grad norm %.3f\n", s + 1, r.loss, r.grad_norm);
	}
	if (o->save) {
		pt_checkpoint_info info = {.step = o->steps};
		snprintf(info.job, sizeof(info.job), "text");
		if (pt_checkpoint_save(o->save, m, opt, &info) != PT_OK)
			return fail("saving the checkpoint");
	}
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(opt);
	pt_model_destroy(m);
	pt_tokens_fini(&tk);
	return 0;
}

int main(int argc, char **argv)
{
	options o = {.example = "digits",
	             .epochs = 15,
	             .steps = 200,
	             .microbatches = 1,
	             .seed = 42,
	             .lr = 2e-3f};
	static const struct option longopts[] = {{"example", required_argument, 0, 'x'},
	                                         {"epochs", required_argument, 0, 'e'},
	                                         {"steps", required_argument, 0, 'n'},
	                                         {"seed", required_argument, 0, 's'},
	                                         {"microbatches", required_argument, 0, 'm'},
	                                         {"lr", required_argument, 0, 'l'},
	                                         {"deferred", no_argument, 0, 'd'},
	                                         {"save", required_argument, 0, 'o'},
	                                         {"help", no_argument, 0, 'h'},
	                                         {0, 0, 0, 0}};
	int c;

	pt_runtime_ensure_passive_wait(argv);
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'x':
			o.example = optarg;
			break;
		case 'e':
			o.epochs = atoi(optarg);
			break;
		case 'n':
			o.steps = atoi(optarg);
			break;
		case 's':
			o.seed = strtoull(optarg, NULL, 10);
			break;
		case 'm':
			o.microbatches = atoi(optarg);
			break;
		case 'l':
			o.lr = strtof(optarg, NULL);
			break;
		case 'd':
			o.deferred = true;
			break;
		case 'o':
			o.save = optarg;
			break;
		default:
			printf("usage: pt-train [--example digits|text] [--epochs N] [--steps N] "
			       "[--seed S]\n"
			       "                [--microbatches M] [--lr LR] [--deferred] [--save "
			       "PATH]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (o.microbatches <= 0 || o.epochs <= 0 || o.steps <= 0 || !(o.lr > 0.0f)) {
		fprintf(stderr,
		        "pt-train: --microbatches, --epochs, --steps and --lr must be > 0\n");
		return 2;
	}
	if (strcmp(o.example, "digits") == 0)
		return train_digits(&o);
	if (strcmp(o.example, "text") == 0)
		return train_text(&o);
	fprintf(stderr, "pt-train: unknown example \"%s\" (digits or text)\n", o.example);
	return 2;
}
