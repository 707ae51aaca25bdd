/* fuzz_common.c - memfd inputs, aligned copies and quiet logging for the
 * fuzz targets. */
#include "fuzz_common.h"

#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

void fuzz_quiet(void)
{
	pt_log_set_level(PT_LOG_OFF);
}

const uint8_t *fuzz_aligned(int slot, const uint8_t *data, size_t size)
{
	static uint8_t *buf[FUZZ_SLOTS];
	static size_t cap[FUZZ_SLOTS];

	FUZZ_CHECK(slot >= 0 && slot < FUZZ_SLOTS);
	if (size > cap[slot] || buf[slot] == NULL) {
		size_t n = size ? size : 1;
		free(buf[slot]);
		buf[slot] = aligned_alloc(64, (n + 63) / 64 * 64);
		FUZZ_CHECK(buf[slot] != NULL);
		cap[slot] = n;
	}
	if (size)
		memcpy(buf[slot], data, size);
	return buf[slot];
}

static void write_all(int fd, const uint8_t *data, size_t size)
{
	size_t off = 0;
	while (off < size) {
		ssize_t w = pwrite(fd, data + off, size - off, (off_t)off);
		FUZZ_CHECK(w > 0);
		off += (size_t)w;
	}
}

const char *fuzz_file(const uint8_t *data, size_t size)
{
	static int fd = -1;
	static char path[64];

	if (fd < 0) {
		fd = memfd_create("pt-fuzz", MFD_CLOEXEC);
		FUZZ_CHECK(fd >= 0);
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	FUZZ_CHECK(ftruncate(fd, 0) == 0);
	write_all(fd, data, size);
	return path;
}

static char dir[64];

static void remove_tmpdir(void)
{
	rmdir(dir);
}

const char *fuzz_tmpdir(void)
{

	if (dir[0] == '\0') {
		snprintf(dir, sizeof(dir), "%s/pt-fuzz-XXXXXX",
		         access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
		FUZZ_CHECK(mkdtemp(dir) != NULL);
		atexit(remove_tmpdir);
	}
	return dir;
}

uint32_t fuzz_crc32(const uint8_t *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
	}
	return c ^ 0xFFFFFFFFu;
}
