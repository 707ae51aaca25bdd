/* nccl.c - the NCCL communicator (design and limits in nccl_comm.h).
 *
 * Built only when meson finds CUDA and NCCL; nccl_stub.c replaces it
 * otherwise. It talks to the CUDA runtime and NCCL directly (it is CUDA-only
 * code, like lib/ops/cuda) and to device memory through lib/backend.
 *
 * Threads: senders (any thread; sends to one peer are serialised by that
 * peer's send_mu, which also owns the "tx" NCCL communicator of the pair),
 * receivers (pop the mailbox), and one I/O thread that owns everything "rx".
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "mailbox.h"
#include "nccl_comm.h"
#include "ops.h"

#define TRAILER_MAGIC   0x434e5450u /* "PTNC" little-endian */
#define TRAILER_VERSION 1
#define IO_POLL_MS      100                 /* I/O thread: lost-peer checks when idle */
#define MAX_TENSOR      ((uint64_t)1 << 40) /* refuse trailers announcing more */

enum { T_HELLO = 1, T_INIT, T_DATA };
/* Where a message's tensor travels. */
enum { P_NONE = 0, P_CONTROL, P_NCCL_DEVICE, P_NCCL_HOST, P_SELF, P_CONTROL_DEVICE, P_COUNT };
/* P_CONTROL_DEVICE: a device tensor carried in the control message (a host
 * copy); a receiver with a GPU puts it back in its device memory. */

/* The trailer after the caller's blob on every control message. */
typedef struct trailer {
	uint32_t magic;
	uint8_t version, what, route, dtype;
	int32_t ndim;
	int32_t dev_kind, dev_index; /* hello: the sender's device */
	uint32_t reserved;
	uint64_t seq;    /* data: per (source, destination); hello: device fingerprint */
	uint64_t nbytes; /* data: tensor bytes */
	int64_t shape[PT_MAX_DIMS];
} trailer;
_Static_assert(sizeof(trailer) == 24 + 16 + 8 * PT_MAX_DIMS, "trailer has no padding");

typedef struct self_item {
	pt_tensor t;
	struct self_item *next;
} self_item;

typedef struct peer {
	pthread_mutex_t send_mu; /* orders sends to this peer; guards the tx fields */
	uint64_t next_seq;
	ncclComm_t tx; /* this rank -> peer (NCCL rank 0 of 2), or NULL */
	cudaStream_t tx_stream;
	bool tx_broken;
	char tx_why[512];
	/* I/O thread only. */
	ncclComm_t rx; /* peer -> this rank (NCCL rank 1 of 2) */
	cudaStream_t rx_stream;
	uint64_t expect_seq;
	bool lost;
	char rx_why[256]; /* why the last rx set-up failed, or "" */
	/* Set at creation. */
	pt_device dev;
	uint64_t fingerprint; /* same value on both sides = same GPU */
} peer;

typedef struct nccl_comm {
	pt_comm base;
	pt_comm *control;
	pt_device dev;
	bool gpu;
	uint64_t fingerprint;
	peer *peers; /* [world] */
	pt_mailbox *mb;
	pthread_t io;
	bool io_started;
	atomic_bool closed;
	pthread_mutex_t self_mu; /* guards the self FIFO */
	self_item *self_head, *self_tail;
	pt_comm_counters n;
} nccl_comm;

static const pt_comm_ops nccl_ops;

/* ------------------------------------------------------------- errors -- */

static pt_err nccl_fail(ncclResult_t r, ncclComm_t comm, const char *what, int peer_rank)
{
	const char *last = comm ? ncclGetLastError(comm) : "";
	return pt_set_error(PT_ERR_BACKEND, "NCCL %s (peer rank %d): %s%s%s", what, peer_rank,
	                    ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
}

static pt_err cuda_fail(cudaError_t e, const char *what)
{
	return pt_set_error(PT_ERR_BACKEND, "NCCL communicator: %s: %s (%s)", what,
	                    cudaGetErrorString(e), cudaGetErrorName(e));
}

#define CUDA_TRY(call)                                                                             \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess)                                                             \
			return cuda_fail(e_, #call);                                               \
	} while (0)

static void sleep_us(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
	nanosleep(&ts, NULL);
}

/* --------------------------------------------------------------- trailer -- */

static pt_err attach(pt_msg *out, const pt_msg *user, const trailer *tr)
{
	size_t n = user ? user->blob_len : 0;
	char *b = malloc(n + sizeof(*tr));
	if (b == NULL)
		return pt_set_error(PT_ERR_NOMEM, "NCCL message blob of %zu bytes", n);
	if (n)
		memcpy(b, user->blob, n);
	memcpy(b + n, tr, sizeof(*tr));
	free(out->blob);
	out->blob = b;
	out->blob_len = n + sizeof(*tr);
	return PT_OK;
}

/* take_trailer checks and removes the trailer of a received control message. */
static pt_err take_trailer(pt_msg *m, trailer *tr)
{
	int src = m->meta.source;
	int64_t numel = 1;

	if (m->blob == NULL || m->blob_len < sizeof(*tr))
		return pt_set_error(PT_ERR_FORMAT, "message from rank %d has no NCCL trailer", src);
	memcpy(tr, (char *)m->blob + m->blob_len - sizeof(*tr), sizeof(*tr));
	if (tr->magic != TRAILER_MAGIC || tr->version != TRAILER_VERSION)
		return pt_set_error(
		    PT_ERR_FORMAT, "message from rank %d: bad NCCL trailer (magic %08x version %u)",
		    src, tr->magic, tr->version);
	if (tr->what < T_HELLO || tr->what > T_DATA || tr->route >= P_COUNT)
		return pt_set_error(PT_ERR_FORMAT, "message from rank %d: NCCL trailer type %u/%u",
		                    src, tr->what, tr->route);
	if (tr->what == T_DATA && tr->route != P_NONE) {
		size_t es = tr->dtype < PT_DTYPE_COUNT ? pt_dtype_size((pt_dtype)tr->dtype) : 0;
		if (es == 0 || tr->ndim < 0 || tr->ndim > PT_MAX_DIMS)
			return pt_set_error(PT_ERR_FORMAT,
			                    "message from rank %d: tensor dtype %u, %d dims", src,
			                    tr->dtype, tr->ndim);
		for (int d = 0; d < tr->ndim; d++) {
			if (tr->shape[d] < 0 ||
			    (tr->shape[d] > 0 && numel > INT64_MAX / tr->shape[d]))
				return pt_set_error(PT_ERR_FORMAT,
				                    "message from rank %d: tensor dim %d of %lld",
				                    src, d, (long long)tr->shape[d]);
			numel *= tr->shape[d];
		}
		if (tr->nbytes > MAX_TENSOR || (uint64_t)numel > MAX_TENSOR / es ||
		    (uint64_t)numel * es != tr->nbytes)
			return pt_set_error(
			    PT_ERR_FORMAT,
			    "message from rank %d: tensor of %lld elements but %llu "
			    "bytes",
			    src, (long long)numel, (unsigned long long)tr->nbytes);
	}
	m->blob_len -= sizeof(*tr);
	if (m->blob_len == 0) {
		free(m->blob);
		m->blob = NULL;
	}
	return PT_OK;
}

static bool trailer_matches(const trailer *tr, const pt_tensor *t)
{
	if (t->dtype != (pt_dtype)tr->dtype || t->ndim != tr->ndim ||
	    pt_tensor_nbytes(t) != tr->nbytes)
		return false;
	for (int d = 0; d < t->ndim; d++)
		if (t->shape[d] != tr->shape[d])
			return false;
	return true;
}

/* ------------------------------------------------------------------ NCCL -- */

/* wait_done waits for the NCCL work queued on s through comm: first until the
 * non-blocking comm has finished enqueueing it, then until the stream is
 * idle. PT_ERR_TIMEOUT past deadline, PT_ERR_CLOSED when c closes. */
static pt_err wait_done(nccl_comm *c, ncclComm_t comm, cudaStream_t s, long long deadline,
                        const char *what, int peer_rank)
{
	long us = 10;
	for (;;) {
		ncclResult_t st = ncclSuccess;
		ncclResult_t r = ncclCommGetAsyncError(comm, &st);
		if (r != ncclSuccess)
			return nccl_fail(r, comm, what, peer_rank);
		if (st != ncclSuccess && st != ncclInProgress)
			return nccl_fail(st, comm, what, peer_rank);
		if (st == ncclSuccess && s != NULL) {
			cudaError_t e = cudaStreamQuery(s);
			if (e == cudaSuccess)
				return PT_OK;
			if (e != cudaErrorNotReady)
				return cuda_fail(e, what);
			/* NotReady also lands in this thread's error slot; left there,
			 * the next kernel launch on this thread would report it. */
			(void)cudaGetLastError();
		} else if (st == ncclSuccess) {
			return PT_OK;
		}
		if (atomic_load(&c->closed))
			return pt_set_error(PT_ERR_CLOSED, "rank %d: NCCL %s with rank %d: closed",
			                    c->base.rank, what, peer_rank);
		if (pt_now_ms() > deadline) {
			atomic_fetch_add(&c->n.timeouts, 1);
			return pt_set_error(PT_ERR_TIMEOUT,
			                    "rank %d: NCCL %s with rank %d not done within the "
			                    "timeout",
			                    c->base.rank, what, peer_rank);
		}
		sleep_us(us);
		us = us < 1000 ? us * 2 : 1000;
	}
}

/* pair_init joins the 2-rank NCCL communicator of id as pair_rank and makes
 * its stream; on error nothing is left behind. An id serves one attempt (its
 * bootstrap root accepts the two ranks once): a retry needs a new id. */
static pt_err pair_init(nccl_comm *c, const ncclUniqueId *id, int pair_rank, int peer_rank,
                        ncclComm_t *comm, cudaStream_t *stream)
{
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclResult_t r;
	cudaError_t e;
	pt_err rv;

	*comm = NULL;
	*stream = NULL;
	cfg.blocking = 0;
	CUDA_TRY(cudaSetDevice(c->dev.index));
	r = ncclCommInitRankConfig(comm, 2, *id, pair_rank, &cfg);
	if (r != ncclSuccess && r != ncclInProgress) {
		rv = nccl_fail(r, NULL, "ncclCommInitRank", peer_rank);
		if (*comm)
			ncclCommAbort(*comm);
		*comm = NULL;
		return rv;
	}
	rv = wait_done(c, *comm, NULL, pt_now_ms() + c->base.timeout_ms, "ncclCommInitRank",
	               peer_rank);
	if (rv == PT_OK &&
	    (e = cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking)) != cudaSuccess) {
		rv = cuda_fail(e, "cudaStreamCreate");
		*stream = NULL;
	}
	if (rv != PT_OK) {
		ncclCommAbort(*comm);
		*comm = NULL;
	}
	return rv;
}

static void pair_abort(ncclComm_t *comm, cudaStream_t *stream)
{
	if (*comm)
		ncclCommAbort(*comm);
	if (*stream)
		cudaStreamDestroy(*stream);
	*comm = NULL;
	*stream = NULL;
}

/* after_compute makes s wait for everything queued so far on the device's
 * compute stream: an event recorded when a send is posted, so the kernels
 * that wrote the tensor come first and later compute is not waited for.
 * Receives never wait for compute (their buffers come from s itself). */
static pt_err after_compute(nccl_comm *c, cudaStream_t s)
{
	cudaStream_t compute = (cudaStream_t)pt_backend_stream(c->dev);
	cudaEvent_t ev;
	cudaError_t e;
	if (compute == NULL)
		return pt_set_error(PT_ERR_BACKEND, "cuda:%d: no compute stream", c->dev.index);
	CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	e = cudaEventRecord(ev, compute);
	if (e == cudaSuccess)
		e = cudaStreamWaitEvent(s, ev, 0);
	cudaEventDestroy(ev);
	return e == cudaSuccess ? PT_OK : cuda_fail(e, "ordering after the compute stream");
}

/* compute_after makes the device's compute stream wait for everything queued
 * so far on s (an event): kernels that read a received tensor, and the pool
 * free of a buffer NCCL used, come after NCCL is done with it, even after an
 * abort. Returns the CUDA error; sets no message. */
static cudaError_t compute_after(nccl_comm *c, cudaStream_t s)
{
	cudaStream_t compute = (cudaStream_t)pt_backend_stream(c->dev);
	cudaEvent_t ev;
	cudaError_t e;
	if (compute == NULL)
		return cudaErrorInvalidResourceHandle;
	if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
		return e;
	e = cudaEventRecord(ev, s);
	if (e == cudaSuccess)
		e = cudaStreamWaitEvent(compute, ev, 0);
	cudaEventDestroy(ev); /* released once the wait is done */
	return e;
}

pt_err pt_nccl_p2p(bool send, void *buf, size_t nbytes, void *comm, void *stream, int peer_rank)
{
	const char *what = send ? "ncclSend" : "ncclRecv";
	ncclComm_t nc = comm;
	ncclResult_t r, r2;

	if ((r = ncclGroupStart()) != ncclSuccess)
		return nccl_fail(r, NULL, "ncclGroupStart", peer_rank);
	r = send ? ncclSend(buf, nbytes, ncclUint8, 1, nc, (cudaStream_t)stream)
	         : ncclRecv(buf, nbytes, ncclUint8, 0, nc, (cudaStream_t)stream);
	/* Always end the group that started, also when the call failed: a thread
	 * left inside a group defers every later NCCL call it makes, so later
	 * receives would deliver buffers NCCL never wrote. */
	r2 = ncclGroupEnd();
	if (r != ncclSuccess && r != ncclInProgress)
		return nccl_fail(r, nc, what, peer_rank);
	if (r2 != ncclSuccess && r2 != ncclInProgress)
		return nccl_fail(r2, nc, what, peer_rank);
	return PT_OK;
}

/* transfer runs one ncclSend (send) or ncclRecv of nbytes at data (device
 * memory, or host memory staged through a device buffer when host) and waits
 * for it. A device receive buffer must have been allocated on s. */
static pt_err transfer(nccl_comm *c, bool send, ncclComm_t comm, cudaStream_t s, void *data,
                       size_t nbytes, bool host, int peer_rank)
{
	const char *what = send ? "ncclSend" : "ncclRecv";
	void *buf = data;
	pt_err rv;

	CUDA_TRY(cudaSetDevice(c->dev.index));
	if (host) {
		CUDA_TRY(cudaMallocAsync(&buf, nbytes, s));
		if (send) {
			cudaError_t e =
			    cudaMemcpyAsync(buf, data, nbytes, cudaMemcpyHostToDevice, s);
			if (e != cudaSuccess) {
				cudaFreeAsync(buf, s);
				return cuda_fail(e, "staging a host tensor");
			}
		}
	} else if (send) {
		PT_TRY(after_compute(c, s));
	}
	rv = pt_nccl_p2p(send, buf, nbytes, comm, s, peer_rank);
	if (rv == PT_OK)
		rv = wait_done(c, comm, s, pt_now_ms() + c->base.timeout_ms, what, peer_rank);
	if (host) {
		if (rv == PT_OK && !send) {
			cudaError_t e =
			    cudaMemcpyAsync(data, buf, nbytes, cudaMemcpyDeviceToHost, s);
			if (e == cudaSuccess)
				e = cudaStreamSynchronize(s);
			if (e != cudaSuccess)
				rv = cuda_fail(e, "copying a received host tensor");
		}
		/* After an abort the stream still runs the free once the kernel ends. */
		cudaFreeAsync(buf, s);
	}
	return rv;
}

/* ------------------------------------------------------------------ send -- */

/* tx_init sends dst a new NCCL id and joins the pair's communicator with it. */
static pt_err tx_init(nccl_comm *c, peer *p, int dst)
{
	ncclUniqueId id;
	ncclResult_t r;
	pt_msg m = {0};
	trailer tr = {.magic = TRAILER_MAGIC, .version = TRAILER_VERSION, .what = T_INIT};
	pt_err rv;

	if ((r = ncclGetUniqueId(&id)) != ncclSuccess)
		return nccl_fail(r, NULL, "ncclGetUniqueId", dst);
	m.meta.kind = PT_MSG_COMMAND;
	m.meta.tag = PT_NCCL_ID_TAG;
	rv = pt_msg_set_blob(&m, &id, sizeof(id));
	if (rv == PT_OK) {
		pt_msg user = m;
		m.blob = NULL;
		rv = attach(&m, &user, &tr);
		free(user.blob);
	}
	if (rv == PT_OK)
		rv = pt_comm_send(c->control, dst, &m);
	pt_msg_fini(&m);
	if (rv == PT_OK)
		rv = pair_init(c, &id, 0, dst, &p->tx, &p->tx_stream);
	return rv;
}

/* give_back_cache returns the device pool's cached memory to the driver:
 * NCCL allocates its buffers outside that pool, so a set-up that ran out of
 * memory may succeed after it. Its own failure only loses that chance. */
static void give_back_cache(nccl_comm *c)
{
	if (pt_backend_trim(c->dev) != PT_OK)
		pt_clear_error();
}

/* tx_ready makes the comm for this rank -> dst (send_mu held). A failed
 * set-up is tried once more, with a new id, after giving the pool's cached
 * memory back (the receiver does the same when its side fails). */
static pt_err tx_ready(nccl_comm *c, peer *p, int dst)
{
	char first[200];
	pt_err rv;

	if (p->tx_broken)
		return pt_set_error(PT_ERR_CLOSED, "rank %d: NCCL to rank %d is broken: %s",
		                    c->base.rank, dst, p->tx_why);
	if (p->tx != NULL)
		return PT_OK;
	rv = tx_init(c, p, dst);
	if (rv == PT_OK || rv == PT_ERR_CLOSED)
		return rv;
	snprintf(first, sizeof(first), "%s", pt_last_error());
	give_back_cache(c);
	rv = tx_init(c, p, dst);
	if (rv == PT_OK || rv == PT_ERR_CLOSED)
		return rv;
	p->tx_broken = true;
	snprintf(p->tx_why, sizeof(p->tx_why), "%s (first try: %s)", pt_last_error(), first);
	return pt_set_error(rv, "%s", p->tx_why);
}

/* device_copy makes dst a new contiguous copy of device tensor src on the
 * same device. */
static pt_err device_copy(pt_tensor *dst, const pt_tensor *src)
{
	pt_storage *s;
	pt_err rv;
	PT_TRY(pt_storage_create(&s, pt_tensor_nbytes(src), src->storage->device));
	rv = pt_tensor_init_on(dst, s, 0, src->dtype, src->ndim, src->shape);
	pt_storage_release(s);
	if (rv == PT_OK)
		rv = pt_copy(dst, src);
	if (rv == PT_OK)
		rv = pt_tensor_sync(dst);
	if (rv != PT_OK)
		pt_tensor_fini(dst);
	return rv;
}

/* host_copy makes dst a contiguous host copy of src (host or device). */
static pt_err host_copy(pt_tensor *dst, const pt_tensor *src)
{
	pt_err rv;
	if (src->storage->device.kind != PT_DEV_CPU && !pt_tensor_is_contiguous(src)) {
		/* Device memory is read to the host only contiguous: pack it there first. */
		pt_tensor packed;
		PT_TRY(device_copy(&packed, src));
		rv = host_copy(dst, &packed);
		pt_tensor_fini(&packed);
		return rv;
	}
	rv = pt_tensor_init(dst, src->dtype, src->ndim, src->shape);
	if (rv == PT_OK)
		rv = pt_tensor_read(src, pt_tensor_data(dst), pt_tensor_nbytes(dst));
	if (rv != PT_OK)
		pt_tensor_fini(dst);
	return rv;
}

static pt_err nccl_send(pt_comm *base, int dst, const pt_msg *m)
{
	nccl_comm *c = (nccl_comm *)base;
	peer *p = &c->peers[dst];
	const pt_tensor *t = m->has_tensor ? &m->tensor : NULL;
	bool on_device = t && t->storage->device.kind != PT_DEV_CPU;
	trailer tr = {.magic = TRAILER_MAGIC, .version = TRAILER_VERSION, .what = T_DATA};
	pt_tensor packed = {0};
	pt_msg out = {0};
	self_item *item = NULL;
	size_t nbytes = 0;
	bool queued = false;
	pt_err rv = PT_OK;

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	if (on_device && (!c->gpu || t->storage->device.index != c->dev.index))
		return pt_set_error(PT_ERR_INVALID, "rank %d (%s) cannot send a tensor of cuda:%d",
		                    base->rank, c->gpu ? "another device" : "cpu",
		                    t->storage->device.index);
	out.meta = m->meta;
	if (t == NULL) {
		tr.route = P_NONE;
	} else {
		nbytes = pt_tensor_nbytes(t);
		tr.dtype = (uint8_t)t->dtype;
		tr.ndim = t->ndim;
		memcpy(tr.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
		tr.nbytes = nbytes;
		if (dst == base->rank)
			tr.route = on_device ? P_SELF : P_CONTROL;
		else if (c->gpu && p->dev.kind == PT_DEV_CUDA && p->fingerprint != c->fingerprint &&
		         nbytes > 0 && pt_backend_peer_direct(c->dev, p->dev))
			tr.route = on_device ? P_NCCL_DEVICE : P_NCCL_HOST;
		else
			tr.route = on_device ? P_CONTROL_DEVICE : P_CONTROL;
	}
	/* What travels: a host tensor in the control message, a packed one for
	 * NCCL, a device copy for oneself. */
	if (tr.route == P_CONTROL || tr.route == P_CONTROL_DEVICE) {
		out.has_tensor = true;
		out.writable = on_device || m->writable; /* a host copy is the receiver's */
		if (on_device)
			rv = host_copy(&out.tensor, t);
		else
			pt_tensor_view(&out.tensor, t);
	} else if (tr.route == P_SELF) {
		item = calloc(1, sizeof(*item));
		rv = item ? device_copy(&item->t, t) : pt_set_error(PT_ERR_NOMEM, "self message");
	} else if (tr.route != P_NONE && !pt_tensor_is_contiguous(t)) {
		rv = on_device ? device_copy(&packed, t) : host_copy(&packed, t);
		if (rv == PT_OK)
			t = &packed;
	}
	if (rv == PT_OK)
		rv = attach(&out, m, &tr);
	if (rv != PT_OK)
		goto out;

	pthread_mutex_lock(&p->send_mu);
	tr.seq = p->next_seq;
	memcpy((char *)out.blob + out.blob_len - sizeof(tr), &tr, sizeof(tr));
	if (tr.route == P_NCCL_DEVICE || tr.route == P_NCCL_HOST)
		rv = tx_ready(c, p, dst);
	if (rv == PT_OK && item != NULL) {
		pthread_mutex_lock(&c->self_mu);
		if (c->self_tail)
			c->self_tail->next = item;
		else
			c->self_head = item;
		c->self_tail = item;
		pthread_mutex_unlock(&c->self_mu);
		queued = true;
	}
	if (rv == PT_OK)
		rv = pt_comm_send(c->control, dst, &out);
	if (rv != PT_OK && queued) {
		/* Never sent, so never taken: unlink it again. */
		pthread_mutex_lock(&c->self_mu);
		self_item **pp = &c->self_head, *last = NULL;
		while (*pp && *pp != item) {
			last = *pp;
			pp = &(*pp)->next;
		}
		if (*pp == item) {
			*pp = item->next;
			if (c->self_tail == item)
				c->self_tail = last;
		} else {
			item = NULL;
		}
		pthread_mutex_unlock(&c->self_mu);
	} else if (rv == PT_OK) {
		item = NULL; /* the receiving side owns it now */
	}
	if (rv == PT_OK) {
		p->next_seq++;
		if (tr.route == P_NCCL_DEVICE || tr.route == P_NCCL_HOST) {
			rv = transfer(c, true, p->tx, p->tx_stream, pt_tensor_data(t), nbytes,
			              tr.route == P_NCCL_HOST, dst);
			if (rv != PT_OK) {
				snprintf(p->tx_why, sizeof(p->tx_why), "%s", pt_last_error());
				/* The aborted send may still read t: its frees wait. */
				if (tr.route == P_NCCL_DEVICE)
					(void)compute_after(c, p->tx_stream);
				pair_abort(&p->tx, &p->tx_stream);
				p->tx_broken = true;
			}
		}
	}
	pthread_mutex_unlock(&p->send_mu);
out:
	if (item) {
		pt_tensor_fini(&item->t);
		free(item);
	}
	pt_tensor_fini(&packed);
	pt_msg_fini(&out);
	if (rv != PT_OK) {
		atomic_fetch_add(&c->n.errors, 1);
		return rv;
	}
	atomic_fetch_add(&c->n.msgs_sent, 1);
	atomic_fetch_add(&c->n.bytes_sent, nbytes + m->blob_len);
	atomic_fetch_add(&c->n.bytes_raw_sent, nbytes + m->blob_len);
	return PT_OK;
}

/* --------------------------------------------------------------- receive -- */

/* receive_payload fills m's tensor for a trailer routed over NCCL or to self. */
static pt_err receive_payload(nccl_comm *c, peer *p, int src, const trailer *tr, pt_msg *m)
{
	pt_err rv;
	if (tr->route == P_SELF) {
		self_item *it;
		pthread_mutex_lock(&c->self_mu);
		it = c->self_head;
		if (it) {
			c->self_head = it->next;
			if (c->self_head == NULL)
				c->self_tail = NULL;
		}
		pthread_mutex_unlock(&c->self_mu);
		if (it == NULL || src != c->base.rank || !trailer_matches(tr, &it->t)) {
			if (it) {
				pt_tensor_fini(&it->t);
				free(it);
			}
			return pt_set_error(PT_ERR_FORMAT,
			                    "rank %d: self message from rank %d "
			                    "without its tensor",
			                    c->base.rank, src);
		}
		m->tensor = it->t;
		m->has_tensor = true;
		m->writable = true; /* a device copy of its own */
		free(it);
		return PT_OK;
	}
	if (!c->gpu || p->rx == NULL)
		return pt_set_error(PT_ERR_FORMAT,
		                    "rank %d: NCCL tensor from rank %d without an NCCL "
		                    "communicator for it%s%s",
		                    c->base.rank, src, p->rx_why[0] ? ": " : "", p->rx_why);
	if (tr->route == P_NCCL_DEVICE) {
		/* Allocated on rx_stream, not zeroed (NCCL writes every byte), so the
		 * receive waits for nothing queued on the compute stream. */
		pt_storage *s;
		void *buf = NULL;
		cudaError_t e = cudaSetDevice(c->dev.index);
		if (e == cudaSuccess)
			e = cudaMallocAsync(&buf, tr->nbytes, p->rx_stream);
		if (e != cudaSuccess)
			return pt_set_error(PT_ERR_NOMEM,
			                    "rank %d: %llu bytes for a tensor from rank %d: %s",
			                    c->base.rank, (unsigned long long)tr->nbytes, src,
			                    cudaGetErrorString(e));
		if ((rv = pt_storage_wrap(&s, buf, tr->nbytes, c->dev)) != PT_OK) {
			cudaFreeAsync(buf, p->rx_stream);
			return rv;
		}
		/* The last release frees it with pt_backend_free on the compute
		 * stream, which compute_after orders after rx_stream below. */
		s->owns_data = true;
		rv = pt_tensor_init_on(&m->tensor, s, 0, (pt_dtype)tr->dtype, tr->ndim, tr->shape);
		pt_storage_release(s);
	} else {
		rv = pt_tensor_init(&m->tensor, (pt_dtype)tr->dtype, tr->ndim, tr->shape);
	}
	if (rv != PT_OK)
		return rv;
	m->has_tensor = true;
	m->writable = true; /* a fresh buffer */
	rv = transfer(c, false, p->rx, p->rx_stream, pt_tensor_data(&m->tensor), tr->nbytes,
	              tr->route == P_NCCL_HOST, src);
	if (tr->route == P_NCCL_DEVICE) {
		/* Success or not (an aborted receive may still write the buffer),
		 * compute and the buffer's free come after rx_stream. */
		cudaError_t e = compute_after(c, p->rx_stream);
		if (e != cudaSuccess) {
			/* Unordered: leaking the buffer is safe, freeing it is not. */
			m->tensor.storage->owns_data = false;
			if (rv == PT_OK)
				rv = cuda_fail(e, "ordering compute after a receive");
		}
	}
	if (rv != PT_OK)
		pair_abort(&p->rx, &p->rx_stream);
	return rv;
}

/* to_device replaces host tensor *t by a copy in this rank's device memory. */
static pt_err to_device(nccl_comm *c, pt_tensor *t)
{
	pt_storage *s;
	pt_tensor d;
	pt_err rv;
	PT_TRY(pt_storage_create(&s, pt_tensor_nbytes(t), c->dev));
	rv = pt_tensor_init_on(&d, s, 0, t->dtype, t->ndim, t->shape);
	pt_storage_release(s);
	if (rv == PT_OK)
		rv = pt_tensor_write(&d, pt_tensor_data(t), pt_tensor_nbytes(t));
	if (rv != PT_OK) {
		pt_tensor_fini(&d);
		return rv;
	}
	pt_tensor_fini(t);
	*t = d;
	return PT_OK;
}

static void queue_error(nccl_comm *c, int src, pt_err code)
{
	atomic_fetch_add(&c->n.errors, 1);
	pt_mailbox_push_error(c->mb, src, code, pt_last_error());
}

/* handle takes one control message (I/O thread). */
static void handle(nccl_comm *c, pt_msg *m)
{
	int src = m->meta.source;
	trailer tr;
	peer *p;
	pt_err rv;

	if (src < 0 || src >= c->base.world) {
		pt_set_error(PT_ERR_FORMAT, "rank %d: message from rank %d", c->base.rank, src);
		queue_error(c, -1, PT_ERR_FORMAT);
		pt_msg_fini(m);
		return;
	}
	p = &c->peers[src];
	if ((rv = take_trailer(m, &tr)) != PT_OK) {
		queue_error(c, src, rv);
		pt_msg_fini(m);
		return;
	}
	if (tr.what == T_HELLO) { /* a repeated hello: nothing to do */
		pt_msg_fini(m);
		return;
	}
	if (tr.what == T_INIT) {
		ncclUniqueId id;
		if (m->blob_len != sizeof(id) || !c->gpu) {
			pt_set_error(PT_ERR_FORMAT, "rank %d: NCCL id from rank %d of %zu bytes%s",
			             c->base.rank, src, m->blob_len,
			             c->gpu ? "" : " (no GPU here)");
			queue_error(c, src, PT_ERR_FORMAT);
		} else {
			memcpy(&id, m->blob, sizeof(id));
			pair_abort(&p->rx, &p->rx_stream);
			p->rx_why[0] = 0;
			if (pair_init(c, &id, 1, src, &p->rx, &p->rx_stream) != PT_OK) {
				/* Not queued: the sender retries once with a new id (after
				 * which this side must have memory too) and reports a
				 * final failure itself; a tensor that comes anyway names
				 * this reason. */
				snprintf(p->rx_why, sizeof(p->rx_why), "%s", pt_last_error());
				give_back_cache(c);
			}
		}
		pt_msg_fini(m);
		return;
	}
	if (tr.seq != p->expect_seq) {
		pt_set_error(PT_ERR_FORMAT,
		             "rank %d: sequence gap from rank %d: expected %llu, got %llu",
		             c->base.rank, src, (unsigned long long)p->expect_seq,
		             (unsigned long long)tr.seq);
		queue_error(c, src, PT_ERR_FORMAT);
	}
	p->expect_seq = tr.seq + 1;
	rv = PT_OK;
	switch (tr.route) {
	case P_NONE:
		if (m->has_tensor)
			rv = pt_set_error(PT_ERR_FORMAT, "rank %d: unannounced tensor from rank %d",
			                  c->base.rank, src);
		break;
	case P_CONTROL:
	case P_CONTROL_DEVICE:
		if (!m->has_tensor || !trailer_matches(&tr, &m->tensor))
			rv = pt_set_error(PT_ERR_FORMAT,
			                  "rank %d: tensor from rank %d differs from its trailer",
			                  c->base.rank, src);
		else if (tr.route == P_CONTROL_DEVICE && c->gpu) {
			rv = to_device(c, &m->tensor);
			m->writable = true; /* the device copy is this rank's */
		}
		break;
	default:
		if (m->has_tensor)
			rv = pt_set_error(PT_ERR_FORMAT, "rank %d: unannounced tensor from rank %d",
			                  c->base.rank, src);
		else
			rv = receive_payload(c, p, src, &tr, m);
		break;
	}
	if (rv != PT_OK) {
		queue_error(c, src, rv);
		pt_msg_fini(m);
		return;
	}
	m->meta.seq = tr.seq;
	if (pt_mailbox_push(c->mb, m) != PT_OK)
		pt_msg_fini(m);
}

/* poll_lost notices peers the control communicator lost (and drained). */
static void poll_lost(nccl_comm *c)
{
	for (int r = 0; r < c->base.world && !atomic_load(&c->closed); r++) {
		pt_msg m;
		pt_err rv;
		if (r == c->base.rank || c->peers[r].lost)
			continue;
		rv = pt_comm_recv(c->control, r, PT_CH_ANY, 0, &m);
		if (rv == PT_OK) {
			handle(c, &m);
		} else if (rv == PT_ERR_CLOSED && !atomic_load(&c->closed)) {
			c->peers[r].lost = true;
			pt_mailbox_mark_lost(c->mb, r);
		}
	}
}

static void *io_main(void *arg)
{
	nccl_comm *c = arg;
	long long last_poll = pt_now_ms();

	if (c->gpu)
		cudaSetDevice(c->dev.index);
	while (!atomic_load(&c->closed)) {
		pt_msg m;
		pt_err rv = pt_comm_recv_slice(c->control, PT_ANY_RANK, PT_CH_ANY, IO_POLL_MS, &m);
		if (atomic_load(&c->closed)) {
			if (rv == PT_OK)
				pt_msg_fini(&m);
			break;
		}
		if (rv == PT_OK)
			handle(c, &m);
		else if (rv == PT_ERR_CLOSED) /* every peer is gone: nothing more can come */
			poll_lost(c);
		else if (rv != PT_ERR_TIMEOUT)
			queue_error(c, -1, rv);
		if (rv != PT_OK || pt_now_ms() - last_poll >= IO_POLL_MS) {
			poll_lost(c);
			last_poll = pt_now_ms();
		}
		if (rv == PT_ERR_CLOSED)
			sleep_us(IO_POLL_MS * 1000L);
	}
	return NULL;
}

static pt_err nccl_recv(pt_comm *base, int src, pt_channel ch, int timeout_ms, pt_msg *out)
{
	nccl_comm *c = (nccl_comm *)base;
	pt_err rv;

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	rv = pt_mailbox_pop(c->mb, src, ch, timeout_ms, out);
	if (rv == PT_OK) {
		atomic_fetch_add(&c->n.msgs_recv, 1);
		atomic_fetch_add(&c->n.bytes_recv,
		                 out->blob_len +
		                     (out->has_tensor ? pt_tensor_nbytes(&out->tensor) : 0));
	} else if (rv == PT_ERR_TIMEOUT) {
		if (pt_comm_timeout_counts(timeout_ms)) /* an empty poll is not a timeout */
			atomic_fetch_add(&c->n.timeouts, 1);
		return pt_set_error(rv, "rank %d: no message within %d ms", base->rank, timeout_ms);
	}
	return rv;
}

static pt_err nccl_barrier(pt_comm *base, int timeout_ms)
{
	nccl_comm *c = (nccl_comm *)base;
	pt_err rv;
	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	rv = pt_comm_barrier(c->control, timeout_ms);
	if (rv == PT_ERR_TIMEOUT)
		atomic_fetch_add(&c->n.timeouts, 1);
	return rv;
}

static void nccl_close(pt_comm *base)
{
	nccl_comm *c = (nccl_comm *)base;
	if (atomic_exchange(&c->closed, true))
		return;
	pt_mailbox_close(c->mb);
	pt_comm_close(c->control);
}

/* free_comm releases everything but control (creation failures and destroy). */
static void free_comm(nccl_comm *c)
{
	if (c->io_started)
		pthread_join(c->io, NULL);
	for (int r = 0; c->peers && r < c->base.world; r++) {
		peer *p = &c->peers[r];
		pair_abort(&p->tx, &p->tx_stream);
		pair_abort(&p->rx, &p->rx_stream);
		pthread_mutex_destroy(&p->send_mu);
	}
	while (c->self_head) {
		self_item *it = c->self_head;
		c->self_head = it->next;
		pt_tensor_fini(&it->t);
		free(it);
	}
	pt_mailbox_destroy(c->mb);
	pthread_mutex_destroy(&c->self_mu);
	free(c->peers);
	free(c);
}

static void nccl_destroy(pt_comm *base)
{
	nccl_comm *c = (nccl_comm *)base;
	pt_comm *control = c->control;
	nccl_close(base);
	free_comm(c); /* joins the I/O thread, aborts pending NCCL work */
	pt_comm_destroy(control);
}

static pt_comm_stats nccl_stats(const pt_comm *base)
{
	return pt_comm_counters_get(&((const nccl_comm *)base)->n);
}

static const pt_comm_ops nccl_ops = {
    .name = "nccl",
    .device_tensors = true,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .close = nccl_close,
    .destroy = nccl_destroy,
    .stats = nccl_stats,
};

/* ---------------------------------------------------------------- create -- */

/* fingerprint names a GPU across processes and hosts: host name + PCI bus id
 * (FNV-1a). */
static pt_err device_fingerprint(pt_device dev, uint64_t *out)
{
	char host[256] = {0}, bus[64] = {0};
	uint64_t h = 0xcbf29ce484222325ull;
	CUDA_TRY(cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev.index));
	gethostname(host, sizeof(host) - 1);
	for (const char *s = host; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	h = (h ^ '/') * 0x100000001b3ull;
	for (const char *s = bus; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	*out = h | 1; /* never 0, the value of ranks without a GPU */
	return PT_OK;
}

static pt_err hello(nccl_comm *c, int timeout_ms)
{
	trailer tr = {.magic = TRAILER_MAGIC,
	              .version = TRAILER_VERSION,
	              .what = T_HELLO,
	              .dev_kind = c->dev.kind,
	              .dev_index = c->dev.index,
	              .seq = c->fingerprint};
	long long deadline = pt_now_ms() + timeout_ms;

	for (int r = 0; r < c->base.world; r++) {
		pt_msg m = {0};
		pt_err rv;
		if (r == c->base.rank)
			continue;
		m.meta.kind = PT_MSG_COMMAND;
		m.meta.tag = PT_NCCL_ID_TAG;
		rv = attach(&m, NULL, &tr);
		if (rv == PT_OK)
			rv = pt_comm_send(c->control, r, &m);
		pt_msg_fini(&m);
		PT_TRY(rv);
	}
	for (int r = 0; r < c->base.world; r++) {
		pt_msg m;
		trailer got;
		long long left = deadline - pt_now_ms();
		pt_err rv;
		if (r == c->base.rank)
			continue;
		rv = pt_comm_recv(c->control, r, PT_CH_CONTROL, left > 0 ? (int)left : 0, &m);
		if (rv != PT_OK)
			return pt_set_error(
			    rv, "NCCL communicator of rank %d: no hello from rank %d: %s",
			    c->base.rank, r, pt_last_error());
		rv = take_trailer(&m, &got);
		if (rv == PT_OK && (got.what != T_HELLO || m.meta.tag != PT_NCCL_ID_TAG ||
		                    (got.dev_kind != PT_DEV_CPU && got.dev_kind != PT_DEV_CUDA) ||
		                    got.dev_index < 0))
			rv =
			    pt_set_error(PT_ERR_FORMAT,
			                 "NCCL communicator of rank %d: rank %d's first message is "
			                 "not a hello (is it an NCCL communicator too?)",
			                 c->base.rank, r);
		pt_msg_fini(&m);
		PT_TRY(rv);
		c->peers[r].dev = (pt_device){(pt_device_kind)got.dev_kind, got.dev_index};
		c->peers[r].fingerprint = got.dev_kind == PT_DEV_CUDA ? got.seq : 0;
	}
	return PT_OK;
}

bool pt_nccl_built(void)
{
	return true;
}

pt_err pt_nccl_comm_create(pt_comm **out, pt_comm *control, pt_device dev, int timeout_ms)
{
	nccl_comm *c;
	pt_err rv;

	if (out == NULL || control == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_nccl_comm_create: NULL argument");
	*out = NULL;
	if (dev.kind == PT_DEV_CUDA) {
		char name[32];
		if (pt_backend_check_device(dev) != PT_OK) {
			char why[384];
			snprintf(why, sizeof(why), "%s", pt_last_error());
			return pt_set_error(PT_ERR_UNSUPPORTED, "NCCL communicator on %s: %s",
			                    pt_device_str(name, sizeof(name), dev), why);
		}
	} else if (dev.kind != PT_DEV_CPU) {
		return pt_set_error(PT_ERR_INVALID, "NCCL communicator: device kind %d", dev.kind);
	}
	if (timeout_ms < 0)
		timeout_ms = control->timeout_ms;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return pt_set_error(PT_ERR_NOMEM, "NCCL communicator");
	c->base.ops = &nccl_ops;
	c->base.rank = control->rank;
	c->base.world = control->world;
	c->base.timeout_ms = control->timeout_ms;
	c->control = control;
	c->dev = dev;
	c->gpu = dev.kind == PT_DEV_CUDA;
	pthread_mutex_init(&c->self_mu, NULL);
	c->peers = calloc((size_t)c->base.world, sizeof(peer));
	if (c->peers == NULL) {
		free_comm(c);
		return pt_set_error(PT_ERR_NOMEM, "NCCL communicator of %d ranks", c->base.world);
	}
	for (int r = 0; r < c->base.world; r++)
		pthread_mutex_init(&c->peers[r].send_mu, NULL);
	rv = pt_mailbox_create(&c->mb, c->base.world, c->base.rank);
	if (rv == PT_OK && c->gpu)
		rv = device_fingerprint(dev, &c->fingerprint);
	if (rv == PT_OK)
		rv = hello(c, timeout_ms);
	if (rv == PT_OK) {
		if (pthread_create(&c->io, NULL, io_main, c) != 0)
			rv = pt_set_error(PT_ERR_NOMEM, "NCCL communicator: no I/O thread");
		else
			c->io_started = true;
	}
	if (rv != PT_OK) {
		free_comm(c);
		return rv;
	}
	*out = &c->base;
	return PT_OK;
}
