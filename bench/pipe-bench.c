/* pipe-bench - pipeline efficiency and bubble figures.
 *
 *   pipe_eff_local, pipe_eff_nng: 2 stages, m = 8, the W2 byte-level GPT,
 *     one thread per stage; achieved tokens/s over the ideal
 *     (single-stage single-thread tokens/s x 2 x m / (m + p - 1)).
 *   pipe_bf16_wire_bytes_ratio: the same nng pipeline with precision bf16:
 *     the bytes stage 1 sent (activations, DONEs, replies) over fp32's.
 *   bubble_p<P>_m<M> next to bubble_formula_p<P>_m<M> = (p-1)/(m+p-1):
 *     measured from the stages' timelines in sync mode on a balanced MLP.
 *   bubble_1f1b_p4_m8, bubble_zbh1_p4_m8: the same measure for 1F1B and
 *     ZB-H1 on stages whose F, B and W are the task-delay hook (sleeps of
 *     1:1:1 units; a whole backward is 2), so 2 cores do not decide it; the
 *     formulas (p-1)/(m+p-1) and (p-1)/(3m+p-1) beside them.
 *   bubble_interleaved_v2_p4_m8: interleaved 1F1B, 4 ranks of 2 chunks
 *     (8 stages, a chunk's tasks half a stage's sleep), beside its formula
 *     (p-1)/(vm+p-1).
 *   w2_pipe_zbh1_vs_1f1b: real W2 compute, 2 stages, m = 8, local
 *     communicators: ZB-H1's tokens/s over 1F1B's (median of 5 alternating
 *     pairs); w2_pipe_interleaved_vs_1f1b: interleaved, 2 ranks of 2
 *     chunks, over the same 1F1B run.
 * Figures are printed as `bench <name> <value>`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "runtime.h"
#include "train.h"

static void die(const char *what)
{
	fprintf(stderr, "pipe-bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

typedef struct model_desc {
	pt_layer_spec layers[24];
	int n;
	pt_act_shape in, out;
	int64_t microbatch;
	bool tokens;
} model_desc;

static void w2(model_desc *d, int64_t microbatch)
{
	memset(d, 0, sizeof(*d));
	d->layers[d->n++] = pt_embedding(256, 256, 128);
	for (int i = 0; i < 8; i++)
		d->layers[d->n++] = pt_block(256, 4);
	d->layers[d->n++] = pt_layernorm(256);
	d->layers[d->n++] = pt_linear(256, 256);
	d->in = (pt_act_shape){PT_I64, 128, 0};
	d->out = (pt_act_shape){PT_F32, 128, 256};
	d->microbatch = microbatch;
	d->tokens = true;
}

/* p equal stages of Linear(512, 512) + ReLU, then a 10-way head. */
static void balanced_mlp(model_desc *d, int p, int64_t microbatch)
{
	memset(d, 0, sizeof(*d));
	for (int i = 0; i < p; i++) {
		d->layers[d->n++] = pt_linear(512, 512);
		d->layers[d->n++] = pt_activation(PT_LAYER_RELU);
	}
	d->layers[d->n++] = pt_linear(512, 10);
	d->in = (pt_act_shape){PT_F32, 0, 512};
	d->out = (pt_act_shape){PT_F32, 0, 10};
	d->microbatch = microbatch;
}

static void make_batch(const model_desc *d, int m, pt_tensor *x, pt_tensor *y)
{
	int64_t B = d->microbatch * m;
	if (d->tokens) {
		pt_tensor_init(x, PT_I64, 2, (int64_t[]){B, 128});
		pt_tensor_init(y, PT_I64, 2, (int64_t[]){B, 128});
		for (int64_t i = 0; i < B * 128; i++) {
			((int64_t *)pt_tensor_data(x))[i] = (i * 31) % 256;
			((int64_t *)pt_tensor_data(y))[i] = (i * 17) % 256;
		}
	} else {
		pt_rng r;
		pt_tensor_init(x, PT_F32, 2, (int64_t[]){B, 512});
		pt_tensor_init(y, PT_I64, 1, (int64_t[]){B});
		pt_rng_init(&r, 3, 0);
		pt_rng_normal(&r, pt_tensor_f32(x), B * 512, 0.0f, 1.0f);
		for (int64_t i = 0; i < B; i++)
			((int64_t *)pt_tensor_data(y))[i] = i % 10;
	}
}

/* Samples per second of the in-process trainer on one thread. */
static double single_stage(const model_desc *d, int m, int warmup, int steps)
{
	pt_model_config cfg = {.batch = d->microbatch, .input = d->in, .n_slots = 1, .seed = 1};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-3f);
	pt_model *mdl;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor x, y;
	double t0 = 0.0;
	pt_set_num_threads(1);
	if (pt_model_create(&mdl, d->layers, d->n, 0, d->n, &cfg) != PT_OK ||
	    pt_optimizer_create(&o, &oc, pt_model_params(mdl), pt_model_grads(mdl)) != PT_OK ||
	    pt_trainer_create(&t, mdl, o, PT_LOSS_CROSS_ENTROPY, -1) != PT_OK)
		die("single-stage model");
	make_batch(d, m, &x, &y);
	for (int s = 0; s < warmup + steps; s++) {
		pt_step_result r;
		if (s == warmup)
			t0 = pt_now();
		if (pt_trainer_step(t, &x, &y, m, (uint64_t)s, &r) != PT_OK)
			die("single-stage step");
	}
	double sps = (double)(d->microbatch * m) * steps / (pt_now() - t0);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(mdl);
	return sps;
}

typedef struct pipe_run {
	double samples_per_s, bubble;
	uint64_t stage1_bytes; /* what stage 1 sent (its communicator's count) */
} pipe_run;

/* Interleaved: chunks per rank; p then counts p / il_v ranks' chunks. */
static int il_v = 1;
/* The stages' precision (bf16: products and the wire between stages). */
static pt_precision bench_prec = PT_PREC_FP32;

/* Builds p stage threads and a coordinator over local or nng (tcp loopback)
 * communicators and trains `steps` steps after `warmup`. */
static pipe_run run_pipe_as(const model_desc *d, int p, int m, bool use_nng, int warmup, int steps,
                            pt_pipe_schedule sched, int delay_ms)
{
	pt_comm *comms[PT_MAX_STAGES + 1] = {0};
	pt_stage *stages[PT_MAX_STAGES + 1] = {0};
	pt_local_group *g = NULL;
	pt_coordinator *coord;
	int first[PT_MAX_STAGES + 1];
	pt_tensor x, y;
	pipe_run out = {0};
	double t0 = 0.0, bubble = 0.0;

	if (pt_partition(d->layers, d->n, d->in, p, first) != PT_OK)
		die("partition");
	if (use_nng) {
		const char *urls[PT_MAX_STAGES + 1];
		uint8_t key[PT_COMM_KEY_BYTES];
		if (pt_comm_key_generate(key) != PT_OK)
			die("session key");
		for (int i = 0; i <= p; i++) {
			pt_nng_options no = {.listen_url = "tcp://127.0.0.1:0",
			                     .world = p + 1,
			                     .rank = i,
			                     .timeout_ms = 60000,
			                     .key = key};
			if (pt_nng_comm_create(&comms[i], &no) != PT_OK)
				die("nng communicator");
			urls[i] = pt_nng_comm_url(comms[i]);
		}
		for (int i = 0; i <= p; i++)
			if (pt_nng_comm_connect(comms[i], urls) != PT_OK)
				die("nng connect");
	} else {
		if (pt_local_group_create(&g, p + 1) != PT_OK)
			die("local group");
		for (int i = 0; i <= p; i++)
			if (pt_local_comm_create(&comms[i], g, i) != PT_OK)
				die("local communicator");
	}
	pt_stage_turn *turns[PT_MAX_STAGES] = {0};
	int ranks = p / il_v, il_slots = 0;
	if (sched == PT_SCHED_INTERLEAVED &&
	    pt_pipe_interleaved_slots(ranks, il_v, m, &il_slots) != PT_OK)
		die("interleaved order");
	for (int r = 1; sched == PT_SCHED_INTERLEAVED && r <= ranks; r++)
		if (pt_stage_turn_create(&turns[r - 1], r, ranks, il_v, m) != PT_OK)
			die("interleaved turn");
	for (int s = 1; s <= p; s++) {
		pt_stage_config sc = {.layers = d->layers,
		                      .n_layers = d->n,
		                      .input = d->in,
		                      .microbatch = d->microbatch,
		                      .first = first[s - 1],
		                      .last = first[s],
		                      .n_slots = sched == PT_SCHED_INTERLEAVED ? il_slots
		                                 : sched == PT_SCHED_ZBH1      ? p + 1
		                                 : sched == PT_SCHED_1F1B      ? p
		                                                               : m,
		                      .mode = PT_MODE_SYNC,
		                      .schedule = sched,
		                      .n_microbatches = m,
		                      .virtual_stages = il_v,
		                      .turn = turns[(s - 1) % ranks],
		                      .precision = bench_prec,
		                      .optim = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-3f),
		                      .seed = 1,
		                      .threads = 1};
		if (pt_stage_create(&stages[s], &sc, comms[s]) != PT_OK)
			die("stage");
		/* A chunk is 1/v of a rank's layers: 1/v of its work. */
		pt_stage_set_task_delay(stages[s], delay_ms / il_v);
		if (pt_stage_start(stages[s]) != PT_OK)
			die("stage");
	}
	pt_pipeline_config pc = {.n_stages = p,
	                         .n_microbatches = m,
	                         .microbatch = d->microbatch,
	                         .mode = PT_MODE_SYNC,
	                         .schedule = sched,
	                         .virtual_stages = il_v,
	                         .loss = PT_LOSS_CROSS_ENTROPY,
	                         .ignore_index = -1,
	                         .optim = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-3f),
	                         .output = d->out,
	                         .timeout_ms = 120000};
	if (pt_coordinator_create(&coord, &pc, comms[0]) != PT_OK)
		die("coordinator");
	make_batch(d, m, &x, &y);
	for (int s = 0; s < warmup + steps; s++) {
		pt_pipe_step_result r;
		if (s == warmup)
			t0 = pt_now();
		if (pt_coordinator_step(coord, &x, &y, s, &r) != PT_OK)
			die("pipeline step");
		if (s >= warmup)
			bubble += r.bubble / steps;
		if (r.has_stage_comm[0])
			out.stage1_bytes = r.stage_comm[0].bytes_sent;
	}
	out.samples_per_s = (double)(d->microbatch * m) * steps / (pt_now() - t0);
	out.bubble = bubble;
	pt_coordinator_stop(coord);
	for (int s = 1; s <= p; s++) {
		pt_stage_join(stages[s]);
		pt_stage_destroy(stages[s]);
	}
	pt_coordinator_destroy(coord);
	for (int i = 0; i <= p; i++)
		pt_comm_destroy(comms[i]);
	pt_local_group_destroy(g);
	for (int r = 0; r < ranks; r++)
		pt_stage_turn_destroy(turns[r]);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	return out;
}

static pipe_run run_pipe(const model_desc *d, int p, int m, bool use_nng, int warmup, int steps)
{
	return run_pipe_as(d, p, m, use_nng, warmup, steps, PT_SCHED_MODE, 0);
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	model_desc d;
	const int p = 2, m = 8;
	pt_runtime_ensure_passive_wait(argv);

	/* Efficiency: W2 with batch 16 as 8 microbatches of 2 sequences. */
	w2(&d, 2);
	double single = single_stage(&d, m, 1, 3);
	double ideal = single * p * m / (double)(m + p - 1);
	pipe_run loc = run_pipe(&d, p, m, false, 1, 3);
	pipe_run net = run_pipe(&d, p, m, true, 1, 3);
	printf("bench pipe_single_tokens_per_s %.0f\n", single * 128);
	printf("bench pipe_local_tokens_per_s %.0f\n", loc.samples_per_s * 128);
	printf("bench pipe_nng_tokens_per_s %.0f\n", net.samples_per_s * 128);
	printf("bench pipe_eff_local %.3f\n", loc.samples_per_s / ideal);
	printf("bench pipe_eff_nng %.3f\n", net.samples_per_s / ideal);
	/* bf16 between the stages over nng: bytes stage 1 sent, over fp32's. */
	bench_prec = PT_PREC_BF16;
	pipe_run net16 = run_pipe(&d, p, m, true, 1, 3);
	bench_prec = PT_PREC_FP32;
	printf("bench pipe_nng_bf16_tokens_per_s %.0f\n", net16.samples_per_s * 128);
	printf("bench pipe_bf16_wire_bytes_ratio %.3f\n",
	       (double)net16.stage1_bytes / (double)net.stage1_bytes);

	/* Bubble fraction vs GPipe's (p - 1) / (m + p - 1). */
	static const int ps[] = {2, 4}, ms[] = {4, 8, 16};
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 3; j++) {
			balanced_mlp(&d, ps[i], 32);
			pipe_run r = run_pipe(&d, ps[i], ms[j], false, 2, 5);
			printf("bench bubble_p%d_m%d %.3f\n", ps[i], ms[j], r.bubble);
			printf("bench bubble_formula_p%d_m%d %.3f\n", ps[i], ms[j],
			       (double)(ps[i] - 1) / (ms[j] + ps[i] - 1));
		}

	/* Schedules on sleep-based work: F, B, W = 20 ms each. */
	balanced_mlp(&d, 4, 32);
	pipe_run f1 = run_pipe_as(&d, 4, 8, false, 1, 3, PT_SCHED_1F1B, 20);
	pipe_run zb = run_pipe_as(&d, 4, 8, false, 1, 3, PT_SCHED_ZBH1, 20);
	printf("bench bubble_1f1b_p4_m8 %.3f\n", f1.bubble);
	printf("bench bubble_1f1b_formula_p4_m8 %.3f\n", 3.0 / 11.0);
	printf("bench bubble_zbh1_p4_m8 %.3f\n", zb.bubble);
	printf("bench bubble_zbh1_formula_p4_m8 %.3f\n", 3.0 / 27.0);
	printf("bench bubble_zbh1_vs_1f1b_p4_m8 %.3f\n", zb.bubble / f1.bubble);
	balanced_mlp(&d, 8, 32);
	il_v = 2;
	pipe_run il = run_pipe_as(&d, 8, 8, false, 1, 3, PT_SCHED_INTERLEAVED, 20);
	il_v = 1;
	printf("bench bubble_interleaved_v2_p4_m8 %.3f\n", il.bubble);
	printf("bench bubble_interleaved_v2_formula_p4_m8 %.3f\n", 3.0 / 19.0);

	/* Real compute: W2, 2 stages, ZB-H1 against 1F1B, alternating. */
	w2(&d, 2);
	double ratios[5], il_ratios[5];
	for (int k = 0; k < 5; k++) {
		pipe_run a = run_pipe_as(&d, 2, 8, false, 1, 2, PT_SCHED_1F1B, 0);
		pipe_run b = run_pipe_as(&d, 2, 8, false, 1, 2, PT_SCHED_ZBH1, 0);
		pipe_run c;
		il_v = 2; /* 2 ranks of 2 chunks */
		c = run_pipe_as(&d, 4, 8, false, 1, 2, PT_SCHED_INTERLEAVED, 0);
		il_v = 1;
		ratios[k] = b.samples_per_s / a.samples_per_s;
		il_ratios[k] = c.samples_per_s / a.samples_per_s;
	}
	qsort(ratios, 5, sizeof(double), by_value);
	qsort(il_ratios, 5, sizeof(double), by_value);
	printf("bench w2_pipe_zbh1_vs_1f1b %.3f\n", ratios[2]);
	printf("bench w2_pipe_interleaved_vs_1f1b %.3f\n", il_ratios[2]);
	return 0;
}
