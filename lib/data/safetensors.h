/* safetensors.h - read and write .safetensors checkpoints.
 *
 * Format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...},
 *    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * then the data section; offsets are relative to it. dtypes: F32 F16 BF16 F64
 * I32 I64 U8 U16 U32 (others are refused).
 *
 * The writer stores tensors contiguously in the order given, pads the header
 * with spaces to a multiple of 8 bytes, records the SHA-256 of the data
 * section as __metadata__["data_sha256"], and replaces the file atomically.
 * The reader trusts nothing: every malformed file is PT_ERR_FORMAT with a
 * message naming the file and the problem; tensors must tile the data section
 * exactly (no overlap, no hole), and data_sha256, when present, must match.
 * Names are opaque (PyTorch state_dict names such as "0.weight" by convention).
 */
#ifndef PT_SAFETENSORS_H
#define PT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "fileio.h"
#include "json.h"
#include "tensor.h"

/* Header lengths above this are refused as absurd (the reference reader's limit). */
#define PT_SAFETENSORS_MAX_HEADER 100000000u
/* JSON values a header may hold (about ten a tensor). */
#define PT_SAFETENSORS_MAX_VALUES (1u << 20)

/* A named tensor to write (both borrowed). */
typedef struct pt_st_tensor {
	const char *name;
	const pt_tensor *tensor;
} pt_st_tensor;

/* A metadata entry to write (both borrowed, UTF-8). */
typedef struct pt_st_meta {
	const char *key;
	const char *value;
} pt_st_meta;

/* pt_safetensors_write writes n tensors (CPU, any strides; each is synced)
 * and n_meta metadata entries to path, atomically (path.tmp.<pid>, fsync,
 * rename, fsync of the directory). Names must be unique, non-empty and not
 * "__metadata__"; metadata keys unique and not "data_sha256" (PT_ERR_INVALID).
 * Blocking; thread-safe for distinct paths. */
pt_err pt_safetensors_write_sha256(const char *path, const pt_st_tensor *tensors, size_t n,
                                   const pt_st_meta *meta, size_t n_meta, char file_hex[65],
                                   uint64_t *file_size);
/* pt_safetensors_write_sha256 is pt_safetensors_write that also gives the
 * written file's SHA-256 (64 hex digits) and size (pt_file_write_atomic_sha256). */
pt_err pt_safetensors_write(const char *path, const pt_st_tensor *tensors, size_t n,
                            const pt_st_meta *meta, size_t n_meta);

/* A safetensors file laid out for a writer that hashes its bytes itself (a
 * checkpoint hashes two files together, pt_sha256_update2).
 * pt_st_plan_init checks the arguments as pt_safetensors_write does and
 * finds each tensor's bytes: parts[2..n_parts) hold the data section,
 * data_len bytes in all. pt_st_plan_header builds the header for the data's
 * SHA-256 (64 hex digits) into parts[0] (its 8-byte length) and parts[1].
 * pt_st_plan_write then writes the parts atomically (file_hex and
 * file_size may be NULL; pt_file_write_atomic_sha256). The tensors and the
 * metadata are borrowed until the header is built. pt_st_plan_fini frees
 * what init took (NULL-safe on a zeroed plan). */
typedef struct pt_st_plan {
	pt_file_part *parts;
	size_t n_parts;
	uint64_t data_len;
	/* private */
	const char *path;
	const pt_st_tensor *tensors;
	const pt_st_meta *meta;
	size_t n, n_meta;
	void **tmps;
	pt_buf header;
	uint8_t lenbuf[8];
} pt_st_plan;
pt_err pt_st_plan_init(pt_st_plan *pl, const char *path, const pt_st_tensor *tensors, size_t n,
                       const pt_st_meta *meta, size_t n_meta);
pt_err pt_st_plan_header(pt_st_plan *pl, const char data_hex[65]);
pt_err pt_st_plan_write(const pt_st_plan *pl, char file_hex[65], uint64_t *file_size);
void pt_st_plan_fini(pt_st_plan *pl);

typedef struct pt_safetensors pt_safetensors;

/* pt_safetensors_open reads and validates the whole file into a new object
 * that owns its bytes; the caller releases it with pt_safetensors_destroy.
 * On error *out is NULL. Blocking. A read-only object may be shared by threads. */
pt_err pt_safetensors_open(pt_safetensors **out, const char *path);

/* pt_safetensors_open_fd is pt_safetensors_open on the open regular file fd
 * (read with pread from offset 0; the caller still owns and closes fd); path
 * is only used in messages. */
pt_err pt_safetensors_open_fd(pt_safetensors **out, int fd, const char *path);

/* pt_safetensors_destroy frees st. Tensors returned by pt_safetensors_get
 * stay valid (they hold a reference to the bytes). NULL-safe. */
void pt_safetensors_destroy(pt_safetensors *st);

/* pt_safetensors_count returns the number of tensors. */
size_t pt_safetensors_count(const pt_safetensors *st);

/* pt_safetensors_name returns the name of tensor i in header order (for files
 * from pt_safetensors_write, the order given to the writer), or NULL. */
const char *pt_safetensors_name(const pt_safetensors *st, size_t i);

/* pt_safetensors_info gives a tensor's dtype and shape (shape has
 * PT_MAX_DIMS slots). PT_ERR_NOTFOUND naming the tensor when absent. */
pt_err pt_safetensors_info(const pt_safetensors *st, const char *name, pt_dtype *dtype, int *ndim,
                           int64_t *shape);

/* pt_safetensors_get makes *out a tensor of the named entry: a view over st's
 * bytes when the data is aligned for its dtype (writes through it change only
 * this in-memory copy), else a new copy. The caller releases *out with
 * pt_tensor_fini. PT_ERR_NOTFOUND when absent; on error *out is zeroed. */
pt_err pt_safetensors_get(const pt_safetensors *st, const char *name, pt_tensor *out);

/* pt_safetensors_copy copies the named entry into dst (contiguous, same dtype
 * and shape, else PT_ERR_DTYPE / PT_ERR_SHAPE naming the tensor and both
 * shapes). A host write: queued ops writing dst are flushed first. */
pt_err pt_safetensors_copy(const pt_safetensors *st, const char *name, pt_tensor *dst);

/* pt_safetensors_meta returns the metadata value of key, or NULL. */
const char *pt_safetensors_meta(const pt_safetensors *st, const char *key);

/* pt_safetensors_meta_count and pt_safetensors_meta_key list the metadata
 * keys in header order (including data_sha256 when present). */
size_t pt_safetensors_meta_count(const pt_safetensors *st);
const char *pt_safetensors_meta_key(const pt_safetensors *st, size_t i);

/* pt_safetensors_dtype_name returns "F32", "BF16", ... for a pt_dtype. */
const char *pt_safetensors_dtype_name(pt_dtype dt);

#endif
