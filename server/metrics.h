/* metrics.h - pipeserver's Prometheus metrics and the dashboard's JSON, both
 * rendered from the job manager's state (read through its reply builders, so
 * the manager needs no extra interface) plus request counters the API front
 * end feeds through pt_metrics_request.
 *
 * Series: server (requests by kind and result, request latency histogram,
 * queue length, jobs by state, uptime, build info), jobs (step, loss,
 * learning rate, gradient norm, samples and tokens per second, bubble
 * fraction), stages (busy seconds) and communicators (messages and bytes
 * by direction, errors, timeouts, reconnects, compression ratio; labelled
 * stage="coordinator" for rank 0; a stage on a worker process sends its
 * counters with each step's timeline, and has none in an async job). Jobs
 * are labelled job_id, not job: Prometheus sets its own `job` label on
 * every scraped series. A job that ended more than grace_s ago leaves the
 * per-job series.
 */
#ifndef PT_SERVER_METRICS_H
#define PT_SERVER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/api.h"
#include "error.h"
#include "jobs.h"

/* pt_metrics_buf is a growable text buffer; after an allocation failure
 * `failed` is set and further appends do nothing. */
typedef struct pt_metrics_buf {
	char *data;
	size_t len, cap;
	bool failed;
} pt_metrics_buf;

/* pt_metrics_buf_printf appends formatted text to b. */
void pt_metrics_buf_printf(pt_metrics_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* pt_metrics_buf_json_string appends s as a quoted, escaped JSON string. */
void pt_metrics_buf_json_string(pt_metrics_buf *b, const char *s);

/* pt_metrics_buf_fini frees b's memory; accepts a zeroed buffer. */
void pt_metrics_buf_fini(pt_metrics_buf *b);

typedef struct pt_metrics pt_metrics;

typedef struct pt_metrics_config {
	pt_jobs *jobs; /* not owned */
	const char *version;
	const char *device;
	double grace_s; /* ended jobs stay in the per-job series this long */
} pt_metrics_config;

/* pt_metrics_create allocates the renderer; PT_ERR_NOMEM. */
pt_err pt_metrics_create(pt_metrics **out, const pt_metrics_config *cfg);

/* pt_metrics_destroy frees m; accepts NULL. */
void pt_metrics_destroy(pt_metrics *m);

/* pt_metrics_request counts one answered API request and its latency in
 * seconds. Lock-free, callable from any thread (nng callbacks included). */
void pt_metrics_request(pt_api_kind kind, pt_api_code code, double seconds);

/* pt_metrics_render appends the Prometheus text format 0.0.4 exposition to
 * out. Serialised by m's own lock; takes the manager's lock only briefly. */
pt_err pt_metrics_render(pt_metrics *m, pt_metrics_buf *out);

/* pt_metrics_jobs_json appends the job list as a JSON array: id, name,
 * state, step, steps, the latest metrics and the latest checkpoint. */
pt_err pt_metrics_jobs_json(pt_metrics *m, pt_metrics_buf *out);

/* pt_metrics_points_json appends job's metric points with step > after (at
 * most max_points) as a JSON object {job, state, cursor, ended, points,
 * stage_busy_seconds, checkpoint}. PT_ERR_NOTFOUND for an unknown job. */
pt_err pt_metrics_points_json(pt_metrics *m, uint64_t job, int64_t after, int max_points,
                              pt_metrics_buf *out);

#endif
