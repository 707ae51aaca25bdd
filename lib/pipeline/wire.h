/* wire.h - the coordinator <-> stage control messages, FlatBuffers tables of
 * schema/stage.fbs (Control, Reply, StageError), encoded into pt_msg blobs
 * and verified before any field is read. Internal to lib/pipeline. */
#ifndef PT_PIPELINE_WIRE_H
#define PT_PIPELINE_WIRE_H

#include "pipeline.h"

typedef enum pt_stage_cmd {
	PT_CMD_STEP = 1,  /* optimizer step with grad_scale, then zero gradients */
	PT_CMD_SQNORM,    /* reply: per-tensor squared gradient norms */
	PT_CMD_TIMELINE,  /* reply: task records since the last fetch */
	PT_CMD_STATS,     /* reply: pt_stage_stats */
	PT_CMD_RESET,     /* drop in-flight microbatches and gradients */
	PT_CMD_STOP,      /* leave the event loop */
	PT_CMD_PARAMS,    /* reply: the parameter arena as a tensor */
	PT_CMD_CONFIGURE, /* carries a StageConfig; reply when the stage is built (Ready) */
	PT_CMD_GET_STATE, /* reply: [params | optimizer state] as one tensor, steps */
	PT_CMD_SET_STATE, /* carries [params | optimizer state] and steps in `step` */
} pt_stage_cmd;

typedef struct pt_control {
	pt_stage_cmd cmd;
	float grad_scale;
	int64_t step;
} pt_control;

pt_err pt_wire_control_encode(pt_msg *m, const pt_control *c);

/* A CONFIGURE command with the stage's StageConfig. Decoding gives a config
 * whose layer list is a new array in *layers (free() it). */
pt_err pt_wire_configure_encode(pt_msg *m, const pt_stage_config *cfg);
pt_err pt_wire_configure_decode(const pt_msg *m, pt_stage_config *cfg, pt_layer_spec **layers);
pt_err pt_wire_control_decode(const pt_msg *m, pt_control *c);

/* A reply; decoding copies arrays out (at most the given capacities). */
typedef struct pt_reply {
	pt_stage_cmd cmd;
	double *sqnorms;
	int n_sqnorms, cap_sqnorms;
	pt_task_record *tasks;
	int n_tasks, cap_tasks;
	bool has_stats;
	pt_stage_stats stats;
	int64_t steps; /* GET_STATE: optimizer steps taken */
	/* TIMELINE: the stage's communicator counters, before this reply was
	 * sent; has_comm false when the stage sent none (an older stage). */
	bool has_comm;
	pt_comm_stats comm;
} pt_reply;

pt_err pt_wire_reply_encode(pt_msg *m, const pt_reply *r);
pt_err pt_wire_reply_decode(const pt_msg *m, pt_reply *r);

pt_err pt_wire_error_encode(pt_msg *m, int stage, int64_t step, int32_t mb, pt_err code,
                            const char *message);
/* Decodes into a pt_set_error on the calling thread and returns its code. */
pt_err pt_wire_error_raise(const pt_msg *m);

#endif
