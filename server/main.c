/* main.c - pipeserver: options, signals, startup and graceful shutdown.
 *
 * Startup prints one `pipeserver listening on <url>` line per listener to
 * stdout (tests and scripts parse it); everything else is logged to stderr.
 * SIGTERM/SIGINT: stop taking requests, stop running jobs (each writes a
 * checkpoint and is marked Interrupted), flush the journal, exit 0.
 * At start the soft RLIMIT_NOFILE is raised to the hard limit, and API
 * connections are capped below it so that jobs always have descriptors.
 * With --worker the process serves pipeline stages for other servers' jobs
 * instead of the job API (server/worker.h); SIGTERM ends a running stage.
 * SIGHUP re-reads an --pool @FILE list.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/resource.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api_server.h"
#include "backend.h"
#include "config.h"
#include "http.h"
#include "jobs.h"
#include "log.h"
#include "metrics.h"
#include "pipeline.h"
#include "worker.h"

#ifndef PT_VERSION
#define PT_VERSION "0.0.0"
#endif

/* Descriptors kept for jobs and the server itself (journal, checkpoint
 * temporaries and their directory, data files, worker sockets, nng and
 * libevent internals, HTTP clients): FD_RESERVE_MIN plus 1/FD_RESERVE_DIV of
 * the limit. API connections get the rest, at most MAX_CONNECTIONS_AUTO. */
#define FD_RESERVE_MIN       128
#define FD_RESERVE_DIV       8
#define MAX_CONNECTIONS_AUTO 65536
#define MIN_CONNECTIONS      16

/* raise_nofile raises the soft RLIMIT_NOFILE to the hard limit (to 2^20 when
 * that is unlimited) and returns the soft limit in force. */
static long raise_nofile(void)
{
	struct rlimit rl;
	rlim_t want;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return 1024;
	want = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
		rlim_t old = rl.rlim_cur;
		rl.rlim_cur = want;
		if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
			pt_info("RLIMIT_NOFILE soft limit raised from %llu to %llu",
			        (unsigned long long)old, (unsigned long long)want);
		else
			rl.rlim_cur = old;
	}
	return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)1 << 30 ? 1L << 30
	                                                                     : (long)rl.rlim_cur;
}

/* connection_limit checks --max-connections against the descriptors left
 * for jobs, or derives it (0); -1 with a message on stderr when too few. */
static int connection_limit(int asked, long nofile)
{
	long reserve = FD_RESERVE_MIN + nofile / FD_RESERVE_DIV, room = nofile - reserve;

	if (asked == 0 && room < MIN_CONNECTIONS) {
		fprintf(stderr,
		        "pipeserver: RLIMIT_NOFILE is %ld: jobs need %ld descriptors and API "
		        "connections at least %d; raise it (ulimit -n, LimitNOFILE=)\n",
		        nofile, reserve, MIN_CONNECTIONS);
		return -1;
	}
	if (asked > room) {
		fprintf(stderr,
		        "pipeserver: --max-connections %d: RLIMIT_NOFILE is %ld and jobs need %ld "
		        "descriptors: at most %ld\n",
		        asked, nofile, reserve, room > 0 ? room : 0);
		return -1;
	}
	if (asked > 0)
		return asked;
	return room > MAX_CONNECTIONS_AUTO ? MAX_CONNECTIONS_AUTO : (int)room;
}

/* exit_watchdog ends the process 15 s after shutdown began, when tearing
 * the API socket down hangs: nng 1.5.2's pipe reaper can wait for ever on a
 * pipe closed while its replies were blocked (a client that did not read).
 * It runs after the jobs were shut down, so checkpoints and the journal are
 * already on disk. */
static void *exit_watchdog(void *arg)
{
	(void)arg;
	sleep(15);
	pt_error("API socket teardown hung for 15 s (nng); exiting with the journal flushed");
	_exit(0);
	return NULL;
}

/* is_local tells whether url can only be reached from this machine. */
static int is_local(const char *url)
{
	static const char *const local_schemes[] = {"ipc://", "abstract://", "inproc://"};
	static const char *const loopback[] = {"127.", "localhost:", "[::1]:", "::1:"};
	const char *host = strstr(url, "://");

	for (size_t i = 0; i < 3; i++)
		if (strncmp(url, local_schemes[i], strlen(local_schemes[i])) == 0)
			return 1;
	if (host == NULL)
		return 0;
	host += 3;
	for (size_t i = 0; i < 4; i++)
		if (strncmp(host, loopback[i], strlen(loopback[i])) == 0)
			return 1;
	return 0;
}

/* local_devices parses --devices into d: "all" becomes the CPU and every
 * GPU found, and each GPU listed must be here. PIPETRAIN_FAKE_GPUS=N (tests
 * of placement on machines without GPUs only) makes the server believe it
 * has cuda:0..N-1; stages placed on them compute on the CPU. */
static pt_err local_devices(const char *v, pt_server_devices *d)
{
	const char *fake = getenv("PIPETRAIN_FAKE_GPUS");
	int found = 0;

	PT_TRY(pt_server_devices_parse(v, d));
	if (fake != NULL) {
		found = atoi(fake);
		pt_warn(
		    "PIPETRAIN_FAKE_GPUS=%s: placement on %d pretend GPUs whose stages compute on "
		    "the CPU (tests only)",
		    fake, found);
	} else if (d->all || d->n_gpus > 0) {
		if (pt_backend_device_count(PT_DEV_CUDA, &found) != PT_OK)
			found = 0;
	}
	if (d->all)
		for (int k = 0; k < found && d->n_gpus < PT_SERVER_MAX_GPUS; k++)
			d->gpus[d->n_gpus++] = k;
	for (int i = 0; i < d->n_gpus; i++) {
		if (fake != NULL && d->gpus[i] >= found)
			return pt_set_error(PT_ERR_UNSUPPORTED,
			                    "cuda:%d: no such device (%d pretend GPUs)", d->gpus[i],
			                    found);
		if (fake == NULL &&
		    pt_backend_check_device((pt_device){PT_DEV_CUDA, d->gpus[i]}) != PT_OK)
			return pt_set_error(PT_ERR_UNSUPPORTED, "%s", pt_last_error());
	}
	if (d->all)
		pt_info("--devices all: the CPU and %d GPU%s", d->n_gpus,
		        d->n_gpus == 1 ? "" : "s");
	return PT_OK;
}

/* A worker's shutdown is bounded: nng 1.5's nng_close can block for good
 * on the sockets of a stage whose peers vanished while this process was
 * stopped (seen after SIGSTOP, SIGCONT, SIGTERM: the stage's close thread
 * and pt_worker_destroy both waiting inside nng_close). A worker keeps
 * nothing durable, so after WORKER_STOP_S it says so and exits. */
#define WORKER_STOP_S 5

typedef struct stopper {
	pt_worker *w;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
} stopper;

static void *stop_main(void *arg)
{
	stopper *s = arg;
	pt_worker_destroy(s->w);
	pthread_mutex_lock(&s->mu);
	s->done = true;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* worker_stop destroys w on a thread of its own and tells whether that
 * finished within WORKER_STOP_S (the stopper is static: a thread still
 * blocked when the process exits points at nothing freed). */
static bool worker_stop(pt_worker *w)
{
	static stopper s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	struct timespec ts;
	pthread_t t;
	bool done;

	s.w = w;
	if (pthread_create(&t, NULL, stop_main, &s) != 0) {
		pt_worker_destroy(w);
		return true;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += WORKER_STOP_S;
	pthread_mutex_lock(&s.mu);
	while (!s.done && pthread_cond_timedwait(&s.cv, &s.mu, &ts) != ETIMEDOUT)
		;
	done = s.done;
	pthread_mutex_unlock(&s.mu);
	if (done)
		pthread_join(t, NULL);
	return done;
}

int main(int argc, char **argv)
{
	pt_server_config cfg;
	pt_jobs_config jc;
	pt_server_devices devs;
	pt_api_server_config ac;
	pt_jobs *jobs = NULL;
	pt_api_server *srv = NULL;
	pt_metrics *metrics = NULL;
	pt_http *http = NULL;
	pt_log_format log_format = PT_LOG_FORMAT_TEXT;
	pt_log_level log_level = PT_LOG_INFO;
	sigset_t set;
	char files_root[4200];
	int sig = 0, status = 1, max_connections = 0;
	long nofile;

	/* Every thread (nng's included) inherits the mask: only sigwait sees them. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (pt_server_config_load(&cfg, argc, argv) != PT_OK) {
		fprintf(stderr, "pipeserver: %s\n", pt_last_error());
		pt_server_config_fini(&cfg);
		return 2;
	}
	if (cfg.help) {
		pt_server_config_usage(stdout);
		pt_server_config_fini(&cfg);
		return 0;
	}
	pt_log_level_parse(cfg.log_level, &log_level); /* validated by config */
	pt_log_set_level(log_level);
	pt_log_format_parse(cfg.log_format, &log_format); /* validated by config */
	pt_log_set_format(log_format);
	for (int i = 0; i < cfg.n_listen; i++)
		if (!is_local(cfg.listen[i]) && cfg.auth_token == NULL) {
			fprintf(
			    stderr,
			    "pipeserver: %s is not a loopback address: an auth token is required "
			    "(--auth-token-file)\n",
			    cfg.listen[i]);
			pt_server_config_fini(&cfg);
			return 2;
		}
	/* The HTTP endpoint: refused here, before any listener or job starts. */
	if (!cfg.worker && cfg.http[0] && !pt_http_addr_is_loopback(cfg.http) &&
	    cfg.auth_token == NULL) {
		fprintf(
		    stderr,
		    "pipeserver: --http %s is not a loopback address: an auth token is required "
		    "(--auth-token-file)\n",
		    cfg.http);
		pt_server_config_fini(&cfg);
		return 2;
	}
	nofile = raise_nofile();
	if (!cfg.worker && (max_connections = connection_limit(cfg.max_connections, nofile)) < 0) {
		pt_server_config_fini(&cfg);
		return 2;
	}
	if (!cfg.worker)
		pt_info("API connections at most %d (RLIMIT_NOFILE %ld), idle timeout %d s, %d "
		        "requests in progress each",
		        max_connections, nofile, cfg.idle_timeout, cfg.max_outstanding);
	/* --device cuda:N on a machine (or build) without that GPU: say so now. */
	{
		pt_device dev;
		if (pt_device_parse(cfg.device, &dev) != PT_OK) {
			fprintf(stderr, "pipeserver: --device %s: %s\n", cfg.device,
			        pt_last_error());
			pt_server_config_fini(&cfg);
			return 2;
		}
		/* The backend's message starts with the device: "cuda:0: no CUDA ...". */
		if (pt_backend_check_device(dev) != PT_OK) {
			fprintf(stderr, "pipeserver: --device %s\n", pt_last_error());
			pt_server_config_fini(&cfg);
			return 2;
		}
	}

	/* Benchmarks and tests: sleep-based stage work (0: none), in the stage
	 * a worker serves or the stages jobs run in this process. */
	pt_stage_host_set_task_delay(cfg.task_delay_ms);
	if (cfg.worker) {
		pt_worker_config wc = {.urls = (const char *const *)cfg.listen,
		                       .n_urls = cfg.n_listen,
		                       .auth_token = cfg.auth_token,
		                       .advertise_host = cfg.advertise_host,
		                       .tls_cert = cfg.tls_cert,
		                       .tls_key = cfg.tls_key,
		                       .tls_ca = cfg.tls_ca,
		                       .peer_ca = cfg.worker_tls_ca,
		                       .close_delay_ms = cfg.close_delay_ms};
		pt_worker *w = NULL;
		if (pt_worker_start(&w, &wc, stdout) != PT_OK) {
			fprintf(stderr, "pipeserver: %s\n", pt_last_error());
			goto out;
		}
		while (sigwait(&set, &sig) != 0)
			;
		pt_info("signal %d (%s): worker shutting down", sig, strsignal(sig));
		if (!worker_stop(w)) {
			pt_warn("worker: shutdown still blocked in nng_close after %d s (the "
			        "sockets of a stage whose peers vanished); exiting without it",
			        WORKER_STOP_S);
			fflush(stdout);
			fflush(stderr);
			_exit(0);
		}
		status = 0;
		goto out;
	}

	memset(&jc, 0, sizeof(jc));
	jc.data_dir = cfg.data_dir;
	jc.device = cfg.device;
	/* Data paths in job specs stay beneath the files root; the default is
	 * <data-dir>/files, made below once the data directory exists. */
	if (cfg.files_root[0])
		snprintf(files_root, sizeof(files_root), "%s", cfg.files_root);
	else
		snprintf(files_root, sizeof(files_root), "%s/files", cfg.data_dir);
	jc.files_root = files_root;
	jc.any_path = cfg.allow_any_path;
	jc.worker_allow = cfg.worker_allow[0] ? cfg.worker_allow : NULL;
	jc.threads = cfg.threads;
	jc.max_jobs = cfg.max_jobs;
	jc.max_queued = cfg.max_queued;
	jc.min_free_mb = cfg.min_free_mb;
	jc.keep_jobs = cfg.keep_jobs;
	jc.watch_interval_ms = cfg.watch_interval_ms;
	jc.watch_replies = cfg.watch_replies;
	jc.metrics_sync_ms = cfg.metrics_sync_ms;
	jc.memory_limit = cfg.memory_limit;
	/* Workers of a cluster share the server's token; --advertise-host names
	 * the address they dial back (empty: the one they connected to). */
	jc.worker_token = cfg.auth_token;
	jc.advertise_host = cfg.advertise_host[0] ? cfg.advertise_host : NULL;
	jc.worker_tls = (pt_job_tls){cfg.tls_cert, cfg.tls_key, cfg.worker_tls_ca};
	jc.pool = cfg.pool;
	if (local_devices(cfg.devices, &devs) != PT_OK) {
		fprintf(stderr, "pipeserver: --devices %s: %s\n", cfg.devices, pt_last_error());
		goto out;
	}
	jc.no_local = !devs.cpu;
	jc.gpus = devs.gpus;
	jc.n_gpus = devs.n_gpus;
	jc.fake_gpus = getenv("PIPETRAIN_FAKE_GPUS") != NULL;
	jc.strict_priority = cfg.strict_priority;
	if (pt_jobs_create(&jobs, &jc) != PT_OK) {
		fprintf(stderr, "pipeserver: %s\n", pt_last_error());
		goto out;
	}
	if (!cfg.files_root[0] && mkdir(files_root, 0750) != 0 && errno != EEXIST)
		pt_warn("files root %s: %s", files_root, strerror(errno));
	pt_info("data files: beneath %s%s", files_root,
	        cfg.allow_any_path ? " or anywhere (--allow-any-path)" : "");

	memset(&ac, 0, sizeof(ac));
	ac.urls = (const char *const *)cfg.listen;
	ac.n_urls = cfg.n_listen;
	ac.auth_token = cfg.auth_token;
	ac.tls_cert = cfg.tls_cert;
	ac.tls_key = cfg.tls_key;
	ac.tls_ca = cfg.tls_ca;
	ac.contexts = cfg.contexts;
	ac.max_contexts = cfg.max_contexts;
	ac.workers = cfg.workers;
	ac.max_request = (size_t)cfg.max_request_mb << 20;
	ac.max_connections = max_connections;
	ac.idle_timeout_ms = cfg.idle_timeout * 1000;
	ac.max_outstanding = cfg.max_outstanding;
	ac.device = cfg.device;
	ac.version = PT_VERSION;
	ac.jobs = jobs;
	if (pt_api_server_start(&srv, &ac, stdout) != PT_OK) {
		fprintf(stderr, "pipeserver: %s\n", pt_last_error());
		goto out;
	}
	if (cfg.http[0]) {
		pt_metrics_config mc = {
		    .jobs = jobs, .version = PT_VERSION, .device = cfg.device, .grace_s = 300};
		pt_http_config hc = {.addr = cfg.http,
		                     .auth_token = cfg.auth_token,
		                     .data_dir = cfg.data_dir,
		                     .device = cfg.device,
		                     .jobs = jobs,
		                     .timeout_s = cfg.http_timeout,
		                     .max_connections = cfg.http_max_connections};
		if (pt_metrics_create(&metrics, &mc) == PT_OK)
			hc.metrics = metrics;
		if (metrics == NULL || pt_http_start(&http, &hc, stdout) != PT_OK) {
			fprintf(stderr, "pipeserver: --http: %s\n", pt_last_error());
			goto out;
		}
	}

	for (;;) {
		while (sigwait(&set, &sig) != 0)
			;
		if (sig != SIGHUP)
			break;
		if (pt_jobs_reload_pool(jobs) != PT_OK)
			pt_error("SIGHUP: pool not re-read: %s", pt_last_error());
		else
			pt_info("SIGHUP: pool re-read");
	}
	pt_info("signal %d (%s): shutting down", sig, strsignal(sig));
	pt_http_destroy(http);
	http = NULL;
	pt_api_server_drain(srv);
	pt_jobs_shutdown(jobs);
	pt_info("jobs stopped; closing the API socket");
	{
		pthread_t wd;
		if (pthread_create(&wd, NULL, exit_watchdog, NULL) == 0)
			pthread_detach(wd);
	}
	status = 0;
out:
	pt_http_destroy(http);
	pt_metrics_destroy(metrics);
	pt_api_server_destroy(srv);
	pt_jobs_destroy(jobs);
	pt_server_config_fini(&cfg);
	if (status == 0)
		pt_info("stopped");
	return status;
}
