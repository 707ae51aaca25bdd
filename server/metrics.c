/* metrics.c - Prometheus text and dashboard JSON from the job manager's
 * replies (see metrics.h).
 *
 * The manager's ListJobs and WatchMetrics reply builders give a consistent
 * snapshot under its lock; we parse those buffers back. Per-stage busy
 * seconds are counters, so each live job keeps a cursor and running sums that
 * advance by the points added since the last scrape.
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fb.h"

#define N_BUCKETS   14
#define WATCH_BATCH 1000

static const double bucket_le[N_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                            0.1,    0.25,  0.5,    1,     2.5,  5,     10};

/* Request counters: process-wide, so the API front end needs no handle. */
static atomic_uint_fast64_t req_count[PT_API_KIND_COUNT][PT_API_CODE_COUNT];
static atomic_uint_fast64_t req_bucket[N_BUCKETS + 1]; /* last: over 10 s */
static atomic_uint_fast64_t req_sum_ns;

typedef struct jstate {
	uint64_t id;
	int64_t cursor; /* last step summed */
	int n_stages;
	double busy[PT_API_MAX_STAGES]; /* seconds, summed over points */
	bool live;
} jstate;

struct pt_metrics {
	pt_metrics_config cfg;
	char *version, *device;
	double started; /* monotonic seconds */
	pthread_mutex_t mu;
	pt_fb_builder lb, wb; /* list and watch replies */
	jstate *js;
	size_t n_js, cap_js;
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
	free(m->js);
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

static jstate *state_of(pt_metrics *m, uint64_t id)
{
	for (size_t i = 0; i < m->n_js; i++)
		if (m->js[i].id == id)
			return &m->js[i];
	if (m->n_js == m->cap_js) {
		size_t cap = m->cap_js ? m->cap_js * 2 : 16;
		jstate *p = realloc(m->js, cap * sizeof(*p));
		if (p == NULL)
			return NULL;
		m->js = p;
		m->cap_js = cap;
	}
	memset(&m->js[m->n_js], 0, sizeof(jstate));
	m->js[m->n_js].id = id;
	m->js[m->n_js].cursor = -1;
	return &m->js[m->n_js++];
}

/* advance sums the busy seconds of points added since the last call. */
static pt_err advance(pt_metrics *m, jstate *s)
{
	pt_api_response r;
	pt_api_metric_point p;

	for (;;) {
		PT_TRY(watch(m, s->id, s->cursor, WATCH_BATCH, &r));
		for (size_t i = 0; i < r.n_points; i++) {
			PT_TRY(pt_api_response_point(&r, i, &p));
			for (int k = 0; k < p.n_stages && k < PT_API_MAX_STAGES; k++)
				s->busy[k] += p.stage_busy[k];
			if (p.n_stages > s->n_stages)
				s->n_stages = p.n_stages;
		}
		s->cursor = r.cursor;
		if (r.n_points < WATCH_BATCH)
			return PT_OK;
	}
}

/* is_live tells whether a job still has per-job series. */
static bool is_live(const pt_metrics *m, const pt_api_job_info *j, double now)
{
	return !pt_api_job_state_final(j->state) || j->finished_unix <= 0 ||
	       now - j->finished_unix <= m->cfg.grace_s;
}

/* drop_dead forgets sums of jobs not marked live in this pass. */
static void drop_dead(pt_metrics *m)
{
	size_t o = 0;
	for (size_t i = 0; i < m->n_js; i++)
		if (m->js[i].live)
			m->js[o++] = m->js[i];
	m->n_js = o;
}

/* ------------------------------------------------------------- render -- */

typedef struct live_job {
	pt_api_job_info info;
	jstate *s;
} live_job;

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
	live_job *live = NULL;
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
	for (size_t i = 0; i < m->n_js; i++)
		m->js[i].live = false;
	for (size_t i = 0; i < r.n_jobs; i++) {
		pt_api_job_info j;
		if ((rv = pt_api_response_job(&r, i, &j)) != PT_OK)
			goto out;
		if ((unsigned)j.state < PT_JOB_STATE_COUNT)
			by_state[j.state]++;
		if (!is_live(m, &j, now))
			continue;
		live[n_live].info = j;
		if ((live[n_live].s = state_of(m, j.id)) == NULL) {
			rv = pt_set_error(PT_ERR_NOMEM, "metrics");
			goto out;
		}
		live[n_live].s->live = true;
		if ((rv = advance(m, live[n_live].s)) != PT_OK)
			goto out;
		n_live++;
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
		                      live[i].info.id, live[i].info.step);
	family(b, "pipetrain_job_steps", "gauge", "Training steps the job asked for.");
	for (size_t i = 0; i < n_live; i++)
		pt_metrics_buf_printf(b,
		                      "pipetrain_job_steps{job_id=\"%" PRIu64 "\"} %" PRId64 "\n",
		                      live[i].info.id, live[i].info.steps);
	for (size_t g = 0; g < sizeof(job_gauges) / sizeof(job_gauges[0]); g++) {
		family(b, job_gauges[g].name, "gauge", job_gauges[g].help);
		for (size_t i = 0; i < n_live; i++) {
			if (!live[i].info.has_last)
				continue;
			pt_metrics_buf_printf(b, "%s{job_id=\"%" PRIu64 "\"} ", job_gauges[g].name,
			                      live[i].info.id);
			prom_num(b, job_gauges[g].get(&live[i].info.last));
			pt_metrics_buf_printf(b, "\n");
		}
	}
	family(b, "pipetrain_stage_busy_seconds_total", "counter",
	       "Seconds each pipeline stage spent computing.");
	for (size_t i = 0; i < n_live; i++)
		for (int k = 0; k < live[i].s->n_stages; k++)
			pt_metrics_buf_printf(b,
			                      "pipetrain_stage_busy_seconds_total{job_id=\"%" PRIu64
			                      "\",stage=\"%d\"} %.9f\n",
			                      live[i].info.id, k, live[i].s->busy[k]);
	drop_dead(m);
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
	jstate *s;
	size_t before;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	before = m->n_js;
	/* Per-stage busy sums first: advance reuses the watch builder. */
	if ((s = state_of(m, job)) == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "metrics");
		goto out;
	}
	s->live = true;
	if ((rv = advance(m, s)) != PT_OK) {
		if (m->n_js > before)
			m->n_js--; /* forget the entry just added for an unknown job */
		goto out;
	}
	pt_metrics_buf_printf(b, "{\"job\":%" PRIu64 ",\"stage_busy_seconds\":[", job);
	for (int k = 0; k < s->n_stages; k++)
		pt_metrics_buf_printf(b, "%s%.6f", k ? "," : "", s->busy[k]);
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
