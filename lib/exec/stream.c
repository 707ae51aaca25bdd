/* stream.c - CPU streams (a FIFO run by one worker thread), events (fences
 * counted by generation) and the round-robin stream manager.
 *
 * Event generations: each record takes the next generation number; the worker
 * that reaches the marker publishes it as completed. A wait snapshots the
 * latest generation at call time, so later records never extend an earlier
 * wait. Blocking waits inside a worker poll the stream's closing flag every
 * 20 ms, so destroy never hangs on an event that will not fire.
 */
#include "stream.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

typedef enum item_kind { ITEM_WORK, ITEM_RECORD, ITEM_WAIT } item_kind;

typedef struct item {
	struct item *next;
	item_kind kind;
	pt_stream_fn fn;
	pt_stream_done done;
	void *arg;
	pt_event *event;
	uint64_t gen; /* RECORD: generation it completes; WAIT: generation it needs */
} item;

struct pt_event {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t recorded;  /* latest generation handed out */
	uint64_t completed; /* latest generation reached */
};

struct pt_stream {
	pthread_mutex_t mu;
	pthread_cond_t work_cv; /* worker: an item arrived or closing */
	pthread_cond_t idle_cv; /* syncers: an item finished */
	item *head, *tail;
	uint64_t enqueued, finished;
	atomic_bool closing;
	bool running; /* worker is inside an item */
	pthread_t worker;
	char name[48];
};

pt_err pt_exec_cond_init(pthread_cond_t *c)
{
	pthread_condattr_t a;
	int rc;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	rc = pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
	return rc == 0 ? PT_OK : pt_set_error(PT_ERR_NOMEM, "condition variable: %s", strerror(rc));
}

bool pt_exec_deadline(struct timespec *ts, int timeout_ms)
{
	if (timeout_ms < 0)
		return false;
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
	return true;
}

/* ---- events ---- */

pt_err pt_event_create(pt_event **out)
{
	pt_event *e = calloc(1, sizeof(*e));
	*out = NULL;
	if (e == NULL)
		return pt_set_error(PT_ERR_NOMEM, "event");
	pthread_mutex_init(&e->mu, NULL);
	if (pt_exec_cond_init(&e->cv) != PT_OK) {
		pthread_mutex_destroy(&e->mu);
		free(e);
		return PT_ERR_NOMEM;
	}
	*out = e;
	return PT_OK;
}

void pt_event_destroy(pt_event *e)
{
	if (e == NULL)
		return;
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
	free(e);
}

static void event_complete(pt_event *e, uint64_t gen)
{
	pthread_mutex_lock(&e->mu);
	if (e->completed < gen)
		e->completed = gen;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

bool pt_event_query(pt_event *e)
{
	bool done;
	pthread_mutex_lock(&e->mu);
	done = e->completed >= e->recorded;
	pthread_mutex_unlock(&e->mu);
	return done;
}

/* Waits for generation gen until the deadline (timeout_ms < 0: none); with
 * stop set, polls *stop every 20 ms and gives up with PT_ERR_CLOSED. */
static pt_err event_wait_gen(pt_event *e, uint64_t gen, int timeout_ms, atomic_bool *stop)
{
	struct timespec end;
	bool has = pt_exec_deadline(&end, timeout_ms);
	pt_err rv = PT_OK;

	pthread_mutex_lock(&e->mu);
	while (e->completed < gen) {
		int rc;
		if (stop != NULL) {
			struct timespec slice;
			if (atomic_load(stop)) {
				rv = PT_ERR_CLOSED;
				break;
			}
			pt_exec_deadline(&slice, 20);
			pthread_cond_timedwait(&e->cv, &e->mu, &slice);
			continue;
		}
		rc = has ? pthread_cond_timedwait(&e->cv, &e->mu, &end)
		         : pthread_cond_wait(&e->cv, &e->mu);
		if (rc == ETIMEDOUT && e->completed < gen) {
			rv = PT_ERR_TIMEOUT;
			break;
		}
	}
	pthread_mutex_unlock(&e->mu);
	return rv;
}

pt_err pt_event_wait(pt_event *e, int timeout_ms)
{
	uint64_t gen;
	pt_err rv;
	pthread_mutex_lock(&e->mu);
	gen = e->recorded;
	pthread_mutex_unlock(&e->mu);
	if ((rv = event_wait_gen(e, gen, timeout_ms, NULL)) == PT_ERR_TIMEOUT)
		return pt_set_error(rv, "event wait: not complete after %d ms", timeout_ms);
	return rv;
}

/* ---- streams ---- */

static void *worker_main(void *arg)
{
	pt_stream *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		item *it;
		while (s->head == NULL && !atomic_load(&s->closing))
			pthread_cond_wait(&s->work_cv, &s->mu);
		if (atomic_load(&s->closing))
			break;
		it = s->head;
		s->head = it->next;
		if (s->head == NULL)
			s->tail = NULL;
		s->running = true;
		pthread_mutex_unlock(&s->mu);

		switch (it->kind) {
		case ITEM_WORK: {
			pt_err rv = it->fn(it->arg);
			if (rv != PT_OK)
				pt_debug("stream %s: item failed: %s", s->name, pt_last_error());
			if (it->done)
				it->done(it->arg, rv);
			break;
		}
		case ITEM_RECORD:
			event_complete(it->event, it->gen);
			break;
		case ITEM_WAIT:
			event_wait_gen(it->event, it->gen, -1, &s->closing);
			break;
		}
		free(it);

		pthread_mutex_lock(&s->mu);
		s->running = false;
		s->finished++;
		pthread_cond_broadcast(&s->idle_cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

pt_err pt_stream_create(pt_stream **out, const char *name)
{
	pt_stream *s = calloc(1, sizeof(*s));
	int rc;
	*out = NULL;
	if (s == NULL)
		return pt_set_error(PT_ERR_NOMEM, "stream");
	snprintf(s->name, sizeof(s->name), "%s", name ? name : "stream");
	pthread_mutex_init(&s->mu, NULL);
	if (pt_exec_cond_init(&s->work_cv) != PT_OK || pt_exec_cond_init(&s->idle_cv) != PT_OK) {
		free(s);
		return PT_ERR_NOMEM;
	}
	atomic_init(&s->closing, false);
	if ((rc = pthread_create(&s->worker, NULL, worker_main, s)) != 0) {
		pthread_cond_destroy(&s->work_cv);
		pthread_cond_destroy(&s->idle_cv);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return pt_set_error(PT_ERR_NOMEM, "stream %s: thread: %s", name, strerror(rc));
	}
	*out = s;
	return PT_OK;
}

void pt_stream_destroy(pt_stream *s)
{
	item *it;
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->mu);
	atomic_store(&s->closing, true);
	pthread_cond_broadcast(&s->work_cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->worker, NULL);
	/* The worker is gone: cancel what never started. */
	while ((it = s->head) != NULL) {
		s->head = it->next;
		if (it->kind == ITEM_WORK && it->done)
			it->done(it->arg, PT_ERR_CLOSED);
		if (it->kind == ITEM_RECORD)
			event_complete(it->event, it->gen); /* never leave a fence pending */
		free(it);
		s->finished++;
	}
	pthread_cond_destroy(&s->work_cv);
	pthread_cond_destroy(&s->idle_cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static pt_err push(pt_stream *s, item *it)
{
	pthread_mutex_lock(&s->mu);
	if (atomic_load(&s->closing)) {
		pthread_mutex_unlock(&s->mu);
		free(it);
		return pt_set_error(PT_ERR_CLOSED, "stream %s is closing", s->name);
	}
	if (s->tail)
		s->tail->next = it;
	else
		s->head = it;
	s->tail = it;
	s->enqueued++;
	pthread_cond_signal(&s->work_cv);
	pthread_mutex_unlock(&s->mu);
	return PT_OK;
}

static item *new_item(item_kind kind)
{
	item *it = calloc(1, sizeof(*it));
	if (it == NULL)
		pt_set_error(PT_ERR_NOMEM, "stream item");
	else
		it->kind = kind;
	return it;
}

pt_err pt_stream_enqueue(pt_stream *s, pt_stream_fn fn, pt_stream_done done, void *arg)
{
	item *it;
	if (s == NULL || fn == NULL)
		return pt_set_error(PT_ERR_INVALID, "stream enqueue: NULL stream or function");
	if ((it = new_item(ITEM_WORK)) == NULL)
		return PT_ERR_NOMEM;
	it->fn = fn;
	it->done = done;
	it->arg = arg;
	return push(s, it);
}

pt_err pt_stream_sync(pt_stream *s, int timeout_ms)
{
	struct timespec end;
	bool has = pt_exec_deadline(&end, timeout_ms);
	pt_err rv = PT_OK;
	uint64_t target;

	pthread_mutex_lock(&s->mu);
	target = s->enqueued;
	while (s->finished < target) {
		int rc = has ? pthread_cond_timedwait(&s->idle_cv, &s->mu, &end)
		             : pthread_cond_wait(&s->idle_cv, &s->mu);
		if (rc == ETIMEDOUT && s->finished < target) {
			rv = pt_set_error(
			    PT_ERR_TIMEOUT, "stream %s: %llu items still pending after %d ms",
			    s->name, (unsigned long long)(target - s->finished), timeout_ms);
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return rv;
}

bool pt_stream_query(pt_stream *s)
{
	bool idle;
	pthread_mutex_lock(&s->mu);
	idle = s->finished == s->enqueued;
	pthread_mutex_unlock(&s->mu);
	return idle;
}

const char *pt_stream_name(const pt_stream *s)
{
	return s->name;
}

bool pt_stream_is_current(const pt_stream *s)
{
	return pthread_equal(pthread_self(), s->worker);
}

pt_err pt_event_record(pt_event *e, pt_stream *s)
{
	item *it;
	uint64_t gen;
	pt_err rv;
	if (e == NULL || s == NULL)
		return pt_set_error(PT_ERR_INVALID, "event record: NULL event or stream");
	if ((it = new_item(ITEM_RECORD)) == NULL)
		return PT_ERR_NOMEM;
	it->event = e;
	pthread_mutex_lock(&e->mu);
	gen = it->gen = ++e->recorded;
	pthread_mutex_unlock(&e->mu);
	if ((rv = push(s, it)) != PT_OK)
		event_complete(e, gen); /* a closing stream: never leave a fence pending */
	return rv;
}

pt_err pt_stream_wait_event(pt_stream *s, pt_event *e)
{
	item *it;
	if (e == NULL || s == NULL)
		return pt_set_error(PT_ERR_INVALID, "stream wait: NULL event or stream");
	if ((it = new_item(ITEM_WAIT)) == NULL)
		return PT_ERR_NOMEM;
	it->event = e;
	pthread_mutex_lock(&e->mu);
	it->gen = e->recorded;
	pthread_mutex_unlock(&e->mu);
	return push(s, it);
}

/* ---- manager ---- */

struct pt_stream_manager {
	int n;
	atomic_uint next;
	pt_stream **streams;
};

pt_err pt_stream_manager_create(pt_stream_manager **out, const char *prefix, int n)
{
	pt_stream_manager *m;
	pt_err rv;
	*out = NULL;
	if (n < 1)
		return pt_set_error(PT_ERR_INVALID, "stream manager: %d streams (need >= 1)", n);
	if ((m = calloc(1, sizeof(*m))) == NULL ||
	    (m->streams = calloc((size_t)n, sizeof(*m->streams))) == NULL) {
		free(m);
		return pt_set_error(PT_ERR_NOMEM, "stream manager of %d", n);
	}
	atomic_init(&m->next, 0);
	for (int i = 0; i < n; i++) {
		char name[48];
		snprintf(name, sizeof(name), "%s.%d", prefix ? prefix : "stream", i);
		if ((rv = pt_stream_create(&m->streams[i], name)) != PT_OK) {
			pt_stream_manager_destroy(m);
			return rv;
		}
		m->n = i + 1;
	}
	*out = m;
	return PT_OK;
}

void pt_stream_manager_destroy(pt_stream_manager *m)
{
	if (m == NULL)
		return;
	for (int i = 0; i < m->n; i++)
		pt_stream_destroy(m->streams[i]);
	free(m->streams);
	free(m);
}

int pt_stream_manager_count(const pt_stream_manager *m)
{
	return m->n;
}

pt_stream *pt_stream_manager_next(pt_stream_manager *m, int *index)
{
	int i = (int)(atomic_fetch_add(&m->next, 1) % (unsigned)m->n);
	if (index)
		*index = i;
	return m->streams[i];
}

pt_err pt_stream_manager_get(pt_stream_manager *m, int index, pt_stream **out)
{
	if (index < 0 || index >= m->n)
		return pt_set_error(PT_ERR_RANGE, "stream index %d outside [0, %d)", index, m->n);
	*out = m->streams[index];
	return PT_OK;
}

pt_stream *pt_stream_manager_for(pt_stream_manager *m, int mb)
{
	int i = mb % m->n;
	return m->streams[i < 0 ? i + m->n : i];
}

pt_err pt_stream_manager_sync(pt_stream_manager *m, int index, int timeout_ms)
{
	pt_stream *s;
	PT_TRY(pt_stream_manager_get(m, index, &s));
	return pt_stream_sync(s, timeout_ms);
}

pt_err pt_stream_manager_sync_all(pt_stream_manager *m, int timeout_ms)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < m->n; i++) {
		int left = timeout_ms;
		if (timeout_ms >= 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			left = timeout_ms - (int)((now.tv_sec - start.tv_sec) * 1000 +
			                          (now.tv_nsec - start.tv_nsec) / 1000000);
			if (left < 0)
				left = 0;
		}
		PT_TRY(pt_stream_sync(m->streams[i], left));
	}
	return PT_OK;
}

pt_err pt_stream_manager_record(pt_stream_manager *m, int index, pt_event *e)
{
	pt_stream *s;
	PT_TRY(pt_stream_manager_get(m, index, &s));
	return pt_event_record(e, s);
}

pt_err pt_stream_manager_wait_event(pt_stream_manager *m, int index, pt_event *e)
{
	pt_stream *s;
	PT_TRY(pt_stream_manager_get(m, index, &s));
	return pt_stream_wait_event(s, e);
}
