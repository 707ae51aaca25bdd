/* metrics.c - Prometheus text and dashboard JSON from the job manager's
 * replies (see metrics.h).
 *
 * The manager's ListJobs, GetJob and WatchMetrics reply builders give a
 * consistent snapshot under its lock; we parse those buffers back, so a
 * scrape holds the manager's lock only while it copies one ListJobs reply and
 * formats text under our own lock. Per-stage totals (busy seconds, the
 * communicators' counters) come with each JobInfo (its `stages`).
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fb.h"
#include "job.h"

#define N_BUCKETS 14

static const double bucket_le[N_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                            0.1,    0.25,  0.5,    1,     2.5,  5,     10};

/* Request counters: process-wide, so the API front end needs no handle. */
static atomic_uint_fast64_t req_count[PT_API_KIND_COUNT][PT_API_CODE_COUNT];
static atomic_uint_fast64_t req_bucket[N_BUCKETS + 1]; /* last: over 10 s */
static atomic_uint_fast64_t req_sum_ns;

struct pt_metrics {
	pt_metrics_config cfg;
	char *version, *device;
	double started; /* monotonic seconds */
	pthread_mutex_t mu;
	pt_fb_builder lb, wb; /* list (or get) and watch replies */
};

static double now_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_unix(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------- buffer -- */

void pt_metrics_buf_printf(pt_metrics_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->failed)
		return;
	for (;;) {
		size_t room = b->cap - b->len;
		va_start(ap, fmt);
		n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->failed = true;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap * 2 : 4096;
		while (cap - b->len <= (size_t)n)
			cap *= 2;
		char *p = realloc(b->data, cap);
		if (p == NULL) {
			b->failed = true;
			return;
		}
		b->data = p;
		b->cap = cap;
	}
}

void pt_metrics_buf_json_string(pt_metrics_buf *b, const char *s)
{
	pt_metrics_buf_printf(b, "\"");
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			pt_metrics_buf_printf(b, "\\%c", c);
		else if (c < 0x20 || c == '<' || c == '>' || c == '&')
			pt_metrics_buf_printf(b, "\\u%04x", c); /* safe inside HTML too */
		else
			pt_metrics_buf_printf(b, "%c", c);
	}
	pt_metrics_buf_printf(b, "\"");
}

void pt_metrics_buf_fini(pt_metrics_buf *b)
{
	if (b == NULL)
		return;
	free(b->data);
	memset(b, 0, sizeof(*b));
}

/* json_num appends v, or null for NaN and infinities (JSON has neither). */
static void json_num(pt_metrics_buf *b, double v)
{
	if (isfinite(v))
		pt_metrics_buf_printf(b, "%.9g", v);
	else
		pt_metrics_buf_printf(b, "null");
}

/* prom_num appends v in the text format's spelling of specials. */
static void prom_num(pt_metrics_buf *b, double v)
{
	if (isnan(v))
		pt_metrics_buf_printf(b, "NaN");
	else if (isinf(v))
		pt_metrics_buf_printf(b, v > 0 ? "+Inf" : "-Inf");
	else
		pt_metrics_buf_printf(b, "%.17g", v);
}

/* ------------------------------------------------------------ requests -- */

void pt_metrics_request(pt_api_kind kind, pt_api_code code, double seconds)
{
	size_t i = 0;

	if ((unsigned)kind >= PT_API_KIND_COUNT)
		kind = PT_API_NONE;
	if ((unsigned)code >= PT_API_CODE_COUNT)
		code = PT_API_INTERNAL;
	if (!(seconds >= 0))
		seconds = 0;
	atomic_fetch_add_explicit(&req_count[kind][code], 1, memory_order_relaxed);
	while (i < N_BUCKETS && seconds > bucket_le[i])
		i++;
	atomic_fetch_add_explicit(&req_bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&req_sum_ns, (uint_fast64_t)(seconds * 1e9),
	                          memory_order_relaxed);
}

/* ------------------------------------------------------------ lifetime -- */

pt_err pt_metrics_create(pt_metrics **out, const pt_metrics_config *cfg)
{
	pt_metrics *m = calloc(1, sizeof(*m));

	*out = NULL;
	if (m == NULL)
		return pt_set_error(PT_ERR_NOMEM, "metrics");
	m->cfg = *cfg;
	m->version = strdup(cfg->version ? cfg->version : "");
	m->device = strdup(cfg->device ? cfg->device : "");
	pthread_mutex_init(&m->mu, NULL);
	m->started = now_mono();
	if (m->version == NULL || m->device == NULL ||
	    pt_fb_builder_init(&m->lb, 1 << 16) != PT_OK ||
	    pt_fb_builder_init(&m->wb, 1 << 16) != PT_OK) {
		pt_metrics_destroy(m);
		return pt_set_error(PT_ERR_NOMEM, "metrics");
	}
	*out = m;
	return PT_OK;
}

void pt_metrics_destroy(pt_metrics *m)
{
	if (m == NULL)
		return;
	pt_fb_builder_fini(&m->lb);
	pt_fb_builder_fini(&m->wb);
	pthread_mutex_destroy(&m->mu);
	free(m->version);
	free(m->device);
	free(m);
}

/* ---------------------------------------------------------- job state -- */

/* list_jobs builds and parses ListJobs into *r (a view into m->lb). */
static pt_err list_jobs(pt_metrics *m, pt_api_response *r)
{
	const uint8_t *data;
	size_t size;

	PT_TRY(pt_jobs_reply_list(m->cfg.jobs, 0, &m->lb, &data, &size));
	return pt_api_parse_response(data, size, r);
}

/* watch builds and parses the points of job after cursor (no waiting). */
static pt_err watch(pt_metrics *m, uint64_t job, int64_t cursor, int max_points, pt_api_response *r)
{
	pt_api_request q;
	const uint8_t *data;
	size_t size;
	bool parked = false;

	pt_api_request_init(&q, PT_API_WATCH_METRICS);
	q.job = job;
	q.cursor = cursor;
	q.wait_ms = 0;
	q.max_points = max_points;
	PT_TRY(pt_jobs_reply_watch(m->cfg.jobs, &q, NULL, &m->wb, &data, &size, &parked));
	return pt_api_parse_response(data, size, r);
}

/* is_live tells whether a job still has per-job series. */
static bool is_live(const pt_metrics *m, const pt_api_job_info *j, double now)
{
	return !pt_api_job_state_final(j->state) || j->finished_unix <= 0 ||
	       now - j->finished_unix <= m->cfg.grace_s;
}

/* ------------------------------------------------------------- render -- */

static void family(pt_metrics_buf *b, const char *name, const char *type, const char *help)
{
	pt_metrics_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

typedef double (*point_field)(const pt_api_metric_point *p);
static double f_loss(const pt_api_metric_point *p)
{
	return p->loss;
}
static double f_lr(const pt_api_metric_point *p)
{
	return p->learning_rate;
}
static double f_gnorm(const pt_api_metric_point *p)
{
	return p->grad_norm;
}
static double f_sps(const pt_api_metric_point *p)
{
	return p->samples_per_second;
}
static double f_tps(const pt_api_metric_point *p)
{
	return p->tokens_per_second;
}
static double f_bubble(const pt_api_metric_point *p)
{
	return p->bubble;
}

static const struct {
	const char *name, *help;
	point_field get;
} job_gauges[] = {
    {"pipetrain_job_loss", "Training loss at the latest step.", f_loss},
    {"pipetrain_job_learning_rate", "Learning rate at the latest step.", f_lr},
    {"pipetrain_job_gradient_norm", "Global gradient norm at the latest step.", f_gnorm},
    {"pipetrain_job_samples_per_second", "Training samples per second at the latest step.", f_sps},
    {"pipetrain_job_tokens_per_second", "Training tokens per second at the latest step.", f_tps},
    {"pipetrain_job_bubble_ratio", "Fraction of stage time idle in the latest step (0..1).",
     f_bubble},
};

/* Communicator counters per job and rank; a family's rows follow its first
 * entry (the one with help). */
static const struct {
	const char *name, *help, *direction; /* direction: label value, or NULL */
	size_t field;                        /* offsetof a uint64_t in pt_api_stage_stats */
} comm_counters[] = {
    {"pipetrain_comm_messages_total", "Messages a pipeline rank's communicator sent or received.",
     "sent", offsetof(pt_api_stage_stats, messages_sent)},
    {"pipetrain_comm_messages_total", NULL, "received",
     offsetof(pt_api_stage_stats, messages_received)},
    {"pipetrain_comm_bytes_total",
     "Bytes a pipeline rank's communicator sent or received on the wire (after compression).",
     "sent", offsetof(pt_api_stage_stats, bytes_sent)},
    {"pipetrain_comm_bytes_total", NULL, "received", offsetof(pt_api_stage_stats, bytes_received)},
    {"pipetrain_comm_errors_total",
     "Failed sends, malformed arrivals, and frames dropped because they failed authentication.",
     NULL, offsetof(pt_api_stage_stats, errors)},
    {"pipetrain_comm_timeouts_total", "Receives and barriers that timed out.", NULL,
     offsetof(pt_api_stage_stats, timeouts)},
    {"pipetrain_comm_reconnects_total", "Connections to a peer made again after one dropped.", NULL,
     offsetof(pt_api_stage_stats, reconnects)},
};

/* comm_labels appends the labels of one rank: the coordinator is stage
 * "coordinator", stages their 0-based index. */
static void comm_labels(pt_metrics_buf *b, const char *name, uint64_t job,
                        const pt_api_stage_stats *st)
{
	if (st->stage < 0)
		pt_metrics_buf_printf(b, "%s{job_id=\"%" PRIu64 "\",stage=\"coordinator\"", name,
		                      job);
	else
		pt_metrics_buf_printf(b, "%s{job_id=\"%" PRIu64 "\",stage=\"%d\"", name, job,
		                      st->stage);
}

/* render_comm appends the communicator series of ranks that reported them
 * (an async job's stages on worker processes send none). */
static pt_err render_comm(pt_metrics_buf *b, const pt_api_job_info *live, size_t n_live)
{
	pt_api_stage_stats st;

	for (size_t c = 0; c < sizeof(comm_counters) / sizeof(comm_counters[0]); c++) {
		if (comm_counters[c].help)
			family(b, comm_counters[c].name, "counter", comm_counters[c].help);
		for (size_t i = 0; i < n_live; i++)
			for (size_t k = 0; k < live[i].n_stages; k++) {
				uint64_t v;
				PT_TRY(pt_api_job_stage(&live[i], k, &st));
				if (!st.has_comm)
					continue;
				memcpy(&v, (const char *)&st + comm_counters[c].field, sizeof(v));
				comm_labels(b, comm_counters[c].name, live[i].id, &st);
				if (comm_counters[c].direction)
					pt_metrics_buf_printf(b, ",direction=\"%s\"",
					                      comm_counters[c].direction);
				pt_metrics_buf_printf(b, "} %" PRIu64 "\n", v);
			}
	}
	family(b, "pipetrain_comm_compression_ratio", "gauge",
	       "Bytes sent before compression over bytes sent on the wire (1: none or nothing "
	       "sent).");
	for (size_t i = 0; i < n_live; i++)
		for (size_t k = 0; k < live[i].n_stages; k++) {
			PT_TRY(pt_api_job_stage(&live[i], k, &st));
			if (!st.has_comm)
				continue;
			comm_labels(b, "pipetrain_comm_compression_ratio", live[i].id, &st);
			pt_metrics_buf_printf(
			    b, "} %.6g\n",
			    st.bytes_sent ? (double)st.bytes_raw_sent / st.bytes_sent : 1.0);
		}
	return PT_OK;
}

pt_err pt_metrics_render(pt_metrics *m, pt_metrics_buf *b)
{
	static const char *const kind_names[] = {
#define KN(name, str) str,
	    PT_API_KINDS(KN)
#undef KN
	};
	static const char *const code_names[] = {
#define CN(name, str) str,
	    PT_API_CODES(CN)
#undef CN
	};
	pt_api_response r;
	pt_api_job_info *live = NULL;
	size_t n_live = 0;
	int by_state[PT_JOB_STATE_COUNT] = {0};
	double now = now_unix();
	uint_fast64_t cum = 0;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	if ((rv = list_jobs(m, &r)) != PT_OK)
		goto out;
	if (r.n_jobs && (live = calloc(r.n_jobs, sizeof(*live))) == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "metrics");
		goto out;
	}
	for (size_t i = 0; i < r.n_jobs; i++) {
		pt_api_job_info j;
		if ((rv = pt_api_response_job(&r, i, &j)) != PT_OK)
			goto out;
		if ((unsigned)j.state < PT_JOB_STATE_COUNT)
			by_state[j.state]++;
		if (is_live(m, &j, now))
			live[n_live++] = j;
	}

	family(b, "pipetrain_build_info", "gauge", "Version and default device; always 1.");
	pt_metrics_buf_printf(b, "pipetrain_build_info{version=\"%s\",device=\"%s\"} 1\n",
	                      m->version, m->device);
	family(b, "pipetrain_uptime_seconds", "gauge", "Seconds since the server started.");
	pt_metrics_buf_printf(b, "pipetrain_uptime_seconds %.3f\n", now_mono() - m->started);
	family(b, "pipetrain_queue_length", "gauge", "Jobs waiting for a device.");
	pt_metrics_buf_printf(b, "pipetrain_queue_length %d\n", by_state[PT_JOB_QUEUED]);
	family(b, "pipetrain_jobs", "gauge", "Jobs known to the server, by state.");
	for (int s = 0; s < PT_JOB_STATE_COUNT; s++)
		pt_metrics_buf_printf(b, "pipetrain_jobs{state=\"%s\"} %d\n",
		                      pt_api_job_state_name((pt_api_job_state)s), by_state[s]);
	{
		static const double le[] = {0.01, 0.1, 1, 10, 60, 600, 3600};
		uint64_t cnt[sizeof(le) / sizeof(le[0]) + 1] = {0};
		double sum = 0;
		uint64_t n = 0;
		for (size_t i = 0; i < r.n_jobs; i++) {
			pt_api_job_info j;
			double w;
			if (pt_api_response_job(&r, i, &j) != PT_OK || j.started_unix <= 0)
				continue;
			w = j.started_unix - j.submitted_unix;
			w = w > 0 ? w : 0;
			for (size_t k = 0; k < sizeof(le) / sizeof(le[0]); k++)
				cnt[k] += w <= le[k];
			sum += w;
			n++;
		}
		family(b, "pipetrain_queue_wait_seconds", "histogram",
		       "Seconds each job known to the server waited from submit to its (latest) "
		       "start.");
		for (size_t k = 0; k < sizeof(le) / sizeof(le[0]); k++)
			pt_metrics_buf_printf(
			    b, "pipetrain_queue_wait_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
			    le[k], cnt[k]);
		pt_metrics_buf_printf(b,
		                      "pipetrain_queue_wait_seconds_bucket{le=\"+Inf\"} %" PRIu64
		                      "\n"
		                      "pipetrain_queue_wait_seconds_sum %.6f\n"
		                      "pipetrain_queue_wait_seconds_count %" PRIu64 "\n",
		                      n, sum, n);
		family(b, "pipetrain_devices_in_use", "gauge",
		       "The server's own devices running a job's stages now.");
		pt_metrics_buf_printf(b, "pipetrain_devices_in_use %d\n",
		                      pt_jobs_devices_in_use(m->cfg.jobs));
	}
	{
		int32_t all, free_n, busy, gone;
		pt_jobs_pool_counts(m->cfg.jobs, &all, &free_n, &busy, &gone);
		family(b, "pipetrain_workers", "gauge",
		       "Workers of the pool (--pool), by state: free (idle, lent to no job, not "
		       "draining), busy, unreachable, other (draining or not yet probed).");
		pt_metrics_buf_printf(b,
		                      "pipetrain_workers{state=\"free\"} %d\n"
		                      "pipetrain_workers{state=\"busy\"} %d\n"
		                      "pipetrain_workers{state=\"unreachable\"} %d\n"
		                      "pipetrain_workers{state=\"other\"} %d\n",
		                      free_n, busy, gone, all - free_n - busy - gone);
	}

	family(b, "pipetrain_api_requests_total", "counter",
	       "API requests answered, by request kind and result code.");
	for (int k = 0; k < PT_API_KIND_COUNT; k++)
		for (int c = 0; c < PT_API_CODE_COUNT; c++) {
			uint_fast64_t n =
			    atomic_load_explicit(&req_count[k][c], memory_order_relaxed);
			if (n)
				pt_metrics_buf_printf(b,
				                      "pipetrain_api_requests_total{kind=\"%s\","
				                      "code=\"%s\"} %" PRIuFAST64 "\n",
				                      kind_names[k], code_names[c], n);
		}
	family(b, "pipetrain_api_request_duration_seconds", "histogram",
	       "Time from receiving an API request to queueing its reply.");
	for (int i = 0; i <= N_BUCKETS; i++) {
		cum += atomic_load_explicit(&req_bucket[i], memory_order_relaxed);
		if (i < N_BUCKETS)
			pt_metrics_buf_printf(
			    b,
			    "pipetrain_api_request_duration_seconds_bucket{le=\"%g\"} "
			    "%" PRIuFAST64 "\n",
			    bucket_le[i], cum);
		else
			pt_metrics_buf_printf(
			    b,
			    "pipetrain_api_request_duration_seconds_bucket{le=\"+Inf\"} "
			    "%" PRIuFAST64 "\n",
			    cum);
	}
	pt_metrics_buf_printf(b, "pipetrain_api_request_duration_seconds_sum %.9f\n",
	                      atomic_load_explicit(&req_sum_ns, memory_order_relaxed) * 1e-9);
	pt_metrics_buf_printf(b, "pipetrain_api_request_duration_seconds_count %" PRIuFAST64 "\n",
	                      cum);

	family(b, "pipetrain_job_step", "gauge", "Last completed training step.");
	for (size_t i = 0; i < n_live; i++)
		pt_metrics_buf_printf(b, "pipetrain_job_step{job_id=\"%" PRIu64 "\"} %" PRId64 "\n",
		                      live[i].id, live[i].step);
	family(b, "pipetrain_job_steps", "gauge", "Training steps the job asked for.");
	for (size_t i = 0; i < n_live; i++)
		pt_metrics_buf_printf(b,
		                      "pipetrain_job_steps{job_id=\"%" PRIu64 "\"} %" PRId64 "\n",
		                      live[i].id, live[i].steps);
	for (size_t g = 0; g < sizeof(job_gauges) / sizeof(job_gauges[0]); g++) {
		family(b, job_gauges[g].name, "gauge", job_gauges[g].help);
		for (size_t i = 0; i < n_live; i++) {
			if (!live[i].has_last)
				continue;
			pt_metrics_buf_printf(b, "%s{job_id=\"%" PRIu64 "\"} ", job_gauges[g].name,
			                      live[i].id);
			prom_num(b, job_gauges[g].get(&live[i].last));
			pt_metrics_buf_printf(b, "\n");
		}
	}
	family(b, "pipetrain_stage_busy_seconds_total", "counter",
	       "Seconds each pipeline stage spent computing.");
	for (size_t i = 0; i < n_live; i++)
		for (size_t k = 0; k < live[i].n_stages; k++) {
			pt_api_stage_stats st;
			if ((rv = pt_api_job_stage(&live[i], k, &st)) != PT_OK)
				goto out;
			if (st.stage >= 0)
				pt_metrics_buf_printf(
				    b,
				    "pipetrain_stage_busy_seconds_total{job_id=\"%" PRIu64
				    "\",stage=\"%d\"} %.9f\n",
				    live[i].id, st.stage, st.busy_seconds);
		}
	if ((rv = render_comm(b, live, n_live)) != PT_OK)
		goto out;
	if (b->failed)
		rv = pt_set_error(PT_ERR_NOMEM, "metrics text");
out:
	pthread_mutex_unlock(&m->mu);
	free(live);
	return rv;
}

/* --------------------------------------------------------------- JSON -- */

static void json_checkpoint(pt_metrics *m, uint64_t job, pt_metrics_buf *b)
{
	char path[4200], sha[PT_SHA256_HEX];
	int64_t step;
	uint64_t size;

	if (pt_jobs_checkpoint(m->cfg.jobs, job, -1, path, sizeof(path), &step, &size, sha) !=
	    PT_OK) {
		pt_clear_error();
		pt_metrics_buf_printf(b, "null");
		return;
	}
	pt_metrics_buf_printf(b, "{\"step\":%" PRId64 ",\"bytes\":%" PRIu64 ",\"sha256\":", step,
	                      size);
	pt_metrics_buf_json_string(b, sha);
	pt_metrics_buf_printf(b, "}");
}

static void json_point(pt_metrics_buf *b, const pt_api_metric_point *p)
{
	pt_metrics_buf_printf(b, "{\"step\":%" PRId64 ",\"loss\":", p->step);
	json_num(b, p->loss);
	pt_metrics_buf_printf(b, ",\"learning_rate\":");
	json_num(b, p->learning_rate);
	pt_metrics_buf_printf(b, ",\"samples_per_second\":");
	json_num(b, p->samples_per_second);
	pt_metrics_buf_printf(b, ",\"tokens_per_second\":");
	json_num(b, p->tokens_per_second);
	pt_metrics_buf_printf(b, ",\"bubble\":");
	json_num(b, p->bubble);
	pt_metrics_buf_printf(b, ",\"eval_loss\":");
	json_num(b, p->eval_loss);
	pt_metrics_buf_printf(b, ",\"time\":");
	json_num(b, p->time_unix);
	pt_metrics_buf_printf(b, "}");
}

pt_err pt_metrics_jobs_json(pt_metrics *m, pt_metrics_buf *b)
{
	pt_api_response r;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	if ((rv = list_jobs(m, &r)) != PT_OK)
		goto out;
	pt_metrics_buf_printf(b, "[");
	for (size_t i = 0; i < r.n_jobs; i++) {
		pt_api_job_info j;
		if ((rv = pt_api_response_job(&r, i, &j)) != PT_OK)
			goto out;
		pt_metrics_buf_printf(b, "%s{\"id\":%" PRIu64 ",\"name\":", i ? "," : "", j.id);
		pt_metrics_buf_json_string(b, j.name ? j.name : "");
		pt_metrics_buf_printf(
		    b, ",\"state\":\"%s\",\"message\":", pt_api_job_state_name(j.state));
		pt_metrics_buf_json_string(b, j.message ? j.message : "");
		pt_metrics_buf_printf(
		    b, ",\"step\":%" PRId64 ",\"steps\":%" PRId64 ",\"last\":", j.step, j.steps);
		if (j.has_last)
			json_point(b, &j.last);
		else
			pt_metrics_buf_printf(b, "null");
		pt_metrics_buf_printf(b, ",\"checkpoint\":");
		json_checkpoint(m, j.id, b);
		pt_metrics_buf_printf(b, "}");
	}
	pt_metrics_buf_printf(b, "]\n");
	if (b->failed)
		rv = pt_set_error(PT_ERR_NOMEM, "jobs JSON");
out:
	pthread_mutex_unlock(&m->mu);
	return rv;
}

pt_err pt_metrics_points_json(pt_metrics *m, uint64_t job, int64_t after, int max_points,
                              pt_metrics_buf *b)
{
	pt_api_response r;
	pt_api_metric_point p;
	pt_api_job_info j;
	pt_api_stage_stats st;
	const uint8_t *data;
	size_t size;
	int shown = 0, v = 1;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	/* Per-stage busy totals from GetJob (in m->lb; the points use m->wb). */
	if ((rv = pt_jobs_reply_get(m->cfg.jobs, 0, job, &m->lb, &data, &size)) != PT_OK ||
	    (rv = pt_api_parse_response(data, size, &r)) != PT_OK ||
	    (rv = pt_api_response_job(&r, 0, &j)) != PT_OK)
		goto out;
	/* Chunks per rank: an interleaved job's timeline has p * v stages,
	 * stage s on rank s mod p (the dashboard draws a row per rank). */
	if (j.spec_table != NULL) {
		pt_job_spec sp;
		memset(&sp, 0, sizeof(sp));
		if (pt_job_spec_read(j.spec_table, &sp) == PT_OK) {
			v = pt_job_spec_virtual_stages(&sp);
			pt_job_spec_fini(&sp);
		}
		pt_clear_error(); /* a spec that does not read leaves v at 1 */
	}
	pt_metrics_buf_printf(
	    b, "{\"job\":%" PRIu64 ",\"virtual_stages\":%d,\"stage_busy_seconds\":[", job, v);
	for (size_t k = 0; k < j.n_stages; k++) {
		if ((rv = pt_api_job_stage(&j, k, &st)) != PT_OK)
			goto out;
		if (st.stage >= 0)
			pt_metrics_buf_printf(b, "%s%.6f", shown++ ? "," : "", st.busy_seconds);
	}
	/* The last step's timeline: [stage, kind, microbatch, start, end]. */
	pt_metrics_buf_printf(b, "],\"timeline\":[");
	for (size_t k = 0; k < j.n_timeline; k++) {
		pt_api_task_span t;
		if ((rv = pt_api_job_task(&j, k, &t)) != PT_OK)
			goto out;
		pt_metrics_buf_printf(b, "%s[%d,\"%c\",%d,%.6f,%.6f]", k ? "," : "", t.stage,
		                      "FB?W"[t.kind & 3], t.microbatch, t.start, t.end);
	}
	pt_metrics_buf_printf(b, "],\"checkpoint\":");
	json_checkpoint(m, job, b);
	if ((rv = watch(m, job, after, max_points, &r)) != PT_OK)
		goto out;
	pt_metrics_buf_printf(b,
	                      ",\"state\":\"%s\",\"cursor\":%" PRId64 ",\"ended\":%s,\"points\":[",
	                      pt_api_job_state_name(r.state), r.cursor, r.ended ? "true" : "false");
	for (size_t i = 0; i < r.n_points; i++) {
		if ((rv = pt_api_response_point(&r, i, &p)) != PT_OK)
			goto out;
		if (i)
			pt_metrics_buf_printf(b, ",");
		json_point(b, &p);
	}
	pt_metrics_buf_printf(b, "]}\n");
	if (b->failed)
		rv = pt_set_error(PT_ERR_NOMEM, "points JSON");
out:
	pthread_mutex_unlock(&m->mu);
	return rv;
}
