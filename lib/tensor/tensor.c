/* tensor.c - storage, tensors, views, host reads with sync, dtype conversion. */
#include "tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"
#include "dispatch.h"

static const size_t dtype_sizes[PT_DTYPE_COUNT] = {
    [PT_F32] = 4, [PT_F16] = 2, [PT_BF16] = 2, [PT_F64] = 8, [PT_I32] = 4,
    [PT_I64] = 8, [PT_U8] = 1,  [PT_U16] = 2,  [PT_U32] = 4,
};
static const char *const dtype_names[PT_DTYPE_COUNT] = {
    [PT_F32] = "f32", [PT_F16] = "f16", [PT_BF16] = "bf16", [PT_F64] = "f64", [PT_I32] = "i32",
    [PT_I64] = "i64", [PT_U8] = "u8",   [PT_U16] = "u16",   [PT_U32] = "u32",
};

size_t pt_dtype_size(pt_dtype dt)
{
	return (unsigned)dt < PT_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}

const char *pt_dtype_name(pt_dtype dt)
{
	return (unsigned)dt < PT_DTYPE_COUNT ? dtype_names[dt] : "?";
}

static pt_err storage_new(pt_storage **out, void *data, size_t nbytes, pt_device dev, bool owns,
                          pt_storage *parent)
{
	pt_storage *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return pt_set_error(PT_ERR_NOMEM, "storage header");
	atomic_init(&s->refs, 1);
	s->data = data;
	s->nbytes = nbytes;
	s->device = dev;
	s->owns_data = owns;
	s->parent = parent;
	atomic_init(&s->state, PT_READY);
	atomic_init(&s->pending_in, NULL);
	*out = s;
	return PT_OK;
}

/* Host storages of at least this many bytes are anonymous mappings: the
 * kernel's zero pages, touched only where written (and given back at once
 * when freed), in 2 MiB-aligned runs that may be huge pages. Smaller ones
 * come from malloc, zeroed; so do all under AddressSanitizer, which checks
 * malloc'd memory only. */
#if defined(__SANITIZE_ADDRESS__)
#define MAP_MIN SIZE_MAX
#else
#define MAP_MIN ((size_t)32 << 20)
#endif
#define HUGE_2M ((size_t)2 << 20)

/* map_zeroed returns len (a multiple of HUGE_2M) zero bytes aligned to 2 MiB,
 * or NULL. */
static void *map_zeroed(size_t len)
{
	uint8_t *p =
	    mmap(NULL, len + HUGE_2M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t a;
	size_t head;
	if (p == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)p + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1);
	head = (size_t)(a - (uintptr_t)p);
	if (head > 0)
		munmap(p, head);
	if (HUGE_2M - head > 0)
		munmap((uint8_t *)a + len, HUGE_2M - head);
#ifdef MADV_HUGEPAGE
	(void)madvise((void *)a, len, MADV_HUGEPAGE); /* best effort */
#endif
	return (void *)a;
}

pt_err pt_storage_create(pt_storage **out, size_t nbytes, pt_device dev)
{
	void *data;
	size_t rounded = (nbytes + 63) & ~(size_t)63;

	*out = NULL;
	if (dev.kind != PT_DEV_CPU) {
		/* Device memory comes from the backend registry (its pool). */
		PT_TRY(pt_backend_alloc(dev, nbytes, &data));
		if (storage_new(out, data, nbytes, dev, true, NULL) != PT_OK) {
			pt_backend_free(dev, data);
			return PT_ERR_NOMEM;
		}
		return PT_OK;
	}
	if (rounded < nbytes)
		return pt_set_error(PT_ERR_OVERFLOW, "storage of %zu bytes", nbytes);
	if (rounded >= MAP_MIN && rounded <= SIZE_MAX - 2 * HUGE_2M) {
		size_t len = (rounded + HUGE_2M - 1) & ~(HUGE_2M - 1);
		if ((data = map_zeroed(len)) != NULL) {
			if (storage_new(out, data, nbytes, dev, true, NULL) != PT_OK) {
				munmap(data, len);
				return PT_ERR_NOMEM;
			}
			(*out)->mapped = len;
			return PT_OK;
		}
	}
	data = aligned_alloc(64, rounded ? rounded : 64);
	if (data == NULL)
		return pt_set_error(PT_ERR_NOMEM, "storage of %zu bytes", nbytes);
	memset(data, 0, rounded ? rounded : 64);
	if (storage_new(out, data, nbytes, dev, true, NULL) != PT_OK) {
		free(data);
		return PT_ERR_NOMEM;
	}
	return PT_OK;
}

void pt_storage_prefault(pt_storage *s)
{
#ifdef MADV_POPULATE_WRITE
	char *base;
	long n;
	if (s == NULL || s->device.kind != PT_DEV_CPU || s->mapped == 0)
		return;
	base = s->data;
	n = (long)(s->mapped / HUGE_2M); /* mapped: a multiple of HUGE_2M */
#pragma omp parallel for schedule(dynamic, 8)
	for (long i = 0; i < n; i++)
		(void)madvise(base + (size_t)i * HUGE_2M, HUGE_2M, MADV_POPULATE_WRITE);
#else
	(void)s;
#endif
}

pt_err pt_storage_wrap(pt_storage **out, void *data, size_t nbytes, pt_device dev)
{
	return storage_new(out, data, nbytes, dev, false, NULL);
}

pt_err pt_storage_slice(pt_storage **out, pt_storage *parent, size_t offset, size_t nbytes)
{
	if (offset > parent->nbytes || nbytes > parent->nbytes - offset)
		return pt_set_error(PT_ERR_RANGE, "slice [%zu, +%zu) of a %zu-byte storage", offset,
		                    nbytes, parent->nbytes);
	PT_TRY(
	    storage_new(out, (char *)parent->data + offset, nbytes, parent->device, false, parent));
	pt_storage_retain(parent);
	return PT_OK;
}

void pt_storage_retain(pt_storage *s)
{
	atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void pt_storage_release(pt_storage *s)
{
	if (s == NULL)
		return;
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
		return;
	if (s->owns_data && s->give_back != NULL)
		s->give_back(s->give_back_ctx, s->data, s->nbytes);
	else if (s->owns_data && s->device.kind != PT_DEV_CPU)
		pt_backend_free(s->device, s->data);
	else if (s->owns_data && s->mapped > 0)
		munmap(s->data, s->mapped);
	else if (s->owns_data)
		free(s->data);
	pt_storage_release(s->parent);
	free(s);
}

static void set_contiguous(pt_tensor *t)
{
	int64_t stride = 1;
	for (int i = t->ndim - 1; i >= 0; i--) {
		t->strides[i] = stride;
		stride *= t->shape[i];
	}
}

/* check_shape bounds the product of the dimensions with the zero ones left
 * out (span): the strides are products of dimensions, and a tensor of no
 * values (0 x 2^62 x 2^62) must still have strides that fit. */
static pt_err check_shape(int ndim, const int64_t *shape, int64_t *numel)
{
	int64_t n = 1, span = 1;
	if (ndim < 0 || ndim > PT_MAX_DIMS)
		return pt_set_error(PT_ERR_SHAPE, "%d dimensions (at most %d)", ndim, PT_MAX_DIMS);
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			return pt_set_error(PT_ERR_SHAPE, "negative dimension %" PRId64, shape[i]);
		if (shape[i] != 0 && span > INT64_MAX / 16 / shape[i])
			return pt_set_error(PT_ERR_OVERFLOW, "tensor too large");
		span *= shape[i] != 0 ? shape[i] : 1;
		n *= shape[i];
	}
	*numel = n;
	return PT_OK;
}

pt_err pt_tensor_init(pt_tensor *t, pt_dtype dt, int ndim, const int64_t *shape)
{
	return pt_tensor_init_dev(t, PT_CPU, dt, ndim, shape);
}

pt_err pt_tensor_init_dev(pt_tensor *t, pt_device dev, pt_dtype dt, int ndim, const int64_t *shape)
{
	int64_t n = 0;
	pt_storage *s;
	pt_err rv;

	memset(t, 0, sizeof(*t));
	if (pt_dtype_size(dt) == 0)
		return pt_set_error(PT_ERR_DTYPE, "dtype %d", (int)dt);
	PT_TRY(check_shape(ndim, shape, &n));
	if ((rv = pt_storage_create(&s, (size_t)n * pt_dtype_size(dt), dev)) != PT_OK)
		return rv;
	rv = pt_tensor_init_on(t, s, 0, dt, ndim, shape);
	pt_storage_release(s);
	return rv;
}

pt_err pt_tensor_init_on(pt_tensor *t, pt_storage *s, size_t byte_off, pt_dtype dt, int ndim,
                         const int64_t *shape)
{
	int64_t n = 0;
	size_t es = pt_dtype_size(dt);

	memset(t, 0, sizeof(*t));
	if (es == 0)
		return pt_set_error(PT_ERR_DTYPE, "dtype %d", (int)dt);
	PT_TRY(check_shape(ndim, shape, &n));
	if (byte_off % es != 0)
		return pt_set_error(PT_ERR_INVALID, "byte offset %zu not aligned to %s", byte_off,
		                    pt_dtype_name(dt));
	if (byte_off > s->nbytes || (size_t)n * es > s->nbytes - byte_off)
		return pt_set_error(
		    PT_ERR_RANGE, "tensor of %" PRId64 " x %s at byte %zu exceeds %zu-byte storage",
		    n, pt_dtype_name(dt), byte_off, s->nbytes);
	t->storage = s;
	pt_storage_retain(s);
	t->offset = (int64_t)(byte_off / es);
	t->dtype = dt;
	t->ndim = ndim;
	if (ndim > 0)
		memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
	set_contiguous(t);
	return PT_OK;
}

void pt_tensor_fini(pt_tensor *t)
{
	if (t == NULL)
		return;
	pt_storage_release(t->storage);
	memset(t, 0, sizeof(*t));
}

void pt_tensor_view(pt_tensor *dst, const pt_tensor *src)
{
	pt_tensor tmp = *src;
	if (tmp.storage)
		pt_storage_retain(tmp.storage);
	*dst = tmp;
}

int64_t pt_tensor_numel(const pt_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

size_t pt_tensor_nbytes(const pt_tensor *t)
{
	return (size_t)pt_tensor_numel(t) * pt_dtype_size(t->dtype);
}

bool pt_tensor_is_contiguous(const pt_tensor *t)
{
	int64_t stride = 1;
	for (int i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->strides[i] != stride)
			return false;
		stride *= t->shape[i];
	}
	return true;
}

bool pt_tensor_same_shape(const pt_tensor *a, const pt_tensor *b)
{
	if (a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

char *pt_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
	size_t off = 0;
	off += (size_t)snprintf(buf + off, len - off, "(");
	for (int i = 0; i < ndim && off < len; i++)
		off +=
		    (size_t)snprintf(buf + off, len - off, "%s%" PRId64, i ? ", " : "", shape[i]);
	if (off < len)
		snprintf(buf + off, len - off, ")");
	return buf;
}

pt_err pt_tensor_reshape(pt_tensor *dst, const pt_tensor *src, int ndim, const int64_t *shape)
{
	int64_t n = 0;
	char a[96], b[96];
	pt_tensor tmp;

	PT_TRY(check_shape(ndim, shape, &n));
	if (n != pt_tensor_numel(src))
		return pt_set_error(PT_ERR_SHAPE, "reshape %s to %s changes the element count",
		                    pt_shape_str(a, sizeof(a), src->ndim, src->shape),
		                    pt_shape_str(b, sizeof(b), ndim, shape));
	if (!pt_tensor_is_contiguous(src))
		return pt_set_error(PT_ERR_SHAPE, "reshape of a non-contiguous tensor");
	tmp = *src;
	tmp.ndim = ndim;
	memcpy(tmp.shape, shape, sizeof(int64_t) * (size_t)ndim);
	set_contiguous(&tmp);
	pt_storage_retain(tmp.storage);
	*dst = tmp;
	return PT_OK;
}

pt_err pt_tensor_narrow(pt_tensor *dst, const pt_tensor *src, int dim, int64_t start, int64_t len)
{
	pt_tensor tmp;
	if (dim < 0 || dim >= src->ndim)
		return pt_set_error(PT_ERR_RANGE, "narrow: dim %d of a %d-d tensor", dim,
		                    src->ndim);
	if (start < 0 || len < 0 || start > src->shape[dim] || len > src->shape[dim] - start)
		return pt_set_error(PT_ERR_RANGE, "narrow: [%" PRId64 ", +%" PRId64 ") of %" PRId64,
		                    start, len, src->shape[dim]);
	tmp = *src;
	tmp.offset += start * src->strides[dim];
	tmp.shape[dim] = len;
	pt_storage_retain(tmp.storage);
	*dst = tmp;
	return PT_OK;
}

pt_err pt_tensor_transpose(pt_tensor *dst, const pt_tensor *src, int a, int b)
{
	pt_tensor tmp;
	int64_t x;
	if (a < 0 || b < 0 || a >= src->ndim || b >= src->ndim)
		return pt_set_error(PT_ERR_RANGE, "transpose dims %d, %d of a %d-d tensor", a, b,
		                    src->ndim);
	tmp = *src;
	x = tmp.shape[a], tmp.shape[a] = tmp.shape[b], tmp.shape[b] = x;
	x = tmp.strides[a], tmp.strides[a] = tmp.strides[b], tmp.strides[b] = x;
	pt_storage_retain(tmp.storage);
	*dst = tmp;
	return PT_OK;
}

pt_state pt_tensor_state(const pt_tensor *t)
{
	return (pt_state)atomic_load(&t->storage->state);
}

pt_err pt_tensor_sync(const pt_tensor *t)
{
	pt_storage *s = t->storage;
	pt_state st;

	if (s == NULL)
		return pt_set_error(PT_ERR_INVALID, "tensor has no storage");
	st = (pt_state)atomic_load(&s->state);
	if (st == PT_PENDING) {
		pt_dispatcher *d = atomic_load(&s->pending_in);
		pt_err rv = d ? pt_dispatcher_flush(d) : PT_OK;
		if (rv != PT_OK)
			return rv;
		st = (pt_state)atomic_load(&s->state);
	}
	if (st == PT_INVALID)
		return pt_set_error(
		    PT_ERR_PENDING_INVALID,
		    "tensor is invalid: the deferred flush that computes it failed");
	if (st == PT_PENDING)
		return pt_set_error(PT_ERR_STATE, "tensor still pending after flush");
	return PT_OK;
}

/* Walks the logical elements of t in row-major order, calling fn with a byte pointer. */
#define FOR_EACH_ELEMENT(t, ptr, body)                                                             \
	do {                                                                                       \
		int64_t idx_[PT_MAX_DIMS] = {0};                                                   \
		int64_t n_ = pt_tensor_numel(t);                                                   \
		size_t es_ = pt_dtype_size((t)->dtype);                                            \
		for (int64_t k_ = 0; k_ < n_; k_++) {                                              \
			int64_t off_ = (t)->offset;                                                \
			for (int d_ = 0; d_ < (t)->ndim; d_++)                                     \
				off_ += idx_[d_] * (t)->strides[d_];                               \
			const char *ptr = (const char *)(t)->storage->data + off_ * (int64_t)es_;  \
			body;                                                                      \
			for (int d_ = (t)->ndim - 1; d_ >= 0; d_--) {                              \
				if (++idx_[d_] < (t)->shape[d_])                                   \
					break;                                                     \
				idx_[d_] = 0;                                                      \
			}                                                                          \
		}                                                                                  \
	} while (0)

pt_err pt_tensor_read(const pt_tensor *t, void *dst, size_t dst_bytes)
{
	size_t nb = pt_tensor_nbytes(t);
	PT_TRY(pt_tensor_sync(t));
	if (dst_bytes < nb)
		return pt_set_error(PT_ERR_RANGE, "read of %zu bytes into %zu", nb, dst_bytes);
	if (t->storage->device.kind != PT_DEV_CPU) {
		if (!pt_tensor_is_contiguous(t))
			return pt_set_error(PT_ERR_UNSUPPORTED,
			                    "host read of a non-contiguous device tensor");
		return pt_backend_copy(dst, PT_CPU, pt_tensor_data(t), t->storage->device, nb);
	}
	if (pt_tensor_is_contiguous(t)) {
		memcpy(dst, pt_tensor_data(t), nb);
	} else {
		char *o = dst;
		size_t es = pt_dtype_size(t->dtype);
		FOR_EACH_ELEMENT(t, p, {
			memcpy(o, p, es);
			o += es;
		});
	}
	return PT_OK;
}

pt_err pt_tensor_write(pt_tensor *t, const void *src, size_t src_bytes)
{
	size_t nb = pt_tensor_nbytes(t);
	pt_state st = pt_tensor_state(t);
	if (st == PT_PENDING)
		PT_TRY(pt_tensor_sync(t));
	if (src_bytes < nb)
		return pt_set_error(PT_ERR_RANGE, "write of %zu bytes from %zu", nb, src_bytes);
	if (!pt_tensor_is_contiguous(t))
		return pt_set_error(PT_ERR_INVALID, "host write into a non-contiguous tensor");
	if (t->storage->device.kind != PT_DEV_CPU)
		PT_TRY(pt_backend_copy(pt_tensor_data(t), t->storage->device, src, PT_CPU, nb));
	else
		memcpy(pt_tensor_data(t), src, nb);
	atomic_store(&t->storage->state, PT_READY);
	return PT_OK;
}

pt_err pt_tensor_transfer(pt_tensor *dst, const pt_tensor *src)
{
	size_t nb = pt_tensor_nbytes(src);
	pt_device dd = dst->storage->device, sd = src->storage->device;
	void *tmp;
	pt_err rv;

	if (src->dtype != dst->dtype || pt_tensor_numel(src) != pt_tensor_numel(dst))
		return pt_set_error(PT_ERR_SHAPE, "transfer of %ld x %s into %ld x %s",
		                    (long)pt_tensor_numel(src), pt_dtype_name(src->dtype),
		                    (long)pt_tensor_numel(dst), pt_dtype_name(dst->dtype));
	if (!pt_tensor_is_contiguous(dst))
		return pt_set_error(PT_ERR_INVALID, "transfer into a non-contiguous tensor");
	if (sd.kind == PT_DEV_CPU) {
		if (pt_tensor_is_contiguous(src)) {
			PT_TRY(pt_tensor_sync(src));
			return pt_tensor_write(dst, pt_tensor_data(src), nb);
		}
		/* Pack a strided host tensor first (device memory is written whole). */
		if ((tmp = malloc(nb ? nb : 1)) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "transfer buffer of %zu bytes", nb);
		if ((rv = pt_tensor_read(src, tmp, nb)) == PT_OK)
			rv = pt_tensor_write(dst, tmp, nb);
		free(tmp);
		return rv;
	}
	if (pt_tensor_state(dst) == PT_PENDING)
		PT_TRY(pt_tensor_sync(dst));
	if (dd.kind == PT_DEV_CPU) {
		/* pt_tensor_read syncs src and copies device to host. */
		PT_TRY(pt_tensor_read(src, pt_tensor_data(dst), nb));
	} else {
		PT_TRY(pt_tensor_sync(src));
		if (!pt_tensor_is_contiguous(src))
			return pt_set_error(PT_ERR_UNSUPPORTED,
			                    "transfer of a non-contiguous device tensor");
		PT_TRY(pt_backend_copy(pt_tensor_data(dst), dd, pt_tensor_data(src), sd, nb));
	}
	atomic_store(&dst->storage->state, PT_READY);
	return PT_OK;
}

static double element_as_double(pt_dtype dt, const char *p)
{
	switch (dt) {
	case PT_F32: {
		float v;
		memcpy(&v, p, 4);
		return v;
	}
	case PT_F64: {
		double v;
		memcpy(&v, p, 8);
		return v;
	}
	case PT_F16: {
		uint16_t v;
		memcpy(&v, p, 2);
		return pt_f16_to_f32(v);
	}
	case PT_BF16: {
		uint16_t v;
		memcpy(&v, p, 2);
		return pt_bf16_to_f32(v);
	}
	case PT_I32: {
		int32_t v;
		memcpy(&v, p, 4);
		return v;
	}
	case PT_I64: {
		int64_t v;
		memcpy(&v, p, 8);
		return (double)v;
	}
	case PT_U8:
		return (unsigned char)*p;
	case PT_U16: {
		uint16_t v;
		memcpy(&v, p, 2);
		return v;
	}
	case PT_U32: {
		uint32_t v;
		memcpy(&v, p, 4);
		return v;
	}
	default:
		return NAN;
	}
}

pt_err pt_tensor_item(const pt_tensor *t, int64_t index, double *out)
{
	int64_t off = t->offset, rem = index, n = pt_tensor_numel(t);
	PT_TRY(pt_tensor_sync(t));
	if (index < 0 || index >= n)
		return pt_set_error(PT_ERR_RANGE, "item %" PRId64 " of %" PRId64, index, n);
	for (int d = t->ndim - 1; d >= 0; d--) {
		off += (rem % t->shape[d]) * t->strides[d];
		rem /= t->shape[d];
	}
	const char *p = (const char *)t->storage->data + off * (int64_t)pt_dtype_size(t->dtype);
	if (t->storage->device.kind != PT_DEV_CPU) {
		/* Device memory is not host-readable: fetch the one element. */
		char buf[8];
		PT_TRY(
		    pt_backend_copy(buf, PT_CPU, p, t->storage->device, pt_dtype_size(t->dtype)));
		*out = element_as_double(t->dtype, buf);
		return PT_OK;
	}
	*out = element_as_double(t->dtype, p);
	return PT_OK;
}

pt_err pt_tensor_equal(const pt_tensor *a, const pt_tensor *b, bool *eq)
{
	size_t nb = pt_tensor_nbytes(a);
	char *x, *y;
	pt_err rv;

	*eq = false;
	PT_TRY(pt_tensor_sync(a));
	PT_TRY(pt_tensor_sync(b));
	if (a->dtype != b->dtype || !pt_tensor_same_shape(a, b))
		return PT_OK;
	x = malloc(nb ? nb : 1);
	y = malloc(nb ? nb : 1);
	if (x == NULL || y == NULL) {
		free(x);
		free(y);
		return pt_set_error(PT_ERR_NOMEM, "compare buffers");
	}
	if ((rv = pt_tensor_read(a, x, nb)) == PT_OK && (rv = pt_tensor_read(b, y, nb)) == PT_OK)
		*eq = memcmp(x, y, nb) == 0;
	free(x);
	free(y);
	return rv;
}

pt_err pt_tensor_print(const pt_tensor *t, FILE *f)
{
	char sh[128];
	int64_t n = pt_tensor_numel(t);
	PT_TRY(pt_tensor_sync(t));
	fprintf(f, "tensor%s %s [", pt_shape_str(sh, sizeof(sh), t->ndim, t->shape),
	        pt_dtype_name(t->dtype));
	for (int64_t i = 0; i < n && i < 8; i++) {
		double v;
		PT_TRY(pt_tensor_item(t, i, &v));
		fprintf(f, "%s%.6g", i ? ", " : "", v);
	}
	fprintf(f, "%s]\n", n > 8 ? ", ..." : "");
	return PT_OK;
}

uint16_t pt_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

float pt_bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, 4);
	return f;
}

uint16_t pt_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t absx = x & 0x7fffffffu;
	if (absx > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u);
	if (absx >= 0x477ff000u) /* rounds to >= 65520: infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (absx < 0x38800000u) { /* subnormal or zero in f16 */
		float a;
		memcpy(&a, &absx, 4);
		/* a * 2^24 rounded to nearest even gives the subnormal mantissa. */
		uint32_t m = (uint32_t)lrintf(a * 16777216.0f);
		return (uint16_t)(sign | m);
	}
	uint32_t mant = absx & 0x7fffffu;
	uint32_t exp = (absx >> 23) - 127 + 15;
	uint32_t h = (exp << 10) | (mant >> 13);
	uint32_t rest = mant & 0x1fffu;
	if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
		h++;
	return (uint16_t)(sign | h);
}

float pt_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;
	uint32_t x;
	float f;
	if (exp == 0) {
		f = (float)mant * (1.0f / 16777216.0f);
		return sign ? -f : f;
	}
	if (exp == 31)
		x = sign | 0x7f800000u | (mant << 13);
	else
		x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
	memcpy(&f, &x, 4);
	return f;
}

pt_err pt_tensor_convert(pt_tensor *dst, const pt_tensor *src)
{
	int64_t n = pt_tensor_numel(src);
	if (!pt_tensor_same_shape(dst, src))
		return pt_set_error(PT_ERR_SHAPE, "convert between different shapes");
	if (!pt_tensor_is_contiguous(dst) || !pt_tensor_is_contiguous(src))
		return pt_set_error(PT_ERR_INVALID, "convert needs contiguous tensors");
	if (dst->storage->device.kind != PT_DEV_CPU || src->storage->device.kind != PT_DEV_CPU)
		return pt_set_error(PT_ERR_UNSUPPORTED,
		                    "convert of a device tensor (a host loop; copy it to the CPU)");
	PT_TRY(pt_tensor_sync(src));
	/* A host write: queued ops writing dst must run first, or they would win. */
	if (pt_tensor_state(dst) == PT_PENDING)
		PT_TRY(pt_tensor_sync(dst));
	const char *s = pt_tensor_data(src);
	char *d = pt_tensor_data(dst);
	for (int64_t i = 0; i < n; i++) {
		double v =
		    element_as_double(src->dtype, s + i * (int64_t)pt_dtype_size(src->dtype));
		switch (dst->dtype) {
		case PT_F32:
			((float *)d)[i] = (float)v;
			break;
		case PT_F64:
			((double *)d)[i] = v;
			break;
		case PT_BF16:
			((uint16_t *)d)[i] = pt_f32_to_bf16((float)v);
			break;
		case PT_F16:
			((uint16_t *)d)[i] = pt_f32_to_f16((float)v);
			break;
		default:
			return pt_set_error(PT_ERR_DTYPE, "convert to %s",
			                    pt_dtype_name(dst->dtype));
		}
	}
	atomic_store(&dst->storage->state, PT_READY);
	return PT_OK;
}
