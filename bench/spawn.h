/* spawn.h - starting a pipeserver for a benchmark. */
#ifndef PT_BENCH_SPAWN_H
#define PT_BENCH_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

/* bench_spawn runs argv (NULL-terminated; argv[0] a path) and reads the
 * `pipeserver listening on <url>` line it prints first into url (n bytes);
 * it exits the benchmark when that fails. Returns the child's pid. */
pid_t bench_spawn(const char *const *argv, char *url, size_t n);

/* bench_sibling writes "<directory of this program>/<rel>" into out. */
void bench_sibling(const char *rel, char *out, size_t n);

#endif
