/* wire.c - Control, Reply and StageError (schema/stage.fbs) over pt_msg blobs. */
#include "wire.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fb.h"
#include "fb_schema.h"
#include "model_wire.h"

/* Field ids and verifier descriptors: fb_schema.h, generated from schema/stage.fbs. */
_Static_assert(sizeof(pt_task_record) == PT_FB_STAGE_TASK_RECORD_SIZE &&
                   _Alignof(pt_task_record) == PT_FB_STAGE_TASK_RECORD_ALIGN,
               "pt_task_record matches TaskRecord");
_Static_assert(offsetof(pt_task_record, kind) == PT_FB_STAGE_TASK_RECORD_KIND_OFFSET &&
                   offsetof(pt_task_record, microbatch) ==
                       PT_FB_STAGE_TASK_RECORD_MICROBATCH_OFFSET &&
                   offsetof(pt_task_record, step) == PT_FB_STAGE_TASK_RECORD_STEP_OFFSET &&
                   offsetof(pt_task_record, start) == PT_FB_STAGE_TASK_RECORD_START_OFFSET &&
                   offsetof(pt_task_record, end) == PT_FB_STAGE_TASK_RECORD_END_OFFSET,
               "pt_task_record fields lie where TaskRecord's do");

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
	pt_fb_add_i64(&b, PT_FB_STAGE_CONTROL_STEP, c->step, 0);
	pt_fb_add_f32(&b, PT_FB_STAGE_CONTROL_GRAD_SCALE, c->grad_scale, 1.0f);
	pt_fb_add_u8(&b, PT_FB_STAGE_CONTROL_COMMAND, (uint8_t)c->cmd, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_control_decode(const pt_msg *m, pt_control *c)
{
	const uint8_t *t = verified_root(m, &pt_fb_stage_control_desc);
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed Control message: %s",
		                    pt_last_error());
	c->cmd = (pt_stage_cmd)pt_fb_get_u8(t, PT_FB_STAGE_CONTROL_COMMAND, 0);
	c->grad_scale = pt_fb_get_f32(t, PT_FB_STAGE_CONTROL_GRAD_SCALE, 1.0f);
	c->step = pt_fb_get_i64(t, PT_FB_STAGE_CONTROL_STEP, 0);
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
	pt_fb_add_offset(&b, PT_FB_STAGE_CONTROL_CONFIG, conf);
	pt_fb_add_u8(&b, PT_FB_STAGE_CONTROL_COMMAND, PT_CMD_CONFIGURE, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_configure_decode(const pt_msg *m, pt_stage_config *cfg, pt_layer_spec **layers)
{
	const uint8_t *t = verified_root(m, &pt_fb_stage_control_desc), *conf;
	*layers = NULL;
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed Control message: %s",
		                    pt_last_error());
	if (pt_fb_get_u8(t, PT_FB_STAGE_CONTROL_COMMAND, 0) != PT_CMD_CONFIGURE ||
	    (conf = pt_fb_get_table(t, PT_FB_STAGE_CONTROL_CONFIG)) == NULL)
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
	if (r->n_tasks > 0) {
		/* Field by field into zeroed records: the struct's padding (3 bytes
		 * after kind) would otherwise carry this process's stale memory. */
		uint8_t *v = NULL;
		if (pt_fb_reserve_vector(&b, (size_t)r->n_tasks, PT_FB_STAGE_TASK_RECORD_SIZE, 8,
		                         (void **)&v, &tasks) == PT_OK) {
			memset(v, 0, (size_t)r->n_tasks * PT_FB_STAGE_TASK_RECORD_SIZE);
			for (int i = 0; i < r->n_tasks; i++) {
				const pt_task_record *s = &r->tasks[i];
				uint8_t *d = v + (size_t)i * PT_FB_STAGE_TASK_RECORD_SIZE;
				memcpy(d + PT_FB_STAGE_TASK_RECORD_KIND_OFFSET, &s->kind, 1);
				memcpy(d + PT_FB_STAGE_TASK_RECORD_MICROBATCH_OFFSET,
				       &s->microbatch, 4);
				memcpy(d + PT_FB_STAGE_TASK_RECORD_STEP_OFFSET, &s->step, 8);
				memcpy(d + PT_FB_STAGE_TASK_RECORD_START_OFFSET, &s->start, 8);
				memcpy(d + PT_FB_STAGE_TASK_RECORD_END_OFFSET, &s->end, 8);
			}
		}
	}
	if (r->has_stats) {
		const pt_stage_stats *s = &r->stats;
		pt_fb_start_table(&b);
		pt_fb_add_f64(&b, PT_FB_STAGE_STAGE_STATS_BUSY, s->busy, 0.0);
		pt_fb_add_i64(&b, PT_FB_STAGE_STAGE_STATS_FORWARDS, s->forwards, 0);
		pt_fb_add_i64(&b, PT_FB_STAGE_STAGE_STATS_BACKWARDS, s->backwards, 0);
		pt_fb_add_i64(&b, PT_FB_STAGE_STAGE_STATS_UPDATES, s->updates, 0);
		pt_fb_add_i64(&b, PT_FB_STAGE_STAGE_STATS_STALENESS_SUM, s->staleness_sum, 0);
		pt_fb_add_i32(&b, PT_FB_STAGE_STAGE_STATS_PEAK_LIVE, s->peak_live, 0);
		pt_fb_add_i32(&b, PT_FB_STAGE_STAGE_STATS_LIVE, s->live, 0);
		pt_fb_add_i32(&b, PT_FB_STAGE_STAGE_STATS_STALENESS_MAX, s->staleness_max, 0);
		pt_fb_end_table(&b, &stats);
	}
	if (r->has_comm) {
		const pt_comm_stats *k = &r->comm;
		pt_fb_start_table(&b);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_MESSAGES_SENT, k->msgs_sent, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_MESSAGES_RECEIVED, k->msgs_recv, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_BYTES_SENT, k->bytes_sent, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_BYTES_RECEIVED, k->bytes_recv, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_BYTES_RAW_SENT, k->bytes_raw_sent, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_ERRORS, k->errors, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_TIMEOUTS, k->timeouts, 0);
		pt_fb_add_u64(&b, PT_FB_STAGE_COMM_STATS_RECONNECTS, k->reconnects, 0);
		pt_fb_end_table(&b, &comm);
	}
	pt_fb_start_table(&b);
	pt_fb_add_i64(&b, PT_FB_STAGE_REPLY_STEPS, r->steps, 0);
	pt_fb_add_offset(&b, PT_FB_STAGE_REPLY_SQNORMS, sq);
	pt_fb_add_offset(&b, PT_FB_STAGE_REPLY_TASKS, tasks);
	pt_fb_add_offset(&b, PT_FB_STAGE_REPLY_STATS, stats);
	pt_fb_add_offset(&b, PT_FB_STAGE_REPLY_COMM, comm);
	pt_fb_add_u8(&b, PT_FB_STAGE_REPLY_COMMAND, (uint8_t)r->cmd, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_reply_decode(const pt_msg *m, pt_reply *r)
{
	const uint8_t *t = verified_root(m, &pt_fb_stage_reply_desc), *v, *s;
	uint32_t n;
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed Reply message: %s", pt_last_error());
	r->cmd = (pt_stage_cmd)pt_fb_get_u8(t, PT_FB_STAGE_REPLY_COMMAND, 0);
	r->steps = pt_fb_get_i64(t, PT_FB_STAGE_REPLY_STEPS, 0);
	r->n_sqnorms = 0;
	if ((v = pt_fb_get_vector(t, PT_FB_STAGE_REPLY_SQNORMS, &n)) != NULL) {
		if ((int)n > r->cap_sqnorms)
			return pt_set_error(PT_ERR_RANGE, "Reply has %u norms, expected at most %d",
			                    n, r->cap_sqnorms);
		memcpy(r->sqnorms, v, (size_t)n * 8);
		r->n_sqnorms = (int)n;
	}
	r->n_tasks = 0;
	if ((v = pt_fb_get_vector(t, PT_FB_STAGE_REPLY_TASKS, &n)) != NULL) {
		n = (int)n < r->cap_tasks ? n : (uint32_t)r->cap_tasks;
		/* Field by field: the padding of a received record is the sender's
		 * business, and a record read back equals the one sent. */
		for (uint32_t i = 0; r->tasks != NULL && i < n; i++) {
			const uint8_t *d =
			    (const uint8_t *)v + (size_t)i * PT_FB_STAGE_TASK_RECORD_SIZE;
			pt_task_record *o = &r->tasks[i];
			memset(o, 0, sizeof(*o));
			memcpy(&o->kind, d + PT_FB_STAGE_TASK_RECORD_KIND_OFFSET, 1);
			memcpy(&o->microbatch, d + PT_FB_STAGE_TASK_RECORD_MICROBATCH_OFFSET, 4);
			memcpy(&o->step, d + PT_FB_STAGE_TASK_RECORD_STEP_OFFSET, 8);
			memcpy(&o->start, d + PT_FB_STAGE_TASK_RECORD_START_OFFSET, 8);
			memcpy(&o->end, d + PT_FB_STAGE_TASK_RECORD_END_OFFSET, 8);
		}
		r->n_tasks = (int)n;
	}
	r->has_stats = false;
	if ((s = pt_fb_get_table(t, PT_FB_STAGE_REPLY_STATS)) != NULL) {
		pt_stage_stats *o = &r->stats;
		o->peak_live = pt_fb_get_i32(s, PT_FB_STAGE_STAGE_STATS_PEAK_LIVE, 0);
		o->live = pt_fb_get_i32(s, PT_FB_STAGE_STAGE_STATS_LIVE, 0);
		o->forwards = pt_fb_get_i64(s, PT_FB_STAGE_STAGE_STATS_FORWARDS, 0);
		o->backwards = pt_fb_get_i64(s, PT_FB_STAGE_STAGE_STATS_BACKWARDS, 0);
		o->updates = pt_fb_get_i64(s, PT_FB_STAGE_STAGE_STATS_UPDATES, 0);
		o->staleness_sum = pt_fb_get_i64(s, PT_FB_STAGE_STAGE_STATS_STALENESS_SUM, 0);
		o->staleness_max = pt_fb_get_i32(s, PT_FB_STAGE_STAGE_STATS_STALENESS_MAX, 0);
		o->busy = pt_fb_get_f64(s, PT_FB_STAGE_STAGE_STATS_BUSY, 0.0);
		r->has_stats = true;
	}
	r->has_comm = false;
	memset(&r->comm, 0, sizeof(r->comm));
	if ((s = pt_fb_get_table(t, PT_FB_STAGE_REPLY_COMM)) != NULL) {
		pt_comm_stats *k = &r->comm;
		k->msgs_sent = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_MESSAGES_SENT, 0);
		k->msgs_recv = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_MESSAGES_RECEIVED, 0);
		k->bytes_sent = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_BYTES_SENT, 0);
		k->bytes_recv = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_BYTES_RECEIVED, 0);
		k->bytes_raw_sent = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_BYTES_RAW_SENT, 0);
		k->errors = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_ERRORS, 0);
		k->timeouts = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_TIMEOUTS, 0);
		k->reconnects = pt_fb_get_u64(s, PT_FB_STAGE_COMM_STATS_RECONNECTS, 0);
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
	pt_fb_add_i64(&b, PT_FB_STAGE_STAGE_ERROR_STEP, step, 0);
	pt_fb_add_offset(&b, PT_FB_STAGE_STAGE_ERROR_MESSAGE, msg);
	pt_fb_add_i32(&b, PT_FB_STAGE_STAGE_ERROR_STAGE, stage, 0);
	pt_fb_add_i32(&b, PT_FB_STAGE_STAGE_ERROR_MICROBATCH, mb, 0);
	pt_fb_add_i32(&b, PT_FB_STAGE_STAGE_ERROR_CODE, (int32_t)code, 0);
	pt_fb_end_table(&b, &root);
	return finish(&b, root, m);
}

pt_err pt_wire_error_raise(const pt_msg *m)
{
	const uint8_t *t = verified_root(m, &pt_fb_stage_stage_error_desc);
	const char *msg;
	uint32_t len = 0;
	int code;
	if (t == NULL)
		return pt_set_error(PT_ERR_FORMAT, "malformed StageError from rank %d",
		                    m->meta.source);
	code = pt_fb_get_i32(t, PT_FB_STAGE_STAGE_ERROR_CODE, PT_ERR_BACKEND);
	if (code <= 0 || code >= PT_ERR_COUNT)
		code = PT_ERR_BACKEND;
	msg = pt_fb_get_string(t, PT_FB_STAGE_STAGE_ERROR_MESSAGE, &len);
	return pt_set_error((pt_err)code, "stage %d, step %ld, microbatch %d: %.*s",
	                    pt_fb_get_i32(t, PT_FB_STAGE_STAGE_ERROR_STAGE, 0),
	                    (long)pt_fb_get_i64(t, PT_FB_STAGE_STAGE_ERROR_STEP, 0),
	                    pt_fb_get_i32(t, PT_FB_STAGE_STAGE_ERROR_MICROBATCH, 0),
	                    (int)(msg ? len : 0), msg ? msg : "");
}
