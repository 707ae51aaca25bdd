/* fileio.c - pread/write loops, whole-file reads, write-temp-fsync-rename. */
#include "fileio.h"
#include "sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* open_err is the error of an open that failed with errno e: PT_ERR_BUSY
 * ("busy: try again later") when the process or system ran out of
 * descriptors or memory - the server's state, not the file's - else
 * PT_ERR_IO. */
static pt_err open_err(int e)
{
	return e == EMFILE || e == ENFILE || e == ENOMEM || e == ENOBUFS ? PT_ERR_BUSY : PT_ERR_IO;
}

pt_err pt_read_full(int fd, void *buf, size_t len, size_t off, const char *path)
{
	char *p = buf;
	size_t done = 0;

	while (done < len) {
		ssize_t r = pread(fd, p + done, len - done, (off_t)(off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return pt_set_error(PT_ERR_IO, "%s: read: %s", path, strerror(errno));
		if (r == 0)
			return pt_set_error(
			    PT_ERR_FORMAT,
			    "%s: truncated: %zu bytes at offset %zu, file ends after %zu", path,
			    len, off, off + done);
		done += (size_t)r;
	}
	return PT_OK;
}

pt_err pt_file_fd_size(int fd, const char *path, size_t *size)
{
	struct stat st;

	if (fstat(fd, &st) != 0)
		return pt_set_error(PT_ERR_IO, "%s: stat: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return pt_set_error(PT_ERR_IO, "%s: not a regular file", path);
	*size = (size_t)st.st_size;
	return PT_OK;
}

pt_err pt_file_open_read(const char *path, int *fd, size_t *size)
{
	pt_err rv;

	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0)
		return pt_set_error(open_err(errno), "%s: open: %s", path, strerror(errno));
	if ((rv = pt_file_fd_size(*fd, path, size)) != PT_OK) {
		close(*fd);
		*fd = -1;
	}
	return rv;
}

pt_err pt_file_read_fd(int fd, const char *path, size_t max_bytes, void **data, size_t *len)
{
	size_t size;
	char *buf;
	pt_err rv;

	*data = NULL;
	*len = 0;
	PT_TRY(pt_file_fd_size(fd, path, &size));
	if (size > max_bytes)
		return pt_set_error(PT_ERR_RANGE, "%s: %zu bytes, more than the limit of %zu", path,
		                    size, max_bytes);
	buf = malloc(size + 1);
	if (buf == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: buffer of %zu bytes", path, size);
	if ((rv = pt_read_full(fd, buf, size, 0, path)) != PT_OK) {
		free(buf);
		return rv;
	}
	buf[size] = '\0';
	*data = buf;
	*len = size;
	return PT_OK;
}

pt_err pt_file_read(const char *path, size_t max_bytes, void **data, size_t *len)
{
	int fd;
	size_t size;
	pt_err rv;

	*data = NULL;
	*len = 0;
	PT_TRY(pt_file_open_read(path, &fd, &size));
	rv = pt_file_read_fd(fd, path, max_bytes, data, len);
	close(fd);
	return rv;
}

/* lexically_beneath: path is relative and no ".." climbs above its start
 * ("a/../b" stays, "a/../../b" leaves). Decided on the text alone. */
static bool lexically_beneath(const char *path)
{
	int depth = 0;

	if (path[0] == '/')
		return false;
	for (const char *p = path; *p;) {
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			if (--depth < 0)
				return false;
		} else if (n > 0 && !(n == 1 && p[0] == '.')) {
			depth++;
		}
		p += n;
		p += *p == '/';
	}
	return true;
}

pt_err pt_file_open_under(const char *root, const char *path, bool any_path, int *fd)
{
	/* O_NONBLOCK: a FIFO must not hang the caller before the regular-file check. */
	const int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
	int dirfd = AT_FDCWD, e;

	*fd = -1;
	if (path == NULL || path[0] == '\0')
		return pt_set_error(PT_ERR_INVALID, "empty path");
	if (!any_path && !lexically_beneath(path))
		return pt_set_error(PT_ERR_INVALID, PT_FILE_OUTSIDE_ROOT);
	if (!(any_path && path[0] == '/') && root != NULL && root[0] != '\0') {
		dirfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (dirfd < 0)
			return pt_set_error(open_err(errno), "files root '%s': %s", root,
			                    strerror(errno));
	}
	if (any_path) {
		*fd = openat(dirfd, path, flags);
	} else {
		/* The kernel resolves every component, symlinks included, beneath
		 * dirfd and fails with EXDEV the moment one would leave it - before
		 * looking at anything outside, so existence outside never shows. */
		struct open_how how = {.flags = (uint64_t)flags,
		                       .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
		*fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	}
	e = errno;
	if (dirfd != AT_FDCWD)
		close(dirfd);
	if (*fd >= 0)
		return PT_OK;
	if (!any_path && e == EXDEV)
		return pt_set_error(PT_ERR_INVALID, PT_FILE_OUTSIDE_ROOT);
	if (!any_path && (e == ENOSYS || e == EPERM))
		return pt_set_error(PT_ERR_UNSUPPORTED,
		                    "cannot confine '%s' to the files root: openat2: %s (needs "
		                    "Linux 5.6; or allow any path)",
		                    path, strerror(e));
	return pt_set_error(open_err(e), "cannot open '%s': %s", path, strerror(e));
}

static pt_err write_full(int fd, const void *buf, size_t len, const char *path)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return pt_set_error(PT_ERR_IO, "%s: write: %s", path, strerror(errno));
		p += w;
		len -= (size_t)w;
	}
	return PT_OK;
}

/* fsync_dir makes the rename of a file in path's directory durable. */
static pt_err fsync_dir(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t n;
	int fd;

	if (slash == NULL) {
		strcpy(dir, ".");
	} else {
		n = slash == path ? 1 : (size_t)(slash - path);
		if (n >= sizeof(dir))
			return pt_set_error(PT_ERR_RANGE, "%s: path too long", path);
		memcpy(dir, path, n);
		dir[n] = '\0';
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return pt_set_error(PT_ERR_IO, "%s: open directory: %s", dir, strerror(errno));
	if (fsync(fd) != 0 && errno != EINVAL) {
		int e = errno;
		close(fd);
		return pt_set_error(PT_ERR_IO, "%s: fsync directory: %s", dir, strerror(e));
	}
	close(fd);
	return PT_OK;
}

/* Files of at least DIRECT_MIN bytes (checkpoints) are written with O_DIRECT
 * where the file system takes it: DIRECT_CHUNK bytes at a time are copied into
 * an aligned staging buffer, hashed there while in cache, and written from it;
 * the last chunk is padded to DIRECT_ALIGN and the file cut back to its size.
 * A part that starts at a block boundary where the file is at one (a
 * safetensors payload after a header padded to it, from a page-aligned
 * snapshot) is hashed and written from where it is, without the copy.
 * The bytes bypass the page cache: no kernel copy, and no gigabytes of fresh
 * page-cache memory the host must back while training runs beside the writer.
 * Smaller files, and any file where O_DIRECT is refused, are written through
 * the page cache in the same chunks, each hashed right after it is written. */
#define DIRECT_CHUNK ((size_t)4 << 20)
#define DIRECT_MIN   PT_FILE_DIRECT_MIN
#define DIRECT_ALIGN PT_FILE_DIRECT_ALIGN

/* direct_off turns O_DIRECT off for fd: what is left goes through the page
 * cache. */
static pt_err direct_off(int fd, bool *direct, const char *path)
{
	int fl = fcntl(fd, F_GETFL);
	*direct = false;
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0)
		return pt_set_error(PT_ERR_IO, "%s: fcntl: %s", path, strerror(errno));
	return PT_OK;
}

/* write_chunk writes len bytes of buf. An O_DIRECT write that is refused
 * (EINVAL: an alignment this file system does not take) or cut short (a full
 * disk) turns O_DIRECT off for fd, and the rest goes through the page cache. */
static pt_err write_chunk(int fd, const void *buf, size_t len, bool *direct, const char *path)
{
	if (*direct) {
		ssize_t w;
		do
			w = write(fd, buf, len);
		while (w < 0 && errno == EINTR);
		if (w == (ssize_t)len)
			return PT_OK;
		if (w < 0 && errno != EINVAL)
			return pt_set_error(PT_ERR_IO, "%s: write: %s", path, strerror(errno));
		if (w > 0) {
			buf = (const char *)buf + w;
			len -= (size_t)w;
		}
		PT_TRY(direct_off(fd, direct, path));
	}
	return write_full(fd, buf, len, path);
}

/* write_staged writes the parts (total bytes) through an aligned staging
 * buffer, O_DIRECT while fd has it (*direct), hashing each chunk into sha
 * when sha is not NULL. */
static pt_err write_staged(int fd, const pt_file_part *parts, size_t n, uint64_t total,
                           pt_sha256_ctx *sha, bool *direct, const char *path)
{
	uint8_t *stage = aligned_alloc(DIRECT_ALIGN, DIRECT_CHUNK);
	size_t fill = 0;
	pt_err rv = PT_OK;

	if (stage == NULL)
		return pt_set_error(PT_ERR_NOMEM, "%s: staging buffer", path);
	for (size_t i = 0; i < n && rv == PT_OK; i++) {
		const uint8_t *p = parts[i].data;
		size_t len = parts[i].len;
		while (len > 0 && rv == PT_OK) {
			size_t k;
			if (*direct && fill % DIRECT_ALIGN == 0 && len >= DIRECT_ALIGN &&
			    (uintptr_t)p % DIRECT_ALIGN == 0) {
				/* The file and the part are both at a block boundary:
				 * write its whole blocks from where they are. */
				if (fill > 0) {
					if (sha != NULL)
						pt_sha256_update(sha, stage, fill);
					if ((rv = write_chunk(fd, stage, fill, direct, path)) !=
					    PT_OK)
						break;
					fill = 0;
				}
				k = len & ~(DIRECT_ALIGN - 1);
				k = k < DIRECT_CHUNK ? k : DIRECT_CHUNK;
				if (sha != NULL)
					pt_sha256_update(sha, p, k);
				rv = write_chunk(fd, p, k, direct, path);
				p += k;
				len -= k;
				continue;
			}
			k = DIRECT_CHUNK - fill < len ? DIRECT_CHUNK - fill : len;
			memcpy(stage + fill, p, k);
			fill += k;
			p += k;
			len -= k;
			if (fill == DIRECT_CHUNK) {
				if (sha != NULL)
					pt_sha256_update(sha, stage, fill);
				rv = write_chunk(fd, stage, fill, direct, path);
				fill = 0;
			}
		}
	}
	if (rv == PT_OK && fill > 0) {
		size_t padded = *direct ? (fill + DIRECT_ALIGN - 1) & ~(DIRECT_ALIGN - 1) : fill;
		if (sha != NULL)
			pt_sha256_update(sha, stage, fill);
		memset(stage + fill, 0, padded - fill);
		rv = write_chunk(fd, stage, padded, direct, path);
		if (rv == PT_OK && padded != fill && ftruncate(fd, (off_t)total) != 0)
			rv = pt_set_error(PT_ERR_IO, "%s: truncate: %s", path, strerror(errno));
	}
	free(stage);
	return rv;
}

/* write_buffered writes the parts through the page cache, each DIRECT_CHUNK
 * hashed right after it is written (still in cache). */
static pt_err write_buffered(int fd, const pt_file_part *parts, size_t n, pt_sha256_ctx *sha,
                             const char *path)
{
	pt_err rv = PT_OK;
	for (size_t i = 0; i < n && rv == PT_OK; i++) {
		const uint8_t *p = parts[i].data;
		size_t len = parts[i].len;
		while (len > 0 && rv == PT_OK) {
			size_t k = len < DIRECT_CHUNK ? len : DIRECT_CHUNK;
			rv = write_full(fd, p, k, path);
			if (sha != NULL)
				pt_sha256_update(sha, p, k);
			p += k;
			len -= k;
		}
	}
	return rv;
}

pt_err pt_file_write_atomic_sha256(const char *path, const pt_file_part *parts, size_t n,
                                   char hex[65], uint64_t *size)
{
	pt_sha256_ctx sha;
	uint64_t total = 0;
	char tmp[PATH_MAX];
	int fd, len, flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
	bool direct;
	pt_err rv = PT_OK;

	for (size_t i = 0; i < n; i++)
		total += parts[i].len;
	direct = total >= DIRECT_MIN;
	len = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	if (len < 0 || (size_t)len >= sizeof(tmp))
		return pt_set_error(PT_ERR_RANGE, "%s: path too long", path);
	fd = open(tmp, flags | (direct ? O_DIRECT : 0), 0644);
	if (fd < 0 && direct && errno == EINVAL) { /* a file system without O_DIRECT */
		direct = false;
		fd = open(tmp, flags, 0644);
	}
	if (fd < 0)
		return pt_set_error(PT_ERR_IO, "%s: create: %s", tmp, strerror(errno));
	if (hex != NULL)
		pt_sha256_init(&sha);
	if (direct)
		rv = write_staged(fd, parts, n, total, hex != NULL ? &sha : NULL, &direct, tmp);
	else
		rv = write_buffered(fd, parts, n, hex != NULL ? &sha : NULL, tmp);
	if (rv == PT_OK && fsync(fd) != 0)
		rv = pt_set_error(PT_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
	if (close(fd) != 0 && rv == PT_OK)
		rv = pt_set_error(PT_ERR_IO, "%s: close: %s", tmp, strerror(errno));
	if (rv == PT_OK && rename(tmp, path) != 0)
		rv = pt_set_error(PT_ERR_IO, "%s: rename to %s: %s", tmp, path, strerror(errno));
	if (rv != PT_OK) {
		unlink(tmp);
		return rv;
	}
	if (hex != NULL) {
		uint8_t d[PT_SHA256_BYTES];
		pt_sha256_final(&sha, d);
		pt_sha256_hex(d, hex);
	}
	if (size != NULL)
		*size = total;
	return fsync_dir(path);
}

/* cursor_span points *p at the cursor's next bytes, at most want of them,
 * and returns how many (0 at the end or for want 0). */
static size_t cursor_span(pt_parts_cursor *c, uint64_t want, const uint8_t **p)
{
	size_t k;
	while (c->i < c->n && c->off == c->parts[c->i].len)
		c->i++, c->off = 0;
	if (c->i == c->n || want == 0)
		return 0;
	k = c->parts[c->i].len - c->off;
	k = k < want ? k : (size_t)want;
	*p = (const uint8_t *)c->parts[c->i].data + c->off;
	return k;
}

void pt_parts_sha256_2(pt_sha256_ctx *s, pt_parts_cursor *a, uint64_t na, pt_sha256_ctx *t,
                       pt_parts_cursor *b, uint64_t nb)
{
	for (;;) {
		const uint8_t *pa = NULL, *pb = NULL;
		size_t ka = s ? cursor_span(a, na, &pa) : 0, kb = t ? cursor_span(b, nb, &pb) : 0;
		if (ka > 0 && kb > 0) {
			ka = kb = ka < kb ? ka : kb;
			pt_sha256_update2(s, pa, t, pb, ka);
		} else if (ka > 0) {
			pt_sha256_update(s, pa, ka);
		} else if (kb > 0) {
			pt_sha256_update(t, pb, kb);
		} else {
			return;
		}
		if (ka > 0)
			a->off += ka, na -= ka;
		if (kb > 0)
			b->off += kb, nb -= kb;
	}
}

pt_err pt_file_write_atomic(const char *path, const pt_file_part *parts, size_t n)
{
	return pt_file_write_atomic_sha256(path, parts, n, NULL, NULL);
}
