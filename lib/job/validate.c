/* validate.c - pt_job_spec_validate: everything a run needs, checked at
 * submit time, each error naming its field. Kept apart from decoding so that
 * clients can decode and build job specs without the training stack. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "batch.h"
#include "fileio.h"
#include "job.h"
#include "job_internal.h"
#include "model_wire.h"
#include "npy.h"
#include "tokens.h"

/* ------------------------------------------------------------- validate -- */

pt_act_shape pt_job_spec_input_shape(const pt_job_spec *s, int64_t n_features)
{
	if (s->data.format == PT_DATA_NPY)
		return (pt_act_shape){PT_F32, 0, n_features};
	return (pt_act_shape){PT_I64, s->data.seq_len, 0};
}

/* ---------------------------------------------------------- data files -- */

static _Atomic uint64_t file_limit; /* pt_job_set_file_limit; 0: none */

void pt_job_set_file_limit(uint64_t bytes)
{
	file_limit = bytes;
}

pt_err pt_job_open_data(const char *field, const char *path, const char *root, bool any_path,
                        int *fd)
{
	uint64_t limit = file_limit;
	size_t size;
	pt_err rv = pt_file_open_under(root, path, any_path, fd);
	if (rv != PT_OK) {
		char why[600];
		snprintf(why, sizeof(why), "%s", pt_last_error());
		return pt_set_error(rv, "%s: %s", field, why);
	}
	/* Data files are read whole: one larger than a job's memory is refused
	 * before a byte of it is read. */
	if (limit > 0 && (rv = pt_file_fd_size(*fd, path, &size)) == PT_OK && size > limit) {
		char a[32], b[32];
		pt_job_memory_format(a, sizeof(a), size);
		pt_job_memory_format(b, sizeof(b), limit);
		rv = pt_set_error(PT_ERR_RANGE,
		                  "%s: '%s' is %s, more than a job's share of the server's memory "
		                  "(%s, --memory-limit)",
		                  field, path, a, b);
	}
	if (rv != PT_OK) {
		close(*fd);
		*fd = -1;
	}
	return rv;
}

/* read_npy reads the .npy file a field names, confined as pt_job_open_data. */
static pt_err read_npy(pt_tensor *t, const char *field, const char *path, const char *root,
                       bool any_path)
{
	int fd;
	pt_err rv;

	memset(t, 0, sizeof(*t));
	PT_TRY(pt_job_open_data(field, path, root, any_path, &fd));
	rv = pt_npy_read_fd(t, fd, path);
	close(fd);
	if (rv != PT_OK)
		return pt_set_error(rv, "%s: %s", field, pt_last_error());
	return PT_OK;
}

/* output_shape runs the layers' shape inference (pt_model_check passed). */
static pt_act_shape output_shape(const pt_job_spec *s, pt_act_shape in)
{
	pt_act_shape cur = in;
	for (int i = 0; i < s->n_layers; i++) {
		pt_act_shape next = cur;
		pt_layer_vtable(s->layers[i].kind)->infer(&s->layers[i], cur, &next);
		cur = next;
	}
	return cur;
}

static pt_err check_model(const pt_job_spec *s, pt_act_shape in)
{
	pt_err rv = pt_model_check(s->layers, s->n_layers, in);
	return rv == PT_OK ? PT_OK : pt_job_model_error(rv);
}

static bool is_int_dtype(pt_dtype dt)
{
	return dt == PT_I32 || dt == PT_I64 || dt == PT_U8 || dt == PT_U16 || dt == PT_U32;
}

static pt_err validate_npy(const pt_job_spec *s, const char *root, bool any_path)
{
	char shape[64];
	pt_tensor x = {0}, y = {0};
	pt_act_shape out;
	int64_t n, f, train;
	pt_err rv;

	if (s->data.features == NULL || s->data.features[0] == 0)
		return pt_set_error(PT_ERR_INVALID, "data.features: required for the Npy format");
	if (s->data.labels == NULL || s->data.labels[0] == 0)
		return pt_set_error(PT_ERR_INVALID, "data.labels: required for the Npy format");
	if (s->data.tokens != NULL || s->data.val_tokens != NULL)
		return pt_set_error(PT_ERR_INVALID, "data.%s: only for the Tokens formats",
		                    s->data.tokens != NULL ? "tokens" : "val_tokens");
	if (!(s->data.held_out >= 0.0f && s->data.held_out < 1.0f))
		return pt_set_error(PT_ERR_RANGE, "data.held_out: %g is not in [0, 1)",
		                    (double)s->data.held_out);
	PT_TRY(read_npy(&x, "data.features", s->data.features, root, any_path));
	if ((rv = read_npy(&y, "data.labels", s->data.labels, root, any_path)) != PT_OK)
		goto out;
	if (x.ndim != 2 || x.shape[0] < 1 || x.shape[1] < 1 ||
	    !(x.dtype == PT_F32 || x.dtype == PT_F64 || x.dtype == PT_F16 ||
	      is_int_dtype(x.dtype))) {
		rv = pt_set_error(PT_ERR_SHAPE,
		                  "data.features: '%s' is %s %s; expected (N, F) numbers",
		                  s->data.features, pt_dtype_name(x.dtype),
		                  pt_shape_str(shape, sizeof(shape), x.ndim, x.shape));
		goto out;
	}
	n = x.shape[0];
	f = x.shape[1];
	if ((rv = check_model(s, pt_job_spec_input_shape(s, f))) != PT_OK)
		goto out;
	out = output_shape(s, pt_job_spec_input_shape(s, f));
	if (y.ndim < 1 || y.shape[0] != n) {
		rv = pt_set_error(
		    PT_ERR_SHAPE, "data.labels: %s rows for %ld samples of data.features",
		    y.ndim ? pt_shape_str(shape, sizeof(shape), 1, y.shape) : "no", (long)n);
		goto out;
	}
	if (s->loss == PT_LOSS_CROSS_ENTROPY) {
		if (y.ndim != 1 || !is_int_dtype(y.dtype)) {
			rv = pt_set_error(
			    PT_ERR_DTYPE,
			    "loss: CrossEntropy needs integer labels (N,); data.labels "
			    "is %s %s",
			    pt_dtype_name(y.dtype),
			    pt_shape_str(shape, sizeof(shape), y.ndim, y.shape));
			goto out;
		}
		if (out.seq != 0) {
			rv = pt_set_error(
			    PT_ERR_SHAPE,
			    "model[%d]: the model outputs a sequence; labels (N,) need "
			    "one row of logits per sample",
			    s->n_layers - 1);
			goto out;
		}
		for (int64_t i = 0; i < n; i++) {
			double v;
			pt_tensor_item(&y, i, &v);
			if ((int64_t)v == s->ignore_index)
				continue;
			if (v < 0 || v >= (double)out.features) {
				rv = pt_set_error(
				    PT_ERR_RANGE,
				    "data.labels: label %.0f at row %ld is outside the %ld "
				    "classes of model[%d]",
				    v, (long)i, (long)out.features, s->n_layers - 1);
				goto out;
			}
		}
	} else {
		if (y.ndim != 2 || is_int_dtype(y.dtype)) {
			rv = pt_set_error(
			    PT_ERR_DTYPE,
			    "loss: MSE needs float targets (N, K); data.labels is %s %s",
			    pt_dtype_name(y.dtype),
			    pt_shape_str(shape, sizeof(shape), y.ndim, y.shape));
			goto out;
		}
		if (out.seq != 0 || y.shape[1] != out.features) {
			rv = pt_set_error(PT_ERR_SHAPE,
			                  "data.labels: targets of %ld values do not match the %ld "
			                  "outputs of model[%d]",
			                  (long)y.shape[1], (long)out.features, s->n_layers - 1);
			goto out;
		}
	}
	train = n - (int64_t)floor((double)s->data.held_out * (double)n);
	if (train < s->batch_size) {
		rv = pt_set_error(PT_ERR_RANGE,
		                  "data: %ld training samples (%ld, %g held out) are fewer than "
		                  "batch_size %ld",
		                  (long)train, (long)n, (double)s->data.held_out,
		                  (long)s->batch_size);
		goto out;
	}
	rv = PT_OK;
out:
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	return rv;
}

pt_dtype pt_job_token_dtype(pt_data_format f)
{
	return f == PT_DATA_TOKENS16 ? PT_U16 : f == PT_DATA_TOKENS32 ? PT_U32 : PT_TOKENS_AUTO;
}

static const char *format_name(pt_data_format f)
{
	return f == PT_DATA_TOKENS16 ? "Tokens16" : f == PT_DATA_TOKENS32 ? "Tokens32" : "Auto";
}

/* check_format reads the header of the open token file a field names and
 * refuses a format that disagrees with an llm.c header, naming data.format. */
static pt_err check_format(const pt_job_spec *s, const char *field, const char *path, int fd,
                           pt_tokens_info *info)
{
	pt_dtype want = pt_job_token_dtype(s->data.format);
	pt_err rv = pt_tokens_info_fd(fd, path, PT_TOKENS_AUTO, info);

	if (rv != PT_OK)
		return pt_set_error(rv, "%s: %s", field, pt_last_error());
	if (info->version != 0 && want != PT_TOKENS_AUTO && want != info->dtype)
		return pt_set_error(
		    PT_ERR_FORMAT,
		    "data.format: %s, but %s '%s' has an llm.c header of version %d "
		    "(%s tokens): use %s or Auto",
		    format_name(s->data.format), field, path, info->version,
		    pt_dtype_name(info->dtype), info->dtype == PT_U16 ? "Tokens16" : "Tokens32");
	if (info->version == 0 && want != PT_TOKENS_AUTO &&
	    (rv = pt_tokens_info_fd(fd, path, want, info)) != PT_OK)
		return pt_set_error(rv, "%s: %s", field, pt_last_error());
	return PT_OK;
}

pt_err pt_job_load_tokens(const pt_job_spec *s, const char *field, const char *path,
                          const char *root, bool any_path, pt_tokens *tk)
{
	pt_tokens_info info;
	int fd;
	pt_err rv;

	memset(tk, 0, sizeof(*tk));
	PT_TRY(pt_job_open_data(field, path, root, any_path, &fd));
	if ((rv = check_format(s, field, path, fd, &info)) == PT_OK &&
	    (rv = pt_tokens_load_fd(tk, fd, path, pt_job_token_dtype(s->data.format),
	                            s->data.vocab)) != PT_OK)
		rv = pt_set_error(rv, "%s: %s", field, pt_last_error());
	close(fd);
	return rv;
}

/* token_file loads a token file of the job and checks it against the model. */
static pt_err token_file(const pt_job_spec *s, const char *field, const char *path,
                         const char *root, bool any_path, pt_tokens *tk)
{
	const pt_layer_spec *emb = &s->layers[0];

	PT_TRY(pt_job_load_tokens(s, field, path, root, any_path, tk));
	if (tk->count < s->data.seq_len + 1)
		return pt_set_error(PT_ERR_RANGE,
		                    "%s: '%s' holds %ld tokens, fewer than seq_len + 1 = %ld",
		                    field, path, (long)tk->count, (long)s->data.seq_len + 1);
	if ((int64_t)tk->max_token >= emb->vocab)
		return pt_set_error(PT_ERR_RANGE,
		                    "%s: token %u is outside the embedding's vocab %ld "
		                    "(model[0].vocab)",
		                    field, tk->max_token, (long)emb->vocab);
	return PT_OK;
}

static pt_err validate_tokens(const pt_job_spec *s, const char *root, bool any_path)
{
	const pt_layer_spec *emb = &s->layers[0];
	pt_tokens tk = {0}, val = {0};
	pt_act_shape in = pt_job_spec_input_shape(s, 0), out;
	int64_t vocab, T = s->data.seq_len;
	pt_err rv;

	if (s->data.tokens == NULL || s->data.tokens[0] == 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "data.tokens: required for the Tokens16, Tokens32 and Auto "
		                    "formats");
	if (s->data.features != NULL || s->data.labels != NULL)
		return pt_set_error(PT_ERR_INVALID, "data.%s: only for the Npy format",
		                    s->data.features ? "features" : "labels");
	if (s->data.val_tokens != NULL && s->data.val_tokens[0] == 0)
		return pt_set_error(PT_ERR_INVALID, "data.val_tokens: empty path");
	if (!(s->data.held_out >= 0.0f && s->data.held_out < 1.0f))
		return pt_set_error(PT_ERR_RANGE, "data.held_out: %g is not in [0, 1)",
		                    (double)s->data.held_out);
	if (s->data.seq_len <= 0)
		return pt_set_error(PT_ERR_RANGE, "data.seq_len: %ld must be > 0 for token data",
		                    (long)s->data.seq_len);
	if (s->data.vocab < 0)
		return pt_set_error(PT_ERR_RANGE, "data.vocab: %ld must be >= 0",
		                    (long)s->data.vocab);
	if (s->loss != PT_LOSS_CROSS_ENTROPY)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "loss: MSE needs float targets; token data gives integer labels");
	if (emb->kind != PT_LAYER_EMBEDDING)
		return pt_set_error(PT_ERR_INVALID,
		                    "model[0] (%s): token data needs an embedding as the first "
		                    "layer",
		                    pt_layer_kind_name(emb->kind));
	if (emb->max_seq > 0 && s->data.seq_len > emb->max_seq)
		return pt_set_error(PT_ERR_RANGE, "data.seq_len: %ld exceeds model[0].max_seq %ld",
		                    (long)s->data.seq_len, (long)emb->max_seq);
	if (s->data.vocab > emb->vocab)
		return pt_set_error(PT_ERR_RANGE,
		                    "data.vocab: %ld exceeds the embedding's vocab %ld "
		                    "(model[0].vocab)",
		                    (long)s->data.vocab, (long)emb->vocab);
	PT_TRY(check_model(s, in));
	out = output_shape(s, in);
	vocab = s->data.vocab > 0 ? s->data.vocab : emb->vocab;
	if (out.seq != s->data.seq_len || out.features < vocab)
		return pt_set_error(PT_ERR_SHAPE,
		                    "model[%d]: outputs (%ld, %ld) per sample; next-token targets "
		                    "need (%ld, >= %ld)",
		                    s->n_layers - 1, (long)out.seq, (long)out.features,
		                    (long)s->data.seq_len, (long)vocab);
	rv = token_file(s, "data.tokens", s->data.tokens, root, any_path, &tk);
	if (rv == PT_OK && s->data.val_tokens != NULL) {
		rv = token_file(s, "data.val_tokens", s->data.val_tokens, root, any_path, &val);
	} else if (rv == PT_OK) {
		int64_t split = pt_tokens_split(tk.count, (double)s->data.held_out);
		if (split < T + 1)
			rv = pt_set_error(
			    PT_ERR_RANGE,
			    "data.held_out: %g of %ld tokens leaves %ld for training, "
			    "fewer than seq_len + 1 = %ld",
			    (double)s->data.held_out, (long)tk.count, (long)split, (long)T + 1);
		else if (split < tk.count && pt_tokens_n_windows(split, tk.count, T) == 0)
			rv = pt_set_error(PT_ERR_RANGE,
			                  "data.held_out: the last %ld tokens (%g of %ld) hold no "
			                  "evaluation window of seq_len + 1 = %ld tokens",
			                  (long)(tk.count - split), (double)s->data.held_out,
			                  (long)tk.count, (long)T + 1);
	}
	pt_tokens_fini(&tk);
	pt_tokens_fini(&val);
	return rv;
}

pt_err pt_job_data_describe(const pt_job_spec *s, const char *root, bool any_path, char *buf,
                            size_t cap)
{
	pt_tokens_info info, vinfo = {0};
	char what[32];
	int64_t T = s->data.seq_len, lo, hi, n;
	int fd;
	pt_err rv;

	if (cap)
		buf[0] = '\0';
	if (s->data.format == PT_DATA_NPY) {
		pt_job_data_shape d;
		PT_TRY(pt_job_data_shape_read(s, root, any_path, &d));
		n = (int64_t)floor((double)s->data.held_out * (double)d.rows);
		snprintf(buf, cap, "eval: %ld held-out rows", (long)n);
		return PT_OK;
	}
	PT_TRY(pt_job_open_data("data.tokens", s->data.tokens, root, any_path, &fd));
	rv = check_format(s, "data.tokens", s->data.tokens, fd, &info);
	close(fd);
	PT_TRY(rv);
	if (s->data.val_tokens != NULL) {
		PT_TRY(
		    pt_job_open_data("data.val_tokens", s->data.val_tokens, root, any_path, &fd));
		rv = check_format(s, "data.val_tokens", s->data.val_tokens, fd, &vinfo);
		close(fd);
		PT_TRY(rv);
		lo = 0;
		hi = vinfo.count;
	} else {
		lo = pt_tokens_split(info.count, (double)s->data.held_out);
		hi = info.count;
	}
	n = pt_tokens_n_windows(lo, hi, T);
	if (info.version != 0)
		snprintf(what, sizeof(what), "llm.c header v%d", info.version);
	else
		snprintf(what, sizeof(what), "raw, no header");
	snprintf(buf, cap,
	         "data.tokens: %ld %s tokens (%s%s); eval: %ld windows of %ld tokens from %s",
	         (long)info.count, pt_dtype_name(info.dtype), what,
	         s->data.format == PT_DATA_AUTO ? "; picked by Auto" : "", (long)n, (long)T,
	         s->data.val_tokens ? "data.val_tokens" : "the held-out end of data.tokens");
	return PT_OK;
}

/* validate_device accepts "cpu", and "cuda:N" when that device is here
 * (lib/backend says why not: no such device, or a build without CUDA). */
static pt_err validate_device(const char *dev)
{
	const char *p;
	char *end;
	long n;
	if (dev == NULL || strcmp(dev, "cpu") == 0)
		return PT_OK;
	if (strncmp(dev, "cuda:", 5) != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "device: \"%s\" (expected \"cpu\" or \"cuda:N\")", dev);
	p = dev + 5;
	errno = 0;
	n = strtol(p, &end, 10);
	if (*p < '0' || *p > '9' || *end != 0 || errno != 0 || n < 0 || n > 1023)
		return pt_set_error(PT_ERR_INVALID,
		                    "device: \"%s\" (expected \"cuda:N\" with N a device number)",
		                    dev);
	if (pt_backend_check_device((pt_device){PT_DEV_CUDA, (int)n}) != PT_OK) {
		char why[400];
		snprintf(why, sizeof(why), "%s", pt_last_error());
		return pt_set_error(PT_ERR_UNSUPPORTED, "device: %s", why);
	}
	return PT_OK;
}

pt_precision pt_job_spec_precision(const pt_job_spec *s)
{
	if (s->precision != NULL && strcmp(s->precision, "bf16") == 0)
		return PT_PREC_BF16;
	if (s->precision != NULL && strcmp(s->precision, "tf32") == 0)
		return PT_PREC_TF32;
	return PT_PREC_FP32;
}

int pt_job_spec_virtual_stages(const pt_job_spec *s)
{
	if (s->schedule == NULL || strcmp(s->schedule, "interleaved") != 0)
		return 1;
	return s->virtual_stages > 0 ? s->virtual_stages : 2;
}

/* check_interleaved: p * v chunks of at least a layer each, m a multiple of
 * p, the partitioner's boundaries (docs/pipeline.md). */
static pt_err check_interleaved(const pt_job_spec *s)
{
	int v = pt_job_spec_virtual_stages(s);
	int64_t pv = (int64_t)s->stages * v; /* stages is not range-checked yet */

	if (v < 2 || v > 8)
		return pt_set_error(PT_ERR_RANGE, "virtual_stages: %d (2 to 8)", s->virtual_stages);
	if (pv > PT_MAX_STAGES || pv > s->n_layers)
		return pt_set_error(PT_ERR_RANGE,
		                    "virtual_stages: %d stages of %d chunks need %" PRId64
		                    " layers at least; "
		                    "the model has %d",
		                    s->stages, v, pv, s->n_layers);
	if (s->stages > 1 && s->microbatches % s->stages != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "microbatches: %d is not a multiple of placement.stages %d "
		                    "(schedule interleaved)",
		                    s->microbatches, s->stages);
	if (s->boundaries != NULL)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "placement.boundaries: not with schedule interleaved (its %" PRId64
		    " chunks are balanced by the partitioner)",
		    pv);
	if (s->device != NULL && strncmp(s->device, "cuda:", 5) == 0)
		return pt_set_error(
		    PT_ERR_UNSUPPORTED,
		    "schedule: interleaved on CUDA (device %s) is not built yet (a "
		    "rank's chunks would share a GPU, and NCCL takes one rank a GPU)",
		    s->device);
	return PT_OK;
}

pt_err pt_job_spec_validate(const pt_job_spec *s, const char *files_root, bool any_path)
{
	pt_err rv;

	/* The model on its own. */
	if (s->n_layers <= 0 || s->layers == NULL)
		return pt_set_error(PT_ERR_INVALID, "model: no layers (a job needs at least one)");
	if (s->n_layers > PT_MAX_LAYERS)
		return pt_set_error(PT_ERR_RANGE, "model: %d layers (at most %d)", s->n_layers,
		                    PT_MAX_LAYERS);
	for (int i = 0; i < s->n_layers; i++)
		if ((unsigned)s->layers[i].kind >= PT_LAYER_KIND_COUNT)
			return pt_set_error(PT_ERR_INVALID, "model[%d].kind: unknown layer kind %d",
			                    i, (int)s->layers[i].kind);

	/* Batching and length. */
	if (s->batch_size <= 0)
		return pt_set_error(PT_ERR_RANGE, "batch_size: %ld must be > 0",
		                    (long)s->batch_size);
	if (s->microbatches <= 0)
		return pt_set_error(PT_ERR_RANGE, "microbatches: %d must be > 0", s->microbatches);
	if (s->batch_size % s->microbatches != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "microbatches: %d does not divide batch_size %ld",
		                    s->microbatches, (long)s->batch_size);
	if (s->steps <= 0)
		return pt_set_error(PT_ERR_RANGE, "steps: %ld must be > 0", (long)s->steps);
	if (s->eval_every < 0)
		return pt_set_error(PT_ERR_RANGE, "eval_every: %ld must be >= 0",
		                    (long)s->eval_every);
	if ((unsigned)s->mode > PT_MODE_ASYNC)
		return pt_set_error(PT_ERR_INVALID, "mode: unknown mode %d", (int)s->mode);

	/* Placement. */
	if (s->stages < 1 || s->stages > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "placement.stages: %d (1 to %d)", s->stages,
		                    PT_MAX_STAGES);
	if (s->stages > s->n_layers)
		return pt_set_error(PT_ERR_RANGE, "placement.stages: %d stages for %d layers",
		                    s->stages, s->n_layers);
	if (s->boundaries != NULL &&
	    (rv = pt_partition_check(s->n_layers, s->stages, s->boundaries)) != PT_OK)
		return pt_set_error(rv, "placement.boundaries: %s", pt_last_error());
	if (s->threads_per_stage < 0 || s->threads_per_stage > 1024)
		return pt_set_error(PT_ERR_RANGE, "placement.threads_per_stage: %d (0 to 1024)",
		                    s->threads_per_stage);
	if (s->n_workers > 0 && s->n_workers < s->stages)
		return pt_set_error(PT_ERR_INVALID,
		                    "placement.workers: %d URLs for %d stages (one per stage; "
		                    "more are spares)",
		                    s->n_workers, s->stages);
	if (s->worker_timeout_ms < 100 || s->worker_timeout_ms > 3600000)
		return pt_set_error(PT_ERR_RANGE,
		                    "placement.worker_timeout_ms: %d (100 to 3600000)",
		                    s->worker_timeout_ms);
	if (s->max_restarts < 0 || s->max_restarts > 1000)
		return pt_set_error(PT_ERR_RANGE, "max_restarts: %d (0 to 1000)", s->max_restarts);
	if (s->priority < -1000 || s->priority > 1000)
		return pt_set_error(PT_ERR_RANGE, "priority: %d (-1000 to 1000)", s->priority);
	if (s->schedule != NULL) {
		pt_pipe_schedule sc = PT_SCHED_MODE;
		if (strcmp(s->schedule, "auto") != 0 &&
		    pt_pipe_schedule_parse(s->schedule, &sc) != PT_OK)
			return pt_set_error(
			    PT_ERR_INVALID,
			    "schedule: \"%.40s\" (gpipe, 1f1b, zb-h1, interleaved or "
			    "auto)",
			    s->schedule);
		if (s->mode == PT_MODE_ASYNC)
			return pt_set_error(PT_ERR_INVALID,
			                    "schedule: \"%s\" with mode Async, which has its own "
			                    "(no flush); use mode Sync or SemiAsync",
			                    s->schedule);
		if (sc == PT_SCHED_ZBH1 && s->recompute)
			return pt_set_error(
			    PT_ERR_INVALID,
			    "schedule: zb-h1 keeps each microbatch's activations until "
			    "its weight gradients; it does not combine with recompute");
		if (sc == PT_SCHED_INTERLEAVED && (rv = check_interleaved(s)) != PT_OK)
			return rv;
	}
	if (s->precision != NULL && strcmp(s->precision, "fp32") != 0 &&
	    strcmp(s->precision, "bf16") != 0 && strcmp(s->precision, "tf32") != 0)
		return pt_set_error(PT_ERR_INVALID, "precision: \"%.40s\" (fp32, bf16 or tf32)",
		                    s->precision);
	if (s->virtual_stages != 0 &&
	    (s->schedule == NULL || strcmp(s->schedule, "interleaved") != 0))
		return pt_set_error(PT_ERR_INVALID,
		                    "virtual_stages: %d needs schedule \"interleaved\"",
		                    s->virtual_stages);
	for (int i = 0; i < s->n_workers; i++) {
		/* The control URL of a `pipeserver --worker` (lib/job/workers.c). */
		static const char *const schemes[] = {"tcp://", "tcp4://",     "tcp6://",
		                                      "ipc://", "abstract://", "tls+tcp://"};
		const char *u = s->workers[i];
		bool known = false;
		for (size_t k = 0; u != NULL && k < sizeof(schemes) / sizeof(schemes[0]); k++)
			if (strncmp(u, schemes[k], strlen(schemes[k])) == 0 &&
			    u[strlen(schemes[k])] != '\0')
				known = true;
		if (!known)
			return pt_set_error(
			    PT_ERR_INVALID,
			    "placement.workers[%d]: '%s' is not a tcp://, tls+tcp:// or ipc:// URL",
			    i, u ? u : "(null)");
	}

	/* Checkpoints. */
	if (s->checkpoint_every < 0)
		return pt_set_error(PT_ERR_RANGE, "checkpoint.every_steps: %ld must be >= 0",
		                    (long)s->checkpoint_every);
	if (s->checkpoint_keep < 1 || s->checkpoint_keep > PT_JOB_MAX_KEEP)
		return pt_set_error(PT_ERR_RANGE, "checkpoint.keep: %d must be in [1, %d]",
		                    s->checkpoint_keep, PT_JOB_MAX_KEEP);

	/* Optimizer, device, loss. */
	if ((rv = pt_optim_validate(&s->optim)) != PT_OK)
		return pt_job_optim_error(rv);
	PT_TRY(validate_device(s->device));
	if ((unsigned)s->loss > PT_LOSS_MSE)
		return pt_set_error(PT_ERR_INVALID, "loss: unknown loss kind %d", (int)s->loss);
	if (s->loss != PT_LOSS_CROSS_ENTROPY && s->ignore_index != -1)
		return pt_set_error(PT_ERR_INVALID,
		                    "ignore_index: %ld is only meaningful with CrossEntropy",
		                    (long)s->ignore_index);

	PT_TRY(pt_job_init_from_validate(s, files_root, any_path));

	/* Data: fields for the format, files, shapes against the model. */
	switch (s->data.format) {
	case PT_DATA_NPY:
		return validate_npy(s, files_root, any_path);
	case PT_DATA_TOKENS16:
	case PT_DATA_TOKENS32:
	case PT_DATA_AUTO:
		return validate_tokens(s, files_root, any_path);
	}
	return pt_set_error(PT_ERR_INVALID, "data.format: unknown data format %d",
	                    (int)s->data.format);
}
