/* workers.c - the coordinator's side of the worker protocol: get every
 * stage of a job served by a `pipeserver --worker`, connect rank 0's
 * communicator to them, and watch them with heartbeats until the job ends.
 *
 * For each worker (stage s, rank s + 1): a REQ socket to its control URL,
 * StageJoin (with the session key, drawn here per session) -> its data URL
 * and a session; then rank 0 listens on tcp://<host>:0 and every worker gets
 * StagePeers (all data URLs), after which it serves its stage on its own
 * thread until STOP. Every frame between the session's ranks carries a MAC
 * under the key, so a stage takes data only from its session's peers.
 * tls+tcp:// workers are dialed with the CA of o->tls (checked against each
 * URL's host), presenting o->tls's certificate; rank 0 then listens on
 * tls+tcp:// with that certificate.
 *
 * Heartbeats go over the same control socket (schema/stage.fbs): one thread
 * per worker sends StagePing{session} every timeout / 4 and waits for the
 * reply; a worker whose last reply is timeout_ms old (killed, hung, or behind
 * a downed link, which TCP alone does not notice) or that no longer knows the
 * session is lost: the verdict names the stage and the worker URL, and the
 * rank is marked lost in rank 0's communicator, so the coordinator's waits
 * and sends involving it fail at once instead of hanging. pt_job_workers_end
 * ends every surviving session (the workers are idle when it returns).
 * Limits: one stage per worker.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "fileio.h"
#include "handshake.h"
#include "job.h"
#include "log.h"
#include "runtime.h"

#define MAX_REPLY_BYTES (64 * 1024)
#define MIN_WAIT_MS     10
#define BUSY_RETRY_MS   200

typedef struct link {
	struct pt_job_workers *ws;
	int stage;
	const char *url; /* borrowed from the options: valid while the job runs */
	nng_socket sock;
	bool open, joined, running;
	/* One exchange at a time on sock, through aio, waited for with our own
	 * clock: nng 1.5.2 can lose a socket's receive timeout (a wait that
	 * never ends), so a late operation is cancelled instead. */
	nng_aio *aio;
	pthread_mutex_t amu;
	pthread_cond_t acv;
	bool adone;  /* under amu */
	int wait_ms; /* each send and each receive */
	uint64_t session;
	char data_url[512];
	pthread_t hb;
	bool hb_started;
	double last_ok; /* pt_now() of the last ping answered (under ws->mu) */
	bool lost;      /* under ws->mu */
	char why[640];  /* the verdict, when lost */
} link;

struct pt_job_workers {
	int n, timeout_ms;
	const pt_job_tls *tls; /* during pt_job_workers_join only */
	link links[PT_MAX_STAGES];
	pt_comm *comm; /* rank 0, owned */
	pthread_mutex_t mu;
	pthread_cond_t cv; /* stopping, or a verdict */
	bool stopping;
	int first_lost; /* -1: none */
};

static const char *const kind_name[] = {
    [PT_WORKER_PEERS] = "StagePeers",
    [PT_WORKER_JOIN] = "StageJoin",
    [PT_WORKER_PING] = "StagePing",
};

static struct timespec abs_time(double t_now_rel)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	double s = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (t_now_rel > 0 ? t_now_rel : 0);
	ts.tv_sec = (time_t)s;
	ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
	return ts;
}

/* mono_cond_init makes a condition variable timed on CLOCK_MONOTONIC (what
 * abs_time gives). */
static void mono_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
}

static void aio_cb(void *arg)
{
	link *l = arg;
	pthread_mutex_lock(&l->amu);
	l->adone = true;
	pthread_cond_signal(&l->acv);
	pthread_mutex_unlock(&l->amu);
}

/* aio_run sends (send) or receives on l->aio and waits up to l->wait_ms,
 * cancelling the operation when it is late; returns nng's result. */
static int aio_run(link *l, bool send)
{
	struct timespec until = abs_time(l->wait_ms / 1000.0);
	bool done;

	pthread_mutex_lock(&l->amu);
	l->adone = false;
	pthread_mutex_unlock(&l->amu);
	if (send)
		nng_send_aio(l->sock, l->aio);
	else
		nng_recv_aio(l->sock, l->aio);
	pthread_mutex_lock(&l->amu);
	while (!l->adone && pthread_cond_timedwait(&l->acv, &l->amu, &until) == 0)
		;
	done = l->adone;
	pthread_mutex_unlock(&l->amu);
	if (!done)
		nng_aio_cancel(l->aio);
	nng_aio_wait(l->aio);
	return !done && nng_aio_result(l->aio) == NNG_ECANCELED ? NNG_ETIMEDOUT
	                                                        : nng_aio_result(l->aio);
}

/* exchange sends q on l's socket and decodes the reply into r without
 * judging r->ok; *msg keeps the reply alive (r's strings point into it; the
 * caller frees it). Errors name the stage and the worker. */
static pt_err exchange(link *l, pt_fb_builder *b, const pt_worker_request *q, pt_worker_reply *r,
                       nng_msg **msg)
{
	const uint8_t *data;
	size_t size;
	nng_msg *m = NULL;
	int nrv;
	pt_err rv;

	*msg = NULL;
	if ((rv = pt_handshake_encode_request(b, q, &data, &size)) != PT_OK)
		return pt_set_error(rv, "stage %d (worker %s): %s", l->stage, l->url,
		                    pt_last_error());
	if ((nrv = nng_msg_alloc(&m, size)) != 0)
		return pt_set_error(PT_ERR_NOMEM, "stage %d (worker %s): %s", l->stage, l->url,
		                    nng_strerror(nrv));
	memcpy(nng_msg_body(m), data, size);
	nng_aio_set_msg(l->aio, m);
	if ((nrv = aio_run(l, true)) != 0) {
		nng_msg_free(m); /* a failed send leaves the message ours */
		return pt_set_error(nrv == NNG_ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_IO,
		                    "stage %d (worker %s): sending %s: %s", l->stage, l->url,
		                    kind_name[q->kind], nng_strerror(nrv));
	}
	if ((nrv = aio_run(l, false)) != 0)
		return pt_set_error(nrv == NNG_ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_IO,
		                    "stage %d (worker %s): no reply to %s: %s", l->stage, l->url,
		                    kind_name[q->kind], nng_strerror(nrv));
	*msg = m = nng_aio_get_msg(l->aio);
	/* nng bodies are only 4-byte aligned; the verifier needs no more. */
	if ((rv = pt_handshake_decode_reply(nng_msg_body(m), nng_msg_len(m), q->kind, r)) != PT_OK)
		return pt_set_error(rv, "stage %d (worker %s): %s", l->stage, l->url,
		                    pt_last_error());
	return PT_OK;
}

/* call is exchange for the handshake: a refusal is PT_ERR_STATE. */
static pt_err call(link *l, pt_fb_builder *b, const pt_worker_request *q, pt_worker_reply *r,
                   nng_msg **msg)
{
	PT_TRY(exchange(l, b, q, r, msg));
	if (!r->ok)
		return pt_set_error(PT_ERR_STATE, "stage %d (worker %s): %s", l->stage, l->url,
		                    r->message ? r->message : "refused");
	return PT_OK;
}

static void set_timeouts(link *l, int ms)
{
	l->wait_ms = ms;
}

static bool set(const char *s)
{
	return s != NULL && *s != '\0';
}

/* tls_dial gives l's dialer d the CA (and the coordinator's certificate,
 * when it has one) for a tls+tcp:// worker. */
static pt_err tls_dial(link *l, nng_dialer d)
{
	const pt_job_tls *t = l->ws->tls;
	nng_tls_config *cfg = NULL;
	char host[256], *cert = NULL, *key = NULL;
	const char *h = strstr(l->url, "://") + 3, *end;
	size_t n = 0;
	pt_err e = PT_OK;
	int rv;

	end = *h == '[' ? strchr(++h, ']') : strrchr(h, ':');
	snprintf(host, sizeof(host), "%.*s", (int)(end ? end - h : (long)strlen(h)), h);
	if (set(t->cert) && set(t->key) &&
	    ((e = pt_file_read(t->cert, 1 << 20, (void **)&cert, &n)) != PT_OK ||
	     (e = pt_file_read(t->key, 1 << 20, (void **)&key, &n)) != PT_OK)) {
		free(cert);
		return pt_set_error(e, "stage %d (worker %s): %s", l->stage, l->url,
		                    pt_last_error());
	}
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0 ||
	    (rv = nng_tls_config_ca_file(cfg, t->ca)) != 0 ||
	    (rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
	    (rv = nng_tls_config_server_name(cfg, host)) != 0 ||
	    (cert != NULL && (rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0) ||
	    (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg)) != 0)
		e = pt_set_error(PT_ERR_INVALID, "stage %d (worker %s): TLS: %s", l->stage, l->url,
		                 nng_strerror(rv));
	free(cert);
	if (key != NULL)
		memset(key, 0, n);
	free(key);
	if (cfg != NULL)
		nng_tls_config_free(cfg); /* the dialer holds its own reference */
	return e;
}

static pt_err open_link(link *l, int timeout_ms)
{
	nng_dialer d;
	int nrv;
	pt_err e;

	if ((nrv = nng_req0_open(&l->sock)) != 0)
		return pt_set_error(PT_ERR_IO, "stage %d (worker %s): %s", l->stage, l->url,
		                    nng_strerror(nrv));
	l->open = true;
	if ((nrv = nng_aio_alloc(&l->aio, aio_cb, l)) != 0)
		return pt_set_error(PT_ERR_NOMEM, "stage %d (worker %s): %s", l->stage, l->url,
		                    nng_strerror(nrv));
	nng_aio_set_timeout(l->aio, NNG_DURATION_INFINITE);
	/* One request at a time, never resent: a resent StageJoin would look
	 * like a second job to a worker that took the first. A ping that gets
	 * no reply is simply superseded by the next one. */
	set_timeouts(l, timeout_ms);
	nng_socket_set_ms(l->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(l->sock, NNG_OPT_RECVMAXSZ, MAX_REPLY_BYTES);
	if ((nrv = nng_dialer_create(&d, l->sock, l->url)) != 0)
		return pt_set_error(PT_ERR_INVALID, "stage %d (worker %s): %s", l->stage, l->url,
		                    nng_strerror(nrv));
	if (strncmp(l->url, "tls+tcp://", 10) == 0 && (e = tls_dial(l, d)) != PT_OK)
		return e;
	if ((nrv = nng_dialer_start(d, 0)) != 0)
		return pt_set_error(PT_ERR_IO, "stage %d (worker %s): cannot connect: %s", l->stage,
		                    l->url, nng_strerror(nrv));
	return PT_OK;
}

/* local_host writes the address this host has on the connection that
 * carried msg (what the worker can dial back), bracketed for IPv6. */
static void local_host(nng_msg *msg, char *out, size_t n)
{
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	snprintf(out, n, "127.0.0.1");
	if (msg == NULL || nng_pipe_get_addr(nng_msg_get_pipe(msg), NNG_OPT_LOCADDR, &sa) != 0)
		return;
	if (sa.s_family == NNG_AF_INET &&
	    inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip)) != NULL)
		snprintf(out, n, "%s", ip);
	else if (sa.s_family == NNG_AF_INET6 &&
	         inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip)) != NULL)
		snprintf(out, n, "[%s]", ip);
}

/* ----------------------------------------------------------- heartbeats -- */

/* declare records l's verdict (ws->mu held) and wakes wait_lost. */
static void declare(link *l, const char *fmt, const char *detail)
{
	pt_job_workers *ws = l->ws;
	char what[400];

	snprintf(what, sizeof(what), fmt, detail);
	snprintf(l->why, sizeof(l->why), "stage %d on worker %s: %s", l->stage, l->url, what);
	l->lost = true;
	if (ws->first_lost < 0)
		ws->first_lost = l->stage;
	pthread_cond_broadcast(&ws->cv);
}

/* hb_main pings l's session every timeout / 4 until ws stops or l is lost. */
static void *hb_main(void *arg)
{
	link *l = arg;
	pt_job_workers *ws = l->ws;
	double timeout = ws->timeout_ms / 1000.0, interval = timeout / 4;
	char secs[32];
	pt_fb_builder b;

	snprintf(secs, sizeof(secs), "%.1f", timeout);
	if (pt_fb_builder_init(&b, 256) != PT_OK) {
		pthread_mutex_lock(&ws->mu);
		declare(l, "%s", "cannot allocate its heartbeat");
		pthread_mutex_unlock(&ws->mu);
		pt_nng_comm_mark_lost(ws->comm, l->stage + 1);
		return NULL;
	}
	pthread_mutex_lock(&ws->mu);
	while (!ws->stopping && !l->lost) {
		double t0 = pt_now(), wait = l->last_ok + timeout - t0;
		pt_worker_request q = {.kind = PT_WORKER_PING, .session = l->session};
		pt_worker_reply r;
		nng_msg *msg = NULL;
		pt_err rv;
		struct timespec until;

		pthread_mutex_unlock(&ws->mu);
		wait = wait < interval ? wait : interval;
		set_timeouts(l, wait * 1000 > MIN_WAIT_MS ? (int)(wait * 1000) : MIN_WAIT_MS);
		rv = exchange(l, &b, &q, &r, &msg);
		pthread_mutex_lock(&ws->mu);
		if (rv == PT_OK && r.ok)
			l->last_ok = pt_now();
		else if (rv == PT_OK && !ws->stopping)
			declare(l, "the worker dropped the session: %s",
			        r.message ? r.message : "refused");
		else if (rv != PT_OK && rv != PT_ERR_TIMEOUT)
			pt_debug("stage %d (worker %s): ping: %s", l->stage, l->url,
			         pt_last_error());
		nng_msg_free(msg);
		if (!l->lost && !ws->stopping && pt_now() - l->last_ok >= timeout)
			declare(l, "no heartbeat for %s s", secs);
		if (l->lost) {
			pthread_mutex_unlock(&ws->mu);
			pt_warn("%s", l->why);
			pt_nng_comm_mark_lost(ws->comm, l->stage + 1);
			pthread_mutex_lock(&ws->mu);
			break;
		}
		wait = t0 + interval - pt_now();
		if (l->last_ok + timeout - pt_now() < wait)
			wait = l->last_ok + timeout - pt_now();
		until = abs_time(wait);
		while (!ws->stopping && pt_now() < t0 + interval &&
		       pthread_cond_timedwait(&ws->cv, &ws->mu, &until) == 0)
			;
	}
	pthread_mutex_unlock(&ws->mu);
	pt_fb_builder_fini(&b);
	return NULL;
}

/* ------------------------------------------------------------ lifecycle -- */

static pt_err start_heartbeats(pt_job_workers *ws)
{
	double now = pt_now();

	for (int s = 0; s < ws->n; s++) {
		link *l = &ws->links[s];
		l->last_ok = now;
		if (pthread_create(&l->hb, NULL, hb_main, l) != 0)
			return pt_set_error(PT_ERR_NOMEM, "heartbeat thread of stage %d", s);
		l->hb_started = true;
	}
	return PT_OK;
}

void pt_job_workers_stop_heartbeats(pt_job_workers *ws)
{
	if (ws == NULL)
		return;
	pthread_mutex_lock(&ws->mu);
	ws->stopping = true;
	pthread_cond_broadcast(&ws->cv);
	pthread_mutex_unlock(&ws->mu);
	for (int s = 0; s < ws->n; s++)
		if (ws->links[s].hb_started) {
			pthread_join(ws->links[s].hb, NULL);
			ws->links[s].hb_started = false;
		}
}

void pt_job_workers_end(pt_job_workers *ws)
{
	pt_fb_builder b;
	bool have_b;

	if (ws == NULL)
		return;
	pt_job_workers_stop_heartbeats(ws);
	/* End the sessions: a joined one is cancelled, a running one's stage
	 * returns, and the worker is idle when it answers. Lost workers are left
	 * alone (they end a session on their own when the pings stop). */
	have_b = pt_fb_builder_init(&b, 256) == PT_OK;
	for (int s = 0; s < ws->n; s++) {
		link *l = &ws->links[s];
		if (have_b && (l->joined || l->running) && !l->lost) {
			pt_worker_request q = {.kind = PT_WORKER_PEERS, .session = l->session};
			pt_worker_reply r;
			nng_msg *msg = NULL;
			set_timeouts(l, ws->timeout_ms);
			if (call(l, &b, &q, &r, &msg) != PT_OK)
				pt_debug("ending the session: %s", pt_last_error());
			nng_msg_free(msg);
		}
		if (l->open)
			nng_close(l->sock); /* nothing is pending on it */
		if (l->aio != NULL)
			nng_aio_free(l->aio);
		pthread_cond_destroy(&l->acv);
		pthread_mutex_destroy(&l->amu);
	}
	if (have_b)
		pt_fb_builder_fini(&b);
	pt_comm_destroy(ws->comm);
	pthread_cond_destroy(&ws->cv);
	pthread_mutex_destroy(&ws->mu);
	free(ws);
}

pt_comm *pt_job_workers_comm(const pt_job_workers *ws)
{
	return ws->comm;
}

bool pt_job_workers_is_lost(pt_job_workers *ws, int stage)
{
	bool lost;

	if (ws == NULL || stage < 0 || stage >= ws->n)
		return false;
	pthread_mutex_lock(&ws->mu);
	lost = ws->links[stage].lost;
	pthread_mutex_unlock(&ws->mu);
	return lost;
}

int pt_job_workers_wait_lost(pt_job_workers *ws, int ms, char *why, size_t n)
{
	struct timespec until = abs_time(ms / 1000.0);
	int s;

	if (ws == NULL)
		return -1;
	pthread_mutex_lock(&ws->mu);
	while (ws->first_lost < 0 && !ws->stopping &&
	       pthread_cond_timedwait(&ws->cv, &ws->mu, &until) == 0)
		;
	s = ws->first_lost;
	if (s >= 0 && why != NULL && n > 0)
		snprintf(why, n, "%s", ws->links[s].why);
	pthread_mutex_unlock(&ws->mu);
	return s;
}

/* join_one sends StageJoin q to l. A worker busy with another session is
 * asked again every BUSY_RETRY_MS for up to the heartbeat timeout plus a
 * second: if that session's coordinator is gone (a server restarted after a
 * crash, resuming its job), the worker drops it within its timeout. */
static pt_err join_one(link *l, pt_fb_builder *b, const pt_worker_request *q, pt_worker_reply *r,
                       nng_msg **msg)
{
	double give_up = pt_now() + q->timeout_ms / 1000.0 + 1.0;
	pt_err rv;

	while ((rv = call(l, b, q, r, msg)) == PT_ERR_STATE && r->busy && pt_now() < give_up) {
		nng_msg_free(*msg);
		*msg = NULL;
		nanosleep(&(struct timespec){0, BUSY_RETRY_MS * 1000000L}, NULL);
	}
	return rv;
}

/* handshake_failed logs why l's handshake failed and replaces the error with
 * one that says no more than that: a job may name any address, and its
 * submitter must not learn from the error what answers there (connection
 * refused or timed out, a token refused, a worker busy, a reply that is no
 * handshake). The operator reads the reason in the log. */
static pt_err handshake_failed(const link *l)
{
	pt_warn("worker handshake failed: %s", pt_last_error());
	return pt_set_error(PT_ERR_IO, "stage %d (worker %s): " PT_JOB_WORKER_UNREACHABLE, l->stage,
	                    l->url);
}

pt_err pt_job_workers_join(const pt_job_workers_options *o, pt_job_workers **out, int *failed)
{
	const char *urls[PT_MAX_STAGES + 1];
	char host[300];
	char listen[400];
	uint8_t key[PT_COMM_KEY_BYTES];
	bool tls = false;
	int timeout = o->timeout_ms > 0 ? o->timeout_ms : PT_JOB_WORKER_TIMEOUT_MS;
	pt_job_workers *ws;
	pt_fb_builder b;
	pt_err rv = PT_OK;

	*out = NULL;
	if (failed)
		*failed = -1;
	if (o->n < 1 || o->n > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "placement.workers: %d URLs (1 to %d)", o->n,
		                    PT_MAX_STAGES);
	if ((ws = calloc(1, sizeof(*ws))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "workers");
	ws->n = o->n;
	ws->timeout_ms = timeout;
	ws->tls = &o->tls;
	ws->first_lost = -1;
	pthread_mutex_init(&ws->mu, NULL);
	mono_cond_init(&ws->cv);
	for (int s = 0; s < o->n; s++) {
		link *l = &ws->links[s];
		l->ws = ws;
		l->stage = s;
		l->url = o->urls[s];
		pthread_mutex_init(&l->amu, NULL);
		mono_cond_init(&l->acv);
	}
	for (int s = 0; s < o->n; s++)
		tls = tls || strncmp(o->urls[s], "tls+tcp://", 10) == 0;
	if (tls && !(set(o->tls.cert) && set(o->tls.key))) {
		pt_job_workers_end(ws);
		return pt_set_error(PT_ERR_INVALID,
		                    "tls+tcp:// workers need the coordinator's certificate and key "
		                    "(--tls-cert, --tls-key) for its stage data port");
	}
	if (tls && !set(o->tls.ca)) {
		pt_job_workers_end(ws);
		return pt_set_error(PT_ERR_INVALID,
		                    "tls+tcp:// workers need a CA (--worker-tls-ca)");
	}
	/* One key per session: a restart on a spare joins with a new one. */
	if ((rv = pt_comm_key_generate(key)) != PT_OK ||
	    (rv = pt_fb_builder_init(&b, 1024)) != PT_OK) {
		pt_job_workers_end(ws);
		return rv;
	}
	snprintf(host, sizeof(host), "127.0.0.1");
	if (o->advertise_host != NULL && o->advertise_host[0] != '\0')
		snprintf(host, sizeof(host),
		         strchr(o->advertise_host, ':') && o->advertise_host[0] != '[' ? "[%s]"
		                                                                       : "%s",
		         o->advertise_host);

	for (int s = 0; s < o->n && rv == PT_OK; s++) {
		link *l = &ws->links[s];
		pt_worker_request q = {.kind = PT_WORKER_JOIN,
		                       .protocol = PT_WORKER_PROTOCOL,
		                       .token = o->token,
		                       .rank = s + 1,
		                       .world = o->n + 1,
		                       .compress = o->compress,
		                       .timeout_ms = timeout,
		                       .key = key};
		pt_worker_reply r;
		nng_msg *msg = NULL;
		if ((rv = open_link(l, timeout)) == PT_OK &&
		    (rv = join_one(l, &b, &q, &r, &msg)) == PT_OK) {
			l->joined = true;
			l->session = r.session;
			if (r.data_url == NULL || r.data_url[0] == '\0' ||
			    strlen(r.data_url) >= sizeof(l->data_url))
				rv = pt_set_error(PT_ERR_FORMAT,
				                  "stage %d (worker %s): no usable data URL", s,
				                  l->url);
			else
				snprintf(l->data_url, sizeof(l->data_url), "%s", r.data_url);
			if (s == 0 && (o->advertise_host == NULL || o->advertise_host[0] == '\0'))
				local_host(msg, host, sizeof(host));
		}
		if (rv != PT_OK) {
			rv = handshake_failed(l);
			if (failed)
				*failed = s;
		}
		nng_msg_free(msg);
	}
	if (rv == PT_OK) {
		/* A send that the peer does not take within the heartbeat timeout
		 * fails: the coordinator is never stuck longer than a verdict. */
		pt_nng_options no = {.listen_url = listen,
		                     .world = o->n + 1,
		                     .rank = 0,
		                     .compress = o->compress,
		                     .send_timeout_ms = timeout,
		                     .key = key,
		                     .tls_cert_key_file = o->tls.cert,
		                     .tls_key_file = o->tls.key,
		                     .tls_ca_file = set(o->tls.ca) ? o->tls.ca : NULL};
		snprintf(listen, sizeof(listen), "%s://%s:0", tls ? "tls+tcp" : "tcp", host);
		if ((rv = pt_nng_comm_create(&ws->comm, &no)) != PT_OK)
			rv = pt_set_error(rv, "coordinator: listening on %s: %s", listen,
			                  pt_last_error());
	}
	if (rv == PT_OK) {
		urls[0] = pt_nng_comm_url(ws->comm);
		for (int s = 0; s < o->n; s++)
			urls[s + 1] = ws->links[s].data_url;
	}
	for (int s = 0; s < o->n && rv == PT_OK; s++) {
		link *l = &ws->links[s];
		pt_worker_request q = {
		    .kind = PT_WORKER_PEERS, .session = l->session, .n_urls = o->n + 1};
		pt_worker_reply r;
		nng_msg *msg = NULL;
		memcpy(q.urls, urls, sizeof(char *) * (size_t)(o->n + 1));
		rv = call(l, &b, &q, &r, &msg);
		nng_msg_free(msg);
		if (rv == PT_OK) {
			l->joined = false;
			l->running = true;
		} else {
			rv = handshake_failed(l);
			if (failed)
				*failed = s;
		}
	}
	if (rv == PT_OK && (rv = pt_nng_comm_connect(ws->comm, urls)) != PT_OK)
		rv =
		    pt_set_error(rv, "coordinator: connecting to the workers: %s", pt_last_error());
	if (rv == PT_OK)
		rv = start_heartbeats(ws);
	pt_fb_builder_fini(&b);
	memset(key, 0, sizeof(key)); /* the communicators hold their copies */
	ws->tls = NULL;              /* o's: needed only to dial */
	if (rv != PT_OK) {
		/* End the sessions made so far, so those workers are free again at
		 * once (best effort; they also expire), keeping this error. */
		char msg_copy[1024];
		snprintf(msg_copy, sizeof(msg_copy), "%s", pt_last_error());
		pt_job_workers_end(ws);
		return pt_set_error(rv, "%s", msg_copy);
	}
	*out = ws;
	return PT_OK;
}

/* ---------------------------------------------------------- allow list -- */

/* An allow-list entry or a URL host: an address (family AF_INET or AF_INET6,
 * addr in network order; IPv4-mapped IPv6 counts as IPv4) or a name. */
typedef struct net_addr {
	int family; /* AF_INET, AF_INET6, or 0 for a name */
	uint8_t addr[16];
	int prefix; /* CIDR prefix length (the full length for an address) */
	char name[256];
} net_addr;

static bool is_name(const char *s)
{
	if (s[0] == '\0' || strlen(s) > 253)
		return false;
	for (const char *p = s; *p; p++)
		if (!(isalnum((unsigned char)*p) || *p == '-' || *p == '.'))
			return false;
	return true;
}

/* parse_addr reads "ADDR", "ADDR/LEN" (when cidr) or a host name from the n
 * bytes at s. */
static bool parse_addr(const char *s, size_t n, bool cidr, net_addr *a)
{
	char buf[300], *slash, *end;
	long len = -1;

	memset(a, 0, sizeof(*a));
	if (n == 0 || n >= sizeof(buf))
		return false;
	memcpy(buf, s, n);
	buf[n] = '\0';
	if (cidr && (slash = strchr(buf, '/')) != NULL) {
		*slash = '\0';
		if (!isdigit((unsigned char)slash[1]))
			return false;
		len = strtol(slash + 1, &end, 10);
		if (*end != '\0')
			return false;
	}
	if (inet_pton(AF_INET, buf, a->addr) == 1) {
		a->family = AF_INET;
		a->prefix = 32;
	} else if (inet_pton(AF_INET6, buf, a->addr) == 1) {
		static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		a->family = AF_INET6;
		a->prefix = 128;
		if (memcmp(a->addr, mapped, 12) == 0 && (len < 0 || len >= 96)) {
			memmove(a->addr, a->addr + 12, 4);
			a->family = AF_INET;
			a->prefix = 32;
			if (len >= 0)
				len -= 96;
		}
	} else {
		if (len >= 0 || !is_name(buf))
			return false;
		snprintf(a->name, sizeof(a->name), "%s", buf);
		return true;
	}
	if (len >= 0) {
		if (len > a->prefix)
			return false;
		a->prefix = (int)len;
	}
	return true;
}

static bool addr_match(const net_addr *net, const net_addr *host)
{
	int full, rest;

	if (net->family == 0 || host->family == 0)
		return net->family == host->family && strcasecmp(net->name, host->name) == 0;
	if (net->family != host->family)
		return false;
	full = net->prefix / 8;
	rest = net->prefix % 8;
	if (memcmp(net->addr, host->addr, (size_t)full) != 0)
		return false;
	return rest == 0 ||
	       ((net->addr[full] ^ host->addr[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

/* allow_next splits the next comma-separated entry off *p (spaces trimmed). */
static bool allow_next(const char **p, const char **e, size_t *n)
{
	while (**p == ',' || **p == ' ')
		(*p)++;
	if (**p == '\0')
		return false;
	*e = *p;
	*n = strcspn(*p, ",");
	*p += *n;
	while (*n > 0 && (*e)[*n - 1] == ' ')
		(*n)--;
	return true;
}

pt_err pt_job_worker_allow_parse(const char *allow)
{
	const char *p = allow, *e;
	size_t n;
	net_addr a;

	while (allow_next(&p, &e, &n))
		if (!parse_addr(e, n, true, &a))
			return pt_set_error(PT_ERR_INVALID,
			                    "'%.*s' is not a CIDR, an address or a host name",
			                    (int)n, e);
	return PT_OK;
}

/* url_host finds the host of a tcp:// URL ("tcp://h:p", "tcp://[v6]:p").
 * Anything else - another scheme, a local address ("tcp://a;h:p"), no
 * port - is false. */
static bool url_host(const char *url, net_addr *host)
{
	static const char *const schemes[] = {"tcp://", "tcp4://", "tcp6://"};
	const char *h = NULL, *end;

	for (size_t k = 0; k < sizeof(schemes) / sizeof(schemes[0]); k++)
		if (strncmp(url, schemes[k], strlen(schemes[k])) == 0)
			h = url + strlen(schemes[k]);
	if (h == NULL || strchr(h, ';') != NULL || strchr(h, '@') != NULL)
		return false;
	if (h[0] == '[') {
		if ((end = strchr(h, ']')) == NULL || end[1] != ':')
			return false;
		return parse_addr(h + 1, (size_t)(end - h - 1), false, host) && host->family != 0;
	}
	if ((end = strrchr(h, ':')) == NULL || memchr(h, ':', (size_t)(end - h)) != NULL)
		return false;
	return parse_addr(h, (size_t)(end - h), false, host);
}

pt_err pt_job_spec_check_workers(const pt_job_spec *s, const char *allow)
{
	if (allow == NULL || allow[0] == '\0')
		return PT_OK;
	for (int i = 0; i < s->n_workers; i++) {
		const char *u = s->workers[i] ? s->workers[i] : "", *p = allow, *e;
		bool ok = false;
		net_addr host, net;
		size_t n;

		if (url_host(u, &host))
			while (!ok && allow_next(&p, &e, &n))
				ok = parse_addr(e, n, true, &net) && addr_match(&net, &host);
		if (!ok)
			return pt_set_error(PT_ERR_INVALID,
			                    "placement.workers[%d]: '%s' is not allowed by "
			                    "--worker-allow",
			                    i, u);
	}
	return PT_OK;
}

/* ---------------------------------------------------------------- probe -- */

pt_err pt_job_worker_probe(const char *url, const pt_job_tls *tls, int timeout_ms, bool *busy,
                           char *state, size_t n, char *devices, size_t dn)
{
	pt_job_workers ws = {.n = 0, .timeout_ms = timeout_ms, .tls = tls};
	link *l = &ws.links[0];
	pt_worker_request q = {.kind = PT_WORKER_PING, .session = 0};
	pt_worker_reply r;
	pt_fb_builder b;
	nng_msg *msg = NULL;
	pt_err rv;

	*busy = false;
	if (n > 0)
		state[0] = '\0';
	if (dn > 0)
		devices[0] = '\0';
	l->ws = &ws;
	l->stage = -1;
	l->url = url;
	pthread_mutex_init(&l->amu, NULL);
	mono_cond_init(&l->acv);
	if ((rv = pt_fb_builder_init(&b, 128)) == PT_OK) {
		if (strncmp(url, "tls+tcp://", 10) == 0 && (tls == NULL || !set(tls->ca)))
			rv = pt_set_error(PT_ERR_INVALID, "worker %s: tls+tcp:// needs a CA", url);
		if (rv == PT_OK && (rv = open_link(l, timeout_ms)) == PT_OK &&
		    (rv = exchange(l, &b, &q, &r, &msg)) == PT_OK) {
			*busy = r.busy;
			snprintf(state, n, "%s",
			         r.message ? r.message : (r.busy ? "busy" : "idle"));
			if (dn > 0)
				snprintf(devices, dn, "%s", r.devices ? r.devices : "");
		}
		if (rv != PT_OK) { /* "stage -1 (worker URL): why" -> "worker URL: why" */
			char why[512];
			const char *e = pt_last_error(), *p = strstr(e, "): ");
			snprintf(why, sizeof(why), "%s",
			         strncmp(e, "stage -1 (", 10) == 0 && p ? p + 3 : e);
			pt_set_error(rv, "worker %s: %s", url, why);
		}
		pt_fb_builder_fini(&b);
	}
	nng_msg_free(msg);
	if (l->open)
		nng_close(l->sock);
	if (l->aio != NULL)
		nng_aio_free(l->aio);
	pthread_cond_destroy(&l->acv);
	pthread_mutex_destroy(&l->amu);
	return rv;
}
