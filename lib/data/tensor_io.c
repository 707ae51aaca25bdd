/* tensor_io.c - host I/O helpers that touch tensors (syncing queued ops
 * first). Apart from fileio.c so plain file helpers carry no tensor code. */
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

pt_err pt_file_tensor_bytes(const pt_tensor *t, const void **bytes, void **tmp)
{
	size_t nb = pt_tensor_nbytes(t);
	pt_err rv;

	*bytes = NULL;
	*tmp = NULL;
	PT_TRY(pt_tensor_sync(t));
	if (t->storage->device.kind != PT_DEV_CPU)
		return pt_set_error(PT_ERR_UNSUPPORTED,
		                    "writing a device tensor: copy it to the host first");
	if (pt_tensor_is_contiguous(t)) {
		*bytes = pt_tensor_data(t);
		return PT_OK;
	}
	*tmp = malloc(nb ? nb : 1);
	if (*tmp == NULL)
		return pt_set_error(PT_ERR_NOMEM, "copy of a %zu-byte tensor", nb);
	if ((rv = pt_tensor_read(t, *tmp, nb)) != PT_OK) {
		free(*tmp);
		*tmp = NULL;
		return rv;
	}
	*bytes = *tmp;
	return PT_OK;
}

pt_err pt_data_write_begin(pt_tensor *t, const char *what)
{
	if (t->storage == NULL)
		return pt_set_error(PT_ERR_INVALID, "%s: tensor has no storage", what);
	if (t->storage->device.kind != PT_DEV_CPU)
		return pt_set_error(PT_ERR_UNSUPPORTED, "%s: host write into a device tensor",
		                    what);
	if (!pt_tensor_is_contiguous(t))
		return pt_set_error(PT_ERR_INVALID, "%s: host write into a non-contiguous tensor",
		                    what);
	if (pt_tensor_state(t) == PT_PENDING)
		PT_TRY(pt_tensor_sync(t));
	return PT_OK;
}

void pt_data_write_end(pt_tensor *t)
{
	atomic_store(&t->storage->state, PT_READY);
}
