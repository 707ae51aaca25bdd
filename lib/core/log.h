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

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
/* A rate limit for a kind of line that strangers can cause (a refused
 * request): at most per_s such lines a second are written; the others are
 * counted, and pt_log_limit_suppressed hands over the count once its second
 * is over, for one summary line. Thread-safe. */
typedef struct pt_log_limit {
	pthread_mutex_t mu;
	int per_s;
	double start;        /* when the current one-second window began (monotonic s) */
	int lines;           /* lines written in it */
	uint64_t suppressed; /* lines held back since the last summary */
} pt_log_limit;

#define PT_LOG_LIMIT_INIT(n)                                                                       \
	{                                                                                          \
		PTHREAD_MUTEX_INITIALIZER, (n), 0.0, 0, 0                                          \
	}

/* pt_log_limit_pass: true when one more line may be written now (false:
 * it is counted as suppressed). */
bool pt_log_limit_pass(pt_log_limit *l);

/* pt_log_limit_suppressed returns the lines held back and resets the count,
 * once their window is over (force: at once); 0 otherwise. */
uint64_t pt_log_limit_suppressed(pt_log_limit *l, bool force);

/* pt_log_clean copies text a client chose (a name, a path, an error about
 * them) into out[n] for a log line: control characters become '?', so it
 * stays one line. Returns true when it had to be cut short. */
bool pt_log_clean(char *out, size_t n, const char *text);

#define pt_debug(...) PT_LOG(PT_LOG_DEBUG, __VA_ARGS__)
#define pt_info(...)  PT_LOG(PT_LOG_INFO, __VA_ARGS__)
#define pt_warn(...)  PT_LOG(PT_LOG_WARN, __VA_ARGS__)
#define pt_error(...) PT_LOG(PT_LOG_ERROR, __VA_ARGS__)

#endif
