/* dispatch.h - the op dispatcher: meta -> plan -> impl per op, eager or deferred.
 *
 * Every op is an entry of pt_op (ending in PT_OP_COUNT) with a row in one table
 * of pt_op_def (checked by static_assert). A call is a pt_op_call: borrowed
 * input and output tensors plus a params union.
 *   meta: checks shapes and dtypes of inputs and outputs (errors name the op);
 *   plan: picks the kernel for the device and the workspace size;
 *   impl: runs the planned kernel.
 * Eager mode runs all three at once. Deferred mode runs meta, marks outputs
 * PENDING and queues the call (holding storage references); a flush plans
 * every queued call, then runs them in order. A failure in plan or impl stops
 * the flush, clears the queue and marks every output of the queue INVALID.
 *
 * A dispatcher belongs to one thread at a time (a pipeline stage). Each thread
 * has a current dispatcher (a lazily made eager one by default).
 */
#ifndef PT_DISPATCH_H
#define PT_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#define PT_OPS(X)                                                                                  \
	X(FILL, "fill", 0, 1, fill)                                                                \
	X(COPY, "copy", 1, 1, copy)                                                                \
	X(SCALE, "scale", 1, 1, scale)                                                             \
	X(ADD, "add", 2, 1, add)                                                                   \
	X(MATMUL, "matmul", 2, 1, matmul)                                                          \
	X(LINEAR_FWD, "linear_forward", 3, 1, linear_fwd)                                          \
	X(LINEAR_BWD, "linear_backward", 3, 3, linear_bwd)                                         \
	X(ACT_FWD, "activation_forward", 1, 1, act_fwd)                                            \
	X(ACT_BWD, "activation_backward", 3, 1, act_bwd)                                           \
	X(DROPOUT_FWD, "dropout_forward", 1, 1, dropout_fwd)                                       \
	X(DROPOUT_BWD, "dropout_backward", 1, 1, dropout_bwd)                                      \
	X(SOFTMAX_FWD, "softmax_forward", 1, 1, softmax_fwd)                                       \
	X(SOFTMAX_BWD, "softmax_backward", 2, 1, softmax_bwd)                                      \
	X(LAYERNORM_FWD, "layernorm_forward", 3, 3, ln_fwd)                                        \
	X(LAYERNORM_BWD, "layernorm_backward", 5, 3, ln_bwd)                                       \
	X(EMBEDDING_FWD, "embedding_forward", 3, 1, emb_fwd)                                       \
	X(EMBEDDING_BWD, "embedding_backward", 2, 2, emb_bwd)                                      \
	X(ATTENTION_FWD, "attention_forward", 1, 2, attn_fwd)                                      \
	X(ATTENTION_BWD, "attention_backward", 3, 1, attn_bwd)                                     \
	X(XENT_FWD, "cross_entropy_forward", 2, 2, xent_fwd)                                       \
	X(XENT_BWD, "cross_entropy_backward", 2, 1, xent_bwd)                                      \
	X(MSE_FWD, "mse_forward", 2, 1, mse_fwd)                                                   \
	X(MSE_BWD, "mse_backward", 2, 1, mse_bwd)                                                  \
	X(SQNORM, "squared_norm", 1, 1, sqnorm)                                                    \
	X(ADAMW, "adamw_update", 2, 3, adamw)                                                      \
	X(SGD, "sgd_update", 2, 2, sgd)

typedef enum pt_op {
#define PT_OP_ENUM(id, name, nin, nout, fn) PT_OP_##id,
	PT_OPS(PT_OP_ENUM)
#undef PT_OP_ENUM
	    PT_OP_COUNT
} pt_op;

#define PT_OP_MAX_IN  5
#define PT_OP_MAX_OUT 3

/* The run-time scalars of an optimizer op: an f64 tensor of PT_OPTIM_SCALARS
 * values given as the op's input 1. The kernel reads them when it runs, so a
 * captured graph replays each step with the values the host wrote before
 * the replay (the op params stay the same from step to step). */
enum {
	PT_OPTIM_S_LR,         /* learning rate (a float, stored exactly) */
	PT_OPTIM_S_GRAD_SCALE, /* g = grad * grad_scale (a float, stored exactly) */
	PT_OPTIM_S_STEP,       /* 1-based step, for AdamW's bias corrections */
	PT_OPTIM_S_FIRST,      /* SGD: 1 on the first step (momentum buffer = g) */
	PT_OPTIM_SCALARS
};

typedef enum pt_act { PT_ACT_RELU, PT_ACT_GELU, PT_ACT_TANH, PT_ACT_SIGMOID } pt_act;

/* Per-op parameters. Units and meanings are in ops.h next to each wrapper. */
typedef union pt_op_params {
	struct {
		double value;
	} fill;
	struct {
		float alpha;
	} scale;
	struct {
		float alpha, beta; /* out = alpha * a + beta * b */
	} add;
	struct {
		bool trans_a, trans_b;
		float alpha, beta; /* out = alpha * op(a) op(b) + beta * out */
	} matmul;
	struct {
		bool has_bias;
		bool accum_dx; /* dx += (true) or dx = (false); dW, db always accumulate */
		bool need_dx;
	} linear;
	struct {
		pt_act kind;
		bool accum_dx;
	} act;
	struct {
		float p;
		uint64_t seed, stream;
		bool accum_dx;
	} dropout;
	struct {
		float eps;
		bool accum_dx;
	} layernorm;
	struct {
		int n_head;
		bool accum_dx;
	} attention;
	struct {
		int64_t ignore_index;
		float scale; /* backward: dlogits = scale * (softmax - onehot) */
	} xent;
	struct {
		float scale;
	} mse;
	/* adamw and sgd: lr, grad_scale, step and first_step are read from
	 * input 1 (PT_OPTIM_SCALARS f64) instead when it is given. */
	struct {
		float lr, beta1, beta2, eps, weight_decay, grad_scale;
		int64_t step; /* 1-based, for bias correction */
	} adamw;
	struct {
		float lr, momentum, dampening, weight_decay, grad_scale;
		bool nesterov, first_step;
	} sgd;
} pt_op_params;

struct pt_op_call;
struct pt_dispatcher;

/* A planned kernel: runs the call with a workspace of the planned size. */
typedef pt_err (*pt_kernel_fn)(const struct pt_op_call *c, void *workspace);

/* The precision of matrix products (linear layers, attention): fp32, bf16
 * operands, or tf32 operands (10 mantissa bits, as NVIDIA's tensor cores take
 * fp32 inputs with TF32 allowed), each with f32 accumulation and f32 results
 * (a job's `precision`). Everything else computes in f32 either way. */
typedef enum pt_precision { PT_PREC_FP32, PT_PREC_BF16, PT_PREC_TF32 } pt_precision;

/* pt_set_precision sets the calling thread's precision for the ops it
 * dispatches from now on (a stage thread sets its job's); pt_get_precision
 * reads it (PT_PREC_FP32 unless set). */
void pt_set_precision(pt_precision p);
pt_precision pt_get_precision(void);

/* How bf16 products run on the CPU (lib/ops/cpu/cpu_bf16.c): AUTO (the
 * default) runs oneDNN's bf16 matmul where oneDNN has one for this CPU
 * beyond its reference kernel (AVX512_BF16, AMX) and it agrees with the
 * emulation on a small product, else the emulation (operands rounded to
 * bf16, fp32 sgemm); PIPETRAIN_BF16_KERNELS=native|emulated in the
 * environment overrides AUTO. pt_cpu_bf16_select sets it for the process
 * (tests force either); pt_cpu_bf16_native says whether bf16 products run
 * native now and points *impl (may be NULL) at oneDNN's name for its bf16
 * kernel here ("unavailable" without one). */
typedef enum pt_bf16_kernels { PT_BF16_AUTO, PT_BF16_NATIVE, PT_BF16_EMULATED } pt_bf16_kernels;
void pt_cpu_bf16_select(pt_bf16_kernels k);
bool pt_cpu_bf16_native(const char **impl);

/* pt_cpu_f32_gemm_impl names oneDNN's kernel for f32 products from 16 M
 * flops with widths to 1024 (cpu_matmul.c's use_prim; its matmul primitive
 * for a 256 x 256 x 256 product, asked once;
 * "unavailable" when it cannot make one, and sgemm then runs them). */
const char *pt_cpu_f32_gemm_impl(void);

/* The fp32 attention kernel's strip products (lib/ops/cpu/cpu_attention.c):
 * AVX-512 register tiles (cpu_attn512.c) where the CPU has AVX-512 and a
 * head is a multiple of 16 wide, else one sgemm call each.
 * PIPETRAIN_ATTN_KERNELS=sgemm in the environment, or
 * pt_cpu_attention_select(false) (tests, benchmarks), keeps sgemm;
 * pt_cpu_attention_kernel names what runs: "avx512f" or "sgemm". */
void pt_cpu_attention_select(bool avx512);
const char *pt_cpu_attention_kernel(void);
/* pt_cpu_attention_bf16_kernel names what bf16 attention runs:
 * "avx512_bf16" (register tiles on AVX512_BF16 dot products, heads a
 * multiple of 32 wide; kept off with the fp32 tiles), "onednn" (oneDNN's
 * bf16 strips, contexts to 256) or "emulated" (no native bf16 here). */
const char *pt_cpu_attention_bf16_kernel(void);

/* pt_cpu_activation_isa names the build the activation kernels run here:
 * "avx512f" where the CPU has it, else the baseline's. */
const char *pt_cpu_activation_isa(void);

typedef struct pt_op_call {
	pt_op op;
	int n_in, n_out;
	const pt_tensor *in[PT_OP_MAX_IN]; /* borrowed; NULL for an absent optional input */
	pt_tensor *out[PT_OP_MAX_OUT];     /* borrowed; NULL for an absent optional output */
	pt_op_params p;
	uint8_t prec; /* pt_precision: the dispatching thread's, set by pt_dispatch */
	/* Filled by plan: */
	pt_kernel_fn kernel;
	size_t workspace;
} pt_op_call;

typedef struct pt_op_def {
	const char *name;
	int n_in, n_out;
	/* meta: validate; set an error naming the op and return its code. */
	pt_err (*meta)(const pt_op_call *c);
	/* plan: choose c->kernel for the device and set c->workspace. */
	pt_err (*plan)(pt_op_call *c);
} pt_op_def;

/* pt_op_name returns the op's name ("linear_forward"). */
const char *pt_op_name(pt_op op);

typedef enum pt_dispatch_mode { PT_EAGER, PT_DEFERRED } pt_dispatch_mode;

typedef struct pt_dispatch_stats {
	uint64_t dispatched; /* ops dispatched (either mode) */
	uint64_t flushes;    /* non-empty flushes */
	uint64_t failed_flushes;
	uint64_t queued_peak;
} pt_dispatch_stats;

typedef struct pt_dispatcher pt_dispatcher;

/* pt_dispatcher_create makes an eager dispatcher. */
pt_err pt_dispatcher_create(pt_dispatcher **out);

/* pt_dispatcher_destroy flushes nothing: queued calls are dropped and their
 * outputs marked INVALID. NULL-safe. */
void pt_dispatcher_destroy(pt_dispatcher *d);

/* pt_dispatcher_current returns the calling thread's dispatcher, creating an
 * eager one on first use (NULL only if that allocation fails). */
pt_dispatcher *pt_dispatcher_current(void);

/* pt_dispatcher_set_current makes d the calling thread's dispatcher (NULL
 * restores the thread's own default). Returns the previous one. */
pt_dispatcher *pt_dispatcher_set_current(pt_dispatcher *d);

/* pt_deferred_begin enters deferred mode on d (nesting counts). */
void pt_deferred_begin(pt_dispatcher *d);

/* pt_deferred_end leaves one level of deferred mode; leaving the last level
 * flushes and returns the flush result. */
pt_err pt_deferred_end(pt_dispatcher *d);

/* pt_dispatcher_mode returns d's current mode. */
pt_dispatch_mode pt_dispatcher_mode(const pt_dispatcher *d);

/* pt_dispatcher_flush plans and runs every queued call in order. On failure
 * the queue is cleared, every queued output is INVALID, and the error (naming
 * the op and its position) is returned. Empty queue: PT_OK. */
pt_err pt_dispatcher_flush(pt_dispatcher *d);

/* pt_dispatcher_pending returns the number of queued calls. */
size_t pt_dispatcher_pending(const pt_dispatcher *d);

/* pt_dispatcher_stats returns counters for tests and benchmarks. */
pt_dispatch_stats pt_dispatcher_stats(const pt_dispatcher *d);

/* pt_dispatch runs or queues one call on the current dispatcher. Meta errors
 * return at once in both modes and leave the outputs untouched. */
pt_err pt_dispatch(pt_op_call *c);

/* pt_dispatch_on is pt_dispatch on a given dispatcher. */
pt_err pt_dispatch_on(pt_dispatcher *d, pt_op_call *c);

/* ---- capture and replay (the CPU graph backend) ----
 *
 * While a tape is attached, every call that runs on d (eager, or in a flush)
 * is appended to it after its kernel succeeded: the planned call (kernel,
 * params, workspace size) with a view of each operand, so the storages stay
 * alive and the data pointers stay fixed. Replay runs the recorded kernels in
 * order on those same buffers, without meta, plan, queueing or allocation,
 * and marks every output READY. A tape is owned by its creator; it is not
 * thread-safe (one capturing dispatcher, one replaying thread at a time). */
typedef struct pt_op_tape pt_op_tape;

/* pt_op_tape_create makes an empty tape. */
pt_err pt_op_tape_create(pt_op_tape **out);

/* pt_op_tape_destroy releases the operand references. NULL-safe. */
void pt_op_tape_destroy(pt_op_tape *t);

/* pt_op_tape_len returns the number of recorded calls. */
size_t pt_op_tape_len(const pt_op_tape *t);

/* pt_op_tape_workspace returns the largest workspace a recorded call needs. */
size_t pt_op_tape_workspace(const pt_op_tape *t);

/* pt_op_tape_ok returns false when recording ran out of memory (the tape is
 * then incomplete and must not be replayed). */
bool pt_op_tape_ok(const pt_op_tape *t);

/* pt_op_tape_same returns true when a and b hold the same ops with the same
 * kernels, params, dtypes, shapes, strides and data addresses, i.e. replaying
 * one is the same computation as the other. */
bool pt_op_tape_same(const pt_op_tape *a, const pt_op_tape *b);

/* pt_op_tape_prune drops dead calls: those whose every output is a storage
 * that only the tape still references (a temporary its owner has freed, e.g.
 * a per-call scratch tensor read back to the host) and that no kept later
 * call reads. Nothing outside the tape can observe them. Returns the number
 * dropped. */
size_t pt_op_tape_prune(pt_op_tape *t);

/* pt_op_tape_replay runs the recorded kernels in order with a workspace of at
 * least pt_op_tape_workspace(t) bytes. On failure it stops, marks the outputs
 * of the failed and later calls INVALID, and names the op and its position. */
pt_err pt_op_tape_replay(const pt_op_tape *t, void *workspace);

/* pt_dispatcher_capture_begin attaches t to d (PT_ERR_STATE when one is
 * already attached); pt_dispatcher_capture_end detaches and returns it. */
pt_err pt_dispatcher_capture_begin(pt_dispatcher *d, pt_op_tape *t);
pt_op_tape *pt_dispatcher_capture_end(pt_dispatcher *d);

/* Benchmarks: while a thread has a kernel timer, every kernel it runs (eager,
 * in a flush or in a tape replay) adds its wall time (CLOCK_MONOTONIC
 * seconds, two clock reads around the call) and one call to the timer, so
 * dispatch overhead = step time - kernel time from the same run; per op too.
 * With sync_device set, the device of the call's first operand is
 * synchronised before and after each kernel, so an asynchronous (CUDA)
 * kernel's time lands on its own op (the profile costs the overlap).
 * pt_dispatch_time_kernels sets the calling thread's timer (NULL: none). */
typedef struct pt_kernel_timer {
	double seconds;
	uint64_t calls;
	bool sync_device;
	double op_seconds[PT_OP_COUNT];
	uint64_t op_calls[PT_OP_COUNT];
} pt_kernel_timer;
void pt_dispatch_time_kernels(pt_kernel_timer *t);

/* Test hook: when set, the kernel of calls to `op` fails with PT_ERR_BACKEND
 * at impl time (once armed, every such call fails until cleared). */
void pt_dispatcher_inject_failure(pt_dispatcher *d, pt_op op, bool armed);

#endif
