/* api.c - Request/Response codec over schema/api.fbs (see api.h).
 *
 * Field ids and verifier descriptors are generated from the schema
 * (fb_schema.h), and a descriptor lists every field of its table, so a parsed
 * view reads only what pt_fb_verify checked. Limits: one metric point carries at most
 * PT_API_MAX_STAGES stage figures (more are dropped when reading).
 */
#include "api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------- descriptors -- */

/* Field ids and descriptors are generated from schema/api.fbs (fb_schema.h). */

/* Only the id: verified separately so an error reply can echo it. */
static const pt_fb_field_desc id_fields[] = {
    PT_FB_FIELD_SCALAR(PT_FB_API_REQUEST_ID, "id", 8),
};
static const pt_fb_table_desc id_only_desc = PT_FB_TABLE_DESC("Request", id_fields);

#define KIND_IS(kind, member)                                                                      \
	_Static_assert((int)(kind) == PT_FB_API_REQUEST_BODY_##member &&                           \
	                   (int)(kind) == PT_FB_API_RESPONSE_BODY_##member##_REPLY,                \
	               #member " has the same union type in RequestBody and ResponseBody")
KIND_IS(PT_API_SUBMIT_JOB, SUBMIT_JOB);
KIND_IS(PT_API_GET_JOB, GET_JOB);
KIND_IS(PT_API_LIST_JOBS, LIST_JOBS);
KIND_IS(PT_API_CANCEL_JOB, CANCEL_JOB);
KIND_IS(PT_API_WATCH_METRICS, WATCH_METRICS);
KIND_IS(PT_API_FETCH_CHECKPOINT, FETCH_CHECKPOINT);
KIND_IS(PT_API_LIST_CHECKPOINTS, LIST_CHECKPOINTS);
KIND_IS(PT_API_SERVER_INFO, SERVER_INFO);
KIND_IS(PT_API_LIST_WORKERS, LIST_WORKERS);
KIND_IS(PT_API_DRAIN_WORKER, DRAIN_WORKER);
KIND_IS(PT_API_PLAN_JOB, PLAN_JOB);
#undef KIND_IS
_Static_assert(PT_API_KIND_COUNT - 1 == PT_FB_API_REQUEST_BODY_MEMBERS &&
                   PT_API_KIND_COUNT - 1 == PT_FB_API_RESPONSE_BODY_MEMBERS,
               "one kind per RequestBody and ResponseBody member");
/* GetJob, CancelJob and ListCheckpoints are read and built by one case. */
_Static_assert((int)PT_FB_API_GET_JOB_JOB == (int)PT_FB_API_CANCEL_JOB_JOB &&
                   (int)PT_FB_API_GET_JOB_JOB == (int)PT_FB_API_LIST_CHECKPOINTS_JOB,
               "job ids of GetJob, CancelJob and ListCheckpoints");

_Static_assert(PT_API_MAX_STAGES == PT_MAX_STAGES, "a metric point holds every stage");

/* ---------------------------------------------------------------- names -- */

static const char *const code_names[] = {
#define X(name, str) str,
    PT_API_CODES(X)
#undef X
};
static const char *const state_names[] = {
#define X(name, str) str,
    PT_API_JOB_STATES(X)
#undef X
};
static const char *const kind_names[] = {
#define X(name, str) str,
    PT_API_KINDS(X)
#undef X
};

const char *pt_api_code_name(pt_api_code c)
{
	return (unsigned)c < PT_API_CODE_COUNT ? code_names[c] : "Unknown";
}

const char *pt_api_job_state_name(pt_api_job_state s)
{
	return (unsigned)s < PT_JOB_STATE_COUNT ? state_names[s] : "Unknown";
}

const char *pt_api_kind_name(pt_api_kind k)
{
	return (unsigned)k < PT_API_KIND_COUNT ? kind_names[k] : "Unknown";
}

bool pt_api_job_state_final(pt_api_job_state s)
{
	return s == PT_JOB_SUCCEEDED || s == PT_JOB_FAILED || s == PT_JOB_CANCELLED ||
	       s == PT_JOB_INTERRUPTED;
}

pt_api_code pt_api_code_from_err(pt_err e)
{
	switch (e) {
	case PT_OK:
		return PT_API_OK;
	case PT_ERR_NOTFOUND:
		return PT_API_NOT_FOUND;
	case PT_ERR_STATE:
		return PT_API_CONFLICT;
	case PT_ERR_CLOSED:
		return PT_API_UNAVAILABLE;
	case PT_ERR_FORMAT:
	case PT_ERR_INVALID:
	case PT_ERR_RANGE:
		return PT_API_BAD_REQUEST;
	default:
		return PT_API_INTERNAL;
	}
}

/* ------------------------------------------------------------- requests -- */

void pt_api_request_init(pt_api_request *r, pt_api_kind kind)
{
	memset(r, 0, sizeof(*r));
	r->kind = kind;
	r->cursor = -1;
	r->wait_ms = 1000;
	r->max_points = 1000;
	r->step = -1;
	r->length = PT_API_MAX_CHUNK;
}

static pt_err str_ref(pt_fb_builder *b, const char *s, pt_fb_ref *out)
{
	*out = 0;
	return s ? pt_fb_create_cstring(b, s, out) : PT_OK;
}

/* build_request_body builds r's body table (spec_ref: an already built JobSpec). */
static pt_err build_request_body(pt_fb_builder *b, const pt_api_request *r, pt_fb_ref spec_ref,
                                 pt_fb_ref *out)
{
	pt_fb_ref url_ref = 0, ps = 0, pm = 0;

	if (r->kind == PT_API_DRAIN_WORKER)
		str_ref(b, r->url, &url_ref);
	if (r->kind == PT_API_PLAN_JOB) {
		if (r->n_plan_stages < 0 || r->n_plan_stages > PT_API_MAX_PLAN_CANDIDATES ||
		    r->n_plan_microbatches < 0 ||
		    r->n_plan_microbatches > PT_API_MAX_PLAN_CANDIDATES)
			return pt_set_error(PT_ERR_INVALID, "PlanJob: at most %d candidates each",
			                    PT_API_MAX_PLAN_CANDIDATES);
		if (r->n_plan_stages > 0)
			PT_TRY(pt_fb_create_vector(b, r->plan_stages, (size_t)r->n_plan_stages, 4,
			                           4, &ps));
		if (r->n_plan_microbatches > 0)
			PT_TRY(pt_fb_create_vector(b, r->plan_microbatches,
			                           (size_t)r->n_plan_microbatches, 4, 4, &pm));
	}
	pt_fb_start_table(b);
	switch (r->kind) {
	case PT_API_SUBMIT_JOB:
		pt_fb_add_offset(b, PT_FB_API_SUBMIT_JOB_SPEC, spec_ref);
		break;
	case PT_API_GET_JOB:
	case PT_API_CANCEL_JOB:
	case PT_API_LIST_CHECKPOINTS:
		pt_fb_add_u64(b, PT_FB_API_GET_JOB_JOB, r->job, 0);
		break;
	case PT_API_WATCH_METRICS:
		pt_fb_add_u64(b, PT_FB_API_WATCH_METRICS_JOB, r->job, 0);
		pt_fb_add_i64(b, PT_FB_API_WATCH_METRICS_CURSOR, r->cursor, -1);
		pt_fb_add_i32(b, PT_FB_API_WATCH_METRICS_WAIT_MS, r->wait_ms, 1000);
		pt_fb_add_i32(b, PT_FB_API_WATCH_METRICS_MAX_POINTS, r->max_points, 1000);
		break;
	case PT_API_FETCH_CHECKPOINT:
		pt_fb_add_u64(b, PT_FB_API_FETCH_CHECKPOINT_JOB, r->job, 0);
		pt_fb_add_i64(b, PT_FB_API_FETCH_CHECKPOINT_STEP, r->step, -1);
		pt_fb_add_u64(b, PT_FB_API_FETCH_CHECKPOINT_OFFSET, r->offset, 0);
		pt_fb_add_u32(b, PT_FB_API_FETCH_CHECKPOINT_LENGTH, r->length, PT_API_MAX_CHUNK);
		break;
	case PT_API_DRAIN_WORKER:
		pt_fb_add_offset(b, PT_FB_API_DRAIN_WORKER_URL, url_ref);
		break;
	case PT_API_PLAN_JOB:
		pt_fb_add_offset(b, PT_FB_API_PLAN_JOB_SPEC, spec_ref);
		pt_fb_add_offset(b, PT_FB_API_PLAN_JOB_STAGES, ps);
		pt_fb_add_offset(b, PT_FB_API_PLAN_JOB_MICROBATCHES, pm);
		break;
	default: /* ListJobs, ServerInfo, ListWorkers: empty tables */
		break;
	}
	return pt_fb_end_table(b, out);
}

static pt_err finish_request(pt_fb_builder *b, const pt_api_request *r, pt_fb_ref spec_ref,
                             const uint8_t **data, size_t *size)
{
	pt_fb_ref token = 0, body = 0, root = 0;

	str_ref(b, r->auth_token, &token);
	PT_TRY(build_request_body(b, r, spec_ref, &body));
	pt_fb_start_table(b);
	pt_fb_add_u64(b, PT_FB_API_REQUEST_ID, r->id, 0);
	pt_fb_add_offset(b, PT_FB_API_REQUEST_AUTH_TOKEN, token);
	pt_fb_add_union(b, PT_FB_API_REQUEST_BODY_TYPE, (uint8_t)r->kind, body);
	pt_fb_end_table(b, &root);
	return pt_fb_finish(b, root, NULL, data, size);
}

pt_err pt_api_build_request(pt_fb_builder *b, const pt_api_request *r, const uint8_t **data,
                            size_t *size)
{
	pt_fb_ref spec_ref = 0;
	pt_err rv;

	if (b == NULL || r == NULL || data == NULL || size == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_api_build_request: NULL argument");
	if (r->kind <= PT_API_NONE || r->kind >= PT_API_KIND_COUNT)
		return pt_set_error(PT_ERR_INVALID, "pt_api_build_request: unknown kind %d",
		                    (int)r->kind);
	pt_fb_builder_reset(b);
	if (r->kind == PT_API_SUBMIT_JOB || r->kind == PT_API_PLAN_JOB) {
		if (r->spec == NULL)
			return pt_set_error(PT_ERR_INVALID, "%s: spec is required",
			                    pt_api_kind_name(r->kind));
		if ((rv = pt_job_spec_build(b, r->spec, &spec_ref)) != PT_OK)
			return rv;
	}
	return finish_request(b, r, spec_ref, data, size);
}

pt_err pt_api_build_submit_raw(pt_fb_builder *b, uint64_t id, const char *auth_token,
                               const void *spec_buf, size_t spec_len, const uint8_t **data,
                               size_t *size)
{
	pt_job_spec spec;
	pt_api_request r;
	pt_err rv;

	memset(&spec, 0, sizeof(spec));
	if ((rv = pt_job_spec_decode(spec_buf, spec_len, &spec)) != PT_OK) {
		pt_job_spec_fini(&spec);
		return rv;
	}
	pt_api_request_init(&r, PT_API_SUBMIT_JOB);
	r.id = id;
	r.auth_token = auth_token;
	r.spec = &spec;
	rv = pt_api_build_request(b, &r, data, size);
	pt_job_spec_fini(&spec);
	return rv;
}

static const pt_fb_verify_opts verify_opts = {
    .max_depth = PT_API_MAX_DEPTH,
    .max_tables = PT_FB_VERIFY_DEFAULT_TABLES,
};

/* read_id fills *id from a buffer that failed full verification, when its
 * root table and id field alone verify. */
static void read_id(const void *buf, size_t size, uint64_t *id)
{
	pt_err saved = pt_last_code();
	char msg[512];

	*id = 0;
	snprintf(msg, sizeof(msg), "%s", pt_last_error());
	if (pt_fb_verify(buf, size, &id_only_desc, NULL, &verify_opts) == PT_OK)
		*id = pt_fb_get_u64(pt_fb_root(buf), 0, 0);
	pt_set_error(saved, "%s", msg);
}

static const char *opt_string(const uint8_t *t, uint16_t id)
{
	return pt_fb_get_string(t, id, NULL);
}

pt_err pt_api_parse_request(const void *buf, size_t size, pt_api_request *out)
{
	const uint8_t *root, *body;
	uint8_t type;

	if (buf == NULL || out == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_api_parse_request: NULL argument");
	memset(out, 0, sizeof(*out));
	if (((uintptr_t)buf & 3u) != 0)
		return pt_set_error(PT_ERR_FORMAT, "Request: buffer not 4-byte aligned");
	if (pt_fb_verify(buf, size, &pt_fb_api_request_desc, NULL, &verify_opts) != PT_OK) {
		read_id(buf, size, &out->id);
		return pt_set_error(PT_ERR_FORMAT, "bad request: %s", pt_last_error());
	}
	root = pt_fb_root(buf);
	out->id = pt_fb_get_u64(root, PT_FB_API_REQUEST_ID, 0);
	out->auth_token = opt_string(root, PT_FB_API_REQUEST_AUTH_TOKEN);
	body = pt_fb_get_union(root, PT_FB_API_REQUEST_BODY_TYPE, &type);
	if (body == NULL) {
		uint64_t id = out->id;
		pt_api_request_init(out, PT_API_NONE);
		out->id = id;
		return pt_set_error(PT_ERR_FORMAT, "bad request: Request has no body");
	}
	if (type >= PT_API_KIND_COUNT) {
		/* Verified as flatc does: a newer member's value is not read. */
		uint64_t id = out->id;
		pt_api_request_init(out, PT_API_NONE);
		out->id = id;
		return pt_set_error(PT_ERR_FORMAT, "bad request: unknown body type %u", type);
	}
	{
		uint64_t id = out->id;
		const char *tok = out->auth_token;
		pt_api_request_init(out, (pt_api_kind)type);
		out->id = id;
		out->auth_token = tok;
	}
	switch (out->kind) {
	case PT_API_SUBMIT_JOB:
		out->spec_table = pt_fb_get_table(body, PT_FB_API_SUBMIT_JOB_SPEC);
		break;
	case PT_API_GET_JOB:
	case PT_API_CANCEL_JOB:
	case PT_API_LIST_CHECKPOINTS:
		out->job = pt_fb_get_u64(body, PT_FB_API_GET_JOB_JOB, 0);
		break;
	case PT_API_WATCH_METRICS:
		out->job = pt_fb_get_u64(body, PT_FB_API_WATCH_METRICS_JOB, 0);
		out->cursor = pt_fb_get_i64(body, PT_FB_API_WATCH_METRICS_CURSOR, -1);
		out->wait_ms = pt_fb_get_i32(body, PT_FB_API_WATCH_METRICS_WAIT_MS, 1000);
		out->max_points = pt_fb_get_i32(body, PT_FB_API_WATCH_METRICS_MAX_POINTS, 1000);
		break;
	case PT_API_FETCH_CHECKPOINT:
		out->job = pt_fb_get_u64(body, PT_FB_API_FETCH_CHECKPOINT_JOB, 0);
		out->step = pt_fb_get_i64(body, PT_FB_API_FETCH_CHECKPOINT_STEP, -1);
		out->offset = pt_fb_get_u64(body, PT_FB_API_FETCH_CHECKPOINT_OFFSET, 0);
		out->length =
		    pt_fb_get_u32(body, PT_FB_API_FETCH_CHECKPOINT_LENGTH, PT_API_MAX_CHUNK);
		break;
	case PT_API_DRAIN_WORKER:
		out->url = opt_string(body, PT_FB_API_DRAIN_WORKER_URL);
		break;
	case PT_API_PLAN_JOB: {
		uint32_t n;
		const uint8_t *v;
		out->spec_table = pt_fb_get_table(body, PT_FB_API_PLAN_JOB_SPEC);
		for (int k = 0; k < 2; k++) {
			int32_t *dst = k == 0 ? out->plan_stages : out->plan_microbatches;
			int *dn = k == 0 ? &out->n_plan_stages : &out->n_plan_microbatches;
			v = pt_fb_get_vector(body,
			                     k == 0 ? PT_FB_API_PLAN_JOB_STAGES
			                            : PT_FB_API_PLAN_JOB_MICROBATCHES,
			                     &n);
			if (v == NULL)
				continue;
			if (n > PT_API_MAX_PLAN_CANDIDATES)
				return pt_set_error(PT_ERR_INVALID,
				                    "PlanJob.%s: %u entries (at most %d)",
				                    k == 0 ? "stages" : "microbatches", n,
				                    PT_API_MAX_PLAN_CANDIDATES);
			memcpy(dst, v, (size_t)n * 4);
			*dn = (int)n;
		}
		break;
	}
	default:
		break;
	}
	return PT_OK;
}

/* ------------------------------------------------------------ responses -- */

void pt_api_response_init(pt_api_response *r, uint64_t id, pt_api_code code, pt_api_kind kind)
{
	memset(r, 0, sizeof(*r));
	r->id = id;
	r->code = code;
	r->kind = kind;
	r->cursor = -1;
	r->step = -1;
}

static pt_err build_point(pt_fb_builder *b, const pt_api_metric_point *p, pt_fb_ref *out)
{
	pt_fb_ref busy = 0;

	if (p->n_stages < 0 || p->n_stages > PT_API_MAX_STAGES)
		return pt_set_error(PT_ERR_INVALID, "MetricPoint: n_stages %d out of range",
		                    p->n_stages);
	if (p->n_stages > 0)
		pt_fb_create_vector(b, p->stage_busy, (size_t)p->n_stages, 8, 8, &busy);
	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_API_METRIC_POINT_STEP, p->step, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_LOSS, p->loss, 0);
	pt_fb_add_f32(b, PT_FB_API_METRIC_POINT_LEARNING_RATE, p->learning_rate, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_GRAD_NORM, p->grad_norm, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_SAMPLES_PER_SECOND, p->samples_per_second, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_TOKENS_PER_SECOND, p->tokens_per_second, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_BUBBLE, p->bubble, 0);
	pt_fb_add_offset(b, PT_FB_API_METRIC_POINT_STAGE_BUSY, busy);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_EVAL_LOSS, p->eval_loss, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_EVAL_ACCURACY, p->eval_accuracy, 0);
	pt_fb_add_f64(b, PT_FB_API_METRIC_POINT_TIME_UNIX, p->time_unix, 0);
	return pt_fb_end_table(b, out);
}

/* build_table_vector builds n items with fn into a vector of tables. */
static pt_err build_table_vector(pt_fb_builder *b, const void *items, size_t n, size_t item_size,
                                 pt_err (*fn)(pt_fb_builder *, const void *, pt_fb_ref *),
                                 pt_fb_ref *out)
{
	pt_fb_ref *refs;
	pt_err rv = PT_OK;

	*out = 0;
	if (n == 0)
		return pt_fb_create_ref_vector(b, NULL, 0, out);
	if (items == NULL)
		return pt_set_error(PT_ERR_INVALID, "Response: %zu items but no array", n);
	if ((refs = malloc(n * sizeof(*refs))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "Response: %zu refs", n);
	for (size_t i = 0; i < n && rv == PT_OK; i++)
		rv = fn(b, (const uint8_t *)items + i * item_size, &refs[i]);
	if (rv == PT_OK)
		rv = pt_fb_create_ref_vector(b, refs, n, out);
	free(refs);
	return rv;
}

static pt_err build_stage_stats(pt_fb_builder *b, const void *item, pt_fb_ref *out)
{
	const pt_api_stage_stats *s = item;

	pt_fb_start_table(b);
	pt_fb_add_i32(b, PT_FB_API_STAGE_STATS_STAGE, s->stage, 0);
	pt_fb_add_f64(b, PT_FB_API_STAGE_STATS_BUSY_SECONDS, s->busy_seconds, 0);
	pt_fb_add_bool(b, PT_FB_API_STAGE_STATS_HAS_COMM, s->has_comm, false);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_MESSAGES_SENT, s->messages_sent, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_MESSAGES_RECEIVED, s->messages_received, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_BYTES_SENT, s->bytes_sent, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_BYTES_RECEIVED, s->bytes_received, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_BYTES_RAW_SENT, s->bytes_raw_sent, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_ERRORS, s->errors, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_TIMEOUTS, s->timeouts, 0);
	pt_fb_add_u64(b, PT_FB_API_STAGE_STATS_RECONNECTS, s->reconnects, 0);
	return pt_fb_end_table(b, out);
}

static pt_err build_job_info(pt_fb_builder *b, const pt_api_job_info *j, pt_fb_ref *out)
{
	pt_fb_ref name = 0, msg = 0, last = 0, spec = 0, stages = 0, timeline = 0;

	if (j->n_stages > PT_API_MAX_STAGE_STATS)
		return pt_set_error(PT_ERR_INVALID, "JobInfo: %zu stage entries", j->n_stages);
	if (j->n_timeline > PT_API_MAX_TIMELINE)
		return pt_set_error(PT_ERR_INVALID, "JobInfo: %zu timeline tasks", j->n_timeline);
	if (j->n_timeline > 0) {
		/* Field by field into zeroed structs: no padding leaves this process. */
		uint8_t *v = NULL;
		PT_TRY(pt_fb_reserve_vector(b, j->n_timeline, PT_FB_API_TASK_SPAN_SIZE,
		                            PT_FB_API_TASK_SPAN_ALIGN, (void **)&v, &timeline));
		memset(v, 0, j->n_timeline * PT_FB_API_TASK_SPAN_SIZE);
		for (size_t i = 0; i < j->n_timeline; i++) {
			const pt_api_task_span *s = &j->timeline[i];
			uint8_t *d = v + i * PT_FB_API_TASK_SPAN_SIZE;
			memcpy(d + PT_FB_API_TASK_SPAN_START_OFFSET, &s->start, 4);
			memcpy(d + PT_FB_API_TASK_SPAN_END_OFFSET, &s->end, 4);
			memcpy(d + PT_FB_API_TASK_SPAN_MICROBATCH_OFFSET, &s->microbatch, 4);
			memcpy(d + PT_FB_API_TASK_SPAN_STAGE_OFFSET, &s->stage, 1);
			memcpy(d + PT_FB_API_TASK_SPAN_KIND_OFFSET, &s->kind, 1);
		}
	}
	if (j->n_stages > 0)
		PT_TRY(build_table_vector(b, j->stages, j->n_stages, sizeof(*j->stages),
		                          build_stage_stats, &stages));
	str_ref(b, j->name, &name);
	str_ref(b, j->message, &msg);
	if (j->has_last)
		PT_TRY(build_point(b, &j->last, &last));
	if (j->spec)
		PT_TRY(pt_job_spec_build(b, j->spec, &spec));
	pt_fb_start_table(b);
	pt_fb_add_u64(b, PT_FB_API_JOB_INFO_ID, j->id, 0);
	pt_fb_add_offset(b, PT_FB_API_JOB_INFO_NAME, name);
	pt_fb_add_u8(b, PT_FB_API_JOB_INFO_STATE, (uint8_t)j->state, 0);
	pt_fb_add_offset(b, PT_FB_API_JOB_INFO_MESSAGE, msg);
	pt_fb_add_i64(b, PT_FB_API_JOB_INFO_STEP, j->step, 0);
	pt_fb_add_i64(b, PT_FB_API_JOB_INFO_STEPS, j->steps, 0);
	pt_fb_add_f64(b, PT_FB_API_JOB_INFO_SUBMITTED_UNIX, j->submitted_unix, 0);
	pt_fb_add_f64(b, PT_FB_API_JOB_INFO_STARTED_UNIX, j->started_unix, 0);
	pt_fb_add_f64(b, PT_FB_API_JOB_INFO_FINISHED_UNIX, j->finished_unix, 0);
	pt_fb_add_offset(b, PT_FB_API_JOB_INFO_LAST, last);
	pt_fb_add_offset(b, PT_FB_API_JOB_INFO_SPEC, spec);
	pt_fb_add_offset(b, PT_FB_API_JOB_INFO_STAGES, stages);
	pt_fb_add_offset(b, PT_FB_API_JOB_INFO_TIMELINE, timeline);
	return pt_fb_end_table(b, out);
}

static pt_err build_job_fn(pt_fb_builder *b, const void *item, pt_fb_ref *out)
{
	return build_job_info(b, item, out);
}

static pt_err build_point_fn(pt_fb_builder *b, const void *item, pt_fb_ref *out)
{
	return build_point(b, item, out);
}

static pt_err build_ckpt_fn(pt_fb_builder *b, const void *item, pt_fb_ref *out)
{
	const pt_api_checkpoint_info *c = item;
	pt_fb_ref sha = 0;

	str_ref(b, c->sha256, &sha);
	pt_fb_start_table(b);
	pt_fb_add_i64(b, PT_FB_API_CHECKPOINT_INFO_STEP, c->step, 0);
	pt_fb_add_u64(b, PT_FB_API_CHECKPOINT_INFO_SIZE, c->size, 0);
	pt_fb_add_offset(b, PT_FB_API_CHECKPOINT_INFO_SHA256, sha);
	return pt_fb_end_table(b, out);
}

static pt_err build_worker_fn(pt_fb_builder *b, const void *item, pt_fb_ref *out)
{
	const pt_api_worker_info *w = item;
	pt_fb_ref url = 0, msg = 0, devs = 0;

	str_ref(b, w->url, &url);
	str_ref(b, w->message, &msg);
	str_ref(b, w->devices, &devs);
	pt_fb_start_table(b);
	pt_fb_add_offset(b, PT_FB_API_WORKER_INFO_URL, url);
	pt_fb_add_u8(b, PT_FB_API_WORKER_INFO_STATE, (uint8_t)w->state, 0);
	pt_fb_add_u64(b, PT_FB_API_WORKER_INFO_JOB, w->job, 0);
	pt_fb_add_bool(b, PT_FB_API_WORKER_INFO_DRAINING, w->draining, false);
	pt_fb_add_f64(b, PT_FB_API_WORKER_INFO_SINCE_UNIX, w->since_unix, 0);
	pt_fb_add_f64(b, PT_FB_API_WORKER_INFO_LAST_HEARTBEAT_UNIX, w->last_heartbeat_unix, 0);
	pt_fb_add_offset(b, PT_FB_API_WORKER_INFO_MESSAGE, msg);
	pt_fb_add_offset(b, PT_FB_API_WORKER_INFO_DEVICES, devs);
	return pt_fb_end_table(b, out);
}

static pt_err build_plan_fn(pt_fb_builder *b, const void *item, pt_fb_ref *out)
{
	const pt_api_plan *p = item;
	pt_fb_ref sched = 0, bounds = 0, bytes = 0;

	if (p->n_boundaries < 0 || p->n_boundaries > PT_API_MAX_STAGES + 1 ||
	    p->n_stage_bytes < 0 || p->n_stage_bytes > PT_API_MAX_STAGES)
		return pt_set_error(PT_ERR_INVALID, "Plan: too many stages");
	str_ref(b, p->schedule, &sched);
	if (p->n_boundaries > 0)
		PT_TRY(
		    pt_fb_create_vector(b, p->boundaries, (size_t)p->n_boundaries, 4, 4, &bounds));
	if (p->n_stage_bytes > 0)
		PT_TRY(
		    pt_fb_create_vector(b, p->stage_bytes, (size_t)p->n_stage_bytes, 8, 8, &bytes));
	pt_fb_start_table(b);
	pt_fb_add_offset(b, PT_FB_API_PLAN_SCHEDULE, sched);
	pt_fb_add_i32(b, PT_FB_API_PLAN_STAGES, p->stages, 0);
	pt_fb_add_i32(b, PT_FB_API_PLAN_MICROBATCHES, p->microbatches, 0);
	pt_fb_add_i32(b, PT_FB_API_PLAN_VIRTUAL_STAGES, p->virtual_stages, 0);
	pt_fb_add_f64(b, PT_FB_API_PLAN_STEP_SECONDS, p->step_seconds, 0);
	pt_fb_add_f64(b, PT_FB_API_PLAN_BUBBLE, p->bubble, 0);
	pt_fb_add_f64(b, PT_FB_API_PLAN_SAMPLES_PER_SECOND, p->samples_per_second, 0);
	pt_fb_add_offset(b, PT_FB_API_PLAN_BOUNDARIES, bounds);
	pt_fb_add_offset(b, PT_FB_API_PLAN_STAGE_BYTES, bytes);
	return pt_fb_end_table(b, out);
}

static pt_err build_response_body(pt_fb_builder *b, const pt_api_response *r, pt_fb_ref *out)
{
	pt_fb_ref v = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0;

	*out = 0;
	switch (r->kind) {
	case PT_API_SUBMIT_JOB:
		pt_fb_start_table(b);
		pt_fb_add_u64(b, PT_FB_API_SUBMIT_JOB_REPLY_JOB, r->job, 0);
		break;
	case PT_API_GET_JOB:
		if (r->n_jobs != 1 || r->jobs == NULL)
			return pt_set_error(PT_ERR_INVALID, "GetJobReply: needs exactly one job");
		PT_TRY(build_job_info(b, &r->jobs[0], &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_GET_JOB_REPLY_JOB, v);
		break;
	case PT_API_LIST_JOBS:
		PT_TRY(
		    build_table_vector(b, r->jobs, r->n_jobs, sizeof(*r->jobs), build_job_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_LIST_JOBS_REPLY_JOBS, v);
		break;
	case PT_API_CANCEL_JOB:
		pt_fb_start_table(b);
		pt_fb_add_u8(b, PT_FB_API_CANCEL_JOB_REPLY_STATE, (uint8_t)r->state, 0);
		break;
	case PT_API_WATCH_METRICS:
		PT_TRY(build_table_vector(b, r->points, r->n_points, sizeof(*r->points),
		                          build_point_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_WATCH_METRICS_REPLY_POINTS, v);
		pt_fb_add_i64(b, PT_FB_API_WATCH_METRICS_REPLY_CURSOR, r->cursor, 0);
		pt_fb_add_u8(b, PT_FB_API_WATCH_METRICS_REPLY_STATE, (uint8_t)r->state, 0);
		pt_fb_add_bool(b, PT_FB_API_WATCH_METRICS_REPLY_ENDED, r->ended, false);
		break;
	case PT_API_FETCH_CHECKPOINT:
		if (r->data_len > PT_API_MAX_CHUNK || (r->data_len && r->data == NULL))
			return pt_set_error(PT_ERR_INVALID,
			                    "FetchCheckpointReply: data_len %zu over %u or no data",
			                    r->data_len, PT_API_MAX_CHUNK);
		pt_fb_create_vector(b, r->data_len ? (const void *)r->data : (const void *)"",
		                    r->data_len, 1, 1, &v);
		str_ref(b, r->sha256, &s1);
		pt_fb_start_table(b);
		pt_fb_add_i64(b, PT_FB_API_FETCH_CHECKPOINT_REPLY_STEP, r->step, 0);
		pt_fb_add_u64(b, PT_FB_API_FETCH_CHECKPOINT_REPLY_TOTAL_SIZE, r->total_size, 0);
		pt_fb_add_u64(b, PT_FB_API_FETCH_CHECKPOINT_REPLY_OFFSET, r->offset, 0);
		pt_fb_add_offset(b, PT_FB_API_FETCH_CHECKPOINT_REPLY_DATA, v);
		pt_fb_add_offset(b, PT_FB_API_FETCH_CHECKPOINT_REPLY_SHA256, s1);
		break;
	case PT_API_LIST_CHECKPOINTS:
		PT_TRY(build_table_vector(b, r->checkpoints, r->n_checkpoints,
		                          sizeof(*r->checkpoints), build_ckpt_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_LIST_CHECKPOINTS_REPLY_CHECKPOINTS, v);
		break;
	case PT_API_SERVER_INFO:
		str_ref(b, r->info.version, &s1);
		str_ref(b, r->info.device, &s2);
		str_ref(b, r->info.kernels, &s3);
		str_ref(b, r->info.devices, &s4);
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_SERVER_INFO_REPLY_VERSION, s1);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_PROTOCOL, r->info.protocol, 0);
		pt_fb_add_offset(b, PT_FB_API_SERVER_INFO_REPLY_DEVICE, s2);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_JOBS_QUEUED, r->info.jobs_queued, 0);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_JOBS_RUNNING, r->info.jobs_running, 0);
		pt_fb_add_f64(b, PT_FB_API_SERVER_INFO_REPLY_UPTIME_SECONDS, r->info.uptime_seconds,
		              0);
		pt_fb_add_offset(b, PT_FB_API_SERVER_INFO_REPLY_KERNELS, s3);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_WORKERS, r->info.workers, 0);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_WORKERS_FREE, r->info.workers_free, 0);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_WORKERS_BUSY, r->info.workers_busy, 0);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_WORKERS_UNREACHABLE,
		              r->info.workers_unreachable, 0);
		pt_fb_add_i32(b, PT_FB_API_SERVER_INFO_REPLY_DEVICES_IN_USE, r->info.devices_in_use,
		              0);
		pt_fb_add_offset(b, PT_FB_API_SERVER_INFO_REPLY_DEVICES, s4);
		break;
	case PT_API_LIST_WORKERS:
		PT_TRY(build_table_vector(b, r->workers, r->n_workers, sizeof(*r->workers),
		                          build_worker_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_LIST_WORKERS_REPLY_WORKERS, v);
		break;
	case PT_API_DRAIN_WORKER:
		pt_fb_start_table(b);
		break;
	case PT_API_PLAN_JOB:
		PT_TRY(build_table_vector(b, r->plans, r->n_plans, sizeof(*r->plans), build_plan_fn,
		                          &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_API_PLAN_JOB_REPLY_PLANS, v);
		break;
	default:
		return pt_set_error(PT_ERR_INVALID, "Response: unknown kind %d", (int)r->kind);
	}
	return pt_fb_end_table(b, out);
}

pt_err pt_api_build_response(pt_fb_builder *b, const pt_api_response *r, const uint8_t **data,
                             size_t *size)
{
	pt_fb_ref msg = 0, body = 0, root = 0;

	if (b == NULL || r == NULL || data == NULL || size == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_api_build_response: NULL argument");
	if ((unsigned)r->kind >= PT_API_KIND_COUNT)
		return pt_set_error(PT_ERR_INVALID, "Response: unknown kind %d", (int)r->kind);
	pt_fb_builder_reset(b);
	if (r->kind != PT_API_NONE)
		PT_TRY(build_response_body(b, r, &body));
	str_ref(b, r->message, &msg);
	pt_fb_start_table(b);
	pt_fb_add_u64(b, PT_FB_API_RESPONSE_ID, r->id, 0);
	pt_fb_add_i32(b, PT_FB_API_RESPONSE_CODE, (int32_t)r->code, 0);
	pt_fb_add_offset(b, PT_FB_API_RESPONSE_MESSAGE, msg);
	pt_fb_add_union(b, PT_FB_API_RESPONSE_BODY_TYPE, (uint8_t)r->kind, body);
	pt_fb_end_table(b, &root);
	return pt_fb_finish(b, root, NULL, data, size);
}

pt_err pt_api_build_error(pt_fb_builder *b, uint64_t id, pt_api_code code, const uint8_t **data,
                          size_t *size, const char *fmt, ...)
{
	pt_api_response r;
	char msg[1024];

	pt_api_response_init(&r, id, code, PT_API_NONE);
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		r.message = msg;
	}
	return pt_api_build_response(b, &r, data, size);
}

pt_err pt_api_parse_response(const void *buf, size_t size, pt_api_response *out)
{
	const uint8_t *root, *body;
	uint8_t type;
	uint32_t n;

	if (buf == NULL || out == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_api_parse_response: NULL argument");
	pt_api_response_init(out, 0, PT_API_OK, PT_API_NONE);
	if (((uintptr_t)buf & 3u) != 0)
		return pt_set_error(PT_ERR_FORMAT, "Response: buffer not 4-byte aligned");
	if (pt_fb_verify(buf, size, &pt_fb_api_response_desc, NULL, &verify_opts) != PT_OK) {
		read_id(buf, size, &out->id);
		return pt_set_error(PT_ERR_FORMAT, "bad response: %s", pt_last_error());
	}
	root = pt_fb_root(buf);
	out->id = pt_fb_get_u64(root, PT_FB_API_RESPONSE_ID, 0);
	out->code = (pt_api_code)pt_fb_get_i32(root, PT_FB_API_RESPONSE_CODE, 0);
	out->message = opt_string(root, PT_FB_API_RESPONSE_MESSAGE);
	body = pt_fb_get_union(root, PT_FB_API_RESPONSE_BODY_TYPE, &type);
	if (body != NULL && type >= PT_API_KIND_COUNT)
		return pt_set_error(PT_ERR_FORMAT, "Response: unknown body type %u", type);
	out->kind = body ? (pt_api_kind)type : PT_API_NONE;
	if (body == NULL)
		return PT_OK;
	switch (out->kind) {
	case PT_API_SUBMIT_JOB:
		out->job = pt_fb_get_u64(body, PT_FB_API_SUBMIT_JOB_REPLY_JOB, 0);
		break;
	case PT_API_GET_JOB:
		out->vec_ = pt_fb_get_table(body, PT_FB_API_GET_JOB_REPLY_JOB);
		out->n_jobs = out->vec_ ? 1 : 0;
		break;
	case PT_API_LIST_JOBS:
		out->vec_ = pt_fb_get_vector(body, PT_FB_API_LIST_JOBS_REPLY_JOBS, &n);
		out->n_jobs = n;
		break;
	case PT_API_CANCEL_JOB:
		out->state =
		    (pt_api_job_state)pt_fb_get_u8(body, PT_FB_API_CANCEL_JOB_REPLY_STATE, 0);
		break;
	case PT_API_WATCH_METRICS:
		out->vec_ = pt_fb_get_vector(body, PT_FB_API_WATCH_METRICS_REPLY_POINTS, &n);
		out->n_points = n;
		out->cursor = pt_fb_get_i64(body, PT_FB_API_WATCH_METRICS_REPLY_CURSOR, 0);
		out->state =
		    (pt_api_job_state)pt_fb_get_u8(body, PT_FB_API_WATCH_METRICS_REPLY_STATE, 0);
		out->ended = pt_fb_get_bool(body, PT_FB_API_WATCH_METRICS_REPLY_ENDED, false);
		break;
	case PT_API_FETCH_CHECKPOINT:
		out->step = pt_fb_get_i64(body, PT_FB_API_FETCH_CHECKPOINT_REPLY_STEP, 0);
		out->total_size =
		    pt_fb_get_u64(body, PT_FB_API_FETCH_CHECKPOINT_REPLY_TOTAL_SIZE, 0);
		out->offset = pt_fb_get_u64(body, PT_FB_API_FETCH_CHECKPOINT_REPLY_OFFSET, 0);
		out->data = pt_fb_get_vector(body, PT_FB_API_FETCH_CHECKPOINT_REPLY_DATA, &n);
		out->data_len = n;
		out->sha256 = opt_string(body, PT_FB_API_FETCH_CHECKPOINT_REPLY_SHA256);
		break;
	case PT_API_LIST_CHECKPOINTS:
		out->vec_ =
		    pt_fb_get_vector(body, PT_FB_API_LIST_CHECKPOINTS_REPLY_CHECKPOINTS, &n);
		out->n_checkpoints = n;
		break;
	case PT_API_SERVER_INFO:
		out->info.version = opt_string(body, PT_FB_API_SERVER_INFO_REPLY_VERSION);
		out->info.protocol = pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_PROTOCOL, 0);
		out->info.device = opt_string(body, PT_FB_API_SERVER_INFO_REPLY_DEVICE);
		out->info.jobs_queued =
		    pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_JOBS_QUEUED, 0);
		out->info.jobs_running =
		    pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_JOBS_RUNNING, 0);
		out->info.uptime_seconds =
		    pt_fb_get_f64(body, PT_FB_API_SERVER_INFO_REPLY_UPTIME_SECONDS, 0);
		out->info.kernels = opt_string(body, PT_FB_API_SERVER_INFO_REPLY_KERNELS);
		out->info.workers = pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_WORKERS, 0);
		out->info.workers_free =
		    pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_WORKERS_FREE, 0);
		out->info.workers_busy =
		    pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_WORKERS_BUSY, 0);
		out->info.workers_unreachable =
		    pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_WORKERS_UNREACHABLE, 0);
		out->info.devices_in_use =
		    pt_fb_get_i32(body, PT_FB_API_SERVER_INFO_REPLY_DEVICES_IN_USE, 0);
		out->info.devices = opt_string(body, PT_FB_API_SERVER_INFO_REPLY_DEVICES);
		break;
	case PT_API_LIST_WORKERS:
		out->vec_ = pt_fb_get_vector(body, PT_FB_API_LIST_WORKERS_REPLY_WORKERS, &n);
		out->n_workers = n;
		break;
	case PT_API_PLAN_JOB:
		out->vec_ = pt_fb_get_vector(body, PT_FB_API_PLAN_JOB_REPLY_PLANS, &n);
		out->n_plans = n;
		break;
	default:
		break;
	}
	return PT_OK;
}

pt_err pt_api_response_plan(const pt_api_response *r, size_t i, pt_api_plan *out)
{
	const uint8_t *t, *v;
	uint32_t n;

	if (r == NULL || out == NULL || (r->n_plans && r->vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID, "pt_api_response_plan: not a parsed view");
	if (i >= r->n_plans)
		return pt_set_error(PT_ERR_RANGE, "plan %zu of %zu", i, r->n_plans);
	t = pt_fb_vec_table(r->vec_, (uint32_t)i);
	memset(out, 0, sizeof(*out));
	out->schedule = opt_string(t, PT_FB_API_PLAN_SCHEDULE);
	out->stages = pt_fb_get_i32(t, PT_FB_API_PLAN_STAGES, 0);
	out->microbatches = pt_fb_get_i32(t, PT_FB_API_PLAN_MICROBATCHES, 0);
	out->virtual_stages = pt_fb_get_i32(t, PT_FB_API_PLAN_VIRTUAL_STAGES, 0);
	out->step_seconds = pt_fb_get_f64(t, PT_FB_API_PLAN_STEP_SECONDS, 0);
	out->bubble = pt_fb_get_f64(t, PT_FB_API_PLAN_BUBBLE, 0);
	out->samples_per_second = pt_fb_get_f64(t, PT_FB_API_PLAN_SAMPLES_PER_SECOND, 0);
	if ((v = pt_fb_get_vector(t, PT_FB_API_PLAN_BOUNDARIES, &n)) != NULL) {
		if (n > PT_API_MAX_STAGES + 1)
			return pt_set_error(PT_ERR_FORMAT, "Plan.boundaries: %u entries", n);
		memcpy(out->boundaries, v, (size_t)n * 4);
		out->n_boundaries = (int)n;
	}
	if ((v = pt_fb_get_vector(t, PT_FB_API_PLAN_STAGE_BYTES, &n)) != NULL) {
		if (n > PT_API_MAX_STAGES)
			return pt_set_error(PT_ERR_FORMAT, "Plan.stage_bytes: %u entries", n);
		memcpy(out->stage_bytes, v, (size_t)n * 8);
		out->n_stage_bytes = (int)n;
	}
	return PT_OK;
}

static void read_point(const uint8_t *t, pt_api_metric_point *p)
{
	const uint8_t *busy;
	uint32_t n;

	memset(p, 0, sizeof(*p));
	p->step = pt_fb_get_i64(t, PT_FB_API_METRIC_POINT_STEP, 0);
	p->loss = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_LOSS, 0);
	p->learning_rate = pt_fb_get_f32(t, PT_FB_API_METRIC_POINT_LEARNING_RATE, 0);
	p->grad_norm = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_GRAD_NORM, 0);
	p->samples_per_second = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_SAMPLES_PER_SECOND, 0);
	p->tokens_per_second = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_TOKENS_PER_SECOND, 0);
	p->bubble = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_BUBBLE, 0);
	busy = pt_fb_get_vector(t, PT_FB_API_METRIC_POINT_STAGE_BUSY, &n);
	if (n > PT_API_MAX_STAGES)
		n = PT_API_MAX_STAGES;
	p->n_stages = (int)n;
	for (uint32_t i = 0; i < n; i++)
		p->stage_busy[i] = pt_fb_load_f64(busy + 8u * i);
	p->eval_loss = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_EVAL_LOSS, 0);
	p->eval_accuracy = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_EVAL_ACCURACY, 0);
	p->time_unix = pt_fb_get_f64(t, PT_FB_API_METRIC_POINT_TIME_UNIX, 0);
}

pt_err pt_api_response_job(const pt_api_response *r, size_t i, pt_api_job_info *out)
{
	const uint8_t *t, *last;
	uint32_t n;

	if (r == NULL || out == NULL || (r->n_jobs && r->vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID, "pt_api_response_job: not a parsed view");
	if (i >= r->n_jobs)
		return pt_set_error(PT_ERR_RANGE, "job %zu of %zu", i, r->n_jobs);
	t = r->kind == PT_API_GET_JOB ? r->vec_ : pt_fb_vec_table(r->vec_, (uint32_t)i);
	memset(out, 0, sizeof(*out));
	out->id = pt_fb_get_u64(t, PT_FB_API_JOB_INFO_ID, 0);
	out->name = opt_string(t, PT_FB_API_JOB_INFO_NAME);
	out->state = (pt_api_job_state)pt_fb_get_u8(t, PT_FB_API_JOB_INFO_STATE, 0);
	out->message = opt_string(t, PT_FB_API_JOB_INFO_MESSAGE);
	out->step = pt_fb_get_i64(t, PT_FB_API_JOB_INFO_STEP, 0);
	out->steps = pt_fb_get_i64(t, PT_FB_API_JOB_INFO_STEPS, 0);
	out->submitted_unix = pt_fb_get_f64(t, PT_FB_API_JOB_INFO_SUBMITTED_UNIX, 0);
	out->started_unix = pt_fb_get_f64(t, PT_FB_API_JOB_INFO_STARTED_UNIX, 0);
	out->finished_unix = pt_fb_get_f64(t, PT_FB_API_JOB_INFO_FINISHED_UNIX, 0);
	if ((last = pt_fb_get_table(t, PT_FB_API_JOB_INFO_LAST)) != NULL) {
		out->has_last = true;
		read_point(last, &out->last);
	}
	out->spec_table = pt_fb_get_table(t, PT_FB_API_JOB_INFO_SPEC);
	out->stages_vec_ = pt_fb_get_vector(t, PT_FB_API_JOB_INFO_STAGES, &n);
	out->n_stages = out->stages_vec_ ? n : 0;
	out->timeline_vec_ = pt_fb_get_vector(t, PT_FB_API_JOB_INFO_TIMELINE, &n);
	out->n_timeline = out->timeline_vec_ ? n : 0;
	return PT_OK;
}

pt_err pt_api_job_task(const pt_api_job_info *j, size_t i, pt_api_task_span *out)
{
	const uint8_t *d;

	if (j == NULL || out == NULL || (j->n_timeline && j->timeline_vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID, "pt_api_job_task: not a parsed view");
	if (i >= j->n_timeline)
		return pt_set_error(PT_ERR_RANGE, "timeline task %zu of %zu", i, j->n_timeline);
	d = j->timeline_vec_ + i * PT_FB_API_TASK_SPAN_SIZE;
	memset(out, 0, sizeof(*out));
	memcpy(&out->start, d + PT_FB_API_TASK_SPAN_START_OFFSET, 4);
	memcpy(&out->end, d + PT_FB_API_TASK_SPAN_END_OFFSET, 4);
	memcpy(&out->microbatch, d + PT_FB_API_TASK_SPAN_MICROBATCH_OFFSET, 4);
	memcpy(&out->stage, d + PT_FB_API_TASK_SPAN_STAGE_OFFSET, 1);
	memcpy(&out->kind, d + PT_FB_API_TASK_SPAN_KIND_OFFSET, 1);
	return PT_OK;
}

pt_err pt_api_job_stage(const pt_api_job_info *j, size_t i, pt_api_stage_stats *out)
{
	const uint8_t *t;

	if (j == NULL || out == NULL || (j->n_stages && j->stages_vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID, "pt_api_job_stage: not a parsed view");
	if (i >= j->n_stages)
		return pt_set_error(PT_ERR_RANGE, "stage entry %zu of %zu", i, j->n_stages);
	t = pt_fb_vec_table(j->stages_vec_, (uint32_t)i);
	memset(out, 0, sizeof(*out));
	out->stage = pt_fb_get_i32(t, PT_FB_API_STAGE_STATS_STAGE, 0);
	out->busy_seconds = pt_fb_get_f64(t, PT_FB_API_STAGE_STATS_BUSY_SECONDS, 0);
	out->has_comm = pt_fb_get_bool(t, PT_FB_API_STAGE_STATS_HAS_COMM, false);
	out->messages_sent = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_MESSAGES_SENT, 0);
	out->messages_received = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_MESSAGES_RECEIVED, 0);
	out->bytes_sent = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_BYTES_SENT, 0);
	out->bytes_received = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_BYTES_RECEIVED, 0);
	out->bytes_raw_sent = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_BYTES_RAW_SENT, 0);
	out->errors = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_ERRORS, 0);
	out->timeouts = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_TIMEOUTS, 0);
	out->reconnects = pt_fb_get_u64(t, PT_FB_API_STAGE_STATS_RECONNECTS, 0);
	return PT_OK;
}

pt_err pt_api_response_point(const pt_api_response *r, size_t i, pt_api_metric_point *out)
{
	if (r == NULL || out == NULL || (r->n_points && r->vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID, "pt_api_response_point: not a parsed view");
	if (i >= r->n_points)
		return pt_set_error(PT_ERR_RANGE, "point %zu of %zu", i, r->n_points);
	read_point(pt_fb_vec_table(r->vec_, (uint32_t)i), out);
	return PT_OK;
}

pt_err pt_api_response_checkpoint(const pt_api_response *r, size_t i, pt_api_checkpoint_info *out)
{
	const uint8_t *t;

	if (r == NULL || out == NULL || (r->n_checkpoints && r->vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID,
		                    "pt_api_response_checkpoint: not a parsed view");
	if (i >= r->n_checkpoints)
		return pt_set_error(PT_ERR_RANGE, "checkpoint %zu of %zu", i, r->n_checkpoints);
	t = pt_fb_vec_table(r->vec_, (uint32_t)i);
	out->step = pt_fb_get_i64(t, PT_FB_API_CHECKPOINT_INFO_STEP, 0);
	out->size = pt_fb_get_u64(t, PT_FB_API_CHECKPOINT_INFO_SIZE, 0);
	out->sha256 = opt_string(t, PT_FB_API_CHECKPOINT_INFO_SHA256);
	return PT_OK;
}

pt_err pt_api_response_worker(const pt_api_response *r, size_t i, pt_api_worker_info *out)
{
	const uint8_t *t;
	uint8_t st;

	if (r == NULL || out == NULL || (r->n_workers && r->vec_ == NULL))
		return pt_set_error(PT_ERR_INVALID, "pt_api_response_worker: not a parsed view");
	if (i >= r->n_workers)
		return pt_set_error(PT_ERR_RANGE, "worker %zu of %zu", i, r->n_workers);
	t = pt_fb_vec_table(r->vec_, (uint32_t)i);
	out->url = opt_string(t, PT_FB_API_WORKER_INFO_URL);
	st = pt_fb_get_u8(t, PT_FB_API_WORKER_INFO_STATE, 0);
	out->state =
	    st <= PT_API_WORKER_UNREACHABLE ? (pt_api_worker_state)st : PT_API_WORKER_UNKNOWN;
	out->job = pt_fb_get_u64(t, PT_FB_API_WORKER_INFO_JOB, 0);
	out->draining = pt_fb_get_bool(t, PT_FB_API_WORKER_INFO_DRAINING, false);
	out->since_unix = pt_fb_get_f64(t, PT_FB_API_WORKER_INFO_SINCE_UNIX, 0);
	out->last_heartbeat_unix = pt_fb_get_f64(t, PT_FB_API_WORKER_INFO_LAST_HEARTBEAT_UNIX, 0);
	out->message = opt_string(t, PT_FB_API_WORKER_INFO_MESSAGE);
	out->devices = opt_string(t, PT_FB_API_WORKER_INFO_DEVICES);
	return PT_OK;
}

const char *pt_api_worker_state_name(pt_api_worker_state s)
{
	static const char *const names[] = {"unknown", "idle", "busy", "unreachable"};
	return (unsigned)s < 4 ? names[s] : "unknown";
}
