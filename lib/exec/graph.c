/* graph.c - named CPU graphs over dispatcher tapes, and the workspace pool.
 *
 * Locking: the manager mutex guards the name table and the pool; each entry
 * has its own mutex held for a whole execution, so one name runs one at a
 * time while different names run in parallel. Entries are reference-counted
 * so remove/clear may drop a name while it executes.
 */
#include "graph.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"

typedef struct pool_block {
	struct pool_block *next;
	void *ptr;
	size_t size;
	bool used;
} pool_block;

typedef enum entry_state { ENTRY_WARMING, ENTRY_CAPTURED, ENTRY_UNCAPTURABLE } entry_state;

typedef struct entry {
	struct entry *next;
	atomic_int refs;
	pthread_mutex_t run_mu;
	char *name;
	_Atomic uint64_t runs; /* executions started */
	_Atomic int state;     /* entry_state */
	pt_op_tape *reference; /* last warm-up's recording */
	pt_op_tape *tape;      /* the graph */
	pool_block *ws;
	uint64_t replays;
} entry;

struct pt_graph_manager {
	pthread_mutex_t mu;
	int warmup;
	entry *entries;
	pool_block *blocks;
};

static const char *const phase_names[PT_PHASE_COUNT] = {
    "Phase_Forward", "Phase_Backward", "Phase_OptimizerStep", "Phase_ForwardBackward",
    "Phase_FullTrainingStep"};

const char *pt_graph_phase_name(pt_graph_phase p)
{
	return (unsigned)p < PT_PHASE_COUNT ? phase_names[p] : "Phase_Unknown";
}

/* ---- pool (called with m->mu held) ---- */

static pool_block *pool_alloc(pt_graph_manager *m, size_t size)
{
	pool_block *b, *best = NULL;
	size = (size + 4095) & ~(size_t)4095;
	if (size == 0)
		size = 4096;
	for (b = m->blocks; b; b = b->next)
		if (!b->used && b->size >= size && (best == NULL || b->size < best->size))
			best = b;
	if (best == NULL) {
		if ((best = calloc(1, sizeof(*best))) == NULL ||
		    (best->ptr = aligned_alloc(64, size)) == NULL) {
			free(best);
			pt_set_error(PT_ERR_NOMEM, "graph pool: %zu bytes", size);
			return NULL;
		}
		best->size = size;
		best->next = m->blocks;
		m->blocks = best;
	}
	best->used = true;
	return best;
}

pt_graph_pool_stats pt_graph_manager_pool(pt_graph_manager *m)
{
	pt_graph_pool_stats st = {0};
	pthread_mutex_lock(&m->mu);
	for (pool_block *b = m->blocks; b; b = b->next) {
		st.reserved += b->size;
		st.in_use += b->used ? b->size : 0;
		st.blocks++;
	}
	pthread_mutex_unlock(&m->mu);
	return st;
}

/* ---- entries ---- */

static void entry_release(pt_graph_manager *m, entry *e)
{
	if (atomic_fetch_sub(&e->refs, 1) != 1)
		return;
	pt_op_tape_destroy(e->reference);
	pt_op_tape_destroy(e->tape);
	if (e->ws) {
		pthread_mutex_lock(&m->mu);
		e->ws->used = false;
		pthread_mutex_unlock(&m->mu);
	}
	pthread_mutex_destroy(&e->run_mu);
	free(e->name);
	free(e);
}

pt_err pt_graph_manager_create(pt_graph_manager **out, int warmup, size_t pool_bytes)
{
	pt_graph_manager *m = calloc(1, sizeof(*m));
	*out = NULL;
	if (m == NULL)
		return pt_set_error(PT_ERR_NOMEM, "graph manager");
	pthread_mutex_init(&m->mu, NULL);
	m->warmup = warmup < 0 ? PT_GRAPH_WARMUP_DEFAULT : warmup;
	if (pool_bytes > 0) {
		pool_block *b = pool_alloc(m, pool_bytes);
		if (b == NULL) {
			pt_graph_manager_destroy(m);
			return PT_ERR_NOMEM;
		}
		b->used = false;
	}
	*out = m;
	return PT_OK;
}

void pt_graph_manager_destroy(pt_graph_manager *m)
{
	if (m == NULL)
		return;
	pt_graph_manager_clear(m);
	while (m->blocks) {
		pool_block *b = m->blocks;
		m->blocks = b->next;
		free(b->ptr);
		free(b);
	}
	pthread_mutex_destroy(&m->mu);
	free(m);
}

/* Finds or makes name's entry and takes a reference (m->mu held). */
static entry *entry_get(pt_graph_manager *m, const char *name, bool create)
{
	entry *e;
	for (e = m->entries; e; e = e->next)
		if (strcmp(e->name, name) == 0)
			break;
	if (e == NULL && create) {
		if ((e = calloc(1, sizeof(*e))) == NULL || (e->name = strdup(name)) == NULL) {
			free(e);
			pt_set_error(PT_ERR_NOMEM, "graph entry %s", name);
			return NULL;
		}
		atomic_init(&e->refs, 1); /* the table's */
		pthread_mutex_init(&e->run_mu, NULL);
		e->next = m->entries;
		m->entries = e;
	}
	if (e)
		atomic_fetch_add(&e->refs, 1);
	return e;
}

/* Runs fn while d records into a new tape (*tape on success, else NULL). */
static pt_err run_recorded(pt_graph_fn fn, void *arg, pt_stream *stream, pt_op_tape **tape)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_op_tape *t;
	pt_err rv;
	*tape = NULL;
	if (d == NULL)
		return pt_set_error(PT_ERR_NOMEM, "no dispatcher");
	PT_TRY(pt_op_tape_create(&t));
	if ((rv = pt_dispatcher_capture_begin(d, t)) != PT_OK) {
		pt_op_tape_destroy(t);
		return rv;
	}
	rv = fn(arg, stream);
	if (rv == PT_OK && pt_dispatcher_mode(d) == PT_EAGER)
		rv = pt_dispatcher_flush(d); /* nothing of the run may stay queued */
	pt_dispatcher_capture_end(d);
	if (rv != PT_OK) {
		pt_op_tape_destroy(t);
		return rv;
	}
	pt_op_tape_prune(t); /* per-call temporaries would defeat validation */
	*tape = t;
	return PT_OK;
}

static pt_err execute_locked(pt_graph_manager *m, entry *e, pt_graph_fn fn, void *arg,
                             pt_stream *stream, pt_graph_run *how)
{
	uint64_t n = e->runs++;
	pt_op_tape *t;
	const char *why = NULL;

	if (e->state == ENTRY_CAPTURED) {
		*how = PT_GRAPH_RAN_REPLAY;
		e->replays++;
		return pt_op_tape_replay(e->tape, e->ws ? e->ws->ptr : NULL);
	}
	if (e->state == ENTRY_UNCAPTURABLE) {
		*how = PT_GRAPH_RAN_FALLBACK;
		return fn(arg, stream);
	}
	*how = PT_GRAPH_RAN_WARMUP;
	if (n + 1 < (uint64_t)m->warmup)
		return fn(arg, stream);
	if (n + 1 == (uint64_t)m->warmup) { /* the last warm-up: the reference */
		pt_op_tape_destroy(e->reference);
		e->reference = NULL;
		return run_recorded(fn, arg, stream, &e->reference);
	}
	PT_TRY(run_recorded(fn, arg, stream, &t));
	if (!pt_op_tape_ok(t))
		why = "recording ran out of memory";
	else if (pt_op_tape_len(t) == 0)
		why = "no ops were recorded";
	else if (e->reference != NULL && !pt_op_tape_same(e->reference, t))
		why = "ops, params or buffers differ between executions";
	else if (m->warmup > 0 && e->reference == NULL)
		why = "the warm-up reference is missing (a warm-up failed)";
	if (why != NULL) {
		pt_op_tape_destroy(t);
		pt_op_tape_destroy(e->reference);
		e->reference = NULL;
		/* a missing reference is retried: capture again after a new warm-up */
		if (m->warmup > 0 && strstr(why, "reference") != NULL) {
			e->runs = (uint64_t)m->warmup - 1;
			return PT_OK;
		}
		pt_debug("graph %s cannot be captured: %s; it runs eagerly", e->name, why);
		e->state = ENTRY_UNCAPTURABLE;
		*how = PT_GRAPH_RAN_FALLBACK;
		return PT_OK;
	}
	pthread_mutex_lock(&m->mu);
	e->ws = pool_alloc(m, pt_op_tape_workspace(t));
	pthread_mutex_unlock(&m->mu);
	if (e->ws == NULL) {
		pt_op_tape_destroy(t);
		return PT_ERR_NOMEM;
	}
	pt_op_tape_destroy(e->reference);
	e->reference = NULL;
	e->tape = t;
	e->state = ENTRY_CAPTURED;
	*how = PT_GRAPH_RAN_CAPTURE;
	return PT_OK;
}

pt_err pt_graph_manager_execute(pt_graph_manager *m, const char *name, pt_graph_fn fn, void *arg,
                                pt_stream *stream, pt_graph_run *how)
{
	entry *e;
	pt_graph_run dummy;
	pt_err rv;
	if (m == NULL || name == NULL || fn == NULL)
		return pt_set_error(PT_ERR_INVALID,
		                    "graph execute: NULL manager, name or function");
	pthread_mutex_lock(&m->mu);
	e = entry_get(m, name, true);
	pthread_mutex_unlock(&m->mu);
	if (e == NULL)
		return PT_ERR_NOMEM;
	pthread_mutex_lock(&e->run_mu);
	rv = execute_locked(m, e, fn, arg, stream, how ? how : &dummy);
	pthread_mutex_unlock(&e->run_mu);
	entry_release(m, e);
	return rv;
}

pt_err pt_graph_manager_execute_phase(pt_graph_manager *m, pt_graph_phase phase, pt_graph_fn fn,
                                      void *arg, pt_stream *stream, pt_graph_run *how)
{
	if ((unsigned)phase >= PT_PHASE_COUNT)
		return pt_set_error(PT_ERR_INVALID, "unknown graph phase %d", (int)phase);
	return pt_graph_manager_execute(m, pt_graph_phase_name(phase), fn, arg, stream, how);
}

pt_err pt_graph_manager_get(pt_graph_manager *m, const char *name, pt_graph_info *info)
{
	entry *e;
	pt_err rv = PT_OK;
	pthread_mutex_lock(&m->mu);
	e = entry_get(m, name, false);
	pthread_mutex_unlock(&m->mu);
	if (e == NULL)
		return pt_set_error(PT_ERR_NOTFOUND, "graph %s is not known", name);
	pthread_mutex_lock(&e->run_mu);
	if (e->state != ENTRY_CAPTURED)
		rv = pt_set_error(PT_ERR_NOTFOUND, "graph %s is not captured (%llu runs)", name,
		                  (unsigned long long)e->runs);
	else if (info)
		*info = (pt_graph_info){pt_op_tape_len(e->tape), e->ws->size, e->replays};
	pthread_mutex_unlock(&e->run_mu);
	entry_release(m, e);
	return rv;
}

pt_err pt_graph_manager_remove(pt_graph_manager *m, const char *name)
{
	entry *e = NULL;
	pthread_mutex_lock(&m->mu);
	for (entry **pp = &m->entries; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->name, name) == 0) {
			e = *pp;
			*pp = e->next;
			break;
		}
	pthread_mutex_unlock(&m->mu);
	if (e == NULL)
		return pt_set_error(PT_ERR_NOTFOUND, "graph %s is not known", name);
	entry_release(m, e);
	return PT_OK;
}

void pt_graph_manager_clear(pt_graph_manager *m)
{
	entry *list;
	pthread_mutex_lock(&m->mu);
	list = m->entries;
	m->entries = NULL;
	pthread_mutex_unlock(&m->mu);
	while (list) {
		entry *e = list;
		list = e->next;
		entry_release(m, e);
	}
}

int pt_graph_manager_count(pt_graph_manager *m)
{
	int n = 0;
	pthread_mutex_lock(&m->mu);
	for (entry *e = m->entries; e; e = e->next)
		n += e->state == ENTRY_CAPTURED; /* written under run_mu; a racy read is benign */
	pthread_mutex_unlock(&m->mu);
	return n;
}

bool pt_graph_manager_is_capture_complete(pt_graph_manager *m, const char *name)
{
	bool done = true, any = false;
	pthread_mutex_lock(&m->mu);
	for (entry *e = m->entries; e; e = e->next)
		if (name == NULL || strcmp(e->name, name) == 0) {
			any = true;
			done = done && e->runs >= (uint64_t)m->warmup;
		}
	pthread_mutex_unlock(&m->mu);
	return any && done;
}
