/* test_workers.c - jobs whose stages run in `pipeserver --worker` processes.
 *
 * Starts real worker processes (build/server/pipeserver, found next to this
 * program's directory through /proc/self/exe) on tcp://127.0.0.1:0 and
 * checks: a 2-stage digits job on two workers gives the same losses, bitwise,
 * as the same job on local stage threads, and a second job runs on the same
 * workers; the handshake refuses a wrong protocol, a wrong token and a
 * second join to a busy worker, each with its message; a normal pipeserver
 * runs a submitted job on the workers. Every process exits 0 on SIGTERM.
 */
#include "api/api.h"
#include "handshake.h"
#include "job.h"
#include "pt_test.h"

#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#define STEPS 30

static char server_bin[PATH_MAX + 64];
static char tmpdir[256];

typedef struct proc {
	pid_t pid;
	char url[256];
} proc;

/* proc_start runs pipeserver with args (NULL-terminated) and reads its
 * `pipeserver listening on <url>` line. */
static bool proc_start(proc *p, const char *const *args)
{
	const char *argv[32];
	int out[2], n = 0;
	char line[512], logpath[600];
	FILE *f;

	memset(p, 0, sizeof(*p));
	argv[n++] = server_bin;
	for (int i = 0; args[i] && n < 30; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	if (pipe(out) != 0)
		return false;
	snprintf(logpath, sizeof(logpath), "%s/processes.log", tmpdir);
	if ((p->pid = fork()) == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
		dup2(out[1], 1);
		if (fd >= 0)
			dup2(fd, 2);
		close(out[0]);
		close(out[1]);
		execv(server_bin, (char *const *)argv);
		_exit(127);
	}
	close(out[1]);
	f = fdopen(out[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
		fprintf(stderr, "pipeserver printed no line (see %s)\n", logpath);
		if (f)
			fclose(f);
		return false;
	}
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	return sscanf(line, "pipeserver listening on %255s", p->url) == 1;
}

static bool worker_start(proc *p, const char *token_file)
{
	const char *args[] = {"--worker",    "--listen", "tcp://127.0.0.1:0",
	                      "--log-level", "debug",    token_file ? "--auth-token-file" : NULL,
	                      token_file,    NULL};
	return proc_start(p, args);
}

/* proc_stop sends SIGTERM and returns the exit status (-1: killed). */
static int proc_stop(proc *p)
{
	int st = 0;
	kill(p->pid, SIGTERM);
	if (waitpid(p->pid, &st, 0) != p->pid)
		return -2;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ----------------------------------------------------------------- jobs -- */

typedef struct losses {
	double v[STEPS + 1];
	int n;
} losses;

static void on_metric(void *ctx, const pt_job_metric *m)
{
	losses *l = ctx;
	if (l->n < STEPS + 1)
		l->v[l->n++] = m->loss;
}

static void digits_spec(pt_job_spec *spec, const proc *w0, const proc *w1)
{
	void *buf;
	size_t len;

	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path("examples/digits.json"), &buf, &len));
	memset(spec, 0, sizeof(*spec));
	PT_CHECK_OK(pt_job_spec_decode(buf, len, spec));
	free(buf);
	spec->steps = STEPS;
	spec->stages = 2;
	free(spec->boundaries);
	spec->boundaries = NULL;
	spec->eval_every = 0;
	if (w0 != NULL) {
		spec->workers = calloc(2, sizeof(char *));
		CU_ASSERT_PTR_NOT_NULL_FATAL(spec->workers);
		spec->workers[0] = strdup(w0->url);
		spec->workers[1] = strdup(w1->url);
		spec->n_workers = 2;
	}
}

static void run_job(const proc *w0, const proc *w1, losses *out)
{
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = out, .on_metric = on_metric};
	int64_t last = 0;

	memset(out, 0, sizeof(*out));
	digits_spec(&spec, w0, w1);
	PT_CHECK_OK(pt_job_run(&spec, &o, &h, &last));
	CU_ASSERT_EQUAL(last, STEPS);
	CU_ASSERT_EQUAL(out->n, STEPS);
	pt_job_spec_fini(&spec);
}

static void test_workers_job_matches_local(void)
{
	proc w0, w1;
	losses local, remote, again;

	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, NULL));
	run_job(NULL, NULL, &local);
	run_job(&w0, &w1, &remote);
	for (int i = 0; i < STEPS; i++)
		if (memcmp(&local.v[i], &remote.v[i], sizeof(double)) != 0) {
			fprintf(stderr, "step %d: local loss %.17g, on workers %.17g\n", i + 1,
			        local.v[i], remote.v[i]);
			CU_FAIL("losses differ");
			break;
		}
	CU_ASSERT(isfinite(remote.v[STEPS - 1]) && remote.v[STEPS - 1] < remote.v[0]);
	/* The workers are idle again: a second job runs on them. */
	run_job(&w0, &w1, &again);
	CU_ASSERT_EQUAL(memcmp(again.v, remote.v, sizeof(double) * STEPS), 0);
	CU_ASSERT_EQUAL(proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(proc_stop(&w1), 0);
}

/* ------------------------------------------------------------ handshake -- */

typedef struct hs {
	nng_socket sock;
	pt_fb_builder b;
	nng_msg *last;
} hs;

static void hs_open(hs *c, const char *url)
{
	memset(c, 0, sizeof(*c));
	CU_ASSERT_EQUAL_FATAL(nng_req0_open(&c->sock), 0);
	nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, 10000);
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	CU_ASSERT_EQUAL_FATAL(nng_dial(c->sock, url, NULL, 0), 0);
	PT_CHECK_OK(pt_fb_builder_init(&c->b, 0));
}

static void hs_close(hs *c)
{
	if (c->last)
		nng_msg_free(c->last);
	nng_close(c->sock);
	pt_fb_builder_fini(&c->b);
}

/* hs_call sends q and decodes the reply into r (strings valid until the
 * next call). */
static void hs_call(hs *c, const pt_worker_request *q, pt_worker_reply *r)
{
	const uint8_t *d;
	size_t n;
	nng_msg *m;

	if (c->last)
		nng_msg_free(c->last);
	c->last = NULL;
	PT_CHECK_OK(pt_handshake_encode_request(&c->b, q, &d, &n));
	CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&m, n), 0);
	memcpy(nng_msg_body(m), d, n);
	CU_ASSERT_EQUAL_FATAL(nng_sendmsg(c->sock, m, 0), 0);
	CU_ASSERT_EQUAL_FATAL(nng_recvmsg(c->sock, &c->last, 0), 0);
	PT_CHECK_OK(
	    pt_handshake_decode_reply(nng_msg_body(c->last), nng_msg_len(c->last), q->kind, r));
}

static void expect_refusal(const pt_worker_reply *r, const char *words)
{
	CU_ASSERT_FALSE(r->ok);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r->message);
	if (strstr(r->message, words) == NULL)
		fprintf(stderr, "refusal \"%s\" lacks \"%s\"\n", r->message, words);
	CU_ASSERT_PTR_NOT_NULL(strstr(r->message, words));
}

static void test_workers_handshake_refusals(void)
{
	char token_file[400];
	proc w;
	hs a, b;
	pt_worker_request join = {.kind = PT_WORKER_JOIN, .protocol = 1, .rank = 1, .world = 2};
	pt_worker_request cancel = {0};
	pt_worker_reply r;
	uint64_t session;

	snprintf(token_file, sizeof(token_file), "%s/token", tmpdir);
	pt_test_write_file(token_file, "s3cret\n", 7);
	CU_ASSERT_FATAL(worker_start(&w, token_file));
	hs_open(&a, w.url);
	hs_open(&b, w.url);

	hs_call(&a, &join, &r);
	expect_refusal(&r, "protocol version 1 not supported (this worker speaks 2)");
	join.protocol = PT_WORKER_PROTOCOL;
	hs_call(&a, &join, &r);
	expect_refusal(&r, "unauthorized");
	join.token = "wrong";
	hs_call(&a, &join, &r);
	expect_refusal(&r, "unauthorized");

	join.token = "s3cret";
	hs_call(&a, &join, &r);
	CU_ASSERT_TRUE_FATAL(r.ok);
	CU_ASSERT(r.data_url != NULL && strncmp(r.data_url, "tcp://127.0.0.1:", 16) == 0);
	session = r.session;
	CU_ASSERT_NOT_EQUAL(session, 0);
	/* Busy: a second join (another coordinator) is refused. */
	hs_call(&b, &join, &r);
	expect_refusal(&r, "worker busy with another job");
	/* A peer list for an unknown session is refused; the owner's cancel
	 * frees the worker. */
	cancel.session = session + 1;
	hs_call(&b, &cancel, &r);
	expect_refusal(&r, "no such session");
	cancel.session = session;
	hs_call(&a, &cancel, &r);
	CU_ASSERT_TRUE(r.ok);
	hs_call(&b, &join, &r);
	CU_ASSERT_TRUE(r.ok);
	cancel.session = r.session;
	hs_call(&b, &cancel, &r);
	CU_ASSERT_TRUE(r.ok);

	hs_close(&a);
	hs_close(&b);
	CU_ASSERT_EQUAL(proc_stop(&w), 0);
}

/* A job naming a worker that needs a token the run does not present fails
 * naming the stage and the worker; with the token it starts. */
static void test_workers_job_errors_name_worker(void)
{
	char token_file[400];
	proc w0, w1;
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};

	snprintf(token_file, sizeof(token_file), "%s/token2", tmpdir);
	pt_test_write_file(token_file, "tok\n", 4);
	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, token_file));
	digits_spec(&spec, &w0, &w1);
	spec.steps = 2;
	PT_CHECK_ERR_MSG(pt_job_run(&spec, &o, NULL, NULL), PT_ERR_STATE, "unauthorized");
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), w1.url));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "stage 1"));
	/* The first worker's session was cancelled: the next job gets it. */
	o.worker_token = "tok"; /* both accept it: w0 has no token */
	PT_CHECK_OK(pt_job_run(&spec, &o, NULL, NULL));
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(proc_stop(&w1), 0);
}

/* --------------------------------------------------------------- server -- */

static void test_workers_server_job(void)
{
	char data_dir[400];
	proc w0, w1, srv;
	pt_job_spec spec;
	pt_fb_builder b;
	nng_socket sock;
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	nng_msg *reply = NULL;
	uint64_t id = 0;
	double t0;
	bool done = false;

	/* The server and one worker share a token: the server presents its own
	 * token to the workers it joins (w0 needs none). */
	char token_file[400];
	snprintf(token_file, sizeof(token_file), "%s/server-token", tmpdir);
	pt_test_write_file(token_file, "cluster-secret\n", 15);
	snprintf(data_dir, sizeof(data_dir), "%s/server-data", tmpdir);
	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, token_file));
	{
		const char *args[] = {
		    "--listen",          "tcp://127.0.0.1:0", "--data-dir", data_dir,
		    "--files-root",      PT_SOURCE_ROOT,      "--threads",  "2",
		    "--auth-token-file", token_file,          NULL};
		CU_ASSERT_FATAL(proc_start(&srv, args));
	}
	digits_spec(&spec, &w0, &w1);
	CU_ASSERT_EQUAL_FATAL(nng_req0_open(&sock), 0);
	nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 20000);
	nng_socket_set_ms(sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	CU_ASSERT_EQUAL_FATAL(nng_dial(sock, srv.url, NULL, 0), 0);
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));

	t0 = (double)time(NULL);
	for (int k = 0; !done && (double)time(NULL) - t0 < 120; k++) {
		const uint8_t *d;
		size_t n;
		nng_msg *m;
		if (k > 0)
			usleep(100 * 1000);
		pt_api_request_init(&q, k == 0 ? PT_API_SUBMIT_JOB : PT_API_GET_JOB);
		q.id = (uint64_t)k + 1;
		q.auth_token = "cluster-secret";
		q.spec = k == 0 ? &spec : NULL;
		q.job = id;
		PT_CHECK_OK(pt_api_build_request(&b, &q, &d, &n));
		CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&m, n), 0);
		memcpy(nng_msg_body(m), d, n);
		CU_ASSERT_EQUAL_FATAL(nng_sendmsg(sock, m, 0), 0);
		if (reply)
			nng_msg_free(reply);
		reply = NULL;
		CU_ASSERT_EQUAL_FATAL(nng_recvmsg(sock, &reply, 0), 0);
		PT_CHECK_OK(pt_api_parse_response(nng_msg_body(reply), nng_msg_len(reply), &r));
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		if (k == 0) {
			id = r.job;
			continue;
		}
		PT_CHECK_OK(pt_api_response_job(&r, 0, &ji));
		if (ji.state == PT_JOB_SUCCEEDED || ji.state == PT_JOB_FAILED ||
		    ji.state == PT_JOB_CANCELLED) {
			if (ji.state != PT_JOB_SUCCEEDED)
				fprintf(stderr, "job ended %d: %s\n", (int)ji.state,
				        ji.message ? ji.message : "");
			CU_ASSERT_EQUAL(ji.state, PT_JOB_SUCCEEDED);
			CU_ASSERT_EQUAL(ji.step, STEPS);
			done = true;
		}
	}
	CU_ASSERT_TRUE(done);
	if (reply)
		nng_msg_free(reply);
	nng_close(sock);
	pt_fb_builder_fini(&b);
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(proc_stop(&srv), 0);
	CU_ASSERT_EQUAL(proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(proc_stop(&w1), 0);
}

static const pt_test_case worker_tests[] = {
    {"test_workers_job_matches_local", test_workers_job_matches_local},
    {"test_workers_handshake_refusals", test_workers_handshake_refusals},
    {"test_workers_job_errors_name_worker", test_workers_job_errors_name_worker},
    {"test_workers_server_job", test_workers_server_job},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"workers", worker_tests},
    {NULL, NULL},
};

int main(void)
{
	if (!pt_test_binary("../server/pipeserver", server_bin, sizeof(server_bin))) {
		printf("pipeserver not found at %s: skipping\n", server_bin);
		return 77;
	}
	signal(SIGPIPE, SIG_IGN);
	if (!pt_test_tmpdir("test_workers", tmpdir, sizeof(tmpdir)))
		return 99;
	return pt_test_tmpdir_done(tmpdir, pt_test_main(suites));
}
