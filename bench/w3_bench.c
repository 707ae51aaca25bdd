/* w3_bench - a real-scale job: what a user waits for beyond the step.
 *
 * W3 is the GPT-2-small shape (vocab 50304, d 768, 12 blocks, 12 heads,
 * context 256, batch 8, AdamW, fp32, 1 stage) trained by pt_job_run on the
 * shipped text for 10 steps, with checkpoints after steps 4 and 8 (and the
 * final one after step 10) and no held-out set. Each step's end is the time
 * of its metric, which comes after a checkpoint's gather of the state.
 * Prints:
 *   bench w3_step_s              the median of steps 2, 3, 6 and 7 (no
 *                                checkpoint touches them)
 *   bench w3_tokens_per_s        8 x 256 tokens over that
 *   bench w3_first_step_s        from pt_job_run's start to step 1's end,
 *                                less one step: set-up (initialisation,
 *                                data, first-touch) before the first step
 *   bench w3_first_step_warm_s   the same for a second job in this process,
 *                                one step long, no checkpoint: the set-up
 *                                without the process's own start (libraries,
 *                                oneDNN's kernels, the data file's pages),
 *                                started as w3_first_touch_s's memory is
 *                                freed: a job right after another, on pages
 *                                the host still backs for a second or two
 *   bench w3_first_step_new_gb   the resident memory the job added by then:
 *                                the pages set-up and step 1 fault in
 *   bench w3_first_touch_s       the time this machine takes to fault in
 *                                that much new memory, huge pages, one
 *                                thread a core, nothing else done: the
 *                                floor under w3_first_step_s while the job
 *                                needs those pages. On a VM whose host
 *                                takes freed pages back (free page
 *                                reporting: within 2-3 s here), every new
 *                                page is backed anew by the host, at about
 *                                1-1.3 s a GB here against 0.05 for pages
 *                                it still backs; measured after the job's
 *                                pages were freed and the host had time to
 *                                take them back
 *   bench w3_first_step_own_s    w3_first_step_s less w3_first_touch_s: the
 *                                set-up's own work (drawing the weights,
 *                                cold caches, oneDNN's kernels)
 *   bench w3_checkpoint_stall_s  steps 8 (with the gather) and 9 (beside the
 *                                background write) over two steps: training
 *                                time a checkpoint costs in a running job
 *   bench w3_first_checkpoint_s  the same for steps 4 and 5: the first
 *                                checkpoint also maps and touches the
 *                                stage's state buffer (1.9 GB here)
 *   bench w3_rss_gb              this process's peak RSS (the job and its
 *                                final checkpoint)
 *   bench w3_bf16_step_s         the same model with precision "bf16" (4 steps,
 *                                no checkpoint): the median of steps 2-4
 * and, when `python3 bench/torch_w3_ref.py` runs (PyTorch, same model and
 * batch, eager, same cores), w3_vs_torch and w3_rss_vs_torch, and where the
 * CPU has bf16 instructions w3_bf16_vs_torch_bf16 (PyTorch under
 * torch.autocast bfloat16).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backend.h"
#include "job.h"
#include "runtime.h"

#define STEPS      10
#define STEPS_BF16 4

static double t_end[STEPS + 1];
static double rss_step1; /* resident GB when step 1's metric came */

/* rss_gb: this process's resident memory now, GB (0 if unknown). */
static double rss_gb(void)
{
	long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f == NULL)
		return 0.0;
	if (fscanf(f, "%*s %ld", &pages) != 1)
		pages = 0;
	fclose(f);
	return (double)pages * (double)sysconf(_SC_PAGESIZE) / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void on_metric(void *ctx, const pt_job_metric *m)
{
	(void)ctx;
	if (m->step >= 1 && m->step <= STEPS)
		t_end[m->step] = pt_now();
	if (m->step == 1)
		rss_step1 = rss_gb();
}

typedef struct toucher {
	volatile char *p;
	size_t n;
} toucher;

static void *touch_pages(void *arg)
{
	toucher *t = arg;
	for (size_t i = 0; i < t->n; i += 4096)
		t->p[i] = 1;
	return NULL;
}

/* first_touch_s maps gb of new memory as the tensors' arenas map theirs
 * (2 MiB huge pages where the kernel grants them), writes a byte of every
 * 4 KiB page from one thread a core and returns the seconds that took
 * (-1 on failure). */
static double first_touch_s(double gb)
{
	enum { MAXT = 64 };
	size_t huge = (size_t)2 << 20, n = ((size_t)(gb * 1e9) + huge - 1) / huge * huge;
	int nt = pt_num_cores() < MAXT ? pt_num_cores() : MAXT, started = 0;
	pthread_t th[MAXT];
	toucher part[MAXT];
	double t0;
	char *p;

	if (n == 0)
		return 0.0;
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -1.0;
#ifdef MADV_HUGEPAGE
	(void)madvise(p, n, MADV_HUGEPAGE);
#endif
	t0 = pt_now();
	for (int i = 0; i < nt; i++) {
		size_t a = n / (size_t)nt * (size_t)i,
		       b = i + 1 == nt ? n : n / (size_t)nt * (size_t)(i + 1);
		part[i] = (toucher){p + a, b - a};
		if (pthread_create(&th[i], NULL, touch_pages, &part[i]) != 0)
			break;
		started++;
	}
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	t0 = started == nt ? pt_now() - t0 : -1.0;
	munmap(p, n);
	return t0;
}

/* spec_text writes W3's job: `steps` steps at `precision`, with
 * checkpoints every 4 steps when `ckpt`. */
static void spec_text(char *text, size_t cap, int steps, const char *precision, bool ckpt)
{
	char blocks[12 * 64] = "";
	for (int i = 0; i < 12; i++)
		strcat(blocks, "{ \"kind\": \"TransformerBlock\", \"dim\": 768, \"n_head\": 12 },");
	snprintf(
	    text, cap,
	    "{ \"name\": \"w3\", \"model\": ["
	    "{ \"kind\": \"Embedding\", \"vocab\": 50304, \"dim\": 768, \"max_seq\": 256 }, %s"
	    "{ \"kind\": \"LayerNorm\", \"dim\": 768 },"
	    "{ \"kind\": \"Linear\", \"in_features\": 768, \"out_features\": 50304 } ],"
	    "\"data\": { \"format\": \"Tokens16\", \"tokens\": \"examples/data/text.u16\","
	    " \"seq_len\": 256, \"vocab\": 50304, \"held_out\": 0 },"
	    "\"loss\": \"CrossEntropy\", \"optimizer\": { \"kind\": \"AdamW\", \"lr\": 0.0003 },"
	    "\"batch_size\": 8, \"microbatches\": 1, \"steps\": %d, \"mode\": \"Sync\","
	    "\"precision\": \"%s\", %s \"seed\": 1 }",
	    blocks, steps, precision,
	    ckpt ? "\"checkpoint\": { \"every_steps\": 4, \"keep\": 1 }," : "");
}

/* run_job runs W3 from text with checkpoints in dir (NULL: none); the
 * metric hook stamps t_end. */
static int run_job(const char *text, const char *dir, int steps, double *t0)
{
	pt_job_spec s;
	pt_job_run_options o = {0};
	pt_job_hooks h = {.on_metric = on_metric};
	int64_t last = 0;

	if (pt_job_spec_parse_json(text, strlen(text), &s) != PT_OK) {
		fprintf(stderr, "w3_bench: %s\n", pt_last_error());
		return -1;
	}
	o.checkpoint_dir = dir;
	o.files_root = PT_SOURCE_ROOT;
	*t0 = pt_now();
	if (pt_job_run(&s, &o, &h, &last) != PT_OK || last != steps) {
		fprintf(stderr, "w3_bench: %s\n", pt_last_error());
		pt_job_spec_fini(&s);
		return -1;
	}
	pt_job_spec_fini(&s);
	return 0;
}

int main(int argc, char **argv)
{
	const char *script = argc > 1 ? argv[1] : PT_SOURCE_ROOT "/bench/torch_w3_ref.py";
	char dir[] = "/tmp/pt-w3-bench.XXXXXX", text[4096], cmd[4200], line[256];
	struct rusage ru;
	double t0, step, ours_tps, ours_rss, v, torch_tps = 0, torch_rss = 0, bf16_step;
	double torch_bf16_tps = 0, rss0, first_step, touch;
	FILE *p;

	pt_runtime_ensure_passive_wait(argv);
	if (mkdtemp(dir) == NULL)
		return 1;
	spec_text(text, sizeof(text), STEPS, "fp32", true);
	rss0 = rss_gb();
	if (run_job(text, dir, STEPS, &t0) != 0)
		return 1;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		return 1;
	getrusage(RUSAGE_SELF, &ru);
	{
		double d[4] = {t_end[2] - t_end[1], t_end[3] - t_end[2], t_end[6] - t_end[5],
		               t_end[7] - t_end[6]};
		qsort(d, 4, sizeof(double), cmp_double);
		step = (d[1] + d[2]) / 2;
	}
	ours_tps = 8.0 * 256 / step;
	ours_rss = (double)ru.ru_maxrss / 1048576.0;
	printf("bench w3_step_s %.3f\n", step);
	printf("bench w3_tokens_per_s %.1f\n", ours_tps);
	printf("bench w3_first_step_s %.2f\n", t_end[1] - t0 - step);
	printf("bench w3_first_step_new_gb %.2f\n", rss_step1 - rss0);
	first_step = t_end[1] - t0 - step;
	printf("bench w3_checkpoint_stall_s %.3f\n", t_end[9] - t_end[7] - 2 * step);
	printf("bench w3_first_checkpoint_s %.3f\n", t_end[5] - t_end[3] - 2 * step);
	printf("# w3 steps:");
	for (int k = 1; k <= STEPS; k++)
		printf(" %.2f", t_end[k] - (k > 1 ? t_end[k - 1] : t0));
	printf(" s\n");
	printf("bench w3_rss_gb %.2f\n", ours_rss);
	fflush(stdout);

	/* The floor: as much new memory, once the host has had time to take
	 * the job's freed pages back. */
	sleep(10);
	touch = first_touch_s(rss_step1 - rss0);
	if (touch >= 0) {
		printf("bench w3_first_touch_s %.2f\n", touch);
		printf("bench w3_first_step_own_s %.2f\n", first_step - touch);
	}
	fflush(stdout);

	/* The set-up again in this process, right after the touch's munmap. */
	spec_text(text, sizeof(text), 1, "fp32", false);
	if (run_job(text, NULL, 1, &t0) != 0)
		return 1;
	printf("bench w3_first_step_warm_s %.2f\n", t_end[1] - t0 - step);
	fflush(stdout);

	/* bf16: steps 2-4 (step 1 also creates the bf16 kernels' primitives). */
	spec_text(text, sizeof(text), STEPS_BF16, "bf16", false);
	if (run_job(text, NULL, STEPS_BF16, &t0) != 0)
		return 1;
	{
		double d[3] = {t_end[2] - t_end[1], t_end[3] - t_end[2], t_end[4] - t_end[3]};
		qsort(d, 3, sizeof(double), cmp_double);
		bf16_step = d[1];
	}
	printf("bench w3_bf16_step_s %.3f\n", bf16_step);
	printf("bench w3_bf16_tokens_per_s %.1f\n", 8.0 * 256 / bf16_step);
	printf("# w3 bf16: %s\n", pt_backend_bf16());
	fflush(stdout);

	snprintf(cmd, sizeof(cmd), "/usr/bin/python3 '%s' 2>&1", script);
	if ((p = popen(cmd, "r")) == NULL)
		return 0;
	while (fgets(line, sizeof(line), p) != NULL) {
		printf("# %s", line);
		if (sscanf(line, "torch w3_tokens_per_s %lf", &v) == 1)
			torch_tps = v;
		if (sscanf(line, "torch w3_rss_gb %lf", &v) == 1)
			torch_rss = v;
		if (sscanf(line, "torch w3_bf16_tokens_per_s %lf", &v) == 1)
			torch_bf16_tps = v;
	}
	pclose(p);
	if (torch_tps > 0 && torch_rss > 0) {
		printf("bench w3_vs_torch %.3f\n", ours_tps / torch_tps);
		printf("bench w3_rss_vs_torch %.3f\n", ours_rss / torch_rss);
	} else {
		printf(
		    "# PyTorch reference did not run: w3_vs_torch and w3_rss_vs_torch skipped\n");
	}
	if (torch_bf16_tps > 0)
		printf("bench w3_bf16_vs_torch_bf16 %.3f\n",
		       8.0 * 256 / bf16_step / torch_bf16_tps);
	return 0;
}
