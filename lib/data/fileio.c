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
		return pt_set_error(PT_ERR_IO, "%s: open: %s", path, strerror(errno));
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
			return pt_set_error(PT_ERR_IO, "files root '%s': %s", root,
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
	return pt_set_error(PT_ERR_IO, "cannot open '%s': %s", path, strerror(e));
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

pt_err pt_file_write_atomic_sha256(const char *path, const pt_file_part *parts, size_t n,
                                   char hex[65], uint64_t *size)
{
	pt_sha256_ctx sha;
	uint64_t total = 0;
	char tmp[PATH_MAX];
	int fd, len;
	pt_err rv = PT_OK;

	len = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	if (len < 0 || (size_t)len >= sizeof(tmp))
		return pt_set_error(PT_ERR_RANGE, "%s: path too long", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return pt_set_error(PT_ERR_IO, "%s: create: %s", tmp, strerror(errno));
	if (hex != NULL)
		pt_sha256_init(&sha);
	for (size_t i = 0; i < n && rv == PT_OK; i++) {
		rv = write_full(fd, parts[i].data, parts[i].len, tmp);
		if (hex != NULL)
			pt_sha256_update(&sha, parts[i].data, parts[i].len);
		total += parts[i].len;
	}
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

pt_err pt_file_write_atomic(const char *path, const pt_file_part *parts, size_t n)
{
	return pt_file_write_atomic_sha256(path, parts, n, NULL, NULL);
}
