// The host's part of sampling a step of R logit rows of a vocabulary of V (Qwen2.5's 151936 by
// default): what the engine thread does after a device step when the rows come back whole --
// copy them on from the staging memory, scan each for NaN / +inf, sample (greedy; top-k 40 at
// temperature 0.8) -- against what it does when the device returns each row's best logits
// (Device::TopLogits): Sampler::SampleTop on k entries; and plain temperature sampling, which
// reads the whole row, or takes the token the device drew (Device::DrawTokens:
// Sampler::SampleDrawn). Medians of the repetitions, in us a step (one thread; the engine
// spreads a step's whole rows over its threads).
//
//   sampling_bench [rows] [vocab] [reps]   (defaults 64 151936 9)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "kernels/ops.h"

using namespace peng;

namespace {

double MedianUs(int reps, const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t R = argc > 1 ? std::atoll(argv[1]) : 64;
  const int64_t V = argc > 2 ? std::atoll(argv[2]) : 151936;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 9;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> staged(R * V), rows(R * V);
  for (float& x : staged) x = nd(gen);
  SamplingParams greedy, topk, temp;
  greedy.temperature = 0;
  topk.temperature = 0.8f;
  topk.top_k = 40;
  topk.seed = 7;
  temp.temperature = 0.8f;  // the whole row: no device list serves it
  temp.seed = 7;
  const int K = 40;
  std::vector<float> val(R * K);
  std::vector<int32_t> idx(R * K);
  for (int64_t r = 0; r < R; ++r)
    kernels::TopK(staged.data() + r * V, V, K, val.data() + r * K, idx.data() + r * K);
  int64_t sink = 0;
  std::printf("%lld rows of %lld logits, median of %d, one thread (us a step)\n",
              static_cast<long long>(R), static_cast<long long>(V), reps);
  for (const SamplingParams* p : {&greedy, &topk, &temp}) {
    const char* name = p == &greedy ? "greedy"
                       : p == &topk ? "top-k 40, temperature 0.8"
                                    : "temperature 0.8 (no top-k)";
    std::vector<Sampler> samplers(R, Sampler(*p));  // (a request's lives as long as it does)
    const double whole = MedianUs(reps, [&] {
      std::memcpy(rows.data(), staged.data(), rows.size() * sizeof(float));  // copy on
      for (int64_t r = 0; r < R; ++r) {
        float* row = rows.data() + r * V;
        sink += kernels::FindNanOrPosInf(row, V);
        sink += samplers[r].Sample(row, V, TokenHistory());
      }
    });
    if (Sampler::TopNeeded(*p) == 0) {  // (plain temperature: the device draws the token)
      const double drawn = MedianUs(reps, [&] {
        for (int64_t r = 0; r < R; ++r) {
          samplers[r].PendingUniform();  // (before the step)
          sink += samplers[r].SampleDrawn(val[r * K], idx[r * K], idx[r * K]);
        }
      });
      std::printf("  %-26s whole rows %9.1f   drawn on the device %7.1f   (%.0fx)\n", name,
                  whole, drawn, whole / drawn);
      continue;
    }
    const double best = MedianUs(reps, [&] {
      for (int64_t r = 0; r < R; ++r)
        sink += samplers[r].SampleTop(val.data() + r * K, idx.data() + r * K, K);
    });
    std::printf("  %-26s whole rows %9.1f   best logits %7.1f   (%.0fx)\n", name, whole, best,
                whole / best);
  }
  const double topk_host = MedianUs(reps, [&] {
    for (int64_t r = 0; r < R; ++r)
      kernels::TopK(staged.data() + r * V, V, 1, val.data() + r, idx.data() + r);
  });
  std::printf("  kernels::TopK, k = 1 (the host device's TopLogits) %9.1f\n", topk_host);
  return sink == 42 ? 1 : 0;
}
