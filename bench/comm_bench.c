/* comm_bench.c - nng communicator throughput against a plain TCP socket.
 *
 * Two ranks in one process over tcp://127.0.0.1 loopback: a sender thread
 * sends tensors of 1, 4 and 64 MiB to rank 1, the main thread receives them
 * (each a fresh tensor, freed at once). The baseline, measured in the same
 * run, is a plain AF_INET loopback connection: the sender writes an 8-byte
 * length and the same bytes with blocking send(), the receiver reads the
 * length and the bytes into one reused buffer with blocking recv() - no
 * copies beyond the kernel's. Each measurement runs for at least MIN_SECONDS;
 * the best of 3 counts. The nng ranks authenticate every frame (the default);
 * at 4 MiB a second pair with authentication off runs too, interleaved with
 * the first so that both see the same noise: AUTH_ROUNDS rounds of one run
 * each (AUTH_SECONDS), back to back; the cost is one minus the median of the
 * rounds' ratios (a burst of load spoils one round, not the figure), and
 * GB/s is the best round of each.
 * Prints `bench <name> <value>` lines:
 *   bench nng_tcp_ratio_<size> <nng GB/s / plain GB/s>
 *   bench nng_tcp_gbps_<size> <GB/s>, bench plain_tcp_gbps_<size> <GB/s>
 *   bench nng_tcp_ratio_4mib_noauth, bench nng_tcp_gbps_4mib_noauth
 *   bench nng_auth_cost <1 - median over rounds of GB/s with authentication /
 *     GB/s without>
 *   bench nng_auth_cpu_cost <CPU seconds (all threads, user + system) per
 *     byte with authentication / without, - 1>: what the MAC adds to the
 *     process's work; unlike GB/s it hardly depends on other load.
 * and at 4 MiB two floors of the library itself, best of 3 each, over the
 * best of the plain socket measured just before and just after them (where
 * the gap comes from):
 *   bench nng_msg_floor_ratio_4mib  bare nng PUSH/PULL messages: the sender
 *     allocates each message (nng_msg_alloc zeroes it) and fills nothing,
 *     the receiver frees it; no copy, no frame, no MAC of ours
 *   bench nng_stream_ratio_4mib  nng's byte-stream API (nng_stream over
 *     tcp://, aio with iovs in the caller's buffers): length and bytes from
 *     and into reused buffers, as the plain socket does
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>

#include "comm.h"

#define MIN_SECONDS  1.0
#define TRIES        3
#define AUTH_ROUNDS  15
#define AUTH_SECONDS 0.4

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	fprintf(stderr, "comm_bench: %s: %s\n", what, pt_last_error());
	exit(1);
}

/* ------------------------------------------------------------------ nng -- */

typedef struct nng_job {
	pt_comm *tx;
	const pt_tensor *t;
	int count;
	pt_err rv;
} nng_job;

static void *nng_sender(void *p)
{
	nng_job *j = p;
	for (int i = 0; i < j->count && j->rv == PT_OK; i++)
		j->rv = pt_comm_send_forward(j->tx, 1, j->t, i, 0);
	return NULL;
}

/* nng_run sends count tensors and returns the seconds until the last arrived. */
static double nng_run(pt_comm *tx, pt_comm *rx, const pt_tensor *t, int count)
{
	nng_job j = {tx, t, count, PT_OK};
	pthread_t th;
	double t0 = now_s();

	pthread_create(&th, NULL, nng_sender, &j);
	for (int i = 0; i < count; i++) {
		pt_msg m;
		if (pt_comm_recv_forward(rx, 0, 30000, &m) != PT_OK)
			die("nng receive");
		pt_msg_fini(&m);
	}
	pthread_join(th, NULL);
	if (j.rv != PT_OK)
		die("nng send");
	return now_s() - t0;
}

/* ---------------------------------------------------------------- plain -- */

typedef struct plain_job {
	int fd;
	const void *data;
	size_t bytes;
	int count;
	int failed;
} plain_job;

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = send(fd, c, n, 0);
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *c = p;
	while (n > 0) {
		ssize_t r = recv(fd, c, n, 0);
		if (r <= 0)
			return -1;
		c += r;
		n -= (size_t)r;
	}
	return 0;
}

static void *plain_sender(void *p)
{
	plain_job *j = p;
	for (int i = 0; i < j->count; i++) {
		uint64_t len = j->bytes;
		if (write_all(j->fd, &len, sizeof(len)) || write_all(j->fd, j->data, j->bytes)) {
			j->failed = 1;
			break;
		}
	}
	return NULL;
}

static void plain_connect(int *tx, int *rx)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
	    getsockname(l, (struct sockaddr *)&a, &len))
		die("plain listen");
	*tx = socket(AF_INET, SOCK_STREAM, 0);
	if (*tx < 0 || connect(*tx, (struct sockaddr *)&a, sizeof(a)))
		die("plain connect");
	if ((*rx = accept(l, NULL, NULL)) < 0)
		die("plain accept");
	close(l);
}

static double plain_run(int tx, int rx, const void *data, void *buf, size_t bytes, int count)
{
	plain_job j = {tx, data, bytes, count, 0};
	pthread_t th;
	double t0 = now_s();

	pthread_create(&th, NULL, plain_sender, &j);
	for (int i = 0; i < count; i++) {
		uint64_t len;
		if (read_all(rx, &len, sizeof(len)) || len != bytes || read_all(rx, buf, bytes))
			die("plain receive");
	}
	pthread_join(th, NULL);
	if (j.failed)
		die("plain send");
	return now_s() - t0;
}

/* ----------------------------------------------------- library floors -- */

typedef struct floor_ctx {
	nng_socket push, pull; /* bare messages */
	nng_stream *stx, *srx; /* byte stream */
	nng_stream_listener *sl;
	nng_stream_dialer *sd;
	void *send_buf, *recv_buf;
	size_t bytes;
} floor_ctx;

static void nng_die(const char *what, int rv)
{
	fprintf(stderr, "comm_bench: %s: %s\n", what, nng_strerror(rv));
	exit(1);
}

typedef struct bare_job {
	floor_ctx *f;
	int count;
} bare_job;

static void *bare_sender(void *p)
{
	bare_job *j = p;
	for (int i = 0; i < j->count; i++) {
		nng_msg *m;
		int rv;
		if ((rv = nng_msg_alloc(&m, j->f->bytes)) != 0 ||
		    (rv = nng_sendmsg(j->f->push, m, 0)) != 0)
			nng_die("bare send", rv);
	}
	return NULL;
}

static double run_bare(void *p, int count)
{
	floor_ctx *f = p;
	bare_job j = {f, count};
	pthread_t th;
	double t0 = now_s();
	pthread_create(&th, NULL, bare_sender, &j);
	for (int i = 0; i < count; i++) {
		nng_msg *m;
		int rv;
		if ((rv = nng_recvmsg(f->pull, &m, 0)) != 0)
			nng_die("bare receive", rv);
		nng_msg_free(m);
	}
	pthread_join(th, NULL);
	return now_s() - t0;
}

/* stream_all moves n bytes at p over s (send or receive), aio by aio. */
static void stream_all(nng_stream *s, nng_aio *a, void *p, size_t n, bool send)
{
	char *c = p;
	while (n > 0) {
		nng_iov iov = {c, n};
		int rv;
		nng_aio_set_iov(a, 1, &iov);
		if (send)
			nng_stream_send(s, a);
		else
			nng_stream_recv(s, a);
		nng_aio_wait(a);
		if ((rv = nng_aio_result(a)) != 0)
			nng_die(send ? "stream send" : "stream receive", rv);
		c += nng_aio_count(a);
		n -= nng_aio_count(a);
	}
}

static void *stream_sender(void *p)
{
	bare_job *j = p;
	nng_aio *a;
	if (nng_aio_alloc(&a, NULL, NULL) != 0)
		nng_die("aio", NNG_ENOMEM);
	for (int i = 0; i < j->count; i++) {
		uint64_t len = j->f->bytes;
		stream_all(j->f->stx, a, &len, sizeof(len), true);
		stream_all(j->f->stx, a, j->f->send_buf, j->f->bytes, true);
	}
	nng_aio_free(a);
	return NULL;
}

static double run_stream(void *p, int count)
{
	floor_ctx *f = p;
	bare_job j = {f, count};
	pthread_t th;
	nng_aio *a;
	double t0 = now_s();
	if (nng_aio_alloc(&a, NULL, NULL) != 0)
		nng_die("aio", NNG_ENOMEM);
	pthread_create(&th, NULL, stream_sender, &j);
	for (int i = 0; i < count; i++) {
		uint64_t len;
		stream_all(f->srx, a, &len, sizeof(len), false);
		if (len != f->bytes)
			nng_die("stream framing", NNG_EPROTO);
		stream_all(f->srx, a, f->recv_buf, f->bytes, false);
	}
	pthread_join(th, NULL);
	nng_aio_free(a);
	return now_s() - t0;
}

/* floors_up connects the bare sockets and the stream pair on loopback. */
static void floors_up(floor_ctx *f)
{
	nng_listener l;
	nng_aio *acc, *dial;
	char url[64];
	nng_sockaddr sa;
	int rv, port;

	if ((rv = nng_pull0_open(&f->pull)) != 0 || (rv = nng_push0_open(&f->push)) != 0 ||
	    (rv = nng_socket_set_size(f->pull, NNG_OPT_RECVMAXSZ, 0)) != 0 ||
	    (rv = nng_listen(f->pull, "tcp://127.0.0.1:0", &l, 0)) != 0 ||
	    (rv = nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa)) != 0)
		nng_die("bare sockets", rv);
	port = ntohs(sa.s_in.sa_port);
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	if ((rv = nng_dial(f->push, url, NULL, 0)) != 0)
		nng_die("bare dial", rv);
	if ((rv = nng_stream_listener_alloc(&f->sl, "tcp://127.0.0.1:0")) != 0 ||
	    (rv = nng_stream_listener_listen(f->sl)) != 0 ||
	    (rv = nng_stream_listener_get_int(f->sl, NNG_OPT_TCP_BOUND_PORT, &port)) != 0)
		nng_die("stream listener", rv);
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	if ((rv = nng_stream_dialer_alloc(&f->sd, url)) != 0 ||
	    (rv = nng_aio_alloc(&acc, NULL, NULL)) != 0 ||
	    (rv = nng_aio_alloc(&dial, NULL, NULL)) != 0)
		nng_die("stream dialer", rv);
	nng_stream_listener_accept(f->sl, acc);
	nng_stream_dialer_dial(f->sd, dial);
	nng_aio_wait(acc);
	nng_aio_wait(dial);
	if ((rv = nng_aio_result(acc)) != 0 || (rv = nng_aio_result(dial)) != 0)
		nng_die("stream connect", rv);
	f->srx = nng_aio_get_output(acc, 0);
	f->stx = nng_aio_get_output(dial, 0);
	nng_aio_free(acc);
	nng_aio_free(dial);
}

static void floors_down(floor_ctx *f)
{
	nng_stream_free(f->stx);
	nng_stream_free(f->srx);
	nng_stream_dialer_free(f->sd);
	nng_stream_listener_free(f->sl);
	nng_close(f->push);
	nng_close(f->pull);
}

/* ----------------------------------------------------------------- main -- */

/* best_gbps times run(count) with count grown until one run takes at least
 * MIN_SECONDS, then returns the best GB/s of TRIES runs of that count. */
typedef double (*run_fn)(void *ctx, int count);

static double best_gbps(run_fn run, void *ctx, size_t bytes)
{
	int count = 1;
	double best = 0, s;

	while ((s = run(ctx, count)) < MIN_SECONDS)
		count = s < MIN_SECONDS / 8 ? count * 8 : (int)(count * 1.2 * MIN_SECONDS / s) + 1;
	for (int k = 0; k < TRIES; k++) {
		double g = (double)bytes * count / (k == 0 ? s : run(ctx, count)) / 1e9;
		if (g > best)
			best = g;
	}
	return best;
}

typedef struct ctx {
	pt_comm *tx, *rx;
	pt_comm *tx_noauth, *rx_noauth;
	pt_tensor *t;
	int ptx, prx;
	void *buf;
	size_t bytes;
} ctx;

static double run_nng(void *p, int count)
{
	ctx *c = p;
	return nng_run(c->tx, c->rx, c->t, count);
}

static double cpu_s(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec +
	       u.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* auth_pair measures the authenticated pair against the unauthenticated
 * one, alternating runs of the same count (which one goes first alternates
 * too): best GB/s of each, the median ratio on/off, and the CPU time of all
 * runs of each (*cpu_on, *cpu_off). */
static void auth_pair(ctx *c, size_t bytes, double *on, double *off, double *ratio, double *cpu_on,
                      double *cpu_off)
{
	double r[AUTH_ROUNDS];
	int count = 1;
	double s;

	while ((s = nng_run(c->tx, c->rx, c->t, count)) < AUTH_SECONDS)
		count =
		    s < AUTH_SECONDS / 8 ? count * 8 : (int)(count * 1.2 * AUTH_SECONDS / s) + 1;
	*on = *off = *cpu_on = *cpu_off = 0;
	for (int k = 0; k < AUTH_ROUNDS; k++) {
		double a = 0, b = 0;
		for (int j = 0; j < 2; j++) {
			bool auth = (j == 0) == (k % 2 == 0);
			double c0 = cpu_s();
			double g = (double)bytes * count /
			           (auth ? nng_run(c->tx, c->rx, c->t, count)
			                 : nng_run(c->tx_noauth, c->rx_noauth, c->t, count)) /
			           1e9;
			*(auth ? cpu_on : cpu_off) += cpu_s() - c0;
			*(auth ? &a : &b) = g;
		}
		r[k] = a / b;
		*on = a > *on ? a : *on;
		*off = b > *off ? b : *off;
	}
	qsort(r, AUTH_ROUNDS, sizeof(r[0]), cmp_double);
	*ratio = r[AUTH_ROUNDS / 2];
}

/* make_pair connects two nng ranks on loopback; key NULL: no authentication. */
static void make_pair(pt_comm **tx, pt_comm **rx, const uint8_t *key)
{
	pt_comm *c[2];
	const char *urls[2];
	char u[2][64];

	for (int r = 0; r < 2; r++) {
		pt_nng_options o = {.listen_url = "tcp://127.0.0.1:0",
		                    .world = 2,
		                    .rank = r,
		                    .key = key,
		                    .no_auth = key == NULL};
		if (pt_nng_comm_create(&c[r], &o) != PT_OK)
			die("nng create");
		snprintf(u[r], sizeof(u[r]), "%s", pt_nng_comm_url(c[r]));
		urls[r] = u[r];
	}
	for (int r = 0; r < 2; r++)
		if (pt_nng_comm_connect(c[r], urls) != PT_OK)
			die("nng connect");
	*tx = c[0];
	*rx = c[1];
}

static double run_plain(void *p, int count)
{
	ctx *c = p;
	return plain_run(c->ptx, c->prx, pt_tensor_data(c->t), c->buf, c->bytes, count);
}

int main(void)
{
	const size_t sizes[] = {(size_t)1 << 20, (size_t)4 << 20, (size_t)64 << 20};
	const char *names[] = {"1mib", "4mib", "64mib"};
	uint8_t key[PT_COMM_KEY_BYTES];
	ctx x = {0};

	if (pt_comm_key_generate(key) != PT_OK)
		die("session key");
	make_pair(&x.tx, &x.rx, key);
	make_pair(&x.tx_noauth, &x.rx_noauth, NULL);
	plain_connect(&x.ptx, &x.prx);

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		const char *only = getenv("COMM_BENCH_ONLY"); /* e.g. "4mib" */
		if (only && strcmp(only, names[k]) != 0)
			continue;
		int64_t n = (int64_t)(sizes[k] / 4);
		pt_tensor t;
		if (pt_tensor_init(&t, PT_F32, 1, &n) != PT_OK)
			die("tensor");
		for (int64_t i = 0; i < n; i++)
			pt_tensor_f32(&t)[i] = (float)(i % 1000) * 0.001f;
		x.t = &t;
		x.bytes = sizes[k];
		if ((x.buf = malloc(sizes[k])) == NULL)
			die("buffer");
		double plain = best_gbps(run_plain, &x, sizes[k]);
		double nng, off = 0, ratio = 0, cpu_on = 0, cpu_off = 0;
		if (sizes[k] == (size_t)4 << 20)
			auth_pair(&x, sizes[k], &nng, &off, &ratio, &cpu_on, &cpu_off);
		else
			nng = best_gbps(run_nng, &x, sizes[k]);
		printf("bench nng_tcp_ratio_%s %.2f\n", names[k], nng / plain);
		printf("bench nng_tcp_gbps_%s %.2f\n", names[k], nng);
		printf("bench plain_tcp_gbps_%s %.2f\n", names[k], plain);
		if (sizes[k] == (size_t)4 << 20) {
			floor_ctx f = {
			    .send_buf = pt_tensor_data(&t), .recv_buf = x.buf, .bytes = sizes[k]};
			floors_up(&f);
			/* The plain socket again on either side: this VM's loopback
			 * speed drifts by a third between minutes. */
			double p0 = best_gbps(run_plain, &x, sizes[k]);
			double bare = best_gbps(run_bare, &f, sizes[k]);
			double stream = best_gbps(run_stream, &f, sizes[k]);
			double p1 = best_gbps(run_plain, &x, sizes[k]);
			floors_down(&f);
			p0 = p1 > p0 ? p1 : p0;
			printf("bench nng_msg_floor_ratio_%s %.2f\n", names[k], bare / p0);
			printf("bench nng_stream_ratio_%s %.2f\n", names[k], stream / p0);
		}
		if (off > 0) {
			printf("bench nng_tcp_ratio_%s_noauth %.2f\n", names[k], off / plain);
			printf("bench nng_tcp_gbps_%s_noauth %.2f\n", names[k], off);
			printf("bench nng_auth_cost %.3f\n", 1 - ratio);
			printf("bench nng_auth_cpu_cost %.3f\n", cpu_on / cpu_off - 1);
		}
		fflush(stdout);
		free(x.buf);
		pt_tensor_fini(&t);
	}
	close(x.ptx);
	close(x.prx);
	pt_comm_destroy(x.tx);
	pt_comm_destroy(x.rx);
	pt_comm_destroy(x.tx_noauth);
	pt_comm_destroy(x.rx_noauth);
	return 0;
}
