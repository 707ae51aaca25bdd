/* test_netns.c - a server and its workers on hosts of their own: network
 * namespaces joined by a bridge, with the real `pipeserver` and
 * `pipeserver --worker` binaries started in them by `ip netns exec`.
 *
 * Topology (names carry this process's pid, so runs never collide): a
 * namespace ptn<pid>br holds bridge br0; each host h (0: this test, the
 * client; 1: the server; 2..7: workers w0..w5) is a namespace ptn<pid>h<h>
 * with address 10.99.0.<h+1>/24 on a veth whose other end ptn<pid>p<h> sits
 * on the bridge. Bringing that end down cuts the host off without either
 * side's TCP noticing. This process moves itself into the client namespace
 * before it starts any thread, so every socket it opens lives there.
 *
 * Cases: (a) a 4-stage digits job on w0..w3 gives the losses of the
 * single-process run, bitwise; (b) a worker killed mid-run fails the job
 * within placement.worker_timeout_ms (1.5 s here) naming the stage and the
 * worker, the others are idle at once and the server keeps answering; with
 * max_restarts 1 and a spare the job finishes with the same losses, bitwise,
 * and its last checkpoint is the last step; (c) the same with a link taken
 * down mid-run, and the cut-off worker idle again once the link is back; (d)
 * a wrong protocol version, a wrong or missing token and a busy worker are
 * refused across hosts, and a job naming the busy worker fails saying so;
 * (e) a second server on the server host whose --pool is the six workers
 * (--devices none) runs three 2-stage jobs submitted together at the same
 * time (their run times overlap), each with the losses of its in-process
 * run, bitwise.
 *
 * Needs root and iproute2: otherwise, or when the namespaces or veths cannot
 * be made, it exits 77 saying why. Everything it made (processes,
 * namespaces, links) is removed at exit, also after a failed assertion or
 * SIGTERM/SIGINT; namespaces left by a run that was SIGKILLed (its pid gone)
 * are removed by the next run.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "job.h"
#include "pt_test.h"
#include "worker_fixture.h"

#define N_WORKERS  6
#define N_HOSTS    (2 + N_WORKERS)
#define H_CLIENT   0
#define H_SERVER   1
#define STEPS      400
#define FAULT_STEP 30 /* a fault is injected once the job reports this step */
#define TIMEOUT_MS 1500
#define SLACK_S    1.0 /* after the verdict: teardown, journal, our polling */
#define TOKEN      "netns-secret"
#define NS_PREFIX  "ptn"

static char server_bin[PATH_MAX + 64], ip_bin[64], tmpdir[256], logfile[300], token_file[300];
static char ns_host[N_HOSTS][32], ns_bridge[32];
static bool made_host[N_HOSTS], made_bridge;
static int home_ns = -1;
static wf_proc server, pool_server, workers[N_WORKERS];
static double ref_loss[STEPS]; /* the single-process run */

/* ------------------------------------------------------------- commands -- */

/* run_argv runs argv (argv[0] a path) with its output in the log and
 * returns its exit status (-1: it did not run). Async-signal-safe. */
static int run_argv(const char *const *argv)
{
	int st = 0;
	pid_t pid = fork();

	if (pid == 0) {
		int fd = open(logfile, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ip runs `ip ARGS...` (NULL-terminated) and returns its exit status. */
static int ip(const char *first, ...)
{
	const char *argv[24];
	int n = 0;
	va_list ap;

	argv[n++] = ip_bin;
	argv[n++] = first;
	va_start(ap, first);
	while (n < 23 && (argv[n] = va_arg(ap, const char *)) != NULL)
		n++;
	va_end(ap);
	argv[n] = NULL;
	return run_argv(argv);
}

/* ns_pids kills every process still in namespace ns (not this one). */
static void kill_ns_pids(const char *ns)
{
	char cmd[200], line[64];
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s netns pids %s 2>/dev/null", ip_bin, ns);
	if ((f = popen(cmd, "r")) == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		pid_t pid = (pid_t)atol(line);
		if (pid > 1 && pid != getpid())
			kill(pid, SIGKILL);
	}
	pclose(f);
}

/* ------------------------------------------------------------- topology -- */

static void kill_children(void)
{
	wf_proc *all[N_WORKERS + 2];
	all[0] = &server;
	all[1] = &pool_server;
	for (int i = 0; i < N_WORKERS; i++)
		all[i + 2] = &workers[i];
	for (int i = 0; i < N_WORKERS + 2; i++)
		if (all[i]->pid > 0) {
			kill(all[i]->pid, SIGKILL);
			kill(all[i]->pid, SIGCONT);
			waitpid(all[i]->pid, NULL, 0);
			all[i]->pid = 0;
		}
}

/* teardown removes everything this run made; idempotent and
 * async-signal-safe (the signal handler calls it too). */
static void teardown(void)
{
	kill_children();
	if (home_ns >= 0) {
		setns(home_ns, CLONE_NEWNET);
		close(home_ns);
		home_ns = -1;
	}
	/* Deleting a namespace deletes the veth ends in it, and so their peers. */
	for (int h = 0; h < N_HOSTS; h++)
		if (made_host[h]) {
			ip("netns", "del", ns_host[h], NULL);
			made_host[h] = false;
		}
	if (made_bridge) {
		ip("netns", "del", ns_bridge, NULL);
		made_bridge = false;
	}
}

static void on_signal(int sig)
{
	teardown();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* remove_stale deletes the namespaces of runs whose process is gone (they
 * were SIGKILLed and could not clean up), killing what still runs there. */
static void remove_stale(void)
{
	DIR *d = opendir("/run/netns");
	struct dirent *e;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		const char *n = e->d_name;
		long pid;
		if (strncmp(n, NS_PREFIX, strlen(NS_PREFIX)) != 0 || n[strlen(NS_PREFIX)] < '0' ||
		    n[strlen(NS_PREFIX)] > '9')
			continue;
		pid = atol(n + strlen(NS_PREFIX));
		if (pid == getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		fprintf(stderr, "removing namespace %s of a dead run\n", n);
		kill_ns_pids(n);
		ip("netns", "del", n, NULL);
	}
	closedir(d);
}

static const char *host_addr(int h, char *buf, size_t n)
{
	snprintf(buf, n, "10.99.0.%d", h + 1);
	return buf;
}

/* link_name writes host h's veth end: in its namespace (bridge false) or on
 * the bridge. */
static const char *link_name(int h, bool bridge, char *buf, size_t n)
{
	snprintf(buf, n, NS_PREFIX "%d%c%d", (int)getpid(), bridge ? 'p' : 'e', h);
	return buf;
}

/* topology_up builds the namespaces; false (with a message) when the
 * system does not let us. */
static bool topology_up(void)
{
	char path[64];
	int fd;

	snprintf(ns_bridge, sizeof(ns_bridge), NS_PREFIX "%dbr", (int)getpid());
	if (ip("netns", "add", ns_bridge, NULL) != 0)
		return false;
	made_bridge = true;
	if (ip("-n", ns_bridge, "link", "add", "br0", "type", "bridge", NULL) != 0 ||
	    ip("-n", ns_bridge, "link", "set", "br0", "up", NULL) != 0)
		return false;
	for (int h = 0; h < N_HOSTS; h++) {
		char e[32], p[32], addr[64];
		snprintf(ns_host[h], sizeof(ns_host[h]), NS_PREFIX "%dh%d", (int)getpid(), h);
		if (ip("netns", "add", ns_host[h], NULL) != 0)
			return false;
		made_host[h] = true;
		link_name(h, false, e, sizeof(e));
		link_name(h, true, p, sizeof(p));
		host_addr(h, addr, sizeof(addr));
		strcat(addr, "/24");
		if (ip("link", "add", "name", e, "netns", ns_host[h], "type", "veth", "peer",
		       "name", p, "netns", ns_bridge, NULL) != 0 ||
		    ip("-n", ns_bridge, "link", "set", p, "master", "br0", "up", NULL) != 0 ||
		    ip("-n", ns_host[h], "addr", "add", addr, "dev", e, NULL) != 0 ||
		    ip("-n", ns_host[h], "link", "set", e, "up", NULL) != 0 ||
		    ip("-n", ns_host[h], "link", "set", "lo", "up", NULL) != 0)
			return false;
	}
	/* This process becomes the client host (before any thread exists:
	 * threads keep the namespace they were created in). */
	snprintf(path, sizeof(path), "/run/netns/%s", ns_host[H_CLIENT]);
	if ((home_ns = open("/proc/self/ns/net", O_RDONLY)) < 0 || (fd = open(path, O_RDONLY)) < 0)
		return false;
	if (setns(fd, CLONE_NEWNET) != 0) {
		close(fd);
		return false;
	}
	close(fd);
	return true;
}

/* set_link takes host h's bridge port down or up. */
static void set_link(int h, bool up)
{
	char p[32];
	CU_ASSERT_EQUAL(ip("-n", ns_bridge, "link", "set", link_name(h, true, p, sizeof(p)),
	                   up ? "up" : "down", NULL),
	                0);
}

/* ------------------------------------------------------------ processes -- */

/* start_in runs pipeserver ARGS in host h's namespace. */
static bool start_in(wf_proc *p, int h, const char *const *args)
{
	const char *argv[32];
	int n = 0;

	argv[n++] = ip_bin;
	argv[n++] = "netns";
	argv[n++] = "exec";
	argv[n++] = ns_host[h];
	argv[n++] = server_bin;
	for (int i = 0; args[i] != NULL && n < 31; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	return wf_proc_start(p, argv, logfile);
}

static bool start_worker(int i)
{
	char addr[32], url[64];
	const char *args[] = {"--worker", "--listen",    url,    "--auth-token-file",
	                      token_file, "--log-level", "info", NULL};
	snprintf(url, sizeof(url), "tcp://%s:7000", host_addr(2 + i, addr, sizeof(addr)));
	return start_in(&workers[i], 2 + i, args);
}

static bool start_server(void)
{
	char addr[32], url[64], data_dir[400];
	const char *args[] = {
	    "--listen",  url, "--data-dir",        data_dir,   "--files-root", PT_SOURCE_ROOT,
	    "--threads", "2", "--auth-token-file", token_file, "--log-level",  "info",
	    NULL};
	snprintf(url, sizeof(url), "tcp://%s:7100", host_addr(H_SERVER, addr, sizeof(addr)));
	snprintf(data_dir, sizeof(data_dir), "%s/server-data", tmpdir);
	return start_in(&server, H_SERVER, args);
}

/* ----------------------------------------------------------------- jobs -- */

/* digits_spec: the digits example on 4 stages, STEPS steps, a checkpoint
 * every 20, on the workers ws[0..n) (n > 4: spares; n == 0: in-process). */
static void digits_spec(pt_job_spec *spec, const int *ws, int n, int max_restarts)
{
	const char *urls[N_WORKERS] = {NULL};
	for (int i = 0; i < n; i++)
		urls[i] = workers[ws[i]].url;
	wf_digits_spec(spec, 4, STEPS, urls, n);
	spec->checkpoint_every = 20;
	spec->worker_timeout_ms = TIMEOUT_MS;
	spec->max_restarts = max_restarts;
}

static void ref_metric(void *ctx, const pt_job_metric *m)
{
	(void)ctx;
	if (m->step >= 1 && m->step <= STEPS)
		ref_loss[m->step - 1] = m->loss;
}

static void compute_reference(void)
{
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.on_metric = ref_metric};
	int64_t last = 0;

	digits_spec(&spec, NULL, 0, 0);
	PT_CHECK_OK(pt_job_run(&spec, &o, &h, &last));
	CU_ASSERT_EQUAL(last, STEPS);
	pt_job_spec_fini(&spec);
}

static void expect_reference_losses(wf_api *api, uint64_t id)
{
	static bool have_ref;
	double v[STEPS];

	if (!have_ref) {
		compute_reference();
		have_ref = true;
	}
	CU_ASSERT_EQUAL(wf_api_losses(api, id, v, STEPS), STEPS);
	wf_expect_same_losses(ref_loss, v, STEPS, "distributed");
}

static void expect_contains(const char *text, const char *words)
{
	if (text == NULL || strstr(text, words) == NULL)
		fprintf(stderr, "\"%s\" lacks \"%s\"\n", text ? text : "(null)", words);
	CU_ASSERT(text != NULL && strstr(text, words) != NULL);
}

/* wait_step polls the job until it reports step >= at (false: it ended or
 * 30 s passed first). */
static bool wait_step(wf_api *api, uint64_t id, int64_t at)
{
	pt_api_job_info ji;
	double end = wf_mono() + 30;
	do {
		wf_api_get(api, id, &ji);
		if (ji.step >= at)
			return true;
		if (pt_api_job_state_final(ji.state)) {
			fprintf(stderr, "job %llu ended (%s) before step %lld\n",
			        (unsigned long long)id, ji.message ? ji.message : "",
			        (long long)at);
			return false;
		}
		usleep(5 * 1000);
	} while (wf_mono() < end);
	return false;
}

static int64_t latest_checkpoint(wf_api *api, uint64_t id)
{
	pt_api_request q;
	pt_api_response r;
	int64_t best = -1;

	pt_api_request_init(&q, PT_API_LIST_CHECKPOINTS);
	q.job = id;
	CU_ASSERT_TRUE_FATAL(wf_api_call(api, &q, &r));
	CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
	for (size_t i = 0; i < r.n_checkpoints; i++) {
		pt_api_checkpoint_info c;
		PT_CHECK_OK(pt_api_response_checkpoint(&r, i, &c));
		if (c.step > best)
			best = c.step;
	}
	return best;
}

static void expect_server_answers(wf_api *api)
{
	pt_api_request q;
	pt_api_response r;
	pt_api_request_init(&q, PT_API_SERVER_INFO);
	CU_ASSERT_TRUE_FATAL(wf_api_call(api, &q, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT_EQUAL(r.info.jobs_running, 0);
}

/* The fault a run injects once the job reaches FAULT_STEP. */
typedef enum fault_kind { KILL_WORKER, CUT_LINK } fault_kind;

static void inject(fault_kind k, int w)
{
	if (k == KILL_WORKER) {
		CU_ASSERT_EQUAL(kill(workers[w].pid, SIGKILL), 0);
		CU_ASSERT_EQUAL(waitpid(workers[w].pid, NULL, 0), workers[w].pid);
		workers[w].pid = 0;
	} else {
		set_link(2 + w, false);
	}
}

/* repair undoes the fault: a new process at the same address, or the link
 * back up (then the cut-off worker, its coordinator silent, returns to idle). */
static void repair(fault_kind k, int w)
{
	if (k == KILL_WORKER) {
		CU_ASSERT_TRUE(start_worker(w));
	} else {
		set_link(2 + w, true);
		CU_ASSERT_TRUE(wf_wait_idle(workers[w].url, 2 * TIMEOUT_MS + 1000));
	}
}

/* fault_fails: a job on w0..w3 without restarts, the fault on worker w
 * (stage w): the job fails within the timeout naming the stage and the
 * worker; the others are idle; the server answers. */
static void fault_fails(wf_api *api, fault_kind k, int w)
{
	static const int ws[] = {0, 1, 2, 3};
	pt_job_spec spec;
	pt_api_job_info ji;
	char want[400];
	uint64_t id;
	double t0, dt;

	digits_spec(&spec, ws, 4, 0);
	id = wf_api_submit(api, &spec);
	CU_ASSERT_FATAL(id != 0 && wait_step(api, id, FAULT_STEP));
	t0 = wf_mono();
	inject(k, w);
	CU_ASSERT_EQUAL(wf_api_wait_final(api, id, 20, &ji), PT_JOB_FAILED);
	dt = wf_mono() - t0;
	if (dt > TIMEOUT_MS / 1000.0 + SLACK_S)
		fprintf(stderr, "the job failed %.2f s after the fault\n", dt);
	CU_ASSERT(dt <= TIMEOUT_MS / 1000.0 + SLACK_S);
	snprintf(want, sizeof(want), "stage %d on worker %s: no heartbeat for 1.5 s", w,
	         workers[w].url);
	expect_contains(ji.message, want);
	CU_ASSERT(ji.step >= FAULT_STEP && ji.step < STEPS);
	for (int i = 0; i < 4; i++)
		if (i != w)
			CU_ASSERT_TRUE(wf_wait_idle(workers[i].url, 0));
	expect_server_answers(api);
	repair(k, w);
	pt_job_spec_fini(&spec);
}

/* fault_restarts: the same job with max_restarts 1 and spare w4 finishes;
 * its losses are the single-process run's, bitwise, its last checkpoint is
 * step STEPS, and its message tells the restart. */
static void fault_restarts(wf_api *api, fault_kind k, int w)
{
	static const int ws[] = {0, 1, 2, 3, 4};
	pt_job_spec spec;
	pt_api_job_info ji;
	char want[800];
	uint64_t id;

	digits_spec(&spec, ws, 5, 1);
	id = wf_api_submit(api, &spec);
	CU_ASSERT_FATAL(id != 0 && wait_step(api, id, FAULT_STEP));
	inject(k, w);
	if (wf_api_wait_final(api, id, 60, &ji) != PT_JOB_SUCCEEDED)
		fprintf(stderr, "job ended %d: %s\n", (int)ji.state, ji.message ? ji.message : "");
	CU_ASSERT_EQUAL(ji.state, PT_JOB_SUCCEEDED);
	CU_ASSERT_EQUAL(ji.step, STEPS);
	snprintf(want, sizeof(want),
	         "succeeded after 1 restart (restart 1 of 1 after stage %d on worker %s: no "
	         "heartbeat for 1.5 s: stage %d to %s; resuming from step ",
	         w, workers[w].url, w, workers[4].url);
	expect_contains(ji.message, want);
	CU_ASSERT_EQUAL(latest_checkpoint(api, id), STEPS);
	expect_reference_losses(api, id);
	for (int i = 0; i < N_WORKERS; i++)
		if (i != w)
			CU_ASSERT_TRUE(wf_wait_idle(workers[i].url, 0));
	repair(k, w);
	pt_job_spec_fini(&spec);
}

/* ---------------------------------------------------------------- tests -- */

static void api_open(wf_api *api)
{
	wf_api_open(api, server.url, TOKEN);
}

static void test_netns_job_matches_single_process(void)
{
	static const int ws[] = {0, 1, 2, 3};
	pt_job_spec spec;
	pt_api_job_info ji;
	wf_api api;
	uint64_t id;

	api_open(&api);
	digits_spec(&spec, ws, 4, 0);
	id = wf_api_submit(&api, &spec);
	CU_ASSERT_NOT_EQUAL_FATAL(id, 0);
	if (wf_api_wait_final(&api, id, 60, &ji) != PT_JOB_SUCCEEDED)
		fprintf(stderr, "job ended %d: %s\n", (int)ji.state, ji.message ? ji.message : "");
	CU_ASSERT_EQUAL(ji.state, PT_JOB_SUCCEEDED);
	expect_reference_losses(&api, id);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_TRUE(wf_wait_idle(workers[i].url, 0));
	pt_job_spec_fini(&spec);
	wf_api_close(&api);
}

static void test_netns_killed_worker(void)
{
	wf_api api;
	api_open(&api);
	fault_fails(&api, KILL_WORKER, 2);
	fault_restarts(&api, KILL_WORKER, 1);
	wf_api_close(&api);
}

static void test_netns_link_down(void)
{
	wf_api api;
	api_open(&api);
	fault_fails(&api, CUT_LINK, 3);
	fault_restarts(&api, CUT_LINK, 2);
	wf_api_close(&api);
}

static void test_netns_handshake_refusals(void)
{
	static const int ws[] = {0, 1, 2, 4};
	static const uint8_t key[PT_COMM_KEY_BYTES] = {1};
	pt_worker_request join = {.kind = PT_WORKER_JOIN,
	                          .protocol = 1,
	                          .token = TOKEN,
	                          .rank = 1,
	                          .world = 2,
	                          .timeout_ms = 60000,
	                          .key = key};
	pt_worker_request cancel = {.kind = PT_WORKER_PEERS};
	pt_worker_reply r;
	pt_job_spec spec;
	pt_api_job_info ji;
	char want[400];
	wf_hs a, b;
	wf_api api;
	uint64_t id;

	wf_hs_open(&a, workers[4].url);
	wf_hs_open(&b, workers[4].url);
	wf_hs_call(&a, &join, &r);
	{
		char speaks[80];
		snprintf(speaks, sizeof(speaks),
		         "protocol version 1 not supported (this worker speaks %d)",
		         PT_WORKER_PROTOCOL);
		wf_expect_refusal(&r, speaks);
	}
	join.protocol = PT_WORKER_PROTOCOL;
	join.token = "wrong";
	wf_hs_call(&a, &join, &r);
	wf_expect_refusal(&r, "unauthorized");
	join.token = NULL;
	wf_hs_call(&a, &join, &r);
	wf_expect_refusal(&r, "unauthorized");
	join.token = TOKEN;
	wf_hs_call(&a, &join, &r);
	CU_ASSERT_TRUE_FATAL(r.ok);
	/* The worker tells peers to dial it on the address we reached it at. */
	CU_ASSERT(r.data_url != NULL && strncmp(r.data_url, "tcp://10.99.0.7:", 16) == 0);
	cancel.session = r.session;
	{
		/* Another job (another session key) finds the worker busy. */
		static const uint8_t key2[PT_COMM_KEY_BYTES] = {2};
		join.key = key2;
		wf_hs_call(&b, &join, &r);
		wf_expect_refusal(&r, "worker busy with another job");
		join.key = key;
	}

	/* A job that names the busy worker (and has no spare) fails, its error
	 * naming the stage and worker but not what the worker answered (that
	 * is in the server's log). */
	api_open(&api);
	digits_spec(&spec, ws, 4, 1);
	id = wf_api_submit(&api, &spec);
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, id, 30, &ji), PT_JOB_FAILED);
	snprintf(want, sizeof(want), "stage 3 (worker %s): " PT_JOB_WORKER_UNREACHABLE,
	         workers[4].url);
	expect_contains(ji.message, want);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_TRUE(wf_wait_idle(workers[i].url, 0));
	wf_hs_call(&a, &cancel, &r);
	CU_ASSERT_TRUE(r.ok);
	CU_ASSERT_TRUE(wf_wait_idle(workers[4].url, 0));
	pt_job_spec_fini(&spec);
	wf_api_close(&api);
	wf_hs_close(&a);
	wf_hs_close(&b);
}

/* The pool: three 2-stage jobs on six pool workers run side by side. */
#define POOL_STEPS 300
static double pool_ref[3][POOL_STEPS];

static void pool_ref_metric(void *ctx, const pt_job_metric *m)
{
	double *v = ctx;
	if (m->step >= 1 && m->step <= POOL_STEPS)
		v[m->step - 1] = m->loss;
}

static void test_netns_pool_concurrent(void)
{
	char addr[32], url[64], data_dir[400], pool[8 * 80] = "";
	const char *args[] = {"--listen",
	                      url,
	                      "--data-dir",
	                      data_dir,
	                      "--files-root",
	                      PT_SOURCE_ROOT,
	                      "--threads",
	                      "2",
	                      "--auth-token-file",
	                      token_file,
	                      "--pool",
	                      pool,
	                      "--devices",
	                      "none",
	                      "--log-level",
	                      "info",
	                      NULL};
	pt_job_spec spec[3];
	pt_api_job_info ji[3];
	pt_api_request q;
	pt_api_response r;
	wf_api api;
	uint64_t id[3];
	double t0;

	for (int i = 0; i < N_WORKERS; i++)
		snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool), "%s%s", i ? "," : "",
		         workers[i].url);
	snprintf(url, sizeof(url), "tcp://%s:7200", host_addr(H_SERVER, addr, sizeof(addr)));
	snprintf(data_dir, sizeof(data_dir), "%s/pool-data", tmpdir);
	CU_ASSERT_FATAL(start_in(&pool_server, H_SERVER, args));
	wf_api_open(&api, pool_server.url, TOKEN);
	t0 = wf_mono();
	for (;;) { /* every worker probed idle */
		int idle = 0;
		pt_api_request_init(&q, PT_API_SERVER_INFO);
		CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
		idle = r.info.workers_free;
		if (idle == N_WORKERS || wf_mono() - t0 > 20)
			break;
		usleep(50000);
	}
	CU_ASSERT_EQUAL_FATAL(r.info.workers_free, N_WORKERS);
	for (int j = 0; j < 3; j++) {
		pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
		pt_job_hooks h = {.ctx = pool_ref[j], .on_metric = pool_ref_metric};
		int64_t last = 0;
		wf_digits_spec(&spec[j], 2, POOL_STEPS, NULL, 0);
		spec[j].seed = 100 + (uint64_t)j;
		spec[j].worker_timeout_ms = TIMEOUT_MS;
		PT_CHECK_OK(pt_job_run(&spec[j], &o, &h, &last));
	}
	for (int j = 0; j < 3; j++)
		CU_ASSERT_NOT_EQUAL_FATAL((id[j] = wf_api_submit(&api, &spec[j])), 0);
	for (int j = 0; j < 3; j++) {
		double v[POOL_STEPS];
		if (wf_api_wait_final(&api, id[j], 120, &ji[j]) != PT_JOB_SUCCEEDED)
			fprintf(stderr, "pooled job %d: %s\n", j,
			        ji[j].message ? ji[j].message : "");
		CU_ASSERT_EQUAL(ji[j].state, PT_JOB_SUCCEEDED);
		CU_ASSERT_EQUAL(wf_api_losses(&api, id[j], v, POOL_STEPS), POOL_STEPS);
		wf_expect_same_losses(pool_ref[j], v, POOL_STEPS, "pooled");
		wf_api_get(&api, id[j], &ji[j]); /* wf_api_losses reused the reply */
	}
	for (int a = 0; a < 3; a++)
		for (int b = a + 1; b < 3; b++) {
			bool overlap = ji[a].started_unix < ji[b].finished_unix &&
			               ji[b].started_unix < ji[a].finished_unix;
			if (!overlap)
				fprintf(
				    stderr,
				    "jobs %d and %d did not overlap: [%.3f, %.3f] [%.3f, %.3f]\n",
				    a, b, ji[a].started_unix, ji[a].finished_unix,
				    ji[b].started_unix, ji[b].finished_unix);
			CU_ASSERT(overlap);
		}
	for (int j = 0; j < 3; j++)
		pt_job_spec_fini(&spec[j]);
	wf_api_close(&api);
	CU_ASSERT_EQUAL(wf_proc_stop(&pool_server), 0);
	for (int i = 0; i < N_WORKERS; i++)
		CU_ASSERT_TRUE(wf_wait_idle(workers[i].url, 5000));
}

static const pt_test_case netns_tests[] = {
    {"test_netns_pool_concurrent", test_netns_pool_concurrent},
    {"test_netns_job_matches_single_process", test_netns_job_matches_single_process},
    {"test_netns_killed_worker", test_netns_killed_worker},
    {"test_netns_link_down", test_netns_link_down},
    {"test_netns_handshake_refusals", test_netns_handshake_refusals},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"netns", netns_tests},
    {NULL, NULL},
};

static int skip(const char *why)
{
	printf("test_netns: %s: skipping\n", why);
	teardown();
	return 77;
}

int main(void)
{
	static const char *const ips[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
	int rc;

	if (geteuid() != 0)
		return skip("needs root (network namespaces, veth pairs)");
	for (size_t i = 0; i < sizeof(ips) / sizeof(ips[0]) && ip_bin[0] == '\0'; i++)
		if (access(ips[i], X_OK) == 0)
			snprintf(ip_bin, sizeof(ip_bin), "%s", ips[i]);
	if (ip_bin[0] == '\0')
		return skip("iproute2's ip not found");
	if (!pt_test_binary("../server/pipeserver", server_bin, sizeof(server_bin)))
		return skip("pipeserver not built");
	signal(SIGPIPE, SIG_IGN);
	if (!pt_test_tmpdir("test_netns", tmpdir, sizeof(tmpdir)))
		return 99;
	snprintf(logfile, sizeof(logfile), "%s/processes.log", tmpdir);
	snprintf(token_file, sizeof(token_file), "%s/token", tmpdir);
	{
		FILE *f = fopen(token_file, "w");
		if (f == NULL || fputs(TOKEN "\n", f) < 0 || fclose(f) != 0)
			return 99;
	}
	remove_stale();
	atexit(teardown);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGHUP, on_signal);
	if (!topology_up()) {
		fprintf(stderr, "see %s\n", logfile);
		return skip("cannot create network namespaces, veth pairs or a bridge");
	}
	for (int i = 0; i < N_WORKERS; i++)
		if (!start_worker(i)) {
			fprintf(stderr, "worker %d did not start (see %s)\n", i, logfile);
			return 99;
		}
	if (!start_server()) {
		fprintf(stderr, "the server did not start (see %s)\n", logfile);
		return 99;
	}
	rc = pt_test_main(suites);
	if (wf_proc_stop(&server) != 0)
		rc = 1;
	for (int i = 0; i < N_WORKERS; i++)
		if (wf_proc_stop(&workers[i]) != 0) {
			fprintf(stderr, "worker %d did not exit cleanly\n", i);
			rc = 1;
		}
	teardown();
	return pt_test_tmpdir_done(tmpdir, rc);
}
