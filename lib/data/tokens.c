/* tokens.c - token file loading, validation and window sampling. */
#include "tokens.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "rng.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens.c reads little-endian tokens in place"
#endif

static pt_err check_token_dtype(pt_dtype dtype, const char *path)
{
	if (dtype != PT_U16 && dtype != PT_U32 && dtype != PT_TOKENS_AUTO)
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

/* parse tells what a token file of size bytes, starting with the head_len
 * bytes head, holds when read as dtype (pt_tokens_info_fd). */
static pt_err parse(const unsigned char *head, size_t head_len, uint64_t size, const char *path,
                    pt_dtype dtype, pt_tokens_info *out)
{
	int32_t h[3];
	uint64_t es;

	memset(out, 0, sizeof(*out));
	PT_TRY(check_token_dtype(dtype, path));
	if (head_len >= 4 && (memcpy(h, head, 4), h[0] == PT_TOKENS_MAGIC)) {
		if (size < PT_TOKENS_HEADER_BYTES)
			return pt_set_error(PT_ERR_FORMAT,
			                    "%s: starts with llm.c's magic %d but is %" PRIu64
			                    " bytes, shorter than its %d-byte header",
			                    path, PT_TOKENS_MAGIC, size, PT_TOKENS_HEADER_BYTES);
		memcpy(h, head, sizeof(h));
		if (h[1] != 1 && h[1] != 2)
			return pt_set_error(PT_ERR_FORMAT,
			                    "%s: llm.c header version %" PRId32
			                    " (expected 1: uint16 tokens, or 2: uint32 tokens)",
			                    path, h[1]);
		out->version = h[1];
		out->dtype = h[1] == 1 ? PT_U16 : PT_U32;
		es = h[1] == 1 ? 2 : 4;
		if (h[2] < 0 || (uint64_t)h[2] * es != size - PT_TOKENS_HEADER_BYTES)
			return pt_set_error(PT_ERR_FORMAT,
			                    "%s: llm.c header says %" PRId32 " tokens (%" PRIu64
			                    " bytes) but %" PRIu64 " bytes follow the header",
			                    path, h[2], (uint64_t)(h[2] < 0 ? 0 : h[2]) * es,
			                    size - PT_TOKENS_HEADER_BYTES);
		if (dtype != PT_TOKENS_AUTO && dtype != out->dtype)
			return pt_set_error(
			    PT_ERR_FORMAT, "%s: llm.c header version %d holds %s tokens, not %s",
			    path, out->version, pt_dtype_name(out->dtype), pt_dtype_name(dtype));
		out->count = h[2];
		return PT_OK;
	}
	out->dtype = dtype == PT_TOKENS_AUTO ? PT_U16 : dtype;
	es = pt_dtype_size(out->dtype);
	if (size % es != 0)
		return pt_set_error(PT_ERR_FORMAT,
		                    "%s: %" PRIu64 " bytes is not a whole number of %" PRIu64
		                    "-byte %s tokens",
		                    path, size, es, pt_dtype_name(out->dtype));
	out->count = (int64_t)(size / es);
	return PT_OK;
}

pt_err pt_tokens_info_fd(int fd, const char *path, pt_dtype dtype, pt_tokens_info *out)
{
	unsigned char head[12];
	size_t size;
	ssize_t got;

	memset(out, 0, sizeof(*out));
	PT_TRY(pt_file_fd_size(fd, path, &size));
	got = pread(fd, head, sizeof(head), 0);
	if (got < 0)
		return pt_set_error(PT_ERR_IO, "%s: %s", path, strerror(errno));
	return parse(head, (size_t)got, size, path, dtype, out);
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

/* tokens_adopt checks the len bytes read from path and takes data (the
 * tokens moved to its start when an llm.c header preceded them). */
static pt_err tokens_adopt(pt_tokens *tk, void *data, size_t len, const char *path, pt_dtype dtype,
                           int64_t vocab_size)
{
	pt_tokens_info info;
	pt_err rv = parse(data, len, len, path, dtype, &info);

	if (rv != PT_OK) {
		free(data);
		return rv;
	}
	if (info.version != 0)
		memmove(data, (char *)data + PT_TOKENS_HEADER_BYTES,
		        (size_t)info.count * pt_dtype_size(info.dtype));
	tk->dtype = info.dtype;
	tk->version = info.version;
	tk->data = data;
	tk->count = info.count;
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

pt_err pt_tokens_sample_range(const pt_tokens *tk, int64_t lo, int64_t hi, uint64_t seed,
                              uint64_t step, pt_tensor *input, pt_tensor *target)
{
	int64_t B, T;
	uint64_t starts;
	int64_t *in, *tg;

	PT_TRY(check_window_tensor(input, "input", -1, -1));
	B = input->shape[0];
	T = input->shape[1];
	PT_TRY(check_window_tensor(target, "target", B, T));
	if (lo < 0 || hi > tk->count || T < 1 || hi - lo < T + 1)
		return pt_set_error(PT_ERR_RANGE,
		                    "tokens: windows of %" PRId64
		                    " + 1 tokens from tokens [%" PRId64 ", %" PRId64
		                    ") of a file of %" PRId64,
		                    T, lo, hi, tk->count);
	PT_TRY(pt_data_write_begin(input, "tokens input"));
	PT_TRY(pt_data_write_begin(target, "tokens target"));
	in = pt_tensor_data(input);
	tg = pt_tensor_data(target);
	starts = (uint64_t)(hi - lo - T);
	for (int64_t b = 0; b < B; b++) {
		uint32_t w[4];
		pt_philox(seed, step, (uint64_t)b, w);
		/* 64 random bits modulo starts: the bias is below starts / 2^64. */
		int64_t off = lo + (int64_t)((((uint64_t)w[1] << 32) | w[0]) % starts);
		for (int64_t t = 0; t < T; t++) {
			in[b * T + t] = pt_tokens_at(tk, off + t);
			tg[b * T + t] = pt_tokens_at(tk, off + t + 1);
		}
	}
	pt_data_write_end(input);
	pt_data_write_end(target);
	return PT_OK;
}

pt_err pt_tokens_sample(const pt_tokens *tk, uint64_t seed, uint64_t step, pt_tensor *input,
                        pt_tensor *target)
{
	return pt_tokens_sample_range(tk, 0, tk->count, seed, step, input, target);
}

int64_t pt_tokens_split(int64_t count, double held_out)
{
	return count - (int64_t)floor(held_out * (double)count);
}

int64_t pt_tokens_n_windows(int64_t lo, int64_t hi, int64_t seq_len)
{
	return seq_len >= 1 && hi - lo >= seq_len + 1 ? (hi - lo - 1) / seq_len : 0;
}

pt_err pt_tokens_windows(const pt_tokens *tk, int64_t lo, int64_t first, int64_t n, int64_t pad,
                         pt_tensor *input, pt_tensor *target)
{
	int64_t B, T, *in, *tg;

	PT_TRY(check_window_tensor(input, "input", -1, -1));
	B = input->shape[0];
	T = input->shape[1];
	PT_TRY(check_window_tensor(target, "target", B, T));
	if (lo < 0 || first < 0 || n < 0 || n > B || T < 1 ||
	    (n > 0 && (first + n) * T + 1 > tk->count - lo))
		return pt_set_error(PT_ERR_RANGE,
		                    "tokens: windows %" PRId64 "..%" PRId64 " of %" PRId64
		                    " + 1 tokens from token %" PRId64 " of a file of %" PRId64
		                    " (batch %" PRId64 ")",
		                    first, first + n - 1, T, lo, tk->count, B);
	PT_TRY(pt_data_write_begin(input, "tokens input"));
	PT_TRY(pt_data_write_begin(target, "tokens target"));
	in = pt_tensor_data(input);
	tg = pt_tensor_data(target);
	for (int64_t b = 0; b < B; b++) {
		int64_t off = lo + (first + b) * T;
		for (int64_t t = 0; t < T; t++) {
			in[b * T + t] = b < n ? pt_tokens_at(tk, off + t) : 0;
			tg[b * T + t] = b < n ? pt_tokens_at(tk, off + t + 1) : pad;
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

	if (dtype != PT_U16 && dtype != PT_U32)
		return pt_set_error(PT_ERR_DTYPE, "%s: token files hold u16 or u32, not %s", path,
		                    pt_dtype_name(dtype));
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
