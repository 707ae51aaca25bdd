/* nng.c - the nng communicator: ranks in other processes or on other hosts.
 *
 * Each rank listens with one PULL socket; pt_nng_comm_connect opens one PUSH
 * socket per peer that dials the peer's URL in the background (retrying until
 * the peer is up). One message body is
 *
 *   [ TensorFrame (schema/stage.fbs) | zero padding to 64 | payload | MAC trailer ]
 *
 * Every frame belongs to a session: unless authentication is turned off (a
 * benchmark option), it ends in a 32-byte trailer, "PTMC", a 12-byte nonce
 * (u32 random per communicator, u64 counter; little-endian) and a 16-byte
 * tag over everything before the tag (header, payload, sender, sequence
 * number, job, nonce) and the destination rank. The tag is the UMAC
 * construction: NH (nh.h) compresses the n bytes before the tag 64-fold, and
 * ChaCha20-Poly1305 with the trailer's nonce, as associated data only, tags
 * NH's output, le64(n) and le32(destination). Both keys come from the session
 * key by HKDF-SHA256 (info "pipetrain frame mac v4" and "pipetrain frame nh
 * v4"). Poly1305 alone runs at ~6 GB/s a core on an AVX2 Zen; NH at ~30, so
 * the tag costs about what one more copy of the frame would. The I/O thread
 * checks the tag before it reads anything else; a frame that fails is
 * dropped and counted in the errors counter without touching sequence
 * numbers, connections or half-received tensors, and the receiver hears
 * nothing of it. A frame that authenticates but whose sequence number was
 * already seen (a replay) is dropped the same way.
 *
 * built in place in one nng_msg (the only copy is the tensor bytes into the
 * message, or lz4 compressing them there). An I/O thread receives, verifies the
 * header, checks the per-source sequence number, decompresses into a fresh
 * 64-byte-aligned tensor and pushes it into the rank's mailbox; anything
 * malformed becomes a queued PT_ERR_FORMAT error for the receiver, never a
 * crash. Barrier messages are consumed by the I/O thread itself.
 *
 * Peer loss: a pipe removed from a PUSH socket (whose peer rank is known) or
 * from the PULL socket (rank learned from the headers it carried) marks the
 * rank "lost pending"; the I/O thread turns it into a mailbox lost mark once
 * everything that arrived before has been handed over (its receive found the
 * queue empty), or after LOST_GRACE_MS at the latest. A dropped connection is
 * final for this communicator: messages after a reconnect would have been
 * lost in between (nng guarantees no delivery across reconnects). TCP does
 * not notice a peer behind a downed link or a hung peer, so the owner may
 * also declare a rank lost itself (pt_nng_comm_mark_lost, from heartbeats):
 * that marks it at once. A send already blocked on the dead connection still
 * runs to send_timeout_ms (closing the socket under a sender is a known nng
 * hazard: it can panic), so owners that need a bound set that timeout.
 *
 * Limits: destroy drops messages nng has not transmitted yet (nng 1.5 has no
 * linger); receive caps at max_msg_bytes, also on the decompressed size; only
 * contiguous tensors go on the wire (strided ones are packed first).
 */
#include <limits.h>
#include <lz4.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/supplemental/tls/tls.h>
#include <openssl/crypto.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#include "comm.h"
#include "fb.h"
#include "fb_schema.h"
#include "fileio.h"
#include "log.h"
#include "mailbox.h"
#include "nh.h"

#define FRAME_ID           PT_FB_STAGE_FILE_ID
#define PAYLOAD_ALIGN      64u
#define DEFAULT_MAX_MSG    ((size_t)1 << 30 | (size_t)64 << 10)
#define IO_POLL_MS         100  /* I/O thread wake-up when idle (lost marks, stop) */
#define LOST_GRACE_MS      1000 /* a lost mark waits at most this for queued arrivals */
#define RECONNECT_MIN_MS   20
#define RECONNECT_MAX_MS   500
#define HUGE_ALLOC_BYTES   ((size_t)32 << 20) /* glibc mmaps these anyway */
#define HUGE_PAGE_BYTES    ((size_t)2 << 20)
#define COMPRESS_MIN_BYTES 256 /* smaller tensors are not worth an lz4 attempt */
/* Tensors above FRAG_BYTES travel as fragments of FRAG_BYTES, one nng message
 * each: buffers stay below glibc's mmap threshold (32 MiB) and are reused
 * instead of page-faulted in afresh, the receiver copies fragment k while k+1
 * is on the wire, and no side holds a second whole copy of a huge tensor. */
#define FRAG_BYTES  ((size_t)8 << 20)
#define MAC_MAGIC   "PTMC"
#define MAC_TAG     16
#define MAC_NONCE   12
#define MAC_TRAILER (4 + MAC_NONCE + MAC_TAG)
#define MAC_WARN_MS 1000 /* rejected frames are logged at most this often */
/* Received tensors of at least this many bytes are authenticated while their
 * payload is copied out (rx_verify_copy); smaller ones are hashed, then
 * copied. */
#define FUSE_MIN_BYTES ((size_t)16 << 10)

/* TensorFrame field ids and descriptor: fb_schema.h, from schema/stage.fbs. */
#define F(field) PT_FB_STAGE_TENSOR_FRAME_##field

enum { CODEC_NONE = 0, CODEC_LZ4 = 1 };

_Static_assert(PT_DTYPE_COUNT == 9, "schema DType lists every pt_dtype");
_Static_assert(PT_MSG_KIND_COUNT == 9, "schema MsgKind lists every pt_msg_kind");

struct nng_comm;

typedef struct nng_peer {
	struct nng_comm *c;
	int rank;
	bool open; /* push and dialer exist */
	nng_socket push;
	nng_dialer dialer;
	nng_tls_config *tls;
	pthread_mutex_t mu;  /* orders seq assignment with nng_sendmsg */
	EVP_CIPHER_CTX *mac; /* the session key set; under mu */
	uint64_t next_seq;
	uint64_t skip;        /* test hook: added to the next seq */
	atomic_uint connects; /* pipes the dialer made */
} nng_peer;

/* A fragmented tensor being received from one source. */
typedef struct assembly {
	bool active;
	pt_msg msg; /* tensor allocated whole, filled fragment by fragment */
	uint32_t next_index, count;
	uint64_t next_offset;
} assembly;

typedef struct pipe_entry {
	uint32_t pipe;
	int rank;
} pipe_entry;

typedef struct nng_comm {
	pt_comm base;
	bool compress;
	size_t max_msg;
	int send_timeout_ms;
	char *bound_url;
	char *tls_cert_key, *tls_key, *tls_ca, *tls_server_name;

	/* Authentication (auth false: no trailer is sent or accepted). */
	bool auth;
	uint8_t mac_key[PT_COMM_KEY_BYTES]; /* ChaCha20-Poly1305 */
	uint32_t nh_key[PT_NH_KEY_WORDS];
	EVP_CIPHER *aead;
	EVP_CIPHER_CTX *rx_mac; /* I/O thread only */
	uint8_t *rx_nh;         /* I/O thread only: NH outputs of a payload */
	size_t rx_nh_cap;
	uint32_t mac_instance;            /* nonce prefix, random per communicator */
	atomic_uint_fast64_t mac_counter; /* nonce suffix, one per frame */
	long long mac_warned_ms;          /* I/O thread only */
	uint64_t mac_rejected;            /* I/O thread only: since the last warning */

	bool pull_open;
	nng_socket pull;
	nng_listener listener;
	nng_tls_config *tls_server;

	nng_peer *peers; /* [world]; peers[rank] unused */
	pthread_mutex_t connect_mu;
	bool connect_tried; /* under connect_mu */
	atomic_bool connected;

	pt_mailbox *mb;
	pthread_t io;
	bool io_started;
	/* Receive hand-off: rx_cb (an nng callback) parks one message for the I/O
	 * thread, which re-arms the receive before processing it. */
	nng_aio *rx_aio;
	pthread_mutex_t rx_mu;
	pthread_cond_t rx_cv;
	bool rx_done;
	int rx_rv;
	nng_msg *rx_msg;
	atomic_bool closed;   /* close() called */
	atomic_bool stopping; /* destroy() running: callbacks do nothing */

	/* Pipe -> rank, learned from verified headers (PULL side). */
	pthread_mutex_t pipe_mu;
	pipe_entry *pipes;
	size_t npipes, cap_pipes;

	/* Lost-pending marks: ticket (from lost_tickets, 0 = none) and time. */
	atomic_uint_fast64_t lost_tickets;
	atomic_uint_fast64_t *lost_ticket; /* [world] */
	_Atomic long long *lost_ms;        /* [world] */

	uint64_t *expect_seq;    /* [world], I/O thread only */
	struct assembly *asm_of; /* [world], I/O thread only: fragments so far */

	/* Barrier: rank 0 counts arrivals per rank, others wait for the release. */
	pthread_mutex_t bar_mu;
	pthread_cond_t bar_cv;
	uint64_t bar_gen;      /* this rank's barrier generation */
	uint64_t *bar_arrived; /* [world] latest generation each rank entered (rank 0) */
	uint64_t bar_released; /* latest generation rank 0 released (others) */

	pthread_mutex_t self_mu; /* seq of messages to oneself */
	uint64_t self_seq;

	pt_comm_counters n;
} nng_comm;

static const pt_comm_ops nng_ops;

/* ------------------------------------------------------------- helpers -- */

static pt_err nng_fail(int rv, const char *fmt, const char *what)
{
	pt_err e;

	switch (rv) {
	case NNG_ETIMEDOUT:
		e = PT_ERR_TIMEOUT;
		break;
	case NNG_ECLOSED:
	case NNG_ECONNSHUT:
	case NNG_ECONNRESET:
		e = PT_ERR_CLOSED;
		break;
	case NNG_ENOMEM:
		e = PT_ERR_NOMEM;
		break;
	case NNG_EINVAL:
	case NNG_EADDRINVAL:
	case NNG_EADDRINUSE:
	case NNG_EBADTYPE:
		e = PT_ERR_INVALID;
		break;
	case NNG_ENOTSUP:
	case NNG_ENOENT:
		e = PT_ERR_UNSUPPORTED;
		break;
	case NNG_EMSGSIZE:
		e = PT_ERR_RANGE;
		break;
	default:
		e = PT_ERR_IO;
		break;
	}
	return pt_set_error(e, fmt, what, nng_strerror(rv));
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static bool is_tls(const char *url)
{
	return strncmp(url, "tls+tcp", 7) == 0;
}

static bool is_tcp(const char *url)
{
	return strncmp(url, "tcp", 3) == 0 || is_tls(url);
}

/* url_host writes the host of scheme://HOST:PORT (brackets of an IPv6
 * address removed): the name a tls+tcp peer's certificate must carry. */
static void url_host(const char *url, char *out, size_t n)
{
	const char *h = strstr(url, "://"), *end;

	h = h ? h + 3 : url;
	if (*h == '[') {
		h++;
		end = strchr(h, ']');
	} else {
		end = strrchr(h, ':');
	}
	if (end == NULL)
		end = h + strlen(h);
	snprintf(out, n, "%.*s", (int)(end - h), h);
}

/* alloc_payload returns n bytes (at least 1) that free() releases: 64-aligned,
 * and for large tensors 2 MiB-aligned with transparent huge pages requested
 * (fewer page faults on the first write; THP is "madvise" on Debian). */
static void *alloc_payload(size_t n)
{
	size_t align = n >= HUGE_ALLOC_BYTES ? HUGE_PAGE_BYTES : 64;
	size_t rounded = (n + align - 1) & ~(align - 1);
	void *p;

	if (rounded < n)
		return NULL;
	p = aligned_alloc(align, rounded ? rounded : align);
	if (p && align == HUGE_PAGE_BYTES)
		madvise(p, rounded, MADV_HUGEPAGE);
	return p;
}

/* advise_huge asks for transparent huge pages over the page-aligned inside of
 * a large, not yet touched buffer (nng's fresh message body): far fewer page
 * faults when the tensor is copied in. A hint only; errors are ignored. */
static void advise_huge(void *p, size_t n)
{
	uintptr_t a = ((uintptr_t)p + HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(HUGE_PAGE_BYTES - 1);
	uintptr_t e = ((uintptr_t)p + n) & ~(uintptr_t)(HUGE_PAGE_BYTES - 1);

	if (n >= HUGE_ALLOC_BYTES && e > a)
		madvise((void *)a, e - a, MADV_HUGEPAGE);
}

/* storage_adopt makes a storage that frees data (from alloc_payload). */
static pt_err storage_adopt(pt_storage **out, void *data, size_t nbytes)
{
	pt_err rv = pt_storage_wrap(out, data, nbytes, PT_CPU);
	if (rv != PT_OK) {
		free(data);
		return rv;
	}
	(*out)->owns_data = true;
	return PT_OK;
}

/* The I/O thread and callbacks mark a rank "lost pending"; see the file comment. */
static void mark_lost_pending(nng_comm *c, int rank)
{
	uint_fast64_t zero = 0;

	if (rank < 0 || rank >= c->base.world || rank == c->base.rank)
		return;
	atomic_store(&c->lost_ms[rank], pt_now_ms());
	atomic_compare_exchange_strong(&c->lost_ticket[rank], &zero,
	                               atomic_fetch_add(&c->lost_tickets, 1) + 1);
}

static bool peer_lost(nng_comm *c, int rank)
{
	return atomic_load(&c->lost_ticket[rank]) != 0 || pt_mailbox_is_lost(c->mb, rank);
}

/* promote_lost turns pending marks into mailbox marks: those made before the
 * receive that just found nothing (queue_empty, started at ticket
 * start_ticket), and any older than LOST_GRACE_MS. */
static void promote_lost(nng_comm *c, uint64_t start_ticket, bool queue_empty)
{
	long long now = pt_now_ms();

	for (int r = 0; r < c->base.world; r++) {
		uint64_t t = atomic_load(&c->lost_ticket[r]);
		if (t == 0 || pt_mailbox_is_lost(c->mb, r))
			continue;
		if ((queue_empty && t <= start_ticket) ||
		    now - atomic_load(&c->lost_ms[r]) >= LOST_GRACE_MS) {
			pt_info("rank %d: peer rank %d is gone", c->base.rank, r);
			pt_mailbox_mark_lost(c->mb, r);
			pthread_mutex_lock(&c->bar_mu);
			pthread_cond_broadcast(&c->bar_cv);
			pthread_mutex_unlock(&c->bar_mu);
		}
	}
}

static int pipe_lookup(nng_comm *c, uint32_t pipe, bool remove)
{
	int rank = -1;

	pthread_mutex_lock(&c->pipe_mu);
	for (size_t i = 0; i < c->npipes; i++)
		if (c->pipes[i].pipe == pipe) {
			rank = c->pipes[i].rank;
			if (remove)
				c->pipes[i] = c->pipes[--c->npipes];
			break;
		}
	pthread_mutex_unlock(&c->pipe_mu);
	return rank;
}

static void pipe_learn(nng_comm *c, uint32_t pipe, int rank)
{
	pthread_mutex_lock(&c->pipe_mu);
	if (c->npipes == c->cap_pipes) {
		size_t cap = c->cap_pipes ? 2 * c->cap_pipes : 8;
		pipe_entry *p = realloc(c->pipes, cap * sizeof(*p));
		if (p == NULL) { /* the push side still detects loss; not fatal */
			pthread_mutex_unlock(&c->pipe_mu);
			return;
		}
		c->pipes = p;
		c->cap_pipes = cap;
	}
	c->pipes[c->npipes++] = (pipe_entry){pipe, rank};
	pthread_mutex_unlock(&c->pipe_mu);
}

/* Pipe callbacks run on nng threads: they only take short locks. */
static void pull_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	nng_comm *c = arg;
	int rank;

	if (ev != NNG_PIPE_EV_REM_POST || atomic_load(&c->stopping))
		return;
	rank = pipe_lookup(c, nng_pipe_id(p), true);
	if (rank >= 0)
		mark_lost_pending(c, rank);
}

static void push_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	nng_peer *peer = arg;

	(void)p;
	if (ev == NNG_PIPE_EV_ADD_POST && atomic_fetch_add(&peer->connects, 1) > 0)
		atomic_fetch_add(&peer->c->n.reconnects, 1);
	if (ev == NNG_PIPE_EV_REM_POST && !atomic_load(&peer->c->stopping))
		mark_lost_pending(peer->c, peer->rank);
}

/* ---------------------------------------------------------------- MACs -- */

static void store_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* derive_key fills out[0..n) with HKDF-SHA256(session key, info). */
static bool derive_key(const uint8_t *session, const char *info, uint8_t *out, size_t n)
{
	EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
	EVP_KDF_CTX *x = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
	OSSL_PARAM params[] = {
	    OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
	    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)session,
	                                      PT_COMM_KEY_BYTES),
	    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, strlen(info)),
	    OSSL_PARAM_construct_end()};
	bool ok = x != NULL && EVP_KDF_derive(x, out, n, params) == 1;

	EVP_KDF_CTX_free(x);
	EVP_KDF_free(kdf);
	return ok;
}

/* mac_keys derives c's MAC and NH keys from the session key. */
static bool mac_keys(nng_comm *c, const uint8_t *session)
{
	uint8_t nh[PT_NH_KEY_BYTES];

	if (!derive_key(session, "pipetrain frame mac v4", c->mac_key, sizeof(c->mac_key)) ||
	    !derive_key(session, "pipetrain frame nh v4", nh, sizeof(nh)))
		return false;
	for (int i = 0; i < PT_NH_KEY_WORDS; i++)
		c->nh_key[i] = (uint32_t)nh[4 * i] | (uint32_t)nh[4 * i + 1] << 8 |
		               (uint32_t)nh[4 * i + 2] << 16 | (uint32_t)nh[4 * i + 3] << 24;
	OPENSSL_cleanse(nh, sizeof(nh));
	return true;
}

/* mac_ctx_new makes a cipher context keyed with c's MAC key (NULL on
 * failure). One context per user: peers (under their lock), the I/O thread. */
static EVP_CIPHER_CTX *mac_ctx_new(nng_comm *c)
{
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();

	if (x != NULL && EVP_EncryptInit_ex2(x, c->aead, c->mac_key, NULL, NULL) != 1) {
		EVP_CIPHER_CTX_free(x);
		x = NULL;
	}
	return x;
}

/* NH outputs already computed for chunks [c0, c1) of a frame (while its
 * payload was copied), 16 bytes each from out. */
typedef struct nh_pre {
	const uint8_t *out;
	size_t c0, c1;
} nh_pre;

/* mac_tag computes the tag of frame body[0..len) (trailer included, the tag's
 * own 16 bytes excluded) to rank dst: ChaCha20-Poly1305 with the trailer's
 * nonce over NH(body), le64(length) and le32(dst), all associated data.
 * pre (may be NULL) supplies the NH outputs of some chunks. */
static bool mac_tag(nng_comm *c, EVP_CIPHER_CTX *x, const uint8_t *body, size_t len, int dst,
                    const nh_pre *pre, uint8_t tag[MAC_TAG])
{
	enum { SPAN = 256 };
	const size_t n = len - MAC_TAG, chunks = (n + PT_NH_CHUNK - 1) / PT_NH_CHUNK;
	const nh_pre none = {NULL, 0, 0};
	uint8_t h[SPAN * PT_NH_OUT], tail[12], out[16];
	int ol;

	if (pre == NULL || pre->c1 <= pre->c0 || pre->c1 > chunks)
		pre = &none;
	if (EVP_EncryptInit_ex2(x, NULL, NULL, body + n - MAC_NONCE, NULL) != 1)
		return false;
	for (size_t i = 0; i < chunks;) {
		const uint8_t *p = h;
		size_t end, bytes;
		if (i >= pre->c0 && i < pre->c1) {
			p = pre->out + (i - pre->c0) * PT_NH_OUT;
			end = pre->c1;
			bytes = (end - i) * PT_NH_OUT;
		} else {
			size_t off = i * PT_NH_CHUNK;
			end = i + SPAN < chunks ? i + SPAN : chunks;
			if (i < pre->c0 && end > pre->c0)
				end = pre->c0;
			size_t k = (end * PT_NH_CHUNK < n ? end * PT_NH_CHUNK : n) - off;
			pt_nh(c->nh_key, body + off, k, h);
			bytes = pt_nh_outputs(k);
		}
		for (size_t done = 0; done < bytes;) { /* int-sized updates */
			size_t k =
			    bytes - done < ((size_t)1 << 30) ? bytes - done : (size_t)1 << 30;
			if (EVP_EncryptUpdate(x, NULL, &ol, p + done, (int)k) != 1)
				return false;
			done += k;
		}
		i = end;
	}
	store_le(tail, n, 8);
	store_le(tail + 8, (uint32_t)dst, 4);
	return EVP_EncryptUpdate(x, NULL, &ol, tail, sizeof(tail)) == 1 &&
	       EVP_EncryptFinal_ex(x, out, &ol) == 1 &&
	       EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, MAC_TAG, tag) == 1;
}

/* copy_hashed copies src[0..size) to dst, where src[0] is byte `at` of a
 * frame (the payload of one being built, or of one received), and hashes the
 * frame's NH chunks that lie wholly inside on the way; *pre says which (nh
 * holds 16 bytes per 1 KiB of size). The bytes around them are plainly
 * copied. */
static void copy_hashed(const nng_comm *c, uint8_t *dst, const uint8_t *src, size_t at, size_t size,
                        uint8_t *nh, nh_pre *pre)
{
	size_t c0 = (at + PT_NH_CHUNK - 1) / PT_NH_CHUNK, c1 = (at + size) / PT_NH_CHUNK;
	size_t head, mid;

	pre->out = nh;
	pre->c0 = pre->c1 = 0;
	if (c1 <= c0) {
		memcpy(dst, src, size);
		return;
	}
	head = c0 * PT_NH_CHUNK - at;
	mid = (c1 - c0) * PT_NH_CHUNK;
	memcpy(dst, src, head);
	pt_nh_copy(c->nh_key, dst + head, src + head, c1 - c0, nh);
	memcpy(dst + head + mid, src + head + mid, size - head - mid);
	pre->c0 = c0;
	pre->c1 = c1;
}

/* mac_trailer_init writes the trailer's magic and a fresh nonce at p (the
 * tag is written by mac_seal once the sequence number is patched in). */
static void mac_trailer_init(nng_comm *c, uint8_t *p)
{
	memcpy(p, MAC_MAGIC, 4);
	store_le(p + 4, c->mac_instance, 4);
	store_le(p + 8, atomic_fetch_add(&c->mac_counter, 1), 8);
	memset(p + 4 + MAC_NONCE, 0, MAC_TAG);
}

/* mac_seal writes the tag of a finished message to peer (peer->mu held). */
static pt_err mac_seal(nng_peer *peer, nng_msg *msg, const nh_pre *pre)
{
	uint8_t *body = nng_msg_body(msg);
	size_t len = nng_msg_len(msg);

	if (!mac_tag(peer->c, peer->mac, body, len, peer->rank, pre, body + len - MAC_TAG))
		return pt_set_error(PT_ERR_BACKEND, "rank %d: cannot compute a frame's MAC",
		                    peer->c->base.rank);
	return PT_OK;
}

/* mac_check tells whether body[0..len) ends in a trailer whose tag is right
 * for this rank under the session key (I/O thread). */
static bool mac_check(nng_comm *c, const uint8_t *body, size_t len)
{
	uint8_t tag[MAC_TAG];

	if (len < MAC_TRAILER || memcmp(body + len - MAC_TRAILER, MAC_MAGIC, 4) != 0)
		return false;
	if (!mac_tag(c, c->rx_mac, body, len, c->base.rank, NULL, tag))
		return false;
	return CRYPTO_memcmp(tag, body + len - MAC_TAG, MAC_TAG) == 0;
}

/* mac_reject counts a dropped frame (no error reaches the receiver: the
 * sender is not a member of the session, or replays one's frame) and logs
 * at most one line per MAC_WARN_MS. */
static void mac_reject(nng_comm *c, const char *why, size_t len)
{
	long long now = pt_now_ms();

	atomic_fetch_add(&c->n.errors, 1);
	c->mac_rejected++;
	if (now - c->mac_warned_ms < MAC_WARN_MS)
		return;
	pt_warn("rank %d: dropped a %zu-byte frame that %s (%llu dropped since the last "
	        "warning)",
	        c->base.rank, len, why, (unsigned long long)c->mac_rejected);
	c->mac_warned_ms = now;
	c->mac_rejected = 0;
}

/* -------------------------------------------------------------- frames -- */

typedef struct frame_values {
	const pt_msg *m;
	int source;
	uint64_t seq;
	uint8_t codec;
	uint64_t raw_size, payload_offset, payload_size;
	uint32_t frag_index, frag_count;
	uint64_t frag_offset, frag_size;
} frame_values;

/* frame_build writes a TensorFrame into b. Every scalar is forced (never
 * elided as a default), so the size does not depend on the values and the
 * header can be sized before the payload is compressed. */
static pt_err frame_build(pt_fb_builder *b, const frame_values *v, const uint8_t **data,
                          size_t *size)
{
	const pt_msg *m = v->m;
	pt_fb_ref shape = 0, blob = 0, root = 0;

	pt_fb_builder_reset(b);
	if (m->has_tensor && m->tensor.ndim > 0)
		pt_fb_create_vector(b, m->tensor.shape, (size_t)m->tensor.ndim, 8, 8, &shape);
	if (m->blob_len > 0 && v->frag_index == 0)
		pt_fb_create_vector(b, m->blob, m->blob_len, 1, 1, &blob);
	pt_fb_start_table(b);
	pt_fb_force_u64(b, F(JOB), m->meta.job);
	pt_fb_force_i64(b, F(STEP), m->meta.step);
	pt_fb_force_u64(b, F(SEQ), v->seq);
	pt_fb_force_u64(b, F(RAW_SIZE), v->raw_size);
	pt_fb_force_u64(b, F(PAYLOAD_OFFSET), v->payload_offset);
	pt_fb_force_u64(b, F(PAYLOAD_SIZE), v->payload_size);
	pt_fb_force_i32(b, F(MICROBATCH), m->meta.microbatch);
	pt_fb_force_i32(b, F(SOURCE), v->source);
	pt_fb_force_u32(b, F(TAG), m->meta.tag);
	pt_fb_force_u64(b, F(FRAG_OFFSET), v->frag_offset);
	pt_fb_force_u64(b, F(FRAG_SIZE), v->frag_size);
	pt_fb_force_u32(b, F(FRAG_INDEX), v->frag_index);
	pt_fb_force_u32(b, F(FRAG_COUNT), v->frag_count);
	pt_fb_add_offset(b, F(SHAPE), shape);
	pt_fb_add_offset(b, F(BLOB), blob);
	pt_fb_force_u8(b, F(KIND), (uint8_t)m->meta.kind);
	pt_fb_force_u8(b, F(CHANNEL), (uint8_t)pt_msg_channel(m->meta.kind));
	pt_fb_force_bool(b, F(HAS_TENSOR), m->has_tensor);
	pt_fb_force_u8(b, F(DTYPE), m->has_tensor ? (uint8_t)m->tensor.dtype : 0);
	pt_fb_force_u8(b, F(CODEC), v->codec);
	pt_fb_end_table(b, &root);
	return pt_fb_finish(b, root, FRAME_ID, data, size);
}

/* An outgoing message: the tensor's contiguous bytes (packed when strided)
 * and how many fragments carry them. */
typedef struct out_msg {
	const pt_msg *m;
	const uint8_t *src;
	void *packed;
	size_t raw;
	uint32_t nfrags;
	pt_fb_builder b;
	uint8_t *nh; /* NH outputs of the payload's chunks (authenticated sends) */
	nh_pre pre;  /* which chunks of the frame being sent they cover */
} out_msg;

static void out_fini(out_msg *o)
{
	pt_fb_builder_fini(&o->b);
	free(o->packed);
	free(o->nh);
}

static pt_err out_prepare(nng_comm *c, const pt_msg *m, out_msg *o)
{
	pt_err rv;

	memset(o, 0, sizeof(*o));
	o->m = m;
	o->nfrags = 1;
	if (m->has_tensor) {
		o->raw = pt_tensor_nbytes(&m->tensor);
		if (o->raw > c->max_msg)
			return pt_set_error(
			    PT_ERR_RANGE, "tensor of %zu bytes exceeds max_msg_bytes %zu (rank %d)",
			    o->raw, c->max_msg, c->base.rank);
		if (o->raw > FRAG_BYTES)
			o->nfrags = (uint32_t)((o->raw + FRAG_BYTES - 1) / FRAG_BYTES);
		if (pt_tensor_is_contiguous(&m->tensor)) {
			o->src = pt_tensor_data(&m->tensor);
		} else {
			if ((o->packed = malloc(o->raw ? o->raw : 1)) == NULL)
				return pt_set_error(PT_ERR_NOMEM, "packing a %zu-byte tensor",
				                    o->raw);
			if ((rv = pt_tensor_read(&m->tensor, o->packed, o->raw)) != PT_OK)
				return rv;
			o->src = o->packed;
		}
		if (c->auth && o->raw >= 2 * PT_NH_CHUNK) {
			size_t frag = o->nfrags == 1 ? o->raw : FRAG_BYTES;
			if ((o->nh = malloc(pt_nh_outputs(frag))) == NULL)
				return pt_set_error(PT_ERR_NOMEM,
				                    "MAC scratch of a %zu-byte tensor", o->raw);
		}
	}
	return pt_fb_builder_init(&o->b, 512);
}

/* build_frag makes the nng message of fragment `index` of o, with seq 0
 * (patched under the peer lock by patch_seq) and, with authentication, a
 * trailer whose tag mac_seal writes after that. The payload is copied (or lz4
 * compressed, when that shrinks it) straight into the message body.
 * *raw_bytes: the message size without compression. */
static pt_err build_frag(nng_comm *c, out_msg *o, uint32_t index, nng_msg **out,
                         uint64_t *raw_bytes)
{
	frame_values v = {.m = o->m, .source = c->base.rank, .raw_size = o->raw};
	const uint8_t *hdr, *src;
	size_t hsize, hsize2, padded, cap, payload, size, trailer = c->auth ? MAC_TRAILER : 0;
	nng_msg *msg = NULL;
	uint8_t *body;
	bool try_lz4;
	pt_err rv;
	int nrv;

	*out = NULL;
	v.frag_index = index;
	v.frag_count = o->nfrags;
	v.frag_offset = (uint64_t)index * FRAG_BYTES;
	size = o->nfrags == 1 ? o->raw : o->raw - (size_t)v.frag_offset;
	if (size > FRAG_BYTES && o->nfrags > 1)
		size = FRAG_BYTES;
	v.frag_size = size;
	src = o->src ? o->src + v.frag_offset : NULL;
	PT_TRY(frame_build(&o->b, &v, &hdr, &hsize));
	padded = (hsize + PAYLOAD_ALIGN - 1) & ~(size_t)(PAYLOAD_ALIGN - 1);
	try_lz4 = c->compress && size >= COMPRESS_MIN_BYTES && size <= LZ4_MAX_INPUT_SIZE;
	cap = padded + (try_lz4 ? (size_t)LZ4_compressBound((int)size) : size) + trailer;
	if ((nrv = nng_msg_alloc(&msg, cap)) != 0)
		return nng_fail(nrv, "%s: %s", "nng_msg_alloc");
	body = nng_msg_body(msg);
	advise_huge(body, cap);
	payload = size;
	v.codec = CODEC_NONE;
	if (try_lz4) {
		int n = LZ4_compress_default((const char *)src, (char *)body + padded, (int)size,
		                             (int)(cap - padded - trailer));
		if (n > 0 && (size_t)n < size) {
			v.codec = CODEC_LZ4;
			payload = (size_t)n;
		}
	}
	o->pre.c0 = o->pre.c1 = 0;
	if (v.codec == CODEC_NONE && size > 0) {
		if (o->nh != NULL)
			copy_hashed(c, body + padded, src, padded, size, o->nh, &o->pre);
		else
			memcpy(body + padded, src, size);
	}
	if (cap > padded + payload + trailer)
		nng_msg_chop(msg, cap - padded - payload - trailer);
	if (trailer)
		mac_trailer_init(c, body + padded + payload);
	v.payload_offset = padded;
	v.payload_size = payload;
	if ((rv = frame_build(&o->b, &v, &hdr, &hsize2)) != PT_OK)
		goto fail;
	if (hsize2 != hsize) {
		rv = pt_set_error(PT_ERR_STATE, "frame header changed size (%zu, then %zu)", hsize,
		                  hsize2);
		goto fail;
	}
	memcpy(body, hdr, hsize);
	memset(body + hsize, 0, padded - hsize);
	*raw_bytes = padded + size + trailer;
	*out = msg;
	return PT_OK;
fail:
	nng_msg_free(msg);
	return rv;
}

/* patch_seq stores seq into a built message's header (the field is forced). */
static void patch_seq(nng_msg *msg, uint64_t seq)
{
	uint8_t *body = nng_msg_body(msg);
	uint8_t *p = (uint8_t *)pt_fb_field(pt_fb_root(body), F(SEQ));
	memcpy(p, &seq, sizeof(seq));
}

/* ---------------------------------------------------------------- send -- */

/* self_send delivers a copy of m to this rank's own mailbox. */
static pt_err self_send(nng_comm *c, const pt_msg *m)
{
	pt_msg copy = {0};
	size_t raw = 0;
	pt_err rv;

	copy.meta = m->meta;
	if (m->has_tensor) {
		pt_storage *s;
		void *data;

		raw = pt_tensor_nbytes(&m->tensor);
		if ((data = alloc_payload(raw)) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "copy of a %zu-byte tensor", raw);
		if ((rv = pt_tensor_read(&m->tensor, data, raw)) != PT_OK) {
			free(data);
			return rv;
		}
		PT_TRY(storage_adopt(&s, data, raw));
		rv = pt_tensor_init_on(&copy.tensor, s, 0, m->tensor.dtype, m->tensor.ndim,
		                       m->tensor.shape);
		pt_storage_release(s);
		if (rv != PT_OK)
			return rv;
		copy.has_tensor = true;
	}
	if (m->blob_len > 0 && (rv = pt_msg_set_blob(&copy, m->blob, m->blob_len)) != PT_OK) {
		pt_msg_fini(&copy);
		return rv;
	}
	pthread_mutex_lock(&c->self_mu);
	copy.meta.seq = c->self_seq;
	rv = pt_mailbox_push(c->mb, &copy);
	if (rv == PT_OK)
		c->self_seq++;
	pthread_mutex_unlock(&c->self_mu);
	if (rv != PT_OK) {
		pt_msg_fini(&copy);
		return rv;
	}
	atomic_fetch_add(&c->n.msgs_sent, 1);
	atomic_fetch_add(&c->n.bytes_sent, raw + m->blob_len);
	atomic_fetch_add(&c->n.bytes_raw_sent, raw + m->blob_len);
	return PT_OK;
}

/* send_locked sends fragment `index` of o (or builds it first when msg is
 * NULL) to peer; the caller holds peer->mu. */
static pt_err send_locked(nng_comm *c, nng_peer *peer, out_msg *o, uint32_t index, nng_msg *msg,
                          uint64_t raw_bytes)
{
	size_t len;
	int nrv;

	if (msg == NULL)
		PT_TRY(build_frag(c, o, index, &msg, &raw_bytes));
	len = nng_msg_len(msg);
	patch_seq(msg, peer->next_seq + peer->skip);
	if (c->auth) {
		pt_err rv = mac_seal(peer, msg, &o->pre);
		if (rv != PT_OK) {
			nng_msg_free(msg);
			return rv;
		}
	}
	if ((nrv = nng_sendmsg(peer->push, msg, 0)) != 0) {
		char what[96];
		pt_err rv;
		nng_msg_free(msg);
		snprintf(what, sizeof(what), "rank %d: send to rank %d", c->base.rank, peer->rank);
		rv = nng_fail(nrv, "%s: %s", what);
		if (rv == PT_ERR_TIMEOUT)
			pt_set_error(rv, "%s: not accepted within %d ms (peer down?): %s", what,
			             c->send_timeout_ms, nng_strerror(nrv));
		return rv;
	}
	peer->next_seq += peer->skip + 1;
	peer->skip = 0;
	atomic_fetch_add(&c->n.bytes_sent, len);
	atomic_fetch_add(&c->n.bytes_raw_sent, raw_bytes);
	return PT_OK;
}

static pt_err nng_comm_send(pt_comm *base, int dst, const pt_msg *m)
{
	nng_comm *c = (nng_comm *)base;
	nng_peer *peer;
	nng_msg *msg = NULL;
	uint64_t raw_bytes = 0;
	out_msg o;
	pt_err rv;

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	if (dst == base->rank)
		return self_send(c, m);
	if (!atomic_load(&c->connected))
		return pt_set_error(PT_ERR_STATE, "rank %d: send before pt_nng_comm_connect",
		                    base->rank);
	if (peer_lost(c, dst)) {
		atomic_fetch_add(&c->n.errors, 1);
		return pt_set_error(PT_ERR_CLOSED, "rank %d: peer rank %d is gone", base->rank,
		                    dst);
	}
	peer = &c->peers[dst];
	if ((rv = out_prepare(c, m, &o)) != PT_OK)
		goto done;
	if (o.nfrags == 1) {
		/* Copy or compress outside the lock: concurrent senders overlap. */
		if ((rv = build_frag(c, &o, 0, &msg, &raw_bytes)) != PT_OK)
			goto done;
		pthread_mutex_lock(&peer->mu);
		rv = send_locked(c, peer, &o, 0, msg, raw_bytes);
		pthread_mutex_unlock(&peer->mu);
	} else {
		/* Fragments go back to back: each is built while the previous one is
		 * on the wire. A failure part-way leaves the receiver a partial
		 * tensor, which it reports and discards at the next message. */
		pthread_mutex_lock(&peer->mu);
		for (uint32_t i = 0; i < o.nfrags && rv == PT_OK; i++)
			rv = send_locked(c, peer, &o, i, NULL, 0);
		pthread_mutex_unlock(&peer->mu);
	}
done:
	out_fini(&o);
	if (rv != PT_OK) {
		atomic_fetch_add(&c->n.errors, 1);
		return rv;
	}
	atomic_fetch_add(&c->n.msgs_sent, 1);
	return PT_OK;
}

pt_err pt_nng_comm_test_skip_seq(pt_comm *base, int dst, uint64_t skip)
{
	nng_comm *c = (nng_comm *)base;

	if (base == NULL || base->ops != &nng_ops)
		return pt_set_error(PT_ERR_INVALID, "not an nng communicator");
	if (dst < 0 || dst >= base->world || dst == base->rank)
		return pt_set_error(PT_ERR_RANGE, "skip_seq to rank %d", dst);
	pthread_mutex_lock(&c->peers[dst].mu);
	c->peers[dst].skip = skip;
	pthread_mutex_unlock(&c->peers[dst].mu);
	return PT_OK;
}

/* ------------------------------------------------------------- receive -- */

static pt_err nng_comm_recv(pt_comm *base, int src, pt_channel ch, int timeout_ms, pt_msg *out)
{
	nng_comm *c = (nng_comm *)base;
	pt_err rv;

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	rv = pt_mailbox_pop(c->mb, src, ch, timeout_ms, out);
	if (rv == PT_ERR_TIMEOUT && timeout_ms != 0)
		atomic_fetch_add(&c->n.timeouts, 1); /* an empty poll is not a timeout */
	return rv;
}

/* A parsed, verified header. */
typedef struct frame {
	pt_msg_meta meta;
	bool has_tensor;
	uint8_t dtype, codec;
	int ndim;
	int64_t shape[PT_MAX_DIMS];
	uint64_t raw_size, payload_offset, payload_size;
	uint32_t frag_index, frag_count; /* count 1: the whole tensor */
	uint64_t frag_offset, frag_size; /* bytes of the tensor this payload decodes to */
	const uint8_t *blob;
	uint32_t blob_len;
} frame;

/* frame_parse verifies body[0..len) and fills f; errors name what is wrong. */
static pt_err frame_parse(nng_comm *c, const uint8_t *body, size_t len, frame *f)
{
	const uint8_t *t, *vec;
	uint32_t n;
	size_t vsize = len < PT_FB_MAX_SIZE ? len : PT_FB_MAX_SIZE;
	uint8_t kind, channel;
	uint64_t numel = 1, esize;

	memset(f, 0, sizeof(*f));
	if (len < 12)
		return pt_set_error(PT_ERR_FORMAT, "message of %zu bytes is too short", len);
	/* First against the whole body (the header's size is not known yet), then
	 * again against the header alone, so no field reaches into the payload. */
	PT_TRY(pt_fb_verify(body, vsize, &pt_fb_stage_tensor_frame_desc, FRAME_ID, NULL));
	t = pt_fb_root(body);
	f->payload_offset = pt_fb_get_u64(t, F(PAYLOAD_OFFSET), 0);
	f->payload_size = pt_fb_get_u64(t, F(PAYLOAD_SIZE), 0);
	if (f->payload_offset < 12 || f->payload_offset > len ||
	    f->payload_offset % PAYLOAD_ALIGN != 0 || f->payload_size != len - f->payload_offset)
		return pt_set_error(PT_ERR_FORMAT,
		                    "payload at %llu of %llu bytes does not end a %zu-byte message",
		                    (unsigned long long)f->payload_offset,
		                    (unsigned long long)f->payload_size, len);
	if (f->payload_offset < vsize)
		PT_TRY(pt_fb_verify(body, f->payload_offset, &pt_fb_stage_tensor_frame_desc,
		                    FRAME_ID, NULL));

	kind = pt_fb_get_u8(t, F(KIND), 0);
	channel = pt_fb_get_u8(t, F(CHANNEL), 0);
	if (kind >= PT_MSG_KIND_COUNT)
		return pt_set_error(PT_ERR_FORMAT, "unknown message kind %u", kind);
	if (channel != (uint8_t)pt_msg_channel((pt_msg_kind)kind))
		return pt_set_error(PT_ERR_FORMAT, "kind %u on channel %u", kind, channel);
	f->meta.kind = (pt_msg_kind)kind;
	f->meta.channel = (pt_channel)channel;
	f->meta.job = pt_fb_get_u64(t, F(JOB), 0);
	f->meta.step = pt_fb_get_i64(t, F(STEP), 0);
	f->meta.microbatch = pt_fb_get_i32(t, F(MICROBATCH), 0);
	f->meta.source = pt_fb_get_i32(t, F(SOURCE), -1);
	f->meta.seq = pt_fb_get_u64(t, F(SEQ), 0);
	f->meta.tag = pt_fb_get_u32(t, F(TAG), 0);
	if (f->meta.source < 0 || f->meta.source >= c->base.world)
		return pt_set_error(PT_ERR_FORMAT, "source rank %d outside [0, %d)", f->meta.source,
		                    c->base.world);
	f->blob = pt_fb_get_vector(t, F(BLOB), &f->blob_len);

	f->has_tensor = pt_fb_get_bool(t, F(HAS_TENSOR), false);
	f->codec = pt_fb_get_u8(t, F(CODEC), CODEC_NONE);
	f->raw_size = pt_fb_get_u64(t, F(RAW_SIZE), 0);
	f->frag_count = pt_fb_get_u32(t, F(FRAG_COUNT), 1);
	f->frag_index = pt_fb_get_u32(t, F(FRAG_INDEX), 0);
	f->frag_offset = pt_fb_get_u64(t, F(FRAG_OFFSET), 0);
	f->frag_size = pt_fb_get_u64(t, F(FRAG_SIZE), f->raw_size);
	if (f->frag_count == 0)
		f->frag_count = 1;
	if (f->frag_count == 1
	        ? f->frag_index != 0 || f->frag_offset != 0 || f->frag_size != f->raw_size
	        : f->frag_index >= f->frag_count || f->frag_size > f->raw_size ||
	              f->frag_offset > f->raw_size - f->frag_size)
		return pt_set_error(
		    PT_ERR_FORMAT, "fragment %u of %u at %llu (%llu bytes) of a %llu-byte tensor",
		    f->frag_index, f->frag_count, (unsigned long long)f->frag_offset,
		    (unsigned long long)f->frag_size, (unsigned long long)f->raw_size);
	if (!f->has_tensor) {
		if (f->payload_size != 0 || f->raw_size != 0 || f->frag_count != 1)
			return pt_set_error(PT_ERR_FORMAT, "payload without a tensor");
		return PT_OK;
	}
	f->dtype = pt_fb_get_u8(t, F(DTYPE), 0);
	if (f->dtype >= PT_DTYPE_COUNT)
		return pt_set_error(PT_ERR_FORMAT, "unknown dtype %u", f->dtype);
	esize = pt_dtype_size((pt_dtype)f->dtype);
	vec = pt_fb_get_vector(t, F(SHAPE), &n);
	if (n > PT_MAX_DIMS)
		return pt_set_error(PT_ERR_FORMAT, "tensor of %u dimensions (at most %d)", n,
		                    PT_MAX_DIMS);
	f->ndim = (int)n;
	for (uint32_t i = 0; i < n; i++) {
		int64_t d = pt_fb_load_i64(vec + 8 * i);
		if (d < 0)
			return pt_set_error(PT_ERR_FORMAT, "negative dimension %lld", (long long)d);
		if (d != 0 && numel > c->max_msg / (uint64_t)d)
			numel = c->max_msg + 1; /* saturate: too large below */
		else
			numel *= (uint64_t)d;
		f->shape[i] = d;
	}
	if (numel > c->max_msg / esize || numel * esize != f->raw_size)
		return pt_set_error(PT_ERR_FORMAT,
		                    "tensor of %llu %s elements does not match raw size %llu "
		                    "(cap %zu bytes)",
		                    (unsigned long long)numel, pt_dtype_name((pt_dtype)f->dtype),
		                    (unsigned long long)f->raw_size, c->max_msg);
	vec = pt_fb_get_vector(t, F(STRIDES), &n);
	if (n != 0) {
		int64_t stride = 1;
		if ((int)n != f->ndim)
			return pt_set_error(PT_ERR_FORMAT, "%u strides for %d dimensions", n,
			                    f->ndim);
		for (int i = f->ndim - 1; i >= 0; i--) {
			if (pt_fb_load_i64(vec + 8 * (size_t)i) != stride && f->shape[i] != 1)
				return pt_set_error(PT_ERR_FORMAT, "non-contiguous strides");
			stride *= f->shape[i];
		}
	}
	if (f->codec == CODEC_NONE) {
		if (f->payload_size != f->frag_size)
			return pt_set_error(PT_ERR_FORMAT, "raw payload of %llu bytes for %llu",
			                    (unsigned long long)f->payload_size,
			                    (unsigned long long)f->frag_size);
	} else if (f->codec == CODEC_LZ4) {
		if (f->frag_size > LZ4_MAX_INPUT_SIZE || f->payload_size == 0 ||
		    f->payload_size > (uint64_t)LZ4_compressBound((int)f->frag_size))
			return pt_set_error(PT_ERR_FORMAT, "lz4 payload of %llu bytes for %llu",
			                    (unsigned long long)f->payload_size,
			                    (unsigned long long)f->frag_size);
	} else {
		return pt_set_error(PT_ERR_FORMAT, "unknown codec %u", f->codec);
	}
	return PT_OK;
}

/* decode_payload writes the f->frag_size bytes that f's payload encodes to dst. */
static pt_err decode_payload(const frame *f, const uint8_t *body, uint8_t *dst)
{
	const uint8_t *payload = body + f->payload_offset;

	if (f->codec == CODEC_LZ4) {
		int n = LZ4_decompress_safe((const char *)payload, (char *)dst,
		                            (int)f->payload_size, (int)f->frag_size);
		if (n < 0 || (uint64_t)n != f->frag_size)
			return pt_set_error(
			    PT_ERR_FORMAT,
			    "lz4 payload of %llu bytes does not decode to %llu (got %d)",
			    (unsigned long long)f->payload_size, (unsigned long long)f->frag_size,
			    n);
	} else if (f->frag_size > 0) {
		memcpy(dst, payload, f->frag_size);
	}
	return PT_OK;
}

/* start_msg makes the message f begins: meta, a fresh contiguous tensor of
 * f->raw_size bytes (contents not yet written), and a copy of the blob. */
static pt_err start_msg(const frame *f, pt_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->meta = f->meta;
	if (f->has_tensor) {
		size_t raw = (size_t)f->raw_size;
		void *data = alloc_payload(raw);
		pt_storage *s;
		pt_err rv;

		if (data == NULL)
			return pt_set_error(PT_ERR_NOMEM, "received tensor of %zu bytes", raw);
		PT_TRY(storage_adopt(&s, data, raw));
		rv = pt_tensor_init_on(&m->tensor, s, 0, (pt_dtype)f->dtype, f->ndim, f->shape);
		pt_storage_release(s);
		if (rv != PT_OK)
			return rv;
		m->has_tensor = true;
	}
	if (f->blob_len > 0) {
		pt_err rv = pt_msg_set_blob(m, f->blob, f->blob_len);
		if (rv != PT_OK) {
			pt_msg_fini(m);
			return rv;
		}
	}
	return PT_OK;
}

/* frame_to_msg builds a whole received message (frag_count 1). */
static pt_err frame_to_msg(const frame *f, const uint8_t *body, pt_msg *m)
{
	pt_err rv;

	PT_TRY(start_msg(f, m));
	if (m->has_tensor &&
	    (rv = decode_payload(f, body, (uint8_t *)pt_tensor_data(&m->tensor))) != PT_OK) {
		pt_msg_fini(m);
		return rv;
	}
	return PT_OK;
}

/* deliver_error queues err (the calling thread's last error) for the receiver. */
static void deliver_error(nng_comm *c, int source, pt_err err)
{
	char text[512];

	snprintf(text, sizeof(text), "%s", pt_last_error());
	atomic_fetch_add(&c->n.errors, 1);
	pt_warn("rank %d: %s", c->base.rank, text);
	pt_mailbox_push_error(c->mb, source, err, text);
}

static void on_barrier(nng_comm *c, const frame *f)
{
	pthread_mutex_lock(&c->bar_mu);
	if (c->base.rank == 0) {
		if (f->meta.tag > c->bar_arrived[f->meta.source])
			c->bar_arrived[f->meta.source] = f->meta.tag;
	} else if (f->meta.source == 0 && f->meta.tag > c->bar_released) {
		c->bar_released = f->meta.tag;
	}
	pthread_cond_broadcast(&c->bar_cv);
	pthread_mutex_unlock(&c->bar_mu);
}

static void asm_drop(assembly *a)
{
	pt_msg_fini(&a->msg);
	a->active = false;
}

/* asm_abandon reports and drops a half-received tensor of source. */
static void asm_abandon(nng_comm *c, int source)
{
	assembly *a = &c->asm_of[source];

	if (!a->active)
		return;
	deliver_error(c, source,
	              pt_set_error(PT_ERR_FORMAT,
	                           "tensor from rank %d cut short: %u of %u fragments arrived",
	                           source, a->next_index, a->count));
	asm_drop(a);
}

/* frag_add decodes fragment f into its source's assembly; *ready and *out
 * hand over the message once its last fragment arrived. Errors drop the
 * assembly and are the caller's to deliver. */
static pt_err frag_add(nng_comm *c, const frame *f, const uint8_t *body, bool *ready, pt_msg *out)
{
	int src = f->meta.source;
	assembly *a = &c->asm_of[src];
	pt_err rv;

	*ready = false;
	if (f->frag_index == 0) {
		asm_abandon(c, src);
		PT_TRY(start_msg(f, &a->msg));
		a->active = true;
		a->count = f->frag_count;
		a->next_index = 0;
		a->next_offset = 0;
	} else if (!a->active || f->frag_index != a->next_index || f->frag_count != a->count ||
	           f->raw_size != pt_tensor_nbytes(&a->msg.tensor) ||
	           f->meta.kind != a->msg.meta.kind) {
		uint32_t want = a->active ? a->next_index : 0;
		asm_drop(a);
		return pt_set_error(
		    PT_ERR_FORMAT,
		    "fragment %u of %u from rank %d out of order (expected fragment %u)",
		    f->frag_index, f->frag_count, src, want);
	}
	if (f->frag_offset != a->next_offset) {
		asm_drop(a);
		return pt_set_error(
		    PT_ERR_FORMAT, "fragment %u from rank %d at byte %llu, not %llu", f->frag_index,
		    src, (unsigned long long)f->frag_offset, (unsigned long long)a->next_offset);
	}
	rv = decode_payload(f, body, (uint8_t *)pt_tensor_data(&a->msg.tensor) + f->frag_offset);
	if (rv != PT_OK) {
		asm_drop(a);
		return rv;
	}
	a->next_index++;
	a->next_offset += f->frag_size;
	if (a->next_index < a->count)
		return PT_OK;
	if (a->next_offset != f->raw_size) {
		asm_drop(a);
		return pt_set_error(
		    PT_ERR_FORMAT, "fragments from rank %d cover %llu of %llu bytes", src,
		    (unsigned long long)a->next_offset, (unsigned long long)f->raw_size);
	}
	*out = a->msg;
	memset(&a->msg, 0, sizeof(a->msg));
	a->active = false;
	*ready = true;
	return PT_OK;
}

/* check_seq checks f's sequence number against the source's next one. A gap
 * is reported (PT_ERR_FORMAT, queued before the message) and the message still
 * delivered; a duplicate is reported and dropped (returns false). */
static bool check_seq(nng_comm *c, const frame *f)
{
	uint64_t want = c->expect_seq[f->meta.source];

	if (f->meta.seq != want)
		deliver_error(c, f->meta.source,
		              pt_set_error(PT_ERR_FORMAT,
		                           "sequence %s from rank %d: expected seq %llu, got %llu",
		                           f->meta.seq > want ? "gap" : "duplicate", f->meta.source,
		                           (unsigned long long)want,
		                           (unsigned long long)f->meta.seq));
	if (f->meta.seq < want)
		return false;
	c->expect_seq[f->meta.source] = f->meta.seq + 1;
	return true;
}

/* rx_verify_copy authenticates a whole, uncompressed tensor frame of at
 * least FUSE_MIN_BYTES while copying its payload out, so the payload is read
 * once: the header is parsed first (frame_parse bounds every read and acts on
 * nothing), the payload is copied into a fresh tensor with its NH chunks
 * hashed on the way, and only then is the tag checked. Returns 1: authentic,
 * *f parsed and *m holding the message; -1: the tag is wrong (nothing kept);
 * 0: not such a frame (or no memory for the copy): check it with mac_check. */
static int rx_verify_copy(nng_comm *c, const uint8_t *body, size_t len, frame *f, pt_msg *m)
{
	uint8_t tag[MAC_TAG];
	nh_pre pre;
	size_t need;

	if (len < MAC_TRAILER + FUSE_MIN_BYTES ||
	    memcmp(body + len - MAC_TRAILER, MAC_MAGIC, 4) != 0)
		return 0;
	if (frame_parse(c, body, len - MAC_TRAILER, f) != PT_OK || f->meta.kind == PT_MSG_BARRIER ||
	    f->frag_count != 1 || !f->has_tensor || f->codec != CODEC_NONE ||
	    f->frag_size < FUSE_MIN_BYTES)
		return 0;
	need = pt_nh_outputs((size_t)f->frag_size);
	if (need > c->rx_nh_cap) {
		uint8_t *p = realloc(c->rx_nh, need);
		if (p == NULL)
			return 0;
		c->rx_nh = p;
		c->rx_nh_cap = need;
	}
	if (start_msg(f, m) != PT_OK)
		return 0;
	copy_hashed(c, pt_tensor_data(&m->tensor), body + f->payload_offset,
	            (size_t)f->payload_offset, (size_t)f->frag_size, c->rx_nh, &pre);
	if (!mac_tag(c, c->rx_mac, body, len, c->base.rank, &pre, tag) ||
	    CRYPTO_memcmp(tag, body + len - MAC_TAG, MAC_TAG) != 0) {
		pt_msg_fini(m);
		return -1;
	}
	return 1;
}

static void io_handle(nng_comm *c, nng_msg *msg)
{
	size_t len = nng_msg_len(msg);
	uint8_t *body = nng_msg_body(msg);
	uint8_t *copy = NULL;
	uint32_t pipe = nng_pipe_id(nng_msg_get_pipe(msg));
	int pipe_rank = pipe_lookup(c, pipe, false);
	bool ready = false, have = false; /* have: m holds a message to free */
	int fused = 0;
	frame f;
	pt_msg m;
	pt_err rv = PT_OK;

	atomic_fetch_add(&c->n.bytes_recv, len);
	if (((uintptr_t)body & 3) != 0) { /* never seen with nng 1.5; stay correct */
		if ((copy = alloc_payload(len)) == NULL) {
			deliver_error(c, pipe_rank,
			              pt_set_error(PT_ERR_NOMEM, "realigning a message"));
			goto done;
		}
		memcpy(copy, body, len);
		body = copy;
	}
	/* Nothing of a frame is acted on before its tag checks out (a large
	 * tensor's header is parsed to find where to copy the payload to, and
	 * the copy is dropped unless the tag is right). */
	if (c->auth) {
		fused = rx_verify_copy(c, body, len, &f, &m);
		if (fused < 0 || (fused == 0 && !mac_check(c, body, len))) {
			mac_reject(c, "failed authentication (not from this session)", len);
			goto done;
		}
		have = fused > 0;
		len -= MAC_TRAILER;
	}
	if (!have && (rv = frame_parse(c, body, len, &f)) != PT_OK) {
		char what[400];
		snprintf(what, sizeof(what), "%s", pt_last_error());
		if (pipe_rank >= 0)
			pt_set_error(rv, "malformed message (%zu bytes) from rank %d: %s", len,
			             pipe_rank, what);
		else
			pt_set_error(rv, "malformed message (%zu bytes) from an unknown sender: %s",
			             len, what);
		deliver_error(c, pipe_rank, rv);
		goto done;
	}
	/* Genuine senders never repeat a sequence number: an authentic frame
	 * that does is a replay, dropped before it can touch any state. */
	if (c->auth && f.meta.seq < c->expect_seq[f.meta.source]) {
		mac_reject(c, "repeats an earlier sequence number (a replay)", len);
		goto done;
	}
	if (pipe_rank >= 0 && pipe_rank != f.meta.source) {
		deliver_error(c, pipe_rank,
		              pt_set_error(PT_ERR_FORMAT,
		                           "message claims source rank %d on rank %d's connection",
		                           f.meta.source, pipe_rank));
		goto done;
	}
	/* A connection's rank is trusted (and its sequence tracked) from its first
	 * fully valid message on, so a stranger's junk claiming to be rank r can
	 * neither disturb r's sequence or half-received tensor nor, by
	 * disconnecting, mark r lost. */
	if (pipe_rank < 0 && (c->asm_of[f.meta.source].active || f.frag_index != 0)) {
		deliver_error(c, f.meta.source,
		              pt_set_error(PT_ERR_FORMAT,
		                           "fragment %u claiming rank %d on a new connection",
		                           f.frag_index, f.meta.source));
		goto done;
	}
	if (pipe_rank >= 0 && !check_seq(c, &f))
		goto done;
	if (f.meta.kind == PT_MSG_BARRIER) {
		memset(&m, 0, sizeof(m));
		ready = true;
	} else if (f.frag_count == 1) {
		if (pipe_rank >= 0)
			asm_abandon(c, f.meta.source); /* a whole message ends a partial one */
		if (!have)
			rv = frame_to_msg(&f, body, &m);
		have = ready = rv == PT_OK;
	} else {
		rv = frag_add(c, &f, body, &ready, &m);
		have = rv == PT_OK && ready;
	}
	if (rv != PT_OK) {
		if (pipe_rank < 0) {
			char what[400];
			snprintf(what, sizeof(what), "%s", pt_last_error());
			pt_set_error(rv, "message claiming rank %d on a new connection: %s",
			             f.meta.source, what);
		}
		deliver_error(c, f.meta.source, rv);
		goto done;
	}
	if (pipe_rank < 0) {
		pipe_learn(c, pipe, f.meta.source);
		if (!check_seq(c, &f)) {
			if (!ready)
				asm_drop(&c->asm_of[f.meta.source]);
			goto done;
		}
	}
	if (!ready)
		goto done;
	if (f.meta.kind == PT_MSG_BARRIER) {
		on_barrier(c, &f);
		goto done;
	}
	/* The wire buffer is no longer needed: give it back before queueing. */
	nng_msg_free(msg);
	msg = NULL;
	/* Counted before it is queued: whoever receives it already sees it
	 * counted (a snapshot right after a reply includes the reply). */
	atomic_fetch_add(&c->n.msgs_recv, 1);
	have = false;
	if (pt_mailbox_push(c->mb, &m) != PT_OK) {
		atomic_fetch_sub(&c->n.msgs_recv, 1);
		pt_msg_fini(&m); /* closed: nobody will receive it */
	}
done:
	if (have)
		pt_msg_fini(&m);
	free(copy);
	if (msg)
		nng_msg_free(msg);
}

/* rx_cb runs on an nng thread when the receive completes: it only parks the
 * result and wakes the I/O thread (never blocks, never calls back into nng
 * beyond reading the aio). */
static void rx_cb(void *arg)
{
	nng_comm *c = arg;
	int rv = nng_aio_result(c->rx_aio);

	pthread_mutex_lock(&c->rx_mu);
	c->rx_rv = rv;
	c->rx_msg = rv == 0 ? nng_aio_get_msg(c->rx_aio) : NULL;
	c->rx_done = true;
	pthread_cond_signal(&c->rx_cv);
	pthread_mutex_unlock(&c->rx_mu);
}

/* The I/O thread. The receive aio has no timeout (nng 1.5.2 can fire a recv
 * timeout on a socket that close is freeing); idle wake-ups for lost marks
 * come from our own timed wait instead. */
static void *io_main(void *arg)
{
	nng_comm *c = arg;
	struct timespec until;

	nng_recv_aio(c->pull, c->rx_aio);
	for (;;) {
		uint64_t start_ticket = atomic_load(&c->lost_tickets);
		nng_msg *msg;
		int rv;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += IO_POLL_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&c->rx_mu);
		while (!c->rx_done && !atomic_load(&c->stopping))
			if (pthread_cond_timedwait(&c->rx_cv, &c->rx_mu, &until) != 0)
				break;
		if (atomic_load(&c->stopping)) {
			pthread_mutex_unlock(&c->rx_mu);
			break;
		}
		if (!c->rx_done) { /* idle for IO_POLL_MS with a receive armed */
			pthread_mutex_unlock(&c->rx_mu);
			promote_lost(c, start_ticket, true);
			continue;
		}
		rv = c->rx_rv;
		msg = c->rx_msg;
		c->rx_done = false;
		c->rx_msg = NULL;
		pthread_mutex_unlock(&c->rx_mu);
		if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
			break;
		nng_recv_aio(c->pull, c->rx_aio); /* the next one arrives while we work */
		if (rv != 0) {
			pt_warn("rank %d: receive failed: %s", c->base.rank, nng_strerror(rv));
			continue;
		}
		io_handle(c, msg);
		promote_lost(c, start_ticket, false);
	}
	return NULL;
}

/* ------------------------------------------------------------- barrier -- */

static pt_err send_barrier(nng_comm *c, int dst, uint64_t gen)
{
	pt_msg m = {0};
	m.meta.kind = PT_MSG_BARRIER;
	m.meta.channel = PT_CH_CONTROL;
	m.meta.source = c->base.rank;
	m.meta.tag = (uint32_t)gen;
	return nng_comm_send(&c->base, dst, &m);
}

/* bar_wait_locked waits on bar_cv until done(c, gen) or the deadline; NULL
 * deadline is not used (barriers always have one). */
static pt_err bar_wait_locked(nng_comm *c, uint64_t gen, const struct timespec *deadline,
                              int timeout_ms)
{
	for (;;) {
		bool done = true;
		int lost = -1;

		if (c->base.rank == 0) {
			for (int r = 1; r < c->base.world; r++)
				if (c->bar_arrived[r] < gen) {
					done = false;
					if (pt_mailbox_is_lost(c->mb, r))
						lost = r;
				}
		} else {
			done = c->bar_released >= gen;
			if (!done && pt_mailbox_is_lost(c->mb, 0))
				lost = 0;
		}
		if (done)
			return PT_OK;
		if (atomic_load(&c->closed))
			return pt_set_error(
			    PT_ERR_CLOSED, "rank %d: communicator closed in barrier", c->base.rank);
		if (lost >= 0)
			return pt_set_error(PT_ERR_CLOSED,
			                    "rank %d: barrier abandoned, rank %d is gone",
			                    c->base.rank, lost);
		if (pthread_cond_timedwait(&c->bar_cv, &c->bar_mu, deadline) != 0) {
			atomic_fetch_add(&c->n.timeouts, 1);
			return pt_set_error(PT_ERR_TIMEOUT,
			                    "rank %d: barrier %llu not complete within %d ms",
			                    c->base.rank, (unsigned long long)gen, timeout_ms);
		}
	}
}

static pt_err nng_comm_barrier(pt_comm *base, int timeout_ms)
{
	nng_comm *c = (nng_comm *)base;
	struct timespec deadline;
	uint64_t gen;
	pt_err rv;

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	if (base->world == 1)
		return PT_OK;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += timeout_ms / 1000;
	deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->bar_mu);
	gen = ++c->bar_gen;
	pthread_mutex_unlock(&c->bar_mu);

	if (base->rank != 0)
		PT_TRY(send_barrier(c, 0, gen));
	pthread_mutex_lock(&c->bar_mu);
	rv = bar_wait_locked(c, gen, &deadline, timeout_ms);
	pthread_mutex_unlock(&c->bar_mu);
	if (rv != PT_OK || base->rank != 0)
		return rv;
	for (int r = 1; r < base->world; r++)
		PT_TRY(send_barrier(c, r, gen));
	return PT_OK;
}

/* ----------------------------------------------------- life and death -- */

static void nng_comm_close(pt_comm *base)
{
	nng_comm *c = (nng_comm *)base;

	if (atomic_exchange(&c->closed, true))
		return;
	pt_mailbox_close(c->mb);
	pthread_mutex_lock(&c->bar_mu);
	pthread_cond_broadcast(&c->bar_cv);
	pthread_mutex_unlock(&c->bar_mu);
}

static void nng_comm_destroy(pt_comm *base)
{
	nng_comm *c = (nng_comm *)base;

	if (c->mb)
		nng_comm_close(base);
	/* Stop the I/O thread, then its receive (waits for rx_cb), then close the
	 * sockets (which runs and waits for the last pipe callbacks). */
	pthread_mutex_lock(&c->rx_mu);
	atomic_store(&c->stopping, true);
	pthread_cond_signal(&c->rx_cv);
	pthread_mutex_unlock(&c->rx_mu);
	if (c->io_started)
		pthread_join(c->io, NULL);
	if (c->rx_aio) {
		nng_aio_stop(c->rx_aio);
		if (c->rx_msg)
			nng_msg_free(c->rx_msg);
		nng_aio_free(c->rx_aio);
	}
	if (c->pull_open)
		nng_close(c->pull);
	for (int r = 0; c->peers && r < base->world; r++) {
		nng_peer *p = &c->peers[r];
		if (p->open)
			nng_close(p->push);
		if (p->tls)
			nng_tls_config_free(p->tls);
		EVP_CIPHER_CTX_free(p->mac);
		pthread_mutex_destroy(&p->mu);
	}
	if (c->tls_server)
		nng_tls_config_free(c->tls_server);
	pt_mailbox_destroy(c->mb);
	pthread_mutex_destroy(&c->connect_mu);
	pthread_mutex_destroy(&c->pipe_mu);
	pthread_mutex_destroy(&c->bar_mu);
	pthread_cond_destroy(&c->bar_cv);
	pthread_mutex_destroy(&c->self_mu);
	pthread_mutex_destroy(&c->rx_mu);
	pthread_cond_destroy(&c->rx_cv);
	free(c->peers);
	free(c->pipes);
	free(c->lost_ticket);
	free(c->lost_ms);
	for (int r = 0; c->asm_of && r < base->world; r++)
		asm_drop(&c->asm_of[r]);
	free(c->asm_of);
	free(c->expect_seq);
	free(c->bar_arrived);
	free(c->bound_url);
	free(c->tls_cert_key);
	free(c->tls_key);
	free(c->tls_ca);
	EVP_CIPHER_CTX_free(c->rx_mac);
	free(c->rx_nh);
	EVP_CIPHER_free(c->aead);
	OPENSSL_cleanse(c->mac_key, sizeof(c->mac_key));
	OPENSSL_cleanse(c->nh_key, sizeof(c->nh_key));
	free(c->tls_server_name);
	free(c);
}

static pt_comm_stats nng_comm_stats(const pt_comm *base)
{
	return pt_comm_counters_get(&((const nng_comm *)base)->n);
}

static const pt_comm_ops nng_ops = {
    .name = "nng",
    .send = nng_comm_send,
    .recv = nng_comm_recv,
    .barrier = nng_comm_barrier,
    .close = nng_comm_close,
    .destroy = nng_comm_destroy,
    .stats = nng_comm_stats,
};

/* resolve_url returns url with a tcp port 0 replaced by the bound port. */
static pt_err resolve_url(nng_comm *c, const char *url)
{
	const char *colon = strrchr(url, ':');
	int port = 0, rv;

	if (is_tcp(url) && colon && strcmp(colon, ":0") == 0) {
		size_t n = (size_t)(colon - url);
		if ((rv = nng_listener_get_int(c->listener, NNG_OPT_TCP_BOUND_PORT, &port)) != 0)
			return nng_fail(rv, "%s: %s", "bound port");
		if ((c->bound_url = malloc(n + 16)) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "url");
		snprintf(c->bound_url, n + 16, "%.*s:%d", (int)n, url, port);
		return PT_OK;
	}
	if ((c->bound_url = strdup(url)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "url");
	return PT_OK;
}

static pt_err listen_tls(nng_comm *c)
{
	int rv;

	if (c->tls_cert_key == NULL)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "tls+tcp listener needs tls_cert_key_file (PEM with cert and key)");
	if ((rv = nng_tls_config_alloc(&c->tls_server, NNG_TLS_MODE_SERVER)) != 0)
		return nng_fail(rv, "%s: %s", "tls config");
	if (c->tls_key != NULL) {
		char *cert = NULL, *key = NULL;
		size_t n;
		pt_err e;
		if ((e = pt_file_read(c->tls_cert_key, 1 << 20, (void **)&cert, &n)) != PT_OK ||
		    (e = pt_file_read(c->tls_key, 1 << 20, (void **)&key, &n)) != PT_OK) {
			free(cert);
			return pt_set_error(e, "tls certificate/key: %s", pt_last_error());
		}
		rv = nng_tls_config_own_cert(c->tls_server, cert, key, NULL);
		free(cert);
		OPENSSL_cleanse(key, n);
		free(key);
	} else {
		rv = nng_tls_config_cert_key_file(c->tls_server, c->tls_cert_key, NULL);
	}
	if (rv != 0) {
		pt_set_error(PT_ERR_INVALID, "tls certificate/key file %s: %s", c->tls_cert_key,
		             nng_strerror(rv));
		return PT_ERR_INVALID;
	}
	if ((rv = nng_tls_config_auth_mode(c->tls_server, NNG_TLS_AUTH_MODE_NONE)) != 0 ||
	    (rv = nng_listener_set_ptr(c->listener, NNG_OPT_TLS_CONFIG, c->tls_server)) != 0)
		return nng_fail(rv, "%s: %s", "tls listener");
	return PT_OK;
}

pt_err pt_nng_comm_create(pt_comm **out, const pt_nng_options *opt)
{
	nng_comm *c;
	pthread_condattr_t ca;
	pt_err rv;
	int nrv;
	int world;

	if (out == NULL || opt == NULL || opt->listen_url == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_nng_comm_create: NULL argument");
	*out = NULL;
	world = opt->world;
	if (world <= 0 || world > 1 << 16 || opt->rank < 0 || opt->rank >= world)
		return pt_set_error(PT_ERR_RANGE, "nng rank %d in a world of %d", opt->rank, world);
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "nng communicator");
	c->base.ops = &nng_ops;
	c->base.rank = opt->rank;
	c->base.world = world;
	c->base.timeout_ms = opt->timeout_ms > 0 ? opt->timeout_ms : PT_COMM_TIMEOUT_DEFAULT_MS;
	c->send_timeout_ms = opt->send_timeout_ms > 0 ? opt->send_timeout_ms : c->base.timeout_ms;
	c->compress = opt->compress;
	c->max_msg = opt->max_msg_bytes ? opt->max_msg_bytes : DEFAULT_MAX_MSG;
	pthread_mutex_init(&c->connect_mu, NULL);
	pthread_mutex_init(&c->pipe_mu, NULL);
	pthread_mutex_init(&c->bar_mu, NULL);
	pthread_mutex_init(&c->self_mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->bar_cv, &ca);
	pthread_cond_init(&c->rx_cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&c->rx_mu, NULL);
	c->peers = calloc((size_t)world, sizeof(*c->peers));
	c->lost_ticket = calloc((size_t)world, sizeof(*c->lost_ticket));
	c->lost_ms = calloc((size_t)world, sizeof(*c->lost_ms));
	c->expect_seq = calloc((size_t)world, sizeof(*c->expect_seq));
	c->asm_of = calloc((size_t)world, sizeof(*c->asm_of));
	c->bar_arrived = calloc((size_t)world, sizeof(*c->bar_arrived));
	c->tls_cert_key = dup_or_null(opt->tls_cert_key_file);
	c->tls_key = dup_or_null(opt->tls_key_file);
	c->tls_ca = dup_or_null(opt->tls_ca_file);
	c->tls_server_name = dup_or_null(opt->tls_server_name);
	if (c->peers == NULL || c->lost_ticket == NULL || c->lost_ms == NULL ||
	    c->expect_seq == NULL || c->asm_of == NULL || c->bar_arrived == NULL ||
	    (opt->tls_cert_key_file && !c->tls_cert_key) || (opt->tls_key_file && !c->tls_key) ||
	    (opt->tls_ca_file && !c->tls_ca) || (opt->tls_server_name && !c->tls_server_name)) {
		rv = pt_set_error(PT_ERR_NOMEM, "nng communicator of %d ranks", world);
		goto fail;
	}
	for (int r = 0; r < world; r++) {
		c->peers[r].c = c;
		c->peers[r].rank = r;
		pthread_mutex_init(&c->peers[r].mu, NULL);
	}
	c->auth = !opt->no_auth;
	if (c->auth) {
		if (opt->key == NULL) {
			rv = pt_set_error(PT_ERR_INVALID,
			                  "nng communicator of rank %d: no session key (frames "
			                  "are authenticated unless no_auth is set)",
			                  opt->rank);
			goto fail;
		}
		if (!mac_keys(c, opt->key)) {
			rv = pt_set_error(PT_ERR_BACKEND, "libcrypto: cannot derive frame keys");
			goto fail;
		}
		if ((c->aead = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL)) == NULL ||
		    (c->rx_mac = mac_ctx_new(c)) == NULL) {
			rv = pt_set_error(PT_ERR_BACKEND, "libcrypto: no ChaCha20-Poly1305");
			goto fail;
		}
		if (getrandom(&c->mac_instance, sizeof(c->mac_instance), 0) !=
		    (ssize_t)sizeof(c->mac_instance)) {
			rv = pt_set_error(PT_ERR_IO, "getrandom: no nonce for rank %d", opt->rank);
			goto fail;
		}
	} else {
		pt_warn("rank %d: data-plane authentication is off (benchmarks only)", opt->rank);
	}
	if ((rv = pt_mailbox_create(&c->mb, world, opt->rank)) != PT_OK)
		goto fail;

	if ((nrv = nng_pull0_open(&c->pull)) != 0) {
		rv = nng_fail(nrv, "%s: %s", "nng_pull0_open");
		goto fail;
	}
	c->pull_open = true;
	if ((nrv = nng_socket_set_size(c->pull, NNG_OPT_RECVMAXSZ, c->max_msg)) != 0 ||
	    (nrv = nng_pipe_notify(c->pull, NNG_PIPE_EV_REM_POST, pull_pipe_cb, c)) != 0) {
		rv = nng_fail(nrv, "%s: %s", "pull socket options");
		goto fail;
	}
	if ((nrv = nng_listener_create(&c->listener, c->pull, opt->listen_url)) != 0) {
		char what[300];
		snprintf(what, sizeof(what), "listen on %s", opt->listen_url);
		rv = nng_fail(nrv, "%s: %s", what);
		goto fail;
	}
	if (nng_listener_set_size(c->listener, NNG_OPT_RECVMAXSZ, c->max_msg) != 0)
		pt_debug("listener of %s takes the socket's receive cap", opt->listen_url);
	if (is_tls(opt->listen_url) && (rv = listen_tls(c)) != PT_OK)
		goto fail;
	if ((nrv = nng_listener_start(c->listener, 0)) != 0) {
		char what[300];
		snprintf(what, sizeof(what), "listen on %s", opt->listen_url);
		rv = nng_fail(nrv, "%s: %s", what);
		goto fail;
	}
	if ((rv = resolve_url(c, opt->listen_url)) != PT_OK)
		goto fail;
	if ((nrv = nng_aio_alloc(&c->rx_aio, rx_cb, c)) != 0) {
		rv = nng_fail(nrv, "%s: %s", "nng_aio_alloc");
		goto fail;
	}
	nng_aio_set_timeout(c->rx_aio, NNG_DURATION_INFINITE);
	if (pthread_create(&c->io, NULL, io_main, c) != 0) {
		rv = pt_set_error(PT_ERR_BACKEND, "cannot start the nng I/O thread");
		goto fail;
	}
	c->io_started = true;
	*out = &c->base;
	return PT_OK;
fail:
	nng_comm_destroy(&c->base);
	return rv;
}

const char *pt_nng_comm_url(const pt_comm *base)
{
	if (base == NULL || base->ops != &nng_ops)
		return NULL;
	return ((const nng_comm *)base)->bound_url;
}

static pt_err dial_peer(nng_comm *c, nng_peer *p, const char *url)
{
	char what[300];
	int rv;

	snprintf(what, sizeof(what), "rank %d dialing rank %d at %s", c->base.rank, p->rank, url);
	if (c->auth && (p->mac = mac_ctx_new(c)) == NULL)
		return pt_set_error(PT_ERR_BACKEND, "%s: libcrypto: no ChaCha20-Poly1305", what);
	if ((rv = nng_push0_open(&p->push)) != 0)
		return nng_fail(rv, "%s: %s", what);
	p->open = true;
	if ((rv = nng_socket_set_ms(p->push, NNG_OPT_SENDTIMEO, c->send_timeout_ms)) != 0 ||
	    (rv = nng_socket_set_ms(p->push, NNG_OPT_RECONNMINT, RECONNECT_MIN_MS)) != 0 ||
	    (rv = nng_socket_set_ms(p->push, NNG_OPT_RECONNMAXT, RECONNECT_MAX_MS)) != 0 ||
	    (rv = nng_pipe_notify(p->push, NNG_PIPE_EV_REM_POST, push_pipe_cb, p)) != 0 ||
	    (rv = nng_pipe_notify(p->push, NNG_PIPE_EV_ADD_POST, push_pipe_cb, p)) != 0 ||
	    (rv = nng_dialer_create(&p->dialer, p->push, url)) != 0)
		return nng_fail(rv, "%s: %s", what);
	if (is_tls(url)) {
		char host[256];
		if (c->tls_ca == NULL)
			return pt_set_error(PT_ERR_INVALID, "%s: tls+tcp needs tls_ca_file", what);
		url_host(url, host, sizeof(host));
		if ((rv = nng_tls_config_alloc(&p->tls, NNG_TLS_MODE_CLIENT)) != 0 ||
		    (rv = nng_tls_config_ca_file(p->tls, c->tls_ca)) != 0 ||
		    (rv = nng_tls_config_auth_mode(p->tls, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
		    (rv = nng_tls_config_server_name(p->tls, c->tls_server_name ? c->tls_server_name
		                                                                : host)) != 0 ||
		    (rv = nng_dialer_set_ptr(p->dialer, NNG_OPT_TLS_CONFIG, p->tls)) != 0)
			return nng_fail(rv, "%s: tls: %s", what);
	}
	/* Non-blocking: the dialer retries in the background until the peer is up. */
	if ((rv = nng_dialer_start(p->dialer, NNG_FLAG_NONBLOCK)) != 0)
		return nng_fail(rv, "%s: %s", what);
	return PT_OK;
}

pt_err pt_nng_comm_connect(pt_comm *base, const char *const *urls)
{
	nng_comm *c = (nng_comm *)base;
	pt_err rv = PT_OK;

	if (base == NULL || urls == NULL || base->ops != &nng_ops)
		return pt_set_error(PT_ERR_INVALID, "pt_nng_comm_connect: not an nng communicator");
	for (int r = 0; r < base->world; r++)
		if (r != base->rank && urls[r] == NULL)
			return pt_set_error(PT_ERR_INVALID, "no URL for rank %d", r);
	pthread_mutex_lock(&c->connect_mu);
	if (c->connect_tried) {
		pthread_mutex_unlock(&c->connect_mu);
		return pt_set_error(PT_ERR_STATE, "rank %d is already connected", base->rank);
	}
	c->connect_tried = true;
	for (int r = 0; r < base->world && rv == PT_OK; r++)
		if (r != base->rank)
			rv = dial_peer(c, &c->peers[r], urls[r]);
	if (rv == PT_OK)
		atomic_store(&c->connected, true);
	pthread_mutex_unlock(&c->connect_mu);
	return rv;
}

pt_err pt_nng_comm_mark_lost(pt_comm *base, int rank)
{
	nng_comm *c = (nng_comm *)base;

	if (base == NULL || base->ops != &nng_ops)
		return pt_set_error(PT_ERR_INVALID, "not an nng communicator");
	if (rank < 0 || rank >= base->world || rank == base->rank)
		return pt_set_error(PT_ERR_RANGE, "mark_lost of rank %d", rank);
	pt_mailbox_mark_lost(c->mb, rank);
	pthread_mutex_lock(&c->bar_mu);
	pthread_cond_broadcast(&c->bar_cv);
	pthread_mutex_unlock(&c->bar_mu);
	return PT_OK;
}
