// The row primitives both attention kernels (attention.cc: paged GQA attention, mla.cc:
// attention over MLA latent rows) are built from, selected once per call for the active ISA
// (scalar reference in ref/ops_ref.h, SIMD versions in cpu/). Internal to src/kernels.
#pragma once

#include "kernels/ref/ops_ref.h"

namespace peng::kernels {

struct AttnOps {
  decltype(&ref::DotRowsF32) dot_f32;
  decltype(&ref::DotRowsF16) dot_f16;
  decltype(&ref::AxpyRowsF32) axpy_f32;
  decltype(&ref::AxpyRowsF16) axpy_f16;
  decltype(&ref::ExpShiftSum) exp_shift_sum;
  decltype(&ref::ScaleInPlace) scale;
  decltype(&ref::F32ToF16Row) to_f16;
};

// The primitives of kernels::ActiveIsa() (attention.cc).
AttnOps SelectAttnOps();

}  // namespace peng::kernels
