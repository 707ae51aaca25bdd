/* optim.c - optimizer steps, clipping and schedules. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>

#include "ops.h"

struct pt_optimizer {
	pt_optim_config cfg;
	pt_tensor *params, *grads;
	pt_tensor m, v; /* AdamW moments, or SGD momentum in m */
	pt_tensor sq;   /* (1) f64 */
	int64_t steps;
};

pt_optim_config pt_optim_defaults(pt_optim_kind kind, float lr)
{
	pt_optim_config c = {.kind = kind, .lr = lr};
	if (kind == PT_OPTIM_ADAMW) {
		c.beta1 = 0.9f;
		c.beta2 = 0.999f;
		c.eps = 1e-8f;
		c.weight_decay = 0.01f;
	}
	return c;
}

pt_err pt_optim_validate(const pt_optim_config *c)
{
	if (c->kind != PT_OPTIM_SGD && c->kind != PT_OPTIM_ADAMW)
		return pt_set_error(PT_ERR_INVALID, "optimizer.kind: unknown optimizer %d",
		                    c->kind);
	if (!(c->lr > 0.0f) || !isfinite(c->lr))
		return pt_set_error(PT_ERR_RANGE, "optimizer.lr must be > 0");
	if (!(c->weight_decay >= 0.0f))
		return pt_set_error(PT_ERR_RANGE, "optimizer.weight_decay must be >= 0");
	if (!(c->clip_norm >= 0.0f))
		return pt_set_error(PT_ERR_RANGE, "optimizer.clip_norm must be >= 0");
	if (c->kind == PT_OPTIM_ADAMW) {
		if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
			return pt_set_error(PT_ERR_RANGE, "optimizer.beta1 must be in [0, 1)");
		if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
			return pt_set_error(PT_ERR_RANGE, "optimizer.beta2 must be in [0, 1)");
		if (!(c->eps > 0.0f))
			return pt_set_error(PT_ERR_RANGE, "optimizer.eps must be > 0");
	} else {
		if (!(c->momentum >= 0.0f))
			return pt_set_error(PT_ERR_RANGE, "optimizer.momentum must be >= 0");
		if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
			return pt_set_error(PT_ERR_INVALID, "optimizer.nesterov needs momentum > 0 "
			                                    "and zero dampening");
	}
	if (c->schedule.kind == PT_SCHED_WARMUP_COSINE) {
		if (c->schedule.warmup_steps < 0 || c->schedule.total_steps <= 0)
			return pt_set_error(PT_ERR_RANGE,
			                    "schedule.warmup_steps must be >= 0 and schedule."
			                    "total_steps > 0");
		if (c->schedule.warmup_steps > c->schedule.total_steps)
			return pt_set_error(PT_ERR_RANGE,
			                    "schedule.warmup_steps exceeds schedule.total_steps");
		if (!(c->schedule.min_lr >= 0.0f && c->schedule.min_lr <= c->lr))
			return pt_set_error(PT_ERR_RANGE, "schedule.min_lr must be in [0, lr]");
	} else if (c->schedule.kind != PT_SCHED_CONSTANT) {
		return pt_set_error(PT_ERR_INVALID, "schedule.kind: unknown schedule");
	}
	return PT_OK;
}

float pt_lr_at(const pt_optim_config *c, int64_t step)
{
	const pt_schedule *s = &c->schedule;
	if (s->kind != PT_SCHED_WARMUP_COSINE)
		return c->lr;
	if (step <= s->warmup_steps && s->warmup_steps > 0)
		return c->lr * (float)step / (float)s->warmup_steps;
	if (step >= s->total_steps)
		return s->min_lr;
	double progress =
	    (double)(step - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
	return s->min_lr + (c->lr - s->min_lr) * (float)(0.5 * (1.0 + cos(M_PI * progress)));
}

pt_err pt_optimizer_create(pt_optimizer **out, const pt_optim_config *cfg, pt_tensor *params,
                           pt_tensor *grads)
{
	pt_optimizer *o;
	pt_err rv;
	int64_t n = pt_tensor_numel(params);

	*out = NULL;
	PT_TRY(pt_optim_validate(cfg));
	if (pt_tensor_numel(grads) != n)
		return pt_set_error(PT_ERR_SHAPE, "optimizer: params and grads differ in size");
	if ((o = calloc(1, sizeof(*o))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "optimizer");
	o->cfg = *cfg;
	o->params = params;
	o->grads = grads;
	if ((rv = pt_tensor_init(&o->sq, PT_F64, 1, (int64_t[]){1})) != PT_OK)
		goto fail;
	if (cfg->kind == PT_OPTIM_ADAMW || cfg->momentum != 0.0f)
		if ((rv = pt_tensor_init(&o->m, PT_F32, 1, (int64_t[]){n})) != PT_OK)
			goto fail;
	if (cfg->kind == PT_OPTIM_ADAMW)
		if ((rv = pt_tensor_init(&o->v, PT_F32, 1, (int64_t[]){n})) != PT_OK)
			goto fail;
	*out = o;
	return PT_OK;
fail:
	pt_optimizer_destroy(o);
	return rv;
}

void pt_optimizer_destroy(pt_optimizer *o)
{
	if (o == NULL)
		return;
	pt_tensor_fini(&o->m);
	pt_tensor_fini(&o->v);
	pt_tensor_fini(&o->sq);
	free(o);
}

pt_err pt_optimizer_sqnorm(pt_optimizer *o, double *sq)
{
	PT_TRY(pt_squared_norm(&o->sq, o->grads));
	return pt_tensor_item(&o->sq, 0, sq);
}

float pt_clip_scale(double global_norm, float max_norm)
{
	double s;
	if (max_norm <= 0.0f)
		return 1.0f;
	s = (double)max_norm / (global_norm + 1e-6);
	return s < 1.0 ? (float)s : 1.0f;
}

pt_err pt_optimizer_step(pt_optimizer *o, float grad_scale)
{
	const pt_optim_config *c = &o->cfg;
	int64_t step = o->steps + 1;
	float lr = pt_lr_at(c, step);
	pt_err rv;

	if (c->kind == PT_OPTIM_ADAMW)
		rv = pt_adamw_update(o->params, &o->m, &o->v, o->grads, lr, c->beta1, c->beta2,
		                     c->eps, c->weight_decay, grad_scale, step);
	else
		rv = pt_sgd_update(o->params, o->m.storage ? &o->m : NULL, o->grads, lr,
		                   c->momentum, c->dampening, c->weight_decay, grad_scale,
		                   c->nesterov, o->steps == 0);
	if (rv == PT_OK)
		o->steps = step;
	return rv;
}

pt_err pt_optimizer_step_clipped(pt_optimizer *o, double global_norm, float *lr)
{
	if (lr)
		*lr = pt_lr_at(&o->cfg, o->steps + 1);
	return pt_optimizer_step(o, pt_clip_scale(global_norm, o->cfg.clip_norm));
}

int64_t pt_optimizer_steps(const pt_optimizer *o)
{
	return o->steps;
}

void pt_optimizer_set_steps(pt_optimizer *o, int64_t steps)
{
	o->steps = steps;
}

int pt_optimizer_state(pt_optimizer *o, const char **names, pt_tensor **tensors)
{
	if (o->cfg.kind == PT_OPTIM_ADAMW) {
		names[0] = "exp_avg";
		tensors[0] = &o->m;
		names[1] = "exp_avg_sq";
		tensors[1] = &o->v;
		return 2;
	}
	if (o->m.storage) {
		names[0] = "momentum_buffer";
		tensors[0] = &o->m;
		return 1;
	}
	return 0;
}
