/* config.c - the pipeserver option table and its three sources (see config.h).
 *
 * Each level (file, environment, flags) is applied in turn over the defaults,
 * so the last one to name an option wins. Values are validated as they are
 * applied, and the error names where the bad value came from.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "job.h"
#include "log.h"

typedef enum opt_type { OPT_STRING, OPT_INT, OPT_LIST, OPT_BOOL } opt_type;

typedef struct opt_desc {
	const char *name; /* with '_'; the flag uses '-' */
	opt_type type;
	size_t field;
	const char *def;
	int min, max; /* OPT_INT range */
	pt_err (*validate)(const char *value);
	const char *help;
} opt_desc;

static pt_err valid_url(const char *v)
{
	static const char *const schemes[] = {"tcp://",    "tls+tcp://", "ipc://", "abstract://",
	                                      "inproc://", "tcp4://",    "tcp6://"};
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strncmp(v, schemes[i], strlen(schemes[i])) == 0)
			return PT_OK;
	return pt_set_error(PT_ERR_INVALID,
	                    "'%s' is not a tcp://, tls+tcp://, ipc:// or abstract:// URL", v);
}

static pt_err valid_device(const char *v)
{
	char *end;
	long n;

	if (strcmp(v, "cpu") == 0)
		return PT_OK;
	if (strncmp(v, "cuda:", 5) == 0 && isdigit((unsigned char)v[5])) {
		errno = 0;
		n = strtol(v + 5, &end, 10);
		if (*end == '\0' && errno == 0 && n >= 0 && n < 64)
			return PT_OK;
	}
	return pt_set_error(PT_ERR_INVALID, "'%s' is not cpu or cuda:N", v);
}

static pt_err valid_level(const char *v)
{
	pt_log_level level;
	if (pt_log_level_parse(v, &level) == PT_OK)
		return PT_OK;
	return pt_set_error(PT_ERR_INVALID, "'%s' is not debug, info, warn, error or off", v);
}

static pt_err valid_log_format(const char *v)
{
	if (strcmp(v, "text") == 0 || strcmp(v, "json") == 0)
		return PT_OK;
	return pt_set_error(PT_ERR_INVALID, "'%s' is not text or json", v);
}

/* valid_http accepts "" (off) or HOST:PORT with a port 0..65535. */
static pt_err valid_http(const char *v)
{
	const char *c = strrchr(v, ':');
	char *end;
	long port;

	if (*v == '\0')
		return PT_OK;
	if (c == NULL || c == v || c[1] == '\0')
		return pt_set_error(PT_ERR_INVALID, "'%s' is not HOST:PORT", v);
	errno = 0;
	port = strtol(c + 1, &end, 10);
	if (*end != '\0' || errno != 0 || port < 0 || port > 65535)
		return pt_set_error(PT_ERR_INVALID, "'%s': bad port", v);
	return PT_OK;
}

/* valid_memory accepts "" (the cgroup's or the machine's memory) or a size. */
static pt_err valid_memory(const char *v)
{
	uint64_t n;
	return *v ? pt_job_memory_parse(v, &n) : PT_OK;
}

static pt_err valid_worker_allow(const char *v)
{
	return pt_job_worker_allow_parse(v);
}

static pt_err valid_pool(const char *v)
{
	if (*v == '\0' || *v == '@')
		return PT_OK;
	for (const char *p = v; *p;) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		while (n > 0 && *p == ' ')
			p++, n--;
		if (!(n > 6 && (strncmp(p, "tcp://", 6) == 0 || strncmp(p, "ipc://", 6) == 0)) &&
		    !(n > 10 && strncmp(p, "tls+tcp://", 10) == 0))
			return pt_set_error(PT_ERR_INVALID,
			                    "'%.*s' is not a tcp://, tls+tcp:// or ipc:// URL",
			                    (int)n, p);
		p = e ? e + 1 : p + n;
	}
	return PT_OK;
}

pt_err pt_server_devices_parse(const char *v, pt_server_devices *d)
{
	const char *p = v;

	memset(d, 0, sizeof(*d));
	if (*v == '\0')
		return pt_set_error(
		    PT_ERR_INVALID,
		    "empty: cpu, cuda:N, a comma-separated list of them, all or none");
	if (strcmp(v, "none") == 0)
		return PT_OK;
	if (strcmp(v, "all") == 0) {
		d->cpu = d->all = true;
		return PT_OK;
	}
	while (*p) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		char item[32], *end;
		while (n > 0 && *p == ' ')
			p++, n--;
		while (n > 0 && p[n - 1] == ' ')
			n--;
		if (n == 0 || n >= sizeof(item))
			return pt_set_error(PT_ERR_INVALID, "'%s': an empty or overlong entry", v);
		memcpy(item, p, n);
		item[n] = '\0';
		if (strcmp(item, "cpu") == 0) {
			d->cpu = true;
		} else if (strncmp(item, "cuda:", 5) == 0 && item[5] >= '0' && item[5] <= '9') {
			long k = strtol(item + 5, &end, 10);
			if (*end != '\0' || k > 1023)
				return pt_set_error(PT_ERR_INVALID,
				                    "'%s': cuda:N with N a device number", item);
			for (int i = 0; i < d->n_gpus; i++)
				if (d->gpus[i] == (int)k)
					return pt_set_error(PT_ERR_INVALID, "'%s' is listed twice",
					                    item);
			if (d->n_gpus == PT_SERVER_MAX_GPUS)
				return pt_set_error(PT_ERR_INVALID, "more than %d GPUs",
				                    PT_SERVER_MAX_GPUS);
			d->gpus[d->n_gpus++] = (int)k;
		} else {
			return pt_set_error(
			    PT_ERR_INVALID,
			    "'%s': cpu, cuda:N, a comma-separated list of them, all or "
			    "none",
			    item);
		}
		p = e ? e + 1 : p + n;
		if (e && *p == '\0')
			return pt_set_error(PT_ERR_INVALID, "'%s': an empty entry", v);
	}
	return PT_OK;
}

static pt_err valid_devices(const char *v)
{
	pt_server_devices d;
	return pt_server_devices_parse(v, &d);
}

static pt_err valid_nonempty(const char *v)
{
	return *v ? PT_OK : pt_set_error(PT_ERR_INVALID, "empty value");
}

#define F(m) offsetof(pt_server_config, m)
static const opt_desc options[] = {
    {"listen", OPT_LIST, F(listen), "tcp://127.0.0.1:7600", 0, 0, valid_url,
     "URL to listen on (repeatable; tcp://, tls+tcp://, ipc://, abstract://); a non-loopback "
     "address needs an auth token"},
    {"data_dir", OPT_STRING, F(data_dir), "./pipetrain-data", 0, 0, valid_nonempty,
     "directory of the job journal, specs and checkpoints"},
    {"config", OPT_STRING, F(config_file), "", 0, 0, NULL,
     "config file of `name = value` lines (same names as the flags)"},
    {"auth_token_file", OPT_STRING, F(auth_token_file), "", 0, 0, NULL,
     "file whose first line is the token every request must carry"},
    {"device", OPT_STRING, F(device), "cpu", 0, 0, valid_device,
     "device of jobs that do not name one: cpu or cuda:N"},
    {"files_root", OPT_STRING, F(files_root), "", 0, 0, NULL,
     "directory that data paths in job specs are relative to and must stay inside, symlinks "
     "followed (empty: <data-dir>/files)"},
    {"allow_any_path", OPT_BOOL, F(allow_any_path), "false", 0, 0, NULL,
     "let job specs name data files outside files_root (absolute paths, '..')"},
    {"worker_allow", OPT_STRING, F(worker_allow), "", 0, 0, valid_worker_allow,
     "CIDR|host[,...]: the only worker addresses placement.workers may name (empty: any)"},
    {"tls_cert", OPT_STRING, F(tls_cert), "", 0, 0, NULL,
     "PEM certificate for tls+tcp:// listeners"},
    {"tls_key", OPT_STRING, F(tls_key), "", 0, 0, NULL,
     "PEM private key for tls+tcp:// listeners (may be the tls_cert file)"},
    {"tls_ca", OPT_STRING, F(tls_ca), "", 0, 0, NULL,
     "PEM CA bundle: when set, TLS clients must present a certificate it signed"},
    {"worker_tls_ca", OPT_STRING, F(worker_tls_ca), "", 0, 0, NULL,
     "PEM CA bundle that verifies tls+tcp:// workers' certificates and the stage data "
     "ports of jobs on them (set on the server and on each tls+tcp:// worker)"},
    {"log_level", OPT_STRING, F(log_level), "info", 0, 0, valid_level,
     "debug, info, warn, error or off"},
    {"log_format", OPT_STRING, F(log_format), "text", 0, 0, valid_log_format,
     "log lines as text or json (one object a line, for log shippers)"},
    {"http", OPT_STRING, F(http), "", 0, 0, valid_http,
     "HOST:PORT of the HTTP endpoint (/metrics, /healthz, /readyz, dashboard); empty: off. "
     "A non-loopback address needs an auth token"},
    {"http_max_connections", OPT_INT, F(http_max_connections), "0", 0, 65536, NULL,
     "open HTTP connections at most; one more shuts down the one that has waited the longest "
     "for a request (0: 256, or a quarter of the RLIMIT_NOFILE soft limit when lower)"},
    {"http_timeout", OPT_INT, F(http_timeout), "10", 1, 3600, NULL,
     "seconds an HTTP connection may stay silent; a connection that has not sent a whole "
     "request within twice this is closed (a client trickling bytes)"},
    {"contexts", OPT_INT, F(contexts), "16", 1, 1024, NULL,
     "requests received concurrently (REP contexts)"},
    {"max_contexts", OPT_INT, F(max_contexts), "1024", 1, 65536, NULL,
     "contexts at most, parked WatchMetrics long polls included"},
    {"workers", OPT_INT, F(workers), "4", 1, 256, NULL,
     "worker threads for requests that block (submit, cancel, checkpoint reads)"},
    {"max_request_mb", OPT_INT, F(max_request_mb), "64", 1, 2047, NULL,
     "largest request in MiB; larger ones drop the connection"},
    {"max_connections", OPT_INT, F(max_connections), "0", 0, 1000000, NULL,
     "open API connections at most; one more closes the one idle the longest (0: the "
     "RLIMIT_NOFILE soft limit less 128 + 1/8 of it for jobs, at most 65536)"},
    {"idle_timeout", OPT_INT, F(idle_timeout), "60", 0, 86400, NULL,
     "seconds an API connection may stay without a request in progress before it is closed "
     "(a parked WatchMetrics is in progress); 0: never"},
    {"max_outstanding", OPT_INT, F(max_outstanding), "32", 1, 65536, NULL,
     "requests in progress per API connection (parked WatchMetrics included); requests beyond "
     "it, and replies left unread for 10 s, are dropped"},
    {"threads", OPT_INT, F(threads), "0", 0, 4096, NULL,
     "CPU threads per job (0: all cores, split evenly between max_jobs)"},
    {"max_jobs", OPT_INT, F(max_jobs), "1", 1, 64, NULL,
     "jobs that run at once on each device, first come first served; each is admitted "
     "against memory_limit / max_jobs"},
    {"max_queued", OPT_INT, F(max_queued), "1000", 1, 1000000, NULL,
     "jobs waiting to run at most, all devices together; a submit beyond it is refused "
     "(Unavailable) until one starts or is cancelled"},
    {"keep_jobs", OPT_INT, F(keep_jobs), "1000", 0, 100000000, NULL,
     "ended jobs (succeeded, failed, cancelled, interrupted with resume false) kept, with their "
     "journals and checkpoints; "
     "when one more ends, the one that ended first is deleted, files and all (0: keep all)"},
    {"min_free_mb", OPT_INT, F(min_free_mb), "256", 0, 1000000000, NULL,
     "a submit is refused (Unavailable) while the data dir's file system has less than "
     "this many MiB free (checkpoints and journals live there); 0: no check"},
    {"memory_limit", OPT_STRING, F(memory_limit), "", 0, 0, valid_memory,
     "host memory a job may need (bytes, or K/M/G/T suffixes); a submitted job whose "
     "estimated peak exceeds it is refused (empty: the cgroup's memory.max or "
     "memory.limit_in_bytes, else MemTotal)"},
    {"watch_interval_ms", OPT_INT, F(watch_interval_ms), "100", 0, 60000, NULL,
     "parked WatchMetrics requests are woken at most this often while metrics arrive"},
    {"watch_replies", OPT_INT, F(watch_replies), "250", 0, 1000000, NULL,
     "a job's parked WatchMetrics requests get at most this many replies a second in all: "
     "with more watchers than that each waits longer than watch_interval_ms (0: no limit)"},
    {"metrics_sync_ms", OPT_INT, F(metrics_sync_ms), "1000", 0, 60000, NULL,
     "metric points are fsynced to the journal at least this often"},
    {"worker", OPT_BOOL, F(worker), "false", 0, 0, NULL,
     "run as a worker: serve pipeline stages of jobs whose placement.workers name this "
     "process's listen URL, instead of the job API"},
    {"advertise_host", OPT_STRING, F(advertise_host), "", 0, 0, NULL,
     "with --worker: host name or IP that peers dial for this process's stage data (empty: "
     "the address the coordinator reached this worker on)"},
    {"pool", OPT_STRING, F(pool), "", 0, 0, valid_pool,
     "worker pool: `pipeserver --worker` URLs, comma-separated, or @FILE with one a line "
     "(re-read on SIGHUP); jobs that name no placement.workers go to free pool workers"},
    {"devices", OPT_STRING, F(devices), "cpu", 0, 0, valid_devices,
     "where stages of jobs without workers run in this process: cpu, cuda:N, a list of them "
     "(cpu,cuda:0,cuda:1: one stage per GPU, jobs side by side), all (the CPU and every "
     "GPU found), or none (only on pool workers)"},
    {"strict_priority", OPT_BOOL, F(strict_priority), "false", 0, 0, NULL,
     "a queued job waiting for more pool workers than are free holds up every job behind "
     "it (default: jobs behind it that fit start first)"},
    {"task_delay_ms", OPT_INT, F(task_delay_ms), "0", 0, 60000, NULL,
     "for tests and benchmarks only: every forward and backward of the stage a --worker "
     "serves, or of the stages jobs run in this process, sleeps this long first (work that "
     "does not need the CPU; an interleaved chunk 1/v of it)"},
    {"close_delay_ms", OPT_INT, F(close_delay_ms), "0", 0, 600000, NULL,
     "for tests only: a --worker closes an ended stage's sockets this long after the stage "
     "ends, as a close stuck in nng would (past 8 pending it refuses new stages)"},
    {"help", OPT_BOOL, F(help), "false", 0, 0, NULL, "print this table and exit"},
};
#undef F
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static void *field_of(pt_server_config *c, const opt_desc *o)
{
	return (char *)c + o->field;
}

static void clear_list(pt_server_config *c)
{
	for (int i = 0; i < c->n_listen; i++)
		free(c->listen[i]);
	c->n_listen = 0;
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* set_value applies one value of option o; append adds to a list. */
static pt_err set_value(pt_server_config *c, const opt_desc *o, const char *value, bool append,
                        const char *source)
{
	pt_err rv;

	if (o->validate && o->type != OPT_LIST && (rv = o->validate(value)) != PT_OK)
		return pt_set_error(rv, "%s (from %s): %s", o->name, source, pt_last_error());
	switch (o->type) {
	case OPT_STRING: {
		char **p = field_of(c, o), *dup = strdup(value);
		if (dup == NULL)
			return pt_set_error(PT_ERR_NOMEM, "config");
		free(*p);
		*p = dup;
		return PT_OK;
	}
	case OPT_INT: {
		char *end;
		long n;
		errno = 0;
		n = strtol(value, &end, 10);
		if (end == value || *end != '\0' || errno != 0 || n < o->min || n > o->max)
			return pt_set_error(PT_ERR_INVALID,
			                    "%s (from %s): '%s' is not an integer in [%d, %d]",
			                    o->name, source, value, o->min, o->max);
		*(int *)field_of(c, o) = (int)n;
		return PT_OK;
	}
	case OPT_BOOL: {
		bool *p = field_of(c, o);
		if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0 ||
		    strcmp(value, "yes") == 0)
			*p = true;
		else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0 ||
		         strcmp(value, "no") == 0)
			*p = false;
		else
			return pt_set_error(PT_ERR_INVALID,
			                    "%s (from %s): '%s' is not true or false", o->name,
			                    source, value);
		return PT_OK;
	}
	case OPT_LIST: {
		char *copy = strdup(value), *save = NULL, *tok;
		if (copy == NULL)
			return pt_set_error(PT_ERR_NOMEM, "config");
		if (!append)
			clear_list(c);
		rv = PT_OK;
		for (tok = strtok_r(copy, ",", &save); tok && rv == PT_OK;
		     tok = strtok_r(NULL, ",", &save)) {
			tok = trim(tok);
			if (*tok == '\0')
				continue;
			if ((rv = o->validate(tok)) != PT_OK) {
				rv = pt_set_error(rv, "%s (from %s): %s", o->name, source,
				                  pt_last_error());
			} else if (c->n_listen >= PT_SERVER_MAX_LISTEN) {
				rv = pt_set_error(PT_ERR_RANGE, "%s (from %s): more than %d URLs",
				                  o->name, source, PT_SERVER_MAX_LISTEN);
			} else if ((c->listen[c->n_listen] = strdup(tok)) == NULL) {
				rv = pt_set_error(PT_ERR_NOMEM, "config");
			} else {
				c->n_listen++;
			}
		}
		free(copy);
		return rv;
	}
	}
	return PT_ERR_INVALID;
}

/* find_option looks a name up, treating '-' and '_' alike. */
static const opt_desc *find_option(const char *name, size_t len)
{
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const char *n = options[i].name;
		size_t k;
		if (strlen(n) != len)
			continue;
		for (k = 0; k < len; k++) {
			char a = name[k] == '-' ? '_' : name[k];
			if (a != n[k])
				break;
		}
		if (k == len)
			return &options[i];
	}
	return NULL;
}

static pt_err load_file(pt_server_config *c, const char *path)
{
	char *text, *line, *save = NULL;
	size_t len;
	int lineno = 0;
	pt_err rv;

	if ((rv = pt_file_read(path, 1u << 20, (void **)&text, &len)) != PT_OK)
		return pt_set_error(rv, "config: %s", pt_last_error());
	rv = PT_OK;
	for (line = strtok_r(text, "\n", &save); line && rv == PT_OK;
	     line = strtok_r(NULL, "\n", &save)) {
		char *eq, *name, *value, src[64];
		const opt_desc *o;
		lineno++;
		line = trim(line);
		if (*line == '\0' || *line == '#')
			continue;
		if ((eq = strchr(line, '=')) == NULL) {
			rv = pt_set_error(PT_ERR_INVALID, "%s:%d: expected `name = value`", path,
			                  lineno);
			break;
		}
		*eq = '\0';
		name = trim(line);
		value = trim(eq + 1);
		if (strlen(value) >= 2 && value[0] == '"' && value[strlen(value) - 1] == '"') {
			value[strlen(value) - 1] = '\0';
			value++;
		}
		if ((o = find_option(name, strlen(name))) == NULL ||
		    o->field == offsetof(pt_server_config, config_file)) {
			rv = pt_set_error(PT_ERR_INVALID, "%s:%d: unknown option '%s'", path,
			                  lineno, name);
			break;
		}
		snprintf(src, sizeof(src), "%s:%d", path, lineno);
		rv = set_value(c, o, value, false, src);
	}
	free(text);
	return rv;
}

static void env_name(const opt_desc *o, char *out, size_t n)
{
	size_t k = (size_t)snprintf(out, n, "PIPETRAIN_");
	for (const char *p = o->name; *p && k + 1 < n; p++)
		out[k++] = (char)toupper((unsigned char)*p);
	out[k] = '\0';
}

static pt_err load_env(pt_server_config *c)
{
	char name[64];
	const char *v;

	for (size_t i = 0; i < N_OPTIONS; i++) {
		if (options[i].field == offsetof(pt_server_config, config_file))
			continue;
		env_name(&options[i], name, sizeof(name));
		if ((v = getenv(name)) != NULL)
			PT_TRY(set_value(c, &options[i], v, false, name));
	}
	return PT_OK;
}

/* flag_value splits argv[*i] ("--name=value" or "--name value"). */
static pt_err parse_flag(int argc, char **argv, int *i, const opt_desc **o, const char **value)
{
	const char *arg = argv[*i], *eq;

	if (strncmp(arg, "--", 2) != 0)
		return pt_set_error(PT_ERR_INVALID, "unexpected argument '%s' (try --help)", arg);
	arg += 2;
	eq = strchr(arg, '=');
	if ((*o = find_option(arg, eq ? (size_t)(eq - arg) : strlen(arg))) == NULL)
		return pt_set_error(PT_ERR_INVALID, "unknown option '%s' (try --help)", argv[*i]);
	if (eq) {
		*value = eq + 1;
	} else if ((*o)->type == OPT_BOOL) {
		*value = "true";
	} else if (*i + 1 < argc) {
		*value = argv[++*i];
	} else {
		return pt_set_error(PT_ERR_INVALID, "option '%s' needs a value", argv[*i]);
	}
	return PT_OK;
}

static pt_err read_token(pt_server_config *c)
{
	char *text;
	size_t len;
	pt_err rv;

	if (c->auth_token_file == NULL || c->auth_token_file[0] == '\0')
		return PT_OK;
	if ((rv = pt_file_read(c->auth_token_file, 64 * 1024, (void **)&text, &len)) != PT_OK)
		return pt_set_error(rv, "auth_token_file: %s", pt_last_error());
	text[strcspn(text, "\r\n")] = '\0';
	if (text[0] == '\0') {
		free(text);
		return pt_set_error(PT_ERR_INVALID, "auth_token_file: %s: empty token",
		                    c->auth_token_file);
	}
	c->auth_token = text;
	return PT_OK;
}

pt_err pt_server_config_load(pt_server_config *c, int argc, char **argv)
{
	const char *config_path;
	const opt_desc *o;
	const char *value;
	bool listen_from_flags = false;
	pt_err rv;

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < N_OPTIONS; i++)
		PT_TRY(set_value(c, &options[i], options[i].def, false, "default"));

	/* The config file is found first (a flag or the environment names it). */
	config_path = getenv("PIPETRAIN_CONFIG");
	for (int i = 1; i < argc; i++) {
		PT_TRY(parse_flag(argc, argv, &i, &o, &value));
		if (o->field == offsetof(pt_server_config, config_file))
			config_path = value;
		if (o->field == offsetof(pt_server_config, help))
			c->help = true;
	}
	if (c->help)
		return PT_OK;
	if (config_path && *config_path) {
		PT_TRY(set_value(c, find_option("config", 6), config_path, false, "flags"));
		PT_TRY(load_file(c, config_path));
	}
	PT_TRY(load_env(c));
	for (int i = 1; i < argc; i++) {
		PT_TRY(parse_flag(argc, argv, &i, &o, &value));
		if (o->type == OPT_LIST) {
			PT_TRY(set_value(c, o, value, listen_from_flags, "flags"));
			listen_from_flags = true;
		} else {
			PT_TRY(set_value(c, o, value, false, "flags"));
		}
	}
	if (c->n_listen == 0)
		return pt_set_error(PT_ERR_INVALID, "listen: no URL");
	if (c->max_contexts < c->contexts)
		c->max_contexts = c->contexts;
	if ((rv = read_token(c)) != PT_OK)
		return rv;
	return PT_OK;
}

void pt_server_config_usage(FILE *f)
{
	char env[64], flag[64];

	fprintf(f,
	        "usage: pipeserver [options]\n\n"
	        "Options (precedence: flags > PIPETRAIN_* environment > config file > default):\n");
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const opt_desc *o = &options[i];
		size_t k;
		snprintf(flag, sizeof(flag), "--%s", o->name);
		for (k = 2; flag[k]; k++)
			if (flag[k] == '_')
				flag[k] = '-';
		env_name(o, env, sizeof(env));
		fprintf(f, "  %-22s %-30s default: %s\n      %s\n", flag, env,
		        o->def[0] ? o->def : "(none)", o->help);
	}
}

void pt_server_config_fini(pt_server_config *c)
{
	if (c == NULL)
		return;
	clear_list(c);
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].type == OPT_STRING) {
			char **p = field_of(c, &options[i]);
			free(*p);
			*p = NULL;
		}
	free(c->auth_token);
	c->auth_token = NULL;
}
