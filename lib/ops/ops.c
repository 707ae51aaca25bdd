/* ops.c - the op table (meta + plan per op) and the typed wrappers of ops.h.
 *
 * meta validates shapes and dtypes and names the op in every error. plan picks
 * the kernel for the tensors' device: CPU kernels here, any other device
 * through the backend registry (lib/backend), which knows what is built.
 */
#include "ops.h"

#include <inttypes.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_kernels.h"

/* ---- meta helpers ---- */

static pt_err need(const pt_op_call *c, const pt_tensor *t, const char *what)
{
	if (t == NULL)
		return pt_set_error(PT_ERR_INVALID, "%s: %s is required", pt_op_name(c->op), what);
	return PT_OK;
}

static pt_err need_f32(const pt_op_call *c, const pt_tensor *t, const char *what)
{
	PT_TRY(need(c, t, what));
	if (t->dtype != PT_F32)
		return pt_set_error(PT_ERR_DTYPE, "%s: %s must be f32, got %s", pt_op_name(c->op),
		                    what, pt_dtype_name(t->dtype));
	if (!pt_tensor_is_contiguous(t))
		return pt_set_error(PT_ERR_INVALID, "%s: %s must be contiguous", pt_op_name(c->op),
		                    what);
	return PT_OK;
}

/* need_f32_or_bf16: f32, or (on the CPU) bf16 - a matrix product's input
 * kept at the precision the product rounds it to anyway (a bf16 job's saved
 * activations; layers.c). Contiguous either way. */
static pt_err need_f32_or_bf16(const pt_op_call *c, const pt_tensor *t, const char *what)
{
	PT_TRY(need(c, t, what));
	if (t->dtype != PT_BF16)
		return need_f32(c, t, what);
	if (t->storage->device.kind != PT_DEV_CPU)
		return pt_set_error(PT_ERR_DTYPE, "%s: %s in bf16 is taken on the CPU only",
		                    pt_op_name(c->op), what);
	if (!pt_tensor_is_contiguous(t))
		return pt_set_error(PT_ERR_INVALID, "%s: %s must be contiguous", pt_op_name(c->op),
		                    what);
	return PT_OK;
}

static pt_err need_i64(const pt_op_call *c, const pt_tensor *t, const char *what)
{
	PT_TRY(need(c, t, what));
	if (t->dtype != PT_I64)
		return pt_set_error(PT_ERR_DTYPE, "%s: %s must be i64, got %s", pt_op_name(c->op),
		                    what, pt_dtype_name(t->dtype));
	if (!pt_tensor_is_contiguous(t))
		return pt_set_error(PT_ERR_INVALID, "%s: %s must be contiguous", pt_op_name(c->op),
		                    what);
	return PT_OK;
}

static pt_err same_shape(const pt_op_call *c, const pt_tensor *a, const char *an,
                         const pt_tensor *b, const char *bn)
{
	char x[96], y[96];
	if (!pt_tensor_same_shape(a, b))
		return pt_set_error(PT_ERR_SHAPE, "%s: %s %s and %s %s differ", pt_op_name(c->op),
		                    an, pt_shape_str(x, sizeof(x), a->ndim, a->shape), bn,
		                    pt_shape_str(y, sizeof(y), b->ndim, b->shape));
	return PT_OK;
}

static int64_t last_dim(const pt_tensor *t)
{
	return t->ndim ? t->shape[t->ndim - 1] : 1;
}

static int64_t rows(const pt_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i + 1 < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

static pt_err dims_are(const pt_op_call *c, const pt_tensor *t, const char *what, int ndim,
                       const int64_t *shape)
{
	char x[96], y[96];
	bool ok = t->ndim == ndim;
	for (int i = 0; ok && i < ndim; i++)
		ok = shape[i] < 0 || t->shape[i] == shape[i];
	if (!ok)
		return pt_set_error(PT_ERR_SHAPE, "%s: %s is %s, expected %s", pt_op_name(c->op),
		                    what, pt_shape_str(x, sizeof(x), t->ndim, t->shape),
		                    pt_shape_str(y, sizeof(y), ndim, shape));
	return PT_OK;
}

/* x (..., I) and y (..., O): same leading dims. */
static pt_err same_rows(const pt_op_call *c, const pt_tensor *a, const char *an, const pt_tensor *b,
                        const char *bn)
{
	char x[96], y[96];
	bool ok = a->ndim == b->ndim && a->ndim >= 1;
	for (int i = 0; ok && i + 1 < a->ndim; i++)
		ok = a->shape[i] == b->shape[i];
	if (!ok)
		return pt_set_error(PT_ERR_SHAPE, "%s: leading dims of %s %s and %s %s differ",
		                    pt_op_name(c->op), an,
		                    pt_shape_str(x, sizeof(x), a->ndim, a->shape), bn,
		                    pt_shape_str(y, sizeof(y), b->ndim, b->shape));
	return PT_OK;
}

/* ---- meta per op ---- */

static pt_err meta_fill(const pt_op_call *c)
{
	PT_TRY(need(c, c->out[0], "out"));
	switch (c->out[0]->dtype) {
	case PT_F32:
	case PT_F64:
	case PT_I32:
	case PT_I64:
		break;
	default:
		return pt_set_error(PT_ERR_DTYPE, "fill: dtype %s",
		                    pt_dtype_name(c->out[0]->dtype));
	}
	if (!pt_tensor_is_contiguous(c->out[0]))
		return pt_set_error(PT_ERR_INVALID, "fill: out must be contiguous");
	return PT_OK;
}

static pt_err meta_copy(const pt_op_call *c)
{
	PT_TRY(need(c, c->out[0], "out"));
	PT_TRY(need(c, c->in[0], "x"));
	if (c->out[0]->dtype != c->in[0]->dtype)
		return pt_set_error(PT_ERR_DTYPE, "copy: %s into %s",
		                    pt_dtype_name(c->in[0]->dtype),
		                    pt_dtype_name(c->out[0]->dtype));
	return same_shape(c, c->out[0], "out", c->in[0], "x");
}

static pt_err meta_scale(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->out[0], "out"));
	PT_TRY(need_f32(c, c->in[0], "x"));
	return same_shape(c, c->out[0], "out", c->in[0], "x");
}

static pt_err meta_add(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->out[0], "out"));
	PT_TRY(need_f32(c, c->in[0], "a"));
	PT_TRY(need_f32(c, c->in[1], "b"));
	PT_TRY(same_shape(c, c->out[0], "out", c->in[0], "a"));
	return same_shape(c, c->out[0], "out", c->in[1], "b");
}

static pt_err meta_matmul(const pt_op_call *c)
{
	const pt_tensor *a = c->in[0], *b = c->in[1], *o = c->out[0];
	int64_t m, k, k2, n;
	PT_TRY(need(c, a, "a"));
	PT_TRY(need(c, b, "b"));
	PT_TRY(need(c, o, "out"));
	if (a->dtype != PT_F32 || b->dtype != PT_F32 || o->dtype != PT_F32)
		return pt_set_error(PT_ERR_DTYPE, "matmul: operands must be f32");
	if (a->ndim != 2 || b->ndim != 2 || o->ndim != 2)
		return pt_set_error(PT_ERR_SHAPE, "matmul: operands must be 2-d (got %d, %d, %d)",
		                    a->ndim, b->ndim, o->ndim);
	if (a->strides[1] != 1 || b->strides[1] != 1 || o->strides[1] != 1)
		return pt_set_error(PT_ERR_INVALID, "matmul: rows must be contiguous");
	m = c->p.matmul.trans_a ? a->shape[1] : a->shape[0];
	k = c->p.matmul.trans_a ? a->shape[0] : a->shape[1];
	k2 = c->p.matmul.trans_b ? b->shape[1] : b->shape[0];
	n = c->p.matmul.trans_b ? b->shape[0] : b->shape[1];
	if (k != k2 || o->shape[0] != m || o->shape[1] != n)
		return pt_set_error(PT_ERR_SHAPE,
		                    "matmul: (%" PRId64 ", %" PRId64 ") x (%" PRId64 ", %" PRId64
		                    ") into (%" PRId64 ", %" PRId64 ")",
		                    m, k, k2, n, o->shape[0], o->shape[1]);
	return PT_OK;
}

static pt_err meta_linear_fwd(const pt_op_call *c)
{
	const pt_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *y = c->out[0];
	PT_TRY(need_f32_or_bf16(c, x, "x"));
	PT_TRY(need_f32(c, w, "weight"));
	PT_TRY(need_f32(c, y, "out"));
	PT_TRY(dims_are(c, w, "weight", 2, (int64_t[]){-1, last_dim(x)}));
	if (b)
		PT_TRY(need_f32(c, b, "bias"));
	if (b)
		PT_TRY(dims_are(c, b, "bias", 1, (int64_t[]){w->shape[0]}));
	PT_TRY(same_rows(c, y, "out", x, "x"));
	if (last_dim(y) != w->shape[0])
		return pt_set_error(PT_ERR_SHAPE,
		                    "linear_forward: out has %" PRId64
		                    " features, weight gives %" PRId64,
		                    last_dim(y), w->shape[0]);
	return PT_OK;
}

static pt_err meta_linear_bwd(const pt_op_call *c)
{
	const pt_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
	PT_TRY(need_f32(c, dy, "dout"));
	PT_TRY(need_f32_or_bf16(c, x, "x"));
	PT_TRY(need_f32(c, w, "weight"));
	PT_TRY(dims_are(c, w, "weight", 2, (int64_t[]){last_dim(dy), last_dim(x)}));
	PT_TRY(same_rows(c, dy, "dout", x, "x"));
	if (c->out[0]) {
		PT_TRY(need_f32(c, c->out[0], "dx"));
		PT_TRY(same_shape(c, c->out[0], "dx", x, "x"));
	}
	if (c->out[1]) { /* NULL: the input gradient only (split backward) */
		PT_TRY(need_f32(c, c->out[1], "dweight"));
		PT_TRY(same_shape(c, c->out[1], "dweight", w, "weight"));
	}
	if (c->out[2]) {
		PT_TRY(need_f32(c, c->out[2], "dbias"));
		PT_TRY(dims_are(c, c->out[2], "dbias", 1, (int64_t[]){w->shape[0]}));
	}
	return PT_OK;
}

static pt_err meta_unary(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->out[0], "out"));
	PT_TRY(need_f32(c, c->in[0], "x"));
	return same_shape(c, c->out[0], "out", c->in[0], "x");
}

static pt_err meta_act_fwd(const pt_op_call *c)
{
	if ((unsigned)c->p.act.kind > PT_ACT_SIGMOID)
		return pt_set_error(PT_ERR_INVALID, "activation: unknown kind %d", c->p.act.kind);
	PT_TRY(need_f32_or_bf16(c, c->out[0], "out"));
	PT_TRY(need_f32(c, c->in[0], "x"));
	return same_shape(c, c->out[0], "out", c->in[0], "x");
}

static pt_err meta_act_bwd(const pt_op_call *c)
{
	pt_act k = c->p.act.kind;
	const pt_tensor *saved = (k == PT_ACT_RELU || k == PT_ACT_GELU) ? c->in[1] : c->in[2];
	if ((unsigned)k > PT_ACT_SIGMOID)
		return pt_set_error(PT_ERR_INVALID, "activation: unknown kind %d", k);
	PT_TRY(need_f32(c, c->out[0], "dx"));
	PT_TRY(need_f32(c, c->in[0], "dy"));
	PT_TRY(need_f32(c, saved, (k == PT_ACT_RELU || k == PT_ACT_GELU) ? "x" : "y"));
	PT_TRY(same_shape(c, c->out[0], "dx", c->in[0], "dy"));
	return same_shape(c, saved, "saved", c->in[0], "dy");
}

static pt_err meta_dropout(const pt_op_call *c)
{
	if (!(c->p.dropout.p >= 0.0f && c->p.dropout.p < 1.0f))
		return pt_set_error(PT_ERR_RANGE, "dropout: p = %g must be in [0, 1)",
		                    (double)c->p.dropout.p);
	return meta_unary(c);
}

static pt_err meta_softmax_bwd(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->out[0], "dx"));
	PT_TRY(need_f32(c, c->in[0], "dy"));
	PT_TRY(need_f32(c, c->in[1], "y"));
	PT_TRY(same_shape(c, c->out[0], "dx", c->in[0], "dy"));
	return same_shape(c, c->in[1], "y", c->in[0], "dy");
}

static pt_err meta_ln_fwd(const pt_op_call *c)
{
	const pt_tensor *x = c->in[0];
	int64_t C;
	PT_TRY(need_f32(c, x, "x"));
	C = last_dim(x);
	PT_TRY(need_f32(c, c->in[1], "weight"));
	PT_TRY(need_f32(c, c->in[2], "bias"));
	PT_TRY(dims_are(c, c->in[1], "weight", 1, (int64_t[]){C}));
	PT_TRY(dims_are(c, c->in[2], "bias", 1, (int64_t[]){C}));
	PT_TRY(need_f32_or_bf16(c, c->out[0], "y"));
	PT_TRY(same_shape(c, c->out[0], "y", x, "x"));
	for (int i = 1; i < 3; i++) {
		PT_TRY(need_f32(c, c->out[i], i == 1 ? "mean" : "rstd"));
		if (pt_tensor_numel(c->out[i]) != rows(x))
			return pt_set_error(PT_ERR_SHAPE,
			                    "layernorm_forward: %s needs %" PRId64 " elements",
			                    i == 1 ? "mean" : "rstd", rows(x));
	}
	if (!(c->p.layernorm.eps > 0))
		return pt_set_error(PT_ERR_RANGE, "layernorm: eps must be > 0");
	return PT_OK;
}

static pt_err meta_ln_bwd(const pt_op_call *c)
{
	const pt_tensor *dy = c->in[0], *x = c->in[1];
	int64_t C;
	PT_TRY(need_f32(c, dy, "dy"));
	PT_TRY(need_f32(c, x, "x"));
	PT_TRY(same_shape(c, dy, "dy", x, "x"));
	C = last_dim(x);
	PT_TRY(need_f32(c, c->in[2], "weight"));
	PT_TRY(dims_are(c, c->in[2], "weight", 1, (int64_t[]){C}));
	for (int i = 3; i < 5; i++) {
		PT_TRY(need_f32(c, c->in[i], i == 3 ? "mean" : "rstd"));
		if (pt_tensor_numel(c->in[i]) != rows(x))
			return pt_set_error(PT_ERR_SHAPE, "layernorm_backward: saved stats size");
	}
	/* Split backward: dx only (dweight and dbias NULL), or they only (dx NULL). */
	if (c->out[0] == NULL && c->out[1] == NULL)
		return pt_set_error(PT_ERR_INVALID, "layernorm_backward: nothing to compute");
	if ((c->out[1] == NULL) != (c->out[2] == NULL))
		return pt_set_error(PT_ERR_INVALID,
		                    "layernorm_backward: dweight and dbias go together");
	if (c->out[0]) {
		PT_TRY(need_f32(c, c->out[0], "dx"));
		PT_TRY(same_shape(c, c->out[0], "dx", x, "x"));
	}
	if (c->out[1] == NULL)
		return PT_OK;
	PT_TRY(need_f32(c, c->out[1], "dweight"));
	PT_TRY(need_f32(c, c->out[2], "dbias"));
	PT_TRY(dims_are(c, c->out[1], "dweight", 1, (int64_t[]){C}));
	return dims_are(c, c->out[2], "dbias", 1, (int64_t[]){C});
}

static pt_err meta_emb_fwd(const pt_op_call *c)
{
	const pt_tensor *tok = c->in[0], *wte = c->in[1], *wpe = c->in[2];
	PT_TRY(need_i64(c, tok, "tokens"));
	PT_TRY(need_f32(c, wte, "wte"));
	PT_TRY(need_f32(c, c->out[0], "out"));
	if (tok->ndim != 2 || wte->ndim != 2)
		return pt_set_error(PT_ERR_SHAPE, "embedding: tokens must be (B, T), wte (V, C)");
	PT_TRY(dims_are(c, c->out[0], "out", 3,
	                (int64_t[]){tok->shape[0], tok->shape[1], wte->shape[1]}));
	if (wpe) {
		PT_TRY(need_f32(c, wpe, "wpe"));
		if (wpe->ndim != 2 || wpe->shape[1] != wte->shape[1] ||
		    wpe->shape[0] < tok->shape[1])
			return pt_set_error(PT_ERR_SHAPE,
			                    "embedding: wpe must be (maxT >= %" PRId64 ", %" PRId64
			                    ")",
			                    tok->shape[1], wte->shape[1]);
	}
	return PT_OK;
}

static pt_err meta_emb_bwd(const pt_op_call *c)
{
	const pt_tensor *dout = c->in[0], *tok = c->in[1];
	PT_TRY(need_f32(c, dout, "dout"));
	PT_TRY(need_i64(c, tok, "tokens"));
	PT_TRY(need_f32(c, c->out[0], "dwte"));
	if (tok->ndim != 2 || c->out[0]->ndim != 2)
		return pt_set_error(PT_ERR_SHAPE, "embedding_backward: tokens (B, T), dwte (V, C)");
	PT_TRY(dims_are(c, dout, "dout", 3,
	                (int64_t[]){tok->shape[0], tok->shape[1], c->out[0]->shape[1]}));
	if (c->out[1]) {
		PT_TRY(need_f32(c, c->out[1], "dwpe"));
		if (c->out[1]->ndim != 2 || c->out[1]->shape[1] != c->out[0]->shape[1] ||
		    c->out[1]->shape[0] < tok->shape[1])
			return pt_set_error(PT_ERR_SHAPE, "embedding_backward: dwpe shape");
	}
	return PT_OK;
}

static pt_err meta_attn_common(const pt_op_call *c, const pt_tensor *qkv, const pt_tensor *o,
                               const char *oname, const pt_tensor *lse)
{
	int nh = c->p.attention.n_head;
	int64_t B, T, C;
	PT_TRY(need_f32(c, qkv, "qkv"));
	PT_TRY(need_f32(c, o, oname));
	PT_TRY(need_f32(c, lse, "lse"));
	if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0)
		return pt_set_error(PT_ERR_SHAPE, "%s: qkv must be (B, T, 3C)", pt_op_name(c->op));
	B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3;
	if (nh <= 0 || C % nh != 0)
		return pt_set_error(PT_ERR_SHAPE, "%s: %d heads do not divide C = %" PRId64,
		                    pt_op_name(c->op), nh, C);
	PT_TRY(dims_are(c, o, oname, 3, (int64_t[]){B, T, C}));
	return dims_are(c, lse, "lse", 3, (int64_t[]){B, nh, T});
}

static pt_err meta_attn_fwd(const pt_op_call *c)
{
	return meta_attn_common(c, c->in[0], c->out[0], "out", c->out[1]);
}

static pt_err meta_attn_bwd(const pt_op_call *c)
{
	PT_TRY(meta_attn_common(c, c->in[1], c->in[0], "dout", c->in[2]));
	PT_TRY(need_f32(c, c->out[0], "dqkv"));
	return same_shape(c, c->out[0], "dqkv", c->in[1], "qkv");
}

static pt_err meta_xent_fwd(const pt_op_call *c)
{
	const pt_tensor *lg = c->in[0], *tg = c->in[1];
	PT_TRY(need_f32(c, lg, "logits"));
	PT_TRY(need_i64(c, tg, "targets"));
	if (pt_tensor_numel(tg) != rows(lg))
		return pt_set_error(PT_ERR_SHAPE,
		                    "cross_entropy: %" PRId64 " targets for %" PRId64
		                    " rows of logits",
		                    pt_tensor_numel(tg), rows(lg));
	PT_TRY(need_f32(c, c->out[0], "losses"));
	if (pt_tensor_numel(c->out[0]) != rows(lg))
		return pt_set_error(PT_ERR_SHAPE,
		                    "cross_entropy: losses needs %" PRId64 " elements", rows(lg));
	PT_TRY(need_f32(c, c->out[1], "probs"));
	return same_shape(c, c->out[1], "probs", lg, "logits");
}

static pt_err meta_xent_bwd(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->in[0], "probs"));
	PT_TRY(need_i64(c, c->in[1], "targets"));
	if (pt_tensor_numel(c->in[1]) != rows(c->in[0]))
		return pt_set_error(PT_ERR_SHAPE, "cross_entropy_backward: targets count");
	PT_TRY(need_f32(c, c->out[0], "dlogits"));
	return same_shape(c, c->out[0], "dlogits", c->in[0], "probs");
}

static pt_err meta_mse_fwd(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->in[0], "pred"));
	PT_TRY(need_f32(c, c->in[1], "target"));
	PT_TRY(same_shape(c, c->in[0], "pred", c->in[1], "target"));
	PT_TRY(need_f32(c, c->out[0], "loss"));
	if (pt_tensor_numel(c->out[0]) != 1)
		return pt_set_error(PT_ERR_SHAPE, "mse_forward: loss must have 1 element");
	return PT_OK;
}

static pt_err meta_mse_bwd(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->in[0], "pred"));
	PT_TRY(need_f32(c, c->in[1], "target"));
	PT_TRY(same_shape(c, c->in[0], "pred", c->in[1], "target"));
	PT_TRY(need_f32(c, c->out[0], "dpred"));
	return same_shape(c, c->out[0], "dpred", c->in[0], "pred");
}

static pt_err meta_sqnorm(const pt_op_call *c)
{
	PT_TRY(need_f32(c, c->in[0], "x"));
	PT_TRY(need(c, c->out[0], "out"));
	if (c->out[0]->dtype != PT_F64 || pt_tensor_numel(c->out[0]) != 1)
		return pt_set_error(PT_ERR_SHAPE, "squared_norm: out must be one f64");
	return PT_OK;
}

/* The optional run-time scalars (input 1) of adamw and sgd. */
static pt_err meta_optim_scalars(const pt_op_call *c)
{
	const pt_tensor *s = c->in[1];
	if (s == NULL)
		return PT_OK;
	if (s->dtype != PT_F64 || pt_tensor_numel(s) != PT_OPTIM_SCALARS ||
	    !pt_tensor_is_contiguous(s) || s->storage->device.kind != PT_DEV_CPU)
		return pt_set_error(PT_ERR_SHAPE,
		                    "%s: scalars must be %d contiguous f64 on the CPU",
		                    pt_op_name(c->op), PT_OPTIM_SCALARS);
	return PT_OK;
}

static pt_err meta_adamw(const pt_op_call *c)
{
	PT_TRY(meta_optim_scalars(c));
	PT_TRY(need_f32(c, c->in[0], "grad"));
	PT_TRY(need_f32(c, c->out[0], "param"));
	PT_TRY(need_f32(c, c->out[1], "m"));
	PT_TRY(need_f32(c, c->out[2], "v"));
	for (int i = 0; i < 3; i++)
		if (pt_tensor_numel(c->out[i]) != pt_tensor_numel(c->in[0]))
			return pt_set_error(PT_ERR_SHAPE, "adamw_update: buffers differ in size");
	if (c->in[1] == NULL && c->p.adamw.step < 1)
		return pt_set_error(PT_ERR_RANGE, "adamw_update: step must be >= 1");
	return PT_OK;
}

static pt_err meta_sgd(const pt_op_call *c)
{
	PT_TRY(meta_optim_scalars(c));
	PT_TRY(need_f32(c, c->in[0], "grad"));
	PT_TRY(need_f32(c, c->out[0], "param"));
	if (pt_tensor_numel(c->out[0]) != pt_tensor_numel(c->in[0]))
		return pt_set_error(PT_ERR_SHAPE, "sgd_update: buffers differ in size");
	if (c->p.sgd.momentum != 0.0f) {
		PT_TRY(need_f32(c, c->out[1], "momentum buffer"));
		if (pt_tensor_numel(c->out[1]) != pt_tensor_numel(c->in[0]))
			return pt_set_error(PT_ERR_SHAPE, "sgd_update: buffers differ in size");
	}
	if (c->p.sgd.nesterov && (c->p.sgd.momentum <= 0.0f || c->p.sgd.dampening != 0.0f))
		return pt_set_error(PT_ERR_INVALID,
		                    "sgd_update: Nesterov needs momentum > 0 and zero dampening");
	return PT_OK;
}

/* ---- plan: kernel choice per device ---- */

static pt_err device_of(const pt_op_call *c, pt_device_kind *kind)
{
	const pt_tensor *t = c->n_out > 0 && c->out[0] ? c->out[0] : c->in[0];
	*kind = t ? t->storage->device.kind : PT_DEV_CPU;
	for (int i = 0; i < c->n_in; i++)
		if (c->in[i] && c->in[i]->storage->device.kind != *kind)
			return pt_set_error(PT_ERR_INVALID, "%s: operands on different devices",
			                    pt_op_name(c->op));
	return PT_OK;
}

#define PLAN_CPU(name, kern)                                                                       \
	static pt_err plan_##name(pt_op_call *c)                                                   \
	{                                                                                          \
		pt_device_kind k;                                                                  \
		PT_TRY(device_of(c, &k));                                                          \
		if (k != PT_DEV_CPU)                                                               \
			return pt_backend_plan(c);                                                 \
		c->kernel = cpu_##kern;                                                            \
		c->workspace = 0;                                                                  \
		return PT_OK;                                                                      \
	}

PLAN_CPU(fill, fill)
PLAN_CPU(copy, copy)
PLAN_CPU(scale, scale)
PLAN_CPU(add, add)
PLAN_CPU(matmul, matmul)
PLAN_CPU(linear_fwd, linear_forward)
PLAN_CPU(linear_bwd, linear_backward)
PLAN_CPU(act_fwd, activation_forward)
PLAN_CPU(act_bwd, activation_backward)
PLAN_CPU(dropout_fwd, dropout_forward)
PLAN_CPU(dropout_bwd, dropout_backward)
PLAN_CPU(softmax_fwd, softmax_forward)
PLAN_CPU(softmax_bwd, softmax_backward)
PLAN_CPU(ln_fwd, layernorm_forward)
PLAN_CPU(ln_bwd, layernorm_backward)
PLAN_CPU(emb_fwd, embedding_forward)
PLAN_CPU(emb_bwd, embedding_backward)
PLAN_CPU(xent_fwd, cross_entropy_forward)
PLAN_CPU(xent_bwd, cross_entropy_backward)
PLAN_CPU(mse_fwd, mse_forward)
PLAN_CPU(mse_bwd, mse_backward)
PLAN_CPU(sqnorm, squared_norm)
PLAN_CPU(adamw, adamw)
PLAN_CPU(sgd, sgd)
/* Run-time scalars (input 1) live on the CPU: device_of refuses them next to
 * device buffers, so only CPU kernels read them. */

static pt_err plan_attn(pt_op_call *c, pt_kernel_fn kernel)
{
	pt_device_kind k;
	PT_TRY(device_of(c, &k));
	if (k != PT_DEV_CPU)
		return pt_backend_plan(c);
	c->kernel = kernel;
	c->workspace = cpu_attention_workspace(c);
	return PT_OK;
}

static pt_err plan_attn_fwd(pt_op_call *c)
{
	return plan_attn(c, cpu_attention_forward);
}

static pt_err plan_attn_bwd(pt_op_call *c)
{
	return plan_attn(c, cpu_attention_backward);
}

/* Ops sharing a meta function. */
#define meta_softmax_fwd meta_unary
#define meta_dropout_fwd meta_dropout
#define meta_dropout_bwd meta_dropout

/* The table is generated from PT_OPS, so an op cannot be half-added: a
 * missing meta_<fn> or plan_<fn> fails to compile. */
const pt_op_def pt_op_defs[PT_OP_COUNT] = {
#define DEF(id, nm, nin, nout, fn) [PT_OP_##id] = {nm, nin, nout, meta_##fn, plan_##fn},
    PT_OPS(DEF)
#undef DEF
};
#define CHECK_OP(id, nm, nin, nout, fn)                                                            \
	_Static_assert(nin <= PT_OP_MAX_IN && nout <= PT_OP_MAX_OUT, "arity of " nm);
PT_OPS(CHECK_OP)
#undef CHECK_OP

/* ---- wrappers ---- */

#define CALL(opid) pt_op_call c = {.op = PT_OP_##opid}

pt_err pt_fill(pt_tensor *out, double value)
{
	CALL(FILL);
	c.out[0] = out;
	c.p.fill.value = value;
	return pt_dispatch(&c);
}

pt_err pt_copy(pt_tensor *out, const pt_tensor *x)
{
	CALL(COPY);
	c.out[0] = out;
	c.in[0] = x;
	return pt_dispatch(&c);
}

pt_err pt_scale(pt_tensor *out, const pt_tensor *x, float alpha)
{
	CALL(SCALE);
	c.out[0] = out;
	c.in[0] = x;
	c.p.scale.alpha = alpha;
	return pt_dispatch(&c);
}

pt_err pt_add(pt_tensor *out, const pt_tensor *a, const pt_tensor *b, float alpha, float beta)
{
	CALL(ADD);
	c.out[0] = out;
	c.in[0] = a;
	c.in[1] = b;
	c.p.add.alpha = alpha;
	c.p.add.beta = beta;
	return pt_dispatch(&c);
}

pt_err pt_matmul(pt_tensor *out, const pt_tensor *a, const pt_tensor *b, bool trans_a, bool trans_b,
                 float alpha, float beta)
{
	CALL(MATMUL);
	c.out[0] = out;
	c.in[0] = a;
	c.in[1] = b;
	c.p.matmul.trans_a = trans_a;
	c.p.matmul.trans_b = trans_b;
	c.p.matmul.alpha = alpha;
	c.p.matmul.beta = beta;
	return pt_dispatch(&c);
}

pt_err pt_linear_forward(pt_tensor *out, const pt_tensor *x, const pt_tensor *w, const pt_tensor *b)
{
	CALL(LINEAR_FWD);
	c.out[0] = out;
	c.in[0] = x;
	c.in[1] = w;
	c.in[2] = b;
	c.p.linear.has_bias = b != NULL;
	return pt_dispatch(&c);
}

pt_err pt_linear_backward(pt_tensor *dx, pt_tensor *dw, pt_tensor *db, const pt_tensor *dout,
                          const pt_tensor *x, const pt_tensor *w, bool accum_dx)
{
	CALL(LINEAR_BWD);
	c.out[0] = dx;
	c.out[1] = dw;
	c.out[2] = db;
	c.in[0] = dout;
	c.in[1] = x;
	c.in[2] = w;
	c.p.linear.accum_dx = accum_dx;
	c.p.linear.need_dx = dx != NULL;
	c.p.linear.has_bias = db != NULL;
	return pt_dispatch(&c);
}

pt_err pt_activation_forward(pt_tensor *y, const pt_tensor *x, pt_act kind)
{
	CALL(ACT_FWD);
	c.out[0] = y;
	c.in[0] = x;
	c.p.act.kind = kind;
	return pt_dispatch(&c);
}

pt_err pt_activation_backward(pt_tensor *dx, const pt_tensor *dy, const pt_tensor *x,
                              const pt_tensor *y, pt_act kind, bool accum_dx)
{
	CALL(ACT_BWD);
	c.out[0] = dx;
	c.in[0] = dy;
	c.in[1] = x;
	c.in[2] = y;
	c.p.act.kind = kind;
	c.p.act.accum_dx = accum_dx;
	return pt_dispatch(&c);
}

pt_err pt_dropout_forward(pt_tensor *y, const pt_tensor *x, float p, uint64_t seed, uint64_t stream)
{
	CALL(DROPOUT_FWD);
	c.out[0] = y;
	c.in[0] = x;
	c.p.dropout.p = p;
	c.p.dropout.seed = seed;
	c.p.dropout.stream = stream;
	return pt_dispatch(&c);
}

pt_err pt_dropout_backward(pt_tensor *dx, const pt_tensor *dy, float p, uint64_t seed,
                           uint64_t stream, bool accum_dx)
{
	CALL(DROPOUT_BWD);
	c.out[0] = dx;
	c.in[0] = dy;
	c.p.dropout.p = p;
	c.p.dropout.seed = seed;
	c.p.dropout.stream = stream;
	c.p.dropout.accum_dx = accum_dx;
	return pt_dispatch(&c);
}

pt_err pt_softmax_forward(pt_tensor *y, const pt_tensor *x)
{
	CALL(SOFTMAX_FWD);
	c.out[0] = y;
	c.in[0] = x;
	return pt_dispatch(&c);
}

pt_err pt_softmax_backward(pt_tensor *dx, const pt_tensor *dy, const pt_tensor *y, bool accum_dx)
{
	CALL(SOFTMAX_BWD);
	c.out[0] = dx;
	c.in[0] = dy;
	c.in[1] = y;
	c.p.act.accum_dx = accum_dx;
	return pt_dispatch(&c);
}

pt_err pt_layernorm_forward(pt_tensor *y, pt_tensor *mean, pt_tensor *rstd, const pt_tensor *x,
                            const pt_tensor *w, const pt_tensor *b, float eps)
{
	CALL(LAYERNORM_FWD);
	c.out[0] = y;
	c.out[1] = mean;
	c.out[2] = rstd;
	c.in[0] = x;
	c.in[1] = w;
	c.in[2] = b;
	c.p.layernorm.eps = eps;
	return pt_dispatch(&c);
}

pt_err pt_layernorm_backward(pt_tensor *dx, pt_tensor *dw, pt_tensor *db, const pt_tensor *dy,
                             const pt_tensor *x, const pt_tensor *w, const pt_tensor *mean,
                             const pt_tensor *rstd, bool accum_dx)
{
	CALL(LAYERNORM_BWD);
	c.out[0] = dx;
	c.out[1] = dw;
	c.out[2] = db;
	c.in[0] = dy;
	c.in[1] = x;
	c.in[2] = w;
	c.in[3] = mean;
	c.in[4] = rstd;
	c.p.layernorm.eps = 1e-5f;
	c.p.layernorm.accum_dx = accum_dx;
	return pt_dispatch(&c);
}

pt_err pt_embedding_forward(pt_tensor *out, const pt_tensor *tokens, const pt_tensor *wte,
                            const pt_tensor *wpe)
{
	CALL(EMBEDDING_FWD);
	c.out[0] = out;
	c.in[0] = tokens;
	c.in[1] = wte;
	c.in[2] = wpe;
	return pt_dispatch(&c);
}

pt_err pt_embedding_backward(pt_tensor *dwte, pt_tensor *dwpe, const pt_tensor *dout,
                             const pt_tensor *tokens)
{
	CALL(EMBEDDING_BWD);
	c.out[0] = dwte;
	c.out[1] = dwpe;
	c.in[0] = dout;
	c.in[1] = tokens;
	return pt_dispatch(&c);
}

pt_err pt_attention_forward(pt_tensor *out, pt_tensor *lse, const pt_tensor *qkv, int n_head)
{
	CALL(ATTENTION_FWD);
	c.out[0] = out;
	c.out[1] = lse;
	c.in[0] = qkv;
	c.p.attention.n_head = n_head;
	return pt_dispatch(&c);
}

pt_err pt_attention_backward(pt_tensor *dqkv, const pt_tensor *dout, const pt_tensor *qkv,
                             const pt_tensor *lse, int n_head, bool accum_dx)
{
	CALL(ATTENTION_BWD);
	c.out[0] = dqkv;
	c.in[0] = dout;
	c.in[1] = qkv;
	c.in[2] = lse;
	c.p.attention.n_head = n_head;
	c.p.attention.accum_dx = accum_dx;
	return pt_dispatch(&c);
}

pt_err pt_cross_entropy_forward(pt_tensor *losses, pt_tensor *probs, const pt_tensor *logits,
                                const pt_tensor *targets, int64_t ignore_index)
{
	CALL(XENT_FWD);
	c.out[0] = losses;
	c.out[1] = probs;
	c.in[0] = logits;
	c.in[1] = targets;
	c.p.xent.ignore_index = ignore_index;
	return pt_dispatch(&c);
}

pt_err pt_cross_entropy_backward(pt_tensor *dlogits, const pt_tensor *probs,
                                 const pt_tensor *targets, int64_t ignore_index, float scale)
{
	CALL(XENT_BWD);
	c.out[0] = dlogits;
	c.in[0] = probs;
	c.in[1] = targets;
	c.p.xent.ignore_index = ignore_index;
	c.p.xent.scale = scale;
	return pt_dispatch(&c);
}

pt_err pt_mse_forward(pt_tensor *loss, const pt_tensor *pred, const pt_tensor *target, float scale)
{
	CALL(MSE_FWD);
	c.out[0] = loss;
	c.in[0] = pred;
	c.in[1] = target;
	c.p.mse.scale = scale;
	return pt_dispatch(&c);
}

pt_err pt_mse_backward(pt_tensor *dpred, const pt_tensor *pred, const pt_tensor *target,
                       float scale)
{
	CALL(MSE_BWD);
	c.out[0] = dpred;
	c.in[0] = pred;
	c.in[1] = target;
	c.p.mse.scale = scale;
	return pt_dispatch(&c);
}

pt_err pt_squared_norm(pt_tensor *out, const pt_tensor *x)
{
	CALL(SQNORM);
	c.out[0] = out;
	c.in[0] = x;
	return pt_dispatch(&c);
}

/* The optimizer ops' calls: scalars (may be NULL) replace the params' lr,
 * grad scale, step and first_step at run time. */
static pt_err adamw_call(pt_tensor *param, pt_tensor *m, pt_tensor *v, const pt_tensor *grad,
                         const pt_tensor *scalars, const pt_op_params *p)
{
	CALL(ADAMW);
	c.out[0] = param;
	c.out[1] = m;
	c.out[2] = v;
	c.in[0] = grad;
	c.in[1] = scalars;
	c.p = *p;
	return pt_dispatch(&c);
}

static pt_err sgd_call(pt_tensor *param, pt_tensor *buf, const pt_tensor *grad,
                       const pt_tensor *scalars, const pt_op_params *p)
{
	CALL(SGD);
	c.out[0] = param;
	c.out[1] = p->sgd.momentum != 0.0f ? buf : NULL;
	c.in[0] = grad;
	c.in[1] = scalars;
	c.p = *p;
	return pt_dispatch(&c);
}

pt_err pt_adamw_update(pt_tensor *param, pt_tensor *m, pt_tensor *v, const pt_tensor *grad,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       float grad_scale, int64_t step)
{
	pt_op_params p;
	memset(&p, 0, sizeof(p)); /* graphs compare params bytewise */
	p.adamw.lr = lr;
	p.adamw.beta1 = beta1;
	p.adamw.beta2 = beta2;
	p.adamw.eps = eps;
	p.adamw.weight_decay = weight_decay;
	p.adamw.grad_scale = grad_scale;
	p.adamw.step = step;
	return adamw_call(param, m, v, grad, NULL, &p);
}

pt_err pt_adamw_update_scalars(pt_tensor *param, pt_tensor *m, pt_tensor *v, const pt_tensor *grad,
                               const pt_tensor *scalars, float beta1, float beta2, float eps,
                               float weight_decay)
{
	pt_op_params p;
	memset(&p, 0, sizeof(p));
	p.adamw.beta1 = beta1;
	p.adamw.beta2 = beta2;
	p.adamw.eps = eps;
	p.adamw.weight_decay = weight_decay;
	return adamw_call(param, m, v, grad, scalars, &p);
}

pt_err pt_sgd_update_scalars(pt_tensor *param, pt_tensor *buf, const pt_tensor *grad,
                             const pt_tensor *scalars, float momentum, float dampening,
                             float weight_decay, bool nesterov)
{
	pt_op_params p;
	memset(&p, 0, sizeof(p));
	p.sgd.momentum = momentum;
	p.sgd.dampening = dampening;
	p.sgd.weight_decay = weight_decay;
	p.sgd.nesterov = nesterov;
	return sgd_call(param, buf, grad, scalars, &p);
}

pt_err pt_sgd_update(pt_tensor *param, pt_tensor *buf, const pt_tensor *grad, float lr,
                     float momentum, float dampening, float weight_decay, float grad_scale,
                     bool nesterov, bool first_step)
{
	pt_op_params p;
	memset(&p, 0, sizeof(p));
	p.sgd.lr = lr;
	p.sgd.momentum = momentum;
	p.sgd.dampening = dampening;
	p.sgd.weight_decay = weight_decay;
	p.sgd.grad_scale = grad_scale;
	p.sgd.nesterov = nesterov;
	p.sgd.first_step = first_step;
	return sgd_call(param, buf, grad, NULL, &p);
}
