/* pt-stage - host one pipeline stage in its own process over nng.
 *
 *   pt-stage --rank R --world W [--listen URL] [--compress] [--timeout-ms N]
 *
 * Reads the session key on stdin first, one line of 64 hex digits (every rank
 * of the session has the same; frames without its MAC are dropped), prints
 * "listening <url>" on stdout (a tcp port 0 resolved), then reads one
 * line of W space-separated URLs (every rank's, in rank order) on stdin,
 * connects, and serves the stage the coordinator (rank 0) configures, until
 * it is told to stop. Exit status 0 after a STOP, 1 on error, 2 on usage.
 * (`pipeserver --worker` is the long-running host; this is the bare one used
 * by tests and benchmarks.)
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "runtime.h"

#define MAX_LINE 65536

int main(int argc, char **argv)
{
	static const struct option longopts[] = {{"rank", required_argument, 0, 'r'},
	                                         {"world", required_argument, 0, 'w'},
	                                         {"listen", required_argument, 0, 'l'},
	                                         {"compress", no_argument, 0, 'c'},
	                                         {"timeout-ms", required_argument, 0, 't'},
	                                         {"task-delay-ms", required_argument, 0, 'd'},
	                                         {0, 0, 0, 0}};
	pt_nng_options o = {
	    .listen_url = "tcp://127.0.0.1:0", .rank = -1, .world = 0, .timeout_ms = 30000};
	const char *urls[PT_MAX_STAGES + 1];
	static char line[MAX_LINE];
	uint8_t key[PT_COMM_KEY_BYTES];
	pt_comm *comm;
	int c, n = 0;
	char *save = NULL;

	pt_runtime_ensure_passive_wait(argv);
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			o.rank = atoi(optarg);
			break;
		case 'w':
			o.world = atoi(optarg);
			break;
		case 'l':
			o.listen_url = optarg;
			break;
		case 'c':
			o.compress = true;
			break;
		case 't':
			o.timeout_ms = atoi(optarg);
			break;
		case 'd':
			pt_stage_host_set_task_delay(atoi(optarg));
			break;
		default:
			fprintf(stderr,
			        "usage: pt-stage --rank R --world W [--listen URL] [--compress] "
			        "[--timeout-ms N]\n");
			return 2;
		}
	}
	if (o.world < 2 || o.world > PT_MAX_STAGES + 1 || o.rank < 1 || o.rank >= o.world) {
		fprintf(stderr, "pt-stage: need --world in [2, %d] and --rank in [1, world)\n",
		        PT_MAX_STAGES + 1);
		return 2;
	}
	if (fgets(line, sizeof(line), stdin) == NULL) {
		fprintf(stderr, "pt-stage: no session key on stdin\n");
		return 1;
	}
	line[strcspn(line, "\r\n")] = '\0';
	if (pt_comm_key_parse(line, key) != PT_OK) {
		fprintf(stderr, "pt-stage: %s\n", pt_last_error());
		return 1;
	}
	o.key = key;
	if (pt_nng_comm_create(&comm, &o) != PT_OK) {
		fprintf(stderr, "pt-stage: %s\n", pt_last_error());
		return 1;
	}
	printf("listening %s\n", pt_nng_comm_url(comm));
	fflush(stdout);
	if (fgets(line, sizeof(line), stdin) == NULL) {
		fprintf(stderr, "pt-stage: no peer list on stdin\n");
		pt_comm_destroy(comm);
		return 1;
	}
	for (char *tok = strtok_r(line, " \t\r\n", &save); tok && n <= PT_MAX_STAGES;
	     tok = strtok_r(NULL, " \t\r\n", &save))
		urls[n++] = tok;
	if (n != o.world) {
		fprintf(stderr, "pt-stage: %d URLs for a world of %d\n", n, o.world);
		pt_comm_destroy(comm);
		return 1;
	}
	pt_err rv = pt_nng_comm_connect(comm, urls);
	if (rv == PT_OK)
		rv = pt_stage_host_run(comm, o.timeout_ms);
	if (rv != PT_OK)
		fprintf(stderr, "pt-stage %d: %s\n", o.rank, pt_last_error());
	pt_comm_destroy(comm);
	return rv == PT_OK ? 0 : 1;
}
