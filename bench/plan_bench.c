/* plan_bench - the planner's predictions against measured steps.
 *
 * For examples/gpt.json and the W2 bench model (the byte-level GPT of
 * pt-bench: 8 blocks of width 256, context 128, batch 16) at p in {1, 2, 4}
 * stages and m in {4, 8} microbatches, every flushing schedule: the
 * planner's predicted step time (pt_job_plan_run) and the measured one
 * (pt_job_run in this process, the median step of STEPS - STEPS_W2 for W2 -
 * after WARMUP), each the median of ROUNDS rounds (W2: ROUNDS_W2); a round
 * profiles afresh (pt_job_plan_forget) and then measures the group's
 * schedules.
 *   plan_error_max   the largest |predicted - measured| / measured
 *   plan_error_<model>_p<P>_m<M>_<schedule>  each one
 *   plan_auto_vs_best  measured step of the planner's pick over the best
 *                      measured step, per model and p, m (the worst), among
 *                      the schedules auto picks from (not interleaved)
 * Figures print as `bench <name> <value>`. An argument (gpt or w2) runs
 * that model only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "runtime.h"

#ifndef PT_SOURCE_ROOT
#define PT_SOURCE_ROOT "."
#endif

#define WARMUP    2
#define ROUNDS    7  /* profile, then measure every schedule of a (p, m) group */
#define ROUNDS_W2 3  /* W2's (a round takes about 6 s a group) */
#define STEPS     25 /* measured steps a round of examples/gpt.json (10-40 ms each) */
#define STEPS_W2  5  /* and of W2 (about a second each) */

static void die(const char *what)
{
	fprintf(stderr, "plan_bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

typedef struct rec {
	double dt[WARMUP + STEPS + 1];
	int n;
	int64_t batch;
	int steps; /* to measure (after WARMUP) */
} rec;

static void on_metric(void *ctx, const pt_job_metric *m)
{
	rec *r = ctx;
	if (r->n < WARMUP + r->steps && m->samples_per_s > 0)
		r->dt[r->n++] = (double)r->batch / m->samples_per_s;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void load(pt_job_spec *s)
{
	void *buf;
	size_t len;
	if (pt_job_spec_load_file(PT_SOURCE_ROOT "/examples/gpt.json", &buf, &len) != PT_OK)
		die("examples/gpt.json");
	memset(s, 0, sizeof(*s));
	if (pt_job_spec_decode(buf, len, s) != PT_OK)
		die("decode");
	free(buf);
	s->eval_every = 0;
	free(s->boundaries);
	s->boundaries = NULL;
	s->checkpoint_every = 0;
}

/* w2 turns the gpt spec into the W2 shape. */
static void w2(pt_job_spec *s)
{
	pt_layer_spec *l = calloc(11, sizeof(*l));
	int n = 0;
	if (l == NULL)
		die("memory");
	l[n++] = pt_embedding(256, 256, 128);
	for (int i = 0; i < 8; i++)
		l[n++] = pt_block(256, 4);
	l[n++] = pt_layernorm(256);
	l[n++] = pt_linear(256, 256);
	free(s->layers);
	s->layers = l;
	s->n_layers = n;
	s->data.seq_len = 128;
	s->batch_size = 16;
}

static double measure(const pt_job_spec *base, const pt_job_plan *pl, int steps)
{
	int p = pl->stages, m = pl->microbatches;
	pt_pipe_schedule sc = pl->schedule;
	pt_job_spec s = *base;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT};
	rec r = {.batch = base->batch_size, .steps = steps};
	pt_job_hooks h = {.ctx = &r, .on_metric = on_metric};
	int64_t last;
	s.stages = p;
	s.microbatches = m;
	s.steps = WARMUP + steps;
	s.schedule = (char *)pt_pipe_schedule_name(sc);
	s.virtual_stages = pl->virtual_stages > 1 ? pl->virtual_stages : 0;
	if (pt_job_run(&s, &o, &h, &last) != PT_OK)
		die("measured run");
	if (r.n < WARMUP + steps)
		die("steps without a metric");
	qsort(r.dt + WARMUP, (size_t)steps, sizeof(double), by_value);
	return r.dt[WARMUP + steps / 2];
}

static double median_of(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), by_value);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
	static const int ps[] = {1, 2, 4}, ms[] = {4, 8};
	const char *names[] = {"gpt", "w2"};
	double worst = 0.0, worst_auto = 1.0;
	pt_runtime_ensure_passive_wait(argv);

	for (int k = 0; k < 2; k++) {
		pt_job_spec s;
		if (argc > 1 && strcmp(argv[1], names[k]) != 0)
			continue;
		load(&s);
		if (k == 1)
			w2(&s);
		for (int i = 0; i < 3; i++)
			for (int j = 0; j < 2; j++) {
				/* Per schedule: predicted and measured step of each round. */
				double pred[PT_SCHED_INTERLEAVED + 1][ROUNDS],
				    meas[PT_SCHED_INTERLEAVED + 1][ROUNDS],
				    bubble[PT_SCHED_INTERLEAVED + 1];
				int seen[PT_SCHED_INTERLEAVED + 1] = {0};
				int rounds = k == 1 ? ROUNDS_W2 : ROUNDS;
				double best = INFINITY, pick = 0, pick_pred = INFINITY;
				/* Each round profiles afresh right before it measures the
				 * group's schedules (pt_job_plan_forget): this VM's speed
				 * drifts by a fifth between minutes, which a profile taken
				 * minutes earlier would carry into every prediction; the
				 * medians over rounds drop a round a burst of load spoiled. */
				for (int r = 0; r < rounds; r++) {
					pt_job_plan_options o = {.files_root = PT_SOURCE_ROOT,
					                         .stages = &ps[i],
					                         .n_stages = 1,
					                         .microbatches = &ms[j],
					                         .n_microbatches = 1};
					pt_job_plan *plans;
					int n;
					pt_job_plan_forget();
					if (pt_job_plan_run(&s, &o, &plans, &n) != PT_OK)
						die("plan");
					for (int q = 0; q < n; q++) {
						pt_job_plan *pl = &plans[q];
						int sc = (int)pl->schedule;
						if (sc < 0 || sc > PT_SCHED_INTERLEAVED ||
						    seen[sc] != r)
							continue;
						pred[sc][r] = pl->step_seconds;
						meas[sc][r] =
						    measure(&s, pl, k == 1 ? STEPS_W2 : STEPS);
						bubble[sc] = pl->bubble;
						seen[sc]++;
					}
					free(plans);
				}
				for (int sc = 0; sc <= PT_SCHED_INTERLEAVED; sc++) {
					if (seen[sc] != rounds)
						continue;
					double pr = median_of(pred[sc], rounds);
					double got = median_of(meas[sc], rounds);
					double err = fabs(pr - got) / got;
					printf("bench plan_error_%s_p%d_m%d_%s %.3f\n", names[k],
					       ps[i], ms[j],
					       pt_pipe_schedule_name((pt_pipe_schedule)sc), err);
					printf("#   predicted %.4f s, measured %.4f s (%+.1f %%; "
					       "medians "
					       "of %d rounds), bubble %.3f\n",
					       pr, got, 100.0 * (pr - got) / got, rounds,
					       bubble[sc]);
					worst = err > worst ? err : worst;
					/* Auto picks among the schedules that keep p stages. */
					if (sc == PT_SCHED_INTERLEAVED)
						continue;
					best = got < best ? got : best;
					if (pr < pick_pred) {
						pick_pred = pr;
						pick = got;
					}
				}
				worst_auto = pick / best > worst_auto ? pick / best : worst_auto;
			}
		pt_job_spec_fini(&s);
	}
	printf("bench plan_error_max %.3f\n", worst);
	printf("bench plan_auto_vs_best %.3f\n", worst_auto);
	return 0;
}
