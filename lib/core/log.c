/* log.c - leveled logging with timestamps. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int threshold = -1;

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
	fprintf(stderr, "%s.%03ldZ %s %s\n", stamp, ts.tv_nsec / 1000000, tags[level], msg);
}
