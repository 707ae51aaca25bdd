/* plan.c - the schedule planner (docs/pipeline.md, "The planner").
 *
 * Cost model. Every layer's forward (F), input-gradient (B) and
 * weight-gradient (W) time is measured on this process's CPU at the
 * microbatch size, on the thread count a stage of the candidate gets (the
 * runner's rule: the job's threads over p, at least 1) and the calling
 * thread's precision (pt_set_precision: a bf16 job's): a one-layer model
 * built as a stage builds it, one warm-up and the median of PROFILE_RUNS
 * timed runs, each of F, B and W after the threads' caches were written
 * over (evict). The coordinator's loss and the optimizer update are measured
 * the same way. Measurements are cached per (layer spec, input shape,
 * microbatch, threads, precision) for the life of the process. A stage's F, B and W are
 * the sums over its layers (pt_partition's split, the runner's), a whole
 * backward B + W.
 *
 * Simulation. Each stage runs its schedule's task order (GPipe: every F,
 * then every backward; 1F1B and ZB-H1 as the stages run them, pipeline.h);
 * a task starts when its input is there: stage 1's forwards as the
 * coordinator sends them (all at once for GPipe, then p in flight), a
 * forward's output or a gradient one hand-over (profile_hop) after the task
 * producing it ends, a loss gradient after the coordinator's loss (GPipe:
 * all losses after the last output). The simulation steps from event to
 * event, completions and arrivals. The CPU is shared: while k tasks of t
 * threads run on a budget of C cores (n = k t threads), each proceeds at
 * min(1, C / n) s(min(n, C)) / s(t) of its measured speed, s(j) being one
 * thread's speed while j compute at once (work_speed: measured with the
 * candidate's costliest layer; core_speed's kernel for a slow one); a
 * hand-over in flight is one more thread (hop_sim). The step
 * ends with the optimizer update on every stage. Predicted step time,
 * bubble (1 - busy / (p x step)), samples per second and each stage's memory
 * (pt_job_memory_estimate for the schedule) make one plan.
 *
 * Devices: the same model holds for a GPU once its layers are measured
 * there; this file measures on the CPU only, so a plan is for CPU stages. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "dispatch.h"
#include "job.h"
#include "job_internal.h"
#include "log.h"
#include "loss.h"
#include "model.h"
#include "optim.h"
#include "ops.h"
#include "rng.h"
#include "runtime.h"
#include "stream.h"

#define PROFILE_RUNS 51  /* timed runs at most */
#define PROFILE_MIN  5   /* at least */
#define PROFILE_SECS 0.1 /* runs stop after this much timed work */
#define CACHE_MAX    512

typedef struct layer_cost {
	double f, b, w, opt;           /* seconds */
	int64_t in_floats, out_floats; /* the microbatch's input and output */
} layer_cost;

typedef struct cache_entry {
	pt_layer_spec spec;
	pt_act_shape in;
	int64_t batch;
	int threads;
	int precision; /* pt_precision of the measuring thread */
	layer_cost cost;
} cache_entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cache_entry cache[CACHE_MAX];
static int n_cache;

static bool same_shape(pt_act_shape a, pt_act_shape b)
{
	return a.dtype == b.dtype && a.seq == b.seq && a.features == b.features;
}

static bool cached(const pt_layer_spec *s, pt_act_shape in, int64_t B, int t, layer_cost *out)
{
	bool hit = false;
	pthread_mutex_lock(&cache_mu);
	for (int i = 0; i < n_cache && !hit; i++)
		if (cache[i].batch == B && cache[i].threads == t && same_shape(cache[i].in, in) &&
		    cache[i].precision == (int)pt_get_precision() &&
		    memcmp(&cache[i].spec, s, sizeof(*s)) == 0) {
			*out = cache[i].cost;
			hit = true;
		}
	pthread_mutex_unlock(&cache_mu);
	return hit;
}

static void remember(const pt_layer_spec *s, pt_act_shape in, int64_t B, int t, layer_cost c)
{
	pthread_mutex_lock(&cache_mu);
	if (n_cache < CACHE_MAX)
		cache[n_cache++] = (cache_entry){*s, in, B, t, (int)pt_get_precision(), c};
	pthread_mutex_unlock(&cache_mu);
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), by_value);
	return v[n / 2];
}

/* random_input fills x, the batch input of shape `in`, with tokens below
 * vocab or normal features. */
static pt_err random_input(pt_tensor *x, pt_act_shape in, int64_t B, int64_t vocab)
{
	pt_rng g;
	pt_rng_init(&g, 7, 0);
	if (in.dtype == PT_I64) {
		PT_TRY(pt_tensor_init(x, PT_I64, 2, (int64_t[]){B, in.seq}));
		for (int64_t i = 0; i < B * in.seq; i++)
			((int64_t *)pt_tensor_data(x))[i] =
			    (int64_t)(pt_rng_u32(&g) % (uint32_t)vocab);
		return PT_OK;
	}
	if (in.seq)
		PT_TRY(pt_tensor_init(x, PT_F32, 3, (int64_t[]){B, in.seq, in.features}));
	else
		PT_TRY(pt_tensor_init(x, PT_F32, 2, (int64_t[]){B, in.features}));
	pt_rng_normal(&g, pt_tensor_f32(x), pt_tensor_numel(x), 0.0f, 1.0f);
	return PT_OK;
}

/* evict_floats: how much each thread writes to evict its core's cache:
 * twice the L2 (sysconf; 2 MiB when unknown), 1 to 16 MiB. */
static size_t evict_floats(void)
{
	long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
	size_t b = l2 > 0 ? 2 * (size_t)l2 : (size_t)2 << 20;
	b = b < ((size_t)1 << 20) ? (size_t)1 << 20 : b > ((size_t)16 << 20) ? (size_t)16 << 20 : b;
	return b / sizeof(float);
}

/* evict writes over each of t threads' share of buf (n floats each): what
 * the layer left in their caches goes. In a stage, other layers and
 * microbatches run between a layer's F, B and W; timed back to back on hot
 * caches, examples/gpt.json's small layers came out about 10 % faster than
 * they run in a stage. */
static void evict(float *buf, size_t n, int t)
{
	if (buf == NULL)
		return;
#pragma omp parallel num_threads(t)
	{
		float *b = buf + (size_t)omp_get_thread_num() * n;
		for (size_t i = 0; i < n; i++)
			b[i] += 1.0f;
	}
}

/* profile_layer measures layer i of s (F, B, W and its optimizer update)
 * at microbatch B on t threads. */
static pt_err profile_layer(const pt_job_spec *s, pt_act_shape model_in, int i, int64_t B, int t,
                            layer_cost *out)
{
	pt_model_config mc = {.batch = B,
	                      .input = model_in,
	                      .n_slots = 1,
	                      .seed = 1,
	                      .split_backward = true,
	                      .precision = pt_get_precision()};
	double tf[PROFILE_RUNS], tb[PROFILE_RUNS], tw[PROFILE_RUNS], to[PROFILE_RUNS], spent = 0;
	int runs = 0;
	pt_model *m = NULL;
	pt_optimizer *o = NULL;
	pt_tensor x = {0}, dy = {0};
	const pt_tensor *y, *dx;
	pt_act_shape in;
	pt_err rv;

	PT_TRY(pt_model_create(&m, s->layers, s->n_layers, i, i + 1, &mc));
	in = pt_model_input_shape(m);
	if (cached(&s->layers[i], in, B, t, out)) {
		pt_model_destroy(m);
		return PT_OK;
	}
	if ((rv = random_input(&x, in, B, s->layers[0].vocab > 0 ? s->layers[0].vocab : 2)) !=
	        PT_OK ||
	    (rv = pt_optimizer_create(&o, &s->optim, pt_model_params(m), pt_model_grads(m))) !=
	        PT_OK)
		goto out;
	pt_set_num_threads(t);
	size_t ne = evict_floats();
	float *ev = calloc(ne * (size_t)t, sizeof(float)); /* NULL: warm runs */
	for (int r = -1; r < PROFILE_RUNS && rv == PT_OK; r++) {
		double t0, t1, t1b, t2, t2b, t3;
		if (r >= PROFILE_MIN && spent >= PROFILE_SECS)
			break;
		evict(ev, ne, t);
		t0 = pt_now();
		if ((rv = pt_model_forward(m, 0, &x, &y, true, 1, 0)) != PT_OK ||
		    (rv = pt_dispatcher_flush(pt_dispatcher_current())) != PT_OK)
			break;
		t1 = pt_now();
		evict(ev, ne, t);
		t1b = pt_now();
		if (dy.storage == NULL) {
			if ((rv = pt_tensor_init(&dy, PT_F32, y->ndim, y->shape)) != PT_OK)
				break;
			pt_rng g;
			pt_rng_init(&g, 8, 0);
			pt_rng_normal(&g, pt_tensor_f32(&dy), pt_tensor_numel(&dy), 0.0f, 1.0f);
		}
		if ((rv = pt_model_backward_input(m, 0, &dy, &dx)) != PT_OK ||
		    (rv = pt_dispatcher_flush(pt_dispatcher_current())) != PT_OK)
			break;
		t2 = pt_now();
		evict(ev, ne, t);
		t2b = pt_now();
		if ((rv = pt_model_backward_weight(m, 0)) != PT_OK ||
		    (rv = pt_dispatcher_flush(pt_dispatcher_current())) != PT_OK)
			break;
		t3 = pt_now();
		if (pt_model_num_params(m) > 0) {
			if ((rv = pt_optimizer_prepare(o, 1.0f)) != PT_OK ||
			    (rv = pt_optimizer_update(o)) != PT_OK ||
			    (rv = pt_model_zero_grad(m)) != PT_OK ||
			    (rv = pt_dispatcher_flush(pt_dispatcher_current())) != PT_OK)
				break;
			pt_optimizer_advance(o);
		}
		if (r >= 0) {
			tf[r] = t1 - t0;
			tb[r] = t2 - t1b;
			tw[r] = t3 - t2b;
			to[r] = pt_now() - t3;
			spent += pt_now() - t0;
			runs = r + 1;
		}
	}
	free(ev);
	if (rv == PT_OK) {
		pt_act_shape os = pt_model_output_shape(m);
		*out = (layer_cost){median(tf, runs),
		                    median(tb, runs),
		                    median(tw, runs),
		                    median(to, runs),
		                    B * (in.seq ? in.seq : 1) * (in.features ? in.features : 1),
		                    B * (os.seq ? os.seq : 1) * (os.features ? os.features : 1)};
		remember(&s->layers[i], in, B, t, *out);
	}
out:
	pt_tensor_fini(&x);
	pt_tensor_fini(&dy);
	pt_optimizer_destroy(o);
	pt_model_destroy(m);
	return rv;
}

/* profile_loss measures the coordinator's loss and its gradient for one
 * microbatch of the model's output. */
static pt_err profile_loss(const pt_job_spec *s, pt_act_shape model_in, int64_t B, int t,
                           double *out)
{
	pt_model_config mc = {.batch = B, .input = model_in, .n_slots = 1, .seed = 1};
	pt_model *m = NULL;
	pt_loss *l = NULL;
	pt_tensor pred = {0}, y = {0}, dpred = {0};
	double ts[PROFILE_MIN];
	int64_t shape[4], n = 0;
	int nd = 0;
	pt_act_shape o;
	pt_err rv;

	PT_TRY(pt_model_create(&m, s->layers, s->n_layers, s->n_layers - 1, s->n_layers, &mc));
	o = pt_model_output_shape(m);
	pt_model_destroy(m);
	shape[nd++] = B;
	if (o.seq)
		shape[nd++] = o.seq;
	shape[nd++] = o.features;
	if ((rv = pt_loss_create(&l, s->loss, nd, shape, s->ignore_index)) != PT_OK)
		return rv;
	if ((rv = pt_tensor_init(&pred, PT_F32, nd, shape)) != PT_OK ||
	    (rv = pt_tensor_init(&dpred, PT_F32, nd, shape)) != PT_OK)
		goto out;
	pt_rng g;
	pt_rng_init(&g, 9, 0);
	pt_rng_normal(&g, pt_tensor_f32(&pred), pt_tensor_numel(&pred), 0.0f, 1.0f);
	if (s->loss == PT_LOSS_MSE) {
		rv = pt_tensor_init(&y, PT_F32, nd, shape);
		if (rv == PT_OK)
			pt_rng_normal(&g, pt_tensor_f32(&y), pt_tensor_numel(&y), 0.0f, 1.0f);
	} else {
		rv = pt_tensor_init(&y, PT_I64, nd - 1, shape);
		for (int64_t i = 0; rv == PT_OK && i < pt_tensor_numel(&y); i++)
			((int64_t *)pt_tensor_data(&y))[i] =
			    (int64_t)(pt_rng_u32(&g) % (uint32_t)o.features);
	}
	pt_set_num_threads(t);
	for (int r = -1; r < PROFILE_MIN && rv == PT_OK; r++) {
		double t0 = pt_now(), loss;
		rv = pt_loss_compute_both(l, &pred, &y, 1.0f, &loss, &n, &dpred);
		if (r >= 0)
			ts[r] = pt_now() - t0;
	}
	if (rv == PT_OK)
		*out = median(ts, PROFILE_MIN);
out:
	pt_tensor_fini(&pred);
	pt_tensor_fini(&y);
	pt_tensor_fini(&dpred);
	pt_loss_destroy(l);
	return rv;
}

/* A send handed to a stream, as a stage hands each send to its rank's send
 * stream (pipeline/stage.c): the stream's thread pushes it. */
typedef struct hop_send {
	pt_comm *c;
	const pt_tensor *t;
	int64_t step;
	bool backward;
} hop_send;

static pt_err hop_send_run(void *arg)
{
	hop_send *h = arg;
	return h->backward ? pt_comm_send_backward(h->c, 0, h->t, h->step, 0)
	                   : pt_comm_send_forward(h->c, 1, h->t, h->step, 0);
}

/* A partner thread that echoes every forward back as a backward, through
 * its own send stream. */
typedef struct echo {
	pt_comm *c;
	pt_stream *tx;
} echo;

static void *echo_main(void *arg)
{
	echo *e = arg;
	for (;;) {
		pt_msg m = {0};
		if (pt_comm_recv(e->c, 0, PT_CH_FORWARD, -1, &m) != PT_OK)
			return NULL;
		if (m.meta.step < 0) {
			pt_msg_fini(&m);
			return NULL;
		}
		hop_send h = {e->c, &m.tensor, m.meta.step, true};
		if (pt_stream_enqueue(e->tx, hop_send_run, NULL, &h) == PT_OK)
			pt_stream_sync(e->tx, -1); /* h and m live until sent */
		pt_msg_fini(&m);
	}
}

/* profile_hop measures what handing a tensor of `floats` floats to another
 * thread costs as a stage hands it over: a copy, the send stream's thread
 * woken to push it, the receiver woken. Half the median round trip over the
 * in-process communicator, each way through a send stream. */
static double profile_hop(int64_t floats)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static double known[64];
	static int64_t known_n[64];
	static int n_known;
	pt_local_group *g = NULL;
	pt_comm *c[2] = {NULL, NULL};
	pt_tensor t = {0}, copy = {0};
	pt_stream *tx[2] = {NULL, NULL};
	echo e;
	pthread_t th;
	double ts[15], out = 0.0;

	pthread_mutex_lock(&mu);
	for (int i = 0; i < n_known; i++)
		if (known_n[i] == floats) {
			out = known[i];
			pthread_mutex_unlock(&mu);
			return out;
		}
	pthread_mutex_unlock(&mu);
	if (pt_local_group_create(&g, 2) != PT_OK || pt_local_comm_create(&c[0], g, 0) != PT_OK ||
	    pt_local_comm_create(&c[1], g, 1) != PT_OK ||
	    pt_tensor_init(&t, PT_F32, 1, (int64_t[]){floats > 0 ? floats : 1}) != PT_OK ||
	    pt_tensor_init(&copy, PT_F32, 1, (int64_t[]){floats > 0 ? floats : 1}) != PT_OK ||
	    pt_stream_create(&tx[0], "plan-tx0") != PT_OK ||
	    pt_stream_create(&tx[1], "plan-tx1") != PT_OK)
		goto out;
	e = (echo){c[1], tx[1]};
	if (pthread_create(&th, NULL, echo_main, &e) != 0)
		goto out;
	memset(pt_tensor_data(&t), 0, pt_tensor_nbytes(&t));
	for (int r = -2; r < 15; r++) {
		pt_msg m = {0};
		double t0 = pt_now();
		hop_send h = {c[0], &copy, r < 0 ? 0 : r, false};
		pt_copy(&copy, &t);
		if (pt_stream_enqueue(tx[0], hop_send_run, NULL, &h) != PT_OK ||
		    pt_comm_recv(c[0], 1, PT_CH_BACKWARD, 10000, &m) != PT_OK) {
			pt_stream_sync(tx[0], -1); /* h is on this stack */
			break;
		}
		pt_msg_fini(&m);
		if (r >= 0)
			ts[r] = (pt_now() - t0) / 2;
		if (r == 14)
			out = median(ts, 15);
	}
	pt_comm_send_forward(c[0], 1, &t, -1, 0);
	pthread_join(th, NULL);
	pthread_mutex_lock(&mu);
	if (n_known < 64) {
		known[n_known] = out;
		known_n[n_known++] = floats;
	}
	pthread_mutex_unlock(&mu);
out:
	pt_stream_destroy(tx[0]);
	pt_stream_destroy(tx[1]);
	pt_tensor_fini(&t);
	pt_tensor_fini(&copy);
	pt_comm_destroy(c[0]);
	pt_comm_destroy(c[1]);
	pt_local_group_destroy(g);
	return out;
}

/* ------------------------------------------------------- the host's cores -- */

/* How fast one thread computes while k threads compute at once, relative
 * to one thread alone: cores that share execution units (SMT siblings, a
 * VM's vCPUs on one physical core), caches or memory bandwidth give less
 * than 1. Measured once per process: k threads started together run a small
 * matrix product over and over; after SPEED_WARM seconds (the scheduler
 * spreads new threads over the cores only after a few ticks: a 1 ms kernel
 * timed from the start read 0.49 to 1.00 on a 2-vCPU VM) each counts its
 * products for SPEED_WINDOW seconds. The rate is the mean over the threads,
 * the median of SPEED_TRIALS. */
#define SPEED_MAX    64
#define SPEED_TRIALS 3
#define SPEED_N      64
#define SPEED_WARM   0.010
#define SPEED_WINDOW 0.030

static pthread_mutex_t speed_mu = PTHREAD_MUTEX_INITIALIZER;
static double speed_k[SPEED_MAX + 1];
static int speed_known; /* speed_k[1..speed_known] are measured */

/* A start gate: threads wait until the starter opens it or calls it off
 * (a thread that could not be created would keep a barrier shut for ever,
 * and a thread waiting at a barrier cannot be cancelled). */
typedef struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int state; /* 0 shut, 1 open, -1 called off */
} gate;

static void gate_init(gate *g)
{
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->state = 0;
}

static void gate_fini(gate *g)
{
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
}

/* gate_wait returns true once the gate opens, false when called off. */
static bool gate_wait(gate *g)
{
	pthread_mutex_lock(&g->mu);
	while (g->state == 0)
		pthread_cond_wait(&g->cv, &g->mu);
	bool open = g->state > 0;
	pthread_mutex_unlock(&g->mu);
	return open;
}

static void gate_set(gate *g, int state)
{
	pthread_mutex_lock(&g->mu);
	g->state = state;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* run_together runs fn(arg + i * size) on k threads at once (i = 0 on the
 * caller's), started through one gate; false when a thread could not be
 * created (nothing ran). */
static bool run_together(void *(*fn)(void *), void *arg, size_t size, int k, gate *g)
{
	pthread_t th[SPEED_MAX];
	int started = 0;

	for (int i = 1; i < k; i++)
		if (pthread_create(&th[i], NULL, fn, (char *)arg + (size_t)i * size) == 0)
			started++;
		else
			break;
	gate_set(g, started == k - 1 ? 1 : -1);
	if (started == k - 1)
		fn(arg);
	for (int i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	return started == k - 1;
}

typedef struct speed_run {
	gate *go;
	double rate; /* products a second in the window */
	float sink;
} speed_run;

static void speed_product(const float *a, const float *b, float *c)
{
	for (int i = 0; i < SPEED_N; i++)
		for (int k = 0; k < SPEED_N; k++) {
			float v = a[i * SPEED_N + k] * 1e-3f;
			for (int j = 0; j < SPEED_N; j++)
				c[i * SPEED_N + j] += v * b[k * SPEED_N + j];
		}
}

static void *speed_main(void *arg)
{
	speed_run *r = arg;
	float *a = malloc(3 * SPEED_N * SPEED_N * sizeof(float)), *b = NULL, *c = NULL;
	double t0, from = 0.0, now;
	long n = 0;
	if (a != NULL) {
		b = a + SPEED_N * SPEED_N;
		c = b + SPEED_N * SPEED_N;
		for (int i = 0; i < SPEED_N * SPEED_N; i++) {
			a[i] = (float)(i % 7) * 0.25f;
			b[i] = (float)(i % 5) * 0.5f;
			c[i] = 0.0f;
		}
	}
	if (!gate_wait(r->go)) {
		free(a);
		return NULL;
	}
	t0 = now = pt_now();
	while (a != NULL && now - t0 < SPEED_WARM + SPEED_WINDOW) {
		speed_product(a, b, c);
		now = pt_now();
		if (from > 0.0)
			n++;
		else if (now - t0 >= SPEED_WARM)
			from = now; /* count from here */
	}
	r->rate = from > 0.0 && now > from ? (double)n / (now - from) : 0.0;
	r->sink = a != NULL ? c[SPEED_N + 1] : 0.0f;
	free(a);
	return NULL;
}

/* kernel_rate: one thread's mean rate while k threads run the kernel. */
static double kernel_rate(int k)
{
	speed_run r[SPEED_MAX];
	gate go;
	double sum = 0.0;
	bool ok;

	gate_init(&go);
	for (int i = 0; i < k; i++)
		r[i] = (speed_run){.go = &go};
	ok = run_together(speed_main, r, sizeof(r[0]), k, &go);
	gate_fini(&go);
	for (int i = 0; ok && i < k; i++)
		sum += r[i].rate;
	return ok ? sum / k : 0.0;
}

/* core_speed returns speed_k[k] for k up to `cores` (measuring what is not
 * known yet); 1 where a measurement failed. */
static double core_speed(int k, int cores)
{
	double out;
	if (cores > SPEED_MAX)
		cores = SPEED_MAX;
	if (k > cores)
		k = cores;
	if (k < 1)
		return 1.0;
	pthread_mutex_lock(&speed_mu);
	if (speed_known < cores) {
		double base[SPEED_TRIALS], t[SPEED_TRIALS];
		for (int i = 0; i < SPEED_TRIALS; i++)
			base[i] = kernel_rate(1);
		double one = median(base, SPEED_TRIALS);
		speed_k[1] = 1.0;
		for (int j = speed_known > 1 ? speed_known + 1 : 2; j <= cores; j++) {
			for (int i = 0; i < SPEED_TRIALS; i++)
				t[i] = kernel_rate(j);
			double rj = median(t, SPEED_TRIALS);
			speed_k[j] = one > 0 && rj > 0 ? fmin(1.0, rj / one) : 1.0;
			pt_debug("planner: %d threads at once compute at %.2f of one alone", j,
			         speed_k[j]);
		}
		speed_known = cores;
	}
	out = speed_k[k];
	pthread_mutex_unlock(&speed_mu);
	return out;
}

/* How fast the job's own work runs while k copies of it run at once: its
 * costliest layer (at the candidate's microbatch, the job's precision), one
 * one-layer model per thread as stages have, forward, backward and weight
 * gradient over and over. The kernel above reads the cores' arithmetic
 * alone; a transformer block's mix of products, reductions and element-wise
 * passes lost less to a second busy vCPU (examples/gpt.json at p = 2 ran as
 * if s(2) were 1.00 while the kernel read 0.83: the plans came out 14 to 27 %
 * high). Each thread counts the iterations that start after LS_WARM and end
 * within LS_WINDOW (at least LS_ITERS iterations' worth) and keeps working
 * until every thread is through, so none is timed alone at the end; its
 * rate is iterations over the time from the first counted start to the
 * last counted end. The median of SPEED_TRIALS over one thread's. Layers
 * slower than LS_MAX_ITER a go (at one thread), or whose copies for every
 * core would take more than LS_MAX_MEM (a wide layer on a many-core host:
 * the planner runs inside the server, outside any job's admitted memory),
 * use the kernel instead. */
#define LS_WARM     0.010
#define LS_WINDOW   0.030
#define LS_ITERS    4
#define LS_MAX_ITER 0.025
#define LS_MAX_MEM  ((double)(512 << 20)) /* the copies at most, in all */
#define LS_CACHE    32

typedef struct lspeed_run {
	const pt_job_spec *spec;
	pt_act_shape in;
	int layer;
	int64_t B;
	pt_precision prec;
	double warm, window;
	gate *go;
	atomic_int *through; /* threads past their window */
	int k;
	double rate; /* iterations a second; 0: failed */
} lspeed_run;

typedef struct lspeed_entry {
	pt_layer_spec spec;
	pt_act_shape in;
	int64_t B;
	int precision, n;
	double s[SPEED_MAX + 1];
} lspeed_entry;

static lspeed_entry lspeed_cache[LS_CACHE];
static int n_lspeed;

static void *lspeed_main(void *arg)
{
	lspeed_run *r = arg;
	pt_model_config mc = {.batch = r->B,
	                      .input = r->in,
	                      .n_slots = 1,
	                      .seed = 1,
	                      .split_backward = true,
	                      .precision = r->prec};
	pt_model *m = NULL;
	pt_tensor x = {0}, dy = {0};
	const pt_tensor *y = NULL, *dx;
	double t0, first = 0.0, last = 0.0;
	long n = 0;
	bool ok, counted = false;

	pt_set_precision(r->prec);
	pt_set_num_threads(1);
	ok = pt_model_create(&m, r->spec->layers, r->spec->n_layers, r->layer, r->layer + 1, &mc) ==
	         PT_OK &&
	     random_input(&x, pt_model_input_shape(m), r->B,
	                  r->spec->layers[0].vocab > 0 ? r->spec->layers[0].vocab : 2) == PT_OK;
	if (ok) { /* one untimed go for the output's shape and warm code paths */
		ok = pt_model_forward(m, 0, &x, &y, true, 1, 0) == PT_OK &&
		     pt_dispatcher_flush(pt_dispatcher_current()) == PT_OK &&
		     pt_tensor_init(&dy, PT_F32, y->ndim, y->shape) == PT_OK;
		if (ok)
			memset(pt_tensor_data(&dy), 0, pt_tensor_nbytes(&dy));
	}
	if (!gate_wait(r->go))
		ok = false;
	t0 = pt_now();
	while (ok) {
		double a = pt_now(), b;
		ok = pt_model_forward(m, 0, &x, &y, true, 1, 0) == PT_OK &&
		     pt_model_backward_input(m, 0, &dy, &dx) == PT_OK &&
		     pt_model_backward_weight(m, 0) == PT_OK &&
		     pt_dispatcher_flush(pt_dispatcher_current()) == PT_OK;
		b = pt_now();
		if (a - t0 >= r->warm && b - t0 <= r->warm + r->window) {
			if (n++ == 0)
				first = a;
			last = b;
		}
		if (b - t0 > r->warm + r->window) {
			if (!counted) {
				counted = true;
				atomic_fetch_add(r->through, 1);
			}
			if (atomic_load(r->through) >= r->k)
				break;
		}
	}
	if (!counted)
		atomic_fetch_add(r->through, 1); /* failed: let the others stop */
	r->rate = ok && n > 0 && last > first ? (double)n / (last - first) : 0.0;
	pt_tensor_fini(&x);
	pt_tensor_fini(&dy);
	pt_model_destroy(m);
	pt_clear_error();
	return NULL;
}

/* layer_rate: one thread's mean rate while k threads run layer l; 0 when
 * a thread failed. */
static double layer_rate(const pt_job_spec *s, pt_act_shape in, int l, int64_t B, double iter,
                         int k)
{
	lspeed_run r[SPEED_MAX];
	gate go;
	atomic_int through = 0;
	double sum = 0.0;
	bool ok;

	gate_init(&go);
	for (int i = 0; i < k; i++)
		r[i] = (lspeed_run){.spec = s,
		                    .in = in,
		                    .layer = l,
		                    .B = B,
		                    .prec = pt_get_precision(),
		                    .warm = fmax(LS_WARM, iter),
		                    .window = fmax(LS_WINDOW, LS_ITERS * iter),
		                    .go = &go,
		                    .through = &through,
		                    .k = k};
	ok = run_together(lspeed_main, r, sizeof(r[0]), k, &go);
	gate_fini(&go);
	for (int i = 0; ok && i < k; i++) {
		if (r[i].rate <= 0.0)
			return 0.0;
		sum += r[i].rate;
	}
	return ok ? sum / k : 0.0;
}

/* work_speed fills speed[1..n] for layer l of s at microbatch B (iter:
 * its forward and backward's seconds at one thread), measured once per
 * (layer, input, B, precision); from the kernel (core_speed) where the
 * layer is too slow to time or a measurement fails. */
static void work_speed(const pt_job_spec *s, pt_act_shape in, int l, int64_t B, double iter, int n,
                       int threads, double *speed)
{
	lspeed_entry e = {
	    .spec = s->layers[l], .in = in, .B = B, .precision = (int)pt_get_precision()};
	bool hit = false;

	pthread_mutex_lock(&speed_mu);
	for (int i = 0; i < n_lspeed && !hit; i++) {
		lspeed_entry *c = &lspeed_cache[i];
		if (c->B == B && c->precision == e.precision && c->n >= n &&
		    same_shape(c->in, in) && memcmp(&c->spec, &e.spec, sizeof(e.spec)) == 0) {
			memcpy(speed + 1, c->s + 1, sizeof(double) * (size_t)n);
			hit = true;
		}
	}
	pthread_mutex_unlock(&speed_mu);
	if (hit)
		return;
	double copy = pt_job_model_bytes(s, in, l, l + 1, (double)B);
	speed[1] = e.s[1] = 1.0;
	if (iter > LS_MAX_ITER || n * copy > LS_MAX_MEM) {
		for (int k = 2; k <= n; k++)
			speed[k] = core_speed(k, threads);
		return;
	}
	double one, t[SPEED_TRIALS];
	for (int i = 0; i < SPEED_TRIALS; i++)
		t[i] = layer_rate(s, in, l, B, iter, 1);
	one = median(t, SPEED_TRIALS);
	for (int k = 2; k <= n; k++) {
		for (int i = 0; i < SPEED_TRIALS; i++)
			t[i] = one > 0.0 ? layer_rate(s, in, l, B, iter, k) : 0.0;
		double rk = median(t, SPEED_TRIALS);
		speed[k] = one > 0.0 && rk > 0.0 ? fmin(1.0, rk / one) : core_speed(k, threads);
		pt_debug("planner: %d copies of layer %d (microbatch %lld, %.1f MB each) at once "
		         "run at %.2f of one alone",
		         k, l, (long long)B, copy / 1e6, speed[k]);
	}
	memcpy(e.s + 1, speed + 1, sizeof(double) * (size_t)n);
	e.n = n;
	pthread_mutex_lock(&speed_mu);
	if (n_lspeed < LS_CACHE)
		lspeed_cache[n_lspeed++] = e;
	pthread_mutex_unlock(&speed_mu);
}

void pt_job_plan_forget(void)
{
	pthread_mutex_lock(&cache_mu);
	n_cache = 0;
	pthread_mutex_unlock(&cache_mu);
	pthread_mutex_lock(&speed_mu);
	speed_known = 0;
	n_lspeed = 0;
	pthread_mutex_unlock(&speed_mu);
}

/* ------------------------------------------------------------ simulation -- */

enum { T_F, T_B, T_W, T_BW };

typedef struct task {
	int kind, mb;
	int stage; /* the logical stage (0-based): the rank's, or its chunk's */
} task;

/* One rank: its task order over its stages (one, or v chunks). */
typedef struct rank_sim {
	task *order;
	int n, pos;
	double left; /* work left of the running task (seconds at full speed) */
	bool running;
	double busy;
} rank_sim;

/* One logical stage's costs and its messages' arrival times. */
typedef struct stage_sim {
	double f, b, w; /* seconds per microbatch */
	double *f_done; /* per microbatch: when its forward's output is available */
	double *b_done; /* per microbatch: when its input gradient is available */
} stage_sim;

/* A hand-over in flight. It is work for a core too: the copy and the
 * threads it wakes (its CPU time was 75 to 95 % of its latency on a 2-vCPU
 * VM), so it shares the cores with the tasks as a thread of its own; its
 * measured latency is its work at full speed. */
typedef struct hop_sim {
	double left; /* seconds of work left at full speed */
	double *at;  /* where its arrival time goes */
} hop_sim;

/* hop_start sends a hand-over of `work` seconds now; it arrives at once
 * when work is 0. The array holds every hand-over of a step (simulate's
 * hop_cap), so it never fills. */
static void hop_start(hop_sim *h, int *n, double work, double *at, double now)
{
	if (work <= 0.0)
		*at = now;
	else
		h[(*n)++] = (hop_sim){work, at};
}

/* order_of writes rank r's (1-based) task order for the schedule: stage
 * r - 1's, or with v > 1 the interleaved order over its chunks. */
static int order_of(pt_pipe_schedule sc, int p, int v, int m, int r, task *o)
{
	int n = 0, f = 0, b = 0, nw = 0, wq = 0;
	int warm = p - r + 1 < m ? p - r + 1 : m, defer = r - 1;
	if (sc == PT_SCHED_INTERLEAVED) {
		pt_chunk_task *c = calloc((size_t)(2 * m * v), sizeof(*c));
		if (c == NULL || pt_pipe_interleaved_order(r, p, v, m, c) != PT_OK) {
			free(c);
			return -1;
		}
		for (int k = 0; k < 2 * m * v; k++)
			o[n++] =
			    (task){c[k].backward ? T_BW : T_F, c[k].mb, c[k].chunk * p + r - 1};
		free(c);
		return n;
	}
	if (sc == PT_SCHED_GPIPE) {
		for (int k = 0; k < m; k++)
			o[n++] = (task){T_F, k, r - 1};
		for (int k = 0; k < m; k++)
			o[n++] = (task){T_BW, k, r - 1};
		return n;
	}
	while (b < m) {
		if (f - b < warm && f < m) {
			o[n++] = (task){T_F, f++, r - 1};
			continue;
		}
		o[n++] = (task){sc == PT_SCHED_ZBH1 ? T_B : T_BW, b++, r - 1};
		if (sc != PT_SCHED_ZBH1)
			continue;
		nw++;
		while (nw > (b < m ? defer : 0)) {
			o[n++] = (task){T_W, wq++, r - 1};
			nw--;
		}
	}
	return n;
}

/* ready_at is when task t of a rank can start: its input's arrival. */
static double ready_at(const stage_sim *st, int nl, const double *inject, const double *loss_end,
                       task t, double now)
{
	if (t.kind == T_F)
		return t.stage == 0 ? inject[t.mb] : st[t.stage - 1].f_done[t.mb];
	if (t.kind == T_W)
		return now;
	return t.stage == nl - 1 ? loss_end[t.mb] : st[t.stage + 1].b_done[t.mb];
}

/* simulate predicts one step: *step (seconds) and *bubble. p ranks hold
 * p * v logical stages (v > 1: interleaved), whose costs sf, sb, sw, so and
 * hand-overs hop_f, hop_b are indexed by logical stage. */
static pt_err simulate(pt_pipe_schedule sc, int p, int v, int m, const double *sf, const double *sb,
                       const double *sw, const double *so, const double *hop_f, const double *hop_b,
                       double hop0, double loss_s, int threads, int tps, const double *speed,
                       int n_speed, double *step, double *bubble)
{
	/* speed[k], k = 1..n_speed: core_speed's figures (k beyond: the last). */
#define SPEED(k) speed[(k) < 1 ? 1 : (k) > n_speed ? n_speed : (k)]
	int nl = p * v, per_rank = 3 * m * v + 4;
	rank_sim rk[PT_MAX_STAGES];
	stage_sim st[PT_MAX_STAGES];
	double *mem = calloc((size_t)(nl * 2) * (size_t)m, sizeof(double));
	/* Hand-overs: one per microbatch and stage each way, a loss gradient
	 * and an injection per microbatch, in a step (all of them, not only
	 * those in flight at once). */
	int hop_cap = 2 * nl * m + 2 * m + 4, n_hops = 0;
	hop_sim *hops = calloc((size_t)hop_cap, sizeof(hop_sim));
	task *orders = calloc((size_t)p * (size_t)per_rank, sizeof(task));
	double *loss_end = calloc((size_t)m, sizeof(double)),
	       *inject = calloc((size_t)m, sizeof(double));
	double now = 0.0, busy = 0.0, opt = 0.0;
	int out_n = 0;
	double loss_left = 0.0;
	bool loss_running = false;
	int loss_mb = 0;
	/* GPipe and interleaved: the coordinator sends every input at once;
	 * the others keep p in flight. */
	bool all_in = sc == PT_SCHED_GPIPE || sc == PT_SCHED_INTERLEAVED;
	pt_err rv = PT_OK;

	if (mem == NULL || orders == NULL || loss_end == NULL || inject == NULL || hops == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "planner");
		goto out;
	}
	for (int s = 0; s < nl; s++) {
		st[s] = (stage_sim){.f = sf[s],
		                    .b = sb[s],
		                    .w = sw[s],
		                    .f_done = mem + (size_t)(2 * s) * (size_t)m,
		                    .b_done = mem + (size_t)(2 * s + 1) * (size_t)m};
		for (int k = 0; k < m; k++)
			st[s].f_done[k] = st[s].b_done[k] = INFINITY;
	}
	for (int r = 0; r < p; r++) {
		rk[r] = (rank_sim){.order = orders + (size_t)r * (size_t)per_rank};
		if ((rk[r].n = order_of(sc, p, v, m, r + 1, rk[r].order)) < 0) {
			rv =
			    pt_set_error(PT_ERR_INVALID, "planner: no %s order for %d stages, m %d",
			                 pt_pipe_schedule_name(sc), p, m);
			goto out;
		}
	}
	for (int k = 0; k < m; k++) {
		loss_end[k] = INFINITY;
		inject[k] = all_in || k < p ? 0.0 : INFINITY;
	}
	/* Event loop: start what can start, advance to the next completion. */
	for (int guard = 0; guard < 100 * nl * m + 100; guard++) {
		int active = 0;
		double rate, lrate, dt = INFINITY;
		bool all_done = true;
		for (int r = 0; r < p; r++) {
			rank_sim *x = &rk[r];
			if (x->pos < x->n)
				all_done = false;
			if (x->running || x->pos >= x->n)
				continue;
			task t = x->order[x->pos];
			if (ready_at(st, nl, inject, loss_end, t, now) <= now) {
				const stage_sim *y = &st[t.stage];
				x->running = true;
				x->left = t.kind == T_F   ? y->f
				          : t.kind == T_B ? y->b
				          : t.kind == T_W ? y->w
				                          : y->b + y->w;
			}
		}
		/* The coordinator's losses, in microbatch order as outputs arrive
		 * (GPipe: after the last output). */
		if (!loss_running && loss_mb < m) {
			bool ready =
			    sc == PT_SCHED_GPIPE ? out_n == m : st[nl - 1].f_done[loss_mb] <= now;
			if (ready) {
				loss_running = true;
				loss_left = loss_s;
			}
		}
		if (all_done && loss_mb >= m)
			break;
		for (int r = 0; r < p; r++)
			active += rk[r].running ? tps : 0;
		active += (loss_running ? 1 : 0) + n_hops;
		if (active == 0) {
			/* Nothing runs and no message is on its way: every message
			 * arrives through a hand-over in flight, so the order stalls. */
			rv = pt_set_error(PT_ERR_STATE, "planner: the %s order stalls",
			                  pt_pipe_schedule_name(sc));
			goto out;
		}
		/* Time-shared beyond the cores; on them, each thread at the speed
		 * the cores keep with this many computing (a task's profile has
		 * its own threads' share of that already). */
		rate = (active > threads ? (double)threads / active : 1.0) * SPEED(active);
		lrate = rate / SPEED(1);
		rate /= SPEED(tps);
		for (int r = 0; r < p; r++)
			if (rk[r].running && rk[r].left / rate < dt)
				dt = rk[r].left / rate;
		if (loss_running && loss_left / lrate < dt)
			dt = loss_left / lrate;
		for (int h = 0; h < n_hops; h++)
			if (hops[h].left / lrate < dt)
				dt = hops[h].left / lrate;
		now += dt; /* to the next completion: a task's, the loss's or a hand-over's */
		/* Hand-overs first: those the completions below start begin now. */
		for (int h = 0; h < n_hops;) {
			hops[h].left -= dt * lrate;
			if (hops[h].left > 1e-12) {
				h++;
				continue;
			}
			*hops[h].at = now;
			hops[h] = hops[--n_hops];
		}
		for (int r = 0; r < p; r++) {
			rank_sim *x = &rk[r];
			if (!x->running)
				continue;
			x->left -= dt * rate;
			x->busy += dt; /* wall time the task occupied the rank */
			if (x->left > 1e-12)
				continue;
			task t = x->order[x->pos++];
			x->running = false;
			if (t.kind == T_F) {
				hop_start(hops, &n_hops, hop_f[t.stage], &st[t.stage].f_done[t.mb],
				          now);
				if (t.stage == nl - 1)
					out_n++;
			} else if (t.kind != T_W) {
				hop_start(hops, &n_hops, hop_b[t.stage], &st[t.stage].b_done[t.mb],
				          now);
				if (t.stage == 0 && t.mb + p < m && !all_in)
					hop_start(hops, &n_hops, 2 * hop0, &inject[t.mb + p],
					          now); /* DONE, then a forward */
			}
		}
		if (loss_running) {
			loss_left -= dt * lrate;
			if (loss_left <= 1e-12) {
				loss_running = false;
				hop_start(hops, &n_hops, hop_f[nl - 1], &loss_end[loss_mb++], now);
			}
		}
	}
	for (int r = 0; r < p; r++) {
		if (rk[r].pos < rk[r].n) {
			rv = pt_set_error(PT_ERR_STATE, "planner: stage %d did not finish", r + 1);
			goto out;
		}
		busy += rk[r].busy;
	}
	/* The optimizer update on every stage at once. */
	{
		double rate = (nl * tps > threads ? (double)threads / (nl * tps) : 1.0) *
		              SPEED(nl * tps) / SPEED(tps);
		for (int s = 0; s < nl; s++)
			opt = so[s] / rate > opt ? so[s] / rate : opt;
	}
	/* Then the gradient norms, the step and the timeline: three rounds of
	 * a command to every stage and its reply. */
	*step = now + opt + 3.0 * (nl + 1) * hop0;
	*bubble = now > 0 ? 1.0 - busy / (p * now) : 0.0;
#undef SPEED
out:
	free(mem);
	free(orders);
	free(loss_end);
	free(inject);
	free(hops);
	return rv;
}

pt_err pt_plan_simulate_uniform(pt_pipe_schedule sc, int p, int m, double f, double b, double w,
                                double hop, int threads, const double *speed, int n_speed,
                                double *step, double *bubble)
{
	double sf[PT_MAX_STAGES], sb[PT_MAX_STAGES], sw[PT_MAX_STAGES], so[PT_MAX_STAGES],
	    hf[PT_MAX_STAGES], hb[PT_MAX_STAGES];
	if (p < 1 || p > PT_MAX_STAGES || n_speed < 1)
		return pt_set_error(PT_ERR_RANGE, "stages: %d", p);
	for (int s = 0; s < p; s++) {
		sf[s] = f;
		sb[s] = b;
		sw[s] = w;
		so[s] = 0.0;
		hf[s] = hop;
		hb[s] = s > 0 ? hop : 0.0;
	}
	return simulate(sc, p, 1, m, sf, sb, sw, so, hf, hb, hop, 0.0, threads, 1, speed, n_speed,
	                step, bubble);
}

/* --------------------------------------------------------------- planning -- */

static int by_step(const void *a, const void *b)
{
	const pt_job_plan *x = a, *y = b;
	return x->step_seconds < y->step_seconds ? -1 : x->step_seconds > y->step_seconds;
}

pt_err pt_job_plan_run(const pt_job_spec *spec, const pt_job_plan_options *o, pt_job_plan **out,
                       int *n_out)
{
	static const pt_pipe_schedule scheds[] = {PT_SCHED_GPIPE, PT_SCHED_1F1B, PT_SCHED_ZBH1,
	                                          PT_SCHED_INTERLEAVED};
	int ps[8], ms[8], np = 0, nm = 0, threads = o->threads > 0 ? o->threads : pt_num_cores();
	pt_job_data_shape d;
	pt_job_plan *v = NULL;
	int n = 0;
	pt_precision prev_prec;
	pt_err rv;

	*out = NULL;
	*n_out = 0;
	if (spec->mode == PT_MODE_ASYNC)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "mode: Async has its own schedule; plan a Sync or SemiAsync job");
	if (spec->n_workers > 0 || (spec->device != NULL && strncmp(spec->device, "cuda:", 5) == 0))
		return pt_set_error(
		    PT_ERR_UNSUPPORTED,
		    "the planner measures CPU stages in this process; the job names "
		    "%s",
		    spec->n_workers > 0 ? "placement.workers" : "a CUDA device");
	PT_TRY(pt_job_data_shape_read(spec, o->files_root, o->any_path, &d));
	pt_act_shape in = pt_job_spec_input_shape(spec, d.features);
	if (o->n_stages > 0)
		for (int i = 0; i < o->n_stages && np < 8; i++)
			ps[np++] = o->stages[i];
	else
		ps[np++] = spec->stages;
	if (o->n_microbatches > 0)
		for (int i = 0; i < o->n_microbatches && nm < 8; i++)
			ms[nm++] = o->microbatches[i];
	else
		ms[nm++] = spec->microbatches;
	/* Every candidate is checked before any is measured (and before
	 * anything divides by its stages). */
	for (int i = 0; i < np; i++)
		if (ps[i] < 1 || ps[i] > PT_MAX_STAGES || ps[i] > spec->n_layers)
			return pt_set_error(
			    PT_ERR_RANGE, "stages: %d (1 to %d for this model)", ps[i],
			    spec->n_layers < PT_MAX_STAGES ? spec->n_layers : PT_MAX_STAGES);
	for (int j = 0; j < nm; j++)
		if (ms[j] < 1 || spec->batch_size % ms[j] != 0)
			return pt_set_error(PT_ERR_INVALID,
			                    "microbatches: %d does not divide batch_size %lld",
			                    ms[j], (long long)spec->batch_size);
	if ((v = calloc((size_t)(np * nm * 4), sizeof(*v))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "plans");
	/* How the cores keep their speed with several threads at work: per
	 * candidate, from its costliest layer (work_speed). */
	double speed[SPEED_MAX + 1];
	int n_speed = threads < SPEED_MAX ? threads : SPEED_MAX;
	/* Layers are measured at the job's precision. */
	prev_prec = pt_get_precision();
	pt_set_precision(pt_job_spec_precision(spec));
	for (int i = 0; i < np; i++)
		for (int j = 0; j < nm; j++) {
			int p = ps[i], m = ms[j];
			int tps = spec->threads_per_stage > 0 ? spec->threads_per_stage
			                                      : (threads / p > 1 ? threads / p : 1);
			/* Profiling runs layers at this candidate's microbatch: admitted
			 * first, as the job itself would be (a spec admitted at 1024
			 * microbatches once profiled at 1, 26 times the limit). */
			if (o->host_limit > 0) {
				pt_job_spec t = *spec;
				pt_job_memory mem;
				t.stages = p;
				t.microbatches = m;
				t.boundaries = NULL;
				t.schedule = NULL;
				t.virtual_stages = 0;
				if ((rv = pt_job_memory_estimate(&t, &d, &mem)) != PT_OK)
					goto fail;
				if (mem.host > o->host_limit) {
					char need[64], lim[64];
					pt_job_memory_format(need, sizeof(need), mem.host);
					pt_job_memory_format(lim, sizeof(lim), o->host_limit);
					rv = pt_set_error(
					    PT_ERR_RANGE,
					    "memory: %d stages of %d microbatches need an "
					    "estimated %s of host memory, more than the "
					    "server's limit of %s (--memory-limit)",
					    p, m, need, lim);
					goto fail;
				}
			}
			/* v = 1: gpipe, 1f1b, zb-h1; v = 2: interleaved, where it fits. */
			for (int vs = 1; vs <= 2; vs++) {
				int nl = p * vs, first[PT_MAX_STAGES + 1];
				double sf[PT_MAX_STAGES] = {0}, sb[PT_MAX_STAGES] = {0},
				       sw[PT_MAX_STAGES] = {0}, so[PT_MAX_STAGES] = {0},
				       hf[PT_MAX_STAGES] = {0}, hb[PT_MAX_STAGES] = {0}, loss_s = 0,
				       hop0;
				int64_t B = spec->batch_size / m;
				int heavy = -1;
				double heavy_s = 0.0;
				if (vs > 1 && (nl > PT_MAX_STAGES || nl > spec->n_layers ||
				               (p > 1 && m % p != 0)))
					continue;
				if (vs == 1 && spec->boundaries != NULL && p == spec->stages)
					memcpy(first, spec->boundaries,
					       sizeof(int) * (size_t)(p + 1));
				else if ((rv = pt_partition(spec->layers, spec->n_layers, in, nl,
				                            first)) != PT_OK)
					goto fail;
				for (int s = 0; s < nl; s++)
					for (int l = first[s]; l < first[s + 1]; l++) {
						layer_cost c = {0};
						if ((rv = profile_layer(spec, in, l, B, tps, &c)) !=
						    PT_OK)
							goto fail;
						if (heavy < 0 || c.f + c.b + c.w > heavy_s) {
							heavy = l;
							heavy_s = c.f + c.b + c.w;
						}
						sf[s] += c.f;
						sb[s] += c.b;
						sw[s] += c.w;
						so[s] += c.opt;
						if (l == first[s])
							hb[s] =
							    s > 0 ? profile_hop(c.in_floats) : 0.0;
						if (l == first[s + 1] - 1)
							hf[s] = profile_hop(c.out_floats);
					}
				hop0 = profile_hop(1);
				/* A layer's time on tps threads, as at one. */
				work_speed(spec, in, heavy, B, heavy_s * tps, n_speed, threads,
				           speed);
				if ((rv = profile_loss(spec, in, B, 1, &loss_s)) != PT_OK)
					goto fail;
				for (int s = 0; s < nl; s++)
					pt_debug("planner: p %d v %d m %d, stage %d of %d threads: "
					         "F %.3f B "
					         "%.3f W %.3f update %.3f, hops %.3f %.3f ms; loss "
					         "%.3f ms",
					         p, vs, m, s, tps, sf[s] * 1e3, sb[s] * 1e3,
					         sw[s] * 1e3, so[s] * 1e3, hf[s] * 1e3, hb[s] * 1e3,
					         loss_s * 1e3);
				for (size_t k = 0; k < sizeof(scheds) / sizeof(scheds[0]); k++) {
					pt_job_plan *pl = &v[n];
					if ((scheds[k] == PT_SCHED_INTERLEAVED) != (vs > 1))
						continue;
					if (scheds[k] == PT_SCHED_ZBH1 && spec->recompute)
						continue; /* refused together (validate.c) */
					pt_job_spec t = *spec;
					pt_job_memory mem;
					memset(pl, 0, sizeof(*pl));
					pl->schedule = scheds[k];
					pl->stages = p;
					pl->virtual_stages = vs;
					pl->microbatches = m;
					memcpy(pl->first, first, sizeof(int) * (size_t)(nl + 1));
					if ((rv = simulate(scheds[k], p, vs, m, sf, sb, sw, so, hf,
					                   hb, hop0, loss_s, threads, tps, speed,
					                   n_speed, &pl->step_seconds,
					                   &pl->bubble)) != PT_OK)
						goto fail;
					pl->samples_per_s =
					    pl->step_seconds > 0
					        ? (double)spec->batch_size / pl->step_seconds
					        : 0;
					t.stages = p;
					t.microbatches = m;
					t.boundaries =
					    vs == 1 ? pl->first : NULL; /* interleaved:
					                                 * the estimate cuts
					                                 * p * v itself */
					t.schedule = (char *)pt_pipe_schedule_name(scheds[k]);
					t.virtual_stages = vs > 1 ? vs : 0;
					if (pt_job_memory_estimate(&t, &d, &mem) == PT_OK)
						for (int s = 0; s < nl; s++)
							pl->stage_bytes[s] = mem.stages[s].total;
					n++;
				}
			}
		}
	pt_set_num_threads(threads);
	pt_set_precision(prev_prec);
	qsort(v, (size_t)n, sizeof(*v), by_step);
	*out = v;
	*n_out = n;
	return PT_OK;
fail:
	pt_set_num_threads(threads);
	pt_set_precision(prev_prec);
	free(v);
	return rv;
}
