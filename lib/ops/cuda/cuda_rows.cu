/* cuda_rows.cu - row-wise ops: softmax, layer norm, cross-entropy, Linear's
 * bias rows and bias-gradient column sums, embeddings.
 *
 * One block of PTC_ROW_THREADS threads per row, block reductions in a fixed
 * tree (deterministic). Parameter gradients that sum over rows use no atomics
 * and give the same bits run to run:
 *  - layer norm dw/db and Linear db: a two-pass column reduction. Pass 1
 *    gives each block a tile of COL_TILE columns and a chunk of rows and
 *    writes one partial sum per (chunk, column); pass 2 adds a column's
 *    partials in chunk order. The chunk count depends only on the shape
 *    (col_chunks), so the order is fixed; it differs from the CPU's serial
 *    row order (rounding differs, within the ops' tolerance).
 *  - embedding dwte: the tokens are sorted stably (CUB radix sort of (token,
 *    row)), and one thread per (run of equal tokens, column) adds that run's
 *    rows in row order; dwpe: one thread per (position, column) over the
 *    batch in order. Both are the CPU's summation order, so bitwise the CPU.
 *    Limit: a token repeated n times costs one thread n serial adds.
 */
#include <cub/device/device_radix_sort.cuh>

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

/* ---- two-pass column reductions (layer norm dw/db, Linear db) ---- */

#define COL_TILE      32   /* columns per block: one warp reads 128 bytes of a row */
#define COL_ROWS      8    /* rows read at once per block (blockDim.y) */
#define COL_BLOCKS    2048 /* pass-1 blocks aimed at: ~15 per SM on 132 SMs */
#define COL_MIN_CHUNK 64   /* rows per chunk at least */

/* col_chunks returns the number of row chunks for R rows of C columns: about
 * COL_BLOCKS blocks in all, each chunk at least COL_MIN_CHUNK rows, at most
 * 65535 (grid y). A function of the shape only: the summation order never
 * depends on the device or the run. */
static int64_t col_chunks(int64_t R, int64_t C)
{
	int64_t tiles = (C + COL_TILE - 1) / COL_TILE;
	int64_t want = (COL_BLOCKS + tiles - 1) / tiles;
	int64_t most = (R + COL_MIN_CHUNK - 1) / COL_MIN_CHUNK;
	int64_t n = want < most ? want : most;
	return n < 1 ? 1 : (n > 65535 ? 65535 : n);
}

/* Pass 1: block (tile, chunk) sums rows [chunk * per, +per) of its COL_TILE
 * columns: thread (tx, ty) takes rows ty, ty + COL_ROWS, ... of column tx,
 * then thread (tx, 0) adds the COL_ROWS partials in ty order. LN: a gets
 * (x - mean) * rstd * g (dw) and b gets g (db); else a gets g. With one chunk
 * the sums go straight into dst_a/dst_b (+=), else into part_a/part_b
 * (chunk, C). */
template <bool LN>
__global__ void k_cols_pass1(float *dst_a, float *dst_b, float *part_a, float *part_b,
                             const float *g, const float *x, const float *mean, const float *rstd,
                             int64_t R, int64_t C, int64_t per)
{
	__shared__ float sa[COL_ROWS][COL_TILE + 1], sb[COL_ROWS][COL_TILE + 1];
	int tx = threadIdx.x, ty = threadIdx.y;
	int64_t j = (int64_t)blockIdx.x * COL_TILE + tx;
	int64_t r0 = (int64_t)blockIdx.y * per, r1 = r0 + per < R ? r0 + per : R;
	float a = 0.0f, b = 0.0f;
	if (j < C) {
		for (int64_t r = r0 + ty; r < r1; r += COL_ROWS) {
			float gv = g[r * C + j];
			if (LN) {
				a += (x[r * C + j] - mean[r]) * rstd[r] * gv;
				b += gv;
			} else {
				a += gv;
			}
		}
	}
	sa[ty][tx] = a;
	sb[ty][tx] = b;
	__syncthreads();
	if (ty != 0 || j >= C)
		return;
	a = 0.0f;
	b = 0.0f;
	for (int k = 0; k < COL_ROWS; k++) {
		a += sa[k][tx];
		b += sb[k][tx];
	}
	if (gridDim.y == 1) {
		dst_a[j] += a;
		if (LN)
			dst_b[j] += b;
	} else {
		part_a[blockIdx.y * C + j] = a;
		if (LN)
			part_b[blockIdx.y * C + j] = b;
	}
}

/* Pass 2: dst[j] += the n partials of column j, in chunk order. */
__global__ void k_cols_pass2(float *dst, const float *part, int64_t n, int64_t C)
{
	PTC_FOR(j, C)
	{
		float a = 0.0f;
		for (int64_t k = 0; k < n; k++)
			a += part[k * C + j];
		dst[j] += a;
	}
}

/* col_reduce runs both passes on s: dst_a (C) += column sums of g (R, C)
 * (LN: dst_a += of (x - mean) * rstd * g, dst_b += of g). Scratch for the
 * partials comes from the pool on s and is freed on s. */
template <bool LN>
static int col_reduce(cudaStream_t s, const char *what, float *dst_a, float *dst_b, const float *g,
                      const float *x, const float *mean, const float *rstd, int64_t R, int64_t C)
{
	int64_t n = col_chunks(R, C), per = (R + n - 1) / n;
	float *part = NULL;
	cudaError_t e;
	dim3 grid((unsigned)((C + COL_TILE - 1) / COL_TILE), (unsigned)n),
	    block(COL_TILE, COL_ROWS);

	if (R == 0 || C == 0)
		return 0;
	if (grid.x != (C + COL_TILE - 1) / COL_TILE)
		return ptc_fail(what, "too many columns");
	n = (R + per - 1) / per; /* no empty chunk */
	grid.y = (unsigned)n;
	if (n > 1) {
		size_t bytes = (size_t)n * (size_t)C * sizeof(float) * (LN ? 2 : 1);
		PTC_CUDA(cudaMallocAsync((void **)&part, bytes, s));
	}
	k_cols_pass1<LN><<<grid, block, 0, s>>>(
	    dst_a, dst_b, part, LN && part ? part + n * C : NULL, g, x, mean, rstd, R, C, per);
	if (n > 1) {
		k_cols_pass2<<<ptc_blocks(C, 128), 128, 0, s>>>(dst_a, part, n, C);
		if (LN)
			k_cols_pass2<<<ptc_blocks(C, 128), 128, 0, s>>>(dst_b, part + n * C, n, C);
	}
	e = cudaGetLastError();
	if (part != NULL)
		cudaFreeAsync(part, s); /* ordered after the kernels that read it */
	return e == cudaSuccess ? 0 : ptc_cuda_fail(what, e);
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
	if (dx != NULL) {
		k_ln_bwd_dx<<<(unsigned)R, T_ROW, 0, s>>>(dx, dy, x, w, mean, rstd, C, accum);
		PTC_LAUNCHED("layernorm backward kernel");
	}
	if (dw == NULL)
		return 0;
	return col_reduce<true>(s, "layernorm dw/db kernels", dw, db, dy, x, mean, rstd, R, C);
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

extern "C" int ptc_colsum_acc(int dev, float *db, const float *g, int64_t N, int64_t O)
{
	PTC_STREAM(dev, s);
	return col_reduce<false>(s, "bias gradient kernels", db, NULL, g, NULL, NULL, NULL, N, O);
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

__global__ void k_iota(int32_t *v, int64_t n)
{
	PTC_FOR(i, n)
	v[i] = (int32_t)i;
}

/* dwte: thread (p, j) of sorted position p starts a run when the token at p
 * differs from the one before, and adds the run's rows (ascending, as the
 * sort is stable) to dwte[token, j]: the CPU's order for that element. */
__global__ void k_emb_bwd_wte(float *dwte, const float *dout, const uint64_t *key,
                              const int32_t *row, int64_t BT, int64_t C)
{
	PTC_FOR(k, BT * C)
	{
		int64_t p = k / C, j = k % C;
		uint64_t t = key[p];
		if (p > 0 && key[p - 1] == t)
			continue;
		float a = dwte[(int64_t)t * C + j];
		for (int64_t q = p; q < BT && key[q] == t; q++)
			a += dout[(int64_t)row[q] * C + j];
		dwte[(int64_t)t * C + j] = a;
	}
}

/* dwpe: thread (t, j) adds rows b * T + t for b = 0, 1, ... (the CPU's order). */
__global__ void k_emb_bwd_wpe(float *dwpe, const float *dout, int64_t B, int64_t T, int64_t C)
{
	PTC_FOR(k, T * C)
	{
		int64_t t = k / C, j = k % C;
		float a = dwpe[k];
		for (int64_t b = 0; b < B; b++)
			a += dout[(b * T + t) * C + j];
		dwpe[k] = a;
	}
}

extern "C" int ptc_embedding_backward(int dev, float *dwte, float *dwpe, const float *dout,
                                      const int64_t *tok, int64_t B, int64_t T, int64_t C,
                                      int64_t V)
{
	PTC_STREAM(dev, s);
	int64_t BT = B * T;
	int bits = 1;
	size_t sort_bytes = 0, off;
	char *scratch = NULL;
	cudaError_t e;
	if (BT * C == 0)
		return 0;
	if (BT > INT32_MAX)
		return ptc_fail("embedding backward", "more than 2^31 tokens");
	if (dwpe != NULL) {
		k_emb_bwd_wpe<<<ptc_blocks(T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
		PTC_LAUNCHED("embedding backward (positions) kernel");
	}
	while (bits < 64 && ((uint64_t)1 << bits) < (uint64_t)V)
		bits++;
	/* Tokens are >= 0 (range-checked), so their bits sort as unsigned keys. */
	const uint64_t *keys_in = (const uint64_t *)tok;
	e = cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, keys_in, (uint64_t *)NULL,
	                                    (const int32_t *)NULL, (int32_t *)NULL, BT, 0, bits, s);
	if (e != cudaSuccess)
		return ptc_cuda_fail("embedding backward: sort size", e);
	/* One scratch block: sorted keys (u64), rows in and out (i32), CUB's space. */
	off = ((size_t)BT * (8 + 4 + 4) + 255) & ~(size_t)255;
	PTC_CUDA(cudaMallocAsync((void **)&scratch, off + sort_bytes, s));
	uint64_t *keys = (uint64_t *)scratch;
	int32_t *rows_in = (int32_t *)(scratch + (size_t)BT * 8);
	int32_t *rows = rows_in + BT;
	k_iota<<<ptc_blocks(BT, 256), 256, 0, s>>>(rows_in, BT);
	e = cudaGetLastError();
	if (e == cudaSuccess)
		e = cub::DeviceRadixSort::SortPairs(scratch + off, sort_bytes, keys_in, keys,
		                                    rows_in, rows, BT, 0, bits, s);
	if (e == cudaSuccess) {
		k_emb_bwd_wte<<<ptc_blocks(BT * C, 256), 256, 0, s>>>(dwte, dout, keys, rows, BT,
		                                                      C);
		e = cudaGetLastError();
	}
	cudaFreeAsync(scratch, s); /* ordered after the kernels that use it */
	return e == cudaSuccess ? 0 : ptc_cuda_fail("embedding backward kernels", e);
}

__global__ void k_xent_fwd(float *losses, float *probs, const float *logits, const int64_t *tg,
                           int64_t V, int64_t ignore)
{
	int64_t r = blockIdx.x;
	const float *x = logits + r * V;
	/* Read before the softmax (whose first reduction every thread passes
	 * before any writes): probs may be the logits themselves. */
	float xt = threadIdx.x == 0 && tg[r] != ignore ? x[tg[r]] : 0.0f, mx, sum;
	row_softmax(probs + r * V, x, V, &mx, &sum);
	if (threadIdx.x == 0)
		losses[r] = tg[r] == ignore ? 0.0f : logf(sum) + mx - xt;
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
