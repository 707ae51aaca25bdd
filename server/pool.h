/* pool.h - the worker pool of a pipeserver: the `pipeserver --worker`s the
 * deployment gives it (--pool), probed by heartbeats, and lent to jobs.
 *
 * --pool is a comma-separated URL list, or @FILE with one URL a line (# starts
 * a comment), re-read by pt_pool_reload (SIGHUP): added URLs join, removed
 * ones leave once no job holds them. A heartbeat thread asks every worker no
 * job holds for its state (StagePing, session 0) every interval_ms: it is
 * idle, busy (a session of another coordinator, or one of ours still ending)
 * or unreachable since the first failed probe. A worker is free when it
 * answered idle to its last probe, no job holds it and it is not draining.
 * pt_pool_take lends free workers to a job until pt_pool_release; the job's
 * own heartbeats watch them meanwhile. A drained worker finishes its job and
 * is lent no more.
 *
 * Thread-safe. on_change (may be NULL) is called from the heartbeat thread,
 * without the pool's lock, when a worker became free.
 */
#ifndef PT_SERVER_POOL_H
#define PT_SERVER_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "job.h"

#define PT_POOL_MAX     256 /* workers in a pool */
#define PT_POOL_URL_MAX 256

typedef enum pt_pool_state {
	PT_POOL_UNKNOWN,     /* not probed yet */
	PT_POOL_IDLE,        /* answered idle */
	PT_POOL_BUSY,        /* lent to a job, or answered busy */
	PT_POOL_UNREACHABLE, /* the last probe failed */
} pt_pool_state;

/* pt_pool_state_name returns "unknown", "idle", "busy", "unreachable". */
const char *pt_pool_state_name(pt_pool_state s);

typedef struct pt_pool_worker {
	char url[PT_POOL_URL_MAX];
	pt_pool_state state;
	uint64_t job;          /* the job holding it (0: none) */
	bool draining;         /* DrainWorker: lent to no more jobs */
	double since;          /* unix time the state began */
	double last_heartbeat; /* unix time of the last answered probe (0: never) */
	char message[160];     /* the worker's words, or why it is unreachable */
	char devices[128];     /* what it computes on, from its last answer ("": unknown) */
} pt_pool_worker;

typedef struct pt_pool_config {
	const char *spec; /* "URL[,URL...]" or "@FILE" */
	int interval_ms;  /* probe period (0: 2000) */
	int timeout_ms;   /* a probe's wait (0: 2000) */
	pt_job_tls tls;   /* for tls+tcp:// workers */
} pt_pool_config;

typedef struct pt_pool pt_pool;

/* pt_pool_create reads the list (errors name the bad entry), probes every
 * worker once and starts the heartbeat thread. */
pt_err pt_pool_create(pt_pool **out, const pt_pool_config *cfg, void (*on_change)(void *ctx),
                      void *ctx);
void pt_pool_destroy(pt_pool *p);

/* pt_pool_reload re-reads an @FILE list (a plain list: nothing to do). */
pt_err pt_pool_reload(pt_pool *p);

/* pt_pool_counts returns the workers in the pool; *free_n those free now,
 * and per state (any pointer may be NULL). */
int pt_pool_counts(pt_pool *p, int *free_n, int *idle, int *busy, int *unreachable);

/* pt_pool_take lends n free workers to job (false, nothing taken, if fewer
 * are free): urls[0..n) get their URLs (strdup'd; the caller frees them). */
bool pt_pool_take(pt_pool *p, int n, uint64_t job, char **urls);

/* pt_pool_claim lends the worker at url to job if it is free (a spare the
 * job asks for after losing one); false otherwise. */
bool pt_pool_claim(pt_pool *p, const char *url, uint64_t job);

/* pt_pool_release gives back every worker job holds; they are probed again
 * at once (a session may still be ending). */
void pt_pool_release(pt_pool *p, uint64_t job);

/* pt_pool_list copies the workers into *out (malloc'd; free it), in pool
 * order; returns their count (-1: no memory). */
int pt_pool_list(pt_pool *p, pt_pool_worker **out);

/* pt_pool_drain marks the worker at url draining; PT_ERR_NOTFOUND if the
 * pool has no such worker. */
pt_err pt_pool_drain(pt_pool *p, const char *url);

#endif
