/* fb_builder.c - builds FlatBuffers back to front, the way flatc's FlatBufferBuilder does.
 *
 * The buffer grows down from the end of the storage, so every object is
 * complete before anything refers to it and offsets always point forward.
 * Alignment is kept relative to the END of the buffer; pt_fb_finish pads the
 * front so the total size is a multiple of the largest alignment used, which
 * makes every alignment hold from the buffer start too. Limits: tables do not
 * nest while open (create children first), vtables are deduplicated against
 * the last VT_DEDUP_WINDOW distinct ones, buffers stay below PT_FB_MAX_SIZE.
 */
#include "fb.h"

#include <stdlib.h>

#define DEFAULT_CAP     1024u
#define STORAGE_ALIGN   PT_FB_MAX_ALIGN
#define MAX_FIELD_ID    32763u /* vtable of 4 + 2 * 32764 bytes still fits a u16 */
#define VT_DEDUP_WINDOW 32u

static pt_err fail(pt_fb_builder *b, pt_err e)
{
	if (b->err == PT_OK)
		b->err = e;
	return e;
}

/* check_open: the sticky error, or PT_ERR_STATE when the builder is finished. */
static pt_err check_open(pt_fb_builder *b)
{
	if (b->err != PT_OK)
		return b->err;
	if (b->finished)
		return fail(b,
		            pt_set_error(PT_ERR_STATE, "fb builder: already finished; reset it"));
	return PT_OK;
}

static pt_err check_outside_table(pt_fb_builder *b, const char *what)
{
	PT_TRY(check_open(b));
	if (b->in_table)
		return fail(b, pt_set_error(PT_ERR_STATE,
		                            "fb builder: %s inside an open table; create it first",
		                            what));
	return PT_OK;
}

static void init_common(pt_fb_builder *b)
{
	memset(b, 0, sizeof(*b));
	b->minalign = 1;
}

pt_err pt_fb_builder_init(pt_fb_builder *b, size_t initial_cap)
{
	void *mem = NULL;

	init_common(b);
	if (initial_cap == 0)
		initial_cap = DEFAULT_CAP;
	if (initial_cap > PT_FB_MAX_SIZE)
		return pt_set_error(PT_ERR_OVERFLOW, "fb builder: capacity %zu over %u",
		                    initial_cap, PT_FB_MAX_SIZE);
	initial_cap = (initial_cap + STORAGE_ALIGN - 1) & ~(size_t)(STORAGE_ALIGN - 1);
	if (posix_memalign(&mem, STORAGE_ALIGN, initial_cap) != 0)
		return pt_set_error(PT_ERR_NOMEM, "fb builder: %zu bytes", initial_cap);
	b->mem = mem;
	b->cap = initial_cap;
	b->owned = true;
	return PT_OK;
}

pt_err pt_fb_builder_init_fixed(pt_fb_builder *b, void *mem, size_t cap)
{
	init_common(b);
	if (mem == NULL && cap != 0)
		return pt_set_error(PT_ERR_INVALID, "fb builder: NULL memory");
	if (cap > PT_FB_MAX_SIZE)
		return pt_set_error(PT_ERR_RANGE, "fb builder: fixed memory of %zu bytes over %u",
		                    cap, PT_FB_MAX_SIZE);
	b->mem = mem;
	b->cap = cap;
	b->owned = false;
	return PT_OK;
}

void pt_fb_builder_fini(pt_fb_builder *b)
{
	if (b == NULL)
		return;
	if (b->owned)
		free(b->mem);
	free(b->slots);
	free(b->vtables);
	init_common(b);
}

void pt_fb_builder_reset(pt_fb_builder *b)
{
	b->size = 0;
	b->minalign = 1;
	b->in_table = false;
	b->finished = false;
	b->err = PT_OK;
	b->table_start = 0;
	if (b->slots)
		memset(b->slots, 0, (size_t)b->slots_cap * sizeof(*b->slots));
	b->nslots = 0;
	b->nvtables = 0;
}

size_t pt_fb_builder_capacity(const pt_fb_builder *b)
{
	return b->cap;
}

static uint8_t *end_ptr(const pt_fb_builder *b)
{
	return b->mem + b->cap;
}

/* ensure makes room for n more bytes, moving the data to the end of a larger
 * owned storage when needed. */
static pt_err ensure(pt_fb_builder *b, size_t n)
{
	size_t need, ncap;
	void *nmem = NULL;

	if (n <= b->cap - b->size)
		return PT_OK;
	if (n > PT_FB_MAX_SIZE - b->size)
		return fail(b, pt_set_error(PT_ERR_OVERFLOW,
		                            "fb builder: buffer would exceed %u bytes",
		                            PT_FB_MAX_SIZE));
	need = b->size + n;
	if (!b->owned)
		return fail(b,
		            pt_set_error(PT_ERR_OVERFLOW,
		                         "fb builder: fixed memory of %zu bytes is full (need %zu)",
		                         b->cap, need));
	ncap = b->cap ? b->cap : DEFAULT_CAP;
	while (ncap < need)
		ncap = ncap <= PT_FB_MAX_SIZE / 2 ? ncap * 2 : PT_FB_MAX_SIZE;
	ncap = (ncap + STORAGE_ALIGN - 1) & ~(size_t)(STORAGE_ALIGN - 1);
	if (posix_memalign(&nmem, STORAGE_ALIGN, ncap) != 0)
		return fail(b, pt_set_error(PT_ERR_NOMEM, "fb builder: grow to %zu bytes", ncap));
	if (b->size)
		memcpy((uint8_t *)nmem + ncap - b->size, end_ptr(b) - b->size, b->size);
	free(b->mem);
	b->mem = nmem;
	b->cap = ncap;
	return PT_OK;
}

pt_err pt_fb_builder_reserve(pt_fb_builder *b, size_t bytes)
{
	PT_TRY(check_open(b));
	return ensure(b, bytes);
}

/* prep pads with zeros so that after len more bytes the size is a multiple of
 * align, and makes room for the padding and those len bytes. */
static pt_err prep(pt_fb_builder *b, size_t align, size_t len)
{
	size_t pad;

	if (len > PT_FB_MAX_SIZE)
		return fail(b,
		            pt_set_error(PT_ERR_OVERFLOW, "fb builder: object of %zu bytes", len));
	if (align > b->minalign)
		b->minalign = align;
	pad = (0 - (b->size + len)) & (align - 1);
	PT_TRY(ensure(b, pad + len));
	b->size += pad;
	memset(end_ptr(b) - b->size, 0, pad);
	return PT_OK;
}

/* push_raw writes n bytes in front of the data; room must have been made. */
static void push_raw(pt_fb_builder *b, const void *src, size_t n)
{
	b->size += n;
	memcpy(end_ptr(b) - b->size, src, n);
}

static void push_u32(pt_fb_builder *b, uint32_t v)
{
	push_raw(b, &v, sizeof(v));
}

static bool is_pow2(size_t v)
{
	return v != 0 && (v & (v - 1)) == 0;
}

static pt_err check_ref(pt_fb_builder *b, pt_fb_ref ref)
{
	if (ref == 0 || ref > b->size)
		return fail(b, pt_set_error(PT_ERR_INVALID, "fb builder: bad ref %u (size %zu)",
		                            ref, b->size));
	return PT_OK;
}

pt_err pt_fb_create_string(pt_fb_builder *b, const char *s, size_t len, pt_fb_ref *out)
{
	const uint8_t zero = 0;

	*out = 0;
	PT_TRY(check_outside_table(b, "string"));
	if (len > PT_FB_MAX_SIZE)
		return fail(b,
		            pt_set_error(PT_ERR_OVERFLOW, "fb builder: string of %zu bytes", len));
	if (s == NULL && len != 0)
		return fail(b, pt_set_error(PT_ERR_INVALID, "fb builder: NULL string"));
	PT_TRY(prep(b, 4, len + 1 + 4));
	/* prep(4, len + 5) leaves the length field 4-aligned: size + len + 5 is a
	 * multiple of 4 after the 4-byte length too. */
	push_raw(b, &zero, 1);
	if (len)
		push_raw(b, s, len);
	push_u32(b, (uint32_t)len);
	*out = (pt_fb_ref)b->size;
	return PT_OK;
}

pt_err pt_fb_create_cstring(pt_fb_builder *b, const char *s, pt_fb_ref *out)
{
	return pt_fb_create_string(b, s, s ? strlen(s) : 0, out);
}

/* start_vector checks arguments, aligns element 0 and writes the count; the
 * payload is then the `bytes` bytes after the count, already reserved. */
static pt_err start_vector(pt_fb_builder *b, size_t count, size_t elem_size, size_t align,
                           uint8_t **payload, pt_fb_ref *out)
{
	size_t bytes;

	*out = 0;
	PT_TRY(check_outside_table(b, "vector"));
	if (align == 0)
		align = elem_size;
	if (elem_size == 0 || !is_pow2(align) || align > PT_FB_MAX_ALIGN)
		return fail(b, pt_set_error(PT_ERR_INVALID,
		                            "fb builder: vector elem_size %zu align %zu", elem_size,
		                            align));
	if (count > PT_FB_MAX_SIZE / elem_size)
		return fail(b,
		            pt_set_error(PT_ERR_OVERFLOW, "fb builder: vector of %zu x %zu bytes",
		                         count, elem_size));
	if (align < 4)
		align = 4;
	bytes = count * elem_size;
	/* Element 0 ends up `align`-aligned, so the count before it is 4-aligned. */
	PT_TRY(prep(b, align, bytes));
	PT_TRY(ensure(b, bytes + 4));
	b->size += bytes;
	*payload = end_ptr(b) - b->size;
	push_u32(b, (uint32_t)count);
	*out = (pt_fb_ref)b->size;
	return PT_OK;
}

pt_err pt_fb_create_vector(pt_fb_builder *b, const void *data, size_t count, size_t elem_size,
                           size_t align, pt_fb_ref *out)
{
	uint8_t *payload = NULL;

	if (data == NULL && count != 0) {
		*out = 0;
		PT_TRY(check_open(b));
		return fail(b, pt_set_error(PT_ERR_INVALID, "fb builder: NULL vector data"));
	}
	PT_TRY(start_vector(b, count, elem_size, align, &payload, out));
	if (count)
		memcpy(payload, data, count * elem_size);
	return PT_OK;
}

pt_err pt_fb_reserve_vector(pt_fb_builder *b, size_t count, size_t elem_size, size_t align,
                            void **data, pt_fb_ref *out)
{
	uint8_t *payload = NULL;
	pt_err rv = start_vector(b, count, elem_size, align, &payload, out);

	*data = rv == PT_OK ? payload : NULL;
	return rv;
}

void *pt_fb_vector_data(pt_fb_builder *b, pt_fb_ref vec)
{
	if (vec < 4 || vec > b->size)
		return NULL;
	return end_ptr(b) - vec + 4;
}

pt_err pt_fb_create_ref_vector(pt_fb_builder *b, const pt_fb_ref *refs, size_t count,
                               pt_fb_ref *out)
{
	*out = 0;
	PT_TRY(check_outside_table(b, "vector"));
	if (refs == NULL && count != 0)
		return fail(b, pt_set_error(PT_ERR_INVALID, "fb builder: NULL refs"));
	for (size_t i = 0; i < count; i++)
		PT_TRY(check_ref(b, refs[i]));
	if (count > PT_FB_MAX_SIZE / 4)
		return fail(b, pt_set_error(PT_ERR_OVERFLOW, "fb builder: %zu refs", count));
	PT_TRY(prep(b, 4, 4 * count + 4));
	/* Back to front: each element's offset is taken from its own position. */
	for (size_t i = count; i-- > 0;)
		push_u32(b, (uint32_t)(b->size + 4 - refs[i]));
	push_u32(b, (uint32_t)count);
	*out = (pt_fb_ref)b->size;
	return PT_OK;
}

pt_err pt_fb_start_table(pt_fb_builder *b)
{
	PT_TRY(check_outside_table(b, "start_table"));
	b->in_table = true;
	b->table_start = b->size;
	b->nslots = 0;
	return PT_OK;
}

/* track records that field id's value starts at the current front. */
static pt_err track(pt_fb_builder *b, uint16_t id)
{
	if (id >= b->slots_cap) {
		uint32_t ncap = b->slots_cap ? b->slots_cap : 16;
		uint32_t *ns;

		while (ncap <= id)
			ncap *= 2;
		ns = realloc(b->slots, (size_t)ncap * sizeof(*ns));
		if (ns == NULL)
			return fail(b, pt_set_error(PT_ERR_NOMEM, "fb builder: field slots"));
		memset(ns + b->slots_cap, 0, (size_t)(ncap - b->slots_cap) * sizeof(*ns));
		b->slots = ns;
		b->slots_cap = ncap;
	}
	b->slots[id] = (uint32_t)b->size;
	if ((uint32_t)id + 1 > b->nslots)
		b->nslots = (uint32_t)id + 1;
	return PT_OK;
}

/* begin_field checks that a field may be added and aligns for its value. */
static pt_err begin_field(pt_fb_builder *b, uint16_t id, size_t size, size_t align)
{
	PT_TRY(check_open(b));
	if (!b->in_table)
		return fail(b,
		            pt_set_error(PT_ERR_STATE, "fb builder: field %u outside a table", id));
	if (id > MAX_FIELD_ID)
		return fail(b, pt_set_error(PT_ERR_RANGE, "fb builder: field id %u over %u", id,
		                            MAX_FIELD_ID));
	if (id < b->nslots && b->slots[id] != 0)
		return fail(b,
		            pt_set_error(PT_ERR_INVALID, "fb builder: field %u added twice", id));
	return prep(b, align, size);
}

static pt_err add_raw(pt_fb_builder *b, uint16_t id, const void *v, size_t size, size_t align)
{
	PT_TRY(begin_field(b, id, size, align));
	push_raw(b, v, size);
	return track(b, id);
}

/* Scalars: the default is compared by bytes, which for integers equals ==
 * and for floats keeps -0.0 and NaN payloads exactly as given. bool is
 * normalised to 0/1 first. */
#define DEFINE_ADD(name, type)                                                                     \
	pt_err pt_fb_force_##name(pt_fb_builder *b, uint16_t id, type v)                           \
	{                                                                                          \
		return add_raw(b, id, &v, sizeof(v), sizeof(v));                                   \
	}                                                                                          \
	pt_err pt_fb_add_##name(pt_fb_builder *b, uint16_t id, type v, type def)                   \
	{                                                                                          \
		if (memcmp(&v, &def, sizeof(v)) == 0)                                              \
			return check_open(b);                                                      \
		return add_raw(b, id, &v, sizeof(v), sizeof(v));                                   \
	}
DEFINE_ADD(u8, uint8_t)
DEFINE_ADD(i8, int8_t)
DEFINE_ADD(u16, uint16_t)
DEFINE_ADD(i16, int16_t)
DEFINE_ADD(u32, uint32_t)
DEFINE_ADD(i32, int32_t)
DEFINE_ADD(u64, uint64_t)
DEFINE_ADD(i64, int64_t)
DEFINE_ADD(f32, float)
DEFINE_ADD(f64, double)
#undef DEFINE_ADD

pt_err pt_fb_force_bool(pt_fb_builder *b, uint16_t id, bool v)
{
	return pt_fb_force_u8(b, id, v ? 1 : 0);
}

pt_err pt_fb_add_bool(pt_fb_builder *b, uint16_t id, bool v, bool def)
{
	return pt_fb_add_u8(b, id, v ? 1 : 0, def ? 1 : 0);
}

pt_err pt_fb_add_struct(pt_fb_builder *b, uint16_t id, const void *data, size_t size, size_t align)
{
	PT_TRY(check_open(b));
	if (data == NULL || size == 0 || size > 0xFFFF || !is_pow2(align) || align > 16)
		return fail(b, pt_set_error(PT_ERR_INVALID, "fb builder: struct size %zu align %zu",
		                            size, align));
	return add_raw(b, id, data, size, align);
}

pt_err pt_fb_add_offset(pt_fb_builder *b, uint16_t id, pt_fb_ref ref)
{
	PT_TRY(check_open(b));
	if (ref == 0)
		return PT_OK;
	PT_TRY(check_ref(b, ref));
	PT_TRY(begin_field(b, id, 4, 4));
	push_u32(b, (uint32_t)(b->size + 4 - ref));
	return track(b, id);
}

pt_err pt_fb_add_union(pt_fb_builder *b, uint16_t id, uint8_t type, pt_fb_ref value)
{
	PT_TRY(check_open(b));
	if (type == 0 && value == 0)
		return PT_OK;
	if (type == 0 || value == 0 || id >= MAX_FIELD_ID)
		return fail(b, pt_set_error(PT_ERR_INVALID,
		                            "fb builder: union at %u: type %u with value %u", id,
		                            type, value));
	PT_TRY(pt_fb_add_offset(b, (uint16_t)(id + 1), value));
	return pt_fb_force_u8(b, id, type);
}

/* find_vtable returns the ref of an earlier vtable equal to the len bytes at vt. */
static uint32_t find_vtable(const pt_fb_builder *b, const uint8_t *vt, uint16_t len)
{
	uint32_t lo = b->nvtables > VT_DEDUP_WINDOW ? b->nvtables - VT_DEDUP_WINDOW : 0;

	for (uint32_t i = b->nvtables; i-- > lo;) {
		const uint8_t *old = end_ptr(b) - b->vtables[i];
		/* Compare lengths first: a shorter vtable may end the buffer. */
		if (pt_fb_load_u16(old) == len && memcmp(old, vt, len) == 0)
			return b->vtables[i];
	}
	return 0;
}

pt_err pt_fb_end_table(pt_fb_builder *b, pt_fb_ref *out)
{
	size_t table_ref, table_size, vt_ref;
	uint16_t vt_len;
	uint8_t *vt;
	int32_t soff;

	*out = 0;
	PT_TRY(check_open(b));
	if (!b->in_table)
		return fail(b, pt_set_error(PT_ERR_STATE, "fb builder: end_table without start"));
	/* The soffset to the vtable, patched below. */
	PT_TRY(prep(b, 4, 4));
	push_u32(b, 0);
	table_ref = b->size;
	table_size = table_ref - b->table_start;
	if (table_size > 0xFFFF)
		return fail(
		    b, pt_set_error(PT_ERR_RANGE, "fb builder: table of %zu bytes", table_size));
	vt_len = (uint16_t)(4 + 2 * b->nslots);
	PT_TRY(ensure(b, vt_len));
	b->size += vt_len;
	vt = end_ptr(b) - b->size;
	{
		uint16_t hdr[2] = {vt_len, (uint16_t)table_size};
		memcpy(vt, hdr, sizeof(hdr));
	}
	for (uint32_t id = 0; id < b->nslots; id++) {
		uint16_t off = b->slots[id] ? (uint16_t)(table_ref - b->slots[id]) : 0;
		memcpy(vt + 4 + 2 * id, &off, 2);
		b->slots[id] = 0;
	}
	b->nslots = 0;
	b->in_table = false;

	vt_ref = find_vtable(b, vt, vt_len);
	if (vt_ref != 0) {
		b->size -= vt_len; /* identical vtable exists: drop this one */
	} else {
		vt_ref = b->size;
		if (b->nvtables == b->vtables_cap) {
			uint32_t ncap = b->vtables_cap ? 2 * b->vtables_cap : 16;
			uint32_t *nv = realloc(b->vtables, (size_t)ncap * sizeof(*nv));
			if (nv == NULL)
				return fail(b, pt_set_error(PT_ERR_NOMEM, "fb builder: vtables"));
			b->vtables = nv;
			b->vtables_cap = ncap;
		}
		b->vtables[b->nvtables++] = (uint32_t)vt_ref;
	}
	/* vtable = table - soffset, both as addresses; refs count from the end. */
	soff = (int32_t)((int64_t)vt_ref - (int64_t)table_ref);
	memcpy(end_ptr(b) - table_ref, &soff, 4);
	*out = (pt_fb_ref)table_ref;
	return PT_OK;
}

pt_err pt_fb_finish(pt_fb_builder *b, pt_fb_ref root, const char *file_id, const uint8_t **data,
                    size_t *size)
{
	size_t head = 4 + (file_id ? PT_FB_ID_LEN : 0);

	*data = NULL;
	*size = 0;
	PT_TRY(check_outside_table(b, "finish"));
	PT_TRY(check_ref(b, root));
	/* Pad so that the whole buffer is a multiple of the largest alignment. */
	if (b->minalign < 4)
		b->minalign = 4;
	PT_TRY(prep(b, b->minalign, head));
	if (file_id)
		push_raw(b, file_id, PT_FB_ID_LEN);
	push_u32(b, (uint32_t)(b->size + 4 - root));
	b->finished = true;
	*data = end_ptr(b) - b->size;
	*size = b->size;
	return PT_OK;
}
