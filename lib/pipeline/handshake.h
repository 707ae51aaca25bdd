/* handshake.h - the worker handshake of schema/stage.fbs (WorkerRequest with
 * StageJoin or StagePeers; StageJoinReply, StagePeersReply): how a
 * coordinator gets a stage of its job served by a `pipeserver --worker`.
 *
 * Encoders build into a caller's builder (reset first) and hand back the
 * finished bytes, valid until the builder is reset. Decoders verify the
 * buffer first; the strings they return point into it (valid while it is).
 * Both sides (server/worker.c, lib/job/workers.c) use only these, so the
 * wire format is written once. Thread-safety: per builder / per buffer.
 */
#ifndef PT_PIPELINE_HANDSHAKE_H
#define PT_PIPELINE_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fb.h"
#include "pipeline.h"

/* The handshake protocol version this build speaks. */
#define PT_WORKER_PROTOCOL 1

/* What a coordinator sends: a join (is_join) or the peer list. */
typedef struct pt_worker_request {
	bool is_join;
	/* StageJoin */
	int32_t protocol;
	const char *token; /* NULL: none presented */
	int32_t rank, world;
	bool compress;
	/* StagePeers: n_urls == 0 cancels the session */
	uint64_t session;
	const char *urls[PT_MAX_STAGES + 1];
	int n_urls;
} pt_worker_request;

/* What a worker answers (StageJoinReply; StagePeersReply has no data_url
 * nor session). */
typedef struct pt_worker_reply {
	bool ok;
	const char *message;  /* NULL when absent */
	const char *data_url; /* join: the stage communicator's URL */
	uint64_t session;     /* join: to quote in StagePeers */
} pt_worker_reply;

/* pt_handshake_encode_request writes q as a WorkerRequest root into b. */
pt_err pt_handshake_encode_request(pt_fb_builder *b, const pt_worker_request *q,
                                   const uint8_t **data, size_t *size);

/* pt_handshake_decode_request verifies buf and reads it into *q. A request
 * with neither or both of join and peers, or more than PT_MAX_STAGES + 1
 * URLs, is PT_ERR_FORMAT. */
pt_err pt_handshake_decode_request(const void *buf, size_t len, pt_worker_request *q);

/* pt_handshake_encode_reply writes r as a StageJoinReply (join) or a
 * StagePeersReply root into b. */
pt_err pt_handshake_encode_reply(pt_fb_builder *b, bool join, const pt_worker_reply *r,
                                 const uint8_t **data, size_t *size);

/* pt_handshake_decode_reply verifies buf as the reply to a join (join) or to
 * a peer list and reads it into *r. */
pt_err pt_handshake_decode_reply(const void *buf, size_t len, bool join, pt_worker_reply *r);

#endif
