#include "kernels/isa.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/cpu_features.h"

namespace peng::kernels {
namespace {

Isa InitialIsa() {
  if (const char* env = std::getenv("PENG_ISA")) {
    for (Isa isa : kAllIsas) {
      if (std::strcmp(env, IsaName(isa)) == 0 && IsaSupported(isa)) return isa;
    }
  }
  return BestIsa();
}

Isa& ActiveIsaRef() {
  static Isa isa = InitialIsa();
  return isa;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kNeon: return "neon";
    case Isa::kNeonDot: return "dotprod";
    case Isa::kNeonI8mm: return "i8mm";
  }
  return "?";
}

bool IsaSupported(Isa isa) {
  const CpuFeatures& f = GetCpuFeatures();
  switch (isa) {
    case Isa::kScalar: return true;
#if defined(__x86_64__)
    case Isa::kAvx2: return f.avx2 && f.fma && f.f16c;
    case Isa::kAvx512:
      return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.fma && f.f16c;
#endif
#if defined(__aarch64__)
    case Isa::kNeon: return f.neon;
    case Isa::kNeonDot: return f.neon && f.dotprod && f.fp16;
    case Isa::kNeonI8mm: return f.neon && f.dotprod && f.fp16 && f.i8mm;
#endif
    default: return false;
  }
}

Isa BestIsa() {
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kNeonI8mm, Isa::kNeonDot, Isa::kNeon})
    if (IsaSupported(isa)) return isa;
  return Isa::kScalar;
}

Isa ActiveIsa() { return ActiveIsaRef(); }

void SetActiveIsa(Isa isa) {
  PENG_CHECK_MSG(IsaSupported(isa), "ISA not supported on this CPU or not compiled in");
  ActiveIsaRef() = isa;
}

}  // namespace peng::kernels
