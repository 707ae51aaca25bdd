/* cuda_rows.cu - row-wise ops: softmax, layer norm, cross-entropy, Linear's
 * bias rows and bias-gradient column sums, embeddings.
 *
 * One block of PTC_ROW_THREADS threads per row, block reductions in a fixed
 * tree (deterministic). Parameter gradients that sum over rows (layer norm
 * dw/db, Linear db, embedding dwte/dwpe) use one thread per column walking the
 * rows in order: the same summation order as the CPU kernels, no atomics.
 */
#include "cuda_common.cuh"

#define T_ROW PTC_ROW_THREADS

/* Softmax of x[0..n) into y, as pt_softmax_row; returns max and sum. */
__device__ static void row_softmax(float *y, const float *x, int64_t n, float *mx_out,
                                   float *sum_out)
{
	float mx = -INFINITY, sum = 0.0f;
	for (int64_t j = threadIdx.x; j < n; j += T_ROW)
		mx = x[j] > mx ? x[j] : mx;
	mx = ptd_block_reduce(mx, ptd_max());
	for (int64_t j = threadIdx.x; j < n; j += T_ROW) {
		float e = ptd_expf(x[j] - mx);
		y[j] = e;
		sum += e;
	}
	sum = ptd_block_reduce(sum, ptd_add());
	float inv = 1.0f / sum;
	for (int64_t j = threadIdx.x; j < n; j += T_ROW)
		y[j] *= inv;
	*mx_out = mx;
	*sum_out = sum;
}

__global__ void k_softmax_fwd(float *y, const float *x, int64_t C)
{
	float mx, sum;
	int64_t r = blockIdx.x;
	row_softmax(y + r * C, x + r * C, C, &mx, &sum);
}

__global__ void k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t C, bool accum)
{
	int64_t r = blockIdx.x;
	const float *dyr = dy + r * C, *yr = y + r * C;
	float *dxr = dx + r * C;
	float dot = 0.0f;
	for (int64_t j = threadIdx.x; j < C; j += T_ROW)
		dot += dyr[j] * yr[j];
	dot = ptd_block_reduce(dot, ptd_add());
	for (int64_t j = threadIdx.x; j < C; j += T_ROW)
		dxr[j] = (accum ? dxr[j] : 0.0f) + yr[j] * (dyr[j] - dot);
}

static int rows_ok(int64_t R)
{
	return R <= 0x7fffffff;
}

extern "C" int ptc_softmax_forward(int dev, float *y, const float *x, int64_t R, int64_t C)
{
	PTC_STREAM(dev, s);
	if (R == 0 || C == 0)
		return 0;
	if (!rows_ok(R))
		return ptc_fail("softmax", "too many rows");
	k_softmax_fwd<<<(unsigned)R, T_ROW, 0, s>>>(y, x, C);
	PTC_LAUNCHED("softmax forward kernel");
	return 0;
}

extern "C" int ptc_softmax_backward(int dev, float *dx, const float *dy, const float *y, int64_t R,
                                    int64_t C, bool accum)
{
	PTC_STREAM(dev, s);
	if (R == 0 || C == 0)
		return 0;
	if (!rows_ok(R))
		return ptc_fail("softmax", "too many rows");
	k_softmax_bwd<<<(unsigned)R, T_ROW, 0, s>>>(dx, dy, y, C, accum);
	PTC_LAUNCHED("softmax backward kernel");
	return 0;
}

__global__ void k_ln_fwd(float *y, float *mean, float *rstd, const float *x, const float *w,
                         const float *b, int64_t C, float eps)
{
	int64_t r = blockIdx.x;
	const float *xr = x + r * C;
	float *yr = y + r * C;
	float m = 0.0f, v = 0.0f;
	for (int64_t j = threadIdx.x; j < C; j += T_ROW)
		m += xr[j];
	m = ptd_block_reduce(m, ptd_add()) / (float)C;
	for (int64_t j = threadIdx.x; j < C; j += T_ROW)
		v += (xr[j] - m) * (xr[j] - m);
	v = ptd_block_reduce(v, ptd_add()) / (float)C;
	float sd = 1.0f / sqrtf(v + eps);
	for (int64_t j = threadIdx.x; j < C; j += T_ROW)
		yr[j] = (xr[j] - m) * sd * w[j] + b[j];
	if (threadIdx.x == 0) {
		mean[r] = m;
		rstd[r] = sd;
	}
}

__global__ void k_ln_bwd_dx(float *dx, const float *dy, const float *x, const float *w,
                            const float *mean, const float *rstd, int64_t C, bool accum)
{
	int64_t r = blockIdx.x;
	const float *dyr = dy + r * C, *xr = x + r * C;
	float *dxr = dx + r * C;
	float m = mean[r], sd = rstd[r];
	float dm = 0.0f, dn = 0.0f;
	for (int64_t j = threadIdx.x; j < C; j += T_ROW) {
		float nj = (xr[j] - m) * sd;
		float d = w[j] * dyr[j];
		dm += d;
		dn += d * nj;
	}
	dm = ptd_block_reduce(dm, ptd_add()) / (float)C;
	dn = ptd_block_reduce(dn, ptd_add()) / (float)C;
	for (int64_t j = threadIdx.x; j < C; j += T_ROW) {
		float nj = (xr[j] - m) * sd;
		float d = w[j] * dyr[j];
		dxr[j] = (accum ? dxr[j] : 0.0f) + (d - dm - nj * dn) * sd;
	}
}

__global__ void k_ln_bwd_dwdb(float *dw, float *db, const float *dy, const float *x,
                              const float *mean, const float *rstd, int64_t R, int64_t C)
{
	PTC_FOR(j, C)
	{
		float aw = dw[j], ab = db[j];
		for (int64_t r = 0; r < R; r++) {
			float g = dy[r * C + j];
			aw += (x[r * C + j] - mean[r]) * rstd[r] * g;
			ab += g;
		}
		dw[j] = aw;
		db[j] = ab;
	}
}

extern "C" int ptc_layernorm_forward(int dev, float *y, float *mean, float *rstd, const float *x,
                                     const float *w, const float *b, int64_t R, int64_t C,
                                     float eps)
{
	PTC_STREAM(dev, s);
	if (R == 0 || C == 0)
		return 0;
	if (!rows_ok(R))
		return ptc_fail("layernorm", "too many rows");
	k_ln_fwd<<<(unsigned)R, T_ROW, 0, s>>>(y, mean, rstd, x, w, b, C, eps);
	PTC_LAUNCHED("layernorm forward kernel");
	return 0;
}

extern "C" int ptc_layernorm_backward(int dev, float *dx, float *dw, float *db, const float *dy,
                                      const float *x, const float *w, const float *mean,
                                      const float *rstd, int64_t R, int64_t C, bool accum)
{
	PTC_STREAM(dev, s);
	if (R == 0 || C == 0)
		return 0;
	if (!rows_ok(R))
		return ptc_fail("layernorm", "too many rows");
	k_ln_bwd_dx<<<(unsigned)R, T_ROW, 0, s>>>(dx, dy, x, w, mean, rstd, C, accum);
	k_ln_bwd_dwdb<<<ptc_blocks(C, 128), 128, 0, s>>>(dw, db, dy, x, mean, rstd, R, C);
	PTC_LAUNCHED("layernorm backward kernels");
	return 0;
}

__global__ void k_bias_rows(float *y, const float *bias, int64_t N, int64_t O)
{
	PTC_FOR(i, N * O)
	y[i] = bias[i % O];
}

extern "C" int ptc_bias_rows(int dev, float *y, const float *bias, int64_t N, int64_t O)
{
	PTC_STREAM(dev, s);
	if (N * O == 0)
		return 0;
	k_bias_rows<<<ptc_blocks(N * O, 256), 256, 0, s>>>(y, bias, N, O);
	PTC_LAUNCHED("bias kernel");
	return 0;
}

__global__ void k_colsum_acc(float *db, const float *g, int64_t N, int64_t O)
{
	PTC_FOR(j, O)
	{
		float a = db[j];
		for (int64_t r = 0; r < N; r++)
			a += g[r * O + j];
		db[j] = a;
	}
}

extern "C" int ptc_colsum_acc(int dev, float *db, const float *g, int64_t N, int64_t O)
{
	PTC_STREAM(dev, s);
	if (O == 0)
		return 0;
	k_colsum_acc<<<ptc_blocks(O, 128), 128, 0, s>>>(db, g, N, O);
	PTC_LAUNCHED("bias gradient kernel");
	return 0;
}

__global__ void k_emb_fwd(float *out, const int64_t *tok, const float *wte, const float *wpe,
                          int64_t T, int64_t C, int64_t n)
{
	PTC_FOR(k, n)
	{
		int64_t i = k / C, j = k % C;
		float e = wte[tok[i] * C + j];
		out[k] = wpe ? e + wpe[(i % T) * C + j] : e;
	}
}

extern "C" int ptc_embedding_forward(int dev, float *out, const int64_t *tok, const float *wte,
                                     const float *wpe, int64_t B, int64_t T, int64_t C)
{
	PTC_STREAM(dev, s);
	int64_t n = B * T * C;
	if (n == 0)
		return 0;
	k_emb_fwd<<<ptc_blocks(n, 256), 256, 0, s>>>(out, tok, wte, wpe, T, C, n);
	PTC_LAUNCHED("embedding forward kernel");
	return 0;
}

/* One thread per column; rows in position order, as the CPU. */
__global__ void k_emb_bwd(float *dwte, float *dwpe, const float *dout, const int64_t *tok,
                          int64_t BT, int64_t T, int64_t C)
{
	PTC_FOR(j, C)
	{
		for (int64_t i = 0; i < BT; i++) {
			float d = dout[i * C + j];
			dwte[tok[i] * C + j] += d;
			if (dwpe)
				dwpe[(i % T) * C + j] += d;
		}
	}
}

extern "C" int ptc_embedding_backward(int dev, float *dwte, float *dwpe, const float *dout,
                                      const int64_t *tok, int64_t B, int64_t T, int64_t C)
{
	PTC_STREAM(dev, s);
	if (B * T * C == 0)
		return 0;
	k_emb_bwd<<<ptc_blocks(C, 64), 64, 0, s>>>(dwte, dwpe, dout, tok, B * T, T, C);
	PTC_LAUNCHED("embedding backward kernel");
	return 0;
}

__global__ void k_xent_fwd(float *losses, float *probs, const float *logits, const int64_t *tg,
                           int64_t V, int64_t ignore)
{
	int64_t r = blockIdx.x;
	const float *x = logits + r * V;
	float mx, sum;
	row_softmax(probs + r * V, x, V, &mx, &sum);
	if (threadIdx.x == 0)
		losses[r] = tg[r] == ignore ? 0.0f : logf(sum) + mx - x[tg[r]];
}

extern "C" int ptc_xent_forward(int dev, float *losses, float *probs, const float *logits,
                                const int64_t *tg, int64_t R, int64_t V, int64_t ignore)
{
	PTC_STREAM(dev, s);
	if (R == 0 || V == 0)
		return 0;
	if (!rows_ok(R))
		return ptc_fail("cross_entropy", "too many rows");
	k_xent_fwd<<<(unsigned)R, T_ROW, 0, s>>>(losses, probs, logits, tg, V, ignore);
	PTC_LAUNCHED("cross-entropy forward kernel");
	return 0;
}

__global__ void k_xent_bwd(float *d, const float *probs, const int64_t *tg, int64_t V,
                           int64_t ignore, float sc, int64_t n)
{
	PTC_FOR(k, n)
	{
		int64_t r = k / V, j = k % V;
		int64_t t = tg[r];
		float v = 0.0f;
		if (t != ignore) {
			v = sc * probs[k];
			if (j == t)
				v -= sc;
		}
		d[k] = v;
	}
}

extern "C" int ptc_xent_backward(int dev, float *d, const float *probs, const int64_t *tg,
                                 int64_t R, int64_t V, int64_t ignore, float scale)
{
	PTC_STREAM(dev, s);
	if (R * V == 0)
		return 0;
	k_xent_bwd<<<ptc_blocks(R * V, 256), 256, 0, s>>>(d, probs, tg, V, ignore, scale, R * V);
	PTC_LAUNCHED("cross-entropy backward kernel");
	return 0;
}
