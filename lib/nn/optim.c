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
	/* (PT_OPTIM_SCALARS) f64: the step's lr, grad scale and count, read by the
	 * update kernel at run time (CPU parameters only), so a captured update
	 * replays with each step's values. */
	pt_tensor scalars;
	float grad_scale; /* without scalars: prepare's value, for update */
	int64_t steps;
};

pt_err pt_optimizer_create(pt_optimizer **out, const pt_optim_config *cfg, pt_tensor *params,
                           pt_tensor *grads)
{
	pt_optimizer *o;
	pt_err rv;
	int64_t n = pt_tensor_numel(params);
	pt_device dev = pt_tensor_device(params);

	*out = NULL;
	PT_TRY(pt_optim_validate(cfg));
	if (pt_tensor_numel(grads) != n)
		return pt_set_error(PT_ERR_SHAPE, "optimizer: params and grads differ in size");
	if ((o = calloc(1, sizeof(*o))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "optimizer");
	o->cfg = *cfg;
	o->params = params;
	o->grads = grads;
	/* State and the norm live on the parameters' device (ops take one). */
	if ((rv = pt_tensor_init_dev(&o->sq, dev, PT_F64, 1, (int64_t[]){1})) != PT_OK)
		goto fail;
	if (dev.kind == PT_DEV_CPU &&
	    (rv = pt_tensor_init(&o->scalars, PT_F64, 1, (int64_t[]){PT_OPTIM_SCALARS})) != PT_OK)
		goto fail;
	if (cfg->kind == PT_OPTIM_ADAMW || cfg->momentum != 0.0f)
		if ((rv = pt_tensor_init_dev(&o->m, dev, PT_F32, 1, (int64_t[]){n})) != PT_OK)
			goto fail;
	if (cfg->kind == PT_OPTIM_ADAMW)
		if ((rv = pt_tensor_init_dev(&o->v, dev, PT_F32, 1, (int64_t[]){n})) != PT_OK)
			goto fail;
	/* The first update writes all of the state: fault it in now. */
	pt_storage_prefault(o->m.storage);
	pt_storage_prefault(o->v.storage);
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
	pt_tensor_fini(&o->scalars);
	free(o);
}

pt_err pt_optimizer_sqnorm(pt_optimizer *o, double *sq)
{
	PT_TRY(pt_squared_norm(&o->sq, o->grads));
	return pt_tensor_item(&o->sq, 0, sq);
}

pt_err pt_optimizer_prepare(pt_optimizer *o, float grad_scale)
{
	int64_t step = o->steps + 1;
	double v[PT_OPTIM_SCALARS];
	if (o->scalars.storage == NULL) {
		o->grad_scale = grad_scale;
		return PT_OK;
	}
	/* A queued update (deferred mode) still reads the old values: run it first. */
	if (pt_tensor_state(o->params) == PT_PENDING)
		PT_TRY(pt_tensor_sync(o->params));
	v[PT_OPTIM_S_LR] = (double)pt_lr_at(&o->cfg, step);
	v[PT_OPTIM_S_GRAD_SCALE] = (double)grad_scale;
	v[PT_OPTIM_S_STEP] = (double)step;
	v[PT_OPTIM_S_FIRST] = o->steps == 0 ? 1.0 : 0.0;
	return pt_tensor_write(&o->scalars, v, sizeof(v));
}

pt_err pt_optimizer_update(pt_optimizer *o)
{
	const pt_optim_config *c = &o->cfg;
	int64_t step = o->steps + 1;
	pt_tensor *buf = o->m.storage ? &o->m : NULL;

	if (o->scalars.storage == NULL) { /* device parameters: the values as op params */
		float lr = pt_lr_at(c, step);
		if (c->kind == PT_OPTIM_ADAMW)
			return pt_adamw_update(o->params, &o->m, &o->v, o->grads, lr, c->beta1,
			                       c->beta2, c->eps, c->weight_decay, o->grad_scale,
			                       step);
		return pt_sgd_update(o->params, buf, o->grads, lr, c->momentum, c->dampening,
		                     c->weight_decay, o->grad_scale, c->nesterov, o->steps == 0);
	}
	if (c->kind == PT_OPTIM_ADAMW)
		return pt_adamw_update_scalars(o->params, &o->m, &o->v, o->grads, &o->scalars,
		                               c->beta1, c->beta2, c->eps, c->weight_decay);
	return pt_sgd_update_scalars(o->params, buf, o->grads, &o->scalars, c->momentum,
	                             c->dampening, c->weight_decay, c->nesterov);
}

void pt_optimizer_advance(pt_optimizer *o)
{
	o->steps++;
}

pt_err pt_optimizer_step(pt_optimizer *o, float grad_scale)
{
	PT_TRY(pt_optimizer_prepare(o, grad_scale));
	PT_TRY(pt_optimizer_update(o));
	pt_optimizer_advance(o);
	return PT_OK;
}

pt_err pt_optimizer_step_clipped(pt_optimizer *o, double global_norm, float *lr)
{
	if (lr)
		*lr = pt_lr_at(&o->cfg, o->steps + 1);
	return pt_optimizer_step(o, pt_clip_scale(global_norm, o->cfg.clip_norm));
}

float pt_optimizer_next_lr(const pt_optimizer *o)
{
	return pt_lr_at(&o->cfg, o->steps + 1);
}

float pt_optimizer_clip(const pt_optimizer *o)
{
	return o->cfg.clip_norm;
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
