/* fb_verify.c - schema-driven FlatBuffers verifier with the verdicts of
 * Google's C++ Verifier (flatbuffers 2.0.8, verifier.h and the code flatc
 * generates): a buffer is accepted exactly when VerifyXBuffer accepts it.
 * tests/fb/verify_diff checks that over every builder's output and thousands
 * of mutations. What that means, check by check:
 *  - a range [pos, pos + len) is inside when len < size and pos <= size - len;
 *    alignment is measured from the buffer start;
 *  - an offset in a table field or the root is 4-aligned, inside, non-zero,
 *    below 2^31 and points inside; offsets that are vector elements are only
 *    followed (their target is then checked as a table or string);
 *  - a table is 4-aligned and inside; its vtable 2-aligned and inside, of even
 *    size (0 and 2 too); the table's own size is not used: a field need only
 *    lie inside the buffer (builders that share vtables between tables of
 *    different sizes, as python3-flatbuffers 2.0.8 does, rely on this);
 *  - scalar and struct fields are aligned to their alignment and inside;
 *  - a vector's length field is 4-aligned and its bytes inside (elements are
 *    not aligned beyond 4: read 8-byte ones with pt_fb_load_*); a string is
 *    also NUL-terminated inside;
 *  - a union value is verified when its type is a member we know; type NONE
 *    or a type beyond the schema's is accepted unverified (a decoder must
 *    refuse such a type before it reads the value);
 *  - required offsets and structs are present; depth and table count within opts.
 * On top, as an API precondition rather than a verdict on the bytes, the
 * buffer must start 4-aligned in memory (nng gives 4), so that 4-byte reads
 * are aligned in memory too.
 *
 * Work is bounded: each table visit is counted against max_tables and costs
 * O(fields + vector length); recursion is bounded by max_depth.
 */
#include "fb.h"

#define MIN_BUFFER_SIZE 12u /* root offset + soffset + vtable header, as flatc */
#define MAX_DEPTH_LIMIT 1024u

typedef struct vctx {
	const uint8_t *buf;
	uint64_t size;
	uint32_t depth;
	uint32_t max_depth;
	uint32_t tables;
	uint32_t max_tables;
} vctx;

static uint16_t rd16(const vctx *v, uint64_t pos)
{
	return pt_fb_load_u16(v->buf + pos);
}

static uint32_t rd32(const vctx *v, uint64_t pos)
{
	return pt_fb_load_u32(v->buf + pos);
}

/* in_range: [pos, pos + len) lies inside the buffer, as Verifier::Verify
 * decides it (len < size, so no range covers the whole buffer). */
static bool in_range(const vctx *v, uint64_t pos, uint64_t len)
{
	return len < v->size && pos <= v->size - len;
}

static pt_err bad(const pt_fb_table_desc *t, const pt_fb_field_desc *f, uint64_t pos,
                  const char *what)
{
	return pt_set_error(PT_ERR_FORMAT, "flatbuffer: %s%s%s%s at byte %llu: %s",
	                    t ? "table " : "", t ? t->name : "", f ? " field " : "",
	                    f ? f->name : "", (unsigned long long)pos, what);
}

/* follow checks the uoffset at pos as Verifier::VerifyOffset does (4-aligned,
 * inside, non-zero, below 2^31, pointing inside) and returns its target. */
static pt_err follow(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                     uint64_t pos, uint64_t *target)
{
	uint32_t o;

	if ((pos & 3) != 0 || !in_range(v, pos, 4))
		return bad(t, f, pos, "offset misaligned or outside the buffer");
	o = rd32(v, pos);
	if (o == 0)
		return bad(t, f, pos, "zero offset");
	if (o >= 0x80000000u)
		return bad(t, f, pos, "offset of 2 GiB or more");
	if (!in_range(v, pos + o, 1))
		return bad(t, f, pos, "offset points outside the buffer");
	*target = pos + o;
	return PT_OK;
}

/* element returns the target of vector element offset at pos: flatc follows
 * these unchecked and verifies only what they point to. */
static uint64_t element(const vctx *v, uint64_t pos)
{
	return pos + rd32(v, pos);
}

/* vector_header checks the vector at pos as VerifyVectorOrString does: its
 * length 4-aligned and inside, then 4 + count * esize bytes inside; returns
 * the count. */
static pt_err vector_header(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                            uint64_t pos, uint32_t esize, uint32_t *count)
{
	uint32_t n;

	if ((pos & 3) != 0 || !in_range(v, pos, 4))
		return bad(t, f, pos, "vector misaligned or outside the buffer");
	n = rd32(v, pos);
	if (n >= 0x7FFFFFFFu / esize || !in_range(v, pos, 4 + (uint64_t)n * esize))
		return bad(t, f, pos, "vector longer than the buffer");
	*count = n;
	return PT_OK;
}

static pt_err verify_string(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                            uint64_t pos)
{
	uint32_t len = 0;

	PT_TRY(vector_header(v, t, f, pos, 1, &len));
	if (!in_range(v, pos + 4 + len, 1) || v->buf[pos + 4 + len] != 0)
		return bad(t, f, pos, "string not NUL-terminated inside the buffer");
	return PT_OK;
}

static pt_err verify_table(vctx *v, const pt_fb_table_desc *t, uint64_t pos);

static pt_err verify_field(vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                           uint64_t fpos)
{
	uint64_t target;
	uint32_t n;

	switch (f->kind) {
	case PT_FB_STRING:
		PT_TRY(follow(v, t, f, fpos, &target));
		return verify_string(v, t, f, target);
	case PT_FB_VECTOR:
		PT_TRY(follow(v, t, f, fpos, &target));
		return vector_header(v, t, f, target, f->size, &n);
	case PT_FB_VECTOR_STRING:
	case PT_FB_VECTOR_TABLE:
		PT_TRY(follow(v, t, f, fpos, &target));
		PT_TRY(vector_header(v, t, f, target, 4, &n));
		for (uint32_t i = 0; i < n; i++) {
			uint64_t elem = element(v, target + 4 + 4 * (uint64_t)i);
			if (f->kind == PT_FB_VECTOR_STRING)
				PT_TRY(verify_string(v, t, f, elem));
			else
				PT_TRY(verify_table(v, f->table, elem));
		}
		return PT_OK;
	case PT_FB_TABLE:
		PT_TRY(follow(v, t, f, fpos, &target));
		return verify_table(v, f->table, target);
	default:
		return bad(t, f, fpos, "bad field kind in schema description");
	}
}

/* field_off returns the table-relative offset of field id (0 = absent), as
 * Table::GetOptionalFieldOffset reads it. */
static uint16_t field_off(const vctx *v, uint64_t vt, uint16_t vtsize, uint16_t id)
{
	uint32_t slot = 4u + 2u * id;
	return slot < vtsize ? rd16(v, vt + slot) : 0;
}

/* scalar_ok checks size bytes at pos + off (off != 0): aligned, inside. */
static pt_err scalar_ok(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                        uint64_t pos, uint16_t off, uint32_t size, uint32_t align)
{
	if (((pos + off) & (align - 1)) != 0)
		return bad(t, f, pos + off, "field misaligned");
	if (!in_range(v, pos + off, size))
		return bad(t, f, pos + off, "field outside the buffer");
	return PT_OK;
}

static pt_err verify_union(vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                           uint64_t pos, uint64_t vt, uint16_t vtsize)
{
	const pt_fb_union_desc *u = f->un;
	uint16_t toff, voff;
	uint8_t type = 0;
	uint64_t target;

	if (f->id >= 0xFFFF)
		return bad(t, f, pos, "bad union id in schema description");
	if ((toff = field_off(v, vt, vtsize, f->id)) != 0) {
		PT_TRY(scalar_ok(v, t, f, pos, toff, 1, 1));
		type = v->buf[pos + toff];
	}
	if ((voff = field_off(v, vt, vtsize, (uint16_t)(f->id + 1))) == 0)
		return f->required ? bad(t, f, pos, "required union missing") : PT_OK;
	PT_TRY(follow(v, t, f, pos + voff, &target));
	if (type == 0 || type > u->count)
		return PT_OK; /* NONE, or a member newer than this schema: not read */
	if (u->members[type - 1] == NULL)
		return bad(t, f, pos, "union member not accepted here");
	return verify_table(v, u->members[type - 1], target);
}

static pt_err verify_table(vctx *v, const pt_fb_table_desc *t, uint64_t pos)
{
	int64_t vt;
	uint16_t vtsize;
	int32_t soff;

	if ((pos & 3) != 0 || !in_range(v, pos, 4))
		return bad(t, NULL, pos, "table misaligned or outside the buffer");
	if (++v->depth > v->max_depth)
		return bad(t, NULL, pos, "tables nested too deep");
	if (++v->tables > v->max_tables)
		return bad(t, NULL, pos, "too many tables");
	soff = pt_fb_load_i32(v->buf + pos);
	vt = (int64_t)pos - soff;
	if (vt < 0 || (vt & 1) != 0 || !in_range(v, (uint64_t)vt, 2))
		return bad(t, NULL, pos, "vtable misaligned or outside the buffer");
	vtsize = rd16(v, (uint64_t)vt);
	if ((vtsize & 1) != 0 || !in_range(v, (uint64_t)vt, vtsize))
		return bad(t, NULL, (uint64_t)vt, "bad vtable size");

	for (uint16_t i = 0; i < t->nfields; i++) {
		const pt_fb_field_desc *f = &t->fields[i];
		uint16_t off;

		if (f->kind == PT_FB_UNION) {
			PT_TRY(verify_union(v, t, f, pos, (uint64_t)vt, vtsize));
			continue;
		}
		off = field_off(v, (uint64_t)vt, vtsize, f->id);
		if (f->kind == PT_FB_SCALAR) {
			if (f->size == 0 || f->align == 0 || (f->align & (f->align - 1)) != 0)
				return bad(t, f, pos, "bad scalar in schema description");
			if (off != 0)
				PT_TRY(scalar_ok(v, t, f, pos, off, f->size, f->align));
			if (off == 0 && f->required) /* a required struct */
				return bad(t, f, pos, "required field missing");
			continue;
		}
		if (f->kind == PT_FB_VECTOR && f->size == 0)
			return bad(t, f, pos, "bad vector in schema description");
		if (off == 0) {
			if (f->required)
				return bad(t, f, pos, "required field missing");
			continue;
		}
		PT_TRY(verify_field(v, t, f, pos + off));
	}
	v->depth--;
	return PT_OK;
}

pt_err pt_fb_verify(const void *buf, size_t size, const pt_fb_table_desc *root, const char *file_id,
                    const pt_fb_verify_opts *opts)
{
	vctx v;
	uint64_t root_pos = 0;

	if (buf == NULL || root == NULL)
		return pt_set_error(PT_ERR_INVALID, "flatbuffer: NULL buffer or schema");
	if (((uintptr_t)buf & 3) != 0)
		return pt_set_error(PT_ERR_FORMAT,
		                    "flatbuffer: buffer start %p is not 4-byte aligned", buf);
	if (size < MIN_BUFFER_SIZE || size > PT_FB_MAX_SIZE)
		return pt_set_error(PT_ERR_FORMAT, "flatbuffer: size %zu outside [%u, %u]", size,
		                    MIN_BUFFER_SIZE, PT_FB_MAX_SIZE);
	v.buf = buf;
	v.size = size;
	v.depth = 0;
	v.tables = 0;
	v.max_depth = opts && opts->max_depth ? opts->max_depth : PT_FB_VERIFY_DEFAULT_DEPTH;
	v.max_tables = opts && opts->max_tables ? opts->max_tables : PT_FB_VERIFY_DEFAULT_TABLES;
	if (v.max_depth > MAX_DEPTH_LIMIT)
		v.max_depth = MAX_DEPTH_LIMIT;
	if (file_id && memcmp(v.buf + 4, file_id, PT_FB_ID_LEN) != 0)
		return pt_set_error(PT_ERR_FORMAT,
		                    "flatbuffer: file identifier is not \"%.4s\" (table %s)",
		                    file_id, root->name);
	PT_TRY(follow(&v, NULL, NULL, 0, &root_pos));
	return verify_table(&v, root, root_pos);
}
