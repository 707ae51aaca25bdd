/* batch.h - in-memory datasets, seeded shuffles and splits, batches, microbatches.
 *
 * A dataset is features x (N, F) f32 and either labels y (N,) i64 (for
 * cross-entropy) or targets y (N, K) f32 (for MSE). Every random choice comes
 * from Philox with an explicit (seed, stream), so an epoch's order or a split
 * can be recomputed anywhere from two integers:
 *   epoch e of a shuffled iterator: pt_shuffle_indices(order, N, seed, e);
 *   pt_dataset_split:               stream PT_SPLIT_STREAM.
 * Batches are written into caller-allocated tensors: iterating allocates nothing.
 */
#ifndef PT_BATCH_H
#define PT_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

/* The Philox stream of the train/held-out permutation (epochs use 0, 1, ...). */
#define PT_SPLIT_STREAM UINT64_C(0x73706c6974000000) /* "split" */

typedef struct pt_dataset {
	pt_tensor x; /* (N, F) f32, contiguous */
	pt_tensor y; /* (N,) i64 labels or (N, K) f32 targets, contiguous */
	int64_t n;   /* N */
} pt_dataset;

/* pt_dataset_init makes ds from contiguous CPU tensors x (N, F) and y (N,) or
 * (N, K). Tensors already of the right dtype are shared (ds takes its own
 * references); with convert, x of another dtype (f64, u8, ...) becomes f32,
 * 1-d y of an integer dtype becomes i64 and 2-d y f64 becomes f32, in new
 * tensors; without convert a wrong dtype is PT_ERR_DTYPE. Values are converted
 * as numbers (u8 pixel 16 becomes 16.0f: no scaling). On error ds is zeroed
 * and pt_dataset_fini is still safe. */
pt_err pt_dataset_init(pt_dataset *ds, const pt_tensor *x, const pt_tensor *y, bool convert);

/* pt_dataset_load_npy is pt_dataset_init on the arrays of two .npy files. */
pt_err pt_dataset_load_npy(pt_dataset *ds, const char *x_path, const char *y_path, bool convert);

/* pt_dataset_fini releases ds's tensors. NULL-safe. */
void pt_dataset_fini(pt_dataset *ds);

/* pt_dataset_split copies the rows of ds into train and held by one seeded
 * permutation (pt_shuffle_indices(perm, N, seed, PT_SPLIT_STREAM)): the last
 * floor(held_fraction * N) rows of the permutation are held out, the others
 * train, each in permutation order. held_fraction is in [0, 1]. The caller
 * releases both with pt_dataset_fini; on error both are zeroed. */
pt_err pt_dataset_split(pt_dataset *train, pt_dataset *held, const pt_dataset *ds,
                        double held_fraction, uint64_t seed);

/* pt_shuffle_indices sets perm[n] to a uniformly random permutation of 0..n-1:
 * Fisher-Yates from i = n-1 down to 1, swapping perm[i] with perm[j], j drawn
 * uniformly from [0, i] by rejection from 64 Philox bits (seed, stream,
 * counter = 0, 1, ... one block per draw). Pure; thread-safe. */
void pt_shuffle_indices(int64_t *perm, int64_t n, uint64_t seed, uint64_t stream);

/* A batch iterator over a dataset it borrows (ds must outlive it). One
 * iterator belongs to one thread. */
typedef struct pt_batch_iter {
	const pt_dataset *ds;
	int64_t batch; /* B */
	bool shuffle, drop_last;
	uint64_t seed, epoch;
	int64_t pos;    /* next row of order */
	int64_t *order; /* (N) row order of the current epoch */
} pt_batch_iter;

/* pt_batch_iter_init prepares epoch 0. batch must be >= 1. */
pt_err pt_batch_iter_init(pt_batch_iter *it, const pt_dataset *ds, int64_t batch, bool shuffle,
                          bool drop_last, uint64_t seed);

/* pt_batch_iter_fini frees the order. NULL-safe; safe after a failed init. */
void pt_batch_iter_fini(pt_batch_iter *it);

/* pt_batch_iter_set_epoch restarts at the first batch of epoch e, whose order
 * is pt_shuffle_indices(order, N, seed, e) (identity without shuffle). */
void pt_batch_iter_set_epoch(pt_batch_iter *it, uint64_t epoch);

/* pt_batch_iter_batches returns the number of batches in one epoch. */
int64_t pt_batch_iter_batches(const pt_batch_iter *it);

/* pt_batch_iter_next copies the next batch into x (B, F) f32 and y (B,) i64 or
 * (B, K) f32 (contiguous, caller-allocated, shaped for the full batch) and
 * sets *rows to the number of rows filled: B, fewer for a final partial batch
 * (then rows [*rows, B) are left as they were; narrow the tensors to use it),
 * or 0 at the end of the epoch (drop_last skips a partial batch). */
pt_err pt_batch_iter_next(pt_batch_iter *it, pt_tensor *x, pt_tensor *y, int64_t *rows);

/* pt_microbatch_split makes views[0..m) the m equal slices of batch along
 * dim 0 (views share batch's storage; release each with pt_tensor_fini).
 * PT_ERR_INVALID when m <= 0 or the batch size is not a multiple of m; then
 * views is untouched. */
pt_err pt_microbatch_split(pt_tensor *views, const pt_tensor *batch, int m);

#endif
