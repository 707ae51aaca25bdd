/* cuda_ops.h - the CUDA kernels of every op, with the dispatcher's kernel
 * signature (lib/ops/dispatch.h). Only the backend registry uses this table;
 * it exists only in builds with CUDA (the registry guards it).
 *
 * Each kernel runs on the device of its operands (the registry's plan checked
 * they share one), queues work on that device's compute stream and returns
 * without waiting, except where it must read device data on the host (token
 * and target range checks). Workspace: none; scratch comes from the pool.
 */
#ifndef PT_CUDA_OPS_H
#define PT_CUDA_OPS_H

#include "dispatch.h"

/* cuda_op_kernel returns the CUDA kernel of op (never NULL for a valid op). */
pt_kernel_fn cuda_op_kernel(pt_op op);

#endif
