/* model_wire.h - Layer, Optimizer and SampleShape tables (schema/model.fbs)
 * and StageConfig (schema/stage.fbs): build and read (the verifier descriptors
 * are generated into fb_schema.h).
 *
 * Readers take verified tables and validate values (enum ranges, sizes);
 * shape consistency is pt_model_check's job. */
#ifndef PT_MODEL_WIRE_H
#define PT_MODEL_WIRE_H

#include "fb.h"
#include "fb_schema.h" /* pt_fb_model_layer_desc, pt_fb_stage_stage_config_desc, ... */
#include "pipeline.h"

/* Most layers a model may have (bounds what a received message can ask). */
#define PT_MAX_LAYERS 4096

pt_err pt_fb_build_layers(pt_fb_builder *b, const pt_layer_spec *layers, int n, pt_fb_ref *out);
pt_err pt_fb_build_optimizer(pt_fb_builder *b, const pt_optim_config *o, pt_fb_ref *out);
pt_err pt_fb_build_sample_shape(pt_fb_builder *b, pt_act_shape s, pt_fb_ref *out);

/* pt_fb_read_layers reads a verified vector of Layer tables into a new array
 * (*out, free() it); errors name the layer index and field. */
pt_err pt_fb_read_layers(const uint8_t *vec, uint32_t count, pt_layer_spec **out);
pt_err pt_fb_read_optimizer(const uint8_t *t, pt_optim_config *o);
pt_err pt_fb_read_sample_shape(const uint8_t *t, pt_act_shape *s);

/* StageConfig. The layers of a read config are a new array in *layers. */
pt_err pt_fb_build_stage_config(pt_fb_builder *b, const pt_stage_config *c, pt_fb_ref *out);
pt_err pt_fb_read_stage_config(const uint8_t *t, pt_stage_config *c, pt_layer_spec **layers);

#endif
