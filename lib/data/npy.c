/* npy.c - .npy header parsing (a strict subset of the Python dict literal
 * NumPy writes), payload reads straight into tensor storage, and the writer. */
#include "npy.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads and writes little-endian data in place"
#endif

#define NPY_MAGIC      "\x93NUMPY"
#define NPY_MAGIC_LEN  6
#define NPY_MAX_HEADER (1u << 20) /* NumPy itself refuses headers over 10 KB by default */

static const struct {
	const char *descr;
	pt_dtype dtype;
} npy_dtypes[] = {
    {"<f2", PT_F16}, {"<f4", PT_F32}, {"<f8", PT_F64}, {"<i4", PT_I32}, {"<i8", PT_I64},
    {"|u1", PT_U8},  {"<u1", PT_U8},  {"<u2", PT_U16}, {"<u4", PT_U32},
};

typedef struct npy_header {
	char descr[32];
	bool fortran;
	int ndim;
	int64_t shape[PT_MAX_DIMS];
	bool has_descr, has_fortran, has_shape;
} npy_header;

typedef struct npy_lexer {
	const char *p, *end, *path;
} npy_lexer;

static void lex_ws(npy_lexer *lx)
{
	while (lx->p < lx->end &&
	       (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r'))
		lx->p++;
}

static pt_err lex_expect(npy_lexer *lx, char c, const char *what)
{
	lex_ws(lx);
	if (lx->p >= lx->end || *lx->p != c)
		return pt_set_error(PT_ERR_FORMAT, "%s: malformed npy header: expected '%c' %s",
		                    lx->path, c, what);
	lx->p++;
	return PT_OK;
}

/* lex_string reads a quoted Python string without escapes into buf. */
static pt_err lex_string(npy_lexer *lx, char *buf, size_t cap)
{
	char q;
	size_t n = 0;

	lex_ws(lx);
	if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"'))
		return pt_set_error(PT_ERR_FORMAT, "%s: malformed npy header: expected a string",
		                    lx->path);
	q = *lx->p++;
	while (lx->p < lx->end && *lx->p != q) {
		if (*lx->p == '\\' || n + 1 >= cap)
			return pt_set_error(PT_ERR_FORMAT,
			                    "%s: malformed npy header: unsupported string",
			                    lx->path);
		buf[n++] = *lx->p++;
	}
	if (lx->p >= lx->end)
		return pt_set_error(PT_ERR_FORMAT, "%s: malformed npy header: unterminated string",
		                    lx->path);
	lx->p++;
	buf[n] = '\0';
	return PT_OK;
}

static pt_err lex_shape(npy_lexer *lx, npy_header *h)
{
	bool comma = false; /* a comma followed the last entry */

	PT_TRY(lex_expect(lx, '(', "to open the shape tuple"));
	h->ndim = 0;
	for (;;) {
		int64_t v = 0;
		lex_ws(lx);
		if (lx->p < lx->end && *lx->p == ')')
			break;
		if (lx->p >= lx->end || *lx->p < '0' || *lx->p > '9')
			return pt_set_error(PT_ERR_FORMAT,
			                    "%s: malformed npy header: bad shape entry", lx->path);
		while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
			if (v > (INT64_MAX - 9) / 10)
				return pt_set_error(PT_ERR_FORMAT,
				                    "%s: npy shape dimension too large", lx->path);
			v = v * 10 + (*lx->p++ - '0');
		}
		if (lx->p < lx->end && *lx->p == 'L') /* written by Python 2 */
			lx->p++;
		if (h->ndim == PT_MAX_DIMS)
			return pt_set_error(PT_ERR_UNSUPPORTED,
			                    "%s: npy array has more than %d dimensions", lx->path,
			                    PT_MAX_DIMS);
		h->shape[h->ndim++] = v;
		comma = false;
		lex_ws(lx);
		if (lx->p < lx->end && *lx->p == ',') {
			lx->p++;
			comma = true;
			continue;
		}
		if (lx->p < lx->end && *lx->p == ')')
			break;
		return pt_set_error(PT_ERR_FORMAT,
		                    "%s: malformed npy header: expected ',' or ')' in shape",
		                    lx->path);
	}
	/* A one-element tuple needs its comma: "(3)" is an int in Python. */
	if (h->ndim == 1 && !comma)
		return pt_set_error(PT_ERR_FORMAT,
		                    "%s: malformed npy header: shape (n) is not a tuple", lx->path);
	lx->p++;
	return PT_OK;
}

static pt_err parse_header(const char *text, size_t len, const char *path, npy_header *h)
{
	npy_lexer lx = {text, text + len, path};
	char key[32];

	memset(h, 0, sizeof(*h));
	PT_TRY(lex_expect(&lx, '{', "at the start of the header dict"));
	for (;;) {
		lex_ws(&lx);
		if (lx.p < lx.end && *lx.p == '}')
			break;
		PT_TRY(lex_string(&lx, key, sizeof(key)));
		PT_TRY(lex_expect(&lx, ':', "after a header key"));
		lex_ws(&lx);
		if (strcmp(key, "descr") == 0 && !h->has_descr) {
			if (lx.p < lx.end && *lx.p == '[')
				return pt_set_error(PT_ERR_FORMAT,
				                    "%s: structured npy dtypes are not supported",
				                    path);
			PT_TRY(lex_string(&lx, h->descr, sizeof(h->descr)));
			h->has_descr = true;
		} else if (strcmp(key, "fortran_order") == 0 && !h->has_fortran) {
			if ((size_t)(lx.end - lx.p) >= 4 && memcmp(lx.p, "True", 4) == 0) {
				h->fortran = true;
				lx.p += 4;
			} else if ((size_t)(lx.end - lx.p) >= 5 && memcmp(lx.p, "False", 5) == 0) {
				lx.p += 5;
			} else {
				return pt_set_error(PT_ERR_FORMAT,
				                    "%s: malformed npy header: fortran_order is "
				                    "not True or False",
				                    path);
			}
			h->has_fortran = true;
		} else if (strcmp(key, "shape") == 0 && !h->has_shape) {
			PT_TRY(lex_shape(&lx, h));
			h->has_shape = true;
		} else {
			return pt_set_error(
			    PT_ERR_FORMAT,
			    "%s: malformed npy header: unexpected or repeated key '%s'", path, key);
		}
		lex_ws(&lx);
		if (lx.p < lx.end && *lx.p == ',') {
			lx.p++;
			continue;
		}
		if (lx.p < lx.end && *lx.p == '}')
			break;
		return pt_set_error(PT_ERR_FORMAT,
		                    "%s: malformed npy header: expected ',' or '}' in the dict",
		                    path);
	}
	lx.p++;
	lex_ws(&lx);
	while (lx.p < lx.end && *lx.p == '\0') /* some writers pad with NULs */
		lx.p++;
	if (lx.p != lx.end)
		return pt_set_error(PT_ERR_FORMAT, "%s: malformed npy header: text after the dict",
		                    path);
	if (!h->has_descr || !h->has_fortran || !h->has_shape)
		return pt_set_error(PT_ERR_FORMAT, "%s: malformed npy header: missing %s", path,
		                    !h->has_descr     ? "'descr'"
		                    : !h->has_fortran ? "'fortran_order'"
		                                      : "'shape'");
	return PT_OK;
}

static pt_err descr_dtype(const char *descr, const char *path, pt_dtype *dt)
{
	for (size_t i = 0; i < sizeof(npy_dtypes) / sizeof(npy_dtypes[0]); i++) {
		if (strcmp(descr, npy_dtypes[i].descr) == 0) {
			*dt = npy_dtypes[i].dtype;
			return PT_OK;
		}
	}
	if (descr[0] == '>')
		return pt_set_error(PT_ERR_FORMAT,
		                    "%s: big-endian npy dtype '%s' is not supported (byteswap it "
		                    "in NumPy first)",
		                    path, descr);
	if (strchr(descr, 'O'))
		return pt_set_error(PT_ERR_FORMAT, "%s: npy object arrays are not supported", path);
	return pt_set_error(PT_ERR_FORMAT, "%s: unsupported npy dtype '%s'", path, descr);
}

/* read_header reads and checks the header of the open npy file fd (size
 * bytes): *dt, h's shape and *data_off, the payload's offset; the payload
 * must be exactly numel * itemsize bytes. */
static pt_err read_header(int fd, size_t size, const char *path, npy_header *h, pt_dtype *dt,
                          size_t *data_off)
{
	unsigned char pre[12];
	size_t hstart, hlen, payload, nbytes, span;
	char *header = NULL;
	pt_err rv;

	if (size < 10)
		return pt_set_error(PT_ERR_FORMAT, "%s: truncated npy file (%zu bytes)", path,
		                    size);
	PT_TRY(pt_read_full(fd, pre, size < 12 ? 10 : 12, 0, path));
	if (memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
		return pt_set_error(PT_ERR_FORMAT, "%s: bad magic: not an npy file", path);
	if (pre[6] == 1 && pre[7] == 0) {
		hstart = 10;
		hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
	} else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0 && size >= 12) {
		hstart = 12;
		hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
		       (size_t)pre[11] << 24;
	} else {
		return pt_set_error(PT_ERR_FORMAT, "%s: unsupported npy format version %u.%u", path,
		                    pre[6], pre[7]);
	}
	if (hlen > size - hstart)
		return pt_set_error(
		    PT_ERR_FORMAT,
		    "%s: npy header length %zu runs past the end of the file (%zu bytes)", path,
		    hlen, size);
	if (hlen > NPY_MAX_HEADER)
		return pt_set_error(PT_ERR_FORMAT, "%s: npy header of %zu bytes is absurd", path,
		                    hlen);
	header = malloc(hlen + 1);
	if (header == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: npy header", path);
	if ((rv = pt_read_full(fd, header, hlen, hstart, path)) != PT_OK)
		goto done;
	if ((rv = parse_header(header, hlen, path, h)) != PT_OK)
		goto done;
	if ((rv = descr_dtype(h->descr, path, dt)) != PT_OK)
		goto done;
	if (h->fortran) {
		rv = pt_set_error(PT_ERR_FORMAT,
		                  "%s: Fortran-order npy arrays are not supported (save a C-order "
		                  "copy)",
		                  path);
		goto done;
	}
	nbytes = span = pt_dtype_size(*dt);
	for (int i = 0; i < h->ndim; i++) {
		/* span leaves the zero dimensions out: strides must fit even when
		 * the array holds no values (pt_tensor's check_shape). */
		if (__builtin_mul_overflow(nbytes, (size_t)h->shape[i], &nbytes) ||
		    __builtin_mul_overflow(span, (size_t)(h->shape[i] ? h->shape[i] : 1), &span) ||
		    span > (size_t)INT64_MAX / 16) {
			rv = pt_set_error(PT_ERR_FORMAT, "%s: npy shape overflows", path);
			goto done;
		}
	}
	payload = size - hstart - hlen;
	if (nbytes != payload) {
		char sh[128];
		rv = pt_set_error(PT_ERR_FORMAT,
		                  "%s: npy header says shape %s of '%s' (%zu bytes) but the file "
		                  "holds %zu bytes of data",
		                  path, pt_shape_str(sh, sizeof(sh), h->ndim, h->shape), h->descr,
		                  nbytes, payload);
		goto done;
	}
	*data_off = hstart + hlen;
done:
	free(header);
	return rv;
}

pt_err pt_npy_read(pt_tensor *out, const char *path)
{
	int fd;
	size_t size;
	pt_err rv;

	memset(out, 0, sizeof(*out));
	PT_TRY(pt_file_open_read(path, &fd, &size));
	rv = pt_npy_read_fd(out, fd, path);
	close(fd);
	return rv;
}

pt_err pt_npy_read_fd(pt_tensor *out, int fd, const char *path)
{
	size_t size, off;
	npy_header h;
	pt_dtype dt = PT_DTYPE_COUNT;
	pt_err rv;

	memset(out, 0, sizeof(*out));
	PT_TRY(pt_file_fd_size(fd, path, &size));
	PT_TRY(read_header(fd, size, path, &h, &dt, &off));
	PT_TRY(pt_tensor_init(out, dt, h.ndim, h.shape));
	rv = pt_read_full(fd, pt_tensor_data(out), size - off, off, path);
	if (rv != PT_OK)
		pt_tensor_fini(out);
	return rv;
}

pt_err pt_npy_info_fd(int fd, const char *path, pt_dtype *dtype, int *ndim, int64_t *shape)
{
	size_t size, off;
	npy_header h;
	pt_dtype dt = PT_DTYPE_COUNT;

	PT_TRY(pt_file_fd_size(fd, path, &size));
	PT_TRY(read_header(fd, size, path, &h, &dt, &off));
	*dtype = dt;
	*ndim = h.ndim;
	memcpy(shape, h.shape, sizeof(int64_t) * (size_t)h.ndim);
	return PT_OK;
}

pt_err pt_npy_write(const char *path, const pt_tensor *t)
{
	const char *descr = NULL;
	char header[512], sh[160];
	size_t off = 0, hlen;
	const void *bytes;
	void *tmp;
	pt_err rv;

	for (size_t i = 0; i < sizeof(npy_dtypes) / sizeof(npy_dtypes[0]) && !descr; i++)
		if (npy_dtypes[i].dtype == t->dtype)
			descr = npy_dtypes[i].descr;
	if (descr == NULL)
		return pt_set_error(PT_ERR_DTYPE, "%s: %s has no npy dtype", path,
		                    pt_dtype_name(t->dtype));
	/* NumPy writes a 1-tuple as "(3,)" and a 0-d shape as "()". */
	sh[0] = '\0';
	for (int i = 0; i < t->ndim; i++)
		snprintf(sh + strlen(sh), sizeof(sh) - strlen(sh), "%s%" PRId64, i ? ", " : "",
		         t->shape[i]);
	memcpy(header, NPY_MAGIC "\x01\x00", 8);
	off = 10;
	off += (size_t)snprintf(header + off, sizeof(header) - off,
	                        "{'descr': '%s', 'fortran_order': False, 'shape': (%s%s), }", descr,
	                        sh, t->ndim == 1 ? "," : "");
	/* Pad with spaces and a final newline so the data starts 64-byte aligned. */
	hlen = (off + 1 + 63) / 64 * 64;
	memset(header + off, ' ', hlen - off - 1);
	header[hlen - 1] = '\n';
	header[8] = (char)((hlen - 10) & 0xff);
	header[9] = (char)((hlen - 10) >> 8);
	PT_TRY(pt_file_tensor_bytes(t, &bytes, &tmp));
	pt_file_part parts[2] = {{header, hlen}, {bytes, pt_tensor_nbytes(t)}};
	rv = pt_file_write_atomic(path, parts, 2);
	free(tmp);
	return rv;
}
