/* jobspec.c - the JobSpec table (schema/job.fbs): verifier descriptor, decode
 * into pt_job_spec, build back, and validation of everything a run needs.
 *
 * Decoding checks what a C struct cannot hold (enum ranges, vector and string
 * sizes, boundary counts) and what model_wire's readers check (optimizer
 * values); pt_job_spec_validate checks the rest, including the data files.
 * Every error message starts with the field's path in the spec.
 */
#include "job.h"
#include "job_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "model_wire.h"
#include "npy.h"
#include "tokens.h"

/* Longest string field we accept (paths, URLs, names). */
#define JOB_MAX_STRING 4096

/* Field ids and verifier descriptors: fb_schema.h, generated from schema/job.fbs. */

/* ------------------------------------------------------------- messages -- */

/* reprefix rewrites the current error message: a leading `from` becomes `to`
 * ("layer 2 (linear): ..." -> "model[2] (linear): ..."), keeping the code. */
static pt_err reprefix(pt_err rv, const char *from, const char *to)
{
	const char *msg = pt_last_error();
	size_t n = strlen(from);
	if (strncmp(msg, from, n) == 0)
		return pt_set_error(rv, "%s%s", to, msg + n);
	return rv;
}

/* model_error turns pt_model_check's "layer N" and model_wire's "layers[N]"
 * and "layers:" into the spec's "model[N]" / "model:". */
pt_err pt_job_model_error(pt_err rv)
{
	const char *msg = pt_last_error();
	int idx, used = 0;
	if (sscanf(msg, "layer %d%n", &idx, &used) == 1 && used > 0) {
		/* "layer 2 (linear): linear in_features ..." says the kind twice. */
		const char *open = msg + used, *close = strstr(open, "): ");
		if (strncmp(open, " (", 2) == 0 && close != NULL) {
			size_t k = (size_t)(close - open - 2);
			const char *rest = close + 3;
			if (strncmp(rest, open + 2, k) == 0 && rest[k] == ' ')
				return pt_set_error(rv, "model[%d] (%.*s): %s", idx, (int)k,
				                    open + 2, rest + k + 1);
		}
		return pt_set_error(rv, "model[%d]%s", idx, msg + used);
	}
	rv = reprefix(rv, "layers[", "model[");
	rv = reprefix(rv, "layers:", "model:");
	rv = reprefix(rv, "the model has no layers", "model: no layers");
	return rv;
}

/* optim_error names optimizer fields as the JobSpec does: pt_optim_validate's
 * "schedule.warmup_steps" is the Optimizer table's "optimizer.warmup_steps". */
pt_err pt_job_optim_error(pt_err rv)
{
	const char *msg = pt_last_error();
	char out[1024];
	size_t o = 0;
	for (const char *p = msg; *p && o + 16 < sizeof(out);) {
		bool qualified = p - msg >= 10 && strncmp(p - 10, "optimizer.", 10) == 0;
		if (strncmp(p, "schedule.kind", 13) == 0 && !qualified) {
			o += (size_t)snprintf(out + o, sizeof(out) - o, "optimizer.schedule");
			p += 13;
		} else if (strncmp(p, "schedule.", 9) == 0 && !qualified) {
			o += (size_t)snprintf(out + o, sizeof(out) - o, "optimizer.");
			p += 9;
		} else {
			out[o++] = *p++;
		}
	}
	out[o] = 0;
	if (strncmp(out, "optimizer.", 10) != 0)
		return pt_set_error(rv, "optimizer: %s", out);
	return pt_set_error(rv, "%s", out);
}

/* --------------------------------------------------------------- decode -- */

void pt_job_spec_defaults(pt_job_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->data.held_out = 0.2f;
	s->data.shuffle = true;
	s->loss = PT_LOSS_CROSS_ENTROPY;
	s->ignore_index = -1;
	s->optim =
	    (pt_optim_config){.kind = PT_OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
	s->microbatches = 1;
	s->mode = PT_MODE_SYNC;
	s->stages = 1;
	s->checkpoint_keep = 3;
	s->resume = true;
	s->seed = 1;
	s->weight_stashing = true;
	s->worker_timeout_ms = PT_JOB_WORKER_TIMEOUT_MS;
}

void pt_job_spec_fini(pt_job_spec *s)
{
	if (s == NULL)
		return;
	free(s->name);
	free(s->layers);
	free(s->data.features);
	free(s->data.labels);
	free(s->data.tokens);
	free(s->data.val_tokens);
	free(s->boundaries);
	for (int i = 0; i < s->n_workers; i++)
		free(s->workers[i]);
	free(s->workers);
	free(s->device);
	free(s->init_from);
	free(s->schedule);
	free(s->precision);
	memset(s, 0, sizeof(*s));
}

/* copy_string copies a verified string field (absent: *out stays NULL). */
static pt_err copy_string(const char *str, uint32_t len, const char *field, char **out)
{
	*out = NULL;
	if (str == NULL)
		return PT_OK;
	if (len > JOB_MAX_STRING)
		return pt_set_error(PT_ERR_RANGE, "%s: %u bytes (at most %d)", field, len,
		                    JOB_MAX_STRING);
	if (memchr(str, 0, len) != NULL)
		return pt_set_error(PT_ERR_INVALID, "%s: contains a NUL byte", field);
	if ((*out = malloc((size_t)len + 1)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", field);
	memcpy(*out, str, len);
	(*out)[len] = 0;
	return PT_OK;
}

static pt_err read_string(const uint8_t *t, uint16_t id, const char *field, char **out)
{
	uint32_t len = 0;
	const char *str = t ? pt_fb_get_string(t, id, &len) : NULL;
	return copy_string(str, len, field, out);
}

static pt_err read_data(const uint8_t *t, pt_job_spec *s)
{
	uint8_t fmt = pt_fb_get_u8(t, PT_FB_JOB_DATA_FORMAT, 0);
	if (fmt > PT_DATA_AUTO)
		return pt_set_error(PT_ERR_INVALID, "data.format: unknown data format %u", fmt);
	s->data.format = (pt_data_format)fmt;
	s->data.seq_len = pt_fb_get_i64(t, PT_FB_JOB_DATA_SEQ_LEN, 0);
	s->data.vocab = pt_fb_get_i64(t, PT_FB_JOB_DATA_VOCAB, 0);
	s->data.held_out = pt_fb_get_f32(t, PT_FB_JOB_DATA_HELD_OUT, 0.2f);
	s->data.shuffle = pt_fb_get_bool(t, PT_FB_JOB_DATA_SHUFFLE, true);
	PT_TRY(read_string(t, PT_FB_JOB_DATA_FEATURES, "data.features", &s->data.features));
	PT_TRY(read_string(t, PT_FB_JOB_DATA_LABELS, "data.labels", &s->data.labels));
	PT_TRY(read_string(t, PT_FB_JOB_DATA_TOKENS, "data.tokens", &s->data.tokens));
	return read_string(t, PT_FB_JOB_DATA_VAL_TOKENS, "data.val_tokens", &s->data.val_tokens);
}

static pt_err read_placement(const uint8_t *t, pt_job_spec *s)
{
	uint32_t nb = 0, nw = 0;
	const uint8_t *bv = NULL, *wv = NULL;

	s->stages = 1;
	s->worker_timeout_ms = PT_JOB_WORKER_TIMEOUT_MS;
	if (t == NULL)
		return PT_OK;
	s->stages = pt_fb_get_i32(t, PT_FB_JOB_PLACEMENT_STAGES, 1);
	s->threads_per_stage = pt_fb_get_i32(t, PT_FB_JOB_PLACEMENT_THREADS_PER_STAGE, 0);
	s->worker_timeout_ms =
	    pt_fb_get_i32(t, PT_FB_JOB_PLACEMENT_WORKER_TIMEOUT_MS, PT_JOB_WORKER_TIMEOUT_MS);
	bv = pt_fb_get_vector(t, PT_FB_JOB_PLACEMENT_BOUNDARIES, &nb);
	wv = pt_fb_get_vector(t, PT_FB_JOB_PLACEMENT_WORKERS, &nw);
	if (bv != NULL) {
		/* The schema lists the first layer of each stage after the first;
		 * the struct holds all stages + 1 edges. */
		if (s->stages < 1 || s->stages > PT_MAX_STAGES)
			return pt_set_error(PT_ERR_RANGE, "placement.stages: %d (1 to %d)",
			                    s->stages, PT_MAX_STAGES);
		if (nb != (uint32_t)s->stages - 1)
			return pt_set_error(PT_ERR_INVALID,
			                    "placement.boundaries: %u entries for %d stages "
			                    "(expected %d)",
			                    nb, s->stages, s->stages - 1);
		if ((s->boundaries = malloc(sizeof(int) * ((size_t)s->stages + 1))) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "placement.boundaries");
		s->boundaries[0] = 0;
		for (uint32_t i = 0; i < nb; i++)
			s->boundaries[i + 1] = pt_fb_load_i32(bv + 4u * i);
		s->boundaries[s->stages] = s->n_layers;
	}
	if (wv != NULL && nw > 0) {
		if (nw > PT_MAX_STAGES)
			return pt_set_error(PT_ERR_RANGE, "placement.workers: %u URLs (at most %d)",
			                    nw, PT_MAX_STAGES);
		if ((s->workers = calloc(nw, sizeof(char *))) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "placement.workers");
		s->n_workers = (int)nw;
		for (uint32_t i = 0; i < nw; i++) {
			uint32_t len;
			const char *str = pt_fb_vec_string(wv, i, &len);
			char field[48];
			snprintf(field, sizeof(field), "placement.workers[%u]", i);
			PT_TRY(copy_string(str, len, field, &s->workers[i]));
		}
	}
	return PT_OK;
}

static pt_err read_spec(const uint8_t *t, pt_job_spec *s)
{
	uint32_t n;
	const uint8_t *model = pt_fb_get_vector(t, PT_FB_JOB_JOB_SPEC_MODEL, &n);
	const uint8_t *ck = pt_fb_get_table(t, PT_FB_JOB_JOB_SPEC_CHECKPOINT);
	uint8_t loss = pt_fb_get_u8(t, PT_FB_JOB_JOB_SPEC_LOSS, 0),
	        mode = pt_fb_get_u8(t, PT_FB_JOB_JOB_SPEC_MODE, 0);
	pt_err rv;

	if (model == NULL)
		return pt_set_error(PT_ERR_INVALID, "model: required field missing");
	if ((rv = pt_fb_read_layers(model, n, &s->layers)) != PT_OK)
		return pt_job_model_error(rv);
	s->n_layers = (int)n;
	if (loss > PT_LOSS_MSE)
		return pt_set_error(PT_ERR_INVALID, "loss: unknown loss kind %u", loss);
	if (mode > PT_MODE_ASYNC)
		return pt_set_error(PT_ERR_INVALID, "mode: unknown mode %u", mode);
	s->loss = (pt_loss_kind)loss;
	s->mode = (pt_pipe_mode)mode;
	s->ignore_index = pt_fb_get_i64(t, PT_FB_JOB_JOB_SPEC_IGNORE_INDEX, -1);
	s->batch_size = pt_fb_get_i64(t, PT_FB_JOB_JOB_SPEC_BATCH_SIZE, 0);
	s->microbatches = pt_fb_get_i32(t, PT_FB_JOB_JOB_SPEC_MICROBATCHES, 1);
	s->steps = pt_fb_get_i64(t, PT_FB_JOB_JOB_SPEC_STEPS, 0);
	s->seed = pt_fb_get_u64(t, PT_FB_JOB_JOB_SPEC_SEED, 1);
	s->eval_every = pt_fb_get_i64(t, PT_FB_JOB_JOB_SPEC_EVAL_EVERY, 0);
	s->compress = pt_fb_get_bool(t, PT_FB_JOB_JOB_SPEC_COMPRESS, false);
	s->recompute = pt_fb_get_bool(t, PT_FB_JOB_JOB_SPEC_RECOMPUTE, false);
	s->weight_stashing = pt_fb_get_bool(t, PT_FB_JOB_JOB_SPEC_WEIGHT_STASHING, true);
	s->use_graphs = pt_fb_get_bool(t, PT_FB_JOB_JOB_SPEC_USE_GRAPHS, false);
	s->max_restarts = pt_fb_get_i32(t, PT_FB_JOB_JOB_SPEC_MAX_RESTARTS, 0);
	s->priority = pt_fb_get_i32(t, PT_FB_JOB_JOB_SPEC_PRIORITY, 0);
	s->virtual_stages = pt_fb_get_i32(t, PT_FB_JOB_JOB_SPEC_VIRTUAL_STAGES, 0);
	s->checkpoint_every =
	    ck ? pt_fb_get_i64(ck, PT_FB_JOB_CHECKPOINT_POLICY_EVERY_STEPS, 0) : 0;
	s->checkpoint_keep = ck ? pt_fb_get_i32(ck, PT_FB_JOB_CHECKPOINT_POLICY_KEEP, 3) : 3;
	s->resume = ck ? pt_fb_get_bool(ck, PT_FB_JOB_CHECKPOINT_POLICY_RESUME, true) : true;
	if ((rv = pt_fb_read_optimizer(pt_fb_get_table(t, PT_FB_JOB_JOB_SPEC_OPTIMIZER),
	                               &s->optim)) != PT_OK)
		return pt_job_optim_error(rv);
	PT_TRY(read_data(pt_fb_get_table(t, PT_FB_JOB_JOB_SPEC_DATA), s));
	PT_TRY(read_placement(pt_fb_get_table(t, PT_FB_JOB_JOB_SPEC_PLACEMENT), s));
	PT_TRY(read_string(t, PT_FB_JOB_JOB_SPEC_NAME, "name", &s->name));
	PT_TRY(read_string(t, PT_FB_JOB_JOB_SPEC_DEVICE, "device", &s->device));
	PT_TRY(read_string(t, PT_FB_JOB_JOB_SPEC_SCHEDULE, "schedule", &s->schedule));
	PT_TRY(read_string(t, PT_FB_JOB_JOB_SPEC_PRECISION, "precision", &s->precision));
	return read_string(t, PT_FB_JOB_JOB_SPEC_INIT_FROM, "init_from", &s->init_from);
}

pt_err pt_job_spec_read(const uint8_t *table, pt_job_spec *out)
{
	pt_err rv;
	pt_job_spec_defaults(out);
	if (table == NULL)
		return pt_set_error(PT_ERR_INVALID, "JobSpec: no table");
	if ((rv = read_spec(table, out)) != PT_OK)
		pt_job_spec_fini(out);
	return rv;
}

pt_err pt_job_spec_decode(const void *buf, size_t len, pt_job_spec *out)
{
	pt_err rv;
	pt_job_spec_defaults(out);
	if (buf == NULL)
		return pt_set_error(PT_ERR_INVALID, "JobSpec: no buffer");
	if ((rv = pt_fb_verify(buf, len, &pt_fb_job_job_spec_desc, NULL, NULL)) != PT_OK)
		return rv;
	return pt_job_spec_read(pt_fb_root(buf), out);
}

/* ---------------------------------------------------------------- build -- */

static pt_err build_string(pt_fb_builder *b, const char *s, pt_fb_ref *out)
{
	*out = 0;
	return s ? pt_fb_create_cstring(b, s, out) : PT_OK;
}

pt_err pt_job_spec_build(pt_fb_builder *b, const pt_job_spec *s, pt_fb_ref *out)
{
	pt_fb_ref name, model, data, optim, placement, ck, device, feat, lab, tok, val_tok,
	    init_from, schedule, precision;
	pt_fb_ref bounds = 0, workers = 0;

	*out = 0;
	if (s->n_layers < 1 || s->n_layers > PT_MAX_LAYERS || s->layers == NULL)
		return pt_set_error(PT_ERR_INVALID, "model: %d layers (1 to %d)", s->n_layers,
		                    PT_MAX_LAYERS);
	if (s->n_workers < 0 || (s->n_workers > 0 && s->workers == NULL))
		return pt_set_error(PT_ERR_INVALID, "placement.workers: %d URLs", s->n_workers);
	if (s->boundaries != NULL) {
		/* Only the inner edges travel; the outer ones are implied. */
		if (s->stages < 1 || s->stages > PT_MAX_STAGES)
			return pt_set_error(PT_ERR_RANGE, "placement.stages: %d (1 to %d)",
			                    s->stages, PT_MAX_STAGES);
		if (s->boundaries[0] != 0 || s->boundaries[s->stages] != s->n_layers)
			return pt_set_error(PT_ERR_INVALID,
			                    "placement.boundaries: must start at 0 and end at %d "
			                    "(the layer count)",
			                    s->n_layers);
		PT_TRY(pt_fb_create_vector(b, s->boundaries + 1, (size_t)s->stages - 1,
		                           sizeof(int32_t), 0, &bounds));
	}
	if (s->workers != NULL && s->n_workers > 0) {
		pt_fb_ref refs[PT_MAX_STAGES];
		if (s->n_workers > PT_MAX_STAGES)
			return pt_set_error(PT_ERR_RANGE, "placement.workers: %d URLs (at most %d)",
			                    s->n_workers, PT_MAX_STAGES);
		for (int i = 0; i < s->n_workers; i++) {
			if (s->workers[i] == NULL)
				return pt_set_error(PT_ERR_INVALID, "placement.workers[%d]: NULL",
				                    i);
			PT_TRY(pt_fb_create_cstring(b, s->workers[i], &refs[i]));
		}
		PT_TRY(pt_fb_create_ref_vector(b, refs, (size_t)s->n_workers, &workers));
	}
	PT_TRY(pt_fb_build_layers(b, s->layers, s->n_layers, &model));
	PT_TRY(pt_fb_build_optimizer(b, &s->optim, &optim));
	PT_TRY(build_string(b, s->data.features, &feat));
	PT_TRY(build_string(b, s->data.labels, &lab));
	PT_TRY(build_string(b, s->data.tokens, &tok));
	PT_TRY(build_string(b, s->data.val_tokens, &val_tok));
	PT_TRY(build_string(b, s->name, &name));
	PT_TRY(build_string(b, s->device, &device));
	PT_TRY(build_string(b, s->init_from, &init_from));
	PT_TRY(build_string(b, s->schedule, &schedule));
	PT_TRY(build_string(b, s->precision, &precision));

	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_JOB_DATA_SEQ_LEN, s->data.seq_len, 0);
	pt_fb_add_i64(b, PT_FB_JOB_DATA_VOCAB, s->data.vocab, 0);
	pt_fb_add_offset(b, PT_FB_JOB_DATA_FEATURES, feat);
	pt_fb_add_offset(b, PT_FB_JOB_DATA_LABELS, lab);
	pt_fb_add_offset(b, PT_FB_JOB_DATA_TOKENS, tok);
	pt_fb_add_offset(b, PT_FB_JOB_DATA_VAL_TOKENS, val_tok);
	pt_fb_add_f32(b, PT_FB_JOB_DATA_HELD_OUT, s->data.held_out, 0.2f);
	pt_fb_add_u8(b, PT_FB_JOB_DATA_FORMAT, (uint8_t)s->data.format, 0);
	pt_fb_add_bool(b, PT_FB_JOB_DATA_SHUFFLE, s->data.shuffle, true);
	PT_TRY(pt_fb_end_table(b, &data));

	pt_fb_start_table(b);
	pt_fb_add_offset(b, PT_FB_JOB_PLACEMENT_BOUNDARIES, bounds);
	pt_fb_add_offset(b, PT_FB_JOB_PLACEMENT_WORKERS, workers);
	pt_fb_add_i32(b, PT_FB_JOB_PLACEMENT_STAGES, s->stages, 1);
	pt_fb_add_i32(b, PT_FB_JOB_PLACEMENT_THREADS_PER_STAGE, s->threads_per_stage, 0);
	pt_fb_add_i32(b, PT_FB_JOB_PLACEMENT_WORKER_TIMEOUT_MS, s->worker_timeout_ms,
	              PT_JOB_WORKER_TIMEOUT_MS);
	PT_TRY(pt_fb_end_table(b, &placement));

	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_JOB_CHECKPOINT_POLICY_EVERY_STEPS, s->checkpoint_every, 0);
	pt_fb_add_i32(b, PT_FB_JOB_CHECKPOINT_POLICY_KEEP, s->checkpoint_keep, 3);
	pt_fb_add_bool(b, PT_FB_JOB_CHECKPOINT_POLICY_RESUME, s->resume, true);
	PT_TRY(pt_fb_end_table(b, &ck));

	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_JOB_JOB_SPEC_IGNORE_INDEX, s->ignore_index, -1);
	pt_fb_add_i64(b, PT_FB_JOB_JOB_SPEC_BATCH_SIZE, s->batch_size, 0);
	pt_fb_add_i64(b, PT_FB_JOB_JOB_SPEC_STEPS, s->steps, 0);
	pt_fb_add_u64(b, PT_FB_JOB_JOB_SPEC_SEED, s->seed, 1);
	pt_fb_add_i64(b, PT_FB_JOB_JOB_SPEC_EVAL_EVERY, s->eval_every, 0);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_NAME, name);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_MODEL, model);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_DATA, data);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_OPTIMIZER, optim);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_PLACEMENT, placement);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_CHECKPOINT, ck);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_DEVICE, device);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_INIT_FROM, init_from);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_SCHEDULE, schedule);
	pt_fb_add_offset(b, PT_FB_JOB_JOB_SPEC_PRECISION, precision);
	pt_fb_add_i32(b, PT_FB_JOB_JOB_SPEC_MICROBATCHES, s->microbatches, 1);
	pt_fb_add_i32(b, PT_FB_JOB_JOB_SPEC_MAX_RESTARTS, s->max_restarts, 0);
	pt_fb_add_i32(b, PT_FB_JOB_JOB_SPEC_PRIORITY, s->priority, 0);
	pt_fb_add_i32(b, PT_FB_JOB_JOB_SPEC_VIRTUAL_STAGES, s->virtual_stages, 0);
	pt_fb_add_u8(b, PT_FB_JOB_JOB_SPEC_LOSS, (uint8_t)s->loss, 0);
	pt_fb_add_u8(b, PT_FB_JOB_JOB_SPEC_MODE, (uint8_t)s->mode, 0);
	pt_fb_add_bool(b, PT_FB_JOB_JOB_SPEC_COMPRESS, s->compress, false);
	pt_fb_add_bool(b, PT_FB_JOB_JOB_SPEC_RECOMPUTE, s->recompute, false);
	pt_fb_add_bool(b, PT_FB_JOB_JOB_SPEC_WEIGHT_STASHING, s->weight_stashing, true);
	pt_fb_add_bool(b, PT_FB_JOB_JOB_SPEC_USE_GRAPHS, s->use_graphs, false);
	return pt_fb_end_table(b, out);
}
