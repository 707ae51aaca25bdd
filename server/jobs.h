/* jobs.h - pipeserver's job manager: ids, a FIFO queue per device, job states,
 * one runner thread per device set, and the on-disk journal.
 *
 * Layout under data_dir:
 *   jobs/<id>/spec.job        the verified JobSpec binary (written atomically)
 *   jobs/<id>/journal         append-only records (state changes, metric points),
 *                             each [u32 length][u32 CRC-32][payload]; a torn tail
 *                             after a crash fails its CRC and is cut off on restart
 *   jobs/<id>/checkpoints/    step-N.safetensors (+ .state) written by pt_job_run
 * A submit is acknowledged only after spec.job and its Queued record are fsynced;
 * state changes are fsynced as they happen and metrics at least every
 * metrics_sync_ms. On restart every job is listed again; a job that was running
 * is marked Interrupted and, when its spec asks (checkpoint.resume), queued
 * again to resume from its latest checkpoint.
 *
 * Thread-safety: every function may be called from any thread. Functions that
 * do file I/O (create, submit, cancel, shutdown) block; the reply builders and
 * watch functions only take the manager's lock for a short time.
 */
#ifndef PT_SERVER_JOBS_H
#define PT_SERVER_JOBS_H

#include <stdbool.h>
#include <stdint.h>

#include "api/api.h"
#include "error.h"
#include "fb.h"
#include "job.h"
#include "sha256.h"

typedef struct pt_jobs pt_jobs;

typedef struct pt_jobs_config {
	const char *data_dir;
	const char *device;         /* default device of jobs that name none */
	const char *files_root;     /* data paths resolve beneath it (NULL: cwd) */
	bool any_path;              /* --allow-any-path: data paths may leave files_root */
	const char *worker_allow;   /* --worker-allow list (NULL: any worker URL) */
	int threads;                /* CPU threads per job (0: all cores / max_jobs) */
	int max_jobs;               /* jobs running at once per device (<= 1: one) */
	int max_queued;             /* jobs waiting at most (<= 0: no limit) */
	int min_free_mb;            /* submits refused below this much free disk (0: none) */
	int keep_jobs;              /* ended jobs kept, the earliest ended deleted (<= 0: all) */
	int watch_interval_ms;      /* wake parked watchers at most this often */
	int watch_replies;          /* and a job's at most this many replies a second in all */
	int metrics_sync_ms;        /* fsync metric records at least this often */
	const char *worker_token;   /* token shown to `pipeserver --worker`s (NULL: none) */
	const char *advertise_host; /* host workers dial for the coordinator (NULL: automatic) */
	const char *memory_limit;   /* admission limit (pt_job_memory_parse; NULL or "": the
	                             * cgroup's or the machine's memory) */
	pt_job_tls worker_tls;      /* for tls+tcp:// workers */
	const char *pool;           /* --pool: "URL,..." or "@FILE" (NULL or "": none) */
	bool no_local;              /* no cpu in --devices: CPU stages never run in this process */
	const int *gpus;            /* --devices GPUs (cuda:N numbers): a job naming no workers
	                             * gets one per stage, jobs side by side */
	int n_gpus;
	bool fake_gpus;       /* tests: placement only, the stages compute on the CPU */
	bool strict_priority; /* a job waiting for pool workers holds up those behind */
} pt_jobs_config;

/* pt_jobs_waiter is a parked WatchMetrics request, embedded by the caller.
 * wake is called at most once per pt_jobs_reply_watch that parked it, with
 * the manager's lock held and the waiter already unlinked: it must not block
 * nor call back into pt_jobs. */
typedef struct pt_jobs_waiter {
	struct pt_jobs_waiter *next, *prev;
	void (*wake)(struct pt_jobs_waiter *w);
	bool linked;
	void *job; /* the job it is parked on, while linked (the manager's) */
} pt_jobs_waiter;

/* pt_jobs_create opens (creating) data_dir, recovers every journaled job
 * (see above) and starts runner threads for queued jobs. */
pt_err pt_jobs_create(pt_jobs **out, const pt_jobs_config *cfg);

/* pt_jobs_shutdown stops accepting submits, asks running jobs to stop (they
 * write a checkpoint and become Interrupted), waits for the runners and
 * flushes every journal. Blocks for up to one training step. Idempotent. */
void pt_jobs_shutdown(pt_jobs *j);

/* pt_jobs_destroy shuts down (if not yet) and frees j; accepts NULL. No
 * waiter may still be linked. */
void pt_jobs_destroy(pt_jobs *j);

/* pt_jobs_submit reads and validates the verified JobSpec table, journals it
 * and queues the job; *id gets its id. Errors: PT_ERR_CLOSED while shutting
 * down, PT_ERR_IO/NOMEM for the server's own failures, anything else is a
 * spec problem named in pt_last_error(). Blocks (fsync). */
pt_err pt_jobs_submit(pt_jobs *j, const uint8_t *spec_table, uint64_t *id);

/* pt_jobs_pool_counts gives the pool's workers: all, free, busy and
 * unreachable (zeros without a pool). */
void pt_jobs_pool_counts(pt_jobs *j, int32_t *all, int32_t *free_n, int32_t *busy,
                         int32_t *unreachable);

/* pt_jobs_devices_in_use counts the server's own devices that run a job's
 * stages now (jobs on workers do not count). */
int pt_jobs_devices_in_use(pt_jobs *j);

/* pt_jobs_plan prices a job spec (a verified JobSpec table) the way
 * pt_job_plan_run does, on the CPU budget a job here gets, after the checks
 * a submit makes (a bad spec: PT_ERR_INVALID naming the field). stages and
 * microbatches (n 0: the spec's) are the candidates. *out: free(). */
pt_err pt_jobs_plan(pt_jobs *m, const uint8_t *spec_table, const int32_t *stages, int n_stages,
                    const int32_t *microbatches, int n_microbatches, pt_job_plan **out, int *n);

/* pt_jobs_describe_devices writes the devices stages run on in this process
 * and who holds each GPU: "cpu, cuda:0 (job 3), cuda:1 (free)" ("" with
 * --devices none). */
void pt_jobs_describe_devices(pt_jobs *m, char *buf, size_t cap);

/* pt_jobs_reply_workers builds the ListWorkersReply to request req_id (empty
 * without a pool). */
pt_err pt_jobs_reply_workers(pt_jobs *j, uint64_t req_id, pt_fb_builder *b, const uint8_t **data,
                             size_t *size);

/* pt_jobs_drain_worker: the pool worker at url takes no more jobs;
 * PT_ERR_NOTFOUND naming it when the pool has no such worker (or there is
 * no pool). */
pt_err pt_jobs_drain_worker(pt_jobs *j, const char *url);

/* pt_jobs_reload_pool re-reads an @FILE pool list (SIGHUP); PT_OK without
 * a pool. */
pt_err pt_jobs_reload_pool(pt_jobs *j);

/* pt_jobs_cancel cancels a queued job at once or asks a running job to stop
 * within one step (it keeps its last checkpoint); *state gets the state the
 * job will end in: Cancelled (a server shutdown meanwhile does not turn it
 * into Interrupted). Errors:
 * PT_ERR_NOTFOUND, PT_ERR_STATE (already finished). Blocks (fsync). */
pt_err pt_jobs_cancel(pt_jobs *j, uint64_t id, pt_api_job_state *state);

/* pt_jobs_reply_get builds the GetJobReply (with the spec) for request id
 * req_id into b. PT_ERR_NOTFOUND when no such job. */
pt_err pt_jobs_reply_get(pt_jobs *j, uint64_t req_id, uint64_t job, pt_fb_builder *b,
                         const uint8_t **data, size_t *size);

/* pt_jobs_reply_list builds the ListJobsReply (all jobs, by id, no specs). */
pt_err pt_jobs_reply_list(pt_jobs *j, uint64_t req_id, pt_fb_builder *b, const uint8_t **data,
                          size_t *size);

/* pt_jobs_reply_watch answers WatchMetrics r: when points after r->cursor
 * exist, the job has ended, r->wait_ms <= 0 or w is NULL, it builds the reply
 * into b and sets *parked = false; otherwise it links w to the job and sets
 * *parked = true (nothing built): w->wake will be called when points arrive
 * or the job's state changes; the caller then calls this again with w NULL,
 * or, when its own timer fires first, pt_jobs_unwatch(w) and then this. */
pt_err pt_jobs_reply_watch(pt_jobs *j, const pt_api_request *r, pt_jobs_waiter *w, pt_fb_builder *b,
                           const uint8_t **data, size_t *size, bool *parked);

/* pt_jobs_unwatch unlinks w if it is still linked. */
void pt_jobs_unwatch(pt_jobs *j, pt_jobs_waiter *w);

/* pt_jobs_reply_checkpoints builds the ListCheckpointsReply of a job. */
pt_err pt_jobs_reply_checkpoints(pt_jobs *j, uint64_t req_id, uint64_t job, pt_fb_builder *b,
                                 const uint8_t **data, size_t *size);

/* pt_jobs_checkpoint finds checkpoint `step` (-1: the latest) of a job: its
 * file path (path_cap bytes), step, size and SHA-256 hex. PT_ERR_NOTFOUND. */
pt_err pt_jobs_checkpoint(pt_jobs *j, uint64_t job, int64_t step, char *path, size_t path_cap,
                          int64_t *out_step, uint64_t *size, char sha256[PT_SHA256_HEX]);

/* pt_jobs_counts reports queued and running (starting included) jobs. */
void pt_jobs_counts(pt_jobs *j, int *queued, int *running);

/* pt_jobs_replay_journal replays the bytes of a journal file into a new job
 * as recovery does (no files, no manager), sets *good to the length of its
 * valid prefix and builds that job's ListJobsReply (request id 0) into b.
 * For tests/fuzz (fuzz_journal). */
pt_err pt_jobs_replay_journal(const uint8_t *journal, size_t n, size_t *good, pt_fb_builder *b,
                              const uint8_t **data, size_t *size);

#endif
