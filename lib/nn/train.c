/* train.c - the in-process training step and evaluation.
 *
 * With graphs on, a step runs three named graphs of the trainer's own graph
 * manager: Phase_Forward and Phase_Backward once per microbatch (the
 * microbatch is first copied into the trainer's fixed input buffers, so
 * every microbatch is the same computation on the same buffers) and
 * Phase_OptimizerStep once per step (its lr, grad scale and step count come
 * from the optimizer's run-time scalars, written before the graph runs).
 * The loss, its gradient, the gradient norms and zeroing the gradients stay
 * eager: they read values on the host or depend on them (the number of
 * counted targets scales the loss gradient).
 */
#include "train.h"

#include <math.h>
#include <stdlib.h>

#include "dispatch.h"
#include "graph.h"

struct pt_trainer {
	pt_model *model;
	pt_optimizer *opt;
	pt_loss *loss;
	pt_loss_kind loss_kind;
	pt_tensor dpred;
	bool deferred;
	float *host_pred;
	int64_t *host_tg;
	double *sqnorms; /* per parameter tensor */
	/* graphs (NULL: eager) */
	pt_graph_manager *graphs;
	pt_tensor xs, ys;      /* the microbatch, copied in (fixed buffers) */
	const pt_tensor *pred; /* the model's output (a fixed buffer) */
	uint64_t step, mb;     /* of the forward being captured */
	pt_graph_run last[3];  /* how each phase ran last */
};

pt_err pt_trainer_create(pt_trainer **out, pt_model *model, pt_optimizer *opt,
                         pt_loss_kind loss_kind, int64_t ignore_index)
{
	pt_trainer *t;
	pt_act_shape os = pt_model_output_shape(model);
	int64_t shape[3];
	int nd = 0;
	pt_err rv;

	*out = NULL;
	shape[nd++] = pt_model_batch(model);
	if (os.seq)
		shape[nd++] = os.seq;
	shape[nd++] = os.features;
	if ((t = calloc(1, sizeof(*t))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "trainer");
	t->model = model;
	t->opt = opt;
	t->loss_kind = loss_kind;
	t->sqnorms = calloc((size_t)pt_model_num_tensors(model) + 1, sizeof(double));
	if (t->sqnorms == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "trainer norms");
		goto fail;
	}
	/* The loss and its gradient live where the model computes. */
	if ((rv = pt_loss_create_dev(&t->loss, loss_kind, nd, shape, ignore_index,
	                             pt_model_device(model))) != PT_OK ||
	    (rv = pt_tensor_init_dev(&t->dpred, pt_model_device(model), PT_F32, nd, shape)) !=
	        PT_OK)
		goto fail;
	*out = t;
	return PT_OK;
fail:
	pt_trainer_destroy(t);
	return rv;
}

void pt_trainer_destroy(pt_trainer *t)
{
	if (t == NULL)
		return;
	pt_graph_manager_destroy(t->graphs);
	pt_tensor_fini(&t->xs);
	pt_loss_destroy(t->loss);
	pt_tensor_fini(&t->dpred);
	free(t->host_pred);
	free(t->host_tg);
	free(t->sqnorms);
	free(t);
}

void pt_trainer_set_deferred(pt_trainer *t, bool deferred)
{
	t->deferred = deferred;
}

pt_err pt_trainer_set_graphs(pt_trainer *t, bool on, int warmup)
{
	pt_graph_manager_destroy(t->graphs);
	t->graphs = NULL;
	t->pred = NULL;
	if (on)
		PT_TRY(pt_graph_manager_create(&t->graphs, warmup, 0));
	return PT_OK;
}

pt_graph_run pt_trainer_graph_run(const pt_trainer *t, pt_graph_phase phase)
{
	int i = phase == PT_PHASE_FORWARD ? 0 : phase == PT_PHASE_BACKWARD ? 1 : 2;
	return t->last[i];
}

static pt_err split(const pt_tensor *full, int64_t B, int k, int n, pt_tensor *out)
{
	if (full->shape[0] != B * n)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "a batch of %ld samples does not split into %d microbatches of %ld",
		    (long)full->shape[0], n, (long)B);
	return pt_tensor_narrow(out, full, 0, (int64_t)k * B, B);
}

/* Microbatch k of full on the model's device: a view when full is there,
 * else a copy (host batches for a model on a GPU, as a stage copies them). */
static pt_err microbatch_of(const pt_trainer *t, const pt_tensor *full, int64_t B, int k, int n,
                            pt_tensor *out)
{
	pt_device dev = pt_model_device(t->model);
	pt_tensor v = {0};
	pt_err rv;
	PT_TRY(split(full, B, k, n, &v));
	if (pt_device_equal(pt_tensor_device(&v), dev)) {
		*out = v;
		return PT_OK;
	}
	if ((rv = pt_tensor_init_dev(out, dev, v.dtype, v.ndim, v.shape)) == PT_OK &&
	    (rv = pt_tensor_transfer(out, &v)) != PT_OK)
		pt_tensor_fini(out);
	pt_tensor_fini(&v);
	return rv;
}

static pt_err forward_fn(void *arg, pt_stream *stream)
{
	pt_trainer *t = arg;
	return pt_model_forward(t->model, 0, &t->xs, &t->pred, true, t->step, t->mb);
}

static pt_err backward_fn(void *arg, pt_stream *stream)
{
	pt_trainer *t = arg;
	return pt_model_backward(t->model, 0, &t->dpred, NULL);
}

static pt_err update_fn(void *arg, pt_stream *stream)
{
	pt_trainer *t = arg;
	return pt_optimizer_update(t->opt);
}

/* Copies view v into the fixed buffer *fixed (made on first use). */
static pt_err stage_in(pt_tensor *fixed, const pt_tensor *v)
{
	if (fixed->storage == NULL)
		PT_TRY(pt_tensor_init(fixed, v->dtype, v->ndim, v->shape));
	if (fixed->dtype != v->dtype || pt_tensor_numel(fixed) != pt_tensor_numel(v))
		return pt_set_error(PT_ERR_SHAPE, "graphs: microbatch shape changed between steps");
	return pt_tensor_read(v, pt_tensor_data(fixed), pt_tensor_nbytes(fixed));
}

/* Forward, loss, loss gradient and backward of microbatch (xk, yk); with
 * graphs, forward and backward are the phase graphs on the fixed input. */
static pt_err microbatch(pt_trainer *t, const pt_tensor *xk, const pt_tensor *yk, uint64_t step,
                         int k, float scale, double *l)
{
	const pt_tensor *pred;
	if (t->graphs == NULL) {
		PT_TRY(pt_model_forward(t->model, 0, xk, &pred, true, step, (uint64_t)k));
	} else {
		t->step = step;
		t->mb = (uint64_t)k;
		PT_TRY(stage_in(&t->xs, xk));
		PT_TRY(pt_graph_manager_execute_phase(t->graphs, PT_PHASE_FORWARD, forward_fn, t,
		                                      NULL, &t->last[0]));
		pred = t->pred;
	}
	PT_TRY(pt_loss_compute_both(t->loss, pred, yk, scale, l, NULL, &t->dpred));
	if (t->graphs == NULL)
		return pt_model_backward(t->model, 0, &t->dpred, NULL);
	return pt_graph_manager_execute_phase(t->graphs, PT_PHASE_BACKWARD, backward_fn, t, NULL,
	                                      &t->last[1]);
}

static pt_err step_body(pt_trainer *t, const pt_tensor *x, const pt_tensor *y, int mbs,
                        uint64_t step, pt_step_result *res)
{
	int64_t B = pt_model_batch(t->model);
	double loss_sum = 0.0, sq;
	float scale = 1.0f / (float)mbs;
	pt_err rv = PT_OK;

	PT_TRY(pt_model_zero_grad(t->model));
	for (int k = 0; k < mbs && rv == PT_OK; k++) {
		pt_tensor xk = {0}, yk = {0};
		double l;
		if ((rv = microbatch_of(t, x, B, k, mbs, &xk)) == PT_OK &&
		    (rv = microbatch_of(t, y, B, k, mbs, &yk)) == PT_OK &&
		    (rv = microbatch(t, &xk, &yk, step, k, scale, &l)) == PT_OK)
			loss_sum += l;
		pt_tensor_fini(&xk);
		pt_tensor_fini(&yk);
	}
	if (rv != PT_OK)
		return rv;
	PT_TRY(pt_model_grad_sqnorms(t->model, t->sqnorms));
	sq = pt_sum_sqnorms(t->sqnorms, pt_model_num_tensors(t->model));
	res->grad_norm = sqrt(sq);
	res->loss = loss_sum / mbs;
	return PT_OK;
}

/* The update of a graph step: scalars on the host, the update replayed. */
static pt_err graph_update(pt_trainer *t, pt_step_result *res)
{
	res->lr = pt_optimizer_next_lr(t->opt);
	PT_TRY(
	    pt_optimizer_prepare(t->opt, pt_clip_scale(res->grad_norm, pt_optimizer_clip(t->opt))));
	PT_TRY(pt_graph_manager_execute_phase(t->graphs, PT_PHASE_OPTIMIZER_STEP, update_fn, t,
	                                      NULL, &t->last[2]));
	pt_optimizer_advance(t->opt);
	return PT_OK;
}

pt_err pt_trainer_step(pt_trainer *t, const pt_tensor *x, const pt_tensor *y, int microbatches,
                       uint64_t step, pt_step_result *res)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_err rv;

	if (microbatches <= 0)
		return pt_set_error(PT_ERR_INVALID, "microbatches must be > 0, got %d",
		                    microbatches);
	if (t->graphs != NULL) {
		PT_TRY(step_body(t, x, y, microbatches, step, res));
		return graph_update(t, res);
	}
	if (t->deferred)
		pt_deferred_begin(d);
	rv = step_body(t, x, y, microbatches, step, res);
	if (rv == PT_OK)
		rv = pt_optimizer_step_clipped(t->opt, res->grad_norm, &res->lr);
	if (t->deferred) {
		pt_err rv2 = pt_deferred_end(d);
		if (rv == PT_OK)
			rv = rv2;
	}
	return rv;
}

pt_err pt_trainer_evaluate(pt_trainer *t, const pt_tensor *x, const pt_tensor *y, double *loss,
                           double *accuracy)
{
	int64_t B = pt_model_batch(t->model), n, V, correct = 0, counted = 0;
	double loss_sum = 0.0;
	pt_act_shape os = pt_model_output_shape(t->model);

	if (x->shape[0] % B != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "evaluation set of %ld is not a multiple of %ld",
		                    (long)x->shape[0], (long)B);
	n = x->shape[0] / B;
	V = os.features;
	for (int64_t k = 0; k < n; k++) {
		pt_tensor xk = {0}, yk = {0};
		const pt_tensor *pred;
		double l;
		int64_t cnt = 0;
		pt_err rv;
		if ((rv = microbatch_of(t, x, B, (int)k, (int)n, &xk)) != PT_OK ||
		    (rv = microbatch_of(t, y, B, (int)k, (int)n, &yk)) != PT_OK ||
		    (rv = pt_model_forward(t->model, 0, &xk, &pred, false, 0, 0)) != PT_OK ||
		    (rv = pt_loss_compute_loss(t->loss, pred, &yk, &l, &cnt)) != PT_OK) {
			pt_tensor_fini(&xk);
			pt_tensor_fini(&yk);
			return rv;
		}
		loss_sum += l;
		if (t->loss_kind == PT_LOSS_CROSS_ENTROPY) {
			int64_t rows = pt_tensor_numel(pred) / V;
			if (!t->host_pred) {
				t->host_pred =
				    malloc(sizeof(float) * (size_t)pt_tensor_numel(pred));
				t->host_tg = malloc(sizeof(int64_t) * (size_t)rows);
				if (!t->host_pred || !t->host_tg)
					rv = pt_set_error(PT_ERR_NOMEM, "evaluation buffers");
			}
			if (rv == PT_OK)
				rv = pt_tensor_read(pred, t->host_pred, pt_tensor_nbytes(pred));
			if (rv == PT_OK)
				rv =
				    pt_tensor_read(&yk, t->host_tg, sizeof(int64_t) * (size_t)rows);
			for (int64_t r = 0; rv == PT_OK && r < rows; r++) {
				const float *p = t->host_pred + r * V;
				int64_t best = 0;
				for (int64_t j = 1; j < V; j++)
					best = p[j] > p[best] ? j : best;
				correct += best == t->host_tg[r];
				counted++;
			}
		}
		pt_tensor_fini(&xk);
		pt_tensor_fini(&yk);
		if (rv != PT_OK)
			return rv;
	}
	*loss = n ? loss_sum / (double)n : 0.0;
	if (accuracy)
		*accuracy = counted ? (double)correct / (double)counted : 0.0;
	return PT_OK;
}
