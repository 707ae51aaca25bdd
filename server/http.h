/* http.h - pipeserver's observability endpoint: libevent's evhttp on its own
 * thread and event_base.
 *
 * Endpoints (GET and HEAD only; anything else gets 405):
 *   /metrics                      Prometheus text format 0.0.4 (metrics.h)
 *   /healthz                      200 {"status":"ok"} while the process runs
 *   /readyz                       200 when jobs can be accepted (a probe file
 *                                 can be created and removed in data_dir and
 *                                 the device answers the CUDA runtime), else 503
 *   /                             the dashboard (one self-contained page)
 *   /api/jobs                     the job list as JSON
 *   /api/jobs/<id>/metrics?after=N  points with step > N as JSON
 * Every other path is 404; URLs never reach the file system. Requests are
 * bounded (header and body size, read/write timeout, a whole request within
 * twice the timeout), and so are connections (max_connections). When the
 * address is not loopback (a token is then required to start), every path
 * but /healthz and /readyz needs `Authorization: Bearer <token>` (the API's
 * token): 401 with
 * `WWW-Authenticate: Bearer realm="pipetrain"` (plus error="invalid_token"
 * for a wrong one) otherwise, before any routing. The probes stay open:
 * orchestrators' HTTP probes send no credentials and the bodies hold no
 * secrets.
 * Handlers run on the HTTP thread and take the job manager's lock only
 * briefly, so a slow client never holds up the API or training.
 */
#ifndef PT_SERVER_HTTP_H
#define PT_SERVER_HTTP_H

#include <stdbool.h>
#include <stdio.h>

#include "error.h"
#include "jobs.h"
#include "metrics.h"

typedef struct pt_http pt_http;

typedef struct pt_http_config {
	const char *addr;       /* "HOST:PORT"; port 0 picks a free one */
	const char *auth_token; /* NULL: none */
	const char *data_dir;   /* readiness probe directory */
	const char *device;     /* "cpu" or "cuda:N": readiness asks the backend */
	pt_jobs *jobs;          /* not owned */
	pt_metrics *metrics;    /* not owned */
	int timeout_s;          /* per-connection read/write timeout (0: 10 s); a
	                         * whole request within twice this */
	int max_connections;    /* open connections at most; one more shuts down
	                         * the one waiting longest for a request (0: 256,
	                         * or RLIMIT_NOFILE / 4 when lower) */
} pt_http_config;

/* pt_http_addr_is_loopback tells whether "HOST:PORT" names a loopback host
 * (127.x, localhost, ::1), i.e. one that serves without an auth token. */
bool pt_http_addr_is_loopback(const char *addr);

/* pt_http_start binds addr, starts the HTTP thread and prints
 * `pipeserver http on http://HOST:PORT` (the bound port) to announce,
 * flushed. PT_ERR_INVALID for a bad address; PT_ERR_IO when binding fails;
 * a non-loopback address without a token is refused (PT_ERR_INVALID). */
pt_err pt_http_start(pt_http **out, const pt_http_config *cfg, FILE *announce);

/* pt_http_port returns the bound port. */
int pt_http_port(const pt_http *h);

/* pt_http_destroy stops the loop, waits for the thread (a request being
 * answered completes first), closes every connection and frees h. Accepts
 * NULL. */
void pt_http_destroy(pt_http *h);

#endif
