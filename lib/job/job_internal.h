/* job_internal.h - helpers shared by lib/job's files (not public API). */
#ifndef PT_JOB_INTERNAL_H
#define PT_JOB_INTERNAL_H

#include <stdbool.h>

#include "error.h"
#include "job.h"
#include "tokens.h"

/* pt_job_model_error rewrites the current error's "layer N"/"layers[N]"
 * prefix into the spec's "model[N]" and returns rv. */
pt_err pt_job_model_error(pt_err rv);

/* pt_job_optim_error names optimizer fields as the JobSpec does
 * ("optimizer.warmup_steps") and returns rv. */
pt_err pt_job_optim_error(pt_err rv);

/* pt_job_open_data opens the data file a spec field names (field: "data.tokens")
 * with pt_file_open_under(root, path, any_path): confined beneath root unless
 * any_path, and refused when larger than pt_job_set_file_limit's cap; errors
 * are prefixed with the field. The caller closes *fd. */
pt_err pt_job_open_data(const char *field, const char *path, const char *root, bool any_path,
                        int *fd);

/* pt_job_init_from_validate checks s->init_from (NULL: nothing to check): the
 * file, opened as pt_job_open_data opens data files, must be a safetensors
 * file holding exactly the model's parameters - every name, F32, the exact
 * shape - else an error naming the first mismatch ("init_from: tensor
 * '1.attn.c_attn.weight': shape [64, 192], expected [192, 64]"). Blocking. */
pt_err pt_job_init_from_validate(const pt_job_spec *s, const char *root, bool any_path);

/* pt_job_init_from_load checks s->init_from as pt_job_init_from_validate
 * does and copies its tensors into the full model m (built from s's layers,
 * host memory). Blocking. */
pt_err pt_job_init_from_load(const pt_job_spec *s, const char *root, bool any_path,
                             struct pt_model *m);

/* pt_job_token_dtype gives the dtype pt_tokens_load takes for a Tokens format
 * (PT_TOKENS_AUTO for Auto). */
pt_dtype pt_job_token_dtype(pt_data_format f);

/* pt_job_load_tokens loads the token file a field names ("data.tokens",
 * "data.val_tokens") as s's format and vocab say, opened as
 * pt_job_open_data; a Tokens16/Tokens32 format that disagrees with the file's
 * llm.c header is PT_ERR_FORMAT naming data.format. Blocking. */
pt_err pt_job_load_tokens(const pt_job_spec *s, const char *field, const char *path,
                          const char *root, bool any_path, pt_tokens *tk);

/* pt_plan_simulate_uniform runs the planner's simulation (plan.c) for p
 * stages of equal costs: f, b, w seconds per microbatch, every hand-over
 * `hop` seconds, no loss or update time, one thread per stage on `threads`
 * cores whose speed with k threads at work is speed[k] (k = 1..n_speed; the
 * last beyond). For tests: the step and bubble it predicts. */
/* pt_job_model_bytes sizes a model of layers [first, last) at microbatch B
 * as pt_model_create makes it with one activation slot and no optimizer:
 * parameters, gradients, the slot, the work arena, its input and output
 * (memory.c's accounting). */
double pt_job_model_bytes(const pt_job_spec *s, pt_act_shape input, int first, int last, double B);

pt_err pt_plan_simulate_uniform(pt_pipe_schedule sc, int p, int m, double f, double b, double w,
                                double hop, int threads, const double *speed, int n_speed,
                                double *step, double *bubble);

#endif
