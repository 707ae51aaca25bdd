/* tokens.c - token file loading, validation and window sampling. */
#include "tokens.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "rng.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.c reads little-endian tokens in place"
#endif

static pt_err check_token_dtype(pt_dtype dtype, const char *path)
{
	if (dtype != PT_U16 && dtype != PT_U32)
		return pt_set_error(PT_ERR_DTYPE, "%s: token files hold u16 or u32, not %s", path,
		                    pt_dtype_name(dtype));
	return PT_OK;
}

uint32_t pt_tokens_at(const pt_tokens *tk, int64_t i)
{
	if (tk->dtype == PT_U16)
		return ((const uint16_t *)tk->data)[i];
	return ((const uint32_t *)tk->data)[i];
}

static pt_err tokens_adopt(pt_tokens *tk, void *data, size_t len, const char *path, pt_dtype dtype,
                           int64_t vocab_size);

pt_err pt_tokens_load(pt_tokens *tk, const char *path, pt_dtype dtype, int64_t vocab_size)
{
	size_t len;
	void *data;

	memset(tk, 0, sizeof(*tk));
	PT_TRY(check_token_dtype(dtype, path));
	PT_TRY(pt_file_read(path, SIZE_MAX - 1, &data, &len));
	return tokens_adopt(tk, data, len, path, dtype, vocab_size);
}

pt_err pt_tokens_load_fd(pt_tokens *tk, int fd, const char *path, pt_dtype dtype,
                         int64_t vocab_size)
{
	size_t len;
	void *data;

	memset(tk, 0, sizeof(*tk));
	PT_TRY(check_token_dtype(dtype, path));
	PT_TRY(pt_file_read_fd(fd, path, SIZE_MAX - 1, &data, &len));
	return tokens_adopt(tk, data, len, path, dtype, vocab_size);
}

/* tokens_adopt checks the len bytes read from path and takes data. */
static pt_err tokens_adopt(pt_tokens *tk, void *data, size_t len, const char *path, pt_dtype dtype,
                           int64_t vocab_size)
{
	size_t es = pt_dtype_size(dtype);

	if (len % es != 0) {
		free(data);
		return pt_set_error(PT_ERR_FORMAT,
		                    "%s: %zu bytes is not a whole number of %zu-byte %s tokens",
		                    path, len, es, pt_dtype_name(dtype));
	}
	tk->dtype = dtype;
	tk->data = data;
	tk->count = (int64_t)(len / es);
	for (int64_t i = 0; i < tk->count; i++) {
		uint32_t t = pt_tokens_at(tk, i);
		if (vocab_size > 0 && (int64_t)t >= vocab_size) {
			pt_tokens_fini(tk);
			return pt_set_error(PT_ERR_FORMAT,
			                    "%s: token %" PRIu32 " at position %" PRId64
			                    " is not below the vocabulary size %" PRId64,
			                    path, t, i, vocab_size);
		}
		if (t > tk->max_token)
			tk->max_token = t;
	}
	return PT_OK;
}

void pt_tokens_fini(pt_tokens *tk)
{
	if (tk == NULL)
		return;
	free(tk->data);
	memset(tk, 0, sizeof(*tk));
}

static pt_err check_window_tensor(const pt_tensor *t, const char *what, int64_t b, int64_t n)
{
	char sh[96];
	if (t->dtype != PT_I64 || t->ndim != 2)
		return pt_set_error(
		    PT_ERR_SHAPE, "tokens: %s must be a (B, T) i64 tensor, not %s %s", what,
		    pt_shape_str(sh, sizeof(sh), t->ndim, t->shape), pt_dtype_name(t->dtype));
	if (b >= 0 && (t->shape[0] != b || t->shape[1] != n))
		return pt_set_error(PT_ERR_SHAPE,
		                    "tokens: %s is %s but input is (%" PRId64 ", %" PRId64 ")",
		                    what, pt_shape_str(sh, sizeof(sh), t->ndim, t->shape), b, n);
	return PT_OK;
}

pt_err pt_tokens_sample(const pt_tokens *tk, uint64_t seed, uint64_t step, pt_tensor *input,
                        pt_tensor *target)
{
	int64_t B, T;
	uint64_t starts;
	int64_t *in, *tg;

	PT_TRY(check_window_tensor(input, "input", -1, -1));
	B = input->shape[0];
	T = input->shape[1];
	PT_TRY(check_window_tensor(target, "target", B, T));
	if (T < 1 || tk->count < T + 1)
		return pt_set_error(PT_ERR_RANGE,
		                    "tokens: windows of %" PRId64
		                    " + 1 tokens from a file of %" PRId64,
		                    T, tk->count);
	PT_TRY(pt_data_write_begin(input, "tokens input"));
	PT_TRY(pt_data_write_begin(target, "tokens target"));
	in = pt_tensor_data(input);
	tg = pt_tensor_data(target);
	starts = (uint64_t)(tk->count - T);
	for (int64_t b = 0; b < B; b++) {
		uint32_t w[4];
		pt_philox(seed, step, (uint64_t)b, w);
		/* 64 random bits modulo starts: the bias is below starts / 2^64. */
		int64_t off = (int64_t)((((uint64_t)w[1] << 32) | w[0]) % starts);
		for (int64_t t = 0; t < T; t++) {
			in[b * T + t] = pt_tokens_at(tk, off + t);
			tg[b * T + t] = pt_tokens_at(tk, off + t + 1);
		}
	}
	pt_data_write_end(input);
	pt_data_write_end(target);
	return PT_OK;
}

pt_err pt_tokens_write_bytes(const char *path, const void *bytes, size_t n, pt_dtype dtype)
{
	const unsigned char *src = bytes;
	size_t es;
	void *buf;
	pt_err rv;

	PT_TRY(check_token_dtype(dtype, path));
	es = pt_dtype_size(dtype);
	if (n > SIZE_MAX / es)
		return pt_set_error(PT_ERR_OVERFLOW, "%s: %zu tokens", path, n);
	buf = malloc(n * es + 1);
	if (buf == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: %zu tokens", path, n);
	for (size_t i = 0; i < n; i++) {
		if (dtype == PT_U16)
			((uint16_t *)buf)[i] = src[i];
		else
			((uint32_t *)buf)[i] = src[i];
	}
	pt_file_part part = {buf, n * es};
	rv = pt_file_write_atomic(path, &part, 1);
	free(buf);
	return rv;
}
