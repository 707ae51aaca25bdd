/* fileio.h - whole-buffer file reads and crash-safe (atomic) file writes.
 *
 * The data formats (npy, token files, safetensors) share these so that every
 * short read, EINTR and failed fsync is handled in one place, and every error
 * message names the file. Errors are PT_ERR_IO (with strerror) or PT_ERR_NOMEM.
 */
#ifndef PT_FILEIO_H
#define PT_FILEIO_H

#include <stdbool.h>
#include <stddef.h>

#include "error.h"
#include "sha256.h"
#include "tensor.h"

/* pt_read_full reads exactly len bytes from fd at byte offset off (pread, so
 * the file position is untouched). A file that ends early is PT_ERR_FORMAT
 * ("truncated"); path is only used in messages. */
pt_err pt_read_full(int fd, void *buf, size_t len, size_t off, const char *path);

/* pt_file_fd_size gives the size of the regular file open as fd (anything
 * else is PT_ERR_IO "not a regular file"); path is only used in messages. */
pt_err pt_file_fd_size(int fd, const char *path, size_t *size);

/* pt_file_open_read opens path read-only and returns its descriptor and size
 * (PT_ERR_BUSY when out of descriptors, as pt_file_open_under). The caller
 * closes *fd. */
pt_err pt_file_open_read(const char *path, int *fd, size_t *size);

/* pt_file_read reads a whole file into a new malloc'd buffer (one extra NUL
 * byte after the data, not counted in *len). Files larger than max_bytes are
 * refused with PT_ERR_RANGE. The caller frees *data. */
pt_err pt_file_read(const char *path, size_t max_bytes, void **data, size_t *len);

/* pt_file_read_fd is pt_file_read on an open descriptor (read with pread; the
 * caller still owns and closes fd). */
pt_err pt_file_read_fd(int fd, const char *path, size_t max_bytes, void **data, size_t *len);

/* The message of every path refused by pt_file_open_under for leaving its
 * root: the same text whatever lies outside. */
#define PT_FILE_OUTSIDE_ROOT "outside the files root (absolute paths and '..' are refused)"

/* pt_file_open_under opens a file named by a client, read-only: a relative
 * path resolves against root (NULL or "": the working directory). Unless
 * any_path, the file must lie beneath root after every symlink is followed:
 * an absolute path, a ".." that climbs out, or a symlink that leads out is
 * PT_ERR_INVALID PT_FILE_OUTSIDE_ROOT, decided on the text and by the kernel
 * during resolution (openat2 RESOLVE_BENEATH) without opening or looking at
 * anything outside, so that answer never tells whether such a file exists.
 * Errors inside root are PT_ERR_IO "cannot open 'PATH': REASON", or
 * PT_ERR_BUSY when the process or system is out of descriptors or memory
 * (EMFILE, ENFILE, ENOMEM, ENOBUFS: not the file's fault). The file is
 * opened O_NONBLOCK (a FIFO does not block); check it with pt_file_fd_size.
 * The caller closes *fd. Thread-safe. */
pt_err pt_file_open_under(const char *root, const char *path, bool any_path, int *fd);

/* One piece of a file to write. */
typedef struct pt_file_part {
	const void *data;
	size_t len;
} pt_file_part;

/* pt_file_write_atomic writes the parts in order to "<path>.tmp.<pid>", fsyncs
 * it, renames it over path and fsyncs the directory, so a reader sees either
 * the old file or the whole new one, never a truncated one. On failure the
 * temporary file is removed and path is untouched. Two threads of one process
 * must not write the same path at the same time (they share the temp name).
 * A file of PT_FILE_DIRECT_MIN bytes or more is written with O_DIRECT where
 * its file system takes it, so a checkpoint leaves no page cache behind: a
 * part that starts at a PT_FILE_DIRECT_ALIGN boundary both in memory and in
 * the file goes from where it is, the rest through a 4 MiB aligned staging
 * buffer. Elsewhere, and for smaller files, through the cache. */
#define PT_FILE_DIRECT_MIN   ((size_t)8 << 20)
#define PT_FILE_DIRECT_ALIGN ((size_t)4096)
pt_err pt_file_write_atomic(const char *path, const pt_file_part *parts, size_t n);

/* pt_file_write_atomic_sha256 is pt_file_write_atomic that also gives the
 * SHA-256 (64 hex digits) and size of the file written, hashed from the parts
 * as they are written, so nobody reads the file back to list it. */
pt_err pt_file_write_atomic_sha256(const char *path, const pt_file_part *parts, size_t n,
                                   char hex[65], uint64_t *size);

/* A list of parts read as one stream of bytes, from the start: parts, n and
 * the rest zero. */
typedef struct pt_parts_cursor {
	const pt_file_part *parts;
	size_t n, i, off;
} pt_parts_cursor;

/* pt_parts_sha256_2 appends the next na bytes of cursor a to s and the next
 * nb bytes of cursor b to t, compressing the stretch both have in pairs
 * (pt_sha256_update2) and the rest alone; s or t may be NULL with its count
 * 0. A cursor that holds fewer bytes stops at its end. */
void pt_parts_sha256_2(pt_sha256_ctx *s, pt_parts_cursor *a, uint64_t na, pt_sha256_ctx *t,
                       pt_parts_cursor *b, uint64_t nb);

/* pt_file_tensor_bytes gives the row-major bytes of t for writing: a pointer
 * into t's storage when t is contiguous, else a new copy returned in *tmp too
 * (the caller frees *tmp, which may be NULL). Syncs t first (a host read). */
pt_err pt_file_tensor_bytes(const pt_tensor *t, const void **bytes, void **tmp);

/* pt_data_write_begin prepares t for a direct host write through
 * pt_tensor_data: t must be a contiguous CPU tensor (PT_ERR_INVALID names
 * `what` otherwise), and a queued op that writes it is flushed first. After
 * writing, call pt_data_write_end(t), which marks t READY. */
pt_err pt_data_write_begin(pt_tensor *t, const char *what);

/* pt_data_write_end marks t READY after a direct host write. */
void pt_data_write_end(pt_tensor *t);

#endif
