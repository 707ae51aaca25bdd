/* nccl.h - the NCCL communicator: pt_comm over NCCL for tensors in CUDA
 * device memory, with an existing communicator (nng) as control channel.
 *
 * Every message goes through the control communicator first, carrying its
 * metadata, blob and (for a device tensor) dtype and shape; the tensor bytes
 * follow as ncclSend/ncclRecv (inside ncclGroupStart/End) on a communication
 * stream of the rank's device. Receivers post NCCL receives from one source
 * in the order that source sent (a per-pair sequence number), holding back
 * messages of other channels that arrive out of that order, so NCCL's
 * in-order matching between a pair always lines up. Messages without a
 * device tensor (CPU tensors, blobs) travel on the control channel alone.
 *
 * STATUS: only this interface and the stub (nccl_stub.c) exist; the design
 * above is what nccl.c must implement. comm.c's pt_comm_send also still
 * refuses device tensors and must let communicators that accept them through.
 *
 * Limits: every rank of the control communicator joins the NCCL
 * communicator, so each needs a CUDA device; sends block until NCCL has
 * taken the bytes (the stream is synchronised), so a sender may reuse its
 * tensor at once. Until nccl.c lands, pt_nccl_comm_create returns
 * PT_ERR_UNSUPPORTED in every build.
 */
#ifndef PT_NCCL_H
#define PT_NCCL_H

#include "comm.h"

/* pt_nccl_comm_create makes this rank's NCCL communicator over control
 * (same rank and world) using CUDA device dev. Rank 0 makes the NCCL unique
 * id and sends it to every other rank on control (a PT_MSG_COMMAND with tag
 * PT_NCCL_ID_TAG); all ranks must call this collectively before any other
 * traffic on control. Blocks until every rank has joined (or timeout_ms,
 * < 0: control's default, passes). On success the new communicator owns
 * control (destroying it destroys control); on error the caller still does. */
pt_err pt_nccl_comm_create(pt_comm **out, pt_comm *control, pt_device dev, int timeout_ms);

#define PT_NCCL_ID_TAG 0x4e43434cu /* "NCCL" */

#endif
