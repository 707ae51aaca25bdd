/* test_pipeline.c - stages and coordinator over the in-memory communicator:
 * the seed-003 walkthrough order, bitwise equality across stage counts and
 * modes, activation counts, async training, recomputation, fault handling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipe_fixture.h"
#include "fb_schema.h"
#include "wire.h"
#include "pt_test.h"
#include "runtime.h"
#include "train.h"

typedef struct rig {
	int p, m;
	pt_local_group *g;
	pt_comm *comms[PT_MAX_STAGES + 1];
	pt_stage *stages[PT_MAX_STAGES + 1];
	pt_coordinator *coord;
	pt_stage_turn *turns[PT_MAX_STAGES]; /* interleaved: one per rank */
} rig;

/* Stage options rig_up applies to every stage; rig_optim (when set) replaces
 * fx_optim() in the stages, the coordinator and run_trainer. */
static bool rig_graphs, rig_sync_sends;
static const pt_optim_config *rig_optim;
static pt_pipe_schedule rig_schedule; /* PT_SCHED_MODE: the mode's own */
static int rig_delay_ms;              /* every stage's task-delay hook */
static int rig_virtual;               /* interleaved: chunks per rank (p counts p * v stages) */
static pt_precision rig_precision;    /* every stage's precision */
/* rig_layers (when set, one stage only) replaces the fixture's MLP in the
 * stage and in run_trainer. */
static const pt_layer_spec *rig_layers;
static int rig_n_layers;

static void rig_up(rig *r, int p, int m, pt_pipe_mode mode, bool recompute, const int *bounds)
{
	pt_stage_config sc[PT_MAX_STAGES];
	pt_pipeline_config pc = fx_pipeline_config(p, m, mode);
	memset(r, 0, sizeof(*r));
	r->p = p;
	r->m = m;
	fx_stage_configs(sc, p, m, mode, recompute, bounds);
	for (int s = 0; s < p; s++) {
		sc[s].use_graphs = rig_graphs;
		sc[s].sync_sends = rig_sync_sends;
		sc[s].schedule = rig_schedule;
		sc[s].n_microbatches = m;
		sc[s].precision = rig_precision;
		if (rig_schedule == PT_SCHED_INTERLEAVED) {
			int ranks = p / rig_virtual, peak, chunks[PT_MAX_STAGES];
			if (s < ranks)
				PT_CHECK_OK(pt_stage_turn_create(&r->turns[s], s + 1, ranks,
				                                 rig_virtual, m));
			PT_CHECK_OK(pt_pipe_interleaved_peak(s % ranks + 1, ranks, rig_virtual, m,
			                                     &peak, chunks));
			sc[s].n_slots = chunks[s / ranks];
			sc[s].virtual_stages = rig_virtual;
		} else if (rig_schedule == PT_SCHED_ZBH1)
			sc[s].n_slots = p + 1;
		else if (rig_schedule == PT_SCHED_1F1B)
			sc[s].n_slots = p;
		if (rig_optim)
			sc[s].optim = *rig_optim;
		if (rig_layers) {
			sc[s].layers = rig_layers;
			sc[s].n_layers = sc[s].last = rig_n_layers;
		}
	}
	if (rig_schedule == PT_SCHED_INTERLEAVED)
		for (int s = 0; s < p; s++)
			sc[s].turn = r->turns[s % (p / rig_virtual)];
	if (rig_optim)
		pc.optim = *rig_optim;
	pc.schedule = rig_schedule;
	pc.virtual_stages = rig_virtual;
	PT_CHECK_OK(pt_local_group_create(&r->g, p + 1));
	for (int i = 0; i <= p; i++)
		PT_CHECK_OK(pt_local_comm_create(&r->comms[i], r->g, i));
	for (int s = 1; s <= p; s++) {
		PT_CHECK_OK(pt_stage_create(&r->stages[s], &sc[s - 1], r->comms[s]));
		pt_stage_set_task_delay(r->stages[s], rig_delay_ms);
		PT_CHECK_OK(pt_stage_start(r->stages[s]));
	}
	PT_CHECK_OK(pt_coordinator_create(&r->coord, &pc, r->comms[0]));
}

static void rig_down(rig *r)
{
	PT_CHECK_OK(pt_coordinator_stop(r->coord));
	for (int s = 1; s <= r->p; s++) {
		PT_CHECK_OK(pt_stage_join(r->stages[s]));
		pt_stage_destroy(r->stages[s]);
	}
	pt_coordinator_destroy(r->coord);
	for (int i = 0; i <= r->p; i++)
		pt_comm_destroy(r->comms[i]);
	pt_local_group_destroy(r->g);
	for (int i = 0; i < r->p; i++)
		pt_stage_turn_destroy(r->turns[i]);
}

static float *gather_params(rig *r, size_t *nbytes)
{
	return fx_gather_params(r->coord, r->p, nbytes);
}

static void test_pipeline_partition(void)
{
	int first[5];
	pt_layer_spec gpt[6] = {pt_embedding(256, 64, 32), pt_block(64, 4),  pt_block(64, 4),
	                        pt_block(64, 4),           pt_layernorm(64), pt_linear(64, 256)};
	pt_act_shape tok = {PT_I64, 32, 0};
	PT_CHECK_OK(pt_partition(fx_digits_mlp, FX_N_LAYERS, fx_digits_in, 2, first));
	CU_ASSERT_EQUAL(first[0], 0);
	CU_ASSERT_EQUAL(first[2], FX_N_LAYERS);
	/* The three blocks dominate: each stage of 3 gets one. */
	PT_CHECK_OK(pt_partition(gpt, 6, tok, 3, first));
	CU_ASSERT_EQUAL(first[1], 2);
	CU_ASSERT_EQUAL(first[2], 3);
	CU_ASSERT_EQUAL(first[3], 6);
	PT_CHECK_ERR_MSG(pt_partition(fx_digits_mlp, FX_N_LAYERS, fx_digits_in, 6, first),
	                 PT_ERR_RANGE, "6 stages for 5 layers");
	PT_CHECK_ERR(pt_partition_check(5, 2, (int[]){0, 0, 5}), PT_ERR_INVALID);
	PT_CHECK_OK(pt_partition_check(5, 2, (int[]){0, 3, 5}));
}

/* Seed 003: 4 stages, 4 microbatches, sync. Each stage forwards 1..4 in order
 * then backwards them in order; a stage forwards k only after the previous
 * stage finished forwarding k, and backwards k only after the next stage
 * finished backwarding k. */
static void test_pipeline_seed_walkthrough_order(void)
{
	rig r;
	fx_data d;
	pt_pipe_step_result res;
	const pt_task_record *t[5];
	int n[5];
	rig_up(&r, 4, 4, PT_MODE_SYNC, false, (int[]){0, 1, 2, 4, 5});
	fx_data_up(&d, 4);
	fx_data_next(&d, 0);
	PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 0, &res));
	for (int s = 1; s <= 4; s++) {
		t[s] = pt_coordinator_step_timeline(r.coord, s, &n[s]);
		CU_ASSERT_EQUAL_FATAL(n[s], 9); /* F0..F3, B0..B3, the optimizer step */
		for (int k = 0; k < 4; k++) {
			CU_ASSERT_EQUAL(t[s][k].kind, PT_TASK_FORWARD);
			CU_ASSERT_EQUAL(t[s][k].microbatch, k);
			CU_ASSERT_EQUAL(t[s][4 + k].kind, PT_TASK_BACKWARD);
			CU_ASSERT_EQUAL(t[s][4 + k].microbatch, k);
		}
		CU_ASSERT_EQUAL(t[s][8].kind, PT_TASK_STEP);
	}
	for (int s = 2; s <= 4; s++)
		for (int k = 0; k < 4; k++) {
			CU_ASSERT(t[s][k].start >= t[s - 1][k].end); /* forward flows down */
			CU_ASSERT(t[s - 1][4 + k].start >= t[s][4 + k].end); /* backward flows up */
		}
	CU_ASSERT(res.bubble > 0.0 && res.bubble < 1.0);
	for (int s = 1; s <= 4; s++)
		CU_ASSERT(res.stage_busy[s - 1] > 0.0);
	rig_down(&r);
	fx_data_down(&d);
}

/* Each sync step brings every stage's communicator counters with its
 * timeline: exact message counts (per step a stage receives m forwards, m
 * backwards and the SQNORM, STEP and TIMELINE commands, and sends 2m
 * messages and 2 replies, plus the previous step's timeline reply), and the
 * same as the stage's own communicator says, less the reply they came in.
 * Async steps fetch no timeline, so they bring none. */
static void test_pipeline_step_reports_stage_comm_stats(void)
{
	const int p = 3, m = 4;
	rig r;
	fx_data d;
	pt_pipe_step_result res;

	rig_up(&r, p, m, PT_MODE_SYNC, false, NULL);
	fx_data_up(&d, m);
	for (int64_t k = 0; k < 2; k++) {
		fx_data_next(&d, k);
		PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, k, &res));
		for (int s = 1; s <= p; s++) {
			const pt_comm_stats *got = &res.stage_comm[s - 1];
			pt_comm_stats own = pt_comm_get_stats(r.comms[s]);
			CU_ASSERT_TRUE(res.has_stage_comm[s - 1]);
			CU_ASSERT_EQUAL(got->msgs_recv, (uint64_t)((k + 1) * (2 * m + 3)));
			CU_ASSERT_EQUAL(got->msgs_sent, (uint64_t)((k + 1) * (2 * m + 2) + k));
			CU_ASSERT_EQUAL(got->msgs_recv, own.msgs_recv);
			CU_ASSERT_EQUAL(got->bytes_recv, own.bytes_recv);
			CU_ASSERT_EQUAL(got->msgs_sent + 1, own.msgs_sent);
			CU_ASSERT(got->bytes_sent > 0 && got->bytes_sent < own.bytes_sent);
			CU_ASSERT_EQUAL(got->errors, 0);
		}
	}
	rig_down(&r);
	fx_data_down(&d);

	rig_up(&r, p, m, PT_MODE_ASYNC, false, NULL);
	fx_data_up(&d, m);
	fx_data_next(&d, 0);
	PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 0, &res));
	for (int s = 1; s <= p; s++)
		CU_ASSERT_FALSE(res.has_stage_comm[s - 1]);
	PT_CHECK_OK(pt_coordinator_drain(r.coord, &res));
	rig_down(&r);
	fx_data_down(&d);
}

typedef struct run {
	double loss[32];
	double norm[32];
	float *params; /* after the last step */
	size_t nbytes;
	int peak_live[PT_MAX_STAGES];
	int graphs[PT_MAX_STAGES]; /* captured graphs per stage */
	size_t dpred_bytes;        /* the coordinator's own loss-gradient buffers */
} run;

static void run_pipeline(int p, int m, pt_pipe_mode mode, bool recompute, int steps, run *out)
{
	rig r;
	fx_data d;
	memset(out, 0, sizeof(*out));
	rig_up(&r, p, m, mode, recompute, NULL);
	fx_data_up(&d, m);
	for (int st = 0; st < steps; st++) {
		pt_pipe_step_result res;
		fx_data_next(&d, st);
		PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, st, &res));
		out->loss[st] = res.loss;
		out->norm[st] = res.grad_norm;
	}
	out->params = gather_params(&r, &out->nbytes);
	out->dpred_bytes = pt_coordinator_dpred_bytes(r.coord);
	for (int s = 1; s <= p; s++) {
		pt_stage_stats ss;
		PT_CHECK_OK(pt_coordinator_stage_stats(r.coord, s, &ss));
		out->peak_live[s - 1] = ss.peak_live;
		out->graphs[s - 1] = pt_stage_graphs_captured(r.stages[s]);
	}
	rig_down(&r);
	fx_data_down(&d);
}

static bool same_run(const run *a, const run *b, int steps)
{
	for (int i = 0; i < steps; i++)
		if (a->loss[i] != b->loss[i] || a->norm[i] != b->norm[i])
			printf("\n    step %d: loss %.17g vs %.17g, norm %.17g vs %.17g", i,
			       a->loss[i], b->loss[i], a->norm[i], b->norm[i]);
	return a->nbytes == b->nbytes && memcmp(a->params, b->params, a->nbytes) == 0 &&
	       memcmp(a->loss, b->loss, sizeof(double) * (size_t)steps) == 0 &&
	       memcmp(a->norm, b->norm, sizeof(double) * (size_t)steps) == 0;
}

static bool trainer_graphs; /* run_trainer: with the trainer's graphs */

/* The in-process trainer on the same batches: the reference. */
static void run_trainer(int m, int steps, run *out)
{
	pt_model_config cfg = {.batch = FX_MB, .input = fx_digits_in, .n_slots = 1, .seed = 42};
	pt_optim_config oc = rig_optim ? *rig_optim : fx_optim();
	pt_model *mdl;
	pt_optimizer *o;
	pt_trainer *t;
	fx_data d;
	memset(out, 0, sizeof(*out));
	pt_set_num_threads(1);
	if (rig_layers)
		PT_CHECK_OK(pt_model_create(&mdl, rig_layers, rig_n_layers, 0, rig_n_layers, &cfg));
	else
		PT_CHECK_OK(
		    pt_model_create(&mdl, fx_digits_mlp, FX_N_LAYERS, 0, FX_N_LAYERS, &cfg));
	PT_CHECK_OK(pt_optimizer_create(&o, &oc, pt_model_params(mdl), pt_model_grads(mdl)));
	PT_CHECK_OK(pt_trainer_create(&t, mdl, o, PT_LOSS_CROSS_ENTROPY, -1));
	PT_CHECK_OK(pt_trainer_set_graphs(t, trainer_graphs, -1));
	fx_data_up(&d, m);
	for (int st = 0; st < steps; st++) {
		pt_step_result res;
		fx_data_next(&d, st);
		PT_CHECK_OK(pt_trainer_step(t, &d.x, &d.y, m, (uint64_t)st, &res));
		out->loss[st] = res.loss;
		out->norm[st] = res.grad_norm;
	}
	out->nbytes = pt_tensor_nbytes(pt_model_params(mdl));
	out->params = malloc(out->nbytes);
	memcpy(out->params, pt_tensor_data(pt_model_params(mdl)), out->nbytes);
	fx_data_down(&d);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(mdl);
}

static void test_pipeline_sync_bitwise_across_stage_counts(void)
{
	enum { STEPS = 20, M = 4 };
	run ref, r1, r2, r4;
	run_trainer(M, STEPS, &ref);
	run_pipeline(1, M, PT_MODE_SYNC, false, STEPS, &r1);
	run_pipeline(2, M, PT_MODE_SYNC, false, STEPS, &r2);
	run_pipeline(4, M, PT_MODE_SYNC, false, STEPS, &r4);
	CU_ASSERT(ref.loss[STEPS - 1] < ref.loss[0]);
	CU_ASSERT(same_run(&ref, &r1, STEPS));
	CU_ASSERT(same_run(&r1, &r2, STEPS));
	CU_ASSERT(same_run(&r1, &r4, STEPS));
	/* The last stage's Linear output took its loss gradient in place. */
	CU_ASSERT_EQUAL(r1.dpred_bytes, 0);
	CU_ASSERT_EQUAL(r4.dpred_bytes, 0);
	free(ref.params);
	free(r1.params);
	free(r2.params);
	free(r4.params);
}

static void test_pipeline_semi_async_equals_sync_with_fewer_activations(void)
{
	enum { STEPS = 6, M = 8, P = 4 };
	run sync, semi;
	for (int steps = 1; steps <= STEPS; steps += STEPS - 1) {
		/* after the first step and after the last */
		run_pipeline(P, M, PT_MODE_SYNC, false, steps, &sync);
		run_pipeline(P, M, PT_MODE_SEMI_ASYNC, false, steps, &semi);
		CU_ASSERT(same_run(&sync, &semi, steps));
		for (int s = 0; s < P; s++) {
			CU_ASSERT_EQUAL(sync.peak_live[s], M);
			CU_ASSERT(semi.peak_live[s] <= P);
			CU_ASSERT(semi.peak_live[s] >= 1);
		}
		free(sync.params);
		free(semi.params);
	}
}

/* two_steps brings up a rig of p one-layer-ish stages (the fixture MLP at
 * boundaries 0,1,2,3,5) with the schedule and trains two steps. */
static void two_steps(rig *r, fx_data *d, pt_pipe_schedule sc, int p, int m)
{
	rig_schedule = sc;
	rig_up(r, p, m, PT_MODE_SYNC, false, (int[]){0, 1, 2, 3, 5});
	for (int64_t k = 0; k < 2; k++) {
		pt_pipe_step_result res;
		fx_data_next(d, k);
		PT_CHECK_OK(pt_coordinator_step(r->coord, &d->x, &d->y, k, &res));
		if (getenv("PT_DEBUG"))
			printf("\n DEBUG sched %d step %ld loss %.17g norm %.17g", sc, (long)k,
			       res.loss, res.grad_norm);
	}
}

/* timeline_order writes a stage's tasks of one step as "F0 F1 B0 W0 ...". */
static void timeline_order(const pt_task_record *t, int n, char *buf, size_t cap)
{
	static const char kinds[] = "FBSW";
	size_t o = 0;
	buf[0] = '\0';
	for (int i = 0; i < n && o < cap; i++)
		if (t[i].kind != PT_TASK_STEP)
			o += (size_t)snprintf(buf + o, cap - o, "%s%c%d", o ? " " : "",
			                      kinds[t[i].kind], t[i].microbatch);
}

/* peaks gives, from a stage's timeline, the most microbatches held at once
 * between F and B (activations) and between F and the end of their W
 * (activations or a weight stash); the W's end it for split backwards. */
static void peaks(const pt_task_record *t, int n, bool split, int *act, int *held)
{
	int a = 0, h = 0;
	*act = *held = 0;
	for (int i = 0; i < n; i++) {
		if (t[i].kind == PT_TASK_FORWARD)
			a++, h++;
		else if (t[i].kind == PT_TASK_BACKWARD)
			a--, h -= split ? 0 : 1;
		else if (t[i].kind == PT_TASK_WEIGHT)
			h--;
		*act = a > *act ? a : *act;
		*held = h > *held ? h : *held;
	}
}

/* ZB-H1 on p = 4 stages, m = 8 microbatches: each stage runs the order the
 * schedule defines (stage r: p - r + 1 forwards, then B and F alternate, a
 * W after a B when more than r - 1 wait, the rest after the last B), the
 * microbatches held between F and B (all of their activations) are
 * p - r + 1 on stage r, 1F1B's exactly, and those held until their W (a weight
 * stash: each parameterised layer's input and output gradient) at most
 * p, r - 1 more than between F and B. Sleep-based work (the task-delay hook,
 * 5 ms a unit) makes the order independent of the machine; the bubble
 * figures are pipe-bench's. */
static void test_pipeline_zbh1_order_and_memory(void)
{
	enum { P = 4, M = 8 };
	static const char *const want[P] = {
	    "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7",
	    "F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7",
	    "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7",
	    "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"};
	int act_1f1b[P + 1], act[P + 1], held[P + 1], dummy;
	char got[512];
	fx_data d;
	rig r;

	fx_data_up(&d, M);
	rig_delay_ms = 5;
	two_steps(&r, &d, PT_SCHED_1F1B, P, M);
	for (int s = 1; s <= P; s++) {
		int n;
		const pt_task_record *t = pt_coordinator_step_timeline(r.coord, s, &n);
		peaks(t, n, false, &act_1f1b[s], &dummy);
	}
	rig_down(&r);

	two_steps(&r, &d, PT_SCHED_ZBH1, P, M);
	for (int s = 1; s <= P; s++) {
		int n;
		const pt_task_record *t = pt_coordinator_step_timeline(r.coord, s, &n);
		const char *w = want[s - 1] ? want[s - 1] : "";
		timeline_order(t, n, got, sizeof(got));
		if (strcmp(got, w) != 0)
			printf("\n    stage %d: %s\n    wanted:  %s", s, got, w);
		CU_ASSERT_STRING_EQUAL(got, w);
		peaks(t, n, true, &act[s], &held[s]);
		CU_ASSERT_EQUAL(act[s], act_1f1b[s]);
		CU_ASSERT_EQUAL(act[s], P - s + 1);
		CU_ASSERT(held[s] <= P && held[s] <= act[s] + s - 1);
		printf("\n    stage %d: held between F and B: 1f1b %d, zb-h1 %d; until W: zb-h1 %d",
		       s, act_1f1b[s], act[s], held[s]);
	}
	rig_down(&r);
	rig_schedule = PT_SCHED_MODE;
	rig_delay_ms = 0;
	fx_data_down(&d);
}

/* Megatron-LM's interleaved order (pt_pipe_interleaved_order) for p = 4,
 * v = 2, m = 8, and what it holds: rank r keeps at most
 * (p - r) * 2 + (v - 1) * p + 1 chunk microbatches between forward and
 * backward, each 1/v of its stage's activations: 11/2 = 5.5 microbatches'
 * worth on rank 1 against 1F1B's p = 4, i.e. p (1 + (p - 1) / (p v)) as the
 * paper states (Narayanan et al., SC'21, section 2.2.2 and its memory
 * discussion). Then a real run, p = 2 ranks of v = 2 chunks on the fixture
 * MLP (4 stages), sleep-based tasks: each rank runs exactly its order (its
 * chunks' timelines merged by start time), one task at a time, and each
 * chunk holds what the order says; the weights equal GPipe's bitwise. */
static void test_pipeline_interleaved_order_and_memory(void)
{
	enum { P = 4, V = 2, M = 8 };
	pt_chunk_task o[2 * M * V];
	char got[1024], want[1024];
	fx_data d;
	rig r;

	/* Rank 1: 10 forwards (chunk 0 mb 0-3, chunk 1 mb 0-3, chunk 0 mb 4-5),
	 * then F and B alternate; its first backward is chunk 1's microbatch 0. */
	PT_CHECK_OK(pt_pipe_interleaved_order(1, P, V, M, o));
	CU_ASSERT(o[0].chunk == 0 && !o[0].backward && o[0].mb == 0);
	CU_ASSERT(o[4].chunk == 1 && !o[4].backward && o[4].mb == 0);
	CU_ASSERT(o[8].chunk == 0 && !o[8].backward && o[8].mb == 4);
	CU_ASSERT(o[10].chunk == 0 && !o[10].backward && o[10].mb == 6);
	CU_ASSERT(o[11].chunk == 1 && o[11].backward && o[11].mb == 0);
	CU_ASSERT(o[2 * M * V - 1].chunk == 0 && o[2 * M * V - 1].backward &&
	          o[2 * M * V - 1].mb == 7);
	int most = 0, slots;
	for (int rk = 1; rk <= P; rk++) {
		int peak, chunks[V], f = 0, b = 0;
		PT_CHECK_OK(pt_pipe_interleaved_order(rk, P, V, M, o));
		for (int k = 0; k < 2 * M * V; k++)
			o[k].backward ? b++ : f++;
		CU_ASSERT(f == M * V && b == M * V);
		PT_CHECK_OK(pt_pipe_interleaved_peak(rk, P, V, M, &peak, chunks));
		CU_ASSERT_EQUAL(peak, (P - rk) * 2 + (V - 1) * P + 1);
		for (int c = 0; c < V; c++)
			most = chunks[c] > most ? chunks[c] : most;
		printf("\n    rank %d of %d: holds %d chunk microbatches (%.1f stage microbatches; "
		       "1f1b %d)",
		       rk, P, peak, (double)peak / V, P - rk + 1);
	}
	PT_CHECK_OK(pt_pipe_interleaved_slots(P, V, M, &slots));
	CU_ASSERT_EQUAL(slots, most); /* the slots each chunk stage gets */
	PT_CHECK_ERR_MSG(pt_pipe_interleaved_order(1, 4, 2, 6, o), PT_ERR_INVALID,
	                 "not a multiple of 4 stages");

	fx_data_up(&d, 4);
	rig_delay_ms = 5;
	rig_virtual = 2;
	two_steps(&r, &d, PT_SCHED_INTERLEAVED, 4, 4);
	for (int rk = 1; rk <= 2; rk++) {
		const pt_task_record *t[2];
		int n[2], i[2] = {0, 0}, peak, chunks[2], act;
		size_t go = 0, wo = 0;
		double last_end = 0;
		for (int c = 0; c < 2; c++)
			t[c] = pt_coordinator_step_timeline(r.coord, c * 2 + rk, &n[c]);
		PT_CHECK_OK(pt_pipe_interleaved_order(rk, 2, 2, 4, o));
		for (int k = 0; k < 16; k++)
			wo += (size_t)snprintf(want + wo, sizeof(want) - wo, "%s%c%d.%d",
			                       k ? " " : "", o[k].backward ? 'B' : 'F', o[k].mb,
			                       o[k].chunk);
		/* Merge the chunks' tasks by start time (steps are not tasks here). */
		for (;;) {
			int c = -1;
			for (int k = 0; k < 2; k++) {
				while (i[k] < n[k] && t[k][i[k]].kind == PT_TASK_STEP)
					i[k]++;
				if (i[k] < n[k] && (c < 0 || t[k][i[k]].start < t[c][i[c]].start))
					c = k;
			}
			if (c < 0)
				break;
			const pt_task_record *x = &t[c][i[c]++];
			CU_ASSERT(x->start >= last_end); /* one task at a time on a rank */
			last_end = x->end;
			go += (size_t)snprintf(
			    got + go, sizeof(got) - go, "%s%c%d.%d", go ? " " : "",
			    x->kind == PT_TASK_BACKWARD ? 'B' : 'F', x->microbatch, c);
		}
		if (strcmp(got, want) != 0)
			printf("\n    rank %d: %s\n    wanted: %s", rk, got, want);
		CU_ASSERT_STRING_EQUAL(got, want);
		PT_CHECK_OK(pt_pipe_interleaved_peak(rk, 2, 2, 4, &peak, chunks));
		for (int c = 0; c < 2; c++) {
			int dummy;
			peaks(t[c], n[c], false, &act, &dummy);
			CU_ASSERT_EQUAL(act, chunks[c]);
		}
	}
	size_t nb;
	float *got_params = gather_params(&r, &nb);
	rig_down(&r);
	rig_virtual = 0;
	fx_data_down(&d); /* the same two batches again */
	fx_data_up(&d, 4);
	two_steps(&r, &d, PT_SCHED_GPIPE, 4, 4);
	size_t nb2;
	float *ref_params = gather_params(&r, &nb2);
	CU_ASSERT(nb == nb2 && memcmp(got_params, ref_params, nb) == 0);
	free(got_params);
	free(ref_params);
	rig_down(&r);
	rig_schedule = PT_SCHED_MODE;
	rig_delay_ms = 0;
	fx_data_down(&d);
}

/* precision bf16: what stage 1 sends stage 2 (activations) travels as
 * bf16: its bytes sent over two steps are about half fp32's (the same
 * replies and DONEs ride along); the losses differ from fp32's and stay
 * finite. */
static void test_pipeline_bf16_wire(void)
{
	uint64_t bytes[2];
	double loss[2];
	fx_data d;
	rig r;

	for (int k = 0; k < 2; k++) {
		pt_pipe_step_result res;
		rig_precision = k ? PT_PREC_BF16 : PT_PREC_FP32;
		fx_data_up(&d, 4);
		rig_up(&r, 2, 4, PT_MODE_SYNC, false, NULL);
		for (int64_t st = 0; st < 2; st++) {
			fx_data_next(&d, st);
			PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, st, &res));
		}
		CU_ASSERT_FATAL(res.has_stage_comm[0]);
		bytes[k] = res.stage_comm[0].bytes_sent;
		loss[k] = res.loss;
		rig_down(&r);
		fx_data_down(&d);
	}
	rig_precision = PT_PREC_FP32;
	double ratio = (double)bytes[1] / (double)bytes[0];
	printf("\n    stage 1 bytes sent: fp32 %llu, bf16 %llu (%.3f); loss fp32 %.6f bf16 %.6f",
	       (unsigned long long)bytes[0], (unsigned long long)bytes[1], ratio, loss[0], loss[1]);
	CU_ASSERT(ratio > 0.45 && ratio < 0.6);
	CU_ASSERT(isfinite(loss[1]) && loss[0] != loss[1] && fabs(loss[1] - loss[0]) < 0.05);
}

/* Where the last layer's backward reads its output (tanh: 1 - y^2) the loss
 * gradient goes to a buffer of the coordinator's own, not over the output;
 * after a Linear it overwrites the output. Both equal the trainer bitwise. */
static void test_pipeline_loss_gradient_overwrites_only_a_dead_output(void)
{
	enum { STEPS = 4, M = 2 };
	pt_layer_spec tanh_last[FX_N_LAYERS + 1];
	run ref, pipe;
	memcpy(tanh_last, fx_digits_mlp, sizeof(fx_digits_mlp));
	tanh_last[FX_N_LAYERS] = (pt_layer_spec){.kind = PT_LAYER_TANH};
	for (int k = 0; k < 2; k++) {
		rig_layers = k ? tanh_last : fx_digits_mlp;
		rig_n_layers = k ? FX_N_LAYERS + 1 : FX_N_LAYERS;
		run_trainer(M, STEPS, &ref);
		run_pipeline(1, M, PT_MODE_SYNC, false, STEPS, &pipe);
		CU_ASSERT(same_run(&ref, &pipe, STEPS));
		/* tanh: one buffer per microbatch in flight, 16 x 10 floats each */
		CU_ASSERT_EQUAL(pipe.dpred_bytes, k ? (size_t)M * FX_MB * 10 * 4 : 0);
		free(ref.params);
		free(pipe.params);
	}
	rig_layers = NULL;
	rig_n_layers = 0;
}

static void test_pipeline_recompute_is_bitwise_equal(void)
{
	enum { STEPS = 5, M = 4 };
	run plain, re;
	run_pipeline(2, M, PT_MODE_SEMI_ASYNC, false, STEPS, &plain);
	run_pipeline(2, M, PT_MODE_SEMI_ASYNC, true, STEPS, &re);
	CU_ASSERT(same_run(&plain, &re, STEPS));
	CU_ASSERT_EQUAL(re.dpred_bytes, 0); /* the output's copy is the coordinator's */
	free(plain.params);
	free(re.params);
}

/* Graphs (use_graphs) and synchronous sends change nothing: AdamW with
 * clipping, so the optimizer graph reads a new step and grad scale each
 * step. In sync mode every slot runs once a step, so after 3 warm-ups and a
 * capture each stage replays all 2 m + 1 of its graphs. */
static void test_pipeline_graphs_and_sync_sends_are_bitwise(void)
{
	enum { STEPS = 12, M = 4 };
	static const int stages[] = {1, 2, 4};
	run ref, r;
	run_trainer(M, STEPS, &ref);
	trainer_graphs = true;
	run_trainer(M, STEPS, &r);
	trainer_graphs = false;
	CU_ASSERT(same_run(&ref, &r, STEPS));
	free(r.params);
	rig_graphs = true;
	for (int k = 0; k < 3; k++) {
		run_pipeline(stages[k], M, PT_MODE_SYNC, false, STEPS, &r);
		CU_ASSERT(same_run(&ref, &r, STEPS));
		for (int s = 0; s < stages[k]; s++)
			CU_ASSERT_EQUAL(r.graphs[s], 2 * M + 1);
		free(r.params);
	}
	run_pipeline(2, M, PT_MODE_SEMI_ASYNC, false, STEPS, &r);
	CU_ASSERT(same_run(&ref, &r, STEPS));
	CU_ASSERT(r.graphs[0] > 0 && r.graphs[1] > 0);
	free(r.params);
	run_pipeline(2, M, PT_MODE_SYNC, true, STEPS, &r);
	CU_ASSERT(same_run(&ref, &r, STEPS));
	free(r.params);
	rig_graphs = false;
	rig_sync_sends = true;
	run_pipeline(2, M, PT_MODE_SEMI_ASYNC, false, STEPS, &r);
	rig_sync_sends = false;
	CU_ASSERT(same_run(&ref, &r, STEPS));
	free(r.params);
	free(ref.params);
}

/* The same with SGD (momentum, a warm-up cosine schedule, clipping): the
 * optimizer graph reads lr, grad scale and first_step at run time. */
static void test_pipeline_graphs_sgd_is_bitwise(void)
{
	enum { STEPS = 12, M = 4 };
	pt_optim_config oc = pt_optim_defaults(PT_OPTIM_SGD, 0.05f);
	run ref, r;
	oc.momentum = 0.9f;
	oc.clip_norm = 0.2f;
	oc.schedule = (pt_schedule){PT_SCHED_WARMUP_COSINE, 3, STEPS, 0.0f};
	rig_optim = &oc;
	run_trainer(M, STEPS, &ref);
	trainer_graphs = true;
	run_trainer(M, STEPS, &r);
	trainer_graphs = false;
	CU_ASSERT(same_run(&ref, &r, STEPS));
	free(r.params);
	rig_graphs = true;
	run_pipeline(2, M, PT_MODE_SYNC, false, STEPS, &r);
	rig_graphs = false;
	CU_ASSERT(same_run(&ref, &r, STEPS));
	CU_ASSERT(r.graphs[0] == 2 * M + 1 && r.graphs[1] == 2 * M + 1);
	free(r.params);
	free(ref.params);
	rig_optim = NULL;
}

/* A send that fails on a stage's send stream (here: the next stage's
 * communicator is closed) ends the step with an error naming the stage, what
 * it sent, the step and the microbatch. */
static void test_pipeline_failed_async_send_is_reported(void)
{
	rig r;
	fx_data d;
	pt_pipe_step_result res;
	rig_up(&r, 2, 2, PT_MODE_SYNC, false, NULL);
	fx_data_up(&d, 2);
	fx_data_next(&d, 0);
	pt_comm_close(r.comms[2]); /* stage 2 leaves its loop */
	PT_CHECK_OK(pt_stage_join(r.stages[2]));
	PT_CHECK_ERR_MSG(pt_coordinator_step(r.coord, &d.x, &d.y, 0, &res), PT_ERR_CLOSED,
	                 "stage 1: sending activation of step 0 microbatch 0 to rank 2");
	pt_coordinator_stop(r.coord); /* stage 2 cannot answer */
	pt_comm_close(r.comms[1]);
	PT_CHECK_OK(pt_stage_join(r.stages[1]));
	for (int s = 1; s <= 2; s++)
		pt_stage_destroy(r.stages[s]);
	pt_coordinator_destroy(r.coord);
	for (int i = 0; i <= 2; i++)
		pt_comm_destroy(r.comms[i]);
	pt_local_group_destroy(r.g);
	fx_data_down(&d);
}

/* Held-out accuracy of parameters gathered from the stages. */
static double accuracy_of(const float *params, size_t nbytes)
{
	pt_model_config cfg = {.batch = FX_MB, .input = fx_digits_in, .n_slots = 1, .seed = 1};
	pt_optim_config oc = fx_optim();
	pt_model *mdl;
	pt_optimizer *o;
	pt_trainer *t;
	pt_tensor xe, ye;
	fx_data d;
	double loss, acc = 0.0;
	PT_CHECK_OK(pt_model_create(&mdl, fx_digits_mlp, FX_N_LAYERS, 0, FX_N_LAYERS, &cfg));
	CU_ASSERT_EQUAL_FATAL(pt_tensor_nbytes(pt_model_params(mdl)), nbytes);
	memcpy(pt_tensor_data(pt_model_params(mdl)), params, nbytes);
	PT_CHECK_OK(pt_optimizer_create(&o, &oc, pt_model_params(mdl), pt_model_grads(mdl)));
	PT_CHECK_OK(pt_trainer_create(&t, mdl, o, PT_LOSS_CROSS_ENTROPY, -1));
	fx_data_up(&d, 1);
	int64_t n = d.held.n / FX_MB * FX_MB;
	PT_CHECK_OK(pt_tensor_narrow(&xe, &d.held.x, 0, 0, n));
	PT_CHECK_OK(pt_tensor_narrow(&ye, &d.held.y, 0, 0, n));
	PT_CHECK_OK(pt_trainer_evaluate(t, &xe, &ye, &loss, &acc));
	pt_tensor_fini(&xe);
	pt_tensor_fini(&ye);
	fx_data_down(&d);
	pt_trainer_destroy(t);
	pt_optimizer_destroy(o);
	pt_model_destroy(mdl);
	return acc;
}

static void test_pipeline_async_trains_digits_with_staleness(void)
{
	enum { P = 4, M = 4, STEPS = 300 };
	rig r;
	fx_data d;
	pt_pipe_step_result res;
	size_t nbytes;
	int64_t stale = 0, updates = 0;
	rig_up(&r, P, M, PT_MODE_ASYNC, false, NULL);
	fx_data_up(&d, M);
	for (int st = 0; st < STEPS; st++) {
		fx_data_next(&d, st);
		PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, st, &res));
	}
	PT_CHECK_OK(pt_coordinator_drain(r.coord, &res));
	for (int s = 1; s <= P; s++) {
		pt_stage_stats ss;
		PT_CHECK_OK(pt_coordinator_stage_stats(r.coord, s, &ss));
		CU_ASSERT_EQUAL(ss.updates, (int64_t)STEPS * M);
		CU_ASSERT(ss.peak_live <= P);
		stale += ss.staleness_sum;
		updates += ss.updates;
	}
	float *params = gather_params(&r, &nbytes);
	double acc = accuracy_of(params, nbytes);
	printf("\n    async: held-out accuracy %.2f %%, mean staleness %.2f updates\n", 100 * acc,
	       (double)stale / (double)updates);
	CU_ASSERT(acc >= 0.94);
	CU_ASSERT(stale > 0);
	free(params);
	rig_down(&r);
	fx_data_down(&d);
}

static void test_pipeline_op_error_ends_step_and_recovers(void)
{
	rig r;
	fx_data d;
	pt_pipe_step_result res;
	rig_up(&r, 4, 4, PT_MODE_SYNC, false, (int[]){0, 1, 2, 4, 5});
	fx_data_up(&d, 4);
	pt_stage_fail_forward_at(r.stages[3], 2);
	fx_data_next(&d, 0);
	PT_CHECK_ERR(pt_coordinator_step(r.coord, &d.x, &d.y, 7, &res), PT_ERR_BACKEND);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "stage 3"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "step 7"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "microbatch 2"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "injected"));
	/* The stages were reset: the next step runs normally. */
	PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 8, &res));
	CU_ASSERT(isfinite(res.loss));
	rig_down(&r);
	fx_data_down(&d);
}

/* Interleaved (2 ranks of 2 chunks; stage 2 is a ReLU, which the failure
 * hook, an op of a Linear, cannot fail): a failed forward on stage 1, 3 or
 * 4, at microbatch 0, 1 or 3, ends the step with an error
 * within a second - the failure's, or the report of the chunk that then
 * receives the next microbatch out of order (it reports it instead of
 * waiting for a turn that never comes) -; every chunk takes its RESET, the
 * next step runs, and the stages stop and join. Before the out-of-order
 * check, two chunks of a rank waited for each other for good. */
static void test_pipeline_interleaved_failure_recovers(void)
{
	for (int fs = 1; fs <= 4; fs += fs == 1 ? 2 : 1)
		for (int fm = 0; fm < 4; fm += fm == 1 ? 2 : 1) {
			rig r;
			fx_data d;
			pt_pipe_step_result res;
			pt_stage_stats ss;
			double t0;
			rig_virtual = 2;
			rig_schedule = PT_SCHED_INTERLEAVED;
			rig_up(&r, 4, 4, PT_MODE_SYNC, false, (int[]){0, 1, 2, 3, 5});
			fx_data_up(&d, 4);
			fx_data_next(&d, 0);
			PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 0, &res));
			pt_stage_fail_forward_at(r.stages[fs], fm);
			fx_data_next(&d, 1);
			t0 = pt_now();
			/* The failure, or the next stage's report of the skipped
			 * microbatch, whichever reaches the coordinator first. */
			CU_ASSERT_NOT_EQUAL(pt_coordinator_step(r.coord, &d.x, &d.y, 1, &res),
			                    PT_OK);
			CU_ASSERT(strstr(pt_last_error(), "injected") != NULL ||
			          strstr(pt_last_error(), "where the interleaved order expects") !=
			              NULL);
			CU_ASSERT(pt_now() - t0 < 1.0);
			t0 = pt_now();
			PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 2, &res));
			CU_ASSERT(isfinite(res.loss) && pt_now() - t0 < 1.0);
			for (int st = 1; st <= 4; st++) {
				PT_CHECK_OK(pt_coordinator_stage_stats(r.coord, st, &ss));
				CU_ASSERT(ss.forwards >= 8); /* steps 0 and 2 at least */
			}
			rig_down(&r);
			fx_data_down(&d);
		}
	rig_virtual = 0;
	rig_schedule = PT_SCHED_MODE;
}

static void test_pipeline_corrupt_message_is_reported(void)
{
	rig r;
	fx_data d;
	pt_pipe_step_result res;
	pt_msg bad = {.meta = {.kind = PT_MSG_COMMAND}};
	rig_up(&r, 2, 2, PT_MODE_SYNC, false, NULL);
	fx_data_up(&d, 2);
	/* A command whose payload is not a Control table. */
	PT_CHECK_OK(pt_msg_set_blob(&bad, "\x01\x02\x03garbage-garbage", 18));
	PT_CHECK_OK(pt_comm_send(r.comms[0], 2, &bad));
	pt_msg_fini(&bad);
	fx_data_next(&d, 0);
	PT_CHECK_ERR(pt_coordinator_step(r.coord, &d.x, &d.y, 0, &res), PT_ERR_FORMAT);
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "stage 2"));
	CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "Control"));
	PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 1, &res));
	rig_down(&r);
	fx_data_down(&d);
}

/* An output the coordinator did not get from the last stage (here a forged
 * one from stage 1's communicator, with the right shape and generation)
 * fails the step, naming the rank; the next step trains. */
static void test_pipeline_output_from_another_stage_is_refused(void)
{
	rig r;
	fx_data d;
	pt_pipe_step_result res;
	pt_msg fake = {.meta = {.kind = PT_MSG_OUTPUT, .step = 0, .microbatch = 0}};
	rig_up(&r, 2, 2, PT_MODE_SEMI_ASYNC, false, NULL);
	fx_data_up(&d, 2);
	PT_CHECK_OK(pt_tensor_init(&fake.tensor, PT_F32, 2, (int64_t[]){FX_MB, 10}));
	fake.has_tensor = true;
	fake.writable = true;
	PT_CHECK_OK(pt_comm_send(r.comms[1], 0, &fake));
	pt_msg_fini(&fake);
	fx_data_next(&d, 0);
	PT_CHECK_ERR_MSG(pt_coordinator_step(r.coord, &d.x, &d.y, 0, &res), PT_ERR_STATE,
	                 "from rank 1: only the last stage (rank 2) sends outputs");
	PT_CHECK_OK(pt_coordinator_step(r.coord, &d.x, &d.y, 1, &res));
	CU_ASSERT(isfinite(res.loss) && res.loss > 0.0);
	rig_down(&r);
	fx_data_down(&d);
}

static void test_pipeline_bad_batch_is_refused(void)
{
	rig r;
	pt_tensor x, y;
	pt_pipe_step_result res;
	rig_up(&r, 2, 4, PT_MODE_SYNC, false, NULL);
	PT_CHECK_OK(pt_tensor_init(&x, PT_F32, 2, (int64_t[]){FX_MB * 3, 64}));
	PT_CHECK_OK(pt_tensor_init(&y, PT_I64, 1, (int64_t[]){FX_MB * 3}));
	PT_CHECK_ERR_MSG(pt_coordinator_step(r.coord, &x, &y, 0, &res), PT_ERR_INVALID,
	                 "does not split into 4 microbatches");
	pt_tensor_fini(&x);
	pt_tensor_fini(&y);
	rig_down(&r);
}

/* Stage state out and back in: a fresh pipeline restored from a trained one's
 * state continues exactly as the trained one does. */
static void test_pipeline_state_roundtrip_resumes_bitwise(void)
{
	rig a, b;
	fx_data da, db;
	pt_pipe_step_result ra, rb;
	rig_up(&a, 2, 4, PT_MODE_SYNC, false, NULL);
	rig_up(&b, 2, 4, PT_MODE_SYNC, false, NULL);
	fx_data_up(&da, 4);
	fx_data_up(&db, 4);
	for (int st = 0; st < 3; st++) {
		fx_data_next(&da, st);
		fx_data_next(&db, st); /* keep both data streams in step */
		PT_CHECK_OK(pt_coordinator_step(a.coord, &da.x, &da.y, st, &ra));
	}
	for (int s = 1; s <= 2; s++) {
		pt_tensor state;
		int64_t steps;
		PT_CHECK_OK(pt_coordinator_get_state(a.coord, s, &state, &steps));
		CU_ASSERT_EQUAL(steps, 3);
		PT_CHECK_OK(pt_coordinator_set_state(b.coord, s, &state, steps));
		pt_tensor_fini(&state);
	}
	fx_data_next(&da, 3);
	fx_data_next(&db, 3);
	PT_CHECK_OK(pt_coordinator_step(a.coord, &da.x, &da.y, 3, &ra));
	PT_CHECK_OK(pt_coordinator_step(b.coord, &db.x, &db.y, 3, &rb));
	CU_ASSERT_EQUAL(memcmp(&ra.loss, &rb.loss, sizeof(double)), 0);
	CU_ASSERT_EQUAL(memcmp(&ra.grad_norm, &rb.grad_norm, sizeof(double)), 0);
	{
		size_t na, nb;
		float *pa = gather_params(&a, &na), *pb = gather_params(&b, &nb);
		CU_ASSERT(na == nb && memcmp(pa, pb, na) == 0);
		free(pa);
		free(pb);
	}
	/* A state of the wrong size is refused. */
	pt_tensor bad;
	PT_CHECK_OK(pt_tensor_init(&bad, PT_F32, 1, (int64_t[]){7}));
	PT_CHECK_ERR(pt_coordinator_set_state(b.coord, 1, &bad, 1), PT_ERR_SHAPE);
	pt_tensor_fini(&bad);
	fx_data_down(&da);
	fx_data_down(&db);
	rig_down(&a);
	rig_down(&b);
}

/* A stage fills its last state buffer again when nobody holds it (a
 * checkpoint's snapshot freed), so steady checkpoints map no new memory; a
 * snapshot still held (a checkpoint being written) is never overwritten: the
 * next state goes to a new buffer. */
static void test_pipeline_state_buffer_reused_not_overwritten(void)
{
	rig a;
	fx_data d;
	pt_pipe_step_result res;
	pt_tensor s1, s2, s3;
	int64_t steps;
	float *copy;
	size_t n;
	uintptr_t p2;

	rig_up(&a, 2, 4, PT_MODE_SYNC, false, NULL);
	fx_data_up(&d, 4);
	fx_data_next(&d, 0);
	PT_CHECK_OK(pt_coordinator_step(a.coord, &d.x, &d.y, 0, &res));
	PT_CHECK_OK(pt_coordinator_get_state(a.coord, 1, &s1, &steps));
	n = pt_tensor_nbytes(&s1);
	copy = malloc(n);
	memcpy(copy, pt_tensor_data(&s1), n);
	fx_data_next(&d, 1);
	PT_CHECK_OK(pt_coordinator_step(a.coord, &d.x, &d.y, 1, &res));
	PT_CHECK_OK(pt_coordinator_get_state(a.coord, 1, &s2, &steps));
	CU_ASSERT_EQUAL(steps, 2);
	CU_ASSERT(pt_tensor_data(&s2) != pt_tensor_data(&s1));
	CU_ASSERT(memcmp(pt_tensor_data(&s1), copy, n) == 0);
	CU_ASSERT(memcmp(pt_tensor_data(&s2), copy, n) != 0);
	p2 = (uintptr_t)pt_tensor_data(&s2);
	pt_tensor_fini(&s1);
	pt_tensor_fini(&s2);
	/* A step between, as between checkpoints: the stage's send of s2 has
	 * let go of it (a send stream may hold a message briefly). */
	fx_data_next(&d, 2);
	PT_CHECK_OK(pt_coordinator_step(a.coord, &d.x, &d.y, 2, &res));
	PT_CHECK_OK(pt_coordinator_get_state(a.coord, 1, &s3, &steps));
	CU_ASSERT_EQUAL(steps, 3);
	CU_ASSERT_EQUAL((uintptr_t)pt_tensor_data(&s3), p2);
	pt_tensor_fini(&s3);
	free(copy);
	fx_data_down(&d);
	rig_down(&a);
}

/* flatc_json has flatc print the root table `root` of blob as JSON into json
 * (schema/stage.fbs); false when flatc fails. Temporary files are removed. */
static bool flatc_json(const void *blob, size_t len, const char *root, char *json, size_t cap)
{
	char dir[] = "/tmp/pt-flatc-XXXXXX", bin[256], out[256], cmd[1024];
	FILE *f;
	size_t n = 0;
	bool ok;
	if (mkdtemp(dir) == NULL)
		return false;
	snprintf(bin, sizeof(bin), "%s/msg.bin", dir);
	snprintf(out, sizeof(out), "%s/msg.json", dir);
	pt_test_write_file(bin, blob, len);
	snprintf(cmd, sizeof(cmd),
	         "flatc --json --strict-json --raw-binary --root-type pipetrain.%s -o %s %s -- %s",
	         root, dir, pt_test_path("schema/stage.fbs"), bin);
	ok = system(cmd) == 0 && (f = fopen(out, "r")) != NULL;
	if (ok) {
		n = fread(json, 1, cap - 1, f);
		fclose(f);
	}
	json[n] = '\0';
	unlink(out);
	unlink(bin);
	rmdir(dir);
	return ok;
}

/* The control messages are the tables of schema/stage.fbs: flatc reads what
 * we build (a Configure command with its StageConfig). */
static void test_pipeline_control_matches_schema(void)
{
	char json[8192];
	pt_stage_config sc[2];
	pt_msg m = {0};
	if (system("flatc --version > /dev/null 2>&1") != 0) {
		printf("\n    skip: flatc not installed\n");
		return;
	}
	fx_stage_configs(sc, 2, 4, PT_MODE_SEMI_ASYNC, false, NULL);
	sc[1].use_graphs = true;
	sc[1].sync_sends = true;
	sc[1].device = (pt_device){PT_DEV_CUDA, 1};
	sc[1].schedule = PT_SCHED_ZBH1;
	sc[1].n_microbatches = 4;
	PT_CHECK_OK(pt_wire_configure_encode(&m, &sc[1]));
	{
		pt_stage_config back;
		pt_layer_spec *layers = NULL;
		PT_CHECK_OK(pt_wire_configure_decode(&m, &back, &layers));
		CU_ASSERT(back.use_graphs && back.sync_sends);
		CU_ASSERT(back.schedule == PT_SCHED_ZBH1 && back.n_microbatches == 4);
		CU_ASSERT(back.device.kind == PT_DEV_CUDA && back.device.index == 1);
		free(layers);
	}
	{
		/* A CPU stage's config carries no device and reads back as the CPU. */
		pt_msg c = {0};
		pt_stage_config back;
		pt_layer_spec *layers = NULL;
		PT_CHECK_OK(pt_wire_configure_encode(&c, &sc[0]));
		PT_CHECK_OK(pt_wire_configure_decode(&c, &back, &layers));
		CU_ASSERT(back.device.kind == PT_DEV_CPU);
		free(layers);
		pt_msg_fini(&c);
	}
	CU_ASSERT_FATAL(flatc_json(m.blob, m.blob_len, "Control", json, sizeof(json)));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"command\": \"Configure\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"kind\": \"ReLU\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"mode\": 1"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"first\": "));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"use_graphs\": true"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"sync_sends\": true"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"device\": \"cuda:1\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"schedule\": 3"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"microbatches\": 4"));
	pt_msg_fini(&m);
}

/* Defect 1 of issue 11: a Configure whose StageConfig (or its layers) points
 * outside the buffer is refused as a whole by the verifier, naming the field,
 * before any field is read (it used to be followed unverified: ASan
 * heap-buffer-overflow in pt_fb_read_layers). The blob is malloc'd to its exact
 * size, so any read past it is caught under ASan. */
static void test_pipeline_configure_verifies_stage_config(void)
{
	static const struct {
		int target; /* 0: Control.config, 1: StageConfig.layers, 2: its length */
		uint32_t value;
		const char *msg;
	} cases[] = {
	    {0, 0x40000000u, "table Control field config at byte"},
	    {1, 0x40000000u, "table StageConfig field layers at byte"},
	    {2, 0x10000000u, "table StageConfig field layers at byte"},
	};
	pt_stage_config sc[2];
	fx_stage_configs(sc, 2, 4, PT_MODE_SYNC, false, NULL);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		pt_msg m = {0};
		pt_stage_config back;
		pt_layer_spec *layers = (pt_layer_spec *)&back; /* must come back NULL */
		uint8_t *blob, *slot, *conf;
		PT_CHECK_OK(pt_wire_configure_encode(&m, &sc[1]));
		blob = m.blob;
		slot = (uint8_t *)pt_fb_field(pt_fb_root(blob), PT_FB_STAGE_CONTROL_CONFIG);
		CU_ASSERT_PTR_NOT_NULL_FATAL(slot);
		conf = (uint8_t *)pt_fb_deref(slot);
		if (cases[i].target >= 1)
			slot = (uint8_t *)pt_fb_field(conf, PT_FB_STAGE_STAGE_CONFIG_LAYERS);
		if (cases[i].target == 2)
			slot = (uint8_t *)pt_fb_deref(slot); /* the vector's length */
		memcpy(slot, &cases[i].value, 4);
		CU_ASSERT_EQUAL(pt_wire_configure_decode(&m, &back, &layers), PT_ERR_FORMAT);
		CU_ASSERT_PTR_NULL(layers);
		CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), "malformed Control message"));
		if (strstr(pt_last_error(), cases[i].msg) == NULL)
			printf("\n    case %zu: %s\n", i, pt_last_error());
		CU_ASSERT_PTR_NOT_NULL(strstr(pt_last_error(), cases[i].msg));
		pt_msg_fini(&m);
	}
}

/* StageConfig.precision: fp32, bf16 and tf32 come back as sent; any other
 * value is refused naming the field. */
static void test_pipeline_configure_precision(void)
{
	pt_stage_config sc[2];
	fx_stage_configs(sc, 2, 4, PT_MODE_SYNC, false, NULL);
	for (int p = 0; p <= 3; p++) {
		pt_msg m = {0};
		pt_stage_config back;
		pt_layer_spec *layers = NULL;
		sc[1].precision = (pt_precision)p;
		PT_CHECK_OK(pt_wire_configure_encode(&m, &sc[1]));
		if (p <= PT_PREC_TF32) {
			PT_CHECK_OK(pt_wire_configure_decode(&m, &back, &layers));
			CU_ASSERT_EQUAL(back.precision, (pt_precision)p);
		} else {
			PT_CHECK_ERR_MSG(pt_wire_configure_decode(&m, &back, &layers),
			                 PT_ERR_INVALID, "precision: unknown precision 3");
		}
		free(layers);
		pt_msg_fini(&m);
	}
}

/* A timeline Reply carries the stage's communicator counters (Reply.comm,
 * appended to schema/stage.fbs): they read back exactly, a reply without
 * them reads as has_comm false, a cut buffer is refused by the verifier, and
 * flatc reads the field by its schema name. */
/* A timeline Reply's task records go out field by field: the struct's
 * padding (filled with 0xAA here, as stale memory would be) is sent as 0, and
 * the fields read back exactly. */
static void test_pipeline_reply_task_padding_zero(void)
{
	pt_task_record tasks[3], back[3];
	pt_reply r = {.cmd = PT_CMD_TIMELINE, .tasks = tasks, .n_tasks = 3};
	pt_reply got = {.tasks = back, .cap_tasks = 3};
	pt_msg m = {0};
	const uint8_t *v;
	uint32_t n;

	memset(tasks, 0xAA, sizeof(tasks));
	for (int i = 0; i < 3; i++) {
		tasks[i].kind = (uint8_t)i;
		tasks[i].microbatch = 10 + i;
		tasks[i].step = 100 + i;
		tasks[i].start = 0.5 * i;
		tasks[i].end = 0.5 * i + 0.25;
	}
	PT_CHECK_OK(pt_wire_reply_encode(&m, &r));
	v = pt_fb_get_vector(pt_fb_root(m.blob), PT_FB_STAGE_REPLY_TASKS, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	for (uint32_t i = 0; i < n; i++)
		for (size_t k = PT_FB_STAGE_TASK_RECORD_KIND_OFFSET + 1;
		     k < PT_FB_STAGE_TASK_RECORD_MICROBATCH_OFFSET; k++)
			CU_ASSERT_EQUAL(v[i * PT_FB_STAGE_TASK_RECORD_SIZE + k], 0);
	PT_CHECK_OK(pt_wire_reply_decode(&m, &got));
	CU_ASSERT_EQUAL_FATAL(got.n_tasks, 3);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(back[i].kind, i);
		CU_ASSERT_EQUAL(back[i].microbatch, 10 + i);
		CU_ASSERT_EQUAL(back[i].step, 100 + i);
		CU_ASSERT_EQUAL(back[i].start, 0.5 * i);
		CU_ASSERT_EQUAL(back[i].end, 0.5 * i + 0.25);
	}
	pt_msg_fini(&m);
}

static void test_pipeline_reply_carries_comm_stats(void)
{
	pt_task_record tasks[2] = {{PT_TASK_FORWARD, 0, 3, 1.0, 1.5},
	                           {PT_TASK_BACKWARD, 0, 3, 2.0, 2.25}};
	pt_task_record back_tasks[4];
	pt_reply r = {.cmd = PT_CMD_TIMELINE, .tasks = tasks, .n_tasks = 2, .has_comm = true};
	pt_reply back = {.tasks = back_tasks, .cap_tasks = 4};
	pt_msg m = {0}, cut = {0}, old = {0};
	char json[8192];

	r.comm = (pt_comm_stats){.msgs_sent = 5,
	                         .msgs_recv = 7,
	                         .bytes_sent = (1ull << 32) + 5,
	                         .bytes_recv = 123456789012ull,
	                         .bytes_raw_sent = (1ull << 40) + 1,
	                         .errors = 2,
	                         .timeouts = 3,
	                         .reconnects = 4};
	PT_CHECK_OK(pt_wire_reply_encode(&m, &r));
	PT_CHECK_OK(pt_wire_reply_decode(&m, &back));
	CU_ASSERT_EQUAL(back.cmd, PT_CMD_TIMELINE);
	CU_ASSERT_EQUAL(back.n_tasks, 2);
	for (int i = 0; i < 2; i++) /* by field: padding is sent as 0 */
		CU_ASSERT(back_tasks[i].kind == tasks[i].kind &&
		          back_tasks[i].microbatch == tasks[i].microbatch &&
		          back_tasks[i].step == tasks[i].step &&
		          back_tasks[i].start == tasks[i].start &&
		          back_tasks[i].end == tasks[i].end);
	CU_ASSERT_TRUE(back.has_comm);
	CU_ASSERT_EQUAL(memcmp(&back.comm, &r.comm, sizeof(r.comm)), 0);

	/* All-zero counters are still "sent" (an idle stage), not absent. */
	r.comm = (pt_comm_stats){0};
	PT_CHECK_OK(pt_wire_reply_encode(&old, &r));
	PT_CHECK_OK(pt_wire_reply_decode(&old, &back));
	CU_ASSERT_TRUE(back.has_comm);
	CU_ASSERT_EQUAL(back.comm.msgs_sent, 0);
	pt_msg_fini(&old);

	/* A reply without the table (as an older stage sends it). */
	r.has_comm = false;
	PT_CHECK_OK(pt_wire_reply_encode(&old, &r));
	back.comm.msgs_sent = 99;
	PT_CHECK_OK(pt_wire_reply_decode(&old, &back));
	CU_ASSERT_FALSE(back.has_comm);
	CU_ASSERT_EQUAL(back.comm.msgs_sent, 0);
	CU_ASSERT(old.blob_len < m.blob_len);
	pt_msg_fini(&old);

	/* Cut short, the buffer no longer verifies. */
	PT_CHECK_OK(pt_msg_set_blob(&cut, m.blob, m.blob_len / 2));
	CU_ASSERT_EQUAL(pt_wire_reply_decode(&cut, &back), PT_ERR_FORMAT);
	pt_msg_fini(&cut);

	if (system("flatc --version > /dev/null 2>&1") != 0) {
		printf("\n    skip: flatc not installed\n");
		pt_msg_fini(&m);
		return;
	}
	CU_ASSERT_FATAL(flatc_json(m.blob, m.blob_len, "Reply", json, sizeof(json)));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"command\": \"Timeline\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"messages_sent\": 5"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"bytes_sent\": 4294967301"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"bytes_raw_sent\": 1099511627777"));
	CU_ASSERT_PTR_NOT_NULL(strstr(json, "\"reconnects\": 4"));
	pt_msg_fini(&m);
}

static const pt_test_case tests[] = {
    {"test_pipeline_reply_carries_comm_stats", test_pipeline_reply_carries_comm_stats},
    {"test_pipeline_step_reports_stage_comm_stats", test_pipeline_step_reports_stage_comm_stats},
    {"test_pipeline_control_matches_schema", test_pipeline_control_matches_schema},
    {"test_pipeline_configure_precision", test_pipeline_configure_precision},
    {"test_pipeline_configure_verifies_stage_config",
     test_pipeline_configure_verifies_stage_config},
    {"test_pipeline_reply_task_padding_zero", test_pipeline_reply_task_padding_zero},
    {"test_pipeline_state_roundtrip_resumes_bitwise",
     test_pipeline_state_roundtrip_resumes_bitwise},
    {"test_pipeline_state_buffer_reused_not_overwritten",
     test_pipeline_state_buffer_reused_not_overwritten},
    {"test_pipeline_partition", test_pipeline_partition},
    {"test_pipeline_seed_walkthrough_order", test_pipeline_seed_walkthrough_order},
    {"test_pipeline_sync_bitwise_across_stage_counts",
     test_pipeline_sync_bitwise_across_stage_counts},
    {"test_pipeline_semi_async_equals_sync_with_fewer_activations",
     test_pipeline_semi_async_equals_sync_with_fewer_activations},
    {"test_pipeline_recompute_is_bitwise_equal", test_pipeline_recompute_is_bitwise_equal},
    {"test_pipeline_output_from_another_stage_is_refused",
     test_pipeline_output_from_another_stage_is_refused},
    {"test_pipeline_loss_gradient_overwrites_only_a_dead_output",
     test_pipeline_loss_gradient_overwrites_only_a_dead_output},
    {"test_pipeline_zbh1_order_and_memory", test_pipeline_zbh1_order_and_memory},
    {"test_pipeline_interleaved_order_and_memory", test_pipeline_interleaved_order_and_memory},
    {"test_pipeline_bf16_wire", test_pipeline_bf16_wire},
    {"test_pipeline_interleaved_failure_recovers", test_pipeline_interleaved_failure_recovers},
    {"test_pipeline_graphs_and_sync_sends_are_bitwise",
     test_pipeline_graphs_and_sync_sends_are_bitwise},
    {"test_pipeline_graphs_sgd_is_bitwise", test_pipeline_graphs_sgd_is_bitwise},
    {"test_pipeline_async_trains_digits_with_staleness",
     test_pipeline_async_trains_digits_with_staleness},
    {"test_pipeline_op_error_ends_step_and_recovers",
     test_pipeline_op_error_ends_step_and_recovers},
    {"test_pipeline_corrupt_message_is_reported", test_pipeline_corrupt_message_is_reported},
    {"test_pipeline_failed_async_send_is_reported", test_pipeline_failed_async_send_is_reported},
    {"test_pipeline_bad_batch_is_refused", test_pipeline_bad_batch_is_refused},
    {NULL, NULL},
};

int main(void)
{
	const pt_test_suite suites[] = {{"pipeline", tests}, {NULL, NULL}};
	return pt_test_main(suites);
}
