/* executor.h - the async executor of one pipeline stage (seed 000).
 *
 * Forward and backward of a microbatch run on its compute stream, sends and
 * receives on its communication stream (microbatch mb uses stream mb mod n of
 * each kind; default 2 + 2). Every call returns at once with a handle, a
 * pt_async_op: id, kind, microbatch, stream index, completion, error and
 * result tensor. Dependencies go through events: an op given `after` makes
 * its stream wait for after's event, and fails without running when `after`
 * failed (the error names both). So receive -> forward -> send-forward and
 * backward -> send-backward chain across streams while communication of one
 * microbatch overlaps compute of another.
 *
 * Compute runs through a pt_exec_compute table (forward/backward callbacks);
 * pt_exec_model_compute adapts a pt_model. Unless cfg.concurrent_compute,
 * compute ops run one at a time in submission order across compute streams
 * (a model is not thread-safe, and gradient sums then keep the synchronous
 * order, so results equal a synchronous run bitwise).
 *
 * Receives match (step, microbatch): a message for another microbatch that
 * arrives first is kept for its own receive. Receives poll the communicator
 * in 20 ms slices so destroy and timeouts are prompt (each empty slice counts
 * as a timeout in the communicator's stats).
 *
 * Destroy cancels what has not started (handles complete with PT_ERR_CLOSED),
 * lets running compute finish, and stops running receives within a slice.
 * Thread-safety: submit and wait from any thread; destroy must not race with
 * submits. Handles outlive the executor and must each be released.
 */
#ifndef PT_EXECUTOR_H
#define PT_EXECUTOR_H

#include "comm.h"
#include "model.h"
#include "stream.h"

typedef enum pt_async_kind {
	PT_ASYNC_FORWARD,
	PT_ASYNC_BACKWARD,
	PT_ASYNC_SEND_FORWARD,
	PT_ASYNC_RECV_FORWARD,
	PT_ASYNC_SEND_BACKWARD,
	PT_ASYNC_RECV_BACKWARD,
	PT_ASYNC_KIND_COUNT
} pt_async_kind;

/* pt_async_kind_name returns "forward", "receive-forward", ... */
const char *pt_async_kind_name(pt_async_kind k);

typedef struct pt_async_op pt_async_op;

/* Handle accessors; thread-safe. The result (forward output, backward input
 * gradient, received tensor; empty for sends) is readable once done. */
uint64_t pt_async_op_id(const pt_async_op *op);
pt_async_kind pt_async_op_kind(const pt_async_op *op);
int pt_async_op_microbatch(const pt_async_op *op);
int pt_async_op_stream(const pt_async_op *op);
bool pt_async_op_done(pt_async_op *op);
const pt_tensor *pt_async_op_result(const pt_async_op *op);

/* pt_async_op_wait blocks until op completes or timeout_ms passes (< 0: no
 * limit) and returns op's error (with its message set on the caller's
 * thread), or PT_ERR_TIMEOUT (op keeps running). */
pt_err pt_async_op_wait(pt_async_op *op, int timeout_ms);

/* pt_async_op_release drops the caller's reference. NULL-safe. */
void pt_async_op_release(pt_async_op *op);

/* Compute callbacks; they run on compute-stream threads. forward writes y
 * and backward dx (may stay empty) as tensors the callee initialises and the
 * executor owns afterwards. */
typedef struct pt_exec_compute {
	pt_err (*forward)(void *ctx, int mb, const pt_tensor *x, pt_tensor *y);
	pt_err (*backward)(void *ctx, int mb, const pt_tensor *dy, pt_tensor *dx);
	void *ctx;
} pt_exec_compute;

typedef struct pt_executor_config {
	int n_compute, n_comm;   /* streams of each kind (0: 2) */
	int timeout_ms;          /* receive timeout (0: the communicator's default) */
	int64_t step;            /* step stamped on sends and matched on receives */
	bool concurrent_compute; /* let compute streams run at once (callbacks thread-safe) */
} pt_executor_config;

typedef struct pt_executor pt_executor;

/* pt_executor_create starts the streams. compute is copied; comm is borrowed
 * (may be NULL when only compute is used); cfg may be NULL for defaults. */
pt_err pt_executor_create(pt_executor **out, const pt_exec_compute *compute, pt_comm *comm,
                          const pt_executor_config *cfg);

/* pt_executor_destroy cancels or drains pending ops (see above). NULL-safe. */
void pt_executor_destroy(pt_executor *ex);

/* pt_executor_set_step changes the step stamped on later sends/receives. */
void pt_executor_set_step(pt_executor *ex, int64_t step);

int pt_executor_num_compute(const pt_executor *ex);
int pt_executor_num_comm(const pt_executor *ex);
/* Streams of microbatch mb (round-robin); the managers for index access. */
pt_stream *pt_executor_compute_stream(pt_executor *ex, int mb);
pt_stream *pt_executor_comm_stream(pt_executor *ex, int mb);
pt_stream_manager *pt_executor_compute_streams(pt_executor *ex);
pt_stream_manager *pt_executor_comm_streams(pt_executor *ex);

/* Submissions. Input: x when given, otherwise after's result (then after is
 * required). after (may be NULL) must complete first; its failure fails this
 * op. *out is the caller's reference. Errors at submission leave *out NULL. */
pt_err pt_executor_forward(pt_executor *ex, int mb, const pt_tensor *x, pt_async_op *after,
                           pt_async_op **out);
pt_err pt_executor_backward(pt_executor *ex, int mb, const pt_tensor *dy, pt_async_op *after,
                            pt_async_op **out);
pt_err pt_executor_send_forward(pt_executor *ex, int mb, int dst, const pt_tensor *t,
                                pt_async_op *after, pt_async_op **out);
pt_err pt_executor_send_backward(pt_executor *ex, int mb, int dst, const pt_tensor *t,
                                 pt_async_op *after, pt_async_op **out);
pt_err pt_executor_recv_forward(pt_executor *ex, int mb, int src, pt_async_op **out);
pt_err pt_executor_recv_backward(pt_executor *ex, int mb, int src, pt_async_op **out);

/* Synchronisation of every compute, every comm, or every stream. */
pt_err pt_executor_sync_compute(pt_executor *ex, int timeout_ms);
pt_err pt_executor_sync_comm(pt_executor *ex, int timeout_ms);
pt_err pt_executor_sync_all(pt_executor *ex, int timeout_ms);

/* ---- pt_model adapter ---- */

/* A model behind the compute table: forward uses slot mb mod n_slots (at
 * most n_slots microbatches in flight), keeps x referenced until that slot's
 * backward, and copies y and dx into fresh tensors (the model's buffers are
 * reused by the next forward/backward, while a send may still read them). */
typedef struct pt_exec_model {
	pt_model *model;
	int n_slots;
	bool training;
	uint64_t step;
	pt_tensor *inputs; /* n_slots views held until backward */
} pt_exec_model;

pt_err pt_exec_model_init(pt_exec_model *em, pt_model *m, int n_slots, bool training);
void pt_exec_model_fini(pt_exec_model *em);
pt_exec_compute pt_exec_model_compute(pt_exec_model *em);

#endif
