/* optim_config.c - optimizer settings: PyTorch defaults, validation naming
 * the field, learning-rate schedules and the clipping factor. Pure functions
 * with no tensor or kernel dependency, so job-spec handling (clients
 * included) can use them without the training stack. */
#include <math.h>

#include "optim.h"

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
	if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
		return pt_set_error(PT_ERR_RANGE, "optimizer.weight_decay must be finite and >= 0");
	if (!(c->clip_norm >= 0.0f) || !isfinite(c->clip_norm))
		return pt_set_error(PT_ERR_RANGE, "optimizer.clip_norm must be finite and >= 0");
	if (c->kind == PT_OPTIM_ADAMW) {
		if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
			return pt_set_error(PT_ERR_RANGE, "optimizer.beta1 must be in [0, 1)");
		if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
			return pt_set_error(PT_ERR_RANGE, "optimizer.beta2 must be in [0, 1)");
		if (!(c->eps > 0.0f) || !isfinite(c->eps))
			return pt_set_error(PT_ERR_RANGE, "optimizer.eps must be finite and > 0");
	} else {
		if (!(c->momentum >= 0.0f) || !isfinite(c->momentum))
			return pt_set_error(PT_ERR_RANGE,
			                    "optimizer.momentum must be finite and >= 0");
		if (!isfinite(c->dampening))
			return pt_set_error(PT_ERR_RANGE, "optimizer.dampening must be finite");
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

float pt_clip_scale(double global_norm, float max_norm)
{
	double s;
	if (max_norm <= 0.0f)
		return 1.0f;
	s = (double)max_norm / (global_norm + 1e-6);
	return s < 1.0 ? (float)s : 1.0f;
}
