/* npy.h - NumPy .npy arrays: read versions 1.0, 2.0 and 3.0; write 1.0.
 *
 * Supported dtypes: <f2 <f4 <f8 <i4 <i8 |u1 <u2 <u4 (little-endian, C order,
 * at most PT_MAX_DIMS dimensions). Anything else is refused: Fortran order,
 * big-endian, object or structured dtypes, and any file whose header is
 * malformed or disagrees with its size are PT_ERR_FORMAT with a message that
 * names the file and the problem. The reader never trusts the header: the
 * payload must be exactly numel * itemsize bytes. This module assumes a
 * little-endian host.
 */
#ifndef PT_NPY_H
#define PT_NPY_H

#include "error.h"
#include "tensor.h"

/* pt_npy_read loads path into a new contiguous CPU tensor *out of the matching
 * dtype (the caller releases it with pt_tensor_fini). On error *out is zeroed.
 * Blocking (file I/O); thread-safe. */
pt_err pt_npy_read(pt_tensor *out, const char *path);

/* pt_npy_read_fd is pt_npy_read on the open file fd (read with pread; the
 * caller still owns fd); path is only used in messages. */
pt_err pt_npy_read_fd(pt_tensor *out, int fd, const char *path);

/* pt_npy_info_fd reads only the header of the open file fd, checked as
 * pt_npy_read checks it (the payload size included): dtype, ndim and shape
 * (PT_MAX_DIMS entries at most). The caller still owns fd. */
pt_err pt_npy_info_fd(int fd, const char *path, pt_dtype *dtype, int *ndim, int64_t *shape);

/* pt_npy_write writes t (any strides; synced first) to path as a version 1.0
 * file, atomically (temp file, fsync, rename). bf16 has no NumPy dtype and is
 * refused with PT_ERR_DTYPE. Blocking; thread-safe for distinct paths. */
pt_err pt_npy_write(const char *path, const pt_tensor *t);

#endif
