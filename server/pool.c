/* pool.c - the worker pool (see pool.h). */
#include "pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fileio.h"
#include "log.h"

#define DEFAULT_INTERVAL_MS 2000
#define DEFAULT_TIMEOUT_MS  2000
#define MAX_LIST_BYTES      (1 << 20)

typedef struct entry {
	pt_pool_worker w;
	bool removed; /* left the list while a job held it: dropped at release */
	bool probe;   /* probe at the next round, not after the interval */
} entry;

struct pt_pool {
	pt_pool_config cfg;
	char *spec, *tls_cert, *tls_key, *tls_ca;
	void (*on_change)(void *ctx);
	void *ctx;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping, started;
	pthread_t hb;
	entry e[PT_POOL_MAX];
	int n;
};

static const char *const state_names[] = {"unknown", "idle", "busy", "unreachable"};

const char *pt_pool_state_name(pt_pool_state s)
{
	return (unsigned)s < 4 ? state_names[s] : "unknown";
}

static double now_unix(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static bool valid_url(const char *u)
{
	return strncmp(u, "tcp://", 6) == 0 || strncmp(u, "tls+tcp://", 10) == 0 ||
	       strncmp(u, "ipc://", 6) == 0;
}

/* read_list splits the pool spec into urls[0..*n) (pointers into *buf,
 * which the caller frees). Errors name the source and the entry. */
static pt_err read_list(const char *spec, char **buf, char **urls, int *n)
{
	bool file = spec[0] == '@';
	const char *sep = file ? "\n" : ",";
	char *save = NULL, *tok;
	size_t size;
	int line = 0;

	*n = 0;
	if (file) {
		PT_TRY(pt_file_read(spec + 1, MAX_LIST_BYTES, (void **)buf, &size));
		char *z = realloc(*buf, size + 1);
		if (z == NULL) {
			free(*buf);
			*buf = NULL;
			return pt_set_error(PT_ERR_NOMEM, "pool file %s", spec + 1);
		}
		*buf = z;
		(*buf)[size] = '\0';
	} else if ((*buf = strdup(spec)) == NULL) {
		return pt_set_error(PT_ERR_NOMEM, "pool list");
	}
	for (tok = strtok_r(*buf, sep, &save); tok; tok = strtok_r(NULL, sep, &save)) {
		char *hash = file ? strchr(tok, '#') : NULL, *end;
		line++;
		if (hash)
			*hash = '\0';
		while (*tok == ' ' || *tok == '\t' || *tok == '\r')
			tok++;
		end = tok + strlen(tok);
		while (end > tok && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
			*--end = '\0';
		if (*tok == '\0')
			continue;
		if (!valid_url(tok) || strlen(tok) >= PT_POOL_URL_MAX)
			return pt_set_error(
			    PT_ERR_INVALID,
			    "pool%s%s entry %d: '%.200s' is not a tcp://, tls+tcp:// "
			    "or ipc:// URL under %d bytes",
			    file ? " file " : "", file ? spec + 1 : "", line, tok, PT_POOL_URL_MAX);
		for (int i = 0; i < *n; i++)
			if (strcmp(urls[i], tok) == 0)
				return pt_set_error(PT_ERR_INVALID, "pool: '%s' is listed twice",
				                    tok);
		if (*n == PT_POOL_MAX)
			return pt_set_error(PT_ERR_RANGE, "pool: more than %d workers",
			                    PT_POOL_MAX);
		urls[(*n)++] = tok;
	}
	return PT_OK;
}

/* apply_list makes the pool's entries follow urls (lock held). */
static void apply_list(pt_pool *p, char **urls, int n)
{
	double t = now_unix();
	int k = 0;

	for (int i = 0; i < p->n; i++) { /* keep listed ones, and held ones */
		bool listed = false;
		for (int j = 0; j < n && !listed; j++)
			listed = strcmp(p->e[i].w.url, urls[j]) == 0;
		if (!listed && p->e[i].w.job == 0) {
			pt_info("pool: worker %s left the pool", p->e[i].w.url);
			continue;
		}
		p->e[i].removed = !listed;
		p->e[k++] = p->e[i];
	}
	p->n = k;
	for (int j = 0; j < n && p->n < PT_POOL_MAX; j++) {
		bool have = false;
		for (int i = 0; i < p->n && !have; i++)
			have = strcmp(p->e[i].w.url, urls[j]) == 0;
		if (have)
			continue;
		entry *e = &p->e[p->n++];
		memset(e, 0, sizeof(*e));
		snprintf(e->w.url, sizeof(e->w.url), "%s", urls[j]);
		e->w.state = PT_POOL_UNKNOWN;
		e->w.since = t;
		e->probe = true;
		snprintf(e->w.message, sizeof(e->w.message), "not probed yet");
	}
}

static pt_err load(pt_pool *p)
{
	char *buf = NULL, *urls[PT_POOL_MAX];
	int n;
	pt_err rv = read_list(p->spec, &buf, urls, &n);

	if (rv == PT_OK) {
		pthread_mutex_lock(&p->mu);
		apply_list(p, urls, n);
		pthread_mutex_unlock(&p->mu);
	}
	free(buf);
	return rv;
}

/* probe_round probes every worker no job holds (all, or only those marked)
 * without the lock, then records the answers; returns whether one became
 * free. */
static bool probe_round(pt_pool *p, bool all)
{
	char url[PT_POOL_MAX][PT_POOL_URL_MAX];
	int k = 0;
	bool freed = false;

	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < p->n; i++)
		if (p->e[i].w.job == 0 && (all || p->e[i].probe)) {
			snprintf(url[k], sizeof(url[k]), "%s", p->e[i].w.url);
			k++;
			p->e[i].probe = false;
		}
	pthread_mutex_unlock(&p->mu);
	for (int j = 0; j < k; j++) {
		char state[160], devices[128];
		bool busy = false;
		pt_err rv = pt_job_worker_probe(url[j], &p->cfg.tls, p->cfg.timeout_ms, &busy,
		                                state, sizeof(state), devices, sizeof(devices));
		if (rv != PT_OK) { /* the URL is beside it in every listing */
			const char *e = pt_last_error();
			size_t ul = strlen(url[j]);
			if (strncmp(e, "worker ", 7) == 0 && strncmp(e + 7, url[j], ul) == 0 &&
			    strncmp(e + 7 + ul, ": ", 2) == 0)
				e += 9 + ul;
			snprintf(state, sizeof(state), "%s", e);
		}
		pthread_mutex_lock(&p->mu);
		for (int i = 0; i < p->n; i++) {
			pt_pool_worker *w = &p->e[i].w;
			if (strcmp(w->url, url[j]) != 0 || w->job != 0)
				continue;
			pt_pool_state st = rv != PT_OK ? PT_POOL_UNREACHABLE
			                   : busy      ? PT_POOL_BUSY
			                               : PT_POOL_IDLE;
			double t = now_unix();
			if (st != w->state) {
				if (st == PT_POOL_UNREACHABLE)
					pt_warn("pool: worker %s unreachable: %s", w->url, state);
				else if (w->state == PT_POOL_UNREACHABLE)
					pt_info("pool: worker %s is back (%s)", w->url, state);
				w->since = t;
				freed = freed || (st == PT_POOL_IDLE && !w->draining);
			}
			w->state = st;
			if (rv == PT_OK) {
				w->last_heartbeat = t;
				snprintf(w->devices, sizeof(w->devices), "%s", devices);
			}
			snprintf(w->message, sizeof(w->message), "%s", state);
		}
		pthread_mutex_unlock(&p->mu);
	}
	return freed;
}

static void *hb_main(void *arg)
{
	pt_pool *p = arg;
	double next = 0;

	for (;;) {
		bool all, freed;
		struct timespec until;
		pthread_mutex_lock(&p->mu);
		while (!p->stopping) {
			bool marked = false;
			for (int i = 0; i < p->n && !marked; i++)
				marked = p->e[i].probe && p->e[i].w.job == 0;
			clock_gettime(CLOCK_REALTIME, &until);
			double now = (double)until.tv_sec + until.tv_nsec * 1e-9;
			if (marked || now >= next)
				break;
			until.tv_sec = (time_t)next;
			until.tv_nsec = (long)((next - (double)(time_t)next) * 1e9);
			pthread_cond_timedwait(&p->cv, &p->mu, &until);
		}
		if (p->stopping) {
			pthread_mutex_unlock(&p->mu);
			return NULL;
		}
		all = now_unix() >= next;
		pthread_mutex_unlock(&p->mu);
		freed = probe_round(p, all);
		if (all)
			next = now_unix() + p->cfg.interval_ms / 1000.0;
		if (freed && p->on_change)
			p->on_change(p->ctx);
	}
}

pt_err pt_pool_create(pt_pool **out, const pt_pool_config *cfg, void (*on_change)(void *ctx),
                      void *ctx)
{
	pt_pool *p = calloc(1, sizeof(*p));
	pt_err rv;

	*out = NULL;
	if (p == NULL)
		return pt_set_error(PT_ERR_NOMEM, "worker pool");
	p->cfg = *cfg;
	p->cfg.interval_ms = cfg->interval_ms > 0 ? cfg->interval_ms : DEFAULT_INTERVAL_MS;
	p->cfg.timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
	p->spec = dup_or_null(cfg->spec);
	p->tls_cert = dup_or_null(cfg->tls.cert);
	p->tls_key = dup_or_null(cfg->tls.key);
	p->tls_ca = dup_or_null(cfg->tls.ca);
	p->cfg.tls.cert = p->tls_cert;
	p->cfg.tls.key = p->tls_key;
	p->cfg.tls.ca = p->tls_ca;
	p->on_change = on_change;
	p->ctx = ctx;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	if (p->spec == NULL) {
		pt_pool_destroy(p);
		return pt_set_error(PT_ERR_NOMEM, "worker pool");
	}
	if ((rv = load(p)) != PT_OK) {
		pt_pool_destroy(p);
		return rv;
	}
	probe_round(p, true);
	if (pthread_create(&p->hb, NULL, hb_main, p) != 0) {
		pt_pool_destroy(p);
		return pt_set_error(PT_ERR_NOMEM, "pool heartbeat thread");
	}
	p->started = true;
	*out = p;
	return PT_OK;
}

void pt_pool_destroy(pt_pool *p)
{
	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->stopping = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	if (p->started)
		pthread_join(p->hb, NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->spec);
	free(p->tls_cert);
	free(p->tls_key);
	free(p->tls_ca);
	free(p);
}

pt_err pt_pool_reload(pt_pool *p)
{
	if (p->spec[0] != '@')
		return PT_OK;
	PT_TRY(load(p));
	pthread_mutex_lock(&p->mu);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return PT_OK;
}

static bool is_free(const entry *e)
{
	return e->w.state == PT_POOL_IDLE && e->w.job == 0 && !e->w.draining && !e->removed;
}

int pt_pool_counts(pt_pool *p, int *free_n, int *idle, int *busy, int *unreachable)
{
	int n, f = 0, c[4] = {0};

	pthread_mutex_lock(&p->mu);
	n = p->n;
	for (int i = 0; i < p->n; i++) {
		f += is_free(&p->e[i]);
		c[p->e[i].w.state]++;
	}
	pthread_mutex_unlock(&p->mu);
	if (free_n)
		*free_n = f;
	if (idle)
		*idle = c[PT_POOL_IDLE];
	if (busy)
		*busy = c[PT_POOL_BUSY];
	if (unreachable)
		*unreachable = c[PT_POOL_UNREACHABLE];
	return n;
}

bool pt_pool_take(pt_pool *p, int n, uint64_t job, char **urls)
{
	int pick[PT_POOL_MAX], k = 0;
	double t = now_unix();

	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < p->n && k < n; i++)
		if (is_free(&p->e[i]))
			pick[k++] = i;
	if (k < n) {
		pthread_mutex_unlock(&p->mu);
		return false;
	}
	for (int j = 0; j < n; j++) {
		if ((urls[j] = strdup(p->e[pick[j]].w.url)) == NULL) {
			while (j-- > 0)
				free(urls[j]);
			pthread_mutex_unlock(&p->mu);
			return false;
		}
	}
	for (int j = 0; j < n; j++) {
		pt_pool_worker *w = &p->e[pick[j]].w;
		w->job = job;
		w->state = PT_POOL_BUSY;
		w->since = t;
		snprintf(w->message, sizeof(w->message), "stage %d of job %llu", j,
		         (unsigned long long)job);
	}
	pthread_mutex_unlock(&p->mu);
	return true;
}

bool pt_pool_claim(pt_pool *p, const char *url, uint64_t job)
{
	bool ok = false;

	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < p->n && !ok; i++) {
		pt_pool_worker *w = &p->e[i].w;
		if (strcmp(w->url, url) != 0 || !is_free(&p->e[i]))
			continue;
		w->job = job;
		w->state = PT_POOL_BUSY;
		w->since = now_unix();
		snprintf(w->message, sizeof(w->message), "spare of job %llu",
		         (unsigned long long)job);
		ok = true;
	}
	pthread_mutex_unlock(&p->mu);
	return ok;
}

void pt_pool_release(pt_pool *p, uint64_t job)
{
	int k = 0;

	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < p->n; i++) {
		entry e = p->e[i];
		if (e.w.job == job) {
			if (e.removed) {
				pt_info("pool: worker %s left the pool", e.w.url);
				continue;
			}
			e.w.job = 0;
			e.probe = true; /* busy until it answers idle */
			snprintf(e.w.message, sizeof(e.w.message), "job %llu ended",
			         (unsigned long long)job);
		}
		p->e[k++] = e;
	}
	p->n = k;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

int pt_pool_list(pt_pool *p, pt_pool_worker **out)
{
	int n;

	pthread_mutex_lock(&p->mu);
	n = p->n;
	*out = malloc((size_t)(n > 0 ? n : 1) * sizeof(**out));
	if (*out == NULL) {
		pthread_mutex_unlock(&p->mu);
		return -1;
	}
	for (int i = 0; i < n; i++)
		(*out)[i] = p->e[i].w;
	pthread_mutex_unlock(&p->mu);
	return n;
}

pt_err pt_pool_drain(pt_pool *p, const char *url)
{
	pt_err rv = pt_set_error(PT_ERR_NOTFOUND, "no worker '%.300s' in the pool", url);

	pthread_mutex_lock(&p->mu);
	for (int i = 0; i < p->n; i++)
		if (strcmp(p->e[i].w.url, url) == 0) {
			if (!p->e[i].w.draining)
				pt_info("pool: draining worker %s", url);
			p->e[i].w.draining = true;
			rv = PT_OK;
		}
	pthread_mutex_unlock(&p->mu);
	return rv;
}
