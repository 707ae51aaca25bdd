/* profile.c - the per-op kernel profile the benchmarks print. */
#include <stdio.h>

#include "profile.h"

/* The per-op profile of one step, largest first, as `#` lines. */
void print_profile(const pt_kernel_timer *kt, double step_s)
{
	int order[PT_OP_COUNT], n = 0;
	for (int i = 0; i < PT_OP_COUNT; i++)
		if (kt->op_calls[i] > 0)
			order[n++] = i;
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && kt->op_seconds[order[j]] > kt->op_seconds[order[j - 1]];
		     j--) {
			int s = order[j];
			order[j] = order[j - 1];
			order[j - 1] = s;
		}
	printf("# profile of one step (on a GPU each kernel between device syncs): %.1f ms in "
	       "kernels, %.1f ms step\n",
	       kt->seconds * 1e3, step_s * 1e3);
	for (int i = 0; i < n && i < 16; i++)
		printf("#   %-22s %8.2f ms %5.1f %% %6llu calls\n", pt_op_name((pt_op)order[i]),
		       kt->op_seconds[order[i]] * 1e3,
		       100.0 * kt->op_seconds[order[i]] / kt->seconds,
		       (unsigned long long)kt->op_calls[order[i]]);
}
