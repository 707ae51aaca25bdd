/* dist_bench.c - jobs on `pipeserver --worker` processes: how long a job
 * takes from being handed to the runner to its first training step, and the
 * throughput of the 4-stage digits job on 4 workers next to one process.
 *
 * Workers run on tcp://127.0.0.1:0 in this machine's namespace (build/server/
 * pipeserver, found next to this program through /proc/self/exe). Prints
 *   bench submit_to_step_s_w1 S   median over RUNS of: pt_job_run called ->
 *   bench submit_to_step_s_w4 S   first step's metric (data and model set up,
 *                                 handshake, stage shipping, the first step),
 *                                 1 stage on 1 worker and 4 stages on 4
 *   bench dist4_vs_local R        samples/s of the 4-stage digits job on 4
 *                                 workers / the same job on in-process stages
 *                                 (steps WARMUP+1..STEPS; best of RUNS)
 * pt_job_run is what the server's job thread calls for a submitted job, so
 * the first two are the server's submit-to-first-step minus its queue.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "job.h"
#include "runtime.h"
#include "spawn.h"

#define RUNS   5
#define STEPS  300
#define WARMUP 20

static char bin[PATH_MAX + 64];

/* spawn_worker starts `pipeserver --worker` and reads the URL it prints. */
static pid_t spawn_worker(char *url, size_t n)
{
	const char *argv[] = {bin,           "--worker", "--listen", "tcp://127.0.0.1:0",
	                      "--log-level", "warn",     NULL};
	return bench_spawn(argv, url, n);
}

typedef struct timing {
	double t0, first;  /* pt_job_run called; first metric */
	double t_warm, t1; /* metric of step WARMUP; of the last step */
} timing;

static void on_metric(void *ctx, const pt_job_metric *m)
{
	timing *t = ctx;
	double now = pt_now();
	if (t->first == 0)
		t->first = now;
	if (m->step == WARMUP)
		t->t_warm = now;
	t->t1 = now;
}

/* run trains the digits job on p stages for steps steps (on the workers
 * urls[0..p) when urls is not NULL) and returns its timing. */
static timing run(int p, int64_t steps, char urls[][256])
{
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	timing t = {0};
	pt_job_hooks h = {.ctx = &t, .on_metric = on_metric};
	void *buf;
	size_t len;

	memset(&spec, 0, sizeof(spec));
	if (pt_job_spec_load_file(PT_SOURCE_ROOT "/examples/digits.json", &buf, &len) != PT_OK ||
	    pt_job_spec_decode(buf, len, &spec) != PT_OK) {
		fprintf(stderr, "dist_bench: %s\n", pt_last_error());
		exit(1);
	}
	free(buf);
	spec.steps = steps;
	spec.stages = p;
	spec.eval_every = 0;
	if (urls != NULL) {
		spec.workers = calloc((size_t)p, sizeof(char *));
		for (int i = 0; spec.workers != NULL && i < p; i++)
			spec.workers[i] = strdup(urls[i]);
		spec.n_workers = p;
	}
	t.t0 = pt_now();
	if (pt_job_run(&spec, &o, &h, NULL) != PT_OK) {
		fprintf(stderr, "dist_bench: %s\n", pt_last_error());
		exit(1);
	}
	pt_job_spec_fini(&spec);
	return t;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median_first_step(int p, char urls[][256])
{
	double v[RUNS];
	for (int i = 0; i < RUNS; i++) {
		timing t = run(p, 1, urls);
		v[i] = t.first - t.t0;
	}
	qsort(v, RUNS, sizeof(double), cmp_d);
	return v[RUNS / 2];
}

static double best_throughput(char urls[][256])
{
	double best = 0;
	for (int i = 0; i < RUNS; i++) {
		timing t = run(4, STEPS, urls);
		double sps = (double)(STEPS - WARMUP) / (t.t1 - t.t_warm);
		if (sps > best)
			best = sps;
	}
	return best; /* steps per second: the batch is the same on both sides */
}

int main(void)
{
	char urls[4][256];
	pid_t pids[4];
	double w1, w4, dist, local;

	signal(SIGPIPE, SIG_IGN);
	bench_sibling("../server/pipeserver", bin, sizeof(bin));
	for (int i = 0; i < 4; i++)
		pids[i] = spawn_worker(urls[i], sizeof(urls[i]));

	w1 = median_first_step(1, urls);
	w4 = median_first_step(4, urls);
	dist = best_throughput(urls);
	local = best_throughput(NULL);
	printf("bench submit_to_step_s_w1 %.4f\n", w1);
	printf("bench submit_to_step_s_w4 %.4f\n", w4);
	printf("bench dist4_vs_local %.3f\n", dist / local);
	printf(
	    "# digits, batch 64, 4 microbatches: %.0f steps/s on 4 workers, %.0f in one process\n",
	    dist, local);
	fflush(stdout);

	for (int i = 0; i < 4; i++) {
		kill(pids[i], SIGTERM);
		waitpid(pids[i], NULL, 0);
	}
	return 0;
}
