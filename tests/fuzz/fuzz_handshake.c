/* fuzz_handshake.c - lib/pipeline/handshake.c: the worker handshake a
 * `pipeserver --worker` reads from any coordinator (WorkerRequest: StageJoin,
 * StagePeers, StagePing) and the replies a coordinator reads from a worker.
 *
 * Property: what decodes re-encodes into a buffer that decodes to the same
 * values and encodes to the same bytes. */
#include "fuzz_common.h"
#include "handshake.h"

static pt_fb_builder b1, b2;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	FUZZ_CHECK(pt_fb_builder_init(&b1, 1024) == PT_OK);
	FUZZ_CHECK(pt_fb_builder_init(&b2, 1024) == PT_OK);
	return 0;
}

static int same_str(const char *a, const char *b)
{
	return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static void request(const uint8_t *buf, size_t size)
{
	pt_worker_request q, q2;
	const uint8_t *d1, *d2;
	size_t n1, n2;

	if (pt_handshake_decode_request(buf, size, &q) != PT_OK)
		return;
	FUZZ_CHECK(q.n_urls >= 0 && q.n_urls <= PT_MAX_STAGES + 1);
	for (int i = 0; i < q.n_urls; i++)
		FUZZ_CHECK(q.urls[i] != NULL);
	FUZZ_CHECK(pt_handshake_encode_request(&b1, &q, &d1, &n1) == PT_OK);
	const uint8_t *copy = fuzz_aligned(1, d1, n1);
	FUZZ_CHECK(pt_handshake_decode_request(copy, n1, &q2) == PT_OK);
	FUZZ_CHECK(q.kind == q2.kind && q.session == q2.session && q.n_urls == q2.n_urls);
	if (q.kind == PT_WORKER_JOIN)
		FUZZ_CHECK(q.protocol == q2.protocol && q.rank == q2.rank && q.world == q2.world &&
		           q.compress == q2.compress && q.timeout_ms == q2.timeout_ms &&
		           same_str(q.token, q2.token));
	for (int i = 0; i < q.n_urls; i++)
		FUZZ_CHECK(same_str(q.urls[i], q2.urls[i]));
	FUZZ_CHECK(pt_handshake_encode_request(&b2, &q2, &d2, &n2) == PT_OK);
	FUZZ_CHECK(n1 == n2 && memcmp(copy, d2, n1) == 0);
}

static void reply(const uint8_t *buf, size_t size, pt_worker_msg kind)
{
	pt_worker_reply r, r2;
	const uint8_t *d1, *d2;
	size_t n1, n2;

	if (pt_handshake_decode_reply(buf, size, kind, &r) != PT_OK)
		return;
	FUZZ_CHECK(pt_handshake_encode_reply(&b1, kind, &r, &d1, &n1) == PT_OK);
	const uint8_t *copy = fuzz_aligned(1, d1, n1);
	FUZZ_CHECK(pt_handshake_decode_reply(copy, n1, kind, &r2) == PT_OK);
	FUZZ_CHECK(r.ok == r2.ok && r.session == r2.session && r.busy == r2.busy &&
	           same_str(r.message, r2.message) && same_str(r.data_url, r2.data_url));
	FUZZ_CHECK(pt_handshake_encode_reply(&b2, kind, &r2, &d2, &n2) == PT_OK);
	FUZZ_CHECK(n1 == n2 && memcmp(copy, d2, n1) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *buf = fuzz_aligned(0, data, size);

	request(buf, size);
	reply(buf, size, PT_WORKER_JOIN);
	reply(buf, size, PT_WORKER_PEERS);
	reply(buf, size, PT_WORKER_PING);
	return 0;
}
