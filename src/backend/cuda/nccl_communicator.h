// NCCL behind the Communicator interface (built when CMake finds NCCL next to the CUDA toolkit):
// the collectives of a group of ranks, one GPU each, on device memory and a CUDA stream. Used by
// CudaDevice::CreateCommunicator; the group's host communicator (Open MPI) carries the NCCL id
// at creation and the barrier. The CUDA emulator's build of it runs over nccl_emulator.h's NCCL.
#pragma once

#if defined(PENG_CUDA_EMULATOR)
#include "backend/cuda/emulator.h"
#else
#include <cuda_runtime.h>
#endif

#include <memory>

#include "parallel/communicator.h"

namespace peng::backend::cuda {

// Collective over `group`: every rank joins one NCCL communicator of group->size() ranks on
// device `device`, ordered on `stream`. An error names NCCL's reason.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator* group, int device,
                                                               cudaStream_t stream);

}  // namespace peng::backend::cuda
