/* api_bench.c - pipeserver's request path against a bare nng echo server,
 * and the cost of 100 WatchMetrics long-pollers on a training job.
 *
 * Spawns the real pipeserver (build/server/pipeserver, found through
 * /proc/self/exe) on tcp://127.0.0.1:0 with a temporary data dir, and runs an
 * in-process echo server (REP, 16 contexts, replies with the request bytes)
 * on another loopback port. The same GetJob request goes to both from 1 and
 * 16 client threads (one REQ socket each) for a fixed time. Prints:
 *   bench api_rate_c1 / echo_rate_c1 / api_rate_ratio_c1   (requests/s, ours/echo)
 *   bench api_rate_c16 / echo_rate_c16 / api_rate_ratio_c16
 *   bench api_p50_us_c16 / api_p99_us_c16 / echo_p99_us_c16
 *   bench watch100_slowdown  (job time with 100 pollers / without - 1: the median
 *                             of 7 pairs, order alternating; _job_s and
 *                             _base_s are the best of each; the pollers connect
 *                             before the job is submitted)
 * API_BENCH_ONLY=watch skips the request-path figures; API_BENCH_STEPS (2000)
 * and API_BENCH_WATCHERS (100) change the watched job's length and pollers,
 * API_BENCH_PAIRS (7) the number of pairs;
 * API_BENCH_DEBUG=1 prints each job's CPU seconds (server and this process)
 * and the replies its pollers got.
 */
#include "api/api.h"
#include "spawn.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#define RUN_SECONDS 2.0
#define MAX_LAT     4000000
#define WATCH_PAIRS 7 /* API_BENCH_PAIRS changes it (1 to MAX_PAIRS) */
#define MAX_PAIRS   64

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, int rv)
{
	fprintf(stderr, "api_bench: %s: %s\n", what, rv ? nng_strerror(rv) : pt_last_error());
	exit(1);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* ----------------------------------------------------------- echo server -- */

typedef struct echo_ctx {
	nng_ctx ctx;
	nng_aio *aio;
	int sending;
} echo_ctx;

static void echo_cb(void *arg)
{
	echo_ctx *e = arg;
	int rv = nng_aio_result(e->aio);

	if (rv != 0) {
		if (e->sending)
			nng_msg_free(nng_aio_get_msg(e->aio));
		if (rv == NNG_ECLOSED)
			return;
	} else if (!e->sending) {
		e->sending = 1;
		nng_ctx_send(e->ctx, e->aio); /* the received message goes back */
		return;
	}
	e->sending = 0;
	nng_ctx_recv(e->ctx, e->aio);
}

/* --------------------------------------------------------------- clients -- */

typedef struct load {
	const char *url;
	const uint8_t *req;
	size_t req_len;
	double seconds;
	atomic_long count;
	double *lat; /* seconds per request, shared, MAX_LAT slots */
	atomic_long nlat;
} load;

static void *client_main(void *arg)
{
	load *l = arg;
	nng_socket s;
	double t_end;
	int rv;

	if ((rv = nng_req0_open(&s)) != 0 || (rv = nng_dial(s, l->url, NULL, 0)) != 0)
		die("client", rv);
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
	t_end = now_s() + l->seconds;
	while (now_s() < t_end) {
		nng_msg *m;
		double t0 = now_s();
		if ((rv = nng_msg_alloc(&m, l->req_len)) != 0)
			die("alloc", rv);
		memcpy(nng_msg_body(m), l->req, l->req_len);
		if ((rv = nng_sendmsg(s, m, 0)) != 0)
			die("send", rv);
		if ((rv = nng_recvmsg(s, &m, 0)) != 0)
			die("recv", rv);
		nng_msg_free(m);
		{
			long k = atomic_fetch_add(&l->nlat, 1);
			if (k < MAX_LAT)
				l->lat[k] = now_s() - t0;
		}
		atomic_fetch_add(&l->count, 1);
	}
	nng_close(s);
	return NULL;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* run_load drives url with n clients; returns the rate, p50/p99 in µs. */
static double run_load(const char *url, const uint8_t *req, size_t len, int n, double *p50,
                       double *p99)
{
	load l = {.url = url, .req = req, .req_len = len, .seconds = RUN_SECONDS};
	pthread_t th[64];
	double t0, dt;
	long k;

	l.lat = malloc(MAX_LAT * sizeof(double));
	atomic_init(&l.count, 0);
	atomic_init(&l.nlat, 0);
	t0 = now_s();
	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, client_main, &l);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	dt = now_s() - t0;
	k = atomic_load(&l.nlat) < MAX_LAT ? atomic_load(&l.nlat) : MAX_LAT;
	qsort(l.lat, (size_t)k, sizeof(double), cmp_d);
	*p50 = k ? l.lat[k / 2] * 1e6 : 0;
	*p99 = k ? l.lat[(size_t)(k * 0.99)] * 1e6 : 0;
	free(l.lat);
	return (double)atomic_load(&l.count) / dt;
}

/* ------------------------------------------------------------ pipeserver -- */

static pid_t spawn_server(const char *bin, const char *dir, char *url, size_t n)
{
	const char *argv[] = {bin,
	                      "--listen",
	                      "tcp://127.0.0.1:0",
	                      "--data-dir",
	                      dir,
	                      "--files-root",
	                      PT_SOURCE_ROOT,
	                      "--log-level",
	                      "warn",
	                      NULL};
	return bench_spawn(argv, url, n);
}

/* rpc sends q and returns the parsed reply (view into *keep). */
static void rpc(nng_socket s, pt_fb_builder *b, pt_api_request *q, pt_api_response *r,
                nng_msg **keep)
{
	const uint8_t *d;
	size_t n;
	nng_msg *m;
	int rv;

	static atomic_ulong next_id = 1;

	if (*keep) {
		nng_msg_free(*keep);
		*keep = NULL;
	}
	q->id = atomic_fetch_add(&next_id, 1);
	if (pt_api_build_request(b, q, &d, &n) != PT_OK)
		die("build", 0);
	nng_msg_alloc(&m, n);
	memcpy(nng_msg_body(m), d, n);
	if ((rv = nng_sendmsg(s, m, 0)) != 0 || (rv = nng_recvmsg(s, keep, 0)) != 0)
		die("rpc", rv);
	if (pt_api_parse_response(nng_msg_body(*keep), nng_msg_len(*keep), r) != PT_OK)
		die("parse", 0);
	if (r->code != PT_API_OK) {
		fprintf(stderr, "api_bench: %s: %s\n", pt_api_code_name(r->code),
		        r->message ? r->message : "");
		exit(1);
	}
}

typedef struct watcher {
	const char *url;
	_Atomic uint64_t *job; /* 0 until the job is submitted */
	pthread_barrier_t *dialed;
	pthread_t th;
	int replies;  /* WatchMetrics replies this watcher got */
	double first; /* when its first reply came (monotonic seconds) */
} watcher;

static void *watch_main(void *arg)
{
	watcher *w = arg;
	nng_socket s;
	pt_fb_builder b;
	pt_api_request q;
	pt_api_response r;
	nng_msg *keep = NULL;
	int64_t cursor = -1;

	if (nng_req0_open(&s) != 0 || nng_dial(s, w->url, NULL, 0) != 0)
		die("watcher", 0);
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 60000);
	pt_fb_builder_init(&b, 0);
	pthread_barrier_wait(w->dialed);
	while (atomic_load(w->job) == 0)
		usleep(1000);
	for (;;) {
		pt_api_request_init(&q, PT_API_WATCH_METRICS);
		q.job = atomic_load(w->job);
		q.cursor = cursor;
		q.wait_ms = 1000;
		rpc(s, &b, &q, &r, &keep);
		if (w->replies++ == 0)
			w->first = now_s();
		cursor = r.cursor;
		if (r.ended)
			break;
	}
	if (keep)
		nng_msg_free(keep);
	pt_fb_builder_fini(&b);
	nng_close(s);
	return NULL;
}

/* train runs one job to the end (with n_watchers pollers); returns its
 * training time in seconds (finished - started, as the server saw it). */
static pid_t server_pid;

/* cpu_s: CPU seconds (user + system) process pid has used so far. */
static double cpu_s(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long ut = 0, st = 0;
	FILE *f;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fgets(buf, sizeof(buf), f) != NULL) {
		char *p = strrchr(buf, ')');
		if (p == NULL ||
		    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
		           &st) != 2)
			ut = st = 0;
	}
	fclose(f);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double train(nng_socket s, const char *url, pt_fb_builder *b, const pt_job_spec *spec,
                    int n_watchers)
{
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	nng_msg *keep = NULL;
	watcher *w = calloc((size_t)n_watchers + 1, sizeof(*w));
	_Atomic uint64_t job = 0;
	pthread_barrier_t dialed;
	uint64_t id;
	double t;

	/* The watchers connect before the job starts: what is measured is
	 * watching a running job, not opening a hundred connections. */
	pthread_barrier_init(&dialed, NULL, (unsigned)n_watchers + 1);
	for (int i = 0; i < n_watchers; i++) {
		w[i].url = url;
		w[i].job = &job;
		w[i].dialed = &dialed;
		pthread_create(&w[i].th, NULL, watch_main, &w[i]);
	}
	pthread_barrier_wait(&dialed);
	pthread_barrier_destroy(&dialed);
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = spec;
	double submitted = now_s(), srv0 = cpu_s(server_pid), me0 = cpu_s(getpid());
	rpc(s, b, &q, &r, &keep);
	id = r.job;
	atomic_store(&job, id);
	for (;;) {
		pt_api_request_init(&q, PT_API_GET_JOB);
		q.job = id;
		rpc(s, b, &q, &r, &keep);
		pt_api_response_job(&r, 0, &ji);
		if (pt_api_job_state_final(ji.state))
			break;
		usleep(50000);
	}
	if (ji.state != PT_JOB_SUCCEEDED) {
		fprintf(stderr, "api_bench: job ended %s: %s\n", pt_api_job_state_name(ji.state),
		        ji.message ? ji.message : "");
		exit(1);
	}
	t = ji.finished_unix - ji.started_unix;
	if (getenv("API_BENCH_DEBUG"))
		fprintf(stderr, "job %llu: step %lld started %.3f finished %.3f\n",
		        (unsigned long long)id, (long long)ji.step, ji.started_unix,
		        ji.finished_unix);
	for (int i = 0; i < n_watchers; i++)
		pthread_join(w[i].th, NULL);
	if (getenv("API_BENCH_DEBUG"))
		fprintf(stderr, "  job %.3f s; CPU: server %.3f s, this process %.3f s\n", t,
		        cpu_s(server_pid) - srv0, cpu_s(getpid()) - me0);
	if (getenv("API_BENCH_DEBUG") && n_watchers > 0) {
		int total = 0;
		double last_first = 0;
		for (int i = 0; i < n_watchers; i++) {
			total += w[i].replies;
			last_first = w[i].first > last_first ? w[i].first : last_first;
		}
		fprintf(stderr,
		        "  %d replies to %d watchers; the last first reply %.3f s after submit\n",
		        total, n_watchers, last_first - submitted);
	}
	nng_msg_free(keep);
	free(w);
	return t;
}

/* print_rates prints the request-path figures: [clients 1, 16][ours, echo]. */
static void print_rates(double rate[2][2], double p50[2][2], double p99[2][2])
{
	printf("bench api_rate_c1 %.0f\nbench echo_rate_c1 %.0f\nbench api_rate_ratio_c1 %.3f\n",
	       rate[0][0], rate[0][1], rate[0][0] / rate[0][1]);
	printf("bench api_rate_c16 %.0f\nbench echo_rate_c16 %.0f\nbench api_rate_ratio_c16 %.3f\n",
	       rate[1][0], rate[1][1], rate[1][0] / rate[1][1]);
	printf("bench api_p50_us_c1 %.1f\nbench api_p50_us_c16 %.1f\nbench api_p99_us_c16 "
	       "%.1f\nbench echo_p99_us_c16 %.1f\n",
	       p50[0][0], p50[1][0], p99[1][0], p99[1][1]);
}

int main(void)
{
	char self[PATH_MAX], bin[PATH_MAX + 64], dir[] = "/tmp/api_bench.XXXXXX", url[256],
	                                         echo_url[256], cmd[300];
	nng_socket echo, s;
	nng_listener el;
	echo_ctx ectx[16];
	pt_fb_builder b;
	pt_api_request q;
	pt_api_response r;
	pt_job_spec spec;
	nng_msg *keep = NULL;
	void *buf;
	size_t len, n;
	const uint8_t *d;
	uint8_t *get_req;
	pid_t pid;
	ssize_t k;
	int port, rv;
	double rate[2][2], p50[2][2], p99[2][2], base = 1e30, with = 1e30;
	const char *only = getenv("API_BENCH_ONLY");
	bool watch_only = only != NULL && strcmp(only, "watch") == 0;

	signal(SIGPIPE, SIG_IGN);
	if ((k = readlink("/proc/self/exe", self, sizeof(self) - 1)) <= 0)
		return 1;
	self[k] = '\0';
	*strrchr(self, '/') = '\0';
	snprintf(bin, sizeof(bin), "%s/../server/pipeserver", self);
	if (mkdtemp(dir) == NULL)
		return 1;
	pid = spawn_server(bin, dir, url, sizeof(url));
	server_pid = pid;

	/* The echo server. */
	if ((rv = nng_rep0_open(&echo)) != 0 ||
	    (rv = nng_listener_create(&el, echo, "tcp://127.0.0.1:0")) != 0 ||
	    (rv = nng_listener_start(el, 0)) != 0)
		die("echo", rv);
	nng_listener_get_int(el, NNG_OPT_TCP_BOUND_PORT, &port);
	snprintf(echo_url, sizeof(echo_url), "tcp://127.0.0.1:%d", port);
	for (int i = 0; i < 16; i++) {
		ectx[i].sending = 0;
		if ((rv = nng_aio_alloc(&ectx[i].aio, echo_cb, &ectx[i])) != 0 ||
		    (rv = nng_ctx_open(&ectx[i].ctx, echo)) != 0)
			die("echo ctx", rv);
		nng_ctx_recv(ectx[i].ctx, ectx[i].aio);
	}

	/* One finished job for GetJob to describe. */
	if (pt_job_spec_load_file(PT_SOURCE_ROOT "/examples/digits.json", &buf, &len) != PT_OK)
		die("digits.json", 0);
	memset(&spec, 0, sizeof(spec));
	if (pt_job_spec_decode(buf, len, &spec) != PT_OK)
		die("decode", 0);
	free(buf);
	pt_fb_builder_init(&b, 0);
	if ((rv = nng_req0_open(&s)) != 0 || (rv = nng_dial(s, url, NULL, 0)) != 0)
		die("dial", rv);
	spec.steps = 10;
	spec.checkpoint_every = 0;
	spec.eval_every = 0;
	train(s, url, &b, &spec, 0);

	pt_api_request_init(&q, PT_API_GET_JOB);
	q.id = 1;
	q.job = 1;
	if (pt_api_build_request(&b, &q, &d, &n) != PT_OK)
		die("build", 0);
	get_req = malloc(n);
	memcpy(get_req, d, n);
	for (int c = 0; c < 2 && !watch_only; c++) {
		int clients = c ? 16 : 1;
		rate[c][0] = run_load(url, get_req, n, clients, &p50[c][0], &p99[c][0]);
		rate[c][1] = run_load(echo_url, get_req, n, clients, &p50[c][1], &p99[c][1]);
	}
	if (!watch_only)
		print_rates(rate, p50, p99);
	fflush(stdout);

	/* A 4-stage digits job with and without 100 long-pollers: WATCH_PAIRS
	 * pairs, the order alternating, the median of the pairs' ratios (one
	 * burst of other load spoils a pair, not the figure). */
	spec.steps = getenv("API_BENCH_STEPS") ? atoi(getenv("API_BENCH_STEPS")) : 2000;
	spec.stages = 4;
	spec.eval_every = 0;
	spec.checkpoint_every = 0;
	double ratio[MAX_PAIRS];
	int n_watch = getenv("API_BENCH_WATCHERS") ? atoi(getenv("API_BENCH_WATCHERS")) : 100;
	int pairs = getenv("API_BENCH_PAIRS") ? atoi(getenv("API_BENCH_PAIRS")) : WATCH_PAIRS;
	if (pairs < 1 || pairs > MAX_PAIRS)
		pairs = WATCH_PAIRS;
	for (int rep = 0; rep < pairs; rep++) {
		double t0, t1;
		if (rep % 2 == 0) {
			t0 = train(s, url, &b, &spec, 0);
			t1 = train(s, url, &b, &spec, n_watch);
		} else {
			t1 = train(s, url, &b, &spec, n_watch);
			t0 = train(s, url, &b, &spec, 0);
		}
		printf("# watch100 pair %d: %.3f s alone, %.3f s with 100 pollers\n", rep, t0, t1);
		fflush(stdout);
		ratio[rep] = t1 / t0;
		base = t0 < base ? t0 : base;
		with = t1 < with ? t1 : with;
	}
	qsort(ratio, (size_t)pairs, sizeof(ratio[0]), cmp_double);
	printf("bench watch100_job_s %.3f\nbench watch100_base_s %.3f\nbench watch100_slowdown "
	       "%.3f\n",
	       with, base, ratio[pairs / 2] - 1.0);

	pt_api_request_init(&q, PT_API_SERVER_INFO);
	rpc(s, &b, &q, &r, &keep);
	nng_msg_free(keep);
	nng_close(s);
	kill(pid, SIGTERM);
	waitpid(pid, &rv, 0);
	nng_close(echo);
	for (int i = 0; i < 16; i++)
		nng_aio_free(ectx[i].aio);
	pt_job_spec_fini(&spec);
	pt_fb_builder_fini(&b);
	free(get_req);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "api_bench: could not remove %s\n", dir);
	return 0;
}
