/* test_data.c - JSON, npy, token files, datasets and batching, SHA-256, and the
 * shipped example data. Malformed files are written by the tests themselves
 * into a fresh temporary directory. */
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "json.h"
#include "npy.h"
#include "pt_test.h"
#include "sha256.h"
#include "tensor.h"
#include "tokens.h"

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
	static char buf[256];
	snprintf(buf, sizeof(buf), "%s/%s", tmpdir, name);
	return buf;
}

/* ---- JSON ---- */

static void test_data_json_values(void)
{
	const char *doc = "{\"a\": [1, -2.5, 1e3, 9223372036854775807, -9223372036854775808, "
	                  "18446744073709551616],\n \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9"
	                  "\\ud83d\\ude00\\u0000z\", \"t\": true, \"f\": false, \"n\": null, "
	                  "\"o\": {\"k\": \"v\"}, \"e\": [], \"u\": \"\xc3\xa9\"}";
	pt_json v;
	const pt_json *a, *s;
	int64_t i;

	PT_CHECK_OK(pt_json_parse(&v, doc, strlen(doc), NULL));
	CU_ASSERT_EQUAL(v.type, PT_JSON_OBJECT);
	CU_ASSERT_EQUAL(v.len, 8);
	a = pt_json_get(&v, "a");
	CU_ASSERT_FATAL(a != NULL && a->type == PT_JSON_ARRAY && a->len == 6);
	CU_ASSERT(pt_json_int(pt_json_at(a, 0), &i) && i == 1);
	CU_ASSERT(!pt_json_int(pt_json_at(a, 1), &i));
	CU_ASSERT_EQUAL(pt_json_at(a, 1)->d, -2.5);
	CU_ASSERT(pt_json_int(pt_json_at(a, 2), &i) && i == 1000);
	CU_ASSERT(pt_json_int(pt_json_at(a, 3), &i) && i == INT64_MAX);
	CU_ASSERT(pt_json_int(pt_json_at(a, 4), &i) && i == INT64_MIN);
	CU_ASSERT(!pt_json_at(a, 5)->is_int); /* 2^64 does not fit */
	CU_ASSERT_EQUAL(pt_json_at(a, 5)->d, 18446744073709551616.0);
	CU_ASSERT_PTR_NULL(pt_json_at(a, 6));
	s = pt_json_get(&v, "s");
	CU_ASSERT_FATAL(s != NULL && s->type == PT_JSON_STRING);
	CU_ASSERT_EQUAL(s->len, 17);
	CU_ASSERT(memcmp(s->str, "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\0z", 17) == 0);
	CU_ASSERT(pt_json_get(&v, "t")->boolean);
	CU_ASSERT_EQUAL(pt_json_get(&v, "f")->type, PT_JSON_BOOL);
	CU_ASSERT(!pt_json_get(&v, "f")->boolean);
	CU_ASSERT_EQUAL(pt_json_get(&v, "n")->type, PT_JSON_NULL);
	CU_ASSERT_STRING_EQUAL(pt_json_string(pt_json_get(pt_json_get(&v, "o"), "k")), "v");
	CU_ASSERT_EQUAL(pt_json_get(&v, "e")->len, 0);
	CU_ASSERT_STRING_EQUAL(pt_json_string(pt_json_get(&v, "u")), "\xc3\xa9");
	CU_ASSERT_PTR_NULL(pt_json_get(&v, "missing"));
	CU_ASSERT_PTR_NULL(pt_json_get(a, "a"));
	pt_json_fini(&v);
	pt_json_fini(&v); /* a second fini is harmless */

	PT_CHECK_OK(pt_json_parse(&v, " -0.0 ", 6, NULL));
	CU_ASSERT(v.type == PT_JSON_NUMBER && v.is_int && v.i == 0);
	pt_json_fini(&v);
	PT_CHECK_OK(pt_json_parse(&v, "\"x\"", 3, NULL));
	CU_ASSERT_STRING_EQUAL(v.str, "x");
	pt_json_fini(&v);
}

static void test_data_json_errors(void)
{
	static const struct {
		const char *text;
		const char *words;
	} bad[] = {
	    {"", "empty input"},
	    {"   \n ", "empty input"},
	    {"[1,]", "trailing comma"},
	    {"{\"a\":1,}", "trailing comma"},
	    {"01", "leading zero"},
	    {"[1 2]", "expected ',' or ']'"},
	    {"{'a':1}", "expected a string key"},
	    {"{\"a\" 1}", "expected ':'"},
	    {"tru", "invalid literal"},
	    {"\"abc", "unterminated string"},
	    {"\"\\ud800\"", "without a low one"},
	    {"\"\\ud800\\u0041\"", "followed by"},
	    {"\"\\udc00\"", "lone low surrogate"},
	    {"\"\\u12g4\"", "bad hex digit"},
	    {"\"a\x01\"", "control character"},
	    {"\"\xff\"", "invalid UTF-8"},
	    {"\"\xc0\xaf\"", "invalid UTF-8"},     /* overlong '/' */
	    {"\"\xed\xa0\x80\"", "invalid UTF-8"}, /* encoded surrogate */
	    {"NaN", "unexpected character"},
	    {"{\"a\":1,\"b\":2,\"a\":3}", "duplicate key \"a\""},
	    {"1 2", "trailing characters"},
	    {"[", "unexpected end of input"},
	    {"[1", "unterminated array"},
	    {"{\"a\":1", "unterminated object"},
	    {"-", "expected a digit"},
	    {"1.", "after '.'"},
	    {"1e+", "exponent"},
	    {"\"\\x\"", "invalid escape"},
	    {"1e400", "out of the range"},
	    {"[1]\n\n  x", "line 3, column 3"},
	};
	pt_json v;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		PT_CHECK_ERR_MSG(pt_json_parse(&v, bad[i].text, strlen(bad[i].text), NULL),
		                 PT_ERR_FORMAT, bad[i].words);
		CU_ASSERT_EQUAL(v.type, PT_JSON_NULL);
		pt_json_fini(&v);
	}
	/* Position of an error inside a line. */
	PT_CHECK_ERR_MSG(pt_json_parse(&v, "{\n  \"k\": tx}", 12, NULL), PT_ERR_FORMAT,
	                 "line 2, column 8");
}

static void test_data_json_limits(void)
{
	char deep[200];
	pt_json v;
	pt_json_limits lim = {.max_bytes = 8};

	for (int d = 64; d <= 65; d++) {
		memset(deep, '[', (size_t)d);
		memset(deep + d, ']', (size_t)d);
		if (d == 64) {
			PT_CHECK_OK(pt_json_parse(&v, deep, 2 * (size_t)d, NULL));
			pt_json_fini(&v);
		} else {
			PT_CHECK_ERR_MSG(pt_json_parse(&v, deep, 2 * (size_t)d, NULL), PT_ERR_RANGE,
			                 "deeper than 64");
		}
	}
	PT_CHECK_ERR_MSG(pt_json_parse(&v, "[1,2,3,4,5]", 11, &lim), PT_ERR_RANGE, "limit");
	lim = (pt_json_limits){.max_values = 3};
	PT_CHECK_OK(pt_json_parse(&v, "[1,2]", 5, &lim));
	pt_json_fini(&v);
	PT_CHECK_ERR_MSG(pt_json_parse(&v, "[1,2,3]", 7, &lim), PT_ERR_RANGE, "values");
}

static void test_data_json_writer(void)
{
	const char raw[] = "a\"b\\c\n\x01\xc3\xa9";
	pt_buf b;
	pt_json v, w;
	const char *doc = "{\"k\":[1,-2.5,true,null,\"x\"],\"big\":9007199254740993}";

	pt_buf_init(&b);
	PT_CHECK_OK(pt_json_write_string(&b, raw, sizeof(raw) - 1));
	CU_ASSERT_STRING_EQUAL(b.data, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"");
	PT_CHECK_OK(pt_json_parse(&v, b.data, b.len, NULL));
	CU_ASSERT(v.len == sizeof(raw) - 1 && memcmp(v.str, raw, v.len) == 0);
	pt_json_fini(&v);

	b.len = 0;
	PT_CHECK_OK(pt_json_parse(&v, doc, strlen(doc), NULL));
	PT_CHECK_OK(pt_json_write(&b, &v));
	CU_ASSERT_STRING_EQUAL(b.data, doc);
	PT_CHECK_OK(pt_json_parse(&w, b.data, b.len, NULL));
	CU_ASSERT_EQUAL(pt_json_get(&w, "big")->i, 9007199254740993LL);
	pt_json_fini(&w);
	pt_json_fini(&v);
	PT_CHECK_OK(pt_buf_printf(&b, "%d-%s", 7, "x"));
	CU_ASSERT_STRING_EQUAL(b.data + b.len - 3, "7-x");
	pt_buf_fini(&b);
}

/* A number that is not an exact integer but whose double is integral above
 * 2^53 (found by tests/fuzz/fuzz_json) must be written so that it reads back
 * as a non-integer too, not as the exact integer its %.17g looks like. */
static void test_data_json_writer_large_fraction(void)
{
	const char *doc = "[55555555555555555.555,-12345678901234567.5,1e17]";
	pt_buf b;
	pt_json v, w;

	pt_buf_init(&b);
	PT_CHECK_OK(pt_json_parse(&v, doc, strlen(doc), NULL));
	CU_ASSERT(!pt_json_at(&v, 0)->is_int);
	PT_CHECK_OK(pt_json_write(&b, &v));
	CU_ASSERT_STRING_EQUAL(b.data, "[55555555555555552.0,-12345678901234568.0,1e+17]");
	PT_CHECK_OK(pt_json_parse(&w, b.data, b.len, NULL));
	for (size_t i = 0; i < 3; i++) {
		CU_ASSERT(!pt_json_at(&w, i)->is_int);
		CU_ASSERT_EQUAL(pt_json_at(&w, i)->d, pt_json_at(&v, i)->d);
	}
	pt_json_fini(&w);
	pt_json_fini(&v);
	pt_buf_fini(&b);
}

/* ---- npy ---- */

static void fill_pattern(pt_tensor *t)
{
	unsigned char *p = pt_tensor_data(t);
	for (size_t i = 0; i < pt_tensor_nbytes(t); i++)
		p[i] = (unsigned char)(i * 37 + 11);
}

static void test_data_npy_roundtrip(void)
{
	static const pt_dtype dts[] = {PT_F32, PT_F64, PT_F16, PT_I32,
	                               PT_I64, PT_U8,  PT_U16, PT_U32};
	static const int64_t shape3[] = {2, 3, 4};
	const char *path = tmp_path("rt.npy");

	for (size_t k = 0; k < sizeof(dts) / sizeof(dts[0]); k++) {
		for (int nd = 0; nd <= 3; nd++) {
			pt_tensor t, r;
			bool eq = false;
			PT_CHECK_OK(pt_tensor_init(&t, dts[k], nd, shape3 + (3 - nd)));
			fill_pattern(&t);
			PT_CHECK_OK(pt_npy_write(path, &t));
			PT_CHECK_OK(pt_npy_read(&r, path));
			PT_CHECK_OK(pt_tensor_equal(&t, &r, &eq));
			CU_ASSERT(eq);
			pt_tensor_fini(&t);
			pt_tensor_fini(&r);
		}
	}
	/* A transposed (non-contiguous) tensor is written in logical order. */
	{
		pt_tensor t, tt, r;
		int64_t shape[2] = {2, 3};
		double item;
		PT_CHECK_OK(pt_tensor_init(&t, PT_F32, 2, shape));
		for (int i = 0; i < 6; i++)
			pt_tensor_f32(&t)[i] = (float)i;
		PT_CHECK_OK(pt_tensor_transpose(&tt, &t, 0, 1));
		PT_CHECK_OK(pt_npy_write(path, &tt));
		PT_CHECK_OK(pt_npy_read(&r, path));
		CU_ASSERT(r.ndim == 2 && r.shape[0] == 3 && r.shape[1] == 2);
		PT_CHECK_OK(pt_tensor_item(&r, 1, &item));
		CU_ASSERT_EQUAL(item, 3.0);
		pt_tensor_fini(&t);
		pt_tensor_fini(&tt);
		pt_tensor_fini(&r);
	}
	{
		pt_tensor t;
		int64_t one = 1;
		PT_CHECK_OK(pt_tensor_init(&t, PT_BF16, 1, &one));
		PT_CHECK_ERR_MSG(pt_npy_write(path, &t), PT_ERR_DTYPE, "bf16");
		pt_tensor_fini(&t);
	}
}

/* make_npy builds a file: magic, version, header length (as given or, when
 * hlen_override < 0, the true one), the dict padded to 64 with '\n', payload. */
static size_t make_npy(unsigned char *out, int major, const char *dict, long hlen_override,
                       size_t payload)
{
	size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
	size_t total_header = (pre + dl + 1 + 63) / 64 * 64, hlen = total_header - pre;
	size_t h = hlen_override >= 0 ? (size_t)hlen_override : hlen;

	memcpy(out, "\x93NUMPY", 6);
	out[6] = (unsigned char)major;
	out[7] = 0;
	for (size_t i = 0; i < pre - 8; i++)
		out[8 + i] = (unsigned char)(h >> (8 * i));
	memset(out + pre, ' ', hlen);
	memcpy(out + pre, dict, dl);
	out[total_header - 1] = '\n';
	for (size_t i = 0; i < payload; i++)
		out[total_header + i] = (unsigned char)i;
	return total_header + payload;
}

static void test_data_npy_versions(void)
{
	unsigned char buf[512];
	const char *path = tmp_path("v.npy");
	pt_tensor t;
	double item;

	for (int major = 1; major <= 3; major++) {
		size_t n = make_npy(
		    buf, major, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", -1, 8);
		memcpy(buf + n - 8, "\x05\0\0\0\xfa\xff\xff\xff", 8);
		pt_test_write_file(path, buf, n);
		PT_CHECK_OK(pt_npy_read(&t, path));
		CU_ASSERT(t.dtype == PT_I32 && t.ndim == 1 && t.shape[0] == 2);
		PT_CHECK_OK(pt_tensor_item(&t, 1, &item));
		CU_ASSERT_EQUAL(item, -6.0);
		pt_tensor_fini(&t);
	}
	/* Double quotes, no trailing comma, different key order, 0-d shape. */
	pt_test_write_file(
	    path, buf,
	    make_npy(buf, 1, "{\"shape\": (), \"fortran_order\": False, \"descr\": '|u1'}", -1, 1));
	PT_CHECK_OK(pt_npy_read(&t, path));
	CU_ASSERT(t.dtype == PT_U8 && t.ndim == 0);
	pt_tensor_fini(&t);
}

static void test_data_npy_malformed(void)
{
	static const struct {
		int major;
		const char *dict;
		long hlen; /* -1: true length */
		size_t payload;
		const char *words;
	} bad[] = {
	    {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", -1, 16, "Fortran"},
	    {1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", -1, 8, "big-endian"},
	    {1, "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", -1, 16, "object"},
	    {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", -1, 16,
	     "unsupported npy dtype '<c8'"},
	    {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", -1, 8,
	     "structured"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", -1, 20,
	     "holds 20 bytes"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", -1, 28,
	     "(2, 3) of '<f4' (24 bytes)"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 5000, 8,
	     "past the end"},
	    {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 0x7fffffff, 8,
	     "past the end"},
	    {1, "{'descr': '<f4', 'shape': (2,), }", -1, 8, "missing 'fortran_order'"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", -1, 8,
	     "unexpected or repeated key 'x'"},
	    {1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", -1, 8,
	     "repeated key 'descr'"},
	    {1, "{'descr': '<f4', 'fortran_order': false, 'shape': (2,), }", -1, 8,
	     "not True or False"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", -1, 8, "not a tuple"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", -1, 8,
	     "bad shape entry"},
	    {1, "['descr', '<f4']", -1, 8, "expected '{'"},
	    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", -1, 8,
	     "text after the dict"},
	    {4, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", -1, 8, "version 4.0"},
	    /* No values, but strides of 2^124: once a signed overflow. */
	    {1,
	     "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904, "
	     "4611686018427387904), }",
	     -1, 0, "npy shape overflows"},
	};
	unsigned char buf[512];
	const char *path = tmp_path("bad.npy");
	pt_tensor t;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t n = make_npy(buf, bad[i].major, bad[i].dict, bad[i].hlen, bad[i].payload);
		pt_test_write_file(path, buf, n);
		PT_CHECK_ERR_MSG(pt_npy_read(&t, path), PT_ERR_FORMAT, bad[i].words);
		CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), path)); /* names the file */
		CU_ASSERT_PTR_NULL(t.storage);
	}
	memcpy(buf, "\x93NUMPX\x01\x00\x10\x00", 10);
	pt_test_write_file(path, buf, 64);
	PT_CHECK_ERR_MSG(pt_npy_read(&t, path), PT_ERR_FORMAT, "bad magic");
	pt_test_write_file(path, "\x93NUMPY\x01", 7);
	PT_CHECK_ERR_MSG(pt_npy_read(&t, path), PT_ERR_FORMAT, "truncated");
	PT_CHECK_ERR_MSG(pt_npy_read(&t, tmp_path("absent.npy")), PT_ERR_IO, "absent.npy");
}

/* ---- shipped data ---- */

static void test_data_digits_files(void)
{
	pt_tensor x, y;
	double xs = 0;
	int64_t ys = 0, counts[10] = {0};

	PT_CHECK_OK(pt_npy_read(&x, pt_test_path("examples/data/digits_x.npy")));
	PT_CHECK_OK(pt_npy_read(&y, pt_test_path("examples/data/digits_y.npy")));
	CU_ASSERT(x.dtype == PT_F32 && x.ndim == 2 && x.shape[0] == 1797 && x.shape[1] == 64);
	CU_ASSERT(y.dtype == PT_I64 && y.ndim == 1 && y.shape[0] == 1797);
	for (int64_t i = 0; i < 1797 * 64; i++) {
		float v = pt_tensor_f32(&x)[i];
		CU_ASSERT_FATAL(v >= 0 && v <= 1 && v * 16 == floorf(v * 16));
		xs += v;
	}
	for (int64_t i = 0; i < 1797; i++) {
		int64_t l = ((int64_t *)pt_tensor_data(&y))[i];
		CU_ASSERT_FATAL(l >= 0 && l <= 9);
		ys += l;
		counts[l]++;
	}
	CU_ASSERT_EQUAL(ys, 8070);
	CU_ASSERT_EQUAL(xs * 16, 561718.0); /* total pixel count */
	CU_ASSERT_EQUAL(counts[0], 178);
	/* First image, first row: 0 0 5 13 9 1 0 0; label 0. */
	CU_ASSERT_EQUAL(pt_tensor_f32(&x)[2] * 16, 5.0f);
	CU_ASSERT_EQUAL(pt_tensor_f32(&x)[3] * 16, 13.0f);
	CU_ASSERT_EQUAL(((int64_t *)pt_tensor_data(&y))[1], 1);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

static void test_data_text_tokens(void)
{
	pt_tokens tk;
	FILE *f = fopen(pt_test_path("examples/data/text.txt"), "rb");
	long n;
	unsigned char *text;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	text = malloc((size_t)n);
	CU_ASSERT_FATAL(text != NULL && fread(text, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	CU_ASSERT(n >= 100000 && n <= 300000);
	PT_CHECK_OK(pt_tokens_load(&tk, pt_test_path("examples/data/text.u16"), PT_U16, 256));
	CU_ASSERT_EQUAL(tk.count, n);
	for (long i = 0; i < n; i++)
		if (pt_tokens_at(&tk, i) != text[i]) {
			CU_FAIL("text.u16 differs from text.txt");
			break;
		}
	CU_ASSERT(tk.max_token < 128);
	pt_tokens_fini(&tk);
	free(text);
}

/* ---- token files ---- */

static void test_data_tokens(void)
{
	const char *text = "the quick brown fox jumps over the lazy dog";
	size_t n = strlen(text);
	int64_t shape[2] = {4, 6}, other[2] = {4, 5};
	pt_tensor in, tg, in2, tg2, bad;
	pt_tokens tk;
	bool eq;

	PT_CHECK_OK(pt_tokens_write_bytes(tmp_path("t.u16"), text, n, PT_U16));
	PT_CHECK_OK(pt_tokens_write_bytes(tmp_path("t.u32"), text, n, PT_U32));
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("t.u32"), PT_U32, 256));
	CU_ASSERT_EQUAL(tk.count, (int64_t)n);
	CU_ASSERT_EQUAL(tk.max_token, 'z');
	pt_tokens_fini(&tk);
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("t.u16"), PT_U16, 0));
	CU_ASSERT_EQUAL(tk.count, (int64_t)n);
	CU_ASSERT_EQUAL(pt_tokens_at(&tk, 4), 'q');

	PT_CHECK_OK(pt_tensor_init(&in, PT_I64, 2, shape));
	PT_CHECK_OK(pt_tensor_init(&tg, PT_I64, 2, shape));
	PT_CHECK_OK(pt_tensor_init(&in2, PT_I64, 2, shape));
	PT_CHECK_OK(pt_tensor_init(&tg2, PT_I64, 2, shape));
	PT_CHECK_OK(pt_tokens_sample(&tk, 7, 3, &in, &tg));
	for (int b = 0; b < 4; b++) {
		const int64_t *x = (int64_t *)pt_tensor_data(&in) + b * 6;
		const int64_t *y = (int64_t *)pt_tensor_data(&tg) + b * 6;
		char win[8] = {0};
		for (int t = 0; t < 6; t++)
			win[t] = (char)x[t];
		win[6] = (char)y[5];
		/* The window is 7 consecutive tokens of the text; target = input shifted. */
		CU_ASSERT_PTR_NOT_NULL(strstr(text, win));
		for (int t = 0; t < 5; t++)
			CU_ASSERT_EQUAL(y[t], x[t + 1]);
	}
	PT_CHECK_OK(pt_tokens_sample(&tk, 7, 3, &in2, &tg2));
	PT_CHECK_OK(pt_tensor_equal(&in, &in2, &eq));
	CU_ASSERT(eq); /* same (seed, step): same batch */
	PT_CHECK_OK(pt_tokens_sample(&tk, 7, 4, &in2, &tg2));
	PT_CHECK_OK(pt_tensor_equal(&in, &in2, &eq));
	CU_ASSERT(!eq);

	PT_CHECK_OK(pt_tensor_init(&bad, PT_I64, 2, other));
	PT_CHECK_ERR_MSG(pt_tokens_sample(&tk, 7, 3, &in, &bad), PT_ERR_SHAPE, "target");
	pt_tensor_fini(&bad);
	PT_CHECK_OK(pt_tensor_init(&bad, PT_I32, 2, shape));
	PT_CHECK_ERR_MSG(pt_tokens_sample(&tk, 7, 3, &bad, &tg), PT_ERR_SHAPE, "i64");
	pt_tensor_fini(&bad);
	{
		int64_t long_shape[2] = {1, (int64_t)n};
		pt_tensor_fini(&in2);
		PT_CHECK_OK(pt_tensor_init(&bad, PT_I64, 2, long_shape));
		PT_CHECK_OK(pt_tensor_init(&in2, PT_I64, 2, long_shape));
		PT_CHECK_ERR_MSG(pt_tokens_sample(&tk, 7, 3, &bad, &in2), PT_ERR_RANGE,
		                 "+ 1 tokens");
		pt_tensor_fini(&bad);
	}
	pt_tokens_fini(&tk);
	pt_tensor_fini(&in);
	pt_tensor_fini(&tg);
	pt_tensor_fini(&in2);
	pt_tensor_fini(&tg2);

	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("t.u16"), PT_U16, 100), PT_ERR_FORMAT,
	                 "token 116 at position 0 is not below the vocabulary size 100");
	CU_ASSERT_PTR_NULL(tk.data);
	pt_test_write_file(tmp_path("odd.u16"), "abc", 3);
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("odd.u16"), PT_U16, 0), PT_ERR_FORMAT,
	                 "not a whole number");
	pt_test_write_file(tmp_path("odd.u32"), "abcdef", 6);
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("odd.u32"), PT_U32, 0), PT_ERR_FORMAT,
	                 "4-byte");
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("t.u16"), PT_I32, 0), PT_ERR_DTYPE,
	                 "u16 or u32");
}

/* write_llmc writes an llm.c token file: header (magic, version, count
 * as given) then n tokens 1000 + i of the version's width. */
static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count, int64_t n,
                       int width)
{
	int32_t head[PT_TOKENS_HEADER_INTS] = {magic, version, count};
	size_t size = PT_TOKENS_HEADER_BYTES + (size_t)n * (size_t)width;
	unsigned char *buf = malloc(size);
	CU_ASSERT_FATAL(buf != NULL);
	memcpy(buf, head, sizeof(head));
	for (int64_t i = 0; i < n; i++) {
		uint32_t v = (uint32_t)(1000 + i);
		if (width == 2) {
			uint16_t h = (uint16_t)v;
			memcpy(buf + PT_TOKENS_HEADER_BYTES + 2 * i, &h, 2);
		} else {
			memcpy(buf + PT_TOKENS_HEADER_BYTES + 4 * i, &v, 4);
		}
	}
	pt_test_write_file(path, buf, size);
	free(buf);
}

/* llm.c files are read by their header: the tokens after it, of its width.
 * Regression: a Tokens16 load took the 1024-byte header for 512 tokens
 * (20240520 = tokens 55240, 308, ...) when the vocabulary let them pass. */
static void test_data_tokens_llmc_header(void)
{
	pt_tokens tk;
	pt_tokens_info info;
	int fd;

	write_llmc(tmp_path("v1.bin"), PT_TOKENS_MAGIC, 1, 100, 100, 2);
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("v1.bin"), PT_U16, 65536));
	CU_ASSERT_EQUAL(tk.count, 100);
	CU_ASSERT_EQUAL(tk.version, 1);
	CU_ASSERT_EQUAL(tk.dtype, PT_U16);
	CU_ASSERT_EQUAL(pt_tokens_at(&tk, 0), 1000);
	CU_ASSERT_EQUAL(pt_tokens_at(&tk, 99), 1099);
	CU_ASSERT_EQUAL(tk.max_token, 1099);
	pt_tokens_fini(&tk);
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("v1.bin"), PT_TOKENS_AUTO, 0));
	CU_ASSERT(tk.count == 100 && tk.dtype == PT_U16 && pt_tokens_at(&tk, 5) == 1005);
	pt_tokens_fini(&tk);
	write_llmc(tmp_path("v2.bin"), PT_TOKENS_MAGIC, 2, 70, 70, 4);
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("v2.bin"), PT_TOKENS_AUTO, 0));
	CU_ASSERT(tk.count == 70 && tk.dtype == PT_U32 && tk.version == 2 &&
	          pt_tokens_at(&tk, 69) == 1069);
	pt_tokens_fini(&tk);
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("v2.bin"), PT_U32, 0));
	CU_ASSERT_EQUAL(tk.count, 70);
	pt_tokens_fini(&tk);
	/* The header's info without reading the tokens. */
	fd = open(tmp_path("v2.bin"), O_RDONLY);
	CU_ASSERT_FATAL(fd >= 0);
	PT_CHECK_OK(pt_tokens_info_fd(fd, "v2.bin", PT_TOKENS_AUTO, &info));
	CU_ASSERT(info.count == 70 && info.dtype == PT_U32 && info.version == 2);
	close(fd);

	/* Raw files (nanoGPT's .bin) as before; Auto reads them as uint16. */
	PT_CHECK_OK(pt_tokens_write_bytes(tmp_path("raw.u16"), "hello", 5, PT_U16));
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("raw.u16"), PT_TOKENS_AUTO, 256));
	CU_ASSERT(tk.count == 5 && tk.dtype == PT_U16 && tk.version == 0 &&
	          pt_tokens_at(&tk, 1) == 'e');
	pt_tokens_fini(&tk);

	/* Strict: the width asked for, the version, the count against the size. */
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("v2.bin"), PT_U16, 0), PT_ERR_FORMAT,
	                 "v2.bin: llm.c header version 2 holds u32 tokens, not u16");
	write_llmc(tmp_path("v3.bin"), PT_TOKENS_MAGIC, 3, 10, 10, 2);
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("v3.bin"), PT_TOKENS_AUTO, 0), PT_ERR_FORMAT,
	                 "v3.bin: llm.c header version 3 (expected 1: uint16 tokens, or 2: uint32 "
	                 "tokens)");
	write_llmc(tmp_path("long.bin"), PT_TOKENS_MAGIC, 1, 10, 11, 2);
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("long.bin"), PT_U16, 0), PT_ERR_FORMAT,
	                 "long.bin: llm.c header says 10 tokens (20 bytes) but 22 bytes follow "
	                 "the header");
	write_llmc(tmp_path("short.bin"), PT_TOKENS_MAGIC, 2, 10, 9, 4);
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("short.bin"), PT_U32, 0), PT_ERR_FORMAT,
	                 "short.bin: llm.c header says 10 tokens (40 bytes) but 36 bytes follow "
	                 "the header");
	write_llmc(tmp_path("neg.bin"), PT_TOKENS_MAGIC, 1, -1, 0, 2);
	PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("neg.bin"), PT_U16, 0), PT_ERR_FORMAT,
	                 "neg.bin: llm.c header says -1 tokens");
	{
		int32_t cut[3] = {PT_TOKENS_MAGIC, 1, 0};
		pt_test_write_file(tmp_path("cut.bin"), cut, sizeof(cut));
		PT_CHECK_ERR_MSG(pt_tokens_load(&tk, tmp_path("cut.bin"), PT_U16, 0), PT_ERR_FORMAT,
		                 "cut.bin: starts with llm.c's magic 20240520 but is 12 bytes, "
		                 "shorter than its 1024-byte header");
	}
	CU_ASSERT_PTR_NULL(tk.data);
}

/* Held-out tokens: training windows of [0, split) never reach the split;
 * the fixed evaluation windows tile [split, count) from the split on. */
static void test_data_tokens_held_out_windows(void)
{
	enum { N = 1000, T = 8, B = 16 };
	uint32_t pos[N];
	int64_t split = pt_tokens_split(N, (double)0.2f), n, lo_seen = N, hi_seen = -1;
	pt_tensor in, tg;
	pt_tokens tk;

	for (int i = 0; i < N; i++)
		pos[i] = (uint32_t)i; /* token i is its position */
	pt_test_write_file(tmp_path("pos.u32"), pos, sizeof(pos));
	PT_CHECK_OK(pt_tokens_load(&tk, tmp_path("pos.u32"), PT_U32, 0));
	CU_ASSERT_EQUAL(split, 800);
	n = pt_tokens_n_windows(split, N, T);
	CU_ASSERT_EQUAL(n, 24); /* (200 - 1) / 8 */
	CU_ASSERT_EQUAL(pt_tokens_n_windows(0, 8, T), 0);
	CU_ASSERT_EQUAL(pt_tokens_n_windows(0, 9, T), 1);
	PT_CHECK_OK(pt_tensor_init(&in, PT_I64, 2, (int64_t[]){B, T}));
	PT_CHECK_OK(pt_tensor_init(&tg, PT_I64, 2, (int64_t[]){B, T}));
	for (uint64_t step = 0; step < 2000; step++) {
		const int64_t *x, *y;
		PT_CHECK_OK(pt_tokens_sample_range(&tk, 0, split, 5, step, &in, &tg));
		x = pt_tensor_data(&in);
		y = pt_tensor_data(&tg);
		for (int i = 0; i < B * T; i++) {
			lo_seen = x[i] < lo_seen ? x[i] : lo_seen;
			hi_seen = y[i] > hi_seen ? y[i] : hi_seen;
		}
	}
	/* Every training token is before the split, and the range is used up. */
	CU_ASSERT_EQUAL(lo_seen, 0);
	CU_ASSERT_EQUAL(hi_seen, split - 1);
	/* The whole file (pt_tokens_sample) is the range [0, count). */
	{
		pt_tensor in2, tg2;
		bool eq;
		PT_CHECK_OK(pt_tensor_init(&in2, PT_I64, 2, (int64_t[]){B, T}));
		PT_CHECK_OK(pt_tensor_init(&tg2, PT_I64, 2, (int64_t[]){B, T}));
		PT_CHECK_OK(pt_tokens_sample(&tk, 5, 3, &in, &tg));
		PT_CHECK_OK(pt_tokens_sample_range(&tk, 0, N, 5, 3, &in2, &tg2));
		PT_CHECK_OK(pt_tensor_equal(&in, &in2, &eq));
		CU_ASSERT(eq);
		pt_tensor_fini(&in2);
		pt_tensor_fini(&tg2);
	}
	/* Windows 16..23 (8 of them), then 8 padding rows. */
	PT_CHECK_OK(pt_tokens_windows(&tk, split, 16, n - 16, -7, &in, &tg));
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			int64_t x = ((int64_t *)pt_tensor_data(&in))[b * T + t];
			int64_t y = ((int64_t *)pt_tensor_data(&tg))[b * T + t];
			CU_ASSERT_EQUAL(x, b < 8 ? split + (16 + b) * T + t : 0);
			CU_ASSERT_EQUAL(y, b < 8 ? split + (16 + b) * T + t + 1 : -7);
		}
	/* The last window ends at token 992; one more is past the file. */
	PT_CHECK_ERR_MSG(pt_tokens_windows(&tk, split, 16, 9, -1, &in, &tg), PT_ERR_RANGE,
	                 "windows 16..24 of 8 + 1 tokens from token 800 of a file of 1000");
	PT_CHECK_ERR_MSG(pt_tokens_sample_range(&tk, 0, T, 5, 0, &in, &tg), PT_ERR_RANGE,
	                 "tokens [0, 8)");
	pt_tensor_fini(&in);
	pt_tensor_fini(&tg);
	pt_tokens_fini(&tk);
}

/* ---- shuffles, splits, batches ---- */

static bool is_permutation(const int64_t *p, int64_t n)
{
	bool seen[64] = {false};
	for (int64_t i = 0; i < n; i++) {
		if (p[i] < 0 || p[i] >= n || seen[p[i]])
			return false;
		seen[p[i]] = true;
	}
	return true;
}

static void test_data_shuffle_orders(void)
{
	/* Fixed by the algorithm (Fisher-Yates over Philox, see batch.h) and checked
	 * against an independent Python implementation of both; a change here
	 * changes every shuffled run, so it must be deliberate. */
	static const int64_t e0[10] = {2, 8, 7, 0, 1, 6, 4, 5, 3, 9};
	static const int64_t e1[10] = {5, 6, 4, 3, 2, 8, 0, 1, 7, 9};
	static const int64_t s7[10] = {1, 4, 6, 9, 8, 2, 5, 0, 3, 7};
	int64_t p[10], q[10];

	pt_shuffle_indices(p, 10, 42, 0);
	CU_ASSERT(memcmp(p, e0, sizeof(p)) == 0);
	pt_shuffle_indices(p, 10, 42, 1);
	CU_ASSERT(memcmp(p, e1, sizeof(p)) == 0);
	pt_shuffle_indices(p, 10, 7, 0);
	CU_ASSERT(memcmp(p, s7, sizeof(p)) == 0);
	for (uint64_t e = 0; e < 20; e++) {
		pt_shuffle_indices(p, 10, 42, e);
		pt_shuffle_indices(q, 10, 42, e);
		CU_ASSERT(is_permutation(p, 10));
		CU_ASSERT(memcmp(p, q, sizeof(p)) == 0);
	}
	pt_shuffle_indices(p, 1, 42, 0);
	CU_ASSERT_EQUAL(p[0], 0);
	pt_shuffle_indices(p, 0, 42, 0);
}

/* make_dataset: N rows, x[i] = (i, -i) f32, y[i] = i (i64). */
static void make_dataset(pt_dataset *ds, int64_t n)
{
	int64_t xs[2] = {n, 2};
	pt_tensor x, y;

	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, xs));
	PT_CHECK_OK(pt_tensor_init(&y, PT_I64, 1, &n));
	for (int64_t i = 0; i < n; i++) {
		pt_tensor_f32(&x)[2 * i] = (float)i;
		pt_tensor_f32(&x)[2 * i + 1] = (float)-i;
		((int64_t *)pt_tensor_data(&y))[i] = i;
	}
	PT_CHECK_OK(pt_dataset_init(ds, &x, &y, false));
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

static void test_data_batch_iter(void)
{
	pt_dataset ds;
	pt_batch_iter it;
	pt_tensor bx, by, wrong;
	int64_t xs[2] = {4, 2}, ys = 4, rows, order[10], seen = 0;
	int64_t expect_rows[] = {4, 4, 2, 0};

	make_dataset(&ds, 10);
	PT_CHECK_OK(pt_tensor_init(&bx, PT_F32, 2, xs));
	PT_CHECK_OK(pt_tensor_init(&by, PT_I64, 1, &ys));

	PT_CHECK_OK(pt_batch_iter_init(&it, &ds, 4, false, false, 0));
	CU_ASSERT_EQUAL(pt_batch_iter_batches(&it), 3);
	for (int k = 0; k < 4; k++) {
		PT_CHECK_OK(pt_batch_iter_next(&it, &bx, &by, &rows));
		CU_ASSERT_EQUAL(rows, expect_rows[k]);
		for (int64_t r = 0; r < rows; r++) {
			int64_t want = 4 * k + r;
			CU_ASSERT_EQUAL(((int64_t *)pt_tensor_data(&by))[r], want);
			CU_ASSERT_EQUAL(pt_tensor_f32(&bx)[2 * r + 1], (float)-want);
		}
	}
	pt_batch_iter_fini(&it);

	PT_CHECK_OK(pt_batch_iter_init(&it, &ds, 4, true, true, 99));
	CU_ASSERT_EQUAL(pt_batch_iter_batches(&it), 2);
	for (uint64_t e = 0; e < 3; e++) {
		pt_batch_iter_set_epoch(&it, e);
		pt_shuffle_indices(order, 10, 99, e);
		for (int k = 0; k < 3; k++) {
			PT_CHECK_OK(pt_batch_iter_next(&it, &bx, &by, &rows));
			CU_ASSERT_EQUAL(rows, k < 2 ? 4 : 0); /* drop_last drops 2 rows */
			for (int64_t r = 0; r < rows; r++) {
				int64_t got = ((int64_t *)pt_tensor_data(&by))[r];
				CU_ASSERT_EQUAL(got, order[4 * k + r]);
				CU_ASSERT_EQUAL(pt_tensor_f32(&bx)[2 * r], (float)got);
				seen |= (int64_t)1 << got;
			}
		}
	}
	CU_ASSERT_EQUAL(seen, 0x3ff);
	/* Replaying an epoch gives the same batches. */
	pt_batch_iter_set_epoch(&it, 1);
	pt_shuffle_indices(order, 10, 99, 1);
	PT_CHECK_OK(pt_batch_iter_next(&it, &bx, &by, &rows));
	CU_ASSERT(memcmp(pt_tensor_data(&by), order, 4 * sizeof(int64_t)) == 0);

	PT_CHECK_OK(pt_tensor_init(&wrong, PT_F32, 1, &ys));
	PT_CHECK_ERR_MSG(pt_batch_iter_next(&it, &bx, &wrong, &rows), PT_ERR_SHAPE, "batch y");
	pt_tensor_fini(&wrong);
	pt_batch_iter_fini(&it);
	PT_CHECK_ERR_MSG(pt_batch_iter_init(&it, &ds, 0, false, false, 0), PT_ERR_INVALID,
	                 "batch size 0");
	pt_batch_iter_fini(&it);
	pt_tensor_fini(&bx);
	pt_tensor_fini(&by);
	pt_dataset_fini(&ds);
}

static void test_data_split(void)
{
	pt_dataset ds, tr, ho, tr2, ho2;
	int64_t perm[10], all = 0;
	bool eq;

	make_dataset(&ds, 10);
	PT_CHECK_OK(pt_dataset_split(&tr, &ho, &ds, 0.35, 5));
	CU_ASSERT_EQUAL(tr.n, 7);
	CU_ASSERT_EQUAL(ho.n, 3);
	CU_ASSERT(tr.x.shape[0] == 7 && tr.x.shape[1] == 2 && tr.y.shape[0] == 7);
	pt_shuffle_indices(perm, 10, 5, PT_SPLIT_STREAM);
	for (int i = 0; i < 10; i++) {
		const pt_dataset *d = i < 7 ? &tr : &ho;
		int r = i < 7 ? i : i - 7;
		int64_t label = ((int64_t *)pt_tensor_data(&d->y))[r];
		CU_ASSERT_EQUAL(label, perm[i]);
		CU_ASSERT_EQUAL(pt_tensor_f32(&d->x)[2 * r], (float)label);
		all |= (int64_t)1 << label;
	}
	CU_ASSERT_EQUAL(all, 0x3ff);
	PT_CHECK_OK(pt_dataset_split(&tr2, &ho2, &ds, 0.35, 5));
	PT_CHECK_OK(pt_tensor_equal(&ho.x, &ho2.x, &eq));
	CU_ASSERT(eq);
	pt_dataset_fini(&tr2);
	pt_dataset_fini(&ho2);
	PT_CHECK_ERR_MSG(pt_dataset_split(&tr2, &ho2, &ds, 1.5, 5), PT_ERR_INVALID, "fraction");
	PT_CHECK_OK(pt_dataset_split(&tr2, &ho2, &ds, 0.0, 5));
	CU_ASSERT(tr2.n == 10 && ho2.n == 0);
	pt_dataset_fini(&tr2);
	pt_dataset_fini(&ho2);
	pt_dataset_fini(&tr);
	pt_dataset_fini(&ho);
	pt_dataset_fini(&ds);
}

static void test_data_dataset_convert(void)
{
	int64_t xs[2] = {3, 2}, n = 3, ks[2] = {3, 1}, ms[2] = {2, 2};
	pt_tensor x, y, yk, ym;
	pt_dataset ds;

	PT_CHECK_OK(pt_tensor_init(&x, PT_U8, 2, xs));
	PT_CHECK_OK(pt_tensor_init(&y, PT_I32, 1, &n));
	PT_CHECK_OK(pt_tensor_init(&yk, PT_F64, 2, ks));
	PT_CHECK_OK(pt_tensor_init(&ym, PT_I64, 2, ms));
	((unsigned char *)pt_tensor_data(&x))[5] = 16;
	((int32_t *)pt_tensor_data(&y))[2] = 9;
	((double *)pt_tensor_data(&yk))[1] = 0.25;
	PT_CHECK_ERR_MSG(pt_dataset_init(&ds, &x, &y, false), PT_ERR_DTYPE,
	                 "x is u8, expected f32");
	PT_CHECK_OK(pt_dataset_init(&ds, &x, &y, true));
	CU_ASSERT(ds.x.dtype == PT_F32 && ds.y.dtype == PT_I64 && ds.n == 3);
	CU_ASSERT_EQUAL(pt_tensor_f32(&ds.x)[5], 16.0f);
	CU_ASSERT_EQUAL(((int64_t *)pt_tensor_data(&ds.y))[2], 9);
	pt_dataset_fini(&ds);
	PT_CHECK_OK(pt_dataset_init(&ds, &x, &yk, true));
	CU_ASSERT(ds.y.dtype == PT_F32 && ds.y.ndim == 2);
	CU_ASSERT_EQUAL(pt_tensor_f32(&ds.y)[1], 0.25f);
	pt_dataset_fini(&ds);
	PT_CHECK_ERR_MSG(pt_dataset_init(&ds, &x, &ym, true), PT_ERR_SHAPE, "(3, 2) and y (2, 2)");
	pt_dataset_fini(&ds);
	PT_CHECK_OK(pt_dataset_load_npy(&ds, pt_test_path("examples/data/digits_x.npy"),
	                                pt_test_path("examples/data/digits_y.npy"), false));
	CU_ASSERT(ds.n == 1797 && ds.x.shape[1] == 64);
	pt_dataset_fini(&ds);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	pt_tensor_fini(&yk);
	pt_tensor_fini(&ym);
}

static void test_data_microbatch_split(void)
{
	int64_t shape[2] = {8, 3};
	pt_tensor batch, views[4], spare;

	PT_CHECK_OK(pt_tensor_init(&batch, PT_F32, 2, shape));
	for (int i = 0; i < 24; i++)
		pt_tensor_f32(&batch)[i] = (float)i;
	PT_CHECK_OK(pt_microbatch_split(views, &batch, 4));
	for (int i = 0; i < 4; i++) {
		CU_ASSERT(views[i].shape[0] == 2 && views[i].shape[1] == 3);
		CU_ASSERT(views[i].storage == batch.storage);
		CU_ASSERT_EQUAL(pt_tensor_f32(&views[i])[0], (float)(6 * i));
	}
	pt_tensor_f32(&views[3])[5] = -1; /* a view writes through to the batch */
	CU_ASSERT_EQUAL(pt_tensor_f32(&batch)[23], -1.0f);
	for (int i = 0; i < 4; i++)
		pt_tensor_fini(&views[i]);
	PT_CHECK_OK(pt_microbatch_split(views, &batch, 1));
	CU_ASSERT_EQUAL(views[0].shape[0], 8);
	pt_tensor_fini(&views[0]);
	memset(&spare, 0, sizeof(spare));
	PT_CHECK_ERR_MSG(pt_microbatch_split(&spare, &batch, 3), PT_ERR_INVALID,
	                 "batch size 8 cannot be split into 3 microbatches");
	CU_ASSERT_PTR_NULL(spare.storage);
	PT_CHECK_ERR_MSG(pt_microbatch_split(&spare, &batch, 0), PT_ERR_INVALID,
	                 "into 0 microbatches");
	PT_CHECK_ERR_MSG(pt_microbatch_split(&spare, &batch, -2), PT_ERR_INVALID, "-2");
	pt_tensor_fini(&batch);
}

/* ---- SHA-256 (FIPS 180-2 appendix B vectors) ---- */

static void check_sha(const void *data, size_t n, const char *hex)
{
	uint8_t d[PT_SHA256_BYTES];
	char got[PT_SHA256_HEX];
	pt_sha256(data, n, d);
	pt_sha256_hex(d, got);
	CU_ASSERT_STRING_EQUAL(got, hex);
}

static void test_data_sha256(void)
{
	const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	const char *million_a = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
	char *a = malloc(1000000), got[PT_SHA256_HEX];
	uint8_t d[PT_SHA256_BYTES];
	pt_sha256_ctx s;

	check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	check_sha(m448, strlen(m448),
	          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	memset(a, 'a', 1000000);
	check_sha(a, 1000000, million_a);
	/* Streaming in uneven pieces gives the same digest. */
	pt_sha256_init(&s);
	for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 997 + 1)
		pt_sha256_update(&s, a + off, off + step > 1000000 ? 1000000 - off : step);
	pt_sha256_final(&s, d);
	pt_sha256_hex(d, got);
	CU_ASSERT_STRING_EQUAL(got, million_a);
	free(a);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

int main(void)
{
	static const pt_test_case json_tests[] = {
	    {"test_data_json_values", test_data_json_values},
	    {"test_data_json_errors", test_data_json_errors},
	    {"test_data_json_limits", test_data_json_limits},
	    {"test_data_json_writer", test_data_json_writer},
	    {"test_data_json_writer_large_fraction", test_data_json_writer_large_fraction},
	    {NULL, NULL},
	};
	static const pt_test_case npy_tests[] = {
	    {"test_data_npy_roundtrip", test_data_npy_roundtrip},
	    {"test_data_npy_versions", test_data_npy_versions},
	    {"test_data_npy_malformed", test_data_npy_malformed},
	    {"test_data_digits_files", test_data_digits_files},
	    {NULL, NULL},
	};
	static const pt_test_case token_tests[] = {
	    {"test_data_tokens", test_data_tokens},
	    {"test_data_tokens_llmc_header", test_data_tokens_llmc_header},
	    {"test_data_tokens_held_out_windows", test_data_tokens_held_out_windows},
	    {"test_data_text_tokens", test_data_text_tokens},
	    {NULL, NULL},
	};
	static const pt_test_case batch_tests[] = {
	    {"test_data_shuffle_orders", test_data_shuffle_orders},
	    {"test_data_batch_iter", test_data_batch_iter},
	    {"test_data_split", test_data_split},
	    {"test_data_dataset_convert", test_data_dataset_convert},
	    {"test_data_microbatch_split", test_data_microbatch_split},
	    {NULL, NULL},
	};
	static const pt_test_case sha_tests[] = {
	    {"test_data_sha256", test_data_sha256},
	    {NULL, NULL},
	};
	static const pt_test_suite suites[] = {
	    {"test_data_json", json_tests},    {"test_data_npy", npy_tests},
	    {"test_data_tokens", token_tests}, {"test_data_batch", batch_tests},
	    {"test_data_sha256", sha_tests},   {NULL, NULL},
	};
	int rv;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/pt_test_data_XXXXXX");
	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		return 99;
	}
	rv = pt_test_main(suites);
	nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return rv;
}
