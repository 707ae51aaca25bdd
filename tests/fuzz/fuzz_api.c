/* fuzz_api.c - the API request path of pipeserver: lib/api verify + decode
 * (pt_api_parse_request), the nested JobSpec read (pt_job_spec_read) and its
 * validation (pt_job_spec_validate against a small folder of data files), as
 * server/api_server.c and pt_jobs_submit run them on every request. The same
 * bytes also go through pt_api_parse_response and its accessors (what a
 * client reads from a server).
 *
 * Property: a parsed request rebuilds into a buffer that parses to the same
 * request, and that rebuilds to the same bytes. */
#include <unistd.h>

#include "api/api.h"
#include "fuzz_common.h"
#include "npy.h"
#include "tokens.h"

static pt_fb_builder b1, b2;
static char files_root[80];

/* make_files writes the data files the seed specs name: x.npy (8, 4) f32,
 * y.npy (8,) i64 labels, t.npy (8, 2) f32 targets, t.u16 and t.u32 tokens. */
static void make_files(void)
{
	pt_tensor x, y, t;
	int64_t xs[2] = {8, 4}, ys[1] = {8}, ts[2] = {8, 2};
	char p[160], text[64];

	snprintf(files_root, sizeof(files_root), "%s", fuzz_tmpdir());
	FUZZ_CHECK(pt_tensor_init(&x, PT_F32, 2, xs) == PT_OK);
	FUZZ_CHECK(pt_tensor_init(&y, PT_I64, 1, ys) == PT_OK);
	FUZZ_CHECK(pt_tensor_init(&t, PT_F32, 2, ts) == PT_OK);
	for (int i = 0; i < 32; i++)
		((float *)pt_tensor_data(&x))[i] = (float)i / 8.0f;
	for (int i = 0; i < 8; i++)
		((int64_t *)pt_tensor_data(&y))[i] = i % 2;
	for (int i = 0; i < 16; i++)
		((float *)pt_tensor_data(&t))[i] = (float)i;
	snprintf(p, sizeof(p), "%s/x.npy", files_root);
	FUZZ_CHECK(pt_npy_write(p, &x) == PT_OK);
	snprintf(p, sizeof(p), "%s/y.npy", files_root);
	FUZZ_CHECK(pt_npy_write(p, &y) == PT_OK);
	snprintf(p, sizeof(p), "%s/t.npy", files_root);
	FUZZ_CHECK(pt_npy_write(p, &t) == PT_OK);
	for (int i = 0; i < 64; i++)
		text[i] = (char)('a' + i % 26);
	snprintf(p, sizeof(p), "%s/t.u16", files_root);
	FUZZ_CHECK(pt_tokens_write_bytes(p, text, sizeof(text), PT_U16) == PT_OK);
	snprintf(p, sizeof(p), "%s/t.u32", files_root);
	FUZZ_CHECK(pt_tokens_write_bytes(p, text, sizeof(text), PT_U32) == PT_OK);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	pt_tensor_fini(&t);
}

static void remove_files(void)
{
	static const char *const names[] = {"x.npy", "y.npy", "t.npy", "t.u16", "t.u32"};
	char p[160];
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", files_root, names[i]);
		unlink(p);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	FUZZ_CHECK(pt_fb_builder_init(&b1, 4096) == PT_OK);
	FUZZ_CHECK(pt_fb_builder_init(&b2, 4096) == PT_OK);
	make_files();
	atexit(remove_files);
	return 0;
}

/* local_name: validation reads only files of the fixture folder (a name
 * without '/'), never one elsewhere on this machine. */
static int local_name(const char *p)
{
	return p == NULL || strchr(p, '/') == NULL;
}

static void check_same(const pt_api_request *a, const pt_api_request *b)
{
	FUZZ_CHECK(a->id == b->id && a->kind == b->kind && a->job == b->job);
	FUZZ_CHECK((a->auth_token == NULL) == (b->auth_token == NULL));
	FUZZ_CHECK(a->auth_token == NULL || strcmp(a->auth_token, b->auth_token) == 0);
	FUZZ_CHECK(a->cursor == b->cursor && a->wait_ms == b->wait_ms &&
	           a->max_points == b->max_points);
	FUZZ_CHECK(a->step == b->step && a->offset == b->offset && a->length == b->length);
	FUZZ_CHECK((a->spec_table == NULL) == (b->spec_table == NULL));
}

static void request(const uint8_t *buf, size_t size)
{
	pt_api_request q, q2;
	pt_job_spec spec;
	const uint8_t *d1, *d2;
	size_t n1, n2;
	int have_spec = 0;

	if (pt_api_parse_request(buf, size, &q) != PT_OK)
		return;
	if (q.kind == PT_API_SUBMIT_JOB) {
		FUZZ_CHECK(q.spec_table != NULL); /* required by the schema */
		if (pt_job_spec_read(q.spec_table, &spec) != PT_OK)
			return;
		have_spec = 1;
		if (local_name(spec.data.features) && local_name(spec.data.labels) &&
		    local_name(spec.data.tokens))
			(void)pt_job_spec_validate(&spec, files_root, false);
		q.spec = &spec;
	}
	/* Rebuild: a spec the builder refuses (e.g. no layers) ends here. */
	if (pt_api_build_request(&b1, &q, &d1, &n1) == PT_OK) {
		const uint8_t *copy = fuzz_aligned(1, d1, n1);
		FUZZ_CHECK(pt_api_parse_request(copy, n1, &q2) == PT_OK);
		check_same(&q, &q2);
		if (have_spec) {
			pt_job_spec s2;
			FUZZ_CHECK(pt_job_spec_read(q2.spec_table, &s2) == PT_OK);
			q2.spec = &s2;
			FUZZ_CHECK(pt_api_build_request(&b2, &q2, &d2, &n2) == PT_OK);
			pt_job_spec_fini(&s2);
		} else {
			FUZZ_CHECK(pt_api_build_request(&b2, &q2, &d2, &n2) == PT_OK);
		}
		FUZZ_CHECK(n1 == n2 && memcmp(copy, d2, n1) == 0);
	}
	if (have_spec)
		pt_job_spec_fini(&spec);
}

static void response(const uint8_t *buf, size_t size)
{
	pt_api_response r;

	if (pt_api_parse_response(buf, size, &r) != PT_OK)
		return;
	for (size_t i = 0; i < r.n_jobs; i++) {
		pt_api_job_info j;
		pt_api_stage_stats st;
		FUZZ_CHECK(pt_api_response_job(&r, i, &j) == PT_OK);
		for (size_t k = 0; k < j.n_stages; k++)
			FUZZ_CHECK(pt_api_job_stage(&j, k, &st) == PT_OK);
		FUZZ_CHECK(pt_api_job_stage(&j, j.n_stages, &st) == PT_ERR_RANGE);
		if (j.spec_table != NULL) {
			pt_job_spec spec;
			if (pt_job_spec_read(j.spec_table, &spec) == PT_OK)
				pt_job_spec_fini(&spec);
		}
	}
	for (size_t i = 0; i < r.n_points; i++) {
		pt_api_metric_point p;
		FUZZ_CHECK(pt_api_response_point(&r, i, &p) == PT_OK);
		FUZZ_CHECK(p.n_stages >= 0 && p.n_stages <= PT_API_MAX_STAGES);
	}
	for (size_t i = 0; i < r.n_checkpoints; i++) {
		pt_api_checkpoint_info c;
		FUZZ_CHECK(pt_api_response_checkpoint(&r, i, &c) == PT_OK);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	request(fuzz_aligned(0, data, size), size);
	response(fuzz_aligned(0, data, size), size);
	return 0;
}
