/* graph.h - the graph manager (seed 002): named graphs, warm-up, capture,
 * validation, replay, one shared memory pool; CPU backend.
 *
 * The first `warmup` executions of a name (default 3) run the function
 * eagerly. The last warm-up run is recorded as a reference; the next run is
 * captured: it runs eagerly while the calling thread's dispatcher records
 * every planned kernel (pt_op_tape), and the capture is valid only when it is
 * non-empty and identical to the reference (same kernels, params, shapes and
 * buffer addresses: a function whose op params change per call, such as
 * AdamW's step count, or that allocates per call, cannot be replayed and its
 * name falls back to eager execution for good). Later executions replay the
 * kernels on the same buffers with no dispatch, shape inference or
 * allocation. So replaying equals eager bitwise on the CPU.
 *
 * What a replay does not redo: host code inside the function (host reads of
 * values, host arithmetic, anything not an op). Inputs are fed by writing new
 * values into the same tensors (pt_tensor_write) before an execution.
 *
 * The memory pool belongs to the manager and serves every graph's workspace;
 * a removed graph's block is reused by later captures.
 * Thread-safety: all calls may be made from any thread; executions of one
 * name are serialised, different names run concurrently (each thread
 * captures on its own dispatcher).
 */
#ifndef PT_GRAPH_H
#define PT_GRAPH_H

#include <stddef.h>

#include "stream.h"

#define PT_GRAPH_WARMUP_DEFAULT 3

/* pt_graph_fn is the work captured under a name: ops on the calling thread's
 * dispatcher. stream is passed through from the caller (may be NULL). */
typedef pt_err (*pt_graph_fn)(void *arg, pt_stream *stream);

typedef enum pt_graph_run {
	PT_GRAPH_RAN_WARMUP,   /* eager, still warming up */
	PT_GRAPH_RAN_CAPTURE,  /* eager while capturing; the graph is now cached */
	PT_GRAPH_RAN_REPLAY,   /* the cached graph ran */
	PT_GRAPH_RAN_FALLBACK, /* eager: the name cannot be captured */
} pt_graph_run;

typedef enum pt_graph_phase {
	PT_PHASE_FORWARD,
	PT_PHASE_BACKWARD,
	PT_PHASE_OPTIMIZER_STEP,
	PT_PHASE_FORWARD_BACKWARD,
	PT_PHASE_FULL_TRAINING_STEP,
	PT_PHASE_COUNT
} pt_graph_phase;

/* pt_graph_phase_name returns the graph name of a phase ("Phase_Forward"). */
const char *pt_graph_phase_name(pt_graph_phase p);

typedef struct pt_graph_info {
	size_t n_ops;           /* recorded kernels */
	size_t workspace_bytes; /* from the pool */
	uint64_t replays;
} pt_graph_info;

typedef struct pt_graph_pool_stats {
	size_t reserved; /* bytes held by the pool */
	size_t in_use;   /* bytes lent to graphs */
	size_t blocks;
} pt_graph_pool_stats;

typedef struct pt_graph_manager pt_graph_manager;

/* pt_graph_manager_create: warmup < 0 means PT_GRAPH_WARMUP_DEFAULT; pool_bytes
 * is reserved up front for workspaces (0: reserve lazily). */
pt_err pt_graph_manager_create(pt_graph_manager **out, int warmup, size_t pool_bytes);

/* pt_graph_manager_destroy frees every graph, then the pool. No execution may
 * be running. NULL-safe. */
void pt_graph_manager_destroy(pt_graph_manager *m);

/* pt_graph_manager_execute runs `name` by the rules above (execute-or-fallback);
 * *how (may be NULL) says which way. Errors of fn are returned as they are. */
pt_err pt_graph_manager_execute(pt_graph_manager *m, const char *name, pt_graph_fn fn, void *arg,
                                pt_stream *stream, pt_graph_run *how);

/* pt_graph_manager_execute_phase is execute under the phase's name. */
pt_err pt_graph_manager_execute_phase(pt_graph_manager *m, pt_graph_phase phase, pt_graph_fn fn,
                                      void *arg, pt_stream *stream, pt_graph_run *how);

/* pt_graph_manager_get fills *info for a cached graph; PT_ERR_NOTFOUND when
 * name has no graph (yet). info may be NULL. */
pt_err pt_graph_manager_get(pt_graph_manager *m, const char *name, pt_graph_info *info);

/* pt_graph_manager_remove forgets name (graph and warm-up count); its pool
 * block becomes free. PT_ERR_NOTFOUND for an unknown name. */
pt_err pt_graph_manager_remove(pt_graph_manager *m, const char *name);

/* pt_graph_manager_clear forgets every name. */
void pt_graph_manager_clear(pt_graph_manager *m);

/* pt_graph_manager_count returns the number of cached graphs. */
int pt_graph_manager_count(pt_graph_manager *m);

/* pt_graph_manager_is_capture_complete: name's warm-up is over (NULL: every
 * known name's, and at least one name is known). */
bool pt_graph_manager_is_capture_complete(pt_graph_manager *m, const char *name);

/* pt_graph_manager_pool returns the pool's counters. */
pt_graph_pool_stats pt_graph_manager_pool(pt_graph_manager *m);

#endif
