/* test_http.c - the HTTP endpoint of the real pipeserver binary.
 *
 * Starts build/server/pipeserver with --http 127.0.0.1:0 and --log-format
 * json, runs examples/digits.json (4 stages) and talks HTTP over raw sockets:
 * /metrics content and format (plus `promtool check metrics` and a real
 * Prometheus scrape when Debian's prometheus package is installed), the
 * dashboard and its JSON endpoints (plus a headless Chromium load and
 * screenshot, build/tests/test_http_dashboard.png, when chromium is
 * installed), /healthz and /readyz (data dir made unwritable and back),
 * hostile requests, and JSON log lines. Missing tools make only their own
 * checks skip, with a message.
 */
#include "api/api.h"
#include "pt_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

static char server_bin[PATH_MAX + 64];
static char build_tests[PATH_MAX];
static char tmpdir[256];

typedef struct server {
	pid_t pid;
	char url[256];
	int http_port;
	char data_dir[512];
	char log[600];
	const char *http_addr;  /* NULL: 127.0.0.1:0 */
	const char *token_file; /* NULL: no token */
	const char *extra[5];   /* more arguments, NULL-terminated */
} server;

static server srv;
static nng_socket api;
static pt_fb_builder fbb;
static uint64_t job_id;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool have(const char *tool)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", tool);
	return system(cmd) == 0;
}

/* ------------------------------------------------------------- server -- */

static bool server_start(server *s)
{
	int out[2];
	char line[512];
	FILE *f;
	const char *argv[24] = {server_bin,
	                        "--listen",
	                        "tcp://127.0.0.1:0",
	                        "--data-dir",
	                        s->data_dir,
	                        "--files-root",
	                        PT_SOURCE_ROOT,
	                        "--threads",
	                        "2",
	                        "--http",
	                        s->http_addr ? s->http_addr : "127.0.0.1:0",
	                        "--log-format",
	                        "json"};
	int n = 13;

	if (s->token_file) {
		argv[n++] = "--auth-token-file";
		argv[n++] = s->token_file;
	}
	for (int i = 0; i < 5 && s->extra[i]; i++)
		argv[n++] = s->extra[i];
	argv[n] = NULL;

	if (s->log[0] == '\0')
		snprintf(s->log, sizeof(s->log), "%s/server.log", tmpdir);
	if (pipe(out) != 0)
		return false;
	pid_t parent = getpid();
	if ((s->pid = fork()) == 0) {
		pt_test_child_dies_with(parent);
		int fd = open(s->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		dup2(out[1], 1);
		if (fd >= 0)
			dup2(fd, 2);
		close(out[0]);
		close(out[1]);
		execv(server_bin, (char *const *)argv);
		_exit(127);
	}
	close(out[1]);
	if ((f = fdopen(out[0], "r")) == NULL)
		return false;
	while (fgets(line, sizeof(line), f) != NULL) {
		sscanf(line, "pipeserver listening on %255s", s->url);
		if (sscanf(line, "pipeserver http on http://%*[^:]:%d", &s->http_port) == 1)
			break;
	}
	fclose(f);
	if (s->url[0] == '\0' || s->http_port <= 0) {
		fprintf(stderr, "pipeserver did not announce both listeners (see %s)\n", s->log);
		return false;
	}
	return true;
}

static int server_stop(server *s)
{
	int st;
	kill(s->pid, SIGTERM);
	if ((st = pt_test_wait_exit(s->pid, 120, s->log)) == -1)
		return -2;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---------------------------------------------------------- API calls -- */

static int api_call(pt_api_request *q, pt_api_response *r, nng_msg **keep)
{
	static uint64_t next_id = 1;
	const uint8_t *d;
	size_t n;
	nng_msg *m;
	int rv;

	q->id = next_id++;
	if (pt_api_build_request(&fbb, q, &d, &n) != PT_OK) /* also runs in suite_init */
		return NNG_EINVAL;
	if ((rv = nng_msg_alloc(&m, n)) != 0)
		return rv;
	memcpy(nng_msg_body(m), d, n);
	if ((rv = nng_sendmsg(api, m, 0)) != 0) {
		nng_msg_free(m);
		return rv;
	}
	if ((rv = nng_recvmsg(api, keep, 0)) != 0)
		return rv;
	if (pt_api_parse_response(nng_msg_body(*keep), nng_msg_len(*keep), r) != PT_OK)
		return NNG_EPROTO;
	return 0;
}

/* api_ping times one ServerInfo round trip (seconds; 1e9 on failure). */
static double api_ping(void)
{
	pt_api_request q;
	pt_api_response r;
	nng_msg *m = NULL;
	double t0 = now_s();
	int rv;

	pt_api_request_init(&q, PT_API_SERVER_INFO);
	rv = api_call(&q, &r, &m);
	if (m)
		nng_msg_free(m);
	return rv == 0 && r.code == PT_API_OK ? now_s() - t0 : 1e9;
}

/* job_step returns the job's last step (-1 on error). */
static int64_t job_step(uint64_t id, pt_api_job_state *st)
{
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	nng_msg *m = NULL;
	int64_t step = -1;

	pt_api_request_init(&q, PT_API_GET_JOB);
	q.job = id;
	if (api_call(&q, &r, &m) == 0 && r.code == PT_API_OK &&
	    pt_api_response_job(&r, 0, &ji) == PT_OK) {
		step = ji.step;
		if (st)
			*st = ji.state;
	}
	if (m)
		nng_msg_free(m);
	return step;
}

static bool wait_step(int64_t step, double timeout_s)
{
	double t0 = now_s();
	while (now_s() - t0 < timeout_s) {
		if (job_step(job_id, NULL) >= step)
			return true;
		usleep(50000);
	}
	return false;
}

/* ------------------------------------------------------------ raw HTTP -- */

static int http_connect(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct timeval tv = {.tv_sec = 10};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* http_raw sends req as is and reads the whole reply (the server closes
 * HTTP/1.0 connections) into a malloc'ed string, the body only unless
 * with_headers; returns the status code, 0 when the server closed without a
 * status line, -1 on socket errors. */
static int http_exchange(int port, const char *req, size_t len, char **body_out, bool with_headers)
{
	int fd = http_connect(port), status = 0;
	size_t n = 0, cap = 1 << 16;
	char *buf = malloc(cap);
	ssize_t r;

	if (body_out)
		*body_out = NULL;
	if (fd < 0 || buf == NULL) {
		free(buf);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
		/* the server may close early on an oversized request */
	}
	for (;;) {
		if (n + 1 >= cap) {
			char *p = realloc(buf, cap * 2);
			if (p == NULL)
				break;
			buf = p;
			cap *= 2;
		}
		r = recv(fd, buf + n, cap - n - 1, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = '\0';
	close(fd);
	if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
		status = 0;
	if (body_out) {
		char *b = with_headers ? NULL : strstr(buf, "\r\n\r\n");
		if (b)
			memmove(buf, b + 4, strlen(b + 4) + 1);
		*body_out = buf;
	} else {
		free(buf);
	}
	return status;
}

static int http_raw(int port, const char *req, size_t len, char **body_out)
{
	return http_exchange(port, req, len, body_out, false);
}

static int http_get(const char *path, char **body)
{
	char req[1024];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n", path);
	return http_raw(srv.http_port, req, (size_t)n, body);
}

/* ---------------------------------------------------- metrics checking -- */

/* check_exposition checks the text format 0.0.4 rules we rely on: every
 * sample's family has # TYPE before it, counters end in _total, every
 * sample line is `name[{labels}] value`. Returns the number of problems. */
static int check_exposition(const char *text)
{
	char typed[256][96];
	int n_typed = 0, bad = 0;
	const char *p = text;

	while (*p) {
		const char *e = strchr(p, '\n');
		char line[1024], name[96], type[32];
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (len >= sizeof(line))
			len = sizeof(line) - 1;
		memcpy(line, p, len);
		line[len] = '\0';
		p = e ? e + 1 : p + len;
		if (line[0] == '\0' || strncmp(line, "# HELP ", 7) == 0)
			continue;
		if (sscanf(line, "# TYPE %95s %31s", name, type) == 2) {
			if (strcmp(type, "counter") == 0 &&
			    (strlen(name) < 6 || strcmp(name + strlen(name) - 6, "_total") != 0)) {
				fprintf(stderr, "counter without _total: %s\n", name);
				bad++;
			}
			if (n_typed < 256)
				snprintf(typed[n_typed++], sizeof(typed[0]), "%s", name);
			continue;
		}
		size_t nl = strcspn(line, "{ ");
		bool found = false;
		for (int i = 0; i < n_typed && !found; i++) {
			size_t tl = strlen(typed[i]);
			found = strncmp(line, typed[i], tl) == 0 &&
			        (nl == tl || (nl > tl && (strcmp(line + tl, "_bucket") == 0 ||
			                                  strncmp(line + tl, "_bucket{", 8) == 0 ||
			                                  strncmp(line + tl, "_sum ", 5) == 0 ||
			                                  strncmp(line + tl, "_count ", 7) == 0)));
		}
		const char *sp = strrchr(line, ' ');
		char *end;
		if (!found || sp == NULL || (strtod(sp + 1, &end), *end != '\0' && *end != ' ')) {
			fprintf(stderr, "bad sample line: %s\n", line);
			bad++;
		}
	}
	return bad;
}

static int free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &l) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* sample returns the value of the sample line that starts with `series `
 * (name and labels exactly), or -1 when there is none. */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return -1;
}

/* count_prefix counts lines that start with prefix. */
static int count_prefix(const char *text, const char *prefix)
{
	int n = 0;

	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		n += strncmp(p, prefix, strlen(prefix)) == 0;
	return n;
}

/* check_comm_series checks the communicator series of the running 4-stage job
 * (in-process stages: the coordinator and every stage report): one row per
 * rank (and direction), the exact label sets, and counts that a job past step
 * 3 must have. */
static void check_comm_series(const char *body)
{
	static const char *const ranks[] = {"coordinator", "0", "1", "2", "3"};
	static const char *const dirs[] = {"sent", "received"};
	static const char *const zero[] = {"errors", "timeouts", "reconnects"};
	char series[256];

	CU_ASSERT_PTR_NOT_NULL(strstr(body, "# TYPE pipetrain_comm_messages_total counter\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "# TYPE pipetrain_comm_compression_ratio gauge\n"));
	CU_ASSERT_EQUAL(count_prefix(body, "pipetrain_comm_messages_total{"), 10);
	CU_ASSERT_EQUAL(count_prefix(body, "pipetrain_comm_bytes_total{"), 10);
	CU_ASSERT_EQUAL(count_prefix(body, "pipetrain_comm_errors_total{"), 5);
	CU_ASSERT_EQUAL(count_prefix(body, "pipetrain_comm_timeouts_total{"), 5);
	CU_ASSERT_EQUAL(count_prefix(body, "pipetrain_comm_reconnects_total{"), 5);
	CU_ASSERT_EQUAL(count_prefix(body, "pipetrain_comm_compression_ratio{"), 5);
	for (size_t r = 0; r < 5; r++) {
		for (size_t d = 0; d < 2; d++) {
			snprintf(series, sizeof(series),
			         "pipetrain_comm_messages_total{job_id=\"%llu\",stage=\"%s\","
			         "direction=\"%s\"}",
			         (unsigned long long)job_id, ranks[r], dirs[d]);
			/* 3 steps x 4 microbatches, forward and backward, at least. */
			if (!(sample(body, series) >= 12))
				fprintf(stderr, "%s: %g\n", series, sample(body, series));
			CU_ASSERT(sample(body, series) >= 12);
			snprintf(series, sizeof(series),
			         "pipetrain_comm_bytes_total{job_id=\"%llu\",stage=\"%s\","
			         "direction=\"%s\"}",
			         (unsigned long long)job_id, ranks[r], dirs[d]);
			CU_ASSERT(sample(body, series) > 0);
		}
		for (size_t c = 0; c < 3; c++) {
			snprintf(series, sizeof(series),
			         "pipetrain_comm_%s_total{job_id=\"%llu\",stage=\"%s\"}", zero[c],
			         (unsigned long long)job_id, ranks[r]);
			/* The coordinator waits for the stages in 100 ms slices: a
			 * step slower than that (a sanitizer build) times one out. */
			if (r == 0 && strcmp(zero[c], "timeouts") == 0) {
				CU_ASSERT(sample(body, series) >= 0);
			} else {
				CU_ASSERT_EQUAL(sample(body, series), 0);
			}
		}
		/* In-process stages share tensors: nothing is compressed. */
		snprintf(series, sizeof(series),
		         "pipetrain_comm_compression_ratio{job_id=\"%llu\",stage=\"%s\"}",
		         (unsigned long long)job_id, ranks[r]);
		CU_ASSERT_EQUAL(sample(body, series), 1);
	}
}

/* ----------------------------------------------------------- the tests -- */

static void test_http_metrics(void)
{
	char *body = NULL, path[600], cmd[1400], want[128];
	FILE *f;
	int st;

	CU_ASSERT_FATAL(wait_step(3, 120));
	st = http_get("/metrics", &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	snprintf(want, sizeof(want), "pipetrain_job_step{job_id=\"%llu\"} ",
	         (unsigned long long)job_id);
	CU_ASSERT_PTR_NOT_NULL(strstr(body, want));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "pipetrain_jobs{state=\"Running\"} 1"));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "kind=\"SubmitJob\",code=\"OK\"} 1"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(body, "pipetrain_api_request_duration_seconds_bucket{le=\"+Inf\"}"));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "pipetrain_job_loss{job_id="));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "pipetrain_stage_busy_seconds_total{job_id="));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, ",stage=\"3\"}"));
	CU_ASSERT_EQUAL(check_exposition(body), 0);
	check_comm_series(body);

	snprintf(path, sizeof(path), "%s/metrics.txt", tmpdir);
	if ((f = fopen(path, "w")) != NULL) {
		fputs(body, f);
		fclose(f);
	}
	free(body);
	if (!have("promtool")) {
		printf("\n  promtool not installed (Debian package prometheus): format check "
		       "skipped\n");
	} else {
		snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' >&2", path);
		CU_ASSERT_EQUAL(system(cmd), 0);
	}

	if (!have("prometheus")) {
		printf("\n  prometheus not installed: real scrape skipped\n");
		return;
	}
	{
		int pport = free_port();
		char cfg[600], url[300], data[600], logp[600];
		pid_t pid;
		bool seen = false;
		double t0;

		snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", tmpdir);
		snprintf(data, sizeof(data), "%s/prom-data", tmpdir);
		snprintf(logp, sizeof(logp), "%s/prometheus.log", tmpdir);
		f = fopen(cfg, "w");
		CU_ASSERT_PTR_NOT_NULL_FATAL(f);
		fprintf(f,
		        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: pipetrain\n"
		        "    static_configs:\n      - targets: ['127.0.0.1:%d']\n",
		        srv.http_port);
		fclose(f);
		if ((pid = fork()) == 0) {
			char a1[700], a2[700], a3[64];
			int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			snprintf(a1, sizeof(a1), "--config.file=%s", cfg);
			snprintf(a2, sizeof(a2), "--storage.tsdb.path=%s", data);
			snprintf(a3, sizeof(a3), "--web.listen-address=127.0.0.1:%d", pport);
			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
			}
			execlp("prometheus", "prometheus", a1, a2, a3, (char *)NULL);
			_exit(127);
		}
		t0 = now_s();
		while (!seen && now_s() - t0 < 60) {
			char *out = NULL;
			char req[400];
			int n;
			sleep(1);
			snprintf(url, sizeof(url), "/api/v1/query?query=pipetrain_job_step");
			n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n",
			             url);
			if (http_raw(pport, req, (size_t)n, &out) == 200 && out &&
			    strstr(out, "\"job_id\":\"1\"") != NULL) {
				seen = true;
				printf("\n  prometheus query: %.300s\n", out);
			}
			free(out);
		}
		CU_ASSERT(seen);
		if (!seen)
			fprintf(stderr, "prometheus never returned the job's step (see %s)\n",
			        logp);
		kill(pid, SIGTERM);
		waitpid(pid, NULL, 0);
	}
}

static int count_points(const char *dom)
{
	const char *p = strstr(dom ? dom : "", "id=\"loss\"");
	const char *d = p ? strstr(p, "data-points=\"") : NULL;
	return d ? atoi(d + 13) : -1;
}

static char *chromium_dom(const char *url, const char *screenshot)
{
	char cmd[2000], out[600];
	char *dom = NULL;
	FILE *f;
	size_t n = 0, cap = 0;
	char buf[4096];
	size_t r;

	snprintf(out, sizeof(out), "%s/chrome", tmpdir);
	snprintf(cmd, sizeof(cmd),
	         "timeout 60 chromium --headless --disable-gpu --no-sandbox --user-data-dir='%s' "
	         "--window-size=1280,900 --virtual-time-budget=4000 %s%s%s '%s' 2>/dev/null",
	         out, screenshot ? "--screenshot='" : "--dump-dom", screenshot ? screenshot : "",
	         screenshot ? "'" : "", url);
	if ((f = popen(cmd, "r")) == NULL)
		return NULL;
	while ((r = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (n + r + 1 > cap) {
			cap = (n + r + 1) * 2;
			dom = realloc(dom, cap);
		}
		memcpy(dom + n, buf, r);
		n += r;
		dom[n] = '\0';
	}
	pclose(f);
	return dom;
}

/* count_after counts what occurrences of `what` lie in the text from the
 * first `from` to the next `to` (-1: no `from`). */
static int count_after(const char *text, const char *from, const char *to, const char *what)
{
	const char *p = strstr(text ? text : "", from), *e;
	int n = 0;
	if (p == NULL)
		return -1;
	e = strstr(p, to);
	for (const char *q = strstr(p, what); q != NULL && (e == NULL || q < e);
	     q = strstr(q + 1, what))
		n++;
	return n;
}

/* screenshot saves the page at url as build/tests/<name> (asserting a
 * picture came out). */
static void screenshot(const char *url, const char *name)
{
	char png[PATH_MAX + 64];
	struct stat sb;

	snprintf(png, sizeof(png), "%s/%s", build_tests, name);
	unlink(png);
	free(chromium_dom(url, png));
	CU_ASSERT(stat(png, &sb) == 0 && sb.st_size > 1000);
	printf("  screenshot: %s\n", png);
}

/* The digits example's step: 4 stages, 4 microbatches, each an F and a B. */
#define DIGITS_STEP_TASKS 32

static void test_http_dashboard(void)
{
	char *body = NULL, path[128], url[128];
	int64_t cursor;
	int st, a, b;

	st = http_get("/", &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "<svg id=\"loss\""));
	/* No external assets: nothing loaded by URL (the SVG namespace is only a name). */
	CU_ASSERT(body && strstr(body, "src=\"http") == NULL &&
	          strstr(body, "href=\"http") == NULL);
	free(body);
	st = http_get("/api/jobs", &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "\"id\":1,"));
	free(body);
	snprintf(path, sizeof(path), "/api/jobs/%llu/metrics?after=-1", (unsigned long long)job_id);
	st = http_get(path, &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"points\":[{\"step\":1,"));
	/* Stage 0's busy seconds: a number, whatever the job has run so far
	 * (more than a second under ASan on a slow machine). */
	{
		const char *sb = strstr(body, "\"virtual_stages\":1,\"stage_busy_seconds\":[");
		char *end = NULL;
		double busy =
		    sb ? strtod(sb + strlen("\"virtual_stages\":1,\"stage_busy_seconds\":["), &end)
		       : -1;
		CU_ASSERT_PTR_NOT_NULL(sb);
		CU_ASSERT(sb != NULL && end != NULL && *end == ',' && busy > 0);
	}
	/* The last step's timeline: every F and B of every stage, no W (GPipe). */
	CU_ASSERT_EQUAL(count_after(body, "\"timeline\":[", "]],", ",\"F\","), 16);
	CU_ASSERT_EQUAL(count_after(body, "\"timeline\":[", "]],", ",\"B\","), 16);
	CU_ASSERT_EQUAL(count_after(body, "\"timeline\":[", "]],", ",\"W\","), 0);
	cursor = strstr(body, "\"cursor\":") ? atoll(strstr(body, "\"cursor\":") + 9) : -1;
	CU_ASSERT(cursor >= 3);
	free(body);
	snprintf(path, sizeof(path), "/api/jobs/%llu/metrics?after=%lld",
	         (unsigned long long)job_id, (long long)cursor);
	st = http_get(path, &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NULL(body && strstr(body, "{\"step\":1,")); /* only newer points */
	free(body);
	CU_ASSERT_EQUAL(http_get("/api/jobs/99/metrics", NULL), 404);
	CU_ASSERT_EQUAL(http_get("/api/jobs/1/metrics?after=x", NULL), 400);
	CU_ASSERT_EQUAL(http_get("/api/jobs/1x/metrics", NULL), 404);

	if (!have("chromium")) {
		printf(
		    "\n  chromium not installed (Debian package chromium): browser test skipped\n");
		return;
	}
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/", srv.http_port);
	body = chromium_dom(url, NULL);
	a = count_points(body);
	free(body);
	CU_ASSERT(wait_step(cursor + 10, 60));
	body = chromium_dom(url, NULL);
	b = count_points(body);
	free(body);
	printf("\n  chromium: loss curve %d then %d points\n", a, b);
	CU_ASSERT(a > 0);
	CU_ASSERT(b > a);
	{
		/* The Gantt chart is the step's real timeline: a bar per task, F
		 * and B bars 16 each; the loss chart has its held-out line and the
		 * throughput chart its smoothed one. */
		body = chromium_dom(url, NULL);
		int bars = count_after(body, "id=\"gantt\"", "</svg>", "class=\"task ");
		int fb = count_after(body, "id=\"gantt\"", "</svg>", "class=\"task task-F ");
		printf("  chromium: Gantt chart %d bars (%d F)\n", bars, fb);
		CU_ASSERT_EQUAL(bars, DIGITS_STEP_TASKS);
		CU_ASSERT_EQUAL(fb, DIGITS_STEP_TASKS / 2);
		CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "data-tasks=\"32\""));
		CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "data-rows=\"4\""));
		CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "class=\"line-eval_loss\""));
		CU_ASSERT_EQUAL(count_after(body, "id=\"rate\"", "</svg>", "<polyline"), 2);
		free(body);
	}
	screenshot(url, "test_http_dashboard.png");
}

/* After test_http_probes (the suite's first job is cancelled there, so this
 * one runs at once). An interleaved job (2 ranks of 2 chunks, 4
 * microbatches): its metrics
 * say virtual_stages 2 and its timeline has 4 stages; the dashboard draws
 * a row per rank, 32 bars, half of them chunk 1's. */
static void test_http_dashboard_interleaved(void)
{
	pt_api_request q;
	pt_api_response r;
	pt_job_spec spec;
	pt_api_job_state st = PT_JOB_QUEUED;
	nng_msg *m = NULL;
	char path[128], url[160], *body = NULL;
	uint64_t id;
	double t0;

	pt_test_digits_spec(&spec);
	spec.steps = 20;
	spec.eval_every = 0;
	spec.checkpoint_every = 0;
	spec.stages = 2;
	spec.schedule = strdup("interleaved");
	spec.virtual_stages = 2;
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &spec;
	CU_ASSERT_EQUAL_FATAL(api_call(&q, &r, &m), 0);
	CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
	id = r.job;
	nng_msg_free(m);
	pt_job_spec_fini(&spec);
	for (t0 = now_s(); now_s() - t0 < 60; usleep(50000))
		if (job_step(id, &st) >= 0 && pt_api_job_state_final(st))
			break;
	if (st != PT_JOB_SUCCEEDED)
		printf("\n  interleaved job: %s", pt_api_job_state_name(st));
	CU_ASSERT_EQUAL_FATAL(st, PT_JOB_SUCCEEDED);

	snprintf(path, sizeof(path), "/api/jobs/%llu/metrics?after=-1", (unsigned long long)id);
	CU_ASSERT_EQUAL(http_get(path, &body), 200);
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "\"virtual_stages\":2,"));
	CU_ASSERT_EQUAL(count_after(body, "\"timeline\":[", "]],", ",\"F\","), 16);
	CU_ASSERT_EQUAL(count_after(body, "\"timeline\":[", "]],", ",\"B\","), 16);
	CU_ASSERT(count_after(body, "\"timeline\":[", "]],", "[3,\"F\",") == 4);
	free(body);

	if (!have("chromium")) {
		printf("\n  chromium not installed: browser test skipped\n");
		return;
	}
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/#job=%llu", srv.http_port,
	         (unsigned long long)id);
	body = chromium_dom(url, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(body);
	printf("\n  chromium: interleaved Gantt %d bars, %d of chunk 1\n",
	       count_after(body, "id=\"gantt\"", "</svg>", "class=\"task "),
	       count_after(body, "id=\"gantt\"", "</svg>", " chunk-1\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(body, "data-rows=\"2\""));
	CU_ASSERT_EQUAL(count_after(body, "id=\"gantt\"", "</svg>", "class=\"task "), 32);
	CU_ASSERT_EQUAL(count_after(body, "id=\"gantt\"", "</svg>", " chunk-1\""), 16);
	CU_ASSERT_EQUAL(count_after(body, "id=\"gantt\"", "</svg>", ">rank 1<"), 1);
	free(body);
	screenshot(url, "test_http_dashboard_interleaved.png");
}

static void test_http_hostile(void)
{
	static const char *const bad[] = {
	    "POST /metrics HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi",
	    "PUT /api/jobs HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
	    "DELETE /api/jobs/1/metrics HTTP/1.0\r\n\r\n",
	};
	char *big, *body = NULL;
	int st, fd;
	double worst_api = 0, worst_http = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CU_ASSERT_EQUAL(http_raw(srv.http_port, bad[i], strlen(bad[i]), NULL), 405);
	CU_ASSERT_EQUAL(http_get("/../etc/passwd", NULL), 404);
	CU_ASSERT_EQUAL(http_get("/%2e%2e/%2e%2e/etc/passwd", NULL), 404);
	CU_ASSERT_EQUAL(http_get("/metrics/../../etc/passwd", NULL), 404);
	CU_ASSERT_EQUAL(http_get("/dashboard.html", NULL), 404);
	st = http_raw(srv.http_port, "BREW /metrics HTTP/1.0\r\n\r\n", 26, NULL);
	CU_ASSERT(st >= 400 || st == 0);

	/* 64 KiB of headers: an error or a closed connection, never a 200. */
	big = malloc(70000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(big);
	strcpy(big, "GET /metrics HTTP/1.0\r\nX-Big: ");
	memset(big + strlen(big), 'a', 65536);
	strcpy(big + 30 + 65536, "\r\n\r\n");
	st = http_raw(srv.http_port, big, strlen(big), NULL);
	printf("\n  oversized headers: status %d\n", st);
	CU_ASSERT(st >= 400 || st == 0);
	free(big);

	/* A client trickling one byte per second holds only its own connection. */
	fd = http_connect(srv.http_port);
	CU_ASSERT_FATAL(fd >= 0);
	for (int i = 0; i < 4; i++) {
		double t0, a;
		CU_ASSERT_EQUAL(send(fd, &"GET /metr"[i], 1, MSG_NOSIGNAL), 1);
		a = api_ping();
		if (a > worst_api)
			worst_api = a;
		t0 = now_s();
		CU_ASSERT_EQUAL(http_get("/healthz", &body), 200);
		free(body);
		if (now_s() - t0 > worst_http)
			worst_http = now_s() - t0;
		sleep(1);
	}
	close(fd);
	printf("  during a slow client: API %.1f ms, /healthz %.1f ms at worst\n", worst_api * 1e3,
	       worst_http * 1e3);
	CU_ASSERT(worst_api < 0.5);
	CU_ASSERT(worst_http < 0.5);
	CU_ASSERT_EQUAL(http_get("/healthz", NULL), 200);
}

/* closed_within: the server has ended fd (end of stream or a reset) within
 * wait_s seconds. */
static bool closed_within(int fd, double wait_s)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char c;
	ssize_t r;

	if (poll(&p, 1, (int)(wait_s * 1000)) <= 0)
		return false;
	r = recv(fd, &c, 1, MSG_DONTWAIT);
	return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* fds_of: the descriptors process pid has open (-1: unknown). */
static int fds_of(pid_t pid)
{
	char path[64];
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if ((d = opendir(path)) == NULL)
		return -1;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Connections are admitted against --http-max-connections 8: 20 idle ones
 * and then a request leave 7 of them open (each one more shut down the one
 * that had waited longest) and the request is answered; the server's
 * descriptors stay within the limit. */
static void test_http_connections_capped(void)
{
	server t = {.extra = {"--http-max-connections", "8", NULL}};
	int idle[20], closed = 0, fds0, fds1;

	snprintf(t.data_dir, sizeof(t.data_dir), "%s/data-cap", tmpdir);
	snprintf(t.log, sizeof(t.log), "%s/server-cap.log", tmpdir);
	CU_ASSERT_FATAL(server_start(&t));
	fds0 = fds_of(t.pid);
	for (int i = 0; i < 20; i++) {
		idle[i] = http_connect(t.http_port);
		CU_ASSERT_FATAL(idle[i] >= 0);
	}
	CU_ASSERT_EQUAL(http_raw(t.http_port, "GET /healthz HTTP/1.0\r\n\r\n", 25, NULL), 200);
	usleep(300 * 1000);
	for (int i = 0; i < 20; i++)
		closed += closed_within(idle[i], 0);
	/* The oldest went first: the last seven are the ones still open. */
	for (int i = 13; i < 20; i++)
		CU_ASSERT_FALSE(closed_within(idle[i], 0));
	usleep(1200 * 1000); /* the sweep (every second) drops what evhttp freed */
	fds1 = fds_of(t.pid);
	printf("\n    20 idle + 1 request at --http-max-connections 8: %d closed; server "
	       "descriptors %d -> %d",
	       closed, fds0, fds1);
	CU_ASSERT_EQUAL(closed, 13);
	CU_ASSERT(fds0 > 0 && fds1 <= fds0 + 7);
	for (int i = 0; i < 20; i++)
		close(idle[i]);
	CU_ASSERT_EQUAL(server_stop(&t), 0);
}

/* At --http-timeout 1 a client that trickles a request (a byte every
 * 0.25 s, never idle for evhttp) is shut down once it has not delivered a
 * whole request in 2 s; a keep-alive client sending whole requests every
 * 0.5 s keeps its connection for 3 s and more. */
static void test_http_trickle_cut_off(void)
{
	static const char req[] = "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
	static const char slow[] =
	    "GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaa";
	server t = {.extra = {"--http-timeout", "1", NULL}};
	double t0, took = -1;
	int fd, answered = 0;

	snprintf(t.data_dir, sizeof(t.data_dir), "%s/data-trickle", tmpdir);
	snprintf(t.log, sizeof(t.log), "%s/server-trickle.log", tmpdir);
	CU_ASSERT_FATAL(server_start(&t));

	fd = http_connect(t.http_port);
	CU_ASSERT_FATAL(fd >= 0);
	for (int k = 0; k < 7; k++) {
		char buf[2048];
		size_t n = 0;
		ssize_t r;
		if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof(req) - 1))
			break;
		while (n < sizeof(buf) - 1 && (r = recv(fd, buf + n, sizeof(buf) - 1 - n, 0)) > 0) {
			n += (size_t)r;
			buf[n] = '\0';
			if (strstr(buf, "{\"status\":\"ok\"}\n"))
				break;
		}
		buf[n] = '\0';
		if (strncmp(buf, "HTTP/1.1 200", 12) != 0 || !strstr(buf, "{\"status\":\"ok\"}\n"))
			break;
		answered++;
		usleep(500 * 1000);
	}
	close(fd);
	CU_ASSERT_EQUAL(answered, 7);

	fd = http_connect(t.http_port);
	CU_ASSERT_FATAL(fd >= 0);
	t0 = now_s();
	for (size_t i = 0; i < sizeof(slow) - 1 && took < 0; i++)
		if (send(fd, &slow[i], 1, MSG_NOSIGNAL) != 1 || closed_within(fd, 0.25))
			took = now_s() - t0;
	close(fd);
	printf("\n    keep-alive: %d requests over 3.5 s on one connection; a trickled request "
	       "cut off after %.2f s",
	       answered, took);
	CU_ASSERT(took >= 1.9 && took <= 4.5);
	CU_ASSERT_EQUAL(http_get("/healthz", NULL), 200); /* the main server is untouched */
	CU_ASSERT_EQUAL(server_stop(&t), 0);
}

static void test_http_probes(void)
{
	char *body = NULL, away[600];
	int st;
	pt_api_request q;
	pt_api_response r;
	nng_msg *m = NULL;
	pt_api_job_state state = PT_JOB_RUNNING;
	double t0 = now_s();

	st = http_get("/healthz", &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "\"ok\""));
	free(body);
	st = http_get("/readyz", &body);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "\"ready\":true"));
	free(body);

	/* Stop the job first: it writes under the data dir we take away. */
	pt_api_request_init(&q, PT_API_CANCEL_JOB);
	q.job = job_id;
	CU_ASSERT_EQUAL(api_call(&q, &r, &m), 0);
	if (m)
		nng_msg_free(m);
	while (!pt_api_job_state_final(state) && now_s() - t0 < 60) {
		job_step(job_id, &state);
		usleep(50000);
	}
	CU_ASSERT(pt_api_job_state_final(state));

	if (geteuid() != 0) {
		CU_ASSERT_EQUAL(chmod(srv.data_dir, 0500), 0);
		st = http_get("/readyz", &body);
		CU_ASSERT_EQUAL(st, 503);
		CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "\"ready\":false"));
		free(body);
		CU_ASSERT_EQUAL(chmod(srv.data_dir, 0755), 0);
		CU_ASSERT_EQUAL(http_get("/readyz", NULL), 200);
	} else {
		printf("\n  running as root: chmod 0500 does not stop root, so that variant "
		       "is skipped\n");
	}
	/* Works for root too: the data dir path becomes a plain file. */
	snprintf(away, sizeof(away), "%s.away", srv.data_dir);
	CU_ASSERT_EQUAL_FATAL(rename(srv.data_dir, away), 0);
	pt_test_write_file(srv.data_dir, "x", 1);
	st = http_get("/readyz", &body);
	CU_ASSERT_EQUAL(st, 503);
	CU_ASSERT_PTR_NOT_NULL(body && strstr(body, "\"ready\":false"));
	free(body);
	unlink(srv.data_dir);
	CU_ASSERT_EQUAL_FATAL(rename(away, srv.data_dir), 0);
	CU_ASSERT_EQUAL(http_get("/readyz", NULL), 200);
}

static void test_http_json_logs(void)
{
	FILE *f = fopen(srv.log, "r");
	char line[4096];
	int lines = 0, bad = 0, with_job = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	while (fgets(line, sizeof(line), f)) {
		lines++;
		if (strncmp(line, "{\"ts\":\"", 7) != 0 || strstr(line, "\"level\":\"") == NULL ||
		    line[strlen(line) - 2] != '}') {
			fprintf(stderr, "not a JSON log line: %s", line);
			bad++;
		}
		if (strstr(line, "\"job\":1") != NULL)
			with_job++;
	}
	fclose(f);
	CU_ASSERT(lines > 0);
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT(with_job > 0);
}

/* http_auth sends METHOD path with the Authorization header auth (NULL:
 * none) to port; *all gets the whole reply, headers included. */
static int http_auth(int port, const char *method, const char *path, const char *auth, char **all)
{
	char req[1024];
	int n =
	    snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: localhost\r\n%s%s%s\r\n", method,
	             path, auth ? "Authorization: " : "", auth ? auth : "", auth ? "\r\n" : "");
	return http_exchange(port, req, (size_t)n, all, true);
}

/* A second server with a token and --http on every address (0.0.0.0,
 * reached through 127.0.0.1): every path but the probes needs the token. */
static void test_http_token(void)
{
	static const char *const guarded[] = {
	    "/metrics", "/", "/index.html", "/api/jobs", "/api/jobs/1/metrics", "/no-such-path"};
	static const char bare[] = "WWW-Authenticate: Bearer realm=\"pipetrain\"\r\n";
	static const char invalid[] =
	    "WWW-Authenticate: Bearer realm=\"pipetrain\", error=\"invalid_token\"\r\n";
	server t = {.http_addr = "0.0.0.0:0"};
	char token_path[600], *all = NULL;
	int st;

	snprintf(token_path, sizeof(token_path), "%s/token", tmpdir);
	pt_test_write_file(token_path, "tok-123\n", 8);
	t.token_file = token_path;
	snprintf(t.data_dir, sizeof(t.data_dir), "%s/data-token", tmpdir);
	snprintf(t.log, sizeof(t.log), "%s/server-token.log", tmpdir);
	CU_ASSERT_FATAL(server_start(&t));

	for (size_t i = 0; i < sizeof(guarded) / sizeof(guarded[0]); i++) {
		st = http_auth(t.http_port, "GET", guarded[i], NULL, &all);
		CU_ASSERT_EQUAL(st, 401);
		CU_ASSERT_PTR_NOT_NULL(all && strstr(all, bare));
		CU_ASSERT_PTR_NULL(all && strstr(all, "pipetrain_")); /* nothing leaks */
		free(all);
		st = http_auth(t.http_port, "GET", guarded[i], "Bearer tok-12", &all);
		CU_ASSERT_EQUAL(st, 401);
		CU_ASSERT_PTR_NOT_NULL(all && strstr(all, invalid));
		free(all);
		CU_ASSERT_EQUAL(http_auth(t.http_port, "GET", guarded[i], "Bearer tok-1234", NULL),
		                401);
		CU_ASSERT_EQUAL(
		    http_auth(t.http_port, "GET", guarded[i], "Basic dG9rLTEyMw==", NULL), 401);
		CU_ASSERT_EQUAL(http_auth(t.http_port, "HEAD", guarded[i], NULL, NULL), 401);
	}
	/* The right token: the request reaches its handler. */
	st = http_auth(t.http_port, "GET", "/metrics", "Bearer tok-123", &all);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(all && strstr(all, "\npipetrain_build_info{"));
	free(all);
	st = http_auth(t.http_port, "GET", "/api/jobs", "bearer tok-123", &all);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(all && strstr(all, "\r\n\r\n[]\n"));
	free(all);
	CU_ASSERT_EQUAL(http_auth(t.http_port, "GET", "/", "Bearer tok-123", NULL), 200);
	CU_ASSERT_EQUAL(http_auth(t.http_port, "HEAD", "/metrics", "Bearer tok-123", NULL), 200);
	CU_ASSERT_EQUAL(
	    http_auth(t.http_port, "GET", "/api/jobs/1/metrics", "Bearer tok-123", NULL), 404);
	CU_ASSERT_EQUAL(http_auth(t.http_port, "GET", "/no-such-path", "Bearer tok-123", NULL),
	                404);
	/* A wrong method is 405 before the token is looked at. */
	CU_ASSERT_EQUAL(http_auth(t.http_port, "POST", "/metrics", NULL, NULL), 405);
	/* Probes stay open, as Kubernetes' httpGet probes send no token. */
	st = http_auth(t.http_port, "GET", "/healthz", NULL, &all);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(all && strstr(all, "{\"status\":\"ok\"}"));
	free(all);
	st = http_auth(t.http_port, "GET", "/readyz", NULL, &all);
	CU_ASSERT_EQUAL(st, 200);
	CU_ASSERT_PTR_NOT_NULL(all && strstr(all, "\"ready\":true"));
	free(all);
	CU_ASSERT_EQUAL(http_auth(t.http_port, "GET", "/healthz", "Bearer wrong", NULL), 200);
	CU_ASSERT_EQUAL(server_stop(&t), 0);

	/* Without a token a non-loopback --http is refused at startup. */
	{
		server u = {.http_addr = "0.0.0.0:0"};
		snprintf(u.data_dir, sizeof(u.data_dir), "%s/data-notoken", tmpdir);
		snprintf(u.log, sizeof(u.log), "%s/server-notoken.log", tmpdir);
		CU_ASSERT_FALSE(server_start(&u));
		if (u.pid > 0) {
			int status = 0;
			CU_ASSERT_EQUAL(waitpid(u.pid, &status, 0), u.pid);
			CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) != 0);
		}
	}
}

static const pt_test_case http_tests[] = {
    {"test_http_metrics", test_http_metrics},
    {"test_http_dashboard", test_http_dashboard},
    {"test_http_hostile", test_http_hostile},
    {"test_http_probes", test_http_probes},
    {"test_http_dashboard_interleaved", test_http_dashboard_interleaved},
    {"test_http_json_logs", test_http_json_logs},
    {"test_http_token", test_http_token},
    {"test_http_connections_capped", test_http_connections_capped},
    {"test_http_trickle_cut_off", test_http_trickle_cut_off},
    {NULL, NULL},
};

static int suite_init(void)
{
	pt_api_request q;
	pt_api_response r;
	pt_job_spec spec;
	nng_msg *m = NULL;
	void *buf;
	size_t len;
	int rv;

	snprintf(srv.data_dir, sizeof(srv.data_dir), "%s/data", tmpdir);
	if (!server_start(&srv))
		return 1;
	if (nng_req0_open(&api) != 0 || nng_dial(api, srv.url, NULL, 0) != 0)
		return 1;
	nng_socket_set_ms(api, NNG_OPT_RECVTIMEO, 10000);
	nng_socket_set_ms(api, NNG_OPT_SENDTIMEO, 10000);
	nng_socket_set_ms(api, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	if (pt_fb_builder_init(&fbb, 0) != PT_OK ||
	    pt_job_spec_load_file(pt_test_path("examples/digits.json"), &buf, &len) != PT_OK)
		return 1;
	memset(&spec, 0, sizeof(spec));
	if (pt_job_spec_decode(buf, len, &spec) != PT_OK) {
		free(buf);
		pt_job_spec_fini(&spec);
		return 1;
	}
	free(buf);
	spec.steps = 100000; /* cancelled by test_http_probes */
	spec.eval_every = 0;
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &spec;
	rv = api_call(&q, &r, &m);
	pt_job_spec_fini(&spec);
	if (rv != 0 || r.code != PT_API_OK)
		return 1;
	job_id = r.job;
	nng_msg_free(m);
	return 0;
}

static int suite_fini(void)
{
	pt_test_nng_close(api.id);
	pt_fb_builder_fini(&fbb);
	return server_stop(&srv) == 0 ? 0 : 1;
}

int main(void)
{
	CU_pSuite s;
	int rc;

	if (!pt_test_binary("../server/pipeserver", server_bin, sizeof(server_bin))) {
		printf("pipeserver not found at %s: skipping\n", server_bin);
		return 77;
	}
	pt_test_binary(".", build_tests, sizeof(build_tests)); /* this program's directory */
	signal(SIGPIPE, SIG_IGN);
	if (!pt_test_tmpdir("test_http", tmpdir, sizeof(tmpdir)))
		return 99;
	/* One server and one job for the whole suite, in the order listed. */
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 99;
	s = CU_add_suite("http", suite_init, suite_fini);
	for (const pt_test_case *t = http_tests; s && t->name; t++)
		CU_add_test(s, t->name, t->fn);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	rc = CU_get_number_of_tests_failed() || CU_get_number_of_suites_failed() ||
	     CU_get_number_of_failures();
	CU_cleanup_registry();
	return pt_test_tmpdir_done(tmpdir, rc ? 1 : 0);
}
