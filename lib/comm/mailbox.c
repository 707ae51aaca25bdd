/* mailbox.c - per-(source, channel) FIFOs with blocking, timed receive.
 *
 * One mutex and one condition variable (CLOCK_MONOTONIC) per mailbox: pushes
 * broadcast, waiters re-check. Queues are singly linked lists of nodes stamped
 * with an arrival number; an "any" receive compares the heads of the matching
 * queues (at most world * PT_CH_COUNT of them) instead of scanning messages.
 * Errors live in their own short list, in arrival order.
 */
#include "mailbox.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct mb_node {
	struct mb_node *next;
	uint64_t order; /* arrival number */
	int source;     /* errors: -1 for unknown origin */
	pt_err code;    /* PT_OK for a message */
	char *text;     /* error detail (malloc'd) */
	pt_msg msg;
} mb_node;

typedef struct mb_queue {
	mb_node *head, *tail;
} mb_queue;

struct pt_mailbox {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int world, owner;
	mb_queue *queues; /* [source * PT_CH_COUNT + channel] */
	mb_queue errors;
	uint64_t next_order;
	size_t pending;
	bool closed;
	bool *lost;     /* [source] */
	int lost_peers; /* lost sources other than the owner */
};

static const char *channel_name(pt_channel ch)
{
	switch (ch) {
	case PT_CH_FORWARD:
		return "forward";
	case PT_CH_BACKWARD:
		return "backward";
	case PT_CH_CONTROL:
		return "control";
	case PT_CH_FORWARD_OR_CONTROL:
		return "forward or control";
	case PT_CH_BACKWARD_OR_CONTROL:
		return "backward or control";
	default:
		return "any";
	}
}

long long pt_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

pt_err pt_mailbox_create(pt_mailbox **out, int world, int owner)
{
	pt_mailbox *mb;
	pthread_condattr_t ca;

	*out = NULL;
	if (world <= 0 || owner < 0 || owner >= world)
		return pt_set_error(PT_ERR_RANGE, "mailbox of rank %d in a world of %d", owner,
		                    world);
	mb = calloc(1, sizeof(*mb));
	if (mb == NULL)
		return pt_set_error(PT_ERR_NOMEM, "mailbox");
	mb->queues = calloc((size_t)world * PT_CH_COUNT, sizeof(*mb->queues));
	mb->lost = calloc((size_t)world, sizeof(*mb->lost));
	if (mb->queues == NULL || mb->lost == NULL) {
		free(mb->queues);
		free(mb->lost);
		free(mb);
		return pt_set_error(PT_ERR_NOMEM, "mailbox queues for %d ranks", world);
	}
	mb->world = world;
	mb->owner = owner;
	pthread_mutex_init(&mb->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&mb->cv, &ca);
	pthread_condattr_destroy(&ca);
	*out = mb;
	return PT_OK;
}

static void node_free(mb_node *n)
{
	pt_msg_fini(&n->msg);
	free(n->text);
	free(n);
}

static void queue_free(mb_queue *q)
{
	mb_node *n = q->head;
	while (n) {
		mb_node *next = n->next;
		node_free(n);
		n = next;
	}
	q->head = q->tail = NULL;
}

static void drain_locked(pt_mailbox *mb)
{
	for (int i = 0; i < mb->world * PT_CH_COUNT; i++)
		queue_free(&mb->queues[i]);
	queue_free(&mb->errors);
	mb->pending = 0;
}

void pt_mailbox_drain(pt_mailbox *mb)
{
	if (mb == NULL)
		return;
	pthread_mutex_lock(&mb->mu);
	drain_locked(mb);
	pthread_mutex_unlock(&mb->mu);
}

void pt_mailbox_destroy(pt_mailbox *mb)
{
	if (mb == NULL)
		return;
	drain_locked(mb);
	pthread_cond_destroy(&mb->cv);
	pthread_mutex_destroy(&mb->mu);
	free(mb->queues);
	free(mb->lost);
	free(mb);
}

static void queue_append(mb_queue *q, mb_node *n)
{
	n->next = NULL;
	if (q->tail)
		q->tail->next = n;
	else
		q->head = n;
	q->tail = n;
}

static mb_node *queue_pop_head(mb_queue *q)
{
	mb_node *n = q->head;
	q->head = n->next;
	if (q->head == NULL)
		q->tail = NULL;
	return n;
}

pt_err pt_mailbox_push(pt_mailbox *mb, pt_msg *m)
{
	int src = m->meta.source;
	int ch = (int)m->meta.channel;
	mb_node *n;

	if (src < 0 || src >= mb->world || ch < 0 || ch >= PT_CH_COUNT)
		return pt_set_error(PT_ERR_RANGE, "mailbox push from rank %d on channel %d", src,
		                    ch);
	n = calloc(1, sizeof(*n));
	if (n == NULL)
		return pt_set_error(PT_ERR_NOMEM, "mailbox node");
	pthread_mutex_lock(&mb->mu);
	if (mb->closed) {
		pthread_mutex_unlock(&mb->mu);
		free(n);
		return pt_set_error(PT_ERR_CLOSED, "rank %d's communicator is closed", mb->owner);
	}
	n->msg = *m;
	n->source = src;
	n->order = mb->next_order++;
	queue_append(&mb->queues[src * PT_CH_COUNT + ch], n);
	mb->pending++;
	pthread_cond_broadcast(&mb->cv);
	pthread_mutex_unlock(&mb->mu);
	memset(m, 0, sizeof(*m));
	return PT_OK;
}

pt_err pt_mailbox_push_error(pt_mailbox *mb, int source, pt_err code, const char *text)
{
	mb_node *n = calloc(1, sizeof(*n));

	if (n == NULL || (n->text = strdup(text ? text : "")) == NULL) {
		free(n);
		return pt_set_error(PT_ERR_NOMEM, "mailbox error node");
	}
	n->source = source >= 0 && source < mb->world ? source : -1;
	n->code = code == PT_OK ? PT_ERR_FORMAT : code;
	pthread_mutex_lock(&mb->mu);
	if (mb->closed) {
		pthread_mutex_unlock(&mb->mu);
		node_free(n);
		return PT_ERR_CLOSED;
	}
	n->order = mb->next_order++;
	queue_append(&mb->errors, n);
	mb->pending++;
	pthread_cond_broadcast(&mb->cv);
	pthread_mutex_unlock(&mb->mu);
	return PT_OK;
}

/* take_locked removes and returns the earliest arrival matching (src, ch), or
 * NULL when none is queued. */
static mb_node *take_locked(pt_mailbox *mb, int src, pt_channel ch)
{
	int s0 = src == PT_ANY_RANK ? 0 : src, s1 = src == PT_ANY_RANK ? mb->world : src + 1;
	unsigned mask = ch == PT_CH_ANY                  ? (1u << PT_CH_COUNT) - 1
	                : ch == PT_CH_FORWARD_OR_CONTROL ? 1u << PT_CH_FORWARD | 1u << PT_CH_CONTROL
	                : ch == PT_CH_BACKWARD_OR_CONTROL
	                    ? 1u << PT_CH_BACKWARD | 1u << PT_CH_CONTROL
	                    : 1u << ch;
	mb_queue *best = NULL;
	mb_node *err, *prev = NULL;

	for (int s = s0; s < s1; s++)
		for (int c = 0; c < PT_CH_COUNT; c++) {
			mb_queue *q = &mb->queues[s * PT_CH_COUNT + c];
			if (!(mask & 1u << c))
				continue;
			if (q->head && (best == NULL || q->head->order < best->head->order))
				best = q;
		}
	for (err = mb->errors.head; err; prev = err, err = err->next)
		if (err->source < 0 || src == PT_ANY_RANK || err->source == src)
			break;
	if (err && (best == NULL || err->order < best->head->order)) {
		if (prev)
			prev->next = err->next;
		else
			mb->errors.head = err->next;
		if (mb->errors.tail == err)
			mb->errors.tail = prev;
		mb->pending--;
		return err;
	}
	if (best == NULL)
		return NULL;
	mb->pending--;
	return queue_pop_head(best);
}

pt_err pt_mailbox_pop(pt_mailbox *mb, int src, pt_channel ch, int timeout_ms, pt_msg *out)
{
	struct timespec deadline;
	mb_node *n = NULL;
	pt_err rv = PT_OK;
	bool closed = false;

	memset(out, 0, sizeof(*out));
	if (src != PT_ANY_RANK && (src < 0 || src >= mb->world))
		return pt_set_error(PT_ERR_RANGE, "receive from rank %d (world %d)", src,
		                    mb->world);
	if (!pt_channel_valid_recv(ch))
		return pt_set_error(PT_ERR_RANGE, "receive on channel %d", (int)ch);
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += timeout_ms / 1000;
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&mb->mu);
	for (;;) {
		bool gone;
		int w;

		if (mb->closed) {
			rv = PT_ERR_CLOSED;
			closed = true;
			break;
		}
		if ((n = take_locked(mb, src, ch)) != NULL)
			break;
		gone = src == PT_ANY_RANK ? mb->world > 1 && mb->lost_peers == mb->world - 1
		                          : mb->lost[src];
		if (gone) {
			rv = PT_ERR_CLOSED;
			break;
		}
		if (timeout_ms == 0) {
			rv = PT_ERR_TIMEOUT;
			break;
		}
		w = timeout_ms < 0 ? pthread_cond_wait(&mb->cv, &mb->mu)
		                   : pthread_cond_timedwait(&mb->cv, &mb->mu, &deadline);
		if (w == ETIMEDOUT) {
			closed = mb->closed;
			if (closed)
				rv = PT_ERR_CLOSED;
			else if ((n = take_locked(mb, src, ch)) == NULL)
				rv = PT_ERR_TIMEOUT;
			break;
		}
	}
	pthread_mutex_unlock(&mb->mu);

	if (n == NULL) {
		char who[32];
		if (src == PT_ANY_RANK)
			snprintf(who, sizeof(who), "any rank");
		else
			snprintf(who, sizeof(who), "rank %d", src);
		if (rv == PT_ERR_TIMEOUT)
			return pt_set_error(rv,
			                    "rank %d: nothing from %s on channel %s within %d ms",
			                    mb->owner, who, channel_name(ch), timeout_ms);
		if (!closed)
			return pt_set_error(rv, "rank %d: %s gone (peer lost)", mb->owner,
			                    src == PT_ANY_RANK ? "every peer is" : who);
		return pt_set_error(rv, "rank %d: communicator closed", mb->owner);
	}
	if (n->code != PT_OK) {
		rv = pt_set_error(n->code, "%s", n->text);
		node_free(n);
		return rv;
	}
	*out = n->msg;
	free(n);
	return PT_OK;
}

void pt_mailbox_close(pt_mailbox *mb)
{
	pthread_mutex_lock(&mb->mu);
	mb->closed = true;
	pthread_cond_broadcast(&mb->cv);
	pthread_mutex_unlock(&mb->mu);
}

bool pt_mailbox_is_closed(pt_mailbox *mb)
{
	bool c;
	pthread_mutex_lock(&mb->mu);
	c = mb->closed;
	pthread_mutex_unlock(&mb->mu);
	return c;
}

void pt_mailbox_mark_lost(pt_mailbox *mb, int source)
{
	if (source < 0 || source >= mb->world)
		return;
	pthread_mutex_lock(&mb->mu);
	if (!mb->lost[source]) {
		mb->lost[source] = true;
		if (source != mb->owner)
			mb->lost_peers++;
	}
	pthread_cond_broadcast(&mb->cv);
	pthread_mutex_unlock(&mb->mu);
}

bool pt_mailbox_is_lost(pt_mailbox *mb, int source)
{
	bool l;
	if (source < 0 || source >= mb->world)
		return false;
	pthread_mutex_lock(&mb->mu);
	l = mb->lost[source];
	pthread_mutex_unlock(&mb->mu);
	return l;
}

size_t pt_mailbox_pending(pt_mailbox *mb)
{
	size_t n;
	pthread_mutex_lock(&mb->mu);
	n = mb->pending;
	pthread_mutex_unlock(&mb->mu);
	return n;
}

pt_comm_stats pt_comm_counters_get(const pt_comm_counters *k)
{
	pt_comm_stats s = {
	    .msgs_sent = atomic_load(&k->msgs_sent),
	    .msgs_recv = atomic_load(&k->msgs_recv),
	    .bytes_sent = atomic_load(&k->bytes_sent),
	    .bytes_recv = atomic_load(&k->bytes_recv),
	    .bytes_raw_sent = atomic_load(&k->bytes_raw_sent),
	    .errors = atomic_load(&k->errors),
	    .timeouts = atomic_load(&k->timeouts),
	    .reconnects = atomic_load(&k->reconnects),
	};
	return s;
}
