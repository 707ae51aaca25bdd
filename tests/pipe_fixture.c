/* pipe_fixture.c - shared fixtures of the pipeline tests. */
#include "pipe_fixture.h"

#include <stdlib.h>
#include <string.h>

#include "pt_test.h"

const pt_layer_spec fx_digits_mlp[FX_N_LAYERS] = {
    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 64, .bias = true},
    {.kind = PT_LAYER_RELU},
    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 64, .bias = true},
    {.kind = PT_LAYER_RELU},
    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 10, .bias = true},
};
const pt_act_shape fx_digits_in = {PT_F32, 0, 64};

pt_optim_config fx_optim(void)
{
	pt_optim_config o = pt_optim_defaults(PT_OPTIM_ADAMW, 2e-3f);
	o.clip_norm = 1.0f; /* clipping on: the global norm must match bitwise too */
	return o;
}

void fx_stage_configs(pt_stage_config *out, int p, int m, pt_pipe_mode mode, bool recompute,
                      const int *bounds)
{
	int first[PT_MAX_STAGES + 1];
	if (bounds)
		memcpy(first, bounds, sizeof(int) * (size_t)(p + 1));
	else
		PT_CHECK_OK(pt_partition(fx_digits_mlp, FX_N_LAYERS, fx_digits_in, p, first));
	for (int s = 0; s < p; s++)
		out[s] = (pt_stage_config){.layers = fx_digits_mlp,
		                           .n_layers = FX_N_LAYERS,
		                           .input = fx_digits_in,
		                           .microbatch = FX_MB,
		                           .first = first[s],
		                           .last = first[s + 1],
		                           .n_slots = mode == PT_MODE_SYNC ? m : p,
		                           .mode = mode,
		                           .optim = fx_optim(),
		                           .seed = 42,
		                           .weight_stashing = true,
		                           .recompute = recompute,
		                           .threads = 1};
}

pt_pipeline_config fx_pipeline_config(int p, int m, pt_pipe_mode mode)
{
	return (pt_pipeline_config){.n_stages = p,
	                            .n_microbatches = m,
	                            .microbatch = FX_MB,
	                            .mode = mode,
	                            .loss = PT_LOSS_CROSS_ENTROPY,
	                            .ignore_index = -1,
	                            .optim = fx_optim(),
	                            .output = {PT_F32, 0, 10},
	                            .timeout_ms = 10000};
}

void fx_data_up(fx_data *d, int m)
{
	int64_t batch = FX_MB * m;
	PT_CHECK_OK(pt_dataset_load_npy(&d->all, pt_test_path("examples/data/digits_x.npy"),
	                                pt_test_path("examples/data/digits_y.npy"), true));
	PT_CHECK_OK(pt_dataset_split(&d->train, &d->held, &d->all, 0.2, 1));
	PT_CHECK_OK(pt_batch_iter_init(&d->it, &d->train, batch, true, true, 1));
	PT_CHECK_OK(pt_tensor_init(&d->x, PT_F32, 2, (int64_t[]){batch, 64}));
	PT_CHECK_OK(pt_tensor_init(&d->y, PT_I64, 1, (int64_t[]){batch}));
}

void fx_data_next(fx_data *d, int64_t step)
{
	int64_t rows;
	PT_CHECK_OK(pt_batch_iter_next(&d->it, &d->x, &d->y, &rows));
	if (rows == 0) {
		pt_batch_iter_set_epoch(&d->it, (uint64_t)step);
		PT_CHECK_OK(pt_batch_iter_next(&d->it, &d->x, &d->y, &rows));
	}
}

void fx_data_down(fx_data *d)
{
	pt_tensor_fini(&d->x);
	pt_tensor_fini(&d->y);
	pt_batch_iter_fini(&d->it);
	pt_dataset_fini(&d->train);
	pt_dataset_fini(&d->held);
	pt_dataset_fini(&d->all);
}

float *fx_gather_params(pt_coordinator *c, int p, size_t *nbytes)
{
	size_t total = 0;
	float *all = NULL;
	for (int s = 1; s <= p; s++) {
		pt_tensor t;
		PT_CHECK_OK(pt_coordinator_params(c, s, &t));
		all = realloc(all, total + pt_tensor_nbytes(&t));
		memcpy((char *)all + total, pt_tensor_data(&t), pt_tensor_nbytes(&t));
		total += pt_tensor_nbytes(&t);
		pt_tensor_fini(&t);
	}
	*nbytes = total;
	return all;
}
