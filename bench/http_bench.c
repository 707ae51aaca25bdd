/* http_bench.c - cost of pipeserver's HTTP endpoint.
 *
 * Spawns the real pipeserver (build/server/pipeserver) with --http on
 * loopback and trains examples/digits.json (4 stages):
 *   bench metrics_scrape_ms  median time of one /metrics scrape while the job
 *                            trains (20 scrapes)
 *   bench scrape_slowdown    throughput lost, in percent, when /metrics is
 *                            scraped every second: jobs of the same length
 *                            run alternately without and with scraping
 *                            (ROUNDS each); best of each is compared. Noise of
 *                            a percent or so is normal on a small machine.
 */
#include "api/api.h"
#include "job/job.h"

#include <arpa/inet.h>
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

#define ROUNDS 3
#define STEPS  1500

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
	static char buf[1 << 16];
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

/* run_job trains STEPS steps; scraping every second when asked. Returns
 * steps per second of the job's running time (server clock), or -1. */
static double run_job(const pt_job_spec *spec, bool scraping, double *scrape_ms)
{
	pt_api_request q;
	pt_api_response r;
	pt_api_job_info ji;
	nng_msg *m = NULL;
	uint64_t job;
	double next = now_s() + 1, tput = -1;
	double times[64];
	int n_times = 0;

	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = spec;
	if (rpc(&q, &r, &m) != 0 || r.code != PT_API_OK)
		return -1;
	job = r.job;
	nng_msg_free(m);
	for (;;) {
		usleep(20000);
		if (scraping && now_s() >= next) {
			double t = scrape();
			if (t >= 0 && n_times < 64)
				times[n_times++] = t;
			next += 1;
		}
		pt_api_request_init(&q, PT_API_GET_JOB);
		q.job = job;
		m = NULL;
		if (rpc(&q, &r, &m) != 0 || pt_api_response_job(&r, 0, &ji) != PT_OK) {
			if (m)
				nng_msg_free(m);
			return -1;
		}
		if (pt_api_job_state_final(ji.state)) {
			if (ji.state == PT_JOB_SUCCEEDED && ji.finished_unix > ji.started_unix)
				tput = (double)ji.step / (ji.finished_unix - ji.started_unix);
			nng_msg_free(m);
			break;
		}
		nng_msg_free(m);
	}
	if (scrape_ms && n_times) {
		double s = 0;
		for (int i = 0; i < n_times; i++)
			s += times[i];
		*scrape_ms = s / n_times * 1e3;
	}
	return tput;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(void)
{
	char self[PATH_MAX], bin[PATH_MAX + 32], dir[] = "/tmp/http_bench.XXXXXX", url[256],
	                                         cmd[300];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	pt_job_spec spec = {0};
	void *buf;
	size_t len;
	pid_t pid;
	double best_plain = 0, best_scraped = 0, ms[20];
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
	spec.steps = STEPS;
	spec.eval_every = 0;
	spec.checkpoint_every = 0;

	/* One scrape's cost while a job trains (the first job of the plain runs). */
	{
		pt_api_request q;
		pt_api_response r;
		nng_msg *m = NULL;
		pt_job_spec s2 = spec;
		s2.steps = 400;
		pt_api_request_init(&q, PT_API_SUBMIT_JOB);
		q.spec = &s2;
		if (rpc(&q, &r, &m) != 0 || r.code != PT_API_OK)
			goto out;
		nng_msg_free(m);
		usleep(300000);
		for (int i = 0; i < 20; i++)
			ms[i] = scrape() * 1e3;
		qsort(ms, 20, sizeof(ms[0]), cmp_d);
		printf("bench metrics_scrape_ms %.3f\n", ms[10]);
		fflush(stdout);
		sleep(3); /* let it finish */
	}
	for (int i = 0; i < ROUNDS; i++) {
		double a = run_job(&spec, false, NULL), b = run_job(&spec, true, NULL);
		if (a < 0 || b < 0)
			goto out;
		if (a > best_plain)
			best_plain = a;
		if (b > best_scraped)
			best_scraped = b;
	}
	printf("# steps/s without scraping %.1f, scraped every second %.1f\n", best_plain,
	       best_scraped);
	printf("bench scrape_slowdown %.2f\n", (1 - best_scraped / best_plain) * 100);
	st = 0;
out:
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
