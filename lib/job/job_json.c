/* job_json.c - the JSON text of a JobSpec (flatc's JSON for schema/job.fbs)
 * into a pt_job_spec and a JobSpec table; job files of either kind.
 *
 * The schema is described once, as data: one row per field (name, type, where
 * it lands in the C struct, its enum names or nested table). The walker
 * accepts what flatc accepts for these types - enums by name or value,
 * booleans as true/false or 0/1, null as "absent" - and refuses unknown fields
 * and wrong types naming the JSON path ("model[1].kindd: unknown field").
 * The table is then built by pt_job_spec_build, so JSON and binary share one
 * builder. Limits: strict JSON only (no comments or unquoted keys, which flatc
 * also reads); ulong values above 2^63 - 1 are refused (the parser keeps exact
 * integers as int64).
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "job.h"
#include "json.h"
#include "model_wire.h"

#define JOB_MAX_STRING 4096
#define JOB_MAX_FILE   ((size_t)64 << 20)
#define JOB_PATH_LEN   256

typedef enum jtype {
	JT_I64,
	JT_I32,
	JT_U64,
	JT_F32,
	JT_BOOL,
	JT_STR,
	JT_ENUM,    /* stored as an int-sized C enum */
	JT_TABLE,   /* nested table read into the same base */
	JT_LAYERS,  /* [Layer] into spec->layers */
	JT_BOUNDS,  /* [int] placement.boundaries (inner edges) */
	JT_WORKERS, /* [string] placement.workers */
} jtype;

typedef struct jenum {
	const char *type;
	const char *const *names; /* value i is names[i] */
	int count;
} jenum;

struct jtable;

typedef struct jfield {
	const char *name;
	uint8_t type;
	size_t off;
	const jenum *en;
	const struct jtable *sub;
} jfield;

typedef struct jtable {
	const char *name;
	const jfield *fields;
	int n;
} jtable;

/* C enums are stored through int pointers. */
static_assert(sizeof(pt_layer_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_optim_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_sched_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_data_format) == sizeof(int), "enum size");
static_assert(sizeof(pt_loss_kind) == sizeof(int), "enum size");
static_assert(sizeof(pt_pipe_mode) == sizeof(int), "enum size");

static const char *const layer_kinds[] = {
    "Linear",  "ReLU",      "GELU",      "Tanh",      "Sigmoid",
    "Dropout", "LayerNorm", "Embedding", "Attention", "TransformerBlock",
    "Softmax"};
static_assert(sizeof(layer_kinds) / sizeof(layer_kinds[0]) == PT_LAYER_KIND_COUNT,
              "LayerKind names match pt_layer_kind");
static const char *const optim_kinds[] = {"SGD", "AdamW"};
static const char *const sched_kinds[] = {"Constant", "WarmupCosine"};
static const char *const data_formats[] = {"Npy", "Tokens16", "Tokens32", "Auto"};
static const char *const loss_kinds[] = {"CrossEntropy", "MSE"};
static const char *const modes[] = {"Sync", "SemiAsync", "Async"};

#define JENUM(type_, names_)                                                                       \
	{                                                                                          \
		type_, names_, (int)(sizeof(names_) / sizeof(names_[0]))                           \
	}
static const jenum layer_kind_enum = JENUM("LayerKind", layer_kinds);
static const jenum optim_enum = JENUM("OptimizerKind", optim_kinds);
static const jenum sched_enum = JENUM("ScheduleKind", sched_kinds);
static const jenum format_enum = JENUM("DataFormat", data_formats);
static const jenum loss_enum = JENUM("LossKind", loss_kinds);
static const jenum mode_enum = JENUM("Mode", modes);

#define F(name_, type_, st_, member_)                                                              \
	{                                                                                          \
		name_, type_, offsetof(st_, member_), NULL, NULL                                   \
	}
#define FE(name_, st_, member_, en_)                                                               \
	{                                                                                          \
		name_, JT_ENUM, offsetof(st_, member_), &(en_), NULL                               \
	}
#define FT(name_, sub_)                                                                            \
	{                                                                                          \
		name_, JT_TABLE, 0, NULL, &(sub_)                                                  \
	}
#define JTABLE(name_, fields_)                                                                     \
	{                                                                                          \
		name_, fields_, (int)(sizeof(fields_) / sizeof(fields_[0]))                        \
	}

static const jfield layer_fields[] = {
    FE("kind", pt_layer_spec, kind, layer_kind_enum),
    F("in_features", JT_I64, pt_layer_spec, in_features),
    F("out_features", JT_I64, pt_layer_spec, out_features),
    F("bias", JT_BOOL, pt_layer_spec, bias),
    F("dim", JT_I64, pt_layer_spec, dim),
    F("n_head", JT_I32, pt_layer_spec, n_head),
    F("vocab", JT_I64, pt_layer_spec, vocab),
    F("max_seq", JT_I64, pt_layer_spec, max_seq),
    F("mlp_hidden", JT_I64, pt_layer_spec, mlp_hidden),
    F("p", JT_F32, pt_layer_spec, p),
    F("eps", JT_F32, pt_layer_spec, eps),
};
static const jtable layer_table = JTABLE("Layer", layer_fields);

static const jfield optimizer_fields[] = {
    FE("kind", pt_job_spec, optim.kind, optim_enum),
    F("lr", JT_F32, pt_job_spec, optim.lr),
    F("beta1", JT_F32, pt_job_spec, optim.beta1),
    F("beta2", JT_F32, pt_job_spec, optim.beta2),
    F("eps", JT_F32, pt_job_spec, optim.eps),
    F("weight_decay", JT_F32, pt_job_spec, optim.weight_decay),
    F("momentum", JT_F32, pt_job_spec, optim.momentum),
    F("dampening", JT_F32, pt_job_spec, optim.dampening),
    F("nesterov", JT_BOOL, pt_job_spec, optim.nesterov),
    F("clip_norm", JT_F32, pt_job_spec, optim.clip_norm),
    FE("schedule", pt_job_spec, optim.schedule.kind, sched_enum),
    F("warmup_steps", JT_I64, pt_job_spec, optim.schedule.warmup_steps),
    F("total_steps", JT_I64, pt_job_spec, optim.schedule.total_steps),
    F("min_lr", JT_F32, pt_job_spec, optim.schedule.min_lr),
};
static const jtable optimizer_table = JTABLE("Optimizer", optimizer_fields);

static const jfield data_fields[] = {
    FE("format", pt_job_spec, data.format, format_enum),
    F("features", JT_STR, pt_job_spec, data.features),
    F("labels", JT_STR, pt_job_spec, data.labels),
    F("tokens", JT_STR, pt_job_spec, data.tokens),
    F("seq_len", JT_I64, pt_job_spec, data.seq_len),
    F("vocab", JT_I64, pt_job_spec, data.vocab),
    F("held_out", JT_F32, pt_job_spec, data.held_out),
    F("shuffle", JT_BOOL, pt_job_spec, data.shuffle),
    F("val_tokens", JT_STR, pt_job_spec, data.val_tokens),
};
static const jtable data_table = JTABLE("Data", data_fields);

static const jfield placement_fields[] = {
    F("stages", JT_I32, pt_job_spec, stages),
    F("boundaries", JT_BOUNDS, pt_job_spec, boundaries),
    F("workers", JT_WORKERS, pt_job_spec, workers),
    F("threads_per_stage", JT_I32, pt_job_spec, threads_per_stage),
    F("worker_timeout_ms", JT_I32, pt_job_spec, worker_timeout_ms),
};
static const jtable placement_table = JTABLE("Placement", placement_fields);

static const jfield checkpoint_fields[] = {
    F("every_steps", JT_I64, pt_job_spec, checkpoint_every),
    F("keep", JT_I32, pt_job_spec, checkpoint_keep),
    F("resume", JT_BOOL, pt_job_spec, resume),
};
static const jtable checkpoint_table = JTABLE("CheckpointPolicy", checkpoint_fields);

static const jfield job_fields[] = {
    F("name", JT_STR, pt_job_spec, name),
    F("model", JT_LAYERS, pt_job_spec, layers),
    FT("data", data_table),
    FE("loss", pt_job_spec, loss, loss_enum),
    F("ignore_index", JT_I64, pt_job_spec, ignore_index),
    FT("optimizer", optimizer_table),
    F("batch_size", JT_I64, pt_job_spec, batch_size),
    F("microbatches", JT_I32, pt_job_spec, microbatches),
    F("steps", JT_I64, pt_job_spec, steps),
    FE("mode", pt_job_spec, mode, mode_enum),
    FT("placement", placement_table),
    FT("checkpoint", checkpoint_table),
    F("device", JT_STR, pt_job_spec, device),
    F("seed", JT_U64, pt_job_spec, seed),
    F("eval_every", JT_I64, pt_job_spec, eval_every),
    F("compress", JT_BOOL, pt_job_spec, compress),
    F("recompute", JT_BOOL, pt_job_spec, recompute),
    F("weight_stashing", JT_BOOL, pt_job_spec, weight_stashing),
    F("use_graphs", JT_BOOL, pt_job_spec, use_graphs),
    F("max_restarts", JT_I32, pt_job_spec, max_restarts),
    F("init_from", JT_STR, pt_job_spec, init_from),
};
static const jtable job_table = JTABLE("JobSpec", job_fields);

/* The walk's state: the spec, the boundaries as written (inner edges, turned
 * into the struct's stages + 1 edges once stages and the model are known). */
typedef struct jctx {
	pt_job_spec *spec;
	int *bounds;
	size_t n_bounds;
	bool have_bounds, have_model, have_data, have_optim;
} jctx;

static const char *got(const pt_json *v)
{
	switch (v->type) {
	case PT_JSON_NULL:
		return "null";
	case PT_JSON_BOOL:
		return "a boolean";
	case PT_JSON_NUMBER:
		return "a number";
	case PT_JSON_STRING:
		return "a string";
	case PT_JSON_ARRAY:
		return "an array";
	case PT_JSON_OBJECT:
		return "an object";
	}
	return "something else";
}

/* num formats d with the fewest digits that read back as d ("1e+39", "1.5"). */
static const char *num(char *buf, size_t cap, double d)
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, cap, "%.*g", prec, d);
		if (strtod(buf, NULL) == d)
			break;
	}
	return buf;
}

static pt_err type_error(const char *path, const char *expected, const pt_json *v)
{
	char b[32];
	if (v->type == PT_JSON_NUMBER)
		return pt_set_error(PT_ERR_FORMAT, "%s: expected %s, got the number %s", path,
		                    expected, num(b, sizeof(b), v->d));
	return pt_set_error(PT_ERR_FORMAT, "%s: expected %s, got %s", path, expected, got(v));
}

/* json_integer reads an exact integer in [lo, hi]. */
static pt_err json_integer(const char *path, const pt_json *v, int64_t lo, int64_t hi,
                           const char *type, int64_t *out)
{
	if (v->type != PT_JSON_NUMBER)
		return type_error(path, "an integer", v);
	if (!v->is_int) {
		char b[32];
		if (isfinite(v->d) && floor(v->d) == v->d)
			return pt_set_error(PT_ERR_RANGE, "%s: %s is out of range for %s", path,
			                    num(b, sizeof(b), v->d), type);
		return type_error(path, "an integer", v);
	}
	if (v->i < lo || v->i > hi)
		return pt_set_error(PT_ERR_RANGE, "%s: %lld is out of range for %s", path,
		                    (long long)v->i, type);
	*out = v->i;
	return PT_OK;
}

static pt_err json_cstring(const char *path, const pt_json *v, char **out)
{
	if (v->type != PT_JSON_STRING)
		return type_error(path, "a string", v);
	if (v->len > JOB_MAX_STRING)
		return pt_set_error(PT_ERR_RANGE, "%s: %zu bytes (at most %d)", path, v->len,
		                    JOB_MAX_STRING);
	if (memchr(v->str, 0, v->len) != NULL)
		return pt_set_error(PT_ERR_FORMAT, "%s: contains a NUL character", path);
	if ((*out = strdup(v->str)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	return PT_OK;
}

static pt_err json_enum(const char *path, const pt_json *v, const jenum *en, int *out)
{
	int64_t i = 0;
	if (v->type == PT_JSON_STRING) {
		for (int k = 0; k < en->count; k++)
			if (strcmp(v->str, en->names[k]) == 0 && strlen(en->names[k]) == v->len) {
				*out = k;
				return PT_OK;
			}
		char names[256];
		size_t o = 0;
		for (int k = 0; k < en->count && o < sizeof(names); k++)
			o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%s", k ? ", " : "",
			                      en->names[k]);
		return pt_set_error(PT_ERR_FORMAT, "%s: unknown %s \"%s\" (one of %s)", path,
		                    en->type, v->str, names);
	}
	if (v->type != PT_JSON_NUMBER)
		return type_error(path, "an enum name or value", v);
	PT_TRY(json_integer(path, v, 0, en->count - 1, en->type, &i));
	*out = (int)i;
	return PT_OK;
}

static pt_err parse_table(jctx *c, const jtable *t, void *base, const pt_json *obj, char *path,
                          size_t plen);

/* join appends ".name" (or "name" at the root) to path[plen]; returns the new length. */
static size_t join(char *path, size_t plen, const char *name, size_t nlen)
{
	int w =
	    snprintf(path + plen, JOB_PATH_LEN - plen, "%s%.*s", plen ? "." : "", (int)nlen, name);
	size_t n = plen + (w > 0 ? (size_t)w : 0);
	return n < JOB_PATH_LEN ? n : JOB_PATH_LEN - 1;
}

static size_t join_index(char *path, size_t plen, size_t i)
{
	int w = snprintf(path + plen, JOB_PATH_LEN - plen, "[%zu]", i);
	size_t n = plen + (w > 0 ? (size_t)w : 0);
	return n < JOB_PATH_LEN ? n : JOB_PATH_LEN - 1;
}

static pt_err parse_layers(jctx *c, const pt_json *v, char *path, size_t plen)
{
	pt_job_spec *s = c->spec;
	if (v->type != PT_JSON_ARRAY)
		return type_error(path, "an array of Layer objects", v);
	if (v->len > PT_MAX_LAYERS)
		return pt_set_error(PT_ERR_RANGE, "%s: %zu layers (at most %d)", path, v->len,
		                    PT_MAX_LAYERS);
	if ((s->layers = calloc(v->len ? v->len : 1, sizeof(*s->layers))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	s->n_layers = (int)v->len;
	for (size_t i = 0; i < v->len; i++) {
		size_t n = join_index(path, plen, i);
		s->layers[i].bias = true; /* the schema's default */
		if (v->items[i].type != PT_JSON_OBJECT)
			return type_error(path, "a Layer object", &v->items[i]);
		PT_TRY(parse_table(c, &layer_table, &s->layers[i], &v->items[i], path, n));
		path[plen] = 0;
	}
	return PT_OK;
}

static pt_err parse_bounds(jctx *c, const pt_json *v, char *path, size_t plen)
{
	if (v->type != PT_JSON_ARRAY)
		return type_error(path, "an array of integers", v);
	if (v->len > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "%s: %zu entries (at most %d)", path, v->len,
		                    PT_MAX_STAGES);
	if ((c->bounds = calloc(v->len ? v->len : 1, sizeof(int))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	c->n_bounds = v->len;
	c->have_bounds = true;
	for (size_t i = 0; i < v->len; i++) {
		int64_t x;
		join_index(path, plen, i);
		PT_TRY(json_integer(path, &v->items[i], INT32_MIN, INT32_MAX, "int", &x));
		c->bounds[i] = (int)x;
		path[plen] = 0;
	}
	return PT_OK;
}

static pt_err parse_workers(jctx *c, const pt_json *v, char *path, size_t plen)
{
	pt_job_spec *s = c->spec;
	if (v->type != PT_JSON_ARRAY)
		return type_error(path, "an array of strings", v);
	if (v->len > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "%s: %zu URLs (at most %d)", path, v->len,
		                    PT_MAX_STAGES);
	if (v->len == 0)
		return PT_OK;
	if ((s->workers = calloc(v->len, sizeof(char *))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s", path);
	s->n_workers = (int)v->len;
	for (size_t i = 0; i < v->len; i++) {
		join_index(path, plen, i);
		PT_TRY(json_cstring(path, &v->items[i], &s->workers[i]));
		path[plen] = 0;
	}
	return PT_OK;
}

static pt_err parse_field(jctx *c, const jfield *f, void *base, const pt_json *v, char *path,
                          size_t plen)
{
	char *at = (char *)base + f->off;
	int64_t i = 0;
	switch ((jtype)f->type) {
	case JT_I64:
		PT_TRY(json_integer(path, v, INT64_MIN, INT64_MAX, "long", &i));
		memcpy(at, &i, sizeof(int64_t));
		return PT_OK;
	case JT_I32: {
		int32_t x;
		PT_TRY(json_integer(path, v, INT32_MIN, INT32_MAX, "int", &i));
		x = (int32_t)i;
		memcpy(at, &x, sizeof(x));
		return PT_OK;
	}
	case JT_U64: {
		uint64_t x;
		PT_TRY(json_integer(path, v, 0, INT64_MAX, "ulong (up to 2^63 - 1 here)", &i));
		x = (uint64_t)i;
		memcpy(at, &x, sizeof(x));
		return PT_OK;
	}
	case JT_F32: {
		float x;
		char b[32];
		if (v->type != PT_JSON_NUMBER)
			return type_error(path, "a number", v);
		if (!(fabs(v->d) <= (double)FLT_MAX))
			return pt_set_error(PT_ERR_RANGE, "%s: %s is out of range for float", path,
			                    num(b, sizeof(b), v->d));
		x = (float)v->d;
		memcpy(at, &x, sizeof(x));
		return PT_OK;
	}
	case JT_BOOL: {
		bool x;
		if (v->type == PT_JSON_BOOL)
			x = v->boolean;
		else if (v->type == PT_JSON_NUMBER && v->is_int && (v->i == 0 || v->i == 1))
			x = v->i == 1;
		else
			return type_error(path, "a boolean", v);
		memcpy(at, &x, sizeof(x));
		return PT_OK;
	}
	case JT_STR: {
		char *x;
		PT_TRY(json_cstring(path, v, &x));
		memcpy(at, &x, sizeof(x));
		return PT_OK;
	}
	case JT_ENUM: {
		int x = 0;
		PT_TRY(json_enum(path, v, f->en, &x));
		memcpy(at, &x, sizeof(x));
		return PT_OK;
	}
	case JT_TABLE:
		if (v->type != PT_JSON_OBJECT)
			return type_error(path, "an object", v);
		return parse_table(c, f->sub, base, v, path, plen);
	case JT_LAYERS:
		return parse_layers(c, v, path, plen);
	case JT_BOUNDS:
		return parse_bounds(c, v, path, plen);
	case JT_WORKERS:
		return parse_workers(c, v, path, plen);
	}
	return pt_set_error(PT_ERR_STATE, "%s: bad field description", path);
}

static pt_err parse_table(jctx *c, const jtable *t, void *base, const pt_json *obj, char *path,
                          size_t plen)
{
	for (size_t k = 0; k < obj->len; k++) {
		const pt_json_member *m = &obj->members[k];
		const jfield *f = NULL;
		size_t n = join(path, plen, m->key, m->key_len);
		for (int j = 0; j < t->n && f == NULL; j++)
			if (strlen(t->fields[j].name) == m->key_len &&
			    memcmp(t->fields[j].name, m->key, m->key_len) == 0)
				f = &t->fields[j];
		if (f == NULL)
			return pt_set_error(PT_ERR_FORMAT, "%s: unknown field (of %s)", path,
			                    t->name);
		if (m->value.type != PT_JSON_NULL) { /* null: absent, as flatc reads it */
			PT_TRY(parse_field(c, f, base, &m->value, path, n));
			if (t == &job_table) {
				c->have_model |= f->type == JT_LAYERS;
				c->have_data |= f->sub == &data_table;
				c->have_optim |= f->sub == &optimizer_table;
			}
		}
		path[plen] = 0;
	}
	return PT_OK;
}

/* finish_bounds turns the written inner edges into stages + 1 edges. */
static pt_err finish_bounds(jctx *c)
{
	pt_job_spec *s = c->spec;
	if (!c->have_bounds)
		return PT_OK;
	if (s->stages < 1 || s->stages > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "placement.stages: %d (1 to %d)", s->stages,
		                    PT_MAX_STAGES);
	if (c->n_bounds != (size_t)s->stages - 1)
		return pt_set_error(PT_ERR_INVALID,
		                    "placement.boundaries: %zu entries for %d stages (expected %d)",
		                    c->n_bounds, s->stages, s->stages - 1);
	if ((s->boundaries = malloc(sizeof(int) * ((size_t)s->stages + 1))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "placement.boundaries");
	s->boundaries[0] = 0;
	if (c->n_bounds)
		memcpy(s->boundaries + 1, c->bounds, sizeof(int) * c->n_bounds);
	s->boundaries[s->stages] = s->n_layers;
	return PT_OK;
}

pt_err pt_job_spec_parse_json(const char *text, size_t len, pt_job_spec *out)
{
	pt_json doc;
	char path[JOB_PATH_LEN] = "";
	jctx c = {.spec = out};
	pt_err rv;

	pt_job_spec_defaults(out);
	if ((rv = pt_json_parse(&doc, text, len, NULL)) != PT_OK)
		return pt_set_error(rv, "JobSpec JSON: %s", pt_last_error());
	if (doc.type != PT_JSON_OBJECT)
		rv = type_error("JobSpec", "an object", &doc);
	else if ((rv = parse_table(&c, &job_table, out, &doc, path, 0)) == PT_OK) {
		if (!c.have_model)
			rv = pt_set_error(PT_ERR_FORMAT, "model: required field missing");
		else if (!c.have_data)
			rv = pt_set_error(PT_ERR_FORMAT, "data: required field missing");
		else if (!c.have_optim)
			rv = pt_set_error(PT_ERR_FORMAT, "optimizer: required field missing");
		else
			rv = finish_bounds(&c);
	}
	free(c.bounds);
	pt_json_fini(&doc);
	if (rv != PT_OK)
		pt_job_spec_fini(out);
	return rv;
}

pt_err pt_job_spec_from_json(pt_fb_builder *b, const char *text, size_t len, pt_fb_ref *out)
{
	pt_job_spec s;
	pt_err rv;
	*out = 0;
	PT_TRY(pt_job_spec_parse_json(text, len, &s));
	rv = pt_job_spec_build(b, &s, out);
	pt_job_spec_fini(&s);
	return rv;
}

pt_err pt_job_spec_load_file(const char *path, void **buf, size_t *len)
{
	pt_fb_builder b;
	const uint8_t *data;
	void *text = NULL, *copy;
	size_t n = 0, size;
	pt_fb_ref root;
	char binary_err[512];
	pt_err rv;

	*buf = NULL;
	*len = 0;
	PT_TRY(pt_file_read(path, JOB_MAX_FILE, &text, &n));
	/* A verifiable JobSpec is binary (pt_file_read's buffer is malloc'd,
	 * so aligned); JSON text never verifies (its first bytes make an
	 * offset far past the end). */
	if (pt_fb_verify(text, n, &pt_fb_job_job_spec_desc, NULL, NULL) == PT_OK) {
		*buf = text;
		*len = n;
		return PT_OK;
	}
	snprintf(binary_err, sizeof(binary_err), "%s", pt_last_error());
	if ((rv = pt_fb_builder_init(&b, 1024)) != PT_OK) {
		free(text);
		return rv;
	}
	rv = pt_job_spec_from_json(&b, text, n, &root);
	if (rv == PT_OK)
		rv = pt_fb_finish(&b, root, NULL, &data, &size);
	else
		rv = pt_set_error(rv, "%s: %s (and it is not a JobSpec binary either: %s)", path,
		                  pt_last_error(), binary_err);
	free(text);
	if (rv == PT_OK) {
		if ((copy = malloc(size)) == NULL) {
			rv = pt_set_error(PT_ERR_NOMEM, "%s: job buffer", path);
		} else {
			memcpy(copy, data, size);
			*buf = copy;
			*len = size;
		}
	}
	pt_fb_builder_fini(&b);
	return rv;
}
