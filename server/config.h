/* config.h - pipeserver options: one table (name, environment variable,
 * type, default, validator, help) read from flags, PIPETRAIN_* environment
 * variables and a config file of `name = value` lines.
 *
 * Precedence: flags > environment > config file > defaults. A list option
 * (listen) takes every value given at the winning level: repeat the flag, or
 * separate values with commas in the environment or the file. Option names
 * use '-' on the command line (--data-dir) and '_' or '-' in files; the
 * environment variable is PIPETRAIN_ and the name upper-cased with '_'.
 */
#ifndef PT_SERVER_CONFIG_H
#define PT_SERVER_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "error.h"

#define PT_SERVER_MAX_LISTEN 16

/* pt_server_config holds every option; strings are owned (config_fini). */
typedef struct pt_server_config {
	char *listen[PT_SERVER_MAX_LISTEN]; /* URLs */
	int n_listen;
	char *data_dir;
	char *config_file;
	char *auth_token_file;
	char *auth_token;    /* read from auth_token_file at load time */
	char *device;        /* "cpu" or "cuda:N": the default device of jobs */
	char *files_root;    /* data paths in job specs are beneath it ("": <data_dir>/files) */
	bool allow_any_path; /* data paths may leave files_root */
	char *worker_allow;  /* CIDR|host[,...] placement.workers may name ("": any) */
	char *tls_cert;      /* PEM certificate (chain) for tls+tcp:// listeners */
	char *tls_key;       /* PEM private key (may be the same file as tls_cert) */
	char *tls_ca;        /* PEM CA: when set, clients must present a certificate */
	char *worker_tls_ca; /* PEM CA verifying tls+tcp:// workers and stage data ports */
	char *log_level;
	char *log_format;         /* text or json */
	char *http;               /* --http HOST:PORT of the metrics/dashboard endpoint ("": off) */
	int http_max_connections; /* open HTTP connections at most (0: 256 or RLIMIT_NOFILE / 4) */
	int http_timeout;         /* HTTP idle timeout, s; a whole request within twice it */
	int contexts;             /* REP contexts receiving at once */
	int max_contexts;         /* contexts at most (parked long polls included) */
	int workers;              /* worker threads for blocking requests */
	int max_request_mb;       /* NNG_OPT_RECVMAXSZ in MiB */
	int max_connections;      /* open API connections at most (0: from RLIMIT_NOFILE) */
	int idle_timeout;         /* seconds before an idle API connection is closed (0: never) */
	int max_outstanding;      /* requests in progress per API connection */
	int threads;              /* CPU threads per job (0: all cores / max_jobs) */
	int max_jobs;             /* jobs running at once per device */
	int max_queued;           /* jobs waiting at most, all devices */
	int min_free_mb;          /* submits refused below this much free disk (0: no check) */
	int keep_jobs;            /* ended jobs kept (0: all) */
	int watch_interval_ms;    /* parked WatchMetrics are woken at most this often */
	int watch_replies;        /* a job's parked WatchMetrics get at most this many replies a
	                           * second in all (0: no budget) */
	int metrics_sync_ms;      /* metrics are fsynced at least this often */
	char *memory_limit;       /* admission limit of a job's memory ("": cgroup or MemTotal) */
	bool worker;              /* --worker: host stages for other servers' jobs (worker.h) */
	char *advertise_host;     /* --worker: host peers dial for stage data ("": automatic) */
	char *pool;               /* worker pool: "URL,..." or "@FILE" ("": none) */
	char *devices;            /* "cpu", "cuda:0,cuda:1", "all" or "none" (pt_server_devices) */
	bool strict_priority;     /* a job waiting for pool workers holds up those behind it */
	int close_delay_ms;       /* --worker, tests: an ended stage's sockets close this late */
	int task_delay_ms;        /* --worker, tests and benchmarks: stage tasks sleep first */
	bool help;
} pt_server_config;

/* --devices, parsed: the CPU and the GPUs stages of jobs without workers
 * may run on in this process. "all" sets all (and cpu): the caller adds
 * every GPU it finds. */
#define PT_SERVER_MAX_GPUS 64
typedef struct pt_server_devices {
	bool cpu, all;
	int gpus[PT_SERVER_MAX_GPUS];
	int n_gpus;
} pt_server_devices;

pt_err pt_server_devices_parse(const char *v, pt_server_devices *d);

/* pt_server_config_load fills c from defaults, the config file (--config or
 * PIPETRAIN_CONFIG), the environment and argv, validates every value and
 * reads the auth token file. Errors (PT_ERR_INVALID naming the option and
 * its source) leave c to be finalised. Not thread-safe (reads environ). */
pt_err pt_server_config_load(pt_server_config *c, int argc, char **argv);

/* pt_server_config_usage prints the option table with defaults to f. */
void pt_server_config_usage(FILE *f);

/* pt_server_config_fini frees c's strings; accepts a zeroed or partly
 * loaded config. */
void pt_server_config_fini(pt_server_config *c);

#endif
