/* test_api.c - tests of lib/api: build/parse round trips of every request and
 * reply, interop with flatc both ways (compared by meaning through JSON), and
 * hostile buffers (truncated, corrupted, unknown union types, lying offsets,
 * depth) rejected without crashing. flatc tests skip (pass with a note) when
 * flatc is not on PATH.
 */
#include "api/api.h"
#include "job/job.h"
#include "json.h"
#include "pt_test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers -- */

/* aligned_copy returns a malloc'd (16-aligned) copy of a finished buffer. */
static uint8_t *aligned_copy(const uint8_t *d, size_t n)
{
	uint8_t *p = malloc(n ? n : 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	memcpy(p, d, n);
	return p;
}

static void load_digits(pt_job_spec *spec)
{
	pt_test_digits_spec(spec);
}

static void fill_point(pt_api_metric_point *p, int64_t step)
{
	memset(p, 0, sizeof(*p));
	p->step = step;
	p->loss = 2.5 / (double)(step + 1);
	p->learning_rate = 0.002f;
	p->grad_norm = 1.25;
	p->samples_per_second = 12345.5;
	p->tokens_per_second = 0;
	p->bubble = 0.375;
	p->n_stages = 4;
	for (int i = 0; i < 4; i++)
		p->stage_busy[i] = 0.001 * (i + 1);
	p->eval_loss = step % 2 ? NAN : 0.5;
	p->eval_accuracy = step % 2 ? NAN : 0.875;
	p->time_unix = 1700000000.25 + (double)step;
}

static void check_point(const pt_api_metric_point *a, const pt_api_metric_point *b)
{
	CU_ASSERT_EQUAL(a->step, b->step);
	CU_ASSERT_EQUAL(a->loss, b->loss);
	CU_ASSERT_EQUAL(a->learning_rate, b->learning_rate);
	CU_ASSERT_EQUAL(a->grad_norm, b->grad_norm);
	CU_ASSERT_EQUAL(a->samples_per_second, b->samples_per_second);
	CU_ASSERT_EQUAL(a->bubble, b->bubble);
	CU_ASSERT_EQUAL(a->n_stages, b->n_stages);
	for (int i = 0; i < a->n_stages && i < b->n_stages; i++)
		CU_ASSERT_EQUAL(a->stage_busy[i], b->stage_busy[i]);
	CU_ASSERT(isnan(a->eval_loss) ? isnan(b->eval_loss) : a->eval_loss == b->eval_loss);
	CU_ASSERT(isnan(a->eval_accuracy) ? isnan(b->eval_accuracy)
	                                  : a->eval_accuracy == b->eval_accuracy);
	CU_ASSERT_EQUAL(a->time_unix, b->time_unix);
}

/* req_round_trip builds r, parses it back into *out (view into *keep). */
static void req_round_trip(pt_fb_builder *b, const pt_api_request *r, pt_api_request *out,
                           uint8_t **keep)
{
	const uint8_t *d;
	size_t n;

	PT_CHECK_OK(pt_api_build_request(b, r, &d, &n));
	*keep = aligned_copy(d, n);
	PT_CHECK_OK(pt_api_parse_request(*keep, n, out));
	CU_ASSERT_EQUAL(out->id, r->id);
	CU_ASSERT_EQUAL(out->kind, r->kind);
}

static void resp_round_trip(pt_fb_builder *b, const pt_api_response *r, pt_api_response *out,
                            uint8_t **keep)
{
	const uint8_t *d;
	size_t n;

	PT_CHECK_OK(pt_api_build_response(b, r, &d, &n));
	*keep = aligned_copy(d, n);
	PT_CHECK_OK(pt_api_parse_response(*keep, n, out));
	CU_ASSERT_EQUAL(out->id, r->id);
	CU_ASSERT_EQUAL(out->code, r->code);
	CU_ASSERT_EQUAL(out->kind, r->kind);
}

/* ----------------------------------------------------------- round trip -- */

static void test_api_request_round_trip(void)
{
	pt_fb_builder b;
	pt_api_request r, o;
	pt_job_spec spec, back;
	uint8_t *keep;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	load_digits(&spec);

	pt_api_request_init(&r, PT_API_SUBMIT_JOB);
	r.id = 0x1122334455667788ull;
	r.auth_token = "s3cret";
	r.spec = &spec;
	req_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_STRING_EQUAL(o.auth_token, "s3cret");
	CU_ASSERT_PTR_NOT_NULL_FATAL(o.spec_table);
	memset(&back, 0, sizeof(back));
	PT_CHECK_OK(pt_job_spec_read(o.spec_table, &back));
	CU_ASSERT_STRING_EQUAL(back.name, spec.name);
	CU_ASSERT_EQUAL(back.n_layers, spec.n_layers);
	CU_ASSERT_EQUAL(back.batch_size, spec.batch_size);
	CU_ASSERT_EQUAL(back.microbatches, spec.microbatches);
	CU_ASSERT_EQUAL(back.steps, spec.steps);
	CU_ASSERT_EQUAL(back.stages, spec.stages);
	pt_job_spec_fini(&back);
	free(keep);

	/* PlanJob: the spec and the candidate counts. */
	pt_api_request_init(&r, PT_API_PLAN_JOB);
	r.id = 77;
	r.spec = &spec;
	r.plan_stages[0] = 1, r.plan_stages[1] = 2, r.plan_stages[2] = 4;
	r.n_plan_stages = 3;
	r.plan_microbatches[0] = 8;
	r.n_plan_microbatches = 1;
	req_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_PTR_NOT_NULL(o.spec_table);
	CU_ASSERT(o.n_plan_stages == 3 && o.plan_stages[0] == 1 && o.plan_stages[1] == 2 &&
	          o.plan_stages[2] == 4);
	CU_ASSERT(o.n_plan_microbatches == 1 && o.plan_microbatches[0] == 8);
	free(keep);
	r.n_plan_stages = PT_API_MAX_PLAN_CANDIDATES + 1;
	{
		const uint8_t *d;
		size_t n;
		PT_CHECK_ERR(pt_api_build_request(&b, &r, &d, &n), PT_ERR_INVALID);
	}

	for (int k = PT_API_GET_JOB; k < PT_API_KIND_COUNT; k++) {
		if (k == PT_API_PLAN_JOB)
			continue; /* above */
		pt_api_request_init(&r, (pt_api_kind)k);
		r.id = (uint64_t)k * 1000;
		r.job = 42 + (uint64_t)k;
		if (k == PT_API_WATCH_METRICS) {
			r.cursor = 17;
			r.wait_ms = 250;
			r.max_points = 5;
		}
		if (k == PT_API_FETCH_CHECKPOINT) {
			r.step = 300;
			r.offset = 1u << 20;
			r.length = 4096;
		}
		req_round_trip(&b, &r, &o, &keep);
		CU_ASSERT_PTR_NULL(o.auth_token);
		CU_ASSERT_PTR_NULL(o.spec_table);
		if (k == PT_API_GET_JOB || k == PT_API_CANCEL_JOB || k == PT_API_WATCH_METRICS ||
		    k == PT_API_FETCH_CHECKPOINT || k == PT_API_LIST_CHECKPOINTS)
			CU_ASSERT_EQUAL(o.job, r.job);
		CU_ASSERT_EQUAL(o.cursor, r.cursor);
		CU_ASSERT_EQUAL(o.wait_ms, r.wait_ms);
		CU_ASSERT_EQUAL(o.max_points, r.max_points);
		CU_ASSERT_EQUAL(o.step, r.step);
		CU_ASSERT_EQUAL(o.offset, r.offset);
		CU_ASSERT_EQUAL(o.length, r.length);
		free(keep);
	}

	/* Defaults survive elision. */
	pt_api_request_init(&r, PT_API_WATCH_METRICS);
	req_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL(o.cursor, -1);
	CU_ASSERT_EQUAL(o.wait_ms, 1000);
	CU_ASSERT_EQUAL(o.max_points, 1000);
	free(keep);

	/* Builder refuses nonsense. */
	{
		const uint8_t *d;
		size_t n;
		pt_api_request_init(&r, PT_API_NONE);
		PT_CHECK_ERR(pt_api_build_request(&b, &r, &d, &n), PT_ERR_INVALID);
		pt_api_request_init(&r, PT_API_SUBMIT_JOB);
		PT_CHECK_ERR(pt_api_build_request(&b, &r, &d, &n), PT_ERR_INVALID);
	}
	pt_job_spec_fini(&spec);
	pt_fb_builder_fini(&b);
}

static void test_api_submit_raw(void)
{
	pt_fb_builder b;
	pt_api_request o;
	void *buf;
	size_t len, n;
	const uint8_t *d;
	uint8_t *keep;
	pt_job_spec back;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path("examples/digits.json"), &buf, &len));
	PT_CHECK_OK(pt_api_build_submit_raw(&b, 9, NULL, buf, len, &d, &n));
	keep = aligned_copy(d, n);
	PT_CHECK_OK(pt_api_parse_request(keep, n, &o));
	CU_ASSERT_EQUAL(o.kind, PT_API_SUBMIT_JOB);
	memset(&back, 0, sizeof(back));
	PT_CHECK_OK(pt_job_spec_read(o.spec_table, &back));
	CU_ASSERT_STRING_EQUAL(back.name, "digits-mlp");
	pt_job_spec_fini(&back);
	free(keep);
	/* Garbage instead of a spec is refused. */
	CU_ASSERT_NOT_EQUAL(pt_api_build_submit_raw(&b, 9, NULL, "garbage!garbage!", 16, &d, &n),
	                    PT_OK);
	free(buf);
	pt_fb_builder_fini(&b);
}

static void check_stage(const pt_api_stage_stats *a, const pt_api_stage_stats *b)
{
	CU_ASSERT_EQUAL(a->stage, b->stage);
	CU_ASSERT_EQUAL(a->busy_seconds, b->busy_seconds);
	CU_ASSERT_EQUAL(a->has_comm, b->has_comm);
	CU_ASSERT_EQUAL(a->messages_sent, b->messages_sent);
	CU_ASSERT_EQUAL(a->messages_received, b->messages_received);
	CU_ASSERT_EQUAL(a->bytes_sent, b->bytes_sent);
	CU_ASSERT_EQUAL(a->bytes_received, b->bytes_received);
	CU_ASSERT_EQUAL(a->bytes_raw_sent, b->bytes_raw_sent);
	CU_ASSERT_EQUAL(a->errors, b->errors);
	CU_ASSERT_EQUAL(a->timeouts, b->timeouts);
	CU_ASSERT_EQUAL(a->reconnects, b->reconnects);
}

static void test_api_response_round_trip(void)
{
	pt_fb_builder b;
	pt_api_response r, o;
	pt_api_job_info jobs[3], ji;
	pt_api_stage_stats stages[3];
	pt_api_metric_point pts[5], pt;
	pt_api_checkpoint_info ck[2], ci;
	pt_job_spec spec, back;
	uint8_t *keep, data[100];

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	load_digits(&spec);

	pt_api_response_init(&r, 5, PT_API_OK, PT_API_SUBMIT_JOB);
	r.job = 77;
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL(o.job, 77);
	free(keep);

	for (int i = 0; i < 3; i++) {
		memset(&jobs[i], 0, sizeof(jobs[i]));
		jobs[i].id = 10 + (uint64_t)i;
		jobs[i].name = i == 1 ? NULL : "job-name";
		jobs[i].state = (pt_api_job_state)(i * 2);
		jobs[i].message = i == 2 ? "boom: model[3].in_features" : NULL;
		jobs[i].step = 100 * i;
		jobs[i].steps = 400;
		jobs[i].submitted_unix = 1.5;
		jobs[i].started_unix = i ? 2.5 : 0;
		jobs[i].finished_unix = i == 2 ? 3.5 : 0;
		jobs[i].has_last = i > 0;
		fill_point(&jobs[i].last, 100 * i);
	}
	/* Job 11 has per-rank totals: the coordinator, then two stages. */
	for (int k = 0; k < 3; k++)
		stages[k] = (pt_api_stage_stats){.stage = k - 1,
		                                 .busy_seconds = k ? 1.25 * k : 0,
		                                 .has_comm = k < 2,
		                                 .messages_sent = k < 2 ? 10u + (uint64_t)k : 0,
		                                 .messages_received = k < 2 ? 20 : 0,
		                                 .bytes_sent = k < 2 ? 1000 : 0,
		                                 .bytes_received = k < 2 ? 2000 : 0,
		                                 .bytes_raw_sent = k < 2 ? 1500 : 0,
		                                 .errors = k == 1 ? 1 : 0,
		                                 .timeouts = k == 1 ? 2 : 0,
		                                 .reconnects = k == 1 ? UINT64_C(1) << 40 : 0};
	jobs[1].stages = stages;
	jobs[1].n_stages = 3;
	jobs[0].spec = &spec;
	pt_api_response_init(&r, 6, PT_API_OK, PT_API_GET_JOB);
	r.jobs = jobs;
	r.n_jobs = 1;
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL_FATAL(o.n_jobs, 1);
	PT_CHECK_OK(pt_api_response_job(&o, 0, &ji));
	CU_ASSERT_EQUAL(ji.id, 10);
	CU_ASSERT_STRING_EQUAL(ji.name, "job-name");
	CU_ASSERT_FALSE(ji.has_last);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ji.spec_table);
	memset(&back, 0, sizeof(back));
	PT_CHECK_OK(pt_job_spec_read(ji.spec_table, &back));
	CU_ASSERT_EQUAL(back.n_layers, spec.n_layers);
	pt_job_spec_fini(&back);
	PT_CHECK_ERR(pt_api_response_job(&o, 1, &ji), PT_ERR_RANGE);
	free(keep);

	jobs[0].spec = NULL;
	pt_api_response_init(&r, 7, PT_API_OK, PT_API_LIST_JOBS);
	r.jobs = jobs;
	r.n_jobs = 3;
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL_FATAL(o.n_jobs, 3);
	for (size_t i = 0; i < 3; i++) {
		PT_CHECK_OK(pt_api_response_job(&o, i, &ji));
		CU_ASSERT_EQUAL(ji.id, jobs[i].id);
		CU_ASSERT_EQUAL(ji.state, jobs[i].state);
		CU_ASSERT_EQUAL(ji.step, jobs[i].step);
		CU_ASSERT_EQUAL(ji.steps, 400);
		CU_ASSERT_EQUAL(ji.started_unix, jobs[i].started_unix);
		CU_ASSERT_EQUAL(ji.finished_unix, jobs[i].finished_unix);
		CU_ASSERT_EQUAL(ji.has_last, jobs[i].has_last);
		CU_ASSERT_PTR_NULL(ji.spec_table);
		if (jobs[i].has_last)
			check_point(&ji.last, &jobs[i].last);
		CU_ASSERT_EQUAL(ji.n_stages, jobs[i].n_stages);
		for (size_t k = 0; k < ji.n_stages && k < 3; k++) {
			pt_api_stage_stats st;
			PT_CHECK_OK(pt_api_job_stage(&ji, k, &st));
			check_stage(&st, &stages[k]);
		}
		if (ji.n_stages) {
			pt_api_stage_stats st;
			PT_CHECK_ERR(pt_api_job_stage(&ji, ji.n_stages, &st), PT_ERR_RANGE);
		}
		if (jobs[i].message) {
			CU_ASSERT_STRING_EQUAL(ji.message, jobs[i].message);
		} else {
			CU_ASSERT_PTR_NULL(ji.message);
		}
	}
	free(keep);

	/* An empty list. */
	pt_api_response_init(&r, 7, PT_API_OK, PT_API_LIST_JOBS);
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL(o.n_jobs, 0);
	free(keep);

	pt_api_response_init(&r, 8, PT_API_OK, PT_API_CANCEL_JOB);
	r.state = PT_JOB_CANCELLED;
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL(o.state, PT_JOB_CANCELLED);
	free(keep);

	for (int i = 0; i < 5; i++)
		fill_point(&pts[i], 11 + i);
	pt_api_response_init(&r, 9, PT_API_OK, PT_API_WATCH_METRICS);
	r.points = pts;
	r.n_points = 5;
	r.cursor = 15;
	r.state = PT_JOB_SUCCEEDED;
	r.ended = true;
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL_FATAL(o.n_points, 5);
	CU_ASSERT_EQUAL(o.cursor, 15);
	CU_ASSERT_EQUAL(o.state, PT_JOB_SUCCEEDED);
	CU_ASSERT_TRUE(o.ended);
	for (size_t i = 0; i < 5; i++) {
		PT_CHECK_OK(pt_api_response_point(&o, i, &pt));
		check_point(&pt, &pts[i]);
	}
	PT_CHECK_ERR(pt_api_response_point(&o, 5, &pt), PT_ERR_RANGE);
	free(keep);

	for (int i = 0; i < 100; i++)
		data[i] = (uint8_t)(i * 7);
	pt_api_response_init(&r, 10, PT_API_OK, PT_API_FETCH_CHECKPOINT);
	r.step = 300;
	r.total_size = 1000;
	r.offset = 200;
	r.data = data;
	r.data_len = 100;
	r.sha256 = "ab";
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL(o.step, 300);
	CU_ASSERT_EQUAL(o.total_size, 1000);
	CU_ASSERT_EQUAL(o.offset, 200);
	CU_ASSERT_EQUAL_FATAL(o.data_len, 100);
	CU_ASSERT_EQUAL(memcmp(o.data, data, 100), 0);
	CU_ASSERT_STRING_EQUAL(o.sha256, "ab");
	free(keep);

	ck[0].step = 100;
	ck[0].size = 5000;
	ck[0].sha256 = "00ff";
	ck[1].step = 200;
	ck[1].size = 6000;
	ck[1].sha256 = "11ee";
	pt_api_response_init(&r, 11, PT_API_OK, PT_API_LIST_CHECKPOINTS);
	r.checkpoints = ck;
	r.n_checkpoints = 2;
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_EQUAL_FATAL(o.n_checkpoints, 2);
	PT_CHECK_OK(pt_api_response_checkpoint(&o, 1, &ci));
	CU_ASSERT_EQUAL(ci.step, 200);
	CU_ASSERT_EQUAL(ci.size, 6000);
	CU_ASSERT_STRING_EQUAL(ci.sha256, "11ee");
	free(keep);

	pt_api_response_init(&r, 12, PT_API_OK, PT_API_SERVER_INFO);
	r.info.version = "0.1.0";
	r.info.protocol = PT_API_PROTOCOL;
	r.info.device = "cpu";
	r.info.jobs_queued = 3;
	r.info.jobs_running = 1;
	r.info.uptime_seconds = 12.5;
	r.info.kernels = "cpu: x; matmul: oneDNN 3.0.0, avx2";
	resp_round_trip(&b, &r, &o, &keep);
	CU_ASSERT_STRING_EQUAL(o.info.kernels, "cpu: x; matmul: oneDNN 3.0.0, avx2");
	CU_ASSERT_STRING_EQUAL(o.info.version, "0.1.0");
	CU_ASSERT_EQUAL(o.info.protocol, PT_API_PROTOCOL);
	CU_ASSERT_STRING_EQUAL(o.info.device, "cpu");
	CU_ASSERT_EQUAL(o.info.jobs_queued, 3);
	CU_ASSERT_EQUAL(o.info.jobs_running, 1);
	CU_ASSERT_EQUAL(o.info.uptime_seconds, 12.5);
	free(keep);

	{
		const uint8_t *d;
		size_t n;
		PT_CHECK_OK(
		    pt_api_build_error(&b, 13, PT_API_INVALID_JOB, &d, &n, "microbatches: %d", 0));
		keep = aligned_copy(d, n);
		PT_CHECK_OK(pt_api_parse_response(keep, n, &o));
		CU_ASSERT_EQUAL(o.code, PT_API_INVALID_JOB);
		CU_ASSERT_EQUAL(o.kind, PT_API_NONE);
		CU_ASSERT_STRING_EQUAL(o.message, "microbatches: 0");
		free(keep);
		/* GetJob needs exactly one job. */
		pt_api_response_init(&r, 1, PT_API_OK, PT_API_GET_JOB);
		PT_CHECK_ERR(pt_api_build_response(&b, &r, &d, &n), PT_ERR_INVALID);
	}
	/* PlanJobReply: plans in order, each with its partition and memory. */
	{
		pt_api_plan pl[2] = {{.schedule = "zb-h1",
		                      .stages = 2,
		                      .microbatches = 8,
		                      .virtual_stages = 3,
		                      .step_seconds = 0.25,
		                      .bubble = 0.125,
		                      .samples_per_second = 256,
		                      .boundaries = {0, 3, 5},
		                      .n_boundaries = 3,
		                      .stage_bytes = {1000, 2000},
		                      .n_stage_bytes = 2},
		                     {.schedule = "gpipe", .stages = 1, .microbatches = 4}},
		            got;
		pt_api_response_init(&r, 6, PT_API_OK, PT_API_PLAN_JOB);
		r.plans = pl;
		r.n_plans = 2;
		resp_round_trip(&b, &r, &o, &keep);
		CU_ASSERT_EQUAL_FATAL(o.n_plans, 2);
		PT_CHECK_OK(pt_api_response_plan(&o, 0, &got));
		CU_ASSERT_STRING_EQUAL(got.schedule, "zb-h1");
		CU_ASSERT(got.stages == 2 && got.microbatches == 8 && got.virtual_stages == 3 &&
		          got.step_seconds == 0.25 && got.bubble == 0.125 &&
		          got.samples_per_second == 256);
		CU_ASSERT(got.n_boundaries == 3 && got.boundaries[1] == 3 &&
		          got.boundaries[2] == 5);
		CU_ASSERT(got.n_stage_bytes == 2 && got.stage_bytes[1] == 2000);
		PT_CHECK_OK(pt_api_response_plan(&o, 1, &got));
		CU_ASSERT(got.n_boundaries == 0 && got.stages == 1);
		PT_CHECK_ERR(pt_api_response_plan(&o, 2, &got), PT_ERR_RANGE);
		free(keep);
	}
	CU_ASSERT_STRING_EQUAL(pt_api_code_name(PT_API_NOT_FOUND), "NotFound");
	CU_ASSERT_STRING_EQUAL(pt_api_job_state_name(PT_JOB_INTERRUPTED), "Interrupted");
	CU_ASSERT_STRING_EQUAL(pt_api_kind_name(PT_API_WATCH_METRICS), "WatchMetrics");
	CU_ASSERT_STRING_EQUAL(pt_api_code_name((pt_api_code)99), "Unknown");
	pt_job_spec_fini(&spec);
	pt_fb_builder_fini(&b);
}

/* --------------------------------------------------------------- flatc -- */

static bool have_flatc(void)
{
	static int have = -1;
	if (have < 0) {
		have = system("flatc --version >/dev/null 2>&1") == 0;
		if (!have)
			printf("\n  [skip: flatc not found on PATH] ");
	}
	return have;
}

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
	static char bufs[4][1024];
	static int k;
	char *p = bufs[k++ % 4];
	snprintf(p, 1024, "%s/%s", tmpdir, name);
	return p;
}

static void *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	void *p;
	long n;

	if (f == NULL)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	p = malloc((size_t)n + 1);
	if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
		free(p);
		p = NULL;
	}
	if (p)
		((char *)p)[n] = '\0';
	fclose(f);
	*len = (size_t)n;
	return p;
}

/* flatc_to_binary writes json to name.json and runs flatc -b; returns the bytes. */
static uint8_t *flatc_to_binary(const char *name, const char *json, bool response, size_t *len)
{
	char cmd[4096], file[64];
	uint8_t *bin;

	snprintf(file, sizeof(file), "%s.json", name);
	pt_test_write_file(tmp_path(file), json, strlen(json));
	snprintf(cmd, sizeof(cmd), "flatc -b %s -o %s %s %s",
	         response ? "--root-type pipetrain.Response" : "", tmpdir,
	         pt_test_path("schema/api.fbs"), tmp_path(file));
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	snprintf(file, sizeof(file), "%s.bin", name);
	bin = read_all(tmp_path(file), len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
	return bin;
}

/* flatc_to_json writes our buffer and parses flatc's JSON of it into *out. */
static void flatc_to_json(const char *name, const uint8_t *d, size_t n, bool response, pt_json *out)
{
	char cmd[4096], file[64];
	char *text;
	size_t len;

	snprintf(file, sizeof(file), "%s.bin", name);
	pt_test_write_file(tmp_path(file), d, n);
	snprintf(cmd, sizeof(cmd), "flatc --json --strict-json --raw-binary %s -o %s %s -- %s",
	         response ? "--root-type pipetrain.Response" : "", tmpdir,
	         pt_test_path("schema/api.fbs"), tmp_path(file));
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	snprintf(file, sizeof(file), "%s.json", name);
	text = read_all(tmp_path(file), &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	PT_CHECK_OK(pt_json_parse(out, text, len, NULL));
	free(text);
}

static int64_t jint(const pt_json *obj, const char *key)
{
	const pt_json *v = pt_json_get(obj, key);
	int64_t i = 0;
	CU_ASSERT_PTR_NOT_NULL(v);
	if (v)
		CU_ASSERT_TRUE(pt_json_int(v, &i));
	return i;
}

static const char *jstr(const pt_json *obj, const char *key)
{
	const pt_json *v = pt_json_get(obj, key);
	CU_ASSERT_PTR_NOT_NULL(v);
	return v ? pt_json_string(v) : "";
}

static void test_api_flatc_to_us(void)
{
	uint8_t *bin;
	size_t n;
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	pt_api_metric_point pt;
	char *spec_json, *json;
	size_t spec_len;
	pt_job_spec back;

	if (!have_flatc())
		return;
	bin = flatc_to_binary("watch",
	                      "{\"id\": 7, \"auth_token\": \"tok\", \"body_type\": "
	                      "\"WatchMetrics\", \"body\": {\"job\": 3, \"cursor\": 5, "
	                      "\"wait_ms\": 250}}",
	                      false, &n);
	PT_CHECK_OK(pt_api_parse_request(bin, n, &q));
	CU_ASSERT_EQUAL(q.id, 7);
	CU_ASSERT_STRING_EQUAL(q.auth_token, "tok");
	CU_ASSERT_EQUAL(q.kind, PT_API_WATCH_METRICS);
	CU_ASSERT_EQUAL(q.job, 3);
	CU_ASSERT_EQUAL(q.cursor, 5);
	CU_ASSERT_EQUAL(q.wait_ms, 250);
	CU_ASSERT_EQUAL(q.max_points, 1000);
	free(bin);

	bin = flatc_to_binary("fetch",
	                      "{\"id\": 8, \"body_type\": \"FetchCheckpoint\", \"body\": "
	                      "{\"job\": 4, \"offset\": 8388608}}",
	                      false, &n);
	PT_CHECK_OK(pt_api_parse_request(bin, n, &q));
	CU_ASSERT_EQUAL(q.kind, PT_API_FETCH_CHECKPOINT);
	CU_ASSERT_EQUAL(q.step, -1);
	CU_ASSERT_EQUAL(q.offset, 8388608);
	CU_ASSERT_EQUAL(q.length, PT_API_MAX_CHUNK);
	free(bin);

	/* A SubmitJob whose spec is the shipped digits.json text. */
	spec_json = read_all(pt_test_path("examples/digits.json"), &spec_len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(spec_json);
	json = malloc(spec_len + 200);
	snprintf(json, spec_len + 200,
	         "{\"id\": 9, \"body_type\": \"SubmitJob\", \"body\": {\"spec\": %s}}", spec_json);
	bin = flatc_to_binary("submit", json, false, &n);
	PT_CHECK_OK(pt_api_parse_request(bin, n, &q));
	CU_ASSERT_EQUAL(q.kind, PT_API_SUBMIT_JOB);
	memset(&back, 0, sizeof(back));
	PT_CHECK_OK(pt_job_spec_read(q.spec_table, &back));
	CU_ASSERT_STRING_EQUAL(back.name, "digits-mlp");
	CU_ASSERT_EQUAL(back.n_layers, 5);
	CU_ASSERT_EQUAL(back.batch_size, 64);
	CU_ASSERT_EQUAL(back.stages, 4);
	pt_job_spec_fini(&back);
	free(bin);
	free(json);
	free(spec_json);

	bin = flatc_to_binary("list",
	                      "{\"id\": 10, \"code\": \"OK\", \"body_type\": \"ListJobsReply\", "
	                      "\"body\": {\"jobs\": [{\"id\": 1, \"name\": \"a\", \"state\": "
	                      "\"Running\", \"step\": 12, \"last\": {\"step\": 12, \"loss\": "
	                      "0.5, \"stage_busy\": [0.25, 0.5]}}, {\"id\": 2, \"state\": "
	                      "\"Interrupted\", \"message\": \"why\"}]}}",
	                      true, &n);
	PT_CHECK_OK(pt_api_parse_response(bin, n, &r));
	CU_ASSERT_EQUAL(r.kind, PT_API_LIST_JOBS);
	CU_ASSERT_EQUAL_FATAL(r.n_jobs, 2);
	PT_CHECK_OK(pt_api_response_job(&r, 0, &ji));
	CU_ASSERT_EQUAL(ji.state, PT_JOB_RUNNING);
	CU_ASSERT_TRUE(ji.has_last);
	CU_ASSERT_EQUAL(ji.last.loss, 0.5);
	CU_ASSERT_EQUAL(ji.last.n_stages, 2);
	CU_ASSERT_EQUAL(ji.last.stage_busy[1], 0.5);
	PT_CHECK_OK(pt_api_response_job(&r, 1, &ji));
	CU_ASSERT_EQUAL(ji.state, PT_JOB_INTERRUPTED);
	CU_ASSERT_STRING_EQUAL(ji.message, "why");
	free(bin);

	bin = flatc_to_binary("watchr",
	                      "{\"id\": 11, \"body_type\": \"WatchMetricsReply\", \"body\": "
	                      "{\"points\": [{\"step\": 3, \"loss\": 1.5}], \"cursor\": 3, "
	                      "\"state\": \"Succeeded\", \"ended\": true}}",
	                      true, &n);
	PT_CHECK_OK(pt_api_parse_response(bin, n, &r));
	CU_ASSERT_EQUAL_FATAL(r.n_points, 1);
	PT_CHECK_OK(pt_api_response_point(&r, 0, &pt));
	CU_ASSERT_EQUAL(pt.step, 3);
	CU_ASSERT_EQUAL(pt.loss, 1.5);
	CU_ASSERT_TRUE(r.ended);
	CU_ASSERT_EQUAL(r.state, PT_JOB_SUCCEEDED);
	free(bin);

	bin = flatc_to_binary("err", "{\"id\": 12, \"code\": \"InvalidJob\", \"message\": \"m\"}",
	                      true, &n);
	PT_CHECK_OK(pt_api_parse_response(bin, n, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(r.message, "m");
	CU_ASSERT_EQUAL(r.kind, PT_API_NONE);
	free(bin);
}

static void test_api_us_to_flatc(void)
{
	pt_fb_builder b;
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	pt_api_metric_point pts[2];
	pt_job_spec spec;
	const uint8_t *d;
	size_t n;
	pt_json j;
	const pt_json *body, *v;

	if (!have_flatc())
		return;
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	load_digits(&spec);

	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.id = 21;
	q.auth_token = "tok";
	q.spec = &spec;
	PT_CHECK_OK(pt_api_build_request(&b, &q, &d, &n));
	flatc_to_json("q_submit", d, n, false, &j);
	CU_ASSERT_EQUAL(jint(&j, "id"), 21);
	CU_ASSERT_STRING_EQUAL(jstr(&j, "auth_token"), "tok");
	CU_ASSERT_STRING_EQUAL(jstr(&j, "body_type"), "SubmitJob");
	body = pt_json_get(&j, "body");
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	v = pt_json_get(body, "spec");
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_STRING_EQUAL(jstr(v, "name"), "digits-mlp");
	CU_ASSERT_EQUAL(jint(v, "batch_size"), 64);
	CU_ASSERT_EQUAL(pt_json_get(v, "model")->len, 5);
	pt_json_fini(&j);

	pt_api_request_init(&q, PT_API_FETCH_CHECKPOINT);
	q.id = 22;
	q.job = 5;
	q.offset = 4096;
	q.length = 100;
	PT_CHECK_OK(pt_api_build_request(&b, &q, &d, &n));
	flatc_to_json("q_fetch", d, n, false, &j);
	CU_ASSERT_STRING_EQUAL(jstr(&j, "body_type"), "FetchCheckpoint");
	body = pt_json_get(&j, "body");
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	CU_ASSERT_EQUAL(jint(body, "job"), 5);
	CU_ASSERT_EQUAL(jint(body, "offset"), 4096);
	CU_ASSERT_EQUAL(jint(body, "length"), 100);
	CU_ASSERT_PTR_NULL(pt_json_get(body, "step")); /* default -1: elided */
	pt_json_fini(&j);

	fill_point(&pts[0], 4);
	fill_point(&pts[1], 5);
	pts[1].eval_loss = pts[1].eval_accuracy = 0.25; /* flatc prints NaN as `nan`, not JSON */
	pt_api_response_init(&r, 23, PT_API_OK, PT_API_WATCH_METRICS);
	r.points = pts;
	r.n_points = 2;
	r.cursor = 5;
	r.state = PT_JOB_RUNNING;
	PT_CHECK_OK(pt_api_build_response(&b, &r, &d, &n));
	flatc_to_json("r_watch", d, n, true, &j);
	CU_ASSERT_STRING_EQUAL(jstr(&j, "body_type"), "WatchMetricsReply");
	body = pt_json_get(&j, "body");
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	CU_ASSERT_EQUAL(jint(body, "cursor"), 5);
	CU_ASSERT_STRING_EQUAL(jstr(body, "state"), "Running");
	v = pt_json_get(body, "points");
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_EQUAL_FATAL(v->len, 2);
	CU_ASSERT_EQUAL(jint(pt_json_at(v, 1), "step"), 5);
	CU_ASSERT_EQUAL(pt_json_get(pt_json_at(v, 0), "loss")->d, pts[0].loss);
	CU_ASSERT_EQUAL(pt_json_get(pt_json_at(v, 0), "stage_busy")->len, 4);
	pt_json_fini(&j);

	memset(&ji, 0, sizeof(ji));
	ji.id = 3;
	ji.name = "n";
	ji.state = PT_JOB_FAILED;
	ji.message = "model[3].in_features: 12 != 256";
	ji.spec = &spec;
	pt_api_response_init(&r, 24, PT_API_OK, PT_API_GET_JOB);
	r.jobs = &ji;
	r.n_jobs = 1;
	PT_CHECK_OK(pt_api_build_response(&b, &r, &d, &n));
	flatc_to_json("r_get", d, n, true, &j);
	body = pt_json_get(&j, "body");
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	v = pt_json_get(body, "job");
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	CU_ASSERT_STRING_EQUAL(jstr(v, "state"), "Failed");
	CU_ASSERT_STRING_EQUAL(jstr(v, "message"), ji.message);
	CU_ASSERT_STRING_EQUAL(jstr(pt_json_get(v, "spec"), "name"), "digits-mlp");
	pt_json_fini(&j);

	PT_CHECK_OK(pt_api_build_error(&b, 25, PT_API_UNAUTHORIZED, &d, &n, "wrong auth token"));
	flatc_to_json("r_err", d, n, true, &j);
	CU_ASSERT_STRING_EQUAL(jstr(&j, "code"), "Unauthorized");
	CU_ASSERT_STRING_EQUAL(jstr(&j, "message"), "wrong auth token");
	pt_json_fini(&j);

	pt_job_spec_fini(&spec);
	pt_fb_builder_fini(&b);
}

/* ------------------------------------------------------------- hostile -- */

/* submit_buffer builds a SubmitJob of digits.json (a buffer with depth). */
static uint8_t *submit_buffer(size_t *n)
{
	pt_fb_builder b;
	pt_api_request q;
	pt_job_spec spec;
	const uint8_t *d;
	uint8_t *out;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	load_digits(&spec);
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.id = 99;
	q.auth_token = "tok";
	q.spec = &spec;
	PT_CHECK_OK(pt_api_build_request(&b, &q, &d, n));
	out = aligned_copy(d, *n);
	pt_job_spec_fini(&spec);
	pt_fb_builder_fini(&b);
	return out;
}

static void test_api_truncated(void)
{
	size_t n;
	uint8_t *full = submit_buffer(&n);
	pt_api_request q;

	for (size_t len = 0; len < n; len++) {
		uint8_t *cut = aligned_copy(full, len);
		pt_err rv = pt_api_parse_request(cut, len, &q);
		CU_ASSERT_EQUAL(rv, PT_ERR_FORMAT);
		free(cut);
	}
	PT_CHECK_OK(pt_api_parse_request(full, n, &q));
	free(full);
}

static void test_api_corrupted(void)
{
	size_t n;
	uint8_t *full = submit_buffer(&n), *bad = malloc(n);
	uint64_t s = 0x9E3779B97F4A7C15ull;
	pt_api_request q;
	int rejected = 0;

	for (int it = 0; it < 20000; it++) {
		memcpy(bad, full, n);
		for (int k = 0; k < 1 + it % 4; k++) {
			s ^= s << 13;
			s ^= s >> 7;
			s ^= s << 17;
			bad[s % n] = (uint8_t)(s >> 32);
		}
		if (pt_api_parse_request(bad, n, &q) != PT_OK) {
			rejected++;
		} else if (q.kind == PT_API_SUBMIT_JOB) {
			/* Accepted: reading it must be safe too. */
			pt_job_spec spec;
			memset(&spec, 0, sizeof(spec));
			pt_job_spec_read(q.spec_table, &spec);
			pt_job_spec_fini(&spec);
		}
	}
	CU_ASSERT(rejected > 0);
	/* Pure garbage. */
	for (size_t i = 0; i < n; i++)
		bad[i] = (uint8_t)(i * 37 + 11);
	CU_ASSERT_EQUAL(pt_api_parse_request(bad, n, &q), PT_ERR_FORMAT);
	free(bad);
	free(full);
}

/* patch_union_type builds a request of kind k and sets its body type byte. */
static void test_api_unknown_union(void)
{
	pt_fb_builder b;
	pt_api_request q, o;
	pt_api_response r, ro;
	const uint8_t *d;
	size_t n;
	uint8_t *buf;
	const uint8_t *root, *f;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	pt_api_request_init(&q, PT_API_GET_JOB);
	q.id = 31;
	q.job = 2;
	PT_CHECK_OK(pt_api_build_request(&b, &q, &d, &n));
	buf = aligned_copy(d, n);
	root = pt_fb_root(buf);
	f = pt_fb_field(root, 2); /* body_type */
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (int t = PT_API_KIND_COUNT; t < 256; t += 41) {
		buf[f - buf] = (uint8_t)t;
		PT_CHECK_ERR_MSG(pt_api_parse_request(buf, n, &o), PT_ERR_FORMAT,
		                 "unknown body type");
		CU_ASSERT_EQUAL(o.id, 31); /* for the error reply */
	}
	/* Type NONE with a value is malformed; a valid other member with the
	 * wrong table shape may verify but must not crash. */
	buf[f - buf] = 0;
	CU_ASSERT_EQUAL(pt_api_parse_request(buf, n, &o), PT_ERR_FORMAT);
	free(buf);

	/* A request with no body. */
	{
		pt_fb_ref root_ref;
		pt_fb_builder_reset(&b);
		pt_fb_start_table(&b);
		pt_fb_add_u64(&b, 0, 5, 0);
		pt_fb_end_table(&b, &root_ref);
		PT_CHECK_OK(pt_fb_finish(&b, root_ref, NULL, &d, &n));
		buf = aligned_copy(d, n);
		PT_CHECK_ERR_MSG(pt_api_parse_request(buf, n, &o), PT_ERR_FORMAT, "no body");
		CU_ASSERT_EQUAL(o.id, 5);
		free(buf);
	}

	pt_api_response_init(&r, 32, PT_API_OK, PT_API_CANCEL_JOB);
	PT_CHECK_OK(pt_api_build_response(&b, &r, &d, &n));
	buf = aligned_copy(d, n);
	f = pt_fb_field(pt_fb_root(buf), 3);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	buf[f - buf] = 77;
	PT_CHECK_ERR_MSG(pt_api_parse_response(buf, n, &ro), PT_ERR_FORMAT, "unknown body type");
	free(buf);
	pt_fb_builder_fini(&b);
}

static void test_api_lying_offsets(void)
{
	size_t n;
	uint8_t *full = submit_buffer(&n), *bad = malloc(n);
	const uint8_t *root = pt_fb_root(full), *f;
	pt_api_request q;
	uint32_t lie;

	/* Root offset past the end, misaligned, zero. */
	const uint32_t roots[] = {(uint32_t)n, (uint32_t)n + 4, 0xFFFFFFF0u, 2, 0};
	for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
		memcpy(bad, full, n);
		memcpy(bad, &roots[i], 4);
		CU_ASSERT_EQUAL(pt_api_parse_request(bad, n, &q), PT_ERR_FORMAT);
	}
	/* The token string's offset pointing outside, or at the end. */
	f = pt_fb_field(root, 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	const uint32_t lies[] = {(uint32_t)n, 0x7FFFFFFCu, 4};
	for (size_t i = 0; i < 3; i++) {
		memcpy(bad, full, n);
		lie = lies[i] - (i == 2 ? 0 : (uint32_t)(f - full));
		if (i == 2)
			lie = (uint32_t)(n - (size_t)(f - full) -
			                 4); /* string "length" = last word */
		memcpy(bad + (f - full), &lie, 4);
		CU_ASSERT_EQUAL(pt_api_parse_request(bad, n, &q), PT_ERR_FORMAT);
	}
	/* The vtable offset (soffset) of the root pointing outside. */
	memcpy(bad, full, n);
	{
		int32_t so = -(int32_t)n * 2;
		memcpy(bad + (root - full), &so, 4);
		CU_ASSERT_EQUAL(pt_api_parse_request(bad, n, &q), PT_ERR_FORMAT);
	}
	/* The spec (a required table of SubmitJob) offset lying. */
	{
		uint8_t type;
		const uint8_t *body = pt_fb_get_union(root, 2, &type);
		const uint8_t *sf = pt_fb_field(body, 0);
		CU_ASSERT_PTR_NOT_NULL_FATAL(sf);
		memcpy(bad, full, n);
		lie = (uint32_t)(n + 8);
		memcpy(bad + (sf - full), &lie, 4);
		CU_ASSERT_EQUAL(pt_api_parse_request(bad, n, &q), PT_ERR_FORMAT);
	}
	free(bad);
	free(full);
}

static void test_api_depth(void)
{
	size_t n;
	uint8_t *full = submit_buffer(&n);
	pt_fb_verify_opts shallow = {.max_depth = 2, .max_tables = 0};
	pt_fb_verify_opts few = {.max_depth = 0, .max_tables = 3};

	/* Request -> SubmitJob -> JobSpec -> ...: deeper than 2, more than 3 tables. */
	CU_ASSERT_EQUAL(pt_fb_verify(full, n, &pt_fb_api_request_desc, NULL, &shallow),
	                PT_ERR_FORMAT);
	CU_ASSERT_EQUAL(pt_fb_verify(full, n, &pt_fb_api_request_desc, NULL, &few), PT_ERR_FORMAT);
	PT_CHECK_OK(pt_fb_verify(full, n, &pt_fb_api_request_desc, NULL, NULL));
	free(full);

	/* A ListJobsReply of 200000 entries all pointing at one JobInfo: bounded
	 * work (each visit counted), verifies, and the parse is fast. */
	{
		pt_fb_builder b;
		pt_fb_ref ji, *refs, vec, body, root;
		const uint8_t *d;
		size_t m = 200000;
		pt_api_response r;
		uint8_t *buf;

		PT_CHECK_OK(pt_fb_builder_init(&b, 0));
		pt_fb_start_table(&b);
		pt_fb_add_u64(&b, 0, 1, 0);
		pt_fb_end_table(&b, &ji);
		refs = malloc(m * sizeof(*refs));
		for (size_t i = 0; i < m; i++)
			refs[i] = ji;
		pt_fb_create_ref_vector(&b, refs, m, &vec);
		pt_fb_start_table(&b);
		pt_fb_add_offset(&b, 0, vec);
		pt_fb_end_table(&b, &body);
		pt_fb_start_table(&b);
		pt_fb_add_union(&b, 3, PT_API_LIST_JOBS, body);
		pt_fb_end_table(&b, &root);
		PT_CHECK_OK(pt_fb_finish(&b, root, NULL, &d, &n));
		buf = aligned_copy(d, n);
		PT_CHECK_OK(pt_api_parse_response(buf, n, &r));
		CU_ASSERT_EQUAL(r.n_jobs, m);
		free(buf);
		free(refs);
		pt_fb_builder_fini(&b);
	}
}

/* GetJob's timeline: PT_API_MAX_TIMELINE task spans round trip, field by
 * field; one more is refused by the builder (the server caps what it
 * sends at that). */
static void test_api_timeline_cap(void)
{
	pt_api_task_span *t = calloc(PT_API_MAX_TIMELINE + 1, sizeof(*t));
	pt_api_job_info j = {.id = 3, .name = "tl", .state = PT_JOB_RUNNING};
	pt_api_response r, o;
	pt_api_job_info ji;
	pt_api_task_span x;
	pt_fb_builder b;
	uint8_t *keep;
	const uint8_t *d;
	size_t n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	for (int i = 0; i <= PT_API_MAX_TIMELINE; i++)
		t[i] = (pt_api_task_span){.start = (float)i * 0.5f,
		                          .end = (float)i * 0.5f + 0.25f,
		                          .microbatch = i % 37,
		                          .stage = (uint8_t)(i % 64),
		                          .kind = (uint8_t)(i % 2 ? 3 : 0)};
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	j.timeline = t;
	j.n_timeline = PT_API_MAX_TIMELINE;
	pt_api_response_init(&r, 9, PT_API_OK, PT_API_GET_JOB);
	r.jobs = &j;
	r.n_jobs = 1;
	resp_round_trip(&b, &r, &o, &keep);
	PT_CHECK_OK(pt_api_response_job(&o, 0, &ji));
	CU_ASSERT_EQUAL_FATAL(ji.n_timeline, PT_API_MAX_TIMELINE);
	for (size_t i = 0; i < ji.n_timeline; i += 1023) {
		PT_CHECK_OK(pt_api_job_task(&ji, i, &x));
		CU_ASSERT(x.start == t[i].start && x.end == t[i].end &&
		          x.microbatch == t[i].microbatch && x.stage == t[i].stage &&
		          x.kind == t[i].kind);
	}
	PT_CHECK_ERR(pt_api_job_task(&ji, ji.n_timeline, &x), PT_ERR_RANGE);
	free(keep);
	j.n_timeline = PT_API_MAX_TIMELINE + 1;
	PT_CHECK_ERR_MSG(pt_api_build_response(&b, &r, &d, &n), PT_ERR_INVALID,
	                 "JobInfo: 4097 timeline tasks");
	pt_fb_builder_fini(&b);
	free(t);
}

/* PlanJob takes at most 8 stage and 8 microbatch counts: a hand-built
 * request with 9 (the C builder cannot make one) is refused naming the
 * field; 8 parse. */
static void test_api_plan_candidates_bounded(void)
{
	static const int32_t v[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
	pt_job_spec js;
	void *raw;
	size_t rawn;

	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path("examples/digits.json"), &raw, &rawn));
	memset(&js, 0, sizeof(js));
	PT_CHECK_OK(pt_job_spec_decode(raw, rawn, &js));
	free(raw);
	for (int field = 0; field < 2; field++)
		for (size_t n = 8; n <= 9; n++) {
			pt_fb_builder b;
			pt_fb_ref spec, vec, body, root;
			const uint8_t *d;
			size_t len;
			uint8_t *buf;
			pt_api_request q;
			pt_err rv;

			PT_CHECK_OK(pt_fb_builder_init(&b, 0));
			PT_CHECK_OK(pt_job_spec_build(&b, &js, &spec));
			PT_CHECK_OK(pt_fb_create_vector(&b, v, n, 4, 4, &vec));
			pt_fb_start_table(&b);
			pt_fb_add_offset(&b, PT_FB_API_PLAN_JOB_SPEC, spec);
			pt_fb_add_offset(&b,
			                 field == 0 ? PT_FB_API_PLAN_JOB_STAGES
			                            : PT_FB_API_PLAN_JOB_MICROBATCHES,
			                 vec);
			pt_fb_end_table(&b, &body);
			pt_fb_start_table(&b);
			pt_fb_add_u64(&b, PT_FB_API_REQUEST_ID, 7, 0);
			pt_fb_add_union(&b, PT_FB_API_REQUEST_BODY_TYPE, (uint8_t)PT_API_PLAN_JOB,
			                body);
			pt_fb_end_table(&b, &root);
			PT_CHECK_OK(pt_fb_finish(&b, root, NULL, &d, &len));
			buf = aligned_copy(d, len);
			rv = pt_api_parse_request(buf, len, &q);
			if (n == 8) {
				PT_CHECK_OK(rv);
				CU_ASSERT_EQUAL(
				    field == 0 ? q.n_plan_stages : q.n_plan_microbatches, 8);
				CU_ASSERT_EQUAL(
				    (field == 0 ? q.plan_stages : q.plan_microbatches)[7], 8);
			} else {
				char want[64];
				snprintf(want, sizeof(want), "PlanJob.%s: 9 entries (at most 8)",
				         field == 0 ? "stages" : "microbatches");
				CU_ASSERT_EQUAL(rv, PT_ERR_INVALID);
				CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), want));
			}
			free(buf);
			pt_fb_builder_fini(&b);
		}
	pt_job_spec_fini(&js);
}

static void test_api_misaligned(void)
{
	size_t n;
	uint8_t *full = submit_buffer(&n), *raw = malloc(n + 8);
	pt_api_request q;

	memcpy(raw + 1, full, n);
	CU_ASSERT_EQUAL(pt_api_parse_request(raw + 1, n, &q), PT_ERR_FORMAT);
	CU_ASSERT_EQUAL(pt_api_parse_request(NULL, n, &q), PT_ERR_INVALID);
	free(raw);
	free(full);
}

static const pt_test_case round_trip_tests[] = {
    {"test_api_request_round_trip", test_api_request_round_trip},
    {"test_api_submit_raw", test_api_submit_raw},
    {"test_api_response_round_trip", test_api_response_round_trip},
    {NULL, NULL},
};
static const pt_test_case flatc_tests[] = {
    {"test_api_flatc_to_us", test_api_flatc_to_us},
    {"test_api_us_to_flatc", test_api_us_to_flatc},
    {NULL, NULL},
};
static const pt_test_case hostile_tests[] = {
    {"test_api_truncated", test_api_truncated},
    {"test_api_corrupted", test_api_corrupted},
    {"test_api_unknown_union", test_api_unknown_union},
    {"test_api_lying_offsets", test_api_lying_offsets},
    {"test_api_depth", test_api_depth},
    {"test_api_misaligned", test_api_misaligned},
    {"test_api_plan_candidates_bounded", test_api_plan_candidates_bounded},
    {"test_api_timeline_cap", test_api_timeline_cap},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"api_round_trip", round_trip_tests},
    {"api_flatc", flatc_tests},
    {"api_hostile", hostile_tests},
    {NULL, NULL},
};

int main(void)
{
	int rc;
	char cmd[300];

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_api.XXXXXX");
	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		return 99;
	}
	rc = pt_test_main(suites);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	return rc;
}
