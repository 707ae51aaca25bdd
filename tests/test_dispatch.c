/* test_dispatch.c - the dispatcher's eager and deferred modes (seed 004):
 * queueing, every sync boundary, failure handling, meta-time shape errors,
 * and bitwise equality of eager and deferred training steps. */
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_math.h"
#include "ops.h"
#include "runtime.h"
#include "pt_test.h"
#include "safetensors.h"
#include "train.h"

static void vec(pt_tensor *t, int64_t n, float start)
{
	PT_CHECK_OK(pt_tensor_init(t, PT_F32, 1, (int64_t[]){n}));
	for (int64_t i = 0; i < n; i++)
		pt_tensor_f32(t)[i] = start + (float)i;
}

static void test_dispatch_eager_runs_at_once(void)
{
	pt_tensor a, b, c;
	pt_dispatcher *d = pt_dispatcher_current();
	vec(&a, 4, 1.0f);
	vec(&b, 4, 10.0f);
	vec(&c, 4, 0.0f);
	CU_ASSERT_EQUAL(pt_dispatcher_mode(d), PT_EAGER);
	PT_CHECK_OK(pt_add(&c, &a, &b, 1.0f, 2.0f));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_state(&c), PT_READY);
	CU_ASSERT_EQUAL(pt_tensor_f32(&c)[3], 4.0f + 2.0f * 13.0f);
	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
	pt_tensor_fini(&c);
}

static void test_dispatch_deferred_queues_until_flush(void)
{
	pt_tensor a, c;
	pt_dispatcher *d = pt_dispatcher_current();
	vec(&a, 4, 1.0f);
	vec(&c, 4, 0.0f);
	pt_deferred_begin(d);
	CU_ASSERT_EQUAL(pt_dispatcher_mode(d), PT_DEFERRED);
	PT_CHECK_OK(pt_scale(&c, &a, 3.0f));
	PT_CHECK_OK(pt_scale(&c, &c, 2.0f));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 2);
	CU_ASSERT_EQUAL(pt_tensor_state(&c), PT_PENDING);
	/* The kernel has not run: raw memory still holds the old values. */
	CU_ASSERT_EQUAL(pt_tensor_f32(&c)[2], 2.0f);
	PT_CHECK_OK(pt_deferred_end(d)); /* leaving the scope flushes */
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_state(&c), PT_READY);
	CU_ASSERT_EQUAL(pt_tensor_f32(&c)[2], 18.0f);
	pt_tensor_fini(&a);
	pt_tensor_fini(&c);
}

static void test_dispatch_nested_scopes_flush_at_outermost(void)
{
	pt_tensor a;
	pt_dispatcher *d = pt_dispatcher_current();
	vec(&a, 4, 1.0f);
	pt_deferred_begin(d);
	pt_deferred_begin(d);
	PT_CHECK_OK(pt_scale(&a, &a, 2.0f));
	PT_CHECK_OK(pt_deferred_end(d));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 1);
	PT_CHECK_OK(pt_deferred_end(d));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_f32(&a)[0], 2.0f);
	PT_CHECK_ERR(pt_deferred_end(d), PT_ERR_STATE);
	pt_tensor_fini(&a);
}

/* Queues one op writing c = 5 * a and returns with it pending. */
static void queue_one(pt_dispatcher *d, pt_tensor *a, pt_tensor *c)
{
	vec(a, 8, 1.0f);
	vec(c, 8, 0.0f);
	pt_deferred_begin(d);
	PT_CHECK_OK(pt_scale(c, a, 5.0f));
	CU_ASSERT_EQUAL(pt_tensor_state(c), PT_PENDING);
}

static void finish_one(pt_dispatcher *d, pt_tensor *a, pt_tensor *c)
{
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_state(c), PT_READY);
	CU_ASSERT_EQUAL(pt_tensor_f32(c)[7], 40.0f);
	PT_CHECK_OK(pt_deferred_end(d));
	pt_tensor_fini(a);
	pt_tensor_fini(c);
}

static void test_dispatch_sync_boundaries_flush(void)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor a, c, other;
	float host[8];
	double v;
	bool eq;
	char dir[] = "/tmp/pt-dispatch-XXXXXX", path[256];

	/* Reading values to the host. */
	queue_one(d, &a, &c);
	PT_CHECK_OK(pt_tensor_read(&c, host, sizeof(host)));
	CU_ASSERT_EQUAL(host[1], 10.0f);
	finish_one(d, &a, &c);
	/* item(). */
	queue_one(d, &a, &c);
	PT_CHECK_OK(pt_tensor_item(&c, 7, &v));
	CU_ASSERT_EQUAL(v, 40.0);
	finish_one(d, &a, &c);
	/* Printing. */
	queue_one(d, &a, &c);
	FILE *null = fopen("/dev/null", "w");
	PT_CHECK_OK(pt_tensor_print(&c, null));
	fclose(null);
	finish_one(d, &a, &c);
	/* Comparisons. */
	queue_one(d, &a, &c);
	vec(&other, 8, 0.0f);
	PT_CHECK_OK(pt_tensor_equal(&c, &other, &eq));
	CU_ASSERT_FALSE(eq);
	pt_tensor_fini(&other);
	finish_one(d, &a, &c);
	/* Explicit flush. */
	queue_one(d, &a, &c);
	PT_CHECK_OK(pt_dispatcher_flush(d));
	finish_one(d, &a, &c);
	/* A checkpoint save reads the tensor: it must see computed values. */
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/ck.safetensors", dir);
	queue_one(d, &a, &c);
	pt_st_tensor entry = {.name = "c", .tensor = &c};
	PT_CHECK_OK(pt_safetensors_write(path, &entry, 1, NULL, 0));
	finish_one(d, &a, &c);
	{
		pt_safetensors *st;
		pt_tensor back = {0};
		PT_CHECK_OK(pt_safetensors_open(&st, path));
		PT_CHECK_OK(pt_safetensors_get(st, "c", &back));
		CU_ASSERT_EQUAL(pt_tensor_f32(&back)[7], 40.0f);
		pt_tensor_fini(&back);
		pt_safetensors_destroy(st);
	}
	unlink(path);
	rmdir(dir);
	/* An eager op that reads pending data (leaving deferred mode first). */
	queue_one(d, &a, &c);
	PT_CHECK_OK(pt_deferred_end(d));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	pt_deferred_begin(d);
	finish_one(d, &a, &c);
}

static void test_dispatch_backward_is_a_sync_boundary(void)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_layer_spec layers[] = {pt_linear(4, 3), pt_activation(PT_LAYER_TANH), pt_linear(3, 2)};
	pt_model_config cfg = {.batch = 2, .input = {PT_F32, 0, 4}, .n_slots = 1, .seed = 7};
	pt_model *m;
	pt_tensor x, dy;
	const pt_tensor *y;
	PT_CHECK_OK(pt_model_create(&m, layers, 3, 0, 3, &cfg));
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){2, 4}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){2, 2}));
	PT_CHECK_OK(pt_fill(&dy, 1.0));
	PT_CHECK_OK(pt_fill(&x, 0.5));
	pt_deferred_begin(d);
	PT_CHECK_OK(pt_model_forward(m, 0, &x, &y, true, 0, 0));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 3);
	CU_ASSERT_EQUAL(pt_tensor_state(y), PT_PENDING);
	PT_CHECK_OK(pt_model_backward(m, 0, &dy, NULL));
	/* The forward ran before backward started; backward's own ops are queued. */
	CU_ASSERT_EQUAL(pt_tensor_state(y), PT_READY);
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 3);
	PT_CHECK_OK(pt_deferred_end(d));
	pt_tensor_fini(&x);
	pt_tensor_fini(&dy);
	pt_model_destroy(m);
}

static void test_dispatch_failure_aborts_clears_invalidates(void)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor a, b, c, e;
	float host[8];
	vec(&a, 8, 1.0f);
	vec(&b, 8, 0.0f);
	vec(&c, 8, 0.0f);
	vec(&e, 8, 0.0f);
	pt_dispatcher_inject_failure(d, PT_OP_ACT_FWD, true);
	pt_deferred_begin(d);
	PT_CHECK_OK(pt_fill(&a, 2.0));
	PT_CHECK_OK(pt_activation_forward(&b, &a, PT_ACT_RELU));
	PT_CHECK_OK(pt_scale(&c, &b, 2.0f));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 3);
	PT_CHECK_ERR(pt_dispatcher_flush(d), PT_ERR_BACKEND);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "activation_forward"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "op 2/3"));
	pt_dispatcher_inject_failure(d, PT_OP_ACT_FWD, false);
	/* Queue cleared; every pending output invalid; the third op never ran. */
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_state(&a), PT_INVALID);
	CU_ASSERT_EQUAL(pt_tensor_state(&b), PT_INVALID);
	CU_ASSERT_EQUAL(pt_tensor_state(&c), PT_INVALID);
	CU_ASSERT_EQUAL(pt_tensor_f32(&c)[0], 0.0f);
	/* Using an invalid tensor is a clear error, in either mode. */
	PT_CHECK_ERR(pt_scale(&e, &c, 1.0f), PT_ERR_PENDING_INVALID);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "invalid"));
	PT_CHECK_OK(pt_deferred_end(d));
	PT_CHECK_ERR(pt_tensor_read(&c, host, sizeof(host)), PT_ERR_PENDING_INVALID);
	PT_CHECK_ERR(pt_scale(&e, &b, 1.0f), PT_ERR_PENDING_INVALID);
	/* Writing it again makes it valid. */
	PT_CHECK_OK(pt_fill(&c, 3.0));
	CU_ASSERT_EQUAL(pt_tensor_state(&c), PT_READY);
	PT_CHECK_OK(pt_tensor_read(&c, host, sizeof(host)));
	CU_ASSERT_EQUAL(host[5], 3.0f);
	pt_tensor_fini(&a);
	pt_tensor_fini(&b);
	pt_tensor_fini(&c);
	pt_tensor_fini(&e);
}

static void test_dispatch_eager_failure_reports(void)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor a;
	vec(&a, 4, 1.0f);
	pt_dispatcher_inject_failure(d, PT_OP_SCALE, true);
	PT_CHECK_ERR(pt_scale(&a, &a, 2.0f), PT_ERR_BACKEND);
	pt_dispatcher_inject_failure(d, PT_OP_SCALE, false);
	CU_ASSERT_EQUAL(pt_tensor_f32(&a)[1], 2.0f);
	pt_tensor_fini(&a);
}

static void test_dispatch_shape_errors_at_meta_time(void)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor x, w, y;
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){2, 5}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){3, 4}));
	PT_CHECK_OK(pt_tensor_init(&y, PT_F32, 2, (int64_t[]){2, 3}));
	pt_deferred_begin(d);
	PT_CHECK_ERR(pt_linear_forward(&y, &x, &w, NULL), PT_ERR_SHAPE);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "linear_forward"));
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	CU_ASSERT_EQUAL(pt_tensor_state(&y), PT_READY);
	PT_CHECK_ERR(pt_matmul(&y, &x, &w, false, true, 1.0f, 0.0f), PT_ERR_SHAPE);
	CU_ASSERT_EQUAL(pt_dispatcher_pending(d), 0);
	PT_CHECK_OK(pt_deferred_end(d));
	pt_tensor_fini(&x);
	pt_tensor_fini(&w);
	pt_tensor_fini(&y);
}

static void test_dispatch_queue_keeps_storage_alive(void)
{
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor tmp, out;
	vec(&out, 16, 0.0f);
	pt_deferred_begin(d);
	vec(&tmp, 16, 1.0f);
	PT_CHECK_OK(pt_scale(&out, &tmp, 2.0f));
	pt_tensor_fini(&tmp); /* the queue holds its own reference */
	PT_CHECK_OK(pt_deferred_end(d));
	CU_ASSERT_EQUAL(pt_tensor_f32(&out)[15], 32.0f);
	pt_tensor_fini(&out);
}

/* Two identical models, one trained eagerly, one deferred: bitwise equal. */
static void train_pair(const pt_layer_spec *layers, int n, pt_model_config cfg, int mbs,
                       pt_loss_kind lk, const pt_tensor *x, const pt_tensor *y, int steps)
{
	pt_model *m[2];
	pt_optimizer *o[2];
	pt_trainer *t[2];
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-3f);
	oc.clip_norm = 1.0f;
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_model_create(&m[k], layers, n, 0, n, &cfg));
		PT_CHECK_OK(
		    pt_optimizer_create(&o[k], &oc, pt_model_params(m[k]), pt_model_grads(m[k])));
		PT_CHECK_OK(pt_trainer_create(&t[k], m[k], o[k], lk, -1));
	}
	pt_trainer_set_deferred(t[1], true);
	for (int s = 0; s < steps; s++) {
		pt_step_result r[2];
		for (int k = 0; k < 2; k++)
			PT_CHECK_OK(pt_trainer_step(t[k], x, y, mbs, (uint64_t)s, &r[k]));
		CU_ASSERT_EQUAL(memcmp(&r[0].loss, &r[1].loss, sizeof(double)), 0);
		CU_ASSERT_EQUAL(memcmp(&r[0].grad_norm, &r[1].grad_norm, sizeof(double)), 0);
	}
	CU_ASSERT(pt_dispatcher_stats(pt_dispatcher_current()).flushes > 0);
	size_t nb = pt_tensor_nbytes(pt_model_params(m[0]));
	CU_ASSERT_EQUAL(memcmp(pt_tensor_data(pt_model_params(m[0])),
	                       pt_tensor_data(pt_model_params(m[1])), nb),
	                0);
	for (int k = 0; k < 2; k++) {
		pt_trainer_destroy(t[k]);
		pt_optimizer_destroy(o[k]);
		pt_model_destroy(m[k]);
	}
}

static void test_dispatch_eager_equals_deferred_mlp_step(void)
{
	pt_layer_spec layers[] = {
	    pt_linear(16, 32), pt_activation(PT_LAYER_RELU), pt_dropout(0.1f),
	    pt_linear(32, 32), pt_activation(PT_LAYER_GELU), pt_linear(32, 5)};
	pt_model_config cfg = {.batch = 8, .input = {PT_F32, 0, 16}, .n_slots = 1, .seed = 3};
	pt_tensor x, y;
	pt_rng r;
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){32, 16}));
	PT_CHECK_OK(pt_tensor_init(&y, PT_I64, 1, (int64_t[]){32}));
	pt_rng_init(&r, 11, 0);
	pt_rng_normal(&r, pt_tensor_f32(&x), 32 * 16, 0.0f, 1.0f);
	for (int i = 0; i < 32; i++)
		((int64_t *)pt_tensor_data(&y))[i] = pt_rng_u32(&r) % 5;
	train_pair(layers, 6, cfg, 4, PT_LOSS_CROSS_ENTROPY, &x, &y, 3);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

static void test_dispatch_eager_equals_deferred_gpt_step(void)
{
	pt_layer_spec layers[] = {pt_embedding(32, 16, 8), pt_block(16, 2), pt_block(16, 2),
	                          pt_layernorm(16), pt_linear(16, 32)};
	pt_model_config cfg = {.batch = 2, .input = {PT_I64, 8, 0}, .n_slots = 1, .seed = 5};
	pt_tensor x, y;
	pt_rng r;
	PT_CHECK_OK(pt_tensor_init(&x, PT_I64, 2, (int64_t[]){4, 8}));
	PT_CHECK_OK(pt_tensor_init(&y, PT_I64, 2, (int64_t[]){4, 8}));
	pt_rng_init(&r, 12, 0);
	for (int i = 0; i < 32; i++) {
		((int64_t *)pt_tensor_data(&x))[i] = pt_rng_u32(&r) % 32;
		((int64_t *)pt_tensor_data(&y))[i] = pt_rng_u32(&r) % 32;
	}
	train_pair(layers, 5, cfg, 2, PT_LOSS_CROSS_ENTROPY, &x, &y, 3);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

/* expf_before is pt_expf as it was before NaN was handled, for finite x. */
static float expf_before(float x)
{
	x = x > 88.7f ? 88.7f : x;
	x = x < -87.3f ? -87.3f : x;
	float n = __builtin_rintf(x * 1.44269504088896341f);
	float r = x - n * 0.693145751953125f;
	r = r - n * 1.428606765330187045e-06f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	union {
		int32_t i;
		float f;
	} two_n = {.i = ((int32_t)n + 127) << 23};
	return p * two_n.f;
}

/* pt_expf of NaN (what a run with lr 1e38 feeds softmax) is NaN without
 * undefined behaviour (it shifted INT_MIN + 127 left: UBSan "left shift of
 * negative value"); infinities saturate; finite values are bitwise as before. */
static void test_dispatch_cpu_expf_non_finite(void)
{
	volatile float nan = NAN, inf = INFINITY;
	CU_ASSERT(isnan(pt_expf(nan)));
	CU_ASSERT(isnan(pt_expf(-nan)));
	CU_ASSERT(isnan(pt_sigmoidf(nan)));
	CU_ASSERT(isnan(pt_tanhf(nan)));
	CU_ASSERT_EQUAL(pt_expf(inf), expf_before(88.7f));
	CU_ASSERT_EQUAL(pt_expf(-inf), expf_before(-87.3f));
	CU_ASSERT(pt_expf(-inf) > 0.0f && pt_expf(-inf) < 1e-37f);
	CU_ASSERT_EQUAL(pt_expf(1e38f), pt_expf(inf));
	CU_ASSERT_EQUAL(pt_expf(0.0f), 1.0f);
	for (int i = -20000; i <= 20000; i++) {
		float x = (float)i * 0.00457f;
		float a = pt_expf(x), b = expf_before(x);
		if (memcmp(&a, &b, sizeof(a)) != 0) {
			CU_FAIL("pt_expf changed for a finite input");
			break;
		}
	}
}

/* ------------------------------------------------------------ bf16 -- */

static float bits_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint32_t float_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* Rounding to bf16: nearest, ties to even; infinities stay, NaN stays NaN,
 * the largest floats round up to infinity (as PyTorch's .bfloat16()). */
static void test_bf16_rounding(void)
{
	float in[10] = {1.0f,
	                1.00390625f,             /* halfway: down to even 1.0 */
	                1.01171875f,             /* halfway: up to even 1.015625 */
	                bits_float(0x3f808001u), /* just above halfway: up */
	                -2.5f,
	                INFINITY,
	                -INFINITY,
	                3.4028235e38f,
	                bits_float(0x7fc00001u),
	                1e-40f};
	float want[10] = {1.0f,      1.0f,
	                  1.015625f, 1.0078125f,
	                  -2.5f,     INFINITY,
	                  -INFINITY, INFINITY,
	                  NAN,       bits_float(float_bits(1e-40f) & 0xffff0000u)};
	float out[10];
	cpu_round_bf16(out, in, 1, 10, 10);
	for (int i = 0; i < 10; i++) {
		if (isnan(want[i])) {
			CU_ASSERT(isnan(out[i]));
		} else {
			CU_ASSERT_EQUAL(float_bits(out[i]), float_bits(want[i]));
		}
		CU_ASSERT_EQUAL(float_bits(out[i]) & 0xffffu, 0u);
	}
}

/* The native kernels' operand packing: the portable rule and AVX512_BF16's
 * conversion give the same bits for every normal number, zero, infinity and
 * NaN (the quiet bit set, the top payload kept) over 2^20 patterns from every
 * exponent, at row lengths 1..70 (the masked tail) and rows wider than the
 * data; a denormal packs as the portable rounding, or as a signed zero with
 * the hardware conversion. Without AVX512_BF16 both are the portable rule. */
static void test_bf16_pack_hw_matches_rule(void)
{
	enum { N = 1 << 20, LD = 73 };
	float *src = malloc(sizeof(float) * N);
	uint16_t *sw = malloc(sizeof(uint16_t) * N), *hw = malloc(sizeof(uint16_t) * N);
	uint32_t seed = 99;
	size_t mism = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(src);
	CU_ASSERT_PTR_NOT_NULL_FATAL(sw);
	CU_ASSERT_PTR_NOT_NULL_FATAL(hw);
	for (int i = 0; i < N; i++) {
		seed = seed * 1664525u + 1013904223u;
		uint32_t u = seed ^ (seed >> 13) * 2654435761u;
		if (i % 7 == 0) /* exact ties and their neighbours */
			u = (u & 0xffff0000u) | 0x8000u | (uint32_t)(i % 3 == 0);
		src[i] = bits_float(u);
	}
	src[0] = bits_float(0x7f7fffffu); /* rounds up to infinity */
	src[1] = bits_float(0xff800000u);
	src[2] = bits_float(0x7f800001u); /* signalling NaN: made quiet */
	src[3] = bits_float(0x80000000u);
	src[4] = bits_float(0x00000001u); /* the smallest denormal */
	cpu_pack_bf16(sw, src, N / LD, LD - 3, LD, false);
	cpu_pack_bf16(hw, src, N / LD, LD - 3, LD, true);
	for (int r = 0; r < N / LD; r++)
		for (int j = 0; j < LD - 3; j++) {
			uint32_t u = float_bits(src[r * LD + j]);
			uint16_t a = sw[r * (LD - 3) + j], b = hw[r * (LD - 3) + j];
			bool denormal = (u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0;
			if (denormal)
				mism += b != a && b != (uint16_t)((u >> 16) & 0x8000u);
			else
				mism += a != b;
		}
	CU_ASSERT_EQUAL(mism, 0);
	CU_ASSERT_EQUAL(sw[0], 0x7f80u);
	CU_ASSERT_EQUAL(sw[1], 0xff80u);
	CU_ASSERT_EQUAL(sw[2], 0x7fc0u);
	CU_ASSERT_EQUAL(sw[3], 0x8000u);
	for (int n = 1; n <= 70; n++) { /* every tail length, nothing written past it */
		uint16_t a[72], b[72];
		memset(a, 0xab, sizeof(a));
		memset(b, 0xab, sizeof(b));
		cpu_pack_bf16(a, src + 100, 1, n, n, false);
		cpu_pack_bf16(b, src + 100, 1, n, n, true);
		CU_ASSERT_EQUAL(memcmp(a, b, sizeof(a)), 0);
		CU_ASSERT_EQUAL(b[n], 0xababu);
	}
	free(src);
	free(sw);
	free(hw);
}

/* The activations' AVX-512F build gives the baseline build's bits: every
 * kind, forward and backward (set and accumulated), over 100003 elements
 * (a partial chunk at the end) spanning [-20, 20], and a tail of specials
 * (0, -0, infinities, NaN, denormals, +-90). */
static void test_activation_wide_bitwise(void)
{
	enum { N = 100003 };
	float *x = malloc(sizeof(float) * N * 6), *y = x + N, *dy = y + N, *a = dy + N, *b = a + N,
	      *acc0 = b + N;
	const float specials[] = {0.0f,    -0.0f, INFINITY, -INFINITY, NAN,   1e-40f,
	                          -1e-40f, 90.0f, -90.0f,   9.0f,      -9.0f, 1e-3f};
	const pt_act kinds[] = {PT_ACT_RELU, PT_ACT_GELU, PT_ACT_TANH, PT_ACT_SIGMOID};
	uint32_t seed = 5;

	CU_ASSERT_PTR_NOT_NULL_FATAL(x);
	if (strcmp(pt_cpu_activation_isa(), "avx512f") != 0)
		printf("\n    no AVX-512F here: both builds are the baseline's");
	for (int i = 0; i < N; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = ((float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f) * 20.0f;
		seed = seed * 1664525u + 1013904223u;
		dy[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
		acc0[i] = (float)(i % 11) * 0.25f;
	}
	memcpy(x + N - 12, specials, sizeof(specials));
	for (int k = 0; k < 4; k++) {
		cpu_activation_rows(kinds[k], false, false, a, NULL, x, NULL, N, false);
		cpu_activation_rows(kinds[k], false, true, b, NULL, x, NULL, N, false);
		CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * N), 0);
		memcpy(y, a, sizeof(float) * N);
		for (int acc = 0; acc < 2; acc++) {
			memcpy(a, acc0, sizeof(float) * N);
			memcpy(b, acc0, sizeof(float) * N);
			cpu_activation_rows(kinds[k], true, false, a, dy, x, y, N, acc);
			cpu_activation_rows(kinds[k], true, true, b, dy, x, y, N, acc);
			CU_ASSERT_EQUAL(memcmp(a, b, sizeof(float) * N), 0);
		}
	}
	/* and it computes GELU: 0.5 x (1 + tanh(k (x + 0.044715 x^3))) within 2e-6 */
	cpu_activation_rows(PT_ACT_GELU, false, true, b, NULL, x, NULL, 1000, false);
	for (int i = 0; i < 1000; i++) {
		double v = x[i],
		       g = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
		CU_ASSERT(fabs(b[i] - g) <= 2e-6 * (1.0 + fabs(g)));
	}
	free(x);
}

static void fill_uniform(pt_tensor *t, uint32_t seed)
{
	float *p = pt_tensor_f32(t);
	for (int64_t i = 0; i < pt_tensor_numel(t); i++) {
		seed = seed * 1664525u + 1013904223u;
		p[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
	}
}

static void rounded(pt_tensor *out, const pt_tensor *x, pt_precision prec)
{
	PT_CHECK_OK(pt_tensor_init(out, PT_F32, x->ndim, x->shape));
	(prec == PT_PREC_TF32 ? cpu_round_tf32 : cpu_round_bf16)(
	    pt_tensor_f32(out), pt_tensor_f32(x), 1, pt_tensor_numel(x), pt_tensor_numel(x));
}

/* ||a - b|| / ||b||, Frobenius. */
static double rel_err(const pt_tensor *a, const pt_tensor *b)
{
	double num = 0, den = 0;
	const float *x = pt_tensor_f32(a), *y = pt_tensor_f32(b);
	for (int64_t i = 0; i < pt_tensor_numel(b); i++) {
		num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
		den += (double)y[i] * y[i];
	}
	return sqrt(num / den);
}

static bool same_bits(const pt_tensor *a, const pt_tensor *b)
{
	return memcmp(pt_tensor_data(a), pt_tensor_data(b), pt_tensor_nbytes(a)) == 0;
}

typedef struct lin {
	pt_tensor y, dx, dw, db;
} lin;

static void linear_run(const pt_tensor *x, const pt_tensor *w, const pt_tensor *b,
                       const pt_tensor *dy, lin *o)
{
	PT_CHECK_OK(pt_tensor_init(&o->y, PT_F32, 2, (int64_t[]){x->shape[0], w->shape[0]}));
	PT_CHECK_OK(pt_tensor_init(&o->dx, PT_F32, 2, x->shape));
	PT_CHECK_OK(pt_tensor_init(&o->dw, PT_F32, 2, w->shape));
	PT_CHECK_OK(pt_tensor_init(&o->db, PT_F32, 1, b->shape));
	PT_CHECK_OK(pt_linear_forward(&o->y, x, w, b));
	PT_CHECK_OK(pt_linear_backward(&o->dx, &o->dw, &o->db, dy, x, w, false));
}

static void lin_fini(lin *o)
{
	pt_tensor_fini(&o->y);
	pt_tensor_fini(&o->dx);
	pt_tensor_fini(&o->dw);
	pt_tensor_fini(&o->db);
}

static void *fp32_thread(void *arg)
{
	void **a = arg;
	linear_run(a[0], a[1], a[2], a[3], a[4]);
	return NULL;
}

/* Linear in bf16: each product is the f32 product of the bf16-rounded
 * operands (bitwise), the bias gradient an f32 sum (bitwise fp32's), and
 * against fp32 the relative error is below 1e-2 (bf16 keeps 8 significant
 * bits: about 4e-3 per operand). The precision is the dispatching thread's:
 * another thread meanwhile computes fp32, bitwise. */
/* A Linear layer at prec: y, dx and dW are bitwise the f32 products of the
 * rounded operands, within tol of fp32 (relative, Frobenius); the bias
 * gradient is fp32's; another thread meanwhile computes fp32 bitwise. */
static void check_linear_precision(pt_precision prec, double tol, const char *name)
{
	pt_tensor x, w, b, dy, xr, wr, dyr;
	lin f32, bf, ref, other;
	pthread_t t;

	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){33, 70}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){45, 70}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_F32, 1, (int64_t[]){45}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){33, 45}));
	fill_uniform(&x, 1);
	fill_uniform(&w, 2);
	fill_uniform(&b, 3);
	fill_uniform(&dy, 4);
	linear_run(&x, &w, &b, &dy, &f32);
	pt_set_precision(prec);
	CU_ASSERT_EQUAL(pt_get_precision(), prec);
	linear_run(&x, &w, &b, &dy, &bf);
	{
		void *args[5] = {&x, &w, &b, &dy, &other};
		CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, fp32_thread, args), 0);
		pthread_join(t, NULL);
	}
	pt_set_precision(PT_PREC_FP32);
	rounded(&xr, &x, prec);
	rounded(&wr, &w, prec);
	rounded(&dyr, &dy, prec);
	/* The reference: fp32 products of rounded operands (dy rounded for dx
	 * and dw, as the backward's products take it). */
	PT_CHECK_OK(pt_tensor_init(&ref.y, PT_F32, 2, (int64_t[]){33, 45}));
	PT_CHECK_OK(pt_tensor_init(&ref.dx, PT_F32, 2, x.shape));
	PT_CHECK_OK(pt_tensor_init(&ref.dw, PT_F32, 2, w.shape));
	PT_CHECK_OK(pt_tensor_init(&ref.db, PT_F32, 1, b.shape));
	PT_CHECK_OK(pt_linear_forward(&ref.y, &xr, &wr, &b));
	PT_CHECK_OK(pt_linear_backward(&ref.dx, &ref.dw, NULL, &dyr, &xr, &wr, false));
	PT_CHECK_OK(pt_linear_backward(NULL, NULL, &ref.db, &dy, &x, &w, false));
	CU_ASSERT(same_bits(&bf.y, &ref.y));
	CU_ASSERT(same_bits(&bf.dx, &ref.dx));
	CU_ASSERT(same_bits(&bf.dw, &ref.dw));
	CU_ASSERT(same_bits(&bf.db, &ref.db));
	CU_ASSERT(same_bits(&bf.db, &f32.db));
	CU_ASSERT(!same_bits(&bf.y, &f32.y));
	CU_ASSERT(rel_err(&bf.y, &f32.y) < tol);
	CU_ASSERT(rel_err(&bf.dx, &f32.dx) < tol);
	CU_ASSERT(rel_err(&bf.dw, &f32.dw) < tol);
	printf("\n    linear %s vs fp32: y %.2e, dx %.2e, dw %.2e", name, rel_err(&bf.y, &f32.y),
	       rel_err(&bf.dx, &f32.dx), rel_err(&bf.dw, &f32.dw));
	CU_ASSERT(same_bits(&other.y, &f32.y) && same_bits(&other.dx, &f32.dx) &&
	          same_bits(&other.dw, &f32.dw));
	lin_fini(&f32);
	lin_fini(&bf);
	lin_fini(&ref);
	lin_fini(&other);
	pt_tensor_fini(&x);
	pt_tensor_fini(&w);
	pt_tensor_fini(&b);
	pt_tensor_fini(&dy);
	pt_tensor_fini(&xr);
	pt_tensor_fini(&wr);
	pt_tensor_fini(&dyr);
}

/* The emulation's products (bitwise the rounded operands' f32 products). */
static void test_bf16_linear(void)
{
	pt_cpu_bf16_select(PT_BF16_EMULATED);
	check_linear_precision(PT_PREC_BF16, 1e-2, "bf16");
	pt_cpu_bf16_select(PT_BF16_AUTO);
}

/* A Linear layer forward and backward through the dispatcher with native
 * bf16 products: within 1e-5 (relative, Frobenius) of the emulation's, the
 * bias gradient (an f32 column sum) bitwise. Leaves NATIVE selected. */
static void check_linear_native(void)
{
	pt_tensor x, w, b, dy;
	lin nat, emu;

	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){33, 70}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){45, 70}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_F32, 1, (int64_t[]){45}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){33, 45}));
	fill_uniform(&x, 1);
	fill_uniform(&w, 2);
	fill_uniform(&b, 3);
	fill_uniform(&dy, 4);
	pt_set_precision(PT_PREC_BF16);
	pt_cpu_bf16_select(PT_BF16_NATIVE);
	linear_run(&x, &w, &b, &dy, &nat);
	pt_cpu_bf16_select(PT_BF16_EMULATED);
	linear_run(&x, &w, &b, &dy, &emu);
	pt_cpu_bf16_select(PT_BF16_NATIVE);
	pt_set_precision(PT_PREC_FP32);
	CU_ASSERT(rel_err(&nat.y, &emu.y) <= 1e-5);
	CU_ASSERT(rel_err(&nat.dx, &emu.dx) <= 1e-5);
	CU_ASSERT(rel_err(&nat.dw, &emu.dw) <= 1e-5);
	CU_ASSERT(same_bits(&nat.db, &emu.db));
	printf("\n    linear native vs emulated bf16: y %.2e, dx %.2e, dw %.2e",
	       rel_err(&nat.y, &emu.y), rel_err(&nat.dx, &emu.dx), rel_err(&nat.dw, &emu.dw));
	lin_fini(&nat);
	lin_fini(&emu);
	pt_tensor_fini(&x);
	pt_tensor_fini(&w);
	pt_tensor_fini(&b);
	pt_tensor_fini(&dy);
}

/* as_bf16: a bf16 copy of f32 x (nearest even: the native packing's values
 * away from denormals). */
static void as_bf16(pt_tensor *out, const pt_tensor *x)
{
	PT_CHECK_OK(pt_tensor_init(out, PT_BF16, x->ndim, x->shape));
	PT_CHECK_OK(pt_tensor_convert(out, x));
}

/* bf16 activations (a bf16 model's saved product inputs, pt_layer_mm_input):
 * layernorm and every activation write a bf16 y that is their f32 y rounded;
 * a Linear given x in bf16 computes, forward and backward, bitwise what it
 * computes from the f32 x that rounds to it - natively (the packed operand
 * is the same) and emulated (x widened exactly, rounded back); at fp32 a bf16
 * x is refused, naming the op, and so is a bf16 x that is not contiguous. */
static void test_bf16_activation_inputs(void)
{
	pt_tensor x, w, b, dy, xb, y32, yb, yr, mean, rstd;
	pt_act kinds[4] = {PT_ACT_RELU, PT_ACT_GELU, PT_ACT_TANH, PT_ACT_SIGMOID};

	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){33, 70}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){45, 70}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_F32, 1, (int64_t[]){45}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){33, 45}));
	PT_CHECK_OK(pt_tensor_init(&y32, PT_F32, 2, x.shape));
	PT_CHECK_OK(pt_tensor_init(&yb, PT_BF16, 2, x.shape));
	PT_CHECK_OK(pt_tensor_init(&mean, PT_F32, 1, (int64_t[]){33}));
	PT_CHECK_OK(pt_tensor_init(&rstd, PT_F32, 1, (int64_t[]){33}));
	fill_uniform(&x, 11);
	fill_uniform(&w, 12);
	fill_uniform(&b, 13);
	fill_uniform(&dy, 14);
	for (int k = 0; k < 4; k++) {
		PT_CHECK_OK(pt_activation_forward(&y32, &x, kinds[k]));
		PT_CHECK_OK(pt_activation_forward(&yb, &x, kinds[k]));
		as_bf16(&yr, &y32);
		CU_ASSERT(same_bits(&yb, &yr));
		pt_tensor_fini(&yr);
	}
	for (int64_t C = 70; C <= 1100; C += 1030) { /* 1100: pieces of 512 and a tail */
		pt_tensor lx, lw, lb, l32, l16, lr;
		PT_CHECK_OK(pt_tensor_init(&lx, PT_F32, 2, (int64_t[]){33, C}));
		PT_CHECK_OK(pt_tensor_init(&l32, PT_F32, 2, lx.shape));
		PT_CHECK_OK(pt_tensor_init(&l16, PT_BF16, 2, lx.shape));
		PT_CHECK_OK(pt_tensor_init(&lw, PT_F32, 1, (int64_t[]){C}));
		PT_CHECK_OK(pt_tensor_init(&lb, PT_F32, 1, (int64_t[]){C}));
		fill_uniform(&lx, 17);
		fill_uniform(&lw, 15);
		fill_uniform(&lb, 16);
		PT_CHECK_OK(pt_layernorm_forward(&l32, &mean, &rstd, &lx, &lw, &lb, 1e-5f));
		PT_CHECK_OK(pt_layernorm_forward(&l16, &mean, &rstd, &lx, &lw, &lb, 1e-5f));
		as_bf16(&lr, &l32);
		CU_ASSERT(same_bits(&l16, &lr));
		pt_tensor_fini(&lr);
		pt_tensor_fini(&lx);
		pt_tensor_fini(&l32);
		pt_tensor_fini(&l16);
		pt_tensor_fini(&lw);
		pt_tensor_fini(&lb);
	}
	as_bf16(&xb, &x);
	for (int k = 0; k < 2; k++) {
		lin from32, from16;
		pt_cpu_bf16_select(k == 0 ? PT_BF16_NATIVE : PT_BF16_EMULATED);
		pt_set_precision(PT_PREC_BF16);
		linear_run(&x, &w, &b, &dy, &from32);
		linear_run(&xb, &w, &b, &dy, &from16);
		pt_set_precision(PT_PREC_FP32);
		CU_ASSERT(same_bits(&from16.y, &from32.y));
		CU_ASSERT(same_bits(&from16.dx, &from32.dx));
		CU_ASSERT(same_bits(&from16.dw, &from32.dw));
		CU_ASSERT(same_bits(&from16.db, &from32.db));
		lin_fini(&from32);
		lin_fini(&from16);
	}
	pt_cpu_bf16_select(PT_BF16_AUTO);
	PT_CHECK_OK(pt_tensor_init(&yr, PT_F32, 2, (int64_t[]){33, 45}));
	PT_CHECK_ERR_MSG(pt_linear_forward(&yr, &xb, &w, &b), PT_ERR_DTYPE,
	                 "linear_forward: a bf16 input at fp32 precision");
	{ /* a bf16 x that is not contiguous (the first 35 of 70 columns): refused */
		pt_tensor cols;
		PT_CHECK_OK(pt_tensor_narrow(&cols, &xb, 1, 0, 35));
		pt_set_precision(PT_PREC_BF16);
		PT_CHECK_ERR_MSG(pt_linear_forward(&yr, &cols, &w, &b), PT_ERR_INVALID,
		                 "x must be contiguous");
		pt_set_precision(PT_PREC_FP32);
		pt_tensor_fini(&cols);
	}
	pt_tensor_fini(&yr);
	pt_tensor_fini(&x);
	pt_tensor_fini(&xb);
	pt_tensor_fini(&w);
	pt_tensor_fini(&b);
	pt_tensor_fini(&dy);
	pt_tensor_fini(&y32);
	pt_tensor_fini(&yb);
	pt_tensor_fini(&mean);
	pt_tensor_fini(&rstd);
}

/* The native Linear's other forms against the emulation (1e-5): no bias,
 * dx accumulated onto what it held, and the split backward (dx alone, then
 * dw alone, as zb-h1's B and W tasks run it). */
static void linear_forms(pt_bf16_kernels k, const pt_tensor *x, const pt_tensor *w,
                         const pt_tensor *dy, lin *o)
{
	pt_set_precision(PT_PREC_BF16);
	pt_cpu_bf16_select(k);
	PT_CHECK_OK(pt_tensor_init(&o->y, PT_F32, 2, (int64_t[]){x->shape[0], w->shape[0]}));
	PT_CHECK_OK(pt_tensor_init(&o->dx, PT_F32, 2, x->shape));
	PT_CHECK_OK(pt_tensor_init(&o->dw, PT_F32, 2, w->shape));
	PT_CHECK_OK(pt_tensor_init(&o->db, PT_F32, 2, x->shape));
	fill_uniform(&o->dx, 9);
	PT_CHECK_OK(pt_linear_forward(&o->y, x, w, NULL));
	PT_CHECK_OK(pt_linear_backward(&o->dx, NULL, NULL, dy, x, w, true));
	PT_CHECK_OK(pt_linear_backward(NULL, &o->dw, NULL, dy, x, w, false));
	/* db here holds the dx of a backward with both outputs, accumulated */
	fill_uniform(&o->db, 9);
	PT_CHECK_OK(pt_linear_backward(&o->db, &o->dw, NULL, dy, x, w, true));
	pt_set_precision(PT_PREC_FP32);
}

static void check_linear_native_forms(void)
{
	pt_tensor x, w, dy;
	lin nat, emu;

	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){40, 24}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){56, 24}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){40, 56}));
	fill_uniform(&x, 5);
	fill_uniform(&w, 6);
	fill_uniform(&dy, 7);
	linear_forms(PT_BF16_NATIVE, &x, &w, &dy, &nat);
	linear_forms(PT_BF16_EMULATED, &x, &w, &dy, &emu);
	pt_cpu_bf16_select(PT_BF16_NATIVE);
	CU_ASSERT(rel_err(&nat.y, &emu.y) <= 1e-5);
	CU_ASSERT(rel_err(&nat.dx, &emu.dx) <= 1e-5);
	CU_ASSERT(rel_err(&nat.dw, &emu.dw) <= 1e-5);
	CU_ASSERT(rel_err(&nat.db, &emu.db) <= 1e-5);
	/* and each is what it should be: dx accumulated (not the bare product) */
	CU_ASSERT(rel_err(&nat.dx, &nat.db) <= 1e-5);
	printf("\n    linear forms native vs emulated: y %.2e, dx+= %.2e, dw (twice) %.2e",
	       rel_err(&nat.y, &emu.y), rel_err(&nat.dx, &emu.dx), rel_err(&nat.dw, &emu.dw));
	lin_fini(&nat);
	lin_fini(&emu);
	pt_tensor_fini(&x);
	pt_tensor_fini(&w);
	pt_tensor_fini(&dy);
}

/* Native bf16 (oneDNN's bf16 matmul; its reference kernel on a CPU without
 * bf16 instructions) against the emulation: the same rounded operands, so
 * only the order of the f32 sums differs - within 1e-5 relative (Frobenius)
 * over every transposition, alpha and beta and leading dimensions wider than
 * the rows; and the operands really are rounded ((1 + 2^-10)^2 comes out 1). */
static void test_bf16_native_matches_emulation(void)
{
	enum { M = 37, N = 29, K = 70, LD = 80 };
	float *a = malloc(sizeof(float) * LD * LD * 4), *b = a + LD * LD, *c1 = b + LD * LD,
	      *c2 = c1 + LD * LD;
	const char *impl = NULL;
	uint32_t seed = 7;

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	(void)pt_cpu_bf16_native(&impl);
	if (strcmp(impl, "unavailable") == 0) {
		printf("\n    skip: oneDNN has no bf16 matmul for this CPU (it needs AVX512_BF16 "
		       "or AMX); bf16 runs emulated here");
		free(a);
		return;
	}
	for (int i = 0; i < LD * LD * 2; i++) {
		seed = seed * 1664525u + 1013904223u;
		a[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
	}
	pt_cpu_bf16_select(PT_BF16_NATIVE);
	CU_ASSERT_TRUE(pt_cpu_bf16_native(&impl));
	printf("\n    oneDNN's bf16 kernel here: %s", impl);
	for (int k = 0; k < 8; k++) {
		bool ta = k & 1, tb = k & 2, acc = k & 4;
		float alpha = acc ? 0.5f : 1.0f, beta = acc ? 1.0f : 0.0f;
		double num = 0, den = 0;
		for (int i = 0; i < LD * LD; i++)
			c1[i] = c2[i] = (float)(i % 5) - 2.0f;
		PT_CHECK_OK(cpu_gemm_prec(PT_PREC_BF16, ta, tb, M, N, K, alpha, a, LD, b, LD, beta,
		                          c1, LD));
		PT_CHECK_OK(cpu_gemm_prec_emulated(PT_PREC_BF16, ta, tb, M, N, K, alpha, a, LD, b,
		                                   LD, beta, c2, LD));
		for (int r = 0; r < M; r++)
			for (int j = 0; j < N; j++) {
				double d = (double)c1[r * LD + j] - c2[r * LD + j];
				num += d * d;
				den += (double)c2[r * LD + j] * c2[r * LD + j];
			}
		/* Columns beyond N are not the product's: untouched. */
		CU_ASSERT_EQUAL(c1[N], (float)(N % 5) - 2.0f);
		CU_ASSERT(sqrt(num / den) <= 1e-5);
	}
	{
		float x = 1.0f + 1.0f / 1024, y = 0;
		PT_CHECK_OK(cpu_gemm_prec(PT_PREC_BF16, false, false, 1, 1, 1, 1.0f, &x, 1, &x, 1,
		                          0.0f, &y, 1));
		CU_ASSERT_EQUAL(y, 1.0f);
	}
	check_linear_native();
	check_linear_native_forms();
	pt_cpu_bf16_select(PT_BF16_AUTO);
	free(a);
}

/* tf32 keeps 10 mantissa bits to bf16's 7: errors about 8x smaller. */
static void test_tf32_linear(void)
{
	check_linear_precision(PT_PREC_TF32, 1.5e-3, "tf32");
}

/* tf32 rounding: nearest, ties to even at bit 13, NaN kept, overflow to inf. */
static void test_tf32_rounding(void)
{
	float in[7] = {1.0f,
	               bits_float(0x3f801000u), /* 1 + 2^-11, halfway: down to even 1.0 */
	               bits_float(0x3f803000u), /* 1 + 3 * 2^-11, halfway: up to 1 + 2^-9 */
	               bits_float(0x3f801001u), /* just above halfway: up */
	               -2.5f,
	               3.4028235e38f,
	               bits_float(0x7fc00001u)};
	uint32_t want[7] = {
	    0x3f800000u, 0x3f800000u, 0x3f804000u, 0x3f802000u, 0xc0200000u, 0x7f800000u, 0};
	float out[7];
	cpu_round_tf32(out, in, 1, 7, 7);
	for (int i = 0; i < 7; i++) {
		if (i == 6) {
			CU_ASSERT(isnan(out[i]));
		} else {
			CU_ASSERT_EQUAL(float_bits(out[i]), want[i]);
		}
		CU_ASSERT_EQUAL(float_bits(out[i]) & 0x1fffu, 0u);
	}
}

/* Below GEMM_SERIAL_FLOPS (dnnl_sgemm), an operand read down rows 1024 floats
 * apart is copied to padded rows before the product (cpu_gemm_prec): the
 * result is dnnl_sgemm's product of the original layout, bit for bit, for
 * dW = dy^T x of a 16 -> 1024 Linear (dy's rows padded) and of a 1024 -> 16
 * one (x's), and dx = dy W of a 1024 -> 256 one (W's) at 16 rows. */
static void test_dispatch_gemm_padding_is_bitwise(void)
{
	enum { N = 300, W = 1024, S = 256, R = 16 };
	float *dy = malloc(sizeof(float) * N * W), *x = malloc(sizeof(float) * N * W);
	float *ref = malloc(sizeof(float) * W * W), *got = malloc(sizeof(float) * W * W);
	pt_tensor t;

	PT_CHECK_OK(pt_tensor_init(&t, PT_F32, 1, (int64_t[]){N * W}));
	fill_uniform(&t, 3);
	memcpy(dy, pt_tensor_f32(&t), sizeof(float) * N * W);
	fill_uniform(&t, 4);
	memcpy(x, pt_tensor_f32(&t), sizeof(float) * N * W);
	/* Padded on sgemm's path (below 16 M flops) ... */
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, true, false, W, R, N, W, R), N * (W + 16));
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, true, false, R, W, N, R, W), N * (W + 16));
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, false, false, R, W, S, S, W), S * (W + 16));
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, true, false, W, R, 255, W, R), 0);
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, false, true, R, W, S, S, S), 0);
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, false, true, R, S, W, W, W), 0);
	/* ... not on the matmul primitive's (W2's widths, 300 rows), but a
	 * rounded product copies both operands wherever it runs. */
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, true, false, W, S, N, W, S), 0);
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(false, false, false, N, W, S, S, W), 0);
	CU_ASSERT_EQUAL(cpu_gemm_operand_floats(true, false, false, N, W, S, S, W),
	                N * S + S * (W + 16));
	/* dW (W x R) = dy^T (dy: N x W) x (N x R) */
	CU_ASSERT_EQUAL(dnnl_sgemm('T', 'N', W, R, N, 1.0f, dy, W, x, R, 0.0f, ref, R),
	                dnnl_success);
	PT_CHECK_OK(
	    cpu_gemm_prec(PT_PREC_FP32, true, false, W, R, N, 1.0f, dy, W, x, R, 0.0f, got, R));
	CU_ASSERT(memcmp(ref, got, sizeof(float) * W * R) == 0);
	/* dW (R x W) = dy^T (dy: N x R) x (N x W) */
	CU_ASSERT_EQUAL(dnnl_sgemm('T', 'N', R, W, N, 1.0f, dy, R, x, W, 0.0f, ref, W),
	                dnnl_success);
	PT_CHECK_OK(
	    cpu_gemm_prec(PT_PREC_FP32, true, false, R, W, N, 1.0f, dy, R, x, W, 0.0f, got, W));
	CU_ASSERT(memcmp(ref, got, sizeof(float) * R * W) == 0);
	/* dx (R x W) = dy (R x S) W (S x W), accumulated */
	for (int i = 0; i < R * W; i++)
		ref[i] = got[i] = 0.25f;
	CU_ASSERT_EQUAL(dnnl_sgemm('N', 'N', R, W, S, 1.0f, dy, S, x, W, 1.0f, ref, W),
	                dnnl_success);
	PT_CHECK_OK(
	    cpu_gemm_prec(PT_PREC_FP32, false, false, R, W, S, 1.0f, dy, S, x, W, 1.0f, got, W));
	CU_ASSERT(memcmp(ref, got, sizeof(float) * R * W) == 0);
	pt_tensor_fini(&t);
	free(dy);
	free(x);
	free(ref);
	free(got);
}

/* ref_gemm: out (rows x cols) = init (+ bias[c]) + sum over k of
 * a[r ar + k ak] b[k bk + c bc], in double. */
static void ref_gemm(double *out, int64_t rows, int64_t cols, int64_t K, const float *a, int64_t ar,
                     int64_t ak, const float *b, int64_t bk, int64_t bc, const float *bias,
                     double init)
{
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < cols; c++) {
			double acc = init + (bias ? bias[c] : 0.0);
			for (int64_t k = 0; k < K; k++)
				acc += (double)a[r * ar + k * ak] * b[k * bk + c * bc];
			out[r * cols + c] = acc;
		}
}

/* From GEMM_SERIAL_FLOPS at the top level, products run on oneDNN's f32
 * matmul primitive: W2's Linear shapes at 512 rows (y = x W^T + b with the
 * primitive's bias, dx = dy W accumulated, dW += dy^T x) give the same bits
 * on 1, 2 and 4 threads and agree with a double reference within 1e-6
 * (relative, Frobenius; float sums of 1024 terms). */
static void test_dispatch_gemm_prim_threads_bitwise(void)
{
	enum { N = 512, I = 1024, O = 256 };
	pt_tensor t;
	float *x = malloc(sizeof(float) * N * I), *w = malloc(sizeof(float) * O * I);
	float *dy = malloc(sizeof(float) * N * O), *b = malloc(sizeof(float) * O);
	float *out[3][3];
	double *ref[3];
	size_t n_out[3] = {(size_t)N * O, (size_t)N * I, (size_t)O * I};
	int threads = omp_get_max_threads();

	PT_CHECK_OK(pt_tensor_init(&t, PT_F32, 1, (int64_t[]){N * I}));
	fill_uniform(&t, 5);
	memcpy(x, pt_tensor_f32(&t), sizeof(float) * N * I);
	fill_uniform(&t, 6);
	memcpy(w, pt_tensor_f32(&t), sizeof(float) * O * I);
	fill_uniform(&t, 7);
	memcpy(dy, pt_tensor_f32(&t), sizeof(float) * N * O);
	memcpy(b, pt_tensor_f32(&t) + N * O, sizeof(float) * O);
	for (int k = 0; k < 3; k++) {
		ref[k] = calloc(n_out[k], sizeof(double));
		for (int tc = 0; tc < 3; tc++)
			out[k][tc] = malloc(sizeof(float) * n_out[k]);
	}
	ref_gemm(ref[0], N, O, I, x, I, 1, w, 1, I, b, 0.0);     /* x w^T + b */
	ref_gemm(ref[1], N, I, O, dy, O, 1, w, I, 1, NULL, 0.5); /* 0.5 + dy w */
	ref_gemm(ref[2], O, I, N, dy, 1, O, x, I, 1, NULL, 0.5); /* 0.5 + dy^T x */
	for (int tc = 0; tc < 3; tc++) {
		omp_set_num_threads(tc == 0 ? 1 : tc == 1 ? 2 : 4);
		for (size_t i = 0; i < n_out[1]; i++)
			out[1][tc][i] = 0.5f;
		for (size_t i = 0; i < n_out[2]; i++)
			out[2][tc][i] = 0.5f;
		PT_CHECK_OK(cpu_gemm_f32_prim(false, true, N, O, I, 1.0f, x, I, w, I, b, 0.0f,
		                              out[0][tc], O));
		PT_CHECK_OK(cpu_gemm_prec(PT_PREC_FP32, false, false, N, I, O, 1.0f, dy, O, w, I,
		                          1.0f, out[1][tc], I));
		PT_CHECK_OK(cpu_gemm_prec(PT_PREC_FP32, true, false, O, I, N, 1.0f, dy, O, x, I,
		                          1.0f, out[2][tc], I));
	}
	omp_set_num_threads(threads);
	for (int k = 0; k < 3; k++) {
		double num = 0, den = 0;
		for (size_t i = 0; i < n_out[k]; i++) {
			num += (out[k][0][i] - ref[k][i]) * (out[k][0][i] - ref[k][i]);
			den += ref[k][i] * ref[k][i];
		}
		printf("\n    product %d: relative error %.1e", k, sqrt(num / den));
		CU_ASSERT(sqrt(num / den) < 1e-6);
		CU_ASSERT(memcmp(out[k][0], out[k][1], sizeof(float) * n_out[k]) == 0);
		CU_ASSERT(memcmp(out[k][0], out[k][2], sizeof(float) * n_out[k]) == 0);
		for (int tc = 0; tc < 3; tc++)
			free(out[k][tc]);
		free(ref[k]);
	}
	pt_tensor_fini(&t);
	free(x);
	free(w);
	free(dy);
	free(b);
}

/* attn_ref: causal attention and its input gradient in double, from the
 * definition: out, lse (B, NH, T) and dqkv (B, T, 3C), dqkv added to what it
 * holds when accum. */
static void attn_ref(const float *qkv, const float *dout, int64_t B, int64_t T, int64_t C, int NH,
                     double *out, double *lse, double *dqkv)
{
	int64_t hs = C / NH, C3 = 3 * C;
	double scale = 1.0 / sqrt((double)hs);
	double *p = malloc(sizeof(double) * (size_t)(T * T)), *dp = malloc(sizeof(double) * T);
	for (int64_t b = 0; b < B; b++)
		for (int h = 0; h < NH; h++) {
			const float *q = qkv + b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
			const float *d = dout + b * T * C + h * hs;
			double *o = out + b * T * C + h * hs, *dq = dqkv + b * T * C3 + h * hs;
			double *dk = dq + C, *dv = dq + 2 * C;
			for (int64_t i = 0; i < T; i++) {
				double mx = -INFINITY, sum = 0;
				for (int64_t j = 0; j <= i; j++) {
					double sc = 0;
					for (int64_t e = 0; e < hs; e++)
						sc += (double)q[i * C3 + e] * k[j * C3 + e];
					p[i * T + j] = sc * scale;
					mx = fmax(mx, p[i * T + j]);
				}
				for (int64_t j = 0; j <= i; j++)
					sum += exp(p[i * T + j] - mx);
				lse[(b * NH + h) * T + i] = mx + log(sum);
				for (int64_t j = 0; j <= i; j++)
					p[i * T + j] = exp(p[i * T + j] - mx) / sum;
				for (int64_t e = 0; e < hs; e++) {
					double acc = 0;
					for (int64_t j = 0; j <= i; j++)
						acc += p[i * T + j] * v[j * C3 + e];
					o[i * C + e] = acc;
				}
				double dot = 0;
				for (int64_t j = 0; j <= i; j++) {
					dp[j] = 0;
					for (int64_t e = 0; e < hs; e++)
						dp[j] += (double)d[i * C + e] * v[j * C3 + e];
					dot += p[i * T + j] * dp[j];
				}
				for (int64_t j = 0; j <= i; j++) {
					double ds = p[i * T + j] * (dp[j] - dot) * scale;
					for (int64_t e = 0; e < hs; e++) {
						dv[j * C3 + e] += p[i * T + j] * d[i * C + e];
						dq[i * C3 + e] += ds * k[j * C3 + e];
						dk[j * C3 + e] += ds * q[i * C3 + e];
					}
				}
			}
		}
	free(p);
	free(dp);
}

static double rel_err_ref(const pt_tensor *a, const double *ref)
{
	double num = 0, den = 0;
	const float *x = pt_tensor_f32(a);
	for (int64_t i = 0; i < pt_tensor_numel(a); i++) {
		num += (x[i] - ref[i]) * (x[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return sqrt(num / den);
}

/* The blocked causal kernel against the definition in double, for lengths
 * below, at and across its 32-row strips, with and without accumulation
 * into dqkv: within 1e-5 (relative, Frobenius; measured about 1e-7). One
 * thread and two give the same bits. */
/* attn_pair_fini frees an attention comparison's inputs and its two runs'
 * outputs. */
static void attn_pair_fini(pt_tensor *qkv, pt_tensor *dout, pt_tensor out[2], pt_tensor lse[2],
                           pt_tensor dq[2])
{
	for (int k = 0; k < 2; k++) {
		pt_tensor_fini(&out[k]);
		pt_tensor_fini(&lse[k]);
		pt_tensor_fini(&dq[k]);
	}
	pt_tensor_fini(qkv);
	pt_tensor_fini(dout);
}

/* attention_vs_definition runs the kernel for B = 2 and each length against
 * attn_ref (see test_dispatch_attention_matches_definition). */
static void attention_vs_definition(int64_t C, int NH, const int64_t *lens, size_t nlens)
{
	enum { B = 2 };
	for (size_t n = 0; n < nlens; n++) {
		int64_t T = lens[n], BTC = B * T * C;
		pt_tensor qkv, dout, out, lse, dq, out1, lse1, dq1;
		double *ro = calloc((size_t)BTC, sizeof(double));
		double *rl = calloc((size_t)(B * NH * T), sizeof(double));
		double *rd = calloc((size_t)(3 * BTC), sizeof(double));
		int threads = omp_get_max_threads();

		PT_CHECK_OK(pt_tensor_init(&qkv, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
		PT_CHECK_OK(pt_tensor_init(&dout, PT_F32, 3, (int64_t[]){B, T, C}));
		fill_uniform(&qkv, 11 + (uint32_t)n);
		fill_uniform(&dout, 21 + (uint32_t)n);
		pt_tensor *t[] = {&out, &lse, &dq, &out1, &lse1, &dq1};
		for (int k = 0; k < 6; k += 3) {
			PT_CHECK_OK(pt_tensor_init(t[k], PT_F32, 3, (int64_t[]){B, T, C}));
			PT_CHECK_OK(pt_tensor_init(t[k + 1], PT_F32, 3, (int64_t[]){B, NH, T}));
			PT_CHECK_OK(pt_tensor_init(t[k + 2], PT_F32, 3, (int64_t[]){B, T, 3 * C}));
		}
		/* dqkv starts at 0.5 everywhere and is accumulated into */
		for (int64_t i = 0; i < 3 * BTC; i++) {
			pt_tensor_f32(&dq)[i] = 0.5f;
			rd[i] = 0.5;
		}
		attn_ref(pt_tensor_f32(&qkv), pt_tensor_f32(&dout), B, T, C, NH, ro, rl, rd);
		PT_CHECK_OK(pt_attention_forward(&out, &lse, &qkv, NH));
		PT_CHECK_OK(pt_attention_backward(&dq, &dout, &qkv, &lse, NH, true));
		CU_ASSERT(rel_err_ref(&out, ro) < 1e-5);
		CU_ASSERT(rel_err_ref(&lse, rl) < 1e-5);
		CU_ASSERT(rel_err_ref(&dq, rd) < 1e-5);
		printf("\n    hs %2" PRId64 ", T %3" PRId64 ": out %.1e, lse %.1e, dqkv %.1e", C / NH, T,
		       rel_err_ref(&out, ro), rel_err_ref(&lse, rl), rel_err_ref(&dq, rd));

		/* without accumulation: the same less the 0.5, on one thread */
		omp_set_num_threads(1);
		PT_CHECK_OK(pt_attention_forward(&out1, &lse1, &qkv, NH));
		PT_CHECK_OK(pt_attention_backward(&dq1, &dout, &qkv, &lse1, NH, false));
		omp_set_num_threads(threads);
		CU_ASSERT(same_bits(&out1, &out));
		CU_ASSERT(same_bits(&lse1, &lse));
		for (int64_t i = 0; i < 3 * BTC; i++)
			rd[i] -= 0.5;
		CU_ASSERT(rel_err_ref(&dq1, rd) < 1e-5);
		for (int k = 0; k < 6; k++)
			pt_tensor_fini(t[k]);
		pt_tensor_fini(&qkv);
		pt_tensor_fini(&dout);
		free(ro);
		free(rl);
		free(rd);
	}
}

static void test_dispatch_attention_matches_definition(void)
{
	const int64_t lens[] = {1, 5, 32, 33, 100};
	attention_vs_definition(24, 3, lens, sizeof(lens) / sizeof(lens[0]));
}

/* The fp32 kernel's AVX-512 register tiles (cpu_attn512.c; heads a multiple
 * of 16 wide) against the definition as above: heads 16, 64 and 96 wide (a
 * 64-column panel and a 32-column one), lengths across the 4-row tiles, the
 * 32-row strips, the 16-float vectors and the 64-key blocks (1 to 130), and
 * W2's shape (context 128, heads 64 wide). Then against the sgemm strips
 * (PIPETRAIN_ATTN_KERNELS=sgemm) at W2's shape: within 1e-6, not bitwise
 * (other sums in other orders; relative, Frobenius). Skips without AVX-512. */
static void test_dispatch_attention_avx512_tiles(void)
{
	const int64_t lens[] = {1, 3, 17, 33, 64, 65, 100, 130}, w2[] = {128};
	enum { B = 2, T = 128, C = 256, NH = 4 };
	pt_tensor qkv, dout, out[2], lse[2], dq[2];

	if (strcmp(pt_cpu_attention_kernel(), "avx512f") != 0) {
		printf("\n    skip: no AVX-512 here (attention runs %s)", pt_cpu_attention_kernel());
		return;
	}
	attention_vs_definition(32, 2, lens, sizeof(lens) / sizeof(lens[0]));
	attention_vs_definition(64, 1, lens, sizeof(lens) / sizeof(lens[0]));
	attention_vs_definition(192, 2, lens, sizeof(lens) / sizeof(lens[0]));
	attention_vs_definition(C, NH, w2, 1);

	PT_CHECK_OK(pt_tensor_init(&qkv, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
	PT_CHECK_OK(pt_tensor_init(&dout, PT_F32, 3, (int64_t[]){B, T, C}));
	fill_uniform(&qkv, 41);
	fill_uniform(&dout, 42);
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_tensor_init(&out[k], PT_F32, 3, (int64_t[]){B, T, C}));
		PT_CHECK_OK(pt_tensor_init(&lse[k], PT_F32, 3, (int64_t[]){B, NH, T}));
		PT_CHECK_OK(pt_tensor_init(&dq[k], PT_F32, 3, (int64_t[]){B, T, 3 * C}));
		pt_cpu_attention_select(k == 0);
		CU_ASSERT_STRING_EQUAL(pt_cpu_attention_kernel(), k == 0 ? "avx512f" : "sgemm");
		PT_CHECK_OK(pt_attention_forward(&out[k], &lse[k], &qkv, NH));
		PT_CHECK_OK(pt_attention_backward(&dq[k], &dout, &qkv, &lse[k], NH, false));
	}
	pt_cpu_attention_select(true);
	CU_ASSERT(rel_err(&out[0], &out[1]) < 1e-6);
	CU_ASSERT(rel_err(&lse[0], &lse[1]) < 1e-6);
	CU_ASSERT(rel_err(&dq[0], &dq[1]) < 1e-6);
	printf("\n    tiles vs sgemm (W2 shape): out %.1e, lse %.1e, dqkv %.1e",
	       rel_err(&out[0], &out[1]), rel_err(&lse[0], &lse[1]),
	       rel_err(&dq[0], &dq[1]));
	attn_pair_fini(&qkv, &dout, out, lse, dq);
}

/* An attention tape captured on a one-thread budget and replayed on a
 * four-thread one, with exactly the workspace the tape asks for: the kernel
 * starts no more threads than that workspace holds scores for (ASan sees
 * any write past it) and gives the captured run's bits. */
static void attention_replayed(int64_t C, int NH)
{
	enum { B = 2, T = 70 };
	pt_dispatcher *d = pt_dispatcher_current();
	pt_tensor qkv, dout, out, lse, dq, o0, l0, d0;
	pt_op_tape *tape;
	int threads = omp_get_max_threads();
	void *ws;

	PT_CHECK_OK(pt_tensor_init(&qkv, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
	PT_CHECK_OK(pt_tensor_init(&dout, PT_F32, 3, (int64_t[]){B, T, C}));
	PT_CHECK_OK(pt_tensor_init(&out, PT_F32, 3, (int64_t[]){B, T, C}));
	PT_CHECK_OK(pt_tensor_init(&lse, PT_F32, 3, (int64_t[]){B, NH, T}));
	PT_CHECK_OK(pt_tensor_init(&dq, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
	fill_uniform(&qkv, 31);
	fill_uniform(&dout, 32);
	PT_CHECK_OK(pt_op_tape_create(&tape));
	omp_set_num_threads(1);
	PT_CHECK_OK(pt_dispatcher_capture_begin(d, tape));
	PT_CHECK_OK(pt_attention_forward(&out, &lse, &qkv, NH));
	PT_CHECK_OK(pt_attention_backward(&dq, &dout, &qkv, &lse, NH, false));
	CU_ASSERT_PTR_EQUAL(pt_dispatcher_capture_end(d), tape);
	CU_ASSERT_EQUAL(pt_op_tape_len(tape), 2);
	PT_CHECK_OK(pt_tensor_init(&o0, PT_F32, 3, (int64_t[]){B, T, C}));
	PT_CHECK_OK(pt_tensor_init(&l0, PT_F32, 3, (int64_t[]){B, NH, T}));
	PT_CHECK_OK(pt_tensor_init(&d0, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
	PT_CHECK_OK(pt_tensor_transfer(&o0, &out));
	PT_CHECK_OK(pt_tensor_transfer(&l0, &lse));
	PT_CHECK_OK(pt_tensor_transfer(&d0, &dq));
	memset(pt_tensor_f32(&out), 0, sizeof(float) * B * T * C);
	memset(pt_tensor_f32(&dq), 0, sizeof(float) * B * T * 3 * C);
	ws = malloc(pt_op_tape_workspace(tape));
	CU_ASSERT_PTR_NOT_NULL_FATAL(ws);
	omp_set_num_threads(4);
	PT_CHECK_OK(pt_op_tape_replay(tape, ws));
	omp_set_num_threads(threads);
	CU_ASSERT(same_bits(&out, &o0));
	CU_ASSERT(same_bits(&lse, &l0));
	CU_ASSERT(same_bits(&dq, &d0));
	free(ws);
	pt_op_tape_destroy(tape);
	pt_tensor *t[] = {&qkv, &dout, &out, &lse, &dq, &o0, &l0, &d0};
	for (int k = 0; k < 8; k++)
		pt_tensor_fini(t[k]);
}

static void test_dispatch_attention_replayed_on_more_threads(void)
{
	attention_replayed(24, 3);
	attention_replayed(64, 2); /* heads 32 wide: the AVX-512 tiles where the CPU has them */
}

/* Attention in bf16 (its four products; softmax in f32): output and input
 * gradient within 2e-2 of fp32 (relative, Frobenius). */
static void test_bf16_attention(void)
{
	enum { B = 2, T = 16, C = 32, NH = 4 };
	pt_tensor qkv, dout, out[2], att[2], dq[2];

	PT_CHECK_OK(pt_tensor_init(&qkv, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
	PT_CHECK_OK(pt_tensor_init(&dout, PT_F32, 3, (int64_t[]){B, T, C}));
	fill_uniform(&qkv, 5);
	fill_uniform(&dout, 6);
	for (int k = 0; k < 2; k++) {
		pt_set_precision(k ? PT_PREC_BF16 : PT_PREC_FP32);
		PT_CHECK_OK(pt_tensor_init(&out[k], PT_F32, 3, (int64_t[]){B, T, C}));
		PT_CHECK_OK(pt_tensor_init(&att[k], PT_F32, 3, (int64_t[]){B, NH, T}));
		PT_CHECK_OK(pt_tensor_init(&dq[k], PT_F32, 3, (int64_t[]){B, T, 3 * C}));
		PT_CHECK_OK(pt_attention_forward(&out[k], &att[k], &qkv, NH));
		PT_CHECK_OK(pt_attention_backward(&dq[k], &dout, &qkv, &att[k], NH, false));
	}
	pt_set_precision(PT_PREC_FP32);
	CU_ASSERT(!same_bits(&out[1], &out[0]));
	CU_ASSERT(rel_err(&out[1], &out[0]) < 2e-2);
	CU_ASSERT(rel_err(&att[1], &att[0]) < 2e-2);
	CU_ASSERT(rel_err(&dq[1], &dq[0]) < 2e-2);
	printf("\n    attention bf16 vs fp32: out %.2e, lse %.2e, dqkv %.2e",
	       rel_err(&out[1], &out[0]), rel_err(&att[1], &att[0]), rel_err(&dq[1], &dq[0]));
	attn_pair_fini(&qkv, &dout, out, att, dq);
}

/* Attention's native bf16 kernels against the emulation: the same rounded
 * operands, sums in another order - within 1e-4 (relative, Frobenius) for
 * the output, lse and dqkv, set and accumulated. Not 1e-5 as for a Linear:
 * probabilities are rounded to bf16 between products, and a last-bit
 * difference in f32 moves a few across a rounding boundary (2^-8 of that
 * element): at T 256 one dv row of one head differs by ~1e-4, 1.2e-5 over
 * all of dqkv. Both native kernels: the AVX512_BF16 tiles (heads a multiple
 * of 32 wide, any context; odd contexts end on a half pair) and oneDNN's
 * strips (PIPETRAIN_ATTN_KERNELS=sgemm, or heads 16 wide; contexts to 256,
 * the emulation bit for bit above). */
static void bf16_attention_native_vs_emulated(int64_t C, int NH, bool tiles)
{
	enum { B = 2 };
	const int64_t Ts[] = {1, 3, 16, 17, 33, 100, 256, 300};

	pt_cpu_attention_select(tiles);
	for (int t = 0; t < 8; t++) {
		int64_t T = Ts[t];
		bool on_tiles = tiles && cpu_attnbf16_usable(C / NH);
		pt_tensor qkv, dout, out[2], lse[2], dq[2];
		PT_CHECK_OK(pt_tensor_init(&qkv, PT_F32, 3, (int64_t[]){B, T, 3 * C}));
		PT_CHECK_OK(pt_tensor_init(&dout, PT_F32, 3, (int64_t[]){B, T, C}));
		fill_uniform(&qkv, 11 + (uint32_t)t);
		fill_uniform(&dout, 21 + (uint32_t)t);
		pt_set_precision(PT_PREC_BF16);
		for (int k = 0; k < 2; k++) {
			pt_cpu_bf16_select(k ? PT_BF16_EMULATED : PT_BF16_NATIVE);
			PT_CHECK_OK(pt_tensor_init(&out[k], PT_F32, 3, (int64_t[]){B, T, C}));
			PT_CHECK_OK(pt_tensor_init(&lse[k], PT_F32, 3, (int64_t[]){B, NH, T}));
			PT_CHECK_OK(pt_tensor_init(&dq[k], PT_F32, 3, (int64_t[]){B, T, 3 * C}));
			PT_CHECK_OK(pt_attention_forward(&out[k], &lse[k], &qkv, NH));
			PT_CHECK_OK(pt_attention_backward(&dq[k], &dout, &qkv, &lse[k], NH, false));
			/* and accumulated: dqkv twice over */
			PT_CHECK_OK(pt_attention_backward(&dq[k], &dout, &qkv, &lse[k], NH, true));
		}
		pt_cpu_bf16_select(PT_BF16_AUTO);
		pt_set_precision(PT_PREC_FP32);
		if (T <= 256 || on_tiles) {
			CU_ASSERT(rel_err(&out[0], &out[1]) <= 1e-4);
			CU_ASSERT(rel_err(&lse[0], &lse[1]) <= 1e-4);
			CU_ASSERT(rel_err(&dq[0], &dq[1]) <= 1e-4);
			printf(
			    "\n    %s hs %ld T %3ld native vs emulated: out %.2e, lse %.2e, dqkv "
			    "%.2e",
			    on_tiles ? "tiles " : "onednn", (long)(C / NH), (long)T,
			    rel_err(&out[0], &out[1]), rel_err(&lse[0], &lse[1]),
			    rel_err(&dq[0], &dq[1]));
		} else {
			CU_ASSERT(same_bits(&out[0], &out[1]));
			CU_ASSERT(same_bits(&lse[0], &lse[1]));
			CU_ASSERT(same_bits(&dq[0], &dq[1]));
		}
		for (int k = 0; k < 2; k++) {
			pt_tensor_fini(&out[k]);
			pt_tensor_fini(&lse[k]);
			pt_tensor_fini(&dq[k]);
		}
		pt_tensor_fini(&qkv);
		pt_tensor_fini(&dout);
	}
	pt_cpu_attention_select(true);
}

static void test_bf16_attention_native_matches_emulation(void)
{
	const char *impl = NULL;

	(void)pt_cpu_bf16_native(&impl);
	if (strcmp(impl, "unavailable") == 0) {
		printf("\n    skip: no native bf16 kernels on this CPU");
		return;
	}
	if (!cpu_attnbf16_usable(32))
		printf("\n    no AVX512_BF16 tiles here: oneDNN's strips only");
	bf16_attention_native_vs_emulated(64, 2, true);   /* hs 32 */
	bf16_attention_native_vs_emulated(128, 2, true);  /* hs 64 */
	bf16_attention_native_vs_emulated(192, 2, true);  /* hs 96: 4 + 2 vectors a row */
	bf16_attention_native_vs_emulated(32, 2, true);   /* hs 16: oneDNN's strips */
	bf16_attention_native_vs_emulated(128, 2, false); /* the strips, kept */
	CU_ASSERT_STRING_EQUAL(pt_cpu_attention_bf16_kernel(),
	                       cpu_attnbf16_usable(32) ? "avx512_bf16" : "onednn");
}

/* The bias gradient sums each column in row order: the same bits as a plain
 * loop on one thread or two, at a size the kernels split (N x O = 700 x 1000,
 * columns not a multiple of 16), in fp32 and from the native bf16 Linear,
 * which sums while packing dy; and added to a db that holds values. */
static void test_bias_grad_rows_in_order(void)
{
	enum { N = 700, I = 48, O = 1000 };
	pt_tensor x, w, b, dy;
	float *want = calloc(O, sizeof(float)), *got = calloc(O, sizeof(float));
	int prev = pt_get_num_threads();

	CU_ASSERT_PTR_NOT_NULL_FATAL(want);
	CU_ASSERT_PTR_NOT_NULL_FATAL(got);
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){N, I}));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 2, (int64_t[]){O, I}));
	PT_CHECK_OK(pt_tensor_init(&b, PT_F32, 1, (int64_t[]){O}));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){N, O}));
	fill_uniform(&x, 31);
	fill_uniform(&w, 32);
	fill_uniform(&b, 33);
	fill_uniform(&dy, 34);
	const float *g = pt_tensor_f32(&dy);
	for (int64_t r = 0; r < N; r++)
		for (int64_t j = 0; j < O; j++)
			want[j] += g[r * O + j];
	for (int t = 1; t <= 2; t++) {
		pt_set_num_threads(t);
		memset(got, 0, sizeof(float) * O);
		cpu_bias_grad(g, got, N, O);
		CU_ASSERT_EQUAL(memcmp(got, want, sizeof(float) * O), 0);
		for (int k = 0; k < 2; k++) { /* fp32, then bf16 (native where it runs) */
			lin o;
			pt_set_precision(k ? PT_PREC_BF16 : PT_PREC_FP32);
			linear_run(&x, &w, &b, &dy, &o);
			pt_set_precision(PT_PREC_FP32);
			CU_ASSERT_EQUAL(memcmp(pt_tensor_f32(&o.db), want, sizeof(float) * O), 0);
			lin_fini(&o);
		}
	}
	/* It adds to db: from the bias's values, column sums continue in row
	 * order (the columns a thread sums in registers and the rest). */
	for (int64_t j = 0; j < O; j++)
		want[j] = got[j] = pt_tensor_f32(&b)[j];
	for (int64_t r = 0; r < N; r++)
		for (int64_t j = 0; j < O; j++)
			want[j] += g[r * O + j];
	pt_set_num_threads(2);
	cpu_bias_grad(g, got, N, O);
	CU_ASSERT_EQUAL(memcmp(got, want, sizeof(float) * O), 0);
	pt_set_num_threads(prev);
	pt_tensor_fini(&x);
	pt_tensor_fini(&w);
	pt_tensor_fini(&b);
	pt_tensor_fini(&dy);
	free(want);
	free(got);
}

static const pt_test_case bf16_tests[] = {
    {"test_bf16_rounding", test_bf16_rounding},
    {"test_bf16_pack_hw_matches_rule", test_bf16_pack_hw_matches_rule},
    {"test_activation_wide_bitwise", test_activation_wide_bitwise},
    {"test_bf16_linear", test_bf16_linear},
    {"test_bf16_activation_inputs", test_bf16_activation_inputs},
    {"test_bf16_native_matches_emulation", test_bf16_native_matches_emulation},
    {"test_bias_grad_rows_in_order", test_bias_grad_rows_in_order},
    {"test_tf32_rounding", test_tf32_rounding},
    {"test_tf32_linear", test_tf32_linear},
    {"test_bf16_attention", test_bf16_attention},
    {"test_bf16_attention_native_matches_emulation", test_bf16_attention_native_matches_emulation},
    {NULL, NULL},
};

static const pt_test_case eager_tests[] = {
    {"test_dispatch_cpu_expf_non_finite", test_dispatch_cpu_expf_non_finite},
    {"test_dispatch_eager_runs_at_once", test_dispatch_eager_runs_at_once},
    {"test_dispatch_eager_failure_reports", test_dispatch_eager_failure_reports},
    {"test_dispatch_attention_matches_definition", test_dispatch_attention_matches_definition},
    {"test_dispatch_attention_avx512_tiles", test_dispatch_attention_avx512_tiles},
    {"test_dispatch_attention_replayed_on_more_threads",
     test_dispatch_attention_replayed_on_more_threads},
    {"test_dispatch_gemm_padding_is_bitwise", test_dispatch_gemm_padding_is_bitwise},
    {"test_dispatch_gemm_prim_threads_bitwise", test_dispatch_gemm_prim_threads_bitwise},
    {NULL, NULL},
};

static const pt_test_case deferred_tests[] = {
    {"test_dispatch_deferred_queues_until_flush", test_dispatch_deferred_queues_until_flush},
    {"test_dispatch_nested_scopes_flush_at_outermost",
     test_dispatch_nested_scopes_flush_at_outermost},
    {"test_dispatch_sync_boundaries_flush", test_dispatch_sync_boundaries_flush},
    {"test_dispatch_backward_is_a_sync_boundary", test_dispatch_backward_is_a_sync_boundary},
    {"test_dispatch_failure_aborts_clears_invalidates",
     test_dispatch_failure_aborts_clears_invalidates},
    {"test_dispatch_shape_errors_at_meta_time", test_dispatch_shape_errors_at_meta_time},
    {"test_dispatch_queue_keeps_storage_alive", test_dispatch_queue_keeps_storage_alive},
    {"test_dispatch_eager_equals_deferred_mlp_step", test_dispatch_eager_equals_deferred_mlp_step},
    {"test_dispatch_eager_equals_deferred_gpt_step", test_dispatch_eager_equals_deferred_gpt_step},
    {NULL, NULL},
};

int main(void)
{
	const pt_test_suite suites[] = {
	    {"dispatch_eager", eager_tests},
	    {"dispatch_deferred", deferred_tests},
	    {"bf16", bf16_tests},
	    {NULL, NULL},
	};
	return pt_test_main(suites);
}
