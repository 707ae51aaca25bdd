/* fuzz_common.h - helpers shared by the libFuzzer targets of tests/fuzz.
 *
 * Each target is one LLVMFuzzerTestOneInput over one parser of untrusted
 * input. Beyond "no sanitizer report", the targets check properties with
 * FUZZ_CHECK, which prints what broke and aborts (libFuzzer then saves the
 * input): typically that what a parser accepted re-encodes to bytes that
 * parse again to the same value. The readers of lib/data take paths, so their
 * inputs go through a memfd (fuzz_file), a regular file without a disk.
 */
#ifndef PT_FUZZ_COMMON_H
#define PT_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* FUZZ_CHECK aborts with the condition's text and pt_last_error() when cond
 * is false. */
#define FUZZ_CHECK(cond)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s (last error: %s)\n",         \
			        __FILE__, __LINE__, #cond, pt_last_error());                       \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* fuzz_quiet turns pipetrain's logging off (once per process). */
void fuzz_quiet(void);

/* fuzz_aligned copies size bytes into reused 64-byte aligned buffer number
 * slot (0 to FUZZ_SLOTS - 1), as nng and malloc deliver messages aligned;
 * valid until the next call for the same slot. */
#define FUZZ_SLOTS 4
const uint8_t *fuzz_aligned(int slot, const uint8_t *data, size_t size);

/* fuzz_file makes a memfd hold exactly data[0..size) and returns a path that
 * opens it ("/proc/self/fd/N"); the same file is reused by every call. */
const char *fuzz_file(const uint8_t *data, size_t size);

/* fuzz_tmpdir returns a private directory for files a target writes (under
 * /dev/shm when it exists, so fsync costs nothing), made on the first call. */
const char *fuzz_tmpdir(void);

/* fuzz_crc32 is the CRC-32 (IEEE, reflected) of server/jobs.c's journal. */
uint32_t fuzz_crc32(const uint8_t *p, size_t n);

#endif
