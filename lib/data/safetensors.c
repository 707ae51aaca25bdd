/* safetensors.c - validating reader (whole file in one storage) and atomic writer. */
#include "safetensors.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fileio.h"
#include "json.h"
#include "sha256.h"

/* Checkpoints are hashed with OpenSSL's SHA-256 compression (SHA extensions
 * where the CPU has them) in any program that links this file. A
 * constructor here, not in sha256_openssl.c, which a static link would drop. */
__attribute__((constructor)) static void use_openssl_sha256(void)
{
	pt_sha256_use_openssl();
}

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads little-endian data in place"
#endif

#define META_KEY   "__metadata__"
#define SHA256_KEY "data_sha256"

static const char *const st_dtype_names[PT_DTYPE_COUNT] = {
    [PT_F32] = "F32", [PT_F16] = "F16", [PT_BF16] = "BF16", [PT_F64] = "F64", [PT_I32] = "I32",
    [PT_I64] = "I64", [PT_U8] = "U8",   [PT_U16] = "U16",   [PT_U32] = "U32",
};

/* Valid safetensors dtypes that we do not handle (refused as unsupported). */
static const char *const st_other_dtypes[] = {"BOOL",    "I8",      "I16",     "U64",
                                              "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4"};

typedef struct st_entry {
	const char *name; /* points into the parsed header */
	pt_dtype dtype;
	int ndim;
	int64_t shape[PT_MAX_DIMS];
	size_t begin, end; /* relative to the data section */
} st_entry;

struct pt_safetensors {
	char *path;
	pt_json header;
	pt_storage *bytes; /* the whole file, 64-byte aligned */
	size_t data_start, data_len;
	st_entry *entries; /* header order */
	size_t n;
	size_t *by_name; /* entry indices sorted by name */
	const pt_json_member **meta;
	size_t n_meta;
};

const char *pt_safetensors_dtype_name(pt_dtype dt)
{
	return (unsigned)dt < PT_DTYPE_COUNT ? st_dtype_names[dt] : "?";
}

static pt_err st_error(const pt_safetensors *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static pt_err st_error(const pt_safetensors *st, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return pt_set_error(PT_ERR_FORMAT, "%s: safetensors: %s", st->path, msg);
}

static pt_err parse_dtype(const pt_safetensors *st, const char *name, const pt_json *v,
                          pt_dtype *dt)
{
	const char *s = pt_json_string(v);
	if (s == NULL)
		return st_error(st, "entry '%s': dtype is not a string", name);
	for (int i = 0; i < PT_DTYPE_COUNT; i++) {
		if (strcmp(s, st_dtype_names[i]) == 0) {
			*dt = (pt_dtype)i;
			return PT_OK;
		}
	}
	for (size_t i = 0; i < sizeof(st_other_dtypes) / sizeof(st_other_dtypes[0]); i++)
		if (strcmp(s, st_other_dtypes[i]) == 0)
			return st_error(st, "entry '%s': unsupported dtype '%s'", name, s);
	return st_error(st, "entry '%s': unknown dtype '%.40s'", name, s);
}

/* parse_uint reads a non-negative exact integer. */
static bool parse_uint(const pt_json *v, int64_t *out)
{
	return pt_json_int(v, out) && *out >= 0;
}

static pt_err parse_entry(const pt_safetensors *st, const pt_json_member *m, st_entry *e)
{
	const pt_json *v = &m->value, *f;
	size_t need, span;
	int64_t b, x;

	e->name = m->key;
	if (v->type != PT_JSON_OBJECT)
		return st_error(st, "entry '%s' is not an object", e->name);
	if ((f = pt_json_get(v, "dtype")) == NULL)
		return st_error(st, "entry '%s' has no dtype", e->name);
	PT_TRY(parse_dtype(st, e->name, f, &e->dtype));
	if ((f = pt_json_get(v, "shape")) == NULL)
		return st_error(st, "entry '%s' has no shape", e->name);
	if (f->type != PT_JSON_ARRAY)
		return st_error(st, "entry '%s': shape is not an array", e->name);
	if (f->len > PT_MAX_DIMS)
		return st_error(st, "entry '%s': %zu dimensions, at most %d are supported", e->name,
		                f->len, PT_MAX_DIMS);
	e->ndim = (int)f->len;
	need = pt_dtype_size(e->dtype);
	span = need;
	for (int i = 0; i < e->ndim; i++) {
		if (!parse_uint(&f->items[i], &e->shape[i]))
			return st_error(st, "entry '%s': shape[%d] is not a non-negative integer",
			                e->name, i);
		/* span: with the zero dimensions left out, so a tensor of no values
		 * still has strides that fit (0 x 2^62 x 2^62 is refused). */
		if (__builtin_mul_overflow(need, (size_t)e->shape[i], &need) ||
		    __builtin_mul_overflow(span, (size_t)(e->shape[i] ? e->shape[i] : 1), &span) ||
		    span > (size_t)INT64_MAX / 16)
			return st_error(st, "entry '%s': shape overflows", e->name);
	}
	if ((f = pt_json_get(v, "data_offsets")) == NULL)
		return st_error(st, "entry '%s' has no data_offsets", e->name);
	if (f->type != PT_JSON_ARRAY || f->len != 2 || !parse_uint(&f->items[0], &b) ||
	    !parse_uint(&f->items[1], &x))
		return st_error(st, "entry '%s': data_offsets is not [begin, end]", e->name);
	e->begin = (size_t)b;
	e->end = (size_t)x;
	if (e->begin > e->end)
		return st_error(st, "entry '%s': data_offsets begin %zu > end %zu", e->name,
		                e->begin, e->end);
	if (e->end > st->data_len)
		return st_error(st,
		                "entry '%s': data_offsets [%zu, %zu] past the end of the data "
		                "(%zu bytes)",
		                e->name, e->begin, e->end, st->data_len);
	if (e->end - e->begin != need) {
		char sh[128];
		return st_error(st,
		                "entry '%s': data_offsets span %zu bytes but shape %s of %s needs "
		                "%zu",
		                e->name, e->end - e->begin,
		                pt_shape_str(sh, sizeof(sh), e->ndim, e->shape),
		                st_dtype_names[e->dtype], need);
	}
	return PT_OK;
}

static pt_err parse_metadata(pt_safetensors *st, const pt_json *v)
{
	if (v->type != PT_JSON_OBJECT)
		return st_error(st, "__metadata__ is not an object");
	if (st->meta != NULL)
		return st_error(st, "a second __metadata__ object");
	st->meta = malloc((v->len ? v->len : 1) * sizeof(*st->meta));
	if (st->meta == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: metadata", st->path);
	for (size_t i = 0; i < v->len; i++) {
		if (v->members[i].value.type != PT_JSON_STRING)
			return st_error(st, "metadata value of '%s' is a %s, not a string",
			                v->members[i].key,
			                pt_json_type_name(v->members[i].value.type));
		st->meta[st->n_meta++] = &v->members[i];
	}
	return PT_OK;
}

static int entry_offset_cmp(const void *a, const void *b)
{
	const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return (x->end > y->end) - (x->end < y->end);
}

/* check_tiling: sorted by offset, every tensor must start where the previous
 * one ended, and the last must end at the end of the data section. */
static pt_err check_tiling(const pt_safetensors *st)
{
	const st_entry **sorted;
	size_t at = 0;
	pt_err rv = PT_OK;

	if (st->n == 0)
		return st->data_len == 0
		           ? PT_OK
		           : st_error(st, "hole: %zu data bytes but no tensors", st->data_len);
	sorted = malloc(st->n * sizeof(*sorted));
	if (sorted == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: offset check", st->path);
	for (size_t i = 0; i < st->n; i++)
		sorted[i] = &st->entries[i];
	qsort(sorted, st->n, sizeof(*sorted), entry_offset_cmp);
	for (size_t i = 0; i < st->n && rv == PT_OK; i++) {
		const st_entry *e = sorted[i];
		if (e->begin < at)
			rv = st_error(st, "entries '%s' and '%s' overlap at bytes [%zu, %zu)",
			              sorted[i - 1]->name, e->name, e->begin, at);
		else if (e->begin > at)
			rv =
			    st_error(st, "hole in the data section at bytes [%zu, %zu) before '%s'",
			             at, e->begin, e->name);
		at = e->end;
	}
	if (rv == PT_OK && at != st->data_len)
		rv = st_error(st, "hole: %zu data bytes after the last tensor", st->data_len - at);
	free(sorted);
	return rv;
}

static pt_err check_checksum(const pt_safetensors *st)
{
	const char *want = pt_safetensors_meta(st, SHA256_KEY);
	uint8_t digest[PT_SHA256_BYTES];
	char got[PT_SHA256_HEX];

	if (want == NULL)
		return PT_OK;
	if (strlen(want) != 64 || strspn(want, "0123456789abcdefABCDEF") != 64)
		return st_error(st, "data_sha256 '%.80s' is not 64 hex digits", want);
	pt_sha256((const char *)st->bytes->data + st->data_start, st->data_len, digest);
	pt_sha256_hex(digest, got);
	if (strcasecmp(want, got) != 0)
		return st_error(st,
		                "checksum mismatch: data_sha256 is %s but the data hashes to %s",
		                want, got);
	return PT_OK;
}

static int by_name_cmp(const void *a, const void *b, void *arg)
{
	const st_entry *e = arg;
	return strcmp(e[*(const size_t *)a].name, e[*(const size_t *)b].name);
}

static pt_err parse_header(pt_safetensors *st)
{
	const char *text = (const char *)st->bytes->data + 8;
	const pt_json *root = &st->header;
	pt_json_limits lim = {.max_bytes = PT_SAFETENSORS_MAX_HEADER,
	                      .max_values = PT_SAFETENSORS_MAX_VALUES};
	pt_err rv;

	if ((rv = pt_json_parse(&st->header, text, st->data_start - 8, &lim)) != PT_OK)
		return st_error(st, "header is not valid JSON (%s)", pt_last_error());
	if (root->type != PT_JSON_OBJECT)
		return st_error(st, "header is a JSON %s, not an object",
		                pt_json_type_name(root->type));
	st->entries = calloc(root->len ? root->len : 1, sizeof(*st->entries));
	st->by_name = calloc(root->len ? root->len : 1, sizeof(*st->by_name));
	if (st->entries == NULL || st->by_name == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: %zu header entries", st->path, root->len);
	for (size_t i = 0; i < root->len; i++) {
		const pt_json_member *m = &root->members[i];
		/* Before any name is compared: "__metadata__\u0000x" is another key
		 * to the parser but the same C string. */
		if (m->key_len != strlen(m->key))
			return st_error(st, "a header key contains a NUL character");
		if (strcmp(m->key, META_KEY) == 0) {
			PT_TRY(parse_metadata(st, &m->value));
			continue;
		}
		PT_TRY(parse_entry(st, m, &st->entries[st->n]));
		st->by_name[st->n] = st->n;
		st->n++;
	}
	qsort_r(st->by_name, st->n, sizeof(*st->by_name), by_name_cmp, st->entries);
	PT_TRY(check_tiling(st));
	return check_checksum(st);
}

pt_err pt_safetensors_open(pt_safetensors **out, const char *path)
{
	size_t size;
	int fd;
	pt_err rv;

	*out = NULL;
	PT_TRY(pt_file_open_read(path, &fd, &size));
	rv = pt_safetensors_open_fd(out, fd, path);
	close(fd);
	return rv;
}

pt_err pt_safetensors_open_fd(pt_safetensors **out, int fd, const char *path)
{
	pt_safetensors *st;
	size_t size;
	uint64_t hlen = 0;
	unsigned char len8[8];
	pt_err rv;

	*out = NULL;
	PT_TRY(pt_file_fd_size(fd, path, &size));
	st = calloc(1, sizeof(*st));
	if (st == NULL || (st->path = strdup(path)) == NULL) {
		free(st);
		return pt_set_error(PT_ERR_NOMEM, "%s: safetensors object", path);
	}
	/* The header's length is checked before the file is read. */
	if (size < 8)
		rv = st_error(st, "truncated: %zu bytes, no header length", size);
	else
		rv = pt_read_full(fd, len8, 8, 0, path);
	if (rv != PT_OK)
		goto fail;
	for (int i = 0; i < 8; i++)
		hlen |= (uint64_t)len8[i] << (8 * i);
	if (hlen > PT_SAFETENSORS_MAX_HEADER) {
		rv = st_error(st, "header length %" PRIu64 " is absurd (limit %u bytes)", hlen,
		              PT_SAFETENSORS_MAX_HEADER);
		goto fail;
	}
	if (hlen > size - 8) {
		rv = st_error(st, "header length %" PRIu64 " exceeds the file size (%zu bytes)",
		              hlen, size);
		goto fail;
	}
	st->data_start = 8 + (size_t)hlen;
	st->data_len = size - st->data_start;
	if ((rv = pt_storage_create(&st->bytes, size, PT_CPU)) != PT_OK ||
	    (rv = pt_read_full(fd, st->bytes->data, size, 0, path)) != PT_OK)
		goto fail;
	if ((rv = parse_header(st)) != PT_OK)
		goto fail;
	*out = st;
	return PT_OK;
fail:
	pt_safetensors_destroy(st);
	return rv;
}

void pt_safetensors_destroy(pt_safetensors *st)
{
	if (st == NULL)
		return;
	pt_json_fini(&st->header);
	pt_storage_release(st->bytes);
	free(st->entries);
	free(st->by_name);
	free(st->meta);
	free(st->path);
	free(st);
}

size_t pt_safetensors_count(const pt_safetensors *st)
{
	return st->n;
}

const char *pt_safetensors_name(const pt_safetensors *st, size_t i)
{
	return i < st->n ? st->entries[i].name : NULL;
}

static const st_entry *find_entry(const pt_safetensors *st, const char *name)
{
	size_t lo = 0, hi = st->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const st_entry *e = &st->entries[st->by_name[mid]];
		int c = strcmp(name, e->name);
		if (c == 0)
			return e;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	pt_set_error(PT_ERR_NOTFOUND, "%s: no tensor named '%s'", st->path, name);
	return NULL;
}

pt_err pt_safetensors_info(const pt_safetensors *st, const char *name, pt_dtype *dtype, int *ndim,
                           int64_t *shape)
{
	const st_entry *e = find_entry(st, name);
	if (e == NULL)
		return PT_ERR_NOTFOUND;
	*dtype = e->dtype;
	*ndim = e->ndim;
	memcpy(shape, e->shape, sizeof(int64_t) * (size_t)e->ndim);
	return PT_OK;
}

pt_err pt_safetensors_get(const pt_safetensors *st, const char *name, pt_tensor *out)
{
	const st_entry *e = find_entry(st, name);
	size_t off;

	memset(out, 0, sizeof(*out));
	if (e == NULL)
		return PT_ERR_NOTFOUND;
	off = st->data_start + e->begin;
	if (off % pt_dtype_size(e->dtype) == 0)
		return pt_tensor_init_on(out, st->bytes, off, e->dtype, e->ndim, e->shape);
	PT_TRY(pt_tensor_init(out, e->dtype, e->ndim, e->shape));
	memcpy(pt_tensor_data(out), (const char *)st->bytes->data + off, e->end - e->begin);
	return PT_OK;
}

pt_err pt_safetensors_copy(const pt_safetensors *st, const char *name, pt_tensor *dst)
{
	const st_entry *e = find_entry(st, name);
	char a[128], b[128];

	if (e == NULL)
		return PT_ERR_NOTFOUND;
	if (dst->dtype != e->dtype)
		return pt_set_error(PT_ERR_DTYPE, "%s: tensor '%s' is %s in the file, %s in memory",
		                    st->path, name, st_dtype_names[e->dtype],
		                    pt_safetensors_dtype_name(dst->dtype));
	if (dst->ndim != e->ndim ||
	    memcmp(dst->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim) != 0)
		return pt_set_error(PT_ERR_SHAPE,
		                    "%s: tensor '%s' has shape %s in the file, %s in memory",
		                    st->path, name, pt_shape_str(a, sizeof(a), e->ndim, e->shape),
		                    pt_shape_str(b, sizeof(b), dst->ndim, dst->shape));
	return pt_tensor_write(dst, (const char *)st->bytes->data + st->data_start + e->begin,
	                       e->end - e->begin);
}

const char *pt_safetensors_meta(const pt_safetensors *st, const char *key)
{
	for (size_t i = 0; i < st->n_meta; i++)
		if (strcmp(st->meta[i]->key, key) == 0)
			return st->meta[i]->value.str;
	return NULL;
}

size_t pt_safetensors_meta_count(const pt_safetensors *st)
{
	return st->n_meta;
}

const char *pt_safetensors_meta_key(const pt_safetensors *st, size_t i)
{
	return i < st->n_meta ? st->meta[i]->key : NULL;
}

static int cstr_ptr_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* check_unique sorts a copy of the names and reports the first duplicate. */
static pt_err check_unique(const char *path, const char **names, size_t n, const char *what)
{
	pt_err rv = PT_OK;
	const char **sorted = malloc((n ? n : 1) * sizeof(*sorted));

	if (sorted == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: name check", path);
	memcpy(sorted, names, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cstr_ptr_cmp);
	for (size_t i = 1; i < n && rv == PT_OK; i++)
		if (strcmp(sorted[i - 1], sorted[i]) == 0)
			rv = pt_set_error(PT_ERR_INVALID, "%s: %s '%s' given twice", path, what,
			                  sorted[i]);
	free(sorted);
	return rv;
}

static pt_err check_write_args(const char *path, const pt_st_tensor *tensors, size_t n,
                               const pt_st_meta *meta, size_t n_meta)
{
	const char **names = malloc(((n > n_meta ? n : n_meta) + 1) * sizeof(*names));
	pt_err rv = PT_OK;

	if (names == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: name check", path);
	for (size_t i = 0; i < n && rv == PT_OK; i++) {
		const char *nm = tensors[i].name;
		if (nm == NULL || nm[0] == '\0' || strcmp(nm, META_KEY) == 0)
			rv = pt_set_error(PT_ERR_INVALID, "%s: tensor %zu has an invalid name '%s'",
			                  path, i, nm ? nm : "(null)");
		else if (pt_dtype_size(tensors[i].tensor->dtype) == 0)
			rv = pt_set_error(PT_ERR_DTYPE, "%s: tensor '%s' has an unknown dtype",
			                  path, nm);
		names[i] = nm;
	}
	if (rv == PT_OK)
		rv = check_unique(path, names, n, "tensor name");
	for (size_t i = 0; i < n_meta && rv == PT_OK; i++) {
		if (meta[i].key == NULL || meta[i].value == NULL ||
		    strcmp(meta[i].key, SHA256_KEY) == 0)
			rv = pt_set_error(PT_ERR_INVALID,
			                  "%s: metadata %zu: key '%s' is missing or reserved", path,
			                  i, meta[i].key ? meta[i].key : "(null)");
		names[i] = meta[i].key;
	}
	if (rv == PT_OK)
		rv = check_unique(path, names, n_meta, "metadata key");
	free(names);
	return rv;
}

/* build_header writes the JSON header, padded with spaces so that the data
 * starts at a multiple of 8 bytes (of PT_FILE_DIRECT_ALIGN in a file of
 * PT_FILE_DIRECT_MIN data bytes or more). */
static pt_err build_header(pt_buf *h, const pt_st_tensor *tensors, size_t n, const pt_st_meta *meta,
                           size_t n_meta, const char *sha_hex)
{
	size_t off = 0;

	PT_TRY(pt_buf_append(h, "{\"" META_KEY "\":{", 2 + strlen(META_KEY) + 3));
	for (size_t i = 0; i < n_meta; i++) {
		PT_TRY(pt_json_write_string(h, meta[i].key, strlen(meta[i].key)));
		PT_TRY(pt_buf_append(h, ":", 1));
		PT_TRY(pt_json_write_string(h, meta[i].value, strlen(meta[i].value)));
		PT_TRY(pt_buf_append(h, ",", 1));
	}
	PT_TRY(pt_buf_printf(h, "\"" SHA256_KEY "\":\"%s\"}", sha_hex));
	for (size_t i = 0; i < n; i++) {
		const pt_tensor *t = tensors[i].tensor;
		size_t nb = pt_tensor_nbytes(t);
		PT_TRY(pt_buf_append(h, ",", 1));
		PT_TRY(pt_json_write_string(h, tensors[i].name, strlen(tensors[i].name)));
		PT_TRY(
		    pt_buf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_names[t->dtype]));
		for (int d = 0; d < t->ndim; d++)
			PT_TRY(pt_buf_printf(h, "%s%" PRId64, d ? "," : "", t->shape[d]));
		PT_TRY(pt_buf_printf(h, "],\"data_offsets\":[%zu,%zu]}", off, off + nb));
		off += nb;
	}
	PT_TRY(pt_buf_append(h, "}", 1));
	/* The data starts 8-aligned; in a file written with O_DIRECT
	 * (fileio.h) at a block boundary, so it goes to disk without a copy. */
	size_t align = off >= PT_FILE_DIRECT_MIN ? PT_FILE_DIRECT_ALIGN : 8;
	while ((8 + h->len) % align != 0)
		PT_TRY(pt_buf_append(h, " ", 1));
	return PT_OK;
}

pt_err pt_safetensors_write(const char *path, const pt_st_tensor *tensors, size_t n,
                            const pt_st_meta *meta, size_t n_meta)
{
	return pt_safetensors_write_sha256(path, tensors, n, meta, n_meta, NULL, NULL);
}

pt_err pt_st_plan_init(pt_st_plan *pl, const char *path, const pt_st_tensor *tensors, size_t n,
                       const pt_st_meta *meta, size_t n_meta)
{
	memset(pl, 0, sizeof(*pl));
	pt_buf_init(&pl->header);
	PT_TRY(check_write_args(path, tensors, n, meta, n_meta));
	pl->path = path, pl->tensors = tensors, pl->n = n, pl->meta = meta, pl->n_meta = n_meta;
	pl->tmps = calloc(n + 1, sizeof(*pl->tmps));
	pl->parts = calloc(n + 2, sizeof(*pl->parts));
	if (pl->tmps == NULL || pl->parts == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: %zu tensors", path, n);
	pl->n_parts = n + 2;
	for (size_t i = 0; i < n; i++) {
		const void *bytes;
		PT_TRY(pt_file_tensor_bytes(tensors[i].tensor, &bytes, &pl->tmps[i]));
		pl->parts[i + 2] = (pt_file_part){bytes, pt_tensor_nbytes(tensors[i].tensor)};
		pl->data_len += pl->parts[i + 2].len;
	}
	return PT_OK;
}

pt_err pt_st_plan_header(pt_st_plan *pl, const char data_hex[65])
{
	pl->header.len = 0;
	PT_TRY(build_header(&pl->header, pl->tensors, pl->n, pl->meta, pl->n_meta, data_hex));
	for (int i = 0; i < 8; i++)
		pl->lenbuf[i] = (uint8_t)((uint64_t)pl->header.len >> (8 * i));
	pl->parts[0] = (pt_file_part){pl->lenbuf, 8};
	pl->parts[1] = (pt_file_part){pl->header.data, pl->header.len};
	return PT_OK;
}

pt_err pt_st_plan_write(const pt_st_plan *pl, char file_hex[65], uint64_t *file_size)
{
	return pt_file_write_atomic_sha256(pl->path, pl->parts, pl->n_parts, file_hex, file_size);
}

void pt_st_plan_fini(pt_st_plan *pl)
{
	for (size_t i = 0; pl->tmps && i < pl->n; i++)
		free(pl->tmps[i]);
	free(pl->tmps);
	free(pl->parts);
	pt_buf_fini(&pl->header);
	memset(pl, 0, sizeof(*pl));
}

pt_err pt_safetensors_write_sha256(const char *path, const pt_st_tensor *tensors, size_t n,
                                   const pt_st_meta *meta, size_t n_meta, char file_hex[65],
                                   uint64_t *file_size)
{
	pt_st_plan pl;
	pt_sha256_ctx sha;
	uint8_t digest[PT_SHA256_BYTES];
	char hex[PT_SHA256_HEX];
	pt_err rv;

	/* The checksum goes into the header, so hash every tensor's bytes first. */
	if ((rv = pt_st_plan_init(&pl, path, tensors, n, meta, n_meta)) == PT_OK) {
		pt_sha256_init(&sha);
		for (size_t i = 2; i < pl.n_parts; i++)
			pt_sha256_update(&sha, pl.parts[i].data, pl.parts[i].len);
		pt_sha256_final(&sha, digest);
		pt_sha256_hex(digest, hex);
		rv = pt_st_plan_header(&pl, hex);
	}
	if (rv == PT_OK)
		rv = pt_st_plan_write(&pl, file_hex, file_size);
	pt_st_plan_fini(&pl);
	return rv;
}
