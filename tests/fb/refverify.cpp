// refverify.cpp - test-only reference: Google's own VerifyMonsterBuffer.
//
// Reads a file of frames (u32 little-endian length, then that many bytes) and
// prints one character per frame, '1' when flatbuffers' C++ Verifier accepts
// it and '0' when it rejects it, then a newline. test_fb writes the frames and
// checks our C verifier against these answers. Each frame is copied into a
// fresh 16-byte aligned buffer, so Google sees the bytes well aligned.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "monster_generated.h"

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: refverify FRAMES_FILE\n");
		return 2;
	}
	std::FILE *f = std::fopen(argv[1], "rb");
	if (!f) {
		std::perror(argv[1]);
		return 2;
	}
	std::vector<unsigned char> all;
	unsigned char chunk[65536];
	size_t n;
	while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0)
		all.insert(all.end(), chunk, chunk + n);
	std::fclose(f);

	size_t pos = 0;
	while (pos + 4 <= all.size()) {
		uint32_t len;
		std::memcpy(&len, &all[pos], 4);
		pos += 4;
		if (len > all.size() - pos) {
			std::fprintf(stderr, "refverify: truncated frame\n");
			return 2;
		}
		void *buf = std::aligned_alloc(16, (len + 15) / 16 * 16 + 16);
		if (!buf)
			return 2;
		std::memcpy(buf, &all[pos], len);
		flatbuffers::Verifier v(static_cast<const uint8_t *>(buf), len);
		std::putchar(pipetrain::test::VerifyMonsterBuffer(v) ? '1' : '0');
		std::free(buf);
		pos += len;
	}
	std::putchar('\n');
	return 0;
}
