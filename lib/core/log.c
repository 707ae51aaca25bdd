/* log.c - leveled logging with timestamps, as text or JSON lines (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int threshold = -1;
static atomic_int log_format = PT_LOG_FORMAT_TEXT;

void pt_log_set_format(pt_log_format format)
{
	atomic_store(&log_format, (int)format);
}

pt_err pt_log_format_parse(const char *name, pt_log_format *out)
{
	if (strcmp(name, "text") == 0)
		*out = PT_LOG_FORMAT_TEXT;
	else if (strcmp(name, "json") == 0)
		*out = PT_LOG_FORMAT_JSON;
	else
		return pt_set_error(PT_ERR_INVALID, "log format \"%s\" (text, json)", name);
	return PT_OK;
}

/* json_escape copies s into out (cap bytes, NUL-terminated) as the inside of
 * a JSON string; control bytes become \u00XX. Truncates on a whole escape. */
static void json_escape(char *out, size_t cap, const char *s)
{
	size_t o = 0;

	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		char tmp[8];
		size_t n;
		if (ch == '"' || ch == '\\') {
			tmp[0] = '\\';
			tmp[1] = (char)ch;
			n = 2;
		} else if (ch < 0x20) {
			n = (size_t)snprintf(tmp, sizeof(tmp), "\\u%04x", ch);
		} else {
			tmp[0] = (char)ch;
			n = 1;
		}
		if (o + n + 1 > cap)
			break;
		memcpy(out + o, tmp, n);
		o += n;
	}
	out[o] = '\0';
}

/* ids_of reads a leading "job N" and a following "stage M" (or ", stage M")
 * from msg; absent ids stay -1. */
static void ids_of(const char *msg, long long *job, long long *stage)
{
	char *end;
	const char *p;

	*job = *stage = -1;
	if (strncmp(msg, "job ", 4) != 0 || msg[4] < '0' || msg[4] > '9')
		return;
	*job = strtoll(msg + 4, &end, 10);
	p = end;
	while (*p == ' ' || *p == ',' || *p == ':')
		p++;
	if (strncmp(p, "stage ", 6) == 0 && p[6] >= '0' && p[6] <= '9')
		*stage = strtoll(p + 6, NULL, 10);
}

pt_err pt_log_level_parse(const char *name, pt_log_level *out)
{
	static const char *const names[] = {"debug", "info", "warn", "error", "off"};
	for (int i = 0; i <= PT_LOG_OFF; i++)
		if (strcmp(name, names[i]) == 0) {
			*out = (pt_log_level)i;
			return PT_OK;
		}
	return pt_set_error(PT_ERR_INVALID, "log level \"%s\" (debug, info, warn, error, off)",
	                    name);
}

static int level_from_env(void)
{
	const char *s = getenv("PIPETRAIN_LOG_LEVEL");
	pt_log_level l = PT_LOG_INFO;
	if (s != NULL)
		pt_log_level_parse(s, &l);
	return (int)l;
}

void pt_log_set_level(pt_log_level level)
{
	atomic_store(&threshold, (int)level);
}

pt_log_level pt_log_level_get(void)
{
	int t = atomic_load_explicit(&threshold, memory_order_relaxed);
	if (t < 0) {
		t = level_from_env();
		atomic_store(&threshold, t);
	}
	return (pt_log_level)t;
}

void pt_log_write(pt_log_level level, const char *fmt, ...)
{
	static const char *const tags[] = {"debug", "info", "warn", "error", "off"};
	char msg[2048];
	char stamp[32];
	struct timespec ts;
	struct tm tm;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	if (atomic_load_explicit(&log_format, memory_order_relaxed) == PT_LOG_FORMAT_JSON) {
		char esc[sizeof(msg) * 2], ids[64] = "";
		long long job, stage;
		int n = 0;

		json_escape(esc, sizeof(esc), msg);
		ids_of(msg, &job, &stage);
		if (job >= 0)
			n = snprintf(ids, sizeof(ids), ",\"job\":%lld", job);
		if (stage >= 0)
			snprintf(ids + n, sizeof(ids) - (size_t)n, ",\"stage\":%lld", stage);
		fprintf(stderr, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"msg\":\"%s\"%s}\n", stamp,
		        ts.tv_nsec / 1000000, tags[level], esc, ids);
		return;
	}
	/* One event, one line: a job name or path a client chose may hold a
	 * newline that would forge the next line (JSON escapes them above). */
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	fprintf(stderr, "%s.%03ldZ %s %s\n", stamp, ts.tv_nsec / 1000000, tags[level], msg);
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool pt_log_limit_pass(pt_log_limit *l)
{
	double now = mono_s();
	bool pass;

	pthread_mutex_lock(&l->mu);
	if (now - l->start >= 1.0) {
		l->start = now;
		l->lines = 0;
	}
	pass = l->lines < l->per_s;
	if (pass)
		l->lines++;
	else
		l->suppressed++;
	pthread_mutex_unlock(&l->mu);
	return pass;
}

uint64_t pt_log_limit_suppressed(pt_log_limit *l, bool force)
{
	uint64_t n = 0;

	pthread_mutex_lock(&l->mu);
	if (l->suppressed && (force || mono_s() - l->start >= 1.0)) {
		n = l->suppressed;
		l->suppressed = 0;
	}
	pthread_mutex_unlock(&l->mu);
	return n;
}

bool pt_log_clean(char *out, size_t n, const char *text)
{
	size_t i;

	if (n == 0)
		return text[0] != '\0';
	for (i = 0; text[i] && i + 1 < n; i++)
		out[i] = (unsigned char)text[i] < 0x20 || text[i] == 0x7f ? '?' : text[i];
	out[i] = '\0';
	return text[i] != '\0';
}
