/* pipe_fixture.h - what the pipeline tests share: the digits MLP, its data,
 * stage configurations, and gathering parameters from stages. */
#ifndef PT_PIPE_FIXTURE_H
#define PT_PIPE_FIXTURE_H

#include "batch.h"
#include "pipeline.h"

#define FX_MB       16 /* samples per microbatch */
#define FX_N_LAYERS 5

extern const pt_layer_spec fx_digits_mlp[FX_N_LAYERS];
extern const pt_act_shape fx_digits_in;

/* AdamW 2e-3 with global-norm clipping at 1. */
pt_optim_config fx_optim(void);

/* Configs of p stages (partitioned by FLOPs, or by `bounds` when not NULL). */
void fx_stage_configs(pt_stage_config *out, int p, int m, pt_pipe_mode mode, bool recompute,
                      const int *bounds);

pt_pipeline_config fx_pipeline_config(int p, int m, pt_pipe_mode mode);

typedef struct fx_data {
	pt_dataset all, train, held;
	pt_batch_iter it;
	pt_tensor x, y;
} fx_data;

void fx_data_up(fx_data *d, int m);
void fx_data_next(fx_data *d, int64_t step);
void fx_data_down(fx_data *d);

/* All stages' parameters concatenated (the full model's arena); free() it. */
float *fx_gather_params(pt_coordinator *c, int p, size_t *nbytes);

#endif
