/* tokens.h - flat token files and random windows of them for language models.
 *
 * A token file is raw little-endian uint16 or uint32 tokens, nothing else; the
 * caller says which (the file cannot). The whole file is read into memory and
 * validated once. Sampling is a pure function of (seed, step): the same step
 * always gives the same batch, whatever happened before.
 */
#ifndef PT_TOKENS_H
#define PT_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

typedef struct pt_tokens {
	pt_dtype dtype;     /* PT_U16 or PT_U32 */
	int64_t count;      /* number of tokens */
	void *data;         /* count tokens, owned */
	uint32_t max_token; /* largest token in the file (0 when empty) */
} pt_tokens;

/* pt_tokens_load reads path as tokens of dtype (PT_U16 or PT_U32). The file
 * size must be a multiple of the token size, and when vocab_size > 0 every
 * token must be < vocab_size (PT_ERR_FORMAT naming the first bad position).
 * The caller releases tk with pt_tokens_fini. Blocking. */
pt_err pt_tokens_load(pt_tokens *tk, const char *path, pt_dtype dtype, int64_t vocab_size);

/* pt_tokens_load_fd is pt_tokens_load on the open file fd (the caller still
 * owns fd); path is only used in messages. */
pt_err pt_tokens_load_fd(pt_tokens *tk, int fd, const char *path, pt_dtype dtype,
                         int64_t vocab_size);

/* pt_tokens_fini frees the tokens. NULL-safe; safe after a failed load. */
void pt_tokens_fini(pt_tokens *tk);

/* pt_tokens_at returns token i (0 <= i < count; not checked). */
uint32_t pt_tokens_at(const pt_tokens *tk, int64_t i);

/* pt_tokens_sample fills input (B, T) and target (B, T), both PT_I64 and
 * contiguous, caller-allocated, with B windows of T+1 consecutive tokens:
 * row b starts at an offset drawn from Philox (seed, stream = step, counter =
 * b), uniform over the count - T possible starts; target is input shifted by
 * one. Needs count >= T + 1. Allocates nothing; a host write (queued ops on
 * the outputs are flushed first). tk may be shared by threads. */
pt_err pt_tokens_sample(const pt_tokens *tk, uint64_t seed, uint64_t step, pt_tensor *input,
                        pt_tensor *target);

/* pt_tokens_write_bytes writes n bytes as a token file of dtype (PT_U16 or
 * PT_U32), one token per byte (byte-level LM, vocabulary 256), atomically. */
pt_err pt_tokens_write_bytes(const char *path, const void *bytes, size_t n, pt_dtype dtype);

#endif
