/* batch.c - datasets, Fisher-Yates over Philox, splits, batch iteration. */
#include "batch.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "npy.h"
#include "rng.h"

void pt_shuffle_indices(int64_t *perm, int64_t n, uint64_t seed, uint64_t stream)
{
	uint64_t counter = 0;

	for (int64_t i = 0; i < n; i++)
		perm[i] = i;
	for (int64_t i = n - 1; i > 0; i--) {
		uint64_t bound = (uint64_t)i + 1, r, j;
		uint64_t reject_below = (0 - bound) % bound; /* 2^64 mod bound */
		uint32_t w[4];
		do {
			pt_philox(seed, stream, counter++, w);
			r = (uint64_t)w[1] << 32 | w[0];
		} while (r < reject_below);
		j = r % bound;
		int64_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
}

static bool is_integer_dtype(pt_dtype dt)
{
	return dt == PT_I32 || dt == PT_I64 || dt == PT_U8 || dt == PT_U16 || dt == PT_U32;
}

/* to_i64 makes dst a new i64 copy of integer tensor src (contiguous). */
static pt_err to_i64(pt_tensor *dst, const pt_tensor *src)
{
	int64_t n = pt_tensor_numel(src);
	const char *s = pt_tensor_data(src);
	int64_t *d;

	PT_TRY(pt_tensor_init(dst, PT_I64, src->ndim, src->shape));
	d = pt_tensor_data(dst);
	for (int64_t i = 0; i < n; i++) {
		switch (src->dtype) {
		case PT_I32: {
			int32_t v;
			memcpy(&v, s + 4 * i, 4);
			d[i] = v;
			break;
		}
		case PT_U8:
			d[i] = (unsigned char)s[i];
			break;
		case PT_U16: {
			uint16_t v;
			memcpy(&v, s + 2 * i, 2);
			d[i] = v;
			break;
		}
		case PT_U32: {
			uint32_t v;
			memcpy(&v, s + 4 * i, 4);
			d[i] = v;
			break;
		}
		default:
			memcpy(&d[i], s + 8 * i, 8);
			break;
		}
	}
	return PT_OK;
}

/* adopt makes dst hold src as dtype want: a shared view when it already is,
 * else a converted copy when allowed. */
static pt_err adopt(pt_tensor *dst, const pt_tensor *src, pt_dtype want, bool convert,
                    const char *what)
{
	pt_err rv;

	if (src->storage == NULL || src->storage->device.kind != PT_DEV_CPU ||
	    !pt_tensor_is_contiguous(src))
		return pt_set_error(PT_ERR_INVALID, "dataset: %s must be a contiguous CPU tensor",
		                    what);
	PT_TRY(pt_tensor_sync(src));
	if (src->dtype == want) {
		pt_tensor_view(dst, src);
		return PT_OK;
	}
	if (!convert)
		return pt_set_error(PT_ERR_DTYPE,
		                    "dataset: %s is %s, expected %s (load with convert to convert)",
		                    what, pt_dtype_name(src->dtype), pt_dtype_name(want));
	if (want == PT_I64) {
		if (!is_integer_dtype(src->dtype))
			return pt_set_error(PT_ERR_DTYPE,
			                    "dataset: %s labels are %s, not an integer dtype", what,
			                    pt_dtype_name(src->dtype));
		return to_i64(dst, src);
	}
	PT_TRY(pt_tensor_init(dst, want, src->ndim, src->shape));
	if ((rv = pt_tensor_convert(dst, src)) != PT_OK)
		pt_tensor_fini(dst);
	return rv;
}

pt_err pt_dataset_init(pt_dataset *ds, const pt_tensor *x, const pt_tensor *y, bool convert)
{
	char a[96], b[96];
	pt_err rv;

	memset(ds, 0, sizeof(*ds));
	if (x->ndim != 2 || y->ndim < 1 || y->ndim > 2 || y->shape[0] != x->shape[0])
		return pt_set_error(PT_ERR_SHAPE,
		                    "dataset: x %s and y %s: need x (N, F) and y (N,) or (N, K)",
		                    pt_shape_str(a, sizeof(a), x->ndim, x->shape),
		                    pt_shape_str(b, sizeof(b), y->ndim, y->shape));
	if ((rv = adopt(&ds->x, x, PT_F32, convert, "x")) != PT_OK)
		return rv;
	rv = adopt(&ds->y, y, y->ndim == 1 ? PT_I64 : PT_F32, convert, "y");
	if (rv != PT_OK) {
		pt_dataset_fini(ds);
		return rv;
	}
	ds->n = x->shape[0];
	return PT_OK;
}

pt_err pt_dataset_load_npy(pt_dataset *ds, const char *x_path, const char *y_path, bool convert)
{
	pt_tensor x, y;
	pt_err rv;

	memset(ds, 0, sizeof(*ds));
	PT_TRY(pt_npy_read(&x, x_path));
	if ((rv = pt_npy_read(&y, y_path)) == PT_OK) {
		rv = pt_dataset_init(ds, &x, &y, convert);
		pt_tensor_fini(&y);
	}
	pt_tensor_fini(&x);
	return rv;
}

void pt_dataset_fini(pt_dataset *ds)
{
	if (ds == NULL)
		return;
	pt_tensor_fini(&ds->x);
	pt_tensor_fini(&ds->y);
	ds->n = 0;
}

static size_t row_bytes(const pt_tensor *t)
{
	return t->shape[0] ? pt_tensor_nbytes(t) / (size_t)t->shape[0] : 0;
}

/* gather_rows copies rows idx[0..n) of src into rows 0..n of dst (both contiguous). */
static void gather_rows(pt_tensor *dst, const pt_tensor *src, const int64_t *idx, int64_t n)
{
	size_t rb = row_bytes(src);
	char *d = pt_tensor_data(dst);
	const char *s = pt_tensor_data(src);

	for (int64_t i = 0; i < n; i++)
		memcpy(d + (size_t)i * rb, s + (size_t)idx[i] * rb, rb);
}

/* subset makes out a dataset of the rows idx[0..n) of ds. */
static pt_err subset(pt_dataset *out, const pt_dataset *ds, const int64_t *idx, int64_t n)
{
	int64_t shape[2];
	pt_err rv;

	memset(out, 0, sizeof(*out));
	shape[0] = n;
	shape[1] = ds->x.shape[1];
	PT_TRY(pt_tensor_init(&out->x, PT_F32, 2, shape));
	shape[1] = ds->y.ndim == 2 ? ds->y.shape[1] : 0;
	if ((rv = pt_tensor_init(&out->y, ds->y.dtype, ds->y.ndim, shape)) != PT_OK) {
		pt_dataset_fini(out);
		return rv;
	}
	gather_rows(&out->x, &ds->x, idx, n);
	gather_rows(&out->y, &ds->y, idx, n);
	out->n = n;
	return PT_OK;
}

pt_err pt_dataset_split(pt_dataset *train, pt_dataset *held, const pt_dataset *ds,
                        double held_fraction, uint64_t seed)
{
	int64_t n = ds->n, n_held, *perm;
	pt_err rv;

	memset(train, 0, sizeof(*train));
	memset(held, 0, sizeof(*held));
	if (!(held_fraction >= 0.0 && held_fraction <= 1.0))
		return pt_set_error(PT_ERR_INVALID,
		                    "dataset split: held-out fraction %g not in [0, 1]",
		                    held_fraction);
	n_held = (int64_t)floor(held_fraction * (double)n);
	perm = malloc((size_t)(n ? n : 1) * sizeof(*perm));
	if (perm == NULL)
		return pt_set_error(PT_ERR_NOMEM, "dataset split of %" PRId64 " rows", n);
	pt_shuffle_indices(perm, n, seed, PT_SPLIT_STREAM);
	rv = subset(train, ds, perm, n - n_held);
	if (rv == PT_OK && (rv = subset(held, ds, perm + (n - n_held), n_held)) != PT_OK)
		pt_dataset_fini(train);
	free(perm);
	return rv;
}

pt_err pt_batch_iter_init(pt_batch_iter *it, const pt_dataset *ds, int64_t batch, bool shuffle,
                          bool drop_last, uint64_t seed)
{
	memset(it, 0, sizeof(*it));
	if (batch < 1)
		return pt_set_error(PT_ERR_INVALID, "batch iterator: batch size %" PRId64, batch);
	it->order = malloc((size_t)(ds->n ? ds->n : 1) * sizeof(*it->order));
	if (it->order == NULL)
		return pt_set_error(PT_ERR_NOMEM, "batch order of %" PRId64 " rows", ds->n);
	it->ds = ds;
	it->batch = batch;
	it->shuffle = shuffle;
	it->drop_last = drop_last;
	it->seed = seed;
	pt_batch_iter_set_epoch(it, 0);
	return PT_OK;
}

void pt_batch_iter_fini(pt_batch_iter *it)
{
	if (it == NULL)
		return;
	free(it->order);
	memset(it, 0, sizeof(*it));
}

void pt_batch_iter_set_epoch(pt_batch_iter *it, uint64_t epoch)
{
	it->epoch = epoch;
	it->pos = 0;
	if (it->shuffle) {
		pt_shuffle_indices(it->order, it->ds->n, it->seed, epoch);
	} else {
		for (int64_t i = 0; i < it->ds->n; i++)
			it->order[i] = i;
	}
}

int64_t pt_batch_iter_batches(const pt_batch_iter *it)
{
	int64_t n = it->ds->n, b = it->batch;
	return it->drop_last ? n / b : (n + b - 1) / b;
}

/* check_batch_tensor: out must be (B, rest of src's shape) of src's dtype. */
static pt_err check_batch_tensor(const pt_tensor *out, const pt_tensor *src, int64_t b,
                                 const char *what)
{
	char a[96], e[96];
	int64_t want[PT_MAX_DIMS];

	memcpy(want, src->shape, sizeof(want));
	want[0] = b;
	if (out->dtype != src->dtype || out->ndim != src->ndim ||
	    memcmp(out->shape, want, sizeof(int64_t) * (size_t)src->ndim) != 0)
		return pt_set_error(
		    PT_ERR_SHAPE, "batch %s is %s %s, expected %s %s", what,
		    pt_shape_str(a, sizeof(a), out->ndim, out->shape), pt_dtype_name(out->dtype),
		    pt_shape_str(e, sizeof(e), src->ndim, want), pt_dtype_name(src->dtype));
	return PT_OK;
}

pt_err pt_batch_iter_next(pt_batch_iter *it, pt_tensor *x, pt_tensor *y, int64_t *rows)
{
	int64_t left = it->ds->n - it->pos, n = left < it->batch ? left : it->batch;

	*rows = 0;
	PT_TRY(check_batch_tensor(x, &it->ds->x, it->batch, "x"));
	PT_TRY(check_batch_tensor(y, &it->ds->y, it->batch, "y"));
	if (n <= 0 || (it->drop_last && n < it->batch))
		return PT_OK;
	PT_TRY(pt_data_write_begin(x, "batch x"));
	PT_TRY(pt_data_write_begin(y, "batch y"));
	gather_rows(x, &it->ds->x, it->order + it->pos, n);
	gather_rows(y, &it->ds->y, it->order + it->pos, n);
	pt_data_write_end(x);
	pt_data_write_end(y);
	it->pos += n;
	*rows = n;
	return PT_OK;
}

pt_err pt_microbatch_split(pt_tensor *views, const pt_tensor *batch, int m)
{
	int64_t b, size;

	if (batch->ndim < 1)
		return pt_set_error(PT_ERR_INVALID, "microbatch split of a 0-d tensor");
	b = batch->shape[0];
	if (m <= 0 || b % m != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "batch size %" PRId64 " cannot be split into %d microbatches%s",
		                    b, m, m <= 0 ? " (need at least 1)" : " (not a multiple)");
	size = b / m;
	for (int i = 0; i < m; i++) {
		pt_err rv = pt_tensor_narrow(&views[i], batch, 0, (int64_t)i * size, size);
		if (rv != PT_OK) {
			while (i-- > 0)
				pt_tensor_fini(&views[i]);
			return rv;
		}
	}
	return PT_OK;
}
