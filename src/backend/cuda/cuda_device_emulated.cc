// The CUDA backend compiled as C++ for the CUDA emulator (emulator.h): the same kernels and
// device code, run on the CPU by the tests as device "cuda-emu". With MPI, its collectives
// across ranks are the NCCL communicator's (nccl_communicator.cu, renamed here so that it does
// not clash with the real one) over nccl_emulator.h's NCCL on MPI.
#define PENG_CUDA_EMULATOR 1
#if PENG_HAVE_MPI
#define PENG_HAVE_NCCL 1
#define CreateNcclCommunicator CreateEmulatedNcclCommunicator
#endif
#include "backend/cuda/cuda_device.cu"  // NOLINT(bugprone-suspicious-include)
#if PENG_HAVE_MPI
#include "backend/cuda/nccl_communicator.cu"  // NOLINT(bugprone-suspicious-include)
#endif
