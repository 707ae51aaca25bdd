/* wire.c - Control, Reply and StageError (schema/stage.fbs) over pt_msg blobs. */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#include "fb.h"
#include "model_wire.h"

/* Field ids follow the declaration order in schema/stage.fbs. */
enum { CONTROL_COMMAND, CONTROL_GRAD_SCALE, CONTROL_STEP, CONTROL_CONFIG };
enum { REPLY_COMMAND, REPLY_SQNORMS, REPLY_TASKS, REPLY_STATS, REPLY_STEPS, REPLY_COMM };
enum {
	STATS_PEAK_LIVE,
	STATS_LIVE,
	STATS_FORWARDS,
	STATS_BACKWARDS,
	STATS_UPDATES,
	STATS_STALENESS_SUM,
	STATS_STALENESS_MAX,
	STATS_BUSY
};
enum {
	COMM_MESSAGES_SENT,
	COMM_MESSAGES_RECEIVED,
	COMM_BYTES_SENT,
	COMM_BYTES_RECEIVED,
	COMM_BYTES_RAW_SENT,
	COMM_ERRORS,
	COMM_TIMEOUTS,
	COMM_RECONNECTS
};
enum { ERROR_STAGE, ERROR_STEP, ERROR_MICROBATCH, ERROR_CODE, ERROR_MESSAGE };

/* struct TaskRecord { kind: ubyte; microbatch: int; step: long; start: double; end: double; } */
#define TASK_RECORD_SIZE 32
_Static_assert(sizeof(pt_task_record) == TASK_RECORD_SIZE, "pt_task_record matches TaskRecord");

static const pt_fb_field_desc control_fields[] = {
    PT_FB_FIELD_SCALAR(CONTROL_COMMAND, "command", 1),
    PT_FB_FIELD_SCALAR(CONTROL_GRAD_SCALE, "grad_scale", 4),
    PT_FB_FIELD_SCALAR(CONTROL_STEP, "step", 8),
};
static const pt_fb_table_desc control_desc = PT_FB_TABLE_DESC("Control", control_fields);

static const pt_fb_field_desc stats_fields[] = {
    PT_FB_FIELD_SCALAR(STATS_PEAK_LIVE, "peak_live", 4),
    PT_FB_FIELD_SCALAR(STATS_LIVE, "live", 4),
    PT_FB_FIELD_SCALAR(STATS_FORWARDS, "forwards", 8),
    PT_FB_FIELD_SCALAR(STATS_BACKWARDS, "backwards", 8),
    PT_FB_FIELD_SCALAR(STATS_UPDATES, "updates", 8),
    PT_FB_FIELD_SCALAR(STATS_STALENESS_SUM, "staleness_sum", 8),
    PT_FB_FIELD_SCALAR(STATS_STALENESS_MAX, "staleness_max", 4),
    PT_FB_FIELD_SCALAR(STATS_BUSY, "busy", 8),
};
static const pt_fb_table_desc stats_desc = PT_FB_TABLE_DESC("StageStats", stats_fields);

static const pt_fb_field_desc comm_fields[] = {
    PT_FB_FIELD_SCALAR(COMM_MESSAGES_SENT, "messages_sent", 8),
    PT_FB_FIELD_SCALAR(COMM_MESSAGES_RECEIVED, "messages_received", 8),
    PT_FB_FIELD_SCALAR(COMM_BYTES_SENT, "bytes_sent", 8),
    PT_FB_FIELD_SCALAR(COMM_BYTES_RECEIVED, "bytes_received", 8),
    PT_FB_FIELD_SCALAR(COMM_BYTES_RAW_SENT, "bytes_raw_sent", 8),
    PT_FB_FIELD_SCALAR(COMM_ERRORS, "errors", 8),
    PT_FB_FIELD_SCALAR(COMM_TIMEOUTS, "timeouts", 8),
    PT_FB_FIELD_SCALAR(COMM_RECONNECTS, "reconnects", 8),
};
static const pt_fb_table_desc comm_desc = PT_FB_TABLE_DESC("CommStats", comm_fields);

static const pt_fb_field_desc reply_fields[] = {
    PT_FB_FIELD_SCALAR(REPLY_COMMAND, "command", 1),
    PT_FB_FIELD_VECTOR(REPLY_SQNORMS, "sqnorms", 8, 8, false),
    PT_FB_FIELD_VECTOR(REPLY_TASKS, "tasks", TASK_RECORD_SIZE, 8, false),
    PT_FB_FIELD_TABLE(REPLY_STATS, "stats", &stats_desc, false),
    PT_FB_FIELD_SCALAR(REPLY_STEPS, "steps", 8),
    PT_FB_FIELD_TABLE(REPLY_COMM, "comm", &comm_desc, false),
};
static const pt_fb_table_desc reply_desc = PT_FB_TABLE_DESC("Reply", reply_fields);

static const pt_fb_field_desc error_fields[] = {
    PT_FB_FIELD_SCALAR(ERROR_STAGE, "stage", 4),
    PT_FB_FIELD_SCALAR(ERROR_STEP, "step", 8),
    PT_FB_FIELD_SCALAR(ERROR_MICROBATCH, "microbatch", 4),
    PT_FB_FIELD_SCALAR(ERROR_CODE, "code", 4),
    PT_FB_FIELD_STRING(ERROR_MESSAGE, "message", false),
};
static const pt_fb_table_desc error_desc = PT_FB_TABLE_DESC("StageError", error_fields);

/* Finishes b's buffer into m's blob. */
static pt_err finish(pt_fb_builder *b, pt_fb_ref root, pt_msg *m)
{
	const uint8_t *data;
	size_t size;
	pt_err rv = pt_fb_finish(b, root, NULL, &data, &size);
	if (rv == PT_OK)
		rv = pt_msg_set_blob(m, data, size);
	pt_fb_builder_fini(b);
	return rv;
}

static const uint8_t *verified_root(const pt_msg *m, const pt_fb_table_desc *desc)
{
	if (m->blob == NULL || pt_fb_verify(m->blob, m->blob_len, desc, NULL, NULL) != PT_OK)
		return NULL;
	return pt_fb_root(m->blob);
}

pt_err pt_wire_control_encode(pt_msg *m, const pt_control *c)
{
	pt_fb_builder b;
	pt_fb_ref root = 0;
	PT_TRY(pt_fb_builder_init(&b, 128));
	pt_fb_start_table(&b);
	pt_fb_add_i64(&b, CONTROL_STEP, c->step, 0);
	pt_fb_add_f32(&b, CONTROL_GRAD_SCALE, c->grad_scale, 1.0f);
	pt_fb_add_u8(&b, CONTROL_COMMAND, (uint8_t)c->cmd, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_control_decode(const pt_msg *m, pt_control *c)
{
	const uint8_t *t = verified_root(m, &control_desc);
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed Control message: %s",
		                    pt_last_error());
	c->cmd = (pt_stage_cmd)pt_fb_get_u8(t, CONTROL_COMMAND, 0);
	c->grad_scale = pt_fb_get_f32(t, CONTROL_GRAD_SCALE, 1.0f);
	c->step = pt_fb_get_i64(t, CONTROL_STEP, 0);
	return PT_OK;
}

pt_err pt_wire_configure_encode(pt_msg *m, const pt_stage_config *cfg)
{
	pt_fb_builder b;
	pt_fb_ref root = 0, conf = 0;
	pt_err rv;
	PT_TRY(pt_fb_builder_init(&b, 1024));
	if ((rv = pt_fb_build_stage_config(&b, cfg, &conf)) != PT_OK) {
		pt_fb_builder_fini(&b);
		return rv;
	}
	pt_fb_start_table(&b);
	pt_fb_add_offset(&b, CONTROL_CONFIG, conf);
	pt_fb_add_u8(&b, CONTROL_COMMAND, PT_CMD_CONFIGURE, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_configure_decode(const pt_msg *m, pt_stage_config *cfg, pt_layer_spec **layers)
{
	const uint8_t *t = verified_root(m, &control_desc), *conf;
	*layers = NULL;
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed Control message: %s",
		                    pt_last_error());
	if (pt_fb_get_u8(t, CONTROL_COMMAND, 0) != PT_CMD_CONFIGURE ||
	    (conf = pt_fb_get_table(t, CONTROL_CONFIG)) == NULL)
		return pt_set_error(PT_ERR_STATE,
		                    "expected a Configure command with a StageConfig");
	return pt_fb_read_stage_config(conf, cfg, layers);
}

pt_err pt_wire_reply_encode(pt_msg *m, const pt_reply *r)
{
	pt_fb_builder b;
	pt_fb_ref root = 0, sq = 0, tasks = 0, stats = 0, comm = 0;
	PT_TRY(pt_fb_builder_init(&b, 256));
	if (r->n_sqnorms > 0)
		pt_fb_create_vector(&b, r->sqnorms, (size_t)r->n_sqnorms, 8, 8, &sq);
	if (r->n_tasks > 0)
		pt_fb_create_vector(&b, r->tasks, (size_t)r->n_tasks, TASK_RECORD_SIZE, 8, &tasks);
	if (r->has_stats) {
		const pt_stage_stats *s = &r->stats;
		pt_fb_start_table(&b);
		pt_fb_add_f64(&b, STATS_BUSY, s->busy, 0.0);
		pt_fb_add_i64(&b, STATS_FORWARDS, s->forwards, 0);
		pt_fb_add_i64(&b, STATS_BACKWARDS, s->backwards, 0);
		pt_fb_add_i64(&b, STATS_UPDATES, s->updates, 0);
		pt_fb_add_i64(&b, STATS_STALENESS_SUM, s->staleness_sum, 0);
		pt_fb_add_i32(&b, STATS_PEAK_LIVE, s->peak_live, 0);
		pt_fb_add_i32(&b, STATS_LIVE, s->live, 0);
		pt_fb_add_i32(&b, STATS_STALENESS_MAX, s->staleness_max, 0);
		pt_fb_end_table(&b, &stats);
	}
	if (r->has_comm) {
		const pt_comm_stats *k = &r->comm;
		pt_fb_start_table(&b);
		pt_fb_add_u64(&b, COMM_MESSAGES_SENT, k->msgs_sent, 0);
		pt_fb_add_u64(&b, COMM_MESSAGES_RECEIVED, k->msgs_recv, 0);
		pt_fb_add_u64(&b, COMM_BYTES_SENT, k->bytes_sent, 0);
		pt_fb_add_u64(&b, COMM_BYTES_RECEIVED, k->bytes_recv, 0);
		pt_fb_add_u64(&b, COMM_BYTES_RAW_SENT, k->bytes_raw_sent, 0);
		pt_fb_add_u64(&b, COMM_ERRORS, k->errors, 0);
		pt_fb_add_u64(&b, COMM_TIMEOUTS, k->timeouts, 0);
		pt_fb_add_u64(&b, COMM_RECONNECTS, k->reconnects, 0);
		pt_fb_end_table(&b, &comm);
	}
	pt_fb_start_table(&b);
	pt_fb_add_i64(&b, REPLY_STEPS, r->steps, 0);
	pt_fb_add_offset(&b, REPLY_SQNORMS, sq);
	pt_fb_add_offset(&b, REPLY_TASKS, tasks);
	pt_fb_add_offset(&b, REPLY_STATS, stats);
	pt_fb_add_offset(&b, REPLY_COMM, comm);
	pt_fb_add_u8(&b, REPLY_COMMAND, (uint8_t)r->cmd, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_reply_decode(const pt_msg *m, pt_reply *r)
{
	const uint8_t *t = verified_root(m, &reply_desc), *v, *s;
	uint32_t n;
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed Reply message: %s", pt_last_error());
	r->cmd = (pt_stage_cmd)pt_fb_get_u8(t, REPLY_COMMAND, 0);
	r->steps = pt_fb_get_i64(t, REPLY_STEPS, 0);
	r->n_sqnorms = 0;
	if ((v = pt_fb_get_vector(t, REPLY_SQNORMS, &n)) != NULL) {
		if ((int)n > r->cap_sqnorms)
			return pt_set_error(PT_ERR_RANGE, "Reply has %u norms, expected at most %d",
			                    n, r->cap_sqnorms);
		memcpy(r->sqnorms, v, (size_t)n * 8);
		r->n_sqnorms = (int)n;
	}
	r->n_tasks = 0;
	if ((v = pt_fb_get_vector(t, REPLY_TASKS, &n)) != NULL) {
		n = (int)n < r->cap_tasks ? n : (uint32_t)r->cap_tasks;
		if (r->tasks)
			memcpy(r->tasks, v, (size_t)n * TASK_RECORD_SIZE);
		r->n_tasks = (int)n;
	}
	r->has_stats = false;
	if ((s = pt_fb_get_table(t, REPLY_STATS)) != NULL) {
		pt_stage_stats *o = &r->stats;
		o->peak_live = pt_fb_get_i32(s, STATS_PEAK_LIVE, 0);
		o->live = pt_fb_get_i32(s, STATS_LIVE, 0);
		o->forwards = pt_fb_get_i64(s, STATS_FORWARDS, 0);
		o->backwards = pt_fb_get_i64(s, STATS_BACKWARDS, 0);
		o->updates = pt_fb_get_i64(s, STATS_UPDATES, 0);
		o->staleness_sum = pt_fb_get_i64(s, STATS_STALENESS_SUM, 0);
		o->staleness_max = pt_fb_get_i32(s, STATS_STALENESS_MAX, 0);
		o->busy = pt_fb_get_f64(s, STATS_BUSY, 0.0);
		r->has_stats = true;
	}
	r->has_comm = false;
	memset(&r->comm, 0, sizeof(r->comm));
	if ((s = pt_fb_get_table(t, REPLY_COMM)) != NULL) {
		pt_comm_stats *k = &r->comm;
		k->msgs_sent = pt_fb_get_u64(s, COMM_MESSAGES_SENT, 0);
		k->msgs_recv = pt_fb_get_u64(s, COMM_MESSAGES_RECEIVED, 0);
		k->bytes_sent = pt_fb_get_u64(s, COMM_BYTES_SENT, 0);
		k->bytes_recv = pt_fb_get_u64(s, COMM_BYTES_RECEIVED, 0);
		k->bytes_raw_sent = pt_fb_get_u64(s, COMM_BYTES_RAW_SENT, 0);
		k->errors = pt_fb_get_u64(s, COMM_ERRORS, 0);
		k->timeouts = pt_fb_get_u64(s, COMM_TIMEOUTS, 0);
		k->reconnects = pt_fb_get_u64(s, COMM_RECONNECTS, 0);
		r->has_comm = true;
	}
	return PT_OK;
}

pt_err pt_wire_error_encode(pt_msg *m, int stage, int64_t step, int32_t mb, pt_err code,
                            const char *message)
{
	pt_fb_builder b;
	pt_fb_ref root = 0, msg = 0;
	PT_TRY(pt_fb_builder_init(&b, 256));
	pt_fb_create_cstring(&b, message, &msg);
	pt_fb_start_table(&b);
	pt_fb_add_i64(&b, ERROR_STEP, step, 0);
	pt_fb_add_offset(&b, ERROR_MESSAGE, msg);
	pt_fb_add_i32(&b, ERROR_STAGE, stage, 0);
	pt_fb_add_i32(&b, ERROR_MICROBATCH, mb, 0);
	pt_fb_add_i32(&b, ERROR_CODE, (int32_t)code, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_error_raise(const pt_msg *m)
{
	const uint8_t *t = verified_root(m, &error_desc);
	const char *msg;
	uint32_t len = 0;
	int code;
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed StageError from rank %d",
		                    m->meta.source);
	code = pt_fb_get_i32(t, ERROR_CODE, PT_ERR_BACKEND);
	if (code <= 0 || code >= PT_ERR_COUNT)
		code = PT_ERR_BACKEND;
	msg = pt_fb_get_string(t, ERROR_MESSAGE, &len);
	return pt_set_error((pt_err)code, "stage %d, step %ld, microbatch %d: %.*s",
	                    pt_fb_get_i32(t, ERROR_STAGE, 0), (long)pt_fb_get_i64(t, ERROR_STEP, 0),
	                    pt_fb_get_i32(t, ERROR_MICROBATCH, 0), (int)(msg ? len : 0),
	                    msg ? msg : "");
}
