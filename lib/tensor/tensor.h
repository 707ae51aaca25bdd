/* tensor.h - dtypes, devices, reference-counted storage and strided tensors.
 *
 * A pt_tensor is a small value (shape, strides, offset) over a pt_storage.
 * Storage is reference-counted; a tensor that holds a reference releases it in
 * pt_tensor_fini. Storage may be a slice of a parent allocation (one arena per
 * model, cut by a size table), so each slice keeps its own deferred-execution
 * state while parameters, gradients and optimizer moments stay contiguous.
 *
 * Deferred execution: a storage written by a queued op is PENDING until the
 * queue is flushed, and INVALID if that flush failed. Kernels read raw pointers
 * (pt_tensor_data); host reads go through pt_tensor_sync first.
 */
#ifndef PT_TENSOR_H
#define PT_TENSOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

#define PT_MAX_DIMS 6

typedef enum pt_dtype {
	PT_F32,
	PT_F16,
	PT_BF16,
	PT_F64,
	PT_I32,
	PT_I64,
	PT_U8,
	PT_U16,
	PT_U32,
	PT_DTYPE_COUNT
} pt_dtype;

/* pt_dtype_size returns the element size in bytes (0 for an unknown dtype). */
size_t pt_dtype_size(pt_dtype dt);

/* pt_dtype_name returns "f32", "bf16", ... ("?" for unknown). */
const char *pt_dtype_name(pt_dtype dt);

typedef enum pt_device_kind { PT_DEV_CPU, PT_DEV_CUDA } pt_device_kind;

typedef struct pt_device {
	pt_device_kind kind;
	int index;
} pt_device;

#define PT_CPU ((pt_device){PT_DEV_CPU, 0})

typedef enum pt_state { PT_READY, PT_PENDING, PT_INVALID } pt_state;

struct pt_dispatcher;

typedef struct pt_storage {
	atomic_int refs;
	void *data;
	size_t nbytes;
	pt_device device;
	struct pt_storage *parent; /* slice of parent (holds a reference), or NULL */
	bool owns_data;            /* free(data) on destroy */
	/* When set (and owns_data), the last release calls give_back(give_back_ctx,
	 * data, nbytes) instead of freeing data: a lender (a receive pool) takes
	 * it back. */
	void (*give_back)(void *ctx, void *data, size_t nbytes);
	void *give_back_ctx;
	size_t mapped;     /* > 0: data is an anonymous mapping of this many bytes */
	_Atomic int state; /* pt_state */
	/* The dispatcher whose queue will write this storage while PENDING. */
	struct pt_dispatcher *_Atomic pending_in;
} pt_storage;

/* pt_storage_create allocates nbytes (64-byte aligned, zeroed) on dev with one
 * reference owned by the caller. Only PT_DEV_CPU is served by this module. */
pt_err pt_storage_create(pt_storage **out, size_t nbytes, pt_device dev);

/* pt_storage_wrap makes a storage over caller memory that it never frees. */
pt_err pt_storage_wrap(pt_storage **out, void *data, size_t nbytes, pt_device dev);

/* pt_storage_slice makes a storage over [offset, offset+nbytes) of parent,
 * holding a reference to parent. */
pt_err pt_storage_slice(pt_storage **out, pt_storage *parent, size_t offset, size_t nbytes);

void pt_storage_retain(pt_storage *s);
/* pt_storage_release drops one reference; the last one frees. NULL is fine. */
void pt_storage_release(pt_storage *s);

/* pt_storage_prefault has the kernel fault in every page of a mapped host
 * storage now, from the calling thread's OpenMP team, without changing its
 * bytes (MADV_POPULATE_WRITE): for memory about to be written anyway, the
 * kernel's rate instead of faults taken one at a time inside the kernels'
 * loops, and on a VM whose host takes freed pages back within seconds, the
 * pages freed last are claimed while the host still backs them. Best
 * effort: nothing for device, malloc'd (small) storages and on kernels
 * before 5.14. */
void pt_storage_prefault(pt_storage *s);

typedef struct pt_tensor {
	pt_storage *storage; /* one reference held by this tensor */
	int64_t offset;      /* in elements */
	pt_dtype dtype;
	int ndim;
	int64_t shape[PT_MAX_DIMS];
	int64_t strides[PT_MAX_DIMS]; /* in elements */
} pt_tensor;

/* pt_tensor_init allocates a zeroed contiguous tensor on the host. On error t
 * is zeroed and pt_tensor_fini(t) is still safe. */
pt_err pt_tensor_init(pt_tensor *t, pt_dtype dt, int ndim, const int64_t *shape);

/* pt_tensor_init_dev is pt_tensor_init on device dev (PT_CPU: the same as
 * pt_tensor_init; a device: memory from the backend registry's pool, zeroed;
 * PT_ERR_UNSUPPORTED when dev cannot be used here). */
pt_err pt_tensor_init_dev(pt_tensor *t, pt_device dev, pt_dtype dt, int ndim, const int64_t *shape);

/* pt_tensor_device returns the device t's storage lives on. */
static inline pt_device pt_tensor_device(const pt_tensor *t)
{
	return t->storage->device;
}

/* pt_device_equal is true when a and b name the same device. */
static inline bool pt_device_equal(pt_device a, pt_device b)
{
	return a.kind == b.kind && (a.kind == PT_DEV_CPU || a.index == b.index);
}

/* pt_tensor_init_on makes a contiguous tensor over storage s starting at byte
 * offset byte_off (must be element-aligned); t takes its own reference. */
pt_err pt_tensor_init_on(pt_tensor *t, pt_storage *s, size_t byte_off, pt_dtype dt, int ndim,
                         const int64_t *shape);

/* pt_tensor_fini releases t's storage reference and zeroes t. NULL-safe. */
void pt_tensor_fini(pt_tensor *t);

/* pt_tensor_view makes dst share src's storage (a new reference). */
void pt_tensor_view(pt_tensor *dst, const pt_tensor *src);

/* pt_tensor_reshape makes dst a view of contiguous src with a new shape of the
 * same element count; PT_ERR_SHAPE otherwise. */
pt_err pt_tensor_reshape(pt_tensor *dst, const pt_tensor *src, int ndim, const int64_t *shape);

/* pt_tensor_narrow makes dst the view of src's rows [start, start+len) along dim. */
pt_err pt_tensor_narrow(pt_tensor *dst, const pt_tensor *src, int dim, int64_t start, int64_t len);

/* pt_tensor_transpose makes dst the view of src with dims a and b swapped. */
pt_err pt_tensor_transpose(pt_tensor *dst, const pt_tensor *src, int a, int b);

int64_t pt_tensor_numel(const pt_tensor *t);
size_t pt_tensor_nbytes(const pt_tensor *t);
bool pt_tensor_is_contiguous(const pt_tensor *t);
bool pt_tensor_same_shape(const pt_tensor *a, const pt_tensor *b);

/* pt_tensor_data returns the address of element 0 without any synchronisation
 * (kernels use it on queued tensors). */
static inline void *pt_tensor_data(const pt_tensor *t)
{
	return (char *)t->storage->data + t->offset * (int64_t)pt_dtype_size(t->dtype);
}
static inline float *pt_tensor_f32(const pt_tensor *t)
{
	return (float *)pt_tensor_data(t);
}

/* pt_tensor_sync is the sync boundary for host reads: when t is PENDING it
 * flushes the dispatcher queue that writes it; returns PT_ERR_PENDING_INVALID
 * when that (or an earlier) flush failed. */
pt_err pt_tensor_sync(const pt_tensor *t);

/* pt_tensor_state returns t's storage state without flushing. */
pt_state pt_tensor_state(const pt_tensor *t);

/* pt_tensor_read copies t (synced, any strides) into dst as contiguous
 * elements of t's dtype; dst_bytes must be at least pt_tensor_nbytes(t). */
pt_err pt_tensor_read(const pt_tensor *t, void *dst, size_t dst_bytes);

/* pt_tensor_write copies contiguous src elements into t (a host write; it
 * syncs first so no queued op races with it) and marks t READY. */
pt_err pt_tensor_write(pt_tensor *t, const void *src, size_t src_bytes);

/* pt_tensor_transfer copies src's elements into dst across devices: host to
 * device, device to host or within one device, through the backend registry
 * (lib/backend). dtype and element count must match; dst must be contiguous,
 * and so must src when it is on a device. It is a sync boundary for both
 * (queued ops writing them run first) and blocks until the bytes are in dst
 * when either side is the host; dst is READY afterwards. Ops (pt_copy) only
 * copy within one device; this is the explicit crossing between them. */
pt_err pt_tensor_transfer(pt_tensor *dst, const pt_tensor *src);

/* pt_tensor_item reads element `index` (row-major logical index) as double. */
pt_err pt_tensor_item(const pt_tensor *t, int64_t index, double *out);

/* pt_tensor_equal sets *eq to true when a and b have equal shape, dtype and
 * bytes (a comparison is a sync boundary). */
pt_err pt_tensor_equal(const pt_tensor *a, const pt_tensor *b, bool *eq);

/* pt_tensor_print writes a short summary and the first values (sync boundary). */
pt_err pt_tensor_print(const pt_tensor *t, FILE *f);

/* pt_tensor_convert copies src into dst converting dtypes among f32, f16,
 * bf16 and f64 (round to nearest even); shapes must match. */
pt_err pt_tensor_convert(pt_tensor *dst, const pt_tensor *src);

/* Scalar conversions, round to nearest even. */
uint16_t pt_f32_to_bf16(float f);
float pt_bf16_to_f32(uint16_t h);
uint16_t pt_f32_to_f16(float f);
float pt_f16_to_f32(uint16_t h);

/* pt_shape_str formats a shape as "(2, 3)" into buf. Returns buf. */
char *pt_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

#endif
