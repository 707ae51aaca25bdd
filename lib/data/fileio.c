/* fileio.c - pread/write loops, whole-file reads, write-temp-fsync-rename. */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

pt_err pt_file_open_read(const char *path, int *fd, size_t *size)
{
	struct stat st;

	*fd = open(path, O_RDONLY | O_CLOEXEC);
	if (*fd < 0)
		return pt_set_error(PT_ERR_IO, "%s: open: %s", path, strerror(errno));
	if (fstat(*fd, &st) != 0) {
		int e = errno;
		close(*fd);
		*fd = -1;
		return pt_set_error(PT_ERR_IO, "%s: stat: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(*fd);
		*fd = -1;
		return pt_set_error(PT_ERR_IO, "%s: not a regular file", path);
	}
	*size = (size_t)st.st_size;
	return PT_OK;
}

pt_err pt_file_read(const char *path, size_t max_bytes, void **data, size_t *len)
{
	int fd;
	size_t size;
	char *buf;
	pt_err rv;

	*data = NULL;
	*len = 0;
	PT_TRY(pt_file_open_read(path, &fd, &size));
	if (size > max_bytes) {
		close(fd);
		return pt_set_error(PT_ERR_RANGE, "%s: %zu bytes, more than the limit of %zu", path,
		                    size, max_bytes);
	}
	buf = malloc(size + 1);
	if (buf == NULL) {
		close(fd);
		return pt_set_error(PT_ERR_NOMEM, "%s: buffer of %zu bytes", path, size);
	}
	rv = pt_read_full(fd, buf, size, 0, path);
	close(fd);
	if (rv != PT_OK) {
		free(buf);
		return rv;
	}
	buf[size] = '\0';
	*data = buf;
	*len = size;
	return PT_OK;
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

pt_err pt_file_write_atomic(const char *path, const pt_file_part *parts, size_t n)
{
	char tmp[PATH_MAX];
	int fd, len;
	pt_err rv = PT_OK;

	len = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	if (len < 0 || (size_t)len >= sizeof(tmp))
		return pt_set_error(PT_ERR_RANGE, "%s: path too long", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return pt_set_error(PT_ERR_IO, "%s: create: %s", tmp, strerror(errno));
	for (size_t i = 0; i < n && rv == PT_OK; i++)
		rv = write_full(fd, parts[i].data, parts[i].len, tmp);
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
	return fsync_dir(path);
}
