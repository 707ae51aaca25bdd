/* test_workers.c - jobs whose stages run in `pipeserver --worker` processes.
 *
 * Starts real worker processes (build/server/pipeserver, found next to this
 * program's directory through /proc/self/exe) on tcp://127.0.0.1:0 and
 * checks: a 2-stage digits job on two workers gives the same losses, bitwise,
 * as the same job on local stage threads, and the same communicator message
 * counts per rank (the workers' stages send theirs with their timelines),
 * and a second job runs on the same workers; the handshake refuses a wrong
 * protocol, a wrong token and a second join to a busy worker, each with its
 * message; a normal pipeserver runs a submitted job on the workers, and its
 * job info has communicator counters for every rank. Heartbeats: a worker
 * killed or hung (SIGSTOP) mid-job fails the job within
 * placement.worker_timeout_ms with an error naming the stage and the worker,
 * the other worker is idle again at once and the hung one once it runs
 * again; with max_restarts and a spare the job finishes with the same
 * losses, bitwise, as an undisturbed run; a worker whose coordinator stops
 * pinging abandons its stage, and a job that finds a worker held by such a
 * session waits for it. Every process exits 0 on SIGTERM.
 */
#include "api/api.h"
#include "fileio.h"
#include "handshake.h"
#include "job.h"
#include "pt_test.h"
#include "runtime.h"
#include "worker_fixture.h"

#include <limits.h>
#include <math.h>
#include <inttypes.h>
#include <pthread.h>
#include <nng/protocol/pipeline0/push.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STEPS 30

static char server_bin[PATH_MAX + 64];
static char tmpdir[256];

static const char *log_path(void)
{
	static char path[300];
	snprintf(path, sizeof(path), "%s/processes.log", tmpdir);
	return path;
}

/* proc_start runs pipeserver with args (NULL-terminated). */
static bool proc_start(wf_proc *p, const char *const *args)
{
	const char *argv[32];
	int n = 0;

	argv[n++] = server_bin;
	for (int i = 0; args[i] && n < 30; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	return wf_proc_start(p, argv, log_path());
}

static bool worker_start(wf_proc *p, const char *token_file)
{
	const char *args[] = {"--worker",    "--listen", "tcp://127.0.0.1:0",
	                      "--log-level", "debug",    token_file ? "--auth-token-file" : NULL,
	                      token_file,    NULL};
	return proc_start(p, args);
}

/* ----------------------------------------------------------------- jobs -- */

typedef struct losses {
	double v[STEPS + 1];
	int n;
	pt_job_metric last; /* the last step's point (communicator counters) */
} losses;

static void on_metric(void *ctx, const pt_job_metric *m)
{
	losses *l = ctx;
	if (l->n < STEPS + 1)
		l->v[l->n++] = m->loss;
	l->last = *m;
}

/* A job on workers reports every rank's communicator counters, the stages'
 * as they sent them with their last timeline (so without that reply): per
 * rank exactly the messages of the same job on local stage threads (whose
 * counters are read after that reply) plus the Configure/Ready exchange a
 * worker's stage starts with, and over all ranks every message sent was
 * received, but for those 2 replies. Bytes differ (nng frames carry
 * headers), but over all ranks more arrived than was counted as sent. */
static void expect_worker_comm(const pt_job_metric *local, const pt_job_metric *remote)
{
	uint64_t sent = 0, recv = 0, bytes_sent = 0, bytes_recv = 0;

	CU_ASSERT_EQUAL_FATAL(local->n_comm, 3);
	CU_ASSERT_EQUAL_FATAL(remote->n_comm, 3);
	for (int i = 0; i < 3; i++) {
		const pt_comm_stats *c = &remote->comm[i];
		CU_ASSERT(c->msgs_sent > 0 && c->msgs_recv > 0);
		CU_ASSERT(c->bytes_sent > 0 && c->bytes_recv > 0);
		CU_ASSERT(c->bytes_raw_sent >= c->bytes_sent); /* lz4 only where it shrinks */
		CU_ASSERT_EQUAL(c->errors, 0);
		CU_ASSERT_EQUAL(c->reconnects, 0);
		sent += c->msgs_sent;
		recv += c->msgs_recv;
		bytes_sent += c->bytes_sent;
		bytes_recv += c->bytes_recv;
		if (i == 0) {
			/* and a Configure command out, a Ready reply in per stage */
			CU_ASSERT_EQUAL(c->msgs_sent, local->comm[0].msgs_sent + 2);
			CU_ASSERT_EQUAL(c->msgs_recv, local->comm[0].msgs_recv + 2);
		} else {
			/* a worker's stage also got Configure and sent Ready, and
			 * has not counted its last timeline reply */
			CU_ASSERT_EQUAL(c->msgs_recv, local->comm[i].msgs_recv + 1);
			CU_ASSERT_EQUAL(c->msgs_sent + 1 /* timeline */,
			                local->comm[i].msgs_sent + 1 /* Ready */);
		}
	}
	CU_ASSERT_EQUAL(sent + 2, recv);
	CU_ASSERT(bytes_recv > bytes_sent);
}

static void digits_spec(pt_job_spec *spec, const wf_proc *w0, const wf_proc *w1)
{
	const char *urls[2] = {w0 ? w0->url : NULL, w1 ? w1->url : NULL};
	wf_digits_spec(spec, 2, STEPS, urls, w0 != NULL ? 2 : 0);
}

static void run_job(const wf_proc *w0, const wf_proc *w1, losses *out)
{
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = out, .on_metric = on_metric};
	int64_t last = 0;

	memset(out, 0, sizeof(*out));
	digits_spec(&spec, w0, w1);
	PT_CHECK_OK(pt_job_run(&spec, &o, &h, &last));
	CU_ASSERT_EQUAL(last, STEPS);
	CU_ASSERT_EQUAL(out->n, STEPS);
	pt_job_spec_fini(&spec);
}

static void test_workers_job_matches_local(void)
{
	wf_proc w0, w1;
	losses local, remote, again;

	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, NULL));
	run_job(NULL, NULL, &local);
	run_job(&w0, &w1, &remote);
	wf_expect_same_losses(local.v, remote.v, STEPS, "on workers");
	expect_worker_comm(&local.last, &remote.last);
	CU_ASSERT(isfinite(remote.v[STEPS - 1]) && remote.v[STEPS - 1] < remote.v[0]);
	/* The workers are idle again: a second job runs on them. */
	run_job(&w0, &w1, &again);
	CU_ASSERT_EQUAL(memcmp(again.v, remote.v, sizeof(double) * STEPS), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
}

/* example_run trains examples/<name>.json for STEPS steps with the given
 * stages and schedule, in this process (w == NULL) or on workers w[0..],
 * recording the losses and gradient norms; the final checkpoint (weights
 * and .state) goes to ckdir. */
static void example_run(const char *name, const char *schedule, int stages, const wf_proc *w,
                        const char *ckdir, losses *loss, double *norms)
{
	char path[64];
	void *buf;
	size_t len;
	pt_job_spec spec;
	pt_job_run_options o = {
	    .files_root = PT_SOURCE_ROOT, .threads = 2, .checkpoint_dir = ckdir};
	pt_job_hooks h = {.ctx = loss, .on_metric = on_metric};
	int64_t last = 0;

	snprintf(path, sizeof(path), "examples/%s.json", name);
	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path(path), &buf, &len));
	memset(&spec, 0, sizeof(spec));
	PT_CHECK_OK(pt_job_spec_decode(buf, len, &spec));
	free(buf);
	spec.steps = STEPS;
	spec.stages = stages;
	spec.eval_every = 0;
	spec.checkpoint_every = 0; /* the final one only */
	free(spec.boundaries);
	spec.boundaries = NULL;
	spec.schedule = strdup(schedule);
	if (w != NULL) {
		spec.workers = calloc((size_t)stages, sizeof(char *));
		CU_ASSERT_PTR_NOT_NULL_FATAL(spec.workers);
		for (int i = 0; i < stages; i++)
			spec.workers[i] = strdup(w[i].url);
		spec.n_workers = stages;
	}
	memset(loss, 0, sizeof(*loss));
	PT_CHECK_OK(pt_job_run(&spec, &o, &h, &last));
	CU_ASSERT_EQUAL(last, STEPS);
	CU_ASSERT_EQUAL_FATAL(loss->n, STEPS);
	if (norms != NULL)
		*norms = loss->last.grad_norm;
	pt_job_spec_fini(&spec);
}

/* Over nng, stages in worker processes: ZB-H1 (split backward), 1F1B and
 * interleaved (v = 2: each worker serves its rank's two chunks, a seat
 * each, one task at a time) give the in-process GPipe run's losses, last
 * gradient norm, final weights and optimizer state, bitwise, for the MLP
 * and the GPT examples at 1, 2 and 4 stages (interleaved where 2p chunks
 * fit their 5 layers: 1 and 2). */
static void test_workers_schedules_match_gpipe(void)
{
	const char *names[] = {"digits", "gpt"}, *schedules[] = {"zb-h1", "1f1b", "interleaved"};
	const int stages[] = {1, 2, 4};
	wf_proc w[4];
	losses ref, got;
	double nref, ngot;

	for (int i = 0; i < 4; i++)
		CU_ASSERT_FATAL(worker_start(&w[i], NULL));
	for (int e = 0; e < 2; e++)
		for (int k = 0; k < 3; k++) {
			char a[512], b[512], fa[600], fb[600], sa[700], sb[700];
			snprintf(a, sizeof(a), "%s/sched-%s-%d-gpipe", tmpdir, names[e], stages[k]);
			example_run(names[e], "gpipe", stages[k], NULL, a, &ref, &nref);
			for (int c = 0; c < 3; c++) {
				char what[64];
				if (c == 2 && stages[k] * 2 > 5)
					continue;
				snprintf(what, sizeof(what), "%s %s, %d stages on workers",
				         names[e], schedules[c], stages[k]);
				snprintf(b, sizeof(b), "%s/sched-%s-%d-%s", tmpdir, names[e],
				         stages[k], schedules[c]);
				example_run(names[e], schedules[c], stages[k], w, b, &got, &ngot);
				wf_expect_same_losses(ref.v, got.v, STEPS, what);
				CU_ASSERT_EQUAL(memcmp(&nref, &ngot, sizeof(double)), 0);
				snprintf(fa, sizeof(fa), "%s/step-%d.safetensors", a, STEPS);
				snprintf(fb, sizeof(fb), "%s/step-%d.safetensors", b, STEPS);
				CU_ASSERT(pt_test_same_tensors(fa, fb));
				snprintf(sa, sizeof(sa), "%s.state", fa);
				snprintf(sb, sizeof(sb), "%s.state", fb);
				/* interleaved: 2p chunks' states against GPipe's p */
				CU_ASSERT(pt_test_same_state_split(fa, sa, sb));
			}
		}
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(wf_proc_stop(&w[i]), 0);
}

/* The last step's merged order of an interleaved rank: "F0.0 B1.1 ..." from
 * its chunks' task records (ranks r and r + p), one task at a time. */
typedef struct il_capture {
	char order[2][512];
	bool overlap[2];
	int steps;
} il_capture;

static void on_il_metric(void *ctx, const pt_job_metric *m)
{
	il_capture *c = ctx;
	c->steps++;
	for (int rk = 0; rk < 2; rk++) {
		int i[2] = {0, 0};
		size_t o = 0;
		double last_end = 0.0;
		c->order[rk][0] = '\0';
		c->overlap[rk] = false;
		for (;;) {
			int k = -1;
			for (int ch = 0; ch < 2; ch++) {
				const pt_task_record *t = m->tasks[ch * 2 + rk];
				int n = m->n_tasks[ch * 2 + rk];
				while (i[ch] < n && t[i[ch]].kind == PT_TASK_STEP)
					i[ch]++;
				if (i[ch] < n &&
				    (k < 0 || t[i[ch]].start < m->tasks[k * 2 + rk][i[k]].start))
					k = ch;
			}
			if (k < 0)
				break;
			const pt_task_record *x = &m->tasks[k * 2 + rk][i[k]++];
			c->overlap[rk] = c->overlap[rk] || x->start < last_end;
			last_end = x->end;
			o += (size_t)snprintf(
			    c->order[rk] + o, sizeof(c->order[rk]) - o, "%s%c%d.%d", o ? " " : "",
			    x->kind == PT_TASK_BACKWARD ? 'B' : 'F', x->microbatch, k);
		}
	}
}

/* Interleaved on workers: each worker serves its rank's two chunks (two
 * seats of one job) and runs them one task at a time in the rank's order,
 * as in one process: workers whose tasks sleep 10 ms (--task-delay-ms 20,
 * half a chunk), the digits job on 2 ranks, 4 microbatches. */
static void test_workers_interleaved_turns(void)
{
	const char *args[] = {"--worker",        "--listen", "tcp://127.0.0.1:0",
	                      "--task-delay-ms", "20",       NULL};
	wf_proc w[2];
	il_capture cap = {0};
	pt_job_spec spec;
	void *buf;
	size_t len;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = &cap, .on_metric = on_il_metric};
	pt_chunk_task order[16];
	int64_t last = 0;

	CU_ASSERT_FATAL(proc_start(&w[0], args));
	CU_ASSERT_FATAL(proc_start(&w[1], args));
	PT_CHECK_OK(pt_job_spec_load_file(pt_test_path("examples/digits.json"), &buf, &len));
	memset(&spec, 0, sizeof(spec));
	PT_CHECK_OK(pt_job_spec_decode(buf, len, &spec));
	free(buf);
	spec.steps = 2;
	spec.stages = 2;
	spec.microbatches = 4;
	spec.eval_every = 0;
	spec.schedule = strdup("interleaved");
	spec.virtual_stages = 2;
	spec.workers = calloc(2, sizeof(char *));
	spec.workers[0] = strdup(w[0].url);
	spec.workers[1] = strdup(w[1].url);
	spec.n_workers = 2;
	PT_CHECK_OK(pt_job_run(&spec, &o, &h, &last));
	CU_ASSERT_EQUAL(cap.steps, 2);
	for (int rk = 0; rk < 2; rk++) {
		char want[512];
		size_t n = 0;
		PT_CHECK_OK(pt_pipe_interleaved_order(rk + 1, 2, 2, 4, order));
		for (int k = 0; k < 16; k++)
			n += (size_t)snprintf(want + n, sizeof(want) - n, "%s%c%d.%d", k ? " " : "",
			                      order[k].backward ? 'B' : 'F', order[k].mb,
			                      order[k].chunk);
		if (strcmp(cap.order[rk], want) != 0)
			printf("\n    rank %d: %s\n    wanted: %s", rk + 1, cap.order[rk], want);
		CU_ASSERT_STRING_EQUAL(cap.order[rk], want);
		CU_ASSERT_FALSE(cap.overlap[rk]);
	}
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w[0]), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w[1]), 0);
}

/* ------------------------------------------------------------ handshake -- */

/* junk_call sends bytes that are no WorkerRequest and expects a refusal. */
static void junk_call(wf_hs *c)
{
	static const char junk[] = "\x10\0\0\0not a flatbuffer\n\x1b[2J";
	pt_worker_reply r;
	nng_msg *m;

	CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&m, sizeof(junk)), 0);
	memcpy(nng_msg_body(m), junk, sizeof(junk));
	CU_ASSERT_EQUAL_FATAL(nng_sendmsg(c->sock, m, 0), 0);
	CU_ASSERT_EQUAL_FATAL(nng_recvmsg(c->sock, &m, 0), 0);
	PT_CHECK_OK(pt_handshake_decode_reply(nng_msg_body(m), nng_msg_len(m), PT_WORKER_JOIN, &r));
	CU_ASSERT_FALSE(r.ok);
	nng_msg_free(m);
}

/* Refused requests are logged at most 10 a second, then summed up: 500
 * junk requests (and one more a second later, which brings the summary)
 * leave a few lines and counts that add up to 501 (a junk flood wrote 4 MB
 * of log a second). */
static void test_workers_refusal_log(void)
{
	char *log = NULL;
	size_t len = 0, off = 0;
	uint64_t sum = 0;
	int lines;
	double t0, t1;
	wf_proc w;
	wf_hs a;
	struct stat st;

	if (stat(log_path(), &st) == 0)
		off = (size_t)st.st_size;
	CU_ASSERT_FATAL(worker_start(&w, NULL));
	wf_hs_open(&a, w.url);
	t0 = wf_mono();
	for (int i = 0; i < 500; i++)
		junk_call(&a);
	t1 = wf_mono();
	usleep(1100 * 1000);
	junk_call(&a);
	wf_hs_close(&a);
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
	PT_CHECK_OK(pt_file_read(log_path(), 64 << 20, (void **)&log, &len));
	CU_ASSERT_FATAL(len >= off);
	lines = 0;
	for (const char *p = log + off; (p = strstr(p, "worker: request refused: ")) != NULL; p++) {
		lines++;
		CU_ASSERT(strncmp(strchr(p, ':') + 2, "request refused: malformed WorkerRequest",
		                  40) == 0);
	}
	for (const char *p = log + off; (p = strstr(p, "worker: suppressed ")) != NULL; p++) {
		uint64_t k = 0;
		sscanf(p, "worker: suppressed %" SCNu64 " similar lines", &k);
		sum += k;
	}
	printf("\n    500 refusals in %.2f s: %d lines, %" PRIu64 " suppressed", t1 - t0, lines,
	       sum);
	CU_ASSERT_EQUAL((uint64_t)lines + sum, 501);
	CU_ASSERT(sum > 0);
	CU_ASSERT(lines <= 1 + 10 * (int)(t1 - t0 + 2));
	CU_ASSERT_PTR_NULL(strstr(log + off, "\x1b[2J"));
	free(log);
}

static void test_workers_handshake_refusals(void)
{
	char token_file[400];
	wf_proc w;
	wf_hs a, b;
	static const uint8_t key[PT_COMM_KEY_BYTES] = {1};
	pt_worker_request join = {.kind = PT_WORKER_JOIN, .protocol = 1, .rank = 1, .world = 2};
	pt_worker_request cancel = {0};
	pt_worker_reply r;
	uint64_t session;

	snprintf(token_file, sizeof(token_file), "%s/token", tmpdir);
	pt_test_write_file(token_file, "s3cret\n", 7);
	CU_ASSERT_FATAL(worker_start(&w, token_file));
	wf_hs_open(&a, w.url);
	wf_hs_open(&b, w.url);

	wf_hs_call(&a, &join, &r);
	{
		char speaks[80];
		snprintf(speaks, sizeof(speaks),
		         "protocol version 1 not supported (this worker speaks %d)",
		         PT_WORKER_PROTOCOL);
		wf_expect_refusal(&r, speaks);
	}
	join.protocol = PT_WORKER_PROTOCOL;
	wf_hs_call(&a, &join, &r);
	wf_expect_refusal(&r, "unauthorized");
	join.token = "wrong";
	wf_hs_call(&a, &join, &r);
	wf_expect_refusal(&r, "unauthorized");

	join.token = "s3cret";
	wf_hs_call(&a, &join, &r);
	wf_expect_refusal(&r, "StageJoin without a session key");
	join.key = key;
	join.timeout_ms = 99;
	wf_hs_call(&a, &join, &r);
	wf_expect_refusal(&r, "heartbeat timeout 99 ms (100 to 3600000)");
	join.timeout_ms = 0; /* the worker's default */
	/* Bytes that are no WorkerRequest get a refusal, and the worker goes on. */
	{
		static const char junk[] = "\x10\0\0\0not a flatbuffer at all";
		nng_msg *m;
		CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&m, sizeof(junk)), 0);
		memcpy(nng_msg_body(m), junk, sizeof(junk));
		CU_ASSERT_EQUAL_FATAL(nng_sendmsg(a.sock, m, 0), 0);
		CU_ASSERT_EQUAL_FATAL(nng_recvmsg(a.sock, &m, 0), 0);
		PT_CHECK_OK(
		    pt_handshake_decode_reply(nng_msg_body(m), nng_msg_len(m), PT_WORKER_JOIN, &r));
		wf_expect_refusal(&r, "malformed WorkerRequest");
		nng_msg_free(m);
	}
	wf_hs_call(&a, &join, &r);
	CU_ASSERT_TRUE_FATAL(r.ok);
	CU_ASSERT(r.data_url != NULL && strncmp(r.data_url, "tcp://127.0.0.1:", 16) == 0);
	session = r.session;
	CU_ASSERT_NOT_EQUAL(session, 0);
	/* Busy: a second join with another key (another job) is refused; one
	 * with the same key (another chunk of the job) needs another rank. */
	{
		static const uint8_t key2[PT_COMM_KEY_BYTES] = {2};
		join.key = key2;
		wf_hs_call(&b, &join, &r);
		wf_expect_refusal(&r, "worker busy with another job");
		CU_ASSERT_TRUE(r.busy);
		join.key = key;
		wf_hs_call(&b, &join, &r);
		wf_expect_refusal(&r, "rank 1 of world 2 beside this job's rank 1 of world 2");
		CU_ASSERT_FALSE(r.busy);
	}
	/* A peer list for an unknown session is refused; the owner's cancel
	 * frees the worker. */
	cancel.session = session + 1;
	wf_hs_call(&b, &cancel, &r);
	wf_expect_refusal(&r, "no such session");
	cancel.session = session;
	wf_hs_call(&a, &cancel, &r);
	CU_ASSERT_TRUE(r.ok);
	wf_hs_call(&b, &join, &r);
	CU_ASSERT_TRUE(r.ok);
	cancel.session = r.session;
	wf_hs_call(&b, &cancel, &r);
	CU_ASSERT_TRUE(r.ok);

	/* One job takes at most 8 seats (virtual_stages' limit): ranks 1-8 of
	 * a world of 10 join, the 9th is refused; cancelled, all are free. */
	{
		uint64_t seats[8];
		join.world = 10;
		for (int i = 0; i < 8; i++) {
			join.rank = i + 1;
			wf_hs_call(&a, &join, &r);
			CU_ASSERT_TRUE_FATAL(r.ok);
			seats[i] = r.session;
		}
		join.rank = 9;
		wf_hs_call(&a, &join, &r);
		wf_expect_refusal(&r, "this worker serves 8 stages of the job already (at most 8)");
		CU_ASSERT_FALSE(r.busy);
		for (int i = 0; i < 8; i++) {
			cancel.session = seats[i];
			wf_hs_call(&a, &cancel, &r);
			CU_ASSERT_TRUE(r.ok);
		}
		wf_hs_call(&a, &join, &r); /* every seat free again */
		CU_ASSERT_TRUE(r.ok);
		cancel.session = r.session;
		wf_hs_call(&a, &cancel, &r);
		CU_ASSERT_TRUE(r.ok);
	}

	wf_hs_close(&a);
	wf_hs_close(&b);
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
}

/* A job naming a worker that needs a token the run does not present fails
 * naming the stage and the worker, and saying no more than that the
 * handshake failed ("unauthorized" goes to the log only); with the token it
 * starts. */
static void test_workers_job_errors_name_worker(void)
{
	char token_file[400];
	wf_proc w0, w1;
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};

	snprintf(token_file, sizeof(token_file), "%s/token2", tmpdir);
	pt_test_write_file(token_file, "tok\n", 4);
	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, token_file));
	digits_spec(&spec, &w0, &w1);
	spec.steps = 2;
	PT_CHECK_ERR_MSG(pt_job_run(&spec, &o, NULL, NULL), PT_ERR_IO, PT_JOB_WORKER_UNREACHABLE);
	{
		char want[400];
		snprintf(want, sizeof(want), "stage 1 (worker %s): %s", w1.url,
		         PT_JOB_WORKER_UNREACHABLE);
		CU_ASSERT_STRING_EQUAL(pt_last_error(), want);
	}
	/* The first worker's session was cancelled: the next job gets it. */
	o.worker_token = "tok"; /* both accept it: w0 has no token */
	PT_CHECK_OK(pt_job_run(&spec, &o, NULL, NULL));
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
}

/* --------------------------------------------------------------- server -- */

static void test_workers_server_job(void)
{
	char data_dir[400], token_file[400];
	wf_proc w0, w1, srv;
	pt_job_spec spec;
	pt_api_job_info ji;
	wf_api api;
	uint64_t id;

	/* The server and one worker share a token: the server presents its own
	 * token to the workers it joins (w0 needs none). */
	snprintf(token_file, sizeof(token_file), "%s/server-token", tmpdir);
	pt_test_write_file(token_file, "cluster-secret\n", 15);
	snprintf(data_dir, sizeof(data_dir), "%s/server-data", tmpdir);
	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, token_file));
	{
		const char *args[] = {
		    "--listen",          "tcp://127.0.0.1:0", "--data-dir", data_dir,
		    "--files-root",      PT_SOURCE_ROOT,      "--threads",  "2",
		    "--auth-token-file", token_file,          NULL};
		CU_ASSERT_FATAL(proc_start(&srv, args));
	}
	digits_spec(&spec, &w0, &w1);
	wf_api_open(&api, srv.url, "cluster-secret");
	id = wf_api_submit(&api, &spec);
	CU_ASSERT_NOT_EQUAL_FATAL(id, 0);
	if (wf_api_wait_final(&api, id, 120, &ji) != PT_JOB_SUCCEEDED)
		fprintf(stderr, "job ended %d: %s\n", (int)ji.state, ji.message ? ji.message : "");
	CU_ASSERT_EQUAL(ji.state, PT_JOB_SUCCEEDED);
	CU_ASSERT_EQUAL(ji.step, STEPS);
	/* Every rank has communicator counters, the workers' stages too (the
	 * series of /metrics are these entries). */
	CU_ASSERT_EQUAL(ji.n_stages, 3);
	for (size_t k = 0; k < ji.n_stages; k++) {
		pt_api_stage_stats st;
		PT_CHECK_OK(pt_api_job_stage(&ji, k, &st));
		CU_ASSERT_EQUAL(st.stage, (int32_t)k - 1);
		CU_ASSERT_TRUE(st.has_comm);
		CU_ASSERT(st.messages_sent > 0 && st.messages_received > 0);
		CU_ASSERT(st.bytes_sent > 0 && st.bytes_received > 0);
	}
	wf_api_close(&api);
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
}

/* ----------------------------------------------------------- heartbeats -- */

/* Generous: the sanitizer build runs these too, and CI machines are slower
 * and busier than ours (a live worker must never miss one). */
#define HB_TIMEOUT_MS 2000
#define HB_WORDS      "no heartbeat for 2.0 s"
#define TEARDOWN_S    1.0 /* a lost worker's job returns this long after the timeout */

/* A run that does something to a worker after a given step. */
typedef struct fault {
	double v[STEPS + 1]; /* loss by step (a restarted run overwrites) */
	int64_t at;          /* after this step ... */
	pid_t pid;           /* ... send sig to pid (once) */
	int sig;
	double t_sig;
	int restarts;
	int64_t restart_from;
	char note[1024];
} fault;

static void fault_metric(void *ctx, const pt_job_metric *m)
{
	fault *f = ctx;
	if (m->step >= 1 && m->step <= STEPS)
		f->v[m->step - 1] = m->loss;
	if (m->step == f->at && f->pid > 0) {
		kill(f->pid, f->sig);
		f->t_sig = wf_mono();
		f->pid = 0;
	}
}

static void fault_restart(void *ctx, int n, int64_t from, const char *message)
{
	fault *f = ctx;
	f->restarts = n;
	f->restart_from = from;
	snprintf(f->note, sizeof(f->note), "%s", message);
}

/* A worker killed (SIGKILL) or hung (SIGSTOP) after step 5 fails the job
 * within the heartbeat timeout, naming stage 1 and its URL; the surviving
 * worker is idle when the run returns. */
static void lost_worker_fails(int sig)
{
	wf_proc w0, w1;
	pt_job_spec spec;
	fault f = {.at = 5, .sig = sig};
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = &f, .on_metric = fault_metric, .on_restart = fault_restart};
	char want[400];
	int64_t last = 0;
	double dt;
	int st;

	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, NULL));
	digits_spec(&spec, &w0, &w1);
	spec.worker_timeout_ms = HB_TIMEOUT_MS;
	f.pid = w1.pid;
	PT_CHECK_ERR_MSG(pt_job_run(&spec, &o, &h, &last), PT_ERR_TIMEOUT, HB_WORDS);
	dt = wf_mono() - f.t_sig;
	snprintf(want, sizeof(want), "stage 1 on worker %s: " HB_WORDS, w1.url);
	if (strstr(pt_last_error(), want) == NULL)
		fprintf(stderr, "error \"%s\" lacks \"%s\"\n", pt_last_error(), want);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), want));
	/* Detected within the timeout of the fault; the teardown after it is
	 * quick (the survivor's session is ended over its control link). */
	if (dt > HB_TIMEOUT_MS / 1000.0 + TEARDOWN_S)
		fprintf(stderr, "the run returned %.2f s after the fault\n", dt);
	CU_ASSERT(dt <= HB_TIMEOUT_MS / 1000.0 + TEARDOWN_S);
	CU_ASSERT(last >= 5 && last < STEPS);
	CU_ASSERT_EQUAL(f.restarts, 0);
	CU_ASSERT_TRUE(wf_wait_idle(w0.url, 0));
	if (sig == SIGSTOP) {
		/* Running again, the hung worker finds its coordinator gone and
		 * abandons the stage. */
		kill(w1.pid, SIGCONT);
		CU_ASSERT_TRUE(wf_wait_idle(w1.url, 2 * HB_TIMEOUT_MS + 500));
		CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
	} else {
		CU_ASSERT_EQUAL(waitpid(w1.pid, &st, 0), w1.pid);
		CU_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	}
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
}

static void test_workers_killed_worker_fails_job(void)
{
	lost_worker_fails(SIGKILL);
}

static void test_workers_hung_worker_fails_job(void)
{
	lost_worker_fails(SIGSTOP);
}

/* A worker's shutdown is bounded (pipeserver --worker, 5 s): asked to stop
 * while its stage thread sits in a 30 s task (the task-delay hook, where
 * pt_worker_destroy must wait to join it), it says so and exits 0 within
 * the bound, not after the task. The job then fails on the lost worker. */
typedef struct bg_job {
	pt_job_spec spec;
	pt_err rv;
} bg_job;

static void *bg_job_main(void *arg)
{
	bg_job *b = arg;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	int64_t last = 0;
	b->rv = pt_job_run(&b->spec, &o, NULL, &last);
	return NULL;
}

static void test_workers_shutdown_bounded(void)
{
	const char *slow[] = {"--worker",        "--listen", "tcp://127.0.0.1:0",
	                      "--task-delay-ms", "30000",    NULL};
	wf_proc w0, w1;
	bg_job b;
	pthread_t t;
	double t0, dt;
	char *log = NULL;
	size_t len;

	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(proc_start(&w1, slow));
	digits_spec(&b.spec, &w0, &w1);
	b.spec.worker_timeout_ms = HB_TIMEOUT_MS;
	CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, bg_job_main, &b), 0);
	sleep(3); /* joined; stage 1 is in its first 30 s forward */
	t0 = wf_mono();
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
	dt = wf_mono() - t0;
	printf("\n    worker stopped %.2f s after SIGTERM", dt);
	CU_ASSERT(dt >= 4.0 && dt <= 8.0);
	PT_CHECK_OK(pt_file_read(log_path(), 16 << 20, (void **)&log, &len));
	CU_ASSERT_PTR_NOT_NULL(log && strstr(log, "exiting without it"));
	free(log);
	pthread_join(t, NULL);
	CU_ASSERT_EQUAL(b.rv, PT_ERR_TIMEOUT);
	pt_clear_error();
	pt_job_spec_fini(&b.spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
}

/* cpu_ticks: user + system clock ticks pid has used. */
static long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	long ut = 0, st = 0;
	FILE *f;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	p = fgets(buf, sizeof(buf), f);
	fclose(f);
	/* After "(comm)": state is field 3, utime 14, stime 15. */
	if (p == NULL || (p = strrchr(buf, ')')) == NULL ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2)
		return -1;
	return ut + st;
}

/* An idle worker is quiet: at most 1 % of a core over 4 s (its receive
 * timed out every 50 ms before, and each nng timeout spins up to a
 * millisecond in nng 1.5's expire thread: 2 % of a core). */
static void test_workers_idle_is_quiet(void)
{
	wf_proc w;
	long t0, t1, hz = sysconf(_SC_CLK_TCK);

	CU_ASSERT_FATAL(worker_start(&w, NULL));
	sleep(1);
	t0 = cpu_ticks(w.pid);
	sleep(4);
	t1 = cpu_ticks(w.pid);
	printf("\n    idle worker: %.2f %% of a core", 100.0 * (double)(t1 - t0) / (4.0 * hz));
	CU_ASSERT(t0 >= 0 && t1 >= t0);
	CU_ASSERT(t1 - t0 <= 4 * hz / 100);
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
}

/* A peer that sends pings and reads no replies (its receive buffer 1 KiB)
 * does not stall the worker: after 1.5 s of such a flood another client's
 * ping is answered within 2 s (the worker's one reply thread once blocked
 * its 5 s send timeout on each reply, and jobs lost their heartbeats). */
typedef struct flood {
	int fd, sent;
	const uint8_t *req;
	size_t len;
	atomic_bool stop;
} flood;

static void *flood_main(void *arg)
{
	flood *f = arg;
	for (uint32_t id = 1; !atomic_load(&f->stop); id++) {
		if (!pt_test_sp_request(f->fd, id, f->req, f->len))
			break;
		f->sent++;
	}
	return NULL;
}

static void test_workers_unread_replies_do_not_stall(void)
{
	wf_proc w;
	wf_hs a;
	pt_worker_request ping = {.kind = PT_WORKER_PING};
	pt_worker_reply r;
	pt_fb_builder b;
	flood f = {0};
	pthread_t th;
	const char *colon;
	double t0, t1;

	CU_ASSERT_FATAL(worker_start(&w, NULL));
	colon = strrchr(w.url, ':');
	CU_ASSERT_PTR_NOT_NULL_FATAL(colon);
	PT_CHECK_OK(pt_fb_builder_init(&b, 0));
	PT_CHECK_OK(pt_handshake_encode_request(&b, &ping, &f.req, &f.len));
	f.fd = pt_test_sp_connect(atoi(colon + 1), 1024, 0x30, 0x31);
	CU_ASSERT_FATAL(f.fd >= 0);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, flood_main, &f), 0);
	usleep(1500 * 1000);
	wf_hs_open(&a, w.url);
	t0 = pt_now();
	wf_hs_call(&a, &ping, &r);
	t1 = pt_now();
	atomic_store(&f.stop, true);
	shutdown(f.fd, SHUT_RDWR); /* a flood blocked in send ends */
	pthread_join(th, NULL);
	close(f.fd);
	printf("\n    %d unread pings; another ping answered in %.3f s", f.sent, t1 - t0);
	CU_ASSERT(r.ok);
	CU_ASSERT(t1 - t0 < 2.0);
	wf_hs_close(&a);
	pt_fb_builder_fini(&b);
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
}

/* A worker with 200 descriptors (RLIMIT_NOFILE) and 300 idle strangers on
 * its control port still answers another client within 2 s: beyond its cap
 * (a quarter of the limit) each new connection closes the stranger idle the
 * longest (once the descriptors ran out and joins timed out). */
static void test_workers_idle_strangers_capped(void)
{
	enum { N = 300 };
	wf_proc w;
	wf_hs a;
	pt_worker_request ping = {.kind = PT_WORKER_PING};
	pt_worker_reply r;
	int fd[N], open_n = 0, closed = 0, port;
	double t0, t1;
	const char *argv[] = {"/usr/bin/prlimit", "--nofile=200:200",  server_bin, "--worker",
	                      "--listen",         "tcp://127.0.0.1:0", NULL};

	if (access(argv[0], X_OK) != 0) {
		printf("(skipped: no %s) ", argv[0]);
		return;
	}
	/* Hard and soft: the server raises its soft limit to the hard one. */
	CU_ASSERT_FATAL(wf_proc_start(&w, argv, log_path()));
	port = atoi(strrchr(w.url, ':') + 1);
	for (int i = 0; i < N; i++)
		if ((fd[i] = pt_test_sp_connect(port, 0, 0x30, 0x31)) >= 0)
			open_n++;
	usleep(1500 * 1000); /* the kicked ones are closed within a second */
	wf_hs_open(&a, w.url);
	t0 = pt_now();
	wf_hs_call(&a, &ping, &r);
	t1 = pt_now();
	for (int i = 0; i < N; i++) {
		uint8_t b;
		if (fd[i] < 0)
			continue;
		closed += pt_test_read_all(fd[i], &b, 1, 10) == 0;
		close(fd[i]);
	}
	printf("\n    %d strangers connected, %d closed by the worker; a ping answered in %.3f s",
	       open_n, closed, t1 - t0);
	CU_ASSERT(r.ok);
	CU_ASSERT(t1 - t0 < 2.0);
	CU_ASSERT(closed >= N - 60);
	wf_hs_close(&a);
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
}

/* A worker whose ended stages' communicators do not close (as when
 * nng_close hangs: --close-delay-ms stands in for that) holds at most 8 of
 * them: then it refuses new stages, says why in the refusal and in its
 * state, reports itself busy, and still stops at once. */
static void test_workers_stuck_closes_bounded(void)
{
	const char *args[] = {"--worker",         "--listen", "tcp://127.0.0.1:0",
	                      "--close-delay-ms", "60000",    NULL};
	static const uint8_t key[PT_COMM_KEY_BYTES] = {3};
	pt_worker_request join = {.kind = PT_WORKER_JOIN,
	                          .protocol = PT_WORKER_PROTOCOL,
	                          .rank = 1,
	                          .world = 2,
	                          .key = key};
	pt_worker_request cancel = {.kind = PT_WORKER_PEERS};
	pt_worker_request ping = {.kind = PT_WORKER_PING};
	pt_worker_reply r;
	wf_proc w;
	wf_hs c;
	char state[300];
	double t0;

	/* The hook's value is checked like any option: exit 2 naming it. */
	for (int k = 0; k < 3; k++) {
		static const char *const bad[] = {"-1", "600001", "forever"};
		char cmd[PATH_MAX + 200], out[1024] = "";
		FILE *f;
		snprintf(cmd, sizeof(cmd), "'%s' --worker --close-delay-ms %s 2>&1", server_bin,
		         bad[k]);
		CU_ASSERT_PTR_NOT_NULL_FATAL(f = popen(cmd, "r"));
		out[fread(out, 1, sizeof(out) - 1, f)] = '\0';
		int st = pclose(f);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "close_delay_ms (from flags): '"));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "is not an integer in [0, 600000]"));
	}
	CU_ASSERT_FATAL(proc_start(&w, args));
	wf_hs_open(&c, w.url);
	/* Eight sessions joined and cancelled: each leaves its communicator
	 * closing, and each join before the eighth cancel is taken. */
	for (int i = 0; i < 8; i++) {
		wf_hs_call(&c, &join, &r);
		CU_ASSERT_TRUE_FATAL(r.ok);
		cancel.session = r.session;
		wf_hs_call(&c, &cancel, &r);
		CU_ASSERT_TRUE(r.ok);
	}
	t0 = wf_mono();
	wf_hs_call(&c, &join, &r);
	wf_expect_refusal(&r, "8 communicators of ended stages are still closing (at most 8; stuck "
	                      "in nng_close): this worker takes no new stage; restart it");
	CU_ASSERT(wf_mono() - t0 >= 0.2); /* it waited for them a while */
	wf_hs_call(&c, &ping, &r);
	CU_ASSERT_TRUE(r.ok);
	CU_ASSERT_TRUE(r.busy);
	CU_ASSERT_FALSE(wf_worker_idle(w.url, state, sizeof(state)));
	CU_ASSERT_STRING_EQUAL(state,
	                       "idle; refusing new stages: 8 communicators of ended stages still "
	                       "closing");
	wf_hs_close(&c);
	t0 = wf_mono();
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
	printf("\n    worker stopped %.2f s after SIGTERM", wf_mono() - t0);
	CU_ASSERT(wf_mono() - t0 < 3.0);
}

/* With max_restarts 1 and a spare, a worker killed after step 12 costs a
 * restart from the step-10 checkpoint on the spare; every loss equals the
 * undisturbed local run's, bitwise, and the last checkpoint is step STEPS. */
static void test_workers_restart_on_spare(void)
{
	wf_proc w[3];
	pt_job_spec spec;
	losses local;
	fault f = {.at = 12, .sig = SIGKILL};
	char ckdir[400], path[600], want[800];
	pt_job_run_options o = {
	    .files_root = PT_SOURCE_ROOT, .threads = 2, .checkpoint_dir = ckdir};
	pt_job_hooks h = {.ctx = &f, .on_metric = fault_metric, .on_restart = fault_restart};
	struct stat sb;
	int64_t last = 0;
	int st;

	snprintf(ckdir, sizeof(ckdir), "%s/restart-ck", tmpdir);
	run_job(NULL, NULL, &local);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_FATAL(worker_start(&w[i], NULL));
	digits_spec(&spec, &w[0], &w[1]);
	spec.workers = realloc(spec.workers, 3 * sizeof(char *));
	CU_ASSERT_PTR_NOT_NULL_FATAL(spec.workers);
	spec.workers[2] = strdup(w[2].url);
	spec.n_workers = 3;
	spec.worker_timeout_ms = HB_TIMEOUT_MS;
	spec.max_restarts = 1;
	spec.checkpoint_every = 10;
	f.pid = w[0].pid;
	PT_CHECK_OK(pt_job_run(&spec, &o, &h, &last));
	CU_ASSERT_EQUAL(last, STEPS);
	CU_ASSERT_EQUAL(f.restarts, 1);
	CU_ASSERT_EQUAL(f.restart_from, 10);
	snprintf(want, sizeof(want),
	         "restart 1 of 1 after stage 0 on worker %s: " HB_WORDS ": stage 0 "
	         "to %s; resuming from step 10",
	         w[0].url, w[2].url);
	if (strcmp(f.note, want) != 0)
		fprintf(stderr, "restart note \"%s\"\nexpected     \"%s\"\n", f.note, want);
	CU_ASSERT_STRING_EQUAL(f.note, want);
	wf_expect_same_losses(local.v, f.v, STEPS, "restarted");
	snprintf(path, sizeof(path), "%s/step-%d.safetensors", ckdir, STEPS);
	CU_ASSERT_EQUAL(stat(path, &sb), 0);
	CU_ASSERT_TRUE(wf_wait_idle(w[1].url, 0));
	CU_ASSERT_TRUE(wf_wait_idle(w[2].url, 0));
	CU_ASSERT_EQUAL(waitpid(w[0].pid, &st, 0), w[0].pid);
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w[1]), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w[2]), 0);
}

/* silent_session opens c to w and runs a session of rank 1 in a world of 2
 * with heartbeat timeout ms whose rank 0 never answers (the stage waits for
 * its configuration); returns the session. */
static uint64_t silent_session(wf_hs *c, const wf_proc *w, int ms)
{
	static const uint8_t key[PT_COMM_KEY_BYTES] = {2};
	pt_worker_request join = {.kind = PT_WORKER_JOIN,
	                          .protocol = PT_WORKER_PROTOCOL,
	                          .rank = 1,
	                          .world = 2,
	                          .timeout_ms = ms,
	                          .key = key};
	pt_worker_request peers = {.kind = PT_WORKER_PEERS, .n_urls = 2};
	pt_worker_reply r;
	char data_url[256];

	wf_hs_open(c, w->url);
	wf_hs_call(c, &join, &r);
	CU_ASSERT_TRUE_FATAL(r.ok);
	peers.session = r.session;
	snprintf(data_url, sizeof(data_url), "%s", r.data_url); /* r dies at the next call */
	peers.urls[0] = "tcp://127.0.0.1:9";
	peers.urls[1] = data_url;
	wf_hs_call(c, &peers, &r);
	CU_ASSERT_TRUE_FATAL(r.ok);
	return peers.session;
}

/* A coordinator that joins, sends its peers and then goes silent: the worker
 * abandons the stage after the session's timeout and is idle again. */
static void test_workers_silent_coordinator_abandoned(void)
{
	wf_proc w;
	wf_hs c;
	pt_worker_request ping = {.kind = PT_WORKER_PING};
	pt_worker_reply r;
	char state[256];
	double t0;

	CU_ASSERT_FATAL(worker_start(&w, NULL));
	ping.session = silent_session(&c, &w, 300);
	t0 = wf_mono();
	wf_hs_call(&c, &ping, &r); /* the session is alive while pinged */
	CU_ASSERT_TRUE(r.ok);
	CU_ASSERT_FALSE(wf_worker_idle(w.url, state, sizeof(state)));
	CU_ASSERT_STRING_EQUAL(state, "serving stage rank 1 of world 2");
	CU_ASSERT_TRUE(wf_wait_idle(w.url, 1500));
	CU_ASSERT(wf_mono() - t0 >= 0.3);
	wf_hs_call(&c, &ping, &r); /* and then it is gone */
	wf_expect_refusal(&r, "no such session");
	wf_hs_close(&c);
	CU_ASSERT_EQUAL(wf_proc_stop(&w), 0);
}

/* A job whose worker is still held by a coordinator that died (as after a
 * server crash and restart) waits for the worker to drop that session, then
 * runs. */
static void test_workers_join_waits_for_dead_session(void)
{
	wf_proc w0, w1;
	wf_hs c;
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	double t0;

	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	CU_ASSERT_FATAL(worker_start(&w1, NULL));
	silent_session(&c, &w0, 400);
	t0 = wf_mono(); /* the session's coordinator goes silent now */
	digits_spec(&spec, &w0, &w1);
	spec.steps = 3;
	spec.worker_timeout_ms = 1000;
	PT_CHECK_OK(pt_job_run(&spec, &o, NULL, NULL));
	CU_ASSERT(wf_mono() - t0 >= 0.4);
	pt_job_spec_fini(&spec);
	wf_hs_close(&c);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
}

/* ----------------------------------------------------------- data plane -- */

/* data_url reads the stage data URL a worker last announced in its own log
 * ("...; data on URL; heartbeat ..."). */
static bool data_url(const char *log, char *out, size_t n)
{
	char line[1024];
	FILE *f = fopen(log, "r");
	bool found = false;

	if (f == NULL)
		return false;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *p = strstr(line, "data on ");
		if (p != NULL) {
			p += 8;
			/* The PULL socket's URL: the bulk lane's "#bulk=PORT" cut. */
			snprintf(out, n, "%.*s", (int)strcspn(p, "#; \n"), p);
			found = true;
		}
	}
	fclose(f);
	return found;
}

/* forged_frame builds a TensorFrame (schema/stage.fbs, field ids in
 * declaration order) of kind/channel from `source` with sequence number seq
 * and a 64-byte u8 tensor, valid in every way but its origin; trailer
 * appends 32 bytes shaped like a MAC trailer with a tag under a made-up key. */
static nng_msg *forged_frame(uint8_t kind, uint8_t channel, int source, uint64_t seq, bool trailer)
{
	enum {
		KIND,
		CHANNEL,
		JOB,
		STEP,
		MB,
		SOURCE,
		SEQ,
		TAG,
		HAS,
		DTYPE,
		SHAPE,
		STRIDES,
		CODEC,
		RAW,
		POFF,
		PSIZE
	};
	const int64_t dim = 64;
	pt_fb_builder b;
	pt_fb_ref shape, root;
	const uint8_t *hdr;
	size_t hsize, padded;
	nng_msg *msg = NULL;

	PT_CHECK_OK(pt_fb_builder_init(&b, 256));
	pt_fb_create_vector(&b, &dim, 1, 8, 8, &shape);
	pt_fb_start_table(&b);
	pt_fb_force_u8(&b, KIND, kind);
	pt_fb_force_u8(&b, CHANNEL, channel);
	pt_fb_force_i32(&b, SOURCE, source);
	pt_fb_force_u64(&b, SEQ, seq);
	pt_fb_force_bool(&b, HAS, true);
	pt_fb_force_u8(&b, DTYPE, PT_U8);
	pt_fb_add_offset(&b, SHAPE, shape);
	pt_fb_force_u64(&b, RAW, 64);
	pt_fb_force_u64(&b, POFF, 0); /* patched below */
	pt_fb_force_u64(&b, PSIZE, 64);
	pt_fb_end_table(&b, &root);
	PT_CHECK_OK(pt_fb_finish(&b, root, "PTTF", &hdr, &hsize));
	padded = (hsize + 63) & ~(size_t)63;
	CU_ASSERT_EQUAL_FATAL(nng_msg_alloc(&msg, padded + 64), 0);
	memset(nng_msg_body(msg), 0x5a, padded + 64);
	memcpy(nng_msg_body(msg), hdr, hsize);
	uint64_t poff = padded;
	memcpy((uint8_t *)pt_fb_field(pt_fb_root(nng_msg_body(msg)), POFF), &poff, 8);
	if (trailer) {
		uint8_t tr[32] = "PTMC";
		for (int i = 4; i < 32; i++)
			tr[i] = (uint8_t)(i * 37 + seq);
		CU_ASSERT_EQUAL_FATAL(nng_msg_append(msg, tr, sizeof(tr)), 0);
	}
	pt_fb_builder_fini(&b);
	return msg;
}

/* bulk_stranger opens the stage's bulk lane port (the "#bulk=PORT" of its
 * data URL), takes the challenge and answers with a hello claiming rank 1
 * without the session key; returns 1 when the stage closed the connection
 * (a refused hello, counted in its errors), else 0. */
static int bulk_stranger(const char *log)
{
	char line[1024], url[64] = "";
	FILE *fp = fopen(log, "r");
	nng_stream_dialer *d = NULL;
	nng_stream *s = NULL;
	nng_aio *a = NULL;
	uint8_t buf[60] = "PTBH\1\0\0\0";
	nng_iov v = {buf, 20};
	int refused = 0;

	while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
		const char *p = strstr(line, "#bulk=");
		if (p != NULL)
			snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", atoi(p + 6));
	}
	if (fp != NULL)
		fclose(fp);
	CU_ASSERT_FATAL(url[0] != '\0');
	CU_ASSERT_EQUAL_FATAL(nng_aio_alloc(&a, NULL, NULL), 0);
	nng_aio_set_timeout(a, 5000);
	CU_ASSERT_EQUAL_FATAL(nng_stream_dialer_alloc(&d, url), 0);
	nng_stream_dialer_dial(d, a);
	nng_aio_wait(a);
	CU_ASSERT_EQUAL_FATAL(nng_aio_result(a), 0);
	s = nng_aio_get_output(a, 0);
	nng_aio_set_iov(a, 1, &v); /* the challenge */
	nng_stream_recv(s, a);
	nng_aio_wait(a);
	CU_ASSERT_EQUAL(nng_aio_result(a), 0);
	v = (nng_iov){buf, sizeof(buf)};
	nng_aio_set_iov(a, 1, &v);
	nng_stream_send(s, a);
	nng_aio_wait(a);
	CU_ASSERT_EQUAL(nng_aio_result(a), 0);
	v = (nng_iov){buf, 4};
	nng_aio_set_iov(a, 1, &v);
	nng_stream_recv(s, a);
	nng_aio_wait(a);
	refused = nng_aio_result(a) != 0;
	nng_stream_free(s);
	nng_stream_dialer_free(d);
	nng_aio_free(a);
	return refused;
}

typedef struct forge {
	losses l;
	const char *log; /* the attacked worker's */
	int64_t at;      /* forge after this step */
	int sent;
} forge;

/* forge_metric records the loss and, after step f->at, sends forged frames
 * to the stage's data port from a raw PUSH socket: a forward frame claiming
 * rank 1 with a sequence number far ahead (no MAC), the same with a MAC-like
 * trailer, and a command claiming rank 0 (the coordinator). */
static void forge_metric(void *ctx, const pt_job_metric *m)
{
	forge *f = ctx;
	char url[300];
	nng_socket s;

	on_metric(&f->l, m);
	if (m->step != f->at)
		return;
	CU_ASSERT_FATAL(data_url(f->log, url, sizeof(url)));
	CU_ASSERT_EQUAL_FATAL(nng_push0_open(&s), 0);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 10000);
	CU_ASSERT_EQUAL_FATAL(nng_dial(s, url, NULL, 0), 0);
	nng_msg *msgs[] = {
	    forged_frame(PT_MSG_FORWARD, PT_CH_FORWARD, 1, 1000000, false),
	    forged_frame(PT_MSG_FORWARD, PT_CH_FORWARD, 1, 1000000, true),
	    forged_frame(PT_MSG_COMMAND, PT_CH_CONTROL, 0, 1000000, false),
	};
	for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++)
		if (nng_sendmsg(s, msgs[i], 0) == 0)
			f->sent++;
		else
			nng_msg_free(msgs[i]);
	nanosleep(&(struct timespec){0, 300 * 1000000L}, NULL); /* delivered before close */
	nng_close(s);
	f->sent += bulk_stranger(f->log);
}

/* Issue 11, defect 2: frames forged by a stranger at a running job's stage
 * data port, and a hello without the session key at its bulk lane port,
 * change nothing: the job finishes with the losses of the local run,
 * bitwise, and the attacked stage counts each forgery in its errors (the
 * pipetrain_comm_errors_total series); the other ranks count none. */
static void test_workers_forged_frames_ignored(void)
{
	char log0[400], log1[400];
	wf_proc w0, w1;
	losses local;
	forge f = {.at = 5};
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = &f, .on_metric = forge_metric};
	int64_t last = 0;
	const char *base[] = {server_bin, "--worker", "--listen", "tcp://127.0.0.1:0", NULL};

	snprintf(log0, sizeof(log0), "%s/forge-w0.log", tmpdir);
	snprintf(log1, sizeof(log1), "%s/forge-w1.log", tmpdir);
	CU_ASSERT_FATAL(wf_proc_start(&w0, base, log0));
	CU_ASSERT_FATAL(wf_proc_start(&w1, base, log1));
	run_job(NULL, NULL, &local);
	f.log = log1; /* stage 1, rank 2: gets forwards from rank 1 */
	digits_spec(&spec, &w0, &w1);
	if (pt_job_run(&spec, &o, &h, &last) != PT_OK) {
		fprintf(stderr, "job failed: %s\n", pt_last_error());
		CU_FAIL_FATAL("the job failed");
	}
	CU_ASSERT_EQUAL(last, STEPS);
	CU_ASSERT_EQUAL(f.sent, 4);
	CU_ASSERT_EQUAL(f.l.n, STEPS);
	wf_expect_same_losses(local.v, f.l.v, STEPS, "with forged frames");
	CU_ASSERT_EQUAL_FATAL(f.l.last.n_comm, 3);
	CU_ASSERT_EQUAL(f.l.last.comm[0].errors, 0);
	CU_ASSERT_EQUAL(f.l.last.comm[1].errors, 0);
	CU_ASSERT_EQUAL(f.l.last.comm[2].errors, 4);
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
}

/* Workers on tls+tcp:// (control and stage data), with a CA and a node
 * certificate made by the openssl command at test time (mbed TLS in nng
 * matches the URL's host against DNS names, hence DNS:127.0.0.1); the
 * workers ask for a client certificate (--tls-ca), which the coordinator
 * presents: the job gives the local run's losses, bitwise. A coordinator without the CA is
 * refused before any worker is joined, naming the option. */
static void test_workers_tls_job(void)
{
	char cmd[4096], ca[400], cert[400], key[400], url0[300], url1[300], log1[400], data[300];
	wf_proc w0, w1;
	losses local, remote;
	pt_job_spec spec;
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	pt_job_hooks h = {.ctx = &remote, .on_metric = on_metric};
	const char *urls[2] = {url0, url1};
	int64_t last = 0;

	if (system("command -v openssl >/dev/null 2>&1") != 0) {
		printf("(openssl missing: skipped) ");
		return;
	}
	snprintf(ca, sizeof(ca), "%s/ca.pem", tmpdir);
	snprintf(cert, sizeof(cert), "%s/node.pem", tmpdir);
	snprintf(key, sizeof(key), "%s/node.key", tmpdir);
	snprintf(cmd, sizeof(cmd),
	         "(cd %s && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
	         "-keyout ca.key -out ca.pem && "
	         "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout node.key "
	         "-out node.csr && "
	         "printf 'subjectAltName=DNS:127.0.0.1,DNS:localhost,IP:127.0.0.1\n' > node.ext && "
	         "openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
	         "-days 2 -extfile node.ext -out node.pem) >/dev/null 2>&1",
	         tmpdir);
	if (system(cmd) != 0) {
		CU_FAIL("openssl could not make the test certificates");
		return;
	}
	{
		const char *args[] = {
		    server_bin, "--worker",  "--listen", "tls+tcp://127.0.0.1:0", "--tls-cert",
		    cert,       "--tls-key", key,        "--worker-tls-ca",       ca,
		    "--tls-ca", ca,          NULL};
		snprintf(log1, sizeof(log1), "%s/tls-w1.log", tmpdir);
		CU_ASSERT_FATAL(wf_proc_start(&w0, args, log_path()));
		CU_ASSERT_FATAL(wf_proc_start(&w1, args, log1));
	}
	CU_ASSERT(strncmp(w0.url, "tls+tcp://127.0.0.1:", 20) == 0);
	snprintf(url0, sizeof(url0), "%s", w0.url);
	snprintf(url1, sizeof(url1), "%s", w1.url);
	run_job(NULL, NULL, &local);
	memset(&remote, 0, sizeof(remote));
	wf_digits_spec(&spec, 2, STEPS, urls, 2);
	/* Without the CA: refused, naming the option. */
	PT_CHECK_ERR_MSG(pt_job_run(&spec, &o, NULL, NULL), PT_ERR_INVALID, "--tls-cert");
	o.worker_tls = (pt_job_tls){cert, key, NULL};
	PT_CHECK_ERR_MSG(pt_job_run(&spec, &o, NULL, NULL), PT_ERR_INVALID, "--worker-tls-ca");
	o.worker_tls.ca = ca;
	if (pt_job_run(&spec, &o, &h, &last) != PT_OK) {
		fprintf(stderr, "job failed: %s\n", pt_last_error());
		CU_FAIL_FATAL("the job failed");
	}
	CU_ASSERT_EQUAL(last, STEPS);
	CU_ASSERT(data_url(log1, data, sizeof(data)) && strncmp(data, "tls+tcp://", 10) == 0);
	wf_expect_same_losses(local.v, remote.v, STEPS, "on tls+tcp:// workers");
	CU_ASSERT_EQUAL_FATAL(remote.last.n_comm, 3);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(remote.last.comm[i].errors, 0);
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w1), 0);
}

/* ----------------------------------------------------------------- pool -- */

/* pool_count asks the server for its pool and counts the workers in state
 * st (-1: any), only draining ones if draining_only. */
static int pool_count(wf_api *a, int st, bool draining_only)
{
	pt_api_request q;
	pt_api_response r;
	pt_api_worker_info w;
	int n = 0;

	pt_api_request_init(&q, PT_API_LIST_WORKERS);
	CU_ASSERT_FATAL(wf_api_call(a, &q, &r));
	CU_ASSERT_EQUAL_FATAL(r.code, PT_API_OK);
	for (size_t i = 0; i < r.n_workers; i++) {
		PT_CHECK_OK(pt_api_response_worker(&r, i, &w));
		if ((st < 0 || (int)w.state == st) && (!draining_only || w.draining))
			n++;
	}
	return n;
}

static bool pool_wait(wf_api *a, int st, int n, double seconds)
{
	double t0 = wf_mono();
	while (pool_count(a, st, false) != n) {
		if (wf_mono() - t0 > seconds)
			return false;
		usleep(20000);
	}
	return true;
}

/* pool_server starts a server whose --pool is pool (a URL list or @FILE),
 * with --devices devices and its data in tmpdir/name. */
static void pool_server(wf_proc *srv, const char *name, const char *pool, const char *devices)
{
	char data_dir[400];
	snprintf(data_dir, sizeof(data_dir), "%s/%s", tmpdir, name);
	const char *args[] = {"--listen",
	                      "tcp://127.0.0.1:0",
	                      "--data-dir",
	                      data_dir,
	                      "--files-root",
	                      PT_SOURCE_ROOT,
	                      "--pool",
	                      pool,
	                      "--devices",
	                      devices,
	                      "--threads",
	                      "2",
	                      NULL};
	CU_ASSERT_FATAL(proc_start(srv, args));
}

/* pool_setup starts n workers into w and a pool_server of them (pool gets
 * the list), opens api on it and waits until every worker is idle. */
static void pool_setup(wf_proc *w, int n, const char *name, wf_proc *srv, wf_api *api, char *pool,
                       size_t cap)
{
	pool[0] = '\0';
	for (int i = 0; i < n; i++) {
		CU_ASSERT_FATAL(worker_start(&w[i], NULL));
		snprintf(pool + strlen(pool), cap - strlen(pool), "%s%s", i ? "," : "", w[i].url);
	}
	pool_server(srv, name, pool, "none");
	wf_api_open(api, srv->url, NULL);
	CU_ASSERT_FATAL(pool_wait(api, PT_API_WORKER_IDLE, n, 10));
}

/* local_final_loss trains spec in this process and returns its last loss. */
static double local_final_loss(const pt_job_spec *spec)
{
	pt_job_run_options o = {.files_root = PT_SOURCE_ROOT, .threads = 2};
	losses l;
	pt_job_hooks h = {.ctx = &l, .on_metric = on_metric};
	int64_t last = 0;

	memset(&l, 0, sizeof(l));
	PT_CHECK_OK(pt_job_run(spec, &o, &h, &last));
	return l.last.loss;
}

/* A server with a pool of 3 workers and no local devices: a 4-stage job is
 * refused naming the shortfall; a long 2-stage job A takes 2 workers, a
 * 2-stage job B waits and says why, a 1-stage job C behind it fits and
 * starts first (backfill); B runs when A gives its workers back; every
 * job's final loss equals its in-process run bitwise; with A running again,
 * a later priority-5 job starts before an earlier priority-0 one; ListWorkers
 * and ServerInfo count the workers; DrainWorker takes one out of lending. */
static void test_workers_pool(void)
{
	char pool[1024], reason[600], want_msg[200];
	wf_proc w[3], srv;
	pt_job_spec a, b, c, big;
	pt_api_job_info ji;
	pt_api_request q;
	pt_api_response r;
	wf_api api;
	uint64_t ida, idb, idc;
	double want_a, want_b, want_c;

	pool_setup(w, 3, "pool-data", &srv, &api, pool, sizeof(pool));
	pt_api_request_init(&q, PT_API_SERVER_INFO);
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT(r.info.workers == 3 && r.info.workers_free == 3 && r.info.workers_busy == 0 &&
	          r.info.workers_unreachable == 0);
	pt_api_request_init(&q, PT_API_LIST_WORKERS);
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_EQUAL(r.n_workers, 3);
	for (size_t i = 0; i < r.n_workers; i++) { /* what each computes on, from its ping */
		pt_api_worker_info wi;
		char want[64];
		PT_CHECK_OK(pt_api_response_worker(&r, i, &wi));
		snprintf(want, sizeof(want), "cpu (%d core%s)", pt_num_cores(),
		         pt_num_cores() == 1 ? "" : "s");
		CU_ASSERT_STRING_EQUAL(wi.url, w[i].url);
		CU_ASSERT(wi.devices != NULL && strncmp(wi.devices, want, strlen(want)) == 0);
	}

	wf_digits_spec(&big, 4, STEPS, NULL, 0);
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &big;
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(r.message ? r.message : "",
	                       "placement.stages: 4 stages need 4 pool workers; the pool has 3 "
	                       "and this server runs no stages on its CPU (--devices)");

	wf_digits_spec(&a, 2, 600, NULL, 0);
	wf_digits_spec(&b, 2, STEPS, NULL, 0);
	wf_digits_spec(&c, 1, STEPS, NULL, 0);
	b.seed = 7;
	want_a = local_final_loss(&a);
	want_b = local_final_loss(&b);
	want_c = local_final_loss(&c);
	CU_ASSERT_NOT_EQUAL_FATAL((ida = wf_api_submit(&api, &a)), 0);
	CU_ASSERT_NOT_EQUAL_FATAL((idb = wf_api_submit(&api, &b)), 0);
	wf_api_get(&api, idb, &ji);
	snprintf(reason, sizeof(reason), "%s", ji.message ? ji.message : "");
	CU_ASSERT_EQUAL(ji.state, PT_JOB_QUEUED);
	if (strstr(reason, "queued: needs 2 workers, 1 of 3 free") != reason)
		fprintf(stderr, "job B waits: \"%s\"\n", reason);
	CU_ASSERT(strstr(reason, "queued: needs 2 workers, 1 of 3 free") == reason);
	CU_ASSERT_EQUAL(pool_count(&api, PT_API_WORKER_BUSY, false), 2);
	/* C needs one worker: it starts while B waits for two. */
	CU_ASSERT_NOT_EQUAL_FATAL((idc = wf_api_submit(&api, &c)), 0);
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, idc, 60, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.has_last && ji.last.loss == want_c);
	wf_api_get(&api, ida, &ji);
	CU_ASSERT_EQUAL(ji.state, PT_JOB_RUNNING); /* C ran beside A, before B */
	wf_api_get(&api, idb, &ji);
	CU_ASSERT_EQUAL(ji.state, PT_JOB_QUEUED);
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, ida, 120, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.has_last && ji.last.loss == want_a);
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, idb, 60, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.has_last && ji.last.loss == want_b);
	CU_ASSERT_FATAL(pool_wait(&api, PT_API_WORKER_IDLE, 3, 10));

	/* Priorities: with one worker free, a later priority-5 job starts before
	 * an earlier priority-0 one once A's two workers come back. */
	{
		pt_job_spec d, e;
		pt_api_job_info jd, je;
		uint64_t idd, ide;
		CU_ASSERT_NOT_EQUAL_FATAL((ida = wf_api_submit(&api, &a)), 0);
		wf_digits_spec(&d, 2, STEPS, NULL, 0);
		wf_digits_spec(&e, 2, STEPS, NULL, 0);
		e.priority = 5;
		CU_ASSERT_NOT_EQUAL_FATAL((idd = wf_api_submit(&api, &d)), 0);
		CU_ASSERT_NOT_EQUAL_FATAL((ide = wf_api_submit(&api, &e)), 0);
		wf_api_get(&api, idd, &jd);
		snprintf(reason, sizeof(reason), "%s", jd.message ? jd.message : "");
		snprintf(want_msg, sizeof(want_msg),
		         "queued: needs 2 workers, 1 of 3 free; behind job %llu (priority 5)",
		         (unsigned long long)ide);
		if (strcmp(reason, want_msg) != 0)
			fprintf(stderr, "job D waits: \"%s\"\n", reason);
		CU_ASSERT_STRING_EQUAL(reason, want_msg);
		CU_ASSERT_EQUAL(wf_api_wait_final(&api, ida, 120, &ji), PT_JOB_SUCCEEDED);
		CU_ASSERT_EQUAL(wf_api_wait_final(&api, ide, 60, &je), PT_JOB_SUCCEEDED);
		CU_ASSERT_EQUAL(wf_api_wait_final(&api, idd, 60, &jd), PT_JOB_SUCCEEDED);
		CU_ASSERT(je.started_unix > 0 && je.started_unix < jd.started_unix);
		CU_ASSERT(jd.has_last && je.has_last && jd.last.loss == je.last.loss);
		pt_job_spec_fini(&d);
		pt_job_spec_fini(&e);
		CU_ASSERT_FATAL(pool_wait(&api, PT_API_WORKER_IDLE, 3, 10));
	}

	pt_api_request_init(&q, PT_API_DRAIN_WORKER);
	q.url = w[1].url;
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT_EQUAL(pool_count(&api, -1, true), 1);
	pt_api_request_init(&q, PT_API_SERVER_INFO);
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT(r.info.workers == 3 && r.info.workers_free == 2);
	pt_api_request_init(&q, PT_API_DRAIN_WORKER);
	q.url = "tcp://127.0.0.1:1";
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_NOT_FOUND);

	wf_api_close(&api);
	pt_job_spec_fini(&a);
	pt_job_spec_fini(&b);
	pt_job_spec_fini(&c);
	pt_job_spec_fini(&big);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(wf_proc_stop(&w[i]), 0);
}

/* --keep-jobs 1 with pooled runs: each of four one-stage jobs on a pool of
 * two workers, one after another, deletes the one before it (the run's own
 * thread prunes, then moves on to place the queue; a run that is done is
 * joined under the lock); only the last stays listed, the others' folders
 * are gone, and the server stops cleanly. */
static void test_workers_pool_keep_jobs(void)
{
	char pool[200], data_dir[400], path[500];
	wf_proc w[2], srv;
	pt_job_spec spec;
	pt_api_job_info ji;
	pt_api_request q;
	pt_api_response r;
	wf_api api;
	uint64_t id[4];
	struct stat st;
	double t0;

	snprintf(data_dir, sizeof(data_dir), "%s/pool-keep-data", tmpdir);
	pool[0] = '\0';
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_FATAL(worker_start(&w[i], NULL));
		snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool), "%s%s", i ? "," : "",
		         w[i].url);
	}
	const char *args[] = {"--listen",
	                      "tcp://127.0.0.1:0",
	                      "--data-dir",
	                      data_dir,
	                      "--files-root",
	                      PT_SOURCE_ROOT,
	                      "--pool",
	                      pool,
	                      "--devices",
	                      "none",
	                      "--threads",
	                      "2",
	                      "--keep-jobs",
	                      "1",
	                      NULL};
	CU_ASSERT_FATAL(proc_start(&srv, args));
	wf_api_open(&api, srv.url, NULL);
	CU_ASSERT_FATAL(pool_wait(&api, PT_API_WORKER_IDLE, 2, 10));
	wf_digits_spec(&spec, 1, 20, NULL, 0);
	for (int i = 0; i < 4; i++) {
		CU_ASSERT_NOT_EQUAL_FATAL((id[i] = wf_api_submit(&api, &spec)), 0);
		CU_ASSERT_EQUAL(wf_api_wait_final(&api, id[i], 60, &ji), PT_JOB_SUCCEEDED);
	}
	/* The last one's run may still be pruning: ListJobs until one is left. */
	t0 = wf_mono();
	do {
		pt_api_request_init(&q, PT_API_LIST_JOBS);
		CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
		if (r.n_jobs == 1)
			break;
		usleep(20000);
	} while (wf_mono() - t0 < 20);
	CU_ASSERT_EQUAL(r.n_jobs, 1);
	if (r.n_jobs == 1) {
		PT_CHECK_OK(pt_api_response_job(&r, 0, &ji));
		CU_ASSERT_EQUAL(ji.id, id[3]);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/jobs/%llu", data_dir, (unsigned long long)id[i]);
		CU_ASSERT_NOT_EQUAL(stat(path, &st), 0);
	}
	wf_api_close(&api);
	pt_job_spec_fini(&spec);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL(wf_proc_stop(&w[i]), 0);
}

/* Three pooled jobs on seven workers (one free): a worker of job A killed
 * mid-run restarts A (max_restarts 1) on the free worker, claimed as a
 * spare, and A ends with the losses of its uninterrupted in-process run,
 * bitwise; B and C finish undisturbed, bitwise; the dead worker shows
 * unreachable. */
static void test_workers_pool_restart(void)
{
	enum { NW = 7 };
	char pool[NW * 80];
	wf_proc w[NW], srv;
	pt_job_spec spec[3];
	pt_api_job_info ji;
	pt_api_request q;
	pt_api_response r;
	wf_api api;
	uint64_t id[3];
	double want[3], t0;
	int victim = -1, st;

	pool_setup(w, NW, "pool-restart-data", &srv, &api, pool, sizeof(pool));
	for (int j = 0; j < 3; j++) {
		wf_digits_spec(&spec[j], 2, 1000, NULL, 0);
		spec[j].seed = 21 + (uint64_t)j;
		spec[j].max_restarts = j == 0 ? 1 : 0;
		spec[j].checkpoint_every = 50;
		spec[j].worker_timeout_ms = HB_TIMEOUT_MS;
		want[j] = local_final_loss(&spec[j]);
	}
	for (int j = 0; j < 3; j++)
		CU_ASSERT_NOT_EQUAL_FATAL((id[j] = wf_api_submit(&api, &spec[j])), 0);
	t0 = wf_mono();
	do {
		usleep(10000);
		wf_api_get(&api, id[0], &ji);
	} while (ji.step < 60 && !pt_api_job_state_final(ji.state) && wf_mono() - t0 < 60);
	CU_ASSERT_EQUAL_FATAL(ji.state, PT_JOB_RUNNING);
	pt_api_request_init(&q, PT_API_LIST_WORKERS);
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	for (size_t i = 0; i < r.n_workers && victim < 0; i++) {
		pt_api_worker_info wi;
		PT_CHECK_OK(pt_api_response_worker(&r, i, &wi));
		for (int k = 0; k < NW && wi.job == id[0]; k++)
			if (strcmp(wi.url, w[k].url) == 0)
				victim = k;
	}
	CU_ASSERT_FATAL(victim >= 0);
	for (int j = 1; j < 3; j++) { /* B and C are running beside A */
		wf_api_get(&api, id[j], &ji);
		CU_ASSERT_EQUAL(ji.state, PT_JOB_RUNNING);
	}
	kill(w[victim].pid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(w[victim].pid, &st, 0), w[victim].pid);
	for (int j = 0; j < 3; j++) {
		CU_ASSERT_EQUAL(wf_api_wait_final(&api, id[j], 180, &ji), PT_JOB_SUCCEEDED);
		if (!ji.has_last || ji.last.loss != want[j])
			fprintf(stderr, "pooled job %d: %s\n", j, ji.message ? ji.message : "");
		CU_ASSERT(ji.has_last && ji.last.loss == want[j]);
		if (j == 0) {
			if (ji.message == NULL ||
			    strstr(ji.message, "succeeded after 1 restart") == NULL)
				fprintf(stderr, "pooled restart: \"%s\"\n",
				        ji.message ? ji.message : "");
			CU_ASSERT(ji.message != NULL &&
			          strstr(ji.message, "succeeded after 1 restart") != NULL);
		} else {
			CU_ASSERT(ji.message == NULL || strstr(ji.message, "restart") == NULL);
		}
	}
	CU_ASSERT(pool_wait(&api, PT_API_WORKER_UNREACHABLE, 1, 15));
	CU_ASSERT(pool_wait(&api, PT_API_WORKER_IDLE, NW - 1, 15));
	wf_api_close(&api);
	for (int j = 0; j < 3; j++)
		pt_job_spec_fini(&spec[j]);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	for (int i = 0; i < NW; i++)
		if (i != victim)
			CU_ASSERT_EQUAL(wf_proc_stop(&w[i]), 0);
}

/* kill -9 of a server while two pooled jobs run: started again on the same
 * data directory and pool, it places both again (their workers idle once the
 * dead coordinator's sessions expire) and each finishes from its last
 * checkpoint with the losses of its uninterrupted run, bitwise. */
static void test_workers_pool_server_killed(void)
{
	char pool[1024];
	wf_proc w[4], srv;
	pt_job_spec spec[2];
	pt_api_job_info ji;
	wf_api api;
	uint64_t id[2];
	double want[2], t0;
	int st;

	pool_setup(w, 4, "pool-killed-data", &srv, &api, pool, sizeof(pool));
	for (int j = 0; j < 2; j++) {
		wf_digits_spec(&spec[j], 2, 1000, NULL, 0);
		spec[j].seed = 11 + (uint64_t)j;
		spec[j].checkpoint_every = 50;
		spec[j].worker_timeout_ms = HB_TIMEOUT_MS;
		want[j] = local_final_loss(&spec[j]);
		CU_ASSERT_NOT_EQUAL_FATAL((id[j] = wf_api_submit(&api, &spec[j])), 0);
	}
	t0 = wf_mono();
	for (int j = 0; j < 2; j++)
		do {
			usleep(10000);
			wf_api_get(&api, id[j], &ji);
		} while (ji.step < 60 && !pt_api_job_state_final(ji.state) && wf_mono() - t0 < 60);
	wf_api_get(&api, id[0], &ji);
	CU_ASSERT_EQUAL_FATAL(ji.state, PT_JOB_RUNNING);
	wf_api_get(&api, id[1], &ji);
	CU_ASSERT_EQUAL_FATAL(ji.state, PT_JOB_RUNNING);
	wf_api_close(&api);
	kill(srv.pid, SIGKILL);
	CU_ASSERT_EQUAL(waitpid(srv.pid, &st, 0), srv.pid);

	pool_server(&srv, "pool-killed-data", pool, "none");
	wf_api_open(&api, srv.url, NULL);
	for (int j = 0; j < 2; j++) {
		CU_ASSERT_EQUAL(wf_api_wait_final(&api, id[j], 180, &ji), PT_JOB_SUCCEEDED);
		if (!ji.has_last || ji.last.loss != want[j])
			fprintf(stderr, "job %d after the kill: %s, loss %.17g want %.17g\n", j,
			        ji.message ? ji.message : "", ji.last.loss, want[j]);
		CU_ASSERT(ji.has_last && ji.last.loss == want[j]);
		CU_ASSERT_EQUAL(ji.step, 1000);
	}
	wf_api_close(&api);
	for (int j = 0; j < 2; j++)
		pt_job_spec_fini(&spec[j]);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(wf_proc_stop(&w[i]), 0);
}

/* --pool @FILE: the list is read at start and again on SIGHUP: a worker
 * added to the file joins the pool, one taken out leaves it (no job holds
 * it), and a file that no longer parses keeps the pool as it was. */
static void test_workers_pool_file_reload(void)
{
	char file[400], at[420], list[1024];
	wf_proc w[3], srv;
	wf_api api;

	for (int i = 0; i < 3; i++)
		CU_ASSERT_FATAL(worker_start(&w[i], NULL));
	snprintf(file, sizeof(file), "%s/pool.txt", tmpdir);
	snprintf(at, sizeof(at), "@%s", file);
	snprintf(list, sizeof(list), "# the pool\n%s\n\n  %s  # second\n", w[0].url, w[1].url);
	pt_test_write_file(file, list, strlen(list));
	pool_server(&srv, "pool-file-data", at, "cpu");
	wf_api_open(&api, srv.url, NULL);
	CU_ASSERT(pool_wait(&api, PT_API_WORKER_IDLE, 2, 10));
	CU_ASSERT_EQUAL(pool_count(&api, -1, false), 2);

	snprintf(list, sizeof(list), "%s\n%s\n%s\n", w[0].url, w[1].url, w[2].url);
	pt_test_write_file(file, list, strlen(list));
	kill(srv.pid, SIGHUP);
	CU_ASSERT(pool_wait(&api, PT_API_WORKER_IDLE, 3, 10));

	snprintf(list, sizeof(list), "%s\n", w[2].url);
	pt_test_write_file(file, list, strlen(list));
	kill(srv.pid, SIGHUP);
	CU_ASSERT(pool_wait(&api, -1, 1, 10));
	CU_ASSERT_EQUAL(pool_count(&api, PT_API_WORKER_IDLE, false), 1);

	snprintf(list, sizeof(list), "%s\nhttp://not-a-worker\n", w[0].url);
	pt_test_write_file(file, list, strlen(list));
	kill(srv.pid, SIGHUP);
	usleep(300000);
	CU_ASSERT_EQUAL(pool_count(&api, -1, false), 1); /* kept as it was */

	wf_api_close(&api);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(wf_proc_stop(&w[i]), 0);
}

/* Bad pools are refused at start, naming the problem: an entry that is no
 * worker URL (flag: exit 2), a file over the 256-worker limit or listing a
 * worker twice (exit 1); DrainWorker without a URL is refused. */
static void test_workers_pool_refusals(void)
{
	char file[400], at[420], data_dir[400], *big = malloc(257 * 40 + 1);
	size_t o = 0;
	wf_proc srv, w0;
	wf_api api;
	pt_api_request q;
	pt_api_response r;
	int st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(big);
	snprintf(data_dir, sizeof(data_dir), "%s/pool-refusals", tmpdir);
	{
		const char *args[] = {
		    "--listen", "tcp://127.0.0.1:0",          "--data-dir", data_dir,
		    "--pool",   "tcp://127.0.0.1:1,http://x", NULL};
		CU_ASSERT_FALSE(proc_start(&srv, args));
		CU_ASSERT_EQUAL(waitpid(srv.pid, &st, 0), srv.pid);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	}
	snprintf(file, sizeof(file), "%s/big-pool.txt", tmpdir);
	snprintf(at, sizeof(at), "@%s", file);
	for (int i = 0; i < 257; i++)
		o += (size_t)snprintf(big + o, 40, "tcp://127.0.0.1:%d\n", 20000 + i);
	const char *lists[] = {big, "tcp://127.0.0.1:5\ntcp://127.0.0.1:5\n"};
	for (size_t k = 0; k < 2; k++) {
		const char *args[] = {
		    "--listen", "tcp://127.0.0.1:0", "--data-dir", data_dir, "--pool", at, NULL};
		pt_test_write_file(file, lists[k], strlen(lists[k]));
		CU_ASSERT_FALSE(proc_start(&srv, args));
		CU_ASSERT_EQUAL(waitpid(srv.pid, &st, 0), srv.pid);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	}
	free(big);

	CU_ASSERT_FATAL(worker_start(&w0, NULL));
	pool_server(&srv, "pool-refusals-ok", w0.url, "none");
	wf_api_open(&api, srv.url, NULL);
	pt_api_request_init(&q, PT_API_DRAIN_WORKER); /* no url */
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_NOT_EQUAL(r.code, PT_API_OK);
	CU_ASSERT(r.message != NULL && strstr(r.message, "url") != NULL);
	wf_api_close(&api);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
	CU_ASSERT_EQUAL(wf_proc_stop(&w0), 0);
}

/* A server with four pretend GPUs (PIPETRAIN_FAKE_GPUS=4 and --devices all:
 * the placement is real, the stages compute on the CPU): a listed GPU it
 * lacks stops it at start; a 5-stage job and a job on cuda:7 are refused at
 * submit naming the resource; two 2-stage jobs run side by side, one stage a
 * GPU (cuda:0-1, cuda:2-3), while a third waits saying why and a CPU job runs
 * beside them; the third starts on the GPUs the first of them to finish
 * gives back (usually the second, which has half the steps; on a loaded
 * machine either), beside the other when they end more than a second apart; every
 * final loss equals the job's in-process run bitwise; ServerInfo says who
 * holds each GPU. A real GPU run of the same placement is test_cuda's. */
static void test_workers_gpu_placement(void)
{
	char data_dir[400], reason[600], want[600];
	wf_proc srv;
	wf_api api;
	pt_api_request q;
	pt_api_response r;
	pt_job_spec a, b, c, d, big, pinned;
	pt_api_job_info ji, jc;
	double fin_a, fin_b;
	uint64_t ida, idb, idc, idd;
	double want_a, want_b, want_c, want_d;
	int st;

	setenv("PIPETRAIN_FAKE_GPUS", "4", 1);
	snprintf(data_dir, sizeof(data_dir), "%s/gpu-bad", tmpdir);
	{
		const char *args[] = {"--listen",  "tcp://127.0.0.1:0", "--data-dir", data_dir,
		                      "--devices", "cpu,cuda:5",        NULL};
		CU_ASSERT_FALSE(proc_start(&srv, args));
		CU_ASSERT_EQUAL(waitpid(srv.pid, &st, 0), srv.pid);
		CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	}
	snprintf(data_dir, sizeof(data_dir), "%s/gpu-data", tmpdir);
	{
		const char *args[] = {"--listen",
		                      "tcp://127.0.0.1:0",
		                      "--data-dir",
		                      data_dir,
		                      "--files-root",
		                      PT_SOURCE_ROOT,
		                      "--devices",
		                      "all",
		                      "--threads",
		                      "2",
		                      NULL};
		CU_ASSERT_FATAL(proc_start(&srv, args));
	}
	unsetenv("PIPETRAIN_FAKE_GPUS");
	wf_api_open(&api, srv.url, NULL);
	pt_api_request_init(&q, PT_API_SERVER_INFO);
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_STRING_EQUAL(r.info.devices ? r.info.devices : "",
	                       "cpu, cuda:0 (free), cuda:1 (free), cuda:2 (free), cuda:3 (free); "
	                       "pretend GPUs (PIPETRAIN_FAKE_GPUS)");
	CU_ASSERT_EQUAL(r.info.devices_in_use, 0);

	wf_digits_spec(&big, 5, STEPS, NULL, 0);
	pt_api_request_init(&q, PT_API_SUBMIT_JOB);
	q.spec = &big;
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(r.message ? r.message : "",
	                       "placement.stages: 5 stages need 5 GPUs (one stage a GPU); this "
	                       "server has 4 (cuda:0,cuda:1,cuda:2,cuda:3) and no --pool");
	wf_digits_spec(&pinned, 1, STEPS, NULL, 0);
	free(pinned.device);
	pinned.device = strdup("cuda:7");
	q.spec = &pinned;
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	CU_ASSERT_EQUAL(r.code, PT_API_INVALID_JOB);
	CU_ASSERT_STRING_EQUAL(r.message ? r.message : "",
	                       "device: \"cuda:7\" is not one of this server's GPUs "
	                       "(cuda:0,cuda:1,cuda:2,cuda:3)");

	wf_digits_spec(&a, 2, 600, NULL, 0);
	wf_digits_spec(&b, 2, 300, NULL, 0);
	wf_digits_spec(&c, 2, STEPS, NULL, 0);
	wf_digits_spec(&d, 1, STEPS, NULL, 0);
	b.seed = 7;
	c.seed = 9;
	free(d.device);
	d.device = strdup("cpu");
	want_a = local_final_loss(&a);
	want_b = local_final_loss(&b);
	want_c = local_final_loss(&c);
	want_d = local_final_loss(&d);
	CU_ASSERT_NOT_EQUAL_FATAL((ida = wf_api_submit(&api, &a)), 0);
	CU_ASSERT_NOT_EQUAL_FATAL((idb = wf_api_submit(&api, &b)), 0);
	CU_ASSERT_NOT_EQUAL_FATAL((idc = wf_api_submit(&api, &c)), 0);
	wf_api_get(&api, idc, &jc);
	snprintf(reason, sizeof(reason), "%s", jc.message ? jc.message : "");
	CU_ASSERT_EQUAL(jc.state, PT_JOB_QUEUED);
	CU_ASSERT_STRING_EQUAL(reason, "queued: needs 2 GPUs, 0 of 4 free");
	pt_api_request_init(&q, PT_API_SERVER_INFO);
	CU_ASSERT_FATAL(wf_api_call(&api, &q, &r));
	snprintf(want, sizeof(want),
	         "cpu, cuda:0 (job %llu), cuda:1 (job %llu), cuda:2 (job %llu), cuda:3 (job %llu); "
	         "pretend GPUs (PIPETRAIN_FAKE_GPUS)",
	         (unsigned long long)ida, (unsigned long long)ida, (unsigned long long)idb,
	         (unsigned long long)idb);
	CU_ASSERT_STRING_EQUAL(r.info.devices ? r.info.devices : "", want);
	CU_ASSERT_EQUAL(r.info.devices_in_use, 4);
	/* The CPU is a device of its own: a job on it runs beside the GPU jobs. */
	CU_ASSERT_NOT_EQUAL_FATAL((idd = wf_api_submit(&api, &d)), 0);
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, idd, 60, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.has_last && ji.last.loss == want_d);
	wf_api_get(&api, ida, &ji);
	CU_ASSERT_EQUAL(ji.state, PT_JOB_RUNNING);
	CU_ASSERT(ji.message != NULL &&
	          strncmp(ji.message, "stages on cuda:0, cuda:1 (pretend GPUs: the CPU computes); ",
	                  59) == 0);

	CU_ASSERT_EQUAL(wf_api_wait_final(&api, idb, 120, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.has_last && ji.last.loss == want_b);
	fin_b = ji.finished_unix;
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, idc, 60, &jc), PT_JOB_SUCCEEDED);
	CU_ASSERT(jc.has_last && jc.last.loss == want_c);
	CU_ASSERT_EQUAL(wf_api_wait_final(&api, ida, 120, &ji), PT_JOB_SUCCEEDED);
	CU_ASSERT(ji.has_last && ji.last.loss == want_a);
	fin_a = ji.finished_unix;
	/* C waited for two free GPUs, and took the first pair given back. */
	CU_ASSERT(jc.started_unix >= fmin(fin_a, fin_b));
	if (fabs(fin_a - fin_b) > 1.0)
		CU_ASSERT(jc.started_unix < fmax(fin_a, fin_b)); /* beside the other */

	wf_api_close(&api);
	pt_job_spec_fini(&a);
	pt_job_spec_fini(&b);
	pt_job_spec_fini(&c);
	pt_job_spec_fini(&d);
	pt_job_spec_fini(&big);
	pt_job_spec_fini(&pinned);
	CU_ASSERT_EQUAL(wf_proc_stop(&srv), 0);
}

static const pt_test_case worker_tests[] = {
    {"test_workers_job_matches_local", test_workers_job_matches_local},
    {"test_workers_handshake_refusals", test_workers_handshake_refusals},
    {"test_workers_refusal_log", test_workers_refusal_log},
    {"test_workers_job_errors_name_worker", test_workers_job_errors_name_worker},
    {"test_workers_server_job", test_workers_server_job},
    {"test_workers_killed_worker_fails_job", test_workers_killed_worker_fails_job},
    {"test_workers_hung_worker_fails_job", test_workers_hung_worker_fails_job},
    {"test_workers_shutdown_bounded", test_workers_shutdown_bounded},
    {"test_workers_stuck_closes_bounded", test_workers_stuck_closes_bounded},
    {"test_workers_idle_is_quiet", test_workers_idle_is_quiet},
    {"test_workers_unread_replies_do_not_stall", test_workers_unread_replies_do_not_stall},
    {"test_workers_idle_strangers_capped", test_workers_idle_strangers_capped},
    {"test_workers_restart_on_spare", test_workers_restart_on_spare},
    {"test_workers_silent_coordinator_abandoned", test_workers_silent_coordinator_abandoned},
    {"test_workers_join_waits_for_dead_session", test_workers_join_waits_for_dead_session},
    {"test_workers_forged_frames_ignored", test_workers_forged_frames_ignored},
    {"test_workers_tls_job", test_workers_tls_job},
    {"test_workers_gpu_placement", test_workers_gpu_placement},
    {"test_workers_pool", test_workers_pool},
    {"test_workers_pool_keep_jobs", test_workers_pool_keep_jobs},
    {"test_workers_pool_restart", test_workers_pool_restart},
    {"test_workers_pool_server_killed", test_workers_pool_server_killed},
    {"test_workers_pool_file_reload", test_workers_pool_file_reload},
    {"test_workers_pool_refusals", test_workers_pool_refusals},
    {"test_workers_schedules_match_gpipe", test_workers_schedules_match_gpipe},
    {"test_workers_interleaved_turns", test_workers_interleaved_turns},
    {NULL, NULL},
};
static const pt_test_suite suites[] = {
    {"workers", worker_tests},
    {NULL, NULL},
};

int main(void)
{
	if (!pt_test_binary("../server/pipeserver", server_bin, sizeof(server_bin))) {
		printf("pipeserver not found at %s: skipping\n", server_bin);
		return 77;
	}
	signal(SIGPIPE, SIG_IGN);
	if (!pt_test_tmpdir("test_workers", tmpdir, sizeof(tmpdir)))
		return 99;
	return pt_test_tmpdir_done(tmpdir, pt_test_main(suites));
}
