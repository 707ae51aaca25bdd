/* profile.h - the per-op kernel profile the benchmarks print. */
#ifndef PT_BENCH_PROFILE_H
#define PT_BENCH_PROFILE_H

#include "dispatch.h"

/* print_profile prints kt's ops, largest time first (16 at most), as `#`
 * lines under one giving the kernel total and step_s, per step. */
void print_profile(const pt_kernel_timer *kt, double step_s);

#endif
