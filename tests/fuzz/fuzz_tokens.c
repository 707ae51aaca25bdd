/* fuzz_tokens.c - lib/data/tokens.c: token files (pt_tokens_load) and the
 * windows sampled from them (pt_tokens_sample).
 *
 * Input: byte 0 picks the token size (bit 1: auto, else bit 0: u32, else
 * u16), bytes 1-2 the vocabulary size (little-endian; 0: unchecked), byte 3
 * the sampling step; the rest is the file. Properties: the count is what the
 * size (less an llm.c header) holds; every token is below the vocabulary and
 * max_token is the largest; each target row is its input row shifted by one;
 * fixed windows are the file's tokens at their positions. */
#include "fuzz_common.h"
#include "tokens.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pt_tokens tk;
	pt_dtype dt;
	int64_t vocab, B = 2, T;
	uint32_t max = 0;

	if (size < 4)
		return 0;
	dt = (data[0] & 2) ? PT_TOKENS_AUTO : (data[0] & 1) ? PT_U32 : PT_U16;
	vocab = (int64_t)data[1] | (int64_t)data[2] << 8;
	if (pt_tokens_load(&tk, fuzz_file(data + 4, size - 4), dt, vocab) != PT_OK)
		return 0;
	FUZZ_CHECK(dt == PT_TOKENS_AUTO || tk.dtype == dt);
	FUZZ_CHECK(tk.count == (int64_t)((size - 4 - (tk.version ? PT_TOKENS_HEADER_BYTES : 0)) /
	                                 pt_dtype_size(tk.dtype)));
	for (int64_t i = 0; i < tk.count; i++) {
		uint32_t t = pt_tokens_at(&tk, i);
		FUZZ_CHECK(vocab == 0 || (int64_t)t < vocab);
		max = t > max ? t : max;
	}
	FUZZ_CHECK(max == tk.max_token);
	T = tk.count > 9 ? 8 : tk.count - 1;
	if (T >= 1) {
		pt_tensor in, tg;
		int64_t shape[2] = {B, T};
		FUZZ_CHECK(pt_tensor_init(&in, PT_I64, 2, shape) == PT_OK);
		FUZZ_CHECK(pt_tensor_init(&tg, PT_I64, 2, shape) == PT_OK);
		FUZZ_CHECK(pt_tokens_sample(&tk, 7, data[3], &in, &tg) == PT_OK);
		const int64_t *x = pt_tensor_data(&in), *y = pt_tensor_data(&tg);
		for (int64_t b = 0; b < B; b++)
			for (int64_t t = 0; t + 1 < T; t++)
				FUZZ_CHECK(y[b * T + t] == x[b * T + t + 1]);
		int64_t n = pt_tokens_n_windows(0, tk.count, T);
		n = n < B ? n : B;
		FUZZ_CHECK(pt_tokens_windows(&tk, 0, 0, n, -1, &in, &tg) == PT_OK);
		for (int64_t b = 0; b < B; b++)
			for (int64_t t = 0; t < T; t++) {
				FUZZ_CHECK(x[b * T + t] ==
				           (b < n ? pt_tokens_at(&tk, b * T + t) : 0));
				FUZZ_CHECK(
				    y[b * T + t] ==
				    (b < n ? (int64_t)pt_tokens_at(&tk, b * T + t + 1) : -1));
			}
		pt_tensor_fini(&in);
		pt_tensor_fini(&tg);
	}
	/* Windows longer than the file are refused. */
	{
		pt_tensor in, tg;
		int64_t shape[2] = {1, tk.count};
		if (tk.count >= 1 && tk.count <= 4096) {
			FUZZ_CHECK(pt_tensor_init(&in, PT_I64, 2, shape) == PT_OK);
			FUZZ_CHECK(pt_tensor_init(&tg, PT_I64, 2, shape) == PT_OK);
			FUZZ_CHECK(pt_tokens_sample(&tk, 7, 0, &in, &tg) == PT_ERR_RANGE);
			pt_tensor_fini(&in);
			pt_tensor_fini(&tg);
		}
	}
	pt_tokens_fini(&tk);
	return 0;
}
