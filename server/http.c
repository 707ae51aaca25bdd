/* http.c - evhttp endpoint for metrics, probes and the dashboard (see http.h).
 *
 * One thread runs its own event_base; the exact paths are a table of
 * callbacks and the generic callback serves /api/jobs/<id>/metrics and 404.
 * Limits: headers 8 KiB, bodies 1 KiB (GET and HEAD have none), an idle
 * timeout per connection, a whole request within twice it, and a number of
 * connections - the last two libevent 2.1 cannot do by itself. The thread
 * makes each connection's bufferevent (evhttp_set_bevcb) and keeps a
 * reference to it, so it knows every open connection (the reference also
 * keeps the descriptor open until the thread drops it: never reused under a
 * stale bufferevent). One more than max_connections shuts down the one that
 * has waited the longest for a request; a connection without a whole request
 * within twice the timeout (a client trickling bytes) is shut down too.
 * evhttp then frees it, and bufferevent_free clears its callbacks: that is
 * how conn_sweep sees it gone.
 */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>

#include "backend.h"
#include "log.h"

#define MAX_HEADERS 8192
#define MAX_BODY    1024
#define MAX_POINTS  5000
#define READ_MAX    (64 << 10)

/* The dashboard page, generated from server/dashboard.html at build time. */
extern const unsigned char pt_dashboard_html[];
extern const size_t pt_dashboard_html_len;

/* One accepted connection (HTTP thread only). */
typedef struct conn {
	struct bufferevent *bev; /* holds one reference of ours */
	double since;            /* accepted, or its last request read */
	bool shut;               /* shut down by us; evhttp frees it next */
	struct conn *next;
} conn;

struct pt_http {
	pt_http_config cfg;
	char *token, *data_dir, *device;
	bool need_token;
	struct event_base *base;
	struct evhttp *http;
	struct event *sweep;
	conn *conns;
	int n_conns, n_shut, max_conns;
	double deadline_s; /* a whole request within this */
	int port;
	pthread_t thread;
	bool started;
};

/* ------------------------------------------------------------- helpers -- */

static bool ct_equal(const char *got, const char *want)
{
	size_t lg = strlen(got), lw = strlen(want);
	unsigned char d = (unsigned char)(lg != lw);

	for (size_t i = 0; i < lw; i++)
		d |= (unsigned char)((i < lg ? (unsigned char)got[i] : 0) ^ (unsigned char)want[i]);
	return d == 0;
}

static void reply(struct evhttp_request *req, int code, const char *reason, const char *type,
                  const char *body, size_t len)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	struct evbuffer *b = evbuffer_new();

	evhttp_add_header(h, "Content-Type", type);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
	if (b == NULL) {
		evhttp_send_error(req, 500, NULL);
		return;
	}
	evbuffer_add(b, body, len);
	evhttp_send_reply(req, code, reason, b);
	evbuffer_free(b);
}

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *msg)
{
	reply(req, code, reason, "text/plain; charset=utf-8", msg, strlen(msg));
}

/* ---------------------------------------------------------- connections -- */

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* conn_gone: evhttp is done with c's connection: bufferevent_free clears
 * every callback (evhttp's reset path does too, and closes the descriptor
 * itself); a live server connection always has evhttp's error callback. */
static bool conn_gone(const conn *c)
{
	bufferevent_data_cb rd, wr;
	bufferevent_event_cb ev;
	bufferevent_getcb(c->bev, &rd, &wr, &ev, NULL);
	return rd == NULL && wr == NULL && ev == NULL;
}

/* conn_shut ends c: both directions shut down, so evhttp reads the end and
 * frees the connection. */
static void conn_shut(pt_http *h, conn *c)
{
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	if (fd >= 0)
		shutdown(fd, SHUT_RDWR);
	c->shut = true;
	h->n_shut++;
}

/* conn_sweep drops the connections evhttp has freed (closing their
 * descriptors) and shuts down those without a whole request in deadline_s. */
static void conn_sweep(pt_http *h, double now)
{
	for (conn **pp = &h->conns; *pp != NULL;) {
		conn *c = *pp;
		if (conn_gone(c)) {
			*pp = c->next;
			h->n_conns--;
			h->n_shut -= c->shut;
			bufferevent_decref(c->bev);
			free(c);
			continue;
		}
		if (!c->shut && now - c->since > h->deadline_s)
			conn_shut(h, c);
		pp = &c->next;
	}
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	conn_sweep(arg, mono_s());
}

/* make_bev (evhttp's bevcb) gives a new connection its bufferevent and
 * admits it: beyond max_conns the open connection that has waited the
 * longest for a request is shut down. */
static struct bufferevent *make_bev(struct event_base *base, void *arg)
{
	pt_http *h = arg;
	double now = mono_s();
	struct bufferevent *bev;
	conn *c;

	conn_sweep(h, now);
	if ((bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE)) == NULL)
		return NULL;
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		bufferevent_free(bev);
		return NULL;
	}
	/* Reading stops at READ_MAX buffered bytes: evhttp drains far less than
	 * that per request, and once evhttp has freed the connection nothing
	 * drains it until the sweep drops our reference. */
	bufferevent_setwatermark(bev, EV_READ, 0, READ_MAX);
	bufferevent_incref(bev);
	c->bev = bev;
	c->since = now;
	while (h->n_conns - h->n_shut >= h->max_conns) {
		conn *old = NULL;
		for (conn *o = h->conns; o != NULL; o = o->next)
			if (!o->shut && (old == NULL || o->since < old->since))
				old = o;
		if (old == NULL)
			break;
		conn_shut(h, old);
	}
	c->next = h->conns;
	h->conns = c;
	h->n_conns++;
	return bev;
}

/* conn_progress: req's connection delivered a whole request now. */
static void conn_progress(pt_http *h, struct evhttp_request *req)
{
	struct evhttp_connection *ec = evhttp_request_get_connection(req);
	struct bufferevent *bev = ec ? evhttp_connection_get_bufferevent(ec) : NULL;
	for (conn *c = h->conns; c != NULL && bev != NULL; c = c->next)
		if (c->bev == bev) {
			c->since = mono_s();
			break;
		}
}

/* ------------------------------------------------------------- requests -- */

/* admit notes that req's connection delivered a request, then checks the
 * method (405 unless GET or HEAD) and the token; false when it already
 * replied. */
static bool admit(pt_http *h, struct evhttp_request *req, bool needs_token)
{
	enum evhttp_cmd_type t = evhttp_request_get_command(req);

	conn_progress(h, req);
	if (t != EVHTTP_REQ_GET && t != EVHTTP_REQ_HEAD) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
		reply_text(req, 405, "Method Not Allowed", "method not allowed\n");
		return false;
	}
	if (needs_token && h->need_token) {
		/* RFC 6750: no credentials get a bare challenge, a wrong token
		 * error="invalid_token"; the scheme name is case-insensitive. */
		const char *a =
		    evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
		bool bearer = a != NULL && strncasecmp(a, "Bearer ", 7) == 0;
		if (!bearer || !ct_equal(a + 7, h->token)) {
			evhttp_add_header(
			    evhttp_request_get_output_headers(req), "WWW-Authenticate",
			    bearer ? "Bearer realm=\"pipetrain\", error=\"invalid_token\""
			           : "Bearer realm=\"pipetrain\"");
			reply_text(req, 401, "Unauthorized",
			           bearer ? "wrong bearer token\n" : "bearer token required\n");
			return false;
		}
	}
	return true;
}

static void reply_buf(struct evhttp_request *req, pt_err rv, pt_metrics_buf *b, const char *type)
{
	if (rv == PT_OK) {
		reply(req, 200, "OK", type, b->data ? b->data : "", b->len);
	} else if (rv == PT_ERR_NOTFOUND) {
		reply_text(req, 404, "Not Found", "no such job\n");
	} else {
		pt_warn("http %s: %s", evhttp_request_get_uri(req), pt_last_error());
		reply_text(req, 500, "Internal Server Error", "internal error\n");
	}
	pt_metrics_buf_fini(b);
}

/* ----------------------------------------------------------- endpoints -- */

static void on_metrics(struct evhttp_request *req, void *arg)
{
	pt_http *h = arg;
	pt_metrics_buf b = {0};

	if (!admit(h, req, true))
		return;
	reply_buf(req, pt_metrics_render(h->cfg.metrics, &b), &b,
	          "text/plain; version=0.0.4; charset=utf-8");
}

static void on_healthz(struct evhttp_request *req, void *arg)
{
	static const char body[] = "{\"status\":\"ok\"}\n";

	if (!admit(arg, req, false))
		return;
	reply(req, 200, "OK", "application/json", body, sizeof(body) - 1);
}

/* probe_dir tries to create and remove a file in dir: permission bits alone
 * do not tell (root ignores them; a read-only mount or a full disk does not
 * show in them). */
static int probe_dir(const char *dir)
{
	char path[4200];
	int fd;

	snprintf(path, sizeof(path), "%s/.readyz-%ld", dir, (long)getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno;
	if (write(fd, "1", 1) != 1) {
		int e = errno ? errno : EIO;
		close(fd);
		unlink(path);
		return e;
	}
	close(fd);
	return unlink(path) == 0 ? 0 : errno;
}

/* device_present asks the backend (the CUDA runtime: device count and
 * attributes) whether dev can run now. Not /dev/nvidiaN: in a container given
 * one GPU, or under CUDA_VISIBLE_DEVICES, cuda:0 is not /dev/nvidia0. */
static bool device_present(const char *dev, char *why, size_t cap)
{
	pt_device d;

	if (dev == NULL)
		return true;
	if (pt_device_parse(dev, &d) != PT_OK || pt_backend_device_ready(d) != PT_OK) {
		snprintf(why, cap, "%s", pt_last_error());
		pt_clear_error();
		return false;
	}
	return true;
}

static void on_readyz(struct evhttp_request *req, void *arg)
{
	pt_http *h = arg;
	pt_metrics_buf b = {0};
	char why[256] = "";
	int e;
	bool dev_ok, ready;

	if (!admit(h, req, false))
		return;
	e = probe_dir(h->data_dir);
	dev_ok = device_present(h->device, why, sizeof(why));
	ready = e == 0 && dev_ok;
	pt_metrics_buf_printf(&b, "{\"ready\":%s,\"data_dir\":", ready ? "true" : "false");
	pt_metrics_buf_json_string(&b, e == 0 ? "writable" : strerror(e));
	pt_metrics_buf_printf(&b, ",\"device\":");
	pt_metrics_buf_json_string(&b, dev_ok ? "present" : why);
	pt_metrics_buf_printf(&b, "}\n");
	if (b.failed) {
		pt_metrics_buf_fini(&b);
		reply_text(req, 500, "Internal Server Error", "out of memory\n");
		return;
	}
	reply(req, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", "application/json",
	      b.data, b.len);
	pt_metrics_buf_fini(&b);
}

static void on_dashboard(struct evhttp_request *req, void *arg)
{
	struct evkeyvalq *out = evhttp_request_get_output_headers(req);

	if (!admit(arg, req, true))
		return;
	/* Everything the page needs is inline; it may only call back here. */
	evhttp_add_header(out, "Content-Security-Policy",
	                  "default-src 'none'; script-src 'unsafe-inline'; style-src "
	                  "'unsafe-inline'; connect-src 'self'; img-src 'self' data:");
	reply(req, 200, "OK", "text/html; charset=utf-8", (const char *)pt_dashboard_html,
	      pt_dashboard_html_len);
}

static void on_jobs(struct evhttp_request *req, void *arg)
{
	pt_http *h = arg;
	pt_metrics_buf b = {0};

	if (!admit(h, req, true))
		return;
	reply_buf(req, pt_metrics_jobs_json(h->cfg.metrics, &b), &b, "application/json");
}

/* parse_u64 reads a whole decimal number (no sign, no spaces). */
static bool parse_num(const char *s, size_t n, int64_t *out)
{
	int64_t v = 0;

	if (n == 0 || n > 18)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	*out = v;
	return true;
}

/* on_other serves /api/jobs/<id>/metrics[?after=N]; anything else is 404. */
static void on_other(struct evhttp_request *req, void *arg)
{
	static const char prefix[] = "/api/jobs/", suffix[] = "/metrics";
	pt_http *h = arg;
	const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
	const char *path = u ? evhttp_uri_get_path(u) : NULL;
	const char *query = u ? evhttp_uri_get_query(u) : NULL;
	const char *id_end;
	int64_t id, after = -1;
	pt_metrics_buf b = {0};

	if (!admit(h, req, true))
		return;
	if (path == NULL || strncmp(path, prefix, sizeof(prefix) - 1) != 0 ||
	    (id_end = strchr(path + sizeof(prefix) - 1, '/')) == NULL ||
	    strcmp(id_end, suffix) != 0 ||
	    !parse_num(path + sizeof(prefix) - 1, (size_t)(id_end - path) - (sizeof(prefix) - 1),
	               &id)) {
		reply_text(req, 404, "Not Found", "not found\n");
		return;
	}
	if (query != NULL) {
		struct evkeyvalq q;
		const char *a;
		bool ok = evhttp_parse_query_str(query, &q) == 0;

		a = ok ? evhttp_find_header(&q, "after") : NULL;
		if (a && *a != '-' && !parse_num(a, strlen(a), &after))
			ok = false;
		if (ok && a && *a == '-' && strcmp(a, "-1") != 0)
			ok = false;
		evhttp_clear_headers(&q);
		if (!ok) {
			reply_text(req, 400, "Bad Request", "after: a step number\n");
			return;
		}
	}
	reply_buf(req, pt_metrics_points_json(h->cfg.metrics, (uint64_t)id, after, MAX_POINTS, &b),
	          &b, "application/json");
}

static const struct {
	const char *path;
	void (*cb)(struct evhttp_request *, void *);
} routes[] = {
    {"/", on_dashboard},      {"/index.html", on_dashboard}, {"/metrics", on_metrics},
    {"/healthz", on_healthz}, {"/readyz", on_readyz},        {"/api/jobs", on_jobs},
};

/* ------------------------------------------------------------ lifetime -- */

static void *loop_main(void *arg)
{
	pt_http *h = arg;
	/* A name for top -H and for http_bench, which charges its CPU time. */
	pthread_setname_np(pthread_self(), "pt-http");
	event_base_dispatch(h->base);
	return NULL;
}

static bool is_loopback(const char *host)
{
	return strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 ||
	       strcmp(host, "::1") == 0;
}

/* addr_host copies HOST of "HOST:PORT" or "[HOST]:PORT" into host; false
 * when there is no colon or the host does not fit. */
static bool addr_host(const char *addr, char *host, size_t n)
{
	const char *colon = addr ? strrchr(addr, ':') : NULL;
	size_t hl;

	if (colon == NULL || colon == addr || (hl = (size_t)(colon - addr)) >= n)
		return false;
	if (addr[0] == '[' && colon[-1] == ']' && hl >= 2) {
		memcpy(host, addr + 1, hl - 2);
		host[hl - 2] = '\0';
	} else {
		memcpy(host, addr, hl);
		host[hl] = '\0';
	}
	return true;
}

bool pt_http_addr_is_loopback(const char *addr)
{
	char host[256];

	return addr_host(addr, host, sizeof(host)) && is_loopback(host);
}

/* default_max_conns: 256, or a quarter of the descriptor limit when that is
 * lower (at least 4). */
static int default_max_conns(void)
{
	struct rlimit rl;
	rlim_t q;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
		return 256;
	q = rl.rlim_cur / 4;
	return q < 4 ? 4 : q < 256 ? (int)q : 256;
}

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static int evthread_rv;

static void evthread_init(void)
{
	evthread_rv = evthread_use_pthreads();
}

pt_err pt_http_start(pt_http **out, const pt_http_config *cfg, FILE *announce)
{
	pt_http *h;
	char host[256];
	const char *colon;
	long port;
	char *end;
	size_t hl;
	struct evhttp_bound_socket *bs;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int timeout_s;
	pt_err rv;

	*out = NULL;
	colon = cfg->addr ? strrchr(cfg->addr, ':') : NULL;
	if (colon == NULL || colon == cfg->addr)
		return pt_set_error(PT_ERR_INVALID, "http address \"%s\": want HOST:PORT",
		                    cfg->addr ? cfg->addr : "");
	port = strtol(colon + 1, &end, 10);
	hl = (size_t)(colon - cfg->addr);
	if (*end != '\0' || colon[1] == '\0' || port < 0 || port > 65535 || hl >= sizeof(host))
		return pt_set_error(PT_ERR_INVALID, "http address \"%s\": bad port", cfg->addr);
	addr_host(cfg->addr, host, sizeof(host)); /* [::1]:8080 -> ::1 */
	if (!is_loopback(host) && (cfg->auth_token == NULL || !*cfg->auth_token))
		return pt_set_error(PT_ERR_INVALID,
		                    "http address %s is not loopback: an auth token is required",
		                    cfg->addr);
	pthread_once(&evthread_once, evthread_init);
	if (evthread_rv != 0)
		return pt_set_error(PT_ERR_IO, "evthread_use_pthreads failed");

	if ((h = calloc(1, sizeof(*h))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "http");
	h->cfg = *cfg;
	h->need_token = !is_loopback(host);
	h->token = strdup(cfg->auth_token ? cfg->auth_token : "");
	h->data_dir = strdup(cfg->data_dir ? cfg->data_dir : ".");
	h->device = strdup(cfg->device ? cfg->device : "cpu");
	if (h->token == NULL || h->data_dir == NULL || h->device == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "http");
		goto fail;
	}
	if ((h->base = event_base_new()) == NULL || (h->http = evhttp_new(h->base)) == NULL) {
		rv = pt_set_error(PT_ERR_NOMEM, "http: event base");
		goto fail;
	}
	evhttp_set_max_headers_size(h->http, MAX_HEADERS);
	evhttp_set_max_body_size(h->http, MAX_BODY);
	timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : 10;
	evhttp_set_timeout(h->http, timeout_s);
	h->deadline_s = 2.0 * timeout_s;
	h->max_conns = cfg->max_connections > 0 ? cfg->max_connections : default_max_conns();
	evhttp_set_bevcb(h->http, make_bev, h);
	{
		struct timeval tick = {1, 0};
		if ((h->sweep = event_new(h->base, -1, EV_PERSIST, on_sweep, h)) == NULL ||
		    event_add(h->sweep, &tick) != 0) {
			rv = pt_set_error(PT_ERR_NOMEM, "http: sweep timer");
			goto fail;
		}
	}
	/* Accept every method libevent parses so that we answer 405, not 501. */
	evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
	                                        EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
	                                        EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
	                                        EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
		if (evhttp_set_cb(h->http, routes[i].path, routes[i].cb, h) != 0) {
			rv = pt_set_error(PT_ERR_IO, "http: route %s", routes[i].path);
			goto fail;
		}
	evhttp_set_gencb(h->http, on_other, h);
	if ((bs = evhttp_bind_socket_with_handle(h->http, host, (uint16_t)port)) == NULL) {
		rv = pt_set_error(PT_ERR_IO, "http: cannot bind %s", cfg->addr);
		goto fail;
	}
	if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) != 0) {
		rv = pt_set_error(PT_ERR_IO, "http: getsockname: %s", strerror(errno));
		goto fail;
	}
	h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
	                                         : ((struct sockaddr_in *)&ss)->sin_port);
	if (pthread_create(&h->thread, NULL, loop_main, h) != 0) {
		rv = pt_set_error(PT_ERR_IO, "http: thread");
		goto fail;
	}
	h->started = true;
	if (announce) {
		if (strchr(host, ':'))
			fprintf(announce, "pipeserver http on http://[%s]:%d\n", host, h->port);
		else
			fprintf(announce, "pipeserver http on http://%s:%d\n", host, h->port);
		fflush(announce);
	}
	pt_info("http on %s port %d%s, %d connections at most", host, h->port,
	        h->need_token ? " (token required)" : "", h->max_conns);
	*out = h;
	return PT_OK;
fail:
	pt_http_destroy(h);
	return rv;
}

int pt_http_port(const pt_http *h)
{
	return h->port;
}

void pt_http_destroy(pt_http *h)
{
	if (h == NULL)
		return;
	if (h->started) {
		event_base_loopbreak(h->base);
		pthread_join(h->thread, NULL);
	}
	if (h->http)
		evhttp_free(h->http); /* frees every connection: our references remain */
	while (h->conns != NULL) {
		conn *c = h->conns;
		h->conns = c->next;
		bufferevent_decref(c->bev); /* the last reference: closes the descriptor */
		free(c);
	}
	if (h->sweep)
		event_free(h->sweep);
	if (h->base)
		event_base_free(h->base);
	free(h->token);
	free(h->data_dir);
	free(h->device);
	free(h);
}
