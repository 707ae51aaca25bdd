/* checkpoint.c - weights and training state to and from safetensors. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "safetensors.h"
#include "sha256.h"

#define MAX_STATE 2

/* A view of flat optimizer state laid out like the parameter p. */
static pt_err state_view(pt_tensor *dst, pt_tensor *flat, const pt_tensor *p)
{
	return pt_tensor_init_on(dst, flat->storage, (size_t)p->offset * sizeof(float), PT_F32,
	                         p->ndim, p->shape);
}

static void meta_common(pt_st_meta *meta, char *step, size_t len, const pt_checkpoint_info *info)
{
	snprintf(step, len, "%" PRId64, info ? info->step : 0);
	meta[0] = (pt_st_meta){"format", "pipetrain"};
	meta[1] = (pt_st_meta){"schema_version", PT_CHECKPOINT_SCHEMA_VERSION};
	meta[2] = (pt_st_meta){"job", info ? info->job : ""};
	meta[3] = (pt_st_meta){"step", step};
}

static pt_err save_state(const char *path, pt_model *m, pt_optimizer *o,
                         const pt_checkpoint_info *info)
{
	const char *snames[MAX_STATE];
	pt_tensor *flat[MAX_STATE];
	int ns = pt_optimizer_state(o, snames, flat), nt = pt_model_num_tensors(m), n = 0;
	pt_st_tensor *entries = calloc((size_t)(ns * nt) + 1, sizeof(*entries));
	pt_tensor *views = calloc((size_t)(ns * nt) + 1, sizeof(*views));
	char(*names)[96] = calloc((size_t)(ns * nt) + 1, sizeof(*names));
	char spath[4096], step[32], opt_steps[32];
	pt_st_meta meta[5];
	pt_err rv = PT_OK;

	if (!entries || !views || !names) {
		rv = pt_set_error(PT_ERR_NOMEM, "checkpoint state tables");
		goto out;
	}
	for (int s = 0; s < ns && rv == PT_OK; s++)
		for (int i = 0; i < nt && rv == PT_OK; i++) {
			const char *pname;
			pt_tensor *p;
			pt_model_tensor(m, i, &pname, &p, NULL);
			snprintf(names[n], sizeof(names[n]), "%s.%s", snames[s], pname);
			if ((rv = state_view(&views[n], flat[s], p)) == PT_OK) {
				entries[n] = (pt_st_tensor){names[n], &views[n]};
				n++;
			}
		}
	if (rv != PT_OK)
		goto out;
	meta_common(meta, step, sizeof(step), info);
	snprintf(opt_steps, sizeof(opt_steps), "%" PRId64, pt_optimizer_steps(o));
	meta[4] = (pt_st_meta){"optimizer_steps", opt_steps};
	snprintf(spath, sizeof(spath), "%s.state", path);
	rv = pt_safetensors_write(spath, entries, (size_t)n, meta, 5);
out:
	for (int i = 0; views && i < n; i++)
		pt_tensor_fini(&views[i]);
	free(entries);
	free(views);
	free(names);
	return rv;
}

pt_err pt_checkpoint_save_tensors(const char *path, const pt_st_tensor *entries, size_t n,
                                  const pt_checkpoint_info *info, char file_hex[65],
                                  uint64_t *file_size)
{
	pt_st_meta meta[4];
	char step[32];
	meta_common(meta, step, sizeof(step), info);
	return pt_safetensors_write_sha256(path, entries, n, meta, 4, file_hex, file_size);
}

/* leads reports whether the parts of `w` are the first bytes of `s`, in
 * order and in place. */
static bool leads(const pt_file_part *w, size_t nw, const pt_file_part *s, size_t ns)
{
	size_t i = 0, off = 0;
	for (size_t k = 0; k < nw; k++) {
		if (w[k].len == 0)
			continue;
		while (i < ns && off == s[i].len)
			i++, off = 0;
		if (i == ns || (const char *)s[i].data + off != (const char *)w[k].data ||
		    s[i].len - off < w[k].len)
			return false;
		off += w[k].len;
	}
	return true;
}

static void digest_hex(pt_sha256_ctx *c, char hex[PT_SHA256_HEX])
{
	uint8_t d[PT_SHA256_BYTES];
	pt_sha256_final(c, d);
	pt_sha256_hex(d, hex);
}

pt_err pt_checkpoint_save_pair(const char *path, const pt_st_tensor *entries, size_t n,
                               const pt_checkpoint_info *info, const pt_st_tensor *states,
                               size_t n_states, const pt_st_meta *smeta, size_t n_smeta,
                               char file_hex[65], uint64_t *file_size)
{
	pt_st_meta meta[4];
	pt_st_plan ps, pw;
	pt_sha256_ctx st, wd, wf;
	pt_parts_cursor cs, cw;
	char step[32], spath[4200], shex[PT_SHA256_HEX], whex[PT_SHA256_HEX], fhex[PT_SHA256_HEX];
	uint64_t head;
	pt_err rv;

	memset(&pw, 0, sizeof(pw));
	meta_common(meta, step, sizeof(step), info);
	if (snprintf(spath, sizeof(spath), "%s.state", path) >= (int)sizeof(spath))
		return pt_set_error(PT_ERR_RANGE, "%s: path too long", path);
	rv = pt_st_plan_init(&ps, spath, states, n_states, smeta, n_smeta);
	if (rv == PT_OK)
		rv = pt_st_plan_init(&pw, path, entries, n, meta, 4);
	if (rv != PT_OK)
		goto out;
	/* First the .state's data beside the weights' (or, where the weights
	 * lead it, alone up to their end), as far as both go. */
	cs = (pt_parts_cursor){.parts = ps.parts + 2, .n = ps.n_parts - 2};
	cw = (pt_parts_cursor){.parts = pw.parts + 2, .n = pw.n_parts - 2};
	head = pw.data_len < ps.data_len ? pw.data_len : ps.data_len;
	pt_sha256_init(&st);
	if (pw.data_len <= ps.data_len && leads(cw.parts, cw.n, cs.parts, cs.n)) {
		pt_parts_sha256_2(&st, &cs, head, NULL, NULL, 0);
		wd = st;
	} else {
		pt_sha256_init(&wd);
		pt_parts_sha256_2(&st, &cs, head, &wd, &cw, pw.data_len);
	}
	digest_hex(&wd, whex);
	if ((rv = pt_st_plan_header(&pw, whex)) != PT_OK)
		goto out;
	/* Then the rest of the .state's data beside the whole weights file. */
	pt_sha256_init(&wf);
	pt_sha256_update(&wf, pw.parts[0].data, pw.parts[0].len);
	pt_sha256_update(&wf, pw.parts[1].data, pw.parts[1].len);
	cw = (pt_parts_cursor){.parts = pw.parts + 2, .n = pw.n_parts - 2};
	pt_parts_sha256_2(&st, &cs, ps.data_len - head, &wf, &cw, pw.data_len);
	digest_hex(&st, shex);
	digest_hex(&wf, fhex);
	if ((rv = pt_st_plan_header(&ps, shex)) == PT_OK &&
	    (rv = pt_st_plan_write(&ps, NULL, NULL)) == PT_OK) {
		/* A .state without its weights is no checkpoint (a full disk
		 * fails the second file): it goes, and takes its space along. */
		if ((rv = pt_st_plan_write(&pw, NULL, file_size)) != PT_OK)
			unlink(spath);
		else if (file_hex != NULL)
			memcpy(file_hex, fhex, PT_SHA256_HEX);
	}
out:
	pt_st_plan_fini(&ps);
	pt_st_plan_fini(&pw);
	return rv;
}

pt_err pt_checkpoint_save(const char *path, pt_model *m, pt_optimizer *o,
                          const pt_checkpoint_info *info)
{
	int nt = pt_model_num_tensors(m);
	pt_st_tensor *entries = calloc((size_t)nt + 1, sizeof(*entries));
	pt_err rv;

	if (entries == NULL)
		return pt_set_error(PT_ERR_NOMEM, "checkpoint tables");
	for (int i = 0; i < nt; i++) {
		const char *name;
		pt_tensor *p;
		pt_model_tensor(m, i, &name, &p, NULL);
		entries[i] = (pt_st_tensor){name, p};
	}
	rv = pt_checkpoint_save_tensors(path, entries, (size_t)nt, info, NULL, NULL);
	free(entries);
	if (rv == PT_OK && o != NULL)
		rv = save_state(path, m, o, info);
	return rv;
}

static pt_err load_state(const char *path, pt_model *m, pt_optimizer *o)
{
	const char *snames[MAX_STATE], *v;
	pt_tensor *flat[MAX_STATE];
	int ns = pt_optimizer_state(o, snames, flat), nt = pt_model_num_tensors(m);
	char spath[4096], name[96];
	pt_safetensors *st;
	pt_err rv = PT_OK;

	snprintf(spath, sizeof(spath), "%s.state", path);
	PT_TRY(pt_safetensors_open(&st, spath));
	for (int s = 0; s < ns && rv == PT_OK; s++)
		for (int i = 0; i < nt && rv == PT_OK; i++) {
			const char *pname;
			pt_tensor *p, view;
			pt_model_tensor(m, i, &pname, &p, NULL);
			snprintf(name, sizeof(name), "%s.%s", snames[s], pname);
			if ((rv = state_view(&view, flat[s], p)) == PT_OK) {
				rv = pt_safetensors_copy(st, name, &view);
				pt_tensor_fini(&view);
			}
		}
	if (rv == PT_OK) {
		v = pt_safetensors_meta(st, "optimizer_steps");
		if (v == NULL)
			rv = pt_set_error(PT_ERR_FORMAT, "%s: no optimizer_steps in __metadata__",
			                  spath);
		else
			pt_optimizer_set_steps(o, strtoll(v, NULL, 10));
	}
	pt_safetensors_destroy(st);
	return rv;
}

pt_err pt_checkpoint_load(const char *path, pt_model *m, pt_optimizer *o, pt_checkpoint_info *info)
{
	pt_safetensors *st;
	pt_err rv = PT_OK;
	const char *v;

	PT_TRY(pt_safetensors_open(&st, path));
	v = pt_safetensors_meta(st, "schema_version");
	if (v == NULL || strcmp(v, PT_CHECKPOINT_SCHEMA_VERSION) != 0)
		rv = pt_set_error(PT_ERR_FORMAT, "%s: checkpoint schema_version %s, expected %s",
		                  path, v ? v : "(none)", PT_CHECKPOINT_SCHEMA_VERSION);
	for (int i = 0; rv == PT_OK && i < pt_model_num_tensors(m); i++) {
		const char *name;
		pt_tensor *p;
		pt_model_tensor(m, i, &name, &p, NULL);
		rv = pt_safetensors_copy(st, name, p);
	}
	if (rv == PT_OK && info != NULL) {
		memset(info, 0, sizeof(*info));
		if ((v = pt_safetensors_meta(st, "job")) != NULL)
			snprintf(info->job, sizeof(info->job), "%s", v);
		if ((v = pt_safetensors_meta(st, "step")) != NULL)
			info->step = strtoll(v, NULL, 10);
	}
	pt_safetensors_destroy(st);
	if (rv == PT_OK && o != NULL)
		rv = load_state(path, m, o);
	return rv;
}

int pt_checkpoint_remove_orphans(const char *dir)
{
	static const char suffix[] = ".safetensors.state";
	const size_t ls = sizeof(suffix) - 1, lw = sizeof(".state") - 1;
	DIR *d = opendir(dir);
	struct dirent *e;
	int removed = 0;

	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		char weights[NAME_MAX + 1];
		size_t n = strlen(e->d_name);
		if (n <= ls || strcmp(e->d_name + n - ls, suffix) != 0)
			continue;
		memcpy(weights, e->d_name, n - lw);
		weights[n - lw] = '\0';
		if (faccessat(dirfd(d), weights, F_OK, AT_SYMLINK_NOFOLLOW) != 0 &&
		    errno == ENOENT && unlinkat(dirfd(d), e->d_name, 0) == 0)
			removed++;
	}
	closedir(d);
	return removed;
}
