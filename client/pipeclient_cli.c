/* pipeclient_cli.c - the `pipeclient` command: submit, follow, cancel jobs and
 * fetch checkpoints from a pipeserver, through libpipeclient's public API only.
 *
 * Output is text for people, or with --json one JSON object per line for
 * scripts (streams: a "type" member tells the lines apart). On a terminal,
 * watch and checkpoint draw a progress bar (steps or bytes, rate, ETA) on the
 * last line, watch with the newest losses as a sparkline beside it;
 * elsewhere they print plain lines only. Exit codes are distinct
 * per failure class (see EXIT_*), so scripts need not parse messages; status
 * and watch give the same code for the same job state. Ctrl-C while watching
 * stops the client only, and says so (exit 130).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "pipeclient.h"
#include "sparkline.h"

enum {
	EXIT_OK = 0,
	EXIT_ERROR = 1,    /* local file, checksum, malformed reply, ... */
	EXIT_USAGE = 2,    /* bad command line */
	EXIT_CONNECT = 3,  /* cannot reach the server, no answer in time, or it is shutting down */
	EXIT_REJECTED = 4, /* the server refused the request (invalid job, not found, ...) */
	EXIT_JOB_FAILED = 5,    /* status, watch: the job ended Failed, Cancelled or Interrupted */
	EXIT_INTERRUPTED = 130, /* watch: Ctrl-C (128 + SIGINT) */
};

static const char usage_text[] =
    "usage: pipeclient [options] COMMAND [ARGS]\n"
    "\n"
    "commands (pipeclient COMMAND --help, or pipeclient help COMMAND, for one):\n"
    "  submit FILE [--follow]          submit a job file (JSON text or FlatBuffers binary\n"
    "                                  of a JobSpec, whatever its name); print the job id\n"
    "  plan FILE [--stages L] [--microbatches L]\n"
    "                                  predicted step time, bubble and memory of every\n"
    "                                  schedule before the job runs, fastest first\n"
    "  status JOB                      state, progress and latest metrics of a job, the\n"
    "                                  bubble fraction and per-stage busy time and traffic,\n"
    "                                  the last step's timeline\n"
    "  list                            every job the server knows\n"
    "  queue                           the waiting jobs in the order they will run, and why\n"
    "                                  each waits\n"
    "  cancel JOB                      stop a job; print the state it will end in\n"
    "  watch JOB                       loss lines until the job ends (a progress bar with\n"
    "                                  steps, rate and ETA on a terminal)\n"
    "  checkpoint JOB [--step N] -o FILE\n"
    "                                  download a checkpoint (default: the latest); resumes\n"
    "                                  FILE.part, checks the SHA-256\n"
    "  checkpoints JOB                 list a job's checkpoints\n"
    "  info                            server version, device and load\n"
    "\n"
    "options:\n"
    "  --server URL        server: tcp://HOST:PORT, tls+tcp://HOST:PORT or ipc:///PATH\n"
    "                      (env PIPETRAIN_SERVER; default " PIPECLIENT_DEFAULT_URL ")\n"
    "  --token TOKEN       auth token (env PIPETRAIN_TOKEN)\n"
    "  --timeout SECONDS   per request (default 30); a watch poll adds its 1 s wait\n"
    "  --json              one JSON object per line on stdout, for scripts\n"
    "  --follow            submit: then watch the job until it ends\n"
    "  --stages L          plan: stage counts to price (1,2,4)\n"
    "  --microbatches L    plan: microbatch counts to price (4,8)\n"
    "  --every N           watch, submit --follow: a loss line every N steps\n"
    "                      (default: about 20 lines per job)\n"
    "  --step N            checkpoint: the checkpoint of step N (default -1: the latest)\n"
    "  -o, --output FILE   checkpoint: where to write it (FILE.part while downloading)\n"
    "  --tls-ca FILE       tls+tcp://: CA certificates (PEM) to verify the server\n"
    "  --tls-cert FILE     tls+tcp://: client certificate and key (one PEM)\n"
    "  --tls-server-name NAME\n"
    "                      tls+tcp://: the name the server's certificate must carry\n"
    "  --insecure          tls+tcp://: do not verify the server's certificate\n"
    "  -h, --help          this text, or with a COMMAND that command's\n"
    "  --version           the client's version and protocol\n"
    "\n"
    "exit status:\n"
    "  0    ok; status, watch, submit --follow: the job succeeded (status: or has not\n"
    "       ended yet)\n"
    "  1    other error (local file, checksum, malformed reply)\n"
    "  2    usage (bad command line, a URL pipeclient cannot use)\n"
    "  3    the server cannot be reached, did not answer in time, or is shutting\n"
    "       down (also when it shuts down during watch)\n"
    "  4    the server refused the request (invalid job, not found, unauthorized, ...)\n"
    "  5    status, watch, submit --follow: the job ended Failed, Cancelled or\n"
    "       Interrupted\n"
    "  130  watch, submit --follow: stopped by Ctrl-C (the job keeps running)\n";

/* Shared by every command's own usage. */
#define COMMON_OPTIONS                                                                             \
	"\n"                                                                                       \
	"common options: --server URL, --token TOKEN, --timeout SECONDS, --json and the\n"         \
	"TLS options (pipeclient --help)\n"

typedef struct command {
	const char *name;
	int nargs;         /* 0, or 1: FILE (submit) or JOB */
	const char *usage; /* what `pipeclient NAME --help` prints */
} command;

static const command commands[] = {
    {"submit", 1,
     "usage: pipeclient submit FILE [--follow [--every N]] [options]\n"
     "\n"
     "Submit a job file - the JSON text of a JobSpec (schema/job.fbs) or its\n"
     "FlatBuffers binary, whatever the file's name - and print the new job's id.\n"
     "The server checks every field and names the bad one.\n"
     "\n"
     "  --follow     then watch the job until it ends, as `watch` does\n"
     "  --every N    with --follow: a loss line every N steps (default: ~20 lines)\n" COMMON_OPTIONS
     "\nexit status: 0 submitted (--follow: the job succeeded), 3 server unreachable or\n"
     "shutting down, 4 job refused, 5 (--follow) the job ended Failed, Cancelled or\n"
     "Interrupted, 130 (--follow) Ctrl-C: the job keeps running\n"},
    {"plan", 1,
     "usage: pipeclient plan FILE [--stages P[,P...]] [--microbatches M[,M...]] [options]\n"
     "\n"
     "Ask the server what the job in FILE would cost before it runs: for each stage\n"
     "and microbatch count (default: the file's; at most 8 each) and each schedule\n"
     "(gpipe, 1f1b, zb-h1), the predicted step time, bubble, samples/s and peak\n"
     "memory per stage, fastest first, with the partition it would use. The server\n"
     "measures the model's layers on its CPU (a few timed runs each, cached) and\n"
     "simulates each schedule (docs/pipeline.md). Submit with \"schedule\": \"auto\"\n"
     "to run the fastest at the file's counts.\n"
     "\n"
     "  --stages LIST        stage counts to price, e.g. 1,2,4\n"
     "  --microbatches LIST  microbatch counts to price, e.g. 4,8\n" COMMON_OPTIONS
     "\nexit status: 0 priced, 3 server unreachable, 4 the job is refused (the field\n"
     "is named)\n"},
    {"status", 1,
     "usage: pipeclient status JOB [options]\n"
     "\n"
     "State, step, latest loss and held-out metrics of job JOB, then the bubble\n"
     "fraction of its last step and a line per pipeline rank (busy time, traffic).\n"
     "With --json one object, with a \"stages\" array.\n" COMMON_OPTIONS
     "\nexit status: 0 the job succeeded or has not ended, 5 it ended Failed,\n"
     "Cancelled or Interrupted, 3 server unreachable, 4 no such job\n"},
    {"list", 0,
     "usage: pipeclient list [options]\n"
     "\n"
     "Every job the server knows, oldest first: id, state, step, loss, name.\n" COMMON_OPTIONS},
    {"queue", 0,
     "usage: pipeclient queue [options]\n"
     "\n"
     "The queued jobs in the order they will start (per device: higher priority\n"
     "first, first come first served within a priority) with why each waits:\n"
     "its place, the runners busy, the job ahead of it. With --json one object\n"
     "with a \"jobs\" array.\n" COMMON_OPTIONS},
    {"workers", 0,
     "usage: pipeclient workers [options]\n"
     "\n"
     "The server's worker pool (--pool): each worker's URL, state (idle, busy,\n"
     "unreachable, unknown until first probed), the job it serves, how long it has\n"
     "been so, its last heartbeat and its own words. With --json one object with a\n"
     "\"workers\" array.\n" COMMON_OPTIONS},
    {"drain", 1,
     "usage: pipeclient drain URL [options]\n"
     "\n"
     "Lend the pool worker at URL to no more jobs; the job it serves finishes.\n"
     "(Take it out of the --pool list and send the server SIGHUP to remove it.)\n" COMMON_OPTIONS
     "\nexit status: 0 draining, 4 the pool has no such worker\n"},
    {"cancel", 1,
     "usage: pipeclient cancel JOB [options]\n"
     "\n"
     "Stop job JOB and print the state it will end in (Cancelled: a running job\n"
     "stops within a step and keeps its last checkpoint).\n" COMMON_OPTIONS
     "\nexit status: 0 cancelled, 4 no such job or already ended (Conflict)\n"},
    {"watch", 1,
     "usage: pipeclient watch JOB [--every N] [options]\n"
     "\n"
     "Follow job JOB's loss until it ends (long polls), then print its status. On a\n"
     "terminal a progress bar shows steps, rate, ETA and a loss sparkline. Ctrl-C\n"
     "stops watching only: the job keeps running.\n"
     "\n"
     "  --every N    a loss line every N steps (default: ~20 lines per job)\n" COMMON_OPTIONS
     "\nexit status: 0 the job succeeded, 5 it ended Failed, Cancelled or Interrupted,\n"
     "3 server unreachable or shut down while watching, 4 no such job, 130 Ctrl-C\n"},
    {"checkpoint", 1,
     "usage: pipeclient checkpoint JOB [--step N] -o FILE [options]\n"
     "\n"
     "Download a checkpoint of job JOB (safetensors). Ranges are appended to\n"
     "FILE.part, which a later run resumes; the SHA-256 is checked before FILE.part\n"
     "becomes FILE.\n"
     "\n"
     "  --step N           the checkpoint of step N (default -1: the latest)\n"
     "  -o, --output FILE  where to write it (required)\n" COMMON_OPTIONS
     "\nexit status: 0 downloaded, 1 local file or checksum error, 4 no such job or\n"
     "checkpoint\n"},
    {"checkpoints", 1,
     "usage: pipeclient checkpoints JOB [options]\n"
     "\n"
     "The checkpoints the server keeps for job JOB: step, size, SHA-256.\n" COMMON_OPTIONS},
    {"info", 0,
     "usage: pipeclient info [options]\n"
     "\n"
     "The server's URL, version and protocol, device, running and queued jobs,\n"
     "uptime, and the hardware it detected with the kernels it picked.\n" COMMON_OPTIONS},
};

static const command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

typedef struct cli {
	pipeclient_options opts;
	bool json;
	bool follow;
	bool tty; /* stdout is a terminal: draw progress bars */
	int64_t step;
	int64_t every;
	const char *output;
	int stages[8], n_stages;             /* plan --stages */
	int microbatches[8], n_microbatches; /* plan --microbatches */
	pipeclient *c;
} cli;

/* ------------------------------------------------------------------ output -- */

static const char *usage_cmd; /* the command, once known: its --help is the hint */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "pipeclient: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(pipeclient %s%s--help for usage)\n", usage_cmd ? usage_cmd : "",
	        usage_cmd ? " " : "");
	return EXIT_USAGE;
}

/* utf8_seq gives the length (1..4) of the valid UTF-8 sequence at p and its
 * code point, or 0 for a byte that starts none (overlong, surrogate, cut). */
static int utf8_seq(const unsigned char *p, uint32_t *cp)
{
	int n = p[0] < 0x80                    ? 1
	        : p[0] >= 0xc2 && p[0] <= 0xdf ? 2
	        : (p[0] & 0xf0) == 0xe0        ? 3
	        : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
	                                       : 0;
	uint32_t c = n == 1 ? p[0] : n == 2 ? p[0] & 0x1fu : n == 3 ? p[0] & 0x0fu : p[0] & 0x07u;
	for (int i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3fu);
	}
	if ((n == 3 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) ||
	    (n == 4 && (c < 0x10000 || c > 0x10ffff)))
		return 0;
	*cp = c;
	return n;
}

/* is_control: a code point that moves the cursor, recolours or reorders a
 * terminal's text - C0, DEL, C1 (0x9b is CSI) and the bidi overrides. */
static bool is_control(uint32_t c)
{
	return c < 0x20 || (c >= 0x7f && c <= 0x9f) || (c >= 0x202a && c <= 0x202e) ||
	       (c >= 0x2066 && c <= 0x2069);
}

/* esc returns s (from the server: a job name, a message) with every control
 * character and invalid byte written as an escape (\n, \t, \r, \xHH, \uHHHH)
 * and '\' as "\\", so a name cannot drive the terminal. The result lives in
 * one of four static buffers (the CLI is single-threaded); a longer result
 * is cut, ending in "...". */
static const char *esc(const char *s)
{
	static char bufs[4][16384];
	static unsigned next;
	char *b = bufs[next++ % 4];
	size_t cap = sizeof(bufs[0]) - 4, n = 0;

	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && n < cap;) {
		char tmp[16];
		uint32_t c = 0;
		int k = utf8_seq(p, &c);
		if (k == 0)
			snprintf(tmp, sizeof(tmp), "\\x%02x", *p);
		else if (c == '\\' || c == '\n' || c == '\r' || c == '\t')
			snprintf(tmp, sizeof(tmp), "\\%c",
			         c == '\\'   ? '\\'
			         : c == '\n' ? 'n'
			         : c == '\r' ? 'r'
			                     : 't');
		else if (is_control(c))
			snprintf(tmp, sizeof(tmp), c < 0x80 ? "\\x%02x" : "\\u%04x", (unsigned)c);
		else
			snprintf(tmp, sizeof(tmp), "%.*s", k, (const char *)p);
		size_t t = strlen(tmp);
		if (n + t > cap) {
			memcpy(b + n, "...", 3);
			n += 3;
			break;
		}
		memcpy(b + n, tmp, t);
		n += t;
		p += k ? k : 1;
	}
	b[n] = '\0';
	return b;
}

/* json_str prints s as a JSON string: controls (C1 and bidi overrides too)
 * as \uHHHH, invalid UTF-8 as U+FFFD. */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p;) {
		uint32_t c = 0;
		int k = utf8_seq(p, &c);
		if (k == 0)
			fputs("\\ufffd", f);
		else if (c == '"' || c == '\\')
			fprintf(f, "\\%c", (char)c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\r')
			fputs("\\r", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (is_control(c))
			fprintf(f, "\\u%04x", (unsigned)c);
		else
			fwrite(p, 1, (size_t)k, f);
		p += k ? k : 1;
	}
	fputc('"', f);
}

/* json_num prints a finite number exactly enough to round-trip, else null. */
static void json_num(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.17g", v);
	else
		fputs("null", f);
}

/* Exit status and message for a failed library call. */
static int report(const cli *a, pipeclient_err e)
{
	const char *msg = pipeclient_last_error();

	if (msg[0] == '\0')
		msg = pipeclient_strerror(e);
	fprintf(stderr, "pipeclient: %s\n", esc(msg));
	if (a->json) {
		fputs("{\"type\":\"error\",\"error\":", stdout);
		json_str(stdout, pipeclient_err_name(e));
		fputs(",\"message\":", stdout);
		json_str(stdout, msg);
		fputs("}\n", stdout);
		fflush(stdout);
	}
	switch (e) {
	case PIPECLIENT_ERR_CONNECT:
	case PIPECLIENT_ERR_TIMEOUT:
	case PIPECLIENT_ERR_TLS:
	case PIPECLIENT_ERR_SERVER_UNAVAILABLE: /* shutting down: try again later */
		return EXIT_CONNECT;
	default:
		return pipeclient_is_server_error(e) ? EXIT_REJECTED : EXIT_ERROR;
	}
}

static void json_metric_fields(FILE *f, const pipeclient_metric *m)
{
	fprintf(f, "\"step\":%" PRId64 ",\"loss\":", m->step);
	json_num(f, m->loss);
	fputs(",\"learning_rate\":", f);
	json_num(f, m->learning_rate);
	fputs(",\"grad_norm\":", f);
	json_num(f, m->grad_norm);
	fputs(",\"samples_per_second\":", f);
	json_num(f, m->samples_per_second);
	fputs(",\"tokens_per_second\":", f);
	json_num(f, m->tokens_per_second);
	fputs(",\"bubble\":", f);
	json_num(f, m->bubble);
	fputs(",\"stage_busy\":[", f);
	for (int i = 0; i < m->n_stages && i < PIPECLIENT_MAX_STAGES; i++) {
		if (i)
			fputc(',', f);
		json_num(f, m->stage_busy[i]);
	}
	fputs("],\"eval_loss\":", f);
	json_num(f, m->eval_loss);
	fputs(",\"eval_accuracy\":", f);
	json_num(f, m->eval_accuracy);
	fputs(",\"time_unix\":", f);
	json_num(f, m->time_unix);
}

static void json_job_fields(FILE *f, const pipeclient_job *j)
{
	fprintf(f, "\"id\":%" PRIu64 ",\"name\":", j->id);
	json_str(f, j->name);
	fputs(",\"state\":", f);
	json_str(f, pipeclient_state_name(j->state));
	fputs(",\"message\":", f);
	json_str(f, j->message);
	fprintf(f, ",\"step\":%" PRId64 ",\"steps\":%" PRId64 ",\"submitted_unix\":", j->step,
	        j->steps);
	json_num(f, j->submitted_unix);
	fputs(",\"started_unix\":", f);
	json_num(f, j->started_unix);
	fputs(",\"finished_unix\":", f);
	json_num(f, j->finished_unix);
	fputs(",\"last\":", f);
	if (j->has_last) {
		fputc('{', f);
		json_metric_fields(f, &j->last);
		fputc('}', f);
	} else {
		fputs("null", f);
	}
}

static void format_time(double unix_s, char *buf, size_t cap)
{
	time_t t = (time_t)unix_s;
	struct tm tm;

	if (unix_s <= 0 || localtime_r(&t, &tm) == NULL)
		snprintf(buf, cap, "-");
	else
		strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
}

static void format_duration(double s, char *buf, size_t cap)
{
	if (!isfinite(s) || s < 0)
		snprintf(buf, cap, "--:--");
	else if (s < 3600)
		snprintf(buf, cap, "%02d:%02d", (int)s / 60, (int)s % 60);
	else
		snprintf(buf, cap, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
}

/* sig3 prints v with three significant digits in plain notation
 * (19451 -> "19500", 2038.4 -> "2040", 0.1137 -> "0.114"). */
static const char *sig3(double v, char *buf, size_t cap)
{
	int mag, dec;
	if (!isfinite(v)) {
		snprintf(buf, cap, "-");
		return buf;
	}
	if (v == 0.0) {
		snprintf(buf, cap, "0");
		return buf;
	}
	mag = (int)floor(log10(fabs(v)));
	dec = 2 - mag;
	if (dec > 0)
		snprintf(buf, cap, "%.*f", dec, v);
	else {
		double unit = pow(10.0, -dec);
		snprintf(buf, cap, "%.0f", round(v / unit) * unit);
	}
	return buf;
}

/* rate_text: "2040 tokens/s" for jobs on token data, else "19500 samples/s". */
static const char *rate_text(const pipeclient_metric *m, char *buf, size_t cap)
{
	char n[48];
	bool tokens = isfinite(m->tokens_per_second) && m->tokens_per_second > 0;
	snprintf(buf, cap, "%s %s/s",
	         sig3(tokens ? m->tokens_per_second : m->samples_per_second, n, sizeof(n)),
	         tokens ? "tokens" : "samples");
	return buf;
}

static void print_job_text(const pipeclient_job *j)
{
	char sub[32], start[32], fin[32];

	printf("job %" PRIu64 " %s: %s\n", j->id, j->name[0] ? esc(j->name) : "(unnamed)",
	       pipeclient_state_name(j->state));
	if (j->message[0])
		printf("  message: %s\n", esc(j->message));
	printf("  step %" PRId64 "/%" PRId64 "\n", j->step, j->steps);
	if (j->has_last) {
		const pipeclient_metric *m = &j->last;
		char rate[80];
		printf("  loss %.6g at step %" PRId64 " (lr %.3g, %s, bubble %.0f %%)\n", m->loss,
		       m->step, m->learning_rate, rate_text(m, rate, sizeof(rate)),
		       100 * m->bubble);
		if (isfinite(m->eval_accuracy) || isfinite(m->eval_loss))
			printf("  held-out loss %.6g, accuracy %.2f %%\n", m->eval_loss,
			       100 * m->eval_accuracy);
	}
	format_time(j->submitted_unix, sub, sizeof(sub));
	format_time(j->started_unix, start, sizeof(start));
	format_time(j->finished_unix, fin, sizeof(fin));
	printf("  submitted %s, started %s, finished %s", sub, start, fin);
	if (j->started_unix > 0 && j->finished_unix >= j->started_unix)
		printf(" (%.1f s)", j->finished_unix - j->started_unix);
	printf("\n");
}

/* --------------------------------------------------------------- progress -- */

static int term_width(void)
{
	struct winsize ws;

	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
		return ws.ws_col > 200 ? 200 : ws.ws_col;
	return 80;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* default_bar is the bar's width beside text of up to 60 columns. It depends
 * on the terminal only, not on the text beside it, so it does not jump when
 * the rate appears. */
static int default_bar(void)
{
	int bar = term_width() - 64;

	return bar > 40 ? 40 : bar;
}

/* draw_bar writes "\r[#####.....] left  right\e[K"; no bar when bar < 10. */
static void draw_bar(int bar, double frac, const char *left, const char *right)
{
	int fill;

	if (!(frac >= 0))
		frac = 0;
	if (frac > 1)
		frac = 1;
	fputc('\r', stdout);
	if (bar >= 10) {
		fill = (int)(frac * bar + 0.5);
		fputc('[', stdout);
		for (int i = 0; i < bar; i++)
			fputc(i < fill ? '#' : '.', stdout);
		fputs("] ", stdout);
	}
	printf("%s  %s\033[K", left, right);
	fflush(stdout);
}

static void clear_bar(void)
{
	fputs("\r\033[K", stdout);
}

/* ------------------------------------------------------------------ watch -- */

#define SPARK_COLS 24 /* widest loss sparkline beside the bar */
#define STATS_COLS 40 /* room kept for "loss ...  ... steps/s  ETA ..." */
#define SPARK_MIN  8  /* narrower than this: no sparkline */
#define BAR_MIN    10 /* narrower than this: no bar */

typedef struct watcher {
	const cli *a;
	int64_t steps; /* total, for the bar and the line cadence */
	int64_t every;
	int64_t first_step;
	double t0;
	double drawn; /* when the bar was last drawn */
	bool bar_shown;
	double loss[SPARK_COLS]; /* losses of the newest multiples of every, oldest first */
	size_t n_loss;
} watcher;

/* keep_loss appends loss to w's window of the newest SPARK_COLS. */
static void keep_loss(watcher *w, double loss)
{
	if (w->n_loss == SPARK_COLS) {
		memmove(w->loss, w->loss + 1, sizeof(w->loss[0]) * (SPARK_COLS - 1));
		w->n_loss--;
	}
	w->loss[w->n_loss++] = loss;
}

/* layout splits the columns beside "step N/STEPS" and the stats between the
 * bar and the sparkline (each 0 when it does not fit); fixed per terminal
 * width and job, so nothing jumps while the text beside them changes. */
static void layout(int64_t steps, int *bar, int *spark)
{
	char left[64];
	int room;

	snprintf(left, sizeof(left), "step %" PRId64 "/%" PRId64, steps, steps);
	room = term_width() - (int)strlen(left) - 2 - STATS_COLS - 2;
	*spark = room / 3 < SPARK_MIN ? SPARK_MIN : room / 3 > SPARK_COLS ? SPARK_COLS : room / 3;
	if (room - *spark - 1 < SPARK_MIN)
		*spark = 0; /* not even a narrow one fits */
	*bar = room - (*spark ? *spark + 1 : 0) - 3;
	if (*bar > 40)
		*bar = 40;
	if (*bar < BAR_MIN)
		*bar = 0;
}

static void print_metric_line(const pipeclient_metric *m, int64_t steps)
{
	char rate[80];
	printf("step %" PRId64 "/%" PRId64 "  loss %.4f  lr %.3g  %s", m->step, steps, m->loss,
	       m->learning_rate, rate_text(m, rate, sizeof(rate)));
	if (isfinite(m->eval_loss))
		printf("  eval loss %.4f", m->eval_loss);
	if (isfinite(m->eval_accuracy))
		printf("  accuracy %.2f %%", 100 * m->eval_accuracy);
	printf("\n");
}

static bool on_metric(void *ctx, uint64_t job, const pipeclient_metric *m)
{
	watcher *w = ctx;
	bool eval = isfinite(m->eval_loss) || isfinite(m->eval_accuracy);
	bool line = m->step == 1 || m->step % w->every == 0 || m->step >= w->steps || eval;

	if (w->a->json) {
		printf("{\"type\":\"metric\",\"job\":%" PRIu64 ",", job);
		json_metric_fields(stdout, m);
		printf("}\n");
		fflush(stdout);
		return true;
	}
	if (w->first_step < 0) {
		w->first_step = m->step;
		w->t0 = m->time_unix > 0 ? m->time_unix : now_s();
	}
	if (m->step % w->every == 0)
		keep_loss(w, m->loss); /* one column per loss line's step */
	if (line) {
		if (w->bar_shown)
			clear_bar();
		print_metric_line(m, w->steps);
	}
	if (w->a->tty && (line || now_s() - w->drawn >= 0.05 || m->step >= w->steps)) {
		/* Redraw at most 20 times a second (points come in bursts). The
		 * rate uses the server's step times, so a history sent in one
		 * burst does not inflate it. */
		double t = m->time_unix > 0 ? m->time_unix : now_s();
		int64_t done = m->step - w->first_step;
		double rate = t - w->t0 > 0.05 && done > 0 ? done / (t - w->t0) : NAN;
		char left[64], stats[96], eta[32];
		char spark[SPARK_COLS * SPARKLINE_GLYPH_BYTES + 1], right[sizeof(spark) + 100];
		int bar, cols;

		format_duration(isfinite(rate) ? (w->steps - m->step) / rate : NAN, eta,
		                sizeof(eta));
		snprintf(left, sizeof(left), "step %" PRId64 "/%" PRId64, m->step, w->steps);
		if (isfinite(rate)) {
			char r3[48];
			snprintf(stats, sizeof(stats), "loss %.4f  %s steps/s  ETA %s", m->loss,
			         sig3(rate, r3, sizeof(r3)), eta);
		} else
			snprintf(stats, sizeof(stats), "loss %.4f  ETA %s", m->loss, eta);
		layout(w->steps, &bar, &cols);
		sparkline_render(spark, sizeof(spark), w->loss, w->n_loss, cols);
		snprintf(right, sizeof(right), "%s%s%s", spark, spark[0] ? " " : "", stats);
		draw_bar(bar, w->steps > 0 ? (double)m->step / w->steps : 0, left, right);
		w->bar_shown = true;
		w->drawn = now_s();
	} else if (line) {
		fflush(stdout);
	}
	return true;
}

/* job_exit is the exit status that tells a job's state, the same for status
 * and watch: EXIT_JOB_FAILED for an end other than success, else EXIT_OK. */
static int job_exit(pipeclient_job_state s)
{
	return s == PIPECLIENT_FAILED || s == PIPECLIENT_CANCELLED || s == PIPECLIENT_INTERRUPTED
	           ? EXIT_JOB_FAILED
	           : EXIT_OK;
}

/* Ctrl-C while watching. The wait is inside pipeclient_watch, which calls
 * back on metric points only (a queued job sends none for as long as the job
 * before it runs), so a flag would be seen late or never: the handler writes
 * the text made beforehand and exits, both async-signal-safe. */
static char sigint_out[96], sigint_err[1024];
static size_t sigint_out_len, sigint_err_len;

static void on_sigint(int sig)
{
	ssize_t r = 0;

	(void)sig;
	if (sigint_out_len)
		r = write(STDOUT_FILENO, sigint_out, sigint_out_len);
	r = write(STDERR_FILENO, sigint_err, sigint_err_len);
	(void)r;
	_exit(EXIT_INTERRUPTED);
}

/* catch_sigint makes Ctrl-C say that job id keeps running and how to cancel
 * it (on), or restores the default (off: the watch is over). */
static void catch_sigint(const cli *a, uint64_t id, bool on)
{
	struct sigaction sa;
	int n;

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = SIG_DFL;
	if (on) {
		bool server = a->opts.url != NULL && a->opts.url[0] != '\0';
		n = a->json  ? snprintf(sigint_out, sizeof(sigint_out),
		                        "{\"type\":\"interrupted\",\"job\":%" PRIu64 "}\n", id)
		    : a->tty ? snprintf(sigint_out, sizeof(sigint_out), "\r\033[K")
		             : 0;
		sigint_out_len = n > 0 && (size_t)n < sizeof(sigint_out) ? (size_t)n : 0;
		/* The hint names the server when the command line did (not the token). */
		n = snprintf(sigint_err, sizeof(sigint_err),
		             "pipeclient: interrupted: job %" PRIu64 " keeps running on the "
		             "server; cancel it with: pipeclient %s%s%scancel %" PRIu64 "\n",
		             id, server ? "--server " : "", server ? a->opts.url : "",
		             server ? " " : "", id);
		if (n < 0)
			n = 0;
		if ((size_t)n >= sizeof(sigint_err)) { /* a long URL: cut, still one line */
			n = sizeof(sigint_err) - 1;
			sigint_err[n - 1] = '\n';
		}
		sigint_err_len = (size_t)n;
		sa.sa_handler = on_sigint;
	}
	sigaction(SIGINT, &sa, NULL);
}

/* follow watches job to its end and prints the final status; returns the exit
 * status (job_exit of the end state; EXIT_CONNECT when the server went away,
 * as when it shut down meanwhile). */
static int follow(cli *a, uint64_t id)
{
	pipeclient_job j;
	pipeclient_job_state final;
	watcher w = {.a = a, .first_step = -1};
	pipeclient_err e;
	int rv;

	if ((e = pipeclient_get(a->c, id, &j)) != PIPECLIENT_OK)
		return report(a, e);
	w.steps = j.steps;
	w.every = a->every > 0 ? a->every : (j.steps >= 20 ? j.steps / 20 : 1);
	catch_sigint(a, id, true); /* from here on, Ctrl-C says the job keeps running */
	if (!a->json && !pipeclient_state_is_final(j.state))
		printf("watching job %" PRIu64 " (%" PRId64 " steps)\n", id, w.steps);
	fflush(stdout); /* Ctrl-C exits without flushing stdio */
	pipeclient_job_fini(&j);
	e = pipeclient_watch(a->c, id, -1, 1000, on_metric, &w, &final);
	catch_sigint(a, id, false);
	if (w.bar_shown)
		clear_bar();
	if (e != PIPECLIENT_OK)
		return report(a, e);
	if ((e = pipeclient_get(a->c, id, &j)) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		fputs("{\"type\":\"job\",", stdout);
		json_job_fields(stdout, &j);
		fputs("}\n", stdout);
	} else {
		print_job_text(&j);
	}
	rv = job_exit(j.state);
	if (rv != EXIT_OK && !a->json)
		fprintf(stderr, "pipeclient: job %" PRIu64 " %s%s%s\n", id,
		        pipeclient_state_name(j.state), j.message[0] ? ": " : "", esc(j.message));
	pipeclient_job_fini(&j);
	return rv;
}

/* --------------------------------------------------------------- commands -- */

static int parse_job(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	if (s == NULL || s[0] < '0' || s[0] > '9')
		return -1;
	*out = strtoull(s, &end, 10);
	return errno == 0 && *end == '\0' ? 0 : -1;
}

static int cmd_submit(cli *a, const char *file)
{
	uint64_t id;
	pipeclient_err e;

	if ((e = pipeclient_submit_file(a->c, file, &id)) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json)
		printf(a->follow ? "{\"type\":\"submitted\",\"job\":%" PRIu64 "}\n"
		                 : "{\"job\":%" PRIu64 "}\n",
		       id);
	else
		printf("submitted job %" PRIu64 "\n", id);
	fflush(stdout);
	return a->follow ? follow(a, id) : EXIT_OK;
}

static void json_stages(FILE *f, const pipeclient_stage *st, size_t n)
{
	fputs("[", f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s{\"stage\":%d,\"busy_seconds\":", i ? "," : "", st[i].stage);
		json_num(f, st[i].busy_seconds);
		fprintf(f,
		        ",\"has_comm\":%s,\"messages_sent\":%" PRIu64
		        ",\"messages_received\":%" PRIu64 ",\"bytes_sent\":%" PRIu64
		        ",\"bytes_received\":%" PRIu64 ",\"bytes_raw_sent\":%" PRIu64
		        ",\"errors\":%" PRIu64 ",\"timeouts\":%" PRIu64 ",\"reconnects\":%" PRIu64
		        "}",
		        st[i].has_comm ? "true" : "false", st[i].messages_sent,
		        st[i].messages_received, st[i].bytes_sent, st[i].bytes_received,
		        st[i].bytes_raw_sent, st[i].errors, st[i].timeouts, st[i].reconnects);
	}
	fputs("]", f);
}

static void json_timeline(FILE *f, const pipeclient_task *t, size_t n)
{
	fputs("[", f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s{\"stage\":%d,\"kind\":\"%c\",\"microbatch\":%d,\"start\":",
		        i ? "," : "", t[i].stage, t[i].kind, t[i].microbatch);
		json_num(f, t[i].start);
		fputs(",\"end\":", f);
		json_num(f, t[i].end);
		fputc('}', f);
	}
	fputc(']', f);
}

/* print_timeline draws the last step's tasks as a text Gantt chart, a row
 * per stage, TIMELINE_COLS columns for the step: a task is its kind letter
 * and microbatch ("F3--"), '.' is idle. An interleaved job (v chunks a
 * stage) gets a row per stage too: chunk 0's tasks in capitals, the other
 * chunks' in small letters. */
#define TIMELINE_COLS 72
static void print_timeline(const pipeclient_job *j, const pipeclient_task *t, size_t n)
{
	char row[TIMELINE_COLS + 1];
	double span = 0.0;
	int stages = 0, v = pipeclient_job_virtual_stages(j);

	for (size_t i = 0; i < n; i++) {
		span = t[i].end > span ? t[i].end : span;
		stages = t[i].stage + 1 > stages ? t[i].stage + 1 : stages;
	}
	if (n == 0 || span <= 0.0)
		return;
	if (v > 1 && stages % v != 0)
		v = 1; /* not the shape an interleaved job has: a row per stage row */
	stages /= v;
	printf("timeline of step %" PRId64 " (F forward, B backward input, W weight gradients, "
	       ". idle%s; a column is %.3g ms):\n",
	       j->has_last ? j->last.step : j->step,
	       v > 1 ? "; chunk 0 in capitals, later chunks in small letters" : "",
	       span / TIMELINE_COLS * 1e3);
	for (int st = 0; st < stages; st++) {
		memset(row, '.', TIMELINE_COLS);
		row[TIMELINE_COLS] = '\0';
		for (size_t i = 0; i < n; i++) {
			char label[16];
			int a, b, len;
			if (t[i].stage % stages != st)
				continue;
			a = (int)(t[i].start / span * TIMELINE_COLS);
			b = (int)(t[i].end / span * TIMELINE_COLS + 0.5);
			a = a < 0 ? 0 : a >= TIMELINE_COLS ? TIMELINE_COLS - 1 : a;
			b = b <= a ? a + 1 : b > TIMELINE_COLS ? TIMELINE_COLS : b;
			len = snprintf(label, sizeof(label), "%c%d",
			               t[i].stage >= stages ? t[i].kind - 'A' + 'a' : t[i].kind,
			               t[i].microbatch);
			for (int c = a; c < b; c++)
				row[c] = c - a < len ? label[c - a] : '-';
		}
		printf("  stage %-2d %s\n", st, row);
	}
}

/* print_stages writes the bubble of the last step and a line per rank:
 * "  stage 2: busy 1.234567 s; 480 messages sent (1.5 MiB), 480 received (0.9 MiB)". */
static void print_stages(const pipeclient_job *j, const pipeclient_stage *st, size_t n)
{
	if (j->has_last && isfinite(j->last.bubble))
		printf("  bubble fraction %.3f (idle share of stage time in step %" PRId64 ")\n",
		       j->last.bubble, j->last.step);
	for (size_t i = 0; i < n; i++) {
		if (st[i].stage < 0)
			printf("  coordinator:");
		else
			printf("  stage %d: busy %.6f s", st[i].stage, st[i].busy_seconds);
		if (!st[i].has_comm) {
			printf("%s no traffic counters (a worker's stage in an async job, or not "
			       "run since the server restarted)\n",
			       st[i].stage < 0 ? "" : ";");
			continue;
		}
		printf("%s %" PRIu64 " messages sent (%.1f MiB), %" PRIu64 " received (%.1f MiB)",
		       st[i].stage < 0 ? "" : ";", st[i].messages_sent,
		       st[i].bytes_sent / 1048576.0, st[i].messages_received,
		       st[i].bytes_received / 1048576.0);
		if (st[i].bytes_sent > 0 && st[i].bytes_raw_sent != st[i].bytes_sent)
			printf(", lz4 %.2fx", (double)st[i].bytes_raw_sent / st[i].bytes_sent);
		if (st[i].errors || st[i].timeouts || st[i].reconnects)
			printf(", %" PRIu64 " errors, %" PRIu64 " timeouts, %" PRIu64 " reconnects",
			       st[i].errors, st[i].timeouts, st[i].reconnects);
		printf("\n");
	}
}

static int cmd_status(cli *a, uint64_t id)
{
	pipeclient_job j;
	pipeclient_stage *st = NULL;
	pipeclient_task *tl = NULL;
	size_t n = 0, n_tl = 0;
	pipeclient_err e;
	int rv;

	if ((e = pipeclient_get(a->c, id, &j)) != PIPECLIENT_OK)
		return report(a, e);
	if ((e = pipeclient_stages(a->c, id, &st, &n)) != PIPECLIENT_OK ||
	    (e = pipeclient_timeline(a->c, id, &tl, &n_tl)) != PIPECLIENT_OK) {
		free(st);
		pipeclient_job_fini(&j);
		return report(a, e);
	}
	if (a->json) {
		fputc('{', stdout);
		json_job_fields(stdout, &j);
		fputs(",\"stages\":", stdout);
		json_stages(stdout, st, n);
		fputs(",\"timeline\":", stdout);
		json_timeline(stdout, tl, n_tl);
		fputs("}\n", stdout);
	} else {
		print_job_text(&j);
		print_stages(&j, st, n);
		print_timeline(&j, tl, n_tl);
	}
	free(st);
	free(tl);
	rv = job_exit(j.state);
	pipeclient_job_fini(&j);
	return rv;
}

static int cmd_list(cli *a)
{
	pipeclient_job *jobs;
	size_t n;
	pipeclient_err e;

	if ((e = pipeclient_list(a->c, &jobs, &n)) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		fputs("{\"jobs\":[", stdout);
		for (size_t i = 0; i < n; i++) {
			fputs(i ? ",{" : "{", stdout);
			json_job_fields(stdout, &jobs[i]);
			fputc('}', stdout);
		}
		fputs("]}\n", stdout);
	} else {
		printf("%-6s %-12s %-13s %-10s %s\n", "ID", "STATE", "STEP", "LOSS", "NAME");
		for (size_t i = 0; i < n; i++) {
			char step[32], loss[16];
			snprintf(step, sizeof(step), "%" PRId64 "/%" PRId64, jobs[i].step,
			         jobs[i].steps);
			if (jobs[i].has_last)
				snprintf(loss, sizeof(loss), "%.4f", jobs[i].last.loss);
			else
				snprintf(loss, sizeof(loss), "-");
			printf("%-6" PRIu64 " %-12s %-13s %-10s %s\n", jobs[i].id,
			       pipeclient_state_name(jobs[i].state), step, loss, esc(jobs[i].name));
		}
	}
	pipeclient_jobs_free(jobs, n);
	return EXIT_OK;
}

/* The place a queued job's message gives ("queued: place N on DEV; ..."). */
static int queue_place(const pipeclient_job *j)
{
	int place = 0;
	if (sscanf(j->message, "queued: place %d on ", &place) != 1)
		place = 1 << 30;
	return place;
}

static int cmp_queued(const void *x, const void *y)
{
	const pipeclient_job *a = *(const pipeclient_job *const *)x,
	                     *b = *(const pipeclient_job *const *)y;
	int pa = queue_place(a), pb = queue_place(b);
	return pa != pb ? (pa < pb ? -1 : 1) : (a->id < b->id ? -1 : a->id > b->id);
}

static int cmd_queue(cli *a)
{
	pipeclient_job *jobs, **q;
	size_t n, k = 0;
	pipeclient_err e;

	if ((e = pipeclient_list(a->c, &jobs, &n)) != PIPECLIENT_OK)
		return report(a, e);
	if ((q = calloc(n + 1, sizeof(*q))) == NULL) {
		pipeclient_jobs_free(jobs, n);
		fprintf(stderr, "pipeclient: out of memory\n");
		return EXIT_ERROR;
	}
	for (size_t i = 0; i < n; i++)
		if (jobs[i].state == PIPECLIENT_QUEUED)
			q[k++] = &jobs[i];
	qsort(q, k, sizeof(*q), cmp_queued);
	if (a->json) {
		fputs("{\"jobs\":[", stdout);
		for (size_t i = 0; i < k; i++) {
			fputs(i ? ",{" : "{", stdout);
			json_job_fields(stdout, q[i]);
			fputc('}', stdout);
		}
		fputs("]}\n", stdout);
	} else if (k == 0) {
		printf("no job is waiting\n");
	} else {
		printf("%-6s %-20s %s\n", "ID", "NAME", "WHY IT WAITS");
		for (size_t i = 0; i < k; i++)
			printf("%-6" PRIu64 " %-20s %s\n", q[i]->id, esc(q[i]->name),
			       esc(q[i]->message));
	}
	free(q);
	pipeclient_jobs_free(jobs, n);
	return EXIT_OK;
}

/* ago writes s seconds as "42s", "5m07s" or "3h12m". */
static void ago(double s, char *buf, size_t cap)
{
	long t = s > 0 ? (long)s : 0;
	if (t < 60)
		snprintf(buf, cap, "%lds", t);
	else if (t < 3600)
		snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
	else
		snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
}

static int cmd_workers(cli *a)
{
	pipeclient_worker *w;
	size_t n;
	pipeclient_err e;
	double now = (double)time(NULL);

	if ((e = pipeclient_workers(a->c, &w, &n)) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		fputs("{\"workers\":[", stdout);
		for (size_t i = 0; i < n; i++) {
			fputs(i ? ",{\"url\":" : "{\"url\":", stdout);
			json_str(stdout, w[i].url);
			fputs(",\"state\":", stdout);
			json_str(stdout, w[i].state);
			printf(",\"job\":%" PRIu64 ",\"draining\":%s,\"since_unix\":", w[i].job,
			       w[i].draining ? "true" : "false");
			json_num(stdout, w[i].since_unix);
			fputs(",\"last_heartbeat_unix\":", stdout);
			json_num(stdout, w[i].last_heartbeat_unix);
			fputs(",\"message\":", stdout);
			json_str(stdout, w[i].message);
			fputs(",\"devices\":", stdout);
			json_str(stdout, w[i].devices);
			fputc('}', stdout);
		}
		fputs("]}\n", stdout);
	} else if (n == 0) {
		printf("no worker pool (pipeserver --pool)\n");
	} else {
		printf("%-28s %-12s %-6s %-9s %-10s %-22s %s\n", "URL", "STATE", "JOB", "FOR",
		       "HEARTBEAT", "DEVICES", "MESSAGE");
		for (size_t i = 0; i < n; i++) {
			char job[24] = "-", since[32], hb[32] = "never";
			if (w[i].job)
				snprintf(job, sizeof(job), "%" PRIu64, w[i].job);
			ago(now - w[i].since_unix, since, sizeof(since));
			if (w[i].last_heartbeat_unix > 0) {
				ago(now - w[i].last_heartbeat_unix, hb, sizeof(hb) - 4);
				strcat(hb, " ago");
			}
			printf("%-28s %-12s %-6s %-9s %-10s %-22s %s\n", esc(w[i].url),
			       w[i].draining ? "draining" : w[i].state, job, since, hb,
			       w[i].devices[0] ? esc(w[i].devices) : "-", esc(w[i].message));
		}
	}
	free(w);
	return EXIT_OK;
}

/* human_bytes writes n as "1.5 MiB". */
static void human_bytes(uint64_t n, char *buf, size_t cap)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)n;
	int u = 0;
	while (v >= 1024 && u < 4)
		v /= 1024, u++;
	snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static int cmd_plan(cli *a, const char *path)
{
	pipeclient_plan *p = NULL;
	size_t n = 0;
	pipeclient_err e = pipeclient_plan_file(a->c, path, a->stages, a->n_stages, a->microbatches,
	                                        a->n_microbatches, &p, &n);

	if (e != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		fputs("{\"plans\":[", stdout);
		for (size_t i = 0; i < n; i++) {
			printf("%s{\"schedule\":", i ? "," : "");
			json_str(stdout, p[i].schedule);
			printf(",\"stages\":%d,\"virtual_stages\":%d,\"microbatches\":%d,"
			       "\"step_seconds\":",
			       p[i].stages, p[i].virtual_stages, p[i].microbatches);
			json_num(stdout, p[i].step_seconds);
			fputs(",\"bubble\":", stdout);
			json_num(stdout, p[i].bubble);
			fputs(",\"samples_per_second\":", stdout);
			json_num(stdout, p[i].samples_per_second);
			fputs(",\"boundaries\":[", stdout);
			for (int s = 0; s <= p[i].stages * p[i].virtual_stages; s++)
				printf("%s%d", s ? "," : "", p[i].boundaries[s]);
			fputs("],\"stage_bytes\":[", stdout);
			for (int s = 0; s < p[i].stages * p[i].virtual_stages; s++)
				printf("%s%" PRIu64, s ? "," : "", p[i].stage_bytes[s]);
			fputs("]}", stdout);
		}
		fputs("]}\n", stdout);
	} else {
		printf("%-11s %6s %12s %10s %7s %12s  %-18s %s\n", "SCHEDULE", "STAGES",
		       "MICROBATCHES", "STEP", "BUBBLE", "SAMPLES/S", "PARTITION",
		       "PEAK MEMORY/STAGE");
		for (size_t i = 0; i < n; i++) {
			char part[64] = "", mem[256] = "", stages[24];
			size_t o = 0, q = 0;
			int nl = p[i].stages * p[i].virtual_stages;
			for (int s = 0; s <= nl && o < sizeof(part); s++)
				o += (size_t)snprintf(part + o, sizeof(part) - o, "%s%d",
				                      s ? "," : "", p[i].boundaries[s]);
			for (int s = 0; s < nl && q < sizeof(mem); s++) {
				char h[32];
				human_bytes(p[i].stage_bytes[s], h, sizeof(h));
				q += (size_t)snprintf(mem + q, sizeof(mem) - q, "%s%s",
				                      s ? ", " : "", h);
			}
			/* Interleaved: "4x2", 4 stages of 2 chunks. */
			if (p[i].virtual_stages > 1)
				snprintf(stages, sizeof(stages), "%dx%d", p[i].stages,
				         p[i].virtual_stages);
			else
				snprintf(stages, sizeof(stages), "%d", p[i].stages);
			printf("%-11s %6s %12d %8.2f ms %6.1f%% %12.3g  %-18s %s\n", p[i].schedule,
			       stages, p[i].microbatches, p[i].step_seconds * 1e3,
			       p[i].bubble * 100, p[i].samples_per_second, part, mem);
		}
	}
	free(p);
	return EXIT_OK;
}

static int cmd_drain(cli *a, const char *url)
{
	pipeclient_err e = pipeclient_drain_worker(a->c, url);

	if (e != PIPECLIENT_OK)
		return report(a, e);
	if (a->json)
		printf("{\"draining\":true}\n");
	else
		printf("draining %s: it takes no more jobs\n", esc(url));
	return EXIT_OK;
}

static int cmd_cancel(cli *a, uint64_t id)
{
	pipeclient_job_state st;
	pipeclient_err e;

	if ((e = pipeclient_cancel(a->c, id, &st)) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		printf("{\"job\":%" PRIu64 ",\"state\":", id);
		json_str(stdout, pipeclient_state_name(st));
		printf("}\n");
	} else {
		printf("job %" PRIu64 ": %s\n", id, pipeclient_state_name(st));
	}
	return EXIT_OK;
}

typedef struct downloader {
	bool tty;
	double t0;
	double drawn;
	uint64_t start; /* bytes present when this run began (a resume) */
	bool started;
	bool shown;
} downloader;

static bool on_progress(void *ctx, uint64_t done, uint64_t total)
{
	downloader *d = ctx;
	char left[64], right[96], eta[32];
	double dt, rate;

	if (!d->started) {
		/* The first report follows the first range: what was there before. */
		d->started = true;
		d->t0 = now_s();
		d->start = done;
		return true;
	}
	if (!d->tty || (done < total && now_s() - d->drawn < 0.05))
		return true;
	d->drawn = now_s();
	dt = now_s() - d->t0;
	rate = dt > 0 ? (done - d->start) / dt : NAN;
	format_duration(rate > 0 ? (total - done) / rate : NAN, eta, sizeof(eta));
	snprintf(left, sizeof(left), "%.1f/%.1f MiB", done / 1048576.0, total / 1048576.0);
	snprintf(right, sizeof(right), "%.1f MiB/s  ETA %s", rate / 1048576.0, eta);
	draw_bar(default_bar(), total ? (double)done / total : 1, left, right);
	d->shown = true;
	return true;
}

static int cmd_checkpoint(cli *a, uint64_t id)
{
	downloader d = {.tty = a->tty && !a->json};
	pipeclient_checkpoint ck;
	pipeclient_err e;

	e = pipeclient_fetch_checkpoint(a->c, id, a->step, a->output, on_progress, &d, &ck);
	if (d.shown)
		clear_bar();
	if (e != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		printf("{\"job\":%" PRIu64 ",\"step\":%" PRId64 ",\"size\":%" PRIu64 ",\"sha256\":",
		       id, ck.step, ck.size);
		json_str(stdout, ck.sha256);
		fputs(",\"path\":", stdout);
		json_str(stdout, a->output);
		fputs("}\n", stdout);
	} else {
		printf("checkpoint of job %" PRIu64 " at step %" PRId64 ": %s (%" PRIu64
		       " bytes, sha256 %s)\n",
		       id, ck.step, esc(a->output), ck.size, esc(ck.sha256));
	}
	return EXIT_OK;
}

static int cmd_checkpoints(cli *a, uint64_t id)
{
	pipeclient_checkpoint *cks;
	size_t n;
	pipeclient_err e;

	if ((e = pipeclient_list_checkpoints(a->c, id, &cks, &n)) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json)
		fputs("{\"checkpoints\":[", stdout);
	else
		printf("%-10s %-12s %s\n", "STEP", "BYTES", "SHA256");
	for (size_t i = 0; i < n; i++) {
		if (a->json) {
			printf("%s{\"step\":%" PRId64 ",\"size\":%" PRIu64 ",\"sha256\":",
			       i ? "," : "", cks[i].step, cks[i].size);
			json_str(stdout, cks[i].sha256);
			fputc('}', stdout);
		} else {
			printf("%-10" PRId64 " %-12" PRIu64 " %s\n", cks[i].step, cks[i].size,
			       esc(cks[i].sha256));
		}
	}
	if (a->json)
		fputs("]}\n", stdout);
	free(cks);
	return EXIT_OK;
}

static int cmd_info(cli *a)
{
	pipeclient_server_info si;
	pipeclient_err e;
	char kernels[1024], devices[1024];

	if ((e = pipeclient_info(a->c, &si)) != PIPECLIENT_OK ||
	    (e = pipeclient_kernels(a->c, kernels, sizeof(kernels))) != PIPECLIENT_OK ||
	    (e = pipeclient_devices(a->c, devices, sizeof(devices))) != PIPECLIENT_OK)
		return report(a, e);
	if (a->json) {
		fputs("{\"server\":", stdout);
		json_str(stdout, pipeclient_url(a->c));
		fputs(",\"version\":", stdout);
		json_str(stdout, si.version);
		printf(",\"protocol\":%d,\"device\":", si.protocol);
		json_str(stdout, si.device);
		printf(",\"jobs_queued\":%d,\"jobs_running\":%d,\"uptime_seconds\":",
		       si.jobs_queued, si.jobs_running);
		json_num(stdout, si.uptime_seconds);
		fputs(",\"kernels\":", stdout);
		json_str(stdout, kernels);
		fputs(",\"devices\":", stdout);
		json_str(stdout, devices);
		fputs(",\"client_version\":", stdout);
		json_str(stdout, PIPECLIENT_VERSION);
		fputs("}\n", stdout);
	} else {
		char up[32];
		format_duration(si.uptime_seconds, up, sizeof(up));
		printf("server   %s\nversion  %s (protocol %d; client %s, protocol %d)\n"
		       "device   %s\njobs     %d running, %d queued\nuptime   %s\n",
		       esc(pipeclient_url(a->c)), esc(si.version), si.protocol, PIPECLIENT_VERSION,
		       PIPECLIENT_PROTOCOL, esc(si.device), si.jobs_running, si.jobs_queued, up);
		if (kernels[0])
			printf("kernels  %s\n", esc(kernels));
		if (devices[0])
			printf("devices  %s\n", esc(devices));
		pipeclient_worker *w = NULL;
		size_t n = 0;
		if (pipeclient_workers(a->c, &w, &n) == PIPECLIENT_OK && n > 0) {
			int idle = 0, busy = 0, gone = 0;
			for (size_t i = 0; i < n; i++) {
				idle += strcmp(w[i].state, "idle") == 0 && w[i].job == 0;
				busy += strcmp(w[i].state, "busy") == 0;
				gone += strcmp(w[i].state, "unreachable") == 0;
			}
			printf("workers  %zu in the pool: %d idle, %d busy, %d unreachable\n", n,
			       idle, busy, gone);
		}
		free(w);
	}
	return EXIT_OK;
}

/* ------------------------------------------------------------------- main -- */

enum {
	OPT_SERVER = 256,
	OPT_TOKEN,
	OPT_TIMEOUT,
	OPT_JSON,
	OPT_FOLLOW,
	OPT_STEP,
	OPT_EVERY,
	OPT_TLS_CA,
	OPT_TLS_CERT,
	OPT_TLS_NAME,
	OPT_INSECURE,
	OPT_VERSION,
	OPT_STAGES,
	OPT_MICROBATCHES,
};

/* parse_list reads "1,2,4" into out (at most 8 positive ints). */
static int parse_list(const char *s, int *out, int *n)
{
	char *end;
	*n = 0;
	while (*s) {
		long v;
		errno = 0;
		v = strtol(s, &end, 10);
		if (errno != 0 || end == s || v < 1 || v > 1 << 20 || *n == 8 ||
		    (*end != ',' && *end != '\0'))
			return -1;
		out[(*n)++] = (int)v;
		s = *end == ',' ? end + 1 : end;
	}
	return *n > 0 ? 0 : -1;
}

static int parse_int64(const char *s, int64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoll(s, &end, 10);
	return errno == 0 && end != s && *end == '\0' ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"server", required_argument, 0, OPT_SERVER},
	    {"token", required_argument, 0, OPT_TOKEN},
	    {"timeout", required_argument, 0, OPT_TIMEOUT},
	    {"json", no_argument, 0, OPT_JSON},
	    {"follow", no_argument, 0, OPT_FOLLOW},
	    {"step", required_argument, 0, OPT_STEP},
	    {"every", required_argument, 0, OPT_EVERY},
	    {"output", required_argument, 0, 'o'},
	    {"tls-ca", required_argument, 0, OPT_TLS_CA},
	    {"tls-cert", required_argument, 0, OPT_TLS_CERT},
	    {"tls-server-name", required_argument, 0, OPT_TLS_NAME},
	    {"insecure", no_argument, 0, OPT_INSECURE},
	    {"help", no_argument, 0, 'h'},
	    {"version", no_argument, 0, OPT_VERSION},
	    {"stages", required_argument, 0, OPT_STAGES},
	    {"microbatches", required_argument, 0, OPT_MICROBATCHES},
	    {0, 0, 0, 0}};
	cli a = {.step = -1};
	bool step_given = false, help = false;
	const command *k;
	const char *cmd;
	char **args;
	int nargs, opt, rv;
	uint64_t id = 0;
	double secs;
	pipeclient_err e;

	/* A closed pipe (pipeclient ... | head) ends us quietly, as for cat. */
	signal(SIGPIPE, SIG_DFL);
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":o:h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_SERVER:
			a.opts.url = optarg;
			break;
		case OPT_TOKEN:
			a.opts.token = optarg;
			break;
		case OPT_TIMEOUT:
			secs = strtod(optarg, NULL);
			if (!(secs > 0 && secs < 1e6))
				return usage_error("--timeout: %s is not a number of seconds",
				                   optarg);
			a.opts.timeout_ms =
			    (int)(secs * 1000 + 0.5) > 0 ? (int)(secs * 1000 + 0.5) : 1;
			break;
		case OPT_JSON:
			a.json = true;
			break;
		case OPT_FOLLOW:
			a.follow = true;
			break;
		case OPT_STEP:
			if (parse_int64(optarg, &a.step) != 0 || a.step < -1)
				return usage_error("--step: %s is not a step", optarg);
			step_given = true;
			break;
		case OPT_EVERY:
			if (parse_int64(optarg, &a.every) != 0 || a.every < 1)
				return usage_error("--every: %s is not a positive count", optarg);
			break;
		case 'o':
			a.output = optarg;
			break;
		case OPT_TLS_CA:
			a.opts.tls_ca_file = optarg;
			break;
		case OPT_TLS_CERT:
			a.opts.tls_cert_file = optarg;
			break;
		case OPT_TLS_NAME:
			a.opts.tls_server_name = optarg;
			break;
		case OPT_INSECURE:
			a.opts.tls_insecure = true;
			break;
		case 'h':
			help = true; /* after the loop: the command's text, if one is named */
			break;
		case OPT_VERSION:
			printf("pipeclient %s (protocol %d)\n", PIPECLIENT_VERSION,
			       PIPECLIENT_PROTOCOL);
			return EXIT_OK;
		case OPT_STAGES:
			if (parse_list(optarg, a.stages, &a.n_stages) != 0)
				return usage_error(
				    "--stages: \"%s\" is not a list of counts like 1,2,4", optarg);
			break;
		case OPT_MICROBATCHES:
			if (parse_list(optarg, a.microbatches, &a.n_microbatches) != 0)
				return usage_error(
				    "--microbatches: \"%s\" is not a list of counts like 4,8",
				    optarg);
			break;
		case ':':
			return usage_error("%s needs a value", argv[optind - 1]);
		default:
			return usage_error("unknown option %s", argv[optind - 1]);
		}
	}
	/* `pipeclient help [COMMAND]` is `pipeclient [COMMAND] --help`. */
	if (optind < argc && strcmp(argv[optind], "help") == 0) {
		if (argc - optind > 2)
			return usage_error("help takes one COMMAND");
		help = true;
		optind++;
	}
	if (help && optind >= argc) {
		fputs(usage_text, stdout);
		return EXIT_OK;
	}
	if (optind >= argc)
		return usage_error("no command");
	cmd = argv[optind];
	args = argv + optind + 1;
	nargs = argc - optind - 1;
	if ((k = find_command(cmd)) == NULL)
		return usage_error("unknown command \"%s\"", cmd);
	usage_cmd = k->name;
	if (help) {
		fputs(k->usage, stdout);
		return EXIT_OK;
	}

	/* Check the command line completely before touching the network. */
	if (k->nargs == 0 && nargs != 0)
		return usage_error("%s takes no arguments", cmd);
	if (strcmp(cmd, "submit") == 0 || strcmp(cmd, "plan") == 0) {
		if (nargs != 1)
			return usage_error("%s takes one job FILE", cmd);
	} else if (strcmp(cmd, "drain") == 0) {
		if (nargs != 1)
			return usage_error("drain takes one worker URL");
	} else if (k->nargs == 1) {
		if (nargs != 1)
			return usage_error("%s takes one JOB id", cmd);
		if (parse_job(args[0], &id) != 0)
			return usage_error("%s: \"%s\" is not a job id", cmd, args[0]);
		if (strcmp(cmd, "checkpoint") == 0 && (a.output == NULL || a.output[0] == '\0'))
			return usage_error("checkpoint needs -o FILE");
	}
	if (a.follow && strcmp(cmd, "submit") != 0)
		return usage_error("--follow goes with submit only");
	if ((a.n_stages || a.n_microbatches) && strcmp(cmd, "plan") != 0)
		return usage_error("--stages and --microbatches go with plan only");
	if ((step_given || a.output) && strcmp(cmd, "checkpoint") != 0)
		return usage_error("--step and -o go with checkpoint only");

	a.tty = isatty(STDOUT_FILENO) && !a.json;
	if ((e = pipeclient_connect(&a.c, &a.opts)) != PIPECLIENT_OK) {
		rv = report(&a, e);
		/* A URL nng cannot use, or TLS options without tls+tcp://. */
		return e == PIPECLIENT_ERR_INVALID ? EXIT_USAGE : rv;
	}

	if (strcmp(cmd, "submit") == 0)
		rv = cmd_submit(&a, args[0]);
	else if (strcmp(cmd, "plan") == 0)
		rv = cmd_plan(&a, args[0]);
	else if (strcmp(cmd, "status") == 0)
		rv = cmd_status(&a, id);
	else if (strcmp(cmd, "list") == 0)
		rv = cmd_list(&a);
	else if (strcmp(cmd, "queue") == 0)
		rv = cmd_queue(&a);
	else if (strcmp(cmd, "workers") == 0)
		rv = cmd_workers(&a);
	else if (strcmp(cmd, "drain") == 0)
		rv = cmd_drain(&a, args[0]);
	else if (strcmp(cmd, "cancel") == 0)
		rv = cmd_cancel(&a, id);
	else if (strcmp(cmd, "watch") == 0)
		rv = follow(&a, id);
	else if (strcmp(cmd, "checkpoint") == 0)
		rv = cmd_checkpoint(&a, id);
	else if (strcmp(cmd, "checkpoints") == 0)
		rv = cmd_checkpoints(&a, id);
	else
		rv = cmd_info(&a);
	pipeclient_close(a.c);
	if (fflush(stdout) != 0 && rv == EXIT_OK)
		rv = EXIT_ERROR;
	return rv;
}
