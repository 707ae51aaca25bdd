/* test_fb.c - tests of lib/fb: builder, reader, verifier, interop with flatc.
 *
 * The schema is tests/fb/monster.fbs, described below as pt_fb_table_desc data.
 * Interop runs the real `flatc` (JSON -> binary -> our reader; our builder ->
 * flatc --json); the cross-check runs tests/fb/refverify (Google's C++
 * VerifyMonsterBuffer, built next to this program as fb/refverify, or named by
 * PT_FB_REFVERIFY) on thousands of valid, truncated, corrupted and hostile
 * buffers. Tests that need flatc or the helper print a skip note and pass when
 * those are missing.
 */
#include "fb.h"
#include "pt_test.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------ schema description -- */

enum { W_NAME, W_DAMAGE };
enum { S_ARMOR, S_WEIGHT };
enum {
	M_POS,
	M_U8,
	M_I8,
	M_FLAG,
	M_U16,
	M_I16,
	M_U32,
	M_I32,
	M_U64,
	M_I64,
	M_F32,
	M_F64,
	M_NAME,
	M_INVENTORY,
	M_SCORES,
	M_BIGS,
	M_WEIGHTS,
	M_TAGS,
	M_WEAPONS,
	M_ENEMY,
	M_EQUIPPED, /* the union's type; its value is M_EQUIPPED + 1 */
	M_EQUIPPED_VALUE,
	M_COLOR,
	M_SHORTS,
};
enum { EQ_NONE, EQ_WEAPON, EQ_SHIELD };
enum { COLOR_RED, COLOR_GREEN, COLOR_BLUE };

static const pt_fb_field_desc weapon_fields[] = {
    PT_FB_FIELD_STRING(W_NAME, "name", false),
    PT_FB_FIELD_SCALAR(W_DAMAGE, "damage", 2),
};
static const pt_fb_table_desc weapon_desc = PT_FB_TABLE_DESC("Weapon", weapon_fields);

static const pt_fb_field_desc shield_fields[] = {
    PT_FB_FIELD_SCALAR(S_ARMOR, "armor", 4),
    PT_FB_FIELD_SCALAR(S_WEIGHT, "weight", 8),
};
static const pt_fb_table_desc shield_desc = PT_FB_TABLE_DESC("Shield", shield_fields);

static const pt_fb_table_desc *const equipment_members[] = {&weapon_desc, &shield_desc};
static const pt_fb_union_desc equipment_desc = {"Equipment", 2, equipment_members};

static const pt_fb_table_desc monster_desc; /* recursive: Monster.enemy */
static const pt_fb_field_desc monster_fields[] = {
    PT_FB_FIELD_STRUCT(M_POS, "pos", 12, 4),
    PT_FB_FIELD_SCALAR(M_U8, "u8v", 1),
    PT_FB_FIELD_SCALAR(M_I8, "i8v", 1),
    PT_FB_FIELD_SCALAR(M_FLAG, "flag", 1),
    PT_FB_FIELD_SCALAR(M_U16, "u16v", 2),
    PT_FB_FIELD_SCALAR(M_I16, "i16v", 2),
    PT_FB_FIELD_SCALAR(M_U32, "u32v", 4),
    PT_FB_FIELD_SCALAR(M_I32, "i32v", 4),
    PT_FB_FIELD_SCALAR(M_U64, "u64v", 8),
    PT_FB_FIELD_SCALAR(M_I64, "i64v", 8),
    PT_FB_FIELD_SCALAR(M_F32, "f32v", 4),
    PT_FB_FIELD_SCALAR(M_F64, "f64v", 8),
    PT_FB_FIELD_STRING(M_NAME, "name", true),
    PT_FB_FIELD_VECTOR(M_INVENTORY, "inventory", 1, 1, false),
    PT_FB_FIELD_VECTOR(M_SCORES, "scores", 4, 4, false),
    PT_FB_FIELD_VECTOR(M_BIGS, "bigs", 8, 8, false),
    PT_FB_FIELD_VECTOR(M_WEIGHTS, "weights", 8, 8, false),
    PT_FB_FIELD_VECTOR_STRING(M_TAGS, "tags", false),
    PT_FB_FIELD_VECTOR_TABLE(M_WEAPONS, "weapons", &weapon_desc, false),
    PT_FB_FIELD_TABLE(M_ENEMY, "enemy", &monster_desc, false),
    PT_FB_FIELD_UNION(M_EQUIPPED, "equipped", &equipment_desc, false),
    PT_FB_FIELD_SCALAR(M_COLOR, "color", 1),
    PT_FB_FIELD_VECTOR(M_SHORTS, "shorts", 2, 2, false),
};
static const pt_fb_table_desc monster_desc = PT_FB_TABLE_DESC("Monster", monster_fields);

/* Schema defaults, as in monster.fbs. */
#define D_U8  7
#define D_I8  (-7)
#define D_U16 1000
#define D_I16 (-1000)
#define D_U32 100000u
#define D_I32 (-100000)
#define D_U64 10000000000ull
#define D_I64 (-10000000000ll)
#define D_F32 1.5f
#define D_F64 2.25

/* ----------------------------------------------------------- helpers -- */

static bool have_flatc(void)
{
	static int have = -1;
	if (have < 0)
		have = system("flatc --version >/dev/null 2>&1") == 0;
	if (!have)
		printf("\n  [skip: flatc not found on PATH] ");
	return have;
}

static int run_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_cmd(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	rc = system(cmd);
	if (rc != 0)
		fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
	return rc;
}

/* make_tmpdir creates a private temporary folder (removed by rm_tmpdir). */
static bool make_tmpdir(char *dir, size_t n)
{
	const char *base = getenv("TMPDIR");
	if (snprintf(dir, n, "%s/pt_fb_XXXXXX", base && *base ? base : "/tmp") >= (int)n)
		return false;
	return mkdtemp(dir) != NULL;
}

static void rm_tmpdir(const char *dir)
{
	run_cmd("rm -rf '%s'", dir);
}

/* read_file returns a malloc'd copy (16-byte aligned by malloc) and its size. */
static uint8_t *read_file(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	uint8_t *data = NULL;
	long n;

	if (f == NULL)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		data = malloc((size_t)n + 1);
		if (data && fread(data, 1, (size_t)n, f) != (size_t)n) {
			free(data);
			data = NULL;
		}
		if (data) {
			data[n] = 0;
			*size = (size_t)n;
		}
	}
	fclose(f);
	return data;
}

static bool write_file(const char *path, const void *data, size_t size)
{
	FILE *f = fopen(path, "wb");
	bool ok;

	if (f == NULL)
		return false;
	ok = fwrite(data, 1, size, f) == size;
	return fclose(f) == 0 && ok;
}

/* str_eq compares a read string with want; len is read through a pointer
 * because the getter that sets it is evaluated in the same call. */
static bool str_eq(const char *s, const uint32_t *len, const char *want)
{
	return s != NULL && *len == strlen(want) && memcmp(s, want, *len) == 0 && s[*len] == 0;
}

/* --------------------------------------------------- building samples -- */

typedef struct sample_opts {
	int chain;        /* monsters in the enemy chain, root included (>= 1) */
	uint8_t eq_type;  /* union member of the root */
	bool with_name;   /* leave out the required name when false */
	bool all_default; /* root has only its name */
} sample_opts;

static pt_err build_weapon(pt_fb_builder *b, const char *name, int16_t damage, pt_fb_ref *out)
{
	pt_fb_ref n = 0;
	if (name)
		PT_TRY(pt_fb_create_cstring(b, name, &n));
	PT_TRY(pt_fb_start_table(b));
	PT_TRY(pt_fb_add_offset(b, W_NAME, n));
	PT_TRY(pt_fb_add_i16(b, W_DAMAGE, damage, 5));
	return pt_fb_end_table(b, out);
}

/* build_sample builds the "sample" monster (values checked by check_sample and
 * by the flatc JSON test) and finishes the buffer. */
static pt_err build_sample(pt_fb_builder *b, const sample_opts *o, const uint8_t **data,
                           size_t *size)
{
	pt_fb_ref enemy = 0, name = 0, inv, scores, bigs, weights, tags, weapons, eq = 0, shorts;
	pt_fb_ref strs[3], ws[2], root;
	static const uint8_t inventory[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
	static const int32_t score_v[2] = {7, -7};
	static const uint64_t big_v[2] = {1ull << 63, 5};
	static const double weight_v[2] = {0.25, -8.5};
	static const int16_t short_v[2] = {-1, 300};
	static const float pos[3] = {1.5f, 2.5f, -3.5f};

	/* The enemy chain, innermost first: each link has a name and its enemy. */
	for (int i = o->chain - 1; i >= 1; i--) {
		char nm[16];
		pt_fb_ref n;
		snprintf(nm, sizeof(nm), "E%d", i);
		PT_TRY(pt_fb_create_cstring(b, nm, &n));
		PT_TRY(pt_fb_start_table(b));
		PT_TRY(pt_fb_add_offset(b, M_NAME, n));
		PT_TRY(pt_fb_add_offset(b, M_ENEMY, enemy));
		PT_TRY(pt_fb_end_table(b, &enemy));
	}
	if (o->with_name)
		PT_TRY(pt_fb_create_cstring(b, "Sample", &name));
	if (o->all_default) {
		PT_TRY(pt_fb_start_table(b));
		PT_TRY(pt_fb_add_offset(b, M_NAME, name));
		PT_TRY(pt_fb_end_table(b, &root));
		return pt_fb_finish(b, root, "MONS", data, size);
	}
	PT_TRY(pt_fb_create_vector(b, inventory, 10, 1, 0, &inv));
	PT_TRY(pt_fb_create_vector(b, score_v, 2, 4, 0, &scores));
	PT_TRY(pt_fb_create_vector(b, big_v, 2, 8, 0, &bigs));
	PT_TRY(pt_fb_create_vector(b, weight_v, 2, 8, 0, &weights));
	PT_TRY(pt_fb_create_vector(b, short_v, 2, 2, 0, &shorts));
	PT_TRY(pt_fb_create_cstring(b, "x", &strs[0]));
	PT_TRY(pt_fb_create_cstring(b, "yy", &strs[1]));
	PT_TRY(pt_fb_create_cstring(b, "", &strs[2]));
	PT_TRY(pt_fb_create_ref_vector(b, strs, 3, &tags));
	PT_TRY(build_weapon(b, "Sword", 12, &ws[0]));
	PT_TRY(build_weapon(b, "Dagger", 5, &ws[1]));
	PT_TRY(pt_fb_create_ref_vector(b, ws, 2, &weapons));
	if (o->eq_type == EQ_WEAPON) {
		PT_TRY(build_weapon(b, "Spear", 7, &eq));
	} else if (o->eq_type == EQ_SHIELD) {
		PT_TRY(pt_fb_start_table(b));
		PT_TRY(pt_fb_add_i32(b, S_ARMOR, 1, 10));
		PT_TRY(pt_fb_add_f64(b, S_WEIGHT, 0.125, 0.5));
		PT_TRY(pt_fb_end_table(b, &eq));
	}

	PT_TRY(pt_fb_start_table(b));
	PT_TRY(pt_fb_add_struct(b, M_POS, pos, sizeof(pos), 4));
	PT_TRY(pt_fb_add_u8(b, M_U8, 201, D_U8));
	PT_TRY(pt_fb_add_i8(b, M_I8, INT8_MIN, D_I8));
	PT_TRY(pt_fb_add_bool(b, M_FLAG, false, true));
	PT_TRY(pt_fb_add_u16(b, M_U16, UINT16_MAX, D_U16));
	PT_TRY(pt_fb_add_i16(b, M_I16, INT16_MIN, D_I16));
	PT_TRY(pt_fb_add_u32(b, M_U32, UINT32_MAX, D_U32));
	PT_TRY(pt_fb_add_i32(b, M_I32, INT32_MIN, D_I32));
	PT_TRY(pt_fb_add_u64(b, M_U64, UINT64_MAX, D_U64));
	PT_TRY(pt_fb_add_i64(b, M_I64, INT64_MIN, D_I64));
	PT_TRY(pt_fb_add_f32(b, M_F32, -0.375f, D_F32));
	PT_TRY(pt_fb_add_f64(b, M_F64, 12345.625, D_F64));
	PT_TRY(pt_fb_add_offset(b, M_NAME, name));
	PT_TRY(pt_fb_add_offset(b, M_INVENTORY, inv));
	PT_TRY(pt_fb_add_offset(b, M_SCORES, scores));
	PT_TRY(pt_fb_add_offset(b, M_BIGS, bigs));
	PT_TRY(pt_fb_add_offset(b, M_WEIGHTS, weights));
	PT_TRY(pt_fb_add_offset(b, M_TAGS, tags));
	PT_TRY(pt_fb_add_offset(b, M_WEAPONS, weapons));
	PT_TRY(pt_fb_add_offset(b, M_ENEMY, enemy));
	PT_TRY(pt_fb_add_union(b, M_EQUIPPED, o->eq_type, eq));
	PT_TRY(pt_fb_add_i8(b, M_COLOR, COLOR_GREEN, COLOR_BLUE));
	PT_TRY(pt_fb_add_offset(b, M_SHORTS, shorts));
	PT_TRY(pt_fb_end_table(b, &root));
	return pt_fb_finish(b, root, "MONS", data, size);
}

/* check_defaults asserts every scalar of t reads as its schema default. */
static void check_defaults(const uint8_t *t)
{
	CU_ASSERT_PTR_NULL(pt_fb_field(t, M_POS));
	CU_ASSERT_EQUAL(pt_fb_get_u8(t, M_U8, D_U8), D_U8);
	CU_ASSERT_EQUAL(pt_fb_get_i8(t, M_I8, D_I8), D_I8);
	CU_ASSERT_EQUAL(pt_fb_get_bool(t, M_FLAG, true), true);
	CU_ASSERT_EQUAL(pt_fb_get_u16(t, M_U16, D_U16), D_U16);
	CU_ASSERT_EQUAL(pt_fb_get_i16(t, M_I16, D_I16), D_I16);
	CU_ASSERT_EQUAL(pt_fb_get_u32(t, M_U32, D_U32), D_U32);
	CU_ASSERT_EQUAL(pt_fb_get_i32(t, M_I32, D_I32), D_I32);
	CU_ASSERT_EQUAL(pt_fb_get_u64(t, M_U64, D_U64), D_U64);
	CU_ASSERT_EQUAL(pt_fb_get_i64(t, M_I64, D_I64), D_I64);
	CU_ASSERT_EQUAL(pt_fb_get_f32(t, M_F32, D_F32), D_F32);
	CU_ASSERT_EQUAL(pt_fb_get_f64(t, M_F64, D_F64), D_F64);
	CU_ASSERT_EQUAL(pt_fb_get_i8(t, M_COLOR, COLOR_BLUE), COLOR_BLUE);
}

static void check_sample(const uint8_t *buf, const sample_opts *o)
{
	const uint8_t *t = pt_fb_root(buf), *v, *e;
	uint32_t n, len;
	uint8_t type;
	float pos[3];

	CU_ASSERT_TRUE(pt_fb_has_identifier(buf, 8, "MONS"));
	CU_ASSERT_TRUE(str_eq(pt_fb_get_string(t, M_NAME, &len), &len, "Sample"));
	if (o->all_default) {
		check_defaults(t);
		CU_ASSERT_PTR_NULL(pt_fb_get_vector(t, M_INVENTORY, &n));
		CU_ASSERT_EQUAL(n, 0);
		CU_ASSERT_PTR_NULL(pt_fb_get_union(t, M_EQUIPPED, &type));
		CU_ASSERT_EQUAL(type, EQ_NONE);
		return;
	}
	CU_ASSERT_PTR_NOT_NULL_FATAL(pt_fb_field(t, M_POS));
	memcpy(pos, pt_fb_field(t, M_POS), sizeof(pos));
	CU_ASSERT(pos[0] == 1.5f && pos[1] == 2.5f && pos[2] == -3.5f);
	CU_ASSERT_EQUAL(pt_fb_get_u8(t, M_U8, D_U8), 201);
	CU_ASSERT_EQUAL(pt_fb_get_i8(t, M_I8, D_I8), INT8_MIN);
	CU_ASSERT_EQUAL(pt_fb_get_bool(t, M_FLAG, true), false);
	CU_ASSERT_EQUAL(pt_fb_get_u16(t, M_U16, D_U16), UINT16_MAX);
	CU_ASSERT_EQUAL(pt_fb_get_i16(t, M_I16, D_I16), INT16_MIN);
	CU_ASSERT_EQUAL(pt_fb_get_u32(t, M_U32, D_U32), UINT32_MAX);
	CU_ASSERT_EQUAL(pt_fb_get_i32(t, M_I32, D_I32), INT32_MIN);
	CU_ASSERT_EQUAL(pt_fb_get_u64(t, M_U64, D_U64), UINT64_MAX);
	CU_ASSERT_EQUAL(pt_fb_get_i64(t, M_I64, D_I64), INT64_MIN);
	CU_ASSERT_EQUAL(pt_fb_get_f32(t, M_F32, D_F32), -0.375f);
	CU_ASSERT_EQUAL(pt_fb_get_f64(t, M_F64, D_F64), 12345.625);
	CU_ASSERT_EQUAL(pt_fb_get_i8(t, M_COLOR, COLOR_BLUE), COLOR_GREEN);

	v = pt_fb_get_vector(t, M_INVENTORY, &n);
	CU_ASSERT_EQUAL_FATAL(n, 10);
	for (uint32_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(v[i], i);
	v = pt_fb_get_vector(t, M_SCORES, &n);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT(pt_fb_load_i32(v) == 7 && pt_fb_load_i32(v + 4) == -7);
	v = pt_fb_get_vector(t, M_BIGS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT_EQUAL((v - buf) % 8, 0); /* 8-byte elements 8-aligned from the start */
	CU_ASSERT(pt_fb_load_u64(v) == 1ull << 63 && pt_fb_load_u64(v + 8) == 5);
	v = pt_fb_get_vector(t, M_WEIGHTS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT(pt_fb_load_f64(v) == 0.25 && pt_fb_load_f64(v + 8) == -8.5);
	v = pt_fb_get_vector(t, M_SHORTS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT(pt_fb_load_i16(v) == -1 && pt_fb_load_i16(v + 2) == 300);
	v = pt_fb_get_vector(t, M_TAGS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT_TRUE(str_eq(pt_fb_vec_string(v, 0, &len), &len, "x"));
	CU_ASSERT_TRUE(str_eq(pt_fb_vec_string(v, 1, &len), &len, "yy"));
	CU_ASSERT_TRUE(str_eq(pt_fb_vec_string(v, 2, &len), &len, ""));
	v = pt_fb_get_vector(t, M_WEAPONS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT_TRUE(
	    str_eq(pt_fb_get_string(pt_fb_vec_table(v, 0), W_NAME, &len), &len, "Sword"));
	CU_ASSERT_EQUAL(pt_fb_get_i16(pt_fb_vec_table(v, 0), W_DAMAGE, 5), 12);
	CU_ASSERT_TRUE(
	    str_eq(pt_fb_get_string(pt_fb_vec_table(v, 1), W_NAME, &len), &len, "Dagger"));
	CU_ASSERT_PTR_NULL(pt_fb_field(pt_fb_vec_table(v, 1), W_DAMAGE)); /* default elided */
	CU_ASSERT_EQUAL(pt_fb_get_i16(pt_fb_vec_table(v, 1), W_DAMAGE, 5), 5);

	e = pt_fb_get_union(t, M_EQUIPPED, &type);
	CU_ASSERT_EQUAL(type, o->eq_type);
	if (o->eq_type == EQ_WEAPON) {
		CU_ASSERT_TRUE(str_eq(pt_fb_get_string(e, W_NAME, &len), &len, "Spear"));
		CU_ASSERT_EQUAL(pt_fb_get_i16(e, W_DAMAGE, 5), 7);
	} else if (o->eq_type == EQ_SHIELD) {
		CU_ASSERT_EQUAL(pt_fb_get_i32(e, S_ARMOR, 10), 1);
		CU_ASSERT_EQUAL(pt_fb_get_f64(e, S_WEIGHT, 0.5), 0.125);
	} else {
		CU_ASSERT_PTR_NULL(e);
	}
	/* The chain: E1 .. E(chain-1), each with defaults. */
	e = pt_fb_get_table(t, M_ENEMY);
	for (int i = 1; i < o->chain; i++) {
		char nm[16];
		CU_ASSERT_PTR_NOT_NULL_FATAL(e);
		snprintf(nm, sizeof(nm), "E%d", i);
		CU_ASSERT_TRUE(str_eq(pt_fb_get_string(e, M_NAME, &len), &len, nm));
		check_defaults(e);
		e = pt_fb_get_table(e, M_ENEMY);
	}
	CU_ASSERT_PTR_NULL(e);
}

/* ----------------------------------------------------------- builder -- */

static void test_fb_builder_roundtrip(void)
{
	static const sample_opts cases[] = {
	    {1, EQ_WEAPON, true, false},
	    {3, EQ_SHIELD, true, false},
	    {2, EQ_NONE, true, false},
	    {1, EQ_NONE, true, true},
	};
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;

	PT_CHECK_OK(pt_fb_builder_init(&b, 64));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		pt_fb_builder_reset(&b);
		PT_CHECK_OK(build_sample(&b, &cases[i], &data, &size));
		/* Padded to the largest alignment: 8 once a u64/f64 is in. */
		CU_ASSERT_EQUAL(size % (cases[i].all_default ? 4 : 8), 0);
		CU_ASSERT_EQUAL((uintptr_t)data % (cases[i].all_default ? 4 : 8), 0);
		PT_CHECK_OK(pt_fb_verify(data, size, &monster_desc, "MONS", NULL));
		check_sample(data, &cases[i]);
	}
	pt_fb_builder_fini(&b);
}

static void test_fb_builder_defaults(void)
{
	pt_fb_builder b;
	const uint8_t *data;
	size_t size_elided, size_forced;
	pt_fb_ref name, root;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	/* Adding the default leaves the field out... */
	PT_CHECK_OK(pt_fb_create_cstring(&b, "d", &name));
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_OK(pt_fb_add_offset(&b, M_NAME, name));
	PT_CHECK_OK(pt_fb_add_u64(&b, M_U64, D_U64, D_U64));
	PT_CHECK_OK(pt_fb_add_f32(&b, M_F32, D_F32, D_F32));
	PT_CHECK_OK(pt_fb_end_table(&b, &root));
	PT_CHECK_OK(pt_fb_finish(&b, root, NULL, &data, &size_elided));
	CU_ASSERT_FALSE(pt_fb_has_identifier(data, size_elided, "MONS"));
	PT_CHECK_OK(pt_fb_verify(data, size_elided, &monster_desc, NULL, NULL));
	PT_CHECK_ERR(pt_fb_verify(data, size_elided, &monster_desc, "MONS", NULL), PT_ERR_FORMAT);
	CU_ASSERT_PTR_NULL(pt_fb_field(pt_fb_root(data), M_U64));
	CU_ASSERT_PTR_NULL(pt_fb_field(pt_fb_root(data), M_F32));
	CU_ASSERT_EQUAL(pt_fb_get_u64(pt_fb_root(data), M_U64, D_U64), D_U64);

	/* ...the force variant writes it; -0.0 differs from a 0.0 default. */
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_create_cstring(&b, "d", &name));
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_OK(pt_fb_add_offset(&b, M_NAME, name));
	PT_CHECK_OK(pt_fb_force_u64(&b, M_U64, D_U64));
	PT_CHECK_OK(pt_fb_force_f32(&b, M_F32, D_F32));
	PT_CHECK_OK(pt_fb_add_f64(&b, M_F64, -0.0, 0.0));
	PT_CHECK_OK(pt_fb_end_table(&b, &root));
	PT_CHECK_OK(pt_fb_finish(&b, root, NULL, &data, &size_forced));
	PT_CHECK_OK(pt_fb_verify(data, size_forced, &monster_desc, NULL, NULL));
	CU_ASSERT_TRUE(size_forced > size_elided);
	CU_ASSERT_PTR_NOT_NULL(pt_fb_field(pt_fb_root(data), M_U64));
	CU_ASSERT_PTR_NOT_NULL(pt_fb_field(pt_fb_root(data), M_F32));
	CU_ASSERT_EQUAL(pt_fb_get_u64(pt_fb_root(data), M_U64, 0), D_U64);
	CU_ASSERT_EQUAL(pt_fb_get_f32(pt_fb_root(data), M_F32, 0), D_F32);
	CU_ASSERT_TRUE(signbit(pt_fb_get_f64(pt_fb_root(data), M_F64, 1.0)));
	pt_fb_builder_fini(&b);
}

static void test_fb_builder_misuse(void)
{
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;
	pt_fb_ref s, t;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	/* A field outside a table. */
	PT_CHECK_ERR(pt_fb_add_u8(&b, 1, 1, 0), PT_ERR_STATE);
	/* Errors are sticky: a valid call now returns the first error... */
	PT_CHECK_ERR(pt_fb_create_cstring(&b, "x", &s), PT_ERR_STATE);
	CU_ASSERT_EQUAL(s, 0);
	PT_CHECK_ERR(pt_fb_finish(&b, 4, NULL, &data, &size), PT_ERR_STATE);
	CU_ASSERT_PTR_NULL(data);
	/* ...until reset. */
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_ERR(pt_fb_create_cstring(&b, "inside", &s), PT_ERR_STATE);
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_ERR(pt_fb_start_table(&b), PT_ERR_STATE);
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_OK(pt_fb_force_u8(&b, 3, 1));
	PT_CHECK_ERR(pt_fb_force_u8(&b, 3, 2), PT_ERR_INVALID); /* same id twice */
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_ERR(pt_fb_force_u8(&b, 40000, 1), PT_ERR_RANGE);
	pt_fb_builder_reset(&b);
	PT_CHECK_ERR(pt_fb_create_vector(&b, "abc", 3, 1, 3, &s), PT_ERR_INVALID); /* align 3 */
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_ERR(pt_fb_add_offset(&b, 1, 1000), PT_ERR_INVALID); /* ref beyond the buffer */
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_ERR(pt_fb_add_union(&b, M_EQUIPPED, EQ_WEAPON, 0), PT_ERR_INVALID);
	/* Finished builders take nothing more. */
	pt_fb_builder_reset(&b);
	PT_CHECK_OK(pt_fb_create_cstring(&b, "n", &s));
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_OK(pt_fb_add_offset(&b, M_NAME, s));
	PT_CHECK_OK(pt_fb_end_table(&b, &t));
	PT_CHECK_OK(pt_fb_finish(&b, t, "MONS", &data, &size));
	PT_CHECK_ERR(pt_fb_start_table(&b), PT_ERR_STATE);
	pt_fb_builder_fini(&b);
	pt_fb_builder_fini(&b); /* twice is harmless */
	pt_fb_builder_fini(NULL);
}

/* Building into caller memory (as into an nng message body): the message ends
 * at the end of that memory, and overflowing it is a clean error. */
static void test_fb_builder_fixed(void)
{
	static const sample_opts o = {2, EQ_SHIELD, true, false};
	_Alignas(64) static uint8_t mem[4096];
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;

	PT_CHECK_OK(pt_fb_builder_init_fixed(&b, mem, sizeof(mem)));
	PT_CHECK_OK(build_sample(&b, &o, &data, &size));
	CU_ASSERT_PTR_EQUAL(data, mem + sizeof(mem) - size);
	CU_ASSERT_EQUAL(pt_fb_builder_capacity(&b), sizeof(mem));
	PT_CHECK_OK(pt_fb_verify(data, size, &monster_desc, "MONS", NULL));
	check_sample(data, &o);
	pt_fb_builder_fini(&b);

	PT_CHECK_OK(pt_fb_builder_init_fixed(&b, mem, 200));
	PT_CHECK_ERR(build_sample(&b, &o, &data, &size), PT_ERR_OVERFLOW);
	pt_fb_builder_fini(&b);
}

/* 1000 messages through one builder: after the first, nothing grows. */
static void test_fb_builder_reuse(void)
{
	pt_fb_builder b;
	const uint8_t *data;
	size_t size, cap = 0;
	uint8_t *mem = NULL;
	uint32_t slots_cap = 0, vtables_cap = 0;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	for (int i = 0; i < 1000; i++) {
		sample_opts o = {1 + i % 4, (uint8_t)(i % 3), true, false};
		pt_fb_builder_reset(&b);
		PT_CHECK_OK(build_sample(&b, &o, &data, &size));
		if (i == 3) { /* the largest message (chain 4) has been built once */
			cap = pt_fb_builder_capacity(&b);
			mem = b.mem;
			slots_cap = b.slots_cap;
			vtables_cap = b.vtables_cap;
		} else if (i > 3 && (pt_fb_builder_capacity(&b) != cap || b.mem != mem ||
		                     b.slots_cap != slots_cap || b.vtables_cap != vtables_cap)) {
			CU_FAIL("builder storage changed after warm-up");
			break;
		}
		if (i % 97 == 0) {
			PT_CHECK_OK(pt_fb_verify(data, size, &monster_desc, "MONS", NULL));
			check_sample(data, &o);
		}
	}
	CU_ASSERT_TRUE(cap > 0);
	pt_fb_builder_fini(&b);
}

/* A 64 MiB tensor payload reserved in the buffer and filled in place. */
static void test_fb_builder_zero_copy(void)
{
	const size_t n = 64u << 20;
	pt_fb_builder b;
	pt_fb_ref vec, name, root;
	const uint8_t *data, *v;
	uint8_t *payload;
	void *p;
	size_t size, cap;
	uint32_t count;
	bool same = true;

	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	PT_CHECK_OK(pt_fb_builder_reserve(&b, n + 4096));
	cap = pt_fb_builder_capacity(&b);
	PT_CHECK_OK(pt_fb_reserve_vector(&b, n, 1, 64, &p, &vec));
	payload = p;
	CU_ASSERT_EQUAL((uintptr_t)payload % 64, 0);
	for (size_t i = 0; i < n; i += 4096)
		memset(payload + i, (int)(i >> 12) & 0xFF, 4096);
	CU_ASSERT_PTR_EQUAL(pt_fb_vector_data(&b, vec), payload);
	PT_CHECK_OK(pt_fb_create_cstring(&b, "tensor", &name));
	PT_CHECK_OK(pt_fb_start_table(&b));
	PT_CHECK_OK(pt_fb_add_offset(&b, M_NAME, name));
	PT_CHECK_OK(pt_fb_add_offset(&b, M_INVENTORY, vec));
	PT_CHECK_OK(pt_fb_end_table(&b, &root));
	PT_CHECK_OK(pt_fb_finish(&b, root, "MONS", &data, &size));
	CU_ASSERT_EQUAL(pt_fb_builder_capacity(&b), cap); /* no regrowth, no copy */
	CU_ASSERT_EQUAL(size % 64, 0);
	PT_CHECK_OK(pt_fb_verify(data, size, &monster_desc, "MONS", NULL));
	v = pt_fb_get_vector(pt_fb_root(data), M_INVENTORY, &count);
	CU_ASSERT_EQUAL(count, n);
	CU_ASSERT_PTR_EQUAL(v, payload); /* read in place */
	CU_ASSERT_EQUAL((v - data) % 64, 0);
	for (size_t i = 0; i < n && same; i += 4096)
		same = v[i] == ((i >> 12) & 0xFF) && v[i + 4095] == ((i >> 12) & 0xFF);
	CU_ASSERT_TRUE(same);
	pt_fb_builder_fini(&b);
}

/* ------------------------------------------- interop A: flatc -> us -- */

static void check_full(const uint8_t *buf)
{
	const uint8_t *t = pt_fb_root(buf), *v, *w, *e;
	uint32_t n, len;
	uint8_t type;
	float pos[3];

	CU_ASSERT_PTR_NOT_NULL_FATAL(pt_fb_field(t, M_POS));
	memcpy(pos, pt_fb_field(t, M_POS), sizeof(pos));
	CU_ASSERT(pos[0] == 1.0f && pos[1] == -2.5f && pos[2] == 3.25f);
	CU_ASSERT_EQUAL(pt_fb_get_u8(t, M_U8, D_U8), 200);
	CU_ASSERT_EQUAL(pt_fb_get_i8(t, M_I8, D_I8), -100);
	CU_ASSERT_EQUAL(pt_fb_get_bool(t, M_FLAG, true), false);
	CU_ASSERT_EQUAL(pt_fb_get_u16(t, M_U16, D_U16), 65000);
	CU_ASSERT_EQUAL(pt_fb_get_i16(t, M_I16, D_I16), -32000);
	CU_ASSERT_EQUAL(pt_fb_get_u32(t, M_U32, D_U32), 4000000000u);
	CU_ASSERT_EQUAL(pt_fb_get_i32(t, M_I32, D_I32), -2000000000);
	CU_ASSERT_EQUAL(pt_fb_get_u64(t, M_U64, D_U64), 18000000000000000000ull);
	CU_ASSERT_EQUAL(pt_fb_get_i64(t, M_I64, D_I64), -9000000000000000000ll);
	CU_ASSERT_EQUAL(pt_fb_get_f32(t, M_F32, D_F32), -0.375f);
	CU_ASSERT_EQUAL(pt_fb_get_f64(t, M_F64, D_F64), 1e300);
	CU_ASSERT_TRUE(
	    str_eq(pt_fb_get_string(t, M_NAME, &len), &len, "Orc \"Grim\" of the North"));
	CU_ASSERT_EQUAL(pt_fb_get_i8(t, M_COLOR, COLOR_BLUE), COLOR_RED);

	v = pt_fb_get_vector(t, M_INVENTORY, &n);
	CU_ASSERT_EQUAL_FATAL(n, 5);
	CU_ASSERT(v[0] == 0 && v[1] == 1 && v[2] == 2 && v[3] == 254 && v[4] == 255);
	v = pt_fb_get_vector(t, M_SCORES, &n);
	CU_ASSERT_EQUAL_FATAL(n, 4);
	CU_ASSERT(pt_fb_load_i32(v) == -1 && pt_fb_load_i32(v + 4) == 0 &&
	          pt_fb_load_i32(v + 8) == INT32_MAX && pt_fb_load_i32(v + 12) == INT32_MIN);
	v = pt_fb_get_vector(t, M_BIGS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT(pt_fb_load_u64(v) == 1 && pt_fb_load_u64(v + 8) == UINT64_MAX &&
	          pt_fb_load_u64(v + 16) == 4294967296ull);
	v = pt_fb_get_vector(t, M_WEIGHTS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT(pt_fb_load_f64(v) == 0.5 && pt_fb_load_f64(v + 8) == -1.25 &&
	          pt_fb_load_f64(v + 16) == 1e-300);
	v = pt_fb_get_vector(t, M_SHORTS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT(pt_fb_load_i16(v) == 1 && pt_fb_load_i16(v + 2) == -2 &&
	          pt_fb_load_i16(v + 4) == 3);
	v = pt_fb_get_vector(t, M_TAGS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT_TRUE(str_eq(pt_fb_vec_string(v, 0, &len), &len, "alpha"));
	CU_ASSERT_TRUE(str_eq(pt_fb_vec_string(v, 1, &len), &len, ""));
	CU_ASSERT_TRUE(str_eq(pt_fb_vec_string(v, 2, &len), &len, "gamma delta"));

	v = pt_fb_get_vector(t, M_WEAPONS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	w = pt_fb_vec_table(v, 0);
	CU_ASSERT_TRUE(str_eq(pt_fb_get_string(w, W_NAME, &len), &len, "Axe"));
	CU_ASSERT_EQUAL(pt_fb_get_i16(w, W_DAMAGE, 5), 9);
	w = pt_fb_vec_table(v, 1);
	CU_ASSERT_TRUE(str_eq(pt_fb_get_string(w, W_NAME, &len), &len, "Bow"));
	CU_ASSERT_EQUAL(pt_fb_get_i16(w, W_DAMAGE, 5), 5);
	w = pt_fb_vec_table(v, 2);
	CU_ASSERT_PTR_NULL(pt_fb_get_string(w, W_NAME, &len));
	CU_ASSERT_EQUAL(len, 0);
	CU_ASSERT_EQUAL(pt_fb_get_i16(w, W_DAMAGE, 5), -3);

	e = pt_fb_get_union(t, M_EQUIPPED, &type);
	CU_ASSERT_EQUAL(type, EQ_SHIELD);
	CU_ASSERT_PTR_NOT_NULL_FATAL(e);
	CU_ASSERT_EQUAL(pt_fb_get_i32(e, S_ARMOR, 10), 33);
	CU_ASSERT_EQUAL(pt_fb_get_f64(e, S_WEIGHT, 0.5), 7.5);

	/* The enemy: name, i16v and a Weapon union; everything else default. */
	e = pt_fb_get_table(t, M_ENEMY);
	CU_ASSERT_PTR_NOT_NULL_FATAL(e);
	CU_ASSERT_TRUE(str_eq(pt_fb_get_string(e, M_NAME, &len), &len, "Goblin"));
	CU_ASSERT_EQUAL(pt_fb_get_i16(e, M_I16, D_I16), 42);
	CU_ASSERT_EQUAL(pt_fb_get_u8(e, M_U8, D_U8), D_U8);
	CU_ASSERT_EQUAL(pt_fb_get_u64(e, M_U64, D_U64), D_U64);
	CU_ASSERT_EQUAL(pt_fb_get_f64(e, M_F64, D_F64), D_F64);
	CU_ASSERT_EQUAL(pt_fb_get_bool(e, M_FLAG, true), true);
	CU_ASSERT_EQUAL(pt_fb_get_i8(e, M_COLOR, COLOR_BLUE), COLOR_BLUE);
	CU_ASSERT_PTR_NULL(pt_fb_get_table(e, M_ENEMY));
	CU_ASSERT_PTR_NULL(pt_fb_get_vector(e, M_TAGS, &n));
	w = pt_fb_get_union(e, M_EQUIPPED, &type);
	CU_ASSERT_EQUAL(type, EQ_WEAPON);
	CU_ASSERT_PTR_NOT_NULL_FATAL(w);
	CU_ASSERT_TRUE(str_eq(pt_fb_get_string(w, W_NAME, &len), &len, "Club"));
	CU_ASSERT_EQUAL(pt_fb_get_i16(w, W_DAMAGE, 5), 5);
}

static void check_minimal(const uint8_t *buf)
{
	const uint8_t *t = pt_fb_root(buf);
	uint32_t n, len;
	uint8_t type;

	CU_ASSERT_TRUE(str_eq(pt_fb_get_string(t, M_NAME, &len), &len, "Blob"));
	check_defaults(t);
	CU_ASSERT_PTR_NULL(pt_fb_get_vector(t, M_WEAPONS, &n));
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_PTR_NULL(pt_fb_get_table(t, M_ENEMY));
	CU_ASSERT_PTR_NULL(pt_fb_get_union(t, M_EQUIPPED, &type));
	CU_ASSERT_EQUAL(type, EQ_NONE);
}

/* flatc_binary runs `flatc -b` on fixture name.json into dir and loads the result. */
static uint8_t *flatc_binary(const char *dir, const char *name, size_t *size)
{
	char path[4200], schema[4096];

	/* pt_test_path returns a static buffer: one call per statement. */
	snprintf(schema, sizeof(schema), "%s", pt_test_path("tests/fb/monster.fbs"));
	if (run_cmd("flatc -b -o '%s' '%s' '%s/%s.json'", dir, schema, pt_test_path("tests/fb"),
	            name) != 0)
		return NULL;
	snprintf(path, sizeof(path), "%s/%s.bin", dir, name);
	return read_file(path, size);
}

static void test_fb_interop_flatc_to_c(void)
{
	char dir[4096];
	uint8_t *full, *minimal;
	size_t full_size = 0, minimal_size = 0;

	if (!have_flatc())
		return;
	CU_ASSERT_TRUE_FATAL(make_tmpdir(dir, sizeof(dir)));
	full = flatc_binary(dir, "full", &full_size);
	minimal = flatc_binary(dir, "minimal", &minimal_size);
	rm_tmpdir(dir);
	CU_ASSERT_PTR_NOT_NULL_FATAL(full);
	CU_ASSERT_PTR_NOT_NULL_FATAL(minimal);
	CU_ASSERT_TRUE(pt_fb_has_identifier(full, full_size, "MONS"));
	PT_CHECK_OK(pt_fb_verify(full, full_size, &monster_desc, "MONS", NULL));
	check_full(full);
	PT_CHECK_OK(pt_fb_verify(minimal, minimal_size, &monster_desc, "MONS", NULL));
	check_minimal(minimal);
	free(full);
	free(minimal);
}

/* ------------------------------------------- interop B: us -> flatc -- */

/* squeeze removes JSON whitespace outside strings, so fields compare as text. */
static void squeeze(char *s)
{
	char *w = s;
	bool in_str = false;

	for (char *r = s; *r; r++) {
		if (in_str) {
			*w++ = *r;
			if (*r == '\\' && r[1])
				*w++ = *++r;
			else if (*r == '"')
				in_str = false;
		} else if (*r == '"') {
			in_str = true;
			*w++ = *r;
		} else if (*r != ' ' && *r != '\n' && *r != '\t' && *r != '\r') {
			*w++ = *r;
		}
	}
	*w = 0;
}

/* flatc_json prints data (size bytes) with flatc --json into a malloc'd,
 * whitespace-free string. */
static char *flatc_json(const uint8_t *data, size_t size)
{
	char dir[4096], bin[4200], json[4200];
	char *text = NULL;
	size_t n;

	if (!make_tmpdir(dir, sizeof(dir)))
		return NULL;
	snprintf(bin, sizeof(bin), "%s/msg.bin", dir);
	snprintf(json, sizeof(json), "%s/msg.json", dir);
	if (write_file(bin, data, size) &&
	    run_cmd("flatc --json --strict-json --raw-binary --defaults-json -o '%s' '%s' -- '%s'",
	            dir, pt_test_path("tests/fb/monster.fbs"), bin) == 0)
		text = (char *)read_file(json, &n);
	rm_tmpdir(dir);
	if (text)
		squeeze(text);
	return text;
}

static void expect_json(const char *json, const char *const *want)
{
	for (; *want; want++) {
		if (strstr(json, *want) == NULL) {
			fprintf(stderr, "flatc JSON lacks %s\nin: %s\n", *want, json);
			CU_FAIL("flatc JSON lacks an expected field");
		}
	}
}

static void test_fb_interop_c_to_flatc(void)
{
	static const char *const want_sample[] = {
	    "\"pos\":{\"x\":1.5,\"y\":2.5,\"z\":-3.5}",
	    "\"u8v\":201,",
	    "\"i8v\":-128,",
	    "\"flag\":false,",
	    "\"u16v\":65535,",
	    "\"i16v\":-32768,",
	    "\"u32v\":4294967295,",
	    "\"i32v\":-2147483648,",
	    "\"u64v\":18446744073709551615,",
	    "\"i64v\":-9223372036854775808,",
	    "\"f32v\":-0.375,",
	    "\"f64v\":12345.625,",
	    "\"name\":\"Sample\"",
	    "\"inventory\":[0,1,2,3,4,5,6,7,8,9]",
	    "\"scores\":[7,-7]",
	    "\"bigs\":[9223372036854775808,5]",
	    "\"weights\":[0.25,-8.5]",
	    "\"tags\":[\"x\",\"yy\",\"\"]",
	    "\"weapons\":[{\"name\":\"Sword\",\"damage\":12},{\"name\":\"Dagger\",\"damage\":5}]",
	    "\"equipped_type\":\"Shield\",\"equipped\":{\"armor\":1,\"weight\":0.125}",
	    "\"color\":\"Green\"",
	    "\"shorts\":[-1,300]",
	    "\"enemy\":{\"u8v\":7,\"i8v\":-7,\"flag\":true,\"u16v\":1000,\"i16v\":-1000,"
	    "\"u32v\":100000,\"i32v\":-100000,\"u64v\":10000000000,\"i64v\":-10000000000,"
	    "\"f32v\":1.5,\"f64v\":2.25,\"name\":\"E1\",\"enemy\":{",
	    "\"name\":\"E2\"",
	    NULL,
	};
	static const char *const want_default[] = {
	    "{\"u8v\":7,\"i8v\":-7,\"flag\":true,\"u16v\":1000,\"i16v\":-1000,\"u32v\":100000,"
	    "\"i32v\":-100000,\"u64v\":10000000000,\"i64v\":-10000000000,\"f32v\":1.5,"
	    "\"f64v\":2.25,\"name\":\"Sample\",\"equipped_type\":\"NONE\",\"color\":\"Blue\"}",
	    NULL,
	};
	static const sample_opts full = {3, EQ_SHIELD, true, false};
	static const sample_opts dflt = {1, EQ_NONE, true, true};
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;
	char *json;

	if (!have_flatc())
		return;
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	PT_CHECK_OK(build_sample(&b, &full, &data, &size));
	json = flatc_json(data, size);
	CU_ASSERT_PTR_NOT_NULL_FATAL(json);
	expect_json(json, want_sample);
	CU_ASSERT_PTR_NULL(strstr(json, "\"name\":\"E3\"")); /* chain of 3 = root, E1, E2 */
	free(json);

	pt_fb_builder_reset(&b);
	PT_CHECK_OK(build_sample(&b, &dflt, &data, &size));
	json = flatc_json(data, size);
	CU_ASSERT_PTR_NOT_NULL_FATAL(json);
	expect_json(json, want_default);
	free(json);
	pt_fb_builder_fini(&b);
}

/* ------------------------------------------------ hostile and fuzzing -- */

/* verify_copy verifies a copy of data placed misalign bytes past a 16-byte
 * boundary in an exact-size allocation (so ASan sees any overread). */
static pt_err verify_copy(const uint8_t *data, size_t size, size_t misalign,
                          const pt_fb_verify_opts *opts)
{
	uint8_t *mem = malloc(size + misalign + 1);
	pt_err rv;

	if (mem == NULL)
		return PT_ERR_NOMEM;
	if (size)
		memcpy(mem + misalign, data, size);
	rv = pt_fb_verify(mem + misalign, size, &monster_desc, "MONS", opts);
	free(mem);
	return rv;
}

static uint32_t rd32(const uint8_t *p)
{
	return pt_fb_load_u32(p);
}

static void wr32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static void wr16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

/* A growable list of test buffers with what we expect of ours, if known. */
typedef struct frame {
	uint8_t *data;
	uint32_t size;
	uint8_t misalign;   /* our copy starts this many bytes past 4-alignment */
	const char *reason; /* hostile case: substring of our error, NULL otherwise */
} frame;

typedef struct corpus {
	frame *f;
	size_t n, cap;
} corpus;

static void corpus_add(corpus *c, const uint8_t *data, size_t size, uint8_t misalign,
                       const char *reason)
{
	if (c->n == c->cap) {
		size_t ncap = c->cap ? 2 * c->cap : 1024;
		frame *nf = realloc(c->f, ncap * sizeof(*nf));
		if (nf == NULL)
			return;
		c->f = nf;
		c->cap = ncap;
	}
	c->f[c->n].data = malloc(size ? size : 1);
	if (c->f[c->n].data == NULL)
		return;
	memcpy(c->f[c->n].data, data, size);
	c->f[c->n].size = (uint32_t)size;
	c->f[c->n].misalign = misalign;
	c->f[c->n].reason = reason;
	c->n++;
}

static void corpus_free(corpus *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->f[i].data);
	free(c->f);
}

/* Small deterministic PRNG (xorshift64*), so failures reproduce. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

/* mutate applies 1..4 random byte, word or length changes to buf in place and
 * returns the (possibly truncated) size. */
static size_t mutate(uint8_t *buf, size_t size)
{
	static const uint32_t words[] = {0,          1,          4,      0x7FFFFFFF, 0x80000000,
	                                 0xFFFFFFFF, 0xFFFFFFFC, 0xFFFF, 0x10000,    64};
	int k = 1 + (int)(rnd() % 4);

	for (int j = 0; j < k && size > 0; j++) {
		size_t pos = rnd() % size;
		switch (rnd() % 5) {
		case 0:
			buf[pos] = (uint8_t)rnd();
			break;
		case 1:
			buf[pos] ^= (uint8_t)(1u << (rnd() % 8));
			break;
		case 2:
			if (size >= 4) {
				pos = (rnd() % (size / 4)) * 4;
				wr32(buf + pos, words[rnd() % 10]);
			}
			break;
		case 3:
			if (size >= 4) {
				pos = (rnd() % (size / 4)) * 4;
				wr32(buf + pos, rd32(buf + pos) + (uint32_t)(rnd() % 17) - 8);
			}
			break;
		default:
			size = rnd() % (size + 1);
			break;
		}
	}
	return size;
}

/* walk reads every field a verified Monster has, the way a consumer would;
 * under ASan this proves verified buffers are safe to read. */
static uint64_t walk_weapon(const uint8_t *w, bool *ok)
{
	uint32_t len;
	const char *s = pt_fb_get_string(w, W_NAME, &len);
	if (s && s[len] != 0)
		*ok = false;
	return (uint64_t)pt_fb_get_i16(w, W_DAMAGE, 5) + len;
}

static uint64_t walk_monster(const uint8_t *t, bool *ok)
{
	uint64_t h = 0;
	uint32_t n, len;
	const uint8_t *v, *e;
	const char *s;
	uint8_t type;
	float pos[3] = {0, 0, 0};

	if (pt_fb_field(t, M_POS))
		memcpy(pos, pt_fb_field(t, M_POS), sizeof(pos));
	h += (uint64_t)pos[0] + pt_fb_get_u8(t, M_U8, 0) + (uint64_t)pt_fb_get_i8(t, M_I8, 0) +
	     pt_fb_get_bool(t, M_FLAG, 0) + pt_fb_get_u16(t, M_U16, 0) +
	     (uint64_t)pt_fb_get_i16(t, M_I16, 0) + pt_fb_get_u32(t, M_U32, 0) +
	     (uint64_t)pt_fb_get_i32(t, M_I32, 0) + pt_fb_get_u64(t, M_U64, 0) +
	     (uint64_t)pt_fb_get_i64(t, M_I64, 0) + (uint64_t)(pt_fb_get_f32(t, M_F32, 0) != 0) +
	     (uint64_t)(pt_fb_get_f64(t, M_F64, 0) != 0) + (uint64_t)pt_fb_get_i8(t, M_COLOR, 0);
	s = pt_fb_get_string(t, M_NAME, &len);
	if (s == NULL || s[len] != 0)
		*ok = false; /* required and terminated */
	v = pt_fb_get_vector(t, M_INVENTORY, &n);
	for (uint32_t i = 0; i < n; i++)
		h += v[i];
	v = pt_fb_get_vector(t, M_SCORES, &n);
	for (uint32_t i = 0; i < n; i++)
		h += (uint64_t)pt_fb_load_i32(v + 4 * i);
	v = pt_fb_get_vector(t, M_BIGS, &n);
	for (uint32_t i = 0; i < n; i++)
		h += pt_fb_load_u64(v + 8 * i);
	v = pt_fb_get_vector(t, M_WEIGHTS, &n);
	for (uint32_t i = 0; i < n; i++)
		h += pt_fb_load_f64(v + 8 * i) > 0;
	v = pt_fb_get_vector(t, M_SHORTS, &n);
	for (uint32_t i = 0; i < n; i++)
		h += (uint64_t)pt_fb_load_i16(v + 2 * i);
	v = pt_fb_get_vector(t, M_TAGS, &n);
	for (uint32_t i = 0; i < n; i++) {
		s = pt_fb_vec_string(v, i, &len);
		if (s[len] != 0)
			*ok = false;
		h += len;
	}
	v = pt_fb_get_vector(t, M_WEAPONS, &n);
	for (uint32_t i = 0; i < n; i++)
		h += walk_weapon(pt_fb_vec_table(v, i), ok);
	/* A consumer reads a union value only for a member it knows, and only
	 * when present: the verifier, as Google's, accepts an unknown type or a
	 * type without a value and leaves them to it. */
	e = pt_fb_get_union(t, M_EQUIPPED, &type);
	if (type == EQ_WEAPON && e != NULL)
		h += walk_weapon(e, ok);
	else if (type == EQ_SHIELD && e != NULL)
		h += (uint64_t)pt_fb_get_i32(e, S_ARMOR, 0) + (pt_fb_get_f64(e, S_WEIGHT, 0) > 0);
	else if (type == EQ_NONE && e != NULL)
		*ok = false;
	e = pt_fb_get_table(t, M_ENEMY);
	if (e)
		h += walk_monster(e, ok);
	return h;
}

/* base_buffers fills bases with valid buffers: ours (several shapes, enemy
 * chains of 64 = the depth limit) and, when flatc is there, flatc's. */
static size_t base_buffers(uint8_t **bases, size_t *sizes, size_t max)
{
	static const sample_opts opts[] = {
	    {2, EQ_WEAPON, true, false},
	    {3, EQ_SHIELD, true, false},
	    {1, EQ_NONE, true, true},
	    {64, EQ_NONE, true, false},
	};
	pt_fb_builder b;
	const uint8_t *data;
	size_t size, n = 0;
	char dir[4096];

	if (pt_fb_builder_init(&b, 0) != PT_OK)
		return 0;
	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]) && n < max; i++) {
		pt_fb_builder_reset(&b);
		if (build_sample(&b, &opts[i], &data, &size) != PT_OK)
			continue;
		bases[n] = malloc(size);
		memcpy(bases[n], data, size);
		sizes[n++] = size;
	}
	pt_fb_builder_fini(&b);
	if (n + 2 <= max && system("flatc --version >/dev/null 2>&1") == 0 &&
	    make_tmpdir(dir, sizeof(dir))) {
		if ((bases[n] = flatc_binary(dir, "full", &sizes[n])) != NULL)
			n++;
		if ((bases[n] = flatc_binary(dir, "minimal", &sizes[n])) != NULL)
			n++;
		rm_tmpdir(dir);
	}
	return n;
}

/* field_pos returns the byte position of field id of the table at tpos. */
static size_t field_pos(const uint8_t *buf, size_t tpos, uint16_t id)
{
	const uint8_t *p = pt_fb_field(buf + tpos, id);
	return p ? (size_t)(p - buf) : 0;
}

/* add_hostile adds hand-made hostile buffers derived from the valid sample s,
 * each with the reason our verifier must give. */
static void add_hostile(corpus *c, const uint8_t *s, size_t size)
{
	uint8_t *m = malloc(size + 64);
	size_t root = rd32(s), vt = (size_t)((int64_t)root - pt_fb_load_i32(s + root));
	size_t inv = field_pos(s, root, M_INVENTORY), eqt = field_pos(s, root, M_EQUIPPED);
	size_t name = field_pos(s, root, M_NAME), wv = field_pos(s, root, M_WEAPONS);
	size_t inv_vec = inv + rd32(s + inv), name_str = name + rd32(s + name);
	size_t wvec = wv + rd32(s + wv);

	if (m == NULL || inv == 0 || eqt == 0 || name == 0 || wv == 0)
		goto out; /* the edits below need all these fields */

#define HOSTILE(reason, edit)                                                                      \
	do {                                                                                       \
		memcpy(m, s, size);                                                                \
		edit;                                                                              \
		corpus_add(c, m, size, 0, reason);                                                 \
	} while (0)
	HOSTILE("outside the buffer", wr32(m, (uint32_t)size + 100));
	HOSTILE("zero offset", wr32(m, 0));
	HOSTILE("2 GiB or more", wr32(m, 0xFFFFFFFC)); /* wraps to just before itself */
	HOSTILE("vector longer", wr32(m + inv_vec, 0x7FFFFFFF));
	HOSTILE("vector longer", wr32(m + inv_vec, 0xFFFFFFFF));
	HOSTILE("vector longer", wr32(m + inv_vec, (uint32_t)(size - inv_vec)));
	HOSTILE("vtable misaligned or outside", wr32(m + root, 0x7FFFFFF0));
	HOSTILE("vtable misaligned or outside", wr32(m + root, (uint32_t)(-(int32_t)size * 2)));
	HOSTILE("bad vtable size", wr16(m + vt, (uint16_t)(rd32(s + vt) & 0xFFFF) + 1));
	HOSTILE("bad vtable size", wr16(m + vt, 0xFFFE));
	HOSTILE("not NUL-terminated", m[name_str + 4 + rd32(s + name_str)] = 'x');
	HOSTILE("not NUL-terminated", wr32(m + name_str, (uint32_t)(size - name_str - 4)));
	HOSTILE("required field missing", wr16(m + vt + 4 + 2 * M_NAME, 0));
	HOSTILE("misaligned", wr32(m + wvec + 4, rd32(s + wvec + 4) + 2));
	HOSTILE("file identifier", m[4] = 'X');
#undef HOSTILE
	for (uint8_t k = 1; k < 4; k++)
		corpus_add(c, s, size, k, "not 4-byte aligned");
out:
	free(m);
}

/* add_odd adds buffers derived from s that look wrong but that Google's
 * Verifier accepts, so ours must too (reason NULL): a table size that does
 * not cover its fields (builders that share vtables between tables of
 * different sizes write this), an unknown union type, a union value without
 * a type, and a vector element offset of 0 (followed to the element itself).
 * Returns how many it added. */
static size_t add_odd(corpus *c, const uint8_t *s, size_t size)
{
	uint8_t *m = malloc(size + 64);
	size_t root = rd32(s), vt = (size_t)((int64_t)root - pt_fb_load_i32(s + root));
	size_t eqt = field_pos(s, root, M_EQUIPPED), wv = field_pos(s, root, M_WEAPONS);
	size_t wvec = wv + rd32(s + wv), n0 = c->n;

	if (m == NULL || eqt == 0 || wv == 0)
		goto out;
#define ODD(edit)                                                                                  \
	do {                                                                                       \
		memcpy(m, s, size);                                                                \
		edit;                                                                              \
		corpus_add(c, m, size, 0, NULL);                                                   \
	} while (0)
	ODD(wr16(m + vt + 2, 0));
	ODD(wr16(m + vt + 2, 4));
	ODD(m[eqt] = 3);
	ODD(m[eqt] = 0);
	ODD(wr32(m + wvec + 4, 0));
#undef ODD
out:
	free(m);
	return c->n - n0;
}

/* add_built_hostile adds buffers our builder makes that break the schema. */
static void add_built_hostile(corpus *c)
{
	static const sample_opts deep65 = {65, EQ_NONE, true, false};
	static const sample_opts deep200 = {200, EQ_WEAPON, true, false};
	static const sample_opts noname = {1, EQ_WEAPON, false, false};
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;
	pt_fb_ref r, w;

	if (pt_fb_builder_init(&b, 0) != PT_OK)
		return;
	if (build_sample(&b, &deep65, &data, &size) == PT_OK)
		corpus_add(c, data, size, 0, "nested too deep");
	pt_fb_builder_reset(&b);
	if (build_sample(&b, &deep200, &data, &size) == PT_OK)
		corpus_add(c, data, size, 0, "nested too deep");
	pt_fb_builder_reset(&b);
	if (build_sample(&b, &noname, &data, &size) == PT_OK)
		corpus_add(c, data, size, 0, "required field missing");
	/* A union type with no value: Google accepts it, so must we (no reason). */
	pt_fb_builder_reset(&b);
	if (pt_fb_create_cstring(&b, "u", &r) == PT_OK && pt_fb_start_table(&b) == PT_OK &&
	    pt_fb_add_offset(&b, M_NAME, r) == PT_OK &&
	    pt_fb_force_u8(&b, M_EQUIPPED, EQ_SHIELD) == PT_OK &&
	    pt_fb_end_table(&b, &r) == PT_OK && pt_fb_finish(&b, r, "MONS", &data, &size) == PT_OK)
		corpus_add(c, data, size, 0, NULL);
	/* A nested enemy without its required name. */
	pt_fb_builder_reset(&b);
	if (pt_fb_start_table(&b) == PT_OK && pt_fb_end_table(&b, &w) == PT_OK &&
	    pt_fb_create_cstring(&b, "u", &r) == PT_OK && pt_fb_start_table(&b) == PT_OK &&
	    pt_fb_add_offset(&b, M_NAME, r) == PT_OK && pt_fb_add_offset(&b, M_ENEMY, w) == PT_OK &&
	    pt_fb_end_table(&b, &r) == PT_OK && pt_fb_finish(&b, r, "MONS", &data, &size) == PT_OK)
		corpus_add(c, data, size, 0, "required field missing");
	pt_fb_builder_fini(&b);
}

/* The hostile cases alone, without the reference helper. */
static void test_fb_verify_hostile(void)
{
	uint8_t *bases[8];
	size_t sizes[8], nb = base_buffers(bases, sizes, 8);
	corpus c = {0};
	pt_fb_verify_opts tight = {64, 3};

	CU_ASSERT_TRUE_FATAL(nb >= 4);
	for (size_t i = 0; i < nb; i++)
		PT_CHECK_OK(verify_copy(bases[i], sizes[i], 0, NULL));
	/* sample 0 has root, enemy, 2 weapons and a union member: 5 tables. */
	PT_CHECK_ERR(verify_copy(bases[0], sizes[0], 0, &tight), PT_ERR_FORMAT);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "too many tables"));
	tight.max_tables = 5;
	PT_CHECK_OK(verify_copy(bases[0], sizes[0], 0, &tight));
	PT_CHECK_ERR(pt_fb_verify(NULL, 0, &monster_desc, NULL, NULL), PT_ERR_INVALID);

	{
		corpus odd = {0};
		bool ok = true;
		CU_ASSERT_EQUAL(add_odd(&odd, bases[0], sizes[0]), 5);
		for (size_t i = 0; i < odd.n; i++) {
			uint8_t *copy = malloc(odd.f[i].size);
			CU_ASSERT_PTR_NOT_NULL_FATAL(copy);
			memcpy(copy, odd.f[i].data, odd.f[i].size);
			PT_CHECK_OK(pt_fb_verify(copy, odd.f[i].size, &monster_desc, "MONS", NULL));
			walk_monster(pt_fb_root(copy), &ok);
			free(copy);
		}
		CU_ASSERT_TRUE(ok);
		corpus_free(&odd);
	}
	add_hostile(&c, bases[0], sizes[0]);
	add_built_hostile(&c);
	CU_ASSERT_TRUE(c.n >= 20);
	for (size_t i = 0; i < c.n; i++) {
		pt_err rv = verify_copy(c.f[i].data, c.f[i].size, c.f[i].misalign, NULL);
		if (c.f[i].reason == NULL) { /* built, odd but accepted by Google */
			PT_CHECK_OK(rv);
			continue;
		}
		CU_ASSERT_EQUAL(rv, PT_ERR_FORMAT);
		if (rv != PT_ERR_FORMAT || strstr(pt_last_error(), c.f[i].reason) == NULL) {
			fprintf(stderr, "hostile case %zu: want \"%s\", got %s: %s\n", i,
			        c.f[i].reason, pt_err_name(rv), pt_last_error());
			CU_FAIL("hostile buffer not rejected for the expected reason");
		}
	}
	/* Truncations: the buffer's tail is alignment padding (up to 7 bytes) of
	 * the first object written; cutting into anything else is rejected, and
	 * acceptance is monotone in the length. */
	for (size_t i = 0; i < nb; i++) {
		bool accepted = false;
		for (size_t len = 0; len < sizes[i]; len++) {
			pt_err rv = verify_copy(bases[i], len, 0, NULL);
			if (rv == PT_OK && len + 8 <= sizes[i]) {
				fprintf(stderr, "base %zu truncated to %zu accepted\n", i, len);
				CU_FAIL("truncated buffer accepted");
			}
			if (rv != PT_OK && accepted)
				CU_FAIL("truncation acceptance not monotone");
			CU_ASSERT(rv == PT_OK || rv == PT_ERR_FORMAT);
			accepted = rv == PT_OK;
		}
	}
	corpus_free(&c);
	for (size_t i = 0; i < nb; i++)
		free(bases[i]);
}

/* 100k random mutations: the verifier never crashes (run under ASan too), and
 * whatever it accepts reads safely from end to end. */
static void test_fb_verify_fuzz(void)
{
	uint8_t *bases[8];
	size_t sizes[8], nb = base_buffers(bases, sizes, 8), accepted = 0;
	uint8_t *m = NULL, *copy;
	size_t maxsize = 0;
	bool ok = true;
	uint64_t h = 0;

	CU_ASSERT_TRUE_FATAL(nb >= 4);
	for (size_t i = 0; i < nb; i++)
		maxsize = sizes[i] > maxsize ? sizes[i] : maxsize;
	m = malloc(maxsize);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	for (int it = 0; it < 100000; it++) {
		size_t bi = rnd() % nb, size;
		memcpy(m, bases[bi], sizes[bi]);
		size = mutate(m, sizes[bi]);
		copy = malloc(size ? size : 1); /* exact size: ASan sees any overread */
		CU_ASSERT_PTR_NOT_NULL_FATAL(copy);
		memcpy(copy, m, size);
		if (pt_fb_verify(copy, size, &monster_desc, "MONS", NULL) == PT_OK) {
			accepted++;
			h += walk_monster(pt_fb_root(copy), &ok);
		} else if (pt_last_code() != PT_ERR_FORMAT) {
			ok = false;
		}
		free(copy);
	}
	printf("\n  fuzz: %zu of 100000 mutants accepted (walk hash %llx) ", accepted,
	       (unsigned long long)h);
	CU_ASSERT_TRUE(ok);
	CU_ASSERT_TRUE(accepted > 0); /* some mutations are harmless */
	free(m);
	for (size_t i = 0; i < nb; i++)
		free(bases[i]);
}

/* ------------------------------------- cross-check against Google's -- */

/* refverify_path finds the helper: $PT_FB_REFVERIFY, else fb/refverify next to
 * this executable in the build folder. */
static bool refverify_path(char *path, size_t n)
{
	const char *env = getenv("PT_FB_REFVERIFY");
	char self[2048];
	ssize_t k;
	char *slash;

	if (env && *env) {
		snprintf(path, n, "%s", env);
		return access(path, X_OK) == 0;
	}
	k = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (k <= 0)
		return false;
	self[k] = 0;
	slash = strrchr(self, '/');
	if (slash == NULL)
		return false;
	*slash = 0;
	snprintf(path, n, "%s/fb/refverify", self);
	return access(path, X_OK) == 0;
}

/* The one rule of ours Google does not have: the buffer's start in memory
 * (the corpus places some copies 1 to 3 bytes off; Google reads the bytes
 * from an aligned copy). On the bytes themselves the verdicts are equal. */
static const char *const stricter_reasons[] = {
    "not 4-byte aligned",
    NULL,
};

static bool is_stricter_reason(const char *msg)
{
	for (const char *const *r = stricter_reasons; *r; r++)
		if (strstr(msg, *r))
			return true;
	return false;
}

static void test_fb_verify_vs_google(void)
{
	char helper[4096], dir[4096], path[4200];
	uint8_t *bases[8], *m;
	size_t sizes[8], nb, maxsize = 0;
	corpus c = {0};
	FILE *f, *p;
	char *answers;
	size_t both_accept = 0, both_reject = 0, stricter = 0, looser = 0, bad_reason = 0;
	size_t valid_disagree = 0, reason_count[16] = {0};
	static const uint8_t byte_vals[] = {0x00, 0x01, 0x7F, 0x80, 0xFF};

	if (!refverify_path(helper, sizeof(helper))) {
		printf("\n  [skip: tests/fb/refverify not built (needs C++, libflatbuffers-dev, "
		       "flatc) and PT_FB_REFVERIFY unset] ");
		return;
	}
	nb = base_buffers(bases, sizes, 8);
	CU_ASSERT_TRUE_FATAL(nb >= 4);
	for (size_t i = 0; i < nb; i++) {
		size_t s = sizes[i];
		maxsize = s > maxsize ? s : maxsize;
		corpus_add(&c, bases[i], s, 0, NULL); /* valid: both must accept */
	}
	m = malloc(maxsize);
	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	for (size_t i = 0; i < nb; i++) {
		size_t s = sizes[i];
		for (size_t len = 0; len < s; len++) /* every truncation */
			corpus_add(&c, bases[i], len, 0, NULL);
		for (size_t pos = 0; pos < s; pos++) /* single-byte corruptions */
			for (size_t k = 0; k < sizeof(byte_vals); k++) {
				memcpy(m, bases[i], s);
				m[pos] = m[pos] == byte_vals[k] ? (uint8_t)~m[pos] : byte_vals[k];
				corpus_add(&c, m, s, 0, NULL);
			}
		for (size_t pos = 0; pos + 4 <= s; pos += 4) /* word corruptions */
			for (uint32_t d = 0; d < 3; d++) {
				static const uint32_t deltas[] = {4, (uint32_t)-4, 0x10000};
				memcpy(m, bases[i], s);
				wr32(m + pos, rd32(m + pos) + deltas[d]);
				corpus_add(&c, m, s, 0, NULL);
			}
		add_hostile(&c, bases[i], s);
		add_odd(&c, bases[i], s);
	}
	add_built_hostile(&c);
	for (int it = 0; it < 20000; it++) { /* random multi-mutations */
		size_t bi = rnd() % nb, s;
		memcpy(m, bases[bi], sizes[bi]);
		s = mutate(m, sizes[bi]);
		corpus_add(&c, m, s, 0, NULL);
	}
	free(m);

	CU_ASSERT_TRUE_FATAL(make_tmpdir(dir, sizeof(dir)));
	snprintf(path, sizeof(path), "%s/frames.bin", dir);
	f = fopen(path, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (size_t i = 0; i < c.n; i++) {
		uint32_t len = c.f[i].size;
		fputc('M', f); /* refverify_schema's tag for a Monster */
		fwrite(&len, 4, 1, f);
		fwrite(c.f[i].data, 1, len, f);
	}
	CU_ASSERT_EQUAL_FATAL(fclose(f), 0);
	{
		char cmd[8500];
		snprintf(cmd, sizeof(cmd), "'%s' '%s'", helper, path);
		p = popen(cmd, "r");
	}
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	answers = malloc(c.n + 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(answers);
	{
		size_t got = fread(answers, 1, c.n + 1, p);
		int rc = pclose(p);
		CU_ASSERT_EQUAL(rc, 0);
		CU_ASSERT_EQUAL_FATAL(got, c.n + 1);
	}
	rm_tmpdir(dir);

	for (size_t i = 0; i < c.n; i++) {
		bool google = answers[i] == '1';
		pt_err rv = verify_copy(c.f[i].data, c.f[i].size, c.f[i].misalign, NULL);
		bool ours = rv == PT_OK;

		if (google && ours) {
			both_accept++;
		} else if (!google && !ours) {
			both_reject++;
		} else if (google && !ours) {
			stricter++;
			if (i < nb)
				valid_disagree++;
			for (size_t r = 0; stricter_reasons[r]; r++)
				if (strstr(pt_last_error(), stricter_reasons[r])) {
					reason_count[r]++;
					break;
				}
			if (rv != PT_ERR_FORMAT || !is_stricter_reason(pt_last_error())) {
				if (bad_reason++ < 10)
					fprintf(stderr,
					        "frame %zu: Google accepts, we reject: %s\n", i,
					        pt_last_error());
			}
		} else {
			if (looser++ < 10)
				fprintf(stderr, "frame %zu (%u bytes): we accept, Google rejects\n",
				        i, c.f[i].size);
		}
		if (c.f[i].reason && ours) {
			fprintf(stderr, "hostile frame %zu accepted (want %s)\n", i, c.f[i].reason);
			CU_FAIL("hostile frame accepted");
		}
	}
	printf("\n  vs Google: %zu buffers, both accept %zu, both reject %zu, only we reject %zu"
	       " (permitted: misaligned in memory), only we accept %zu ",
	       c.n, both_accept, both_reject, stricter, looser);
	for (size_t r = 0; stricter_reasons[r]; r++)
		if (reason_count[r])
			printf("\n    only we reject, \"%s\": %zu", stricter_reasons[r],
			       reason_count[r]);
	printf("\n  ");
	CU_ASSERT_EQUAL(looser, 0);         /* (a) and (b) */
	CU_ASSERT_EQUAL(valid_disagree, 0); /* (c) */
	CU_ASSERT_EQUAL(bad_reason, 0);     /* stricter only by documented rules */
	CU_ASSERT_TRUE(both_accept > nb);
	CU_ASSERT_TRUE(both_reject > 1000);
	free(answers);
	corpus_free(&c);
	for (size_t i = 0; i < nb; i++)
		free(bases[i]);
}

static const pt_test_case builder_tests[] = {
    {"roundtrip", test_fb_builder_roundtrip},
    {"defaults", test_fb_builder_defaults},
    {"misuse", test_fb_builder_misuse},
    {"fixed_memory", test_fb_builder_fixed},
    {"reuse_1000", test_fb_builder_reuse},
    {"zero_copy_64mib", test_fb_builder_zero_copy},
    {NULL, NULL},
};
static const pt_test_case interop_tests[] = {
    {"flatc_json_to_c", test_fb_interop_flatc_to_c},
    {"c_to_flatc_json", test_fb_interop_c_to_flatc},
    {NULL, NULL},
};
static const pt_test_case verify_tests[] = {
    {"hostile", test_fb_verify_hostile},
    {"fuzz_100k", test_fb_verify_fuzz},
    {"vs_google_verifier", test_fb_verify_vs_google},
    {NULL, NULL},
};

int main(void)
{
	static const pt_test_suite suites[] = {
	    {"test_fb_builder", builder_tests},
	    {"test_fb_interop", interop_tests},
	    {"test_fb_verify", verify_tests},
	    {NULL, NULL},
	};
	return pt_test_main(suites);
}
