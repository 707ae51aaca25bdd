/* nccl_group.c - pt_nccl_comm_create_group: the NCCL communicators of ranks
 * that live in one process (threads), made together since creation is
 * collective. Built in every build: over the stub it reports its error. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl_comm.h"

typedef struct join {
	pt_comm **comm; /* in: the control communicator; out: the NCCL one on success */
	pt_device dev;
	int timeout_ms;
	bool started;
	pt_err rv;
	char why[512];
} join;

static void *join_rank(void *p)
{
	join *j = p;
	pt_comm *nc;
	j->rv = pt_nccl_comm_create(&nc, *j->comm, j->dev, j->timeout_ms);
	if (j->rv == PT_OK)
		*j->comm = nc;
	else
		snprintf(j->why, sizeof(j->why), "%s", pt_last_error());
	return NULL;
}

pt_err pt_nccl_comm_create_group(pt_comm **comms, const pt_device *devs, int n, int timeout_ms)
{
	join *j;
	pthread_t *th;
	int bad = -1;

	if (comms == NULL || devs == NULL || n <= 0)
		return pt_set_error(PT_ERR_INVALID, "pt_nccl_comm_create_group: no ranks");
	j = calloc((size_t)n, sizeof(*j));
	th = calloc((size_t)n, sizeof(*th));
	if (j == NULL || th == NULL) {
		free(j);
		free(th);
		return pt_set_error(PT_ERR_NOMEM, "NCCL communicators of %d ranks", n);
	}
	for (int i = 0; i < n; i++) {
		j[i] = (join){.comm = &comms[i], .dev = devs[i], .timeout_ms = timeout_ms};
		j[i].started = pthread_create(&th[i], NULL, join_rank, &j[i]) == 0;
		if (!j[i].started) {
			/* The ranks already started time out waiting for this one's hello. */
			j[i].rv = PT_ERR_NOMEM;
			snprintf(j[i].why, sizeof(j[i].why), "no thread for rank %d", i);
		}
	}
	for (int i = 0; i < n; i++) {
		if (j[i].started)
			pthread_join(th[i], NULL);
		if (j[i].rv != PT_OK && bad < 0)
			bad = i;
	}
	pt_err rv =
	    bad < 0 ? PT_OK
	            : pt_set_error(j[bad].rv, "NCCL communicator of rank %d: %s", bad, j[bad].why);
	free(j);
	free(th);
	return rv;
}
