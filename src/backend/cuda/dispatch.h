// The CUDA backend's host-side dispatch helpers (included by cuda_device.cu and the kernel
// headers' launchers): a weight type as a template argument, grid sizes, the environment's
// switches.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/dtype.h"

namespace peng::backend::cuda {
namespace {

// Calls f.template operator()<T>() for the weight type t; false when unsupported.
template <typename F>
bool WithType(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<DType::kF32>(); return true;
    case DType::kF16: f.template operator()<DType::kF16>(); return true;
    case DType::kBF16: f.template operator()<DType::kBF16>(); return true;
    case DType::kI8: f.template operator()<DType::kI8>(); return true;
    case DType::kQ4_0: f.template operator()<DType::kQ4_0>(); return true;
    case DType::kQ4_1: f.template operator()<DType::kQ4_1>(); return true;
    case DType::kQ5_0: f.template operator()<DType::kQ5_0>(); return true;
    case DType::kQ5_1: f.template operator()<DType::kQ5_1>(); return true;
    case DType::kQ8_0: f.template operator()<DType::kQ8_0>(); return true;
    case DType::kQ4_K: f.template operator()<DType::kQ4_K>(); return true;
    case DType::kQ5_K: f.template operator()<DType::kQ5_K>(); return true;
    case DType::kQ6_K: f.template operator()<DType::kQ6_K>(); return true;
    default: return false;
  }
}

struct Nothing {
  template <DType>
  void operator()() const {}
};

inline int64_t Blocks(int64_t n, int64_t per) { return (n + per - 1) / per; }

// False when the environment variable is "0" (the switches of docs/devices.md).
inline bool EnvOn(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::string(e) == "0");
}
constexpr int64_t kMaxGridY = 65535;  // the largest gridDim.y

}  // namespace
}  // namespace peng::backend::cuda
