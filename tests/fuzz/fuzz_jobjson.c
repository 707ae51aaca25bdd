/* fuzz_jobjson.c - lib/job/job_json.c: JobSpec JSON text into a spec and a
 * JobSpec table, and job files of either kind (pt_job_spec_load_file).
 *
 * A spec the JSON reader accepts must build into a table that verifies, and
 * when it decodes, the decoded spec must build to the same bytes (so the CLI
 * never sends what the server would read differently). */
#include "fuzz_common.h"
#include "job/job.h"

static pt_fb_builder b1, b2;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	FUZZ_CHECK(pt_fb_builder_init(&b1, 4096) == PT_OK);
	FUZZ_CHECK(pt_fb_builder_init(&b2, 4096) == PT_OK);
	return 0;
}

/* build_root builds s as a finished JobSpec root buffer in b. */
static pt_err build_root(pt_fb_builder *b, const pt_job_spec *s, const uint8_t **data, size_t *size)
{
	pt_fb_ref root;
	pt_fb_builder_reset(b);
	PT_TRY(pt_job_spec_build(b, s, &root));
	return pt_fb_finish(b, root, NULL, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pt_job_spec s, back;
	const uint8_t *d1, *d2;
	size_t n1, n2, flen;
	void *fbuf;

	if (pt_job_spec_parse_json((const char *)data, size, &s) == PT_OK) {
		if (build_root(&b1, &s, &d1, &n1) == PT_OK) {
			const uint8_t *copy = fuzz_aligned(0, d1, n1);
			/* The table always verifies. Reading it also checks the
			 * optimizer (pt_fb_read_optimizer: e.g. min_lr <= lr), which
			 * the JSON reader leaves to pt_job_spec_validate. */
			FUZZ_CHECK(pt_fb_verify(copy, n1, &pt_fb_job_job_spec_desc, NULL, NULL) ==
			           PT_OK);
			if (pt_job_spec_decode(copy, n1, &back) == PT_OK) {
				FUZZ_CHECK(back.n_layers == s.n_layers && back.stages == s.stages &&
				           back.n_workers == s.n_workers && back.steps == s.steps);
				FUZZ_CHECK(build_root(&b2, &back, &d2, &n2) == PT_OK);
				FUZZ_CHECK(n1 == n2 && memcmp(copy, d2, n1) == 0);
				pt_job_spec_fini(&back);
			}
		}
		pt_job_spec_fini(&s);
	}
	/* The job file reader: JSON or binary, told apart by content; either
	 * way the buffer verifies (a binary comes back as it is). */
	if (pt_job_spec_load_file(fuzz_file(data, size), &fbuf, &flen) == PT_OK) {
		FUZZ_CHECK(pt_fb_verify(fbuf, flen, &pt_fb_job_job_spec_desc, NULL, NULL) == PT_OK);
		if (pt_fb_verify(fuzz_aligned(0, data, size), size, &pt_fb_job_job_spec_desc, NULL,
		                 NULL) == PT_OK)
			FUZZ_CHECK(flen == size && memcmp(fbuf, data, size) == 0);
		if (pt_job_spec_decode(fbuf, flen, &back) == PT_OK)
			pt_job_spec_fini(&back);
		free(fbuf);
	}
	return 0;
}
