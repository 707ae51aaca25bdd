/* layers.c - every layer kind: shape inference, parameters, saved tensors,
 * forward, backward and PyTorch-default initialisation. */
#include "layers.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- helpers ---- */

static pt_param_info pinfo(const char *name, int ndim, int64_t a, int64_t b, bool decay)
{
	pt_param_info p = {.ndim = ndim, .shape = {a, b}, .decay = decay};
	snprintf(p.name, sizeof(p.name), "%s", name);
	return p;
}

static pt_saved_info sinfo(pt_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
	pt_saved_info s = {.dtype = dt, .ndim = ndim, .shape = {a, b, c, d}};
	return s;
}

/* Rows of a batch: B, or B*T with a sequence dim. */
static int64_t batch_rows(pt_act_shape in, int64_t B)
{
	return in.seq ? B * in.seq : B;
}

/* A view of `floats` contiguous floats carved from scratch at *off. */
static pt_err carve(pt_tensor *dst, const pt_tensor *scratch, int64_t *off, int ndim,
                    const int64_t *shape)
{
	int64_t n = 1;
	for (int i = 0; i < ndim; i++)
		n *= shape[i];
	PT_TRY(pt_tensor_init_on(dst, scratch->storage,
	                         (size_t)(scratch->offset + *off) * sizeof(float), PT_F32, ndim,
	                         shape));
	*off += (n + 15) & ~(int64_t)15;
	return PT_OK;
}

/* Kaiming-uniform(a = sqrt(5)) weights and uniform biases: PyTorch's Linear. */
static void init_linear_pair(pt_tensor *w, pt_tensor *b, uint64_t seed, uint64_t stream)
{
	pt_rng r;
	int64_t fan_in = w->shape[1];
	float bound = fan_in > 0 ? 1.0f / sqrtf((float)fan_in) : 0.0f;
	pt_rng_init(&r, seed, stream);
	pt_rng_uniform(&r, pt_tensor_f32(w), pt_tensor_numel(w), -bound, bound);
	if (b != NULL) {
		pt_rng_init(&r, seed, stream + 1);
		pt_rng_uniform(&r, pt_tensor_f32(b), pt_tensor_numel(b), -bound, bound);
	}
}

static void init_ones_zeros(pt_tensor *w, pt_tensor *b)
{
	float *pw = pt_tensor_f32(w), *pb = pt_tensor_f32(b);
	for (int64_t i = 0; i < pt_tensor_numel(w); i++)
		pw[i] = 1.0f;
	memset(pb, 0, pt_tensor_nbytes(b));
}

/* Each layer draws from streams (index << 8) + k, so a layer's weights do not
 * depend on which stage holds it. */
static uint64_t stream_of(const pt_layer *l, int k)
{
	return ((uint64_t)l->index << 8) + (uint64_t)k;
}

static pt_err no_saved_shape(pt_act_shape in, pt_act_shape *out)
{
	*out = in;
	return PT_OK;
}

pt_dtype pt_layer_mm_input(pt_precision prec, pt_device dev)
{
	return prec == PT_PREC_BF16 && dev.kind == PT_DEV_CPU && pt_cpu_bf16_native(NULL) ? PT_BF16
	                                                                                  : PT_F32;
}

static int none_saved(const pt_layer_spec *s, pt_act_shape in, int64_t B, pt_dtype mm_in,
                      pt_saved_info *out)
{
	return 0;
}

static int no_params(const pt_layer_spec *s, pt_param_info *out)
{
	return 0;
}

static int64_t no_scratch(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	return 0;
}

static void no_init(pt_layer *l, uint64_t seed)
{
}

static pt_err need_features(pt_act_shape in, const char *what)
{
	if (in.dtype != PT_F32 || in.features <= 0)
		return pt_set_error(PT_ERR_SHAPE, "%s needs f32 features as input, got %s", what,
		                    in.features ? "another shape" : "tokens");
	return PT_OK;
}

/* ---- linear ---- */

static pt_err linear_infer(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out)
{
	PT_TRY(need_features(in, "linear"));
	if (s->in_features <= 0 || s->out_features <= 0)
		return pt_set_error(PT_ERR_SHAPE, "linear needs in_features and out_features > 0");
	if (s->in_features != in.features)
		return pt_set_error(PT_ERR_SHAPE,
		                    "linear in_features %" PRId64
		                    " does not match the incoming %" PRId64 " features",
		                    s->in_features, in.features);
	*out = in;
	out->features = s->out_features;
	return PT_OK;
}

static int linear_params(const pt_layer_spec *s, pt_param_info *out)
{
	out[0] = pinfo("weight", 2, s->out_features, s->in_features, true);
	if (!s->bias)
		return 1;
	out[1] = pinfo("bias", 1, s->out_features, 0, false);
	return 2;
}

static pt_err linear_forward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_linear_forward(x->y, x->x, &l->param[0], l->spec.bias ? &l->param[1] : NULL);
}

/* stash_view is a view of `shape` carved from the layer's weight stash at
 * *off (the same offsets in both parts of a split backward). */
static pt_err stash_view(pt_tensor *dst, const pt_layer_ctx *x, int64_t *off, int ndim,
                         const int64_t *shape)
{
	return carve(dst, x->wstash, off, ndim, shape);
}

/* stash_dy keeps dy for the weight part (PT_BWD_INPUT) or gives it back
 * (PT_BWD_WEIGHT) in *dy, a view of the stash's first floats. */
static pt_err stash_dy(pt_tensor *dy, const pt_layer_ctx *x, const pt_tensor *like)
{
	int64_t off = 0;
	PT_TRY(stash_view(dy, x, &off, like->ndim, like->shape));
	return x->part == PT_BWD_INPUT ? pt_copy(dy, x->dy) : PT_OK;
}

static int64_t out_rows_stash(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	return ((batch_rows(in, B) * s->out_features) + 15) & ~(int64_t)15;
}

static pt_err linear_backward(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor *gb = l->spec.bias ? &l->grad[1] : NULL, dy = {0};
	pt_err rv;
	if (x->part == PT_BWD_ALL)
		return pt_linear_backward(x->dx, &l->grad[0], gb, x->dy, x->x, &l->param[0], false);
	/* The output gradient is kept for the weight part: dW = dy^T x, db = sum dy. */
	if ((rv = stash_dy(&dy, x, x->part == PT_BWD_INPUT ? x->dy : x->y)) == PT_OK) {
		if (x->part == PT_BWD_WEIGHT)
			rv = pt_linear_backward(NULL, &l->grad[0], gb, &dy, x->x, &l->param[0],
			                        false);
		else if (x->dx != NULL)
			rv =
			    pt_linear_backward(x->dx, NULL, NULL, x->dy, x->x, &l->param[0], false);
	}
	pt_tensor_fini(&dy);
	return rv;
}

static void linear_init(pt_layer *l, uint64_t seed)
{
	init_linear_pair(&l->param[0], l->spec.bias ? &l->param[1] : NULL, seed, stream_of(l, 0));
}

/* ---- activations, dropout, softmax ---- */

static pt_err act_infer(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out)
{
	PT_TRY(need_features(in, pt_layer_kind_name(s->kind)));
	if (s->kind == PT_LAYER_DROPOUT && !(s->p >= 0.0f && s->p < 1.0f))
		return pt_set_error(PT_ERR_RANGE, "dropout p = %g must be in [0, 1)", (double)s->p);
	return no_saved_shape(in, out);
}

static pt_act act_of(pt_layer_kind k)
{
	switch (k) {
	case PT_LAYER_GELU:
		return PT_ACT_GELU;
	case PT_LAYER_TANH:
		return PT_ACT_TANH;
	case PT_LAYER_SIGMOID:
		return PT_ACT_SIGMOID;
	default:
		return PT_ACT_RELU;
	}
}

static pt_err act_forward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_activation_forward(x->y, x->x, act_of(l->spec.kind));
}

static pt_err act_backward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_activation_backward(x->dx, x->dy, x->x, x->y, act_of(l->spec.kind), false);
}

static pt_err dropout_forward(pt_layer *l, pt_layer_ctx *x)
{
	float p = x->training ? l->spec.p : 0.0f;
	return pt_dropout_forward(x->y, x->x, p, x->seed, x->stream);
}

static pt_err dropout_backward(pt_layer *l, pt_layer_ctx *x)
{
	float p = x->training ? l->spec.p : 0.0f;
	return pt_dropout_backward(x->dx, x->dy, p, x->seed, x->stream, false);
}

static pt_err softmax_forward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_softmax_forward(x->y, x->x);
}

static pt_err softmax_backward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_softmax_backward(x->dx, x->dy, x->y, false);
}

/* ---- layernorm ---- */

static float eps_of(const pt_layer_spec *s)
{
	return s->eps > 0.0f ? s->eps : 1e-5f;
}

/* eps_check refuses an eps that is negative, infinite or NaN (0: 1e-5). */
static pt_err eps_check(const pt_layer_spec *s, const char *what)
{
	if (!(s->eps >= 0.0f) || !isfinite(s->eps))
		return pt_set_error(PT_ERR_RANGE, "%s eps = %g must be finite and >= 0", what,
		                    (double)s->eps);
	return PT_OK;
}

static pt_err ln_infer(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out)
{
	PT_TRY(need_features(in, "layernorm"));
	PT_TRY(eps_check(s, "layernorm"));
	if (s->dim != in.features)
		return pt_set_error(PT_ERR_SHAPE,
		                    "layernorm dim %" PRId64 " does not match the incoming %" PRId64
		                    " features",
		                    s->dim, in.features);
	return no_saved_shape(in, out);
}

static int ln_params(const pt_layer_spec *s, pt_param_info *out)
{
	out[0] = pinfo("weight", 1, s->dim, 0, false);
	out[1] = pinfo("bias", 1, s->dim, 0, false);
	return 2;
}

static int ln_saved(const pt_layer_spec *s, pt_act_shape in, int64_t B, pt_dtype mm_in,
                    pt_saved_info *out)
{
	int64_t R = batch_rows(in, B);
	out[0] = sinfo(PT_F32, 1, R, 0, 0, 0); /* mean */
	out[1] = sinfo(PT_F32, 1, R, 0, 0, 0); /* rstd */
	return 2;
}

static pt_err ln_forward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_layernorm_forward(x->y, &x->saved[0], &x->saved[1], x->x, &l->param[0],
	                            &l->param[1], eps_of(&l->spec));
}

static pt_err ln_backward(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor dy = {0};
	pt_err rv;
	if (x->part == PT_BWD_ALL)
		return pt_layernorm_backward(x->dx, &l->grad[0], &l->grad[1], x->dy, x->x,
		                             &l->param[0], &x->saved[0], &x->saved[1], false);
	if ((rv = stash_dy(&dy, x, x->y)) == PT_OK) {
		if (x->part == PT_BWD_WEIGHT)
			rv = pt_layernorm_backward(NULL, &l->grad[0], &l->grad[1], &dy, x->x,
			                           &l->param[0], &x->saved[0], &x->saved[1], false);
		else if (x->dx != NULL)
			rv = pt_layernorm_backward(x->dx, NULL, NULL, x->dy, x->x, &l->param[0],
			                           &x->saved[0], &x->saved[1], false);
	}
	pt_tensor_fini(&dy);
	return rv;
}

static int64_t same_stash(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	return ((batch_rows(in, B) * in.features) + 15) & ~(int64_t)15;
}

static void ln_init(pt_layer *l, uint64_t seed)
{
	init_ones_zeros(&l->param[0], &l->param[1]);
}

/* ---- embedding ---- */

static pt_err emb_infer(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out)
{
	if (in.dtype != PT_I64 || in.features != 0 || in.seq <= 0)
		return pt_set_error(PT_ERR_SHAPE, "embedding needs a sequence of tokens as input");
	if (s->vocab <= 0 || s->dim <= 0)
		return pt_set_error(PT_ERR_SHAPE, "embedding needs vocab > 0 and dim > 0");
	if (s->max_seq != 0 && s->max_seq < in.seq)
		return pt_set_error(PT_ERR_SHAPE,
		                    "embedding max_seq %" PRId64
		                    " is shorter than the sequence %" PRId64,
		                    s->max_seq, in.seq);
	*out = (pt_act_shape){PT_F32, in.seq, s->dim};
	return PT_OK;
}

static int emb_params(const pt_layer_spec *s, pt_param_info *out)
{
	out[0] = pinfo("wte.weight", 2, s->vocab, s->dim, true);
	if (s->max_seq == 0)
		return 1;
	out[1] = pinfo("wpe.weight", 2, s->max_seq, s->dim, true);
	return 2;
}

static pt_err emb_forward(pt_layer *l, pt_layer_ctx *x)
{
	return pt_embedding_forward(x->y, x->x, &l->param[0],
	                            l->spec.max_seq ? &l->param[1] : NULL);
}

static pt_err emb_backward(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor dy = {0};
	pt_err rv;
	if (x->part == PT_BWD_ALL)
		return pt_embedding_backward(&l->grad[0], l->spec.max_seq ? &l->grad[1] : NULL,
		                             x->dy, x->x);
	/* Tokens have no gradient: the input part only keeps dy. */
	if ((rv = stash_dy(&dy, x, x->y)) == PT_OK && x->part == PT_BWD_WEIGHT)
		rv = pt_embedding_backward(&l->grad[0], l->spec.max_seq ? &l->grad[1] : NULL, &dy,
		                           x->x);
	pt_tensor_fini(&dy);
	return rv;
}

static int64_t emb_stash(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	return ((B * in.seq * s->dim) + 15) & ~(int64_t)15;
}

static void emb_init(pt_layer *l, uint64_t seed)
{
	/* PyTorch's nn.Embedding: N(0, 1). */
	for (int k = 0; k < l->n_params; k++) {
		pt_rng r;
		pt_rng_init(&r, seed, stream_of(l, k));
		pt_rng_normal(&r, pt_tensor_f32(&l->param[k]), pt_tensor_numel(&l->param[k]), 0.0f,
		              1.0f);
	}
}

/* ---- attention (qkv projection, causal attention, output projection) ---- */

static pt_err attn_check(const pt_layer_spec *s, pt_act_shape in, const char *what)
{
	PT_TRY(need_features(in, what));
	if (in.seq <= 0)
		return pt_set_error(PT_ERR_SHAPE, "%s needs a sequence input (B, T, C)", what);
	if (s->dim != in.features)
		return pt_set_error(PT_ERR_SHAPE,
		                    "%s dim %" PRId64 " does not match the incoming %" PRId64
		                    " features",
		                    what, s->dim, in.features);
	if (s->n_head <= 0 || s->dim % s->n_head != 0)
		return pt_set_error(PT_ERR_SHAPE, "%s: %d heads do not divide dim %" PRId64, what,
		                    s->n_head, s->dim);
	return PT_OK;
}

static pt_err attn_infer(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out)
{
	PT_TRY(attn_check(s, in, "attention"));
	return no_saved_shape(in, out);
}

static int attn_params(const pt_layer_spec *s, pt_param_info *out)
{
	int64_t C = s->dim;
	out[0] = pinfo("c_attn.weight", 2, 3 * C, C, true);
	out[1] = pinfo("c_attn.bias", 1, 3 * C, 0, false);
	out[2] = pinfo("c_proj.weight", 2, C, C, true);
	out[3] = pinfo("c_proj.bias", 1, C, 0, false);
	return 4;
}

static int attn_saved(const pt_layer_spec *s, pt_act_shape in, int64_t B, pt_dtype mm_in,
                      pt_saved_info *out)
{
	int64_t T = in.seq, C = s->dim;
	out[0] = sinfo(PT_F32, 3, B, T, 3 * C, 0);     /* qkv */
	out[1] = sinfo(PT_F32, 3, B, s->n_head, T, 0); /* lse */
	out[2] = sinfo(PT_F32, 3, B, T, C, 0);         /* attention output */
	return 3;
}

static int64_t attn_scratch(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	int64_t BTC = B * in.seq * s->dim;
	return 4 * BTC + 64; /* d(attention output), dqkv */
}

static pt_err attn_forward(pt_layer *l, pt_layer_ctx *x)
{
	PT_TRY(pt_linear_forward(&x->saved[0], x->x, &l->param[0], &l->param[1]));
	PT_TRY(pt_attention_forward(&x->saved[2], &x->saved[1], &x->saved[0], l->spec.n_head));
	return pt_linear_forward(x->y, &x->saved[2], &l->param[2], &l->param[3]);
}

/* attn_backward_split: the input part keeps dy (for c_proj) and dqkv (for
 * c_attn) in the stash; the weight part reads them back. */
static pt_err attn_backward_split(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor datty = {0}, dqkv = {0}, dy = {0};
	int64_t off = 0, soff = 0;
	pt_err rv;
	if ((rv = stash_view(&dy, x, &soff, x->y->ndim, x->y->shape)) != PT_OK ||
	    (rv = stash_view(&dqkv, x, &soff, 3, x->saved[0].shape)) != PT_OK)
		goto out;
	if (x->part == PT_BWD_WEIGHT) {
		if ((rv = pt_linear_backward(NULL, &l->grad[2], &l->grad[3], &dy, &x->saved[2],
		                             &l->param[2], false)) == PT_OK)
			rv = pt_linear_backward(NULL, &l->grad[0], &l->grad[1], &dqkv, x->x,
			                        &l->param[0], false);
		goto out;
	}
	if ((rv = carve(&datty, x->scratch, &off, 3, x->saved[2].shape)) != PT_OK ||
	    (rv = pt_copy(&dy, x->dy)) != PT_OK ||
	    (rv = pt_linear_backward(&datty, NULL, NULL, x->dy, &x->saved[2], &l->param[2],
	                             false)) != PT_OK ||
	    (rv = pt_attention_backward(&dqkv, &datty, &x->saved[0], &x->saved[1], l->spec.n_head,
	                                false)) != PT_OK)
		goto out;
	rv = pt_linear_backward(x->dx, NULL, NULL, &dqkv, x->x, &l->param[0], false);
out:
	pt_tensor_fini(&datty);
	pt_tensor_fini(&dqkv);
	pt_tensor_fini(&dy);
	return rv;
}

static int64_t attn_stash(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	int64_t BTC = B * in.seq * s->dim;
	return ((BTC + 15) & ~(int64_t)15) + ((3 * BTC + 15) & ~(int64_t)15);
}

static pt_err attn_backward(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor datty = {0}, dqkv = {0};
	int64_t off = 0;
	pt_err rv;
	if (x->part != PT_BWD_ALL)
		return attn_backward_split(l, x);
	if ((rv = carve(&datty, x->scratch, &off, 3, x->saved[2].shape)) != PT_OK ||
	    (rv = carve(&dqkv, x->scratch, &off, 3, x->saved[0].shape)) != PT_OK)
		goto out;
	if ((rv = pt_linear_backward(&datty, &l->grad[2], &l->grad[3], x->dy, &x->saved[2],
	                             &l->param[2], false)) != PT_OK)
		goto out;
	if ((rv = pt_attention_backward(&dqkv, &datty, &x->saved[0], &x->saved[1], l->spec.n_head,
	                                false)) != PT_OK)
		goto out;
	rv = pt_linear_backward(x->dx, &l->grad[0], &l->grad[1], &dqkv, x->x, &l->param[0], false);
out:
	pt_tensor_fini(&datty);
	pt_tensor_fini(&dqkv);
	return rv;
}

static void attn_init(pt_layer *l, uint64_t seed)
{
	init_linear_pair(&l->param[0], &l->param[1], seed, stream_of(l, 0));
	init_linear_pair(&l->param[2], &l->param[3], seed, stream_of(l, 2));
}

/* ---- transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)) ---- */

static int64_t hidden_of(const pt_layer_spec *s)
{
	return s->mlp_hidden > 0 ? s->mlp_hidden : 4 * s->dim;
}

static pt_err block_infer(const pt_layer_spec *s, pt_act_shape in, pt_act_shape *out)
{
	PT_TRY(attn_check(s, in, "transformer_block"));
	PT_TRY(eps_check(s, "transformer_block"));
	if (s->mlp_hidden < 0)
		return pt_set_error(PT_ERR_RANGE,
		                    "transformer_block: mlp_hidden %" PRId64
		                    " is negative (0: 4 x dim, else the MLP's width)",
		                    s->mlp_hidden);
	return no_saved_shape(in, out);
}

enum {
	B_LN1,
	B_LN1_MEAN,
	B_LN1_RSTD,
	B_QKV,
	B_LSE,
	B_ATTY,
	B_R1,
	B_LN2,
	B_LN2_MEAN,
	B_LN2_RSTD,
	B_FC,
	B_GELU,
	B_NSAVED
};

enum {
	P_LN1_W,
	P_LN1_B,
	P_QKV_W,
	P_QKV_B,
	P_PROJ_W,
	P_PROJ_B,
	P_LN2_W,
	P_LN2_B,
	P_FC_W,
	P_FC_B,
	P_FC2_W,
	P_FC2_B,
	P_NPARAMS
};

static int block_params(const pt_layer_spec *s, pt_param_info *out)
{
	int64_t C = s->dim, H = hidden_of(s);
	out[P_LN1_W] = pinfo("ln_1.weight", 1, C, 0, false);
	out[P_LN1_B] = pinfo("ln_1.bias", 1, C, 0, false);
	out[P_QKV_W] = pinfo("attn.c_attn.weight", 2, 3 * C, C, true);
	out[P_QKV_B] = pinfo("attn.c_attn.bias", 1, 3 * C, 0, false);
	out[P_PROJ_W] = pinfo("attn.c_proj.weight", 2, C, C, true);
	out[P_PROJ_B] = pinfo("attn.c_proj.bias", 1, C, 0, false);
	out[P_LN2_W] = pinfo("ln_2.weight", 1, C, 0, false);
	out[P_LN2_B] = pinfo("ln_2.bias", 1, C, 0, false);
	out[P_FC_W] = pinfo("mlp.c_fc.weight", 2, H, C, true);
	out[P_FC_B] = pinfo("mlp.c_fc.bias", 1, H, 0, false);
	out[P_FC2_W] = pinfo("mlp.c_proj.weight", 2, C, H, true);
	out[P_FC2_B] = pinfo("mlp.c_proj.bias", 1, C, 0, false);
	return P_NPARAMS;
}

static int block_saved(const pt_layer_spec *s, pt_act_shape in, int64_t B, pt_dtype mm_in,
                       pt_saved_info *out)
{
	int64_t T = in.seq, C = s->dim, H = hidden_of(s);
	out[B_LN1] = sinfo(mm_in, 3, B, T, C, 0); /* read by products only */
	out[B_LN1_MEAN] = sinfo(PT_F32, 1, B * T, 0, 0, 0);
	out[B_LN1_RSTD] = sinfo(PT_F32, 1, B * T, 0, 0, 0);
	out[B_QKV] = sinfo(PT_F32, 3, B, T, 3 * C, 0);
	out[B_LSE] = sinfo(PT_F32, 3, B, s->n_head, T, 0);
	out[B_ATTY] = sinfo(PT_F32, 3, B, T, C, 0);
	out[B_R1] = sinfo(PT_F32, 3, B, T, C, 0);
	out[B_LN2] = sinfo(mm_in, 3, B, T, C, 0);
	out[B_LN2_MEAN] = sinfo(PT_F32, 1, B * T, 0, 0, 0);
	out[B_LN2_RSTD] = sinfo(PT_F32, 1, B * T, 0, 0, 0);
	out[B_FC] = sinfo(PT_F32, 3, B, T, H, 0);
	out[B_GELU] = sinfo(mm_in, 3, B, T, H, 0);
	return B_NSAVED;
}

static int64_t block_scratch(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	int64_t BT = B * in.seq, C = s->dim, H = hidden_of(s);
	/* dh (BT, H), dr1, dln, datty (BT, C), dqkv (BT, 3C) */
	return BT * H + 6 * BT * C + 5 * 16;
}

static pt_err block_forward(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor *sv = x->saved, *p = l->param;
	float eps = eps_of(&l->spec);
	PT_TRY(pt_layernorm_forward(&sv[B_LN1], &sv[B_LN1_MEAN], &sv[B_LN1_RSTD], x->x, &p[P_LN1_W],
	                            &p[P_LN1_B], eps));
	PT_TRY(pt_linear_forward(&sv[B_QKV], &sv[B_LN1], &p[P_QKV_W], &p[P_QKV_B]));
	PT_TRY(pt_attention_forward(&sv[B_ATTY], &sv[B_LSE], &sv[B_QKV], l->spec.n_head));
	PT_TRY(pt_linear_forward(&sv[B_R1], &sv[B_ATTY], &p[P_PROJ_W], &p[P_PROJ_B]));
	PT_TRY(pt_add(&sv[B_R1], &sv[B_R1], x->x, 1.0f, 1.0f));
	PT_TRY(pt_layernorm_forward(&sv[B_LN2], &sv[B_LN2_MEAN], &sv[B_LN2_RSTD], &sv[B_R1],
	                            &p[P_LN2_W], &p[P_LN2_B], eps));
	PT_TRY(pt_linear_forward(&sv[B_FC], &sv[B_LN2], &p[P_FC_W], &p[P_FC_B]));
	PT_TRY(pt_activation_forward(&sv[B_GELU], &sv[B_FC], PT_ACT_GELU));
	PT_TRY(pt_linear_forward(x->y, &sv[B_GELU], &p[P_FC2_W], &p[P_FC2_B]));
	return pt_add(x->y, x->y, &sv[B_R1], 1.0f, 1.0f);
}

/* block_backward_split: the input part keeps, for the weight part, the
 * gradient of every parameterised sub-layer's output: dy (mlp.c_proj), dh
 * (mlp.c_fc, after GELU), dln2 (ln_2), dr1 (attn.c_proj), dqkv
 * (attn.c_attn) and dln1 (ln_1). Each op is the fused backward's, so the
 * results are its bits. */
static pt_err block_backward_split(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor *sv = x->saved, *p = l->param, *g = l->grad;
	pt_tensor dy = {0}, dh = {0}, dln2 = {0}, dr1 = {0}, dqkv = {0}, dln1 = {0}, datty = {0};
	int64_t off = 0, soff = 0;
	pt_err rv;

	if ((rv = stash_view(&dy, x, &soff, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = stash_view(&dh, x, &soff, 3, sv[B_FC].shape)) != PT_OK ||
	    (rv = stash_view(&dln2, x, &soff, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = stash_view(&dr1, x, &soff, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = stash_view(&dqkv, x, &soff, 3, sv[B_QKV].shape)) != PT_OK ||
	    (rv = stash_view(&dln1, x, &soff, 3, sv[B_R1].shape)) != PT_OK)
		goto out;
	if (x->part == PT_BWD_WEIGHT) {
		if ((rv = pt_linear_backward(NULL, &g[P_FC2_W], &g[P_FC2_B], &dy, &sv[B_GELU],
		                             &p[P_FC2_W], false)) != PT_OK ||
		    (rv = pt_linear_backward(NULL, &g[P_FC_W], &g[P_FC_B], &dh, &sv[B_LN2],
		                             &p[P_FC_W], false)) != PT_OK ||
		    (rv = pt_layernorm_backward(NULL, &g[P_LN2_W], &g[P_LN2_B], &dln2, &sv[B_R1],
		                                &p[P_LN2_W], &sv[B_LN2_MEAN], &sv[B_LN2_RSTD],
		                                false)) != PT_OK ||
		    (rv = pt_linear_backward(NULL, &g[P_PROJ_W], &g[P_PROJ_B], &dr1, &sv[B_ATTY],
		                             &p[P_PROJ_W], false)) != PT_OK ||
		    (rv = pt_linear_backward(NULL, &g[P_QKV_W], &g[P_QKV_B], &dqkv, &sv[B_LN1],
		                             &p[P_QKV_W], false)) != PT_OK)
			goto out;
		rv = pt_layernorm_backward(NULL, &g[P_LN1_W], &g[P_LN1_B], &dln1, x->x, &p[P_LN1_W],
		                           &sv[B_LN1_MEAN], &sv[B_LN1_RSTD], false);
		goto out;
	}
	if ((rv = carve(&datty, x->scratch, &off, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = pt_copy(&dy, x->dy)) != PT_OK ||
	    (rv = pt_linear_backward(&dh, NULL, NULL, x->dy, &sv[B_GELU], &p[P_FC2_W], false)) !=
	        PT_OK ||
	    (rv = pt_activation_backward(&dh, &dh, &sv[B_FC], NULL, PT_ACT_GELU, false)) != PT_OK ||
	    (rv = pt_linear_backward(&dln2, NULL, NULL, &dh, &sv[B_LN2], &p[P_FC_W], false)) !=
	        PT_OK ||
	    (rv = pt_copy(&dr1, x->dy)) != PT_OK ||
	    (rv = pt_layernorm_backward(&dr1, NULL, NULL, &dln2, &sv[B_R1], &p[P_LN2_W],
	                                &sv[B_LN2_MEAN], &sv[B_LN2_RSTD], true)) != PT_OK ||
	    (rv = pt_linear_backward(&datty, NULL, NULL, &dr1, &sv[B_ATTY], &p[P_PROJ_W], false)) !=
	        PT_OK ||
	    (rv = pt_attention_backward(&dqkv, &datty, &sv[B_QKV], &sv[B_LSE], l->spec.n_head,
	                                false)) != PT_OK ||
	    (rv = pt_linear_backward(&dln1, NULL, NULL, &dqkv, &sv[B_LN1], &p[P_QKV_W], false)) !=
	        PT_OK)
		goto out;
	if (x->dx != NULL && (rv = pt_copy(x->dx, &dr1)) == PT_OK)
		rv = pt_layernorm_backward(x->dx, NULL, NULL, &dln1, x->x, &p[P_LN1_W],
		                           &sv[B_LN1_MEAN], &sv[B_LN1_RSTD], true);
out:
	pt_tensor_fini(&dy);
	pt_tensor_fini(&dh);
	pt_tensor_fini(&dln2);
	pt_tensor_fini(&dr1);
	pt_tensor_fini(&dqkv);
	pt_tensor_fini(&dln1);
	pt_tensor_fini(&datty);
	return rv;
}

static int64_t block_stash(const pt_layer_spec *s, pt_act_shape in, int64_t B)
{
	int64_t BT = B * in.seq, C = s->dim, H = hidden_of(s);
	return 4 * ((BT * C + 15) & ~(int64_t)15) + ((BT * H + 15) & ~(int64_t)15) +
	       ((3 * BT * C + 15) & ~(int64_t)15);
}

static pt_err block_backward(pt_layer *l, pt_layer_ctx *x)
{
	pt_tensor *sv = x->saved, *p = l->param, *g = l->grad;
	pt_tensor dh = {0}, dr1 = {0}, dln = {0}, datty = {0}, dqkv = {0};
	int64_t off = 0;
	pt_err rv;

	if (x->part != PT_BWD_ALL)
		return block_backward_split(l, x);

	if ((rv = carve(&dh, x->scratch, &off, 3, sv[B_FC].shape)) != PT_OK ||
	    (rv = carve(&dr1, x->scratch, &off, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = carve(&dln, x->scratch, &off, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = carve(&datty, x->scratch, &off, 3, sv[B_R1].shape)) != PT_OK ||
	    (rv = carve(&dqkv, x->scratch, &off, 3, sv[B_QKV].shape)) != PT_OK)
		goto out;
	/* MLP branch: y = r1 + fc2(gelu(fc(ln_2(r1)))). */
	if ((rv = pt_linear_backward(&dh, &g[P_FC2_W], &g[P_FC2_B], x->dy, &sv[B_GELU], &p[P_FC2_W],
	                             false)) != PT_OK ||
	    (rv = pt_activation_backward(&dh, &dh, &sv[B_FC], NULL, PT_ACT_GELU, false)) != PT_OK ||
	    (rv = pt_linear_backward(&dln, &g[P_FC_W], &g[P_FC_B], &dh, &sv[B_LN2], &p[P_FC_W],
	                             false)) != PT_OK ||
	    (rv = pt_copy(&dr1, x->dy)) != PT_OK ||
	    (rv = pt_layernorm_backward(&dr1, &g[P_LN2_W], &g[P_LN2_B], &dln, &sv[B_R1],
	                                &p[P_LN2_W], &sv[B_LN2_MEAN], &sv[B_LN2_RSTD], true)) !=
	        PT_OK)
		goto out;
	/* Attention branch: r1 = x + proj(attn(qkv(ln_1(x)))). */
	if ((rv = pt_linear_backward(&datty, &g[P_PROJ_W], &g[P_PROJ_B], &dr1, &sv[B_ATTY],
	                             &p[P_PROJ_W], false)) != PT_OK ||
	    (rv = pt_attention_backward(&dqkv, &datty, &sv[B_QKV], &sv[B_LSE], l->spec.n_head,
	                                false)) != PT_OK ||
	    (rv = pt_linear_backward(&dln, &g[P_QKV_W], &g[P_QKV_B], &dqkv, &sv[B_LN1], &p[P_QKV_W],
	                             false)) != PT_OK)
		goto out;
	if (x->dx != NULL) {
		if ((rv = pt_copy(x->dx, &dr1)) != PT_OK)
			goto out;
		rv = pt_layernorm_backward(x->dx, &g[P_LN1_W], &g[P_LN1_B], &dln, x->x, &p[P_LN1_W],
		                           &sv[B_LN1_MEAN], &sv[B_LN1_RSTD], true);
	} else {
		/* Parameter gradients of ln_1 are still needed: use dr1 as the dx sink. */
		rv = pt_layernorm_backward(&dr1, &g[P_LN1_W], &g[P_LN1_B], &dln, x->x, &p[P_LN1_W],
		                           &sv[B_LN1_MEAN], &sv[B_LN1_RSTD], true);
	}
out:
	pt_tensor_fini(&dh);
	pt_tensor_fini(&dr1);
	pt_tensor_fini(&dln);
	pt_tensor_fini(&datty);
	pt_tensor_fini(&dqkv);
	return rv;
}

static void block_init(pt_layer *l, uint64_t seed)
{
	pt_tensor *p = l->param;
	init_ones_zeros(&p[P_LN1_W], &p[P_LN1_B]);
	init_ones_zeros(&p[P_LN2_W], &p[P_LN2_B]);
	init_linear_pair(&p[P_QKV_W], &p[P_QKV_B], seed, stream_of(l, P_QKV_W));
	init_linear_pair(&p[P_PROJ_W], &p[P_PROJ_B], seed, stream_of(l, P_PROJ_W));
	init_linear_pair(&p[P_FC_W], &p[P_FC_B], seed, stream_of(l, P_FC_W));
	init_linear_pair(&p[P_FC2_W], &p[P_FC2_B], seed, stream_of(l, P_FC2_W));
}

/* ---- the table ---- */

#define VT_ACT(nm, fw, bw)                                                                         \
	{                                                                                          \
		nm, act_infer, no_params, none_saved, no_scratch, fw, bw, no_init, NULL            \
	}

static const pt_layer_vt vtables[PT_LAYER_KIND_COUNT] = {
    [PT_LAYER_LINEAR] = {"linear", linear_infer, linear_params, none_saved, no_scratch,
                         linear_forward, linear_backward, linear_init, out_rows_stash},
    [PT_LAYER_RELU] = VT_ACT("relu", act_forward, act_backward),
    [PT_LAYER_GELU] = VT_ACT("gelu", act_forward, act_backward),
    [PT_LAYER_TANH] = VT_ACT("tanh", act_forward, act_backward),
    [PT_LAYER_SIGMOID] = VT_ACT("sigmoid", act_forward, act_backward),
    [PT_LAYER_DROPOUT] = VT_ACT("dropout", dropout_forward, dropout_backward),
    [PT_LAYER_LAYERNORM] = {"layernorm", ln_infer, ln_params, ln_saved, no_scratch, ln_forward,
                            ln_backward, ln_init, same_stash},
    [PT_LAYER_EMBEDDING] = {"embedding", emb_infer, emb_params, none_saved, no_scratch, emb_forward,
                            emb_backward, emb_init, emb_stash},
    [PT_LAYER_ATTENTION] = {"attention", attn_infer, attn_params, attn_saved, attn_scratch,
                            attn_forward, attn_backward, attn_init, attn_stash},
    [PT_LAYER_BLOCK] = {"transformer_block", block_infer, block_params, block_saved, block_scratch,
                        block_forward, block_backward, block_init, block_stash},
    [PT_LAYER_SOFTMAX] = VT_ACT("softmax", softmax_forward, softmax_backward),
};
_Static_assert(sizeof(vtables) / sizeof(vtables[0]) == PT_LAYER_KIND_COUNT, "layer table");

static const char *const kind_names[] = {
#define PT_LK_NAME(id, name) name,
    PT_LAYER_KINDS(PT_LK_NAME)
#undef PT_LK_NAME
};

const pt_layer_vt *pt_layer_vtable(pt_layer_kind k)
{
	return (unsigned)k < PT_LAYER_KIND_COUNT ? &vtables[k] : NULL;
}

const char *pt_layer_kind_name(pt_layer_kind k)
{
	return (unsigned)k < PT_LAYER_KIND_COUNT ? kind_names[k] : "unknown";
}

pt_err pt_layer_kind_parse(const char *name, pt_layer_kind *out)
{
	for (int k = 0; k < PT_LAYER_KIND_COUNT; k++)
		if (strcmp(name, kind_names[k]) == 0) {
			*out = (pt_layer_kind)k;
			return PT_OK;
		}
	return pt_set_error(PT_ERR_NOTFOUND, "unknown layer kind \"%s\"", name);
}

pt_layer_spec pt_linear(int64_t in, int64_t out)
{
	return (pt_layer_spec){
	    .kind = PT_LAYER_LINEAR, .in_features = in, .out_features = out, .bias = true};
}

pt_layer_spec pt_activation(pt_layer_kind kind)
{
	return (pt_layer_spec){.kind = kind};
}

pt_layer_spec pt_dropout(float p)
{
	return (pt_layer_spec){.kind = PT_LAYER_DROPOUT, .p = p};
}

pt_layer_spec pt_layernorm(int64_t dim)
{
	return (pt_layer_spec){.kind = PT_LAYER_LAYERNORM, .dim = dim, .eps = 1e-5f};
}

pt_layer_spec pt_embedding(int64_t vocab, int64_t dim, int64_t max_seq)
{
	return (pt_layer_spec){
	    .kind = PT_LAYER_EMBEDDING, .vocab = vocab, .dim = dim, .max_seq = max_seq};
}

pt_layer_spec pt_attention(int64_t dim, int n_head)
{
	return (pt_layer_spec){.kind = PT_LAYER_ATTENTION, .dim = dim, .n_head = n_head};
}

pt_layer_spec pt_block(int64_t dim, int n_head)
{
	return (pt_layer_spec){.kind = PT_LAYER_BLOCK, .dim = dim, .n_head = n_head, .eps = 1e-5f};
}
