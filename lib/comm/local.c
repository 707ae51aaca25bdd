/* local.c - the in-memory communicator: ranks are threads of one process.
 *
 * A pt_local_group holds one mailbox per rank and the barrier state. A send
 * pushes a message that shares the tensor's storage (a reference, no copy;
 * see comm.h) into the destination's mailbox and never blocks; a receive pops
 * from one's own mailbox. A non-contiguous tensor is packed into a new
 * contiguous one so receivers always get contiguous tensors. Closing a rank
 * marks it lost in every other mailbox: peers still receive what it sent,
 * then PT_ERR_CLOSED instead of waiting for their timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "mailbox.h"

struct pt_local_group {
	int world;
	pt_mailbox **boxes; /* [rank] */
	pthread_mutex_t mu; /* guards everything below */
	pthread_cond_t cv;  /* barrier progress and closes */
	bool *member;       /* [rank]: a communicator exists */
	bool *closed;       /* [rank]: that communicator was closed */
	int arrived;        /* ranks inside the current barrier generation */
	uint64_t generation;
};

typedef struct local_comm {
	pt_comm base;
	pt_local_group *g;
	pthread_mutex_t send_mu; /* orders seq assignment with the push */
	uint64_t *next_seq;      /* [dst] */
	atomic_bool closed;
	pt_comm_counters n;
} local_comm;

static const pt_comm_ops local_ops;

pt_err pt_local_group_create(pt_local_group **out, int world)
{
	pt_local_group *g;
	pthread_condattr_t ca;

	if (out == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_local_group_create: NULL out");
	*out = NULL;
	if (world <= 0 || world > 1 << 16)
		return pt_set_error(PT_ERR_RANGE, "local group of %d ranks", world);
	g = calloc(1, sizeof(*g));
	if (g == NULL)
		return pt_set_error(PT_ERR_NOMEM, "local group");
	g->world = world;
	g->boxes = calloc((size_t)world, sizeof(*g->boxes));
	g->member = calloc((size_t)world, sizeof(*g->member));
	g->closed = calloc((size_t)world, sizeof(*g->closed));
	if (g->boxes == NULL || g->member == NULL || g->closed == NULL) {
		free(g->boxes);
		free(g->member);
		free(g->closed);
		free(g);
		return pt_set_error(PT_ERR_NOMEM, "local group of %d ranks", world);
	}
	for (int r = 0; r < world; r++) {
		pt_err rv = pt_mailbox_create(&g->boxes[r], world, r);
		if (rv != PT_OK) {
			for (int k = 0; k < r; k++)
				pt_mailbox_destroy(g->boxes[k]);
			free(g->boxes);
			free(g->member);
			free(g->closed);
			free(g);
			return rv;
		}
	}
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	*out = g;
	return PT_OK;
}

void pt_local_group_destroy(pt_local_group *g)
{
	if (g == NULL)
		return;
	for (int r = 0; r < g->world; r++)
		pt_mailbox_destroy(g->boxes[r]);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g->boxes);
	free(g->member);
	free(g->closed);
	free(g);
}

pt_err pt_local_comm_create(pt_comm **out, pt_local_group *g, int rank)
{
	local_comm *c;

	if (out == NULL || g == NULL)
		return pt_set_error(PT_ERR_INVALID, "pt_local_comm_create: NULL argument");
	*out = NULL;
	if (rank < 0 || rank >= g->world)
		return pt_set_error(PT_ERR_RANGE, "local rank %d outside [0, %d)", rank, g->world);
	c = calloc(1, sizeof(*c));
	if (c == NULL || (c->next_seq = calloc((size_t)g->world, sizeof(uint64_t))) == NULL) {
		free(c);
		return pt_set_error(PT_ERR_NOMEM, "local communicator");
	}
	pthread_mutex_lock(&g->mu);
	if (g->member[rank]) {
		pthread_mutex_unlock(&g->mu);
		free(c->next_seq);
		free(c);
		return pt_set_error(PT_ERR_STATE, "local rank %d already has a communicator", rank);
	}
	g->member[rank] = true;
	pthread_mutex_unlock(&g->mu);
	c->base.ops = &local_ops;
	c->base.rank = rank;
	c->base.world = g->world;
	c->base.timeout_ms = PT_COMM_TIMEOUT_DEFAULT_MS;
	c->g = g;
	pthread_mutex_init(&c->send_mu, NULL);
	*out = &c->base;
	return PT_OK;
}

/* copy_msg makes the message a receiver gets: same meta, the tensor shared
 * (or packed when strided), the blob copied. */
static pt_err copy_msg(pt_msg *dst, const pt_msg *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->meta = src->meta;
	if (src->has_tensor) {
		dst->has_tensor = true;
		dst->writable = src->writable;
		if (pt_tensor_is_contiguous(&src->tensor)) {
			pt_tensor_view(&dst->tensor, &src->tensor);
		} else {
			pt_err rv = pt_tensor_init(&dst->tensor, src->tensor.dtype,
			                           src->tensor.ndim, src->tensor.shape);
			dst->writable = true; /* a packed copy of its own */
			if (rv == PT_OK)
				rv = pt_tensor_read(&src->tensor, pt_tensor_data(&dst->tensor),
				                    pt_tensor_nbytes(&dst->tensor));
			if (rv != PT_OK) {
				pt_msg_fini(dst);
				return rv;
			}
		}
	}
	if (src->blob_len > 0) {
		pt_err rv = pt_msg_set_blob(dst, src->blob, src->blob_len);
		if (rv != PT_OK) {
			pt_msg_fini(dst);
			return rv;
		}
	}
	return PT_OK;
}

static pt_err local_send(pt_comm *base, int dst, const pt_msg *m)
{
	local_comm *c = (local_comm *)base;
	pt_msg copy;
	pt_err rv;
	size_t bytes = m->blob_len + (m->has_tensor ? pt_tensor_nbytes(&m->tensor) : 0);

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	PT_TRY(copy_msg(&copy, m));
	/* Counted before the receiver can have it, so a snapshot taken after
	 * the receiver got it (or a reply to it) includes it. */
	atomic_fetch_add(&c->n.msgs_sent, 1);
	atomic_fetch_add(&c->n.bytes_sent, bytes);
	atomic_fetch_add(&c->n.bytes_raw_sent, bytes);
	pthread_mutex_lock(&c->send_mu);
	copy.meta.seq = c->next_seq[dst];
	rv = pt_mailbox_push(c->g->boxes[dst], &copy);
	if (rv == PT_OK)
		c->next_seq[dst]++;
	pthread_mutex_unlock(&c->send_mu);
	if (rv != PT_OK) {
		atomic_fetch_sub(&c->n.msgs_sent, 1);
		atomic_fetch_sub(&c->n.bytes_sent, bytes);
		atomic_fetch_sub(&c->n.bytes_raw_sent, bytes);
		pt_msg_fini(&copy);
		atomic_fetch_add(&c->n.errors, 1);
		if (rv == PT_ERR_CLOSED)
			return pt_set_error(rv, "rank %d: destination rank %d is closed",
			                    base->rank, dst);
		return rv;
	}
	return PT_OK;
}

static pt_err local_recv(pt_comm *base, int src, pt_channel ch, int timeout_ms, pt_msg *out)
{
	local_comm *c = (local_comm *)base;
	pt_err rv;

	if (atomic_load(&c->closed))
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	rv = pt_mailbox_pop(c->g->boxes[base->rank], src, ch, timeout_ms, out);
	if (rv == PT_OK) {
		atomic_fetch_add(&c->n.msgs_recv, 1);
		atomic_fetch_add(&c->n.bytes_recv,
		                 out->blob_len +
		                     (out->has_tensor ? pt_tensor_nbytes(&out->tensor) : 0));
	} else if (rv == PT_ERR_TIMEOUT && pt_comm_timeout_counts(timeout_ms)) {
		atomic_fetch_add(&c->n.timeouts, 1); /* an empty poll is not a timeout */
	}
	return rv;
}

/* A generation barrier over the group: the last rank to arrive starts the next
 * generation and wakes the others. A rank that times out (or is closed) takes
 * its arrival back, so the group's count stays right for a later attempt. */
static pt_err local_barrier(pt_comm *base, int timeout_ms)
{
	local_comm *c = (local_comm *)base;
	pt_local_group *g = c->g;
	struct timespec deadline;
	uint64_t gen;
	pt_err rv = PT_OK;
	int gone = -1;

	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += timeout_ms / 1000;
	deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&g->mu);
	if (g->closed[base->rank]) {
		pthread_mutex_unlock(&g->mu);
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", base->rank);
	}
	gen = g->generation;
	if (++g->arrived == g->world) {
		g->arrived = 0;
		g->generation++;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
		return PT_OK;
	}
	while (g->generation == gen) {
		for (int r = 0; r < g->world && gone < 0; r++)
			if (g->closed[r])
				gone = r;
		if (gone >= 0) {
			rv = PT_ERR_CLOSED;
			break;
		}
		if (pthread_cond_timedwait(&g->cv, &g->mu, &deadline) == ETIMEDOUT &&
		    g->generation == gen) {
			rv = PT_ERR_TIMEOUT;
			break;
		}
	}
	if (rv != PT_OK)
		g->arrived--;
	pthread_mutex_unlock(&g->mu);
	if (rv == PT_ERR_TIMEOUT) {
		atomic_fetch_add(&c->n.timeouts, 1);
		return pt_set_error(rv, "rank %d: barrier not complete within %d ms", base->rank,
		                    timeout_ms);
	}
	if (rv == PT_ERR_CLOSED)
		return pt_set_error(rv, "rank %d: barrier abandoned, rank %d is closed", base->rank,
		                    gone);
	return PT_OK;
}

static void local_close(pt_comm *base)
{
	local_comm *c = (local_comm *)base;
	pt_local_group *g = c->g;

	if (atomic_exchange(&c->closed, true))
		return;
	pt_mailbox_close(g->boxes[base->rank]);
	for (int r = 0; r < g->world; r++)
		if (r != base->rank)
			pt_mailbox_mark_lost(g->boxes[r], base->rank);
	pthread_mutex_lock(&g->mu);
	g->closed[base->rank] = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

static void local_destroy(pt_comm *base)
{
	local_comm *c = (local_comm *)base;

	local_close(base);
	/* Give the memory of what nobody will receive back now, not at group end. */
	pt_mailbox_drain(c->g->boxes[base->rank]);
	pthread_mutex_destroy(&c->send_mu);
	free(c->next_seq);
	free(c);
}

static pt_comm_stats local_stats(const pt_comm *base)
{
	return pt_comm_counters_get(&((const local_comm *)base)->n);
}

static const pt_comm_ops local_ops = {
    .name = "local",
    .send = local_send,
    .recv = local_recv,
    .barrier = local_barrier,
    .close = local_close,
    .destroy = local_destroy,
    .stats = local_stats,
};
