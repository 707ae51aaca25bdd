/* runner.c - pt_job_run: train a validated JobSpec on in-process pipeline
 * stages, with metrics, held-out evaluation, checkpoints and resume.
 *
 * Layout: rank 0 (this thread) is the coordinator, ranks 1..p are stage
 * threads over the local communicator - or, when the spec names
 * placement.workers, stages served by those `pipeserver --worker` processes
 * over nng (workers.c does the handshake; the stages are then configured
 * with pt_coordinator_configure and everything else is the same code). The runner also keeps one
 * full model (never trained) to evaluate and to write PyTorch-named weights: the full model's
 * parameter arena is the concatenation of the stages' arenas, which the runner checks once by
 * building each stage's model.
 *
 * Determinism: the batch of step N is a pure function of (seed, N) - an
 * epoch's order comes from (seed, epoch), token windows from (seed, step) -
 * and a checkpoint holds every stage's whole training state, so a run resumed
 * from step k equals the uninterrupted run bitwise (sync and semi-async).
 *
 * Checkpoint files: DIR/step-N.safetensors holds the full model's weights
 * (pt_checkpoint_save, PyTorch names); DIR/step-N.safetensors.state holds one
 * flat f32 tensor per stage, "stage<s>.state" (s = 0..p-1: parameters then
 * optimizer state, as pt_coordinator_get_state gives it), with metadata
 * format, schema_version, job, step, optimizer_steps (per stage, comma
 * separated), stages and boundaries.
 *
 * Device cuda:N (in-process stages only): the stages' communicators become
 * NCCL communicators (nccl_comm.h) over the local ones, stage s on
 * cuda:((N + s - 1) mod devices) and the coordinator on the CPU, and each
 * stage computes on that same device (pt_stage_config.device): its weights,
 * gradients, activations and optimizer state are device memory, activations
 * and gradients between stages on different GPUs travel over NCCL as device
 * tensors, stages sharing a GPU pass them on the control path (a host copy
 * put back on the device); in a build without NCCL all of them do. A
 * server that places the stages on GPUs it owns
 * (pt_job_run_options.stage_gpus) names each stage's device instead. The
 * coordinator stays on the CPU: it sends host batches and loss gradients
 * (each stage copies them to its device) and gets host outputs, norms,
 * parameters and state, so the loss, metrics, evaluation (the runner's full
 * model is a CPU model) and checkpoints are host code as before. use_graphs
 * is ignored on device stages (eager; see stage.c). Without a device its
 * tests (test_cuda) skip. Limits: jobs on placement.workers with a CUDA
 * device are refused.
 *
 * Lost workers: the first `stages` URLs of placement.workers serve the
 * stages, the rest are spares. A worker that refuses or cannot be reached
 * at the handshake is replaced by a spare while one is left. When a worker
 * is lost while training (workers.c's heartbeat verdict), the pipeline is
 * taken down (the other workers end their sessions and are idle) and, while
 * max_restarts allows, built again with the lost stage on a spare and
 * resumed from the newest checkpoint of this run - the same code path as
 * resume_from, so the stages continue bitwise as a resume would; without a
 * checkpoint it starts over from the seed. A lost worker is not used again
 * by this run. Limits: one stage per worker.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "batch.h"
#include "checkpoint.h"
#include "fileio.h"
#include "job.h"
#include "job_internal.h"
#include "nccl_comm.h"
#include "log.h"
#include "npy.h"
#include "runtime.h"
#include "safetensors.h"
#include "tokens.h"
#include "train.h"

typedef struct runner {
	const pt_job_spec *s;
	const char *root, *ckdir;
	bool any_path; /* data paths may leave root (pt_job_run_options) */
	const pt_job_hooks *h;
	const pt_job_run_options *o;
	int p, m, threads, tps;
	/* Interleaved: p = ranks * v stages, chunk c of rank r is stage
	 * c * ranks + r; the chunks of a rank take turns (turns[r - 1]). */
	int ranks, v;
	pt_pipe_schedule sched; /* resolve_schedule's */
	pt_stage_turn *turns[PT_MAX_STAGES];
	int64_t B; /* samples per microbatch */
	pt_act_shape in;
	int first[PT_MAX_STAGES + 1];
	int64_t nparams[PT_MAX_STAGES]; /* floats in each stage's parameter arena */

	pt_local_group *g;
	pt_job_workers *ws;       /* placement.workers: owns comms[0] */
	int place[PT_MAX_STAGES]; /* index in spec->workers serving each rank */
	bool bad[PT_MAX_STAGES];  /* workers this run lost or could not join */
	int restarts;
	char ckpt_path[4096]; /* newest checkpoint written or resumed ("": none) */
	pt_comm *comms[PT_MAX_STAGES + 1];
	pt_stage *stages[PT_MAX_STAGES + 1];
	bool started[PT_MAX_STAGES + 1];
	pt_coordinator *coord;
	pt_model *full;
	pt_trainer *eval;

	pt_dataset all, train, held;
	pt_batch_iter it;
	int64_t per_epoch;       /* batches per epoch */
	pt_tokens tk, val;       /* val: data.val_tokens (count 0: none) */
	int64_t train_end;       /* tokens: training windows lie in [0, train_end) */
	const pt_tokens *etk;    /* tokens: the evaluation windows' file */
	int64_t eval_lo, n_eval; /* its windows: n_eval from token eval_lo (Npy: rows) */
	pt_tensor x, y;          /* one batch */
	pt_tensor ex, ey;        /* one evaluation microbatch */
	pt_loss *loss;           /* the evaluation's loss, on the full model's output */
	bool have_eval;

	pt_tensor states[PT_MAX_STAGES]; /* gathered at eval/checkpoint steps */
	int64_t opt_steps[PT_MAX_STAGES];
	bool have_states;
	int64_t last_ckpt; /* step of the newest checkpoint written or resumed (-1: none) */

	/* The checkpoint writer: one thread writes one snapshot at a time while
	 * training goes on; the next checkpoint (and the run's end, a restart)
	 * waits for it first. Under wmu. */
	pthread_t writer;
	bool writer_up, writer_quit;
	pthread_mutex_t wmu;
	pthread_cond_t wcv;
	struct snapshot *wjob; /* queued or being written; NULL: idle */
	bool wbusy;
} runner;

/* load_npy reads the .npy file a data field names, confined as at submit
 * (opened again here, so a file swapped since validation cannot escape). */
static pt_err load_npy(runner *r, pt_tensor *t, const char *field, const char *path)
{
	int fd;
	pt_err rv;

	PT_TRY(pt_job_open_data(field, path, r->root, r->any_path, &fd));
	rv = pt_npy_read_fd(t, fd, path);
	close(fd);
	if (rv != PT_OK)
		return pt_set_error(rv, "%s: %s", field, pt_last_error());
	return PT_OK;
}

/* ----------------------------------------------------------------- data -- */

static pt_err data_up(runner *r)
{
	const pt_job_spec *s = r->s;
	int64_t batch = s->batch_size;
	pt_err rv;

	if (s->data.format == PT_DATA_NPY) {
		int64_t yshape[2];
		pt_tensor fx = {0}, fy = {0};
		if ((rv = load_npy(r, &fx, "data.features", s->data.features)) == PT_OK &&
		    (rv = load_npy(r, &fy, "data.labels", s->data.labels)) == PT_OK)
			rv = pt_dataset_init(&r->all, &fx, &fy, true);
		pt_tensor_fini(&fx);
		pt_tensor_fini(&fy);
		PT_TRY(rv);
		PT_TRY(pt_dataset_split(&r->train, &r->held, &r->all, (double)s->data.held_out,
		                        s->seed));
		PT_TRY(
		    pt_batch_iter_init(&r->it, &r->train, batch, s->data.shuffle, true, s->seed));
		r->per_epoch = pt_batch_iter_batches(&r->it);
		if (r->per_epoch < 1)
			return pt_set_error(PT_ERR_RANGE, "data: no full batch of %ld samples",
			                    (long)batch);
		r->in = pt_job_spec_input_shape(s, r->all.x.shape[1]);
		PT_TRY(pt_tensor_init(&r->x, PT_F32, 2, (int64_t[]){batch, r->in.features}));
		memcpy(yshape, r->train.y.shape, sizeof(yshape));
		yshape[0] = batch;
		PT_TRY(pt_tensor_init(&r->y, r->train.y.dtype, r->train.y.ndim, yshape));
		r->n_eval = r->held.n;
		r->have_eval = r->n_eval > 0;
		/* The evaluation microbatch: held-out rows, the last one padded. */
		yshape[0] = r->B;
		PT_TRY(pt_tensor_init(&r->ex, PT_F32, 2, (int64_t[]){r->B, r->in.features}));
		return pt_tensor_init(&r->ey, r->train.y.dtype, r->train.y.ndim, yshape);
	}
	int64_t T = s->data.seq_len;
	PT_TRY(pt_job_load_tokens(s, "data.tokens", s->data.tokens, r->root, r->any_path, &r->tk));
	if (s->data.val_tokens != NULL) {
		PT_TRY(pt_job_load_tokens(s, "data.val_tokens", s->data.val_tokens, r->root,
		                          r->any_path, &r->val));
		r->train_end = r->tk.count;
		r->etk = &r->val;
		r->eval_lo = 0;
	} else {
		r->train_end = pt_tokens_split(r->tk.count, (double)s->data.held_out);
		r->etk = &r->tk;
		r->eval_lo = r->train_end;
	}
	r->n_eval = pt_tokens_n_windows(r->eval_lo, r->etk->count, T);
	r->have_eval = r->n_eval > 0;
	r->in = pt_job_spec_input_shape(s, 0);
	PT_TRY(pt_tensor_init(&r->x, PT_I64, 2, (int64_t[]){batch, T}));
	PT_TRY(pt_tensor_init(&r->y, PT_I64, 2, (int64_t[]){batch, T}));
	PT_TRY(pt_tensor_init(&r->ex, PT_I64, 2, (int64_t[]){r->B, T}));
	PT_TRY(pt_tensor_init(&r->ey, PT_I64, 2, (int64_t[]){r->B, T}));
	return PT_OK;
}

/* load_batch fills x, y with the batch of 0-based step k: a pure function of
 * (seed, k), whatever ran before. */
static pt_err load_batch(runner *r, int64_t k)
{
	int64_t rows;
	if (r->s->data.format != PT_DATA_NPY)
		return pt_tokens_sample_range(&r->tk, 0, r->train_end, r->s->seed, (uint64_t)k,
		                              &r->x, &r->y);
	uint64_t epoch = (uint64_t)(k / r->per_epoch);
	int64_t pos = (k % r->per_epoch) * r->s->batch_size;
	if (r->it.epoch != epoch || r->it.pos != pos) {
		pt_batch_iter_set_epoch(&r->it, epoch);
		r->it.pos = pos; /* the iterator's documented cursor: row `pos` of the order */
	}
	PT_TRY(pt_batch_iter_next(&r->it, &r->x, &r->y, &rows));
	if (rows != r->s->batch_size)
		return pt_set_error(PT_ERR_STATE, "data: step %ld got %ld rows of %ld", (long)k + 1,
		                    (long)rows, (long)r->s->batch_size);
	return PT_OK;
}

static void data_down(runner *r)
{
	pt_tensor_fini(&r->x);
	pt_tensor_fini(&r->y);
	pt_tensor_fini(&r->ex);
	pt_tensor_fini(&r->ey);
	pt_batch_iter_fini(&r->it);
	pt_dataset_fini(&r->train);
	pt_dataset_fini(&r->held);
	pt_dataset_fini(&r->all);
	pt_tokens_fini(&r->tk);
	pt_tokens_fini(&r->val);
}

/* ------------------------------------------------------------- pipeline -- */

static pt_err models_up(runner *r)
{
	const pt_job_spec *s = r->s;
	/* Neither draws weights: `one` only measures a stage's arena, and the
	 * full model's weights are gathered from the stages before every use. */
	pt_model_config one = {
	    .batch = 1, .input = r->in, .n_slots = 1, .seed = s->seed, .no_init = true};
	pt_model_config full = {.batch = r->B,
	                        .input = r->in,
	                        .n_slots = 1,
	                        .seed = s->seed,
	                        .no_init = true,
	                        .precision = pt_job_spec_precision(s)};
	int64_t sum = 0, total;

	if (s->boundaries != NULL) {
		memcpy(r->first, s->boundaries, sizeof(int) * ((size_t)r->p + 1));
		PT_TRY(pt_partition_check(s->n_layers, r->p, r->first));
	} else {
		PT_TRY(pt_partition(s->layers, s->n_layers, r->in, r->p, r->first));
	}
	PT_TRY(pt_model_create(&r->full, s->layers, s->n_layers, 0, s->n_layers, &full));
	/* Each stage's arena from the stage's own model (batch 1: cheap): every
	 * parameter must sit in the full arena at the stage's base plus its
	 * place in the stage's arena, so concatenating the stages' arenas gives
	 * the full model's. */
	for (int st = 0, g = 0; st < r->p; st++) {
		pt_model *m;
		pt_err rv = PT_OK;
		PT_TRY(pt_model_create(&m, s->layers, s->n_layers, r->first[st], r->first[st + 1],
		                       &one));
		r->nparams[st] = pt_tensor_numel(pt_model_params(m));
		for (int i = 0; i < pt_model_num_tensors(m) && rv == PT_OK; i++, g++) {
			const char *name, *full_name;
			pt_tensor *p, *q;
			pt_model_tensor(m, i, &name, &p, NULL);
			if (g >= pt_model_num_tensors(r->full) ||
			    pt_model_tensor(r->full, g, &full_name, &q, NULL) != PT_OK ||
			    strcmp(name, full_name) != 0 || q->offset != sum + p->offset)
				rv = pt_set_error(PT_ERR_STATE,
				                  "stage %d's parameter %s is not where the full "
				                  "model keeps it",
				                  st, name);
		}
		sum += r->nparams[st];
		pt_model_destroy(m);
		PT_TRY(rv);
	}
	total = pt_tensor_numel(pt_model_params(r->full));
	if (sum != total)
		return pt_set_error(
		    PT_ERR_STATE,
		    "the stages' parameter arenas (%ld floats) do not add up to the "
		    "full model's (%ld)",
		    (long)sum, (long)total);
	{
		pt_act_shape os = pt_model_output_shape(r->full);
		int64_t shape[3];
		int nd = 0;
		shape[nd++] = r->B;
		if (os.seq)
			shape[nd++] = os.seq;
		shape[nd++] = os.features;
		return pt_loss_create(&r->loss, s->loss, nd, shape, s->ignore_index);
	}
}

/* nccl_up places stage s on devs[s] = cuda:((dev + s - 1) mod devices),
 * where that stage then computes (the coordinator on the CPU), and makes
 * every rank's local communicator the control channel of an NCCL
 * communicator. In a build without NCCL the local communicators stay:
 * tensors between stages then cross as host copies, as they reach the
 * coordinator. */
static pt_err nccl_up(runner *r, pt_device dev, pt_device *devs)
{
	int n = 0;

	PT_TRY(pt_backend_device_count(PT_DEV_CUDA, &n));
	devs[0] = PT_CPU;
	for (int i = 1; i <= r->p; i++)
		devs[i] = r->o->n_stage_gpus > 0
		              ? (pt_device){PT_DEV_CUDA, r->o->stage_gpus[(i - 1) % r->ranks]}
		              : (pt_device){PT_DEV_CUDA, (dev.index + i - 1) % n};
	if (!pt_nccl_built()) {
		if (r->p > 1)
			pt_info("job %s: this build has no NCCL: tensors between its stages cross "
			        "through host memory",
			        r->s->name ? r->s->name : "");
		return PT_OK;
	}
	return pt_nccl_comm_create_group(r->comms, devs, r->p + 1, -1);
}

/* next_spare returns the first worker of placement.workers that serves no
 * stage, was not lost or refused in this run and, with a claim_worker hook,
 * is claimed (-1: none left). */
static int next_spare(runner *r)
{
	for (int i = 0; i < r->s->n_workers; i++) {
		bool used = r->bad[i];
		for (int st = 0; st < r->ranks && !used; st++)
			used = r->place[st] == i;
		if (used)
			continue;
		if (r->h && r->h->claim_worker &&
		    !r->h->claim_worker(r->h->ctx, r->s->workers[i])) {
			r->bad[i] = true;
			continue;
		}
		return i;
	}
	return -1;
}

static pt_err join_workers(runner *r)
{
	const pt_job_spec *s = r->s;

	for (;;) {
		const char *urls[PT_MAX_STAGES];
		int failed = -1, spare = -1;
		pt_err rv;
		/* An interleaved rank's chunks share its worker (a seat each). */
		for (int st = 0; st < r->p; st++)
			urls[st] = s->workers[r->place[st % r->ranks]];
		pt_job_workers_options wo = {.urls = urls,
		                             .n = r->p,
		                             .token = r->o->worker_token,
		                             .advertise_host = r->o->advertise_host,
		                             .tls = r->o->worker_tls,
		                             .compress = s->compress,
		                             .timeout_ms = s->worker_timeout_ms};
		if ((rv = pt_job_workers_join(&wo, &r->ws, &failed)) == PT_OK) {
			r->comms[0] = pt_job_workers_comm(r->ws);
			return PT_OK;
		}
		if (failed < 0 || (spare = next_spare(r)) < 0)
			return rv;
		pt_warn("job %s: %s; stage %d goes to spare worker %s", s->name ? s->name : "",
		        pt_last_error(), failed, s->workers[spare]);
		r->bad[r->place[failed % r->ranks]] = true;
		r->place[failed % r->ranks] = spare;
	}
}

/* resolve_schedule sets r->sched, r->v and r->p: the spec's schedule, or
 * with "auto" the planner's fastest at the job's stage and microbatch
 * counts (the mode's own where the planner cannot price the job). Auto
 * passes over interleaved plans: they cut the model into more stages, and
 * a resume (after a restart of the server, which plans again) must find the
 * checkpoint's stage count. */
static pt_err resolve_schedule(runner *r)
{
	const pt_job_spec *s = r->s;
	r->sched = PT_SCHED_MODE;
	r->v = pt_job_spec_virtual_stages(s);
	if (s->schedule != NULL && strcmp(s->schedule, "auto") == 0) {
		pt_job_plan_options po = {
		    .files_root = r->root, .any_path = r->any_path, .threads = r->threads};
		pt_job_plan *plans = NULL;
		int n = 0;
		if (pt_job_plan_run(s, &po, &plans, &n) != PT_OK)
			pt_warn("schedule auto: %s; the mode's own schedule instead",
			        pt_last_error());
		for (int i = 0; i < n; i++)
			if (plans[i].virtual_stages <= 1) {
				r->sched = plans[i].schedule;
				pt_info("schedule auto: %s (predicted %.4g s a step)",
				        pt_pipe_schedule_name(r->sched), plans[i].step_seconds);
				break;
			}
		free(plans);
		pt_set_num_threads(r->threads);
	} else if (s->schedule != NULL) {
		PT_TRY(pt_pipe_schedule_parse(s->schedule, &r->sched));
	}
	r->p = r->ranks * r->v;
	return PT_OK;
}

static pt_err pipeline_up(runner *r)
{
	const pt_job_spec *s = r->s;
	pt_pipe_schedule sched = r->sched;
	int il_slots = 0;
	if (sched == PT_SCHED_INTERLEAVED) {
		/* A chunk holds at most what its rank's order keeps in flight. */
		PT_TRY(pt_pipe_interleaved_slots(r->ranks, r->v, r->m, &il_slots));
		/* On workers: the worker's turn (pt_stage_turn_share). */
		for (int rk = 1; rk <= r->ranks && s->n_workers == 0; rk++)
			PT_TRY(pt_stage_turn_create(&r->turns[rk - 1], rk, r->ranks, r->v, r->m));
	}
	pt_pipeline_config pc = {.n_stages = r->p,
	                         .virtual_stages = r->v,
	                         .n_microbatches = r->m,
	                         .microbatch = r->B,
	                         .mode = s->mode,
	                         .schedule = sched,
	                         .loss = s->loss,
	                         .ignore_index = s->ignore_index,
	                         .optim = s->optim,
	                         .output = pt_model_output_shape(r->full)};

	pt_stage_config configs[PT_MAX_STAGES];
	pt_device dev = PT_CPU, devs[PT_MAX_STAGES + 1] = {{PT_DEV_CPU, 0}};

	if (r->o->n_stage_gpus > 0) {
		if (r->o->n_stage_gpus != r->ranks)
			return pt_set_error(PT_ERR_INVALID, "%d GPUs placed for %d stages",
			                    r->o->n_stage_gpus, r->ranks);
		dev = (pt_device){PT_DEV_CUDA, r->o->stage_gpus[0]};
	} else if (s->device != NULL) {
		PT_TRY(pt_device_parse(s->device, &dev));
	}
	if (dev.kind == PT_DEV_CUDA && r->v > 1)
		return pt_set_error(
		    PT_ERR_UNSUPPORTED,
		    "schedule: interleaved on CUDA (cuda:%d) is not built yet (a "
		    "rank's chunks would share a GPU, and NCCL takes one rank a GPU)",
		    dev.index);
	if (dev.kind == PT_DEV_CUDA && s->n_workers > 0)
		return pt_set_error(PT_ERR_UNSUPPORTED,
		                    "device %s with placement.workers: not supported yet (the "
		                    "workers' communicators are nng)",
		                    s->device);
	if (s->n_workers > 0) {
		PT_TRY(join_workers(r));
	} else {
		PT_TRY(pt_local_group_create(&r->g, r->p + 1));
		for (int i = 0; i <= r->p; i++)
			PT_TRY(pt_local_comm_create(&r->comms[i], r->g, i));
		if (dev.kind == PT_DEV_CUDA)
			PT_TRY(nccl_up(r, dev, devs));
	}
	for (int st = 1; st <= r->p; st++) {
		pt_stage_config c = {.layers = s->layers,
		                     .n_layers = s->n_layers,
		                     .input = r->in,
		                     .microbatch = r->B,
		                     .first = r->first[st - 1],
		                     .last = r->first[st],
		                     /* GPipe holds m; 1F1B and ZB-H1 at most p (r->p + 1:
		                      * ZB-H1's B leaves its slot to a W). */
		                     .n_slots =
		                         sched == PT_SCHED_INTERLEAVED ? il_slots
		                         : sched == PT_SCHED_ZBH1      ? r->p + 1
		                         : (sched == PT_SCHED_GPIPE ||
		                            (sched == PT_SCHED_MODE && s->mode == PT_MODE_SYNC))
		                             ? r->m
		                             : r->p,
		                     .mode = s->mode,
		                     .schedule = sched,
		                     .n_microbatches = r->m,
		                     .virtual_stages = r->v,
		                     .turn = r->turns[(st - 1) % r->ranks],
		                     .optim = s->optim,
		                     .seed = s->seed,
		                     .weight_stashing = s->weight_stashing,
		                     .recompute = s->recompute,
		                     .threads = r->tps,
		                     .use_graphs = s->use_graphs,
		                     .precision = pt_job_spec_precision(s),
		                     .device = devs[st]};
		configs[st - 1] = c;
		if (s->n_workers > 0)
			continue;
		PT_TRY(pt_stage_create(&r->stages[st], &c, r->comms[st]));
		PT_TRY(pt_stage_start(r->stages[st]));
		r->started[st] = true;
	}
	PT_TRY(pt_coordinator_create(&r->coord, &pc, r->comms[0]));
	if (s->n_workers > 0)
		return pt_coordinator_configure(r->coord, configs);
	return PT_OK;
}

static void release_states(runner *r)
{
	for (int st = 0; st < r->p; st++)
		pt_tensor_fini(&r->states[st]);
	r->have_states = false;
}

/* pipeline_down takes the stages, the coordinator and the communicators
 * down (the models stay: a restart builds the pipeline again). */
static void pipeline_down(runner *r)
{
	bool stopped = false, lost = pt_job_workers_wait_lost(r->ws, 0, NULL, 0) >= 0;
	pt_job_workers_stop_heartbeats(r->ws);
	release_states(r);
	/* With a worker lost, the others are not asked to STOP over the data
	 * channel (a stage may be blocked on the lost one): ending their
	 * sessions below makes them return at once. */
	if (r->coord != NULL && !lost) {
		if (r->s->mode == PT_MODE_ASYNC) {
			pt_pipe_step_result res;
			pt_coordinator_drain(r->coord, &res);
		}
		stopped = pt_coordinator_stop(r->coord) == PT_OK;
	}
	/* Stages that did not take STOP leave their loops when closed; an
	 * interleaved chunk waiting for its rank's turn, when the turn closes. */
	if (!stopped) {
		for (int i = 0; i <= r->p; i++)
			if (r->comms[i])
				pt_comm_close(r->comms[i]);
		for (int i = 0; i < r->ranks; i++)
			pt_stage_turn_close(r->turns[i]);
	}
	for (int st = 1; st <= r->p; st++) {
		if (r->started[st])
			pt_stage_join(r->stages[st]);
		pt_stage_destroy(r->stages[st]);
		r->stages[st] = NULL;
		r->started[st] = false;
	}
	pt_coordinator_destroy(r->coord);
	r->coord = NULL;
	if (r->ws != NULL)
		r->comms[0] = NULL; /* the workers' communicator */
	pt_job_workers_end(r->ws);
	r->ws = NULL;
	for (int i = 0; i <= r->p; i++) {
		pt_comm_destroy(r->comms[i]);
		r->comms[i] = NULL;
	}
	pt_local_group_destroy(r->g);
	r->g = NULL;
	for (int i = 0; i < r->ranks; i++) {
		pt_stage_turn_destroy(r->turns[i]);
		r->turns[i] = NULL;
	}
}

static void models_down(runner *r)
{
	pt_loss_destroy(r->loss);
	pt_model_destroy(r->full);
}

/* gather fetches every stage's state and, for an evaluation (weights), copies
 * the parameters into the full model's arena (stage arenas concatenated); a
 * checkpoint reads them from the states. */
static pt_err gather(runner *r, bool weights)
{
	pt_tensor *P = pt_model_params(r->full);
	float *dst;
	int64_t off = 0;
	if (r->s->mode == PT_MODE_ASYNC) {
		pt_pipe_step_result res;
		PT_TRY(pt_coordinator_drain(r->coord, &res));
	}
	for (int st = 0; st < r->p; st++) {
		PT_TRY(
		    pt_coordinator_get_state(r->coord, st + 1, &r->states[st], &r->opt_steps[st]));
		r->have_states = true;
		if (r->states[st].dtype != PT_F32 || r->states[st].ndim != 1 ||
		    r->states[st].shape[0] < r->nparams[st])
			return pt_set_error(
			    PT_ERR_SHAPE, "stage %d sent a state of %ld values for %ld parameters",
			    st, (long)pt_tensor_numel(&r->states[st]), (long)r->nparams[st]);
		PT_TRY(pt_tensor_sync(&r->states[st]));
	}
	if (!weights)
		return PT_OK;
	PT_TRY(pt_data_write_begin(P, "full model parameters"));
	pt_storage_prefault(P->storage); /* the first gather's pages, from every core */
	dst = pt_tensor_f32(P);
	for (int st = 0; st < r->p; st++) {
		memcpy(dst + off, pt_tensor_f32(&r->states[st]),
		       sizeof(float) * (size_t)r->nparams[st]);
		off += r->nparams[st];
	}
	pt_data_write_end(P);
	return PT_OK;
}

/* ---------------------------------------------------------- checkpoints -- */

static int cmp_desc(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* prune deletes all but the newest `keep` step-N.safetensors pairs in dir
 * (names as the writer spells them: "step-05" is no step), and any .state
 * left without its weights. */
static void prune(const char *dir, int keep)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int64_t *steps = NULL;
	size_t n = 0, cap = 0;
	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long long v;
		if (strncmp(e->d_name, "step-", 5) != 0 || e->d_name[5] < '0' || e->d_name[5] > '9')
			continue;
		errno = 0;
		v = strtoll(e->d_name + 5, &end, 10);
		if (errno != 0 || strcmp(end, ".safetensors") != 0 ||
		    (e->d_name[5] == '0' && end != e->d_name + 6))
			continue;
		if (n == cap) {
			int64_t *grown = realloc(steps, sizeof(int64_t) * (cap ? 2 * cap : 16));
			if (grown == NULL)
				break;
			steps = grown;
			cap = cap ? 2 * cap : 16;
		}
		steps[n++] = v;
	}
	closedir(d);
	qsort(steps, n, sizeof(int64_t), cmp_desc);
	for (size_t i = (size_t)keep; i < n; i++) {
		char path[4200];
		snprintf(path, sizeof(path), "%s/step-%" PRId64 ".safetensors.state", dir,
		         steps[i]);
		unlink(path);
		path[strlen(path) - 6] = 0; /* drop ".state" */
		unlink(path);
	}
	free(steps);
	pt_checkpoint_remove_orphans(dir);
}

/* A checkpoint's snapshot: the gathered stage states (moved out of the
 * runner, so training goes on without a copy), the full model's weights as
 * views into them, and the metadata, all owned by the writer until written. */
typedef struct snapshot {
	int64_t step;
	int p, keep;
	char dir[4096], path[4096];
	char names[PT_MAX_STAGES][32], stepbuf[32], stages[16];
	char opt[PT_MAX_STAGES * 21 + 1], bounds[(PT_MAX_STAGES + 1) * 12 + 1];
	pt_checkpoint_info info;
	pt_tensor states[PT_MAX_STAGES];
	pt_tensor *views;  /* n_weights views into states */
	pt_st_tensor *wts; /* names borrowed from the runner's full model */
	size_t n_weights;
	const pt_job_hooks *h;
	char sha256[65]; /* the weights file's, hashed as written */
	uint64_t size;
	pt_err rv;      /* the write's result */
	char err[1024]; /* its error message (errors are per thread) */
} snapshot;

static void snapshot_free(snapshot *sn)
{
	if (sn == NULL)
		return;
	for (size_t i = 0; sn->views && i < sn->n_weights; i++)
		pt_tensor_fini(&sn->views[i]);
	for (int st = 0; st < sn->p; st++)
		pt_tensor_fini(&sn->states[st]);
	free(sn->views);
	free(sn->wts);
	free(sn);
}

/* snapshot_write writes step-N: the .state companion first, then the
 * weights, so a weights file always has its state next to it (writer). */
static pt_err snapshot_write(snapshot *sn)
{
	pt_st_tensor t[PT_MAX_STAGES];
	pt_st_meta meta[] = {
	    {"format", "pipetrain"},      {"schema_version", PT_CHECKPOINT_SCHEMA_VERSION},
	    {"job", sn->info.job},        {"step", sn->stepbuf},
	    {"optimizer_steps", sn->opt}, {"stages", sn->stages},
	    {"boundaries", sn->bounds}};
	if (mkdir(sn->dir, 0755) != 0 && errno != EEXIST)
		return pt_set_error(PT_ERR_IO, "checkpoint directory '%s': %s", sn->dir,
		                    strerror(errno));
	for (int st = 0; st < sn->p; st++)
		t[st] = (pt_st_tensor){sn->names[st], &sn->states[st]};
	PT_TRY(pt_checkpoint_save_pair(sn->path, sn->wts, sn->n_weights, &sn->info, t,
	                               (size_t)sn->p, meta, sizeof(meta) / sizeof(meta[0]),
	                               sn->sha256, &sn->size));
	prune(sn->dir, sn->keep);
	if (sn->h && sn->h->on_checkpoint)
		sn->h->on_checkpoint(sn->h->ctx, sn->step, sn->path, sn->sha256, sn->size);
	return PT_OK;
}

static void *writer_main(void *arg)
{
	runner *r = arg;
	pthread_setname_np(pthread_self(), "pt-ckpt-writer");
	/* The write yields to training: at normal priority its hashing and the
	 * kernel's copies into the page cache take a core from a stage's OpenMP
	 * team, and the whole team waits at every barrier. Nice 10 (a tenth of
	 * a normal thread's share), not SCHED_IDLE: an idle-class thread may
	 * wait without bound on a busy machine, and the runner joins it at
	 * teardown. A checkpoint due while the last is still written waits for
	 * it. Best effort. */
	(void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	pthread_mutex_lock(&r->wmu);
	for (;;) {
		while (!r->writer_quit && (r->wjob == NULL || !r->wbusy))
			pthread_cond_wait(&r->wcv, &r->wmu);
		if (r->wjob == NULL || !r->wbusy)
			break; /* quit with nothing queued */
		snapshot *sn = r->wjob;
		pthread_mutex_unlock(&r->wmu);
		sn->rv = snapshot_write(sn);
		if (sn->rv != PT_OK)
			snprintf(sn->err, sizeof(sn->err), "%s", pt_last_error());
		pthread_mutex_lock(&r->wmu);
		r->wbusy = false;
		pthread_cond_broadcast(&r->wcv);
	}
	pthread_mutex_unlock(&r->wmu);
	return NULL;
}

/* ckpt_wait waits for the checkpoint being written, if any: on success it
 * becomes the newest (last_ckpt, ckpt_path); a failed write's error is
 * returned (and set) here. */
static pt_err ckpt_wait(runner *r)
{
	snapshot *sn;
	pt_err rv = PT_OK;
	if (!r->writer_up)
		return PT_OK;
	pthread_mutex_lock(&r->wmu);
	while (r->wbusy)
		pthread_cond_wait(&r->wcv, &r->wmu);
	sn = r->wjob;
	r->wjob = NULL;
	pthread_mutex_unlock(&r->wmu);
	if (sn == NULL)
		return PT_OK;
	if (sn->rv == PT_OK) {
		r->last_ckpt = sn->step;
		snprintf(r->ckpt_path, sizeof(r->ckpt_path), "%s", sn->path);
	} else {
		rv = pt_set_error(sn->rv, "%s", sn->err);
	}
	snapshot_free(sn);
	return rv;
}

/* ckpt_poll is ckpt_wait when the write has ended, else nothing: a failed
 * write ends the run at the next step rather than at the next checkpoint. */
static pt_err ckpt_poll(runner *r)
{
	bool ended;
	if (!r->writer_up)
		return PT_OK;
	pthread_mutex_lock(&r->wmu);
	ended = r->wjob != NULL && !r->wbusy;
	pthread_mutex_unlock(&r->wmu);
	return ended ? ckpt_wait(r) : PT_OK;
}

/* writer_down waits for the last write and stops the writer thread. */
static pt_err writer_down(runner *r)
{
	pt_err rv = ckpt_wait(r);
	if (r->writer_up) {
		pthread_mutex_lock(&r->wmu);
		r->writer_quit = true;
		pthread_cond_broadcast(&r->wcv);
		pthread_mutex_unlock(&r->wmu);
		pthread_join(r->writer, NULL);
		pthread_cond_destroy(&r->wcv);
		pthread_mutex_destroy(&r->wmu);
		r->writer_up = false;
	}
	return rv;
}

/* checkpoint hands the gathered state to the writer as step-N's snapshot,
 * after the previous checkpoint is written (its failure fails this one).
 * The stall is the wait for the previous write and building views. */
static pt_err checkpoint(runner *r, int64_t step)
{
	const pt_job_spec *s = r->s;
	const pt_tensor *P = pt_model_params(r->full);
	int64_t cum[PT_MAX_STAGES + 1];
	size_t o1 = 0, o2 = 0;
	snapshot *sn;
	pt_err rv = PT_OK;

	PT_TRY(ckpt_wait(r));
	if ((sn = calloc(1, sizeof(*sn))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "checkpoint snapshot");
	sn->step = step;
	sn->p = r->p;
	sn->keep = s->checkpoint_keep;
	sn->h = r->h;
	snprintf(sn->dir, sizeof(sn->dir), "%s", r->ckdir);
	snprintf(sn->path, sizeof(sn->path), "%s/step-%" PRId64 ".safetensors", r->ckdir, step);
	sn->info.step = step;
	snprintf(sn->info.job, sizeof(sn->info.job), "%s", s->name ? s->name : "");
	snprintf(sn->stepbuf, sizeof(sn->stepbuf), "%" PRId64, step);
	snprintf(sn->stages, sizeof(sn->stages), "%d", r->p);
	cum[0] = 0;
	for (int st = 0; st < r->p; st++) {
		snprintf(sn->names[st], sizeof(sn->names[st]), "stage%d.state", st);
		o1 += (size_t)snprintf(sn->opt + o1, sizeof(sn->opt) - o1, "%s%" PRId64,
		                       st ? "," : "", r->opt_steps[st]);
		sn->states[st] = r->states[st]; /* moved: the next gather makes new ones */
		memset(&r->states[st], 0, sizeof(r->states[st]));
		cum[st + 1] = cum[st] + r->nparams[st];
	}
	for (int st = 0; st <= r->p; st++)
		o2 += (size_t)snprintf(sn->bounds + o2, sizeof(sn->bounds) - o2, "%s%d",
		                       st ? "," : "", r->first[st]);
	/* The weights: each full-model tensor is a slice of one stage's
	 * parameters, which lead that stage's state. */
	sn->n_weights = (size_t)pt_model_num_tensors(r->full);
	sn->views = calloc(sn->n_weights + 1, sizeof(*sn->views));
	sn->wts = calloc(sn->n_weights + 1, sizeof(*sn->wts));
	if (sn->views == NULL || sn->wts == NULL)
		rv = pt_set_error(PT_ERR_NOMEM, "checkpoint snapshot");
	for (size_t i = 0; rv == PT_OK && i < sn->n_weights; i++) {
		const char *name;
		pt_tensor *w;
		int st = 0;
		pt_model_tensor(r->full, (int)i, &name, &w, NULL);
		int64_t off = w->offset - P->offset, n = pt_tensor_numel(w);
		while (st + 1 < r->p && off >= cum[st + 1])
			st++;
		if (!pt_tensor_is_contiguous(w) || off < cum[st] || off + n > cum[st + 1]) {
			rv = pt_set_error(PT_ERR_INVALID, "checkpoint: weight %s spans stages",
			                  name);
			break;
		}
		rv = pt_tensor_init_on(&sn->views[i], sn->states[st].storage,
		                       (size_t)(sn->states[st].offset + off - cum[st]) *
		                           sizeof(float),
		                       PT_F32, w->ndim, w->shape);
		sn->wts[i] = (pt_st_tensor){name, &sn->views[i]};
	}
	if (rv == PT_OK && !r->writer_up) {
		pthread_mutex_init(&r->wmu, NULL);
		pthread_cond_init(&r->wcv, NULL);
		r->writer_quit = false;
		if (pthread_create(&r->writer, NULL, writer_main, r) != 0) {
			pthread_cond_destroy(&r->wcv);
			pthread_mutex_destroy(&r->wmu);
			rv = pt_set_error(PT_ERR_NOMEM, "checkpoint writer thread");
		} else {
			r->writer_up = true;
		}
	}
	if (rv != PT_OK) {
		snapshot_free(sn);
		return rv;
	}
	pthread_mutex_lock(&r->wmu);
	r->wjob = sn;
	r->wbusy = true;
	pthread_cond_broadcast(&r->wcv);
	pthread_mutex_unlock(&r->wmu);
	return PT_OK;
}

/* resume loads every stage's state from PATH.state; *step gets its step. */
static pt_err resume(runner *r, const char *path, int64_t *step)
{
	char spath[4200], bounds[(PT_MAX_STAGES + 1) * 12 + 1], *end;
	const char *v;
	pt_safetensors *st;
	int64_t opt[PT_MAX_STAGES];
	size_t o = 0;
	pt_err rv = PT_OK;

	snprintf(spath, sizeof(spath), "%s.state", path);
	if ((rv = pt_safetensors_open(&st, spath)) != PT_OK)
		return pt_set_error(rv, "resume_from: %s", pt_last_error());
	for (int i = 0; i <= r->p; i++)
		o += (size_t)snprintf(bounds + o, sizeof(bounds) - o, "%s%d", i ? "," : "",
		                      r->first[i]);
	v = pt_safetensors_meta(st, "step");
	errno = 0;
	*step = v ? strtoll(v, &end, 10) : -1;
	if (v == NULL || *end != 0 || errno != 0 || *step < 0) {
		rv = pt_set_error(PT_ERR_FORMAT, "resume_from: '%s' has no valid \"step\"", spath);
		goto out;
	}
	v = pt_safetensors_meta(st, "boundaries");
	if (v == NULL || strcmp(v, bounds) != 0) {
		rv = pt_set_error(PT_ERR_INVALID,
		                  "resume_from: '%s' was written for stage boundaries %s; this run "
		                  "uses %s",
		                  spath, v ? v : "(none)", bounds);
		goto out;
	}
	v = pt_safetensors_meta(st, "optimizer_steps");
	for (int i = 0; i < r->p; i++) {
		errno = 0;
		opt[i] = v ? strtoll(v, &end, 10) : -1;
		if (v == NULL || errno != 0 || opt[i] < 0 || (*end != ',' && *end != 0) ||
		    (*end == 0 && i != r->p - 1)) {
			rv = pt_set_error(
			    PT_ERR_FORMAT,
			    "resume_from: '%s' has no valid \"optimizer_steps\" for %d "
			    "stages",
			    spath, r->p);
			goto out;
		}
		v = *end ? end + 1 : end;
	}
	for (int i = 0; i < r->p && rv == PT_OK; i++) {
		char name[32];
		pt_tensor t;
		snprintf(name, sizeof(name), "stage%d.state", i);
		if ((rv = pt_safetensors_get(st, name, &t)) != PT_OK) {
			pt_set_error(rv, "resume_from: %s", pt_last_error());
			break;
		}
		if ((rv = pt_coordinator_set_state(r->coord, i + 1, &t, opt[i])) != PT_OK)
			pt_set_error(rv, "resume_from: stage %d: %s", i, pt_last_error());
		pt_tensor_fini(&t);
	}
out:
	pt_safetensors_destroy(st);
	return rv;
}

/* init_weights starts every stage from spec->init_from: the file's weights
 * (through the full model, whose arena is the stages' arenas concatenated)
 * with the stage's own fresh optimizer state and step count 0. */
static pt_err init_weights(runner *r)
{
	const float *src;
	int64_t off = 0;

	PT_TRY(pt_job_init_from_load(r->s, r->root, r->any_path, r->full));
	src = pt_tensor_f32(pt_model_params(r->full));
	for (int st = 0; st < r->p; st++) {
		pt_tensor t = {0};
		int64_t steps;
		pt_err rv;
		if ((rv = pt_coordinator_get_state(r->coord, st + 1, &t, &steps)) == PT_OK &&
		    (rv = pt_tensor_sync(&t)) == PT_OK) {
			if (t.dtype != PT_F32 || t.ndim != 1 || t.shape[0] < r->nparams[st])
				rv = pt_set_error(PT_ERR_SHAPE,
				                  "stage %d sent a state of %ld values for %ld "
				                  "parameters",
				                  st, (long)pt_tensor_numel(&t),
				                  (long)r->nparams[st]);
			else if ((rv = pt_data_write_begin(&t, "init_from state")) == PT_OK) {
				memcpy(pt_tensor_f32(&t), src + off,
				       sizeof(float) * (size_t)r->nparams[st]);
				pt_data_write_end(&t);
				rv = pt_coordinator_set_state(r->coord, st + 1, &t, 0);
			}
		}
		pt_tensor_fini(&t);
		if (rv != PT_OK) {
			char why[600];
			snprintf(why, sizeof(why), "%s", pt_last_error());
			return pt_set_error(rv, "init_from: stage %d: %s", st, why);
		}
		off += r->nparams[st];
	}
	return PT_OK;
}

/* ---------------------------------------------------------------- run -- */

/* eval_batch fills ex, ey with evaluation microbatch k: rows [0, *rows) are
 * real, the rest padding (inputs 0; targets ignore_index, or for MSE left
 * out of the loss). */
static pt_err eval_batch(runner *r, int64_t k, int64_t *rows)
{
	int64_t first = k * r->B, n = r->n_eval - first < r->B ? r->n_eval - first : r->B;

	*rows = n;
	if (r->s->data.format != PT_DATA_NPY)
		return pt_tokens_windows(r->etk, r->eval_lo, first, n, r->s->ignore_index, &r->ex,
		                         &r->ey);
	size_t xr = pt_tensor_nbytes(&r->ex) / (size_t)r->B;
	size_t yr = pt_tensor_nbytes(&r->ey) / (size_t)r->B;
	PT_TRY(pt_data_write_begin(&r->ex, "evaluation x"));
	PT_TRY(pt_data_write_begin(&r->ey, "evaluation y"));
	memcpy(pt_tensor_data(&r->ex), (char *)pt_tensor_data(&r->held.x) + (size_t)first * xr,
	       (size_t)n * xr);
	memcpy(pt_tensor_data(&r->ey), (char *)pt_tensor_data(&r->held.y) + (size_t)first * yr,
	       (size_t)n * yr);
	memset((char *)pt_tensor_data(&r->ex) + (size_t)n * xr, 0, (size_t)(r->B - n) * xr);
	if (r->ey.dtype == PT_I64)
		for (int64_t i = n; i < r->B; i++)
			((int64_t *)pt_tensor_data(&r->ey))[i] = r->s->ignore_index;
	else
		memset((char *)pt_tensor_data(&r->ey) + (size_t)n * yr, 0, (size_t)(r->B - n) * yr);
	pt_data_write_end(&r->ex);
	pt_data_write_end(&r->ey);
	return PT_OK;
}

/* evaluate runs the full model over the whole evaluation set, a microbatch
 * at a time: eval_loss is the mean loss over all of its counted targets
 * (CrossEntropy) or elements (MSE), eval_accuracy the fraction of its rows
 * (tokens: positions) whose first largest logit is the target. */
static pt_err evaluate(runner *r, pt_job_metric *m)
{
	pt_act_shape os = pt_model_output_shape(r->full);
	int64_t V = os.features, per_row = os.seq ? os.seq : 1, counted = 0, correct = 0,
	        rows_seen = 0;
	int64_t n_batches = (r->n_eval + r->B - 1) / r->B;
	double loss_sum = 0.0;
	float *pred_host = NULL;
	int64_t *tg_host = NULL;
	pt_err rv = PT_OK;

	if (r->s->loss == PT_LOSS_CROSS_ENTROPY) {
		pred_host = malloc(sizeof(float) * (size_t)(r->B * per_row * V));
		tg_host = malloc(sizeof(int64_t) * (size_t)(r->B * per_row));
		if (pred_host == NULL || tg_host == NULL)
			rv = pt_set_error(PT_ERR_NOMEM, "evaluation buffers");
	}
	for (int64_t k = 0; k < n_batches && rv == PT_OK; k++) {
		const pt_tensor *pred;
		pt_tensor pv = {0}, yv = {0};
		int64_t rows, cnt = 0;
		double l = 0.0;
		if ((rv = eval_batch(r, k, &rows)) != PT_OK ||
		    (rv = pt_model_forward(r->full, 0, &r->ex, &pred, false, 0, 0)) != PT_OK)
			break;
		if (r->s->loss == PT_LOSS_MSE) {
			/* Only the real rows: MSE has no ignore index to pad with. */
			if ((rv = pt_tensor_narrow(&pv, pred, 0, 0, rows)) == PT_OK &&
			    (rv = pt_tensor_narrow(&yv, &r->ey, 0, 0, rows)) == PT_OK)
				rv = pt_loss_compute_loss(r->loss, &pv, &yv, &l, &cnt);
			pt_tensor_fini(&pv);
			pt_tensor_fini(&yv);
			loss_sum += l * (double)cnt;
			counted += cnt;
			continue;
		}
		if ((rv = pt_loss_compute_loss(r->loss, pred, &r->ey, &l, &cnt)) != PT_OK ||
		    (rv = pt_tensor_read(pred, pred_host,
		                         sizeof(float) * (size_t)(r->B * per_row * V))) != PT_OK ||
		    (rv = pt_tensor_read(&r->ey, tg_host,
		                         sizeof(int64_t) * (size_t)(r->B * per_row))) != PT_OK)
			break;
		loss_sum += l * (double)cnt;
		counted += cnt;
		for (int64_t i = 0; i < rows * per_row; i++) {
			const float *p = pred_host + i * V;
			int64_t best = 0;
			for (int64_t j = 1; j < V; j++)
				best = p[j] > p[best] ? j : best;
			correct += best == tg_host[i];
		}
		rows_seen += rows * per_row;
	}
	free(pred_host);
	free(tg_host);
	PT_TRY(rv);
	m->eval_loss = counted ? loss_sum / (double)counted : 0.0;
	m->eval_accuracy = r->s->loss == PT_LOSS_CROSS_ENTROPY
	                       ? (rows_seen ? (double)correct / (double)rows_seen : 0.0)
	                       : NAN;
	return PT_OK;
}

static double unix_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pt_err train(runner *r, int64_t start, int64_t *done)
{
	const pt_job_spec *s = r->s;
	int64_t step;
	int64_t tokens = s->batch_size * (s->data.format == PT_DATA_NPY ? 0 : s->data.seq_len);

	*done = start;
	for (step = start + 1; step <= s->steps; step++) {
		pt_pipe_step_result res;
		pt_job_metric m = {.step = step, .eval_loss = NAN, .eval_accuracy = NAN};
		bool eval_due, ck_due;
		double t0, dt;

		if (r->h && r->h->should_stop && r->h->should_stop(r->h->ctx))
			break;
		PT_TRY(load_batch(r, step - 1));
		t0 = pt_now();
		PT_TRY(pt_coordinator_step(r->coord, &r->x, &r->y, step - 1, &res));
		dt = pt_now() - t0;
		*done = step;

		m.loss = res.loss;
		m.lr = res.lr;
		m.grad_norm = res.grad_norm;
		m.samples_per_s = dt > 0 ? (double)s->batch_size / dt : 0.0;
		m.tokens_per_s = dt > 0 ? (double)tokens / dt : 0.0;
		m.bubble = res.bubble;
		m.n_stages = r->p;
		for (int st = 0; st < r->p; st++) {
			m.stage_busy[st] = res.stage_busy[st];
			m.tasks[st] =
			    s->mode == PT_MODE_ASYNC
			        ? NULL
			        : pt_coordinator_step_timeline(r->coord, st + 1, &m.n_tasks[st]);
			if (m.tasks[st] == NULL)
				m.n_tasks[st] = 0;
		}
		/* Rank i's counters: read directly when its communicator is in
		 * this process (so they include the step's last replies, as
		 * before), else - a stage on a worker - as the stage sent them
		 * with its timeline (without that reply). Rows stay a prefix
		 * by rank: an async step brings no stage counters, and then
		 * only the coordinator's row is filled. */
		for (int i = 0; i <= r->p; i++) {
			if (r->comms[i] != NULL)
				m.comm[i] = pt_comm_get_stats(r->comms[i]);
			else if (i > 0 && res.has_stage_comm[i - 1])
				m.comm[i] = res.stage_comm[i - 1];
			else
				break;
			m.n_comm = i + 1;
		}
		eval_due = r->have_eval &&
		           ((s->eval_every > 0 && step % s->eval_every == 0) || step == s->steps);
		ck_due = r->ckdir != NULL &&
		         ((s->checkpoint_every > 0 && step % s->checkpoint_every == 0) ||
		          step == s->steps);
		/* One gathered state at a time (the memory estimate counts one): a
		 * gather waits for the write of the last checkpoint's. */
		if (eval_due || ck_due) {
			pt_err w = ckpt_wait(r);
			if (w != PT_OK) {
				/* The last checkpoint's write failed: this step is done
				 * all the same, so its metric goes out before the error. */
				char why[1024];
				snprintf(why, sizeof(why), "%s", pt_last_error());
				m.time_unix = unix_now();
				if (r->h && r->h->on_metric)
					r->h->on_metric(r->h->ctx, &m);
				return pt_set_error(w, "%s", why);
			}
			PT_TRY(gather(r, eval_due));
		}
		if (eval_due)
			PT_TRY(evaluate(r, &m));
		m.time_unix = unix_now();
		if (r->h && r->h->on_metric)
			r->h->on_metric(r->h->ctx, &m);
		PT_TRY(ckpt_poll(r));
		if (ck_due)
			PT_TRY(checkpoint(r, step));
		release_states(r);
	}
	/* Stopped early (or nothing left to do): the last step still gets one. */
	PT_TRY(ckpt_wait(r));
	if (r->ckdir != NULL && r->last_ckpt != *done) {
		PT_TRY(gather(r, false));
		PT_TRY(checkpoint(r, *done));
		release_states(r);
	}
	return ckpt_wait(r);
}

/* restart decides, after the run failed with *rv, whether a worker was lost
 * and the run goes on. A lost worker's verdict (the heartbeats' message,
 * waited for when the error looks like a lost peer) replaces the error. With
 * a restart left and a spare for every lost stage the pipeline is taken
 * down, the stages re-placed, *start set to the newest checkpoint's step
 * (0: none) and true returned; else false, with the error set. */
static bool restart(runner *r, pt_err *rv, int64_t *start)
{
	const pt_job_spec *s = r->s;
	bool peer_error = *rv == PT_ERR_CLOSED || *rv == PT_ERR_TIMEOUT || *rv == PT_ERR_IO;
	char why[700], first[1024], moves[PT_MAX_STAGES * 80 + 1], note[2048];
	int lost[PT_MAX_STAGES], n_lost = 0;
	size_t o = 0;

	/* The heartbeats decide within the worker timeout of the last reply. */
	if (r->ws == NULL ||
	    pt_job_workers_wait_lost(r->ws, peer_error ? s->worker_timeout_ms + 500 : 0, why,
	                             sizeof(why)) < 0)
		return false;
	snprintf(first, sizeof(first), "%s", pt_last_error());
	*rv = PT_ERR_TIMEOUT;
	pt_set_error(*rv, "%s (%s)", why, first);
	if (r->restarts >= s->max_restarts)
		return false;
	for (int st = 0; st < r->p; st++) {
		bool seen = false;
		for (int i = 0; i < n_lost; i++)
			seen = seen || lost[i] == st % r->ranks;
		if (!seen && pt_job_workers_is_lost(r->ws, st))
			lost[n_lost++] = st % r->ranks; /* the rank: its worker serves its chunks */
	}
	for (int i = 0; i < n_lost; i++)
		r->bad[r->place[lost[i]]] = true;
	moves[0] = '\0';
	for (int i = 0; i < n_lost; i++) {
		int spare = next_spare(r);
		if (spare < 0) {
			pt_set_error(*rv, "%s; no spare worker left for stage %d (max_restarts %d)",
			             why, lost[i], s->max_restarts);
			return false;
		}
		r->place[lost[i]] = spare;
		o += (size_t)snprintf(moves + o, sizeof(moves) - o, "%sstage %d to %s",
		                      i ? ", " : "", lost[i], s->workers[spare]);
	}
	pipeline_down(r);
	r->restarts++;
	if (ckpt_wait(r) != PT_OK) /* a failed write: resume from the one before */
		pt_warn("job %s: %s", s->name ? s->name : "", pt_last_error());
	*start = r->ckpt_path[0] != '\0' ? r->last_ckpt : 0;
	snprintf(note, sizeof(note), "restart %d of %d after %s: %s; resuming from step %" PRId64,
	         r->restarts, s->max_restarts, why, moves, *start);
	pt_warn("job %s: %s", s->name ? s->name : "", note);
	if (r->h && r->h->on_restart)
		r->h->on_restart(r->h->ctx, r->restarts, *start, note);
	return true;
}

pt_err pt_job_run(const pt_job_spec *spec, const pt_job_run_options *o, const pt_job_hooks *h,
                  int64_t *last_step)
{
	static const pt_job_run_options none = {0};
	runner *r;
	int prev_threads = pt_get_num_threads();
	pt_precision prev_prec = PT_PREC_FP32;
	int64_t start = 0, done = 0;
	char msg[1024];
	pt_err rv;

	if (last_step)
		*last_step = 0;
	if (o == NULL)
		o = &none;
	PT_TRY(pt_job_spec_validate(spec, o->files_root, o->any_path));
	PT_TRY(pt_job_spec_check_workers(spec, o->worker_allow));
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "job runner");
	r->s = spec;
	r->root = o->files_root;
	r->any_path = o->any_path;
	r->ckdir = o->checkpoint_dir;
	r->h = h;
	r->o = o;
	r->ranks = spec->stages;
	r->p = r->ranks; /* resolve_schedule: ranks * v */
	r->m = spec->microbatches;
	r->B = spec->batch_size / spec->microbatches;
	r->threads = o->threads > 0 ? o->threads : pt_num_cores();
	r->tps = spec->threads_per_stage > 0
	             ? spec->threads_per_stage
	             : (r->threads / r->ranks > 1 ? r->threads / r->ranks : 1);
	r->last_ckpt = -1;
	pt_set_num_threads(r->threads); /* this thread evaluates with the whole budget */
	prev_prec = pt_get_precision();
	pt_set_precision(pt_job_spec_precision(spec)); /* evaluation as training computes */

	for (int st = 0; st < r->ranks; st++)
		r->place[st] = st;
	if (o->resume_from != NULL)
		snprintf(r->ckpt_path, sizeof(r->ckpt_path), "%s", o->resume_from);
	if ((rv = data_up(r)) == PT_OK && (rv = resolve_schedule(r)) == PT_OK &&
	    (rv = models_up(r)) == PT_OK) {
		for (;;) {
			if ((rv = pipeline_up(r)) == PT_OK && r->ckpt_path[0] != '\0' &&
			    (rv = resume(r, r->ckpt_path, &start)) == PT_OK)
				r->last_ckpt = start;
			else if (rv == PT_OK && r->ckpt_path[0] == '\0' && spec->init_from != NULL)
				rv = init_weights(r);
			if (rv == PT_OK)
				rv = train(r, start, &done);
			if (rv == PT_OK || !restart(r, &rv, &start))
				break;
		}
	}
	if (rv != PT_OK)
		snprintf(msg, sizeof(msg), "%s", pt_last_error());
	/* The last checkpoint is written before the run returns. */
	if (writer_down(r) != PT_OK && rv == PT_OK) {
		rv = pt_last_code();
		snprintf(msg, sizeof(msg), "%s", pt_last_error());
	}
	pipeline_down(r);
	models_down(r);
	data_down(r);
	free(r);
	/* The job's device memory went back to the pools: give it to the driver,
	 * so the next job's NCCL and cuBLAS workspaces (outside the pools) fit. */
	if (pt_backend_trim_all() != PT_OK) {
		pt_warn("job %s: %s", spec->name ? spec->name : "", pt_last_error());
		pt_clear_error();
	}
	pt_set_num_threads(prev_threads);
	pt_set_precision(prev_prec);
	if (last_step)
		*last_step = done;
	if (rv != PT_OK)
		return pt_set_error(rv, "%s", msg);
	return PT_OK;
}
