/* worker_fixture.c - see worker_fixture.h. */
#include "worker_fixture.h"

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/req.h>

#include "job.h"
#include "pt_test.h"

bool wf_proc_start(wf_proc *p, const char *const *argv, const char *log)
{
	int out[2];
	char line[512];
	FILE *f;

	memset(p, 0, sizeof(*p));
	if (pipe(out) != 0)
		return false;
	pid_t parent = getpid();
	if ((p->pid = fork()) == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		pt_test_child_dies_with(parent);
		dup2(out[1], 1);
		if (fd >= 0)
			dup2(fd, 2);
		close(out[0]);
		close(out[1]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(out[1]);
	if (p->pid < 0) {
		p->pid = 0;
		close(out[0]);
		return false;
	}
	f = fdopen(out[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
		fprintf(stderr, "%s printed no line (see %s)\n", argv[0], log);
		if (f)
			fclose(f);
		return false;
	}
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	return sscanf(line, "pipeserver listening on %255s", p->url) == 1;
}

int wf_proc_stop(wf_proc *p)
{
	int st = 0;
	pid_t r = 0;
	kill(p->pid, SIGTERM);
	/* A process that does not stop within 60 s is killed (and the test
	 * fails on the -1): a wedged server never hangs the suite. */
	for (int i = 0; i < 6000 && (r = waitpid(p->pid, &st, WNOHANG)) == 0; i++)
		usleep(10 * 1000);
	if (r == 0) {
		char cmd[160];
		fprintf(stderr, "pid %d did not stop within 60 s of SIGTERM: killed\n",
		        (int)p->pid);
		/* Where it was stuck, for the log (where gdb is installed). */
		snprintf(cmd, sizeof(cmd),
		         "command -v gdb >/dev/null && gdb -p %d -batch -ex 'thread apply all bt' "
		         "2>/dev/null | grep -E '^(#|Thread)' >&2",
		         (int)p->pid);
		if (system(cmd) != 0)
			fprintf(stderr, "(no stacks: gdb missing or failed)\n");
		kill(p->pid, SIGKILL);
		r = waitpid(p->pid, &st, 0);
	}
	if (r != p->pid)
		return -2;
	p->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

double wf_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void wf_digits_spec(pt_job_spec *spec, int stages, int64_t steps, const char *const *urls, int n)
{
	pt_test_digits_spec(spec);
	spec->steps = steps;
	spec->stages = stages;
	free(spec->boundaries);
	spec->boundaries = NULL;
	spec->eval_every = 0;
	if (n > 0) {
		spec->workers = calloc((size_t)n, sizeof(char *));
		CU_ASSERT_PTR_NOT_NULL_FATAL(spec->workers);
		for (int i = 0; i < n; i++)
			spec->workers[i] = strdup(urls[i]);
		spec->n_workers = n;
	}
}

void wf_expect_same_losses(const double *want, const double *got, int n, const char *what)
{
	for (int i = 0; i < n; i++)
		if (memcmp(&want[i], &got[i], sizeof(double)) != 0) {
			fprintf(stderr, "step %d: loss %.17g expected, %s %.17g\n", i + 1, want[i],
			        what, got[i]);
			CU_FAIL("losses differ");
			return;
		}
}

/* req_open opens a REQ socket to url that never resends. */
static void req_open(nng_socket *s, const char *url, int timeout_ms, pt_fb_builder *b)
{
	CU_ASSERT_EQUAL_FATAL(nng_req0_open(s), 0);
	nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, timeout_ms);
	nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, timeout_ms); /* no ready pipe: bounded */
	nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	CU_ASSERT_EQUAL_FATAL(nng_dial(*s, url, NULL, 0), 0);
	PT_CHECK_OK(pt_fb_builder_init(b, 0));
}

/* ------------------------------------------------------------ handshake -- */

void wf_hs_open(wf_hs *c, const char *url)
{
	memset(c, 0, sizeof(*c));
	req_open(&c->sock, url, 10000, &c->b);
}

void wf_hs_close(wf_hs *c)
{
	if (c->last)
		nng_msg_free(c->last);
	pt_test_nng_close(c->sock.id);
	pt_fb_builder_fini(&c->b);
}

void wf_hs_call(wf_hs *c, const pt_worker_request *q, pt_worker_reply *r)
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

void wf_expect_refusal(const pt_worker_reply *r, const char *words)
{
	CU_ASSERT_FALSE(r->ok);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r->message);
	if (strstr(r->message, words) == NULL)
		fprintf(stderr, "refusal \"%s\" lacks \"%s\"\n", r->message, words);
	CU_ASSERT_PTR_NOT_NULL(strstr(r->message, words));
}

bool wf_worker_idle(const char *url, char *state, size_t n)
{
	wf_hs c;
	pt_worker_request q = {.kind = PT_WORKER_PING};
	pt_worker_reply r;
	bool idle;

	const uint8_t *d;
	size_t len;
	nng_msg *m = NULL;

	/* A ping that gets no answer within the socket's timeout is "not idle
	 * yet" (the caller's deadline decides), not the end of the test. */
	wf_hs_open(&c, url);
	PT_CHECK_OK(pt_handshake_encode_request(&c.b, &q, &d, &len));
	CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&m, len), 0);
	memcpy(nng_msg_body(m), d, len);
	if (nng_sendmsg(c.sock, m, 0) != 0) {
		nng_msg_free(m);
		snprintf(state, n, "no answer to a ping");
		wf_hs_close(&c);
		return false;
	}
	if (nng_recvmsg(c.sock, &c.last, 0) != 0 ||
	    pt_handshake_decode_reply(nng_msg_body(c.last), nng_msg_len(c.last), q.kind, &r) !=
	        PT_OK) {
		snprintf(state, n, "no answer to a ping");
		wf_hs_close(&c);
		return false;
	}
	CU_ASSERT_TRUE(r.ok);
	snprintf(state, n, "%s", r.message ? r.message : "");
	idle = r.ok && !r.busy && strcmp(state, "idle") == 0;
	wf_hs_close(&c);
	return idle;
}

bool wf_wait_idle(const char *url, int ms)
{
	char state[256] = "";
	double end = wf_mono() + ms / 1000.0;
	while (!wf_worker_idle(url, state, sizeof(state))) {
		if (wf_mono() > end) {
			fprintf(stderr, "worker %s still '%s'\n", url, state);
			return false;
		}
		usleep(20 * 1000);
	}
	return true;
}

/* ------------------------------------------------------------------ API -- */

void wf_api_open(wf_api *a, const char *url, const char *token)
{
	memset(a, 0, sizeof(*a));
	a->token = token;
	req_open(&a->sock, url, 20000, &a->b);
}

void wf_api_close(wf_api *a)
{
	if (a->reply)
		nng_msg_free(a->reply);
	pt_test_nng_close(a->sock.id);
	pt_fb_builder_fini(&a->b);
}

bool wf_api_call(wf_api *a, pt_api_request *q, pt_api_response *r)
{
	const uint8_t *d;
	size_t n;
	nng_msg *m;

	q->id = ++a->next_id;
	q->auth_token = a->token;
	PT_CHECK_OK(pt_api_build_request(&a->b, q, &d, &n));
	CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&m, n), 0);
	memcpy(nng_msg_body(m), d, n);
	if (nng_sendmsg(a->sock, m, 0) != 0) {
		nng_msg_free(m);
		return false;
	}
	if (a->reply)
		nng_msg_free(a->reply);
	a->reply = NULL;
	if (nng_recvmsg(a->sock, &a->reply, 0) != 0)
		return false;
	PT_CHECK_OK(pt_api_parse_response(nng_msg_body(a->reply), nng_msg_len(a->reply), r));
	CU_ASSERT_EQUAL(r->id, q->id);
	return true;
}

uint64_t wf_api_submit(wf_api *a, const pt_job_spec *spec)
{
	pt_api_request q;
	pt_api_response r;

	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = spec;
	CU_ASSERT_TRUE_FATAL(wf_api_call(a, &q, &r));
	if (r.code != PT_API_OK)
		fprintf(stderr, "submit refused: %s\n", r.message ? r.message : "");
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	return r.code == PT_API_OK ? r.job : 0;
}

void wf_api_get(wf_api *a, uint64_t id, pt_api_job_info *ji)
{
	pt_api_request q;
	pt_api_response r;

	pt_api_request_init(&q, PT_API_GET_JOB);
	q.job = id;
	CU_ASSERT_TRUE_FATAL(wf_api_call(a, &q, &r));
	CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
	PT_CHECK_OK(pt_api_response_job(&r, 0, ji));
}

pt_api_job_state wf_api_wait_final(wf_api *a, uint64_t id, double seconds, pt_api_job_info *ji)
{
	double end = wf_mono() + seconds;
	for (;;) {
		wf_api_get(a, id, ji);
		if (pt_api_job_state_final(ji->state) || wf_mono() > end)
			return ji->state;
		usleep(20 * 1000);
	}
}

int wf_api_losses(wf_api *a, uint64_t id, double *v, int n)
{
	int64_t cursor = -1;
	int got = 0;

	for (int i = 0; i < n; i++)
		v[i] = NAN;
	for (;;) {
		pt_api_request q;
		pt_api_response r;
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = id;
		q.cursor = cursor;
		q.wait_ms = 0;
		CU_ASSERT_TRUE_FATAL(wf_api_call(a, &q, &r));
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		for (size_t i = 0; i < r.n_points; i++) {
			pt_api_metric_point p;
			PT_CHECK_OK(pt_api_response_point(&r, i, &p));
			if (p.step >= 1 && p.step <= n) {
				v[p.step - 1] = p.loss;
				got++;
			}
		}
		if (r.n_points == 0 || r.cursor == cursor)
			return got;
		cursor = r.cursor;
	}
}
