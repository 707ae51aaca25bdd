/* spawn.c - see spawn.h. */
#include "spawn.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

pid_t bench_spawn(const char *const *argv, char *url, size_t n)
{
	int p[2];
	pid_t pid;
	char line[512], fmt[64];
	FILE *f;

	if (pipe(p) != 0)
		exit(1);
	if ((pid = fork()) == 0) {
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	snprintf(fmt, sizeof(fmt), "pipeserver listening on %%%zus", n - 1);
	if ((f = fdopen(p[0], "r")) == NULL || fgets(line, sizeof(line), f) == NULL ||
	    sscanf(line, fmt, url) != 1) {
		fprintf(stderr, "%s did not start\n", argv[0]);
		exit(1);
	}
	fclose(f);
	return pid;
}

void bench_sibling(const char *rel, char *out, size_t n)
{
	char self[PATH_MAX];
	ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (k <= 0)
		exit(1);
	self[k] = '\0';
	if ((slash = strrchr(self, '/')) != NULL)
		*slash = '\0';
	snprintf(out, n, "%s/%s", self, rel);
}
