/* rng.c - Philox4x32-10 (Salmon et al., SC'11), the generator PyTorch and
 * cuRAND use on GPUs; identical results on every backend by construction. */
#include "rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void pt_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4])
{
	uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
	uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
	uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);

	for (int i = 0; i < 10; i++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
		uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n1 = (uint32_t)p1;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		uint32_t n3 = (uint32_t)p0;
		c0 = n0;
		c1 = n1;
		c2 = n2;
		c3 = n3;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

void pt_rng_init(pt_rng *r, uint64_t seed, uint64_t stream)
{
	r->seed = seed;
	r->stream = stream;
	r->counter = 0;
}

uint32_t pt_rng_u32(pt_rng *r)
{
	uint32_t w[4];
	pt_philox(r->seed, r->stream, r->counter++, w);
	return w[0];
}

/* Fills below this many elements stay on the calling thread. */
#define PAR_MIN (1 << 16)

void pt_rng_uniform(pt_rng *r, float *out, int64_t n, float lo, float hi)
{
	const uint64_t c0 = r->counter;
	const int64_t blocks = n > 0 ? (n + 3) / 4 : 0;
	/* Element i is word i % 4 of block c0 + i / 4: any split gives the same values. */
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
	for (int64_t b = 0; b < blocks; b++) {
		uint32_t w[4];
		pt_philox(r->seed, r->stream, c0 + (uint64_t)b, w);
		for (int64_t j = 0; j < 4 && 4 * b + j < n; j++)
			out[4 * b + j] = lo + (hi - lo) * pt_u32_to_unit(w[j]);
	}
	r->counter = c0 + (uint64_t)blocks;
}

void pt_rng_normal(pt_rng *r, float *out, int64_t n, float mean, float std)
{
	const uint64_t c0 = r->counter;
	const int64_t pairs = n > 0 ? (n + 1) / 2 : 0;
	/* Elements 2p and 2p + 1 come from block c0 + p (Box-Muller), so the
	 * values do not depend on how the pairs are split between threads. */
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
	for (int64_t p = 0; p < pairs; p++) {
		uint32_t w[4];
		pt_philox(r->seed, r->stream, c0 + (uint64_t)p, w);
		/* u1 in (0, 1] so log() is finite. */
		double u1 = ((double)w[0] + 1.0) / 4294967296.0;
		double u2 = (double)w[1] / 4294967296.0;
		double rad = sqrt(-2.0 * log(u1));
		out[2 * p] = (float)(mean + std * rad * cos(2.0 * M_PI * u2));
		if (2 * p + 1 < n)
			out[2 * p + 1] = (float)(mean + std * rad * sin(2.0 * M_PI * u2));
	}
	r->counter = c0 + (uint64_t)pairs;
}
