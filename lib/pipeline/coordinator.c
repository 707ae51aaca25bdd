/* coordinator.c - rank 0: feeds microbatches, computes losses and their
 * gradients, commands optimizer steps, measures the bubble. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "ops.h"
#include "runtime.h"
#include "wire.h"

#define MAX_TENSORS_PER_STAGE 4096
#define POLL_MS               100

typedef struct inflight {
	bool used;
	bool got_output; /* its output came (a second one is refused) */
	int64_t step;
	int32_t mb;
	pt_tensor x, y;  /* async: the coordinator's own copies; else views of the batch */
	pt_tensor dpred; /* the loss gradient when the output may not take it; made when needed */
} inflight;

struct pt_coordinator {
	pt_pipeline_config cfg;
	pt_comm *comm;
	int p, m;
	uint32_t generation;
	pt_loss *loss;
	inflight *fl; /* m entries (sync, semi-async) or p entries (async) */
	int n_fl, live;
	double *sqnorms;
	size_t dpred_bytes;                   /* of the dpred buffers made so far */
	pt_task_record *tasks[PT_MAX_STAGES]; /* the last step's records per stage */
	int n_tasks[PT_MAX_STAGES];
	/* async loss bookkeeping for the current call */
	double loss_sum;
	int loss_n;
};

static int timeout_of(const pt_coordinator *c)
{
	return c->cfg.timeout_ms > 0 ? c->cfg.timeout_ms : PT_COMM_TIMEOUT_DEFAULT_MS;
}

static int out_dims(const pt_coordinator *c, int64_t *shape)
{
	int nd = 0;
	shape[nd++] = c->cfg.microbatch;
	if (c->cfg.output.seq)
		shape[nd++] = c->cfg.output.seq;
	if (c->cfg.output.features)
		shape[nd++] = c->cfg.output.features;
	return nd;
}

pt_err pt_coordinator_create(pt_coordinator **out, const pt_pipeline_config *cfg, pt_comm *comm)
{
	pt_coordinator *c;
	int64_t shape[4];
	int nd;
	pt_err rv;

	*out = NULL;
	if (cfg->n_stages < 1 || cfg->n_stages != pt_comm_world(comm) - 1)
		return pt_set_error(PT_ERR_INVALID,
		                    "stages: %d stages on a communicator of %d ranks",
		                    cfg->n_stages, pt_comm_world(comm));
	if (cfg->n_microbatches <= 0)
		return pt_set_error(PT_ERR_INVALID, "microbatches must be > 0, got %d",
		                    cfg->n_microbatches);
	if (cfg->microbatch <= 0)
		return pt_set_error(PT_ERR_INVALID, "microbatch size must be > 0");
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "coordinator");
	c->cfg = *cfg;
	c->comm = comm;
	c->p = cfg->n_stages;
	c->m = cfg->n_microbatches;
	c->n_fl = cfg->mode == PT_MODE_ASYNC ? c->p : c->m;
	nd = out_dims(c, shape);
	c->fl = calloc((size_t)c->n_fl, sizeof(inflight));
	c->sqnorms = calloc(MAX_TENSORS_PER_STAGE, sizeof(double));
	if (!c->fl || !c->sqnorms) {
		rv = pt_set_error(PT_ERR_NOMEM, "coordinator tables");
		goto fail;
	}
	if ((rv = pt_loss_create(&c->loss, cfg->loss, nd, shape, cfg->ignore_index)) != PT_OK)
		goto fail;
	*out = c;
	return PT_OK;
fail:
	pt_coordinator_destroy(c);
	return rv;
}

static void fl_clear(inflight *f)
{
	f->used = false;
	pt_tensor_fini(&f->x);
	pt_tensor_fini(&f->y);
}

void pt_coordinator_destroy(pt_coordinator *c)
{
	if (c == NULL)
		return;
	for (int i = 0; c->fl && i < c->n_fl; i++) {
		fl_clear(&c->fl[i]);
		pt_tensor_fini(&c->fl[i].dpred);
	}
	pt_loss_destroy(c->loss);
	free(c->fl);
	free(c->sqnorms);
	for (int s = 0; s < PT_MAX_STAGES; s++)
		free(c->tasks[s]);
	free(c);
}

static pt_err send_msg(pt_coordinator *c, int dst, pt_msg_kind kind, int64_t step, int32_t mb,
                       const pt_tensor *t)
{
	pt_msg m = {.meta = {.kind = kind, .step = step, .microbatch = mb, .tag = c->generation}};
	pt_err rv;
	if (t) {
		m.has_tensor = true;
		pt_tensor_view(&m.tensor, t);
	}
	rv = pt_comm_send(c->comm, dst, &m);
	pt_msg_fini(&m);
	if (rv != PT_OK)
		return pt_set_error(rv, "sending to stage %d: %s", dst, pt_last_error());
	return PT_OK;
}

static pt_err command(pt_coordinator *c, int dst, pt_stage_cmd cmd, float scale, int64_t step)
{
	pt_msg m = {.meta = {.kind = PT_MSG_COMMAND, .step = step, .tag = c->generation}};
	pt_control ctl = {cmd, scale, step};
	pt_err rv = pt_wire_control_encode(&m, &ctl);
	if (rv == PT_OK)
		rv = pt_comm_send(c->comm, dst, &m);
	pt_msg_fini(&m);
	if (rv != PT_OK)
		return pt_set_error(rv, "sending a command to stage %d: %s", dst, pt_last_error());
	return PT_OK;
}

/* Checks that no stage has disappeared: a receive from a lost peer fails at
 * once with PT_ERR_CLOSED; a queued control message is handed back in *m. */
static pt_err probe_stages(pt_coordinator *c, pt_msg *m, bool *got)
{
	*got = false;
	for (int s = 1; s <= c->p; s++) {
		pt_err rv = pt_comm_recv(c->comm, s, PT_CH_CONTROL, 0, m);
		if (rv == PT_OK) {
			*got = true;
			return PT_OK;
		}
		if (rv == PT_ERR_CLOSED)
			return pt_set_error(PT_ERR_CLOSED, "stage %d (rank %d) disconnected", s, s);
		if (rv != PT_ERR_TIMEOUT)
			return rv;
	}
	return PT_OK;
}

/* Waits for the next message of the current generation. A StageError ends
 * the wait with that error; no message for the timeout is PT_ERR_TIMEOUT. */
static pt_err wait_any(pt_coordinator *c, pt_msg *m, const char *waiting_for)
{
	double deadline = pt_now() + timeout_of(c) / 1000.0;
	for (;;) {
		bool got = false;
		pt_err rv = pt_comm_recv_slice(c->comm, PT_ANY_RANK, PT_CH_ANY, POLL_MS, m);
		if (rv == PT_ERR_TIMEOUT) {
			if ((rv = probe_stages(c, m, &got)) != PT_OK)
				return rv;
			if (!got) {
				if (pt_now() > deadline)
					return pt_set_error(PT_ERR_TIMEOUT,
					                    "no answer from the stages in %d ms "
					                    "(waiting for %s)",
					                    timeout_of(c), waiting_for);
				continue;
			}
		} else if (rv != PT_OK) {
			return pt_set_error(rv, "receiving from the stages: %s", pt_last_error());
		}
		if (m->meta.tag != c->generation) {
			pt_msg_fini(m); /* left over from before a reset */
			continue;
		}
		if (m->meta.kind == PT_MSG_ERROR) {
			rv = pt_wire_error_raise(m);
			pt_msg_fini(m);
			return rv;
		}
		return PT_OK;
	}
}

/* Waits for a REPLY from stage s, reading only s's control queue so replies
 * of other stages stay queued for their own waits. */
static pt_err wait_reply(pt_coordinator *c, int s, pt_reply *r, pt_msg *keep)
{
	double deadline = pt_now() + timeout_of(c) / 1000.0;
	for (;;) {
		pt_msg m = {0};
		pt_err rv = pt_comm_recv_slice(c->comm, s, PT_CH_CONTROL, POLL_MS, &m);
		if (rv == PT_ERR_TIMEOUT) {
			if (pt_now() > deadline)
				return pt_set_error(PT_ERR_TIMEOUT,
				                    "no reply from stage %d in %d ms", s,
				                    timeout_of(c));
			continue;
		}
		if (rv == PT_ERR_CLOSED)
			return pt_set_error(PT_ERR_CLOSED, "stage %d (rank %d) disconnected", s, s);
		if (rv != PT_OK)
			return pt_set_error(rv, "receiving from stage %d: %s", s, pt_last_error());
		if (m.meta.tag != c->generation) {
			pt_msg_fini(&m);
			continue;
		}
		if (m.meta.kind == PT_MSG_ERROR) {
			rv = pt_wire_error_raise(&m);
			pt_msg_fini(&m);
			return rv;
		}
		if (m.meta.kind == PT_MSG_REPLY) {
			rv = r ? pt_wire_reply_decode(&m, r) : PT_OK;
			if (keep)
				*keep = m;
			else
				pt_msg_fini(&m);
			return rv;
		}
		pt_debug("coordinator: unexpected message kind %d from stage %d", (int)m.meta.kind,
		         s);
		pt_msg_fini(&m);
	}
}

/* After a failure: a new generation on every stage, nothing in flight. */
static void reset_stages(pt_coordinator *c)
{
	c->generation++;
	for (int i = 0; i < c->n_fl; i++)
		fl_clear(&c->fl[i]);
	c->live = 0;
	/* Every stage is told before any reply is awaited: an interleaved
	 * chunk waiting for its rank's turn answers only once a sibling chunk
	 * has taken its own RESET. */
	bool sent[PT_MAX_STAGES + 1] = {false};
	for (int s = 1; s <= c->p; s++)
		sent[s] = command(c, s, PT_CMD_RESET, 1.0f, c->generation) == PT_OK;
	for (int s = 1; s <= c->p; s++)
		if (sent[s])
			wait_reply(c, s, NULL, NULL);
}

static inflight *find_fl(pt_coordinator *c, int64_t step, int32_t mb)
{
	for (int i = 0; i < c->n_fl; i++)
		if (c->fl[i].used && c->fl[i].step == step && c->fl[i].mb == mb)
			return &c->fl[i];
	return NULL;
}

/* An output arrived: its loss, and its gradient back to the last stage. The
 * gradient overwrites the output when the message allows it (a received
 * buffer, or a last stage that reads its output no more): no second
 * output-sized buffer, which for a language model's logits is the largest
 * in the job. */
static pt_err on_output(pt_coordinator *c, pt_msg *m, float scale)
{
	inflight *f = find_fl(c, m->meta.step, m->meta.microbatch);
	pt_tensor *dpred;
	int64_t shape[4];
	int nd = out_dims(c, shape);
	bool same = m->has_tensor && m->tensor.ndim == nd;
	double l;
	if (f == NULL || !m->has_tensor)
		return pt_set_error(PT_ERR_STATE, "output for unknown microbatch %d of step %ld",
		                    m->meta.microbatch, (long)m->meta.step);
	if (m->meta.source != c->p)
		return pt_set_error(PT_ERR_STATE,
		                    "output of microbatch %d from rank %d: only the last stage "
		                    "(rank %d) sends outputs",
		                    m->meta.microbatch, m->meta.source, c->p);
	if (f->got_output)
		return pt_set_error(PT_ERR_STATE, "a second output of microbatch %d of step %ld",
		                    m->meta.microbatch, (long)m->meta.step);
	f->got_output = true;
	for (int i = 0; same && i < nd; i++)
		same = m->tensor.shape[i] == shape[i];
	if (same && m->writable && m->tensor.dtype == PT_F32 &&
	    pt_tensor_is_contiguous(&m->tensor) &&
	    pt_tensor_device(&m->tensor).kind == PT_DEV_CPU) {
		dpred = &m->tensor;
	} else {
		if (f->dpred.storage == NULL) {
			PT_TRY(pt_tensor_init(&f->dpred, PT_F32, nd, shape));
			c->dpred_bytes += pt_tensor_nbytes(&f->dpred);
		}
		dpred = &f->dpred;
	}
	PT_TRY(pt_loss_compute_both(c->loss, &m->tensor, &f->y, scale, &l, NULL, dpred));
	c->loss_sum += l;
	c->loss_n++;
	return send_msg(c, c->p, PT_MSG_BACKWARD, f->step, f->mb, dpred);
}

static pt_err check_batch(const pt_coordinator *c, const pt_tensor *x, const pt_tensor *y)
{
	int64_t want = c->cfg.microbatch * c->m;
	if (x->ndim < 1 || y->ndim < 1 || x->shape[0] != want || y->shape[0] != want)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "a batch of %ld samples does not split into %d microbatches of %ld",
		    (long)(x->ndim ? x->shape[0] : 0), c->m, (long)c->cfg.microbatch);
	return PT_OK;
}

#define MAX_TASKS 4096

/* Fetches (and so clears) stage s's task records into c->tasks[s - 1], and
 * the communicator counters that come with them into res. */
/* fetch_timeline takes stage s's reply to a TIMELINE command already sent. */
static pt_err fetch_timeline(pt_coordinator *c, int s, pt_pipe_step_result *res)
{
	pt_reply r = {0};
	if (c->tasks[s - 1] == NULL &&
	    (c->tasks[s - 1] = malloc(sizeof(pt_task_record) * MAX_TASKS)) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "timeline buffer");
	r.tasks = c->tasks[s - 1];
	r.cap_tasks = MAX_TASKS;
	PT_TRY(wait_reply(c, s, &r, NULL));
	c->n_tasks[s - 1] = r.n_tasks;
	res->has_stage_comm[s - 1] = r.has_comm;
	res->stage_comm[s - 1] = r.comm;
	return PT_OK;
}

/* Sync and semi-async: run the whole batch, then the optimizer step. */
static pt_err flush_step(pt_coordinator *c, const pt_tensor *x, const pt_tensor *y, int64_t step,
                         pt_pipe_step_result *res)
{
	int next = 0, outputs = 0, done = 0, in_flight = 0;
	/* GPipe holds every output until the last; the others (1F1B, ZB-H1)
	 * keep p microbatches in flight and send each loss gradient at once. */
	bool eager = c->cfg.schedule == PT_SCHED_MODE ? c->cfg.mode == PT_MODE_SEMI_ASYNC
	                                              : c->cfg.schedule != PT_SCHED_GPIPE;
	/* Interleaved: stage 1 takes its inputs in its rank's order; the
	 * inputs wait in its inbox meanwhile. */
	int limit = eager && c->cfg.schedule != PT_SCHED_INTERLEAVED ? c->p : c->m;
	pt_msg *held = calloc((size_t)c->m, sizeof(pt_msg));
	double t0 = pt_now(), t_done, t_grads;
	pt_err rv = PT_OK;

	if (held == NULL)
		return pt_set_error(PT_ERR_NOMEM, "coordinator outputs");
	c->loss_sum = 0.0;
	c->loss_n = 0;
	for (int k = 0; k < c->m; k++) {
		inflight *f = &c->fl[k];
		f->used = true;
		f->got_output = false;
		f->step = step;
		f->mb = k;
		if ((rv = pt_tensor_narrow(&f->x, x, 0, k * c->cfg.microbatch,
		                           c->cfg.microbatch)) != PT_OK ||
		    (rv = pt_tensor_narrow(&f->y, y, 0, k * c->cfg.microbatch,
		                           c->cfg.microbatch)) != PT_OK)
			goto out;
	}
	while (done < c->m) {
		pt_msg m = {0};
		while (next < c->m && in_flight < limit) {
			if ((rv = send_msg(c, 1, PT_MSG_FORWARD, step, next, &c->fl[next].x)) !=
			    PT_OK)
				goto out;
			next++;
			in_flight++;
		}
		if ((rv = wait_any(c, &m, "outputs and gradients")) != PT_OK)
			goto out;
		if (m.meta.kind == PT_MSG_OUTPUT && eager) {
			rv = on_output(c, &m, 1.0f / (float)c->m);
			pt_msg_fini(&m);
		} else if (m.meta.kind == PT_MSG_OUTPUT) {
			/* sync: keep every output; losses and backwards start after the last. */
			int k = m.meta.microbatch;
			if (k < 0 || k >= c->m || held[k].has_tensor) {
				pt_msg_fini(&m);
				rv = pt_set_error(PT_ERR_STATE,
				                  "unexpected output of microbatch %d", k);
			} else {
				held[k] = m;
				if (++outputs == c->m)
					for (int j = 0; j < c->m && rv == PT_OK; j++)
						rv = on_output(c, &held[j], 1.0f / (float)c->m);
			}
		} else if (m.meta.kind == PT_MSG_DONE) {
			done++;
			in_flight--;
			pt_msg_fini(&m);
		} else {
			pt_msg_fini(&m);
		}
		if (rv != PT_OK)
			goto out;
	}
	t_done = pt_now();
	/* Global gradient norm: per-tensor squares, summed in stage order. Every
	 * stage is asked before any reply is awaited (replies queue per stage), so
	 * a step costs two rounds of control messages, not 3p round trips. */
	double sq = 0.0;
	for (int s = 1; s <= c->p && rv == PT_OK; s++)
		rv = command(c, s, PT_CMD_SQNORM, 1.0f, step);
	for (int s = 1; s <= c->p && rv == PT_OK; s++) {
		pt_reply r = {.sqnorms = c->sqnorms, .cap_sqnorms = MAX_TENSORS_PER_STAGE};
		if ((rv = wait_reply(c, s, &r, NULL)) == PT_OK)
			for (int i = 0; i < r.n_sqnorms; i++)
				sq += r.sqnorms[i]; /* one running sum, in global tensor order */
	}
	if (rv != PT_OK)
		goto out;
	/* Every gradient is in now: a split backward's last W's run after the
	 * DONEs, before the stage answers SQNORM. */
	t_grads = pt_now();
	res->grad_norm = sqrt(sq);
	float scale = pt_clip_scale(res->grad_norm, c->cfg.optim.clip_norm);
	res->lr = pt_lr_at(&c->cfg.optim, step + 1);
	/* STEP then TIMELINE to every stage; each answers them in that order. */
	for (int s = 1; s <= c->p && rv == PT_OK; s++)
		if ((rv = command(c, s, PT_CMD_STEP, scale, step)) == PT_OK)
			rv = command(c, s, PT_CMD_TIMELINE, 1.0f, 0);
	for (int s = 1; s <= c->p && rv == PT_OK; s++)
		rv = wait_reply(c, s, NULL, NULL);
	if (rv != PT_OK)
		goto out;
	res->seconds = t_done - t0;
	res->loss = c->loss_n ? c->loss_sum / c->loss_n : 0.0;
	res->microbatches_done = c->m;
	/* The timeline of this step: busy time per stage and the bubble. */
	double busy = 0.0;
	for (int s = 1; s <= c->p; s++) {
		res->stage_busy[s - 1] = 0.0;
		if ((rv = fetch_timeline(c, s, res)) != PT_OK)
			goto out;
		for (int i = 0; i < c->n_tasks[s - 1]; i++) {
			const pt_task_record *t = &c->tasks[s - 1][i];
			if (t->kind != PT_TASK_STEP && t->step == step)
				res->stage_busy[s - 1] += t->end - t->start;
		}
		busy += res->stage_busy[s - 1];
	}
	/* Interleaved: p * v stages share p ranks. */
	int ranks = c->cfg.schedule == PT_SCHED_INTERLEAVED && c->cfg.virtual_stages > 1
	                ? c->p / c->cfg.virtual_stages
	                : c->p;
	res->bubble = t_grads > t0 ? 1.0 - busy / (ranks * (t_grads - t0)) : 0.0;
out:
	for (int k = 0; k < c->m; k++) {
		pt_msg_fini(&held[k]);
		fl_clear(&c->fl[k]);
	}
	free(held);
	if (rv != PT_OK) {
		char msg[1024];
		snprintf(msg, sizeof(msg), "%s", pt_last_error());
		reset_stages(c);
		pt_set_error(rv, "step %ld: %s", (long)step, msg);
	}
	return rv;
}

/* Async: handle one message; frees the microbatch on DONE. */
static pt_err async_pump(pt_coordinator *c)
{
	pt_msg m = {0};
	pt_err rv = wait_any(c, &m, "async outputs");
	if (rv != PT_OK)
		return rv;
	if (m.meta.kind == PT_MSG_OUTPUT) {
		rv = on_output(c, &m, 1.0f);
	} else if (m.meta.kind == PT_MSG_DONE) {
		inflight *f = find_fl(c, m.meta.step, m.meta.microbatch);
		if (f) {
			fl_clear(f);
			c->live--;
		}
	}
	pt_msg_fini(&m);
	return rv;
}

static pt_err async_feed(pt_coordinator *c, const pt_tensor *x, const pt_tensor *y, int64_t step,
                         int k)
{
	pt_tensor xv = {0}, yv = {0};
	inflight *f = NULL;
	pt_err rv;
	while (c->live >= c->p)
		PT_TRY(async_pump(c));
	for (int i = 0; i < c->n_fl && !f; i++)
		if (!c->fl[i].used)
			f = &c->fl[i];
	if ((rv = pt_tensor_narrow(&xv, x, 0, k * c->cfg.microbatch, c->cfg.microbatch)) != PT_OK ||
	    (rv = pt_tensor_narrow(&yv, y, 0, k * c->cfg.microbatch, c->cfg.microbatch)) != PT_OK)
		goto out;
	/* The caller may reuse its batch buffer while this microbatch is in flight. */
	if ((rv = pt_tensor_init(&f->x, xv.dtype, xv.ndim, xv.shape)) != PT_OK ||
	    (rv = pt_tensor_init(&f->y, yv.dtype, yv.ndim, yv.shape)) != PT_OK ||
	    (rv = pt_copy(&f->x, &xv)) != PT_OK || (rv = pt_copy(&f->y, &yv)) != PT_OK)
		goto out;
	f->used = true;
	f->got_output = false;
	f->step = step;
	f->mb = k;
	c->live++;
	rv = send_msg(c, 1, PT_MSG_FORWARD, step, k, &f->x);
out:
	pt_tensor_fini(&xv);
	pt_tensor_fini(&yv);
	return rv;
}

pt_err pt_coordinator_step(pt_coordinator *c, const pt_tensor *x, const pt_tensor *y, int64_t step,
                           pt_pipe_step_result *res)
{
	pt_err rv;
	memset(res, 0, sizeof(*res));
	PT_TRY(check_batch(c, x, y));
	if (c->cfg.mode != PT_MODE_ASYNC)
		return flush_step(c, x, y, step, res);
	double t0 = pt_now();
	c->loss_sum = 0.0;
	c->loss_n = 0;
	for (int k = 0; k < c->m; k++)
		if ((rv = async_feed(c, x, y, step, k)) != PT_OK) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s", pt_last_error());
			reset_stages(c);
			return pt_set_error(rv, "step %ld: %s", (long)step, msg);
		}
	res->seconds = pt_now() - t0;
	res->loss = c->loss_n ? c->loss_sum / c->loss_n : NAN;
	res->microbatches_done = c->loss_n;
	res->lr = pt_lr_at(&c->cfg.optim, 1);
	return PT_OK;
}

pt_err pt_coordinator_drain(pt_coordinator *c, pt_pipe_step_result *res)
{
	memset(res, 0, sizeof(*res));
	c->loss_sum = 0.0;
	c->loss_n = 0;
	while (c->live > 0) {
		pt_err rv = async_pump(c);
		if (rv != PT_OK) {
			reset_stages(c);
			return rv;
		}
	}
	res->loss = c->loss_n ? c->loss_sum / c->loss_n : NAN;
	res->microbatches_done = c->loss_n;
	return PT_OK;
}

pt_err pt_coordinator_configure(pt_coordinator *c, const pt_stage_config *configs)
{
	for (int s = 1; s <= c->p; s++) {
		pt_msg m = {.meta = {.kind = PT_MSG_COMMAND, .tag = c->generation}};
		pt_err rv = pt_wire_configure_encode(&m, &configs[s - 1]);
		if (rv == PT_OK)
			rv = pt_comm_send(c->comm, s, &m);
		pt_msg_fini(&m);
		if (rv != PT_OK)
			return pt_set_error(rv, "configuring stage %d: %s", s, pt_last_error());
	}
	for (int s = 1; s <= c->p; s++)
		PT_TRY(wait_reply(c, s, NULL, NULL));
	return PT_OK;
}

pt_err pt_coordinator_stage_stats(pt_coordinator *c, int s, pt_stage_stats *out)
{
	pt_reply r = {0};
	if (s < 1 || s > c->p)
		return pt_set_error(PT_ERR_RANGE, "stage %d of %d", s, c->p);
	PT_TRY(command(c, s, PT_CMD_STATS, 1.0f, 0));
	PT_TRY(wait_reply(c, s, &r, NULL));
	*out = r.stats;
	return PT_OK;
}

size_t pt_coordinator_dpred_bytes(const pt_coordinator *c)
{
	return c->dpred_bytes;
}

const pt_task_record *pt_coordinator_step_timeline(const pt_coordinator *c, int s, int *n)
{
	if (s < 1 || s > c->p) {
		*n = 0;
		return NULL;
	}
	*n = c->n_tasks[s - 1];
	return c->tasks[s - 1];
}

pt_err pt_coordinator_params(pt_coordinator *c, int s, pt_tensor *out)
{
	pt_msg m = {0};
	if (s < 1 || s > c->p)
		return pt_set_error(PT_ERR_RANGE, "stage %d of %d", s, c->p);
	PT_TRY(command(c, s, PT_CMD_PARAMS, 1.0f, 0));
	PT_TRY(wait_reply(c, s, NULL, &m));
	if (!m.has_tensor) {
		pt_msg_fini(&m);
		return pt_set_error(PT_ERR_FORMAT, "stage %d sent no parameters", s);
	}
	pt_tensor_view(out, &m.tensor);
	pt_msg_fini(&m);
	return PT_OK;
}

pt_err pt_coordinator_get_state(pt_coordinator *c, int s, pt_tensor *out, int64_t *steps)
{
	pt_msg m = {0};
	pt_reply r = {0};
	if (s < 1 || s > c->p)
		return pt_set_error(PT_ERR_RANGE, "stage %d of %d", s, c->p);
	PT_TRY(command(c, s, PT_CMD_GET_STATE, 1.0f, 0));
	PT_TRY(wait_reply(c, s, &r, &m));
	if (!m.has_tensor) {
		pt_msg_fini(&m);
		return pt_set_error(PT_ERR_FORMAT, "stage %d sent no state", s);
	}
	pt_tensor_view(out, &m.tensor);
	*steps = r.steps;
	pt_msg_fini(&m);
	return PT_OK;
}

pt_err pt_coordinator_set_state(pt_coordinator *c, int s, const pt_tensor *state, int64_t steps)
{
	pt_msg m = {.meta = {.kind = PT_MSG_COMMAND, .step = steps, .tag = c->generation}};
	pt_control ctl = {PT_CMD_SET_STATE, 1.0f, steps};
	pt_err rv;
	if (s < 1 || s > c->p)
		return pt_set_error(PT_ERR_RANGE, "stage %d of %d", s, c->p);
	if ((rv = pt_wire_control_encode(&m, &ctl)) == PT_OK) {
		m.has_tensor = true;
		pt_tensor_view(&m.tensor, state);
		rv = pt_comm_send(c->comm, s, &m);
	}
	pt_msg_fini(&m);
	PT_TRY(rv);
	return wait_reply(c, s, NULL, NULL);
}

pt_err pt_coordinator_stop(pt_coordinator *c)
{
	pt_err first = PT_OK;
	for (int s = 1; s <= c->p; s++) {
		pt_err rv = command(c, s, PT_CMD_STOP, 1.0f, 0);
		if (rv == PT_OK)
			rv = wait_reply(c, s, NULL, NULL);
		if (rv != PT_OK && first == PT_OK)
			first = rv;
	}
	return first;
}
