/* ops.h - typed entry points for every op; each builds a pt_op_call and
 * dispatches it on the calling thread's dispatcher (eager or deferred).
 *
 * Conventions (llm.c style): outputs first, then inputs, then sizes/params.
 * Shapes are in comments. "(..., C)" means any leading dims, flattened to rows.
 * All float tensors are f32 and contiguous unless said otherwise.
 * Parameter gradients (dW, db, dw, dwte, ...) always ACCUMULATE (+=), so
 * microbatches sum; input gradients (dx) overwrite, or add when accum_dx.
 * Every function returns PT_OK or an error whose detail names the op.
 */
#ifndef PT_OPS_H
#define PT_OPS_H

#include "dispatch.h"

/* out = value. out: any shape, f32/f64/i64/i32. */
pt_err pt_fill(pt_tensor *out, double value);

/* out = x (same shape and dtype; any strides). */
pt_err pt_copy(pt_tensor *out, const pt_tensor *x);

/* out = alpha * x (out may be x). */
pt_err pt_scale(pt_tensor *out, const pt_tensor *x, float alpha);

/* out = alpha * a + beta * b (same shapes; out may be a or b). */
pt_err pt_add(pt_tensor *out, const pt_tensor *a, const pt_tensor *b, float alpha, float beta);

/* out (M, N) = alpha * op(a) op(b) + beta * out, where op(a) is (M, K) and
 * op(b) is (K, N); 2-d, rows contiguous (stride of the last dim is 1). */
pt_err pt_matmul(pt_tensor *out, const pt_tensor *a, const pt_tensor *b, bool trans_a, bool trans_b,
                 float alpha, float beta);

/* out (..., O) = x (..., I) @ w^T (O, I) + b (O). b may be NULL. */
pt_err pt_linear_forward(pt_tensor *out, const pt_tensor *x, const pt_tensor *w,
                         const pt_tensor *b);

/* dx (..., I) (=, or += when accum_dx; NULL to skip), dw (O, I) +=, db (O) +=
 * (NULL when there is no bias), from dout (..., O), x (..., I), w (O, I). */
pt_err pt_linear_backward(pt_tensor *dx, pt_tensor *dw, pt_tensor *db, const pt_tensor *dout,
                          const pt_tensor *x, const pt_tensor *w, bool accum_dx);

/* y = act(x), same shape. GELU is the tanh form. */
pt_err pt_activation_forward(pt_tensor *y, const pt_tensor *x, pt_act kind);

/* dx = dy * act'(x), using x (ReLU, GELU) or y (Tanh, Sigmoid). */
pt_err pt_activation_backward(pt_tensor *dx, const pt_tensor *dy, const pt_tensor *x,
                              const pt_tensor *y, pt_act kind, bool accum_dx);

/* y = x * mask / (1 - p), mask[i] = philox(seed, stream, i) >= p; no mask is
 * stored: backward regenerates it from (seed, stream). p in [0, 1). */
pt_err pt_dropout_forward(pt_tensor *y, const pt_tensor *x, float p, uint64_t seed,
                          uint64_t stream);
pt_err pt_dropout_backward(pt_tensor *dx, const pt_tensor *dy, float p, uint64_t seed,
                           uint64_t stream, bool accum_dx);

/* y (..., C) = softmax over the last dim of x; dx = y * (dy - sum(dy * y)). */
pt_err pt_softmax_forward(pt_tensor *y, const pt_tensor *x);
pt_err pt_softmax_backward(pt_tensor *dx, const pt_tensor *dy, const pt_tensor *y, bool accum_dx);

/* y (..., C) = (x - mean) * rstd * w + b; saves mean (rows), rstd (rows). */
pt_err pt_layernorm_forward(pt_tensor *y, pt_tensor *mean, pt_tensor *rstd, const pt_tensor *x,
                            const pt_tensor *w, const pt_tensor *b, float eps);
pt_err pt_layernorm_backward(pt_tensor *dx, pt_tensor *dw, pt_tensor *db, const pt_tensor *dy,
                             const pt_tensor *x, const pt_tensor *w, const pt_tensor *mean,
                             const pt_tensor *rstd, bool accum_dx);

/* out (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T) i64, wte (V, C),
 * wpe (maxT, C) or NULL. A token outside [0, V) is a PT_ERR_RANGE at impl. */
pt_err pt_embedding_forward(pt_tensor *out, const pt_tensor *tokens, const pt_tensor *wte,
                            const pt_tensor *wpe);
/* dwte += scatter of dout by token, dwpe += sum over batch (dwpe may be NULL). */
pt_err pt_embedding_backward(pt_tensor *dwte, pt_tensor *dwpe, const pt_tensor *dout,
                             const pt_tensor *tokens);

/* Causal multi-head self-attention core. qkv (B, T, 3C) holds q, k, v side by
 * side; out (B, T, C); lse (B, NH, T) saves each row's log-sum-exp of its
 * scaled scores (the backward recomputes the probabilities from it). */
pt_err pt_attention_forward(pt_tensor *out, pt_tensor *lse, const pt_tensor *qkv, int n_head);
/* dqkv (B, T, 3C) from dout (B, T, C), qkv and the forward's lse. */
pt_err pt_attention_backward(pt_tensor *dqkv, const pt_tensor *dout, const pt_tensor *qkv,
                             const pt_tensor *lse, int n_head, bool accum_dx);

/* Softmax cross-entropy on logits (N, V) and targets (N) i64: losses (N)
 * (0 where target == ignore_index), probs (N, V) saved for backward. */
pt_err pt_cross_entropy_forward(pt_tensor *losses, pt_tensor *probs, const pt_tensor *logits,
                                const pt_tensor *targets, int64_t ignore_index);
/* dlogits (N, V) = scale * (probs - onehot(target)); 0 rows where ignored. */
pt_err pt_cross_entropy_backward(pt_tensor *dlogits, const pt_tensor *probs,
                                 const pt_tensor *targets, int64_t ignore_index, float scale);

/* loss (1) = scale * sum((pred - target)^2); pred, target same shape. */
pt_err pt_mse_forward(pt_tensor *loss, const pt_tensor *pred, const pt_tensor *target, float scale);
/* dpred = 2 * scale * (pred - target). */
pt_err pt_mse_backward(pt_tensor *dpred, const pt_tensor *pred, const pt_tensor *target,
                       float scale);

/* out (1) f64 = sum(x^2), accumulated in double. */
pt_err pt_squared_norm(pt_tensor *out, const pt_tensor *x);

/* AdamW (decoupled weight decay, PyTorch semantics) on flat buffers of equal
 * size: g = grad * grad_scale; m, v, param updated in place. step is 1-based. */
pt_err pt_adamw_update(pt_tensor *param, pt_tensor *m, pt_tensor *v, const pt_tensor *grad,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int64_t step);

/* pt_adamw_update_scalars is pt_adamw_update with lr, grad_scale and step
 * read at run time from scalars (PT_OPTIM_SCALARS f64 on the CPU, see
 * dispatch.h), so a captured step replays with new values; same results. */
pt_err pt_adamw_update_scalars(pt_tensor *param, pt_tensor *m, pt_tensor *v, const pt_tensor *grad,
                               const pt_tensor *scalars, float beta1, float beta2, float eps,
                               float weight_decay);

/* SGD with momentum/dampening/Nesterov/weight decay (PyTorch semantics);
 * buf may be NULL when momentum == 0. first_step initialises buf = g. */
pt_err pt_sgd_update(pt_tensor *param, pt_tensor *buf, const pt_tensor *grad, float lr,
                     float momentum, float dampening, float weight_decay, float grad_scale,
                     bool nesterov, bool first_step);

/* pt_sgd_update_scalars is pt_sgd_update with lr, grad_scale and first_step
 * read at run time from scalars (as for pt_adamw_update_scalars). */
pt_err pt_sgd_update_scalars(pt_tensor *param, pt_tensor *buf, const pt_tensor *grad,
                             const pt_tensor *scalars, float momentum, float dampening,
                             float weight_decay, bool nesterov);

#endif
