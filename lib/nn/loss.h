/* loss.h - loss objects with compute_loss and compute_gradient (seed 003).
 *
 * Softmax cross-entropy takes logits (N, V) or (B, T, V) and i64 class
 * indices with an ignore index; MSE takes predictions and f32 targets of the
 * same shape. Both are means: over non-ignored targets (cross-entropy) or
 * over elements (MSE). Not thread-safe (owns scratch buffers).
 */
#ifndef PT_LOSS_H
#define PT_LOSS_H

#include "tensor.h"

typedef enum pt_loss_kind { PT_LOSS_CROSS_ENTROPY, PT_LOSS_MSE } pt_loss_kind;

typedef struct pt_loss pt_loss;

/* pt_loss_create makes a loss for host predictions of the given shape;
 * pt_loss_create_dev for predictions and targets on device dev. */
pt_err pt_loss_create(pt_loss **out, pt_loss_kind kind, int ndim, const int64_t *pred_shape,
                      int64_t ignore_index);
pt_err pt_loss_create_dev(pt_loss **out, pt_loss_kind kind, int ndim, const int64_t *pred_shape,
                          int64_t ignore_index, pt_device dev);

void pt_loss_destroy(pt_loss *l);

/* pt_loss_compute_loss returns the mean loss of pred against target in *loss
 * (a sync boundary) and the number of counted targets in *count (may be NULL). */
pt_err pt_loss_compute_loss(pt_loss *l, const pt_tensor *pred, const pt_tensor *target,
                            double *loss, int64_t *count);

/* pt_loss_compute_gradient writes dpred = scale * d(mean loss)/d(pred). The
 * mean's denominator is the count of this pred/target pair; scale lets the
 * caller average over microbatches (1/m). */
pt_err pt_loss_compute_gradient(pt_loss *l, const pt_tensor *pred, const pt_tensor *target,
                                float scale, pt_tensor *dpred);

/* pt_loss_compute_both is pt_loss_compute_loss then pt_loss_compute_gradient
 * on the same pair, with bitwise the same results, computing the softmax and
 * counting the targets once. dpred may be pred itself: the gradient then
 * overwrites the predictions (same results). */
pt_err pt_loss_compute_both(pt_loss *l, const pt_tensor *pred, const pt_tensor *target, float scale,
                            double *loss, int64_t *count, pt_tensor *dpred);

#endif
