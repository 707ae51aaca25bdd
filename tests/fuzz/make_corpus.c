/* make_corpus.c - writes the seed corpora of tests/fuzz from our own builders:
 * valid requests, replies, control messages, handshakes, job files, npy,
 * safetensors and token files, and journals, a few of each.
 *
 *   fuzz_make_corpus SOURCE_ROOT OUT_DIR
 *
 * writes OUT_DIR/<target>/<name> (fuzz_one.sh seeds runs it into
 * tests/fuzz/corpus). Job specs come from examples/*.json and from the
 * JSON below, which name the files fuzz_api writes (x.npy, y.npy, t.npy,
 * t.u16). Deterministic: the same tree writes the same bytes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api.h"
#include "fileio.h"
#include "fuzz_common.h"
#include "handshake.h"
#include "job/job.h"
#include "json.h"
#include "npy.h"
#include "safetensors.h"
#include "wire.h"

static const char *out_dir;
static pt_fb_builder fb;

static void die(const char *what)
{
	fprintf(stderr, "make_corpus: %s: %s\n", what, pt_last_error());
	exit(1);
}

static void check(pt_err rv, const char *what)
{
	if (rv != PT_OK)
		die(what);
}

static void path_of(char *p, size_t cap, const char *target, const char *name)
{
	snprintf(p, cap, "%s/%s", out_dir, target);
	if (mkdir(p, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "make_corpus: mkdir %s: %s\n", p, strerror(errno));
		exit(1);
	}
	snprintf(p, cap, "%s/%s/%s", out_dir, target, name);
}

static void put(const char *target, const char *name, const void *data, size_t len)
{
	char p[4096];
	pt_file_part part = {data, len};
	path_of(p, sizeof(p), target, name);
	check(pt_file_write_atomic(p, &part, 1), p);
}

/* ---------------------------------------------------------- job specs -- */

/* Specs over the files fuzz_api writes; each passes pt_job_spec_validate. */
static const char *const spec_json[] = {
    "{\"name\":\"mlp\",\"model\":[{\"kind\":\"Linear\",\"in_features\":4,\"out_features\":8},"
    "{\"kind\":\"ReLU\"},{\"kind\":\"Linear\",\"in_features\":8,\"out_features\":2}],"
    "\"data\":{\"format\":\"Npy\",\"features\":\"x.npy\",\"labels\":\"y.npy\",\"held_out\":0.25},"
    "\"loss\":\"CrossEntropy\",\"optimizer\":{\"kind\":\"AdamW\",\"lr\":0.01},"
    "\"batch_size\":4,\"microbatches\":2,\"steps\":3,\"mode\":\"Sync\","
    "\"placement\":{\"stages\":2,\"boundaries\":[1]},\"checkpoint\":{\"every_steps\":1,\"keep\":2},"
    "\"seed\":5,\"eval_every\":1}",
    "{\"name\":\"regress\",\"model\":[{\"kind\":\"Linear\",\"in_features\":4,\"out_features\":4,"
    "\"bias\":false},{\"kind\":\"Tanh\"},{\"kind\":\"LayerNorm\",\"dim\":4,\"eps\":0.001},"
    "{\"kind\":\"Dropout\",\"p\":0.1},{\"kind\":\"Linear\",\"in_features\":4,\"out_features\":2}],"
    "\"data\":{\"format\":\"Npy\",\"features\":\"x.npy\",\"labels\":\"t.npy\",\"shuffle\":false},"
    "\"loss\":\"MSE\",\"optimizer\":{\"kind\":\"SGD\",\"lr\":0.1,\"momentum\":0.9,\"nesterov\":"
    "true,"
    "\"clip_norm\":1.0},\"batch_size\":2,\"steps\":2,\"mode\":\"Async\",\"compress\":true,"
    "\"placement\":{\"stages\":3,\"threads_per_stage\":1,\"workers\":[\"tcp://127.0.0.1:7700\","
    "\"tcp://127.0.0.1:7701\",\"ipc:///tmp/w2\",\"tcp://127.0.0.1:7703\"],"
    "\"worker_timeout_ms\":2000},\"max_restarts\":1,\"device\":\"cpu\"}",
    "{\"name\":\"gpt\",\"model\":[{\"kind\":\"Embedding\",\"vocab\":128,\"dim\":8,\"max_seq\":8},"
    "{\"kind\":\"TransformerBlock\",\"dim\":8,\"n_head\":2,\"mlp_hidden\":16},"
    "{\"kind\":\"Attention\",\"dim\":8,\"n_head\":2},{\"kind\":\"GELU\"},"
    "{\"kind\":\"Linear\",\"in_features\":8,\"out_features\":128},{\"kind\":\"Softmax\"}],"
    "\"data\":{\"format\":\"Tokens16\",\"tokens\":\"t.u16\",\"seq_len\":8,\"vocab\":128},"
    "\"loss\":\"CrossEntropy\",\"ignore_index\":0,\"optimizer\":{\"kind\":\"AdamW\",\"lr\":0.003,"
    "\"schedule\":\"WarmupCosine\",\"warmup_steps\":2,\"total_steps\":10,\"min_lr\":0.0003},"
    "\"batch_size\":2,\"microbatches\":2,\"steps\":10,\"mode\":\"SemiAsync\",\"recompute\":true,"
    "\"use_graphs\":true,\"weight_stashing\":false,\"placement\":{\"stages\":2}}",
    "{\"name\":\"interleaved-bf16\",\"model\":[{\"kind\":\"Linear\",\"in_features\":4,"
    "\"out_features\":8},{\"kind\":\"ReLU\"},{\"kind\":\"Linear\",\"in_features\":8,"
    "\"out_features\":8},{\"kind\":\"ReLU\"},{\"kind\":\"Linear\",\"in_features\":8,"
    "\"out_features\":2}],\"data\":{\"format\":\"Npy\",\"features\":\"x.npy\",\"labels\":"
    "\"y.npy\"},\"loss\":\"CrossEntropy\",\"optimizer\":{\"kind\":\"AdamW\",\"lr\":0.01},"
    "\"batch_size\":4,\"microbatches\":2,\"steps\":3,\"mode\":\"Sync\","
    "\"placement\":{\"stages\":2},\"schedule\":\"interleaved\",\"virtual_stages\":2,"
    "\"precision\":\"bf16\"}",
};
#define N_SPECS (sizeof(spec_json) / sizeof(spec_json[0]))

static char *read_text(const char *root, const char *rel, size_t *len)
{
	char p[4096];
	void *data;
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	check(pt_file_read(p, 1 << 20, &data, len), p);
	return data;
}

static void load_specs(pt_job_spec *specs)
{
	for (size_t i = 0; i < N_SPECS; i++)
		check(pt_job_spec_parse_json(spec_json[i], strlen(spec_json[i]), &specs[i]),
		      spec_json[i]);
}

/* ---------------------------------------------------------------- api -- */

static void put_request(const char *name, const pt_api_request *q)
{
	const uint8_t *d;
	size_t n;
	check(pt_api_build_request(&fb, q, &d, &n), name);
	put("api", name, d, n);
}

static void put_response(const char *name, const pt_api_response *r)
{
	const uint8_t *d;
	size_t n;
	check(pt_api_build_response(&fb, r, &d, &n), name);
	put("api", name, d, n);
}

static void api(const pt_job_spec *specs)
{
	pt_api_request q;
	pt_api_response r;
	char name[64];
	static const pt_api_kind kinds[] = {
	    PT_API_GET_JOB,       PT_API_LIST_JOBS,        PT_API_CANCEL_JOB,
	    PT_API_WATCH_METRICS, PT_API_FETCH_CHECKPOINT, PT_API_LIST_CHECKPOINTS,
	    PT_API_SERVER_INFO,   PT_API_LIST_WORKERS,     PT_API_DRAIN_WORKER};

	for (size_t i = 0; i < N_SPECS; i++) {
		pt_api_request_init(&q, PT_API_SUBMIT_JOB);
		q.id = 10 + i;
		q.auth_token = i == 1 ? "s3cret-token" : NULL;
		q.spec = &specs[i];
		snprintf(name, sizeof(name), "req-submit-%zu", i);
		put_request(name, &q);
	}
	pt_api_request_init(&q, PT_API_PLAN_JOB);
	q.id = 20;
	q.spec = &specs[0];
	q.n_plan_stages = 3;
	q.plan_stages[0] = 1, q.plan_stages[1] = 2, q.plan_stages[2] = 4;
	q.n_plan_microbatches = 2;
	q.plan_microbatches[0] = 4, q.plan_microbatches[1] = 8;
	put_request("req-PlanJob", &q);
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		pt_api_request_init(&q, kinds[i]);
		q.id = 100 + i;
		q.job = 7;
		q.auth_token = "tok";
		if (kinds[i] == PT_API_WATCH_METRICS) {
			q.cursor = 3;
			q.wait_ms = 250;
			q.max_points = 10;
		} else if (kinds[i] == PT_API_DRAIN_WORKER) {
			q.url = "tcp://10.0.0.7:7700";
		} else if (kinds[i] == PT_API_FETCH_CHECKPOINT) {
			q.step = 20;
			q.offset = 4096;
			q.length = 1000;
		}
		snprintf(name, sizeof(name), "req-%s", pt_api_kind_name(kinds[i]));
		put_request(name, &q);
	}

	/* Replies, for pt_api_parse_response. */
	{
		pt_api_metric_point pts[2] = {{.step = 1,
		                               .loss = 2.5,
		                               .learning_rate = 0.01f,
		                               .grad_norm = 1.5,
		                               .samples_per_second = 100,
		                               .bubble = 0.25,
		                               .n_stages = 2,
		                               .stage_busy = {0.5, 0.75},
		                               .eval_loss = 2.0,
		                               .eval_accuracy = 0.5,
		                               .time_unix = 1.7e9},
		                              {.step = 2, .loss = 2.0, .n_stages = 0}};
		pt_api_stage_stats stages[2] = {{.stage = -1, .busy_seconds = 1.0},
		                                {.stage = 0,
		                                 .busy_seconds = 2.0,
		                                 .has_comm = true,
		                                 .messages_sent = 10,
		                                 .bytes_sent = 1000,
		                                 .errors = 1}};
		pt_api_job_info jobs[2] = {
		    {.id = 7,
		     .name = "mlp",
		     .state = PT_JOB_RUNNING,
		     .step = 2,
		     .steps = 3,
		     .submitted_unix = 1.7e9,
		     .has_last = true,
		     .spec = &specs[0],
		     .stages = stages,
		     .n_stages = 2,
		     .timeline = (pt_api_task_span[]){{0.0f, 0.5f, 0, 0, 0, {0}},
		                                      {0.5f, 0.75f, 0, 0, 1, {0}},
		                                      {0.75f, 0.9f, 0, 0, 3, {0}}},
		     .n_timeline = 3},
		    {.id = 8, .state = PT_JOB_FAILED, .message = "why"}};
		pt_api_checkpoint_info ck[1] = {
		    {.step = 20,
		     .size = 1234,
		     .sha256 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"}};
		static const uint8_t bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
		jobs[0].last = pts[0];

		pt_api_response_init(&r, 1, PT_API_OK, PT_API_GET_JOB);
		r.jobs = jobs;
		r.n_jobs = 1;
		put_response("rep-GetJob", &r);
		pt_api_response_init(&r, 2, PT_API_OK, PT_API_LIST_JOBS);
		jobs[0].spec = NULL;
		r.jobs = jobs;
		r.n_jobs = 2;
		put_response("rep-ListJobs", &r);
		pt_api_response_init(&r, 3, PT_API_OK, PT_API_WATCH_METRICS);
		r.points = pts;
		r.n_points = 2;
		r.cursor = 2;
		r.state = PT_JOB_RUNNING;
		put_response("rep-WatchMetrics", &r);
		pt_api_response_init(&r, 4, PT_API_OK, PT_API_FETCH_CHECKPOINT);
		r.step = 20;
		r.total_size = 1234;
		r.offset = 16;
		r.data = bytes;
		r.data_len = sizeof(bytes);
		r.sha256 = ck[0].sha256;
		put_response("rep-FetchCheckpoint", &r);
		pt_api_response_init(&r, 5, PT_API_OK, PT_API_LIST_CHECKPOINTS);
		r.checkpoints = ck;
		r.n_checkpoints = 1;
		put_response("rep-ListCheckpoints", &r);
		pt_api_response_init(&r, 6, PT_API_OK, PT_API_SERVER_INFO);
		r.info = (pt_api_server_info){.version = "0.1.0",
		                              .protocol = PT_API_PROTOCOL,
		                              .device = "cpu",
		                              .jobs_queued = 1,
		                              .jobs_running = 2,
		                              .uptime_seconds = 12.5,
		                              .devices_in_use = 2,
		                              .devices = "cpu, cuda:0 (job 3), cuda:1 (free)"};
		put_response("rep-ServerInfo", &r);
		{
			pt_api_plan plans[2] = {
			    {.schedule = "interleaved",
			     .stages = 1,
			     .virtual_stages = 2,
			     .microbatches = 4,
			     .step_seconds = 0.5,
			     .bubble = 0.1,
			     .samples_per_second = 32,
			     .boundaries = {0, 3, 5},
			     .n_boundaries = 3,
			     .stage_bytes = {1000, 2000},
			     .n_stage_bytes = 2},
			    {.schedule = "gpipe", .stages = 1, .microbatches = 4}};
			pt_api_response_init(&r, 12, PT_API_OK, PT_API_PLAN_JOB);
			r.plans = plans;
			r.n_plans = 2;
			put_response("rep-PlanJob", &r);
		}
		{
			pt_api_worker_info wi[2] = {{"tcp://10.0.0.7:7700", PT_API_WORKER_BUSY, 9,
			                             false, 1.7e9, 1.7e9, "stage 0 of job 9"},
			                            {"tcp://10.0.0.8:7700",
			                             PT_API_WORKER_UNREACHABLE, 0, true, 1.7e9, 0,
			                             NULL}};
			pt_api_response_init(&r, 9, PT_API_OK, PT_API_LIST_WORKERS);
			r.workers = wi;
			r.n_workers = 2;
			put_response("rep-ListWorkers", &r);
		}
		pt_api_response_init(&r, 7, PT_API_OK, PT_API_SUBMIT_JOB);
		r.job = 9;
		put_response("rep-SubmitJob", &r);
		pt_api_response_init(&r, 8, PT_API_NOT_FOUND, PT_API_NONE);
		r.message = "no job 9";
		put_response("rep-error", &r);
	}
}

/* --------------------------------------------------------------- wire -- */

static void put_msg(const char *name, pt_msg *m)
{
	put("wire", name, m->blob, m->blob_len);
	pt_msg_fini(m);
}

static void wire(const pt_job_spec *specs)
{
	pt_msg m = {0};
	char name[64];

	for (int cmd = PT_CMD_STEP; cmd <= PT_CMD_SET_STATE; cmd++) {
		pt_control c = {.cmd = (pt_stage_cmd)cmd, .grad_scale = 0.25f, .step = 3 * cmd};
		if (cmd == PT_CMD_CONFIGURE)
			continue;
		check(pt_wire_control_encode(&m, &c), "control");
		snprintf(name, sizeof(name), "control-%d", cmd);
		put_msg(name, &m);
	}
	for (size_t i = 0; i < N_SPECS; i++) {
		const pt_job_spec *s = &specs[i];
		pt_stage_config cfg = {
		    .layers = s->layers,
		    .n_layers = s->n_layers,
		    .input = pt_job_spec_input_shape(s, 4),
		    .microbatch = s->batch_size / s->microbatches,
		    .first = 0,
		    .last = s->n_layers / 2 + 1,
		    .n_slots = s->microbatches,
		    .mode = s->mode,
		    .optim = s->optim,
		    .seed = s->seed,
		    .weight_stashing = s->weight_stashing,
		    .recompute = s->recompute,
		    .threads = 1,
		    .use_graphs = s->use_graphs,
		    .sync_sends = i == 1,
		    .device = PT_CPU,
		    .n_microbatches = s->microbatches,
		    .virtual_stages = pt_job_spec_virtual_stages(s),
		    .precision = pt_job_spec_precision(s),
		};
		if (pt_job_spec_virtual_stages(s) > 1)
			cfg.schedule = PT_SCHED_INTERLEAVED;
		check(pt_wire_configure_encode(&m, &cfg), "configure");
		snprintf(name, sizeof(name), "configure-%zu", i);
		put_msg(name, &m);
	}
	{
		double sq[3] = {1.0, 0.5, 0.0};
		pt_task_record tasks[3] = {{PT_TASK_FORWARD, 0, 1, 0.5, 0.75},
		                           {PT_TASK_BACKWARD, 0, 1, 0.75, 1.0},
		                           {PT_TASK_STEP, -1, 1, 1.0, 1.25}};
		pt_reply r = {.cmd = PT_CMD_SQNORM, .sqnorms = sq, .n_sqnorms = 3};
		check(pt_wire_reply_encode(&m, &r), "reply");
		put_msg("reply-sqnorm", &m);
		r = (pt_reply){.cmd = PT_CMD_TIMELINE,
		               .tasks = tasks,
		               .n_tasks = 3,
		               .has_comm = true,
		               .comm = {.msgs_sent = 4,
		                        .msgs_recv = 5,
		                        .bytes_sent = 600,
		                        .bytes_recv = 700,
		                        .bytes_raw_sent = 800,
		                        .errors = 1,
		                        .timeouts = 2,
		                        .reconnects = 3}};
		check(pt_wire_reply_encode(&m, &r), "reply");
		put_msg("reply-timeline", &m);
		r = (pt_reply){.cmd = PT_CMD_STATS,
		               .has_stats = true,
		               .stats = {.peak_live = 4,
		                         .live = 1,
		                         .forwards = 10,
		                         .backwards = 9,
		                         .updates = 2,
		                         .staleness_sum = 3,
		                         .staleness_max = 1,
		                         .busy = 2.5}};
		check(pt_wire_reply_encode(&m, &r), "reply");
		put_msg("reply-stats", &m);
		r = (pt_reply){.cmd = PT_CMD_GET_STATE, .steps = 42};
		check(pt_wire_reply_encode(&m, &r), "reply");
		put_msg("reply-state", &m);
	}
	check(pt_wire_error_encode(&m, 2, 17, 3, PT_ERR_SHAPE, "shape mismatch in layer 4"),
	      "error");
	put_msg("stage-error", &m);
}

/* ---------------------------------------------------------- handshake -- */

static void handshake(void)
{
	const uint8_t *d;
	size_t n;
	pt_worker_request q = {.kind = PT_WORKER_JOIN,
	                       .protocol = PT_WORKER_PROTOCOL,
	                       .token = "worker-token",
	                       .rank = 1,
	                       .world = 3,
	                       .compress = true,
	                       .timeout_ms = 1500};
	pt_worker_reply r = {.ok = true, .data_url = "tcp://127.0.0.1:41234", .session = 77};

	check(pt_handshake_encode_request(&fb, &q, &d, &n), "join");
	put("handshake", "req-join", d, n);
	q = (pt_worker_request){
	    .kind = PT_WORKER_PEERS,
	    .session = 77,
	    .n_urls = 3,
	    .urls = {"tcp://127.0.0.1:5000", "tcp://127.0.0.1:41234", "ipc:///tmp/pt-stage-2"}};
	check(pt_handshake_encode_request(&fb, &q, &d, &n), "peers");
	put("handshake", "req-peers", d, n);
	q = (pt_worker_request){.kind = PT_WORKER_PEERS, .session = 77};
	check(pt_handshake_encode_request(&fb, &q, &d, &n), "end");
	put("handshake", "req-end", d, n);
	q = (pt_worker_request){.kind = PT_WORKER_PING, .session = 77};
	check(pt_handshake_encode_request(&fb, &q, &d, &n), "ping");
	put("handshake", "req-ping", d, n);
	check(pt_handshake_encode_reply(&fb, PT_WORKER_JOIN, &r, &d, &n), "join reply");
	put("handshake", "rep-join", d, n);
	r = (pt_worker_reply){.ok = false, .message = "busy with session 3", .busy = true};
	check(pt_handshake_encode_reply(&fb, PT_WORKER_JOIN, &r, &d, &n), "join refusal");
	put("handshake", "rep-join-busy", d, n);
	r = (pt_worker_reply){.ok = true};
	check(pt_handshake_encode_reply(&fb, PT_WORKER_PEERS, &r, &d, &n), "peers reply");
	put("handshake", "rep-peers", d, n);
	r = (pt_worker_reply){.ok = true, .busy = true, .message = "running"};
	check(pt_handshake_encode_reply(&fb, PT_WORKER_PING, &r, &d, &n), "ping reply");
	put("handshake", "rep-ping", d, n);
}

/* ------------------------------------------------------- json, jobjson -- */

static void json(const char *root)
{
	static const char *const docs[] = {
	    "{\"a\":[1,-2.5e-3,true,false,null],\"b\":{\"c\":\"\\u00e9\\ud83d\\ude00\\n\"}}",
	    "[9223372036854775807,-9223372036854775808,1e308,0.1,\"\\\"\\\\\\/\\b\\f\\r\\t\"]",
	    "\"caf\xc3\xa9 \xe2\x82\xac\"",
	    "{\"__metadata__\":{\"data_sha256\":\"00\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],"
	    "\"data_offsets\":[0,24]}}",
	};
	static const char *const examples[] = {"examples/digits.json", "examples/gpt.json"};
	char name[64];

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
		snprintf(name, sizeof(name), "doc-%zu", i);
		put("json", name, docs[i], strlen(docs[i]));
	}
	for (size_t i = 0; i < sizeof(examples) / sizeof(examples[0]); i++) {
		size_t len;
		char *text = read_text(root, examples[i], &len);
		put("json", strrchr(examples[i], '/') + 1, text, len);
		put("jobjson", strrchr(examples[i], '/') + 1, text, len);
		free(text);
	}
	for (size_t i = 0; i < N_SPECS; i++) {
		snprintf(name, sizeof(name), "spec-%zu.json", i);
		put("jobjson", name, spec_json[i], strlen(spec_json[i]));
	}
	/* A JobSpec binary, which the job file reader takes too. */
	{
		pt_job_spec s;
		pt_fb_ref ref;
		const uint8_t *d;
		size_t n;
		check(pt_job_spec_parse_json(spec_json[0], strlen(spec_json[0]), &s), "spec");
		pt_fb_builder_reset(&fb);
		check(pt_job_spec_build(&fb, &s, &ref), "spec build");
		check(pt_fb_finish(&fb, ref, NULL, &d, &n), "spec finish");
		put("jobjson", "spec-0.bin", d, n);
		pt_job_spec_fini(&s);
	}
}

/* ----------------------------------------------------- npy, safetensors -- */

static void fill(pt_tensor *t)
{
	uint8_t *p = pt_tensor_data(t);
	for (size_t i = 0; i < pt_tensor_nbytes(t); i++)
		p[i] = (uint8_t)(i * 37 + 11);
}

static void npy(void)
{
	static const pt_dtype dts[] = {PT_F32, PT_F64, PT_F16, PT_I32,
	                               PT_I64, PT_U8,  PT_U16, PT_U32};
	static const int64_t shapes[][3] = {{3, 2, 0}, {5, 0, 0}, {0, 0, 0}, {2, 2, 2}};
	static const int ndims[] = {2, 1, 0, 3};
	char name[64], p[4096];

	for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++) {
		pt_tensor t;
		int k = (int)(i % 4);
		check(pt_tensor_init(&t, dts[i], ndims[k], shapes[k]), "tensor");
		fill(&t);
		snprintf(name, sizeof(name), "%s-%dd.npy", pt_dtype_name(dts[i]), ndims[k]);
		path_of(p, sizeof(p), "npy", name);
		check(pt_npy_write(p, &t), p);
		pt_tensor_fini(&t);
	}
	/* Version 2.0 header, as NumPy writes for long headers, and one with Python 2's L. */
	{
		static const char v2[] = "\x93NUMPY\x02\x00\x3c\x00\x00\x00"
		                         "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
		                         "  \n\x00\x00\x80\x3f\x00\x00\x00\x40";
		static const char l1[] =
		    "\x93NUMPY\x01\x00\x35\x00"
		    "{\"descr\":\"|u1\",\"fortran_order\":False,\"shape\":(3L,1L)}"
		    "\x01\x02\x03";
		put("npy", "v2.npy", v2, sizeof(v2) - 1);
		put("npy", "py2.npy", l1, sizeof(l1) - 1);
	}
}

static void safetensors(void)
{
	pt_tensor a, b, c;
	int64_t sa[2] = {2, 3}, sb[1] = {4}, sc[3] = {1, 2, 2};
	char p[4096];

	check(pt_tensor_init(&a, PT_F32, 2, sa), "a");
	check(pt_tensor_init(&b, PT_BF16, 1, sb), "b");
	check(pt_tensor_init(&c, PT_U8, 3, sc), "c");
	fill(&a);
	fill(&b);
	fill(&c);
	{
		pt_st_tensor ts[3] = {{"0.weight", &a}, {"0.bias", &b}, {"stage0.state", &c}};
		pt_st_meta meta[2] = {{"step", "20"}, {"job", "7"}};
		path_of(p, sizeof(p), "safetensors", "three.safetensors");
		check(pt_safetensors_write(p, ts, 3, meta, 2), p);
		path_of(p, sizeof(p), "safetensors", "one.safetensors");
		check(pt_safetensors_write(p, ts + 2, 1, NULL, 0), p);
		path_of(p, sizeof(p), "safetensors", "empty.safetensors");
		check(pt_safetensors_write(p, NULL, 0, meta, 1), p);
	}
	/* What PyTorch's writer makes: no checksum, unaligned data, I64. */
	{
		static const char hdr[] =
		    "{\"x\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
		    "\"y\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[16,18]}}";
		uint8_t buf[8 + sizeof(hdr) - 1 + 18];
		uint64_t hl = sizeof(hdr) - 1;
		memcpy(buf, &hl, 8);
		memcpy(buf + 8, hdr, hl);
		for (size_t i = 0; i < 18; i++)
			buf[8 + hl + i] = (uint8_t)i;
		put("safetensors", "torch.safetensors", buf, sizeof(buf));
	}
	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
	pt_tensor_fini(&c);
}

/* ------------------------------------------------------------- tokens -- */

static void tokens(void)
{
	uint8_t buf[4 + 128];
	/* [size flag][vocab lo][vocab hi][step] tokens... (see fuzz_tokens.c) */
	for (int i = 0; i < 128; i++)
		buf[4 + i] = (uint8_t)(i % 2 ? 0 : 'a' + i % 26);
	buf[0] = 0, buf[1] = 0, buf[2] = 1, buf[3] = 3; /* u16, vocab 256 */
	put("tokens", "u16-vocab256", buf, sizeof(buf));
	buf[0] = 1, buf[1] = 0, buf[2] = 0, buf[3] = 9; /* u32, unchecked */
	put("tokens", "u32", buf, sizeof(buf));
	buf[0] = 0, buf[1] = 16, buf[2] = 0, buf[3] = 0; /* u16, vocab 16: refused */
	put("tokens", "u16-small-vocab", buf, 4 + 20);
	/* llm.c files: auto (v1: 20 uint16 tokens) and u32 (v2: 12 uint32). */
	{
		static uint8_t llmc[4 + 1024 + 48];
		int32_t head[3] = {20240520, 1, 20};
		memset(llmc, 0, sizeof(llmc));
		llmc[0] = 2, llmc[2] = 1, llmc[3] = 3;
		memcpy(llmc + 4, head, sizeof(head));
		for (int i = 0; i < 20; i++)
			llmc[4 + 1024 + 2 * i] = (uint8_t)(100 + i);
		put("tokens", "llmc-v1", llmc, 4 + 1024 + 40);
		head[1] = 2, head[2] = 12;
		llmc[0] = 1, llmc[2] = 0, llmc[3] = 5;
		memcpy(llmc + 4, head, sizeof(head));
		for (int i = 0; i < 12; i++)
			llmc[4 + 1024 + 4 * i] = (uint8_t)(44 + i);
		put("tokens", "llmc-v2", llmc, 4 + 1024 + 48);
	}
}

/* ------------------------------------------------------------ journal -- */

/* The journal's record format (server/jobs.c): [u32 len][u32 CRC-32][payload].
 * fuzz_journal's inputs start with a flag byte (0: it fixes the CRCs). */
typedef struct jbuf {
	uint8_t data[8192];
	size_t n;
} jbuf;

static void record(jbuf *j, const uint8_t *payload, size_t len)
{
	uint32_t l = (uint32_t)len, c = fuzz_crc32(payload, len);
	memcpy(j->data + j->n, &l, 4);
	memcpy(j->data + j->n + 4, &c, 4);
	memcpy(j->data + j->n + 8, payload, len);
	j->n += 8 + len;
}

static void state(jbuf *j, pt_api_job_state st, int64_t step, double t, const char *msg)
{
	uint8_t p[1024];
	uint16_t ml = (uint16_t)strlen(msg);
	p[0] = 1;
	p[1] = (uint8_t)st;
	memcpy(p + 2, &step, 8);
	memcpy(p + 10, &t, 8);
	memcpy(p + 18, &ml, 2);
	memcpy(p + 20, msg, ml);
	record(j, p, 20 + (size_t)ml);
}

static void metric(jbuf *j, int64_t step, int32_t ns)
{
	uint8_t p[1024], *q = p;
	double d[8] = {2.0 / (double)step, 0, 1.5, 100.0, 0.0, 0.25, 1.0, 1.7e9 + (double)step};
	float lr = 0.01f;
	*q++ = 2;
	memcpy(q, &step, 8), q += 8;
	memcpy(q, &d[0], 8), q += 8;
	memcpy(q, &lr, 4), q += 4;
	for (int i = 1; i < 8; i++)
		memcpy(q, &d[i], 8), q += 8;
	memcpy(q, &ns, 4), q += 4;
	for (int32_t i = 0; i < ns; i++) {
		double busy = 0.5 + i;
		memcpy(q, &busy, 8), q += 8;
	}
	record(j, p, (size_t)(q - p));
}

static void journal(void)
{
	jbuf j = {.n = 1}; /* data[0] = 0: fuzz_journal fixes CRCs */

	state(&j, PT_JOB_QUEUED, 0, 1.7e9, "");
	put("journal", "queued", j.data, j.n);
	state(&j, PT_JOB_STARTING, 0, 1.7e9 + 1, "");
	state(&j, PT_JOB_RUNNING, 0, 1.7e9 + 2, "");
	for (int64_t s = 1; s <= 3; s++)
		metric(&j, s, 2);
	put("journal", "running", j.data, j.n);
	/* A resumed run redoes step 3, then the job ends. */
	state(&j, PT_JOB_INTERRUPTED, 3, 1.7e9 + 3, "server stopped while the job was running");
	state(&j, PT_JOB_QUEUED, 2, 1.7e9 + 4, "resuming from the checkpoint of step 2");
	metric(&j, 3, 3);
	state(&j, PT_JOB_SUCCEEDED, 3, 1.7e9 + 5, "");
	put("journal", "resumed", j.data, j.n);
	/* A torn tail: half a record. */
	j.n -= 10;
	put("journal", "torn", j.data, j.n);
	j.data[0] = 1; /* as it is: CRCs kept, the torn tail is cut */
	put("journal", "torn-raw", j.data, j.n);
	j.data[0] = 0;
	j.n = 1;
	state(&j, PT_JOB_QUEUED, 0, 1.7e9, "");
	state(&j, PT_JOB_FAILED, 0, 1.7e9 + 1, "data.features: cannot open 'x.npy'");
	put("journal", "failed", j.data, j.n);
	/* The longest message a server writes (journal_state keeps 900 bytes). */
	{
		char msg[901];
		memset(msg, 'm', 900);
		msg[900] = '\0';
		j.n = 1;
		state(&j, PT_JOB_QUEUED, 0, 1.7e9, "");
		state(&j, PT_JOB_FAILED, 0, 1.7e9 + 1, msg);
		put("journal", "long-message", j.data, j.n);
	}
}

int main(int argc, char **argv)
{
	pt_job_spec specs[N_SPECS];

	if (argc != 3) {
		fprintf(stderr, "usage: fuzz_make_corpus SOURCE_ROOT OUT_DIR\n");
		return 2;
	}
	out_dir = argv[2];
	if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "make_corpus: mkdir %s: %s\n", out_dir, strerror(errno));
		return 1;
	}
	check(pt_fb_builder_init(&fb, 4096), "builder");
	load_specs(specs);
	api(specs);
	wire(specs);
	handshake();
	json(argv[1]);
	npy();
	safetensors();
	tokens();
	journal();
	for (size_t i = 0; i < N_SPECS; i++)
		pt_job_spec_fini(&specs[i]);
	pt_fb_builder_fini(&fb);
	return 0;
}
