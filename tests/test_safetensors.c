/* test_safetensors.c - safetensors round trips, a file from an independent
 * writer (tests/data/st_writer.py), every malformed-file error, checksums and
 * the atomic write. Files are made in a fresh temporary directory. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fileio.h"
#include "pt_test.h"
#include "rng.h"
#include "safetensors.h"
#include "sha256.h"
#include "tensor.h"

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
	static char buf[256];
	snprintf(buf, sizeof(buf), "%s/%s", tmpdir, name);
	return buf;
}

/* write_st writes a file with header length hlen (the text's length when
 * hlen is 0), the header text and data_len bytes of data. */
static void write_st(const char *path, const char *header, uint64_t hlen, size_t data_len)
{
	size_t tl = strlen(header), n = 8 + tl + data_len;
	unsigned char *buf = calloc(1, n);

	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	if (hlen == 0)
		hlen = tl;
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(hlen >> (8 * i));
	memcpy(buf + 8, header, tl);
	pt_test_write_file(path, buf, n);
	free(buf);
}

static void fill_random(pt_tensor *t, uint64_t stream)
{
	pt_rng r;
	unsigned char *p = pt_tensor_data(t);
	pt_rng_init(&r, 1234, stream);
	for (size_t i = 0; i < pt_tensor_nbytes(t); i++)
		p[i] = (unsigned char)pt_rng_u32(&r);
}

static bool no_temp_files(void)
{
	DIR *d = opendir(tmpdir);
	struct dirent *e;
	bool clean = true;

	if (d == NULL)
		return false;
	while ((e = readdir(d)) != NULL)
		if (strstr(e->d_name, ".tmp.") != NULL)
			clean = false;
	closedir(d);
	return clean;
}

static void test_safetensors_roundtrip(void)
{
	static const char *names[PT_DTYPE_COUNT] = {"0.weight", "1.half", "2.bf16",
	                                            "3.double", "4.int",  "5.long",
	                                            "6.bytes",  "7.u16",  "8.u32"};
	static const pt_st_meta meta[] = {{"step", "12"},
	                                  {"note", "na\xc3\xafve \"quoted\"\n\\ end"}};
	const char *path = tmp_path("rt.safetensors");
	pt_tensor src[PT_DTYPE_COUNT + 3], base;
	pt_st_tensor entries[PT_DTYPE_COUNT + 3];
	int64_t shape[2] = {3, 5}, tshape[2] = {5, 3}, empty[2] = {0, 4};
	pt_safetensors *st;
	size_t n = 0;

	for (int d = 0; d < PT_DTYPE_COUNT; d++, n++) {
		/* 3 x 5 of every dtype: odd sizes leave later tensors unaligned. */
		PT_CHECK_OK(pt_tensor_init(&src[n], (pt_dtype)d, d == PT_U8 ? 1 : 2,
		                           d == PT_U8 ? (int64_t[]){7} : shape));
		fill_random(&src[n], (uint64_t)d);
		entries[n] = (pt_st_tensor){names[d], &src[n]};
	}
	/* A transposed (non-contiguous) view, a scalar and an empty tensor. */
	PT_CHECK_OK(pt_tensor_init(&base, PT_F32, 2, tshape));
	fill_random(&base, 99);
	PT_CHECK_OK(pt_tensor_transpose(&src[n], &base, 0, 1));
	entries[n] = (pt_st_tensor){"9.transposed", &src[n]};
	n++;
	PT_CHECK_OK(pt_tensor_init(&src[n], PT_F64, 0, shape));
	fill_random(&src[n], 100);
	entries[n] = (pt_st_tensor){"scalar", &src[n]};
	n++;
	PT_CHECK_OK(pt_tensor_init(&src[n], PT_I64, 2, empty));
	entries[n] = (pt_st_tensor){"empty", &src[n]};
	n++;

	PT_CHECK_OK(pt_safetensors_write(path, entries, n, meta, 2));
	CU_ASSERT(no_temp_files());
	{
		/* Header length: a multiple of 8, so the data section is 8-aligned. */
		FILE *f = fopen(path, "rb");
		uint64_t hlen = 0;
		CU_ASSERT_FATAL(f != NULL && fread(&hlen, 8, 1, f) == 1);
		fclose(f);
		CU_ASSERT_EQUAL(hlen % 8, 0);
	}
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	CU_ASSERT_EQUAL(pt_safetensors_count(st), n);
	for (size_t i = 0; i < n; i++) {
		pt_tensor got, into;
		pt_dtype dt;
		int nd;
		int64_t sh[PT_MAX_DIMS];
		bool eq = false;

		CU_ASSERT_STRING_EQUAL(pt_safetensors_name(st, i), entries[i].name);
		PT_CHECK_OK(pt_safetensors_info(st, entries[i].name, &dt, &nd, sh));
		CU_ASSERT(dt == src[i].dtype && nd == src[i].ndim);
		PT_CHECK_OK(pt_safetensors_get(st, entries[i].name, &got));
		PT_CHECK_OK(pt_tensor_equal(&src[i], &got, &eq));
		CU_ASSERT(eq); /* bitwise, NaN payloads included */
		PT_CHECK_OK(pt_tensor_init(&into, src[i].dtype, src[i].ndim, src[i].shape));
		PT_CHECK_OK(pt_safetensors_copy(st, entries[i].name, &into));
		PT_CHECK_OK(pt_tensor_equal(&src[i], &into, &eq));
		CU_ASSERT(eq);
		pt_tensor_fini(&got);
		pt_tensor_fini(&into);
	}
	CU_ASSERT_PTR_NULL(pt_safetensors_name(st, n));
	CU_ASSERT_STRING_EQUAL(pt_safetensors_meta(st, "step"), "12");
	CU_ASSERT_STRING_EQUAL(pt_safetensors_meta(st, "note"), meta[1].value);
	CU_ASSERT_EQUAL(strlen(pt_safetensors_meta(st, "data_sha256")), 64);
	CU_ASSERT_PTR_NULL(pt_safetensors_meta(st, "absent"));
	CU_ASSERT_EQUAL(pt_safetensors_meta_count(st), 3);
	CU_ASSERT_STRING_EQUAL(pt_safetensors_meta_key(st, 0), "step");

	/* Copy-in errors name the tensor and both shapes or dtypes. */
	{
		pt_tensor wrong;
		PT_CHECK_OK(pt_tensor_init(&wrong, PT_F32, 2, tshape));
		PT_CHECK_ERR_MSG(
		    pt_safetensors_copy(st, "0.weight", &wrong), PT_ERR_SHAPE,
		    "tensor '0.weight' has shape (3, 5) in the file, (5, 3) in memory");
		PT_CHECK_ERR_MSG(pt_safetensors_copy(st, "3.double", &wrong), PT_ERR_DTYPE,
		                 "tensor '3.double' is F64 in the file, F32 in memory");
		PT_CHECK_ERR_MSG(pt_safetensors_copy(st, "nope", &wrong), PT_ERR_NOTFOUND,
		                 "no tensor named 'nope'");
		pt_tensor none;
		PT_CHECK_ERR_MSG(pt_safetensors_get(st, "nope", &none), PT_ERR_NOTFOUND, "nope");
		CU_ASSERT_PTR_NULL(none.storage);
		pt_tensor_fini(&wrong);
	}
	/* A view outlives the object: it holds a reference to the bytes. */
	{
		pt_tensor keep;
		bool eq = false;
		PT_CHECK_OK(pt_safetensors_get(st, "0.weight", &keep));
		pt_safetensors_destroy(st);
		PT_CHECK_OK(pt_tensor_equal(&src[0], &keep, &eq));
		CU_ASSERT(eq);
		pt_tensor_fini(&keep);
	}
	for (size_t i = 0; i < n; i++)
		pt_tensor_fini(&src[i]);
	pt_tensor_fini(&base);
}

static void test_safetensors_python_writer(void)
{
	const char *path = tmp_path("py.safetensors");
	char cmd[1024];
	pt_safetensors *st;
	pt_tensor t;
	double v;
	int64_t i64[2];

	if (access("/usr/bin/python3", X_OK) != 0) {
		printf("\n    skipped: /usr/bin/python3 is missing ");
		return;
	}
	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %s",
	         pt_test_path("tests/data/st_writer.py"), path);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	CU_ASSERT_EQUAL(pt_safetensors_count(st), 12);
	CU_ASSERT_STRING_EQUAL(pt_safetensors_name(st, 0), "0.bias"); /* header order */
	CU_ASSERT_STRING_EQUAL(pt_safetensors_meta(st, "format"), "pt");
	CU_ASSERT_PTR_NULL(pt_safetensors_meta(st, "data_sha256"));

	PT_CHECK_OK(pt_safetensors_get(st, "mask", &t));
	CU_ASSERT(t.dtype == PT_U8 && t.ndim == 1 && t.shape[0] == 3);
	CU_ASSERT(memcmp(pt_tensor_data(&t), "\x00\xff\x07", 3) == 0);
	pt_tensor_fini(&t);

	/* Starts at data byte 3: not 4-aligned, so this is a copy. */
	PT_CHECK_OK(pt_safetensors_get(st, "0.weight", &t));
	CU_ASSERT(t.dtype == PT_F32 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
	{
		const float *w = pt_tensor_f32(&t);
		CU_ASSERT(w[0] == 0.5f && w[1] == -1.25f && w[2] == 3.0f && w[3] == 0.001f);
		CU_ASSERT(w[4] == 0.0f && signbit(w[4]) && w[5] == 65504.0f);
	}
	pt_tensor_fini(&t);
	PT_CHECK_OK(pt_safetensors_get(st, "0.bias", &t));
	CU_ASSERT(pt_tensor_f32(&t)[0] == 1.0f && pt_tensor_f32(&t)[1] == -2.0f);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_safetensors_get(st, "half", &t));
	CU_ASSERT(t.dtype == PT_F16);
	CU_ASSERT(pt_f16_to_f32(((uint16_t *)pt_tensor_data(&t))[0]) == 1.5f);
	CU_ASSERT(pt_f16_to_f32(((uint16_t *)pt_tensor_data(&t))[1]) == -0.25f);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_safetensors_get(st, "brain", &t));
	CU_ASSERT(t.dtype == PT_BF16 && t.shape[0] == 3);
	PT_CHECK_OK(pt_tensor_item(&t, 0, &v));
	CU_ASSERT_EQUAL(v, 1.0);
	PT_CHECK_OK(pt_tensor_item(&t, 1, &v));
	CU_ASSERT_EQUAL(v, -2.0);
	PT_CHECK_OK(pt_tensor_item(&t, 2, &v));
	CU_ASSERT_EQUAL(v, 3.140625);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_safetensors_get(st, "double", &t));
	CU_ASSERT(((double *)pt_tensor_data(&t))[0] == 3.141592653589793);
	CU_ASSERT(((double *)pt_tensor_data(&t))[1] == -1e300);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_safetensors_get(st, "int32", &t));
	CU_ASSERT(((int32_t *)pt_tensor_data(&t))[0] == -7);
	CU_ASSERT(((int32_t *)pt_tensor_data(&t))[1] == INT32_MAX);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_tensor_init(&t, PT_I64, 1, (int64_t[]){2}));
	PT_CHECK_OK(pt_safetensors_copy(st, "int64", &t));
	memcpy(i64, pt_tensor_data(&t), sizeof(i64));
	CU_ASSERT(i64[0] == -9007199254740993LL && i64[1] == INT64_MAX);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_safetensors_get(st, "uint16", &t));
	CU_ASSERT(((uint16_t *)pt_tensor_data(&t))[0] == 65535);
	CU_ASSERT(((uint16_t *)pt_tensor_data(&t))[1] == 1);
	pt_tensor_fini(&t);
	PT_CHECK_OK(pt_safetensors_get(st, "uint32", &t));
	CU_ASSERT(((uint32_t *)pt_tensor_data(&t))[0] == UINT32_MAX);
	pt_tensor_fini(&t);
	PT_CHECK_OK(pt_safetensors_get(st, "scalar", &t));
	CU_ASSERT(t.ndim == 0 && pt_tensor_f32(&t)[0] == 42.0f);
	pt_tensor_fini(&t);
	PT_CHECK_OK(pt_safetensors_get(st, "empty", &t));
	CU_ASSERT(t.ndim == 2 && t.shape[0] == 0 && t.shape[1] == 3);
	pt_tensor_fini(&t);
	pt_safetensors_destroy(st);
}

#define ENTRY_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void test_safetensors_malformed(void)
{
	static const struct {
		const char *header;
		size_t data_len;
		const char *words;
	} bad[] = {
	    {"{not json}", 0, "header is not valid JSON"},
	    {"{" ENTRY_A "," ENTRY_A "}", 8, "duplicate key"},
	    {"[1]", 0, "header is a JSON array, not an object"},
	    {"{\"a\":[1]}", 0, "entry 'a' is not an object"},
	    {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "entry 'a' has no dtype"},
	    {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "entry 'a' has no shape"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "entry 'a' has no data_offsets"},
	    {"{\"a\":{\"dtype\":\"Q8\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
	     "entry 'a': unknown dtype 'Q8'"},
	    {"{\"a\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
	     "unsupported dtype 'BOOL'"},
	    {"{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
	     "dtype is not a string"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
	     "shape[0] is not a non-negative integer"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
	     "7 dimensions"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
	     "data_offsets is not [begin, end]"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8,
	     "data_offsets [0, 16] past the end of the data (8 bytes)"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
	     "begin 8 > end 0"},
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
	     "span 8 bytes but shape (3) of F32 needs 12"},
	    {"{" ENTRY_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
	     "entries 'a' and 'b' overlap"},
	    {"{" ENTRY_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 16,
	     "hole in the data section at bytes [8, 12)"},
	    {"{" ENTRY_A "}", 12, "hole: 4 data bytes after the last tensor"},
	    {"{\"__metadata__\":{}}", 4, "no tensors"},
	    {"{\"__metadata__\":{\"k\":1}," ENTRY_A "}", 8,
	     "metadata value of 'k' is a number, not a string"},
	    {"{\"__metadata__\":[\"k\"]," ENTRY_A "}", 8, "__metadata__ is not an object"},
	    {"{\"__metadata__\":{\"data_sha256\":\"xyz\"}," ENTRY_A "}", 8, "not 64 hex digits"},
	    /* Another key to the parser, "__metadata__" to strcmp: once a heap
	     * overflow (four values counted, one slot made for the second). */
	    {"{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"c\":\"3\",\"d\":\"4\"},"
	     "\"__metadata__\\u0000x\":{\"e\":\"5\"}," ENTRY_A "}",
	     8, "a header key contains a NUL character"},
	    /* No values, but strides of 2^124: once a signed overflow. */
	    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904,4611686018427387904],"
	     "\"data_offsets\":[0,0]}}",
	     0, "entry 'a': shape overflows"},
	};
	const char *path = tmp_path("bad.safetensors");
	pt_safetensors *st = (pt_safetensors *)1;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_st(path, bad[i].header, 0, bad[i].data_len);
		PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT, bad[i].words);
		CU_ASSERT_PTR_NULL(st);
		CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "bad.safetensors"));
	}
	pt_test_write_file(path, "\x10\0\0\0\0", 5);
	PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT, "truncated");
	write_st(path, "{}", 1000, 0);
	PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT,
	                 "header length 1000 exceeds the file size");
	write_st(path, "{}", 200000000, 0);
	PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT,
	                 "header length 200000000 is absurd");
	/* A header of many small values is refused by count, not parsed into
	 * a gigabyte of nodes. */
	{
		size_t n = PT_SAFETENSORS_MAX_VALUES + 16, at = 0;
		char *h = malloc(2 * n + 16);
		CU_ASSERT_PTR_NOT_NULL_FATAL(h);
		at += (size_t)sprintf(h, "{\"x\":[");
		for (size_t i = 0; i < n; i++)
			at += (size_t)sprintf(h + at, i ? ",0" : "0");
		sprintf(h + at, "]}");
		write_st(path, h, 0, 0);
		free(h);
		PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT,
		                 "more than 1048576 values");
	}
	/* The header's length is checked before the file is read: a 3 GB
	 * (sparse) file with an absurd length costs no memory. */
	{
		struct rusage r0, r1;
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		CU_ASSERT_FATAL(fd >= 0);
		CU_ASSERT_EQUAL(write(fd, "\xff\xff\xff\xff\xff\xff\xff\x7f", 8), 8);
		CU_ASSERT_EQUAL(ftruncate(fd, (off_t)3 << 30), 0);
		close(fd);
		getrusage(RUSAGE_SELF, &r0);
		PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT, "is absurd");
		getrusage(RUSAGE_SELF, &r1);
		CU_ASSERT(r1.ru_maxrss - r0.ru_maxrss < 256 * 1024); /* KiB */
		unlink(path);
	}
	write_st(path, "{}   ", 0, 0); /* empty but valid, padded header */
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	CU_ASSERT_EQUAL(pt_safetensors_count(st), 0);
	pt_safetensors_destroy(st);
	PT_CHECK_ERR_MSG(pt_safetensors_open(&st, tmp_path("absent.safetensors")), PT_ERR_IO,
	                 "absent.safetensors");
}

static void test_safetensors_checksum(void)
{
	const char *path = tmp_path("sum.safetensors");
	int64_t shape[1] = {16};
	pt_tensor t;
	pt_st_tensor e = {"w", &t};
	pt_safetensors *st;
	unsigned char byte;
	FILE *f;

	PT_CHECK_OK(pt_tensor_init(&t, PT_F32, 1, shape));
	fill_random(&t, 7);
	PT_CHECK_OK(pt_safetensors_write(path, &e, 1, NULL, 0));
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	pt_safetensors_destroy(st);
	/* Flip one bit of one data byte (the file's last byte). */
	f = fopen(path, "r+b");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fseek(f, -1, SEEK_END);
	CU_ASSERT_EQUAL(fread(&byte, 1, 1, f), 1);
	byte ^= 0x01;
	fseek(f, -1, SEEK_END);
	fwrite(&byte, 1, 1, f);
	fclose(f);
	PT_CHECK_ERR_MSG(pt_safetensors_open(&st, path), PT_ERR_FORMAT, "checksum mismatch");
	pt_tensor_fini(&t);
}

static void test_safetensors_atomic_write(void)
{
	const char *path = tmp_path("atomic.safetensors");
	int64_t shape[1] = {4};
	pt_tensor a, b;
	pt_st_tensor ea = {"a", &a}, eb[2] = {{"b", &b}, {"c", &a}};
	pt_st_meta reserved = {"data_sha256", "0"};
	pt_safetensors *st;
	char missing_dir[300];

	PT_CHECK_OK(pt_tensor_init(&a, PT_F32, 1, shape));
	PT_CHECK_OK(pt_tensor_init(&b, PT_I32, 1, shape));
	PT_CHECK_OK(pt_safetensors_write(path, &ea, 1, NULL, 0));
	PT_CHECK_OK(pt_safetensors_write(path, eb, 2, NULL, 0)); /* replaces it */
	CU_ASSERT(no_temp_files());
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	CU_ASSERT_EQUAL(pt_safetensors_count(st), 2);
	CU_ASSERT_STRING_EQUAL(pt_safetensors_name(st, 0), "b");
	pt_safetensors_destroy(st);

	snprintf(missing_dir, sizeof(missing_dir), "%s/no/such/dir.safetensors", tmpdir);
	PT_CHECK_ERR_MSG(pt_safetensors_write(missing_dir, &ea, 1, NULL, 0), PT_ERR_IO, "create");
	CU_ASSERT(no_temp_files());

	eb[1].name = "b";
	PT_CHECK_ERR_MSG(pt_safetensors_write(path, eb, 2, NULL, 0), PT_ERR_INVALID,
	                 "tensor name 'b' given twice");
	eb[1].name = "__metadata__";
	PT_CHECK_ERR_MSG(pt_safetensors_write(path, eb, 2, NULL, 0), PT_ERR_INVALID,
	                 "invalid name");
	PT_CHECK_ERR_MSG(pt_safetensors_write(path, &ea, 1, &reserved, 1), PT_ERR_INVALID,
	                 "reserved");
	/* Failed writes left the previous file in place. */
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	CU_ASSERT_EQUAL(pt_safetensors_count(st), 2);
	pt_safetensors_destroy(st);
	CU_ASSERT(no_temp_files());
	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

static void hex_of(const void *data, size_t n, char hex[PT_SHA256_HEX])
{
	uint8_t d[PT_SHA256_BYTES];
	pt_sha256(data, n, d);
	pt_sha256_hex(d, hex);
}

/* FIPS 180-4 vectors with both block functions, and equal digests of random
 * data fed in random pieces (buffered and whole-block paths). libpipetrain
 * installs OpenSSL's compression. */
static void test_sha256_vectors_and_backends(void)
{
	static const char *const want[3] = {
	    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
	    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"};
	static const char *const msg[3] = {
	    "", "abc", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"};
	char hex[PT_SHA256_HEX], ref[PT_SHA256_HEX];
	size_t n = 1000003;
	uint8_t *data = malloc(n);
	pt_rng r;
	CU_ASSERT_FATAL(data != NULL);
	CU_ASSERT_STRING_EQUAL(pt_sha256_backend(), "openssl");
	pt_rng_init(&r, 7, 0);
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)pt_rng_u32(&r);
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1)
			pt_sha256_set_blocks(NULL, NULL); /* the portable one */
		for (int k = 0; k < 3; k++) {
			hex_of(msg[k], strlen(msg[k]), hex);
			CU_ASSERT_STRING_EQUAL(hex, want[k]);
		}
		memset(data, 'a', 1000000);
		hex_of(data, 1000000, hex);
		CU_ASSERT_STRING_EQUAL(
		    hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	}
	/* Random pieces through the portable path, then through OpenSSL's. */
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)pt_rng_u32(&r);
	for (int pass = 0; pass < 2; pass++) {
		pt_sha256_ctx s;
		uint8_t d[PT_SHA256_BYTES];
		size_t off = 0;
		if (pass == 1)
			pt_sha256_use_openssl();
		pt_sha256_init(&s);
		while (off < n) {
			size_t k = pt_rng_u32(&r) % 300;
			k = k > n - off ? n - off : k;
			pt_sha256_update(&s, data + off, k);
			off += k;
		}
		pt_sha256_final(&s, d);
		pt_sha256_hex(d, pass ? hex : ref);
	}
	CU_ASSERT_STRING_EQUAL(pt_sha256_backend(), "openssl");
	CU_ASSERT_STRING_EQUAL(hex, ref);
	hex_of(data, n, hex);
	CU_ASSERT_STRING_EQUAL(hex, ref);
	free(data);
}

/* pt_sha256_update2 equals two pt_sha256_update calls, for the serial pair
 * and the SHA extensions' one (where the CPU has them): messages that start
 * at different offsets within a block, pieces from 0 bytes to 1 MiB, each
 * checked against its own single-stream digest. */
static void test_sha256_update2(void)
{
	size_t n = (1u << 20) + 4099;
	uint8_t *a = malloc(n), *b = malloc(n);
	pt_sha256_blocks2_fn ni = pt_sha256_ni_pair();
	pt_rng r;
	int checked = 0;

	CU_ASSERT_FATAL(a != NULL && b != NULL);
	CU_ASSERT_STRING_EQUAL(pt_sha256_pair_backend(), ni ? "sha-ni" : "serial");
	if (ni == NULL)
		fprintf(stderr, "\n  (no SHA extensions on this CPU: the serial pair only) ");
	pt_rng_init(&r, 11, 0);
	for (size_t i = 0; i < n; i++)
		a[i] = (uint8_t)pt_rng_u32(&r), b[i] = (uint8_t)pt_rng_u32(&r);
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 0)
			pt_sha256_set_pair(NULL, NULL);
		else if (ni != NULL)
			pt_sha256_set_pair(ni, "sha-ni");
		else
			break;
		CU_ASSERT_STRING_EQUAL(pt_sha256_pair_backend(), pass ? "sha-ni" : "serial");
		for (int trial = 0; trial < 40; trial++) {
			pt_sha256_ctx s, t, rs, rt;
			uint8_t d1[PT_SHA256_BYTES], d2[PT_SHA256_BYTES];
			size_t pa = pt_rng_u32(&r) % 130, pb = pt_rng_u32(&r) % 130;
			size_t oa = pa, ob = pb;
			pt_sha256_init(&s), pt_sha256_init(&t);
			pt_sha256_update(&s, a, pa), pt_sha256_update(&t, b, pb);
			rs = s, rt = t;
			for (int piece = 0; piece < 4; piece++) {
				size_t k = trial == 0
				               ? n - 130
				               : pt_rng_u32(&r) % (piece == 3 ? 300000 : 5000);
				size_t room = n - (oa > ob ? oa : ob);
				k = k > room ? room : k;
				pt_sha256_update2(&s, a + oa, &t, b + ob, k);
				pt_sha256_update(&rs, a + oa, k), pt_sha256_update(&rt, b + ob, k);
				oa += k, ob += k;
			}
			CU_ASSERT_EQUAL(s.nbytes, oa);
			CU_ASSERT_EQUAL(t.nbytes, ob);
			pt_sha256_final(&s, d1), pt_sha256_final(&rs, d2);
			CU_ASSERT_EQUAL(memcmp(d1, d2, sizeof(d1)), 0);
			pt_sha256_final(&t, d1), pt_sha256_final(&rt, d2);
			CU_ASSERT_EQUAL(memcmp(d1, d2, sizeof(d1)), 0);
			checked++;
		}
	}
	CU_ASSERT_EQUAL(checked, ni ? 80 : 40);
	/* The whole of both, paired from the start, against the one-shot hash. */
	{
		pt_sha256_ctx s, t;
		uint8_t d[PT_SHA256_BYTES];
		char h1[PT_SHA256_HEX], h2[PT_SHA256_HEX];
		pt_sha256_init(&s), pt_sha256_init(&t);
		pt_sha256_update2(&s, a, &t, b, n);
		pt_sha256_final(&s, d), pt_sha256_hex(d, h1), hex_of(a, n, h2);
		CU_ASSERT_STRING_EQUAL(h1, h2);
		pt_sha256_final(&t, d), pt_sha256_hex(d, h1), hex_of(b, n, h2);
		CU_ASSERT_STRING_EQUAL(h1, h2);
	}
	pt_sha256_use_openssl();
	CU_ASSERT_STRING_EQUAL(pt_sha256_pair_backend(), ni ? "sha-ni" : "serial");
	free(a);
	free(b);
}

/* resident_pages counts the pages of path's first len bytes in the page cache. */
static size_t resident_pages(const char *path, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t np = (len + (size_t)pg - 1) / (size_t)pg, n = 0;
	unsigned char *vec = malloc(np);
	int fd = open(path, O_RDONLY);
	void *m = fd >= 0 ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (vec != NULL && m != MAP_FAILED && mincore(m, len, vec) == 0)
		for (size_t i = 0; i < np; i++)
			n += vec[i] & 1;
	else
		n = SIZE_MAX;
	if (m != MAP_FAILED)
		munmap(m, len);
	if (fd >= 0)
		close(fd);
	free(vec);
	return n;
}

/* direct_io_here: whether the file system of tmpdir takes an aligned O_DIRECT
 * write (ext4 and xfs do; some others refuse it). */
static bool direct_io_here(void)
{
	const char *probe = tmp_path("probe.direct");
	void *buf = aligned_alloc(4096, 4096);
	int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
	bool ok = fd >= 0 && buf != NULL && (memset(buf, 1, 4096), write(fd, buf, 4096) == 4096);
	if (fd >= 0)
		close(fd);
	unlink(probe);
	free(buf);
	return ok;
}

/* Fault injection for the O_DIRECT fallback: this program's write() (it
 * takes the place of libc's for libpipetrain too) refuses the next
 * refuse_direct writes to an O_DIRECT descriptor with EINVAL, and cuts the
 * next short_direct ones to their first 4096 bytes. */
static int refuse_direct, short_direct;

ssize_t write(int fd, const void *buf, size_t n)
{
	if (refuse_direct > 0 || short_direct > 0) {
		int fl = fcntl(fd, F_GETFL);
		if (fl >= 0 && (fl & O_DIRECT) != 0) {
			if (refuse_direct > 0) {
				refuse_direct--;
				errno = EINVAL;
				return -1;
			}
			if (n > 4096) {
				short_direct--;
				n = 4096;
			}
		}
	}
	return syscall(SYS_write, fd, buf, n);
}

enum { ANY_CACHE, NOT_CACHED, CACHED };

/* check_write writes the n parts with pt_file_write_atomic_sha256 and checks
 * the file: their bytes in order, the size and SHA-256 (hashed while
 * writing), no temporary file left; and, right after the write, that none
 * of its pages are in the page cache (NOT_CACHED) or that some are (CACHED). */

static void check_write(const char *name, const pt_file_part *parts, int n, int cache)
{
	size_t total = 0, at = 0, got_len = 0;
	char hex[65], want[PT_SHA256_HEX];
	uint64_t size = 0;
	uint8_t *cat;
	void *got = NULL;
	const char *path = tmp_path(name);

	for (int i = 0; i < n; i++)
		total += parts[i].len;
	cat = malloc(total);
	CU_ASSERT_FATAL(cat != NULL);
	for (int i = 0; i < n; i++, at += parts[i - 1].len)
		memcpy(cat + at, parts[i].data, parts[i].len);
	PT_CHECK_OK(pt_file_write_atomic_sha256(path, parts, (size_t)n, hex, &size));
	if (cache == NOT_CACHED) /* before reading it back, which caches it */
		CU_ASSERT_EQUAL(resident_pages(path, total), 0);
	if (cache == CACHED)
		CU_ASSERT(resident_pages(path, total) > 0);
	CU_ASSERT_EQUAL(size, total);
	hex_of(cat, total, want);
	CU_ASSERT_STRING_EQUAL(hex, want);
	PT_CHECK_OK(pt_file_read(path, total + 1, &got, &got_len));
	CU_ASSERT_FATAL(got != NULL);
	CU_ASSERT(got_len == total && memcmp(got, cat, total) == 0);
	CU_ASSERT(no_temp_files());
	free(got);
	free(cat);
}

/* Files of 8 MiB and more are written with O_DIRECT, smaller ones through
 * the page cache in 4 MiB pieces. Checked (check_write) for a small file and
 * two large ones: unaligned parts straddling the 4 MiB staging chunks, and a
 * page-aligned part at a block boundary of the file (a safetensors payload
 * after its padded header), written from where it is, between unaligned
 * ones. Where the file system takes O_DIRECT, the large files' bytes are not
 * in the page cache afterwards (the writer left no gigabytes behind), and an
 * O_DIRECT write refused (EINVAL) or cut short still gives the whole file,
 * through the page cache from there (write() below injects both). */
static void test_file_write_atomic_direct(void)
{
	const size_t big = (17u << 20) + 4095;
	uint8_t *src = malloc(big + 64), *page = aligned_alloc(4096, 10u << 20);
	bool direct = direct_io_here();
	pt_rng r;

	CU_ASSERT_FATAL(src != NULL && page != NULL);
	pt_rng_init(&r, 99, 1);
	for (size_t i = 0; i < big + 64; i++)
		src[i] = (uint8_t)pt_rng_u32(&r);
	for (size_t i = 0; i < (10u << 20); i++)
		page[i] = (uint8_t)pt_rng_u32(&r);
	{
		const uint8_t *b = src + 3; /* unaligned */
		size_t cut = (4u << 20) - 5;
		pt_file_part small[3] = {{b, 8}, {b + 8, cut - 8}, {b + cut, (5u << 20) + 7 - cut}};
		pt_file_part large[3] = {{b, 8}, {b + 8, cut - 8}, {b + cut, big - cut}};
		/* 4096 bytes of "header", an aligned part of 9 MiB + 100, a tail */
		pt_file_part aligned[4] = {
		    {b, 8}, {b + 8, 4088}, {page, (9u << 20) + 100}, {b + 5000, 70001}};
		check_write("small.bin", small, 3, ANY_CACHE);
		check_write("large.bin", large, 3, direct ? NOT_CACHED : ANY_CACHE);
		check_write("aligned.bin", aligned, 4, direct ? NOT_CACHED : ANY_CACHE);
		/* O_DIRECT refused at the first write, or cut short at a later
		 * one: the file is still whole, through the page cache from there */
		if (direct) {
			refuse_direct = 1;
			check_write("refused.bin", aligned, 4, CACHED);
			CU_ASSERT_EQUAL(refuse_direct, 0);
			short_direct = 1;
			check_write("short.bin", large, 3, CACHED);
			CU_ASSERT_EQUAL(short_direct, 0);
		}
	}
	free(src);
	free(page);
}

/* A safetensors file of 8 MiB of data or more pads its header so that the
 * data starts at a 4096-byte boundary (PT_FILE_DIRECT_ALIGN: written from the
 * tensors' memory with O_DIRECT) and reads back bitwise with its checksum;
 * smaller ones keep the 8-byte alignment. */
static void test_safetensors_large_aligned(void)
{
	pt_tensor t, s;
	pt_st_tensor e[2] = {{"big", &t}, {"small", &s}};
	pt_safetensors *st;
	FILE *f;
	uint64_t hlen = 0;
	const char *path = tmp_path("large.safetensors");

	PT_CHECK_OK(pt_tensor_init(&t, PT_F32, 2, (int64_t[]){1100, 2000}));
	PT_CHECK_OK(pt_tensor_init(&s, PT_F32, 1, (int64_t[]){3}));
	fill_random(&t, 5);
	fill_random(&s, 6);
	PT_CHECK_OK(pt_safetensors_write(path, e, 2, NULL, 0));
	f = fopen(path, "rb");
	CU_ASSERT_FATAL(f != NULL && fread(&hlen, 8, 1, f) == 1);
	fclose(f);
	CU_ASSERT_EQUAL((8 + hlen) % 4096, 0);
	PT_CHECK_OK(pt_safetensors_open(&st, path));
	for (int i = 0; i < 2; i++) {
		pt_tensor back;
		bool eq = false;
		PT_CHECK_OK(pt_safetensors_get(st, e[i].name, &back));
		PT_CHECK_OK(pt_tensor_equal(&back, e[i].tensor, &eq));
		CU_ASSERT(eq);
		pt_tensor_fini(&back);
	}
	pt_safetensors_destroy(st);
	pt_tensor_fini(&t);
	pt_tensor_fini(&s);
}

int main(void)
{
	static const pt_test_case tests[] = {
	    {"test_safetensors_roundtrip", test_safetensors_roundtrip},
	    {"test_safetensors_python_writer", test_safetensors_python_writer},
	    {"test_safetensors_malformed", test_safetensors_malformed},
	    {"test_safetensors_checksum", test_safetensors_checksum},
	    {"test_safetensors_atomic_write", test_safetensors_atomic_write},
	    {"test_sha256_vectors_and_backends", test_sha256_vectors_and_backends},
	    {"test_sha256_update2", test_sha256_update2},
	    {"test_file_write_atomic_direct", test_file_write_atomic_direct},
	    {"test_safetensors_large_aligned", test_safetensors_large_aligned},
	    {NULL, NULL},
	};
	static const pt_test_suite suites[] = {
	    {"test_safetensors", tests},
	    {NULL, NULL},
	};
	int rv;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/pt_test_st_XXXXXX");
	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		return 99;
	}
	rv = pt_test_main(suites);
	nftw(tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return rv;
}
