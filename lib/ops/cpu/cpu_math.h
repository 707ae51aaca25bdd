/* cpu_math.h - vectorisable float math for the CPU kernels.
 *
 * glibc's expf/tanhf are scalar calls that stop GCC from vectorising loops;
 * these inline versions are branch-free arithmetic so `#pragma omp simd`
 * loops compile to AVX2. Accuracy: pt_expf within 2 ulp over [-87, 88]; it
 * saturates outside and gives NaN for NaN.
 */
#ifndef PT_CPU_MATH_H
#define PT_CPU_MATH_H

#include <stdint.h>

static inline float pt_expf(float x)
{
	/* exp(x) = 2^n * exp(r), r = x - n ln2, |r| <= ln2/2; degree-6 polynomial. */
	x = x > 88.7f ? 88.7f : x; /* two selects, so loops stay branch-free */
	x = x < -87.3f ? -87.3f : x;
	float n = __builtin_rintf(x * 1.44269504088896341f); /* nearest-even mode */
	/* NaN (a diverged run: lr 1e38) would reach the shift below as INT_MIN,
	 * a shift of a negative value; any finite n will do, p carries the NaN. */
	n = n == n ? n : 0.0f;
	float r = x - n * 0.693145751953125f;
	r = r - n * 1.428606765330187045e-06f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	/* 2^n through the exponent bits; a union (not memcpy) keeps the loop vectorisable. */
	union {
		int32_t i;
		float f;
	} two_n = {.i = ((int32_t)n + 127) << 23};
	return p * two_n.f;
}

static inline float pt_tanhf(float x)
{
	/* tanh(x) = 1 - 2 / (exp(2x) + 1); saturates correctly at both ends. */
	return 1.0f - 2.0f / (pt_expf(2.0f * x) + 1.0f);
}

static inline float pt_sigmoidf(float x)
{
	return 1.0f / (1.0f + pt_expf(-x));
}

/* pt_softmax_row writes y[0..n) = softmax(x[0..n)) and returns the sum of
 * exp(x - max) (for log-sum-exp) in *sum and the max in *mx. */
static inline void pt_softmax_row(float *y, const float *x, int64_t n, float *mx_out,
                                  float *sum_out)
{
	float mx = -__builtin_inff(), sum = 0.0f;
	/* A max is exact in any order: vectorised, the same value. */
#pragma omp simd reduction(max : mx)
	for (int64_t j = 0; j < n; j++)
		mx = x[j] > mx ? x[j] : mx;
#pragma omp simd reduction(+ : sum)
	for (int64_t j = 0; j < n; j++) {
		y[j] = pt_expf(x[j] - mx);
		sum += y[j];
	}
	float inv = 1.0f / sum;
#pragma omp simd
	for (int64_t j = 0; j < n; j++)
		y[j] *= inv;
	if (mx_out)
		*mx_out = mx;
	if (sum_out)
		*sum_out = sum;
}

#define PT_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

#endif
