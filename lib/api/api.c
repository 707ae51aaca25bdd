/* api.c - Request/Response codec over schema/api.fbs (see api.h).
 *
 * Field ids below are the schema's declaration order; a union takes two ids.
 * The verifier descriptors list every field we read, so a parsed view reads
 * only what pt_fb_verify checked. Limits: one metric point carries at most
 * PT_API_MAX_STAGES stage figures (more are dropped when reading).
 */
#include "api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------ field ids -- */

enum { REQ_ID, REQ_TOKEN, REQ_BODY_TYPE, REQ_BODY };
enum { RESP_ID, RESP_CODE, RESP_MESSAGE, RESP_BODY_TYPE, RESP_BODY };
enum { SUBMIT_SPEC };
enum { JOBREF_JOB };
enum { WATCH_JOB, WATCH_CURSOR, WATCH_WAIT, WATCH_MAX };
enum { FETCH_JOB, FETCH_STEP, FETCH_OFFSET, FETCH_LENGTH };
enum {
	MP_STEP,
	MP_LOSS,
	MP_LR,
	MP_GNORM,
	MP_SPS,
	MP_TPS,
	MP_BUBBLE,
	MP_BUSY,
	MP_EVAL_LOSS,
	MP_EVAL_ACC,
	MP_TIME
};
enum {
	JI_ID,
	JI_NAME,
	JI_STATE,
	JI_MESSAGE,
	JI_STEP,
	JI_STEPS,
	JI_SUBMITTED,
	JI_STARTED,
	JI_FINISHED,
	JI_LAST,
	JI_SPEC,
	JI_STAGES
};
enum {
	SS_STAGE,
	SS_BUSY,
	SS_HAS_COMM,
	SS_MSGS_SENT,
	SS_MSGS_RECV,
	SS_BYTES_SENT,
	SS_BYTES_RECV,
	SS_BYTES_RAW_SENT,
	SS_ERRORS,
	SS_TIMEOUTS,
	SS_RECONNECTS
};
enum { SUBMITR_JOB };
enum { GETR_JOB };
enum { LISTR_JOBS };
enum { CANCELR_STATE };
enum { WATCHR_POINTS, WATCHR_CURSOR, WATCHR_STATE, WATCHR_ENDED };
enum { FETCHR_STEP, FETCHR_TOTAL, FETCHR_OFFSET, FETCHR_DATA, FETCHR_SHA };
enum { CI_STEP, CI_SIZE, CI_SHA };
enum { LISTCR_CKPTS };
enum { SI_VERSION, SI_PROTOCOL, SI_DEVICE, SI_QUEUED, SI_RUNNING, SI_UPTIME };

/* ---------------------------------------------------------- descriptors -- */

#define SC PT_FB_FIELD_SCALAR

static const pt_fb_field_desc submit_fields[] = {
    PT_FB_FIELD_TABLE(SUBMIT_SPEC, "spec", &pt_fb_job_spec_desc, true),
};
static const pt_fb_table_desc submit_desc = PT_FB_TABLE_DESC("SubmitJob", submit_fields);

static const pt_fb_field_desc jobref_fields[] = {SC(JOBREF_JOB, "job", 8)};
static const pt_fb_table_desc get_desc = PT_FB_TABLE_DESC("GetJob", jobref_fields);
static const pt_fb_table_desc cancel_desc = PT_FB_TABLE_DESC("CancelJob", jobref_fields);
static const pt_fb_table_desc listc_desc = PT_FB_TABLE_DESC("ListCheckpoints", jobref_fields);
static const pt_fb_table_desc list_desc = {.name = "ListJobs", .fields = NULL, .nfields = 0};
static const pt_fb_table_desc info_desc = {.name = "ServerInfo", .fields = NULL, .nfields = 0};

static const pt_fb_field_desc watch_fields[] = {
    SC(WATCH_JOB, "job", 8),
    SC(WATCH_CURSOR, "cursor", 8),
    SC(WATCH_WAIT, "wait_ms", 4),
    SC(WATCH_MAX, "max_points", 4),
};
static const pt_fb_table_desc watch_desc = PT_FB_TABLE_DESC("WatchMetrics", watch_fields);

static const pt_fb_field_desc fetch_fields[] = {
    SC(FETCH_JOB, "job", 8),
    SC(FETCH_STEP, "step", 8),
    SC(FETCH_OFFSET, "offset", 8),
    SC(FETCH_LENGTH, "length", 4),
};
static const pt_fb_table_desc fetch_desc = PT_FB_TABLE_DESC("FetchCheckpoint", fetch_fields);

static const pt_fb_table_desc *const request_members[] = {
    &submit_desc, &get_desc,   &list_desc,  &cancel_desc,
    &watch_desc,  &fetch_desc, &listc_desc, &info_desc,
};
static const pt_fb_union_desc request_body = {
    .name = "RequestBody", .count = 8, .members = request_members};

static const pt_fb_field_desc request_fields[] = {
    SC(REQ_ID, "id", 8),
    PT_FB_FIELD_STRING(REQ_TOKEN, "auth_token", false),
    PT_FB_FIELD_UNION(REQ_BODY_TYPE, "body", &request_body, false),
};
const pt_fb_table_desc pt_api_request_desc = PT_FB_TABLE_DESC("Request", request_fields);

static const pt_fb_field_desc point_fields[] = {
    SC(MP_STEP, "step", 8),
    SC(MP_LOSS, "loss", 8),
    SC(MP_LR, "learning_rate", 4),
    SC(MP_GNORM, "grad_norm", 8),
    SC(MP_SPS, "samples_per_second", 8),
    SC(MP_TPS, "tokens_per_second", 8),
    SC(MP_BUBBLE, "bubble", 8),
    PT_FB_FIELD_VECTOR(MP_BUSY, "stage_busy", 8, 8, false),
    SC(MP_EVAL_LOSS, "eval_loss", 8),
    SC(MP_EVAL_ACC, "eval_accuracy", 8),
    SC(MP_TIME, "time_unix", 8),
};
static const pt_fb_table_desc point_desc = PT_FB_TABLE_DESC("MetricPoint", point_fields);

static const pt_fb_field_desc stagestats_fields[] = {
    SC(SS_STAGE, "stage", 4),
    SC(SS_BUSY, "busy_seconds", 8),
    SC(SS_HAS_COMM, "has_comm", 1),
    SC(SS_MSGS_SENT, "messages_sent", 8),
    SC(SS_MSGS_RECV, "messages_received", 8),
    SC(SS_BYTES_SENT, "bytes_sent", 8),
    SC(SS_BYTES_RECV, "bytes_received", 8),
    SC(SS_BYTES_RAW_SENT, "bytes_raw_sent", 8),
    SC(SS_ERRORS, "errors", 8),
    SC(SS_TIMEOUTS, "timeouts", 8),
    SC(SS_RECONNECTS, "reconnects", 8),
};
static const pt_fb_table_desc stagestats_desc = PT_FB_TABLE_DESC("StageStats", stagestats_fields);

static const pt_fb_field_desc jobinfo_fields[] = {
    SC(JI_ID, "id", 8),
    PT_FB_FIELD_STRING(JI_NAME, "name", false),
    SC(JI_STATE, "state", 1),
    PT_FB_FIELD_STRING(JI_MESSAGE, "message", false),
    SC(JI_STEP, "step", 8),
    SC(JI_STEPS, "steps", 8),
    SC(JI_SUBMITTED, "submitted_unix", 8),
    SC(JI_STARTED, "started_unix", 8),
    SC(JI_FINISHED, "finished_unix", 8),
    PT_FB_FIELD_TABLE(JI_LAST, "last", &point_desc, false),
    PT_FB_FIELD_TABLE(JI_SPEC, "spec", &pt_fb_job_spec_desc, false),
    PT_FB_FIELD_VECTOR_TABLE(JI_STAGES, "stages", &stagestats_desc, false),
};
static const pt_fb_table_desc jobinfo_desc = PT_FB_TABLE_DESC("JobInfo", jobinfo_fields);

static const pt_fb_field_desc submitr_fields[] = {SC(SUBMITR_JOB, "job", 8)};
static const pt_fb_table_desc submitr_desc = PT_FB_TABLE_DESC("SubmitJobReply", submitr_fields);

static const pt_fb_field_desc getr_fields[] = {
    PT_FB_FIELD_TABLE(GETR_JOB, "job", &jobinfo_desc, false),
};
static const pt_fb_table_desc getr_desc = PT_FB_TABLE_DESC("GetJobReply", getr_fields);

static const pt_fb_field_desc listr_fields[] = {
    PT_FB_FIELD_VECTOR_TABLE(LISTR_JOBS, "jobs", &jobinfo_desc, false),
};
static const pt_fb_table_desc listr_desc = PT_FB_TABLE_DESC("ListJobsReply", listr_fields);

static const pt_fb_field_desc cancelr_fields[] = {SC(CANCELR_STATE, "state", 1)};
static const pt_fb_table_desc cancelr_desc = PT_FB_TABLE_DESC("CancelJobReply", cancelr_fields);

static const pt_fb_field_desc watchr_fields[] = {
    PT_FB_FIELD_VECTOR_TABLE(WATCHR_POINTS, "points", &point_desc, false),
    SC(WATCHR_CURSOR, "cursor", 8),
    SC(WATCHR_STATE, "state", 1),
    SC(WATCHR_ENDED, "ended", 1),
};
static const pt_fb_table_desc watchr_desc = PT_FB_TABLE_DESC("WatchMetricsReply", watchr_fields);

static const pt_fb_field_desc fetchr_fields[] = {
    SC(FETCHR_STEP, "step", 8),
    SC(FETCHR_TOTAL, "total_size", 8),
    SC(FETCHR_OFFSET, "offset", 8),
    PT_FB_FIELD_VECTOR(FETCHR_DATA, "data", 1, 1, false),
    PT_FB_FIELD_STRING(FETCHR_SHA, "sha256", false),
};
static const pt_fb_table_desc fetchr_desc = PT_FB_TABLE_DESC("FetchCheckpointReply", fetchr_fields);

static const pt_fb_field_desc ckpt_fields[] = {
    SC(CI_STEP, "step", 8),
    SC(CI_SIZE, "size", 8),
    PT_FB_FIELD_STRING(CI_SHA, "sha256", false),
};
static const pt_fb_table_desc ckpt_desc = PT_FB_TABLE_DESC("CheckpointInfo", ckpt_fields);

static const pt_fb_field_desc listcr_fields[] = {
    PT_FB_FIELD_VECTOR_TABLE(LISTCR_CKPTS, "checkpoints", &ckpt_desc, false),
};
static const pt_fb_table_desc listcr_desc = PT_FB_TABLE_DESC("ListCheckpointsReply", listcr_fields);

static const pt_fb_field_desc infor_fields[] = {
    PT_FB_FIELD_STRING(SI_VERSION, "version", false),
    SC(SI_PROTOCOL, "protocol", 4),
    PT_FB_FIELD_STRING(SI_DEVICE, "device", false),
    SC(SI_QUEUED, "jobs_queued", 4),
    SC(SI_RUNNING, "jobs_running", 4),
    SC(SI_UPTIME, "uptime_seconds", 8),
};
static const pt_fb_table_desc infor_desc = PT_FB_TABLE_DESC("ServerInfoReply", infor_fields);

static const pt_fb_table_desc *const response_members[] = {
    &submitr_desc, &getr_desc,   &listr_desc,  &cancelr_desc,
    &watchr_desc,  &fetchr_desc, &listcr_desc, &infor_desc,
};
static const pt_fb_union_desc response_body = {
    .name = "ResponseBody", .count = 8, .members = response_members};

static const pt_fb_field_desc response_fields[] = {
    SC(RESP_ID, "id", 8),
    SC(RESP_CODE, "code", 4),
    PT_FB_FIELD_STRING(RESP_MESSAGE, "message", false),
    PT_FB_FIELD_UNION(RESP_BODY_TYPE, "body", &response_body, false),
};
const pt_fb_table_desc pt_api_response_desc = PT_FB_TABLE_DESC("Response", response_fields);

/* Only the id: verified separately so an error reply can echo it. */
static const pt_fb_field_desc id_fields[] = {SC(0, "id", 8)};
static const pt_fb_table_desc id_only_desc = PT_FB_TABLE_DESC("Request", id_fields);

#undef SC

_Static_assert(PT_API_KIND_COUNT == 9, "RequestBody/ResponseBody have 8 members");
_Static_assert(sizeof(request_members) / sizeof(request_members[0]) == PT_API_KIND_COUNT - 1,
               "one request descriptor per kind");
_Static_assert(sizeof(response_members) / sizeof(response_members[0]) == PT_API_KIND_COUNT - 1,
               "one response descriptor per kind");
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
	pt_fb_start_table(b);
	switch (r->kind) {
	case PT_API_SUBMIT_JOB:
		pt_fb_add_offset(b, SUBMIT_SPEC, spec_ref);
		break;
	case PT_API_GET_JOB:
	case PT_API_CANCEL_JOB:
	case PT_API_LIST_CHECKPOINTS:
		pt_fb_add_u64(b, JOBREF_JOB, r->job, 0);
		break;
	case PT_API_WATCH_METRICS:
		pt_fb_add_u64(b, WATCH_JOB, r->job, 0);
		pt_fb_add_i64(b, WATCH_CURSOR, r->cursor, -1);
		pt_fb_add_i32(b, WATCH_WAIT, r->wait_ms, 1000);
		pt_fb_add_i32(b, WATCH_MAX, r->max_points, 1000);
		break;
	case PT_API_FETCH_CHECKPOINT:
		pt_fb_add_u64(b, FETCH_JOB, r->job, 0);
		pt_fb_add_i64(b, FETCH_STEP, r->step, -1);
		pt_fb_add_u64(b, FETCH_OFFSET, r->offset, 0);
		pt_fb_add_u32(b, FETCH_LENGTH, r->length, PT_API_MAX_CHUNK);
		break;
	default: /* ListJobs, ServerInfo: empty tables */
		break;
	}
	return pt_fb_end_table(b, out);
}

static pt_err finish_request(pt_fb_builder *b, const pt_api_request *r, pt_fb_ref spec_ref,
                             const uint8_t **data, size_t *size)
{
	pt_fb_ref token = 0, body = 0, root = 0;

	str_ref(b, r->auth_token, &token);
	build_request_body(b, r, spec_ref, &body);
	pt_fb_start_table(b);
	pt_fb_add_u64(b, REQ_ID, r->id, 0);
	pt_fb_add_offset(b, REQ_TOKEN, token);
	pt_fb_add_union(b, REQ_BODY_TYPE, (uint8_t)r->kind, body);
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
	if (r->kind == PT_API_SUBMIT_JOB) {
		if (r->spec == NULL)
			return pt_set_error(PT_ERR_INVALID, "SubmitJob: spec is required");
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
	if (pt_fb_verify(buf, size, &pt_api_request_desc, NULL, &verify_opts) != PT_OK) {
		read_id(buf, size, &out->id);
		return pt_set_error(PT_ERR_FORMAT, "bad request: %s", pt_last_error());
	}
	root = pt_fb_root(buf);
	out->id = pt_fb_get_u64(root, REQ_ID, 0);
	out->auth_token = opt_string(root, REQ_TOKEN);
	body = pt_fb_get_union(root, REQ_BODY_TYPE, &type);
	if (body == NULL) {
		uint64_t id = out->id;
		pt_api_request_init(out, PT_API_NONE);
		out->id = id;
		return pt_set_error(PT_ERR_FORMAT, "bad request: Request has no body");
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
		out->spec_table = pt_fb_get_table(body, SUBMIT_SPEC);
		break;
	case PT_API_GET_JOB:
	case PT_API_CANCEL_JOB:
	case PT_API_LIST_CHECKPOINTS:
		out->job = pt_fb_get_u64(body, JOBREF_JOB, 0);
		break;
	case PT_API_WATCH_METRICS:
		out->job = pt_fb_get_u64(body, WATCH_JOB, 0);
		out->cursor = pt_fb_get_i64(body, WATCH_CURSOR, -1);
		out->wait_ms = pt_fb_get_i32(body, WATCH_WAIT, 1000);
		out->max_points = pt_fb_get_i32(body, WATCH_MAX, 1000);
		break;
	case PT_API_FETCH_CHECKPOINT:
		out->job = pt_fb_get_u64(body, FETCH_JOB, 0);
		out->step = pt_fb_get_i64(body, FETCH_STEP, -1);
		out->offset = pt_fb_get_u64(body, FETCH_OFFSET, 0);
		out->length = pt_fb_get_u32(body, FETCH_LENGTH, PT_API_MAX_CHUNK);
		break;
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
	pt_fb_add_i64(b, MP_STEP, p->step, 0);
	pt_fb_add_f64(b, MP_LOSS, p->loss, 0);
	pt_fb_add_f32(b, MP_LR, p->learning_rate, 0);
	pt_fb_add_f64(b, MP_GNORM, p->grad_norm, 0);
	pt_fb_add_f64(b, MP_SPS, p->samples_per_second, 0);
	pt_fb_add_f64(b, MP_TPS, p->tokens_per_second, 0);
	pt_fb_add_f64(b, MP_BUBBLE, p->bubble, 0);
	pt_fb_add_offset(b, MP_BUSY, busy);
	pt_fb_add_f64(b, MP_EVAL_LOSS, p->eval_loss, 0);
	pt_fb_add_f64(b, MP_EVAL_ACC, p->eval_accuracy, 0);
	pt_fb_add_f64(b, MP_TIME, p->time_unix, 0);
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
	pt_fb_add_i32(b, SS_STAGE, s->stage, 0);
	pt_fb_add_f64(b, SS_BUSY, s->busy_seconds, 0);
	pt_fb_add_bool(b, SS_HAS_COMM, s->has_comm, false);
	pt_fb_add_u64(b, SS_MSGS_SENT, s->messages_sent, 0);
	pt_fb_add_u64(b, SS_MSGS_RECV, s->messages_received, 0);
	pt_fb_add_u64(b, SS_BYTES_SENT, s->bytes_sent, 0);
	pt_fb_add_u64(b, SS_BYTES_RECV, s->bytes_received, 0);
	pt_fb_add_u64(b, SS_BYTES_RAW_SENT, s->bytes_raw_sent, 0);
	pt_fb_add_u64(b, SS_ERRORS, s->errors, 0);
	pt_fb_add_u64(b, SS_TIMEOUTS, s->timeouts, 0);
	pt_fb_add_u64(b, SS_RECONNECTS, s->reconnects, 0);
	return pt_fb_end_table(b, out);
}

static pt_err build_job_info(pt_fb_builder *b, const pt_api_job_info *j, pt_fb_ref *out)
{
	pt_fb_ref name = 0, msg = 0, last = 0, spec = 0, stages = 0;

	if (j->n_stages > PT_API_MAX_STAGE_STATS)
		return pt_set_error(PT_ERR_INVALID, "JobInfo: %zu stage entries", j->n_stages);
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
	pt_fb_add_u64(b, JI_ID, j->id, 0);
	pt_fb_add_offset(b, JI_NAME, name);
	pt_fb_add_u8(b, JI_STATE, (uint8_t)j->state, 0);
	pt_fb_add_offset(b, JI_MESSAGE, msg);
	pt_fb_add_i64(b, JI_STEP, j->step, 0);
	pt_fb_add_i64(b, JI_STEPS, j->steps, 0);
	pt_fb_add_f64(b, JI_SUBMITTED, j->submitted_unix, 0);
	pt_fb_add_f64(b, JI_STARTED, j->started_unix, 0);
	pt_fb_add_f64(b, JI_FINISHED, j->finished_unix, 0);
	pt_fb_add_offset(b, JI_LAST, last);
	pt_fb_add_offset(b, JI_SPEC, spec);
	pt_fb_add_offset(b, JI_STAGES, stages);
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
	pt_fb_add_i64(b, CI_STEP, c->step, 0);
	pt_fb_add_u64(b, CI_SIZE, c->size, 0);
	pt_fb_add_offset(b, CI_SHA, sha);
	return pt_fb_end_table(b, out);
}

static pt_err build_response_body(pt_fb_builder *b, const pt_api_response *r, pt_fb_ref *out)
{
	pt_fb_ref v = 0, s1 = 0, s2 = 0;

	*out = 0;
	switch (r->kind) {
	case PT_API_SUBMIT_JOB:
		pt_fb_start_table(b);
		pt_fb_add_u64(b, SUBMITR_JOB, r->job, 0);
		break;
	case PT_API_GET_JOB:
		if (r->n_jobs != 1 || r->jobs == NULL)
			return pt_set_error(PT_ERR_INVALID, "GetJobReply: needs exactly one job");
		PT_TRY(build_job_info(b, &r->jobs[0], &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, GETR_JOB, v);
		break;
	case PT_API_LIST_JOBS:
		PT_TRY(
		    build_table_vector(b, r->jobs, r->n_jobs, sizeof(*r->jobs), build_job_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, LISTR_JOBS, v);
		break;
	case PT_API_CANCEL_JOB:
		pt_fb_start_table(b);
		pt_fb_add_u8(b, CANCELR_STATE, (uint8_t)r->state, 0);
		break;
	case PT_API_WATCH_METRICS:
		PT_TRY(build_table_vector(b, r->points, r->n_points, sizeof(*r->points),
		                          build_point_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, WATCHR_POINTS, v);
		pt_fb_add_i64(b, WATCHR_CURSOR, r->cursor, 0);
		pt_fb_add_u8(b, WATCHR_STATE, (uint8_t)r->state, 0);
		pt_fb_add_bool(b, WATCHR_ENDED, r->ended, false);
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
		pt_fb_add_i64(b, FETCHR_STEP, r->step, 0);
		pt_fb_add_u64(b, FETCHR_TOTAL, r->total_size, 0);
		pt_fb_add_u64(b, FETCHR_OFFSET, r->offset, 0);
		pt_fb_add_offset(b, FETCHR_DATA, v);
		pt_fb_add_offset(b, FETCHR_SHA, s1);
		break;
	case PT_API_LIST_CHECKPOINTS:
		PT_TRY(build_table_vector(b, r->checkpoints, r->n_checkpoints,
		                          sizeof(*r->checkpoints), build_ckpt_fn, &v));
		pt_fb_start_table(b);
		pt_fb_add_offset(b, LISTCR_CKPTS, v);
		break;
	case PT_API_SERVER_INFO:
		str_ref(b, r->info.version, &s1);
		str_ref(b, r->info.device, &s2);
		pt_fb_start_table(b);
		pt_fb_add_offset(b, SI_VERSION, s1);
		pt_fb_add_i32(b, SI_PROTOCOL, r->info.protocol, 0);
		pt_fb_add_offset(b, SI_DEVICE, s2);
		pt_fb_add_i32(b, SI_QUEUED, r->info.jobs_queued, 0);
		pt_fb_add_i32(b, SI_RUNNING, r->info.jobs_running, 0);
		pt_fb_add_f64(b, SI_UPTIME, r->info.uptime_seconds, 0);
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
	pt_fb_add_u64(b, RESP_ID, r->id, 0);
	pt_fb_add_i32(b, RESP_CODE, (int32_t)r->code, 0);
	pt_fb_add_offset(b, RESP_MESSAGE, msg);
	pt_fb_add_union(b, RESP_BODY_TYPE, (uint8_t)r->kind, body);
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
	if (pt_fb_verify(buf, size, &pt_api_response_desc, NULL, &verify_opts) != PT_OK) {
		read_id(buf, size, &out->id);
		return pt_set_error(PT_ERR_FORMAT, "bad response: %s", pt_last_error());
	}
	root = pt_fb_root(buf);
	out->id = pt_fb_get_u64(root, RESP_ID, 0);
	out->code = (pt_api_code)pt_fb_get_i32(root, RESP_CODE, 0);
	out->message = opt_string(root, RESP_MESSAGE);
	body = pt_fb_get_union(root, RESP_BODY_TYPE, &type);
	out->kind = body ? (pt_api_kind)type : PT_API_NONE;
	if (body == NULL)
		return PT_OK;
	switch (out->kind) {
	case PT_API_SUBMIT_JOB:
		out->job = pt_fb_get_u64(body, SUBMITR_JOB, 0);
		break;
	case PT_API_GET_JOB:
		out->vec_ = pt_fb_get_table(body, GETR_JOB);
		out->n_jobs = out->vec_ ? 1 : 0;
		break;
	case PT_API_LIST_JOBS:
		out->vec_ = pt_fb_get_vector(body, LISTR_JOBS, &n);
		out->n_jobs = n;
		break;
	case PT_API_CANCEL_JOB:
		out->state = (pt_api_job_state)pt_fb_get_u8(body, CANCELR_STATE, 0);
		break;
	case PT_API_WATCH_METRICS:
		out->vec_ = pt_fb_get_vector(body, WATCHR_POINTS, &n);
		out->n_points = n;
		out->cursor = pt_fb_get_i64(body, WATCHR_CURSOR, 0);
		out->state = (pt_api_job_state)pt_fb_get_u8(body, WATCHR_STATE, 0);
		out->ended = pt_fb_get_bool(body, WATCHR_ENDED, false);
		break;
	case PT_API_FETCH_CHECKPOINT:
		out->step = pt_fb_get_i64(body, FETCHR_STEP, 0);
		out->total_size = pt_fb_get_u64(body, FETCHR_TOTAL, 0);
		out->offset = pt_fb_get_u64(body, FETCHR_OFFSET, 0);
		out->data = pt_fb_get_vector(body, FETCHR_DATA, &n);
		out->data_len = n;
		out->sha256 = opt_string(body, FETCHR_SHA);
		break;
	case PT_API_LIST_CHECKPOINTS:
		out->vec_ = pt_fb_get_vector(body, LISTCR_CKPTS, &n);
		out->n_checkpoints = n;
		break;
	case PT_API_SERVER_INFO:
		out->info.version = opt_string(body, SI_VERSION);
		out->info.protocol = pt_fb_get_i32(body, SI_PROTOCOL, 0);
		out->info.device = opt_string(body, SI_DEVICE);
		out->info.jobs_queued = pt_fb_get_i32(body, SI_QUEUED, 0);
		out->info.jobs_running = pt_fb_get_i32(body, SI_RUNNING, 0);
		out->info.uptime_seconds = pt_fb_get_f64(body, SI_UPTIME, 0);
		break;
	default:
		break;
	}
	return PT_OK;
}

static void read_point(const uint8_t *t, pt_api_metric_point *p)
{
	const uint8_t *busy;
	uint32_t n;

	memset(p, 0, sizeof(*p));
	p->step = pt_fb_get_i64(t, MP_STEP, 0);
	p->loss = pt_fb_get_f64(t, MP_LOSS, 0);
	p->learning_rate = pt_fb_get_f32(t, MP_LR, 0);
	p->grad_norm = pt_fb_get_f64(t, MP_GNORM, 0);
	p->samples_per_second = pt_fb_get_f64(t, MP_SPS, 0);
	p->tokens_per_second = pt_fb_get_f64(t, MP_TPS, 0);
	p->bubble = pt_fb_get_f64(t, MP_BUBBLE, 0);
	busy = pt_fb_get_vector(t, MP_BUSY, &n);
	if (n > PT_API_MAX_STAGES)
		n = PT_API_MAX_STAGES;
	p->n_stages = (int)n;
	for (uint32_t i = 0; i < n; i++)
		p->stage_busy[i] = pt_fb_load_f64(busy + 8u * i);
	p->eval_loss = pt_fb_get_f64(t, MP_EVAL_LOSS, 0);
	p->eval_accuracy = pt_fb_get_f64(t, MP_EVAL_ACC, 0);
	p->time_unix = pt_fb_get_f64(t, MP_TIME, 0);
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
	out->id = pt_fb_get_u64(t, JI_ID, 0);
	out->name = opt_string(t, JI_NAME);
	out->state = (pt_api_job_state)pt_fb_get_u8(t, JI_STATE, 0);
	out->message = opt_string(t, JI_MESSAGE);
	out->step = pt_fb_get_i64(t, JI_STEP, 0);
	out->steps = pt_fb_get_i64(t, JI_STEPS, 0);
	out->submitted_unix = pt_fb_get_f64(t, JI_SUBMITTED, 0);
	out->started_unix = pt_fb_get_f64(t, JI_STARTED, 0);
	out->finished_unix = pt_fb_get_f64(t, JI_FINISHED, 0);
	if ((last = pt_fb_get_table(t, JI_LAST)) != NULL) {
		out->has_last = true;
		read_point(last, &out->last);
	}
	out->spec_table = pt_fb_get_table(t, JI_SPEC);
	out->stages_vec_ = pt_fb_get_vector(t, JI_STAGES, &n);
	out->n_stages = out->stages_vec_ ? n : 0;
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
	out->stage = pt_fb_get_i32(t, SS_STAGE, 0);
	out->busy_seconds = pt_fb_get_f64(t, SS_BUSY, 0);
	out->has_comm = pt_fb_get_bool(t, SS_HAS_COMM, false);
	out->messages_sent = pt_fb_get_u64(t, SS_MSGS_SENT, 0);
	out->messages_received = pt_fb_get_u64(t, SS_MSGS_RECV, 0);
	out->bytes_sent = pt_fb_get_u64(t, SS_BYTES_SENT, 0);
	out->bytes_received = pt_fb_get_u64(t, SS_BYTES_RECV, 0);
	out->bytes_raw_sent = pt_fb_get_u64(t, SS_BYTES_RAW_SENT, 0);
	out->errors = pt_fb_get_u64(t, SS_ERRORS, 0);
	out->timeouts = pt_fb_get_u64(t, SS_TIMEOUTS, 0);
	out->reconnects = pt_fb_get_u64(t, SS_RECONNECTS, 0);
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
	out->step = pt_fb_get_i64(t, CI_STEP, 0);
	out->size = pt_fb_get_u64(t, CI_SIZE, 0);
	out->sha256 = opt_string(t, CI_SHA);
	return PT_OK;
}
