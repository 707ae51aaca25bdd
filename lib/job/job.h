/* job.h - a training job: its spec (schema/job.fbs) decoded, validated and
 * converted from JSON, and the runner that trains it on pipeline stages.
 *
 * Validation names the field in every error ("model[3].in_features: ...",
 * "microbatches: 3 does not divide batch_size 64", "data.features: cannot
 * open ...", "placement.stages: 6 stages for 5 layers").
 */
#ifndef PT_JOB_H
#define PT_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "fb.h"
#include "fb_schema.h"
#include "pipeline.h"

/* How long a silent worker may stay silent before it counts as lost. */
#define PT_JOB_WORKER_TIMEOUT_MS 10000

/* checkpoint.keep at most this: checkpoints a job keeps on disk. */
#define PT_JOB_MAX_KEEP 1000

/* Tokens16/Tokens32: raw uint16/uint32 tokens or an llm.c .bin of that width;
 * Auto: tokens of the width an llm.c header says, else raw uint16 (nanoGPT). */
typedef enum pt_data_format {
	PT_DATA_NPY,
	PT_DATA_TOKENS16,
	PT_DATA_TOKENS32,
	PT_DATA_AUTO
} pt_data_format;

/* A decoded JobSpec. Strings and arrays are owned (pt_job_spec_fini). */
typedef struct pt_job_spec {
	char *name;
	pt_layer_spec *layers;
	int n_layers;
	struct {
		pt_data_format format;
		char *features, *labels, *tokens;
		char *val_tokens; /* Tokens: the evaluation file (NULL: held_out of tokens) */
		int64_t seq_len, vocab;
		float held_out;
		bool shuffle;
	} data;
	pt_loss_kind loss;
	int64_t ignore_index;
	pt_optim_config optim;
	int64_t batch_size;
	int microbatches;
	int64_t steps;
	pt_pipe_mode mode;
	int stages;
	int *boundaries; /* stages + 1 entries when given, else NULL */
	char **workers;  /* n_workers URLs, or NULL; past the first `stages`: spares */
	int n_workers;
	int threads_per_stage;
	int worker_timeout_ms; /* a worker silent this long is lost */
	int64_t checkpoint_every;
	int checkpoint_keep;
	bool resume;
	char *device; /* "cpu" or "cuda:N" */
	uint64_t seed;
	int64_t eval_every;
	bool compress, recompute, weight_stashing;
	bool use_graphs;    /* replay a captured training step */
	int max_restarts;   /* restarts after a lost worker (0: the job fails) */
	char *init_from;    /* initial weights (safetensors, PyTorch names), or NULL */
	int priority;       /* server queue: higher first, FIFO within (-1000 to 1000) */
	char *schedule;     /* flushing modes: "gpipe", "1f1b", "zb-h1", "interleaved" (NULL: the
	                     * mode's own) */
	int virtual_stages; /* interleaved: chunks per stage (0: 2) */
	char *precision;    /* "fp32" (NULL too) or "bf16" (pt_job_spec_precision) */
} pt_job_spec;

/* The JobSpec table descriptor, pt_fb_job_job_spec_desc, for verifying
 * buffers and nested tables, is generated from schema/job.fbs into fb_schema.h. */

/* pt_job_spec_read decodes a verified JobSpec table (checks enum ranges and
 * sizes of vectors; no file access). */
pt_err pt_job_spec_read(const uint8_t *table, pt_job_spec *out);

/* pt_job_spec_decode verifies buf as a JobSpec root buffer, then reads it. */
pt_err pt_job_spec_decode(const void *buf, size_t len, pt_job_spec *out);

/* pt_job_spec_virtual_stages is the chunks per stage of a job with schedule
 * "interleaved" (virtual_stages, 2 when absent), else 1. */
int pt_job_spec_virtual_stages(const pt_job_spec *s);

/* pt_job_spec_precision is PT_PREC_BF16 for precision "bf16", else fp32. */
pt_precision pt_job_spec_precision(const pt_job_spec *s);

/* pt_job_spec_validate checks everything a run needs: model shapes for the
 * data's sample shape, batch and microbatches, stages vs layers, optimizer
 * fields, device, and that the data files exist and agree. Data paths are
 * relative to files_root (NULL: the working directory) and must stay beneath
 * it, symlinks followed, unless any_path (pt_file_open_under): a path that
 * leaves it is PT_ERR_INVALID "data.features: " PT_FILE_OUTSIDE_ROOT, the
 * same answer whether or not it exists. */
pt_err pt_job_spec_validate(const pt_job_spec *s, const char *files_root, bool any_path);

/* pt_job_set_file_limit caps every data file a job opens (features, labels,
 * tokens, init_from: all read whole): a larger one is PT_ERR_RANGE, naming
 * the field, before it is read. 0 (the default) sets no cap. The server sets
 * a job's share of its --memory-limit. */
void pt_job_set_file_limit(uint64_t bytes);

/* pt_job_data_describe writes one line on a validated spec's data for the
 * job's status: for token jobs what the file's header said (and that Auto
 * picked it) and the evaluation set ("data.tokens: 1000000 u16 tokens (llm.c
 * header v1; picked by Auto); eval: 3124 windows of 64 tokens from the
 * held-out end of data.tokens"), for Npy jobs "eval: N held-out rows".
 * Reads file headers only. Blocking. */
pt_err pt_job_data_describe(const pt_job_spec *s, const char *files_root, bool any_path, char *buf,
                            size_t cap);

/* pt_job_spec_build writes s as a JobSpec table into b (to nest it in a
 * Request or a reply, or as a root with pt_fb_finish). */
pt_err pt_job_spec_build(pt_fb_builder *b, const pt_job_spec *s, pt_fb_ref *out);

/* pt_job_spec_from_json converts the JSON text of a JobSpec (what `flatc -b`
 * reads: comments, trailing commas, bare keys and enum names; job_json.c
 * lists it) into a JobSpec table in b. Errors start "line L, column C: " and
 * name the JSON path ("model[1].kindd: unknown field (of Layer)"). */
pt_err pt_job_spec_from_json(pt_fb_builder *b, const char *text, size_t len, pt_fb_ref *out);

/* pt_job_spec_load_file reads a job file - JSON text or a FlatBuffers binary,
 * told apart by content, whatever its name - and returns a verified JobSpec
 * root buffer (*buf, free() it). Every error message starts with path; for
 * JSON text it is "PATH:LINE:COLUMN: " and the JSON error alone. */
pt_err pt_job_spec_load_file(const char *path, void **buf, size_t *len);

/* pt_job_spec_fini frees what s owns and zeroes it. NULL-safe. */
void pt_job_spec_fini(pt_job_spec *s);

/* pt_job_spec_defaults zeroes s and sets the schema's defaults (held_out 0.2,
 * shuffle, ignore_index -1, AdamW with beta1 0.9, beta2 0.999, eps 1e-8,
 * microbatches 1, stages 1, keep 3, resume, seed 1, weight_stashing). Layers
 * are the caller's to add (the schema's Layer.bias default is true). */
void pt_job_spec_defaults(pt_job_spec *s);

/* pt_job_spec_parse_json converts the JSON text of a JobSpec straight into *out
 * (types, ranges of the field types and enum names are checked, nothing
 * else: see pt_job_spec_validate). Errors give line and column and name the
 * JSON path. On error *out owns nothing; on success release it with
 * pt_job_spec_fini. */
pt_err pt_job_spec_parse_json(const char *text, size_t len, pt_job_spec *out);

/* pt_job_spec_input_shape gives the shape of one sample as the data delivers
 * it: Npy f32 features F (n_features from the features file), Tokens i64
 * seq_len. */
pt_act_shape pt_job_spec_input_shape(const pt_job_spec *s, int64_t n_features);

/* One metric point of a running job. */
typedef struct pt_job_metric {
	int64_t step; /* 1-based: the step just completed */
	double loss;
	float lr;
	double grad_norm;
	double samples_per_s, tokens_per_s; /* over the step's wall time; tokens: 0 for Npy */
	double bubble;
	int n_stages;
	double stage_busy[PT_MAX_STAGES];
	double eval_loss, eval_accuracy; /* NaN when not evaluated at this step */
	double time_unix;
	/* Communicator counters since the run started, per rank: comm[0] the
	 * coordinator, comm[1..n_stages] the stages. n_comm ranks are filled:
	 * n_stages + 1, or 1 for an async job whose stages run on workers (a
	 * worker's stage sends its counters with the per-step timeline, which
	 * async steps do not fetch). */
	int n_comm;
	pt_comm_stats comm[PT_MAX_STAGES + 1];
	/* Flushing modes: stage s's task records of this step (tasks[s],
	 * n_tasks[s] of them; pt_now() seconds on the stage's host), valid
	 * during the on_metric call only. Async: none. */
	const pt_task_record *tasks[PT_MAX_STAGES];
	int n_tasks[PT_MAX_STAGES];
} pt_job_metric;

typedef struct pt_job_hooks {
	void *ctx;
	/* Called after every step, from the runner's thread. */
	void (*on_metric)(void *ctx, const pt_job_metric *m);
	/* Polled before every step; true stops the run (cancel or shutdown). */
	bool (*should_stop)(void *ctx);
	/* Called after a checkpoint file is complete (renamed into place), with
	 * its SHA-256 (64 hex digits, hashed as written) and size, from
	 * the runner's checkpoint writer thread: checkpoints are written in the
	 * background while training goes on, one at a time. */
	void (*on_checkpoint)(void *ctx, int64_t step, const char *path, const char *sha256,
	                      uint64_t size);
	/* Called when the run restarts after a lost worker (restart n of the
	 * spec's max_restarts), before it resumes at step `from` + 1; message
	 * says which worker was lost and where the stage went. */
	void (*on_restart)(void *ctx, int n, int64_t from, const char *message);
	/* When set, a spare of placement.workers is used only if this claims it
	 * (true): a server lends its pool's free workers as spares this way. A
	 * spare refused is passed over for this run. */
	bool (*claim_worker)(void *ctx, const char *url);
} pt_job_hooks;

/* TLS for tls+tcp:// workers (files; NULL or "": unset). The coordinator
 * presents cert/key to workers that require a client certificate and serves
 * its stage data port with them; ca verifies the workers' certificates
 * (control and data ports), checked against the host of each URL. */
typedef struct pt_job_tls {
	const char *cert, *key, *ca;
} pt_job_tls;

typedef struct pt_job_run_options {
	const char *checkpoint_dir; /* where step-N.safetensors files go (NULL: none) */
	const char *files_root;     /* data paths are beneath it (NULL: cwd) */
	bool any_path;              /* allow data paths outside files_root (absolute, "..") */
	const char *worker_allow;   /* placement.workers must match (pt_job_spec_check_workers;
	                             * NULL: any) */
	const char *resume_from;    /* a checkpoint to resume from, or NULL */
	int threads;                /* CPU threads for the whole job (0: all cores) */
	/* Jobs with placement.workers: */
	const char *worker_token;   /* presented to workers that require one (NULL: none) */
	const char *advertise_host; /* host workers dial for the coordinator (NULL: this
	                             * host's address on the connection to the first worker) */
	pt_job_tls worker_tls;      /* for tls+tcp:// workers */
	/* In-process stages on GPUs the server placed them on: stage s on
	 * cuda:stage_gpus[s - 1] (n_stage_gpus == spec->stages); 0: spec->device
	 * decides. */
	const int *stage_gpus;
	int n_stage_gpus;
} pt_job_run_options;

/* pt_job_run trains the job to spec->steps (or until should_stop), writing
 * checkpoints per the spec's policy and always one at the end (also when
 * stopped). Blocking. *last_step gets the last completed step.
 *
 * It validates spec first, runs p stage threads and the coordinator (this
 * thread) over the local communicator - or, with placement.workers, has
 * each stage served by the `pipeserver --worker` named for it, over nng
 * (pt_job_workers_join); training is the same either way - and evaluates on every held-out
 * row (Npy) or every fixed window of the held-out tokens (docs/model.md) at
 * every eval_every-th and the last step. A checkpoint is DIR/step-N.safetensors (the full model's
 * weights, PyTorch names) plus DIR/step-N.safetensors.state (tensor "stage<s>.state", s = 0..p-1,
 * per stage: parameters then optimizer state; metadata step, optimizer_steps, job, stages,
 * boundaries); only the newest checkpoint.keep pairs stay. A checkpoint is a snapshot of the
 * gathered state handed to a writer thread, so training goes on while it is hashed and written;
 * the next checkpoint waits for it, a failed write ends the run at the next step, and the run
 * returns after its last checkpoint is written. Stopped before any step, the initial
 * weights are saved as step 0. resume_from (a step-N.safetensors path written for the same
 * partition) restores every stage and continues at step N + 1; the batch of each step depends only
 * on (seed, step), so in sync and semi-async mode a resumed run equals an uninterrupted one
 * bitwise. Otherwise, with spec->init_from, every stage starts from that file's weights (a fresh
 * optimizer: zero state, step count 0; docs/model.md) - also when a restart
 * finds no checkpoint of this run. An error from the
 * pipeline, the data or a checkpoint ends the run with that error - except a
 * worker lost to the heartbeats (placement.worker_timeout_ms), whose verdict
 * names the stage and the worker: with max_restarts left and a spare among
 * placement.workers (URLs past the first `stages`), the run restarts from
 * its newest checkpoint with the stage on the spare (hooks->on_restart). */
pt_err pt_job_run(const pt_job_spec *spec, const pt_job_run_options *o, const pt_job_hooks *h,
                  int64_t *last_step);

/* The whole reason a job's error gives for a worker whose handshake failed
 * ("stage 1 (worker tcp://h:7700): " this): whatever answered, or did not,
 * stays in the server log. */
#define PT_JOB_WORKER_UNREACHABLE "unreachable or refused the handshake (reason in the server log)"

/* pt_job_worker_allow_parse checks a --worker-allow list: entries separated
 * by commas, each an IPv4 or IPv6 CIDR ("10.0.0.0/8", "fd00::/8"), an address,
 * or a host name. PT_ERR_INVALID names the bad entry. */
pt_err pt_job_worker_allow_parse(const char *allow);

/* pt_job_spec_check_workers checks every placement.workers URL against allow
 * (NULL or "": any URL passes). An IP literal host must lie in a listed
 * CIDR or equal a listed address; a host name must equal a listed name
 * (case-insensitive; names are never resolved here, so a name is allowed
 * only by name). ipc:// and abstract:// URLs pass only without a list.
 * Otherwise PT_ERR_INVALID "placement.workers[i]: 'URL' is not allowed by
 * --worker-allow". No network access; thread-safe. */
pt_err pt_job_spec_check_workers(const pt_job_spec *s, const char *allow);

/* Options of pt_job_workers_join. */
typedef struct pt_job_workers_options {
	const char *const *urls; /* control URLs of the workers of stages 0..n-1 (borrowed:
	                          * they must outlive the pt_job_workers) */
	int n;
	const char *token;          /* presented in StageJoin (NULL: none) */
	const char *advertise_host; /* see pt_job_run_options */
	pt_job_tls tls;             /* see pt_job_run_options */
	bool compress;              /* lz4 tensors on every rank */
	int timeout_ms;             /* each handshake reply, and the heartbeat timeout: a worker
	                             * silent this long is lost (0: PT_JOB_WORKER_TIMEOUT_MS) */
} pt_job_workers_options;

/* The workers serving one job's stages, watched by heartbeats. */
typedef struct pt_job_workers pt_job_workers;

/* pt_job_workers_join runs the worker handshake (schema/stage.fbs: StageJoin
 * to every worker, then StagePeers with every rank's data URL), connects
 * rank 0's nng communicator (pt_job_workers_comm: listening on
 * tcp://<host>:0, owned by *out) and starts the heartbeats; the workers then
 * wait for pt_coordinator_configure. On error (naming the stage and the
 * worker URL - for a worker's failed handshake PT_ERR_IO saying no more
 * than PT_JOB_WORKER_UNREACHABLE, the reason logged; *failed, when not
 * NULL, gets that stage, or -1 when the coordinator's side failed) nothing
 * is left: sessions made so far are ended. Blocking (up to timeout_ms per
 * request); thread-safe. */
pt_err pt_job_workers_join(const pt_job_workers_options *o, pt_job_workers **out, int *failed);

/* pt_job_worker_probe asks the `pipeserver --worker` at url for its state
 * (StagePing with session 0) within timeout_ms, on a connection of its own:
 * *busy tells whether it serves a session, state gets its words ("idle",
 * "serving stage rank 1 of world 3"), devices (dn bytes) what it computes on
 * ("cpu (16 cores), cuda:0"; "" from an older worker). tls: for tls+tcp:// URLs (may be NULL
 * otherwise). Errors name the worker (unreachable, no reply, malformed). */
pt_err pt_job_worker_probe(const char *url, const pt_job_tls *tls, int timeout_ms, bool *busy,
                           char *state, size_t n, char *devices, size_t dn);

/* pt_job_workers_comm returns rank 0's communicator (owned by ws). */
pt_comm *pt_job_workers_comm(const pt_job_workers *ws);

/* pt_job_workers_wait_lost waits up to ms for a heartbeat verdict and returns
 * the first stage declared lost (-1: none), writing its message ("stage 2 on
 * worker tcp://10.0.0.4:7000: no heartbeat for 1.5 s") into why. A lost
 * stage's rank is already marked lost in the communicator, so the
 * coordinator's waits on it fail at once. Thread-safe; NULL-safe (-1). */
int pt_job_workers_wait_lost(pt_job_workers *ws, int ms, char *why, size_t n);

/* pt_job_workers_is_lost tells whether stage was declared lost. */
bool pt_job_workers_is_lost(pt_job_workers *ws, int stage);

/* pt_job_workers_stop_heartbeats stops pinging (before the stages are told
 * to STOP, so a worker that finished is not taken for lost). No verdict
 * comes after it. Blocking (up to one ping); idempotent; NULL-safe. */
void pt_job_workers_stop_heartbeats(pt_job_workers *ws);

/* pt_job_workers_end stops the heartbeats, ends the session of every worker
 * not lost (each is idle when it answers), closes the links and the
 * communicator, and frees ws. Blocking (up to the timeout per worker);
 * NULL-safe. */
void pt_job_workers_end(pt_job_workers *ws);

/* ------------------------------------------------------- planner (plan.c) */

/* One candidate the planner priced: a schedule at p stages, m microbatches. */
typedef struct pt_job_plan {
	pt_pipe_schedule schedule;
	int stages, microbatches;
	int virtual_stages;  /* interleaved: chunks per stage (2), else 1 */
	double step_seconds; /* predicted wall time of one step */
	double bubble;       /* predicted idle share of stage time */
	double samples_per_s;
	int first[PT_MAX_STAGES + 1];        /* the partition (pt_partition's), of stages *
	                                      * virtual_stages */
	uint64_t stage_bytes[PT_MAX_STAGES]; /* pt_job_memory_estimate per (logical) stage */
} pt_job_plan;

typedef struct pt_job_plan_options {
	const char *files_root; /* data paths beneath it, as pt_job_run's */
	bool any_path;
	int threads;       /* the job's CPU budget (0: every core) */
	const int *stages; /* candidate stage counts (n_stages 0: the spec's) */
	int n_stages;
	const int *microbatches; /* candidate microbatch counts (0: the spec's) */
	int n_microbatches;
	uint64_t host_limit; /* each candidate admitted against it before it is
	                      * profiled (0: no limit) */
} pt_job_plan_options;

/* pt_job_plan_run prices every flushing schedule (gpipe, 1f1b, zb-h1) for
 * each candidate (p, m) of a validated spec: it measures each layer's F, B
 * and W on this CPU (cached per layer shape, microbatch and threads) and
 * simulates the schedule's task order (plan.c says how). *out (free()) gets
 * the plans, fastest first. Blocking: a first plan of a model takes a few
 * timed runs of every layer. CPU stages in this process only: a spec with
 * placement.workers or a CUDA device is refused. */
pt_err pt_job_plan_run(const pt_job_spec *spec, const pt_job_plan_options *o, pt_job_plan **out,
                       int *n);

/* pt_job_plan_forget drops every cached layer profile and the measured core
 * speeds: the next plan measures afresh (on a machine whose speed drifts,
 * as plan_bench does right before each measured group). */
void pt_job_plan_forget(void);

/* ------------------------------------------------------ memory (memory.c) */

/* The shapes of a job's data that its memory depends on. */
typedef struct pt_job_data_shape {
	int64_t rows, features; /* Npy: features (rows, features) */
	pt_dtype x_dtype, y_dtype;
	int y_ndim;
	int64_t y_cols;            /* labels: 1 for (N,), K for (N, K) */
	uint64_t x_bytes, y_bytes; /* Npy payloads */
	uint64_t token_bytes;      /* Tokens: the files' sizes (tokens, val_tokens) */
} pt_job_data_shape;

/* Estimated peak bytes of one pipeline stage. */
typedef struct pt_job_memory_stage {
	int first, last; /* its layers [first, last) */
	int n_slots;     /* activation slots: sync m, semi-async and async p */
	uint64_t params, grads, optimizer, stash, activations, workspace, total;
} pt_job_memory_stage;

/* Estimated peak memory of a job. */
typedef struct pt_job_memory {
	int n_stages;
	pt_job_memory_stage stages[PT_MAX_STAGES];
	uint64_t coordinator; /* host: full model, data, gathered state, runtime */
	uint64_t host;        /* this process: the coordinator plus its CPU stages */
} pt_job_memory;

/* pt_job_data_shape_read reads the headers (npy) or sizes (tokens) of a
 * validated spec's data files, opened as pt_job_spec_validate opens them
 * (beneath files_root unless any_path). Blocking. */
pt_err pt_job_data_shape_read(const pt_job_spec *s, const char *files_root, bool any_path,
                              pt_job_data_shape *out);

/* pt_job_memory_estimate gives the peak memory of a validated spec per stage
 * (parameters, gradients, optimizer state, async weight stashes, activations
 * of the schedule's live microbatches, workspace) and for this host (stages
 * on workers or devices are not charged to it). No allocation, no I/O;
 * never overflows (absurd sizes saturate at UINT64_MAX). */
pt_err pt_job_memory_estimate(const pt_job_spec *s, const pt_job_data_shape *d, pt_job_memory *out);

/* pt_job_admit estimates s (reading its data headers) and refuses it with
 * PT_ERR_RANGE, naming the estimate, the limit and the largest stage, when
 * the host estimate exceeds host_limit bytes (0: no limit), or, for
 * in-process CUDA stages, when a device's stages exceed its memory. est
 * (may be NULL) gets the estimate. Blocking (file headers). */
pt_err pt_job_admit(const pt_job_spec *s, const char *files_root, bool any_path,
                    uint64_t host_limit, pt_job_memory *est);

/* pt_job_memory_parse reads a size: bytes, or with a K, M, G or T suffix
 * (binary: 1K = 1024; "KiB"/"KB" spellings accepted). */
pt_err pt_job_memory_parse(const char *text, uint64_t *bytes);

/* pt_job_memory_host_limit gives the memory this process may use: the
 * cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) when set and
 * below MemTotal, else MemTotal; *source names which. */
pt_err pt_job_memory_host_limit(uint64_t *bytes, const char **source);

/* pt_job_memory_format writes bytes as "1.5 GiB (1610612736 bytes)". */
void pt_job_memory_format(char *buf, size_t cap, uint64_t bytes);

#endif
