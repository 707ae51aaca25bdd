/* worker_fixture.h - what the tests of `pipeserver --worker` share: starting
 * real pipeserver processes (optionally through a prefix such as
 * `ip netns exec NS`), the worker handshake spoken by hand, and a small
 * client of the job API.
 *
 * Helpers assert with CUnit; strings they return point into buffers that
 * stay valid until the next call on the same object. Not thread-safe.
 */
#ifndef PT_WORKER_FIXTURE_H
#define PT_WORKER_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "api/api.h"
#include "handshake.h"

typedef struct wf_proc {
	pid_t pid;
	char url[256]; /* what it printed: `pipeserver listening on <url>` */
} wf_proc;

/* wf_proc_start runs argv (NULL-terminated; argv[0] a path) with stderr
 * appended to log and reads the `pipeserver listening on <url>` line its
 * stdout starts with. False (and pid 0 when the fork failed) otherwise. */
bool wf_proc_start(wf_proc *p, const char *const *argv, const char *log);

/* wf_proc_stop sends SIGTERM and returns the exit status (-1: killed by a
 * signal, -2: not a child). */
int wf_proc_stop(wf_proc *p);

/* wf_mono is CLOCK_MONOTONIC in seconds. */
double wf_mono(void);

/* wf_digits_spec loads examples/digits.json into *spec (release it with
 * pt_job_spec_fini) with `stages` stages, `steps` steps, no evaluation before
 * the end, and placement.workers urls[0..n) (n == 0: in-process stages). */
void wf_digits_spec(pt_job_spec *spec, int stages, int64_t steps, const char *const *urls, int n);

/* wf_expect_same_losses asserts got[0..n) equals want[0..n) bitwise,
 * printing the first step that differs. */
void wf_expect_same_losses(const double *want, const double *got, int n, const char *what);

/* One REQ link to a worker's control URL. */
typedef struct wf_hs {
	nng_socket sock;
	pt_fb_builder b;
	nng_msg *last;
} wf_hs;

void wf_hs_open(wf_hs *c, const char *url);
void wf_hs_close(wf_hs *c);
/* wf_hs_call sends q and decodes the reply into r (strings valid until the
 * next call). */
void wf_hs_call(wf_hs *c, const pt_worker_request *q, pt_worker_reply *r);
/* wf_expect_refusal asserts r is a refusal whose message contains words. */
void wf_expect_refusal(const pt_worker_reply *r, const char *words);
/* wf_worker_idle asks the worker at url for its state (StagePing, session
 * 0), copies it into state and tells whether it is "idle". */
bool wf_worker_idle(const char *url, char *state, size_t n);
/* wf_wait_idle polls the worker's state for up to ms (0: asks once). */
bool wf_wait_idle(const char *url, int ms);

/* A client of pipeserver's job API. */
typedef struct wf_api {
	nng_socket sock;
	pt_fb_builder b;
	nng_msg *reply;
	const char *token;
	uint64_t next_id;
} wf_api;

void wf_api_open(wf_api *a, const char *url, const char *token);
void wf_api_close(wf_api *a);
/* wf_api_call sends q (id and token filled in) and parses the reply into r
 * (a view valid until the next call); false when no reply came. */
bool wf_api_call(wf_api *a, pt_api_request *q, pt_api_response *r);
/* wf_api_submit submits spec and returns the job id (0: refused). */
uint64_t wf_api_submit(wf_api *a, const pt_job_spec *spec);
/* wf_api_get fills *ji with job id's info (strings valid until the next call). */
void wf_api_get(wf_api *a, uint64_t id, pt_api_job_info *ji);
/* wf_api_wait_final polls the job every 20 ms for up to seconds until it
 * reaches a final state; returns that state (or the last one seen). */
pt_api_job_state wf_api_wait_final(wf_api *a, uint64_t id, double seconds, pt_api_job_info *ji);
/* wf_api_losses reads the job's loss per step into v[0..n) (v[k]: step
 * k + 1; NaN where no point came) and returns the number of points. */
int wf_api_losses(wf_api *a, uint64_t id, double *v, int n);

#endif
