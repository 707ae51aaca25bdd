/* backend.c - the backend registry (see backend.h). The only file in lib/
 * that asks whether CUDA was compiled in: with PT_HAVE_CUDA it forwards to
 * the launchers of lib/ops/cuda; without it, each CUDA entry point is a stub
 * returning PT_ERR_UNSUPPORTED.
 */
#include "backend.h"
#include "dispatch.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "runtime.h"
#include "sha256.h"

#ifdef PT_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_ops.h"
#endif

/* Every operand of c on one device, which is returned in *dev. */
static pt_err call_device(const pt_op_call *c, pt_device *dev)
{
	bool first = true;
	for (int pass = 0; pass < 2; pass++) {
		int n = pass == 0 ? c->n_out : c->n_in;
		for (int i = 0; i < n; i++) {
			const pt_tensor *t = pass == 0 ? c->out[i] : c->in[i];
			pt_device d;
			if (t == NULL)
				continue;
			d = t->storage->device;
			if (first) {
				*dev = d;
				first = false;
			} else if (d.kind != dev->kind || d.index != dev->index) {
				char a[32], b[32];
				return pt_set_error(PT_ERR_INVALID, "%s: operands on %s and %s",
				                    pt_op_name(c->op),
				                    pt_device_str(a, sizeof(a), *dev),
				                    pt_device_str(b, sizeof(b), d));
			}
		}
	}
	if (first)
		*dev = PT_CPU;
	return PT_OK;
}

#ifdef PT_HAVE_CUDA

bool pt_backend_compiled(pt_device_kind kind)
{
	return kind == PT_DEV_CPU || kind == PT_DEV_CUDA;
}

pt_err pt_backend_device_count(pt_device_kind kind, int *n)
{
	if (kind == PT_DEV_CPU) {
		*n = 1;
		return PT_OK;
	}
	if (kind != PT_DEV_CUDA) {
		*n = 0;
		return pt_set_error(PT_ERR_UNSUPPORTED, "device kind %d", (int)kind);
	}
	if (ptc_device_count(n) != 0)
		return pt_set_error(PT_ERR_UNSUPPORTED, "no CUDA device (%s)", ptc_last_error());
	return PT_OK;
}

pt_err pt_backend_device_memory(pt_device dev, uint64_t *total)
{
	size_t n = 0;

	*total = 0;
	if (dev.kind != PT_DEV_CUDA)
		return pt_set_error(PT_ERR_INVALID, "pt_backend_device_memory: not a device");
	PT_TRY(pt_backend_check_device(dev));
	if (ptc_device_memory(dev.index, &n) != 0)
		return pt_set_error(PT_ERR_UNSUPPORTED, "cuda:%d: memory: %s", dev.index,
		                    ptc_last_error());
	*total = n;
	return PT_OK;
}

static pt_err cuda_fail(pt_device dev, const char *what)
{
	return pt_set_error(PT_ERR_BACKEND, "cuda:%d: %s: %s", dev.index, what, ptc_last_error());
}

pt_err pt_backend_alloc(pt_device dev, size_t nbytes, void **out)
{
	*out = NULL;
	if (dev.kind != PT_DEV_CUDA)
		return pt_set_error(PT_ERR_INVALID, "pt_backend_alloc: not a device");
	/* No device (or no driver): PT_ERR_UNSUPPORTED, as in a build without CUDA. */
	PT_TRY(pt_backend_check_device(dev));
	if (ptc_alloc(dev.index, nbytes, out) != 0)
		return pt_set_error(PT_ERR_NOMEM, "cuda:%d: %zu bytes: %s", dev.index, nbytes,
		                    ptc_last_error());
	return PT_OK;
}

void pt_backend_free(pt_device dev, void *p)
{
	if (p != NULL && dev.kind == PT_DEV_CUDA && ptc_free(dev.index, p) != 0)
		fprintf(stderr, "pipetrain: cuda:%d: free failed: %s\n", dev.index,
		        ptc_last_error());
}

pt_err pt_backend_copy(void *dst, pt_device dst_dev, const void *src, pt_device src_dev,
                       size_t nbytes)
{
	int kind;
	pt_device dev = dst_dev.kind == PT_DEV_CPU ? src_dev : dst_dev;
	if (dst_dev.kind == PT_DEV_CPU && src_dev.kind == PT_DEV_CPU) {
		memmove(dst, src, nbytes);
		return PT_OK;
	}
	if (src_dev.kind == PT_DEV_CPU)
		kind = PTC_H2D;
	else if (dst_dev.kind == PT_DEV_CPU)
		kind = PTC_D2H;
	else if (src_dev.index == dst_dev.index)
		kind = PTC_D2D;
	else
		return pt_set_error(PT_ERR_UNSUPPORTED, "copy from cuda:%d to cuda:%d",
		                    src_dev.index, dst_dev.index);
	if (ptc_memcpy(dev.index, dst, src, nbytes, kind) != 0)
		return cuda_fail(dev, "copy");
	return PT_OK;
}

pt_err pt_backend_sync(pt_device dev)
{
	if (dev.kind == PT_DEV_CUDA && ptc_sync(dev.index) != 0)
		return cuda_fail(dev, "synchronize");
	return PT_OK;
}

void *pt_backend_stream(pt_device dev)
{
	return dev.kind == PT_DEV_CUDA ? ptc_stream(dev.index) : NULL;
}

bool pt_backend_peer_direct(pt_device a, pt_device b)
{
	return a.kind == PT_DEV_CUDA && b.kind == PT_DEV_CUDA && ptc_peer_direct(a.index, b.index);
}

pt_err pt_backend_device_ready(pt_device dev)
{
	PT_TRY(pt_backend_check_device(dev));
	if (dev.kind == PT_DEV_CUDA && ptc_device_probe(dev.index) != 0)
		return pt_set_error(PT_ERR_UNSUPPORTED, "cuda:%d: not usable (%s)", dev.index,
		                    ptc_last_error());
	return PT_OK;
}

pt_err pt_backend_trim(pt_device dev)
{
	if (dev.kind == PT_DEV_CUDA && ptc_pool_trim(dev.index) != 0)
		return cuda_fail(dev, "trim");
	return PT_OK;
}

pt_err pt_backend_trim_all(void)
{
	if (ptc_pool_trim_all() != 0)
		return pt_set_error(PT_ERR_BACKEND, "cuda: trim: %s", ptc_last_error());
	return PT_OK;
}

pt_err pt_backend_plan(pt_op_call *c)
{
	pt_device dev;
	PT_TRY(call_device(c, &dev));
	if (dev.kind != PT_DEV_CUDA)
		return pt_set_error(PT_ERR_UNSUPPORTED, "%s: no kernel for device kind %d",
		                    pt_op_name(c->op), (int)dev.kind);
	c->kernel = cuda_op_kernel(c->op);
	c->workspace = 0;
	return c->kernel
	           ? PT_OK
	           : pt_set_error(PT_ERR_UNSUPPORTED, "%s: no CUDA kernel", pt_op_name(c->op));
}

#else /* !PT_HAVE_CUDA: CUDA is a stub that says how to get it. */

#define NO_CUDA "this build has no CUDA support (configure with -Dcuda=enabled and nvcc)"

bool pt_backend_compiled(pt_device_kind kind)
{
	return kind == PT_DEV_CPU;
}

pt_err pt_backend_device_count(pt_device_kind kind, int *n)
{
	*n = kind == PT_DEV_CPU ? 1 : 0;
	return kind == PT_DEV_CPU ? PT_OK : pt_set_error(PT_ERR_UNSUPPORTED, NO_CUDA);
}

pt_err pt_backend_device_memory(pt_device dev, uint64_t *total)
{
	*total = 0;
	if (dev.kind != PT_DEV_CUDA)
		return pt_set_error(PT_ERR_INVALID, "pt_backend_device_memory: not a device");
	return pt_set_error(PT_ERR_UNSUPPORTED, "cuda:%d: memory: " NO_CUDA, dev.index);
}

pt_err pt_backend_alloc(pt_device dev, size_t nbytes, void **out)
{
	*out = NULL;
	return pt_set_error(PT_ERR_UNSUPPORTED, "cuda:%d: device memory: " NO_CUDA, dev.index);
}

void pt_backend_free(pt_device dev, void *p)
{
}

pt_err pt_backend_copy(void *dst, pt_device dst_dev, const void *src, pt_device src_dev,
                       size_t nbytes)
{
	if (dst_dev.kind != PT_DEV_CPU || src_dev.kind != PT_DEV_CPU)
		return pt_set_error(PT_ERR_UNSUPPORTED, "device copy: " NO_CUDA);
	memmove(dst, src, nbytes);
	return PT_OK;
}

pt_err pt_backend_sync(pt_device dev)
{
	return PT_OK;
}

void *pt_backend_stream(pt_device dev)
{
	return NULL;
}

bool pt_backend_peer_direct(pt_device a, pt_device b)
{
	return false;
}

pt_err pt_backend_device_ready(pt_device dev)
{
	return pt_backend_check_device(dev);
}

pt_err pt_backend_trim(pt_device dev)
{
	return PT_OK;
}

pt_err pt_backend_trim_all(void)
{
	return PT_OK;
}

pt_err pt_backend_plan(pt_op_call *c)
{
	pt_device dev;
	PT_TRY(call_device(c, &dev));
	return pt_set_error(PT_ERR_UNSUPPORTED, "%s: %s", pt_op_name(c->op), NO_CUDA);
}

#endif

bool pt_backend_available(pt_device_kind kind)
{
	int n = 0;
	bool ok = pt_backend_device_count(kind, &n) == PT_OK && n > 0;
	if (!ok)
		pt_clear_error();
	return ok;
}

pt_err pt_backend_check_device(pt_device dev)
{
	int n = 0;
	if (dev.kind == PT_DEV_CPU)
		return PT_OK;
	if (dev.index < 0)
		return pt_set_error(PT_ERR_INVALID, "cuda:%d: negative device index", dev.index);
	if (pt_backend_device_count(dev.kind, &n) != PT_OK) {
		char detail[384];
		snprintf(detail, sizeof(detail), "%s", pt_last_error());
		return pt_set_error(PT_ERR_UNSUPPORTED, "cuda:%d: %s", dev.index, detail);
	}
	if (dev.index >= n)
		return pt_set_error(PT_ERR_RANGE, "cuda:%d: only %d CUDA device%s here", dev.index,
		                    n, n == 1 ? "" : "s");
	return PT_OK;
}

/* ------------------------------------------------------ what was picked -- */

/* The CPU's model name and whether /proc/cpuinfo lists each flag. */
static void cpu_info(char *model, size_t cap, const char *const *flags, bool *have, int n)
{
	char line[8192];
	FILE *f = fopen("/proc/cpuinfo", "r");
	snprintf(model, cap, "unknown CPU");
	for (int i = 0; i < n; i++)
		have[i] = false;
	if (f == NULL)
		return;
	bool got_model = false, got_flags = false;
	while ((!got_model || !got_flags) && fgets(line, sizeof(line), f) != NULL) {
		char *v = strchr(line, ':');
		if (v == NULL)
			continue;
		v += strspn(v + 1, " \t") + 1;
		v[strcspn(v, "\n")] = '\0';
		if (!got_model && strncmp(line, "model name", 10) == 0) {
			snprintf(model, cap, "%s", v);
			got_model = true;
		} else if (!got_flags && strncmp(line, "flags", 5) == 0) {
			for (int i = 0; i < n; i++) {
				size_t k = strlen(flags[i]);
				for (const char *p = v; (p = strstr(p, flags[i])) != NULL; p += k)
					if ((p == v || p[-1] == ' ') &&
					    (p[k] == ' ' || p[k] == '\0'))
						have[i] = true;
			}
			got_flags = true;
		}
	}
	fclose(f);
}

static const char *dnnl_isa_name(dnnl_cpu_isa_t isa)
{
	switch (isa) {
	case dnnl_cpu_isa_sse41:
		return "sse41";
	case dnnl_cpu_isa_avx:
		return "avx";
	case dnnl_cpu_isa_avx2:
		return "avx2";
	case dnnl_cpu_isa_avx2_vnni:
		return "avx2_vnni";
	case dnnl_cpu_isa_avx512_core:
		return "avx512_core";
	case dnnl_cpu_isa_avx512_core_vnni:
		return "avx512_core_vnni";
	case dnnl_cpu_isa_avx512_core_bf16:
		return "avx512_core_bf16";
	case dnnl_cpu_isa_avx512_core_amx:
		return "avx512_core_amx";
	default:
		return "other";
	}
}

const char *pt_backend_bf16(void)
{
	static const char *const flags[] = {"avx512_bf16", "amx_bf16"};
	static _Thread_local char out[200];
	const char *impl = NULL;
	bool have[2], native = pt_cpu_bf16_native(&impl);
	char model[256];

	cpu_info(model, sizeof(model), flags, have, 2);
	if (native)
		snprintf(out, sizeof(out), "native: oneDNN bf16 matmul (%s), f32 accumulation",
		         impl);
	else if (have[0] || have[1])
		snprintf(out, sizeof(out),
		         "emulated: operands rounded to bf16, fp32 GEMMs (the CPU has native bf16; "
		         "oneDNN's bf16 kernel here: %s)",
		         impl);
	else
		snprintf(out, sizeof(out),
		         "emulated: operands rounded to bf16, fp32 GEMMs (this CPU has no "
		         "AVX512_BF16 or AMX-BF16)");
	return out;
}

void pt_backend_describe(pt_device dev, char *buf, size_t cap)
{
	static const char *const flags[] = {"avx2", "avx512f", "avx512_bf16", "amx_bf16"};
	bool have[4];
	char model[256];
	const dnnl_version_t *v = dnnl_version();
	size_t o;

	cpu_info(model, sizeof(model), flags, have, 4);
	o = (size_t)snprintf(
	    buf, cap,
	    "cpu: %s, %d cores (avx2 %s, avx512f %s, avx512_bf16 %s, amx_bf16 %s); "
	    "matmul: oneDNN %d.%d.%d, %s (f32 from 16 M flops, widths to 1024: %s; else sgemm); "
	    "attention (fp32): %s, (bf16): %s; element-wise: built for x86-64-v3 (AVX2), "
	    "activations %s; "
	    "sha256: %s (pairs %s); "
	    "bf16: %s",
	    model, pt_num_cores(), have[0] ? "yes" : "no", have[1] ? "yes" : "no",
	    have[2] ? "yes" : "no", have[3] ? "yes" : "no", v ? v->major : 0, v ? v->minor : 0,
	    v ? v->patch : 0, dnnl_isa_name(dnnl_get_effective_cpu_isa()), pt_cpu_f32_gemm_impl(),
	    pt_cpu_attention_kernel(), pt_cpu_attention_bf16_kernel(), pt_cpu_activation_isa(),
	    pt_sha256_backend(), pt_sha256_pair_backend(), pt_backend_bf16());
	if (o >= cap || dev.kind != PT_DEV_CUDA)
		return;
#ifdef PT_HAVE_CUDA
	{
		char gpu[256];
		if (ptc_device_describe(dev.index, gpu, sizeof(gpu)) != 0)
			snprintf(gpu, sizeof(gpu), "unavailable (%s)", ptc_last_error());
		snprintf(buf + o, cap - o, "; cuda:%d: %s", dev.index, gpu);
	}
#else
	snprintf(buf + o, cap - o, "; cuda:%d: no CUDA support in this build", dev.index);
#endif
}
