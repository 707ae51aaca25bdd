/* fb.h - a small FlatBuffers runtime: builder, reader and schema-driven verifier.
 *
 * Byte-compatible with Google's flatc 2.0.8: what `flatc -b` writes we verify and
 * read; what the builder writes `flatc --json` prints. Little-endian hosts only.
 * Supported: tables, scalars, structs (as fixed-size inline blobs), strings,
 * vectors of scalars/structs/strings/tables, unions of tables, file identifiers.
 * Not supported: vectors of unions, fixed-size arrays, nested flatbuffers
 * (verified as plain byte vectors), size-prefixed buffers.
 *
 * The descriptors of the schemas (schema/NAME.fbs) and their field ids are generated at build
 * time into fb_schema.h / fb_schema.c by fb_schema_gen.py (which refuses the
 * unsupported constructs above); the PT_FB_FIELD_* shorthands are for it and
 * for tests.
 *
 * Three layers:
 *  - pt_fb_builder builds a buffer back to front, as flatc does, into memory it
 *    owns (growable, reused across messages) or into caller memory (fixed).
 *  - pt_fb_verify checks a received buffer against a static schema description
 *    (pt_fb_table_desc) before anything reads it.
 *  - the pt_fb_get_* readers are inline and do no bounds checks: call them only
 *    on verified buffers. Every load is a memcpy, so buffers need only be 4-byte
 *    aligned (nng delivers bodies 4-byte aligned); 8-byte fields are safe.
 *
 * Field ids are the schema's declaration order (a union takes two ids: the
 * `_type` u8 at n and the value at n+1). Thread-safety: a builder is used by one
 * thread at a time; verifying and reading a buffer are thread-safe.
 */
#ifndef PT_FB_H
#define PT_FB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pt_fb supports little-endian hosts only"
#endif

/* Largest buffer we build or accept: 2 GiB - 64, below flatc's 2^31 - 1 limit. */
#define PT_FB_MAX_SIZE 0x7FFFFFC0u
/* Largest element alignment pt_fb_create_vector/pt_fb_reserve_vector accept. */
#define PT_FB_MAX_ALIGN 256u
/* Bytes of the optional file identifier (buffer bytes 4..7). */
#define PT_FB_ID_LEN 4

/* ---------------------------------------------------------------- builder -- */

/* pt_fb_ref names an object already in the builder (its distance from the end
 * of the buffer, as flatc's Offset<T>); 0 is "none" and add functions skip it. */
typedef uint32_t pt_fb_ref;

/* pt_fb_builder is embedded by the caller; treat its members as private. */
typedef struct pt_fb_builder {
	uint8_t *mem;       /* storage; the buffer grows down from mem + cap */
	size_t cap;         /* bytes of storage */
	size_t size;        /* bytes written, at mem + cap - size */
	size_t minalign;    /* largest alignment used; the finished size is a multiple */
	bool owned;         /* mem is ours and may be grown */
	bool in_table;      /* between pt_fb_start_table and pt_fb_end_table */
	bool finished;      /* pt_fb_finish succeeded; only reset is allowed */
	pt_err err;         /* first failure; later calls return it (sticky) */
	size_t table_start; /* size when the open table started */
	uint32_t *slots;    /* per field id of the open table: its value's ref, 0 unset */
	uint32_t nslots;    /* ids in use in the open table: max id + 1 */
	uint32_t slots_cap;
	uint32_t *vtables; /* refs of vtables written, for deduplication */
	uint32_t nvtables;
	uint32_t vtables_cap;
} pt_fb_builder;

/* pt_fb_builder_init prepares b with an owned, growable buffer of initial_cap
 * bytes (0 picks a small default). After warm-up, reset + rebuild allocates
 * nothing. Returns PT_ERR_NOMEM on failure; pt_fb_builder_fini is then safe. */
pt_err pt_fb_builder_init(pt_fb_builder *b, size_t initial_cap);

/* pt_fb_builder_init_fixed prepares b to build into caller memory [mem, mem+cap),
 * which the caller keeps owning and must outlive the builder's use. The buffer
 * is built at the END of that memory: pt_fb_finish reports where it starts (for
 * an nng message, nng_msg_trim the front by cap - size). Exceeding cap gives
 * PT_ERR_OVERFLOW. Payload alignment in memory holds when mem + cap is aligned
 * to it. cap over PT_FB_MAX_SIZE is PT_ERR_RANGE. Field bookkeeping is still
 * heap-allocated (once). */
pt_err pt_fb_builder_init_fixed(pt_fb_builder *b, void *mem, size_t cap);

/* pt_fb_builder_fini frees what b owns (not fixed caller memory). Accepts NULL
 * and a builder whose init failed. */
void pt_fb_builder_fini(pt_fb_builder *b);

/* pt_fb_builder_reset forgets the message in b (and any sticky error) and keeps
 * all memory for the next one. Invalidates pointers from pt_fb_finish. */
void pt_fb_builder_reset(pt_fb_builder *b);

/* pt_fb_builder_capacity returns the bytes of buffer storage b holds now. */
size_t pt_fb_builder_capacity(const pt_fb_builder *b);

/* pt_fb_builder_reserve makes room for `bytes` more without growing later, so a
 * large tensor message is built without a reallocation copy. PT_ERR_OVERFLOW in
 * fixed mode when it does not fit. */
pt_err pt_fb_builder_reserve(pt_fb_builder *b, size_t bytes);

/* Every function below returns PT_OK or an error, and an error is sticky: later
 * calls return it without doing anything, and pt_fb_finish returns it. So a
 * caller may ignore intermediate results and check pt_fb_finish only (refs it
 * got after a failure are 0). Errors: PT_ERR_STATE (call order: strings,
 * vectors and child tables must be created before start_table of their parent,
 * adds only inside a table), PT_ERR_INVALID (bad argument or ref),
 * PT_ERR_RANGE (table over 64 KiB, field id over 32763), PT_ERR_OVERFLOW
 * (buffer over PT_FB_MAX_SIZE or fixed memory full), PT_ERR_NOMEM. */

/* pt_fb_create_string copies len bytes of s (which need not be NUL-terminated)
 * as a string and writes its ref to *out. */
pt_err pt_fb_create_string(pt_fb_builder *b, const char *s, size_t len, pt_fb_ref *out);

/* pt_fb_create_cstring is pt_fb_create_string(b, s, strlen(s), out). */
pt_err pt_fb_create_cstring(pt_fb_builder *b, const char *s, pt_fb_ref *out);

/* pt_fb_create_vector copies count little-endian elements of elem_size bytes
 * from data. Element 0 is aligned (from the buffer start) to align, which must
 * be 0 (meaning elem_size) or a power of two up to PT_FB_MAX_ALIGN; it is at
 * least 4 in any case. Use align 16 or 64 for tensor payloads. */
pt_err pt_fb_create_vector(pt_fb_builder *b, const void *data, size_t count, size_t elem_size,
                           size_t align, pt_fb_ref *out);

/* pt_fb_reserve_vector is pt_fb_create_vector without the copy: *data points
 * at count * elem_size uninitialised bytes inside the buffer, which the caller
 * must fill completely (stale bytes would be sent). The pointer is valid until
 * the next call that writes into b; pt_fb_vector_data finds it again later. */
pt_err pt_fb_reserve_vector(pt_fb_builder *b, size_t count, size_t elem_size, size_t align,
                            void **data, pt_fb_ref *out);

/* pt_fb_vector_data returns element 0 of the vector ref in b (now; the pointer
 * moves when the owned buffer grows), or NULL for a ref b cannot hold. */
void *pt_fb_vector_data(pt_fb_builder *b, pt_fb_ref vec);

/* pt_fb_create_ref_vector writes a vector of count offsets to the strings or
 * tables refs[0..count) (none may be 0). */
pt_err pt_fb_create_ref_vector(pt_fb_builder *b, const pt_fb_ref *refs, size_t count,
                               pt_fb_ref *out);

/* pt_fb_start_table opens a table; tables do not nest while being built. */
pt_err pt_fb_start_table(pt_fb_builder *b);

/* pt_fb_end_table closes the open table, writes (or reuses an identical)
 * vtable and writes the table's ref to *out. */
pt_err pt_fb_end_table(pt_fb_builder *b, pt_fb_ref *out);

/* pt_fb_add_<t>(b, id, v, def) adds scalar field id of the open table unless v
 * equals the schema default def (flatc's elision; floats compare bit patterns,
 * so -0.0 and NaN are kept exactly). pt_fb_force_<t>(b, id, v) always adds it.
 * Types: u8 i8 bool u16 i16 u32 i32 u64 i64 f32 f64. */
#define PT_FB_SCALAR_TYPES(X)                                                                      \
	X(u8, uint8_t)                                                                             \
	X(i8, int8_t)                                                                              \
	X(bool, bool)                                                                              \
	X(u16, uint16_t)                                                                           \
	X(i16, int16_t)                                                                            \
	X(u32, uint32_t)                                                                           \
	X(i32, int32_t)                                                                            \
	X(u64, uint64_t)                                                                           \
	X(i64, int64_t)                                                                            \
	X(f32, float)                                                                              \
	X(f64, double)

#define PT_FB_DECLARE_ADD(name, type)                                                              \
	pt_err pt_fb_add_##name(pt_fb_builder *b, uint16_t id, type v, type def);                  \
	pt_err pt_fb_force_##name(pt_fb_builder *b, uint16_t id, type v);
PT_FB_SCALAR_TYPES(PT_FB_DECLARE_ADD)
#undef PT_FB_DECLARE_ADD

/* pt_fb_add_struct adds an inline struct field: size bytes of data, aligned to
 * align (a power of two up to 16), always written. */
pt_err pt_fb_add_struct(pt_fb_builder *b, uint16_t id, const void *data, size_t size, size_t align);

/* pt_fb_add_offset adds a string, vector or table field; ref 0 adds nothing. */
pt_err pt_fb_add_offset(pt_fb_builder *b, uint16_t id, pt_fb_ref ref);

/* pt_fb_add_union adds a union: type (u8) at id and the table value at id + 1.
 * type 0 (NONE) with value 0 adds nothing; otherwise both must be non-zero. */
pt_err pt_fb_add_union(pt_fb_builder *b, uint16_t id, uint8_t type, pt_fb_ref value);

/* pt_fb_finish writes the optional 4-byte file identifier (file_id may be NULL)
 * and the root offset, pads to the largest alignment used, and hands back the
 * finished bytes: *data (inside b's memory; start aligned to that alignment
 * when the storage end is) and *size. They stay valid until b is reset or
 * finalised; the owned buffer is not freed by reset. Returns the sticky error
 * if any earlier call failed. */
pt_err pt_fb_finish(pt_fb_builder *b, pt_fb_ref root, const char *file_id, const uint8_t **data,
                    size_t *size);

/* --------------------------------------------------------------- verifier -- */

/* What a field holds; the schema description of one table is static data. */
typedef enum pt_fb_kind {
	PT_FB_SCALAR,        /* inline scalar or struct: size bytes aligned to align */
	PT_FB_STRING,        /* offset to string */
	PT_FB_VECTOR,        /* offset to vector of inline elements (size, align) */
	PT_FB_VECTOR_STRING, /* offset to vector of offsets to strings */
	PT_FB_VECTOR_TABLE,  /* offset to vector of offsets to tables of `table` */
	PT_FB_TABLE,         /* offset to a table of `table` */
	PT_FB_UNION,         /* u8 type at id, offset to a table of union->members at id+1 */
	PT_FB_KIND_COUNT
} pt_fb_kind;

struct pt_fb_table_desc;

/* pt_fb_union_desc: members[t - 1] is the table of union type t (1..count);
 * NULL marks a member we do not accept. Type 0 is NONE. */
typedef struct pt_fb_union_desc {
	const char *name;
	uint8_t count;
	const struct pt_fb_table_desc *const *members;
} pt_fb_union_desc;

typedef struct pt_fb_field_desc {
	const char *name; /* for error messages */
	uint16_t id;
	uint8_t kind;                         /* pt_fb_kind */
	bool required;                        /* offset kinds, structs: absent fails verification */
	uint16_t size;                        /* SCALAR: bytes; VECTOR: bytes per element */
	uint16_t align;                       /* SCALAR, VECTOR: alignment from the buffer start */
	const struct pt_fb_table_desc *table; /* TABLE, VECTOR_TABLE */
	const pt_fb_union_desc *un;           /* UNION */
} pt_fb_field_desc;

/* pt_fb_table_desc lists the fields a verifier checks; fields not listed (a
 * newer writer's additions) are ignored, as flatc's verifier does. */
typedef struct pt_fb_table_desc {
	const char *name;
	const pt_fb_field_desc *fields;
	uint16_t nfields;
} pt_fb_table_desc;

/* Field description shorthands, for static const arrays. */
#define PT_FB_FIELD_SCALAR(id_, name_, size_)                                                      \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_SCALAR, .size = (size_),               \
		.align = (size_)                                                                   \
	}
#define PT_FB_FIELD_STRUCT(id_, name_, size_, align_)                                              \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_SCALAR, .size = (size_),               \
		.align = (align_)                                                                  \
	}
#define PT_FB_FIELD_STRING(id_, name_, req_)                                                       \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_STRING, .required = (req_)             \
	}
#define PT_FB_FIELD_VECTOR(id_, name_, esize_, ealign_, req_)                                      \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_VECTOR, .required = (req_),            \
		.size = (esize_), .align = (ealign_)                                               \
	}
#define PT_FB_FIELD_VECTOR_STRING(id_, name_, req_)                                                \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_VECTOR_STRING, .required = (req_)      \
	}
#define PT_FB_FIELD_VECTOR_TABLE(id_, name_, table_, req_)                                         \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_VECTOR_TABLE, .required = (req_),      \
		.table = (table_)                                                                  \
	}
#define PT_FB_FIELD_TABLE(id_, name_, table_, req_)                                                \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_TABLE, .required = (req_),             \
		.table = (table_)                                                                  \
	}
#define PT_FB_FIELD_UNION(id_, name_, union_, req_)                                                \
	{                                                                                          \
		.name = (name_), .id = (id_), .kind = PT_FB_UNION, .required = (req_),             \
		.un = (union_)                                                                     \
	}
#define PT_FB_TABLE_DESC(name_, fields_)                                                           \
	{                                                                                          \
		.name = (name_), .fields = (fields_),                                              \
		.nfields = (uint16_t)(sizeof(fields_) / sizeof((fields_)[0]))                      \
	}

/* Limits of one verification; 0 (or opts NULL) means the default, which
 * equals flatc's Verifier. */
typedef struct pt_fb_verify_opts {
	uint32_t max_depth;  /* nested tables, root = 1 (default 64, at most 1024) */
	uint32_t max_tables; /* tables visited, shared ones counted again (1000000) */
} pt_fb_verify_opts;

#define PT_FB_VERIFY_DEFAULT_DEPTH  64u
#define PT_FB_VERIFY_DEFAULT_TABLES 1000000u

/* pt_fb_verify checks buf[0..size) against root (and the file identifier when
 * file_id is not NULL) with opts (NULL = defaults), with the verdicts of
 * Google's C++ Verifier for the same schema and limits (fb_verify.c lists the
 * rules), and on top requires buf 4-aligned in memory and size in
 * [12, PT_FB_MAX_SIZE]. A union whose type is NONE or beyond the schema's
 * members is accepted without its value being verified: decoders refuse such
 * a type before reading the value. Returns PT_OK or PT_ERR_FORMAT with the
 * table, field and byte position in pt_last_error() (PT_ERR_INVALID for a NULL
 * argument). Reads buf only; thread-safe; work is O(size + tables visited). */
pt_err pt_fb_verify(const void *buf, size_t size, const pt_fb_table_desc *root, const char *file_id,
                    const pt_fb_verify_opts *opts);

/* ----------------------------------------------------------------- reader -- */

/* Read only buffers that pt_fb_verify accepted, and only fields (with the
 * kinds and sizes) that the pt_fb_table_desc used to verify them lists: the
 * verifier checked exactly those. Absent fields read as the given default. */

/* Unaligned little-endian loads (memcpy compiles to one mov). */
#define PT_FB_DEFINE_LOAD(name, type)                                                              \
	static inline type pt_fb_load_##name(const void *p)                                        \
	{                                                                                          \
		type v;                                                                            \
		memcpy(&v, p, sizeof(v));                                                          \
		return v;                                                                          \
	}
PT_FB_DEFINE_LOAD(u8, uint8_t)
PT_FB_DEFINE_LOAD(i8, int8_t)
PT_FB_DEFINE_LOAD(u16, uint16_t)
PT_FB_DEFINE_LOAD(i16, int16_t)
PT_FB_DEFINE_LOAD(u32, uint32_t)
PT_FB_DEFINE_LOAD(i32, int32_t)
PT_FB_DEFINE_LOAD(u64, uint64_t)
PT_FB_DEFINE_LOAD(i64, int64_t)
PT_FB_DEFINE_LOAD(f32, float)
PT_FB_DEFINE_LOAD(f64, double)
#undef PT_FB_DEFINE_LOAD

static inline bool pt_fb_load_bool(const void *p)
{
	return *(const uint8_t *)p != 0;
}

/* pt_fb_deref follows the uoffset stored at p. */
static inline const uint8_t *pt_fb_deref(const uint8_t *p)
{
	return p + pt_fb_load_u32(p);
}

/* pt_fb_root returns the root table of a verified buffer. */
static inline const uint8_t *pt_fb_root(const void *buf)
{
	return pt_fb_deref((const uint8_t *)buf);
}

/* pt_fb_has_identifier tells whether buf (size bytes) carries file_id. */
static inline bool pt_fb_has_identifier(const void *buf, size_t size, const char *file_id)
{
	return size >= 8 && memcmp((const uint8_t *)buf + 4, file_id, PT_FB_ID_LEN) == 0;
}

/* pt_fb_field returns field id of table t, or NULL when it is absent. */
static inline const uint8_t *pt_fb_field(const uint8_t *t, uint16_t id)
{
	const uint8_t *vt = t - pt_fb_load_i32(t);
	uint32_t slot = 4u + 2u * id;
	uint16_t off;

	if (slot >= pt_fb_load_u16(vt))
		return NULL;
	off = pt_fb_load_u16(vt + slot);
	return off ? t + off : NULL;
}

/* pt_fb_get_<t>(t, id, def) reads scalar field id, or def when absent. */
#define PT_FB_DEFINE_GET(name, type)                                                               \
	static inline type pt_fb_get_##name(const uint8_t *t, uint16_t id, type def)               \
	{                                                                                          \
		const uint8_t *p = pt_fb_field(t, id);                                             \
		return p ? pt_fb_load_##name(p) : def;                                             \
	}
PT_FB_SCALAR_TYPES(PT_FB_DEFINE_GET)
#undef PT_FB_DEFINE_GET

/* pt_fb_get_string returns string field id (NUL-terminated; *len excludes the
 * NUL and may be NULL) or NULL with *len = 0 when absent. */
static inline const char *pt_fb_get_string(const uint8_t *t, uint16_t id, uint32_t *len)
{
	const uint8_t *p = pt_fb_field(t, id);
	const uint8_t *s;

	if (p == NULL) {
		if (len)
			*len = 0;
		return NULL;
	}
	s = pt_fb_deref(p);
	if (len)
		*len = pt_fb_load_u32(s);
	return (const char *)(s + 4);
}

/* pt_fb_get_vector returns element 0 of vector field id and its element count
 * in *count, or NULL with *count = 0 when absent. Elements of 8 bytes may be
 * only 4-byte aligned in memory: read them with pt_fb_load_* or memcpy. */
static inline const uint8_t *pt_fb_get_vector(const uint8_t *t, uint16_t id, uint32_t *count)
{
	const uint8_t *p = pt_fb_field(t, id);
	const uint8_t *v;

	if (p == NULL) {
		*count = 0;
		return NULL;
	}
	v = pt_fb_deref(p);
	*count = pt_fb_load_u32(v);
	return v + 4;
}

/* pt_fb_get_table returns nested table field id, or NULL when absent. */
static inline const uint8_t *pt_fb_get_table(const uint8_t *t, uint16_t id)
{
	const uint8_t *p = pt_fb_field(t, id);
	return p ? pt_fb_deref(p) : NULL;
}

/* pt_fb_get_union returns the union at ids (id, id + 1): its type in *type
 * (0 = NONE) and its table, or NULL when NONE. */
static inline const uint8_t *pt_fb_get_union(const uint8_t *t, uint16_t id, uint8_t *type)
{
	*type = pt_fb_get_u8(t, id, 0);
	return *type ? pt_fb_get_table(t, (uint16_t)(id + 1)) : NULL;
}

/* pt_fb_vec_table returns table i of a vector of tables (from pt_fb_get_vector). */
static inline const uint8_t *pt_fb_vec_table(const uint8_t *vec, uint32_t i)
{
	return pt_fb_deref(vec + 4u * i);
}

/* pt_fb_vec_string returns string i of a vector of strings; *len may be NULL. */
static inline const char *pt_fb_vec_string(const uint8_t *vec, uint32_t i, uint32_t *len)
{
	const uint8_t *s = pt_fb_deref(vec + 4u * i);
	if (len)
		*len = pt_fb_load_u32(s);
	return (const char *)(s + 4);
}

#endif
