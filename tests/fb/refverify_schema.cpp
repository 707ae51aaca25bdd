// refverify_schema.cpp - test-only reference: Google's C++ Verifier on the
// tables of schema/*.fbs, for tests/fb/verify_diff, and on the test schema
// tests/fb/monster.fbs, for test_fb.
//
// Reads a file of frames (a root tag byte, a u32 little-endian length, that
// many bytes) and prints one character per frame, '1' when flatbuffers'
// Verifier (default limits: depth 64, 1000000 tables) accepts it as that
// root and '0' when not, then a newline. Built twice, because api.fbs and
// stage.fbs both declare a pipetrain.StageStats (different tables) and so
// cannot share a program: with PT_REF_API the tags are Q Request, R Response
// and J JobSpec; with PT_REF_STAGE, F TensorFrame (identifier PTTF), C
// Control, P Reply and W WorkerRequest; with PT_REF_MONSTER, M Monster
// (identifier MONS). Each frame is verified from a fresh 16-byte aligned copy.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(PT_REF_API)
#include "api_generated.h"
#elif defined(PT_REF_STAGE)
#include "stage_generated.h"
#elif defined(PT_REF_MONSTER)
#include "monster_generated.h"
#else
#error "define PT_REF_API, PT_REF_STAGE or PT_REF_MONSTER"
#endif

template<typename T> static bool verify_as(const uint8_t *buf, size_t len, const char *id)
{
	flatbuffers::Verifier v(buf, len);
	return v.VerifyBuffer<T>(id);
}

static int verdict(char tag, const uint8_t *buf, size_t len)
{
	switch (tag) {
#if defined(PT_REF_API)
	case 'Q':
		return verify_as<pipetrain::Request>(buf, len, nullptr);
	case 'R':
		return verify_as<pipetrain::Response>(buf, len, nullptr);
	case 'J':
		return verify_as<pipetrain::JobSpec>(buf, len, nullptr);
#elif defined(PT_REF_MONSTER)
	case 'M':
		return verify_as<pipetrain::test::Monster>(buf, len, "MONS");
#else
	case 'F':
		return verify_as<pipetrain::TensorFrame>(buf, len, "PTTF");
	case 'C':
		return verify_as<pipetrain::Control>(buf, len, nullptr);
	case 'P':
		return verify_as<pipetrain::Reply>(buf, len, nullptr);
	case 'W':
		return verify_as<pipetrain::WorkerRequest>(buf, len, nullptr);
#endif
	default:
		return -1;
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: refverify_schema FRAMES_FILE\n");
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
	while (pos + 5 <= all.size()) {
		char tag = static_cast<char>(all[pos]);
		uint32_t len;
		std::memcpy(&len, &all[pos + 1], 4);
		pos += 5;
		if (len > all.size() - pos) {
			std::fprintf(stderr, "refverify_schema: truncated frame\n");
			return 2;
		}
		void *buf = std::aligned_alloc(16, (len + 15) / 16 * 16 + 16);
		if (!buf)
			return 2;
		std::memcpy(buf, &all[pos], len);
		int ok = verdict(tag, static_cast<const uint8_t *>(buf), len);
		std::free(buf);
		if (ok < 0) {
			std::fprintf(stderr, "refverify_schema: unknown tag %c\n", tag);
			return 2;
		}
		std::putchar(ok ? '1' : '0');
		pos += len;
	}
	std::putchar('\n');
	return 0;
}
