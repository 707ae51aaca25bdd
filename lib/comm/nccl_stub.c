/* nccl_stub.c - the NCCL communicator's stub: what every build links until
 * nccl.c (see nccl.h) is written, and what builds without NCCL will keep.
 * It only says "not supported". */
#include "nccl.h"

pt_err pt_nccl_comm_create(pt_comm **out, pt_comm *control, pt_device dev, int timeout_ms)
{
	*out = NULL;
	return pt_set_error(PT_ERR_UNSUPPORTED,
	                    "NCCL communicator: not implemented in this build (lib/comm/nccl.c)");
}
