/* test_client.c - libpipeclient and the pipeclient CLI against the real
 * pipeserver binary (started here on tcp://127.0.0.1:0 with a temporary data
 * directory), plus the Python client of tests/client_py.
 *
 * Jobs are the shipped digits example cut to a few steps (a temporary JSON
 * with absolute data paths). The CLI is spawned as build/client/pipeclient
 * and checked by exit code, text and --json output (parsed with lib/data's
 * JSON parser). Checkpoint downloads use small ranges so that an injected
 * stop leaves a partial file to resume. Tools that are missing (pipeserver
 * not built yet, flatc, nngcat, python3-flatbuffers) skip what needs them
 * with a message.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "pipeclient.h"
#include "pt_test.h"
#include "runtime.h"
#include "sha256.h"

#define STEPS    24         /* steps of the short job */
#define CHUNK    (8u << 10) /* small ranges: a checkpoint here is ~36 KB */
#define TOKEN    "s3cret-token"
#define LONG_JOB 1000000

/* Exit codes of the CLI (see pipeclient --help). */
enum {
	CLI_OK = 0,
	CLI_ERROR = 1,
	CLI_USAGE = 2,
	CLI_CONNECT = 3,
	CLI_REJECTED = 4,
	CLI_FAILED = 5
};

static char tmpdir[256];
static char bindir[PATH_MAX]; /* build/ */
static char cli_bin[PATH_MAX + 64], server_bin[PATH_MAX + 64];
static char job_json[PATH_MAX], job_bin[PATH_MAX], job_bad[PATH_MAX], job_long[PATH_MAX];
static char job_fail[PATH_MAX];

typedef struct server {
	pid_t pid;
	char url[256];
	char dir[PATH_MAX];
} server;

static server srv = {.pid = -1};

/* ----------------------------------------------------------------- helpers -- */

static const char *tpath(const char *name)
{
	static char bufs[8][PATH_MAX];
	static unsigned next;
	char *b = bufs[next++ % 8];
	snprintf(b, PATH_MAX, "%s/%s", tmpdir, name);
	return b;
}

static bool have_program(const char *name)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", name);
	return system(cmd) == 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *read_text(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long n;

	if (f == NULL)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf) {
		buf[n] = '\0';
		if (len)
			*len = (size_t)n;
	}
	return buf;
}

static void file_sha256(const char *path, char hex[PT_SHA256_HEX])
{
	size_t n = 0;
	char *data = read_text(path, &n);
	uint8_t d[PT_SHA256_BYTES];

	CU_ASSERT_PTR_NOT_NULL_FATAL(data);
	pt_sha256(data, n, d);
	pt_sha256_hex(d, hex);
	free(data);
}

static off_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? st.st_size : -1;
}

/* write_job writes the digits job with the given steps (and a broken first
 * layer when bad) as JSON with absolute data paths. */
static void write_job(const char *path, const char *name, long steps, bool bad,
                      const char *features, const char *labels)
{
	FILE *f = fopen(path, "w");

	if (f == NULL) {
		perror(path);
		exit(99); /* setup, before CUnit runs */
	}
	fprintf(f,
	        "{\n"
	        "  \"name\": \"%s\",\n"
	        "  \"model\": [\n"
	        "    { \"kind\": \"Linear\", \"in_features\": %d, \"out_features\": 64 },\n"
	        "    { \"kind\": \"ReLU\" },\n"
	        "    { \"kind\": \"Linear\", \"in_features\": 64, \"out_features\": 64 },\n"
	        "    { \"kind\": \"ReLU\" },\n"
	        "    { \"kind\": \"Linear\", \"in_features\": 64, \"out_features\": 10 }\n"
	        "  ],\n"
	        "  \"data\": { \"format\": \"Npy\", \"features\": \"%s\", \"labels\": \"%s\",\n"
	        "            \"held_out\": 0.2 },\n"
	        "  \"loss\": \"CrossEntropy\",\n"
	        "  \"optimizer\": { \"kind\": \"AdamW\", \"lr\": 0.003, \"weight_decay\": 0.01 },\n"
	        "  \"batch_size\": 64, \"microbatches\": 4, \"steps\": %ld, \"mode\": \"Sync\",\n"
	        "  \"placement\": { \"stages\": 4, \"threads_per_stage\": 1 },\n"
	        "  \"checkpoint\": { \"every_steps\": 8, \"keep\": 5 },\n"
	        "  \"seed\": 7, \"eval_every\": 8\n"
	        "}\n",
	        name, bad ? 63 : 64, features, labels, steps);
	fclose(f);
}

/* run_cli runs pipeclient with argv (NULL-terminated, without argv[0]) and
 * the environment as is; returns the exit status and stdout in *out
 * (free it). stderr goes to the test log. */
static int run_cli(char **out, const char *arg0, ...)
{
	const char *argv[32];
	int n = 0, pfd[2], status;
	va_list ap;
	pid_t pid;
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);

	argv[n++] = cli_bin;
	va_start(ap, arg0);
	for (const char *a = arg0; a != NULL && n < 31; a = va_arg(ap, const char *))
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	fprintf(stderr, "$ pipeclient");
	for (int i = 1; i < n; i++)
		fprintf(stderr, " %s", argv[i]);
	fprintf(stderr, "\n");

	CU_ASSERT_FATAL(buf != NULL && pipe(pfd) == 0);
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0) {
		dup2(pfd[1], STDOUT_FILENO);
		close(pfd[0]);
		close(pfd[1]);
		execv(cli_bin, (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		ssize_t r;
		if (len + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
		}
		r = read(pfd[0], buf + len, cap - len - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	buf[len] = '\0';
	close(pfd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	fprintf(stderr, "%s[exit %d]\n", buf, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	if (out)
		*out = buf;
	else
		free(buf);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* cli_proc is a pipeclient running beside the test: its stdout is read as it
 * comes (all of it is kept), its stderr goes to a file. */
typedef struct cli_proc {
	pid_t pid;
	int out; /* read end of its stdout */
	char err_path[PATH_MAX];
	char *buf; /* stdout so far, NUL-terminated */
	size_t len, cap;
} cli_proc;

/* cli_startv runs pipeclient with arg0 and ap (NULL-terminated). */
static void cli_startv(cli_proc *p, const char *arg0, va_list ap)
{
	static unsigned seq;
	const char *argv[32];
	int n = 0, pfd[2];

	argv[n++] = cli_bin;
	for (const char *a = arg0; a != NULL && n < 31; a = va_arg(ap, const char *))
		argv[n++] = a;
	argv[n] = NULL;
	fprintf(stderr, "$ pipeclient");
	for (int i = 1; i < n; i++)
		fprintf(stderr, " %s", argv[i]);
	fprintf(stderr, " &\n");

	memset(p, 0, sizeof(*p));
	snprintf(p->err_path, sizeof(p->err_path), "%s/cli-%u.err", tmpdir, seq++);
	p->cap = 4096;
	p->buf = calloc(1, p->cap);
	CU_ASSERT_FATAL(p->buf != NULL && pipe(pfd) == 0);
	p->pid = fork();
	CU_ASSERT_FATAL(p->pid >= 0);
	if (p->pid == 0) {
		int fd = open(p->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			_exit(127);
		dup2(pfd[1], STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
		close(pfd[0]);
		close(pfd[1]);
		execv(cli_bin, (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	p->out = pfd[0];
}

/* cli_start runs pipeclient with argv (NULL-terminated, without argv[0]). */
static void cli_start(cli_proc *p, const char *arg0, ...)
{
	va_list ap;

	va_start(ap, arg0);
	cli_startv(p, arg0, ap);
	va_end(ap);
}

/* cli_read appends what p writes to stdout within timeout_s seconds: 1 when
 * something came, 0 when nothing did, -1 at the end of its output. */
static int cli_read(cli_proc *p, double timeout_s)
{
	struct pollfd pf = {.fd = p->out, .events = POLLIN};
	ssize_t r;

	if (poll(&pf, 1, (int)(timeout_s * 1000)) <= 0)
		return 0;
	if (p->len + 4096 + 1 > p->cap) {
		p->cap = 2 * p->cap + 4096;
		p->buf = realloc(p->buf, p->cap);
		CU_ASSERT_PTR_NOT_NULL_FATAL(p->buf);
	}
	while ((r = read(p->out, p->buf + p->len, p->cap - p->len - 1)) < 0 && errno == EINTR)
		;
	if (r <= 0)
		return -1;
	p->len += (size_t)r;
	p->buf[p->len] = '\0';
	return 1;
}

/* cli_wait_for reads p's stdout until it holds needle (true) or timeout_s
 * passed or it ended (false). */
static bool cli_wait_for(cli_proc *p, const char *needle, double timeout_s)
{
	double t0 = now_s();

	while (strstr(p->buf, needle) == NULL) {
		double left = timeout_s - (now_s() - t0);
		if (left <= 0 || cli_read(p, left) < 0)
			break;
	}
	if (strstr(p->buf, needle) == NULL) {
		fprintf(stderr, "pipeclient did not print \"%s\" within %.0f s\n", needle,
		        timeout_s);
		return false;
	}
	return true;
}

/* cli_end reads p's stdout to its end, waits for it and returns the exit
 * status (128 + N for a signal N); *out and *err (may be NULL) get stdout
 * and stderr (free them). */
static int cli_end(cli_proc *p, char **out, char **err)
{
	char *e;
	int status;

	while (cli_read(p, 60) > 0)
		;
	close(p->out);
	while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
		;
	e = read_text(p->err_path, NULL);
	fprintf(stderr, "%s%s[exit %d]\n", p->buf, e ? e : "",
	        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	if (out)
		*out = p->buf;
	else
		free(p->buf);
	if (err)
		*err = e ? e : strdup("");
	else
		free(e);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* run_cli_err is run_cli that also returns stderr (*err, free it). */
static int run_cli_err(char **out, char **err, const char *arg0, ...)
{
	cli_proc p;
	va_list ap;

	va_start(ap, arg0);
	cli_startv(&p, arg0, ap);
	va_end(ap);
	return cli_end(&p, out, err);
}

/* parse_line parses line i (0-based; -1: the last non-empty one) of text as
 * JSON into *v; false when there is no such line or it is not JSON. */
static bool parse_line(const char *text, int i, pt_json *v)
{
	const char *lines[4096];
	size_t lens[4096];
	int n = 0;
	const char *p = text;

	while (*p && n < 4096) {
		const char *e = strchr(p, '\n');
		size_t l = e ? (size_t)(e - p) : strlen(p);
		if (l > 0) {
			lines[n] = p;
			lens[n++] = l;
		}
		p += l + (e ? 1 : 0);
	}
	if (i < 0)
		i = n + i;
	if (i < 0 || i >= n)
		return false;
	if (pt_json_parse(v, lines[i], lens[i], NULL) != PT_OK) {
		fprintf(stderr, "not JSON: %.*s (%s)\n", (int)lens[i], lines[i], pt_last_error());
		return false;
	}
	return true;
}

static int count_lines(const char *text)
{
	int n = 0;
	for (const char *p = text; *p; p++)
		n += *p == '\n';
	return n;
}

static const char *jstr(const pt_json *o, const char *key)
{
	const char *s = pt_json_string(pt_json_get(o, key));
	return s ? s : "";
}

static int64_t jint(const pt_json *o, const char *key)
{
	int64_t v = -12345;
	pt_json_int(pt_json_get(o, key), &v);
	return v;
}

static double jnum(const pt_json *o, const char *key)
{
	const pt_json *v = pt_json_get(o, key);
	return v && v->type == PT_JSON_NUMBER ? v->d : NAN;
}

#define CHECK_LIB(expr)                                                                            \
	do {                                                                                       \
		pipeclient_err e_ = (expr);                                                        \
		if (e_ != PIPECLIENT_OK)                                                           \
			fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,        \
			        pipeclient_err_name(e_), pipeclient_last_error());                 \
		CU_ASSERT_EQUAL_FATAL(e_, PIPECLIENT_OK);                                          \
	} while (0)

#define CHECK_LIB_ERR(expr, code)                                                                  \
	do {                                                                                       \
		pipeclient_err e_ = (expr);                                                        \
		fprintf(stderr, "%s -> %s: %s\n", #expr, pipeclient_err_name(e_),                  \
		        pipeclient_last_error());                                                  \
		CU_ASSERT_EQUAL(e_, (code));                                                       \
	} while (0)

/* ------------------------------------------------------------------ server -- */

/* server_start runs pipeserver on listen (NULL: an ephemeral loopback tcp
 * port) with the extra flags (NULL-terminated, may be NULL) and waits for its
 * "pipeserver listening on URL" line. */
static bool server_start(server *s, const char *name, const char *listen, const char *const *extra)
{
	char out[PATH_MAX + 32];
	const char *argv[32];
	double t0 = now_s();
	int n = 0;

	snprintf(s->dir, sizeof(s->dir), "%s/%s", tmpdir, name);
	snprintf(out, sizeof(out), "%s.out", s->dir);
	argv[n++] = server_bin;
	argv[n++] = "--listen";
	argv[n++] = listen ? listen : "tcp://127.0.0.1:0";
	argv[n++] = "--data-dir";
	argv[n++] = s->dir;
	/* The jobs name their data relative to tmpdir. */
	argv[n++] = "--files-root";
	argv[n++] = tmpdir;
	for (int i = 0; extra && extra[i] && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	pid_t parent = getpid();
	s->pid = fork();
	if (s->pid < 0)
		return false;
	if (s->pid == 0) {
		pt_test_child_dies_with(parent);
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			_exit(127);
		dup2(fd, STDOUT_FILENO);
		close(fd);
		setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
		execv(server_bin, (char *const *)argv);
		_exit(127);
	}
	while (now_s() - t0 < 60) {
		char *text = read_text(out, NULL);
		char *p = text ? strstr(text, "pipeserver listening on ") : NULL;
		int status;
		if (p && strchr(p, '\n')) {
			sscanf(p + strlen("pipeserver listening on "), "%255s", s->url);
			free(text);
			fprintf(stderr, "started pipeserver (pid %d) on %s\n", (int)s->pid, s->url);
			return true;
		}
		free(text);
		if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
			fprintf(stderr, "pipeserver exited before listening (status %d)\n", status);
			s->pid = -1;
			return false;
		}
		usleep(20000);
	}
	fprintf(stderr, "pipeserver did not say where it listens within 60 s\n");
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
	s->pid = -1;
	return false;
}

/* server_stop sends SIGTERM and waits (SIGKILL after 30 s); true on a clean exit. */
static bool server_stop(server *s)
{
	double t0 = now_s();
	int status = 0;

	if (s->pid < 0)
		return true;
	kill(s->pid, SIGTERM);
	while (waitpid(s->pid, &status, WNOHANG) == 0) {
		if (now_s() - t0 > 30) {
			fprintf(stderr, "pipeserver ignored SIGTERM for 30 s: killing it\n");
			kill(s->pid, SIGKILL);
			waitpid(s->pid, &status, 0);
			break;
		}
		usleep(20000);
	}
	s->pid = -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static pipeclient *connect_lib(void)
{
	pipeclient_options o = {.url = srv.url, .timeout_ms = 30000, .fetch_chunk = CHUNK};
	pipeclient *c = NULL;
	CHECK_LIB(pipeclient_connect(&c, &o));
	return c;
}

/* wait_final watches job to its end through the library; returns the state. */
typedef struct seen {
	int n;
	int64_t last_step;
	bool ordered;
	double first_loss, last_loss;
	int stop_after; /* > 0: stop the watch after this many points */
} seen;

static bool collect(void *ctx, uint64_t job, const pipeclient_metric *m)
{
	seen *s = ctx;
	(void)job;
	if (m->step <= s->last_step)
		s->ordered = false;
	s->last_step = m->step;
	if (s->n == 0)
		s->first_loss = m->loss;
	s->last_loss = m->loss;
	s->n++;
	return s->stop_after <= 0 || s->n < s->stop_after;
}

static pipeclient_job_state wait_final(pipeclient *c, uint64_t job, seen *s)
{
	pipeclient_job_state st = PIPECLIENT_QUEUED;
	seen local = {.last_step = -1, .ordered = true};

	if (s == NULL)
		s = &local;
	CHECK_LIB(pipeclient_watch(c, job, -1, 500, collect, s, &st));
	return st;
}

/* The id of a job submitted by the CLI with --json (first line). */
static uint64_t submitted_id(const char *out)
{
	pt_json v;
	int64_t id = -1;

	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	if (!pt_json_int(pt_json_get(&v, "job"), &id))
		id = -1;
	pt_json_fini(&v);
	CU_ASSERT_FATAL(id > 0 || id == 0);
	return (uint64_t)id;
}

/* ------------------------------------------------------------------- tests -- */

static void test_client_usage_errors(void)
{
	char *out;

	CU_ASSERT_EQUAL(run_cli(NULL, NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "frobnicate", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "status", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "status", "12x", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "checkpoint", "1", NULL), CLI_USAGE); /* no -o */
	CU_ASSERT_EQUAL(run_cli(NULL, "list", "--follow", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "--bogus", "list", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", "nonsense://x", "info", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(&out, "--help", NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "checkpoint JOB"));
	free(out);
}

/* has_description tells whether text lists flag ("\n  FLAG") with words
 * after it on its line or, when the flag fills the line, on the next. */
static bool has_description(const char *text, const char *flag)
{
	char key[64];
	const char *p;

	snprintf(key, sizeof(key), "\n  %s", flag);
	if ((p = strstr(text, key)) == NULL) {
		fprintf(stderr, "no option line for %s\n", flag);
		return false;
	}
	p += strlen(key);
	if (*p != ' ' && *p != '\n')
		return false; /* a longer flag ("--every" in "--every-x") */
	while (*p == ' ')
		p++;
	if (*p == '\n') /* "  --tls-server-name NAME\n                      words" */
		for (p++; *p == ' '; p++)
			;
	if (*p == '\n' || *p == '\0' || *p == '-') {
		fprintf(stderr, "option %s has no description\n", flag);
		return false;
	}
	return true;
}

/* `pipeclient COMMAND --help` and `pipeclient help COMMAND` print that
 * command's usage and flags to stdout, exit 0; every option of the main
 * text has a description. */
static void test_client_help(void)
{
	static const struct {
		const char *cmd;
		const char *flags[3];
	} cmds[] = {
	    {"submit", {"--follow", "--every N", NULL}},
	    {"plan", {"--stages LIST", "--microbatches LIST", NULL}},
	    {"status", {NULL}},
	    {"list", {NULL}},
	    {"queue", {NULL}},
	    {"cancel", {NULL}},
	    {"watch", {"--every N", NULL}},
	    {"checkpoint", {"--step N", "-o, --output FILE", NULL}},
	    {"checkpoints", {NULL}},
	    {"info", {NULL}},
	};
	/* Every long option of pipeclient_cli.c's longopts. */
	static const char *const options[] = {"--server URL",
	                                      "--token TOKEN",
	                                      "--timeout SECONDS",
	                                      "--json",
	                                      "--follow",
	                                      "--every N",
	                                      "--stages L",
	                                      "--microbatches L",
	                                      "--step N",
	                                      "-o, --output FILE",
	                                      "--tls-ca FILE",
	                                      "--tls-cert FILE",
	                                      "--tls-server-name NAME",
	                                      "--insecure",
	                                      "-h, --help",
	                                      "--version"};
	char *out, *out2, *err, want[64];

	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		snprintf(want, sizeof(want), "usage: pipeclient %s ", cmds[i].cmd);
		CU_ASSERT_EQUAL(run_cli_err(&out, &err, cmds[i].cmd, "--help", NULL), CLI_OK);
		CU_ASSERT_EQUAL(strncmp(out, want, strlen(want)), 0);
		CU_ASSERT_STRING_EQUAL(err, "");
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "common options: --server URL"));
		for (int f = 0; cmds[i].flags[f]; f++)
			CU_ASSERT_TRUE(has_description(out, cmds[i].flags[f]));
		/* The same text from `help COMMAND` and with the arguments given. */
		CU_ASSERT_EQUAL(run_cli(&out2, "help", cmds[i].cmd, NULL), CLI_OK);
		CU_ASSERT_STRING_EQUAL(out2, out);
		free(out2);
		CU_ASSERT_EQUAL(
		    run_cli(&out2, "--server", "tcp://127.0.0.1:1", cmds[i].cmd, "7", "-h", NULL),
		    CLI_OK);
		CU_ASSERT_STRING_EQUAL(out2, out);
		free(out2);
		free(out);
		free(err);
	}

	CU_ASSERT_EQUAL(run_cli(&out, "--help", NULL), CLI_OK);
	CU_ASSERT_EQUAL(strncmp(out, "usage: pipeclient [options] COMMAND", 35), 0);
	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++)
		CU_ASSERT_TRUE(has_description(out, options[i]));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\n  130  watch, submit --follow: stopped by Ctrl-C"));
	CU_ASSERT_EQUAL(run_cli(&out2, "help", NULL), CLI_OK);
	CU_ASSERT_STRING_EQUAL(out2, out);
	free(out2);
	free(out);
	CU_ASSERT_EQUAL(run_cli(NULL, "help", "frobnicate", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "frobnicate", "--help", NULL), CLI_USAGE);
}

/* A URL without a scheme: usage error (2) with the tcp:// URL to use. */
static void test_client_url_without_scheme(void)
{
	static const char *const cases[][2] = {
	    {"localhost:5555", "did you mean tcp://localhost:5555?"},
	    {"127.0.0.1:5555", "did you mean tcp://127.0.0.1:5555?"},
	    {"[::1]:5555", "did you mean tcp://[::1]:5555?"},
	    {"gpu-box", "did you mean tcp://gpu-box:7600?"}, /* the default port */
	};
	pipeclient_options o = {0};
	pipeclient *c = NULL;
	char *out, *err, want[128];
	pt_json v;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		o.url = cases[i][0];
		CHECK_LIB_ERR(pipeclient_connect(&c, &o), PIPECLIENT_ERR_INVALID);
		CU_ASSERT_PTR_NULL(c);
		snprintf(want, sizeof(want), "URL \"%s\" has no scheme: %s", cases[i][0],
		         cases[i][1]);
		CU_ASSERT_STRING_EQUAL(pipeclient_last_error(), want);
	}
	CU_ASSERT_EQUAL(run_cli_err(&out, &err, "--server", "localhost:5555", "info", NULL),
	                CLI_USAGE);
	CU_ASSERT_STRING_EQUAL(err, "pipeclient: URL \"localhost:5555\" has no scheme: did you "
	                            "mean tcp://localhost:5555?\n");
	free(out);
	free(err);
	/* From the environment, and in --json's error object. */
	setenv("PIPETRAIN_SERVER", "127.0.0.1:5555", 1);
	CU_ASSERT_EQUAL(run_cli(&out, "--json", "list", NULL), CLI_USAGE);
	unsetenv("PIPETRAIN_SERVER");
	CU_ASSERT_FATAL(parse_line(out, -1, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "error"), "PIPECLIENT_ERR_INVALID");
	CU_ASSERT_PTR_NOT_NULL(strstr(jstr(&v, "message"), "did you mean tcp://127.0.0.1:5555?"));
	pt_json_fini(&v);
	free(out);
}

static void test_client_connection_failure(void)
{
	pipeclient_options o = {.url = "tcp://127.0.0.1:1", .timeout_ms = 2000};
	pipeclient *c = (pipeclient *)&o; /* must be reset to NULL on failure */
	char *out;
	pt_json v;

	/* Port 1 on loopback: nothing listens there (and we may not bind it). */
	CHECK_LIB_ERR(pipeclient_connect(&c, &o), PIPECLIENT_ERR_CONNECT);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_PTR_NOT_NULL(strstr(pipeclient_last_error(), "127.0.0.1:1"));

	CU_ASSERT_EQUAL(run_cli(NULL, "--server", "tcp://127.0.0.1:1", "list", NULL), CLI_CONNECT);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", "tcp://127.0.0.1:1", "--json", "info", NULL),
	                CLI_CONNECT);
	if (parse_line(out, -1, &v)) {
		CU_ASSERT_STRING_EQUAL(jstr(&v, "error"), "PIPECLIENT_ERR_CONNECT");
		pt_json_fini(&v);
	} else {
		CU_FAIL("no JSON error object");
	}
	free(out);
	/* The environment names the server when --server does not. */
	setenv("PIPETRAIN_SERVER", "tcp://127.0.0.1:1", 1);
	CU_ASSERT_EQUAL(run_cli(NULL, "info", NULL), CLI_CONNECT);
	setenv("PIPETRAIN_SERVER", srv.url, 1);
	CU_ASSERT_EQUAL(run_cli(NULL, "info", NULL), CLI_OK);
	unsetenv("PIPETRAIN_SERVER");
}

static void test_client_info(void)
{
	pipeclient *c = connect_lib();
	pipeclient_server_info si;
	char *out;
	pt_json v;

	CHECK_LIB(pipeclient_info(c, &si));
	CU_ASSERT_EQUAL(si.protocol, PIPECLIENT_PROTOCOL);
	CU_ASSERT(si.version[0] != '\0');
	CU_ASSERT(si.device[0] != '\0');
	CU_ASSERT(si.uptime_seconds >= 0);
	/* What the server detected and picked: this machine's CPU, oneDNN's ISA
	 * and OpenSSL's SHA-256 (the server links libcrypto). */
	{
		char k[1024], want[80];
		CHECK_LIB(pipeclient_kernels(c, k, sizeof(k)));
		CU_ASSERT_PTR_NOT_NULL(strstr(k, "cpu: "));
		CU_ASSERT_PTR_NOT_NULL(strstr(k, "; matmul: oneDNN "));
		CU_ASSERT_PTR_NOT_NULL(strstr(k, "; sha256: openssl (pairs "));
		snprintf(want, sizeof(want), ", %d cores (avx2 ", pt_num_cores());
		CU_ASSERT_PTR_NOT_NULL(strstr(k, want));
		CU_ASSERT_EQUAL(pipeclient_kernels(c, k, 0), PIPECLIENT_ERR_INVALID);
	}
	pipeclient_close(c);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "info", NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "version"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\nkernels  cpu: "));
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "info", NULL), CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_EQUAL(jint(&v, "protocol"), PIPECLIENT_PROTOCOL);
	CU_ASSERT_STRING_EQUAL(jstr(&v, "version"), si.version);
	CU_ASSERT_PTR_NOT_NULL(strstr(jstr(&v, "kernels"), "; matmul: oneDNN "));
	pt_json_fini(&v);
	free(out);
}

/* submit --follow --json: a submitted line, a metric line per step, the job. */
static void test_client_cli_submit_follow(void)
{
	char *out;
	pt_json first, last, v;
	int n, lines;

	CU_ASSERT_EQUAL(
	    run_cli(&out, "--server", srv.url, "--json", "submit", job_json, "--follow", NULL),
	    CLI_OK);
	lines = count_lines(out);
	CU_ASSERT_EQUAL(lines, STEPS + 2);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "type"), "submitted");
	pt_json_fini(&v);
	CU_ASSERT_FATAL(parse_line(out, 1, &first) && parse_line(out, lines - 2, &last));
	CU_ASSERT_STRING_EQUAL(jstr(&first, "type"), "metric");
	CU_ASSERT_EQUAL(jint(&first, "step"), 1);
	CU_ASSERT_EQUAL(jint(&last, "step"), STEPS);
	CU_ASSERT(jnum(&last, "loss") < jnum(&first, "loss")); /* it learns */
	CU_ASSERT(jnum(&last, "eval_accuracy") > 0.5);
	CU_ASSERT_EQUAL(pt_json_get(&first, "stage_busy")->len, 4);
	pt_json_fini(&first);
	pt_json_fini(&last);
	CU_ASSERT_FATAL(parse_line(out, -1, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "type"), "job");
	CU_ASSERT_STRING_EQUAL(jstr(&v, "state"), "Succeeded");
	CU_ASSERT_EQUAL(jint(&v, "step"), STEPS);
	CU_ASSERT_STRING_EQUAL(jstr(&v, "name"), "client-test");
	pt_json_fini(&v);
	free(out);

	/* Text mode (not a terminal: no bar, no escape codes). */
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "submit", job_json, "--follow",
	                        "--every", "8", NULL),
	                CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "submitted job "));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "step 8/24  loss "));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "accuracy"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "Succeeded"));
	CU_ASSERT_PTR_NULL(strchr(out, '\r'));
	CU_ASSERT_PTR_NULL(strchr(out, '\033'));
	n = 0;
	for (const char *p = out; (p = strstr(p, "  loss ")) != NULL; p++)
		n++;
	CU_ASSERT(n >= 4 && n <= 6); /* steps 1, 8, 16, 24 (+ the status line) */
	free(out);
}

/* A job on token data shows tokens/s (not samples/s) with three significant
 * digits, in --follow lines and in status. */
static void test_client_token_job_rates(void)
{
	char *out, buf[32], g[32], rate[48], want[96];
	const char *path = tpath("tokens.json");
	FILE *f = fopen(path, "w");
	double tps;
	uint64_t id;
	pt_json v;

	CU_ASSERT_FATAL(f != NULL);
	fprintf(f, "{ \"name\": \"tok\", \"model\": ["
	           "{ \"kind\": \"Embedding\", \"vocab\": 256, \"dim\": 16, \"max_seq\": 16 },"
	           "{ \"kind\": \"TransformerBlock\", \"dim\": 16, \"n_head\": 2 },"
	           "{ \"kind\": \"LayerNorm\", \"dim\": 16 },"
	           "{ \"kind\": \"Linear\", \"in_features\": 16, \"out_features\": 256 } ],"
	           "\"data\": { \"format\": \"Tokens16\", \"tokens\": \"text.u16\", "
	           "\"seq_len\": 16, \"vocab\": 256 }, \"loss\": \"CrossEntropy\", "
	           "\"optimizer\": { \"kind\": \"AdamW\", \"lr\": 0.003 }, \"batch_size\": 8, "
	           "\"microbatches\": 2, \"steps\": 4, \"mode\": \"Sync\", \"seed\": 1 }\n");
	fclose(f);
	CU_ASSERT_EQUAL(
	    run_cli(&out, "--server", srv.url, "submit", path, "--follow", "--every", "1", NULL),
	    CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "step 4/4  loss "));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, " tokens/s"));
	CU_ASSERT_PTR_NULL(strstr(out, "samples/s"));
	CU_ASSERT_FATAL(strstr(out, "submitted job ") != NULL &&
	                sscanf(strstr(out, "submitted job "), "submitted job %" SCNu64, &id) == 1);
	free(out);
	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "status", buf, NULL), CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	tps = jnum(pt_json_get(&v, "last"), "tokens_per_second");
	CU_ASSERT(tps > 0);
	pt_json_fini(&v);
	free(out);
	snprintf(g, sizeof(g), "%.3g", tps);
	if (strtod(g, NULL) >= 100)
		snprintf(rate, sizeof(rate), "%.0f", strtod(g, NULL));
	else
		snprintf(rate, sizeof(rate), "%s", g);
	snprintf(want, sizeof(want), ", %s tokens/s, bubble ", rate);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	if (strstr(out, want) == NULL)
		fprintf(stderr, "wanted \"%s\" in:\n%s", want, out);
	free(out);
}

/* The library: submit from a JSON file, a binary file with a misleading name,
 * JSON text and a binary buffer; watch each to its end. */
static void test_client_lib_submit_watch(void)
{
	pipeclient *c = connect_lib();
	uint64_t ids[4];
	int n = 0;
	char *text;
	size_t len;
	seen s = {.last_step = -1, .ordered = true};
	pipeclient_job j;

	CHECK_LIB(pipeclient_submit_file(c, job_json, &ids[n++]));
	text = read_text(job_json, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CHECK_LIB(pipeclient_submit_json(c, text, len, &ids[n++]));
	free(text);
	if (job_bin[0]) {
		CHECK_LIB(pipeclient_submit_file(c, job_bin, &ids[n++]));
		text = read_text(job_bin, &len);
		CU_ASSERT_PTR_NOT_NULL_FATAL(text);
		CHECK_LIB(pipeclient_submit_spec(c, text, len, &ids[n++]));
		free(text);
	} else {
		fprintf(stderr, "SKIP: flatc missing: binary job files not tested\n");
	}
	for (int i = 1; i < n; i++)
		CU_ASSERT(ids[i] != ids[i - 1]);

	CU_ASSERT_EQUAL(wait_final(c, ids[0], &s), PIPECLIENT_SUCCEEDED);
	CU_ASSERT_EQUAL(s.n, STEPS);
	CU_ASSERT(s.ordered);
	CU_ASSERT_EQUAL(s.last_step, STEPS);
	CU_ASSERT(s.last_loss < s.first_loss);
	/* A watch from a cursor gets only what follows it. */
	memset(&s, 0, sizeof(s));
	s.last_step = STEPS - 5;
	s.ordered = true;
	CHECK_LIB(pipeclient_watch(c, ids[0], STEPS - 5, 200, collect, &s, NULL));
	CU_ASSERT_EQUAL(s.n, 5);
	/* A callback may stop the watch. */
	memset(&s, 0, sizeof(s));
	s.last_step = -1;
	s.stop_after = 3;
	CU_ASSERT_EQUAL(pipeclient_watch(c, ids[0], -1, 200, collect, &s, NULL),
	                PIPECLIENT_ERR_STOPPED);
	CU_ASSERT_EQUAL(s.n, 3);

	for (int i = 1; i < n; i++) {
		CU_ASSERT_EQUAL(wait_final(c, ids[i], NULL), PIPECLIENT_SUCCEEDED);
		CHECK_LIB(pipeclient_get(c, ids[i], &j));
		CU_ASSERT_EQUAL(j.step, STEPS);
		CU_ASSERT_STRING_EQUAL(j.name, "client-test");
		pipeclient_job_fini(&j);
	}
	pipeclient_close(c);
}

/* sum_busy adds up every point's per-stage busy seconds, in step order. */
static bool sum_busy(void *ctx, uint64_t job, const pipeclient_metric *m)
{
	double *busy = ctx;
	(void)job;
	for (int k = 0; k < m->n_stages && k < 4; k++)
		busy[k] += m->stage_busy[k];
	return true;
}

/* check_status_stages checks `pipeclient status` of the finished 4-stage job
 * id: the bubble fraction line and one line per stage with its busy seconds
 * (the sum over the job's points, as pipeclient_stages reports it), then
 * the coordinator's line; with --json the same figures in "stages". */
static void check_status_stages(pipeclient *c, uint64_t id)
{
	pipeclient_stage *st = NULL;
	pipeclient_job j;
	double busy[4] = {0}, bubble = -1;
	char *out, buf[64], want[128];
	const char *p;
	size_t n = 0;
	pt_json v;

	CHECK_LIB(pipeclient_watch(c, id, -1, 100, sum_busy, busy, NULL));
	CHECK_LIB(pipeclient_stages(c, id, &st, &n));
	CU_ASSERT_EQUAL_FATAL(n, 5);
	for (size_t i = 0; i < n; i++) {
		CU_ASSERT_EQUAL(st[i].stage, (int)i - 1);
		CU_ASSERT(st[i].has_comm); /* in-process stages: every rank reports */
		CU_ASSERT(st[i].messages_sent > 0 && st[i].messages_received > 0);
		CU_ASSERT(st[i].bytes_sent > 0 && st[i].bytes_received > 0);
		CU_ASSERT_EQUAL(st[i].bytes_raw_sent, st[i].bytes_sent); /* shared, not copied */
		CU_ASSERT_EQUAL(st[i].errors, 0);
		CU_ASSERT_EQUAL(st[i].reconnects, 0);
		if (i > 0) {
			CU_ASSERT(busy[i - 1] > 0);
			CU_ASSERT_EQUAL(st[i].busy_seconds, busy[i - 1]); /* same sum, same order */
		}
	}
	CU_ASSERT_EQUAL(st[0].busy_seconds, 0);

	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_OK);
	p = strstr(out, "\n  bubble fraction ");
	CU_ASSERT_FATAL(p != NULL && sscanf(p, "\n  bubble fraction %lf (", &bubble) == 1);
	CHECK_LIB(pipeclient_get(c, id, &j));
	snprintf(want, sizeof(want),
	         "\n  bubble fraction %.3f (idle share of stage time in step %d)\n", j.last.bubble,
	         STEPS);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	{
		/* The rate with three significant digits, in plain notation. */
		char g[32], rate[48];
		snprintf(g, sizeof(g), "%.3g", j.last.samples_per_second);
		if (strtod(g, NULL) >= 100)
			snprintf(rate, sizeof(rate), "%.0f", strtod(g, NULL));
		else
			snprintf(rate, sizeof(rate), "%s", g);
		snprintf(want, sizeof(want), " (lr %.3g, %s samples/s, bubble ",
		         j.last.learning_rate, rate);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
		if (strstr(out, want) == NULL)
			fprintf(stderr, "wanted \"%s\" in:\n%s", want, out);
	}
	pipeclient_job_fini(&j);
	CU_ASSERT(bubble >= 0 && bubble <= 1);
	for (int k = 0; k < 4; k++) {
		snprintf(want, sizeof(want),
		         "\n  stage %d: busy %.6f s; %" PRIu64 " messages sent (", k,
		         st[k + 1].busy_seconds, st[k + 1].messages_sent);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	}
	CU_ASSERT_PTR_NULL(strstr(out, "\n  stage 4:"));
	snprintf(want, sizeof(want), "\n  coordinator: %" PRIu64 " messages sent (",
	         st[0].messages_sent);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	free(out);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "status", buf, NULL), CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_EQUAL_FATAL(pt_json_get(&v, "stages") ? pt_json_get(&v, "stages")->len : 0, 5);
	for (size_t i = 0; i < 5; i++) {
		const pt_json *e = pt_json_at(pt_json_get(&v, "stages"), i);
		CU_ASSERT_EQUAL(jint(e, "stage"), (int64_t)i - 1);
		CU_ASSERT_EQUAL(jnum(e, "busy_seconds"), st[i].busy_seconds);
		CU_ASSERT_EQUAL(jint(e, "messages_sent"), (int64_t)st[i].messages_sent);
	}
	pt_json_fini(&v);
	free(out);
	free(st);
}

/* An interleaved job (2 stages of 2 chunks): its last step's timeline has
 * the 4 chunk stages' tasks (4 forwards, 4 backwards each); the library
 * says 2 chunks a stage from the spec (1 without one), and `pipeclient
 * status` draws a row per stage, chunk 1 in small letters. */
static void test_client_interleaved_timeline(void)
{
	pipeclient *c = connect_lib();
	pipeclient_job j = {0};
	pipeclient_task *t = NULL;
	size_t n = 0;
	int per[4][2] = {{0}};
	uint64_t id;
	char *out, buf[64], *text, *json;
	const char *il = tpath("interleaved.json");
	size_t len;

	/* job.json with 2 stages, the schedule and no checkpoints. */
	text = read_text(job_json, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	json = malloc(len + 256);
	{
		const char *p = strstr(text, "\"placement\"");
		CU_ASSERT_PTR_NOT_NULL_FATAL(p);
		snprintf(json, len + 256,
		         "%.*s\"placement\": { \"stages\": 2, \"threads_per_stage\": 1 },\n"
		         "  \"schedule\": \"interleaved\", \"virtual_stages\": 2,\n"
		         "  \"seed\": 7, \"eval_every\": 8\n}\n",
		         (int)(p - text), text);
	}
	pt_test_write_file(il, json, strlen(json));
	CU_ASSERT_EQUAL(pipeclient_job_virtual_stages(&j), 1); /* no spec */
	CHECK_LIB(pipeclient_submit_file(c, il, &id));
	CU_ASSERT_EQUAL(wait_final(c, id, NULL), PIPECLIENT_SUCCEEDED);
	CHECK_LIB(pipeclient_get(c, id, &j));
	CU_ASSERT_EQUAL(pipeclient_job_virtual_stages(&j), 2);
	CU_ASSERT_EQUAL(j.last.n_stages, 4);
	pipeclient_job_fini(&j);
	CHECK_LIB(pipeclient_timeline(c, id, &t, &n));
	CU_ASSERT_EQUAL(n, 32);
	for (size_t i = 0; i < n; i++) {
		CU_ASSERT_FATAL(t[i].stage >= 0 && t[i].stage < 4);
		per[t[i].stage][t[i].kind == 'F' ? 0 : 1]++;
	}
	for (int s = 0; s < 4; s++)
		CU_ASSERT(per[s][0] == 4 && per[s][1] == 4);
	free(t);
	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "chunk 0 in capitals, later chunks in small letters"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\n  stage 0  "));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\n  stage 1  "));
	CU_ASSERT_PTR_NULL(strstr(out, "\n  stage 2  "));
	{
		const char *row = strstr(out, "\n  stage 0  ");
		CU_ASSERT(row != NULL && strpbrk(row + 12, "fb") != NULL &&
		          strpbrk(row + 12, "FB") != NULL);
	}
	free(out);
	free(json);
	free(text);
	pipeclient_close(c);
}

static void test_client_get_list(void)
{
	pipeclient *c = connect_lib();
	pipeclient_job *jobs, j;
	size_t n;
	uint64_t id;
	char *out, buf[64];
	pt_json v;

	CHECK_LIB(pipeclient_submit_file(c, job_json, &id));
	CU_ASSERT_EQUAL(wait_final(c, id, NULL), PIPECLIENT_SUCCEEDED);
	CHECK_LIB(pipeclient_get(c, id, &j));
	CU_ASSERT_EQUAL(j.id, id);
	CU_ASSERT_EQUAL(j.state, PIPECLIENT_SUCCEEDED);
	CU_ASSERT_EQUAL(j.steps, STEPS);
	CU_ASSERT(j.has_last);
	CU_ASSERT_EQUAL(j.last.step, STEPS);
	CU_ASSERT_EQUAL(j.last.n_stages, 4);
	CU_ASSERT(j.finished_unix >= j.started_unix && j.started_unix >= j.submitted_unix);
	CU_ASSERT(j.submitted_unix > 1.6e9);
	CU_ASSERT(j.spec != NULL && j.spec_len > 0);
	pipeclient_job_fini(&j);

	CHECK_LIB(pipeclient_list(c, &jobs, &n));
	CU_ASSERT(n >= 1);
	bool found = false;
	for (size_t i = 0; i < n; i++) {
		found |= jobs[i].id == id;
		if (i)
			CU_ASSERT(jobs[i].id > jobs[i - 1].id); /* oldest first */
		CU_ASSERT_PTR_NULL(jobs[i].spec);
	}
	CU_ASSERT(found);
	pipeclient_jobs_free(jobs, n);

	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "status", buf, NULL), CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_EQUAL(jint(&v, "id"), (int64_t)id);
	CU_ASSERT_STRING_EQUAL(jstr(&v, "state"), "Succeeded");
	CU_ASSERT_EQUAL(jint(pt_json_get(&v, "last"), "step"), STEPS);
	CU_ASSERT(jnum(pt_json_get(&v, "last"), "eval_accuracy") > 0.5);
	pt_json_fini(&v);
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "Succeeded"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "accuracy"));
	free(out);
	check_status_stages(c, id);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "list", NULL), CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT(pt_json_get(&v, "jobs") && pt_json_get(&v, "jobs")->len >= 1);
	pt_json_fini(&v);
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "list", NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "client-test"));
	free(out);
	pipeclient_close(c);
}

/* A job name with control characters (newline, ESC sequences, C1 CSI, a
 * bidi override, BEL) reaches the terminal escaped in `list` and `status`,
 * and as \u escapes in --json, which parse back to the same bytes. */
static void test_client_names_escaped(void)
{
	/* The name as JSON in the job file, as the server stores it, and as the
	 * CLI must print it. */
	static const char json_name[] =
	    "evil\\n\\u001b[2J\\u001b[31mred\\tx\\\\y\\u009b\\u202eend\\u0007";
	static const char raw_name[] = "evil\n\x1b[2J\x1b[31mred\tx\\y\xc2\x9b\xe2\x80\xae"
	                               "end\x07";
	static const char shown[] = "evil\\n\\x1b[2J\\x1b[31mred\\tx\\\\y\\u009b\\u202eend\\x07";
	pipeclient *c = connect_lib();
	pipeclient_job *jobs;
	size_t n;
	uint64_t id;
	char *out, buf[64], want[512], step[32], loss[16];
	pt_json v;
	bool found = false;

	write_job(tpath("evil.json"), json_name, STEPS, false, "digits_x.npy", "digits_y.npy");
	CHECK_LIB(pipeclient_submit_file(c, tpath("evil.json"), &id));
	CHECK_LIB(pipeclient_cancel(c, id, NULL));
	wait_final(c, id, NULL);
	CHECK_LIB(pipeclient_list(c, &jobs, &n));
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].id != id)
			continue;
		found = true;
		CU_ASSERT_STRING_EQUAL(jobs[i].name, raw_name);
		snprintf(step, sizeof(step), "%" PRId64 "/%" PRId64, jobs[i].step, jobs[i].steps);
		if (jobs[i].has_last)
			snprintf(loss, sizeof(loss), "%.4f", jobs[i].last.loss);
		else
			snprintf(loss, sizeof(loss), "-");
		snprintf(want, sizeof(want), "\n%-6" PRIu64 " %-12s %-13s %-10s %s\n", id,
		         pipeclient_state_name(jobs[i].state), step, loss, shown);
	}
	pipeclient_jobs_free(jobs, n);
	CU_ASSERT_FATAL(found);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "list", NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	CU_ASSERT_PTR_NULL(strchr(out, '\x1b'));
	CU_ASSERT_PTR_NULL(strstr(out, "\xc2\x9b"));
	free(out);
	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	/* Cancelled: exit 5, as watch. */
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_FAILED);
	snprintf(want, sizeof(want), "job %" PRIu64 " %s: Cancelled\n", id, shown);
	CU_ASSERT_EQUAL(strncmp(out, want, strlen(want)), 0);
	CU_ASSERT_PTR_NULL(strchr(out, '\x1b'));
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "status", buf, NULL),
	                CLI_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "\"name\":\"evil\\n\\u001b[2J\\u001b[31mred\\tx\\\\y"
	                                   "\\u009b\\u202eend\\u0007\""));
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "name"), raw_name);
	pt_json_fini(&v);
	free(out);
	pipeclient_close(c);
}

/* Requests the server refuses: exit code 4 and the server's code. */
/* pipeclient plan prices every schedule at every stage count asked (the
 * server measures the layers and simulates the orders): fastest first, each
 * with its partition and memory per stage (interleaved: of 2p chunks, where
 * they fit the 5 layers: p = 1, 2); a count the model cannot take is refused
 * naming the field; options outside plan are usage errors. */
static void test_client_plan(void)
{
	char *out, *err;
	pt_json v;
	const pt_json *plans;
	int per[4] = {0, 0, 0, 0};
	double last = 0;

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "plan", job_json, "--stages",
	                        "1,2,4", "--microbatches", "4", NULL),
	                CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	plans = pt_json_get(&v, "plans");
	CU_ASSERT_FATAL(plans != NULL && plans->type == PT_JSON_ARRAY);
	CU_ASSERT_EQUAL(plans->len, 11);
	for (size_t i = 0; i < plans->len; i++) {
		const pt_json *p = &plans->items[i], *b = pt_json_get(p, "boundaries");
		const pt_json *m = pt_json_get(p, "stage_bytes");
		const char *sc = jstr(p, "schedule");
		int64_t st = jint(p, "stages"), vs = jint(p, "virtual_stages");
		double step = jnum(p, "step_seconds"), bub = jnum(p, "bubble");
		bool il = strcmp(sc, "interleaved") == 0;
		per[strcmp(sc, "gpipe") == 0 ? 0 : strcmp(sc, "1f1b") == 0 ? 1 : il ? 3 : 2]++;
		CU_ASSERT(strcmp(sc, "gpipe") == 0 || strcmp(sc, "1f1b") == 0 ||
		          strcmp(sc, "zb-h1") == 0 || il);
		CU_ASSERT(st == 1 || st == 2 || st == (il ? 2 : 4));
		CU_ASSERT_EQUAL(vs, il ? 2 : 1);
		st *= vs; /* the partition and memory count chunks */
		CU_ASSERT_EQUAL(jint(p, "microbatches"), 4);
		CU_ASSERT(step > 0 && step >= last); /* fastest first */
		last = step;
		CU_ASSERT(bub >= 0 && bub < 1);
		CU_ASSERT(jnum(p, "samples_per_second") > 0);
		CU_ASSERT_FATAL(b != NULL && b->type == PT_JSON_ARRAY && m != NULL);
		CU_ASSERT_EQUAL(b->len, (size_t)st + 1);
		CU_ASSERT(b->items[0].i == 0 && b->items[b->len - 1].i == 5);
		CU_ASSERT_EQUAL(m->len, (size_t)st);
		for (size_t k = 0; k < m->len; k++)
			CU_ASSERT(m->items[k].d > 0);
	}
	CU_ASSERT(per[0] == 3 && per[1] == 3 && per[2] == 3 && per[3] == 2);
	pt_json_fini(&v);
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "plan", job_json, NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "SCHEDULE    STAGES MICROBATCHES"));
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "zb-h1"));
	free(out);
	CU_ASSERT_EQUAL(
	    run_cli_err(&out, &err, "--server", srv.url, "plan", job_json, "--stages", "9", NULL),
	    CLI_REJECTED);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "stages: 9"));
	free(out);
	free(err);
	CU_ASSERT_EQUAL(run_cli(NULL, "plan", job_json, "--stages", "0", NULL), CLI_USAGE);
	CU_ASSERT_EQUAL(run_cli(NULL, "status", "1", "--stages", "2", NULL), CLI_USAGE);
}

static int plan_rc = -1;

/* long_plan plans the big job, again while the test's short plans hold the
 * planner (Unavailable), and leaves the last exit status in plan_rc. */
static void *long_plan(void *arg)
{
	int rc = CLI_CONNECT;
	for (int i = 0; i < 100 && rc == CLI_CONNECT; i++) {
		if (i > 0)
			usleep(20000);
		rc = run_cli(NULL, "--server", srv.url, "plan", (const char *)arg, "--stages",
		             "1,2,4,8", "--microbatches", "1,2,4,8", NULL);
	}
	__atomic_store_n(&plan_rc, rc, __ATOMIC_RELEASE);
	return NULL;
}

/* One plan at a time: while a long plan measures its layers, another is
 * answered at once with Unavailable (exit 3), not queued on the API's
 * worker threads; the long one completes. */
static void test_client_plan_busy(void)
{
	const char *path = tpath("bigplan.json");
	char text[8192];
	size_t at = 0;
	bool busy = false;
	pthread_t th;
	FILE *f;

	at += (size_t)snprintf(text + at, sizeof(text) - at,
	                       "{ \"name\": \"bigplan\", \"model\": [ { \"kind\": \"Linear\", "
	                       "\"in_features\": 64, \"out_features\": 1024 },");
	for (int i = 0; i < 20; i++)
		at += (size_t)snprintf(text + at, sizeof(text) - at,
		                       " { \"kind\": \"Linear\", \"in_features\": 1024, "
		                       "\"out_features\": 1024 }, { \"kind\": \"ReLU\" },");
	snprintf(text + at, sizeof(text) - at,
	         " { \"kind\": \"Linear\", \"in_features\": 1024, \"out_features\": 10 } ],"
	         " \"data\": { \"format\": \"Npy\", \"features\": \"digits_x.npy\","
	         " \"labels\": \"digits_y.npy\" },"
	         " \"optimizer\": { \"lr\": 0.01 }, \"batch_size\": 256, \"steps\": 1 }");
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(text, f);
	fclose(f);
	plan_rc = -1;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, long_plan, (void *)path), 0);
	/* Each short plan waits first, so the long one (retrying every 20 ms)
	 * gets the planner between them. */
	for (int i = 0; i < 100 && !busy && __atomic_load_n(&plan_rc, __ATOMIC_ACQUIRE) < 0; i++) {
		char *out = NULL, *err = NULL;
		int rc;
		usleep(200000);
		rc = run_cli_err(&out, &err, "--server", srv.url, "plan", job_json, "--stages", "1",
		                 NULL);
		busy = rc == CLI_CONNECT && err != NULL &&
		       strstr(err, "another plan is running; try again when it ends") != NULL;
		free(out);
		free(err);
	}
	pthread_join(th, NULL);
	CU_ASSERT_TRUE(busy);
	CU_ASSERT_EQUAL(plan_rc, CLI_OK);
	unlink(path);
}

static void test_client_rejected(void)
{
	pipeclient *c = connect_lib();
	pipeclient_job j;
	uint64_t id;
	char *out;
	pt_json v;

	CHECK_LIB_ERR(pipeclient_submit_file(c, job_bad, &id), PIPECLIENT_ERR_SERVER_INVALID_JOB);
	CU_ASSERT_PTR_NOT_NULL(strstr(pipeclient_last_error(), "in_features"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pipeclient_last_error(), "InvalidJob"));
	CHECK_LIB_ERR(pipeclient_get(c, 987654321, &j), PIPECLIENT_ERR_SERVER_NOT_FOUND);
	CU_ASSERT_EQUAL(j.id, 0); /* zeroed */
	/* Local problems are not the server's: a missing file, not-a-job bytes. */
	CHECK_LIB_ERR(pipeclient_submit_file(c, tpath("no-such-job.json"), &id), PIPECLIENT_ERR_IO);
	CHECK_LIB_ERR(pipeclient_submit_json(c, "{\"name\": 1}", 11, &id), PIPECLIENT_ERR_FORMAT);
	CHECK_LIB_ERR(pipeclient_submit_spec(c, "\x0c\0\0\0garbage!", 12, &id),
	              PIPECLIENT_ERR_FORMAT);
	pipeclient_close(c);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "submit", job_bad, NULL),
	                CLI_REJECTED);
	CU_ASSERT_FATAL(parse_line(out, -1, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "error"), "PIPECLIENT_ERR_SERVER_INVALID_JOB");
	CU_ASSERT_PTR_NOT_NULL(strstr(jstr(&v, "message"), "in_features"));
	pt_json_fini(&v);
	free(out);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", srv.url, "status", "987654321", NULL),
	                CLI_REJECTED);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", srv.url, "cancel", "987654321", NULL),
	                CLI_REJECTED);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", srv.url, "checkpoint", "987654321", "-o",
	                        tpath("none.safetensors"), NULL),
	                CLI_REJECTED);
	/* A file that is not there is the client's error (1), not the server's. */
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", srv.url, "submit", tpath("missing.json"), NULL),
	                CLI_ERROR);
}

/* A job file with a JSON syntax error: stderr names the path once, with line
 * and column, and only the JSON error (not the binary verifier's too). */
static void test_client_job_file_syntax_error(void)
{
	pipeclient *c = connect_lib();
	char bad[PATH_MAX], errf[PATH_MAX], cmd[4 * PATH_MAX], want[2 * PATH_MAX];
	char *err;
	uint64_t id;
	FILE *f;
	int rc;

	snprintf(bad, sizeof(bad), "%s", tpath("syntax.json"));
	snprintf(errf, sizeof(errf), "%s", tpath("syntax.err"));
	f = fopen(bad, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs("{\n  name: \"x\", // flatc's JSON: comments, bare keys\n    # not a comment\n}\n",
	      f);
	fclose(f);
	snprintf(want, sizeof(want), "%s:3:5: unexpected character '#'", bad);

	CHECK_LIB_ERR(pipeclient_submit_file(c, bad, &id), PIPECLIENT_ERR_FORMAT);
	CU_ASSERT_STRING_EQUAL(pipeclient_last_error(), want);
	pipeclient_close(c);

	snprintf(cmd, sizeof(cmd), "'%s' --server '%s' submit '%s' 2>'%s'", cli_bin, srv.url, bad,
	         errf);
	rc = system(cmd);
	CU_ASSERT(WIFEXITED(rc) && WEXITSTATUS(rc) == CLI_ERROR);
	err = read_text(errf, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(err);
	fprintf(stderr, "%s", err);
	snprintf(want, sizeof(want), "pipeclient: %s:3:5: unexpected character '#'\n", bad);
	CU_ASSERT_STRING_EQUAL(err, want);
	free(err);
}

/* Cancel a long job while it runs; watch then reports it ended (exit 5). */
static void test_client_cancel(void)
{
	pipeclient *c = connect_lib();
	pipeclient_job_state st;
	pipeclient_job j;
	seen s = {.last_step = -1, .ordered = true, .stop_after = 2};
	char *out, buf[64];
	uint64_t id;
	pt_json v;

	CHECK_LIB(pipeclient_submit_file(c, job_long, &id));
	/* Wait until it trains: two metric points. */
	CU_ASSERT_EQUAL(pipeclient_watch(c, id, -1, 500, collect, &s, NULL),
	                PIPECLIENT_ERR_STOPPED);
	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "cancel", buf, NULL), CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_EQUAL(jint(&v, "job"), (int64_t)id);
	pt_json_fini(&v);
	free(out);

	CU_ASSERT_EQUAL(wait_final(c, id, NULL), PIPECLIENT_CANCELLED);
	CHECK_LIB(pipeclient_get(c, id, &j));
	CU_ASSERT_EQUAL(j.state, PIPECLIENT_CANCELLED);
	CU_ASSERT(j.step >= 2 && j.step < LONG_JOB);
	pipeclient_job_fini(&j);
	/* A finished job cannot be cancelled again. */
	CHECK_LIB_ERR(pipeclient_cancel(c, id, &st), PIPECLIENT_ERR_SERVER_CONFLICT);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", srv.url, "cancel", buf, NULL), CLI_REJECTED);
	/* watch and status of a cancelled job: the same "job failed" exit code. */
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "watch", buf, NULL), CLI_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "Cancelled"));
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, ": Cancelled\n"));
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "status", buf, NULL),
	                CLI_FAILED);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "state"), "Cancelled");
	pt_json_fini(&v);
	free(out);
	pipeclient_close(c);
}

/* A job that passes validation at submit time and fails when it runs: its
 * data file disappears while it waits behind a long job. */
static void test_client_failed_job(void)
{
	pipeclient *c = connect_lib();
	seen s = {.last_step = -1, .ordered = true, .stop_after = 1};
	uint64_t blocker, id;
	char *out, buf[64];
	pipeclient_job j;
	pt_json v;

	CHECK_LIB(pipeclient_submit_file(c, job_long, &blocker));
	CU_ASSERT_EQUAL(pipeclient_watch(c, blocker, -1, 500, collect, &s, NULL),
	                PIPECLIENT_ERR_STOPPED);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "submit", job_fail, NULL),
	                CLI_OK);
	id = submitted_id(out);
	free(out);
	CHECK_LIB(pipeclient_get(c, id, &j));
	if (j.state != PIPECLIENT_QUEUED) {
		/* The server runs jobs side by side: the file is already read. */
		fprintf(stderr, "SKIP: job %" PRIu64 " did not queue (%s); no failed-job check\n",
		        id, pipeclient_state_name(j.state));
		pipeclient_job_fini(&j);
		pipeclient_cancel(c, blocker, NULL);
		wait_final(c, id, NULL);
		wait_final(c, blocker, NULL);
		pipeclient_close(c);
		return;
	}
	pipeclient_job_fini(&j);
	CU_ASSERT_EQUAL(unlink(tpath("fail_x.npy")), 0);
	CHECK_LIB(pipeclient_cancel(c, blocker, NULL));

	snprintf(buf, sizeof(buf), "%" PRIu64, id);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "watch", buf, NULL),
	                CLI_FAILED);
	CU_ASSERT_FATAL(parse_line(out, -1, &v));
	CU_ASSERT_STRING_EQUAL(jstr(&v, "state"), "Failed");
	CU_ASSERT_PTR_NOT_NULL(strstr(jstr(&v, "message"), "fail_x.npy"));
	pt_json_fini(&v);
	free(out);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, ": Failed\n"));
	free(out);
	CU_ASSERT_EQUAL(wait_final(c, blocker, NULL), PIPECLIENT_CANCELLED);
	pipeclient_close(c);
}

/* state_of returns job's state as the server reports it. */
static pipeclient_job_state state_of(pipeclient *c, uint64_t id)
{
	pipeclient_job j;
	pipeclient_job_state st;

	CHECK_LIB(pipeclient_get(c, id, &j));
	st = j.state;
	pipeclient_job_fini(&j);
	return st;
}

/* interrupt sends p SIGINT and checks that it says job id keeps running and
 * how to cancel it (with --server url when the command named one) and exits
 * 130 at once. */
static void interrupt(cli_proc *p, uint64_t id, const char *url)
{
	char *out, *err, want[512];
	double t0 = now_s();

	CU_ASSERT_EQUAL(kill(p->pid, SIGINT), 0);
	CU_ASSERT_EQUAL(cli_end(p, &out, &err), 130);
	CU_ASSERT(now_s() - t0 < 2); /* not at the end of a long poll or a step */
	snprintf(want, sizeof(want),
	         "pipeclient: interrupted: job %" PRIu64 " keeps running on the server; cancel it "
	         "with: pipeclient %s%s%scancel %" PRIu64 "\n",
	         id, url ? "--server " : "", url ? url : "", url ? " " : "", id);
	CU_ASSERT_STRING_EQUAL(err, want);
	free(out);
	free(err);
}

/* Ctrl-C during submit --follow and watch: exit 130, a message that the job
 * keeps running and how to cancel it; the job does keep running (or queued). */
static void test_client_interrupt(void)
{
	pipeclient *c = connect_lib();
	uint64_t a, b;
	char buf[32], bufb[32];
	cli_proc p;
	pt_json v;

	/* submit --follow --json: the last line says so too. */
	cli_start(&p, "--server", srv.url, "--json", "submit", job_long, "--follow", NULL);
	CU_ASSERT_FATAL(cli_wait_for(&p, "\"type\":\"metric\"", 60));
	a = submitted_id(p.buf);
	CU_ASSERT_EQUAL(kill(p.pid, SIGINT), 0);
	{
		char *out, *err, want[512];
		CU_ASSERT_EQUAL(cli_end(&p, &out, &err), 130);
		snprintf(want, sizeof(want),
		         "pipeclient: interrupted: job %" PRIu64 " keeps running on the server; "
		         "cancel it with: pipeclient --server %s cancel %" PRIu64 "\n",
		         a, srv.url, a);
		CU_ASSERT_STRING_EQUAL(err, want);
		CU_ASSERT_FATAL(parse_line(out, -1, &v));
		CU_ASSERT_STRING_EQUAL(jstr(&v, "type"), "interrupted");
		CU_ASSERT_EQUAL(jint(&v, "job"), (int64_t)a);
		pt_json_fini(&v);
		free(out);
		free(err);
	}
	CU_ASSERT_EQUAL(state_of(c, a), PIPECLIENT_RUNNING);

	/* watch of a job that sends no points (queued behind a): the wait is in
	 * a long poll, and Ctrl-C still ends it at once. */
	CHECK_LIB(pipeclient_submit_file(c, job_long, &b));
	snprintf(bufb, sizeof(bufb), "%" PRIu64, b);
	setenv("PIPETRAIN_SERVER", srv.url, 1); /* the hint then names no server */
	cli_start(&p, "watch", bufb, NULL);
	unsetenv("PIPETRAIN_SERVER");
	snprintf(buf, sizeof(buf), "watching job %" PRIu64 " ", b);
	CU_ASSERT_FATAL(cli_wait_for(&p, buf, 30));
	usleep(300 * 1000); /* into the long poll */
	interrupt(&p, b, NULL);
	CU_ASSERT_FALSE(pipeclient_state_is_final(state_of(c, b)));

	/* watch of the running job, while its loss lines come. */
	snprintf(buf, sizeof(buf), "%" PRIu64, a);
	cli_start(&p, "--server", srv.url, "watch", buf, NULL);
	CU_ASSERT_FATAL(cli_wait_for(&p, "\nstep ", 30));
	interrupt(&p, a, srv.url);
	CU_ASSERT_EQUAL(state_of(c, a), PIPECLIENT_RUNNING);

	CHECK_LIB(pipeclient_cancel(c, b, NULL));
	CHECK_LIB(pipeclient_cancel(c, a, NULL));
	CU_ASSERT_EQUAL(wait_final(c, a, NULL), PIPECLIENT_CANCELLED);
	CU_ASSERT_EQUAL(wait_final(c, b, NULL), PIPECLIENT_CANCELLED);
	pipeclient_close(c);
}

/* A server that shuts down (SIGTERM) while pipeclient watches a running and
 * a queued job: both watches end at once with exit 3 (server unavailable). */
/* write_job_priority writes the short job with "priority": prio. */
static void write_job_priority(const char *path, const char *name, int prio)
{
	char *text;
	FILE *f;
	write_job(path, name, STEPS, false, "digits_x.npy", "digits_y.npy");
	text = read_text(path, NULL);
	CU_ASSERT_FATAL(text != NULL && text[0] == '{');
	f = fopen(path, "w");
	CU_ASSERT_FATAL(f != NULL);
	fprintf(f, "{ \"priority\": %d,%s", prio, text + 1);
	fclose(f);
	free(text);
}

/* Priorities: with the one runner busy, a later priority-5 job runs before
 * an earlier priority-0 one; each queued job says why it waits (status,
 * `pipeclient queue`), and the queue lists them in the order they run. */
static void test_client_priority_queue(void)
{
	pipeclient *c = connect_lib();
	pipeclient_job_state st;
	pipeclient_job jl, j0, j5;
	uint64_t l, p0, p5;
	char want[256], buf[32], *out;
	const char *f0 = tpath("prio0.json"), *f5 = tpath("prio5.json");
	seen s = {.last_step = -1, .ordered = true, .stop_after = 1};

	write_job_priority(f0, "prio-0", 0);
	write_job_priority(f5, "prio-5", 5);
	CHECK_LIB(pipeclient_submit_file(c, job_long, &l));
	CU_ASSERT_EQUAL(pipeclient_watch(c, l, -1, 500, collect, &s, NULL), PIPECLIENT_ERR_STOPPED);
	CHECK_LIB(pipeclient_submit_file(c, f0, &p0));
	CHECK_LIB(pipeclient_submit_file(c, f5, &p5));
	CHECK_LIB(pipeclient_get(c, p0, &j0));
	CHECK_LIB(pipeclient_get(c, p5, &j5));
	CU_ASSERT_EQUAL(j0.state, PIPECLIENT_QUEUED);
	snprintf(want, sizeof(want),
	         "queued: place 2 on cpu; 1 of 1 runners busy (job %" PRIu64
	         "); behind job %" PRIu64 " (priority 5)",
	         l, p5);
	CU_ASSERT_STRING_EQUAL(j0.message, want);
	snprintf(want, sizeof(want),
	         "queued: place 1 on cpu; 1 of 1 runners busy (job %" PRIu64 ")", l);
	CU_ASSERT_STRING_EQUAL(j5.message, want);
	pipeclient_job_fini(&j0);
	pipeclient_job_fini(&j5);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "queue", NULL), CLI_OK);
	snprintf(want, sizeof(want), "\n%-6" PRIu64 " %-20s queued: place 1 on cpu; ", p5,
	         "prio-5");
	CU_ASSERT_PTR_NOT_NULL(strstr(out, want));
	CU_ASSERT(strstr(out, want) != NULL && strstr(out, "prio-0") > strstr(out, want));
	free(out);
	snprintf(buf, sizeof(buf), "%" PRIu64, p0);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "status", buf, NULL), CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, "  message: queued: place 2 on cpu; "));
	free(out);
	CHECK_LIB(pipeclient_cancel(c, l, &st));
	CU_ASSERT_EQUAL(wait_final(c, p0, NULL), PIPECLIENT_SUCCEEDED);
	CU_ASSERT_EQUAL(wait_final(c, p5, NULL), PIPECLIENT_SUCCEEDED);
	CHECK_LIB(pipeclient_get(c, l, &jl));
	CHECK_LIB(pipeclient_get(c, p0, &j0));
	CHECK_LIB(pipeclient_get(c, p5, &j5));
	CU_ASSERT(j5.started_unix >= jl.finished_unix);
	CU_ASSERT(j0.started_unix >= j5.finished_unix); /* the later, higher one ran first */
	pipeclient_job_fini(&jl);
	pipeclient_job_fini(&j0);
	pipeclient_job_fini(&j5);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "queue", NULL), CLI_OK);
	CU_ASSERT_STRING_EQUAL(out, "no job is waiting\n");
	free(out);
	pipeclient_close(c);
}

/* The SHA-256 of job's newest checkpoint (its last step's weights). */
static void newest_sha(pipeclient *c, uint64_t job, char out[65])
{
	pipeclient_checkpoint *ck = NULL;
	size_t n = 0;
	out[0] = '\0';
	CHECK_LIB(pipeclient_list_checkpoints(c, job, &ck, &n));
	if (n > 0)
		snprintf(out, 65, "%s", ck[n - 1].sha256);
	free(ck);
}

/* --max-jobs 2: two jobs submitted together run at the same time (each
 * starts before the other ends), each on half the cores, and each ends with
 * the weights the same job gives alone on that server, bitwise (the SHA-256
 * of its final checkpoint); a third waits for a free runner. */
static void test_client_max_jobs_concurrent(void)
{
	const char *extra[] = {"--max-jobs", "2", NULL};
	pipeclient_options o = {.timeout_ms = 30000};
	server two = {.pid = -1};
	pipeclient *c = NULL;
	pipeclient_job ja, jb, jc;
	uint64_t a, b, solo, third;
	char sa[65], sb[65], ss[65];
	const char *path = tpath("maxjobs.json");

	/* The runners are bounded: 1 to 64 per device, else exit 2 naming it. */
	for (int k = 0; k < 2; k++) {
		char cmd[2 * PATH_MAX], *out;
		int st;
		snprintf(cmd, sizeof(cmd), "'%s' --max-jobs %s --data-dir '%s' > '%s' 2>&1",
		         server_bin, k ? "0" : "65", tpath("maxjobs-bad"),
		         tpath("maxjobs-bad.out"));
		st = system(cmd);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
		out = read_text(tpath("maxjobs-bad.out"), NULL);
		CU_ASSERT_FATAL(out != NULL);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "max_jobs (from flags): "));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "is not an integer in [1, 64]"));
		free(out);
	}
	write_job(path, "max-jobs", 150, false, "digits_x.npy", "digits_y.npy");
	CU_ASSERT_FATAL(server_start(&two, "maxjobs", NULL, extra));
	o.url = two.url;
	CHECK_LIB(pipeclient_connect(&c, &o));
	CHECK_LIB(pipeclient_submit_file(c, path, &a));
	CHECK_LIB(pipeclient_submit_file(c, path, &b));
	CHECK_LIB(pipeclient_submit_file(c, path, &third));
	CU_ASSERT_EQUAL(wait_final(c, a, NULL), PIPECLIENT_SUCCEEDED);
	CU_ASSERT_EQUAL(wait_final(c, b, NULL), PIPECLIENT_SUCCEEDED);
	CU_ASSERT_EQUAL(wait_final(c, third, NULL), PIPECLIENT_SUCCEEDED);
	CHECK_LIB(pipeclient_get(c, a, &ja));
	CHECK_LIB(pipeclient_get(c, b, &jb));
	CHECK_LIB(pipeclient_get(c, third, &jc));
	printf("\n    a %.3f-%.3f, b %.3f-%.3f, third %.3f-%.3f", 0.0,
	       ja.finished_unix - ja.started_unix, jb.started_unix - ja.started_unix,
	       jb.finished_unix - ja.started_unix, jc.started_unix - ja.started_unix,
	       jc.finished_unix - ja.started_unix);
	CU_ASSERT(ja.started_unix < jb.finished_unix && jb.started_unix < ja.finished_unix);
	/* Two runners: the third starts when one of the first two has ended. */
	CU_ASSERT(jc.started_unix >=
	          (ja.finished_unix < jb.finished_unix ? ja.finished_unix : jb.finished_unix));
	pipeclient_job_fini(&ja);
	pipeclient_job_fini(&jb);
	pipeclient_job_fini(&jc);
	newest_sha(c, a, sa);
	newest_sha(c, b, sb);
	CHECK_LIB(pipeclient_submit_file(c, path, &solo));
	CU_ASSERT_EQUAL(wait_final(c, solo, NULL), PIPECLIENT_SUCCEEDED);
	newest_sha(c, solo, ss);
	CU_ASSERT(sa[0] != '\0');
	CU_ASSERT_STRING_EQUAL(sa, ss);
	CU_ASSERT_STRING_EQUAL(sb, ss);
	pipeclient_close(c);
	CU_ASSERT(server_stop(&two));
}

static void test_client_watch_server_stops(void)
{
	pipeclient_options o = {.timeout_ms = 30000};
	seen s = {.last_step = -1, .ordered = true, .stop_after = 2};
	server two = {.pid = -1};
	pipeclient *c = NULL;
	uint64_t a, b;
	char ida[32], idb[32], buf[64], *out, *err;
	cli_proc pa, pb;
	double t0;

	CU_ASSERT_FATAL(server_start(&two, "stops", NULL, NULL));
	o.url = two.url;
	CHECK_LIB(pipeclient_connect(&c, &o));
	CHECK_LIB(pipeclient_submit_file(c, job_long, &a));
	CU_ASSERT_EQUAL(pipeclient_watch(c, a, -1, 500, collect, &s, NULL), PIPECLIENT_ERR_STOPPED);
	CHECK_LIB(pipeclient_submit_file(c, job_long, &b));
	pipeclient_close(c);
	snprintf(ida, sizeof(ida), "%" PRIu64, a);
	snprintf(idb, sizeof(idb), "%" PRIu64, b);
	/* --timeout 20: a watch that waited for its request to time out would
	 * take over 20 s; the server answers every parked poll as it drains. */
	cli_start(&pa, "--server", two.url, "--timeout", "20", "watch", ida, NULL);
	cli_start(&pb, "--server", two.url, "--timeout", "20", "watch", idb, NULL);
	CU_ASSERT_FATAL(cli_wait_for(&pa, "\nstep ", 30));
	snprintf(buf, sizeof(buf), "watching job %s ", idb);
	CU_ASSERT_FATAL(cli_wait_for(&pb, buf, 30));
	usleep(300 * 1000); /* into the long poll */
	t0 = now_s();
	CU_ASSERT(server_stop(&two));
	CU_ASSERT_EQUAL(cli_end(&pa, &out, &err), CLI_CONNECT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "server is shutting down"));
	free(out);
	free(err);
	CU_ASSERT_EQUAL(cli_end(&pb, &out, &err), CLI_CONNECT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "server is shutting down"));
	free(out);
	free(err);
	CU_ASSERT(now_s() - t0 < 10);
	/* Nobody there any more: still exit 3. */
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", two.url, "watch", ida, NULL), CLI_CONNECT);
}

static bool stop_after_first(void *ctx, uint64_t done, uint64_t total)
{
	int *calls = ctx;
	(void)total;
	(*calls)++;
	return done < CHUNK; /* stop once one range is in */
}

static bool count_progress(void *ctx, uint64_t done, uint64_t total)
{
	uint64_t *last = ctx;
	CU_ASSERT(done > *last && done <= total);
	*last = done;
	return true;
}

/* Downloads: interrupted and resumed (library, then CLI), checksums, --step,
 * a stale partial file. */
static void test_client_checkpoint(void)
{
	pipeclient *c = connect_lib();
	pipeclient_checkpoint *cks, ck;
	size_t n;
	uint64_t id, last = 0;
	int calls = 0;
	char hex[PT_SHA256_HEX], buf[64], stepbuf[32], *out;
	const char *dst = tpath("final.safetensors"), *part = tpath("final.safetensors.part");
	const char *dst2 = tpath("early.safetensors"), *dst3 = tpath("stale.safetensors");
	pt_json v;
	FILE *f;

	CHECK_LIB(pipeclient_submit_file(c, job_json, &id));
	CU_ASSERT_EQUAL(wait_final(c, id, NULL), PIPECLIENT_SUCCEEDED);
	CHECK_LIB(pipeclient_list_checkpoints(c, id, &cks, &n));
	CU_ASSERT_FATAL(n >= 2);
	CU_ASSERT_EQUAL(cks[n - 1].step, STEPS);
	for (size_t i = 1; i < n; i++)
		CU_ASSERT(cks[i].step > cks[i - 1].step);
	CU_ASSERT_FATAL(cks[n - 1].size > 2 * CHUNK); /* so that halfway is a thing */
	snprintf(buf, sizeof(buf), "%" PRIu64, id);

	/* Interrupted after the first range: the .part stays, the file is absent. */
	CU_ASSERT_EQUAL(pipeclient_fetch_checkpoint(c, id, -1, dst, stop_after_first, &calls, &ck),
	                PIPECLIENT_ERR_STOPPED);
	CU_ASSERT_EQUAL(calls, 1);
	CU_ASSERT_EQUAL(file_size(part), (off_t)CHUNK);
	CU_ASSERT_EQUAL(file_size(dst), -1);
	/* The CLI resumes it and the checksum matches the server's list. */
	CU_ASSERT_EQUAL(
	    run_cli(&out, "--server", srv.url, "--json", "checkpoint", buf, "-o", dst, NULL),
	    CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_EQUAL(jint(&v, "step"), STEPS);
	CU_ASSERT_EQUAL(jint(&v, "size"), (int64_t)cks[n - 1].size);
	CU_ASSERT_STRING_EQUAL(jstr(&v, "sha256"), cks[n - 1].sha256);
	pt_json_fini(&v);
	free(out);
	CU_ASSERT_EQUAL(file_size(part), -1);
	CU_ASSERT_EQUAL(file_size(dst), (off_t)cks[n - 1].size);
	file_sha256(dst, hex);
	CU_ASSERT_STRING_EQUAL(hex, cks[n - 1].sha256);

	/* The library, whole, in small ranges, with progress; an earlier step. */
	CHECK_LIB(
	    pipeclient_fetch_checkpoint(c, id, cks[0].step, dst2, count_progress, &last, &ck));
	CU_ASSERT_EQUAL(ck.step, cks[0].step);
	CU_ASSERT_EQUAL(last, cks[0].size);
	file_sha256(dst2, hex);
	CU_ASSERT_STRING_EQUAL(hex, cks[0].sha256);
	CU_ASSERT_STRING_EQUAL(ck.sha256, cks[0].sha256);
	/* The CLI's --step. */
	snprintf(stepbuf, sizeof(stepbuf), "%" PRId64, cks[0].step);
	unlink(dst2);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "checkpoint", buf, "--step", stepbuf,
	                        "-o", dst2, NULL),
	                CLI_OK);
	CU_ASSERT_PTR_NOT_NULL(strstr(out, cks[0].sha256));
	free(out);
	file_sha256(dst2, hex);
	CU_ASSERT_STRING_EQUAL(hex, cks[0].sha256);

	/* A stale .part (other bytes) is detected and the download restarts. */
	f = fopen(tpath("stale.safetensors.part"), "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (int i = 0; i < 100000; i++)
		fputc(i * 7, f);
	fclose(f);
	CHECK_LIB(pipeclient_fetch_checkpoint(c, id, -1, dst3, NULL, NULL, &ck));
	file_sha256(dst3, hex);
	CU_ASSERT_STRING_EQUAL(hex, cks[n - 1].sha256);
	/* A .part longer than the file, too. */
	f = fopen(tpath("stale.safetensors.part"), "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (uint64_t i = 0; i < cks[n - 1].size + 4096; i++)
		fputc((int)i, f);
	fclose(f);
	CHECK_LIB(pipeclient_fetch_checkpoint(c, id, -1, dst3, NULL, NULL, &ck));
	file_sha256(dst3, hex);
	CU_ASSERT_STRING_EQUAL(hex, cks[n - 1].sha256);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", srv.url, "--json", "checkpoints", buf, NULL),
	                CLI_OK);
	CU_ASSERT_FATAL(parse_line(out, 0, &v));
	CU_ASSERT_EQUAL(pt_json_get(&v, "checkpoints")->len, n);
	pt_json_fini(&v);
	free(out);
	/* A step with no checkpoint. */
	CHECK_LIB_ERR(
	    pipeclient_fetch_checkpoint(c, id, 3, tpath("x.safetensors"), NULL, NULL, NULL),
	    PIPECLIENT_ERR_SERVER_NOT_FOUND);
	free(cks);
	pipeclient_close(c);
}

/* Several threads share one handle. */
typedef struct worker {
	pipeclient *c;
	uint64_t job;
	int ok;
} worker;

static void *hammer(void *arg)
{
	worker *w = arg;
	for (int i = 0; i < 25; i++) {
		pipeclient_server_info si;
		pipeclient_job j;
		if (pipeclient_info(w->c, &si) == PIPECLIENT_OK)
			w->ok++;
		if (pipeclient_get(w->c, w->job, &j) == PIPECLIENT_OK && j.id == w->job)
			w->ok++;
		pipeclient_job_fini(&j);
	}
	return NULL;
}

static void test_client_threads(void)
{
	pipeclient *c = connect_lib();
	pthread_t t[4];
	worker w[4];
	pipeclient_job *jobs;
	size_t n;

	CHECK_LIB(pipeclient_list(c, &jobs, &n));
	CU_ASSERT_FATAL(n > 0);
	for (int i = 0; i < 4; i++) {
		w[i] = (worker){.c = c, .job = jobs[0].id};
		pthread_create(&t[i], NULL, hammer, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CU_ASSERT_EQUAL(w[i].ok, 50);
	}
	pipeclient_jobs_free(jobs, n);
	pipeclient_close(c);
}

/* A server with an auth token refuses requests without it. */
static void test_client_auth(void)
{
	server s2 = {.pid = -1};
	pipeclient_options o = {.timeout_ms = 10000};
	pipeclient_server_info si;
	pipeclient *c;
	char *out;
	FILE *f = fopen(tpath("token"), "w");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(TOKEN "\n", f);
	fclose(f);
	const char *flags[] = {"--auth-token-file", tpath("token"), NULL};

	if (!server_start(&s2, "auth-data", NULL, flags)) {
		CU_FAIL("pipeserver --auth-token-file did not start");
		return;
	}
	o.url = s2.url;
	CHECK_LIB(pipeclient_connect(&c, &o));
	CHECK_LIB_ERR(pipeclient_info(c, &si), PIPECLIENT_ERR_SERVER_UNAUTHORIZED);
	pipeclient_close(c);
	o.token = "wrong";
	CHECK_LIB(pipeclient_connect(&c, &o));
	CHECK_LIB_ERR(pipeclient_info(c, &si), PIPECLIENT_ERR_SERVER_UNAUTHORIZED);
	pipeclient_close(c);
	o.token = TOKEN;
	CHECK_LIB(pipeclient_connect(&c, &o));
	CHECK_LIB(pipeclient_info(c, &si));
	pipeclient_close(c);

	CU_ASSERT_EQUAL(run_cli(NULL, "--server", s2.url, "list", NULL), CLI_REJECTED);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", s2.url, "--token", TOKEN, "list", NULL), CLI_OK);
	free(out);
	setenv("PIPETRAIN_TOKEN", TOKEN, 1);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", s2.url, "info", NULL), CLI_OK);
	unsetenv("PIPETRAIN_TOKEN");
	CU_ASSERT(server_stop(&s2));
}

/* tls+tcp://: a self-signed certificate made with openssl. */
static void test_client_tls(void)
{
	server s3 = {.pid = -1};
	pipeclient_options o = {.timeout_ms = 10000};
	pipeclient_server_info si;
	pipeclient *c = NULL;
	char cmd[4 * PATH_MAX], *out;
	const char *cert = tpath("cert.pem"), *key = tpath("key.pem");
	const char *flags[] = {"--tls-cert", cert, "--tls-key", key, NULL};

	if (!have_program("openssl")) {
		fprintf(stderr, "SKIP: openssl missing: no TLS test\n");
		return;
	}
	snprintf(cmd, sizeof(cmd),
	         "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -days 2 "
	         "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 "
	         ">/dev/null 2>&1",
	         key, cert);
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	if (!server_start(&s3, "tls-data", "tls+tcp://127.0.0.1:0", flags)) {
		CU_FAIL("pipeserver on tls+tcp:// did not start");
		return;
	}
	o.url = s3.url;
	o.tls_ca_file = cert;
	o.tls_server_name = "localhost";
	CHECK_LIB(pipeclient_connect(&c, &o));
	CHECK_LIB(pipeclient_info(c, &si));
	pipeclient_close(c);
	/* No CA: the server cannot be verified. */
	o.tls_ca_file = NULL;
	CU_ASSERT_NOT_EQUAL(pipeclient_connect(&c, &o), PIPECLIENT_OK);
	CU_ASSERT_PTR_NULL(c);
	/* TLS options on a plain URL are a usage error. */
	o.url = srv.url;
	o.tls_ca_file = cert;
	CHECK_LIB_ERR(pipeclient_connect(&c, &o), PIPECLIENT_ERR_INVALID);

	CU_ASSERT_EQUAL(run_cli(&out, "--server", s3.url, "--tls-ca", cert, "info", NULL), CLI_OK);
	free(out);
	CU_ASSERT_EQUAL(run_cli(NULL, "--server", s3.url, "info", NULL), CLI_CONNECT);
	CU_ASSERT_EQUAL(run_cli(&out, "--server", s3.url, "--insecure", "info", NULL), CLI_OK);
	free(out);
	CU_ASSERT(server_stop(&s3));
}

/* The Python client: flatc-generated code + python3-flatbuffers + nngcat. */
static void test_client_python(void)
{
	char cmd[4 * PATH_MAX], line[4096], *last = NULL;
	FILE *p;
	pt_json v;
	int status, metrics = 0;

	if (!have_program("flatc") || !have_program("nngcat") ||
	    system("/usr/bin/python3 -c 'import flatbuffers' >/dev/null 2>&1") != 0) {
		fprintf(stderr, "SKIP: the Python client needs flatc, nngcat (nng-utils) and "
		                "/usr/bin/python3 with python3-flatbuffers\n");
		return;
	}
	snprintf(cmd, sizeof(cmd), "sh %s/tests/client_py/gen.sh %s", PT_SOURCE_ROOT, tpath("py"));
	CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
	snprintf(cmd, sizeof(cmd),
	         "/usr/bin/python3 %s/tests/client_py/submit_watch.py --gen %s --server %s %s",
	         PT_SOURCE_ROOT, tpath("py"), srv.url, job_json);
	fprintf(stderr, "$ %s\n", cmd);
	p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	while (fgets(line, sizeof(line), p)) {
		if (strstr(line, "\"metric\""))
			metrics++;
		free(last);
		last = strdup(line);
	}
	status = pclose(p);
	CU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CU_ASSERT_EQUAL(metrics, STEPS);
	CU_ASSERT_FATAL(last != NULL && parse_line(last, 0, &v));
	fprintf(stderr, "python: %s", last);
	CU_ASSERT_STRING_EQUAL(jstr(&v, "type"), "summary");
	CU_ASSERT_STRING_EQUAL(jstr(&v, "state"), "Succeeded");
	CU_ASSERT_EQUAL(jint(&v, "points"), STEPS);
	CU_ASSERT(jnum(&v, "last_loss") < jnum(&v, "first_loss"));
	pt_json_fini(&v);
	free(last);
}

/* ------------------------------------------------------------------- main -- */

static bool setup(void)
{
	char self[PATH_MAX], cmd[4 * PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return false;
	self[n] = '\0';
	slash = strrchr(self, '/');
	*slash = '\0'; /* build/tests */
	slash = strrchr(self, '/');
	*slash = '\0'; /* build */
	snprintf(bindir, sizeof(bindir), "%s", self);
	snprintf(cli_bin, sizeof(cli_bin), "%s/client/pipeclient", bindir);
	snprintf(server_bin, sizeof(server_bin), "%s/server/pipeserver", bindir);

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/pt-client-XXXXXX");
	if (mkdtemp(tmpdir) == NULL)
		return false;
	snprintf(job_json, sizeof(job_json), "%s", tpath("job.json"));
	snprintf(job_bad, sizeof(job_bad), "%s", tpath("bad.json"));
	snprintf(job_long, sizeof(job_long), "%s", tpath("long.json"));
	snprintf(job_fail, sizeof(job_fail), "%s", tpath("fail.json"));
	/* The server's files root is tmpdir: the jobs name copies of the data
	 * there; the failing job's copies are removed by the test. */
	snprintf(cmd, sizeof(cmd),
	         "for f in digits_x digits_y; do cp %s/examples/data/$f.npy %s/$f.npy; done && "
	         "cp %s/digits_x.npy %s && cp %s/digits_y.npy %s && "
	         "cp %s/examples/data/text.u16 %s/text.u16",
	         PT_SOURCE_ROOT, tmpdir, tmpdir, tpath("fail_x.npy"), tmpdir, tpath("fail_y.npy"),
	         PT_SOURCE_ROOT, tmpdir);
	if (system(cmd) != 0)
		return false;
	write_job(job_json, "client-test", STEPS, false, "digits_x.npy", "digits_y.npy");
	write_job(job_bad, "client-bad", STEPS, true, "digits_x.npy", "digits_y.npy");
	write_job(job_long, "client-long", LONG_JOB, false, "digits_x.npy", "digits_y.npy");
	write_job(job_fail, "client-fail", STEPS, false, "fail_x.npy", "fail_y.npy");

	/* The same job as a FlatBuffers binary, named like JSON on purpose. */
	if (have_program("flatc")) {
		snprintf(cmd, sizeof(cmd), "flatc -b -o %s %s/schema/job.fbs %s", tmpdir,
		         PT_SOURCE_ROOT, job_json);
		if (system(cmd) == 0) {
			snprintf(job_bin, sizeof(job_bin), "%s", tpath("binary-job.json"));
			if (rename(tpath("job.job"), job_bin) != 0)
				job_bin[0] = '\0';
		}
	}
	return true;
}

int main(void)
{
	static const pt_test_case tests[] = {
	    {"test_client_usage_errors", test_client_usage_errors},
	    {"test_client_help", test_client_help},
	    {"test_client_url_without_scheme", test_client_url_without_scheme},
	    {"test_client_connection_failure", test_client_connection_failure},
	    {"test_client_info", test_client_info},
	    {"test_client_cli_submit_follow", test_client_cli_submit_follow},
	    {"test_client_token_job_rates", test_client_token_job_rates},
	    {"test_client_max_jobs_concurrent", test_client_max_jobs_concurrent},
	    {"test_client_priority_queue", test_client_priority_queue},
	    {"test_client_lib_submit_watch", test_client_lib_submit_watch},
	    {"test_client_get_list", test_client_get_list},
	    {"test_client_names_escaped", test_client_names_escaped},
	    {"test_client_rejected", test_client_rejected},
	    {"test_client_plan", test_client_plan},
	    {"test_client_plan_busy", test_client_plan_busy},
	    {"test_client_interleaved_timeline", test_client_interleaved_timeline},
	    {"test_client_job_file_syntax_error", test_client_job_file_syntax_error},
	    {"test_client_cancel", test_client_cancel},
	    {"test_client_failed_job", test_client_failed_job},
	    {"test_client_interrupt", test_client_interrupt},
	    {"test_client_watch_server_stops", test_client_watch_server_stops},
	    {"test_client_checkpoint", test_client_checkpoint},
	    {"test_client_threads", test_client_threads},
	    {"test_client_auth", test_client_auth},
	    {"test_client_tls", test_client_tls},
	    {"test_client_python", test_client_python},
	    {NULL, NULL}};
	static const pt_test_suite suites[] = {{"client", tests}, {NULL, NULL}};
	char cmd[PATH_MAX + 16];
	int rv;

	unsetenv("PIPETRAIN_SERVER");
	unsetenv("PIPETRAIN_TOKEN");
	if (!setup()) {
		fprintf(stderr, "test_client: setup failed\n");
		return 99;
	}
	if (access(server_bin, CLI_OK) != 0) {
		fprintf(stderr, "SKIP: %s is not built yet\n", server_bin);
		return 77;
	}
	if (access(cli_bin, CLI_OK) != 0) {
		fprintf(stderr, "test_client: %s is missing\n", cli_bin);
		return 99;
	}
	if (!server_start(&srv, "data", NULL, NULL))
		return 99;
	rv = pt_test_main(suites);
	if (!server_stop(&srv)) {
		fprintf(stderr, "pipeserver did not exit cleanly on SIGTERM\n");
		rv = rv ? rv : 1;
	}
	if (rv == 0) {
		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", tmpdir);
	} else {
		fprintf(stderr, "test files kept in %s\n", tmpdir);
	}
	return rv;
}
