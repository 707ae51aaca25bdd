/* model.c - building a model or stage: shape check, arenas, slots, forward,
 * backward, state_dict names. Arenas live on cfg.device; the initial weights
 * are drawn on the host (the layers' init writes host memory) and copied. */
#include "model.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

typedef struct slot {
	pt_storage *arena;
	pt_tensor *y;       /* [n_layers] outputs */
	pt_tensor *saved;   /* [n_layers * PT_LAYER_MAX_SAVED] */
	pt_tensor x;        /* view of the caller's input for this slot */
	pt_storage *warena; /* split backward: the layers' weight stashes */
	pt_tensor *wstash;  /* [n_layers] flat views of warena (empty: no weight part) */
	bool has_x;
	bool training; /* forward's settings, replayed by backward */
	uint64_t step, microbatch;
} slot;

struct pt_model {
	int first, n_layers;
	pt_layer *layers;
	pt_model_config cfg;
	pt_act_shape in_shape, out_shape;
	pt_storage *param_arena, *grad_arena;
	pt_tensor params, grads;
	int64_t n_params;
	int n_tensors;
	char (*names)[64];
	int *tensor_layer, *tensor_k; /* state_dict index -> (layer, param) */
	int n_slots;
	slot *slots;
	pt_storage *work_arena; /* two gradient buffers + scratch */
	pt_tensor gbuf[2];      /* flat f32, max activation size */
	pt_tensor scratch;      /* flat f32 */
	pt_tensor gview[2];     /* backward's current views of gbuf (shaped) */
	int64_t max_act;        /* floats */
};

static int64_t act_floats(pt_act_shape s, int64_t B)
{
	int64_t n = B * (s.seq ? s.seq : 1);
	return s.features ? n * s.features : n;
}

/* Batch shape of an activation: (B, F), (B, T, C) or tokens (B, T). */
static int act_dims(pt_act_shape s, int64_t B, int64_t *shape)
{
	int nd = 0;
	shape[nd++] = B;
	if (s.seq)
		shape[nd++] = s.seq;
	if (s.features)
		shape[nd++] = s.features;
	return nd;
}

pt_err pt_model_check(const pt_layer_spec *layers, int n_layers, pt_act_shape input)
{
	pt_act_shape cur = input;
	if (n_layers <= 0)
		return pt_set_error(PT_ERR_INVALID, "the model has no layers");
	for (int i = 0; i < n_layers; i++) {
		const pt_layer_vt *vt = pt_layer_vtable(layers[i].kind);
		pt_act_shape next;
		pt_err rv;
		if (vt == NULL)
			return pt_set_error(PT_ERR_INVALID, "layer %d: unknown kind %d", i,
			                    (int)layers[i].kind);
		if ((rv = vt->infer(&layers[i], cur, &next)) != PT_OK)
			return pt_set_error(rv, "layer %d (%s): %s", i, vt->name, pt_last_error());
		cur = next;
	}
	return PT_OK;
}

static pt_err alloc_params(pt_model *m)
{
	int64_t total = 0;
	int t = 0;
	pt_err rv;

	/* Sizes come from clients: checked, so an absurd model is an error. */
	for (int i = 0; i < m->n_layers; i++)
		for (int k = 0; k < m->layers[i].n_params; k++) {
			pt_param_info *p = &m->layers[i].pinfo[k];
			int64_t n;
			if (p->shape[0] < 0 || (p->ndim == 2 && p->shape[1] < 0) ||
			    __builtin_mul_overflow(p->shape[0], p->ndim == 2 ? p->shape[1] : 1,
			                           &n) ||
			    n > (INT64_MAX / 4 - 15) ||
			    __builtin_add_overflow(total, (n + 15) & ~(int64_t)15, &total) ||
			    total > INT64_MAX / 4 - 64)
				return pt_set_error(
				    PT_ERR_OVERFLOW,
				    "layer %d (%s): parameter %s: %" PRId64 " x %" PRId64
				    " floats overflow the parameter arena",
				    m->layers[i].index, m->layers[i].vt->name, p->name, p->shape[0],
				    p->ndim == 2 ? p->shape[1] : 1);
			m->n_tensors++;
		}
	m->n_params = 0;
	m->names = calloc((size_t)m->n_tensors + 1, sizeof(*m->names));
	m->tensor_layer = calloc((size_t)m->n_tensors + 1, sizeof(int));
	m->tensor_k = calloc((size_t)m->n_tensors + 1, sizeof(int));
	if (!m->names || !m->tensor_layer || !m->tensor_k)
		return pt_set_error(PT_ERR_NOMEM, "parameter tables");
	/* On the host first: init draws the weights there; place_params moves them. */
	PT_TRY(pt_storage_create(&m->param_arena, (size_t)(total ? total : 1) * 4, PT_CPU));
	PT_TRY(pt_storage_create(&m->grad_arena, (size_t)(total ? total : 1) * 4, PT_CPU));
	PT_TRY(pt_tensor_init_on(&m->params, m->param_arena, 0, PT_F32, 1, (int64_t[]){total}));
	PT_TRY(pt_tensor_init_on(&m->grads, m->grad_arena, 0, PT_F32, 1, (int64_t[]){total}));
	int64_t off = 0;
	for (int i = 0; i < m->n_layers; i++) {
		pt_layer *l = &m->layers[i];
		for (int k = 0; k < l->n_params; k++) {
			pt_param_info *p = &l->pinfo[k];
			int64_t n = p->shape[0] * (p->ndim == 2 ? p->shape[1] : 1);
			if ((rv = pt_tensor_init_on(&l->param[k], m->param_arena, (size_t)off * 4,
			                            PT_F32, p->ndim, p->shape)) != PT_OK ||
			    (rv = pt_tensor_init_on(&l->grad[k], m->grad_arena, (size_t)off * 4,
			                            PT_F32, p->ndim, p->shape)) != PT_OK)
				return rv;
			snprintf(m->names[t], sizeof(m->names[t]), "%d.%s", l->index, p->name);
			m->tensor_layer[t] = i;
			m->tensor_k[t] = k;
			t++;
			m->n_params += n;
			off += (n + 15) & ~(int64_t)15;
		}
	}
	return PT_OK;
}

/* repoint moves t (a view over from) to the same bytes of to. */
static void repoint(pt_tensor *t, pt_storage *from, pt_storage *to)
{
	if (t->storage != from)
		return;
	pt_storage_retain(to);
	t->storage = to;
	pt_storage_release(from);
}

/* place_params moves the initialised host arenas to cfg.device (a no-op on
 * the CPU): the parameters are copied byte for byte, the gradients start
 * zeroed, every view keeps its offset. */
static pt_err place_params(pt_model *m)
{
	pt_device dev = m->cfg.device;
	pt_storage *p = NULL, *g = NULL, *hp = m->param_arena, *hg = m->grad_arena;
	pt_err rv;

	if (dev.kind == PT_DEV_CPU)
		return PT_OK;
	if ((rv = pt_storage_create(&p, hp->nbytes, dev)) != PT_OK ||
	    (rv = pt_storage_create(&g, hg->nbytes, dev)) != PT_OK ||
	    (rv = pt_backend_copy(p->data, dev, hp->data, PT_CPU, hp->nbytes)) != PT_OK) {
		pt_storage_release(p);
		pt_storage_release(g);
		return rv;
	}
	repoint(&m->params, hp, p);
	repoint(&m->grads, hg, g);
	for (int i = 0; i < m->n_layers; i++)
		for (int k = 0; k < m->layers[i].n_params; k++) {
			repoint(&m->layers[i].param[k], hp, p);
			repoint(&m->layers[i].grad[k], hg, g);
		}
	m->param_arena = p;
	m->grad_arena = g;
	pt_storage_release(hp);
	pt_storage_release(hg);
	return PT_OK;
}

static pt_err alloc_slot(pt_model *m, slot *s)
{
	int64_t total = 0, B = m->cfg.batch;
	pt_saved_info info[PT_LAYER_MAX_SAVED];
	pt_dtype mm_in = pt_layer_mm_input(m->cfg.precision, m->cfg.device);
	int64_t shape[4];

	s->y = calloc((size_t)m->n_layers, sizeof(pt_tensor));
	s->saved = calloc((size_t)m->n_layers * PT_LAYER_MAX_SAVED, sizeof(pt_tensor));
	if (!s->y || !s->saved)
		return pt_set_error(PT_ERR_NOMEM, "activation slot tables");
	/* Two passes over the same size table: measure, then cut. */
	for (int pass = 0; pass < 2; pass++) {
		int64_t off = 0;
		if (pass == 1)
			PT_TRY(pt_storage_create(&s->arena, (size_t)(total ? total : 1) * 4,
			                         m->cfg.device));
		for (int i = 0; i < m->n_layers; i++) {
			pt_layer *l = &m->layers[i];
			int nd = act_dims(l->out_shape, B, shape);
			int64_t n = act_floats(l->out_shape, B);
			int ns = l->vt->saved(&l->spec, l->in_shape, B, mm_in, info);
			if (pass == 1)
				PT_TRY(pt_tensor_init_on(&s->y[i], s->arena, (size_t)off * 4,
				                         PT_F32, nd, shape));
			off += (n + 15) & ~(int64_t)15;
			for (int k = 0; k < ns; k++) {
				int64_t sn = 1;
				for (int d = 0; d < info[k].ndim; d++)
					sn *= info[k].shape[d];
				if (pass == 1)
					PT_TRY(pt_tensor_init_on(
					    &s->saved[i * PT_LAYER_MAX_SAVED + k], s->arena,
					    (size_t)off * 4, info[k].dtype, info[k].ndim,
					    info[k].shape));
				off += (sn * (int64_t)pt_dtype_size(info[k].dtype) / 4 + 15) &
				       ~(int64_t)15;
			}
			l->n_saved = ns;
		}
		total = off;
	}
	if (!m->cfg.split_backward)
		return PT_OK;
	if ((s->wstash = calloc((size_t)m->n_layers, sizeof(pt_tensor))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "weight stash table");
	total = 0;
	for (int i = 0; i < m->n_layers; i++) {
		pt_layer *l = &m->layers[i];
		total += l->vt->wstash ? l->vt->wstash(&l->spec, l->in_shape, B) : 0;
	}
	PT_TRY(pt_storage_create(&s->warena, (size_t)(total ? total : 1) * 4, m->cfg.device));
	for (int i = 0, off = 0; i < m->n_layers; i++) {
		pt_layer *l = &m->layers[i];
		int64_t n = l->vt->wstash ? l->vt->wstash(&l->spec, l->in_shape, B) : 0;
		if (n > 0)
			PT_TRY(pt_tensor_init_on(&s->wstash[i], s->warena, (size_t)off * 4, PT_F32,
			                         1, (int64_t[]){n}));
		off += (int)n;
	}
	return PT_OK;
}

static pt_err alloc_work(pt_model *m)
{
	int64_t B = m->cfg.batch, scratch = 16, mx = act_floats(m->in_shape, B);
	for (int i = 0; i < m->n_layers; i++) {
		pt_layer *l = &m->layers[i];
		int64_t n = act_floats(l->out_shape, B);
		int64_t s = l->vt->scratch(&l->spec, l->in_shape, B);
		mx = n > mx ? n : mx;
		scratch = s > scratch ? s : scratch;
	}
	mx = (mx + 15) & ~(int64_t)15;
	m->max_act = mx;
	PT_TRY(pt_storage_create(&m->work_arena, (size_t)(2 * mx + scratch) * 4, m->cfg.device));
	PT_TRY(pt_tensor_init_on(&m->gbuf[0], m->work_arena, 0, PT_F32, 1, (int64_t[]){mx}));
	PT_TRY(pt_tensor_init_on(&m->gbuf[1], m->work_arena, (size_t)mx * 4, PT_F32, 1,
	                         (int64_t[]){mx}));
	return pt_tensor_init_on(&m->scratch, m->work_arena, (size_t)mx * 8, PT_F32, 1,
	                         (int64_t[]){scratch});
}

pt_err pt_model_create(pt_model **out, const pt_layer_spec *layers, int n_layers, int first,
                       int last, const pt_model_config *cfg)
{
	pt_model *m;
	pt_act_shape cur;
	pt_err rv;

	*out = NULL;
	if (cfg->batch <= 0)
		return pt_set_error(PT_ERR_INVALID, "batch size %" PRId64 " must be > 0",
		                    cfg->batch);
	if (cfg->n_slots < 1)
		return pt_set_error(PT_ERR_INVALID, "n_slots must be >= 1");
	if (first < 0 || last > n_layers || first >= last)
		return pt_set_error(PT_ERR_RANGE, "stage layers [%d, %d) of %d", first, last,
		                    n_layers);
	PT_TRY(pt_model_check(layers, n_layers, cfg->input));
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "model");
	m->cfg = *cfg;
	m->first = first;
	m->n_layers = last - first;
	m->n_slots = cfg->n_slots;
	m->layers = calloc((size_t)m->n_layers, sizeof(pt_layer));
	m->slots = calloc((size_t)m->n_slots, sizeof(slot));
	if (!m->layers || !m->slots) {
		rv = pt_set_error(PT_ERR_NOMEM, "model tables");
		goto fail;
	}
	cur = cfg->input;
	for (int i = 0; i < last; i++) {
		const pt_layer_vt *vt = pt_layer_vtable(layers[i].kind);
		pt_act_shape next;
		vt->infer(&layers[i], cur, &next);
		if (i >= first) {
			pt_layer *l = &m->layers[i - first];
			l->spec = layers[i];
			l->index = i;
			l->vt = vt;
			l->in_shape = cur;
			l->out_shape = next;
			l->n_params = vt->params(&l->spec, l->pinfo);
		}
		if (i == first)
			m->in_shape = cur;
		cur = next;
	}
	m->out_shape = cur;
	if ((rv = alloc_params(m)) != PT_OK)
		goto fail;
	if (cfg->prefault_slots > 0) { /* a device model's gradients are made there */
		pt_storage_prefault(m->param_arena);
		if (cfg->device.kind == PT_DEV_CPU)
			pt_storage_prefault(m->grad_arena);
	}
	for (int i = 0; i < m->n_layers && !cfg->no_init; i++)
		m->layers[i].vt->init(&m->layers[i], cfg->seed);
	if ((rv = place_params(m)) != PT_OK)
		goto fail;
	for (int s = 0; s < m->n_slots; s++) {
		if ((rv = alloc_slot(m, &m->slots[s])) != PT_OK)
			goto fail;
		if (s < cfg->prefault_slots)
			pt_storage_prefault(m->slots[s].arena);
	}
	if ((rv = alloc_work(m)) != PT_OK)
		goto fail;
	*out = m;
	return PT_OK;
fail:
	pt_model_destroy(m);
	return rv;
}

void pt_model_destroy(pt_model *m)
{
	if (m == NULL)
		return;
	for (int s = 0; m->slots && s < m->n_slots; s++) {
		slot *sl = &m->slots[s];
		for (int i = 0; sl->y && i < m->n_layers; i++)
			pt_tensor_fini(&sl->y[i]);
		for (int i = 0; sl->saved && i < m->n_layers * PT_LAYER_MAX_SAVED; i++)
			pt_tensor_fini(&sl->saved[i]);
		pt_tensor_fini(&sl->x);
		for (int i = 0; sl->wstash && i < m->n_layers; i++)
			pt_tensor_fini(&sl->wstash[i]);
		free(sl->y);
		free(sl->saved);
		free(sl->wstash);
		pt_storage_release(sl->arena);
		pt_storage_release(sl->warena);
	}
	for (int i = 0; m->layers && i < m->n_layers; i++)
		for (int k = 0; k < PT_LAYER_MAX_PARAMS; k++) {
			pt_tensor_fini(&m->layers[i].param[k]);
			pt_tensor_fini(&m->layers[i].grad[k]);
		}
	pt_tensor_fini(&m->params);
	pt_tensor_fini(&m->grads);
	pt_tensor_fini(&m->gbuf[0]);
	pt_tensor_fini(&m->gbuf[1]);
	pt_tensor_fini(&m->scratch);
	pt_tensor_fini(&m->gview[0]);
	pt_tensor_fini(&m->gview[1]);
	pt_storage_release(m->param_arena);
	pt_storage_release(m->grad_arena);
	pt_storage_release(m->work_arena);
	free(m->names);
	free(m->tensor_layer);
	free(m->tensor_k);
	free(m->layers);
	free(m->slots);
	free(m);
}

/* Dropout masks depend on (seed, step, microbatch, layer) only. */
static uint64_t dropout_seed(const pt_model *m)
{
	return m->cfg.seed ^ 0x9e3779b97f4a7c15ull;
}

static uint64_t dropout_stream(uint64_t step, uint64_t microbatch, int layer)
{
	return (step << 32) ^ (microbatch << 12) ^ (uint64_t)layer;
}

static pt_err check_slot(const pt_model *m, int s)
{
	if (s < 0 || s >= m->n_slots)
		return pt_set_error(PT_ERR_RANGE, "activation slot %d of %d", s, m->n_slots);
	return PT_OK;
}

static pt_err check_input(const pt_model *m, const pt_tensor *x)
{
	int64_t shape[4];
	char a[96], b[96];
	int nd = act_dims(m->in_shape, m->cfg.batch, shape);
	bool ok;
	if (!pt_device_equal(pt_tensor_device(x), m->cfg.device))
		return pt_set_error(PT_ERR_INVALID, "stage input is on %s, the model on %s",
		                    pt_device_str(a, sizeof(a), pt_tensor_device(x)),
		                    pt_device_str(b, sizeof(b), m->cfg.device));
	ok = x->dtype == m->in_shape.dtype && x->ndim == nd && pt_tensor_is_contiguous(x);
	for (int i = 0; ok && i < nd; i++)
		ok = x->shape[i] == shape[i];
	if (!ok)
		return pt_set_error(PT_ERR_SHAPE, "stage input is %s %s, expected %s %s",
		                    pt_shape_str(a, sizeof(a), x->ndim, x->shape),
		                    pt_dtype_name(x->dtype), pt_shape_str(b, sizeof(b), nd, shape),
		                    pt_dtype_name(m->in_shape.dtype));
	return PT_OK;
}

pt_err pt_model_forward(pt_model *m, int s, const pt_tensor *x, const pt_tensor **y, bool training,
                        uint64_t step, uint64_t microbatch)
{
	slot *sl;
	const pt_tensor *cur = x;

	PT_TRY(check_slot(m, s));
	PT_TRY(check_input(m, x));
	sl = &m->slots[s];
	pt_tensor_fini(&sl->x);
	pt_tensor_view(&sl->x, x);
	sl->has_x = true;
	sl->training = training;
	sl->step = step;
	sl->microbatch = microbatch;
	for (int i = 0; i < m->n_layers; i++) {
		pt_layer *l = &m->layers[i];
		pt_layer_ctx c = {
		    .x = cur,
		    .y = &sl->y[i],
		    .saved = &sl->saved[i * PT_LAYER_MAX_SAVED],
		    .training = training,
		    .seed = dropout_seed(m),
		    .stream = dropout_stream(step, microbatch, l->index),
		};
		pt_err rv = l->vt->forward(l, &c);
		if (rv != PT_OK)
			return pt_set_error(rv, "layer %d (%s) forward: %s", l->index, l->vt->name,
			                    pt_last_error());
		cur = &sl->y[i];
	}
	if (y)
		*y = cur;
	return PT_OK;
}

/* The flat gradient buffer k viewed with an activation's batch shape. */
static pt_err gview(pt_model *m, int k, pt_act_shape s, pt_tensor *out)
{
	int64_t shape[4];
	int nd = act_dims(s, m->cfg.batch, shape);
	return pt_tensor_init_on(out, m->work_arena, (size_t)(k * m->max_act) * 4, PT_F32, nd,
	                         shape);
}

static pt_err backward_part(pt_model *m, int s, const pt_tensor *dy, const pt_tensor **dx,
                            pt_bwd_part part);

pt_err pt_model_backward(pt_model *m, int s, const pt_tensor *dy, const pt_tensor **dx)
{
	return backward_part(m, s, dy, dx, PT_BWD_ALL);
}

pt_err pt_model_backward_input(pt_model *m, int s, const pt_tensor *dy, const pt_tensor **dx)
{
	if (!m->cfg.split_backward)
		return pt_set_error(PT_ERR_STATE, "split backward on a model built without it");
	return backward_part(m, s, dy, dx, PT_BWD_INPUT);
}

pt_err pt_model_backward_weight(pt_model *m, int s)
{
	slot *sl;
	PT_TRY(check_slot(m, s));
	if (!m->cfg.split_backward)
		return pt_set_error(PT_ERR_STATE, "split backward on a model built without it");
	PT_TRY(pt_dispatcher_flush(pt_dispatcher_current()));
	sl = &m->slots[s];
	if (!sl->has_x)
		return pt_set_error(PT_ERR_STATE, "weight gradients of slot %d without a forward",
		                    s);
	for (int i = m->n_layers - 1; i >= 0; i--) {
		pt_layer *l = &m->layers[i];
		pt_err rv;
		if (l->vt->wstash == NULL || sl->wstash[i].storage == NULL)
			continue;
		pt_layer_ctx c = {
		    .x = i > 0 ? &sl->y[i - 1] : &sl->x,
		    .y = &sl->y[i],
		    .saved = &sl->saved[i * PT_LAYER_MAX_SAVED],
		    .scratch = &m->scratch,
		    .training = sl->training,
		    .part = PT_BWD_WEIGHT,
		    .wstash = &sl->wstash[i],
		};
		if ((rv = l->vt->backward(l, &c)) != PT_OK)
			return pt_set_error(rv, "layer %d (%s) weight gradients: %s", l->index,
			                    l->vt->name, pt_last_error());
	}
	return PT_OK;
}

static pt_err backward_part(pt_model *m, int s, const pt_tensor *dy, const pt_tensor **dx,
                            pt_bwd_part part)
{
	slot *sl;
	const pt_tensor *cur = dy;
	pt_tensor *last;
	char a[96], b[96];
	int k = 0;

	PT_TRY(check_slot(m, s));
	/* Backward is a sync boundary: the forward's queued ops run first. */
	PT_TRY(pt_dispatcher_flush(pt_dispatcher_current()));
	sl = &m->slots[s];
	if (!sl->has_x)
		return pt_set_error(PT_ERR_STATE, "backward of slot %d without a forward", s);
	last = &sl->y[m->n_layers - 1];
	if (!pt_tensor_same_shape(dy, last) || dy->dtype != PT_F32)
		return pt_set_error(PT_ERR_SHAPE, "output gradient is %s, expected %s",
		                    pt_shape_str(a, sizeof(a), dy->ndim, dy->shape),
		                    pt_shape_str(b, sizeof(b), last->ndim, last->shape));
	for (int i = m->n_layers - 1; i >= 0; i--) {
		pt_layer *l = &m->layers[i];
		bool need_dx = i > 0 || l->in_shape.dtype == PT_F32;
		pt_tensor *dxt = NULL;
		pt_err rv;
		if (need_dx) {
			pt_tensor_fini(&m->gview[k]);
			PT_TRY(gview(m, k, l->in_shape, &m->gview[k]));
			dxt = &m->gview[k];
		}
		pt_layer_ctx c = {
		    .x = i > 0 ? &sl->y[i - 1] : &sl->x,
		    .y = &sl->y[i],
		    .saved = &sl->saved[i * PT_LAYER_MAX_SAVED],
		    .dy = cur,
		    .dx = dxt,
		    .scratch = &m->scratch,
		    .training = sl->training,
		    .seed = dropout_seed(m),
		    .stream = dropout_stream(sl->step, sl->microbatch, l->index),
		    .part = l->vt->wstash != NULL ? part : PT_BWD_ALL,
		    .wstash = sl->wstash ? &sl->wstash[i] : NULL,
		};
		if ((rv = l->vt->backward(l, &c)) != PT_OK)
			return pt_set_error(rv, "layer %d (%s) backward: %s", l->index, l->vt->name,
			                    pt_last_error());
		cur = dxt;
		k ^= 1;
	}
	if (dx)
		*dx = cur;
	return PT_OK;
}

pt_err pt_model_zero_grad(pt_model *m)
{
	return pt_fill(&m->grads, 0.0);
}

pt_err pt_model_grad_sqnorms(pt_model *m, double *out)
{
	pt_tensor sq;
	pt_err rv = PT_OK;
	if (m->n_tensors == 0)
		return PT_OK;
	/* On the gradients' device (ops take one device), each norm into its own
	 * element, then one read back to the host (one sync, not one a tensor). */
	PT_TRY(pt_tensor_init_dev(&sq, m->cfg.device, PT_F64, 1, (int64_t[]){m->n_tensors}));
	for (int i = 0; i < m->n_tensors && rv == PT_OK; i++) {
		pt_tensor *g = &m->layers[m->tensor_layer[i]].grad[m->tensor_k[i]];
		pt_tensor one;
		if ((rv = pt_tensor_narrow(&one, &sq, 0, i, 1)) == PT_OK) {
			rv = pt_squared_norm(&one, g);
			pt_tensor_fini(&one);
		}
	}
	if (rv == PT_OK)
		rv = pt_tensor_read(&sq, out, sizeof(double) * (size_t)m->n_tensors);
	pt_tensor_fini(&sq);
	return rv;
}

double pt_sum_sqnorms(const double *sq, int n)
{
	double s = 0.0;
	for (int i = 0; i < n; i++)
		s += sq[i];
	return s;
}

pt_device pt_model_device(const pt_model *m)
{
	return m->cfg.device;
}

pt_tensor *pt_model_params(pt_model *m)
{
	return &m->params;
}

pt_tensor *pt_model_grads(pt_model *m)
{
	return &m->grads;
}

int64_t pt_model_num_params(const pt_model *m)
{
	return m->n_params;
}

int pt_model_num_tensors(const pt_model *m)
{
	return m->n_tensors;
}

pt_err pt_model_tensor(pt_model *m, int index, const char **name, pt_tensor **param,
                       pt_tensor **grad)
{
	pt_layer *l;
	int k;
	if (index < 0 || index >= m->n_tensors)
		return pt_set_error(PT_ERR_RANGE, "parameter %d of %d", index, m->n_tensors);
	l = &m->layers[m->tensor_layer[index]];
	k = m->tensor_k[index];
	if (name)
		*name = m->names[index];
	if (param)
		*param = &l->param[k];
	if (grad)
		*grad = &l->grad[k];
	return PT_OK;
}

pt_act_shape pt_model_input_shape(const pt_model *m)
{
	return m->in_shape;
}

pt_act_shape pt_model_output_shape(const pt_model *m)
{
	return m->out_shape;
}

bool pt_model_output_dead(const pt_model *m)
{
	return m->n_layers > 0 && m->layers[m->n_layers - 1].spec.kind == PT_LAYER_LINEAR;
}

int64_t pt_model_batch(const pt_model *m)
{
	return m->cfg.batch;
}

size_t pt_model_slot_bytes(const pt_model *m)
{
	return m->slots[0].arena->nbytes;
}

double pt_layer_flops(const pt_layer_spec *s, pt_act_shape in)
{
	double T = in.seq ? (double)in.seq : 1.0;
	double C = (double)s->dim;
	switch (s->kind) {
	case PT_LAYER_LINEAR:
		return 6.0 * T * (double)s->in_features * (double)s->out_features;
	case PT_LAYER_ATTENTION:
		/* projections 4C^2 per token, attention 2TC per token (causal half of 4TC) */
		return 3.0 * T * (2.0 * 4.0 * C * C + 2.0 * T * C);
	case PT_LAYER_BLOCK: {
		double H = s->mlp_hidden > 0 ? (double)s->mlp_hidden : 4.0 * C;
		return 3.0 * T * (2.0 * 4.0 * C * C + 2.0 * 2.0 * C * H + 2.0 * T * C);
	}
	default:
		/* element-wise layers: a few FLOPs per element, negligible for balance */
		return 10.0 * T * (double)(in.features ? in.features : 1);
	}
}

double pt_model_flops_per_sample(const pt_model *m)
{
	double f = 0.0;
	for (int i = 0; i < m->n_layers; i++)
		f += pt_layer_flops(&m->layers[i].spec, m->layers[i].in_shape);
	return f;
}
