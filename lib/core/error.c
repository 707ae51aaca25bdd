/* error.c - error code tables and the thread-local error detail. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const messages[] = {
#define PT_ERR_MSG(name, msg) msg,
    PT_ERRORS(PT_ERR_MSG)
#undef PT_ERR_MSG
};
static const char *const names[] = {
#define PT_ERR_NAME(name, msg) #name,
    PT_ERRORS(PT_ERR_NAME)
#undef PT_ERR_NAME
};
_Static_assert(sizeof(messages) / sizeof(messages[0]) == PT_ERR_COUNT, "error table");

static _Thread_local char detail[1024];
static _Thread_local pt_err last_code;

const char *pt_strerror(pt_err e)
{
	if ((unsigned)e >= PT_ERR_COUNT)
		return "unknown error";
	return messages[e];
}

const char *pt_err_name(pt_err e)
{
	if ((unsigned)e >= PT_ERR_COUNT)
		return "PT_ERR_UNKNOWN";
	return names[e];
}

pt_err pt_set_error(pt_err e, const char *fmt, ...)
{
	va_list ap;
	char tmp[sizeof(detail)];

	/* Format into a temporary so fmt may safely reference pt_last_error(). */
	va_start(ap, fmt);
	vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	memcpy(detail, tmp, sizeof(detail));
	last_code = e;
	return e;
}

const char *pt_last_error(void)
{
	return detail;
}

pt_err pt_last_code(void)
{
	return last_code;
}

void pt_clear_error(void)
{
	detail[0] = '\0';
	last_code = PT_OK;
}
