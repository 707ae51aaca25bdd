/* fuzz_wire.c - lib/pipeline/wire.c: the control messages a stage reads from
 * its coordinator (Control: commands and Configure with its StageConfig) and
 * those a coordinator reads from its stages (Reply, StageError), given as
 * the blob of a message as lib/comm delivers it.
 *
 * Property: a decoded Control, Configure or Reply encodes into a blob that
 * decodes to the same values and encodes to the same bytes. */
#include "fuzz_common.h"
#include "wire.h"

#define CAP 64

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

static int same_blob(const pt_msg *a, const pt_msg *b)
{
	return a->blob_len == b->blob_len && memcmp(a->blob, b->blob, a->blob_len) == 0;
}

static void control(const pt_msg *m)
{
	pt_control c, c2;
	pt_msg e1 = {0}, e2 = {0};

	if (pt_wire_control_decode(m, &c) != PT_OK)
		return;
	FUZZ_CHECK(pt_wire_control_encode(&e1, &c) == PT_OK);
	FUZZ_CHECK(pt_wire_control_decode(&e1, &c2) == PT_OK);
	FUZZ_CHECK(c.cmd == c2.cmd && c.step == c2.step &&
	           memcmp(&c.grad_scale, &c2.grad_scale, sizeof(float)) == 0);
	FUZZ_CHECK(pt_wire_control_encode(&e2, &c2) == PT_OK);
	FUZZ_CHECK(same_blob(&e1, &e2));
	pt_msg_fini(&e1);
	pt_msg_fini(&e2);
}

static void configure(const pt_msg *m)
{
	pt_stage_config cfg, cfg2;
	pt_layer_spec *layers = NULL, *layers2 = NULL;
	pt_msg e1 = {0}, e2 = {0};

	if (pt_wire_configure_decode(m, &cfg, &layers) != PT_OK) {
		free(layers);
		return;
	}
	FUZZ_CHECK(cfg.n_layers >= 0 && (cfg.n_layers == 0 || cfg.layers != NULL));
	if (pt_wire_configure_encode(&e1, &cfg) == PT_OK) {
		FUZZ_CHECK(pt_wire_configure_decode(&e1, &cfg2, &layers2) == PT_OK);
		FUZZ_CHECK(cfg2.n_layers == cfg.n_layers && cfg2.first == cfg.first &&
		           cfg2.last == cfg.last && cfg2.microbatch == cfg.microbatch &&
		           cfg2.mode == cfg.mode && cfg2.seed == cfg.seed);
		FUZZ_CHECK(pt_wire_configure_encode(&e2, &cfg2) == PT_OK);
		FUZZ_CHECK(same_blob(&e1, &e2));
		free(layers2);
	}
	pt_msg_fini(&e1);
	pt_msg_fini(&e2);
	free(layers);
}

static void reply(const pt_msg *m)
{
	static double sq[CAP], sq2[CAP];
	static pt_task_record tasks[CAP], tasks2[CAP];
	pt_reply r = {.sqnorms = sq, .cap_sqnorms = CAP, .tasks = tasks, .cap_tasks = CAP};
	pt_reply r2 = {.sqnorms = sq2, .cap_sqnorms = CAP, .tasks = tasks2, .cap_tasks = CAP};
	pt_msg e1 = {0}, e2 = {0};

	if (pt_wire_reply_decode(m, &r) != PT_OK)
		return;
	FUZZ_CHECK(r.n_sqnorms >= 0 && r.n_sqnorms <= CAP && r.n_tasks >= 0 && r.n_tasks <= CAP);
	FUZZ_CHECK(pt_wire_reply_encode(&e1, &r) == PT_OK);
	FUZZ_CHECK(pt_wire_reply_decode(&e1, &r2) == PT_OK);
	FUZZ_CHECK(r.cmd == r2.cmd && r.steps == r2.steps && r.n_sqnorms == r2.n_sqnorms &&
	           r.n_tasks == r2.n_tasks && r.has_stats == r2.has_stats &&
	           r.has_comm == r2.has_comm);
	FUZZ_CHECK(memcmp(sq, sq2, sizeof(double) * (size_t)r.n_sqnorms) == 0);
	FUZZ_CHECK(memcmp(tasks, tasks2, sizeof(pt_task_record) * (size_t)r.n_tasks) == 0);
	FUZZ_CHECK(pt_wire_reply_encode(&e2, &r2) == PT_OK);
	FUZZ_CHECK(same_blob(&e1, &e2));
	pt_msg_fini(&e1);
	pt_msg_fini(&e2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	pt_msg m = {.meta = {.kind = PT_MSG_COMMAND, .source = 1}};

	/* pt_msg blobs are malloc'd (aligned), as after a receive. */
	FUZZ_CHECK(pt_msg_set_blob(&m, data, size) == PT_OK);
	control(&m);
	configure(&m);
	reply(&m);
	(void)pt_wire_error_raise(&m);
	pt_msg_fini(&m);
	return 0;
}
