/* model_wire.c - models, optimizers and stage configurations as FlatBuffers. */
#include "model_wire.h"

#include <stdlib.h>
#include <string.h>

#include "device.h"

/* Field ids and verifier descriptors: fb_schema.h, generated from schema/model.fbs
 * and schema/stage.fbs. */

pt_err pt_fb_build_layers(pt_fb_builder *b, const pt_layer_spec *layers, int n, pt_fb_ref *out)
{
	pt_fb_ref *refs = calloc((size_t)n + 1, sizeof(*refs));
	pt_err rv = PT_OK;
	if (refs == NULL)
		return pt_set_error(PT_ERR_NOMEM, "layer table refs");
	for (int i = 0; i < n && rv == PT_OK; i++) {
		const pt_layer_spec *l = &layers[i];
		pt_fb_start_table(b);
		pt_fb_add_i64(b, PT_FB_MODEL_LAYER_IN_FEATURES, l->in_features, 0);
		pt_fb_add_i64(b, PT_FB_MODEL_LAYER_OUT_FEATURES, l->out_features, 0);
		pt_fb_add_i64(b, PT_FB_MODEL_LAYER_DIM, l->dim, 0);
		pt_fb_add_i64(b, PT_FB_MODEL_LAYER_VOCAB, l->vocab, 0);
		pt_fb_add_i64(b, PT_FB_MODEL_LAYER_MAX_SEQ, l->max_seq, 0);
		pt_fb_add_i64(b, PT_FB_MODEL_LAYER_MLP_HIDDEN, l->mlp_hidden, 0);
		pt_fb_add_i32(b, PT_FB_MODEL_LAYER_N_HEAD, l->n_head, 0);
		pt_fb_add_f32(b, PT_FB_MODEL_LAYER_P, l->p, 0.0f);
		pt_fb_add_f32(b, PT_FB_MODEL_LAYER_EPS, l->eps, 0.0f);
		pt_fb_add_u8(b, PT_FB_MODEL_LAYER_KIND, (uint8_t)l->kind, 0);
		pt_fb_add_bool(b, PT_FB_MODEL_LAYER_BIAS, l->bias, true);
		rv = pt_fb_end_table(b, &refs[i]);
	}
	if (rv == PT_OK)
		rv = pt_fb_create_ref_vector(b, refs, (size_t)n, out);
	free(refs);
	return rv;
}

pt_err pt_fb_read_layers(const uint8_t *vec, uint32_t count, pt_layer_spec **out)
{
	pt_layer_spec *l;
	*out = NULL;
	if (count == 0 || count > PT_MAX_LAYERS)
		return pt_set_error(PT_ERR_RANGE, "layers: %u layers (1 to %d)", count,
		                    PT_MAX_LAYERS);
	if ((l = calloc(count, sizeof(*l))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "layer list");
	for (uint32_t i = 0; i < count; i++) {
		const uint8_t *t = pt_fb_vec_table(vec, i);
		uint8_t kind = pt_fb_get_u8(t, PT_FB_MODEL_LAYER_KIND, 0);
		if (kind >= PT_LAYER_KIND_COUNT) {
			free(l);
			return pt_set_error(PT_ERR_INVALID,
			                    "layers[%u].kind: unknown layer kind %u", i, kind);
		}
		l[i] = (pt_layer_spec){
		    .kind = (pt_layer_kind)kind,
		    .in_features = pt_fb_get_i64(t, PT_FB_MODEL_LAYER_IN_FEATURES, 0),
		    .out_features = pt_fb_get_i64(t, PT_FB_MODEL_LAYER_OUT_FEATURES, 0),
		    .bias = pt_fb_get_bool(t, PT_FB_MODEL_LAYER_BIAS, true),
		    .dim = pt_fb_get_i64(t, PT_FB_MODEL_LAYER_DIM, 0),
		    .n_head = pt_fb_get_i32(t, PT_FB_MODEL_LAYER_N_HEAD, 0),
		    .vocab = pt_fb_get_i64(t, PT_FB_MODEL_LAYER_VOCAB, 0),
		    .max_seq = pt_fb_get_i64(t, PT_FB_MODEL_LAYER_MAX_SEQ, 0),
		    .mlp_hidden = pt_fb_get_i64(t, PT_FB_MODEL_LAYER_MLP_HIDDEN, 0),
		    .p = pt_fb_get_f32(t, PT_FB_MODEL_LAYER_P, 0.0f),
		    .eps = pt_fb_get_f32(t, PT_FB_MODEL_LAYER_EPS, 0.0f),
		};
	}
	*out = l;
	return PT_OK;
}

pt_err pt_fb_build_optimizer(pt_fb_builder *b, const pt_optim_config *o, pt_fb_ref *out)
{
	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_MODEL_OPTIMIZER_WARMUP_STEPS, o->schedule.warmup_steps, 0);
	pt_fb_add_i64(b, PT_FB_MODEL_OPTIMIZER_TOTAL_STEPS, o->schedule.total_steps, 0);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_LR, o->lr, 0.0f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_BETA1, o->beta1, 0.9f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_BETA2, o->beta2, 0.999f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_EPS, o->eps, 1e-8f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_WEIGHT_DECAY, o->weight_decay, 0.0f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_MOMENTUM, o->momentum, 0.0f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_DAMPENING, o->dampening, 0.0f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_CLIP_NORM, o->clip_norm, 0.0f);
	pt_fb_add_f32(b, PT_FB_MODEL_OPTIMIZER_MIN_LR, o->schedule.min_lr, 0.0f);
	pt_fb_add_u8(b, PT_FB_MODEL_OPTIMIZER_KIND, (uint8_t)o->kind, PT_OPTIM_ADAMW);
	pt_fb_add_bool(b, PT_FB_MODEL_OPTIMIZER_NESTEROV, o->nesterov, false);
	pt_fb_add_u8(b, PT_FB_MODEL_OPTIMIZER_SCHEDULE, (uint8_t)o->schedule.kind, 0);
	return pt_fb_end_table(b, out);
}

pt_err pt_fb_read_optimizer(const uint8_t *t, pt_optim_config *o)
{
	uint8_t kind = pt_fb_get_u8(t, PT_FB_MODEL_OPTIMIZER_KIND, PT_OPTIM_ADAMW);
	uint8_t sched = pt_fb_get_u8(t, PT_FB_MODEL_OPTIMIZER_SCHEDULE, 0);
	if (kind > PT_OPTIM_ADAMW)
		return pt_set_error(PT_ERR_INVALID, "optimizer.kind: unknown optimizer %u", kind);
	if (sched > PT_SCHED_WARMUP_COSINE)
		return pt_set_error(PT_ERR_INVALID, "optimizer.schedule: unknown schedule %u",
		                    sched);
	*o = (pt_optim_config){
	    .kind = (pt_optim_kind)kind,
	    .lr = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_LR, 0.0f),
	    .beta1 = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_BETA1, 0.9f),
	    .beta2 = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_BETA2, 0.999f),
	    .eps = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_EPS, 1e-8f),
	    .weight_decay = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_WEIGHT_DECAY, 0.0f),
	    .momentum = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_MOMENTUM, 0.0f),
	    .dampening = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_DAMPENING, 0.0f),
	    .nesterov = pt_fb_get_bool(t, PT_FB_MODEL_OPTIMIZER_NESTEROV, false),
	    .clip_norm = pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_CLIP_NORM, 0.0f),
	    .schedule = {(pt_sched_kind)sched,
	                 pt_fb_get_i64(t, PT_FB_MODEL_OPTIMIZER_WARMUP_STEPS, 0),
	                 pt_fb_get_i64(t, PT_FB_MODEL_OPTIMIZER_TOTAL_STEPS, 0),
	                 pt_fb_get_f32(t, PT_FB_MODEL_OPTIMIZER_MIN_LR, 0.0f)},
	};
	return pt_optim_validate(o);
}

pt_err pt_fb_build_sample_shape(pt_fb_builder *b, pt_act_shape s, pt_fb_ref *out)
{
	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_MODEL_SAMPLE_SHAPE_SEQ, s.seq, 0);
	pt_fb_add_i64(b, PT_FB_MODEL_SAMPLE_SHAPE_FEATURES, s.features, 0);
	pt_fb_add_u8(b, PT_FB_MODEL_SAMPLE_SHAPE_DTYPE, (uint8_t)s.dtype, 0);
	return pt_fb_end_table(b, out);
}

pt_err pt_fb_read_sample_shape(const uint8_t *t, pt_act_shape *s)
{
	uint8_t dt = pt_fb_get_u8(t, PT_FB_MODEL_SAMPLE_SHAPE_DTYPE, 0);
	*s = (pt_act_shape){(pt_dtype)dt, pt_fb_get_i64(t, PT_FB_MODEL_SAMPLE_SHAPE_SEQ, 0),
	                    pt_fb_get_i64(t, PT_FB_MODEL_SAMPLE_SHAPE_FEATURES, 0)};
	if (!((dt == PT_F32 && s->features > 0) || (dt == PT_I64 && s->features == 0)))
		return pt_set_error(PT_ERR_INVALID,
		                    "input: samples must be f32 features or i64 tokens (dtype %u, "
		                    "features %ld)",
		                    dt, (long)s->features);
	if (s->seq < 0 || s->features < 0 || (dt == PT_I64 && s->seq <= 0))
		return pt_set_error(PT_ERR_INVALID, "input: bad sequence length %ld", (long)s->seq);
	return PT_OK;
}

pt_err pt_fb_build_stage_config(pt_fb_builder *b, const pt_stage_config *c, pt_fb_ref *out)
{
	pt_fb_ref layers = 0, input = 0, optim = 0, device = 0;
	char dev[32];
	PT_TRY(pt_fb_build_layers(b, c->layers, c->n_layers, &layers));
	/* Absent means the CPU, so a CPU stage's config is the bytes it always was. */
	if (c->device.kind != PT_DEV_CPU)
		PT_TRY(
		    pt_fb_create_cstring(b, pt_device_str(dev, sizeof(dev), c->device), &device));
	PT_TRY(pt_fb_build_sample_shape(b, c->input, &input));
	PT_TRY(pt_fb_build_optimizer(b, &c->optim, &optim));
	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_STAGE_STAGE_CONFIG_MICROBATCH, c->microbatch, 0);
	pt_fb_add_u64(b, PT_FB_STAGE_STAGE_CONFIG_SEED, c->seed, 0);
	pt_fb_add_offset(b, PT_FB_STAGE_STAGE_CONFIG_LAYERS, layers);
	pt_fb_add_offset(b, PT_FB_STAGE_STAGE_CONFIG_INPUT, input);
	pt_fb_add_offset(b, PT_FB_STAGE_STAGE_CONFIG_OPTIMIZER, optim);
	pt_fb_add_offset(b, PT_FB_STAGE_STAGE_CONFIG_DEVICE, device);
	pt_fb_add_i32(b, PT_FB_STAGE_STAGE_CONFIG_FIRST, c->first, 0);
	pt_fb_add_i32(b, PT_FB_STAGE_STAGE_CONFIG_LAST, c->last, 0);
	pt_fb_add_i32(b, PT_FB_STAGE_STAGE_CONFIG_N_SLOTS, c->n_slots, 0);
	pt_fb_add_i32(b, PT_FB_STAGE_STAGE_CONFIG_THREADS, c->threads, 0);
	pt_fb_add_u8(b, PT_FB_STAGE_STAGE_CONFIG_MODE, (uint8_t)c->mode, 0);
	pt_fb_add_u8(b, PT_FB_STAGE_STAGE_CONFIG_SCHEDULE, (uint8_t)c->schedule, 0);
	pt_fb_add_i32(b, PT_FB_STAGE_STAGE_CONFIG_MICROBATCHES, c->n_microbatches, 0);
	pt_fb_add_i32(b, PT_FB_STAGE_STAGE_CONFIG_VIRTUAL_STAGES, c->virtual_stages, 0);
	pt_fb_add_u8(b, PT_FB_STAGE_STAGE_CONFIG_PRECISION, (uint8_t)c->precision, 0);
	pt_fb_add_bool(b, PT_FB_STAGE_STAGE_CONFIG_WEIGHT_STASHING, c->weight_stashing, true);
	pt_fb_add_bool(b, PT_FB_STAGE_STAGE_CONFIG_RECOMPUTE, c->recompute, false);
	pt_fb_add_bool(b, PT_FB_STAGE_STAGE_CONFIG_USE_GRAPHS, c->use_graphs, false);
	pt_fb_add_bool(b, PT_FB_STAGE_STAGE_CONFIG_SYNC_SENDS, c->sync_sends, false);
	return pt_fb_end_table(b, out);
}

pt_err pt_fb_read_stage_config(const uint8_t *t, pt_stage_config *c, pt_layer_spec **layers)
{
	uint32_t n;
	const uint8_t *vec = pt_fb_get_vector(t, PT_FB_STAGE_STAGE_CONFIG_LAYERS, &n);
	uint8_t mode = pt_fb_get_u8(t, PT_FB_STAGE_STAGE_CONFIG_MODE, 0);
	uint8_t sched = pt_fb_get_u8(t, PT_FB_STAGE_STAGE_CONFIG_SCHEDULE, 0);
	const char *dev;
	uint32_t dev_len;
	pt_err rv;

	*layers = NULL;
	memset(c, 0, sizeof(*c));
	if (mode > PT_MODE_ASYNC)
		return pt_set_error(PT_ERR_INVALID, "mode: unknown mode %u", mode);
	if (sched >= PT_SCHED_COUNT)
		return pt_set_error(PT_ERR_INVALID, "schedule: unknown schedule %u", sched);
	PT_TRY(pt_fb_read_layers(vec, n, layers));
	c->layers = *layers;
	c->n_layers = (int)n;
	c->first = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_CONFIG_FIRST, 0);
	c->last = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_CONFIG_LAST, 0);
	c->microbatch = pt_fb_get_i64(t, PT_FB_STAGE_STAGE_CONFIG_MICROBATCH, 0);
	c->n_slots = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_CONFIG_N_SLOTS, 0);
	c->mode = (pt_pipe_mode)mode;
	c->schedule = (pt_pipe_schedule)sched;
	c->n_microbatches = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_CONFIG_MICROBATCHES, 0);
	c->virtual_stages = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_CONFIG_VIRTUAL_STAGES, 0);
	if (pt_fb_get_u8(t, PT_FB_STAGE_STAGE_CONFIG_PRECISION, 0) > PT_PREC_TF32) {
		rv = pt_set_error(PT_ERR_INVALID, "precision: unknown precision %u",
		                  pt_fb_get_u8(t, PT_FB_STAGE_STAGE_CONFIG_PRECISION, 0));
		goto fail;
	}
	c->precision = (pt_precision)pt_fb_get_u8(t, PT_FB_STAGE_STAGE_CONFIG_PRECISION, 0);
	c->seed = pt_fb_get_u64(t, PT_FB_STAGE_STAGE_CONFIG_SEED, 0);
	c->weight_stashing = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_CONFIG_WEIGHT_STASHING, true);
	c->recompute = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_CONFIG_RECOMPUTE, false);
	c->threads = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_CONFIG_THREADS, 0);
	c->use_graphs = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_CONFIG_USE_GRAPHS, false);
	c->sync_sends = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_CONFIG_SYNC_SENDS, false);
	c->device = PT_CPU;
	if ((dev = pt_fb_get_string(t, PT_FB_STAGE_STAGE_CONFIG_DEVICE, &dev_len)) != NULL &&
	    (rv = pt_device_parse(dev, &c->device)) != PT_OK) {
		rv = pt_set_error(rv, "stage config: %s", pt_last_error());
		goto fail;
	}
	if ((rv = pt_fb_read_sample_shape(pt_fb_get_table(t, PT_FB_STAGE_STAGE_CONFIG_INPUT),
	                                  &c->input)) != PT_OK ||
	    (rv = pt_fb_read_optimizer(pt_fb_get_table(t, PT_FB_STAGE_STAGE_CONFIG_OPTIMIZER),
	                               &c->optim)) != PT_OK)
		goto fail;
	if (c->first < 0 || c->last > c->n_layers || c->first >= c->last) {
		rv = pt_set_error(PT_ERR_RANGE, "stage layers [%d, %d) of %d", c->first, c->last,
		                  c->n_layers);
		goto fail;
	}
	if (c->microbatch <= 0 || c->n_slots <= 0 || c->n_slots > 4096 || c->threads < 0 ||
	    c->threads > 1024) {
		rv = pt_set_error(PT_ERR_RANGE,
		                  "stage config: microbatch %ld, n_slots %d, threads %d",
		                  (long)c->microbatch, c->n_slots, c->threads);
		goto fail;
	}
	return PT_OK;
fail:
	free(*layers);
	*layers = NULL;
	return rv;
}
