// Instruction-set selection for CPU kernels. Every kernel has a scalar reference (the oracle)
// and SIMD versions compiled with per-file target flags (never -march=native); the active ISA
// is chosen once at start-up from CPUID (x86) or HWCAP/HWCAP2 (ARM64), and can be forced with the
// environment variable PENG_ISA=scalar|avx2|avx512|neon|dotprod|i8mm or SetActiveIsa() (tests,
// benchmarks). Reading the active ISA is thread-safe; setting it is not (do it before running
// kernels).
//
// ARM64 levels (docs/arm64.md), each with its own files and target flags:
//   kNeon      ARMv8.0 Advanced SIMD only (*_neon.cc, -march=armv8-a): int8 dot products by
//              vmull/vpadal, F16 weights by fcvtl.
//   kNeonDot   + the dot-product extension and FP16 (*_dotprod.cc, armv8.2-a+dotprod+fp16):
//              sdot; Kunpeng 920, Neoverse N1 / Graviton2.
//   kNeonI8mm  + the int8 matrix-multiply extension (*_i8mm.cc, ...+i8mm): smmla 2x2 tiles for
//              batches >= 2 (prefill), sdot for one token; Neoverse V1/N2, Graviton3+.
#pragma once

namespace peng::kernels {

enum class Isa { kScalar, kAvx2, kAvx512, kNeon, kNeonDot, kNeonI8mm };

// Every level, in declaration order (the conformance tests loop over it).
inline constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2,    Isa::kAvx512,
                                   Isa::kNeon,   Isa::kNeonDot, Isa::kNeonI8mm};

const char* IsaName(Isa isa);
bool IsaSupported(Isa isa);  // compiled in AND supported by this CPU
Isa BestIsa();
Isa ActiveIsa();
void SetActiveIsa(Isa isa);  // PENG_CHECKs IsaSupported(isa)

}  // namespace peng::kernels
