/* nccl_stub.c - the NCCL communicator in builds without CUDA or NCCL
 * (nccl.c is the real one, see nccl_comm.h). It only says "not supported". */
#include "nccl_comm.h"

pt_err pt_nccl_comm_create(pt_comm **out, pt_comm *control, pt_device dev, int timeout_ms)
{
	if (out != NULL)
		*out = NULL;
	return pt_set_error(PT_ERR_UNSUPPORTED,
	                    "NCCL communicator: this build has no NCCL (it needs CUDA and libnccl "
	                    "where meson finds them: configure with -Dcuda=enabled)");
}

bool pt_nccl_built(void)
{
	return false;
}

pt_err pt_nccl_p2p(bool send, void *buf, size_t nbytes, void *comm, void *stream, int peer_rank)
{
	return pt_set_error(PT_ERR_UNSUPPORTED, "NCCL point-to-point: this build has no NCCL");
}
