/* api_server.c - REP socket, context state machines, handler table, worker
 * pool (see api_server.h).
 *
 * A context is in one of: RECV (nng_ctx_recv pending), WORK (queued for or
 * held by a worker), PARK (nng_sleep_aio pending, linked as a job waiter),
 * SEND (nng_ctx_send pending), IDLE (stopped). Its aio callback never blocks:
 * it takes only short-held mutexes and hands anything slow to the workers.
 *
 * Connections: a hash table of the socket's pipes (pipe notifications add
 * and remove them), each with its requests in progress and the time of its
 * last request or reply; a housekeeping thread closes idle ones. A context
 * counts its request against the pipe from receipt until the reply was handed
 * to nng (or dropped), so a parked WatchMetrics keeps its connection active.
 */
#include "api_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
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
#include "backend.h"
#include "device.h"
#include "fileio.h"
#include "log.h"
#include "metrics.h"
#include "sha256.h"

#define MAX_WAIT_MS      300000
#define DEDUP_SLOTS      64
#define CONN_BUCKETS     4096
#define REPLY_TIMEOUT_MS 10000 /* when the config says 0 */
#define REJECT_LOG_PER_S 10    /* BadRequest/InvalidJob lines logged per second at most */

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
	nng_pipe pipe;      /* the connection the request came on */
	bool counted;       /* counted in that connection's outstanding */
	pthread_mutex_t mu; /* sleeping/woken, between a waker and the callback */
	bool sleeping, woken;
	srv_ctx *next_all, *next_work;
};

/* One open connection (nng pipe); guarded by pt_api_server.cmu. */
typedef struct conn {
	nng_pipe pipe;
	int outstanding; /* requests received and not yet answered */
	double last;     /* monotonic seconds of the last request or reply */
	bool closing;    /* being closed: no longer counted as open */
	bool kick;       /* to be closed by the housekeeping thread */
	bool stalled;    /* does not take its replies: never closed by us (see kick_locked) */
	struct conn *next;
} conn;

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
	char kernels[1024]; /* ServerInfo's kernels: detected at start */

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

	pthread_mutex_t cmu; /* connections */
	conn *conns[CONN_BUCKETS];
	int n_open;                                    /* connections not closing */
	uint64_t n_evicted, n_refused, n_idle, n_over; /* closed since the last log line */
	double logged;                                 /* when that line was written */

	pt_log_limit reject_log; /* the rejected-request log's rate limit */

	pthread_mutex_t hmu; /* housekeeping thread */
	pthread_cond_t hcv;
	pthread_t housekeeper;
	bool hk_started, hk_stop, hk_wake;
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
static void keep_receiving(pt_api_server *s);
static void conn_end(srv_ctx *c);
static conn **conn_slot(pt_api_server *s, uint32_t id);

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
		if (rv == PT_ERR_BUSY) /* out of descriptors: Unavailable, try again */
			return rv;
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
	char devices[1024];

	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_SERVER_INFO);
	r.info.version = s->cfg.version;
	r.info.protocol = PT_API_PROTOCOL;
	r.info.device = s->cfg.device;
	pt_jobs_counts(s->cfg.jobs, &r.info.jobs_queued, &r.info.jobs_running);
	r.info.uptime_seconds = now_mono() - s->started;
	r.info.kernels = s->kernels;
	pt_jobs_pool_counts(s->cfg.jobs, &r.info.workers, &r.info.workers_free,
	                    &r.info.workers_busy, &r.info.workers_unreachable);
	r.info.devices_in_use = pt_jobs_devices_in_use(s->cfg.jobs);
	pt_jobs_describe_devices(s->cfg.jobs, devices, sizeof(devices));
	r.info.devices = devices[0] ? devices : NULL;
	return pt_api_build_response(&c->b, &r, data, size);
}

static pt_err h_workers(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	return pt_jobs_reply_workers(c->srv->cfg.jobs, c->r.id, &c->b, data, size);
}

static pt_err h_drain(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_response r;

	if (c->r.url == NULL)
		return pt_set_error(PT_ERR_INVALID, "DrainWorker: url is missing");
	PT_TRY(pt_jobs_drain_worker(c->srv->cfg.jobs, c->r.url));
	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_DRAIN_WORKER);
	return pt_api_build_response(&c->b, &r, data, size);
}

static pt_err h_plan(srv_ctx *c, const uint8_t **data, size_t *size, bool *parked)
{
	pt_api_response r;
	pt_job_plan *plans = NULL;
	pt_api_plan *v = NULL;
	int n = 0;
	pt_err rv;

	if ((rv = pt_jobs_plan(c->srv->cfg.jobs, c->r.spec_table, c->r.plan_stages,
	                       c->r.n_plan_stages, c->r.plan_microbatches, c->r.n_plan_microbatches,
	                       &plans, &n)) != PT_OK) {
		if (rv == PT_ERR_NOMEM)
			c->code = PT_API_INTERNAL;
		return rv;
	}
	if (n > 0 && (v = calloc((size_t)n, sizeof(*v))) == NULL) {
		free(plans);
		c->code = PT_API_INTERNAL;
		return pt_set_error(PT_ERR_NOMEM, "plans");
	}
	for (int i = 0; i < n; i++) {
		const pt_job_plan *p = &plans[i];
		int nl = p->stages * (p->virtual_stages > 1 ? p->virtual_stages : 1);
		v[i] =
		    (pt_api_plan){.schedule = pt_pipe_schedule_name(p->schedule),
		                  .stages = p->stages,
		                  .microbatches = p->microbatches,
		                  .virtual_stages = p->virtual_stages > 1 ? p->virtual_stages : 0,
		                  .step_seconds = p->step_seconds,
		                  .bubble = p->bubble,
		                  .samples_per_second = p->samples_per_s,
		                  .n_boundaries = nl + 1,
		                  .n_stage_bytes = nl};
		for (int s = 0; s <= nl; s++)
			v[i].boundaries[s] = p->first[s];
		for (int s = 0; s < nl; s++)
			v[i].stage_bytes[s] = p->stage_bytes[s];
	}
	pt_api_response_init(&r, c->r.id, PT_API_OK, PT_API_PLAN_JOB);
	r.plans = v;
	r.n_plans = (size_t)n;
	rv = pt_api_build_response(&c->b, &r, data, size);
	free(v);
	free(plans);
	return rv;
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
    [PT_API_LIST_WORKERS] = {PT_API_LIST_WORKERS, h_workers, H_INLINE, PT_API_INTERNAL},
    [PT_API_DRAIN_WORKER] = {PT_API_DRAIN_WORKER, h_drain, H_INLINE, PT_API_NOT_FOUND},
    [PT_API_PLAN_JOB] = {PT_API_PLAN_JOB, h_plan, H_WORKER, PT_API_INVALID_JOB},
};
_Static_assert(PT_API_KIND_COUNT == 12, "a handler for every request kind");

/* ------------------------------------------------------------- replies -- */

/* send_bytes replies with data (copied into a new message) and moves c to SEND. */
static void send_bytes(srv_ctx *c, const uint8_t *data, size_t size)
{
	pt_api_server *s = c->srv;
	nng_msg *msg;
	conn *x;
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
	/* No reply to a connection being closed: nng 1.5.2 can queue a reply on
	 * a pipe it has closed but not yet reaped, and never complete it. The
	 * check and the send are one step under cmu, which kick_locked takes to
	 * mark a connection closing before it is closed. */
	pthread_mutex_lock(&s->cmu);
	if (c->counted && (x = *conn_slot(s, (uint32_t)nng_pipe_id(c->pipe))) != NULL &&
	    x->closing) {
		pthread_mutex_unlock(&s->cmu);
		nng_msg_free(msg);
		start_recv(c);
		return;
	}
	c->state = CTX_SEND;
	/* nng queues the reply behind the connection's send in progress: when the
	 * client does not read, this context waits, so keep others receiving. */
	nng_aio_set_timeout(c->aio, s->cfg.reply_timeout_ms > 0 ? s->cfg.reply_timeout_ms
	                                                        : REPLY_TIMEOUT_MS);
	nng_aio_set_msg(c->aio, msg);
	nng_ctx_send(c->ctx, c->aio);
	pthread_mutex_unlock(&s->cmu);
	keep_receiving(s);
}

/* peer_name writes the remote address of connection p ("10.0.0.4:51234",
 * "[::1]:51234"), or "" when the transport has none (ipc, inproc). */
static void peer_name(nng_pipe p, char *out, size_t n)
{
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	out[0] = '\0';
	if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
		return;
	if (sa.s_family == NNG_AF_INET &&
	    inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip)) != NULL)
		snprintf(out, n, "%s:%u", ip, ntohs(sa.s_in.sa_port));
	else if (sa.s_family == NNG_AF_INET6 &&
	         inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip)) != NULL)
		snprintf(out, n, "[%s]:%u", ip, ntohs(sa.s_in6.sa_port));
}

/* reject_summary logs how many rejection lines the rate limit held back,
 * once their window is over (force: now). Called by the rejections
 * themselves and by the housekeeping thread, so a flood that stops is
 * summed up within about a second. */
static void reject_summary(pt_api_server *s, bool force)
{
	uint64_t n = pt_log_limit_suppressed(&s->reject_log, force);

	if (n)
		pt_info("api: suppressed %" PRIu64 " similar lines (BadRequest/InvalidJob replies "
		        "over %d a second)",
		        n, REJECT_LOG_PER_S);
}

/* log_reject writes one line for a BadRequest or InvalidJob reply - the
 * request's kind, id and connection, the message - at most REJECT_LOG_PER_S
 * a second; reject_summary counts the rest. The message is the client's
 * doing (names, paths): control characters become '?' to keep one line. */
static void log_reject(srv_ctx *c, uint64_t id, pt_api_code code, const char *msg)
{
	pt_api_server *s = c->srv;
	char peer[INET6_ADDRSTRLEN + 16], text[512];
	bool cut;

	if (pt_log_level_get() > PT_LOG_INFO)
		return;
	reject_summary(s, false);
	if (!pt_log_limit_pass(&s->reject_log))
		return;
	cut = pt_log_clean(text, sizeof(text), msg);
	peer_name(c->pipe, peer, sizeof(peer));
	pt_info("api: %s reply to request %" PRIu64 " (%s) on connection %d%s%s: %s%s",
	        pt_api_code_name(code), id,
	        c->r.kind == PT_API_NONE ? "kind unknown" : pt_api_kind_name(c->r.kind),
	        nng_pipe_id(c->pipe), peer[0] ? " from " : "", peer, text, cut ? "..." : "");
}

static void send_error(srv_ctx *c, uint64_t id, pt_api_code code, const char *msg)
{
	const uint8_t *data;
	size_t size;

	if (code == PT_API_BAD_REQUEST || code == PT_API_INVALID_JOB)
		log_reject(c, id, code, msg);
	else
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
		                   : rv == PT_ERR_BUSY     ? PT_API_UNAVAILABLE
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

	pthread_setname_np(pthread_self(), "pt-api");
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

/* --------------------------------------------------------- connections -- */

static conn **conn_slot(pt_api_server *s, uint32_t id)
{
	conn **p = &s->conns[id % CONN_BUCKETS];

	while (*p && (uint32_t)nng_pipe_id((*p)->pipe) != id)
		p = &(*p)->next;
	return p;
}

/* kick_locked hands x to the housekeeping thread to close (cmu held): it
 * stops counting as open at once, and pipe_cb forgets it when nng removed
 * it. Callbacks never close pipes themselves (only a new pipe is refused in
 * place, ADD_PRE): nng 1.5.2 can hang closing a pipe from one.
 *
 * A stalled connection (it sent more than max_outstanding requests, or left
 * a reply untaken for reply_timeout_ms) is never closed: with nng 1.5.2,
 * closing a pipe while replies queue behind its blocked send leaves nng's
 * pipe reaper waiting for ever, which stops every later close and
 * nng_close. It is contained instead: its requests beyond the cap are
 * dropped unanswered, so it holds at most max_outstanding contexts, each
 * for at most reply_timeout_ms; it leaves when its client disconnects. */
static void kick_locked(pt_api_server *s, conn *x)
{
	if (x->closing || x->stalled)
		return;
	x->closing = true;
	s->n_open--;
	x->kick = true;
	pthread_mutex_lock(&s->hmu);
	s->hk_wake = true;
	pthread_cond_signal(&s->hcv);
	pthread_mutex_unlock(&s->hmu);
}

/* conn_stall marks connection p stalled (see kick_locked). */
static void conn_stall(pt_api_server *s, nng_pipe p)
{
	conn *x;

	pthread_mutex_lock(&s->cmu);
	if ((x = *conn_slot(s, (uint32_t)nng_pipe_id(p))) != NULL)
		x->stalled = true;
	pthread_mutex_unlock(&s->cmu);
}

/* pipe_cb runs on nng's threads when a connection is about to be added
 * (ADD_PRE: closing it there refuses it) and after one was removed. */
static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	pt_api_server *s = arg;
	conn *x, *victim = NULL, **slot;
	bool refuse = false;

	if (ev == NNG_PIPE_EV_REM_POST) {
		pthread_mutex_lock(&s->cmu);
		if ((x = *(slot = conn_slot(s, nng_pipe_id(p)))) != NULL) {
			*slot = x->next;
			if (!x->closing)
				s->n_open--;
		}
		pthread_mutex_unlock(&s->cmu);
		free(x);
		return;
	}
	if (ev != NNG_PIPE_EV_ADD_PRE)
		return;
	if ((x = calloc(1, sizeof(*x))) == NULL) {
		nng_pipe_close(p);
		return;
	}
	x->pipe = p;
	x->last = now_mono();
	pthread_mutex_lock(&s->cmu);
	if (s->n_open >= s->cfg.max_connections) {
		/* Make room by closing the connection idle the longest. */
		for (size_t b = 0; b < CONN_BUCKETS; b++)
			for (conn *y = s->conns[b]; y; y = y->next)
				if (!y->closing && !y->stalled && y->outstanding == 0 &&
				    (victim == NULL || y->last < victim->last))
					victim = y;
		if (victim) {
			kick_locked(s, victim);
			s->n_evicted++;
		} else {
			refuse = true;
			s->n_refused++;
		}
	}
	if (!refuse) {
		slot = &s->conns[nng_pipe_id(p) % CONN_BUCKETS];
		x->next = *slot;
		*slot = x;
		s->n_open++;
	}
	pthread_mutex_unlock(&s->cmu);
	if (refuse) {
		free(x);
		nng_pipe_close(p); /* nng's way to refuse a pipe in ADD_PRE */
	}
}

/* conn_begin counts c's new request against its connection; false when the
 * connection has max_outstanding requests in progress already: drop it. */
static bool conn_begin(srv_ctx *c)
{
	pt_api_server *s = c->srv;
	conn *x;
	bool over = false;

	c->pipe = nng_msg_get_pipe(c->req);
	c->counted = false;
	pthread_mutex_lock(&s->cmu);
	if ((x = *conn_slot(s, nng_pipe_id(c->pipe))) != NULL) {
		x->last = c->t0;
		if (x->outstanding >= s->cfg.max_outstanding) {
			over = true;
			x->stalled = true;
			s->n_over++;
		} else {
			x->outstanding++;
			c->counted = true;
		}
	}
	pthread_mutex_unlock(&s->cmu);
	return !over;
}

/* conn_end ends the count of c's request (its reply went to nng or was
 * dropped); the connection is active until now. */
static void conn_end(srv_ctx *c)
{
	pt_api_server *s = c->srv;
	conn *x;

	if (!c->counted)
		return;
	c->counted = false;
	pthread_mutex_lock(&s->cmu);
	if ((x = *conn_slot(s, nng_pipe_id(c->pipe))) != NULL) {
		x->outstanding--;
		x->last = now_mono();
	}
	pthread_mutex_unlock(&s->cmu);
}

/* close_conns closes the kicked connections and, when idle_timeout_ms is
 * set, every one without a request in progress for that long; it logs what
 * was closed for any reason (at most every 10 s). */
static void close_conns(pt_api_server *s)
{
	double now = now_mono(), idle = s->cfg.idle_timeout_ms / 1000.0;
	nng_pipe batch[256];
	size_t n;

	do {
		n = 0;
		pthread_mutex_lock(&s->cmu);
		for (size_t b = 0; b < CONN_BUCKETS && n < 256; b++)
			for (conn *x = s->conns[b]; x && n < 256; x = x->next) {
				if (s->cfg.idle_timeout_ms > 0 && !x->closing && !x->stalled &&
				    x->outstanding == 0 && now - x->last >= idle) {
					x->closing = true;
					x->kick = true;
					s->n_open--;
					s->n_idle++;
				}
				if (x->kick) {
					x->kick = false;
					batch[n++] = x->pipe;
				}
			}
		pthread_mutex_unlock(&s->cmu);
		for (size_t i = 0; i < n; i++)
			nng_pipe_close(batch[i]);
	} while (n == 256);

	pthread_mutex_lock(&s->cmu);
	if ((s->n_evicted || s->n_refused || s->n_idle || s->n_over) && now - s->logged >= 10) {
		pt_info("connections: %d open; closed %" PRIu64 " idle, %" PRIu64
		        " to make room (--max-connections %d); dropped %" PRIu64 " requests over "
		        "--max-outstanding %d; refused %" PRIu64,
		        s->n_open, s->n_idle, s->n_evicted, s->cfg.max_connections, s->n_over,
		        s->cfg.max_outstanding, s->n_refused);
		s->n_evicted = s->n_refused = s->n_idle = s->n_over = 0;
		s->logged = now;
	}
	pthread_mutex_unlock(&s->cmu);
}

/* housekeeper_main closes kicked connections at once and scans for idle
 * ones every idle_timeout_ms / 4 (50 ms to 1 s). */
static void *housekeeper_main(void *arg)
{
	pt_api_server *s = arg;
	int period = s->cfg.idle_timeout_ms / 4;

	pthread_setname_np(pthread_self(), "pt-housekeep");
	if (period < 50)
		period = 50;
	if (period > 1000)
		period = 1000;
	pthread_mutex_lock(&s->hmu);
	while (!s->hk_stop) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += (long)period * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		while (!s->hk_wake && !s->hk_stop &&
		       pthread_cond_timedwait(&s->hcv, &s->hmu, &ts) == 0)
			;
		if (s->hk_stop)
			break;
		s->hk_wake = false;
		pthread_mutex_unlock(&s->hmu);
		close_conns(s);
		reject_summary(s, false);
		pthread_mutex_lock(&s->hmu);
	}
	pthread_mutex_unlock(&s->hmu);
	return NULL;
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
	conn_end(c);
	if (atomic_load(&c->srv->stopping)) {
		c->state = CTX_IDLE;
		return;
	}
	c->state = CTX_RECV;
	atomic_fetch_add(&c->srv->receiving, 1);
	/* Receiving waits for ever; the timeout also bounds nng_sleep_aio (PARK). */
	nng_aio_set_timeout(c->aio, NNG_DURATION_INFINITE);
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
		/* A parked watch needs the request's numbers only: its message
		 * (up to --max-request-mb, padding included) goes now, not when
		 * the watch is answered. */
		pt_api_request keep;
		pt_api_request_init(&keep, c->r.kind);
		keep.id = c->r.id;
		keep.job = c->r.job;
		keep.cursor = c->r.cursor;
		keep.wait_ms = c->r.wait_ms;
		keep.max_points = c->r.max_points;
		c->r = keep;
		nng_msg_free(c->req);
		c->req = NULL;
		free(c->copy);
		c->copy = NULL;
		pthread_mutex_lock(&c->mu);
		c->state = CTX_PARK;
		c->sleeping = true;
		nng_sleep_aio(c->r.wait_ms, c->aio);
		if (c->woken || atomic_load(&s->closing))
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
		if (!conn_begin(c)) {
			nng_msg_free(c->req);
			c->req = NULL;
			start_recv(c);
			return;
		}
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
			if (rv == NNG_ETIMEDOUT) {
				/* The client has not read a reply for reply_timeout_ms
				 * (debug: a flood of these must not flood the log). */
				pt_debug("connection %d: reply not taken in %d ms; dropped",
				         nng_pipe_id(c->pipe),
				         s->cfg.reply_timeout_ms > 0 ? s->cfg.reply_timeout_ms
				                                     : REPLY_TIMEOUT_MS);
				conn_stall(s, c->pipe);
			} else if (rv != NNG_ECLOSED) {
				pt_debug("send: %s", nng_strerror(rv));
			}
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
	{
		pt_device dev = PT_CPU;
		if (cfg->device != NULL && pt_device_parse(cfg->device, &dev) != PT_OK) {
			dev = PT_CPU;
			pt_clear_error();
		}
		pt_backend_describe(dev, s->kernels, sizeof(s->kernels));
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->wmu, NULL);
	pthread_mutex_init(&s->dmu, NULL);
	pthread_mutex_init(&s->cmu, NULL);
	pthread_mutex_init(&s->hmu, NULL);
	s->reject_log = (pt_log_limit)PT_LOG_LIMIT_INIT(REJECT_LOG_PER_S);
	pthread_cond_init(&s->wcv, NULL);
	{
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&s->hcv, &ca);
		pthread_condattr_destroy(&ca);
	}
	if (s->cfg.max_connections <= 0)
		s->cfg.max_connections = INT_MAX;
	if (s->cfg.max_outstanding <= 0)
		s->cfg.max_outstanding = INT_MAX;
	if ((rv = nng_rep0_open(&s->sock)) != 0) {
		e = pt_set_error(PT_ERR_BACKEND, "nng_rep0_open: %s", nng_strerror(rv));
		goto fail;
	}
	s->sock_open = true;
	if ((rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, cfg->max_request)) != 0) {
		e = pt_set_error(PT_ERR_BACKEND, "recv-size-max: %s", nng_strerror(rv));
		goto fail;
	}
	if ((rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, s)) != 0 ||
	    (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, pipe_cb, s)) != 0) {
		e = pt_set_error(PT_ERR_BACKEND, "nng_pipe_notify: %s", nng_strerror(rv));
		goto fail;
	}
	if (pthread_create(&s->housekeeper, NULL, housekeeper_main, s) != 0) {
		e = pt_set_error(PT_ERR_NOMEM, "housekeeping thread");
		goto fail;
	}
	s->hk_started = true;
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
	if (s == NULL)
		return;
	atomic_store(&s->closing, true);
	/* Answer parked WatchMetrics now (their job's points and state, as at
	 * the end of the wait): a client's next request gets Unavailable at
	 * once, rather than its long poll being cut when the socket closes. */
	pthread_mutex_lock(&s->mu);
	for (srv_ctx *c = s->all; c; c = c->next_all)
		waiter_wake(&c->waiter);
	pthread_mutex_unlock(&s->mu);
}

void pt_api_server_destroy(pt_api_server *s)
{
	srv_ctx *c, *next;

	if (s == NULL)
		return;
	atomic_store(&s->closing, true);
	if (s->hk_started) {
		pthread_mutex_lock(&s->hmu);
		s->hk_stop = true;
		pthread_cond_signal(&s->hcv);
		pthread_mutex_unlock(&s->hmu);
		pthread_join(s->housekeeper, NULL);
	}
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
	/* nng_close waited for every pipe: no pipe_cb runs any more. */
	for (size_t b = 0; b < CONN_BUCKETS; b++)
		while (s->conns[b]) {
			conn *x = s->conns[b];
			s->conns[b] = x->next;
			free(x);
		}
	if (s->tls)
		nng_tls_config_free(s->tls);
	reject_summary(s, true); /* no request is handled any more */
	pthread_mutex_destroy(&s->reject_log.mu);
	pthread_mutex_destroy(&s->cmu);
	pthread_mutex_destroy(&s->hmu);
	pthread_cond_destroy(&s->hcv);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->wmu);
	pthread_mutex_destroy(&s->dmu);
	pthread_cond_destroy(&s->wcv);
	free(s);
}
