// NCCL's API for the CUDA emulator (emulator.h), over MPI: device memory is the host's there,
// so a collective is MPI's on the same buffers, run when it is called -- the emulator runs a
// stream's work at once -- or, in a stream being captured, when the graph replays (as CUDA
// graphs capture NCCL's collectives; sends and receives are refused there). It lets nccl_communicator.cu (compiled as C++ into
// cuda_device_emulated.cc) and the device graphs' collectives on CudaDevice run under mpirun
// without a GPU: the calls, their counts, buffers, roots and groups as NCCL takes them. The
// ranks of a communicator find each other through MPI_COMM_WORLD (ncclCommInitRank: every rank
// tells rank 0 of the communicator -- the one that made the id -- its world rank); the
// collectives run on an MPI communicator of those ranks. Send and receive between
// ncclGroupStart and ncclGroupEnd are posted at the end, all at once, as NCCL's group does.
#pragma once

#include <cstddef>

#include "backend/cuda/emulator.h"

namespace peng::backend::cuda {

struct ncclUniqueId {
  char internal[128];
};
struct EmuNcclComm;
using ncclComm_t = EmuNcclComm*;
enum ncclResult_t {
  ncclSuccess = 0,
  ncclSystemError = 2,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5
};
enum ncclDataType_t { ncclChar = 0, ncclFloat = 7 };
enum ncclRedOp_t { ncclSum = 0 };

const char* ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

}  // namespace peng::backend::cuda
