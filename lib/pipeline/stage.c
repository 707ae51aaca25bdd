/* stage.c - a pipeline stage: its model slice, optimizer and event loop.
 *
 * The loop takes one message at a time from the communicator (its inbox),
 * preferring backward gradients, then control, then forward activations, so
 * in-flight microbatches finish before new ones start (1F1B). Every data
 * message carries the coordinator's generation in meta.tag; a RESET moves
 * the stage to a new generation and messages of older ones are dropped.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"
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
};

pt_err pt_stage_create(pt_stage **out, const pt_stage_config *cfg, pt_comm *comm)
{
	pt_stage *s;
	pt_model_config mc;
	pt_err rv;
	int64_t np;

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
	mc = (pt_model_config){.batch = cfg->microbatch,
	                       .input = cfg->input,
	                       .n_slots = cfg->recompute ? 1 : cfg->n_slots,
	                       .seed = cfg->seed};
	if ((rv = pt_model_create(&s->model, cfg->layers, cfg->n_layers, cfg->first, cfg->last,
	                          &mc)) != PT_OK)
		goto fail;
	if ((rv = pt_optimizer_create(&s->opt, &cfg->optim, pt_model_params(s->model),
	                              pt_model_grads(s->model))) != PT_OK)
		goto fail;
	s->slots = calloc((size_t)s->n_slots, sizeof(slot));
	s->sqnorms = calloc((size_t)pt_model_num_tensors(s->model) + 1, sizeof(double));
	if (!s->slots || !s->sqnorms) {
		rv = pt_set_error(PT_ERR_NOMEM, "stage slots");
		goto fail;
	}
	np = pt_tensor_numel(pt_model_params(s->model));
	if (cfg->mode == PT_MODE_ASYNC && cfg->weight_stashing) {
		if ((rv = pt_tensor_init(&s->current, PT_F32, 1, (int64_t[]){np})) != PT_OK)
			goto fail;
		for (int i = 0; i < s->n_slots; i++)
			if ((rv = pt_tensor_init(&s->slots[i].stash, PT_F32, 1, (int64_t[]){np})) !=
			    PT_OK)
				goto fail;
	}
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
	for (int i = 0; s->slots && i < s->n_slots; i++) {
		pt_tensor_fini(&s->slots[i].x);
		pt_tensor_fini(&s->slots[i].stash);
	}
	pt_tensor_fini(&s->current);
	pt_optimizer_destroy(s->opt);
	pt_model_destroy(s->model);
	free(s->slots);
	free(s->sqnorms);
	free(s->tasks);
	free(s);
}

void pt_stage_fail_forward_at(pt_stage *s, int mb)
{
	s->fail_mb = mb;
}

void pt_stage_set_task_delay(pt_stage *s, int delay_ms)
{
	s->delay_ms = delay_ms;
}

static int host_delay_ms;

void pt_stage_host_set_task_delay(int delay_ms)
{
	host_delay_ms = delay_ms;
}

static void task_delay(const pt_stage *s)
{
	if (s->delay_ms > 0) {
		struct timespec ts = {s->delay_ms / 1000, (long)(s->delay_ms % 1000) * 1000000L};
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

static pt_err send_to(pt_stage *s, int dst, pt_msg_kind kind, int64_t step, int32_t mb,
                      const pt_tensor *t)
{
	pt_msg m = {.meta = {.kind = kind, .step = step, .microbatch = mb, .tag = s->generation}};
	pt_err rv;
	if (t != NULL) {
		m.has_tensor = true;
		pt_tensor_view(&m.tensor, t);
	}
	rv = pt_comm_send(s->comm, dst, &m);
	pt_msg_fini(&m);
	return rv;
}

/* Reports a failed task to the coordinator; the stage carries on. */
static void report(pt_stage *s, int64_t step, int32_t mb, pt_err code)
{
	pt_msg m = {
	    .meta = {.kind = PT_MSG_ERROR, .step = step, .microbatch = mb, .tag = s->generation}};
	char msg[1024];
	snprintf(msg, sizeof(msg), "stage %d: %s", s->rank, pt_last_error());
	pt_warn("stage %d step %ld microbatch %d: %s", s->rank, (long)step, mb, msg);
	if (pt_wire_error_encode(&m, s->rank, step, mb, code, msg) == PT_OK)
		pt_comm_send(s->comm, 0, &m);
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
	PT_TRY(pt_tensor_init(&c, t->dtype, t->ndim, t->shape));
	if ((rv = pt_copy(&c, t)) == PT_OK)
		rv = send_to(s, dst, kind, step, mb, &c);
	pt_tensor_fini(&c);
	return rv;
}

static pt_err run_forward(pt_stage *s, int i, const pt_tensor **y)
{
	slot *sl = &s->slots[i];
	pt_err rv;
	bool inject = s->fail_mb >= 0 && s->fail_mb == sl->mb;
	if (inject)
		pt_dispatcher_inject_failure(pt_dispatcher_current(), PT_OP_LINEAR_FWD, true);
	rv = pt_model_forward(s->model, s->cfg.recompute ? 0 : i, &sl->x, y, true,
	                      (uint64_t)sl->step, (uint64_t)sl->mb);
	if (inject) {
		pt_dispatcher_inject_failure(pt_dispatcher_current(), PT_OP_LINEAR_FWD, false);
		s->fail_mb = -1;
	}
	return rv;
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
	task_delay(s);
	slot *sl = &s->slots[i];
	sl->used = true;
	sl->mb = mb;
	sl->step = step;
	sl->version = s->updates;
	pt_tensor_view(&sl->x, &m->tensor);
	if (++s->stats.live > s->stats.peak_live)
		s->stats.peak_live = s->stats.live;
	if (sl->stash.storage && (rv = pt_copy(&sl->stash, pt_model_params(s->model))) != PT_OK)
		goto fail;
	if ((rv = run_forward(s, i, &y)) != PT_OK)
		goto fail;
	/* The task ends with its computation; the send is communication. */
	record(s, PT_TASK_FORWARD, step, mb, t0);
	if (s->rank < s->p)
		rv = s->cfg.recompute ? send_copy(s, s->rank + 1, PT_MSG_FORWARD, step, mb, y)
		                      : send_to(s, s->rank + 1, PT_MSG_FORWARD, step, mb, y);
	else
		rv = s->cfg.recompute ? send_copy(s, 0, PT_MSG_OUTPUT, step, mb, y)
		                      : send_to(s, 0, PT_MSG_OUTPUT, step, mb, y);
	if (rv != PT_OK)
		goto fail;
	s->stats.forwards++;
	return;
fail:
	release(s, i);
	report(s, step, mb, rv);
}

/* Async update after one microbatch's backward; staleness counts the
 * updates applied between its forward and now. */
static pt_err async_update(pt_stage *s, int64_t version)
{
	int64_t stale = s->updates - version;
	PT_TRY(pt_optimizer_step(s->opt, 1.0f));
	PT_TRY(pt_model_zero_grad(s->model));
	s->stats.staleness_sum += stale;
	if (stale > s->stats.staleness_max)
		s->stats.staleness_max = (int32_t)stale;
	s->updates++;
	s->stats.updates++;
	return PT_OK;
}

static void on_backward(pt_stage *s, pt_msg *m)
{
	int64_t step = m->meta.step;
	int32_t mb = m->meta.microbatch;
	double t0 = pt_now();
	const pt_tensor *dx = NULL, *y;
	bool stashed = false;
	int i = find_slot(s, true, step, mb);
	pt_err rv = PT_OK;

	if (i < 0 || !m->has_tensor) {
		pt_set_error(PT_ERR_STATE, "gradient for a microbatch this stage does not hold");
		report(s, step, mb, PT_ERR_STATE);
		return;
	}
	task_delay(s);
	slot *sl = &s->slots[i];
	if (sl->stash.storage) {
		/* Backward on the weights the forward used; the live ones wait aside. */
		if ((rv = pt_copy(&s->current, pt_model_params(s->model))) != PT_OK ||
		    (rv = pt_copy(pt_model_params(s->model), &sl->stash)) != PT_OK)
			goto out;
		stashed = true;
	}
	if (s->cfg.recompute && (rv = run_forward(s, i, &y)) != PT_OK)
		goto out;
	if ((rv = pt_model_backward(s->model, s->cfg.recompute ? 0 : i, &m->tensor, &dx)) != PT_OK)
		goto out;
	if (stashed && (rv = pt_copy(pt_model_params(s->model), &s->current)) != PT_OK)
		goto out;
	stashed = false;
	record(s, PT_TASK_BACKWARD, step, mb, t0);
	if (s->rank > 1)
		rv = send_copy(s, s->rank - 1, PT_MSG_BACKWARD, step, mb, dx);
	if (rv == PT_OK && s->cfg.mode == PT_MODE_ASYNC)
		rv = async_update(s, sl->version);
	if (rv == PT_OK && s->rank == 1)
		rv = send_to(s, 0, PT_MSG_DONE, step, mb, NULL);
out:
	if (stashed)
		pt_copy(pt_model_params(s->model), &s->current);
	release(s, i);
	if (rv != PT_OK) {
		report(s, step, mb, rv);
		return;
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
	PT_TRY(pt_tensor_init(out, PT_F32, 1, (int64_t[]){n}));
	off = 0;
	for (int i = -1; i < ns; i++) {
		pt_tensor *src = i < 0 ? pt_model_params(s->model) : st[i];
		pt_err rv = pt_tensor_narrow(&view, out, 0, off, pt_tensor_numel(src));
		if (rv == PT_OK)
			rv = pt_copy(&view, src);
		pt_tensor_fini(&view);
		PT_TRY(rv);
		off += pt_tensor_numel(src);
	}
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
			rv = pt_copy(dst, &view);
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
		rv = pt_comm_send(s->comm, 0, &m);
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
		if ((rv = pt_optimizer_step(s->opt, c.grad_scale)) == PT_OK &&
		    (rv = pt_model_zero_grad(s->model)) == PT_OK) {
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
		break;
	case PT_CMD_STATS:
		r.has_stats = true;
		r.stats = s->stats;
		break;
	case PT_CMD_RESET:
		for (int i = 0; i < s->n_slots; i++)
			if (s->slots[i].used)
				release(s, i);
		s->generation = (uint32_t)c.step;
		rv = pt_model_zero_grad(s->model);
		break;
	case PT_CMD_PARAMS:
		if ((rv = pt_tensor_init(
		         &params, PT_F32, 1,
		         (int64_t[]){pt_tensor_numel(pt_model_params(s->model))})) == PT_OK)
			rv = pt_copy(&params, pt_model_params(s->model));
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

/* Backward first, then control, then forward; block when all are empty. */
static pt_err next_message(pt_stage *s, pt_msg *m)
{
	static const pt_channel order[] = {PT_CH_BACKWARD, PT_CH_CONTROL, PT_CH_FORWARD};
	for (int k = 0; k < 3; k++) {
		pt_err rv = pt_comm_recv(s->comm, PT_ANY_RANK, order[k], 0, m);
		if (rv != PT_ERR_TIMEOUT)
			return rv;
	}
	return pt_comm_recv(s->comm, PT_ANY_RANK, PT_CH_ANY, -1, m);
}

pt_err pt_stage_run(pt_stage *s)
{
	pt_set_num_threads(s->cfg.threads > 0 ? s->cfg.threads : 1);
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
		pt_msg_fini(&m);
		if (stop)
			return PT_OK;
	}
}

static void *stage_thread(void *arg)
{
	pt_stage *s = arg;
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

pt_err pt_stage_host_run(pt_comm *comm, int timeout_ms)
{
	pt_stage_config cfg;
	pt_layer_spec *layers = NULL;
	pt_stage *s = NULL;
	pt_reply r = {.cmd = PT_CMD_CONFIGURE};
	pt_msg m = {0}, ready = {.meta = {.kind = PT_MSG_REPLY}};
	pt_err rv;

	if ((rv = pt_comm_recv(comm, 0, PT_CH_CONTROL, timeout_ms, &m)) != PT_OK)
		return pt_set_error(rv, "waiting for the coordinator's configuration: %s",
		                    pt_last_error());
	if ((rv = pt_wire_configure_decode(&m, &cfg, &layers)) == PT_OK &&
	    (rv = pt_stage_create(&s, &cfg, comm)) == PT_OK)
		s->delay_ms = host_delay_ms;
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
		return pt_set_error(rv, "%s", msg);
	}
	if ((rv = pt_wire_reply_encode(&ready, &r)) == PT_OK &&
	    (rv = pt_comm_send(comm, 0, &ready)) == PT_OK)
		rv = pt_stage_run(s);
	pt_msg_fini(&ready);
	pt_stage_destroy(s);
	free(layers);
	return rv;
}
