/* api_server.c - REP socket, context state machines, handler table, worker
 * pool (see api_server.h).
 *
 * A context is in one of: RECV (nng_ctx_recv pending), WORK (queued for or
 * held by a worker), PARK (nng_sleep_aio pending, linked as a job waiter),
 * SEND (nng_ctx_send pending), IDLE (stopped). Its aio callback never blocks:
 * it takes only short-held mutexes and hands anything slow to the workers.
 */
#include "api_server.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>

#include "api/api.h"
#include "fileio.h"
#include "log.h"
#include "metrics.h"
#include "sha256.h"

#define MAX_WAIT_MS 300000
#define DEDUP_SLOTS 64

typedef enum ctx_state { CTX_RECV, CTX_WORK, CTX_PARK, CTX_SEND, CTX_IDLE } ctx_state;

typedef struct srv_ctx srv_ctx;
typedef pt_err (*handler_fn)(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked);

enum { H_INLINE = 0, H_WORKER = 1 };

typedef struct handler {
	pt_api_kind kind;
	handler_fn fn;
	int flags;
	pt_api_code err_code; /* code of any failure that is not the server's own */
} handler;

struct srv_ctx {
	pt_api_server *srv;
	nng_ctx ctx;
	nng_aio *aio;
	ctx_state state;
	nng_msg *req;
	void *copy; /* aligned copy of the body when nng's was not 4-aligned */
	pt_api_request r;
	const handler *h;
	pt_api_code code; /* set by a handler to override the error code */
	pt_fb_builder b;
	pt_jobs_waiter waiter;
	double t0;          /* monotonic seconds when the request arrived (metrics) */
	pthread_mutex_t mu; /* sleeping/woken, between a waker and the callback */
	bool sleeping, woken;
	srv_ctx *next_all, *next_work;
};

typedef struct dedup_entry {
	uint32_t pipe;
	uint8_t hash[PT_SHA256_BYTES];
	uint64_t job;
} dedup_entry;

struct pt_api_server {
	pt_api_server_config cfg;
	nng_socket sock;
	bool sock_open;
	nng_listener listeners[16];
	int n_listeners;
	nng_tls_config *tls;
	atomic_bool closing;  /* new requests get Unavailable */
	atomic_bool stopping; /* contexts go idle */
	atomic_int receiving;
	double started;

	pthread_mutex_t mu; /* contexts list and count */
	srv_ctx *all;
	int n_ctx;

	pthread_mutex_t wmu; /* worker queue */
	pthread_cond_t wcv;
	srv_ctx *whead, *wtail;
	pthread_t *workers;
	int n_workers;
	bool wstop;

	pthread_mutex_t dmu;
	dedup_entry dedup[DEDUP_SLOTS];
	size_t dedup_next;
};

static __thread uint8_t *fetch_buf; /* a worker's checkpoint read buffer */

static double now_mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void ctx_cb(void *arg);
static void start_recv(srv_ctx *c);

/* ------------------------------------------------------------ handlers -- */

static pt_err h_submit(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_server *s = c->srv;
	pt_api_response r;
	uint8_t hash[PT_SHA256_BYTES];
	uint32_t pipe = nng_pipe_id(nng_msg_get_pipe(c->req));
	uint64_t id = 0;
	pt_err rv;

	pt_sha256(nng_msg_body(c->req), nng_msg_len(c->req), hash);
	pthread_mutex_lock(&s->dmu);
	for (size_t i = 0; i < DEDUP_SLOTS && c->r.id != 0; i++)
		if (s->dedup[i].job && s->dedup[i].pipe == pipe &&
		    memcmp(s->dedup[i].hash, hash, sizeof(hash)) == 0)
			id = s->dedup[i].job;
	pthread_mutex_unlock(&s->dmu);
	if (id) {
		pt_info("request %" PRIu64 ": resent SubmitJob, job %" PRIu64, c->r.id, id);
	} else {
		if ((rv = pt_jobs_submit(s->cfg.jobs, c->r.spec_table, &id)) != PT_OK) {
			if (rv == PT_ERR_IO || rv == PT_ERR_NOMEM)
				c->code = PT_API_INTERNAL;
			else if (rv == PT_ERR_CLOSED)
				c->code = PT_API_UNAVAILABLE;
			return rv;
		}
		pthread_mutex_lock(&s->dmu);
		s->dedup[s->dedup_next].pipe = pipe;
		memcpy(s->dedup[s->dedup_next].hash, hash, sizeof(hash));
		s->dedup[s->dedup_next].job = id;
		s->dedup_next = (s->dedup_next + 1) % DEDUP_SLOTS;
		pthread_mutex_unlock(&s->dmu);
	}
	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_SUBMIT_JOB);
	r.job = id;
	return pt_api_build_response(&c->b, &r, data, size);
}

static pt_err h_get(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	return pt_jobs_reply_get(c->srv->cfg.jobs, c->r.id, c->r.job, &c->b, data, size);
}

static pt_err h_list(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	return pt_jobs_reply_list(c->srv->cfg.jobs, c->r.id, &c->b, data, size);
}

static pt_err h_cancel(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_response r;
	pt_api_job_state st;

	PT_TRY(pt_jobs_cancel(c->srv->cfg.jobs, c->r.job, &st));
	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_CANCEL_JOB);
	r.state = st;
	return pt_api_build_response(&c->b, &r, data, size);
}

static pt_err h_watch(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_server *s = c->srv;
	bool may_park;

	if (c->r.wait_ms > MAX_WAIT_MS)
		c->r.wait_ms = MAX_WAIT_MS;
	/* Park only while enough contexts remain (or can be opened) to receive. */
	pthread_mutex_lock(&s->mu);
	may_park = s->n_ctx < s->cfg.max_contexts || atomic_load(&s->receiving) > 1;
	pthread_mutex_unlock(&s->mu);
	return pt_jobs_reply_watch(s->cfg.jobs, &c->r, may_park ? &c->waiter : NULL, &c->b, data,
	                           size, parked);
}

static pt_err h_fetch(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	char path[4200], sha[PT_SHA256_HEX];
	pt_api_response r;
	int64_t step;
	uint64_t total, len;
	size_t fsize;
	int fd;
	pt_err rv;

	PT_TRY(pt_jobs_checkpoint(c->srv->cfg.jobs, c->r.job, c->r.step, path, sizeof(path), &step,
	                          &total, sha));
	if ((rv = pt_file_open_read(path, &fd, &fsize)) != PT_OK) {
		c->code = PT_API_NOT_FOUND;
		return pt_set_error(PT_ERR_NOTFOUND, "checkpoint of step %" PRId64 " was removed",
		                    step);
	}
	if (fsize != total) {
		close(fd);
		c->code = PT_API_INTERNAL;
		return pt_set_error(PT_ERR_STATE, "checkpoint of step %" PRId64 " changed size",
		                    step);
	}
	if (c->r.offset > total) {
		close(fd);
		return pt_set_error(PT_ERR_RANGE,
		                    "offset %" PRIu64 " is past the end (%" PRIu64 " bytes)",
		                    c->r.offset, total);
	}
	len = c->r.length;
	if (len > PT_API_MAX_CHUNK)
		len = PT_API_MAX_CHUNK;
	if (len > total - c->r.offset)
		len = total - c->r.offset;
	if (fetch_buf == NULL && (fetch_buf = malloc(PT_API_MAX_CHUNK)) == NULL) {
		close(fd);
		return pt_set_error(PT_ERR_NOMEM, "fetch buffer");
	}
	rv = len ? pt_read_full(fd, fetch_buf, len, c->r.offset, path) : PT_OK;
	close(fd);
	if (rv != PT_OK) {
		c->code = PT_API_INTERNAL;
		return rv;
	}
	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_FETCH_CHECKPOINT);
	r.step = step;
	r.total_size = total;
	r.offset = c->r.offset;
	r.data = fetch_buf;
	r.data_len = len;
	r.sha256 = sha;
	return pt_api_build_response(&c->b, &r, data, size);
}

static pt_err h_list_ckpts(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	return pt_jobs_reply_checkpoints(c->srv->cfg.jobs, c->r.id, c->r.job, &c->b, data, size);
}

static pt_err h_info(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_server *s = c->srv;
	pt_api_response r;

	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_SERVER_INFO);
	r.info.version = s->cfg.version;
	r.info.protocol = PT_API_PROTOCOL;
	r.info.device = s->cfg.device;
	pt_jobs_counts(s->cfg.jobs, &r.info.jobs_queued, &r.info.jobs_running);
	r.info.uptime_seconds = now_mono() - s->started;
	return pt_api_build_response(&c->b, &r, data, size);
}

/* The handler table, indexed by pt_api_kind. */
static const handler handlers[PT_API_KIND_COUNT] = {
    [PT_API_SUBMIT_JOB] = {PT_API_SUBMIT_JOB, h_submit, H_WORKER, PT_API_INVALID_JOB},
    [PT_API_GET_JOB] = {PT_API_GET_JOB, h_get, H_INLINE, PT_API_NOT_FOUND},
    [PT_API_LIST_JOBS] = {PT_API_LIST_JOBS, h_list, H_INLINE, PT_API_INTERNAL},
    [PT_API_CANCEL_JOB] = {PT_API_CANCEL_JOB, h_cancel, H_WORKER, PT_API_BAD_REQUEST},
    [PT_API_WATCH_METRICS] = {PT_API_WATCH_METRICS, h_watch, H_INLINE, PT_API_NOT_FOUND},
    [PT_API_FETCH_CHECKPOINT] = {PT_API_FETCH_CHECKPOINT, h_fetch, H_WORKER, PT_API_BAD_REQUEST},
    [PT_API_LIST_CHECKPOINTS] = {PT_API_LIST_CHECKPOINTS, h_list_ckpts, H_INLINE, PT_API_NOT_FOUND},
    [PT_API_SERVER_INFO] = {PT_API_SERVER_INFO, h_info, H_INLINE, PT_API_INTERNAL},
};
_Static_assert(PT_API_KIND_COUNT == 9, "a handler for every request kind");

/* ------------------------------------------------------------- replies -- */

/* send_bytes replies with data (copied into a new message) and moves c to SEND. */
static void send_bytes(srv_ctx *c, const uint8_t *data, size_t size)
{
	nng_msg *msg;
	int rv;

	if (c->req) {
		nng_msg_free(c->req);
		c->req = NULL;
	}
	free(c->copy);
	c->copy = NULL;
	if ((rv = nng_msg_alloc(&msg, size)) != 0) {
		pt_error("reply of %zu bytes: %s", size, nng_strerror(rv));
		start_recv(c);
		return;
	}
	memcpy(nng_msg_body(msg), data, size);
	c->state = CTX_SEND;
	nng_aio_set_msg(c->aio, msg);
	nng_ctx_send(c->ctx, c->aio);
}

static void send_error(srv_ctx *c, uint64_t id, pt_api_code code, const char *msg)
{
	const uint8_t *data;
	size_t size;

	pt_debug("request %" PRIu64 ": %s: %s", id, pt_api_code_name(code), msg);
	pt_metrics_request(c->r.kind, code, now_mono() - c->t0);
	if (pt_api_build_error(&c->b, id, code, &data, &size, "%s", msg) != PT_OK) {
		pt_error("building an error reply: %s", pt_last_error());
		if (c->req) {
			nng_msg_free(c->req);
			c->req = NULL;
		}
		start_recv(c);
		return;
	}
	send_bytes(c, data, size);
}

/* finish replies with a handler's result. */
static void finish(srv_ctx *c, pt_err rv, const uint8_t *data, size_t size)
{
	if (rv == PT_OK) {
		pt_metrics_request(c->r.kind, PT_API_OK, now_mono() - c->t0);
		send_bytes(c, data, size);
		return;
	}
	{
		pt_api_code code = c->code != PT_API_OK    ? c->code
		                   : rv == PT_ERR_NOMEM    ? PT_API_INTERNAL
		                   : rv == PT_ERR_NOTFOUND ? PT_API_NOT_FOUND
		                   : rv == PT_ERR_STATE    ? PT_API_CONFLICT
		                   : rv == PT_ERR_CLOSED   ? PT_API_UNAVAILABLE
		                                           : c->h->err_code;
		char msg[1200];
		snprintf(msg, sizeof(msg), "%s",
		         pt_last_error()[0] ? pt_last_error() : pt_strerror(rv));
		send_error(c, c->r.id, code, msg);
	}
}

/* --------------------------------------------------------- worker pool -- */

static void *worker_main(void *arg)
{
	pt_api_server *s = arg;

	for (;;) {
		srv_ctx *c;
		const uint8_t *data = NULL;
		size_t size = 0;
		bool parked = false;
		pt_err rv;

		pthread_mutex_lock(&s->wmu);
		while (s->whead == NULL && !s->wstop)
			pthread_cond_wait(&s->wcv, &s->wmu);
		if (s->whead == NULL) {
			pthread_mutex_unlock(&s->wmu);
			break;
		}
		c = s->whead;
		s->whead = c->next_work;
		if (s->whead == NULL)
			s->wtail = NULL;
		pthread_mutex_unlock(&s->wmu);

		pt_clear_error();
		rv = c->h->fn(c, &data, &size, &parked);
		finish(c, rv, data, size);
	}
	free(fetch_buf);
	fetch_buf = NULL;
	return NULL;
}

static void enqueue_work(srv_ctx *c)
{
	pt_api_server *s = c->srv;

	c->state = CTX_WORK;
	c->next_work = NULL;
	pthread_mutex_lock(&s->wmu);
	if (s->wtail)
		s->wtail->next_work = c;
	else
		s->whead = c;
	s->wtail = c;
	pthread_cond_signal(&s->wcv);
	pthread_mutex_unlock(&s->wmu);
}

/* ------------------------------------------------------------ contexts -- */

static void waiter_wake(pt_jobs_waiter *w)
{
	srv_ctx *c = (srv_ctx *)((char *)w - offsetof(srv_ctx, waiter));

	pthread_mutex_lock(&c->mu);
	c->woken = true;
	if (c->sleeping)
		nng_aio_cancel(c->aio);
	pthread_mutex_unlock(&c->mu);
}

static pt_err ctx_new(pt_api_server *s, srv_ctx **out)
{
	srv_ctx *c = calloc(1, sizeof(*c));
	int rv;

	*out = NULL;
	if (c == NULL)
		return pt_set_error(PT_ERR_NOMEM, "context");
	c->srv = s;
	c->state = CTX_IDLE;
	c->waiter.wake = waiter_wake;
	pthread_mutex_init(&c->mu, NULL);
	if (pt_fb_builder_init(&c->b, 4096) != PT_OK) {
		pthread_mutex_destroy(&c->mu);
		free(c);
		return PT_ERR_NOMEM;
	}
	if ((rv = nng_aio_alloc(&c->aio, ctx_cb, c)) != 0 ||
	    (rv = nng_ctx_open(&c->ctx, s->sock)) != 0) {
		if (c->aio)
			nng_aio_free(c->aio);
		pt_fb_builder_fini(&c->b);
		pthread_mutex_destroy(&c->mu);
		free(c);
		return pt_set_error(PT_ERR_BACKEND, "nng context: %s", nng_strerror(rv));
	}
	pthread_mutex_lock(&s->mu);
	if (atomic_load(&s->stopping)) {
		/* destroy has taken the list: this one never starts. */
		pthread_mutex_unlock(&s->mu);
		nng_ctx_close(c->ctx);
		nng_aio_free(c->aio);
		pt_fb_builder_fini(&c->b);
		pthread_mutex_destroy(&c->mu);
		free(c);
		return pt_set_error(PT_ERR_CLOSED, "server is stopping");
	}
	c->next_all = s->all;
	s->all = c;
	s->n_ctx++;
	pthread_mutex_unlock(&s->mu);
	*out = c;
	return PT_OK;
}

/* keep_receiving opens a new context when too few are receiving. */
static void keep_receiving(pt_api_server *s)
{
	srv_ctx *c;
	bool grow;

	pthread_mutex_lock(&s->mu);
	grow = atomic_load(&s->receiving) < s->cfg.contexts && s->n_ctx < s->cfg.max_contexts &&
	       !atomic_load(&s->stopping);
	pthread_mutex_unlock(&s->mu);
	if (grow && ctx_new(s, &c) == PT_OK)
		start_recv(c);
}

static void start_recv(srv_ctx *c)
{
	if (atomic_load(&c->srv->stopping)) {
		c->state = CTX_IDLE;
		return;
	}
	c->state = CTX_RECV;
	atomic_fetch_add(&c->srv->receiving, 1);
	nng_ctx_recv(c->ctx, c->aio);
}

/* ct_equal compares a presented token with the expected one in time that
 * depends only on the expected token's length. */
static bool ct_equal(const char *got, const char *want)
{
	size_t lg = strlen(got), lw = strlen(want);
	unsigned char d = (unsigned char)(lg != lw);

	for (size_t i = 0; i < lw; i++)
		d |= (unsigned char)((i < lg ? (unsigned char)got[i] : 0) ^ (unsigned char)want[i]);
	return d == 0;
}

static void handle_request(srv_ctx *c)
{
	pt_api_server *s = c->srv;
	void *body = nng_msg_body(c->req);
	size_t len = nng_msg_len(c->req);
	const uint8_t *data = NULL;
	size_t size = 0;
	bool parked = false;
	pt_err rv;

	c->code = PT_API_OK;
	c->h = NULL;
	pt_clear_error();
	if (((uintptr_t)body & 3u) != 0 && len > 0) {
		if ((c->copy = malloc(len)) == NULL) {
			send_error(c, 0, PT_API_INTERNAL, "out of memory");
			return;
		}
		memcpy(c->copy, body, len);
		body = c->copy;
	}
	if (pt_api_parse_request(body, len, &c->r) != PT_OK) {
		char msg[1200];
		snprintf(msg, sizeof(msg), "%s", pt_last_error());
		send_error(c, c->r.id, PT_API_BAD_REQUEST, msg);
		return;
	}
	if (s->cfg.auth_token &&
	    (c->r.auth_token == NULL || !ct_equal(c->r.auth_token, s->cfg.auth_token))) {
		send_error(c, c->r.id, PT_API_UNAUTHORIZED,
		           c->r.auth_token ? "wrong auth token" : "missing auth token");
		return;
	}
	if (atomic_load(&s->closing)) {
		send_error(c, c->r.id, PT_API_UNAVAILABLE, "server is shutting down");
		return;
	}
	c->h = &handlers[c->r.kind];
	if (c->h->flags & H_WORKER) {
		enqueue_work(c);
		keep_receiving(s);
		return;
	}
	rv = c->h->fn(c, &data, &size, &parked);
	if (rv == PT_OK && parked) {
		pthread_mutex_lock(&c->mu);
		c->state = CTX_PARK;
		c->sleeping = true;
		nng_sleep_aio(c->r.wait_ms, c->aio);
		if (c->woken)
			nng_aio_cancel(c->aio);
		pthread_mutex_unlock(&c->mu);
		keep_receiving(s);
		return;
	}
	finish(c, rv, data, size);
}

static void ctx_cb(void *arg)
{
	srv_ctx *c = arg;
	pt_api_server *s = c->srv;
	int rv = nng_aio_result(c->aio);

	switch (c->state) {
	case CTX_RECV:
		atomic_fetch_sub(&s->receiving, 1);
		if (rv != 0) {
			if (rv == NNG_ECLOSED || atomic_load(&s->stopping)) {
				c->state = CTX_IDLE;
				return;
			}
			pt_warn("receive: %s", nng_strerror(rv));
			start_recv(c);
			return;
		}
		c->req = nng_aio_get_msg(c->aio);
		c->t0 = now_mono();
		handle_request(c);
		return;
	case CTX_PARK: {
		const uint8_t *data = NULL;
		size_t size = 0;
		bool parked = false;
		pt_err e;

		pthread_mutex_lock(&c->mu);
		c->sleeping = false;
		c->woken = false;
		pthread_mutex_unlock(&c->mu);
		pt_jobs_unwatch(s->cfg.jobs, &c->waiter);
		if (atomic_load(&s->stopping)) {
			if (c->req) {
				nng_msg_free(c->req);
				c->req = NULL;
			}
			free(c->copy);
			c->copy = NULL;
			c->state = CTX_IDLE;
			return;
		}
		pt_clear_error();
		e = pt_jobs_reply_watch(s->cfg.jobs, &c->r, NULL, &c->b, &data, &size, &parked);
		finish(c, e, data, size);
		return;
	}
	case CTX_SEND:
		if (rv != 0) {
			nng_msg *m = nng_aio_get_msg(c->aio);
			if (m)
				nng_msg_free(m);
			if (rv != NNG_ECLOSED)
				pt_debug("send: %s", nng_strerror(rv));
		}
		start_recv(c);
		return;
	default:
		return;
	}
}

/* ------------------------------------------------------------ lifetime -- */

static pt_err tls_setup(pt_api_server *s)
{
	char *cert = NULL, *key = NULL;
	size_t n;
	int rv;
	pt_err e;

	if (s->cfg.tls_cert == NULL || s->cfg.tls_key == NULL || !*s->cfg.tls_cert ||
	    !*s->cfg.tls_key)
		return pt_set_error(PT_ERR_INVALID, "tls+tcp:// needs --tls-cert and --tls-key");
	if ((e = pt_file_read(s->cfg.tls_cert, 1 << 20, (void **)&cert, &n)) != PT_OK)
		return pt_set_error(e, "tls_cert: %s", pt_last_error());
	if ((e = pt_file_read(s->cfg.tls_key, 1 << 20, (void **)&key, &n)) != PT_OK) {
		free(cert);
		return pt_set_error(e, "tls_key: %s", pt_last_error());
	}
	if ((rv = nng_tls_config_alloc(&s->tls, NNG_TLS_MODE_SERVER)) != 0 ||
	    (rv = nng_tls_config_own_cert(s->tls, cert, key, NULL)) != 0) {
		free(cert);
		free(key);
		return pt_set_error(PT_ERR_INVALID, "TLS certificate/key: %s", nng_strerror(rv));
	}
	free(cert);
	free(key);
	if (s->cfg.tls_ca && *s->cfg.tls_ca) {
		if ((rv = nng_tls_config_ca_file(s->tls, s->cfg.tls_ca)) != 0 ||
		    (rv = nng_tls_config_auth_mode(s->tls, NNG_TLS_AUTH_MODE_REQUIRED)) != 0)
			return pt_set_error(PT_ERR_INVALID, "tls_ca %s: %s", s->cfg.tls_ca,
			                    nng_strerror(rv));
	} else if ((rv = nng_tls_config_auth_mode(s->tls, NNG_TLS_AUTH_MODE_NONE)) != 0) {
		return pt_set_error(PT_ERR_INVALID, "TLS: %s", nng_strerror(rv));
	}
	return PT_OK;
}

/* resolved_url replaces a tcp port 0 by the bound port. */
static void resolved_url(nng_listener l, const char *url, char *out, size_t n)
{
	int port = 0;
	const char *colon = strrchr(url, ':');

	snprintf(out, n, "%s", url);
	if (colon && strcmp(colon, ":0") == 0 &&
	    nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0)
		snprintf(out, n, "%.*s:%d", (int)(colon - url), url, port);
}

pt_err pt_api_server_start(pt_api_server **out, const pt_api_server_config *cfg, FILE *announce)
{
	pt_api_server *s;
	pt_err e = PT_OK;
	int rv;

	*out = NULL;
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "server");
	s->cfg = *cfg;
	s->started = now_mono();
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->wmu, NULL);
	pthread_mutex_init(&s->dmu, NULL);
	pthread_cond_init(&s->wcv, NULL);
	if ((rv = nng_rep0_open(&s->sock)) != 0) {
		e = pt_set_error(PT_ERR_BACKEND, "nng_rep0_open: %s", nng_strerror(rv));
		goto fail;
	}
	s->sock_open = true;
	if ((rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, cfg->max_request)) != 0) {
		e = pt_set_error(PT_ERR_BACKEND, "recv-size-max: %s", nng_strerror(rv));
		goto fail;
	}
	if ((s->workers = calloc((size_t)cfg->workers, sizeof(*s->workers))) == NULL) {
		e = pt_set_error(PT_ERR_NOMEM, "workers");
		goto fail;
	}
	for (int i = 0; i < cfg->workers; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_main, s) != 0) {
			e = pt_set_error(PT_ERR_NOMEM, "worker thread");
			goto fail;
		}
		s->n_workers++;
	}
	for (int i = 0; i < cfg->contexts; i++) {
		srv_ctx *c;
		if ((e = ctx_new(s, &c)) != PT_OK)
			goto fail;
		start_recv(c);
	}
	for (int i = 0; i < cfg->n_urls && i < 16; i++) {
		const char *url = cfg->urls[i];
		nng_listener l;
		char shown[512];
		if (strncmp(url, "tls+", 4) == 0 && s->tls == NULL && (e = tls_setup(s)) != PT_OK)
			goto fail;
		if ((rv = nng_listener_create(&l, s->sock, url)) != 0) {
			e = pt_set_error(PT_ERR_INVALID, "listen %s: %s", url, nng_strerror(rv));
			goto fail;
		}
		if (strncmp(url, "tls+", 4) == 0 &&
		    (rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, s->tls)) != 0) {
			e = pt_set_error(PT_ERR_INVALID, "listen %s: TLS: %s", url,
			                 nng_strerror(rv));
			goto fail;
		}
		if ((rv = nng_listener_start(l, 0)) != 0) {
			e = pt_set_error(PT_ERR_IO, "listen %s: %s", url, nng_strerror(rv));
			goto fail;
		}
		s->listeners[s->n_listeners++] = l;
		resolved_url(l, url, shown, sizeof(shown));
		fprintf(announce, "pipeserver listening on %s\n", shown);
		fflush(announce);
		pt_info("listening on %s%s", shown, cfg->auth_token ? " (token required)" : "");
	}
	*out = s;
	return PT_OK;
fail:
	pt_api_server_destroy(s);
	return e;
}

void pt_api_server_drain(pt_api_server *s)
{
	if (s)
		atomic_store(&s->closing, true);
}

void pt_api_server_destroy(pt_api_server *s)
{
	srv_ctx *c, *next;

	if (s == NULL)
		return;
	atomic_store(&s->closing, true);
	pthread_mutex_lock(&s->wmu);
	s->wstop = true;
	pthread_cond_broadcast(&s->wcv);
	pthread_mutex_unlock(&s->wmu);
	for (int i = 0; i < s->n_workers; i++)
		pthread_join(s->workers[i], NULL);
	free(s->workers);
	pthread_mutex_lock(&s->mu);
	atomic_store(&s->stopping, true);
	pthread_mutex_unlock(&s->mu);
	if (s->sock_open)
		nng_close(s->sock);
	/* No context is created after stopping is set; the list is final. */
	pthread_mutex_lock(&s->mu);
	c = s->all;
	s->all = NULL;
	pthread_mutex_unlock(&s->mu);
	for (srv_ctx *p = c; p; p = p->next_all)
		nng_aio_stop(p->aio);
	for (; c; c = next) {
		next = c->next_all;
		pt_jobs_unwatch(s->cfg.jobs, &c->waiter);
		nng_aio_free(c->aio);
		if (c->req)
			nng_msg_free(c->req);
		free(c->copy);
		pt_fb_builder_fini(&c->b);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
	if (s->tls)
		nng_tls_config_free(s->tls);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->wmu);
	pthread_mutex_destroy(&s->dmu);
	pthread_cond_destroy(&s->wcv);
	free(s);
}
