/* cuda_elementwise.cu - fill, strided copy, scale, add, activations, dropout,
 * index checks, MSE, squared norm, AdamW and SGD.
 *
 * Element-wise kernels use grid-stride loops. The two reductions (MSE, squared
 * norm) sum in double in two fixed passes (per-block partials, then one
 * thread adds them in block order), so they are deterministic; their order
 * differs from the CPU's, hence the stated tolerance in tests/test_cuda.c.
 */
#include "cuda_common.cuh"

#define THREADS 256

template <typename T> __global__ void k_fill(T *p, int64_t n, T v)
{
	PTC_FOR(i, n)
	p[i] = v;
}

extern "C" int ptc_fill(int dev, void *p, int64_t n, int kind, double v)
{
	PTC_STREAM(dev, s);
	unsigned g = ptc_blocks(n, THREADS);
	if (n == 0)
		return 0;
	switch (kind) {
	case PTC_F32:
		k_fill<float><<<g, THREADS, 0, s>>>((float *)p, n, (float)v);
		break;
	case PTC_F64:
		k_fill<double><<<g, THREADS, 0, s>>>((double *)p, n, v);
		break;
	case PTC_I32:
		k_fill<int32_t><<<g, THREADS, 0, s>>>((int32_t *)p, n, (int32_t)v);
		break;
	case PTC_I64:
		k_fill<int64_t><<<g, THREADS, 0, s>>>((int64_t *)p, n, (int64_t)v);
		break;
	default:
		return ptc_fail("ptc_fill", "unknown element kind");
	}
	PTC_LAUNCHED("fill kernel");
	return 0;
}

struct strided_view {
	int ndim;
	int64_t shape[6], ds[6], ss[6];
};

template <typename T>
__global__ void k_copy_strided(T *dst, const T *src, int64_t n, strided_view v)
{
	PTC_FOR(i, n)
	{
		int64_t rem = i, d = 0, s = 0;
		for (int k = v.ndim - 1; k >= 0; k--) {
			int64_t idx = rem % v.shape[k];
			rem /= v.shape[k];
			d += idx * v.ds[k];
			s += idx * v.ss[k];
		}
		dst[d] = src[s];
	}
}

extern "C" int ptc_copy_strided(int dev, void *dst, const int64_t *dst_strides, const void *src,
                                const int64_t *src_strides, int ndim, const int64_t *shape,
                                size_t elem_size)
{
	PTC_STREAM(dev, s);
	strided_view v;
	int64_t n = 1;
	if (ndim > 6)
		return ptc_fail("ptc_copy_strided", "more than 6 dims");
	v.ndim = ndim;
	for (int k = 0; k < ndim; k++) {
		v.shape[k] = shape[k];
		v.ds[k] = dst_strides[k];
		v.ss[k] = src_strides[k];
		n *= shape[k];
	}
	if (n == 0)
		return 0;
	unsigned g = ptc_blocks(n, THREADS);
	switch (elem_size) {
	case 1:
		k_copy_strided<uint8_t>
		    <<<g, THREADS, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, n, v);
		break;
	case 2:
		k_copy_strided<uint16_t>
		    <<<g, THREADS, 0, s>>>((uint16_t *)dst, (const uint16_t *)src, n, v);
		break;
	case 4:
		k_copy_strided<uint32_t>
		    <<<g, THREADS, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, n, v);
		break;
	case 8:
		k_copy_strided<uint64_t>
		    <<<g, THREADS, 0, s>>>((uint64_t *)dst, (const uint64_t *)src, n, v);
		break;
	default:
		return ptc_fail("ptc_copy_strided", "element size");
	}
	PTC_LAUNCHED("strided copy kernel");
	return 0;
}

__global__ void k_scale(float *y, const float *x, int64_t n, float a)
{
	PTC_FOR(i, n)
	y[i] = a * x[i];
}

extern "C" int ptc_scale(int dev, float *y, const float *x, int64_t n, float a)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_scale<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(y, x, n, a);
	PTC_LAUNCHED("scale kernel");
	return 0;
}

__global__ void k_add(float *y, const float *a, const float *b, int64_t n, float al, float be)
{
	if (al == 1.0f && be == 1.0f) {
		PTC_FOR(i, n)
		y[i] = a[i] + b[i];
	} else {
		PTC_FOR(i, n)
		y[i] = al * a[i] + be * b[i];
	}
}

extern "C" int ptc_add(int dev, float *y, const float *a, const float *b, int64_t n, float al,
                       float be)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_add<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(y, a, b, n, al, be);
	PTC_LAUNCHED("add kernel");
	return 0;
}

__global__ void k_act_fwd(int act, float *y, const float *x, int64_t n)
{
	PTC_FOR(i, n)
	{
		float v = x[i], g;
		switch (act) {
		case 0:
			g = v > 0.0f ? v : 0.0f;
			break;
		case 1: {
			float u = PTD_GELU_K * (v + 0.044715f * v * v * v);
			g = 0.5f * v * (1.0f + ptd_tanhf(u));
			break;
		}
		case 2:
			g = ptd_tanhf(v);
			break;
		default:
			g = ptd_sigmoidf(v);
			break;
		}
		y[i] = g;
	}
}

__global__ void k_act_bwd(int act, float *dx, const float *dy, const float *x, const float *y,
                          int64_t n, bool accum)
{
	PTC_FOR(i, n)
	{
		float g;
		switch (act) {
		case 0:
			g = x[i] > 0.0f ? 1.0f : 0.0f;
			break;
		case 1: {
			float v = x[i];
			float u = PTD_GELU_K * (v + 0.044715f * v * v * v);
			float t = ptd_tanhf(u);
			float du = PTD_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
			g = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
			break;
		}
		case 2:
			g = 1.0f - y[i] * y[i];
			break;
		default:
			g = y[i] * (1.0f - y[i]);
			break;
		}
		dx[i] = accum ? dx[i] + g * dy[i] : g * dy[i];
	}
}

extern "C" int ptc_act_forward(int dev, int act, float *y, const float *x, int64_t n)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_act_fwd<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(act, y, x, n);
	PTC_LAUNCHED("activation forward kernel");
	return 0;
}

extern "C" int ptc_act_backward(int dev, int act, float *dx, const float *dy, const float *x,
                                const float *y, int64_t n, bool accum)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_act_bwd<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(act, dx, dy, x, y, n, accum);
	PTC_LAUNCHED("activation backward kernel");
	return 0;
}

/* One thread per Philox block: elements 4k..4k+3 take words 0..3 of block k. */
__global__ void k_dropout(float *out, const float *in, int64_t n, float p, uint64_t seed,
                          uint64_t stream, bool accum)
{
	float keep_scale = 1.0f / (1.0f - p);
	PTC_FOR(k, (n + 3) / 4)
	{
		uint32_t w[4];
		ptd_philox(seed, stream, (uint64_t)k, w);
		for (int j = 0; j < 4 && 4 * k + j < n; j++) {
			int64_t i = 4 * k + j;
			float m = ptd_u32_to_unit(w[j]) >= p ? keep_scale : 0.0f;
			out[i] = (accum ? out[i] : 0.0f) + in[i] * m;
		}
	}
}

__global__ void k_dropout_p0(float *out, const float *in, int64_t n, bool accum)
{
	PTC_FOR(i, n)
	out[i] = (accum ? out[i] : 0.0f) + in[i];
}

extern "C" int ptc_dropout(int dev, float *out, const float *in, int64_t n, float p, uint64_t seed,
                           uint64_t stream, bool accum)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	if (p == 0.0f)
		k_dropout_p0<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(out, in, n, accum);
	else
		k_dropout<<<ptc_blocks((n + 3) / 4, THREADS), THREADS, 0, s>>>(out, in, n, p, seed,
		                                                               stream, accum);
	PTC_LAUNCHED("dropout kernel");
	return 0;
}

__global__ void k_check_index(const int64_t *idx, int64_t n, int64_t limit, bool use_ignore,
                              int64_t ignore, unsigned long long *first)
{
	PTC_FOR(i, n)
	{
		int64_t v = idx[i];
		if (use_ignore && v == ignore)
			continue;
		if (v < 0 || v >= limit)
			atomicMin(first, (unsigned long long)i);
	}
}

extern "C" int ptc_check_index(int dev, const int64_t *idx, int64_t n, int64_t limit,
                               bool use_ignore, int64_t ignore, int64_t *bad, int64_t *bad_value)
{
	PTC_STREAM(dev, s);
	unsigned long long *first = NULL, host = 0;
	int rc = 0;
	*bad = -1;
	if (n == 0)
		return 0;
	if (ptc_alloc(dev, sizeof(*first), (void **)&first) != 0)
		return 1;
	host = (unsigned long long)n;
	if ((rc = ptc_memcpy(dev, first, &host, sizeof(host), PTC_H2D)) != 0)
		goto out;
	k_check_index<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(idx, n, limit, use_ignore, ignore,
	                                                         first);
	{
		cudaError_t e = cudaGetLastError();
		if (e != cudaSuccess) {
			rc = ptc_cuda_fail("index check kernel", e);
			goto out;
		}
	}
	if ((rc = ptc_memcpy(dev, &host, first, sizeof(host), PTC_D2H)) != 0)
		goto out;
	if (host < (unsigned long long)n) {
		*bad = (int64_t)host;
		rc = ptc_memcpy(dev, bad_value, idx + host, sizeof(*bad_value), PTC_D2H);
	}
out:
	ptc_free(dev, first);
	return rc;
}

/* Per-block double partials of f(i) over [0, n), then one ordered sum. */
template <typename F> __global__ void k_partials(double *part, int64_t n, F f)
{
	double acc = 0.0;
	PTC_FOR(i, n)
	acc += f(i);
	double r = ptd_block_reduce(acc, ptd_add());
	if (threadIdx.x == 0)
		part[blockIdx.x] = r;
}

__global__ void k_sum_partials(double *out_d, float *out_f, const double *part, int nb,
                               double scale)
{
	double s = 0.0;
	for (int b = 0; b < nb; b++)
		s += part[b];
	if (out_d)
		*out_d = s;
	if (out_f)
		*out_f = (float)(s * scale);
}

struct sq_fn {
	const float *x;
	__device__ double operator()(int64_t i) const
	{
		return (double)x[i] * (double)x[i];
	}
};

struct diff_sq_fn {
	const float *p, *t;
	__device__ double operator()(int64_t i) const
	{
		double e = (double)p[i] - (double)t[i];
		return e * e;
	}
};

template <typename F>
static int reduce_sum(int dev, cudaStream_t s, int64_t n, F f, double *out_d, float *out_f,
                      double scale)
{
	double *part = NULL;
	int nb = (int)ptc_blocks(n, PTC_ROW_THREADS);
	if (nb > 1024)
		nb = 1024;
	if (ptc_alloc(dev, sizeof(double) * (size_t)nb, (void **)&part) != 0)
		return 1;
	k_partials<<<nb, PTC_ROW_THREADS, 0, s>>>(part, n, f);
	k_sum_partials<<<1, 1, 0, s>>>(out_d, out_f, part, nb, scale);
	cudaError_t e = cudaGetLastError();
	ptc_free(dev, part);
	return e == cudaSuccess ? 0 : ptc_cuda_fail("reduction kernel", e);
}

extern "C" int ptc_squared_norm(int dev, double *out, const float *x, int64_t n)
{
	PTC_STREAM(dev, s);
	return reduce_sum(dev, s, n, sq_fn{x}, out, NULL, 1.0);
}

extern "C" int ptc_mse_forward(int dev, float *loss, const float *p, const float *t, int64_t n,
                               float scale)
{
	PTC_STREAM(dev, s);
	return reduce_sum(dev, s, n, diff_sq_fn{p, t}, NULL, loss, (double)scale);
}

__global__ void k_mse_bwd(float *d, const float *p, const float *t, int64_t n, float s2)
{
	PTC_FOR(i, n)
	d[i] = s2 * (p[i] - t[i]);
}

extern "C" int ptc_mse_backward(int dev, float *d, const float *p, const float *t, int64_t n,
                                float scale)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_mse_bwd<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(d, p, t, n, 2.0f * scale);
	PTC_LAUNCHED("mse backward kernel");
	return 0;
}

__global__ void k_adamw(float *p, float *m, float *v, const float *g, int64_t n, float b1, float b2,
                        float eps, float gs, float step_size, float bc2_sqrt, float decay)
{
	PTC_FOR(i, n)
	{
		float gi = g[i] * gs;
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
		m[i] = mi;
		v[i] = vi;
		p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
	}
}

extern "C" int ptc_adamw(int dev, float *p, float *m, float *v, const float *g, int64_t n, float b1,
                         float b2, float eps, float gs, float step_size, float bc2_sqrt,
                         float decay)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_adamw<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(p, m, v, g, n, b1, b2, eps, gs,
	                                                   step_size, bc2_sqrt, decay);
	PTC_LAUNCHED("adamw kernel");
	return 0;
}

__global__ void k_sgd(float *p, float *buf, const float *g, int64_t n, float lr, float mu,
                      float damp, float wd, float gs, bool nesterov, bool first)
{
	PTC_FOR(i, n)
	{
		float d = g[i] * gs + wd * p[i];
		if (mu != 0.0f) {
			float b = first ? d : mu * buf[i] + (1.0f - damp) * d;
			buf[i] = b;
			d = nesterov ? d + mu * b : b;
		}
		p[i] -= lr * d;
	}
}

extern "C" int ptc_sgd(int dev, float *p, float *buf, const float *g, int64_t n, float lr, float mu,
                       float damp, float wd, float gs, bool nesterov, bool first)
{
	PTC_STREAM(dev, s);
	if (n == 0)
		return 0;
	k_sgd<<<ptc_blocks(n, THREADS), THREADS, 0, s>>>(p, buf, g, n, lr, mu, damp, wd, gs,
	                                                 nesterov, first);
	PTC_LAUNCHED("sgd kernel");
	return 0;
}
