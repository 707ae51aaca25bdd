/* init_from.c - JobSpec.init_from: a job's initial weights from a safetensors
 * file, a checkpoint of ours or PyTorch's safetensors save_file() of the
 * state_dict of pipetrain.torch.build_model(job) (docs/model.md).
 *
 * The file must hold exactly the model's parameters under their state_dict
 * names ("<layer index>.<name>"), each F32 with the exact shape; metadata is
 * ignored. Nothing is converted: another dtype or a transposed weight is an
 * error naming the tensor, not a guess. The optimizer state is not read (the
 * job starts with a fresh optimizer; see runner.c).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "job.h"
#include "job_internal.h"
#include "model.h"
#include "safetensors.h"

/* shape_str writes "[a, b]". */
static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
	size_t o = 0;
	o += (size_t)snprintf(buf, cap, "[");
	for (int i = 0; i < ndim && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "",
		                      (long long)shape[i]);
	if (o < cap)
		snprintf(buf + o, cap - o, "]");
	return buf;
}

/* open_checked opens s->init_from under root and checks it against the
 * parameters of s's layers (names in state_dict order, then no others). */
static pt_err open_checked(const pt_job_spec *s, const char *root, bool any_path,
                           pt_safetensors **out)
{
	pt_safetensors *st;
	size_t expected = 0;
	char why[700];
	int fd;
	pt_err rv;

	*out = NULL;
	PT_TRY(pt_job_open_data("init_from", s->init_from, root, any_path, &fd));
	rv = pt_safetensors_open_fd(&st, fd, s->init_from);
	close(fd);
	if (rv != PT_OK) {
		snprintf(why, sizeof(why), "%s", pt_last_error());
		return pt_set_error(rv, "init_from: %s", why);
	}
	for (int i = 0; i < s->n_layers && rv == PT_OK; i++) {
		const pt_layer_vt *vt = pt_layer_vtable(s->layers[i].kind);
		pt_param_info info[PT_LAYER_MAX_PARAMS];
		int n = vt != NULL ? vt->params(&s->layers[i], info) : 0;
		for (int k = 0; k < n && rv == PT_OK; k++) {
			char name[64], a[64], b[64];
			int64_t shape[PT_MAX_DIMS];
			pt_dtype dt;
			int nd;
			snprintf(name, sizeof(name), "%d.%s", i, info[k].name);
			expected++;
			if (pt_safetensors_info(st, name, &dt, &nd, shape) != PT_OK) {
				rv = pt_set_error(PT_ERR_INVALID,
				                  "init_from: tensor '%s' (model[%d]) is missing",
				                  name, i);
			} else if (dt != PT_F32) {
				rv = pt_set_error(PT_ERR_INVALID,
				                  "init_from: tensor '%s': dtype %s, expected F32",
				                  name, pt_safetensors_dtype_name(dt));
			} else if (nd != info[k].ndim ||
			           memcmp(shape, info[k].shape, sizeof(int64_t) * (size_t)nd) !=
			               0) {
				rv = pt_set_error(
				    PT_ERR_INVALID, "init_from: tensor '%s': shape %s, expected %s",
				    name, shape_str(a, sizeof(a), nd, shape),
				    shape_str(b, sizeof(b), info[k].ndim, info[k].shape));
			}
		}
	}
	/* Every expected name was found once, so a larger count means extras. */
	for (size_t i = 0;
	     rv == PT_OK && expected < pt_safetensors_count(st) && i < pt_safetensors_count(st);
	     i++) {
		const char *name = pt_safetensors_name(st, i);
		const char *dot = strchr(name, '.');
		bool ours = false;
		int layer = -1;
		if (dot != NULL && sscanf(name, "%d.", &layer) == 1 && layer >= 0 &&
		    layer < s->n_layers) {
			const pt_layer_vt *vt = pt_layer_vtable(s->layers[layer].kind);
			pt_param_info info[PT_LAYER_MAX_PARAMS];
			int n = vt != NULL ? vt->params(&s->layers[layer], info) : 0;
			char pre[16];
			int pl = snprintf(pre, sizeof(pre), "%d.", layer);
			/* "01.weight" is not layer 1's "1.weight": the prefix must match */
			for (int k = 0; k < n && !ours; k++)
				ours = strncmp(name, pre, (size_t)pl) == 0 &&
				       strcmp(name + pl, info[k].name) == 0;
		}
		if (!ours)
			rv = pt_set_error(PT_ERR_INVALID,
			                  "init_from: tensor '%s' is not a parameter of this model",
			                  name);
	}
	if (rv != PT_OK) {
		pt_safetensors_destroy(st);
		return rv;
	}
	*out = st;
	return PT_OK;
}

pt_err pt_job_init_from_validate(const pt_job_spec *s, const char *root, bool any_path)
{
	pt_safetensors *st;
	if (s->init_from == NULL)
		return PT_OK;
	PT_TRY(open_checked(s, root, any_path, &st));
	pt_safetensors_destroy(st);
	return PT_OK;
}

pt_err pt_job_init_from_load(const pt_job_spec *s, const char *root, bool any_path, pt_model *m)
{
	pt_safetensors *st;
	pt_err rv = PT_OK;

	PT_TRY(open_checked(s, root, any_path, &st));
	for (int i = 0; i < pt_model_num_tensors(m) && rv == PT_OK; i++) {
		const char *name;
		pt_tensor *p;
		if ((rv = pt_model_tensor(m, i, &name, &p, NULL)) == PT_OK &&
		    (rv = pt_safetensors_copy(st, name, p)) != PT_OK) {
			char why[600];
			snprintf(why, sizeof(why), "%s", pt_last_error());
			rv = pt_set_error(rv, "init_from: %s", why);
		}
	}
	pt_safetensors_destroy(st);
	return rv;
}
