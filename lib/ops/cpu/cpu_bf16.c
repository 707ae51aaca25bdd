/* cpu_bf16.c - oneDNN's matmul primitive, cached per thread and shape: for
 * native bf16 matrix products (bf16 operands, f32 accumulation and
 * destination: AVX512_BF16's vdpbf16ps, AMX tiles, where this CPU and oneDNN
 * have such a kernel) and for large f32 ones (cpu_gemm_f32_prim: brgemm,
 * faster than dnnl_sgemm on every Linear shape of W2).
 *
 * Choice (pt_cpu_bf16_select): AUTO picks native once per process when
 * oneDNN's effective ISA is avx512_core_bf16 or avx512_core_amx, the
 * primitive it creates for a 64 x 64 x 64 product is not its reference
 * implementation, and two such products (transposed either way, alpha,
 * beta, rows wider than the product) agree with the emulation (operands
 * rounded to bf16, fp32 sgemm) within 1e-5 relative; otherwise the
 * emulation. oneDNN 2.6 has no bf16 matmul at all below avx512_core.
 * PIPETRAIN_BF16_KERNELS=native|emulated in the environment overrides AUTO. NATIVE and EMULATED
 * force it (tests).
 *
 * Native and emulated products agree up to the order of the f32 sums (and
 * the native kernels flush denormals); neither is bitwise the other.
 * cpu_gemm_prec's calls inside a parallel region stay emulated; the
 * attention kernel packs its operands itself and calls cpu_bf16_gemm_packed
 * for each strip's products (a few dozen shapes a thread at W2's sizes).
 *
 * Each thread keeps its own oneDNN stream and a small cache of primitives
 * keyed by shape, transposition, ldc, alpha, beta and bias (alpha as output
 * scale, beta as a sum post-op, a bias row as the primitive's f32 bias); the
 * operands are rounded into a per-thread buffer of packed bf16 rows (with
 * vcvtne2ps2bf16 where the CPU has AVX512_BF16). All of
 * it is freed when the thread ends. The Linear layer's entry points round
 * each operand once per call: the output gradient feeds both backward
 * products, and the forward adds its bias in the primitive (no seeded rows,
 * no sum post-op).
 */
#include <math.h>
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

#define CACHE_SLOTS 96 /* W2: ~15 Linear and ~24 attention products a thread */

typedef struct prim {
	bool used;
	dnnl_data_type_t dt; /* of A and B: bf16 (packed) or f32 */
	int64_t M, N, K, lda, ldb, ldc;
	bool ta, tb, bias;
	uint32_t alpha, beta; /* bit patterns */
	dnnl_primitive_t p;
	dnnl_memory_t a, b, c, bm; /* bm: the bias row, when bias */
} prim;

typedef struct tstate {
	dnnl_stream_t stream;
	prim cache[CACHE_SLOTS];
	int next; /* the slot the next miss replaces */
	uint16_t *buf;
	size_t cap;
} tstate;

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static pthread_key_t state_key;
static _Thread_local tstate *state;

static atomic_int selected = PT_BF16_AUTO;
static pthread_once_t auto_once = PTHREAD_ONCE_INIT;
static bool auto_native;
static char impl_name[64] = "unavailable"; /* oneDNN's bf16 kernel, set once */

static void prim_drop(prim *e)
{
	if (!e->used)
		return;
	dnnl_primitive_destroy(e->p);
	dnnl_memory_destroy(e->a);
	dnnl_memory_destroy(e->b);
	dnnl_memory_destroy(e->c);
	if (e->bm)
		dnnl_memory_destroy(e->bm);
	memset(e, 0, sizeof(*e));
}

static void state_free(void *p)
{
	tstate *s = p;
	for (int i = 0; i < CACHE_SLOTS; i++)
		prim_drop(&s->cache[i]);
	if (s->stream)
		dnnl_stream_destroy(s->stream);
	free(s->buf);
	free(s);
}

static void engine_init(void)
{
	if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
		engine = NULL;
	pthread_key_create(&state_key, state_free);
}

static tstate *thread_state(void)
{
	pthread_once(&engine_once, engine_init);
	if (state != NULL || engine == NULL)
		return state;
	tstate *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return NULL;
	if (dnnl_stream_create(&s->stream, engine, dnnl_stream_default_flags) != dnnl_success) {
		free(s);
		return NULL;
	}
	pthread_setspecific(state_key, s);
	state = s;
	return s;
}

static uint32_t bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

/* to_bf16_row rounds n floats of s to bf16 in d: nearest, ties to even; a
 * NaN stays a quiet NaN (the emulation's rule). */
static void to_bf16_row(uint16_t *restrict d, const float *restrict src, int64_t n)
{
	const uint32_t *s = (const uint32_t *)src;
#pragma omp simd
	for (int64_t j = 0; j < n; j++) {
		uint32_t u = s[j];
		uint32_t nan = (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0;
		uint32_t rnd = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
		d[j] = (uint16_t)(nan ? (u | 0x00400000u) >> 16 : rnd);
	}
}

#if defined(__x86_64__)
/* The same with AVX512_BF16's vcvtne2ps2bf16: the same bits for every normal
 * number, zero and NaN; a denormal becomes a zero of its sign (as vdpbf16ps,
 * the native kernels' product, reads a denormal anyway). */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
to_bf16_row_hw(uint16_t *restrict d, const float *restrict s, int64_t n)
{
	int64_t j = 0;
	for (; j + 32 <= n; j += 32) {
		__m512bh v =
		    _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + j + 16), _mm512_loadu_ps(s + j));
		_mm512_storeu_si512(d + j, (__m512i)v);
	}
	for (; j < n; j += 16) {
		__mmask16 m = (__mmask16)(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1u);
		__m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + j));
		_mm256_mask_storeu_epi16(d + j, m, (__m256i)v);
	}
}

static bool hw_convert(void)
{
	return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl");
}
#else
#define to_bf16_row_hw to_bf16_row
static bool hw_convert(void)
{
	return false;
}
#endif

typedef void (*row_fn)(uint16_t *restrict, const float *restrict, int64_t);

/* pick_row: the row rounding to use (the hardware's where asked for and the
 * CPU has it). */
static row_fn pick_row(bool hw)
{
	return hw && hw_convert() ? to_bf16_row_hw : to_bf16_row;
}

void cpu_pack_bf16(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld, bool hw)
{
	row_fn row = pick_row(hw);
#pragma omp parallel for schedule(static) if (rows * cols >= PT_CPU_PAR_MIN && !omp_in_parallel())
	for (int64_t r = 0; r < rows; r++)
		row(dst + r * cols, src + r * ld, cols);
}

void cpu_bf16_row(uint16_t *dst, const float *src, int64_t n)
{
	pick_row(true)(dst, src, n);
}

/* pack_colsum is to_bf16 for a whole matrix (ld = cols) that also adds its
 * column sums to sum: threads take column ranges and stream the rows, so
 * each column is summed in row order (cpu_bias_grad's bits), from the row
 * piece just converted. */
static void pack_colsum(uint16_t *dst, const float *src, int64_t rows, int64_t cols, float *sum)
{
	row_fn row = pick_row(true);
	int nt = rows * cols >= PT_CPU_PAR_MIN && !omp_in_parallel() ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
	{
		int64_t c0, c1;
		cpu_thread_cols(cols, 32, &c0, &c1);
		for (int64_t r = 0; r < rows && c0 < c1; r++) {
			const float *s = src + r * cols;
			row(dst + r * cols + c0, s + c0, c1 - c0);
#pragma omp simd
			for (int64_t j = c0; j < c1; j++)
				sum[j] += s[j];
		}
	}
}

/* to_bf16 packs an operand of the native kernels (hardware conversion where
 * the CPU has it). */
static void to_bf16(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
	cpu_pack_bf16(dst, src, rows, cols, ld, true);
}

/* make_prim creates the matmul primitive of e's key (packed bf16 operands)
 * and its memory objects; impl (may be NULL) gets oneDNN's name for it. */
static pt_err make_prim(prim *e, float alpha, float beta, char *impl, size_t impl_cap)
{
	const char *name = NULL;
	dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
	dnnl_matmul_desc_t md;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	dnnl_dims_t ad = {e->M, e->K}, bd = {e->K, e->N}, cd = {e->M, e->N};
	/* op(A) is M x K: A stored M x K (rows lda apart), or K x M and read down. */
	dnnl_dims_t as = {e->ta ? 1 : e->lda, e->ta ? e->lda : 1};
	dnnl_dims_t bs = {e->tb ? 1 : e->ldb, e->tb ? e->ldb : 1};
	dnnl_dims_t cs = {e->ldc, 1}, biasd = {1, e->N}, biass = {e->N, 1};
	dnnl_status_t st;

	st = dnnl_memory_desc_init_by_strides(&a_md, 2, ad, e->dt, as);
	if (st == dnnl_success)
		st = dnnl_memory_desc_init_by_strides(&b_md, 2, bd, e->dt, bs);
	if (st == dnnl_success)
		st = dnnl_memory_desc_init_by_strides(&c_md, 2, cd, dnnl_f32, cs);
	if (st == dnnl_success && e->bias)
		st = dnnl_memory_desc_init_by_strides(&bias_md, 2, biasd, dnnl_f32, biass);
	if (st == dnnl_success)
		st = dnnl_matmul_desc_init(&md, &a_md, &b_md, e->bias ? &bias_md : NULL, &c_md);
	if (st == dnnl_success)
		st = dnnl_primitive_attr_create(&attr);
	if (st == dnnl_success && alpha != 1.0f)
		st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
	if (st == dnnl_success && beta != 0.0f) {
		st = dnnl_post_ops_create(&po);
		if (st == dnnl_success)
			st = dnnl_post_ops_append_sum(po, beta);
		if (st == dnnl_success)
			st = dnnl_primitive_attr_set_post_ops(attr, po);
	}
	if (st == dnnl_success)
		st = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
	if (st == dnnl_success && impl != NULL &&
	    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, (void *)&name) ==
	        dnnl_success &&
	    name != NULL)
		snprintf(impl, impl_cap, "%s", name); /* name lives as long as pd */
	if (st == dnnl_success)
		st = dnnl_primitive_create(&e->p, pd);
	if (st == dnnl_success)
		st = dnnl_memory_create(&e->a, &a_md, engine, DNNL_MEMORY_NONE);
	if (st == dnnl_success)
		st = dnnl_memory_create(&e->b, &b_md, engine, DNNL_MEMORY_NONE);
	if (st == dnnl_success)
		st = dnnl_memory_create(&e->c, &c_md, engine, DNNL_MEMORY_NONE);
	if (st == dnnl_success && e->bias)
		st = dnnl_memory_create(&e->bm, &bias_md, engine, DNNL_MEMORY_NONE);
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (po)
		dnnl_post_ops_destroy(po);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	if (st != dnnl_success) {
		if (e->p)
			dnnl_primitive_destroy(e->p);
		if (e->a)
			dnnl_memory_destroy(e->a);
		if (e->b)
			dnnl_memory_destroy(e->b);
		if (e->c)
			dnnl_memory_destroy(e->c);
		memset(e, 0, sizeof(*e));
		return pt_set_error(PT_ERR_BACKEND, "oneDNN %s matmul (%ld x %ld x %ld): status %d",
		                    e->dt == dnnl_f32 ? "f32" : "bf16", (long)cd[0], (long)cd[1],
		                    (long)ad[1], (int)st);
	}
	e->used = true;
	return PT_OK;
}

/* find returns the thread's primitive for this product, made on a miss. */
static pt_err find(tstate *s, dnnl_data_type_t dt, bool ta, bool tb, int64_t M, int64_t N,
                   int64_t K, int64_t lda, int64_t ldb, float alpha, float beta, bool bias,
                   int64_t ldc, prim **out, char *impl, size_t impl_cap)
{
	for (int i = 0; i < CACHE_SLOTS; i++) {
		prim *e = &s->cache[i];
		if (e->used && e->dt == dt && e->M == M && e->N == N && e->K == K &&
		    e->lda == lda && e->ldb == ldb && e->ta == ta && e->tb == tb && e->ldc == ldc &&
		    e->alpha == bits(alpha) && e->beta == bits(beta) && e->bias == bias) {
			*out = e;
			return PT_OK;
		}
	}
	prim *e = &s->cache[s->next];
	s->next = (s->next + 1) % CACHE_SLOTS;
	prim_drop(e);
	*e = (prim){.dt = dt,
	            .M = M,
	            .N = N,
	            .K = K,
	            .lda = lda,
	            .ldb = ldb,
	            .ldc = ldc,
	            .ta = ta,
	            .tb = tb,
	            .bias = bias,
	            .alpha = bits(alpha),
	            .beta = bits(beta)};
	PT_TRY(make_prim(e, alpha, beta, impl, impl_cap));
	*out = e;
	return PT_OK;
}

/* operands returns the thread's state with room for n packed bf16 values
 * in s->buf. */
static pt_err operands(size_t n, tstate **out)
{
	tstate *s = thread_state();
	if (s == NULL)
		return pt_set_error(PT_ERR_BACKEND, "oneDNN CPU engine or stream unavailable");
	if (n > s->cap) {
		uint16_t *p = realloc(s->buf, n * sizeof(uint16_t));
		if (p == NULL)
			return pt_set_error(PT_ERR_NOMEM, "bf16 operands (%zu values)", n);
		s->buf = p;
		s->cap = n;
	}
	*out = s;
	return PT_OK;
}

/* prim_gemm: C = alpha op(A) op(B) (+ bias row) + beta C, A and B of type
 * dt (A is M x K, or K x M when ta, rows lda apart; B is K x N, or N x K when
 * tb, rows ldb apart). */
static pt_err prim_gemm(tstate *s, dnnl_data_type_t dt, bool ta, bool tb, int64_t M, int64_t N,
                        int64_t K, float alpha, const void *A, int64_t lda, const void *B,
                        int64_t ldb, const float *bias, float beta, float *C, int64_t ldc,
                        char *impl, size_t impl_cap)
{
	prim *e;
	PT_TRY(find(s, dt, ta, tb, M, N, K, lda, ldb, alpha, beta, bias != NULL, ldc, &e, impl,
	            impl_cap));
	dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
	                           {DNNL_ARG_WEIGHTS, e->b},
	                           {DNNL_ARG_DST, e->c},
	                           {DNNL_ARG_BIAS, e->bm}};
	dnnl_status_t st = dnnl_memory_set_data_handle(e->a, (void *)A);
	if (st == dnnl_success)
		st = dnnl_memory_set_data_handle(e->b, (void *)B);
	if (st == dnnl_success)
		st = dnnl_memory_set_data_handle(e->c, C);
	if (st == dnnl_success && bias != NULL)
		st = dnnl_memory_set_data_handle(e->bm, (void *)bias);
	if (st == dnnl_success)
		st = dnnl_primitive_execute(e->p, s->stream, bias != NULL ? 4 : 3, args);
	if (st == dnnl_success)
		st = dnnl_stream_wait(s->stream);
	if (st != dnnl_success)
		return pt_set_error(PT_ERR_BACKEND, "oneDNN %s matmul (%ld x %ld x %ld): status %d",
		                    dt == dnnl_f32 ? "f32" : "bf16", (long)M, (long)N, (long)K,
		                    (int)st);
	return PT_OK;
}

/* packed_gemm is prim_gemm on packed bf16 operands. */
static pt_err packed_gemm(tstate *s, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const uint16_t *A, const uint16_t *B, const float *bias, float beta,
                          float *C, int64_t ldc, char *impl, size_t impl_cap)
{
	return prim_gemm(s, dnnl_bf16, ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, bias,
	                 beta, C, ldc, impl, impl_cap);
}

/* native_gemm: C = alpha op(A) op(B) + beta C with A and B rounded to bf16. */
static pt_err native_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                          float *C, int64_t ldc, char *impl, size_t impl_cap)
{
	int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
	tstate *s = NULL;

	PT_TRY(operands((size_t)(ra * ca + rb * cb), &s));
	to_bf16(s->buf, A, ra, ca, lda);
	to_bf16(s->buf + ra * ca, B, rb, cb, ldb);
	return packed_gemm(s, ta, tb, M, N, K, alpha, s->buf, s->buf + ra * ca, NULL, beta, C, ldc,
	                   impl, impl_cap);
}

/* self_check: two 64 x 64 x 64 products native against the emulation, one
 * (A B^T + C) as a Linear forward takes it, one (0.5 A^T B into C) with
 * rows 72 floats apart; impl gets oneDNN's name for the kernel. */
static bool self_check(char *impl, size_t impl_cap)
{
	enum { S = 64, LD = 72 };
	float *a = malloc(sizeof(float) * LD * S * 4), *b = a + LD * S, *c1 = b + LD * S,
	      *c2 = c1 + LD * S;
	uint32_t seed = 12345;
	bool ok = a != NULL;

	for (int i = 0; ok && i < LD * S * 2; i++) {
		seed = seed * 1664525u + 1013904223u;
		a[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
	}
	for (int k = 0; ok && k < 2; k++) {
		bool t = k == 1;
		float alpha = t ? 0.5f : 1.0f, beta = t ? 0.0f : 1.0f;
		int64_t ld = t ? LD : S;
		double num = 0, den = 0;
		for (int i = 0; i < LD * S; i++)
			c1[i] = c2[i] = (float)(i % 7) - 3.0f;
		ok = native_gemm(t, !t, S, S, S, alpha, a, ld, b, ld, beta, c1, ld, impl,
		                 impl_cap) == PT_OK &&
		     cpu_gemm_prec_emulated(PT_PREC_BF16, t, !t, S, S, S, alpha, a, ld, b, ld, beta,
		                            c2, ld) == PT_OK;
		for (int i = 0; ok && i < LD * S; i++) {
			num += ((double)c1[i] - c2[i]) * ((double)c1[i] - c2[i]);
			den += (double)c2[i] * c2[i];
		}
		ok = ok && isfinite(num) && sqrt(num / den) <= 1e-5;
	}
	free(a);
	pt_clear_error();
	return ok;
}

/* decide_auto names oneDNN's kernel for bf16 products here (a small
 * product made with it must agree with the emulation) and decides AUTO. */
static void decide_auto(void)
{
	const char *env = getenv("PIPETRAIN_BF16_KERNELS");
	dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
	bool bf16_isa = isa == dnnl_cpu_isa_avx512_core_bf16 || isa == dnnl_cpu_isa_avx512_core_amx;
	char impl[64] = "";

	pthread_once(&engine_once, engine_init);
	if (engine == NULL || !self_check(impl, sizeof(impl)) || impl[0] == '\0') {
		snprintf(impl_name, sizeof(impl_name), "unavailable");
		return;
	}
	snprintf(impl_name, sizeof(impl_name), "%s", impl);
	if (env != NULL && strcmp(env, "native") == 0)
		auto_native = true;
	else if (env != NULL && strcmp(env, "emulated") == 0)
		auto_native = false;
	else /* oneDNN's reference kernel is far slower than the emulation's sgemm */
		auto_native = bf16_isa && strncmp(impl, "ref", 3) != 0;
}

void pt_cpu_bf16_select(pt_bf16_kernels k)
{
	atomic_store(&selected, (int)k);
}

bool pt_cpu_bf16_native(const char **impl)
{
	int k = atomic_load(&selected);
	pthread_once(&auto_once, decide_auto);
	if (impl != NULL)
		*impl = impl_name;
	return k == PT_BF16_AUTO ? auto_native : k == PT_BF16_NATIVE;
}

static char f32_impl[64] = "unavailable";
static pthread_once_t f32_once = PTHREAD_ONCE_INIT;

static void f32_probe(void)
{
	prim e = {.dt = dnnl_f32, .M = 256, .N = 256, .K = 256, .lda = 256, .ldb = 256, .ldc = 256};
	char impl[64] = "";
	pthread_once(&engine_once, engine_init);
	if (engine != NULL && make_prim(&e, 1.0f, 0.0f, impl, sizeof(impl)) == PT_OK &&
	    impl[0] != '\0')
		snprintf(f32_impl, sizeof(f32_impl), "%s", impl);
	prim_drop(&e);
	pt_clear_error();
}

const char *pt_cpu_f32_gemm_impl(void)
{
	pthread_once(&f32_once, f32_probe);
	return f32_impl;
}

pt_err cpu_gemm_f32_prim(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb,
                         const float *bias, float beta, float *C, int64_t ldc)
{
	tstate *s = thread_state();
	if (s == NULL)
		return pt_set_error(PT_ERR_BACKEND, "oneDNN CPU engine or stream unavailable");
	return prim_gemm(s, dnnl_f32, ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, beta, C, ldc,
	                 NULL, 0);
}

pt_err cpu_gemm_bf16_native(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                            float *C, int64_t ldc)
{
	return native_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, 0);
}

pt_err cpu_bf16_gemm_packed(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                            const uint16_t *A, const uint16_t *B, float beta, float *C, int64_t ldc)
{
	tstate *s = thread_state();
	if (s == NULL)
		return pt_set_error(PT_ERR_BACKEND, "oneDNN CPU engine or stream unavailable");
	return packed_gemm(s, ta, tb, M, N, K, alpha, A, B, NULL, beta, C, ldc, NULL, 0);
}

pt_err cpu_bf16_linear_forward(int64_t N, int64_t I, int64_t O, const float *x, const uint16_t *xb,
                               const float *w, const float *bias, float *y)
{
	tstate *s = NULL;
	uint16_t *wb;
	PT_TRY(operands((size_t)((xb != NULL ? 0 : N * I) + O * I), &s));
	wb = xb != NULL ? s->buf : s->buf + N * I;
	if (xb == NULL) {
		to_bf16(s->buf, x, N, I, I);
		xb = s->buf;
	}
	to_bf16(wb, w, O, I, I);
	return packed_gemm(s, false, true, N, O, I, 1.0f, xb, wb, bias, 0.0f, y, O, NULL, 0);
}

pt_err cpu_bf16_linear_backward(int64_t N, int64_t I, int64_t O, const float *dy, const float *x,
                                const uint16_t *xb, const float *w, float *dx, bool accum_dx,
                                float *dw, float *db)
{
	tstate *s = NULL;
	uint16_t *g, *o;
	PT_TRY(operands((size_t)(N * O + (N > O ? N : O) * I), &s));
	g = s->buf;
	o = s->buf + N * O;
	if (db != NULL)
		pack_colsum(g, dy, N, O, db);
	else
		to_bf16(g, dy, N, O, O);
	if (dx != NULL) { /* dx (+)= dy w */
		to_bf16(o, w, O, I, I);
		PT_TRY(packed_gemm(s, false, false, N, I, O, 1.0f, g, o, NULL,
		                   accum_dx ? 1.0f : 0.0f, dx, I, NULL, 0));
	}
	if (dw != NULL) { /* dw += dy^T x */
		if (xb == NULL)
			to_bf16(o, x, N, I, I);
		PT_TRY(packed_gemm(s, true, false, O, I, N, 1.0f, g, xb != NULL ? xb : o, NULL,
		                   1.0f, dw, I, NULL, 0));
	}
	return PT_OK;
}
