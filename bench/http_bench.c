/* http_bench.c - cost of pipeserver's HTTP endpoint.
 *
 * Spawns the real pipeserver (build/server/pipeserver) with --http on
 * loopback and trains examples/digits.json (4 stages):
 *   bench metrics_scrape_ms  median time of one /metrics scrape while a job
 *                            trains (20 scrapes, 50 ms apart)
 *   bench scrape_slowdown    throughput lost, as a fraction (0.01 = 1 %), when
 *                            a scraper fetches /metrics every second. One long
 *                            job trains; after WARMUP_S it runs PAIRS pairs of
 *                            WINDOW_S-second windows, one plain and one with
 *                            the scraper on, the order alternating from pair
 *                            to pair (AB BA AB ...) so a drift of the machine
 *                            favours neither arm. A window's throughput is the
 *                            steps between the job's latest points at its
 *                            start and end over their server-clock time; the
 *                            figure is the median of the pairs'
 *                            1 - scraped / plain.
 *   bench scrape_cpu_share   CPU time of the server's HTTP thread (named
 *                            pt-http) over the CPU time of the rest of the
 *                            server, in the scraped windows: what scraping
 *                            takes from training when training is CPU-bound.
 * On a quiet machine the two agree within noise. Where other processes
 * share the 2 cores, single windows swing by tens of percent and the
 * slowdown's median only bounds the cost roughly ("#" lines give every pair
 * and the quartiles); the CPU share does not depend on them.
 */
#include "api/api.h"
#include "job/job.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>

#define PAIRS    12
#define WINDOW_S 5 /* seconds per arm of a pair */
#define WARMUP_S 3 /* training before the first window */

static nng_socket api;
static pt_fb_builder fbb;
static int http_port;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static pid_t spawn_server(const char *bin, const char *dir, char *url, size_t n)
{
	int out[2];
	pid_t pid;
	char line[512];
	FILE *f;

	if (pipe(out) != 0)
		return -1;
	if ((pid = fork()) == 0) {
		dup2(out[1], 1);
		close(out[0]);
		execl(bin, bin, "--listen", "tcp://127.0.0.1:0", "--http", "127.0.0.1:0",
		      "--data-dir", dir, "--files-root", PT_SOURCE_ROOT, "--log-level", "warn",
		      (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	f = fdopen(out[0], "r");
	url[0] = '\0';
	while (f && fgets(line, sizeof(line), f)) {
		char u[256];
		if (sscanf(line, "pipeserver listening on %255s", u) == 1)
			snprintf(url, n, "%s", u);
		if (sscanf(line, "pipeserver http on http://127.0.0.1:%d", &http_port) == 1)
			break;
	}
	if (f)
		fclose(f);
	return url[0] && http_port > 0 ? pid : -1;
}

static int rpc(pt_api_request *q, pt_api_response *r, nng_msg **m)
{
	static uint64_t id = 1;
	const uint8_t *d;
	size_t len;
	nng_msg *msg;

	q->id = id++;
	if (pt_api_build_request(&fbb, q, &d, &len) != PT_OK || nng_msg_alloc(&msg, len) != 0)
		return -1;
	memcpy(nng_msg_body(msg), d, len);
	if (nng_sendmsg(api, msg, 0) != 0) {
		nng_msg_free(msg);
		return -1;
	}
	if (nng_recvmsg(api, m, 0) != 0)
		return -1;
	return pt_api_parse_response(nng_msg_body(*m), nng_msg_len(*m), r) == PT_OK ? 0 : -1;
}

/* scrape fetches /metrics once; returns seconds, or -1. */
static double scrape(void)
{
	char buf[1 << 16];
	static const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_port)};
	double t0 = now_s();
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok = 0;
	ssize_t r;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof(req) - 1)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	while ((r = recv(fd, buf, sizeof(buf), 0)) > 0)
		ok = 1;
	close(fd);
	return ok ? now_s() - t0 : -1;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The scraper thread: one /metrics scrape a second while `on` is set. */
typedef struct scraper {
	pthread_t thread;
	atomic_bool on, quit;
	int n;
} scraper;

static void *scraper_main(void *arg)
{
	scraper *sc = arg;
	double next = now_s() + 1;

	while (!atomic_load(&sc->quit)) {
		usleep(10000);
		if (!atomic_load(&sc->on)) {
			next = now_s(); /* the first scrape as soon as it is on */
			continue;
		}
		if (now_s() >= next) {
			if (scrape() >= 0)
				sc->n++;
			next += 1;
		}
	}
	return NULL;
}

/* get_job fetches job's info into *ji (with the reply in *m, to free). */
static int get_job(uint64_t job, pt_api_job_info *ji, nng_msg **m)
{
	pt_api_request q;
	pt_api_response r;

	pt_api_request_init(&q, PT_API_GET_JOB);
	q.job = job;
	*m = NULL;
	if (rpc(&q, &r, m) != 0 || r.code != PT_API_OK || pt_api_response_job(&r, 0, ji) != PT_OK)
		return -1;
	return 0;
}

/* last_point reads the job's latest (step, server time); -1 on error. */
static int last_point(uint64_t job, int64_t *step, double *t, bool *ended)
{
	pt_api_job_info ji;
	nng_msg *m = NULL;
	int rv = get_job(job, &ji, &m);

	if (rv == 0) {
		*step = ji.has_last ? ji.last.step : 0;
		*t = ji.has_last ? ji.last.time_unix : 0;
		*ended = pt_api_job_state_final(ji.state);
	}
	if (m)
		nng_msg_free(m);
	return rv;
}

/* cpu_s returns the CPU seconds all threads of process pid have run
 * (/proc/PID/task/TID/schedstat, nanoseconds) and in *http those of its
 * thread named pt-http; -1 on error. */
static double cpu_s(pid_t pid, double *http)
{
	char path[64];
	DIR *d;
	struct dirent *e;
	double sum = 0;

	*http = 0;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if ((d = opendir(path)) == NULL)
		return -1;
	while ((e = readdir(d)) != NULL) {
		char p2[400], name[32] = "";
		unsigned long long ns;
		FILE *f;
		if (e->d_name[0] == '.')
			continue;
		snprintf(p2, sizeof(p2), "%s/%s/comm", path, e->d_name);
		if ((f = fopen(p2, "r")) != NULL) {
			if (fgets(name, sizeof(name), f) == NULL)
				name[0] = '\0';
			fclose(f);
		}
		snprintf(p2, sizeof(p2), "%s/%s/schedstat", path, e->d_name);
		if ((f = fopen(p2, "r")) == NULL)
			continue; /* a thread that just ended */
		if (fscanf(f, "%llu", &ns) == 1) {
			sum += (double)ns * 1e-9;
			if (strcmp(name, "pt-http\n") == 0)
				*http = (double)ns * 1e-9;
		}
		fclose(f);
	}
	closedir(d);
	return sum;
}

/* One window: steps per second of wall time (the job's points' server
 * clock), and the CPU seconds the server spent in all and in its HTTP
 * thread. */
typedef struct rate {
	double wall, cpu, http;
} rate;

/* window trains for WINDOW_S seconds, scraped by sc when scraping, and
 * measures the steps between the job's latest points at its start and end;
 * false on error. */
static bool window(pid_t pid, uint64_t job, scraper *sc, bool scraping, rate *out)
{
	int64_t s0, s1;
	double t0, t1, c0, c1, h0, h1, start = now_s();
	bool ended;

	if (last_point(job, &s0, &t0, &ended) != 0 || ended || (c0 = cpu_s(pid, &h0)) < 0)
		return false;
	atomic_store(&sc->on, scraping);
	while (now_s() - start < WINDOW_S)
		usleep(20000);
	atomic_store(&sc->on, false);
	if (last_point(job, &s1, &t1, &ended) != 0 || ended || (c1 = cpu_s(pid, &h1)) < 0 ||
	    s1 <= s0 || t1 <= t0)
		return false;
	out->wall = (double)(s1 - s0) / (t1 - t0);
	out->cpu = c1 - c0;
	out->http = h1 - h0;
	return true;
}

/* median of n values (sorts v). */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(v[0]), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* submit queues spec with `steps` steps; returns the job id, 0 on error. */
static uint64_t submit(const pt_job_spec *spec, int64_t steps)
{
	pt_api_request q;
	pt_api_response r;
	pt_job_spec s2 = *spec;
	nng_msg *m = NULL;
	uint64_t job = 0;

	s2.steps = steps;
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &s2;
	if (rpc(&q, &r, &m) == 0 && r.code == PT_API_OK)
		job = r.job;
	if (m)
		nng_msg_free(m);
	return job;
}

/* cancel_and_wait cancels job and waits (up to 30 s) until it has stopped. */
static void cancel_and_wait(uint64_t job)
{
	pt_api_request q;
	pt_api_response r;
	nng_msg *m = NULL;
	int64_t step;
	double t;
	bool ended = false;

	pt_api_request_init(&q, PT_API_CANCEL_JOB);
	q.job = job;
	rpc(&q, &r, &m);
	if (m)
		nng_msg_free(m);
	for (int i = 0; i < 600 && !ended; i++) {
		usleep(50000);
		if (last_point(job, &step, &t, &ended) != 0)
			break;
	}
}

/* scrape_ms times 20 scrapes of /metrics, 50 ms apart, while job trains
 * (from its 50th step on); *ms_median gets the median in milliseconds. */
static int scrape_ms(uint64_t job, double *ms_median)
{
	double ms[20], t;
	int64_t step = 0;
	bool ended = false;

	for (int i = 0; i < 400 && step < 50; i++) {
		usleep(50000);
		if (last_point(job, &step, &t, &ended) != 0 || ended)
			return -1;
	}
	if (step < 50)
		return -1;
	for (int i = 0; i < 20; i++) {
		usleep(50000);
		if ((ms[i] = scrape() * 1e3) < 0)
			return -1;
	}
	*ms_median = median(ms, 20);
	return 0;
}

int main(void)
{
	char self[PATH_MAX], bin[PATH_MAX + 32], dir[] = "/tmp/http_bench.XXXXXX", url[256],
	                                         cmd[300];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	pt_job_spec spec = {0};
	scraper sc = {0};
	bool sc_started = false;
	void *buf;
	size_t len;
	pid_t pid;
	double ms, slow[PAIRS], sorted[PAIRS], http_cpu = 0, train_cpu = 0;
	uint64_t job = 0;
	int st = 1;

	if (n <= 0 || mkdtemp(dir) == NULL)
		return 1;
	self[n] = '\0';
	*strrchr(self, '/') = '\0';
	snprintf(bin, sizeof(bin), "%s/../server/pipeserver", self);
	signal(SIGPIPE, SIG_IGN);
	if ((pid = spawn_server(bin, dir, url, sizeof(url))) < 0) {
		fprintf(stderr, "http_bench: pipeserver did not start\n");
		return 1;
	}
	if (nng_req0_open(&api) != 0 || nng_dial(api, url, NULL, 0) != 0 ||
	    pt_fb_builder_init(&fbb, 0) != PT_OK ||
	    pt_job_spec_load_file(PT_SOURCE_ROOT "/examples/digits.json", &buf, &len) != PT_OK)
		goto out;
	nng_socket_set_ms(api, NNG_OPT_RECVTIMEO, 30000);
	memset(&spec, 0, sizeof(spec));
	if (pt_job_spec_decode(buf, len, &spec) != PT_OK) {
		free(buf);
		goto out;
	}
	free(buf);
	spec.eval_every = 0;
	spec.checkpoint_every = 0;

	if ((job = submit(&spec, 1000000)) == 0) /* cancelled at the end */
		goto out;
	if (scrape_ms(job, &ms) != 0)
		goto out;
	printf("bench metrics_scrape_ms %.3f\n", ms);
	fflush(stdout);

	if (pthread_create(&sc.thread, NULL, scraper_main, &sc) != 0)
		goto out;
	sc_started = true;
	sleep(WARMUP_S);
	for (int i = 0; i < PAIRS; i++) {
		bool scraped_first = i % 2 == 1, ok;
		rate a, b;
		if (scraped_first)
			ok = window(pid, job, &sc, true, &b) && window(pid, job, &sc, false, &a);
		else
			ok = window(pid, job, &sc, false, &a) && window(pid, job, &sc, true, &b);
		if (!ok)
			goto out;
		slow[i] = sorted[i] = 1 - b.wall / a.wall;
		http_cpu += b.http;
		train_cpu += b.cpu - b.http;
		printf("# pair %2d (%s first): %.1f steps/s plain, %.1f scraped: %+.4f\n", i + 1,
		       scraped_first ? "scraped" : "plain", a.wall, b.wall, slow[i]);
		fflush(stdout);
	}
	qsort(sorted, PAIRS, sizeof(sorted[0]), cmp_d);
	printf("# %d scrapes, %.3f ms of HTTP-thread CPU each; pairs' quartiles %+.4f %+.4f "
	       "(spread from other processes on the machine)\n",
	       sc.n, sc.n ? http_cpu / sc.n * 1e3 : 0.0, sorted[PAIRS / 4],
	       sorted[PAIRS - 1 - PAIRS / 4]);
	printf("bench scrape_slowdown %.4f\n", median(slow, PAIRS));
	printf("bench scrape_cpu_share %.5f\n", train_cpu > 0 ? http_cpu / train_cpu : 0.0);
	st = 0;
out:
	if (sc_started) {
		atomic_store(&sc.quit, true);
		pthread_join(sc.thread, NULL);
	}
	if (job)
		cancel_and_wait(job);
	pt_job_spec_fini(&spec);
	nng_close(api);
	pt_fb_builder_fini(&fbb);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "http_bench: could not remove %s\n", dir);
	return st;
}
