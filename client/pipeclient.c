/* pipeclient.c - libpipeclient: Request/Response exchanges over nng REQ.
 *
 * One REQ socket per handle, one nng context per call, so calls on a shared
 * handle run concurrently and each matches its own reply. Every reply is
 * verified (lib/api) and must echo the request's id and body kind. The REQ
 * resend timer is off: a request that timed out is not sent a second time
 * behind the caller's back (a SubmitJob must not run twice).
 *
 * Limits: replies above REPLY_MAX_BYTES make nng drop the connection (the call
 * then times out); a checkpoint is downloaded by one caller at a time per
 * destination path (the .part file is not locked).
 */
#include "pipeclient.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "api/api.h"
#include "job/job.h"
#include "sha256.h"

/* Replies may carry a 4 MiB checkpoint range or a long job list. */
#define REPLY_MAX_BYTES (2 * (size_t)PT_API_MAX_MESSAGE)

struct pipeclient {
	nng_socket sock;
	nng_dialer dialer;
	char *url;
	char *token;          /* NULL: none */
	uint32_t fetch_chunk; /* bytes per checkpoint range */
	pthread_mutex_t mu;
	/* Below: guarded by mu. */
	int timeout_ms;
	uint64_t next_id;
	pipeclient_err last_code;
	char last_msg[1024];
};

_Static_assert((int)PIPECLIENT_STATE_COUNT == (int)PT_JOB_STATE_COUNT, "job states match");
_Static_assert(PIPECLIENT_MAX_STAGES == PT_API_MAX_STAGES, "stage count matches");
_Static_assert(PIPECLIENT_FETCH_CHUNK <= PT_API_MAX_CHUNK, "chunk fits a reply");
_Static_assert(PIPECLIENT_PROTOCOL == PT_API_PROTOCOL, "protocol matches");

/* ------------------------------------------------------------------ errors -- */

static _Thread_local char tl_msg[1024];

const char *pipeclient_strerror(pipeclient_err e)
{
	switch (e) {
#define PIPECLIENT_ERR_MSG(name, value, msg)                                                       \
	case name:                                                                                 \
		return msg;
		PIPECLIENT_ERRORS(PIPECLIENT_ERR_MSG)
#undef PIPECLIENT_ERR_MSG
	}
	return "unknown error";
}

const char *pipeclient_err_name(pipeclient_err e)
{
	switch (e) {
#define PIPECLIENT_ERR_NAME(name, value, msg)                                                      \
	case name:                                                                                 \
		return #name;
		PIPECLIENT_ERRORS(PIPECLIENT_ERR_NAME)
#undef PIPECLIENT_ERR_NAME
	}
	return "PIPECLIENT_ERR_UNKNOWN";
}

const char *pipeclient_state_name(pipeclient_job_state s)
{
	return pt_api_job_state_name((pt_api_job_state)s);
}

bool pipeclient_state_is_final(pipeclient_job_state s)
{
	return pt_api_job_state_final((pt_api_job_state)s);
}

const char *pipeclient_last_error(void)
{
	return tl_msg;
}

/* fail records a formatted detail for the thread and for c (may be NULL) and
 * returns e. */
static pipeclient_err fail(pipeclient *c, pipeclient_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static pipeclient_err fail(pipeclient *c, pipeclient_err e, const char *fmt, ...)
{
	char tmp[sizeof(tl_msg)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	memcpy(tl_msg, tmp, sizeof(tl_msg));
	if (c != NULL) {
		pthread_mutex_lock(&c->mu);
		c->last_code = e;
		memcpy(c->last_msg, tmp, sizeof(c->last_msg));
		pthread_mutex_unlock(&c->mu);
	}
	return e;
}

/* ok clears the thread's detail and returns PIPECLIENT_OK. */
static pipeclient_err ok(void)
{
	tl_msg[0] = '\0';
	return PIPECLIENT_OK;
}

/* from_pt maps an error of local work (reading, converting and verifying job
 * files and specs, building a request) to ours, prefixed with what (NULL: the
 * message names it already). */
static pipeclient_err from_pt(pipeclient *c, pt_err e, const char *what)
{
	pipeclient_err r;

	switch (e) {
	case PT_ERR_NOMEM:
		r = PIPECLIENT_ERR_NOMEM;
		break;
	case PT_ERR_IO:
	case PT_ERR_NOTFOUND:
		r = PIPECLIENT_ERR_IO;
		break;
	default: /* a job file or spec that does not parse or verify */
		r = PIPECLIENT_ERR_FORMAT;
		break;
	}
	if (what == NULL && pt_last_error()[0])
		return fail(c, r, "%s", pt_last_error());
	return fail(c, r, "%s: %s", what ? what : "job file",
	            pt_last_error()[0] ? pt_last_error() : pt_strerror(e));
}

/* from_nng maps a transport error. */
static pipeclient_err from_nng(pipeclient *c, int rv, const char *what)
{
	pipeclient_err r;

	switch (rv) {
	case NNG_ETIMEDOUT:
		r = PIPECLIENT_ERR_TIMEOUT;
		break;
	case NNG_ENOMEM:
		r = PIPECLIENT_ERR_NOMEM;
		break;
	case NNG_EADDRINVAL:
	case NNG_ENOTSUP:
	case NNG_EINVAL:
		r = PIPECLIENT_ERR_INVALID;
		break;
	case NNG_EPEERAUTH:
	case NNG_ECRYPTO:
		r = PIPECLIENT_ERR_TLS;
		break;
	default:
		r = PIPECLIENT_ERR_CONNECT;
		break;
	}
	return fail(c, r, "%s %s: %s", what, c ? c->url : "", nng_strerror(rv));
}

pipeclient_err pipeclient_error_message(pipeclient *c, char *buf, size_t cap)
{
	pipeclient_err e;

	if (c == NULL)
		return PIPECLIENT_ERR_INVALID;
	pthread_mutex_lock(&c->mu);
	e = c->last_code;
	if (buf != NULL && cap > 0)
		snprintf(buf, cap, "%s", c->last_msg);
	pthread_mutex_unlock(&c->mu);
	return e;
}

/* -------------------------------------------------------------- connection -- */

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static pipeclient_err setup_tls(pipeclient *c, const pipeclient_options *o)
{
	nng_tls_config *cfg;
	int rv;

	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0)
		return fail(c, PIPECLIENT_ERR_TLS, "TLS: %s", nng_strerror(rv));
	if (o->tls_ca_file && (rv = nng_tls_config_ca_file(cfg, o->tls_ca_file)) != 0) {
		fail(c, PIPECLIENT_ERR_TLS, "TLS CA file %s: %s", o->tls_ca_file, nng_strerror(rv));
		goto out;
	}
	if (o->tls_cert_file &&
	    (rv = nng_tls_config_cert_key_file(cfg, o->tls_cert_file, NULL)) != 0) {
		fail(c, PIPECLIENT_ERR_TLS, "TLS certificate %s: %s", o->tls_cert_file,
		     nng_strerror(rv));
		goto out;
	}
	if (o->tls_server_name && (rv = nng_tls_config_server_name(cfg, o->tls_server_name)) != 0) {
		fail(c, PIPECLIENT_ERR_TLS, "TLS server name: %s", nng_strerror(rv));
		goto out;
	}
	rv = nng_tls_config_auth_mode(cfg, o->tls_insecure ? NNG_TLS_AUTH_MODE_NONE
	                                                   : NNG_TLS_AUTH_MODE_REQUIRED);
	if (rv == 0)
		rv = nng_dialer_set_ptr(c->dialer, NNG_OPT_TLS_CONFIG, cfg);
	if (rv != 0)
		fail(c, PIPECLIENT_ERR_TLS, "TLS: %s", nng_strerror(rv));
out:
	nng_tls_config_free(cfg); /* the dialer holds its own reference */
	return rv == 0 ? PIPECLIENT_OK : PIPECLIENT_ERR_TLS;
}

pipeclient_err pipeclient_connect(pipeclient **out, const pipeclient_options *opts)
{
	static const pipeclient_options none = {0};
	const pipeclient_options *o = opts ? opts : &none;
	const char *url = o->url, *token = o->token;
	struct timespec ts;
	pipeclient *c;
	pipeclient_err e;
	int rv;

	if (out == NULL)
		return fail(NULL, PIPECLIENT_ERR_INVALID, "pipeclient_connect: out is NULL");
	*out = NULL;
	if (o->timeout_ms < 0)
		return fail(NULL, PIPECLIENT_ERR_INVALID, "timeout_ms %d < 0", o->timeout_ms);
	if (url == NULL || url[0] == '\0')
		url = getenv("PIPETRAIN_SERVER");
	if (url == NULL || url[0] == '\0')
		url = PIPECLIENT_DEFAULT_URL;
	if (token == NULL)
		token = getenv("PIPETRAIN_TOKEN");
	if (token != NULL && token[0] == '\0')
		token = NULL;
	/* "localhost:7600" is a common slip; nng would say only "invalid". A
	 * host without a port gets the default port in the hint. */
	if (strstr(url, "://") == NULL) {
		const char *br = strrchr(url, ']'), *colon = strrchr(br ? br : url, ':');
		return fail(NULL, PIPECLIENT_ERR_INVALID,
		            "URL \"%s\" has no scheme: did you mean tcp://%s%s?", url, url,
		            colon ? "" : ":7600");
	}

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return fail(NULL, PIPECLIENT_ERR_NOMEM, "pipeclient_connect: out of memory");
	pthread_mutex_init(&c->mu, NULL);
	c->url = strdup(url);
	c->token = dup_or_null(token);
	if (c->url == NULL || (token != NULL && c->token == NULL)) {
		pipeclient_close(c);
		return fail(NULL, PIPECLIENT_ERR_NOMEM, "pipeclient_connect: out of memory");
	}
	c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : PIPECLIENT_DEFAULT_TIMEOUT_MS;
	c->fetch_chunk = o->fetch_chunk > 0 && o->fetch_chunk < PIPECLIENT_FETCH_CHUNK
	                     ? o->fetch_chunk
	                     : PIPECLIENT_FETCH_CHUNK;
	/* Ids need only differ between the requests one server sees; start at a
	 * value unlikely to repeat across processes to ease reading server logs. */
	clock_gettime(CLOCK_REALTIME, &ts);
	c->next_id =
	    ((uint64_t)ts.tv_sec << 32 ^ (uint64_t)ts.tv_nsec << 8 ^ (uint64_t)getpid()) | 1u;

	if ((rv = nng_req0_open(&c->sock)) != 0) {
		free(c->url);
		free(c->token);
		pthread_mutex_destroy(&c->mu);
		free(c);
		return fail(NULL, PIPECLIENT_ERR_NOMEM, "nng_req0_open: %s", nng_strerror(rv));
	}
	if ((rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, REPLY_MAX_BYTES)) != 0 ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 100)) != 0 ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 2000)) != 0) {
		e = from_nng(c, rv, "socket options for");
		goto fail;
	}
	if ((rv = nng_dialer_create(&c->dialer, c->sock, c->url)) != 0) {
		e = from_nng(c, rv, "cannot use URL");
		goto fail;
	}
	if (strncmp(c->url, "tls+", 4) == 0) {
		if ((e = setup_tls(c, o)) != PIPECLIENT_OK)
			goto fail;
	} else if (o->tls_ca_file || o->tls_cert_file || o->tls_server_name) {
		e = fail(c, PIPECLIENT_ERR_INVALID, "TLS options need a tls+tcp:// URL, not %s",
		         c->url);
		goto fail;
	}
	/* Synchronous first dial: "nothing listening" is an error now. */
	if ((rv = nng_dialer_start(c->dialer, 0)) != 0) {
		e = from_nng(c, rv, "cannot connect to");
		goto fail;
	}
	*out = c;
	return ok();
fail:
	/* Keep the detail: close would not overwrite it, but copy for clarity. */
	pipeclient_close(c);
	return e;
}

void pipeclient_close(pipeclient *c)
{
	if (c == NULL)
		return;
	nng_close(c->sock); /* a zeroed socket is "not open": harmless */
	free(c->url);
	free(c->token);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

const char *pipeclient_url(const pipeclient *c)
{
	return c ? c->url : NULL;
}

pipeclient_err pipeclient_set_timeout(pipeclient *c, int timeout_ms)
{
	if (c == NULL || timeout_ms <= 0)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_set_timeout: %d ms", timeout_ms);
	pthread_mutex_lock(&c->mu);
	c->timeout_ms = timeout_ms;
	pthread_mutex_unlock(&c->mu);
	return ok();
}

/* ---------------------------------------------------------------- exchange -- */

/* One round trip. The reply message stays alive (the parsed view points into
 * it) until call_fini. */
typedef struct call {
	nng_msg *reply;
	pt_api_response resp;
} call;

static void call_fini(call *k)
{
	if (k->reply != NULL)
		nng_msg_free(k->reply);
	k->reply = NULL;
}

static pipeclient_err map_code(pipeclient *c, const pt_api_response *r, const char *what)
{
	pipeclient_err e;

	switch (r->code) {
	case PT_API_BAD_REQUEST:
		e = PIPECLIENT_ERR_SERVER_BAD_REQUEST;
		break;
	case PT_API_UNAUTHORIZED:
		e = PIPECLIENT_ERR_SERVER_UNAUTHORIZED;
		break;
	case PT_API_INVALID_JOB:
		e = PIPECLIENT_ERR_SERVER_INVALID_JOB;
		break;
	case PT_API_NOT_FOUND:
		e = PIPECLIENT_ERR_SERVER_NOT_FOUND;
		break;
	case PT_API_CONFLICT:
		e = PIPECLIENT_ERR_SERVER_CONFLICT;
		break;
	case PT_API_UNAVAILABLE:
		e = PIPECLIENT_ERR_SERVER_UNAVAILABLE;
		break;
	default: /* Internal, or a code newer than this library */
		e = PIPECLIENT_ERR_SERVER_INTERNAL;
		break;
	}
	return fail(c, e, "%s: %s: %s", what, pt_api_code_name(r->code),
	            r->message && r->message[0] ? r->message : "(no message)");
}

/* send_recv sends the finished Request bytes and waits up to the handle's
 * timeout + extra_ms for the reply, which it verifies and checks. */
static pipeclient_err send_recv(pipeclient *c, uint64_t id, pt_api_kind kind, const uint8_t *data,
                                size_t size, int extra_ms, call *k)
{
	const char *what = pt_api_kind_name(kind);
	nng_aio *aio = NULL;
	nng_msg *msg = NULL;
	nng_ctx ctx;
	int rv, timeout;
	pipeclient_err e;
	pt_err pe;

	memset(k, 0, sizeof(*k));
	pthread_mutex_lock(&c->mu);
	timeout = c->timeout_ms;
	pthread_mutex_unlock(&c->mu);
	if (extra_ms > 0)
		timeout = extra_ms > INT32_MAX - timeout ? INT32_MAX : timeout + extra_ms;

	if ((rv = nng_msg_alloc(&msg, size)) != 0)
		return from_nng(c, rv, what);
	memcpy(nng_msg_body(msg), data, size);
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		nng_msg_free(msg);
		return from_nng(c, rv, what);
	}
	if ((rv = nng_ctx_open(&ctx, c->sock)) != 0) {
		nng_msg_free(msg);
		nng_aio_free(aio);
		return from_nng(c, rv, what);
	}
	nng_aio_set_timeout(aio, timeout);
	nng_aio_set_msg(aio, msg);
	nng_ctx_send(ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		nng_msg_free(msg); /* a failed send leaves the message with us */
		goto transport;
	}
	nng_aio_set_timeout(aio, timeout);
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0)
		goto transport;
	k->reply = nng_aio_get_msg(aio);
	nng_ctx_close(ctx);
	nng_aio_free(aio);

	pe = pt_api_parse_response(nng_msg_body(k->reply), nng_msg_len(k->reply), &k->resp);
	if (pe != PT_OK) {
		e = fail(c, PIPECLIENT_ERR_PROTOCOL, "%s: reply from %s does not verify: %s", what,
		         c->url, pt_last_error());
		goto bad;
	}
	if (k->resp.id != id) {
		e = fail(c, PIPECLIENT_ERR_PROTOCOL,
		         "%s: reply id %" PRIu64 " does not match request id %" PRIu64, what,
		         k->resp.id, id);
		goto bad;
	}
	if (k->resp.code != PT_API_OK) {
		e = map_code(c, &k->resp, what);
		goto bad;
	}
	if (k->resp.kind != kind) {
		e = fail(c, PIPECLIENT_ERR_PROTOCOL, "%s: reply carries a %s body", what,
		         pt_api_kind_name(k->resp.kind));
		goto bad;
	}
	return ok();
bad:
	call_fini(k);
	return e;
transport:
	nng_ctx_close(ctx);
	nng_aio_free(aio);
	if (rv == NNG_ETIMEDOUT)
		return fail(c, PIPECLIENT_ERR_TIMEOUT, "%s: no reply from %s within %d ms", what,
		            c->url, timeout);
	return from_nng(c, rv, what);
}

static uint64_t fresh_id(pipeclient *c)
{
	uint64_t id;

	pthread_mutex_lock(&c->mu);
	id = c->next_id++;
	if (id == 0)
		id = c->next_id++;
	pthread_mutex_unlock(&c->mu);
	return id;
}

/* request builds r (its id and token filled here) and runs the exchange. */
static pipeclient_err request(pipeclient *c, pt_api_request *r, int extra_ms, call *k)
{
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;
	pipeclient_err e;
	pt_err pe;

	r->id = fresh_id(c);
	r->auth_token = c->token;
	if ((pe = pt_fb_builder_init(&b, 256)) != PT_OK)
		return from_pt(c, pe, "building the request");
	pe = pt_api_build_request(&b, r, &data, &size);
	if (pe != PT_OK) {
		e = from_pt(c, pe, "building the request");
		pt_fb_builder_fini(&b);
		return e;
	}
	e = send_recv(c, r->id, r->kind, data, size, extra_ms, k);
	pt_fb_builder_fini(&b);
	return e;
}

/* ------------------------------------------------------------------- views -- */

static void copy_metric(pipeclient_metric *d, const pt_api_metric_point *s)
{
	d->step = s->step;
	d->loss = s->loss;
	d->learning_rate = s->learning_rate;
	d->grad_norm = s->grad_norm;
	d->samples_per_second = s->samples_per_second;
	d->tokens_per_second = s->tokens_per_second;
	d->bubble = s->bubble;
	d->n_stages = s->n_stages;
	memcpy(d->stage_busy, s->stage_busy, sizeof(d->stage_busy));
	d->eval_loss = s->eval_loss;
	d->eval_accuracy = s->eval_accuracy;
	d->time_unix = s->time_unix;
}

/* rebuild_spec turns a verified JobSpec table (inside a reply) into a root
 * buffer of its own, so the caller may keep it after the reply is freed. */
static pt_err rebuild_spec(const uint8_t *table, void **out, size_t *len)
{
	pt_job_spec spec;
	pt_fb_builder b;
	pt_fb_ref ref;
	const uint8_t *data;
	size_t size;
	pt_err e;

	memset(&spec, 0, sizeof(spec));
	if ((e = pt_job_spec_read(table, &spec)) != PT_OK)
		return e;
	if ((e = pt_fb_builder_init(&b, 1024)) != PT_OK) {
		pt_job_spec_fini(&spec);
		return e;
	}
	e = pt_job_spec_build(&b, &spec, &ref);
	if (e == PT_OK)
		e = pt_fb_finish(&b, ref, NULL, &data, &size);
	if (e == PT_OK) {
		*out = malloc(size);
		if (*out == NULL)
			e = PT_ERR_NOMEM;
		else {
			memcpy(*out, data, size);
			*len = size;
		}
	}
	pt_fb_builder_fini(&b);
	pt_job_spec_fini(&spec);
	return e;
}

static pipeclient_err copy_job(pipeclient *c, pipeclient_job *d, const pt_api_job_info *s)
{
	pt_err pe;

	memset(d, 0, sizeof(*d));
	d->id = s->id;
	d->state = (pipeclient_job_state)s->state;
	d->step = s->step;
	d->steps = s->steps;
	d->submitted_unix = s->submitted_unix;
	d->started_unix = s->started_unix;
	d->finished_unix = s->finished_unix;
	d->has_last = s->has_last;
	if (s->has_last)
		copy_metric(&d->last, &s->last);
	else
		d->last.eval_loss = d->last.eval_accuracy = NAN;
	d->name = strdup(s->name ? s->name : "");
	d->message = strdup(s->message ? s->message : "");
	if (d->name == NULL || d->message == NULL) {
		pipeclient_job_fini(d);
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	}
	if (s->spec_table != NULL) {
		pe = rebuild_spec(s->spec_table, &d->spec, &d->spec_len);
		if (pe != PT_OK) {
			pipeclient_job_fini(d);
			return fail(
			    c, pe == PT_ERR_NOMEM ? PIPECLIENT_ERR_NOMEM : PIPECLIENT_ERR_PROTOCOL,
			    "job %" PRIu64 ": the reply's spec: %s", s->id, pt_last_error());
		}
	}
	return PIPECLIENT_OK;
}

int pipeclient_job_virtual_stages(const pipeclient_job *j)
{
	pt_job_spec s;
	int v = 1;

	if (j == NULL || j->spec == NULL)
		return 1;
	memset(&s, 0, sizeof(s));
	if (pt_job_spec_decode(j->spec, j->spec_len, &s) == PT_OK && s.schedule != NULL &&
	    strcmp(s.schedule, "interleaved") == 0)
		v = s.virtual_stages > 1 ? s.virtual_stages : 2;
	pt_clear_error();
	pt_job_spec_fini(&s);
	return v;
}

void pipeclient_job_fini(pipeclient_job *j)
{
	if (j == NULL)
		return;
	free(j->name);
	free(j->message);
	free(j->spec);
	memset(j, 0, sizeof(*j));
}

void pipeclient_jobs_free(pipeclient_job *jobs, size_t n)
{
	if (jobs == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		pipeclient_job_fini(&jobs[i]);
	free(jobs);
}

/* ------------------------------------------------------------------- calls -- */

static pipeclient_err submit_raw(pipeclient *c, const void *spec, size_t len, uint64_t *job)
{
	pt_fb_builder b;
	const uint8_t *data;
	size_t size;
	uint64_t id = fresh_id(c);
	pipeclient_err e;
	pt_err pe;
	call k;

	if ((pe = pt_fb_builder_init(&b, len + 256)) != PT_OK)
		return from_pt(c, pe, "building the request");
	pe = pt_api_build_submit_raw(&b, id, c->token, spec, len, &data, &size);
	if (pe != PT_OK) {
		e = from_pt(c, pe, "job spec");
		pt_fb_builder_fini(&b);
		return e;
	}
	e = send_recv(c, id, PT_API_SUBMIT_JOB, data, size, 0, &k);
	pt_fb_builder_fini(&b);
	if (e != PIPECLIENT_OK)
		return e;
	*job = k.resp.job;
	call_fini(&k);
	return ok();
}

pipeclient_err pipeclient_submit_spec(pipeclient *c, const void *spec, size_t len, uint64_t *job)
{
	void *copy;
	pipeclient_err e;

	if (c == NULL || spec == NULL || job == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_submit_spec: NULL argument");
	/* The verifier needs 4-byte alignment; the caller's buffer may lack it. */
	if (((uintptr_t)spec & 3u) == 0)
		return submit_raw(c, spec, len, job);
	copy = malloc(len ? len : 1);
	if (copy == NULL)
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	memcpy(copy, spec, len);
	e = submit_raw(c, copy, len, job);
	free(copy);
	return e;
}

pipeclient_err pipeclient_submit_file(pipeclient *c, const char *path, uint64_t *job)
{
	void *buf = NULL;
	size_t len = 0;
	pipeclient_err e;
	pt_err pe;

	if (c == NULL || path == NULL || job == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_submit_file: NULL argument");
	pt_clear_error();
	if ((pe = pt_job_spec_load_file(path, &buf, &len)) != PT_OK)
		return from_pt(c, pe, NULL); /* its messages start with the path */
	e = submit_raw(c, buf, len, job);
	free(buf);
	return e;
}

pipeclient_err pipeclient_plan_file(pipeclient *c, const char *path, const int *stages,
                                    int n_stages, const int *microbatches, int n_microbatches,
                                    pipeclient_plan **out, size_t *n)
{
	void *buf = NULL;
	size_t len = 0, size;
	pt_job_spec spec;
	pt_api_request q;
	pt_api_plan pl;
	pt_fb_builder b;
	const uint8_t *data;
	pipeclient_plan *arr = NULL;
	pipeclient_err e;
	uint64_t id;
	pt_err pe;
	call k;

	if (c == NULL || path == NULL || out == NULL || n == NULL ||
	    (n_stages > 0 && stages == NULL) || (n_microbatches > 0 && microbatches == NULL))
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_plan_file: NULL argument");
	*out = NULL;
	*n = 0;
	if (n_stages < 0 || n_stages > PT_API_MAX_PLAN_CANDIDATES || n_microbatches < 0 ||
	    n_microbatches > PT_API_MAX_PLAN_CANDIDATES)
		return fail(c, PIPECLIENT_ERR_INVALID,
		            "pipeclient_plan_file: at most %d candidates",
		            PT_API_MAX_PLAN_CANDIDATES);
	pt_clear_error();
	if ((pe = pt_job_spec_load_file(path, &buf, &len)) != PT_OK)
		return from_pt(c, pe, NULL);
	memset(&spec, 0, sizeof(spec));
	pe = pt_job_spec_decode(buf, len, &spec);
	free(buf);
	if (pe != PT_OK) {
		pt_job_spec_fini(&spec);
		return from_pt(c, pe, "job spec");
	}
	id = fresh_id(c);
	pt_api_request_init(&q, PT_API_PLAN_JOB);
	q.id = id;
	q.auth_token = c->token;
	q.spec = &spec;
	for (int i = 0; i < n_stages; i++)
		q.plan_stages[i] = stages[i];
	for (int i = 0; i < n_microbatches; i++)
		q.plan_microbatches[i] = microbatches[i];
	q.n_plan_stages = n_stages;
	q.n_plan_microbatches = n_microbatches;
	if ((pe = pt_fb_builder_init(&b, len + 512)) != PT_OK) {
		pt_job_spec_fini(&spec);
		return from_pt(c, pe, "building the request");
	}
	pe = pt_api_build_request(&b, &q, &data, &size);
	pt_job_spec_fini(&spec);
	if (pe != PT_OK) {
		pt_fb_builder_fini(&b);
		return from_pt(c, pe, "job spec");
	}
	/* Measuring a model's layers takes the server a while. */
	e = send_recv(c, id, PT_API_PLAN_JOB, data, size, 300000, &k);
	pt_fb_builder_fini(&b);
	if (e != PIPECLIENT_OK)
		return e;
	if (k.resp.n_plans > 0 && (arr = calloc(k.resp.n_plans, sizeof(*arr))) == NULL)
		e = fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; e == PIPECLIENT_OK && i < k.resp.n_plans; i++) {
		bool ok = pt_api_response_plan(&k.resp, i, &pl) == PT_OK;
		/* Interleaved: boundaries and stage_bytes count stages * vs. */
		int vs = ok && pl.virtual_stages > 1 ? pl.virtual_stages : 1;
		if (!ok || pl.stages < 1 || pl.virtual_stages < 0 || pl.virtual_stages > 8 ||
		    pl.stages * vs > PIPECLIENT_MAX_STAGES ||
		    pl.n_boundaries > pl.stages * vs + 1 || pl.n_stage_bytes > pl.stages * vs) {
			e = fail(c, PIPECLIENT_ERR_PROTOCOL, "PlanJob: plan %zu", i);
			break;
		}
		snprintf(arr[i].schedule, sizeof(arr[i].schedule), "%s",
		         pl.schedule ? pl.schedule : "");
		arr[i].stages = pl.stages;
		arr[i].microbatches = pl.microbatches;
		arr[i].virtual_stages = vs;
		arr[i].step_seconds = pl.step_seconds;
		arr[i].bubble = pl.bubble;
		arr[i].samples_per_second = pl.samples_per_second;
		for (int s = 0; s < pl.n_boundaries; s++)
			arr[i].boundaries[s] = pl.boundaries[s];
		for (int s = 0; s < pl.n_stage_bytes; s++)
			arr[i].stage_bytes[s] = pl.stage_bytes[s];
	}
	size_t got = k.resp.n_plans;
	call_fini(&k);
	if (e != PIPECLIENT_OK) {
		free(arr);
		return e;
	}
	*out = arr;
	*n = arr ? got : 0;
	return ok();
}

pipeclient_err pipeclient_submit_json(pipeclient *c, const char *text, size_t len, uint64_t *job)
{
	pt_fb_builder b;
	pt_fb_ref ref;
	const uint8_t *data;
	size_t size;
	pipeclient_err e;
	pt_err pe;

	if (c == NULL || text == NULL || job == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_submit_json: NULL argument");
	pt_clear_error();
	if ((pe = pt_fb_builder_init(&b, len + 256)) != PT_OK)
		return from_pt(c, pe, "job JSON");
	pe = pt_job_spec_from_json(&b, text, len, &ref);
	if (pe == PT_OK)
		pe = pt_fb_finish(&b, ref, NULL, &data, &size);
	if (pe != PT_OK) {
		e = from_pt(c, pe, "job JSON");
		pt_fb_builder_fini(&b);
		return e;
	}
	e = submit_raw(c, data, size, job);
	pt_fb_builder_fini(&b);
	return e;
}

/* get_job sends GetJob for job; on success *k holds the reply (call_fini
 * it) and *info the job, a view into it. */
static pipeclient_err get_job(pipeclient *c, uint64_t job, call *k, pt_api_job_info *info)
{
	pt_api_request r;
	pipeclient_err e;

	pt_api_request_init(&r, PT_API_GET_JOB);
	r.job = job;
	if ((e = request(c, &r, 0, k)) != PIPECLIENT_OK)
		return e;
	if (k->resp.n_jobs != 1 || pt_api_response_job(&k->resp, 0, info) != PT_OK) {
		e = fail(c, PIPECLIENT_ERR_PROTOCOL, "GetJob: reply holds %zu jobs",
		         k->resp.n_jobs);
		call_fini(k);
	}
	return e;
}

pipeclient_err pipeclient_get(pipeclient *c, uint64_t job, pipeclient_job *out)
{
	pt_api_job_info info;
	pipeclient_err e;
	call k;

	if (out != NULL)
		memset(out, 0, sizeof(*out));
	if (c == NULL || out == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_get: NULL argument");
	if ((e = get_job(c, job, &k, &info)) != PIPECLIENT_OK)
		return e;
	e = copy_job(c, out, &info);
	call_fini(&k);
	return e == PIPECLIENT_OK ? ok() : e;
}

pipeclient_err pipeclient_stages(pipeclient *c, uint64_t job, pipeclient_stage **out, size_t *n)
{
	pt_api_job_info info;
	pt_api_stage_stats st;
	pipeclient_stage *arr = NULL;
	pipeclient_err e;
	call k;

	if (c == NULL || out == NULL || n == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_stages: NULL argument");
	*out = NULL;
	*n = 0;
	if ((e = get_job(c, job, &k, &info)) != PIPECLIENT_OK)
		return e;
	if (info.n_stages > 0 && (arr = calloc(info.n_stages, sizeof(*arr))) == NULL)
		e = fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; e == PIPECLIENT_OK && i < info.n_stages; i++) {
		if (pt_api_job_stage(&info, i, &st) != PT_OK) {
			e = fail(c, PIPECLIENT_ERR_PROTOCOL, "GetJob: stage entry %zu", i);
			break;
		}
		arr[i] = (pipeclient_stage){.stage = st.stage,
		                            .busy_seconds = st.busy_seconds,
		                            .has_comm = st.has_comm,
		                            .messages_sent = st.messages_sent,
		                            .messages_received = st.messages_received,
		                            .bytes_sent = st.bytes_sent,
		                            .bytes_received = st.bytes_received,
		                            .bytes_raw_sent = st.bytes_raw_sent,
		                            .errors = st.errors,
		                            .timeouts = st.timeouts,
		                            .reconnects = st.reconnects};
	}
	call_fini(&k);
	if (e != PIPECLIENT_OK) {
		free(arr);
		return e;
	}
	*out = arr;
	*n = arr ? info.n_stages : 0;
	return ok();
}

pipeclient_err pipeclient_timeline(pipeclient *c, uint64_t job, pipeclient_task **out, size_t *n)
{
	static const char kinds[] = "FB?W";
	pt_api_job_info info;
	pt_api_task_span t;
	pipeclient_task *arr = NULL;
	pipeclient_err e;
	call k;

	if (c == NULL || out == NULL || n == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_timeline: NULL argument");
	*out = NULL;
	*n = 0;
	if ((e = get_job(c, job, &k, &info)) != PIPECLIENT_OK)
		return e;
	if (info.n_timeline > 0 && (arr = calloc(info.n_timeline, sizeof(*arr))) == NULL)
		e = fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; e == PIPECLIENT_OK && i < info.n_timeline; i++) {
		if (pt_api_job_task(&info, i, &t) != PT_OK || t.kind > 3) {
			e = fail(c, PIPECLIENT_ERR_PROTOCOL, "GetJob: timeline task %zu", i);
			break;
		}
		arr[i] = (pipeclient_task){.stage = t.stage,
		                           .kind = kinds[t.kind],
		                           .microbatch = t.microbatch,
		                           .start = t.start,
		                           .end = t.end};
	}
	call_fini(&k);
	if (e != PIPECLIENT_OK) {
		free(arr);
		return e;
	}
	*out = arr;
	*n = arr ? info.n_timeline : 0;
	return ok();
}

pipeclient_err pipeclient_list(pipeclient *c, pipeclient_job **jobs, size_t *n)
{
	pt_api_request r;
	pt_api_job_info info;
	pipeclient_job *arr;
	pipeclient_err e = PIPECLIENT_OK;
	size_t i;
	call k;

	if (c == NULL || jobs == NULL || n == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_list: NULL argument");
	*jobs = NULL;
	*n = 0;
	pt_api_request_init(&r, PT_API_LIST_JOBS);
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	arr = calloc(k.resp.n_jobs ? k.resp.n_jobs : 1, sizeof(*arr));
	if (arr == NULL) {
		call_fini(&k);
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	}
	for (i = 0; i < k.resp.n_jobs && e == PIPECLIENT_OK; i++) {
		if (pt_api_response_job(&k.resp, i, &info) != PT_OK)
			e = fail(c, PIPECLIENT_ERR_PROTOCOL, "ListJobs: job %zu: %s", i,
			         pt_last_error());
		else
			e = copy_job(c, &arr[i], &info);
	}
	if (e != PIPECLIENT_OK) {
		pipeclient_jobs_free(arr, k.resp.n_jobs);
		call_fini(&k);
		return e;
	}
	*jobs = arr;
	*n = k.resp.n_jobs;
	call_fini(&k);
	return ok();
}

pipeclient_err pipeclient_cancel(pipeclient *c, uint64_t job, pipeclient_job_state *state)
{
	pt_api_request r;
	pipeclient_err e;
	call k;

	if (c == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_cancel: NULL handle");
	pt_api_request_init(&r, PT_API_CANCEL_JOB);
	r.job = job;
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	if (state != NULL)
		*state = (pipeclient_job_state)k.resp.state;
	call_fini(&k);
	return ok();
}

pipeclient_err pipeclient_watch(pipeclient *c, uint64_t job, int64_t after, int wait_ms,
                                pipeclient_metric_fn fn, void *ctx, pipeclient_job_state *final)
{
	pt_api_request r;
	pt_api_metric_point p;
	pipeclient_metric m;
	pipeclient_err e;
	bool ended;
	call k;

	if (c == NULL || fn == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_watch: NULL argument");
	if (wait_ms < 0)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_watch: wait_ms %d", wait_ms);
	if (wait_ms == 0)
		wait_ms = 1000;
	for (;;) {
		pt_api_request_init(&r, PT_API_WATCH_METRICS);
		r.job = job;
		r.cursor = after;
		r.wait_ms = wait_ms;
		if ((e = request(c, &r, wait_ms, &k)) != PIPECLIENT_OK)
			return e;
		if (final != NULL)
			*final = (pipeclient_job_state)k.resp.state;
		for (size_t i = 0; i < k.resp.n_points; i++) {
			if (pt_api_response_point(&k.resp, i, &p) != PT_OK) {
				e = fail(c, PIPECLIENT_ERR_PROTOCOL, "WatchMetrics: point %zu: %s",
				         i, pt_last_error());
				call_fini(&k);
				return e;
			}
			if (p.step <= after)
				continue; /* never report a step twice */
			copy_metric(&m, &p);
			after = p.step;
			if (!fn(ctx, job, &m)) {
				call_fini(&k);
				return fail(c, PIPECLIENT_ERR_STOPPED,
				            "watch of job %" PRIu64 " stopped at step %" PRId64,
				            job, after);
			}
		}
		if (k.resp.cursor > after)
			after = k.resp.cursor;
		ended = k.resp.ended;
		call_fini(&k);
		if (ended)
			return ok();
	}
}

pipeclient_err pipeclient_list_checkpoints(pipeclient *c, uint64_t job, pipeclient_checkpoint **out,
                                           size_t *n)
{
	pt_api_request r;
	pt_api_checkpoint_info ci;
	pipeclient_checkpoint *arr;
	pipeclient_err e;
	call k;

	if (c == NULL || out == NULL || n == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID,
		            "pipeclient_list_checkpoints: NULL argument");
	*out = NULL;
	*n = 0;
	pt_api_request_init(&r, PT_API_LIST_CHECKPOINTS);
	r.job = job;
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	arr = calloc(k.resp.n_checkpoints ? k.resp.n_checkpoints : 1, sizeof(*arr));
	if (arr == NULL) {
		call_fini(&k);
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < k.resp.n_checkpoints; i++) {
		if (pt_api_response_checkpoint(&k.resp, i, &ci) != PT_OK) {
			free(arr);
			call_fini(&k);
			return fail(c, PIPECLIENT_ERR_PROTOCOL, "ListCheckpoints: %s",
			            pt_last_error());
		}
		arr[i].step = ci.step;
		arr[i].size = ci.size;
		snprintf(arr[i].sha256, sizeof(arr[i].sha256), "%s", ci.sha256 ? ci.sha256 : "");
	}
	*out = arr;
	*n = k.resp.n_checkpoints;
	call_fini(&k);
	return ok();
}

pipeclient_err pipeclient_info(pipeclient *c, pipeclient_server_info *out)
{
	pt_api_request r;
	pipeclient_err e;
	call k;

	if (c == NULL || out == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_info: NULL argument");
	memset(out, 0, sizeof(*out));
	pt_api_request_init(&r, PT_API_SERVER_INFO);
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	snprintf(out->version, sizeof(out->version), "%s",
	         k.resp.info.version ? k.resp.info.version : "");
	snprintf(out->device, sizeof(out->device), "%s",
	         k.resp.info.device ? k.resp.info.device : "");
	out->protocol = k.resp.info.protocol;
	out->jobs_queued = k.resp.info.jobs_queued;
	out->jobs_running = k.resp.info.jobs_running;
	out->uptime_seconds = k.resp.info.uptime_seconds;
	call_fini(&k);
	return ok();
}

/* info_string asks for ServerInfo and copies the string field that pick
 * chooses into buf. */
static pipeclient_err info_string(pipeclient *c, char *buf, size_t cap, const char *what,
                                  const char *(*pick)(const pt_api_server_info *))
{
	pt_api_request r;
	call k;
	pipeclient_err e;
	const char *v;

	if (c == NULL || buf == NULL || cap == 0)
		return fail(c, PIPECLIENT_ERR_INVALID, "%s: NULL argument", what);
	buf[0] = '\0';
	pt_api_request_init(&r, PT_API_SERVER_INFO);
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	v = pick(&k.resp.info);
	snprintf(buf, cap, "%s", v ? v : "");
	call_fini(&k);
	return ok();
}

static const char *pick_kernels(const pt_api_server_info *i)
{
	return i->kernels;
}

static const char *pick_devices(const pt_api_server_info *i)
{
	return i->devices;
}

pipeclient_err pipeclient_kernels(pipeclient *c, char *buf, size_t cap)
{
	return info_string(c, buf, cap, "pipeclient_kernels", pick_kernels);
}

pipeclient_err pipeclient_devices(pipeclient *c, char *buf, size_t cap)
{
	return info_string(c, buf, cap, "pipeclient_devices", pick_devices);
}

/* -------------------------------------------------------------- checkpoint -- */

static pipeclient_err write_all(pipeclient *c, int fd, const void *data, size_t n, uint64_t off,
                                const char *path)
{
	const uint8_t *p = data;

	while (n > 0) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return fail(c, PIPECLIENT_ERR_IO, "%s: write: %s", path,
			            w < 0 ? strerror(errno) : "no progress");
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return PIPECLIENT_OK;
}

/* hash_prefix feeds the first n bytes of fd (a resumed .part) into h. */
static pipeclient_err hash_prefix(pipeclient *c, int fd, uint64_t n, pt_sha256_ctx *h,
                                  const char *path)
{
	static const size_t bufsz = 1u << 20;
	uint8_t *buf = malloc(bufsz);
	uint64_t off = 0;

	if (buf == NULL)
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	while (off < n) {
		size_t want = n - off < bufsz ? (size_t)(n - off) : bufsz;
		ssize_t r = pread(fd, buf, want, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			free(buf);
			return fail(c, PIPECLIENT_ERR_IO, "%s: read: %s", path,
			            r < 0 ? strerror(errno) : "file shrank");
		}
		pt_sha256_update(h, buf, (size_t)r);
		off += (uint64_t)r;
	}
	free(buf);
	return PIPECLIENT_OK;
}

/* sync_dir makes a rename in path's directory durable. */
static void sync_dir(const char *path)
{
	char *copy = strdup(path);
	int fd;

	if (copy == NULL)
		return;
	fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	free(copy);
}

/* One download attempt from the .part's current size. *stale is set when a
 * resumed prefix turned out not to match (the caller restarts from 0). */
static pipeclient_err fetch_once(pipeclient *c, uint64_t job, int64_t step, int fd,
                                 const char *part, pipeclient_progress_fn fn, void *ctx,
                                 pipeclient_checkpoint *info, bool *stale)
{
	pt_api_request r;
	pt_sha256_ctx h;
	uint8_t digest[PT_SHA256_BYTES];
	char hex[PT_SHA256_HEX];
	uint64_t off, start, total = 0;
	bool first = true;
	struct stat st;
	pipeclient_err e;
	call k;

	*stale = false;
	if (fstat(fd, &st) != 0)
		return fail(c, PIPECLIENT_ERR_IO, "%s: %s", part, strerror(errno));
	start = off = (uint64_t)st.st_size;
	pt_sha256_init(&h);
	for (;;) {
		pt_api_request_init(&r, PT_API_FETCH_CHECKPOINT);
		r.job = job;
		r.step = step;
		r.offset = off;
		r.length = c->fetch_chunk; /* set at connect, read-only since */
		e = request(c, &r, 0, &k);
		if (e == PIPECLIENT_ERR_SERVER_BAD_REQUEST && first && off > 0) {
			/* Most likely an offset past the end: a .part of a larger file. */
			*stale = true;
			return e;
		}
		if (e != PIPECLIENT_OK)
			return e;
		if (first) {
			/* Pin the step so every range comes from one file even when
			 * a newer checkpoint appears meanwhile. */
			step = k.resp.step;
			total = k.resp.total_size;
			info->step = k.resp.step;
			info->size = total;
			snprintf(info->sha256, sizeof(info->sha256), "%s",
			         k.resp.sha256 ? k.resp.sha256 : "");
			if (strlen(info->sha256) != 64) {
				call_fini(&k);
				return fail(c, PIPECLIENT_ERR_PROTOCOL,
				            "FetchCheckpoint: reply without a SHA-256");
			}
			if (off > total) {
				call_fini(&k);
				*stale = true;
				return PIPECLIENT_ERR_CHECKSUM;
			}
			if ((e = hash_prefix(c, fd, off, &h, part)) != PIPECLIENT_OK) {
				call_fini(&k);
				return e;
			}
			first = false;
		} else if (k.resp.total_size != total || k.resp.step != step ||
		           strcmp(k.resp.sha256 ? k.resp.sha256 : "", info->sha256) != 0) {
			call_fini(&k);
			return fail(c, PIPECLIENT_ERR_PROTOCOL,
			            "FetchCheckpoint: the file changed during the download");
		}
		if (k.resp.offset != off || k.resp.data_len > total - off ||
		    (k.resp.data_len == 0 && off < total)) {
			call_fini(&k);
			return fail(c, PIPECLIENT_ERR_PROTOCOL,
			            "FetchCheckpoint: range at %" PRIu64 " of %zu bytes for offset "
			            "%" PRIu64 " of %" PRIu64,
			            k.resp.offset, k.resp.data_len, off, total);
		}
		e = write_all(c, fd, k.resp.data, k.resp.data_len, off, part);
		if (e == PIPECLIENT_OK)
			pt_sha256_update(&h, k.resp.data, k.resp.data_len);
		off += k.resp.data_len;
		call_fini(&k);
		if (e != PIPECLIENT_OK)
			return e;
		if (fn != NULL && !fn(ctx, off, total))
			return fail(c, PIPECLIENT_ERR_STOPPED,
			            "download stopped at %" PRIu64 " of %" PRIu64
			            " bytes; %s is kept for a resume",
			            off, total, part);
		if (off == total)
			break;
	}
	pt_sha256_final(&h, digest);
	pt_sha256_hex(digest, hex);
	if (strcmp(hex, info->sha256) != 0) {
		*stale = start > 0;
		return fail(c, PIPECLIENT_ERR_CHECKSUM,
		            "checkpoint step %" PRId64 ": SHA-256 %s, server says %s", info->step,
		            hex, info->sha256);
	}
	return PIPECLIENT_OK;
}

pipeclient_err pipeclient_fetch_checkpoint(pipeclient *c, uint64_t job, int64_t step,
                                           const char *path, pipeclient_progress_fn fn, void *ctx,
                                           pipeclient_checkpoint *out)
{
	pipeclient_checkpoint info;
	pipeclient_err e;
	char *part;
	bool stale;
	int fd;

	if (c == NULL || path == NULL || path[0] == '\0')
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_fetch_checkpoint: no path");
	memset(&info, 0, sizeof(info));
	if (asprintf(&part, "%s.part", path) < 0)
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		e = fail(c, PIPECLIENT_ERR_IO, "%s: %s", part, strerror(errno));
		free(part);
		return e;
	}
	e = fetch_once(c, job, step, fd, part, fn, ctx, &info, &stale);
	if (e != PIPECLIENT_OK && stale) {
		/* The .part belonged to another file: start again from nothing. */
		if (ftruncate(fd, 0) != 0) {
			e = fail(c, PIPECLIENT_ERR_IO, "%s: truncate: %s", part, strerror(errno));
		} else {
			e = fetch_once(c, job, step, fd, part, fn, ctx, &info, &stale);
		}
	}
	if (e == PIPECLIENT_OK && fsync(fd) != 0)
		e = fail(c, PIPECLIENT_ERR_IO, "%s: fsync: %s", part, strerror(errno));
	close(fd);
	if (e == PIPECLIENT_OK) {
		if (rename(part, path) != 0)
			e = fail(c, PIPECLIENT_ERR_IO, "rename %s to %s: %s", part, path,
			         strerror(errno));
		else
			sync_dir(path);
	} else if (e == PIPECLIENT_ERR_CHECKSUM) {
		unlink(part); /* bad data: do not resume from it */
	}
	free(part);
	if (e != PIPECLIENT_OK)
		return e;
	if (out != NULL)
		*out = info;
	return ok();
}

pipeclient_err pipeclient_workers(pipeclient *c, pipeclient_worker **out, size_t *n)
{
	pt_api_request r;
	pt_api_worker_info wi;
	pipeclient_worker *arr;
	pipeclient_err e;
	call k;

	if (c == NULL || out == NULL || n == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_workers: NULL argument");
	*out = NULL;
	*n = 0;
	pt_api_request_init(&r, PT_API_LIST_WORKERS);
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	arr = calloc(k.resp.n_workers ? k.resp.n_workers : 1, sizeof(*arr));
	if (arr == NULL) {
		call_fini(&k);
		return fail(c, PIPECLIENT_ERR_NOMEM, "out of memory");
	}
	for (size_t i = 0; i < k.resp.n_workers; i++) {
		if (pt_api_response_worker(&k.resp, i, &wi) != PT_OK) {
			free(arr);
			call_fini(&k);
			return fail(c, PIPECLIENT_ERR_PROTOCOL, "ListWorkers: %s", pt_last_error());
		}
		snprintf(arr[i].url, sizeof(arr[i].url), "%s", wi.url ? wi.url : "");
		snprintf(arr[i].state, sizeof(arr[i].state), "%s",
		         pt_api_worker_state_name(wi.state));
		arr[i].job = wi.job;
		arr[i].draining = wi.draining;
		arr[i].since_unix = wi.since_unix;
		arr[i].last_heartbeat_unix = wi.last_heartbeat_unix;
		snprintf(arr[i].message, sizeof(arr[i].message), "%s",
		         wi.message ? wi.message : "");
		snprintf(arr[i].devices, sizeof(arr[i].devices), "%s",
		         wi.devices ? wi.devices : "");
	}
	*out = arr;
	*n = k.resp.n_workers;
	call_fini(&k);
	return ok();
}

pipeclient_err pipeclient_drain_worker(pipeclient *c, const char *url)
{
	pt_api_request r;
	pipeclient_err e;
	call k;

	if (c == NULL || url == NULL)
		return fail(c, PIPECLIENT_ERR_INVALID, "pipeclient_drain_worker: NULL argument");
	pt_api_request_init(&r, PT_API_DRAIN_WORKER);
	r.url = url;
	if ((e = request(c, &r, 0, &k)) != PIPECLIENT_OK)
		return e;
	call_fini(&k);
	return ok();
}
