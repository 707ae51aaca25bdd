/* device.c - device names (see device.h). No backend code: the codec library
 * (libptcodec, libpipeclient's share of lib/) links this file alone. */
#include "device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pt_err pt_device_parse(const char *s, pt_device *out)
{
	char *end;
	long idx;
	if (s == NULL)
		return pt_set_error(PT_ERR_INVALID, "device: missing");
	if (strcmp(s, "cpu") == 0) {
		*out = PT_CPU;
		return PT_OK;
	}
	if (strcmp(s, "cuda") == 0) {
		*out = (pt_device){PT_DEV_CUDA, 0};
		return PT_OK;
	}
	if (strncmp(s, "cuda:", 5) != 0 || s[5] < '0' || s[5] > '9')
		return pt_set_error(PT_ERR_INVALID, "device \"%s\": expected cpu or cuda:N", s);
	errno = 0;
	idx = strtol(s + 5, &end, 10);
	if (errno != 0 || *end != '\0' || idx > 1023)
		return pt_set_error(PT_ERR_INVALID, "device \"%s\": bad CUDA device index", s);
	*out = (pt_device){PT_DEV_CUDA, (int)idx};
	return PT_OK;
}

char *pt_device_str(char *buf, size_t len, pt_device dev)
{
	if (dev.kind == PT_DEV_CPU)
		snprintf(buf, len, "cpu");
	else
		snprintf(buf, len, "cuda:%d", dev.index);
	return buf;
}
