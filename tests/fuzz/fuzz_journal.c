/* fuzz_journal.c - server/jobs.c: replay of a job's journal at start-up
 * (pt_jobs_replay_journal runs the recovery's replay on the bytes of a
 * journal file and builds the job's ListJobsReply).
 *
 * Properties: the valid prefix is within the input and made of whole
 * records; the reply the server would send parses, and its job says what
 * the journal said (one job, a known state, at most PT_API_MAX_STAGE_STATS
 * stage entries).
 *
 * Input: a flag byte, then the journal. Flag bit 0 clear: the CRC of every
 * record whose length fits is set right first, so that mutations reach the
 * payloads (a fuzzer cannot forge CRC-32s); set: the bytes are used as they
 * are. */
#include "api/api.h"
#include "fuzz_common.h"
#include "jobs.h"

static pt_fb_builder b;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	FUZZ_CHECK(pt_fb_builder_init(&b, 4096) == PT_OK);
	return 0;
}

/* fix_crcs writes the right CRC into every record header that has a length. */
static void fix_crcs(uint8_t *d, size_t n)
{
	size_t off = 0;
	while (n - off >= 8) {
		uint32_t len, crc;
		memcpy(&len, d + off, 4);
		if (len > n - off - 8)
			break;
		crc = fuzz_crc32(d + off + 8, len);
		memcpy(d + off + 4, &crc, 4);
		off += 8 + (size_t)len;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t input_size)
{
	static uint8_t *data;
	size_t size;
	const uint8_t *reply;
	size_t good = 0, n;
	pt_api_response r;
	pt_api_job_info j;
	pt_api_stage_stats st;

	if (input_size < 1)
		return 0;
	size = input_size - 1;
	free(data);
	data = malloc(size ? size : 1);
	FUZZ_CHECK(data != NULL);
	memcpy(data, input + 1, size);
	if ((input[0] & 1) == 0)
		fix_crcs(data, size);
	FUZZ_CHECK(pt_jobs_replay_journal(data, size, &good, &b, &reply, &n) == PT_OK);
	FUZZ_CHECK(good <= size);
	for (size_t off = 0; off < good;) {
		uint32_t len;
		FUZZ_CHECK(good - off >= 8);
		memcpy(&len, data + off, 4);
		FUZZ_CHECK(len >= 1 && len <= good - off - 8);
		off += 8 + (size_t)len;
	}
	FUZZ_CHECK(pt_api_parse_response(fuzz_aligned(0, reply, n), n, &r) == PT_OK);
	FUZZ_CHECK(r.kind == PT_API_LIST_JOBS && r.n_jobs == 1);
	FUZZ_CHECK(pt_api_response_job(&r, 0, &j) == PT_OK);
	FUZZ_CHECK(j.id == 1 && (unsigned)j.state < PT_JOB_STATE_COUNT);
	FUZZ_CHECK(j.n_stages <= PT_API_MAX_STAGE_STATS);
	for (size_t k = 0; k < j.n_stages; k++)
		FUZZ_CHECK(pt_api_job_stage(&j, k, &st) == PT_OK);
	return 0;
}
