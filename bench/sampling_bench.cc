// The host's part of sampling a step of R logit rows of a vocabulary of V (Qwen2.5's 151936 by
// default): what the engine thread does after a device step when the rows come back whole --
// copy them on from the staging memory, scan each for NaN / +inf, sample (greedy; top-k 40 at
// temperature 0.8) -- against what it does when the device returns each row's best logits
// (Device::TopLogits): Sampler::SampleTop on k entries; and plain temperature sampling, which
// reads the whole row, or takes the token the device drew (Device::DrawTokens:
// Sampler::SampleDrawn); top-p without top-k from the best 64 and the softmax total
// (Sampler::SampleNucleus; the rows whose nucleus is wider still need the whole row). Medians
// of the repetitions, in us a step (one thread; the engine spreads a step's whole rows over
// its threads). The rows are random (normal, sd 3) -- or, with --nuclei, a model's: the rows of
// a .npy that `peng logits` wrote, for which it counts the rows whose top-p nucleus lies within
// their best 64, 256 and 4096 (SampleNucleus answers from the list; a device returns up to 256
// a row in a step, 4096 after it) at temperatures 0.7 / 1 and top-p 0.9 / 0.95.
//
//   sampling_bench [rows] [vocab] [reps]   (defaults 64 151936 9)
//   sampling_bench --nuclei LOGITS.npy
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "formats/npy_writer.h"
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

// A float32 [rows, n] .npy as `peng logits` writes it (formats/npy_writer.h: its header must be
// NpyHeader's for that shape), or an empty vector.
std::vector<float> ReadNpy(const char* path, int64_t* rows, int64_t* n) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return {};
  std::string head(10, '\0');
  std::vector<float> v;
  if (std::fread(head.data(), 1, 10, f) == 10) {
    const size_t len = static_cast<unsigned char>(head[8]) |
                       static_cast<unsigned char>(head[9]) << 8;  // (version 1.0)
    head.resize(10 + len);
    long long r = 0, c = 0;
    const bool read = std::fread(head.data() + 10, 1, len, f) == len;
    const size_t at = head.find("'shape': (");
    if (read && at != std::string::npos &&
        std::sscanf(head.c_str() + at, "'shape': (%lld, %lld)", &r, &c) == 2) {
      const StatusOr<std::string> want = NpyHeader({r, c});
      if (want.ok() && *want == head) {
        *rows = r;
        *n = c;
        v.resize(r * c);
        if (std::fread(v.data(), 4, v.size(), f) != v.size()) v.clear();
      }
    }
  }
  std::fclose(f);
  return v;
}

// How many of a model's rows SampleNucleus serves from their best 64, 256
// (Device::kTopLogitsMax) and 4096 (Device::kTopLogitsWide: the list a row past its best 256
// takes after the step, EngineCore::ChooseFromWide), and at temperature 1 / top-p 0.95 what a
// row costs the host: sampled whole (copied on, scanned, Sampler::Sample) or from its best 4096.
int Nuclei(const char* path) {
  int64_t R = 0, V = 0;
  const std::vector<float> x = ReadNpy(path, &R, &V);
  const int kLists[3] = {64, 256, 4096};
  if (x.empty() || V < 2 * kLists[2]) {
    std::fprintf(stderr, "sampling_bench: %s: not a float32 [rows, vocab >= %d] .npy\n", path,
                 2 * kLists[2]);
    return 1;
  }
  const int kMost = kLists[2];
  std::vector<float> val(R * kMost);
  std::vector<int32_t> idx(R * kMost);
  for (int64_t r = 0; r < R; ++r)  // (each shorter list is its head: TopK's order)
    kernels::TopK(x.data() + r * V, V, kMost, val.data() + r * kMost, idx.data() + r * kMost);
  std::printf("%s: %lld rows of %lld logits\n", path, static_cast<long long>(R),
              static_cast<long long>(V));
  for (float temp : {0.7f, 1.f})
    for (float top_p : {0.9f, 0.95f}) {
      SamplingParams p;
      p.temperature = temp;
      p.top_p = top_p;
      p.seed = 1;
      Sampler s(p);
      int64_t within[3] = {0, 0, 0};
      std::vector<double> total(R);
      for (int64_t r = 0; r < R; ++r) {
        const float* v = val.data() + r * kMost;
        total[r] = kernels::TemperatureTotal(x.data() + r * V, V, v[0], 1.f / temp);
        for (int i = 0; i < 3; ++i)
          within[i] += s.SampleNucleus(v, idx.data() + r * kMost, kLists[i], V, total[r]) >= 0;
      }
      std::printf("  temperature %.1f, top-p %.2f: of the rows from their best 64 %5.1f%%, "
                  "256 %5.1f%%, 4096 %5.1f%%\n",
                  temp, top_p, 100.0 * within[0] / R, 100.0 * within[1] / R,
                  100.0 * within[2] / R);
      if (temp != 1.f || top_p != 0.95f) continue;
      std::vector<float> row(V);
      int64_t sink = 0;
      const double whole = MedianUs(5, [&] {
        for (int64_t r = 0; r < R; ++r) {
          std::memcpy(row.data(), x.data() + r * V, V * sizeof(float));
          sink += kernels::FindNanOrPosInf(row.data(), V);
          sink += s.Sample(row.data(), V, TokenHistory());
        }
      });
      const double list = MedianUs(5, [&] {
        for (int64_t r = 0; r < R; ++r)
          sink += s.SampleNucleus(val.data() + r * kMost, idx.data() + r * kMost, kMost, V,
                                  total[r]);
      });
      std::printf("    a row on the host: whole %.1f us, from its best 4096 %.1f us (%lld)\n",
                  whole / R, list / R, static_cast<long long>(sink % 2));
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--nuclei") == 0) return Nuclei(argv[2]);
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
  {  // top-p 0.9 without top-k: the best 64 and the softmax total (Sampler::SampleNucleus)
    SamplingParams nucleus = temp;
    nucleus.top_p = 0.9f;
    const int N = 64;
    std::vector<float> v64(R * N);
    std::vector<int32_t> i64(R * N);
    std::vector<double> total(R);
    for (int64_t r = 0; r < R; ++r) {
      kernels::TopK(staged.data() + r * V, V, N, v64.data() + r * N, i64.data() + r * N);
      total[r] = kernels::TemperatureTotal(staged.data() + r * V, V, v64[r * N], 1.f / 0.8f);
    }
    std::vector<Sampler> samplers(R, Sampler(nucleus));
    const double whole = MedianUs(reps, [&] {
      std::memcpy(rows.data(), staged.data(), rows.size() * sizeof(float));
      for (int64_t r = 0; r < R; ++r) {
        float* row = rows.data() + r * V;
        sink += kernels::FindNanOrPosInf(row, V);
        sink += samplers[r].Sample(row, V, TokenHistory());
      }
    });
    int64_t wider = 0;
    const double list = MedianUs(reps, [&] {
      wider = 0;
      for (int64_t r = 0; r < R; ++r) {
        const int32_t id = samplers[r].SampleNucleus(v64.data() + r * N, i64.data() + r * N, N,
                                                     V, total[r]);
        wider += id < 0;
        sink += id;
      }
    });
    std::printf("  %-26s whole rows %9.1f   best 64 + total %7.1f   (%lld of %lld rows' "
                "nuclei wider: whole rows)\n",
                "top-p 0.9, temperature 0.8", whole, list, static_cast<long long>(wider),
                static_cast<long long>(R));
  }
  const double topk_host = MedianUs(reps, [&] {
    for (int64_t r = 0; r < R; ++r)
      kernels::TopK(staged.data() + r * V, V, 1, val.data() + r, idx.data() + r);
  });
  std::printf("  kernels::TopK, k = 1 (the host device's TopLogits) %9.1f\n", topk_host);
  return sink == 42 ? 1 : 0;
}
