/* test_procs.c - stages in separate OS processes (tools/pt-stage) over nng
 * tcp loopback: the same losses as in-process, and a stage killed mid-step
 * ends the step with a clear error while the other stages survive. */
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pipe_fixture.h"
#include "pt_test.h"
#include "runtime.h"

#define P     4
#define M     4
#define STEPS 8

typedef struct child {
	pid_t pid;
	FILE *in, *out;
	char url[256];
} child;

typedef struct procs {
	child c[P + 1];
	uint8_t key[PT_COMM_KEY_BYTES]; /* the session's */
	pt_comm *comm;
	pt_coordinator *coord;
} procs;

static const char *stage_binary(void)
{
	static char path[4096];
	return pt_test_binary("../tools/pt-stage", path, sizeof(path)) ? path : NULL;
}

/* spawn starts pt-stage for rank, hands it the session key on stdin and
 * reads the URL it listens on. */
static void spawn(child *ch, const char *bin, int rank, int delay_ms, const uint8_t *key)
{
	int to[2], from[2];
	char r[16], w[16], d[16], hex[2 * PT_COMM_KEY_BYTES + 1];
	CU_ASSERT_FATAL(pipe(to) == 0 && pipe(from) == 0);
	snprintf(r, sizeof(r), "%d", rank);
	snprintf(w, sizeof(w), "%d", P + 1);
	snprintf(d, sizeof(d), "%d", delay_ms);
	ch->pid = fork();
	CU_ASSERT_FATAL(ch->pid >= 0);
	if (ch->pid == 0) {
		dup2(to[0], 0);
		dup2(from[1], 1);
		close(to[1]);
		close(from[0]);
		execl(bin, bin, "--rank", r, "--world", w, "--timeout-ms", "5000",
		      "--task-delay-ms", d, (char *)NULL);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	ch->in = fdopen(to[1], "w");
	ch->out = fdopen(from[0], "r");
	pt_comm_key_format(key, hex);
	fprintf(ch->in, "%s\n", hex);
	fflush(ch->in);
	char line[512];
	CU_ASSERT_FATAL(fgets(line, sizeof(line), ch->out) != NULL);
	CU_ASSERT_FATAL(sscanf(line, "listening %255s", ch->url) == 1);
}

static bool procs_graphs; /* procs_up: the stages' use_graphs */

/* Starts P stage processes and the coordinator, configured over the wire.
 * delay_ms slows stage `slow` (0: none). */
static bool procs_up(procs *pr, int slow, int delay_ms)
{
	const char *bin = stage_binary();
	const char *urls[P + 1];
	pt_stage_config sc[P];
	pt_pipeline_config pc = fx_pipeline_config(P, M, PT_MODE_SYNC);
	pt_nng_options o = {.listen_url = "tcp://127.0.0.1:0",
	                    .world = P + 1,
	                    .rank = 0,
	                    .timeout_ms = 5000,
	                    .key = pr->key};
	if (bin == NULL) {
		printf("\n    skip: tools/pt-stage not built next to the tests\n");
		return false;
	}
	memset(pr, 0, sizeof(*pr));
	PT_CHECK_OK(pt_comm_key_generate(pr->key));
	PT_CHECK_OK(pt_nng_comm_create(&pr->comm, &o));
	urls[0] = pt_nng_comm_url(pr->comm);
	for (int s = 1; s <= P; s++) {
		spawn(&pr->c[s], bin, s, s == slow ? delay_ms : 0, pr->key);
		urls[s] = pr->c[s].url;
	}
	for (int s = 1; s <= P; s++) {
		for (int i = 0; i <= P; i++)
			fprintf(pr->c[s].in, "%s%s", i ? " " : "", urls[i]);
		fprintf(pr->c[s].in, "\n");
		fflush(pr->c[s].in);
	}
	PT_CHECK_OK(pt_nng_comm_connect(pr->comm, urls));
	pc.timeout_ms = 5000;
	PT_CHECK_OK(pt_coordinator_create(&pr->coord, &pc, pr->comm));
	fx_stage_configs(sc, P, M, PT_MODE_SYNC, false, (int[]){0, 1, 2, 4, 5});
	for (int s = 0; s < P; s++)
		sc[s].use_graphs = procs_graphs;
	PT_CHECK_OK(pt_coordinator_configure(pr->coord, sc));
	return true;
}

/* Stops what is left; returns how many stage processes exited with status 0. */
static int procs_down(procs *pr)
{
	int clean = 0;
	pt_coordinator_stop(pr->coord);
	for (int s = 1; s <= P; s++) {
		int status = 0;
		if (pr->c[s].pid > 0 && waitpid(pr->c[s].pid, &status, 0) == pr->c[s].pid &&
		    WIFEXITED(status) && WEXITSTATUS(status) == 0)
			clean++;
		fclose(pr->c[s].in);
		fclose(pr->c[s].out);
	}
	pt_coordinator_destroy(pr->coord);
	pt_comm_destroy(pr->comm);
	return clean;
}

static void in_process_losses(double *loss)
{
	pt_local_group *g;
	pt_comm *comms[P + 1];
	pt_stage *st[P + 1];
	pt_stage_config sc[P];
	pt_pipeline_config pc = fx_pipeline_config(P, M, PT_MODE_SYNC);
	pt_coordinator *coord;
	fx_data d;
	fx_stage_configs(sc, P, M, PT_MODE_SYNC, false, (int[]){0, 1, 2, 4, 5});
	PT_CHECK_OK(pt_local_group_create(&g, P + 1));
	for (int i = 0; i <= P; i++)
		PT_CHECK_OK(pt_local_comm_create(&comms[i], g, i));
	for (int s = 1; s <= P; s++) {
		PT_CHECK_OK(pt_stage_create(&st[s], &sc[s - 1], comms[s]));
		PT_CHECK_OK(pt_stage_start(st[s]));
	}
	PT_CHECK_OK(pt_coordinator_create(&coord, &pc, comms[0]));
	fx_data_up(&d, M);
	for (int i = 0; i < STEPS; i++) {
		pt_pipe_step_result r;
		fx_data_next(&d, i);
		PT_CHECK_OK(pt_coordinator_step(coord, &d.x, &d.y, i, &r));
		loss[i] = r.loss;
	}
	fx_data_down(&d);
	PT_CHECK_OK(pt_coordinator_stop(coord));
	for (int s = 1; s <= P; s++) {
		pt_stage_join(st[s]);
		pt_stage_destroy(st[s]);
	}
	pt_coordinator_destroy(coord);
	for (int i = 0; i <= P; i++)
		pt_comm_destroy(comms[i]);
	pt_local_group_destroy(g);
}

/* Eager in-process losses against stage processes over nng, eager or (with
 * graphs) replaying from step 5 on: bitwise equal either way. */
static void same_losses_as_in_process(bool graphs)
{
	procs pr;
	fx_data d;
	double ref[STEPS], got[STEPS];
	in_process_losses(ref);
	procs_graphs = graphs;
	if (!procs_up(&pr, 0, 0))
		return;
	fx_data_up(&d, M);
	for (int i = 0; i < STEPS; i++) {
		pt_pipe_step_result r;
		fx_data_next(&d, i);
		PT_CHECK_OK(pt_coordinator_step(pr.coord, &d.x, &d.y, i, &r));
		got[i] = r.loss;
	}
	fx_data_down(&d);
	CU_ASSERT_EQUAL(memcmp(ref, got, sizeof(ref)), 0);
	CU_ASSERT(got[STEPS - 1] < got[0]);
	CU_ASSERT_EQUAL(procs_down(&pr), P);
	procs_graphs = false;
}

static void test_procs_same_losses_as_in_process(void)
{
	same_losses_as_in_process(false);
	same_losses_as_in_process(true);
}

typedef struct killer {
	pid_t pid;
	int after_ms;
} killer;

static void *kill_later(void *arg)
{
	killer *k = arg;
	struct timespec ts = {k->after_ms / 1000, (long)(k->after_ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
	kill(k->pid, SIGKILL);
	return NULL;
}

static void test_procs_killed_stage_fails_step_cleanly(void)
{
	procs pr;
	fx_data d;
	pt_pipe_step_result r;
	pthread_t th;
	/* Stage 3 takes 100 ms per task: a step lasts about a second. */
	if (!procs_up(&pr, 3, 100))
		return;
	fx_data_up(&d, M);
	fx_data_next(&d, 0);
	PT_CHECK_OK(pt_coordinator_step(pr.coord, &d.x, &d.y, 0, &r));
	killer k = {pr.c[3].pid, 300};
	pthread_create(&th, NULL, kill_later, &k);
	double t0 = pt_now();
	fx_data_next(&d, 1);
	pt_err rv = pt_coordinator_step(pr.coord, &d.x, &d.y, 1, &r);
	double took = pt_now() - t0;
	pthread_join(th, NULL);
	printf("\n    killed stage: %s (after %.2f s)\n", pt_last_error(), took);
	CU_ASSERT(rv == PT_ERR_CLOSED || rv == PT_ERR_TIMEOUT);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "stage 3"));
	CU_ASSERT(took < 7.0); /* within the 5 s timeout, plus slack */
	fx_data_down(&d);
	/* The three survivors stop cleanly when told to. */
	CU_ASSERT_EQUAL(procs_down(&pr), P - 1);
}

static const pt_test_case tests[] = {
    {"test_procs_same_losses_as_in_process", test_procs_same_losses_as_in_process},
    {"test_procs_killed_stage_fails_step_cleanly", test_procs_killed_stage_fails_step_cleanly},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
	const pt_test_suite suites[] = {{"procs", tests}, {NULL, NULL}};
	signal(SIGPIPE, SIG_IGN);
	pt_runtime_ensure_passive_wait(argv);
	return pt_test_main(suites);
}
