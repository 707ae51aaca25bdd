/* test_model.c - model building, state_dict names, and checkpoints: bitwise
 * save/load, resume equals uninterrupted training, PyTorch loads our file. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fileio.h"
#include "ops.h"
#include "rng.h"
#include "pt_test.h"
#include "safetensors.h"
#include "sha256.h"
#include "train.h"

static const pt_layer_spec mlp[] = {
    {.kind = PT_LAYER_LINEAR, .in_features = 8, .out_features = 16, .bias = true},
    {.kind = PT_LAYER_RELU},
    {.kind = PT_LAYER_LINEAR, .in_features = 16, .out_features = 3, .bias = true},
};

typedef struct rig {
	pt_model *m;
	pt_optimizer *o;
	pt_trainer *t;
} rig;

static void rig_make(rig *r, uint64_t seed)
{
	pt_model_config cfg = {.batch = 4, .input = {PT_F32, 0, 8}, .n_slots = 1, .seed = seed};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-2f);
	PT_CHECK_OK(pt_model_create(&r->m, mlp, 3, 0, 3, &cfg));
	PT_CHECK_OK(pt_optimizer_create(&r->o, &oc, pt_model_params(r->m), pt_model_grads(r->m)));
	PT_CHECK_OK(pt_trainer_create(&r->t, r->m, r->o, PT_LOSS_CROSS_ENTROPY, -1));
}

static void rig_free(rig *r)
{
	pt_trainer_destroy(r->t);
	pt_optimizer_destroy(r->o);
	pt_model_destroy(r->m);
}

static void batch(pt_tensor *x, pt_tensor *y, int step)
{
	pt_rng g;
	PT_CHECK_OK(pt_tensor_init(x, PT_F32, 2, (int64_t[]){8, 8}));
	PT_CHECK_OK(pt_tensor_init(y, PT_I64, 1, (int64_t[]){8}));
	pt_rng_init(&g, 100, (uint64_t)step);
	pt_rng_normal(&g, pt_tensor_f32(x), 64, 0.0f, 1.0f);
	for (int i = 0; i < 8; i++)
		((int64_t *)pt_tensor_data(y))[i] = pt_rng_u32(&g) % 3;
}

static void steps(rig *r, int from, int to)
{
	for (int s = from; s < to; s++) {
		pt_tensor x, y;
		pt_step_result res;
		batch(&x, &y, s);
		PT_CHECK_OK(pt_trainer_step(r->t, &x, &y, 2, (uint64_t)s, &res));
		pt_tensor_fini(&x);
		pt_tensor_fini(&y);
	}
}

/* Client sizes whose parameter count overflows int64 are an error, not
 * undefined behaviour (UBSan) and a wrapped, too small arena. */
static void test_model_param_overflow(void)
{
	const pt_layer_spec huge[] = {
	    {.kind = PT_LAYER_LINEAR,
	     .in_features = INT64_C(1) << 32,
	     .out_features = INT64_C(1) << 32,
	     .bias = true},
	};
	const pt_layer_spec two[] = {
	    {.kind = PT_LAYER_LINEAR, .in_features = 8, .out_features = INT64_C(1) << 30},
	    {.kind = PT_LAYER_LINEAR,
	     .in_features = INT64_C(1) << 30,
	     .out_features = INT64_C(1) << 31},
	};
	pt_model_config cfg = {.batch = 1, .input = {PT_F32, 0, INT64_C(1) << 32}, .n_slots = 1};
	pt_model *m = NULL;

	PT_CHECK_ERR_MSG(pt_model_create(&m, huge, 1, 0, 1, &cfg), PT_ERR_OVERFLOW,
	                 "layer 0 (linear): parameter weight: 4294967296 x 4294967296 floats "
	                 "overflow the parameter arena");
	CU_ASSERT_PTR_NULL(m);
	/* Each fits; their sum (2^61 + 2^33 floats, x4 bytes) does not. */
	cfg.input.features = 8;
	PT_CHECK_ERR_MSG(pt_model_create(&m, two, 2, 0, 2, &cfg), PT_ERR_OVERFLOW,
	                 "layer 1 (linear): parameter weight: 2147483648 x 1073741824 floats");
	CU_ASSERT_PTR_NULL(m);
}

static void test_model_state_dict_names(void)
{
	rig r;
	const char *want[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
	const int64_t shapes[][2] = {{16, 8}, {16, 0}, {3, 16}, {3, 0}};
	rig_make(&r, 1);
	CU_ASSERT_EQUAL_FATAL(pt_model_num_tensors(r.m), 4);
	for (int i = 0; i < 4; i++) {
		const char *name;
		pt_tensor *p, *g;
		PT_CHECK_OK(pt_model_tensor(r.m, i, &name, &p, &g));
		CU_ASSERT_STRING_EQUAL(name, want[i]);
		CU_ASSERT_EQUAL(p->shape[0], shapes[i][0]);
		if (shapes[i][1])
			CU_ASSERT_EQUAL(p->shape[1], shapes[i][1]);
	}
	CU_ASSERT_EQUAL(pt_model_num_params(r.m), 16 * 8 + 16 + 3 * 16 + 3);
	rig_free(&r);
}

static void test_model_stage_weights_match_full_model(void)
{
	/* Layers [2, 3) built alone get the same initial weights as in the full model. */
	pt_model_config cfg = {.batch = 4, .input = {PT_F32, 0, 8}, .n_slots = 1, .seed = 9};
	pt_model *full, *stage, *bad;
	pt_tensor *a, *b;
	PT_CHECK_OK(pt_model_create(&full, mlp, 3, 0, 3, &cfg));
	PT_CHECK_OK(pt_model_create(&stage, mlp, 3, 2, 3, &cfg));
	PT_CHECK_OK(pt_model_tensor(full, 2, NULL, &a, NULL));
	PT_CHECK_OK(pt_model_tensor(stage, 0, NULL, &b, NULL));
	CU_ASSERT_EQUAL(memcmp(pt_tensor_data(a), pt_tensor_data(b), pt_tensor_nbytes(a)), 0);
	PT_CHECK_ERR(pt_model_create(&bad, mlp, 3, 2, 2, &cfg), PT_ERR_RANGE);
	CU_ASSERT_PTR_NULL(bad);
	pt_model_destroy(full);
	pt_model_destroy(stage);
}

/* resident counts the pages of [p, p + n) in memory (p page-aligned). */
static size_t resident(const void *p, size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), np = (n + page - 1) / page, k = 0;
	unsigned char *v = malloc(np);
	if (v == NULL || mincore((void *)p, n, v) != 0) {
		free(v);
		return (size_t)-1;
	}
	for (size_t i = 0; i < np; i++)
		k += v[i] & 1;
	free(v);
	return k;
}

static bool all_zero(const pt_tensor *t)
{
	const float *f = pt_tensor_f32((pt_tensor *)t);
	for (int64_t i = 0; i < pt_tensor_numel(t); i++)
		if (f[i] != 0.0f)
			return false;
	return true;
}

/* A training stage's model (prefault_slots > 0) has its gradient arena in
 * memory from its creation, and AdamW's state from the optimizer's; the
 * weights are the same bits as without, the rest still zero. Only mapped
 * arenas (32 MiB and more, not under AddressSanitizer) start out of memory:
 * malloc'd ones are zeroed, so resident anyway. */
static void test_model_prefault_keeps_bits(void)
{
	static const pt_layer_spec big[] = {
	    {.kind = PT_LAYER_LINEAR, .in_features = 2048, .out_features = 8192, .bias = true}};
	pt_model_config cfg = {.batch = 1, .input = {PT_F32, 0, 2048}, .n_slots = 1, .seed = 5};
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-3f);
	size_t page = (size_t)sysconf(_SC_PAGESIZE), n, pages;
	pt_model *plain, *pre;
	pt_optimizer *o;
	pt_tensor *g, *state[4];
	const char *names[4];
	int ns;

	PT_CHECK_OK(pt_model_create(&plain, big, 1, 0, 1, &cfg));
	g = pt_model_grads(plain);
	n = pt_tensor_nbytes(g);
	pages = (n + page - 1) / page;
	if (g->storage->mapped == 0) {
		printf("\n    skip: arenas come from malloc in this build (AddressSanitizer)");
		pt_model_destroy(plain);
		return;
	}
	CU_ASSERT_EQUAL(resident(pt_tensor_data(g), n), 0);
	cfg.prefault_slots = 1;
	PT_CHECK_OK(pt_model_create(&pre, big, 1, 0, 1, &cfg));
#ifdef MADV_POPULATE_WRITE
	if (resident(pt_tensor_data(pt_model_grads(pre)), n) == 0) {
		printf("\n    skip: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)");
	} else {
		CU_ASSERT_EQUAL(resident(pt_tensor_data(pt_model_grads(pre)), n), pages);
		PT_CHECK_OK(
		    pt_optimizer_create(&o, &oc, pt_model_params(pre), pt_model_grads(pre)));
		ns = pt_optimizer_state(o, names, state);
		CU_ASSERT_EQUAL(ns, 2); /* m, v */
		for (int i = 0; i < ns; i++) {
			CU_ASSERT_EQUAL(resident(pt_tensor_data(state[i]), n), pages);
			CU_ASSERT(all_zero(state[i]));
		}
		pt_optimizer_destroy(o);
	}
#endif
	CU_ASSERT_EQUAL(
	    memcmp(pt_tensor_data(pt_model_params(plain)), pt_tensor_data(pt_model_params(pre)), n),
	    0);
	CU_ASSERT(all_zero(pt_model_grads(pre)));
	pt_model_destroy(plain);
	pt_model_destroy(pre);
}

static void test_model_checkpoint_roundtrip_and_resume(void)
{
	char dir[] = "/tmp/pt-model-XXXXXX", path[256], spath[300];
	rig a, b, c;
	pt_checkpoint_info info = {.step = 5}, got;
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/ck.safetensors", dir);
	snprintf(spath, sizeof(spath), "%s.state", path);
	snprintf(info.job, sizeof(info.job), "job-1");

	/* a: 10 steps straight. b: 5 steps, save. c: load, 5 more steps. */
	rig_make(&a, 3);
	rig_make(&b, 3);
	rig_make(&c, 4); /* different seed: everything must come from the file */
	steps(&a, 0, 10);
	steps(&b, 0, 5);
	PT_CHECK_OK(pt_checkpoint_save(path, b.m, b.o, &info));
	PT_CHECK_OK(pt_checkpoint_load(path, c.m, c.o, &got));
	CU_ASSERT_STRING_EQUAL(got.job, "job-1");
	CU_ASSERT_EQUAL(got.step, 5);
	CU_ASSERT_EQUAL(pt_optimizer_steps(c.o), 5);
	CU_ASSERT_EQUAL(memcmp(pt_tensor_data(pt_model_params(b.m)),
	                       pt_tensor_data(pt_model_params(c.m)),
	                       pt_tensor_nbytes(pt_model_params(b.m))),
	                0);
	steps(&c, 5, 10);
	CU_ASSERT_EQUAL(memcmp(pt_tensor_data(pt_model_params(a.m)),
	                       pt_tensor_data(pt_model_params(c.m)),
	                       pt_tensor_nbytes(pt_model_params(a.m))),
	                0);
	/* The weights file holds exactly the state_dict, with our metadata. */
	{
		pt_safetensors *st;
		PT_CHECK_OK(pt_safetensors_open(&st, path));
		CU_ASSERT_EQUAL(pt_safetensors_count(st), 4);
		CU_ASSERT_STRING_EQUAL(pt_safetensors_meta(st, "step"), "5");
		CU_ASSERT_STRING_EQUAL(pt_safetensors_meta(st, "schema_version"), "1");
		CU_ASSERT_PTR_NOT_NULL(pt_safetensors_meta(st, "data_sha256"));
		pt_safetensors_destroy(st);
	}
	/* PyTorch loads it into the equivalent nn.Sequential, strictly. */
	if (system("/usr/bin/python3 -c 'import torch, safetensors' 2>/dev/null") == 0 ||
	    system("/usr/bin/python3 -c 'import torch' 2>/dev/null") == 0) {
		char cmd[1024];
		snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s %s",
		         pt_test_path("tests/data/torch_load.py"), path);
		CU_ASSERT_EQUAL(system(cmd), 0);
	} else {
		printf(
		    "\n    skip: /usr/bin/python3 cannot import torch; PyTorch load not checked\n");
	}
	/* A model of another shape is refused with the tensor's name. */
	{
		pt_layer_spec other[] = {pt_linear(8, 15), pt_activation(PT_LAYER_RELU),
		                         pt_linear(15, 3)};
		pt_model_config cfg = {.batch = 4, .input = {PT_F32, 0, 8}, .n_slots = 1};
		pt_model *m;
		PT_CHECK_OK(pt_model_create(&m, other, 3, 0, 3, &cfg));
		CU_ASSERT_NOT_EQUAL(pt_checkpoint_load(path, m, NULL, NULL), PT_OK);
		CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "0.weight"));
		pt_model_destroy(m);
	}
	unlink(spath);
	unlink(path);
	rmdir(dir);
	rig_free(&a);
	rig_free(&b);
	rig_free(&c);
}

/* same_bits compares two f32 tensors' bytes. */
static bool same_bits(const pt_tensor *a, const pt_tensor *b)
{
	return pt_tensor_nbytes(a) == pt_tensor_nbytes(b) &&
	       memcmp(pt_tensor_data(a), pt_tensor_data(b), pt_tensor_nbytes(a)) == 0;
}

/* split_matches_fused runs two microbatches through a fused model and a
 * split one (inputs of both, then weights of both, in microbatch order) and
 * asserts the same input gradients and parameter gradients, bitwise. */
static void split_matches_fused(const pt_layer_spec *layers, int n, pt_act_shape in,
                                int64_t first_layer, const char *what)
{
	pt_model_config cfg = {.batch = 3, .input = in, .n_slots = 2, .seed = 11};
	pt_model *fused, *split;
	pt_tensor x[2], dy[2];
	const pt_tensor *y, *dx_f[2] = {NULL, NULL}, *dx_s;
	pt_tensor keep[2];
	pt_rng g;
	int64_t T = in.seq ? in.seq : 1;

	PT_CHECK_OK(pt_model_create(&fused, layers, n, (int)first_layer, n, &cfg));
	cfg.split_backward = true;
	PT_CHECK_OK(pt_model_create(&split, layers, n, (int)first_layer, n, &cfg));
	pt_rng_init(&g, 5, 0);
	for (int k = 0; k < 2; k++) {
		if (in.dtype == PT_I64) {
			PT_CHECK_OK(pt_tensor_init(&x[k], PT_I64, 2, (int64_t[]){3, T}));
			for (int64_t i = 0; i < 3 * T; i++)
				((int64_t *)pt_tensor_data(&x[k]))[i] = pt_rng_u32(&g) % 11;
		} else if (in.seq) {
			PT_CHECK_OK(
			    pt_tensor_init(&x[k], PT_F32, 3, (int64_t[]){3, T, in.features}));
			pt_rng_normal(&g, pt_tensor_f32(&x[k]), pt_tensor_numel(&x[k]), 0.0f, 1.0f);
		} else {
			PT_CHECK_OK(pt_tensor_init(&x[k], PT_F32, 2, (int64_t[]){3, in.features}));
			pt_rng_normal(&g, pt_tensor_f32(&x[k]), pt_tensor_numel(&x[k]), 0.0f, 1.0f);
		}
		PT_CHECK_OK(pt_model_forward(fused, k, &x[k], &y, true, 1, (uint64_t)k));
		PT_CHECK_OK(pt_tensor_init(&dy[k], PT_F32, y->ndim, y->shape));
		pt_rng_normal(&g, pt_tensor_f32(&dy[k]), pt_tensor_numel(&dy[k]), 0.0f, 1.0f);
		PT_CHECK_OK(pt_model_forward(split, k, &x[k], &y, true, 1, (uint64_t)k));
	}
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_model_backward(fused, k, &dy[k], &dx_f[k]));
		memset(&keep[k], 0, sizeof(keep[k]));
		if (dx_f[k] != NULL) {
			PT_CHECK_OK(
			    pt_tensor_init(&keep[k], PT_F32, dx_f[k]->ndim, dx_f[k]->shape));
			PT_CHECK_OK(pt_copy(&keep[k], dx_f[k]));
		}
	}
	CU_ASSERT_NOT_EQUAL(pt_model_backward_weight(fused, 0), PT_OK); /* not split */
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_model_backward_input(split, k, &dy[k], &dx_s));
		CU_ASSERT_EQUAL(dx_s == NULL, dx_f[k] == NULL);
		if (dx_s != NULL && !same_bits(dx_s, &keep[k])) {
			fprintf(stderr, "%s: microbatch %d: input gradients differ\n", what, k);
			CU_FAIL("input gradients differ");
		}
	}
	/* The input parts alone leave the parameter gradients untouched. */
	for (int64_t i = 0; i < pt_tensor_numel(pt_model_grads(split)); i++)
		if (pt_tensor_f32(pt_model_grads(split))[i] != 0.0f) {
			CU_FAIL("an input part touched the parameter gradients");
			break;
		}
	for (int k = 0; k < 2; k++)
		PT_CHECK_OK(pt_model_backward_weight(split, k));
	if (!same_bits(pt_model_grads(split), pt_model_grads(fused))) {
		fprintf(stderr, "%s: parameter gradients differ\n", what);
		CU_FAIL("parameter gradients differ");
	}
	for (int k = 0; k < 2; k++) {
		pt_tensor_fini(&x[k]);
		pt_tensor_fini(&dy[k]);
		pt_tensor_fini(&keep[k]);
	}
	pt_model_destroy(fused);
	pt_model_destroy(split);
}

/* A split backward (input gradients, then weight gradients later, as
 * zero-bubble schedules run them) gives the fused backward's bits for every
 * layer kind with parameters: an MLP stage with LayerNorm and dropout, a
 * GPT stage (Embedding, Attention, TransformerBlock, LayerNorm, Linear),
 * and a middle GPT stage whose input has a gradient. */
static void test_model_split_backward_matches_fused(void)
{
	const pt_layer_spec mlp_ln[] = {
	    {.kind = PT_LAYER_LINEAR, .in_features = 8, .out_features = 16, .bias = true},
	    {.kind = PT_LAYER_GELU},
	    pt_layernorm(16),
	    pt_dropout(0.25f),
	    {.kind = PT_LAYER_LINEAR, .in_features = 16, .out_features = 3, .bias = false},
	};
	pt_layer_spec gpt[] = {pt_embedding(11, 8, 6), pt_attention(8, 2), pt_block(8, 2),
	                       pt_block(8, 2),         pt_layernorm(8),    pt_linear(8, 11)};
	split_matches_fused(mlp_ln, 5, (pt_act_shape){PT_F32, 0, 8}, 0, "mlp");
	split_matches_fused(gpt, 6, (pt_act_shape){PT_I64, 6, 0}, 0, "gpt");
	/* Layers 2.. of the GPT: f32 (B, T, C) input, so the first block's dx too. */
	split_matches_fused(gpt + 2, 4, (pt_act_shape){PT_F32, 6, 8}, 0, "gpt middle");
}

/* same_file reports whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
	void *x = NULL, *y = NULL;
	size_t nx = 0, ny = 0;
	bool same = pt_file_read(a, SIZE_MAX, &x, &nx) == PT_OK &&
	            pt_file_read(b, SIZE_MAX, &y, &ny) == PT_OK && nx == ny &&
	            memcmp(x, y, nx) == 0;
	free(x);
	free(y);
	return same;
}

/* pt_checkpoint_save_pair writes, byte for byte, what the .state writer and
 * pt_checkpoint_save_tensors write one after the other, and lists the
 * weights file's SHA-256 and size. Layouts: 0 the weights leading one state
 * (their hash a copy of the state's), 1 split over two states, 2 all of one
 * state, 3 longer than the state; sizes not whole 64-byte blocks, large
 * enough for O_DIRECT and the 4096-byte header. */
static void test_checkpoint_save_pair(void)
{
	enum { W = 2200003 }; /* 8.8 MB of weights: O_DIRECT, a 4096-byte header */
	static const char *const snames[2] = {"stage0.state", "stage1.state"};
	static const char *const wnames[6] = {"w0", "w1", "w2", "w3", "w4", "w5"};
	const int64_t cut[] = {0, 77, 1100001, W}; /* the weights' tensors within W */
	char dir[] = "/tmp/pt_pairXXXXXX";
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	for (int lay = 0; lay < 4; lay++) {
		/* A state: its weights, then two optimizer buffers (3 W values);
		 * layout 2: the weights alone; 3: 100 values, and the weights in
		 * a buffer of their own. */
		int64_t ns = lay == 1 ? 2 : 1, len = lay == 2 ? W : lay == 3 ? 100 : 3 * W;
		pt_tensor states[2], own, views[6];
		pt_st_tensor st[2], wts[6];
		char path[256], ref[256], refs[300], spath[300];
		char hex[PT_SHA256_HEX], rhex[PT_SHA256_HEX], fhex[PT_SHA256_HEX];
		uint64_t size = 0, rsize = 0;
		size_t nw = 0;
		pt_rng g;
		pt_checkpoint_info info = {.step = 7};
		pt_st_meta smeta[] = {{"format", "pipetrain"}, {"stages", "2"}};
		snprintf(info.job, sizeof(info.job), "pair-%d", lay);
		pt_rng_init(&g, 5, (uint64_t)lay);
		for (int64_t k = 0; k < ns; k++) {
			PT_CHECK_OK(pt_tensor_init(&states[k], PT_F32, 1, (int64_t[]){len}));
			pt_rng_normal(&g, pt_tensor_f32(&states[k]), len, 0.0f, 1.0f);
			st[k] = (pt_st_tensor){snames[k], &states[k]};
		}
		PT_CHECK_OK(pt_tensor_init(&own, PT_F32, 1, (int64_t[]){W}));
		pt_rng_normal(&g, pt_tensor_f32(&own), W, 0.0f, 1.0f);
		for (int64_t k = 0; k < ns; k++)
			for (int c = 0; c < 3; c++, nw++) {
				const pt_tensor *base = lay == 3 ? &own : &states[k];
				PT_CHECK_OK(pt_tensor_init_on(
				    &views[nw], base->storage, (size_t)(base->offset + cut[c]) * 4,
				    PT_F32, 1, (int64_t[]){cut[c + 1] - cut[c]}));
				wts[nw] = (pt_st_tensor){wnames[nw], &views[nw]};
			}
		snprintf(path, sizeof(path), "%s/pair%d.safetensors", dir, lay);
		snprintf(spath, sizeof(spath), "%s.state", path);
		snprintf(ref, sizeof(ref), "%s/ref%d.safetensors", dir, lay);
		snprintf(refs, sizeof(refs), "%s.state", ref);
		PT_CHECK_OK(pt_checkpoint_save_pair(path, wts, nw, &info, st, (size_t)ns, smeta, 2,
		                                    hex, &size));
		PT_CHECK_OK(pt_safetensors_write(refs, st, (size_t)ns, smeta, 2));
		PT_CHECK_OK(pt_checkpoint_save_tensors(ref, wts, nw, &info, rhex, &rsize));
		CU_ASSERT(same_file(path, ref));
		CU_ASSERT(same_file(spath, refs));
		CU_ASSERT_STRING_EQUAL(hex, rhex);
		CU_ASSERT_EQUAL(size, rsize);
		CU_ASSERT_EQUAL(size, 4096 + 4 * (uint64_t)W * (uint64_t)ns);
		{
			void *data = NULL;
			size_t n = 0;
			uint8_t d[PT_SHA256_BYTES];
			PT_CHECK_OK(pt_file_read(path, SIZE_MAX, &data, &n));
			pt_sha256(data, n, d);
			pt_sha256_hex(d, fhex);
			CU_ASSERT_STRING_EQUAL(fhex, hex);
			free(data);
		}
		for (int f = 0; f < 2; f++) { /* the reader checks each data_sha256 */
			pt_safetensors *sf;
			PT_CHECK_OK(pt_safetensors_open(&sf, f ? spath : path));
			CU_ASSERT_EQUAL(pt_safetensors_count(sf), f ? (size_t)ns : nw);
			pt_safetensors_destroy(sf);
		}
		unlink(path), unlink(spath), unlink(ref), unlink(refs);
		for (size_t k = 0; k < nw; k++)
			pt_tensor_fini(&views[k]);
		for (int64_t k = 0; k < ns; k++)
			pt_tensor_fini(&states[k]);
		pt_tensor_fini(&own);
	}
	CU_ASSERT_EQUAL(rmdir(dir), 0);
}

/* A pair whose weights cannot be written (a directory has their name)
 * leaves no .state behind; pt_checkpoint_remove_orphans deletes a .state
 * without its weights and nothing else. */
static void test_checkpoint_pair_failure_leaves_no_state(void)
{
	char dir[] = "/tmp/pt_orphXXXXXX", path[256], spath[300], other[300];
	pt_tensor w;
	pt_st_tensor wt, stt;
	pt_checkpoint_info info = {.step = 3};
	struct stat sb;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	PT_CHECK_OK(pt_tensor_init(&w, PT_F32, 1, (int64_t[]){1000}));
	memset(pt_tensor_data(&w), 0, pt_tensor_nbytes(&w));
	wt = (pt_st_tensor){"w", &w};
	stt = (pt_st_tensor){"stage0.state", &w};
	snprintf(path, sizeof(path), "%s/step-3.safetensors", dir);
	snprintf(spath, sizeof(spath), "%s.state", path);
	CU_ASSERT_EQUAL_FATAL(mkdir(path, 0700), 0);
	CU_ASSERT_NOT_EQUAL(
	    pt_checkpoint_save_pair(path, &wt, 1, &info, &stt, 1, NULL, 0, NULL, NULL), PT_OK);
	CU_ASSERT_NOT_EQUAL(stat(spath, &sb), 0); /* gone with the failure */
	CU_ASSERT_EQUAL(rmdir(path), 0);

	/* step-4: an orphan .state; step-5: a whole pair; a stranger file. */
	snprintf(other, sizeof(other), "%s/step-4.safetensors.state", dir);
	pt_test_write_file(other, "x", 1);
	snprintf(path, sizeof(path), "%s/step-5.safetensors", dir);
	PT_CHECK_OK(pt_checkpoint_save_pair(path, &wt, 1, &info, &stt, 1, NULL, 0, NULL, NULL));
	snprintf(spath, sizeof(spath), "%s/notes.state", dir);
	pt_test_write_file(spath, "x", 1);
	CU_ASSERT_EQUAL(pt_checkpoint_remove_orphans(dir), 1);
	CU_ASSERT_NOT_EQUAL(stat(other, &sb), 0);
	CU_ASSERT_EQUAL(stat(path, &sb), 0);
	snprintf(other, sizeof(other), "%s.state", path);
	CU_ASSERT_EQUAL(stat(other, &sb), 0);
	CU_ASSERT_EQUAL(stat(spath, &sb), 0);
	CU_ASSERT_EQUAL(pt_checkpoint_remove_orphans(dir), 0);
	unlink(path), unlink(other), unlink(spath);
	CU_ASSERT_EQUAL(rmdir(dir), 0);
	pt_tensor_fini(&w);
}

static const pt_test_case tests[] = {
    {"test_model_param_overflow", test_model_param_overflow},
    {"test_model_state_dict_names", test_model_state_dict_names},
    {"test_model_stage_weights_match_full_model", test_model_stage_weights_match_full_model},
    {"test_model_checkpoint_roundtrip_and_resume", test_model_checkpoint_roundtrip_and_resume},
    {"test_checkpoint_save_pair", test_checkpoint_save_pair},
    {"test_checkpoint_pair_failure_leaves_no_state", test_checkpoint_pair_failure_leaves_no_state},
    {"test_model_split_backward_matches_fused", test_model_split_backward_matches_fused},
    {"test_model_prefault_keeps_bits", test_model_prefault_keeps_bits},
    {NULL, NULL},
};

int main(void)
{
	const pt_test_suite suites[] = {{"model", tests}, {NULL, NULL}};
	return pt_test_main(suites);
}
