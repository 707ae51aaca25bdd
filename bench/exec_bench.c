/* exec_bench.c - graph replay vs eager dispatch on the CPU (seed 002).
 *
 * A W1 MLP 64-256-256-256-10, batch 8, one SGD training step per iteration:
 * the eager step (dispatch, meta, plan, host reads of loss and norms) against
 * the replayed step (recorded kernels only). Prints per-step times, the
 * non-kernel time removed per op, and the speed-up. It does not yet print
 * graph_overhead_cut: that needs the kernel time measured on its own (a
 * timed replay), which is not written.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "graph.h"
#include "ops.h"
#include "rng.h"
#include "train.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct ctx {
	pt_trainer *t;
	pt_tensor *x, *y;
	uint64_t step;
	pt_step_result res;
} ctx;

static pt_err step_fn(void *arg, pt_stream *s)
{
	ctx *c = arg;
	return pt_trainer_step(c->t, c->x, c->y, 1, c->step++, &c->res);
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
	const int iters = 3000;
	double t0, eager, replay;
	pt_err rv;

	oc.momentum = 0.9f;
	if ((rv = pt_model_create(&m, layers, 7, 0, 7, &cfg)) != PT_OK ||
	    (rv = pt_optimizer_create(&o, &oc, pt_model_params(m), pt_model_grads(m))) != PT_OK ||
	    (rv = pt_trainer_create(&t, m, o, PT_LOSS_CROSS_ENTROPY, -1)) != PT_OK ||
	    (rv = pt_tensor_init(&x, PT_F32, 2, (int64_t[]){8, 64})) != PT_OK ||
	    (rv = pt_tensor_init(&y, PT_I64, 1, (int64_t[]){8})) != PT_OK ||
	    (rv = pt_graph_manager_create(&gm, -1, 0)) != PT_OK) {
		fprintf(stderr, "exec_bench: %s\n", pt_last_error());
		return 1;
	}
	pt_rng_init(&r, 3, 0);
	pt_rng_normal(&r, pt_tensor_f32(&x), 8 * 64, 0.0f, 1.0f);
	for (int i = 0; i < 8; i++)
		((int64_t *)pt_tensor_data(&y))[i] = i;
	c = (ctx){.t = t, .x = &x, .y = &y};

	for (int i = 0; i < 200; i++) /* warm caches */
		pt_trainer_step(t, &x, &y, 1, c.step++, &c.res);
	t0 = now_s();
	for (int i = 0; i < iters; i++)
		pt_trainer_step(t, &x, &y, 1, c.step++, &c.res);
	eager = (now_s() - t0) / iters;

	for (int i = 0; i < 5; i++)
		if ((rv = pt_graph_manager_execute(gm, "step", step_fn, &c, NULL, NULL)) != PT_OK) {
			fprintf(stderr, "exec_bench: %s\n", pt_last_error());
			return 1;
		}
	if (pt_graph_manager_get(gm, "step", &info) != PT_OK) {
		fprintf(stderr, "exec_bench: the step was not captured\n");
		return 1;
	}
	t0 = now_s();
	for (int i = 0; i < iters; i++)
		pt_graph_manager_execute(gm, "step", step_fn, &c, NULL, NULL);
	replay = (now_s() - t0) / iters;

	printf("bench exec_eager_step_us %.2f\n", eager * 1e6);
	printf("bench exec_replay_step_us %.2f\n", replay * 1e6);
	printf("bench exec_graph_ops %zu\n", info.n_ops);
	printf("bench exec_overhead_per_op_ns %.1f\n", (eager - replay) / (double)info.n_ops * 1e9);
	printf("bench exec_replay_speedup %.3f\n", eager / replay);
	pt_graph_manager_destroy(gm);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(m);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	return 0;
}
