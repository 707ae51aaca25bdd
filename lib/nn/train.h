/* train.h - single-process training: one model, gradient accumulation over
 * microbatches, clipping, optimizer step; evaluation with accuracy.
 *
 * This is the reference a pipeline must match: the pipeline's sync mode
 * computes exactly the same sums in the same order.
 */
#ifndef PT_TRAIN_H
#define PT_TRAIN_H

#include "graph.h"
#include "loss.h"
#include "model.h"
#include "optim.h"

typedef struct pt_step_result {
	double loss;      /* mean over microbatches of each microbatch's mean loss */
	double grad_norm; /* global norm of the averaged gradient, before clipping */
	float lr;
} pt_step_result;

typedef struct pt_trainer pt_trainer;

/* pt_trainer_create binds a model and an optimizer (both borrowed) and makes
 * the loss. */
pt_err pt_trainer_create(pt_trainer **out, pt_model *model, pt_optimizer *opt, pt_loss_kind loss,
                         int64_t ignore_index);
void pt_trainer_destroy(pt_trainer *t);

/* pt_trainer_set_deferred runs each step in the dispatcher's deferred mode. */
void pt_trainer_set_deferred(pt_trainer *t, bool deferred);

/* pt_trainer_set_graphs turns graphs on (or off): each step then runs its
 * forward and backward per microbatch and its optimizer update as captured
 * graphs after `warmup` eager runs (< 0: PT_GRAPH_WARMUP_DEFAULT; see
 * train.c), with the same results bitwise. Deferred mode is not used while
 * graphs are on. A phase that cannot be captured (dropout's per-step seeds)
 * keeps running eagerly. */
pt_err pt_trainer_set_graphs(pt_trainer *t, bool on, int warmup);

/* pt_trainer_graph_run says how a phase (forward, backward, optimizer step)
 * ran in the last step: warm-up, capture, replay or fallback. */
pt_graph_run pt_trainer_graph_run(const pt_trainer *t, pt_graph_phase phase);

/* pt_trainer_step trains on one batch: x (microbatches * B, ...) and targets
 * y, split into `microbatches` views of the model's batch size B; step is the
 * 0-based step index (it seeds dropout). */
pt_err pt_trainer_step(pt_trainer *t, const pt_tensor *x, const pt_tensor *y, int microbatches,
                       uint64_t step, pt_step_result *res);

/* pt_trainer_evaluate runs forward only on x (n * B, ...) and reports the mean
 * loss and, for cross-entropy, the accuracy of the arg-max class. */
pt_err pt_trainer_evaluate(pt_trainer *t, const pt_tensor *x, const pt_tensor *y, double *loss,
                           double *accuracy);

#endif
