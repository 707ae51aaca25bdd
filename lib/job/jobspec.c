/* jobspec.c - the JobSpec table (schema/job.fbs): verifier descriptor, decode
 * into pt_job_spec, build back, and validation of everything a run needs.
 *
 * Decoding checks what a C struct cannot hold (enum ranges, vector and string
 * sizes, boundary counts) and what model_wire's readers check (optimizer
 * values); pt_job_spec_validate checks the rest, including the data files.
 * Every error message starts with the field's path in the spec.
 */
#include "job.h"

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

enum { D_FORMAT, D_FEATURES, D_LABELS, D_TOKENS, D_SEQ_LEN, D_VOCAB, D_HELD_OUT, D_SHUFFLE };
enum { P_STAGES, P_BOUNDARIES, P_WORKERS, P_THREADS };
enum { K_EVERY, K_KEEP, K_RESUME };
enum {
	J_NAME,
	J_MODEL,
	J_DATA,
	J_LOSS,
	J_IGNORE,
	J_OPTIMIZER,
	J_BATCH,
	J_MICRO,
	J_STEPS,
	J_MODE,
	J_PLACEMENT,
	J_CHECKPOINT,
	J_DEVICE,
	J_SEED,
	J_EVAL,
	J_COMPRESS,
	J_RECOMPUTE,
	J_STASH
};

static const pt_fb_field_desc data_fields[] = {
    PT_FB_FIELD_SCALAR(D_FORMAT, "format", 1),
    PT_FB_FIELD_STRING(D_FEATURES, "features", false),
    PT_FB_FIELD_STRING(D_LABELS, "labels", false),
    PT_FB_FIELD_STRING(D_TOKENS, "tokens", false),
    PT_FB_FIELD_SCALAR(D_SEQ_LEN, "seq_len", 8),
    PT_FB_FIELD_SCALAR(D_VOCAB, "vocab", 8),
    PT_FB_FIELD_SCALAR(D_HELD_OUT, "held_out", 4),
    PT_FB_FIELD_SCALAR(D_SHUFFLE, "shuffle", 1),
};
static const pt_fb_table_desc data_desc = PT_FB_TABLE_DESC("Data", data_fields);

static const pt_fb_field_desc placement_fields[] = {
    PT_FB_FIELD_SCALAR(P_STAGES, "stages", 4),
    PT_FB_FIELD_VECTOR(P_BOUNDARIES, "boundaries", 4, 4, false),
    PT_FB_FIELD_VECTOR_STRING(P_WORKERS, "workers", false),
    PT_FB_FIELD_SCALAR(P_THREADS, "threads_per_stage", 4),
};
static const pt_fb_table_desc placement_desc = PT_FB_TABLE_DESC("Placement", placement_fields);

static const pt_fb_field_desc checkpoint_fields[] = {
    PT_FB_FIELD_SCALAR(K_EVERY, "every_steps", 8),
    PT_FB_FIELD_SCALAR(K_KEEP, "keep", 4),
    PT_FB_FIELD_SCALAR(K_RESUME, "resume", 1),
};
static const pt_fb_table_desc checkpoint_desc =
    PT_FB_TABLE_DESC("CheckpointPolicy", checkpoint_fields);

static const pt_fb_field_desc job_fields[] = {
    PT_FB_FIELD_STRING(J_NAME, "name", false),
    PT_FB_FIELD_VECTOR_TABLE(J_MODEL, "model", &pt_fb_layer_desc, true),
    PT_FB_FIELD_TABLE(J_DATA, "data", &data_desc, true),
    PT_FB_FIELD_SCALAR(J_LOSS, "loss", 1),
    PT_FB_FIELD_SCALAR(J_IGNORE, "ignore_index", 8),
    PT_FB_FIELD_TABLE(J_OPTIMIZER, "optimizer", &pt_fb_optimizer_desc, true),
    PT_FB_FIELD_SCALAR(J_BATCH, "batch_size", 8),
    PT_FB_FIELD_SCALAR(J_MICRO, "microbatches", 4),
    PT_FB_FIELD_SCALAR(J_STEPS, "steps", 8),
    PT_FB_FIELD_SCALAR(J_MODE, "mode", 1),
    PT_FB_FIELD_TABLE(J_PLACEMENT, "placement", &placement_desc, false),
    PT_FB_FIELD_TABLE(J_CHECKPOINT, "checkpoint", &checkpoint_desc, false),
    PT_FB_FIELD_STRING(J_DEVICE, "device", false),
    PT_FB_FIELD_SCALAR(J_SEED, "seed", 8),
    PT_FB_FIELD_SCALAR(J_EVAL, "eval_every", 8),
    PT_FB_FIELD_SCALAR(J_COMPRESS, "compress", 1),
    PT_FB_FIELD_SCALAR(J_RECOMPUTE, "recompute", 1),
    PT_FB_FIELD_SCALAR(J_STASH, "weight_stashing", 1),
};
const pt_fb_table_desc pt_fb_job_spec_desc = PT_FB_TABLE_DESC("JobSpec", job_fields);

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
static pt_err model_error(pt_err rv)
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
static pt_err optim_error(pt_err rv)
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
	free(s->boundaries);
	for (int i = 0; i < s->n_workers; i++)
		free(s->workers[i]);
	free(s->workers);
	free(s->device);
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
	uint8_t fmt = pt_fb_get_u8(t, D_FORMAT, 0);
	if (fmt > PT_DATA_TOKENS32)
		return pt_set_error(PT_ERR_INVALID, "data.format: unknown data format %u", fmt);
	s->data.format = (pt_data_format)fmt;
	s->data.seq_len = pt_fb_get_i64(t, D_SEQ_LEN, 0);
	s->data.vocab = pt_fb_get_i64(t, D_VOCAB, 0);
	s->data.held_out = pt_fb_get_f32(t, D_HELD_OUT, 0.2f);
	s->data.shuffle = pt_fb_get_bool(t, D_SHUFFLE, true);
	PT_TRY(read_string(t, D_FEATURES, "data.features", &s->data.features));
	PT_TRY(read_string(t, D_LABELS, "data.labels", &s->data.labels));
	return read_string(t, D_TOKENS, "data.tokens", &s->data.tokens);
}

static pt_err read_placement(const uint8_t *t, pt_job_spec *s)
{
	uint32_t nb = 0, nw = 0;
	const uint8_t *bv = NULL, *wv = NULL;

	s->stages = 1;
	if (t == NULL)
		return PT_OK;
	s->stages = pt_fb_get_i32(t, P_STAGES, 1);
	s->threads_per_stage = pt_fb_get_i32(t, P_THREADS, 0);
	bv = pt_fb_get_vector(t, P_BOUNDARIES, &nb);
	wv = pt_fb_get_vector(t, P_WORKERS, &nw);
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
	const uint8_t *model = pt_fb_get_vector(t, J_MODEL, &n);
	const uint8_t *ck = pt_fb_get_table(t, J_CHECKPOINT);
	uint8_t loss = pt_fb_get_u8(t, J_LOSS, 0), mode = pt_fb_get_u8(t, J_MODE, 0);
	pt_err rv;

	if (model == NULL)
		return pt_set_error(PT_ERR_INVALID, "model: required field missing");
	if ((rv = pt_fb_read_layers(model, n, &s->layers)) != PT_OK)
		return model_error(rv);
	s->n_layers = (int)n;
	if (loss > PT_LOSS_MSE)
		return pt_set_error(PT_ERR_INVALID, "loss: unknown loss kind %u", loss);
	if (mode > PT_MODE_ASYNC)
		return pt_set_error(PT_ERR_INVALID, "mode: unknown mode %u", mode);
	s->loss = (pt_loss_kind)loss;
	s->mode = (pt_pipe_mode)mode;
	s->ignore_index = pt_fb_get_i64(t, J_IGNORE, -1);
	s->batch_size = pt_fb_get_i64(t, J_BATCH, 0);
	s->microbatches = pt_fb_get_i32(t, J_MICRO, 1);
	s->steps = pt_fb_get_i64(t, J_STEPS, 0);
	s->seed = pt_fb_get_u64(t, J_SEED, 1);
	s->eval_every = pt_fb_get_i64(t, J_EVAL, 0);
	s->compress = pt_fb_get_bool(t, J_COMPRESS, false);
	s->recompute = pt_fb_get_bool(t, J_RECOMPUTE, false);
	s->weight_stashing = pt_fb_get_bool(t, J_STASH, true);
	s->checkpoint_every = ck ? pt_fb_get_i64(ck, K_EVERY, 0) : 0;
	s->checkpoint_keep = ck ? pt_fb_get_i32(ck, K_KEEP, 3) : 3;
	s->resume = ck ? pt_fb_get_bool(ck, K_RESUME, true) : true;
	if ((rv = pt_fb_read_optimizer(pt_fb_get_table(t, J_OPTIMIZER), &s->optim)) != PT_OK)
		return optim_error(rv);
	PT_TRY(read_data(pt_fb_get_table(t, J_DATA), s));
	PT_TRY(read_placement(pt_fb_get_table(t, J_PLACEMENT), s));
	PT_TRY(read_string(t, J_NAME, "name", &s->name));
	return read_string(t, J_DEVICE, "device", &s->device);
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
	if ((rv = pt_fb_verify(buf, len, &pt_fb_job_spec_desc, NULL, NULL)) != PT_OK)
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
	pt_fb_ref name, model, data, optim, placement, ck, device, feat, lab, tok;
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
	PT_TRY(build_string(b, s->name, &name));
	PT_TRY(build_string(b, s->device, &device));

	pt_fb_start_table(b);
	pt_fb_add_i64(b, D_SEQ_LEN, s->data.seq_len, 0);
	pt_fb_add_i64(b, D_VOCAB, s->data.vocab, 0);
	pt_fb_add_offset(b, D_FEATURES, feat);
	pt_fb_add_offset(b, D_LABELS, lab);
	pt_fb_add_offset(b, D_TOKENS, tok);
	pt_fb_add_f32(b, D_HELD_OUT, s->data.held_out, 0.2f);
	pt_fb_add_u8(b, D_FORMAT, (uint8_t)s->data.format, 0);
	pt_fb_add_bool(b, D_SHUFFLE, s->data.shuffle, true);
	PT_TRY(pt_fb_end_table(b, &data));

	pt_fb_start_table(b);
	pt_fb_add_offset(b, P_BOUNDARIES, bounds);
	pt_fb_add_offset(b, P_WORKERS, workers);
	pt_fb_add_i32(b, P_STAGES, s->stages, 1);
	pt_fb_add_i32(b, P_THREADS, s->threads_per_stage, 0);
	PT_TRY(pt_fb_end_table(b, &placement));

	pt_fb_start_table(b);
	pt_fb_add_i64(b, K_EVERY, s->checkpoint_every, 0);
	pt_fb_add_i32(b, K_KEEP, s->checkpoint_keep, 3);
	pt_fb_add_bool(b, K_RESUME, s->resume, true);
	PT_TRY(pt_fb_end_table(b, &ck));

	pt_fb_start_table(b);
	pt_fb_add_i64(b, J_IGNORE, s->ignore_index, -1);
	pt_fb_add_i64(b, J_BATCH, s->batch_size, 0);
	pt_fb_add_i64(b, J_STEPS, s->steps, 0);
	pt_fb_add_u64(b, J_SEED, s->seed, 1);
	pt_fb_add_i64(b, J_EVAL, s->eval_every, 0);
	pt_fb_add_offset(b, J_NAME, name);
	pt_fb_add_offset(b, J_MODEL, model);
	pt_fb_add_offset(b, J_DATA, data);
	pt_fb_add_offset(b, J_OPTIMIZER, optim);
	pt_fb_add_offset(b, J_PLACEMENT, placement);
	pt_fb_add_offset(b, J_CHECKPOINT, ck);
	pt_fb_add_offset(b, J_DEVICE, device);
	pt_fb_add_i32(b, J_MICRO, s->microbatches, 1);
	pt_fb_add_u8(b, J_LOSS, (uint8_t)s->loss, 0);
	pt_fb_add_u8(b, J_MODE, (uint8_t)s->mode, 0);
	pt_fb_add_bool(b, J_COMPRESS, s->compress, false);
	pt_fb_add_bool(b, J_RECOMPUTE, s->recompute, false);
	pt_fb_add_bool(b, J_STASH, s->weight_stashing, true);
	return pt_fb_end_table(b, out);
}

/* ------------------------------------------------------------- validate -- */

pt_act_shape pt_job_spec_input_shape(const pt_job_spec *s, int64_t n_features)
{
	if (s->data.format == PT_DATA_NPY)
		return (pt_act_shape){PT_F32, 0, n_features};
	return (pt_act_shape){PT_I64, s->data.seq_len, 0};
}

/* resolve joins files_root and a relative path into buf. */
static const char *resolve(char *buf, size_t cap, const char *root, const char *path)
{
	if (root == NULL || root[0] == 0 || path[0] == '/')
		return path;
	snprintf(buf, cap, "%s/%s", root, path);
	return buf;
}

/* check_readable reports a missing or unreadable file under the field's name. */
static pt_err check_readable(const char *field, const char *shown, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return pt_set_error(PT_ERR_IO, "%s: cannot open '%s': %s", field, shown,
		                    strerror(errno));
	close(fd);
	return PT_OK;
}

/* output_shape runs the layers' shape inference (pt_model_check passed). */
static pt_act_shape output_shape(const pt_job_spec *s, pt_act_shape in)
{
	pt_act_shape cur = in;
	for (int i = 0; i < s->n_layers; i++) {
		pt_act_shape next = cur;
		pt_layer_vtable(s->layers[i].kind)->infer(&s->layers[i], cur, &next);
		cur = next;
	}
	return cur;
}

static pt_err check_model(const pt_job_spec *s, pt_act_shape in)
{
	pt_err rv = pt_model_check(s->layers, s->n_layers, in);
	return rv == PT_OK ? PT_OK : model_error(rv);
}

static bool is_int_dtype(pt_dtype dt)
{
	return dt == PT_I32 || dt == PT_I64 || dt == PT_U8 || dt == PT_U16 || dt == PT_U32;
}

static pt_err validate_npy(const pt_job_spec *s, const char *root)
{
	char fb[4096], lb[4096], shape[64];
	const char *fpath, *lpath;
	pt_tensor x = {0}, y = {0};
	pt_act_shape out;
	int64_t n, f, train;
	pt_err rv;

	if (s->data.features == NULL || s->data.features[0] == 0)
		return pt_set_error(PT_ERR_INVALID, "data.features: required for the Npy format");
	if (s->data.labels == NULL || s->data.labels[0] == 0)
		return pt_set_error(PT_ERR_INVALID, "data.labels: required for the Npy format");
	if (s->data.tokens != NULL)
		return pt_set_error(PT_ERR_INVALID, "data.tokens: only for the Tokens formats");
	if (!(s->data.held_out >= 0.0f && s->data.held_out < 1.0f))
		return pt_set_error(PT_ERR_RANGE, "data.held_out: %g is not in [0, 1)",
		                    (double)s->data.held_out);
	fpath = resolve(fb, sizeof(fb), root, s->data.features);
	lpath = resolve(lb, sizeof(lb), root, s->data.labels);
	PT_TRY(check_readable("data.features", s->data.features, fpath));
	PT_TRY(check_readable("data.labels", s->data.labels, lpath));
	if ((rv = pt_npy_read(&x, fpath)) != PT_OK)
		return pt_set_error(rv, "data.features: %s", pt_last_error());
	if ((rv = pt_npy_read(&y, lpath)) != PT_OK) {
		pt_set_error(rv, "data.labels: %s", pt_last_error());
		goto out;
	}
	if (x.ndim != 2 || x.shape[0] < 1 || x.shape[1] < 1 ||
	    !(x.dtype == PT_F32 || x.dtype == PT_F64 || x.dtype == PT_F16 ||
	      is_int_dtype(x.dtype))) {
		rv = pt_set_error(PT_ERR_SHAPE,
		                  "data.features: '%s' is %s %s; expected (N, F) numbers",
		                  s->data.features, pt_dtype_name(x.dtype),
		                  pt_shape_str(shape, sizeof(shape), x.ndim, x.shape));
		goto out;
	}
	n = x.shape[0];
	f = x.shape[1];
	if ((rv = check_model(s, pt_job_spec_input_shape(s, f))) != PT_OK)
		goto out;
	out = output_shape(s, pt_job_spec_input_shape(s, f));
	if (y.ndim < 1 || y.shape[0] != n) {
		rv = pt_set_error(
		    PT_ERR_SHAPE, "data.labels: %s rows for %ld samples of data.features",
		    y.ndim ? pt_shape_str(shape, sizeof(shape), 1, y.shape) : "no", (long)n);
		goto out;
	}
	if (s->loss == PT_LOSS_CROSS_ENTROPY) {
		if (y.ndim != 1 || !is_int_dtype(y.dtype)) {
			rv = pt_set_error(
			    PT_ERR_DTYPE,
			    "loss: CrossEntropy needs integer labels (N,); data.labels "
			    "is %s %s",
			    pt_dtype_name(y.dtype),
			    pt_shape_str(shape, sizeof(shape), y.ndim, y.shape));
			goto out;
		}
		if (out.seq != 0) {
			rv = pt_set_error(
			    PT_ERR_SHAPE,
			    "model[%d]: the model outputs a sequence; labels (N,) need "
			    "one row of logits per sample",
			    s->n_layers - 1);
			goto out;
		}
		for (int64_t i = 0; i < n; i++) {
			double v;
			pt_tensor_item(&y, i, &v);
			if ((int64_t)v == s->ignore_index)
				continue;
			if (v < 0 || v >= (double)out.features) {
				rv = pt_set_error(
				    PT_ERR_RANGE,
				    "data.labels: label %.0f at row %ld is outside the %ld "
				    "classes of model[%d]",
				    v, (long)i, (long)out.features, s->n_layers - 1);
				goto out;
			}
		}
	} else {
		if (y.ndim != 2 || is_int_dtype(y.dtype)) {
			rv = pt_set_error(
			    PT_ERR_DTYPE,
			    "loss: MSE needs float targets (N, K); data.labels is %s %s",
			    pt_dtype_name(y.dtype),
			    pt_shape_str(shape, sizeof(shape), y.ndim, y.shape));
			goto out;
		}
		if (out.seq != 0 || y.shape[1] != out.features) {
			rv = pt_set_error(PT_ERR_SHAPE,
			                  "data.labels: targets of %ld values do not match the %ld "
			                  "outputs of model[%d]",
			                  (long)y.shape[1], (long)out.features, s->n_layers - 1);
			goto out;
		}
	}
	train = n - (int64_t)floor((double)s->data.held_out * (double)n);
	if (train < s->batch_size) {
		rv = pt_set_error(PT_ERR_RANGE,
		                  "data: %ld training samples (%ld, %g held out) are fewer than "
		                  "batch_size %ld",
		                  (long)train, (long)n, (double)s->data.held_out,
		                  (long)s->batch_size);
		goto out;
	}
	rv = PT_OK;
out:
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	return rv;
}

static pt_err validate_tokens(const pt_job_spec *s, const char *root)
{
	const pt_layer_spec *emb = &s->layers[0];
	char tb[4096];
	const char *tpath;
	pt_tokens tk = {0};
	pt_act_shape in = pt_job_spec_input_shape(s, 0), out;
	int64_t vocab;
	pt_err rv;

	if (s->data.tokens == NULL || s->data.tokens[0] == 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "data.tokens: required for the Tokens16 and Tokens32 formats");
	if (s->data.features != NULL || s->data.labels != NULL)
		return pt_set_error(PT_ERR_INVALID, "data.%s: only for the Npy format",
		                    s->data.features ? "features" : "labels");
	if (s->data.seq_len <= 0)
		return pt_set_error(PT_ERR_RANGE, "data.seq_len: %ld must be > 0 for token data",
		                    (long)s->data.seq_len);
	if (s->data.vocab < 0)
		return pt_set_error(PT_ERR_RANGE, "data.vocab: %ld must be >= 0",
		                    (long)s->data.vocab);
	if (s->loss != PT_LOSS_CROSS_ENTROPY)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "loss: MSE needs float targets; token data gives integer labels");
	if (emb->kind != PT_LAYER_EMBEDDING)
		return pt_set_error(PT_ERR_INVALID,
		                    "model[0] (%s): token data needs an embedding as the first "
		                    "layer",
		                    pt_layer_kind_name(emb->kind));
	if (emb->max_seq > 0 && s->data.seq_len > emb->max_seq)
		return pt_set_error(PT_ERR_RANGE, "data.seq_len: %ld exceeds model[0].max_seq %ld",
		                    (long)s->data.seq_len, (long)emb->max_seq);
	if (s->data.vocab > emb->vocab)
		return pt_set_error(PT_ERR_RANGE,
		                    "data.vocab: %ld exceeds the embedding's vocab %ld "
		                    "(model[0].vocab)",
		                    (long)s->data.vocab, (long)emb->vocab);
	PT_TRY(check_model(s, in));
	out = output_shape(s, in);
	vocab = s->data.vocab > 0 ? s->data.vocab : emb->vocab;
	if (out.seq != s->data.seq_len || out.features < vocab)
		return pt_set_error(PT_ERR_SHAPE,
		                    "model[%d]: outputs (%ld, %ld) per sample; next-token targets "
		                    "need (%ld, >= %ld)",
		                    s->n_layers - 1, (long)out.seq, (long)out.features,
		                    (long)s->data.seq_len, (long)vocab);
	tpath = resolve(tb, sizeof(tb), root, s->data.tokens);
	PT_TRY(check_readable("data.tokens", s->data.tokens, tpath));
	rv = pt_tokens_load(&tk, tpath, s->data.format == PT_DATA_TOKENS16 ? PT_U16 : PT_U32,
	                    s->data.vocab);
	if (rv != PT_OK)
		return pt_set_error(rv, "data.tokens: %s", pt_last_error());
	if (tk.count < s->data.seq_len + 1)
		rv =
		    pt_set_error(PT_ERR_RANGE,
		                 "data.tokens: '%s' holds %ld tokens, fewer than seq_len + 1 = %ld",
		                 s->data.tokens, (long)tk.count, (long)s->data.seq_len + 1);
	else if ((int64_t)tk.max_token >= emb->vocab)
		rv = pt_set_error(PT_ERR_RANGE,
		                  "data.tokens: token %u is outside the embedding's vocab %ld "
		                  "(model[0].vocab)",
		                  tk.max_token, (long)emb->vocab);
	pt_tokens_fini(&tk);
	return rv;
}

/* validate_device accepts "cpu" and "cuda:N"; CUDA is refused in this build. */
static pt_err validate_device(const char *dev)
{
	const char *p;
	char *end;
	long n;
	if (dev == NULL || strcmp(dev, "cpu") == 0)
		return PT_OK;
	if (strncmp(dev, "cuda:", 5) != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "device: \"%s\" (expected \"cpu\" or \"cuda:N\")", dev);
	p = dev + 5;
	errno = 0;
	n = strtol(p, &end, 10);
	if (*p < '0' || *p > '9' || *end != 0 || errno != 0 || n < 0 || n > 1023)
		return pt_set_error(PT_ERR_INVALID,
		                    "device: \"%s\" (expected \"cuda:N\" with N a device number)",
		                    dev);
	return pt_set_error(PT_ERR_UNSUPPORTED, "device: %s is not available (built without CUDA)",
	                    dev);
}

pt_err pt_job_spec_validate(const pt_job_spec *s, const char *files_root)
{
	pt_err rv;

	/* The model on its own. */
	if (s->n_layers <= 0 || s->layers == NULL)
		return pt_set_error(PT_ERR_INVALID, "model: no layers (a job needs at least one)");
	if (s->n_layers > PT_MAX_LAYERS)
		return pt_set_error(PT_ERR_RANGE, "model: %d layers (at most %d)", s->n_layers,
		                    PT_MAX_LAYERS);
	for (int i = 0; i < s->n_layers; i++)
		if ((unsigned)s->layers[i].kind >= PT_LAYER_KIND_COUNT)
			return pt_set_error(PT_ERR_INVALID, "model[%d].kind: unknown layer kind %d",
			                    i, (int)s->layers[i].kind);

	/* Batching and length. */
	if (s->batch_size <= 0)
		return pt_set_error(PT_ERR_RANGE, "batch_size: %ld must be > 0",
		                    (long)s->batch_size);
	if (s->microbatches <= 0)
		return pt_set_error(PT_ERR_RANGE, "microbatches: %d must be > 0", s->microbatches);
	if (s->batch_size % s->microbatches != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "microbatches: %d does not divide batch_size %ld",
		                    s->microbatches, (long)s->batch_size);
	if (s->steps <= 0)
		return pt_set_error(PT_ERR_RANGE, "steps: %ld must be > 0", (long)s->steps);
	if (s->eval_every < 0)
		return pt_set_error(PT_ERR_RANGE, "eval_every: %ld must be >= 0",
		                    (long)s->eval_every);
	if ((unsigned)s->mode > PT_MODE_ASYNC)
		return pt_set_error(PT_ERR_INVALID, "mode: unknown mode %d", (int)s->mode);

	/* Placement. */
	if (s->stages < 1 || s->stages > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "placement.stages: %d (1 to %d)", s->stages,
		                    PT_MAX_STAGES);
	if (s->stages > s->n_layers)
		return pt_set_error(PT_ERR_RANGE, "placement.stages: %d stages for %d layers",
		                    s->stages, s->n_layers);
	if (s->boundaries != NULL &&
	    (rv = pt_partition_check(s->n_layers, s->stages, s->boundaries)) != PT_OK)
		return pt_set_error(rv, "placement.boundaries: %s", pt_last_error());
	if (s->threads_per_stage < 0 || s->threads_per_stage > 1024)
		return pt_set_error(PT_ERR_RANGE, "placement.threads_per_stage: %d (0 to 1024)",
		                    s->threads_per_stage);
	if (s->n_workers > 0 && s->n_workers != s->stages)
		return pt_set_error(PT_ERR_INVALID, "placement.workers: %d URLs for %d stages",
		                    s->n_workers, s->stages);
	if (s->n_workers > 0)
		/* Workers must learn every rank's URL (the coordinator's is bound at
		 * run time) and the handshake to tell them is not designed yet. */
		return pt_set_error(PT_ERR_UNSUPPORTED,
		                    "placement.workers: remote workers are not supported yet");

	/* Checkpoints. */
	if (s->checkpoint_every < 0)
		return pt_set_error(PT_ERR_RANGE, "checkpoint.every_steps: %ld must be >= 0",
		                    (long)s->checkpoint_every);
	if (s->checkpoint_keep < 1)
		return pt_set_error(PT_ERR_RANGE, "checkpoint.keep: %d must be >= 1",
		                    s->checkpoint_keep);

	/* Optimizer, device, loss. */
	if ((rv = pt_optim_validate(&s->optim)) != PT_OK)
		return optim_error(rv);
	PT_TRY(validate_device(s->device));
	if ((unsigned)s->loss > PT_LOSS_MSE)
		return pt_set_error(PT_ERR_INVALID, "loss: unknown loss kind %d", (int)s->loss);
	if (s->loss != PT_LOSS_CROSS_ENTROPY && s->ignore_index != -1)
		return pt_set_error(PT_ERR_INVALID,
		                    "ignore_index: %ld is only meaningful with CrossEntropy",
		                    (long)s->ignore_index);

	/* Data: fields for the format, files, shapes against the model. */
	switch (s->data.format) {
	case PT_DATA_NPY:
		return validate_npy(s, files_root);
	case PT_DATA_TOKENS16:
	case PT_DATA_TOKENS32:
		return validate_tokens(s, files_root);
	}
	return pt_set_error(PT_ERR_INVALID, "data.format: unknown data format %d",
	                    (int)s->data.format);
}
