/* loss.c - cross-entropy and MSE loss objects over the dispatcher's ops. */
#include "loss.h"

#include <stdlib.h>

#include "ops.h"

struct pt_loss {
	pt_loss_kind kind;
	int64_t ignore_index;
	pt_tensor losses; /* (rows) per-row cross-entropy */
	pt_tensor probs;  /* pred-shaped softmax */
	pt_tensor scalar; /* (1) MSE */
	int64_t *host_targets;
	float *host_losses;
	int64_t rows;
};

pt_err pt_loss_create(pt_loss **out, pt_loss_kind kind, int ndim, const int64_t *shape,
                      int64_t ignore_index)
{
	return pt_loss_create_dev(out, kind, ndim, shape, ignore_index, PT_CPU);
}

pt_err pt_loss_create_dev(pt_loss **out, pt_loss_kind kind, int ndim, const int64_t *shape,
                          int64_t ignore_index, pt_device dev)
{
	pt_loss *l;
	pt_err rv;
	int64_t rows = 1;

	*out = NULL;
	if (ndim < 1)
		return pt_set_error(PT_ERR_SHAPE, "loss needs predictions with at least 1 dim");
	for (int i = 0; i + 1 < ndim; i++)
		rows *= shape[i];
	if ((l = calloc(1, sizeof(*l))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "loss");
	l->kind = kind;
	l->ignore_index = ignore_index;
	l->rows = rows;
	if (kind == PT_LOSS_CROSS_ENTROPY) {
		if ((rv = pt_tensor_init_dev(&l->losses, dev, PT_F32, 1, (int64_t[]){rows})) !=
		        PT_OK ||
		    (rv = pt_tensor_init_dev(&l->probs, dev, PT_F32, ndim, shape)) != PT_OK)
			goto fail;
		l->host_losses = malloc(sizeof(float) * (size_t)rows);
		l->host_targets = malloc(sizeof(int64_t) * (size_t)rows);
		if (!l->host_losses || !l->host_targets) {
			rv = pt_set_error(PT_ERR_NOMEM, "loss host buffers");
			goto fail;
		}
	} else if (kind == PT_LOSS_MSE) {
		if ((rv = pt_tensor_init_dev(&l->scalar, dev, PT_F32, 1, (int64_t[]){1})) != PT_OK)
			goto fail;
	} else {
		rv = pt_set_error(PT_ERR_INVALID, "unknown loss kind %d", (int)kind);
		goto fail;
	}
	*out = l;
	return PT_OK;
fail:
	pt_loss_destroy(l);
	return rv;
}

void pt_loss_destroy(pt_loss *l)
{
	if (l == NULL)
		return;
	pt_tensor_fini(&l->losses);
	pt_tensor_fini(&l->probs);
	pt_tensor_fini(&l->scalar);
	free(l->host_losses);
	free(l->host_targets);
	free(l);
}

static pt_err count_targets(pt_loss *l, const pt_tensor *target, int64_t *count)
{
	int64_t n = 0;
	PT_TRY(pt_tensor_read(target, l->host_targets, sizeof(int64_t) * (size_t)l->rows));
	for (int64_t i = 0; i < l->rows; i++)
		n += l->host_targets[i] != l->ignore_index;
	*count = n;
	return PT_OK;
}

/* ce_forward runs the cross-entropy forward (losses and probabilities in l)
 * and counts the targets that count; with loss, the mean loss too. */
static pt_err ce_forward(pt_loss *l, const pt_tensor *pred, const pt_tensor *target, double *loss,
                         int64_t *n, pt_tensor *probs)
{
	double sum = 0.0;
	if (pt_tensor_numel(target) != l->rows)
		return pt_set_error(PT_ERR_SHAPE, "cross-entropy: %ld targets for %ld rows",
		                    (long)pt_tensor_numel(target), (long)l->rows);
	PT_TRY(pt_cross_entropy_forward(&l->losses, probs, pred, target, l->ignore_index));
	PT_TRY(count_targets(l, target, n));
	if (loss == NULL)
		return PT_OK;
	PT_TRY(pt_tensor_read(&l->losses, l->host_losses, sizeof(float) * (size_t)l->rows));
	for (int64_t i = 0; i < l->rows; i++)
		sum += l->host_losses[i];
	*loss = *n ? sum / (double)*n : 0.0;
	return PT_OK;
}

pt_err pt_loss_compute_loss(pt_loss *l, const pt_tensor *pred, const pt_tensor *target,
                            double *loss, int64_t *count)
{
	int64_t n = 0;
	if (l->kind == PT_LOSS_MSE) {
		double v;
		n = pt_tensor_numel(pred);
		PT_TRY(pt_mse_forward(&l->scalar, pred, target, n ? 1.0f / (float)n : 0.0f));
		PT_TRY(pt_tensor_item(&l->scalar, 0, &v));
		*loss = v;
	} else {
		PT_TRY(ce_forward(l, pred, target, loss, &n, &l->probs));
	}
	if (count)
		*count = n;
	return PT_OK;
}

pt_err pt_loss_compute_gradient(pt_loss *l, const pt_tensor *pred, const pt_tensor *target,
                                float scale, pt_tensor *dpred)
{
	int64_t n = 0;
	if (l->kind == PT_LOSS_MSE) {
		n = pt_tensor_numel(pred);
		return pt_mse_backward(dpred, pred, target, n ? scale / (float)n : 0.0f);
	}
	/* Softmax again rather than keep per-microbatch probabilities alive. */
	PT_TRY(ce_forward(l, pred, target, NULL, &n, &l->probs));
	return pt_cross_entropy_backward(dpred, &l->probs, target, l->ignore_index,
	                                 n ? scale / (float)n : 0.0f);
}

pt_err pt_loss_compute_both(pt_loss *l, const pt_tensor *pred, const pt_tensor *target, float scale,
                            double *loss, int64_t *count, pt_tensor *dpred)
{
	int64_t n = 0;
	pt_tensor *probs;
	if (l->kind == PT_LOSS_MSE) {
		PT_TRY(pt_loss_compute_loss(l, pred, target, loss, count));
		return pt_loss_compute_gradient(l, pred, target, scale, dpred);
	}
	/* The probabilities go straight into dpred, which the backward then
	 * overwrites element by element: the loss's own buffer stays untouched
	 * (a large one is never faulted in), one pred-sized buffer less. */
	probs = dpred->ndim == pred->ndim && pt_tensor_numel(dpred) == pt_tensor_numel(pred) &&
	                pt_device_equal(pt_tensor_device(dpred), pt_tensor_device(pred)) &&
	                pt_tensor_is_contiguous(dpred)
	            ? dpred
	            : &l->probs;
	PT_TRY(ce_forward(l, pred, target, loss, &n, probs));
	if (count)
		*count = n;
	return pt_cross_entropy_backward(dpred, probs, target, l->ignore_index,
	                                 n ? scale / (float)n : 0.0f);
}
