// The CUDA backend (built with -DPENG_CUDA=ON): backend::Device on one NVIDIA GPU -- one stream,
// cuBLAS for the GEMMs of prefill-sized batches, own kernels for quantized GEMV, RMSNorm, RoPE,
// the gated activations, the paged KV cache and attention (FP32 accumulation throughout).
#pragma once

#include <memory>

#include "backend/device.h"

namespace peng::backend::cuda {

// GPUs visible to this process (0 when the driver or the device is absent).
int DeviceCount();
// Device `index` ("cuda:N"); an error naming the reason when it cannot be opened.
StatusOr<std::unique_ptr<Device>> CreateDevice(int index);

}  // namespace peng::backend::cuda
