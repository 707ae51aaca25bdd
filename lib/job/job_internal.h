/* job_internal.h - helpers shared by lib/job's files (not public API). */
#ifndef PT_JOB_INTERNAL_H
#define PT_JOB_INTERNAL_H

#include <stdbool.h>

#include "error.h"

/* pt_job_model_error rewrites the current error's "layer N"/"layers[N]"
 * prefix into the spec's "model[N]" and returns rv. */
pt_err pt_job_model_error(pt_err rv);

/* pt_job_optim_error names optimizer fields as the JobSpec does
 * ("optimizer.warmup_steps") and returns rv. */
pt_err pt_job_optim_error(pt_err rv);

/* pt_job_open_data opens the data file a spec field names (field: "data.tokens")
 * with pt_file_open_under(root, path, any_path): confined beneath root unless
 * any_path; errors are prefixed with the field. The caller closes *fd. */
pt_err pt_job_open_data(const char *field, const char *path, const char *root, bool any_path,
                        int *fd);

#endif
