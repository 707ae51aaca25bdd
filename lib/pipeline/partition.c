/* partition.c - contiguous layer-to-stage partitioning balancing FLOPs. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

static const char *const mode_names[] = {"sync", "semi-async", "async"};

const char *pt_pipe_mode_name(pt_pipe_mode mode)
{
	return (unsigned)mode <= PT_MODE_ASYNC ? mode_names[mode] : "unknown";
}

pt_err pt_pipe_mode_parse(const char *name, pt_pipe_mode *out)
{
	for (int i = 0; i <= PT_MODE_ASYNC; i++)
		if (strcmp(name, mode_names[i]) == 0) {
			*out = (pt_pipe_mode)i;
			return PT_OK;
		}
	return pt_set_error(PT_ERR_INVALID, "unknown mode \"%s\" (sync, semi-async or async)",
	                    name);
}

static const char *const schedule_names[PT_SCHED_COUNT] = {"", "gpipe", "1f1b", "zb-h1",
                                                           "interleaved"};

const char *pt_pipe_schedule_name(pt_pipe_schedule s)
{
	return (unsigned)s < PT_SCHED_COUNT ? schedule_names[s] : "unknown";
}

pt_err pt_pipe_schedule_parse(const char *name, pt_pipe_schedule *out)
{
	for (int i = 1; i < PT_SCHED_COUNT; i++)
		if (strcmp(name, schedule_names[i]) == 0) {
			*out = (pt_pipe_schedule)i;
			return PT_OK;
		}
	return pt_set_error(PT_ERR_INVALID,
	                    "unknown schedule \"%s\" (gpipe, 1f1b, zb-h1 or interleaved)", name);
}

pt_err pt_pipe_interleaved_order(int r, int p, int v, int m, pt_chunk_task *out)
{
	int pv = p * v, total = m * v, warm, n = 0;

	if (p < 1 || v < 1 || m < 1 || r < 1 || r > p)
		return pt_set_error(PT_ERR_INVALID, "interleaved order: rank %d of %d, v %d, m %d",
		                    r, p, v, m);
	if (p > 1 && m % p != 0)
		return pt_set_error(PT_ERR_INVALID,
		                    "interleaved: %d microbatches is not a multiple of %d stages",
		                    m, p);
	warm = (p - r) * 2 + (v - 1) * p;
	if (warm > total)
		warm = total;
#define CHUNK_TASK(k, bwd)                                                                         \
	(pt_chunk_task)                                                                            \
	{                                                                                          \
		.chunk = (int16_t)((bwd) ? v - 1 - ((k) % pv) / p : ((k) % pv) / p),               \
		.backward = (bwd), .mb = ((k) / pv) * p + (k) % p                                  \
	}
	for (int k = 0; k < warm; k++)
		out[n++] = CHUNK_TASK(k, false);
	for (int k = 0; k < total - warm; k++) {
		out[n++] = CHUNK_TASK(warm + k, false);
		out[n++] = CHUNK_TASK(k, true);
	}
	for (int k = total - warm; k < total; k++)
		out[n++] = CHUNK_TASK(k, true);
#undef CHUNK_TASK
	return PT_OK;
}

pt_err pt_pipe_interleaved_peak(int r, int p, int v, int m, int *rank_peak, int *chunk_peak)
{
	pt_chunk_task *order = calloc((size_t)(2 * m * v), sizeof(*order));
	int *live = calloc((size_t)v, sizeof(int)), held = 0;
	pt_err rv;

	*rank_peak = 0;
	if (order == NULL || live == NULL) {
		free(order);
		free(live);
		return pt_set_error(PT_ERR_NOMEM, "interleaved order");
	}
	if (chunk_peak)
		memset(chunk_peak, 0, sizeof(int) * (size_t)v);
	if ((rv = pt_pipe_interleaved_order(r, p, v, m, order)) == PT_OK)
		for (int k = 0; k < 2 * m * v; k++) {
			int c = order[k].chunk, d = order[k].backward ? -1 : 1;
			live[c] += d;
			held += d;
			if (held > *rank_peak)
				*rank_peak = held;
			if (chunk_peak && live[c] > chunk_peak[c])
				chunk_peak[c] = live[c];
		}
	free(order);
	free(live);
	return rv;
}

pt_err pt_pipe_interleaved_slots(int p, int v, int m, int *slots)
{
	*slots = 0;
	if (v < 1 || v > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_INVALID, "interleaved: %d chunks a rank", v);
	for (int r = 1; r <= p; r++) {
		int peak, chunks[PT_MAX_STAGES];
		PT_TRY(pt_pipe_interleaved_peak(r, p, v, m, &peak, chunks));
		for (int c = 0; c < v; c++)
			*slots = chunks[c] > *slots ? chunks[c] : *slots;
	}
	return PT_OK;
}

pt_err pt_partition_check(int n, int p, const int *first)
{
	if (p < 1 || p > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "stages: %d (1 to %d)", p, PT_MAX_STAGES);
	if (p > n)
		return pt_set_error(PT_ERR_RANGE, "stages: %d stages for %d layers", p, n);
	if (first[0] != 0 || first[p] != n)
		return pt_set_error(PT_ERR_INVALID,
		                    "stage boundaries must start at 0 and end at %d", n);
	for (int s = 0; s < p; s++)
		if (first[s + 1] <= first[s])
			return pt_set_error(PT_ERR_INVALID,
			                    "stage boundaries must increase: stage %d is empty",
			                    s + 1);
	return PT_OK;
}

pt_err pt_partition(const pt_layer_spec *layers, int n, pt_act_shape input, int p, int *first)
{
	double *cost, *prefix, *best;
	int *cut;
	pt_act_shape cur = input;
	pt_err rv = PT_OK;

	if (p < 1 || p > PT_MAX_STAGES)
		return pt_set_error(PT_ERR_RANGE, "stages: %d (1 to %d)", p, PT_MAX_STAGES);
	if (p > n)
		return pt_set_error(PT_ERR_RANGE, "stages: %d stages for %d layers", p, n);
	PT_TRY(pt_model_check(layers, n, input));
	cost = calloc((size_t)n, sizeof(double));
	prefix = calloc((size_t)n + 1, sizeof(double));
	best = calloc((size_t)(n + 1) * (size_t)(p + 1), sizeof(double));
	cut = calloc((size_t)(n + 1) * (size_t)(p + 1), sizeof(int));
	if (!cost || !prefix || !best || !cut) {
		rv = pt_set_error(PT_ERR_NOMEM, "partition tables");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		pt_act_shape next;
		cost[i] = pt_layer_flops(&layers[i], cur);
		pt_layer_vtable(layers[i].kind)->infer(&layers[i], cur, &next);
		cur = next;
		prefix[i + 1] = prefix[i] + cost[i];
	}
	/* best[k][j]: smallest possible max stage cost putting layers [0, j) in k stages. */
#define BEST(k, j) best[(size_t)(k) * (size_t)(n + 1) + (size_t)(j)]
#define CUT(k, j)  cut[(size_t)(k) * (size_t)(n + 1) + (size_t)(j)]
	for (int j = 0; j <= n; j++)
		BEST(1, j) = prefix[j];
	for (int k = 2; k <= p; k++)
		for (int j = k; j <= n; j++) {
			BEST(k, j) = DBL_MAX;
			for (int i = k - 1; i < j; i++) {
				double c = BEST(k - 1, i);
				double last = prefix[j] - prefix[i];
				c = c > last ? c : last;
				if (c < BEST(k, j)) {
					BEST(k, j) = c;
					CUT(k, j) = i;
				}
			}
		}
	first[p] = n;
	for (int k = p, j = n; k > 1; k--) {
		j = CUT(k, j);
		first[k - 1] = j;
	}
	first[0] = 0;
#undef BEST
#undef CUT
out:
	free(cost);
	free(prefix);
	free(best);
	free(cut);
	return rv;
}
