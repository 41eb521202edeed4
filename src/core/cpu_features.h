// What the CPU we run on can do, read once from CPUID (x86) or HWCAP (ARM64). Kernels are
// chosen from this at run time; nothing is compiled with -march=native. Thread-safe (the
// value is computed once and immutable).
#pragma once

#include <string>

namespace peng {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;
  bool neon = false;
  bool dotprod = false;  // ARMv8.2 SDOT/UDOT (HWCAP_ASIMDDP)
  bool fp16 = false;     // FP16 scalar and vector arithmetic (HWCAP_FPHP and HWCAP_ASIMDHP)
  bool i8mm = false;     // int8 matrix multiply SMMLA/USMMLA (HWCAP2_I8MM)
  bool bf16 = false;     // BFDOT/BFMMLA (HWCAP2_BF16)
  bool sve = false;      // Scalable Vector Extension (HWCAP_SVE; no SVE kernels yet)
  int physical_cores = 1;
  int logical_cores = 1;

  // "avx2 fma f16c avx512f avx512bw avx512vnni avx512bf16", "neon dotprod fp16 i8mm bf16 sve"
  std::string ToString() const;
};

const CpuFeatures& GetCpuFeatures();

}  // namespace peng
