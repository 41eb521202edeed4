// The CUDA backend compiled as C++ for the CUDA emulator (emulator.h): the same kernels and
// device code, run on the CPU by the tests as device "cuda-emu".
#define PENG_CUDA_EMULATOR 1
#include "backend/cuda/cuda_device.cu"  // NOLINT(bugprone-suspicious-include)
