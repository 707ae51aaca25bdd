/* pipeclient.h - libpipeclient, the C client of a pipetrain server.
 *
 * A client submits training jobs to `pipeserver`, follows their loss, cancels
 * them and downloads their checkpoints. Every call is one or more FlatBuffers
 * Request/Response exchanges (schema/api.fbs) over an nng REQ socket; other
 * languages speak the same protocol with flatc-generated code.
 *
 *   pipeclient *c;
 *   pipeclient_options o = {.url = "tcp://127.0.0.1:7600"};
 *   uint64_t job;
 *   if (pipeclient_connect(&c, &o) != PIPECLIENT_OK ||
 *       pipeclient_submit_file(c, "job.json", &job) != PIPECLIENT_OK)
 *           fprintf(stderr, "%s\n", pipeclient_last_error());
 *
 * Errors: every fallible function returns a pipeclient_err (0 is success).
 * The detail ("InvalidJob: model[3].in_features: ...") is kept per calling
 * thread (pipeclient_last_error) and per handle (pipeclient_error_message).
 * Codes the server sent (Response.code) map one to one onto the
 * PIPECLIENT_ERR_SERVER_* range, so a caller can tell "the server said no"
 * from "the server could not be reached".
 *
 * Thread-safety: a handle may be shared by threads; calls run concurrently,
 * each on its own nng context (a watch in one thread does not hold up a get in
 * another). pipeclient_close must not race with calls on the same handle.
 * Callbacks run on the calling thread, never inside the library's locks.
 */
#ifndef PIPECLIENT_H
#define PIPECLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PIPECLIENT_VERSION "0.1.0"
/* The wire protocol this library speaks (ServerInfoReply.protocol). */
#define PIPECLIENT_PROTOCOL 1
/* Used when neither the options nor PIPETRAIN_SERVER name a server. */
#define PIPECLIENT_DEFAULT_URL "tcp://127.0.0.1:7600"
/* Per-request timeout when the options give 0. */
#define PIPECLIENT_DEFAULT_TIMEOUT_MS 30000
/* Stage times a metric point carries at most (more are dropped). */
#define PIPECLIENT_MAX_STAGES 64
/* Bytes asked for per checkpoint range. */
#define PIPECLIENT_FETCH_CHUNK (4u << 20)

/* Error codes; the server's Code values follow PIPECLIENT_ERR_SERVER_BASE in
 * the order of schema/api.fbs (BadRequest = base + 1, ...). */
#define PIPECLIENT_ERRORS(X)                                                                       \
	X(PIPECLIENT_OK, 0, "success")                                                             \
	X(PIPECLIENT_ERR_INVALID, 1, "invalid argument")                                           \
	X(PIPECLIENT_ERR_NOMEM, 2, "out of memory")                                                \
	X(PIPECLIENT_ERR_CONNECT, 3, "cannot connect to the server")                               \
	X(PIPECLIENT_ERR_TIMEOUT, 4, "timed out waiting for the server")                           \
	X(PIPECLIENT_ERR_PROTOCOL, 5, "malformed or unexpected reply")                             \
	X(PIPECLIENT_ERR_IO, 6, "local file error")                                                \
	X(PIPECLIENT_ERR_FORMAT, 7, "malformed job file")                                          \
	X(PIPECLIENT_ERR_CHECKSUM, 8, "checksum mismatch")                                         \
	X(PIPECLIENT_ERR_STOPPED, 9, "stopped by the callback")                                    \
	X(PIPECLIENT_ERR_TLS, 10, "TLS configuration error")                                       \
	X(PIPECLIENT_ERR_SERVER_BAD_REQUEST, 101, "server: bad request")                           \
	X(PIPECLIENT_ERR_SERVER_UNAUTHORIZED, 102, "server: unauthorized")                         \
	X(PIPECLIENT_ERR_SERVER_INVALID_JOB, 103, "server: invalid job")                           \
	X(PIPECLIENT_ERR_SERVER_NOT_FOUND, 104, "server: not found")                               \
	X(PIPECLIENT_ERR_SERVER_CONFLICT, 105, "server: conflict")                                 \
	X(PIPECLIENT_ERR_SERVER_UNAVAILABLE, 106, "server: unavailable")                           \
	X(PIPECLIENT_ERR_SERVER_INTERNAL, 107, "server: internal error")

typedef enum pipeclient_err {
#define PIPECLIENT_ERR_ENUM(name, value, msg) name = value,
	PIPECLIENT_ERRORS(PIPECLIENT_ERR_ENUM)
#undef PIPECLIENT_ERR_ENUM
} pipeclient_err;

#define PIPECLIENT_ERR_SERVER_BASE 100

/* pipeclient_is_server_error tells whether e is a code the server sent. */
static inline bool pipeclient_is_server_error(pipeclient_err e)
{
	return e > PIPECLIENT_ERR_SERVER_BASE;
}

/* Job states, as schema/api.fbs JobState. */
typedef enum pipeclient_job_state {
	PIPECLIENT_QUEUED,
	PIPECLIENT_STARTING,
	PIPECLIENT_RUNNING,
	PIPECLIENT_SUCCEEDED,
	PIPECLIENT_FAILED,
	PIPECLIENT_CANCELLED,
	PIPECLIENT_INTERRUPTED,
	PIPECLIENT_STATE_COUNT
} pipeclient_job_state;

/* pipeclient_strerror returns the fixed message of a code ("unknown error" for
 * others). Thread-safe, never NULL. */
const char *pipeclient_strerror(pipeclient_err e);

/* pipeclient_err_name returns the code's identifier ("PIPECLIENT_ERR_IO"). */
const char *pipeclient_err_name(pipeclient_err e);

/* pipeclient_state_name returns "Queued", "Running", ... (schema names). */
const char *pipeclient_state_name(pipeclient_job_state s);

/* pipeclient_state_is_final tells whether a job in state s will not change. */
bool pipeclient_state_is_final(pipeclient_job_state s);

/* pipeclient_last_error returns the detail of the calling thread's last failed
 * pipeclient call, or "". Valid until the thread's next pipeclient call. */
const char *pipeclient_last_error(void);

/* How to reach the server. Zeroed fields take the defaults. */
typedef struct pipeclient_options {
	const char *url;             /* tcp://, ipc://, tls+tcp://... NULL: $PIPETRAIN_SERVER or
	                                PIPECLIENT_DEFAULT_URL */
	const char *token;           /* sent in every request; NULL: $PIPETRAIN_TOKEN or none */
	int timeout_ms;              /* per request (a watch poll adds its wait); 0: default */
	const char *tls_ca_file;     /* tls+tcp: PEM CA certificates that sign the server's */
	const char *tls_cert_file;   /* tls+tcp: client certificate and key in one PEM */
	const char *tls_server_name; /* tls+tcp: name to check in the certificate */
	bool tls_insecure;           /* tls+tcp: do not verify the server (testing only) */
	uint32_t fetch_chunk;        /* bytes per checkpoint range; 0: PIPECLIENT_FETCH_CHUNK (the
	                                server's maximum) */
} pipeclient_options;

/* The opaque handle. */
typedef struct pipeclient pipeclient;

/* pipeclient_connect opens a handle to the server named in o (NULL: all
 * defaults) and dials it once, synchronously: a server that is not there is
 * PIPECLIENT_ERR_CONNECT now, rather than a timeout on the first request.
 * Afterwards nng reconnects by itself when the connection drops. A URL
 * without a scheme ("localhost:7600") is PIPECLIENT_ERR_INVALID, its message
 * suggesting the tcp:// one. The strings in o are copied. On success *out is
 * the caller's; pipeclient_close it. */
pipeclient_err pipeclient_connect(pipeclient **out, const pipeclient_options *o);

/* pipeclient_close closes the connection and frees c. Accepts NULL. No call
 * on c may be running or start afterwards. */
void pipeclient_close(pipeclient *c);

/* pipeclient_url returns the URL c dialled (owned by c). */
const char *pipeclient_url(const pipeclient *c);

/* pipeclient_set_timeout changes the per-request timeout (ms, > 0) for calls
 * that start afterwards. Thread-safe. */
pipeclient_err pipeclient_set_timeout(pipeclient *c, int timeout_ms);

/* pipeclient_error_message copies the detail of the last failure of any call
 * on c into buf (cap bytes, truncated, NUL-terminated) and returns its code.
 * Thread-safe; with several threads prefer pipeclient_last_error. */
pipeclient_err pipeclient_error_message(pipeclient *c, char *buf, size_t cap);

/* One metric point of a job. Returned by value: no pointers inside. */
typedef struct pipeclient_metric {
	int64_t step; /* the optimizer step just completed (1-based) */
	double loss;
	float learning_rate;
	double grad_norm;
	double samples_per_second;
	double tokens_per_second;
	double bubble;                            /* fraction of stage time idle in this step */
	int n_stages;                             /* entries of stage_busy in use */
	double stage_busy[PIPECLIENT_MAX_STAGES]; /* seconds busy per stage */
	double eval_loss;                         /* NaN when not evaluated at this step */
	double eval_accuracy;                     /* NaN when not evaluated at this step */
	double time_unix;
} pipeclient_metric;

/* What the server knows of a job. Strings and spec are owned by the struct:
 * release with pipeclient_job_fini. */
typedef struct pipeclient_job {
	uint64_t id;
	char *name; /* may be "" */
	pipeclient_job_state state;
	char *message; /* why it failed or was interrupted; may be "" */
	int64_t step;  /* last completed step */
	int64_t steps; /* steps requested */
	double submitted_unix, started_unix, finished_unix; /* 0 when not yet */
	bool has_last;
	pipeclient_metric last; /* the latest metrics, when has_last */
	void *spec;             /* pipeclient_get only: the JobSpec as a FlatBuffers root
	                           buffer (flatc --json --raw-binary prints it), or NULL */
	size_t spec_len;
} pipeclient_job;

/* pipeclient_job_virtual_stages is the model chunks each stage of j holds:
 * its spec's virtual_stages (2 when absent) under schedule "interleaved",
 * else 1 (also without a spec). An interleaved job's timeline has
 * stages * virtual_stages rows: row s is chunk s / stages of stage
 * s % stages. */
int pipeclient_job_virtual_stages(const pipeclient_job *j);

/* pipeclient_job_fini frees what j owns and zeroes it. Accepts NULL. */
void pipeclient_job_fini(pipeclient_job *j);

/* pipeclient_jobs_free frees an array from pipeclient_list. Accepts NULL. */
void pipeclient_jobs_free(pipeclient_job *jobs, size_t n);

/* pipeclient_submit_file reads a job file - the JSON text of a JobSpec (what
 * `flatc -b schema/job.fbs job.json` reads) or the FlatBuffers binary of one,
 * told apart by content whatever the file's name - checks it locally, submits
 * it and writes the new job's id to *job. The server validates every field
 * and names the bad one (PIPECLIENT_ERR_SERVER_INVALID_JOB). Blocking. */
pipeclient_err pipeclient_submit_file(pipeclient *c, const char *path, uint64_t *job);

/* pipeclient_submit_json is pipeclient_submit_file for JSON text in memory
 * (len bytes; no NUL needed). */
pipeclient_err pipeclient_submit_json(pipeclient *c, const char *text, size_t len, uint64_t *job);

/* pipeclient_submit_spec submits a JobSpec already built as a FlatBuffers
 * root buffer (by flatc, the flatc-generated builders of any language, or
 * pipetrain's pt_job_spec_build + pt_fb_finish). The buffer is verified and
 * copied; the caller keeps it. */
pipeclient_err pipeclient_submit_spec(pipeclient *c, const void *spec, size_t len, uint64_t *job);

/* pipeclient_get fills *out with job's state, latest metrics and spec. On
 * success the caller owns *out (pipeclient_job_fini); on error *out is zeroed. */
pipeclient_err pipeclient_get(pipeclient *c, uint64_t job, pipeclient_job *out);

/* One pipeline rank's totals in a job: stage -1 is the coordinator, 0..p-1
 * the stages. busy_seconds sums the stage's compute time over the job's
 * steps. The communicator counters cover the job's current run (they start
 * again at 0 when a job resumes); has_comm is false, and they are 0, for a
 * stage served by a `pipeserver --worker` in an async job (a worker's stage
 * sends its counters with each step's timeline, which async steps do not
 * fetch; servers before that kept them in the worker), for a job that has
 * not run since the server restarted, and for every entry from a server too
 * old to send them. */
typedef struct pipeclient_stage {
	int stage;
	double busy_seconds;
	bool has_comm;
	uint64_t messages_sent, messages_received;
	uint64_t bytes_sent, bytes_received; /* on the wire, after compression */
	uint64_t bytes_raw_sent;             /* before compression */
	uint64_t errors, timeouts, reconnects;
} pipeclient_stage;

/* pipeclient_stages returns job's per-rank totals as a new array (*out, *n;
 * free() it), the coordinator first, then the stages in order; empty (n 0,
 * *out NULL) before the job's first step or from a server that predates
 * them. A separate call, so pipeclient_job keeps its size (ABI). */
pipeclient_err pipeclient_stages(pipeclient *c, uint64_t job, pipeclient_stage **out, size_t *n);

/* One task of a job's last step: on stage (0-based), kind 'F' (forward),
 * 'B' (backward; the input gradient alone under a split-backward schedule
 * such as zb-h1) or 'W' (weight gradients), from start to end seconds after
 * the step's first task. */
typedef struct pipeclient_task {
	int stage;
	char kind;
	int microbatch;
	double start, end;
} pipeclient_task;

/* pipeclient_timeline returns the tasks of job's last step (sync and
 * semi-async jobs) as a new array (*out, *n; free() it), by stage then
 * time; empty before the first step, for async jobs and from older
 * servers. */
pipeclient_err pipeclient_timeline(pipeclient *c, uint64_t job, pipeclient_task **out, size_t *n);

/* A schedule the server priced for a job before it runs. */
typedef struct pipeclient_plan {
	char schedule[16]; /* "gpipe", "1f1b", "zb-h1", "interleaved" */
	int stages, microbatches;
	int virtual_stages;  /* interleaved: chunks per stage (boundaries and stage_bytes
	                      * then count stages * virtual_stages), else 1 */
	double step_seconds; /* predicted wall time of a step */
	double bubble;       /* predicted idle share of stage time */
	double samples_per_second;
	int boundaries[PIPECLIENT_MAX_STAGES + 1];   /* stage s: layers [b[s], b[s+1]) */
	uint64_t stage_bytes[PIPECLIENT_MAX_STAGES]; /* estimated peak memory per stage */
} pipeclient_plan;

/* pipeclient_plan_file has the server price every flushing schedule of the
 * job in FILE (as pipeclient_submit_file reads it) at each of the stage and
 * microbatch counts given (n 0: the file's; at most 8 each): it measures
 * the layers on its CPU and simulates each schedule (docs/pipeline.md).
 * *out (free()) gets the plans, fastest first. Blocking: a first plan of a
 * model takes the server a few timed runs of every layer. */
pipeclient_err pipeclient_plan_file(pipeclient *c, const char *path, const int *stages,
                                    int n_stages, const int *microbatches, int n_microbatches,
                                    pipeclient_plan **out, size_t *n);

/* pipeclient_list returns every job the server knows, oldest first, as a new
 * array (*jobs, *n; free with pipeclient_jobs_free; spec is NULL in each). */
pipeclient_err pipeclient_list(pipeclient *c, pipeclient_job **jobs, size_t *n);

/* pipeclient_cancel asks the server to stop job and writes the state it
 * reports (Cancelled, or the state a starting job is in while it stops) to
 * *state (may be NULL). A job already finished is PIPECLIENT_ERR_SERVER_CONFLICT. */
pipeclient_err pipeclient_cancel(pipeclient *c, uint64_t job, pipeclient_job_state *state);

/* pipeclient_metric_fn is called once per metric point, in step order.
 * Return true to go on, false to stop the watch (PIPECLIENT_ERR_STOPPED). */
typedef bool (*pipeclient_metric_fn)(void *ctx, uint64_t job, const pipeclient_metric *m);

/* pipeclient_watch follows job's metrics with long polls (WatchMetrics),
 * calling fn for every point after step `after` (-1: from the first), until
 * the job reaches a final state (then returns PIPECLIENT_OK, whatever that
 * state is: read *final) or fn returns false. *final (may be NULL) gets the
 * last state the server reported. Blocking; each poll waits at most
 * wait_ms (0: 1000; the server caps it at 300000) on the server, and the
 * reply at most that plus the handle's timeout, so an idle poll never times
 * out on the client. */
pipeclient_err pipeclient_watch(pipeclient *c, uint64_t job, int64_t after, int wait_ms,
                                pipeclient_metric_fn fn, void *ctx, pipeclient_job_state *final);

/* One checkpoint the server holds for a job. */
typedef struct pipeclient_checkpoint {
	int64_t step;
	uint64_t size;   /* bytes */
	char sha256[65]; /* lowercase hex of the whole file */
} pipeclient_checkpoint;

/* pipeclient_list_checkpoints returns job's checkpoints, oldest first, as a
 * new array (*out, *n; free() it). */
pipeclient_err pipeclient_list_checkpoints(pipeclient *c, uint64_t job, pipeclient_checkpoint **out,
                                           size_t *n);

/* pipeclient_progress_fn reports a download: bytes of the file present so far
 * (a resumed download starts above 0) of total. Return false to stop; the
 * partial file stays for a later resume. */
typedef bool (*pipeclient_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* pipeclient_fetch_checkpoint downloads job's checkpoint at step (-1: the
 * latest) to path: ranges (options.fetch_chunk bytes; the server sends at
 * most 4 MiB a range), all of the step the first reply named so that a
 * checkpoint written meanwhile does not mix in, are appended to
 * "<path>.part", which a later call resumes from its size (a stale .part of
 * another file is detected by its checksum, discarded and the download
 * restarted once from the beginning). The whole
 * file's SHA-256 is checked against the server's before "<path>.part" is
 * fsynced and renamed to path. *out (may be NULL) gets the step, size and
 * checksum. fn (may be NULL) is called after every range. Blocking.
 * PIPECLIENT_ERR_CHECKSUM when the data does not match (the .part is removed);
 * PIPECLIENT_ERR_STOPPED when fn said stop (the .part is kept). */
pipeclient_err pipeclient_fetch_checkpoint(pipeclient *c, uint64_t job, int64_t step,
                                           const char *path, pipeclient_progress_fn fn, void *ctx,
                                           pipeclient_checkpoint *out);

/* What the server says about itself. */
typedef struct pipeclient_server_info {
	char version[64];
	int protocol;
	char device[128];
	int jobs_queued;
	int jobs_running;
	double uptime_seconds;
} pipeclient_server_info;

/* pipeclient_info asks the server for its version, device and load. */
pipeclient_err pipeclient_info(pipeclient *c, pipeclient_server_info *out);

/* pipeclient_kernels asks the server what it detected and which kernels it
 * picked ("cpu: ...; matmul: oneDNN ...; sha256: ...; cuda:0: ..."), into
 * buf (cap bytes, NUL-terminated, cut if longer; "" from a server that does
 * not say). A function of its own so that pipeclient_server_info keeps its size. */
pipeclient_err pipeclient_kernels(pipeclient *c, char *buf, size_t cap);

/* pipeclient_devices asks the server where stages of jobs without workers
 * run in its process and who holds each GPU ("cpu, cuda:0 (job 3), cuda:1
 * (free)"), into buf as pipeclient_kernels does ("": none, or an older
 * server). */
pipeclient_err pipeclient_devices(pipeclient *c, char *buf, size_t cap);

/* A worker of the server's pool (--pool). */
typedef struct pipeclient_worker {
	char url[256];
	char state[16];    /* "idle", "busy", "unreachable" or "unknown" (not probed yet) */
	uint64_t job;      /* the job it serves (0: none) */
	bool draining;     /* lends itself to no more jobs */
	double since_unix; /* when the state began */
	double last_heartbeat_unix; /* the last answered probe (0: never) */
	char message[160];          /* the worker's words, or why it is unreachable */
	char devices[128]; /* what it computes on ("cpu (16 cores), cuda:0"; "": unknown) */
} pipeclient_worker;

/* pipeclient_workers returns the server's pool workers, in pool order, as a
 * new array (*out, *n; free() it); none without a pool. */
pipeclient_err pipeclient_workers(pipeclient *c, pipeclient_worker **out, size_t *n);

/* pipeclient_drain_worker tells the server to lend the pool worker at url
 * to no more jobs (its current job finishes). PIPECLIENT_ERR_SERVER_NOT_FOUND
 * when the pool has no such worker. */
pipeclient_err pipeclient_drain_worker(pipeclient *c, const char *url);

#ifdef __cplusplus
}
#endif

#endif
