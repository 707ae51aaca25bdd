/* error.h - pipetrain error codes and the per-thread error message.
 *
 * Every fallible function returns a pt_err (0 is success). The detail of the
 * last failure on a thread is kept in a thread-local buffer: pt_last_error().
 * Codes are one X-macro list so names, messages and the count cannot drift.
 */
#ifndef PT_ERROR_H
#define PT_ERROR_H

#include <stddef.h>

#define PT_ERRORS(X)                                                                               \
	X(PT_OK, "success")                                                                        \
	X(PT_ERR_NOMEM, "out of memory")                                                           \
	X(PT_ERR_INVALID, "invalid argument")                                                      \
	X(PT_ERR_SHAPE, "shape mismatch")                                                          \
	X(PT_ERR_DTYPE, "unsupported or mismatched dtype")                                         \
	X(PT_ERR_RANGE, "value out of range")                                                      \
	X(PT_ERR_STATE, "operation not valid in this state")                                       \
	X(PT_ERR_PENDING_INVALID, "tensor is invalid: the deferred flush that computes it failed") \
	X(PT_ERR_IO, "input/output error")                                                         \
	X(PT_ERR_FORMAT, "malformed input")                                                        \
	X(PT_ERR_NOTFOUND, "not found")                                                            \
	X(PT_ERR_UNSUPPORTED, "not supported")                                                     \
	X(PT_ERR_TIMEOUT, "timed out")                                                             \
	X(PT_ERR_CLOSED, "object is closed")                                                       \
	X(PT_ERR_BACKEND, "backend failure")                                                       \
	X(PT_ERR_OVERFLOW, "size overflow")                                                        \
	X(PT_ERR_NUMERIC, "non-finite value")                                                      \
	X(PT_ERR_BUSY, "busy: try again later")

typedef enum pt_err {
#define PT_ERR_ENUM(name, msg) name,
	PT_ERRORS(PT_ERR_ENUM)
#undef PT_ERR_ENUM
	    PT_ERR_COUNT
} pt_err;

/* pt_strerror returns the fixed message of a code; unknown codes get a fixed
 * "unknown error" string. Thread-safe, never NULL. */
const char *pt_strerror(pt_err e);

/* pt_err_name returns the code's identifier ("PT_ERR_SHAPE"). Thread-safe. */
const char *pt_err_name(pt_err e);

/* pt_set_error records a formatted detail for the calling thread and returns
 * e, so callers can write `return pt_set_error(PT_ERR_SHAPE, "...", ...)`. */
pt_err pt_set_error(pt_err e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* pt_last_error returns the detail of the calling thread's last failure, or ""
 * when none was recorded. The pointer is valid until the next pt_set_error on
 * this thread. */
const char *pt_last_error(void);

/* pt_last_code returns the code of the calling thread's last pt_set_error. */
pt_err pt_last_code(void);

/* pt_clear_error forgets the calling thread's last error. */
void pt_clear_error(void);

/* PT_TRY evaluates a pt_err expression and returns it from the enclosing
 * function when it is not PT_OK. */
#define PT_TRY(expr)                                                                               \
	do {                                                                                       \
		pt_err pt_try_rv_ = (expr);                                                        \
		if (pt_try_rv_ != PT_OK)                                                           \
			return pt_try_rv_;                                                         \
	} while (0)

#endif
