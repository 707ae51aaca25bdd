/* api.h - the client <-> server messages of schema/api.fbs (Request/Response)
 * as C structs: builders, a strict verifier and parsers into views.
 *
 * One struct describes a message both ways. To send, fill a pt_api_request or
 * pt_api_response (start from pt_api_request_init / pt_api_response_init, which
 * set the schema defaults) and call pt_api_build_*; to receive, call
 * pt_api_parse_*, which verifies the whole buffer first (bounds, alignment,
 * depth, strings, vectors, required fields, the nested JobSpec, and rejects
 * unknown union types) and then fills the struct as a VIEW: its strings and
 * byte ranges point into the verified buffer, which must outlive the view and
 * stay unchanged. Vectors of tables (jobs, metric points, checkpoints) are not
 * copied: a parsed view has the count and NULL array pointers; read item i with
 * pt_api_response_job / _point / _checkpoint.
 *
 * Request body kind k is answered by response body kind k (the two unions of
 * api.fbs list their members in the same order), so one enum serves both.
 *
 * Wire facts: a message is a plain (not size-prefixed, no file identifier)
 * FlatBuffers buffer. nng delivers message bodies 4-byte aligned, which is
 * what the verifier requires; 8-byte fields are read with memcpy.
 *
 * Thread-safety: builders are used by one thread at a time; parsing and the
 * accessors only read the buffer and are thread-safe. Nothing here blocks.
 */
#ifndef PT_API_H
#define PT_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "fb.h"
#include "job/job.h"

/* Protocol version reported by ServerInfoReply.protocol. */
#define PT_API_PROTOCOL 1
/* Where pipeserver listens unless told otherwise, and clients dial. */
#define PT_API_DEFAULT_URL "tcp://127.0.0.1:7600"
/* Largest request the server accepts (NNG_OPT_RECVMAXSZ); larger messages make
 * nng drop the connection. Clients should use at least this for replies. */
#define PT_API_MAX_MESSAGE (64u << 20)
/* Largest FetchCheckpoint range per call (and the schema's default length). */
#define PT_API_MAX_CHUNK (4u << 20)
/* Most per-stage busy figures one metric point carries. */
#define PT_API_MAX_STAGES 64
/* Most StageStats entries one JobInfo carries (the coordinator + the stages). */
#define PT_API_MAX_STAGE_STATS (PT_API_MAX_STAGES + 1)
/* Verification depth limit used by the parsers (tables nested, root = 1). */
#define PT_API_MAX_DEPTH 32

/* pt_api_code mirrors api.fbs `enum Code` (same values). */
#define PT_API_CODES(X)                                                                            \
	X(PT_API_OK, "OK")                                                                         \
	X(PT_API_BAD_REQUEST, "BadRequest")                                                        \
	X(PT_API_UNAUTHORIZED, "Unauthorized")                                                     \
	X(PT_API_INVALID_JOB, "InvalidJob")                                                        \
	X(PT_API_NOT_FOUND, "NotFound")                                                            \
	X(PT_API_CONFLICT, "Conflict")                                                             \
	X(PT_API_UNAVAILABLE, "Unavailable")                                                       \
	X(PT_API_INTERNAL, "Internal")

typedef enum pt_api_code {
#define PT_API_CODE_ENUM(name, str) name,
	PT_API_CODES(PT_API_CODE_ENUM)
#undef PT_API_CODE_ENUM
	    PT_API_CODE_COUNT
} pt_api_code;

/* pt_api_code_name returns the schema's name of a code ("NotFound"), or
 * "Unknown" for a value outside the enum (a newer server's code). */
const char *pt_api_code_name(pt_api_code c);

/* pt_api_code_from_err maps a library error to the code a reply carries:
 * NOTFOUND -> NotFound, STATE -> Conflict, CLOSED -> Unavailable,
 * FORMAT/INVALID/RANGE -> BadRequest, everything else -> Internal. */
pt_api_code pt_api_code_from_err(pt_err e);

/* pt_api_job_state mirrors api.fbs `enum JobState` (same values).
 * queued -> starting -> running -> succeeded | failed | cancelled, and
 * interrupted (server stopped or killed while the job was running). */
#define PT_API_JOB_STATES(X)                                                                       \
	X(PT_JOB_QUEUED, "Queued")                                                                 \
	X(PT_JOB_STARTING, "Starting")                                                             \
	X(PT_JOB_RUNNING, "Running")                                                               \
	X(PT_JOB_SUCCEEDED, "Succeeded")                                                           \
	X(PT_JOB_FAILED, "Failed")                                                                 \
	X(PT_JOB_CANCELLED, "Cancelled")                                                           \
	X(PT_JOB_INTERRUPTED, "Interrupted")

typedef enum pt_api_job_state {
#define PT_API_STATE_ENUM(name, str) name,
	PT_API_JOB_STATES(PT_API_STATE_ENUM)
#undef PT_API_STATE_ENUM
	    PT_JOB_STATE_COUNT
} pt_api_job_state;

/* pt_api_job_state_name returns the schema's name ("Running"), or "Unknown". */
const char *pt_api_job_state_name(pt_api_job_state s);

/* pt_api_job_state_final tells whether s is an end state (succeeded, failed,
 * cancelled, interrupted). An interrupted job may be queued again on restart. */
bool pt_api_job_state_final(pt_api_job_state s);

/* pt_api_kind is the body of a request (RequestBody union type) and of its
 * reply (ResponseBody union type): same values as the schema's unions. */
#define PT_API_KINDS(X)                                                                            \
	X(PT_API_NONE, "NONE")                                                                     \
	X(PT_API_SUBMIT_JOB, "SubmitJob")                                                          \
	X(PT_API_GET_JOB, "GetJob")                                                                \
	X(PT_API_LIST_JOBS, "ListJobs")                                                            \
	X(PT_API_CANCEL_JOB, "CancelJob")                                                          \
	X(PT_API_WATCH_METRICS, "WatchMetrics")                                                    \
	X(PT_API_FETCH_CHECKPOINT, "FetchCheckpoint")                                              \
	X(PT_API_LIST_CHECKPOINTS, "ListCheckpoints")                                              \
	X(PT_API_SERVER_INFO, "ServerInfo")                                                        \
	X(PT_API_LIST_WORKERS, "ListWorkers")                                                      \
	X(PT_API_DRAIN_WORKER, "DrainWorker")                                                      \
	X(PT_API_PLAN_JOB, "PlanJob")

typedef enum pt_api_kind {
#define PT_API_KIND_ENUM(name, str) name,
	PT_API_KINDS(PT_API_KIND_ENUM)
#undef PT_API_KIND_ENUM
	    PT_API_KIND_COUNT
} pt_api_kind;

/* pt_api_kind_name returns the request body's name ("WatchMetrics"), or "Unknown". */
const char *pt_api_kind_name(pt_api_kind k);

/* ---------------------------------------------------------------- requests -- */

/* pt_api_request is one Request. Fields are used by the kinds named beside
 * them; the others are ignored when building and zero/default after parsing. */
#define PT_API_MAX_PLAN_CANDIDATES 8 /* PlanJob: stage or microbatch counts at most */

typedef struct pt_api_request {
	uint64_t id;            /* chosen by the client, echoed in the reply */
	const char *auth_token; /* NUL-terminated; NULL = absent */
	pt_api_kind kind;       /* the body; PT_API_NONE is rejected by the parser */

	/* GetJob, CancelJob, WatchMetrics, FetchCheckpoint, ListCheckpoints */
	uint64_t job;

	/* SubmitJob, building: the spec to embed (pt_job_spec_build); required. */
	const pt_job_spec *spec;
	/* SubmitJob, parsed: the verified JobSpec table inside the buffer (read
	 * it with pt_job_spec_read); NULL for other kinds. */
	const uint8_t *spec_table;

	/* WatchMetrics */
	int64_t cursor;     /* last step seen; points after it are returned (default -1) */
	int32_t wait_ms;    /* long poll: wait up to this long for new points (1000) */
	int32_t max_points; /* at most this many points per reply (1000) */

	/* FetchCheckpoint */
	int64_t step;    /* checkpoint step; -1 = the latest (default) */
	uint64_t offset; /* byte range [offset, offset + length) */
	uint32_t length; /* default and maximum PT_API_MAX_CHUNK */

	/* DrainWorker: the pool worker's URL (NULL = absent) */
	const char *url;

	/* PlanJob: the spec as SubmitJob's (spec, spec_table) and the candidate
	 * stage and microbatch counts (n_* 0: the spec's). */
	int32_t plan_stages[PT_API_MAX_PLAN_CANDIDATES];
	int n_plan_stages;
	int32_t plan_microbatches[PT_API_MAX_PLAN_CANDIDATES];
	int n_plan_microbatches;
} pt_api_request;

/* pt_api_request_init zeroes r, sets kind and the schema defaults (cursor -1,
 * wait_ms 1000, max_points 1000, step -1, length PT_API_MAX_CHUNK). */
void pt_api_request_init(pt_api_request *r, pt_api_kind kind);

/* pt_api_build_request resets b and builds r into it as a finished Request
 * buffer: *data and *size point into b's memory, valid until b is reset or
 * finalised. PT_ERR_INVALID for an unknown kind or a SubmitJob without spec;
 * builder errors (PT_ERR_NOMEM, PT_ERR_OVERFLOW) pass through. */
pt_err pt_api_build_request(pt_fb_builder *b, const pt_api_request *r, const uint8_t **data,
                            size_t *size);

/* pt_api_build_submit_raw is pt_api_build_request for a SubmitJob whose spec
 * is a JobSpec root buffer (e.g. from pt_job_spec_load_file): the buffer is
 * decoded (verified) and embedded. Errors of pt_job_spec_decode pass through. */
pt_err pt_api_build_submit_raw(pt_fb_builder *b, uint64_t id, const char *auth_token,
                               const void *spec_buf, size_t spec_len, const uint8_t **data,
                               size_t *size);

/* pt_api_parse_request verifies buf[0..size) as a Request (buf 4-aligned) and
 * fills *out as a view into buf. Errors: PT_ERR_FORMAT with pt_last_error()
 * naming the problem ("bad request: unknown body type 9", "Request has
 * no body", ...), PT_ERR_INVALID for NULL arguments. On error *out is zeroed
 * except out->id, which holds the request id when the root table could be
 * verified far enough to read it (0 otherwise), for the error reply. */
pt_err pt_api_parse_request(const void *buf, size_t size, pt_api_request *out);

/* --------------------------------------------------------------- responses -- */

/* pt_api_metric_point is one MetricPoint. NaN marks eval figures that were not
 * computed at this step. */
typedef struct pt_api_metric_point {
	int64_t step;
	double loss;
	float learning_rate;
	double grad_norm;
	double samples_per_second;
	double tokens_per_second;
	double bubble; /* fraction of stage time idle in this step, 0..1 */
	int n_stages;  /* entries of stage_busy in use (at most PT_API_MAX_STAGES) */
	double stage_busy[PT_API_MAX_STAGES]; /* seconds busy per stage in this step */
	double eval_loss;
	double eval_accuracy;
	double time_unix;
} pt_api_metric_point;

/* pt_api_stage_stats is one StageStats: a pipeline rank's totals. busy_seconds
 * sums the job's metric points; the communicator counters (pt_comm_stats)
 * cover the job's current run and are 0 with has_comm false for a stage
 * served by a worker process in an async job (worker stages send theirs
 * with the per-step timeline, which async steps do not fetch) and for a job
 * that has not run since the server restarted (counters are not journaled). */
typedef struct pt_api_stage_stats {
	int32_t stage; /* 0-based stage; -1: the coordinator */
	double busy_seconds;
	bool has_comm;
	uint64_t messages_sent, messages_received;
	uint64_t bytes_sent, bytes_received; /* on the wire, after compression */
	uint64_t bytes_raw_sent;             /* before compression */
	uint64_t errors, timeouts, reconnects;
} pt_api_stage_stats;

/* pt_api_job_info is one JobInfo. */
/* pt_api_task_span is TaskSpan: one task of a step's timeline. */
typedef struct pt_api_task_span {
	float start, end; /* seconds from the step's first task */
	int32_t microbatch;
	uint8_t stage; /* 0-based */
	uint8_t kind;  /* pt_task_kind: 0 F, 1 B, 3 W */
	uint8_t pad_[2];
} pt_api_task_span;

#define PT_API_MAX_TIMELINE 4096 /* task spans a JobInfo carries at most */

typedef struct pt_api_job_info {
	uint64_t id;
	const char *name; /* NULL = absent */
	pt_api_job_state state;
	const char *message; /* why it failed / was interrupted; NULL = absent */
	int64_t step;        /* last completed step */
	int64_t steps;       /* steps requested */
	double submitted_unix, started_unix, finished_unix; /* 0 = not yet */
	bool has_last;                                      /* `last` holds the latest metrics */
	pt_api_metric_point last;
	/* GetJob only. Building: the spec to embed (NULL = none). Parsed: the
	 * verified JobSpec table in the buffer, or NULL. */
	const pt_job_spec *spec;
	const uint8_t *spec_table;
	/* Per-rank totals: the coordinator (stage -1), then the stages. Building:
	 * stages[0..n_stages). Parsed: stages is NULL; read with
	 * pt_api_job_stage. */
	const pt_api_stage_stats *stages;
	size_t n_stages;
	const uint8_t *stages_vec_; /* parsed views only: private */
	/* GetJob: the last step's timeline. Building: timeline[0..n_timeline).
	 * Parsed: NULL; read with pt_api_job_task. */
	const pt_api_task_span *timeline;
	size_t n_timeline;
	const uint8_t *timeline_vec_; /* parsed views only: private */
} pt_api_job_info;

/* pt_api_checkpoint_info is one CheckpointInfo. */
typedef struct pt_api_checkpoint_info {
	int64_t step;
	uint64_t size;      /* bytes of the .safetensors file */
	const char *sha256; /* 64 lowercase hex digits of the file */
} pt_api_checkpoint_info;

/* pt_api_server_info is ServerInfoReply. */
typedef struct pt_api_server_info {
	const char *version;
	int32_t protocol;
	const char *device; /* e.g. "cpu" or "cuda:0" */
	int32_t jobs_queued;
	int32_t jobs_running;
	double uptime_seconds;
	const char *kernels; /* what was detected and picked (pt_backend_describe) */
	int32_t workers, workers_free, workers_busy, workers_unreachable; /* --pool */
	int32_t devices_in_use; /* the server's own devices running a job's stages */
	const char *devices;    /* "cpu, cuda:0 (job 3), cuda:1 (free)" (NULL: none) */
} pt_api_server_info;

/* pt_api_worker_state is the schema's WorkerState. */
typedef enum pt_api_worker_state {
	PT_API_WORKER_UNKNOWN,
	PT_API_WORKER_IDLE,
	PT_API_WORKER_BUSY,
	PT_API_WORKER_UNREACHABLE,
} pt_api_worker_state;

/* pt_api_worker_info is one WorkerInfo: a worker of the server's pool. */
typedef struct pt_api_worker_info {
	const char *url;
	pt_api_worker_state state;
	uint64_t job; /* the job it serves (0: none) */
	bool draining;
	double since_unix, last_heartbeat_unix; /* 0: never */
	const char *message;                    /* NULL = absent */
	const char *devices;                    /* what it computes on; NULL = absent */
} pt_api_worker_info;

/* pt_api_response is one Response. A non-OK code normally has no body
 * (kind PT_API_NONE) and says why in message. */
/* pt_api_plan is a Plan. */
typedef struct pt_api_plan {
	const char *schedule;
	int32_t stages, microbatches;
	int32_t virtual_stages; /* interleaved: chunks per stage (0, 1: none) */
	double step_seconds, bubble, samples_per_second;
	int32_t boundaries[PT_API_MAX_STAGES + 1];
	int n_boundaries;
	uint64_t stage_bytes[PT_API_MAX_STAGES];
	int n_stage_bytes;
} pt_api_plan;

typedef struct pt_api_response {
	uint64_t id; /* the request's id */
	pt_api_code code;
	const char *message; /* NULL = absent */
	pt_api_kind kind;    /* body kind; PT_API_NONE = no body */

	/* SubmitJobReply: the new job's id */
	uint64_t job;

	/* GetJobReply (exactly one) and ListJobsReply. Building: jobs[0..n_jobs).
	 * Parsed: jobs is NULL; read with pt_api_response_job. */
	const pt_api_job_info *jobs;
	size_t n_jobs;

	/* CancelJobReply (state after the cancel) and WatchMetricsReply */
	pt_api_job_state state;

	/* WatchMetricsReply. Building: points[0..n_points). Parsed: points is
	 * NULL; read with pt_api_response_point. */
	const pt_api_metric_point *points;
	size_t n_points;
	int64_t cursor; /* pass back as the next cursor */
	bool ended;     /* the job reached a final state; nothing more will come */

	/* FetchCheckpointReply */
	int64_t step;
	uint64_t total_size; /* bytes of the whole file */
	uint64_t offset;     /* where data starts in the file */
	const uint8_t *data; /* data_len bytes (points into the buffer when parsed) */
	size_t data_len;
	const char *sha256; /* hex of the whole file */

	/* ListCheckpointsReply. Building: checkpoints[0..n_checkpoints). Parsed:
	 * NULL; read with pt_api_response_checkpoint. */
	const pt_api_checkpoint_info *checkpoints;
	size_t n_checkpoints;

	/* ServerInfoReply */
	pt_api_server_info info;

	/* ListWorkersReply. Building: workers[0..n_workers). Parsed: NULL; read
	 * with pt_api_response_worker. */
	const pt_api_worker_info *workers;
	size_t n_workers;

	/* PlanJobReply. Building: plans[0..n_plans). Parsed: NULL; read with
	 * pt_api_response_plan. */
	const pt_api_plan *plans;
	size_t n_plans;

	/* Parsed views only: the verified vector behind jobs/points/checkpoints
	 * (GetJobReply: the JobInfo table itself). Private. */
	const uint8_t *vec_;
} pt_api_response;

/* pt_api_response_worker reads worker i of a parsed ListWorkersReply. */
pt_err pt_api_response_worker(const pt_api_response *r, size_t i, pt_api_worker_info *out);

/* pt_api_response_plan reads plan i of a parsed PlanJobReply (boundaries
 * and stage_bytes beyond the arrays' size are refused). */
pt_err pt_api_response_plan(const pt_api_response *r, size_t i, pt_api_plan *out);

/* pt_api_worker_state_name returns "unknown", "idle", "busy", "unreachable". */
const char *pt_api_worker_state_name(pt_api_worker_state s);

/* pt_api_response_init zeroes r and sets id, code and kind (cursor -1, step -1). */
void pt_api_response_init(pt_api_response *r, uint64_t id, pt_api_code code, pt_api_kind kind);

/* pt_api_build_response resets b and builds r as a finished Response buffer
 * (*data and *size point into b, valid until b is reset). PT_ERR_INVALID for an unknown
 * kind, GetJobReply without exactly one job, n_stages out of range, or a
 * data_len over PT_API_MAX_CHUNK. */
pt_err pt_api_build_response(pt_fb_builder *b, const pt_api_response *r, const uint8_t **data,
                             size_t *size);

/* pt_api_build_error builds a Response with no body: id, code and message
 * (printf-style; NULL = none). For the server's error replies. */
pt_err pt_api_build_error(pt_fb_builder *b, uint64_t id, pt_api_code code, const uint8_t **data,
                          size_t *size, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* pt_api_parse_response verifies buf[0..size) as a Response (buf 4-aligned)
 * and fills *out as a view into buf. Errors as pt_api_parse_request. A code
 * outside the enum is kept as its number (a newer server). */
pt_err pt_api_parse_response(const void *buf, size_t size, pt_api_response *out);

/* pt_api_response_job reads job i (< r->n_jobs) of a parsed GetJobReply or
 * ListJobsReply into *out (a view into the same buffer). PT_ERR_RANGE when i
 * is out of range; PT_ERR_INVALID when r was not parsed. */
pt_err pt_api_response_job(const pt_api_response *r, size_t i, pt_api_job_info *out);

/* pt_api_job_stage reads stage entry i (< j->n_stages) of a parsed job info
 * into *out. PT_ERR_RANGE when i is out of range; PT_ERR_INVALID when j was
 * not parsed. */
pt_err pt_api_job_stage(const pt_api_job_info *j, size_t i, pt_api_stage_stats *out);

/* pt_api_job_task reads task i (< j->n_timeline) of a parsed job info's
 * timeline into *out; errors as pt_api_job_stage's. */
pt_err pt_api_job_task(const pt_api_job_info *j, size_t i, pt_api_task_span *out);

/* pt_api_response_point reads metric point i (< r->n_points) of a parsed
 * WatchMetricsReply. stage_busy entries beyond PT_API_MAX_STAGES are dropped. */
pt_err pt_api_response_point(const pt_api_response *r, size_t i, pt_api_metric_point *out);

/* pt_api_response_checkpoint reads checkpoint i of a parsed ListCheckpointsReply. */
pt_err pt_api_response_checkpoint(const pt_api_response *r, size_t i, pt_api_checkpoint_info *out);

/* ------------------------------------------------------------ descriptors -- */

/* The verifier descriptors of the roots, pt_fb_api_request_desc and
 * pt_fb_api_response_desc (they reach the nested JobSpec), are generated from
 * the schema into fb_schema.h, for callers that verify with their own options. */
#include "fb_schema.h"

#endif
