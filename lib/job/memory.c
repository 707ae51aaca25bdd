/* memory.c - admission control: the peak memory a job needs, estimated from
 * its spec and the shapes of its data without allocating anything, and the
 * memory limit of this host.
 *
 * The estimate restates what the code allocates (kept next to it here so a
 * change there shows up in the figures of test_job's measurement test):
 * model.c's parameter, gradient, activation-slot and work arenas (tensors
 * rounded to 16 floats), optim.c's state (AdamW m and v, SGD momentum),
 * stage.c's slots (sync: all m microbatches; semi-async and async: p, the
 * most a 1F1B-like schedule keeps in flight; recompute keeps one in the
 * model) and async weight stashes (one copy of the parameters per slot plus
 * the live one), runner.c's full model for evaluation and checkpoints (batch
 * of one microbatch), the data as loaded (npy: raw, converted, split;
 * tokens: the whole file), the stages' gathered state at checkpoints, and a
 * runtime constant per stage thread and per job (thread stacks, malloc
 * arenas, oneDNN kernels), measured on this build. Arithmetic is in double,
 * so absurd sizes give absurd figures, never an overflow. Limits: stages on
 * placement.workers live on the workers, whose memory is not known here
 * (only the coordinator's part is charged to this host); device (CUDA)
 * stages are charged to their device (its global memory, whatever else
 * uses it); the device figures have not been compared with a measurement.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "fileio.h"
#include "job.h"
#include "job_internal.h"
#include "npy.h"

/* Measured on this build (test_job_memory_estimate, VmHWM over the process's
 * RSS before the job): what a job costs beyond its tensors. The first stage
 * thread costs the same on every CPU; each further one depends on the sgemm
 * kernels oneDNN picks (their packing buffers stay in the thread's malloc
 * arena): 1.6 MiB with AVX-512 (Zen 4), 0.45 MiB with AVX2 (Zen 2/3). */
#define RUNTIME_JOB_BYTES (4.6 * 1048576) /* coordinator, oneDNN, first arenas, a stage */

static double runtime_stage_bytes(void)
{
#if defined(__x86_64__) || defined(__i386__)
	if (__builtin_cpu_supports("avx512f"))
		return 1.6 * 1048576;
#endif
	return 0.45 * 1048576;
}

static double act_floats(pt_act_shape s, double B)
{
	double n = B * (double)(s.seq ? s.seq : 1);
	return s.features ? n * (double)s.features : n;
}

static double round16(double n)
{
	return ceil(n / 16.0) * 16.0;
}

/* model_bytes sizes pt_model_create(layers [first, last), batch B, slots):
 * *params the floats of one arena, *slot one activation slot's bytes,
 * *work the work arena's bytes, *in and *out the stage's activations. */
static void model_bytes(const pt_job_spec *s, pt_act_shape input, int first, int last, double B,
                        double *params, double *slot, double *work, double *in, double *out)
{
	pt_act_shape cur = input;
	double p = 0, sl = 0, mx = 0, scratch = 16, operands = 0;
	bool rounded = pt_job_spec_precision(s) != PT_PREC_FP32; /* bf16, tf32 */
	pt_device dev = {.kind = s->device && strncmp(s->device, "cuda:", 5) == 0 ? PT_DEV_CUDA
	                                                                          : PT_DEV_CPU};
	pt_dtype mm_in = pt_layer_mm_input(pt_job_spec_precision(s), dev);

	for (int i = 0; i < last; i++) {
		const pt_layer_spec *ls = &s->layers[i];
		const pt_layer_vt *vt = pt_layer_vtable(ls->kind);
		pt_param_info pinfo[PT_LAYER_MAX_PARAMS];
		pt_saved_info info[PT_LAYER_MAX_SAVED];
		pt_act_shape next = cur;
		int np, ns;

		vt->infer(ls, cur, &next);
		if (i < first) {
			cur = next;
			continue;
		}
		if (i == first)
			mx = *in = act_floats(cur, B);
		np = vt->params(ls, pinfo);
		double big = 0; /* the layer's largest parameter */
		for (int k = 0; k < np; k++) {
			double n = (double)pinfo[k].shape[0] *
			           (pinfo[k].ndim == 2 ? (double)pinfo[k].shape[1] : 1.0);
			p += round16(n);
			big = fmax(big, n);
		}
		/* A product's two operands copied to the thread's buffer
		 * (cpu_gemm_prec): in bf16 and tf32 always (rounded), in fp32 those with
		 * rows 512k floats long (padded by 16, so 33/32 of them). Each is an
		 * activation-sized tensor (the input, the output, a saved tensor or
		 * a gradient of one) or a parameter: at most act + max(act, big). */
		double act = fmax(act_floats(cur, B), act_floats(next, B));
		bool wide = (cur.features > 0 && cur.features % 512 == 0) ||
		            (next.features > 0 && next.features % 512 == 0);
		for (int k = 0; k < np; k++)
			for (int d = 0; d < pinfo[k].ndim; d++)
				wide = wide || pinfo[k].shape[d] % 512 == 0;
		sl += round16(act_floats(next, B));
		ns = vt->saved(ls, cur, (int64_t)B, mm_in, info);
		for (int k = 0; k < ns; k++) {
			double sn = 1;
			for (int d = 0; d < info[k].ndim; d++)
				sn *= (double)info[k].shape[d];
			sl += round16(floor(sn * (double)pt_dtype_size(info[k].dtype) / 4));
			act = fmax(act, sn);
			wide = wide ||
			       (info[k].ndim > 1 && info[k].shape[info[k].ndim - 1] % 512 == 0);
		}
		if (wide)
			operands = fmax(operands, (act + fmax(act, big)) * 33 / 32);
		else if (rounded)
			operands = fmax(operands, act + fmax(act, big));
		mx = fmax(mx, act_floats(next, B));
		scratch = fmax(scratch, (double)vt->scratch(ls, cur, (int64_t)B));
		cur = next;
	}
	*params = p;
	*slot = sl * 4;
	*work = (2 * round16(mx) + scratch + round16(ceil(operands))) * 4;
	*out = act_floats(cur, B);
}

double pt_job_model_bytes(const pt_job_spec *s, pt_act_shape input, int first, int last, double B)
{
	double fp, fslot, fwork, fin, fout;
	model_bytes(s, input, first, last, B, &fp, &fslot, &fwork, &fin, &fout);
	return 2 * fp * 4 + fslot + fwork + (fin + fout) * 4;
}

static double data_bytes(const pt_job_spec *s, const pt_job_data_shape *d)
{
	double N = (double)d->rows, batch = (double)s->batch_size, b = 0;

	if (s->data.format != PT_DATA_NPY) {
		double T = (double)s->data.seq_len;
		double mb = (double)(s->batch_size / s->microbatches);
		/* The files, one batch and one evaluation microbatch (i64 inputs,
		 * targets) with its logits read back. */
		return (double)d->token_bytes + 2 * batch * T * 8 + 2 * mb * T * 8;
	}
	/* Raw arrays; a converted copy when the dtype is not the dataset's
	 * (f32 features; i64 class labels or f32 targets); the train/held
	 * subsets (a second copy); the split permutation and the epoch order;
	 * one batch. */
	b += (double)(d->x_bytes + d->y_bytes);
	if (d->x_dtype != PT_F32)
		b += N * (double)d->features * 4;
	if (d->y_ndim == 1 ? d->y_dtype != PT_I64 : d->y_dtype != PT_F32)
		b += N * (double)d->y_cols * (d->y_ndim == 1 ? 8 : 4);
	b += N * (double)d->features * 4 + N * (double)d->y_cols * (d->y_ndim == 1 ? 8 : 4);
	b += 2 * N * 8;
	b += batch * (double)d->features * 4 + batch * (double)d->y_cols * 8;
	return b;
}

static uint64_t to_bytes(double b)
{
	return b >= 1.8e19 ? UINT64_MAX : (uint64_t)ceil(b);
}

pt_err pt_job_memory_estimate(const pt_job_spec *s, const pt_job_data_shape *d, pt_job_memory *out)
{
	int first[PT_MAX_STAGES + 1];
	int v = pt_job_spec_virtual_stages(s), p = s->stages * v, m = s->microbatches;
	int il_slots = 0; /* interleaved: the most microbatches a chunk holds */
	double B, total_params = 0, host = 0, fp, fslot, fwork, fin, fout;
	int host_stages = 0;
	int opt_copies = s->optim.kind == PT_OPTIM_ADAMW ? 2 : s->optim.momentum != 0.0f ? 1 : 0;
	bool remote = s->n_workers > 0, device = s->device && strncmp(s->device, "cuda:", 5) == 0;
	pt_act_shape in = pt_job_spec_input_shape(s, d->features);

	memset(out, 0, sizeof(*out));
	if (p < 1 || p > PT_MAX_STAGES || m < 1 || s->batch_size < m)
		return pt_set_error(PT_ERR_INVALID, "memory estimate: validate the spec first");
	B = (double)(s->batch_size / m);
	if (s->boundaries != NULL)
		memcpy(first, s->boundaries, sizeof(int) * ((size_t)p + 1));
	else
		PT_TRY(pt_partition(s->layers, s->n_layers, in, p, first));
	if (v > 1)
		PT_TRY(pt_pipe_interleaved_slots(s->stages, v, m, &il_slots));
	out->n_stages = p;
	for (int st = 0; st < p; st++) {
		pt_job_memory_stage *e = &out->stages[st];
		/* GPipe holds m microbatches, 1F1B p, ZB-H1 p + 1 and each a weight
		 * stash (counted as a second slot: an upper bound). */
		bool zb = s->schedule != NULL &&
		          (strcmp(s->schedule, "zb-h1") == 0 || strcmp(s->schedule, "auto") == 0);
		bool all = s->schedule != NULL ? strcmp(s->schedule, "gpipe") == 0
		                               : s->mode == PT_MODE_SYNC;
		int slots = v > 1 ? il_slots : zb ? p + 1 : all ? m : p;
		double P, state;

		model_bytes(s, in, first[st], first[st + 1], B, &fp, &fslot, &fwork, &fin, &fout);
		P = fp * 4;
		e->first = first[st];
		e->last = first[st + 1];
		e->n_slots = slots;
		e->params = to_bytes(P);
		e->grads = to_bytes(P);
		e->optimizer = to_bytes(P * opt_copies);
		e->stash =
		    to_bytes(s->mode == PT_MODE_ASYNC && s->weight_stashing ? P * (slots + 1) : 0);
		/* The model's slots; per stage slot the received input and output
		 * gradient it keeps until the backward. */
		e->activations = to_bytes((s->recompute ? 1 : slots) * fslot * (zb ? 2 : 1) +
		                          slots * (fin + fout) * 4);
		/* The work arena; a forward output and an input gradient in flight;
		 * the state copy a checkpoint gathers. */
		state = P * (1 + opt_copies);
		e->workspace = to_bytes(fwork + (fin + fout) * 4 + state);
		e->total = to_bytes(P * (2 + opt_copies) + (double)e->stash +
		                    (double)e->activations + (double)e->workspace);
		total_params += fp;
		if (!remote && !device)
			host += (double)e->total + (host_stages++ > 0 ? runtime_stage_bytes() : 0);
	}
	/* The coordinator: the full model (parameters, gradients, one slot of
	 * one microbatch, work arena), every stage's gathered state, the data,
	 * the last stage's outputs of m microbatches and, where an output cannot
	 * take its own loss gradient (its last layer's backward reads it: not a
	 * Linear, and no recompute, which sends a copy), as many gradients. */
	model_bytes(s, in, 0, s->n_layers, B, &fp, &fslot, &fwork, &fin, &fout);
	bool in_place = s->layers[s->n_layers - 1].kind == PT_LAYER_LINEAR || s->recompute;
	out->coordinator = to_bytes(fp * 8 + fslot + fwork + total_params * 4 * (1 + opt_copies) +
	                            data_bytes(s, d) + (in_place ? 1 : 2) * (double)m * fout * 4 +
	                            RUNTIME_JOB_BYTES);
	out->host = to_bytes(host + (double)out->coordinator);
	return PT_OK;
}

/* header_info reads the npy header of the file a spec field names, opened
 * confined as validation opens it (pt_job_open_data). */
static pt_err header_info(const char *field, const char *path, const char *root, bool any_path,
                          pt_dtype *dt, int *nd, int64_t *shape)
{
	int fd;
	pt_err rv;

	PT_TRY(pt_job_open_data(field, path, root, any_path, &fd));
	rv = pt_npy_info_fd(fd, path, dt, nd, shape);
	close(fd);
	if (rv != PT_OK)
		return pt_set_error(rv, "%s: %s", field, pt_last_error());
	return PT_OK;
}

pt_err pt_job_data_shape_read(const pt_job_spec *s, const char *files_root, bool any_path,
                              pt_job_data_shape *out)
{
	int64_t shape[PT_MAX_DIMS];
	int nd, fd;
	pt_dtype dt;
	size_t size;
	pt_err rv;

	memset(out, 0, sizeof(*out));
	if (s->data.format != PT_DATA_NPY) {
		if (s->data.tokens == NULL)
			return pt_set_error(PT_ERR_INVALID, "data.tokens: required");
		PT_TRY(pt_job_open_data("data.tokens", s->data.tokens, files_root, any_path, &fd));
		rv = pt_file_fd_size(fd, s->data.tokens, &size);
		close(fd);
		if (rv != PT_OK)
			return pt_set_error(rv, "data.tokens: %s", pt_last_error());
		out->token_bytes = (uint64_t)size;
		if (s->data.val_tokens == NULL)
			return PT_OK;
		PT_TRY(pt_job_open_data("data.val_tokens", s->data.val_tokens, files_root, any_path,
		                        &fd));
		rv = pt_file_fd_size(fd, s->data.val_tokens, &size);
		close(fd);
		if (rv != PT_OK)
			return pt_set_error(rv, "data.val_tokens: %s", pt_last_error());
		out->token_bytes += (uint64_t)size;
		return PT_OK;
	}
	if (s->data.features == NULL || s->data.labels == NULL)
		return pt_set_error(PT_ERR_INVALID, "data.features, data.labels: required");
	PT_TRY(
	    header_info("data.features", s->data.features, files_root, any_path, &dt, &nd, shape));
	if (nd != 2)
		return pt_set_error(PT_ERR_SHAPE, "data.features: %d dimensions, expected 2", nd);
	out->rows = shape[0];
	out->features = shape[1];
	out->x_dtype = dt;
	out->x_bytes = (uint64_t)shape[0] * (uint64_t)shape[1] * pt_dtype_size(dt);
	PT_TRY(header_info("data.labels", s->data.labels, files_root, any_path, &dt, &nd, shape));
	out->y_dtype = dt;
	out->y_ndim = nd;
	out->y_cols = nd >= 2 ? shape[1] : 1;
	out->y_bytes = (uint64_t)shape[0] * (uint64_t)out->y_cols * pt_dtype_size(dt);
	return PT_OK;
}

void pt_job_memory_format(char *buf, size_t cap, uint64_t bytes)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 6) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, cap, "%" PRIu64 " B", bytes);
	else
		snprintf(buf, cap, "%.1f %s (%" PRIu64 " bytes)", v, units[u], bytes);
}

/* admit_devices checks in-process CUDA stages against their devices'
 * memory: stage st runs on cuda:((N + st) mod devices), as runner.c places
 * them, so a device holds the sum of its stages. */
static pt_err admit_devices(const pt_job_spec *s, const pt_job_memory *e)
{
	pt_device dev;
	int count = 0;

	if (s->n_workers > 0 || s->device == NULL || strncmp(s->device, "cuda:", 5) != 0)
		return PT_OK;
	PT_TRY(pt_device_parse(s->device, &dev));
	PT_TRY(pt_backend_device_count(PT_DEV_CUDA, &count));
	for (int k = 0; k < count && k < e->n_stages; k++) {
		double need = 0;
		uint64_t total = 0;
		char a[64], b[64];
		for (int st = 0; st < e->n_stages; st++)
			if ((dev.index + st) % count == (dev.index + k) % count)
				need += (double)e->stages[st].total;
		PT_TRY(pt_backend_device_memory((pt_device){PT_DEV_CUDA, (dev.index + k) % count},
		                                &total));
		if (to_bytes(need) <= total)
			continue;
		pt_job_memory_format(a, sizeof(a), to_bytes(need));
		pt_job_memory_format(b, sizeof(b), total);
		return pt_set_error(PT_ERR_RANGE,
		                    "memory: the job's stages on cuda:%d need an estimated %s, "
		                    "more than the device's %s",
		                    (dev.index + k) % count, a, b);
	}
	return PT_OK;
}

pt_err pt_job_admit(const pt_job_spec *s, const char *files_root, bool any_path,
                    uint64_t host_limit, pt_job_memory *est)
{
	pt_job_data_shape d;
	pt_job_memory e;
	char need[64], lim[64], where[96] = "";

	PT_TRY(pt_job_data_shape_read(s, files_root, any_path, &d));
	PT_TRY(pt_job_memory_estimate(s, &d, &e));
	if (est != NULL)
		*est = e;
	if (host_limit == 0 || e.host <= host_limit)
		return admit_devices(s, &e);
	/* Name the biggest stage: that is what to split or shrink. */
	{
		int big = 0;
		for (int i = 1; i < e.n_stages; i++)
			if (e.stages[i].total > e.stages[big].total)
				big = i;
		pt_job_memory_format(need, sizeof(need), e.stages[big].total);
		snprintf(where, sizeof(where), "; the largest stage, %d, needs %s", big, need);
	}
	pt_job_memory_format(need, sizeof(need), e.host);
	pt_job_memory_format(lim, sizeof(lim), host_limit);
	return pt_set_error(PT_ERR_RANGE,
	                    "memory: the job needs an estimated %s of host memory, more than "
	                    "the server's limit of %s (--memory-limit)%s",
	                    need, lim, where);
}

pt_err pt_job_memory_parse(const char *text, uint64_t *bytes)
{
	char *end;
	unsigned long long n;
	uint64_t mul = 1;

	*bytes = 0;
	errno = 0;
	if (text == NULL || text[0] < '0' || text[0] > '9')
		return pt_set_error(PT_ERR_INVALID, "'%s' is not a size (bytes, or K, M, G, T)",
		                    text ? text : "");
	n = strtoull(text, &end, 10);
	if (errno != 0)
		return pt_set_error(PT_ERR_RANGE, "'%s': too large", text);
	switch (*end) {
	case '\0':
		break;
	case 'K':
	case 'k':
		mul = 1ull << 10;
		break;
	case 'M':
	case 'm':
		mul = 1ull << 20;
		break;
	case 'G':
	case 'g':
		mul = 1ull << 30;
		break;
	case 'T':
	case 't':
		mul = 1ull << 40;
		break;
	default:
		return pt_set_error(PT_ERR_INVALID, "'%s' is not a size (bytes, or K, M, G, T)",
		                    text);
	}
	if (*end != '\0' && end[1] != '\0' && !(end[1] == 'i' && end[2] == 'B' && !end[3]) &&
	    !(end[1] == 'B' && !end[2]))
		return pt_set_error(PT_ERR_INVALID, "'%s' is not a size (bytes, or K, M, G, T)",
		                    text);
	if (n > UINT64_MAX / mul)
		return pt_set_error(PT_ERR_RANGE, "'%s': too large", text);
	*bytes = (uint64_t)n * mul;
	return PT_OK;
}

/* read_u64 reads the first number of a one-line file ("max": none). */
static bool read_u64(const char *path, uint64_t *v)
{
	char line[64];
	FILE *f = fopen(path, "r");
	bool ok = false;

	if (f == NULL)
		return false;
	if (fgets(line, sizeof(line), f) != NULL && line[0] >= '0' && line[0] <= '9') {
		*v = strtoull(line, NULL, 10);
		ok = true;
	}
	fclose(f);
	return ok;
}

/* group_limit takes the smallest limit in file `name` of the group
 * mount + path and its ancestors up to mount (limits nest), into *best
 * when below it (0: none yet); true when one was found. */
static bool group_limit(const char *mount, const char *path, const char *name, uint64_t *best)
{
	char dir[512], file[600];
	bool found = false;
	uint64_t v;

	snprintf(dir, sizeof(dir), "%s%s", mount, path);
	for (;;) {
		size_t n = strlen(dir);
		while (n > strlen(mount) && dir[n - 1] == '/')
			dir[--n] = '\0';
		snprintf(file, sizeof(file), "%s/%s", dir, name);
		if (read_u64(file, &v) && v > 0 && (*best == 0 || v < *best)) {
			*best = v;
			found = true;
		}
		if (n <= strlen(mount))
			break;
		*strrchr(dir, '/') = '\0';
	}
	return found;
}

pt_err pt_job_memory_host_limit(uint64_t *bytes, const char **source)
{
	uint64_t total = 0, cg = 0;
	char line[512];
	FILE *f;

	*bytes = 0;
	*source = "MemTotal";
	if ((f = fopen("/proc/meminfo", "r")) != NULL) {
		while (fgets(line, sizeof(line), f) != NULL)
			if (sscanf(line, "MemTotal: %" SCNu64 " kB", &total) == 1) {
				total *= 1024;
				break;
			}
		fclose(f);
	}
	/* This process's groups (/proc/self/cgroup): v2 "0::PATH" (memory.max,
	 * "max": none), v1 "N:...memory...:PATH" (memory.limit_in_bytes, "no
	 * limit" being a huge page-rounded value, above MemTotal). */
	if ((f = fopen("/proc/self/cgroup", "r")) != NULL) {
		while (fgets(line, sizeof(line), f) != NULL) {
			char *path = strrchr(line, ':'), *ctl = strchr(line, ':');
			if (path == NULL || ctl == NULL || path == ctl)
				continue;
			line[strcspn(line, "\n")] = '\0';
			*path++ = '\0';
			ctl++;
			if (ctl[0] == '\0' &&
			    group_limit("/sys/fs/cgroup", path, "memory.max", &cg))
				*source = "cgroup memory.max";
			else if (strstr(ctl, "memory") != NULL &&
			         group_limit("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
			                     &cg))
				*source = "cgroup memory.limit_in_bytes";
		}
		fclose(f);
	}
	if (cg > 0 && (total == 0 || cg < total)) {
		*bytes = cg;
		return PT_OK;
	}
	*source = "MemTotal";
	if (total == 0)
		return pt_set_error(PT_ERR_IO, "memory limit: no cgroup limit and no MemTotal in "
		                               "/proc/meminfo");
	*bytes = total;
	return PT_OK;
}
