/* cuda_ops.c - unpacks each validated pt_op_call into the raw-pointer
 * launchers of cuda_kernels.h, and maps their failures to pt_err
 * (PT_ERR_BACKEND, with the CUDA/cuBLAS message). Sizes, strides and the
 * optimizer's bias corrections are computed exactly as the CPU kernels do.
 */
#include "cuda_ops.h"

#include <math.h>

#include "cuda_kernels.h"

static int dev_of(const pt_op_call *c)
{
	const pt_tensor *t = c->out[0] ? c->out[0] : c->in[0];
	return t->storage->device.index;
}

static pt_err check(const pt_op_call *c, int rc)
{
	if (rc == 0)
		return PT_OK;
	return pt_set_error(PT_ERR_BACKEND, "%s on cuda:%d: %s", pt_op_name(c->op), dev_of(c),
	                    ptc_last_error());
}

#define F(t)   pt_tensor_f32(t)
#define NUM(t) pt_tensor_numel(t)
#define DEV    dev_of(c)

static int64_t cols(const pt_tensor *t)
{
	return t->ndim ? t->shape[t->ndim - 1] : 1;
}

static int64_t nrows(const pt_tensor *t)
{
	int64_t C = cols(t);
	return C ? NUM(t) / C : 0;
}

/* set_math gives the products of this call the call's precision. */
static void set_math(const pt_op_call *c)
{
	ptc_set_math(c->prec == PT_PREC_TF32   ? PTC_MATH_TF32
	             : c->prec == PT_PREC_BF16 ? PTC_MATH_BF16
	                                       : PTC_MATH_FP32);
}

static pt_err cuda_fill(const pt_op_call *c, void *ws)
{
	pt_tensor *o = c->out[0];
	int kind;
	/* An explicit map: a table defaulting to 0 (= PTC_F32) would write 4-byte
	 * floats over a 2-byte tensor if meta ever let another dtype through. */
	switch (o->dtype) {
	case PT_F32:
		kind = PTC_F32;
		break;
	case PT_F64:
		kind = PTC_F64;
		break;
	case PT_I32:
		kind = PTC_I32;
		break;
	case PT_I64:
		kind = PTC_I64;
		break;
	default:
		return pt_set_error(PT_ERR_DTYPE, "fill on cuda:%d: %s", DEV,
		                    pt_dtype_name(o->dtype));
	}
	return check(c, ptc_fill(DEV, pt_tensor_data(o), NUM(o), kind, c->p.fill.value));
}

static pt_err cuda_copy(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[0];
	pt_tensor *o = c->out[0];
	size_t es = pt_dtype_size(x->dtype);
	if (pt_tensor_is_contiguous(x) && pt_tensor_is_contiguous(o))
		return check(c, ptc_memcpy(DEV, pt_tensor_data(o), pt_tensor_data(x),
		                           (size_t)NUM(x) * es, PTC_D2D));
	return check(c, ptc_copy_strided(DEV, pt_tensor_data(o), o->strides, pt_tensor_data(x),
	                                 x->strides, x->ndim, x->shape, es));
}

static pt_err cuda_scale(const pt_op_call *c, void *ws)
{
	return check(c, ptc_scale(DEV, F(c->out[0]), F(c->in[0]), NUM(c->in[0]), c->p.scale.alpha));
}

static pt_err cuda_add(const pt_op_call *c, void *ws)
{
	return check(c, ptc_add(DEV, F(c->out[0]), F(c->in[0]), F(c->in[1]), NUM(c->in[0]),
	                        c->p.add.alpha, c->p.add.beta));
}

static pt_err cuda_matmul(const pt_op_call *c, void *ws)
{
	const pt_tensor *a = c->in[0], *b = c->in[1];
	pt_tensor *o = c->out[0];
	bool ta = c->p.matmul.trans_a, tb = c->p.matmul.trans_b;
	int64_t K = ta ? a->shape[0] : a->shape[1];
	set_math(c);
	return check(c, ptc_gemm(DEV, ta, tb, o->shape[0], o->shape[1], K, c->p.matmul.alpha, F(a),
	                         a->strides[0], F(b), b->strides[0], c->p.matmul.beta, F(o),
	                         o->strides[0]));
}

static pt_err cuda_linear_fwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2];
	float *y = F(c->out[0]);
	int64_t N = nrows(x), I = w->shape[1], O = w->shape[0];
	float beta = 0.0f;
	set_math(c);
	if (b != NULL) {
		PT_TRY(check(c, ptc_bias_rows(DEV, y, F(b), N, O)));
		beta = 1.0f;
	}
	return check(c, ptc_gemm(DEV, false, true, N, O, I, 1.0f, F(x), I, F(w), I, beta, y, O));
}

static pt_err cuda_linear_bwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *dy = c->in[0], *x = c->in[1], *w = c->in[2];
	int64_t N = nrows(x), I = w->shape[1], O = w->shape[0];
	set_math(c);
	if (c->out[0] != NULL)
		PT_TRY(check(c, ptc_gemm(DEV, false, false, N, I, O, 1.0f, F(dy), O, F(w), I,
		                         c->p.linear.accum_dx ? 1.0f : 0.0f, F(c->out[0]), I)));
	if (c->out[1] != NULL) /* NULL: the input gradient only (split backward) */
		PT_TRY(check(c, ptc_gemm(DEV, true, false, O, I, N, 1.0f, F(dy), O, F(x), I, 1.0f,
		                         F(c->out[1]), I)));
	if (c->out[2] != NULL)
		PT_TRY(check(c, ptc_colsum_acc(DEV, F(c->out[2]), F(dy), N, O)));
	return PT_OK;
}

static pt_err cuda_act_fwd(const pt_op_call *c, void *ws)
{
	return check(
	    c, ptc_act_forward(DEV, (int)c->p.act.kind, F(c->out[0]), F(c->in[0]), NUM(c->in[0])));
}

static pt_err cuda_act_bwd(const pt_op_call *c, void *ws)
{
	const float *x = c->in[1] ? F(c->in[1]) : NULL, *y = c->in[2] ? F(c->in[2]) : NULL;
	return check(c, ptc_act_backward(DEV, (int)c->p.act.kind, F(c->out[0]), F(c->in[0]), x, y,
	                                 NUM(c->in[0]), c->p.act.accum_dx));
}

static pt_err cuda_dropout_fwd(const pt_op_call *c, void *ws)
{
	return check(c, ptc_dropout(DEV, F(c->out[0]), F(c->in[0]), NUM(c->in[0]), c->p.dropout.p,
	                            c->p.dropout.seed, c->p.dropout.stream, false));
}

static pt_err cuda_dropout_bwd(const pt_op_call *c, void *ws)
{
	return check(c, ptc_dropout(DEV, F(c->out[0]), F(c->in[0]), NUM(c->in[0]), c->p.dropout.p,
	                            c->p.dropout.seed, c->p.dropout.stream, c->p.dropout.accum_dx));
}

static pt_err cuda_softmax_fwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[0];
	return check(c, ptc_softmax_forward(DEV, F(c->out[0]), F(x), nrows(x), cols(x)));
}

static pt_err cuda_softmax_bwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *y = c->in[1];
	return check(c, ptc_softmax_backward(DEV, F(c->out[0]), F(c->in[0]), F(y), nrows(y),
	                                     cols(y), c->p.act.accum_dx));
}

static pt_err cuda_ln_fwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[0];
	return check(c, ptc_layernorm_forward(DEV, F(c->out[0]), F(c->out[1]), F(c->out[2]), F(x),
	                                      F(c->in[1]), F(c->in[2]), nrows(x), cols(x),
	                                      c->p.layernorm.eps));
}

static pt_err cuda_ln_bwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *x = c->in[1];
	/* dx, or dw and db, may be NULL (split backward): the kernels skip them. */
	return check(c, ptc_layernorm_backward(
	                    DEV, c->out[0] ? F(c->out[0]) : NULL, c->out[1] ? F(c->out[1]) : NULL,
	                    c->out[2] ? F(c->out[2]) : NULL, F(c->in[0]), F(x), F(c->in[2]),
	                    F(c->in[3]), F(c->in[4]), nrows(x), cols(x), c->p.layernorm.accum_dx));
}

/* Range check of token/target ids on the device (one host round trip). */
static pt_err check_ids(const pt_op_call *c, const pt_tensor *ids, int64_t limit, bool use_ign,
                        int64_t ign, const char *what)
{
	int64_t bad = -1, val = 0;
	PT_TRY(check(c, ptc_check_index(DEV, pt_tensor_data(ids), NUM(ids), limit, use_ign, ign,
	                                &bad, &val)));
	if (bad >= 0)
		return pt_set_error(PT_ERR_RANGE, "%s: %s %ld at position %ld is outside [0, %ld)",
		                    pt_op_name(c->op), what, (long)val, (long)bad, (long)limit);
	return PT_OK;
}

static pt_err cuda_emb_fwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *tok = c->in[0], *wte = c->in[1], *wpe = c->in[2];
	PT_TRY(check_ids(c, tok, wte->shape[0], false, 0, "token"));
	return check(c, ptc_embedding_forward(DEV, F(c->out[0]), pt_tensor_data(tok), F(wte),
	                                      wpe ? F(wpe) : NULL, tok->shape[0], tok->shape[1],
	                                      wte->shape[1]));
}

static pt_err cuda_emb_bwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *tok = c->in[1];
	pt_tensor *dwte = c->out[0], *dwpe = c->out[1];
	PT_TRY(check_ids(c, tok, dwte->shape[0], false, 0, "token"));
	return check(c, ptc_embedding_backward(DEV, F(dwte), dwpe ? F(dwpe) : NULL, F(c->in[0]),
	                                       pt_tensor_data(tok), tok->shape[0], tok->shape[1],
	                                       dwte->shape[1], dwte->shape[0]));
}

static pt_err cuda_attn_fwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *q = c->in[0];
	set_math(c);
	return check(c, ptc_attention_forward(DEV, F(c->out[0]), F(c->out[1]), F(q), q->shape[0],
	                                      q->shape[1], q->shape[2] / 3, c->p.attention.n_head));
}

static pt_err cuda_attn_bwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *q = c->in[1];
	set_math(c);
	return check(c, ptc_attention_backward(DEV, F(c->out[0]), F(c->in[0]), F(q), F(c->in[2]),
	                                       q->shape[0], q->shape[1], q->shape[2] / 3,
	                                       c->p.attention.n_head, c->p.attention.accum_dx));
}

static pt_err cuda_xent_fwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *lg = c->in[0], *tg = c->in[1];
	int64_t ign = c->p.xent.ignore_index;
	PT_TRY(check_ids(c, tg, cols(lg), true, ign, "target"));
	return check(c, ptc_xent_forward(DEV, F(c->out[0]), F(c->out[1]), F(lg), pt_tensor_data(tg),
	                                 nrows(lg), cols(lg), ign));
}

static pt_err cuda_xent_bwd(const pt_op_call *c, void *ws)
{
	const pt_tensor *p = c->in[0], *tg = c->in[1];
	int64_t ign = c->p.xent.ignore_index;
	PT_TRY(check_ids(c, tg, cols(p), true, ign, "target"));
	return check(c, ptc_xent_backward(DEV, F(c->out[0]), F(p), pt_tensor_data(tg), nrows(p),
	                                  cols(p), ign, c->p.xent.scale));
}

static pt_err cuda_mse_fwd(const pt_op_call *c, void *ws)
{
	return check(c, ptc_mse_forward(DEV, F(c->out[0]), F(c->in[0]), F(c->in[1]), NUM(c->in[0]),
	                                c->p.mse.scale));
}

static pt_err cuda_mse_bwd(const pt_op_call *c, void *ws)
{
	return check(c, ptc_mse_backward(DEV, F(c->out[0]), F(c->in[0]), F(c->in[1]), NUM(c->in[0]),
	                                 c->p.mse.scale));
}

static pt_err cuda_sqnorm(const pt_op_call *c, void *ws)
{
	return check(c,
	             ptc_squared_norm(DEV, pt_tensor_data(c->out[0]), F(c->in[0]), NUM(c->in[0])));
}

static pt_err cuda_adamw(const pt_op_call *c, void *ws)
{
	float lr = c->p.adamw.lr, b1 = c->p.adamw.beta1, b2 = c->p.adamw.beta2;
	double t = (double)c->p.adamw.step;
	/* Host-side constants exactly as cpu_adamw computes them. */
	float bc1 = (float)(1.0 - pow((double)b1, t));
	float bc2_sqrt = (float)sqrt(1.0 - pow((double)b2, t));
	float step_size = lr / bc1;
	float decay = 1.0f - lr * c->p.adamw.weight_decay;
	return check(c, ptc_adamw(DEV, F(c->out[0]), F(c->out[1]), F(c->out[2]), F(c->in[0]),
	                          NUM(c->in[0]), b1, b2, c->p.adamw.eps, c->p.adamw.grad_scale,
	                          step_size, bc2_sqrt, decay));
}

static pt_err cuda_sgd(const pt_op_call *c, void *ws)
{
	return check(c, ptc_sgd(DEV, F(c->out[0]), c->out[1] ? F(c->out[1]) : NULL, F(c->in[0]),
	                        NUM(c->in[0]), c->p.sgd.lr, c->p.sgd.momentum, c->p.sgd.dampening,
	                        c->p.sgd.weight_decay, c->p.sgd.grad_scale, c->p.sgd.nesterov,
	                        c->p.sgd.first_step));
}

/* Generated from PT_OPS: an op without a cuda_<fn> kernel fails to compile. */
static const pt_kernel_fn kernels[PT_OP_COUNT] = {
#define K(id, nm, nin, nout, fn) [PT_OP_##id] = cuda_##fn,
    PT_OPS(K)
#undef K
};

pt_kernel_fn cuda_op_kernel(pt_op op)
{
	return (unsigned)op < PT_OP_COUNT ? kernels[op] : NULL;
}
