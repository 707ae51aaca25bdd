/* workers.c - the coordinator's side of the worker handshake: get every
 * stage of a job served by the `pipeserver --worker` named for it in
 * placement.workers, and connect rank 0's communicator to them.
 *
 * For each worker (stage s, rank s + 1): a REQ socket to its control URL,
 * StageJoin -> its data URL and a session; then rank 0 listens on
 * tcp://<host>:0 and every worker gets StagePeers (all data URLs), after
 * which it serves its stage on its own thread until STOP. Limits: plain tcp
 * and ipc control URLs (no TLS), one request at a time per worker, no
 * heartbeats or re-placement (a lost worker fails the job as a lost local
 * stage would).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "handshake.h"
#include "job.h"

#define DEFAULT_TIMEOUT_MS 10000
#define MAX_REPLY_BYTES    (64 * 1024)

typedef struct link {
	nng_socket sock;
	bool open, joined;
	uint64_t session;
	char data_url[512];
} link;

/* call sends q to worker i and decodes its reply into r; *msg keeps the
 * reply alive (r's strings point into it; the caller frees it). */
static pt_err call(link *l, const char *url, int stage, pt_fb_builder *b,
                   const pt_worker_request *q, pt_worker_reply *r, nng_msg **msg)
{
	const uint8_t *data;
	size_t size;
	nng_msg *m = NULL;
	int nrv;
	pt_err rv;

	*msg = NULL;
	if ((rv = pt_handshake_encode_request(b, q, &data, &size)) != PT_OK)
		return pt_set_error(rv, "stage %d (worker %s): %s", stage, url, pt_last_error());
	if ((nrv = nng_msg_alloc(&m, size)) != 0)
		return pt_set_error(PT_ERR_NOMEM, "stage %d (worker %s): %s", stage, url,
		                    nng_strerror(nrv));
	memcpy(nng_msg_body(m), data, size);
	if ((nrv = nng_sendmsg(l->sock, m, 0)) != 0) {
		nng_msg_free(m);
		return pt_set_error(PT_ERR_IO, "stage %d (worker %s): sending %s: %s", stage, url,
		                    q->is_join ? "StageJoin" : "StagePeers", nng_strerror(nrv));
	}
	if ((nrv = nng_recvmsg(l->sock, &m, 0)) != 0)
		return pt_set_error(nrv == NNG_ETIMEDOUT ? PT_ERR_TIMEOUT : PT_ERR_IO,
		                    "stage %d (worker %s): no reply to %s: %s", stage, url,
		                    q->is_join ? "StageJoin" : "StagePeers", nng_strerror(nrv));
	*msg = m;
	if ((rv = pt_handshake_decode_reply(nng_msg_body(m), nng_msg_len(m), q->is_join, r)) !=
	    PT_OK)
		return pt_set_error(rv, "stage %d (worker %s): %s", stage, url, pt_last_error());
	if (!r->ok)
		return pt_set_error(PT_ERR_STATE, "stage %d (worker %s): %s", stage, url,
		                    r->message ? r->message : "refused");
	return PT_OK;
}

static pt_err open_link(link *l, const char *url, int stage, int timeout_ms)
{
	int nrv;

	if ((nrv = nng_req0_open(&l->sock)) != 0)
		return pt_set_error(PT_ERR_IO, "stage %d (worker %s): %s", stage, url,
		                    nng_strerror(nrv));
	l->open = true;
	/* One request at a time, never resent: a resent StageJoin would look
	 * like a second job to a worker that took the first. */
	nng_socket_set_ms(l->sock, NNG_OPT_RECVTIMEO, timeout_ms);
	nng_socket_set_ms(l->sock, NNG_OPT_SENDTIMEO, timeout_ms);
	nng_socket_set_ms(l->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(l->sock, NNG_OPT_RECVMAXSZ, MAX_REPLY_BYTES);
	if ((nrv = nng_dial(l->sock, url, NULL, 0)) != 0)
		return pt_set_error(PT_ERR_IO, "stage %d (worker %s): cannot connect: %s", stage,
		                    url, nng_strerror(nrv));
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

pt_err pt_job_workers_join(const pt_job_workers_options *o, pt_comm **coord)
{
	link links[PT_MAX_STAGES];
	const char *urls[PT_MAX_STAGES + 1];
	char host[300];
	char listen[400];
	int timeout = o->timeout_ms > 0 ? o->timeout_ms : DEFAULT_TIMEOUT_MS;
	pt_fb_builder b;
	pt_comm *c = NULL;
	pt_err rv = PT_OK;

	*coord = NULL;
	if (o->n < 1 || o->n > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "placement.workers: %d URLs (1 to %d)", o->n,
		                    PT_MAX_STAGES);
	memset(links, 0, sizeof(links));
	PT_TRY(pt_fb_builder_init(&b, 1024));
	snprintf(host, sizeof(host), "127.0.0.1");
	if (o->advertise_host != NULL && o->advertise_host[0] != '\0')
		snprintf(host, sizeof(host),
		         strchr(o->advertise_host, ':') && o->advertise_host[0] != '[' ? "[%s]"
		                                                                       : "%s",
		         o->advertise_host);

	for (int s = 0; s < o->n && rv == PT_OK; s++) {
		pt_worker_request q = {.is_join = true,
		                       .protocol = PT_WORKER_PROTOCOL,
		                       .token = o->token,
		                       .rank = s + 1,
		                       .world = o->n + 1,
		                       .compress = o->compress};
		pt_worker_reply r;
		nng_msg *msg = NULL;
		if ((rv = open_link(&links[s], o->urls[s], s, timeout)) == PT_OK &&
		    (rv = call(&links[s], o->urls[s], s, &b, &q, &r, &msg)) == PT_OK) {
			links[s].joined = true;
			links[s].session = r.session;
			if (r.data_url == NULL || r.data_url[0] == '\0' ||
			    strlen(r.data_url) >= sizeof(links[s].data_url))
				rv = pt_set_error(PT_ERR_FORMAT,
				                  "stage %d (worker %s): no usable data URL", s,
				                  o->urls[s]);
			else
				snprintf(links[s].data_url, sizeof(links[s].data_url), "%s",
				         r.data_url);
			if (s == 0 && (o->advertise_host == NULL || o->advertise_host[0] == '\0'))
				local_host(msg, host, sizeof(host));
		}
		nng_msg_free(msg);
	}
	if (rv == PT_OK) {
		pt_nng_options no = {
		    .listen_url = listen, .world = o->n + 1, .rank = 0, .compress = o->compress};
		snprintf(listen, sizeof(listen), "tcp://%s:0", host);
		if ((rv = pt_nng_comm_create(&c, &no)) != PT_OK)
			rv = pt_set_error(rv, "coordinator: listening on %s: %s", listen,
			                  pt_last_error());
	}
	if (rv == PT_OK) {
		urls[0] = pt_nng_comm_url(c);
		for (int s = 0; s < o->n; s++)
			urls[s + 1] = links[s].data_url;
	}
	for (int s = 0; s < o->n && rv == PT_OK; s++) {
		pt_worker_request q = {.session = links[s].session, .n_urls = o->n + 1};
		pt_worker_reply r;
		nng_msg *msg = NULL;
		memcpy(q.urls, urls, sizeof(char *) * (size_t)(o->n + 1));
		rv = call(&links[s], o->urls[s], s, &b, &q, &r, &msg);
		nng_msg_free(msg);
		if (rv == PT_OK)
			links[s].joined = false; /* serving now: a cancel would not apply */
	}
	if (rv == PT_OK && (rv = pt_nng_comm_connect(c, urls)) != PT_OK)
		rv =
		    pt_set_error(rv, "coordinator: connecting to the workers: %s", pt_last_error());

	/* Cancel sessions that were joined but never got their peers, so those
	 * workers are free again at once (best effort; they also expire). */
	for (int s = 0; s < o->n; s++) {
		if (rv != PT_OK && links[s].joined) {
			char msg_copy[1024];
			pt_worker_request q = {.session = links[s].session};
			pt_worker_reply r;
			nng_msg *msg = NULL;
			snprintf(msg_copy, sizeof(msg_copy), "%s", pt_last_error());
			call(&links[s], o->urls[s], s, &b, &q, &r, &msg);
			nng_msg_free(msg);
			pt_set_error(rv, "%s", msg_copy);
		}
		if (links[s].open)
			nng_close(links[s].sock);
	}
	pt_fb_builder_fini(&b);
	if (rv != PT_OK) {
		pt_comm_destroy(c);
		return rv;
	}
	*coord = c;
	return PT_OK;
}
