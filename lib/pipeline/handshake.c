/* handshake.c - WorkerRequest, StageJoinReply, StagePeersReply and
 * StagePingReply (schema/stage.fbs) built and verified with lib/fb. */
#include "handshake.h"

#include <string.h>

#include "fb_schema.h"

/* Field ids and verifier descriptors: fb_schema.h, generated from schema/stage.fbs. */
static const pt_fb_table_desc *const reply_desc[] = {
    [PT_WORKER_PEERS] = &pt_fb_stage_stage_peers_reply_desc,
    [PT_WORKER_JOIN] = &pt_fb_stage_stage_join_reply_desc,
    [PT_WORKER_PING] = &pt_fb_stage_stage_ping_reply_desc,
};
static const int request_field[] = {
    [PT_WORKER_PEERS] = PT_FB_STAGE_WORKER_REQUEST_PEERS,
    [PT_WORKER_JOIN] = PT_FB_STAGE_WORKER_REQUEST_JOIN,
    [PT_WORKER_PING] = PT_FB_STAGE_WORKER_REQUEST_PING,
};

pt_err pt_handshake_encode_request(pt_fb_builder *b, const pt_worker_request *q,
                                   const uint8_t **data, size_t *size)
{
	pt_fb_ref token = 0, key = 0, urls = 0, inner = 0, root = 0;
	pt_fb_ref refs[PT_MAX_STAGES + 1];

	if (q->n_urls < 0 || q->n_urls > PT_MAX_STAGES + 1)
		return pt_set_error(PT_ERR_RANGE, "StagePeers: %d URLs (at most %d)", q->n_urls,
		                    PT_MAX_STAGES + 1);
	if ((unsigned)q->kind > PT_WORKER_PING)
		return pt_set_error(PT_ERR_INVALID, "WorkerRequest: kind %d", (int)q->kind);
	pt_fb_builder_reset(b);
	if (q->kind == PT_WORKER_JOIN) {
		if (q->token != NULL)
			pt_fb_create_cstring(b, q->token, &token);
		if (q->key != NULL)
			pt_fb_create_vector(b, q->key, PT_COMM_KEY_BYTES, 1, 1, &key);
		pt_fb_start_table(b);
		pt_fb_add_offset(b, PT_FB_STAGE_STAGE_JOIN_TOKEN, token);
		pt_fb_add_offset(b, PT_FB_STAGE_STAGE_JOIN_SESSION_KEY, key);
		pt_fb_force_i32(b, PT_FB_STAGE_STAGE_JOIN_PROTOCOL, q->protocol);
		pt_fb_force_i32(b, PT_FB_STAGE_STAGE_JOIN_RANK, q->rank);
		pt_fb_force_i32(b, PT_FB_STAGE_STAGE_JOIN_WORLD, q->world);
		pt_fb_add_bool(b, PT_FB_STAGE_STAGE_JOIN_COMPRESS, q->compress, false);
		pt_fb_add_i32(b, PT_FB_STAGE_STAGE_JOIN_TIMEOUT_MS, q->timeout_ms, 0);
		pt_fb_end_table(b, &inner);
	} else if (q->kind == PT_WORKER_PING) {
		pt_fb_start_table(b);
		pt_fb_force_u64(b, PT_FB_STAGE_STAGE_PING_SESSION, q->session);
		pt_fb_end_table(b, &inner);
	} else {
		for (int i = 0; i < q->n_urls; i++)
			pt_fb_create_cstring(b, q->urls[i], &refs[i]);
		if (q->n_urls > 0)
			pt_fb_create_ref_vector(b, refs, (size_t)q->n_urls, &urls);
		pt_fb_start_table(b);
		pt_fb_force_u64(b, PT_FB_STAGE_STAGE_PEERS_SESSION, q->session);
		pt_fb_add_offset(b, PT_FB_STAGE_STAGE_PEERS_URLS, urls);
		pt_fb_end_table(b, &inner);
	}
	pt_fb_start_table(b);
	pt_fb_add_offset(b, request_field[q->kind], inner);
	pt_fb_end_table(b, &root);
	return pt_fb_finish(b, root, NULL, data, size);
}

pt_err pt_handshake_decode_request(const void *buf, size_t len, pt_worker_request *q)
{
	const uint8_t *t, *join, *peers, *ping, *vec;
	uint32_t n;

	memset(q, 0, sizeof(*q));
	if (pt_fb_verify(buf, len, &pt_fb_stage_worker_request_desc, NULL, NULL) != PT_OK)
		return pt_set_error(PT_ERR_FORMAT, "malformed WorkerRequest: %s", pt_last_error());
	t = pt_fb_root(buf);
	join = pt_fb_get_table(t, PT_FB_STAGE_WORKER_REQUEST_JOIN);
	peers = pt_fb_get_table(t, PT_FB_STAGE_WORKER_REQUEST_PEERS);
	ping = pt_fb_get_table(t, PT_FB_STAGE_WORKER_REQUEST_PING);
	if ((join != NULL) + (peers != NULL) + (ping != NULL) != 1)
		return pt_set_error(PT_ERR_FORMAT,
		                    "WorkerRequest: exactly one of join, peers and ping expected");
	if (join != NULL) {
		q->kind = PT_WORKER_JOIN;
		q->protocol = pt_fb_get_i32(join, PT_FB_STAGE_STAGE_JOIN_PROTOCOL, 0);
		q->token = pt_fb_get_string(join, PT_FB_STAGE_STAGE_JOIN_TOKEN, NULL);
		q->rank = pt_fb_get_i32(join, PT_FB_STAGE_STAGE_JOIN_RANK, 0);
		q->world = pt_fb_get_i32(join, PT_FB_STAGE_STAGE_JOIN_WORLD, 0);
		q->compress = pt_fb_get_bool(join, PT_FB_STAGE_STAGE_JOIN_COMPRESS, false);
		q->timeout_ms = pt_fb_get_i32(join, PT_FB_STAGE_STAGE_JOIN_TIMEOUT_MS, 0);
		vec = pt_fb_get_vector(join, PT_FB_STAGE_STAGE_JOIN_SESSION_KEY, &n);
		if (vec != NULL && n != PT_COMM_KEY_BYTES)
			return pt_set_error(PT_ERR_FORMAT,
			                    "StageJoin: session_key of %u bytes (%d)", n,
			                    PT_COMM_KEY_BYTES);
		q->key = vec;
		return PT_OK;
	}
	if (ping != NULL) {
		q->kind = PT_WORKER_PING;
		q->session = pt_fb_get_u64(ping, PT_FB_STAGE_STAGE_PING_SESSION, 0);
		return PT_OK;
	}
	q->kind = PT_WORKER_PEERS;
	q->session = pt_fb_get_u64(peers, PT_FB_STAGE_STAGE_PEERS_SESSION, 0);
	vec = pt_fb_get_vector(peers, PT_FB_STAGE_STAGE_PEERS_URLS, &n);
	if (n > PT_MAX_STAGES + 1)
		return pt_set_error(PT_ERR_FORMAT, "StagePeers: %u URLs (at most %d)", n,
		                    PT_MAX_STAGES + 1);
	for (uint32_t i = 0; i < n; i++)
		q->urls[i] = pt_fb_vec_string(vec, i, NULL);
	q->n_urls = (int)n;
	return PT_OK;
}

pt_err pt_handshake_encode_reply(pt_fb_builder *b, pt_worker_msg kind, const pt_worker_reply *r,
                                 const uint8_t **data, size_t *size)
{
	pt_fb_ref msg = 0, url = 0, devs = 0, root = 0;
	bool join = kind == PT_WORKER_JOIN;

	pt_fb_builder_reset(b);
	if (r->message != NULL)
		pt_fb_create_cstring(b, r->message, &msg);
	if (join && r->data_url != NULL)
		pt_fb_create_cstring(b, r->data_url, &url);
	if (kind == PT_WORKER_PING && r->devices != NULL)
		pt_fb_create_cstring(b, r->devices, &devs);
	pt_fb_start_table(b);
	if (join) {
		pt_fb_add_u64(b, PT_FB_STAGE_STAGE_JOIN_REPLY_SESSION, r->session, 0);
		pt_fb_add_offset(b, PT_FB_STAGE_STAGE_JOIN_REPLY_DATA_URL, url);
		pt_fb_add_bool(b, PT_FB_STAGE_STAGE_JOIN_REPLY_BUSY, r->busy, false);
	}
	pt_fb_add_offset(b, PT_FB_STAGE_STAGE_JOIN_REPLY_MESSAGE, msg);
	if (kind == PT_WORKER_PING) {
		pt_fb_add_bool(b, PT_FB_STAGE_STAGE_PING_REPLY_BUSY, r->busy, false);
		pt_fb_add_offset(b, PT_FB_STAGE_STAGE_PING_REPLY_DEVICES, devs);
	}
	pt_fb_force_bool(b, PT_FB_STAGE_STAGE_JOIN_REPLY_OK, r->ok);
	pt_fb_end_table(b, &root);
	return pt_fb_finish(b, root, NULL, data, size);
}

pt_err pt_handshake_decode_reply(const void *buf, size_t len, pt_worker_msg kind,
                                 pt_worker_reply *r)
{
	const uint8_t *t;

	memset(r, 0, sizeof(*r));
	if ((unsigned)kind > PT_WORKER_PING)
		return pt_set_error(PT_ERR_INVALID, "reply to a request of kind %d", (int)kind);
	if (pt_fb_verify(buf, len, reply_desc[kind], NULL, NULL) != PT_OK)
		return pt_set_error(PT_ERR_FORMAT, "malformed %s: %s", reply_desc[kind]->name,
		                    pt_last_error());
	t = pt_fb_root(buf);
	r->ok = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_JOIN_REPLY_OK, false);
	r->message = pt_fb_get_string(t, PT_FB_STAGE_STAGE_JOIN_REPLY_MESSAGE, NULL);
	if (kind == PT_WORKER_JOIN) {
		r->data_url = pt_fb_get_string(t, PT_FB_STAGE_STAGE_JOIN_REPLY_DATA_URL, NULL);
		r->session = pt_fb_get_u64(t, PT_FB_STAGE_STAGE_JOIN_REPLY_SESSION, 0);
		r->busy = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_JOIN_REPLY_BUSY, false);
	} else if (kind == PT_WORKER_PING) {
		r->busy = pt_fb_get_bool(t, PT_FB_STAGE_STAGE_PING_REPLY_BUSY, false);
		r->devices = pt_fb_get_string(t, PT_FB_STAGE_STAGE_PING_REPLY_DEVICES, NULL);
	}
	return PT_OK;
}
