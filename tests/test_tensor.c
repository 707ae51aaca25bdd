/* test_tensor.c - storage lifetimes, views, host reads, dtype conversion and the
 * Philox generator.
 *
 * Conversions are checked bit-exactly on values whose correct rounding is known
 * by hand (IEEE 754 round to nearest even); Philox against the Random123
 * known-answer vectors. Limits: CPU storage only.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "ops.h"
#include "pt_test.h"
#include "rng.h"
#include "runtime.h"
#include "tensor.h"

static int refs_of(const pt_tensor *t)
{
	return atomic_load(&t->storage->refs);
}

/* Makes a contiguous f32 tensor holding 0, 1, 2, ... */
static void iota_f32(pt_tensor *t, int ndim, const int64_t *shape)
{
	float buf[256];
	PT_CHECK_OK(pt_tensor_init(t, PT_F32, ndim, shape));
	int64_t n = pt_tensor_numel(t);
	CU_ASSERT_FATAL(n <= 256);
	for (int64_t i = 0; i < n; i++)
		buf[i] = (float)i;
	PT_CHECK_OK(pt_tensor_write(t, buf, sizeof(float) * (size_t)n));
}

static float f32_of_bits(uint32_t x)
{
	float f;
	memcpy(&f, &x, 4);
	return f;
}

static uint32_t bits_of_f32(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	return x;
}

/* ---- storage reference counts ---- */

static void test_tensor_refcount_views_outlive_original(void)
{
	pt_tensor t, nv, tv, rv;
	float out[6];

	iota_f32(&t, 2, (int64_t[]){4, 3});
	CU_ASSERT_EQUAL(refs_of(&t), 1);
	PT_CHECK_OK(pt_tensor_narrow(&nv, &t, 0, 1, 2)); /* rows 1, 2 */
	CU_ASSERT_EQUAL(refs_of(&t), 2);
	PT_CHECK_OK(pt_tensor_transpose(&tv, &t, 0, 1));
	PT_CHECK_OK(pt_tensor_reshape(&rv, &t, 1, (int64_t[]){12}));
	CU_ASSERT_EQUAL(refs_of(&t), 4);
	pt_tensor_fini(&t);
	CU_ASSERT_PTR_NULL(t.storage);
	CU_ASSERT_EQUAL(refs_of(&nv), 3);

	/* The narrowed view still reads rows 1 and 2 of the freed original. */
	PT_CHECK_OK(pt_tensor_read(&nv, out, sizeof(out)));
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(out[i], (float)(3 + i));
	pt_tensor_fini(&tv);
	pt_tensor_fini(&rv);
	CU_ASSERT_EQUAL(refs_of(&nv), 1);
	pt_tensor_fini(&nv);
	pt_tensor_fini(&nv); /* fini of a zeroed tensor is safe */
	pt_tensor_fini(NULL);
}

static void test_tensor_refcount_view_and_slice(void)
{
	pt_tensor t, v;
	pt_storage *parent, *slice;
	double d;

	iota_f32(&t, 1, (int64_t[]){8});
	pt_tensor_view(&v, &t);
	CU_ASSERT_EQUAL(refs_of(&t), 2);
	CU_ASSERT_PTR_EQUAL(v.storage, t.storage);
	pt_tensor_fini(&t);
	PT_CHECK_OK(pt_tensor_item(&v, 7, &d));
	CU_ASSERT_EQUAL(d, 7.0);
	pt_tensor_fini(&v);

	/* A slice holds its parent; a tensor on the slice holds the slice. */
	PT_CHECK_OK(pt_storage_create(&parent, 64, PT_CPU));
	((float *)parent->data)[5] = 42.0f;
	PT_CHECK_OK(pt_storage_slice(&slice, parent, 16, 32));
	CU_ASSERT_EQUAL(atomic_load(&parent->refs), 2);
	CU_ASSERT_PTR_EQUAL(slice->parent, parent);
	PT_CHECK_OK(pt_tensor_init_on(&t, slice, 4, PT_F32, 1, (int64_t[]){2}));
	CU_ASSERT_EQUAL(atomic_load(&slice->refs), 2);
	pt_storage_release(slice);
	pt_storage_release(parent);
	PT_CHECK_OK(pt_tensor_item(&t, 0, &d)); /* byte 16 + 4 = float 5 of the parent */
	CU_ASSERT_EQUAL(d, 42.0);
	pt_tensor_fini(&t);
	pt_storage_release(NULL);
}

/* ---- views ---- */

static void test_tensor_views_shapes_and_errors(void)
{
	pt_tensor t, v, w;
	float out[12];

	iota_f32(&t, 2, (int64_t[]){4, 3});
	PT_CHECK_OK(pt_tensor_reshape(&v, &t, 3, (int64_t[]){2, 3, 2}));
	CU_ASSERT_EQUAL(v.ndim, 3);
	CU_ASSERT_EQUAL(v.strides[0], 6);
	CU_ASSERT_EQUAL(v.strides[1], 2);
	CU_ASSERT_EQUAL(v.strides[2], 1);
	PT_CHECK_OK(pt_tensor_read(&v, out, sizeof(out)));
	for (int i = 0; i < 12; i++)
		CU_ASSERT_EQUAL(out[i], (float)i);
	pt_tensor_fini(&v);

	PT_CHECK_ERR(pt_tensor_reshape(&v, &t, 2, (int64_t[]){5, 3}), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "(4, 3)"));
	PT_CHECK_ERR(pt_tensor_reshape(&v, &t, 1, (int64_t[]){-12}), PT_ERR_SHAPE);
	PT_CHECK_ERR(pt_tensor_reshape(&v, &t, 7, (int64_t[]){1, 1, 1, 1, 1, 4, 3}), PT_ERR_SHAPE);
	PT_CHECK_OK(pt_tensor_transpose(&w, &t, 0, 1));
	CU_ASSERT_FALSE(pt_tensor_is_contiguous(&w));
	PT_CHECK_ERR(pt_tensor_reshape(&v, &w, 1, (int64_t[]){12}), PT_ERR_SHAPE);
	pt_tensor_fini(&w);

	/* narrow along dim 1: columns 1..2, a non-contiguous view */
	PT_CHECK_OK(pt_tensor_narrow(&v, &t, 1, 1, 2));
	CU_ASSERT_EQUAL(v.shape[0], 4);
	CU_ASSERT_EQUAL(v.shape[1], 2);
	CU_ASSERT_FALSE(pt_tensor_is_contiguous(&v));
	PT_CHECK_OK(pt_tensor_read(&v, out, sizeof(float) * 8));
	for (int r = 0; r < 4; r++)
		for (int c = 0; c < 2; c++)
			CU_ASSERT_EQUAL(out[r * 2 + c], (float)(r * 3 + c + 1));
	pt_tensor_fini(&v);
	/* an empty narrow at the end is allowed */
	PT_CHECK_OK(pt_tensor_narrow(&v, &t, 0, 4, 0));
	CU_ASSERT_EQUAL(pt_tensor_numel(&v), 0);
	pt_tensor_fini(&v);

	PT_CHECK_ERR(pt_tensor_narrow(&v, &t, 2, 0, 1), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_narrow(&v, &t, -1, 0, 1), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_narrow(&v, &t, 0, 3, 2), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_narrow(&v, &t, 0, -1, 1), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_narrow(&v, &t, 1, 0, 4), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_transpose(&v, &t, 0, 2), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_transpose(&v, &t, -1, 0), PT_ERR_RANGE);
	/* failed views took no reference */
	CU_ASSERT_EQUAL(refs_of(&t), 1);
	pt_tensor_fini(&t);
}

static void test_tensor_read_transposed_order(void)
{
	pt_tensor t, tv, nt;
	float out[24];
	double d;

	/* (2, 3) = [[0 1 2] [3 4 5]], transposed (3, 2) = [[0 3] [1 4] [2 5]] */
	iota_f32(&t, 2, (int64_t[]){2, 3});
	PT_CHECK_OK(pt_tensor_transpose(&tv, &t, 0, 1));
	CU_ASSERT_EQUAL(tv.shape[0], 3);
	CU_ASSERT_EQUAL(tv.shape[1], 2);
	PT_CHECK_OK(pt_tensor_read(&tv, out, sizeof(float) * 6));
	const float want[6] = {0, 3, 1, 4, 2, 5};
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(out[i], want[i]);
	for (int i = 0; i < 6; i++) {
		PT_CHECK_OK(pt_tensor_item(&tv, i, &d));
		CU_ASSERT_EQUAL(d, (double)want[i]);
	}
	/* a narrow of the transposed view: rows 1..2 = [[1 4] [2 5]] */
	PT_CHECK_OK(pt_tensor_narrow(&nt, &tv, 0, 1, 2));
	PT_CHECK_OK(pt_tensor_read(&nt, out, sizeof(float) * 4));
	CU_ASSERT_EQUAL(out[0], 1.0f);
	CU_ASSERT_EQUAL(out[1], 4.0f);
	CU_ASSERT_EQUAL(out[2], 2.0f);
	CU_ASSERT_EQUAL(out[3], 5.0f);
	pt_tensor_fini(&nt);
	pt_tensor_fini(&tv);
	pt_tensor_fini(&t);

	/* 3-d: (2, 3, 4) with dims 0 and 2 swapped is (4, 3, 2), element
	 * [i][j][k] = src[k][j][i] = 12 k + 4 j + i. */
	iota_f32(&t, 3, (int64_t[]){2, 3, 4});
	PT_CHECK_OK(pt_tensor_transpose(&tv, &t, 0, 2));
	PT_CHECK_OK(pt_tensor_read(&tv, out, sizeof(out)));
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 3; j++)
			for (int k = 0; k < 2; k++)
				CU_ASSERT_EQUAL(out[(i * 3 + j) * 2 + k],
				                (float)(12 * k + 4 * j + i));
	PT_CHECK_ERR(pt_tensor_read(&tv, out, sizeof(float) * 23), PT_ERR_RANGE);
	pt_tensor_fini(&tv);
	pt_tensor_fini(&t);
}

/* ---- conversions ---- */

static void test_tensor_convert_bf16_known_values(void)
{
	CU_ASSERT_EQUAL(pt_f32_to_bf16(1.0f), 0x3f80);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(-2.5f), 0xc020);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(0.0f), 0x0000);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(-0.0f), 0x8000);
	/* 0.1f = 0x3dcccccd: the dropped half 0xcccd > 0x8000 rounds up */
	CU_ASSERT_EQUAL(pt_f32_to_bf16(0.1f), 0x3dcd);
	/* exact ties go to the even neighbour */
	CU_ASSERT_EQUAL(pt_f32_to_bf16(f32_of_bits(0x3f808000u)), 0x3f80);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(f32_of_bits(0x3f818000u)), 0x3f82);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(f32_of_bits(0x3f808001u)), 0x3f81);
	/* overflow past the largest bf16 (0x7f7f) rounds to infinity */
	CU_ASSERT_EQUAL(pt_f32_to_bf16(f32_of_bits(0x7f7fffffu)), 0x7f80);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(-INFINITY), 0xff80);
	CU_ASSERT_EQUAL(pt_f32_to_bf16(INFINITY), 0x7f80);
	/* NaN stays NaN, including a NaN whose payload lives in the low bits */
	CU_ASSERT_TRUE(isnan(pt_bf16_to_f32(pt_f32_to_bf16(NAN))));
	CU_ASSERT_TRUE(isnan(pt_bf16_to_f32(pt_f32_to_bf16(f32_of_bits(0x7f800001u)))));
	CU_ASSERT_TRUE(isnan(pt_bf16_to_f32(pt_f32_to_bf16(f32_of_bits(0xff80ffffu)))));

	CU_ASSERT_EQUAL(pt_bf16_to_f32(0x3f80), 1.0f);
	CU_ASSERT_EQUAL(pt_bf16_to_f32(0xc020), -2.5f);
	CU_ASSERT_EQUAL(bits_of_f32(pt_bf16_to_f32(0x3dcd)), 0x3dcd0000u);
	CU_ASSERT_EQUAL(pt_bf16_to_f32(0x7f80), INFINITY);
	/* the smallest bf16 subnormal survives the round trip */
	CU_ASSERT_EQUAL(pt_f32_to_bf16(pt_bf16_to_f32(0x0001)), 0x0001);
}

static void test_tensor_convert_f16_known_values(void)
{
	CU_ASSERT_EQUAL(pt_f32_to_f16(1.0f), 0x3c00);
	CU_ASSERT_EQUAL(pt_f32_to_f16(-2.5f), 0xc100);
	CU_ASSERT_EQUAL(pt_f32_to_f16(0.0f), 0x0000);
	CU_ASSERT_EQUAL(pt_f32_to_f16(-0.0f), 0x8000);
	CU_ASSERT_EQUAL(pt_f32_to_f16(65504.0f), 0x7bff); /* largest finite */
	CU_ASSERT_EQUAL(pt_f32_to_f16(65519.0f), 0x7bff); /* below the midpoint 65520 */
	CU_ASSERT_EQUAL(pt_f32_to_f16(65520.0f), 0x7c00); /* tie: even neighbour is inf */
	CU_ASSERT_EQUAL(pt_f32_to_f16(1e5f), 0x7c00);
	CU_ASSERT_EQUAL(pt_f32_to_f16(-1e5f), 0xfc00);
	CU_ASSERT_EQUAL(pt_f32_to_f16(INFINITY), 0x7c00);
	/* 0.1 -> 0x2e66 = 0.0999755859375 (the dropped bits are below half) */
	CU_ASSERT_EQUAL(pt_f32_to_f16(0.1f), 0x2e66);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x2e66), 0.0999755859375f);
	/* ties to even in the normal range: 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9 */
	CU_ASSERT_EQUAL(pt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	CU_ASSERT_EQUAL(pt_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
	/* rounding that carries into the exponent: 2 - 2^-12 -> 2.0 */
	CU_ASSERT_EQUAL(pt_f32_to_f16(2.0f - 0x1p-12f), 0x4000);
	/* subnormals: the smallest 2^-24 = 5.9604645e-08 and its neighbours */
	CU_ASSERT_EQUAL(pt_f32_to_f16(5.9604645e-08f), 0x0001);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x0001), 0x1p-24f);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x0001), 5.9604645e-08f);
	CU_ASSERT_EQUAL(pt_f32_to_f16(0x1p-25f), 0x0000);   /* tie to even: 0 */
	CU_ASSERT_EQUAL(pt_f32_to_f16(0x3p-25f), 0x0002);   /* tie to even: 2 */
	CU_ASSERT_EQUAL(pt_f32_to_f16(0x1p-26f), 0x0000);   /* underflow */
	CU_ASSERT_EQUAL(pt_f32_to_f16(-0x1p-24f), 0x8001);  /* negative subnormal */
	CU_ASSERT_EQUAL(pt_f32_to_f16(0x1p-14f), 0x0400);   /* smallest normal */
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x03ff), 0x3ffp-24f); /* largest subnormal */
	CU_ASSERT_EQUAL(pt_f32_to_f16(0x3ffp-24f), 0x03ff);
	/* NaN stays NaN, inf stays inf */
	uint16_t hn = pt_f32_to_f16(NAN);
	CU_ASSERT_EQUAL(hn & 0x7c00, 0x7c00);
	CU_ASSERT_NOT_EQUAL(hn & 0x03ff, 0);
	CU_ASSERT_TRUE(isnan(pt_f16_to_f32(hn)));
	CU_ASSERT_TRUE(isnan(pt_f16_to_f32(pt_f32_to_f16(f32_of_bits(0x7f800001u)))));
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x7c00), INFINITY);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0xfc00), -INFINITY);

	CU_ASSERT_EQUAL(pt_f16_to_f32(0x3c00), 1.0f);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0xc100), -2.5f);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x7bff), 65504.0f);
	CU_ASSERT_EQUAL(pt_f16_to_f32(0x8001), -0x1p-24f);
	/* every finite f16 survives f16 -> f32 -> f16 */
	int bad = 0;
	for (uint32_t h = 0; h < 0x10000u; h++) {
		if ((h & 0x7c00u) == 0x7c00u)
			continue;
		bad += pt_f32_to_f16(pt_f16_to_f32((uint16_t)h)) != h;
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_tensor_convert_tensors(void)
{
	const float src[6] = {1.0f, -2.5f, 65504.0f, 5.9604645e-08f, 0.1f, 1e6f};
	const uint16_t want_h[6] = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x2e66, 0x7c00};
	const uint16_t want_b[6] = {0x3f80, 0xc020, 0x4780, 0x3380, 0x3dcd, 0x4974};
	pt_tensor f, h, b, back, i32, wrong;
	uint16_t got[6];
	float fb[6];

	PT_CHECK_OK(pt_tensor_init(&f, PT_F32, 2, (int64_t[]){2, 3}));
	PT_CHECK_OK(pt_tensor_init(&h, PT_F16, 2, (int64_t[]){2, 3}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_BF16, 2, (int64_t[]){2, 3}));
	PT_CHECK_OK(pt_tensor_init(&back, PT_F32, 2, (int64_t[]){2, 3}));
	PT_CHECK_OK(pt_tensor_write(&f, src, sizeof(src)));
	PT_CHECK_OK(pt_tensor_convert(&h, &f));
	PT_CHECK_OK(pt_tensor_read(&h, got, sizeof(got)));
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(got[i], want_h[i]);
	PT_CHECK_OK(pt_tensor_convert(&b, &f));
	PT_CHECK_OK(pt_tensor_read(&b, got, sizeof(got)));
	for (int i = 0; i < 6; i++)
		CU_ASSERT_EQUAL(got[i], want_b[i]);
	PT_CHECK_OK(pt_tensor_convert(&back, &h));
	PT_CHECK_OK(pt_tensor_read(&back, fb, sizeof(fb)));
	CU_ASSERT_EQUAL(fb[0], 1.0f);
	CU_ASSERT_EQUAL(fb[1], -2.5f);
	CU_ASSERT_EQUAL(fb[2], 65504.0f);
	CU_ASSERT_EQUAL(fb[3], 0x1p-24f);
	CU_ASSERT_EQUAL(fb[4], 0.0999755859375f);
	CU_ASSERT_EQUAL(fb[5], INFINITY);

	PT_CHECK_OK(pt_tensor_init(&i32, PT_I32, 2, (int64_t[]){2, 3}));
	PT_CHECK_ERR(pt_tensor_convert(&i32, &f), PT_ERR_DTYPE);
	PT_CHECK_OK(pt_tensor_init(&wrong, PT_F16, 2, (int64_t[]){3, 2}));
	PT_CHECK_ERR(pt_tensor_convert(&wrong, &f), PT_ERR_SHAPE);
	pt_tensor_fini(&f);
	pt_tensor_fini(&h);
	pt_tensor_fini(&b);
	pt_tensor_fini(&back);
	pt_tensor_fini(&i32);
	pt_tensor_fini(&wrong);
}

/* A conversion is a host write into dst: like pt_tensor_write it must first
 * flush a queued op that writes dst, so the later (host) write wins. (Before
 * 8ff4d31 the queued fill ran at the flush and left 5, 5, 5, 5.) */
static void test_tensor_convert_after_queued_write(void)
{
	const float vals[4] = {1.0f, 2.0f, 3.0f, 4.0f};
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor f, h, dst;
	float out[4];

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	PT_CHECK_OK(pt_tensor_init(&f, PT_F32, 1, (int64_t[]){4}));
	PT_CHECK_OK(pt_tensor_init(&h, PT_F16, 1, (int64_t[]){4}));
	PT_CHECK_OK(pt_tensor_init(&dst, PT_F32, 1, (int64_t[]){4}));
	PT_CHECK_OK(pt_tensor_write(&f, vals, sizeof(vals)));
	PT_CHECK_OK(pt_tensor_convert(&h, &f));

	pt_deferred_begin(d);
	PT_CHECK_OK(pt_fill(&dst, 5.0)); /* queued: dst is PENDING */
	CU_ASSERT_EQUAL(pt_tensor_state(&dst), PT_PENDING);
	PT_CHECK_OK(pt_tensor_convert(&dst, &h)); /* then a host write of dst */
	PT_CHECK_OK(pt_deferred_end(d));
	PT_CHECK_OK(pt_tensor_read(&dst, out, sizeof(out)));
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(out[i], vals[i]);
	pt_tensor_fini(&f);
	pt_tensor_fini(&h);
	pt_tensor_fini(&dst);
}

/* ---- equal, item, errors ---- */

static void test_tensor_equal_and_item(void)
{
	pt_tensor a, b, at, c, d16, i64;
	bool eq = true;
	double v;

	iota_f32(&a, 2, (int64_t[]){2, 3});
	iota_f32(&b, 2, (int64_t[]){2, 3});
	PT_CHECK_OK(pt_tensor_equal(&a, &b, &eq));
	CU_ASSERT_TRUE(eq);
	float x = 7.0f;
	((float *)pt_tensor_data(&b))[4] = x;
	PT_CHECK_OK(pt_tensor_equal(&a, &b, &eq));
	CU_ASSERT_FALSE(eq);

	/* a transposed view equals a contiguous tensor with the same logical order */
	const float tv[6] = {0, 3, 1, 4, 2, 5};
	PT_CHECK_OK(pt_tensor_transpose(&at, &a, 0, 1));
	PT_CHECK_OK(pt_tensor_init(&c, PT_F32, 2, (int64_t[]){3, 2}));
	PT_CHECK_OK(pt_tensor_write(&c, tv, sizeof(tv)));
	PT_CHECK_OK(pt_tensor_equal(&at, &c, &eq));
	CU_ASSERT_TRUE(eq);
	PT_CHECK_OK(pt_tensor_equal(&a, &c, &eq)); /* same bytes, other shape */
	CU_ASSERT_FALSE(eq);
	PT_CHECK_OK(pt_tensor_init(&d16, PT_F16, 2, (int64_t[]){2, 3}));
	PT_CHECK_OK(pt_tensor_convert(&d16, &a));
	PT_CHECK_OK(pt_tensor_equal(&a, &d16, &eq)); /* other dtype */
	CU_ASSERT_FALSE(eq);

	/* item: row-major logical index through strides, any dtype */
	PT_CHECK_OK(pt_tensor_item(&at, 1, &v));
	CU_ASSERT_EQUAL(v, 3.0);
	PT_CHECK_OK(pt_tensor_item(&at, 5, &v));
	CU_ASSERT_EQUAL(v, 5.0);
	PT_CHECK_OK(pt_tensor_item(&d16, 5, &v));
	CU_ASSERT_EQUAL(v, 5.0);
	PT_CHECK_ERR(pt_tensor_item(&at, 6, &v), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_item(&at, -1, &v), PT_ERR_RANGE);
	const int64_t big[2] = {-3, INT64_C(1) << 53};
	PT_CHECK_OK(pt_tensor_init(&i64, PT_I64, 1, (int64_t[]){2}));
	PT_CHECK_OK(pt_tensor_write(&i64, big, sizeof(big)));
	PT_CHECK_OK(pt_tensor_item(&i64, 0, &v));
	CU_ASSERT_EQUAL(v, -3.0);
	PT_CHECK_OK(pt_tensor_item(&i64, 1, &v));
	CU_ASSERT_EQUAL(v, 9007199254740992.0);

	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
	pt_tensor_fini(&at);
	pt_tensor_fini(&c);
	pt_tensor_fini(&d16);
	pt_tensor_fini(&i64);
}

static void test_tensor_error_codes(void)
{
	pt_tensor t, v;
	pt_storage *s, *sl;
	float buf[4] = {0};

	PT_CHECK_ERR(pt_tensor_init(&t, PT_DTYPE_COUNT, 1, (int64_t[]){2}), PT_ERR_DTYPE);
	CU_ASSERT_PTR_NULL(t.storage);
	pt_tensor_fini(&t); /* safe after a failed init */
	PT_CHECK_ERR(pt_tensor_init(&t, PT_F32, 1, (int64_t[]){-1}), PT_ERR_SHAPE);
	PT_CHECK_ERR(pt_tensor_init(&t, PT_F32, PT_MAX_DIMS + 1, (int64_t[]){1, 1, 1, 1, 1, 1, 1}),
	             PT_ERR_SHAPE);
	PT_CHECK_ERR(pt_tensor_init(&t, PT_F32, 2, (int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40}),
	             PT_ERR_OVERFLOW);
	/* No values, but its strides would overflow (2^124). */
	PT_CHECK_ERR(
	    pt_tensor_init(&t, PT_F32, 3, (int64_t[]){0, INT64_C(1) << 62, INT64_C(1) << 62}),
	    PT_ERR_OVERFLOW);
	PT_CHECK_OK(pt_tensor_init(&t, PT_F32, 3, (int64_t[]){0, 1 << 20, 1 << 20}));
	CU_ASSERT_EQUAL(pt_tensor_numel(&t), 0);
	CU_ASSERT_EQUAL(t.strides[0], INT64_C(1) << 40);
	pt_tensor_fini(&t);

	PT_CHECK_OK(pt_storage_create(&s, 16, PT_CPU));
	PT_CHECK_ERR(pt_tensor_init_on(&t, s, 4, PT_F32, 1, (int64_t[]){4}), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_init_on(&t, s, 2, PT_F32, 1, (int64_t[]){1}), PT_ERR_INVALID);
	PT_CHECK_ERR(pt_tensor_init_on(&t, s, 0, PT_DTYPE_COUNT, 1, (int64_t[]){1}), PT_ERR_DTYPE);
	PT_CHECK_ERR(pt_storage_slice(&sl, s, 8, 9), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_storage_slice(&sl, s, 17, 0), PT_ERR_RANGE);
	CU_ASSERT_EQUAL(atomic_load(&s->refs), 1);
	PT_CHECK_ERR(pt_storage_create(&sl, 16, (pt_device){PT_DEV_CUDA, 0}), PT_ERR_UNSUPPORTED);
	CU_ASSERT_PTR_NULL(sl);
	PT_CHECK_OK(pt_tensor_init_on(&t, s, 0, PT_F32, 1, (int64_t[]){4}));
	pt_storage_release(s);
	PT_CHECK_ERR(pt_tensor_read(&t, buf, sizeof(buf) - 1), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_tensor_write(&t, buf, sizeof(buf) - 1), PT_ERR_RANGE);
	PT_CHECK_OK(pt_tensor_reshape(&v, &t, 2, (int64_t[]){2, 2}));
	pt_tensor_fini(&t);
	PT_CHECK_OK(pt_tensor_transpose(&t, &v, 0, 1));
	PT_CHECK_ERR(pt_tensor_write(&t, buf, sizeof(buf)), PT_ERR_INVALID);
	pt_tensor_fini(&t);
	pt_tensor_fini(&v);

	CU_ASSERT_EQUAL(pt_dtype_size(PT_BF16), 2);
	CU_ASSERT_EQUAL(pt_dtype_size(PT_I64), 8);
	CU_ASSERT_EQUAL(pt_dtype_size(PT_DTYPE_COUNT), 0);
	CU_ASSERT_STRING_EQUAL(pt_dtype_name(PT_F16), "f16");
	CU_ASSERT_STRING_EQUAL(pt_dtype_name(PT_DTYPE_COUNT), "?");
	CU_ASSERT_STRING_EQUAL(pt_err_name(PT_ERR_SHAPE), "PT_ERR_SHAPE");
	CU_ASSERT_STRING_EQUAL(pt_strerror(PT_ERR_COUNT), "unknown error");
}

/* ---- Philox4x32-10 ---- */

/* pt_philox(seed, stream, counter): counter words c0, c1 = counter (low,
 * high), c2, c3 = stream (low, high), key k0, k1 = seed (low, high). */
static void philox_kat(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                       const uint32_t want[4])
{
	uint32_t out[4];
	uint64_t counter = (uint64_t)c0 | (uint64_t)c1 << 32;
	uint64_t stream = (uint64_t)c2 | (uint64_t)c3 << 32;
	uint64_t seed = (uint64_t)k0 | (uint64_t)k1 << 32;
	pt_philox(seed, stream, counter, out);
	for (int i = 0; i < 4; i++) {
		if (out[i] != want[i])
			fprintf(stderr, "philox word %d: got 0x%08x, want 0x%08x\n", i, out[i],
			        want[i]);
		CU_ASSERT_EQUAL(out[i], want[i]);
	}
}

static void test_tensor_philox_known_answers(void)
{
	/* Random123 kat_vectors, philox4x32 with 10 rounds. */
	static const uint32_t zero[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
	static const uint32_t ones[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
	static const uint32_t pi[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
	philox_kat(0, 0, 0, 0, 0, 0, zero);
	philox_kat(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, ones);
	philox_kat(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, pi);
}

/* Large fills run on several threads (OpenMP) and give exactly the values of
 * one block at a time: Box-Muller pairs and uniform quadruples by counter,
 * whatever the thread count; the counter advances as for one thread. */
static void test_tensor_rng_parallel_fill_equals_serial(void)
{
	const int64_t n = (1 << 20) + 3;
	float *z = malloc(sizeof(float) * (size_t)n), *u = malloc(sizeof(float) * (size_t)n);
	int64_t bad = 0;
	pt_rng r;
	CU_ASSERT_FATAL(z != NULL && u != NULL);
	for (int threads = 1; threads <= 3; threads++) {
		pt_set_num_threads(threads);
		pt_rng_init(&r, 42, 9);
		r.counter = 5;
		pt_rng_normal(&r, z, n, 0.5f, 0.02f);
		CU_ASSERT_EQUAL(r.counter, 5 + (uint64_t)(n + 1) / 2);
		pt_rng_uniform(&r, u, n, -1.0f, 1.0f);
		CU_ASSERT_EQUAL(r.counter, 5 + (uint64_t)(n + 1) / 2 + (uint64_t)(n + 3) / 4);
		for (int64_t p = 0; p < (n + 1) / 2; p++) {
			uint32_t w[4];
			pt_philox(42, 9, 5 + (uint64_t)p, w);
			double u1 = ((double)w[0] + 1.0) / 4294967296.0,
			       u2 = (double)w[1] / 4294967296.0;
			double rad = sqrt(-2.0 * log(u1));
			bad +=
			    z[2 * p] != (float)(0.5 + (double)0.02f * rad * cos(2.0 * M_PI * u2));
			if (2 * p + 1 < n)
				bad += z[2 * p + 1] !=
				       (float)(0.5 + (double)0.02f * rad * sin(2.0 * M_PI * u2));
		}
		for (int64_t i = 0; i < n; i++) {
			uint32_t w[4];
			pt_philox(42, 9, 5 + (uint64_t)(n + 1) / 2 + (uint64_t)(i / 4), w);
			bad += u[i] != -1.0f + 2.0f * pt_u32_to_unit(w[i % 4]);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
	pt_rng_init(&r, 1, 1);
	pt_rng_normal(&r, z, 0, 0.0f, 1.0f);
	pt_rng_uniform(&r, u, -4, 0.0f, 1.0f);
	CU_ASSERT_EQUAL(r.counter, 0);
	pt_set_num_threads(pt_num_cores());
	free(z);
	free(u);
}

static void test_tensor_philox_streams(void)
{
	pt_rng r;
	uint32_t w[4];
	float u[7], u2[7];

	/* pt_rng_u32 takes word 0 of consecutive blocks */
	pt_rng_init(&r, 1234, 5);
	for (uint64_t k = 0; k < 3; k++) {
		pt_philox(1234, 5, k, w);
		CU_ASSERT_EQUAL(pt_rng_u32(&r), w[0]);
	}
	CU_ASSERT_EQUAL(r.counter, 3);

	/* uniform: four words per block, in [lo, hi), reproducible */
	pt_rng_init(&r, 99, 7);
	pt_rng_uniform(&r, u, 7, -2.0f, 3.0f);
	CU_ASSERT_EQUAL(r.counter, 2);
	for (int i = 0; i < 7; i++) {
		pt_philox(99, 7, (uint64_t)(i / 4), w);
		CU_ASSERT_EQUAL(u[i], -2.0f + 5.0f * pt_u32_to_unit(w[i % 4]));
		CU_ASSERT_TRUE(u[i] >= -2.0f && u[i] < 3.0f);
	}
	pt_rng_init(&r, 99, 8);
	pt_rng_uniform(&r, u2, 7, -2.0f, 3.0f);
	CU_ASSERT_NOT_EQUAL(memcmp(u, u2, sizeof(u)), 0); /* another stream differs */
	CU_ASSERT_EQUAL(pt_u32_to_unit(0), 0.0f);
	CU_ASSERT_TRUE(pt_u32_to_unit(0xffffffffu) < 1.0f);

	/* normal: finite, mean and spread roughly right over 4096 draws */
	static float z[4096];
	double m = 0.0, sq = 0.0;
	pt_rng_init(&r, 3, 0);
	pt_rng_normal(&r, z, 4096, 1.0f, 2.0f);
	for (int i = 0; i < 4096; i++) {
		CU_ASSERT_TRUE_FATAL(isfinite(z[i]));
		m += z[i];
		sq += (double)z[i] * z[i];
	}
	m /= 4096;
	sq = sq / 4096 - m * m;
	CU_ASSERT_DOUBLE_EQUAL(m, 1.0, 0.15);
	CU_ASSERT_DOUBLE_EQUAL(sqrt(sq), 2.0, 0.15);
}

static const pt_test_case refcount_tests[] = {
    {"test_tensor_refcount_views_outlive_original", test_tensor_refcount_views_outlive_original},
    {"test_tensor_refcount_view_and_slice", test_tensor_refcount_view_and_slice},
    {NULL, NULL},
};
/* pt_tensor_transfer on the host: a strided source is packed in order, sizes
 * and dtypes must agree, a device that is not there is refused. */
static void test_tensor_transfer_host(void)
{
	pt_tensor t, tv, dst, bad;
	const float want[6] = {0, 3, 1, 4, 2, 5};

	iota_f32(&t, 2, (int64_t[]){2, 3});
	PT_CHECK_OK(pt_tensor_transpose(&tv, &t, 0, 1));
	PT_CHECK_OK(pt_tensor_init_dev(&dst, PT_CPU, PT_F32, 2, (int64_t[]){3, 2}));
	CU_ASSERT_EQUAL(pt_tensor_device(&dst).kind, PT_DEV_CPU);
	PT_CHECK_OK(pt_tensor_transfer(&dst, &tv));
	CU_ASSERT_EQUAL(memcmp(pt_tensor_data(&dst), want, sizeof(want)), 0);
	PT_CHECK_OK(pt_tensor_init(&bad, PT_F32, 1, (int64_t[]){5}));
	PT_CHECK_ERR(pt_tensor_transfer(&bad, &t), PT_ERR_SHAPE);
	pt_tensor_fini(&bad);
	if (!pt_backend_available(PT_DEV_CUDA))
		PT_CHECK_ERR(pt_tensor_init_dev(&bad, (pt_device){PT_DEV_CUDA, 0}, PT_F32, 1,
		                                (int64_t[]){5}),
		             PT_ERR_UNSUPPORTED);
	pt_tensor_fini(&bad);
	pt_tensor_fini(&dst);
	pt_tensor_fini(&tv);
	pt_tensor_fini(&t);
}

/* A large contiguous copy (from 16 MiB, split between threads in
 * page-aligned pieces) gives the source's bytes on one thread and two, at a
 * size whose pieces do not divide evenly; an overlapping copy within one
 * storage (memmove, never split) gives what memmove gives. */
static void test_tensor_copy_large(void)
{
	enum { N = (4 << 20) + 1237, SHIFT = 1000 };
	pt_tensor a, b, over, src, dst;
	float *want = malloc(sizeof(float) * N);
	int prev = pt_get_num_threads();

	CU_ASSERT_PTR_NOT_NULL_FATAL(want);
	PT_CHECK_OK(pt_tensor_init(&a, PT_F32, 1, (int64_t[]){N}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_F32, 1, (int64_t[]){N}));
	for (int64_t i = 0; i < N; i++)
		pt_tensor_f32(&a)[i] = (float)(i * 2654435761u % 1000003u) - 5e5f;
	for (int t = 1; t <= 2; t++) {
		pt_set_num_threads(t);
		memset(pt_tensor_f32(&b), 0xff, sizeof(float) * N);
		PT_CHECK_OK(pt_copy(&b, &a));
		CU_ASSERT_EQUAL(memcmp(pt_tensor_f32(&b), pt_tensor_f32(&a), sizeof(float) * N), 0);
	}
	/* b[SHIFT..] = b[0..N-SHIFT): overlapping ranges of one storage. */
	PT_CHECK_OK(pt_tensor_init(&over, PT_F32, 1, (int64_t[]){N}));
	memcpy(want, pt_tensor_f32(&a), sizeof(float) * N);
	memmove(want + SHIFT, want, sizeof(float) * (N - SHIFT));
	memcpy(pt_tensor_f32(&over), pt_tensor_f32(&a), sizeof(float) * N);
	PT_CHECK_OK(pt_tensor_narrow(&src, &over, 0, 0, N - SHIFT));
	PT_CHECK_OK(pt_tensor_narrow(&dst, &over, 0, SHIFT, N - SHIFT));
	PT_CHECK_OK(pt_copy(&dst, &src));
	CU_ASSERT_EQUAL(memcmp(pt_tensor_f32(&over), want, sizeof(float) * N), 0);
	pt_set_num_threads(prev);
	pt_tensor_fini(&src);
	pt_tensor_fini(&dst);
	pt_tensor_fini(&over);
	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
	free(want);
}

static const pt_test_case view_tests[] = {
    {"test_tensor_views_shapes_and_errors", test_tensor_views_shapes_and_errors},
    {"test_tensor_read_transposed_order", test_tensor_read_transposed_order},
    {"test_tensor_transfer_host", test_tensor_transfer_host},
    {"test_tensor_copy_large", test_tensor_copy_large},
    {NULL, NULL},
};
static const pt_test_case convert_tests[] = {
    {"test_tensor_convert_bf16_known_values", test_tensor_convert_bf16_known_values},
    {"test_tensor_convert_f16_known_values", test_tensor_convert_f16_known_values},
    {"test_tensor_convert_tensors", test_tensor_convert_tensors},
    {"test_tensor_convert_after_queued_write", test_tensor_convert_after_queued_write},
    {NULL, NULL},
};
/* pt_storage_prefault brings every page of a mapped storage into memory
 * and changes no byte: written ones keep their values, the rest stay zero;
 * device-less, small (malloc'd) and NULL storages are left alone. */
static void test_tensor_storage_prefault(void)
{
	const size_t n = (size_t)40 << 20, page = (size_t)sysconf(_SC_PAGESIZE);
	size_t np = (n + page - 1) / page, in = 0, bad = 0;
	unsigned char *v = malloc(np), *d;
	pt_storage *s, *small;

	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	PT_CHECK_OK(pt_storage_create(&s, n, PT_CPU));
	PT_CHECK_OK(pt_storage_create(&small, 100, PT_CPU));
	pt_storage_prefault(NULL);
	pt_storage_prefault(small); /* malloc'd: nothing to do */
	if (s->mapped == 0) {
		printf("\n    skip: storages come from malloc in this build (AddressSanitizer)");
		goto out;
	}
	d = s->data;
	d[12345] = 7;
	d[n / 2] = 9;
	d[n - 1] = 11;
	pt_storage_prefault(s);
	CU_ASSERT_EQUAL_FATAL(mincore(d, n, v), 0);
	for (size_t i = 0; i < np; i++)
		in += v[i] & 1;
#ifdef MADV_POPULATE_WRITE
	if (in < np)
		printf("\n    skip: %zu of %zu pages in memory: no MADV_POPULATE_WRITE here", in,
		       np);
	else
		CU_ASSERT_EQUAL(in, np);
#endif
	for (size_t i = 0; i < n; i++)
		bad += d[i] != (i == 12345 ? 7 : i == n / 2 ? 9 : i == n - 1 ? 11 : 0);
	CU_ASSERT_EQUAL(bad, 0);
out:
	pt_storage_release(s);
	pt_storage_release(small);
	free(v);
}

static const pt_test_case access_tests[] = {
    {"test_tensor_equal_and_item", test_tensor_equal_and_item},
    {"test_tensor_error_codes", test_tensor_error_codes},
    {"test_tensor_storage_prefault", test_tensor_storage_prefault},
    {NULL, NULL},
};
/* pt_thread_buffer: 64-byte aligned, the same buffer while it is big
 * enough, its contents kept when it grows, one per slot and per thread, and
 * NULL for an unknown slot or a size that cannot be allocated. */
static void *other_thread_buffer(void *arg)
{
	(void)arg;
	return pt_thread_buffer(PT_SLOT_WATCH_POINTS, 100);
}

static void test_runtime_thread_buffer(void)
{
	unsigned char *a = pt_thread_buffer(PT_SLOT_WATCH_POINTS, 100), *b, *g;
	void *other = NULL;
	pthread_t th;

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_EQUAL((uintptr_t)a % 64, 0);
	for (int i = 0; i < 100; i++)
		a[i] = (unsigned char)i;
	CU_ASSERT_PTR_EQUAL(pt_thread_buffer(PT_SLOT_WATCH_POINTS, 64), a);
	b = pt_thread_buffer(PT_SLOT_WATCH_POINTS, 1 << 20);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL((uintptr_t)b % 64, 0);
	for (int i = 0; i < 100; i++)
		CU_ASSERT_EQUAL(b[i], (unsigned char)i);
	g = pt_thread_buffer(PT_SLOT_GEMM_OPERANDS, 100);
	CU_ASSERT_PTR_NOT_NULL(g);
	CU_ASSERT(g != b);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, other_thread_buffer, NULL), 0);
	pthread_join(th, &other);
	CU_ASSERT_PTR_NOT_NULL(other); /* its own, freed when that thread ended */
	CU_ASSERT(other != b);
	CU_ASSERT_PTR_NULL(pt_thread_buffer(PT_SLOT_COUNT, 8));
	CU_ASSERT_PTR_NULL(pt_thread_buffer(PT_SLOT_GEMM_OPERANDS, SIZE_MAX));
	CU_ASSERT_PTR_EQUAL(pt_thread_buffer(PT_SLOT_WATCH_POINTS, 10), b); /* kept */
}

static const pt_test_case rng_tests[] = {
    {"test_tensor_philox_known_answers", test_tensor_philox_known_answers},
    {"test_tensor_philox_streams", test_tensor_philox_streams},
    {"test_tensor_rng_parallel_fill_equals_serial", test_tensor_rng_parallel_fill_equals_serial},
    {"test_runtime_thread_buffer", test_runtime_thread_buffer},
    {NULL, NULL},
};

int main(void)
{
	static const pt_test_suite suites[] = {
	    {"test_tensor_refcount", refcount_tests}, {"test_tensor_views", view_tests},
	    {"test_tensor_convert", convert_tests},   {"test_tensor_access", access_tests},
	    {"test_tensor_rng", rng_tests},           {NULL, NULL},
	};
	return pt_test_main(suites);
}
