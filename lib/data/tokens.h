/* tokens.h - flat token files and random windows of them for language models.
 *
 * A token file is either raw little-endian uint16 or uint32 tokens, nothing
 * else (nanoGPT's .bin: the caller says which), or an llm.c .bin: a header of
 * 256 little-endian int32 - header[0] the magic 20240520, header[1] the
 * version (1: uint16 tokens, 2: uint32), header[2] the token count - then
 * exactly that many tokens. A file whose first int32 is the magic is taken as
 * llm.c's and its header checked strictly. The whole file is read into memory
 * and validated once. Sampling is a pure function of (seed, step): the same
 * step always gives the same batch, whatever happened before.
 */
#ifndef PT_TOKENS_H
#define PT_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

/* llm.c's token file header: PT_TOKENS_HEADER_INTS int32, the first the magic. */
#define PT_TOKENS_MAGIC        20240520
#define PT_TOKENS_HEADER_INTS  256
#define PT_TOKENS_HEADER_BYTES (PT_TOKENS_HEADER_INTS * 4)

/* The dtype argument that lets the file decide: an llm.c header's width,
 * else raw uint16 (nanoGPT). */
#define PT_TOKENS_AUTO PT_DTYPE_COUNT

/* What a token file holds, from its header and size. */
typedef struct pt_tokens_info {
	pt_dtype dtype; /* PT_U16 or PT_U32 */
	int64_t count;  /* number of tokens */
	int version;    /* the llm.c header's version (1 or 2), or 0: raw tokens */
} pt_tokens_info;

typedef struct pt_tokens {
	pt_dtype dtype;     /* PT_U16 or PT_U32 */
	int version;        /* llm.c header version, or 0: raw tokens */
	int64_t count;      /* number of tokens */
	void *data;         /* count tokens, owned */
	uint32_t max_token; /* largest token in the file (0 when empty) */
} pt_tokens;

/* pt_tokens_info_fd reads the header and size of the token file fd (path only
 * for messages) as pt_tokens_load would take it, reading no tokens. dtype is
 * PT_U16, PT_U32 or PT_TOKENS_AUTO. PT_ERR_FORMAT when the file has an llm.c
 * header that is not valid (version not 1 or 2, a count that disagrees with
 * the file's size) or says another width than dtype, or when a raw file is
 * not a whole number of tokens. Blocking. */
pt_err pt_tokens_info_fd(int fd, const char *path, pt_dtype dtype, pt_tokens_info *out);

/* pt_tokens_load reads path as tokens of dtype (PT_U16, PT_U32 or
 * PT_TOKENS_AUTO; see pt_tokens_info_fd), without an llm.c header. When
 * vocab_size > 0 every token must be < vocab_size (PT_ERR_FORMAT naming the
 * first bad position). The caller releases tk with pt_tokens_fini. Blocking. */
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

/* pt_tokens_sample_range is pt_tokens_sample over the tokens [lo, hi) only:
 * row b starts at lo + (Philox draw mod (hi - lo - T)), so no window reaches
 * token hi. Needs 0 <= lo, hi <= count and hi - lo >= T + 1. */
pt_err pt_tokens_sample_range(const pt_tokens *tk, int64_t lo, int64_t hi, uint64_t seed,
                              uint64_t step, pt_tensor *input, pt_tensor *target);

/* pt_tokens_split gives the first token of the held-out part of a file of
 * count tokens: count - floor(held_out * count) (held_out in [0, 1)). */
int64_t pt_tokens_split(int64_t count, double held_out);

/* pt_tokens_n_windows gives the number of fixed windows of seq_len + 1 tokens
 * in [lo, hi): window i covers tokens lo + i*seq_len .. lo + (i+1)*seq_len
 * (consecutive windows share one token: the last target of one is the first
 * input of the next). */
int64_t pt_tokens_n_windows(int64_t lo, int64_t hi, int64_t seq_len);

/* pt_tokens_windows fills rows [0, n) of input and target (B, T), i64 and
 * contiguous, with the fixed windows first .. first + n - 1 of [lo, ...)
 * (pt_tokens_n_windows); rows [n, B) get input 0 and target pad. Needs
 * n <= B and the windows within the file. */
pt_err pt_tokens_windows(const pt_tokens *tk, int64_t lo, int64_t first, int64_t n, int64_t pad,
                         pt_tensor *input, pt_tensor *target);

/* pt_tokens_write_bytes writes n bytes as a token file of dtype (PT_U16 or
 * PT_U32), one token per byte (byte-level LM, vocabulary 256), atomically. */
pt_err pt_tokens_write_bytes(const char *path, const void *bytes, size_t n, pt_dtype dtype);

#endif
