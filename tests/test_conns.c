/* test_conns.c - the real pipeserver under connection pressure.
 *
 * Starts build/server/pipeserver on tcp://127.0.0.1:0 and opens connections
 * that complete the SP handshake by hand (raw TCP: 8-byte SP header, then
 * 8-byte big-endian lengths, a 4-byte request id with the high bit set and
 * the request), so that thousands of them cost the test one descriptor each.
 * Covered: 2,000 idle connections plus one client that pipelines ListJobs and
 * never reads (its requests beyond --max-outstanding are dropped), while another client's
 * ServerInfo stays fast and a job finishes; a server with RLIMIT_NOFILE 256 and 300 idle
 * connections that still answers new clients and writes its checkpoints; --idle-timeout closes idle
 * connections and not one with a parked WatchMetrics; --http beyond loopback without a token is
 * refused before anything starts.
 */
#include "api/api.h"
#include "pt_test.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

static char server_bin[PATH_MAX + 64];
static char tmpdir[256];

typedef struct server {
	pid_t pid;
	char url[256];
	int port;
} server;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* raise_own_nofile raises this process' soft RLIMIT_NOFILE to at least want;
 * false (with a message) when the hard limit is lower. */
static bool raise_own_nofile(rlim_t want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return false;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= want)
		return true;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want) {
		printf("SKIP: RLIMIT_NOFILE hard limit %llu < %llu this test needs\n",
		       (unsigned long long)rl.rlim_max, (unsigned long long)want);
		return false;
	}
	rl.rlim_cur = want;
	return setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

/* server_start runs pipeserver with extra args (NULL-terminated); nofile > 0
 * sets its RLIMIT_NOFILE (soft and hard) first. */
static bool server_start(server *s, const char *name, long nofile, const char *const *extra)
{
	int out[2];
	const char *argv[40];
	int n = 0;
	char line[512], logpath[600], dir[512];
	FILE *f;
	const char *colon;

	memset(s, 0, sizeof(*s));
	snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
	mkdir(dir, 0755);
	argv[n++] = server_bin;
	argv[n++] = "--listen";
	argv[n++] = "tcp://127.0.0.1:0";
	argv[n++] = "--data-dir";
	argv[n++] = dir;
	argv[n++] = "--files-root";
	argv[n++] = PT_SOURCE_ROOT;
	argv[n++] = "--threads";
	argv[n++] = "1";
	argv[n++] = "--watch-interval-ms";
	argv[n++] = "20";
	for (int i = 0; extra && extra[i] && n < 38; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	if (pipe(out) != 0)
		return false;
	snprintf(logpath, sizeof(logpath), "%s/%s.log", tmpdir, name);
	pid_t parent = getpid();
	if ((s->pid = fork()) == 0) {
		pt_test_child_dies_with(parent);
		int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0644);
		dup2(out[1], 1);
		if (fd >= 0)
			dup2(fd, 2);
		close(out[0]);
		close(out[1]);
		if (nofile > 0) {
			struct rlimit rl = {(rlim_t)nofile, (rlim_t)nofile};
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		/* Descriptors of the test (its own connections) stay here. */
		for (int fd2 = 3; fd2 < 4096; fd2++)
			close(fd2);
		execv(server_bin, (char *const *)argv);
		_exit(127);
	}
	close(out[1]);
	f = fdopen(out[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
		fprintf(stderr, "pipeserver printed no line (see %s)\n", logpath);
		if (f)
			fclose(f);
		return false;
	}
	fclose(f);
	line[strcspn(line, "\n")] = '\0';
	if (sscanf(line, "pipeserver listening on %255s", s->url) != 1 ||
	    (colon = strrchr(s->url, ':')) == NULL) {
		fprintf(stderr, "unexpected first line: %s\n", line);
		return false;
	}
	s->port = atoi(colon + 1);
	return true;
}

/* server_stop sends sig and returns the exit status; -1 when it died of a
 * signal, -3 when it did not exit within 30 s (then it is killed). */
static int server_stop(server *s, int sig)
{
	int st = 0;
	double t0 = now_s();

	kill(s->pid, sig);
	while (waitpid(s->pid, &st, WNOHANG) == 0) {
		if (now_s() - t0 > 30) {
			fprintf(stderr, "pipeserver did not exit in 30 s: killed\n");
			kill(s->pid, SIGKILL);
			waitpid(s->pid, &st, 0);
			return -3;
		}
		usleep(20000);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* log_has tells whether the server log <name>.log contains text. */
static bool log_has(const char *name, const char *text)
{
	char path[600], *buf;
	FILE *f;
	size_t n;
	bool found;

	snprintf(path, sizeof(path), "%s/%s.log", tmpdir, name);
	if ((f = fopen(path, "r")) == NULL)
		return false;
	buf = calloc(1, 1 << 22);
	n = fread(buf, 1, (1 << 22) - 1, f);
	buf[n] = '\0';
	fclose(f);
	found = strstr(buf, text) != NULL;
	free(buf);
	return found;
}

/* ------------------------------------------------------ raw SP over TCP -- */

/* raw_connect: a REQ peer (0x30) of the API's REP socket (0x31). */
static int raw_connect(int port, int rcvbuf)
{
	return pt_test_sp_connect(port, rcvbuf, 0x30, 0x31);
}

/* raw_reply reads one reply into *buf (malloc'd, the 4-byte id stripped);
 * as read_all. */
static int raw_reply(int fd, uint8_t **buf, size_t *len, int timeout_ms)
{
	uint8_t h[8];
	uint64_t n = 0;
	int rv;

	*buf = NULL;
	if ((rv = pt_test_read_all(fd, h, 8, timeout_ms)) != 1)
		return rv;
	for (int i = 0; i < 8; i++)
		n = n << 8 | h[i];
	if (n < 4 || n > (1u << 26))
		return -1;
	*buf = malloc(n);
	if ((rv = pt_test_read_all(fd, *buf, n, timeout_ms)) != 1) {
		free(*buf);
		*buf = NULL;
		return rv;
	}
	memmove(*buf, *buf + 4, n - 4);
	*len = n - 4;
	return 1;
}

/* ---------------------------------------------------------- nng client -- */

typedef struct client {
	nng_socket sock;
	nng_msg *last;
	pt_fb_builder b;
	uint64_t next_id;
} client;

static void client_open(client *c, const server *s, int recv_timeout_ms)
{
	memset(c, 0, sizeof(*c));
	CU_ASSERT_EQUAL_FATAL(nng_req0_open(&c->sock), 0);
	nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, recv_timeout_ms);
	nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, 10000);
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
	CU_ASSERT_EQUAL_FATAL(nng_dial(c->sock, s->url, NULL, 0), 0);
	PT_CHECK_OK(pt_fb_builder_init(&c->b, 0));
	c->next_id = 1000;
}

static void client_close(client *c)
{
	if (c->last)
		nng_msg_free(c->last);
	pt_test_nng_close(c->sock.id);
	pt_fb_builder_fini(&c->b);
}

/* call sends q and parses the reply into r; an nng error code or 0. */
static int call(client *c, pt_api_request *q, pt_api_response *r)
{
	const uint8_t *d;
	size_t n;
	nng_msg *m;
	int rv;

	if (c->last) {
		nng_msg_free(c->last);
		c->last = NULL;
	}
	q->id = c->next_id++;
	PT_CHECK_OK(pt_api_build_request(&c->b, q, &d, &n));
	if ((rv = nng_msg_alloc(&m, n)) != 0)
		return rv;
	memcpy(nng_msg_body(m), d, n);
	if ((rv = nng_sendmsg(c->sock, m, 0)) != 0) {
		nng_msg_free(m);
		return rv;
	}
	if ((rv = nng_recvmsg(c->sock, &c->last, 0)) != 0)
		return rv;
	if (pt_api_parse_response(nng_msg_body(c->last), nng_msg_len(c->last), r) != PT_OK)
		return NNG_EPROTO;
	CU_ASSERT_EQUAL(r->id, q->id);
	return 0;
}

static int simple(client *c, pt_api_kind k, uint64_t job, pt_api_response *r)
{
	pt_api_request q;
	pt_api_request_init(&q, k);
	q.job = job;
	return call(c, &q, r);
}

static uint64_t submit_digits(client *c, int64_t steps, int64_t every)
{
	pt_job_spec spec;
	pt_api_request q;
	pt_api_response r;
	uint64_t id = 0;

	pt_test_digits_spec(&spec);
	spec.steps = steps;
	spec.checkpoint_every = every;
	spec.checkpoint_keep = 100;
	spec.eval_every = 0;
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &spec;
	CU_ASSERT_EQUAL_FATAL(call(c, &q, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	if (r.code == PT_API_OK)
		id = r.job;
	pt_job_spec_fini(&spec);
	return id;
}

/* wait_state polls GetJob until the job ended or timeout_s passed. */
static pt_api_job_state wait_end(client *c, uint64_t id, double timeout_s, pt_api_job_info *ji)
{
	double t0 = now_s();
	pt_api_response r;

	for (;;) {
		CU_ASSERT_EQUAL_FATAL(simple(c, PT_API_GET_JOB, id, &r), 0);
		CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
		PT_CHECK_OK(pt_api_response_job(&r, 0, ji));
		if (ji->state >= PT_JOB_SUCCEEDED || now_s() - t0 > timeout_s)
			return ji->state;
		usleep(100000);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* --------------------------------------------------- pipelining client -- */

typedef struct pipeliner {
	int port;
	atomic_bool stop;
	atomic_long sent, reconnects;
	pthread_t thread;
} pipeliner;

/* send_frame writes a whole frame, waiting out send timeouts until stop;
 * false when the connection failed or stop was set. */
static bool send_frame(int fd, const uint8_t *p, size_t n, atomic_bool *stop)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (atomic_load(stop))
				return false;
			continue;
		}
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* pipeliner_main sends ListJobs back to back on one connection and never
 * reads; when the server drops it, it connects again. */
static void *pipeliner_main(void *arg)
{
	pipeliner *p = arg;
	pt_fb_builder b;
	pt_api_request q;
	const uint8_t *d;
	size_t n;
	uint32_t id = 1;

	uint8_t frame[512];

	pt_fb_builder_init(&b, 0);
	pt_api_request_init(&q, PT_API_LIST_JOBS);
	q.id = 7;
	if (pt_api_build_request(&b, &q, &d, &n) != PT_OK || n + 12 > sizeof(frame))
		return NULL;
	for (int i = 0; i < 8; i++)
		frame[i] = (uint8_t)((uint64_t)(n + 4) >> (56 - 8 * i));
	memcpy(frame + 12, d, n);
	while (!atomic_load(&p->stop)) {
		int fd = raw_connect(p->port, 4096);
		if (fd < 0) {
			usleep(10000);
			continue;
		}
		/* Sends block once the server's replies fill both buffers. */
		{
			struct timeval tv = {0, 200000};
			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		}
		while (!atomic_load(&p->stop)) {
			uint32_t rid = id++ | 0x80000000u;
			frame[8] = (uint8_t)(rid >> 24);
			frame[9] = (uint8_t)(rid >> 16);
			frame[10] = (uint8_t)(rid >> 8);
			frame[11] = (uint8_t)rid;
			if (!send_frame(fd, frame, n + 12, &p->stop))
				break;
			atomic_fetch_add(&p->sent, 1);
		}
		close(fd);
		atomic_fetch_add(&p->reconnects, 1);
	}
	pt_fb_builder_fini(&b);
	return NULL;
}

/* ----------------------------------------------------------- the tests -- */

#define N_IDLE 2000
#define N_INFO 300

/* Defects 4 and 5 at once: 2,000 idle connections and a non-reading
 * pipelining client; ServerInfo of another client stays under 100 ms p99 and
 * a running job finishes. */
static void test_conns_flood(void)
{
	const char *extra[] = {"--max-outstanding", "16", NULL};
	server s;
	client c;
	pt_api_response r;
	pt_api_job_info ji;
	pipeliner pl;
	int *fds;
	int n_open = 0, fails = 0;
	int64_t running_at_start = -1;
	double lat[N_INFO], t0;
	uint64_t id;

	if (!raise_own_nofile(N_IDLE + 512))
		return;
	CU_ASSERT_TRUE_FATAL(server_start(&s, "flood", 0, extra));
	client_open(&c, &s, 10000);
	id = submit_digits(&c, 3000, 1000);
	CU_ASSERT_FATAL(id > 0);

	fds = malloc(sizeof(int) * N_IDLE);
	for (int i = 0; i < N_IDLE; i++)
		if ((fds[n_open] = raw_connect(s.port, 0)) >= 0)
			n_open++;
	CU_ASSERT_EQUAL(n_open, N_IDLE);

	memset(&pl, 0, sizeof(pl));
	pl.port = s.port;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&pl.thread, NULL, pipeliner_main, &pl), 0);
	usleep(500000); /* the pipeliner's replies back up */

	for (int i = 0; i < N_INFO; i++) {
		double t = now_s();
		int rv = simple(&c, PT_API_SERVER_INFO, 0, &r);
		lat[i] = now_s() - t;
		if (i == 0 && rv == 0)
			running_at_start = r.info.jobs_running;
		if (rv != 0 || r.code != PT_API_OK) {
			fprintf(stderr, "ServerInfo %d: %s\n", i, rv ? nng_strerror(rv) : "not OK");
			lat[i] = 1e9;
			fails++;
			for (int k = i + 1; k < N_INFO; k++)
				lat[k] = 1e9;
			break; /* one 10 s timeout tells enough */
		}
		usleep(5000);
	}
	qsort(lat, N_INFO, sizeof(double), cmp_double);
	printf("\n    ServerInfo with %d idle connections and a pipeliner (%ld sent, %ld "
	       "reconnects): p50 %.2f ms, p99 %.2f ms, max %.2f ms, %d failed\n",
	       n_open, atomic_load(&pl.sent), atomic_load(&pl.reconnects), lat[N_INFO / 2] * 1e3,
	       lat[N_INFO * 99 / 100] * 1e3, lat[N_INFO - 1] * 1e3, fails);
	CU_ASSERT_EQUAL(fails, 0);
	CU_ASSERT(lat[N_INFO * 99 / 100] < 0.100);
	CU_ASSERT_EQUAL(running_at_start, 1); /* the job trained meanwhile */

	t0 = now_s();
	CU_ASSERT_EQUAL(wait_end(&c, id, 120, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT_EQUAL(ji.step, 3000);
	printf("    job finished %.1f s after the ServerInfo calls\n", now_s() - t0);
	atomic_store(&pl.stop, true);
	pthread_join(pl.thread, NULL);
	/* The idle connections are all still open (idle timeout 60 s). */
	{
		int closed = 0;
		for (int i = 0; i < n_open; i++) {
			struct pollfd pfd = {fds[i], POLLIN, 0};
			if (poll(&pfd, 1, 0) == 1)
				closed++;
		}
		CU_ASSERT_EQUAL(closed, 0);
	}
	for (int i = 0; i < n_open; i++)
		close(fds[i]);
	free(fds);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
	CU_ASSERT_TRUE(log_has("flood", "requests over --max-outstanding 16"));
}

/* Defect 4 as reported: RLIMIT_NOFILE 256 and 300 idle connections. New
 * clients are still answered and the job writes every checkpoint. */
static void test_conns_low_nofile(void)
{
	server s;
	client c, late;
	pt_api_response r;
	pt_api_job_info ji;
	int fds[300], n_open = 0;
	uint64_t id;

	if (!raise_own_nofile(1024))
		return;
	CU_ASSERT_TRUE_FATAL(server_start(&s, "nofile", 256, NULL));
	CU_ASSERT_TRUE(log_has("nofile", "API connections at most 96 (RLIMIT_NOFILE 256)"));
	client_open(&c, &s, 10000);
	id = submit_digits(&c, 300, 20);
	CU_ASSERT_FATAL(id > 0);
	for (int i = 0; i < 300; i++) {
		if ((fds[n_open] = raw_connect(s.port, 0)) < 0)
			break; /* without a cap: accept fails, the handshake times out */
		n_open++;
	}
	CU_ASSERT_EQUAL(n_open, 300);
	/* A new client is answered (the oldest idle connections made room). */
	client_open(&late, &s, 5000);
	CU_ASSERT_EQUAL(simple(&late, PT_API_SERVER_INFO, 0, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT_EQUAL(wait_end(&late, id, 120, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT_EQUAL(ji.step, 300);
	CU_ASSERT_EQUAL(simple(&late, PT_API_LIST_CHECKPOINTS, id, &r), 0);
	CU_ASSERT_EQUAL(r.n_checkpoints, 15);
	CU_ASSERT_FALSE(log_has("nofile", "Too many open files"));
	for (int i = 0; i < n_open; i++)
		close(fds[i]);
	client_close(&late);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* --idle-timeout 1: an idle connection is closed within ~1.25 s; one with a
 * parked WatchMetrics is not, and is closed once it has been idle too. */
static void test_conns_idle_timeout(void)
{
	const char *extra[] = {"--idle-timeout", "1", NULL};
	server s;
	client c;
	pt_api_response r;
	pt_api_request q;
	pt_fb_builder b;
	const uint8_t *d;
	size_t n;
	uint8_t *reply, byte;
	size_t len;
	uint64_t running, queued;
	int idle, watcher;
	double t0;

	CU_ASSERT_TRUE_FATAL(server_start(&s, "idle", 0, extra));
	client_open(&c, &s, 10000);
	running = submit_digits(&c, 1000000, 0);
	queued = submit_digits(&c, 10, 0); /* waits behind it: no metrics */

	idle = raw_connect(s.port, 0);
	watcher = raw_connect(s.port, 0);
	CU_ASSERT_FATAL(idle >= 0 && watcher >= 0);
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	pt_api_request_init(&q, PT_API_WATCH_METRICS);
	q.id = 42;
	q.job = queued;
	q.wait_ms = 3000;
	PT_CHECK_OK(pt_api_build_request(&b, &q, &d, &n));
	t0 = now_s();
	CU_ASSERT_TRUE(pt_test_sp_request(watcher, 1, d, n));

	/* The idle one: EOF after 1 s (+ the 250 ms check period). */
	CU_ASSERT_EQUAL(pt_test_read_all(idle, &byte, 1, 5000), 0);
	printf("\n    idle connection closed after %.2f s\n", now_s() - t0);
	CU_ASSERT(now_s() - t0 >= 0.9 && now_s() - t0 < 2.5);
	/* The watcher's reply comes after its 3 s wait. */
	CU_ASSERT_EQUAL(raw_reply(watcher, &reply, &len, 6000), 1);
	CU_ASSERT(now_s() - t0 >= 2.9);
	if (reply) {
		PT_CHECK_OK(pt_api_parse_response(reply, len, &r));
		CU_ASSERT_EQUAL(r.code, PT_API_OK);
		CU_ASSERT_EQUAL(r.id, 42);
		CU_ASSERT_EQUAL(r.n_points, 0);
		free(reply);
	}
	/* Then idle itself: closed about 1 s later. */
	t0 = now_s();
	CU_ASSERT_EQUAL(pt_test_read_all(watcher, &byte, 1, 5000), 0);
	CU_ASSERT(now_s() - t0 >= 0.9 && now_s() - t0 < 2.5);
	close(idle);
	close(watcher);
	pt_fb_builder_fini(&b);

	/* An nng client whose connection was closed while idle dials again. */
	sleep(2);
	CU_ASSERT_EQUAL(simple(&c, PT_API_SERVER_INFO, 0, &r), 0);
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, queued, &r), 0);
	CU_ASSERT_EQUAL(simple(&c, PT_API_CANCEL_JOB, running, &r), 0);
	client_close(&c);
	CU_ASSERT_EQUAL(server_stop(&s, SIGTERM), 0);
}

/* --http beyond loopback without a token: exit 2 naming the flag, before any
 * listener is up or the data directory is touched. */
static void test_conns_http_needs_token(void)
{
	char dir[512], logpath[600], cmd[6000], out[4096] = "";
	FILE *p;
	int st;
	size_t n;
	DIR *d;
	int entries = 0;
	struct dirent *e;

	snprintf(dir, sizeof(dir), "%s/http-token", tmpdir);
	mkdir(dir, 0755);
	snprintf(logpath, sizeof(logpath), "%s/http-token.log", tmpdir);
	snprintf(cmd, sizeof(cmd),
	         "'%s' --listen tcp://127.0.0.1:0 --http 0.0.0.0:0 --data-dir '%s' 2>'%s'",
	         server_bin, dir, logpath);
	p = popen(cmd, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	CU_ASSERT_TRUE(WIFEXITED(st));
	CU_ASSERT_EQUAL(WEXITSTATUS(st), 2);
	CU_ASSERT_STRING_EQUAL(out, ""); /* no "pipeserver listening on" */
	CU_ASSERT_TRUE(log_has("http-token", "pipeserver: --http 0.0.0.0:0 is not a loopback "
	                                     "address: an auth token is required "
	                                     "(--auth-token-file)"));
	d = opendir(dir);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			entries++;
	closedir(d);
	CU_ASSERT_EQUAL(entries, 0); /* no journal, no jobs/: nothing recovered */
}

/* --max-connections beyond what RLIMIT_NOFILE leaves: exit 2. */
static void test_conns_limit_checked(void)
{
	char cmd[6000];
	int st;

	snprintf(cmd, sizeof(cmd),
	         "ulimit -n 256 && '%s' --listen tcp://127.0.0.1:0 --max-connections 200 "
	         "--data-dir '%s/limit' 2>'%s/limit.log' >/dev/null",
	         server_bin, tmpdir, tmpdir);
	st = system(cmd);
	CU_ASSERT_TRUE(WIFEXITED(st));
	CU_ASSERT_EQUAL(WEXITSTATUS(st), 2);
	CU_ASSERT_TRUE(log_has("limit", "--max-connections 200: RLIMIT_NOFILE is 256 and jobs "
	                                "need 160 descriptors: at most 96"));
}

static const pt_test_case conns_tests[] = {
    {"test_conns_http_needs_token", test_conns_http_needs_token},
    {"test_conns_limit_checked", test_conns_limit_checked},
    {"test_conns_idle_timeout", test_conns_idle_timeout},
    {"test_conns_low_nofile", test_conns_low_nofile},
    {"test_conns_flood", test_conns_flood},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"conns", conns_tests},
    {NULL, NULL},
};

int main(void)
{
	if (!pt_test_binary("../server/pipeserver", server_bin, sizeof(server_bin))) {
		printf("pipeserver not found at %s: skipping\n", server_bin);
		return 77;
	}
	signal(SIGPIPE, SIG_IGN);
	if (!pt_test_tmpdir("test_conns", tmpdir, sizeof(tmpdir)))
		return 99;
	return pt_test_tmpdir_done(tmpdir, pt_test_main(suites));
}
