#include "kernels/probe.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/mapped_file.h"
#include "kernels/cpu/probe_simd.h"
#include "kernels/isa.h"

namespace peng::kernels {

// ---- scalar reference loops (the fallback of every probe) ----
namespace ref {

uint64_t ReadSum(const void* p, int64_t n) {
  const auto* v = static_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (int64_t i = 0; i < n / 8; i += 4) {
    a0 += v[i];
    a1 += v[i + 1];
    a2 += v[i + 2];
    a3 += v[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

int64_t FmaLoop(int64_t iters, float* sink) {
  float a[8];
  for (int k = 0; k < 8; ++k) a[k] = static_cast<float>(k);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 8; ++k) a[k] = a[k] * 0.999f + 0.001f;
  float s = 0;
  for (float v : a) s += v;
  *sink = s;
  return iters * 8 * 2;
}

int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  int32_t a[8];
  for (int k = 0; k < 8; ++k) a[k] = k;
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 8; ++k) a[k] += static_cast<int8_t>(a[k] >> 24) * int8_t{-2} + 3;
  int32_t s = 0;
  for (int32_t v : a) s += v;
  *sink = s;
  return iters * 8 * 2;
}

}  // namespace ref

namespace {

#if defined(__x86_64__)
#define PENG_PROBE_CASES_(fn, ...)                    \
  case Isa::kAvx512: return avx512::fn(__VA_ARGS__); \
  case Isa::kAvx2: return avx2::fn(__VA_ARGS__);
#elif defined(__aarch64__)
#define PENG_PROBE_CASES_(fn, ...)                  \
  case Isa::kNeonI8mm: return i8mm::fn(__VA_ARGS__); \
  case Isa::kNeonDot: return dotprod::fn(__VA_ARGS__); \
  case Isa::kNeon: return neon::fn(__VA_ARGS__);
#else
#define PENG_PROBE_CASES_(fn, ...)
#endif
#define PENG_PROBE_DISPATCH_(fn, ...)      \
  switch (ActiveIsa()) {                   \
    PENG_PROBE_CASES_(fn, __VA_ARGS__)     \
    default: return ref::fn(__VA_ARGS__);  \
  }

uint64_t ReadSum(const void* p, int64_t n) { PENG_PROBE_DISPATCH_(ReadSum, p, n); }
int64_t FmaLoop(int64_t iters, float* sink) { PENG_PROBE_DISPATCH_(FmaLoop, iters, sink); }
int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  PENG_PROBE_DISPATCH_(Int8DotLoop, iters, sink);
}

#undef PENG_PROBE_DISPATCH_
#undef PENG_PROBE_CASES_

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `loop(iters)` on every pool thread at once; returns the total op rate. The iteration
// count is calibrated on one thread first so that a run takes about `seconds`.
template <typename Loop>
double MeasureRate(ThreadPool* pool, double seconds, Loop loop) {
  int64_t iters = 1 << 12;
  for (;;) {  // calibrate: double until one run takes >= 5 ms
    const auto t0 = std::chrono::steady_clock::now();
    loop(iters);
    const double s = Seconds(t0);
    if (s >= 0.005 || iters >= (int64_t{1} << 40)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(iters * (seconds / 3) / std::max(s, 1e-9)));
      break;
    }
    iters *= 2;
  }
  const int nt = pool ? pool->num_threads() : 1;
  std::vector<int64_t> ops(nt, 0);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pool) {
      pool->Run([&](int ti, int) { ops[ti] = loop(iters); });
    } else {
      ops[0] = loop(iters);
    }
    const double s = Seconds(t0);
    int64_t total = 0;
    for (int64_t o : ops) total += o;
    best = std::max(best, static_cast<double>(total) / s);
  }
  return best;
}

}  // namespace

double MeasureReadBandwidth(ThreadPool* pool, int64_t bytes, int passes) {
  const int nt = pool ? pool->num_threads() : 1;
  // Each thread reads its own contiguous share, a multiple of 1 KiB (the loops step 256 B).
  const int64_t share = std::max<int64_t>(1024, bytes / nt / 1024 * 1024);
  const int64_t total = share * nt;
  // On transparent huge pages where the kernel grants them, like the packed weight panels the
  // GEMVs stream (AllocateHugePages): with 4 KiB pages the probe read 5-20% less.
  std::shared_ptr<uint8_t> buf = AllocateHugePages(static_cast<size_t>(total));
  if (!buf)
    buf.reset(static_cast<uint8_t*>(std::aligned_alloc(64, total)), [](uint8_t* q) { std::free(q); });
  if (!buf) return 0;
  auto each = [&](auto fn) {
    if (pool) pool->Run([&](int ti, int) { fn(ti); });
    else fn(0);
  };
  // First touch by the thread that reads the share (its NUMA node), with non-zero pages.
  each([&](int ti) {
    uint8_t* p = buf.get() + ti * share;
    for (int64_t i = 0; i < share; i += 64) p[i] = static_cast<uint8_t>(i >> 6);
  });
  std::vector<uint64_t> sink(nt * 8);
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    each([&](int ti) { sink[ti * 8] = ReadSum(buf.get() + ti * share, share); });
    best = std::max(best, static_cast<double>(total) / Seconds(t0));
  }
  volatile uint64_t keep = 0;
  for (uint64_t s : sink) keep = keep + s;
  return best;
}

double MeasurePeakFlopsF32(ThreadPool* pool, double seconds) {
  return MeasureRate(pool, seconds, [&](int64_t iters) {
    float s;
    const int64_t n = FmaLoop(iters, &s);
    volatile float keep = s;  // keeps the result alive
    (void)keep;
    return n;
  });
}

double MeasurePeakOpsInt8(ThreadPool* pool, double seconds) {
  return MeasureRate(pool, seconds, [&](int64_t iters) {
    int32_t s;
    const int64_t n = Int8DotLoop(iters, &s);
    volatile int32_t keep = s;
    (void)keep;
    return n;
  });
}

MachinePeaks MeasureMachinePeaks(ThreadPool* pool) {
  static std::mutex mu;
  static std::map<int, MachinePeaks> cache;  // by thread count
  const int nt = pool ? pool->num_threads() : 1;
  std::lock_guard<std::mutex> lk(mu);
  if (auto it = cache.find(nt); it != cache.end()) return it->second;
  MachinePeaks p;
  p.read_bytes_per_s = MeasureReadBandwidth(pool, int64_t{256} << 20, 3);
  p.flops_f32_per_s = MeasurePeakFlopsF32(pool);
  p.ops_int8_per_s = MeasurePeakOpsInt8(pool);
  cache[nt] = p;
  return p;
}

}  // namespace peng::kernels
