/* executor.c - async forward/backward/send/receive on CPU streams.
 *
 * Each op is enqueued as: [wait for after's event] [wait for the previous
 * compute op's event, ordered compute only] [run] [record op's event]
 * [release the stream's reference]. The stream holds one reference to the op
 * from submission to the last item, so events outlive every record.
 */
#include "executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "ops.h"

#define RECV_SLICE_MS 20

struct pt_async_op {
	atomic_int refs;
	uint64_t id;
	pt_async_kind kind;
	int mb, stream_index, peer;
	int64_t step;
	pt_executor *ex; /* valid until the op completes */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	pt_err err;
	char msg[384];
	pt_tensor input;                   /* view of the explicit input, or empty */
	pt_tensor result;                  /* output, once done */
	pt_async_op *after, *prev_compute; /* held until completion */
	pt_event *event;
};

typedef struct stash_entry {
	struct stash_entry *next;
	pt_msg msg;
} stash_entry;

struct pt_executor {
	pt_exec_compute compute;
	pt_comm *comm;
	pt_executor_config cfg;
	pt_stream_manager *compute_sm, *comm_sm;
	atomic_bool closing;
	atomic_uint_fast64_t next_id;
	atomic_llong step;
	pthread_mutex_t mu;        /* submission order */
	pt_async_op *last_compute; /* ordered compute chain (a reference) */
	pthread_mutex_t rx_mu;     /* one receiver pulls from comm at a time */
	stash_entry *stash;
};

static const char *const kind_names[PT_ASYNC_KIND_COUNT] = {
    "forward", "backward", "send-forward", "receive-forward", "send-backward", "receive-backward"};

const char *pt_async_kind_name(pt_async_kind k)
{
	return (unsigned)k < PT_ASYNC_KIND_COUNT ? kind_names[k] : "unknown";
}

uint64_t pt_async_op_id(const pt_async_op *op)
{
	return op->id;
}
pt_async_kind pt_async_op_kind(const pt_async_op *op)
{
	return op->kind;
}
int pt_async_op_microbatch(const pt_async_op *op)
{
	return op->mb;
}
int pt_async_op_stream(const pt_async_op *op)
{
	return op->stream_index;
}
const pt_tensor *pt_async_op_result(const pt_async_op *op)
{
	return &op->result;
}

bool pt_async_op_done(pt_async_op *op)
{
	bool d;
	pthread_mutex_lock(&op->mu);
	d = op->done;
	pthread_mutex_unlock(&op->mu);
	return d;
}

pt_err pt_async_op_wait(pt_async_op *op, int timeout_ms)
{
	struct timespec end;
	bool has = pt_exec_deadline(&end, timeout_ms);
	pt_err rv;

	pthread_mutex_lock(&op->mu);
	while (!op->done) {
		int rc = has ? pthread_cond_timedwait(&op->cv, &op->mu, &end)
		             : pthread_cond_wait(&op->cv, &op->mu);
		if (rc != 0 && !op->done) {
			pthread_mutex_unlock(&op->mu);
			return pt_set_error(PT_ERR_TIMEOUT,
			                    "%s of microbatch %d (op %llu): not done after %d ms",
			                    pt_async_kind_name(op->kind), op->mb,
			                    (unsigned long long)op->id, timeout_ms);
		}
	}
	rv = op->err;
	if (rv != PT_OK)
		pt_set_error(rv, "%s", op->msg);
	pthread_mutex_unlock(&op->mu);
	return rv;
}

static void op_free(pt_async_op *op)
{
	pt_tensor_fini(&op->input);
	pt_tensor_fini(&op->result);
	pt_async_op_release(op->after);
	pt_async_op_release(op->prev_compute);
	pt_event_destroy(op->event);
	pthread_cond_destroy(&op->cv);
	pthread_mutex_destroy(&op->mu);
	free(op);
}

void pt_async_op_release(pt_async_op *op)
{
	if (op != NULL && atomic_fetch_sub(&op->refs, 1) == 1)
		op_free(op);
}

/* ---- running ops ---- */

static bool msg_matches(const pt_msg *m, const pt_async_op *op, pt_channel ch)
{
	return m->meta.channel == ch && m->meta.microbatch == op->mb && m->meta.step == op->step &&
	       (op->peer == PT_ANY_RANK || m->meta.source == op->peer);
}

static pt_err run_recv(pt_async_op *op, pt_channel ch)
{
	pt_executor *ex = op->ex;
	int timeout = ex->cfg.timeout_ms > 0 ? ex->cfg.timeout_ms : ex->comm->timeout_ms;
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);

	for (;;) {
		pt_msg m = {0};
		pt_err rv;
		long waited;
		pthread_mutex_lock(&ex->rx_mu);
		for (stash_entry **pp = &ex->stash; *pp; pp = &(*pp)->next)
			if (msg_matches(&(*pp)->msg, op, ch)) {
				stash_entry *e = *pp;
				*pp = e->next;
				pthread_mutex_unlock(&ex->rx_mu);
				pt_tensor_view(&op->result, &e->msg.tensor);
				pt_msg_fini(&e->msg);
				free(e);
				return PT_OK;
			}
		rv = pt_comm_recv_slice(ex->comm, op->peer, ch, RECV_SLICE_MS, &m);
		if (rv == PT_OK && !msg_matches(&m, op, ch)) {
			stash_entry *e = malloc(sizeof(*e));
			if (e == NULL) {
				pt_msg_fini(&m);
				pthread_mutex_unlock(&ex->rx_mu);
				return pt_set_error(PT_ERR_NOMEM, "receive stash");
			}
			e->msg = m;
			e->next = ex->stash;
			ex->stash = e;
			pthread_mutex_unlock(&ex->rx_mu);
			continue;
		}
		pthread_mutex_unlock(&ex->rx_mu);
		if (rv == PT_OK) {
			if (m.has_tensor)
				pt_tensor_view(&op->result, &m.tensor);
			pt_msg_fini(&m);
			return PT_OK;
		}
		if (rv != PT_ERR_TIMEOUT)
			return rv;
		if (atomic_load(&ex->closing))
			return pt_set_error(PT_ERR_CLOSED, "executor destroyed during the receive");
		clock_gettime(CLOCK_MONOTONIC, &now);
		waited =
		    (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
		if (waited >= timeout)
			return pt_set_error(PT_ERR_TIMEOUT, "no message after %d ms", timeout);
	}
}

static pt_err op_run(void *arg)
{
	pt_async_op *op = arg;
	pt_executor *ex = op->ex;
	const pt_tensor *in = op->input.storage ? &op->input : NULL;
	pt_err rv;

	if (atomic_load(&ex->closing))
		return pt_set_error(PT_ERR_CLOSED, "cancelled: executor destroyed");
	if (op->after != NULL) {
		pthread_mutex_lock(&op->after->mu);
		rv = op->after->err;
		pthread_mutex_unlock(&op->after->mu);
		if (rv != PT_OK)
			return pt_set_error(rv,
			                    "not run: it depends on %s of microbatch %d (op %llu), "
			                    "which failed: %s",
			                    pt_async_kind_name(op->after->kind), op->after->mb,
			                    (unsigned long long)op->after->id, op->after->msg);
		if (in == NULL)
			in = &op->after->result;
	}
	switch (op->kind) {
	case PT_ASYNC_FORWARD:
		return ex->compute.forward(ex->compute.ctx, op->mb, in, &op->result);
	case PT_ASYNC_BACKWARD:
		return ex->compute.backward(ex->compute.ctx, op->mb, in, &op->result);
	case PT_ASYNC_SEND_FORWARD:
		return pt_comm_send_forward(ex->comm, op->peer, in, op->step, op->mb);
	case PT_ASYNC_SEND_BACKWARD:
		return pt_comm_send_backward(ex->comm, op->peer, in, op->step, op->mb);
	case PT_ASYNC_RECV_FORWARD:
		return run_recv(op, PT_CH_FORWARD);
	case PT_ASYNC_RECV_BACKWARD:
		return run_recv(op, PT_CH_BACKWARD);
	default:
		return pt_set_error(PT_ERR_INVALID, "unknown op kind %d", (int)op->kind);
	}
}

/* Called after op_run, or with PT_ERR_CLOSED when the stream cancelled it. */
static void op_complete(void *arg, pt_err rv)
{
	pt_async_op *op = arg;
	pt_async_op *after, *prev;
	pthread_mutex_lock(&op->mu);
	op->err = rv;
	if (rv != PT_OK) {
		snprintf(op->msg, sizeof(op->msg), "%s of microbatch %d (op %llu): %s",
		         pt_async_kind_name(op->kind), op->mb, (unsigned long long)op->id,
		         rv == PT_ERR_CLOSED && !*pt_last_error() ? "cancelled" : pt_last_error());
		pt_debug("%s", op->msg);
	}
	after = op->after;
	prev = op->prev_compute;
	op->prev_compute = NULL;
	/* after stays until free: op_run of a dependent may read its msg. */
	(void)after;
	op->done = true;
	pthread_cond_broadcast(&op->cv);
	pthread_mutex_unlock(&op->mu);
	pt_async_op_release(prev);
}

static pt_err noop(void *arg)
{
	return PT_OK;
}

static void stream_release(void *arg, pt_err rv)
{
	pt_async_op_release(arg);
}

static bool is_compute(pt_async_kind k)
{
	return k == PT_ASYNC_FORWARD || k == PT_ASYNC_BACKWARD;
}

static pt_err submit(pt_executor *ex, pt_async_kind kind, int mb, int peer, const pt_tensor *t,
                     pt_async_op *after, pt_async_op **out)
{
	pt_async_op *op;
	pt_stream_manager *sm;
	pt_stream *s;
	pt_err rv;

	*out = NULL;
	if (ex == NULL)
		return pt_set_error(PT_ERR_INVALID, "executor is NULL");
	if (mb < 0)
		return pt_set_error(PT_ERR_RANGE, "%s: microbatch %d < 0", pt_async_kind_name(kind),
		                    mb);
	if (!is_compute(kind) && ex->comm == NULL)
		return pt_set_error(PT_ERR_STATE, "%s: the executor has no communicator",
		                    pt_async_kind_name(kind));
	if ((kind == PT_ASYNC_FORWARD || kind == PT_ASYNC_BACKWARD ||
	     kind == PT_ASYNC_SEND_FORWARD || kind == PT_ASYNC_SEND_BACKWARD) &&
	    t == NULL && after == NULL)
		return pt_set_error(PT_ERR_INVALID,
		                    "%s of microbatch %d: no input and no op to take it from",
		                    pt_async_kind_name(kind), mb);
	if (atomic_load(&ex->closing))
		return pt_set_error(PT_ERR_CLOSED, "executor is closing");
	if ((op = calloc(1, sizeof(*op))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "async op");
	pthread_mutex_init(&op->mu, NULL);
	if ((rv = pt_exec_cond_init(&op->cv)) != PT_OK ||
	    (rv = pt_event_create(&op->event)) != PT_OK) {
		pthread_mutex_destroy(&op->mu);
		free(op);
		return rv;
	}
	atomic_init(&op->refs, 2); /* the caller's and the stream's */
	op->id = atomic_fetch_add(&ex->next_id, 1) + 1;
	op->kind = kind;
	op->mb = mb;
	op->peer = peer;
	op->step = (int64_t)atomic_load(&ex->step);
	op->ex = ex;
	if (t != NULL)
		pt_tensor_view(&op->input, t);
	if (after != NULL) {
		atomic_fetch_add(&after->refs, 1);
		op->after = after;
	}
	sm = is_compute(kind) ? ex->compute_sm : ex->comm_sm;
	op->stream_index = mb % pt_stream_manager_count(sm);
	s = pt_stream_manager_for(sm, mb);

	pthread_mutex_lock(&ex->mu);
	rv = PT_OK;
	if (after != NULL)
		rv = pt_stream_wait_event(s, after->event);
	if (rv == PT_OK && is_compute(kind) && !ex->cfg.concurrent_compute && ex->last_compute) {
		pt_async_op *prev = ex->last_compute;
		if (prev->stream_index != op->stream_index)
			rv = pt_stream_wait_event(s, prev->event);
		op->prev_compute = prev; /* takes over ex's reference */
		ex->last_compute = NULL;
	}
	if (rv == PT_OK && is_compute(kind) && !ex->cfg.concurrent_compute) {
		atomic_fetch_add(&op->refs, 1);
		ex->last_compute = op;
	}
	if (rv == PT_OK && (rv = pt_stream_enqueue(s, op_run, op_complete, op)) == PT_OK) {
		pt_event_record(op->event, s);
		if (pt_stream_enqueue(s, noop, stream_release, op) != PT_OK)
			pt_async_op_release(op); /* closing: no one else will */
	}
	pthread_mutex_unlock(&ex->mu);
	if (rv != PT_OK) {
		/* Nothing runs it: complete it with the error so waiters return. */
		op_complete(op, rv);
		pt_async_op_release(op); /* the stream's */
		pt_async_op_release(op);
		return rv;
	}
	*out = op;
	return PT_OK;
}

pt_err pt_executor_forward(pt_executor *ex, int mb, const pt_tensor *x, pt_async_op *after,
                           pt_async_op **out)
{
	return submit(ex, PT_ASYNC_FORWARD, mb, 0, x, after, out);
}
pt_err pt_executor_backward(pt_executor *ex, int mb, const pt_tensor *dy, pt_async_op *after,
                            pt_async_op **out)
{
	return submit(ex, PT_ASYNC_BACKWARD, mb, 0, dy, after, out);
}
pt_err pt_executor_send_forward(pt_executor *ex, int mb, int dst, const pt_tensor *t,
                                pt_async_op *after, pt_async_op **out)
{
	return submit(ex, PT_ASYNC_SEND_FORWARD, mb, dst, t, after, out);
}
pt_err pt_executor_send_backward(pt_executor *ex, int mb, int dst, const pt_tensor *t,
                                 pt_async_op *after, pt_async_op **out)
{
	return submit(ex, PT_ASYNC_SEND_BACKWARD, mb, dst, t, after, out);
}
pt_err pt_executor_recv_forward(pt_executor *ex, int mb, int src, pt_async_op **out)
{
	return submit(ex, PT_ASYNC_RECV_FORWARD, mb, src, NULL, NULL, out);
}
pt_err pt_executor_recv_backward(pt_executor *ex, int mb, int src, pt_async_op **out)
{
	return submit(ex, PT_ASYNC_RECV_BACKWARD, mb, src, NULL, NULL, out);
}

/* ---- lifecycle ---- */

pt_err pt_executor_create(pt_executor **out, const pt_exec_compute *compute, pt_comm *comm,
                          const pt_executor_config *cfg)
{
	pt_executor *ex;
	pt_err rv;
	*out = NULL;
	if (compute == NULL || compute->forward == NULL || compute->backward == NULL)
		return pt_set_error(PT_ERR_INVALID,
		                    "executor: forward and backward callbacks needed");
	if ((ex = calloc(1, sizeof(*ex))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "executor");
	ex->compute = *compute;
	ex->comm = comm;
	if (cfg)
		ex->cfg = *cfg;
	if (ex->cfg.n_compute == 0)
		ex->cfg.n_compute = 2;
	if (ex->cfg.n_comm == 0)
		ex->cfg.n_comm = 2;
	atomic_init(&ex->closing, false);
	atomic_init(&ex->next_id, 0);
	atomic_init(&ex->step, (long long)ex->cfg.step);
	pthread_mutex_init(&ex->mu, NULL);
	pthread_mutex_init(&ex->rx_mu, NULL);
	if ((rv = pt_stream_manager_create(&ex->compute_sm, "compute", ex->cfg.n_compute)) !=
	        PT_OK ||
	    (rv = pt_stream_manager_create(&ex->comm_sm, "comm", ex->cfg.n_comm)) != PT_OK) {
		pt_executor_destroy(ex);
		return rv;
	}
	*out = ex;
	return PT_OK;
}

void pt_executor_destroy(pt_executor *ex)
{
	if (ex == NULL)
		return;
	atomic_store(&ex->closing, true);
	/* Workers finish their current item (receives stop within a slice);
	 * everything queued is cancelled with PT_ERR_CLOSED. */
	pt_stream_manager_destroy(ex->compute_sm);
	pt_stream_manager_destroy(ex->comm_sm);
	pt_async_op_release(ex->last_compute);
	while (ex->stash) {
		stash_entry *e = ex->stash;
		ex->stash = e->next;
		pt_msg_fini(&e->msg);
		free(e);
	}
	pthread_mutex_destroy(&ex->mu);
	pthread_mutex_destroy(&ex->rx_mu);
	free(ex);
}

void pt_executor_set_step(pt_executor *ex, int64_t step)
{
	atomic_store(&ex->step, (long long)step);
}

int pt_executor_num_compute(const pt_executor *ex)
{
	return pt_stream_manager_count(ex->compute_sm);
}
int pt_executor_num_comm(const pt_executor *ex)
{
	return pt_stream_manager_count(ex->comm_sm);
}
pt_stream *pt_executor_compute_stream(pt_executor *ex, int mb)
{
	return pt_stream_manager_for(ex->compute_sm, mb);
}
pt_stream *pt_executor_comm_stream(pt_executor *ex, int mb)
{
	return pt_stream_manager_for(ex->comm_sm, mb);
}
pt_stream_manager *pt_executor_compute_streams(pt_executor *ex)
{
	return ex->compute_sm;
}
pt_stream_manager *pt_executor_comm_streams(pt_executor *ex)
{
	return ex->comm_sm;
}

pt_err pt_executor_sync_compute(pt_executor *ex, int timeout_ms)
{
	return pt_stream_manager_sync_all(ex->compute_sm, timeout_ms);
}
pt_err pt_executor_sync_comm(pt_executor *ex, int timeout_ms)
{
	return pt_stream_manager_sync_all(ex->comm_sm, timeout_ms);
}
pt_err pt_executor_sync_all(pt_executor *ex, int timeout_ms)
{
	PT_TRY(pt_executor_sync_compute(ex, timeout_ms));
	return pt_executor_sync_comm(ex, timeout_ms);
}

/* ---- pt_model adapter ---- */

static pt_err fresh_copy(pt_tensor *dst, const pt_tensor *src)
{
	pt_err rv;
	if ((rv = pt_tensor_init(dst, src->dtype, src->ndim, src->shape)) != PT_OK)
		return rv;
	if ((rv = pt_copy(dst, src)) != PT_OK)
		pt_tensor_fini(dst);
	return rv;
}

static pt_err model_forward(void *ctx, int mb, const pt_tensor *x, pt_tensor *y)
{
	pt_exec_model *em = ctx;
	int slot = mb % em->n_slots;
	const pt_tensor *out;
	pt_tensor_fini(&em->inputs[slot]);
	pt_tensor_view(&em->inputs[slot], x);
	PT_TRY(pt_model_forward(em->model, slot, &em->inputs[slot], &out, em->training, em->step,
	                        (uint64_t)mb));
	return fresh_copy(y, out);
}

static pt_err model_backward(void *ctx, int mb, const pt_tensor *dy, pt_tensor *dx)
{
	pt_exec_model *em = ctx;
	int slot = mb % em->n_slots;
	const pt_tensor *g = NULL;
	pt_err rv = pt_model_backward(em->model, slot, dy, &g);
	if (rv == PT_OK && g != NULL)
		rv = fresh_copy(dx, g);
	pt_tensor_fini(&em->inputs[slot]);
	return rv;
}

pt_err pt_exec_model_init(pt_exec_model *em, pt_model *m, int n_slots, bool training)
{
	memset(em, 0, sizeof(*em));
	if (n_slots < 1)
		return pt_set_error(PT_ERR_INVALID, "executor model adapter: %d slots", n_slots);
	if ((em->inputs = calloc((size_t)n_slots, sizeof(pt_tensor))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "executor model adapter");
	em->model = m;
	em->n_slots = n_slots;
	em->training = training;
	return PT_OK;
}

void pt_exec_model_fini(pt_exec_model *em)
{
	if (em == NULL || em->inputs == NULL)
		return;
	for (int i = 0; i < em->n_slots; i++)
		pt_tensor_fini(&em->inputs[i]);
	free(em->inputs);
	em->inputs = NULL;
}

pt_exec_compute pt_exec_model_compute(pt_exec_model *em)
{
	return (pt_exec_compute){model_forward, model_backward, em};
}
