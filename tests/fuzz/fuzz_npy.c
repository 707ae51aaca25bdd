/* fuzz_npy.c - lib/data/npy.c: .npy files as the job's data (pt_npy_read).
 *
 * Property: an array that reads writes back (pt_npy_write) into a file that
 * reads to the same dtype, shape and bytes. */
#include <unistd.h>

#include "fuzz_common.h"
#include "npy.h"

static char out_path[128];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	snprintf(out_path, sizeof(out_path), "%s/out.npy", fuzz_tmpdir());
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pt_tensor t, back;

	if (pt_npy_read(&t, fuzz_file(data, size)) != PT_OK)
		return 0;
	FUZZ_CHECK(t.ndim >= 0 && t.ndim <= PT_MAX_DIMS);
	FUZZ_CHECK(pt_npy_write(out_path, &t) == PT_OK);
	FUZZ_CHECK(pt_npy_read(&back, out_path) == PT_OK);
	FUZZ_CHECK(back.dtype == t.dtype && back.ndim == t.ndim);
	FUZZ_CHECK(memcmp(back.shape, t.shape, sizeof(int64_t) * (size_t)t.ndim) == 0);
	FUZZ_CHECK(pt_tensor_nbytes(&back) == pt_tensor_nbytes(&t));
	FUZZ_CHECK(memcmp(pt_tensor_data(&back), pt_tensor_data(&t), pt_tensor_nbytes(&t)) == 0);
	unlink(out_path);
	pt_tensor_fini(&back);
	pt_tensor_fini(&t);
	return 0;
}
