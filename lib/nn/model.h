/* model.h - a model (or one pipeline stage of it): layers [first, last) of an
 * ordered layer list, with parameters, gradients and activations.
 *
 * Memory (llm.c style): all parameters live in one arena cut by a size table;
 * gradients use the same layout in a second arena, so a checkpoint or a
 * gradient exchange is one contiguous copy. Activations saved for backward
 * live in n_slots slot arenas (one per microbatch in flight); two gradient
 * buffers and a scratch area are shared by every slot. Nothing is allocated
 * by forward or backward after creation.
 *
 * On a device (cfg.device), every arena is device memory and forward and
 * backward take inputs on that device; host reads of parameters or gradients
 * go through pt_tensor_read/pt_tensor_transfer (the flat views are device
 * tensors). pt_model_grad_sqnorms returns host values either way.
 *
 * Not thread-safe: one stage thread drives a model.
 */
#ifndef PT_MODEL_H
#define PT_MODEL_H

#include "layers.h"

typedef struct pt_model_config {
	int64_t batch;      /* samples per forward (the microbatch size), > 0 */
	pt_act_shape input; /* one sample: tokens (T) i64 or features f32 */
	int n_slots;        /* microbatches that can be in flight (>= 1) */
	uint64_t seed;      /* fixes every initial weight */
	/* Where parameters, gradients, activation slots and scratch live and the
	 * layers compute (zero-initialised: PT_CPU). Initial weights are drawn on
	 * the host and copied, so they equal the CPU model's bitwise. */
	pt_device device;
	/* No initial weights drawn: parameters start at zero, for a model whose
	 * weights are always set before use (a job runner's evaluation copy). */
	bool no_init;
	/* Split backward (zero-bubble schedules): each slot keeps a weight
	 * stash so pt_model_backward_input and pt_model_backward_weight can run
	 * apart. */
	bool split_backward;
	/* The precision its ops will run at (the stage thread's pt_set_precision):
	 * bf16 on a CPU with native bf16 kernels keeps the block's product
	 * inputs saved in bf16 (pt_layer_mm_input); such a model must then run
	 * at bf16. Zero: fp32. */
	pt_precision precision;
	/* > 0 (a training stage): the parameter and gradient arenas and the
	 * first prefault_slots slots are faulted in at creation, before the
	 * weights are drawn (pt_storage_prefault), since the first step writes
	 * them all; the work arena is not (its buffers are sized for the
	 * largest activation, and most layers use a part). */
	int prefault_slots;
} pt_model_config;

typedef struct pt_model pt_model;

/* pt_model_check verifies that the whole list is shape-consistent for the
 * given input; the error names the layer ("layer 3 (linear): ..."). */
pt_err pt_model_check(const pt_layer_spec *layers, int n_layers, pt_act_shape input);

/* pt_model_create builds layers [first, last) of the list (the whole model is
 * first = 0, last = n_layers), initialised from cfg->seed exactly as the same
 * layers of the full model would be. On error *out is NULL. */
pt_err pt_model_create(pt_model **out, const pt_layer_spec *layers, int n_layers, int first,
                       int last, const pt_model_config *cfg);

/* pt_model_destroy frees everything. NULL-safe. */
void pt_model_destroy(pt_model *m);

/* pt_model_forward runs the stage's layers on x (B, ...) and keeps what
 * backward needs in `slot`. *y points at the slot's output, valid until the
 * slot's next forward. x is borrowed and must stay unchanged until the slot's
 * backward (the caller's input buffer). training enables dropout; dropout
 * masks are fixed by (seed, step, microbatch). */
pt_err pt_model_forward(pt_model *m, int slot, const pt_tensor *x, const pt_tensor **y,
                        bool training, uint64_t step, uint64_t microbatch);

/* pt_model_backward back-propagates dy (the gradient of the slot's output)
 * through the stage, accumulating parameter gradients. It is a sync boundary:
 * the calling thread's queued (deferred) ops are flushed first. *dx (may be NULL to
 * skip) points at the gradient of the stage input, valid until the next
 * backward; it is NULL when the input is tokens. */
pt_err pt_model_backward(pt_model *m, int slot, const pt_tensor *dy, const pt_tensor **dx);

/* pt_model_backward_input is the first part of a split backward (needs
 * cfg.split_backward): the input gradient only, as pt_model_backward gives
 * it; what the parameter gradients need stays in the slot's weight stash.
 * pt_model_backward_weight is the second part: it accumulates the slot's
 * parameter gradients, bitwise those of pt_model_backward. The slot holds
 * its forward's tensors until the weight part ran. */
pt_err pt_model_backward_input(pt_model *m, int slot, const pt_tensor *dy, const pt_tensor **dx);
pt_err pt_model_backward_weight(pt_model *m, int slot);

/* pt_model_zero_grad sets every gradient to zero. */
pt_err pt_model_zero_grad(pt_model *m);

/* pt_model_device returns the device the model's arenas live on. */
pt_device pt_model_device(const pt_model *m);

/* Flat views over the whole arenas (do not fini). */
pt_tensor *pt_model_params(pt_model *m);
pt_tensor *pt_model_grads(pt_model *m);
int64_t pt_model_num_params(const pt_model *m);

/* pt_model_grad_sqnorms writes sum(grad^2) of each parameter tensor, in
 * state_dict order, into out[pt_model_num_tensors(m)] (a sync boundary).
 * Summing these in order over all stages gives the same global norm however
 * the layers are split into stages. */
pt_err pt_model_grad_sqnorms(pt_model *m, double *out);

/* pt_sum_sqnorms adds n per-tensor squared norms in order. */
double pt_sum_sqnorms(const double *sq, int n);

/* Per-parameter access in state_dict order: name ("0.weight"), tensor views
 * of the parameter and its gradient. index in [0, pt_model_num_tensors). */
int pt_model_num_tensors(const pt_model *m);
pt_err pt_model_tensor(pt_model *m, int index, const char **name, pt_tensor **param,
                       pt_tensor **grad);

/* Shapes at the stage boundary, for one sample. */
pt_act_shape pt_model_input_shape(const pt_model *m);
pt_act_shape pt_model_output_shape(const pt_model *m);
int64_t pt_model_batch(const pt_model *m);

/* pt_model_output_dead: whether nothing reads the model's output after its
 * forward (its last layer is a Linear, whose backward needs only its input
 * and the output gradient): whoever receives it may overwrite it, as the
 * coordinator does with the loss gradient, until the slot's next forward. */
bool pt_model_output_dead(const pt_model *m);

/* pt_model_slot_bytes: the bytes of one activation slot's arena (the layers'
 * outputs and saved tensors for one microbatch in flight). */
size_t pt_model_slot_bytes(const pt_model *m);

/* pt_model_flops_per_sample estimates forward+backward FLOPs of one sample
 * (matrix products and attention), for throughput reports and partitioning. */
double pt_model_flops_per_sample(const pt_model *m);

/* pt_layer_flops estimates forward+backward FLOPs of one sample for a layer. */
double pt_layer_flops(const pt_layer_spec *s, pt_act_shape in);

#endif
