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

/* The handshake protocol version this build speaks (2: heartbeats; 3: a
 * session key in StageJoin, authenticated frames; 4: frame tags over NH;
 * 5: StageConfig.schedule and microbatches; 6: interleaved, virtual_stages;
 * 7: StageConfig.precision). */
#define PT_WORKER_PROTOCOL 7

/* Which request a WorkerRequest carries. */
typedef enum pt_worker_msg { PT_WORKER_PEERS, PT_WORKER_JOIN, PT_WORKER_PING } pt_worker_msg;

/* What a coordinator sends: a join, the peer list or a ping. */
typedef struct pt_worker_request {
	pt_worker_msg kind;
	/* StageJoin */
	int32_t protocol;
	const char *token; /* NULL: none presented */
	int32_t rank, world;
	bool compress;
	int32_t timeout_ms; /* heartbeat timeout (0: the worker's default) */
	const uint8_t *key; /* PT_COMM_KEY_BYTES: the session's data-plane key (NULL:
	                     * none sent; decoded: points into the buffer) */
	/* StagePeers (n_urls == 0 ends the session) and StagePing (0: state only) */
	uint64_t session;
	const char *urls[PT_MAX_STAGES + 1];
	int n_urls;
} pt_worker_request;

/* What a worker answers (StageJoinReply; StagePeersReply has only ok and
 * message; StagePingReply ok, message and busy). */
typedef struct pt_worker_reply {
	bool ok;
	const char *message;  /* NULL when absent */
	const char *data_url; /* join: the stage communicator's URL */
	uint64_t session;     /* join: to quote in StagePeers */
	bool busy;            /* ping: a session is joined or running; join: refused for
	                       * that reason (retry once that session ends) */
	const char *devices;  /* ping: what the worker computes on (NULL when absent) */
} pt_worker_reply;

/* pt_handshake_encode_request writes q as a WorkerRequest root into b. */
pt_err pt_handshake_encode_request(pt_fb_builder *b, const pt_worker_request *q,
                                   const uint8_t **data, size_t *size);

/* pt_handshake_decode_request verifies buf and reads it into *q. A request
 * with not exactly one of join, peers and ping, or more than
 * PT_MAX_STAGES + 1 URLs, is PT_ERR_FORMAT. */
pt_err pt_handshake_decode_request(const void *buf, size_t len, pt_worker_request *q);

/* pt_handshake_encode_reply writes r as the reply to a request of kind
 * (StageJoinReply, StagePeersReply or StagePingReply) as a root into b. */
pt_err pt_handshake_encode_reply(pt_fb_builder *b, pt_worker_msg kind, const pt_worker_reply *r,
                                 const uint8_t **data, size_t *size);

/* pt_handshake_decode_reply verifies buf as the reply to a request of kind
 * and reads it into *r. */
pt_err pt_handshake_decode_reply(const void *buf, size_t len, pt_worker_msg kind,
                                 pt_worker_reply *r);

#endif
