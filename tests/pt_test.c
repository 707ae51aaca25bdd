/* pt_test.c - CUnit runner and failure reporting shared by the tests. */
#include "pt_test.h"

#include "job.h"
#include "safetensors.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <nng/nng.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void pt_test_report(int rv, const char *expr, const char *file, int line)
{
	fprintf(stderr, "%s:%d: %s -> %s (%s): %s\n", file, line, expr, pt_err_name((pt_err)rv),
	        pt_strerror((pt_err)rv), pt_last_error());
}

const char *pt_test_path(const char *rel)
{
	/* A few rotating buffers, so several calls can appear in one expression. */
	static char bufs[8][4096];
	static unsigned next;
	char *buf = bufs[next++ % 8];
	snprintf(buf, sizeof(bufs[0]), "%s/%s", PT_SOURCE_ROOT, rel);
	return buf;
}

static void print_stacks(int pid);

/* The program's watchdog: PT_TEST_TIMEOUT_S (meson's timeout for this
 * program, set in tests/meson.build; four times as long in a sanitizer
 * build, as the Makefile's --timeout-multiplier) less 30 s (a quarter of a
 * limit under 120 s), time for gdb. A program still running then prints the
 * test it is in and its threads' stacks and aborts: a hang is named in the
 * log instead of meson's bare TIMEOUT. */
static double watchdog_s;
static atomic_bool program_done;

static void *watchdog_main(void *arg)
{
	struct timespec t0, t;
	(void)arg;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		sleep(1);
		if (atomic_load(&program_done))
			return NULL;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((double)(t.tv_sec - t0.tv_sec) > watchdog_s)
			break;
	}
	CU_pTest cur = CU_get_current_test();
	fprintf(stderr,
	        "\n    test program hung: still running after %.0f s, in %s; its threads:\n",
	        watchdog_s, cur && cur->pName ? cur->pName : "(no test)");
	print_stacks((int)getpid());
	fflush(NULL);
	abort();
	return NULL;
}

static void watchdog_start(void)
{
	const char *v = getenv("PT_TEST_TIMEOUT_S");
	pthread_t t;
	double s = v ? atof(v) : 0;
	if (s <= 0)
		return;
#if defined(__SANITIZE_ADDRESS__)
	s *= 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
	s *= 4;
#endif
#endif
	watchdog_s = s >= 120 ? s - 30 : s * 0.75;       /* time left for gdb */
	(void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY); /* gdb may read our stacks */
	if (pthread_create(&t, NULL, watchdog_main, NULL) == 0)
		pthread_detach(t);
}

/* run_bounded runs fn(arg) on a thread of its own and waits up to seconds
 * for it; a run still going then is left behind (detached) and false is
 * returned. Where no thread can be made, fn runs here. */
static bool run_bounded(void *(*fn)(void *), void *arg, int seconds)
{
	struct timespec until;
	pthread_t t;

	if (pthread_create(&t, NULL, fn, arg) != 0) {
		fn(arg);
		return true;
	}
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += seconds;
	if (pthread_timedjoin_np(t, NULL, &until) == 0)
		return true;
	pthread_detach(t);
	return false;
}

static void *fini_main(void *arg)
{
	(void)arg;
	nng_fini();
	return NULL;
}

typedef struct closer {
	nng_socket sock;
	struct closer *next; /* abandoned closes, kept reachable */
} closer;

static closer *abandoned;

static void *closer_main(void *arg)
{
	nng_close(((closer *)arg)->sock);
	return NULL;
}

void pt_test_nng_close(uint32_t sock_id)
{
	closer *c = calloc(1, sizeof(*c));

	if (c == NULL) {
		nng_close((nng_socket){.id = sock_id});
		return;
	}
	c->sock.id = sock_id;
	if (run_bounded(closer_main, c, 20)) {
		free(c);
		return;
	}
	fprintf(stderr,
	        "\n    nng_close of socket %u still blocked after 20 s (nng's reaper, "
	        "nanomsg/nng#1543); going on without it\n",
	        sock_id);
	c->next = abandoned; /* the blocked thread still uses c: never freed */
	abandoned = c;
}

/* Whether name contains one of the comma-separated substrings of list. */
static bool name_listed(const char *name, const char *list)
{
	char buf[1024], *save = NULL;
	snprintf(buf, sizeof(buf), "%s", list);
	for (char *w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save))
		if (*w && strstr(name, w) != NULL)
			return true;
	return false;
}

int pt_test_main(const pt_test_suite *suites)
{
	const char *only = getenv("PT_TEST_ONLY"), *skip = getenv("PT_TEST_SKIP");
	unsigned failed;
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 99;
	for (const pt_test_suite *s = suites; s->name; s++) {
		CU_pSuite suite = CU_add_suite(s->name, NULL, NULL);
		if (suite == NULL)
			return 99;
		for (const pt_test_case *t = s->tests; t->name; t++) {
			if ((only && !name_listed(t->name, only)) ||
			    (skip && name_listed(t->name, skip)))
				continue;
			if (CU_add_test(suite, t->name, t->fn) == NULL)
				return 99;
		}
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	watchdog_start();
	CU_basic_run_tests();
	failed = CU_get_number_of_tests_failed() + CU_get_number_of_suites_failed() +
	         CU_get_number_of_failures();
	CU_cleanup_registry();
	/* nng frees a closed socket's pipes and dialers on its reaper thread;
	 * exiting before that finishes makes LeakSanitizer report them (seen
	 * once in test_server, a client dropped for an oversized request and
	 * closed just before). nng_fini waits for it; every test is done and
	 * no thread of ours uses nng any more. Bounded: nng 1.5.2's reaper can
	 * wait for ever on a pipe closed while a reply was blocked (the same bug
	 * server/main.c's exit_watchdog bounds), and then the program exits
	 * without LeakSanitizer's check rather than hang. */
	if (!run_bounded(fini_main, NULL, 30)) {
		fprintf(stderr, "nng_fini did not return in 30 s (nng's reaper); exiting without "
		                "the leak check\n");
		fflush(NULL);
		_exit(failed ? 1 : 0);
	}
	atomic_store(&program_done, true);
	return failed ? 1 : 0;
}

void pt_test_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(fwrite(data, 1, len, f), len);
	fclose(f);
}

bool pt_test_binary(const char *rel, char *out, size_t cap)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;
	if (n <= 0)
		return false;
	self[n] = '\0';
	if ((slash = strrchr(self, '/')) != NULL)
		*slash = '\0';
	snprintf(out, cap, "%s/%s", self, rel);
	return access(out, X_OK) == 0;
}

bool pt_test_tmpdir(const char *name, char *dir, size_t cap)
{
	snprintf(dir, cap, "/tmp/%s.XXXXXX", name);
	return mkdtemp(dir) != NULL;
}

/* print_stacks prints one line per thread of pid, its name and its frames'
 * functions, from gdb (when installed; else the threads' names and kernel
 * wait channels): short enough for the tail of a CI log. gdb writes to a
 * file, not a pipe: pid may be this process, stopped while gdb prints. */
static void print_stacks(int pid)
{
	char cmd[512], line[1024], out[2048] = "", path[64];
	FILE *f = NULL;
	int fd;

	snprintf(path, sizeof(path), "/tmp/pt-stacks.XXXXXX");
	if ((fd = mkstemp(path)) >= 0) {
		close(fd);
		snprintf(cmd, sizeof(cmd),
		         "command -v gdb >/dev/null && timeout 60 gdb -p %d -batch -nx "
		         "-ex 'thread apply all bt 30' >%s 2>/dev/null",
		         pid, path);
		if (system(cmd) == 0)
			f = fopen(path, "r");
		unlink(path);
	}
	if (f == NULL) {
		snprintf(cmd, sizeof(cmd),
		         "grep -H . /proc/%d/task/*/comm /proc/%d/task/*/wchan >&2", pid, pid);
		if (system(cmd) != 0)
			fprintf(stderr, "    (no stacks)\n");
		return;
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		char a[256], b[256], c[256];
		size_t n = strlen(out);
		if (strncmp(line, "Thread ", 7) == 0) {
			const char *q = strchr(line, '"');
			if (n > 0)
				fprintf(stderr, "%s\n", out);
			snprintf(out, sizeof(out),
			         "    %.*s:", q ? (int)strcspn(q + 1, "\"") + 2 : 0, q ? q : "");
		} else if (line[0] == '#' && sscanf(line, "%*s %255s %255s %255s", a, b, c) >= 1 &&
		           n + 2 < sizeof(out)) {
			/* "#k  0xADDR in fn (...)" or "#k  fn (...) at file:line" */
			snprintf(out + n, sizeof(out) - n, " %s", strcmp(b, "in") == 0 ? c : a);
		}
	}
	if (out[0])
		fprintf(stderr, "%s\n", out);
	fclose(f);
}

void pt_test_child_dies_with(int parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
}

int pt_test_wait_exit(int pid, double timeout_s, const char *log)
{
	struct timespec t0, t;
	char cmd[PATH_MAX + 200];
	int st = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return st;
		if (r < 0 && errno != EINTR)
			return -1;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 >
		    timeout_s)
			break;
		usleep(20000);
	}
	fprintf(stderr,
	        "\n    process %d did not stop in %.0f s; its threads (innermost frame first):\n",
	        pid, timeout_s);
	print_stacks(pid);
	if (log != NULL) {
		snprintf(
		    cmd, sizeof(cmd),
		    "echo '    last lines of %s:' >&2; tail -n 20 '%s' | sed 's/^/    | /' >&2",
		    log, log);
		if (system(cmd) != 0)
			fprintf(stderr, "    (no log)\n");
	}
	kill(pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return -1;
}

int pt_test_tmpdir_done(const char *dir, int rc)
{
	char cmd[PATH_MAX + 16];
	if (rc == 0 && getenv("PT_KEEP_TMP") == NULL) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", dir);
	} else {
		fprintf(stderr, "test files kept in %s\n", dir);
	}
	return rc;
}

void pt_test_digits_spec(struct pt_job_spec *spec)
{
	void *buf;
	size_t len;

	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path("examples/digits.json"), &buf, &len));
	memset(spec, 0, sizeof(*spec));
	PT_CHECK_OK(pt_job_spec_decode(buf, len, spec));
	free(buf);
}

bool pt_test_same_tensors(const char *a, const char *b)
{
	pt_safetensors *x, *y;
	bool same = true;
	PT_CHECK_OK(pt_safetensors_open(&x, a));
	PT_CHECK_OK(pt_safetensors_open(&y, b));
	same = pt_safetensors_count(x) == pt_safetensors_count(y);
	for (size_t i = 0; same && i < pt_safetensors_count(x); i++) {
		pt_tensor tx, ty;
		const char *name = pt_safetensors_name(x, i);
		PT_CHECK_OK(pt_safetensors_get(x, name, &tx));
		if (pt_safetensors_get(y, name, &ty) != PT_OK) {
			same = false;
		} else {
			same = pt_tensor_nbytes(&tx) == pt_tensor_nbytes(&ty) &&
			       memcmp(pt_tensor_data(&tx), pt_tensor_data(&ty),
			              pt_tensor_nbytes(&tx)) == 0;
			pt_tensor_fini(&ty);
		}
		pt_tensor_fini(&tx);
	}
	pt_safetensors_destroy(x);
	pt_safetensors_destroy(y);
	return same;
}

/* same_state_split compares two .state files of runs with different stage
 * counts: each stage's state is its parameter arena then c optimizer copies
 * of its size (c from the weights file a_w), and the stages' arenas
 * concatenated are the full model's, so the concatenations of every
 * stage's k-th part must be equal, bitwise, for k = 0..c. */
bool pt_test_same_state_split(const char *a_w, const char *a, const char *b)
{
	pt_safetensors *w, *f[2];
	int64_t nparams = 0;
	float *cat[2] = {NULL, NULL};
	int64_t total[2] = {0, 0}, copies;
	bool same = true;

	PT_CHECK_OK(pt_safetensors_open(&w, a_w));
	for (size_t i = 0; i < pt_safetensors_count(w); i++) {
		pt_tensor t;
		PT_CHECK_OK(pt_safetensors_get(w, pt_safetensors_name(w, i), &t));
		nparams += pt_tensor_numel(&t);
		pt_tensor_fini(&t);
	}
	pt_safetensors_destroy(w);
	PT_CHECK_OK(pt_safetensors_open(&f[0], a));
	PT_CHECK_OK(pt_safetensors_open(&f[1], b));
	for (int k = 0; k < 2; k++) {
		int64_t at[8] = {0};
		size_t n = pt_safetensors_count(f[k]);
		/* First the total, then each stage's parts to their places. */
		for (size_t i = 0; i < n; i++) {
			pt_tensor t;
			PT_CHECK_OK(pt_safetensors_get(f[k], pt_safetensors_name(f[k], i), &t));
			total[k] += pt_tensor_numel(&t);
			pt_tensor_fini(&t);
		}
		/* The stages' arenas pad their tensors (the weights file does not). */
		copies = total[k] / nparams;
		CU_ASSERT_FATAL(copies >= 1 && copies <= 8 && total[k] % copies == 0);
		cat[k] = malloc(sizeof(float) * (size_t)total[k]);
		for (int64_t c = 0; c < copies; c++)
			at[c] = c * (total[k] / copies);
		for (size_t i = 0; i < n; i++) {
			char name[32];
			pt_tensor t;
			snprintf(name, sizeof(name), "stage%zu.state", i);
			PT_CHECK_OK(pt_safetensors_get(f[k], name, &t));
			int64_t part = pt_tensor_numel(&t) / copies;
			for (int64_t c = 0; c < copies; c++) {
				memcpy(cat[k] + at[c], (const float *)pt_tensor_data(&t) + c * part,
				       sizeof(float) * (size_t)part);
				at[c] += part;
			}
			pt_tensor_fini(&t);
		}
	}
	same =
	    total[0] == total[1] && memcmp(cat[0], cat[1], sizeof(float) * (size_t)total[0]) == 0;
	free(cat[0]);
	free(cat[1]);
	pt_safetensors_destroy(f[0]);
	pt_safetensors_destroy(f[1]);
	return same;
}

/* ------------------------------------------------------ raw SP over TCP -- */

bool pt_test_write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		c += w;
		n -= (size_t)w;
	}
	return true;
}

int pt_test_read_all(int fd, void *p, size_t n, int timeout_ms)
{
	char *c = p;
	struct timespec ts;
	double end;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_ms / 1000.0;
	while (n > 0) {
		struct pollfd pfd = {fd, POLLIN, 0};
		int left;
		ssize_t r;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		left = (int)((end - (double)ts.tv_sec - ts.tv_nsec * 1e-9) * 1000);
		if (left <= 0 || poll(&pfd, 1, left) == 0)
			return -2;
		r = recv(fd, c, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0)
			return 0;
		if (r < 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 1;
}

int pt_test_sp_connect(int port, int rcvbuf, unsigned proto, unsigned peer)
{
	return pt_test_sp_connect_from(NULL, port, rcvbuf, proto, peer);
}

int pt_test_tcp_connect(const char *src, int port, int rcvbuf)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct sockaddr_in b = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (rcvbuf > 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((src != NULL && (inet_pton(AF_INET, src, &b.sin_addr) != 1 ||
	                     bind(fd, (struct sockaddr *)&b, sizeof(b)) != 0)) ||
	    connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

int pt_test_sp_connect_from(const char *src, int port, int rcvbuf, unsigned proto, unsigned peer)
{
	const uint8_t hdr[8] = {0, 'S', 'P', 0, (uint8_t)(proto >> 8), (uint8_t)proto, 0, 0};
	const uint8_t want[6] = {0, 'S', 'P', 0, (uint8_t)(peer >> 8), (uint8_t)peer};
	uint8_t got[8];
	int fd = pt_test_tcp_connect(src, port, rcvbuf);

	if (fd < 0)
		return -1;
	if (!pt_test_write_all(fd, hdr, 8) || pt_test_read_all(fd, got, 8, 10000) != 1 ||
	    memcmp(got, want, 6) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

bool pt_test_sp_request(int fd, uint32_t id, const uint8_t *body, size_t len)
{
	uint8_t h[12];
	uint64_t total = len + 4;

	for (int i = 0; i < 8; i++)
		h[i] = (uint8_t)(total >> (56 - 8 * i));
	id |= 0x80000000u;
	h[8] = (uint8_t)(id >> 24);
	h[9] = (uint8_t)(id >> 16);
	h[10] = (uint8_t)(id >> 8);
	h[11] = (uint8_t)id;
	return pt_test_write_all(fd, h, 12) && pt_test_write_all(fd, body, len);
}
