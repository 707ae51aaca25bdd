/* nccl_comm.h - the NCCL communicator: pt_comm over NCCL for tensors between
 * ranks on different CUDA devices, with an existing communicator (nng or
 * local) as the control channel. (Not "nccl.h": that name is NCCL's own
 * header, which lib/comm on the include path would otherwise shadow.)
 *
 * Design (lib/comm/nccl.c):
 *  - Every message goes through the control communicator first: its metadata
 *    (kind, job, step, microbatch, tag), its blob, and a fixed trailer after
 *    the blob with our own per-pair sequence number, the route of the tensor
 *    and its dtype, shape and byte size. A tensor between two ranks on
 *    different GPUs then follows as one ncclSend/ncclRecv (each inside
 *    ncclGroupStart/End) on a stream owned by this communicator; any other
 *    tensor travels inside the control message (copied to the host first
 *    when it lives on a device).
 *  - One NCCL communicator per direction of a pair (sender = NCCL rank 0,
 *    receiver = rank 1), made on the first tensor that needs it: the sender
 *    makes the unique id (ncclGetUniqueId), sends it on control (a
 *    PT_MSG_COMMAND with tag PT_NCCL_ID_TAG, consumed here, never delivered),
 *    and both sides call ncclCommInitRankConfig (non-blocking, so a timeout
 *    can abort it). A direction carries sends one way only, so the sender's
 *    and receiver's streams never wait on each other in a cycle, ranks
 *    without a GPU (PT_CPU: the coordinator) can be members, and two ranks
 *    on one GPU (which NCCL refuses in one communicator) simply use the
 *    control path. Open risk: a middle stage's GPU then runs operations of
 *    up to four communicators at once (and a set-up of one beside another's
 *    transfer), which NCCL's documentation says to avoid ("Using multiple
 *    NCCL communicators concurrently"): blocking NCCL kernels of two
 *    communicators can wait on each other. Making every pair's communicators
 *    before any traffic, or one communicator per pair of GPUs, would remove
 *    the set-up case; two GPUs have never run this (see README).
 *  - An I/O thread takes every control message in arrival order (per source
 *    that is send order), posts the matching ncclRecv at once, waits for it,
 *    and queues the whole message in this rank's mailbox (mailbox.h), so
 *    receives by channel or source never reorder NCCL's in-order matching.
 *  - Received tensors live where the sent one lived: a device tensor arrives
 *    in CUDA memory of this rank's device (lib/backend's pool; also when it
 *    took the control path, as a host copy put back on the device), or in
 *    host memory at a rank without a GPU; a host tensor arrives in host
 *    memory (over NCCL, staged through a device buffer on the NCCL stream).
 *    Device tensors are ordered after the device's compute stream (an event)
 *    before NCCL reads them. A device receive buffer is allocated on the
 *    pair's NCCL stream (not zeroed) and the compute stream waits for an
 *    event recorded there after the receive, so receives overlap compute
 *    and the buffer is freed only after NCCL is done with it (also after an
 *    abort).
 *  - Every received trailer is verified (magic, version, route, dtype, rank,
 *    shape against byte size, sequence number); a bad one becomes a queued
 *    PT_ERR_FORMAT error for the receiver. NCCL and CUDA failures are
 *    PT_ERR_BACKEND with NCCL's message; a transfer that does not complete
 *    within the timeout aborts that direction's NCCL communicator
 *    (ncclCommAbort) and fails, later sends to that peer fail at once. A
 *    failed set-up is tried once more with a new id after the device's
 *    memory pool gives its cached memory back (NCCL allocates outside it).
 *
 * Limits: sends block until the receiver has taken the bytes (the stream is
 * waited for), so a sender may reuse its tensor at once; the receiving I/O
 * thread handles one transfer at a time; destroy aborts NCCL operations still
 * pending. Nothing here has run on a GPU yet (see README).
 */
#ifndef PT_NCCL_COMM_H
#define PT_NCCL_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "comm.h"

/* pt_nccl_comm_create makes this rank's NCCL communicator over control (same
 * rank and world). dev is this rank's device: cuda:N, or PT_CPU for a rank
 * without a GPU (its tensors always travel on control). All ranks of control
 * must call this collectively before any other traffic on control: each
 * sends every other rank a hello naming its device (a PT_MSG_COMMAND with
 * tag PT_NCCL_ID_TAG) and waits for theirs, up to timeout_ms (< 0: control's
 * default). On success the new communicator owns control (destroying it
 * destroys control); on error the caller still does. PT_ERR_UNSUPPORTED in
 * builds without CUDA or NCCL, and for a CUDA device that is not present. */
pt_err pt_nccl_comm_create(pt_comm **out, pt_comm *control, pt_device dev, int timeout_ms);

/* pt_nccl_built: whether this build has the NCCL communicator (false: the
 * stub, which refuses every call). */
bool pt_nccl_built(void);

/* pt_nccl_comm_create_group makes the NCCL communicators of n ranks of this
 * process together (one thread each, as creation is collective): comms[i],
 * rank i's control communicator, becomes its NCCL communicator on devs[i].
 * Blocking (up to timeout_ms). Ranks whose creation failed keep their control
 * communicator, so the caller destroys comms[] the same way either way; the
 * first failure is returned, naming its rank. */
pt_err pt_nccl_comm_create_group(pt_comm **comms, const pt_device *devs, int n, int timeout_ms);

/* pt_nccl_p2p posts one ncclSend (send; to NCCL rank 1) or ncclRecv (from
 * rank 0) of nbytes at buf on comm (an ncclComm_t) and stream (a
 * cudaStream_t) inside its own ncclGroupStart/End, and returns without
 * waiting. The group is ended whatever the call returned, so the calling
 * thread is never left inside a group. PT_ERR_BACKEND with NCCL's message;
 * PT_ERR_UNSUPPORTED without NCCL. The communicator's own transfer step,
 * exported for tests. */
pt_err pt_nccl_p2p(bool send, void *buf, size_t nbytes, void *comm, void *stream, int peer_rank);

#define PT_NCCL_ID_TAG 0x4e43434cu /* "NCCL" */

#endif
