/* sched_bench.c - the shared service: jobs placed on a worker pool.
 *
 * Spawns six `pipeserver --worker` processes whose stages sleep TASK_MS
 * before every forward and backward (--task-delay-ms: work that does not
 * need the CPU, so two cores do not decide the result) and a pipeserver with
 * them as its --pool and --devices none, all on loopback (build/server/
 * pipeserver, next to this program). Jobs are the digits example with
 * 4 microbatches. Prints
 *   bench sched_makespan_ratio R  three 2-stage jobs of JOB_STEPS steps
 *                                 submitted together: submit of the first to
 *                                 the end of the last, over the sum of the
 *                                 three run alone (ideal 1/3)
 *   bench sched_place_ms MS       a 4-stage pooled job: submit to its first
 *                                 step done, less one step (the second
 *                                 step's duration), from the server's
 *                                 timestamps; median of RUNS
 *   bench queue_wait_ms_p99 MS    50 one-stage jobs, each submitted while a
 *                                 worker is free (the previous one ended):
 *                                 submit to Starting (the server's
 *                                 timestamps), 99th percentile
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "api/api.h"
#include "fileio.h"
#include "job.h"
#include "spawn.h"

#define N_WORKERS 6
#define TASK_MS   "4"
#define JOB_STEPS 30
#define RUNS      5
#define N_QUEUE   50

static char bin[PATH_MAX + 64];
static nng_socket sock;
static pt_fb_builder fb;
static nng_msg *reply;
static uint64_t next_id = 1;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "sched_bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

/* call sends q and parses the reply into *r (a view valid until the next
 * call); a non-OK code exits the benchmark. */
static void call(pt_api_request *q, pt_api_response *r)
{
	const uint8_t *data;
	size_t size;
	nng_msg *m;

	q->id = next_id++;
	if (pt_api_build_request(&fb, q, &data, &size) != PT_OK)
		die("build request");
	if (nng_msg_alloc(&m, size) != 0)
		die("nng_msg_alloc");
	memcpy(nng_msg_body(m), data, size);
	if (nng_sendmsg(sock, m, 0) != 0) {
		nng_msg_free(m);
		die("send");
	}
	if (reply != NULL)
		nng_msg_free(reply);
	reply = NULL;
	if (nng_recvmsg(sock, &reply, 0) != 0)
		die("receive");
	if (pt_api_parse_response(nng_msg_body(reply), nng_msg_len(reply), r) != PT_OK)
		die("parse reply");
	if (r->code != PT_API_OK) {
		fprintf(stderr, "sched_bench: %s: %s\n", pt_api_kind_name(q->kind),
		        r->message ? r->message : "refused");
		exit(1);
	}
}

static uint64_t submit(int stages, int64_t steps, uint64_t seed)
{
	pt_api_request q;
	pt_api_response r;
	pt_job_spec spec;
	char path[PATH_MAX];

	void *text;
	size_t len;

	snprintf(path, sizeof(path), "%s/examples/digits.json", PT_SOURCE_ROOT);
	if (pt_file_read(path, 1 << 20, &text, &len) != PT_OK ||
	    pt_job_spec_parse_json(text, len, &spec) != PT_OK)
		die(path);
	free(text);
	free(spec.boundaries);
	spec.boundaries = NULL;
	spec.stages = stages;
	spec.steps = steps;
	spec.seed = seed;
	spec.eval_every = 0;
	spec.checkpoint_every = 0;
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &spec;
	call(&q, &r);
	pt_job_spec_fini(&spec);
	return r.job;
}

/* info gets job id's JobInfo (strings valid until the next call). */
static void info(uint64_t id, pt_api_job_info *ji)
{
	pt_api_request q;
	pt_api_response r;

	pt_api_request_init(&q, PT_API_GET_JOB);
	q.job = id;
	call(&q, &r);
	if (pt_api_response_job(&r, 0, ji) != PT_OK)
		die("GetJob reply");
}

static void wait_final(uint64_t id, pt_api_job_info *ji)
{
	for (;;) {
		info(id, ji);
		if (pt_api_job_state_final(ji->state))
			break;
		usleep(2000);
	}
	if (ji->state != PT_JOB_SUCCEEDED) {
		fprintf(stderr, "sched_bench: job %llu ended %s: %s\n", (unsigned long long)id,
		        pt_api_job_state_name(ji->state), ji->message ? ji->message : "");
		exit(1);
	}
}

static void wait_free(int n)
{
	double t0 = now_s();
	for (;;) {
		pt_api_request q;
		pt_api_response r;
		pt_api_request_init(&q, PT_API_SERVER_INFO);
		call(&q, &r);
		if (r.info.workers_free >= n)
			return;
		if (now_s() - t0 > 30) {
			fprintf(stderr, "sched_bench: %d of %d workers free after 30 s\n",
			        r.info.workers_free, n);
			exit(1);
		}
		usleep(2000);
	}
}

/* point_times gets the server's time of steps 1 and 2 of job id. */
static void point_times(uint64_t id, double *t1, double *t2)
{
	pt_api_request q;
	pt_api_response r;
	pt_api_metric_point p;

	*t1 = *t2 = 0;
	pt_api_request_init(&q, PT_API_WATCH_METRICS);
	q.job = id;
	q.wait_ms = 0;
	call(&q, &r);
	for (size_t i = 0; i < r.n_points; i++) {
		if (pt_api_response_point(&r, i, &p) != PT_OK)
			die("WatchMetrics reply");
		if (p.step == 1)
			*t1 = p.time_unix;
		if (p.step == 2)
			*t2 = p.time_unix;
	}
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(void)
{
	char urls[N_WORKERS][256], pool[N_WORKERS * 260] = "", url[256],
	                                            dir[] = "/tmp/sched-bench.XXXXXX";
	char data_dir[300];
	pid_t pids[N_WORKERS + 1];
	pt_api_job_info ji;
	double solo = 0, t0, place[RUNS], wait[N_QUEUE];
	uint64_t ids[3];

	bench_sibling("../server/pipeserver", bin, sizeof(bin));
	if (mkdtemp(dir) == NULL) {
		perror("sched_bench: mkdtemp");
		return 1;
	}
	snprintf(data_dir, sizeof(data_dir), "%s/data", dir);
	for (int i = 0; i < N_WORKERS; i++) {
		const char *argv[] = {
		    bin,           "--worker", "--listen",        "tcp://127.0.0.1:0",
		    "--log-level", "warn",     "--task-delay-ms", TASK_MS,
		    NULL};
		pids[i] = bench_spawn(argv, urls[i], sizeof(urls[i]));
		snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool), "%s%s", i ? "," : "",
		         urls[i]);
	}
	{
		const char *argv[] = {bin,
		                      "--listen",
		                      "tcp://127.0.0.1:0",
		                      "--data-dir",
		                      data_dir,
		                      "--files-root",
		                      PT_SOURCE_ROOT,
		                      "--pool",
		                      pool,
		                      "--devices",
		                      "none",
		                      "--log-level",
		                      "warn",
		                      NULL};
		pids[N_WORKERS] = bench_spawn(argv, url, sizeof(url));
	}
	if (nng_req0_open(&sock) != 0 || nng_dial(sock, url, NULL, 0) != 0 ||
	    pt_fb_builder_init(&fb, 4096) != PT_OK)
		die("connect to the server");
	nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 60000);
	wait_free(N_WORKERS);

	/* Three 2-stage jobs alone, then together. */
	for (int j = 0; j < 3; j++) {
		wait_free(N_WORKERS);
		t0 = now_s();
		wait_final(submit(2, JOB_STEPS, 1 + (uint64_t)j), &ji);
		solo += now_s() - t0;
	}
	wait_free(N_WORKERS);
	t0 = now_s();
	for (int j = 0; j < 3; j++)
		ids[j] = submit(2, JOB_STEPS, 1 + (uint64_t)j);
	for (int j = 0; j < 3; j++)
		wait_final(ids[j], &ji);
	printf("bench sched_makespan_ratio %.3f\n", (now_s() - t0) / solo);
	printf("# three jobs: %.2f s together, %.2f s one after another\n", now_s() - t0, solo);
	fflush(stdout);

	/* Placement of a 4-stage job. */
	for (int k = 0; k < RUNS; k++) {
		double t1, t2;
		uint64_t id;
		wait_free(N_WORKERS);
		id = submit(4, 3, 10 + (uint64_t)k);
		wait_final(id, &ji);
		point_times(id, &t1, &t2);
		place[k] = ((t1 - ji.submitted_unix) - (t2 - t1)) * 1000;
	}
	qsort(place, RUNS, sizeof(place[0]), cmp_d);
	printf("bench sched_place_ms %.1f\n", place[RUNS / 2]);
	fflush(stdout);

	/* Queue wait with a worker free. */
	for (int k = 0; k < N_QUEUE; k++) {
		uint64_t id;
		wait_free(1);
		id = submit(1, 1, 100 + (uint64_t)k);
		wait_final(id, &ji);
		wait[k] = (ji.started_unix - ji.submitted_unix) * 1000;
	}
	qsort(wait, N_QUEUE, sizeof(wait[0]), cmp_d);
	printf("bench queue_wait_ms_p99 %.2f\n", wait[(int)ceil(0.99 * N_QUEUE) - 1]);
	printf("# queue wait: median %.2f ms, max %.2f ms\n", wait[N_QUEUE / 2], wait[N_QUEUE - 1]);

	if (reply)
		nng_msg_free(reply);
	nng_close(sock);
	pt_fb_builder_fini(&fb);
	for (int i = 0; i <= N_WORKERS; i++) {
		kill(pids[i], SIGTERM);
		waitpid(pids[i], NULL, 0);
	}
	{
		char cmd[400];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "sched_bench: could not remove %s\n", dir);
	}
	return 0;
}
