// Micro-benchmarks of paged attention on SmolLM2-135M's shape (9 query heads, 3 kv heads,
// head_dim 64, 16-slot blocks in shuffled physical order; an F16 cache unless a Q argument of 1
// makes it Q8_0), single threaded on the active ISA (PENG_ISA=scalar|avx2|avx512 to force one):
// - BM_AttentionDecode/B/C: one decode token in each of B sequences with C cached tokens (the
//   attention of one layer in a B-sequence decode step);
// - BM_AttentionPrefill/N/Q: a prefill chunk of N tokens from position 0.
// Items/s counts (query token, key) pairs.
// - BM_AttentionDecodeStep/B/C/T/Q: the decode case in 30 layers whose blocks lie spread over
//   larger pools (from memory, as in a model's step), on T threads (0: single threaded).
//   peng_micro_bench --benchmark_filter=Attention
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {
namespace {

constexpr int kHeads = 9, kKvHeads = 3, kDim = 64, kBlock = 16;

// A cache layer holding `seqs` sequences of `len` tokens each, their blocks dealt at random
// from a pool `spread` times larger (as a serving engine's pool is).
struct Cache {
  std::vector<uint8_t> k, v;
  std::vector<std::vector<int32_t>> tables;
  KvLayerView view;

  Cache(int seqs, int64_t len, int spread = 1, DType dtype = DType::kF16) {
    const int64_t per = (len + kBlock - 1) / kBlock;
    const int64_t blocks = per * seqs * spread;
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(3);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int64_t n = blocks * kBlock * kKvHeads * kDim;
    std::vector<float> values(n);
    for (auto* c : {&k, &v}) {
      for (float& x : values) x = u(rng);
      c->resize(RowBytes(dtype, n));
      if (dtype == DType::kQ8_0) {
        ref::F32ToQ8_0Row(values.data(), c->data(), n);
      } else {
        auto* h = reinterpret_cast<uint16_t*>(c->data());
        for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(values[i]);
      }
    }
    for (int s = 0; s < seqs; ++s)
      tables.emplace_back(perm.begin() + s * per, perm.begin() + (s + 1) * per);
    view = {k.data(), v.data(), dtype, blocks, kBlock, kKvHeads, kDim, kDim};
  }
};

AttentionParams Params() {
  AttentionParams p;
  p.n_heads = kHeads;
  p.scale = 1.f / std::sqrt(static_cast<float>(kDim));
  return p;
}

std::vector<float> Queries(int64_t n) {
  std::vector<float> q(n * kHeads * kDim);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (float& x : q) x = u(rng);
  return q;
}

void BM_AttentionDecode(benchmark::State& state) {
  const int seqs = static_cast<int>(state.range(0));
  const int64_t len = state.range(1);
  Cache cache(seqs, len + 1);
  const std::vector<float> q = Queries(seqs);
  std::vector<float> out(q.size());
  std::vector<AttentionSeq> batch;
  for (int s = 0; s < seqs; ++s)
    batch.push_back({q.data() + s * kHeads * kDim, 1, len, cache.tables[s].data(),
                     out.data() + s * kHeads * kDim});
  const AttentionParams p = Params();
  for (auto _ : state) {
    PagedAttentionBatch(batch.data(), seqs, cache.view, p, nullptr);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * seqs * (len + 1));
}
BENCHMARK(BM_AttentionDecode)->Args({1, 512})->Args({32, 64})->Unit(benchmark::kMicrosecond);

// A whole step's attention: B sequences x C keys in each of 30 layers, every layer its own
// pool of 8 x the blocks in use (the step's 30 x B x C x 768 bytes of keys and values come from
// memory, not cache). On T threads of a pool (T = 0: the calling thread alone).
void BM_AttentionDecodeStep(benchmark::State& state) {
  const int seqs = static_cast<int>(state.range(0));
  const int64_t len = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  const DType dtype = state.range(3) ? DType::kQ8_0 : DType::kF16;
  constexpr int kLayers = 30;
  std::vector<std::unique_ptr<Cache>> layers;
  for (int l = 0; l < kLayers; ++l)
    layers.push_back(std::make_unique<Cache>(seqs, len + 1, 8, dtype));
  const std::vector<float> q = Queries(seqs);
  std::vector<float> out(q.size());
  std::vector<std::vector<AttentionSeq>> batch(kLayers);
  for (int l = 0; l < kLayers; ++l)
    for (int s = 0; s < seqs; ++s)
      batch[l].push_back({q.data() + s * kHeads * kDim, 1, len, layers[l]->tables[s].data(),
                          out.data() + s * kHeads * kDim});
  const AttentionParams p = Params();
  std::unique_ptr<ThreadPool> pool;
  if (threads > 0) pool = std::make_unique<ThreadPool>(threads);
  for (auto _ : state) {
    for (int l = 0; l < kLayers; ++l)
      PagedAttentionBatch(batch[l].data(), seqs, layers[l]->view, p, pool.get());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kLayers * seqs * (len + 1));
  // Keys and values read a step: the bytes a bandwidth bound divides.
  state.counters["kv_bytes/s"] = benchmark::Counter(
      static_cast<double>(kLayers) * seqs * (len + 1) * 2 *
          static_cast<double>(RowBytes(dtype, kKvHeads * kDim)),
      benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionDecodeStep)
    ->Args({32, 64, 0, 0})
    ->Args({1, 2048, 0, 0})
    ->Args({1, 2048, 2, 0})
    ->Args({4, 2048, 2, 0})
    ->Args({1, 2048, 0, 1})
    ->Args({1, 2048, 2, 1})
    ->Args({4, 2048, 2, 1})
    ->Unit(benchmark::kMillisecond);

void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t n = state.range(0);
  Cache cache(1, n, 1, state.range(1) ? DType::kQ8_0 : DType::kF16);
  const std::vector<float> q = Queries(n);
  std::vector<float> out(q.size());
  const AttentionParams p = Params();
  for (auto _ : state) {
    PagedAttention(q.data(), n, 0, cache.view, cache.tables[0].data(), p, out.data(), nullptr);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n * (n + 1) / 2);
}
BENCHMARK(BM_AttentionPrefill)->Args({512, 0})->Args({512, 1})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace peng::kernels
