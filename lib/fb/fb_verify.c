/* fb_verify.c - schema-driven FlatBuffers verifier, stricter than flatc's.
 *
 * Every check that Google's Verifier (flatbuffers 2.0.8) makes is made here
 * too, so whatever it rejects we reject; on top we apply the flatcc rules
 * (see NOTES.md). Where we are stricter, on purpose:
 *  - the buffer start must be 4-aligned in memory (nng gives 4; anything less
 *    is a transport bug worth hearing about), and size >= 12;
 *  - offsets may not be 0 anywhere (Google does not check vector elements);
 *  - vtable size >= 4 (Google accepts 0 and 2) and table size >= 4;
 *  - a field lies inside its table's declared size, not just inside the buffer,
 *    and a field offset below 4 (overlapping the soffset) is refused;
 *  - element 0 of a vector is aligned to its element alignment (Google checks
 *    only 4), so 8-byte elements are 8-aligned from the buffer start;
 *  - a union value requires a known type and a known type requires a value
 *    (Google accepts unknown types and a type without value).
 * Alignment is measured from the buffer start, as flatc does; the 4-aligned
 * start then makes 4-byte alignment hold in memory as well.
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

/* in_range: [pos, pos + len) lies inside the buffer (64-bit, no overflow for
 * the 32-bit quantities involved). */
static bool in_range(const vctx *v, uint64_t pos, uint64_t len)
{
	return pos <= v->size && len <= v->size - pos;
}

static pt_err bad(const pt_fb_table_desc *t, const pt_fb_field_desc *f, uint64_t pos,
                  const char *what)
{
	return pt_set_error(PT_ERR_FORMAT, "flatbuffer: %s%s%s%s at byte %llu: %s",
	                    t ? "table " : "", t ? t->name : "", f ? " field " : "",
	                    f ? f->name : "", (unsigned long long)pos, what);
}

/* follow checks the uoffset at pos (4-aligned, inside, non-zero, target inside)
 * and returns its target. */
static pt_err follow(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                     uint64_t pos, uint64_t *target)
{
	uint32_t o;

	if ((pos & 3) != 0 || !in_range(v, pos, 4))
		return bad(t, f, pos, "offset misaligned or outside the buffer");
	o = rd32(v, pos);
	if (o == 0)
		return bad(t, f, pos, "zero offset");
	if (!in_range(v, pos + o, 1))
		return bad(t, f, pos, "offset points outside the buffer");
	*target = pos + o;
	return PT_OK;
}

/* vector_header checks the count at pos and that count * esize bytes follow
 * with element 0 aligned to ealign; returns the count. */
static pt_err vector_header(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                            uint64_t pos, uint32_t esize, uint32_t ealign, uint32_t *count)
{
	uint32_t n;

	if ((pos & 3) != 0 || !in_range(v, pos, 4))
		return bad(t, f, pos, "vector misaligned or outside the buffer");
	n = rd32(v, pos);
	if (!in_range(v, pos + 4, (uint64_t)n * esize))
		return bad(t, f, pos, "vector longer than the buffer");
	if (ealign > 4 && ((pos + 4) & (ealign - 1)) != 0)
		return bad(t, f, pos, "vector elements misaligned");
	*count = n;
	return PT_OK;
}

static pt_err verify_string(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                            uint64_t pos)
{
	uint32_t len = 0;

	PT_TRY(vector_header(v, t, f, pos, 1, 1, &len));
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
		return vector_header(v, t, f, target, f->size, f->align, &n);
	case PT_FB_VECTOR_STRING:
	case PT_FB_VECTOR_TABLE:
		PT_TRY(follow(v, t, f, fpos, &target));
		PT_TRY(vector_header(v, t, f, target, 4, 4, &n));
		for (uint32_t i = 0; i < n; i++) {
			uint64_t epos = target + 4 + 4 * (uint64_t)i, elem;
			PT_TRY(follow(v, t, f, epos, &elem));
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

/* field_slot returns the table-relative offset of field id (0 = absent) and
 * checks that size bytes there lie inside the table, aligned to align. */
static pt_err field_slot(const vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                         uint64_t pos, uint64_t vt, uint16_t vtsize, uint16_t tsize, uint16_t id,
                         uint32_t size, uint32_t align, uint16_t *off)
{
	uint32_t slot = 4u + 2u * id;

	*off = slot < vtsize ? rd16(v, vt + slot) : 0;
	if (*off == 0)
		return PT_OK;
	if (*off < 4 || (uint32_t)*off + size > tsize)
		return bad(t, f, pos, "field outside its table");
	if (((pos + *off) & (align - 1)) != 0)
		return bad(t, f, pos + *off, "field misaligned");
	return PT_OK;
}

static pt_err verify_union(vctx *v, const pt_fb_table_desc *t, const pt_fb_field_desc *f,
                           uint64_t pos, uint64_t vt, uint16_t vtsize, uint16_t tsize)
{
	const pt_fb_union_desc *u = f->un;
	uint16_t toff, voff;
	uint8_t type;
	uint64_t target;

	if (f->id >= 0xFFFF)
		return bad(t, f, pos, "bad union id in schema description");
	PT_TRY(field_slot(v, t, f, pos, vt, vtsize, tsize, f->id, 1, 1, &toff));
	PT_TRY(field_slot(v, t, f, pos, vt, vtsize, tsize, (uint16_t)(f->id + 1), 4, 4, &voff));
	type = toff ? v->buf[pos + toff] : 0;
	if (type == 0) {
		if (voff != 0)
			return bad(t, f, pos, "union value without a type");
		if (f->required)
			return bad(t, f, pos, "required union missing");
		return PT_OK;
	}
	if (type > u->count || u->members[type - 1] == NULL)
		return bad(t, f, pos, "unknown union type");
	if (voff == 0)
		return bad(t, f, pos, "union type without a value");
	PT_TRY(follow(v, t, f, pos + voff, &target));
	return verify_table(v, u->members[type - 1], target);
}

static pt_err verify_table(vctx *v, const pt_fb_table_desc *t, uint64_t pos)
{
	int64_t vt;
	uint16_t vtsize, tsize;
	int32_t soff;

	if ((pos & 3) != 0 || !in_range(v, pos, 4))
		return bad(t, NULL, pos, "table misaligned or outside the buffer");
	if (++v->depth > v->max_depth)
		return bad(t, NULL, pos, "tables nested too deep");
	if (++v->tables > v->max_tables)
		return bad(t, NULL, pos, "too many tables");
	soff = pt_fb_load_i32(v->buf + pos);
	vt = (int64_t)pos - soff;
	if (vt < 0 || (vt & 1) != 0 || !in_range(v, (uint64_t)vt, 4))
		return bad(t, NULL, pos, "vtable misaligned or outside the buffer");
	vtsize = rd16(v, (uint64_t)vt);
	tsize = rd16(v, (uint64_t)vt + 2);
	if (vtsize < 4 || (vtsize & 1) != 0 || !in_range(v, (uint64_t)vt, vtsize))
		return bad(t, NULL, (uint64_t)vt, "bad vtable size");
	if (tsize < 4 || !in_range(v, pos, tsize))
		return bad(t, NULL, pos, "bad table size");

	for (uint16_t i = 0; i < t->nfields; i++) {
		const pt_fb_field_desc *f = &t->fields[i];
		uint16_t off;

		if (f->kind == PT_FB_UNION) {
			PT_TRY(verify_union(v, t, f, pos, (uint64_t)vt, vtsize, tsize));
			continue;
		}
		if (f->kind == PT_FB_SCALAR) {
			if (f->size == 0 || f->align == 0 || (f->align & (f->align - 1)) != 0)
				return bad(t, f, pos, "bad scalar in schema description");
			PT_TRY(field_slot(v, t, f, pos, (uint64_t)vt, vtsize, tsize, f->id, f->size,
			                  f->align, &off));
			continue;
		}
		if (f->kind == PT_FB_VECTOR &&
		    (f->size == 0 || f->align == 0 || (f->align & (f->align - 1)) != 0))
			return bad(t, f, pos, "bad vector in schema description");
		PT_TRY(field_slot(v, t, f, pos, (uint64_t)vt, vtsize, tsize, f->id, 4, 4, &off));
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
