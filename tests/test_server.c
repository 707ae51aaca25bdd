/* test_server.c - integration tests of the real pipeserver binary.
 *
 * Each test starts build/server/pipeserver (found next to this program's
 * directory through /proc/self/exe) on tcp://127.0.0.1:0 with a temporary
 * --data-dir, reads its `pipeserver listening on <url>` line and talks to it
 * with a raw nng REQ socket and lib/api (not the client library). Jobs are
 * examples/digits.json with fewer steps. Covered: every request kind, long
 * polls, checkpoint download, cancel, bad input of every kind, auth, kill -9
 * and resume, SIGTERM.
 */
#include "api/api.h"
#include "fileio.h"
#include "job.h"
#include "pt_test.h"
#include "safetensors.h"
#include "sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

static char server_bin[PATH_MAX + 64];
static char tmpdir[256];

typedef struct server {
	pid_t pid;
	char url[256];
	char data_dir[512];
} server;

typedef struct client {
	nng_socket sock;
	nng_msg *last; /* the reply the last parsed view points into */
	pt_fb_builder b;
	uint64_t next_id;
	const char *token;
} client;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ----------------------------------------------------------- processes -- */

/* server_start runs pipeserver with data_dir and extra args (NULL-terminated). */
static bool server_start(server *s, const char *data_dir, const char *const *extra)
{
	int out[2];
	const char *argv[32];
	int n = 0;
	char line[512], logpath[600];
	FILE *f;

	memset(s, 0, sizeof(*s));
	snprintf(s->data_dir, sizeof(s->data_dir), "%s", data_dir);
	argv[n++] = server_bin;
	argv[n++] = "--listen";
	argv[n++] = "tcp://127.0.0.1:0";
	argv[n++] = "--data-dir";
	argv[n++] = data_dir;
	argv[n++] = "--files-root";
	argv[n++] = PT_SOURCE_ROOT;
	argv[n++] = "--threads";
	argv[n++] = "2";
	argv[n++] = "--watch-interval-ms";
	argv[n++] = "20";
	for (int i = 0; extra && extra[i] && n < 30; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	if (pipe(out) != 0)
		return false;
	snprintf(logpath, sizeof(logpath), "%s/server.log", tmpdir);
	pid_t parent = getpid();
	if ((s->pid = fork()) == 0) {
		pt_test_child_dies_with(parent);
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
	/* Bounded: a server that never announces itself fails the test. */
	if (poll(&(struct pollfd){.fd = out[0], .events = POLLIN}, 1, 120000) != 1) {
		fprintf(stderr, "pipeserver printed no line in 120 s\n");
		close(out[0]);
		kill(s->pid, SIGKILL);
		pt_test_wait_exit(s->pid, 120, logpath);
		return false;
	}
	f = fdopen(out[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
		fprintf(stderr, "pipeserver printed no line (see %s)\n", logpath);
		if (f)
			fclose(f);
		return false;
	}
	fclose(f); /* the server's later stdout writes (none) would get EPIPE */
	line[strcspn(line, "\n")] = '\0';
	if (sscanf(line, "pipeserver listening on %255s", s->url) != 1) {
		fprintf(stderr, "unexpected first line: %s\n", line);
		return false;
	}
	return true;
}

/* server_stop sends sig and returns the exit status (-1: killed by a signal). */
static int server_stop(server *s, int sig)
{
	char logpath[600];
	int st;
	snprintf(logpath, sizeof(logpath), "%s/server.log", tmpdir);
	kill(s->pid, sig);
	st = pt_test_wait_exit(s->pid, 120, logpath);
	if (st == -1)
		return -2;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* -------------------------------------------------------------- client -- */

static void client_open(client *c, const server *s, int recv_timeout_ms)
{
	memset(c, 0, sizeof(*c));
	CU_ASSERT_EQUAL_FATAL(nng_req0_open(&c->sock), 0);
	nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, recv_timeout_ms);
	nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, 10000);
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
	CU_ASSERT_EQUAL_FATAL(nng_dial(c->sock, s->url, NULL, 0), 0);
	PT_CHECK_OK(pt_fb_builder_init(&c->b, 0));
	c->next_id = 1000;
}

static void client_close(client *c)
{
	if (c->last)
		nng_msg_free(c->last);
	pt_test_nng_close(c->sock.id);
	pt_fb_builder_fini(&c->b);
}

/* raw_call sends bytes and receives a reply (the view points into c->last). */
static int raw_call(client *c, const void *bytes, size_t len, pt_api_response *r)
{
	nng_msg *m;
	int rv;

	if (c->last) {
		nng_msg_free(c->last);
		c->last = NULL;
	}
	if ((rv = nng_msg_alloc(&m, len)) != 0)
		return rv;
	memcpy(nng_msg_body(m), bytes, len);
	if ((rv = nng_sendmsg(c->sock, m, 0)) != 0) {
		nng_msg_free(m);
		return rv;
	}
	if ((rv = nng_recvmsg(c->sock, &c->last, 0)) != 0)
		return rv;
	if (pt_api_parse_response(nng_msg_body(c->last), nng_msg_len(c->last), r) != PT_OK) {
		fprintf(stderr, "bad response: %s\n", pt_last_error());
		return NNG_EPROTO;
	}
	return 0;
}

/* call sends q (id and token filled in) and parses the reply into r. */
static int call(client *c, pt_api_request *q, pt_api_response *r)
{
	const uint8_t *d;
	size_t n;
	int rv;

	q->id = c->next_id++;
	if (c->token)
		q->auth_token = c->token;
	PT_CHECK_OK(pt_api_build_request(&c->b, q, &d, &n));
	rv = raw_call(c, d, n, r);
	if (rv == 0)
		CU_ASSERT_EQUAL(r->id, q->id);
	return rv;
}

static pt_api_code simple(client *c, pt_api_kind k, uint64_t job, pt_api_response *r)
{
	pt_api_request q;
	pt_api_request_init(&q, k);
	q.job = job;
	CU_ASSERT_EQUAL_FATAL(call(c, &q, r), 0);
	return r->code;
}

static void expect_alive(client *c)
{
	pt_api_response r;
	CU_ASSERT_EQUAL(simple(c, PT_API_SERVER_INFO, 0, &r), PT_API_OK);
	CU_ASSERT_EQUAL(r.kind, PT_API_SERVER_INFO);
}

/* --------------------------------------------------------------- specs -- */

static void digits_spec(pt_job_spec *spec, int64_t steps, int64_t every, bool resume)
{
	pt_test_digits_spec(spec);
	spec->steps = steps;
	spec->checkpoint_every = every;
	spec->checkpoint_keep = 3;
	spec->resume = resume;
	spec->eval_every = steps > 20 ? 20 : 0;
}

static pt_api_code submit(client *c, const pt_job_spec *spec, uint64_t *id, pt_api_response *r)
{
	pt_api_request q;
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = spec;
	CU_ASSERT_EQUAL_FATAL(call(c, &q, r), 0);
	*id = r->code == PT_API_OK ? r->job : 0;
	return r->code;
}

static pt_api_job_state job_state(client *c, uint64_t id, pt_api_job_info *ji)
{
	pt_api_response r;
	CU_ASSERT_EQUAL_FATAL(simple(c, PT_API_GET_JOB, id, &r), PT_API_OK);
	PT_CHECK_OK(pt_api_response_job(&r, 0, ji));
	return ji->state;
}

/* watch_until waits (long polls) until the job reached step >= step or
 * ended; returns the last step seen. */
static int64_t watch_until(client *c, uint64_t id, int64_t step, double timeout_s, bool *ended)
{
	pt_api_request q;
	pt_api_response r;
	double t0 = now_s();
	int64_t cursor = -1, last = 0;

	*ended = false;
	while (now_s() - t0 < timeout_s) {
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = id;
		q.cursor = cursor;
		q.wait_ms = 2000;
		CU_ASSERT_EQUAL_FATAL(call(c, &q, &r), 0);
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		for (size_t i = 0; i < r.n_points; i++) {
			pt_api_metric_point p;
			PT_CHECK_OK(pt_api_response_point(&r, i, &p));
			CU_ASSERT(p.step > cursor);
			last = p.step;
		}
		cursor = r.cursor;
		if (r.ended) {
			*ended = true;
			break;
		}
		if (last >= step)
			break;
	}
	return last;
}

/* ----------------------------------------------------------- the tests -- */

static void make_dir(const char *name, char *out, size_t n)
{
	snprintf(out, n, "%s/%s", tmpdir, name);
	mkdir(out, 0755);
}

static void test_server_every_request(void)
{
	char dir[512], path[700];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	pt_api_checkpoint_info ci;
	uint64_t id;
	int64_t cursor = -1, prev = 0, n_points = 0, last_step = 0, ck_step;
	char ck_sha[PT_SHA256_HEX];
	bool ended = false;

	make_dir("every", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);

	CU_ASSERT_EQUAL(simple(&c, PT_API_SERVER_INFO, 0, &r), PT_API_OK);
	CU_ASSERT_EQUAL(r.info.protocol, PT_API_PROTOCOL);
	CU_ASSERT_STRING_EQUAL(r.info.device, "cpu");
	CU_ASSERT_PTR_NOT_NULL(r.info.version);

	digits_spec(&spec, 40, 10, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	CU_ASSERT(id > 0);
	CU_ASSERT(job_state(&c, id, &ji) <= PT_JOB_SUCCEEDED);
	CU_ASSERT_STRING_EQUAL(ji.name, "digits-mlp");
	CU_ASSERT_EQUAL(ji.steps, 40);
	CU_ASSERT_PTR_NOT_NULL(ji.spec_table);

	/* Long poll to the end: increasing steps, `ended` at the end. */
	for (int it = 0; it < 1000 && !ended; it++) {
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = id;
		q.cursor = cursor;
		q.wait_ms = 5000;
		q.max_points = 7;
		CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		CU_ASSERT(r.n_points <= 7);
		for (size_t i = 0; i < r.n_points; i++) {
			pt_api_metric_point p;
			PT_CHECK_OK(pt_api_response_point(&r, i, &p));
			CU_ASSERT(p.step > prev);
			CU_ASSERT(isfinite(p.loss));
			CU_ASSERT_EQUAL(p.n_stages, 4);
			prev = p.step;
			n_points++;
		}
		cursor = r.cursor;
		ended = r.ended;
	}
	CU_ASSERT_TRUE(ended);
	CU_ASSERT_EQUAL(prev, 40);
	CU_ASSERT_EQUAL(n_points, 40);
	CU_ASSERT_EQUAL(r.state, PT_JOB_SUCCEEDED);
	/* An ended job answers at once, with no points after the cursor. */
	pt_api_request_init(&q, PT_API_WATCH_METRICS);
	q.job = id;
	q.cursor = 40;
	q.wait_ms = 10000;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.n_points, 0);
	CU_ASSERT_TRUE(r.ended);

	CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT_EQUAL(ji.step, 40);
	CU_ASSERT_TRUE(ji.has_last);
	CU_ASSERT_EQUAL(ji.last.step, 40);
	CU_ASSERT(ji.finished_unix >= ji.started_unix && ji.started_unix >= ji.submitted_unix);

	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_JOBS, 0, &r), PT_API_OK);
	CU_ASSERT_EQUAL_FATAL(r.n_jobs, 1);
	PT_CHECK_OK(pt_api_response_job(&r, 0, &ji));
	CU_ASSERT_EQUAL(ji.id, id);

	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_CHECKPOINTS, id, &r), PT_API_OK);
	CU_ASSERT(r.n_checkpoints >= 1 && r.n_checkpoints <= 3);
	PT_CHECK_OK(pt_api_response_checkpoint(&r, r.n_checkpoints - 1, &ci));
	CU_ASSERT_EQUAL(ci.step, 40);
	ck_step = ci.step;
	snprintf(ck_sha, sizeof(ck_sha), "%s", ci.sha256); /* the view dies with the reply */
	last_step = ck_step;

	/* Download the latest checkpoint in 64 KiB ranges. */
	{
		uint8_t *file = NULL, dig[PT_SHA256_BYTES];
		char hex[PT_SHA256_HEX], sha[PT_SHA256_HEX] = "";
		uint64_t total = 1, off = 0;
		pt_safetensors *st;
		int calls = 0;

		while (off < total && calls < 10000) {
			pt_api_request_init(&q, PT_API_FETCH_CHECKPOINT);
			q.job = id;
			q.offset = off;
			q.length = 65536;
			CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
			CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
			CU_ASSERT_EQUAL(r.step, last_step);
			CU_ASSERT_EQUAL(r.offset, off);
			CU_ASSERT(r.data_len <= 65536);
			if (file == NULL) {
				total = r.total_size;
				file = malloc(total);
				snprintf(sha, sizeof(sha), "%s", r.sha256);
			}
			CU_ASSERT_FATAL(off + r.data_len <= total);
			memcpy(file + off, r.data, r.data_len);
			off += r.data_len;
			calls++;
		}
		CU_ASSERT_EQUAL(off, total);
		pt_sha256(file, total, dig);
		pt_sha256_hex(dig, hex);
		CU_ASSERT_STRING_EQUAL(hex, sha);
		CU_ASSERT_STRING_EQUAL(hex, ck_sha);
		snprintf(path, sizeof(path), "%s/download.safetensors", tmpdir);
		pt_test_write_file(path, file, total);
		PT_CHECK_OK(pt_safetensors_open(&st, path));
		CU_ASSERT(pt_safetensors_count(st) > 0);
		pt_safetensors_destroy(st);
		free(file);
	}
	/* A given step; a missing step; a range past the end. */
	pt_api_request_init(&q, PT_API_FETCH_CHECKPOINT);
	q.job = id;
	q.step = ck_step;
	q.length = 10;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT_EQUAL(r.data_len, 10);
	q.step = 3;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_NOT_FOUND);
	q.step = -1;
	q.offset = 1ull << 40;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_BAD_REQUEST);
	CU_ASSERT_PTR_NOT_NULL(r.message && strstr(r.message, "offset") ? r.message : NULL);

	/* Unknown jobs; cancelling a finished job. */
	CU_ASSERT_EQUAL(simple(&c, PT_API_GET_JOB, 999, &r), PT_API_NOT_FOUND);
	CU_ASSERT_EQUAL(simple(&c, PT_API_WATCH_METRICS, 999, &r), PT_API_NOT_FOUND);
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_CHECKPOINTS, 999, &r), PT_API_NOT_FOUND);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, 999, &r), PT_API_NOT_FOUND);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id, &r), PT_API_CONFLICT);

	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

static void test_server_cancel(void)
{
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	pt_api_job_info ji;
	uint64_t id;
	int64_t seen;
	bool ended;
	double t0;

	make_dir("cancel", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 1000000, 0, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	seen = watch_until(&c, id, 5, 60, &ended);
	CU_ASSERT(seen >= 5);
	CU_ASSERT_FALSE(ended);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id, &r), PT_API_OK);
	CU_ASSERT_EQUAL(r.state, PT_JOB_CANCELLED); /* the state it will end in */
	t0 = now_s();
	while (job_state(&c, id, &ji) != PT_JOB_CANCELLED && now_s() - t0 < 20)
		usleep(20000);
	CU_ASSERT_EQUAL(ji.state, PT_JOB_CANCELLED);
	CU_ASSERT(ji.step < 1000000);
	CU_ASSERT(now_s() - t0 < 10);
	/* The last checkpoint is kept (written when it stopped). */
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_CHECKPOINTS, id, &r), PT_API_OK);
	CU_ASSERT(r.n_checkpoints >= 1);
	/* A queued job cancels at once: two jobs on one CPU, cancel the second. */
	{
		uint64_t a, b;
		CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &a, &r), PT_API_OK);
		CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &b, &r), PT_API_OK);
		CU_ASSERT_EQUAL(simple(&c, PT_API_SERVER_INFO, 0, &r), PT_API_OK);
		CU_ASSERT_EQUAL(r.info.jobs_queued + r.info.jobs_running, 2);
		CU_ASSERT_EQUAL(r.info.jobs_running, 1);
		CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, b, &r), PT_API_OK);
		CU_ASSERT_EQUAL(r.state, PT_JOB_CANCELLED);
		CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, a, &r), PT_API_OK);
		CU_ASSERT_EQUAL(r.state, PT_JOB_CANCELLED);
		CU_ASSERT_EQUAL(b, a + 1);
		/* A refused submission takes no id: the next job is b + 1. */
		spec.batch_size = 63;
		CU_ASSERT_EQUAL(submit(&c, &spec, &a, &r), PT_API_INVALID_JOB);
		CU_ASSERT_EQUAL(submit(&c, &spec, &a, &r), PT_API_INVALID_JOB);
		spec.batch_size = 64;
		CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &a, &r), PT_API_OK);
		CU_ASSERT_EQUAL(a, b + 1);
		CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, a, &r), PT_API_OK);
	}
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* expect_error sends raw bytes and expects an error reply naming words. */
static void expect_error(client *c, const void *bytes, size_t len, pt_api_code code,
                         const char *words)
{
	pt_api_response r;
	int rv = raw_call(c, bytes, len, &r);

	CU_ASSERT_EQUAL_FATAL(rv, 0);
	CU_ASSERT_EQUAL(r.code, code);
	if (words) {
		if (r.message == NULL || strstr(r.message, words) == NULL)
			fprintf(stderr, "reply message \"%s\" lacks \"%s\"\n",
			        r.message ? r.message : "(none)", words);
		CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, words) : NULL);
	}
	expect_alive(c);
}

static void expect_invalid_spec(client *c, const pt_job_spec *spec, const char *words)
{
	pt_api_response r;
	uint64_t id;

	pt_api_code code = submit(c, spec, &id, &r);
	if (code != PT_API_INVALID_JOB)
		fprintf(stderr, "expected InvalidJob (%s), got %s: %s\n", words,
		        pt_api_code_name(code), r.message ? r.message : "");
	CU_ASSERT_EQUAL(code, PT_API_INVALID_JOB);
	if (r.message == NULL || strstr(r.message, words) == NULL)
		fprintf(stderr, "InvalidJob message \"%s\" lacks \"%s\"\n",
		        r.message ? r.message : "(none)", words);
	CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, words) : NULL);
	expect_alive(c);
}

static void test_server_bad_input(void)
{
	char dir[512];
	server s;
	client c;
	pt_api_request q;
	pt_job_spec spec;
	const uint8_t *d;
	size_t n;
	uint8_t *buf;
	const char *extra[] = {"--max-request-mb", "1", NULL};

	make_dir("bad", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, extra));
	client_open(&c, &s, 30000);

	/* Garbage, empty, tiny. */
	expect_error(&c, "this is not a flatbuffer at all, no", 36, PT_API_BAD_REQUEST,
	             "bad request");
	expect_error(&c, "", 0, PT_API_BAD_REQUEST, "bad request");
	expect_error(&c, "\x04\0\0\0", 4, PT_API_BAD_REQUEST, "bad request");

	/* Truncated Submit at a few lengths. */
	digits_spec(&spec, 40, 10, true);
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.id = 5;
	q.spec = &spec;
	PT_CHECK_OK(pt_api_build_request(&c.b, &q, &d, &n));
	buf = malloc(n);
	memcpy(buf, d, n);
	for (size_t len = 8; len < n; len += n / 7 + 1)
		expect_error(&c, buf, len, PT_API_BAD_REQUEST, "bad request");

	/* Offset-lying: root offset past the end; a vtable offset far away. */
	{
		uint8_t *bad = malloc(n);
		uint32_t lie = (uint32_t)n + 64;
		int32_t so = 0x40000000;
		memcpy(bad, buf, n);
		memcpy(bad, &lie, 4);
		expect_error(&c, bad, n, PT_API_BAD_REQUEST, "bad request");
		memcpy(bad, buf, n);
		memcpy(bad + pt_fb_load_u32(bad), &so, 4);
		expect_error(&c, bad, n, PT_API_BAD_REQUEST, "bad request");
		free(bad);
	}
	free(buf);

	/* Unknown union type. */
	pt_api_request_init(&q, PT_API_GET_JOB);
	q.id = 6;
	PT_CHECK_OK(pt_api_build_request(&c.b, &q, &d, &n));
	buf = malloc(n);
	memcpy(buf, d, n);
	buf[pt_fb_field(pt_fb_root(buf), 2) - buf] = 42;
	expect_error(&c, buf, n, PT_API_BAD_REQUEST, "unknown body type");
	free(buf);

	/* Deeply nested: 10,000 nested vectors-of-tables cannot be expressed in
	 * api.fbs; the deepest legal shape is verified with a depth limit, so a
	 * buffer whose offsets loop back is what an attacker can send. */
	{
		uint32_t loop[8] = {4, 4, 4, 4, 4, 4, 4, 4};
		expect_error(&c, loop, sizeof(loop), PT_API_BAD_REQUEST, "bad request");
	}

	/* Oversized (over the 1 MiB cap): the connection is dropped, no reply;
	 * the server keeps serving everyone else. */
	{
		client big;
		size_t len = 3u << 20;
		uint8_t *huge = calloc(1, len);
		pt_api_response r;
		client_open(&big, &s, 1500);
		CU_ASSERT_NOT_EQUAL(raw_call(&big, huge, len, &r), 0);
		client_close(&big);
		free(huge);
		expect_alive(&c);
	}

	/* Invalid job specs, each named. */
	{
		pt_job_spec bad;
		int64_t v;

		digits_spec(&bad, 40, 10, true);
		bad.layers[0].kind = (pt_layer_kind)99;
		expect_invalid_spec(&c, &bad, "kind");
		pt_job_spec_fini(&bad);

		digits_spec(&bad, 40, 10, true);
		bad.layers[2].in_features = 100;
		expect_invalid_spec(&c, &bad, "in_features");
		pt_job_spec_fini(&bad);

		digits_spec(&bad, 40, 10, true);
		bad.microbatches = 0;
		expect_invalid_spec(&c, &bad, "microbatches");
		bad.microbatches = 3;
		expect_invalid_spec(&c, &bad, "microbatches");
		pt_job_spec_fini(&bad);

		digits_spec(&bad, 40, 10, true);
		free(bad.data.features);
		bad.data.features = strdup("examples/data/no_such_file.npy");
		expect_invalid_spec(&c, &bad, "no_such_file");
		pt_job_spec_fini(&bad);

		digits_spec(&bad, 40, 10, true);
		bad.stages = 6;
		expect_invalid_spec(&c, &bad, "stages");
		pt_job_spec_fini(&bad);
		(void)v;
	}
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* log_since returns what the servers logged to server.log after byte off
 * (free it). */
static char *log_since(long off)
{
	char path[600];
	char *text, *tail;
	size_t n;

	snprintf(path, sizeof(path), "%s/server.log", tmpdir);
	if (pt_file_read(path, 64u << 20, (void **)&text, &n) != PT_OK)
		return strdup("");
	if ((size_t)off > n)
		off = (long)n;
	tail = strndup(text + off, n - (size_t)off);
	free(text);
	return tail;
}

static long log_size(void)
{
	char path[600];
	struct stat st;

	snprintf(path, sizeof(path), "%s/server.log", tmpdir);
	return stat(path, &st) == 0 ? (long)st.st_size : 0;
}

static int count_str(const char *text, const char *s)
{
	int n = 0;
	for (const char *p = text; (p = strstr(p, s)) != NULL; p += strlen(s))
		n++;
	return n;
}

/* BadRequest and InvalidJob replies are logged, one line each with the
 * request and the connection, at most 10 a second: a flood of 1000 bad
 * requests logs a few lines and a count of the others. */
static void test_server_reject_log(void)
{
	char dir[512], want[256], *log;
	long off = log_size();
	pt_api_response r;
	pt_job_spec bad;
	uint64_t sum = 0, submit_id;
	server s;
	client c;
	double t0, t1;
	int lines;

	make_dir("rejectlog", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	expect_error(&c, "this is not a flatbuffer at all, no", 36, PT_API_BAD_REQUEST,
	             "bad request");
	digits_spec(&bad, 40, 10, true);
	bad.layers[2].in_features = 100;
	submit_id = c.next_id;
	expect_invalid_spec(&c, &bad, "in_features");
	pt_job_spec_fini(&bad);

	usleep(1100 * 1000); /* a new one-second window for the flood */
	t0 = now_s();
	for (int i = 0; i < 1000; i++) {
		CU_ASSERT_EQUAL_FATAL(raw_call(&c, "\x04\0\0\0", 4, &r), 0);
		CU_ASSERT_EQUAL(r.code, PT_API_BAD_REQUEST);
	}
	t1 = now_s();
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0); /* logs what is left to sum up */

	log = log_since(off);
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "info api: BadRequest reply to request "));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, " (kind unknown) on connection "));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, " from 127.0.0.1:"));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, ": bad request: "));
	snprintf(want, sizeof(want),
	         "info api: InvalidJob reply to request %" PRIu64 " (SubmitJob)", submit_id);
	CU_ASSERT_PTR_NOT_NULL(strstr(log, want));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "in_features"));
	/* Every rejection is a line or counted in a summary; lines are bounded. */
	lines = count_str(log, "info api: BadRequest reply") +
	        count_str(log, "info api: InvalidJob reply");
	for (const char *p = log; (p = strstr(p, "info api: suppressed ")) != NULL; p++) {
		uint64_t k = 0;
		sscanf(p, "info api: suppressed %" SCNu64 " similar lines", &k);
		sum += k;
	}
	fprintf(stderr, "flood of 1000 in %.2f s: %d lines, %" PRIu64 " suppressed\n", t1 - t0,
	        lines, sum);
	CU_ASSERT_EQUAL((uint64_t)lines + sum, 1002);
	CU_ASSERT(sum > 0);
	CU_ASSERT(lines <= 2 + 10 * (int)(t1 - t0 + 2));
	free(log);
}

/* --min-free-mb: a data dir with less free space than that refuses submits
 * (Unavailable, saying why) and keeps nothing of them; 0 turns it off. */
static void test_server_min_free_disk(void)
{
	const char *full[] = {"--min-free-mb", "1000000000", NULL};
	const char *off[] = {"--min-free-mb", "0", NULL};
	char dir[512], path[700];
	pt_api_response r;
	pt_job_spec spec;
	struct stat st;
	uint64_t id;
	server s;
	client c;

	make_dir("minfree", dir, sizeof(dir));
	digits_spec(&spec, 5, 0, false);
	for (int k = 0; k < 2; k++) {
		CU_ASSERT_TRUE_FATAL(server_start(&s, dir, k == 0 ? full : off));
		client_open(&c, &s, 30000);
		if (k == 0) {
			CU_ASSERT_EQUAL(submit(&c, &spec, &id, &r), PT_API_UNAVAILABLE);
			CU_ASSERT_PTR_NOT_NULL(
			    r.message
			        ? strstr(r.message, " MiB free, under --min-free-mb 1000000000")
			        : NULL);
			snprintf(path, sizeof(path), "%s/jobs/1", dir);
			CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
		} else {
			CU_ASSERT_EQUAL(submit(&c, &spec, &id, &r), PT_API_OK);
		}
		client_close(&c);
		CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	}
	pt_job_spec_fini(&spec);
}

/* list_ids fills ids (up to cap) with the listed jobs' ids; returns how many. */
static size_t list_ids(client *c, uint64_t *ids, size_t cap)
{
	pt_api_response r;
	pt_api_job_info ji;
	size_t n = 0;
	CU_ASSERT_EQUAL_FATAL(simple(c, PT_API_LIST_JOBS, 0, &r), PT_API_OK);
	for (size_t i = 0; i < r.n_jobs && n < cap; i++) {
		PT_CHECK_OK(pt_api_response_job(&r, i, &ji));
		ids[n++] = ji.id;
	}
	return n;
}

/* until_listed waits (up to 20 s) until ListJobs gives exactly want[0..n). */
static bool until_listed(client *c, const uint64_t *want, size_t n)
{
	uint64_t ids[16];
	double t0 = now_s();
	do {
		size_t k = list_ids(c, ids, 16);
		if (k == n && memcmp(ids, want, n * sizeof(*ids)) == 0)
			return true;
		usleep(20000);
	} while (now_s() - t0 < 20);
	return false;
}

static bool job_dir_exists(const char *dir, uint64_t id)
{
	char path[700];
	struct stat st;
	snprintf(path, sizeof(path), "%s/jobs/%" PRIu64, dir, id);
	return stat(path, &st) == 0;
}

/* trash_gone waits (up to 10 s) until jobs/ holds no ".deleted-" folder:
 * deleted jobs' folders are moved there under the lock, removed after. */
static bool trash_gone(const char *dir)
{
	char path[700];
	double t0 = now_s();
	snprintf(path, sizeof(path), "%s/jobs", dir);
	do {
		DIR *d = opendir(path);
		struct dirent *e;
		int n = 0;
		if (d == NULL)
			return false;
		while ((e = readdir(d)) != NULL)
			n += strncmp(e->d_name, ".deleted-", 9) == 0;
		closedir(d);
		if (n == 0)
			return true;
		usleep(20000);
	} while (now_s() - t0 < 10);
	return false;
}

/* --keep-jobs 2: once a third job has ended, the one that ended first is
 * deleted - gone from ListJobs (GetJob: NotFound) and its folder with its
 * checkpoints removed - whether it ended by itself or was cancelled while
 * queued; running and queued jobs are never counted. A restart with
 * --keep-jobs 1 keeps only the job that ended last, and the next job does
 * not take the id of the newest one deleted. A job interrupted by a stop
 * with resume: false has ended for good and is counted once the server is
 * back; a folder left set aside (".deleted-N") by a stop is removed then. */
static void test_server_keep_jobs(void)
{
	const char *two[] = {"--keep-jobs", "2", NULL}, *one[] = {"--keep-jobs", "1", NULL};
	char dir[512], path[800];
	uint64_t id[6];
	pt_api_response r;
	pt_job_spec spec;
	struct stat st;
	pt_api_job_info ji;
	server s;
	client c;
	bool ended;

	make_dir("keepjobs", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, two));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 3, 3, false); /* a checkpoint at step 3 */
	for (int i = 0; i < 4; i++) {
		CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[i], &r), PT_API_OK);
		watch_until(&c, id[i], 1000, 60, &ended);
		CU_ASSERT_TRUE(ended);
	}
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[2], id[3]}, 2));
	CU_ASSERT_EQUAL(simple(&c, PT_API_GET_JOB, id[0], &r), PT_API_NOT_FOUND);
	snprintf(path, sizeof(path),
	         "no job %" PRIu64 " (the server keeps the 2 jobs that ended last, --keep-jobs)",
	         id[0]);
	CU_ASSERT_STRING_EQUAL(r.message ? r.message : "", path);
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_CHECKPOINTS, id[1], &r), PT_API_NOT_FOUND);
	CU_ASSERT_EQUAL(simple(&c, PT_API_GET_JOB, 1000, &r), PT_API_NOT_FOUND); /* never given */
	CU_ASSERT_STRING_EQUAL(r.message ? r.message : "", "no job 1000");
	CU_ASSERT_FALSE(job_dir_exists(dir, id[0]));
	CU_ASSERT_FALSE(job_dir_exists(dir, id[1]));
	snprintf(path, sizeof(path), "%s/jobs/%" PRIu64 "/checkpoints/step-3.safetensors", dir,
	         id[2]);
	CU_ASSERT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_TRUE(trash_gone(dir));

	/* One running, one cancelled while queued: the queued one ends first. */
	spec.steps = 1000000;
	spec.checkpoint_every = 0;
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[4], &r), PT_API_OK);
	watch_until(&c, id[4], 1, 60, &ended);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[5], &r), PT_API_OK);
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[2], id[3], id[4], id[5]}, 4));
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id[5], &r), PT_API_OK);
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[3], id[4], id[5]}, 3));
	CU_ASSERT_FALSE(job_dir_exists(dir, id[2]));
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id[4], &r), PT_API_OK);
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[4], id[5]}, 2));
	CU_ASSERT_FALSE(job_dir_exists(dir, id[3]));
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);

	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, one));
	client_open(&c, &s, 30000);
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[4]}, 1));
	CU_ASSERT_FALSE(job_dir_exists(dir, id[5]));
	CU_ASSERT_TRUE(job_dir_exists(dir, id[4]));
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	/* The newest job's folder is gone; its id is not free again. */
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, one));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[0], &r), PT_API_OK);
	CU_ASSERT_EQUAL(id[0], id[5] + 1);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id[0], &r), PT_API_OK);
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[0]}, 1));
	/* Running when the server stops, resume false: Interrupted. */
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[1], &r), PT_API_OK);
	watch_until(&c, id[1], 1, 60, &ended);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	snprintf(path, sizeof(path), "%s/jobs/.deleted-77", dir);
	CU_ASSERT_EQUAL_FATAL(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/jobs/.deleted-77/journal", dir);
	FILE *f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fclose(f);
	/* A link by that name is removed, never what it points to; a name that
	 * is not ".deleted-<number>" is left alone. */
	snprintf(path, sizeof(path), "%s/outside", dir);
	CU_ASSERT_EQUAL_FATAL(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/outside/keep", dir);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fclose(f);
	{
		char link[800], target[800];
		snprintf(target, sizeof(target), "%s/outside", dir);
		snprintf(link, sizeof(link), "%s/jobs/.deleted-78", dir);
		CU_ASSERT_EQUAL_FATAL(symlink(target, link), 0);
		snprintf(link, sizeof(link), "%s/jobs/.deleted-x", dir);
		CU_ASSERT_EQUAL_FATAL(mkdir(link, 0755), 0);
	}
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, one));
	client_open(&c, &s, 30000);
	CU_ASSERT_TRUE(until_listed(&c, (uint64_t[]){id[1]}, 1));
	CU_ASSERT_EQUAL(job_state(&c, id[1], &ji), PT_JOB_INTERRUPTED);
	CU_ASSERT_FALSE(job_dir_exists(dir, id[0]));
	snprintf(path, sizeof(path), "%s/jobs/.deleted-x", dir);
	CU_ASSERT_EQUAL(rmdir(path), 0); /* left alone (and out of trash_gone's way) */
	CU_ASSERT_TRUE(trash_gone(dir));
	snprintf(path, sizeof(path), "%s/outside/keep", dir);
	CU_ASSERT_EQUAL(stat(path, &st), 0);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	pt_job_spec_fini(&spec);
}

/* --max-queued: with one job running and 2 waiting, a third waiting one is
 * refused Unavailable, saying why, and leaves nothing on disk; once a queued
 * job is cancelled a submit is taken again. A queued job holds no journal
 * descriptor (thousands of them once ran the server out of descriptors). */
static void test_server_max_queued(void)
{
	const char *extra[] = {"--max-queued", "2", NULL};
	char dir[512], path[700], fddir[64];
	uint64_t id[4], none;
	pt_api_response r;
	pt_job_spec spec;
	struct stat st;
	server s;
	client c;
	bool ended;
	int journals = 0;
	DIR *d;
	struct dirent *e;

	make_dir("maxqueued", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, extra));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 1000000, 0, false);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[0], &r), PT_API_OK);
	watch_until(&c, id[0], 1, 60, &ended); /* running: it waits no more */
	for (int i = 1; i < 3; i++)
		CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id[i], &r), PT_API_OK);
	CU_ASSERT_EQUAL(submit(&c, &spec, &none, &r), PT_API_UNAVAILABLE);
	CU_ASSERT_PTR_NOT_NULL(
	    r.message ? strstr(r.message, "the queue is full: 2 jobs wait to run (--max-queued 2)")
	              : NULL);
	snprintf(path, sizeof(path), "%s/jobs/%" PRIu64, dir, id[2] + 1);
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	/* The server's open journals: the running job's only. */
	snprintf(fddir, sizeof(fddir), "/proc/%d/fd", (int)s.pid);
	if ((d = opendir(fddir)) != NULL) {
		while ((e = readdir(d)) != NULL) {
			char link[700], target[700];
			ssize_t k;
			snprintf(link, sizeof(link), "%s/%s", fddir, e->d_name);
			if ((k = readlink(link, target, sizeof(target) - 1)) > 0) {
				target[k] = '\0';
				journals += strstr(target, "/journal") != NULL;
			}
		}
		closedir(d);
	}
	CU_ASSERT(journals <= 1); /* the running job's, if open */
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id[2], &r), PT_API_OK);
	CU_ASSERT_EQUAL(submit(&c, &spec, &id[3], &r), PT_API_OK);
	pt_job_spec_fini(&spec);
	for (int i = 0; i < 4; i++)
		if (i != 2)
			simple(&c, PT_API_CANCEL_JOB, id[i], &r);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	/* Outside their ranges these limits stop the server at start: --max-queued
	 * 1..1000000, --http-max-connections 0..65536, --http-timeout 1..3600. */
	{
		const char *bad[][3] = {{"--max-queued", "0", NULL},
		                        {"--http-max-connections", "-1", NULL},
		                        {"--http-max-connections", "65537", NULL},
		                        {"--http-timeout", "0", NULL}};
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			CU_ASSERT_FALSE(server_start(&s, dir, bad[i]));
			CU_ASSERT_EQUAL(server_stop(&s, 0), 2);
		}
	}
}

/* A job name is the client's: a newline in it must not start a forged log
 * line (text format: control characters become '?'). */
static void test_server_log_one_line_per_event(void)
{
	char dir[512], *log;
	long off = log_size();
	pt_api_response r;
	pt_job_spec spec;
	uint64_t id;
	bool ended;
	server s;
	client c;

	make_dir("logline", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 2, 0, false);
	free(spec.name);
	spec.name = strdup("evil\n2026-01-01T00:00:00.000Z error FORGED\r\x1b[2J");
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	watch_until(&c, id, INT64_MAX, 60, &ended);
	CU_ASSERT_TRUE(ended);
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	log = log_since(off);
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "(evil?2026-01-01T00:00:00.000Z error FORGED??[2J)"));
	CU_ASSERT_PTR_NULL(strstr(log, "\n2026-01-01T00:00:00.000Z error FORGED"));
	free(log);
}

static void test_server_auth(void)
{
	char dir[512], tok[600];
	server s;
	client c;
	pt_api_response r;
	const char *extra[] = {"--auth-token-file", tok, NULL};

	make_dir("auth", dir, sizeof(dir));
	snprintf(tok, sizeof(tok), "%s/token", tmpdir);
	pt_test_write_file(tok, "correct-horse\n", 14);
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, extra));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(simple(&c, PT_API_SERVER_INFO, 0, &r), PT_API_UNAUTHORIZED);
	CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, "token") : NULL);
	c.token = "correct-horsf";
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_JOBS, 0, &r), PT_API_UNAUTHORIZED);
	c.token = "correct-horse-and-more";
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_JOBS, 0, &r), PT_API_UNAUTHORIZED);
	c.token = "correct-horse";
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_JOBS, 0, &r), PT_API_OK);
	expect_alive(&c);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* submit_features submits the digits job reading its features from path
 * (labels: "digits_y.npy") and returns the code; *msg gets the reply message
 * (a static copy, "" for none). Accepted jobs are cancelled at once. */
static pt_api_code submit_features_id(client *c, const char *path, const char **msg, uint64_t *id)
{
	static char copy[1024];
	pt_job_spec spec;
	pt_api_response r;
	pt_api_code code;

	digits_spec(&spec, 1000000, 0, false);
	free(spec.data.features);
	free(spec.data.labels);
	spec.data.features = strdup(path);
	spec.data.labels = strdup("digits_y.npy");
	code = submit(c, &spec, id, &r);
	snprintf(copy, sizeof(copy), "%s", r.message ? r.message : "");
	*msg = copy;
	pt_job_spec_fini(&spec);
	return code;
}

static pt_api_code submit_features(client *c, const char *path, const char **msg)
{
	pt_api_response r;
	uint64_t id;
	pt_api_code code = submit_features_id(c, path, msg, &id);
	if (code == PT_API_OK)
		CU_ASSERT_EQUAL(simple(c, PT_API_CANCEL_JOB, id, &r), PT_API_OK);
	return code;
}

/* Data paths: beneath --files-root (default <data-dir>/files), symlinks
 * followed. Absolute paths, ".." and symlinks out are refused with one
 * message, the same for a file that exists and one that does not;
 * --allow-any-path lets them through. */
static void test_server_data_paths(void)
{
	static const char *const outside[] = {PT_SOURCE_ROOT
	                                      "/examples/data/digits_x.npy", /* exists */
	                                      "/etc/shadow", /* exists, unreadable */
	                                      "/etc/passwd", /* exists, not npy */
	                                      "/nonexistent/x.npy",
	                                      "../outside.npy", /* exists */
	                                      "../none.npy",
	                                      "sub/../../outside.npy",
	                                      "up/outside.npy", /* symlink to .. */
	                                      "up/none.npy",
	                                      "link.npy", /* absolute symlink to ../outside.npy */
	                                      "dangling.npy"};
	const char *want = "data.features: " PT_FILE_OUTSIDE_ROOT;
	char dir[512], root[600], path[700], cmd[2000], defroot[700];
	const char *root_args[] = {"--files-root", root, NULL};
	const char *any_args[] = {"--files-root", root, "--allow-any-path", NULL};
	const char *default_args[] = {"--files-root", "", NULL};
	const char *msg;
	struct stat st;
	server s;
	client c;

	make_dir("paths", dir, sizeof(dir));
	snprintf(root, sizeof(root), "%s/paths-root", tmpdir);
	snprintf(
	    cmd, sizeof(cmd),
	    "mkdir -p %s/sub && cp %s/examples/data/digits_x.npy %s/examples/data/digits_y.npy "
	    "%s/ && cp %s/examples/data/digits_x.npy %s/outside.npy",
	    root, PT_SOURCE_ROOT, PT_SOURCE_ROOT, root, PT_SOURCE_ROOT, tmpdir);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	snprintf(path, sizeof(path), "%s/up", root);
	CU_ASSERT_EQUAL(symlink("..", path), 0);
	snprintf(path, sizeof(path), "%s/link.npy", root);
	snprintf(cmd, sizeof(cmd), "%s/outside.npy", tmpdir);
	CU_ASSERT_EQUAL(symlink(cmd, path), 0);
	snprintf(path, sizeof(path), "%s/dangling.npy", root);
	CU_ASSERT_EQUAL(symlink("/nonexistent/x.npy", path), 0);
	snprintf(path, sizeof(path), "%s/inside.npy", root);
	CU_ASSERT_EQUAL(symlink("sub/../digits_x.npy", path), 0);

	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, root_args));
	client_open(&c, &s, 30000);
	for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++) {
		CU_ASSERT_EQUAL(submit_features(&c, outside[i], &msg), PT_API_INVALID_JOB);
		if (strcmp(msg, want) != 0)
			fprintf(stderr, "%s: \"%s\"\n", outside[i], msg);
		CU_ASSERT_STRING_EQUAL(msg, want);
	}
	/* Inside: relative paths and symlinks that stay inside. */
	CU_ASSERT_EQUAL(submit_features(&c, "digits_x.npy", &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "inside.npy", &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "sub/../digits_x.npy", &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "none.npy", &msg), PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(msg,
	                       "data.features: cannot open 'none.npy': No such file or directory");
	/* Checked again when the job runs: a file swapped for a symlink out
	 * while the job waits in the queue (behind a running one) fails it. */
	{
		uint64_t busy, queued;
		pt_api_response r;
		pt_api_job_info ji;
		double t0;
		snprintf(cmd, sizeof(cmd), "cp %s/digits_x.npy %s/swap.npy", root, root);
		CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
		CU_ASSERT_EQUAL_FATAL(submit_features_id(&c, "digits_x.npy", &msg, &busy),
		                      PT_API_OK);
		CU_ASSERT_EQUAL_FATAL(submit_features_id(&c, "swap.npy", &msg, &queued), PT_API_OK);
		CU_ASSERT_EQUAL(job_state(&c, queued, &ji), PT_JOB_QUEUED);
		snprintf(path, sizeof(path), "%s/swap.npy", root);
		CU_ASSERT_EQUAL(unlink(path), 0);
		CU_ASSERT_EQUAL(symlink("../outside.npy", path), 0);
		CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, busy, &r), PT_API_OK);
		t0 = now_s();
		while (job_state(&c, queued, &ji) != PT_JOB_FAILED && now_s() - t0 < 30)
			usleep(20000);
		CU_ASSERT_EQUAL(ji.state, PT_JOB_FAILED);
		CU_ASSERT_PTR_NOT_NULL(ji.message ? strstr(ji.message, want) : NULL);
		if (ji.message == NULL || strstr(ji.message, want) == NULL)
			fprintf(stderr, "swapped: \"%s\"\n", ji.message ? ji.message : "");
	}
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);

	/* --allow-any-path: the old reach. */
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, any_args));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(submit_features(&c, outside[0], &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "../outside.npy", &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "up/outside.npy", &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "link.npy", &msg), PT_API_OK);
	CU_ASSERT_EQUAL(submit_features(&c, "/etc/passwd", &msg), PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(msg, "data.features: /etc/passwd: bad magic: not an npy file");
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);

	/* The default root is <data-dir>/files, made at start; the shipped
	 * relative paths are looked up there. */
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, default_args));
	snprintf(defroot, sizeof(defroot), "%s/files", dir);
	CU_ASSERT(stat(defroot, &st) == 0 && S_ISDIR(st.st_mode));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(submit_features(&c, "digits_x.npy", &msg), PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(
	    msg, "data.features: cannot open 'digits_x.npy': No such file or directory");
	CU_ASSERT_EQUAL(submit_features(&c, outside[0], &msg), PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(msg, want);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* submit_workers submits the digits job (4 stages) on the worker URLs. */
static pt_api_code submit_workers(client *c, const char *const urls[4], uint64_t *id,
                                  const char **msg)
{
	static char copy[1024];
	pt_job_spec spec;
	pt_api_response r;
	pt_api_code code;

	digits_spec(&spec, 2, 0, false);
	spec.workers = calloc(4, sizeof(char *));
	for (int i = 0; i < 4; i++)
		spec.workers[i] = strdup(urls[i]);
	spec.n_workers = 4;
	spec.worker_timeout_ms = 500;
	code = submit(c, &spec, id, &r);
	snprintf(copy, sizeof(copy), "%s", r.message ? r.message : "");
	*msg = copy;
	pt_job_spec_fini(&spec);
	return code;
}

/* wait_failed waits for job id to end and returns its message. */
static const char *wait_failed(client *c, uint64_t id)
{
	static char copy[1024];
	pt_api_job_info ji;
	double t0 = now_s();

	while (job_state(c, id, &ji) != PT_JOB_FAILED && now_s() - t0 < 30)
		usleep(20000);
	CU_ASSERT_EQUAL(ji.state, PT_JOB_FAILED);
	snprintf(copy, sizeof(copy), "%s", ji.message ? ji.message : "");
	return copy;
}

/* --worker-allow: placement.workers outside the list are refused at submit
 * naming the field; and whatever answers at a worker URL, the job's error
 * says only that the handshake failed (not refused vs timed out vs not a
 * worker). */
static void test_server_worker_allow(void)
{
	static const char *const refused[][4] = {{"tcp://10.1.2.3:7700", "tcp://10.1.2.4:7700",
	                                          "tcp://127.0.0.2:7700", "tcp://10.1.2.5:7700"},
	                                         {"tcp://10.1.2.3:7700", "tcp://10.1.2.4:7700",
	                                          "tcp://10.1.2.5:7700", "tcp://evil.example:7700"},
	                                         {"tcp://10.1.2.3:7700", "tcp://10.1.2.4:7700",
	                                          "tcp://10.1.2.5:7700", "ipc:///tmp/x.sock"},
	                                         {"tcp://[fe80::1]:7700", "tcp://10.1.2.4:7700",
	                                          "tcp://10.1.2.5:7700", "tcp://10.1.2.6:7700"}};
	const char *allowed[4] = {"tcp://127.0.0.1:1", "tcp://WORKERS.example:7700",
	                          "tcp://[::ffff:10.9.9.9]:7700", "tcp://10.255.255.254:7700"};
	const char *allow_args[] = {"--worker-allow", "127.0.0.1, 10.0.0.0/8,workers.example",
	                            NULL};
	const char *const idx[] = {"[2]", "[3]", "[3]", "[0]"};
	char dir[512], want[600], url[300], want2[600];
	const char *msg;
	uint64_t id;
	server s;
	client c;

	make_dir("worker-allow", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, allow_args));
	client_open(&c, &s, 30000);
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		int k = idx[i][1] - '0';
		CU_ASSERT_EQUAL(submit_workers(&c, refused[i], &id, &msg), PT_API_INVALID_JOB);
		snprintf(want, sizeof(want),
		         "placement.workers%s: '%s' is not allowed by --worker-allow", idx[i],
		         refused[i][k]);
		if (strcmp(msg, want) != 0)
			fprintf(stderr, "workers %zu: \"%s\"\n", i, msg);
		CU_ASSERT_STRING_EQUAL(msg, want);
	}
	/* Allowed: accepted; port 1 refuses the connection. */
	CU_ASSERT_EQUAL(submit_workers(&c, allowed, &id, &msg), PT_API_OK);
	snprintf(want, sizeof(want), "stage 0 (worker tcp://127.0.0.1:1): %s",
	         PT_JOB_WORKER_UNREACHABLE);
	msg = wait_failed(&c, id);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, want));
	CU_ASSERT_PTR_NULL(strstr(msg, "refused)"));
	CU_ASSERT_PTR_NULL(strstr(msg, "Connection"));
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);

	/* Default: any URL. A URL where something else answers (this server's
	 * own API socket: a reply that is no handshake) fails the same way. */
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	snprintf(url, sizeof(url), "%s", s.url);
	{
		const char *self[4] = {url, url, url, url};
		CU_ASSERT_EQUAL(submit_workers(&c, self, &id, &msg), PT_API_OK);
		snprintf(want2, sizeof(want2), "stage 0 (worker %s): %s", url,
		         PT_JOB_WORKER_UNREACHABLE);
		msg = wait_failed(&c, id);
		CU_ASSERT_PTR_NOT_NULL(strstr(msg, want2));
		/* Apart from the URL, the same words as a refused connection. */
		CU_ASSERT_STRING_EQUAL(msg + strlen(msg) - strlen(PT_JOB_WORKER_UNREACHABLE),
		                       PT_JOB_WORKER_UNREACHABLE);
	}
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* check_checkpoint_files opens every .safetensors under data_dir/jobs. */
static int tmp_files;

static int check_checkpoint_files(const char *data_dir)
{
	char jobs[600], ck[900], path[1200];
	DIR *d, *e;
	struct dirent *a, *b;
	int count = 0;

	snprintf(jobs, sizeof(jobs), "%s/jobs", data_dir);
	if ((d = opendir(jobs)) == NULL)
		return 0;
	while ((a = readdir(d)) != NULL) {
		if (a->d_name[0] == '.')
			continue;
		snprintf(ck, sizeof(ck), "%s/%s/checkpoints", jobs, a->d_name);
		if ((e = opendir(ck)) == NULL)
			continue;
		while ((b = readdir(e)) != NULL) {
			pt_safetensors *st;
			if (strstr(b->d_name, ".safetensors") == NULL)
				continue;
			snprintf(path, sizeof(path), "%s/%s", ck, b->d_name);
			if (strstr(b->d_name, ".tmp.") != NULL) {
				/* pt_file_write_atomic's temporary file, cut by a kill -9: never
				 * a checkpoint; the server removes it at restart. */
				tmp_files++;
				continue;
			}
			if (pt_safetensors_open(&st, path) != PT_OK) {
				fprintf(stderr, "%s: %s\n", path, pt_last_error());
				CU_FAIL("checkpoint does not open");
			} else {
				pt_safetensors_destroy(st);
				count++;
			}
		}
		closedir(e);
	}
	closedir(d);
	return count;
}

static void test_server_kill9_resume(void)
{
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	pt_api_request q;
	pt_api_job_info ji;
	pt_api_checkpoint_info ci;
	uint64_t id, done_id;
	int64_t seen, ck_before = -1, cursor = -1, prev = 0;
	bool ended;
	double t_kill, t0;
	int n_ok = 0;

	make_dir("kill9", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	/* A finished job first: it must survive the crash with its metrics. */
	digits_spec(&spec, 20, 10, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &done_id, &r), PT_API_OK);
	watch_until(&c, done_id, INT64_MAX, 60, &ended);
	CU_ASSERT_TRUE(ended);
	pt_job_spec_fini(&spec);

	digits_spec(&spec, 400, 10, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	t0 = now_s();
	do {
		seen = watch_until(&c, id, 25, 60, &ended);
		CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_CHECKPOINTS, id, &r), PT_API_OK);
		if (r.n_checkpoints > 0) {
			PT_CHECK_OK(pt_api_response_checkpoint(&r, r.n_checkpoints - 1, &ci));
			ck_before = ci.step;
		}
	} while (ck_before < 10 && !ended && now_s() - t0 < 60);
	CU_ASSERT_FALSE_FATAL(ended);
	CU_ASSERT_FATAL(ck_before >= 10);
	(void)seen;
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGKILL), -1);
	t_kill = now_s(); /* after the process is gone: later points are the resumed run's */
	CU_ASSERT(check_checkpoint_files(dir) >= 1);
	/* Training went on between our look and the kill: the resume point is
	 * the newest checkpoint on disk. */
	{
		char ck[700];
		DIR *dd;
		struct dirent *e;
		long long st;
		snprintf(ck, sizeof(ck), "%s/jobs/%llu/checkpoints", dir, (unsigned long long)id);
		dd = opendir(ck);
		CU_ASSERT_PTR_NOT_NULL_FATAL(dd);
		/* Only complete checkpoints: exactly "step-N.safetensors", not the
		 * ".state" companion or a ".tmp.<pid>" the kill left half-written. */
		while ((e = readdir(dd)) != NULL) {
			int used = 0;
			if (sscanf(e->d_name, "step-%lld.safetensors%n", &st, &used) == 1 &&
			    e->d_name[used] == '\0' && st > ck_before)
				ck_before = st;
		}
		closedir(dd);
	}

	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_JOBS, 0, &r), PT_API_OK);
	CU_ASSERT_EQUAL_FATAL(r.n_jobs, 2);
	PT_CHECK_OK(pt_api_response_job(&r, 0, &ji));
	CU_ASSERT_EQUAL(ji.id, done_id);
	CU_ASSERT_EQUAL(ji.state, PT_JOB_SUCCEEDED);
	CU_ASSERT_TRUE(ji.has_last);
	CU_ASSERT_EQUAL(ji.last.step, 20);
	PT_CHECK_OK(pt_api_response_job(&r, 1, &ji));
	CU_ASSERT_EQUAL(ji.id, id);
	CU_ASSERT(ji.state == PT_JOB_QUEUED || ji.state == PT_JOB_STARTING ||
	          ji.state == PT_JOB_RUNNING || ji.state == PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.step >= ck_before);

	/* Every point 1..400 once, in order; the resumed run continues after the
	 * checkpoint, so points up to it predate the kill. */
	for (int it = 0; it < 5000; it++) {
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = id;
		q.cursor = cursor;
		q.wait_ms = 5000;
		CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		for (size_t i = 0; i < r.n_points; i++) {
			pt_api_metric_point p;
			PT_CHECK_OK(pt_api_response_point(&r, i, &p));
			CU_ASSERT(p.step == prev + 1);
			if (p.step == ck_before)
				CU_ASSERT(p.time_unix < t_kill);
			if (p.step == ck_before + 1) {
				if (!(p.time_unix > t_kill))
					fprintf(stderr,
					        "step %lld at %.3f, kill at %.3f, resumed %lld\n",
					        (long long)p.step, p.time_unix, t_kill,
					        (long long)ck_before);
				CU_ASSERT(p.time_unix > t_kill);
			}
			prev = p.step;
			n_ok++;
		}
		cursor = r.cursor;
		if (r.ended)
			break;
	}
	CU_ASSERT_EQUAL(r.state, PT_JOB_SUCCEEDED);
	CU_ASSERT_EQUAL(prev, 400);
	CU_ASSERT_EQUAL(n_ok, 400);
	CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_SUCCEEDED);
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	tmp_files = 0;
	CU_ASSERT(check_checkpoint_files(dir) >= 2);
	CU_ASSERT_EQUAL(tmp_files, 0);
}

/* A watcher thread: long polls job `id` until `until` (CLOCK_REALTIME
 * seconds), counting replies with points. No CUnit calls off the main
 * thread: failures are counted. */
typedef struct watcher {
	const server *s;
	uint64_t id;
	double until, first; /* first: when the first points came (0: none) */
	int replies, failures;
	const char *_Atomic phase; /* what it is doing: the report if it hangs */
} watcher;

/* watcher_dial opens c and connects it to w's server; false on failure.
 * Every call on it is bounded: nng 1.5.2 can lose a pipe's wake-up
 * (nanomsg/nng#1813, fixed in 1.8), and a REQ send with no ready pipe then
 * waits for ever without a send timeout. The dial does not wait: the first
 * send waits for the connection. */
static bool watcher_dial(const watcher *w, client *c)
{
	memset(c, 0, sizeof(*c));
	if (nng_req0_open(&c->sock) != 0)
		return false;
	if (pt_fb_builder_init(&c->b, 0) != PT_OK) {
		pt_test_nng_close(c->sock.id);
		return false;
	}
	nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, 30000);
	nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, 10000);
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
	if (nng_dial(c->sock, w->s->url, NULL, NNG_FLAG_NONBLOCK) != 0) {
		client_close(c);
		return false;
	}
	return true;
}

static void *watcher_main(void *arg)
{
	watcher *w = arg;
	client c;
	int64_t cursor = -1;
	bool redialed = false;

	w->phase = "dialing";
	if (!watcher_dial(w, &c)) {
		w->failures++;
		return NULL;
	}
	while (now_s() < w->until) {
		pt_api_request q;
		pt_api_response r;
		const uint8_t *d;
		size_t n;
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.id = c.next_id++;
		q.job = w->id;
		q.cursor = cursor;
		q.wait_ms = 10000;
		if (pt_api_build_request(&c.b, &q, &d, &n) != PT_OK) {
			w->failures++;
			break;
		}
		w->phase = "in a request (send 10 s, receive 30 s)";
		int rv = raw_call(&c, d, n, &r);
		if (rv == NNG_ETIMEDOUT && !redialed) {
			/* The send found no ready pipe in 10 s, or no reply came in
			 * 30 s (the server answers in 10): nng 1.5.2's pipe stuck, as
			 * above. One new connection, once. */
			fprintf(stderr, "\n    a watcher's request timed out: dialing again");
			redialed = true;
			w->phase = "closing to dial again";
			client_close(&c);
			if (!watcher_dial(w, &c)) {
				w->failures++;
				return NULL;
			}
			continue;
		}
		if (rv != 0 || r.code != PT_API_OK) {
			w->failures++;
			break;
		}
		if (r.n_points > 0) {
			w->replies++;
			if (w->first == 0)
				w->first = now_s();
		}
		cursor = r.cursor;
		if (r.ended)
			break;
	}
	w->phase = "closing";
	client_close(&c);
	w->phase = "done";
	return NULL;
}

/* --watch-replies outside 0..1000000 is refused at start. With 10 and 20
 * watchers of a running job: each wake waits
 * 20 / 10 = 2 s, not --watch-interval-ms (20), so over 4 s each watcher gets
 * its first request's points and at most 3 wakes' (unbudgeted: about 200
 * wakes, 4000 replies); every watcher still gets its points. */
static void test_server_watch_budget(void)
{
	enum { N = 20 };
	const char *extra[] = {"--watch-replies", "10", NULL};
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	pthread_t th[N];
	static watcher w[N]; /* static: a watcher left behind still writes it */
	uint64_t id;
	bool ended, stuck = false;
	int total = 0;

	make_dir("watch-budget", dir, sizeof(dir));
	/* Out of range or not a number: exit 2 naming the option. */
	for (int k = 0; k < 3; k++) {
		static const char *const bad[] = {"-1", "1000001", "lots"};
		char cmd[2 * PATH_MAX + 700], out[1024] = "";
		FILE *f;
		snprintf(cmd, sizeof(cmd), "'%s' --watch-replies %s --data-dir '%s' 2>&1",
		         server_bin, bad[k], dir);
		f = popen(cmd, "r");
		CU_ASSERT_PTR_NOT_NULL_FATAL(f);
		size_t n = fread(out, 1, sizeof(out) - 1, f);
		out[n] = '\0';
		int st = pclose(f);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "watch_replies (from flags): "));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "is not an integer in [0, 1000000]"));
	}
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, extra));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 1000000, 0, false);
	spec.eval_every = 0;
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	CU_ASSERT(watch_until(&c, id, 2, 60, &ended) >= 2);
	double t0 = now_s();
	for (int i = 0; i < N; i++) {
		w[i] = (watcher){.s = &s, .id = id, .until = t0 + 4.0};
		CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, watcher_main, &w[i]), 0);
	}
	for (int i = 0; i < N; i++) {
		/* Bounded: 4 s of polls, a 10 s wait, a 30 s receive, a 20 s close. */
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += stuck ? 1 : 90;
		if (pthread_timedjoin_np(th[i], NULL, &until) != 0) {
			fprintf(stderr, "\n    watcher %d still running after 90 s: left behind\n",
			        i);
			pthread_detach(th[i]);
			CU_FAIL("a watcher did not finish in 90 s");
			stuck = true;
			continue;
		}
		CU_ASSERT_EQUAL(w[i].failures, 0);
		CU_ASSERT(w[i].replies >= 1);
		total += w[i].replies;
	}
	printf("\n    20 watchers, 4 s: %d replies with points", total);
	CU_ASSERT(total <= 4 * N);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, id, &r), PT_API_OK);
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* One WatchMetrics reply holds at most 10000 points however many are asked
 * for (the server copies them into a buffer per API thread, so this is that
 * buffer's bound): a finished 10050-step job answers 10000 from the start,
 * then the last 50 with `ended`; max_points 0 means 1000. */
static void test_server_watch_points_cap(void)
{
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_request q;
	pt_api_response r;
	pt_api_metric_point p;
	uint64_t id;
	bool ended;

	make_dir("watch-cap", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 10050, 0, false);
	spec.eval_every = 0;
	spec.stages = 1;
	spec.microbatches = 1;
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	/* Watch until the job has ended, not just its last point: the replies
	 * below expect `ended` (the last point comes before the job's end). */
	CU_ASSERT_EQUAL(watch_until(&c, id, INT64_MAX, 300, &ended), 10050);
	CU_ASSERT_TRUE(ended);
	for (int k = 0; k < 3; k++) {
		static const int32_t ask[] = {20000, 20000, 0};
		static const int64_t from[] = {-1, 10000, -1};
		static const size_t want[] = {10000, 50, 1000};
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = id;
		q.cursor = from[k];
		q.max_points = ask[k];
		CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		CU_ASSERT_EQUAL_FATAL(r.n_points, want[k]);
		PT_CHECK_OK(pt_api_response_point(&r, 0, &p));
		int64_t first = from[k] < 0 ? 1 : from[k] + 1; /* steps count from 1 */
		CU_ASSERT_EQUAL(p.step, first);
		PT_CHECK_OK(pt_api_response_point(&r, r.n_points - 1, &p));
		CU_ASSERT_EQUAL(p.step, first + (int64_t)want[k] - 1);
		CU_ASSERT_EQUAL(r.cursor, p.step);
		CU_ASSERT_EQUAL(r.ended, k == 1);
	}
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* watch_all collects a job's points from the start (until it ended) into
 * steps[cap]; returns how many there were. */
static size_t watch_all(client *c, uint64_t id, int64_t *steps, size_t cap)
{
	pt_api_request q;
	pt_api_response r;
	int64_t cursor = -1;
	size_t n = 0;

	for (int i = 0; i < 10000; i++) {
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = id;
		q.cursor = cursor;
		q.max_points = 10000;
		CU_ASSERT_EQUAL_FATAL(call(c, &q, &r), 0);
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		for (size_t k = 0; k < r.n_points; k++, n++) {
			pt_api_metric_point p;
			PT_CHECK_OK(pt_api_response_point(&r, k, &p));
			if (n < cap)
				steps[n] = p.step;
		}
		cursor = r.cursor;
		if (r.ended)
			break;
	}
	return n;
}

/* A job's metric history is bounded: every step up to 16384 points, then
 * every 2nd, 4th, ... step (a job of 2^62 tiny steps grew the server by 6 MB
 * a second for ever). A 40000-step job keeps the multiples of 4, 10000
 * points, and its journal holds what gives them back after a restart. */
static void test_server_metric_history_bounded(void)
{
	enum { STEPS = 40000 };
	static int64_t steps[STEPS];
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	uint64_t id;
	bool ended;
	size_t n;

	make_dir("history", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, STEPS, 0, false);
	spec.eval_every = 0;
	spec.stages = 1;
	spec.microbatches = 1;
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	CU_ASSERT_EQUAL(watch_until(&c, id, INT64_MAX, 600, &ended), STEPS);
	CU_ASSERT_TRUE(ended);
	for (int run = 0; run < 2; run++) {
		bool grid = true;
		n = watch_all(&c, id, steps, STEPS);
		CU_ASSERT_EQUAL(n, STEPS / 4);
		for (size_t i = 0; i < n && i < STEPS; i++)
			grid = grid && steps[i] == 4 * (int64_t)(i + 1);
		CU_ASSERT_TRUE(grid);
		if (run == 0) { /* again from the journal */
			client_close(&c);
			CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
			CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
			client_open(&c, &s, 30000);
		}
	}
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

static void test_server_sigterm(void)
{
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	pt_api_job_info ji;
	uint64_t id;
	bool ended;

	make_dir("term", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 1000000, 0, false);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	CU_ASSERT(watch_until(&c, id, 3, 60, &ended) >= 3);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);

	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_INTERRUPTED);
	CU_ASSERT_PTR_NOT_NULL(ji.message ? strstr(ji.message, "shut down") : NULL);
	CU_ASSERT(ji.step >= 3);
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_CHECKPOINTS, id, &r), PT_API_OK);
	CU_ASSERT(r.n_checkpoints >= 1);
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGINT), 0);
	CU_ASSERT(check_checkpoint_files(dir) >= 1);
}

/* ------------------------------------------- journal, crash loop, memory -- */

static uint32_t crc32_of(const uint8_t *p, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
	}
	return c ^ 0xFFFFFFFFu;
}

/* put_state_record appends a state record (jobs.c's format: [len][crc]
 * [1][state][step i64][time f64][ml u16][msg]) whose ml and length are
 * what the caller says, not what journal_state would write. */
static void put_state_record(FILE *f, pt_api_job_state st, uint16_t ml, const char *msg,
                             size_t msg_len)
{
	size_t len = 20 + msg_len;
	uint8_t *p = calloc(1, len);
	int64_t step = 0;
	double t = now_s();
	uint32_t l32 = (uint32_t)len, crc;

	p[0] = 1;
	p[1] = (uint8_t)st;
	memcpy(p + 2, &step, 8);
	memcpy(p + 10, &t, 8);
	memcpy(p + 18, &ml, 2);
	memcpy(p + 20, msg, msg_len);
	crc = crc32_of(p, len);
	fwrite(&l32, 4, 1, f);
	fwrite(&crc, 4, 1, f);
	fwrite(p, 1, len, f);
	free(p);
}

/* recovered_job_dir makes dir/jobs/1 as a submit leaves it (the digits
 * spec, an empty checkpoints/), for a test to write its journal. */
static void recovered_job_dir(const char *dir)
{
	char path[700];
	pt_job_spec spec;
	pt_fb_builder b;
	pt_fb_ref ref;
	const uint8_t *data;
	size_t size;

	snprintf(path, sizeof(path), "%s/jobs", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/jobs/1", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/jobs/1/checkpoints", dir);
	mkdir(path, 0755);
	digits_spec(&spec, 5, 0, true);
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	PT_CHECK_OK(pt_job_spec_build(&b, &spec, &ref));
	PT_CHECK_OK(pt_fb_finish(&b, ref, NULL, &data, &size));
	snprintf(path, sizeof(path), "%s/jobs/1/spec.job", dir);
	pt_test_write_file(path, data, size);
	pt_fb_builder_fini(&b);
	pt_job_spec_fini(&spec);
}

/* A journal record whose message claims 60,000 bytes (and has them) must not
 * overflow replay's message buffer: the server starts (ASan: no
 * stack-buffer-overflow; release: no crash), the job is listed with its
 * message cut. Its job has no checkpoint: scanning its empty checkpoint
 * directory must not qsort(NULL, 0) (UBSan). */
static void test_server_journal_long_message(void)
{
	char dir[512], path[700];
	server s;
	client c;
	pt_api_job_info ji;
	size_t n = 60000;
	char *msg = malloc(n);
	FILE *f;

	make_dir("journal", dir, sizeof(dir));
	recovered_job_dir(dir);

	memset(msg, 'A', n);
	snprintf(path, sizeof(path), "%s/jobs/1/journal", dir);
	f = fopen(path, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	put_state_record(f, PT_JOB_QUEUED, 0, "", 0);
	put_state_record(f, PT_JOB_FAILED, (uint16_t)n, msg, n);
	fclose(f);
	free(msg);

	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(job_state(&c, 1, &ji), PT_JOB_FAILED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ji.message);
	/* Cut to replay's buffer (1023), then to the job's message (511). */
	CU_ASSERT_EQUAL(strlen(ji.message), 511);
	CU_ASSERT_EQUAL(strspn(ji.message, "A"), 511);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* A journal larger than the piece replay reads at a time (4 MiB; a long
 * job's) is replayed whole, its last whole record deciding, and a torn tail
 * after it is cut off: 6000 records of 920 bytes, then half a record. */
static void test_server_journal_replayed_in_pieces(void)
{
	char dir[512], path[700], msg[900];
	server s;
	client c;
	pt_api_job_info ji;
	long good;
	struct stat st;
	FILE *f;

	make_dir("journal_pieces", dir, sizeof(dir));
	recovered_job_dir(dir);

	snprintf(path, sizeof(path), "%s/jobs/1/journal", dir);
	f = fopen(path, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	put_state_record(f, PT_JOB_QUEUED, 0, "", 0);
	memset(msg, 'A', sizeof(msg));
	for (int i = 0; i < 6000; i++) {
		char head[16];
		int k = snprintf(head, sizeof(head), "m%05d", i);
		memcpy(msg, head, (size_t)k);
		put_state_record(f, PT_JOB_FAILED, sizeof(msg), msg, sizeof(msg));
	}
	good = ftell(f);
	CU_ASSERT(good > 5 << 20);
	put_state_record(f, PT_JOB_FAILED, 4, "torn", 4);
	fclose(f);
	CU_ASSERT_EQUAL_FATAL(truncate(path, good + 14), 0); /* half the last record */

	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(job_state(&c, 1, &ji), PT_JOB_FAILED);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ji.message);
	CU_ASSERT_EQUAL(strncmp(ji.message, "m05999", 6), 0);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	CU_ASSERT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_EQUAL(st.st_size, good);
}

/* A job whose run dies with the server (kill -9 while it trains) is
 * re-queued once; when its run dies with the server a second time in a
 * row it is Failed, not re-queued a third time (a job that kills the
 * server would otherwise crash-loop it). */
static void test_server_died_twice(void)
{
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_job_info ji;
	pt_api_response r;
	uint64_t id;
	bool ended;

	make_dir("died_twice", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 1000000, 0, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	for (int run = 1; run <= 2; run++) {
		CU_ASSERT(watch_until(&c, id, 3, 60, &ended) >= 3);
		CU_ASSERT_FALSE(ended);
		CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_RUNNING);
		client_close(&c);
		CU_ASSERT_EQUAL(server_stop(&s, SIGKILL), -1);
		CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
		client_open(&c, &s, 30000);
		if (run == 1) {
			/* Re-queued once ("restarting: no checkpoint ..."), then running. */
			pt_api_job_state st = job_state(&c, id, &ji);
			CU_ASSERT(st == PT_JOB_QUEUED || st == PT_JOB_STARTING ||
			          st == PT_JOB_RUNNING);
		}
	}
	CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_FAILED);
	CU_ASSERT_PTR_NOT_NULL(
	    ji.message ? strstr(ji.message, "server died twice while running this job") : NULL);
	/* And it stays failed: no runner picks it up. */
	usleep(300 * 1000);
	CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_FAILED);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	/* A third start keeps it failed (the journal says so). */
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(job_state(&c, id, &ji), PT_JOB_FAILED);
	CU_ASSERT_PTR_NOT_NULL(ji.message ? strstr(ji.message, "server died twice") : NULL);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	pt_job_spec_fini(&spec);
}

/* One death, then a run that ends another way (SIGTERM interrupts it with
 * a checkpoint), then a death: not twice in a row, so it is re-queued. */
static void test_server_died_not_in_a_row(void)
{
	char dir[512];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_job_info ji;
	pt_api_response r;
	uint64_t id;
	bool ended;
	pt_api_job_state st;

	make_dir("died_apart", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
	client_open(&c, &s, 30000);
	digits_spec(&spec, 1000000, 0, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	for (int run = 0; run < 3; run++) {
		CU_ASSERT(watch_until(&c, id, 3, 60, &ended) >= 3);
		client_close(&c);
		CU_ASSERT_EQUAL(server_stop(&s, run == 1 ? SIGTERM : SIGKILL), run == 1 ? 0 : -1);
		CU_ASSERT_TRUE_FATAL(server_start(&s, dir, NULL));
		client_open(&c, &s, 30000);
	}
	st = job_state(&c, id, &ji);
	CU_ASSERT(st == PT_JOB_QUEUED || st == PT_JOB_STARTING || st == PT_JOB_RUNNING);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	pt_job_spec_fini(&spec);
}

/* Admission: a job whose estimated memory exceeds --memory-limit is refused
 * naming the estimate and the limit, and leaves no jobs/<id>/; one that fits
 * runs. FetchCheckpoint's step is -1 (latest) or a step: -2 is an error
 * naming the field. A bad --memory-limit stops the server at start. */
static void test_server_admission(void)
{
	char dir[512], path[700];
	const char *lim[] = {"--memory-limit", "64M", NULL};
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	pt_api_request q;
	uint64_t id, big;
	bool ended;
	struct stat st;

	make_dir("admission", dir, sizeof(dir));
	CU_ASSERT_TRUE_FATAL(server_start(&s, dir, lim));
	client_open(&c, &s, 30000);
	/* 4.7 TB of parameters. */
	digits_spec(&spec, 5, 0, true);
	spec.stages = 1;
	spec.layers[0].out_features = 1084000;
	spec.layers[2].in_features = 1084000;
	spec.layers[2].out_features = 1084000;
	spec.layers[4].in_features = 1084000;
	CU_ASSERT_EQUAL(submit(&c, &spec, &big, &r), PT_API_INVALID_JOB);
	CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, "memory: the job needs an estimated ")
	                                 : NULL);
	CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, "TiB") : NULL);
	CU_ASSERT_PTR_NOT_NULL(
	    r.message ? strstr(r.message, "limit of 64.0 MiB (67108864 bytes) (--memory-limit)")
	              : NULL);
	if (r.message)
		printf("\n  refused: %s", r.message);
	snprintf(path, sizeof(path), "%s/jobs/1", dir);
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	pt_job_spec_fini(&spec);

	/* Threads: 2 stages of 1024 OpenMP threads each (once 2,000 threads in
	 * the server, and with a pids limit its end) are refused, naming the
	 * field; one thread a stage always fits. */
	digits_spec(&spec, 5, 0, true);
	spec.stages = 2;
	spec.threads_per_stage = 1024;
	CU_ASSERT_EQUAL(submit(&c, &spec, &big, &r), PT_API_INVALID_JOB);
	CU_ASSERT_PTR_NOT_NULL(
	    r.message ? strstr(r.message, "placement.threads_per_stage: 1024 threads for each of 2 "
	                                  "stages is 2048, more than this server gives a job")
	              : NULL);
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	pt_job_spec_fini(&spec);

	/* The digits example (about 15 MiB) fits. */
	digits_spec(&spec, 5, 0, true);
	CU_ASSERT_EQUAL_FATAL(submit(&c, &spec, &id, &r), PT_API_OK);
	watch_until(&c, id, INT64_MAX, 60, &ended);
	CU_ASSERT_TRUE(ended);
	pt_api_request_init(&q, PT_API_FETCH_CHECKPOINT);
	q.job = id;
	q.length = 10;
	q.step = -1;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT_EQUAL(r.step, 5);
	q.step = -2;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_BAD_REQUEST);
	CU_ASSERT_PTR_NOT_NULL(
	    r.message ? strstr(r.message, "step: -2 is not a step (-1: the latest checkpoint)")
	              : NULL);
	q.step = INT64_MIN;
	CU_ASSERT_EQUAL_FATAL(call(&c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_BAD_REQUEST);
	pt_job_spec_fini(&spec);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);

	{
		const char *bad[] = {"--memory-limit", "12X", NULL};
		CU_ASSERT_FALSE(server_start(&s, dir, bad));
		CU_ASSERT_EQUAL(server_stop(&s, 0), 2);
	}
}

/* A submit that fails on a full disk (a 1 MiB tmpfs filled up) answers an
 * error and leaves no jobs/<id>/ behind; after space is freed submits work
 * and a restart lists only the real job. Needs root (mount): skipped
 * otherwise, saying so. */
/* full_disk_body runs the test on the tmpfs at dir; no fatal asserts, so
 * that the caller always unmounts. */
static void full_disk_body(const char *dir)
{
	const char *no_floor[] = {"--min-free-mb", "0", NULL};
	char path[700], fill[700];
	server s;
	client c;
	pt_job_spec spec;
	pt_api_response r;
	uint64_t id;
	struct stat st;
	int fd;

	/* With the default --min-free-mb (256) the 1 MiB file system refuses a
	 * submit at once; without a floor the writes themselves fail. */
	if (!server_start(&s, dir, NULL)) {
		CU_FAIL("pipeserver did not start");
		return;
	}
	client_open(&c, &s, 30000);
	digits_spec(&spec, 5, 0, true);
	CU_ASSERT_EQUAL(submit(&c, &spec, &id, &r), PT_API_UNAVAILABLE);
	CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, " MiB free, under --min-free-mb 256")
	                                 : NULL);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	if (!server_start(&s, dir, no_floor)) {
		CU_FAIL("pipeserver did not start");
		pt_job_spec_fini(&spec);
		return;
	}
	client_open(&c, &s, 30000);
	snprintf(fill, sizeof(fill), "%s/fill", dir);
	fd = open(fill, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CU_ASSERT(fd >= 0);
	if (fd >= 0) {
		char buf[4096];
		memset(buf, 1, sizeof(buf));
		while (write(fd, buf, sizeof(buf)) > 0)
			;
		while (write(fd, buf, 1) > 0)
			;
	}
	close(fd);
	CU_ASSERT_EQUAL(submit(&c, &spec, &id, &r), PT_API_INTERNAL);
	CU_ASSERT_PTR_NOT_NULL(r.message ? strstr(r.message, "No space left on device") : NULL);
	snprintf(path, sizeof(path), "%s/jobs/1", dir);
	CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	unlink(fill);
	CU_ASSERT_EQUAL(submit(&c, &spec, &id, &r), PT_API_OK);
	CU_ASSERT_EQUAL(id, 2);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	pt_job_spec_fini(&spec);
	if (!server_start(&s, dir, NULL)) {
		CU_FAIL("pipeserver did not restart");
		return;
	}
	client_open(&c, &s, 30000);
	CU_ASSERT_EQUAL(simple(&c, PT_API_LIST_JOBS, 0, &r), PT_API_OK);
	CU_ASSERT_EQUAL(r.n_jobs, 1);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

static void test_server_full_disk(void)
{
	char dir[512], cmd[800];

	make_dir("fulldisk", dir, sizeof(dir));
	snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=1m tmpfs %s 2>/dev/null", dir);
	if (geteuid() != 0 || system(cmd) != 0) {
		printf("\n    skip: not root or cannot mount a tmpfs; full disk not checked");
		return;
	}
	full_disk_body(dir);
	snprintf(cmd, sizeof(cmd), "umount %s", dir);
	CU_ASSERT_EQUAL(system(cmd), 0);
}

/* --devices values the server refuses at start, exit 2, naming the entry
 * (a GPU the machine lacks is test_workers_gpu_placement's). */
static void test_server_devices_refused(void)
{
	static const char *const cases[][2] = {
	    {"gpu", "'gpu': cpu, cuda:N, a comma-separated list of them, all or none"},
	    {"cuda:", "'cuda:': cpu, cuda:N"},
	    {"cuda:x", "'cuda:x': cpu, cuda:N"},
	    {"CPU", "'CPU': cpu, cuda:N"},
	    {"cuda:1x", "'cuda:1x': cuda:N with N a device number"},
	    {"cuda:-1", "'cuda:-1': cpu, cuda:N"},
	    {"cuda:99999", "'cuda:99999': cuda:N with N a device number"},
	    {"cuda:0,cuda:0", "'cuda:0' is listed twice"},
	    {"cpu,", "'cpu,': an empty entry"},
	    {",cpu", "',cpu': an empty or overlong entry"},
	    {"cpu,,cuda:0", "'cpu,,cuda:0': an empty or overlong entry"},
	    {"", "empty: cpu, cuda:N"},
	    {"cuda:0123456789012345678901234567890", "an empty or overlong entry"},
	    {"all,cpu", "'all': cpu, cuda:N"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char cmd[PATH_MAX + 512], out[2048];
		size_t n;
		FILE *f;
		int st;
		snprintf(
		    cmd, sizeof(cmd),
		    "'%s' --listen tcp://127.0.0.1:0 --data-dir '%s/devices-bad' --devices '%s' "
		    "2>&1 </dev/null",
		    server_bin, tmpdir, cases[i][0]);
		CU_ASSERT_PTR_NOT_NULL_FATAL(f = popen(cmd, "r"));
		n = fread(out, 1, sizeof(out) - 1, f);
		out[n] = '\0';
		st = pclose(f);
		if (!(WIFEXITED(st) && WEXITSTATUS(st) == 2) || strstr(out, cases[i][1]) == NULL)
			printf("\n    --devices '%s': exit %d: %s", cases[i][0],
			       WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i][1]));
	}
}

static const pt_test_case server_tests[] = {
    {"test_server_devices_refused", test_server_devices_refused},
    {"test_server_every_request", test_server_every_request},
    {"test_server_cancel", test_server_cancel},
    {"test_server_bad_input", test_server_bad_input},
    {"test_server_reject_log", test_server_reject_log},
    {"test_server_log_one_line_per_event", test_server_log_one_line_per_event},
    {"test_server_max_queued", test_server_max_queued},
    {"test_server_keep_jobs", test_server_keep_jobs},
    {"test_server_min_free_disk", test_server_min_free_disk},
    {"test_server_auth", test_server_auth},
    {"test_server_data_paths", test_server_data_paths},
    {"test_server_worker_allow", test_server_worker_allow},
    {"test_server_kill9_resume", test_server_kill9_resume},
    {"test_server_watch_budget", test_server_watch_budget},
    {"test_server_watch_points_cap", test_server_watch_points_cap},
    {"test_server_metric_history_bounded", test_server_metric_history_bounded},
    {"test_server_sigterm", test_server_sigterm},
    {"test_server_journal_long_message", test_server_journal_long_message},
    {"test_server_journal_replayed_in_pieces", test_server_journal_replayed_in_pieces},
    {"test_server_died_twice", test_server_died_twice},
    {"test_server_died_not_in_a_row", test_server_died_not_in_a_row},
    {"test_server_admission", test_server_admission},
    {"test_server_full_disk", test_server_full_disk},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"server", server_tests},
    {NULL, NULL},
};

int main(void)
{
	if (!pt_test_binary("../server/pipeserver", server_bin, sizeof(server_bin))) {
		printf("pipeserver not found at %s: skipping\n", server_bin);
		return 77;
	}
	signal(SIGPIPE, SIG_IGN);
	if (!pt_test_tmpdir("test_server", tmpdir, sizeof(tmpdir)))
		return 99;
	return pt_test_tmpdir_done(tmpdir, pt_test_main(suites));
}
