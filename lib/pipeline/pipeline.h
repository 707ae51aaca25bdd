/* pipeline.h - pipeline-parallel training over a communicator (seed 003).
 *
 * Ranks: 0 is the coordinator, 1..p the stages. A stage holds layers
 * [first, last) of the model and runs an event loop: it receives messages
 * (its communicator's mailbox is its inbox; an nng I/O thread fills it and
 * wakes the loop), processes one task at a time, preferring backward work,
 * and sends results on: activations to the next stage (or the coordinator
 * from the last stage), gradients to the previous stage (or a DONE to the
 * coordinator from the first stage). Errors go to the coordinator naming the
 * stage, step and microbatch; the stage keeps serving.
 *
 * The coordinator splits each batch into m microbatches, feeds stage 1,
 * computes the loss and its gradient (pt_loss) on the last stage's outputs,
 * sends gradients back and commands the optimizer step:
 *   sync       all forwards, all losses, all backwards, one step (GPipe);
 *   semi-async a microbatch's loss and backward start when its output
 *              arrives, at most p microbatches in flight (1F1B-like), one
 *              step per batch: weights equal sync's bitwise;
 *   async      no flush: each stage updates after every microbatch's
 *              backward; stale gradients accepted; weight stashing keeps a
 *              microbatch's forward and backward on the same weights.
 * Gradients are averaged over microbatches; global-norm clipping sums each
 * stage's per-tensor squared norms in global order.
 */
#ifndef PT_PIPELINE_H
#define PT_PIPELINE_H

#include <pthread.h>

#include "comm.h"
#include "loss.h"
#include "model.h"
#include "optim.h"

#define PT_MAX_STAGES 64

typedef enum pt_pipe_mode { PT_MODE_SYNC, PT_MODE_SEMI_ASYNC, PT_MODE_ASYNC } pt_pipe_mode;

/* pt_pipe_mode_name returns "sync", "semi-async" or "async". */
const char *pt_pipe_mode_name(pt_pipe_mode mode);
pt_err pt_pipe_mode_parse(const char *name, pt_pipe_mode *out);

/* The order of a flushing step's tasks (docs/pipeline.md). PT_SCHED_MODE is
 * the mode's own: GPipe for sync, 1F1B for semi-async, none for async.
 * PT_SCHED_1F1B: stage r (1-based, of p) runs min(p - r + 1, m) forwards,
 * then alternates backward and forward (pt_stage_config.n_microbatches
 * given; without it the stage takes gradients first as they come).
 * PT_SCHED_ZBH1 splits every backward into B (input gradient) and W (weight
 * gradient): stage r (1-based, of p) runs min(p - r + 1, m) forwards, then
 * alternates B and F, runs a W after a B whenever more than r - 1 are
 * pending, and the rest after its last B (Qi et al., ICLR 2024). Every
 * PT_SCHED_INTERLEAVED (Megatron-LM's interleaved 1F1B): the model is cut
 * into p * v stages (pt_stage_config.virtual_stages v); rank r holds stages
 * r, r + p, ..., each a chunk, and runs its chunks' forwards and backwards
 * in the order pt_pipe_interleaved_order gives. Every flushing schedule
 * sums the gradients in microbatch order: their weights are GPipe's bitwise. */
typedef enum pt_pipe_schedule {
	PT_SCHED_MODE,
	PT_SCHED_GPIPE,
	PT_SCHED_1F1B,
	PT_SCHED_ZBH1,
	PT_SCHED_INTERLEAVED,
	PT_SCHED_COUNT
} pt_pipe_schedule;

/* One task of an interleaved rank: forward (backward false) or backward of
 * microbatch mb on the rank's chunk (0-based; logical stage chunk * p + r). */
typedef struct pt_chunk_task {
	int16_t chunk;
	bool backward;
	int32_t mb;
} pt_chunk_task;

/* pt_pipe_interleaved_order writes rank r's (1-based, of p) 2 * m * v tasks
 * of one step into out, Megatron-LM's order: (p - r) * 2 + (v - 1) * p
 * forwards (at most m * v) to warm up, then one forward and one backward in
 * turn, then the last backwards. The k-th forward runs chunk
 * (k mod pv) / p, the k-th backward chunk v - 1 - (k mod pv) / p, both on
 * microbatch (k / pv) * p + k mod p. m must be a multiple of p (p > 1). */
pt_err pt_pipe_interleaved_order(int r, int p, int v, int m, pt_chunk_task *out);

/* pt_pipe_interleaved_peak walks rank r's order: *rank_peak gets the most
 * chunk microbatches it holds between forward and backward at once (each
 * 1/v of a stage's activations), chunk_peak[c] (NULL: not wanted) the most
 * chunk c holds. */
pt_err pt_pipe_interleaved_peak(int r, int p, int v, int m, int *rank_peak, int *chunk_peak);

/* pt_pipe_interleaved_slots is the most microbatches any chunk of any of
 * the p ranks holds: the activation slots each chunk stage needs. */
pt_err pt_pipe_interleaved_slots(int p, int v, int m, int *slots);

/* pt_pipe_schedule_name returns "gpipe", "1f1b", "zb-h1", "interleaved" ("" for PT_SCHED_MODE). */
const char *pt_pipe_schedule_name(pt_pipe_schedule s);
pt_err pt_pipe_schedule_parse(const char *name, pt_pipe_schedule *out);

/* pt_partition splits n layers into p contiguous stages, balancing the
 * estimated FLOPs (pt_layer_flops): first[s] is stage s's first layer and
 * first[p] == n. Every stage gets at least one layer; p > n is an error. */
pt_err pt_partition(const pt_layer_spec *layers, int n, pt_act_shape input, int p, int *first);

/* pt_partition_check validates explicit boundaries (first[0] == 0,
 * strictly increasing, first[p] == n). */
pt_err pt_partition_check(int n, int p, const int *first);

/* What one stage needs to build itself (the same on every rank). */
typedef struct pt_stage_config {
	const pt_layer_spec *layers; /* the whole model */
	int n_layers;
	pt_act_shape input;
	int64_t microbatch; /* samples per microbatch */
	int first, last;    /* this stage's layers */
	int n_slots;        /* activations in flight: m (sync), p (semi-async/async) */
	pt_pipe_mode mode;
	pt_pipe_schedule schedule; /* flushing modes: the order of the step's tasks */
	int n_microbatches;        /* m: PT_SCHED_ZBH1 orders the step's tasks by it */
	/* PT_SCHED_INTERLEAVED: v chunks per rank; this stage (rank L of p * v)
	 * is chunk (L - 1) / p of rank (L - 1) mod p + 1. */
	int virtual_stages;
	/* The rank's turn (local stages only, NULL over a wire): the chunks of
	 * one rank share it and run their tasks one at a time in the rank's
	 * order; without it each chunk keeps only its own order. */
	struct pt_stage_turn *turn;
	pt_optim_config optim;
	uint64_t seed;
	bool weight_stashing; /* async: backward uses the forward's weights */
	bool recompute;       /* keep only the stage input; recompute forward in backward */
	int threads;          /* CPU threads for this stage's kernels (0: 1) */
	bool use_graphs;      /* forward, backward and optimizer step through graphs */
	bool sync_sends;      /* send on the stage thread: no compute/transfer overlap */
	/* bf16: the stage's matrix products take bf16 operands (pt_set_precision
	 * on its thread), and the activations and gradients it sends to other
	 * stages travel as bf16 (half the bytes; widened to f32 on arrival). */
	pt_precision precision;
	/* Where the stage's model lives and computes (zero-initialised: PT_CPU).
	 * On a device, inputs that arrive on the host are copied there, sends to
	 * other stages are device tensors, and whatever goes to the coordinator
	 * (outputs, parameters, state, norms) is host data. */
	pt_device device;
} pt_stage_config;

/* pt_stage_turn_create makes the turn the v chunk stages of rank r (of p)
 * share when they run in one process (pt_stage_config.turn). */
typedef struct pt_stage_turn pt_stage_turn;
pt_err pt_stage_turn_create(pt_stage_turn **out, int r, int p, int v, int m);
void pt_stage_turn_destroy(pt_stage_turn *t);

/* pt_stage_turn_close wakes the chunks waiting for their turn for good
 * (their messages are dropped): call it with their communicators closed,
 * before joining their threads, since a chunk waiting for its turn reads
 * no STOP. Accepts NULL. */
void pt_stage_turn_close(pt_stage_turn *t);

/* One recorded task of a stage. */
/* PT_TASK_BACKWARD is a whole backward, or B (the input gradient) under a
 * split-backward schedule, whose W (weight gradient) is PT_TASK_WEIGHT. */
typedef enum pt_task_kind {
	PT_TASK_FORWARD,
	PT_TASK_BACKWARD,
	PT_TASK_STEP,
	PT_TASK_WEIGHT
} pt_task_kind;

typedef struct pt_task_record {
	uint8_t kind; /* pt_task_kind */
	int32_t microbatch;
	int64_t step;
	double start, end; /* pt_now() seconds on the stage's host */
} pt_task_record;

typedef struct pt_stage_stats {
	int32_t peak_live; /* most activation slots held at once */
	int32_t live;      /* slots held now */
	int64_t forwards, backwards, updates;
	int64_t staleness_sum; /* async: updates between a microbatch's forward and its update */
	int32_t staleness_max;
	double busy; /* seconds spent in tasks */
} pt_stage_stats;

typedef struct pt_stage pt_stage;

/* pt_stage_create builds the stage's model and optimizer on comm (borrowed;
 * its rank is the stage's rank, 1..p). */
pt_err pt_stage_create(pt_stage **out, const pt_stage_config *cfg, pt_comm *comm);
void pt_stage_destroy(pt_stage *s);

/* pt_stage_run runs the event loop until a STOP command or the communicator
 * closes (then it returns PT_OK); blocking. */
pt_err pt_stage_run(pt_stage *s);

/* pt_stage_start runs the loop on a new thread; pt_stage_join waits for it. */
pt_err pt_stage_start(pt_stage *s);
pt_err pt_stage_join(pt_stage *s);

/* pt_stage_host_run serves one stage on comm (a rank of another process or
 * host): it waits for the coordinator's Configure command, builds the stage
 * from the StageConfig, answers Ready, and runs the event loop until STOP.
 * A config that cannot be built is answered with a StageError. */
pt_err pt_stage_host_run(pt_comm *comm, int timeout_ms);

/* Interleaved chunks served in one process (a worker serving several of a
 * job's stages) share their rank's turn through a pt_stage_turn_share: the
 * first chunk configured creates the turn, the others take it (they must be
 * chunks of the same rank, else their configuration is refused), the last
 * to finish destroys it. pt_stage_host_run_shared is pt_stage_host_run
 * taking its turn from share (NULL: none). */
typedef struct pt_stage_turn_share pt_stage_turn_share;
pt_err pt_stage_turn_share_create(pt_stage_turn_share **out);
void pt_stage_turn_share_destroy(pt_stage_turn_share *sh);
pt_err pt_stage_host_run_shared(pt_comm *comm, int timeout_ms, pt_stage_turn_share *sh);

/* pt_stage_turn_share_close closes the share's current turn
 * (pt_stage_turn_close): the process ends its chunks' sessions. */
void pt_stage_turn_share_close(pt_stage_turn_share *sh);

/* Test hook: every forward and backward of s sleeps delay_ms first (a slow
 * stage, for fault-injection tests). */
void pt_stage_set_task_delay(pt_stage *s, int delay_ms);

/* The delay every stage built in this process starts with (pt_stage_host_run
 * and local stages alike; an interleaved chunk gets 1/v of it). */
void pt_stage_host_set_task_delay(int delay_ms);

/* pt_stage_graphs_captured returns how many of s's graphs are captured and
 * replay (0 without use_graphs). Thread-safe. */
int pt_stage_graphs_captured(pt_stage *s);

/* Test hook: the next forward of microbatch `mb` (any step) fails as if an
 * op had failed. -1 disarms. */
void pt_stage_fail_forward_at(pt_stage *s, int mb);

/* The coordinator. */
typedef struct pt_pipeline_config {
	int n_stages;       /* p */
	int n_microbatches; /* m */
	int64_t microbatch; /* samples per microbatch */
	pt_pipe_mode mode;
	pt_pipe_schedule schedule; /* flushing modes: GPipe holds the losses until every
	                            * output is in; the others compute each on arrival */
	pt_loss_kind loss;
	int64_t ignore_index;
	pt_optim_config optim; /* clip_norm and the schedule are applied here */
	pt_act_shape output;   /* the last stage's output shape per sample */
	int virtual_stages;    /* interleaved: n_stages counts p * v stages on p ranks */
	int timeout_ms;        /* any wait for a stage (0: 30 s) */
} pt_pipeline_config;

typedef struct pt_pipe_step_result {
	double loss;      /* mean of the microbatches' mean losses */
	double grad_norm; /* global norm before clipping (sync, semi-async) */
	float lr;
	double seconds; /* wall time of the step at the coordinator */
	double bubble;  /* 1 - stage busy time / (p * time until every gradient is in), timelines */
	double stage_busy[PT_MAX_STAGES]; /* seconds per stage in this step */
	int microbatches_done;            /* async: microbatches completed during this call */
	/* Sync and semi-async: stage s's communicator counters (stage_comm[s - 1])
	 * as the stage reported them with its timeline, after the step's last
	 * message and before that reply; has_stage_comm false in async mode and
	 * for a stage that did not send them. */
	bool has_stage_comm[PT_MAX_STAGES];
	pt_comm_stats stage_comm[PT_MAX_STAGES];
} pt_pipe_step_result;

typedef struct pt_coordinator pt_coordinator;

/* pt_coordinator_create drives stages 1..p over comm (rank 0; borrowed). */
pt_err pt_coordinator_create(pt_coordinator **out, const pt_pipeline_config *cfg, pt_comm *comm);
void pt_coordinator_destroy(pt_coordinator *c);

/* pt_coordinator_step trains on one batch x (m * B, ...) with targets y. In
 * async mode the call returns once this batch's microbatches are fed and at
 * most p are still in flight (no flush); pt_coordinator_drain waits for the
 * rest. A stage error or a lost stage ends the step with that error (within
 * the timeout); the stages are reset so the next step can run. */
pt_err pt_coordinator_step(pt_coordinator *c, const pt_tensor *x, const pt_tensor *y, int64_t step,
                           pt_pipe_step_result *res);
pt_err pt_coordinator_drain(pt_coordinator *c, pt_pipe_step_result *res);

/* pt_coordinator_configure sends configs[s - 1] to each stage s served by
 * pt_stage_host_run and waits until every stage is built (Ready). */
pt_err pt_coordinator_configure(pt_coordinator *c, const pt_stage_config *configs);

/* pt_coordinator_stage_stats asks stage s (1..p) for its counters. */
pt_err pt_coordinator_stage_stats(pt_coordinator *c, int s, pt_stage_stats *out);

/* pt_coordinator_dpred_bytes: the bytes of the loss-gradient buffers the
 * coordinator has made so far - none while every output arrives writable
 * (pt_msg.writable) and its gradient overwrites it. */
size_t pt_coordinator_dpred_bytes(const pt_coordinator *c);

/* pt_coordinator_step_timeline returns stage s's task records of the last
 * sync or semi-async step (fetched by that step); *n gets their count. The
 * pointer is valid until the next step. */
const pt_task_record *pt_coordinator_step_timeline(const pt_coordinator *c, int s, int *n);

/* pt_coordinator_params copies stage s's parameter arena into a new tensor. */
pt_err pt_coordinator_params(pt_coordinator *c, int s, pt_tensor *out);

/* pt_coordinator_get_state copies stage s's training state - parameters,
 * then optimizer state, as one flat f32 tensor - into a new tensor *out and
 * its optimizer step count into *steps. pt_coordinator_set_state loads such
 * a tensor back (sizes must match) and sets the step count. With these the
 * caller assembles and restores checkpoints. */
pt_err pt_coordinator_get_state(pt_coordinator *c, int s, pt_tensor *out, int64_t *steps);
pt_err pt_coordinator_set_state(pt_coordinator *c, int s, const pt_tensor *state, int64_t steps);

/* pt_coordinator_stop tells every stage to leave its loop. */
pt_err pt_coordinator_stop(pt_coordinator *c);

#endif
