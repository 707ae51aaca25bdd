/* runtime.c - thread budgets, OpenMP wait policy, clock. */
#include "runtime.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
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

typedef struct thread_bufs {
	void *p[PT_SLOT_COUNT];
	size_t cap[PT_SLOT_COUNT];
} thread_bufs;

static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;
static _Thread_local thread_bufs *bufs;

static void bufs_free(void *arg)
{
	thread_bufs *b = arg;
	for (int i = 0; i < PT_SLOT_COUNT; i++)
		free(b->p[i]);
	free(b);
}

static void bufs_key_init(void)
{
	pthread_key_create(&bufs_key, bufs_free);
}

void *pt_thread_buffer(pt_thread_slot slot, size_t bytes)
{
	if ((unsigned)slot >= PT_SLOT_COUNT)
		return NULL;
	if (bufs == NULL) {
		pthread_once(&bufs_once, bufs_key_init);
		if ((bufs = calloc(1, sizeof(*bufs))) == NULL)
			return NULL;
		pthread_setspecific(bufs_key, bufs);
	}
	if (bytes > bufs->cap[slot]) {
		size_t cap = (bytes + 63) & ~(size_t)63;
		void *p;
		if (cap < bytes || (p = aligned_alloc(64, cap)) == NULL)
			return NULL;
		if (bufs->p[slot] != NULL)
			memcpy(p, bufs->p[slot], bufs->cap[slot]);
		free(bufs->p[slot]);
		bufs->p[slot] = p;
		bufs->cap[slot] = cap;
	}
	return bufs->p[slot];
}

double pt_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
