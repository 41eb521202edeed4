// Instruction-set selection for CPU kernels. Every kernel has a scalar reference (the oracle)
// and SIMD versions compiled with per-file target flags (never -march=native); the active ISA
// is chosen once at start-up from CPUID, and can be forced with the environment variable
// PENG_ISA=scalar|avx2|avx512|neon or SetActiveIsa() (tests, benchmarks). Reading the active
// ISA is thread-safe; setting it is not (do it before running kernels).
#pragma once

namespace peng::kernels {

enum class Isa { kScalar, kAvx2, kAvx512, kNeon };

const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);  // compiled in AND supported by this CPU
Isa BestIsa();
Isa ActiveIsa();
void SetActiveIsa(Isa isa);  // PENG_CHECKs IsaSupported(isa)

}  // namespace peng::kernels
