/* pt_test.c - CUnit runner and failure reporting shared by the tests. */
#include "pt_test.h"

#include "job.h"

#include <limits.h>
#include <nng/nng.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pt_test_report(int rv, const char *expr, const char *file, int line)
{
	fprintf(stderr, "%s:%d: %s -> %s (%s): %s\n", file, line, expr, pt_err_name((pt_err)rv),
	        pt_strerror((pt_err)rv), pt_last_error());
}

const char *pt_test_path(const char *rel)
{
	/* A few rotating buffers, so several calls can appear in one expression. */
	static char bufs[8][4096];
	static unsigned next;
	char *buf = bufs[next++ % 8];
	snprintf(buf, sizeof(bufs[0]), "%s/%s", PT_SOURCE_ROOT, rel);
	return buf;
}

/* Whether name contains one of the comma-separated substrings of list. */
static bool name_listed(const char *name, const char *list)
{
	char buf[1024], *save = NULL;
	snprintf(buf, sizeof(buf), "%s", list);
	for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save))
		if (*w && strstr(name, w) != NULL)
			return true;
	return false;
}

int pt_test_main(const pt_test_suite *suites)
{
	const char *only = getenv("PT_TEST_ONLY"), *skip = getenv("PT_TEST_SKIP");
	unsigned failed;
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 99;
	for (const pt_test_suite *s = suites; s->name; s++) {
		CU_pSuite suite = CU_add_suite(s->name, NULL, NULL);
		if (suite == NULL)
			return 99;
		for (const pt_test_case *t = s->tests; t->name; t++) {
			if ((only && !name_listed(t->name, only)) ||
			    (skip && name_listed(t->name, skip)))
				continue;
			if (CU_add_test(suite, t->name, t->fn) == NULL)
				return 99;
		}
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	failed = CU_get_number_of_tests_failed() + CU_get_number_of_suites_failed() +
	         CU_get_number_of_failures();
	CU_cleanup_registry();
	/* nng frees a closed socket's pipes and dialers on its reaper thread;
	 * exiting before that finishes makes LeakSanitizer report them (seen
	 * once in test_server, a client dropped for an oversized request and
	 * closed just before). nng_fini waits for it; every test is done and
	 * no thread of ours uses nng any more. */
	nng_fini();
	return failed ? 1 : 0;
}

void pt_test_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(fwrite(data, 1, len, f), len);
	fclose(f);
}

bool pt_test_binary(const char *rel, char *out, size_t cap)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;
	if (n <= 0)
		return false;
	self[n] = '\0';
	if ((slash = strrchr(self, '/')) != NULL)
		*slash = '\0';
	snprintf(out, cap, "%s/%s", self, rel);
	return access(out, X_OK) == 0;
}

bool pt_test_tmpdir(const char *name, char *dir, size_t cap)
{
	snprintf(dir, cap, "/tmp/%s.XXXXXX", name);
	return mkdtemp(dir) != NULL;
}

int pt_test_tmpdir_done(const char *dir, int rc)
{
	char cmd[PATH_MAX + 16];
	if (rc == 0 && getenv("PT_KEEP_TMP") == NULL) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	} else {
		fprintf(stderr, "test files kept in %s\n", dir);
	}
	return rc;
}

void pt_test_digits_spec(struct pt_job_spec *spec)
{
	void *buf;
	size_t len;

	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path("examples/digits.json"), &buf, &len));
	memset(spec, 0, sizeof(*spec));
	PT_CHECK_OK(pt_job_spec_decode(buf, len, spec));
	free(buf);
}
