/* device.h - device names: "cpu" and "cuda:N" to pt_device and back.
 *
 * Plain string handling with no backend behind it, so the job-spec and
 * stage-config codec (and libpipeclient with it) can name devices without
 * linking the backend registry. Whether a device exists is backend.h's
 * pt_backend_check_device.
 *
 * Thread-safety: both functions may be called from any thread.
 */
#ifndef PT_DEVICE_H
#define PT_DEVICE_H

#include <stddef.h>

#include "error.h"
#include "tensor.h"

/* pt_device_parse reads "cpu", "cuda" (= cuda:0) or "cuda:N" into *out.
 * PT_ERR_INVALID for anything else. Does not check that the device exists. */
pt_err pt_device_parse(const char *s, pt_device *out);

/* pt_device_str formats dev as "cpu" or "cuda:N" into buf; returns buf. */
char *pt_device_str(char *buf, size_t len, pt_device dev);

#endif
