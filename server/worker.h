/* worker.h - `pipeserver --worker`: host the pipeline stages of one job at
 * a time (one stage; an interleaved job's chunks of one rank) for
 * coordinators that name this process in a job's placement.workers.
 *
 * The worker listens with an nng REP socket on its control URLs and speaks
 * the handshake of lib/pipeline/handshake.h: a StageJoin (protocol 2, the
 * auth token when the worker has one, rank, world, heartbeat timeout) makes
 * it create a stage communicator on tcp://<advertise host>:0 and answer with
 * its URL and a session; the StagePeers of that session connects it to
 * every rank and starts pt_stage_host_run on a thread. The coordinator then
 * pings the session (StagePing) on the same socket; the worker answers from
 * its control thread, whatever the stage computes. When the stage ends
 * (STOP, an empty StagePeers that ends the session, or no ping for the
 * session's timeout: the coordinator died or is cut off) the worker is idle
 * again. While a session is joined or running, a StageJoin with another
 * session key is refused ("worker busy with another job"); one with the same
 * key (the same job) gets another seat for another rank; a joined session that gets no
 * StagePeers expires after 30 s. StagePing with session 0 reports the state.
 * The StageJoin carries the session's data-plane key (protocol 3): the
 * stage's communicator accepts only frames authenticated with it.
 */
#ifndef PT_SERVER_WORKER_H
#define PT_SERVER_WORKER_H

#include <stdio.h>

#include "error.h"

typedef struct pt_worker_config {
	const char *const *urls; /* control URLs to listen on (tcp port 0: any) */
	int n_urls;
	const char *auth_token;     /* required in StageJoin when not NULL */
	const char *advertise_host; /* host peers dial for stage data (NULL or "": this
	                             * host's address on the coordinator's connection) */
	int configure_timeout_ms;   /* wait for the coordinator's Configure (0: 60 s) */
	/* tls+tcp:// control URLs (files): the worker's certificate and key (one
	 * file may hold both); tls_ca: coordinators must present a certificate
	 * it signed (NULL or "": none asked); peer_ca verifies the stage data
	 * ports this worker dials. A worker with a tls+tcp:// control URL serves
	 * its stage data on tls+tcp:// too (same certificate) and needs all
	 * but tls_ca. */
	const char *tls_cert, *tls_key, *tls_ca, *peer_ca;
	/* Tests only: an ended session's communicator waits this long before
	 * it closes, as a close stuck in nng would (0: none). */
	int close_delay_ms;
} pt_worker_config;

typedef struct pt_worker pt_worker;

/* pt_worker_start listens on every URL, prints `pipeserver listening on
 * <url>` (port resolved) per URL to announce, and serves requests on its own
 * thread. cfg's strings are borrowed and must outlive the worker. */
pt_err pt_worker_start(pt_worker **out, const pt_worker_config *cfg, FILE *announce);

/* pt_worker_destroy stops taking requests, ends a running stage (its
 * communicator is closed, so the stage loop returns), waits for both
 * threads and frees everything. Blocking; NULL-safe. */
void pt_worker_destroy(pt_worker *w);

#endif
