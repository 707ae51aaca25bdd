/* checkpoint.h - model checkpoints as safetensors files.
 *
 * PATH holds the weights under PyTorch state_dict names ("0.weight" is
 * (out, in)), so `model.load_state_dict(safetensors.torch.load_file(PATH))`
 * works on the equivalent torch.nn.Sequential with no conversion.
 * PATH.state (also safetensors) holds the training state: optimizer moments
 * per parameter ("exp_avg.0.weight", ...) and the step. Both files carry
 * __metadata__ with format, schema_version, job and step, and are written
 * atomically with a SHA-256 of their data (see safetensors.h).
 */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include "model.h"
#include "optim.h"
#include "safetensors.h"

#define PT_CHECKPOINT_SCHEMA_VERSION "1"

typedef struct pt_checkpoint_info {
	char job[64];
	int64_t step;
} pt_checkpoint_info;

/* pt_checkpoint_save writes PATH and, when o is not NULL, PATH.state. A sync
 * boundary (queued ops are flushed). Blocking. */
pt_err pt_checkpoint_save(const char *path, pt_model *m, pt_optimizer *o,
                          const pt_checkpoint_info *info);

/* pt_checkpoint_save_tensors writes PATH from named tensors (host, in the
 * model's order) with the same metadata as pt_checkpoint_save: for writers
 * that hold the weights apart from a model (a snapshot); file_hex and
 * file_size (either may be NULL) get the written file's SHA-256 and size.
 * Blocking. */
pt_err pt_checkpoint_save_tensors(const char *path, const pt_st_tensor *entries, size_t n,
                                  const pt_checkpoint_info *info, char file_hex[65],
                                  uint64_t *file_size);

/* pt_checkpoint_save_pair is pt_checkpoint_save_tensors that first writes
 * `states` with `smeta` to PATH.state (the same as pt_safetensors_write).
 * The three hashes the two files need (each data section's for its header,
 * the weights file's) are taken before either is written, two at a time
 * (pt_sha256_update2): the .state's data beside the weights', then beside
 * the weights file's. Where the weights are the first bytes of the states
 * (one stage: the parameters lead its state), their hash is a copy of the
 * .state's taken on the way. When the weights cannot be written, the .state
 * just written is deleted. Blocking. */
pt_err pt_checkpoint_save_pair(const char *path, const pt_st_tensor *entries, size_t n,
                               const pt_checkpoint_info *info, const pt_st_tensor *states,
                               size_t n_states, const pt_st_meta *smeta, size_t n_smeta,
                               char file_hex[65], uint64_t *file_size);

/* pt_checkpoint_remove_orphans deletes each NAME.safetensors.state in dir
 * that has no NAME.safetensors beside it (a write that failed or was cut off
 * between the two files) and returns how many it deleted. Not while a pair
 * is being written into dir. */
int pt_checkpoint_remove_orphans(const char *dir);

/* pt_checkpoint_load reads weights from PATH into m (every parameter must be
 * present with its exact shape) and, when o is not NULL, the training state
 * from PATH.state, restoring the optimizer's step. info may be NULL. */
pt_err pt_checkpoint_load(const char *path, pt_model *m, pt_optimizer *o, pt_checkpoint_info *info);

#endif
