/* jobs.c - the job manager (see jobs.h): states, FIFO queue per device,
 * runner threads around pt_job_run, the journal and restart recovery.
 *
 * Locking: one manager mutex guards every job's in-memory state, the queue
 * and the waiter lists; it is never held across file I/O or training. Each
 * job's journal file has its own mutex, so appends of one job are ordered and
 * a slow fsync delays only that job. Job structs live until pt_jobs_destroy.
 */
#include "jobs.h"
#include "pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "fileio.h"
#include "job/job.h"
#include "log.h"
#include "runtime.h"

#define MAX_PATH         4096
#define JOURNAL_PIECE    (4u << 20) /* a journal is replayed this many bytes at a time */
#define MAX_WATCH_POINTS 10000
/* A job's metric history in memory: every step up to this many points, then
 * every 2nd, 4th, ... step (a point is about 90 bytes and 8 a stage: about
 * 1.6 MB a job at most for one stage, 5.8 MB for 64). */
#define MAX_POINTS 16384

/* Journal records. REC_DEATHS holds how many runs in a row died with the
 * server (recovery found them Starting or Running): recovery writes n + 1,
 * a run that ends any other way writes 0. Older servers skip it. */
enum { REC_STATE = 1, REC_METRIC = 2, REC_DEATHS = 3 };

/* Runs in a row that may die with the server before the job is failed
 * instead of re-queued (a job that kills the server must not crash-loop it). */
#define MAX_DEATHS 2
#define MAX_GPUS   64 /* --devices GPUs */
enum { STOP_NONE, STOP_CANCEL, STOP_SHUTDOWN };

typedef struct ckpt {
	int64_t step;
	uint64_t size;
	char sha256[PT_SHA256_HEX];
} ckpt;

/* One point of a job's metric history: a pt_api_metric_point without its
 * fixed 64-entry stage_busy array (most of its ~600 bytes), whose n_stages
 * values lie in the job's busy array from `busy` on. */
typedef struct mpoint {
	int64_t step;
	double loss, grad_norm, samples_per_second, tokens_per_second, bubble;
	double eval_loss, eval_accuracy, time_unix;
	float learning_rate;
	int n_stages;
	size_t busy;
} mpoint;

typedef struct job {
	uint64_t id;
	char dir[MAX_PATH];
	pt_job_spec spec; /* immutable after submit / recovery */
	char *device;     /* effective device (the runner's key) */
	pt_api_job_state state;
	char message[512];
	int64_t step;
	double submitted, started, finished;
	uint64_t queue_seq; /* FIFO order among queued jobs */
	char *resume_from;  /* checkpoint to resume from when it runs next */
	int restarts;       /* of the current run, after lost workers */
	int deaths;         /* runs in a row that died with the server (REC_DEATHS) */
	char **pool_urls;   /* the pool workers of its current run (n_pool), or NULL */
	int n_pool;
	int gpus[PT_MAX_STAGES]; /* the server's GPUs of its current run: stage s on gpus[s-1] */
	int n_gpus;

	mpoint *points; /* steps strictly increasing */
	size_t n_points, cap_points;
	double *busy; /* the points' per-stage busy seconds, point after point */
	size_t n_busy, cap_busy;
	int64_t stride;  /* points kept: steps that are multiples of it (see add_point) */
	bool thin_evals; /* evaluations are thinned too (thin) */
	/* Per-rank totals for JobInfo.stages: [0] the coordinator, [1 + k]
	 * stage k. Busy seconds sum the points above; the communicator counters
	 * are the latest the runner reported (its current run). */
	pt_api_stage_stats stages[PT_API_MAX_STAGE_STATS];
	size_t n_stages;
	ckpt *ckpts; /* by step */
	size_t n_ckpts;
	pt_api_task_span *timeline; /* the last flushing step's tasks (GetJob) */
	size_t n_timeline;

	int held;               /* under mgr->mu: threads using it unlocked (its runner) */
	atomic_int stop;        /* STOP_* */
	pt_jobs_waiter waiters; /* list head */
	int n_waiters;          /* parked on waiters */
	double watch_tokens;    /* replies to watchers the budget allows now (watch_replies) */
	double tokens_at;       /* monotonic seconds of the last refill */
	double last_wake;       /* monotonic seconds */
	atomic_bool wake_pending;

	pthread_mutex_t jmu; /* the journal file */
	int jfd;
	double last_sync;
	bool dirty;
	pt_jobs *mgr;
} job;

typedef struct runner {
	char *device;
	pthread_t thread;
	bool started;
	pt_jobs *mgr;
} runner;

/* A job run on pool workers: a thread of its own (the coordinator). */
typedef struct pool_run {
	pthread_t thread;
	bool done;   /* under mu: the thread returned (join it) */
	job *jb;     /* NULL once the run dropped its hold (the job may be pruned) */
	uint64_t id; /* the job's id, for the shutdown log */
	pt_jobs *mgr;
	struct pool_run *next;
} pool_run;

struct pt_jobs {
	pt_jobs_config cfg;
	char *data_dir, *device, *files_root;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	job **jobs; /* by id */
	size_t n_jobs, cap_jobs;
	uint64_t next_id;
	uint64_t next_seq;
	runner *runners;
	size_t n_runners, cap_runners;
	bool stopping, shut;
	int lock_fd;                /* flock on data_dir/lock: one server per data dir */
	uint64_t mem_limit;         /* admission: a job's host memory estimate at most this */
	pt_pool *pool;              /* --pool (NULL: none) */
	pool_run *pool_runs;        /* under mu: pooled and GPU-placed runs */
	int gpus[MAX_GPUS];         /* --devices GPUs (cuda:N numbers) */
	uint64_t gpu_job[MAX_GPUS]; /* the job holding gpus[i] (0: free) */
	int n_gpus;
	uint64_t *trash;        /* under mu: pruned jobs whose jobs/.deleted-<id> awaits removal */
	uint64_t saved_last_id; /* what data_dir/last_id holds (0: not written by this run) */
	size_t n_trash, cap_trash;
};

/* The runner key of jobs the server places on its GPUs: no runner has it. */
static const char GPU_KEY[] = "gpus";

/* ------------------------------------------------------------- helpers -- */

static double now_unix(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint32_t crc32_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		crc32_table[i] = c;
	}
}

static uint32_t crc32(const void *data, size_t n)
{
	const uint8_t *p = data;
	uint32_t c = 0xFFFFFFFFu;

	pthread_once(&crc_once, crc_init);
	for (size_t i = 0; i < n; i++)
		c = crc32_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
	return c ^ 0xFFFFFFFFu;
}

static pt_err mkdir_p(const char *path)
{
	char tmp[MAX_PATH];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(tmp))
		return pt_set_error(PT_ERR_INVALID, "path '%s' too long or empty", path);
	memcpy(tmp, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (tmp[i] == '/' || tmp[i] == '\0') {
			char c = tmp[i];
			tmp[i] = '\0';
			if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
				return pt_set_error(PT_ERR_IO, "mkdir %s: %s", tmp,
				                    strerror(errno));
			tmp[i] = c;
		}
	}
	return PT_OK;
}

static job *find_job(pt_jobs *m, uint64_t id)
{
	size_t lo = 0, hi = m->n_jobs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (m->jobs[mid]->id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < m->n_jobs && m->jobs[lo]->id == id ? m->jobs[lo] : NULL;
}

/* no_job sets the error for a job id the server does not hold (m->mu held):
 * an id it handed out may belong to a job --keep-jobs deleted, and the
 * message says so. */
static pt_err no_job(const pt_jobs *m, uint64_t id)
{
	if (m->cfg.keep_jobs > 0 && id > 0 && id < m->next_id)
		return pt_set_error(PT_ERR_NOTFOUND,
		                    "no job %" PRIu64 " (the server keeps the %d jobs that ended "
		                    "last, --keep-jobs)",
		                    id, m->cfg.keep_jobs);
	return pt_set_error(PT_ERR_NOTFOUND, "no job %" PRIu64, id);
}

/* insert_job keeps m->jobs sorted by id (recovery reads in any order). */
static pt_err insert_job(pt_jobs *m, job *jb)
{
	size_t i;

	if (m->n_jobs == m->cap_jobs) {
		size_t cap = m->cap_jobs ? 2 * m->cap_jobs : 64;
		job **p = realloc(m->jobs, cap * sizeof(*p));
		if (p == NULL)
			return pt_set_error(PT_ERR_NOMEM, "jobs: table");
		m->jobs = p;
		m->cap_jobs = cap;
	}
	for (i = m->n_jobs; i > 0 && m->jobs[i - 1]->id > jb->id; i--)
		m->jobs[i] = m->jobs[i - 1];
	m->jobs[i] = jb;
	m->n_jobs++;
	return PT_OK;
}

static void job_free(job *jb)
{
	if (jb == NULL)
		return;
	pt_job_spec_fini(&jb->spec);
	free(jb->device);
	free(jb->resume_from);
	free(jb->points);
	free(jb->busy);
	free(jb->ckpts);
	free(jb->timeline);
	if (jb->jfd >= 0)
		close(jb->jfd);
	pthread_mutex_destroy(&jb->jmu);
	free(jb);
}

/* job_set_dir names jb's folder after its id. */
static void job_set_dir(job *jb)
{
	snprintf(jb->dir, sizeof(jb->dir), "%s/jobs/%" PRIu64, jb->mgr->data_dir, jb->id);
}

static job *job_new(pt_jobs *m, uint64_t id)
{
	job *jb = calloc(1, sizeof(*jb));
	if (jb == NULL)
		return NULL;
	jb->id = id;
	jb->mgr = m;
	jb->jfd = -1;
	jb->waiters.next = jb->waiters.prev = &jb->waiters;
	pthread_mutex_init(&jb->jmu, NULL);
	job_set_dir(jb);
	return jb;
}

/* ------------------------------------------------------------- journal -- */

typedef struct wbuf {
	uint8_t data[1024];
	size_t n;
} wbuf;

static void put(wbuf *w, const void *p, size_t n)
{
	if (w->n + n <= sizeof(w->data)) {
		memcpy(w->data + w->n, p, n);
		w->n += n;
	}
}

static int job_threads(const pt_jobs *m, bool resolved);

static pt_err journal_open(job *jb)
{
	char path[MAX_PATH + 16];

	if (jb->jfd >= 0)
		return PT_OK;
	snprintf(path, sizeof(path), "%s/journal", jb->dir);
	jb->jfd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (jb->jfd < 0)
		return pt_set_error(PT_ERR_IO, "open %s: %s", path, strerror(errno));
	return PT_OK;
}

/* journal_append writes one record [len][crc][payload]; sync forces fsync,
 * else it happens when metrics_sync_ms passed since the last one. */
static pt_err journal_append(job *jb, const wbuf *payload, bool sync)
{
	uint8_t rec[sizeof(payload->data) + 8];
	uint32_t len = (uint32_t)payload->n, crc = crc32(payload->data, payload->n);
	pt_err rv = PT_OK;
	ssize_t w;
	size_t off = 0, total = payload->n + 8;

	memcpy(rec, &len, 4);
	memcpy(rec + 4, &crc, 4);
	memcpy(rec + 8, payload->data, payload->n);
	pthread_mutex_lock(&jb->jmu);
	if ((rv = journal_open(jb)) != PT_OK)
		goto out;
	while (off < total) {
		w = write(jb->jfd, rec + off, total - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			rv = pt_set_error(PT_ERR_IO, "job %" PRIu64 " journal: write: %s", jb->id,
			                  strerror(errno));
			goto out;
		}
		off += (size_t)w;
	}
	jb->dirty = true;
	if (sync || now_mono() - jb->last_sync >= jb->mgr->cfg.metrics_sync_ms * 1e-3) {
		if (fdatasync(jb->jfd) != 0) {
			rv = pt_set_error(PT_ERR_IO, "job %" PRIu64 " journal: fsync: %s", jb->id,
			                  strerror(errno));
			goto out;
		}
		jb->dirty = false;
		jb->last_sync = now_mono();
	}
out:
	pthread_mutex_unlock(&jb->jmu);
	if (rv != PT_OK)
		pt_error("%s", pt_last_error());
	return rv;
}

static void journal_flush_close(job *jb)
{
	pthread_mutex_lock(&jb->jmu);
	if (jb->jfd >= 0) {
		if (jb->dirty)
			fdatasync(jb->jfd);
		close(jb->jfd);
		jb->jfd = -1;
		jb->dirty = false;
	}
	pthread_mutex_unlock(&jb->jmu);
}

static pt_err journal_state(job *jb, pt_api_job_state st, int64_t step, double t, const char *msg)
{
	wbuf w = {.n = 0};
	uint8_t type = REC_STATE, s = (uint8_t)st;
	size_t l = msg ? strlen(msg) : 0;
	uint16_t ml = (uint16_t)(l > 900 ? 900 : l);

	put(&w, &type, 1);
	put(&w, &s, 1);
	put(&w, &step, 8);
	put(&w, &t, 8);
	put(&w, &ml, 2);
	if (ml)
		put(&w, msg, ml);
	return journal_append(jb, &w, true);
}

static pt_err journal_deaths(job *jb, int n, bool sync)
{
	wbuf w = {.n = 0};
	uint8_t type = REC_DEATHS, v = (uint8_t)(n > 255 ? 255 : n);

	put(&w, &type, 1);
	put(&w, &v, 1);
	return journal_append(jb, &w, sync);
}

static pt_err journal_metric(job *jb, const pt_api_metric_point *p)
{
	wbuf w = {.n = 0};
	uint8_t type = REC_METRIC;
	int32_t ns = p->n_stages;

	put(&w, &type, 1);
	put(&w, &p->step, 8);
	put(&w, &p->loss, 8);
	put(&w, &p->learning_rate, 4);
	put(&w, &p->grad_norm, 8);
	put(&w, &p->samples_per_second, 8);
	put(&w, &p->tokens_per_second, 8);
	put(&w, &p->bubble, 8);
	put(&w, &p->eval_loss, 8);
	put(&w, &p->eval_accuracy, 8);
	put(&w, &p->time_unix, 8);
	put(&w, &ns, 4);
	put(&w, p->stage_busy, 8 * (size_t)ns);
	return journal_append(jb, &w, false);
}

/* ------------------------------------------------------ in-memory state -- */

/* add_busy adds sign * the per-stage busy seconds busy[0..n) to jb's stage
 * totals. */
static void add_busy(job *jb, int n_stages, const double *busy, double sign)
{
	size_t n = 1 + (size_t)n_stages;

	for (size_t i = jb->n_stages; i < n; i++) {
		memset(&jb->stages[i], 0, sizeof(jb->stages[i]));
		jb->stages[i].stage = (int32_t)i - 1;
	}
	if (n > jb->n_stages)
		jb->n_stages = n;
	for (int k = 0; k < n_stages; k++)
		jb->stages[1 + k].busy_seconds += sign * busy[k];
}

/* pop_point forgets jb's newest point; its busy seconds stay counted unless
 * uncount (the step is to be trained again). */
static void pop_point(job *jb, bool uncount)
{
	mpoint *q = &jb->points[--jb->n_points];
	if (uncount)
		add_busy(jb, q->n_stages, jb->busy + q->busy, -1.0);
	jb->n_busy = q->busy;
}

/* drop_last_point forgets jb's newest point and its busy seconds. */
static void drop_last_point(job *jb)
{
	pop_point(jb, true);
}

/* expand writes history point q as the API's point. */
static void expand(const job *jb, const mpoint *q, pt_api_metric_point *p)
{
	memset(p, 0, sizeof(*p));
	p->step = q->step;
	p->loss = q->loss;
	p->learning_rate = q->learning_rate;
	p->grad_norm = q->grad_norm;
	p->samples_per_second = q->samples_per_second;
	p->tokens_per_second = q->tokens_per_second;
	p->bubble = q->bubble;
	p->n_stages = q->n_stages;
	memcpy(p->stage_busy, jb->busy + q->busy, sizeof(double) * (size_t)q->n_stages);
	p->eval_loss = q->eval_loss;
	p->eval_accuracy = q->eval_accuracy;
	p->time_unix = q->time_unix;
}

/* kept: a point of step and eval_loss stays in jb's history (and its
 * journal) once newer points come: its step is a multiple of the stride, or
 * it carries an evaluation (while the stride has not outgrown those too,
 * thin). */
static bool kept(const job *jb, int64_t step, double eval_loss)
{
	return step % jb->stride == 0 || (!isnan(eval_loss) && !jb->thin_evals);
}

/* thin halves jb's history: the stride doubles and points off it go (the
 * newest stays); when evaluations alone fill half of MAX_POINTS they are
 * thinned too from then on. Busy seconds stay counted. */
static void thin(job *jb)
{
	size_t n = 0, nb = 0, evals = 0;

	jb->stride *= 2;
	for (size_t i = 0; i < jb->n_points; i++)
		evals += !isnan(jb->points[i].eval_loss);
	if (evals >= MAX_POINTS / 2)
		jb->thin_evals = true;
	for (size_t i = 0; i < jb->n_points; i++) {
		mpoint q = jb->points[i];
		if (!kept(jb, q.step, q.eval_loss) && i + 1 < jb->n_points)
			continue;
		memmove(jb->busy + nb, jb->busy + q.busy, sizeof(double) * (size_t)q.n_stages);
		q.busy = nb;
		nb += (size_t)q.n_stages;
		jb->points[n++] = q;
	}
	jb->n_points = n;
	jb->n_busy = nb;
}

/* grow makes room for one more of size bytes in *v (capacity *cap, in use
 * n); false when there is no memory. */
static bool grow(void **v, size_t *cap, size_t n, size_t more, size_t size)
{
	size_t c = *cap ? *cap : 64;
	void *g;

	while (c < n + more)
		c *= 2;
	if (c == *cap)
		return true;
	if ((g = realloc(*v, c * size)) == NULL)
		return false;
	*v = g;
	*cap = c;
	return true;
}

/* add_point appends p; a step at or below the last one (a resumed run redoing
 * steps after its checkpoint) first drops the points it replaces. The
 * history is bounded: every step is kept up to MAX_POINTS, then every 2nd,
 * 4th, ... (thin), the newest point always - one off the stride is replaced
 * by the next (its busy seconds stay counted). Returns whether p is kept
 * for good (journal it). */
static bool add_point(job *jb, const pt_api_metric_point *p)
{
	int ns = p->n_stages < 0                   ? 0
	         : p->n_stages > PT_API_MAX_STAGES ? PT_API_MAX_STAGES
	                                           : p->n_stages;
	mpoint q = {p->step,
	            p->loss,
	            p->grad_norm,
	            p->samples_per_second,
	            p->tokens_per_second,
	            p->bubble,
	            p->eval_loss,
	            p->eval_accuracy,
	            p->time_unix,
	            p->learning_rate,
	            ns,
	            0};

	if (jb->stride < 1)
		jb->stride = 1;
	while (jb->n_points > 0 && jb->points[jb->n_points - 1].step >= p->step)
		drop_last_point(jb);
	if (jb->n_points > 0) {
		const mpoint *last = &jb->points[jb->n_points - 1];
		if (!kept(jb, last->step, last->eval_loss))
			pop_point(jb, false);
	}
	if (jb->n_points >= MAX_POINTS)
		thin(jb);
	while (!grow((void **)&jb->points, &jb->cap_points, jb->n_points, 1, sizeof(mpoint)) ||
	       !grow((void **)&jb->busy, &jb->cap_busy, jb->n_busy, (size_t)ns, sizeof(double))) {
		if (jb->n_points == 0) /* no memory: the newest point replaces the last */
			return false;
		pop_point(jb, false);
	}
	q.busy = jb->n_busy;
	memcpy(jb->busy + jb->n_busy, p->stage_busy, sizeof(double) * (size_t)ns);
	jb->n_busy += (size_t)ns;
	jb->points[jb->n_points++] = q;
	add_busy(jb, ns, p->stage_busy, 1.0);
	return kept(jb, q.step, q.eval_loss);
}

static void apply_state(job *jb, pt_api_job_state st, int64_t step, double t, const char *msg)
{
	size_t l = msg ? strlen(msg) : 0;

	jb->state = st;
	if (step > jb->step)
		jb->step = step;
	if (l >= sizeof(jb->message))
		l = sizeof(jb->message) - 1;
	if (l)
		memcpy(jb->message, msg, l);
	jb->message[l] = '\0';
	if (st == PT_JOB_QUEUED && jb->submitted == 0)
		jb->submitted = t;
	if ((st == PT_JOB_STARTING || st == PT_JOB_RUNNING) && jb->started == 0)
		jb->started = t;
	if (st == PT_JOB_QUEUED || st == PT_JOB_STARTING || st == PT_JOB_RUNNING)
		jb->finished = 0;
	if (pt_api_job_state_final(st))
		jb->finished = t;
}

/* wake_interval: how long jb's parked watchers wait between wakes (lock
 * held): watch_interval_ms, or longer when that many watchers at once would
 * take more than watch_replies replies a second - a hundred dashboards cost
 * a running job what a few do. */
static double wake_interval(const pt_jobs *m, const job *jb)
{
	double base = m->cfg.watch_interval_ms * 1e-3;
	double fair = m->cfg.watch_replies > 0 ? (double)jb->n_waiters / m->cfg.watch_replies : 0.0;
	return fair > base ? fair : base;
}

/* refill adds the watch_replies budget's tokens since the last refill (at
 * most a second's worth are kept; lock held). */
static void refill(const pt_jobs *m, job *jb, double now)
{
	double cap = m->cfg.watch_replies;
	jb->watch_tokens += (now - jb->tokens_at) * cap;
	if (jb->watch_tokens > cap)
		jb->watch_tokens = cap;
	jb->tokens_at = now;
}

/* wake_all wakes every parked watcher of jb (manager lock held); each reply
 * spends a token of the budget (the count may go below zero: the next wake
 * is that much later, wake_interval). */
static void wake_all(job *jb)
{
	pt_jobs_waiter *h = &jb->waiters;

	if (jb->mgr->cfg.watch_replies > 0) {
		refill(jb->mgr, jb, now_mono());
		jb->watch_tokens -= jb->n_waiters;
	}

	while (h->next != h) {
		pt_jobs_waiter *w = h->next;
		h->next = w->next;
		w->next->prev = h;
		w->next = w->prev = NULL;
		w->linked = false;
		w->wake(w);
	}
	jb->n_waiters = 0;
	jb->wake_pending = false;
	jb->last_wake = now_mono();
}

/* set_state changes jb's state in memory (lock held) and wakes watchers. */
static void set_state(job *jb, pt_api_job_state st, const char *msg, double t)
{
	apply_state(jb, st, jb->step, t, msg);
	wake_all(jb);
}

/* ---------------------------------------------------------- checkpoints -- */

static int ckpt_cmp(const void *a, const void *b)
{
	const ckpt *x = a, *y = b;
	return x->step < y->step ? -1 : x->step > y->step;
}

static pt_err hash_file(const char *path, uint64_t *size, char hex[PT_SHA256_HEX])
{
	uint8_t buf[1 << 16], dig[PT_SHA256_BYTES];
	pt_sha256_ctx s;
	size_t n, off = 0;
	int fd;
	pt_err rv = PT_OK;

	if ((rv = pt_file_open_read(path, &fd, &n)) != PT_OK)
		return rv;
	pt_sha256_init(&s);
	while (off < n && rv == PT_OK) {
		size_t k = n - off < sizeof(buf) ? n - off : sizeof(buf);
		if ((rv = pt_read_full(fd, buf, k, off, path)) == PT_OK)
			pt_sha256_update(&s, buf, k);
		off += k;
	}
	close(fd);
	if (rv != PT_OK)
		return rv;
	pt_sha256_final(&s, dig);
	pt_sha256_hex(dig, hex);
	*size = n;
	return PT_OK;
}

/* scan_checkpoints lists <dir>/checkpoints (no lock: file I/O); known holds
 * hashes already computed, reused when the size matches. Leftover temporary
 * files of an interrupted write are removed. */
static pt_err scan_checkpoints(const char *jdir, const ckpt *known, size_t n_known, ckpt **out,
                               size_t *n_out)
{
	char dir[MAX_PATH + 16], path[2 * MAX_PATH];
	DIR *d;
	struct dirent *e;
	ckpt *v = NULL;
	size_t n = 0, cap = 0;

	*out = NULL;
	*n_out = 0;
	snprintf(dir, sizeof(dir), "%s/checkpoints", jdir);
	if ((d = opendir(dir)) == NULL)
		return PT_OK;
	while ((e = readdir(d)) != NULL) {
		long long step;
		int used = 0;
		struct stat st;
		if (strstr(e->d_name, ".tmp.") != NULL) {
			/* pt_file_write_atomic's temp file; ours only while a runner of
			 * this job writes, which scanning never overlaps at recovery. */
			continue;
		}
		if (sscanf(e->d_name, "step-%lld.safetensors%n", &step, &used) != 1 ||
		    e->d_name[used] != '\0' || step < 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &st) != 0)
			continue;
		if (n == cap) {
			ckpt *q = realloc(v, (cap = cap ? 2 * cap : 8) * sizeof(*q));
			if (q == NULL) {
				free(v);
				closedir(d);
				return pt_set_error(PT_ERR_NOMEM, "checkpoints");
			}
			v = q;
		}
		v[n].step = step;
		v[n].size = (uint64_t)st.st_size;
		v[n].sha256[0] = '\0';
		for (size_t k = 0; k < n_known; k++)
			if (known[k].step == step && known[k].size == (uint64_t)st.st_size)
				memcpy(v[n].sha256, known[k].sha256, PT_SHA256_HEX);
		if (v[n].sha256[0] == '\0' && hash_file(path, &v[n].size, v[n].sha256) != PT_OK) {
			pt_warn("checkpoint %s: %s", path, pt_last_error());
			continue;
		}
		n++;
	}
	closedir(d);
	if (n > 1) /* v is NULL when n is 0, and qsort's base must not be */
		qsort(v, n, sizeof(*v), ckpt_cmp);
	*out = v;
	*n_out = n;
	return PT_OK;
}

static void remove_temp_files(const char *jdir)
{
	char dir[MAX_PATH + 16], path[2 * MAX_PATH];
	DIR *d;
	struct dirent *e;

	snprintf(dir, sizeof(dir), "%s/checkpoints", jdir);
	if ((d = opendir(dir)) == NULL)
		return;
	while ((e = readdir(d)) != NULL)
		if (strstr(e->d_name, ".tmp.") != NULL) {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			pt_info("removing partial checkpoint %s", path);
			unlink(path);
		}
	closedir(d);
	if (pt_checkpoint_remove_orphans(dir) > 0)
		pt_info("removed checkpoint states without their weights in %s", dir);
}

/* refresh_checkpoints rescans jb's checkpoint directory and swaps the list. */
static void refresh_checkpoints(pt_jobs *m, job *jb)
{
	ckpt *known, *fresh;
	size_t n_known, n_fresh;

	pthread_mutex_lock(&m->mu);
	n_known = jb->n_ckpts;
	known = n_known ? malloc(n_known * sizeof(*known)) : NULL;
	if (known)
		memcpy(known, jb->ckpts, n_known * sizeof(*known));
	else
		n_known = 0;
	pthread_mutex_unlock(&m->mu);
	if (scan_checkpoints(jb->dir, known, n_known, &fresh, &n_fresh) == PT_OK) {
		pthread_mutex_lock(&m->mu);
		free(jb->ckpts);
		jb->ckpts = fresh;
		jb->n_ckpts = n_fresh;
		pthread_mutex_unlock(&m->mu);
	}
	free(known);
}

/* -------------------------------------------------------------- runners -- */

static void metric_from_job(const pt_job_metric *m, pt_api_metric_point *p)
{
	memset(p, 0, sizeof(*p));
	p->step = m->step;
	p->loss = m->loss;
	p->learning_rate = m->lr;
	p->grad_norm = m->grad_norm;
	p->samples_per_second = m->samples_per_s;
	p->tokens_per_second = m->tokens_per_s;
	p->bubble = m->bubble;
	p->n_stages = m->n_stages < 0                   ? 0
	              : m->n_stages > PT_API_MAX_STAGES ? PT_API_MAX_STAGES
	                                                : m->n_stages;
	memcpy(p->stage_busy, m->stage_busy, sizeof(double) * (size_t)p->n_stages);
	p->eval_loss = m->eval_loss;
	p->eval_accuracy = m->eval_accuracy;
	p->time_unix = m->time_unix;
}

/* comm_from_job stores the runner's communicator counters (lock held). */
static void comm_from_job(job *jb, const pt_job_metric *m)
{
	for (size_t i = 0; i < jb->n_stages; i++) {
		pt_api_stage_stats *d = &jb->stages[i];
		pt_comm_stats c = {0};
		d->has_comm = (int)i < m->n_comm;
		if (d->has_comm)
			c = m->comm[i];
		d->messages_sent = c.msgs_sent;
		d->messages_received = c.msgs_recv;
		d->bytes_sent = c.bytes_sent;
		d->bytes_received = c.bytes_recv;
		d->bytes_raw_sent = c.bytes_raw_sent;
		d->errors = c.errors;
		d->timeouts = c.timeouts;
		d->reconnects = c.reconnects;
	}
}

/* timeline_of turns a step's task records into spans from the step's
 * first task (optimizer steps left out); NULL when there are none. Stages
 * on other hosts keep their own clocks: their rows are offset by the
 * difference, not aligned. */
static pt_api_task_span *timeline_of(const pt_job_metric *m, size_t *n)
{
	pt_api_task_span *v;
	double t0 = 0.0;
	size_t k = 0, cap = 0;
	bool any = false;

	*n = 0;
	for (int st = 0; st < m->n_stages && st < PT_MAX_STAGES; st++)
		for (int i = 0; m->tasks[st] != NULL && i < m->n_tasks[st]; i++) {
			const pt_task_record *t = &m->tasks[st][i];
			if (t->kind == PT_TASK_STEP)
				continue;
			if (!any || t->start < t0)
				t0 = t->start;
			any = true;
			cap++;
		}
	if (cap == 0)
		return NULL;
	cap = cap < PT_API_MAX_TIMELINE ? cap : PT_API_MAX_TIMELINE;
	if ((v = calloc(cap, sizeof(*v))) == NULL)
		return NULL;
	for (int st = 0; st < m->n_stages && st < PT_MAX_STAGES; st++)
		for (int i = 0; m->tasks[st] != NULL && i < m->n_tasks[st] && k < cap; i++) {
			const pt_task_record *t = &m->tasks[st][i];
			if (t->kind == PT_TASK_STEP)
				continue;
			v[k++] = (pt_api_task_span){.start = (float)(t->start - t0),
			                            .end = (float)(t->end - t0),
			                            .microbatch = t->microbatch,
			                            .stage = (uint8_t)st,
			                            .kind = t->kind};
		}
	*n = k;
	return v;
}

static void hook_metric(void *ctx, const pt_job_metric *m)
{
	job *jb = ctx;
	pt_jobs *mgr = jb->mgr;
	pt_api_metric_point p;
	size_t n_tl = 0;
	pt_api_task_span *tl = timeline_of(m, &n_tl);

	metric_from_job(m, &p);
	pthread_mutex_lock(&mgr->mu);
	if (tl != NULL) {
		free(jb->timeline);
		jb->timeline = tl;
		jb->n_timeline = n_tl;
	}
	bool keep = add_point(jb, &p);
	comm_from_job(jb, m);
	jb->step = p.step;
	if (jb->state == PT_JOB_STARTING)
		apply_state(jb, PT_JOB_RUNNING, p.step, now_unix(), NULL);
	if (now_mono() - jb->last_wake >= wake_interval(mgr, jb))
		wake_all(jb);
	else
		jb->wake_pending = true;
	pthread_mutex_unlock(&mgr->mu);
	if (keep)
		journal_metric(jb, &p);
}

static bool hook_should_stop(void *ctx)
{
	job *jb = ctx;
	pt_jobs *mgr = jb->mgr;

	/* Deliver coalesced wakes even when the next metric is slow to come. */
	if (jb->wake_pending) {
		pthread_mutex_lock(&mgr->mu);
		if (jb->wake_pending && now_mono() - jb->last_wake >= wake_interval(mgr, jb))
			wake_all(jb);
		pthread_mutex_unlock(&mgr->mu);
	}
	return atomic_load(&jb->stop) != STOP_NONE;
}

/* hook_checkpoint (the runner's checkpoint writer thread) lists a new
 * checkpoint with the SHA-256 its writer computed as it wrote, so the scan
 * does not read the file back to hash it. */
static void hook_checkpoint(void *ctx, int64_t step, const char *path, const char *sha256,
                            uint64_t size)
{
	job *jb = ctx;
	pt_jobs *m = jb->mgr;
	pt_debug("job %" PRIu64 ": checkpoint at step %" PRId64 ": %s", jb->id, step, path);
	pthread_mutex_lock(&m->mu);
	ckpt *grown = strlen(sha256) == PT_SHA256_HEX - 1
	                  ? realloc(jb->ckpts, (jb->n_ckpts + 1) * sizeof(*grown))
	                  : NULL;
	if (grown != NULL) {
		jb->ckpts = grown;
		grown[jb->n_ckpts].step = step;
		grown[jb->n_ckpts].size = size;
		memcpy(grown[jb->n_ckpts].sha256, sha256, PT_SHA256_HEX);
		jb->n_ckpts++;
	}
	pthread_mutex_unlock(&m->mu);
	refresh_checkpoints(m, jb);
}

/* hook_restart shows a restart after a lost worker as the running job's
 * message (GetJob, ListJobs, the journal); the job's final message keeps
 * the count (run_one). */
static void hook_restart(void *ctx, int n, int64_t from, const char *message)
{
	job *jb = ctx;
	pt_jobs *mgr = jb->mgr;
	double t = now_unix();

	pthread_mutex_lock(&mgr->mu);
	jb->restarts = n;
	set_state(jb, PT_JOB_RUNNING, message, t);
	pthread_mutex_unlock(&mgr->mu);
	journal_state(jb, PT_JOB_RUNNING, from, t, message);
}

/* runs_before tells whether queued job a runs before queued job b: a higher
 * priority first, then the earlier in the queue. */
static bool runs_before(const job *a, const job *b)
{
	return a->spec.priority != b->spec.priority ? a->spec.priority > b->spec.priority
	                                            : a->queue_seq < b->queue_seq;
}

_Static_assert((int)PT_POOL_IDLE == (int)PT_API_WORKER_IDLE &&
                   (int)PT_POOL_BUSY == (int)PT_API_WORKER_BUSY &&
                   (int)PT_POOL_UNREACHABLE == (int)PT_API_WORKER_UNREACHABLE,
               "pool states are the schema's WorkerState");

/* pooled tells whether jb may run on pool workers: the server has a pool
 * and the job names no workers of its own. */
static bool pooled(const pt_jobs *m, const job *jb)
{
	return m->pool != NULL && jb->spec.n_workers == 0 &&
	       (jb->spec.device == NULL || strncmp(jb->spec.device, "cuda:", 5) != 0);
}

/* gpu_placed tells whether the server places jb's stages on its GPUs. */
static bool gpu_placed(const job *jb)
{
	return strcmp(jb->device, GPU_KEY) == 0;
}

/* device_key is the runner key of a job with spec s: GPU_KEY for the jobs
 * the server places on its --devices GPUs (no workers, and no device or a
 * cuda:N one), else the device it names or the server's default. */
static const char *device_key(const pt_jobs *m, const pt_job_spec *s)
{
	bool named = s->device != NULL && s->device[0] != '\0';
	if (m->n_gpus > 0 && s->n_workers == 0 && (!named || strncmp(s->device, "cuda:", 5) == 0))
		return GPU_KEY;
	return named ? s->device : m->device;
}

/* pinned_gpu is N for a GPU-placed job that names device cuda:N (all its
 * stages go there), else -1. */
static int pinned_gpu(const job *jb)
{
	const char *d = jb->spec.device;
	return d != NULL && strncmp(d, "cuda:", 5) == 0 ? atoi(d + 5) : -1;
}

static int gpu_index(const pt_jobs *m, int n)
{
	for (int i = 0; i < m->n_gpus; i++)
		if (m->gpus[i] == n)
			return i;
	return -1;
}

static int gpus_free(const pt_jobs *m)
{
	int n = 0;
	for (int i = 0; i < m->n_gpus; i++)
		n += m->gpu_job[i] == 0;
	return n;
}

/* take_gpus gives jb its stages' GPUs (lock held): cuda:N for every stage
 * when it names one, else one free GPU a stage in --devices order. False
 * (nothing taken) when they are not free. */
static bool take_gpus(pt_jobs *m, job *jb)
{
	int need = jb->spec.stages, pin = pinned_gpu(jb), n = 0;

	if (need < 1 || need > PT_MAX_STAGES)
		return false;
	if (pin >= 0) {
		int i = gpu_index(m, pin);
		if (i < 0 || m->gpu_job[i] != 0)
			return false;
		m->gpu_job[i] = jb->id;
		for (int st = 0; st < need; st++)
			jb->gpus[st] = pin;
		jb->n_gpus = need;
		return true;
	}
	if (gpus_free(m) < need)
		return false;
	for (int i = 0; i < m->n_gpus && n < need; i++)
		if (m->gpu_job[i] == 0) {
			m->gpu_job[i] = jb->id;
			jb->gpus[n++] = m->gpus[i];
		}
	jb->n_gpus = n;
	return true;
}

static void release_gpus(pt_jobs *m, job *jb)
{
	for (int i = 0; i < m->n_gpus; i++)
		if (m->gpu_job[i] == jb->id)
			m->gpu_job[i] = 0;
	jb->n_gpus = 0;
}

/* gpu_list writes jb's GPUs as "cuda:0, cuda:1" (a pinned job's one once). */
static void gpu_list(const job *jb, char *buf, size_t cap)
{
	size_t o = 0;
	buf[0] = '\0';
	for (int i = 0; i < jb->n_gpus && o < cap; i++) {
		bool seen = false;
		for (int k = 0; k < i && !seen; k++)
			seen = jb->gpus[k] == jb->gpus[i];
		if (!seen)
			o += (size_t)snprintf(buf + o, cap - o, "%scuda:%d", o ? ", " : "",
			                      jb->gpus[i]);
	}
}

/* local_ok tells whether a local runner may run jb: its stages run on the
 * server's devices unless it names workers, and --devices none has none. */
static bool local_ok(const pt_jobs *m, const job *jb)
{
	return !m->cfg.no_local || jb->spec.n_workers > 0;
}

/* next_job returns the queued job of device dev that runs next (lock held). */
static job *next_job(pt_jobs *m, const char *dev)
{
	job *best = NULL;
	for (size_t i = 0; i < m->n_jobs; i++) {
		job *jb = m->jobs[i];
		if (jb->state == PT_JOB_QUEUED && strcmp(jb->device, dev) == 0 && local_ok(m, jb) &&
		    (best == NULL || runs_before(jb, best)))
			best = jb;
	}
	return best;
}

/* queue_reason says why queued job jb waits (lock held): its place in its
 * device's queue, the runners busy and the job that runs next ahead of it. */
static void queue_reason(const pt_jobs *m, const job *jb, char *buf, size_t cap)
{
	int runners = m->cfg.max_jobs > 1 ? m->cfg.max_jobs : 1, busy = 0, ahead = 0;
	const job *next = NULL;
	char ids[64] = "";
	size_t o = 0;

	for (size_t i = 0; i < m->n_jobs; i++) {
		const job *j = m->jobs[i];
		if (j == jb || strcmp(j->device, jb->device) != 0)
			continue;
		if (j->state == PT_JOB_STARTING || j->state == PT_JOB_RUNNING) {
			busy++;
			if (o < sizeof(ids) - 24)
				o += (size_t)snprintf(ids + o, sizeof(ids) - o, "%s%" PRIu64,
				                      busy > 1 ? ", " : "", j->id);
		} else if (j->state == PT_JOB_QUEUED && runs_before(j, jb)) {
			ahead++;
			if (next == NULL || runs_before(j, next))
				next = j;
		}
	}
	if (gpu_placed(jb)) {
		int pin = pinned_gpu(jb), i = pin >= 0 ? gpu_index(m, pin) : -1;
		if (i >= 0 && m->gpu_job[i] != 0)
			o = (size_t)snprintf(buf, cap,
			                     "queued: needs cuda:%d, busy with job %" PRIu64, pin,
			                     m->gpu_job[i]);
		else if (i >= 0)
			o = (size_t)snprintf(buf, cap, "queued: needs cuda:%d (free)", pin);
		else
			o = (size_t)snprintf(buf, cap, "queued: needs %d GPU%s, %d of %d free",
			                     jb->spec.stages, jb->spec.stages > 1 ? "s" : "",
			                     gpus_free(m), m->n_gpus);
		if (o < cap && pooled(m, jb)) {
			int free_n = 0, n = pt_pool_counts(m->pool, &free_n, NULL, NULL, NULL);
			o += (size_t)snprintf(
			    buf + o, cap - o, ", or %d pool worker%s, %d of %d free",
			    jb->spec.stages, jb->spec.stages > 1 ? "s" : "", free_n, n);
		}
		if (o < cap && next != NULL)
			snprintf(buf + o, cap - o, "; behind job %" PRIu64 " (priority %d)%s",
			         next->id, next->spec.priority, ahead > 1 ? " and others" : "");
		return;
	}
	if (pooled(m, jb)) {
		int free_n = 0, n = pt_pool_counts(m->pool, &free_n, NULL, NULL, NULL);
		o = (size_t)snprintf(buf, cap, "queued: needs %d worker%s, %d of %d free; ",
		                     jb->spec.stages, jb->spec.stages > 1 ? "s" : "", free_n, n);
		if (m->cfg.no_local) {
			if (o < cap && next != NULL)
				snprintf(buf + o, cap - o, "behind job %" PRIu64 " (priority %d)%s",
				         next->id, next->spec.priority,
				         ahead > 1 ? " and others" : "");
			else if (o >= 2)
				buf[o - 2] = '\0';
			return;
		}
		if (o >= cap)
			return;
		o += (size_t)snprintf(buf + o, cap - o, "or a runner on %s: ", jb->device);
	} else {
		o = (size_t)snprintf(buf, cap, "queued: place %d on %s; ", ahead + 1, jb->device);
	}
	if (o >= cap)
		return;
	if (busy >= runners)
		o += (size_t)snprintf(buf + o, cap - o, "%d of %d runners busy (job%s %s)", busy,
		                      runners, busy > 1 ? "s" : "", ids);
	else
		o += (size_t)snprintf(buf + o, cap - o, "a runner is free");
	if (o < cap && next != NULL)
		snprintf(buf + o, cap - o, "; behind job %" PRIu64 " (priority %d)%s", next->id,
		         next->spec.priority, ahead > 1 ? " and others" : "");
}

/* hook_claim lends a free pool worker to a pooled job as a spare. */
static bool hook_claim(void *ctx, const char *url)
{
	job *jb = ctx;
	return jb->mgr->pool != NULL && pt_pool_claim(jb->mgr->pool, url, jb->id);
}

static void run_one(pt_jobs *m, job *jb)
{
	char ckdir[MAX_PATH + 16], msg[MAX_PATH + 800], note[300], where[160];
	pt_job_run_options o;
	pt_job_hooks h = {.ctx = jb,
	                  .on_metric = hook_metric,
	                  .should_stop = hook_should_stop,
	                  .on_checkpoint = hook_checkpoint,
	                  .on_restart = hook_restart};
	int64_t last = 0;
	pt_api_job_state final;
	pt_err rv;
	double t;

	snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", jb->dir);
	memset(&o, 0, sizeof(o));
	o.checkpoint_dir = ckdir;
	o.files_root = m->files_root;
	o.any_path = m->cfg.any_path;
	o.worker_allow = m->cfg.worker_allow;
	o.resume_from = jb->resume_from;
	o.threads = job_threads(m, false);
	o.worker_token = m->cfg.worker_token;
	o.advertise_host = m->cfg.advertise_host;
	o.worker_tls = m->cfg.worker_tls;
	/* A pooled run: its stages go to the workers the pool lent it (the
	 * operator's list: --worker-allow is for URLs that jobs name). */
	pt_job_spec spec = jb->spec;
	if (jb->pool_urls != NULL) {
		spec.workers = jb->pool_urls;
		spec.n_workers = jb->n_pool;
		o.worker_allow = NULL;
		h.claim_worker = hook_claim;
	}
	/* A GPU-placed run: stage s on jb->gpus[s - 1] (pretend GPUs: the CPU). */
	where[0] = '\0';
	if (jb->n_gpus > 0) {
		char list[96];
		gpu_list(jb, list, sizeof(list));
		snprintf(where, sizeof(where), "stages on %s%s; ", list,
		         m->cfg.fake_gpus ? " (pretend GPUs: the CPU computes)" : "");
		if (!m->cfg.fake_gpus) {
			o.stage_gpus = jb->gpus;
			o.n_stage_gpus = jb->n_gpus;
		}
	}
	journal_state(jb, PT_JOB_STARTING, jb->step, jb->started, NULL);
	pt_info("job %" PRIu64 " (%s) starting on %s%s%s%s", jb->id,
	        jb->spec.name ? jb->spec.name : "",
	        jb->pool_urls ? "pool workers"
	        : jb->n_gpus  ? ""
	                      : jb->device,
	        where, o.resume_from ? ", resuming from " : "", o.resume_from ? o.resume_from : "");
	/* The status states the data read and the evaluation set (kept on success). */
	if (pt_job_data_describe(&jb->spec, o.files_root, o.any_path, note, sizeof(note)) != PT_OK)
		snprintf(note, sizeof(note), "%s", pt_last_error());
	if (pt_job_spec_precision(&jb->spec) == PT_PREC_BF16) {
		size_t at = strlen(note);
		bool gpu = o.n_stage_gpus > 0 || strncmp(jb->device, "cuda:", 5) == 0;
		snprintf(note + at, sizeof(note) - at, "; precision bf16 (%s)",
		         gpu ? "CUDA: cuBLAS GEMMs of bf16 operands, f32 accumulation"
		             : pt_backend_bf16());
	} else if (pt_job_spec_precision(&jb->spec) == PT_PREC_TF32) {
		size_t at = strlen(note);
		snprintf(note + at, sizeof(note) - at,
		         "; precision tf32 (CUDA: cuBLAS with TF32 inputs; CPU: emulated, "
		         "operands rounded to tf32, fp32 GEMMs)");
	}
	snprintf(msg, sizeof(msg), "%s%s", where, note);
	jb->restarts = 0;
	if (o.resume_from)
		snprintf(msg, sizeof(msg), "%s%s; resumed from %s", where, note, o.resume_from);
	pthread_mutex_lock(&m->mu);
	t = now_unix();
	set_state(jb, PT_JOB_RUNNING, msg, t);
	pthread_mutex_unlock(&m->mu);
	journal_state(jb, PT_JOB_RUNNING, jb->step, t, msg);

	rv = pt_job_run(&spec, &o, &h, &last);
	if (rv != PT_OK)
		snprintf(msg, sizeof(msg), "%s: %s", pt_strerror(rv), pt_last_error());
	refresh_checkpoints(m, jb);

	pthread_mutex_lock(&m->mu);
	switch (atomic_load(&jb->stop)) {
	case STOP_CANCEL:
		final = PT_JOB_CANCELLED;
		snprintf(msg, sizeof(msg), "cancelled at step %" PRId64, last);
		break;
	case STOP_SHUTDOWN:
		final = PT_JOB_INTERRUPTED;
		snprintf(msg, sizeof(msg), "server shut down at step %" PRId64, last);
		break;
	default:
		if (rv == PT_OK) {
			final = PT_JOB_SUCCEEDED;
			snprintf(msg, sizeof(msg), "%s", note);
			if (jb->restarts > 0)
				snprintf(msg, sizeof(msg), "succeeded after %d restart%s (%s)",
				         jb->restarts, jb->restarts > 1 ? "s" : "", jb->message);
		} else {
			final = PT_JOB_FAILED;
		}
	}
	if (last > jb->step)
		jb->step = last;
	free(jb->resume_from);
	jb->resume_from = NULL;
	t = now_unix();
	set_state(jb, final, msg, t);
	pthread_mutex_unlock(&m->mu);
	/* This run did not die with the server: the count starts over (fsynced
	 * with the state record below). */
	if (jb->deaths != 0) {
		jb->deaths = 0;
		journal_deaths(jb, 0, false);
	}
	journal_state(jb, final, last, t, msg);
	journal_flush_close(jb);
	pt_info("job %" PRIu64 " %s at step %" PRId64 "%s%s", jb->id, pt_api_job_state_name(final),
	        last, msg[0] ? ": " : "", msg);
}

/* ----------------------------------------------------------- retention -- */

/* job_ended: a job that will not run again. A job is Interrupted only while
 * the server stops (no pruning then) or, after recovery, when its spec says
 * resume: false (those with resume: true are queued again first), so an
 * Interrupted job seen by prune has ended for good. */
static bool job_ended(const job *jb)
{
	return pt_api_job_state_final(jb->state);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)f;
	if ((flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT)
		pt_warn("keep-jobs: removing %s: %s", path, strerror(errno));
	return 0;
}

static int by_end(const void *a, const void *b)
{
	const job *x = *(job *const *)a, *y = *(job *const *)b;
	if (x->finished != y->finished)
		return x->finished < y->finished ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* save_last_id writes the last id handed out to data_dir/last_id (m->mu
 * held): once a deletion may remove the newest job's folder, recovery
 * cannot find it there, and a client must never see an id twice. */
static bool save_last_id(pt_jobs *m)
{
	char path[MAX_PATH + 16], tmp[MAX_PATH + 24], text[32];
	int fd, dfd, n = snprintf(text, sizeof(text), "%" PRIu64 "\n", m->next_id - 1);
	bool ok;

	snprintf(path, sizeof(path), "%s/last_id", m->data_dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
		pt_warn("keep-jobs: writing %s: %s; no job deleted", tmp, strerror(errno));
		return false;
	}
	ok = write(fd, text, (size_t)n) == n && fsync(fd) == 0;
	ok = close(fd) == 0 && ok;
	ok = ok && rename(tmp, path) == 0;
	if (ok && (dfd = open(m->data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
		ok = fsync(dfd) == 0; /* the rename itself is durable */
		close(dfd);
	}
	if (!ok)
		pt_warn("keep-jobs: writing %s: %s; no job deleted", path, strerror(errno));
	return ok;
}

/* load_last_id: ids below what data_dir/last_id holds are taken. */
static void load_last_id(pt_jobs *m)
{
	char path[MAX_PATH + 16];
	unsigned long long id;
	FILE *f;

	snprintf(path, sizeof(path), "%s/last_id", m->data_dir);
	if ((f = fopen(path, "r")) == NULL)
		return;
	if (fscanf(f, "%llu", &id) == 1 && id < UINT64_MAX && id + 1 > m->next_id)
		m->next_id = id + 1;
	fclose(f);
}

/* trash_path: where a pruned job's folder waits to be removed. Recovery
 * reads only folders named by a number, so a leftover is never a job. */
static void trash_path(const pt_jobs *m, uint64_t id, char *out, size_t n)
{
	snprintf(out, n, "%s/jobs/.deleted-%" PRIu64, m->data_dir, id);
}

/* empty_trash removes the folders prune set aside, with m->mu not held: a
 * job's checkpoints may be gigabytes, and no request waits on their
 * unlinking. */
static void empty_trash(pt_jobs *m)
{
	char path[MAX_PATH + 48];
	uint64_t *ids;
	size_t n;

	pthread_mutex_lock(&m->mu);
	ids = m->trash;
	n = m->n_trash;
	m->trash = NULL;
	m->n_trash = m->cap_trash = 0;
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; i < n; i++) {
		trash_path(m, ids[i], path, sizeof(path));
		if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
			pt_warn("keep-jobs: removing %s: %s", path, strerror(errno));
	}
	free(ids);
}

/* to_trash moves a job's folder aside (m->mu held): one rename, so the
 * folder is gone from jobs/ before the lock is given back. */
static bool to_trash(pt_jobs *m, uint64_t id, const char *dir)
{
	char path[MAX_PATH + 48];

	if (m->n_trash == m->cap_trash) {
		size_t cap = m->cap_trash ? 2 * m->cap_trash : 16;
		uint64_t *t = realloc(m->trash, cap * sizeof(*t));
		if (t == NULL)
			return false;
		m->trash = t;
		m->cap_trash = cap;
	}
	trash_path(m, id, path, sizeof(path));
	if (dir != NULL && rename(dir, path) != 0 && errno != ENOENT) {
		pt_warn("keep-jobs: moving %s aside: %s; job %" PRIu64 " kept", dir,
		        strerror(errno), id);
		return false;
	}
	m->trash[m->n_trash++] = id;
	return true;
}

/* prune deletes the jobs that ended first, their folders (journal,
 * checkpoints) with them, while more than --keep-jobs have ended (m->mu
 * held; the caller calls empty_trash once it gives the lock back). A job a
 * thread still uses unlocked (held) or a watcher is parked on is passed over
 * until a later prune; parked watchers are woken when their job ends, so
 * the latter is rare, and a watcher that asks after the deletion gets "no
 * job", as for any unknown id. Nothing is pruned while the server stops. */
static void prune(pt_jobs *m)
{
	size_t n_ended = 0, n_free = 0, drop, k = 0, gone = 0;
	job **v;

	if (m->cfg.keep_jobs <= 0 || m->stopping)
		return;
	for (size_t i = 0; i < m->n_jobs; i++)
		n_ended += job_ended(m->jobs[i]);
	if (n_ended <= (size_t)m->cfg.keep_jobs || (v = malloc(n_ended * sizeof(*v))) == NULL)
		return;
	for (size_t i = 0; i < m->n_jobs; i++) {
		job *jb = m->jobs[i];
		if (job_ended(jb) && jb->held == 0 && jb->n_waiters == 0)
			v[n_free++] = jb;
	}
	qsort(v, n_free, sizeof(*v), by_end);
	drop = n_ended - (size_t)m->cfg.keep_jobs;
	drop = drop < n_free ? drop : n_free;
	if (drop > 0 && m->saved_last_id != m->next_id - 1) {
		if (!save_last_id(m))
			drop = 0;
		else
			m->saved_last_id = m->next_id - 1;
	}
	for (size_t i = 0; i < drop; i++) {
		job *jb = v[i];
		if (!to_trash(m, jb->id, jb->dir))
			continue;
		if (jb->jfd >= 0) {
			close(jb->jfd);
			jb->jfd = -1;
		}
		pt_info("job %" PRIu64 " (%s, %s) deleted: %zu jobs ended, --keep-jobs %d", jb->id,
		        jb->spec.name ? jb->spec.name : "", pt_api_job_state_name(jb->state),
		        n_ended - gone++, m->cfg.keep_jobs);
		jb->held = -1; /* marks it for the sweep below */
	}
	for (size_t i = 0; i < m->n_jobs; i++) {
		if (m->jobs[i]->held == -1)
			job_free(m->jobs[i]);
		else
			m->jobs[k++] = m->jobs[i];
	}
	m->n_jobs = k;
	free(v);
}

static void *runner_main(void *arg)
{
	runner *r = arg;
	pt_jobs *m = r->mgr;

	pthread_setname_np(pthread_self(), "pt-runner");
	pthread_mutex_lock(&m->mu);
	while (!m->stopping) {
		job *jb = next_job(m, r->device);
		if (jb == NULL) {
			pthread_cond_wait(&m->cv, &m->mu);
			continue;
		}
		set_state(jb, PT_JOB_STARTING, NULL, now_unix());
		jb->held++;
		pthread_mutex_unlock(&m->mu);
		run_one(m, jb);
		pthread_mutex_lock(&m->mu);
		jb->held--;
		prune(m);
		pthread_mutex_unlock(&m->mu);
		empty_trash(m);
		pthread_mutex_lock(&m->mu);
	}
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

static void place_queue(pt_jobs *m);

/* pool_run_main runs one job on the pool workers or GPUs it was lent, gives
 * them back and places the queue again. */
static void *pool_run_main(void *arg)
{
	pool_run *pr = arg;
	pt_jobs *m = pr->mgr;
	job *jb = pr->jb;

	pthread_setname_np(pthread_self(), "pt-runner");
	run_one(m, jb);
	if (jb->pool_urls != NULL)
		pt_pool_release(m->pool, jb->id);
	pthread_mutex_lock(&m->mu);
	for (int i = 0; i < jb->n_pool; i++)
		free(jb->pool_urls[i]);
	free(jb->pool_urls);
	jb->pool_urls = NULL;
	jb->n_pool = 0;
	release_gpus(m, jb);
	jb->held--;
	pr->jb = NULL; /* prune may free it; shutdown names the run by pr->id */
	prune(m);
	/* Before done: a done run is joined under the lock, which empty_trash
	 * takes. */
	pthread_mutex_unlock(&m->mu);
	empty_trash(m);
	pthread_mutex_lock(&m->mu);
	place_queue(m); /* before done: it reaps ended runs, never this one */
	pr->done = true;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	return NULL;
}

/* reap_pool_runs joins the pooled runs that ended (lock held; they are done
 * with the lock by then). */
static void reap_pool_runs(pt_jobs *m)
{
	pool_run **pp = &m->pool_runs;

	while (*pp != NULL) {
		pool_run *pr = *pp;
		if (!pr->done) {
			pp = &pr->next;
			continue;
		}
		pthread_join(pr->thread, NULL);
		*pp = pr->next;
		free(pr);
	}
}

static int by_queue_order(const void *a, const void *b)
{
	const job *x = *(job *const *)a, *y = *(job *const *)b;
	return runs_before(x, y) ? -1 : runs_before(y, x) ? 1 : 0;
}

/* place_queue lends free pool workers, else free GPUs of --devices, to
 * queued jobs in queue order (lock held): a job that needs more than is
 * free waits and, unless --strict-priority, the jobs behind it that fit go
 * first (backfill). */
static void place_queue(pt_jobs *m)
{
	job *q[256];
	size_t n = 0;
	int free_n = 0;

	if ((m->pool == NULL && m->n_gpus == 0) || m->stopping)
		return;
	reap_pool_runs(m);
	if (m->pool != NULL)
		pt_pool_counts(m->pool, &free_n, NULL, NULL, NULL);
	for (size_t i = 0; i < m->n_jobs && n < sizeof(q) / sizeof(q[0]); i++)
		if (m->jobs[i]->state == PT_JOB_QUEUED &&
		    (pooled(m, m->jobs[i]) || gpu_placed(m->jobs[i])))
			q[n++] = m->jobs[i];
	qsort(q, n, sizeof(q[0]), by_queue_order);
	for (size_t i = 0; i < n; i++) {
		job *jb = q[i];
		int need = jb->spec.stages, n_urls = 0;
		bool via_pool = pooled(m, jb) && need <= free_n && need <= PT_MAX_STAGES;
		char **urls = NULL;
		pool_run *pr;
		if (!via_pool && !(gpu_placed(jb) && take_gpus(m, jb))) {
			if (m->cfg.strict_priority)
				break;
			continue;
		}
		pr = calloc(1, sizeof(*pr));
		if (via_pool) {
			urls = calloc(PT_MAX_STAGES, sizeof(*urls));
			if (urls == NULL || pr == NULL ||
			    !pt_pool_take(m->pool, need, jb->id, urls)) {
				free(urls);
				free(pr);
				break;
			}
			/* The rest of the pool follows as spares, claimed only if
			 * free when the run needs one (hook_claim). */
			n_urls = need;
			pt_pool_worker *all = NULL;
			int n_all = pt_pool_list(m->pool, &all);
			for (int k = 0; k < n_all && n_urls < PT_MAX_STAGES; k++)
				if (all[k].job != jb->id &&
				    (urls[n_urls] = strdup(all[k].url)) != NULL)
					n_urls++;
			free(all);
			jb->pool_urls = urls;
			jb->n_pool = n_urls;
		} else if (pr == NULL) {
			release_gpus(m, jb);
			break;
		}
		pr->jb = jb;
		pr->id = jb->id;
		pr->mgr = m;
		set_state(jb, PT_JOB_STARTING, NULL, now_unix());
		jb->held++;
		if (pthread_create(&pr->thread, NULL, pool_run_main, pr) != 0) {
			jb->held--;
			if (via_pool)
				pt_pool_release(m->pool, jb->id);
			for (int k = 0; k < n_urls; k++)
				free(urls[k]);
			free(urls);
			free(pr);
			jb->pool_urls = NULL;
			jb->n_pool = 0;
			release_gpus(m, jb);
			set_state(jb, PT_JOB_QUEUED, NULL, now_unix());
			break;
		}
		if (via_pool) {
			pt_info("job %" PRIu64 " placed on %d pool worker%s", jb->id, need,
			        need > 1 ? "s" : "");
			free_n -= need;
		} else {
			char list[96];
			gpu_list(jb, list, sizeof(list));
			pt_info("job %" PRIu64 " placed on %s", jb->id, list);
		}
		pr->next = m->pool_runs;
		m->pool_runs = pr;
	}
}

/* pool_changed: a pool worker became free (the pool's heartbeat thread). */
static void pool_changed(void *ctx)
{
	pt_jobs *m = ctx;
	pthread_mutex_lock(&m->mu);
	place_queue(m);
	pthread_mutex_unlock(&m->mu);
}

/* start_runner starts one runner thread for device dev (lock held). */
static pt_err start_runner(pt_jobs *m, const char *dev)
{
	runner *r;

	if (m->n_runners == m->cap_runners) {
		/* Runners hold pointers to their slot: allocate once, generously. */
		return pt_set_error(PT_ERR_RANGE, "too many runners (%zu)", m->n_runners);
	}
	r = &m->runners[m->n_runners];
	memset(r, 0, sizeof(*r));
	r->mgr = m;
	if ((r->device = strdup(dev)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "runner");
	if (pthread_create(&r->thread, NULL, runner_main, r) != 0) {
		free(r->device);
		return pt_set_error(PT_ERR_NOMEM, "runner thread for %s", dev);
	}
	r->started = true;
	m->n_runners++;
	return PT_OK;
}

/* ensure_runner starts the runners of device dev (max_jobs of them: each
 * runs one job at a time) if it has none (lock held). */
static pt_err ensure_runner(pt_jobs *m, const char *dev)
{
	int want = m->cfg.max_jobs > 1 ? m->cfg.max_jobs : 1, have = 0;

	for (size_t i = 0; i < m->n_runners; i++)
		have += strcmp(m->runners[i].device, dev) == 0;
	for (; have < want; have++)
		PT_TRY(start_runner(m, dev));
	return PT_OK;
}

/* ------------------------------------------------------------ recovery -- */

static void replay(job *jb, const uint8_t *d, size_t n, size_t *good, bool *torn)
{
	size_t off = 0;

	*torn = false;
	while (off + 8 <= n) {
		uint32_t len, crc;
		const uint8_t *p;
		memcpy(&len, d + off, 4);
		memcpy(&crc, d + off + 4, 4);
		if (len > n - off - 8 && len >= 1 && len <= JOURNAL_PIECE - 8)
			break; /* whole, perhaps, past n: the next piece has it */
		if (len < 1 || len > n - off - 8 || crc32(d + off + 8, len) != crc) {
			*torn = true;
			break;
		}
		p = d + off + 8;
		if (p[0] == REC_STATE && len >= 20) {
			int64_t step;
			double t;
			uint16_t ml;
			char msg[1024];
			memcpy(&step, p + 2, 8);
			memcpy(&t, p + 10, 8);
			memcpy(&ml, p + 18, 2);
			/* Bounded by the record and by msg (a crafted record may
			 * claim up to 65535 bytes; journal_state writes <= 900). */
			if (ml > len - 20)
				ml = (uint16_t)(len - 20);
			if (ml > sizeof(msg) - 1)
				ml = (uint16_t)(sizeof(msg) - 1);
			memcpy(msg, p + 20, ml);
			msg[ml] = '\0';
			if (p[1] < PT_JOB_STATE_COUNT)
				apply_state(jb, (pt_api_job_state)p[1], step, t, msg);
		} else if (p[0] == REC_DEATHS && len >= 2) {
			jb->deaths = p[1];
		} else if (p[0] == REC_METRIC && len >= 1 + 8 * 9 + 4 + 4) {
			pt_api_metric_point pt;
			const uint8_t *q = p + 1;
			int32_t ns;
			memset(&pt, 0, sizeof(pt));
#define GET(f, sz)                                                                                 \
	do {                                                                                       \
		memcpy(&(f), q, sz);                                                               \
		q += sz;                                                                           \
	} while (0)
			GET(pt.step, 8);
			GET(pt.loss, 8);
			GET(pt.learning_rate, 4);
			GET(pt.grad_norm, 8);
			GET(pt.samples_per_second, 8);
			GET(pt.tokens_per_second, 8);
			GET(pt.bubble, 8);
			GET(pt.eval_loss, 8);
			GET(pt.eval_accuracy, 8);
			GET(pt.time_unix, 8);
			GET(ns, 4);
#undef GET
			if (ns >= 0 && ns <= PT_API_MAX_STAGES &&
			    (size_t)(q - p) + 8 * (size_t)ns <= len) {
				pt.n_stages = ns;
				memcpy(pt.stage_busy, q, 8 * (size_t)ns);
				add_point(jb, &pt);
				if (pt.step > jb->step)
					jb->step = pt.step;
			}
		}
		off += 8 + (size_t)len;
	}
	*good = off;
}

/* replay_file replays the journal at path a piece at a time (a long job's
 * journal may be larger than memory should hold) and cuts off a torn tail:
 * a record that is cut short or fails its checksum, and all after it. */
static pt_err replay_file(job *jb, const char *path)
{
	uint8_t *buf;
	size_t have = 0, good, done = 0;
	uint64_t size = 0;
	bool torn = false, eof = false;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return PT_OK; /* no journal: no record, which the caller reports */
	if ((buf = malloc(JOURNAL_PIECE)) == NULL) {
		close(fd);
		return pt_set_error(PT_ERR_NOMEM, "job %" PRIu64 ": journal", jb->id);
	}
	while (!torn && !eof) {
		ssize_t r = read(fd, buf + have, JOURNAL_PIECE - have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			pt_warn("job %" PRIu64 ": journal: read: %s", jb->id, strerror(errno));
			break;
		}
		eof = r == 0;
		have += (size_t)r;
		size += (uint64_t)r;
		replay(jb, buf, have, &good, &torn);
		done += good;
		memmove(buf, buf + good, have - good);
		have -= good;
	}
	free(buf);
	close(fd);
	if (torn || have > 0) {
		pt_warn("job %" PRIu64 ": journal has a torn tail (%zu of %" PRIu64
		        "+ bytes good); cutting it off",
		        jb->id, done, size);
		if (truncate(path, (off_t)done) != 0)
			pt_warn("truncate %s: %s", path, strerror(errno));
	}
	return PT_OK;
}

static pt_err recover_job(pt_jobs *m, uint64_t id, job **out)
{
	char path[MAX_PATH + 32];
	void *buf = NULL;
	size_t len = 0;
	job *jb;
	pt_err rv;

	*out = NULL;
	if ((jb = job_new(m, id)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "job %" PRIu64, id);
	snprintf(path, sizeof(path), "%s/spec.job", jb->dir);
	if ((rv = pt_file_read(path, 256u << 20, &buf, &len)) != PT_OK)
		goto fail;
	rv = pt_job_spec_decode(buf, len, &jb->spec);
	free(buf);
	buf = NULL;
	if (rv != PT_OK)
		goto fail;
	jb->device = strdup(device_key(m, &jb->spec));
	if (jb->device == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "job %" PRIu64, id);
		goto fail;
	}
	snprintf(path, sizeof(path), "%s/journal", jb->dir);
	if ((rv = replay_file(jb, path)) != PT_OK)
		goto fail;
	if (jb->submitted == 0) {
		/* spec.job without its Queued record: the submit was never acknowledged. */
		rv = pt_set_error(PT_ERR_NOTFOUND, "job %" PRIu64 ": no journal record", id);
		goto fail;
	}
	remove_temp_files(jb->dir);
	scan_checkpoints(jb->dir, NULL, 0, &jb->ckpts, &jb->n_ckpts);
	*out = jb;
	return PT_OK;
fail:
	job_free(jb);
	return rv;
}

static pt_err recover(pt_jobs *m)
{
	char dir[MAX_PATH + 16];
	DIR *d;
	struct dirent *e;

	snprintf(dir, sizeof(dir), "%s/jobs", m->data_dir);
	PT_TRY(mkdir_p(dir));
	snprintf(dir, sizeof(dir), "%s/lock", m->data_dir);
	if ((m->lock_fd = open(dir, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return pt_set_error(PT_ERR_IO, "open %s: %s", dir, strerror(errno));
	if (flock(m->lock_fd, LOCK_EX | LOCK_NB) != 0)
		return pt_set_error(PT_ERR_STATE, "data dir %s is in use by another pipeserver",
		                    m->data_dir);
	snprintf(dir, sizeof(dir), "%s/jobs", m->data_dir);
	if ((d = opendir(dir)) == NULL)
		return pt_set_error(PT_ERR_IO, "opendir %s: %s", dir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		char *end;
		uint64_t id;
		job *jb;
		if (strncmp(e->d_name, ".deleted-", 9) == 0 &&
		    (id = strtoull(e->d_name + 9, &end, 10)) != 0 && *end == '\0') {
			to_trash(m, id, NULL); /* pruned before a stop: removed once started */
			continue;
		}
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		errno = 0;
		id = strtoull(e->d_name, &end, 10);
		if (*end != '\0' || errno != 0 || id == 0)
			continue;
		if (id >= m->next_id)
			m->next_id = id + 1;
		if (recover_job(m, id, &jb) != PT_OK) {
			pt_warn("recovery: skipping job %" PRIu64 ": %s", id, pt_last_error());
			continue;
		}
		if (insert_job(m, jb) != PT_OK) {
			job_free(jb);
			closedir(d);
			return PT_ERR_NOMEM;
		}
	}
	closedir(d);
	load_last_id(m);

	for (size_t i = 0; i < m->n_jobs; i++) {
		job *jb = m->jobs[i];
		double t = now_unix();
		char msg[600];
		if (jb->state == PT_JOB_STARTING || jb->state == PT_JOB_RUNNING) {
			/* The run died with the server (its Starting record is
			 * fsynced before it trains). */
			jb->deaths++;
			journal_deaths(jb, jb->deaths, false);
			if (jb->deaths >= MAX_DEATHS) {
				snprintf(msg, sizeof(msg),
				         "server died twice while running this job (last at step "
				         "%" PRId64 "); not restarted",
				         jb->step);
				apply_state(jb, PT_JOB_FAILED, jb->step, t, msg);
				journal_state(jb, PT_JOB_FAILED, jb->step, t, msg);
				pt_warn("job %" PRIu64 ": %s", jb->id, msg);
			} else {
				snprintf(msg, sizeof(msg),
				         "server stopped while the job was running (step %" PRId64
				         ")",
				         jb->step);
				apply_state(jb, PT_JOB_INTERRUPTED, jb->step, t, msg);
				journal_state(jb, PT_JOB_INTERRUPTED, jb->step, t, msg);
			}
		}
		if (jb->state == PT_JOB_INTERRUPTED && jb->spec.resume) {
			if (jb->n_ckpts > 0) {
				char p[MAX_PATH + 64];
				snprintf(p, sizeof(p),
				         "%s/checkpoints/step-%" PRId64 ".safetensors", jb->dir,
				         jb->ckpts[jb->n_ckpts - 1].step);
				jb->resume_from = strdup(p);
				snprintf(msg, sizeof(msg),
				         "resuming from the checkpoint of step %" PRId64,
				         jb->ckpts[jb->n_ckpts - 1].step);
			} else {
				snprintf(msg, sizeof(msg),
				         "restarting: no checkpoint to resume from");
			}
			/* Steps after the checkpoint will be trained again: their points
			 * go now, so a watcher never sees a step twice. */
			{
				int64_t keep = jb->n_ckpts ? jb->ckpts[jb->n_ckpts - 1].step : 0;
				while (jb->n_points > 0 && jb->points[jb->n_points - 1].step > keep)
					drop_last_point(jb);
				jb->step = keep;
			}
			apply_state(jb, PT_JOB_QUEUED, jb->step, t, msg);
			journal_state(jb, PT_JOB_QUEUED, jb->step, t, msg);
			journal_flush_close(jb);
			pt_info("job %" PRIu64 ": %s", jb->id, msg);
		}
		if (jb->state == PT_JOB_QUEUED) {
			jb->queue_seq = m->next_seq++;
			if (!gpu_placed(jb))
				PT_TRY(ensure_runner(m, jb->device));
		} else {
			journal_flush_close(jb);
		}
	}
	return PT_OK;
}

/* ------------------------------------------------------------- public -- */

static char *dup_or_null(const char *s)
{
	return s && *s ? strdup(s) : NULL;
}

/* memory_limit_init sets the admission limit: --memory-limit, else what
 * the cgroup or the machine allows. */
static pt_err memory_limit_init(pt_jobs *m)
{
	const char *source = "--memory-limit";
	char text[64];

	if (m->cfg.memory_limit != NULL && m->cfg.memory_limit[0] != '\0')
		PT_TRY(pt_job_memory_parse(m->cfg.memory_limit, &m->mem_limit));
	else
		PT_TRY(pt_job_memory_host_limit(&m->mem_limit, &source));
	pt_job_memory_format(text, sizeof(text), m->mem_limit);
	/* Data files are read whole at submit and at run time: none may be
	 * larger than a job's share (checked before it is read). */
	pt_job_set_file_limit(m->mem_limit / (uint64_t)(m->cfg.max_jobs > 1 ? m->cfg.max_jobs : 1));
	if (m->cfg.max_jobs > 1) {
		char each[64];
		pt_job_memory_format(each, sizeof(each), m->mem_limit / (uint64_t)m->cfg.max_jobs);
		pt_info("jobs: memory limit %s (%s), %s a job with --max-jobs %d", text, source,
		        each, m->cfg.max_jobs);
	} else {
		pt_info("jobs: memory limit %s (%s)", text, source);
	}
	return PT_OK;
}

pt_err pt_jobs_create(pt_jobs **out, const pt_jobs_config *cfg)
{
	pt_jobs *m;
	pt_err rv;

	*out = NULL;
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "jobs");
	m->cfg = *cfg;
	m->cfg.gpus = NULL;
	for (int i = 0; i < cfg->n_gpus && i < MAX_GPUS; i++)
		m->gpus[m->n_gpus++] = cfg->gpus[i];
	m->data_dir = strdup(cfg->data_dir);
	m->device = strdup(cfg->device && *cfg->device ? cfg->device : "cpu");
	m->files_root = dup_or_null(cfg->files_root);
	m->next_id = 1;
	m->lock_fd = -1;
	m->cap_runners = 512;
	m->runners = calloc(m->cap_runners, sizeof(*m->runners));
	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	if (m->data_dir == NULL || m->device == NULL || m->runners == NULL) {
		pt_jobs_destroy(m);
		return pt_set_error(PT_ERR_NOMEM, "jobs");
	}
	if ((rv = memory_limit_init(m)) != PT_OK) {
		pt_jobs_destroy(m);
		return rv;
	}
	if (cfg->pool != NULL && cfg->pool[0] != '\0') {
		pt_pool_config pc = {.spec = cfg->pool, .tls = cfg->worker_tls};
		if ((rv = pt_pool_create(&m->pool, &pc, pool_changed, m)) != PT_OK) {
			pt_jobs_destroy(m);
			return rv;
		}
	}
	pthread_mutex_lock(&m->mu);
	rv = recover(m);
	if (rv == PT_OK) {
		prune(m);
		place_queue(m);
	}
	pthread_mutex_unlock(&m->mu);
	empty_trash(m);
	if (rv != PT_OK) {
		pt_jobs_destroy(m);
		return rv;
	}
	pt_info("jobs: %zu recovered from %s", m->n_jobs, m->data_dir);
	*out = m;
	return PT_OK;
}

/* join_logged joins a thread that is finishing its job's last step and
 * checkpoint, saying every 30 s that shutdown still waits for it (a job that
 * ignores its stop would otherwise hang the server's exit without a word). */
static void join_logged(pthread_t t, const char *what, const char *name)
{
	for (int waited = 30;; waited += 30) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 30;
		if (pthread_timedjoin_np(t, NULL, &until) != ETIMEDOUT)
			return;
		pt_warn("shutdown: still waiting for %s %s after %d s", what, name ? name : "?",
		        waited);
	}
}

void pt_jobs_shutdown(pt_jobs *m)
{
	if (m == NULL)
		return;
	pthread_mutex_lock(&m->mu);
	if (m->shut) {
		pthread_mutex_unlock(&m->mu);
		return;
	}
	m->stopping = true;
	for (size_t i = 0; i < m->n_jobs; i++)
		if (m->jobs[i]->state == PT_JOB_STARTING || m->jobs[i]->state == PT_JOB_RUNNING) {
			/* A job already cancelled ends Cancelled, never Interrupted. */
			int none = STOP_NONE;
			atomic_compare_exchange_strong(&m->jobs[i]->stop, &none, STOP_SHUTDOWN);
		}
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; i < m->n_runners; i++)
		if (m->runners[i].started) {
			join_logged(m->runners[i].thread, "the runner of", m->runners[i].device);
			m->runners[i].started = false;
		}
	/* Pooled runs: stopping keeps place_queue from starting more. */
	pthread_mutex_lock(&m->mu);
	pool_run *runs = m->pool_runs;
	m->pool_runs = NULL;
	pthread_mutex_unlock(&m->mu);
	while (runs != NULL) {
		pool_run *next = runs->next;
		char id[32];
		snprintf(id, sizeof(id), "%" PRIu64, runs->id);
		join_logged(runs->thread, "the pooled run of job", id);
		free(runs);
		runs = next;
	}
	pt_pool_destroy(m->pool); /* its heartbeats may call pool_changed: no lock held */
	pthread_mutex_lock(&m->mu);
	m->pool = NULL;
	m->shut = true;
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; i < m->n_jobs; i++)
		journal_flush_close(m->jobs[i]);
}

void pt_jobs_destroy(pt_jobs *m)
{
	if (m == NULL)
		return;
	pt_jobs_shutdown(m);
	for (size_t i = 0; i < m->n_jobs; i++)
		job_free(m->jobs[i]);
	for (size_t i = 0; i < m->n_runners; i++)
		free(m->runners[i].device);
	free(m->runners);
	free(m->jobs);
	free(m->data_dir);
	free(m->device);
	free(m->files_root);
	free(m->trash);
	if (m->lock_fd >= 0)
		close(m->lock_fd);
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

static pt_err write_spec(job *jb)
{
	pt_fb_builder b;
	pt_fb_ref ref;
	const uint8_t *data;
	size_t size;
	char path[MAX_PATH + 16];
	pt_err rv;

	PT_TRY(pt_fb_builder_init(&b, 4096));
	if ((rv = pt_job_spec_build(&b, &jb->spec, &ref)) == PT_OK &&
	    (rv = pt_fb_finish(&b, ref, NULL, &data, &size)) == PT_OK) {
		pt_file_part part = {data, size};
		snprintf(path, sizeof(path), "%s/spec.job", jb->dir);
		rv = pt_file_write_atomic(path, &part, 1);
	}
	pt_fb_builder_fini(&b);
	return rv;
}

/* remove_job_dir removes what a failed submit made of jb's directory (a
 * full disk must not leave an empty jobs/<id>/ that recovery would skip
 * forever); nothing else is there yet. */
static void remove_job_dir(job *jb)
{
	static const char *const files[] = {"journal", "spec.job"};
	char p[MAX_PATH + 32];

	if (jb->jfd >= 0) {
		close(jb->jfd);
		jb->jfd = -1;
	}
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", jb->dir, files[i]);
		if (unlink(p) != 0 && errno != ENOENT)
			pt_warn("submit cleanup: unlink %s: %s", p, strerror(errno));
	}
	snprintf(p, sizeof(p), "%s/checkpoints", jb->dir);
	if (rmdir(p) != 0 && errno != ENOENT)
		pt_warn("submit cleanup: rmdir %s: %s", p, strerror(errno));
	if (rmdir(jb->dir) != 0 && errno != ENOENT)
		pt_warn("submit cleanup: rmdir %s: %s", jb->dir, strerror(errno));
}

/* gpu_names writes the server's GPUs as "cuda:0,cuda:1". */
static void gpu_names(const pt_jobs *m, char *buf, size_t cap)
{
	size_t o = 0;
	buf[0] = '\0';
	for (int i = 0; i < m->n_gpus && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%scuda:%d", i ? "," : "", m->gpus[i]);
}

/* check_gpu_named refuses, before the spec's own checks, a device cuda:N
 * that is not among the server's --devices GPUs. */
static pt_err check_gpu_named(pt_jobs *m, const pt_job_spec *s)
{
	char names[256];
	const char *d = s->device;
	char *end;
	long n;

	if (m->n_gpus == 0 || s->n_workers > 0 || d == NULL || strncmp(d, "cuda:", 5) != 0)
		return PT_OK;
	n = strtol(d + 5, &end, 10);
	if (d[5] >= '0' && d[5] <= '9' && *end == '\0' && n <= 1023 && gpu_index(m, (int)n) >= 0)
		return PT_OK;
	gpu_names(m, names, sizeof(names));
	return pt_set_error(PT_ERR_INVALID,
	                    "device: \"%.40s\" is not one of this server's GPUs (%s)", d, names);
}

/* check_fit refuses a job that could never run here: stages on local
 * devices with --devices none and no pool, more stages than the pool has
 * workers and no local devices to fall back to, or more stages than the
 * GPUs (one stage a GPU) and the pool's workers. */
/* job_threads: a job's thread budget: --threads, else the cores split
 * between --max-jobs (0 when neither is set and !resolved: the runner's
 * default, all the cores). */
static int job_threads(const pt_jobs *m, bool resolved)
{
	int cores = pt_num_cores();
	if (m->cfg.threads > 0)
		return m->cfg.threads;
	if (m->cfg.max_jobs > 1)
		return cores / m->cfg.max_jobs > 0 ? cores / m->cfg.max_jobs : 1;
	return resolved ? cores : 0;
}

/* check_threads: a job's stages in this process, each with its own team of
 * placement.threads_per_stage threads, stay within the job's budget (at
 * least one thread a stage): thousands of threads only oversubscribe the
 * cores, and can exhaust the process's threads. */
static pt_err check_threads(const pt_jobs *m, const pt_job_spec *s)
{
	int budget = job_threads(m, true);
	int64_t want = (int64_t)s->threads_per_stage * s->stages;
	if (s->threads_per_stage <= 0 || s->n_workers > 0 || want <= budget ||
	    s->threads_per_stage == 1)
		return PT_OK;
	return pt_set_error(PT_ERR_RANGE,
	                    "placement.threads_per_stage: %d threads for each of %d stages is %ld, "
	                    "more than this server gives a job (%d: --threads, --max-jobs)",
	                    s->threads_per_stage, s->stages, (long)want, budget);
}

static pt_err check_fit(pt_jobs *m, const pt_job_spec *s)
{
	char names[256];
	int n;

	if (s->n_workers > 0)
		return PT_OK;
	n = m->pool != NULL ? pt_pool_counts(m->pool, NULL, NULL, NULL, NULL) : 0;
	if (m->n_gpus > 0 && (s->device == NULL || s->device[0] == '\0')) {
		if (s->stages <= m->n_gpus || s->stages <= n)
			return PT_OK;
		gpu_names(m, names, sizeof(names));
		if (m->pool == NULL)
			return pt_set_error(
			    PT_ERR_INVALID,
			    "placement.stages: %d stages need %d GPUs (one stage a GPU); "
			    "this server has %d (%s) and no --pool",
			    s->stages, s->stages, m->n_gpus, names);
		return pt_set_error(PT_ERR_INVALID,
		                    "placement.stages: %d stages need %d GPUs (one stage a GPU) or "
		                    "%d pool workers; this server has %d GPUs (%s) and %d workers",
		                    s->stages, s->stages, s->stages, m->n_gpus, names, n);
	}
	if (!m->cfg.no_local || (s->device != NULL && strncmp(s->device, "cuda:", 5) == 0))
		return PT_OK;
	if (m->pool == NULL)
		return pt_set_error(PT_ERR_INVALID, "placement.workers: this server runs no stages "
		                                    "on its CPU (--devices) and has no "
		                                    "--pool; name the workers of the job's stages");
	if (s->stages > n)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "placement.stages: %d stages need %d pool workers; the pool has "
		    "%d and this server runs no stages on its CPU (--devices)",
		    s->stages, s->stages, n);
	return PT_OK;
}

/* queue_full refuses a submit while --max-queued jobs wait (m->mu held):
 * each holds its directory, its spec and a place in memory. */
static pt_err queue_full(pt_jobs *m)
{
	int q = 0;
	if (m->cfg.max_queued <= 0)
		return PT_OK;
	for (size_t i = 0; i < m->n_jobs; i++)
		q += m->jobs[i]->state == PT_JOB_QUEUED;
	if (q < m->cfg.max_queued)
		return PT_OK;
	return pt_set_error(PT_ERR_BUSY,
	                    "the queue is full: %d jobs wait to run (--max-queued %d); submit "
	                    "again when one has started or been cancelled",
	                    q, m->cfg.max_queued);
}

/* disk_low refuses a submit while the data dir's file system has less than
 * --min-free-mb free: a job's checkpoints and journal would fill it, and
 * every job's journal and checkpoints with it. */
static pt_err disk_low(const pt_jobs *m)
{
	struct statvfs v;
	uint64_t free_mb;

	if (m->cfg.min_free_mb <= 0 || statvfs(m->cfg.data_dir, &v) != 0)
		return PT_OK;
	free_mb = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize >> 20;
	if (free_mb >= (uint64_t)m->cfg.min_free_mb)
		return PT_OK;
	return pt_set_error(PT_ERR_BUSY,
	                    "the data dir has %" PRIu64 " MiB free, under --min-free-mb %d: submit "
	                    "again when space is freed",
	                    free_mb, m->cfg.min_free_mb);
}

pt_err pt_jobs_submit(pt_jobs *m, const uint8_t *spec_table, uint64_t *id)
{
	char ckdir[MAX_PATH + 16];
	job *jb = NULL;
	uint64_t nid;
	pt_err rv;
	double t;

	*id = 0;
	pthread_mutex_lock(&m->mu);
	if (m->stopping) {
		pthread_mutex_unlock(&m->mu);
		return pt_set_error(PT_ERR_CLOSED, "server is shutting down");
	}
	rv = queue_full(m);
	pthread_mutex_unlock(&m->mu);
	if (rv != PT_OK)
		return rv;

	/* The id is taken once the spec is accepted: a refused submission
	 * consumes none. */
	if ((jb = job_new(m, 0)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "job");
	if ((rv = pt_job_spec_read(spec_table, &jb->spec)) != PT_OK)
		goto fail;
	if ((jb->spec.device == NULL || jb->spec.device[0] == '\0') &&
	    (m->n_gpus == 0 || jb->spec.n_workers > 0)) {
		free(jb->spec.device);
		if ((jb->spec.device = strdup(m->device)) == NULL) {
			rv = pt_set_error(PT_ERR_NOMEM, "job");
			goto fail;
		}
	}
	if ((rv = check_gpu_named(m, &jb->spec)) != PT_OK)
		goto fail;
	if ((rv = pt_job_spec_validate(&jb->spec, m->files_root, m->cfg.any_path)) != PT_OK) {
		/* A data file the spec names that cannot be read is the spec's fault. */
		if (rv == PT_ERR_IO) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s", pt_last_error());
			rv = pt_set_error(PT_ERR_INVALID, "%s", msg);
		}
		goto fail;
	}
	if ((rv = pt_job_spec_check_workers(&jb->spec, m->cfg.worker_allow)) != PT_OK)
		goto fail;
	if ((rv = check_fit(m, &jb->spec)) != PT_OK || (rv = check_threads(m, &jb->spec)) != PT_OK)
		goto fail;
	/* With max_jobs running at once, each has its share of the memory. */
	if ((rv = pt_job_admit(&jb->spec, m->files_root, m->cfg.any_path,
	                       m->mem_limit / (uint64_t)(m->cfg.max_jobs > 1 ? m->cfg.max_jobs : 1),
	                       NULL)) != PT_OK) {
		if (rv == PT_ERR_IO) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s", pt_last_error());
			rv = pt_set_error(PT_ERR_INVALID, "%s", msg);
		}
		goto fail;
	}
	if ((jb->device = strdup(device_key(m, &jb->spec))) == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "job");
		goto fail;
	}
	if ((rv = disk_low(m)) != PT_OK)
		goto fail;
	pthread_mutex_lock(&m->mu);
	nid = m->next_id++;
	pthread_mutex_unlock(&m->mu);
	jb->id = nid;
	job_set_dir(jb);
	snprintf(ckdir, sizeof(ckdir), "%s/checkpoints", jb->dir);
	if ((rv = mkdir_p(ckdir)) != PT_OK || (rv = write_spec(jb)) != PT_OK)
		goto fail_io;
	t = now_unix();
	apply_state(jb, PT_JOB_QUEUED, 0, t, NULL);
	if ((rv = journal_state(jb, PT_JOB_QUEUED, 0, t, NULL)) != PT_OK)
		goto fail_io;
	/* A queued job holds no descriptor: thousands may wait (the journal
	 * reopens at its next record). */
	journal_flush_close(jb);

	pthread_mutex_lock(&m->mu);
	if (m->stopping) {
		pthread_mutex_unlock(&m->mu);
		rv = pt_set_error(PT_ERR_CLOSED, "server is shutting down");
		goto fail_io;
	}
	if ((rv = queue_full(m)) != PT_OK || (rv = insert_job(m, jb)) != PT_OK) {
		pthread_mutex_unlock(&m->mu);
		goto fail_io;
	}
	jb->queue_seq = m->next_seq++;
	place_queue(m); /* the pool first: free workers before a local runner */
	if (!gpu_placed(jb) && (rv = ensure_runner(m, jb->device)) != PT_OK) {
		/* Journaled but no runner: fail it visibly rather than lose it. */
		char msg[300];
		snprintf(msg, sizeof(msg), "no runner: %s", pt_last_error());
		set_state(jb, PT_JOB_FAILED, msg, now_unix());
		jb->held++; /* ended: --keep-jobs may delete it once the record is written */
		pthread_mutex_unlock(&m->mu);
		journal_state(jb, PT_JOB_FAILED, 0, now_unix(), msg);
		pthread_mutex_lock(&m->mu);
		jb->held--;
		prune(m);
		pthread_mutex_unlock(&m->mu);
		empty_trash(m);
		*id = nid;
		return PT_OK;
	}
	/* Logged under the lock: once it is released the job may be cancelled
	 * and deleted (--keep-jobs) at any time. */
	pt_info("job %" PRIu64 " (%s) queued on %s", nid, jb->spec.name ? jb->spec.name : "",
	        jb->device);
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	*id = nid;
	return PT_OK;
fail_io:
	pt_error("job %" PRIu64 ": submit failed: %s", nid, pt_last_error());
fail:
	if (rv != PT_OK && jb->id != 0)
		remove_job_dir(jb);
	job_free(jb);
	return rv;
}

pt_err pt_jobs_plan(pt_jobs *m, const uint8_t *spec_table, const int32_t *stages, int n_stages,
                    const int32_t *microbatches, int n_microbatches, pt_job_plan **out, int *n)
{
	pt_job_spec spec;
	int ps[8], ms[8];
	pt_err rv;

	memset(&spec, 0, sizeof(spec));
	*out = NULL;
	*n = 0;
	for (int i = 0; i < n_stages && i < 8; i++)
		ps[i] = stages[i];
	for (int i = 0; i < n_microbatches && i < 8; i++)
		ms[i] = microbatches[i];
	/* One plan at a time: measuring layers takes the CPU a job would get.
	 * What a plan builds is admitted as the job itself would be. */
	static pthread_mutex_t plan_mu = PTHREAD_MUTEX_INITIALIZER;
	/* A second plan is turned away, not queued: waiting plans would hold
	 * the API's worker threads, and every other request behind them. */
	if (pthread_mutex_trylock(&plan_mu) != 0)
		return pt_set_error(PT_ERR_BUSY, "another plan is running; try again when it ends");
	if ((rv = pt_job_spec_read(spec_table, &spec)) == PT_OK &&
	    (rv = pt_job_spec_validate(&spec, m->files_root, m->cfg.any_path)) == PT_OK &&
	    (rv = check_threads(m, &spec)) == PT_OK &&
	    (rv = pt_job_admit(&spec, m->files_root, m->cfg.any_path,
	                       m->mem_limit / (uint64_t)(m->cfg.max_jobs > 1 ? m->cfg.max_jobs : 1),
	                       NULL)) == PT_OK) {
		pt_job_plan_options o = {.files_root = m->files_root,
		                         .any_path = m->cfg.any_path,
		                         .threads = job_threads(m, false),
		                         .host_limit =
		                             m->mem_limit /
		                             (uint64_t)(m->cfg.max_jobs > 1 ? m->cfg.max_jobs : 1),
		                         .stages = n_stages > 0 ? ps : NULL,
		                         .n_stages = n_stages < 8 ? n_stages : 8,
		                         .microbatches = n_microbatches > 0 ? ms : NULL,
		                         .n_microbatches = n_microbatches < 8 ? n_microbatches : 8};
		rv = pt_job_plan_run(&spec, &o, out, n);
	}
	pthread_mutex_unlock(&plan_mu);
	if (rv == PT_ERR_IO) {
		char msg[1024];
		snprintf(msg, sizeof(msg), "%s", pt_last_error());
		rv = pt_set_error(PT_ERR_INVALID, "%s", msg);
	}
	pt_job_spec_fini(&spec);
	return rv;
}

void pt_jobs_pool_counts(pt_jobs *m, int32_t *all, int32_t *free_n, int32_t *busy,
                         int32_t *unreachable)
{
	int f = 0, b = 0, u = 0, n = 0;

	pthread_mutex_lock(&m->mu);
	if (m->pool != NULL)
		n = pt_pool_counts(m->pool, &f, NULL, &b, &u);
	pthread_mutex_unlock(&m->mu);
	*all = n;
	*free_n = f;
	*busy = b;
	*unreachable = u;
}

int pt_jobs_devices_in_use(pt_jobs *m)
{
	const char *seen[64];
	int n = 0;

	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < m->n_jobs; i++) {
		const job *jb = m->jobs[i];
		bool dup = false;
		if ((jb->state != PT_JOB_STARTING && jb->state != PT_JOB_RUNNING) ||
		    jb->pool_urls != NULL || jb->spec.n_workers > 0 || gpu_placed(jb))
			continue;
		for (int k = 0; k < n && !dup; k++)
			dup = strcmp(seen[k], jb->device) == 0;
		if (!dup && n < 64)
			seen[n++] = jb->device;
	}
	n += m->n_gpus - gpus_free(m);
	pthread_mutex_unlock(&m->mu);
	return n;
}

void pt_jobs_describe_devices(pt_jobs *m, char *buf, size_t cap)
{
	size_t o = 0;

	if (cap == 0)
		return;
	buf[0] = '\0';
	pthread_mutex_lock(&m->mu);
	if (!m->cfg.no_local)
		o += (size_t)snprintf(buf, cap, "%s", m->device);
	for (int i = 0; i < m->n_gpus && o < cap; i++) {
		if (m->gpu_job[i] != 0)
			o += (size_t)snprintf(buf + o, cap - o, "%scuda:%d (job %" PRIu64 ")",
			                      o ? ", " : "", m->gpus[i], m->gpu_job[i]);
		else
			o += (size_t)snprintf(buf + o, cap - o, "%scuda:%d (free)", o ? ", " : "",
			                      m->gpus[i]);
	}
	if (m->n_gpus > 0 && m->cfg.fake_gpus && o < cap)
		snprintf(buf + o, cap - o, "; pretend GPUs (PIPETRAIN_FAKE_GPUS)");
	pthread_mutex_unlock(&m->mu);
}

pt_err pt_jobs_reply_workers(pt_jobs *m, uint64_t req_id, pt_fb_builder *b, const uint8_t **data,
                             size_t *size)
{
	pt_pool_worker *w = NULL;
	pt_api_worker_info *wi = NULL;
	pt_api_response r;
	int n = 0;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	if (m->pool != NULL)
		n = pt_pool_list(m->pool, &w);
	pthread_mutex_unlock(&m->mu);
	if (n < 0 || (n > 0 && (wi = calloc((size_t)n, sizeof(*wi))) == NULL)) {
		free(w);
		return pt_set_error(PT_ERR_NOMEM, "worker list");
	}
	for (int i = 0; i < n; i++) {
		wi[i].url = w[i].url;
		wi[i].state = (pt_api_worker_state)w[i].state;
		wi[i].job = w[i].job;
		wi[i].draining = w[i].draining;
		wi[i].since_unix = w[i].since;
		wi[i].last_heartbeat_unix = w[i].last_heartbeat;
		wi[i].message = w[i].message;
		wi[i].devices = w[i].devices[0] ? w[i].devices : NULL;
	}
	pt_api_response_init(&r, req_id, PT_API_OK, PT_API_LIST_WORKERS);
	r.workers = wi;
	r.n_workers = (size_t)n;
	rv = pt_api_build_response(b, &r, data, size);
	free(wi);
	free(w);
	return rv;
}

pt_err pt_jobs_drain_worker(pt_jobs *m, const char *url)
{
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	rv = m->pool != NULL ? pt_pool_drain(m->pool, url)
	                     : pt_set_error(PT_ERR_NOTFOUND, "this server has no worker pool");
	pthread_mutex_unlock(&m->mu);
	return rv;
}

pt_err pt_jobs_reload_pool(pt_jobs *m)
{
	pt_err rv = PT_OK;

	if (m->pool != NULL && (rv = pt_pool_reload(m->pool)) == PT_OK) {
		pthread_mutex_lock(&m->mu);
		place_queue(m);
		pthread_mutex_unlock(&m->mu);
	}
	return rv;
}

pt_err pt_jobs_cancel(pt_jobs *m, uint64_t id, pt_api_job_state *state)
{
	job *jb;
	double t;

	pthread_mutex_lock(&m->mu);
	if ((jb = find_job(m, id)) == NULL) {
		pt_err nf = no_job(m, id);
		pthread_mutex_unlock(&m->mu);
		return nf;
	}
	*state = jb->state;
	if (pt_api_job_state_final(jb->state)) {
		pthread_mutex_unlock(&m->mu);
		return pt_set_error(PT_ERR_STATE, "job %" PRIu64 " already %s", id,
		                    pt_api_job_state_name(jb->state));
	}
	if (jb->state == PT_JOB_QUEUED) {
		t = now_unix();
		set_state(jb, PT_JOB_CANCELLED, "cancelled while queued", t);
		*state = PT_JOB_CANCELLED;
		jb->held++;
		pthread_mutex_unlock(&m->mu);
		journal_state(jb, PT_JOB_CANCELLED, jb->step, t, "cancelled while queued");
		journal_flush_close(jb);
		pthread_mutex_lock(&m->mu);
		jb->held--;
		prune(m);
		pthread_mutex_unlock(&m->mu);
		empty_trash(m);
		return PT_OK;
	}
	/* Its runner sees the flag between steps; whatever it was doing, the
	 * job ends Cancelled (the final state is decided under m->mu, after
	 * this), so that is the state the reply gives. */
	atomic_store(&jb->stop, STOP_CANCEL);
	*state = PT_JOB_CANCELLED;
	pthread_mutex_unlock(&m->mu);
	return PT_OK;
}

/* fill_info describes jb (lock held); a queued job's message is why it
 * waits (queue_reason, into reason, QUEUE_REASON bytes), then its own. */
#define QUEUE_REASON 512
static void fill_info(const pt_jobs *m, const job *jb, pt_api_job_info *ji, bool with_spec,
                      char *reason)
{
	memset(ji, 0, sizeof(*ji));
	ji->id = jb->id;
	ji->name = jb->spec.name;
	ji->state = jb->state;
	ji->message = jb->message[0] ? jb->message : NULL;
	if (jb->state == PT_JOB_QUEUED && reason != NULL) {
		queue_reason(m, jb, reason, QUEUE_REASON);
		if (jb->message[0]) {
			size_t o = strlen(reason);
			snprintf(reason + o, QUEUE_REASON - o, " (%.300s)", jb->message);
		}
		ji->message = reason;
	}
	ji->step = jb->step;
	ji->steps = jb->spec.steps;
	ji->submitted_unix = jb->submitted;
	ji->started_unix = jb->started;
	ji->finished_unix = jb->finished;
	if (jb->n_points > 0) {
		ji->has_last = true;
		expand(jb, &jb->points[jb->n_points - 1], &ji->last);
	}
	ji->spec = with_spec ? &jb->spec : NULL;
	ji->stages = jb->stages;
	ji->n_stages = jb->n_stages;
	if (with_spec) { /* GetJob */
		ji->timeline = jb->timeline;
		ji->n_timeline = jb->n_timeline;
	}
}

pt_err pt_jobs_reply_get(pt_jobs *m, uint64_t req_id, uint64_t id, pt_fb_builder *b,
                         const uint8_t **data, size_t *size)
{
	pt_api_response r;
	pt_api_job_info ji;
	job *jb;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	if ((jb = find_job(m, id)) == NULL) {
		pt_err nf = no_job(m, id);
		pthread_mutex_unlock(&m->mu);
		return nf;
	}
	char reason[QUEUE_REASON];
	fill_info(m, jb, &ji, true, reason);
	pt_api_response_init(&r, req_id, PT_API_OK, PT_API_GET_JOB);
	r.jobs = &ji;
	r.n_jobs = 1;
	rv = pt_api_build_response(b, &r, data, size);
	pthread_mutex_unlock(&m->mu);
	return rv;
}

pt_err pt_jobs_reply_list(pt_jobs *m, uint64_t req_id, pt_fb_builder *b, const uint8_t **data,
                          size_t *size)
{
	pt_api_response r;
	pt_api_job_info *v;
	pt_err rv;

	char *reasons;

	pthread_mutex_lock(&m->mu);
	v = calloc(m->n_jobs ? m->n_jobs : 1, sizeof(*v));
	reasons = malloc((m->n_jobs ? m->n_jobs : 1) * QUEUE_REASON);
	if (v == NULL || reasons == NULL) {
		pthread_mutex_unlock(&m->mu);
		free(v);
		free(reasons);
		return pt_set_error(PT_ERR_NOMEM, "list");
	}
	for (size_t i = 0; i < m->n_jobs; i++)
		fill_info(m, m->jobs[i], &v[i], false, reasons + i * QUEUE_REASON);
	pt_api_response_init(&r, req_id, PT_API_OK, PT_API_LIST_JOBS);
	r.jobs = v;
	r.n_jobs = m->n_jobs;
	rv = pt_api_build_response(b, &r, data, size);
	pthread_mutex_unlock(&m->mu);
	free(v);
	free(reasons);
	return rv;
}

/* watch_points returns the calling thread's buffer for n (<= MAX_WATCH_POINTS)
 * metric points, kept between replies: a reply's points (~590 bytes each,
 * 350 KB for a 4-stage job's 0.4 s of steps) would otherwise be mapped,
 * faulted in and unmapped again for every watcher. */
static pt_api_metric_point *watch_points(size_t n)
{
	return pt_thread_buffer(PT_SLOT_WATCH_POINTS, n * sizeof(pt_api_metric_point));
}

pt_err pt_jobs_reply_watch(pt_jobs *m, const pt_api_request *q, pt_jobs_waiter *w, pt_fb_builder *b,
                           const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_response r;
	job *jb;
	size_t lo, hi, n, maxp;
	bool ended;

	*parked = false;
	pthread_mutex_lock(&m->mu);
	if ((jb = find_job(m, q->job)) == NULL) {
		pt_err nf = no_job(m, q->job);
		pthread_mutex_unlock(&m->mu);
		return nf;
	}
	/* First point with step > cursor (steps increase). */
	lo = 0;
	hi = jb->n_points;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (jb->points[mid].step <= q->cursor)
			lo = mid + 1;
		else
			hi = mid;
	}
	maxp = q->max_points <= 0 ? 1000 : (size_t)q->max_points;
	if (maxp > MAX_WATCH_POINTS)
		maxp = MAX_WATCH_POINTS;
	n = jb->n_points - lo;
	if (n > maxp)
		n = maxp;
	ended = pt_api_job_state_final(jb->state);
	/* A poll that finds new points spends a token of the job's budget;
	 * with none left it waits for the next wake like one that found none
	 * (a hundred clients polling again at once after every reply would
	 * otherwise take a reply per step each). */
	bool no_tokens = false;
	if (n > 0 && !ended && w != NULL && q->wait_ms > 0 && !m->stopping &&
	    m->cfg.watch_replies > 0) {
		refill(m, jb, now_mono());
		no_tokens = jb->watch_tokens < 1.0;
		if (!no_tokens)
			jb->watch_tokens -= 1.0;
		else
			jb->wake_pending = true;
	}
	if ((n == 0 || no_tokens) && !ended && w != NULL && q->wait_ms > 0 && !m->stopping) {
		w->next = &jb->waiters;
		w->prev = jb->waiters.prev;
		w->prev->next = w;
		jb->waiters.prev = w;
		w->linked = true;
		w->job = jb;
		jb->n_waiters++;
		*parked = true;
		pthread_mutex_unlock(&m->mu);
		return PT_OK;
	}
	/* The points are copied and the reply built after the lock is given
	 * back: the job's runner takes the lock for every step's metric, and
	 * a hundred watchers woken at once must not hold it up. */
	pt_api_metric_point *copy = n ? watch_points(n) : NULL;
	if (n && copy == NULL) {
		pthread_mutex_unlock(&m->mu);
		return pt_set_error(PT_ERR_NOMEM, "%zu metric points", n);
	}
	for (size_t i = 0; i < n; i++)
		expand(jb, &jb->points[lo + i], &copy[i]);
	pt_api_response_init(&r, q->id, PT_API_OK, PT_API_WATCH_METRICS);
	r.points = copy;
	r.n_points = n;
	r.cursor = n ? copy[n - 1].step : q->cursor;
	r.state = jb->state;
	r.ended = ended && lo + n == jb->n_points;
	pthread_mutex_unlock(&m->mu);
	return pt_api_build_response(b, &r, data, size);
}

void pt_jobs_unwatch(pt_jobs *m, pt_jobs_waiter *w)
{
	pthread_mutex_lock(&m->mu);
	if (w->linked) {
		job *jb = w->job;
		jb->n_waiters--;
		w->prev->next = w->next;
		w->next->prev = w->prev;
		w->next = w->prev = NULL;
		w->linked = false;
		if (jb->n_waiters == 0 && job_ended(jb))
			prune(m); /* it may have waited for this watcher to leave */
	}
	pthread_mutex_unlock(&m->mu);
	empty_trash(m);
}

pt_err pt_jobs_reply_checkpoints(pt_jobs *m, uint64_t req_id, uint64_t id, pt_fb_builder *b,
                                 const uint8_t **data, size_t *size)
{
	pt_api_response r;
	pt_api_checkpoint_info *v;
	job *jb;
	pt_err rv;

	pthread_mutex_lock(&m->mu);
	if ((jb = find_job(m, id)) == NULL) {
		pt_err nf = no_job(m, id);
		pthread_mutex_unlock(&m->mu);
		return nf;
	}
	v = calloc(jb->n_ckpts ? jb->n_ckpts : 1, sizeof(*v));
	if (v == NULL) {
		pthread_mutex_unlock(&m->mu);
		return pt_set_error(PT_ERR_NOMEM, "checkpoints");
	}
	for (size_t i = 0; i < jb->n_ckpts; i++) {
		v[i].step = jb->ckpts[i].step;
		v[i].size = jb->ckpts[i].size;
		v[i].sha256 = jb->ckpts[i].sha256;
	}
	pt_api_response_init(&r, req_id, PT_API_OK, PT_API_LIST_CHECKPOINTS);
	r.checkpoints = v;
	r.n_checkpoints = jb->n_ckpts;
	rv = pt_api_build_response(b, &r, data, size);
	pthread_mutex_unlock(&m->mu);
	free(v);
	return rv;
}

pt_err pt_jobs_checkpoint(pt_jobs *m, uint64_t id, int64_t step, char *path, size_t path_cap,
                          int64_t *out_step, uint64_t *size, char sha256[PT_SHA256_HEX])
{
	job *jb;
	const ckpt *c = NULL;

	pthread_mutex_lock(&m->mu);
	if ((jb = find_job(m, id)) == NULL) {
		pt_err nf = no_job(m, id);
		pthread_mutex_unlock(&m->mu);
		return nf;
	}
	if (step < -1) {
		pthread_mutex_unlock(&m->mu);
		return pt_set_error(PT_ERR_INVALID,
		                    "step: %" PRId64 " is not a step (-1: the latest checkpoint)",
		                    step);
	}
	if (step < 0) {
		if (jb->n_ckpts)
			c = &jb->ckpts[jb->n_ckpts - 1];
	} else {
		for (size_t i = 0; i < jb->n_ckpts; i++)
			if (jb->ckpts[i].step == step)
				c = &jb->ckpts[i];
	}
	if (c == NULL) {
		pthread_mutex_unlock(&m->mu);
		if (step < 0)
			return pt_set_error(PT_ERR_NOTFOUND, "job %" PRIu64 " has no checkpoint",
			                    id);
		return pt_set_error(PT_ERR_NOTFOUND,
		                    "job %" PRIu64 " has no checkpoint at step %" PRId64, id, step);
	}
	snprintf(path, path_cap, "%s/checkpoints/step-%" PRId64 ".safetensors", jb->dir, c->step);
	*out_step = c->step;
	*size = c->size;
	memcpy(sha256, c->sha256, PT_SHA256_HEX);
	pthread_mutex_unlock(&m->mu);
	return PT_OK;
}

void pt_jobs_counts(pt_jobs *m, int *queued, int *running)
{
	int q = 0, r = 0;

	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < m->n_jobs; i++) {
		if (m->jobs[i]->state == PT_JOB_QUEUED)
			q++;
		else if (m->jobs[i]->state == PT_JOB_STARTING ||
		         m->jobs[i]->state == PT_JOB_RUNNING)
			r++;
	}
	pthread_mutex_unlock(&m->mu);
	*queued = q;
	*running = r;
}

pt_err pt_jobs_replay_journal(const uint8_t *journal, size_t n, size_t *good, pt_fb_builder *b,
                              const uint8_t **data, size_t *size)
{
	pt_jobs m = {.data_dir = (char *)"", .device = (char *)"cpu"};
	pt_api_response r;
	pt_api_job_info ji;
	job *jb;
	pt_err rv;

	bool torn;

	if ((jb = job_new(&m, 1)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "job");
	replay(jb, journal, n, good, &torn);
	fill_info(&m, jb, &ji, false, NULL);
	pt_api_response_init(&r, 0, PT_API_OK, PT_API_LIST_JOBS);
	r.jobs = &ji;
	r.n_jobs = 1;
	rv = pt_api_build_response(b, &r, data, size);
	job_free(jb);
	return rv;
}
