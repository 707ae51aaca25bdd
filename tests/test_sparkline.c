/* test_sparkline.c - pipeclient's sparkline renderer (client/sparkline.h):
 * exact UTF-8 output for plain, constant, NaN and infinite series, the width
 * window and a too-small output buffer. */
#include "pt_test.h"
#include "sparkline.h"

#include <math.h>

#define L1 "\xe2\x96\x81" /* U+2581, the lowest level */
#define L2 "\xe2\x96\x82"
#define L3 "\xe2\x96\x83"
#define L4 "\xe2\x96\x84"
#define L5 "\xe2\x96\x85"
#define L6 "\xe2\x96\x86"
#define L7 "\xe2\x96\x87"
#define L8 "\xe2\x96\x88" /* U+2588, the highest */

static char out[256];

static int render(const double *v, size_t n, int width)
{
	memset(out, 'x', sizeof(out));
	return sparkline_render(out, sizeof(out), v, n, width);
}

static void test_sparkline_levels(void)
{
	const double ramp[] = {0, 1, 2, 3, 4, 5, 6, 7};
	const double down[] = {2.5, 2.0, 1.5, 1.0};
	const double loss[] = {2.30, 1.10, 0.70, 0.45, 0.40, 0.31};

	CU_ASSERT_EQUAL(render(ramp, 8, 40), 8);
	CU_ASSERT_STRING_EQUAL(out, L1 L2 L3 L4 L5 L6 L7 L8);
	/* 2.5 -> 7, 2.0 -> 4.67 -> 5, 1.5 -> 2.33 -> 2, 1.0 -> 0 (levels 0-based). */
	CU_ASSERT_EQUAL(render(down, 4, 40), 4);
	CU_ASSERT_STRING_EQUAL(out, L8 L6 L3 L1);
	/* (x - 0.31) / 1.99 * 7: 7, 2.78, 1.37, 0.49, 0.32, 0. */
	CU_ASSERT_EQUAL(render(loss, 6, 40), 6);
	CU_ASSERT_STRING_EQUAL(out, L8 L4 L2 L1 L1 L1);
}

static void test_sparkline_constant(void)
{
	const double same[] = {0.5, 0.5, 0.5};
	const double one[] = {42};

	CU_ASSERT_EQUAL(render(same, 3, 10), 3);
	CU_ASSERT_STRING_EQUAL(out, L4 L4 L4);
	CU_ASSERT_EQUAL(render(one, 1, 10), 1);
	CU_ASSERT_STRING_EQUAL(out, L4);
}

static void test_sparkline_gaps(void)
{
	const double v[] = {NAN, 0, 1, INFINITY, 0.5, -INFINITY};
	const double nans[] = {NAN, NAN};
	const double lone[] = {NAN, 3, NAN};

	/* Gaps do not take part in the scale: 0 -> lowest, 1 -> highest. */
	CU_ASSERT_EQUAL(render(v, 6, 10), 6);
	CU_ASSERT_STRING_EQUAL(out, " " L1 L8 " " L5 " ");
	CU_ASSERT_EQUAL(render(nans, 2, 10), 2);
	CU_ASSERT_STRING_EQUAL(out, "  ");
	CU_ASSERT_EQUAL(render(lone, 3, 10), 3);
	CU_ASSERT_STRING_EQUAL(out, " " L4 " ");
}

static void test_sparkline_width(void)
{
	const double ramp[] = {0, 1, 2, 3, 4, 5, 6, 7};
	char small[8];

	/* The newest `width` values, scaled among themselves: 5, 6, 7. */
	CU_ASSERT_EQUAL(render(ramp, 8, 3), 3);
	CU_ASSERT_STRING_EQUAL(out, L1 L5 L8);
	CU_ASSERT_EQUAL(render(ramp, 8, 1), 1);
	CU_ASSERT_STRING_EQUAL(out, L4);
	CU_ASSERT_EQUAL(render(ramp, 8, 0), 0);
	CU_ASSERT_STRING_EQUAL(out, "");
	CU_ASSERT_EQUAL(render(ramp, 8, -5), 0);
	CU_ASSERT_STRING_EQUAL(out, "");
	CU_ASSERT_EQUAL(render(ramp, 0, 8), 0);
	CU_ASSERT_STRING_EQUAL(out, "");
	CU_ASSERT_EQUAL(render(NULL, 3, 8), 0);
	CU_ASSERT_STRING_EQUAL(out, "");

	/* 8 bytes hold two glyphs and the NUL, never a glyph cut in half. */
	memset(small, 'x', sizeof(small));
	CU_ASSERT_EQUAL(sparkline_render(small, sizeof(small), ramp, 8, 8), 2);
	CU_ASSERT_STRING_EQUAL(small, L1 L2);
	CU_ASSERT_EQUAL(sparkline_render(small, 1, ramp, 8, 8), 0);
	CU_ASSERT_EQUAL(small[0], '\0');
	CU_ASSERT_EQUAL(sparkline_render(NULL, 0, ramp, 8, 8), 0);
}

int main(void)
{
	static const pt_test_case tests[] = {{"test_sparkline_levels", test_sparkline_levels},
	                                     {"test_sparkline_constant", test_sparkline_constant},
	                                     {"test_sparkline_gaps", test_sparkline_gaps},
	                                     {"test_sparkline_width", test_sparkline_width},
	                                     {NULL, NULL}};
	static const pt_test_suite suites[] = {{"sparkline", tests}, {NULL, NULL}};

	return pt_test_main(suites);
}
