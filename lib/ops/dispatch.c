/* dispatch.c - eager and deferred execution of op calls.
 *
 * Deferred mode copies each call (with its tensor views and a reference to
 * every storage it touches) into a queue; flush plans all, then runs all in
 * order. Workspace is one buffer per dispatcher that only grows, so a steady
 * training step allocates nothing.
 */
#include "dispatch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "log.h"

extern const pt_op_def pt_op_defs[PT_OP_COUNT];

typedef struct queued_call {
	pt_op_call call;
	pt_tensor in_t[PT_OP_MAX_IN];
	pt_tensor out_t[PT_OP_MAX_OUT];
} queued_call;

struct pt_dispatcher {
	int deferred_depth;
	queued_call *queue;
	size_t n_queued, cap_queued;
	void *workspace;
	size_t workspace_size;
	bool inject[PT_OP_COUNT];
	bool flushing;
	pt_dispatch_stats stats;
	pt_op_tape *capture; /* attached tape, or NULL */
};

struct pt_op_tape {
	queued_call **calls; /* one allocation per call: pointers into it stay valid */
	size_t n, cap;
	size_t workspace;
	bool oom;
};

static _Thread_local pt_dispatcher *current;
static _Thread_local pt_precision precision;

void pt_set_precision(pt_precision p)
{
	precision = p;
}

pt_precision pt_get_precision(void)
{
	return precision;
}

static _Thread_local pt_dispatcher *thread_default;

/* Frees a thread's default dispatcher when the thread exits. */
static pthread_key_t default_key;
static pthread_once_t default_key_once = PTHREAD_ONCE_INIT;

static void free_thread_default(void *d)
{
	pt_dispatcher_destroy(d);
}

static void make_default_key(void)
{
	pthread_key_create(&default_key, free_thread_default);
}

const char *pt_op_name(pt_op op)
{
	return (unsigned)op < PT_OP_COUNT ? pt_op_defs[op].name : "unknown-op";
}

pt_err pt_dispatcher_create(pt_dispatcher **out)
{
	pt_dispatcher *d = calloc(1, sizeof(*d));
	*out = NULL;
	if (d == NULL)
		return pt_set_error(PT_ERR_NOMEM, "dispatcher");
	*out = d;
	return PT_OK;
}

static void mark_outputs(queued_call *q, pt_state st)
{
	for (int i = 0; i < q->call.n_out; i++) {
		pt_tensor *t = q->call.out[i];
		if (t == NULL)
			continue;
		atomic_store(&t->storage->state, st);
		atomic_store(&t->storage->pending_in, NULL);
	}
}

static void release_call(queued_call *q)
{
	for (int i = 0; i < q->call.n_in; i++)
		if (q->call.in[i])
			pt_tensor_fini(&q->in_t[i]);
	for (int i = 0; i < q->call.n_out; i++)
		if (q->call.out[i])
			pt_tensor_fini(&q->out_t[i]);
}

/* Drops the whole queue; outputs get state st. */
static void clear_queue(pt_dispatcher *d, pt_state st)
{
	for (size_t i = 0; i < d->n_queued; i++)
		mark_outputs(&d->queue[i], st);
	for (size_t i = 0; i < d->n_queued; i++)
		release_call(&d->queue[i]);
	d->n_queued = 0;
}

void pt_dispatcher_destroy(pt_dispatcher *d)
{
	if (d == NULL)
		return;
	clear_queue(d, PT_INVALID);
	if (current == d)
		current = NULL;
	if (thread_default == d) {
		thread_default = NULL;
		pthread_setspecific(default_key, NULL); /* the key exists: d was made by it */
	}
	free(d->queue);
	free(d->workspace);
	free(d);
}

pt_dispatcher *pt_dispatcher_current(void)
{
	if (current != NULL)
		return current;
	if (thread_default == NULL) {
		if (pt_dispatcher_create(&thread_default) != PT_OK)
			return NULL;
		pthread_once(&default_key_once, make_default_key);
		pthread_setspecific(default_key, thread_default);
	}
	return thread_default;
}

pt_dispatcher *pt_dispatcher_set_current(pt_dispatcher *d)
{
	pt_dispatcher *prev = pt_dispatcher_current();
	current = d;
	return prev;
}

void pt_deferred_begin(pt_dispatcher *d)
{
	d->deferred_depth++;
}

pt_err pt_deferred_end(pt_dispatcher *d)
{
	if (d->deferred_depth <= 0)
		return pt_set_error(PT_ERR_STATE, "deferred_end without deferred_begin");
	if (--d->deferred_depth > 0)
		return PT_OK;
	return pt_dispatcher_flush(d);
}

pt_dispatch_mode pt_dispatcher_mode(const pt_dispatcher *d)
{
	return d->deferred_depth > 0 ? PT_DEFERRED : PT_EAGER;
}

size_t pt_dispatcher_pending(const pt_dispatcher *d)
{
	return d->n_queued;
}

pt_dispatch_stats pt_dispatcher_stats(const pt_dispatcher *d)
{
	return d->stats;
}

void pt_dispatcher_inject_failure(pt_dispatcher *d, pt_op op, bool armed)
{
	if ((unsigned)op < PT_OP_COUNT)
		d->inject[op] = armed;
}

static pt_err ensure_workspace(pt_dispatcher *d, size_t need)
{
	void *ws;
	if (need <= d->workspace_size)
		return PT_OK;
	need = (need + 4095) & ~(size_t)4095;
	ws = aligned_alloc(64, need);
	if (ws == NULL)
		return pt_set_error(PT_ERR_NOMEM, "op workspace of %zu bytes", need);
	free(d->workspace);
	d->workspace = ws;
	d->workspace_size = need;
	return PT_OK;
}

static void tape_append(pt_op_tape *t, const pt_op_call *c)
{
	queued_call *q;
	if (t->oom)
		return;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		queued_call **nc = realloc(t->calls, cap * sizeof(*nc));
		if (nc == NULL) {
			t->oom = true;
			return;
		}
		t->calls = nc;
		t->cap = cap;
	}
	if ((q = malloc(sizeof(*q))) == NULL) {
		t->oom = true;
		return;
	}
	q->call = *c;
	for (int k = 0; k < c->n_in; k++)
		if (c->in[k]) {
			pt_tensor_view(&q->in_t[k], c->in[k]);
			q->call.in[k] = &q->in_t[k];
		}
	for (int k = 0; k < c->n_out; k++)
		if (c->out[k]) {
			pt_tensor_view(&q->out_t[k], c->out[k]);
			q->call.out[k] = &q->out_t[k];
		}
	if (c->workspace > t->workspace)
		t->workspace = c->workspace;
	t->calls[t->n++] = q;
}

/* The calling thread's kernel timer (pt_dispatch_time_kernels), or NULL. */
static _Thread_local pt_kernel_timer *kernel_timer;

void pt_dispatch_time_kernels(pt_kernel_timer *t)
{
	kernel_timer = t;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The device of the call's first operand that lives on one (not the CPU),
 * or NULL. */
static const pt_device *call_device(const pt_op_call *c)
{
	for (int k = 0; k < c->n_out; k++)
		if (c->out[k] && c->out[k]->storage->device.kind != PT_DEV_CPU)
			return &c->out[k]->storage->device;
	for (int k = 0; k < c->n_in; k++)
		if (c->in[k] && c->in[k]->storage->device.kind != PT_DEV_CPU)
			return &c->in[k]->storage->device;
	return NULL;
}

/* Runs one planned kernel, timed when the thread has a kernel timer. */
static pt_err run_kernel(const pt_op_call *c, void *workspace)
{
	pt_kernel_timer *kt = kernel_timer;
	const pt_device *dev;
	double t0, dt;
	pt_err rv;
	if (kt == NULL)
		return c->kernel(c, workspace);
	dev = kt->sync_device ? call_device(c) : NULL;
	if (dev != NULL)
		(void)pt_backend_sync(*dev);
	t0 = mono_s();
	rv = c->kernel(c, workspace);
	if (dev != NULL && rv == PT_OK)
		rv = pt_backend_sync(*dev);
	dt = mono_s() - t0;
	kt->seconds += dt;
	kt->calls++;
	kt->op_seconds[c->op] += dt;
	kt->op_calls[c->op]++;
	return rv;
}

static pt_err run_planned(pt_dispatcher *d, const pt_op_call *c)
{
	pt_err rv;
	if (d->inject[c->op])
		return pt_set_error(PT_ERR_BACKEND, "%s: injected failure", pt_op_name(c->op));
	rv = run_kernel(c, d->workspace);
	if (rv == PT_OK && d->capture != NULL)
		tape_append(d->capture, c);
	return rv;
}

pt_err pt_op_tape_create(pt_op_tape **out)
{
	if ((*out = calloc(1, sizeof(**out))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "op tape");
	return PT_OK;
}

void pt_op_tape_destroy(pt_op_tape *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->n; i++) {
		release_call(t->calls[i]);
		free(t->calls[i]);
	}
	free(t->calls);
	free(t);
}

size_t pt_op_tape_len(const pt_op_tape *t)
{
	return t->n;
}

size_t pt_op_tape_workspace(const pt_op_tape *t)
{
	return t->workspace;
}

bool pt_op_tape_ok(const pt_op_tape *t)
{
	return !t->oom;
}

static bool same_tensor(const pt_tensor *a, const pt_tensor *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	if (pt_tensor_data(a) != pt_tensor_data(b) || a->dtype != b->dtype || a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->shape[i] != b->shape[i] || a->strides[i] != b->strides[i])
			return false;
	return true;
}

bool pt_op_tape_same(const pt_op_tape *a, const pt_op_tape *b)
{
	if (a->n != b->n || a->oom || b->oom)
		return false;
	for (size_t i = 0; i < a->n; i++) {
		const pt_op_call *x = &a->calls[i]->call, *y = &b->calls[i]->call;
		if (x->op != y->op || x->kernel != y->kernel || x->workspace != y->workspace ||
		    memcmp(&x->p, &y->p, sizeof(x->p)) != 0)
			return false;
		for (int k = 0; k < x->n_in; k++)
			if (!same_tensor(x->in[k], y->in[k]))
				return false;
		for (int k = 0; k < x->n_out; k++)
			if (!same_tensor(x->out[k], y->out[k]))
				return false;
	}
	return true;
}

/* Views of storage st held by the tape. */
static int tape_refs(const pt_op_tape *t, const pt_storage *st)
{
	int n = 0;
	for (size_t i = 0; i < t->n; i++) {
		const pt_op_call *c = &t->calls[i]->call;
		for (int k = 0; k < c->n_in; k++)
			n += c->in[k] != NULL && c->in[k]->storage == st;
		for (int k = 0; k < c->n_out; k++)
			n += c->out[k] != NULL && c->out[k]->storage == st;
	}
	return n;
}

/* A storage only the tape still references (its owner freed it). */
static bool tape_private(const pt_op_tape *t, const pt_storage *st)
{
	return st->parent == NULL && atomic_load(&st->refs) == tape_refs(t, st);
}

static bool read_later(const pt_op_tape *t, size_t from, const bool *keep, const pt_storage *st)
{
	for (size_t j = from; j < t->n; j++) {
		const pt_op_call *c = &t->calls[j]->call;
		if (!keep[j])
			continue;
		for (int k = 0; k < c->n_in; k++)
			if (c->in[k] != NULL && c->in[k]->storage == st)
				return true;
	}
	return false;
}

size_t pt_op_tape_prune(pt_op_tape *t)
{
	bool *keep;
	size_t kept = 0, n = t->n;
	if (t->n == 0 || (keep = malloc(t->n)) == NULL)
		return 0;
	for (size_t i = t->n; i-- > 0;) {
		const pt_op_call *c = &t->calls[i]->call;
		bool dead = true;
		for (int k = 0; k < c->n_out && dead; k++)
			if (c->out[k] != NULL && (!tape_private(t, c->out[k]->storage) ||
			                          read_later(t, i + 1, keep, c->out[k]->storage)))
				dead = false;
		keep[i] = !dead;
	}
	for (size_t i = 0; i < n; i++) {
		if (keep[i]) {
			t->calls[kept++] = t->calls[i];
		} else {
			release_call(t->calls[i]);
			free(t->calls[i]);
		}
	}
	t->n = kept;
	free(keep);
	return n - kept;
}

pt_err pt_op_tape_replay(const pt_op_tape *t, void *workspace)
{
	for (size_t i = 0; i < t->n; i++) {
		queued_call *q = t->calls[i];
		pt_err rv = run_kernel(&q->call, workspace);
		if (rv != PT_OK) {
			char detail[512];
			snprintf(detail, sizeof(detail), "%s", pt_last_error());
			for (size_t j = i; j < t->n; j++)
				mark_outputs(t->calls[j], PT_INVALID);
			return pt_set_error(rv, "graph replay failed at op %zu/%zu (%s): %s", i + 1,
			                    t->n, pt_op_name(q->call.op), detail);
		}
		mark_outputs(q, PT_READY);
	}
	return PT_OK;
}

pt_err pt_dispatcher_capture_begin(pt_dispatcher *d, pt_op_tape *t)
{
	if (d->capture != NULL)
		return pt_set_error(PT_ERR_STATE, "dispatcher is already capturing");
	d->capture = t;
	return PT_OK;
}

pt_op_tape *pt_dispatcher_capture_end(pt_dispatcher *d)
{
	pt_op_tape *t = d->capture;
	d->capture = NULL;
	return t;
}

pt_err pt_dispatcher_flush(pt_dispatcher *d)
{
	size_t need = 0, i = 0;
	pt_err rv = PT_OK;
	const char *stage = "plan";

	if (d->n_queued == 0 || d->flushing)
		return PT_OK;
	d->flushing = true;
	for (i = 0; i < d->n_queued; i++) {
		pt_op_call *c = &d->queue[i].call;
		if ((rv = pt_op_defs[c->op].plan(c)) != PT_OK)
			goto fail;
		if (c->workspace > need)
			need = c->workspace;
	}
	if ((rv = ensure_workspace(d, need)) != PT_OK)
		goto fail;
	stage = "impl";
	for (i = 0; i < d->n_queued; i++)
		if ((rv = run_planned(d, &d->queue[i].call)) != PT_OK)
			goto fail;
	d->stats.flushes++;
	clear_queue(d, PT_READY);
	d->flushing = false;
	return PT_OK;
fail : {
	char detail[512];
	size_t n = d->n_queued;
	snprintf(detail, sizeof(detail), "%s", pt_last_error());
	pt_set_error(rv,
	             "deferred flush failed in %s of op %zu/%zu (%s): %s; %zu queued ops dropped",
	             stage, i + 1, n, pt_op_name(d->queue[i < n ? i : 0].call.op), detail, n);
	pt_debug("%s", pt_last_error());
	clear_queue(d, PT_INVALID);
	d->stats.failed_flushes++;
	d->flushing = false;
	return rv;
}
}

/* Inputs must be valid; eager reads of pending data and any write to pending
 * data first flush the queue that owns it (a sync boundary). */
static pt_err check_operands(pt_dispatcher *d, const pt_op_call *c, bool eager)
{
	for (int pass = 0; pass < 2; pass++) {
		int n = pass == 0 ? c->n_in : c->n_out;
		for (int i = 0; i < n; i++) {
			const pt_tensor *t = pass == 0 ? c->in[i] : c->out[i];
			pt_storage *s;
			if (t == NULL)
				continue;
			s = t->storage;
			if (atomic_load(&s->state) == PT_PENDING) {
				pt_dispatcher *owner = atomic_load(&s->pending_in);
				if (owner != NULL && (eager || owner != d))
					PT_TRY(pt_dispatcher_flush(owner));
			}
			if (pass == 0 && atomic_load(&s->state) == PT_INVALID)
				return pt_set_error(
				    PT_ERR_PENDING_INVALID,
				    "%s: input %d is invalid (its deferred flush failed)",
				    pt_op_name(c->op), i);
		}
	}
	return PT_OK;
}

static pt_err enqueue(pt_dispatcher *d, const pt_op_call *c)
{
	queued_call *q;
	if (d->n_queued == d->cap_queued) {
		size_t cap = d->cap_queued ? d->cap_queued * 2 : 64;
		queued_call *nq = realloc(d->queue, cap * sizeof(*nq));
		if (nq == NULL)
			return pt_set_error(PT_ERR_NOMEM, "deferred queue of %zu calls", cap);
		/* Calls point into their own entries: fix the pointers after a move. */
		for (size_t i = 0; i < d->n_queued; i++) {
			for (int k = 0; k < nq[i].call.n_in; k++)
				if (nq[i].call.in[k])
					nq[i].call.in[k] = &nq[i].in_t[k];
			for (int k = 0; k < nq[i].call.n_out; k++)
				if (nq[i].call.out[k])
					nq[i].call.out[k] = &nq[i].out_t[k];
		}
		d->queue = nq;
		d->cap_queued = cap;
	}
	q = &d->queue[d->n_queued++];
	q->call = *c;
	for (int k = 0; k < c->n_in; k++)
		if (c->in[k]) {
			pt_tensor_view(&q->in_t[k], c->in[k]);
			q->call.in[k] = &q->in_t[k];
		}
	for (int k = 0; k < c->n_out; k++)
		if (c->out[k]) {
			pt_tensor_view(&q->out_t[k], c->out[k]);
			q->call.out[k] = &q->out_t[k];
			atomic_store(&c->out[k]->storage->state, PT_PENDING);
			atomic_store(&c->out[k]->storage->pending_in, d);
		}
	if (d->n_queued > d->stats.queued_peak)
		d->stats.queued_peak = d->n_queued;
	return PT_OK;
}

pt_err pt_dispatch_on(pt_dispatcher *d, pt_op_call *c)
{
	const pt_op_def *def;
	bool eager;

	if (d == NULL)
		return pt_set_error(PT_ERR_NOMEM, "no dispatcher");
	if ((unsigned)c->op >= PT_OP_COUNT)
		return pt_set_error(PT_ERR_INVALID, "unknown op %d", (int)c->op);
	def = &pt_op_defs[c->op];
	c->n_in = def->n_in;
	c->n_out = def->n_out;
	c->prec = (uint8_t)precision;
	for (int i = 0; i < c->n_in; i++)
		if (c->in[i] && c->in[i]->storage == NULL)
			return pt_set_error(PT_ERR_INVALID, "%s: input %d has no storage",
			                    def->name, i);
	for (int i = 0; i < c->n_out; i++)
		if (c->out[i] && c->out[i]->storage == NULL)
			return pt_set_error(PT_ERR_INVALID, "%s: output %d has no storage",
			                    def->name, i);
	PT_TRY(def->meta(c));
	eager = d->deferred_depth == 0;
	PT_TRY(check_operands(d, c, eager));
	d->stats.dispatched++;
	if (!eager)
		return enqueue(d, c);
	PT_TRY(def->plan(c));
	PT_TRY(ensure_workspace(d, c->workspace));
	PT_TRY(run_planned(d, c));
	for (int i = 0; i < c->n_out; i++)
		if (c->out[i])
			atomic_store(&c->out[i]->storage->state, PT_READY);
	return PT_OK;
}

pt_err pt_dispatch(pt_op_call *c)
{
	return pt_dispatch_on(pt_dispatcher_current(), c);
}
