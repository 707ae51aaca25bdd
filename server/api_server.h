/* api_server.h - pipeserver's request front end: an nng REP socket with many
 * contexts, each an aio state machine (nng's demo/async/server.c pattern).
 *
 * Every request is verified (pt_api_parse_request) and authorised, then
 * dispatched through a handler table: cheap handlers run in the aio callback;
 * handlers that block (fsync, file reads) go to a small worker pool;
 * WatchMetrics parks its context (aio pending on a timer, registered as a
 * waiter on the job) so a long poll occupies neither a worker nor a thread.
 * When contexts park or wait for a worker, new ones are opened (up to
 * max_contexts) so that `contexts` are always receiving: one slow request
 * never blocks the others.
 *
 * Connections (nng pipes) are tracked through pipe notifications: at most
 * max_connections are open; one more closes the connection idle the longest
 * (no request in progress) or, when none is idle, the new one. A connection
 * with no request in progress for idle_timeout_ms is closed (a parked
 * WatchMetrics is a request in progress). Requests beyond max_outstanding
 * in progress on one connection are dropped unanswered, and a reply not
 * taken in reply_timeout_ms (the client does not read) is dropped: nng
 * queues a context's reply behind the connection's blocked send, so such a
 * client would otherwise hold contexts every other client needs. Such a
 * connection is not closed (api_server.c, kick_locked: nng 1.5.2 hangs).
 *
 * REQ resend: a SubmitJob that arrives twice on the same connection with the
 * same bytes and a non-zero request id (REQ's resend timer,
 * NNG_OPT_REQ_RESENDTIME) returns the first job's id (the last 64 submits are
 * remembered). Clients must therefore use a fresh request id per request. A resend after a
 * reconnect is a new pipe and submits again: clients that must never double-submit should disable
 * resend (set NNG_OPT_REQ_RESENDTIME to NNG_DURATION_INFINITE) and retry with ListJobs. Every other
 * request is idempotent.
 */
#ifndef PT_SERVER_API_SERVER_H
#define PT_SERVER_API_SERVER_H

#include <stddef.h>
#include <stdio.h>

#include "error.h"
#include "jobs.h"

typedef struct pt_api_server pt_api_server;

typedef struct pt_api_server_config {
	const char *const *urls;
	int n_urls;
	const char *auth_token;                  /* NULL: no token required */
	const char *tls_cert, *tls_key, *tls_ca; /* files; for tls+tcp:// */
	int contexts;                            /* kept receiving */
	int max_contexts;                        /* at most */
	int workers;                             /* worker threads */
	size_t max_request;                      /* NNG_OPT_RECVMAXSZ, bytes */
	int max_connections;                     /* open connections at most (> 0) */
	int idle_timeout_ms;                     /* close connections idle this long; 0: never */
	int max_outstanding;                     /* requests in progress per connection */
	int reply_timeout_ms;                    /* a reply not taken this long is dropped;
	                                            0: 10 s */
	const char *device;                      /* reported by ServerInfo */
	const char *version;
	pt_jobs *jobs; /* not owned */
} pt_api_server_config;

/* pt_api_server_start opens the socket, starts every listener and the
 * contexts, and prints `pipeserver listening on <url>` (tcp port 0 resolved)
 * for each listener to announce, flushed. Errors name the URL. */
pt_err pt_api_server_start(pt_api_server **out, const pt_api_server_config *cfg, FILE *announce);

/* pt_api_server_drain makes new requests fail with Unavailable ("shutting
 * down"); requests in flight and parked watchers still complete. */
void pt_api_server_drain(pt_api_server *s);

/* pt_api_server_destroy stops the workers, closes the socket and every
 * context (waiting for callbacks) and frees s. Call after the job manager
 * was shut down and before it is destroyed. Accepts NULL. */
void pt_api_server_destroy(pt_api_server *s);

#endif
