/* overlap_bench.c - does a stage compute while its activations are on the
 * wire? A 2-stage CPU pipeline over nng, sync mode (GPipe), m = 24.
 *
 * The link: stage 2 runs in another process in its own network namespace,
 * reached over a veth pair whose both ends are shaped by `tc tbf` (RATE), so
 * transfer time is wire time (queued in the kernel), not CPU time - on a
 * 2-core machine a loopback copy would compete with compute. Stage 1's
 * activation (B x 4096 f32 = 256 KiB) crosses it forward, stage 2's input
 * gradient (the same size) backward. Needs root (netns, veth, tc); without
 * it the benchmark says "skipped" on stderr and prints no figure. The
 * namespace (and with it the veth pair and qdiscs) is always removed.
 *
 * Compute: the stages' task-delay hook (a sleep of DELAY_MS before every
 * forward and backward, counted in the stage's busy time) on top of a
 * small MLP's real kernels, so the two stages, nng's threads and the send
 * streams do not fight over the 2 cores and the figure measures overlap,
 * not CPU contention.
 *
 *   transfer X   step time with the delay off (the wire alone sets it)
 *   compute  C   the busiest stage's busy time per step (its timeline), of
 *                the run the ratio is about
 *   overlap_ratio       step time with async sends / max(C, X)  (ideal 1)
 *   overlap_ratio_sync  step time with sync_sends / (C + X)     (ideal 1)
 * plus the raw step times in ms and overlap_sync_over_max = sync / max(C, X).
 * Each step time is the median of STEPS steps after one warm-up step.
 *
 * Reading the sync figure: an nng send returns once its message is handed to
 * the pipe, which writes one message at a time into the kernel's socket
 * buffer (megabytes here), so even a send on the stage's thread leaves the
 * wire time to the kernel and overlaps most of it: sync_sends is well below
 * C + X on this link. The send streams make the overlap independent of such
 * buffering (and take lz4 and copies off the stage's thread).
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pipeline.h"
#include "rng.h"
#include "runtime.h"

#ifndef RATE
#define RATE "100mbit"
#endif
#ifndef DELAY_MS
#define DELAY_MS 21
#endif
#ifndef M
#define M 24
#endif
#ifndef B
#define B 16
#endif
#ifndef WIDTH
#define WIDTH 4096
#endif
#ifndef STEPS
#define STEPS 5
#endif
#define HOST_A "10.213.0.1"
#define HOST_B "10.213.0.2"

static char ns[32], veth_a[16], veth_b[16];
static bool ns_made;

static void die(const char *what)
{
	fprintf(stderr, "overlap_bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

static void net_down(void)
{
	if (!ns_made)
		return;
	ns_made = false;
	sh("ip netns del %s 2>/dev/null", ns); /* takes the veth pair with it */
	sh("ip link del %s 2>/dev/null", veth_a);
}

static void on_signal(int sig)
{
	net_down();
	signal(sig, SIG_DFL);
	raise(sig);
}

static bool net_up(void)
{
	int pid = (int)getpid();
	snprintf(ns, sizeof(ns), "ptbench%d", pid);
	snprintf(veth_a, sizeof(veth_a), "ptb%da", pid % 10000000);
	snprintf(veth_b, sizeof(veth_b), "ptb%db", pid % 10000000);
	if (sh("ip netns add %s", ns) != 0)
		return false;
	ns_made = true;
	atexit(net_down);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	return sh("ip link add %s type veth peer name %s", veth_a, veth_b) == 0 &&
	       sh("ip link set %s netns %s", veth_b, ns) == 0 &&
	       sh("ip addr add " HOST_A "/30 dev %s && ip link set %s up", veth_a, veth_a) == 0 &&
	       sh("ip netns exec %s sh -c 'ip addr add " HOST_B "/30 dev %s && "
	          "ip link set %s up && ip link set lo up'",
	          ns, veth_b, veth_b) == 0 &&
	       sh("tc qdisc add dev %s root tbf rate " RATE " burst 64kb latency 2s", veth_a) ==
	           0 &&
	       sh("ip netns exec %s tc qdisc add dev %s root tbf rate " RATE
	          " burst 64kb latency 2s",
	          ns, veth_b) == 0;
}

static const pt_layer_spec layers[] = {
    {.kind = PT_LAYER_LINEAR, .in_features = 64, .out_features = WIDTH, .bias = true},
    {.kind = PT_LAYER_RELU},
    {.kind = PT_LAYER_LINEAR, .in_features = WIDTH, .out_features = 10, .bias = true},
};

static uint8_t session_key[PT_COMM_KEY_BYTES]; /* the child gets it as hex in argv */

static pt_comm *make_comm(int rank, const char *url, const char *const *urls)
{
	pt_comm *c;
	pt_nng_options no = {.listen_url = url,
	                     .world = 3,
	                     .rank = rank,
	                     .timeout_ms = 60000,
	                     .compress = false,
	                     .key = session_key};
	if (pt_nng_comm_create(&c, &no) != PT_OK || pt_nng_comm_connect(c, urls) != PT_OK)
		die("nng communicator");
	return c;
}

/* The child, in the namespace: stage 2 until STOP. */
static int serve(const char *const *urls, int delay_ms)
{
	pt_comm *c = make_comm(2, urls[2], urls);
	pt_err rv;
	pt_stage_host_set_task_delay(delay_ms);
	rv = pt_stage_host_run(c, 60000);
	pt_comm_destroy(c);
	if (rv != PT_OK)
		fprintf(stderr, "overlap_bench: stage 2: %s\n", pt_last_error());
	return rv == PT_OK ? 0 : 1;
}

static void *stage1_main(void *arg)
{
	pt_stage_host_run(arg, 60000);
	return NULL;
}

typedef struct figures {
	double step;    /* median step time, s */
	double compute; /* the busiest stage's busy time in that step, s */
} figures;

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* One pipeline: stage 2 in a child process in the namespace, stage 1 and
 * the coordinator here. */
static figures run(const char *self, int delay_ms, bool sync_sends, int port)
{
	char u0[64], u1[64], u2[64], dms[16], hex[2 * PT_COMM_KEY_BYTES + 1];
	const char *urls[3] = {u0, u1, u2};
	pt_stage_config sc[2];
	pt_pipeline_config pc = {.n_stages = 2,
	                         .n_microbatches = M,
	                         .microbatch = B,
	                         .mode = PT_MODE_SYNC,
	                         .loss = PT_LOSS_CROSS_ENTROPY,
	                         .ignore_index = -1,
	                         .optim = pt_optim_defaults(PT_OPTIM_SGD, 0.01f),
	                         .output = {PT_F32, 0, 10},
	                         .timeout_ms = 60000};
	pt_comm *c0, *c1;
	pt_coordinator *co;
	pt_tensor x, y;
	pt_rng r;
	pthread_t th;
	pid_t pid;
	double steps[STEPS], busy[STEPS];
	figures f;
	int status;

	snprintf(u0, sizeof(u0), "tcp://" HOST_A ":%d", port);
	snprintf(u1, sizeof(u1), "tcp://" HOST_A ":%d", port + 1);
	snprintf(u2, sizeof(u2), "tcp://" HOST_B ":%d", port + 2);
	snprintf(dms, sizeof(dms), "%d", delay_ms);
	pt_comm_key_format(session_key, hex);
	if ((pid = fork()) < 0)
		die("fork");
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execlp("ip", "ip", "netns", "exec", ns, self, "--serve", u0, u1, u2, dms, hex,
		       (char *)NULL);
		_exit(127);
	}
	pt_stage_host_set_task_delay(delay_ms);
	c0 = make_comm(0, u0, urls);
	c1 = make_comm(1, u1, urls);
	if (pthread_create(&th, NULL, stage1_main, c1) != 0)
		die("stage 1 thread");
	for (int s = 0; s < 2; s++)
		sc[s] = (pt_stage_config){.layers = layers,
		                          .n_layers = 3,
		                          .input = {PT_F32, 0, 64},
		                          .microbatch = B,
		                          .first = s == 0 ? 0 : 2,
		                          .last = s == 0 ? 2 : 3,
		                          .n_slots = M,
		                          .mode = PT_MODE_SYNC,
		                          .optim = pc.optim,
		                          .seed = 1,
		                          .threads = 1,
		                          .sync_sends = sync_sends};
	if (pt_coordinator_create(&co, &pc, c0) != PT_OK ||
	    pt_coordinator_configure(co, sc) != PT_OK)
		die("pipeline");
	if (pt_tensor_init(&x, PT_F32, 2, (int64_t[]){M * B, 64}) != PT_OK ||
	    pt_tensor_init(&y, PT_I64, 1, (int64_t[]){M * B}) != PT_OK)
		die("batch");
	pt_rng_init(&r, 7, 0);
	pt_rng_normal(&r, pt_tensor_f32(&x), M * B * 64, 0.0f, 1.0f);
	for (int i = 0; i < M * B; i++)
		((int64_t *)pt_tensor_data(&y))[i] = i % 10;
	for (int k = -1; k < STEPS; k++) {
		pt_pipe_step_result res;
		if (pt_coordinator_step(co, &x, &y, k + 1, &res) != PT_OK)
			die("step");
		if (k < 0)
			continue; /* warm-up: connections, first allocations */
		steps[k] = res.seconds;
		busy[k] =
		    res.stage_busy[0] > res.stage_busy[1] ? res.stage_busy[0] : res.stage_busy[1];
	}
	if (pt_coordinator_stop(co) != PT_OK)
		die("stop");
	pthread_join(th, NULL);
	waitpid(pid, &status, 0);
	pt_coordinator_destroy(co);
	pt_comm_destroy(c0);
	pt_comm_destroy(c1);
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	qsort(steps, STEPS, sizeof(double), cmp_double);
	qsort(busy, STEPS, sizeof(double), cmp_double);
	f.step = steps[STEPS / 2];
	f.compute = busy[STEPS / 2];
	return f;
}

int main(int argc, char **argv)
{
	figures wire, async, sync;
	double X, C;
	int port = 20000 + (int)(getpid() % 4000) * 3;

	if (argc == 7 && strcmp(argv[1], "--serve") == 0) {
		if (pt_comm_key_parse(argv[6], session_key) != PT_OK)
			die("session key");
		return serve((const char *const *)&argv[2], atoi(argv[5]));
	}
	if (pt_comm_key_generate(session_key) != PT_OK)
		die("session key");
	if (geteuid() != 0) {
		fprintf(stderr, "overlap_bench: skipped: needs root for a network namespace, a "
		                "veth pair and tc tbf\n");
		return 0;
	}
	if (!net_up()) {
		fprintf(stderr, "overlap_bench: skipped: could not set up the shaped veth link\n");
		net_down();
		return 0;
	}
	pt_set_num_threads(1);
	wire = run(argv[0], 0, false, port);
	async = run(argv[0], DELAY_MS, false, port + 10);
	sync = run(argv[0], DELAY_MS, true, port + 20);
	net_down();
	X = wire.step;
	C = async.compute;
	printf("bench overlap_transfer_ms %.1f\n", X * 1e3);
	printf("bench overlap_compute_ms %.1f\n", C * 1e3);
	printf("bench overlap_sync_compute_ms %.1f\n", sync.compute * 1e3);
	printf("bench overlap_async_step_ms %.1f\n", async.step * 1e3);
	printf("bench overlap_sync_step_ms %.1f\n", sync.step * 1e3);
	printf("bench overlap_ratio %.3f\n", async.step / (X > C ? X : C));
	C = sync.compute; /* each ratio with its own run's compute */
	printf("bench overlap_ratio_sync %.3f\n", sync.step / (X + C));
	printf("bench overlap_sync_over_max %.3f\n", sync.step / (X > C ? X : C));
	return 0;
}
