/* rng.h - counter-based random numbers (Philox4x32-10).
 *
 * A value depends only on (seed, stream, counter), so any element of any
 * stream can be drawn independently and in any order: a seed fixes every
 * initial weight and every dropout mask, whatever the thread count.
 */
#ifndef PT_RNG_H
#define PT_RNG_H

#include <stdint.h>

typedef struct pt_rng {
	uint64_t seed;
	uint64_t stream;  /* e.g. a layer index or a (step, layer) pair */
	uint64_t counter; /* advances by one per 4 x 32-bit block drawn */
} pt_rng;

/* pt_rng_init sets a generator at counter 0 of the given stream. */
void pt_rng_init(pt_rng *r, uint64_t seed, uint64_t stream);

/* pt_philox returns the 4 words of block `counter` of (seed, stream). Pure. */
void pt_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);

/* pt_rng_uniform fills out[n] with floats in [lo, hi) and advances r. */
void pt_rng_uniform(pt_rng *r, float *out, int64_t n, float lo, float hi);

/* pt_rng_normal fills out[n] with N(mean, std^2) (Box-Muller) and advances r. */
void pt_rng_normal(pt_rng *r, float *out, int64_t n, float mean, float std);

/* pt_rng_u32 returns the next 32 random bits. */
uint32_t pt_rng_u32(pt_rng *r);

/* pt_u32_to_unit maps 32 random bits to a float in [0, 1) with 24-bit resolution. */
static inline float pt_u32_to_unit(uint32_t x)
{
	return (float)(x >> 8) * (1.0f / 16777216.0f);
}

#endif
