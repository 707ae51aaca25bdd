/* test_layers.c - finite-difference gradient checks for every layer kind and
 * loss, gradient accumulation across microbatches, and shape errors.
 *
 * Method: a small model holding just the layer under test (B = 3, T = 5,
 * C = 8, 2 heads), a fixed random R of the output's shape, and the objective
 * L = sum(y .* R) summed in double on the host. The analytic gradients come
 * from one backward with dy = R; the numeric ones from central differences
 * (L(p + h) - L(p - h)) / (2h), h = 1e-3, of the float32 forward, for every
 * element of tensors up to FD_ALL elements and a seeded subset of FD_SUBSET
 * (one per equal bucket) of bigger ones. Limits: float32 forward noise bounds
 * how tight the tolerance can be (see fd_tol).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loss.h"
#include "model.h"
#include "pt_test.h"

#define FD_H 1e-3
/* Tolerance: every checked element satisfies
 *   |a - n| / max(|a|, |n|, floor) <= tol,
 * a analytic, n numeric. tol is the relative accuracy asked of gradients big
 * enough to measure; floor is where the float32 forward's rounding takes
 * over. Each evaluation of L carries rounding of about ulp(y) * |R| per output
 * touched, so n has an absolute noise of that over 2h; the largest |a - n|
 * measured over all checked elements was 3e-5 for one linear, 1e-4 for
 * layernorm and attention, 6.6e-4 for the transformer block (it falls to
 * 5e-5 at h = 1e-2 and converges on a: noise, not a gradient bug). Each floor
 * is ~300x that noise, so the check holds with a 3x margin however oneDNN's
 * kernel choice on another CPU moves the rounding. */
typedef struct fd_tol {
	double tol, floor;
} fd_tol;
static const fd_tol FD_ELEMENTWISE = {5e-3, 1e-2}; /* activations, dropout, embedding */
static const fd_tol FD_STD = {1e-2, 1e-2};         /* linear, softmax, losses */
static const fd_tol FD_WIDE = {1e-2, 3e-2};        /* layernorm, attention, 64-input linear */
static const fd_tol FD_DEEP = {1e-2, 2e-1};        /* transformer block, 5-layer chain */
#define FD_ALL    256 /* check every element of tensors up to this size */
#define FD_SUBSET 96  /* else this many, one per equal-sized bucket */

enum { B = 3, T = 5, C = 8, NH = 2, V = 11 };

/* ---- helpers ---- */

static float *host_copy(const pt_tensor *t)
{
	int64_t n = pt_tensor_numel(t);
	float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
	CU_ASSERT_PTR_NOT_NULL_FATAL(h);
	PT_CHECK_OK(pt_tensor_read(t, h, sizeof(float) * (size_t)n));
	return h;
}

/* Values in (-1, -0.05] U [0.05, 1): away from ReLU's kink at 0. */
static void fill_away_from_zero(pt_rng *r, float *p, int64_t n)
{
	pt_rng_uniform(r, p, n, 0.05f, 1.0f);
	for (int64_t i = 0; i < n; i++)
		if (pt_rng_u32(r) & 1u)
			p[i] = -p[i];
}

typedef struct fd_case {
	const char *name;
	pt_model *m;
	pt_tensor x;   /* model input: f32 features or i64 tokens */
	pt_tensor dy;  /* R, shaped like the output */
	float *R;      /* host copy of R */
	int64_t n_out; /* elements of the output */
	bool training; /* dropout on */
	fd_tol tol;
	double max_rel;  /* worst relative error seen */
	int64_t checked; /* elements compared */
	int64_t failed;  /* elements over tolerance */
} fd_case;

/* L = sum(y .* R) in double, from one float32 forward. The dropout mask is
 * fixed by (seed, step 3, microbatch 1). */
static double objective(fd_case *fc)
{
	const pt_tensor *y = NULL;
	double L = 0.0;
	PT_CHECK_OK(pt_model_forward(fc->m, 0, &fc->x, &y, fc->training, 3, 1));
	float *h = host_copy(y);
	for (int64_t i = 0; i < fc->n_out; i++)
		L += (double)h[i] * (double)fc->R[i];
	free(h);
	return L;
}

static void record(fd_case *fc, const char *what, int64_t i, double a, double n)
{
	double den = fmax(fmax(fabs(a), fabs(n)), fc->tol.floor);
	double rel = fabs(a - n) / den;
	fc->checked++;
	if (rel > fc->max_rel)
		fc->max_rel = rel;
	if (!(rel <= fc->tol.tol)) {
		if (fc->failed < 5)
			fprintf(stderr, "  %s %s[%ld]: analytic %.6g, numeric %.6g (rel %.3g)\n",
			        fc->name, what, (long)i, a, n, rel);
		fc->failed++;
	}
}

/* Compares analytic[i] with the central difference of L in element i of t
 * (f32, contiguous, written in place and restored). The step actually taken,
 * (float)(v + h) - (float)(v - h), is the denominator. */
static void check_tensor(fd_case *fc, const char *what, pt_tensor *t, const float *analytic)
{
	int64_t n = pt_tensor_numel(t);
	int64_t count = n <= FD_ALL ? n : FD_SUBSET;
	pt_rng r;
	pt_rng_init(&r, 777, (uint64_t)n);
	PT_CHECK_OK(pt_tensor_sync(t));
	float *p = pt_tensor_f32(t);
	for (int64_t k = 0; k < count; k++) {
		int64_t i = k;
		if (n > FD_ALL) {
			int64_t lo = k * n / count, hi = (k + 1) * n / count;
			i = lo + (int64_t)(pt_rng_u32(&r) % (uint32_t)(hi - lo));
		}
		float v = p[i];
		float vp = (float)(v + FD_H), vm = (float)(v - FD_H);
		p[i] = vp;
		double lp = objective(fc);
		p[i] = vm;
		double lm = objective(fc);
		p[i] = v;
		record(fc, what, i, analytic[i], (lp - lm) / ((double)vp - (double)vm));
	}
}

/* Builds the model, randomises its parameters around their initial values
 * (so LayerNorm weights are not all 1 and its biases not all 0), makes the
 * input and R. */
static void fd_setup(fd_case *fc, const char *name, const pt_layer_spec *layers, int n,
                     pt_act_shape in, bool training, bool relu_input, fd_tol tol)
{
	pt_model_config cfg = {.batch = B, .input = in, .n_slots = 1, .seed = 42};
	const pt_tensor *y = NULL;
	pt_rng r;
	int64_t shape[3];
	int nd = 0;

	memset(fc, 0, sizeof(*fc));
	fc->name = name;
	fc->training = training;
	fc->tol = tol;
	PT_CHECK_OK(pt_model_create(&fc->m, layers, n, 0, n, &cfg));
	pt_rng_init(&r, 2024, 1);
	for (int k = 0; k < pt_model_num_tensors(fc->m); k++) {
		pt_tensor *p;
		PT_CHECK_OK(pt_model_tensor(fc->m, k, NULL, &p, NULL));
		int64_t pn = pt_tensor_numel(p);
		float *noise = malloc(sizeof(float) * (size_t)pn);
		float *ph = host_copy(p);
		pt_rng_uniform(&r, noise, pn, -0.1f, 0.1f);
		for (int64_t i = 0; i < pn; i++)
			ph[i] += noise[i];
		PT_CHECK_OK(pt_tensor_write(p, ph, sizeof(float) * (size_t)pn));
		free(noise);
		free(ph);
	}

	shape[nd++] = B;
	if (in.seq)
		shape[nd++] = in.seq;
	if (in.features)
		shape[nd++] = in.features;
	PT_CHECK_OK(pt_tensor_init(&fc->x, in.dtype, nd, shape));
	int64_t xn = pt_tensor_numel(&fc->x);
	if (in.dtype == PT_I64) {
		int64_t *tok = malloc(sizeof(int64_t) * (size_t)xn);
		for (int64_t i = 0; i < xn; i++)
			tok[i] = (int64_t)(pt_rng_u32(&r) % V);
		tok[0] = V - 1; /* the last row of wte is used; 15 tokens over 11
		                 * rows repeat some, so the scatter must add */
		PT_CHECK_OK(pt_tensor_write(&fc->x, tok, sizeof(int64_t) * (size_t)xn));
		free(tok);
	} else {
		float *xh = malloc(sizeof(float) * (size_t)xn);
		if (relu_input)
			fill_away_from_zero(&r, xh, xn);
		else
			pt_rng_uniform(&r, xh, xn, -1.0f, 1.0f);
		PT_CHECK_OK(pt_tensor_write(&fc->x, xh, sizeof(float) * (size_t)xn));
		free(xh);
	}

	PT_CHECK_OK(pt_model_forward(fc->m, 0, &fc->x, &y, training, 3, 1));
	fc->n_out = pt_tensor_numel(y);
	PT_CHECK_OK(pt_tensor_init(&fc->dy, PT_F32, y->ndim, y->shape));
	fc->R = malloc(sizeof(float) * (size_t)fc->n_out);
	pt_rng_uniform(&r, fc->R, fc->n_out, -1.0f, 1.0f);
	PT_CHECK_OK(pt_tensor_write(&fc->dy, fc->R, sizeof(float) * (size_t)fc->n_out));
}

static void fd_teardown(fd_case *fc)
{
	fprintf(stderr, "  fd %-22s %5ld elements, max rel err %.2e (tol %.0e, floor %.0e)\n",
	        fc->name, (long)fc->checked, fc->max_rel, fc->tol.tol, fc->tol.floor);
	CU_ASSERT_EQUAL(fc->failed, 0);
	CU_ASSERT_TRUE(fc->checked > 0);
	pt_model_destroy(fc->m);
	pt_tensor_fini(&fc->x);
	pt_tensor_fini(&fc->dy);
	free(fc->R);
}

/* The whole check: analytic gradients of the input and every parameter from
 * one backward, then finite differences of each. */
static void fd_run(const char *name, const pt_layer_spec *layers, int n, pt_act_shape in,
                   bool training, bool relu_input, fd_tol tol)
{
	fd_case fc;
	const pt_tensor *y = NULL, *dx = NULL;
	int nt;
	float **grads;

	fd_setup(&fc, name, layers, n, in, training, relu_input, tol);
	nt = pt_model_num_tensors(fc.m);
	grads = calloc((size_t)nt + 1, sizeof(float *));
	PT_CHECK_OK(pt_model_zero_grad(fc.m));
	PT_CHECK_OK(pt_model_forward(fc.m, 0, &fc.x, &y, training, 3, 1));
	PT_CHECK_OK(pt_model_backward(fc.m, 0, &fc.dy, &dx));
	float *dxh = NULL;
	if (in.dtype == PT_F32) {
		CU_ASSERT_PTR_NOT_NULL_FATAL(dx);
		CU_ASSERT_TRUE(pt_tensor_same_shape(dx, &fc.x));
		dxh = host_copy(dx);
	} else {
		CU_ASSERT_PTR_NULL(dx); /* token input has no gradient */
	}
	for (int k = 0; k < nt; k++) {
		pt_tensor *g;
		PT_CHECK_OK(pt_model_tensor(fc.m, k, NULL, NULL, &g));
		grads[k] = host_copy(g);
	}

	if (dxh)
		check_tensor(&fc, "input", &fc.x, dxh);
	for (int k = 0; k < nt; k++) {
		const char *pname;
		pt_tensor *p;
		PT_CHECK_OK(pt_model_tensor(fc.m, k, &pname, &p, NULL));
		check_tensor(&fc, pname, p, grads[k]);
	}
	for (int k = 0; k < nt; k++)
		free(grads[k]);
	free(grads);
	free(dxh);
	fd_teardown(&fc);
}

static const pt_act_shape seq_features = {PT_F32, T, C};
static const pt_act_shape flat_features = {PT_F32, 0, C};
static const pt_act_shape seq_tokens = {PT_I64, T, 0};

/* ---- one test per layer kind ---- */

static void test_layers_fd_linear(void)
{
	pt_layer_spec l = pt_linear(C, 6);
	fd_run("linear", &l, 1, seq_features, false, false, FD_STD);
}

/* 64 inputs: the input (960) and weight (512) are checked on the seeded
 * subset. */
static void test_layers_fd_linear_wide(void)
{
	pt_layer_spec l = pt_linear(64, C);
	fd_run("linear_wide", &l, 1, (pt_act_shape){PT_F32, T, 64}, false, false, FD_WIDE);
}

static void test_layers_fd_linear_no_bias(void)
{
	pt_layer_spec l = pt_linear(C, 6);
	l.bias = false;
	fd_run("linear_no_bias", &l, 1, flat_features, false, false, FD_STD);
}

static void test_layers_fd_relu(void)
{
	pt_layer_spec l = pt_activation(PT_LAYER_RELU);
	fd_run("relu", &l, 1, seq_features, false, true, FD_ELEMENTWISE);
}

static void test_layers_fd_gelu(void)
{
	pt_layer_spec l = pt_activation(PT_LAYER_GELU);
	fd_run("gelu", &l, 1, seq_features, false, false, FD_ELEMENTWISE);
}

static void test_layers_fd_tanh(void)
{
	pt_layer_spec l = pt_activation(PT_LAYER_TANH);
	fd_run("tanh", &l, 1, seq_features, false, false, FD_ELEMENTWISE);
}

static void test_layers_fd_sigmoid(void)
{
	pt_layer_spec l = pt_activation(PT_LAYER_SIGMOID);
	fd_run("sigmoid", &l, 1, seq_features, false, false, FD_ELEMENTWISE);
}

/* Dropout in training: the mask depends only on (seed, step, microbatch,
 * layer), so every forward of the difference sees the same mask. */
static void test_layers_fd_dropout(void)
{
	pt_layer_spec l = pt_dropout(0.3f);
	pt_model *m;
	pt_model_config cfg = {.batch = B, .input = seq_features, .n_slots = 1, .seed = 42};
	pt_tensor x;
	const pt_tensor *y;
	float xs[B * T * C];
	int zeros = 0, kept = 0;

	fd_run("dropout", &l, 1, seq_features, true, false, FD_ELEMENTWISE);

	/* The mask is active (about 30% dropped, survivors scaled by 1 / 0.7),
	 * and off outside training. */
	for (int i = 0; i < B * T * C; i++)
		xs[i] = 1.0f;
	PT_CHECK_OK(pt_model_create(&m, &l, 1, 0, 1, &cfg));
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 3, (int64_t[]){B, T, C}));
	PT_CHECK_OK(pt_tensor_write(&x, xs, sizeof(xs)));
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, 3, 1));
	float *h = host_copy(y);
	for (int i = 0; i < B * T * C; i++) {
		zeros += h[i] == 0.0f;
		kept += fabsf(h[i] - 1.0f / 0.7f) < 1e-6f;
	}
	CU_ASSERT_EQUAL(zeros + kept, B * T * C);
	CU_ASSERT_TRUE(zeros > 15 && zeros < 60);
	/* another step or microbatch draws another mask */
	for (int k = 0; k < 2; k++) {
		int same = 0;
		PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, k ? 3 : 4, k ? 2 : 1));
		float *h2 = host_copy(y);
		for (int i = 0; i < B * T * C; i++)
			same += h2[i] == h[i];
		CU_ASSERT_TRUE(same < B * T * C);
		free(h2);
	}
	free(h);
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, false, 3, 1));
	h = host_copy(y);
	for (int i = 0; i < B * T * C; i++)
		CU_ASSERT_EQUAL(h[i], 1.0f);
	free(h);
	pt_tensor_fini(&x);
	pt_model_destroy(m);
}

static void test_layers_fd_layernorm(void)
{
	pt_layer_spec l = pt_layernorm(C);
	fd_run("layernorm", &l, 1, seq_features, false, false, FD_WIDE);
}

static void test_layers_fd_embedding(void)
{
	pt_layer_spec l = pt_embedding(V, C, 7); /* wte and wpe */
	fd_run("embedding", &l, 1, seq_tokens, false, false, FD_ELEMENTWISE);
}

static void test_layers_fd_embedding_no_positions(void)
{
	pt_layer_spec l = pt_embedding(V, C, 0);
	fd_run("embedding_no_wpe", &l, 1, seq_tokens, false, false, FD_ELEMENTWISE);
}

static void test_layers_fd_attention(void)
{
	pt_layer_spec l = pt_attention(C, NH);
	fd_run("attention", &l, 1, seq_features, false, false, FD_WIDE);
}

static void test_layers_fd_block(void)
{
	pt_layer_spec l = pt_block(C, NH);
	fd_run("transformer_block", &l, 1, seq_features, false, false, FD_DEEP);
}

static void test_layers_fd_softmax(void)
{
	pt_layer_spec l = pt_activation(PT_LAYER_SOFTMAX);
	fd_run("softmax", &l, 1, seq_features, false, false, FD_STD);
}

/* A chain passes gradients between layers through the model's two buffers. */
static void test_layers_fd_chain(void)
{
	pt_layer_spec l[] = {pt_linear(C, 16), pt_activation(PT_LAYER_TANH), pt_linear(16, C),
	                     pt_layernorm(C), pt_activation(PT_LAYER_SIGMOID)};
	fd_run("chain", l, 5, seq_features, false, false, FD_DEEP);
}

/* ---- losses ---- */

/* d(mean loss)/d(pred) from compute_gradient (scale 1) against central
 * differences of compute_loss, every element, same tolerance as above. */
static void loss_fd(const char *name, pt_loss *loss, pt_tensor *pred, const pt_tensor *target,
                    int64_t skip_row, int64_t row_len)
{
	fd_case fc = {.name = name, .tol = FD_STD};
	pt_tensor d;
	int64_t n = pt_tensor_numel(pred);
	double lp, lm;

	PT_CHECK_OK(pt_tensor_init(&d, PT_F32, pred->ndim, pred->shape));
	PT_CHECK_OK(pt_loss_compute_gradient(loss, pred, target, 1.0f, &d));
	float *a = host_copy(&d);
	PT_CHECK_OK(pt_tensor_sync(pred));
	float *p = pt_tensor_f32(pred);
	for (int64_t i = 0; i < n; i++) {
		float v = p[i], vp = (float)(v + FD_H), vm = (float)(v - FD_H);
		p[i] = vp;
		PT_CHECK_OK(pt_loss_compute_loss(loss, pred, target, &lp, NULL));
		p[i] = vm;
		PT_CHECK_OK(pt_loss_compute_loss(loss, pred, target, &lm, NULL));
		p[i] = v;
		double num = (lp - lm) / ((double)vp - (double)vm);
		record(&fc, "pred", i, a[i], num);
		if (skip_row >= 0 && i / row_len == skip_row) {
			/* an ignored row has no gradient at all */
			CU_ASSERT_EQUAL(a[i], 0.0f);
			CU_ASSERT_EQUAL(num, 0.0);
		}
	}
	fprintf(stderr, "  fd %-22s %5ld elements, max rel err %.2e (tol %.0e, floor %.0e)\n", name,
	        (long)fc.checked, fc.max_rel, fc.tol.tol, fc.tol.floor);
	CU_ASSERT_EQUAL(fc.failed, 0);
	free(a);
	pt_tensor_fini(&d);
}

/* The mean cross-entropy over the counted rows, in double, for comparison. */
static double xent_ref(const float *x, const int64_t *tg, int64_t rows, int64_t nv, int64_t ign,
                       int64_t *count)
{
	double sum = 0.0;
	*count = 0;
	for (int64_t r = 0; r < rows; r++) {
		if (tg[r] == ign)
			continue;
		double mx = -INFINITY, s = 0.0;
		for (int64_t j = 0; j < nv; j++)
			mx = fmax(mx, x[r * nv + j]);
		for (int64_t j = 0; j < nv; j++)
			s += exp(x[r * nv + j] - mx);
		sum += log(s) + mx - x[r * nv + tg[r]];
		(*count)++;
	}
	return sum / (double)*count;
}

static void xent_case(const char *name, int ndim, const int64_t *shape, int64_t ignored_row)
{
	enum { IGN = -100 };
	pt_loss *loss;
	pt_tensor logits, targets;
	pt_rng r;
	int64_t nv = shape[ndim - 1], rows = 1, count = 0, want_count;
	double value;

	for (int i = 0; i + 1 < ndim; i++)
		rows *= shape[i];
	PT_CHECK_OK(pt_loss_create(&loss, PT_LOSS_CROSS_ENTROPY, ndim, shape, IGN));
	PT_CHECK_OK(pt_tensor_init(&logits, PT_F32, ndim, shape));
	PT_CHECK_OK(pt_tensor_init(&targets, PT_I64, ndim - 1, shape));
	float *x = malloc(sizeof(float) * (size_t)(rows * nv));
	int64_t *tg = malloc(sizeof(int64_t) * (size_t)rows);
	pt_rng_init(&r, 5, (uint64_t)rows);
	pt_rng_uniform(&r, x, rows * nv, -2.0f, 2.0f);
	for (int64_t i = 0; i < rows; i++)
		tg[i] = (int64_t)(pt_rng_u32(&r) % (uint32_t)nv);
	tg[ignored_row] = IGN;
	tg[rows - 1] = nv - 1; /* the last class is a target */
	PT_CHECK_OK(pt_tensor_write(&logits, x, sizeof(float) * (size_t)(rows * nv)));
	PT_CHECK_OK(pt_tensor_write(&targets, tg, sizeof(int64_t) * (size_t)rows));

	PT_CHECK_OK(pt_loss_compute_loss(loss, &logits, &targets, &value, &count));
	double want = xent_ref(x, tg, rows, nv, IGN, &want_count);
	CU_ASSERT_EQUAL(count, rows - 1);
	CU_ASSERT_EQUAL(count, want_count);
	CU_ASSERT_TRUE(fabs(value - want) <= 1e-5 * fabs(want));

	loss_fd(name, loss, &logits, &targets, ignored_row, nv);
	free(x);
	free(tg);
	pt_tensor_fini(&logits);
	pt_tensor_fini(&targets);
	pt_loss_destroy(loss);
}

static void test_layers_fd_cross_entropy(void)
{
	xent_case("cross_entropy (N,V)", 2, (int64_t[]){6, 7}, 2);
}

static void test_layers_fd_cross_entropy_3d(void)
{
	xent_case("cross_entropy (B,T,V)", 3, (int64_t[]){2, 3, 5}, 4);
}

static void test_layers_fd_mse(void)
{
	pt_loss *loss;
	pt_tensor pred, target;
	pt_rng r;
	float p[15], t[15];
	double value, want = 0.0;
	int64_t count = 0;

	PT_CHECK_OK(pt_loss_create(&loss, PT_LOSS_MSE, 2, (int64_t[]){3, 5}, -1));
	PT_CHECK_OK(pt_tensor_init(&pred, PT_F32, 2, (int64_t[]){3, 5}));
	PT_CHECK_OK(pt_tensor_init(&target, PT_F32, 2, (int64_t[]){3, 5}));
	pt_rng_init(&r, 6, 0);
	pt_rng_uniform(&r, p, 15, -1.0f, 1.0f);
	pt_rng_uniform(&r, t, 15, -1.0f, 1.0f);
	PT_CHECK_OK(pt_tensor_write(&pred, p, sizeof(p)));
	PT_CHECK_OK(pt_tensor_write(&target, t, sizeof(t)));
	for (int i = 0; i < 15; i++)
		want += ((double)p[i] - t[i]) * ((double)p[i] - t[i]) / 15.0;
	PT_CHECK_OK(pt_loss_compute_loss(loss, &pred, &target, &value, &count));
	CU_ASSERT_EQUAL(count, 15);
	CU_ASSERT_TRUE(fabs(value - want) <= 1e-6 * want);
	loss_fd("mse", loss, &pred, &target, -1, 5);
	pt_tensor_fini(&pred);
	pt_tensor_fini(&target);
	pt_loss_destroy(loss);
}

/* Edge cases: every row ignored gives a zero loss and gradient (no 0/0), a
 * target outside [0, V) is a range error, and mismatched shapes are refused. */
static void test_layers_loss_edge_cases(void)
{
	pt_loss *loss, *mse;
	pt_tensor logits, targets, few, d, pred, wrong;
	const int64_t all_ignored[3] = {-100, -100, -100}, bad[3] = {0, 4, 1};
	double value = -1.0;
	int64_t count = -1;

	PT_CHECK_OK(pt_loss_create(&loss, PT_LOSS_CROSS_ENTROPY, 2, (int64_t[]){3, 4}, -100));
	PT_CHECK_OK(pt_tensor_init(&logits, PT_F32, 2, (int64_t[]){3, 4}));
	PT_CHECK_OK(pt_tensor_init(&d, PT_F32, 2, (int64_t[]){3, 4}));
	PT_CHECK_OK(pt_tensor_init(&targets, PT_I64, 1, (int64_t[]){3}));
	PT_CHECK_OK(pt_tensor_init(&few, PT_I64, 1, (int64_t[]){2}));
	PT_CHECK_OK(pt_fill(&logits, 0.5));
	PT_CHECK_OK(pt_fill(&d, 9.0));
	PT_CHECK_OK(pt_tensor_write(&targets, all_ignored, sizeof(all_ignored)));
	PT_CHECK_OK(pt_loss_compute_loss(loss, &logits, &targets, &value, &count));
	CU_ASSERT_EQUAL(value, 0.0);
	CU_ASSERT_EQUAL(count, 0);
	PT_CHECK_OK(pt_loss_compute_gradient(loss, &logits, &targets, 1.0f, &d));
	float *g = host_copy(&d);
	for (int i = 0; i < 12; i++)
		CU_ASSERT_EQUAL(g[i], 0.0f);
	free(g);

	PT_CHECK_OK(pt_tensor_write(&targets, bad, sizeof(bad)));
	PT_CHECK_ERR(pt_loss_compute_loss(loss, &logits, &targets, &value, NULL), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_loss_compute_gradient(loss, &logits, &targets, 1.0f, &d), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_loss_compute_loss(loss, &logits, &few, &value, NULL), PT_ERR_SHAPE);

	PT_CHECK_OK(pt_loss_create(&mse, PT_LOSS_MSE, 2, (int64_t[]){3, 4}, 0));
	PT_CHECK_OK(pt_tensor_init(&pred, PT_F32, 2, (int64_t[]){3, 4}));
	PT_CHECK_OK(pt_tensor_init(&wrong, PT_F32, 2, (int64_t[]){4, 3}));
	PT_CHECK_ERR(pt_loss_compute_loss(mse, &pred, &wrong, &value, NULL), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "mse_forward"));
	PT_CHECK_ERR(pt_loss_compute_gradient(mse, &pred, &wrong, 1.0f, &d), PT_ERR_SHAPE);

	pt_tensor_fini(&logits);
	pt_tensor_fini(&targets);
	pt_tensor_fini(&few);
	pt_tensor_fini(&d);
	pt_tensor_fini(&pred);
	pt_tensor_fini(&wrong);
	pt_loss_destroy(loss);
	pt_loss_destroy(mse);
	pt_loss_destroy(NULL);
}

/* pt_loss_compute_both with dpred the predictions themselves (as the
 * coordinator does with a writable output) gives bitwise the loss, count and
 * gradient it gives into a separate buffer: cross-entropy over (2, 3, 7)
 * with an ignored position (the target is read before the softmax
 * overwrites the logits), and MSE. */
static void test_layers_loss_gradient_in_place(void)
{
	enum { N = 2 * 3 * 7 };
	const int64_t tg[6] = {6, 0, -100, 3, 3, 1};
	float v[N], t[N];
	for (int k = 0; k < 2; k++) {
		bool ce = k == 0;
		int64_t shape[3] = {2, 3, 7};
		pt_loss *l;
		pt_tensor pred, own, d, target;
		double loss_a, loss_b;
		int64_t n_a, n_b;
		float *a, *b;

		for (int i = 0; i < N; i++) {
			v[i] = 3.0f * sinf(0.7f * (float)i + 0.3f);
			t[i] = cosf(0.5f * (float)i);
		}
		PT_CHECK_OK(
		    pt_loss_create(&l, ce ? PT_LOSS_CROSS_ENTROPY : PT_LOSS_MSE, 3, shape, -100));
		PT_CHECK_OK(pt_tensor_init(&pred, PT_F32, 3, shape));
		PT_CHECK_OK(pt_tensor_init(&own, PT_F32, 3, shape));
		PT_CHECK_OK(pt_tensor_init(&d, PT_F32, 3, shape));
		if (ce) {
			PT_CHECK_OK(pt_tensor_init(&target, PT_I64, 2, shape));
			PT_CHECK_OK(pt_tensor_write(&target, tg, sizeof(tg)));
		} else {
			PT_CHECK_OK(pt_tensor_init(&target, PT_F32, 3, shape));
			PT_CHECK_OK(pt_tensor_write(&target, t, sizeof(t)));
		}
		PT_CHECK_OK(pt_tensor_write(&pred, v, sizeof(v)));
		PT_CHECK_OK(pt_tensor_write(&own, v, sizeof(v)));
		PT_CHECK_OK(pt_loss_compute_both(l, &pred, &target, 0.5f, &loss_a, &n_a, &d));
		PT_CHECK_OK(pt_loss_compute_both(l, &own, &target, 0.5f, &loss_b, &n_b, &own));
		CU_ASSERT_EQUAL(loss_a, loss_b);
		CU_ASSERT_EQUAL(n_a, n_b);
		CU_ASSERT_EQUAL(n_a, ce ? 5 : N);
		CU_ASSERT(loss_a > 0.1);
		a = host_copy(&d);
		b = host_copy(&own);
		CU_ASSERT_EQUAL(memcmp(a, b, sizeof(v)), 0);
		CU_ASSERT_NOT_EQUAL(memcmp(a, v, sizeof(v)), 0);
		free(a);
		free(b);
		pt_tensor_fini(&pred);
		pt_tensor_fini(&own);
		pt_tensor_fini(&d);
		pt_tensor_fini(&target);
		pt_loss_destroy(l);
	}
}

/* ---- accumulation ---- */

/* After two identical microbatches every gradient is twice that of one:
 * |g2 - 2 g1| <= 1e-6 * max |2 g1| over the same parameter tensor (normwise
 * relative). The second backward adds the same terms to a non-zero buffer
 * and so rounds differently from 2 g1; entries that are small by cancellation
 * (wpe sums B rows of opposite sign) show that rounding as a large elementwise
 * relative error, e.g. 1.2e-6 at -1.5e-3, so the scale is the tensor's. */
#define ACC_TOL 1e-6

static void check_doubled(pt_model *m, const float *g1, const float *g2, const char *what)
{
	pt_tensor *all = pt_model_grads(m);
	int bad = 0;
	for (int k = 0; k < pt_model_num_tensors(m); k++) {
		const char *name;
		pt_tensor *g;
		double gmax = 0.0;
		PT_CHECK_OK(pt_model_tensor(m, k, &name, NULL, &g));
		int64_t off = g->offset - all->offset, n = pt_tensor_numel(g);
		for (int64_t i = off; i < off + n; i++)
			gmax = fmax(gmax, 2.0 * fabs(g1[i]));
		if (gmax == 0.0) {
			fprintf(stderr, "  %s: %s has no gradient\n", what, name);
			bad++;
		}
		for (int64_t i = off; i < off + n; i++) {
			double want = 2.0 * (double)g1[i];
			if (fabs((double)g2[i] - want) > ACC_TOL * gmax && bad++ < 5)
				fprintf(stderr, "  %s %s[%ld]: %.9g after two, %.9g after one\n",
				        what, name, (long)(i - off), g2[i], g1[i]);
		}
	}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_layers_grad_accumulates(void)
{
	/* A small GPT: every parameterised kind in one model. */
	pt_layer_spec l[] = {pt_embedding(V, C, T), pt_block(C, NH), pt_layernorm(C),
	                     pt_attention(C, NH), pt_linear(C, V)};
	pt_model_config cfg = {.batch = B, .input = seq_tokens, .n_slots = 2, .seed = 7};
	pt_model *m;
	pt_tensor x, dy;
	const pt_tensor *y;
	int64_t tok[B * T];
	pt_rng r;

	PT_CHECK_OK(pt_model_create(&m, l, 5, 0, 5, &cfg));
	int64_t n = pt_tensor_numel(pt_model_grads(m));
	pt_rng_init(&r, 8, 0);
	for (int i = 0; i < B * T; i++)
		tok[i] = (int64_t)(pt_rng_u32(&r) % V);
	PT_CHECK_OK(pt_tensor_init(&x, PT_I64, 2, (int64_t[]){B, T}));
	PT_CHECK_OK(pt_tensor_write(&x, tok, sizeof(tok)));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 3, (int64_t[]){B, T, V}));
	float *R = malloc(sizeof(float) * B * T * V);
	pt_rng_uniform(&r, R, B * T * V, -1.0f, 1.0f);
	PT_CHECK_OK(pt_tensor_write(&dy, R, sizeof(float) * B * T * V));

	/* one microbatch */
	PT_CHECK_OK(pt_model_zero_grad(m));
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, 1, 0));
	PT_CHECK_OK(pt_model_backward(m, 0, &dy, NULL));
	float *g1 = host_copy(pt_model_grads(m));

	/* two identical microbatches, one after the other in slot 0 */
	PT_CHECK_OK(pt_model_zero_grad(m));
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, 1, 0));
		PT_CHECK_OK(pt_model_backward(m, 0, &dy, NULL));
	}
	float *g2 = host_copy(pt_model_grads(m));
	check_doubled(m, g1, g2, "sequential");
	free(g2);

	/* both in flight at once (slots 0 and 1), backward in reverse order */
	PT_CHECK_OK(pt_model_zero_grad(m));
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, 1, 0));
	PT_CHECK_OK(pt_model_forward(m, 1, &x, &y, true, 1, 0));
	PT_CHECK_OK(pt_model_backward(m, 1, &dy, NULL));
	PT_CHECK_OK(pt_model_backward(m, 0, &dy, NULL));
	g2 = host_copy(pt_model_grads(m));
	check_doubled(m, g1, g2, "two slots");
	free(g2);

	/* zero_grad really zeroes */
	PT_CHECK_OK(pt_model_zero_grad(m));
	g2 = host_copy(pt_model_grads(m));
	int nonzero = 0;
	for (int64_t i = 0; i < n; i++)
		nonzero += g2[i] != 0.0f;
	CU_ASSERT_EQUAL(nonzero, 0);
	free(g2);
	free(g1);
	free(R);
	pt_tensor_fini(&x);
	pt_tensor_fini(&dy);
	pt_model_destroy(m);
}

/* The input gradient is overwritten, not accumulated, by each backward. */
static void test_layers_input_grad_overwrites(void)
{
	pt_layer_spec l[] = {pt_linear(C, C), pt_activation(PT_LAYER_GELU), pt_layernorm(C)};
	pt_model_config cfg = {.batch = B, .input = seq_features, .n_slots = 1, .seed = 7};
	pt_model *m;
	pt_tensor x, dy;
	const pt_tensor *y, *dx;
	float xs[B * T * C];
	pt_rng r;

	PT_CHECK_OK(pt_model_create(&m, l, 3, 0, 3, &cfg));
	pt_rng_init(&r, 9, 0);
	pt_rng_uniform(&r, xs, B * T * C, -1.0f, 1.0f);
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 3, (int64_t[]){B, T, C}));
	PT_CHECK_OK(pt_tensor_write(&x, xs, sizeof(xs)));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 3, (int64_t[]){B, T, C}));
	pt_rng_uniform(&r, xs, B * T * C, -1.0f, 1.0f);
	PT_CHECK_OK(pt_tensor_write(&dy, xs, sizeof(xs)));
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, false, 0, 0));
	PT_CHECK_OK(pt_model_backward(m, 0, &dy, &dx));
	float *d1 = host_copy(dx);
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, false, 0, 0));
	PT_CHECK_OK(pt_model_backward(m, 0, &dy, &dx));
	float *d2 = host_copy(dx);
	CU_ASSERT_EQUAL(memcmp(d1, d2, sizeof(xs)), 0);
	free(d1);
	free(d2);
	pt_tensor_fini(&x);
	pt_tensor_fini(&dy);
	pt_model_destroy(m);
}

/* ---- shape errors ---- */

static void test_layers_model_check_names_layer(void)
{
	pt_layer_spec bad[] = {pt_linear(64, 256), pt_linear(128, 10)};
	pt_act_shape in = {PT_F32, 0, 64};
	pt_model_config cfg = {.batch = 2, .input = in, .n_slots = 1, .seed = 1};
	pt_model *m = (pt_model *)bad;

	PT_CHECK_ERR(pt_model_check(bad, 2, in), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "layer 1"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "linear"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "128"));
	PT_CHECK_ERR(pt_model_create(&m, bad, 2, 0, 2, &cfg), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NULL(m);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "layer 1"));

	bad[1] = pt_linear(256, 10);
	PT_CHECK_OK(pt_model_check(bad, 2, in));

	/* other mismatches name their layer and kind too */
	pt_layer_spec heads[] = {pt_layernorm(C), pt_attention(C, 3)};
	PT_CHECK_ERR(pt_model_check(heads, 2, seq_features), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "layer 1 (attention)"));
	pt_layer_spec emb[] = {pt_embedding(V, C, T)};
	PT_CHECK_ERR(pt_model_check(emb, 1, seq_features), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "layer 0 (embedding)"));
	pt_layer_spec shortpos[] = {pt_embedding(V, C, T - 1)};
	PT_CHECK_ERR(pt_model_check(shortpos, 1, seq_tokens), PT_ERR_SHAPE);
	pt_layer_spec ln[] = {pt_linear(C, 4), pt_layernorm(C)};
	PT_CHECK_ERR(pt_model_check(ln, 2, seq_features), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "layer 1 (layernorm)"));
	pt_layer_spec drop[] = {pt_dropout(1.0f)};
	PT_CHECK_ERR(pt_model_check(drop, 1, seq_features), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_model_check(drop, 0, seq_features), PT_ERR_INVALID);
}

static void test_layers_model_runtime_errors(void)
{
	pt_layer_spec l = pt_linear(C, 4);
	pt_model_config cfg = {.batch = B, .input = seq_features, .n_slots = 1, .seed = 1};
	pt_model *m;
	pt_tensor x, wrong, dy;
	const pt_tensor *y;

	PT_CHECK_OK(pt_model_create(&m, &l, 1, 0, 1, &cfg));
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 3, (int64_t[]){B, T, C}));
	PT_CHECK_OK(pt_tensor_init(&wrong, PT_F32, 3, (int64_t[]){B, T, C + 1}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 3, (int64_t[]){B, T, 5}));
	PT_CHECK_ERR(pt_model_backward(m, 0, &dy, NULL), PT_ERR_STATE); /* no forward yet */
	PT_CHECK_ERR(pt_model_forward(m, 0, &wrong, &y, false, 0, 0), PT_ERR_SHAPE);
	PT_CHECK_ERR(pt_model_forward(m, 1, &x, &y, false, 0, 0), PT_ERR_RANGE);
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, false, 0, 0));
	PT_CHECK_ERR(pt_model_backward(m, 0, &dy, NULL), PT_ERR_SHAPE); /* 5 != 4 outputs */
	pt_tensor_fini(&x);
	pt_tensor_fini(&wrong);
	pt_tensor_fini(&dy);
	pt_model_destroy(m);
	pt_model_destroy(NULL);
}

/* A mis-shaped op fails in meta, before any kernel: the output is untouched,
 * an armed kernel failure does not fire, and deferred mode queues nothing. */
static void test_layers_op_shape_error_before_kernel(void)
{
	pt_tensor out, x, w, wbad, b, bbad, dw;
	pt_dispatcher *d = pt_dispatcher_current();
	float sentinel[4 * 10];

	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	PT_CHECK_OK(pt_tensor_init(&out, PT_F32, 2, (int64_t[]){4, 10}));
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){4, 64}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){10, 64}));
	PT_CHECK_OK(pt_tensor_init(&wbad, PT_F32, 2, (int64_t[]){10, 32}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_F32, 1, (int64_t[]){10}));
	PT_CHECK_OK(pt_tensor_init(&bbad, PT_F32, 1, (int64_t[]){9}));
	PT_CHECK_OK(pt_tensor_init(&dw, PT_F32, 2, (int64_t[]){10, 32}));
	for (int i = 0; i < 40; i++)
		sentinel[i] = 123.0f;
	PT_CHECK_OK(pt_tensor_write(&out, sentinel, sizeof(sentinel)));

	pt_dispatcher_inject_failure(d, PT_OP_LINEAR_FWD, true);
	pt_dispatch_stats before = pt_dispatcher_stats(d);
	pt_clear_error();
	PT_CHECK_ERR(pt_linear_forward(&out, &x, &wbad, &b), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "linear_forward"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "weight"));
	PT_CHECK_ERR(pt_linear_forward(&out, &x, &w, &bbad), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "linear_forward"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "bias"));
	CU_ASSERT_EQUAL(pt_dispatcher_stats(d).dispatched, before.dispatched);
	/* the armed failure proves a well-shaped call does reach the kernel */
	PT_CHECK_ERR(pt_linear_forward(&out, &x, &w, &b), PT_ERR_BACKEND);
	pt_dispatcher_inject_failure(d, PT_OP_LINEAR_FWD, false);
	float *h = host_copy(&out);
	CU_ASSERT_EQUAL(memcmp(h, sentinel, sizeof(sentinel)), 0);
	free(h);

	/* deferred: the error comes at the call, nothing is queued */
	pt_deferred_begin(d);
	PT_CHECK_ERR(pt_linear_forward(&out, &x, &wbad, NULL), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "linear_forward"));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_state(&out), PT_READY);
	PT_CHECK_OK(pt_deferred_end(d));

	/* backward: a gradient buffer of the wrong shape */
	PT_CHECK_ERR(pt_linear_backward(NULL, &dw, &b, &out, &x, &w, false), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "linear_backward"));
	/* a correct call then works */
	PT_CHECK_OK(pt_linear_forward(&out, &x, &w, &b));

	pt_tensor_fini(&out);
	pt_tensor_fini(&x);
	pt_tensor_fini(&w);
	pt_tensor_fini(&wbad);
	pt_tensor_fini(&b);
	pt_tensor_fini(&bbad);
	pt_tensor_fini(&dw);
}

static const pt_test_case fd_tests[] = {
    {"test_layers_fd_linear", test_layers_fd_linear},
    {"test_layers_fd_linear_wide", test_layers_fd_linear_wide},
    {"test_layers_fd_linear_no_bias", test_layers_fd_linear_no_bias},
    {"test_layers_fd_relu", test_layers_fd_relu},
    {"test_layers_fd_gelu", test_layers_fd_gelu},
    {"test_layers_fd_tanh", test_layers_fd_tanh},
    {"test_layers_fd_sigmoid", test_layers_fd_sigmoid},
    {"test_layers_fd_dropout", test_layers_fd_dropout},
    {"test_layers_fd_layernorm", test_layers_fd_layernorm},
    {"test_layers_fd_embedding", test_layers_fd_embedding},
    {"test_layers_fd_embedding_no_positions", test_layers_fd_embedding_no_positions},
    {"test_layers_fd_attention", test_layers_fd_attention},
    {"test_layers_fd_block", test_layers_fd_block},
    {"test_layers_fd_softmax", test_layers_fd_softmax},
    {"test_layers_fd_chain", test_layers_fd_chain},
    {NULL, NULL},
};
static const pt_test_case loss_tests[] = {
    {"test_layers_fd_cross_entropy", test_layers_fd_cross_entropy},
    {"test_layers_fd_cross_entropy_3d", test_layers_fd_cross_entropy_3d},
    {"test_layers_fd_mse", test_layers_fd_mse},
    {"test_layers_loss_edge_cases", test_layers_loss_edge_cases},
    {"test_layers_loss_gradient_in_place", test_layers_loss_gradient_in_place},
    {NULL, NULL},
};
static const pt_test_case accum_tests[] = {
    {"test_layers_grad_accumulates", test_layers_grad_accumulates},
    {"test_layers_input_grad_overwrites", test_layers_input_grad_overwrites},
    {NULL, NULL},
};
static const pt_test_case shape_tests[] = {
    {"test_layers_model_check_names_layer", test_layers_model_check_names_layer},
    {"test_layers_model_runtime_errors", test_layers_model_runtime_errors},
    {"test_layers_op_shape_error_before_kernel", test_layers_op_shape_error_before_kernel},
    {NULL, NULL},
};

int main(void)
{
	static const pt_test_suite suites[] = {
	    {"test_layers_fd", fd_tests},
	    {"test_layers_loss", loss_tests},
	    {"test_layers_accumulate", accum_tests},
	    {"test_layers_shape", shape_tests},
	    {NULL, NULL},
	};
	return pt_test_main(suites);
}
