/* backend.h - the backend registry: which device kinds this build and this
 * machine can run, device memory for pt_storage, host<->device copies, and
 * the kernel choice for ops whose operands live on a device.
 *
 * The CPU is always available. The CUDA backend exists when the library was
 * built with nvcc (meson feature `cuda`); without it every CUDA entry point
 * returns PT_ERR_UNSUPPORTED naming the missing build option. This registry
 * is the only code that knows whether CUDA was compiled in.
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef PT_BACKEND_H
#define PT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "device.h" /* pt_device_parse, pt_device_str */
#include "dispatch.h"
#include "tensor.h"

/* pt_backend_compiled returns true when support for kind is built in. */
bool pt_backend_compiled(pt_device_kind kind);

/* pt_backend_available returns true when kind is built in and this machine
 * has at least one such device (CPU: always). */
bool pt_backend_available(pt_device_kind kind);

/* pt_backend_device_count sets *n to the number of devices of kind (CPU: 1).
 * CUDA without a driver or device: PT_ERR_UNSUPPORTED, *n = 0, and the detail
 * quotes cudaGetDeviceCount's message. */
pt_err pt_backend_device_count(pt_device_kind kind, int *n);

/* pt_backend_check_device returns PT_OK when dev can be used here, else an
 * error whose detail says why in words fit for a start-up message ("cuda:0:
 * no CUDA device (cudaGetDeviceCount: ...)", "cuda:3: only 2 CUDA devices",
 * "cuda:0: this build has no CUDA support (configure with -Dcuda=enabled)"). */
pt_err pt_backend_check_device(pt_device dev);

/* pt_backend_device_memory sets *total to the memory of device dev in
 * bytes (a CUDA device's global memory). The CPU is no device here (the
 * host's limit is the job manager's): PT_ERR_INVALID; CUDA not built or
 * no such device: PT_ERR_UNSUPPORTED. */
pt_err pt_backend_device_memory(pt_device dev, uint64_t *total);

/* pt_backend_bf16 says how bf16 matrix products run on this CPU: native
 * (oneDNN's bf16 matmul, naming its kernel) or emulated (bf16-rounded
 * operands, fp32 GEMMs: bf16 numerics at fp32 speed) and why
 * (pt_cpu_bf16_native). The text is the calling thread's, until its next
 * call. */
const char *pt_backend_bf16(void);

/* pt_backend_describe writes what this machine runs and which kernels were
 * picked at run time for a server on dev: the CPU and its vector features,
 * oneDNN's ISA for matrix products, the build baseline of the element-wise
 * kernels, the SHA-256 code, and for cuda:N the GPU (ServerInfo's
 * `kernels`). Never fails: what cannot be read says so. */
void pt_backend_describe(pt_device dev, char *buf, size_t cap);

/* pt_backend_device_ready asks the device's runtime whether dev is usable now
 * (CUDA: cudaGetDeviceCount, which honours CUDA_VISIBLE_DEVICES, and
 * cudaDeviceGetAttribute on dev; no context is made). PT_OK, else an error
 * worded as pt_backend_check_device's ("cuda:0: no CUDA device (...)"). For
 * readiness probes: cheap, any thread. */
pt_err pt_backend_device_ready(pt_device dev);

/* pt_backend_trim gives the cached, unused memory of dev's pool back to the
 * driver (after waiting for dev's queued work); no-op for the CPU and in
 * builds without CUDA. pt_backend_trim_all does so for every device this
 * process has used (the job runner calls it when a job ends). Blocking. */
pt_err pt_backend_trim(pt_device dev);
pt_err pt_backend_trim_all(void);

/* pt_backend_alloc allocates nbytes of zeroed memory on dev (a non-CPU
 * device; pt_storage_create serves the CPU itself). The caller owns *out and
 * frees it with pt_backend_free on the same device. */
pt_err pt_backend_alloc(pt_device dev, size_t nbytes, void **out);

/* pt_backend_free returns p (from pt_backend_alloc on dev) to the device's
 * pool; it never blocks on the device. NULL is fine. */
void pt_backend_free(pt_device dev, void *p);

/* pt_backend_copy copies nbytes between host and a device or within one
 * device (src_dev and dst_dev each CPU or the same device). Blocks until the
 * bytes have arrived when either side is the host; device-to-device copies
 * are queued in order with the device's kernels. */
pt_err pt_backend_copy(void *dst, pt_device dst_dev, const void *src, pt_device src_dev,
                       size_t nbytes);

/* pt_backend_sync waits until every queued kernel and copy of dev is done
 * (no-op for the CPU). */
pt_err pt_backend_sync(pt_device dev);

/* pt_backend_plan picks c->kernel (and c->workspace, host bytes) for a call
 * whose tensors live on a non-CPU device. Every operand must be on that one
 * device: PT_ERR_INVALID otherwise; PT_ERR_UNSUPPORTED without the backend. */
pt_err pt_backend_plan(pt_op_call *c);

/* pt_backend_stream returns the device's compute stream (a cudaStream_t for
 * CUDA) for code that must order its own work after the kernels, or NULL. */
void *pt_backend_stream(pt_device dev);

/* pt_backend_peer_direct: whether two CUDA devices' tensors may be read and
 * written by each other's kernels (NCCL between GPUs of one process does
 * so): false when granting one's memory pool to the other failed, or
 * without CUDA. Devices that cannot reach each other at all need no grant
 * (NCCL then copies through the host) and give true. */
bool pt_backend_peer_direct(pt_device a, pt_device b);

#endif
