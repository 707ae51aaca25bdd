/* worker.c - `pipeserver --worker` (see worker.h): a REP loop on one thread
 * answering the handshake and the heartbeats, and a stage thread per seat.
 *
 * Seats: a worker serves one job at a time (the session key names it) and
 * usually one of its stages; an interleaved job puts the chunks of one rank
 * on one worker, each a seat with a session of its own (at most
 * PT_WORKER_SEATS), sharing the rank's turn (pt_stage_turn_share). A seat's
 * states: IDLE -> JOINED (StageJoin: communicator made, session drawn) ->
 * RUNNING (StagePeers: connected, stage thread started) -> DONE (the stage
 * thread returned) -> IDLE (the REP thread joined it and freed the
 * communicator). Only the REP thread creates and destroys the communicator
 * and the stage thread; the lock guards the state for the stage thread's
 * last transition.
 *
 * Heartbeats use the control socket itself (no second channel): the
 * coordinator's StagePing{session} arrives every timeout / 4 and is answered
 * by the REP thread, which never waits on the stage's compute (its longest
 * waits are bounded: BUSY_WAIT_MS for a finishing stage, END_WAIT_MS when a
 * session is ended). A watchdog thread wakes every POLL_MS and ends a running
 * session whose coordinator sent no ping for the session's timeout (it died,
 * hung, or a link went down: TCP alone would not notice): every peer of the
 * stage's communicator is marked lost (new sends fail at once; one already
 * blocked on a dead link ends at the send timeout, which is the session's
 * heartbeat timeout), the communicator closes, the stage loop returns, and
 * the worker is idle for the next coordinator. The REP thread reaps finished
 * stages and expired joins before each request it handles. Its receive has
 * no timeout: nng 1.5.2 can lose a receive timeout, or fire one on a socket
 * that close is freeing; close wakes it. tls+tcp:// control URLs take the
 * configured certificate (and ask for a client's when tls_ca is set); the
 * stage data port is then tls+tcp:// too. Frames on it are authenticated
 * with the key the coordinator sent in StageJoin either way.
 */
#include "worker.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>

#include "backend.h"
#include "comm.h"
#include "fileio.h"
#include "handshake.h"
#include "log.h"
#include "runtime.h"

#define POLL_MS              50   /* how often the watchdog looks */
#define REAP_MS              1000 /* finished stages are freed this often without requests */
#define JOIN_TTL_S           30.0 /* a joined session without StagePeers expires */
#define BUSY_WAIT_MS         200  /* a join waits this long for an ending stage */
#define END_WAIT_MS          2000 /* an ended session waits this long for its stage */
#define DEFAULT_HEARTBEAT_MS 10000
#define MIN_HEARTBEAT_MS     100 /* the range placement.worker_timeout_ms allows */
#define MAX_HEARTBEAT_MS     3600000
#define MAX_REQUEST          (256 * 1024)
#define DEFAULT_CONFIGURE_MS 60000
#define PT_WORKER_SEATS      8 /* stages of one job at once: virtual_stages at most */
#define MAX_LISTENERS        16
/* Communicators of ended sessions whose close has not returned. A close
 * that hangs in nng keeps its sockets and its thread; with this many
 * pending the worker takes no new stage (each would add to the pile) and
 * says why. One job's end releases up to PT_WORKER_SEATS at once. */
#define MAX_CLOSING PT_WORKER_SEATS
/* Control connections at most (fewer where RLIMIT_NOFILE is low: a quarter
 * of it). One more closes the stranger idle the longest: a connection that
 * has never made a request a session or the token vouches for; such a
 * stranger is also closed after STRANGER_IDLE_S without a request. */
#define MAX_CONTROL_CONNS 256
#define STRANGER_IDLE_S   10.0

/* A control connection (a pipe of the REP socket). */
typedef struct wconn {
	nng_pipe p;
	double last;  /* pt_now() of its last request, or of its arrival */
	bool trusted; /* made a request the token or a live session vouched for */
	bool kicked;  /* to be closed by rep_main */
	bool unread;  /* a reply to it could not be sent: its replies are dropped */
} wconn;

static atomic_int closing; /* close threads running, in this process */

typedef enum wstate { W_IDLE, W_JOINED, W_RUNNING, W_DONE } wstate;

/* One stage this worker serves: a session of its own (an interleaved job
 * puts each of a rank's chunks on the same worker, one seat each). */
typedef struct seat {
	struct pt_worker *w;
	wstate state;
	pt_comm *comm;
	int rank, world;
	uint64_t session;
	uint8_t key[PT_COMM_KEY_BYTES]; /* the job's data-plane key */
	double joined_at;
	int timeout_ms;   /* the session's heartbeat timeout */
	double last_ping; /* pt_now() of the session's last request (under mu) */
	bool abandoned;   /* the stage was told to end (under mu) */
	pthread_t stage;
	bool stage_started;
} seat;

struct pt_worker {
	pt_worker_config cfg;
	char devices[256]; /* what it computes on, for StagePing replies */
	nng_socket sock;
	bool sock_open;
	nng_aio *rx;   /* rep_main's receive */
	bool tls_data; /* stage data on tls+tcp:// (a control URL is) */
	pthread_t thread, watchdog;
	bool thread_started, watchdog_started;
	atomic_bool stopping;
	pt_fb_builder b;

	pthread_mutex_t cmu;                /* the connection table */
	wconn conns[MAX_CONTROL_CONNS * 2]; /* room for the kicked, not yet closed */
	int n_conns, cap_conns;

	pthread_mutex_t mu;
	pthread_cond_t cv; /* signalled when a stage thread reaches DONE */
	seat seats[PT_WORKER_SEATS];
	pt_stage_turn_share *share; /* the turn of the seats' interleaved rank */
};

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

/* key_equal compares session keys in constant time (a join presenting a
 * guessed key learns nothing from how long the answer took). */
static bool key_equal(const uint8_t *a, const uint8_t *b)
{
	unsigned char d = 0;
	for (int i = 0; i < PT_COMM_KEY_BYTES; i++)
		d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

static uint64_t new_session(void)
{
	uint64_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		v = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
	}
	return v ? v : 1;
}

typedef struct close_job {
	pt_comm *comm;
	int delay_ms; /* pt_worker_config.close_delay_ms */
} close_job;

/* close_main drops an ended session's communicator on its own thread. */
static void *close_main(void *arg)
{
	close_job *j = arg;
	if (j->delay_ms > 0) {
		struct timespec d = {j->delay_ms / 1000, (long)(j->delay_ms % 1000) * 1000000L};
		nanosleep(&d, NULL);
	}
	pt_comm_destroy(j->comm);
	free(j);
	atomic_fetch_sub(&closing, 1);
	return NULL;
}

/* release frees the seat's session (mu held). Its communicator is
 * destroyed on a thread of its own: closing the sockets of a stage whose
 * peers vanished has been seen to block in nng_close (a worker continued
 * after SIGSTOP, its coordinator gone), and this thread - the REP thread or
 * the watchdog, holding mu - must keep answering. */
static void release(seat *st)
{
	pthread_t t;
	close_job *j;
	if (st->comm != NULL) {
		atomic_fetch_add(&closing, 1);
		if ((j = malloc(sizeof(*j))) != NULL) {
			*j = (close_job){st->comm, st->w->cfg.close_delay_ms};
			if (pthread_create(&t, NULL, close_main, j) == 0)
				pthread_detach(t);
			else
				close_main(j);
		} else {
			pt_comm_destroy(st->comm);
			atomic_fetch_sub(&closing, 1);
		}
	}
	st->comm = NULL;
	st->session = 0;
	st->abandoned = false;
	st->state = W_IDLE;
}

/* end_stage makes a running stage return (mu held; the watchdog or the REP
 * thread; the communicator stays until the REP thread frees it): every peer is lost,
 * so no send waits on a dead link past the send timeout, and the
 * communicator closes. */
static void end_stage(seat *st)
{
	if (st->abandoned || st->comm == NULL)
		return;
	st->abandoned = true;
	for (int r = 0; r < st->world; r++)
		if (r != st->rank)
			pt_nng_comm_mark_lost(st->comm, r);
	pt_comm_close(st->comm);
	/* A chunk waiting for its rank's turn reads no closed communicator. */
	pt_stage_turn_share_close(st->w->share);
}

/* watch_main ends a running stage whose coordinator went silent. */
static void *watch_main(void *arg)
{
	pt_worker *w = arg;
	struct timespec nap = {0, POLL_MS * 1000000L};

	while (!atomic_load(&w->stopping)) {
		nanosleep(&nap, NULL);
		pthread_mutex_lock(&w->mu);
		for (int i = 0; i < PT_WORKER_SEATS; i++) {
			seat *st = &w->seats[i];
			if (st->state == W_RUNNING && !st->abandoned &&
			    pt_now() - st->last_ping > st->timeout_ms / 1000.0) {
				pt_warn("worker: stage %d: no heartbeat from the coordinator for "
				        "%.1f s; abandoning the stage",
				        st->rank, st->timeout_ms / 1000.0);
				end_stage(st);
			}
		}
		pthread_mutex_unlock(&w->mu);
	}
	return NULL;
}

/* reap frees finished stages and expired joins (REP thread). */
static void reap(pt_worker *w)
{
	for (int i = 0; i < PT_WORKER_SEATS; i++) {
		seat *st = &w->seats[i];
		bool done;
		pthread_mutex_lock(&w->mu);
		done = st->state == W_DONE;
		pthread_mutex_unlock(&w->mu);
		if (done) {
			pthread_join(st->stage, NULL);
			st->stage_started = false;
			pthread_mutex_lock(&w->mu);
			release(st);
			pthread_mutex_unlock(&w->mu);
			pt_info("worker: stage %d finished; idle", st->rank);
		}
		if (st->state == W_JOINED && pt_now() - st->joined_at > JOIN_TTL_S) {
			pt_warn("worker: stage %d: no peer list within %.0f s; session dropped",
			        st->rank, JOIN_TTL_S);
			pthread_mutex_lock(&w->mu);
			release(st);
			pthread_mutex_unlock(&w->mu);
		}
	}
}

static void *stage_main(void *arg)
{
	seat *st = arg;
	pt_worker *w = st->w;
	int timeout =
	    w->cfg.configure_timeout_ms > 0 ? w->cfg.configure_timeout_ms : DEFAULT_CONFIGURE_MS;
	pt_err rv = pt_stage_host_run_shared(st->comm, timeout, w->share);

	if (rv != PT_OK)
		pt_warn("worker: stage %d: %s", st->rank, pt_last_error());
	pthread_mutex_lock(&w->mu);
	st->state = W_DONE;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* wait_done gives a stage that is finishing (its STOP answered, or its
 * session ended) up to ms to return, then reaps it. */
static void wait_done(pt_worker *w, seat *st, int ms)
{
	struct timespec ts;

	pthread_mutex_lock(&w->mu);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += (long)ms % 1000 * 1000000L;
	ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
	ts.tv_nsec %= 1000000000L;
	while (st->state == W_RUNNING && !atomic_load(&w->stopping))
		if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) != 0)
			break;
	pthread_mutex_unlock(&w->mu);
	reap(w);
}

/* find_seat returns the seat of a session (NULL: none; session 0 is none). */
static seat *find_seat(pt_worker *w, uint64_t session)
{
	for (int i = 0; session != 0 && i < PT_WORKER_SEATS; i++)
		if (w->seats[i].state != W_IDLE && w->seats[i].session == session)
			return &w->seats[i];
	return NULL;
}

/* busy_seats counts the seats in use. */
static int busy_seats(const pt_worker *w)
{
	int n = 0;
	for (int i = 0; i < PT_WORKER_SEATS; i++)
		n += w->seats[i].state != W_IDLE;
	return n;
}

/* data_host writes the host peers should dial for this worker's data. */
static void data_host(pt_worker *w, nng_msg *req, char *out, size_t n)
{
	const char *h = w->cfg.advertise_host;
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	if (h != NULL && h[0] != '\0') {
		snprintf(out, n, strchr(h, ':') && h[0] != '[' ? "[%s]" : "%s", h);
		return;
	}
	snprintf(out, n, "127.0.0.1"); /* ipc:// and abstract:// control sockets */
	if (nng_pipe_get_addr(nng_msg_get_pipe(req), NNG_OPT_LOCADDR, &sa) != 0)
		return;
	if (sa.s_family == NNG_AF_INET &&
	    inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip)) != NULL)
		snprintf(out, n, "%s", ip);
	else if (sa.s_family == NNG_AF_INET6 &&
	         inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip)) != NULL)
		snprintf(out, n, "[%s]", ip);
}

/* closes_drain waits up to ms for fewer than MAX_CLOSING closes to be
 * pending (a job's end releases its seats just before the next job joins). */
static bool closes_drain(int ms)
{
	struct timespec nap = {0, 10 * 1000000L};
	for (int i = 0; atomic_load(&closing) >= MAX_CLOSING; i += 10) {
		if (i >= ms)
			return false;
		nanosleep(&nap, NULL);
	}
	return true;
}

static void on_join(pt_worker *w, nng_msg *req, const pt_worker_request *q, pt_worker_reply *r,
                    char *msg, size_t n)
{
	char host[300], url[400];
	seat *st = NULL;
	int timeout = q->timeout_ms > 0 ? q->timeout_ms : DEFAULT_HEARTBEAT_MS;
	/* A send to a peer that stopped reading fails after the heartbeat
	 * timeout: a stage is never stuck longer than its coordinator waits. */
	pt_nng_options o = {.listen_url = url,
	                    .compress = q->compress,
	                    .send_timeout_ms = timeout,
	                    .key = q->key,
	                    .tls_cert_key_file = w->cfg.tls_cert,
	                    .tls_key_file = w->cfg.tls_key,
	                    .tls_ca_file = w->cfg.peer_ca};
	pt_err rv;

	r->message = msg;
	if (q->protocol != PT_WORKER_PROTOCOL) {
		snprintf(msg, n, "protocol version %d not supported (this worker speaks %d)",
		         (int)q->protocol, PT_WORKER_PROTOCOL);
		return;
	}
	if (w->cfg.auth_token != NULL &&
	    (q->token == NULL || !ct_equal(q->token, w->cfg.auth_token))) {
		snprintf(msg, n, "unauthorized");
		return;
	}
	if (q->key == NULL) {
		snprintf(msg, n, "StageJoin without a session key");
		return;
	}
	if (timeout < MIN_HEARTBEAT_MS || timeout > MAX_HEARTBEAT_MS) {
		snprintf(msg, n, "heartbeat timeout %d ms (%d to %d)", timeout, MIN_HEARTBEAT_MS,
		         MAX_HEARTBEAT_MS);
		return;
	}
	reap(w);
	/* Only stages already told to end are waited for: the REP thread must
	 * stay free to answer the running sessions' pings. */
	for (int i = 0; i < PT_WORKER_SEATS; i++)
		if (w->seats[i].state == W_RUNNING && w->seats[i].abandoned)
			wait_done(w, &w->seats[i], BUSY_WAIT_MS);
	if (!closes_drain(BUSY_WAIT_MS)) {
		int k = atomic_load(&closing);
		snprintf(msg, n,
		         "%d communicators of ended stages are still closing (at most %d; "
		         "stuck in nng_close): this worker takes no new stage; restart it",
		         k, MAX_CLOSING);
		pt_warn("worker: StageJoin refused: %s", msg);
		return;
	}
	if (q->world < 2 || q->world > PT_MAX_STAGES + 1 || q->rank < 1 || q->rank >= q->world) {
		snprintf(msg, n, "rank %d of world %d: need 2 <= world <= %d and 1 <= rank < world",
		         (int)q->rank, (int)q->world, PT_MAX_STAGES + 1);
		return;
	}
	/* Seats go to one job at a time: its key. Several are the chunks of an
	 * interleaved rank (one world, distinct ranks). */
	for (int i = 0; i < PT_WORKER_SEATS; i++) {
		seat *x = &w->seats[i];
		if (x->state == W_IDLE)
			continue;
		if (!key_equal(x->key, q->key)) {
			snprintf(msg, n, "worker busy with another job");
			r->busy = true;
			return;
		}
		if (x->world != q->world || x->rank == q->rank) {
			snprintf(msg, n,
			         "rank %d of world %d beside this job's rank %d of world %d",
			         (int)q->rank, (int)q->world, x->rank, x->world);
			return;
		}
	}
	for (int i = 0; i < PT_WORKER_SEATS && st == NULL; i++)
		if (w->seats[i].state == W_IDLE)
			st = &w->seats[i];
	if (st == NULL) {
		snprintf(msg, n, "this worker serves %d stages of the job already (at most %d)",
		         PT_WORKER_SEATS, PT_WORKER_SEATS);
		return;
	}
	data_host(w, req, host, sizeof(host));
	snprintf(url, sizeof(url), "%s://%s:0", w->tls_data ? "tls+tcp" : "tcp", host);
	o.world = q->world;
	o.rank = q->rank;
	if ((rv = pt_nng_comm_create(&st->comm, &o)) != PT_OK) {
		snprintf(msg, n, "cannot listen on %s: %s", url, pt_last_error());
		st->comm = NULL;
		return;
	}
	pthread_mutex_lock(&w->mu);
	st->state = W_JOINED;
	st->rank = q->rank;
	st->world = q->world;
	st->session = new_session();
	memcpy(st->key, q->key, PT_COMM_KEY_BYTES);
	st->joined_at = pt_now();
	st->last_ping = st->joined_at;
	st->timeout_ms = timeout;
	pthread_mutex_unlock(&w->mu);
	r->ok = true;
	r->message = NULL;
	r->data_url = pt_nng_comm_url(st->comm);
	r->session = st->session;
	pt_info("worker: joined as stage rank %d of world %d; data on %s; heartbeat timeout %d ms",
	        st->rank, st->world, r->data_url, st->timeout_ms);
}

static void on_peers(pt_worker *w, const pt_worker_request *q, pt_worker_reply *r, char *msg,
                     size_t n)
{
	seat *st = find_seat(w, q->session);
	pt_err rv;

	r->message = msg;
	if (q->n_urls == 0 && st != NULL && (st->state == W_RUNNING || st->state == W_DONE)) {
		/* The coordinator ends a running session (job over, or failed):
		 * the stage returns and the seat is idle before the reply. */
		pthread_mutex_lock(&w->mu);
		end_stage(st);
		pthread_mutex_unlock(&w->mu);
		wait_done(w, st, END_WAIT_MS);
		pt_info("worker: stage %d: session ended by the coordinator; %s", st->rank,
		        st->state == W_IDLE ? "idle" : "the stage is still finishing");
		r->ok = true;
		snprintf(msg, n, st->state == W_IDLE ? "ended" : "ending");
		return;
	}
	if (st == NULL || st->state != W_JOINED) {
		snprintf(msg, n, "no such session (StageJoin first)");
		return;
	}
	if (q->n_urls == 0) {
		pthread_mutex_lock(&w->mu);
		release(st);
		pthread_mutex_unlock(&w->mu);
		pt_info("worker: session cancelled; %s",
		        busy_seats(w) ? "other stages go on" : "idle");
		r->ok = true;
		snprintf(msg, n, "cancelled");
		return;
	}
	if (q->n_urls != st->world) {
		snprintf(msg, n, "%d peer URLs for a world of %d", q->n_urls, st->world);
	} else if ((rv = pt_nng_comm_connect(st->comm, q->urls)) != PT_OK) {
		snprintf(msg, n, "connecting to the peers: %s", pt_last_error());
	} else {
		pthread_mutex_lock(&w->mu);
		st->state = W_RUNNING;
		st->last_ping = pt_now();
		pthread_mutex_unlock(&w->mu);
		if (pthread_create(&st->stage, NULL, stage_main, st) == 0) {
			st->stage_started = true;
			r->ok = true;
			r->message = NULL;
			return;
		}
		snprintf(msg, n, "cannot start the stage thread");
	}
	/* A failed peer list ends the session: the coordinator gives up the job. */
	pthread_mutex_lock(&w->mu);
	release(st);
	pthread_mutex_unlock(&w->mu);
}

/* conn_find: the table's entry of pipe id (cmu held), or NULL. */
static wconn *conn_find(pt_worker *w, int id)
{
	for (int i = 0; i < w->n_conns; i++)
		if (nng_pipe_id(w->conns[i].p) == id)
			return &w->conns[i];
	return NULL;
}

/* pipe_cb keeps the connection table: a new pipe beyond the cap marks the
 * stranger idle the longest to be closed (rep_main closes it: not from
 * here), or is refused when every other one is trusted. */
static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	pt_worker *w = arg;
	wconn *x, *victim = NULL;
	int live = 0;
	bool refuse = false;

	pthread_mutex_lock(&w->cmu);
	if (ev == NNG_PIPE_EV_REM_POST) {
		if ((x = conn_find(w, nng_pipe_id(p))) != NULL)
			*x = w->conns[--w->n_conns];
		pthread_mutex_unlock(&w->cmu);
		return;
	}
	for (int i = 0; i < w->n_conns; i++) {
		x = &w->conns[i];
		if (x->kicked)
			continue;
		live++;
		if (!x->trusted && (victim == NULL || x->last < victim->last))
			victim = x;
	}
	if (live >= w->cap_conns) {
		if (victim != NULL)
			victim->kicked = true;
		else
			refuse = true;
	}
	if (!refuse && w->n_conns < (int)(sizeof(w->conns) / sizeof(w->conns[0])))
		w->conns[w->n_conns++] = (wconn){.p = p, .last = pt_now()};
	else
		refuse = true;
	pthread_mutex_unlock(&w->cmu);
	if (refuse)
		nng_pipe_close(p); /* nng's way to refuse a pipe in ADD_PRE */
}

/* conn_seen notes a request on pipe p, and that the token or a live
 * session vouched for it when trusted. */
static void conn_seen(pt_worker *w, nng_pipe p, bool trusted)
{
	wconn *x;
	pthread_mutex_lock(&w->cmu);
	if ((x = conn_find(w, nng_pipe_id(p))) != NULL) {
		x->last = pt_now();
		x->trusted = x->trusted || trusted;
	}
	pthread_mutex_unlock(&w->cmu);
}

/* conn_unread reads (set < 0) or sets whether pipe p's peer leaves its
 * replies unread. */
static bool conn_unread(pt_worker *w, nng_pipe p, int set)
{
	wconn *x;
	bool v = false;
	pthread_mutex_lock(&w->cmu);
	if ((x = conn_find(w, nng_pipe_id(p))) != NULL) {
		if (set >= 0)
			x->unread = set;
		v = x->unread;
	}
	pthread_mutex_unlock(&w->cmu);
	return v;
}

/* send_reply sends rep on the REP socket without stalling on a peer that
 * reads no replies. A peer that has read its replies so far may wait up to
 * REPLY_WAIT_MS (the socket's send timeout): its previous reply's send can
 * still be finishing when its next request is answered, and a reply dropped
 * then cost a well-behaved client its whole receive timeout. A reply not
 * sent in that time is dropped and marks the peer unread: its replies go
 * without waiting (dropped when they cannot) until one goes through. */
#define REPLY_WAIT_MS 20
static void send_reply(pt_worker *w, nng_pipe p, nng_msg *rep)
{
	bool unread = conn_unread(w, p, -1);
	int rv = nng_sendmsg(w->sock, rep, unread ? NNG_FLAG_NONBLOCK : 0);

	if (rv != 0)
		nng_msg_free(rep);
	if ((rv == 0) == unread)
		conn_unread(w, p, rv != 0);
}

/* close_conns closes the kicked connections and the strangers idle for
 * STRANGER_IDLE_S (outside cmu: nng calls pipe_cb back). */
static void close_conns(pt_worker *w)
{
	nng_pipe kick[MAX_CONTROL_CONNS * 2];
	int n = 0;
	double now = pt_now();

	pthread_mutex_lock(&w->cmu);
	for (int i = 0; i < w->n_conns; i++) {
		wconn *x = &w->conns[i];
		if (x->kicked || (!x->trusted && now - x->last > STRANGER_IDLE_S)) {
			x->kicked = true;
			kick[n++] = x->p;
		}
	}
	pthread_mutex_unlock(&w->cmu);
	for (int i = 0; i < n; i++)
		nng_pipe_close(kick[i]);
}

/* Refused requests are a stranger's doing: at most REFUSED_LOG_PER_S lines a
 * second are logged, then one line sums up the rest (a flood of junk wrote
 * 4 MB of log a second). Control characters in the reason become '?'. */
#define REFUSED_LOG_PER_S 10
static pt_log_limit refused_log = PT_LOG_LIMIT_INIT(REFUSED_LOG_PER_S);

static void log_refusal(const char *why)
{
	uint64_t n = pt_log_limit_suppressed(&refused_log, false);
	char text[512];
	bool cut;

	if (n)
		pt_info("worker: suppressed %" PRIu64 " similar lines (refused requests over %d a "
		        "second)",
		        n, REFUSED_LOG_PER_S);
	if (!pt_log_limit_pass(&refused_log))
		return;
	cut = pt_log_clean(text, sizeof(text), why);
	pt_info("worker: request refused: %s%s", text, cut ? "..." : "");
}

/* on_ping keeps a session alive, or (session 0) reports the state. */
static void on_ping(pt_worker *w, const pt_worker_request *q, pt_worker_reply *r, char *msg,
                    size_t n)
{
	seat *st;
	bool live = false;

	pthread_mutex_lock(&w->mu);
	st = find_seat(w, q->session);
	if (st != NULL)
		live = (st->state == W_JOINED || st->state == W_RUNNING) && !st->abandoned;
	if (live)
		st->last_ping = pt_now();
	pthread_mutex_unlock(&w->mu);
	r->message = msg;
	/* A worker that refuses new stages is not lent as free (pool.c). */
	r->busy = busy_seats(w) > 0 || atomic_load(&closing) >= MAX_CLOSING;
	r->devices = w->devices;
	if (q->session == 0) {
		/* "idle", or each seat: "serving stage rank 1 of world 3". */
		size_t o = 0;
		r->ok = true;
		msg[0] = '\0';
		for (int i = 0; i < PT_WORKER_SEATS && o < n; i++) {
			seat *x = &w->seats[i];
			const char *sep = o ? "; " : "";
			if (x->state == W_IDLE)
				continue;
			if (!((x->state == W_JOINED || x->state == W_RUNNING) && !x->abandoned))
				o += (size_t)snprintf(msg + o, n - o, "%sending stage rank %d", sep,
				                      x->rank);
			else
				o += (size_t)snprintf(
				    msg + o, n - o, "%s%s stage rank %d of world %d", sep,
				    x->state == W_JOINED ? "joined as" : "serving", x->rank,
				    x->world);
		}
		if (o == 0)
			o = (size_t)snprintf(msg, n, "idle");
		if (atomic_load(&closing) >= MAX_CLOSING && o < n)
			snprintf(msg + o, n - o,
			         "; refusing new stages: %d communicators of ended stages "
			         "still closing",
			         atomic_load(&closing));
		return;
	}
	if (!live) {
		snprintf(msg, n, "no such session (the worker ended it or never had it)");
		return;
	}
	r->ok = true;
	r->message = NULL;
}

static void handle(pt_worker *w, nng_msg *req)
{
	void *body = nng_msg_body(req), *copy = NULL;
	size_t len = nng_msg_len(req), size;
	pt_worker_request q;
	pt_worker_reply r = {0};
	char msg[1200];
	const uint8_t *data;
	nng_msg *rep;
	pt_worker_msg kind = PT_WORKER_JOIN; /* a malformed request gets a join refusal */

	if (((uintptr_t)body & 3u) != 0 && len > 0) {
		if ((copy = malloc(len)) == NULL) {
			nng_msg_free(req);
			return;
		}
		memcpy(copy, body, len);
		body = copy;
	}
	if (pt_handshake_decode_request(body, len, &q) != PT_OK) {
		snprintf(msg, sizeof(msg), "%s", pt_last_error());
		r.message = msg;
	} else if ((kind = q.kind) == PT_WORKER_JOIN) {
		on_join(w, req, &q, &r, msg, sizeof(msg));
	} else if (kind == PT_WORKER_PING) {
		on_ping(w, &q, &r, msg, sizeof(msg));
	} else {
		on_peers(w, &q, &r, msg, sizeof(msg));
	}
	/* A join the token admitted, or a request naming a live session,
	 * vouches for its connection. */
	conn_seen(w, nng_msg_get_pipe(req),
	          r.ok && (kind == PT_WORKER_JOIN || q.session != 0 ||
	                   (w->cfg.auth_token != NULL && q.token != NULL &&
	                    ct_equal(q.token, w->cfg.auth_token))));
	if (!r.ok)
		log_refusal(r.message);
	if (pt_handshake_encode_reply(&w->b, kind, &r, &data, &size) == PT_OK &&
	    nng_msg_alloc(&rep, size) == 0) {
		memcpy(nng_msg_body(rep), data, size);
		/* Never wait on a peer that reads no replies: it would stall this
		 * thread, and with it every job's heartbeats and joins. */
		send_reply(w, nng_msg_get_pipe(req), rep);
	}
	free(copy);
	nng_msg_free(req);
}

/* rep_main answers requests. It receives through w->rx, which
 * pt_worker_destroy stops (nng_aio_stop) and joins this thread before the
 * socket is closed: nng (1.5 to 1.7) can deadlock in nng_close when another
 * thread is blocked receiving on the socket (nanomsg/nng#1813; a worker
 * resumed after SIGSTOP once hung in shutdown this way). The receive times
 * out every REAP_MS, so finished stages are reaped when no request comes.
 * (A 50 ms timeout cost an idle worker 2 % of a core: nng 1.5's expire
 * thread spins up to a millisecond for each timeout.) */
static void *rep_main(void *arg)
{
	pt_worker *w = arg;

	while (!atomic_load(&w->stopping)) {
		int rv;
		nng_recv_aio(w->sock, w->rx);
		nng_aio_wait(w->rx);
		rv = nng_aio_result(w->rx);
		close_conns(w);
		if (rv == NNG_ETIMEDOUT) {
			reap(w);
			continue;
		}
		if (rv != 0)
			break; /* stopped or closed */
		reap(w);
		handle(w, nng_aio_get_msg(w->rx));
	}
	return NULL;
}

/* tls_listener gives listener l the worker's certificate (and asks clients
 * for theirs when tls_ca is set). */
static pt_err tls_listener(pt_worker *w, nng_listener l, const char *url)
{
	const pt_worker_config *c = &w->cfg;
	nng_tls_config *t = NULL;
	char *cert = NULL, *key = NULL;
	size_t n;
	pt_err e;
	int rv;

	if (c->tls_cert == NULL || !*c->tls_cert || c->tls_key == NULL || !*c->tls_key ||
	    c->peer_ca == NULL || !*c->peer_ca)
		return pt_set_error(
		    PT_ERR_INVALID,
		    "listen %s: a tls+tcp:// worker needs --tls-cert, --tls-key and "
		    "--worker-tls-ca",
		    url);
	if ((e = pt_file_read(c->tls_cert, 1 << 20, (void **)&cert, &n)) != PT_OK)
		return pt_set_error(e, "tls_cert: %s", pt_last_error());
	if ((e = pt_file_read(c->tls_key, 1 << 20, (void **)&key, &n)) != PT_OK) {
		free(cert);
		return pt_set_error(e, "tls_key: %s", pt_last_error());
	}
	if ((rv = nng_tls_config_alloc(&t, NNG_TLS_MODE_SERVER)) != 0 ||
	    (rv = nng_tls_config_own_cert(t, cert, key, NULL)) != 0)
		e = pt_set_error(PT_ERR_INVALID, "listen %s: TLS certificate/key: %s", url,
		                 nng_strerror(rv));
	else if (c->tls_ca && *c->tls_ca &&
	         ((rv = nng_tls_config_ca_file(t, c->tls_ca)) != 0 ||
	          (rv = nng_tls_config_auth_mode(t, NNG_TLS_AUTH_MODE_REQUIRED)) != 0))
		e = pt_set_error(PT_ERR_INVALID, "tls_ca %s: %s", c->tls_ca, nng_strerror(rv));
	else if ((rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, t)) != 0)
		e = pt_set_error(PT_ERR_INVALID, "listen %s: TLS: %s", url, nng_strerror(rv));
	free(cert);
	memset(key, 0, n);
	free(key);
	if (t != NULL)
		nng_tls_config_free(t); /* the listener holds its own reference */
	if (e == PT_OK)
		w->tls_data = true;
	return e;
}

static void resolved_url(nng_listener l, const char *url, char *out, size_t n)
{
	int port = 0;
	const char *colon = strrchr(url, ':');

	snprintf(out, n, "%s", url);
	if (colon && strcmp(colon, ":0") == 0 &&
	    nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0)
		snprintf(out, n, "%.*s:%d", (int)(colon - url), url, port);
}

/* describe_devices writes what this worker computes on: "cpu (16 cores)",
 * then every CUDA device the runtime lists ("cpu (16 cores), cuda:0"). */
static void describe_devices(char *buf, size_t cap)
{
	int n = 0;
	size_t o = (size_t)snprintf(buf, cap, "cpu (%d core%s)", pt_num_cores(),
	                            pt_num_cores() == 1 ? "" : "s");

	if (pt_backend_device_count(PT_DEV_CUDA, &n) != PT_OK)
		n = 0;
	for (int i = 0; i < n && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, ", cuda:%d", i);
}

/* conns_cap: MAX_CONTROL_CONNS, or a quarter of RLIMIT_NOFILE when that is
 * less (stages need descriptors too), at least 8. */
static int conns_cap(void)
{
	struct rlimit rl;
	rlim_t q;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
		return MAX_CONTROL_CONNS;
	q = rl.rlim_cur / 4;
	return q < 8 ? 8 : q < MAX_CONTROL_CONNS ? (int)q : MAX_CONTROL_CONNS;
}

pt_err pt_worker_start(pt_worker **out, const pt_worker_config *cfg, FILE *announce)
{
	pt_worker *w;
	pt_err e = PT_OK;
	int rv;

	*out = NULL;
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return pt_set_error(PT_ERR_NOMEM, "worker");
	w->cfg = *cfg;
	describe_devices(w->devices, sizeof(w->devices));
	pthread_mutex_init(&w->mu, NULL);
	pthread_mutex_init(&w->cmu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->cap_conns = conns_cap();
	for (int i = 0; i < PT_WORKER_SEATS; i++)
		w->seats[i].w = w;
	if ((e = pt_stage_turn_share_create(&w->share)) != PT_OK ||
	    (e = pt_fb_builder_init(&w->b, 1024)) != PT_OK) {
		pt_worker_destroy(w);
		return e;
	}
	if ((rv = nng_rep0_open(&w->sock)) != 0) {
		e = pt_set_error(PT_ERR_IO, "worker socket: %s", nng_strerror(rv));
		goto fail;
	}
	w->sock_open = true;
	if ((rv = nng_aio_alloc(&w->rx, NULL, NULL)) != 0) {
		e = pt_set_error(PT_ERR_NOMEM, "worker receive: %s", nng_strerror(rv));
		goto fail;
	}
	nng_aio_set_timeout(w->rx, REAP_MS);
	if ((rv = nng_pipe_notify(w->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, w)) != 0 ||
	    (rv = nng_pipe_notify(w->sock, NNG_PIPE_EV_REM_POST, pipe_cb, w)) != 0) {
		e = pt_set_error(PT_ERR_IO, "worker socket: %s", nng_strerror(rv));
		goto fail;
	}
	nng_socket_set_ms(w->sock, NNG_OPT_SENDTIMEO, REPLY_WAIT_MS); /* send_reply */
	nng_socket_set_size(w->sock, NNG_OPT_RECVMAXSZ, MAX_REQUEST);
	for (int i = 0; i < cfg->n_urls && i < MAX_LISTENERS; i++) {
		const char *url = cfg->urls[i];
		nng_listener l;
		char shown[512];
		if ((rv = nng_listener_create(&l, w->sock, url)) != 0) {
			e = pt_set_error(PT_ERR_INVALID, "listen %s: %s", url, nng_strerror(rv));
			goto fail;
		}
		if (strncmp(url, "tls+", 4) == 0 && (e = tls_listener(w, l, url)) != PT_OK)
			goto fail;
		if ((rv = nng_listener_start(l, 0)) != 0) {
			e = pt_set_error(PT_ERR_IO, "listen %s: %s", url, nng_strerror(rv));
			goto fail;
		}
		resolved_url(l, url, shown, sizeof(shown));
		fprintf(announce, "pipeserver listening on %s\n", shown);
		fflush(announce);
		pt_info("worker listening on %s%s", shown,
		        cfg->auth_token ? " (token required)" : "");
	}
	if (pthread_create(&w->thread, NULL, rep_main, w) != 0) {
		e = pt_set_error(PT_ERR_NOMEM, "worker thread");
		goto fail;
	}
	w->thread_started = true;
	if (pthread_create(&w->watchdog, NULL, watch_main, w) != 0) {
		e = pt_set_error(PT_ERR_NOMEM, "worker watchdog thread");
		goto fail;
	}
	w->watchdog_started = true;
	*out = w;
	return PT_OK;
fail:
	pt_worker_destroy(w);
	return e;
}

void pt_worker_destroy(pt_worker *w)
{
	if (w == NULL)
		return;
	atomic_store(&w->stopping, true);
	/* The REP thread's receive is stopped and the thread joined; only then
	 * is the socket closed, with no receive blocked on it (see rep_main). */
	if (w->rx != NULL)
		nng_aio_stop(w->rx);
	if (w->thread_started)
		pthread_join(w->thread, NULL);
	if (w->sock_open)
		nng_close(w->sock);
	if (w->watchdog_started)
		pthread_join(w->watchdog, NULL);
	pthread_mutex_lock(&w->mu);
	for (int i = 0; i < PT_WORKER_SEATS; i++)
		if (w->seats[i].state == W_RUNNING && w->seats[i].comm != NULL)
			pt_comm_close(w->seats[i].comm); /* the stage loop returns */
	pt_stage_turn_share_close(w->share);
	pthread_mutex_unlock(&w->mu);
	for (int i = 0; i < PT_WORKER_SEATS; i++) {
		if (w->seats[i].stage_started)
			pthread_join(w->seats[i].stage, NULL);
		pt_comm_destroy(w->seats[i].comm);
	}
	pt_stage_turn_share_destroy(w->share);
	if (w->rx != NULL)
		nng_aio_free(w->rx);
	pt_fb_builder_fini(&w->b);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	pthread_mutex_destroy(&w->cmu);
	free(w);
}
