/* layers.h - layer kinds, their specs, and per-kind implementations.
 *
 * A model is an ordered list of pt_layer_spec. Each kind has one row in a
 * table of pt_layer_vt (shape inference, parameter list, activation sizes,
 * forward, backward, init), checked by static_assert against the kind enum.
 * Layers run only through the dispatcher's ops. Parameter gradients
 * accumulate (+=), so microbatches sum; see ops.h.
 */
#ifndef PT_LAYERS_H
#define PT_LAYERS_H

#include <stdint.h>

#include "ops.h"
#include "rng.h"

#define PT_LAYER_KINDS(X)                                                                          \
	X(LINEAR, "linear")                                                                        \
	X(RELU, "relu")                                                                            \
	X(GELU, "gelu")                                                                            \
	X(TANH, "tanh")                                                                            \
	X(SIGMOID, "sigmoid")                                                                      \
	X(DROPOUT, "dropout")                                                                      \
	X(LAYERNORM, "layernorm")                                                                  \
	X(EMBEDDING, "embedding")                                                                  \
	X(ATTENTION, "attention")                                                                  \
	X(BLOCK, "transformer_block")                                                              \
	X(SOFTMAX, "softmax")

typedef enum pt_layer_kind {
#define PT_LK_ENUM(id, name) PT_LAYER_##id,
	PT_LAYER_KINDS(PT_LK_ENUM)
#undef PT_LK_ENUM
	    PT_LAYER_KIND_COUNT
} pt_layer_kind;

/* pt_layer_kind_name returns "linear", ...; pt_layer_kind_parse the reverse
 * (PT_ERR_NOTFOUND for an unknown name). */
const char *pt_layer_kind_name(pt_layer_kind k);
pt_err pt_layer_kind_parse(const char *name, pt_layer_kind *out);

typedef struct pt_layer_spec {
	pt_layer_kind kind;
	int64_t in_features, out_features; /* linear */
	bool bias;                         /* linear (default true when built by helpers) */
	int64_t dim;                       /* layernorm, attention, block: model width C */
	int n_head;                        /* attention, block */
	int64_t vocab, max_seq;            /* embedding (max_seq 0: no position table) */
	int64_t mlp_hidden;                /* block (0: 4 * dim) */
	float p;                           /* dropout probability */
	float eps;                         /* layernorm (0: 1e-5) */
} pt_layer_spec;

/* Spec helpers with PyTorch-like defaults. */
pt_layer_spec pt_linear(int64_t in, int64_t out);
pt_layer_spec pt_activation(pt_layer_kind kind);
pt_layer_spec pt_dropout(float p);
pt_layer_spec pt_layernorm(int64_t dim);
pt_layer_spec pt_embedding(int64_t vocab, int64_t dim, int64_t max_seq);
pt_layer_spec pt_attention(int64_t dim, int n_head);
pt_layer_spec pt_block(int64_t dim, int n_head);

/* The shape of one sample flowing between layers: tokens (T) i64, or
 * features (T, C) / (C) f32. seq == 0 means no sequence dim. */
typedef struct pt_act_shape {
	pt_dtype dtype;
	int64_t seq;
	int64_t features; /* 0 for token input */
} pt_act_shape;

#define PT_LAYER_MAX_PARAMS 12
#define PT_LAYER_MAX_SAVED  16

typedef struct pt_param_info {
	char name[48]; /* suffix after "<layer index>.", as in PyTorch's state_dict */
	int ndim;
	int64_t shape[2];
	bool decay; /* weight decay applies (weights), not biases or norms */
} pt_param_info;

typedef struct pt_saved_info {
	pt_dtype dtype;
	int ndim;
	int64_t shape[4];
} pt_saved_info;

struct pt_layer;
struct pt_layer_ctx;

/* pt_layer_mm_input: the dtype layers keep a saved tensor in when only
 * matrix products read it. bf16 for a bf16 model on a CPU whose native bf16
 * kernels run its products: they round their operands to bf16 anyway, so the
 * saved bf16 copy is the very operand (half the bytes, no packing in the
 * forward or the backward; bitwise the same results). f32 otherwise (fp32,
 * the emulation, devices). */
pt_dtype pt_layer_mm_input(pt_precision prec, pt_device dev);

typedef struct pt_layer_vt {
	const char *name;
	/* Check the spec against the input shape and give the output shape; the
	 * error names the problem (the model prefixes the layer index). */
	pt_err (*infer)(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out);
	/* Parameters in state_dict order. */
	int (*params)(const pt_layer_spec *s, pt_param_info *out);
	/* Tensors saved for backward, per slot, for a batch of B samples; those
	 * that only feed matrix products are of dtype mm_in (pt_layer_mm_input). */
	int (*saved)(const pt_layer_spec *s, pt_act_shape in, int64_t B, pt_dtype mm_in,
	             pt_saved_info *out);
	/* Scratch floats the backward needs beyond the two gradient buffers. */
	int64_t (*scratch)(const pt_layer_spec *s, pt_act_shape in, int64_t B);
	pt_err (*forward)(struct pt_layer *l, struct pt_layer_ctx *x);
	pt_err (*backward)(struct pt_layer *l, struct pt_layer_ctx *x);
	void (*init)(struct pt_layer *l, uint64_t seed);
	/* Split backward (zero-bubble schedules): floats per slot that the
	 * input-gradient part (PT_BWD_INPUT) keeps for the weight-gradient part
	 * (PT_BWD_WEIGHT); NULL for layers without parameters (no weight part). */
	int64_t (*wstash)(const pt_layer_spec *s, pt_act_shape in, int64_t B);
} pt_layer_vt;

/* Which part of a backward a call computes. PT_BWD_INPUT gives dx only and
 * keeps what the weight gradients need in ctx->wstash; PT_BWD_WEIGHT
 * accumulates the parameter gradients from it (dy and dx unused). The two
 * parts give the fused backward's dx and gradients bitwise. */
typedef enum pt_bwd_part { PT_BWD_ALL, PT_BWD_INPUT, PT_BWD_WEIGHT } pt_bwd_part;

/* pt_layer_vtable returns the implementation of a kind (NULL if unknown). */
const pt_layer_vt *pt_layer_vtable(pt_layer_kind k);

typedef struct pt_layer {
	pt_layer_spec spec;
	int index; /* global index in the model's full layer list */
	const pt_layer_vt *vt;
	pt_act_shape in_shape, out_shape;
	int n_params;
	pt_param_info pinfo[PT_LAYER_MAX_PARAMS];
	pt_tensor param[PT_LAYER_MAX_PARAMS]; /* views into the model's parameter arena */
	pt_tensor grad[PT_LAYER_MAX_PARAMS];  /* same layout in the gradient arena */
	int n_saved;
} pt_layer;

/* Everything a layer's forward or backward touches for one microbatch. */
typedef struct pt_layer_ctx {
	const pt_tensor *x;    /* input (B, ...) */
	pt_tensor *y;          /* output (B, ...), saved per slot */
	pt_tensor *saved;      /* this layer's saved tensors for this slot */
	const pt_tensor *dy;   /* backward: gradient of y */
	pt_tensor *dx;         /* backward: gradient of x (NULL when not needed) */
	pt_tensor *scratch;    /* backward scratch, f32, at least scratch() floats */
	pt_bwd_part part;      /* backward: all, or one part of a split backward */
	pt_tensor *wstash;     /* split backward: this layer's wstash() floats for the slot */
	bool training;         /* dropout active */
	uint64_t seed, stream; /* dropout: per (step, microbatch, layer) */
} pt_layer_ctx;

#endif
