/* optim.h - SGD and AdamW over a model's flat parameter and gradient arenas,
 * global gradient-norm clipping, and learning-rate schedules.
 *
 * Semantics follow PyTorch (torch.optim.SGD, torch.optim.AdamW with decoupled
 * weight decay applied to every parameter). Optimizer state (momentum, Adam
 * moments) shares the parameter layout, so it checkpoints as flat tensors.
 */
#ifndef PT_OPTIM_H
#define PT_OPTIM_H

#include "tensor.h"

typedef enum pt_optim_kind { PT_OPTIM_SGD, PT_OPTIM_ADAMW } pt_optim_kind;
typedef enum pt_sched_kind { PT_SCHED_CONSTANT, PT_SCHED_WARMUP_COSINE } pt_sched_kind;

typedef struct pt_schedule {
	pt_sched_kind kind;
	int64_t warmup_steps; /* linear warm-up from 0 to lr over these steps */
	int64_t total_steps;  /* cosine decays to min_lr at this step */
	float min_lr;
} pt_schedule;

typedef struct pt_optim_config {
	pt_optim_kind kind;
	float lr;
	float beta1, beta2, eps; /* AdamW (defaults 0.9, 0.999, 1e-8) */
	float weight_decay;      /* AdamW default 0.01; SGD default 0 */
	float momentum, dampening;
	bool nesterov;
	float clip_norm; /* global gradient-norm clip; 0 disables */
	pt_schedule schedule;
} pt_optim_config;

/* pt_optim_defaults returns PyTorch's defaults for the kind with the given lr. */
pt_optim_config pt_optim_defaults(pt_optim_kind kind, float lr);

/* pt_optim_validate checks a config; the error names the field. */
pt_err pt_optim_validate(const pt_optim_config *cfg);

/* pt_lr_at returns the learning rate for 1-based step `step`. */
float pt_lr_at(const pt_optim_config *cfg, int64_t step);

typedef struct pt_optimizer pt_optimizer;

/* pt_optimizer_create binds to params and grads (borrowed, equal sizes) and
 * allocates zeroed state. */
pt_err pt_optimizer_create(pt_optimizer **out, const pt_optim_config *cfg, pt_tensor *params,
                           pt_tensor *grads);
void pt_optimizer_destroy(pt_optimizer *o);

/* pt_optimizer_sqnorm returns sum(grad^2) of the raw gradients (a sync
 * boundary). Pipeline stages send this to the coordinator for global clipping. */
pt_err pt_optimizer_sqnorm(pt_optimizer *o, double *sq);

/* pt_clip_scale returns the factor that clips a global norm to max_norm
 * (PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1). */
float pt_clip_scale(double global_norm, float max_norm);

/* pt_optimizer_step applies one update with g = grad * grad_scale (the caller
 * folds microbatch averaging and clipping into grad_scale) and advances the
 * step counter. The learning rate comes from the schedule. */
pt_err pt_optimizer_step(pt_optimizer *o, float grad_scale);

/* pt_optimizer_step is these three; a graph captures only the middle one.
 * pt_optimizer_prepare (host) writes the next step's learning rate, grad
 * scale and step count into a small f64 tensor the update kernel reads at
 * run time; pt_optimizer_update dispatches the update op (its op params are
 * the same every step, so a captured update replays bitwise);
 * pt_optimizer_advance (host) counts the step. Call them in this order, once
 * each per step. */
pt_err pt_optimizer_prepare(pt_optimizer *o, float grad_scale);
pt_err pt_optimizer_update(pt_optimizer *o);
void pt_optimizer_advance(pt_optimizer *o);

/* pt_optimizer_step_clipped clips by the configured clip_norm given the
 * global gradient norm, steps, and reports the learning rate used. */
pt_err pt_optimizer_step_clipped(pt_optimizer *o, double global_norm, float *lr);

/* pt_optimizer_next_lr is the learning rate of the next step; pt_optimizer_clip
 * the configured clip_norm. */
float pt_optimizer_next_lr(const pt_optimizer *o);
float pt_optimizer_clip(const pt_optimizer *o);

/* pt_optimizer_steps returns the number of steps taken. */
int64_t pt_optimizer_steps(const pt_optimizer *o);

/* pt_optimizer_set_steps restores the step counter (checkpoint resume). */
void pt_optimizer_set_steps(pt_optimizer *o, int64_t steps);

/* State tensors for checkpoints: AdamW has "exp_avg" and "exp_avg_sq"; SGD with
 * momentum has "momentum_buffer". Returns the count; names/tensors borrowed. */
int pt_optimizer_state(pt_optimizer *o, const char **names, pt_tensor **tensors);

#endif
