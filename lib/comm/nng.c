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
 * On tcp:// a rank's frames to a peer take the peer's bulk lane instead, a
 * TCP connection beside the PULL socket: the same frames, written from and read
 * into the tensors' own memory (see "bulk lane" below). Received tensors of
 * 64 KiB and more borrow their bytes from a small pool (rxpool.h).
 *
 * Limits: destroy drops messages nng has not transmitted yet (nng 1.5 has no
 * linger); a received tensor caps at max_msg_bytes, also on the decompressed
 * size, and a single nng message at one fragment and its header
 * (MSG_RECV_MAX); only contiguous tensors go on the wire (strided ones are
 * packed first).
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
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <time.h>

#include "comm.h"
#include "fb.h"
#include "fb_schema.h"
#include "fileio.h"
#include "log.h"
#include "mailbox.h"
#include "nh.h"
#include "rxpool.h"

#define FRAME_ID           PT_FB_STAGE_FILE_ID
#define PAYLOAD_ALIGN      64u
#define DEFAULT_MAX_MSG    ((size_t)1 << 30 | (size_t)64 << 10)
#define IO_POLL_MS         100  /* I/O thread wake-up when idle (lost marks, stop) */
#define LOST_GRACE_MS      1000 /* a lost mark waits at most this for queued arrivals */
#define RECONNECT_MIN_MS   20
#define RECONNECT_MAX_MS   500
#define NO_REDIAL_MS       (24 * 3600 * 1000) /* a lost peer's next dial: out of reach */
#define HUGE_ALLOC_BYTES   PT_RX_HUGE_BYTES
#define HUGE_PAGE_BYTES    ((size_t)2 << 20)
#define COMPRESS_MIN_BYTES 256 /* smaller tensors are not worth an lz4 attempt */
/* Tensors above FRAG_BYTES travel as fragments of FRAG_BYTES, one nng message
 * each: buffers stay below glibc's mmap threshold (32 MiB) and are reused
 * instead of page-faulted in afresh, the receiver copies fragment k while k+1
 * is on the wire, and no side holds a second whole copy of a huge tensor. */
#define FRAG_BYTES ((size_t)8 << 20)
/* Connections a PULL socket takes beyond one from each peer (reconnects
 * whose old pipe is not gone yet), and, apart from those, connections from
 * strangers (addresses that are no peer's); more are refused as they arrive,
 * before they cost more than a descriptor for a moment. */
#define PULL_EXTRA 16
/* The largest nng message a peer sends: one fragment (lz4's bound over it),
 * its header and blob (control payloads, well under 4 MiB) and the MAC
 * trailer. The receive cap: a stranger that announces a bigger message is
 * cut off when its length arrives, before any of it is held (max_msg bounds
 * a whole tensor, which arrives in fragments). */
#define MSG_RECV_MAX (FRAG_BYTES + FRAG_BYTES / 255 + 16 + ((size_t)4 << 20))
#define MAC_MAGIC    "PTMC"
#define MAC_TAG      16
#define MAC_NONCE    12
#define MAC_TRAILER  (4 + MAC_NONCE + MAC_TAG)
#define MAC_WARN_MS  1000 /* rejected frames are logged at most this often */
/* Received tensors of at least this many bytes are authenticated while their
 * payload is copied out (rx_verify_copy); smaller ones are hashed, then
 * copied. */
#define FUSE_MIN_BYTES ((size_t)16 << 10)
/* The bulk lane (see "bulk lane" below). */
#define BULK_HELLO_MS   5000              /* a lane's whole handshake, each side */
#define BULK_EXTRA      8                 /* connections admitted beyond one per peer */
#define BULK_PIECE      ((size_t)1 << 20) /* payload received and hashed this much at a time */
#define BULK_CHALLENGE  16
#define BULK_PREFIX     16 /* "PTBR", le32 header bytes, le64 payload bytes */
#define BULK_HELLO      (4 + 4 + 4 + BULK_CHALLENGE) /* and a MAC trailer */
#define BULK_URL_SUFFIX "#bulk="

/* TensorFrame field ids and descriptor: fb_schema.h, from schema/stage.fbs. */
#define F(field) PT_FB_STAGE_TENSOR_FRAME_##field

enum { CODEC_NONE = 0, CODEC_LZ4 = 1 };

_Static_assert(PT_DTYPE_COUNT == 9, "schema DType lists every pt_dtype");
_Static_assert(PT_MSG_KIND_COUNT == 9, "schema MsgKind lists every pt_msg_kind");

struct nng_comm;

typedef struct nng_peer {
	struct nng_comm *c;
	int rank;
	bool open;         /* push and dialer exist */
	bool dial_stopped; /* the dialer was closed (the rank is lost; I/O thread) */
	nng_socket push;
	nng_dialer dialer;
	nng_tls_config *tls;
	pthread_mutex_t mu;  /* orders seq assignment with nng_sendmsg */
	EVP_CIPHER_CTX *mac; /* the session key set; under mu */
	uint64_t next_seq;
	uint64_t skip;        /* test hook: added to the next seq */
	atomic_uint connects; /* pipes the dialer made */
	/* Bulk lane to this peer, all under mu. */
	char *bulk_url;    /* NULL: the peer has none (or it is not used) */
	int lane;          /* LANE_*: decided by the first send, then fixed */
	int bulk_fd;       /* the lane's socket; -1: none, or it broke */
	uint8_t *bulk_hdr; /* prefix and header of the record being sent */
	size_t bulk_hdr_cap;
} nng_peer;

enum { LANE_UNDECIDED = 0, LANE_MSG, LANE_BULK };

/* An IP address (4 or 16 bytes; IPv4-mapped IPv6 stored as IPv4). */
typedef struct ip_addr {
	int len; /* 0: none (not an IP connection) */
	uint8_t b[16];
} ip_addr;

/* One open PULL connection: its pipe id, address, and whether it counts as
 * a stranger's. */
typedef struct open_pipe {
	uint32_t id;
	ip_addr ip;
	bool stranger;
} open_pipe;

/* One accepted bulk connection (receiving side), served by its own thread. */
typedef struct bulk_conn {
	struct nng_comm *c;
	int fd;
	pthread_t th;
	atomic_int state; /* BC_FREE, BC_RUNNING, BC_DONE (thread finished, to join) */
	bool stranger;    /* from an address none of the peers' URLs names */
} bulk_conn;

enum { BC_FREE = 0, BC_RUNNING, BC_DONE };

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
	long long mac_warned_ms;          /* under io_mu */
	uint64_t mac_rejected;            /* under io_mu: since the last warning */

	bool pull_open;
	nng_socket pull;
	nng_listener listener;
	nng_tls_config *tls_server;

	nng_peer *peers; /* [world]; peers[rank] unused */
	pthread_mutex_t connect_mu;
	bool connect_tried; /* under connect_mu */
	atomic_bool connected;

	pt_mailbox *mb;
	pt_rx_pool *pool; /* received tensors' buffers */
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
	/* The PULL socket's open connections (under pipe_mu): at most
	 * world - 1 + PULL_EXTRA from peers' addresses (or any address before
	 * connect names the peers) and PULL_EXTRA from strangers' (see
	 * pull_admit); more are refused as they arrive. */
	open_pipe *open;
	int n_open, n_strangers, cap_open;
	/* The peers' IP addresses, from connect's URLs (under pipe_mu). */
	ip_addr *peer_ips;
	int n_peer_ips;
	bool peers_known;
	atomic_long n_refused;

	/* Lost-pending marks: ticket (from lost_tickets, 0 = none) and time. */
	atomic_uint_fast64_t lost_tickets;
	atomic_uint_fast64_t *lost_ticket; /* [world] */
	_Atomic long long *lost_ms;        /* [world] */

	/* expect_seq, asm_of and the mac_warned_ms/mac_rejected pair are the
	 * I/O thread's and the bulk readers': under io_mu. */
	pthread_mutex_t io_mu;
	uint64_t *expect_seq;    /* [world] */
	struct assembly *asm_of; /* [world]: fragments so far */

	/* Bulk lane, receiving side (bulk_port 0: none). */
	bool no_bulk;
	int bulk_port;
	char *url;    /* bound_url, and the bulk port when there is one: what peers dial */
	int bulk_lfd; /* listening socket, -1: none */
	pthread_t bulk_acceptor;
	bool bulk_started;
	pthread_mutex_t bulk_mu;
	bulk_conn *bulk_conns; /* [n_bulk_conns], under bulk_mu */
	int n_bulk_conns;
	bool *bulk_claimed; /* [world] under bulk_mu: a lane from this rank was accepted */

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

/* ip_of makes an ip_addr of a 4-byte IPv4 or 16-byte IPv6 address (an
 * IPv4-mapped IPv6 one as its IPv4 address). */
static ip_addr ip_of(const uint8_t *b, bool v6)
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	ip_addr a = {0};

	if (v6 && memcmp(b, mapped, 12) == 0)
		b += 12, v6 = false;
	a.len = v6 ? 16 : 4;
	memcpy(a.b, b, (size_t)a.len);
	return a;
}

/* pipe_ip reads the remote IP address of pipe p (len 0: none, as on ipc). */
static ip_addr pipe_ip(nng_pipe p)
{
	ip_addr none = {0};
	nng_sockaddr sa;

	if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
		return none;
	if (sa.s_family == NNG_AF_INET)
		return ip_of((const uint8_t *)&sa.s_in.sa_addr, false);
	if (sa.s_family == NNG_AF_INET6)
		return ip_of(sa.s_in6.sa_addr, true);
	return none;
}

/* is_stranger: ip is known, the peers' addresses are, and it is none of
 * them (pipe_mu held). */
static bool is_stranger(const nng_comm *c, const ip_addr *ip)
{
	if (ip->len == 0 || !c->peers_known)
		return false;
	for (int i = 0; i < c->n_peer_ips; i++)
		if (c->peer_ips[i].len == ip->len && memcmp(c->peer_ips[i].b, ip->b, ip->len) == 0)
			return false;
	return true;
}

/* pull_admit counts a new PULL connection, or refuses it (closing it in
 * ADD_PRE): a stranger's when PULL_EXTRA strangers are connected, any other
 * when world - 1 + PULL_EXTRA others are. Strangers cannot take the process's
 * descriptors, nor, once connect has named the peers, a peer's place: a flood
 * from other hosts never refuses a peer (one on a peer's own host still can). */
static void pull_admit(nng_comm *c, nng_pipe p)
{
	open_pipe o = {(uint32_t)nng_pipe_id(p), pipe_ip(p), false};
	bool refuse;

	pthread_mutex_lock(&c->pipe_mu);
	o.stranger = is_stranger(c, &o.ip);
	refuse = o.stranger ? c->n_strangers >= PULL_EXTRA
	                    : c->n_open - c->n_strangers >= c->base.world - 1 + PULL_EXTRA;
	if (!refuse && c->n_open < c->cap_open) {
		c->open[c->n_open++] = o;
		c->n_strangers += o.stranger;
	} else {
		refuse = true;
	}
	pthread_mutex_unlock(&c->pipe_mu);
	if (refuse) {
		atomic_fetch_add(&c->n_refused, 1);
		nng_pipe_close(p);
	}
}

/* pull_forget uncounts a PULL connection that has gone. */
static void pull_forget(nng_comm *c, nng_pipe p)
{
	uint32_t id = (uint32_t)nng_pipe_id(p);
	pthread_mutex_lock(&c->pipe_mu);
	for (int i = 0; i < c->n_open; i++)
		if (c->open[i].id == id) {
			c->n_strangers -= c->open[i].stranger;
			c->open[i] = c->open[--c->n_open];
			break;
		}
	pthread_mutex_unlock(&c->pipe_mu);
}

/* learn_peer_ips records the IP addresses of the peers' URLs (host names
 * resolved) and reclassifies the connections already open: those that came
 * from elsewhere before the peers were known now count as strangers. A host
 * that does not resolve names no address: its connections count as
 * strangers'. */
static void learn_peer_ips(nng_comm *c, const char *const *urls)
{
	ip_addr *ips = NULL;
	int n = 0, cap = 0;

	for (int r = 0; r < c->base.world; r++) {
		struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
		char host[256];
		if (r == c->base.rank || !is_tcp(urls[r]))
			continue;
		url_host(urls[r], host, sizeof(host));
		if (getaddrinfo(host, NULL, &hints, &res) != 0)
			continue;
		for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
			const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ai->ai_addr;
			const struct sockaddr_in *a4 = (const struct sockaddr_in *)ai->ai_addr;
			bool v6 = ai->ai_family == AF_INET6;
			ip_addr *g;
			if (ai->ai_family != AF_INET && !v6)
				continue;
			if (n == cap) {
				int grown = cap ? 2 * cap : 8;
				if ((g = realloc(ips, (size_t)grown * sizeof(*g))) == NULL)
					break; /* fewer addresses: those peers count as strangers */
				ips = g;
				cap = grown;
			}
			ips[n++] =
			    ip_of(v6 ? a6->sin6_addr.s6_addr : (const uint8_t *)&a4->sin_addr, v6);
		}
		freeaddrinfo(res);
	}
	pthread_mutex_lock(&c->pipe_mu);
	free(c->peer_ips);
	c->peer_ips = ips;
	c->n_peer_ips = n;
	c->peers_known = true;
	c->n_strangers = 0;
	for (int i = 0; i < c->n_open; i++)
		c->n_strangers += c->open[i].stranger = is_stranger(c, &c->open[i].ip);
	pthread_mutex_unlock(&c->pipe_mu);
}

/* Pipe callbacks run on nng threads: they only take short locks. */
static void pull_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	nng_comm *c = arg;
	int rank;

	if (ev == NNG_PIPE_EV_ADD_PRE) {
		pull_admit(c, p);
		return;
	}
	if (ev != NNG_PIPE_EV_REM_POST)
		return;
	pull_forget(c, p);
	if (atomic_load(&c->stopping))
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
	if (ev == NNG_PIPE_EV_REM_POST && !atomic_load(&peer->c->stopping)) {
		/* The loss is final, so redialing only hammers a port that may
		 * refuse us (every 20 ms), and nng 1.5.2's dialer can panic on a
		 * refused connection. nng arms the redial after this callback:
		 * put it out of reach now; the I/O thread closes the dialer. */
		nng_dialer_set_ms(peer->dialer, NNG_OPT_RECONNMAXT, NO_REDIAL_MS);
		nng_dialer_set_ms(peer->dialer, NNG_OPT_RECONNMINT, NO_REDIAL_MS);
		mark_lost_pending(peer->c, peer->rank);
	}
}

/* stop_lost_dialers closes the dialers of ranks marked lost (I/O thread). */
static void stop_lost_dialers(nng_comm *c)
{
	if (!atomic_load(&c->connected))
		return;
	for (int r = 0; r < c->base.world; r++) {
		nng_peer *p = &c->peers[r];
		if (r != c->base.rank && p->open && !p->dial_stopped &&
		    atomic_load(&c->lost_ticket[r]) != 0) {
			nng_dialer_close(p->dialer);
			p->dial_stopped = true;
		}
	}
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

/* A frame as pieces in memory (the bulk lane sends the header, the tensor's
 * own bytes and the trailer without joining them): the frame is their
 * concatenation; the last piece is the MAC trailer. */
typedef struct piece {
	const uint8_t *p;
	size_t n;
} piece;

/* gather copies k bytes from byte `off` of the pieces' concatenation to dst. */
static void gather(const piece *pcs, int np, size_t off, uint8_t *dst, size_t k)
{
	size_t base = 0, got = 0;

	for (int i = 0; i < np && got < k; i++) {
		size_t end = base + pcs[i].n;
		if (off + got < end) {
			size_t t = end - (off + got);
			if (t > k - got)
				t = k - got;
			memcpy(dst + got, pcs[i].p + (off + got - base), t);
			got += t;
		}
		base = end;
	}
}

/* nh_pieces hashes bytes [off, off + len) of the pieces' concatenation (off a
 * chunk boundary; len whole chunks unless the span ends the frame) into out:
 * runs of chunks inside one piece straight from it, a chunk that spans two
 * pieces gathered first. */
static void nh_pieces(const nng_comm *c, const piece *pcs, int np, size_t off, size_t len,
                      uint8_t *out)
{
	uint8_t tmp[PT_NH_CHUNK];
	size_t base = 0;
	int i = 0;

	while (len > 0) {
		size_t avail, k;
		while (off >= base + pcs[i].n) {
			base += pcs[i].n;
			i++;
		}
		avail = base + pcs[i].n - off;
		k = avail >= len ? len : avail - avail % PT_NH_CHUNK;
		if (k > 0) {
			pt_nh(c->nh_key, pcs[i].p + (off - base), k, out);
		} else {
			k = len < PT_NH_CHUNK ? len : PT_NH_CHUNK;
			gather(pcs, np, off, tmp, k);
			pt_nh(c->nh_key, tmp, k, out);
		}
		out += pt_nh_outputs(k);
		off += k;
		len -= k;
	}
}

/* mac_tag_pieces computes the tag of a frame held as pieces, the last of
 * which is its MAC_TRAILER-byte trailer (the tag's own 16 bytes excluded), to
 * rank dst: ChaCha20-Poly1305 with the trailer's nonce over NH(frame),
 * le64(length) and le32(dst), all associated data. pre (may be NULL)
 * supplies the NH outputs of some chunks. */
static bool mac_tag_pieces(nng_comm *c, EVP_CIPHER_CTX *x, const piece *pcs, int np, int dst,
                           const nh_pre *pre, uint8_t tag[MAC_TAG])
{
	enum { SPAN = 256 };
	size_t total = 0;
	const nh_pre none = {NULL, 0, 0};
	uint8_t h[SPAN * PT_NH_OUT], tail[12], out[16];
	int ol;

	for (int i = 0; i < np; i++)
		total += pcs[i].n;
	const size_t n = total - MAC_TAG, chunks = (n + PT_NH_CHUNK - 1) / PT_NH_CHUNK;
	if (pre == NULL || pre->c1 <= pre->c0 || pre->c1 > chunks)
		pre = &none;
	if (EVP_EncryptInit_ex2(x, NULL, NULL, pcs[np - 1].p + 4, NULL) != 1)
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
			nh_pieces(c, pcs, np, off, k, h);
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

/* mac_tag is mac_tag_pieces of a frame in one buffer, body[0..len) with len
 * at least MAC_TRAILER. */
static bool mac_tag(nng_comm *c, EVP_CIPHER_CTX *x, const uint8_t *body, size_t len, int dst,
                    const nh_pre *pre, uint8_t tag[MAC_TAG])
{
	const piece pcs[2] = {{body, len - MAC_TRAILER}, {body + len - MAC_TRAILER, MAC_TRAILER}};
	return mac_tag_pieces(c, x, pcs, 2, dst, pre, tag);
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

/* out_prepare readies m for sending, as fragments or (bulk) one record. */
static size_t recv_cap(const nng_comm *c)
{
	return c->max_msg < MSG_RECV_MAX ? c->max_msg : MSG_RECV_MAX;
}

static pt_err out_prepare(nng_comm *c, const pt_msg *m, bool bulk, out_msg *o)
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
		if (o->raw > FRAG_BYTES && !bulk)
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
		if (c->auth && o->raw >= (bulk ? 1 : 2) * PT_NH_CHUNK) {
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
		PT_TRY(pt_rx_pool_storage(c->pool, raw, &s));
		data = s->data;
		if ((rv = pt_tensor_read(&m->tensor, data, raw)) != PT_OK) {
			pt_storage_release(s);
			return rv;
		}
		rv = pt_tensor_init_on(&copy.tensor, s, 0, m->tensor.dtype, m->tensor.ndim,
		                       m->tensor.shape);
		pt_storage_release(s);
		if (rv != PT_OK)
			return rv;
		copy.has_tensor = true;
		copy.writable = true;
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

static bool bulk_lane(nng_comm *c, nng_peer *peer);
static pt_err bulk_send(nng_comm *c, nng_peer *peer, out_msg *o);

/* send_error sets and returns the error of a send to peer that nng failed
 * with nrv. */
static pt_err send_error(nng_comm *c, const nng_peer *peer, int nrv)
{
	char what[96];
	pt_err rv;

	snprintf(what, sizeof(what), "rank %d: send to rank %d", c->base.rank, peer->rank);
	rv = nng_fail(nrv, "%s: %s", what);
	if (rv == PT_ERR_TIMEOUT)
		pt_set_error(rv, "%s: not accepted within %d ms (peer down?): %s", what,
		             c->send_timeout_ms, nng_strerror(nrv));
	return rv;
}

/* sent moves peer's sequence past a frame of len bytes (raw_bytes before
 * compression) and counts it (peer->mu held). */
static void sent(nng_comm *c, nng_peer *peer, size_t len, uint64_t raw_bytes)
{
	peer->next_seq += peer->skip + 1;
	peer->skip = 0;
	atomic_fetch_add(&c->n.bytes_sent, len);
	atomic_fetch_add(&c->n.bytes_raw_sent, raw_bytes);
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
		nng_msg_free(msg);
		return send_error(c, peer, nrv);
	}
	sent(c, peer, len, raw_bytes);
	return PT_OK;
}

static pt_err nng_comm_send(pt_comm *base, int dst, const pt_msg *m)
{
	nng_comm *c = (nng_comm *)base;
	nng_peer *peer;
	nng_msg *msg = NULL;
	uint64_t raw_bytes = 0;
	out_msg o;
	bool bulk;
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
	bulk = bulk_lane(c, peer);
	if ((rv = out_prepare(c, m, bulk, &o)) != PT_OK)
		goto done;
	if (bulk) {
		/* The payload's NH outside the lock (it does not depend on the
		 * sequence number), as build_frag's copy is. */
		if (o.nh != NULL)
			pt_nh(c->nh_key, o.src, o.raw - o.raw % PT_NH_CHUNK, o.nh);
		pthread_mutex_lock(&peer->mu);
		rv = bulk_send(c, peer, &o);
		pthread_mutex_unlock(&peer->mu);
	} else if (o.nfrags == 1) {
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

int pt_nng_comm_lane(pt_comm *base, int dst)
{
	nng_comm *c = (nng_comm *)base;
	int lane;

	if (base == NULL || base->ops != &nng_ops || dst < 0 || dst >= base->world ||
	    dst == base->rank)
		return -1;
	pthread_mutex_lock(&c->peers[dst].mu);
	lane = c->peers[dst].lane;
	pthread_mutex_unlock(&c->peers[dst].mu);
	return lane;
}

pt_err pt_nng_comm_data_port(pt_comm *base, int *open, int *strangers, long *refused)
{
	nng_comm *c = (nng_comm *)base;

	if (base == NULL || base->ops != &nng_ops)
		return pt_set_error(PT_ERR_INVALID, "not an nng communicator");
	pthread_mutex_lock(&c->pipe_mu);
	if (open)
		*open = c->n_open;
	if (strangers)
		*strangers = c->n_strangers;
	pthread_mutex_unlock(&c->pipe_mu);
	if (refused)
		*refused = atomic_load(&c->n_refused);
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
	if (rv == PT_ERR_TIMEOUT && pt_comm_timeout_counts(timeout_ms))
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

/* frame_parse verifies the header of a len-byte frame at body, of which the
 * first `have` bytes are in memory (len for a message; the header alone on
 * the bulk lane), and fills f; errors name what is wrong. */
static pt_err frame_parse(nng_comm *c, const uint8_t *body, size_t len, size_t have, frame *f)
{
	const uint8_t *t, *vec;
	uint32_t n;
	size_t vsize = have < PT_FB_MAX_SIZE ? have : PT_FB_MAX_SIZE;
	uint8_t kind, channel;
	uint64_t numel = 1, esize;

	memset(f, 0, sizeof(*f));
	if (have < 12)
		return pt_set_error(PT_ERR_FORMAT, "message of %zu bytes is too short", have);
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
static pt_err start_msg(nng_comm *c, const frame *f, pt_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->meta = f->meta;
	if (f->has_tensor) {
		size_t raw = (size_t)f->raw_size;
		pt_storage *s;
		pt_err rv;

		PT_TRY(pt_rx_pool_storage(c->pool, raw, &s));
		rv = pt_tensor_init_on(&m->tensor, s, 0, (pt_dtype)f->dtype, f->ndim, f->shape);
		pt_storage_release(s);
		if (rv != PT_OK)
			return rv;
		m->has_tensor = true;
		m->writable = true;
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
static pt_err frame_to_msg(nng_comm *c, const frame *f, const uint8_t *body, pt_msg *m)
{
	pt_err rv;

	PT_TRY(start_msg(c, f, m));
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
		PT_TRY(start_msg(c, f, &a->msg));
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
	if (frame_parse(c, body, len - MAC_TRAILER, len - MAC_TRAILER, f) != PT_OK ||
	    f->meta.kind == PT_MSG_BARRIER || f->frag_count != 1 || !f->has_tensor ||
	    f->codec != CODEC_NONE || f->frag_size < FUSE_MIN_BYTES)
		return 0;
	need = pt_nh_outputs((size_t)f->frag_size);
	if (need > c->rx_nh_cap) {
		uint8_t *p = realloc(c->rx_nh, need);
		if (p == NULL)
			return 0;
		c->rx_nh = p;
		c->rx_nh_cap = need;
	}
	if (start_msg(c, f, m) != PT_OK)
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
		if ((copy = pt_rx_alloc(len)) == NULL) {
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
	if (!have && (rv = frame_parse(c, body, len, len, &f)) != PT_OK) {
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
			rv = frame_to_msg(c, &f, body, &m);
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
			stop_lost_dialers(c);
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
		pthread_mutex_lock(&c->io_mu);
		io_handle(c, msg);
		pthread_mutex_unlock(&c->io_mu);
		promote_lost(c, start_ticket, false);
		stop_lost_dialers(c);
	}
	return NULL;
}

/* ----------------------------------------------------------- bulk lane -- */

/* The bulk lane carries a rank's frames to one peer over a TCP connection of
 * its own (tcp:// only) instead of PUSH/PULL messages: the sender writes the
 * tensor's own bytes and the receiver reads them straight into the tensor it
 * hands over, so neither side copies the payload or allocates a message for
 * it (nng_msg_alloc zeroes every body; the message path's floor on loopback
 * is about 0.65 of a plain socket). The lane is plain blocking sockets on
 * the sender's thread and one reader thread per lane: an nng_stream reached
 * the plain socket's speed too, but sent every read and write through nng's
 * task threads, which we saw wedge in pthread_cond_signal under thousands
 * of small records.
 *
 * Every rank with a tcp:// URL also listens with a stream listener on the
 * same host; its port is published in the rank's URL as "#bulk=PORT", which
 * peers strip before dialing the PULL socket. The first send to a peer
 * decides its lane for good: the sender dials the peer's bulk port, reads a
 * 16-byte random challenge, answers with a hello (source, destination, the
 * challenge, and a MAC trailer as frames have) and waits for "PTBA". Any
 * failure, or no bulk port, or lz4 compression on, and every frame to that
 * peer goes as messages instead. Since a peer's frames all take one lane,
 * their order and sequence numbers are those of the message path.
 *
 * A record is BULK_PREFIX bytes ("PTBR", le32 H, le64 P), then H bytes of
 * TensorFrame header zero-padded to a whole NH chunk, P payload bytes and the
 * trailer: the same frame, tag and checks as a message whose payload starts
 * at offset H. The receiver reads a record's payload into a fresh tensor in
 * BULK_PIECE steps, hashing each step while it is in cache, and delivers it
 * only once the tag is right.
 *
 * Limits. Connections are admitted against world - 1 + BULK_EXTRA threads
 * (BULK_EXTRA more for strangers: addresses none of the peers' URLs names); one
 * that has not passed its hello within BULK_HELLO_MS is closed, and one lane
 * per source rank is ever accepted (the challenge makes a recorded hello
 * useless). A record from a lane is trusted for its size before its tag is
 * checked, bounded by max_msg_bytes as messages are. A lane that breaks, or
 * carries a record that fails its checks, is closed, and its source is then
 * lost to this communicator as when its PUSH connection drops: a stream has
 * no message boundaries to resynchronise at. Sends on the lane are
 * synchronous (zero copy: the caller's tensor is on the wire until the send
 * returns); stages send from their send streams. */

static uint32_t load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t load_le64(const uint8_t *p)
{
	return (uint64_t)load_le32(p) | (uint64_t)load_le32(p + 4) << 32;
}

static void bulk_timeouts(int fd, int ms);

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* bulk_io_until moves every byte of iov[0..n) over fd (sent, or received
 * into it); fd's send and receive timeouts bound each system call and, when
 * deadline (CLOCK_MONOTONIC ms) is not 0, all of them together: a peer that
 * trickles a byte at a time cannot hold a handshake past it. Returns 0 or an
 * nng error: NNG_ETIMEDOUT, NNG_ECONNSHUT (the stream ended),
 * NNG_ECONNRESET, or NNG_ESYSERR with the errno. */
static int bulk_io_until(int fd, struct iovec *iov, int n, bool send, long long deadline)
{
	for (;;) {
		ssize_t k;
		while (n > 0 && iov[0].iov_len == 0) {
			iov++;
			n--;
		}
		if (n == 0)
			return 0;
		if (deadline != 0) {
			long long left = deadline - mono_ms();
			if (left <= 0)
				return NNG_ETIMEDOUT;
			bulk_timeouts(fd, (int)left);
		}
		if (send) {
			struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
			k = sendmsg(fd, &mh, MSG_NOSIGNAL);
		} else {
			k = readv(fd, iov, n);
		}
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return NNG_ETIMEDOUT;
			if (errno == EPIPE || errno == ECONNRESET)
				return NNG_ECONNRESET;
			return (int)(NNG_ESYSERR | (unsigned)errno);
		}
		if (k == 0)
			return NNG_ECONNSHUT;
		for (size_t left = (size_t)k; left > 0;) {
			size_t t = left < iov[0].iov_len ? left : iov[0].iov_len;
			iov[0].iov_base = (uint8_t *)iov[0].iov_base + t;
			iov[0].iov_len -= t;
			left -= t;
			if (iov[0].iov_len == 0) {
				iov++;
				n--;
			}
		}
	}
}

static int bulk_io(int fd, struct iovec *iov, int n, bool send)
{
	return bulk_io_until(fd, iov, n, send, 0);
}

/* bulk_timeouts bounds each send and receive on fd by ms (<= 0: none). */
static void bulk_timeouts(int fd, int ms)
{
	struct timeval tv = {ms > 0 ? ms / 1000 : 0, ms > 0 ? (ms % 1000) * 1000 : 0};

	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* bulk_dial connects to host:port within ms and returns the (blocking)
 * socket, or -1 with errno set. */
static int bulk_dial(const char *host, const char *port, int ms)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	int fd = -1, err = EHOSTUNREACH;

	if (getaddrinfo(host, port, &hints, &ai) != 0) {
		errno = EHOSTUNREACH;
		return -1;
	}
	for (struct addrinfo *a = ai; a != NULL && fd < 0; a = a->ai_next) {
		struct pollfd pf;
		socklen_t el = sizeof(err);
		int r;
		if ((fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) <
		    0) {
			err = errno;
			continue;
		}
		if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
			err = errno;
		} else {
			pf = (struct pollfd){fd, POLLOUT, 0};
			while ((r = poll(&pf, 1, ms)) < 0 && errno == EINTR)
				;
			if (r == 0)
				err = ETIMEDOUT;
			else if (r < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
				err = errno;
			if (r > 0 && err == 0 &&
			    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0)
				continue; /* connected: fd ends the loop */
		}
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	if (fd < 0)
		errno = err;
	return fd;
}

/* bulk_url_split parses a peer URL: *bulk_port the port after
 * BULK_URL_SUFFIX (0: none), base the URL without it. */
static pt_err bulk_url_split(const char *url, char *base, size_t n, int *bulk_port)
{
	const char *h = strchr(url, '#');
	char *end;
	long port;

	*bulk_port = 0;
	if (h == NULL) {
		if (strlen(url) >= n)
			return pt_set_error(PT_ERR_INVALID, "URL too long: %.64s...", url);
		snprintf(base, n, "%s", url);
		return PT_OK;
	}
	if (strncmp(h, BULK_URL_SUFFIX, strlen(BULK_URL_SUFFIX)) != 0 || (size_t)(h - url) >= n)
		return pt_set_error(PT_ERR_INVALID, "%s: unknown URL fragment (only %sPORT)", url,
		                    BULK_URL_SUFFIX);
	port = strtol(h + strlen(BULK_URL_SUFFIX), &end, 10);
	if (*end != '\0' || port <= 0 || port > 65535)
		return pt_set_error(PT_ERR_INVALID, "%s: bulk port is not in 1..65535", url);
	snprintf(base, n, "%.*s", (int)(h - url), url);
	*bulk_port = (int)port;
	return PT_OK;
}

/* bulk_close drops peer's lane (peer->mu held, or the peer is being freed). */
static void bulk_close(nng_peer *p)
{
	if (p->bulk_fd >= 0) {
		close(p->bulk_fd);
		p->bulk_fd = -1;
	}
}

/* bulk_open tries to open the lane to p (p->mu held): dial, challenge,
 * hello, acknowledgement. Returns what failed, or NULL. */
static const char *bulk_open(nng_comm *c, nng_peer *p)
{
	uint8_t ch[4 + BULK_CHALLENGE], hello[BULK_HELLO + MAC_TRAILER] = {0}, ack[4];
	const char *colon = strrchr(p->bulk_url, ':');
	char host[256];
	size_t hn = sizeof(hello);
	struct iovec v;
	long long end;
	int one = 1;

	url_host(p->bulk_url, host, sizeof(host));
	if ((p->bulk_fd = bulk_dial(host, colon + 1, BULK_HELLO_MS)) < 0)
		return strerrordesc_np(errno);
	/* Data flows one way on a lane, so Nagle would hold each small record
	 * back for the peer's delayed acknowledgement (~40 ms). */
	(void)setsockopt(p->bulk_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	end = mono_ms() + BULK_HELLO_MS;
	v = (struct iovec){ch, sizeof(ch)};
	if (bulk_io_until(p->bulk_fd, &v, 1, false, end) != 0 || memcmp(ch, "PTBC", 4) != 0)
		return "no challenge";
	memcpy(hello, "PTBH", 4);
	store_le(hello + 4, (uint32_t)c->base.rank, 4);
	store_le(hello + 8, (uint32_t)p->rank, 4);
	memcpy(hello + 12, ch + 4, BULK_CHALLENGE);
	if (c->auth) {
		mac_trailer_init(c, hello + BULK_HELLO);
		if (!mac_tag(c, p->mac, hello, hn, p->rank, NULL, hello + hn - MAC_TAG))
			return "no MAC";
	}
	v = (struct iovec){hello, hn};
	if (bulk_io_until(p->bulk_fd, &v, 1, true, end) != 0)
		return "hello not sent";
	v = (struct iovec){ack, sizeof(ack)};
	if (bulk_io_until(p->bulk_fd, &v, 1, false, end) != 0 || memcmp(ack, "PTBA", 4) != 0)
		return "hello not accepted";
	bulk_timeouts(p->bulk_fd, c->send_timeout_ms);
	return NULL;
}

/* bulk_lane tells whether frames to peer take its bulk lane, opening it on
 * the first call. */
static bool bulk_lane(nng_comm *c, nng_peer *peer)
{
	bool bulk;

	pthread_mutex_lock(&peer->mu);
	if (peer->lane == LANE_UNDECIDED) {
		const char *why = peer->bulk_url ? bulk_open(c, peer) : "";
		peer->lane = why == NULL ? LANE_BULK : LANE_MSG;
		if (why == NULL) {
			pt_debug("rank %d: bulk lane to rank %d at %s", c->base.rank, peer->rank,
			         peer->bulk_url);
		} else {
			if (*why != '\0')
				pt_warn("rank %d: no bulk lane to rank %d at %s (%s): frames go as "
				        "messages",
				        c->base.rank, peer->rank, peer->bulk_url, why);
			bulk_close(peer);
		}
	}
	bulk = peer->lane == LANE_BULK;
	pthread_mutex_unlock(&peer->mu);
	return bulk;
}

/* bulk_send sends o as one record on peer's lane (peer->mu held); o->nh, if
 * any, holds the NH outputs of the payload's whole chunks. */
static pt_err bulk_send(nng_comm *c, nng_peer *peer, out_msg *o)
{
	frame_values v = {.m = o->m,
	                  .source = c->base.rank,
	                  .seq = peer->next_seq + peer->skip,
	                  .raw_size = o->raw,
	                  .payload_size = o->raw,
	                  .frag_count = 1,
	                  .frag_size = o->raw};
	uint8_t trailer[MAC_TRAILER];
	const uint8_t *hdr;
	size_t hsize, hsize2, hpad, need, tn = c->auth ? MAC_TRAILER : 0;
	struct iovec iov[3];
	int nrv;

	if (peer->bulk_fd < 0)
		return pt_set_error(PT_ERR_CLOSED, "rank %d: the bulk lane to rank %d broke",
		                    c->base.rank, peer->rank);
	PT_TRY(frame_build(&o->b, &v, &hdr, &hsize));
	hpad = (hsize + PT_NH_CHUNK - 1) / PT_NH_CHUNK * PT_NH_CHUNK;
	v.payload_offset = hpad;
	PT_TRY(frame_build(&o->b, &v, &hdr, &hsize2));
	if (hsize2 != hsize)
		return pt_set_error(PT_ERR_STATE, "frame header changed size (%zu, then %zu)",
		                    hsize, hsize2);
	need = BULK_PREFIX + hpad;
	if (need > peer->bulk_hdr_cap) {
		uint8_t *p = realloc(peer->bulk_hdr, need);
		if (p == NULL)
			return pt_set_error(PT_ERR_NOMEM, "frame header of %zu bytes", hsize);
		peer->bulk_hdr = p;
		peer->bulk_hdr_cap = need;
	}
	memcpy(peer->bulk_hdr, "PTBR", 4);
	store_le(peer->bulk_hdr + 4, hpad, 4);
	store_le(peer->bulk_hdr + 8, o->raw, 8);
	memcpy(peer->bulk_hdr + BULK_PREFIX, hdr, hsize);
	memset(peer->bulk_hdr + BULK_PREFIX + hsize, 0, hpad - hsize);
	if (c->auth) {
		const piece pcs[3] = {
		    {peer->bulk_hdr + BULK_PREFIX, hpad}, {o->src, o->raw}, {trailer, MAC_TRAILER}};
		const nh_pre pre = {o->nh, hpad / PT_NH_CHUNK,
		                    o->nh ? hpad / PT_NH_CHUNK + o->raw / PT_NH_CHUNK : 0};
		mac_trailer_init(c, trailer);
		if (!mac_tag_pieces(c, peer->mac, pcs, 3, peer->rank, &pre,
		                    trailer + 4 + MAC_NONCE))
			return pt_set_error(PT_ERR_BACKEND, "rank %d: cannot compute a frame's MAC",
			                    c->base.rank);
	}
	iov[0] = (struct iovec){peer->bulk_hdr, need};
	iov[1] = (struct iovec){(void *)o->src, o->raw};
	iov[2] = (struct iovec){trailer, tn};
	if ((nrv = bulk_io(peer->bulk_fd, iov, 3, true)) != 0) {
		/* Part of a record may be on the wire: the lane cannot go on. */
		bulk_close(peer);
		mark_lost_pending(c, peer->rank);
		return send_error(c, peer, nrv);
	}
	sent(c, peer, need + o->raw + tn, need + o->raw + tn);
	return PT_OK;
}

/* bulk_hello serves a new connection's handshake; returns the verified
 * source rank, or -1 (the connection is to be closed). */
static int bulk_hello(nng_comm *c, bulk_conn *bc, EVP_CIPHER_CTX *mac)
{
	/* The hello has a trailer's room either way (zeros without
	 * authentication), so ranks that disagree on it fail at once. */
	uint8_t ch[4 + BULK_CHALLENGE], h[BULK_HELLO + MAC_TRAILER], tag[MAC_TAG];
	size_t hn = sizeof(h);
	struct iovec v;
	uint32_t src, dst;
	long long end;
	bool ok;

	memcpy(ch, "PTBC", 4);
	if (getrandom(ch + 4, BULK_CHALLENGE, 0) != BULK_CHALLENGE)
		return -1;
	end = mono_ms() + BULK_HELLO_MS; /* the whole handshake, not each read */
	v = (struct iovec){ch, sizeof(ch)};
	if (bulk_io_until(bc->fd, &v, 1, true, end) != 0)
		return -1;
	v = (struct iovec){h, hn};
	if (bulk_io_until(bc->fd, &v, 1, false, end) != 0) {
		atomic_fetch_add(&c->n.errors, 1);
		pt_debug("rank %d: a bulk connection sent no hello", c->base.rank);
		return -1;
	}
	src = load_le32(h + 4);
	dst = load_le32(h + 8);
	ok = memcmp(h, "PTBH", 4) == 0 && dst == (uint32_t)c->base.rank &&
	     src < (uint32_t)c->base.world && src != (uint32_t)c->base.rank &&
	     memcmp(h + 12, ch + 4, BULK_CHALLENGE) == 0;
	if (ok && c->auth)
		ok = memcmp(h + BULK_HELLO, MAC_MAGIC, 4) == 0 &&
		     mac_tag(c, mac, h, hn, c->base.rank, NULL, tag) &&
		     CRYPTO_memcmp(tag, h + hn - MAC_TAG, MAC_TAG) == 0;
	if (!ok) {
		pthread_mutex_lock(&c->io_mu);
		mac_reject(c, "was a bulk hello not from this session", hn);
		pthread_mutex_unlock(&c->io_mu);
		return -1;
	}
	pthread_mutex_lock(&c->bulk_mu);
	ok = !c->bulk_claimed[src];
	c->bulk_claimed[src] = true;
	pthread_mutex_unlock(&c->bulk_mu);
	if (!ok) {
		pt_warn("rank %d: refused a second bulk lane from rank %d", c->base.rank, (int)src);
		return -1;
	}
	v = (struct iovec){(void *)"PTBA", 4};
	if (bulk_io_until(bc->fd, &v, 1, true, end) != 0)
		return -1;
	bulk_timeouts(bc->fd, 0); /* records come when they come */
	return (int)src;
}

/* bulk_deliver hands over an authentic record (m empty for a barrier), as
 * io_handle does a message; takes m over. */
static void bulk_deliver(nng_comm *c, const frame *f, pt_msg *m)
{
	pthread_mutex_lock(&c->io_mu);
	if (c->auth && f->meta.seq < c->expect_seq[f->meta.source]) {
		mac_reject(c, "repeats an earlier sequence number (a replay)", 0);
		pt_msg_fini(m);
	} else if (!check_seq(c, f)) {
		pt_msg_fini(m);
	} else if (f->meta.kind == PT_MSG_BARRIER) {
		on_barrier(c, f);
	} else {
		asm_abandon(c, f->meta.source);
		atomic_fetch_add(&c->n.msgs_recv, 1);
		if (pt_mailbox_push(c->mb, m) != PT_OK) {
			atomic_fetch_sub(&c->n.msgs_recv, 1);
			pt_msg_fini(m);
		}
	}
	pthread_mutex_unlock(&c->io_mu);
}

/* A bulk reader's buffers. */
typedef struct bulk_rx {
	nng_comm *c;
	int fd;
	EVP_CIPHER_CTX *mac;
	int src;
	uint8_t *hdr, *nh;
	size_t hdr_cap, nh_cap;
} bulk_rx;

static bool grow(uint8_t **p, size_t *cap, size_t need)
{
	uint8_t *q;

	if (need <= *cap)
		return true;
	if ((q = realloc(*p, need)) == NULL)
		return false;
	*p = q;
	*cap = need;
	return true;
}

/* bulk_record receives and delivers one record; false: the lane ends (the
 * peer closed it, or the record failed a check, which is logged). */
static bool bulk_record(bulk_rx *r)
{
	nng_comm *c = r->c;
	uint8_t pre[BULK_PREFIX], trailer[MAC_TRAILER], tag[MAC_TAG];
	size_t tn = c->auth ? MAC_TRAILER : 0;
	uint64_t hpad, plen;
	uint8_t *data = NULL;
	struct iovec v;
	frame f;
	pt_msg m = {0};
	int rv;

	v = (struct iovec){pre, sizeof(pre)};
	if ((rv = bulk_io(r->fd, &v, 1, false)) != 0) {
		if (rv != NNG_ECONNSHUT && rv != NNG_ECONNRESET)
			pt_warn("rank %d: bulk lane from rank %d: %s", c->base.rank, r->src,
			        nng_strerror(rv));
		return false;
	}
	hpad = load_le32(pre + 4);
	plen = load_le64(pre + 8);
	if (memcmp(pre, "PTBR", 4) != 0 || hpad < PT_NH_CHUNK || hpad % PT_NH_CHUNK != 0 ||
	    hpad > c->max_msg || plen > c->max_msg) {
		pt_set_error(PT_ERR_FORMAT, "bulk record of %llu + %llu bytes",
		             (unsigned long long)hpad, (unsigned long long)plen);
		goto bad;
	}
	if (!grow(&r->hdr, &r->hdr_cap, hpad)) {
		pt_set_error(PT_ERR_NOMEM, "bulk header of %llu bytes", (unsigned long long)hpad);
		goto bad;
	}
	v = (struct iovec){r->hdr, hpad};
	if ((rv = bulk_io(r->fd, &v, 1, false)) != 0) {
		nng_fail(rv, "%s: %s", "bulk header");
		goto bad;
	}
	if (frame_parse(c, r->hdr, hpad + plen, hpad, &f) != PT_OK)
		goto bad;
	if (f.payload_offset != hpad || f.codec != CODEC_NONE || f.frag_count != 1 ||
	    f.meta.source != r->src) {
		pt_set_error(PT_ERR_FORMAT,
		             "bulk record claiming rank %d, codec %u, %u fragments, payload at "
		             "%llu",
		             f.meta.source, f.codec, f.frag_count,
		             (unsigned long long)f.payload_offset);
		goto bad;
	}
	if (f.meta.kind != PT_MSG_BARRIER && start_msg(c, &f, &m) != PT_OK)
		goto bad;
	if (m.has_tensor)
		data = pt_tensor_data(&m.tensor);
	if (c->auth && !grow(&r->nh, &r->nh_cap, pt_nh_outputs(plen) + 1)) {
		pt_set_error(PT_ERR_NOMEM, "MAC scratch of a %llu-byte tensor",
		             (unsigned long long)plen);
		goto bad;
	}
	for (uint64_t off = 0; off < plen;) {
		size_t k = plen - off < BULK_PIECE ? (size_t)(plen - off) : BULK_PIECE;
		size_t whole = k - k % PT_NH_CHUNK;
		v = (struct iovec){data + off, k};
		if ((rv = bulk_io(r->fd, &v, 1, false)) != 0) {
			nng_fail(rv, "%s: %s", "bulk payload");
			goto bad;
		}
		if (c->auth && whole > 0) /* while the piece is in cache */
			pt_nh(c->nh_key, data + off, whole, r->nh + off / PT_NH_CHUNK * PT_NH_OUT);
		off += k;
	}
	v = (struct iovec){trailer, tn};
	if ((rv = bulk_io(r->fd, &v, 1, false)) != 0) {
		nng_fail(rv, "%s: %s", "bulk trailer");
		goto bad;
	}
	if (c->auth) {
		const piece pcs[3] = {{r->hdr, hpad}, {data, plen}, {trailer, MAC_TRAILER}};
		const nh_pre npre = {r->nh, hpad / PT_NH_CHUNK,
		                     hpad / PT_NH_CHUNK + plen / PT_NH_CHUNK};
		if (memcmp(trailer, MAC_MAGIC, 4) != 0 ||
		    !mac_tag_pieces(c, r->mac, pcs, 3, c->base.rank, &npre, tag) ||
		    CRYPTO_memcmp(tag, trailer + 4 + MAC_NONCE, MAC_TAG) != 0) {
			pt_msg_fini(&m);
			pthread_mutex_lock(&c->io_mu);
			mac_reject(c, "failed authentication on a bulk lane (lane closed)",
			           (size_t)(hpad + plen + tn));
			pthread_mutex_unlock(&c->io_mu);
			return false;
		}
	}
	atomic_fetch_add(&c->n.bytes_recv, BULK_PREFIX + hpad + plen + tn);
	bulk_deliver(c, &f, &m);
	return true;
bad:
	pt_msg_fini(&m);
	atomic_fetch_add(&c->n.errors, 1);
	pt_warn("rank %d: bulk lane from rank %d closed: %s", c->base.rank, r->src,
	        pt_last_error());
	return false;
}

static void *bulk_reader(void *arg)
{
	bulk_conn *bc = arg;
	bulk_rx r = {.c = bc->c, .fd = bc->fd, .src = -1};
	nng_comm *c = bc->c;

	if (!c->auth || (r.mac = mac_ctx_new(c)) != NULL)
		r.src = bulk_hello(c, bc, r.mac);
	if (r.src >= 0) {
		while (!atomic_load(&c->stopping) && bulk_record(&r))
			;
		/* As when a PUSH connection drops: what arrived is handed over first. */
		if (!atomic_load(&c->stopping))
			mark_lost_pending(c, r.src);
	}
	/* The descriptor is closed by whoever joins this thread. */
	(void)shutdown(bc->fd, SHUT_RDWR);
	EVP_CIPHER_CTX_free(r.mac);
	free(r.hdr);
	free(r.nh);
	atomic_store(&bc->state, BC_DONE);
	return NULL;
}

/* bulk_reap joins finished readers (bulk_mu held). */
static void bulk_reap(nng_comm *c)
{
	for (int i = 0; i < c->n_bulk_conns; i++) {
		bulk_conn *bc = &c->bulk_conns[i];
		if (atomic_load(&bc->state) == BC_DONE) {
			pthread_join(bc->th, NULL);
			close(bc->fd);
			bc->fd = -1;
			atomic_store(&bc->state, BC_FREE);
		}
	}
}

/* sockaddr_stranger: a connection from sa counts as a stranger's (as on the
 * PULL socket, is_stranger). */
static bool sockaddr_stranger(nng_comm *c, const struct sockaddr_storage *sa)
{
	ip_addr ip = {0};
	bool st;

	if (sa->ss_family == AF_INET)
		ip = ip_of((const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr, false);
	else if (sa->ss_family == AF_INET6)
		ip = ip_of(((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, true);
	pthread_mutex_lock(&c->pipe_mu);
	st = is_stranger(c, &ip);
	pthread_mutex_unlock(&c->pipe_mu);
	return st;
}

/* bulk_slot finds a free slot for a new connection (bulk_mu held): at most
 * BULK_EXTRA run for strangers and world - 1 + BULK_EXTRA for the others, so
 * strangers waiting out their hello cannot take a peer's lane (those that
 * came before connect named the peers count as others until their hello
 * fails). NULL: none. */
static bulk_conn *bulk_slot(nng_comm *c, bool stranger)
{
	bulk_conn *free_slot = NULL;
	int same = 0;

	for (int i = 0; i < c->n_bulk_conns; i++) {
		bulk_conn *bc = &c->bulk_conns[i];
		if (atomic_load(&bc->state) == BC_FREE)
			free_slot = free_slot ? free_slot : bc;
		else
			same += bc->stranger == stranger;
	}
	return same < (stranger ? 0 : c->base.world - 1) + BULK_EXTRA ? free_slot : NULL;
}

/* The bulk acceptor: each connection gets a reader thread and a slot, while
 * its kind has free slots (bulk_slot); the others are closed at once. */
static void *bulk_accept_main(void *arg)
{
	nng_comm *c = arg;
	long long warned = 0;

	for (;;) {
		bulk_conn *bc = NULL;
		struct sockaddr_storage sa = {0};
		socklen_t sl = sizeof(sa);
		int fd = accept4(c->bulk_lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC);
		bool stranger;
		if (atomic_load(&c->stopping)) {
			if (fd >= 0)
				close(fd);
			break;
		}
		if (fd < 0) {
			struct timespec pause = {0, 10 * 1000000L};
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS &&
			    errno != ENOMEM)
				break;
			nanosleep(&pause, NULL); /* out of descriptors: do not spin */
			continue;
		}
		stranger = sockaddr_stranger(c, &sa);
		pthread_mutex_lock(&c->bulk_mu);
		bulk_reap(c);
		if ((bc = bulk_slot(c, stranger)) != NULL) {
			bc->c = c;
			bc->fd = fd;
			bc->stranger = stranger;
			atomic_store(&bc->state, BC_RUNNING);
			if (pthread_create(&bc->th, NULL, bulk_reader, bc) != 0) {
				atomic_store(&bc->state, BC_FREE);
				bc->fd = -1;
				bc = NULL;
			}
		}
		pthread_mutex_unlock(&c->bulk_mu);
		if (bc == NULL) {
			long long now = pt_now_ms();
			close(fd);
			atomic_fetch_add(&c->n.errors, 1);
			if (now - warned >= MAC_WARN_MS) {
				pt_warn(
				    "rank %d: refused a bulk connection from %s: all its %d slots "
				    "busy",
				    c->base.rank, stranger ? "a stranger" : "a peer's address",
				    (stranger ? 0 : c->base.world - 1) + BULK_EXTRA);
				warned = now;
			}
		}
	}
	return NULL;
}

/* bulk_listen starts the bulk listener on the host of c's URL (tcp:// only). */
static pt_err bulk_listen(nng_comm *c)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);
	char host[256];
	int rv, e;

	url_host(c->bound_url, host, sizeof(host));
	c->n_bulk_conns = c->base.world - 1 + 2 * BULK_EXTRA;
	if ((c->bulk_conns = calloc((size_t)c->n_bulk_conns, sizeof(*c->bulk_conns))) == NULL ||
	    (c->bulk_claimed = calloc((size_t)c->base.world, sizeof(bool))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "bulk lane slots");
	if ((rv = getaddrinfo(host[0] == '\0' || strcmp(host, "*") == 0 ? NULL : host, "0", &hints,
	                      &ai)) != 0)
		return pt_set_error(PT_ERR_INVALID, "bulk listener on %s: %s", host,
		                    gai_strerror(rv));
	/* The first of the host's addresses that binds (localhost may give ::1
	 * first where a container has no IPv6). */
	e = EADDRNOTAVAIL;
	for (struct addrinfo *a = ai; a != NULL && c->bulk_lfd < 0; a = a->ai_next) {
		if ((c->bulk_lfd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
			e = errno;
			continue;
		}
		if (bind(c->bulk_lfd, a->ai_addr, a->ai_addrlen) != 0 ||
		    listen(c->bulk_lfd, 64) != 0 ||
		    getsockname(c->bulk_lfd, (struct sockaddr *)&sa, &sl) != 0) {
			e = errno;
			close(c->bulk_lfd);
			c->bulk_lfd = -1;
		}
	}
	freeaddrinfo(ai);
	if (c->bulk_lfd < 0)
		return pt_set_error(PT_ERR_IO, "bulk listener on %s: %s", host, strerrordesc_np(e));
	if (pthread_create(&c->bulk_acceptor, NULL, bulk_accept_main, c) != 0)
		return pt_set_error(PT_ERR_BACKEND, "cannot start the bulk acceptor");
	c->bulk_started = true;
	c->bulk_port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
	                                              : ((struct sockaddr_in *)&sa)->sin_port);
	return PT_OK;
}

/* bulk_stop shuts the listener and every lane down and joins their threads. */
static void bulk_stop(nng_comm *c)
{
	if (c->bulk_lfd >= 0)
		(void)shutdown(c->bulk_lfd, SHUT_RDWR); /* accept returns */
	if (c->bulk_started)
		pthread_join(c->bulk_acceptor, NULL);
	for (int i = 0; c->bulk_conns && i < c->n_bulk_conns; i++) {
		bulk_conn *bc = &c->bulk_conns[i];
		if (atomic_load(&bc->state) == BC_FREE)
			continue;
		(void)shutdown(bc->fd, SHUT_RDWR); /* its reads return */
		pthread_join(bc->th, NULL);
		close(bc->fd);
	}
	if (c->bulk_lfd >= 0)
		close(c->bulk_lfd);
	free(c->bulk_conns);
	free(c->bulk_claimed);
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
	bulk_stop(c);
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
		bulk_close(p);
		free(p->bulk_url);
		free(p->bulk_hdr);
		EVP_CIPHER_CTX_free(p->mac);
		pthread_mutex_destroy(&p->mu);
	}
	if (c->tls_server)
		nng_tls_config_free(c->tls_server);
	if (atomic_load(&c->n_refused) > 0)
		pt_info("rank %d: refused %ld connections on its data port (places: %d from "
		        "peers' addresses, %d from strangers')",
		        base->rank, (long)atomic_load(&c->n_refused), base->world - 1 + PULL_EXTRA,
		        PULL_EXTRA);
	pt_mailbox_destroy(c->mb);
	pt_rx_pool_close(c->pool);
	pthread_mutex_destroy(&c->connect_mu);
	pthread_mutex_destroy(&c->pipe_mu);
	pthread_mutex_destroy(&c->bar_mu);
	pthread_cond_destroy(&c->bar_cv);
	pthread_mutex_destroy(&c->self_mu);
	pthread_mutex_destroy(&c->io_mu);
	pthread_mutex_destroy(&c->bulk_mu);
	pthread_mutex_destroy(&c->rx_mu);
	pthread_cond_destroy(&c->rx_cv);
	free(c->peers);
	free(c->pipes);
	free(c->open);
	free(c->peer_ips);
	free(c->lost_ticket);
	free(c->lost_ms);
	for (int r = 0; c->asm_of && r < base->world; r++)
		asm_drop(&c->asm_of[r]);
	free(c->asm_of);
	free(c->expect_seq);
	free(c->bar_arrived);
	free(c->bound_url);
	free(c->url);
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
	c->no_bulk = opt->no_bulk;
	c->max_msg = opt->max_msg_bytes ? opt->max_msg_bytes : DEFAULT_MAX_MSG;
	pthread_mutex_init(&c->connect_mu, NULL);
	pthread_mutex_init(&c->pipe_mu, NULL);
	pthread_mutex_init(&c->bar_mu, NULL);
	pthread_mutex_init(&c->self_mu, NULL);
	pthread_mutex_init(&c->io_mu, NULL);
	pthread_mutex_init(&c->bulk_mu, NULL);
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
	/* Connections admitted before connect named the peers may all turn out
	 * to be strangers', beside world - 1 + PULL_EXTRA others. */
	c->cap_open = 2 * (world - 1 + PULL_EXTRA);
	c->open = calloc((size_t)c->cap_open, sizeof(*c->open));
	c->tls_cert_key = dup_or_null(opt->tls_cert_key_file);
	c->tls_key = dup_or_null(opt->tls_key_file);
	c->tls_ca = dup_or_null(opt->tls_ca_file);
	c->tls_server_name = dup_or_null(opt->tls_server_name);
	if (c->peers == NULL || c->lost_ticket == NULL || c->lost_ms == NULL ||
	    c->expect_seq == NULL || c->asm_of == NULL || c->bar_arrived == NULL ||
	    c->open == NULL || (opt->tls_cert_key_file && !c->tls_cert_key) ||
	    (opt->tls_key_file && !c->tls_key) || (opt->tls_ca_file && !c->tls_ca) ||
	    (opt->tls_server_name && !c->tls_server_name)) {
		rv = pt_set_error(PT_ERR_NOMEM, "nng communicator of %d ranks", world);
		goto fail;
	}
	c->bulk_lfd = -1;
	for (int r = 0; r < world; r++) {
		c->peers[r].c = c;
		c->peers[r].rank = r;
		c->peers[r].bulk_fd = -1;
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
	if ((rv = pt_mailbox_create(&c->mb, world, opt->rank)) != PT_OK ||
	    (rv = pt_rx_pool_create(&c->pool)) != PT_OK)
		goto fail;

	if ((nrv = nng_pull0_open(&c->pull)) != 0) {
		rv = nng_fail(nrv, "%s: %s", "nng_pull0_open");
		goto fail;
	}
	c->pull_open = true;
	if ((nrv = nng_socket_set_size(c->pull, NNG_OPT_RECVMAXSZ, recv_cap(c))) != 0 ||
	    (nrv = nng_pipe_notify(c->pull, NNG_PIPE_EV_ADD_PRE, pull_pipe_cb, c)) != 0 ||
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
	if (nng_listener_set_size(c->listener, NNG_OPT_RECVMAXSZ, recv_cap(c)) != 0)
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
	/* Without a bulk listener the rank publishes no bulk port: peers send
	 * to it as messages. */
	if (strncmp(c->bound_url, "tcp://", 6) == 0 && !c->no_bulk && bulk_listen(c) != PT_OK)
		pt_warn("rank %d: no bulk lane: %s; frames to this rank go as messages", opt->rank,
		        pt_last_error());
	{
		size_t n = strlen(c->bound_url) + sizeof(BULK_URL_SUFFIX) + 8;
		if ((c->url = malloc(n)) == NULL) {
			rv = pt_set_error(PT_ERR_NOMEM, "url");
			goto fail;
		}
		if (c->bulk_port > 0)
			snprintf(c->url, n, "%s%s%d", c->bound_url, BULK_URL_SUFFIX, c->bulk_port);
		else
			snprintf(c->url, n, "%s", c->bound_url);
	}
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
	return ((const nng_comm *)base)->url;
}

static pt_err dial_peer(nng_comm *c, nng_peer *p, const char *peer_url)
{
	char what[600], url[512];
	int rv, bulk_port;

	snprintf(what, sizeof(what), "rank %d dialing rank %d at %s", c->base.rank, p->rank,
	         peer_url);
	if (bulk_url_split(peer_url, url, sizeof(url), &bulk_port) != PT_OK)
		return pt_set_error(PT_ERR_INVALID, "%s: %s", what, pt_last_error());
	if (bulk_port > 0 && strncmp(url, "tcp://", 6) == 0 && !c->no_bulk && !c->compress) {
		const char *colon = strrchr(url, ':');
		size_t n = strlen(url) + 8;
		if ((p->bulk_url = malloc(n)) == NULL)
			return pt_set_error(PT_ERR_NOMEM, "%s", what);
		snprintf(p->bulk_url, n, "%.*s:%d", (int)(colon - url), url, bulk_port);
	}
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
	learn_peer_ips(c, urls);
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
