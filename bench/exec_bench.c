/* exec_bench.c - graph replay vs eager dispatch on the CPU (seed 002).
 *
 * W1: an MLP 64-256-256-256-10, batch 8, SGD with momentum, one training
 * step per iteration on one thread - a step of many small ops.
 *
 * Non-kernel time is measured, not inferred: with a kernel timer on
 * (pt_dispatch_time_kernels) every kernel call adds its own duration, so in
 * one block of steps  overhead = wall time - kernel time - the clock reads
 * the timing itself adds (one extra read per call, measured). Eager overhead
 * is dispatch (meta, plan, operand checks, workspace), the trainer's host
 * code (loss and norm reads, splits) and allocation; replay overhead is the
 * graph manager's lookup and lock and the tape loop. The step is captured
 * whole (SGD, constant lr, no clipping: a replay that skips the host code
 * computes the same values). Each figure is the smallest over ROUNDS blocks
 * of BLOCK steps, eager and replay blocks interleaved, so other work on a
 * shared machine disturbs it least.
 *
 *   exec_eager_step_us, exec_replay_step_us, exec_kernel_eager_us,
 *   exec_kernel_replay_us      per step
 *   exec_eager_overhead_us, exec_replay_overhead_us   non-kernel time per step
 *   exec_eager_ops, exec_graph_ops   kernels per step (replay prunes the
 *                              ones whose results only the host read)
 *   graph_overhead_cut         1 - replay overhead / eager overhead
 *   exec_trainer_graphs_step_us   pt_trainer_set_graphs (what use_graphs
 *                              does: forward, backward, update replayed;
 *                              loss and norms eager), for comparison
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"
#include "graph.h"
#include "ops.h"
#include "rng.h"
#include "runtime.h"
#include "train.h"

#define BLOCK  100
#define ROUNDS 30

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "exec_bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

typedef struct ctx {
	pt_trainer *t;
	pt_tensor *x, *y;
	uint64_t step;
	pt_step_result res;
	pt_graph_manager *gm;
} ctx;

static pt_err step_fn(void *arg, pt_stream *s)
{
	ctx *c = arg;
	return pt_trainer_step(c->t, c->x, c->y, 1, c->step++, &c->res);
}

static pt_err replay_fn(void *arg, pt_stream *s)
{
	ctx *c = arg;
	return pt_graph_manager_execute(c->gm, "step", step_fn, c, NULL, NULL);
}

/* One block's figures, per step. */
typedef struct block {
	double wall, kernel, overhead, calls;
} block;

static double read_cost; /* one clock read, seconds */

static block run_block(ctx *c, pt_graph_fn fn)
{
	pt_kernel_timer kt = {0};
	block b;
	double t0 = now_s();
	pt_dispatch_time_kernels(&kt);
	for (int i = 0; i < BLOCK; i++)
		if (fn(c, NULL) != PT_OK)
			die("step");
	pt_dispatch_time_kernels(NULL);
	b.wall = (now_s() - t0) / BLOCK;
	b.kernel = kt.seconds / BLOCK;
	b.calls = (double)kt.calls / BLOCK;
	b.overhead = b.wall - b.kernel - b.calls * read_cost;
	return b;
}

/* Keeps the smallest of each figure over the blocks. */
static void keep_best(block *best, block b, bool first)
{
	if (first || b.overhead < best->overhead)
		best->overhead = b.overhead;
	if (first || b.kernel < best->kernel)
		best->kernel = b.kernel;
	if (first || b.wall < best->wall)
		best->wall = b.wall;
	best->calls = b.calls;
}

/* The latency of one clock read: the fastest of several blocks. */
static double clock_read_cost(void)
{
	double best = 1.0;
	for (int r = 0; r < ROUNDS; r++) {
		double t0 = now_s(), t1 = t0;
		for (int i = 0; i < 10000; i++)
			t1 = now_s();
		best = (t1 - t0) / 10000 < best ? (t1 - t0) / 10000 : best;
	}
	return best;
}

int main(void)
{
	static const pt_layer_spec layers[] = {
	    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 256, .bias = true},
	    {.kind = PT_LAYER_RELU},
	    {.kind = PT_LAYER_LINEAR, .in_features = 256, .out_features = 256, .bias = true},
	    {.kind = PT_LAYER_RELU},
	    {.kind = PT_LAYER_LINEAR, .in_features = 256, .out_features = 256, .bias = true},
	    {.kind = PT_LAYER_RELU},
	    {.kind = PT_LAYER_LINEAR, .in_features = 256, .out_features = 10, .bias = true}};
	pt_model_config cfg = {.batch = 8, .input = {PT_F32, 0, 64}, .n_slots = 1, .seed = 1};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_SGD, 0.01f);
	pt_model *m;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor x, y;
	pt_graph_manager *gm;
	pt_graph_info info;
	pt_rng r;
	ctx c = {0};
	block eager = {0}, replay = {0}, graphs = {0};

	oc.momentum = 0.9f;
	pt_set_num_threads(1); /* small ops: one thread, no OpenMP wake-ups in the figures */
	if (pt_model_create(&m, layers, 7, 0, 7, &cfg) != PT_OK ||
	    pt_optimizer_create(&o, &oc, pt_model_params(m), pt_model_grads(m)) != PT_OK ||
	    pt_trainer_create(&t, m, o, PT_LOSS_CROSS_ENTROPY, -1) != PT_OK ||
	    pt_tensor_init(&x, PT_F32, 2, (int64_t[]){8, 64}) != PT_OK ||
	    pt_tensor_init(&y, PT_I64, 1, (int64_t[]){8}) != PT_OK ||
	    pt_graph_manager_create(&gm, -1, 0) != PT_OK)
		die("setup");
	pt_rng_init(&r, 3, 0);
	pt_rng_normal(&r, pt_tensor_f32(&x), 8 * 64, 0.0f, 1.0f);
	for (int i = 0; i < 8; i++)
		((int64_t *)pt_tensor_data(&y))[i] = i;
	c = (ctx){.t = t, .x = &x, .y = &y};

	c.gm = gm;
	for (int i = 0; i < 200; i++) /* warm caches */
		step_fn(&c, NULL);
	for (int i = 0; i < 5; i++)
		if (replay_fn(&c, NULL) != PT_OK)
			die("capture");
	if (pt_graph_manager_get(gm, "step", &info) != PT_OK)
		die("the step was not captured");
	read_cost = clock_read_cost();
	for (int k = 0; k < ROUNDS; k++) {
		keep_best(&eager, run_block(&c, step_fn), k == 0);
		keep_best(&replay, run_block(&c, replay_fn), k == 0);
	}
	/* What use_graphs does in the trainer: three phase graphs, loss eager. */
	if (pt_trainer_set_graphs(t, true, -1) != PT_OK)
		die("graphs");
	for (int k = 0; k < ROUNDS; k++)
		keep_best(&graphs, run_block(&c, step_fn), k == 0);

	printf("bench exec_eager_step_us %.2f\n", eager.wall * 1e6);
	printf("bench exec_replay_step_us %.2f\n", replay.wall * 1e6);
	printf("bench exec_kernel_eager_us %.2f\n", eager.kernel * 1e6);
	printf("bench exec_kernel_replay_us %.2f\n", replay.kernel * 1e6);
	printf("bench exec_eager_overhead_us %.2f\n", eager.overhead * 1e6);
	printf("bench exec_replay_overhead_us %.2f\n", replay.overhead * 1e6);
	printf("bench exec_eager_ops %.0f\n", eager.calls);
	printf("bench exec_graph_ops %zu\n", info.n_ops);
	printf("bench graph_overhead_cut %.3f\n", 1.0 - replay.overhead / eager.overhead);
	printf("bench exec_trainer_graphs_step_us %.2f\n", graphs.wall * 1e6);
	printf("bench exec_trainer_graphs_overhead_us %.2f\n", graphs.overhead * 1e6);
	pt_graph_manager_destroy(gm);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(m);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	return 0;
}
