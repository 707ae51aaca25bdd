/* comm.h - the communicator: the only way stages and the coordinator talk.
 *
 * A communicator connects `world` ranks (rank 0 is the coordinator, ranks
 * 1..p the stages, by convention of lib/pipeline). It moves pt_msg values:
 * metadata (kind, job, step, microbatch, source, sequence number) plus an
 * optional tensor and an optional opaque blob (control payloads, already
 * FlatBuffers-encoded by the caller). Implementations are a struct of function
 * pointers (local: in-process queues; nng: other processes and hosts); one
 * contract test suite runs against each.
 *
 * Messages from one source to one destination arrive in order. Each receiver
 * keeps one queue per (source, channel); channels separate forward
 * activations, backward gradients and everything else, so a receive can ask
 * for exactly what it needs.
 *
 * Errors: an invalid rank is PT_ERR_RANGE; use after close is PT_ERR_CLOSED;
 * a receive past its timeout is PT_ERR_TIMEOUT; a peer that disappears makes
 * receives from it fail with PT_ERR_CLOSED (never a hang).
 *
 * Thread-safety: send, recv and barrier may be called from any thread;
 * destroy must not race with them.
 */
#ifndef PT_COMM_H
#define PT_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

#define PT_ANY_RANK                (-1)
#define PT_COMM_TIMEOUT_DEFAULT_MS 30000

typedef enum pt_channel {
	PT_CH_FORWARD,  /* activations to the next stage */
	PT_CH_BACKWARD, /* gradients to the previous stage */
	PT_CH_CONTROL,  /* everything else: commands, replies, errors, barrier */
	PT_CH_COUNT,
	PT_CH_ANY = -1, /* recv: whichever channel has a message first */
	/* recv: that data channel or control, whichever has a message first (a
	 * stage that follows a fixed task order still hears commands). */
	PT_CH_FORWARD_OR_CONTROL = -2,
	PT_CH_BACKWARD_OR_CONTROL = -3
} pt_channel;

/* pt_channel_valid_recv tells whether ch may be passed to a receive. */
static inline int pt_channel_valid_recv(pt_channel ch)
{
	return ((int)ch >= 0 && ch < PT_CH_COUNT) || ch == PT_CH_ANY ||
	       ch == PT_CH_FORWARD_OR_CONTROL || ch == PT_CH_BACKWARD_OR_CONTROL;
}

typedef enum pt_msg_kind {
	PT_MSG_FORWARD,  /* activation of (step, microbatch) */
	PT_MSG_BACKWARD, /* gradient of (step, microbatch) */
	PT_MSG_OUTPUT,   /* last stage's output, to the coordinator */
	PT_MSG_DONE,     /* a stage finished a microbatch's backward / a command */
	PT_MSG_COMMAND,  /* coordinator -> stage control (blob says what) */
	PT_MSG_REPLY,    /* stage -> coordinator reply (blob) */
	PT_MSG_ERROR,    /* blob: a NUL-terminated message naming stage/step/microbatch */
	PT_MSG_BARRIER,  /* internal to barrier() */
	PT_MSG_END,      /* end of stream: the sender will send nothing more */
	PT_MSG_KIND_COUNT
} pt_msg_kind;

typedef struct pt_msg_meta {
	pt_msg_kind kind;
	pt_channel channel; /* derived from kind by pt_msg_channel() on send */
	uint64_t job;
	int64_t step;
	int32_t microbatch;
	int32_t source; /* filled by the communicator on send */
	uint64_t seq;   /* per (source, destination), filled on send, checked on receive */
	uint32_t tag;   /* free for the caller (e.g. a command code) */
} pt_msg_meta;

typedef struct pt_msg {
	pt_msg_meta meta;
	bool has_tensor;
	pt_tensor tensor; /* CPU tensor (any dtype, contiguous) when has_tensor */
	/* The receiver may overwrite the tensor's data: it is a buffer of its
	 * own (a communicator that copies sets this on receive) or the sender
	 * reads it no more (set on send; the local communicator passes it on). */
	bool writable;
	void *blob; /* malloc'd bytes owned by the message, or NULL */
	size_t blob_len;
} pt_msg;

/* pt_msg_channel returns the channel a kind travels on. */
pt_channel pt_msg_channel(pt_msg_kind kind);

/* pt_msg_fini releases the tensor reference and the blob; zeroes m. NULL-safe. */
void pt_msg_fini(pt_msg *m);

/* pt_msg_set_blob copies len bytes into a new blob of m. */
pt_err pt_msg_set_blob(pt_msg *m, const void *data, size_t len);

typedef struct pt_comm pt_comm;

/* Counters for metrics and tests. bytes_sent counts what went on the wire
 * (header + payload after compression); bytes_raw_sent what would have without
 * compression, so bytes_sent < bytes_raw_sent shows lz4 at work. The local
 * communicator copies nothing and counts the logical bytes (tensor + blob).
 * errors: failed sends, malformed arrivals and (nng) frames dropped because
 * they failed authentication or replayed an earlier one; timeouts: receives and barriers
 * that timed out (a receive with timeout 0 is a poll, and one in
 * pt_comm_recv_slice a slice of a longer wait: finding nothing in either is
 * not a timeout); reconnects: connections to a peer made again after the
 * first one (nng; a dropped connection still marks the peer lost). */
typedef struct pt_comm_stats {
	uint64_t msgs_sent, msgs_recv, bytes_sent, bytes_recv, bytes_raw_sent, errors, timeouts;
	uint64_t reconnects;
} pt_comm_stats;

typedef struct pt_comm_ops {
	const char *name;
	/* device_tensors: send accepts tensors in device memory (NCCL); the
	 * others take CPU tensors only. */
	bool device_tensors;
	/* send: deliver m to dst. On success the communicator has taken what it
	 * needs; m still belongs to the caller either way (pt_msg_fini it). A
	 * local send shares the tensor's storage (a reference), so the sender
	 * must not overwrite a sent tensor until the receiver is done with it;
	 * an nng send has copied the bytes when it returns. */
	pt_err (*send)(pt_comm *c, int dst, const pt_msg *m);
	/* recv: wait up to timeout_ms (< 0: the communicator's default) for the
	 * next message from src (or PT_ANY_RANK) on ch (or PT_CH_ANY); *out is
	 * the caller's on success. */
	pt_err (*recv)(pt_comm *c, int src, pt_channel ch, int timeout_ms, pt_msg *out);
	/* barrier: returns when every rank has entered it. */
	pt_err (*barrier)(pt_comm *c, int timeout_ms);
	/* close: wakes every waiter with PT_ERR_CLOSED; does not block. */
	void (*close)(pt_comm *c);
	/* destroy: frees everything (after close). */
	void (*destroy)(pt_comm *c);
	/* stats: a snapshot of the counters. */
	pt_comm_stats (*stats)(const pt_comm *c);
} pt_comm_ops;

/* Every implementation embeds this header first. */
struct pt_comm {
	const pt_comm_ops *ops;
	int rank, world;
	int timeout_ms; /* default receive timeout */
};

static inline int pt_comm_rank(const pt_comm *c)
{
	return c->rank;
}
static inline int pt_comm_world(const pt_comm *c)
{
	return c->world;
}

/* Dispatch helpers (check rank ranges, fill meta.source/channel); the ops are
 * called only through them, so implementations may trust their arguments.
 * Sending to oneself is defined: the message lands in one's own mailbox.
 * A tensor to send must be a CPU tensor unless the communicator takes
 * device tensors (ops->device_tensors: NCCL); pt_comm_send syncs it first (a
 * deferred op writing it is flushed). nng sends non-contiguous tensors packed;
 * receivers always get contiguous tensors. */
pt_err pt_comm_send(pt_comm *c, int dst, pt_msg *m);
pt_err pt_comm_recv(pt_comm *c, int src, pt_channel ch, int timeout_ms, pt_msg *out);
/* pt_comm_recv_slice is pt_comm_recv for one slice of a longer wait that its
 * caller bounds itself (a loop that also watches for lost peers or a
 * cancellation): a slice that finds nothing returns PT_ERR_TIMEOUT but is
 * not counted in the stats' timeouts, which count real timeouts only. */
pt_err pt_comm_recv_slice(pt_comm *c, int src, pt_channel ch, int slice_ms, pt_msg *out);
/* pt_comm_timeout_counts tells a communicator's recv whether its empty
 * return after timeout_ms counts in the stats' timeouts: not for a poll
 * (0) nor within pt_comm_recv_slice (a per-thread flag). */
bool pt_comm_timeout_counts(int timeout_ms);
pt_err pt_comm_barrier(pt_comm *c, int timeout_ms);
void pt_comm_close(pt_comm *c);
void pt_comm_destroy(pt_comm *c); /* NULL-safe */

/* Seed 001's names, on top of send/recv. */
pt_err pt_comm_send_forward(pt_comm *c, int dst, const pt_tensor *t, int64_t step, int32_t mb);
pt_err pt_comm_recv_forward(pt_comm *c, int src, int timeout_ms, pt_msg *out);
pt_err pt_comm_send_backward(pt_comm *c, int dst, const pt_tensor *t, int64_t step, int32_t mb);
pt_err pt_comm_recv_backward(pt_comm *c, int src, int timeout_ms, pt_msg *out);

/* ---- in-memory implementation ---- */

typedef struct pt_local_group pt_local_group;

/* pt_local_group_create makes the shared queues of `world` in-process ranks. */
pt_err pt_local_group_create(pt_local_group **out, int world);

/* pt_local_comm_create makes rank's communicator in g (g must outlive it). */
pt_err pt_local_comm_create(pt_comm **out, pt_local_group *g, int rank);

/* pt_local_group_destroy frees the queues (after every member is destroyed). */
void pt_local_group_destroy(pt_local_group *g);

/* ---- nng implementation ---- */

/* A session's data-plane key: every rank of one session gets the same key
 * (over an authenticated control channel), and a new session a new key. */
#define PT_COMM_KEY_BYTES 32

/* pt_comm_key_generate fills key with PT_COMM_KEY_BYTES random bytes
 * (getrandom). PT_ERR_IO when the kernel gives none. Thread-safe. */
pt_err pt_comm_key_generate(uint8_t key[PT_COMM_KEY_BYTES]);

/* pt_comm_key_parse reads 2 * PT_COMM_KEY_BYTES hex digits (and nothing
 * else) into key; pt_comm_key_format writes them and a NUL (out holds
 * 2 * PT_COMM_KEY_BYTES + 1 bytes). */
pt_err pt_comm_key_parse(const char *hex, uint8_t key[PT_COMM_KEY_BYTES]);
void pt_comm_key_format(const uint8_t key[PT_COMM_KEY_BYTES], char *out);

typedef struct pt_nng_options {
	const char *listen_url; /* tcp://, ipc://, inproc:// or tls+tcp://; tcp port 0 = any */
	int world;
	int rank;
	int timeout_ms;       /* default receive timeout (0: PT_COMM_TIMEOUT_DEFAULT_MS) */
	int send_timeout_ms;  /* a send blocked this long (peer gone) fails (0: the receive timeout)
	                       */
	bool compress;        /* lz4 per tensor when it shrinks the data */
	size_t max_msg_bytes; /* receive cap (0: 1 GiB + 64 KiB); larger messages are refused */
	const char *tls_cert_key_file; /* PEM with cert + key, for a tls+tcp listener */
	const char *tls_key_file;      /* the key, when not in tls_cert_key_file (NULL) */
	const char *tls_ca_file;       /* CA bundle, for tls+tcp dialers */
	const char *tls_server_name;   /* expected name in peers' certificates (NULL: each
	                                * URL's host) */
	/* The session key (PT_COMM_KEY_BYTES, copied): every frame carries a MAC
	 * under it and frames without a valid one are dropped and counted in
	 * errors (see nng.c). Required unless no_auth. */
	const uint8_t *key;
	bool no_auth; /* benchmarks only: frames carry no MAC and none is checked; every
	               * rank of the session must agree */
	bool no_bulk; /* tcp://: publish no bulk lane and use none (every frame an nng
	               * message); see nng.c's bulk lane */
} pt_nng_options;

/* pt_nng_comm_create starts listening on opt->listen_url; the communicator can
 * receive at once but sends only after pt_nng_comm_connect. */
pt_err pt_nng_comm_create(pt_comm **out, const pt_nng_options *opt);

/* pt_nng_comm_url returns the URL peers must be given for this rank: the one
 * it listens on, with a tcp port 0 resolved to the bound port, and on tcp://
 * its bulk lane's port as "#bulk=PORT" (nng's own dialers refuse that part;
 * pt_nng_comm_connect strips it). Owned by c. */
const char *pt_nng_comm_url(const pt_comm *c);

/* pt_nng_comm_connect dials urls[r] for every other rank r (dials retry in the
 * background until the peer is up; urls[rank] is ignored). */
pt_err pt_nng_comm_connect(pt_comm *c, const char *const *urls);

/* pt_nng_comm_mark_lost declares rank lost without waiting for TCP (a
 * heartbeat verdict): receives from it then fail with PT_ERR_CLOSED once
 * its queued messages are taken and new sends to it fail at once (a send
 * already blocked on it ends at send_timeout_ms). Sticky; thread-safe;
 * does not block. PT_ERR_INVALID when c is not nng. */
pt_err pt_nng_comm_mark_lost(pt_comm *c, int rank);

/* pt_comm_get_stats returns c's counters (a snapshot; thread-safe). */
pt_comm_stats pt_comm_get_stats(const pt_comm *c);

/* pt_nng_comm_lane tells how frames from c to rank dst travel: 0 not decided
 * yet (nothing sent), 1 as nng messages, 2 on the bulk lane (see nng.c);
 * -1 when c is not nng or dst is out of range. Thread-safe. */
int pt_nng_comm_lane(pt_comm *c, int dst);

/* pt_nng_comm_data_port reports c's data-port (PULL) connections: *open now,
 * *strangers of them from addresses none of the peers' URLs names, and
 * *refused since c started (any pointer may be NULL). Thread-safe;
 * PT_ERR_INVALID when c is not an nng communicator. */
pt_err pt_nng_comm_data_port(pt_comm *c, int *open, int *strangers, long *refused);

/* pt_nng_comm_test_skip_seq is a test-only fault injection: the next send to
 * dst uses a sequence number `skip` higher than it should (receivers then see
 * a gap). PT_ERR_INVALID when c is not an nng communicator. */
pt_err pt_nng_comm_test_skip_seq(pt_comm *c, int dst, uint64_t skip);

#endif
