/* pt_test.h - small helpers shared by the CUnit test programs.
 *
 * PT_CHECK_OK(expr) asserts a pt_err is PT_OK and prints pt_strerror and
 * pt_last_error() when it is not. pt_test_main registers suites and runs them,
 * returning non-zero when any test or suite failed (CUnit sets no exit code).
 */
#ifndef PT_TEST_H
#define PT_TEST_H

#include <CUnit/Basic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

#ifndef PT_SOURCE_ROOT
#define PT_SOURCE_ROOT "."
#endif

void pt_test_report(int rv, const char *expr, const char *file, int line);

#define PT_CHECK_OK(expr)                                                                          \
	do {                                                                                       \
		pt_err pt_check_rv_ = (expr);                                                      \
		if (pt_check_rv_ != PT_OK)                                                         \
			pt_test_report(pt_check_rv_, #expr, __FILE__, __LINE__);                   \
		CU_ASSERT_EQUAL_FATAL(pt_check_rv_, PT_OK);                                        \
	} while (0)

#define PT_CHECK_ERR(expr, code)                                                                   \
	do {                                                                                       \
		pt_err pt_check_rv_ = (expr);                                                      \
		if (pt_check_rv_ != (code))                                                        \
			pt_test_report(pt_check_rv_, #expr, __FILE__, __LINE__);                   \
		CU_ASSERT_EQUAL(pt_check_rv_, (code));                                             \
	} while (0)

/* PT_CHECK_ERR_MSG checks an error code and that pt_last_error() contains words. */
#define PT_CHECK_ERR_MSG(expr, code, words)                                                        \
	do {                                                                                       \
		pt_err rv_ = (expr);                                                               \
		PT_CHECK_ERR(rv_, code);                                                           \
		if (strstr(pt_last_error(), (words)) == NULL)                                      \
			fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__,          \
			        __LINE__, pt_last_error(), (words));                               \
		CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), (words)));                          \
	} while (0)

/* pt_test_binary writes "<directory of this test program>/<rel>" into out
 * (e.g. "../server/pipeserver") and returns whether it is executable. */
bool pt_test_binary(const char *rel, char *out, size_t cap);

/* pt_test_tmpdir makes a new directory /tmp/<name>.XXXXXX into dir. */
bool pt_test_tmpdir(const char *name, char *dir, size_t cap);

/* pt_test_tmpdir_done removes dir when rc == 0 and PT_KEEP_TMP is unset,
 * else says where the files were kept; returns rc. */
int pt_test_tmpdir_done(const char *dir, int rc);

/* pt_test_wait_exit waits up to timeout_s for child pid to end and returns
 * its waitpid status. A child still running then is a hang: it prints the
 * threads' stacks (gdb, when installed) and the last lines of log (may be
 * NULL), kills it and returns -1, so that a test fails naming the hang
 * instead of waiting out meson's timeout. */
int pt_test_wait_exit(int pid, double timeout_s, const char *log);

/* pt_test_child_dies_with: called first in a child forked from parent (the
 * test program's main thread) that runs a server or worker: the child gets
 * SIGKILL when the test program ends, however it ends (a fatal assertion,
 * the watchdog's abort), and exits at once if it already has. */
void pt_test_child_dies_with(int parent);

/* pt_test_nng_close closes an nng socket (its id) on a helper thread and
 * waits up to 20 s: nng 1.5.2's close can wait for ever on a pipe's reap
 * (nanomsg/nng#1543). A close still blocked then is left behind with a note,
 * so the test goes on; the program's exit bounds nng_fini the same way. */
void pt_test_nng_close(uint32_t sock_id);

/* Raw SP (nng's wire protocol) over TCP, for peers that misbehave. */

/* pt_test_write_all writes n bytes (MSG_NOSIGNAL); false on any failure. */
bool pt_test_write_all(int fd, const void *p, size_t n);

/* pt_test_read_all reads n bytes within timeout_ms: 1 ok, 0 EOF, -1 error,
 * -2 timeout. */
int pt_test_read_all(int fd, void *p, size_t n, int timeout_ms);

/* pt_test_sp_connect opens a TCP connection to 127.0.0.1:port and completes
 * the SP handshake as protocol `proto` against `peer` (REQ 0x30 to REP 0x31,
 * PUSH 0x50 to PULL 0x51); rcvbuf > 0 sets SO_RCVBUF first. -1 on failure. */
int pt_test_sp_connect(int port, int rcvbuf, unsigned proto, unsigned peer);
/* pt_test_tcp_connect opens a TCP connection to 127.0.0.1:port from source
 * address src (an IPv4 address on this host, 127.0.0.2 say; NULL: the
 * kernel's pick); rcvbuf > 0 sets SO_RCVBUF first. -1 on failure. */
int pt_test_tcp_connect(const char *src, int port, int rcvbuf);

/* pt_test_sp_connect_from is pt_test_sp_connect from source address src
 * (an IPv4 address on this host, 127.0.0.2 say; NULL: the kernel's pick). */
int pt_test_sp_connect_from(const char *src, int port, int rcvbuf, unsigned proto, unsigned peer);

/* pt_test_sp_request frames one REQ request (id in the SP header, high bit
 * set) of body. */
bool pt_test_sp_request(int fd, uint32_t id, const uint8_t *body, size_t len);

/* pt_test_write_file writes len bytes to path (asserting success). */
void pt_test_write_file(const char *path, const void *data, size_t len);

typedef struct pt_test_case {
	const char *name;
	void (*fn)(void);
} pt_test_case;

typedef struct pt_test_suite {
	const char *name;
	const pt_test_case *tests; /* terminated by {NULL, NULL} */
} pt_test_suite;

/* pt_test_main runs the suites (terminated by {NULL, NULL}); returns the exit
 * code. PT_TEST_ONLY / PT_TEST_SKIP (comma-separated substrings of test
 * names) run only, or leave out, the tests they name. */
int pt_test_main(const pt_test_suite *suites);

struct pt_job_spec;

/* pt_test_digits_spec decodes examples/digits.json into *spec (asserting
 * success; release it with pt_job_spec_fini). */
void pt_test_digits_spec(struct pt_job_spec *spec);

/* pt_test_same_tensors: the two safetensors files hold the same tensors
 * (names, sizes), bit for bit (asserting both open). */
bool pt_test_same_tensors(const char *a, const char *b);

/* pt_test_same_state_split: two .state files (b's run may have other stage
 * counts or chunks) hold the same parameters and optimizer copies, bit for
 * bit, once each stage's parts are concatenated in stage order (a_w: the
 * weights file of a's run, for the parameter count). */
bool pt_test_same_state_split(const char *a_w, const char *a, const char *b);

/* pt_test_path joins PT_SOURCE_ROOT and rel into one of 8 rotating static
 * buffers (not thread-safe). */
const char *pt_test_path(const char *rel);

#endif
