/* runtime.h - process-wide settings: CPU thread budgets and OpenMP waiting.
 *
 * oneDNN and our CPU kernels thread with OpenMP. Spinning OpenMP threads fight
 * over 2 cores, and libgomp reads OMP_WAIT_POLICY only when it loads, so
 * programs call pt_runtime_ensure_passive_wait() first thing in main().
 */
#ifndef PT_RUNTIME_H
#define PT_RUNTIME_H

#include <stddef.h>

/* pt_runtime_ensure_passive_wait re-executes the program once with
 * OMP_WAIT_POLICY=PASSIVE when it is unset. Returns only when nothing needs to
 * change or the re-exec failed (then it carries on with spinning threads). */
void pt_runtime_ensure_passive_wait(char **argv);

/* pt_set_num_threads sets the thread budget for CPU kernels started from the
 * calling thread (each pipeline stage thread sets its own). n <= 0 means all cores. */
void pt_set_num_threads(int n);

/* pt_get_num_threads returns the calling thread's budget. */
int pt_get_num_threads(void);

/* pt_num_cores returns the number of online CPU cores. */
int pt_num_cores(void);

/* A thread's reusable buffers, one per slot: kept between calls, grown as
 * needed, freed when the thread ends. */
typedef enum pt_thread_slot {
	PT_SLOT_GEMM_OPERANDS, /* cpu_matmul.c: rounded or padded operand copies */
	PT_SLOT_WATCH_POINTS,  /* server/jobs.c: a WatchMetrics reply's points */
	PT_SLOT_WIDE_INPUT,    /* cpu_matmul.c: a bf16 Linear input widened to f32 */
	PT_SLOT_COUNT
} pt_thread_slot;

/* pt_thread_buffer returns the calling thread's slot buffer with room for
 * bytes (64-byte aligned; its contents are kept when it grows), or NULL when
 * it cannot grow. The caller bounds bytes. */
void *pt_thread_buffer(pt_thread_slot slot, size_t bytes);

/* pt_now returns a monotonic time in seconds. */
double pt_now(void);

#endif
