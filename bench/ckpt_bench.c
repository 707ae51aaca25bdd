/* ckpt_bench - what a checkpoint costs a running job.
 *
 * A GPT job in one process (byte text, vocab 8192 by padding the head, d 512,
 * 6 blocks, 8 heads, context 64, batch 8, AdamW, 1 stage: 27 M parameters,
 * a 108 MB weights file and a 325 MB .state) trains 24 steps with a
 * checkpoint every 6 (4 checkpoints). Each step's end is the time of its
 * metric; a checkpoint's cost to training is the interval of the step after
 * it over the median interval of steps without one. Prints:
 *   bench checkpoint_stall_s   mean training time lost to one checkpoint
 *   bench checkpoint_write_s   mean time from a checkpoint's step to its
 *                              files being complete (in the background)
 *   bench checkpoint_mb        megabytes written per checkpoint
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "job.h"
#include "runtime.h"

#define STEPS 24
#define EVERY 6

typedef struct rec {
	double t[STEPS + 1];       /* metric time of each step (monotonic) */
	double ck_done[STEPS + 1]; /* when step N's checkpoint was complete */
} rec;

static void on_metric(void *ctx, const pt_job_metric *m)
{
	rec *r = ctx;
	if (m->step >= 1 && m->step <= STEPS)
		r->t[m->step] = pt_now();
}

static void on_checkpoint(void *ctx, int64_t step, const char *path, const char *sha256,
                          uint64_t size)
{
	rec *r = ctx;
	(void)path, (void)sha256, (void)size;
	if (step >= 1 && step <= STEPS)
		r->ck_done[step] = pt_now();
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double dir_mb(const char *dir, int64_t step)
{
	char p[512];
	struct stat a, b;
	snprintf(p, sizeof(p), "%s/step-%lld.safetensors", dir, (long long)step);
	if (stat(p, &a) != 0)
		return 0;
	strcat(p, ".state");
	if (stat(p, &b) != 0)
		return 0;
	return (double)(a.st_size + b.st_size) / 1e6;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/pt-ckpt-bench.XXXXXX", text[2048], cmd[600];
	pt_job_spec s;
	pt_job_run_options o = {0};
	rec r;
	pt_job_hooks h = {.ctx = &r, .on_metric = on_metric, .on_checkpoint = on_checkpoint};
	double plain[STEPS], stall = 0, write = 0, mb;
	int n_plain = 0, n_ck = 0;
	int64_t last = 0;

	memset(&r, 0, sizeof(r));
	(void)argc;
	pt_runtime_ensure_passive_wait(argv);
	if (mkdtemp(dir) == NULL)
		return 1;
	snprintf(
	    text, sizeof(text),
	    "{ \"name\": \"ckpt-bench\", \"model\": ["
	    "{ \"kind\": \"Embedding\", \"vocab\": 8192, \"dim\": 512, \"max_seq\": 64 },"
	    "%s%s%s%s%s%s"
	    "{ \"kind\": \"LayerNorm\", \"dim\": 512 },"
	    "{ \"kind\": \"Linear\", \"in_features\": 512, \"out_features\": 8192 } ],"
	    "\"data\": { \"format\": \"Tokens16\", \"tokens\": \"examples/data/text.u16\","
	    " \"seq_len\": 64, \"vocab\": 8192 },"
	    "\"loss\": \"CrossEntropy\", \"optimizer\": { \"kind\": \"AdamW\", \"lr\": 0.0003 },"
	    "\"batch_size\": 8, \"microbatches\": 1, \"steps\": %d, \"mode\": \"Sync\","
	    "\"eval_every\": 0, \"checkpoint\": { \"every_steps\": %d, \"keep\": 2 },"
	    "\"seed\": 1 }",
	    "{ \"kind\": \"TransformerBlock\", \"dim\": 512, \"n_head\": 8 },",
	    "{ \"kind\": \"TransformerBlock\", \"dim\": 512, \"n_head\": 8 },",
	    "{ \"kind\": \"TransformerBlock\", \"dim\": 512, \"n_head\": 8 },",
	    "{ \"kind\": \"TransformerBlock\", \"dim\": 512, \"n_head\": 8 },",
	    "{ \"kind\": \"TransformerBlock\", \"dim\": 512, \"n_head\": 8 },",
	    "{ \"kind\": \"TransformerBlock\", \"dim\": 512, \"n_head\": 8 },", STEPS, EVERY);
	if (pt_job_spec_parse_json(text, strlen(text), &s) != PT_OK) {
		fprintf(stderr, "ckpt_bench: %s\n", pt_last_error());
		return 1;
	}
	o.checkpoint_dir = dir;
	o.files_root = PT_SOURCE_ROOT;
	if (pt_job_run(&s, &o, &h, &last) != PT_OK || last != STEPS) {
		fprintf(stderr, "ckpt_bench: %s\n", pt_last_error());
		return 1;
	}
	for (int k = 3; k <= STEPS; k++) /* steps 1-2 warm up */
		if ((k - 1) % EVERY != 0)
			plain[n_plain++] = r.t[k] - r.t[k - 1];
	qsort(plain, (size_t)n_plain, sizeof(double), cmp_double);
	for (int k = EVERY; k < STEPS; k += EVERY) {
		stall += (r.t[k + 1] - r.t[k]) - plain[n_plain / 2];
		write += r.ck_done[k] - r.t[k];
		n_ck++;
	}
	mb = dir_mb(dir, STEPS);
	printf("# ckpt_bench: 27 M parameters, median step %.3f s, %d checkpoints\n",
	       plain[n_plain / 2], n_ck);
	printf("bench checkpoint_stall_s %.3f\n", stall / n_ck);
	printf("bench checkpoint_write_s %.3f\n", write / n_ck);
	printf("bench checkpoint_mb %.0f\n", mb);
	pt_job_spec_fini(&s);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : 1;
}
