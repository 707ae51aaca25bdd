/* stream.h - CPU streams, events and the per-stage stream manager (seed 000).
 *
 * A stream is an ordered work queue run by one worker thread: items run one at
 * a time in the order they were enqueued, so two streams run concurrently (a
 * communication stream overlaps a compute stream). An event is a fence: a
 * record enqueues a marker that completes the event when the worker reaches
 * it; a stream wait enqueues a barrier that holds the stream until the event's
 * latest record (at the time of the wait call) has completed, as with
 * cudaStreamWaitEvent. Host waits take a timeout in milliseconds (< 0: none).
 *
 * Limits: CPU only (a CUDA build would wrap cudaStream_t/cudaEvent_t behind the
 * same calls); an event waited on by a stream must outlive the wait.
 * Thread-safety: every call may be made from any thread; destroy must not race
 * with enqueues on the same stream.
 */
#ifndef PT_STREAM_H
#define PT_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "error.h"

typedef struct pt_stream pt_stream;
typedef struct pt_event pt_event;

/* pt_stream_fn is one work item: it runs on the stream's worker thread. */
typedef pt_err (*pt_stream_fn)(void *arg);
/* pt_stream_done is called once per item after it ran (rv is its result) or
 * when it was cancelled by pt_stream_destroy (rv is PT_ERR_CLOSED). */
typedef void (*pt_stream_done)(void *arg, pt_err rv);

/* pt_stream_create starts a stream and its worker; name is copied (for logs). */
pt_err pt_stream_create(pt_stream **out, const char *name);

/* pt_stream_destroy cancels items that have not started (their done callback
 * gets PT_ERR_CLOSED), waits for the running one and joins the worker.
 * Blocks; NULL-safe. */
void pt_stream_destroy(pt_stream *s);

/* pt_stream_enqueue appends fn(arg) (then done(arg, rv), done may be NULL).
 * Non-blocking. PT_ERR_CLOSED once the stream is being destroyed (neither
 * callback is called then). */
pt_err pt_stream_enqueue(pt_stream *s, pt_stream_fn fn, pt_stream_done done, void *arg);

/* pt_stream_sync blocks until everything enqueued before the call has run;
 * PT_ERR_TIMEOUT after timeout_ms (< 0: no limit). */
pt_err pt_stream_sync(pt_stream *s, int timeout_ms);

/* pt_stream_query returns true when the stream has nothing queued or running. */
bool pt_stream_query(pt_stream *s);

/* pt_stream_name returns the name given at creation. */
const char *pt_stream_name(const pt_stream *s);

/* pt_stream_is_current returns true on the stream's own worker thread. */
bool pt_stream_is_current(const pt_stream *s);

/* pt_event_create makes an event that has never been recorded (a wait on it
 * returns at once). */
pt_err pt_event_create(pt_event **out);

/* pt_event_destroy frees e. NULL-safe; no stream may still wait on it. */
void pt_event_destroy(pt_event *e);

/* pt_event_record enqueues a marker on s; e completes when s reaches it. */
pt_err pt_event_record(pt_event *e, pt_stream *s);

/* pt_stream_wait_event makes s hold every later item until e's latest record
 * (as of this call) completes. Non-blocking for the caller. */
pt_err pt_stream_wait_event(pt_stream *s, pt_event *e);

/* pt_event_query returns true when e's latest record has completed. */
bool pt_event_query(pt_event *e);

/* pt_event_wait blocks the caller until e's latest record completes;
 * PT_ERR_TIMEOUT after timeout_ms (< 0: no limit). */
pt_err pt_event_wait(pt_event *e, int timeout_ms);

/* ---- stream manager: n streams of one kind, round-robin ---- */

typedef struct pt_stream_manager pt_stream_manager;

/* pt_stream_manager_create starts n >= 1 streams named "<prefix>.<i>". */
pt_err pt_stream_manager_create(pt_stream_manager **out, const char *prefix, int n);

/* pt_stream_manager_destroy destroys every stream (see pt_stream_destroy). NULL-safe. */
void pt_stream_manager_destroy(pt_stream_manager *m);

/* pt_stream_manager_count returns the number of streams. */
int pt_stream_manager_count(const pt_stream_manager *m);

/* pt_stream_manager_next returns the next stream round-robin (thread-safe);
 * *index (may be NULL) gets its index. */
pt_stream *pt_stream_manager_next(pt_stream_manager *m, int *index);

/* pt_stream_manager_get returns stream `index` in *out; PT_ERR_RANGE for an
 * index outside [0, count). */
pt_err pt_stream_manager_get(pt_stream_manager *m, int index, pt_stream **out);

/* pt_stream_manager_for returns the stream of microbatch mb (mb mod count). */
pt_stream *pt_stream_manager_for(pt_stream_manager *m, int mb);

/* pt_stream_manager_sync waits for stream `index`; PT_ERR_RANGE, PT_ERR_TIMEOUT. */
pt_err pt_stream_manager_sync(pt_stream_manager *m, int index, int timeout_ms);

/* pt_stream_manager_sync_all waits for every stream within one deadline. */
pt_err pt_stream_manager_sync_all(pt_stream_manager *m, int timeout_ms);

/* pt_stream_manager_record records e on stream `index` (PT_ERR_RANGE). */
pt_err pt_stream_manager_record(pt_stream_manager *m, int index, pt_event *e);

/* pt_stream_manager_wait_event makes stream `index` wait for e (PT_ERR_RANGE). */
pt_err pt_stream_manager_wait_event(pt_stream_manager *m, int index, pt_event *e);

/* Helpers shared inside lib/exec: pt_exec_cond_init makes a condition
 * variable on CLOCK_MONOTONIC; pt_exec_deadline turns timeout_ms into an
 * absolute deadline on that clock (returns false for "no limit", ms < 0). */
pt_err pt_exec_cond_init(pthread_cond_t *c);
bool pt_exec_deadline(struct timespec *ts, int timeout_ms);

#endif
