/* log.h - leveled logging to stderr, one line per event.
 *
 * Two formats: text (`2026-01-02T03:04:05.678Z info message`) and JSON lines
 * (`{"ts":"...","level":"info","msg":"...","job":7,"stage":1}`) for log
 * shippers. In JSON, a message that begins with `job N` or `job N stage M`
 * also gets numeric "job"/"stage" fields, so callers keep writing plain text.
 *
 * The level is checked before any formatting. Thread-safe: each line is written
 * with one fprintf under stdio's own lock.
 */
#ifndef PT_LOG_H
#define PT_LOG_H

#include "error.h"

typedef enum pt_log_level {
	PT_LOG_DEBUG,
	PT_LOG_INFO,
	PT_LOG_WARN,
	PT_LOG_ERROR,
	PT_LOG_OFF,
} pt_log_level;

/* pt_log_set_level sets the global threshold (default PT_LOG_INFO, or the
 * PIPETRAIN_LOG_LEVEL environment variable: debug|info|warn|error|off). */
void pt_log_set_level(pt_log_level level);

/* pt_log_level_parse maps "debug", "info", "warn", "error" or "off" to a
 * level; PT_ERR_INVALID for anything else. */
pt_err pt_log_level_parse(const char *name, pt_log_level *out);

typedef enum pt_log_format {
	PT_LOG_FORMAT_TEXT,
	PT_LOG_FORMAT_JSON,
} pt_log_format;

/* pt_log_set_format selects the line format for every thread (default text). */
void pt_log_set_format(pt_log_format format);

/* pt_log_format_parse maps "text" or "json" to a format; PT_ERR_INVALID otherwise. */
pt_err pt_log_format_parse(const char *name, pt_log_format *out);

/* pt_log_level_get returns the current threshold. */
pt_log_level pt_log_level_get(void);

void pt_log_write(pt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define PT_LOG(level, ...)                                                                         \
	do {                                                                                       \
		if ((level) >= pt_log_level_get())                                                 \
			pt_log_write((level), __VA_ARGS__);                                        \
	} while (0)
#define pt_debug(...) PT_LOG(PT_LOG_DEBUG, __VA_ARGS__)
#define pt_info(...)  PT_LOG(PT_LOG_INFO, __VA_ARGS__)
#define pt_warn(...)  PT_LOG(PT_LOG_WARN, __VA_ARGS__)
#define pt_error(...) PT_LOG(PT_LOG_ERROR, __VA_ARGS__)

#endif
