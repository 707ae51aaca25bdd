/* job_internal.h - helpers shared by lib/job's files (not public API). */
#ifndef PT_JOB_INTERNAL_H
#define PT_JOB_INTERNAL_H

#include "error.h"

/* pt_job_model_error rewrites the current error's "layer N"/"layers[N]"
 * prefix into the spec's "model[N]" and returns rv. */
pt_err pt_job_model_error(pt_err rv);

/* pt_job_optim_error names optimizer fields as the JobSpec does
 * ("optimizer.warmup_steps") and returns rv. */
pt_err pt_job_optim_error(pt_err rv);

#endif
