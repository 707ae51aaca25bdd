/* runtime.c - thread budgets, OpenMP wait policy, clock. */
#include "runtime.h"

#include <omp.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

void pt_runtime_ensure_passive_wait(char **argv)
{
	if (getenv("OMP_WAIT_POLICY") != NULL || argv == NULL)
		return;
	setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
	execv("/proc/self/exe", argv);
	/* execv failed: keep running as we are. */
}

void pt_set_num_threads(int n)
{
	if (n <= 0)
		n = pt_num_cores();
	omp_set_num_threads(n);
}

int pt_get_num_threads(void)
{
	return omp_get_max_threads();
}

int pt_num_cores(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

double pt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
