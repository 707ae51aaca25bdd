/* test_exec.c - streams, events and the async executor (seed 000) and the
 * graph manager (seed 002) on the CPU backend. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "executor.h"
#include "graph.h"
#include "ops.h"
#include "pt_test.h"
#include "rng.h"
#include "train.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- streams ---- */

typedef struct log_item {
	int *log;
	atomic_int *n;
	int value;
	int sleep_ms;
	atomic_int *started; /* counts items that began (may be NULL) */
	int rendezvous;      /* wait until this many items began (5 s at most) */
} log_item;

/* wait_count polls until *a >= n or 5 s pass; returns whether it got there. */
static bool wait_count(atomic_int *a, int n)
{
	for (int i = 0; i < 5000 && atomic_load(a) < n; i++)
		usleep(1000);
	return atomic_load(a) >= n;
}

static pt_err log_fn(void *arg)
{
	log_item *it = arg;
	if (it->started)
		atomic_fetch_add(it->started, 1);
	if (it->rendezvous && !wait_count(it->started, it->rendezvous))
		return pt_set_error(PT_ERR_TIMEOUT, "item %d ran alone", it->value);
	if (it->sleep_ms)
		usleep((useconds_t)it->sleep_ms * 1000);
	it->log[atomic_fetch_add(it->n, 1)] = it->value;
	return PT_OK;
}

static void count_done(void *arg, pt_err rv)
{
	log_item *it = arg;
	if (rv == PT_ERR_CLOSED)
		it->value = -1;
}

static void test_exec_stream_creation_and_index(void)
{
	pt_stream_manager *m;
	pt_stream *s;
	PT_CHECK_OK(pt_stream_manager_create(&m, "compute", 2));
	CU_ASSERT_EQUAL(pt_stream_manager_count(m), 2);
	PT_CHECK_OK(pt_stream_manager_get(m, 1, &s));
	CU_ASSERT_STRING_EQUAL(pt_stream_name(s), "compute.1");
	PT_CHECK_ERR_MSG(pt_stream_manager_get(m, 2, &s), PT_ERR_RANGE, "index 2");
	PT_CHECK_ERR(pt_stream_manager_get(m, -1, &s), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_stream_manager_sync(m, 5, 10), PT_ERR_RANGE);
	PT_CHECK_ERR(pt_stream_manager_record(m, 7, NULL), PT_ERR_RANGE);
	pt_stream_manager_destroy(m);
	PT_CHECK_ERR(pt_stream_manager_create(&m, "x", 0), PT_ERR_INVALID);
}

static void test_exec_stream_round_robin(void)
{
	pt_stream_manager *m;
	int idx;
	PT_CHECK_OK(pt_stream_manager_create(&m, "rr", 3));
	for (int i = 0; i < 7; i++) {
		pt_stream *s = pt_stream_manager_next(m, &idx), *g;
		CU_ASSERT_EQUAL(idx, i % 3);
		PT_CHECK_OK(pt_stream_manager_get(m, i % 3, &g));
		CU_ASSERT_PTR_EQUAL(s, g);
		CU_ASSERT_PTR_EQUAL(pt_stream_manager_for(m, i), g);
	}
	pt_stream_manager_destroy(m);
}

static void test_exec_stream_runs_in_order(void)
{
	pt_stream *s;
	int log[200];
	atomic_int n = 0;
	log_item items[200];
	PT_CHECK_OK(pt_stream_create(&s, "ordered"));
	for (int i = 0; i < 200; i++) {
		items[i] = (log_item){log, &n, i, 0, NULL, 0};
		PT_CHECK_OK(pt_stream_enqueue(s, log_fn, NULL, &items[i]));
	}
	PT_CHECK_OK(pt_stream_sync(s, 5000));
	CU_ASSERT_EQUAL(atomic_load(&n), 200);
	for (int i = 0; i < 200; i++)
		CU_ASSERT_EQUAL(log[i], i);
	CU_ASSERT(pt_stream_query(s));
	pt_stream_destroy(s);
}

static void test_exec_events_order_streams(void)
{
	pt_stream *a, *b;
	pt_event *e;
	int log[4];
	atomic_int n = 0;
	log_item slow = {log, &n, 1, 60, NULL, 0}, after = {log, &n, 2, 0, NULL, 0};
	PT_CHECK_OK(pt_stream_create(&a, "a"));
	PT_CHECK_OK(pt_stream_create(&b, "b"));
	PT_CHECK_OK(pt_event_create(&e));
	CU_ASSERT(pt_event_query(e)); /* never recorded: complete */
	PT_CHECK_OK(pt_stream_enqueue(a, log_fn, NULL, &slow));
	PT_CHECK_OK(pt_event_record(e, a));
	PT_CHECK_OK(pt_stream_wait_event(b, e));
	PT_CHECK_OK(pt_stream_enqueue(b, log_fn, NULL, &after));
	CU_ASSERT_FALSE(pt_event_query(e));
	PT_CHECK_ERR(pt_event_wait(e, 5), PT_ERR_TIMEOUT);
	PT_CHECK_OK(pt_event_wait(e, 5000));
	PT_CHECK_OK(pt_stream_sync(b, 5000));
	CU_ASSERT_EQUAL(atomic_load(&n), 2);
	CU_ASSERT_EQUAL(log[0], 1); /* b waited for a although its own item was quick */
	CU_ASSERT_EQUAL(log[1], 2);
	pt_stream_destroy(a);
	pt_stream_destroy(b);
	pt_event_destroy(e);
}

static void test_exec_stream_sync_timeout(void)
{
	pt_stream *s;
	int log[1];
	atomic_int n = 0;
	log_item slow = {log, &n, 1, 150, NULL, 0};
	PT_CHECK_OK(pt_stream_create(&s, "slow"));
	PT_CHECK_OK(pt_stream_enqueue(s, log_fn, NULL, &slow));
	PT_CHECK_ERR_MSG(pt_stream_sync(s, 10), PT_ERR_TIMEOUT, "slow");
	PT_CHECK_OK(pt_stream_sync(s, -1));
	CU_ASSERT_EQUAL(atomic_load(&n), 1);
	pt_stream_destroy(s);
}

/* Two streams really run at once: 2 x 100 ms of sleeping takes ~100 ms. */
static void test_exec_streams_run_concurrently(void)
{
	pt_stream_manager *m;
	int log[2];
	atomic_int n = 0, started = 0;
	/* Each item waits until both have begun: only concurrent streams finish. */
	log_item it[2] = {{log, &n, 0, 0, &started, 2}, {log, &n, 1, 0, &started, 2}};
	PT_CHECK_OK(pt_stream_manager_create(&m, "c", 2));
	for (int i = 0; i < 2; i++)
		PT_CHECK_OK(
		    pt_stream_enqueue(pt_stream_manager_next(m, NULL), log_fn, NULL, &it[i]));
	PT_CHECK_OK(pt_stream_manager_sync_all(m, 10000));
	CU_ASSERT_EQUAL(atomic_load(&n), 2); /* neither timed out waiting for the other */
	pt_stream_manager_destroy(m);
}

static void test_exec_many_streams_and_single(void)
{
	int counts[] = {1, 32};
	for (int c = 0; c < 2; c++) {
		pt_stream_manager *m;
		int log[64];
		atomic_int n = 0;
		log_item it[64];
		PT_CHECK_OK(pt_stream_manager_create(&m, "many", counts[c]));
		for (int i = 0; i < 64; i++) {
			it[i] = (log_item){log, &n, i, 0, NULL, 0};
			PT_CHECK_OK(
			    pt_stream_enqueue(pt_stream_manager_for(m, i), log_fn, NULL, &it[i]));
		}
		PT_CHECK_OK(pt_stream_manager_sync_all(m, 5000));
		CU_ASSERT_EQUAL(atomic_load(&n), 64);
		if (counts[c] == 1)
			for (int i = 0; i < 64; i++)
				CU_ASSERT_EQUAL(log[i], i);
		pt_stream_manager_destroy(m);
	}
}

static void test_exec_stream_destroy_cancels_pending(void)
{
	pt_stream *s;
	int log[16];
	atomic_int n = 0, started = 0;
	log_item it[16];
	PT_CHECK_OK(pt_stream_create(&s, "doomed"));
	for (int i = 0; i < 16; i++) {
		it[i] = (log_item){log, &n, i, i == 0 ? 300 : 0, &started, 0};
		PT_CHECK_OK(pt_stream_enqueue(s, log_fn, count_done, &it[i]));
	}
	CU_ASSERT_FATAL(wait_count(&started, 1)); /* the first item is running */
	pt_stream_destroy(s);
	CU_ASSERT_EQUAL(atomic_load(&n), 1); /* it finished; the rest were cancelled */
	CU_ASSERT_EQUAL(it[0].value, 0);
	for (int i = 1; i < 16; i++)
		CU_ASSERT_EQUAL(it[i].value, -1);
}

/* ---- executor over a toy compute: y = 2x (+ sleep), dx = 3 dy ---- */

typedef struct toy {
	int fail_mb;
	int sleep_ms;
	atomic_int running, max_running, started;
} toy;

static pt_err toy_apply(toy *t, int mb, const pt_tensor *x, pt_tensor *y, float k)
{
	int r = atomic_fetch_add(&t->running, 1) + 1;
	pt_err rv;
	atomic_fetch_add(&t->started, 1);
	if (r > atomic_load(&t->max_running))
		atomic_store(&t->max_running, r);
	if (t->sleep_ms)
		usleep((useconds_t)t->sleep_ms * 1000);
	if (mb == t->fail_mb)
		rv = pt_set_error(PT_ERR_BACKEND, "toy failure on microbatch %d", mb);
	else if ((rv = pt_tensor_init(y, x->dtype, x->ndim, x->shape)) == PT_OK)
		rv = pt_scale(y, x, k);
	atomic_fetch_sub(&t->running, 1);
	return rv;
}

static pt_err toy_fwd(void *ctx, int mb, const pt_tensor *x, pt_tensor *y)
{
	return toy_apply(ctx, mb, x, y, 2.0f);
}

static pt_err toy_bwd(void *ctx, int mb, const pt_tensor *dy, pt_tensor *dx)
{
	return toy_apply(ctx, mb, dy, dx, 3.0f);
}

static void vec(pt_tensor *t, int64_t n, float v)
{
	PT_CHECK_OK(pt_tensor_init(t, PT_F32, 1, (int64_t[]){n}));
	for (int64_t i = 0; i < n; i++)
		pt_tensor_f32(t)[i] = v + (float)i;
}

static void test_exec_forward_backward_async(void)
{
	toy t = {.fail_mb = -1};
	pt_exec_compute c = {toy_fwd, toy_bwd, &t};
	pt_executor *ex;
	pt_async_op *f[3], *b;
	pt_tensor x;
	vec(&x, 4, 1.0f);
	PT_CHECK_OK(pt_executor_create(&ex, &c, NULL, NULL));
	CU_ASSERT_EQUAL(pt_executor_num_compute(ex), 2);
	CU_ASSERT_EQUAL(pt_executor_num_comm(ex), 2);
	for (int mb = 0; mb < 3; mb++)
		PT_CHECK_OK(pt_executor_forward(ex, mb, &x, NULL, &f[mb]));
	PT_CHECK_OK(pt_executor_backward(ex, 2, NULL, f[2], &b));
	for (int mb = 0; mb < 3; mb++) {
		CU_ASSERT_EQUAL(pt_async_op_kind(f[mb]), PT_ASYNC_FORWARD);
		CU_ASSERT_EQUAL(pt_async_op_microbatch(f[mb]), mb);
		CU_ASSERT_EQUAL(pt_async_op_stream(f[mb]), mb % 2);
		CU_ASSERT_PTR_EQUAL(pt_executor_compute_stream(ex, mb),
		                    pt_executor_compute_stream(ex, mb + 2));
		PT_CHECK_OK(pt_async_op_wait(f[mb], 5000));
		CU_ASSERT(pt_async_op_done(f[mb]));
		CU_ASSERT_EQUAL(pt_tensor_f32(pt_async_op_result(f[mb]))[3], 8.0f);
	}
	CU_ASSERT_NOT_EQUAL(pt_async_op_id(f[0]), pt_async_op_id(f[1]));
	PT_CHECK_OK(pt_async_op_wait(b, 5000));
	CU_ASSERT_EQUAL(pt_async_op_kind(b), PT_ASYNC_BACKWARD);
	CU_ASSERT_STRING_EQUAL(pt_async_kind_name(pt_async_op_kind(b)), "backward");
	CU_ASSERT_EQUAL(pt_tensor_f32(pt_async_op_result(b))[1], 12.0f); /* 3 * 2 * 2 */
	PT_CHECK_OK(pt_executor_sync_all(ex, 5000));
	/* ordered compute: never two at once */
	CU_ASSERT_EQUAL(atomic_load(&t.max_running), 1);
	pt_executor_destroy(ex);
	for (int mb = 0; mb < 3; mb++)
		pt_async_op_release(f[mb]);
	pt_async_op_release(b);
	pt_tensor_fini(&x);
}

/* Rank 0 forwards and sends; rank 1 receives, forwards, sends the gradient
 * back; rank 0 receives it and runs backward. Receives are submitted out of
 * order and still get their own microbatch. */
static void test_exec_send_receive_chain(void)
{
	toy t0 = {.fail_mb = -1}, t1 = {.fail_mb = -1};
	pt_exec_compute c0 = {toy_fwd, toy_bwd, &t0}, c1 = {toy_fwd, toy_bwd, &t1};
	pt_local_group *g;
	pt_comm *k0, *k1;
	pt_executor *e0, *e1;
	pt_async_op *ops[4][8];
	pt_tensor x[4];
	pt_executor_config cfg = {.step = 5, .timeout_ms = 5000};
	/* A receive holds its stream until its message arrives (as on CUDA), so
	 * receives posted out of order each get their own stream here. */
	pt_executor_config cfg1 = {.step = 5, .timeout_ms = 5000, .n_comm = 4};
	PT_CHECK_OK(pt_local_group_create(&g, 2));
	PT_CHECK_OK(pt_local_comm_create(&k0, g, 0));
	PT_CHECK_OK(pt_local_comm_create(&k1, g, 1));
	PT_CHECK_OK(pt_executor_create(&e0, &c0, k0, &cfg));
	PT_CHECK_OK(pt_executor_create(&e1, &c1, k1, &cfg1));
	for (int mb = 3; mb >= 0; mb--) /* receives posted in reverse order */
		PT_CHECK_OK(pt_executor_recv_forward(e1, mb, 0, &ops[mb][2]));
	for (int mb = 0; mb < 4; mb++) {
		vec(&x[mb], 3, (float)(10 * mb));
		PT_CHECK_OK(pt_executor_forward(e0, mb, &x[mb], NULL, &ops[mb][0]));
		PT_CHECK_OK(pt_executor_send_forward(e0, mb, 1, NULL, ops[mb][0], &ops[mb][1]));
		PT_CHECK_OK(pt_executor_forward(e1, mb, NULL, ops[mb][2], &ops[mb][3]));
		PT_CHECK_OK(pt_executor_send_backward(e1, mb, 0, NULL, ops[mb][3], &ops[mb][4]));
		PT_CHECK_OK(pt_executor_recv_backward(e0, mb, 1, &ops[mb][5]));
		PT_CHECK_OK(pt_executor_backward(e0, mb, NULL, ops[mb][5], &ops[mb][6]));
	}
	for (int mb = 0; mb < 4; mb++) {
		PT_CHECK_OK(pt_async_op_wait(ops[mb][6], 5000));
		CU_ASSERT_EQUAL(pt_async_op_kind(ops[mb][2]), PT_ASYNC_RECV_FORWARD);
		CU_ASSERT_EQUAL(pt_async_op_kind(ops[mb][4]), PT_ASYNC_SEND_BACKWARD);
		/* x -> 2x -> 4x -> 12x */
		CU_ASSERT_EQUAL(pt_tensor_f32(pt_async_op_result(ops[mb][2]))[1],
		                2.0f * (10 * mb + 1));
		CU_ASSERT_EQUAL(pt_tensor_f32(pt_async_op_result(ops[mb][6]))[2],
		                12.0f * (10 * mb + 2));
	}
	PT_CHECK_OK(pt_executor_sync_all(e0, 5000));
	PT_CHECK_OK(pt_executor_sync_all(e1, 5000));
	pt_executor_destroy(e0);
	pt_executor_destroy(e1);
	for (int mb = 0; mb < 4; mb++) {
		for (int k = 0; k < 7; k++)
			pt_async_op_release(ops[mb][k]);
		pt_tensor_fini(&x[mb]);
	}
	pt_comm_destroy(k0);
	pt_comm_destroy(k1);
	pt_local_group_destroy(g);
}

/* Communication of one microbatch overlaps compute of another. */
static void test_exec_comm_overlaps_compute(void)
{
	toy t = {.fail_mb = -1, .sleep_ms = 300};
	pt_exec_compute c = {toy_fwd, toy_bwd, &t};
	pt_local_group *g;
	pt_comm *k0, *k1;
	pt_executor *ex;
	pt_async_op *f, *r;
	pt_tensor x;
	pt_msg m = {0};
	pt_executor_config cfg = {.timeout_ms = 5000};
	vec(&x, 2, 1.0f);
	PT_CHECK_OK(pt_local_group_create(&g, 2));
	PT_CHECK_OK(pt_local_comm_create(&k0, g, 0));
	PT_CHECK_OK(pt_local_comm_create(&k1, g, 1));
	PT_CHECK_OK(pt_executor_create(&ex, &c, k1, &cfg));
	PT_CHECK_OK(pt_executor_forward(ex, 0, &x, NULL, &f));
	PT_CHECK_OK(pt_executor_recv_forward(ex, 1, 0, &r));
	CU_ASSERT_FATAL(wait_count(&t.started, 1)); /* the forward is running */
	PT_CHECK_OK(pt_comm_send_forward(k0, 1, &x, 0, 1));
	PT_CHECK_OK(pt_async_op_wait(r, 5000));
	CU_ASSERT_FALSE(pt_async_op_done(f)); /* the receive finished during the forward */
	PT_CHECK_OK(pt_async_op_wait(f, 5000));
	pt_executor_destroy(ex);
	pt_async_op_release(f);
	pt_async_op_release(r);
	pt_msg_fini(&m);
	pt_tensor_fini(&x);
	pt_comm_destroy(k0);
	pt_comm_destroy(k1);
	pt_local_group_destroy(g);
}

static void test_exec_failure_propagates(void)
{
	toy t = {.fail_mb = 1};
	pt_exec_compute c = {toy_fwd, toy_bwd, &t};
	pt_local_group *g;
	pt_comm *k0, *k1;
	pt_executor *ex;
	pt_async_op *f, *s, *ok;
	pt_tensor x;
	vec(&x, 2, 1.0f);
	PT_CHECK_OK(pt_local_group_create(&g, 2));
	PT_CHECK_OK(pt_local_comm_create(&k0, g, 0));
	PT_CHECK_OK(pt_local_comm_create(&k1, g, 1));
	PT_CHECK_OK(pt_executor_create(&ex, &c, k0, NULL));
	PT_CHECK_OK(pt_executor_forward(ex, 1, &x, NULL, &f));
	PT_CHECK_OK(pt_executor_send_forward(ex, 1, 1, NULL, f, &s));
	PT_CHECK_ERR_MSG(pt_async_op_wait(f, 5000), PT_ERR_BACKEND, "toy failure on microbatch 1");
	PT_CHECK_ERR_MSG(pt_async_op_wait(s, 5000), PT_ERR_BACKEND, "depends on forward");
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "send-forward of microbatch 1"));
	/* the stream keeps working after a failure */
	PT_CHECK_OK(pt_executor_forward(ex, 3, &x, NULL, &ok));
	PT_CHECK_OK(pt_async_op_wait(ok, 5000));
	/* bad submissions */
	{
		pt_async_op *bad;
		PT_CHECK_ERR(pt_executor_forward(ex, -1, &x, NULL, &bad), PT_ERR_RANGE);
		PT_CHECK_ERR(pt_executor_forward(ex, 0, NULL, NULL, &bad), PT_ERR_INVALID);
		CU_ASSERT_PTR_NULL(bad);
	}
	pt_executor_destroy(ex);
	pt_async_op_release(f);
	pt_async_op_release(s);
	pt_async_op_release(ok);
	pt_tensor_fini(&x);
	pt_comm_destroy(k0);
	pt_comm_destroy(k1);
	pt_local_group_destroy(g);
}

static void test_exec_receive_timeout(void)
{
	toy t = {.fail_mb = -1};
	pt_exec_compute c = {toy_fwd, toy_bwd, &t};
	pt_local_group *g;
	pt_comm *k0;
	pt_executor *ex;
	pt_async_op *r, *f;
	pt_executor_config cfg = {.timeout_ms = 80};
	PT_CHECK_OK(pt_local_group_create(&g, 2));
	PT_CHECK_OK(pt_local_comm_create(&k0, g, 0));
	PT_CHECK_OK(pt_executor_create(&ex, &c, k0, &cfg));
	PT_CHECK_OK(pt_executor_recv_backward(ex, 0, 1, &r));
	PT_CHECK_OK(pt_executor_backward(ex, 0, NULL, r, &f));
	PT_CHECK_ERR(pt_async_op_wait(r, 10), PT_ERR_TIMEOUT); /* the wait's own timeout */
	PT_CHECK_ERR_MSG(pt_async_op_wait(r, 5000), PT_ERR_TIMEOUT, "no message");
	PT_CHECK_ERR_MSG(pt_async_op_wait(f, 5000), PT_ERR_TIMEOUT, "receive-backward");
	pt_executor_destroy(ex);
	pt_async_op_release(r);
	pt_async_op_release(f);
	pt_comm_destroy(k0);
	pt_local_group_destroy(g);
}

static void test_exec_destroy_with_pending(void)
{
	toy t = {.fail_mb = -1, .sleep_ms = 300};
	pt_exec_compute c = {toy_fwd, toy_bwd, &t};
	pt_local_group *g;
	pt_comm *k0;
	pt_executor *ex;
	pt_async_op *r, *f[6];
	pt_tensor x;
	double t0;
	vec(&x, 2, 1.0f);
	PT_CHECK_OK(pt_local_group_create(&g, 2));
	PT_CHECK_OK(pt_local_comm_create(&k0, g, 0));
	PT_CHECK_OK(pt_executor_create(&ex, &c, k0, &(pt_executor_config){.timeout_ms = 60000}));
	PT_CHECK_OK(pt_executor_recv_forward(ex, 0, 1, &r)); /* never satisfied */
	for (int i = 0; i < 6; i++)
		PT_CHECK_OK(pt_executor_forward(ex, i, &x, NULL, &f[i]));
	CU_ASSERT_FATAL(wait_count(&t.started, 1)); /* f[0] is running */
	t0 = now_ms();
	pt_executor_destroy(ex);
	CU_ASSERT(now_ms() - t0 < 2000.0); /* f[0]'s 300 ms, not the receive's minute */
	PT_CHECK_ERR(pt_async_op_wait(r, 1000), PT_ERR_CLOSED);
	PT_CHECK_OK(pt_async_op_wait(f[0], 1000)); /* it was running: drained */
	PT_CHECK_ERR(pt_async_op_wait(f[5], 1000), PT_ERR_CLOSED);
	for (int i = 0; i < 6; i++) {
		CU_ASSERT(pt_async_op_done(f[i]));
		pt_async_op_release(f[i]);
	}
	pt_async_op_release(r);
	pt_tensor_fini(&x);
	pt_comm_destroy(k0);
	pt_local_group_destroy(g);
}

/* A 2-stage split of an MLP under the executors accumulates the same gradients,
 * bitwise, as the whole model run synchronously. */
static void test_exec_async_equals_sync_pipeline(void)
{
	pt_layer_spec layers[] = {pt_linear(8, 16), pt_activation(PT_LAYER_TANH), pt_linear(16, 16),
	                          pt_activation(PT_LAYER_RELU), pt_linear(16, 4)};
	pt_model_config cfg = {.batch = 4, .input = {PT_F32, 0, 8}, .n_slots = 4, .seed = 9};
	pt_model *full, *s0, *s1;
	pt_exec_model em0, em1;
	pt_exec_compute c0, c1;
	pt_local_group *g;
	pt_comm *k0, *k1;
	pt_executor *e0, *e1;
	pt_tensor x[4], dy;
	pt_async_op *ops[4][7];
	pt_executor_config ecfg = {.timeout_ms = 10000};
	PT_CHECK_OK(pt_model_create(&full, layers, 5, 0, 5, &cfg));
	PT_CHECK_OK(pt_model_create(&s0, layers, 5, 0, 2, &cfg));
	PT_CHECK_OK(pt_model_create(&s1, layers, 5, 2, 5, &cfg));
	PT_CHECK_OK(pt_tensor_init(&dy, PT_F32, 2, (int64_t[]){4, 4}));
	for (int i = 0; i < 16; i++)
		pt_tensor_f32(&dy)[i] = 0.01f * (float)(i - 7);
	for (int mb = 0; mb < 4; mb++) {
		PT_CHECK_OK(pt_tensor_init(&x[mb], PT_F32, 2, (int64_t[]){4, 8}));
		for (int i = 0; i < 32; i++)
			pt_tensor_f32(&x[mb])[i] = 0.1f * (float)((i * 7 + mb * 3) % 11) - 0.5f;
	}
	/* synchronous reference: GPipe order, all forwards then all backwards */
	{
		const pt_tensor *y;
		for (int mb = 0; mb < 4; mb++)
			PT_CHECK_OK(pt_model_forward(full, mb, &x[mb], &y, true, 0, (uint64_t)mb));
		for (int mb = 0; mb < 4; mb++)
			PT_CHECK_OK(pt_model_backward(full, mb, &dy, NULL));
	}
	PT_CHECK_OK(pt_exec_model_init(&em0, s0, 4, true));
	PT_CHECK_OK(pt_exec_model_init(&em1, s1, 4, true));
	c0 = pt_exec_model_compute(&em0);
	c1 = pt_exec_model_compute(&em1);
	PT_CHECK_OK(pt_local_group_create(&g, 2));
	PT_CHECK_OK(pt_local_comm_create(&k0, g, 0));
	PT_CHECK_OK(pt_local_comm_create(&k1, g, 1));
	PT_CHECK_OK(pt_executor_create(&e0, &c0, k0, &ecfg));
	PT_CHECK_OK(pt_executor_create(&e1, &c1, k1, &ecfg));
	for (int mb = 0; mb < 4; mb++) {
		PT_CHECK_OK(pt_executor_forward(e0, mb, &x[mb], NULL, &ops[mb][0]));
		PT_CHECK_OK(pt_executor_send_forward(e0, mb, 1, NULL, ops[mb][0], &ops[mb][1]));
		PT_CHECK_OK(pt_executor_recv_forward(e1, mb, 0, &ops[mb][2]));
		PT_CHECK_OK(pt_executor_forward(e1, mb, NULL, ops[mb][2], &ops[mb][3]));
	}
	for (int mb = 0; mb < 4; mb++) {
		PT_CHECK_OK(pt_executor_backward(e1, mb, &dy, ops[mb][3], &ops[mb][4]));
		PT_CHECK_OK(pt_executor_send_backward(e1, mb, 0, NULL, ops[mb][4], &ops[mb][5]));
	}
	for (int mb = 0; mb < 4; mb++)
		PT_CHECK_OK(pt_executor_recv_backward(e0, mb, 1, &ops[mb][6]));
	{
		pt_async_op *b[4];
		for (int mb = 0; mb < 4; mb++)
			PT_CHECK_OK(pt_executor_backward(e0, mb, NULL, ops[mb][6], &b[mb]));
		for (int mb = 0; mb < 4; mb++) {
			PT_CHECK_OK(pt_async_op_wait(b[mb], 10000));
			pt_async_op_release(b[mb]);
		}
	}
	PT_CHECK_OK(pt_executor_sync_all(e0, 10000));
	PT_CHECK_OK(pt_executor_sync_all(e1, 10000));
	{
		size_t n0 = pt_tensor_nbytes(pt_model_grads(s0));
		size_t n1 = pt_tensor_nbytes(pt_model_grads(s1));
		const char *gf = pt_tensor_data(pt_model_grads(full));
		CU_ASSERT_EQUAL(n0 + n1, pt_tensor_nbytes(pt_model_grads(full)));
		CU_ASSERT_EQUAL(memcmp(gf, pt_tensor_data(pt_model_grads(s0)), n0), 0);
		CU_ASSERT_EQUAL(memcmp(gf + n0, pt_tensor_data(pt_model_grads(s1)), n1), 0);
	}
	pt_executor_destroy(e0);
	pt_executor_destroy(e1);
	for (int mb = 0; mb < 4; mb++) {
		for (int k = 0; k < 7; k++)
			pt_async_op_release(ops[mb][k]);
		pt_tensor_fini(&x[mb]);
	}
	pt_exec_model_fini(&em0);
	pt_exec_model_fini(&em1);
	pt_tensor_fini(&dy);
	pt_comm_destroy(k0);
	pt_comm_destroy(k1);
	pt_local_group_destroy(g);
	pt_model_destroy(full);
	pt_model_destroy(s0);
	pt_model_destroy(s1);
}

/* ---- graph manager ---- */

typedef struct affine {
	pt_tensor x, y, z;
	float alpha; /* z = alpha * (x + 2y) */
	bool vary;   /* alpha changes per call: not capturable */
	bool fail;
	int calls; /* host calls of the function (not made by a replay) */
} affine;

static pt_err affine_fn(void *arg, pt_stream *stream)
{
	affine *a = arg;
	a->calls++;
	if (a->fail)
		return pt_set_error(PT_ERR_BACKEND, "affine failed on purpose");
	if (a->vary)
		a->alpha += 1.0f;
	PT_TRY(pt_add(&a->z, &a->x, &a->y, 1.0f, 2.0f));
	return pt_scale(&a->z, &a->z, a->alpha);
}

static void affine_init(affine *a, float alpha)
{
	memset(a, 0, sizeof(*a));
	vec(&a->x, 8, 1.0f);
	vec(&a->y, 8, 0.5f);
	vec(&a->z, 8, 0.0f);
	a->alpha = alpha;
}

static void affine_fini(affine *a)
{
	pt_tensor_fini(&a->x);
	pt_tensor_fini(&a->y);
	pt_tensor_fini(&a->z);
}

static float affine_expect(const affine *a, int i)
{
	return a->alpha * (pt_tensor_f32(&a->x)[i] + 2.0f * pt_tensor_f32(&a->y)[i]);
}

static void test_exec_graph_warmup_capture_replay(void)
{
	pt_graph_manager *m;
	affine a;
	pt_graph_run how;
	pt_graph_info info;
	pt_dispatcher *d = pt_dispatcher_current();
	uint64_t dispatched;
	affine_init(&a, 3.0f);
	PT_CHECK_OK(pt_graph_manager_create(&m, -1, 0));
	PT_CHECK_ERR(pt_graph_manager_get(m, "affine", &info), PT_ERR_NOTFOUND);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_FALSE(pt_graph_manager_is_capture_complete(m, "affine"));
		PT_CHECK_OK(pt_graph_manager_execute(m, "affine", affine_fn, &a, NULL, &how));
		CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_WARMUP); /* fallback to eager while warming */
		CU_ASSERT_EQUAL(pt_graph_manager_count(m), 0);
	}
	CU_ASSERT(pt_graph_manager_is_capture_complete(m, "affine"));
	PT_CHECK_ERR(pt_graph_manager_get(m, "affine", &info), PT_ERR_NOTFOUND);
	PT_CHECK_OK(pt_graph_manager_execute(m, "affine", affine_fn, &a, NULL, &how));
	CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_CAPTURE); /* the 4th run is captured */
	CU_ASSERT_EQUAL(pt_graph_manager_count(m), 1);
	PT_CHECK_OK(pt_graph_manager_get(m, "affine", &info));
	CU_ASSERT_EQUAL(info.n_ops, 2);
	CU_ASSERT_EQUAL(a.calls, 4);
	dispatched = pt_dispatcher_stats(d).dispatched;
	for (int r = 0; r < 5; r++) {
		float nx[8];
		for (int i = 0; i < 8; i++)
			nx[i] = (float)(r * 10 + i);
		PT_CHECK_OK(pt_tensor_write(&a.x, nx, sizeof(nx))); /* new input, same buffer */
		PT_CHECK_OK(pt_graph_manager_execute(m, "affine", affine_fn, &a, NULL, &how));
		CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_REPLAY);
		CU_ASSERT_EQUAL(pt_tensor_state(&a.z), PT_READY);
		for (int i = 0; i < 8; i++)
			CU_ASSERT_EQUAL(pt_tensor_f32(&a.z)[i], affine_expect(&a, i));
	}
	CU_ASSERT_EQUAL(a.calls, 4); /* replays never call the function */
	CU_ASSERT_EQUAL(pt_dispatcher_stats(d).dispatched, dispatched); /* nor dispatch */
	PT_CHECK_OK(pt_graph_manager_get(m, "affine", &info));
	CU_ASSERT_EQUAL(info.replays, 5);
	pt_graph_manager_destroy(m);
	affine_fini(&a);
}

static void test_exec_graph_names_remove_clear_pool(void)
{
	pt_graph_manager *m;
	affine a[3];
	pt_graph_run how;
	pt_graph_pool_stats ps;
	const char *names[3] = {"a", "b", "c"};
	PT_CHECK_OK(pt_graph_manager_create(&m, 1, 1 << 16));
	ps = pt_graph_manager_pool(m);
	CU_ASSERT_EQUAL(ps.reserved, 1 << 16);
	CU_ASSERT_EQUAL(ps.in_use, 0);
	for (int k = 0; k < 3; k++) {
		affine_init(&a[k], (float)(k + 1));
		for (int i = 0; i < 2; i++)
			PT_CHECK_OK(
			    pt_graph_manager_execute(m, names[k], affine_fn, &a[k], NULL, &how));
		CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_CAPTURE);
	}
	CU_ASSERT_EQUAL(pt_graph_manager_count(m), 3);
	ps = pt_graph_manager_pool(m);
	CU_ASSERT(ps.in_use > 0); /* every graph's workspace comes from the one pool */
	CU_ASSERT_EQUAL(ps.blocks, 3);
	PT_CHECK_OK(pt_graph_manager_remove(m, "b"));
	PT_CHECK_ERR(pt_graph_manager_remove(m, "b"), PT_ERR_NOTFOUND);
	CU_ASSERT_EQUAL(pt_graph_manager_count(m), 2);
	CU_ASSERT(pt_graph_manager_pool(m).in_use < ps.in_use);
	/* a removed name warms up again, and reuses the freed block */
	PT_CHECK_OK(pt_graph_manager_execute(m, "b", affine_fn, &a[1], NULL, &how));
	CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_WARMUP);
	PT_CHECK_OK(pt_graph_manager_execute(m, "b", affine_fn, &a[1], NULL, &how));
	CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_CAPTURE);
	CU_ASSERT_EQUAL(pt_graph_manager_pool(m).blocks, 3);
	PT_CHECK_OK(
	    pt_graph_manager_execute_phase(m, PT_PHASE_FORWARD, affine_fn, &a[0], NULL, &how));
	CU_ASSERT_STRING_EQUAL(pt_graph_phase_name(PT_PHASE_FULL_TRAINING_STEP),
	                       "Phase_FullTrainingStep");
	CU_ASSERT(pt_graph_manager_is_capture_complete(m, "Phase_Forward")); /* warm-up of 1 */
	CU_ASSERT_FALSE(pt_graph_manager_is_capture_complete(m, "unknown"));
	pt_graph_manager_clear(m);
	CU_ASSERT_EQUAL(pt_graph_manager_count(m), 0);
	CU_ASSERT_EQUAL(pt_graph_manager_pool(m).in_use, 0);
	CU_ASSERT_FALSE(pt_graph_manager_is_capture_complete(m, NULL));
	pt_graph_manager_destroy(m);
	for (int k = 0; k < 3; k++)
		affine_fini(&a[k]);
}

static void test_exec_graph_fallback_and_errors(void)
{
	pt_graph_manager *m;
	affine a, b;
	pt_graph_run how;
	affine_init(&a, 1.0f);
	affine_init(&b, 1.0f);
	a.vary = true; /* params change per call: a replay would be wrong */
	PT_CHECK_OK(pt_graph_manager_create(&m, 2, 0));
	for (int i = 0; i < 6; i++) {
		PT_CHECK_OK(pt_graph_manager_execute(m, "vary", affine_fn, &a, NULL, &how));
		CU_ASSERT_EQUAL(how, i < 2 ? PT_GRAPH_RAN_WARMUP : PT_GRAPH_RAN_FALLBACK);
		CU_ASSERT_EQUAL(pt_tensor_f32(&a.z)[5], affine_expect(&a, 5));
	}
	CU_ASSERT_EQUAL(a.calls, 6);
	CU_ASSERT_EQUAL(pt_graph_manager_count(m), 0);
	b.fail = true;
	PT_CHECK_ERR_MSG(pt_graph_manager_execute(m, "fail", affine_fn, &b, NULL, &how),
	                 PT_ERR_BACKEND, "on purpose");
	PT_CHECK_ERR(pt_graph_manager_execute(m, NULL, affine_fn, &b, NULL, &how), PT_ERR_INVALID);
	pt_graph_manager_destroy(m);
	affine_fini(&a);
	affine_fini(&b);
}

static affine shared_affine; /* one set of buffers behind one name, for all threads */

typedef struct graph_thread {
	pt_graph_manager *m;
	char name[16];
	affine a;
	int replays, bad;
} graph_thread;

static void *graph_thread_main(void *arg)
{
	graph_thread *g = arg;
	for (int i = 0; i < 12; i++) {
		pt_graph_run how;
		if (pt_graph_manager_execute(g->m, g->name, affine_fn, &g->a, NULL, &how) != PT_OK)
			g->bad++;
		g->replays += how == PT_GRAPH_RAN_REPLAY;
		for (int k = 0; k < 8; k++)
			g->bad += pt_tensor_f32(&g->a.z)[k] != affine_expect(&g->a, k);
		/* a shared name, executed by every thread */
		if (pt_graph_manager_execute(g->m, "shared", affine_fn, &shared_affine, NULL,
		                             &how) != PT_OK)
			g->bad++;
	}
	return NULL;
}

static void test_exec_graph_concurrent_threads(void)
{
	pt_graph_manager *m;
	graph_thread g[4];
	pthread_t th[4];
	PT_CHECK_OK(pt_graph_manager_create(&m, -1, 0));
	affine_init(&shared_affine, 0.5f);
	for (int i = 0; i < 4; i++) {
		g[i].m = m;
		snprintf(g[i].name, sizeof(g[i].name), "t%d", i);
		affine_init(&g[i].a, (float)(i + 2));
		g[i].replays = g[i].bad = 0;
		CU_ASSERT_EQUAL(pthread_create(&th[i], NULL, graph_thread_main, &g[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		CU_ASSERT_EQUAL(g[i].bad, 0);
		CU_ASSERT_EQUAL(g[i].replays, 8); /* 3 warm-up, 1 capture, 8 replays */
		affine_fini(&g[i].a);
	}
	for (int i = 0; i < 4; i++)
		PT_CHECK_OK(pt_graph_manager_get(m, g[i].name, NULL));
	{
		pt_graph_info info;
		PT_CHECK_OK(pt_graph_manager_get(m, "shared", &info));
		CU_ASSERT_EQUAL(info.replays, 4 * 12 - 4);
		for (int k = 0; k < 8; k++)
			CU_ASSERT_EQUAL(pt_tensor_f32(&shared_affine.z)[k],
			                affine_expect(&shared_affine, k));
	}
	CU_ASSERT_EQUAL(pt_graph_manager_count(m), 5);
	affine_fini(&shared_affine);
	pt_graph_manager_destroy(m);
}

/* ---- a training step with graphs equals the eager step bitwise ---- */

/* Trains two copies of a model on the same batches, one eagerly and one with
 * the trainer's graphs, and compares losses, norms, weights and gradients
 * bitwise. The schedule and clipping make lr and the grad scale change every
 * step: the optimizer graph must read them at run time. */
static void train_graph_vs_eager(pt_optim_kind kind, bool schedule)
{
	static const pt_layer_spec layers[] = {
	    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 64, .bias = true},
	    {.kind = PT_LAYER_RELU},
	    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 64, .bias = true},
	    {.kind = PT_LAYER_RELU},
	    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = 10, .bias = true}};
	pt_model_config cfg = {.batch = 8, .input = {PT_F32, 0, 64}, .n_slots = 1, .seed = 21};
	pt_optim_config oc = pt_optim_defaults(kind, kind == PT_OPTIM_SGD ? 0.05f : 1e-3f);
	pt_model *m[2];
	pt_optimizer *o[2];
	pt_trainer *t[2];
	pt_tensor x, y;
	pt_rng r;
	const int steps = 8, mbs = 2;
	float hx[16 * 64];
	int64_t hy[16];
	if (kind == PT_OPTIM_SGD)
		oc.momentum = 0.9f;
	if (schedule) {
		oc.schedule = (pt_schedule){PT_SCHED_WARMUP_COSINE, 3, steps, 1e-4f};
		oc.clip_norm = 0.5f;
	}
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_model_create(&m[k], layers, 5, 0, 5, &cfg));
		PT_CHECK_OK(
		    pt_optimizer_create(&o[k], &oc, pt_model_params(m[k]), pt_model_grads(m[k])));
		PT_CHECK_OK(pt_trainer_create(&t[k], m[k], o[k], PT_LOSS_CROSS_ENTROPY, -1));
	}
	PT_CHECK_OK(pt_trainer_set_graphs(t[1], true, -1));
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){16, 64}));
	PT_CHECK_OK(pt_tensor_init(&y, PT_I64, 1, (int64_t[]){16}));
	pt_rng_init(&r, 5, 0);
	for (int s = 0; s < steps; s++) {
		pt_step_result er, gr;
		pt_rng_normal(&r, hx, 16 * 64, 0.0f, 1.0f);
		for (int i = 0; i < 16; i++)
			hy[i] = pt_rng_u32(&r) % 10;
		PT_CHECK_OK(pt_tensor_write(&x, hx, sizeof(hx)));
		PT_CHECK_OK(pt_tensor_write(&y, hy, sizeof(hy)));
		PT_CHECK_OK(pt_trainer_step(t[0], &x, &y, mbs, (uint64_t)s, &er));
		PT_CHECK_OK(pt_trainer_step(t[1], &x, &y, mbs, (uint64_t)s, &gr));
		CU_ASSERT_EQUAL(memcmp(&er.loss, &gr.loss, sizeof(double)), 0);
		CU_ASSERT_EQUAL(memcmp(&er.grad_norm, &gr.grad_norm, sizeof(double)), 0);
		CU_ASSERT_EQUAL(er.lr, gr.lr);
	}
	/* 3 warm-ups and a capture per name: forward and backward run twice a
	 * step, the optimizer once, so all three replay by the last step. */
	CU_ASSERT_EQUAL(pt_trainer_graph_run(t[1], PT_PHASE_FORWARD), PT_GRAPH_RAN_REPLAY);
	CU_ASSERT_EQUAL(pt_trainer_graph_run(t[1], PT_PHASE_BACKWARD), PT_GRAPH_RAN_REPLAY);
	CU_ASSERT_EQUAL(pt_trainer_graph_run(t[1], PT_PHASE_OPTIMIZER_STEP), PT_GRAPH_RAN_REPLAY);
	{
		size_t nb = pt_tensor_nbytes(pt_model_params(m[0]));
		CU_ASSERT_EQUAL(memcmp(pt_tensor_data(pt_model_params(m[0])),
		                       pt_tensor_data(pt_model_params(m[1])), nb),
		                0);
		CU_ASSERT_EQUAL(memcmp(pt_tensor_data(pt_model_grads(m[0])),
		                       pt_tensor_data(pt_model_grads(m[1])), nb),
		                0);
	}
	for (int k = 0; k < 2; k++) {
		pt_trainer_destroy(t[k]);
		pt_optimizer_destroy(o[k]);
		pt_model_destroy(m[k]);
	}
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
}

static void test_exec_graph_training_step_bitwise(void)
{
	train_graph_vs_eager(PT_OPTIM_SGD, false);
	train_graph_vs_eager(PT_OPTIM_SGD, true);
	/* AdamW's step count and bias corrections come from the optimizer's
	 * run-time scalars, so its update replays too. */
	train_graph_vs_eager(PT_OPTIM_ADAMW, false);
	train_graph_vs_eager(PT_OPTIM_ADAMW, true);
}

/* A step captured whole replays only its kernels: host code inside it (the
 * optimizer writing the step's scalars) does not run again. The optimizer's
 * update alone, with the scalars written before each replay, follows the
 * eager AdamW bitwise over changing steps and grad scales. */
typedef struct opt_ctx {
	pt_optimizer *o;
} opt_ctx;

static pt_err opt_fn(void *arg, pt_stream *stream)
{
	return pt_optimizer_update(((opt_ctx *)arg)->o);
}

static void test_exec_graph_adamw_update_replays(void)
{
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_ADAMW, 1e-2f);
	pt_tensor p[2], g;
	pt_optimizer *o[2];
	pt_graph_manager *gm;
	pt_graph_run how = PT_GRAPH_RAN_WARMUP;
	float hg[256];
	pt_rng r;
	oc.schedule = (pt_schedule){PT_SCHED_WARMUP_COSINE, 2, 10, 0.0f};
	PT_CHECK_OK(pt_tensor_init(&g, PT_F32, 1, (int64_t[]){256}));
	for (int k = 0; k < 2; k++) {
		PT_CHECK_OK(pt_tensor_init(&p[k], PT_F32, 1, (int64_t[]){256}));
		PT_CHECK_OK(pt_fill(&p[k], 0.5));
		PT_CHECK_OK(pt_optimizer_create(&o[k], &oc, &p[k], &g));
	}
	PT_CHECK_OK(pt_graph_manager_create(&gm, 2, 0));
	pt_rng_init(&r, 9, 0);
	for (int s = 0; s < 10; s++) {
		opt_ctx c = {o[1]};
		float scale = 1.0f / (float)(s + 1);
		pt_rng_normal(&r, hg, 256, 0.0f, 1.0f);
		PT_CHECK_OK(pt_tensor_write(&g, hg, sizeof(hg)));
		PT_CHECK_OK(pt_optimizer_step(o[0], scale));
		PT_CHECK_OK(pt_optimizer_prepare(o[1], scale));
		PT_CHECK_OK(pt_graph_manager_execute(gm, "adamw", opt_fn, &c, NULL, &how));
		pt_optimizer_advance(o[1]);
		CU_ASSERT_EQUAL(memcmp(pt_tensor_data(&p[0]), pt_tensor_data(&p[1]), 1024), 0);
	}
	CU_ASSERT_EQUAL(how, PT_GRAPH_RAN_REPLAY);
	pt_graph_manager_destroy(gm);
	for (int k = 0; k < 2; k++) {
		pt_optimizer_destroy(o[k]);
		pt_tensor_fini(&p[k]);
	}
	pt_tensor_fini(&g);
}

int main(void)
{
	static const pt_test_case streams[] = {
	    {"test_exec_stream_creation_and_index", test_exec_stream_creation_and_index},
	    {"test_exec_stream_round_robin", test_exec_stream_round_robin},
	    {"test_exec_stream_runs_in_order", test_exec_stream_runs_in_order},
	    {"test_exec_events_order_streams", test_exec_events_order_streams},
	    {"test_exec_stream_sync_timeout", test_exec_stream_sync_timeout},
	    {"test_exec_streams_run_concurrently", test_exec_streams_run_concurrently},
	    {"test_exec_many_streams_and_single", test_exec_many_streams_and_single},
	    {"test_exec_stream_destroy_cancels_pending", test_exec_stream_destroy_cancels_pending},
	    {NULL, NULL}};
	static const pt_test_case executor[] = {
	    {"test_exec_forward_backward_async", test_exec_forward_backward_async},
	    {"test_exec_send_receive_chain", test_exec_send_receive_chain},
	    {"test_exec_comm_overlaps_compute", test_exec_comm_overlaps_compute},
	    {"test_exec_failure_propagates", test_exec_failure_propagates},
	    {"test_exec_receive_timeout", test_exec_receive_timeout},
	    {"test_exec_destroy_with_pending", test_exec_destroy_with_pending},
	    {"test_exec_async_equals_sync_pipeline", test_exec_async_equals_sync_pipeline},
	    {NULL, NULL}};
	static const pt_test_case graphs[] = {
	    {"test_exec_graph_warmup_capture_replay", test_exec_graph_warmup_capture_replay},
	    {"test_exec_graph_names_remove_clear_pool", test_exec_graph_names_remove_clear_pool},
	    {"test_exec_graph_fallback_and_errors", test_exec_graph_fallback_and_errors},
	    {"test_exec_graph_concurrent_threads", test_exec_graph_concurrent_threads},
	    {"test_exec_graph_training_step_bitwise", test_exec_graph_training_step_bitwise},
	    {"test_exec_graph_adamw_update_replays", test_exec_graph_adamw_update_replays},
	    {NULL, NULL}};
	static const pt_test_suite suites[] = {
	    {"streams", streams}, {"executor", executor}, {"graphs", graphs}, {NULL, NULL}};
	return pt_test_main(suites);
}
