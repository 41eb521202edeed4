// The operation mix of the AVX-512 32-value panel tile (cpu/matmul_avx512.cc, PanelTile) from
// registers, to see what its per-block scaling costs beside the integer dot products: per block
// and token of a 6-token tile, 8 vpdpbusd in two chains, then nothing (Bare), Q4_0 / Q8_0's
// scaling (vpaddd, vcvtdq2ps, vfmadd: Scaled -- the scales are loop constants here, so the
// real tile's vmulps of d_w by the token's d_a is hoisted out) or Q4_1's (one more vfmadd:
// ScaledMin). BM_PipeShare measures which of these take the vpdpbusd pipes' slots.
// Counter: G vpdpbusd per second on one core (docs/benchmarks.md, 2026-12-04). Skips without
// AVX-512 VNNI. Built with AVX-512 flags on x86-64 only (bench/CMakeLists.txt).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdint>

// GCC 12 warns about the deliberately undefined upper halves in the cast intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace {

enum Mix { kBare, kScaled, kScaledMin };

template <Mix M>
void BM_TileOpMix(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    state.SkipWithError("no AVX-512 VNNI");
    return;
  }
  constexpr int T = 6;
  __m512i w[8];
  for (int j = 0; j < 8; ++j) w[j] = _mm512_set1_epi8(static_cast<char>(j + 1));
  __m512i a[T];  // each token's activation bytes, opaque to the compiler (no sharing across tokens)
  for (int t = 0; t < T; ++t) a[t] = _mm512_set1_epi8(static_cast<char>(t + 1));
  const __m512 dw = _mm512_set1_ps(0.5f), mw = _mm512_set1_ps(0.25f), da = _mm512_set1_ps(1.0001f);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  constexpr int64_t kBlocks = 1 << 16;
  for (auto _ : state) {
    for (int64_t i = 0; i < kBlocks; ++i) {
      __m512i d0[T], d1[T];
      for (int t = 0; t < T; ++t) d0[t] = d1[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
#pragma GCC unroll 6
        for (int t = 0; t < T; ++t) {
          __m512i& d = (j & 1) ? d1[t] : d0[t];
          d = _mm512_dpbusd_epi32(d, w[j], a[t]);
        }
      for (int t = 0; t < T; ++t) {
        const __m512i s = _mm512_add_epi32(d0[t], d1[t]);
        if constexpr (M == kBare) {
          acc[t] = _mm512_add_ps(acc[t], _mm512_castsi512_ps(s));
        } else {
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, da), acc[t]);
          if constexpr (M == kScaledMin) acc[t] = _mm512_fmadd_ps(mw, da, acc[t]);
        }
      }
      for (int t = 0; t < T; ++t) asm volatile("" : "+v"(a[t]));  // new activations each block
    }
    for (int t = 0; t < T; ++t) benchmark::DoNotOptimize(acc[t]);
  }
  state.counters["G vpdpbusd/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kBlocks * 8 * T * 1e-9, benchmark::Counter::kIsRate);
}
// Which operations share the vpdpbusd pipes: per iteration 8 independent vpdpbusd chains plus
// kN independent chains of one other operation, all from registers, one core. If the operation
// takes a vpdpbusd's slot, (vpdpbusd + it) per second stays at the bare vpdpbusd rate whatever
// kN is; an operation on other pipes costs nothing.
enum PipeOp { kFmaOp, kMulOp, kCvtOp, kAddOp };  // vfmadd231ps, vmulps, vcvtdq2ps, vpaddd

template <PipeOp kOp, int kN>
void BM_PipeShare(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    state.SkipWithError("no AVX-512 VNNI");
    return;
  }
  __m512i d[8], c[8];
  __m512 f[8];
  __m512i w = _mm512_set1_epi8(3), a = _mm512_set1_epi8(5);
  __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.999f);
  for (int i = 0; i < 8; ++i) {
    d[i] = c[i] = _mm512_set1_epi32(i);
    f[i] = _mm512_set1_ps(static_cast<float>(i));
  }
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) {
    for (int64_t n = 0; n < kIters; ++n) {
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) d[i] = _mm512_dpbusd_epi32(d[i], w, a);
#pragma GCC unroll 8
      for (int i = 0; i < kN; ++i) {
        if constexpr (kOp == kFmaOp) f[i] = _mm512_fmadd_ps(f[i], x, y);
        if constexpr (kOp == kMulOp) f[i] = _mm512_mul_ps(f[i], x);
        if constexpr (kOp == kCvtOp) c[i] = _mm512_castps_si512(_mm512_cvtepi32_ps(c[i]));
        if constexpr (kOp == kAddOp) c[i] = _mm512_add_epi32(c[i], w);
      }
      asm volatile("" : "+v"(w), "+v"(a), "+v"(x));  // operands opaque: nothing is hoisted
    }
    for (int i = 0; i < 8; ++i) {
      benchmark::DoNotOptimize(d[i]);
      benchmark::DoNotOptimize(f[i]);
      benchmark::DoNotOptimize(c[i]);
    }
  }
  const double iters = static_cast<double>(state.iterations()) * kIters;
  state.counters["G vpdpbusd/s"] = benchmark::Counter(iters * 8e-9, benchmark::Counter::kIsRate);
  state.counters["G (vpdpbusd + op)/s"] =
      benchmark::Counter(iters * (8 + kN) * 1e-9, benchmark::Counter::kIsRate);
}
#define PENG_PIPE_SHARE(op, n, name) \
  BENCHMARK(BM_PipeShare<op, n>)->Name("BM_PipeShare/dpbusd8_" name)->Unit(benchmark::kMillisecond)
PENG_PIPE_SHARE(kFmaOp, 0, "alone");
PENG_PIPE_SHARE(kFmaOp, 2, "fma2");
PENG_PIPE_SHARE(kFmaOp, 3, "fma3");
PENG_PIPE_SHARE(kFmaOp, 8, "fma8");
PENG_PIPE_SHARE(kMulOp, 3, "mul3");
PENG_PIPE_SHARE(kCvtOp, 4, "cvt4");
PENG_PIPE_SHARE(kAddOp, 4, "add4");
PENG_PIPE_SHARE(kAddOp, 8, "add8");

BENCHMARK(BM_TileOpMix<kBare>)->Name("BM_TileOpMix/bare")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TileOpMix<kScaled>)->Name("BM_TileOpMix/scaled")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TileOpMix<kScaledMin>)->Name("BM_TileOpMix/scaled_min")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
