/* fuzz_safetensors.c - lib/data/safetensors.c: checkpoints a server reads
 * back to resume a job (pt_safetensors_open and the accessors).
 *
 * Properties: every listed tensor is found by name and its bytes lie in the
 * file; a file that opens writes back (pt_safetensors_write) into one that
 * opens with the same names, dtypes, shapes, bytes and metadata. */
#include <unistd.h>

#include "fuzz_common.h"
#include "safetensors.h"

#define MAX_TENSORS 64
#define MAX_META    64

static char out_path[128];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	snprintf(out_path, sizeof(out_path), "%s/out.safetensors", fuzz_tmpdir());
	return 0;
}

static void check_same(const pt_safetensors *a, const pt_safetensors *b)
{
	FUZZ_CHECK(pt_safetensors_count(a) == pt_safetensors_count(b));
	for (size_t i = 0; i < pt_safetensors_count(a); i++) {
		const char *name = pt_safetensors_name(a, i);
		pt_tensor x, y;
		FUZZ_CHECK(strcmp(name, pt_safetensors_name(b, i)) == 0);
		FUZZ_CHECK(pt_safetensors_get(a, name, &x) == PT_OK);
		FUZZ_CHECK(pt_safetensors_get(b, name, &y) == PT_OK);
		FUZZ_CHECK(x.dtype == y.dtype && x.ndim == y.ndim);
		FUZZ_CHECK(memcmp(x.shape, y.shape, sizeof(int64_t) * (size_t)x.ndim) == 0);
		FUZZ_CHECK(memcmp(pt_tensor_data(&x), pt_tensor_data(&y), pt_tensor_nbytes(&x)) ==
		           0);
		pt_tensor_fini(&x);
		pt_tensor_fini(&y);
	}
	for (size_t i = 0; i < pt_safetensors_meta_count(a); i++) {
		const char *k = pt_safetensors_meta_key(a, i);
		if (strcmp(k, "data_sha256") == 0)
			continue;
		FUZZ_CHECK(pt_safetensors_meta(b, k) != NULL);
		FUZZ_CHECK(strcmp(pt_safetensors_meta(a, k), pt_safetensors_meta(b, k)) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pt_safetensors *st, *back;
	pt_tensor ts[MAX_TENSORS];
	pt_st_tensor named[MAX_TENSORS];
	pt_st_meta meta[MAX_META];
	size_t n, n_meta = 0;
	int writable = 1;

	if (pt_safetensors_open(&st, fuzz_file(data, size)) != PT_OK) {
		FUZZ_CHECK(st == NULL);
		return 0;
	}
	n = pt_safetensors_count(st);
	FUZZ_CHECK(pt_safetensors_name(st, n) == NULL);
	for (size_t i = 0; i < n; i++) {
		const char *name = pt_safetensors_name(st, i);
		pt_dtype dt;
		int ndim;
		int64_t shape[PT_MAX_DIMS];
		pt_tensor t, copy;
		FUZZ_CHECK(name != NULL);
		FUZZ_CHECK(pt_safetensors_info(st, name, &dt, &ndim, shape) == PT_OK);
		FUZZ_CHECK(pt_safetensors_get(st, name, &t) == PT_OK);
		FUZZ_CHECK(t.dtype == dt && t.ndim == ndim);
		FUZZ_CHECK(pt_tensor_init(&copy, dt, ndim, shape) == PT_OK);
		FUZZ_CHECK(pt_safetensors_copy(st, name, &copy) == PT_OK);
		FUZZ_CHECK(
		    memcmp(pt_tensor_data(&copy), pt_tensor_data(&t), pt_tensor_nbytes(&t)) == 0);
		pt_tensor_fini(&copy);
		if (i < MAX_TENSORS) {
			ts[i] = t;
			named[i] = (pt_st_tensor){name, &ts[i]};
		} else {
			pt_tensor_fini(&t);
		}
	}
	for (size_t i = 0; i < pt_safetensors_meta_count(st); i++) {
		const char *k = pt_safetensors_meta_key(st, i);
		const char *v = pt_safetensors_meta(st, k);
		FUZZ_CHECK(k != NULL && v != NULL);
		if (strcmp(k, "data_sha256") == 0)
			continue;
		/* A key or value with a NUL inside cannot be written back as given. */
		if (n_meta == MAX_META)
			writable = 0;
		else
			meta[n_meta++] = (pt_st_meta){k, v};
	}
	/* Names with a NUL inside are refused by the reader; names are C strings. */
	if (n <= MAX_TENSORS && writable &&
	    pt_safetensors_write(out_path, named, n, meta, n_meta) == PT_OK) {
		FUZZ_CHECK(pt_safetensors_open(&back, out_path) == PT_OK);
		check_same(st, back);
		pt_safetensors_destroy(back);
		unlink(out_path);
	}
	for (size_t i = 0; i < n && i < MAX_TENSORS; i++)
		pt_tensor_fini(&ts[i]);
	pt_safetensors_destroy(st);
	return 0;
}
