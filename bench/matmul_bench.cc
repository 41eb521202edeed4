// Micro-benchmarks of the matmul kernels on the shapes of the small models we serve, single
// threaded on the active ISA (force one with PENG_ISA=scalar|avx2|avx512). For GEMV
// (n_tokens = 1) and the GEMM of a 32-sequence decode step (n_tokens = 32) the weights rotate
// through copies totalling kFootprintBytes, so they come from memory, not cache, as in a model's
// step; compare a GEMV's GB/s with BM_MemRead over the same footprint. 128 tokens (a prefill
// chunk) reuse one copy.
// PENG_BENCH_HOT=1 keeps one copy (cache-resident: measures compute, not memory).
// BM_MatMulPanels: the same with the weights packed into the kernels' panels first (the layout
// models run for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 on AVX-512).
//   peng_micro_bench --benchmark_filter='MatMul/Q4_1'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/half.h"
#include "kernels/isa.h"
#include "kernels/ops.h"

namespace peng::kernels {
namespace {

constexpr size_t kFootprintBytes = size_t{256} << 20;

void BM_MemRead(benchmark::State& state) {
  std::vector<uint64_t> buf(kFootprintBytes / 8, 1);
  for (auto _ : state) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < buf.size(); i += 4) {
      s0 += buf[i];
      s1 += buf[i + 1];
      s2 += buf[i + 2];
      s3 += buf[i + 3];
    }
    benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kFootprintBytes));
}
BENCHMARK(BM_MemRead)->Unit(benchmark::kMillisecond);

// Random weights with small finite fp16 scales (every block type keeps its scales in fp16
// fields; random bytes elsewhere are valid quants).
std::vector<uint8_t> RandomMatrix(DType t, int64_t rows, int64_t cols) {
  std::vector<uint8_t> w(RowBytes(t, cols) * rows);
  std::mt19937 rng(1);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  if (t == DType::kF32) {
    for (size_t i = 0; i < w.size(); i += 4) {
      const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f;
      std::memcpy(&w[i], &v, 4);
    }
    return w;
  }
  if (t == DType::kF16 || t == DType::kBF16) {
    for (size_t i = 0; i < w.size(); i += 2) {
      const float v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-3f;
      const uint16_t h = t == DType::kF16 ? F32ToF16(v) : F32ToBf16(v);
      std::memcpy(&w[i], &h, 2);
    }
    return w;
  }
  const uint16_t s = F32ToF16(0.01f);
  const int bb = GetDTypeInfo(t).block_bytes;
  for (size_t off = 0; off < w.size(); off += bb) {
    if (t == DType::kQ6_K) {
      std::memcpy(&w[off + 208], &s, 2);
    } else {
      std::memcpy(&w[off], &s, 2);
      if (t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K)
        std::memcpy(&w[off + 2], &s, 2);
    }
  }
  return w;
}

// packed: every copy packed into the kernels' panels first (PackPanels; the layout the models
// run, Linear packs at bind time), where the active ISA has them for the type.
void RunMatMul(benchmark::State& state, DType t, bool packed) {
  const int64_t rows = state.range(0), cols = state.range(1), n_tokens = state.range(2);
  const std::vector<uint8_t> one = RandomMatrix(t, rows, cols);
  const bool hot = std::getenv("PENG_BENCH_HOT") != nullptr;  // weights stay in cache
  const size_t copies =
      n_tokens <= 32 && !hot ? std::max<size_t>(1, kFootprintBytes / one.size()) : 1;
  std::vector<uint8_t> all(one.size() * copies);
  for (size_t c = 0; c < copies; ++c) std::memcpy(&all[c * one.size()], one.data(), one.size());
  std::vector<std::shared_ptr<const uint8_t>> panels(copies);
  std::vector<float> x(cols * n_tokens), y(rows * n_tokens);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 200) * 0.01f - 1.f;
  TensorView w;
  w.dtype = t;
  w.shape = {rows, cols};
  w.size_bytes = one.size();
  for (size_t c = 0; packed && c < copies; ++c) {
    w.data = &all[c * one.size()];
    panels[c] = PackPanels(w);
    if (!panels[c]) {
      state.SkipWithError("no panel layout for this type on this ISA");
      return;
    }
  }
  size_t c = 0;
  for (auto _ : state) {
    w.data = &all[c * one.size()];
    w.panels = panels[c].get();
    c = c + 1 == copies ? 0 : c + 1;
    MatMul(w, x.data(), n_tokens, y.data(), nullptr);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * one.size()));
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * rows * cols * n_tokens * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.SetLabel(IsaName(ActiveIsa()));
}
void BM_MatMul(benchmark::State& state, DType t) { RunMatMul(state, t, false); }
void BM_MatMulPanels(benchmark::State& state, DType t) { RunMatMul(state, t, true); }

void Shapes(benchmark::internal::Benchmark* b, std::initializer_list<std::pair<int, int>> shapes) {
  for (auto [rows, cols] : shapes)
    for (int n : {1, 32, 128}) b->Args({rows, cols, n});
  b->Unit(benchmark::kMicrosecond);
}

#define PENG_BENCH_TYPE(T, ...)                                                       \
  BENCHMARK_CAPTURE(BM_MatMul, T, DType::k##T)->Apply([](auto* b) { Shapes(b, {__VA_ARGS__}); })

PENG_BENCH_TYPE(Q4_1, {576, 1536}, {1536, 576}, {49152, 576});
PENG_BENCH_TYPE(Q8_0, {576, 1536}, {1536, 576}, {49152, 576});
PENG_BENCH_TYPE(Q4_0, {896, 4864}, {4864, 896}, {1408, 2048}, {2048, 1408}, {3072, 2048});  // V2-Lite
PENG_BENCH_TYPE(Q5_0, {896, 4864}, {4864, 896});
PENG_BENCH_TYPE(Q5_1, {896, 4864});
PENG_BENCH_TYPE(Q4_K, {896, 4864}, {1536, 1536});
PENG_BENCH_TYPE(Q5_K, {896, 4864});
PENG_BENCH_TYPE(Q6_K, {896, 4864}, {1536, 1536});
PENG_BENCH_TYPE(F16, {896, 4864}, {151936, 896});
PENG_BENCH_TYPE(BF16, {896, 4864});
PENG_BENCH_TYPE(F32, {896, 4864});

#define PENG_BENCH_PANELS(T, ...)                                                     \
  BENCHMARK_CAPTURE(BM_MatMulPanels, T, DType::k##T)->Apply([](auto* b) { Shapes(b, {__VA_ARGS__}); })

PENG_BENCH_PANELS(Q4_1, {576, 1536}, {1536, 576}, {49152, 576});
PENG_BENCH_PANELS(Q8_0, {576, 1536}, {1536, 576}, {49152, 576});
PENG_BENCH_PANELS(Q4_0, {896, 4864}, {4864, 896}, {1408, 2048}, {2048, 1408}, {3072, 2048});
PENG_BENCH_PANELS(Q5_0, {896, 4864}, {4864, 896});
PENG_BENCH_PANELS(Q5_1, {896, 4864});
PENG_BENCH_PANELS(Q4_K, {896, 4864}, {1536, 1536});
PENG_BENCH_PANELS(Q6_K, {896, 4864}, {1536, 1536});
PENG_BENCH_PANELS(F16, {896, 4864}, {151936, 896});  // (Qwen2.5's LM head, W8A8's default)
PENG_BENCH_PANELS(BF16, {896, 4864});
PENG_BENCH_PANELS(F32, {896, 4864});

}  // namespace
}  // namespace peng::kernels

BENCHMARK_MAIN();
