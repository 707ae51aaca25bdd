/* stage.c - a pipeline stage: its model slice, optimizer and event loop.
 *
 * The loop takes one message at a time from the communicator (its inbox),
 * preferring backward gradients, then control, then forward activations, so
 * in-flight microbatches finish before new ones start (1F1B). Every data
 * message carries the coordinator's generation in meta.tag; a RESET moves
 * the stage to a new generation and messages of older ones are dropped.
 *
 * Sends: everything the stage sends (activations, gradients, outputs, DONE,
 * replies, errors) goes through one send stream per destination rank (a
 * pt_stream: a FIFO run by its own thread), so the loop computes microbatch
 * k+1 while microbatch k's activation is on the wire. Per destination the
 * order is the loop's order, exactly as with synchronous sends, so a REPLY
 * never overtakes data sent before it to the same rank; across ranks the
 * protocol needs no order (the coordinator's DONE comes from stage 1, which
 * only sends it after the gradients of every later stage reached it). A
 * queued message holds a reference to its tensor, which is never written
 * again until the receiver has answered (forward outputs are reused only
 * after that microbatch's gradient came back; backward and recompute
 * outputs are sent as copies). A send that fails on a send stream is
 * reported to the coordinator naming stage, step and microbatch. The loop
 * drains the streams before it returns. cfg.sync_sends sends on the loop's
 * thread instead.
 *
 * Graphs (cfg.use_graphs): forward and backward of each activation slot and
 * the optimizer update (with zeroing the gradients) run through the graph
 * manager under the names "forward.<slot>", "backward.<slot>" and
 * "optimizer": warm-up, capture, replay (graph.h). Inputs are copied into
 * fixed per-slot buffers first, so a slot is the same computation on the
 * same buffers every time; the optimizer's lr, grad scale and step come from
 * its run-time scalars. A forward armed to fail (test hook) runs eagerly.
 *
 * Device (cfg.device, e.g. cuda:0): the model, its optimizer state and the
 * weight stashes live in that device's memory and every op runs there. An
 * input or gradient that arrives elsewhere (the coordinator's host tensors,
 * or a host copy off the control path) is copied to the device first; what
 * goes to other stages stays on the device when the communicator carries
 * device tensors (NCCL moves it), else it is sent as a host copy (the local
 * and nng communicators take CPU tensors only); what goes to the coordinator
 * - outputs, parameters, state, squared norms - is copied to the host here,
 * so rank 0 only ever sees host data. Copies
 * across devices go through pt_tensor_transfer (the backend registry). Graphs
 * are CPU-only: lib/exec's graph manager captures the dispatcher's CPU
 * kernel tape and has no CUDA graph path (no cudaGraph capture exists in
 * lib/exec), so a stage on a device ignores use_graphs and runs eagerly.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "dispatch.h"
#include "graph.h"
#include "log.h"
#include "ops.h"
#include "runtime.h"
#include "wire.h"

typedef struct slot {
	bool used;
	int32_t mb;
	int64_t step;
	int64_t version; /* optimizer updates applied when the forward ran (async) */
	pt_tensor x;     /* the stage input (kept for backward / recomputation) */
	pt_tensor stash; /* async weight stashing: parameters used by the forward */
	pt_tensor gx;    /* graphs: fixed input buffer the input is copied into */
	pt_tensor gdy;   /* graphs: fixed buffer for the output gradient */
	/* What this slot's forward and backward produced (model buffers, the
	 * same on every replay; set by the eager runs). */
	const pt_tensor *y, *dx;
} slot;

struct pt_stage {
	pt_stage_config cfg;
	pt_comm *comm;
	int rank, p;
	pt_model *model;
	pt_optimizer *opt;
	int n_slots;
	slot *slots;
	pt_tensor current; /* async stashing: the live weights during a stashed backward */
	/* The last GET_STATE's buffer, filled again by the next one when nobody
	 * else holds it any more (a checkpoint written, its snapshot freed), so
	 * a steady run's checkpoints map and fault no new memory. */
	pt_tensor state_buf;
	uint32_t generation;
	int64_t updates;
	pt_task_record *tasks;
	int n_tasks, cap_tasks;
	pt_stage_stats stats;
	double *sqnorms;
	int fail_mb;
	int delay_ms;
	pthread_t thread;
	bool started;
	pt_err result;
	pt_stream **tx; /* [world]: send stream per destination, NULL: send inline */
	pt_graph_manager *graphs;
	/* the graph functions' arguments */
	int g_slot;
	const pt_tensor *g_dy;
	/* Split-backward schedule (PT_SCHED_ZBH1): the step's progress. */
	/* Ordered schedules (1F1B, ZB-H1): the step's task order is fixed. */
	bool ordered, zb;
	int zb_warm, zb_defer; /* forwards before the first B; W's held back */
	int zb_f, zb_b;        /* forwards and B's run in this step */
	int *zb_w, zb_nw;      /* slots whose W is pending, oldest first */
	/* Interleaved (PT_SCHED_INTERLEAVED): this chunk's share of its rank's
	 * order (true: a backward), the next of them, the rank's turn. */
	bool il;
	int chunk;
	bool *il_order;
	int32_t *il_mb; /* the microbatch of each of them */
	int il_n, il_pos;
	pt_stage_turn *turn;
};

/* The chunks of one interleaved rank in one process take turns: a chunk's
 * task waits until the rank's order reaches it. A RESET starts the order
 * again; a task of an older generation neither waits nor advances it. */
struct pt_stage_turn {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pt_chunk_task *order;
	int n, pos;
	uint32_t generation;
	bool closed; /* a chunk left its loop: the others wait no more */
};

pt_err pt_stage_turn_create(pt_stage_turn **out, int r, int p, int v, int m)
{
	pt_stage_turn *t = calloc(1, sizeof(*t));
	pt_err rv;

	*out = NULL;
	if (t == NULL || (t->order = calloc((size_t)(2 * m * v), sizeof(pt_chunk_task))) == NULL) {
		free(t);
		return pt_set_error(PT_ERR_NOMEM, "stage turn");
	}
	if ((rv = pt_pipe_interleaved_order(r, p, v, m, t->order)) != PT_OK) {
		free(t->order);
		free(t);
		return rv;
	}
	t->n = 2 * m * v;
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	*out = t;
	return PT_OK;
}

void pt_stage_turn_destroy(pt_stage_turn *t)
{
	if (t == NULL)
		return;
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	free(t->order);
	free(t);
}

/* turn_wait blocks until the rank's next task is this chunk's (backward,
 * mb); false when a RESET made the message's generation an old one. */
static bool turn_wait(pt_stage *s, bool backward, int32_t mb, uint32_t tag)
{
	pt_stage_turn *t = s->turn;
	bool ok;

	pthread_mutex_lock(&t->mu);
	while (t->generation == tag && !t->closed &&
	       !(t->order[t->pos].chunk == s->chunk && t->order[t->pos].backward == backward &&
	         t->order[t->pos].mb == mb))
		pthread_cond_wait(&t->cv, &t->mu);
	ok = t->generation == tag && !t->closed;
	pthread_mutex_unlock(&t->mu);
	return ok;
}

static void turn_done(pt_stage *s, uint32_t tag)
{
	pt_stage_turn *t = s->turn;
	pthread_mutex_lock(&t->mu);
	if (t->generation == tag)
		t->pos = (t->pos + 1) % t->n;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

void pt_stage_turn_close(pt_stage_turn *t)
{
	if (t == NULL)
		return;
	pthread_mutex_lock(&t->mu);
	t->closed = true;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

/* turn_close: this chunk left its loop (STOP, or its communicator
 * closed); a sibling waiting for a task of it would wait for good. */
static void turn_close(pt_stage *s)
{
	pt_stage_turn_close(s->turn);
}

static void turn_reset(pt_stage *s, uint32_t generation)
{
	pt_stage_turn *t = s->turn;
	pthread_mutex_lock(&t->mu);
	if (t->generation != generation) {
		t->generation = generation;
		t->pos = 0;
	}
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

/* pt_stage_host_set_task_delay's delay: every stage built in this process
 * starts with it (tests and benchmarks). */
static int host_delay_ms;

/* One queued send: the message (owning its tensor reference) and its stage. */
typedef struct tx_item {
	pt_stage *s;
	int dst;
	bool ran; /* false: cancelled by the stream's destroy */
	pt_msg m;
} tx_item;

/* interleaved_up finds this stage's chunk and rank and keeps its share of
 * the rank's order. */
static pt_err interleaved_up(pt_stage *s)
{
	const pt_stage_config *cfg = &s->cfg;
	int v = cfg->virtual_stages, m = cfg->n_microbatches, p, r;
	pt_chunk_task *order;
	pt_err rv;

	if (cfg->mode == PT_MODE_ASYNC || v < 1 || m < 1 || s->p % v != 0)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "schedule interleaved needs a flushing mode, the microbatch count "
		    "and virtual_stages dividing the %d stages",
		    s->p);
	p = s->p / v;
	r = (s->rank - 1) % p + 1;
	s->chunk = (s->rank - 1) / p;
	if ((order = calloc((size_t)(2 * m * v), sizeof(*order))) == NULL ||
	    (s->il_order = calloc((size_t)(2 * m), sizeof(bool))) == NULL ||
	    (s->il_mb = calloc((size_t)(2 * m), sizeof(int32_t))) == NULL) {
		free(order);
		return pt_set_error(PT_ERR_NOMEM, "stage order");
	}
	if ((rv = pt_pipe_interleaved_order(r, p, v, m, order)) == PT_OK)
		for (int k = 0; k < 2 * m * v; k++)
			if (order[k].chunk == s->chunk) {
				s->il_mb[s->il_n] = order[k].mb;
				s->il_order[s->il_n++] = order[k].backward;
			}
	free(order);
	s->turn = cfg->turn;
	return rv;
}

pt_err pt_stage_create(pt_stage **out, const pt_stage_config *cfg, pt_comm *comm)
{
	pt_stage *s;
	pt_model_config mc;
	pt_err rv;
	int64_t np;
	int model_slots = cfg->recompute ? 1 : cfg->n_slots;

	*out = NULL;
	if (cfg->n_slots < 1)
		return pt_set_error(PT_ERR_INVALID, "stage: n_slots must be >= 1");
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "stage");
	s->cfg = *cfg;
	s->comm = comm;
	s->rank = pt_comm_rank(comm);
	s->p = pt_comm_world(comm) - 1;
	s->n_slots = cfg->n_slots;
	s->fail_mb = -1;
	/* A chunk of an interleaved stage is 1/v of its work. */
	s->delay_ms =
	    host_delay_ms / (cfg->schedule == PT_SCHED_INTERLEAVED && cfg->virtual_stages > 1
	                         ? cfg->virtual_stages
	                         : 1);
	s->zb = cfg->schedule == PT_SCHED_ZBH1;
	s->il = cfg->schedule == PT_SCHED_INTERLEAVED;
	/* 1F1B in its textbook order when the microbatch count is known (else,
	 * for callers that do not give it, the stage's reactive order). */
	s->ordered =
	    s->zb || (cfg->n_microbatches > 0 && cfg->mode != PT_MODE_ASYNC &&
	              (cfg->schedule == PT_SCHED_1F1B ||
	               (cfg->schedule == PT_SCHED_MODE && cfg->mode == PT_MODE_SEMI_ASYNC)));
	if (s->zb && (cfg->mode == PT_MODE_ASYNC || cfg->recompute || cfg->n_microbatches < 1)) {
		rv = pt_set_error(PT_ERR_INVALID, "schedule zb-h1 needs a flushing mode, no "
		                                  "recomputation and the microbatch count");
		goto fail;
	}
	if (s->il && (rv = interleaved_up(s)) != PT_OK)
		goto fail;
	/* Stage r of p: p - r + 1 forwards ahead of the first B, r - 1 W's held. */
	s->zb_warm =
	    s->p - s->rank + 1 < cfg->n_microbatches ? s->p - s->rank + 1 : cfg->n_microbatches;
	s->zb_defer = s->rank - 1;
	mc = (pt_model_config){.batch = cfg->microbatch,
	                       .input = cfg->input,
	                       .n_slots = model_slots,
	                       .seed = cfg->seed,
	                       .device = cfg->device,
	                       .split_backward = s->zb,
	                       .precision = cfg->precision,
	                       /* The slots the first step fills. */
	                       .prefault_slots = cfg->n_microbatches < model_slots
	                                             ? cfg->n_microbatches
	                                             : model_slots};
	if ((rv = pt_backend_check_device(cfg->device)) != PT_OK)
		goto fail;
	if ((rv = pt_model_create(&s->model, cfg->layers, cfg->n_layers, cfg->first, cfg->last,
	                          &mc)) != PT_OK)
		goto fail;
	if ((rv = pt_optimizer_create(&s->opt, &cfg->optim, pt_model_params(s->model),
	                              pt_model_grads(s->model))) != PT_OK)
		goto fail;
	s->slots = calloc((size_t)s->n_slots, sizeof(slot));
	s->zb_w = calloc((size_t)s->n_slots, sizeof(int));
	s->sqnorms = calloc((size_t)pt_model_num_tensors(s->model) + 1, sizeof(double));
	if (!s->slots || !s->zb_w || !s->sqnorms) {
		rv = pt_set_error(PT_ERR_NOMEM, "stage slots");
		goto fail;
	}
	np = pt_tensor_numel(pt_model_params(s->model));
	if (cfg->mode == PT_MODE_ASYNC && cfg->weight_stashing) {
		if ((rv = pt_tensor_init_dev(&s->current, cfg->device, PT_F32, 1,
		                             (int64_t[]){np})) != PT_OK)
			goto fail;
		for (int i = 0; i < s->n_slots; i++)
			if ((rv = pt_tensor_init_dev(&s->slots[i].stash, cfg->device, PT_F32, 1,
			                             (int64_t[]){np})) != PT_OK)
				goto fail;
	}
	if (!cfg->sync_sends) {
		int dsts[3] = {0, s->rank - 1, s->rank + 1};
		if ((s->tx = calloc((size_t)pt_comm_world(comm), sizeof(*s->tx))) == NULL) {
			rv = pt_set_error(PT_ERR_NOMEM, "stage send streams");
			goto fail;
		}
		for (int k = 0; k < 3; k++) {
			char name[32];
			int d = dsts[k];
			if (d < 0 || d >= pt_comm_world(comm) || s->tx[d] != NULL)
				continue;
			snprintf(name, sizeof(name), "stage%d.tx%d", s->rank, d);
			if ((rv = pt_stream_create(&s->tx[d], name)) != PT_OK)
				goto fail;
		}
	}
	/* CPU stages only: see the file comment (a device stage runs eagerly). */
	if (cfg->use_graphs && cfg->device.kind == PT_DEV_CPU &&
	    (rv = pt_graph_manager_create(&s->graphs, -1, 0)) != PT_OK)
		goto fail;
	*out = s;
	return PT_OK;
fail:
	pt_stage_destroy(s);
	return pt_set_error(rv, "stage %d (layers %d..%d): %s", pt_comm_rank(comm), cfg->first,
	                    cfg->last - 1, pt_last_error());
}

void pt_stage_destroy(pt_stage *s)
{
	if (s == NULL)
		return;
	/* Cancels what was not sent (the loop drains the streams when it ends). */
	for (int d = 0; s->tx && d < pt_comm_world(s->comm); d++)
		pt_stream_destroy(s->tx[d]);
	free(s->tx);
	pt_graph_manager_destroy(s->graphs);
	for (int i = 0; s->slots && i < s->n_slots; i++) {
		pt_tensor_fini(&s->slots[i].x);
		pt_tensor_fini(&s->slots[i].stash);
		pt_tensor_fini(&s->slots[i].gx);
		pt_tensor_fini(&s->slots[i].gdy);
	}
	pt_tensor_fini(&s->current);
	pt_tensor_fini(&s->state_buf);
	pt_optimizer_destroy(s->opt);
	pt_model_destroy(s->model);
	free(s->slots);
	free(s->zb_w);
	free(s->il_order);
	free(s->il_mb);
	free(s->sqnorms);
	free(s->tasks);
	free(s);
}

int pt_stage_graphs_captured(pt_stage *s)
{
	return s->graphs ? pt_graph_manager_count(s->graphs) : 0;
}

void pt_stage_fail_forward_at(pt_stage *s, int mb)
{
	s->fail_mb = mb;
}

void pt_stage_set_task_delay(pt_stage *s, int delay_ms)
{
	s->delay_ms = delay_ms;
}

void pt_stage_host_set_task_delay(int delay_ms)
{
	host_delay_ms = delay_ms;
}

/* task_delay sleeps units times the test delay: F, B and W are one unit
 * each, so a whole backward (B and W) is two. */
static void task_delay(const pt_stage *s, int units)
{
	if (s->delay_ms > 0) {
		int ms = s->delay_ms * units;
		struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
}

static void record(pt_stage *s, pt_task_kind kind, int64_t step, int32_t mb, double t0)
{
	double t1 = pt_now();
	s->stats.busy += t1 - t0;
	if (s->n_tasks == s->cap_tasks) {
		int cap = s->cap_tasks ? 2 * s->cap_tasks : 256;
		pt_task_record *n = realloc(s->tasks, (size_t)cap * sizeof(*n));
		if (n == NULL)
			return; /* the timeline is best effort; training goes on */
		s->tasks = n;
		s->cap_tasks = cap;
	}
	s->tasks[s->n_tasks++] = (pt_task_record){(uint8_t)kind, mb, step, t0, t1};
}

/* The ERROR message of a failed task or send, from a stage thread or a send
 * stream's thread: the detail is the calling thread's last error. */
static pt_err error_msg(const pt_stage *s, uint32_t tag, int64_t step, int32_t mb, pt_err code,
                        pt_msg *m)
{
	char msg[1024];
	*m = (pt_msg){.meta = {.kind = PT_MSG_ERROR, .step = step, .microbatch = mb, .tag = tag}};
	snprintf(msg, sizeof(msg), "stage %d: %s", s->rank, pt_last_error());
	pt_warn("stage %d step %ld microbatch %d: %s", s->rank, (long)step, mb, msg);
	return pt_wire_error_encode(m, s->rank, step, mb, code, msg);
}

static const char *kind_name(pt_msg_kind k)
{
	static const char *const names[PT_MSG_KIND_COUNT] = {"activation", "gradient", "output",
	                                                     "done",       "command",  "reply",
	                                                     "error",      "barrier",  "end"};
	return (unsigned)k < PT_MSG_KIND_COUNT ? names[k] : "message";
}

static pt_err tx_run(void *arg)
{
	tx_item *it = arg;
	it->ran = true;
	return pt_comm_send(it->s->comm, it->dst, &it->m);
}

/* After a queued send: a failure goes to the coordinator directly (the
 * destination may be the coordinator itself; then it is only logged). */
static void tx_done(void *arg, pt_err rv)
{
	tx_item *it = arg;
	const pt_msg_meta *mt = &it->m.meta;
	if (rv != PT_OK && it->ran && mt->kind != PT_MSG_ERROR) {
		pt_msg e;
		pt_set_error(rv, "sending %s of step %ld microbatch %d to rank %d: %s",
		             kind_name(mt->kind), (long)mt->step, mt->microbatch, it->dst,
		             pt_last_error());
		if (error_msg(it->s, mt->tag, mt->step, mt->microbatch, rv, &e) == PT_OK)
			pt_comm_send(it->s->comm, 0, &e);
		pt_msg_fini(&e);
	} else if (rv != PT_OK) {
		pt_debug("stage %d: send to rank %d not done: %s", it->s->rank, it->dst,
		         pt_last_error());
	}
	pt_msg_fini(&it->m);
	free(it);
}

/* post sends *m to dst, on dst's send stream when there is one (returns once
 * it is queued) or inline. It takes *m over either way (zeroed). */
static pt_err post(pt_stage *s, int dst, pt_msg *m)
{
	pt_stream *st = s->tx && dst >= 0 && dst < pt_comm_world(s->comm) ? s->tx[dst] : NULL;
	tx_item *it;
	pt_err rv;
	if (st == NULL) {
		rv = pt_comm_send(s->comm, dst, m);
		pt_msg_fini(m);
		return rv;
	}
	/* Deferred ops writing the tensor run here, on the stage's own dispatcher. */
	if (m->has_tensor && (rv = pt_tensor_sync(&m->tensor)) != PT_OK) {
		pt_msg_fini(m);
		return rv;
	}
	if ((it = malloc(sizeof(*it))) == NULL) {
		pt_msg_fini(m);
		return pt_set_error(PT_ERR_NOMEM, "queued send");
	}
	*it = (tx_item){.s = s, .dst = dst, .m = *m};
	memset(m, 0, sizeof(*m));
	if ((rv = pt_stream_enqueue(st, tx_run, tx_done, it)) != PT_OK) {
		pt_msg_fini(&it->m);
		free(it);
	}
	return rv;
}

/* drain waits until every queued send has gone (or failed). */
static void drain(pt_stage *s)
{
	for (int d = 0; s->tx && d < pt_comm_world(s->comm); d++)
		if (s->tx[d] != NULL)
			pt_stream_sync(s->tx[d], -1);
}

/* to_host makes *out t itself when it is host data, else a host copy. */
static pt_err to_host(pt_tensor *out, const pt_tensor *t)
{
	pt_err rv;
	if (pt_tensor_device(t).kind == PT_DEV_CPU) {
		pt_tensor_view(out, t);
		return PT_OK;
	}
	PT_TRY(pt_tensor_init(out, t->dtype, t->ndim, t->shape));
	if ((rv = pt_tensor_transfer(out, t)) != PT_OK)
		pt_tensor_fini(out);
	return rv;
}

/* to_stage makes *out t itself when it is on the stage's device, else a copy
 * there (an input from the coordinator, or one that took a host path). */
static pt_err to_stage(const pt_stage *s, pt_tensor *out, const pt_tensor *t)
{
	pt_err rv;
	if (pt_device_equal(pt_tensor_device(t), s->cfg.device)) {
		pt_tensor_view(out, t);
		return PT_OK;
	}
	PT_TRY(pt_tensor_init_dev(out, s->cfg.device, t->dtype, t->ndim, t->shape));
	if ((rv = pt_tensor_transfer(out, t)) != PT_OK)
		pt_tensor_fini(out);
	return rv;
}

/* copy_state copies between the stage's buffers and host tensors: an op on
 * one device (the CPU path, unchanged), a transfer across devices. */
static pt_err copy_state(pt_tensor *dst, const pt_tensor *src)
{
	if (pt_device_equal(pt_tensor_device(dst), pt_tensor_device(src)))
		return pt_copy(dst, src);
	return pt_tensor_transfer(dst, src);
}

/* send_to sends t (may be NULL) to dst; the coordinator (rank 0, on the
 * CPU) gets host data, other stages the tensor where it lives when the
 * communicator carries device tensors (NCCL), else a host copy (local, nng:
 * the receiving stage puts it back on its device). give: the stage reads
 * t no more, so the receiver may overwrite it (pt_msg.writable; a copy made
 * here is the receiver's in any case). */
static pt_err send_to(pt_stage *s, int dst, pt_msg_kind kind, int64_t step, int32_t mb,
                      const pt_tensor *t, bool give)
{
	pt_msg m = {.meta = {.kind = kind, .step = step, .microbatch = mb, .tag = s->generation}};
	if (t != NULL) {
		if (dst == 0 || !s->comm->ops->device_tensors)
			PT_TRY(to_host(&m.tensor, t));
		else
			pt_tensor_view(&m.tensor, t);
		m.has_tensor = true;
		m.writable = give || m.tensor.storage != t->storage;
		/* bf16 between stages (the coordinator gets f32); a device tensor
		 * over NCCL stays f32, unrounded (no bf16 tensors on devices). */
		if (dst != 0 && s->cfg.precision == PT_PREC_BF16 && m.tensor.dtype == PT_F32 &&
		    pt_tensor_device(&m.tensor).kind == PT_DEV_CPU) {
			pt_tensor h;
			pt_err rv;
			if ((rv = pt_tensor_init(&h, PT_BF16, m.tensor.ndim, m.tensor.shape)) ==
			        PT_OK &&
			    (rv = pt_tensor_convert(&h, &m.tensor)) != PT_OK)
				pt_tensor_fini(&h);
			pt_tensor_fini(&m.tensor);
			PT_TRY(rv);
			m.tensor = h;
			m.writable = true;
		}
	}
	return post(s, dst, &m);
}

/* widen makes a bf16 activation or gradient from another stage f32. */
static pt_err widen(pt_msg *m)
{
	pt_tensor f;
	pt_err rv;
	PT_TRY(pt_tensor_init(&f, PT_F32, m->tensor.ndim, m->tensor.shape));
	if ((rv = pt_tensor_convert(&f, &m->tensor)) != PT_OK) {
		pt_tensor_fini(&f);
		return rv;
	}
	pt_tensor_fini(&m->tensor);
	m->tensor = f;
	return PT_OK;
}

/* Reports a failed task to the coordinator; the stage carries on. */
static void report(pt_stage *s, int64_t step, int32_t mb, pt_err code)
{
	pt_msg m;
	if (error_msg(s, s->generation, step, mb, code, &m) == PT_OK)
		post(s, 0, &m);
	pt_msg_fini(&m);
}

static int find_slot(pt_stage *s, bool used, int64_t step, int32_t mb)
{
	for (int i = 0; i < s->n_slots; i++) {
		slot *sl = &s->slots[i];
		if (!used && !sl->used)
			return i;
		if (used && sl->used && sl->mb == mb && sl->step == step)
			return i;
	}
	return -1;
}

static void release(pt_stage *s, int i)
{
	s->slots[i].used = false;
	pt_tensor_fini(&s->slots[i].x);
	s->stats.live--;
}

/* A copy the receiver may keep: local sends share storage, and the buffer
 * behind t (a model slot or gradient scratch) is reused by the next task. */
static pt_err send_copy(pt_stage *s, int dst, pt_msg_kind kind, int64_t step, int32_t mb,
                        const pt_tensor *t)
{
	pt_tensor c;
	pt_err rv;
	PT_TRY(pt_tensor_init_dev(&c, pt_tensor_device(t), t->dtype, t->ndim, t->shape));
	if ((rv = pt_copy(&c, t)) == PT_OK)
		rv = send_to(s, dst, kind, step, mb, &c, true);
	pt_tensor_fini(&c);
	return rv;
}

static pt_err forward_eager(pt_stage *s, int i, const pt_tensor **y)
{
	slot *sl = &s->slots[i];
	return pt_model_forward(s->model, s->cfg.recompute ? 0 : i, &sl->x, y, true,
	                        (uint64_t)sl->step, (uint64_t)sl->mb);
}

static pt_err forward_fn(void *arg, pt_stream *stream)
{
	pt_stage *s = arg;
	return forward_eager(s, s->g_slot, &s->slots[s->g_slot].y);
}

static pt_err backward_fn(void *arg, pt_stream *stream)
{
	pt_stage *s = arg;
	int i = s->g_slot;
	const pt_tensor *y;
	s->slots[i].dx = NULL;
	if (s->cfg.recompute)
		PT_TRY(forward_eager(s, i, &y));
	if (s->zb) /* B: the input gradient; W runs later (weight_fn) */
		return pt_model_backward_input(s->model, i, s->g_dy, &s->slots[i].dx);
	return pt_model_backward(s->model, s->cfg.recompute ? 0 : i, s->g_dy, &s->slots[i].dx);
}

static pt_err weight_fn(void *arg, pt_stream *stream)
{
	pt_stage *s = arg;
	return pt_model_backward_weight(s->model, s->g_slot);
}

static pt_err update_fn(void *arg, pt_stream *stream)
{
	pt_stage *s = arg;
	PT_TRY(pt_optimizer_update(s->opt));
	return pt_model_zero_grad(s->model);
}

/* Runs fn under "<what>.<slot>" (slot < 0: "<what>") through the graph
 * manager, or eagerly without graphs. */
static pt_err run_phase(pt_stage *s, const char *what, int i, pt_graph_fn fn)
{
	char name[48];
	if (s->graphs == NULL)
		return fn(s, NULL);
	if (i >= 0)
		snprintf(name, sizeof(name), "%s.%d", what, i);
	else
		snprintf(name, sizeof(name), "%s", what);
	return pt_graph_manager_execute(s->graphs, name, fn, s, NULL, NULL);
}

/* Copies t into the fixed buffer *fixed (made on first use): graphs read
 * their inputs from the same addresses every time. */
static pt_err fix_input(pt_tensor *fixed, const pt_tensor *t)
{
	if (fixed->storage == NULL)
		PT_TRY(pt_tensor_init(fixed, t->dtype, t->ndim, t->shape));
	if (fixed->dtype != t->dtype || pt_tensor_numel(fixed) != pt_tensor_numel(t))
		return pt_set_error(PT_ERR_SHAPE, "input of %ld elements, the graph's has %ld",
		                    (long)pt_tensor_numel(t), (long)pt_tensor_numel(fixed));
	return pt_tensor_read(t, pt_tensor_data(fixed), pt_tensor_nbytes(fixed));
}

static pt_err run_forward(pt_stage *s, int i, const pt_tensor **y)
{
	slot *sl = &s->slots[i];
	pt_err rv;
	bool inject = s->fail_mb >= 0 && s->fail_mb == sl->mb;
	if (inject) {
		/* eager: a replay would not go through the dispatcher's hook */
		pt_dispatcher_inject_failure(pt_dispatcher_current(), PT_OP_LINEAR_FWD, true);
		rv = forward_eager(s, i, y);
		pt_dispatcher_inject_failure(pt_dispatcher_current(), PT_OP_LINEAR_FWD, false);
		s->fail_mb = -1;
		return rv;
	}
	s->g_slot = i;
	PT_TRY(run_phase(s, "forward", i, forward_fn));
	*y = sl->y;
	return PT_OK;
}

static void on_forward(pt_stage *s, pt_msg *m)
{
	int64_t step = m->meta.step;
	int32_t mb = m->meta.microbatch;
	double t0 = pt_now();
	const pt_tensor *y;
	int i;
	pt_err rv;

	if (!m->has_tensor) {
		pt_set_error(PT_ERR_FORMAT, "forward message without a tensor");
		report(s, step, mb, PT_ERR_FORMAT);
		return;
	}
	if ((i = find_slot(s, false, 0, 0)) < 0) {
		pt_set_error(PT_ERR_STATE, "no free activation slot (%d in flight)", s->n_slots);
		report(s, step, mb, PT_ERR_STATE);
		return;
	}
	task_delay(s, 1);
	slot *sl = &s->slots[i];
	sl->used = true;
	sl->mb = mb;
	sl->step = step;
	sl->version = s->updates;
	if (++s->stats.live > s->stats.peak_live)
		s->stats.peak_live = s->stats.live;
	if (s->graphs == NULL) {
		if ((rv = to_stage(s, &sl->x, &m->tensor)) != PT_OK)
			goto fail;
	} else {
		if ((rv = fix_input(&sl->gx, &m->tensor)) != PT_OK)
			goto fail;
		pt_tensor_view(&sl->x, &sl->gx);
	}
	if (sl->stash.storage && (rv = pt_copy(&sl->stash, pt_model_params(s->model))) != PT_OK)
		goto fail;
	if ((rv = run_forward(s, i, &y)) != PT_OK)
		goto fail;
	/* The task ends with its computation; the send is communication. */
	record(s, PT_TASK_FORWARD, step, mb, t0);
	/* The next stage keeps its input until its W under a split backward,
	 * past this slot's reuse: it gets a copy (local sends share storage). */
	if (s->rank < s->p)
		rv = s->cfg.recompute || s->zb
		         ? send_copy(s, s->rank + 1, PT_MSG_FORWARD, step, mb, y)
		         : send_to(s, s->rank + 1, PT_MSG_FORWARD, step, mb, y, false);
	else
		rv = s->cfg.recompute ? send_copy(s, 0, PT_MSG_OUTPUT, step, mb, y)
		                      : send_to(s, 0, PT_MSG_OUTPUT, step, mb, y,
		                                pt_model_output_dead(s->model));
	if (rv != PT_OK)
		goto fail;
	s->stats.forwards++;
	s->zb_f++;
	return;
fail:
	release(s, i);
	report(s, step, mb, rv);
}

/* The optimizer update, then zeroed gradients (one graph with graphs on). */
static pt_err optimizer_step(pt_stage *s, float grad_scale)
{
	PT_TRY(pt_optimizer_prepare(s->opt, grad_scale));
	PT_TRY(run_phase(s, "optimizer", -1, update_fn));
	pt_optimizer_advance(s->opt);
	return PT_OK;
}

/* Async update after one microbatch's backward; staleness counts the
 * updates applied between its forward and now. */
static pt_err async_update(pt_stage *s, int64_t version)
{
	int64_t stale = s->updates - version;
	PT_TRY(optimizer_step(s, 1.0f));
	s->stats.staleness_sum += stale;
	if (stale > s->stats.staleness_max)
		s->stats.staleness_max = (int32_t)stale;
	s->updates++;
	s->stats.updates++;
	return PT_OK;
}

/* run_weight runs the oldest pending W (split backward) and frees its slot. */
static pt_err run_weight(pt_stage *s)
{
	int i = s->zb_w[0];
	slot *sl = &s->slots[i];
	double t0 = pt_now();
	pt_err rv;

	s->zb_nw--;
	memmove(s->zb_w, s->zb_w + 1, sizeof(int) * (size_t)s->zb_nw);
	task_delay(s, 1);
	s->g_slot = i;
	rv = run_phase(s, "weight", i, weight_fn);
	if (rv == PT_OK)
		record(s, PT_TASK_WEIGHT, sl->step, sl->mb, t0);
	release(s, i);
	return rv;
}

static void on_backward(pt_stage *s, pt_msg *m)
{
	int64_t step = m->meta.step;
	int32_t mb = m->meta.microbatch;
	double t0 = pt_now();
	const pt_tensor *dx = NULL;
	pt_tensor dy = {0}; /* the gradient on the stage's device */
	bool stashed = false;
	int i = find_slot(s, true, step, mb);
	pt_err rv = PT_OK;

	if (i < 0 || !m->has_tensor) {
		pt_set_error(PT_ERR_STATE, "gradient for a microbatch this stage does not hold");
		report(s, step, mb, PT_ERR_STATE);
		return;
	}
	task_delay(s, s->zb ? 1 : 2);
	slot *sl = &s->slots[i];
	if (sl->stash.storage) {
		/* Backward on the weights the forward used; the live ones wait aside. */
		if ((rv = pt_copy(&s->current, pt_model_params(s->model))) != PT_OK ||
		    (rv = pt_copy(pt_model_params(s->model), &sl->stash)) != PT_OK)
			goto out;
		stashed = true;
	}
	s->g_slot = i;
	if (s->graphs == NULL) {
		if ((rv = to_stage(s, &dy, &m->tensor)) != PT_OK)
			goto out;
		s->g_dy = &dy;
	} else {
		if ((rv = fix_input(&sl->gdy, &m->tensor)) != PT_OK)
			goto out;
		s->g_dy = &sl->gdy;
	}
	if ((rv = run_phase(s, s->zb ? "binput" : "backward", i, backward_fn)) != PT_OK)
		goto out;
	dx = sl->dx;
	if (stashed && (rv = pt_copy(pt_model_params(s->model), &s->current)) != PT_OK)
		goto out;
	stashed = false;
	record(s, PT_TASK_BACKWARD, step, mb, t0);
	if (s->rank > 1)
		rv = send_copy(s, s->rank - 1, PT_MSG_BACKWARD, step, mb, dx);
	if (rv == PT_OK && s->cfg.mode == PT_MODE_ASYNC)
		rv = async_update(s, sl->version);
	if (rv == PT_OK && s->rank == 1)
		rv = send_to(s, 0, PT_MSG_DONE, step, mb, NULL, false);
out:
	if (stashed)
		pt_copy(pt_model_params(s->model), &s->current);
	pt_tensor_fini(&dy);
	if (rv != PT_OK || !s->zb) {
		release(s, i);
		if (rv != PT_OK) {
			report(s, step, mb, rv);
			return;
		}
		if (s->ordered && ++s->zb_b >= s->cfg.n_microbatches)
			s->zb_f = s->zb_b = 0;
	} else {
		/* The slot stays until its W: after this B when more than zb_defer
		 * are pending, all of them after the step's last B. */
		s->zb_w[s->zb_nw++] = i;
		s->zb_b++;
		while (rv == PT_OK &&
		       s->zb_nw > (s->zb_b < s->cfg.n_microbatches ? s->zb_defer : 0))
			rv = run_weight(s);
		if (s->zb_b >= s->cfg.n_microbatches)
			s->zb_f = s->zb_b = 0;
		if (rv != PT_OK) {
			report(s, step, mb, rv);
			return;
		}
	}
	s->stats.backwards++;
}

/* The stage's whole training state as one flat tensor: parameters, then the
 * optimizer's state tensors in pt_optimizer_state order. */
static pt_err state_size(pt_stage *s, int64_t *n, int *ns, pt_tensor **st)
{
	const char *names[4];
	*ns = pt_optimizer_state(s->opt, names, st);
	*n = pt_tensor_numel(pt_model_params(s->model));
	for (int i = 0; i < *ns; i++)
		*n += pt_tensor_numel(st[i]);
	return PT_OK;
}

static pt_err get_state(pt_stage *s, pt_tensor *out)
{
	pt_tensor *st[4], view;
	int64_t n, off;
	int ns;
	PT_TRY(state_size(s, &n, &ns, st));
	if (s->state_buf.storage == NULL || pt_tensor_numel(&s->state_buf) != n ||
	    atomic_load_explicit(&s->state_buf.storage->refs, memory_order_acquire) != 1) {
		pt_tensor_fini(&s->state_buf);
		PT_TRY(pt_tensor_init(&s->state_buf, PT_F32, 1, (int64_t[]){n}));
		pt_storage_prefault(s->state_buf.storage); /* the copies fill it all */
	}
	off = 0;
	for (int i = -1; i < ns; i++) {
		pt_tensor *src = i < 0 ? pt_model_params(s->model) : st[i];
		pt_err rv = pt_tensor_narrow(&view, &s->state_buf, 0, off, pt_tensor_numel(src));
		if (rv == PT_OK)
			rv = copy_state(&view, src);
		pt_tensor_fini(&view);
		PT_TRY(rv);
		off += pt_tensor_numel(src);
	}
	pt_tensor_view(out, &s->state_buf);
	return PT_OK;
}

static pt_err set_state(pt_stage *s, const pt_msg *m, int64_t steps)
{
	pt_tensor *st[4], view;
	int64_t n, off = 0;
	int ns;
	PT_TRY(state_size(s, &n, &ns, st));
	if (!m->has_tensor || m->tensor.dtype != PT_F32 || pt_tensor_numel(&m->tensor) != n)
		return pt_set_error(PT_ERR_SHAPE, "state of %ld floats, this stage holds %ld",
		                    m->has_tensor ? (long)pt_tensor_numel(&m->tensor) : 0L,
		                    (long)n);
	for (int i = -1; i < ns; i++) {
		pt_tensor *dst = i < 0 ? pt_model_params(s->model) : st[i];
		pt_err rv = pt_tensor_narrow(&view, &m->tensor, 0, off, pt_tensor_numel(dst));
		if (rv == PT_OK)
			rv = copy_state(dst, &view);
		pt_tensor_fini(&view);
		PT_TRY(rv);
		off += pt_tensor_numel(dst);
	}
	pt_optimizer_set_steps(s->opt, steps);
	return pt_model_zero_grad(s->model);
}

static pt_err reply(pt_stage *s, pt_reply *r, const pt_tensor *t)
{
	pt_msg m = {.meta = {.kind = PT_MSG_REPLY, .tag = s->generation}};
	pt_err rv = pt_wire_reply_encode(&m, r);
	if (rv == PT_OK && t != NULL) {
		m.has_tensor = true;
		pt_tensor_view(&m.tensor, t);
	}
	if (rv == PT_OK)
		return post(s, 0, &m);
	pt_msg_fini(&m);
	return rv;
}

/* Returns true when the loop should stop. */
static bool on_command(pt_stage *s, pt_msg *m)
{
	pt_control c;
	pt_reply r = {0};
	pt_tensor params = {0};
	double t0 = pt_now();
	pt_err rv;

	if ((rv = pt_wire_control_decode(m, &c)) != PT_OK) {
		report(s, m->meta.step, -1, rv);
		return false;
	}
	r.cmd = c.cmd;
	switch (c.cmd) {
	case PT_CMD_STEP:
		if ((rv = optimizer_step(s, c.grad_scale)) == PT_OK) {
			s->updates++;
			s->stats.updates++;
			record(s, PT_TASK_STEP, c.step, -1, t0);
		}
		break;
	case PT_CMD_SQNORM:
		rv = pt_model_grad_sqnorms(s->model, s->sqnorms);
		r.sqnorms = s->sqnorms;
		r.n_sqnorms = pt_model_num_tensors(s->model);
		break;
	case PT_CMD_TIMELINE:
		r.tasks = s->tasks;
		r.n_tasks = s->n_tasks;
		/* The coordinator asks for the timeline once per step, so the
		 * communicator's counters ride along (a stage on a worker keeps
		 * them in its own process). Queued sends go first, so every
		 * message of the step is counted; this reply is not. */
		drain(s);
		r.has_comm = true;
		r.comm = pt_comm_get_stats(s->comm);
		break;
	case PT_CMD_STATS:
		r.has_stats = true;
		r.stats = s->stats;
		break;
	case PT_CMD_RESET:
		for (int i = 0; i < s->n_slots; i++)
			if (s->slots[i].used)
				release(s, i);
		s->zb_f = s->zb_b = s->zb_nw = s->il_pos = 0;
		s->generation = (uint32_t)c.step;
		if (s->turn)
			turn_reset(s, s->generation);
		rv = pt_model_zero_grad(s->model);
		break;
	case PT_CMD_PARAMS:
		if ((rv = pt_tensor_init(
		         &params, PT_F32, 1,
		         (int64_t[]){pt_tensor_numel(pt_model_params(s->model))})) == PT_OK)
			rv = copy_state(&params, pt_model_params(s->model));
		break;
	case PT_CMD_GET_STATE:
		rv = get_state(s, &params);
		r.steps = pt_optimizer_steps(s->opt);
		break;
	case PT_CMD_SET_STATE:
		rv = set_state(s, m, c.step);
		break;
	case PT_CMD_STOP:
		break;
	default:
		rv = pt_set_error(PT_ERR_INVALID, "unknown command %d", (int)c.cmd);
	}
	if (rv != PT_OK)
		report(s, c.step, -1, rv);
	else if (reply(s, &r, params.storage ? &params : NULL) == PT_OK && c.cmd == PT_CMD_TIMELINE)
		s->n_tasks = 0;
	pt_tensor_fini(&params);
	return c.cmd == PT_CMD_STOP;
}

/* zb_next takes the message an ordered schedule needs next: a forward
 * while fewer than zb_warm microbatches wait for their B, else a gradient;
 * control meanwhile (a reset or a stop). */
static pt_err zb_next(pt_stage *s, pt_msg *m)
{
	bool fwd = s->zb_f - s->zb_b < s->zb_warm && s->zb_f < s->cfg.n_microbatches;
	return pt_comm_recv_slice(s->comm, PT_ANY_RANK,
	                          fwd ? PT_CH_FORWARD_OR_CONTROL : PT_CH_BACKWARD_OR_CONTROL, -1,
	                          m);
}

/* Backward first, then control, then forward; block when all are empty
 * (within a split-backward step: zb_next). */
static pt_err next_message(pt_stage *s, pt_msg *m)
{
	static const pt_channel order[] = {PT_CH_BACKWARD, PT_CH_CONTROL, PT_CH_FORWARD};
	if (s->il)
		return pt_comm_recv_slice(s->comm, PT_ANY_RANK,
		                          s->il_order[s->il_pos] ? PT_CH_BACKWARD_OR_CONTROL
		                                                 : PT_CH_FORWARD_OR_CONTROL,
		                          -1, m);
	if (s->ordered && s->zb_f > 0)
		return zb_next(s, m);
	for (int k = 0; k < 3; k++) {
		pt_err rv = pt_comm_recv(s->comm, PT_ANY_RANK, order[k], 0, m);
		if (rv != PT_ERR_TIMEOUT)
			return rv;
	}
	return pt_comm_recv_slice(s->comm, PT_ANY_RANK, PT_CH_ANY, -1, m);
}

static pt_err loop(pt_stage *s);

pt_err pt_stage_run(pt_stage *s)
{
	pt_err rv;
	/* No more threads than cores: a configuration that asks for 1024 (a
	 * worker takes it from the wire) would only oversubscribe them. */
	int threads = s->cfg.threads > 0 ? s->cfg.threads : 1;
	pt_set_num_threads(threads < pt_num_cores() ? threads : pt_num_cores());
	pt_set_precision(s->cfg.precision);
	rv = loop(s);
	if (s->turn)
		turn_close(s);
	drain(s);
	return rv;
}

static pt_err loop(pt_stage *s)
{
	for (;;) {
		pt_msg m = {0};
		bool stop = false;
		pt_err rv = next_message(s, &m);
		if (rv == PT_ERR_CLOSED)
			return PT_OK;
		if (rv == PT_ERR_TIMEOUT)
			continue;
		if (rv != PT_OK) {
			/* A corrupt or out-of-sequence message: report it and keep serving. */
			report(s, -1, -1, rv);
			continue;
		}
		bool data = m.meta.kind == PT_MSG_FORWARD || m.meta.kind == PT_MSG_BACKWARD;
		if (data && m.meta.tag != s->generation) {
			pt_msg_fini(&m); /* from before the last reset */
			continue;
		}
		if (data && m.has_tensor && m.tensor.dtype == PT_BF16 &&
		    (rv = widen(&m)) != PT_OK) {
			report(s, m.meta.step, m.meta.microbatch, rv);
			pt_msg_fini(&m);
			continue;
		}
		/* Interleaved: a chunk's forwards and backwards each come in
		 * microbatch order; another one (a predecessor's failed task was
		 * skipped) is an error here, not a wait for a turn that never
		 * comes. */
		if (data && s->il && m.meta.microbatch != s->il_mb[s->il_pos]) {
			pt_set_error(PT_ERR_STATE,
			             "%s of microbatch %d where the interleaved order expects %d",
			             m.meta.kind == PT_MSG_FORWARD ? "activation" : "gradient",
			             m.meta.microbatch, s->il_mb[s->il_pos]);
			report(s, m.meta.step, m.meta.microbatch, PT_ERR_STATE);
			pt_msg_fini(&m);
			continue;
		}
		if (data && s->turn &&
		    !turn_wait(s, m.meta.kind == PT_MSG_BACKWARD, m.meta.microbatch, m.meta.tag)) {
			pt_msg_fini(&m); /* a RESET came meanwhile */
			continue;
		}
		switch (m.meta.kind) {
		case PT_MSG_FORWARD:
			on_forward(s, &m);
			break;
		case PT_MSG_BACKWARD:
			on_backward(s, &m);
			break;
		case PT_MSG_COMMAND:
			stop = on_command(s, &m);
			break;
		default:
			break;
		}
		if (data && s->il)
			s->il_pos = (s->il_pos + 1) % s->il_n;
		if (data && s->turn)
			turn_done(s, m.meta.tag);
		pt_msg_fini(&m);
		if (stop)
			return PT_OK;
	}
}

static void *stage_thread(void *arg)
{
	pt_stage *s = arg;
	char name[16];
	/* top -H shows it (its OpenMP team inherits the name) */
	snprintf(name, sizeof(name), "pt-stage%d", s->rank);
	pthread_setname_np(pthread_self(), name);
	s->result = pt_stage_run(s);
	return NULL;
}

pt_err pt_stage_start(pt_stage *s)
{
	if (pthread_create(&s->thread, NULL, stage_thread, s) != 0)
		return pt_set_error(PT_ERR_BACKEND, "stage %d: cannot start its thread", s->rank);
	s->started = true;
	return PT_OK;
}

pt_err pt_stage_join(pt_stage *s)
{
	if (!s->started)
		return PT_OK;
	pthread_join(s->thread, NULL);
	s->started = false;
	return s->result;
}

struct pt_stage_turn_share {
	pthread_mutex_t mu;
	pt_stage_turn *turn;
	int refs, r, p, v, m;
};

pt_err pt_stage_turn_share_create(pt_stage_turn_share **out)
{
	if ((*out = calloc(1, sizeof(**out))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "stage turn share");
	pthread_mutex_init(&(*out)->mu, NULL);
	return PT_OK;
}

void pt_stage_turn_share_destroy(pt_stage_turn_share *sh)
{
	if (sh == NULL)
		return;
	pt_stage_turn_destroy(sh->turn);
	pthread_mutex_destroy(&sh->mu);
	free(sh);
}

/* share_take gives cfg (an interleaved chunk of rank L) its rank's turn. */
static pt_err share_take(pt_stage_turn_share *sh, pt_comm *comm, pt_stage_config *cfg)
{
	int v = cfg->virtual_stages, world = pt_comm_world(comm) - 1, p, r;
	pt_err rv = PT_OK;

	if (v < 1 || world % v != 0)
		return pt_set_error(PT_ERR_INVALID, "virtual_stages %d for %d stages", v, world);
	p = world / v;
	r = (pt_comm_rank(comm) - 1) % p + 1;
	pthread_mutex_lock(&sh->mu);
	if (sh->refs == 0) {
		pt_stage_turn_destroy(sh->turn);
		sh->turn = NULL;
		if ((rv = pt_stage_turn_create(&sh->turn, r, p, v, cfg->n_microbatches)) == PT_OK) {
			sh->r = r, sh->p = p, sh->v = v, sh->m = cfg->n_microbatches;
		}
	} else if (sh->r != r || sh->p != p || sh->v != v || sh->m != cfg->n_microbatches) {
		rv = pt_set_error(
		    PT_ERR_INVALID,
		    "chunk of rank %d of %d (v %d, m %d) beside chunks of rank %d of %d "
		    "(v %d, m %d): one process serves the chunks of one rank",
		    r, p, v, cfg->n_microbatches, sh->r, sh->p, sh->v, sh->m);
	}
	if (rv == PT_OK) {
		sh->refs++;
		cfg->turn = sh->turn;
	}
	pthread_mutex_unlock(&sh->mu);
	return rv;
}

void pt_stage_turn_share_close(pt_stage_turn_share *sh)
{
	if (sh == NULL)
		return;
	pthread_mutex_lock(&sh->mu);
	pt_stage_turn_close(sh->turn);
	pthread_mutex_unlock(&sh->mu);
}

static void share_drop(pt_stage_turn_share *sh)
{
	pthread_mutex_lock(&sh->mu);
	if (--sh->refs == 0) {
		pt_stage_turn_destroy(sh->turn);
		sh->turn = NULL;
	}
	pthread_mutex_unlock(&sh->mu);
}

pt_err pt_stage_host_run(pt_comm *comm, int timeout_ms)
{
	return pt_stage_host_run_shared(comm, timeout_ms, NULL);
}

pt_err pt_stage_host_run_shared(pt_comm *comm, int timeout_ms, pt_stage_turn_share *sh)
{
	bool shared = false;
	pt_stage_config cfg;
	pt_layer_spec *layers = NULL;
	pt_stage *s = NULL;
	pt_reply r = {.cmd = PT_CMD_CONFIGURE};
	pt_msg m = {0}, ready = {.meta = {.kind = PT_MSG_REPLY}};
	pt_err rv;

	if ((rv = pt_comm_recv(comm, 0, PT_CH_CONTROL, timeout_ms, &m)) != PT_OK)
		return pt_set_error(rv, "waiting for the coordinator's configuration: %s",
		                    pt_last_error());
	if ((rv = pt_wire_configure_decode(&m, &cfg, &layers)) == PT_OK && sh != NULL &&
	    cfg.schedule == PT_SCHED_INTERLEAVED && (rv = share_take(sh, comm, &cfg)) == PT_OK)
		shared = true;
	if (rv == PT_OK)
		rv = pt_stage_create(&s, &cfg, comm);
	pt_msg_fini(&m);
	if (rv != PT_OK) {
		pt_msg e = {.meta = {.kind = PT_MSG_ERROR}};
		char msg[1024];
		snprintf(msg, sizeof(msg), "stage %d: configuration refused: %s",
		         pt_comm_rank(comm), pt_last_error());
		if (pt_wire_error_encode(&e, pt_comm_rank(comm), -1, -1, rv, msg) == PT_OK)
			pt_comm_send(comm, 0, &e);
		pt_msg_fini(&e);
		free(layers);
		if (shared)
			share_drop(sh);
		return pt_set_error(rv, "%s", msg);
	}
	if ((rv = pt_wire_reply_encode(&ready, &r)) == PT_OK &&
	    (rv = pt_comm_send(comm, 0, &ready)) == PT_OK)
		rv = pt_stage_run(s);
	pt_msg_fini(&ready);
	pt_stage_destroy(s);
	free(layers);
	if (shared)
		share_drop(sh);
	return rv;
}
